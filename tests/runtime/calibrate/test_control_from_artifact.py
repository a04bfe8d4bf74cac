"""The control knobs a calibration decides: B_sat and whether the backlog lift pays."""

from __future__ import annotations

from pathlib import Path

import pytest

from horizonserve.runtime.artifact import PipelineCalibration, load_artifact
from horizonserve.runtime.config import PolicyName
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
    assert (cal.verdicts().backlog_lift_pays, control.b_sat) == (lift, cal.b_sat)
    setup = SimSetup.load(pipeline, load_artifact(DATA / artifact))
    assert setup.control == control
    assert setup.serving_config(PolicyName.HORIZON).verdicts == cal.verdicts()


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
    bagel = load_artifact(DATA / "h200-measured.json").pipeline("bagel")
    # Beside the DiT, MPS costs the thinker ×5.6: the shared side cannot be left to MPS.
    assert bagel.reservation_pays() and bagel.verdicts().reservation_pays
    # The same entry with an MPS that barely slows the thinker: the DiT decides, and it steps
    # faster as an MPS client (×1.07) than on the reservation (×1.31): MPS is the choice.
    mild = _with(bagel, sharing__mps_shared_excess=0.05)
    assert not mild.reservation_pays()


def test_reservation_pays_where_the_talker_steps_faster_on_it() -> None:
    qwen = load_artifact(DATA / "h200-measured.json").pipeline("qwen2_5_omni")
    d, total, reserve = qwen.downstream[0], qwen.ladder.total, qwen.ladder.s_reserve
    on_reserve = d.step_s.at(qwen.ladder.headroom(reserve)) * d.corun_factor.at(reserve)
    as_client = d.step_s.at(total) * qwen.sharing.mps_downstream_factor
    # Beside the talker MPS costs the thinker only ×1.10, but the talker itself steps ×1.39
    # its solo time on the reservation against ×1.87 as an MPS client.
    assert on_reserve < as_client
    assert qwen.reservation_pays() and qwen.verdicts().reservation_pays
    # An MPS that costs the talker less than the reservation: the urgent side keeps MPS.
    factor = 0.95 * on_reserve / d.step_s.at(total)
    assert not _with(qwen, sharing__mps_downstream_factor=factor).reservation_pays()
    # The talker still gains, but the thinker's decode on its 16 SMs would pass 3× its best:
    # text would stall, so the reservation does not pay.
    slow = list(qwen.shared.decode_step_s.values)
    slow[list(qwen.shared.decode_step_s.sms).index(reserve)] = 4 * min(slow)
    assert not _with(qwen, shared__decode_step_s__values=slow).reservation_pays()
