"""Simulated − measured attainment per item (pp) on the three MiMo-Audio campaigns: the shipped
default before this refit ("b", ../sim-fit-h200-3/h200-fitted-b.json: each report folder's
sim_fitted.json) against the refit on mimo-reserve-v1 with the time-sliced items ("ts",
h200-fitted-ts.json). SIMULATED vs measured.
Run from the repository root after the `campaign.py simulate` calls in README.md:
`python bench/results/sim-fit-h200-4/compare.py`."""

import json
from pathlib import Path

HERE = Path(__file__).parent
EVAL = Path("bench/results/h200-eval")


def _points(path: Path) -> dict:
    return json.loads(path.read_text())["points"]


def _measured(name: str) -> dict[str, float]:
    items = json.loads((EVAL / name / "results.json").read_text())["points"]
    out = {}
    for point, systems in items.items():
        for system, row in systems.items():
            out[f"{point}/{system}"] = 100 * row["attainment"]
    return out


for name in ("mimo-v1", "mimo-r8-v1", "mimo-reserve-v1"):
    new = _points(HERE / f"{name}.ts.sim.json")
    old = _points(EVAL / name / "sim_fitted.json")
    for key, measured in sorted(_measured(name).items()):
        point, system = key.split("/")
        if system not in new.get(point, {}):
            continue
        err_new = 100 * new[point][system]["attainment"] - measured
        prev = old.get(point, {}).get(system)
        err_old = f"{100 * prev['attainment'] - measured:+6.1f}" if prev else "     —"
        print(f"{name:16} {key:14} measured {measured:5.1f}  "
              f"shipped (b) {err_old} pp  refit (ts) {err_new:+5.1f} pp")  # fmt: skip
