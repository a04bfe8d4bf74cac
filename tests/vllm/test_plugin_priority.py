"""The "priority" baseline: vLLM's own priority scheduler on the API priority code (0 text,
10 speech), with vLLM's own preemption under KV pressure; the plugin stays out of the way.

Selected like every policy of the plugin: `ServingConfig.policy`, or `HORIZONSERVE_POLICY`.
"""

from __future__ import annotations

import pytest
from factory import run_step
from horizon import add, ids, new_ids

pytestmark = pytest.mark.vllm

TEXT, SPEECH = 0, 10


@pytest.mark.parametrize("kind", ["omni_ar", "omni_ar_async"])
def test_policy_priority_puts_vllms_priority_scheduler_in_charge(build, clock, kind):
    from vllm.v1.core.sched.request_queue import PriorityRequestQueue, SchedulingPolicy

    sched, config = build(kind, policy="priority", max_num_seqs=2)  # command line said fcfs
    assert sched.policy is SchedulingPolicy.PRIORITY
    assert sched.vllm_config.scheduler_config.policy == "priority"
    assert isinstance(sched.waiting, PriorityRequestQueue)
    assert isinstance(sched.skipped_waiting, PriorityRequestQueue)
    add(sched, config, clock, [("L0", SPEECH, 0), ("L1", SPEECH, 0), ("S2", TEXT, 0),
                                ("L3", SPEECH, 0), ("S4", TEXT, 0)])  # fmt: skip
    assert ids(sched.waiting)[:2] == ["S2", "S4"]  # (priority code, arrival)
    out = sched.schedule()
    assert new_ids(out) == ["S2", "S4"]
    assert sched.horizon.swaps == 0  # the view hides nothing
    assert sched.horizon.last_decision.sm.level == -2  # whole GPU, like every baseline


@pytest.mark.parametrize(("policy", "victim", "left"), [("priority", "L1", "S0"),
                                                        ("fcfs", "S0", "L1")])  # fmt: skip
def test_vllm_preempts_the_lowest_priority_under_kv_pressure(build, clock, policy, victim, left):
    """7 blocks of 16 tokens (one is vLLM's null block). L1 (speech, 40 tokens, admitted
    first) and S0 (text, 30 tokens) take 3 + 2; S0's decode takes the last one; when L1's
    decode passes 48 tokens no block is left: vLLM's priority rule preempts the running request
    with the largest (priority code, arrival) — L1 itself. FCFS would preempt the last admitted
    (S0)."""
    sched, config = build(policy=policy, max_num_seqs=4, num_blocks=7)
    add(sched, config, clock, [("L1", SPEECH, 0)], n=40)
    run_step(sched)
    add(sched, config, clock, [("S0", TEXT, 0)], n=30)
    for _ in range(12):
        out, _ = run_step(sched)
        if out.preempted_req_ids:
            break
    assert out.preempted_req_ids == {victim}
    assert [r.request_id for r in sched.running] == [left]
    assert sched.horizon.preemptions == 0  # vLLM's preemption, not HorizonServe's


@pytest.mark.parametrize(("env", "expected"), [("priority", "priority"), ("FCFS", "fcfs")])
def test_the_policy_switch_reaches_the_plugin(hs_env, monkeypatch, env, expected):
    from horizonserve.runtime.engine.vllm_omni import settings

    hs_env("horizon")
    monkeypatch.setenv(settings.POLICY_ENV, env)
    assert settings.resolve_config().policy.value == expected


def test_a_bad_policy_is_refused_with_the_choices(hs_env, monkeypatch):
    from horizonserve.runtime.engine.vllm_omni import settings

    hs_env()
    monkeypatch.setenv(settings.POLICY_ENV, "lottery")
    with pytest.raises(settings.PluginConfigError, match=r"HORIZONSERVE_POLICY.*priority"):
        settings.resolve_config()
