"""Run sweep points (system × rate × long-path share) across worker processes.

Every point of one sweep uses the same seeded trace generator, so systems see the same
requests (common random numbers). Workers receive the setup once (pool initializer) and then
only small `Point`s; results come back as JSON-ready summaries.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import time
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass
from typing import Any

from horizonserve.runtime.bench.metrics import summarize
from horizonserve.runtime.sim.engine import simulate
from horizonserve.runtime.sim.setup import SimSetup
from horizonserve.runtime.workload import WorkloadSpec, generate, mix_weights


@dataclass(frozen=True, slots=True)
class Point:
    sweep: str  # "rate", "long", "trace" …
    system: str
    rate: float
    long_ratio: float | None  # None: the workload's default mix
    duration_s: float
    warmup_s: float
    seed: int = 0
    record_trace: bool = False


_SETUP: SimSetup | None = None
_WORKLOAD: WorkloadSpec | None = None


def _init(setup: SimSetup, workload: WorkloadSpec) -> None:
    global _SETUP, _WORKLOAD
    _SETUP, _WORKLOAD = setup, workload


def run_point(point: Point) -> dict[str, Any]:
    """Simulate one point with the process's setup; a summary plus the point itself."""
    setup, workload = _SETUP, _WORKLOAD
    assert setup is not None and workload is not None, "call _init first"
    mix = mix_weights(workload, setup.long_classes, point.long_ratio)
    trace = generate(
        workload,
        mix,
        rate=point.rate,
        duration_s=point.duration_s,
        warmup_s=point.warmup_s,
        seed=point.seed,
    )
    result = simulate(setup, trace, point.system, seed=point.seed, record_trace=point.record_trace)
    out = summarize(result)
    out["point"] = asdict(point)
    if result.trace is not None:
        out["trace"] = result.trace
    return out


def run_points(
    setup: SimSetup,
    workload: WorkloadSpec,
    points: Iterable[Point],
    *,
    jobs: int | None = None,
    on_done: Callable[[dict[str, Any]], None] | None = None,
) -> tuple[list[dict[str, Any]], float]:
    """Run all points; results in the order given, and the wall time."""
    pts = list(points)
    jobs = max(1, min(jobs or os.cpu_count() or 1, len(pts) or 1))
    t0 = time.perf_counter()
    results: list[dict[str, Any] | None] = [None] * len(pts)
    if jobs == 1:
        _init(setup, workload)
        for i, p in enumerate(pts):
            results[i] = run_point(p)
            if on_done:
                on_done(results[i])  # type: ignore[arg-type]
    else:
        ctx = mp.get_context("fork") if "fork" in mp.get_all_start_methods() else mp.get_context()
        # Longest points first keeps both workers busy until the end.
        order = sorted(range(len(pts)), key=lambda i: -pts[i].rate * pts[i].duration_s)
        with ctx.Pool(jobs, initializer=_init, initargs=(setup, workload)) as pool:
            for i, res in pool.imap_unordered(_indexed, [(i, pts[i]) for i in order]):
                results[i] = res
                if on_done:
                    on_done(res)
    return [r for r in results if r is not None], time.perf_counter() - t0


def _indexed(item: tuple[int, Point]) -> tuple[int, dict[str, Any]]:
    i, p = item
    return i, run_point(p)
