"""What one simulated run produced. Always labelled simulated."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

LABEL = "simulated"


@dataclass
class SimResult:
    """Per-request outcomes of one run plus run statistics and (optionally) a control trace.

    `latency` is the first-response latency (TTFT / TTFO / E2E by class) in seconds including
    queueing, NaN when the run ended first (it then exceeded its target: a miss). Metrics count
    requests that arrived inside [warmup_s, duration_s).
    """

    system: str
    pipeline: str
    seed: int
    rate: float
    duration_s: float
    warmup_s: float
    classes: tuple[str, ...]
    long_class: np.ndarray  # bool per class
    targets: np.ndarray  # SLO per class, seconds
    cls: np.ndarray
    arrival: np.ndarray
    latency: np.ndarray
    tpot: np.ndarray  # mean shared-stage seconds per output token after the first; NaN if < 2
    stats: dict[str, float] = field(default_factory=dict)
    trace: dict[str, list[float]] | None = None
    # With `record_steps`: the shared stage's iterations as the reference engine traces them
    # ({"columns": STEP_COLUMNS, "rows": [...]}, simulated).
    steps: dict[str, Any] | None = None
    label: str = LABEL

    def window(self) -> np.ndarray:
        return (self.arrival >= self.warmup_s) & (self.arrival < self.duration_s)

    @property
    def window_s(self) -> float:
        """Length of the scored window: arrivals in [warmup_s, duration_s)."""
        return max(0.0, self.duration_s - self.warmup_s)

    def scoring(self) -> str:
        """The stated window every attainment of this result is over."""
        return (
            f"attainment over arrivals in [{self.warmup_s:g}, {self.duration_s:g}) s: "
            f"{self.window_s:g} s scored after a {self.warmup_s:g}-s warm-up"
        )

    def met(self) -> np.ndarray:
        lat = self.latency
        ok = ~np.isnan(lat)
        out = np.zeros(len(lat), dtype=bool)
        out[ok] = lat[ok] <= self.targets[self.cls[ok]]
        return out

    def attainment(self, mask: np.ndarray | None = None) -> float:
        """Fraction of requests in the window (and `mask`) that met their class SLO."""
        m = self.window()
        if mask is not None:
            m &= mask
        n = int(m.sum())
        return float(self.met()[m].sum() / n) if n else float("nan")

    def short_mask(self) -> np.ndarray:
        return ~self.long_class[self.cls]

    def to_json(self, per_request: bool = False) -> dict[str, Any]:
        out: dict[str, Any] = {
            "label": self.label,
            "system": self.system,
            "pipeline": self.pipeline,
            "seed": self.seed,
            "rate": self.rate,
            "duration_s": self.duration_s,
            "warmup_s": self.warmup_s,
            "window_s": self.window_s,
            "classes": list(self.classes),
            "targets_s": [float(x) for x in self.targets],
            "stats": self.stats,
        }
        if per_request:
            out["requests"] = {
                "cls": self.cls.tolist(),
                "arrival": self.arrival.tolist(),
                "latency": [None if np.isnan(x) else float(x) for x in self.latency],
            }
        if self.trace is not None:
            out["trace"] = self.trace
        return out
