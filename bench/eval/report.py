"""Tables and plots of an evaluation campaign (bench/eval/campaign.py) from its raw records.

    python bench/eval/report.py bench/results/h200-eval/RUN

Reads RUN/plan.json, every RUN/s*/ session (summary.json, records.jsonl.gz, steps.jsonl.gz;
one named sNN-repeat adds its runs as further repetitions), the simulator's predictions
RUN/sim_*.json and RUN/overhead_cpu.json when present. Every metric
is recomputed from the raw per-request records and per-step rows (campaign.item_summary), so
the report depends on nothing the device printed. Writes RUN/report.md, RUN/results.json and
the figures (paper numbering): fig8_attainment.png, fig9_p95.png, fig10_control.png,
fig11_ablation.png, table3_tpot.png, sim_vs_measured.png.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from campaign import ABLATIONS, ALL, LABELS, MAIN, WARMUP_FRACTION, item_summary
from capacity import mean_or_none
from figures import save_png
from reuse import read_members

from horizonserve.runtime.calibrate.legacy import recorded_control
from horizonserve.runtime.calibrate.records import (
    REPEAT_SUFFIX,
    plan_campaign,
    read_plan,
    session_control,
)

BASELINES = ("fcfs", "edf", "mps", "edf-mps", "priority", "priority-mps")
COLORS = {
    "horizon": "#d62728",
    "fcfs": "#7f7f7f",
    "edf": "#1f77b4",
    "mps": "#2ca02c",
    "edf-mps": "#9467bd",
    "horizon-no-rotation": "#ff9896",
    "horizon-no-throttling": "#ffbb78",
    "horizon-no-downstream": "#c49c94",
    "horizon-no-preemption": "#f7b6d2",
    "priority": "#8c564b",
    "priority-mps": "#e377c2",
}


# -- loading ----------------------------------------------------------------------------------
def _plans(run: Path) -> dict[str, dict[str, Any]]:
    """The plans whose sessions this run reads, by digest: RUN/plan.json and any RUN/plan-*
    (a link to another plan whose HorizonServe items may count, when they ran the same
    controller)."""
    paths = [run / "plan.json", *sorted(run.glob("plan-*.json*"))]
    return {sha: plan for plan, sha in map(read_plan, paths)}


def _controller(plan: dict[str, Any] | None, summary: dict[str, Any]) -> dict[str, Any] | None:
    """`session_control` with every knob it does not name at its value before the knob existed
    (so two records of one controller compare equal whichever knobs each names), or None where
    the session records none and its plan is not here."""
    if "control" not in summary and plan is None:
        return None
    control, verdicts = recorded_control(session_control(plan or {}, summary))
    return {**control.model_dump(mode="json"), **verdicts.model_dump()}


def _next_rep(items: dict[str, Any], meta: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    """The item id and metadata under which a run again of `meta`'s item counts: a session
    linked as `sNN-repeat` (REPEAT_SUFFIX) ran items an earlier session counts, and each counts
    as the next repetition of its point and system. The label is free to move because a plan's
    repetitions share the point's requests; `rep` only names the run."""
    taken = [
        v["meta"]["rep"]
        for v in items.values()
        if v["meta"]["point"] == meta["point"] and v["meta"]["system"] == meta["system"]
    ]
    rep = max(taken) + 1
    return f"{meta['point']}/{meta['system']}/rep{rep}", {**meta, "rep": rep}


def load_run(run: Path) -> dict[str, Any]:
    plans = _plans(run)
    plan_sha = next(iter(plans))
    plan = plans[plan_sha]
    policy = {i["id"]: i["policy"] for i in plan["items"]}
    items: dict[str, dict[str, Any]] = {}
    superseded: list[str] = []  # items run again (--redo): the later run counts
    # A HorizonServe item of another controller than this run's (the plan's knobs and the
    # defaults its first session recorded for newer ones) is left out and listed; one whose
    # controller is unknown here (an older session of a plan not linked) counts. A baseline's
    # item carries over: control touches HorizonServe only.
    sessions = [
        {"name": d.name, "dir": d, "summary": json.loads((d / "summary.json").read_text())}
        for d in sorted(p for p in run.iterdir() if p.is_dir() and p.name.startswith("s"))
        if (d / "summary.json").exists()
    ]
    own = [x["summary"] for x in sessions if x["summary"].get("plan_sha256") == plan_sha]
    newer = own[0].get("control_defaults", {}) if own else {}
    controller = _controller(plan, {"control_defaults": newer})
    foreign: list[str] = []
    for session in sessions:
        sdir, summary = session.pop("dir"), session["summary"]
        recs = {m["item"]: m["records"] for m in read_members(sdir / "records.jsonl.gz")}
        steps = {m["item"]: m for m in read_members(sdir / "steps.jsonl.gz")}
        redo = set(summary.get("redo", ()))
        ran = _controller(plans.get(summary.get("plan_sha256", "")), summary)
        for item_id, s in summary.get("items", {}).items():
            if s.get("status") != "ok" or item_id not in recs:
                continue
            if policy.get(item_id) == "horizon" and ran is not None and ran != controller:
                foreign.append(f"{item_id} ({sdir.name})")
                continue
            key, meta = item_id, s
            if item_id in items and sdir.name.endswith(REPEAT_SUFFIX):
                key, meta = _next_rep(items, s)
            elif item_id in items:
                if item_id not in redo:
                    continue
                superseded.append(f"{item_id} ({items[item_id]['session']} → {sdir.name})")
            st = steps.get(item_id, {"columns": [], "rows": []})
            items[key] = {
                "session": sdir.name,
                "meta": meta,
                "records": recs[item_id],
                "columns": st["columns"],
                "rows": st["rows"],
            }
    sims = {}
    for p in sorted(run.glob("sim_*.json")):
        if p.name.endswith(".artifact.json"):
            continue
        sims[p.stem] = json.loads(p.read_text())
    overhead = None
    if (run / "overhead_cpu.json").exists():
        overhead = json.loads((run / "overhead_cpu.json").read_text())
    return {
        "plan": plan,
        "items": items,
        "superseded": superseded,
        "foreign": foreign,
        "control_newer": newer,
        "sessions": sessions,
        "sims": sims,
        "overhead": overhead,
    }


# -- metrics ----------------------------------------------------------------------------------
def metrics(data: dict[str, Any]) -> dict[str, Any]:
    """Per item (recomputed), per point × system (mean over repetitions), headline numbers."""
    plan = data["plan"]
    per_item: dict[str, Any] = {}
    for item_id, it in data["items"].items():
        span = plan["points"][it["meta"]["point"]]["duration_s"]
        s = item_summary(it["records"], it["rows"], it["columns"], span)
        s.update({k: it["meta"][k] for k in ("point", "system", "rep", "sharing", "mps_active")})
        s["session"] = it["session"]
        per_item[item_id] = s
    grid: dict[str, dict[str, Any]] = {}
    for s in per_item.values():
        grid.setdefault(s["point"], {}).setdefault(s["system"], []).append(s)
    points: dict[str, Any] = {}
    for pid, by_sys in grid.items():
        row: dict[str, Any] = {}
        for system, reps in by_sys.items():
            att = [r["attainment"] for r in reps]
            row[system] = {
                "reps": len(reps),
                "attainment": statistics.fmean(att),
                "attainment_reps": att,
                **{
                    k: mean_or_none([r[k] for r in reps])
                    for k in (
                        "short_attainment",
                        "long_attainment",  # None at a point without long-path requests
                        "steady_attainment",
                        "steady_short_attainment",
                        "steady_long_attainment",
                    )
                },
                **{
                    f"{kind}_{k}": statistics.fmean(r[f"{kind}_{k}"] for r in reps)
                    for kind in ("short", "long")
                    for k in ("goodput_rps", "late", "never")
                },
                "underruns": mean_or_none([r["underruns"] for r in reps]),
                "tpot_p50_ms": statistics.fmean(r["tpot_p50_ms"] for r in reps),
                "tpot_p95_ms": statistics.fmean(r["tpot_p95_ms"] for r in reps),
                "decode_step_p50_ms": statistics.fmean(r["decode_step_p50_ms"] for r in reps),
                "decode_step_p95_ms": statistics.fmean(r["decode_step_p95_ms"] for r in reps),
                "shared_sms_mean": statistics.fmean(r["shared_sms_mean"] for r in reps),
                "classes": _class_mean(reps),
                "sharing": reps[0]["sharing"],
            }
        points[pid] = row
    out: dict[str, Any] = {"items": per_item, "points": points, "headline": {}}
    head = out["headline"]
    for pid, row in points.items():
        if "horizon" not in row:
            continue
        base = {s: row[s] for s in BASELINES if s in row}
        h: dict[str, Any] = {"horizon": row["horizon"]["attainment"]}
        if base:
            best = max(base, key=lambda s: base[s]["attainment"])
            h["best_baseline"] = best
            h["best_baseline_attainment"] = base[best]["attainment"]
            b_att = base[best]["attainment"]
            h["ratio"] = row["horizon"]["attainment"] / b_att if b_att else None
            # The share of what the best baseline left on the table that HorizonServe gets.
            h["headroom_captured"] = (
                (row["horizon"]["attainment"] - b_att) / (1.0 - b_att) if b_att < 1.0 else None
            )
            h["baselines_run"] = sorted(base)
            h["p95_vs_best_per_class"] = _p95_reduction(row)
        if "fcfs" in row:
            v, hz = row["fcfs"], row["horizon"]
            h["ratio_vs_vanilla"] = hz["attainment"] / v["attainment"] if v["attainment"] else None
            h["tpot_vs_vanilla_ms"] = {
                "p50": hz["tpot_p50_ms"] - v["tpot_p50_ms"],
                "p95": hz["tpot_p95_ms"] - v["tpot_p95_ms"],
                "p50_pct": 100 * (hz["tpot_p50_ms"] / v["tpot_p50_ms"] - 1),
                "p95_pct": 100 * (hz["tpot_p95_ms"] / v["tpot_p95_ms"] - 1),
            }
        head[pid] = h
    out["spread"] = {
        f"{pid}/{s}": {
            "attainment_reps": v["attainment_reps"],
            "range_pp": 100 * (max(v["attainment_reps"]) - min(v["attainment_reps"])),
        }
        for pid, row in points.items()
        for s, v in row.items()
        if v["reps"] > 1
    }
    out["control"] = control_correlation(data)
    out["control_path"] = control_path(data)
    out["sim"] = sim_errors(data, points)
    return out


def control_path(data: dict[str, Any]) -> dict[str, Any]:
    """The shared stage's control path per step, timed inside the engine on the device (trace
    column `control_s`: pressure sample, downstream read, policy step, publish, batch
    formation), per system over every item that has it; `tax` = its share of the step time
    (control + prefill + decode)."""
    by_system: dict[str, list[tuple[float, float]]] = {}
    for it in data["items"].values():
        ix = {c: i for i, c in enumerate(it["columns"])}
        if "control_s" not in ix:
            continue
        rows = by_system.setdefault(it["meta"]["system"], [])
        for r in it["rows"]:
            ctl = r[ix["control_s"]]
            rows.append((ctl, ctl + r[ix["prefill_s"]] + r[ix["decode_s"]]))
    out: dict[str, Any] = {}
    for system, rows in by_system.items():
        ctl = sorted(c for c, _ in rows)
        out[system] = {
            "steps": len(rows),
            "p50_us": 1e6 * ctl[len(ctl) // 2],
            "p95_us": 1e6 * ctl[min(len(ctl) - 1, int(0.95 * len(ctl)))],
            "mean_us": 1e6 * statistics.fmean(ctl),
            "tax_pct": 100 * sum(ctl) / sum(t for _, t in rows),
        }
    return out


def _class_mean(reps: list[dict[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name in reps[0]["classes"]:
        cs = [r["classes"][name] for r in reps if name in r["classes"]]
        p95 = [c["p95_s"] for c in cs]
        out[name] = {
            "path": cs[0]["path"],
            "slo_s": cs[0]["slo_s"],
            "requests": cs[0]["requests"],
            "attainment": statistics.fmean(c["attainment"] for c in cs),
            "p50_s": mean_or_none([c["p50_s"] for c in cs]),
            "p95_s": mean_or_none(p95),  # None: censored (unanswered past the run's end)
            "p95_reps": p95,
        }
    return out


def _p95_reduction(row: dict[str, Any]) -> dict[str, Any]:
    """Per class: HorizonServe's p95 vs the best (lowest) baseline p95 of that class."""
    out: dict[str, Any] = {}
    hz = row["horizon"]["classes"]
    for name, c in hz.items():
        best_s, best = None, math.inf
        for s in BASELINES:
            if s in row and name in row[s]["classes"]:
                p = row[s]["classes"][name]["p95_s"]
                p = math.inf if p is None else p
                if p < best:
                    best_s, best = s, p
        h = math.inf if c["p95_s"] is None else c["p95_s"]
        red = None
        if math.isfinite(best) and math.isfinite(h):
            red = 100 * (1 - h / best)
        van = row.get("fcfs", {}).get("classes", {}).get(name, {}).get("p95_s")
        out[name] = {
            "horizon_p95_s": None if not math.isfinite(h) else h,
            "best_baseline": best_s,
            "best_p95_s": None if not math.isfinite(best) else best,
            "reduction_pct": red,
            "vanilla_p95_s": van,
            "vs_vanilla_pct": None if van is None or not math.isfinite(h) else 100 * (1 - h / van),
        }
    out["_summary"] = {
        "geomean_ratio_vs_best": _geomean(out, "best_p95_s"),
        "geomean_ratio_vs_best_long": _geomean(out, "best_p95_s", hz, "long"),
        "geomean_ratio_vs_best_short": _geomean(out, "best_p95_s", hz, "short"),
        "geomean_ratio_vs_vanilla": _geomean(out, "vanilla_p95_s"),
    }
    return out


def _geomean(
    per: dict[str, Any], key: str, classes: dict[str, Any] | None = None, path: str | None = None
) -> float | None:
    """Geometric mean over classes of HorizonServe p95 / the reference p95 (finite pairs)."""
    logs = []
    for name, v in per.items():
        if name.startswith("_") or (path and classes and classes[name]["path"] != path):
            continue
        h, b = v["horizon_p95_s"], v.get(key)
        if h and b:
            logs.append(math.log(h / b))
    return math.exp(statistics.fmean(logs)) if logs else None


def _pearson(x: list[float], y: list[float]) -> float | None:
    if len(x) < 3:
        return None
    mx, my = statistics.fmean(x), statistics.fmean(y)
    sx = math.sqrt(sum((a - mx) ** 2 for a in x))
    sy = math.sqrt(sum((b - my) ** 2 for b in y))
    if sx == 0 or sy == 0:
        return None
    return sum((a - mx) * (b - my) for a, b in zip(x, y, strict=True)) / (sx * sy)


def control_correlation(data: dict[str, Any]) -> dict[str, Any]:
    """Pearson r between the smoothed pressure B̂ and the shared stage's SM cap, per item that
    throttles (all steps with a pressure value, and steps with a downstream stage active)."""
    out: dict[str, Any] = {}
    for item_id, it in data["items"].items():
        if it["meta"]["system"] not in ("horizon", "horizon-no-rotation"):
            continue
        ix = {c: i for i, c in enumerate(it["columns"])}
        rows = [r for r in it["rows"] if r[ix["pressure"]] is not None]
        act = [r for r in rows if r[ix["downstream_active"]] > 0]
        levels = sorted({r[ix["shared_sms"]] for r in rows})
        out[item_id] = {
            "steps": len(rows),
            "r_all": _pearson(
                [r[ix["pressure"]] for r in rows], [r[ix["shared_sms"]] for r in rows]
            ),
            "r_downstream_active": _pearson(
                [r[ix["pressure"]] for r in act], [r[ix["shared_sms"]] for r in act]
            ),
            "sms_levels_used": {
                str(lv): sum(1 for r in rows if r[ix["shared_sms"]] == lv) / len(rows)
                for lv in levels
            },
            "pressure_p50": statistics.median(r[ix["pressure"]] for r in rows) if rows else None,
        }
    return out


def sim_errors(data: dict[str, Any], points: dict[str, Any]) -> dict[str, Any]:
    """Simulated − measured attainment (percentage points) per point × system, per sim file."""
    out: dict[str, Any] = {}
    for name, sim in data["sims"].items():
        rows = {}
        errs = []
        for pid, row in points.items():
            for system, m in row.items():
                s = sim.get("points", {}).get(pid, {}).get(system)
                if s is None or s.get("attainment") is None:
                    continue
                e = 100 * (s["attainment"] - m["attainment"])
                errs.append(abs(e))
                rows[f"{pid}/{system}"] = {
                    "measured": m["attainment"],
                    "simulated": s["attainment"],
                    "simulated_seeds": s.get("attainment_seeds"),
                    "error_pp": e,
                }
        out[name] = {
            "artifact": sim.get("artifact"),
            "caveat": sim.get("caveat"),
            "rows": rows,
            "mae_pp": statistics.fmean(errs) if errs else None,
        }
    return out


# -- tables -----------------------------------------------------------------------------------
def _p(x: float | None, digits: int = 1) -> str:
    return "—" if x is None else f"{100 * x:.{digits}f}"


def _ms(x: float | None) -> str:
    return "—" if x is None else f"{1e3 * x:.0f}"


def _point_rows(m: dict[str, Any], order: list[str]) -> Iterator[tuple[str, str, dict[str, Any]]]:
    """(point, system, its row) in report order: points by rate, systems in `order`."""
    for pid in sorted(m["points"], key=_point_key):
        row = m["points"][pid]
        for s in order:
            if s in row:
                yield pid, s, row[s]


def _n(x: float | None, fmt: str = ".2f") -> str:
    return "—" if x is None else format(x, fmt)


def _arrivals(plan: dict[str, Any]) -> str:
    points = plan_campaign(plan, "").points.values()
    shapes = sorted({p.burstiness for p in points})
    if shapes == [1.0]:
        return "Poisson."
    listed = " / ".join(f"{b:g}" for b in shapes)
    return f"bursty, gamma gaps of shape {listed} (1: Poisson; the gaps' CV is 1/√shape)."


def report_md(data: dict[str, Any], m: dict[str, Any]) -> str:
    plan = data["plan"]
    lines = [
        f"# Campaign report: {plan['pipeline']} on the reference engine (preset {plan['preset']})",
        "",
        "Measured on the device (not simulated) unless a table says SIMULATED. Generated by "
        "`bench/eval/report.py` from the raw records.",
        "",
        f"Calibration artifact: `{plan['artifact']['path']}` (sha256 "
        f"`{plan['artifact']['sha256'][:16]}…`, created {plan['artifact']['created']}).",
        "",
        "SLO (5 × solo p95, ms): "
        + ", ".join(f"{k} {1e3 * v:.0f}" for k, v in plan["slo"].items()),
        "",
        "Arrivals: " + _arrivals(plan),
        "",
        "Sessions: "
        + "; ".join(
            f"{s['name']}: {len(s['summary']['items'])} items, "
            f"{s['summary'].get('elapsed_s', 0):.0f} s, "
            f"{len(s['summary'].get('restarts', []))} stage starts"
            for s in data["sessions"]
        ),
        "",
    ]
    if data["control_newer"]:
        lines += [
            "HorizonServe ran with knobs newer than the plan at: "
            + ", ".join(f"{k}={v}" for k, v in sorted(data["control_newer"].items())),
            "",
        ]
    if data["foreign"]:
        lines += [
            "Left out (HorizonServe items of another plan or other knobs): "
            + ", ".join(data["foreign"]),
            "",
        ]
    lines += [
        "## Attainment per point and system (Figure 8)",
        "",
        "Steady state: arrivals after the first "
        f"{100 * WARMUP_FRACTION:.0f} % of the point (the warm-up window), short / long path.",
        "",
        "| point | system | sharing | reps | attainment % | short % | long % | steady % | "
        "TPOT p50/p95 ms | decode step p50/p95 ms | mean shared SMs |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    order = [*MAIN, *ABLATIONS]
    for pid, s, v in _point_rows(m, order):
        reps = "/".join(_p(a) for a in v["attainment_reps"])
        lines.append(
            f"| {pid} | {LABELS[s]} | {v['sharing']} | {v['reps']} | "
            f"{_p(v['attainment'])} ({reps}) | {_p(v['short_attainment'])} | "
            f"{_p(v['long_attainment'])} | {_p(v['steady_attainment'])} "
            f"({_p(v['steady_short_attainment'])} / {_p(v['steady_long_attainment'])}) | "
            f"{_n(v['tpot_p50_ms'], '.1f')}/"
            f"{_n(v['tpot_p95_ms'], '.1f')} | {_n(v['decode_step_p50_ms'], '.1f')}/"
            f"{_n(v['decode_step_p95_ms'], '.1f')} | {_n(v['shared_sms_mean'], '.0f')} |"
        )
    lines += [
        "",
        "## Per path: SLO-met goodput, late and never answered",
        "",
        "Goodput = requests that met their SLO per second of arrivals; late = answered after "
        "the SLO; never = not answered by the end of the point; underruns = speech playback "
        "stalls, a chunk arriving after the audio before it ran out (— : not recorded in these "
        "runs); means over repetitions.",
        "",
        "| point | system | short goodput req/s | short late | short never | "
        "long goodput req/s | long late | long never | underruns |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for pid, s, v in _point_rows(m, order):
        lines.append(
            f"| {pid} | {LABELS[s]} | "
            + " | ".join(
                f"{_n(v[f'{kind}_goodput_rps'], '.2f')} | {v[f'{kind}_late']:.0f} | "
                f"{v[f'{kind}_never']:.0f}"
                for kind in ("short", "long")
            )
            + f" | {_n(v['underruns'], '.0f')} |"
        )
    lines += ["", "## Headline", ""]
    for pid, h in sorted(m["headline"].items(), key=lambda kv: _point_key(kv[0])):
        lines.append(f"### {pid}")
        lines.append("")
        if "best_baseline" in h:
            lines.append(
                f"* HorizonServe {_p(h['horizon'])} % vs best baseline "
                f"{LABELS[h['best_baseline']]} {_p(h['best_baseline_attainment'])} % → ratio "
                f"**{_n(h['ratio'], '.3f')}** (baselines run here: "
                f"{', '.join(LABELS[b] for b in h['baselines_run'])})"
            )
            hr = h["headroom_captured"]
            vs_v = h.get("ratio_vs_vanilla")
            lines.append(
                "* headroom captured, (HorizonServe − best) / (100 − best): "
                f"{'—' if hr is None else f'{100 * hr:.0f} %'}; ratio against Vanilla "
                f"{'— (not run here)' if vs_v is None else f'{vs_v:.3f}'}"
            )
            g = h["p95_vs_best_per_class"]["_summary"]
            lines.append(
                "* per-class p95, HorizonServe / the best baseline of each class (geometric "
                f"mean over classes): all {_n(g['geomean_ratio_vs_best'], '.2f')}, long-path "
                f"{_n(g['geomean_ratio_vs_best_long'], '.2f')}, short-path "
                f"{_n(g['geomean_ratio_vs_best_short'], '.2f')}; vs Vanilla "
                f"{_n(g['geomean_ratio_vs_vanilla'], '.2f')} (< 1: HorizonServe lower)"
            )
        if "tpot_vs_vanilla_ms" in h:
            t = h["tpot_vs_vanilla_ms"]
            lines.append(
                f"* shared-stage TPOT vs Vanilla: p50 {t['p50']:+.2f} ms ({t['p50_pct']:+.1f} %), "
                f"p95 {t['p95']:+.2f} ms ({t['p95_pct']:+.1f} %)"
            )
        lines.append("")
    lines += ["## Per-class p95 first response (Figure 9), ms (— = censored)", ""]
    for pid in sorted(m["points"], key=_point_key):
        row = m["points"][pid]
        systems = [s for s in order if s in row]
        classes = list(row[systems[0]]["classes"])
        lines.append(f"**{pid}**")
        lines.append("")
        lines.append(
            "| class | SLO | " + " | ".join(LABELS[s] for s in systems) + " | HS vs best |"
        )
        lines.append("|---|---|" + "---|" * len(systems) + "---|")
        red = m["headline"].get(pid, {}).get("p95_vs_best_per_class", {})
        for c in classes:
            cells = [_ms(row[s]["classes"].get(c, {}).get("p95_s")) for s in systems]
            r = red.get(c, {}).get("reduction_pct")
            lines.append(
                f"| {c} | {_ms(row[systems[0]]['classes'][c]['slo_s'])} | "
                + " | ".join(cells)
                + f" | {'—' if r is None else f'{-r:+.0f} %'} |"
            )
        lines.append("")
    lines += ["## Spread between repetitions (same point, same requests)", ""]
    if m["spread"]:
        for k, v in m["spread"].items():
            reps = ", ".join(_p(a) for a in v["attainment_reps"])
            lines.append(f"* {k}: attainment {reps} % (range {v['range_pp']:.1f} pp)")
    else:
        lines.append("* no repeated point yet")
    lines += ["", "## Control loop (Figure 10)", ""]
    for k, v in m["control"].items():
        used = ", ".join(f"{lv}: {100 * f:.0f} %" for lv, f in v["sms_levels_used"].items())
        lines.append(
            f"* {k}: r(B̂, SM cap) = {_n(v['r_all'], '.3f')} over {v['steps']} steps, "
            f"{_n(v['r_downstream_active'], '.3f')} while downstream active; "
            f"B̂ p50 {_n(v['pressure_p50'], '.2f')}; SM levels used: {used}"
        )
    lines += ["", "## Simulator vs measured (SIMULATED rows from the same requests)", ""]
    for name, s in m["sim"].items():
        art = (s.get("artifact") or {}).get("path")
        lines.append(f"**{name}** (artifact `{art}`): mean |error| {_n(s['mae_pp'], '.1f')} pp")
        if s.get("caveat"):
            lines.append(f"\nCaveat: {s['caveat']}.")
        lines.append("")
        lines.append("| item | measured % | simulated % (seeds) | error pp |")
        lines.append("|---|---|---|---|")
        for k, r in s["rows"].items():
            seeds = "/".join(_p(a, 0) for a in (r["simulated_seeds"] or []))
            lines.append(
                f"| {k} | {_p(r['measured'])} | {_p(r['simulated'])} ({seeds}) | "
                f"{r['error_pp']:+.1f} |"
            )
        lines.append("")
    if m["control_path"]:
        lines += [
            "## Control path inside the engine (measured on the device, per shared-stage step)",
            "",
            "Pressure sample + downstream read + policy step + publish + batch formation, "
            "before the GPU work; `share of step` = its sum over the step time (control + "
            "prefill + decode), the throughput the controller costs the shared stage.",
            "",
            "| system | steps | p50 µs | p95 µs | mean µs | share of step % |",
            "|---|---|---|---|---|---|",
        ]
        for system, v in sorted(m["control_path"].items(), key=lambda kv: ALL.index(kv[0])):
            lines.append(
                f"| {LABELS[system]} | {v['steps']} | {v['p50_us']:.1f} | {v['p95_us']:.1f} | "
                f"{v['mean_us']:.1f} | {v['tax_pct']:.2f} |"
            )
        lines.append("")
    if data["overhead"]:
        lines += ["## Control-path overhead (Table 4 rows; CPU micro-benchmark)", ""]
        ov = data["overhead"]
        lines.append(f"{ov.get('where', '')}")
        lines.append("")
        lines.append("| waiting | annotation µs/req | view µs/step | SM cap µs/step |")
        lines.append("|---|---|---|---|")
        for n, v in ov["waiting"].items():
            lines.append(f"| {n} | {v['annotation']:.2f} | {v['view']:.2f} | {v['sm-cap']:.2f} |")
        lines.append("")
    return "\n".join(lines) + "\n"


def _long_share(plan: dict[str, Any], pid: str) -> float:
    """Long-path share of a point's mix, in % (the sweep's value, or the default mix's)."""
    point = plan["points"][pid]
    if point["long_ratio"] is not None:
        return 100 * point["long_ratio"]
    long = {c["name"] for c in plan["serving_config"]["slo"]["classes"] if c["path"] == "long"}
    return 100 * sum(w for c, w in point["mix"].items() if c in long)


def _point_key(pid: str) -> tuple[float, float]:
    rate, _, lr = pid.partition("-l")
    return (float(lr) if lr else -1.0, float(rate[1:]))


# -- plots ------------------------------------------------------------------------------------
def plots(data: dict[str, Any], m: dict[str, Any], run: Path) -> list[str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    made = []
    order = [*MAIN, *ABLATIONS]
    pts = sorted(m["points"], key=_point_key)

    # Figure 8: attainment. Curves once a sweep has ≥ 2 points, bars per point always.
    rate_pts = [p for p in pts if "-l" not in p]
    long_pts = [p for p in pts if "-l" in p]
    # The default mix at the long sweep's rate is one more point of that sweep.
    long_rates = {data["plan"]["points"][p]["rate"] for p in long_pts}
    long_pts += [p for p in rate_pts if data["plan"]["points"][p]["rate"] in long_rates]
    long_pts.sort(key=lambda p: _long_share(data["plan"], p))
    fig, axes = plt.subplots(1, 2, figsize=(11, 3.8))
    for ax, group, xlab in ((axes[0], rate_pts, "rate"), (axes[1], long_pts, "long")):
        systems = [s for s in MAIN if any(s in m["points"][p] for p in group)]
        if len(group) >= 2:
            for s in systems:
                xs, ys = [], []
                for p in group:
                    if s in m["points"][p]:
                        xs.append(
                            _point_key(p)[1] if xlab == "rate" else _long_share(data["plan"], p)
                        )
                        ys.append(100 * m["points"][p][s]["attainment"])
                ax.plot(xs, ys, "o-", color=COLORS[s], label=LABELS[s])
            ax.set_xlabel("arrival rate (req/s)" if xlab == "rate" else "long-path share (%)")
        else:
            w = 0.8 / max(1, len(systems))
            for k, s in enumerate(systems):
                for j, p in enumerate(group):
                    if s not in m["points"][p]:
                        continue
                    v = m["points"][p][s]
                    reps = [100 * a for a in v["attainment_reps"]]
                    y = 100 * v["attainment"]
                    err = [[y - min(reps)], [max(reps) - y]]
                    ax.bar(j + k * w, y, w, color=COLORS[s], yerr=err, capsize=3,
                           label=LABELS[s] if j == 0 else None)  # fmt: skip
            ax.set_xticks([j + 0.4 - w / 2 for j in range(len(group))], group)
            lo = min(
                (100 * m["points"][p][s]["attainment"] for p in group for s in systems
                 if s in m["points"][p]),
                default=0,
            )  # fmt: skip
            ax.set_ylim(max(0, lo - 15), 100)
        ax.set_ylabel("SLO attainment (%)")
        ax.set_title("arrival-rate sweep" if xlab == "rate" else "long-path sweep (rate 6)")
        ax.grid(axis="y", alpha=0.3)
        if systems:
            ax.legend(fontsize=7, loc="lower left")
    fig.suptitle("Attainment, measured on the H200 (reference engine, Qwen2.5-Omni-shaped)")
    fig.tight_layout()
    made.append(_save(fig, run / "fig8_attainment.png"))

    # Figure 9: per-class p95 (log), SLO marks.
    fig, axes = plt.subplots(len(pts), 1, figsize=(12, 3.6 * len(pts)), squeeze=False)
    for ax, p in zip(axes[:, 0], pts, strict=True):
        row = m["points"][p]
        systems = [s for s in MAIN if s in row]
        classes = list(row[systems[0]]["classes"])
        w = 0.8 / len(systems)
        for k, s in enumerate(systems):
            ys = []
            for c in classes:
                v = row[s]["classes"].get(c, {}).get("p95_s")
                ys.append(math.nan if v is None else v)
            ax.bar([i + k * w for i in range(len(classes))], ys, w, color=COLORS[s],
                   label=LABELS[s])  # fmt: skip
            cens = [i for i, y in enumerate(ys) if math.isnan(y)]
            for i in cens:
                ax.text(i + k * w, 0.02, "∞", ha="center", fontsize=7, color=COLORS[s])
        for i, c in enumerate(classes):
            slo = row[systems[0]]["classes"][c]["slo_s"]
            ax.hlines(slo, i - w / 2, i + 0.8 - w / 2, colors="k", linestyles="--", lw=1)
        ax.set_yscale("log")
        ax.set_xticks([i + 0.4 - w / 2 for i in range(len(classes))], classes, fontsize=8)
        ax.set_ylabel("p95 first response (s)")
        ax.set_title(f"{p}: per-class p95 incl. queueing (dashed: SLO; ∞: not answered by run end)")
        ax.grid(axis="y", alpha=0.3)
        ax.legend(fontsize=7, ncol=5)
    fig.tight_layout()
    made.append(_save(fig, run / "fig9_p95.png"))

    # Figure 10: control trace of the first HorizonServe item.
    horizon_items = [k for k in data["items"] if data["items"][k]["meta"]["system"] == "horizon"]
    ctl = min(horizon_items, key=lambda k: (_point_key(k.split("/")[0]), k), default=None)
    if ctl is not None:
        it = data["items"][ctl]
        ix = {c: i for i, c in enumerate(it["columns"])}
        rows = it["rows"]
        binned = _bin(rows, ix, 0.25)
        slacks = "shared_slack" in ix  # traces from before the split's inputs were recorded
        fig, ax = plt.subplots(4 if slacks else 3, 1, figsize=(11, 8.5 if slacks else 6.5),
                               sharex=True)  # fmt: skip
        t = [b[0] for b in binned]
        ax[0].step(t, [b[1] for b in binned], where="post", color="#2ca02c")
        ax[0].set_ylabel("downstream requests\n(in the speech stage)")
        ax[1].plot(t, [b[2] for b in binned], color="#1f77b4")
        b_sat = data["plan"]["serving_config"]["control"]["b_sat"]
        ax[1].axhline(b_sat, color="k", ls="--", lw=0.8)
        ax[1].text(t[0], b_sat, f" B_sat {b_sat:g}", va="bottom", fontsize=7)
        ax[1].set_ylabel("smoothed NVML\nmemory activity B̂")
        ax[2].step(t, [b[3] for b in binned], where="post", color="#d62728")
        ax[2].set_ylabel("shared-stage SMs")
        if slacks:
            ax[3].plot(t, [b[4] for b in binned], color="#1f77b4", label="shared side")
            ax[3].plot(t, [b[5] for b in binned], color="#ff7f0e", label="downstream side")
            ax[3].set_ylabel("most urgent\nslack ratio u")
            ax[3].legend(fontsize=7, loc="upper right")
        ax[-1].set_xlabel("time since the first arrival (s)")
        c = m["control"].get(ctl, {})
        ax[0].set_title(
            f"{ctl}: r(B̂, SM cap) = {_n(c.get('r_all'), '.3f')} (all steps), "
            f"{_n(c.get('r_downstream_active'), '.3f')} (downstream active); 0.25-s means"
        )
        fig.tight_layout()
        made.append(_save(fig, run / "fig10_control.png"))

    # Figure 11: ablations at points that have them.
    abl_pts = [p for p in pts if "horizon" in m["points"][p]
               and any(a in m["points"][p] for a in ABLATIONS)]  # fmt: skip
    if abl_pts:
        fig, axes = plt.subplots(1, len(abl_pts), figsize=(6 * len(abl_pts), 3.6),
                                 squeeze=False)  # fmt: skip
        for ax, p in zip(axes[0], abl_pts, strict=True):
            row = m["points"][p]
            systems = [s for s in ("horizon", *ABLATIONS) if s in row]
            keys = ("attainment", "short_attainment", "long_attainment")
            w = 0.8 / len(systems)
            for k, s in enumerate(systems):
                ys = [100 * row[s][key] for key in keys]
                err = None
                if row[s]["reps"] > 1:
                    reps = [100 * a for a in row[s]["attainment_reps"]]
                    err = [[ys[0] - min(reps), 0, 0], [max(reps) - ys[0], 0, 0]]
                ax.bar([i + k * w for i in range(3)], ys, w, color=COLORS[s], yerr=err,
                       capsize=3, label=LABELS[s])  # fmt: skip
            ax.set_xticks([i + 0.4 - w / 2 for i in range(3)], ["all", "short path", "long path"])
            ax.set_ylim(50, 100)
            ax.set_ylabel("SLO attainment (%)")
            ax.set_title(f"ablation at {p}")
            ax.grid(axis="y", alpha=0.3)
            ax.legend(fontsize=7, loc="lower left")
        fig.tight_layout()
        made.append(_save(fig, run / "fig11_ablation.png"))

    # Table 3 as bars: shared-stage TPOT p50/p95 per system.
    fig, axes = plt.subplots(1, len(pts), figsize=(5.5 * len(pts), 3.4), squeeze=False)
    for ax, p in zip(axes[0], pts, strict=True):
        row = m["points"][p]
        systems = [s for s in order if s in row]
        x = range(len(systems))
        ax.bar([i - 0.2 for i in x], [row[s]["tpot_p50_ms"] for s in systems], 0.4,
               color=[COLORS[s] for s in systems], label="p50")  # fmt: skip
        ax.bar([i + 0.2 for i in x], [row[s]["tpot_p95_ms"] for s in systems], 0.4,
               color=[COLORS[s] for s in systems], alpha=0.5, hatch="//", label="p95")  # fmt: skip
        ax.set_xticks(list(x), [LABELS[s] for s in systems], rotation=30, ha="right", fontsize=7)
        ax.set_ylabel("shared-stage TPOT (ms/token)")
        ax.set_title(f"{p}: per-request TPOT p50 (solid) / p95 (hatched)")
        ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    made.append(_save(fig, run / "table3_tpot.png"))

    # Simulator vs measured.
    if m["sim"]:
        fig, ax = plt.subplots(figsize=(5, 5))
        marks = ["o", "s", "^", "D"]
        for k, (name, s) in enumerate(m["sim"].items()):
            for key, r in s["rows"].items():
                system = key.split("/")[1]
                ax.scatter(100 * r["measured"], 100 * r["simulated"], color=COLORS[system],
                           marker=marks[k % len(marks)], s=30)  # fmt: skip
            ax.scatter([], [], color="k", marker=marks[k % len(marks)],
                       label=f"{name} (MAE {_n(s['mae_pp'], '.1f')} pp)")  # fmt: skip
        ax.plot([0, 100], [0, 100], "k--", lw=0.8)
        ax.set_xlabel("measured attainment (%)")
        ax.set_ylabel("SIMULATED attainment (%)")
        ax.set_xlim(0, 102)
        ax.set_ylim(0, 102)
        ax.legend(fontsize=7, loc="lower right")
        ax.set_title("simulator vs H200 (colour = system)")
        fig.tight_layout()
        made.append(_save(fig, run / "sim_vs_measured.png"))
    plt.close("all")
    return made


def _bin(rows: list[list[Any]], ix: dict[str, int], width: float) -> list[tuple[float, ...]]:
    """Per `width`-s bin: start, mean downstream requests, mean B̂, mean shared SMs, and the
    smallest slack ratio each side offered the split (NaN: none, or a trace without them)."""

    def lowest(rs: list[list[Any]], col: str) -> float:
        us = [r[ix[col]] for r in rs if r[ix[col]] is not None] if col in ix else []
        return min(us) if us else math.nan

    bins: dict[int, list[list[Any]]] = {}
    for r in rows:
        bins.setdefault(int(r[ix["t"]] // width), []).append(r)
    out = []
    for b in sorted(bins):
        rs = bins[b]
        pr = [r[ix["pressure"]] for r in rs if r[ix["pressure"]] is not None]
        out.append(
            (
                b * width,
                statistics.fmean(r[ix["downstream_active"]] for r in rs),
                statistics.fmean(pr) if pr else math.nan,
                statistics.fmean(r[ix["shared_sms"]] for r in rs),
                lowest(rs, "shared_slack"),
                lowest(rs, "downstream_slack"),
            )
        )
    return out


def _save(fig: Any, path: Path) -> str:
    return save_png(fig, path)


def _clean(x: Any) -> Any:
    if isinstance(x, float) and not math.isfinite(x):
        return None
    if isinstance(x, dict):
        return {k: _clean(v) for k, v in x.items()}
    if isinstance(x, list):
        return [_clean(v) for v in x]
    return x


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("run", type=Path, help="results folder of one campaign")
    ap.add_argument("--no-plots", action="store_true")
    args = ap.parse_args(argv)
    data = load_run(args.run)
    if not data["items"]:
        print(f"{args.run}: no finished items")
        return 1
    m = metrics(data)
    (args.run / "results.json").write_text(
        json.dumps(_clean(m), indent=1, allow_nan=False, default=str) + "\n"
    )
    (args.run / "report.md").write_text(report_md(data, m))
    made = [] if args.no_plots else plots(data, m, args.run)
    print(f"{args.run}: {len(data['items'])} items; wrote results.json, report.md, {made}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
