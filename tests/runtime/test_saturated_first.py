"""A saturated downstream stage goes first in the slack split (runtime.downstream.reported_slack,
ControlParams.downstream_urgency): the pure rule, who applies it, and what the split
does with it; the simulator's talker under it (SIMULATED)."""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest

from horizonserve.runtime.artifact import load_artifact
from horizonserve.runtime.config import ControlParams, SmLadder
from horizonserve.runtime.downstream import SATURATED, reported_slack
from horizonserve.runtime.policy import make_policy
from horizonserve.runtime.sim.engine import simulate
from horizonserve.runtime.sim.setup import SimSetup
from horizonserve.runtime.spatial import RESERVED, SpatialController
from horizonserve.runtime.workload import generate, load_workload, mix_weights
from tests.runtime.builders import make_config


@pytest.mark.parametrize(
    ("slack", "full", "queued", "on", "want"),
    [
        (4.0, True, 2.0, True, SATURATED),  # full, an on-time request waits
        (4.0, True, 1.0, True, SATURATED),  # it can just start in time (now = late_at)
        (4.0, True, 0.5, True, 4.0),  # only late ones wait: they have missed already
        (4.0, True, None, True, 4.0),  # nobody waits
        (4.0, False, 2.0, True, 4.0),  # a place is free
        (4.0, True, 2.0, False, 4.0),  # the knob off
        (None, True, None, True, None),  # nothing pending (an engine's None) stays None
    ],
)
def test_reported_slack(slack, full, queued, on, want) -> None:  # type: ignore[no-untyped-def]
    assert reported_slack(slack, full, queued, on) == want
    nan = reported_slack(math.nan, full, None, on)  # the reference engine's "none": NaN
    assert nan != nan


def test_only_horizon_with_downstream_control_and_the_split_reports_saturation() -> None:
    assert make_policy("horizon", make_config()).saturated_first  # on by default
    for policy in (
        "fcfs",
        "edf",
        "priority",
        "horizon-no-downstream",
        "horizon-no-throttling",
    ):  # fmt: skip  (MPS is a sharing mode of these)
        assert not make_policy(policy, make_config()).saturated_first, policy
    off = make_config(downstream_urgency="slack")
    assert not make_policy("horizon", off).saturated_first


def test_the_split_gives_a_saturated_downstream_the_reservation_unless_a_prompt_waits() -> None:
    ladder = SmLadder(levels=[32, 48, 64, 80], aggressive=132, total=132)
    spatial = SpatialController(ladder, ControlParams())
    # the shared side's most urgent request has little slack, yet the saturated side goes first
    got = spatial.select(True, shared_slack=1.2, downstream_slack=SATURATED)
    assert got.level == RESERVED and got.shared == ladder.s_reserve
    # a waiting short-path or protected prompt (the shared side's −inf) keeps the shared SMs
    assert spatial.select(True, shared_slack=-math.inf, downstream_slack=SATURATED).level >= 0
    # the shared stage backlogged: the policy passes no downstream slack (shared_hold_s)
    policy = make_policy("horizon", make_config())
    held = policy.step(0.0, downstream_active=True, backlog=True, downstream_slack=SATURATED)
    assert held.downstream_slack is None and held.sm.level != RESERVED


def test_simulated_talker_saturated_first_starts_more_speech_in_time_and_loses_nothing() -> None:
    """SIMULATED (shipped H200 artifact, its talker fitted to the GPU's stream pace),
    Qwen2.5-Omni at 10 req/s, three request draws: the talker's places are full; under the
    rule it steps on the reservation's SMs instead of beside an uncapped thinker, frees places
    sooner and starts more speech requests in time, while the text path holds. Every request
    is still answered or counted. (The gain is small, as on the GPU: +0.2 pp measured at this
    rate; one draw alone can show less than its spread.)"""
    pipe = "qwen2_5_omni"
    wl = load_workload(pipe)
    met: dict[bool, list[tuple[float, float, int]]] = {False: [], True: []}
    for seed in (0, 1, 2):
        for on in (False, True):
            setup = SimSetup.load(pipe, load_artifact(None))
            setup = replace(
                setup,
                control=ControlParams.model_validate(
                    {
                        **setup.control.model_dump(),
                        "downstream_urgency": "saturated" if on else "slack",
                    }
                ),
            )
            mix = mix_weights(wl, setup.long_classes, None)
            trace = generate(wl, mix, rate=10.0, duration_s=60.0, seed=seed)
            r = simulate(setup, trace, "horizon", seed=0)
            assert len(r.latency) == len(trace)
            short = r.short_mask()
            ok = r.met()
            met[on].append((ok[short].mean(), ok[~short].mean(), int(np.isnan(r.latency).sum())))
    text, speech, never = ({on: [m[i] for m in met[on]] for on in met} for i in range(3))
    assert np.mean(speech[True]) > np.mean(speech[False]) + 0.01  # speech
    assert all(s1 >= s0 for s0, s1 in zip(speech[False], speech[True], strict=True))
    assert np.mean(text[True]) >= np.mean(text[False]) - 0.005  # text holds
    assert sum(never[True]) <= sum(never[False])  # no more left unanswered
