"""Downstream control in the simulator: late requests counted or refused, nothing lost
(SIMULATED, fitted H200 default)."""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from horizonserve.runtime.artifact import load_artifact
from horizonserve.runtime.config import ControlParams
from horizonserve.runtime.sim.engine import simulate
from horizonserve.runtime.sim.setup import SimSetup
from horizonserve.runtime.workload import generate, load_workload, mix_weights

PIPE = "qwen2_5_omni"


def _run(system: str, **knobs: object):  # type: ignore[no-untyped-def]
    setup = SimSetup.load(PIPE, load_artifact(None))
    setup = replace(
        setup, control=ControlParams.model_validate({**setup.control.model_dump(), **knobs})
    )
    wl = load_workload(PIPE)
    trace = generate(wl, mix_weights(wl, setup.long_classes, None), rate=12.0, duration_s=60.0)
    return trace, simulate(setup, trace, system, seed=0)


def test_late_requests_are_served_and_counted_unless_refused() -> None:
    trace, served = _run("horizon")
    assert served.stats["downstream_late"] > 0 and served.stats["downstream_rejected"] == 0
    _, refused = _run("horizon", reject_late=True)
    rejected = refused.stats["downstream_rejected"]
    # Refused at the hand-off (the first downstream stage); later stages still count late.
    assert rejected > 0 and refused.stats["downstream_late"] < served.stats["downstream_late"]
    # Refused ones never answer (each one is a counted miss, not a silent drop).
    assert int(np.isnan(refused.latency).sum()) >= rejected
    assert len(refused.latency) == len(trace)
    # A baseline never refuses: the knob belongs to downstream control.
    _, fcfs = _run("mps", reject_late=True)
    assert fcfs.stats["downstream_rejected"] == 0


def test_playback_underruns_appear_exactly_when_the_talker_falls_below_real_time() -> None:
    """The fluid talker makes audio at its step rate; the listener plays in real time. On the
    shipped model one talker step makes a code in ~3-6 ms against 20 ms of audio: no
    underrun. Twenty times slower steps (1 code per ~60-120 ms) fall below real time."""
    art = load_artifact(None)
    pc = art.pipeline(PIPE)
    talker = pc.downstream[0]
    slow_curve = talker.step_s.model_copy(update={"values": [v * 20 for v in talker.step_s.values]})
    slow = talker.model_copy(update={"step_s": slow_curve})
    slow_art = art.model_copy(
        update={"pipelines": {**art.pipelines, PIPE: pc.model_copy(
            update={"downstream": [slow, *pc.downstream[1:]]})}}
    )  # fmt: skip
    wl = load_workload(PIPE)
    for artifact, expect in ((art, False), (slow_art, True)):
        setup = SimSetup.load(PIPE, artifact)
        trace = generate(wl, mix_weights(wl, setup.long_classes, None), rate=2.0, duration_s=40.0)
        r = simulate(setup, trace, "horizon", seed=0)
        assert (r.stats["underruns"] > 0) is expect, r.stats["underruns"]


def test_place_admission_serves_more_speech_in_time_and_loses_nothing() -> None:
    """Overloaded talker (12 req/s): the place-aware order defers the longest answers that
    would make shorter ones miss. Every request is still accounted for (answered or counted as
    a miss), and more speech requests start in time on this trace."""
    trace, edf = _run("horizon", downstream="deadline")
    _, places = _run("horizon")  # on by default
    long_path = ~edf.short_mask()
    assert len(places.latency) == len(trace)
    assert int(np.isnan(places.latency).sum()) <= int(np.isnan(edf.latency).sum()) + 5
    assert places.met()[long_path].sum() > edf.met()[long_path].sum()
    _, fcfs = _run("mps")  # a baseline keeps arrival order
    _, fcfs_off = _run("mps", downstream="deadline")
    assert np.array_equal(fcfs.met(), fcfs_off.met())
