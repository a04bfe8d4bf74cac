"""The mixed-load scenario (scenario.py) on the real vLLM-Omni shared-stage scheduler makes the
same decisions as recorded in scenario_golden.json: for each policy the number of steps, both
kinds of preemption, and a digest of when every request was first scheduled and what it got.

A change meant to alter them is regenerated in its own commit:
    HS_WRITE_GOLDEN=1 .venv/bin/python -m pytest tests/vllm/test_plugin_scenario_golden.py
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import pytest
import scenario

pytestmark = pytest.mark.vllm

GOLDEN_FILE = Path(__file__).with_name("scenario_golden.json")
POLICIES = ["fcfs", "edf", "priority", "horizon", "horizon-no-preemption", "horizon-no-rotation"]
CONTROL = {"rotation_n_max": 8}


def _decisions(result: scenario.ScenarioResult) -> dict[str, object]:
    waits = [round(w, 6) for w in result.text_wait_s + result.speech_wait_s]
    got = sorted(result.got.items())
    digest = hashlib.sha256(json.dumps([waits, got]).encode()).hexdigest()[:16]
    return {
        "steps": result.steps,
        "vllm_preemptions": result.vllm_preemptions,
        "hs_preemptions": result.hs_preemptions,
        "text_mean_ms": round(result.text_mean_ms, 3),
        "digest": digest,
    }


def test_scenario_decisions_match_golden(build, clock) -> None:
    got = {}
    for policy in POLICIES:
        sched, config = build(policy=policy, control=CONTROL, **scenario.PARAMS)
        got[policy] = _decisions(scenario.run(sched, config, clock, policy))
    if os.environ.get("HS_WRITE_GOLDEN"):
        GOLDEN_FILE.write_text(json.dumps(got, indent=1) + "\n")
    assert got == json.loads(GOLDEN_FILE.read_text())
