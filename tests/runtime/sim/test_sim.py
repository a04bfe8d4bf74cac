"""Simulator: data validity, determinism, speed, and the policy relations it must show.

Short seeded runs on the default artifact (Qwen2.5-Omni); each relation is what the bench
reports at full length, so a regression in any policy (or in the model) fails here.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from horizonserve.runtime.bench.workload import (
    WorkloadSpec,
    generate,
    load_workload,
    mix_weights,
)
from horizonserve.runtime.calibrate.artifact import load_artifact
from horizonserve.runtime.config import PIPELINES, load_pipeline
from horizonserve.runtime.sim import LABEL, SimSetup, simulate
from horizonserve.runtime.sim.plan import attainment_at, plan_system
from horizonserve.runtime.sim.profiles import derive_profile
from horizonserve.runtime.sim.solo import measure_solo_p95
from horizonserve.runtime.sim.systems import BASELINES
from horizonserve.runtime.sim.trace import Trace

PIPE = "qwen2_5_omni"
STRESSED_RATE = 8.0  # req/s: the top of the default Qwen sweep
LONG_SWEEP_RATE = 6.0


@pytest.fixture(scope="module")
def setup() -> SimSetup:
    s = SimSetup.load(PIPE)
    p95 = measure_solo_p95(s, load_workload(PIPE), n=200, seed=0)
    return s.with_solo_p95(p95, "test")


@pytest.fixture(scope="module")
def workload() -> WorkloadSpec:
    return load_workload(PIPE)


def _trace(
    setup: SimSetup,
    workload: WorkloadSpec,
    rate: float,
    long_ratio: float | None = None,
    dur: float = 120.0,
    seed: int = 0,
) -> Trace:
    mix = mix_weights(workload, setup.long_classes, long_ratio)
    return generate(workload, mix, rate=rate, duration_s=dur, warmup_s=dur / 10, seed=seed)


# -- data ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", PIPELINES)
def test_data_files_validate_and_agree(name: str) -> None:
    spec = load_pipeline(name)
    workload = load_workload(name)
    cal = load_artifact().pipeline(name)
    assert spec.model == cal.model
    classes = {c.name for c in spec.slo.classes}
    assert classes == {c.name for c in workload.classes}
    assert set(cal.solo_p95_s) == classes
    for rc in spec.slo.classes:
        # The shipped r̂ profiles are exactly what the artifact derives.
        assert rc.profile == derive_profile(cal, workload, workload.get(rc.name), rc)
        assert rc.solo_p95_s == pytest.approx(cal.solo_p95_s[rc.name])
    assert len(spec.slo.classes) == {"qwen2_5_omni": 8, "mimo_audio": 4, "bagel": 4}[name]


def test_artifact_is_keyed_and_sourced() -> None:
    art = load_artifact()
    assert art.schema_version == 1
    assert "not an H200 calibration" in art.source
    assert art.key(PIPE) == "Qwen/Qwen2.5-Omni-7B|NVIDIA H200|unknown (not measured)|132"
    decode = art.pipeline(PIPE).shared.decode_step_s
    # The paper's published points (§3.3) are in the curve.
    assert decode.at(64) == pytest.approx(4.80e-3)
    assert decode.at(80) == pytest.approx(4.65e-3)
    assert decode.at(120) == pytest.approx(5.57e-3)


def test_solo_p95_defaults_are_reproducible(setup: SimSetup) -> None:
    shipped = {c.name: c.solo_p95_s for c in load_pipeline(PIPE).slo.classes}
    measured = {c.name: c.solo_p95_s for c in setup.slo.classes}
    for name, v in shipped.items():
        assert measured[name] == pytest.approx(v, rel=1e-3, abs=1e-4), name


# -- determinism and speed ------------------------------------------------------------------------
def test_deterministic_for_a_seed(setup: SimSetup, workload) -> None:
    tr = _trace(setup, workload, 5.0, dur=60.0)
    a = simulate(setup, tr, "horizon", seed=3)
    b = simulate(setup, tr, "horizon", seed=3)
    np.testing.assert_array_equal(a.latency, b.latency)
    assert a.stats["iterations"] == b.stats["iterations"]
    c = simulate(setup, _trace(setup, workload, 5.0, dur=60.0, seed=4), "horizon", seed=4)
    assert not np.array_equal(np.nan_to_num(a.latency[:50]), np.nan_to_num(c.latency[:50]))
    assert a.label == LABEL == "simulated"


def test_at_least_100x_real_time(setup: SimSetup, workload) -> None:
    r = simulate(setup, _trace(setup, workload, LONG_SWEEP_RATE, dur=120.0), "horizon")
    # CPU time of this process, so a busy CI machine does not fail the test.
    assert r.stats["cpu_speed_x"] >= 100, r.stats


# -- relations -------------------------------------------------------------------------------------
def test_fcfs_short_path_attainment_falls_as_long_path_share_rises(setup, workload) -> None:
    short = {}
    for ratio in (0.0, 0.3, 0.6):
        r = simulate(setup, _trace(setup, workload, LONG_SWEEP_RATE, ratio, dur=90.0), "fcfs")
        short[ratio] = r.attainment(r.short_mask())
    assert short[0.3] < short[0.0] - 0.3, short
    assert short[0.6] < short[0.0] - 0.3, short


def test_horizon_beats_best_baseline_at_a_stressed_point(setup: SimSetup, workload) -> None:
    tr = _trace(setup, workload, STRESSED_RATE)
    att = {s: simulate(setup, tr, s).attainment() for s in ("horizon", *BASELINES)}
    best = max(att[s] for s in BASELINES)
    assert att["horizon"] > best + 0.05, att
    assert att["horizon"] / best > 1.3, att


def test_removing_sm_throttling_loses(setup: SimSetup, workload) -> None:
    for tr in (
        _trace(setup, workload, STRESSED_RATE),
        _trace(setup, workload, LONG_SWEEP_RATE, 0.6),
    ):
        full = simulate(setup, tr, "horizon").attainment()
        ablated = simulate(setup, tr, "horizon-no-throttling").attainment()
        assert ablated < full - 0.2, (full, ablated)


def _burst_trace(setup: SimSetup, bursts: int = 10, size: int = 30, gap: float = 20.0) -> Trace:
    """Bursts of mixed requests, two thirds long-path, arriving within 20 ms of each other.

    The situation path rotation exists for (paper Fig. 6): under FCFS a long-path burst takes
    the shared stage's sequence slots ahead of the short requests that arrive among it.
    """
    wl = load_workload(PIPE)
    rng = np.random.default_rng(0)
    n = bursts * size
    names = setup.class_names
    kinds = np.where(rng.random(n) < 2 / 3, names.index("text-speech"), names.index("text-text"))
    arrival = np.sort(np.repeat(np.arange(bursts) * gap, size) + rng.uniform(0, 0.02, n))
    base = generate(wl, {"text-text": 1.0}, rate=1.0, n_requests=n, seed=1)
    spoken = wl.get("text-speech").output_tokens.sample(rng, n)
    out = np.where(kinds == names.index("text-speech"), spoken, base.output_tokens)
    return replace(
        base,
        cls=kinds.astype(np.int64),
        arrival=arrival,
        output_tokens=out,
        output_audio_s=out * wl.speech_seconds_per_token,
        duration_s=float(bursts * gap),
        warmup_s=0.0,
    )


def test_removing_path_rotation_loses_under_long_path_bursts(setup: SimSetup) -> None:
    tr = _burst_trace(setup)
    full = simulate(setup, tr, "horizon")
    ablated = simulate(setup, tr, "horizon-no-rotation")
    short = full.short_mask()
    assert full.attainment(short) > ablated.attainment(short) + 0.15
    assert full.attainment() > ablated.attainment() + 0.05


def test_planner_brackets_the_sustainable_rate(setup: SimSetup, workload) -> None:
    unit = generate(workload, mix_weights(workload, setup.long_classes), rate=1.0, n_requests=500)
    unit = replace(unit, warmup_s=0.1 * unit.duration_s)
    res = plan_system(setup, unit, "horizon", target=0.9, tol=0.05, start=2.0)
    assert 0 < res.rate_ok < res.rate_fail <= res.rate_ok * 1.05 + 1e-12
    assert attainment_at(setup, unit, "horizon", res.rate_ok, 0) >= 0.9
    assert attainment_at(setup, unit, "horizon", res.rate_fail, 0) < 0.9
    assert res.attainment_ok is not None and res.attainment_ok >= 0.9
