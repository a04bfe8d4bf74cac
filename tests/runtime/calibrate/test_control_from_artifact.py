"""The control knobs a calibration decides: B_sat and whether the backlog lift pays."""

from __future__ import annotations

from pathlib import Path

import pytest

from horizonserve.runtime.calibrate.artifact import load_artifact
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
    s, ladder = cal.shared, cal.ladder
    mps = 1 + cal.sharing.mps_shared_excess * (s.corun_decode_factor.at(ladder.total) - 1)
    lifted = s.decode_step_s.at(ladder.aggressive) * mps
    capped = s.decode_step_s.at(ladder.s_cap) * s.corun_decode_factor.at(ladder.s_cap)
    assert (lifted < capped) is lift
    control = cal.control()
    assert (control.backlog_lift, control.b_sat) == (lift, cal.b_sat)
    setup = SimSetup.load(pipeline, load_artifact(DATA / artifact))
    assert setup.control == control
