"""Shared-stage preemption in the REAL vLLM-Omni AR scheduler (CPU), through vLLM's own
`_preempt_request`: a protected short-path prefill waiting on a full running set (places or
KV blocks) takes the place of the running long-path decode with the most slack.

Classes (conftest.hs_config): priority 0 → `text` (short path, SLO 0.1 s, protected once it has
waited ≈ 0.092 s, late after 0.1 s), 10 → `speech` (long path, SLO 9.0 s, estimated remaining
time after its prefill ≈ 0.87 s, so a running speech decode is protected once less than
≈ 1.3 s of slack is left: older than ≈ 7.7 s).
"""

from __future__ import annotations

import math
import random
from typing import Any

import pytest
from factory import fake_model_output, run_step
from horizon import add, assert_index_in_sync, ids, new_ids, resumed_ids

pytestmark = pytest.mark.vllm

TEXT, SPEECH = 0, 10
PROTECTED_TEXT_AGE = 0.095  # past protect_at (≈ 0.092 s), before the deadline (0.1 s)


def running_ids(sched: Any) -> list[str]:
    return [r.request_id for r in sched.running]


def decoding_set(build: Any, clock: Any, policy: str = "horizon", **params: Any):
    """Four running requests, all decoding: S0 (text), L1 (speech, fresh: most slack), L2
    (speech, 5 s old) and L3 (speech, 8.2 s old: protected while running)."""
    sched, config = build(policy=policy, max_num_seqs=4, **params)
    add(sched, config, clock, [("S0", TEXT, 0), ("L1", SPEECH, 0), ("L2", SPEECH, 5.0),
                                ("L3", SPEECH, 8.2)], max_tokens=40)  # fmt: skip
    for _ in range(3):  # rotation: S0 first, then the speech prefills; all decode afterwards
        run_step(sched)
    assert sorted(running_ids(sched)) == ["L1", "L2", "L3", "S0"]
    assert all(r.num_output_tokens > 0 for r in sched.running)
    return sched, config


@pytest.mark.parametrize("kind", ["omni_ar", "omni_ar_async"])
def test_a_protected_text_request_preempts_the_most_slack_speech_decode(build, clock, kind):
    sched, config = decoding_set(build, clock, max_num_batched_tokens=256)
    l1 = sched.requests["L1"]
    add(sched, config, clock, [("S4", TEXT, PROTECTED_TEXT_AGE)])
    out = sched.schedule()
    assert sched.horizon.last_victims == ["L1"]
    assert out.preempted_req_ids == {"L1"}  # the model runner drops its state
    assert new_ids(out) == ["S4"]  # the freed place went to the text request, not back to L1
    assert "L1" not in out.num_scheduled_tokens
    assert l1.num_preemptions == 1 and l1.num_computed_tokens == 0
    assert l1.status.name == "PREEMPTED" and ids(sched.waiting) == ["L1"]
    assert l1._hs_sig.prefilled and l1._hs_sig.waiting  # back as a decode continuation
    assert sched.kv_cache_manager.get_blocks("L1").get_block_ids() == ([],)  # KV freed
    sched.update_from_output(out, fake_model_output(sched, out))
    assert_index_in_sync(sched)

    # Next protected text request: L2 (5 s old) is the most-slack candidate left; L3 is
    # protected, S0 and S4 are short-path.
    add(sched, config, clock, [("S5", TEXT, PROTECTED_TEXT_AGE)])
    out, _ = run_step(sched)
    assert sched.horizon.last_victims == ["L2"] and new_ids(out) == ["S5"]
    assert ids(sched.waiting) == ["L2", "L1"]
    # A third one: no candidate left (L3 protected, the others short-path): it waits.
    add(sched, config, clock, [("S6", TEXT, PROTECTED_TEXT_AGE)])
    out, _ = run_step(sched)
    assert sched.horizon.last_victims == [] and not new_ids(out)
    assert sorted(running_ids(sched)) == ["L3", "S0", "S4", "S5"]
    assert sched.horizon.preemptions == 2
    assert_index_in_sync(sched)


def test_a_text_request_that_can_wait_for_a_place_does_not_preempt(build, clock):
    """Not protected, and a running request frees its place before the text request's wait
    runs out (`short_needs_place`): no recompute is spent. Once no place would free in time,
    the same request preempts."""
    sched, config = decoding_set(build, clock)
    add(sched, config, clock, [("S4", TEXT, 0.0)])  # fresh: 0.095 s it may still wait
    policy = sched.horizon.policy
    policy.preemption = False  # hold the rule off while the running set gets near its end
    for _ in range(34):  # the decodes now have 3 of their 40 tokens left: a place frees soon
        run_step(sched)
    assert ids(sched.waiting) == ["S4"] and len(sched.running) == 4  # still blocked
    policy.preemption = True
    out, _ = run_step(sched)
    assert sched.horizon.preemptions == 0 and not out.preempted_req_ids


def test_a_late_text_request_no_longer_preempts(build, clock):
    sched, config = decoding_set(build, clock)
    add(sched, config, clock, [("S4", TEXT, 0.15)])  # past its 0.1 s deadline: ordinary
    run_step(sched)
    assert sched.horizon.preemptions == 0 and ids(sched.waiting) == ["S4"]


@pytest.mark.parametrize("policy", ["fcfs", "edf", "priority", "horizon-no-preemption"])
def test_policies_without_preemption_leave_the_running_set_alone(build, clock, policy):
    sched, config = decoding_set(build, clock, policy=policy)
    add(sched, config, clock, [("S4", TEXT, PROTECTED_TEXT_AGE)])
    out, _ = run_step(sched)
    assert sched.horizon.preemptions == 0 and not out.preempted_req_ids
    assert ids(sched.waiting) == ["S4"]


def test_the_control_switch_turns_preemption_off(build, clock):
    sched, config = decoding_set(build, clock, control={"preemption": "none"})
    add(sched, config, clock, [("S4", TEXT, PROTECTED_TEXT_AGE)])
    run_step(sched)
    assert sched.horizon.preemptions == 0 and ids(sched.waiting) == ["S4"]


def test_kv_pressure_preempts_for_a_protected_text_request(build, clock):
    """Places are free but the KV blocks are not: 7 blocks of 16 tokens (one is vLLM's null
    block), L0 and L1 (40-token prompts) hold 3 each; S2 needs one."""
    sched, config = build(max_num_seqs=8, num_blocks=7)
    add(sched, config, clock, [("L0", SPEECH, 2.0), ("L1", SPEECH, 0)], n=40, max_tokens=6)
    run_step(sched)
    assert sched.kv_cache_manager.block_pool.get_num_free_blocks() == 0
    add(sched, config, clock, [("S2", TEXT, PROTECTED_TEXT_AGE)])
    out, _ = run_step(sched)
    assert sched.horizon.last_victims == ["L1"]  # the fresher one: more slack
    assert new_ids(out) == ["S2"] and out.preempted_req_ids == {"L1"}
    assert sorted(running_ids(sched)) == ["L0", "S2"]
    assert_index_in_sync(sched)


def test_the_victim_resumes_and_finishes_with_every_token(build, clock):
    sched, config = decoding_set(build, clock)
    add(sched, config, clock, [("S4", TEXT, PROTECTED_TEXT_AGE)], max_tokens=2)
    before = sched.requests["L1"].num_output_tokens
    run_step(sched)
    assert sched.horizon.last_victims == ["L1"]
    finished: dict[str, int] = {}
    resumed = False
    for _ in range(80):
        out, outputs = run_step(sched)
        resumed |= "L1" in resumed_ids(out)
        for client in outputs.values():
            for o in client.outputs:
                if o.finish_reason is not None:
                    finished[o.request_id] = finished.get(o.request_id, 0) + 1
        if not sched.has_unfinished_requests():
            break
    assert resumed
    assert finished == {rid: 1 for rid in ("S0", "L1", "L2", "L3", "S4")}
    assert before < 40  # L1 was mid-decode when preempted, and still produced all 40 tokens


# -- nothing lost or duplicated, and the rule holds, under random load ---------------------------


def _reference_slack(sig: Any, now: float) -> float | None:
    """Slack of a running request as a victim, written out from the rule (module doc)."""
    if not sig.long_path or not sig.prefilled or sig.preempted:
        return None  # short-path, prefilling, or preempted once already
    if sig.decoded_tokens >= sig.costs.decode_tokens:
        return math.inf  # handed off downstream: no first response left here
    if now > sig.protect_at:
        return None
    return (sig.deadline - now) / sig.remaining_s()


@pytest.mark.parametrize(("kind", "seed"), [("omni_ar", 1), ("omni_ar", 2), ("omni_ar_async", 3)])
def test_random_load_with_preemptions_and_aborts_loses_nothing(build, clock, kind, seed):
    from vllm.v1.request import RequestStatus

    from horizonserve.runtime.engine.vllm_omni.scheduler import free_slots

    sched, config = build(kind, max_num_seqs=4, num_blocks=40, max_num_batched_tokens=96)
    hs = sched.horizon
    picks: list[tuple[Any, float | None, list[float | None]]] = []
    decodes, preempt_one = hs._decodes, hs._preempt_one

    def checked(sched_: Any, victim: Any) -> None:  # the candidates as the policy saw them
        now = clock.now
        slacks = [_reference_slack(r._hs_sig, now) for r in decodes(sched_)]
        picks.append((victim, _reference_slack(victim._hs_sig, now), slacks))
        preempt_one(sched_, victim)

    hs._preempt_one = checked
    rng = random.Random(seed)
    want: dict[str, int] = {}
    got: dict[str, list[int]] = {}
    finished: dict[str, int] = {}
    aborted: set[str] = set()
    for step in range(2000):
        if step >= 160 and not sched.has_unfinished_requests():
            break
        # Speech keeps the places busy without a queue of its own (preemption is for a
        # blocked urgent request, never under a backlog of ordinary prefills); text arrives
        # already protected; some prompts need several chunks.
        arrivals = []
        if step < 160 and free_slots(sched) > 0 and not hs.n_long_prefill:
            arrivals.append((SPEECH, rng.choice([0.0, 3.0, 6.0]), rng.randint(5, 40)))
        if step < 160 and rng.random() < 0.1:
            arrivals.append((TEXT, PROTECTED_TEXT_AGE, rng.randint(1, 4)))
        for prio, age, n in arrivals:
            rid = f"{'S' if prio == TEXT else 'L'}{len(want)}"
            want[rid] = n
            add(sched, config, clock, [(rid, prio, age)], n=rng.randint(4, 120), max_tokens=n)
        if step < 160 and rng.random() < 0.06:
            queued = [r for r in list(sched.waiting) + sched.running if not r.is_finished()]
            if queued:
                victim = rng.choice(queued).request_id
                sched.finish_requests([victim], RequestStatus.FINISHED_ABORTED)
                aborted.add(victim)
        out = sched.schedule()
        assert not (set(new_ids(out)) & set(resumed_ids(out)))
        outputs = sched.update_from_output(out, fake_model_output(sched, out, token_id=step))
        for client in outputs.values():
            for o in client.outputs:
                got.setdefault(o.request_id, []).extend(o.new_token_ids)
                if o.finish_reason is not None:
                    finished[o.request_id] = finished.get(o.request_id, 0) + 1
        assert_index_in_sync(sched)
        queued = ids(sched.waiting) + ids(sched.skipped_waiting)
        assert len(queued) == len(set(queued)) and not set(queued) & set(running_ids(sched))
        clock.advance(0.01)
    assert not sched.has_unfinished_requests()
    assert len(picks) >= 3 and hs.preemptions == len(picks)
    for victim, chosen, slacks in picks:  # the rule, at every decision
        assert victim._hs_sig.long_path and chosen is not None  # never short-path / protected
        assert all(u is None or u <= chosen for u in slacks)  # the most slack
    for rid, n in want.items():  # every request answered once, with all its tokens, in order
        if rid in aborted:
            assert finished.get(rid, 0) <= 1
            continue
        assert finished.get(rid) == 1, rid
        assert len(got[rid]) == n, (rid, got[rid])
        assert got[rid] == sorted(got[rid])
