"""The policy as typed axes and named presets (runtime.config): every preset a set of axes,
each ablation one axis off HorizonServe, invalid combinations refused naming both fields,
retired knob names answered with their replacement."""

from __future__ import annotations

import pytest

from horizonserve.runtime.calibrate.legacy import BEFORE_KNOB, recorded_control
from horizonserve.runtime.config import (
    PRESETS,
    RETIRED_KNOBS,
    Boost,
    ControlParams,
    DownstreamOrder,
    DownstreamUrgency,
    LateRule,
    PolicyName,
    Preemption,
    SmSplit,
    ViewOrder,
    control_with,
    preset_control,
)
from horizonserve.runtime.engine.reference.gpu_control import sharing_for
from horizonserve.runtime.sim.systems import SYSTEMS
from tests.runtime.builders import make_config

AXES = ("rotation", "view_order", "late", "sm_split", "downstream_urgency", "downstream",
        "preemption", "boost")  # fmt: skip


def test_control_params_has_at_most_four_booleans() -> None:
    booleans = [n for n, f in ControlParams.model_fields.items() if f.annotation is bool]
    assert len(booleans) <= 4, booleans


def test_every_policy_is_a_preset_and_every_simulated_system_one_of_them() -> None:
    assert set(PRESETS) == set(PolicyName)
    assert {s.policy for s in SYSTEMS.values()} == set(PolicyName)
    mps = {n for n, s in SYSTEMS.items() if s.mps}
    assert {"mps", "edf-mps", "priority-mps", "horizon-no-throttling"} <= mps
    assert not mps & {"horizon", "fcfs", "edf", "priority", "horizon-no-rotation"}


@pytest.mark.parametrize(
    ("name", "axis", "value"),
    [
        ("horizon-no-rotation", "rotation", "off"),
        ("horizon-no-throttling", "sm_split", SmSplit.UNCAPPED),
        ("horizon-no-downstream", "downstream", DownstreamOrder.FIFO),
        ("horizon-no-preemption", "preemption", Preemption.NONE),
    ],
)
def test_each_ablation_overrides_one_axis_of_horizon(name: str, axis: str, value: str) -> None:
    assert PRESETS[PolicyName(name)].overrides == {axis: value}
    on, off = ControlParams(), preset_control(name, ControlParams())
    changed = {a for a in AXES if getattr(on, a) != getattr(off, a)}
    # The axis, and those it makes inert (their neutral value), nothing else.
    inert = {"downstream_urgency", "boost", "reject_late"}
    assert axis in changed and changed - {axis} <= inert


@pytest.mark.parametrize("name", ["fcfs", "edf", "priority", "mps", "edf-mps", "priority-mps"])
def test_a_baseline_is_the_same_whatever_the_configured_control(name: str) -> None:
    tuned = ControlParams(
        view_order="arrival", late="protect", sm_split="ladder", downstream_urgency="slack",
        downstream="deadline", reject_late=True,
    )  # fmt: skip
    a, b = preset_control(name, ControlParams()), preset_control(name, tuned)
    assert all(getattr(a, x) == getattr(b, x) for x in AXES if x != "boost")
    assert a.sm_split is SmSplit.UNCAPPED and a.boost is Boost.NONE
    assert a.downstream is DownstreamOrder.FIFO and a.preemption is Preemption.NONE


@pytest.mark.parametrize(
    ("fields", "says"),
    [
        ({"view_order": "priority"}, "view_order 'priority' with rotation 'path'"),
        ({"view_order": "priority", "rotation": "off"}, "with late 'yield-phase'"),
        ({"sm_split": "ladder"}, "downstream_urgency 'saturated' with sm_split 'ladder'"),
        ({"downstream": "fifo"}, "downstream_urgency 'saturated' with downstream 'fifo'"),
        ({"downstream": "fifo", "downstream_urgency": "slack", "reject_late": True},
         "reject_late True with downstream 'fifo'"),
        ({"sm_split": "uncapped", "downstream_urgency": "slack"},
         "boost 'prefill-backlog' with sm_split 'uncapped'"),
    ],
)  # fmt: skip
def test_an_invalid_combination_is_refused_naming_both_fields(fields: dict, says: str) -> None:
    with pytest.raises(ValueError, match=says):
        ControlParams(**fields)
    with pytest.raises(ValueError, match=says):
        make_config(**fields)  # at config build


@pytest.mark.parametrize("name", sorted(RETIRED_KNOBS))
def test_a_retired_knob_name_says_what_replaced_it(name: str) -> None:
    with pytest.raises(ValueError, match=f"{name}: no longer a control parameter"):
        ControlParams.model_validate({name: True})
    with pytest.raises(ValueError, match=f"{name}: no longer a control parameter"):
        control_with(ControlParams(), {name: "true"})
    camel = name.split("_")[0] + "".join(w.title() for w in name.split("_")[1:])
    with pytest.raises(ValueError, match="no longer a control parameter"):
        ControlParams.model_validate({camel: True})  # the CRD's spelling


def test_the_gpu_sharing_mode_follows_the_preset() -> None:
    mode = {p.value: sharing_for(p.value, mps=False, cuda=True) for p in PolicyName}
    assert mode["horizon"] == mode["horizon-no-rotation"] == "mps-gc"
    assert mode["horizon-no-throttling"] == mode["mps"] == mode["edf-mps"] == "mps"
    assert mode["fcfs"] == mode["edf"] == mode["priority"] == "timeslice"
    assert sharing_for("fcfs", mps=True, cuda=True) == "mps"


def test_a_run_before_the_axes_reads_its_knobs_as_axes() -> None:
    control, verdicts = recorded_control({})  # before every knob: Eq. (1), FIFO, no preemption
    assert (control.sm_split, control.downstream, control.preemption) == (
        SmSplit.LADDER, DownstreamOrder.FIFO, Preemption.NONE
    )  # fmt: skip
    assert (control.view_order, control.late) == (ViewOrder.ARRIVAL, LateRule.COMPETE)
    assert control.downstream_urgency is DownstreamUrgency.SLACK and verdicts.throttling_pays
    today = {k: True for k in BEFORE_KNOB if k not in ("place_wait_slack", "shared_hold_s")}
    control, _ = recorded_control({**today, "late_phase_yield": False, "backlog_lift": False})
    assert control.late is LateRule.YIELD and control.downstream is DownstreamOrder.PLACE
    assert control.downstream_urgency is DownstreamUrgency.SATURATED
    with pytest.raises(ValueError, match=r"place_wait_slack: .* replay it at its own commit"):
        recorded_control({"place_wait_slack": True})
