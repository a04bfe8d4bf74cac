"""The control step's fast paths decide as the plain algorithms do.

* `place_order` against Moore–Hodgson walked one deferral at a time, with the places' state
  kept before every position (ties, zero lengths, requests no place can start in time);
* `SlackQueue.order` against a listing rebuilt from scratch from the live requests (the late
  entries a listing moves, the leading deferred ones kept in order);
* `TemporalScheduler.plan` and the view's members with the index's memo against a twin that
  rebuilds every view (the memo is cleared on every change to the index);
* `StepView` / `StepDecision` fields in the order `plan` and `step` pass them.
"""

from __future__ import annotations

import heapq
import random
from dataclasses import fields
from itertools import islice

import pytest

from horizonserve.runtime.config import PRESETS, ControlParams, LateRule, ViewOrder
from horizonserve.runtime.downstream import PLACE_HORIZON, SlackQueue, Stamp, place_order
from horizonserve.runtime.policy import StepDecision
from horizonserve.runtime.profiler import RequestProfiler
from horizonserve.runtime.temporal import StepView, TemporalScheduler
from tests.runtime.builders import make_slo


def _moore_hodgson(
    now: float, free_at: list[float], requests: list[tuple[float, float]]
) -> list[int]:
    """The rule as stated: walk the kept ones in deadline order on the earliest free place;
    where one would start after its `late_at`, defer the longest walked so far (the first of
    equals) and walk again from where it stood."""
    if not free_at or not requests:
        return []
    first = [max(t, now) for t in free_at]
    heapq.heapify(first)
    kept = list(range(len(requests)))
    before = [first]
    pos = 0
    while pos < len(kept):
        late_at, occupancy = requests[kept[pos]]
        places = before[pos]
        if places[0] > late_at:
            longest = max(range(pos + 1), key=lambda q: requests[kept[q]][1])
            del kept[longest]
            del before[longest + 1 :]
            pos = longest
            continue
        places = places.copy()
        heapq.heapreplace(places, places[0] + occupancy)
        del before[pos + 1 :]
        before.append(places)
        pos += 1
    return kept


def _value(rng: random.Random, lo: float, hi: float, grid: bool) -> float:
    return float(rng.randint(int(lo), int(hi))) if grid else rng.uniform(lo, hi)


def test_place_order_is_moore_hodgson() -> None:
    rng = random.Random(7)
    for _ in range(20_000):
        grid = rng.random() < 0.5  # whole numbers: ties in lengths and in start times
        now = rng.choice([0.0, 1.0, rng.uniform(0.0, 3.0)])
        free_at = [_value(rng, 0, 5, grid) for _ in range(rng.randint(0, 5))]
        requests = [
            (_value(rng, 0, 6, grid), rng.choice([0.0, _value(rng, 0, 4, grid)]))
            for _ in range(rng.randint(0, 12))
        ]
        requests.sort(key=lambda r: r[0] + rng.uniform(-1.0, 1.0))  # deadline ≠ late_at order
        expected = _moore_hodgson(now, free_at, requests)
        assert place_order(now, free_at, requests) == expected, (now, free_at, requests)


def _listing(
    live: dict[int, tuple[Stamp, float, float]],
    seqs: dict[int, int],
    now: float,
    free_at: list[float] | None,
    s_per_work: float,
    limit: int | None,
) -> list[tuple[int, bool]]:
    """`SlackQueue.order` from scratch: meetable by (deadline, push order), the first
    PLACE_HORIZON of them ordered by `place_order`, then the late ones by (deadline, push)."""
    by_deadline = sorted(live, key=lambda i: (live[i][0].deadline, seqs[i]))
    meet = [i for i in by_deadline if now <= live[i][0].deadline - live[i][1]]
    late = [i for i in by_deadline if now > live[i][0].deadline - live[i][1]]
    if free_at is not None and s_per_work > 0.0 and any(live[i][2] > 0.0 for i in meet):
        head = meet[:PLACE_HORIZON]
        requests = [(live[i][0].deadline - live[i][1], live[i][2] * s_per_work) for i in head]
        kept = _moore_hodgson(now, free_at, requests)
        rest = [head[q] for q in range(len(head)) if q not in kept]
        meet = [head[q] for q in kept] + meet[PLACE_HORIZON:] + rest
    out = [(i, False) for i in meet] + [(i, True) for i in late]
    return out if limit is None else out[:limit]


@pytest.mark.parametrize("seed", range(8))
def test_slack_queue_lists_as_rebuilt_from_scratch(seed: int) -> None:
    """Odd seeds: a short queue, places often free. Even seeds: a queue past PLACE_HORIZON
    meetable requests on places busy for seconds (many can start on none of them)."""
    rng = random.Random(seed)
    busy = seed % 2 == 0
    q: SlackQueue[int] = SlackQueue()
    live: dict[int, tuple[Stamp, float, float]] = {}
    seqs: dict[int, int] = {}
    now = 0.0
    free_at = [rng.uniform(0.0, 5.0) for _ in range(rng.randint(1, 6))]
    push = 0.75 if busy else 0.45
    for n in range(800):
        op = rng.random()
        if op < push:
            deadline = now + _value(rng, 0, 12 if busy else 20, rng.random() < 0.5)
            stamp = Stamp(f"r{n}", "c", 1, 0.0, deadline, 0.0)
            first_s = rng.uniform(0.0, 4.0)
            work = rng.choice([0.0, rng.uniform(0.0, 100.0), rng.uniform(0.0, 1.0)])
            q.push(n, stamp, first_s, work)
            live[n], seqs[n] = (stamp, first_s, work), n
        elif op < push + 0.15:
            limit = rng.choice([None, 1, 2, 5])
            places = rng.choice([None, free_at])
            s_per_work = rng.choice([0.0, 0.05])
            got = q.order(now, places, s_per_work, limit)
            assert got == _listing(live, seqs, now, places, s_per_work, limit)
            if got and rng.random() < 0.7:
                item, late = got[0]
                q.take(item, late)
                del live[item]
        elif op < push + 0.2:
            popped = q.pop(now)
            if popped is not None:
                assert popped == _listing(live, seqs, now, None, 0.0, 1)[0]
                del live[popped[0]]
        else:
            now += rng.uniform(0.0, 2.0)
            spread = (1.0, 6.0) if busy else (0.0, 1.0)
            free_at = [max(t, now) + rng.uniform(*spread) for t in free_at]
        assert len(q) == len(live)


def _controls() -> list[ControlParams]:
    horizon = PRESETS["horizon"].apply(ControlParams())
    return [
        horizon,
        horizon.model_copy(update={"late": LateRule.YIELD}),
        horizon.model_copy(update={"late": LateRule.COMPETE}),
        horizon.model_copy(update={"view_order": ViewOrder.ARRIVAL}),
        horizon.model_copy(update={"view_order": ViewOrder.ARRIVAL, "late": LateRule.COMPETE}),
        horizon.model_copy(update={"long_path_cap": 5}),
    ]


def _view_key(view: StepView) -> tuple[object, ...]:
    return tuple(getattr(view, f.name) for f in fields(StepView) if f.name != "index")


@pytest.mark.parametrize("control", _controls(), ids=lambda c: f"{c.view_order}-{c.late}")
def test_views_kept_per_index_state_equal_views_built_each_step(control: ControlParams) -> None:
    """Two indexes fed the same requests: one keeps its views while the index stands, the
    other forgets them before every step. Every view and every member list agree."""
    rng = random.Random(3)
    classes = ("text", "audio-out", "image-out")
    twins = []
    for _ in range(2):
        twins.append((TemporalScheduler(control), RequestProfiler(make_slo(), 1.5), []))
    kept, fresh = twins
    now = 0.0
    for n in range(1500):
        op = rng.random()
        if op < 0.35:
            cls = rng.choice(classes)
            arrival = now - rng.uniform(0.0, 3.0)
            prefilled = rng.random() < 0.1
            for sched, profiler, queue in twins:
                sig = profiler.annotate(f"r{n}", arrival, class_name=cls)
                if prefilled:
                    sig.record_progress(prefilled=True, decoded=1)
                queue.append(sig)
                sched.add(sig, now)
        elif op < 0.5 and kept[2]:
            pick = rng.randrange(len(kept[2]))
            for sched, _, queue in twins:
                sched.remove(queue.pop(pick))
        else:
            now += rng.choice([0.0, 0.0, rng.uniform(0.0, 0.5)])
            views: list[tuple[StepView, list[str]]] = []
            for sched, _, queue in twins:
                if sched is fresh[0]:
                    sched._memo.clear()  # rebuilt from the index alone
                view = sched.plan(now)
                if sched is fresh[0]:
                    sched._memo.clear()
                lookup = {sig: sig for sig in queue}.__getitem__
                members = list(islice(view.iter_visible(queue, lambda s: s, lookup), 16))
                views.append((view, [sig.request_id for sig in members]))
            (a, members_a), (b, members_b) = views
            assert _view_key(a) == _view_key(b)
            assert members_a == members_b
            listed_a, listed_b = a.members(), b.members()
            assert (listed_a is None) == (listed_b is None)
            if listed_a is not None and listed_b is not None:
                assert [s.request_id for s in listed_a] == [s.request_id for s in listed_b]


def test_plan_and_step_pass_the_fields_in_their_order() -> None:
    """`plan` and `step` build their dataclasses positionally, in this order."""
    assert [f.name for f in fields(StepView)] == [
        "step",
        "phase",
        "n",
        "long_limit",
        "long_visible",
        "visible",
        "edf",
        "by_priority",
        "index",
        "late_limit",
        "late_long_visible",
        "late",
        "long_hidden",
        "short_on_time",
    ]
    assert [f.name for f in fields(StepDecision)] == [
        "view",
        "sm",
        "pressure",
        "shared_slack",
        "downstream_slack",
        "now",
        "backlog",
        "policy",
    ]
