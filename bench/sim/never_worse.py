"""SIMULATED: the never-worse rule, per mechanism. HorizonServe against HorizonServe with one
mechanism switched off (or, for a mechanism off by default, switched on), per pipeline, rate and
seed, on the shipped (fitted H200) artifact.
A mechanism passes where, at every rate, the mean loss against its "off" variant is within
the seed-to-seed spread (the largest per-seed difference minus the smallest).

    python bench/sim/never_worse.py [--pipelines qwen2_5_omni,bagel] [--seeds 4]
        [--mechanisms "saturated first,place admission"] > out.txt
"""

from __future__ import annotations

import argparse
import statistics
import sys
from concurrent.futures import ProcessPoolExecutor
from dataclasses import replace
from pathlib import Path
from typing import Any

from horizonserve.runtime.artifact import load_artifact
from horizonserve.runtime.config import ControlParams, SharingVerdicts
from horizonserve.runtime.sim.setup import SimSetup

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import measured_setup, point

# Rates span each pipeline's simulated capacity on the default artifact (sim plan: Qwen2.5-Omni
# about 8.4 req/s, MiMo-Audio about 10.5, BAGEL about 2.7) and go past it.
RATES = {
    "qwen2_5_omni": (6.0, 8.0, 10.0, 12.0, 14.0),
    "mimo_audio": (6.0, 8.0, 10.0, 12.0, 14.0),
    "bagel": (1.0, 2.0, 3.0, 4.0),
}
# mechanism -> (system, control knobs) of its "off" variant
OFF: dict[str, tuple[str, dict[str, Any]]] = {
    "reservation": ("horizon", {"reservation_pays": False}),
    "slack split": ("horizon", {"sm_split": "ladder", "downstream_urgency": "slack"}),
    "downstream control": ("horizon-no-downstream", {}),
    "preemption": ("horizon-no-preemption", {}),
    "path rotation": ("horizon-no-rotation", {}),
    "late yield": ("horizon", {"late": "compete"}),
    "late phase yield": ("horizon", {"late": "yield"}),
    "place admission": ("horizon", {"downstream": "deadline"}),
    "deadline order": ("horizon", {"view_order": "arrival"}),
    "saturated first": ("horizon", {"downstream_urgency": "slack"}),
}
# mechanism off by default -> the control knobs that switch it on (its row: with it − shipped)
OPT_IN: dict[str, dict[str, Any]] = {"reject late": {"reject_late": True}}
_CACHE: dict[str, tuple[SimSetup, Any]] = {}


def _setup(pipeline: str) -> tuple[SimSetup, Any]:
    if pipeline not in _CACHE:
        _CACHE[pipeline] = measured_setup(pipeline, load_artifact(None))
    return _CACHE[pipeline]


def _one(job: tuple[str, str, float, int, float]) -> tuple[str, str, float, int, float]:
    pipeline, variant, rate, seed, duration = job
    setup, wl = _setup(pipeline)
    system, knobs = "horizon", OPT_IN.get(variant, {})
    if variant in OFF:
        system, knobs = OFF[variant]
    if knobs:
        verdicts = {k: v for k, v in knobs.items() if k in SharingVerdicts.model_fields}
        control = {k: v for k, v in knobs.items() if k not in verdicts}
        setup = replace(
            setup,
            control=ControlParams.model_validate({**setup.control.model_dump(), **control}),
            verdicts=setup.cal.verdicts().model_copy(update=verdicts),
        )
    att = point(setup, wl, system, rate, seed, duration)["attainment"]
    return pipeline, variant, rate, seed, att


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--pipelines", default=",".join(RATES))
    ap.add_argument("--seeds", type=int, default=4)
    ap.add_argument("--duration", type=float, default=120.0)
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--mechanisms", help="comma-separated rows to run (default: all)")
    args = ap.parse_args()
    pipes = [p for p in args.pipelines.split(",") if p]
    rows = (*OFF, *OPT_IN)
    if args.mechanisms:
        rows = tuple(m for m in args.mechanisms.split(",") if m)
        unknown = [m for m in rows if m not in OFF and m not in OPT_IN]
        if unknown:
            ap.error(f"--mechanisms: unknown {unknown}; known: {', '.join((*OFF, *OPT_IN))}")
    print(f"SIMULATED, never-worse per mechanism, {args.seeds} seeds, {args.duration:g}-s points")
    jobs = [
        (p, v, r, s, args.duration)
        for p in pipes
        for v in ("on", *rows)
        for r in RATES[p]
        for s in range(args.seeds)
    ]
    att: dict[tuple[str, str, float, int], float] = {}
    with ProcessPoolExecutor(args.jobs) as pool:
        for p, v, r, s, a in pool.map(_one, jobs, chunksize=4):
            att[(p, v, r, s)] = a
    failures = []
    for p in pipes:
        ctl = _setup(p)[0].cal.verdicts()
        print(f"\n## {p} (throttling_pays {ctl.throttling_pays}, reservation_pays "
              f"{ctl.reservation_pays})\n")  # fmt: skip
        print("| mechanism | " + " | ".join(f"{r:g} req/s" for r in RATES[p]) + " | verdict |")
        print("|---" * (len(RATES[p]) + 2) + "|")
        for v in rows:
            with_it, without = (v, "on") if v in OPT_IN else ("on", v)
            cells, ok = [], True
            for r in RATES[p]:
                seeds = range(args.seeds)
                diff = [att[(p, with_it, r, s)] - att[(p, without, r, s)] for s in seeds]
                mean, spread = statistics.fmean(diff), max(diff) - min(diff)
                cells.append(f"{100 * mean:+.1f} ± {100 * spread:.1f}")
                if mean < -spread:
                    ok = False
            verdict = "never worse" if ok else "WORSE"
            if not ok:
                failures.append(f"{p}/{v}")
            print(f"| {v} | " + " | ".join(cells) + f" | {verdict} |")
    opt = [m for m in rows if m in OPT_IN]
    opt_in = f"; opt-in rows ({', '.join(opt)}): with it − as shipped" if opt else ""
    print(
        "\ncells: mean of (with the mechanism − without) over seeds, pp ± the seed-to-seed spread"
        " of that difference" + opt_in
    )
    print("failing:", ", ".join(failures) or "none")


if __name__ == "__main__":
    main()
