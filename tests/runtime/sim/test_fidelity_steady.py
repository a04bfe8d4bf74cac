"""Steady state: results state the warm-up they exclude, and `sim plan` scores every rate on a
point of stated length whose requests are shared across rates."""

from __future__ import annotations

import numpy as np
import pytest

from horizonserve.runtime.sim import SimSetup, simulate
from horizonserve.runtime.sim.plan import (
    STEADY,
    SeedPanel,
    SteadyState,
    SteadyTraces,
    attainment_at,
    plan_system,
)
from horizonserve.runtime.workload import load_workload, mix_weights

PIPE = "qwen2_5_omni"


@pytest.fixture(scope="module")
def setup() -> SimSetup:
    return SimSetup.load(PIPE)


def _traces(setup: SimSetup, steady: SteadyState) -> SteadyTraces:
    wl = load_workload(PIPE)
    return SteadyTraces(wl, mix_weights(wl, setup.long_classes), seed=4, steady=steady)


def test_points_of_every_rate_share_their_requests(setup: SimSetup) -> None:
    src = _traces(setup, SteadyState(warmup_s=20.0, window_s=40.0))
    slow, fast = src.scaled(4.0), src.scaled(8.0)
    assert slow.warmup_s == fast.warmup_s == 20.0 and slow.duration_s == fast.duration_s == 60.0
    n = len(slow)
    assert len(fast) > n  # twice the rate, twice the requests in the same 60 s
    assert np.allclose(slow.arrival * 4.0, fast.arrival[:n] * 8.0)  # one unit-time sequence
    assert (slow.cls == fast.cls[:n]).all() and (slow.output_tokens == fast.output_tokens[:n]).all()


def test_plan_states_the_steady_window_it_scored(setup: SimSetup) -> None:
    steady = SteadyState(warmup_s=15.0, window_s=45.0)
    src = _traces(setup, steady)
    res = plan_system(setup, src, "mps", target=0.9, tol=0.1, start=4.0)
    assert (res.warmup_s, res.window_s) == (15.0, 45.0)
    assert res.to_json()["window_s"] == 45.0
    # The attainment it bracketed is over the window only: the same run scored whole differs.
    r = simulate(setup, src.scaled(res.rate_ok), "mps", seed=0)
    assert r.attainment() == pytest.approx(res.attainment_ok)
    assert "45 s scored after a 15-s warm-up" in r.scoring()
    assert r.to_json()["window_s"] == 45.0
    assert "steady state" in STEADY.describe() and STEADY.warmup_s > 0


def test_steady_points_keep_the_arrival_process() -> None:
    """Bursty points stay bursty: the gaps of a point have the gamma shape asked for."""
    wl = load_workload(PIPE)
    mix = mix_weights(wl, SimSetup.load(PIPE).long_classes)
    steady = SteadyState(warmup_s=0.0, window_s=600.0)
    cv = {}
    for b in (1.0, 0.25):
        gaps = np.diff(SteadyTraces(wl, mix, seed=2, steady=steady, burstiness=b).scaled(5).arrival)
        cv[b] = gaps.std() / gaps.mean()
    assert cv[1.0] == pytest.approx(1.0, abs=0.1)  # Poisson
    assert cv[0.25] == pytest.approx(2.0, abs=0.3)  # shape 0.25: CV 1/sqrt(0.25)


def test_a_seed_panel_scores_a_rate_by_the_mean_of_its_points(setup: SimSetup) -> None:
    wl = load_workload(PIPE)
    mix = mix_weights(wl, setup.long_classes)
    steady = SteadyState(warmup_s=0.0, window_s=30.0)
    srcs = tuple(SteadyTraces(wl, mix, seed=k, steady=steady) for k in (3, 4, 5))
    each = [
        attainment_at(setup, s, "edf-mps", 9.0, k) for s, k in zip(srcs, (3, 4, 5), strict=True)
    ]
    assert len(set(each)) > 1  # short points differ by seed: the reason for a panel
    panel = SeedPanel(srcs, (3, 4, 5))
    assert attainment_at(setup, panel, "edf-mps", 9.0, 0) == pytest.approx(np.mean(each))
    res = plan_system(setup, panel, "edf-mps", target=0.9, tol=0.2, start=4.0)
    assert (res.warmup_s, res.window_s) == (0.0, 30.0)
    with pytest.raises(ValueError, match="one seed per source"):
        SeedPanel(srcs, (3, 4))
