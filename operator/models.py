"""The OmniService resource: spec and status as pydantic models.

These models are the single source of truth: `crd.py` generates the CustomResourceDefinition
schema from them, the handlers parse incoming objects with them, and `status.py` writes status
through them. Field names are snake_case in Python and camelCase on the wire (Kubernetes style);
validate with `model_validate(obj)` and serialise with `model_dump(by_alias=True)`.

What a CRD structural schema can say (types, enums, ranges, patterns, required fields) is
checked by the API server at `kubectl apply`. What it cannot say (cross-field rules such as
`rotationNMin <= rotationNMax`, an increasing SM ladder, per-class override names that must
exist in the chosen pipeline) is checked here and in `translate.py`, and reported as a
`Ready=False` condition whose message starts with the field path.
"""

from __future__ import annotations

import re
from enum import StrEnum
from typing import Annotated, Literal, Self

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator
from pydantic.alias_generators import to_camel

from horizonserve.runtime.config import (
    PIPELINES,
    CalibrationMode,
    ControlParams,
    PolicyName,
    SmLadder,
)

GROUP = "horizonserve.io"
VERSION = "v1alpha1"
KIND = "OmniService"
PLURAL = "omniservices"
SINGULAR = "omniservice"
SHORT_NAMES = ("osvc",)
CATEGORIES = ("horizonserve",)
API_VERSION = f"{GROUP}/{VERSION}"

GPU_RESOURCE = "nvidia.com/gpu"
DEFAULT_SHM_SIZE = "8Gi"
DEFAULT_ARTIFACT_HOST_PATH = "/var/lib/horizonserve"

# A Kubernetes resource quantity ("500m", "8Gi", "1e3"); integers are accepted as they are.
QUANTITY_PATTERN = r"^[+-]?(\d+(\.\d*)?|\.\d+)([eE][+-]?\d+|[numkMGTPE]|[KMGTPE]i)?$"
Quantity = int | Annotated[str, Field(pattern=QUANTITY_PATTERN)]

PipelineName = StrEnum("PipelineName", {name.upper(): name for name in PIPELINES})
PipelineName.__doc__ = "A pipeline shipped with the runtime (runtime/data/pipelines)."


class Backend(StrEnum):
    """How the stages run: vLLM-Omni with the HorizonServe plugin, or the reference pipeline."""

    VLLM_OMNI = "vllm-omni"
    REFERENCE = "reference"


class _Spec(BaseModel):
    """Wire model: camelCase aliases, unknown fields rejected, immutable."""

    model_config = ConfigDict(
        alias_generator=to_camel,
        populate_by_name=True,
        extra="forbid",
        frozen=True,
        use_enum_values=False,
    )


class Toleration(_Spec):
    """A Kubernetes toleration (core/v1 Toleration)."""

    key: str | None = Field(None, description="Taint key; empty with Exists matches all taints.")
    operator: Literal["Exists", "Equal"] = "Equal"
    value: str | None = None
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] | None = Field(
        None, description="Taint effect to match; empty matches all effects."
    )
    toleration_seconds: int | None = Field(
        None, description="How long a NoExecute taint is tolerated (s); empty: forever."
    )

    @model_validator(mode="after")
    def _empty_key_needs_exists(self) -> Self:
        if not self.key and self.operator != "Exists":
            raise ValueError("operator: an empty key matches all taints only with 'Exists'")
        if self.operator == "Exists" and self.value:
            raise ValueError("value: must be empty when operator is 'Exists'")
        return self

    def tolerates(self, taint: dict[str, str]) -> bool:
        """The core/v1 rule: effect (if set) matches, key (if set) matches, value if Equal."""
        if self.effect and self.effect != taint.get("effect"):
            return False
        if self.key and self.key != taint.get("key"):
            return False
        if not self.key and self.operator != "Exists":
            return False
        if self.operator == "Exists":
            return True
        return (self.value or "") == (taint.get("value") or "")


def _default_tolerations() -> list[Toleration]:
    # GPU nodes are commonly tainted so that only GPU workloads land on them.
    return [Toleration(key=GPU_RESOURCE, operator="Exists", effect="NoSchedule")]


class ResourceRequirements(_Spec):
    """Container resources (core/v1 ResourceRequirements)."""

    requests: dict[str, Quantity] = Field(default_factory=dict)
    limits: dict[str, Quantity] = Field(default_factory=dict)

    @field_validator("requests", "limits")
    @classmethod
    def _one_gpu(cls, value: dict[str, int | str]) -> dict[str, int | str]:
        gpus = value.get(GPU_RESOURCE)
        if gpus is not None and str(gpus) != "1":
            raise ValueError(
                f"{GPU_RESOURCE}: a serving pod uses exactly one GPU (got {gpus!r}); "
                "leave it out, the operator sets it"
            )
        return value


def _default_sidecar_resources() -> ResourceRequirements:
    return ResourceRequirements(
        requests={"cpu": "100m", "memory": "256Mi"}, limits={"memory": "1Gi"}
    )


class SloSpec(_Spec):
    """SLO targets: Δc = solo p95 (from the pipeline or calibration) × multiplier."""

    multiplier: float = Field(5.0, gt=0, description="Global SLO multiplier m.")
    class_overrides: dict[str, Annotated[float, Field(gt=0)]] = Field(
        default_factory=dict,
        description="Per-class multiplier, keyed by the pipeline's class names.",
    )


class ControlSpec(ControlParams):
    """Online control parameters (the runtime's ControlParams, camelCase on the wire)."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True)

    def to_runtime(self) -> ControlParams:
        return ControlParams(**self.model_dump())


class LadderSpec(SmLadder):
    """Shared-stage SM ladder; leave out to let calibration fill it."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True)

    def to_runtime(self) -> SmLadder:
        return SmLadder(**self.model_dump())


class CalibrationSpec(_Spec):
    """Per-node calibration: the init container measures, the sidecar collects and publishes."""

    mode: CalibrationMode = Field(
        CalibrationMode.AUTO,
        description="auto: when the node has no artifact; skip: never; force: on every start.",
    )
    host_path: str = Field(
        DEFAULT_ARTIFACT_HOST_PATH,
        pattern=r"^/.+$",
        description="Node directory that keeps the calibration artifacts across pod restarts.",
    )
    persistent: bool = Field(
        True, description="false: keep artifacts in the pod only (lost when it is replaced)."
    )


class SidecarSpec(_Spec):
    """The metrics/summary sidecar."""

    resources: ResourceRequirements = Field(default_factory=_default_sidecar_resources)


class RolloutSpec(_Spec):
    """How spec changes roll the per-node pods."""

    max_unavailable: int = Field(
        1,
        ge=1,
        description="Ready pods replaced at once; pods that are not ready are replaced freely.",
    )


class OmniServiceSpec(_Spec):
    """What to serve and where: one serving pod on every matching GPU node."""

    pipeline: PipelineName = Field(description="Omni pipeline: qwen2_5_omni, mimo_audio or bagel.")
    model: str | None = Field(
        None, min_length=1, description="Model id or path; default: the pipeline's model."
    )
    backend: Backend = Field(Backend.VLLM_OMNI, description="vllm-omni or reference.")
    image: str | None = Field(
        None, min_length=1, description="Serving image; default: the operator's configured one."
    )
    image_pull_policy: Literal["Always", "IfNotPresent", "Never"] | None = None
    node_selector: dict[str, str] = Field(
        default_factory=dict,
        description="Node labels to match, on top of the node having an NVIDIA GPU.",
    )
    tolerations: list[Toleration] = Field(
        default_factory=_default_tolerations,
        description="Tolerations of the serving pods; default: the nvidia.com/gpu taint.",
    )
    resources: ResourceRequirements = Field(
        default_factory=ResourceRequirements,
        description="Serving container resources; one nvidia.com/gpu is always requested.",
    )
    runtime_class_name: str | None = Field(
        None, min_length=1, description="RuntimeClass of the serving pods (e.g. nvidia)."
    )
    priority_class_name: str | None = Field(None, min_length=1)
    shm_size: Annotated[str, Field(pattern=QUANTITY_PATTERN)] = Field(
        DEFAULT_SHM_SIZE, description="Size of the memory-backed /dev/shm."
    )
    slo: SloSpec = Field(default_factory=SloSpec)
    policy: PolicyName = Field(PolicyName.HORIZON, description="Scheduling policy.")
    control: ControlSpec = Field(default_factory=ControlSpec)
    ladder: LadderSpec | None = None
    calibration: CalibrationSpec = Field(default_factory=CalibrationSpec)
    sidecar: SidecarSpec = Field(default_factory=SidecarSpec)
    rollout: RolloutSpec = Field(default_factory=RolloutSpec)


# --- status --------------------------------------------------------------------------------

ConditionType = Literal["Ready", "Calibrated", "NodesReady", "MetricsAvailable"]
CONDITION_TYPES: tuple[str, ...] = ("Ready", "Calibrated", "NodesReady", "MetricsAvailable")
REASON_PATTERN = r"^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$"


class Condition(_Spec):
    """A metav1.Condition."""

    type: ConditionType
    status: Literal["True", "False", "Unknown"]
    reason: str = Field(pattern=REASON_PATTERN, max_length=1024)
    message: str = Field("", max_length=32768)
    last_transition_time: str = Field(json_schema_extra={"format": "date-time"})
    observed_generation: int | None = Field(None, ge=0)


class ClassStatus(_Spec):
    """One request class, aggregated over the nodes with a fresh summary."""

    name: str
    priority: int
    metric: str | None = None
    target_seconds: float | None = Field(None, description="SLO Δc (s) from the spec's table.")
    requests: int = 0
    met: int = 0
    attainment: float | None = Field(None, description="met / requests, 0..1.")


class ModalityAttainment(_Spec):
    """Attainment by output modality (priority code 0 / 10 / 20), for the wide columns."""

    text: float | None = None
    audio: float | None = None
    image: float | None = None


class NodeStatus(_Spec):
    """One node's serving pod and the summary its sidecar last published."""

    node: str
    pod: str | None = Field(None, description="The serving pod; absent while it is missing.")
    phase: str = Field(description="Pod phase, or Missing / Terminating.")
    ready: bool = False
    up_to_date: bool = Field(True, description="The pod runs the current spec.")
    calibrated: bool | None = None
    attainment: float | None = None
    requests: int = 0
    summary_time: str | None = Field(
        None, description="When the sidecar published the summary (RFC 3339)."
    )
    fresh: bool = Field(False, description="The summary is recent enough to count.")
    errors: list[str] = Field(default_factory=list)


class OmniServiceStatus(_Spec):
    """Observed state, aggregated by the operator on a timer."""

    observed_generation: int | None = None
    model: str | None = Field(None, description="The model being served (resolved).")
    conditions: list[Condition] = Field(default_factory=list)
    nodes_desired: int = 0
    nodes_ready: int = 0
    nodes: str = Field("0/0", description="ready/desired, for the printer column.")
    attainment: float | None = Field(None, description="Overall SLO attainment, 0..1.")
    classes: list[ClassStatus] = Field(default_factory=list)
    by_modality: ModalityAttainment = Field(default_factory=ModalityAttainment)
    node_summaries: list[NodeStatus] = Field(default_factory=list)
    spec_hash: str | None = Field(None, description="Hash of the pod template in force.")


class OmniService(_Spec):
    """The custom resource as a whole (metadata kept opaque)."""

    api_version: Literal["horizonserve.io/v1alpha1"] = API_VERSION
    kind: Literal["OmniService"] = KIND
    metadata: dict = Field(default_factory=dict)
    spec: OmniServiceSpec
    status: OmniServiceStatus | None = None


def _snake_fields() -> dict[str, str]:
    models: tuple[type[BaseModel], ...] = (
        ControlParams,
        SmLadder,
        OmniServiceSpec,
        SloSpec,
        CalibrationSpec,
        RolloutSpec,
        Toleration,
    )
    return {n: to_camel(n) for m in models for n in m.model_fields if "_" in n}


_FIELD_NAMES = _snake_fields()
_SNAKE = re.compile(r"\b[a-z][a-z0-9]*(?:_[a-z0-9]+)+\b")


def camelise_message(message: str) -> str:
    """Rewrite snake_case field names in a runtime validation message to their wire names."""
    return _SNAKE.sub(lambda m: _FIELD_NAMES.get(m.group(0), m.group(0)), message)
