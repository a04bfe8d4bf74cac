"""Sample statistics of the calibration: a percentile with a distribution-free confidence interval.

The p95 of n solo samples is the nearest-rank order statistic x_(⌈0.95·n⌉). Its confidence
interval comes from the order statistics too (no distribution assumed): the number of samples
below the true p95 is Binomial(n, 0.95), so [x_(l), x_(u)] covers it with probability
P(l ≤ B < u), B ~ Bin(n, q). We take the narrowest pair, symmetric in tail mass, whose coverage
is at least `level`. With few samples the upper end does not exist (no sample lies far enough
above the p95): `hi` is then None, "unbounded". For the p95 at 95 % that takes n ≥ 72
(1 − 0.95ⁿ ≥ 0.975), hence `SOLO_SAMPLES`; 6 samples give only a lower end.
`bootstrap_ci` is the percentile bootstrap beside it: always finite, but optimistic for a tail
quantile of few samples (it never reaches above the largest one).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

MIN_SOLO_SAMPLES = 30  # per class: the least a non-quick calibration accepts
SOLO_SAMPLES = 80  # per class by default (non-quick): the p95's 95 % CI is then bounded


@dataclass(frozen=True, slots=True)
class QuantileEstimate:
    q: float
    n: int
    value: float  # nearest-rank x_(⌈q·n⌉)
    lo: float | None  # lower end of the CI (None: below the smallest sample)
    hi: float | None  # upper end (None: above the largest sample, unbounded)
    level: float  # nominal coverage
    coverage: float  # exact coverage of [lo, hi] under Bin(n, q)

    def to_json(self) -> dict[str, float | int | None]:
        return {
            "q": self.q,
            "n": self.n,
            "value": self.value,
            "lo": self.lo,
            "hi": self.hi,
            "level": self.level,
            "coverage": round(self.coverage, 4),
        }


def _binom_cdf(k: int, n: int, p: float) -> float:
    """P(B ≤ k), B ~ Bin(n, p)."""
    if k < 0:
        return 0.0
    if k >= n:
        return 1.0
    return sum(math.comb(n, i) * p**i * (1 - p) ** (n - i) for i in range(k + 1))


def nearest_rank(samples: Sequence[float], q: float) -> float:
    xs = sorted(samples)
    if not xs:
        raise ValueError("a percentile of no samples")
    return xs[max(1, math.ceil(q * len(xs))) - 1]


def quantile_ci(samples: Sequence[float], q: float = 0.95, level: float = 0.95) -> QuantileEstimate:
    """The q-quantile (nearest rank) of `samples` and its order-statistic CI (module docstring)."""
    if not 0 < q < 1 or not 0 < level < 1:
        raise ValueError(f"q and level must be in (0, 1), got {q}, {level}")
    xs = sorted(float(x) for x in samples)
    n = len(xs)
    if n == 0:
        raise ValueError("a percentile of no samples")
    alpha = (1 - level) / 2
    # Ranks are 1-based: x_(r). P(x_(l) ≤ Q) = P(B ≥ l) = 1 − F(l − 1); P(Q < x_(u)) = F(u − 1).
    lo_rank = 0  # 0: no lower order statistic qualifies (−∞)
    for r in range(n, 0, -1):
        if 1 - _binom_cdf(r - 1, n, q) >= 1 - alpha:
            lo_rank = r
            break
    hi_rank = n + 1  # n + 1: unbounded (+∞)
    for r in range(1, n + 1):
        if _binom_cdf(r - 1, n, q) >= 1 - alpha:
            hi_rank = r
            break
    coverage = _binom_cdf(hi_rank - 1, n, q) - _binom_cdf(lo_rank - 1, n, q)
    return QuantileEstimate(
        q=q,
        n=n,
        value=nearest_rank(xs, q),
        lo=xs[lo_rank - 1] if lo_rank >= 1 else None,
        hi=xs[hi_rank - 1] if hi_rank <= n else None,
        level=level,
        coverage=coverage,
    )


def bootstrap_ci(
    samples: Sequence[float],
    q: float = 0.95,
    level: float = 0.95,
    *,
    reps: int = 2000,
    seed: int = 0,
) -> tuple[float, float]:
    """Percentile-bootstrap CI of the nearest-rank q-quantile (see the module docstring)."""
    xs = np.sort(np.asarray(samples, dtype=float))
    n = len(xs)
    if n == 0:
        raise ValueError("a percentile of no samples")
    rng = np.random.default_rng(seed)
    k = max(1, math.ceil(q * n)) - 1
    boot = np.sort(xs[rng.integers(0, n, (reps, n))], axis=1)[:, k]
    a = (1 - level) / 2
    return float(np.quantile(boot, a)), float(np.quantile(boot, 1 - a))
