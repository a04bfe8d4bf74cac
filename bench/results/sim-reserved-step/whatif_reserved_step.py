"""What-if (SIMULATED beside measured): the Qwen2.5-Omni thinker's decode step on the 16-SM
reservation as the GPU's step traces measure it, no refit.

    python bench/results/sim-reserved-step/whatif_reserved_step.py gap
    python bench/results/sim-reserved-step/whatif_reserved_step.py whatif 1.0,1.55

`gap`: decode-only steps while the talker runs, per SM count and decode batch (groups of 8):
the median step time on the GPU (the campaign's trace) against the simulator's own steps on
the same requests under the same controller (`record_steps`), and their ratio; last, the
ratio of the two medians over every reserved step of the items.
`whatif`: the shipped entry with its shared co-run decode factor at the reservation's SM count
(`SmLadder.reserve`) scaled by each factor; per item SIMULATED / measured attainment %, each
item under the controller its session ran (the wait-for-a-place items with
`place_wait_slack`, which their code ran unconditionally).
`fit`: the same entries on the items the shipped entry's fit recorded (its fit and held-out
items, replayed as the fit replayed them): the mean absolute attainment error of each set.
`speech`: at 6 req/s under SATURATED (qwen-l0-v1) and with the rule off (qwen-sdf-v1), per
speech class the SIMULATED attainment, the thinker's TPOT p50 and first response p50 (the
measured figures are the raw records', `../h200-eval/qwen-place-wait-v1/handoff.txt`).
"""

from __future__ import annotations

import statistics
import sys
from dataclasses import replace

import numpy as np

from horizonserve.runtime.calibrate.artifact import PipelineCalibration, load_artifact
from horizonserve.runtime.calibrate.records import read_campaign, read_steps
from horizonserve.runtime.sim.engine import simulate
from horizonserve.runtime.sim.fit import Replay, errors_pp, items_by_run, replay_of

ARTIFACT = "runtime/data/calibration/h200-fitted.json"
R = "bench/results/h200-eval"
PLACE_WAIT = f"{R}/qwen-place-wait-v1"  # ran the wait-for-a-place slack (11f93f3)
ITEMS = {
    f"{R}/qwen-l0-v1": ["r6/horizon"],
    f"{R}/qwen-sdf-v1": ["r6/horizon", "r6-l60/horizon"],
    PLACE_WAIT: ["r6/horizon", "r8/horizon", "r10/horizon", "r6-l60/horizon"],
    f"{R}/qwen-ship-v2": ["r8/horizon", "r10/horizon", "r6-l60/horizon", "r10/edf-mps"],
}  # fmt: skip
GAP_ITEMS = {f"{R}/qwen-l0-v1": ["r6/horizon"], f"{R}/qwen-ship-v2": ["r6-l60/horizon"]}
BUCKET = 8


def _decode_steps(columns: list[str], rows: list[list[float]]) -> dict[tuple[int, int], list]:
    """Decode-only step times while the downstream runs, by (shared SMs, batch group)."""
    ix = {c: i for i, c in enumerate(columns)}
    by: dict[tuple[int, int], list[float]] = {}
    for r in rows:
        if r[ix["prefill_batch"]] or not r[ix["decode_batch"]] or not r[ix["downstream_active"]]:
            continue
        key = (int(r[ix["shared_sms"]]), int(r[ix["decode_batch"]]) // BUCKET)
        by.setdefault(key, []).append(r[ix["decode_s"]])
    return by


def _setup(replay: Replay, run: str, cal: PipelineCalibration, key: str):  # type: ignore[no-untyped-def]
    setup = replay.setup(cal, key)
    if run == PLACE_WAIT:
        control = setup.control.model_copy(update={"place_wait_slack": True})
        setup = replace(setup, control=control)
    return setup


def gap() -> None:
    art = load_artifact(ARTIFACT)
    cal = art.pipeline("qwen2_5_omni")
    reserve = cal.ladder.s_reserve
    print(f"{ARTIFACT}: decode-only step medians, measured / SIMULATED (same requests)")
    pooled: dict[str, list[float]] = {"gpu": [], "sim": []}
    for run, keys in GAP_ITEMS.items():
        c = read_campaign(run)
        replay = replay_of(c, art)
        for key in keys:
            it = c.items[key]
            seed = c.points[it.point].seed
            r = simulate(
                _setup(replay, run, cal, key), replay.trace(it.point), it.system, seed=seed,
                record_steps=True,
            )  # fmt: skip
            assert r.steps is not None
            sim = _decode_steps(r.steps["columns"], r.steps["rows"])
            member = read_steps(c, key)[0]
            gpu = _decode_steps(member["columns"], member["rows"])
            for k in sorted(set(sim) & set(gpu)):
                g, s = gpu[k], sim[k]
                if len(g) < 10 or len(s) < 10:
                    continue
                if k[0] == reserve:
                    pooled["gpu"] += g
                    pooled["sim"] += s
                gm, sm = statistics.median(g), statistics.median(s)
                lo = k[1] * BUCKET
                print(
                    f"{run.rsplit('/', 1)[1]} {key} | {k[0]} SMs | batch {lo}-{lo + BUCKET - 1} | "
                    f"{1e3 * gm:.1f} ms (n={len(g)}) / {1e3 * sm:.1f} ms (n={len(s)}) | "
                    f"x{gm / sm:.2f}"
                )
    g, s = statistics.median(pooled["gpu"]), statistics.median(pooled["sim"])
    ms = f"{1e3 * g:.1f} / {1e3 * s:.1f} ms"
    print(f"every reserved decode step ({reserve} SMs): {ms}, x{g / s:.2f}")


def _scaled(cal: PipelineCalibration, k: float) -> PipelineCalibration:
    """The entry with its shared co-run decode factor at the reservation's SM count × k."""
    curve, reserve = cal.shared.corun_decode_factor, cal.ladder.s_reserve
    values = [v * k if s == reserve else v for s, v in zip(curve.sms, curve.values, strict=True)]
    shared = cal.shared.model_copy(
        update={"corun_decode_factor": curve.model_copy(update={"values": values})}
    )
    return cal.model_copy(update={"shared": shared})


def fit(factors: list[float]) -> None:
    art = load_artifact(ARTIFACT)
    cal = art.pipeline("qwen2_5_omni")
    record = cal.fit
    assert record is not None
    print(f"{ARTIFACT}: its fit's items, SIMULATED against measured, mean |error| pp")
    for k in factors:
        entry = _scaled(cal, k)
        scaled = art.model_copy(update={"pipelines": {**art.pipelines, "qwen2_5_omni": entry}})
        err: dict[str, float] = {}
        for run, keys in items_by_run(record).items():
            c = read_campaign(run, warmup_s=record.warmup_s)
            got = errors_pp(replay_of(c, scaled).attainment(entry, list(keys.values())), c)
            err.update({rec: got[item] for rec, item in keys.items()})
        mae_in = statistics.mean(abs(err[x]) for x in record.fit_items)
        mae_out = statistics.mean(abs(err[x]) for x in record.holdout_items)
        print(f"x{k:g} | fit items {mae_in:.2f} | held out {mae_out:.2f}")


def whatif(factors: list[float]) -> None:
    art = load_artifact(ARTIFACT)
    cal = art.pipeline("qwen2_5_omni")
    reserve = cal.ladder.s_reserve
    curve = cal.shared.corun_decode_factor
    print(
        f"{ARTIFACT}, the shared co-run decode factor at {reserve} SMs "
        f"({curve.at(reserve):.3f}) scaled: SIMULATED / measured attainment %"
    )
    for run, keys in ITEMS.items():
        c = read_campaign(run)
        replay = replay_of(c, art)
        for k in factors:
            entry = _scaled(cal, k)
            cells = []
            for key in keys:
                it = c.items[key]
                seed = c.points[it.point].seed
                r = simulate(
                    _setup(replay, run, entry, key), replay.trace(it.point), it.system, seed=seed
                )
                cells.append(f"{key} {100 * r.attainment():.1f} / {100 * it.attainment:.1f}")
            print(f"{run.rsplit('/', 1)[1]} x{k:g} | " + " | ".join(cells))


def speech(factors: list[float]) -> None:
    art = load_artifact(ARTIFACT)
    cal = art.pipeline("qwen2_5_omni")
    print(f"{ARTIFACT}, SIMULATED at 6 req/s: per speech class met %, TPOT p50 ms, first p50 s")
    for run in (f"{R}/qwen-l0-v1", f"{R}/qwen-sdf-v1"):
        c = read_campaign(run)
        replay = replay_of(c, art)
        it = c.items["r6/horizon"]
        for k in factors:
            setup = _setup(replay, run, _scaled(cal, k), "r6/horizon")
            r = simulate(setup, replay.trace(it.point), it.system, seed=c.points[it.point].seed)
            met = r.met()
            cells = [
                f"{name} {100 * met[r.cls == i].mean():.1f} / "
                f"{1e3 * np.nanmedian(r.tpot[r.cls == i]):.1f} / "
                f"{np.nanmedian(r.latency[r.cls == i]):.2f}"
                for i, name in enumerate(r.classes)
                if name.endswith("speech")
            ]
            tpot = 1e3 * np.nanmedian(r.tpot)
            reserved = 100 * r.stats["reserved_frac"]
            print(
                f"{run.rsplit('/', 1)[1]} x{k:g} | TPOT p50 {tpot:.1f} | reserved {reserved:.1f} % "
                "of steps | " + " | ".join(cells)
            )


if __name__ == "__main__":
    if sys.argv[1] == "gap":
        gap()
    elif sys.argv[1] == "speech":
        speech([float(x) for x in sys.argv[2].split(",")])
    elif sys.argv[1] == "fit":
        fit([float(x) for x in sys.argv[2].split(",")])
    else:
        whatif([float(x) for x in sys.argv[2].split(",")])
