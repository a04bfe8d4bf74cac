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

from horizonserve.operator.quantity import parse_quantity
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

# --- bounds the CRD schema states, so `kubectl apply` refuses what exceeds them ---------------
# Every string has a maxLength, every number a maximum, every list maxItems and every map
# maxProperties: together they cap the size of a spec (and of kopf's last-handled annotation,
# which holds a copy of it) well below the API server's 256 KiB annotation limit.
MAX_NAME_LENGTH = 253  # a DNS subdomain (object names)
MAX_LABEL_KEY = 317  # prefix (253) + "/" + name (63)
MAX_LABEL_VALUE = 63
MAX_SELECTOR_LABELS = 32
MAX_TOLERATIONS = 32
MAX_RESOURCES = 16
MAX_CLASS_OVERRIDES = 32
MAX_MULTIPLIER = 1000.0
MAX_IMAGE_LENGTH = 512
MAX_MODEL_LENGTH = 512
MAX_INT_QUANTITY = 2**53  # integers a JSON reader holds exactly
MAX_TOLERATION_SECONDS = 31_536_000  # one year

# A Kubernetes resource quantity ("500m", "8Gi", "1e3"); integers are accepted as they are.
QUANTITY_PATTERN = r"^[+]?(\d+(\.\d*)?|\.\d+)([eE][+-]?\d+|[numkMGTPE]|[KMGTPE]i)?$"
# A strictly positive quantity (a size of zero makes no sense for /dev/shm).
POSITIVE_QUANTITY_PATTERN = (
    r"^[+]?(0*[1-9]\d*(\.\d*)?|0*\.\d*[1-9]\d*)([eE][+-]?\d+|[numkMGTPE]|[KMGTPE]i)?$"
)
Quantity = (
    Annotated[int, Field(ge=0, le=MAX_INT_QUANTITY)]
    | Annotated[str, Field(pattern=QUANTITY_PATTERN, max_length=64)]
)
# An image reference: [registry[:port]/]path[:tag][@sha256:digest], path in lower case.
IMAGE_PATTERN = (
    r"^(([a-zA-Z0-9-]+\.)+[a-zA-Z0-9-]+(:[0-9]{1,5})?/|localhost(:[0-9]{1,5})?/"
    r"|[a-z0-9-]+:[0-9]{1,5}/)?[a-z0-9]+([._-]+[a-z0-9]+)*(/[a-z0-9]+([._-]+[a-z0-9]+)*)*"
    r"(:[A-Za-z0-9_][A-Za-z0-9_.-]{0,127})?(@sha256:[a-f0-9]{64})?$"
)
DNS_SUBDOMAIN_PATTERN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
LABEL_KEY_PATTERN = (
    r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?"
    r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$"
)
LABEL_VALUE_PATTERN = r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$"
SECRET_KEY_PATTERN = r"^[-._a-zA-Z0-9]+$"
CLASS_NAME_PATTERN = r"^[a-z0-9][a-z0-9_\-]*$"

LabelKey = Annotated[str, Field(max_length=MAX_LABEL_KEY, pattern=LABEL_KEY_PATTERN)]
LabelValue = Annotated[str, Field(max_length=MAX_LABEL_VALUE, pattern=LABEL_VALUE_PATTERN)]
ObjectName = Annotated[str, Field(max_length=MAX_NAME_LENGTH, pattern=DNS_SUBDOMAIN_PATTERN)]
ResourceName = Annotated[str, Field(max_length=MAX_NAME_LENGTH, pattern=LABEL_KEY_PATTERN)]

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

    key: LabelKey | None = Field(
        None, description="Taint key; empty with Exists matches all taints."
    )
    operator: Literal["Exists", "Equal"] = "Equal"
    value: LabelValue | None = None
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] | None = Field(
        None, description="Taint effect to match; empty matches all effects."
    )
    toleration_seconds: int | None = Field(
        None,
        ge=0,
        le=MAX_TOLERATION_SECONDS,
        description="How long a NoExecute taint is tolerated (s); empty: forever.",
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

    requests: dict[ResourceName, Quantity] = Field(default_factory=dict, max_length=MAX_RESOURCES)
    limits: dict[ResourceName, Quantity] = Field(default_factory=dict, max_length=MAX_RESOURCES)

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

    @model_validator(mode="after")
    def _requests_within_limits(self) -> Self:
        for name, limit in self.limits.items():
            request = self.requests.get(name)
            if request is not None and parse_quantity(request) > parse_quantity(limit):
                raise ValueError(
                    f"requests.{name}: {request} exceeds limits.{name} {limit}; "
                    "lower the request or raise the limit"
                )
        return self


def _default_sidecar_resources() -> ResourceRequirements:
    return ResourceRequirements(
        requests={"cpu": "100m", "memory": "256Mi"}, limits={"memory": "1Gi"}
    )


class SloSpec(_Spec):
    """SLO targets: Δc = solo p95 (from the pipeline or calibration) × multiplier."""

    multiplier: float = Field(5.0, gt=0, le=MAX_MULTIPLIER, description="Global SLO multiplier m.")
    class_overrides: dict[
        Annotated[str, Field(max_length=MAX_LABEL_VALUE, pattern=CLASS_NAME_PATTERN)],
        Annotated[float, Field(gt=0, le=MAX_MULTIPLIER)],
    ] = Field(
        default_factory=dict,
        max_length=MAX_CLASS_OVERRIDES,
        description="Per-class multiplier, keyed by the pipeline's class names.",
    )


class ControlSpec(ControlParams):
    """Online control parameters (the runtime's ControlParams, camelCase on the wire)."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="forbid")

    def to_runtime(self) -> ControlParams:
        return ControlParams(**self.model_dump())


class LadderSpec(SmLadder):
    """Shared-stage SM ladder; leave out to let calibration fill it."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="forbid")

    def to_runtime(self) -> SmLadder:
        return SmLadder(**self.model_dump())


class CalibrationSpec(_Spec):
    """Per-node calibration: the init container measures, the sidecar keeps the artifact in
    the node's ConfigMap (Kubernetes API, no host path), the next pod starts from it."""

    mode: CalibrationMode = Field(
        CalibrationMode.AUTO,
        description="auto: when the node has no artifact; skip: never; force: on every start.",
    )


class SecretKeyRef(_Spec):
    """A key of a Secret in the OmniService's namespace."""

    name: ObjectName = Field(description="Secret name.")
    key: Annotated[str, Field(max_length=MAX_NAME_LENGTH, pattern=SECRET_KEY_PATTERN)] = Field(
        "api-key", description="Key in the Secret's data."
    )


# --- where the weights come from, and the engine's arguments (operator/model_source.py) ----

# A Hugging Face repo id: `name` or `owner/name`.
HF_REPO_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]*(/[A-Za-z0-9][A-Za-z0-9._-]*)?$"
# A branch, tag or commit: no leading '-' or '.', no '..' component, no spaces.
HF_REVISION_PATTERN = r"^[A-Za-z0-9_][A-Za-z0-9_.-]*(/[A-Za-z0-9_][A-Za-z0-9_.-]*)*$"
# A relative path inside a volume: no component starts with '.', so no '..' escapes it.
RELATIVE_PATH_PATTERN = r"^[A-Za-z0-9_][A-Za-z0-9_.-]*(/[A-Za-z0-9_][A-Za-z0-9_.-]*)*$"
# An absolute path inside an image, same components.
ABSOLUTE_PATH_PATTERN = r"^(/[A-Za-z0-9_][A-Za-z0-9_.-]*)+$"
MAX_PATH_LENGTH = 512
MAX_REPO_LENGTH = 200
MAX_REVISION_LENGTH = 128
DEFAULT_MODEL_CACHE_SIZE = "64Gi"


def _is_none(value: object) -> bool:
    return value is None


class TokenSecretRef(_Spec):
    """A key of a Secret in the OmniService's namespace holding a Hugging Face token."""

    name: ObjectName = Field(
        description="Secret name (it must carry the label that allows OmniServices to use it)."
    )
    key: Annotated[str, Field(max_length=MAX_NAME_LENGTH, pattern=SECRET_KEY_PATTERN)] = Field(
        "token", description="Key in the Secret's data."
    )


class HuggingFaceSource(_Spec):
    """Download from the Hugging Face Hub in an init container, into the node-local cache;
    the serving container then runs offline (HF_HUB_OFFLINE=1) from that cache."""

    repo: str | None = Field(
        None,
        max_length=MAX_REPO_LENGTH,
        pattern=HF_REPO_PATTERN,
        description="Repo id (owner/name); default: spec.model.",
    )
    revision: str | None = Field(
        None,
        max_length=MAX_REVISION_LENGTH,
        pattern=HF_REVISION_PATTERN,
        description="Branch, tag or commit; default: the repo's default branch.",
    )
    token_secret: TokenSecretRef | None = Field(
        None, description="Secret key holding a token, for gated or private repos."
    )


class PvcSource(_Spec):
    """An existing PersistentVolumeClaim holding the weights (a model cache filled
    beforehand), mounted read-only; the serving container runs offline."""

    claim_name: ObjectName = Field(description="PersistentVolumeClaim in this namespace.")
    path: str | None = Field(
        None,
        max_length=MAX_PATH_LENGTH,
        pattern=RELATIVE_PATH_PATTERN,
        description="Directory inside the claim holding the model (config.json, weights, "
        "tokenizer); default: the claim's root.",
    )


class ImageSource(_Spec):
    """An OCI image holding the weights: mounted as an image volume where the cluster
    supports it (chart value modelSource.imageVolumes), else copied by an init container
    into an emptyDir bounded by cache.sizeLimit."""

    reference: str = Field(
        max_length=MAX_IMAGE_LENGTH, pattern=IMAGE_PATTERN, description="Image reference."
    )
    path: str = Field(
        "/models",
        max_length=MAX_PATH_LENGTH,
        pattern=ABSOLUTE_PATH_PATTERN,
        description="Directory inside the image holding the model.",
    )
    pull_policy: Literal["Always", "IfNotPresent", "Never"] | None = None


class ModelCacheSpec(_Spec):
    """The node-local cache a download or copy fills (huggingFace, image copied)."""

    size_limit: Annotated[str, Field(pattern=POSITIVE_QUANTITY_PATTERN, max_length=64)] = Field(
        DEFAULT_MODEL_CACHE_SIZE,
        description="Bound of the cache emptyDir on the node's disk; the kubelet evicts a pod "
        "that writes more.",
    )
    claim_name: ObjectName | None = Field(
        None,
        description="huggingFace only: an existing PVC to keep the download in instead of the "
        "emptyDir, so that a new pod finds it (bounded by the claim's size).",
    )


class ModelSource(_Spec):
    """Where the weights come from: exactly one of huggingFace, pvc, image."""

    hugging_face: HuggingFaceSource | None = None
    pvc: PvcSource | None = None
    image: ImageSource | None = None
    cache: ModelCacheSpec = Field(default_factory=ModelCacheSpec)

    @property
    def kind(self) -> str:
        return "huggingFace" if self.hugging_face else "pvc" if self.pvc else "image"

    @model_validator(mode="after")
    def _exactly_one(self) -> Self:
        chosen = [n for n in ("huggingFace", "pvc", "image") if getattr(self, _SOURCE_FIELDS[n])]
        if len(chosen) != 1:
            got = " and ".join(chosen) if chosen else "none"
            raise ValueError(f"set exactly one of huggingFace, pvc or image (got {got})")
        if self.cache.claim_name is not None and self.hugging_face is None:
            raise ValueError(
                "cache.claimName: only a huggingFace download fills a cache claim; for a "
                "ready-made cache use modelSource.pvc"
            )
        return self


_SOURCE_FIELDS = {"huggingFace": "hugging_face", "pvc": "pvc", "image": "image"}

# Engine arguments: an allowlist of `vllm serve` flags, each typed and bounded here (and so in
# the CRD schema); the flag is the field name in kebab case. Enum values are a subset of vLLM
# 0.30's own (tests/operator/test_model_source.py checks them against the installed vLLM).
VllmDType = Literal["auto", "half", "float16", "bfloat16", "float", "float32"]
VllmKvCacheDType = Literal["auto", "float16", "bfloat16", "fp8", "fp8_e4m3", "fp8_e5m2"]
VllmQuantization = Literal[
    "awq", "awq_marlin", "gptq", "gptq_marlin", "fp8", "compressed-tensors", "modelopt",
    "modelopt_fp4", "mxfp4",
]  # fmt: skip
MultimodalInput = Literal["image", "audio", "video"]


class EngineArgs(_Spec):
    """`vllm serve` flags (backend vllm-omni); each field is one allowlisted flag."""

    max_model_len: int | None = Field(None, ge=16, le=1_048_576, description="--max-model-len")
    gpu_memory_utilization: float | None = Field(
        None, gt=0, le=1, description="--gpu-memory-utilization (fraction of the GPU)"
    )
    dtype: VllmDType | None = Field(None, description="--dtype")
    kv_cache_dtype: VllmKvCacheDType | None = Field(None, description="--kv-cache-dtype")
    quantization: VllmQuantization | None = Field(None, description="--quantization")
    max_num_seqs: int | None = Field(None, ge=1, le=4096, description="--max-num-seqs")
    max_num_batched_tokens: int | None = Field(
        None, ge=16, le=1_048_576, description="--max-num-batched-tokens"
    )
    enforce_eager: bool | None = Field(None, description="--enforce-eager (no CUDA graphs)")
    enable_prefix_caching: bool | None = Field(
        None, description="--enable-prefix-caching / --no-enable-prefix-caching"
    )
    enable_chunked_prefill: bool | None = Field(
        None, description="--enable-chunked-prefill / --no-enable-chunked-prefill"
    )
    seed: int | None = Field(None, ge=0, le=2**31 - 1, description="--seed")
    max_logprobs: int | None = Field(None, ge=0, le=1024, description="--max-logprobs")
    limit_mm_per_prompt: dict[MultimodalInput, Annotated[int, Field(ge=0, le=64)]] | None = Field(
        None, max_length=3, description="--limit-mm-per-prompt (inputs per prompt)"
    )
    trust_remote_code: bool | None = Field(
        None,
        description="--trust-remote-code: runs the model repo's own Python; refused unless "
        "the chart allows it (modelSource.allowTrustRemoteCode).",
    )


class ServiceSpec(_Spec):
    """The Service in front of the serving pods (`status.endpoint`)."""

    enabled: bool = Field(True, description="Create a Service selecting the Ready serving pods.")
    internal_traffic_policy: Literal["Cluster", "Local"] = Field(
        "Cluster",
        description="Local: clients reach the serving pod on their own node only (edge "
        "clients on the GPU node; Kubernetes >= 1.22).",
    )


class SidecarSpec(_Spec):
    """The metrics/summary sidecar."""

    resources: ResourceRequirements = Field(default_factory=_default_sidecar_resources)


class RolloutSpec(_Spec):
    """How spec changes roll the per-node pods."""

    max_unavailable: int = Field(
        1,
        ge=1,
        le=10_000,
        description="Ready pods replaced at once; pods that are not ready are replaced freely.",
    )


class OmniServiceSpec(_Spec):
    """What to serve and where: one serving pod on every matching GPU node."""

    pipeline: PipelineName = Field(description="Omni pipeline: qwen2_5_omni, mimo_audio or bagel.")
    model: str | None = Field(
        None,
        min_length=1,
        max_length=MAX_MODEL_LENGTH,
        pattern=r"^[A-Za-z0-9_./:@+-]+$",
        description="Model id or path; default: the pipeline's model.",
    )
    backend: Backend = Field(Backend.VLLM_OMNI, description="vllm-omni or reference.")
    image: str | None = Field(
        None,
        max_length=MAX_IMAGE_LENGTH,
        pattern=IMAGE_PATTERN,
        description="Serving image; default: the operator's configured one.",
    )
    image_pull_policy: Literal["Always", "IfNotPresent", "Never"] | None = None
    node_selector: dict[LabelKey, LabelValue] = Field(
        default_factory=dict,
        max_length=MAX_SELECTOR_LABELS,
        description="Node labels to match, on top of the node having an NVIDIA GPU. Required "
        "(non-empty) unless allGpuNodes is true.",
    )
    all_gpu_nodes: bool = Field(
        False,
        description="true: serve on every GPU node of the cluster (an empty nodeSelector is "
        "refused otherwise, so that a mistyped selector never means every node).",
    )
    tolerations: list[Toleration] = Field(
        default_factory=_default_tolerations,
        max_length=MAX_TOLERATIONS,
        description="Tolerations of the serving pods; default: the nvidia.com/gpu taint.",
    )
    resources: ResourceRequirements = Field(
        default_factory=ResourceRequirements,
        description="Serving container resources; one nvidia.com/gpu is always requested.",
    )
    runtime_class_name: ObjectName | None = Field(
        None, description="RuntimeClass of the serving pods (e.g. nvidia; k3s: nvidia)."
    )
    priority_class_name: ObjectName | None = None
    shm_size: Annotated[str, Field(pattern=POSITIVE_QUANTITY_PATTERN, max_length=64)] = Field(
        DEFAULT_SHM_SIZE, description="Size of the memory-backed /dev/shm (more than zero)."
    )
    api_key_secret: SecretKeyRef | None = Field(
        None,
        description="Secret holding the API key clients must send; passed to the serving "
        "container as HORIZONSERVE_API_KEY.",
    )
    # Left out of a dump when unset, so that a spec without them hashes as before (no roll).
    model_source: ModelSource | None = Field(
        None,
        exclude_if=_is_none,
        description="Where the weights come from (huggingFace, pvc or image); default: the "
        "serving container fetches spec.model itself at every start.",
    )
    engine_args: EngineArgs | None = Field(
        None, exclude_if=_is_none, description="Allowlisted vLLM engine flags (vllm-omni)."
    )
    service: ServiceSpec = Field(default_factory=ServiceSpec)
    slo: SloSpec = Field(default_factory=SloSpec)
    policy: PolicyName = Field(PolicyName.HORIZON, description="Scheduling policy.")
    control: ControlSpec = Field(default_factory=ControlSpec)
    ladder: LadderSpec | None = None
    calibration: CalibrationSpec = Field(default_factory=CalibrationSpec)
    sidecar: SidecarSpec = Field(default_factory=SidecarSpec)
    rollout: RolloutSpec = Field(default_factory=RolloutSpec)

    @model_validator(mode="after")
    def _explicit_nodes(self) -> Self:
        if not self.node_selector and not self.all_gpu_nodes:
            raise ValueError(
                "nodeSelector: empty; name the node labels to serve on, or set "
                "allGpuNodes: true to serve on every GPU node"
            )
        return self


# --- status --------------------------------------------------------------------------------

ConditionType = Literal[
    "Ready", "Calibrated", "NodesReady", "MetricsAvailable", "Conflict", "WeightsReady"
]
CONDITION_TYPES: tuple[str, ...] = (
    "Ready",
    "Calibrated",
    "NodesReady",
    "MetricsAvailable",
    "Conflict",
    "WeightsReady",  # only while spec.modelSource is set
)
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
    endpoint: str | None = Field(None, description="URL of the OmniService's Service.")


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
        ServiceSpec,
        ModelSource,
        ModelCacheSpec,
        HuggingFaceSource,
        PvcSource,
        ImageSource,
        EngineArgs,
    )
    return {n: to_camel(n) for m in models for n in m.model_fields if "_" in n}


_FIELD_NAMES = _snake_fields()
_SNAKE = re.compile(r"\b[a-z][a-z0-9]*(?:_[a-z0-9]+)+\b")


def camelise_message(message: str) -> str:
    """Rewrite snake_case field names in a runtime validation message to their wire names."""
    return _SNAKE.sub(lambda m: _FIELD_NAMES.get(m.group(0), m.group(0)), message)
