"""How many images a second the BAGEL-shaped DiT finishes once it is saturated (measured, raw
records), and what BAGEL's 2x capacity target would ask of it.

    python bench/results/h200-eval/capacity/dit_bound.py

Per item: image requests arriving per second, images finished per second between 10 s and the
last arrival (the DiT busy throughout at these rates), images met. Last, the image path's share
at 2x the best baseline's capacity (capacity.json) with the text path at HorizonServe's measured
level: the in-time images per second that 90 % overall attainment needs, against the best
finishing rate measured.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from statistics import fmean

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "eval"))
from report import load_run

R = Path(__file__).resolve().parents[1]  # bench/results/h200-eval
ITEMS = [  # (report, item): the saturated points, HorizonServe and the best baseline
    ("bagel-bracket-v1", "r2.5/horizon/rep1"),
    ("bagel-bracket-v1", "r2.5/horizon/rep2"),
    ("bagel-ship-v1", "r3/horizon/rep1"),
    ("bagel-ship-v1", "r3/horizon/rep2"),
    ("bagel-ship-v1", "r3/horizon/rep3"),
    ("bagel-past-v1", "r4/horizon/rep1"),
    ("bagel-past-v1", "r4/priority/rep1"),
]
TARGET = 0.9


def main() -> None:
    print("report | item | images arriving /s | finished /s (10 s .. last arrival) | met / all")
    best_rate, shares, text = 0.0, [], []
    for run, key in ITEMS:
        recs = load_run(R / run)["items"][key]["records"]
        img = [r for r in recs if r["path"] == "long"]
        last = max(r["arrival_offset_s"] for r in recs)
        done = [
            r["arrival_offset_s"] + r["first_response_s"]
            for r in img
            if r.get("first_response_s") is not None
        ]
        rate = sum(1 for t in done if 10.0 <= t <= last) / (last - 10.0)
        arriving = len(img) / last
        met = sum(r["slo_met"] for r in img)
        print(f"{run} | {key} | {arriving:.2f} | {rate:.2f} | {met} / {len(img)}")
        shares.append(len(img) / len(recs))
        if "/horizon/" in key:
            best_rate = max(best_rate, rate)
            short = [r for r in recs if r["path"] == "short"]
            text.append(sum(r["slo_met"] for r in short) / len(short))
    cap = json.loads((R / "capacity" / "capacity.json").read_text())
    bagel = cap["pipelines"]["bagel"]
    rate2x = 2 * bagel["capacity"][bagel["best_baseline"]]["rate"]
    share, t = fmean(shares), fmean(text)
    need_frac = (TARGET - (1 - share) * t) / share
    need = need_frac * share * rate2x
    print(
        f"2x the best baseline's capacity: {rate2x:.2f} req/s, {share * rate2x:.2f} images/s "
        f"arriving (image share {share:.2f}); with the text path at {100 * t:.1f} % "
        f"(HorizonServe's mean here) 90 % overall needs {100 * need_frac:.1f} % of the images "
        f"in time, {need:.2f} images/s, x{need / best_rate:.2f} the best finishing rate measured "
        f"({best_rate:.2f}/s)"
    )


if __name__ == "__main__":
    main()
