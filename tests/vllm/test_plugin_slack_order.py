"""The shared stage's slack order around vLLM's own scheduler (slack_order.py), on the REAL
vLLM-Omni AR scheduler (CPU): each rule, and the fault it fixes shown with the rule switched
off on the same controller.

Classes (conftest.hs_config): priority 0 → `text` (short path, SLO 0.1 s), 10 → `speech`
(long path, SLO 9.0 s; a waiting speech prefill is protected once less than ≈ 1.31 s of slack
is left: older than ≈ 7.7 s).
"""

from __future__ import annotations

import math
from typing import Any

import pytest
from factory import fake_model_output, run_step
from horizon import add, assert_index_in_sync, ids, new_ids

pytestmark = pytest.mark.vllm

TEXT, SPEECH = 0, 10
LATE_TEXT_AGE = 0.15  # past the text deadline (0.1 s)
PROTECTED_SPEECH_AGE = 8.0  # past protect_at (≈ 7.7 s), before the deadline (9 s)


def _one_place(build: Any, clock: Any, *, slack_view: bool) -> tuple[Any, Any]:
    """One place; two fresh speech prompts (seconds of slack) queued before a late text one."""
    sched, config = build(max_num_seqs=1)
    sched.horizon.slack_view = slack_view
    add(sched, config, clock, [("L0", SPEECH, 0), ("L1", SPEECH, 0), ("S2", TEXT, LATE_TEXT_AGE)])
    return sched, config


def test_a_late_text_prompt_goes_before_speech_prompts_with_seconds_of_slack(build, clock):
    sched, _ = _one_place(build, clock, slack_view=True)
    out, _ = run_step(sched)
    assert new_ids(out) == ["S2"]
    assert_index_in_sync(sched)


def test_without_the_rule_the_late_text_prompt_waits_behind_speech(build, clock):
    """The fault the rule fixes (late_yield alone): every step is a long-path phase while
    on-time speech prompts wait, and the late text prompt is hidden in it."""
    sched, _ = _one_place(build, clock, slack_view=False)
    out, _ = run_step(sched)
    assert new_ids(out) == ["L0"]
    assert "S2" not in sched.horizon.last_visible


def test_a_late_text_prompt_still_yields_to_what_can_still_make_its_deadline(build, clock):
    """On-time text and a protected speech prompt (under 1.31 s of slack) go first: the late
    prompt has missed its SLO, they can still meet theirs."""
    sched, config = build(max_num_seqs=1)
    add(sched, config, clock, [("S0", TEXT, LATE_TEXT_AGE), ("L1", SPEECH, PROTECTED_SPEECH_AGE),
                                ("S2", TEXT, 0.01), ("L3", SPEECH, 0)])  # fmt: skip
    order = []
    for _ in range(4):
        out, _ = run_step(sched)
        order += new_ids(out)
        for request in list(sched.running):  # free the place for the next one
            sched.finish_requests([request.request_id], _aborted())
    assert order == ["S2", "L1", "S0", "L3"]


def _aborted() -> Any:
    from vllm.v1.request import RequestStatus

    return RequestStatus.FINISHED_ABORTED


# -- vLLM's own KV-pressure preemption picks a speech decode, never the text request ----------


def _kv_tight(build: Any, clock: Any, *, victim_order: bool) -> tuple[Any, Any]:
    """4 usable KV blocks of 16 tokens (5 with vLLM's null block). L0 (speech, 32-token prompt:
    2 blocks) is admitted first, S1 (text, 16 tokens: 1 block) next, so vLLM's `running` is
    [L0, S1] and S1 is the newest. After two steps L0 holds 3 blocks, S1 1, none is free, and
    S1's next decode token needs a block: vLLM must preempt."""
    sched, config = build(max_num_seqs=4, num_blocks=5, max_num_batched_tokens=64)
    sched.horizon.victim_order = victim_order
    add(sched, config, clock, [("L0", SPEECH, 0)], n=32, max_tokens=40)
    run_step(sched)
    add(sched, config, clock, [("S1", TEXT, 0)], n=16, max_tokens=8)
    run_step(sched)
    assert sched.kv_cache_manager.block_pool.get_num_free_blocks() == 0
    return sched, config


def test_kv_pressure_preempts_the_speech_decode_not_the_text_request(build, clock):
    sched, _ = _kv_tight(build, clock, victim_order=True)
    out = sched.schedule()
    assert out.preempted_req_ids == {"L0"}
    assert "S1" in out.num_scheduled_tokens
    assert [r.request_id for r in sched.running] == ["S1"]
    sched.update_from_output(out, fake_model_output(sched, out))
    assert ids(sched.waiting) == ["L0"] and sched.horizon.preemptions == 0  # vLLM's own
    assert_index_in_sync(sched)


def test_without_the_order_vllm_preempts_the_newest_request_the_text_one(build, clock):
    """The fault the order fixes: vLLM's FCFS scheduler preempts `running[-1]`."""
    sched, _ = _kv_tight(build, clock, victim_order=False)
    out = sched.schedule()
    assert out.preempted_req_ids == {"S1"}


def test_running_order_keeps_text_in_front_and_the_most_expendable_speech_last(build, clock):
    """Text first, then speech whose first response is at risk (past protect_at) by deadline,
    then speech with slack and speech already handed downstream, newest last."""
    from horizonserve.runtime.engine.vllm_omni.slack_order import order_running

    sched, config = build(max_num_seqs=8)
    specs = [("L0", SPEECH, 0.5), ("L1", SPEECH, PROTECTED_SPEECH_AGE), ("S2", TEXT, 0),
             ("L3", SPEECH, 0), ("L4", SPEECH, 8.5)]  # fmt: skip
    add(sched, config, clock, specs)
    for _ in range(4):
        run_step(sched)
    hs = sched.horizon
    running = list(sched.running)
    running.reverse()
    order_running(running, clock.now, lambda r: r._hs_sig, hs._handed_off_any)
    assert [r.request_id for r in running] == ["S2", "L4", "L1", "L0", "L3"]


# -- the preemption cost rule, measured -------------------------------------------------------


def test_recompute_cost_is_measured_from_the_steps():
    from horizonserve.runtime.engine.vllm_omni.slack_order import RecomputeCost

    cost = RecomputeCost(prior_s_per_token=1e-3)
    assert cost.recompute_s(100) == pytest.approx(0.1)  # the prior, until measured
    for _ in range(5):
        cost.observe(0.006, 0)  # decode-only steps: the base
    for tokens in (40, 96, 10, 64) * 5:
        cost.observe(0.006 + 3e-5 * tokens, tokens)
    cost.observe(5.0, 10)  # an idle gap: skipped
    assert cost.base_s == pytest.approx(0.006)
    assert cost.per_token_s == pytest.approx(3e-5, rel=1e-6)
    assert cost.samples == 20


def _crowded(build: Any, clock: Any, *, measured: bool) -> Any:
    """Four speech decodes fill the places; 100 fresh speech prompts (seconds of slack) wait,
    and a fresh text prompt that no place frees for in time (the decodes have ≈ 37 tokens
    left, 0.22 s; it may wait 0.094 s)."""
    sched, config = build(max_num_seqs=4, num_blocks=400)
    sched.horizon.measured_cost = measured
    add(sched, config, clock, [(f"L{i}", SPEECH, 0) for i in range(4)], max_tokens=40)
    for _ in range(3):
        run_step(sched)
    assert len(sched.running) == 4
    add(sched, config, clock, [(f"W{i}", SPEECH, 0) for i in range(100)], max_tokens=40)
    add(sched, config, clock, [("S9", TEXT, 0)])
    return sched


def test_a_crowded_queue_of_slack_no_longer_vetoes_the_preemption(build, clock):
    sched = _crowded(build, clock, measured=True)
    out, _ = run_step(sched)
    assert sched.horizon.preemptions == 1 and "S9" in new_ids(out)
    assert sched.horizon.preemption_vetoes == 0


def test_the_assumed_cost_vetoed_it(build, clock):
    """The fault: the core's rule charges the recompute to all 101 waiting requests, none of
    which it would make late."""
    sched = _crowded(build, clock, measured=False)
    out, _ = run_step(sched)
    assert sched.horizon.preemptions == 0 and "S9" not in new_ids(out)


def test_the_measured_rule_still_vetoes_a_recompute_that_makes_others_late():
    from horizonserve.runtime.engine.vllm_omni.slack_order import preemption_pays

    assert preemption_pays(0.01, 0.1, [5.0, 2.0, -0.5])  # none hurt (late ones do not count)
    assert not preemption_pays(0.01, 0.1, [0.005] * 9)  # 9 pushed past their deadline
    assert not preemption_pays(0.2, 0.1, [])  # costs more than the wait it saves


@pytest.mark.parametrize("victim_order", [True, False])
def test_the_async_scheduler_under_kv_pressure(build, clock, victim_order):
    """The same squeeze on the async scheduler (outputs one step late): with the order vLLM
    evicts the speech decode, without it the text request (the fault), every time."""
    sched, config = build("omni_ar_async", max_num_seqs=4, num_blocks=5, max_num_batched_tokens=64)
    sched.horizon.victim_order = victim_order
    add(sched, config, clock, [("L0", SPEECH, 0)], n=32, max_tokens=40)
    pending = None
    evicted: set[str] = set()
    for step in range(6):
        if step == 1:
            add(sched, config, clock, [("S1", TEXT, 0)], n=16, max_tokens=8)
        out = sched.schedule()
        evicted |= set(out.preempted_req_ids)
        if pending is not None:
            sched.update_from_output(*pending)
        pending = (out, fake_model_output(sched, out))
    assert evicted == ({"L0"} if victim_order else {"S1"})


# -- the incremental index of waiting short-path prefills equals a full scan -----------------


def _scan_urgent(items: list[Any], sig_of: Any, now: float, wait_s: float) -> list[Any]:
    """The preemption rule's urgent prefills, by walking every one (what the index replaces)."""
    out = []
    for item in items:
        sig = sig_of(item)
        if sig.protected or 0.0 <= sig.can_wait_s(now) < wait_s:
            out.append(item)
    return out


def _scan_margins(items: list[Any], sig_of: Any, now: float, below: float, exclude: set) -> list:
    margins = [sig_of(item).can_wait_s(now) for item in items if item not in exclude]
    return sorted(m for m in margins if 0.0 <= m < below)


def _assert_index_equals_scan(index: Any, items: list[Any], sig_of: Any, now: float) -> None:
    """`index` (PrefillIndex) against a walk over `items` (the prefills in entry order)."""
    assert list(index) == items and len(index) == len(items)
    for wait_s in (0.0, 0.004, 0.03, 0.09, 0.5, 5.0, math.inf):
        want = _scan_urgent(items, sig_of, now, wait_s)
        assert index.urgent(now, wait_s) == want, wait_s
        exclude = set(want[::2])
        below = 0.05 if math.isinf(wait_s) else wait_s
        got = sorted(index.margins_below(now, below, exclude))
        assert got == _scan_margins(items, sig_of, now, below, exclude)
    assert index.any_late(now) == any(sig_of(item).late for item in items)


@pytest.mark.parametrize(("late", "seed"), [("yield", 1), ("yield", 2), ("protect", 3)])
def test_short_prefill_index_equals_a_full_scan_under_the_control_core(hs_env, late, seed):
    """Random admissions (fresh, nearly late, late), re-entries at a later clock (a resumed or
    re-adopted prompt: protected or late at entry), departures (taken, finished, aborted),
    preempted decodes re-queued (not prefills: never in the index) and steps that advance the
    clock and latch protection and lateness: the index answers as a walk over every one."""
    import random

    from horizonserve.runtime.engine.vllm_omni.slack_order import PrefillIndex
    from horizonserve.runtime.policy import make_policy

    config = hs_env("horizon", late=late)
    policy = make_policy(config.policy, config)
    rng = random.Random(seed)
    index: PrefillIndex[str] = PrefillIndex()
    sigs: dict[str, Any] = {}  # waiting requests, in entry order (the controller's `waiting`)
    now = 1_000.0

    def enter(rid: str, sig: Any) -> None:
        sigs[rid] = sig
        if not sig.long_path and not sig.prefilled:
            index.add(rid, rid, sig)

    def leave(rid: str) -> Any:
        sig = sigs.pop(rid)
        index.discard(rid)
        policy.dequeue(sig)
        return sig

    for i in range(700):
        op = rng.random()
        if op < 0.45 or not sigs:
            prio = TEXT if rng.random() < 0.7 else SPEECH
            age = rng.choice([0.0, 0.02, 0.08, 0.095, 0.15, 8.0])
            sig = policy.admit(f"R{i}", now - age, priority=prio)
            enter(f"R{i}", sig)
        elif op < 0.55:  # re-entry, flags latched at entry, maybe at a clock past the step's
            rid = rng.choice(list(sigs))
            sig = leave(rid)
            policy.requeue(sig, now + rng.choice([0.0, 0.005, 0.05]))
            enter(rid, sig)
        elif op < 0.62:  # taken, then preempted back as a decode continuation
            rid = rng.choice(list(sigs))
            sig = leave(rid)
            sig.record_progress(prefilled=True)
            policy.requeue(sig, now)
            enter(rid, sig)
        elif op < 0.8:  # taken into a batch, finished or aborted
            leave(rng.choice(list(sigs)))
        else:
            now += rng.choice([0.001, 0.01, 0.04, 0.3])
            policy.step(now, downstream_active=False)
        items = [rid for rid, sig in sigs.items() if not sig.long_path and not sig.prefilled]
        _assert_index_equals_scan(index, items, sigs.__getitem__, now)
        # On the boundaries: a clock at a prefill's latest start d − r̂ (can wait 0 s, up to
        # rounding), and a wait ending there.
        for rid in rng.sample(items, min(2, len(items))):
            sig = sigs[rid]
            start = sig.deadline - sig.remaining_s()
            if start >= now:
                _assert_index_equals_scan(index, items, sigs.__getitem__, start)
                want = _scan_urgent(items, sigs.__getitem__, now, start - now)
                assert index.urgent(now, start - now) == want


def _arrive_and_abort(sched, config, clock, rng, arrivals, n: int) -> int:
    """Add `arrivals` ((priority, age, max_tokens) each, ids from R`n`), then abort one queued
    or running request with probability 0.05; the next free id number."""
    from vllm.v1.request import RequestStatus

    for prio, age, max_tokens in arrivals:
        add(sched, config, clock, [(f"R{n}", prio, age)], n=rng.randint(4, 60),
            max_tokens=max_tokens)  # fmt: skip
        n += 1
    if rng.random() < 0.05:
        queued = [r for r in list(sched.waiting) + sched.running if not r.is_finished()]
        if queued:
            rid = rng.choice(queued).request_id
            sched.finish_requests([rid], RequestStatus.FINISHED_ABORTED)
    return n


@pytest.mark.parametrize(("kind", "seed"), [("omni_ar", 4), ("omni_ar_async", 5)])
def test_short_prefill_index_equals_a_full_scan_in_the_scheduler(build, clock, kind, seed):
    """The controller's indexes under random load on the real scheduler — arrivals fresh,
    protected and late, aborts, vLLM's own KV preemptions and the plugin's — after every
    step, against a walk over the controller's waiting requests."""
    import random

    from horizonserve.runtime.engine.vllm_omni.scheduler import free_slots

    sched, config = build(kind, max_num_seqs=4, num_blocks=40, max_num_batched_tokens=96)
    hs = sched.horizon
    rng = random.Random(seed)
    n = 0
    seen = {"late": 0, "protected": 0, "preempted": 0}
    for _ in range(300):
        # Speech decodes keep the places busy; text arrives fresh, nearly late, protected
        # (past ≈ 0.092 s of its 0.1 s) or late, sometimes several at once.
        arrivals = []
        if free_slots(sched) > 0 and not hs.n_long_prefill:
            arrivals.append((SPEECH, rng.choice([0.0, 3.0, 6.0]), rng.randint(5, 40)))
        for _ in range(rng.choice([0] * 6 + [1, 1, 2, 3])):
            arrivals.append(
                (TEXT, rng.choice([0.0, 0.05, 0.095, LATE_TEXT_AGE]), rng.randint(1, 4))
            )
        n = _arrive_and_abort(sched, config, clock, rng, arrivals, n)
        out, _ = run_step(sched)
        now = hs._step_ns * 1e-9
        items = [r for r in hs.waiting.values() if not r._hs_sig.long_path]
        items = [r for r in items if not r._hs_sig.prefilled]
        _assert_index_equals_scan(hs._short_prefills, items, lambda r: r._hs_sig, now)
        longs = [r for r in hs.waiting.values() if r._hs_sig.long_path]
        longs = [r for r in longs if not r._hs_sig.prefilled]
        assert list(hs._long_prefills) == longs
        protected = hs._long_prefills.protected(now)
        assert sorted(map(id, protected)) == sorted(id(r) for r in longs if r._hs_sig.protected)
        continuations = [r for r in hs.waiting.values() if r._hs_sig.prefilled]
        assert list(hs._continuations.values()) == continuations
        seen["late"] += sum(r._hs_sig.late for r in items)
        seen["protected"] += sum(r._hs_sig.protected for r in items)
        seen["preempted"] += len(out.preempted_req_ids)
        clock.advance(rng.choice([0.002, 0.01, 0.03]))
    assert all(seen.values()), seen  # the load reached every state the index answers for


@pytest.mark.parametrize(("kind", "seed"), [("omni_ar", 6), ("omni_ar_async", 7)])
def test_slack_head_from_the_indexes_equals_the_order_of_the_whole_queue(
    build, clock, monkeypatch, kind, seed
):
    """Every head of the slack order the indexes give (`_slack_head`) equals the head of
    `view_order` over the whole queue, under random load with speech bursts (fresh, with
    slack, protected, late), text (fresh, late), aborts and preemptions, in short- and
    long-path phases; a window margin of 1 makes the head shorter than the visible set."""
    import collections
    import random

    from horizonserve.runtime.engine.vllm_omni.slack_order import view_order

    monkeypatch.setenv("HORIZONSERVE_VLLM_WINDOW_MARGIN", "1")
    sched, config = build(kind, max_num_seqs=4, num_blocks=60, max_num_batched_tokens=96)
    hs = sched.horizon
    head_of = hs._slack_head
    answered: collections.Counter[str] = collections.Counter()

    def checked(view: Any, w: Any, s: Any, k: int, now: float) -> list | None:
        head = head_of(view, w, s, k, now)
        if head is not None:
            full = view_order(view.is_visible, list(w), lambda r: r._hs_sig, now)
            assert [r.request_id for r in head[:k]] == [r.request_id for r in full[:k]]
            answered[view.phase.name] += 1
            answered["cut"] += len(full) > k
            answered["protected speech"] += any(
                r._hs_sig.long_path and r._hs_sig.protected for r in head
            )
        return head

    hs._slack_head = checked
    rng = random.Random(seed)
    n = 0
    for _ in range(300):
        arrivals = []
        if rng.random() < 0.15:
            for _ in range(rng.randint(1, 4)):
                age = rng.choice([0.0, 3.0, PROTECTED_SPEECH_AGE, 9.5])
                arrivals.append((SPEECH, age, rng.randint(3, 30)))
        for _ in range(rng.choice([0] * 4 + [1, 1, 2])):
            arrivals.append((TEXT, rng.choice([0.0, 0.0, 0.05, LATE_TEXT_AGE]), rng.randint(1, 4)))
        n = _arrive_and_abort(sched, config, clock, rng, arrivals, n)
        run_step(sched)
        assert_index_in_sync(sched)
        clock.advance(rng.choice([0.002, 0.01, 0.03]))
    for case in ("SHORT", "LONG", "cut", "protected speech"):
        assert answered[case] > 0, answered
