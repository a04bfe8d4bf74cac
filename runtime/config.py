"""Configuration models: request classes, SLO table, SM ladder and control parameters.

One source of truth: the runtime, the simulator, the vLLM-Omni plugin and the operator's CRD
schema are all derived from these pydantic models. Validation errors name the offending field.
"""

from __future__ import annotations

import itertools
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


class ControlParams(_Model):
    """Online control parameters (paper defaults)."""

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
    urgent_prefill_boost: bool = Field(
        True,
        description="Run the prefill of an iteration that admits a short-path or protected "
        "prompt on S_aggr SMs instead of the cap; its decode keeps the cap. Prefill is "
        "compute-bound, so the cap stretches tight TTFT targets without saving the memory "
        "bandwidth it is there to leave to downstream stages.",
    )
    backlog_lift: bool = Field(
        True,
        description="While the shared stage's running set is full and requests wait, run it on "
        "S_aggr SMs: it is then the bottleneck, and the cap only lengthens its queue.",
    )
    protect_past_deadline: bool = Field(
        False,
        description="Keep protecting a waiting request after its deadline passed. Off: once "
        "late it has missed its SLO and competes as an ordinary request, so protection is "
        "spent on requests that can still meet theirs.",
    )
    late_yield: bool = Field(
        True,
        description="A waiting prefill past its deadline follows every on-time one in the "
        "shared stage's queue, and the long-path cap goes to on-time prefills first. Late "
        "requests still fill what the on-time ones leave (nothing is dropped); under overload "
        "the stage stops spending itself on requests already lost. Ignored with "
        "protect_past_deadline.",
    )
    late_phase_yield: bool = Field(
        True,
        description="With late_yield, a short-path phase whose ordinary prefills are all late "
        "yields to the on-time long-path ones: past capacity, text that already missed its "
        "SLO does not hold the shared stage while speech or image prompts that can still "
        "make theirs wait until they are late too.",
    )
    deadline_order: bool = Field(
        True,
        description="The shared stage's view lists its on-time requests by deadline, not "
        "arrival (late ones after them with late_yield), and a long-path phase keeps on-time "
        "short-path prefills visible in that order: a tight-SLO prompt is not left behind a "
        "loose one (a summary, a speech prompt) for the running set's last place.",
    )
    reservation_pays: bool = Field(
        True,
        description="Calibration's verdict for this pipeline: the downstream co-runner steps "
        "faster on the SMs the shared stage leaves it at S_min than as an uncapped MPS client. "
        "False: an urgent downstream side gets uncapped co-running instead of the reservation.",
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
    downstream_admission: bool = Field(
        True,
        description="Downstream stages admit by first-response slack: earliest deadline first "
        "among requests that can still meet it, late ones behind (served, counted). Off: "
        "first come, first served.",
    )
    place_admission: bool = Field(
        True,
        description="Once a downstream stage's places cannot start every meetable request in "
        "time, admit by Moore–Hodgson over the places' estimated free times and each "
        "request's answer length: deadline order, deferring the longest answers that would "
        "make shorter ones miss. Where every request can start in time it is deadline order. "
        "Needs downstream_admission. Off: deadline order alone.",
    )
    saturated_downstream_first: bool = Field(
        True,
        description="Under the slack split, a downstream stage whose places are all taken "
        "while requests wait for one counts as the most urgent side (after the shared "
        "stage's own waiting short-path or protected prompts): it is then the bottleneck, and "
        "its step time decides how many requests start in time, so it gets the configuration "
        "calibration chose for an urgent downstream side (the reservation where that pays). "
        "Needs downstream_admission. Off: its most urgent request's slack decides.",
    )
    place_wait_slack: bool = Field(
        False,
        description="With saturated_downstream_first and place_admission: a full downstream "
        "stage reports its waiting requests' slack with each one's wait for a place counted "
        "(at the stage's present pace) instead of counting as the most urgent side, so the "
        "split gives it SMs only while a waiting request would start late and no shared "
        "request is more urgent. Off by default: on the H200 it gained 2.7 pp at "
        "Qwen2.5-Omni 6 req/s and lost 3.6 pp at 60 % speech and 2 % of capacity.",
    )
    reject_late: bool = Field(
        False,
        description="Refuse a long-path request at hand-off once it can no longer meet its "
        "deadline (the client gets a reason) instead of serving it late.",
    )
    playback_margin_s: float = Field(
        2.0,
        ge=0,
        le=600,
        description="Audio (s) a started speech stream may hold ahead of real-time playback "
        "before it yields its talker step to a request still waiting for its first chunk.",
    )
    shared_preemption: bool = Field(
        True,
        description="When a protected short-path request waits on a full running set, preempt "
        "the running long-path decode with the most slack (never a short-path or protected "
        "one).",
    )
    slack_split: bool = Field(
        True,
        description="Split the SMs by both sides' slack: move toward the side whose most "
        "urgent runnable request has less slack, give an idle side's SMs away. Eq. (1)'s "
        "pressure rule stays the bound inside the ladder.",
    )
    throttling_pays: bool = Field(
        True,
        description="Calibration's verdict for this pipeline: capping the shared stage beside "
        "its downstream co-runner costs less than uncapped co-running under MPS. False: the "
        "shared stage runs uncapped beside the downstream, and the ladder only reserves SMs "
        "for an urgent downstream side.",
    )

    @model_validator(mode="after")
    def _n_range(self) -> Self:
        if self.rotation_n_min > self.rotation_n_max:
            raise ValueError(
                f"rotation_n_min {self.rotation_n_min} exceeds rotation_n_max {self.rotation_n_max}"
            )
        return self


# The controller before a knob existed: a run recorded without it is replayed with these
# values (downstream FIFO, no preemption, Eq. (1)'s ladder alone), never with today's defaults.
CONTROL_BEFORE_KNOB: dict[str, object] = {
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


def control_with(control: ControlParams, knobs: dict[str, str]) -> ControlParams:
    """`control` with `knobs` (KEY: VALUE as text, e.g. from `--control KEY=VALUE`) applied and
    validated; ValueError naming the knob and what it accepts."""
    unknown = sorted(set(knobs) - set(ControlParams.model_fields))
    if unknown:
        raise ValueError(f"unknown knob(s) {unknown}; see ControlParams")
    try:
        return ControlParams.model_validate({**control.model_dump(), **knobs})
    except ValidationError as exc:
        err = exc.errors()[0]
        raise ValueError(f"{err['loc'][0]}: {err['msg']}") from None


def control_as_recorded(recorded: dict[str, object]) -> ControlParams:
    """The control knobs a run used, from what its plan recorded (see CONTROL_BEFORE_KNOB)."""
    return ControlParams.model_validate({**CONTROL_BEFORE_KNOB, **recorded})


class PolicyName(StrEnum):
    HORIZON = "horizon"
    FCFS = "fcfs"
    EDF = "edf"
    NO_ROTATION = "horizon-no-rotation"
    NO_THROTTLING = "horizon-no-throttling"
    NO_DOWNSTREAM = "horizon-no-downstream"
    NO_PREEMPTION = "horizon-no-preemption"
    PRIORITY = "priority"


class ServingConfig(_Model):
    """Everything one serving process needs: the model's classes, the ladder and the policy."""

    model: str = Field(min_length=1)
    pipeline: str = Field(min_length=1, description="qwen2_5_omni, mimo_audio or bagel.")
    policy: PolicyName = PolicyName.HORIZON
    slo: SloTable
    ladder: SmLadder
    control: ControlParams = Field(default_factory=ControlParams)


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
    requests: int = Field(0, ge=0, description="First responses judged in the window.")
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
