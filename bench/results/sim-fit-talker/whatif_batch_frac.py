"""What-if (SIMULATED beside measured): the Qwen2.5-Omni talker's batch cost raised by hand, no
refit, on the campaigns' own requests, each item under the controller its session ran.

    python bench/results/sim-fit-talker/whatif_batch_frac.py 0.0003,0.02,0.03

Each line: campaign, the talker's `batch_frac`, then per item SIMULATED / measured attainment %.
"""

from __future__ import annotations

import sys

from horizonserve.runtime.calibrate.artifact import load_artifact
from horizonserve.runtime.calibrate.records import read_campaign
from horizonserve.runtime.sim.fit import replay_of

ARTIFACT = "runtime/data/calibration/h200-fitted.json"
ITEMS = {
    "bench/results/h200-eval/qwen-ship-v2": [
        "r8/horizon", "r10/horizon", "r6-l60/horizon",
        "r6/edf-mps", "r8/edf-mps", "r10/edf-mps", "r6-l60/edf-mps",
    ],
    "bench/results/h200-eval/qwen-v5": ["r4/horizon", "r6/horizon", "r4/edf-mps"],
}  # fmt: skip


def main() -> None:
    fracs = [float(x) for x in sys.argv[1].split(",")]
    art = load_artifact(ARTIFACT)
    cal = art.pipeline("qwen2_5_omni")
    print(f"{ARTIFACT}, the talker's batch_frac replaced: SIMULATED / measured attainment %")
    for run, keys in ITEMS.items():
        c = read_campaign(run)
        replay = replay_of(c, art)
        for frac in fracs:
            stages = [
                d.model_copy(update={"batch_frac": frac}) if d.name == "talker" else d
                for d in cal.downstream
            ]
            got = replay.attainment(cal.model_copy(update={"downstream": stages}), keys)
            cells = "  ".join(
                f"{k} {100 * got[k]:.1f}/{100 * c.items[k].attainment:.1f}" for k in keys
            )
            print(f"{run.rsplit('/', 1)[-1]}, batch_frac {frac:g}: {cells}")


if __name__ == "__main__":
    main()
