"""Solo first-response latency per class: each class alone through the simulated backend.

The SLO of a class is multiplier × its solo p95 (paper §4.2, §6.1). "Alone" is a closed loop:
the next request of the class arrives once the GPU has gone idle, so no request ever overlaps
another, and the backend is the vanilla system (FCFS, no SM control), as a calibration run on
the stock runtime would measure it.
"""

from __future__ import annotations

import numpy as np

from horizonserve.runtime.sim.engine import Simulator
from horizonserve.runtime.sim.setup import SimSetup
from horizonserve.runtime.workload import WorkloadSpec, generate

SOLO_SYSTEM = "fcfs"


def solo_latencies(
    setup: SimSetup, workload: WorkloadSpec, name: str, *, n: int = 100, seed: int = 0
) -> np.ndarray:
    trace = generate(workload, {name: 1.0}, rate=1.0, n_requests=n, seed=seed)
    result = Simulator(setup, trace, SOLO_SYSTEM, seed=seed, solo=True).run()
    return result.latency


def measure_solo_p95(
    setup: SimSetup, workload: WorkloadSpec, *, n: int = 100, seed: int = 0
) -> dict[str, float]:
    """p95 solo first-response latency (s) of every class of the setup."""
    out: dict[str, float] = {}
    for name in setup.class_names:
        lat = solo_latencies(setup, workload, name, n=n, seed=seed)
        if np.isnan(lat).any():
            raise RuntimeError(f"solo run of class {name!r} left requests without a response")
        out[name] = float(np.percentile(lat, 95))
    return out


def solo_source(n: int, seed: int) -> str:
    return (
        f"simulated: each class alone (closed loop, {n} requests, seed {seed}) through the "
        f"{SOLO_SYSTEM} backend; SLO = multiplier × p95"
    )
