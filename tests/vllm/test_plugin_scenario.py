"""The issue's mixed-load scenario on the REAL vLLM-Omni shared-stage scheduler: 200 requests,
a speech burst, aborts, vLLM's KV preemptions (scenario.py). Queued text requests' mean wait
under FCFS, vLLM's `scheduling_policy: priority` and HorizonServe (with and without the
shared-stage preemption); nothing lost or duplicated under any of them.

    .venv/bin/python -m pytest tests/vllm/test_plugin_scenario.py -s -q   (prints the table)
"""

from __future__ import annotations

import pytest
import scenario

pytestmark = pytest.mark.vllm

POLICIES = ["fcfs", "priority", "horizon", "horizon-no-preemption"]
# The paper's rotation range (N adapted in [2, 8], M = 2, long-path cap 2) on the test classes.
CONTROL = {"rotation_n_max": 8}


@pytest.fixture(scope="module")
def results() -> dict:
    return {}


@pytest.mark.parametrize("policy", POLICIES)
def test_scenario_serves_everything_once(build, clock, policy, results):
    sched, config = build(policy=policy, control=CONTROL, **scenario.PARAMS)
    result = scenario.run(sched, config, clock, policy)
    results[policy] = result
    assert not sched.has_unfinished_requests()
    assert len(result.want) == scenario.N_REQUESTS and result.vllm_preemptions > 0
    assert len(result.aborted) > 0
    for rid, n in result.want.items():
        if rid in result.aborted:
            assert result.finished.get(rid, 0) <= 1 and result.got.get(rid, 0) <= n
        else:
            assert (result.finished.get(rid), result.got.get(rid)) == (1, n), rid


def test_report_queued_text_wait(results):
    if set(results) != set(POLICIES):
        pytest.skip("needs every policy's run (run the whole module)")
    print()
    print(scenario.HEADER)
    for policy in POLICIES:
        print(results[policy].row())
    hs, fcfs = results["horizon"], results["fcfs"]
    assert hs.text_mean_ms < fcfs.text_mean_ms
