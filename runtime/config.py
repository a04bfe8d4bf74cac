"""Configuration models: request classes, SLO table, SM ladder and control parameters.

One source of truth: the runtime, the simulator, the vLLM-Omni plugin and the operator's CRD
schema are all derived from these pydantic models. Validation errors name the offending field.
"""

from __future__ import annotations

import itertools
import re
from dataclasses import dataclass
from enum import IntEnum, StrEnum
from typing import Annotated, Self

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator


class Priority(IntEnum):
    """API priority code carried by a request; it encodes the requested output modality."""

    TEXT = 0
    AUDIO = 10
    IMAGE = 20


class Path(StrEnum):
    """Short-path requests finish in the shared stage; long-path ones continue downstream."""

    SHORT = "short"
    LONG = "long"


class Metric(StrEnum):
    """First-response metric judged against the class SLO."""

    TTFT = "ttft"  # first text token
    TTFO = "ttfo"  # first audio chunk
    E2E = "e2e"  # finished image


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class StageProfile(_Model):
    """Offline per-class cost profile used to estimate a request's remaining time r̂.

    r̂ = prefill (base + per-input-unit terms) + remaining shared-stage decode tokens before the
    first response (or hand-off) × TPOT + remaining downstream steps × step time.
    """

    prefill_base_s: float = Field(0.02, ge=0, description="Fixed prefill cost in seconds.")
    prefill_s_per_token: float = Field(
        2.0e-5, ge=0, description="Prefill seconds per input text token."
    )
    prefill_s_per_audio_second: float = Field(
        1.0e-3, ge=0, description="Prefill seconds per second of input audio."
    )
    prefill_s_per_image: float = Field(0.03, ge=0, description="Prefill seconds per input image.")
    decode_tokens_to_first_response: int = Field(
        1,
        ge=0,
        description="Shared-stage tokens decoded before the first response or downstream hand-off.",
    )
    tpot_s: float = Field(0.005, gt=0, description="Shared-stage seconds per output token.")
    downstream_steps_to_first_response: int = Field(
        0, ge=0, description="Downstream steps (talker/codec/diffusion) before the first output."
    )
    downstream_step_s: float = Field(0.0, ge=0, description="Seconds per downstream step.")


class RequestClass(_Model):
    """A request class: what a request asks for and how its first response is judged."""

    name: Annotated[str, Field(min_length=1, pattern=r"^[a-z0-9][a-z0-9_\-]*$")]
    priority: Priority = Field(description="API priority code: 0 text, 10 audio, 20 image.")
    path: Path
    metric: Metric
    solo_p95_s: float = Field(gt=0, description="Solo p95 first-response latency in seconds.")
    slo_multiplier: float | None = Field(
        None, gt=0, description="Per-class override of the SLO table's multiplier."
    )
    profile: StageProfile = Field(default_factory=StageProfile)

    @model_validator(mode="after")
    def _metric_matches_path(self) -> Self:
        if self.path is Path.SHORT and self.metric is not Metric.TTFT:
            raise ValueError(
                f"class {self.name!r}: a short-path class is judged by metric 'ttft', "
                f"not {self.metric.value!r}"
            )
        if self.path is Path.LONG and self.metric is Metric.TTFT:
            raise ValueError(
                f"class {self.name!r}: a long-path class is judged by 'ttfo' (speech) or "
                "'e2e' (image), not 'ttft'"
            )
        return self


class SloTable(_Model):
    """Per-class first-response targets: Δc = solo p95 × multiplier."""

    multiplier: float = Field(5.0, gt=0, description="Global SLO multiplier m (paper default 5).")
    classes: list[RequestClass] = Field(min_length=1)
    default_class: dict[Priority, str] = Field(
        default_factory=dict,
        description="Class used for a bare priority code; default: first class with that code.",
    )

    @model_validator(mode="after")
    def _check_classes(self) -> Self:
        seen: set[str] = set()
        for cls in self.classes:
            if cls.name in seen:
                raise ValueError(f"classes: duplicate class name {cls.name!r}")
            seen.add(cls.name)
        for prio, name in self.default_class.items():
            match = [c for c in self.classes if c.name == name]
            if not match:
                raise ValueError(
                    f"default_class[{int(prio)}]: unknown class {name!r}; known: {sorted(seen)}"
                )
            if match[0].priority != prio:
                raise ValueError(
                    f"default_class[{int(prio)}]: class {name!r} has priority "
                    f"{int(match[0].priority)}, not {int(prio)}"
                )
        return self

    def get(self, name: str) -> RequestClass:
        for cls in self.classes:
            if cls.name == name:
                return cls
        raise KeyError(f"unknown request class {name!r}; known: {[c.name for c in self.classes]}")

    def target_s(self, name: str) -> float:
        cls = self.get(name)
        mult = cls.slo_multiplier if cls.slo_multiplier is not None else self.multiplier
        return cls.solo_p95_s * mult

    def class_for_priority(self, priority: int) -> RequestClass:
        """Class for a bare API priority code (the vLLM-Omni path carries only the code)."""
        try:
            prio = Priority(priority)
        except ValueError:
            raise ValueError(
                f"priority {priority}: unknown code; use 0 (text), 10 (audio) or 20 (image)"
            ) from None
        name = self.default_class.get(prio)
        if name is not None:
            return self.get(name)
        for cls in self.classes:
            if cls.priority == prio:
                return cls
        raise ValueError(f"priority {priority}: no request class with this code is configured")


MAX_SMS = 4096  # bound of every SM count in a ladder
MAX_LADDER_LEVELS = 64
MAX_ROTATION_STEPS = 64  # bound of M, N_min, N_max and the hysteresis


class SmLadder(_Model):
    """Shared-stage SM levels S_min … S_cap used while downstream stages co-run.

    Invariant: levels strictly increasing, reserve ≤ S_min = levels[0], S_cap = levels[-1] ≤
    S_aggr ≤ S_tot.
    """

    # Upper bounds keep a spec from carrying absurd sizes into every pod (the CRD schema
    # states them, so `kubectl apply` refuses them): no GPU has more than MAX_SMS SMs.
    levels: list[Annotated[int, Field(le=MAX_SMS)]] = Field(
        min_length=1, max_length=MAX_LADDER_LEVELS, description="Co-running SM levels, ascending."
    )
    aggressive: int = Field(
        gt=0, le=MAX_SMS, description="S_aggr: shared-stage SMs with no downstream work."
    )
    total: int = Field(gt=0, le=MAX_SMS, description="S_tot: SMs on the GPU.")
    reserve: int | None = Field(
        None,
        gt=0,
        le=MAX_SMS,
        description="Shared-stage SMs while an urgent downstream side holds the reservation "
        "(at most S_min); leave out for S_min. Calibration sets it where the downstream "
        "co-runner steps faster on a smaller shared stage.",
    )

    @field_validator("levels")
    @classmethod
    def _sorted_positive(cls, levels: list[int]) -> list[int]:
        if any(s <= 0 for s in levels):
            raise ValueError("every level must be a positive SM count")
        if any(b <= a for a, b in itertools.pairwise(levels)):
            raise ValueError(f"levels must be strictly increasing, got {levels}")
        return levels

    @model_validator(mode="after")
    def _bounds(self) -> Self:
        if self.s_cap > self.aggressive:
            raise ValueError(
                f"levels: S_cap {self.s_cap} (the last level) exceeds aggressive (S_aggr) "
                f"{self.aggressive}; lower the top level or raise aggressive"
            )
        if self.aggressive > self.total:
            raise ValueError(
                f"aggressive: S_aggr {self.aggressive} exceeds total (S_tot) {self.total}"
            )
        if self.reserve is not None and self.reserve > self.s_min:
            raise ValueError(
                f"reserve: {self.reserve} SMs exceeds S_min {self.s_min} (the first level); "
                "lower it or leave it out"
            )
        return self

    @property
    def s_min(self) -> int:
        return self.levels[0]

    @property
    def s_cap(self) -> int:
        return self.levels[-1]

    @property
    def s_reserve(self) -> int:
        """The shared stage's SMs while the downstream side holds the reservation."""
        return self.s_min if self.reserve is None else self.reserve

    def headroom(self, shared_sms: int) -> int:
        """Downstream SMs given a shared-stage allocation (complementary ladder)."""
        return max(0, self.total - shared_sms)


class Rotation(StrEnum):
    """Which waiting prefills a step may see, by path."""

    OFF = "off"  # every waiting request every step
    PATH = "path"  # N:M short-/long-path phases, slack guard, long-path cap (`runtime.temporal`)


class ViewOrder(StrEnum):
    """The order the base scheduler sees the visible requests in."""

    ARRIVAL = "arrival"  # queue order (FCFS)
    DEADLINE = "deadline"  # on-time requests by deadline (EDF; HorizonServe's order)
    PRIORITY = "priority"  # (API priority code, arrival): vLLM's priority policy


class LateRule(StrEnum):
    """What a waiting prefill past its deadline becomes."""

    COMPETE = "compete"  # an ordinary request, in view order with the on-time ones
    YIELD = "yield"  # after every on-time one; the long-path cap goes to on-time ones first
    YIELD_PHASE = "yield-phase"  # YIELD, and a short-path phase of late prefills yields too
    PROTECT = "protect"  # stays protected past its deadline


class SmSplit(StrEnum):
    """How the shared stage's SMs are chosen while downstream stages co-run."""

    UNCAPPED = "uncapped"  # every stage may use the whole GPU
    LADDER = "ladder"  # Eq. (1): the pressure-guided ladder
    SLACK = "slack"  # the ladder, and the reservation for a more urgent downstream side


class DownstreamUrgency(StrEnum):
    """What makes the downstream side urgent under the slack split."""

    SLACK = "slack"  # its most urgent request's slack ratio
    SATURATED = "saturated"  # … and a stage whose places are all taken while requests wait


class DownstreamOrder(StrEnum):
    """Admission order at the downstream stages."""

    FIFO = "fifo"  # first come, first served; streams never yield
    DEADLINE = "deadline"  # by first-response deadline, late ones behind; playback yielding
    PLACE = "place"  # DEADLINE, Moore–Hodgson over the places once they cannot start all


class Preemption(StrEnum):
    """Who may preempt a running shared-stage request (besides the engine's own KV rule)."""

    NONE = "none"
    SHARED = "shared"  # a protected short-path prompt: the long-path decode with most slack


class Boost(StrEnum):
    """When the shared stage runs above its cap (S_aggr) while downstream stages co-run."""

    NONE = "none"
    PREFILL = "prefill"  # the prefill of an iteration admitting an urgent prompt
    BACKLOG = "backlog"  # the whole iteration while its running set is full and requests wait
    PREFILL_BACKLOG = "prefill-backlog"  # both

    @property
    def prefill(self) -> bool:
        return self in (Boost.PREFILL, Boost.PREFILL_BACKLOG)

    @property
    def backlog(self) -> bool:
        return self in (Boost.BACKLOG, Boost.PREFILL_BACKLOG)


class ControlParams(_Model):
    """Online control: the policy's axes (defaults: HorizonServe) and numeric tunables.

    A named policy (`PolicyName`, `PRESETS`) overrides axes of these; an invalid combination
    is refused when the parameters are built, with both fields named.
    """

    rotation: Rotation = Field(
        Rotation.PATH,
        description="Path rotation: 'path' rotates short- and long-path phases N:M, with the "
        "slack guard (protected requests always visible) and the long-path cap; 'off' shows "
        "every waiting request every step.",
    )
    view_order: ViewOrder = Field(
        ViewOrder.DEADLINE,
        description="The order the shared stage's base scheduler sees visible requests in: "
        "'deadline' lists on-time requests by deadline (a tight-SLO prompt is not left behind "
        "a loose one for the running set's last place; with rotation a long-path phase keeps "
        "on-time short-path prefills visible in that order); 'arrival' is queue order; "
        "'priority' is vLLM's (priority code, arrival), without rotation.",
    )
    late: LateRule = Field(
        LateRule.YIELD_PHASE,
        description="A waiting prefill past its deadline: 'yield' puts it after every on-time "
        "one and gives the long-path cap to on-time prefills first (nothing is dropped; under "
        "overload the stage stops spending itself on requests already lost); 'yield-phase' "
        "also lets a short-path phase of only late prefills yield to on-time long-path ones; "
        "'compete' leaves it an ordinary request; 'protect' keeps protecting it.",
    )
    sm_split: SmSplit = Field(
        SmSplit.SLACK,
        description="The shared stage's SMs while downstream stages co-run: 'ladder' is Eq. "
        "(1) (the pressure rule over the calibrated ladder); 'slack' also moves toward the "
        "side whose most urgent request has less slack (the reservation for an urgent "
        "downstream side, the shared stage held while it is the bottleneck, `shared_hold_s`); "
        "'uncapped': every stage on the whole GPU.",
    )
    downstream_urgency: DownstreamUrgency = Field(
        DownstreamUrgency.SATURATED,
        description="What makes the downstream side urgent under the slack split: 'saturated' "
        "counts a stage whose places are all taken while requests wait as the most urgent side "
        "(after the shared stage's own waiting short-path or protected prompts): it is then the "
        "bottleneck; 'slack': its most urgent request's slack decides. 'saturated' needs "
        "sm_split 'slack' and a downstream order other than 'fifo'.",
    )
    downstream: DownstreamOrder = Field(
        DownstreamOrder.PLACE,
        description="Downstream admission: 'deadline' admits by first-response deadline among "
        "requests that can still meet it, late ones behind, and lets a started stream yield "
        "its talker step (`playback_margin_s`); 'place' also admits by Moore–Hodgson over the "
        "places' estimated free times once they cannot start every meetable request in time; "
        "'fifo': first come, first served.",
    )
    preemption: Preemption = Field(
        Preemption.SHARED,
        description="'shared': when a protected short-path request waits on a full running "
        "set, preempt the running long-path decode with the most slack (never a short-path or "
        "protected one), where the recompute costs less than the wait it saves. 'none'.",
    )
    boost: Boost = Field(
        Boost.PREFILL_BACKLOG,
        description="Above the cap while co-running: 'prefill' runs the prefill of an "
        "iteration admitting a short-path or protected prompt on S_aggr (prefill is "
        "compute-bound; its decode keeps the cap); 'backlog' runs the whole iteration on "
        "S_aggr while the running set is full and requests wait, where the calibration says "
        "it pays (`SharingVerdicts.backlog_lift_pays`); 'prefill-backlog' both; 'none'. Needs "
        "an sm_split other than 'uncapped'.",
    )
    reject_late: bool = Field(
        False,
        description="Refuse a long-path request at hand-off once it can no longer meet its "
        "deadline (the client gets a reason) instead of serving it late. Needs a downstream "
        "order other than 'fifo'.",
    )
    u_guard: float = Field(
        1.5, gt=0, le=100, description="Slack-ratio guard: a request with u < u_guard is protected."
    )
    rotation_m: int = Field(
        2, ge=1, le=MAX_ROTATION_STEPS, description="M: long-path phase steps per rotation period."
    )
    rotation_n_min: int = Field(
        2, ge=1, le=MAX_ROTATION_STEPS, description="N_min: fewest short-path phase steps."
    )
    rotation_n_max: int = Field(
        8, ge=1, le=MAX_ROTATION_STEPS, description="N_max: most short-path phase steps."
    )
    long_path_cap: int = Field(
        2,
        ge=0,
        le=1024,
        description="Most ordinary long-path prefills visible per step (protected exempt).",
    )
    ewma_gamma: float = Field(
        0.4, gt=0, le=1, description="EWMA weight of the newest pressure sample."
    )
    b_sat: float = Field(
        0.93, gt=0, le=1, description="Saturation pressure: NVML memory activity fraction."
    )
    hysteresis_steps: int = Field(
        1,
        ge=0,
        le=MAX_ROTATION_STEPS,
        description="Ladder steps the snapped target must differ by to change the cap.",
    )
    shared_hold_s: float = Field(
        5.0,
        ge=0,
        le=600,
        description="Under the slack split, an urgent downstream side does not take SMs from "
        "the shared stage while prompts wait for their prefill there, nor for this many "
        "seconds after its running set was last full with requests waiting: the shared stage "
        "is then the bottleneck, and yielding only lengthens its queue and the downstream's "
        "next work. 0: the downstream side goes first whenever it is the more urgent.",
    )
    unknown_pressure: float = Field(
        1.0,
        ge=0,
        le=1,
        description="ρ used while the pressure signal is unknown (1.0 = S_cap, the safe side).",
    )
    playback_margin_s: float = Field(
        2.0,
        ge=0,
        le=600,
        description="Audio (s) a started speech stream may hold ahead of real-time playback "
        "before it yields its talker step to a request still waiting for its first chunk.",
    )

    @model_validator(mode="before")
    @classmethod
    def _no_retired_names(cls, data: object) -> object:
        if isinstance(data, dict):
            for key in data:
                hint = RETIRED_KNOBS.get(_snake(str(key)))
                if hint is not None:
                    raise ValueError(f"{key}: no longer a control parameter; {hint}")
        return data

    @model_validator(mode="after")
    def _consistent(self) -> Self:
        if self.rotation_n_min > self.rotation_n_max:
            raise ValueError(
                f"rotation_n_min {self.rotation_n_min} exceeds rotation_n_max {self.rotation_n_max}"
            )
        for (a, bad_a), (b, bad_b), why in _EXCLUSIONS:
            if getattr(self, a) in bad_a and getattr(self, b) in bad_b:
                raise ValueError(
                    f"{a} {_text(getattr(self, a))} with {b} {_text(getattr(self, b))}: {why}"
                )
        return self


def _text(v: object) -> str:
    return repr(v.value) if isinstance(v, StrEnum) else repr(v)


def _snake(name: str) -> str:
    return re.sub(r"(?<!^)([A-Z])", r"_\1", name).lower()


# Combinations refused at build: ((field, values), (field, values), why).
_EXCLUSIONS: tuple[
    tuple[tuple[str, tuple[object, ...]], tuple[str, tuple[object, ...]], str], ...
] = (
    (
        ("view_order", (ViewOrder.PRIORITY,)),
        ("rotation", (Rotation.PATH,)),
        "priority order is a plain queue order; set rotation 'off'",
    ),
    (
        ("view_order", (ViewOrder.PRIORITY,)),
        ("late", (LateRule.YIELD, LateRule.YIELD_PHASE)),
        "late prefills yield within arrival or deadline order; set late 'compete'",
    ),
    (
        ("downstream_urgency", (DownstreamUrgency.SATURATED,)),
        ("sm_split", (SmSplit.UNCAPPED, SmSplit.LADDER)),
        "only the slack split reads a saturated stage; set downstream_urgency 'slack'",
    ),
    (
        ("downstream_urgency", (DownstreamUrgency.SATURATED,)),
        ("downstream", (DownstreamOrder.FIFO,)),
        "a FIFO stage reports no saturation; set downstream_urgency 'slack'",
    ),
    (
        ("reject_late", (True,)),
        ("downstream", (DownstreamOrder.FIFO,)),
        "a FIFO stage does not judge deadlines; set reject_late false",
    ),
    (
        ("boost", (Boost.PREFILL, Boost.BACKLOG, Boost.PREFILL_BACKLOG)),
        ("sm_split", (SmSplit.UNCAPPED,)),
        "nothing is capped to boost; set boost 'none'",
    ),
)

# Control parameters that left, and what replaced each (a run recorded with them replays at its
# own commit: `runtime.bench.provenance`).
RETIRED_KNOBS: dict[str, str] = {
    "urgent_prefill_boost": "use boost ('prefill-backlog', 'prefill', 'backlog' or 'none')",
    "backlog_lift": "use boost (where calibration says it pays: "
    "ServingConfig.verdicts.backlog_lift_pays)",
    "protect_past_deadline": "use late='protect'",
    "late_yield": "use late ('yield-phase', 'yield', 'compete' or 'protect')",
    "late_phase_yield": "use late ('yield-phase' or 'yield')",
    "deadline_order": "use view_order ('deadline' or 'arrival')",
    "downstream_admission": "use downstream ('place', 'deadline' or 'fifo')",
    "place_admission": "use downstream ('place' or 'deadline')",
    "saturated_downstream_first": "use downstream_urgency ('saturated' or 'slack')",
    "slack_split": "use sm_split ('slack' or 'ladder')",
    "shared_preemption": "use preemption ('shared' or 'none')",
    "throttling_pays": "a calibration verdict: ServingConfig.verdicts.throttling_pays",
    "reservation_pays": "a calibration verdict: ServingConfig.verdicts.reservation_pays",
    "place_wait_slack": "removed: it lost on the H200 (docs/decisions.md)",
}


class SharingVerdicts(_Model):
    """Which SM configurations pay on this GPU and pipeline: calibration's verdicts
    (`PipelineCalibration.verdicts`), not operator choices. Defaults: the paper's premises."""

    throttling_pays: bool = Field(
        True,
        description="Capping the shared stage beside its downstream co-runner costs less than "
        "uncapped co-running under MPS. False: the shared stage runs uncapped beside the "
        "downstream, and the ladder only reserves SMs for an urgent downstream side.",
    )
    reservation_pays: bool = Field(
        True,
        description="The downstream co-runner steps faster on the SMs the shared stage leaves "
        "it at the reservation than as an uncapped MPS client. False: an urgent downstream "
        "side gets uncapped co-running instead of the reservation.",
    )
    backlog_lift_pays: bool = Field(
        True,
        description="The shared stage decodes faster on S_aggr as an MPS client beside a "
        "co-running downstream stage than on its cap: the premise of boost's backlog lift.",
    )


def control_with(control: ControlParams, knobs: dict[str, str]) -> ControlParams:
    """`control` with `knobs` (KEY: VALUE as text, e.g. from `--control KEY=VALUE`) applied and
    validated; ValueError naming the knob and what it accepts (or what replaced it)."""
    for key in knobs:
        if key in RETIRED_KNOBS:
            raise ValueError(f"{key}: no longer a control parameter; {RETIRED_KNOBS[key]}")
    unknown = sorted(set(knobs) - set(ControlParams.model_fields))
    if unknown:
        raise ValueError(f"unknown knob(s) {unknown}; see ControlParams")
    try:
        return ControlParams.model_validate({**control.model_dump(), **knobs})
    except ValidationError as exc:
        err = exc.errors()[0]
        where = f"{err['loc'][0]}: " if err["loc"] else ""
        raise ValueError(f"{where}{err['msg'].removeprefix('Value error, ')}") from None


class PolicyName(StrEnum):
    HORIZON = "horizon"
    FCFS = "fcfs"
    EDF = "edf"
    PRIORITY = "priority"
    MPS = "mps"
    EDF_MPS = "edf-mps"
    PRIORITY_MPS = "priority-mps"
    NO_ROTATION = "horizon-no-rotation"
    NO_THROTTLING = "horizon-no-throttling"
    NO_DOWNSTREAM = "horizon-no-downstream"
    NO_PREEMPTION = "horizon-no-preemption"
    # The 2026 co-location baselines (`runtime.baselines`: what each adds to its axes).
    SHED = "shed"  # FCFS with vLLM's queue limits: refused requests are misses
    SHED_EDF = "shed-edf"  # EDF with the same limits
    VLLM_OMNI_CURRENT = "vllm-omni-current"  # bounded-K EDF talker window, DTPS tiers
    MPS_STATIC = "mps-static"  # a fixed SM share per stage process, no control


@dataclass(frozen=True, slots=True)
class Preset:
    """A named policy: axes it sets over the configured `ControlParams`, and whether its stages
    share the GPU under MPS where the engine leaves them uncapped."""

    overrides: dict[str, object]
    mps: bool = False
    baseline: bool = False  # a baseline (not HorizonServe or one of its ablations)

    def apply(self, control: ControlParams) -> ControlParams:
        """`control` with this preset's axes, and the axes those make inert set to their
        neutral value (a preset never builds a refused combination)."""
        data = {**control.model_dump(), **self.overrides}
        if data["sm_split"] is not SmSplit.SLACK or data["downstream"] is DownstreamOrder.FIFO:
            data["downstream_urgency"] = DownstreamUrgency.SLACK
        if data["downstream"] is DownstreamOrder.FIFO:
            data["reject_late"] = False
        if data["sm_split"] is SmSplit.UNCAPPED:
            data["boost"] = Boost.NONE
        return ControlParams.model_validate(data)


# The baselines: every axis set (what the configured control says does not touch them).
_BASELINE: dict[str, object] = {
    "rotation": Rotation.OFF,
    "view_order": ViewOrder.ARRIVAL,
    "late": LateRule.COMPETE,
    "sm_split": SmSplit.UNCAPPED,
    "downstream": DownstreamOrder.FIFO,
    "preemption": Preemption.NONE,
}
_EDF = {**_BASELINE, "view_order": ViewOrder.DEADLINE}
_PRIORITY = {**_BASELINE, "view_order": ViewOrder.PRIORITY}

# HorizonServe is the configured control as it is; each ablation overrides one axis.
PRESETS: dict[PolicyName, Preset] = {
    PolicyName.HORIZON: Preset({}),
    PolicyName.FCFS: Preset(_BASELINE, baseline=True),
    PolicyName.EDF: Preset(_EDF, baseline=True),
    PolicyName.PRIORITY: Preset(_PRIORITY, baseline=True),
    PolicyName.MPS: Preset(_BASELINE, mps=True, baseline=True),
    PolicyName.EDF_MPS: Preset(_EDF, mps=True, baseline=True),
    PolicyName.PRIORITY_MPS: Preset(_PRIORITY, mps=True, baseline=True),
    PolicyName.NO_ROTATION: Preset({"rotation": Rotation.OFF}),
    PolicyName.NO_THROTTLING: Preset({"sm_split": SmSplit.UNCAPPED}, mps=True),
    PolicyName.NO_DOWNSTREAM: Preset({"downstream": DownstreamOrder.FIFO}),
    PolicyName.NO_PREEMPTION: Preset({"preemption": Preemption.NONE}),
    PolicyName.SHED: Preset(_BASELINE, mps=True, baseline=True),
    PolicyName.SHED_EDF: Preset(_EDF, mps=True, baseline=True),
    PolicyName.VLLM_OMNI_CURRENT: Preset(_BASELINE, mps=True, baseline=True),
    PolicyName.MPS_STATIC: Preset(_BASELINE, mps=True, baseline=True),
}


def policy_name(name: PolicyName | str) -> PolicyName:
    """`name` as a PolicyName; ValueError listing the choices."""
    try:
        return PolicyName(name)
    except ValueError:
        choices = ", ".join(p.value for p in PolicyName)
        raise ValueError(f"policy: unknown policy {name!r}; choose one of {choices}") from None


def preset_control(name: PolicyName | str, control: ControlParams) -> ControlParams:
    """The control a named policy runs: `control` under the preset's axes."""
    return PRESETS[policy_name(name)].apply(control)


class ServingConfig(_Model):
    """Everything one serving process needs: the model's classes, the ladder and the policy."""

    model: str = Field(min_length=1)
    pipeline: str = Field(min_length=1, description="qwen2_5_omni, mimo_audio or bagel.")
    policy: PolicyName = Field(
        PolicyName.HORIZON, description="Named policy: its axes override those of control."
    )
    slo: SloTable
    ladder: SmLadder
    control: ControlParams = Field(default_factory=ControlParams)
    verdicts: SharingVerdicts = Field(
        default_factory=SharingVerdicts,
        description="Calibration's verdicts on which SM configurations pay.",
    )

    def resolved(self) -> ControlParams:
        """The control this config runs: `control` under the policy's preset."""
        return preset_control(self.policy, self.control)


class DownstreamKind(StrEnum):
    SPEECH = "speech"  # talker AR + code-to-waveform
    IMAGE = "image"  # diffusion-transformer denoising loop


class PipelineSpec(_Model):
    """An omni pipeline's request classes and downstream stages (shipped as package data)."""

    name: str = Field(min_length=1)
    model: str = Field(min_length=1, description="Model id, e.g. Qwen/Qwen2.5-Omni-7B.")
    downstream: list[DownstreamKind] = Field(min_length=1)
    slo: SloTable
    source: str = Field(min_length=1, description="Where the profile numbers come from.")


PIPELINES = ("qwen2_5_omni", "mimo_audio", "bagel")


def load_pipeline(name: str) -> PipelineSpec:
    """The shipped pipeline definition `runtime/data/pipelines/<name>.json`."""
    from importlib import resources

    if name not in PIPELINES:
        raise ValueError(f"pipeline: unknown pipeline {name!r}; choose one of {list(PIPELINES)}")
    text = resources.files("horizonserve.runtime").joinpath(f"data/pipelines/{name}.json")
    return PipelineSpec.model_validate_json(text.read_text())


def default_ladder(total_sms: int = 132) -> SmLadder:
    """Ladder used until calibration provides one: S_cap ≈ 0.6 × S_tot, S_aggr = S_tot.

    On the H200 (132 SMs) decode saturates near 64 SMs; [32, 48, 64, 80] brackets it.
    """
    cap = max(1, round(total_sms * 0.6 / 16) * 16)
    levels = sorted({max(8, cap - 48), max(8, cap - 32), max(8, cap - 16), cap})
    return SmLadder(levels=levels, aggressive=total_sms, total=total_sms)


# --- Operator ↔ node contract ----------------------------------------------------------------
# Shared by the node sidecar (which publishes) and the operator (which aggregates); nothing here
# imports Kubernetes. The operator passes the ServingConfig and these settings to the serving
# pod's containers through the environment variables named below.

SERVING_CONFIG_ENV = "HORIZONSERVE_SERVING_CONFIG"  # ServingConfig as JSON
CALIBRATION_MODE_ENV = "HORIZONSERVE_CALIBRATION_MODE"  # a CalibrationMode value
ARTIFACT_DIR_ENV = "HORIZONSERVE_ARTIFACT_DIR"  # node-local directory of calibration artifacts
NODE_NAME_ENV = "HORIZONSERVE_NODE_NAME"
POD_NAME_ENV = "HORIZONSERVE_POD_NAME"
POD_NAMESPACE_ENV = "HORIZONSERVE_POD_NAMESPACE"
METRICS_PORT_ENV = "HORIZONSERVE_METRICS_PORT"  # the sidecar's /metrics and /healthz port
SUMMARY_ANNOTATION = "horizonserve.io/summary"  # pod annotation holding a NodeSummary as JSON
# The node's ConfigMap (named by the operator): the sidecar publishes the NodeSummary under
# SUMMARY_KEY there, the only object its RBAC lets it write; calibration artifacts sit beside it.
SUMMARY_CONFIGMAP_ENV = "HORIZONSERVE_SUMMARY_CONFIGMAP"
SUMMARY_KEY = "summary.json"


class CalibrationMode(StrEnum):
    """auto: calibrate when the node has no artifact for this model + GPU + driver;
    skip: never calibrate (the spec's ladder or the default one); force: calibrate on start."""

    AUTO = "auto"
    SKIP = "skip"
    FORCE = "force"


class _Wire(BaseModel):
    # Published by one version and read by another: unknown fields are ignored, not fatal.
    model_config = ConfigDict(extra="ignore", frozen=True)


class ClassSummary(_Wire):
    """First-response outcomes of one request class over the summary's window."""

    name: str = Field(min_length=1)
    priority: Priority
    requests: int = Field(
        0,
        ge=0,
        description=(
            "Requests judged in the window: every admitted request, answered or not, once its "
            "first response came or its deadline passed."
        ),
    )
    met: int = Field(0, ge=0, description="Of those, how many met the class SLO.")
    p95_s: float | None = Field(None, ge=0, description="p95 first-response latency (s).")
    target_s: float | None = Field(None, gt=0, description="The class SLO Δc in seconds.")

    @model_validator(mode="after")
    def _met_le_requests(self) -> Self:
        if self.met > self.requests:
            raise ValueError(
                f"class {self.name!r}: met {self.met} exceeds requests {self.requests}"
            )
        return self


class NodeSummary(_Wire):
    """A node's compact state, published by its sidecar as the pod annotation SUMMARY_ANNOTATION.

    Counts cover the trailing `window_s` seconds; `timestamp` is the publisher's wall clock
    (Unix seconds) so the reader can tell a stale summary from a fresh one.
    """

    version: int = Field(1, ge=1, description="Format version of this summary.")
    node: str = Field(min_length=1)
    timestamp: float = Field(ge=0, description="Unix time of publication.")
    window_s: float = Field(300.0, gt=0, description="Window the counts cover (s).")
    calibrated: bool = Field(False, description="A calibration artifact is loaded.")
    calibration_artifact: str | None = Field(None, description="Artifact id (model+GPU+driver).")
    calibration_error: str | None = Field(None, description="Why calibration failed, if it did.")
    ladder: SmLadder | None = Field(None, description="The SM ladder in use.")
    gpu: str | None = Field(None, description="GPU product name.")
    classes: list[ClassSummary] = Field(default_factory=list)
    errors: list[str] = Field(default_factory=list, description="Recent errors, newest last.")

    @property
    def requests(self) -> int:
        return sum(c.requests for c in self.classes)

    @property
    def met(self) -> int:
        return sum(c.met for c in self.classes)

    def to_annotation(self) -> str:
        """Compact JSON for the pod annotation."""
        return self.model_dump_json(exclude_none=True, exclude_defaults=False)

    @classmethod
    def from_annotation(cls, text: str) -> NodeSummary:
        return cls.model_validate_json(text)
