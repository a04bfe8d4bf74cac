"""What the simulated sweeps in bench/sim share: a pipeline's setup with SLOs from simulated
solo runs, and one simulated point's attainment. Every figure these produce is SIMULATED."""

from __future__ import annotations

from typing import Any

from horizonserve.runtime.artifact import CalibrationArtifact
from horizonserve.runtime.bench.metrics import summarize
from horizonserve.runtime.sim.engine import simulate
from horizonserve.runtime.sim.setup import SimSetup
from horizonserve.runtime.sim.solo import measure_solo_p95, solo_source
from horizonserve.runtime.workload import generate, load_workload, mix_weights

SOLO_N = 200  # solo requests per class behind each SLO (seed 0)


def measured_setup(pipeline: str, art: CalibrationArtifact) -> tuple[SimSetup, Any]:
    """The pipeline on `art`, SLO = 5 × its simulated solo p95; and its workload."""
    setup = SimSetup.load(pipeline, art)
    wl = load_workload(pipeline)
    solo = measure_solo_p95(setup, wl, seed=0, n=SOLO_N)
    return setup.with_solo_p95(solo, solo_source(SOLO_N, 0)), wl


def point(
    setup: SimSetup,
    wl: Any,
    system: str,
    rate: float,
    seed: int,
    duration_s: float,
    long_ratio: float | None = None,
    burstiness: float = 1.0,
) -> dict[str, Any]:
    """One simulated point (warm-up: the first 10 % of arrivals left out): its summary."""
    mix = mix_weights(wl, setup.long_classes, long_ratio)
    tr = generate(
        wl,
        mix,
        rate=rate,
        duration_s=duration_s,
        warmup_s=0.1 * duration_s,
        seed=seed,
        burstiness=burstiness,
    )
    return summarize(simulate(setup, tr, system, seed=seed))
