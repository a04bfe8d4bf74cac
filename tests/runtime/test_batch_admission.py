"""Batch admission for the image generator (`runtime.batch_admission`): the measured step
estimate, the never-turns-late rule for growing a batch, shedding only for a meetable job, and
the reference image stage driving it on CPU (tiny DiT, a controlled clock)."""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from horizonserve.runtime.batch_admission import StepTimes, Work, choose_batch, finish_times


def test_step_times_prefer_measurements_and_assume_no_batching_gain() -> None:
    t = StepTimes(0.05)
    assert t.at(1) == 0.05 and t.at(3) == pytest.approx(0.15)  # prior × b
    t.observe(2, 0.2)
    assert t.at(2) == 0.2
    assert t.at(4) == pytest.approx(0.4)  # nearest smaller measured size, scaled b / k
    assert t.at(1) == 0.2  # a smaller batch is at most as slow as the nearest larger one
    t.observe(2, 0.4)
    assert t.at(2) == pytest.approx(0.25)  # EWMA
    t.observe(0, 9.0)
    t.observe(3, -1.0)
    assert t.at(3) == pytest.approx(0.375)  # nothing learned from an empty step or a glitch
    with pytest.raises(ValueError, match="prior_s"):
        StepTimes(0.0)


def test_fastest_solo_is_the_refusal_bound() -> None:
    """A job is refused as late only if it cannot finish even at the fastest single-job step
    measured: the EWMA follows a squeeze the split will undo."""
    t = StepTimes(0.05)
    assert t.fastest_solo() == 0.05  # nothing measured: the prior
    t.observe(1, 0.04)
    t.observe(1, 0.20)  # a squeezed step: the EWMA rises, the bound does not
    assert t.at(1) == pytest.approx(0.08) and t.fastest_solo() == 0.04
    u = StepTimes(0.05)
    u.observe(2, 0.03)  # no single-job step yet: at(1), which a larger batch bounds
    assert u.fastest_solo() == 0.03


def _linear(step_s: float = 1.0) -> StepTimes:
    t = StepTimes(step_s)
    for b in range(1, 9):
        t.observe(b, step_s * b)  # no batching gain: b jobs cost b solo steps
    return t


def test_finish_times_follow_the_shrinking_batch() -> None:
    t = _linear()
    # 2 and 5 steps left: both run 2 steps at batch 2 (4 s), then the second 3 alone (3 s)
    assert finish_times([Work(0, 5), Work(0, 2)], 10.0, t) == [17.0, 14.0]
    assert finish_times([], 10.0, t) == []


def test_a_job_that_can_make_it_is_not_held_back_by_one_that_cannot() -> None:
    t = _linear()
    doomed = Work(deadline=3.0, steps_left=4)  # 4 s alone: late whatever happens
    tight = Work(deadline=4.5, steps_left=4)  # on time alone, late beside anything
    loose = Work(deadline=100.0, steps_left=4)
    assert choose_batch([doomed, tight, loose], 0.0, t, max_batch=3) == [1]
    # once the tight job is done, the late one runs beside the loose one (nothing lost)
    assert choose_batch([doomed, loose], 0.0, t, max_batch=3) == [1, 0]
    assert choose_batch([doomed], 0.0, t, max_batch=3) == [0]  # never idle with work
    assert choose_batch([], 0.0, t, max_batch=3) == []


def test_the_batch_grows_while_every_chosen_job_stays_on_time() -> None:
    t = StepTimes(1.0)
    for b, s in {1: 1.0, 2: 1.1, 3: 1.2, 4: 1.3}.items():
        t.observe(b, s)  # strong batching gain
    jobs = [Work(50.0, 4) for _ in range(6)]
    assert choose_batch(jobs, 0.0, t, max_batch=4) == [0, 1, 2, 3]


@settings(max_examples=300, deadline=None)
@given(
    steps=st.lists(st.integers(1, 30), min_size=0, max_size=8),
    slack=st.lists(st.floats(-5.0, 40.0), min_size=8, max_size=8),
    increments=st.lists(st.floats(0.0, 0.2), min_size=8, max_size=8),
    max_batch=st.integers(1, 5),
)
def test_choice_invariants(
    steps: list[int], slack: list[float], increments: list[float], max_batch: int
) -> None:
    t = StepTimes(0.05)
    step = 0.01
    for b, inc in enumerate(increments, start=1):
        step += inc  # a larger batch is never faster
        t.observe(b, step)
    now = 100.0
    jobs = [Work(now + sl, n) for n, sl in zip(steps, slack, strict=False)]
    got = choose_batch(jobs, now, t, max_batch)
    assert len(got) == len(set(got)) <= max_batch
    assert bool(got) == bool(jobs)  # never idle with work
    batch = [jobs[i] for i in got]
    fin = finish_times(batch, now, t)
    on_time = [f <= w.deadline for f, w in zip(fin, batch, strict=True)]
    if any(finish_times([j], now, t)[0] <= j.deadline for j in jobs):
        assert any(on_time)  # a job that can make it alone means one that makes it
    if len(got) < max_batch:
        for i, j in enumerate(jobs):  # nothing left out that would fit beside the on-time ones
            if i in got:
                continue
            fin_with = finish_times([*batch, j], now, t)
            assert any(ok and fin_with[k] > batch[k].deadline for k, ok in enumerate(on_time))


# -- the reference image stage on CPU ---------------------------------------------------------

torch = pytest.importorskip("torch")

from horizonserve.runtime.downstream import Stamp  # noqa: E402
from horizonserve.runtime.engine.reference.models import DiT, materialize  # noqa: E402
from horizonserve.runtime.engine.reference.presets import get_preset  # noqa: E402
from horizonserve.runtime.engine.reference.protocol import (  # noqa: E402
    FIRST,
    Handoff,
    WireTensor,
)
from horizonserve.runtime.engine.reference.stages.admission import DownstreamRules  # noqa: E402
from horizonserve.runtime.engine.reference.stages.image import ImageStage  # noqa: E402

STEPS = 4
PRESET = replace(get_preset("tiny"), dit_max_batch=3)


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


class TimedDiT(torch.nn.Module):
    """The tiny DiT, with a controlled clock that a step of b images advances by b seconds
    (a GPU without batching gain)."""

    def __init__(self, dit: DiT, clock: Clock) -> None:
        super().__init__()
        self.dit, self.clock = dit, clock
        self.cond_in = dit.cond_in

    def forward(self, x: torch.Tensor, t: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
        self.clock.t += float(x.shape[0])
        return self.dit(x, t, c)


def _first_outputs(slack: bool, deadlines: dict[str, float]) -> dict[str, float]:
    """Submit one image per deadline at t = 0, run the stage to idle; when each image came."""
    torch.manual_seed(0)
    clock, events = Clock(), []
    dit = materialize(
        lambda: DiT(PRESET.dit, PRESET.thinker.hidden), torch.device("cpu"), torch.float32
    )
    stage = ImageStage(
        TimedDiT(dit, clock),
        torch.nn.Identity(),
        PRESET,
        emit=events.append,
        clock=clock,
        rules=DownstreamRules(slack=slack),
    )
    cond = WireTensor.of(torch.zeros(2, PRESET.thinker.hidden))
    for rid, deadline in deadlines.items():
        stamp = Stamp(rid, "text-to-image", 0, 0.0, deadline, STEPS * 1.0)  # solo step 1 s
        stage.submit(Handoff(rid, 0.0, cond, STEPS, stamp=stamp))
    if stage.times is not None:
        for b in range(1, PRESET.dit_max_batch + 1):
            stage.times.observe(b, float(b))  # what `iterate` measures on this clock
    for _ in range(100):
        if stage.idle:
            break
        stage._iterate()
    assert stage.idle
    return {e.rid: e.t for e in events if e.kind == FIRST}


def test_image_stage_chooses_its_batch_by_deadline_under_downstream_control() -> None:
    deadlines = {"doomed": 3.0, "tight": 4.5, "loose": 100.0}
    got = _first_outputs(True, deadlines)
    assert set(got) == set(deadlines)  # nothing lost: the late image is still made
    assert got["tight"] == 4.0  # ran alone, on time
    assert sum(got[r] <= d for r, d in deadlines.items()) == 2
    fifo = _first_outputs(False, deadlines)  # the baselines batch all three: all late but one
    assert fifo["tight"] > deadlines["tight"]
    assert sum(fifo[r] <= d for r, d in deadlines.items()) == 1
