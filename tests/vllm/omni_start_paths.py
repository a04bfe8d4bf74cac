"""Start vLLM-Omni's Python entry points with HorizonServe on, in the CPU engine venv:

    python omni_start_paths.py {async_omni|omni} --model DIR --deploy FILE --out result.json

`async_omni`: `AsyncOmni(...)`, one text request; `omni`: the offline `Omni(...)`, one request
through `generate` (text and audio out: the offline API has no per-request modalities). The
JSON result says whether the stages came up (and with what output), or the error; the test
platform's trace says what each stage's worker ran. (`vllm serve --omni` is
test_omni_pipeline.py.)
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import traceback
from pathlib import Path
from typing import Any

PROMPT = {"prompt": "<|im_start|>user\nhello<|im_end|>\n<|im_start|>assistant\n"}


async def run_async_omni(model: str, deploy: str) -> dict[str, Any]:
    from vllm_omni.entrypoints.async_omni import AsyncOmni

    omni = AsyncOmni(model=model, deploy_config=deploy)
    try:
        outputs = [o async for o in omni.generate(PROMPT, request_id="start-path-text",
                                                  output_modalities=["text"])]  # fmt: skip
        return {"started": True, "outputs": len(outputs)}
    finally:
        omni.shutdown()


def run_omni(model: str, deploy: str) -> dict[str, Any]:
    from vllm_omni.entrypoints.omni import Omni

    omni = Omni(model=model, deploy_config=deploy)
    try:
        outputs = omni.generate([PROMPT])  # every stage: text and audio out
        return {"started": True, "outputs": len(list(outputs))}
    finally:
        omni.shutdown()


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("path", choices=("async_omni", "omni"))
    ap.add_argument("--model", required=True)
    ap.add_argument("--deploy", required=True)
    ap.add_argument("--out", required=True, type=Path)
    args = ap.parse_args()
    try:
        if args.path == "async_omni":
            result = asyncio.run(run_async_omni(args.model, args.deploy))
        else:
            result = run_omni(args.model, args.deploy)
    except Exception as exc:
        result = {"started": False, "error": f"{type(exc).__name__}: {exc}",
                  "traceback": traceback.format_exc()[-4000:]}  # fmt: skip
    trace = Path(os.environ.get("HS_OMNI_TRACE", "/nonexistent"))
    result["trace"] = [json.loads(x) for x in trace.read_text().splitlines()] if trace.exists() \
        else []  # fmt: skip
    args.out.write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
