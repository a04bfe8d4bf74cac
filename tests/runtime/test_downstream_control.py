"""Downstream control, preemption and the slack split: invariants as properties."""

from __future__ import annotations

import math

from hypothesis import given, settings
from hypothesis import strategies as st

from horizonserve.runtime.config import ControlParams, SharingVerdicts, SmLadder
from horizonserve.runtime.downstream import (
    FifoQueue,
    PlaybackClock,
    SlackQueue,
    Stamp,
    realtime_streams,
)
from horizonserve.runtime.policy import make_policy
from horizonserve.runtime.preemption import choose_victim
from horizonserve.runtime.spatial import AGGRESSIVE, OPEN, RESERVED, SpatialController
from tests.runtime.builders import make_config


def _stamp(i: int, deadline: float, arrival: float = 0.0) -> Stamp:
    return Stamp(f"r{i}", "audio-out", 10, arrival, deadline, 0.0)


# (deadline, first-output estimate, push time) per request.
_requests = st.lists(
    st.tuples(
        st.floats(0.0, 20.0, allow_nan=False),
        st.floats(0.0, 5.0, allow_nan=False),
    ),
    min_size=1,
    max_size=40,
)


@settings(max_examples=150, deadline=None)
@given(_requests, st.lists(st.floats(0.0, 25.0, allow_nan=False), min_size=1, max_size=60))
def test_slack_queue_is_edf_among_meetable_then_late(reqs, times) -> None:
    """Every pop is the earliest-deadline meetable request when one exists (a late one never
    ahead of a meetable one); every request pops exactly once."""
    q: SlackQueue[int] = SlackQueue()
    alive = {}
    for i, (d, first) in enumerate(reqs):
        q.push(i, _stamp(i, d), first)
        alive[i] = (d, first)
    popped = []
    for now in sorted(times):
        got = q.pop(now)
        if got is None:
            assert not alive
            break
        item, late = got
        meetable = [k for k, (d, f) in alive.items() if now <= d - f]
        if meetable:
            best = min(alive[k][0] for k in meetable)
            assert not late and alive[item][0] == best
        else:
            assert late and alive[item][0] == min(d for d, _ in alive.values())
        del alive[item]
        popped.append(item)
    while (got := q.pop(1e9)) is not None:
        popped.append(got[0])
        del alive[got[0]]
    assert sorted(popped) == list(range(len(reqs))) and len(q) == 0


@settings(max_examples=80, deadline=None)
@given(_requests, st.data())
def test_removed_requests_never_pop_and_nothing_else_is_lost(reqs, data) -> None:
    for q in (SlackQueue(), FifoQueue()):
        items = list(range(len(reqs)))
        for i, (d, first) in enumerate(reqs):
            q.push(i, _stamp(i, d), first)
        gone = set(data.draw(st.lists(st.sampled_from(items), unique=True)))
        for i in gone:
            assert q.remove(i)
        assert not any(q.remove(i) for i in gone)  # removing twice is a no-op
        out = []
        while (got := q.pop(3.0)) is not None:
            out.append(got[0])
        assert sorted(out) == sorted(set(items) - gone)
        if isinstance(q, FifoQueue):
            assert out == [i for i in items if i not in gone]


def test_late_requests_are_counted_not_dropped() -> None:
    q: SlackQueue[str] = SlackQueue()
    q.push("hopeless", _stamp(0, 1.0), 2.0)  # late_at = -1: late from the start
    q.push("fine", _stamp(1, 9.0), 1.0)
    assert q.pop(0.0) == ("fine", False)
    assert q.pop(0.0) == ("hopeless", True)
    assert q.late_popped == 1 and q.pop(0.0) is None


@settings(max_examples=100, deadline=None)
@given(
    st.floats(0.05, 2.0),  # chunk seconds of audio
    st.floats(0.2, 1.0),  # chunk production time as a fraction of the chunk's audio
    st.integers(2, 40),
)
def test_no_underrun_while_generation_keeps_real_time(chunk_s, speed, n) -> None:
    """Chunks that arrive no slower than real time never underrun; credit stays ≥ 0."""
    clock = PlaybackClock()
    t = 0.0
    for _ in range(n):
        assert not clock.on_chunk(t, chunk_s)
        assert clock.credit(t) >= -1e-9
        t += speed * chunk_s
    assert clock.underruns == 0


def test_an_underrun_is_counted_once_and_playback_resumes() -> None:
    clock = PlaybackClock()
    clock.on_chunk(0.0, 1.0)  # plays until t = 1
    assert clock.on_chunk(3.0, 1.0)  # 2 s dry
    assert clock.underruns == 1
    assert clock.credit(3.0) == 1.0  # playback resumed with the new chunk
    assert not clock.on_chunk(3.5, 1.0)
    assert clock.may_yield(3.5, 1.0) and not clock.may_yield(3.5, 2.0)


def test_realtime_streams_counts_what_a_batch_sustains() -> None:
    # 10 ms per step at any batch, 40 ms of audio per step: each stream runs 4x real time.
    assert realtime_streams(lambda b: 0.01, 0.04, 16) == 64
    # A step slower than the audio it makes: one stream still served.
    assert realtime_streams(lambda b: 0.1 * b, 0.04, 8) == 1


# -- preemption ---------------------------------------------------------------------------------
_running = st.lists(
    st.tuples(
        st.booleans(),  # long path
        st.booleans(),  # prefilled
        st.booleans(),  # handed off
        st.floats(0.0, 30.0),  # arrival offset
    ),
    min_size=0,
    max_size=20,
)


@settings(max_examples=150, deadline=None)
@given(_running, st.floats(0.0, 40.0))
def test_preemption_picks_the_most_slack_long_decode_never_short_or_protected(rows, now) -> None:
    policy = make_policy("horizon", make_config())
    items = []
    for i, (long_path, prefilled, handed, arrival) in enumerate(rows):
        sig = policy.profiler.annotate(f"r{i}", arrival, priority=10 if long_path else 0)
        if prefilled:
            sig.record_progress(prefilled=True)
        items.append((sig, handed and long_path))
    victim = choose_victim(items, now, lambda x: x[0], lambda x: x[1])
    candidates = [
        x for x in items if x[0].long_path and x[0].prefilled and (x[1] or now <= x[0].protect_at)
    ]
    if not candidates:
        assert victim is None
        return
    assert victim is not None
    sig, handed = victim
    assert sig.long_path and sig.prefilled
    assert handed or not sig.is_protected(now)

    def slack(x):  # type: ignore[no-untyped-def]
        return math.inf if x[1] else x[0].slack_ratio(now)

    assert slack(victim) == max(slack(x) for x in candidates)


def test_preemption_serves_only_a_short_request_that_needs_a_place_in_time() -> None:
    """A short-path prompt preempts only if it can still meet its deadline but not after
    waiting for the next place to free by itself (or it is protected); never when late, and
    only when the victim's recompute costs less than the wait it saves."""
    policy = make_policy("horizon", make_config())
    long_sig = policy.profiler.annotate("long", 0.0, priority=10)
    long_sig.record_progress(prefilled=True)
    running = [long_sig]

    def ask(now: float, next_free: float):  # type: ignore[no-untyped-def]
        policy.step(now, downstream_active=True)
        return policy.preemption_victim(running, now, lambda s: s, lambda s: False, next_free)

    assert ask(0.0, 10.0) is None  # nothing waits
    text = policy.admit("text", 0.0, priority=0)
    room = text.can_wait_s(0.001)
    assert room > 0
    assert ask(0.001, 10.0) is long_sig  # no place frees before its wait runs out
    assert ask(0.001, room / 2) is None  # a place frees in time: no recompute paid
    assert ask(text.protect_at + 1e-4, 10.0) is long_sig  # protected: needs a place now
    assert ask(text.protect_at + 2e-4, 0.0) is None  # … unless one frees now anyway
    assert ask(text.deadline + 1.0, 10.0) is None  # late: past saving, nothing preempted
    # A victim whose recompute (prompt + decoded tokens) costs more than the wait saved: kept.
    policy = make_policy("horizon", make_config())
    long_sig = policy.profiler.annotate("long", 0.0, priority=10)
    long_sig.record_progress(prefilled=True)
    running = [long_sig]
    policy.admit("text", 0.0, priority=0)
    assert ask(0.001, 10.0) is long_sig
    long_sig.record_progress(decoded=10**6)
    assert ask(0.002, 10.0) is None
    # The recompute delays every waiting request: with a long queue the same victim is kept.
    policy = make_policy("horizon", make_config())
    long_sig = policy.profiler.annotate("long", 0.0, priority=10)
    long_sig.record_progress(prefilled=True, decoded=200)
    running = [long_sig]
    policy.admit("text", 0.0, priority=0)
    recompute = long_sig.prefill_s + 200 * long_sig.costs.prefill_s_per_token
    wait_saved = 10.0  # no place frees before the text request's deadline
    assert ask(0.001, wait_saved) is long_sig
    for i in range(int(wait_saved / recompute) + 1):  # enough waiters to outweigh the saving
        policy.admit(f"queued-{i}", 0.0, priority=10)
    assert ask(0.002, wait_saved) is None
    for name in ("fcfs", "priority", "horizon-no-preemption"):
        assert make_policy(name, make_config()).preemption is False


# -- the slack split -----------------------------------------------------------------------------
_LADDER = SmLadder(levels=[32, 48, 64, 80], aggressive=132, total=132, reserve=16)


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.booleans(),
            st.one_of(st.none(), st.floats(-5, 20)),
            st.one_of(st.none(), st.floats(-5, 20)),
            st.floats(0, 1),
        ),
        min_size=1,
        max_size=30,
    ),
    st.booleans(),
    st.booleans(),
)
def test_split_moves_toward_the_lower_slack_side_and_sums_to_the_gpu(
    steps, throttling_pays, reservation_pays
) -> None:
    verdicts = SharingVerdicts(throttling_pays=throttling_pays, reservation_pays=reservation_pays)
    ctl = SpatialController(_LADDER, ControlParams(boost="prefill"), verdicts)
    for active, u_shared, u_down, sample in steps:
        ctl.observe(sample)
        d = ctl.select(active, False, u_shared, u_down)
        if not active:  # an idle downstream side gets nothing reserved
            assert d.level == AGGRESSIVE and d.shared == _LADDER.aggressive
            continue
        if d.level == OPEN:  # both sides on the whole GPU as MPS clients
            assert d.shared == d.downstream == _LADDER.total
        else:
            assert d.shared + d.downstream == _LADDER.total
        down_first = u_down is not None and (u_shared is None or u_down < u_shared)
        if down_first:  # the downstream side is the more urgent one: it gets the most
            assert d.level == (RESERVED if reservation_pays else OPEN)
            assert d.shared == (_LADDER.reserve if reservation_pays else _LADDER.total)
        elif throttling_pays:
            assert 0 <= d.level < len(_LADDER.levels) and d.shared <= _LADDER.s_cap
        else:
            assert d.level == OPEN


def test_split_off_is_eq1_whatever_the_slack() -> None:
    on = SpatialController(_LADDER, ControlParams())
    off = SpatialController(_LADDER, ControlParams(sm_split="ladder", downstream_urgency="slack"))
    for ctl in (on, off):
        ctl.observe(0.93)  # B̂ at saturation: Eq. (1) says S_cap
    assert on.select(True, False, 5.0, 1.0).shared == 16  # the reservation
    assert off.select(True, False, 5.0, 1.0).shared == 80


def test_policy_reads_the_shared_side_slack_only_when_splitting() -> None:
    policy = make_policy("horizon", make_config())
    policy.admit("text", 0.0, priority=0)
    sig = policy.profiler.annotate("long", 0.0, priority=10)
    late = policy.step(100.0, downstream_active=True, running=[sig], downstream_slack=3.0)
    # The waiting text request is past its deadline (not protected): the running long-path
    # request's slack (negative, far past its deadline) is the shared side's, below 3.
    assert late.sm.level != 0
    fcfs = make_policy("fcfs", make_config())
    assert fcfs.slack_split is False


def test_the_shared_stage_keeps_its_sms_while_it_is_the_bottleneck() -> None:
    """`shared_hold_s`: no reservation while a prompt waits at the shared stage or within the
    hold after a backlog; the old rule (downstream first whenever more urgent) at 0."""

    def policy(hold: float):
        config = make_config()
        control = config.control.model_copy(update={"shared_hold_s": hold})
        return make_policy("horizon", config.model_copy(update={"control": control}))

    held, old = policy(5.0), policy(0.0)
    waiting = {}
    for p in (held, old):  # a prompt waits: the downstream side is the more urgent
        waiting[id(p)] = p.admit("long", 0.0, priority=10)
    down = {"downstream_active": True, "downstream_slack": -1.0}
    assert held.step(0.01, **down).sm.level != RESERVED
    assert old.step(0.01, **down).sm.level == RESERVED
    for p in (held, old):  # nothing waits any more
        p.dequeue(waiting[id(p)])
    assert held.step(0.02, **down).sm.level == RESERVED
    held.step(1.0, backlog=True, **down)  # full running set: lifted, and the hold starts
    assert held.step(5.9, **down).sm.level != RESERVED  # within 5 s of the backlog
    assert held.step(6.1, **down).sm.level == RESERVED


def test_the_decision_records_the_slacks_the_split_compared() -> None:
    """The engines trace `StepDecision.shared_slack` / `downstream_slack`: the two values the
    split compared, after the hold (the downstream side is not offered while it holds)."""
    config = make_config()
    control = config.control.model_copy(update={"shared_hold_s": 5.0})
    horizon = make_policy("horizon", config.model_copy(update={"control": control}))
    waiting = horizon.admit("long", 0.0, priority=10)
    held = horizon.step(0.01, downstream_active=True, downstream_slack=-1.0)
    # The waiting long-path prompt nearest protection is the shared side's; while it waits
    # the shared stage holds its SMs, so the downstream side is not offered.
    assert held.shared_slack == waiting.slack_ratio(0.01)
    assert held.downstream_slack is None and held.sm.level != RESERVED
    horizon.dequeue(waiting)
    running = horizon.profiler.annotate("run", 0.0, priority=10)
    split = horizon.step(0.02, downstream_active=True, running=[running], downstream_slack=-1.0)
    assert split.shared_slack == running.slack_ratio(0.02) and split.downstream_slack == -1.0
    assert split.sm.level == RESERVED  # the downstream side had the smaller slack
    fcfs = make_policy("fcfs", make_config()).step(
        0.02, downstream_active=True, running=[running], downstream_slack=-1.0
    )
    assert fcfs.shared_slack is None and fcfs.downstream_slack is None  # no split read them
    text = make_policy("horizon", make_config())
    text.admit("text", 0.0, priority=0)
    assert text.step(0.01, downstream_active=True).shared_slack == -math.inf  # text waits


def test_a_listing_past_many_late_requests_names_each_request_once() -> None:
    """More than 16 late requests behind a meetable head: the listing that finds them moves
    them to the late list and still names every queued request exactly once (it once named
    them twice, from the late list it had just filled and from the walk)."""
    q: SlackQueue[int] = SlackQueue()
    q.push(0, _stamp(0, 10.0), 0.1)  # meetable at t = 5
    for i in range(1, 21):
        q.push(i, _stamp(i, 10.0 + i), 40.0)  # must start 40 s before its deadline: late
    listed = [item for item, _ in q.order(5.0)]
    assert sorted(listed) == list(range(21))
    assert [item for item, _ in q.order(5.0)] == listed  # the rebuilt lists list the same
