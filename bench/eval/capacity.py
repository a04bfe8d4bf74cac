"""Capacity, the sustainable rate at a target attainment, from the committed GPU reports.

    python bench/eval/capacity.py bench/results/h200-eval/capacity/spec.json

The spec names, for each pipeline and system, the measured items that make each rate's point
(REPORT/ITEM: a campaign folder beside the spec's parent, whose results.json report.py
recomputed from the raw records; repetitions of one rate are averaged). Writes, beside the
spec: capacity.md (the tables), capacity.json (the same figures) and capacity.png (attainment
against rate per pipeline, overall and per path). Measured figures, and beside them, labelled
SIMULATED, the capacity `horizonserve sim plan --slo-plan` predicts for the same SLO table
where the spec names its JSON (`sim_plan`).

The planner's capacity differs from the measured one for two reasons, which the tables keep
apart: the model (a simulated point is not the measured one) and the reading (the planner
bisects to 2 %, a sweep interpolates linearly between rates up to 2 req/s apart, and attainment
is not linear there). The simulator's attainment on each measured item's own requests, which
report.py stores beside it, read with the sweep's linear rule, is the model alone; the planner
against that is the reading alone.

A sweep's capacity is read where attainment first falls below the target going up in rate,
linear between the two measured rates around it. Where no measured rate brackets it, the
sweep gives a bound only (at least its highest rate, or below its lowest). The best baseline
is the highest capacity or lower bound; a baseline
bounded only from above by a rate higher than the best capacity is listed as not excluded, and
the ratio is given only where both capacities are bracketed.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import statistics
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from campaign import LABELS
from report import COLORS

HORIZON = "horizon"
VANILLA = "fcfs"
SHIPPED_ARTIFACT = "runtime/data/calibration/h200-fitted.json"  # what the planner runs on


@dataclass(frozen=True, slots=True)
class Point:
    """One rate of one system's sweep: the mean over its repetitions."""

    rate: float
    attainment: float
    short: float
    long: float
    reps: tuple[float, ...]  # each repetition's attainment
    late: int  # requests answered after their SLO (first repetition)
    never: int  # requests never answered by the end of the point (first repetition)
    sources: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class Capacity:
    """The sustainable rate: `rate` exactly (bound '='), at least it ('>=') or below it ('<')."""

    rate: float
    bound: str
    bracket: tuple[float, float] | None  # the measured rates it lies between

    def text(self) -> str:
        prefix = {"=": "", ">=": "≥ ", "<": "< "}[self.bound]
        return f"{prefix}{self.rate:.2f} req/s"


def capacity(points: list[Point], target: float) -> Capacity:
    """Where attainment first falls below `target` going up in rate (module docstring)."""
    pts = sorted(points, key=lambda p: p.rate)
    for i, p in enumerate(pts):
        if p.attainment >= target:
            continue
        if i == 0:
            return Capacity(p.rate, "<", None)
        q = pts[i - 1]
        rate = q.rate + (p.rate - q.rate) * (q.attainment - target) / (q.attainment - p.attainment)
        return Capacity(rate, "=", (q.rate, p.rate))
    return Capacity(pts[-1].rate, ">=", None)


def rep_range(points: list[Point], target: float) -> tuple[float, float]:
    """The capacity read from every point's lowest, then highest repetition: the spread of
    the repeated points carried into the capacity (equal ends where nothing is repeated)."""
    ends = []
    for pick in (min, max):
        pts = [dataclasses.replace(p, attainment=pick(p.reps)) for p in points]
        ends.append(capacity(pts, target).rate)
    return ends[0], ends[1]


def best_baseline(caps: dict[str, Capacity]) -> tuple[str | None, list[str]]:
    """The baseline with the highest capacity (a lower bound counts at its rate; an exact
    value wins a tie), and the baselines not shown below it: bounded only from above by a
    rate above it."""
    pool = {s: c for s, c in caps.items() if s != HORIZON and c.bound != "<"}
    if not pool:
        return None, sorted(s for s in caps if s != HORIZON)
    best = max(pool, key=lambda s: (pool[s].rate, pool[s].bound == "="))
    top = pool[best].rate
    open_ = sorted(s for s, c in caps.items() if c.bound == "<" and c.rate > top and s != HORIZON)
    return best, open_


class Reports:
    """The spec and the reports' results.json, each read once; builds a point from the items
    the spec names."""

    def __init__(self, spec_path: Path) -> None:
        self.spec_path = spec_path
        self.spec: dict[str, Any] = json.loads(spec_path.read_text())
        self.root = spec_path.resolve().parent.parent
        self._results: dict[str, dict[str, Any]] = {}
        shipped = Path(__file__).resolve().parents[2] / SHIPPED_ARTIFACT
        self.shipped_sha = hashlib.sha256(shipped.read_bytes()).hexdigest()

    def _report(self, report: str) -> dict[str, Any]:
        if report not in self._results:
            self._results[report] = json.loads((self.root / report / "results.json").read_text())
        return self._results[report]

    def simulated(self, point: Point) -> float | None:
        """SIMULATED: the shipped artifact's attainment on the requests of `point`'s items
        (report.py's sim rows; repetitions share their requests), or None where a report has
        no row for an item on today's shipped artifact."""
        values = []
        for src in point.sources:
            report, item = src.split("/", 1)
            key = item.rsplit("/", 1)[0]  # r6/edf-mps/rep1 -> r6/edf-mps
            rows = [
                block["rows"][key]
                for block in self._report(report).get("sim", {}).values()
                if block["artifact"]["path"] == SHIPPED_ARTIFACT
                and block["artifact"].get("sha256") == self.shipped_sha
                and key in block["rows"]
            ]
            if not rows:
                return None
            values.append(rows[0]["simulated"])
        return statistics.fmean(values)

    def point(self, where: str, x: float, ids: tuple[str, ...], sources: list[str]) -> Point:
        """The mean of `sources` (REPORT/ITEM), each an item of one of the point ids `ids`
        (`r6`, `r6-l60`) and of the system `where` names last."""
        system = where.rsplit(" ", 1)[-1]
        items = []
        for src in sources:
            report, item = src.split("/", 1)
            try:
                items.append(self._report(report)["items"][item])
            except KeyError:
                raise SystemExit(
                    f"{self.spec_path}: {where}: {src} is not in {report}/results.json "
                    "(run report.py there)"
                ) from None
            pid, item_system, _rep = item.split("/")
            if pid not in ids or item_system != system:
                raise SystemExit(
                    f"{self.spec_path}: {where}: {src} is another point's or system's item "
                    f"(expected {' or '.join(ids)} of {system})"
                )
        first = items[0]
        return Point(
            rate=x,
            attainment=statistics.fmean(i["attainment"] for i in items),
            short=statistics.fmean(i["short_attainment"] for i in items),
            long=statistics.fmean(i["long_attainment"] for i in items),
            reps=tuple(i["attainment"] for i in items),
            late=first["short_late"] + first["long_late"],
            never=first["short_never"] + first["long_never"],
            sources=tuple(sources),
        )


def load_points(reports: Reports) -> dict[str, dict[str, list[Point]]]:
    """Every pipeline's rate sweeps: system → points, read from the reports the spec names."""
    out: dict[str, dict[str, list[Point]]] = {}
    for pipe, p in reports.spec["pipelines"].items():
        out[pipe] = {}
        for system, rates in p["systems"].items():
            pts = [
                reports.point(f"{pipe} {rate} req/s {system}", float(rate), (f"r{rate}",), src)
                for rate, src in rates.items()
            ]
            out[pipe][system] = sorted(pts, key=lambda x: x.rate)
    return out


def load_long_path(reports: Reports) -> dict[str, dict[str, Any]]:
    """Every pipeline's long-path sweep at one rate: share → system → point (`rate` holds the
    share). The default mix's share is also its plain rate point (the same requests)."""
    out: dict[str, dict[str, Any]] = {}
    for pipe, p in reports.spec["pipelines"].items():
        sweep = p.get("long_path")
        if sweep is None:
            continue
        rate, default = sweep["rate"], sweep["default_share"]
        shares: dict[str, dict[str, Point]] = {}
        for share, systems in sweep["shares"].items():
            x = float(share)
            ids = (f"r{rate}-l{round(100 * x)}", *((f"r{rate}",) if x == default else ()))
            shares[share] = {
                system: reports.point(f"{pipe} {share} long {system}", x, ids, src)
                for system, src in systems.items()
            }
        out[pipe] = {"rate": rate, "default_share": default, "shares": shares}
    return out


def compare(points: dict[str, Point], past_below: float) -> dict[str, Any] | None:
    """HorizonServe against the best baseline measured at the same point (None: no rival)."""
    hs = points.get(HORIZON)
    rivals = {s: q for s, q in points.items() if s != HORIZON}
    if hs is None or not rivals:
        return None
    b = max(rivals, key=lambda s: rivals[s].attainment)
    ba = rivals[b].attainment
    van = rivals.get(VANILLA)
    return {
        "rate": hs.rate,
        "horizon": hs.attainment,
        "best": b,
        "best_attainment": ba,
        "ratio": hs.attainment / ba if ba > 0 else None,
        "headroom_captured": (hs.attainment - ba) / (1 - ba) if ba < 1 else None,
        "vs_vanilla": hs.attainment / van.attainment if van and van.attainment > 0 else None,
        "past_capacity": ba <= past_below,
        "horizon_late_never": [hs.late, hs.never],
        "best_late_never": [rivals[b].late, rivals[b].never],
    }


def summarise(spec_path: Path) -> dict[str, Any]:
    """The capacities, the ratio to the best baseline, and the per-rate comparisons."""
    reports = Reports(spec_path)
    spec, root = reports.spec, reports.root
    target, past_below = spec["target"], spec["past_capacity_below"]
    sweeps = load_points(reports)
    long_path = load_long_path(reports)
    out: dict[str, Any] = {"target": target, "past_capacity_below": past_below, "pipelines": {}}
    for pipe, systems in sweeps.items():
        caps = {s: capacity(pts, target) for s, pts in systems.items()}
        best, open_ = best_baseline(caps)
        hs = caps[HORIZON]
        ratio, ratio_range = None, None
        if best is not None and hs.bound == "=" and caps[best].bound == "=":
            ratio = hs.rate / caps[best].rate
            lo, hi = rep_range(systems[HORIZON], target), rep_range(systems[best], target)
            ratio_range = (lo[0] / hi[1], lo[1] / hi[0])
        rows = []
        for p in systems[HORIZON]:
            at_rate = {s: q for s, pts in systems.items() for q in pts if q.rate == p.rate}
            row = compare(at_rate, past_below)
            if row is not None:
                rows.append(row)
        out["pipelines"][pipe] = {
            "label": spec["pipelines"][pipe]["label"],
            "capacity": {s: asdict(c) for s, c in caps.items()},
            "best_baseline": best,
            "not_excluded": open_,
            "ratio": ratio,
            "ratio_range": ratio_range,
            "points": {s: [asdict(p) for p in pts] for s, pts in systems.items()},
            "same_rate": rows,
            "simulated": _simulated(root, spec["pipelines"][pipe].get("sim_plan"), caps),
            "simulated_ships": _simulated(
                root, spec["pipelines"][pipe].get("sim_plan_ships"), caps
            ),
            "error_sources": _error_sources(reports, systems, caps, target),
            "simulated_points": _simulated(
                root, spec["pipelines"][pipe].get("sim_plan_points"), caps
            ),
            "long_path": _long_path_rows(long_path.get(pipe), past_below),
            "notes": spec["pipelines"][pipe].get("notes", []),
        }
    return out


def _long_path_rows(sweep: dict[str, Any] | None, past_below: float) -> dict[str, Any] | None:
    if sweep is None:
        return None
    return {
        "rate": sweep["rate"],
        "default_share": sweep["default_share"],
        "points": {
            share: {s: asdict(p) for s, p in pts.items()} for share, pts in sweep["shares"].items()
        },
        "compare": {share: compare(pts, past_below) for share, pts in sweep["shares"].items()},
    }


def _simulated(root: Path, sim_plan: str | None, caps: dict[str, Capacity]) -> dict[str, Any]:
    """SIMULATED: `horizonserve sim plan --json` for the sweep's systems, and its error against
    each bracketed measured capacity (relative)."""
    if sim_plan is None:
        return {}
    plan = json.loads((root / sim_plan).read_text())
    rates = {x["system"]: x["rate_ok"] for x in plan["systems"] if x["system"] in caps}
    return {
        "label": "SIMULATED",
        "source": sim_plan,
        "capacity": rates,
        "error": {s: r / caps[s].rate - 1 for s, r in rates.items() if caps[s].bound == "=" and r},
    }


def _error_sources(
    reports: Reports, systems: dict[str, list[Point]], caps: dict[str, Capacity], target: float
) -> dict[str, Any]:
    """SIMULATED, per system: the simulator's attainment on each measured item's requests and
    the capacity the sweep's linear rule reads from it (module docstring). `model` is that
    capacity against the measured one; the planner's figure is compared with it by the
    reader (`_error_sources_md`). None for a system with a point no current row covers."""
    out: dict[str, Any] = {}
    for system, pts in systems.items():
        sims = [reports.simulated(p) for p in pts]
        if any(v is None for v in sims):
            out[system] = None
            continue
        same = capacity(
            [dataclasses.replace(p, attainment=v) for p, v in zip(pts, sims, strict=True)], target
        )
        exact = same.bound == "=" and caps[system].bound == "="
        out[system] = {
            "points": [[p.rate, p.attainment, v] for p, v in zip(pts, sims, strict=True)],
            "capacity": asdict(same),
            "model": same.rate / caps[system].rate - 1 if exact else None,
        }
    return out


def _pct(x: float | None) -> str:
    return "—" if x is None else f"{100 * x:.1f}"


def _cap(c: dict[str, Any]) -> Capacity:
    return Capacity(c["rate"], c["bound"], tuple(c["bracket"]) if c["bracket"] else None)


def capacity_md(s: dict[str, Any]) -> str:
    t = s["target"]
    lines = [
        "# Capacity on the H200 (measured)",
        "",
        f"Sustainable rate at {100 * t:.0f} % attainment, linear between the two measured rates "
        "around the crossing; a sweep that does not bracket it gives a bound. Generated by "
        "`python bench/eval/capacity.py bench/results/h200-eval/capacity/spec.json` from the "
        "reports' results.json (each recomputed from raw records by report.py); spec.json names "
        "the items. The last column is SIMULATED: `horizonserve sim plan --slo-plan` on the "
        "sweep's SLO table (the JSON spec.json names; README.md beside it has the commands), "
        "its error relative to the measured capacity in brackets.",
        "",
        "| pipeline | HorizonServe | best baseline | ratio | baselines not shown below the best "
        "| `sim plan` HorizonServe / best (SIMULATED; error) |",
        "|---|---|---|---|---|---|",
    ]
    for p in s["pipelines"].values():
        caps = {k: _cap(v) for k, v in p["capacity"].items()}
        best = p["best_baseline"]
        best_txt = f"{LABELS[best]} {caps[best].text()}" if best else "—"
        ratio = f"**{p['ratio']:.2f}×**" if p["ratio"] else "—"
        lo, hi = p["ratio_range"] or (None, None)
        if lo is not None and f"{lo:.2f}" != f"{hi:.2f}":
            ratio += f" ({lo:.2f}–{hi:.2f} over the repetitions)"
        open_ = ", ".join(f"{LABELS[o]} ({caps[o].text()})" for o in p["not_excluded"]) or "none"
        lines.append(
            f"| {p['label']} | {caps[HORIZON].text()} | {best_txt} | {ratio} | {open_} "
            f"| {_sim_cell(p['simulated'], [HORIZON, best])} |"
        )
    ships = [
        f"{p['label']} {_sim_cell(p['simulated_ships'], [HORIZON, p['best_baseline']])}"
        for p in s["pipelines"].values()
        if p["simulated_ships"]
    ]
    if ships:
        lines += ["", "SIMULATED, HorizonServe as it ships now (control knobs newer than the GPU "
                  "runs at their defaults; `sim_plan_ships` in spec.json), HorizonServe / the "
                  "same baseline, error against the measured capacity: " + "; ".join(ships)
                  + "."]  # fmt: skip
    lines += _error_sources_md(s)
    for p in s["pipelines"].values():
        lines += ["", f"## {p['label']}", "",
                  "Attainment % at each measured rate (short / long path; repetitions in "
                  "brackets):",
                  "", "| system | capacity | " + " | ".join(
                      f"{r:g} req/s" for r in _rates(p)) + " |",
                  "|---|---|" + "---|" * len(_rates(p))]  # fmt: skip
        for system, pts in p["points"].items():
            by_rate = {q["rate"]: q for q in pts}
            cells = []
            for r in _rates(p):
                q = by_rate.get(r)
                if q is None:
                    cells.append("")
                    continue
                reps = f" [{', '.join(_pct(x) for x in q['reps'])}]" if len(q["reps"]) > 1 else ""
                cells.append(
                    f"{_pct(q['attainment'])} ({_pct(q['short'])} / {_pct(q['long'])}){reps}"
                )
            name = f"**{LABELS[system]}**" if system == HORIZON else LABELS[system]
            cap = _cap(p["capacity"][system]).text()
            sim = p["simulated"].get("capacity", {}).get(system)
            cap += f" (SIMULATED {sim:.2f})" if sim is not None else ""
            lines.append(f"| {name} | {cap} | " + " | ".join(cells) + " |")
        lines += ["", "Against the best baseline measured at the same rate:", "",
                  "| rate | HorizonServe | best there | ratio | headroom captured | vs Vanilla "
                  "| late / never answered, first run (HS; best) |",
                  "|---|---|---|---|---|---|---|"]  # fmt: skip
        for row in p["same_rate"]:
            past = " (past capacity)" if row["past_capacity"] else ""
            ratio = f"{row['ratio']:.2f}×" if row["ratio"] else "—"
            van = f"{row['vs_vanilla']:.2f}×" if row["vs_vanilla"] else "—"
            hl, bl = row["horizon_late_never"], row["best_late_never"]
            lines.append(
                f"| {row['rate']:g}{past} | {_pct(row['horizon'])} | {LABELS[row['best']]} "
                f"{_pct(row['best_attainment'])} | {ratio} | {_pct(row['headroom_captured'])} % "
                f"| {van} | {hl[0]} / {hl[1]}; {bl[0]} / {bl[1]} |"
            )
        if p["long_path"]:
            lines += _long_path_md(p["long_path"])
        if p["notes"]:
            lines += ["", *(f"* {n}" for n in p["notes"])]
    return "\n".join(lines) + "\n"


def _error_sources_md(s: dict[str, Any]) -> list[str]:
    lines = ["", "## Where the planner's error comes from", "",
             "SIMULATED beside measured; each SIMULATED capacity's change against the column "
             "before it in brackets. *Same requests*: the simulator (today's shipped artifact) "
             "on each measured item's own requests, read with the sweep's linear rule: its "
             "change is the model's error. *Campaign-length points*: `sim plan` bisecting on "
             "points as long as the campaign's (`sim_plan_points` in spec.json; each rate's "
             "attainment the mean over several seeds): its change is the linear reading between "
             "the sweep's rates (and the other requests). *Long points*: `sim plan` as in the "
             "first table (HorizonServe as it ships): its change is what a longer point costs a "
             "backlog that is still growing at the end of a campaign's point. Attainment % per "
             "rate: measured / SIMULATED on the same requests.", "",
             "| pipeline | system | measured / SIMULATED attainment % by rate | measured "
             "capacity | same requests | campaign-length points | long points |",
             "|---|---|---|---|---|---|---|"]  # fmt: skip
    for p in s["pipelines"].values():
        points = p["simulated_points"].get("capacity", {})
        for system, e in p["error_sources"].items():
            if e is None:
                continue
            same = _cap(e["capacity"])
            long_plan = p["simulated_ships" if system == HORIZON else "simulated"]
            long_ = long_plan.get("capacity", {}).get(system)
            pts = ", ".join(f"{r:g}: {_pct(m)} / {_pct(v)}" for r, m, v in e["points"])
            model = "" if e["model"] is None else f" ({100 * e['model']:+.0f} %)"
            lines.append(
                f"| {p['label']} | {LABELS[system]} | {pts} | {_cap(p['capacity'][system]).text()}"
                f" | {same.text()}{model} | {_step(points.get(system), same)} | "
                f"{_step(long_, Capacity(points[system], '=', None) if system in points else None)}"
                " |"
            )
    return lines


def _step(rate: float | None, before: Capacity | None) -> str:
    """A planned capacity and its change against `before` where that is exact."""
    if rate is None:
        return "—"
    if before is None or before.bound != "=" or not before.rate:
        return f"{rate:.2f} req/s"
    return f"{rate:.2f} req/s ({100 * (rate / before.rate - 1):+.0f} %)"


def _long_path_md(lp: dict[str, Any]) -> list[str]:
    shares = sorted(lp["points"], key=float)
    systems = list(dict.fromkeys(s for sh in shares for s in lp["points"][sh]))
    lines = ["", f"Long-path sweep at {lp['rate']:g} req/s (share of long-path requests; the "
             f"default mix is the {100 * lp['default_share']:.0f} % point, the same requests "
             "as the rate sweep's), attainment % (short / long path):", "",
             "| system | " + " | ".join(f"{100 * float(sh):.0f} %" for sh in shares) + " |",
             "|---|" + "---|" * len(shares)]  # fmt: skip
    for system in systems:
        cells = []
        for sh in shares:
            q = lp["points"][sh].get(system)
            cells.append(
                ""
                if q is None
                else f"{_pct(q['attainment'])} ({_pct(q['short'])} / {_pct(q['long'])})"
            )
        name = f"**{LABELS[system]}**" if system == HORIZON else LABELS[system]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    cells = []
    for sh in shares:
        row = lp["compare"][sh]
        cells.append(
            "not measured"
            if row is None
            else f"{row['ratio']:.2f}× {LABELS[row['best']]}, headroom "
            f"{_pct(row['headroom_captured'])} %"
        )
    lines.append("| HS / best there | " + " | ".join(cells) + " |")
    return lines


def _sim_cell(sim: dict[str, Any], systems: list[str | None]) -> str:
    cap, err = sim.get("capacity", {}), sim.get("error", {})
    cells = []
    for system in systems:
        if system not in cap:
            cells.append("—")
            continue
        e = f" ({100 * err[system]:+.0f} %)" if system in err else ""
        cells.append(f"{cap[system]:.2f}{e}")
    return " / ".join(cells) + " req/s" if cap else "—"


def _rates(p: dict[str, Any]) -> list[float]:
    return sorted({q["rate"] for pts in p["points"].values() for q in pts})


def plot(s: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    pipes = list(s["pipelines"].values())
    fig, axes = plt.subplots(2, len(pipes), figsize=(5.2 * len(pipes), 7.4), squeeze=False)
    for col, p in enumerate(pipes):
        top, bottom = axes[0][col], axes[1][col]
        for system, pts in p["points"].items():
            rates = [q["rate"] for q in pts]
            hs = system == HORIZON
            style = {"color": COLORS[system], "marker": "o", "lw": 2.4 if hs else 1.4}
            top.plot(rates, [100 * q["attainment"] for q in pts], label=LABELS[system], **style)
            if hs or system == p["best_baseline"]:
                bottom.plot(rates, [100 * q["short"] for q in pts], ls="--",
                            label=f"{LABELS[system]}, short path", **style)  # fmt: skip
                bottom.plot(rates, [100 * q["long"] for q in pts], ls=":",
                            label=f"{LABELS[system]}, long path", **style)  # fmt: skip
            cap = p["capacity"][system]
            if cap["bound"] == "=" and (hs or system == p["best_baseline"]):
                top.axvline(cap["rate"], color=COLORS[system], lw=0.8, ls="--")
        for ax in (top, bottom):
            ax.axhline(100 * s["target"], color="k", lw=0.8, ls="--")
            ax.set_ylim(0, 102)
            ax.set_xlabel("arrival rate (req/s)")
            ax.grid(alpha=0.3)
        ratio = f", capacity {p['ratio']:.2f}×" if p["ratio"] else ""
        top.set_title(f"{p['label']}{ratio}")
        top.set_ylabel("SLO attainment, all requests (%)")
        bottom.set_ylabel("SLO attainment per path (%)")
        top.legend(fontsize=7, loc="lower left")
        bottom.legend(fontsize=7, loc="lower left")
    fig.suptitle("Measured on one H200 (reference engine at model scale, 120-s points)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("spec", type=Path, help="bench/results/h200-eval/capacity/spec.json")
    ap.add_argument("--no-plot", action="store_true")
    args = ap.parse_args(argv)
    s = summarise(args.spec)
    out = args.spec.parent
    (out / "capacity.json").write_text(json.dumps(s, indent=1) + "\n")
    (out / "capacity.md").write_text(capacity_md(s))
    if not args.no_plot:
        plot(s, out / "capacity.png")
    for p in s["pipelines"].values():
        ratio = f"{p['ratio']:.2f}x" if p["ratio"] else "no ratio (unbracketed)"
        print(f"{p['label']}: HorizonServe {_cap(p['capacity'][HORIZON]).text()}, "
              f"best {p['best_baseline']}: {ratio}")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
