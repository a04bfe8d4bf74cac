"""The paper's evaluation (§6) on the reference engine: one runtime, only the policy differs.

Three steps, each its own subcommand (and two for the results: `carry` finished items into a
new plan, `compact` finished sessions' raw records to xz):

    plan      (CPU, here)   the whole campaign as data: points (arrival rate, long-path share,
                            seed, the exact request list), the systems to run at each point with
                            a priority tier, the serving config (classes + SLO table = 5 × solo
                            p95 from the calibration artifact, ladder, B_sat). Written once per
                            campaign; every session runs from the same file.
    run       (the GPU)     runs pending items in priority order inside a time budget, grouped
                            by GPU-sharing mode so the stages restart as rarely as possible;
                            appends raw records after every item (a timeout keeps what ran);
                            `--done DIR` skips items a previous session already committed.
    simulate  (CPU, here)   the simulator's prediction for the same points and systems (same
                            requests, same SLO table, the same calibration artifact).

    python bench/eval/campaign.py plan --out bench/results/h200-eval/RUN/plan.json
    python bench/eval/campaign.py run --plan …/plan.json --out $OUT --budget-s 500 --done …/RUN
    python bench/eval/campaign.py simulate --plan …/plan.json --out …/RUN/sim_prediction.json
    python bench/eval/campaign.py compact bench/results/h200-eval

Systems (paper §6.1): Vanilla = fcfs time-sliced; EDF time-sliced; MPS = fcfs under MPS;
EDF-MPS; HorizonServe = horizon under MPS + Green Context ladders; ablations
horizon-no-rotation (MPS + ladders) and horizon-no-throttling (MPS, no caps). The 2026
baselines (`runtime.baselines`: shed, shed-edf, vllm-omni-current, mps-static) join the main
systems with `plan --new-baselines`; `plan --capacity SIM_PLAN.json` lays out a capacity
campaign instead (`capacity_tiers`: each system's bracket of its simulated 90 % crossing, the
60 % long-path point, one past-capacity point). mps-static runs in a GPU-sharing group of its
own (its MPS shares are fixed when the stage processes start).

Attainment counts every request of a point: one still without its first response when its
SLO ran out is a miss (the run waits until each request answered or passed its deadline), and
so is one the engine refused at submission (vLLM's queue limits under the shed presets, a
stage unavailable, a request it cannot serve): it is recorded unanswered, with the reason.
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import json
import logging
import math
import os
import platform
import subprocess
import sys
import time
from dataclasses import dataclass, replace
from datetime import datetime
from pathlib import Path
from typing import Any

from compaction import compact_members, rows_at_ns, steps_at_ns  # bench/eval, beside this file

from horizonserve.runtime import cli_types as ck
from horizonserve.runtime.sim import systems as _registry  # the one name per system

log = logging.getLogger("campaign")

# system -> (policy, MPS flag): the engine picks the GPU-sharing mode from these (gpu_control).
SYSTEMS: dict[str, tuple[str, bool]] = {
    name: (s.policy.value, s.mps) for name, s in _registry.SYSTEMS.items()
}
LABELS = {name: s.label for name, s in _registry.SYSTEMS.items()}
MAIN = _registry.MAIN
ABLATIONS = _registry.ABLATIONS
NEW_BASELINES = _registry.BASELINES_2026
ALL = (*MAIN, *ABLATIONS, *NEW_BASELINES)
MPS_STATIC = "mps-static"  # MPS with a fixed share per stage process: a group of its own
MODE_ORDER = ("mps-gc", "mps", MPS_STATIC, "timeslice")  # a fixed order of the groups


def mode_of(system: str) -> str:
    """GPU-sharing mode the engine runs a system under on a CUDA device with MPS; mps-static
    is MPS too, but its shares are set when the stages start, so it groups apart (a switch to
    or from it restarts the stages)."""
    from horizonserve.runtime.baselines import rules_for
    from horizonserve.runtime.engine.reference.gpu_control import sharing_for

    policy, mps = SYSTEMS[system]
    if rules_for(policy).static_share:
        return MPS_STATIC
    return sharing_for(policy, mps=mps, cuda=True, mps_available=True)


# -- plan -----------------------------------------------------------------------------------------
def _point_id(rate: float, long_ratio: float | None) -> str:
    r = f"r{rate:g}"
    return r if long_ratio is None else f"{r}-l{round(long_ratio * 100)}"


def control_knobs(pairs: list[str] | None) -> dict[str, str]:
    """`--control KEY=VALUE` pairs as a mapping (values still text)."""
    bad = [kv for kv in pairs or () if "=" not in kv]
    if bad:
        raise SystemExit(f"--control {bad[0]!r}: give KEY=VALUE, e.g. sm_split=ladder")
    return dict(kv.split("=", 1) for kv in pairs or ())


def with_control(control: Any, pairs: list[str] | None) -> Any:
    """`control` (ControlParams) with the `KEY=VALUE` overrides applied and validated."""
    if not pairs:
        return control
    from horizonserve.runtime.config import control_with

    try:
        return control_with(control, control_knobs(pairs))
    except ValueError as exc:
        raise SystemExit(f"--control: {exc}") from None


def with_verdicts(verdicts: Any, pairs: list[str] | None) -> tuple[Any, list[str]]:
    """`verdicts` (SharingVerdicts) with the `KEY=VALUE` pairs that name one applied, and the
    other pairs (control overrides): an experiment on a calibrated decision."""
    from horizonserve.runtime.config import SharingVerdicts

    knobs = control_knobs(pairs)
    mine = {k: v for k, v in knobs.items() if k in SharingVerdicts.model_fields}
    rest = [f"{k}={v}" for k, v in knobs.items() if k not in mine]
    if not mine:
        return verdicts, rest
    try:
        return SharingVerdicts.model_validate({**verdicts.model_dump(), **mine}), rest
    except ValueError as exc:
        raise SystemExit(f"--control: {exc}") from None


def serving_config(pipeline: str, artifact_path: str, preset: str) -> tuple[Any, dict[str, Any]]:
    """The pipeline's classes with SLO = multiplier × the artifact's solo p95, its ladder and the
    control knobs it decides (B_sat, backlog lift)."""
    from horizonserve.runtime.artifact import load_artifact
    from horizonserve.runtime.config import ServingConfig, SloTable, load_pipeline

    art = load_artifact(artifact_path)
    cal = art.pipeline(pipeline)
    spec = load_pipeline(pipeline)
    solo = dict(cal.solo_p95_s or {})
    missing = [c.name for c in spec.slo.classes if c.name not in solo]
    if missing:
        raise SystemExit(f"artifact {artifact_path} has no solo p95 for {missing}")
    classes = [c.model_copy(update={"solo_p95_s": solo[c.name]}) for c in spec.slo.classes]
    slo = SloTable.model_validate({**spec.slo.model_dump(), "classes": classes, "multiplier": 5.0})
    config = ServingConfig(
        model=f"reference/{preset} ({spec.model}-shaped)",
        pipeline=pipeline,
        slo=slo,
        ladder=cal.ladder,
        control=cal.control(),
        verdicts=cal.verdicts(),
    )
    data = Path(artifact_path).read_bytes()
    meta = {
        "path": artifact_path,
        "sha256": hashlib.sha256(data).hexdigest(),
        "source": art.source,
        "created": art.created,
        "gpu": art.gpu.model_dump() if hasattr(art.gpu, "model_dump") else art.gpu,
        "key": art.key(pipeline) if hasattr(art, "key") else None,
    }
    return config, meta


def tiers(
    rates: list[float],
    long_ratios: list[float],
    stress_rate: float,
    long_rate: float,
    stress_long: float,
    main: tuple[str, ...] = MAIN,
) -> list[tuple[int, str, float, float | None, str, int]]:
    """(tier, point id, rate, long share, system, rep) for the whole campaign, by priority.

    1: the main systems at the stressed rate; HorizonServe, EDF-MPS and Priority at the
       downstream-heavy point (stress_long at long_rate).
    2: the ablations at the stressed rate; the other baselines at the heavy point; the main
       systems at the long sweep's rate with the default mix.
    3: rates above the stressed one; a HorizonServe repeat at the stressed rate (spread).
    4: the rest of the long-path sweep.  5: the remaining rates; ablations at the long rate.
    6: ablations and a HorizonServe repeat at the heavy point, repeats of the MPS baselines and
       Priority at the stressed rate.  7: ablations at the remaining rates.
    `main`: the main systems (the paper's; with the 2026 baselines, `NEW_BASELINES` too, which
    then also join the other baselines at the heavy point).
    """
    out: list[tuple[int, str, float, float | None, str, int]] = []
    s_id = _point_id(stress_rate, None)
    l_id = _point_id(long_rate, None)

    def add(tier: int, rate: float, lr: float | None, systems: tuple[str, ...], rep: int = 1):
        pid = _point_id(rate, lr)
        for s in systems:
            if not any(o[1] == pid and o[4] == s and o[5] == rep for o in out):
                out.append((tier, pid, rate, lr, s, rep))

    add(1, stress_rate, None, main)
    add(1, long_rate, stress_long, ("horizon", "edf-mps", "priority"))
    add(2, stress_rate, None, ABLATIONS)
    add(2, long_rate, stress_long, ("mps", "fcfs", "edf", "priority-mps"))
    add(2, long_rate, stress_long, tuple(s for s in main if s in NEW_BASELINES))
    add(2, long_rate, None, main)
    add(3, stress_rate, None, ("horizon",), rep=2)
    others = [r for r in sorted(rates, reverse=True) if _point_id(r, None) not in (s_id, l_id)]
    for r in others:
        if r > stress_rate:
            add(3, r, None, main)
    for lr in long_ratios:
        if lr != stress_long:
            add(4, long_rate, lr, main)
    for r in others:
        add(5, r, None, main)
    add(5, long_rate, None, ABLATIONS)
    add(6, long_rate, stress_long, ABLATIONS)
    add(6, long_rate, stress_long, ("horizon",), rep=2)
    add(6, stress_rate, None, ("mps", "edf-mps", "priority"), rep=2)
    for r in others:
        add(7, r, None, ABLATIONS)
    return out


CAPACITY_TARGET = 0.9  # the attainment whose crossing the capacity campaign brackets
BRACKET = (0.9, 1.1)  # a bracket's rates: these multiples of the simulated capacity, on the grid
PAST = 1.2  # the past-capacity point: this multiple of the highest simulated capacity


def bracket(capacity: float, grid: float) -> tuple[float, float]:
    """Two rates on a grid of `grid` req/s around a simulated 90 % crossing: the highest at or
    below 0.9 × capacity and the lowest at or above 1.1 × capacity. Invariant: grid ≤ low <
    high, both multiples of the grid (a tiny capacity gets the grid's first two rates)."""
    if capacity <= 0 or grid <= 0:
        raise ValueError(f"bracket: capacity {capacity} and grid {grid} must be positive")
    low = max(1, math.floor(BRACKET[0] * capacity / grid + 1e-9))
    high = max(low + 1, math.ceil(BRACKET[1] * capacity / grid - 1e-9))
    return round(low * grid, 6), round(high * grid, 6)


def read_capacities(paths: list[str], pipeline: str) -> dict[str, float]:
    """Each system's simulated capacity (the highest rate sustained at the target) for
    `pipeline` from `horizonserve sim plan --json` files; a later file's system replaces an
    earlier one's (e.g. a rerun of one system)."""
    caps: dict[str, float] = {}
    for path in paths:
        raw = Path(path).read_bytes()
        data = json.loads(gzip.decompress(raw) if path.endswith(".gz") else raw)
        # `--pipeline all` writes {"pipelines": {name: entry}}, one pipeline its entry alone.
        entry = data.get("pipelines", {}).get(pipeline) if "pipelines" in data else data
        if not entry or entry.get("pipeline", pipeline) != pipeline:
            raise SystemExit(f"--capacity {path}: no {pipeline} entry")
        if entry.get("target") != CAPACITY_TARGET:
            raise SystemExit(f"--capacity {path}: target {entry.get('target')}, not 0.9")
        for row in entry["systems"]:
            if row.get("rate_ok") is None:
                raise SystemExit(f"--capacity {path}: {row['system']} sustains no rate")
            caps[row["system"]] = float(row["rate_ok"])
    return caps


def capacity_tiers(
    caps: dict[str, float],
    systems: tuple[str, ...],
    grid: float,
    long_rate: float,
    long_ratio: float,
    past_rate: float,
) -> list[tuple[int, str, float, float | None, str, int]]:
    """(tier, point id, rate, long share, system, rep) of a capacity campaign, by priority.

    Lead systems: HorizonServe and the new baseline with the highest simulated capacity.
    1: the lead systems' brackets (`bracket`).  2: the lead systems at the long-path point
    (`long_ratio` at `long_rate`) and at the past-capacity point.  3: the other new baselines'
    brackets.  4: the other new baselines at the long-path and past-capacity points.  5: the
    paper's baselines' brackets.  6: the paper's baselines at the other two points.
    """
    missing = [s for s in systems if s not in caps]
    if missing:
        raise SystemExit(f"--capacity: no simulated capacity for {missing}")
    new = [s for s in systems if s in NEW_BASELINES]
    lead = ("horizon", *(sorted(new, key=lambda s: -caps[s])[:1]))
    lead = tuple(s for s in lead if s in systems)
    others_new = tuple(s for s in new if s not in lead)
    old = tuple(s for s in systems if s not in lead and s not in NEW_BASELINES)
    out: list[tuple[int, str, float, float | None, str, int]] = []

    def add(tier: int, rate: float, lr: float | None, group: tuple[str, ...]) -> None:
        pid = _point_id(rate, lr)
        for s in group:
            if not any(o[1] == pid and o[4] == s for o in out):
                out.append((tier, pid, rate, lr, s, 1))

    for tier, group in ((1, lead), (3, others_new), (5, old)):
        for s in group:
            for rate in bracket(caps[s], grid):
                add(tier, rate, None, (s,))
        add(tier + 1, long_rate, long_ratio, group)
        add(tier + 1, past_rate, None, group)
    return out


def baseline_settings(
    system: str, pipeline: str, total_sms: int, args: argparse.Namespace
) -> dict[str, int]:
    """What an item of a 2026 baseline runs with beyond its preset: mps-static's shared-stage
    SMs (`runtime.baselines.static_share`, or `--static-share`), vllm-omni-current's window K
    where `--window` sets one (else the talker's places)."""
    from horizonserve.runtime.baselines import rules_for, static_share

    rules = rules_for(SYSTEMS[system][0])
    out: dict[str, int] = {}
    if rules.static_share:
        out["static_share"] = static_share(pipeline, total_sms, args.static_share)
    if rules.window and args.window is not None:
        out["window"] = args.window
    return out


def cmd_plan(args: argparse.Namespace) -> int:
    from horizonserve.runtime.config import Path as PathKind
    from horizonserve.runtime.engine.reference.backend import requests_from_trace
    from horizonserve.runtime.workload import generate, load_workload, mix_weights

    config, art_meta = serving_config(args.pipeline, args.artifact, args.preset)
    if args.control:  # an experiment on a calibrated decision, recorded in the plan
        verdicts, rest = with_verdicts(config.verdicts, args.control)
        control = with_control(config.control, rest)
        config = config.model_copy(update={"control": control, "verdicts": verdicts})
    workload = load_workload(args.pipeline)
    long_classes = tuple(c.name for c in config.slo.classes if c.path is PathKind.LONG)
    capacity: dict[str, Any] | None = None
    if args.capacity:
        systems = tuple(args.systems.split(",")) if args.systems else (*MAIN, *NEW_BASELINES)
        unknown = sorted(set(systems) - set(SYSTEMS))
        if unknown:
            raise SystemExit(f"--systems: unknown {unknown}; choose from {', '.join(ALL)}")
        caps = read_capacities(args.capacity, args.pipeline)
        top = max(caps[s] for s in systems if s in caps)
        past = args.past_rate or round(math.ceil(PAST * top / args.grid) * args.grid, 6)
        rows = capacity_tiers(caps, systems, args.grid, args.long_rate, args.stress_long, past)
        capacity = {"label": "SIMULATED", "sources": args.capacity,
                    "simulated_capacity": {s: caps[s] for s in systems},
                    "target": CAPACITY_TARGET, "grid": args.grid, "bracket": list(BRACKET),
                    "past_rate": past}  # fmt: skip
    else:
        main = (*MAIN, *NEW_BASELINES) if args.new_baselines else MAIN
        rows = tiers(
            args.rates, args.long_ratios, args.stress_rate, args.long_rate, args.stress_long, main
        )
    points: dict[str, dict[str, Any]] = {}
    items = []
    for tier, pid, rate, lr, system, rep in rows:
        if pid not in points:
            mix = mix_weights(workload, long_classes, lr)
            trace = generate(workload, mix, rate=rate, duration_s=args.duration, seed=args.seed,
                             burstiness=args.burstiness)  # fmt: skip
            reqs = requests_from_trace(trace, args.preset)
            points[pid] = {
                "id": pid,
                "rate": rate,
                "long_ratio": lr,
                "seed": args.seed,
                "duration_s": args.duration,
                # Poisson plans keep their bytes: the key is there only for bursty arrivals.
                **({"burstiness": args.burstiness} if args.burstiness != 1.0 else {}),
                "mix": mix,
                "requests": [
                    {
                        "at_s": round(r.at_s, 6),
                        "rid": r.spec.rid,
                        "class": r.spec.class_name,
                        "input_tokens": r.spec.input_tokens,
                        "audio_seconds": round(r.spec.audio_seconds, 4),
                        "images": r.spec.images,
                        "video_seconds": round(r.spec.video_seconds, 4),
                        "output_tokens": r.spec.output_tokens,
                        "downstream_tokens": (
                            r.spec.downstream_tokens if r.spec.class_name in long_classes else None
                        ),
                    }
                    for r in reqs
                ],
            }
        items.append(
            {"id": f"{pid}/{system}/rep{rep}", "tier": tier, "point": pid, "system": system,
             "rep": rep, "policy": SYSTEMS[system][0], "mps": SYSTEMS[system][1],
             "mode": mode_of(system),
             **baseline_settings(system, args.pipeline, config.ladder.total, args)}
        )  # fmt: skip
    plan = {
        "schema": 1,
        "pipeline": args.pipeline,
        "preset": args.preset,
        "profile": args.profile,  # the deploy profile of the engine's stage limits
        "downstream": ["speech"] if args.pipeline != "bagel" else ["image"],
        "artifact": art_meta,
        "slo": {c.name: config.slo.target_s(c.name) for c in config.slo.classes},
        "serving_config": json.loads(config.model_dump_json()),
        "control_overrides": control_knobs(args.control),
        "drain": {"slack_s": args.drain_slack, "idle_cap_s": args.idle_cap},
        **({"capacity": capacity} if capacity else {}),
        "command": " ".join([Path(sys.argv[0]).as_posix(), *sys.argv[1:]]),
        "provenance": plan_provenance(config, items),
        "points": points,
        "items": items,
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    text = (json.dumps(plan, separators=(",", ":")) + "\n").encode()
    # `--out X.json.gz` stores it gzipped (mtime 0: the same plan, the same bytes).
    out.write_bytes(gzip.compress(text, mtime=0) if out.suffix == ".gz" else text)
    n_req = {pid: len(p["requests"]) for pid, p in points.items()}
    print(f"wrote {out}: {len(points)} points {n_req}, {len(items)} items")
    return 0


# -- run ------------------------------------------------------------------------------------------
def done_items(dirs: list[str]) -> set[str]:
    """Item ids finished in earlier sessions (any summary.json below the given folders)."""
    done: set[str] = set()
    for d in dirs:
        for p in sorted(Path(d).rglob("summary.json")):
            try:
                s = json.loads(p.read_text())
            except (OSError, ValueError):
                continue
            for item_id, it in s.get("items", {}).items():
                if it.get("status") == "ok":
                    done.add(item_id)
    return done


@dataclass
class Costs:
    """Running estimates (s) of what an item and a stage restart take."""

    drain: float = 5.0  # after the last arrival until every request answered or missed
    idle: float = 3.0  # then until the pipeline is idle or aborted (plan's idle_cap_s)
    restart: float = 25.0  # stop + start (+ warm-up)

    def item(self, duration: float) -> float:
        return duration + self.drain + self.idle + 2.0


def pick_next(
    pending: list[dict[str, Any]],
    mode: str | None,
    left: float,
    costs: Costs,
    durations: dict[str, float],
) -> dict[str, Any] | None:
    """The next item, greedy by tier: an item may run when, after it, every other pending item
    of its tier or a lower one still fits the budget. Items of the running GPU-sharing mode go
    first (no restart); a switch goes to the mode (fixed order) of the first lowest-tier item.
    The lowest tier always runs while its own item fits."""
    if not pending:
        return None
    tier = min(i["tier"] for i in pending)

    def need(items: list[dict[str, Any]], at_mode: str | None) -> float:
        modes = {i["mode"] for i in items}
        restarts = len(modes - ({at_mode} if at_mode else set()))
        return sum(costs.item(durations[i["point"]]) for i in items) + restarts * costs.restart

    def fits(it: dict[str, Any], switch: bool) -> bool:
        cost = costs.item(durations[it["point"]]) + (costs.restart if switch else 0.0)
        if cost > left:
            return False
        if it["tier"] == tier:
            return True
        rest = [i for i in pending if i is not it and i["tier"] <= it["tier"]]
        return left - cost >= need(rest, it["mode"])

    for it in sorted((i for i in pending if i["mode"] == mode), key=lambda i: i["tier"]):
        if fits(it, False):
            return it
    must = [i for i in pending if i["tier"] == tier]
    first_mode = min((i["mode"] for i in must), key=MODE_ORDER.index)
    it = next(i for i in must if i["mode"] == first_mode)
    return it if fits(it, True) else None


def _pct(values: list[float], q: float) -> float | None:
    """Nearest-rank percentile (inf allowed)."""
    if not values:
        return None
    s = sorted(values)
    return s[max(0, math.ceil(q * len(s)) - 1)]


def _finite(x: float | None) -> float | None:
    return None if x is None or not math.isfinite(x) else x


WARMUP_FRACTION = 0.1  # the steady-state figures leave out arrivals in a point's first 10 %


def item_summary(
    records: list[dict[str, Any]], steps: list[list[Any]], cols: list[str], span_s: float
) -> dict[str, Any]:
    """Attainment (whole point, and steady state: arrivals after the warm-up window), per-class
    p50/p95 (unanswered = +inf), shared-stage TPOT, step statistics."""
    out: dict[str, Any] = {"requests": len(records)}
    met = [bool(r["slo_met"]) for r in records]
    out["attainment"] = sum(met) / len(met) if met else None
    warm = WARMUP_FRACTION * span_s
    steady = [r for r in records if r.get("arrival_offset_s", 0.0) >= warm]
    out["warmup_s"] = warm
    out["steady_requests"] = len(steady)
    out["steady_attainment"] = (
        sum(1 for r in steady if r["slo_met"]) / len(steady) if steady else None
    )
    for kind in ("short", "long"):
        rs = [r for r in steady if r["path"] == kind]
        out[f"steady_{kind}_attainment"] = (
            sum(1 for r in rs if r["slo_met"]) / len(rs) if rs else None
        )
    answered = [r for r in records if r["first_response_s"] is not None]
    out["answered"] = len(answered)
    out["refused"] = sum(1 for r in records if r.get("refused"))  # never admitted: misses
    out["attainment_answered"] = (
        sum(1 for r in answered if r["slo_met"]) / len(answered) if answered else None
    )
    for kind in ("short", "long"):
        rs = [r for r in records if r["path"] == kind]
        n_met = sum(1 for r in rs if r["slo_met"])
        out[f"{kind}_attainment"] = n_met / len(rs) if rs else None
        # Every request is exactly one of: met, late (answered after its SLO), never answered.
        out[f"{kind}_goodput_rps"] = n_met / span_s if span_s > 0 else None
        out[f"{kind}_never"] = sum(1 for r in rs if r["first_response_s"] is None)
        out[f"{kind}_late"] = len(rs) - n_met - out[f"{kind}_never"]
    out["goodput_rps"] = sum(met) / span_s if span_s > 0 else None
    # Speech playback stalls over the point (None: records from before they were kept).
    stalls = [r["underruns"] for r in records if "underruns" in r]
    out["underruns"] = sum(stalls) if stalls or not records else None
    classes: dict[str, Any] = {}
    for name in sorted({r["class"] for r in records}):
        rs = [r for r in records if r["class"] == name]
        lat = [math.inf if r["first_response_s"] is None else r["first_response_s"] for r in rs]
        classes[name] = {
            "requests": len(rs),
            "path": rs[0]["path"],
            "slo_s": rs[0]["slo_s"],
            "attainment": sum(1 for r in rs if r["slo_met"]) / len(rs),
            "p50_s": _finite(_pct(lat, 0.50)),
            "p95_s": _finite(_pct(lat, 0.95)),
            "p95_censored": (_pct(lat, 0.95) or 0) == math.inf,
        }
    out["classes"] = classes
    tpot = [r["shared_tpot_s"] for r in records if r.get("shared_tpot_s")]
    out["tpot_requests"] = len(tpot)
    out["tpot_p50_ms"] = None if not tpot else _pct(tpot, 0.5) * 1e3
    out["tpot_p95_ms"] = None if not tpot else _pct(tpot, 0.95) * 1e3
    ix = {c: i for i, c in enumerate(cols)}
    dec = [
        s[ix["decode_s"]]
        for s in steps
        if s[ix["decode_batch"]] > 0 and s[ix["prefill_batch"]] == 0
    ]
    out["decode_steps"] = len(dec)
    out["decode_step_p50_ms"] = None if not dec else _pct(dec, 0.5) * 1e3
    out["decode_step_p95_ms"] = None if not dec else _pct(dec, 0.95) * 1e3
    sms = [s[ix["shared_sms"]] for s in steps]
    out["steps"] = len(steps)
    out["shared_sms_mean"] = sum(sms) / len(sms) if sms else None
    out["downstream_active_share"] = (
        sum(1 for s in steps if s[ix["downstream_active"]] > 0) / len(steps) if steps else None
    )
    tokens = sum(r.get("shared_tokens") or 0 for r in records)
    done = [r for r in records if r.get("done_s") is not None]
    out["completed"] = len(done)
    out["shared_tokens"] = tokens
    return out


def unrecorded_control(plan: dict[str, Any]) -> dict[str, Any]:
    """Control knobs newer than `plan`, with the values they take when it runs today.

    A plan records every knob that existed when it was written; one added since runs at its
    default, which the session's summary keeps beside the plan's digest."""
    from horizonserve.runtime.calibrate.legacy import is_legacy
    from horizonserve.runtime.config import ControlParams

    recorded = plan["serving_config"].get("control", {})
    if is_legacy(recorded):
        return {}  # a plan before the policy axes: `plan_config` reads what it recorded
    defaults = ControlParams().model_dump(mode="json")
    return {k: v for k, v in defaults.items() if k not in recorded}


def plan_provenance(config: Any, items: list[dict[str, Any]]) -> dict[str, Any]:
    """The commit that wrote the plan, and each policy's fully resolved control under it."""
    from horizonserve.runtime.bench.provenance import git_commit, resolved
    from horizonserve.runtime.config import PolicyName

    policies = sorted({i["policy"] for i in items})
    controls = {
        p: resolved(config.model_copy(update={"policy": PolicyName(p)}))["control"]
        for p in policies
    }
    return {**git_commit(), "control": controls}


def git_commit() -> dict[str, Any]:
    from horizonserve.runtime.bench.provenance import git_commit as commit

    return commit()


def plan_config(plan: dict[str, Any]) -> Any:
    """The ServingConfig `plan` recorded; a plan before the policy axes has its boolean knobs
    read as axes and verdicts (`calibrate.legacy.recorded_control`)."""
    from horizonserve.runtime.calibrate.legacy import is_legacy, recorded_control
    from horizonserve.runtime.config import ServingConfig

    data = dict(plan["serving_config"])
    control = data.get("control", {})
    if is_legacy(control):
        ctl, verdicts = recorded_control(control)
        data["control"], data["verdicts"] = ctl.model_dump(), verdicts.model_dump()
    return ServingConfig.model_validate(data)


def run_control(plan: dict[str, Any]) -> dict[str, Any]:
    """Every control knob HorizonServe runs `plan` with today: the plan's, and the defaults
    of knobs newer than it."""
    return {**plan["serving_config"].get("control", {}), **unrecorded_control(plan)}


class Campaign:
    def __init__(self, args: argparse.Namespace, plan: dict[str, Any]) -> None:
        self.args = args
        self.plan = plan
        self.out = Path(args.out)
        self.out.mkdir(parents=True, exist_ok=True)
        self.t_start = time.monotonic()
        self.backend: Any = None
        self.mode: str | None = None
        self.costs = Costs()
        self.summary: dict[str, Any] = {
            "plan_sha256": args.plan_sha256,
            "command": " ".join(sys.argv),
            # The code this session ran (a replay checks it out: runtime.bench.provenance).
            "provenance": git_commit(),
            "budget_s": args.budget_s,
            "env": {},
            "items": {},
            "restarts": [],
            "skipped": [],
            "control_defaults": unrecorded_control(plan),
            # Every knob HorizonServe's items run with: the report counts an item only beside
            # others of the same controller.
            "control": run_control(plan),
        }
        if self.summary["control_defaults"]:
            log.warning(
                "the plan records no %s: today's defaults run (%s); write a new plan to record "
                "them",
                ", ".join(self.summary["control_defaults"]),
                self.summary["control_defaults"],
            )

    # -- outputs --------------------------------------------------------------------------------
    def save_summary(self) -> None:
        self.summary["elapsed_s"] = time.monotonic() - self.t_start
        tmp = self.out / "summary.json.tmp"
        tmp.write_text(json.dumps(self.summary, indent=1, default=str, allow_nan=False))
        os.replace(tmp, self.out / "summary.json")

    def append_gz(self, name: str, obj: Any) -> None:
        """One gzip member per item: a killed run leaves whole members behind."""
        blob = gzip.compress((json.dumps(obj, default=str) + "\n").encode())
        with open(self.out / name, "ab") as f:
            f.write(blob)
            f.flush()
            os.fsync(f.fileno())

    def left(self) -> float:
        return self.args.budget_s - (time.monotonic() - self.t_start)

    # -- pipeline -------------------------------------------------------------------------------
    def _options(self, item: dict[str, Any]) -> Any:
        from horizonserve.runtime.engine.reference.pipeline import PipelineOptions

        config = plan_config(self.plan)
        return PipelineOptions(
            preset=self.plan["preset"],
            # Plans from before profiles existed ran the engine's then-only limits: "tuned".
            profile=self.plan.get("profile", "tuned"),
            device=self.args.device,
            policy=item["policy"],
            config=config,
            downstream=tuple(self.plan["downstream"]),
            mps=item["mps"],
            seed=self.args.seed,
            threads=self.args.threads,
            # A start that outlasts the budget fails the item, naming the stages not ready,
            # instead of holding the device past the call.
            startup_timeout_s=max(30.0, self.left()),
            # The 2026 baselines' settings the plan recorded (`baseline_settings`).
            window=item.get("window"),
            static_share=item.get("static_share"),
        )

    def start(self, item: dict[str, Any], reason: str) -> None:
        from horizonserve.runtime.engine.reference.backend import ReferenceBackend

        t0 = time.monotonic()
        self.stop()
        backend = ReferenceBackend(self._options(item))
        backend.start()
        self.backend = backend
        self.mode = item["mode"]
        pipe = backend.pipeline
        warm = self.warmup() if self.args.warmup else None
        took = time.monotonic() - t0
        self.costs.restart = max(self.costs.restart * 0.5, took + 2.0)
        row = {
            "before": item["id"],
            "reason": reason,
            "mode_wanted": item["mode"],
            "sharing": pipe.sharing,
            "mps_active": pipe.mps_active,
            "seconds": took,
            "warmup": warm,
            "stages": {n: {k: v for k, v in i.items() if k != "stopped"}
                       for n, i in pipe.stage_info.items()},
        }  # fmt: skip
        self.summary["restarts"].append(row)
        log.info("pipeline up (%s, MPS %s) in %.1f s", pipe.sharing, pipe.mps_active, took)
        self.save_summary()

    def stop(self) -> None:
        if self.backend is not None:
            try:
                self.backend.close()
            except Exception as exc:  # keep going: the next start makes fresh stages
                log.warning("stop failed: %r", exc)
            self.backend = None
            self.mode = None

    def warmup(self) -> dict[str, Any]:
        """A few short requests of every class (first-use costs out of the measured runs)."""
        from horizonserve.runtime.engine.reference.protocol import RequestSpec

        pipe = self.backend.pipeline
        t0 = time.monotonic()
        handles = []
        by_class: dict[str, dict[str, Any]] = {}
        for p in self.plan["points"].values():
            for r in p["requests"]:
                by_class.setdefault(r["class"], r)
        for k in range(2):
            for name, r in by_class.items():
                spec = RequestSpec(
                    f"warm-{k}-{name}",
                    class_name=name,
                    input_tokens=r["input_tokens"],
                    audio_seconds=r["audio_seconds"],
                    images=r["images"],
                    video_seconds=r["video_seconds"],
                    output_tokens=min(16, r["output_tokens"]),
                    downstream_tokens=None if r["downstream_tokens"] is None else 60,
                )
                handles.append(pipe.submit(spec))
        ok = all(h.wait_done(max(0.0, 40.0 - (time.monotonic() - t0))) for h in handles)
        errors = [h.record.error for h in handles if h.record.error]
        return {"seconds": time.monotonic() - t0, "requests": len(handles), "ok": ok,
                "errors": errors[:3]}  # fmt: skip

    def ensure(self, item: dict[str, Any]) -> None:
        if self.backend is None or self.mode != item["mode"]:
            self.start(item, "mode" if self.backend is not None else "first")
            return
        try:
            self.backend.pipeline.set_policy(item["policy"])
        except Exception as exc:  # SharingMismatch or a stuck stage: restart
            log.warning("set_policy(%s): %r; restarting", item["policy"], exc)
            self.start(item, f"set_policy: {exc!r}")

    # -- one item -------------------------------------------------------------------------------
    def run_item(self, item: dict[str, Any]) -> None:
        from horizonserve.runtime.engine.reference.pipeline import (
            QueueFullError,
            StageUnavailableError,
        )
        from horizonserve.runtime.engine.reference.protocol import RequestSpec

        point = self.plan["points"][item["point"]]
        self.ensure(item)
        pipe = self.backend.pipeline
        reqs = point["requests"]
        t_item = time.monotonic()
        t0 = time.monotonic() + 0.05
        # The step trace's t = 0 on this host's local clock, as GPU sample logs stamp theirs.
        t0_local = datetime.fromtimestamp(time.time() + t0 - time.monotonic())
        handles: list[tuple[dict[str, Any], Any]] = []
        rejected = []
        refused: list[dict[str, Any]] = []  # records of requests never admitted: misses
        for r in reqs:
            due = t0 + r["at_s"]
            delay = due - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            spec = RequestSpec(
                f"{item['system']}-{item['rep']}-{r['rid']}",
                class_name=r["class"],
                input_tokens=r["input_tokens"],
                audio_seconds=r["audio_seconds"],
                images=r["images"],
                video_seconds=r["video_seconds"],
                output_tokens=r["output_tokens"],
                downstream_tokens=r["downstream_tokens"],
            )
            try:
                handles.append((r, pipe.submit(spec, arrival=due)))
            except (ValueError, StageUnavailableError) as exc:
                # Never answered, so a miss: vLLM's queue limits (shed presets), a stage down,
                # or a request the engine cannot serve.
                if isinstance(exc, QueueFullError):
                    reason = exc.reason
                elif isinstance(exc, StageUnavailableError):
                    reason = "unavailable"
                else:
                    reason = "rejected"
                rejected.append({"rid": r["rid"], "error": str(exc), "reason": reason})
                refused.append(refused_record(self.plan, r, spec.rid, str(exc), reason))
        t_last = time.monotonic()
        # Drain: until every request answered or passed its SLO (then it is a miss anyway).
        cap = t_last + max(self.plan["slo"].values()) + self.plan["drain"]["slack_s"]
        while time.monotonic() < cap:
            now = time.monotonic()
            if all(h.first.is_set() or now > h.record.arrival + h.record.slo_s for _, h in handles):
                break
            time.sleep(0.05)
        t_cut = time.monotonic()
        # Leftovers may finish for a few seconds (their TPOT / completion is recorded); then
        # everything still in flight is aborted, so no backlog carries into the next item.
        idle_cap = min(self.plan["drain"]["idle_cap_s"], max(0.0, self.left() - 5))
        idle = True
        try:
            pipe._wait_idle(idle_cap)
        except Exception:
            idle = False
        t_idle = time.monotonic()
        pipe.wait_trace(t_idle - 0.3, timeout=2.0)
        aborted: dict[str, int] | None = None
        if not idle:
            try:
                aborted = pipe.abort(before=t_idle)
            except Exception as exc:  # a stuck stage: the next item starts fresh stages
                log.warning("abort failed: %r; restarting", exc)
        records = []
        for r, h in handles:
            rec = h.record.as_dict()
            if rec["error"] == "aborted":  # cut off at the item's end, not a failure
                rec["error"] = None
                rec["aborted_at_end"] = True
            info = rec.pop("info", None) or {}
            rec["underruns"] = int(info.get("underruns", 0))  # the listener's playback stalls
            rec["arrival_offset_s"] = r["at_s"]
            rec["answered_by_cut"] = h.record.first is not None and h.record.first <= t_cut
            rec["slo_met"] = bool(rec["slo_met"])
            rec.pop("arrival", None)
            records.append(rec)
        records.extend(refused)
        cols = list(_trace_columns())
        steps = []
        for row in pipe.trace_dicts():
            if t0 <= row["t"] <= t_idle:
                row["t"] = round(row["t"] - t0, 6)
                steps.append([_clean(row[c]) for c in cols])
        span = point["duration_s"]
        s = item_summary(records, steps, cols, span)
        health = pipe.health()
        s.update(
            {
                "status": "ok" if health["ok"] else "stage-failed",
                "tier": item["tier"],
                "point": item["point"],
                "system": item["system"],
                "rep": item["rep"],
                "policy": item["policy"],
                "sharing": pipe.sharing,
                "mps_active": pipe.mps_active,
                "rejected": rejected,
                "arrivals_s": t_last - t0,
                "drain_s": t_cut - t_last,
                "idle_wait_s": t_idle - t_cut,
                "idle_reached": idle,
                "unfinished_at_end": sum(1 for r in records if r.get("aborted_at_end")),
                "aborted": aborted,
                "wall_s": t_idle - t_item,
                "t0_local": t0_local.isoformat(sep=" ", timespec="milliseconds"),
                "errors": health["errors"],
            }
        )
        self.append_gz("records.jsonl.gz", {"item": item["id"], "records": records})
        self.append_gz(
            "steps.jsonl.gz", {"item": item["id"], "columns": cols, "rows": rows_at_ns(steps)}
        )
        self.summary["items"][item["id"]] = s
        self.costs.drain = max(self.costs.drain * 0.7, t_cut - t_last)
        self.costs.idle = max(self.costs.idle * 0.7, t_idle - t_cut)
        self.save_summary()
        log.info(
            "%s: attainment %.3f (short %s, long %s), %d req, drain %.1f s, idle wait %.1f s%s",
            item["id"], s["attainment"] or 0.0, _f(s["short_attainment"]),
            _f(s["long_attainment"]), len(records), t_cut - t_last, t_idle - t_cut,
            "" if idle else f" (aborted {aborted})",
        )  # fmt: skip
        if (not idle and aborted is None) or not health["ok"]:
            self.stop()  # the next item starts fresh stages: no backlog carried over

    # -- loop -----------------------------------------------------------------------------------
    def run(self) -> int:
        plan = self.plan
        redo = set(self.args.redo.split(",")) if self.args.redo else set()
        done = done_items(self.args.done or []) - redo
        self.summary["redo"] = sorted(redo)  # the report prefers these runs to earlier ones
        only = set(self.args.only.split(",")) if self.args.only else None
        max_tier = self.args.max_tier
        pending = [
            i for i in plan["items"]
            if i["id"] not in done and i["tier"] <= max_tier
            and (only is None or i["id"] in only or i["point"] in only)
        ]  # fmt: skip
        self.summary["done_before"] = sorted(done)
        self.summary["env"] = env_info(self.args.device)
        durations = {pid: p["duration_s"] for pid, p in plan["points"].items()}
        log.info(
            "%d items pending (%d done before), budget %.0f s",
            len(pending),
            len(done),
            self.args.budget_s,
        )
        self.save_summary()
        try:
            while pending:
                it = pick_next(pending, self.mode, self.left(), self.costs, durations)
                if it is None:
                    log.info("budget: %.0f s left, next item does not fit; stopping", self.left())
                    break
                pending.remove(it)
                log.info(
                    "[%.0f s left] item %s (tier %d, %s)",
                    self.left(),
                    it["id"],
                    it["tier"],
                    it["mode"],
                )
                try:
                    self.run_item(it)
                except Exception as exc:
                    log.exception("item %s failed", it["id"])
                    self.summary["items"][it["id"]] = {"status": "failed", "error": repr(exc)}
                    self.save_summary()
                    self.stop()
        finally:
            self.summary["not_run"] = [i["id"] for i in pending]
            self.stop()
            self.save_summary()
        return 0


def refused_record(
    plan: dict[str, Any], r: dict[str, Any], rid: str, error: str, reason: str
) -> dict[str, Any]:
    """The record of a request the engine refused at submission: never answered, a miss at
    its deadline like every unanswered request (`item_summary` counts it)."""
    classes = {c["name"]: c for c in plan["serving_config"]["slo"]["classes"]}
    cls = classes.get(r["class"], {})
    return {
        "id": rid, "class": r["class"], "priority": cls.get("priority"),
        "path": cls.get("path", "unknown"), "metric": cls.get("metric"),
        "slo_s": plan["slo"].get(r["class"]), "queueing_s": None, "first_response_s": None,
        "slo_met": False, "handoff_s": None, "done_s": None, "shared_tpot_s": None,
        "shared_tokens": None, "error": error, "refused": reason, "underruns": 0,
        "arrival_offset_s": r["at_s"], "answered_by_cut": False,
    }  # fmt: skip


def _f(x: float | None) -> str:
    return "—" if x is None else f"{x:.3f}"


def _clean(v: Any) -> Any:
    if isinstance(v, float) and not math.isfinite(v):
        return None
    return v


def _trace_columns() -> tuple[str, ...]:
    from horizonserve.runtime.engine.reference.protocol import TRACE_COLUMNS

    return TRACE_COLUMNS


def env_info(device: str) -> dict[str, Any]:
    info: dict[str, Any] = {"python": platform.python_version(), "host": platform.node()}
    try:
        import torch

        info["torch"] = torch.__version__
        if torch.cuda.is_available() and device != "cpu":
            info["gpu"] = torch.cuda.get_device_name(0)
            info["sms"] = torch.cuda.get_device_properties(0).multi_processor_count
    except ImportError:
        info["torch"] = None
    try:
        q = "--query-gpu=name,driver_version,memory.total"
        out = subprocess.run(["nvidia-smi", q, "--format=csv,noheader"], capture_output=True,
                             text=True, timeout=10)  # fmt: skip
        info["nvidia_smi"] = out.stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        info["nvidia_smi"] = None
    try:
        rev = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True,
                             timeout=10)  # fmt: skip
        info["git"] = rev.stdout.strip() or None
    except (OSError, subprocess.TimeoutExpired):
        info["git"] = None
    # The device may run a copy whose HEAD is not the tree it runs: the sources' own digest.
    info["runtime_sha256"] = runtime_digest()
    return info


def runtime_digest() -> str:
    """sha256 over runtime/**/*.py (path and content, sorted): which code an item ran."""
    root = Path(__file__).resolve().parents[2] / "runtime"
    h = hashlib.sha256()
    for f in sorted(root.rglob("*.py")):
        h.update(f.relative_to(root).as_posix().encode() + b"\0" + f.read_bytes())
    return h.hexdigest()


def cmd_run(args: argparse.Namespace) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    from horizonserve.runtime.calibrate.records import read_plan

    plan, args.plan_sha256 = read_plan(args.plan)
    return Campaign(args, plan).run()


# -- simulate -------------------------------------------------------------------------------------
def _as_run(plan: dict[str, Any], sha: str, plan_path: str, session: Path) -> Any:
    """The control (ControlParams, SharingVerdicts) `session`, a folder with summary.json, ran
    `plan` (sha256 `sha`, at `plan_path`) with."""
    from horizonserve.runtime.calibrate.legacy import recorded_control
    from horizonserve.runtime.calibrate.records import session_control

    summary = json.loads((session / "summary.json").read_text())
    if summary.get("plan_sha256") != sha:
        raise SystemExit(
            f"--as-run: {session} ran another plan (sha256 {summary.get('plan_sha256', '?')[:12]}"
            f"…, not {sha[:12]}…); give a session of {plan_path}"
        )
    return recorded_control(session_control(plan, summary))


def cmd_simulate(args: argparse.Namespace) -> int:
    """The simulator on the plan's points: same requests (regenerated from the same workload and
    seed, checked against the plan), each system, set up as the fit replays a campaign
    (`sim.fit.Replay`): the plan's SLO table, its recorded control and, for an entry fitted to
    the reference engine, the plan's class table."""
    from horizonserve.runtime.artifact import load_artifact
    from horizonserve.runtime.bench.metrics import summarize
    from horizonserve.runtime.calibrate.fit import replay_of
    from horizonserve.runtime.calibrate.records import plan_campaign, read_plan
    from horizonserve.runtime.config import PolicyName
    from horizonserve.runtime.sim.engine import simulate
    from horizonserve.runtime.workload import generate, load_workload, mix_weights

    plan, sha = read_plan(args.plan)
    art_path = args.artifact or plan["artifact"]["path"]
    art = load_artifact(art_path)
    pipeline = plan["pipeline"]
    campaign = plan_campaign(plan, str(Path(args.plan).parent))
    replay = replay_of(campaign, art)
    setup = replay.setup(art.pipeline(pipeline))
    if replay.caveat:
        log.warning("simulate: %s", replay.caveat)
    if args.as_run:  # the controller a session of this plan ran (its summary says which)
        ctl, verdicts = _as_run(plan, sha, args.plan, Path(args.as_run))
        setup = replace(setup, control=ctl, verdicts=verdicts)
    if args.control:  # a what-if: control or verdicts overridden, e.g. backlog_lift_pays=false
        verdicts, rest = with_verdicts(
            setup.serving_config(PolicyName.HORIZON).verdicts, args.control
        )
        setup = replace(setup, control=with_control(setup.control, rest), verdicts=verdicts)
    workload = load_workload(pipeline)
    systems = args.systems.split(",") if args.systems else None
    wanted = {(i["point"], i["system"]) for i in plan["items"]}
    # The 2026 baselines' settings each item records, as the simulator's hooks take them.
    settings = {(i["point"], i["system"]): sim_baseline(i) for i in plan["items"]}
    out: dict[str, Any] = {
        "label": "SIMULATED",
        "artifact": {"path": art_path,
                     "sha256": hashlib.sha256(Path(art_path).read_bytes()).hexdigest()},
        "caveat": replay.caveat,
        "slo": setup.targets(),
        "control": setup.control.model_dump(mode="json"),
        "verdicts": setup.serving_config(PolicyName.HORIZON).verdicts.model_dump(),
        "seeds": args.seeds,
        "points": {},
    }  # fmt: skip
    only = set(args.points.split(",")) if args.points else None
    for pid, p in plan["points"].items():
        if only is not None and pid not in only:
            continue
        mix = mix_weights(workload, setup.long_classes, p["long_ratio"])
        res: dict[str, Any] = {}
        for system in ALL:
            if (pid, system) not in wanted or (systems and system not in systems):
                continue
            runs = []
            for k in range(args.seeds):
                seed = p["seed"] + k
                trace = generate(workload, mix, rate=p["rate"], duration_s=p["duration_s"],
                                 seed=seed, burstiness=campaign.points[pid].burstiness)  # fmt: skip
                if k == 0 and len(trace) != len(p["requests"]):
                    raise SystemExit(
                        f"{pid}: regenerated trace has {len(trace)} requests, "
                        f"the plan {len(p['requests'])}: workload changed"
                    )
                r = simulate(setup, trace, system, seed=seed, baseline=settings[pid, system])
                runs.append(summarize(r))
            first = runs[0]
            res[system] = {
                "attainment": first["attainment"],
                "short_attainment": first["short_attainment"],
                "long_attainment": first["long_attainment"],
                "tpot_p50_ms": first["tpot_p50_ms"],
                "tpot_p95_ms": first["tpot_p95_ms"],
                "classes": {n: {k: c[k] for k in ("attainment", "p50_s", "p95_s")}
                            for n, c in first["classes"].items()},
                "attainment_seeds": [x["attainment"] for x in runs],
            }  # fmt: skip
        out["points"][pid] = res
    if args.out.endswith(".gz"):  # compact and gzipped (mtime 0: the same result, the same bytes)
        text = json.dumps(out, separators=(",", ":"), default=str) + "\n"
        Path(args.out).write_bytes(gzip.compress(text.encode(), mtime=0))
    else:
        Path(args.out).write_text(json.dumps(out, indent=1, default=str) + "\n")
    print(f"wrote {args.out}")
    return 0


def sim_baseline(item: dict[str, Any]) -> dict[str, Any] | None:
    """An item's recorded 2026-baseline settings as `sim.baselines.BaselineHooks` keywords."""
    out = {k: item[f] for k, f in (("share", "static_share"), ("window", "window")) if f in item}
    return out or None


def cmd_carry(args: argparse.Namespace) -> int:
    from reuse import carry  # bench/eval/reuse.py, next to this script

    from horizonserve.runtime.calibrate.records import read_plan

    plan, sha = read_plan(args.plan)
    systems = set(args.systems.split(","))
    unknown = systems - set(ALL)
    if unknown:
        raise SystemExit(f"--systems: unknown {sorted(unknown)}; choose from {', '.join(ALL)}")
    ids = carry(plan, sha, Path(getattr(args, "from")), systems, Path(args.out))
    print(f"carried {len(ids)} items into {args.out}: {', '.join(ids)}")
    return 0


def cmd_compact(args: argparse.Namespace) -> int:
    """Committed sessions' records and step traces to xz (`compaction.compact_members`): the
    same bytes, about a quarter smaller; every reader takes either. `--steps-at-ns` also rounds
    the step traces' floats to 1 ns (`compaction.steps_at_ns`), as runs now write them. A linked
    session is compacted once, where it lives. Not for a session being run: `run` appends gzip
    members."""
    sessions = sorted(
        {s.parent.resolve() for root in args.dirs for s in Path(root).rglob("summary.json")}
    )
    saved = files = 0
    for session in sessions:
        for name in ("records.jsonl.gz", "steps.jsonl.gz"):
            if (session / name).exists():
                saved += compact_members(session / name)
                files += 1
        if args.steps_at_ns and (session / "steps.jsonl.xz").exists():
            saved += steps_at_ns(session / "steps.jsonl.xz")
    print(f"compacted {files} files in {len(sessions)} sessions: {saved / 2**20:.1f} MiB saved")
    return 0


# -- CLI ------------------------------------------------------------------------------------------
def _floats(text: str) -> list[float]:
    return [float(x) for x in text.split(",") if x.strip()]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("plan", help="write the campaign plan (points, requests, items, SLOs)")
    p.add_argument("--out", required=True)
    p.add_argument("--pipeline", default="qwen2_5_omni")
    p.add_argument("--preset", default="full")
    p.add_argument(
        "--profile",
        default="tuned",
        choices=("stock", "tuned"),
        help="deploy profile of the stage limits: the vLLM-Omni files as shipped, or tuned",
    )
    p.add_argument("--artifact", default="runtime/data/calibration/h200-measured.json")
    p.add_argument("--duration", type=float, default=30.0, help="seconds of arrivals per point")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument(
        "--burstiness",
        type=ck.positive,
        default=1.0,
        help="arrivals: gamma gaps of shape b > 0 (vLLM's serving benchmark); 1 is Poisson",
    )
    p.add_argument("--stress-rate", type=float, default=8.0, help="tier-1 rate, req/s")
    p.add_argument("--rates", type=_floats, default=[2.0, 4.0, 6.0, 8.0, 10.0])
    p.add_argument("--long-rate", type=float, default=6.0, help="offered load of the long sweep")
    p.add_argument("--long-ratios", type=_floats, default=[0.0, 0.3, 0.6])
    p.add_argument("--stress-long", type=float, default=0.6)
    p.add_argument("--drain-slack", type=float, default=1.0, help="s after the largest SLO")
    p.add_argument(
        "--idle-cap", type=float, default=3.0, help="s to let leftovers finish before the abort"
    )
    p.add_argument(
        "--control",
        action="append",
        metavar="KEY=VALUE",
        help="override a calibrated control decision in the plan's serving config (an "
        "experiment on it, e.g. reservation_pays=false or sm_split=ladder); the plan records it",
    )
    p.add_argument(
        "--new-baselines",
        action="store_true",
        help="the 2026 baselines (shed, shed-edf, vllm-omni-current, mps-static) join the main "
        "systems wherever they run",
    )
    p.add_argument(
        "--capacity",
        action="append",
        metavar="SIM_PLAN.json",
        help="a capacity campaign instead of the rate sweep: each system's simulated capacity "
        "at 90 %% from `horizonserve sim plan --json` (repeatable; a later file's system wins) "
        "bracketed on the grid, the --stress-long point at --long-rate, a past-capacity point",
    )
    p.add_argument("--systems", help="capacity campaign: comma-separated systems (default: "
                   "HorizonServe, the paper's baselines and the 2026 ones)")  # fmt: skip
    p.add_argument("--grid", type=float, default=0.5, help="capacity campaign: rate grid, req/s")
    p.add_argument(
        "--past-rate",
        type=float,
        help="capacity campaign: the past-capacity rate (default: 1.2 x the highest simulated "
        "capacity, rounded up to the grid)",
    )
    p.add_argument("--window", type=int, help="vllm-omni-current: the talker's window K "
                   "(default: its places, where the simulator's K lands on the shipped "
                   "calibration)")  # fmt: skip
    p.add_argument("--static-share", type=int, help="mps-static: the shared stage's SMs "
                   "(default: runtime.baselines.static_share for the pipeline)")  # fmt: skip
    r = sub.add_parser("run", help="run pending items on the engine (the GPU)")
    r.add_argument("--plan", required=True)
    r.add_argument("--out", required=True)
    r.add_argument("--budget-s", type=float, default=500.0, help="stop before this (s)")
    r.add_argument("--done", action="append", help="folder(s) with earlier summary.json files")
    r.add_argument("--only", help="comma-separated item or point ids")
    r.add_argument("--redo", help="comma-separated item ids to run again although done")
    r.add_argument("--max-tier", type=int, default=99)
    r.add_argument("--device", default="auto")
    r.add_argument("--threads", type=int, default=1)
    r.add_argument("--seed", type=int, default=0, help="model weights seed")
    r.add_argument("--no-warmup", dest="warmup", action="store_false")
    s = sub.add_parser("simulate", help="the simulator's prediction for the plan's points")
    s.add_argument("--plan", required=True)
    s.add_argument("--out", required=True)
    s.add_argument("--artifact", help="default: the plan's")
    s.add_argument("--systems")
    s.add_argument("--seeds", type=int, default=3, help="trace seeds (the first is the plan's)")
    s.add_argument("--points", help="comma-separated point ids (default: all)")
    s.add_argument(
        "--as-run",
        metavar="SESSION",
        help="replay the control knobs this session of the plan ran (its summary.json) where "
        "the plan records fewer (default: the plan's, older knobs at their values before them)",
    )
    s.add_argument(
        "--control", action="append", metavar="KEY=VALUE", help="override a control knob"
    )
    c = sub.add_parser("carry", help="carry finished items of an earlier run into this plan")
    c.add_argument("--plan", required=True)
    c.add_argument("--from", required=True, help="the earlier run folder (with its plan.json)")
    c.add_argument("--systems", required=True, help="comma-separated systems whose code path "
                   "did not change between the two runs")  # fmt: skip
    c.add_argument("--out", required=True, help="a new part folder of this run, e.g. RUN/s0")
    k = sub.add_parser("compact", help="finished sessions' raw records to xz (the same bytes)")
    k.add_argument("dirs", nargs="+", help="folders searched for sessions (summary.json)")
    k.add_argument("--steps-at-ns", action="store_true", help="also round the step traces' "
                   "floats to 1 ns, the clock's resolution (runs since write them so)")  # fmt: skip
    args = ap.parse_args(argv)
    commands = {
        "plan": cmd_plan,
        "run": cmd_run,
        "simulate": cmd_simulate,
        "carry": cmd_carry,
        "compact": cmd_compact,
    }
    return commands[args.cmd](args)


if __name__ == "__main__":
    raise SystemExit(main())
