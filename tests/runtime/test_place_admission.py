"""Place-aware downstream admission (`place_order`, `SlackQueue.order`): Moore–Hodgson over the
places' free times keeps a set that starts in time, never fewer than deadline order would."""

from __future__ import annotations

import heapq

from hypothesis import given, settings
from hypothesis import strategies as st

from horizonserve.runtime.downstream import (
    PLACE_HORIZON,
    FifoQueue,
    SlackQueue,
    Stamp,
    place_order,
)
from horizonserve.runtime.engine.reference.stages.admission import downstream_rules
from horizonserve.runtime.policy import make_policy
from tests.runtime.builders import make_config


def _walk(now: float, free_at: list[float], reqs: list[tuple[float, float]]) -> list[bool]:
    """Each request, in order, on the earliest free place: did it start by its late_at?"""
    places = [max(t, now) for t in free_at]
    heapq.heapify(places)
    on_time = []
    for late_at, occupancy in reqs:
        start = places[0]
        on_time.append(start <= late_at)
        heapq.heapreplace(places, start + occupancy)
    return on_time


def test_one_long_answer_no_longer_costs_two_short_ones() -> None:
    # One place, free now. Deadline order starts the long one first and both short ones miss.
    reqs = [(1.0, 10.0), (2.0, 1.0), (3.0, 1.0)]
    assert _walk(0.0, [0.0], reqs) == [True, False, False]
    assert place_order(0.0, [0.0], reqs) == [1, 2]


def test_it_is_deadline_order_where_every_request_can_start_in_time() -> None:
    reqs = [(1.0, 5.0), (1.5, 5.0), (9.0, 1.0)]
    assert place_order(0.0, [0.0, 0.5, 4.0], reqs) == [0, 1, 2]
    assert place_order(0.0, [], reqs) == []


_reqs = st.lists(
    st.tuples(st.floats(0.0, 30.0, allow_nan=False), st.floats(0.01, 15.0, allow_nan=False)),
    min_size=0,
    max_size=14,
).map(sorted)
_free = st.lists(st.floats(-2.0, 20.0, allow_nan=False), min_size=1, max_size=5)


@settings(max_examples=300, deadline=None)
@given(_reqs, _free)
def test_the_kept_set_starts_in_time_and_is_never_smaller_than_deadline_orders(reqs, free_at):
    kept = place_order(0.0, free_at, reqs)
    assert kept == sorted(set(kept))  # a subsequence, in deadline order
    assert all(_walk(0.0, free_at, [reqs[i] for i in kept]))
    assert len(kept) >= sum(_walk(0.0, free_at, reqs))


def _stamp(i: int, deadline: float) -> Stamp:
    return Stamp(f"r{i}", "audio-speech", 10, 0.0, deadline, 0.0)


def test_slack_queue_orders_kept_then_meetable_then_deferred_then_late() -> None:
    q: SlackQueue[str] = SlackQueue()
    q.push("late", _stamp(0, 0.5), 0.0, work=1.0)  # late at now = 1
    q.push("long", _stamp(1, 2.0), 0.0, work=100.0)
    q.push("short-a", _stamp(2, 3.0), 0.0, work=10.0)
    q.push("short-b", _stamp(3, 4.0), 0.0, work=10.0)
    edf = [("long", False), ("short-a", False), ("short-b", False), ("late", True)]
    assert q.order(1.0) == edf  # without places: as `pop` hands them out
    # One place free now, 0.1 s per unit of work: "long" (10 s) would make both short ones miss.
    got = q.order(1.0, [1.0], 0.1)
    assert got == [("short-a", False), ("short-b", False), ("long", False), ("late", True)]
    assert len(q) == 4  # ordering removes nothing
    q.take("short-a", False)
    q.take("late", True)
    assert len(q) == 2 and q.late_popped == 1
    assert q.pop(1.0) == ("long", False)


def test_unknown_lengths_keep_deadline_order() -> None:
    q: SlackQueue[str] = SlackQueue()
    q.push("a", _stamp(0, 2.0), 0.0)
    q.push("b", _stamp(1, 3.0), 0.0)
    assert q.order(0.0, [0.0], 0.1) == [("a", False), ("b", False)]


def test_only_the_first_horizon_of_meetable_requests_is_reordered() -> None:
    q: SlackQueue[int] = SlackQueue()
    n = PLACE_HORIZON + 5
    for i in range(n):
        q.push(i, _stamp(i, 100.0 + i), 0.0, work=1.0)
    assert [i for i, _ in q.order(0.0, [0.0], 0.01)] == list(range(n))


def test_fifo_queue_lists_arrival_order_and_counts_late_takes() -> None:
    q: FifoQueue[str] = FifoQueue()
    q.push("a", _stamp(0, 0.5), 0.0, work=9.0)
    q.push("b", _stamp(1, 5.0), 0.0, work=1.0)
    assert q.order(1.0, [1.0], 1.0) == [("a", True), ("b", False)]
    q.take("a", True)
    assert len(q) == 1 and q.late_popped == 1


def test_the_knob_reaches_the_stages_only_with_downstream_control() -> None:
    on = make_config(downstream="place")
    assert make_policy("horizon", on).place_admission
    assert downstream_rules(on).places
    assert not make_policy("edf", on).place_admission  # a baseline keeps its own order
    off = make_config(downstream="fifo", downstream_urgency="slack")
    assert not make_policy("horizon", off).place_admission
    assert downstream_rules(make_config()).places  # on by default
    assert not downstream_rules(make_config(downstream="deadline")).places


_queue = st.lists(
    st.tuples(
        st.floats(0.0, 20.0, allow_nan=False),  # deadline
        st.floats(0.0, 5.0, allow_nan=False),  # first-output estimate
        st.floats(0.0, 2000.0, allow_nan=False),  # work
        st.booleans(),  # removed again before the listing
    ),
    max_size=60,
)


@settings(max_examples=200, deadline=None)
@given(_queue, st.floats(0.0, 20.0, allow_nan=False), st.integers(0, 70), st.booleans())
def test_a_limited_listing_is_the_head_of_the_full_one(reqs, now, limit, places) -> None:
    """`order(..., limit=k)` reads only what it lists, and lists what the full order would;
    without places the full order is the sequence `pop` hands out."""
    q: SlackQueue[int] = SlackQueue()
    for i, (d, first, work, gone) in enumerate(reqs):
        q.push(i, _stamp(i, d), first, work)
        if gone:
            q.remove(i)
    free_at, per = ([now, now + 1.0, now + 3.0], 0.002) if places else (None, 0.0)
    full = q.order(now, free_at, per)
    assert sorted(i for i, _ in full) == [i for i, r in enumerate(reqs) if not r[3]]
    assert q.order(now, free_at, per, limit=limit) == full[:limit]
    if not places:
        assert [q.pop(now) for _ in full] == full


def test_a_listing_over_many_late_requests_loses_none() -> None:
    """Late requests sitting below the meetable heap's top are moved off it by a listing that
    walks over them; every request is still listed and handed out exactly once."""
    q: SlackQueue[int] = SlackQueue()
    for i in range(200):  # deadlines 0..19.9; at 10, half are late, mixed through the heap
        q.push(i, _stamp(i, (i * 37 % 200) / 10.0), 0.0, work=5.0)
    listed = q.order(10.0, [10.0, 11.0], 0.01)
    assert sorted(i for i, _ in listed) == list(range(200))
    assert sum(late for _, late in listed) == sum((i * 37 % 200) / 10.0 < 10.0 for i in range(200))
    popped = [q.pop(10.0) for _ in range(200)]
    assert sorted(i for i, _ in popped) == list(range(200)) and q.pop(10.0) is None
