"""The control knobs a calibration decides: B_sat and whether the backlog lift pays."""

from __future__ import annotations

from pathlib import Path

import pytest

from horizonserve.runtime.calibrate.artifact import load_artifact
from horizonserve.runtime.sim.model import SharedCost, Sharing
from horizonserve.runtime.sim.setup import SimSetup

DATA = Path(__file__).resolve().parents[3] / "runtime" / "data" / "calibration"


@pytest.mark.parametrize(
    ("artifact", "pipeline", "lift"),
    [
        ("h200-measured.json", "qwen2_5_omni", True),  # 7.1 vs 7.4 ms per decode step
        ("h200-measured.json", "bagel", False),  # the DiT under MPS doubles the thinker's step
        ("default-h200.json", "qwen2_5_omni", False),  # the estimate's decode slows above 80 SMs
    ],
)
def test_lift_follows_the_measured_decode_curve(artifact: str, pipeline: str, lift: bool) -> None:
    cal = load_artifact(DATA / artifact).pipeline(pipeline)
    ladder = cal.ladder
    # The simulator's cost model is the oracle: one decode step, co-running.
    cost = SharedCost(cal)
    lifted = cost.iteration_s(ladder.aggressive, 1, 0, 0, True, Sharing.MPS, False)
    capped = cost.iteration_s(ladder.s_cap, 1, 0, 0, True, Sharing.PARTITION, False)
    assert (lifted < capped) is lift
    control = cal.control()
    assert (control.backlog_lift, control.b_sat) == (lift, cal.b_sat)
    setup = SimSetup.load(pipeline, load_artifact(DATA / artifact))
    assert setup.control == control
