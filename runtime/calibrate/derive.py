"""Pure decisions of the calibration: S_cap, S_min, the ladder, S_aggr, B_sat, cost fractions.

Inputs are plain dicts {SM count: seconds} measured by `runtime.calibrate.measure`; nothing
here touches a GPU, so the rules are unit-tested on synthetic curves.

S_cap (paper §4.2): the smallest SM count at near-best isolated decode TPOT *and* near-best
co-running TPOT (downstream on the complementary SMs): past the decode saturation knee and
not in a regime where co-running makes it worse. "Near-best" is within `tol_rel` of the best
or within `tol_range` of the way from the best to the worst swept TPOT, whichever is looser:
a curve that is flat past its knee but dips a few per cent at one late level (the H200 under
MPS: 7.30 ms at 64 SMs, 7.25-7.26 at 80-96, 6.78 at 112) keeps its knee as S_cap instead of
the late dip, which would leave the downstream stage a sliver of the GPU for a 7 % gain.
S_min: the smallest swept count whose isolated TPOT is within `tol_min` of the best (the
throttled shared stage keeps at least 1/(1 + tol_min) of its best decode rate).
The ladder is up to `max_levels` swept counts from S_min to S_cap. S_aggr: the smallest count
at near-best isolated decode *and* prefill (prefill is compute-bound, so usually the whole GPU),
never below S_cap.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

TOL_REL = 0.05
TOL_RANGE = 0.10
TOL_MIN = 0.5
TOL_AGGR = 0.05
MAX_LEVELS = 4
MAX_MPS_EXCESS = 50.0  # the artifact's bound on `SharingCalibration.mps_shared_excess`


@dataclass(frozen=True)
class LadderChoice:
    s_min: int
    s_cap: int
    s_aggr: int
    levels: tuple[int, ...]
    reason: str


def _best(curve: Mapping[int, float]) -> float:
    return min(curve.values())


def near_best_limit(
    curve: Mapping[int, float], tol_rel: float = TOL_REL, tol_range: float = TOL_RANGE
) -> float:
    """The largest TPOT that still counts as near-best on this curve (module docstring)."""
    best, worst = min(curve.values()), max(curve.values())
    return best + max(tol_rel * best, tol_range * (worst - best))


def choose_s_cap(
    iso: Mapping[int, float],
    corun: Mapping[int, float] | None,
    total: int,
    *,
    tol_rel: float = TOL_REL,
    tol_range: float = TOL_RANGE,
) -> tuple[int, str]:
    """S_cap from isolated and co-running decode TPOT per SM count (see module docstring)."""
    capped = sorted(s for s in iso if s < total)
    if not capped:
        raise ValueError("no capped SM level was measured")
    lim = near_best_limit(iso, tol_rel, tol_range)
    near = [s for s in capped if iso[s] <= lim]
    rule = f"within {tol_rel:.0%} of the best or {tol_range:.0%} of the best-to-worst range"
    co = {s: v for s, v in (corun or {}).items() if s < total}
    if co:
        lim_co = near_best_limit(co, tol_rel, tol_range)
        ok = [s for s in near if s in co and co[s] <= lim_co]
        if ok:
            why = (
                f"smallest SM count whose isolated TPOT (<= {lim * 1e3:.2f} ms) and co-running "
                f"TPOT (<= {lim_co * 1e3:.2f} ms) are both near-best ({rule})"
            )
            return ok[0], why
    if near:
        return near[0], f"smallest SM count with near-best isolated TPOT ({rule})"
    return capped[-1], "no capped level reached near-best TPOT: the largest capped level"


def choose_s_min(iso: Mapping[int, float], s_cap: int, *, tol_min: float = TOL_MIN) -> int:
    best = _best(iso)
    ok = [s for s in sorted(iso) if s <= s_cap and iso[s] <= (1 + tol_min) * best]
    return ok[0] if ok else s_cap


def ladder_levels(
    swept: Sequence[int], s_min: int, s_cap: int, *, max_levels: int = MAX_LEVELS
) -> tuple[int, ...]:
    """Up to `max_levels` swept counts from S_min to S_cap, both ends kept, evenly spread."""
    inside = sorted({s for s in swept if s_min <= s <= s_cap} | {s_min, s_cap})
    if len(inside) == 1:  # give the controller a step below S_cap when one exists
        lower = [s for s in sorted(swept) if s < s_cap]
        if lower:
            inside = [lower[-1], s_cap]
    if len(inside) <= max_levels:
        return tuple(inside)
    n = len(inside) - 1
    picks = sorted({inside[round(i * n / (max_levels - 1))] for i in range(max_levels)})
    return tuple(picks)


def choose_s_aggr(
    iso: Mapping[int, float],
    prefill: Mapping[int, float] | None,
    s_cap: int,
    total: int,
    *,
    tol: float = TOL_AGGR,
) -> int:
    lim = near_best_limit(iso)
    best_p = _best(prefill) if prefill else None
    for s in sorted(iso):
        if s < s_cap:
            continue
        if iso[s] > lim:
            continue
        if prefill and best_p is not None and (s not in prefill or prefill[s] > (1 + tol) * best_p):
            continue
        return s
    return total


def choose_ladder(
    iso: Mapping[int, float],
    corun: Mapping[int, float] | None,
    prefill: Mapping[int, float] | None,
    total: int,
) -> LadderChoice:
    s_cap, why = choose_s_cap(iso, corun, total)
    s_min = choose_s_min(iso, s_cap)
    levels = ladder_levels(sorted(iso), s_min, s_cap)
    s_aggr = choose_s_aggr(iso, prefill, levels[-1], total)
    return LadderChoice(levels[0], levels[-1], s_aggr, levels, why)


def choose_b_sat(corun_pressure: Mapping[int, float], s_cap: int) -> float | None:
    """Saturation pressure: the highest co-running memory activity seen at or below S_cap."""
    vals = [v for s, v in corun_pressure.items() if s <= s_cap and v == v and v > 0]
    if not vals:
        return None
    return min(1.0, max(0.05, max(vals)))


def decode_fracs(
    t1: float, t8_short: float, t8_long: float, ctx_short: int, ctx_long: int
) -> tuple[float, float, float]:
    """(d1, seq_frac, ctx_frac) of T = d1·(1 + seq·(B-1) + ctx·B·c) from three probes.

    t1: batch 1 at ctx_short; t8_short / t8_long: batch 8 at ctx_short / ctx_long.
    """
    per_token = max(0.0, (t8_long - t8_short) / (8 * (ctx_long - ctx_short)))  # d1·ctx_frac
    d1 = max(t1 - per_token * ctx_short, 0.25 * t1)
    ctx_frac = per_token / d1
    seq = (t8_short - d1 - per_token * 8 * ctx_short) / (7 * d1)
    return d1, max(0.0, seq), ctx_frac


def slope_scale(
    b8: Mapping[int, float],
    b1: Mapping[int, float],
    seq: float,
    ctx: float,
    c8: int,
    c1: int,
    total: int,
) -> dict[int, float]:
    """k(s) of T(s) = d1(s)·(1 + k(s)·(seq·(B-1) + ctx·B·c)), from batch 8 at c8 tokens and
    batch 1 at c1 tokens per SM count, relative to k(S_tot) (= 1: where seq and ctx were
    measured). Levels where the model cannot explain the ratio are left out."""
    a = seq * 7 + ctx * 8 * c8  # the slope term of the batch-8 probe
    b = ctx * c1  # ... and of the batch-1 probe

    def k(s: int) -> float | None:
        r = b8[s] / b1[s]
        den = a - r * b
        return (r - 1.0) / den if den > 0 and r >= 1.0 else None

    if total not in b8 or total not in b1:
        return {}
    k_full = k(total)
    if not k_full:
        return {}
    out = {}
    for s in sorted(set(b8) & set(b1)):
        ks = k(s)
        if ks is not None:
            out[s] = ks / k_full
    return out


def batch_frac(t1: float, tn: float, n: int) -> float:
    """frac of step·(1 + frac·(n-1)) from a batch-1 and a batch-n step time."""
    if n <= 1 or t1 <= 0:
        return 0.0
    return max(0.0, (tn / t1 - 1.0) / (n - 1))


def excess_share(f_mps: float, f_ts: float) -> float:
    """MPS's co-running excess as a multiple of the time-sliced one (≥ 0). Above 1 where MPS
    costs more than time slicing: next to the DiT on the H200 the thinker decodes ×6.3 slower
    under MPS and ×2.2 time-sliced (the DiT's kernels fill every SM)."""
    if f_ts <= 1.0:
        return 0.0
    return min(MAX_MPS_EXCESS, max(0.0, (f_mps - 1.0) / (f_ts - 1.0)))


def p95(values: Sequence[float]) -> float:
    """Nearest-rank p95 (the bench's percentile rule)."""
    s = sorted(values)
    if not s:
        raise ValueError("p95 of nothing")
    return s[min(len(s) - 1, max(0, round(0.95 * (len(s) - 1))))]
