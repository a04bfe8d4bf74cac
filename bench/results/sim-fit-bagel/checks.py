"""Checks of the fitted BAGEL entry beyond the fit itself (SIMULATED; run from the repo root):

    python bench/results/sim-fit-bagel/checks.py > bench/results/sim-fit-bagel/checks.json

1. The campaign replayed on the shipped default (runtime/data/calibration/h200-fitted.json) as
   its fit replayed it (`sim.fit.replay_of`): per item the measured and simulated attainment,
   short / long path and per class, scored over all requests and over arrivals after 12 s
   (the campaign report's 10 % warm-up).
2. The simulator's own noise: the same replay at simulator seeds 0-4 (pressure noise only;
   the trace stays the point's), per item the range.
3. Before this fit: the shipped default of commit 06699d9 (the BAGEL entry as calibrated, the
   tuned deploy file's limits, class profiles derived from it) replayed as that tree's fit
   machinery did (deploy profile tuned), with today's simulator (its new rules are off for an
   entry that does not set them).
4. Step rows, GPU against simulated, at the fit point r2: the shared stage's prefill time per
   padded prompt length and decode time per decode row count, by how it shared the GPU.
5. What each modelled rule is worth: the replay's error with the shipped entry less one rule
   at a time (the value it had before), no refit.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

from horizonserve.runtime.calibrate.artifact import CalibrationArtifact, load_artifact
from horizonserve.runtime.calibrate.records import (
    Campaign,
    read_campaign,
    read_members,
    read_steps,
)
from horizonserve.runtime.sim.engine import simulate
from horizonserve.runtime.sim.fit import Replay, errors_pp, mae, replay_of
from horizonserve.runtime.sim.model import SharedCost
from horizonserve.runtime.sim.systems import get_system
from horizonserve.runtime.spatial import partitioned

RUN = "bench/results/h200-eval/bagel-v2"
PIPE = "bagel"
BEFORE = "06699d9"  # the tree before this fit
WARMUP_S = 12.0


def _share(met: list[bool]) -> float | None:
    return round(100 * sum(met) / len(met), 1) if met else None


def measured_classes(c: Campaign, key: str) -> dict[str, float | None]:
    """Per-class attainment of an item from its records, mean over repetitions."""
    it = c.items[key]
    per: dict[str, list[float]] = defaultdict(list)
    for session, item_id in zip(it.sessions, it.item_ids, strict=True):
        for m in read_members(Path(c.path) / session / "records.jsonl.gz"):
            if m["item"] != item_id:
                continue
            by: dict[str, list[bool]] = defaultdict(list)
            for r in m["records"]:
                if r.get("arrival_offset_s", 0.0) >= c.warmup_s:
                    by[r["class"]].append(bool(r["slo_met"]))
            for name, met in by.items():
                v = _share(met)
                if v is not None:
                    per[name].append(v)
    return {k: round(statistics.fmean(v), 1) for k, v in per.items()}


def replay(art: CalibrationArtifact, c: Campaign, rp: Replay, seeds: bool) -> dict[str, Any]:
    cal = art.pipeline(PIPE)
    setup = rp.setup(cal)
    items: dict[str, Any] = {}
    sims: dict[str, float] = {}
    for key, it in c.items.items():
        point = c.points[it.point]
        r = simulate(setup, rp.trace(it.point), it.system, seed=point.seed)
        sims[key] = r.attainment()
        short = r.short_mask()
        row: dict[str, Any] = {
            "measured": round(100 * it.attainment, 1),
            "simulated": round(100 * sims[key], 1),
            "error_pp": round(100 * (sims[key] - it.attainment), 1),
            "short": [_r1(it.short_attainment), round(100 * r.attainment(short), 1)],
            "long": [_r1(it.long_attainment), round(100 * r.attainment(~short), 1)],
        }
        meas = measured_classes(c, key)
        met = r.met()
        win = r.window()
        row["classes"] = {
            name: [meas.get(name), _share(list(met[win & (r.cls == i)]))]
            for i, name in enumerate(r.classes)
        }
        if seeds:
            got = [
                100 * simulate(setup, rp.trace(it.point), it.system, seed=s).attainment()
                for s in range(5)
            ]
            row["seeds_0_4"] = [round(min(got), 1), round(max(got), 1)]
        items[key] = row
    err = errors_pp(sims, c)
    fit = cal.fit
    out: dict[str, Any] = {"mae_all_pp": round(mae(err), 2)}
    if fit is not None and fit.fit_items and set(fit.fit_items) <= set(err):
        out["mae_fit_items_pp"] = round(mae(err, fit.fit_items), 2)
        out["mae_holdout_pp"] = round(mae(err, fit.holdout_items), 2)
    worst = max(err, key=lambda k: abs(err[k]))
    out["largest_miss"] = f"{worst} ({err[worst]:+.1f} pp)"
    out["items"] = items
    return out


def _r1(x: float | None) -> float | None:
    return None if x is None else round(100 * x, 1)


def _mode(level: int, shared: int, prefill_sms: int, active: bool, mps: bool) -> str:
    if not active:
        return "alone"
    if mps:
        return "mps"
    if not partitioned(level):
        return "timeslice"
    return "boost" if prefill_sms > shared else f"partition {shared} SMs"


def step_table(art: CalibrationArtifact, c: Campaign, rp: Replay, point: str) -> dict[str, Any]:
    """Median prefill_s per (mode, padded length) and decode_s per (mode, rows), GPU / sim."""
    cal = art.pipeline(PIPE)
    setup = rp.setup(cal)
    cost = SharedCost(setup.cal)
    buckets = sorted(setup.cal.shared.prefill_buckets or [])

    def pad(n: int) -> int:
        return next((b for b in buckets if b >= n), n)

    def collect(members: list[dict[str, Any]], mps: bool, into: dict[str, Any], side: int) -> None:
        for m in members:
            ix = {k: i for i, k in enumerate(m["columns"])}
            for r in m["rows"]:
                mode = _mode(
                    r[ix["level"]],
                    r[ix["shared_sms"]],
                    r[ix["prefill_sms"]],
                    bool(r[ix["downstream_active"]]),
                    mps,
                )
                if r[ix["prefill_batch"]] == 1:
                    into["prefill"][f"{mode} | {pad(r[ix['prefill_tokens']])}"][side].append(
                        r[ix["prefill_s"]]
                    )
                if r[ix["decode_batch"]] > 0:
                    rows = cost.decode_rows(r[ix["decode_batch"]])
                    into["decode"][f"{mode} | {rows}"][side].append(r[ix["decode_s"]])

    acc: dict[str, Any] = {
        "prefill": defaultdict(lambda: ([], [])),
        "decode": defaultdict(lambda: ([], [])),
    }
    for key, it in c.items.items():
        if it.point != point:
            continue
        mps = get_system(it.system).mps
        collect(read_steps(c, key), mps, acc, 0)
        r = simulate(
            setup, rp.trace(point), it.system, seed=c.points[point].seed, record_steps=True
        )
        assert r.steps is not None
        collect([r.steps], mps, acc, 1)
    out: dict[str, Any] = {}
    for part, groups in acc.items():
        rows = {}
        for k, (gpu, sim) in sorted(groups.items()):
            if len(gpu) >= 10 and sim:
                rows[k] = {
                    "gpu_n": len(gpu),
                    "gpu_p50_ms": round(1e3 * statistics.median(gpu), 1),
                    "sim_n": len(sim),
                    "sim_p50_ms": round(1e3 * statistics.median(sim), 1),
                }
        out[part] = rows
    return out


def ablation(art: CalibrationArtifact, c: Campaign) -> dict[str, Any]:
    """MAE over every item with one rule of the entry undone (module doc, 5)."""
    cal = art.pipeline(PIPE)
    sh, sg = cal.shared, cal.sharing
    deploy = {
        "max_num_seqs": 12,
        "max_num_batched_tokens": 32768,
        "graph_batch_sizes": [1, 2, 4, 8, 12],
    }
    undo: dict[str, tuple[dict[str, Any], dict[str, Any], bool]] = {
        "none (the shipped entry)": ({}, {}, True),
        "1024 prompt tokens per image (the calibration's carried-over value)": (
            {"tokens_per_image": 1024.0}, {}, True),
        "thinker limits of BAGEL's deploy file (12 slots, 32768 tokens)": (deploy, {}, True),
        "no prefill padding": ({"prefill_buckets": None}, {}, True),
        "no prefill call cost": ({"prefill_call_s": 0.0}, {}, True),
        "first token at the iteration's end (one pass)": ({"prefill_then_decode": False}, {}, True),
        "boosted prefill pays the full MPS excess": ({}, {"boost_prefill_excess": 1.0}, True),
        "MPS decode excess flat in the rows": ({}, {"mps_decode_rows_frac": 0.0}, True),
        "class profiles derived from the entry (not the plan's)": ({}, {}, False),
    }  # fmt: skip
    out: dict[str, Any] = {}
    keys = list(c.items)
    for what, (shared, sharing, recorded) in undo.items():
        entry = cal.model_copy(
            update={
                "shared": sh.model_copy(update=shared),
                "sharing": sg.model_copy(update=sharing),
            }
        )
        rp = Replay(c, art, None, recorded_classes=recorded)
        err = errors_pp(rp.attainment(entry, keys), c)
        worst = max(err, key=lambda k: abs(err[k]))
        out[what] = {"mae_pp": round(mae(err), 2), "largest_miss": f"{worst} ({err[worst]:+.1f})"}
    return out


def before_artifact() -> CalibrationArtifact:
    path = "runtime/data/calibration/h200-fitted.json"
    text = subprocess.run(
        ["git", "show", f"{BEFORE}:{path}"], check=True, capture_output=True, text=True
    ).stdout
    return CalibrationArtifact.model_validate_json(text)


def main() -> None:
    art = load_artifact()  # the shipped default
    out: dict[str, Any] = {"label": "SIMULATED vs measured", "campaign": RUN, "replay": {}}
    for w in (0.0, WARMUP_S):
        c = read_campaign(RUN, warmup_s=w)
        out["replay"][f"fitted_warmup_{w:g}s"] = replay(art, c, replay_of(c, art), w == 0.0)
        print(f"done warm-up {w:g}", file=sys.stderr)
    c = read_campaign(RUN)
    old = before_artifact()
    out["replay"][f"before_{BEFORE}"] = replay(old, c, Replay(c, old, "tuned"), False)
    out["steps_r2"] = step_table(art, c, replay_of(c, art), "r2")
    out["ablation"] = ablation(art, c)
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
