"""The wait-for-a-place slack (runtime.downstream.start_slack, ControlParams.place_wait_slack):
the pure rule, the queues that apply it, who enables it, and the simulator under it
(SIMULATED)."""

from __future__ import annotations

import math
import random
from dataclasses import replace

import pytest

from horizonserve.runtime.calibrate.artifact import load_artifact
from horizonserve.runtime.config import control_as_recorded
from horizonserve.runtime.downstream import (
    FifoQueue,
    SlackQueue,
    Stamp,
    start_slack,
    with_place_wait,
)
from horizonserve.runtime.policy import make_policy
from horizonserve.runtime.sim.engine import simulate
from horizonserve.runtime.sim.setup import SimSetup
from horizonserve.runtime.workload import generate, load_workload, mix_weights
from tests.runtime.builders import make_config


def _starts(now: float, free_at: list[float], reqs: list[tuple[float, float, float]]) -> list:
    """Each request's start, walking them in order, each on the earliest free place."""
    places = sorted(max(t, now) for t in free_at)
    out = []
    for _, _, occupancy in reqs:
        start = places.pop(0)
        out.append(start)
        places = sorted([*places, start + occupancy])
    return out


def test_start_slack_edge_cases() -> None:
    assert start_slack(0.0, [1.0], []) is None  # nobody waits
    assert start_slack(0.0, [], [(5.0, 1.0, 1.0)]) == -math.inf  # no place ever frees
    # a free place: the request's own slack, r̂ = its first-output time
    assert start_slack(10.0, [3.0], [(20.0, 2.0, 4.0)]) == pytest.approx(10.0 / 2.0)
    # one place freeing at 16 s: r̂ = 6 s wait + 2 s
    assert start_slack(10.0, [16.0], [(20.0, 2.0, 4.0)]) == pytest.approx(10.0 / 8.0)
    # the second request waits for the first one's occupancy too (10 + 4 + 4 = 18 > late_at 17)
    got = start_slack(10.0, [10.0], [(30.0, 2.0, 8.0), (19.0, 2.0, 1.0)])
    assert got == pytest.approx(9.0 / 10.0)


def test_start_slack_is_below_one_exactly_when_a_request_starts_after_its_late_at() -> None:
    rng = random.Random(7)
    for _ in range(500):
        now = rng.uniform(0, 10)
        free_at = [now + rng.uniform(-2, 8) for _ in range(rng.randint(1, 4))]
        reqs = sorted(
            (now + rng.uniform(1, 20), rng.uniform(0.5, 3), rng.uniform(0, 6))
            for _ in range(rng.randint(1, 6))
        )
        u = start_slack(now, free_at, reqs)
        starts = _starts(now, free_at, reqs)
        late = any(s > d - f + 1e-12 for s, (d, f, _) in zip(starts, reqs, strict=True))
        assert (u is not None and u < 1.0) == late, (now, free_at, reqs, u)


def test_with_place_wait_takes_the_smaller_and_keeps_the_engines_none() -> None:
    assert with_place_wait(3.0, None) == 3.0
    assert with_place_wait(3.0, 0.5) == 0.5
    assert with_place_wait(0.2, 0.5) == 0.2
    assert with_place_wait(None, 0.5) == 0.5  # the simulator's "none pending"
    assert with_place_wait(math.nan, 0.5) == 0.5  # the reference engine's
    nan = with_place_wait(math.nan, None)
    assert nan != nan


def _stamp(rid: str, deadline: float, first_s: float) -> Stamp:
    return Stamp(rid, "speech", 0, 0.0, deadline, first_s)


@pytest.mark.parametrize("queue_cls", [SlackQueue, FifoQueue])
def test_queues_project_their_meetable_requests_in_deadline_order(queue_cls) -> None:  # type: ignore[no-untyped-def]
    q = queue_cls()
    # pushed out of deadline order; "late" can no longer start in time at now = 10
    for rid, deadline, first_s, work in (
        ("b", 40.0, 2.0, 10.0),
        ("a", 25.0, 2.0, 10.0),
        ("late", 11.0, 2.0, 10.0),
    ):
        q.push(rid, _stamp(rid, deadline, first_s), first_s, work)
    # one place freeing at 12 s, 0.5 s per unit of work: "a" starts at 12, "b" at 17
    want = start_slack(10.0, [12.0], [(25.0, 2.0, 5.0), (40.0, 2.0, 5.0)])
    assert q.start_slack(10.0, [12.0], 0.5) == pytest.approx(want)
    assert len(q) == 3  # nothing removed


def test_only_horizon_with_the_knob_saturation_and_places_reports_the_wait() -> None:
    assert not make_policy("horizon", make_config()).place_wait  # off by default
    assert make_policy("horizon", make_config(place_wait_slack=True)).place_wait
    for knobs in ({"saturated_downstream_first": False}, {"place_admission": False},
                  {"downstream_admission": False}):  # fmt: skip
        cfg = make_config(place_wait_slack=True, **knobs)
        assert not make_policy("horizon", cfg).place_wait, knobs
    for policy in ("fcfs", "edf", "priority", "horizon-no-downstream"):
        assert not make_policy(policy, make_config(place_wait_slack=True)).place_wait, policy
    assert not control_as_recorded({}).place_wait_slack  # runs before the knob replay without


def test_simulated_place_wait_reserves_less_and_answers_everything() -> None:
    """SIMULATED (shipped H200 artifact), Qwen2.5-Omni at 6 req/s: with the wait for a place
    counted the full talker takes the reservation only while a waiting stream would start
    late, so the thinker is reserved on fewer steps than under SATURATED; every request is
    still answered or counted."""
    pipe = "qwen2_5_omni"
    wl = load_workload(pipe)
    reserved = {}
    for on in (False, True):
        setup = SimSetup.load(pipe, load_artifact(None))
        setup = replace(setup, control=setup.control.model_copy(update={"place_wait_slack": on}))
        mix = mix_weights(wl, setup.long_classes, None)
        trace = generate(wl, mix, rate=6.0, duration_s=60.0, seed=0)
        r = simulate(setup, trace, "horizon", seed=0)
        assert len(r.latency) == len(trace)
        reserved[on] = r.stats["reserved_frac"]
    assert reserved[True] < reserved[False]
