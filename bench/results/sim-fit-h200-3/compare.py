"""Simulated − measured attainment per item (pp) on the three MiMo-Audio campaigns: the
default before this refit ("old", sim-fit-h200-2's h200-fitted-l60.json) against one of the
refits (the tag names it: "b" = h200-fitted-b.json, shipped; "reserve" =
h200-fitted-reserve.json). SIMULATED vs measured. Run from the repository root after the
`campaign.py simulate` calls in README.md: `python bench/results/sim-fit-h200-3/compare.py b`."""

import json
import sys
from pathlib import Path

HERE = Path(__file__).parent
EVAL = Path("bench/results/h200-eval")
TAG = sys.argv[1]


def _points(name: str, tag: str) -> dict:
    return json.loads((HERE / f"{name}.{tag}.sim.json").read_text())["points"]


for name in ("mimo-v1", "mimo-r8-v1", "mimo-reserve-v1"):
    rows = json.loads((EVAL / name / "results.json").read_text())["sim"]["sim_fitted"]["rows"]
    old, new = _points(name, "old"), _points(name, TAG)
    for key, row in sorted(rows.items()):
        point, system = key.split("/")
        measured = 100 * row["measured"]
        err_old = 100 * old[point][system]["attainment"] - measured
        err_new = 100 * new[point][system]["attainment"] - measured
        print(f"{name:16} {key:14} measured {measured:5.1f}  "
              f"old default {err_old:+6.1f} pp  refit {err_new:+5.1f} pp")  # fmt: skip
