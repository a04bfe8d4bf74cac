"""Checks of the fitted default beyond the fit itself (SIMULATED; run from the repo root):

    python bench/results/sim-fit/checks.py > bench/results/sim-fit/checks.json

1. The campaign replayed on the fitted and on the measured-only artifact, scored over all
   requests and over arrivals after 10 s (is the fit's error a transient effect?).
2. The capacity plan at 90 % attainment on steady-state points (sim.plan.SteadyTraces: 60-s
   warm-up, 240-s window) for the main systems, on both artifacts.
"""

from __future__ import annotations

import json
import sys
import time

from horizonserve.runtime.calibrate.artifact import load_artifact
from horizonserve.runtime.calibrate.records import read_campaign
from horizonserve.runtime.sim.fit import Replay, errors_pp, mae
from horizonserve.runtime.sim.plan import STEADY, SteadyTraces, plan
from horizonserve.runtime.sim.setup import SimSetup
from horizonserve.runtime.workload import load_workload, mix_weights

RUN = "bench/results/h200-eval/qwen2_5_omni-2"
PIPE = "qwen2_5_omni"
SYSTEMS = ["horizon", "mps", "edf-mps", "fcfs", "edf"]


def replay(name: str, warmup_s: float) -> dict[str, object]:
    art = load_artifact(name)
    c = read_campaign(RUN, warmup_s=warmup_s)
    cal = art.pipeline(PIPE)
    fit = cal.fit
    keys = list(c.items)
    err = errors_pp(Replay(c, art, None).attainment(cal, keys), c)
    out: dict[str, object] = {"mae_all_pp": round(mae(err), 2)}
    if fit is not None:
        out["mae_fit_items_pp"] = round(mae(err, fit.fit_items), 2)
        out["mae_holdout_pp"] = round(mae(err, fit.holdout_items), 2)
    worst = max(err, key=lambda k: abs(err[k]))
    out["largest_miss"] = f"{worst} ({err[worst]:+.1f} pp)"
    out["errors_pp"] = {k: round(v, 2) for k, v in err.items()}
    return out


def capacity(name: str) -> dict[str, object]:
    setup = SimSetup.load(PIPE, load_artifact(name))
    wl = load_workload(PIPE)
    src = SteadyTraces(wl, mix_weights(wl, setup.long_classes), seed=0)
    t0 = time.perf_counter()
    res = plan(setup, src, SYSTEMS, target=0.9, tol=0.02, start=4.0)
    return {
        "steady": STEADY.describe(),
        "wall_s": round(time.perf_counter() - t0, 1),
        "rate_ok": {r.system: round(r.rate_ok, 3) for r in res},
        "attainment_ok": {r.system: r.attainment_ok for r in res},
        "ranking": [r.system for r in sorted(res, key=lambda r: -r.rate_ok)],
    }


def main() -> None:
    out = {"label": "SIMULATED", "campaign": RUN, "replay": {}, "capacity_90": {}}
    for name in ("fitted", "measured"):
        out["replay"][name] = {f"warmup_{w:g}s": replay(name, w) for w in (0.0, 10.0)}
        out["capacity_90"][name] = capacity(name)
        print(f"done {name}", file=sys.stderr)
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
