"""The control knobs a calibration decides: B_sat and whether the backlog lift pays."""

from __future__ import annotations

from pathlib import Path

import pytest

from horizonserve.runtime.calibrate.artifact import PipelineCalibration, load_artifact
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


def _with(cal: PipelineCalibration, **changes: object) -> PipelineCalibration:
    """`cal` with the fields at `a__b__0__c` paths replaced."""
    data = cal.model_dump()
    for path, value in changes.items():
        node = data
        *head, last = path.split("__")
        for key in head:
            node = node[int(key)] if key.isdigit() else node[key]
        node[last] = value
    return type(cal).model_validate(data)


def test_reserve_is_where_the_downstream_steps_fastest_within_the_decode_bound() -> None:
    cal = load_artifact(DATA / "h200-measured.json").pipeline("bagel")
    assert cal.reserve_choice() == 16 == cal.ladder.s_reserve  # the artifact holds the choice
    # The DiT steps fastest beside a 16-SM thinker (77.6 against 86.2 ms at S_min 32) …
    d, s = cal.downstream[0], cal.shared
    at = {c: d.step_s.at(132 - c) * d.corun_factor.at(c) for c in (16, 24, 32)}
    assert min(at, key=at.get) == 16
    # … but not once the thinker's decode there exceeds 3× its best: the next count wins.
    slow = list(s.decode_step_s.values)
    slow[0] = 4 * min(slow)  # 16 SMs
    assert _with(cal, shared__decode_step_s__values=slow).reserve_choice() == 24


def test_reservation_pays_where_mps_would_starve_the_shared_stage() -> None:
    measured = load_artifact(DATA / "h200-measured.json")
    bagel, qwen = measured.pipeline("bagel"), measured.pipeline("qwen2_5_omni")
    # Beside the DiT, MPS costs the thinker ×6.3: the shared side cannot be left to MPS.
    assert bagel.reservation_pays() and bagel.control().reservation_pays
    # Beside the talker MPS costs the thinker ×1.14, and the two sides lose less together
    # under MPS than on the reservation: the urgent downstream side is left to MPS.
    assert not qwen.reservation_pays() and not qwen.control().reservation_pays
    # The same BAGEL entry with an MPS that barely slows the thinker: the sum decides, and
    # the DiT's own 25 % loss on the reservation makes MPS the better choice.
    mild = _with(bagel, sharing__mps_shared_excess=0.05)
    assert not mild.reservation_pays()
