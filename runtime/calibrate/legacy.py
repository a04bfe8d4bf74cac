"""Recorded controls of runs made before the policy axes: their boolean knobs read as axes.

Campaign plans and session summaries before the axes recorded 15 boolean knobs; a run that did
not record a knob ran without it (`BEFORE_KNOB`). The fit and the reports replay such runs with
today's simulator, so they read them here: `recorded_control` gives the axes and calibration
verdicts that behave as the knobs did. A knob whose mechanism left the product
(`place_wait_slack`) cannot be replayed by today's code: that run replays at its own commit.
"""

from __future__ import annotations

from collections.abc import Mapping

from horizonserve.runtime.config import (
    Boost,
    ControlParams,
    DownstreamOrder,
    DownstreamUrgency,
    LateRule,
    Preemption,
    SharingVerdicts,
    SmSplit,
    ViewOrder,
)

# The controller before a knob existed: a run recorded without it ran with these values
# (downstream FIFO, no preemption, Eq. (1)'s ladder alone), never with today's defaults.
BEFORE_KNOB: dict[str, object] = {
    "downstream_admission": False,
    "shared_preemption": False,
    "slack_split": False,
    "throttling_pays": True,
    "reservation_pays": True,
    "shared_hold_s": 0.0,
    "late_yield": False,
    "late_phase_yield": False,
    "place_admission": False,
    "deadline_order": False,
    "saturated_downstream_first": False,
    "place_wait_slack": False,
}
# The knobs' defaults when they were last shipped (a knob a run recorded overrides these).
_KNOB_DEFAULTS: dict[str, bool] = {
    "urgent_prefill_boost": True,
    "backlog_lift": True,
    "protect_past_deadline": False,
    "late_yield": True,
    "late_phase_yield": True,
    "deadline_order": True,
    "downstream_admission": True,
    "place_admission": True,
    "saturated_downstream_first": True,
    "place_wait_slack": False,
    "shared_preemption": True,
    "slack_split": True,
    "throttling_pays": True,
    "reservation_pays": True,
}
_VERDICTS = ("throttling_pays", "reservation_pays")


def is_legacy(recorded: Mapping[str, object]) -> bool:
    """The record names boolean knobs (or none of the axes): a run before the axes."""
    return not any(k in recorded for k in ("rotation", "sm_split", "downstream", "late"))


def _flag(value: object) -> bool:
    if isinstance(value, str):
        return value.strip().lower() in ("1", "true", "yes", "on")
    return bool(value)


def recorded_control(recorded: Mapping[str, object]) -> tuple[ControlParams, SharingVerdicts]:
    """The control and verdicts a run ran, from what its plan or session recorded."""
    if not is_legacy(recorded):
        data = dict(recorded)
        verdicts = {k: data.pop(k) for k in (*_VERDICTS, "backlog_lift_pays") if k in data}
        return ControlParams.model_validate(data), SharingVerdicts.model_validate(verdicts)
    data = {**BEFORE_KNOB, **recorded}
    knob = {k: _flag(data.pop(k, d)) for k, d in _KNOB_DEFAULTS.items()}
    if knob["place_wait_slack"]:
        raise ValueError(
            "place_wait_slack: this run's mechanism left the product; replay it at its own "
            "commit (horizonserve sim replay)"
        )
    downstream = (
        DownstreamOrder.FIFO
        if not knob["downstream_admission"]
        else DownstreamOrder.PLACE
        if knob["place_admission"]
        else DownstreamOrder.DEADLINE
    )
    split = SmSplit.SLACK if knob["slack_split"] else SmSplit.LADDER
    saturated = (
        knob["saturated_downstream_first"]
        and split is SmSplit.SLACK
        and downstream is not DownstreamOrder.FIFO
    )
    if knob["protect_past_deadline"]:
        late = LateRule.PROTECT
    elif not knob["late_yield"]:
        late = LateRule.COMPETE
    else:
        late = LateRule.YIELD_PHASE if knob["late_phase_yield"] else LateRule.YIELD
    boost = Boost.PREFILL_BACKLOG if knob["urgent_prefill_boost"] else Boost.BACKLOG
    axes = {
        "view_order": ViewOrder.DEADLINE if knob["deadline_order"] else ViewOrder.ARRIVAL,
        "late": late,
        "sm_split": split,
        "downstream_urgency": DownstreamUrgency.SATURATED if saturated else DownstreamUrgency.SLACK,
        "downstream": downstream,
        "preemption": Preemption.SHARED if knob["shared_preemption"] else Preemption.NONE,
        "boost": boost,
    }
    if downstream is DownstreamOrder.FIFO:
        data["reject_late"] = False
    control = ControlParams.model_validate({**data, **axes})
    verdicts = SharingVerdicts(
        throttling_pays=knob["throttling_pays"],
        reservation_pays=knob["reservation_pays"],
        backlog_lift_pays=knob["backlog_lift"],
    )
    return control, verdicts
