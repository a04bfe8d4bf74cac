"""Capacity, the sustainable rate at a target attainment, from the committed GPU reports.

    python bench/eval/capacity.py bench/results/h200-eval/capacity/spec.json

The spec names, for each pipeline and system, the measured items that make each rate's point
(REPORT/ITEM: a campaign folder beside the spec's parent, whose results.json report.py
recomputed from the raw records; repetitions of one rate are averaged). Writes, beside the
spec: capacity.json (the figures), and from it (capacity_tables.py) capacity.md (the tables)
and capacity.png (attainment against rate per pipeline, overall and per path). Measured
figures, and beside them, labelled SIMULATED, the capacity `horizonserve sim plan --slo-plan`
predicts for the same SLO table where the spec names its JSON (`sim_plan`).

The planner's capacity differs from the measured one for three reasons, which the tables keep
apart: the model (a simulated point is not the measured one), the reading (the planner bisects
to 2 %, a sweep interpolates linearly between rates up to 2 req/s apart, and attainment is not
linear there) and the point's length (the planner's long points against a campaign's 120 s).
The simulator's attainment on each measured item's own requests, which report.py stores beside
it, read with the sweep's linear rule, is the model alone; the planner on campaign-length
points (`sim_plan_points`) against that is the reading; the long-point plan against those is
the length.

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

HORIZON = "horizon"
VANILLA = "fcfs"
SHIPPED_ARTIFACT = "runtime/data/calibration/h200-fitted.json"  # what the planner runs on


@dataclass(frozen=True, slots=True)
class Point:
    """One rate of one system's sweep: the mean over its repetitions."""

    rate: float
    attainment: float
    short: float
    long: float | None  # None at a point without long-path requests (0 % long-path)
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
            long=mean_or_none([i["long_attainment"] for i in items]),
            reps=tuple(i["attainment"] for i in items),
            late=first["short_late"] + first["long_late"],
            never=first["short_never"] + first["long_never"],
            sources=tuple(sources),
        )


def mean_or_none(xs: list[float | None]) -> float | None:
    """The mean, or None where any value is missing (or there are none)."""
    return None if not xs or any(x is None for x in xs) else statistics.fmean(xs)  # type: ignore[arg-type]


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


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("spec", type=Path, help="bench/results/h200-eval/capacity/spec.json")
    ap.add_argument("--no-plot", action="store_true")
    args = ap.parse_args(argv)
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from capacity_tables import capacity_md, plot

    s = summarise(args.spec)
    out = args.spec.parent
    (out / "capacity.json").write_text(json.dumps(s, indent=1) + "\n")
    (out / "capacity.md").write_text(capacity_md(s))
    if not args.no_plot:
        plot(s, out / "capacity.png")
    for p in s["pipelines"].values():
        ratio = f"{p['ratio']:.2f}x" if p["ratio"] else "no ratio (unbracketed)"
        print(f"{p['label']}: HorizonServe {Capacity(**p['capacity'][HORIZON]).text()}, "
              f"best {p['best_baseline']}: {ratio}")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
