"""The simulated policy sweep behind `horizonserve bench` and what it shows.

One sweep, for one pipeline:
  1. SLO table: each class alone through the simulated backend → solo p95 × multiplier;
  2. arrival-rate sweep at the default class mix (paper Fig. 8, left);
  3. long-path-share sweep at a fixed offered load (Fig. 8, right; Fig. 3 for FCFS);
  4. one HorizonServe run with the control trace recorded (Fig. 10).
Per-class p95 (Fig. 9) and the ablation bars (Fig. 11) are read from the stressed points of 2
and 3. `findings` distils the relations the evaluation reports.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

from horizonserve.runtime.artifact import (
    DEFAULT_ARTIFACT,
    CalibrationArtifact,
    load_artifact,
)
from horizonserve.runtime.bench.runner import Point, run_points
from horizonserve.runtime.sim.result import LABEL
from horizonserve.runtime.sim.setup import SimSetup
from horizonserve.runtime.sim.solo import measure_solo_p95, solo_source
from horizonserve.runtime.sim.systems import ABLATIONS, BASELINES, SYSTEMS
from horizonserve.runtime.workload import WorkloadSpec, load_workload


@dataclass
class SweepConfig:
    pipeline: str = "qwen2_5_omni"
    systems: tuple[str, ...] = tuple(SYSTEMS)
    rates: tuple[float, ...] | None = None  # None: the workload file's defaults
    long_ratios: tuple[float, ...] | None = None
    long_sweep_rate: float | None = None
    duration_s: float = 240.0
    warmup_s: float = 24.0
    seed: int = 0
    jobs: int | None = None
    solo_requests: int = 200
    slo_multiplier: float = 5.0
    artifact_path: str | None = None
    trace: bool = True
    extra: dict[str, Any] = field(default_factory=dict)


def build_points(cfg: SweepConfig, workload: WorkloadSpec) -> list[Point]:
    sw = workload.sweep
    rates = cfg.rates or tuple(sw.rates)
    ratios = cfg.long_ratios or tuple(sw.long_ratios)
    long_rate = cfg.long_sweep_rate or sw.long_sweep_rate
    d, w, seed = cfg.duration_s, cfg.warmup_s, cfg.seed
    pts = [Point("rate", s, r, None, d, w, seed) for r in rates for s in cfg.systems]
    pts += [Point("long", s, long_rate, x, d, w, seed) for x in ratios for s in cfg.systems]
    if cfg.trace and "horizon" in cfg.systems:
        pts.append(Point("trace", "horizon", sw.trace_rate, sw.trace_long_ratio, d, w, seed, True))
    return pts


def run_sweep(
    cfg: SweepConfig,
    *,
    on_total: Callable[[int], None] | None = None,
    on_done: Callable[[dict[str, Any]], None] | None = None,
) -> dict[str, Any]:
    """Run the whole sweep; the raw, JSON-ready record (labelled simulated)."""
    t0 = time.perf_counter()
    artifact: CalibrationArtifact = load_artifact(cfg.artifact_path)
    workload = load_workload(cfg.pipeline)
    setup = SimSetup.load(cfg.pipeline, artifact)
    p95 = measure_solo_p95(setup, workload, n=cfg.solo_requests, seed=cfg.seed)
    setup = setup.with_solo_p95(
        p95, solo_source(cfg.solo_requests, cfg.seed), multiplier=cfg.slo_multiplier
    )
    t_solo = time.perf_counter() - t0
    points = build_points(cfg, workload)
    if on_total:
        on_total(len(points))
    results, wall = run_points(setup, workload, points, jobs=cfg.jobs, on_done=on_done)
    raw: dict[str, Any] = {
        "label": LABEL,
        "note": "Every number here comes from the discrete-event simulator, not from a GPU.",
        "pipeline": cfg.pipeline,
        "model": setup.spec.model,
        "artifact": {
            "file": cfg.artifact_path or f"runtime/data/calibration/{DEFAULT_ARTIFACT}",
            "measured": artifact.source.startswith("measured"),
            "source": artifact.source,
            "key": artifact.key(cfg.pipeline),
            "schema_version": artifact.schema_version,
        },
        "config": {k: v for k, v in asdict(cfg).items() if k != "extra"},
        "slo": {
            "source": setup.slo_source,
            "multiplier": setup.slo.multiplier,
            "solo_p95_s": p95,
            "targets_s": setup.targets(),
        },
        "results": results,
        "workload_tokens": mean_output_tokens(workload, setup.long_classes),
        "timing": {
            "solo_wall_s": t_solo,
            "sweep_wall_s": wall,
            "total_wall_s": time.perf_counter() - t0,
            "jobs": cfg.jobs,
        },
    }
    raw["findings"] = findings(raw)
    return raw


def mean_output_tokens(workload: WorkloadSpec, long_classes: tuple[str, ...]) -> dict[str, float]:
    """Mean answer length (shared-stage output tokens) of the short- and long-path classes,
    weighted by the default mix (the report uses it to explain the long-path sweep)."""
    out: dict[str, float] = {}
    for path, members in (
        ("short", [c for c in workload.classes if c.name not in long_classes]),
        ("long", [c for c in workload.classes if c.name in long_classes]),
    ):
        total = sum(c.weight for c in members)
        if total > 0:
            out[path] = sum(c.weight * c.output_tokens.mean for c in members) / total
    return out


# -- reading a sweep --------------------------------------------------------------------------
def select(raw: dict[str, Any], sweep: str, system: str | None = None) -> list[dict[str, Any]]:
    out = [r for r in raw["results"] if r["point"]["sweep"] == sweep]
    if system is not None:
        out = [r for r in out if r["system"] == system]
    return sorted(out, key=lambda r: (r["point"]["rate"], r["point"]["long_ratio"] or 0.0))


def _at(rows: list[dict[str, Any]], key: str, value: float) -> dict[str, dict[str, Any]]:
    return {r["system"]: r for r in rows if r["point"][key] == value}


def _compare(by_system: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """HorizonServe vs the best baseline and vs each ablation at one point."""
    h = by_system.get("horizon")
    if h is None:
        return {}
    base = {s: by_system[s]["attainment"] for s in BASELINES if s in by_system}
    out: dict[str, Any] = {"horizon": h["attainment"]}
    if base:
        best = max(base, key=lambda s: base[s] or 0.0)
        b = base[best] or 0.0
        out.update(
            best_baseline=best,
            best_baseline_attainment=b,
            ratio=(h["attainment"] / b) if b > 0 else None,
        )
    plain = {s: a for s, a in base.items() if not SYSTEMS[s].mps}
    if plain:  # the baselines without MPS: the comparison that holds on the measured H200
        best = max(plain, key=lambda s: plain[s] or 0.0)
        b = plain[best] or 0.0
        out.update(
            best_non_mps_baseline=best,
            best_non_mps_attainment=b,
            non_mps_ratio=(h["attainment"] / b) if b > 0 else None,
        )
    for a in ABLATIONS:
        if a in by_system:
            out[f"{a}_attainment"] = by_system[a]["attainment"]
            out[f"{a}_loss"] = h["attainment"] - by_system[a]["attainment"]
    return out


def findings(raw: dict[str, Any]) -> dict[str, Any]:
    f: dict[str, Any] = {}
    rate_rows = select(raw, "rate")
    long_rows = select(raw, "long")
    if rate_rows:
        top = max(r["point"]["rate"] for r in rate_rows)
        f["stressed_rate"] = {"rate": top, **_compare(_at(rate_rows, "rate", top))}
    if long_rows:
        top = max(r["point"]["long_ratio"] for r in long_rows)
        f["max_long_ratio"] = {
            "long_ratio": top,
            "rate": long_rows[0]["point"]["rate"],
            **_compare(_at(long_rows, "long_ratio", top)),
        }
        fcfs = select(raw, "long", "fcfs")
        if fcfs:
            seq = [(r["point"]["long_ratio"], r["short_attainment"]) for r in fcfs]
            vals = [v for _, v in seq if v is not None]
            f["fcfs_short_vs_long_ratio"] = {
                "points": seq,
                "falls": len(vals) >= 2 and vals[-1] < vals[0],
                "non_increasing": all(b <= a + 0.02 for a, b in itertools.pairwise(vals)),
            }
    rep = representative_rate(raw)
    if rep is not None:
        f["per_class_p95"] = _p95_reduction(_at(rate_rows, "rate", rep), rep)
    sim_s = sum(r["stats"]["sim_s"] or 0.0 for r in raw["results"])
    cpu_s = sum(r["stats"]["cpu_s"] or 0.0 for r in raw["results"])
    f["speed"] = {
        "simulated_s": sim_s,
        "cpu_s": cpu_s,
        "per_core_x_real_time": sim_s / cpu_s if cpu_s else None,
        "sweep_x_real_time": sim_s / raw["timing"]["sweep_wall_s"]
        if raw["timing"]["sweep_wall_s"]
        else None,
    }
    return f


def representative_rate(raw: dict[str, Any], floor: float = 0.9) -> float | None:
    """The highest swept rate at which HorizonServe still attains `floor` (else the lowest)."""
    rows = select(raw, "rate", "horizon")
    if not rows:
        return None
    ok = [r["point"]["rate"] for r in rows if (r["attainment"] or 0.0) >= floor]
    return max(ok) if ok else min(r["point"]["rate"] for r in rows)


def _p95_reduction(by_system: dict[str, dict[str, Any]], rate: float) -> dict[str, Any]:
    """Per class: HorizonServe's p95 vs the best (lowest) baseline p95 (None = unbounded)."""
    h = by_system.get("horizon")
    if h is None:
        return {}
    out: dict[str, Any] = {}
    reductions = []
    for name, c in h["classes"].items():
        base = [by_system[s]["classes"][name]["p95_s"] for s in BASELINES if s in by_system]
        finite = [b for b in base if b is not None]
        best = min(finite) if finite else None  # None: every baseline's p95 is unbounded
        hp = c["p95_s"]
        red = None
        if hp is not None:
            red = 1.0 - hp / best if best else 1.0
            reductions.append(red)
        out[name] = {"horizon_p95_s": hp, "best_baseline_p95_s": best, "reduction": red}
    return {
        "rate": rate,
        "classes": out,
        "mean_reduction": sum(reductions) / len(reductions) if reductions else None,
    }
