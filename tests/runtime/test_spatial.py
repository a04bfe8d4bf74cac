"""Spatial control: Eq. (1), bounds, hysteresis, EWMA and the unknown-pressure fallback."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from horizonserve.runtime.config import ControlParams, SmLadder
from horizonserve.runtime.spatial import (
    AGGRESSIVE,
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
            if prev is not None and prev.level >= 0 and d.level != prev.level and hyst:
                # Moved only because the raw target reached h levels away from the old one.
                lv = LADDER.levels
                up, down = prev.level + hyst, prev.level - hyst
                assert (up < len(lv) and raw >= lv[up]) or (down >= 0 and raw <= lv[down])
            if prev is None or prev.level < 0 or hyst == 0:
                assert d.level == snap(LADDER.levels, raw)
        assert d.changed == (prev is None or prev.level != d.level)
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


def test_hysteresis_dead_band() -> None:
    ctl = SpatialController(LADDER, ControlParams(b_sat=1.0, ewma_gamma=1.0))
    ctl.observe(0.5)  # raw = 32 + 0.5 * 48 = 56: equidistant from 48 and 64, ties go down
    first = ctl.select(True)
    assert first.shared == 48
    ctl.observe(0.66)  # raw = 63.7: nearer 64 but has not reached 64 -> stays
    assert ctl.select(True).shared == 48
    ctl.observe(0.67)  # raw = 64.2 >= 64 -> moves
    assert ctl.select(True).shared == 64
    ctl.observe(0.34)  # raw = 48.3 > 48 -> stays at 64
    assert ctl.select(True).shared == 64


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
