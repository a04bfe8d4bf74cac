"""Metrics of one simulated run: SLO attainment, goodput, latency percentiles, TPOT.

First-response latency is TTFT for text output, time-to-first-audio for speech and end-to-end
for images, always including queueing. Attainment counts every request that arrived in the
measurement window; a request still without a response when the run ends has already exceeded
its target, so it counts as a miss (stricter than "over completed requests").
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from horizonserve.runtime.sim.result import SimResult


def _pct(x: np.ndarray, q: float) -> float | None:
    x = x[~np.isnan(x)]
    return float(np.percentile(x, q)) if len(x) else None


def nearest_rank(x: np.ndarray, q: float) -> float:
    """The q-th percentile by nearest rank (no interpolation; +inf allowed)."""
    s = np.sort(x)
    k = max(0, math.ceil(q / 100 * len(s)) - 1)
    return float(s[k])


def _nan_to_none(v: float) -> float | None:
    return None if v is None or (isinstance(v, float) and math.isnan(v)) else float(v)


def summarize(result: SimResult) -> dict[str, Any]:
    """A JSON-ready summary of one run (all values simulated)."""
    window = result.window()
    met = result.met()
    span = max(result.duration_s - result.warmup_s, 1e-9)
    short = result.short_mask()
    lat = result.latency
    per_class: dict[str, Any] = {}
    for ci, name in enumerate(result.classes):
        m = window & (result.cls == ci)
        n = int(m.sum())
        # Unanswered requests have unbounded latency: percentiles treat them as +inf.
        lat_c = np.where(np.isnan(lat[m]), np.inf, lat[m])
        per_class[name] = {
            "requests": n,
            "attainment": float(met[m].mean()) if n else None,
            "target_s": float(result.targets[ci]),
            "p50_s": _finite(nearest_rank(lat_c, 50)) if n else None,
            "p95_s": _finite(nearest_rank(lat_c, 95)) if n else None,
            "long_path": bool(result.long_class[ci]),
        }
    tpot = result.tpot[window]
    n_win = int(window.sum())
    return {
        "label": result.label,
        "system": result.system,
        "pipeline": result.pipeline,
        "seed": result.seed,
        "rate": result.rate,
        "requests": n_win,
        "attainment": _nan_to_none(result.attainment()),
        "short_attainment": _nan_to_none(result.attainment(short)),
        "long_attainment": _nan_to_none(result.attainment(~short)),
        "goodput_rps": float(met[window].sum() / span),
        "tpot_p50_ms": _ms(_pct(tpot, 50)),
        "tpot_p95_ms": _ms(_pct(tpot, 95)),
        "classes": per_class,
        "stats": {k: _nan_to_none(v) for k, v in result.stats.items()},
    }


def _finite(v: float) -> float | None:
    return float(v) if math.isfinite(v) else None


def _ms(v: float | None) -> float | None:
    return None if v is None else v * 1e3
