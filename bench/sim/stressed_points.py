"""SIMULATED: HorizonServe against every baseline at each pipeline's stressed rates, with the
downstream-control figures (late, never answered, underruns), on the shipped (fitted H200)
calibration artifact. Mean over seeds; SLO = 5 × simulated solo p95.

    python bench/sim/stressed_points.py [--seeds 3] [--duration 120] > out.txt
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import numpy as np

from horizonserve.runtime.artifact import load_artifact
from horizonserve.runtime.bench.metrics import summarize
from horizonserve.runtime.sim.engine import simulate
from horizonserve.runtime.sim.systems import BASELINES
from horizonserve.runtime.workload import generate, mix_weights

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import measured_setup

STRESSED = {
    "qwen2_5_omni": (8.0, 10.0, 12.0),
    "mimo_audio": (4.0, 5.0, 6.0),
    "bagel": (1.0, 2.0, 3.0),
}
SYSTEMS = ("horizon", *BASELINES, "horizon-no-downstream", "horizon-no-preemption")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--duration", type=float, default=120.0)
    args = ap.parse_args()
    art = load_artifact(None)
    print(f"SIMULATED, artifact {art.source[:60]}…, {args.seeds} seeds, {args.duration:g}-s points")
    for pipe, rates in STRESSED.items():
        setup, wl = measured_setup(pipe, art)
        mix = mix_weights(wl, setup.long_classes, None)
        for rate in rates:
            rows = {}
            for system in SYSTEMS:
                att, short, long_, late, never, under = [], [], [], [], [], []
                for seed in range(args.seeds):
                    tr = generate(wl, mix, rate=rate, duration_s=args.duration,
                                  warmup_s=0.1 * args.duration, seed=seed)  # fmt: skip
                    r = simulate(setup, tr, system, seed=seed)
                    s = summarize(r)
                    att.append(s["attainment"])
                    short.append(s["short_attainment"])
                    long_.append(s["long_attainment"])
                    late.append(r.stats["downstream_late"])
                    never.append(float(np.isnan(r.latency).sum()))
                    under.append(r.stats["underruns"])
                rows[system] = [
                    statistics.fmean(x) for x in (att, short, long_, late, never, under)
                ]
            best_name = max(BASELINES, key=lambda s: rows[s][0])
            best, hs = rows[best_name][0], rows["horizon"][0]
            headroom = (hs - best) / (1 - best) if best < 1 else float("nan")
            print(f"\n{pipe} @ {rate:g} req/s: HS/best {hs / best:.2f}x (best {best_name}), "
                  f"headroom captured {headroom:+.0%}")  # fmt: skip
            print(f"  {'system':<24}{'attain':>8}{'short':>8}{'long':>8}{'late':>8}"
                  f"{'never':>8}{'underrun':>9}")  # fmt: skip
            for system, v in rows.items():
                print(f"  {system:<24}{v[0]:>8.1%}{v[1]:>8.1%}{v[2]:>8.1%}{v[3]:>8.1f}"
                      f"{v[4]:>8.1f}{v[5]:>9.1f}")  # fmt: skip
    print(
        "\ncolumns: attain/short/long = SLO attainment overall / short path / long path "
        "(after the warm-up); late = downstream admissions past the point where the deadline "
        "could be met (served, counted); never = requests with no first response by the end; "
        "underrun = speech playback underruns; headroom = (HS − best) / (100 % − best)"
    )


if __name__ == "__main__":
    main()
