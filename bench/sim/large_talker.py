"""SIMULATED: Qwen2.5-Omni-shaped pipeline with a larger talker, HorizonServe against every main
baseline across arrival rates, on the shipped (fitted H200) calibration artifact.

A talker k times larger is modelled as: its step k times slower at every SM count, and the
slowdown it causes the thinker when they co-run k times larger (each co-run factor f becomes
1 + k·(f − 1), the MPS excess likewise). The calibration's decisions (throttling, reservation,
backlog lift) are re-derived from the scaled artifact, as a calibration run on such a GPU would
write them. Mean over seeds; SLO = 5 × simulated solo p95 of the scaled pipeline.

    python bench/sim/large_talker.py [--scales 1,2,3] [--rates 4,6,...] [--seeds 3]
        [--long-ratio 0.6] > out.txt
"""

from __future__ import annotations

import argparse
import statistics
import sys
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

from horizonserve.runtime.artifact import CalibrationArtifact, load_artifact
from horizonserve.runtime.sim.setup import SimSetup

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import measured_setup, point

PIPELINE = "qwen2_5_omni"
SYSTEMS = ("horizon", "fcfs", "edf", "mps", "edf-mps", "priority", "priority-mps")


def _floats(text: str) -> list[float]:
    return [float(x) for x in text.split(",") if x]


def scaled(art: CalibrationArtifact, k: float) -> CalibrationArtifact:
    """The artifact with the pipeline's talker k times larger (module doc)."""
    data = art.model_dump(mode="json")
    p = data["pipelines"][PIPELINE]
    talker = p["downstream"][0]
    talker["step_s"]["values"] = [v * k for v in talker["step_s"]["values"]]
    for curve in (p["shared"]["corun_decode_factor"], p["shared"]["corun_prefill_factor"]):
        curve["values"] = [1 + k * (f - 1) for f in curve["values"]]
    p["sharing"]["mps_shared_excess"] = p["sharing"]["mps_shared_excess"] * k
    data["source"] = f"{art.source} (talker x{k:g}, bench/sim/large_talker.py)"
    return CalibrationArtifact.model_validate(data)


def _one(
    job: tuple[float, float, str, int, float, float | None],
) -> tuple[float, float, str, float]:
    k, rate, system, seed, duration, long_ratio = job
    setup, wl = _setup(k)
    att = point(setup, wl, system, rate, seed, duration, long_ratio)["attainment"]
    return k, rate, system, att


_CACHE: dict[float, tuple[SimSetup, Any]] = {}


def _setup(k: float) -> tuple[SimSetup, Any]:
    if k not in _CACHE:
        _CACHE[k] = measured_setup(PIPELINE, scaled(load_artifact(None), k))
    return _CACHE[k]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--scales", type=_floats, default=[1.0, 2.0, 3.0])
    ap.add_argument("--rates", type=_floats, default=[4, 6, 8, 10, 12, 14, 16, 18])
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--duration", type=float, default=120.0)
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--long-ratio", type=float, default=None, help="speech share (default: mix)")
    args = ap.parse_args()
    mix = "default mix" if args.long_ratio is None else f"{args.long_ratio:.0%} speech"
    print(
        f"SIMULATED, {PIPELINE}, talker scaled, {args.seeds} seeds, {args.duration:g}-s points, "
        f"{mix}"
    )
    for k in args.scales:
        ctl = _setup(k)[0].cal.verdicts()
        print(
            f"\ntalker x{k:g}: throttling_pays {ctl.throttling_pays}, reservation_pays "
            f"{ctl.reservation_pays}, backlog_lift {ctl.backlog_lift_pays}"
        )
    jobs = [
        (k, r, s, seed, args.duration, args.long_ratio)
        for k in args.scales
        for r in args.rates
        for s in SYSTEMS
        for seed in range(args.seeds)
    ]
    got: dict[tuple[float, float, str], list[float]] = {}
    with ProcessPoolExecutor(args.jobs) as pool:
        for k, r, s, att in pool.map(_one, jobs, chunksize=4):
            got.setdefault((k, r, s), []).append(att)
    worst = None
    for k in args.scales:
        print(f"\n## talker x{k:g}: attainment % (mean over seeds)\n")
        print("| rate | " + " | ".join(SYSTEMS) + " | best baseline | HS / best | HS − best (pp) |")
        print("|---" * (len(SYSTEMS) + 4) + "|")
        for r in args.rates:
            mean = {s: statistics.fmean(got[(k, r, s)]) for s in SYSTEMS}
            best = max(SYSTEMS[1:], key=lambda s: mean[s])
            gap = 100 * (mean["horizon"] - mean[best])
            ratio = mean["horizon"] / mean[best] if mean[best] else float("nan")
            worst = gap if worst is None else min(worst, gap)
            cells = " | ".join(f"{100 * mean[s]:.1f}" for s in SYSTEMS)
            print(f"| {r:g} | {cells} | {best} | {ratio:.2f}× | {gap:+.1f} |")
    print(f"\nsmallest HS − best over every scale and rate: {worst:+.1f} pp")


if __name__ == "__main__":
    main()
