"""Spatial control: Eq. (1), bounds, hysteresis, EWMA and the unknown-pressure fallback."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from horizonserve.runtime.config import ControlParams, SmLadder
from horizonserve.runtime.spatial import (
    AGGRESSIVE,
    LIFTED,
    PressureEwma,
    SpatialController,
    UncappedSpatial,
    snap,
)

LADDER = SmLadder(levels=[32, 48, 64, 80], aggressive=120, total=132)

signals = st.lists(
    st.tuples(st.booleans(), st.one_of(st.none(), st.floats(min_value=0.0, max_value=1.0))),
    min_size=1,
    max_size=200,
)


@settings(max_examples=200, deadline=None)
@given(trace=signals, hyst=st.integers(min_value=0, max_value=2))
def test_cap_bounds_and_hysteresis(trace: list, hyst: int) -> None:
    control = ControlParams(hysteresis_steps=hyst)
    ctl = SpatialController(LADDER, control)
    prev = None
    for active, sample in trace:
        ctl.observe(sample)
        d = ctl.select(active)
        assert d.downstream == LADDER.total - d.shared
        if not active:
            assert d.shared == LADDER.aggressive
            assert d.level == AGGRESSIVE
        else:
            assert LADDER.s_min <= d.shared <= LADDER.s_cap
            assert d.shared in LADDER.levels
            raw = LADDER.s_min + ctl.rho() * (LADDER.s_cap - LADDER.s_min)
            target = snap(LADDER.levels, raw)
            if prev is None or prev.level < 0:
                assert d.level == target  # entering co-running goes straight to the target
            elif d.level != prev.level:
                # Moved only to the snapped target, and only when it is h or more steps away.
                assert d.level == target and abs(target - prev.level) >= hyst
            else:
                assert abs(target - prev.level) < max(hyst, 1) or target == prev.level
        assert d.changed == (prev is None or prev.level != d.level)
        # An urgent prefill may take S_aggr only while the cap applies; otherwise the cap.
        assert d.prefill == (LADDER.aggressive if active else d.shared)
        prev = d


def test_equation_one_examples() -> None:
    ctl = SpatialController(LADDER, ControlParams(b_sat=0.9, hysteresis_steps=1))
    ctl.observe(0.0)
    assert ctl.select(True).shared == 32  # no pressure: most headroom to downstream
    for _ in range(30):
        ctl.observe(0.95)  # saturated: ρ clamps at 1
    assert ctl.rho() == 1.0
    d = ctl.select(True)
    assert (d.shared, d.downstream) == (80, 52)
    assert ctl.select(False).shared == 120  # downstream idle: aggressive


def test_hysteresis_in_ladder_steps() -> None:
    ctl = SpatialController(LADDER, ControlParams(b_sat=1.0, ewma_gamma=1.0, hysteresis_steps=2))
    ctl.observe(0.5)  # raw = 32 + 0.5 * 48 = 56: equidistant from 48 and 64, ties go down
    assert ctl.select(True).shared == 48
    ctl.observe(0.7)  # raw 65.6 -> 64: one step away, below h = 2: stays
    assert ctl.select(True).shared == 48
    ctl.observe(1.0)  # raw 80 -> 80: two steps away: moves
    assert ctl.select(True).shared == 80
    ctl.observe(0.45)  # raw 53.6 -> 48: two steps down: moves
    assert ctl.select(True).shared == 48


def test_default_hysteresis_follows_the_snapped_target() -> None:
    ctl = SpatialController(LADDER, ControlParams(b_sat=1.0, ewma_gamma=1.0))
    caps = []
    for b in (0.7, 0.9, 0.7, 0.2):  # raw 65.6, 75.2, 65.6, 41.6
        ctl.observe(b)
        caps.append(ctl.select(True).shared)
    assert caps == [64, 80, 64, 48]


def test_unknown_pressure_falls_back_to_s_cap() -> None:
    ctl = SpatialController(LADDER, ControlParams())
    ctl.observe(0.1)
    ctl.observe(None)
    assert ctl.ewma.value is None
    assert ctl.select(True).shared == LADDER.s_cap
    ctl.observe(float("nan"))
    assert ctl.ewma.value is None


def test_ewma_weights_newest_sample_by_gamma() -> None:
    e = PressureEwma(0.4)
    assert e.update(0.5) == 0.5
    assert e.update(1.0) == pytest.approx(0.5 + 0.4 * 0.5)


def test_uncapped_gives_whole_gpu() -> None:
    d = UncappedSpatial(LADDER, ControlParams()).select(True)
    assert (d.shared, d.downstream) == (132, 132)


def test_snap_picks_nearest_level() -> None:
    assert [snap([32, 48, 64], x) for x in (0, 39, 40, 41, 63, 100)] == [0, 0, 0, 1, 2, 2]


def test_backlog_lifts_the_cap_to_s_aggr_only_while_co_running() -> None:
    ctl = SpatialController(LADDER, ControlParams())
    ctl.observe(0.3)
    capped = ctl.select(True)
    assert capped.shared <= LADDER.s_cap
    lifted = ctl.select(True, backlog=True)
    assert (lifted.shared, lifted.level, lifted.changed) == (LADDER.aggressive, LIFTED, True)
    assert lifted.downstream == LADDER.total - LADDER.aggressive
    assert lifted.prefill == lifted.shared
    assert ctl.select(True) == capped  # backlog cleared: straight back to Eq. (1)'s level
    assert ctl.select(False, backlog=True).level == AGGRESSIVE
    off = SpatialController(LADDER, ControlParams(boost="prefill"))
    off.observe(0.3)
    assert off.select(True, backlog=True).shared == capped.shared
