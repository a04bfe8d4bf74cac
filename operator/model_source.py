"""Where a serving pod's weights come from: `spec.modelSource` and `spec.engineArgs`.

Three source kinds (exactly one; `models.ModelSource`):

* `huggingFace`: an init container (`weights`, the serving image) downloads the repo into a
  node-local cache, an emptyDir bounded by `cache.sizeLimit` (or an existing PVC named by
  `cache.claimName`, kept across pods). The token, if any, comes from a Secret key and is given
  to that init container alone. The serving container then reads the cache read-only, offline.
* `pvc`: an existing claim holding the model directory, mounted read-only; nothing is fetched.
* `image`: an OCI image holding the weights. Where the cluster supports image volumes (chart
  value `modelSource.imageVolumes`, Kubernetes 1.33+ with the ImageVolume feature), it is
  mounted read-only as one; else an init container running that image copies the directory
  into an emptyDir bounded by `cache.sizeLimit` (the image must then carry `sh` and `cp`).

With any source the serving container runs with HF_HUB_OFFLINE=1: it never reaches the hub,
so an offline edge node serves from what is local, and a token never reaches it.

Invariants:

* A spec without `modelSource` and `engineArgs` gets exactly the pod it got before (no roll).
* Every engine flag comes from `models.EngineArgs`, an allowlist whose values the schema bounds;
  nothing from the spec reaches the command line unchecked. `--trust-remote-code` only when
  the chart allows it (HORIZONSERVE_ALLOW_TRUST_REMOTE_CODE).
* The weights' progress is read from the `weights` init container's state (the init
  container holds no API token, by design): `WeightsReady` on the OmniService, and an Event
  at each change of its reason.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import logging
import os
import re
from collections.abc import Mapping, Sequence
from typing import Any, Literal, Protocol

from horizonserve.operator.models import (
    HF_REPO_PATTERN,
    Backend,
    EngineArgs,
    ModelSource,
    OmniServiceSpec,
)
from horizonserve.operator.policy import (
    SECRET_LABEL,
    SECRET_LABEL_VALUE,
    registry_of,
    secret_labelled,
)
from horizonserve.operator.quantity import parse_quantity
from horizonserve.runtime.config import ServingConfig

log = logging.getLogger(__name__)

WEIGHTS_CONTAINER = "weights"  # the init container that downloads or copies
MODEL_VOLUME = "model"  # pvc, image volume or copied emptyDir
CACHE_VOLUME = "model-cache"  # the huggingFace download cache
MODEL_MOUNT = "/var/lib/horizonserve/model"
CACHE_MOUNT = "/var/lib/horizonserve/model-cache"
HF_HUB_DIR = f"{CACHE_MOUNT}/hub"
HF_TOKEN_ENV = "HF_TOKEN"
OFFLINE_ENV = ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")
# An init container that only moves bytes: a little CPU, bounded memory.
WEIGHTS_RESOURCES: dict[str, Any] = {
    "requests": {"cpu": "250m", "memory": "512Mi"},
    "limits": {"memory": "2Gi"},
}

ALLOW_TRUST_REMOTE_CODE_ENV = "HORIZONSERVE_ALLOW_TRUST_REMOTE_CODE"
IMAGE_VOLUMES_ENV = "HORIZONSERVE_IMAGE_VOLUMES"
CACHE_MAX_ENV = "HORIZONSERVE_MODEL_CACHE_MAX"

# The copy of the `image` kind without image volumes: runs inside the weights image.
COPY_SCRIPT = r"""
set -u
src="$1"; dst="$2"; log="${TERMINATION_LOG:-/dev/termination-log}"
say() { echo "$1"; echo "$1" > "$log" 2>/dev/null || true; }
if [ ! -d "$src" ]; then
  say "no directory $src in the weights image: set spec.modelSource.image.path"; exit 1
fi
start=$(date +%s)
if ! cp -R "$src"/. "$dst"/; then
  say "copying $src failed (disk full? raise spec.modelSource.cache.sizeLimit)"; exit 1
fi
kib=$(du -sk "$dst" | cut -f1)
say "copied $((kib / 1024)) MiB from $src in $(( $(date +%s) - start ))s"
""".strip()


def _flag(env: Mapping[str, str], name: str) -> bool:
    raw = env.get(name, "").strip().lower()
    if raw in ("", "0", "false", "no", "off"):
        return False
    if raw in ("1", "true", "yes", "on"):
        return True
    raise ValueError(f"{name}={raw!r}: use true or false")


@dataclasses.dataclass(frozen=True)
class SourcePolicy:
    """What the chart allows (the operator's environment, set from chart values)."""

    allow_trust_remote_code: bool = False
    image_volumes: bool = False
    max_cache_size: str | None = None  # a quantity; None: no bound beyond the spec's own

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> SourcePolicy:
        env = os.environ if env is None else env
        cap = env.get(CACHE_MAX_ENV, "").strip() or None
        if cap is not None:
            try:
                parse_quantity(cap)
            except ValueError:
                raise ValueError(f"{CACHE_MAX_ENV}={cap!r}: not a quantity") from None
        return cls(
            allow_trust_remote_code=_flag(env, ALLOW_TRUST_REMOTE_CODE_ENV),
            image_volumes=_flag(env, IMAGE_VOLUMES_ENV),
            max_cache_size=cap,
        )


# --- validation: what the schema cannot say -------------------------------------------------


def refusal(spec: OmniServiceSpec, policy: SourcePolicy, registries: Sequence[str]) -> str | None:
    """Why the model source or engine arguments cannot be served (field path first).
    `registries`: those a spec's images may come from (`policy.Policy.allowed_registries`)."""
    source, args = spec.model_source, spec.engine_args
    if spec.model is not None and spec.model.startswith("-"):
        return (
            f"spec.model: {spec.model!r} starts with '-': a model is a model id or a path, "
            "never a command-line flag (engine flags go in spec.engineArgs)"
        )
    if spec.backend is Backend.REFERENCE:
        for field, value in (("modelSource", source), ("engineArgs", args)):
            if value is not None:
                return (
                    f"spec.{field}: the reference backend runs model-shaped stages with random "
                    f"weights and takes no {field}; remove it or use backend: vllm-omni"
                )
        return None
    if args is not None and args.trust_remote_code and not policy.allow_trust_remote_code:
        return (
            "spec.engineArgs.trustRemoteCode: refused here: --trust-remote-code runs Python "
            "from the model repo inside the serving pod, and this operator's chart does not "
            "allow it (chart value modelSource.allowTrustRemoteCode: false); use a model "
            "vLLM supports natively, or ask the cluster admin"
        )
    if source is None:
        return None
    if policy.max_cache_size is not None and (source.hugging_face or source.image):
        size = source.cache.size_limit
        if parse_quantity(size) > parse_quantity(policy.max_cache_size):
            return (
                f"spec.modelSource.cache.sizeLimit: {size} exceeds this cluster's bound "
                f"{policy.max_cache_size} (chart value modelSource.maxCacheSize); lower it or "
                "use a pvc source"
            )
    hf = source.hugging_face
    if hf is not None and hf.repo is None and not _looks_like_repo(spec.model):
        return (
            f"spec.modelSource.huggingFace.repo: unset, and spec.model {spec.model!r} is "
            "not a Hugging Face repo id (owner/name); name the repo"
        )
    if source.image is not None:
        registry = registry_of(source.image.reference)
        if registry not in registries:
            return (
                f"spec.modelSource.image.reference: registry {registry!r} is not allowed here "
                f"(allowed: {', '.join(registries)}); push the weights image to an allowed "
                "registry, or ask the cluster admin (chart value servingPolicy.registries)"
            )
    return None


def _looks_like_repo(model: str | None) -> bool:
    if model is None:  # the pipeline's own model: a repo id
        return True
    return re.match(HF_REPO_PATTERN, model) is not None and "/" in model


# --- the pod-spec pieces --------------------------------------------------------------------


def served_model(
    spec: OmniServiceSpec, config: ServingConfig, image_volumes: bool
) -> tuple[str, list[str]]:
    """What `vllm serve` loads, and the flags that go with it (name, revision)."""
    source = spec.model_source
    if source is None:
        return config.model, []
    if source.hugging_face is not None:
        repo = source.hugging_face.repo or config.model
        flags = ["--revision", source.hugging_face.revision] if source.hugging_face.revision else []
        if repo != config.model:
            flags += ["--served-model-name", config.model]
        return repo, flags
    path = MODEL_MOUNT
    if source.image is not None and image_volumes:
        path = f"{MODEL_MOUNT}{source.image.path}"  # the whole image is mounted
    return path, ["--served-model-name", config.model]


def engine_flags(args: EngineArgs | None) -> list[str]:
    """The allowlisted flags, in field order; booleans as vLLM spells them."""
    if args is None:
        return []
    out: list[str] = []
    for name, value in args.model_dump(exclude_none=True).items():
        flag = "--" + name.replace("_", "-")
        if isinstance(value, bool):
            if name == "enforce_eager" or name == "trust_remote_code":
                out += [flag] if value else []  # store_true flags: absent means false
            else:
                out.append(flag if value else f"--no-{flag[2:]}")
        elif isinstance(value, dict):
            out += [flag, json.dumps(value, sort_keys=True, separators=(",", ":"))]
        else:
            out += [flag, str(value)]
    return out


def _env(name: str, value: str) -> dict[str, Any]:
    return {"name": name, "value": value}


def _hf_init(spec: OmniServiceSpec, config: ServingConfig, image: str) -> dict[str, Any]:
    assert spec.model_source is not None and spec.model_source.hugging_face is not None
    hf = spec.model_source.hugging_face
    command = [
        "python3", "-m", "horizonserve.operator.model_fetch", "huggingface",
        "--repo", hf.repo or config.model, "--cache-dir", HF_HUB_DIR,
    ]  # fmt: skip
    if hf.revision:
        command += ["--revision", hf.revision]
    env = [
        _env("HF_HOME", f"{CACHE_MOUNT}/home"),
        _env("HF_HUB_CACHE", HF_HUB_DIR),
        _env("HF_HUB_DISABLE_TELEMETRY", "1"),
        _env("HOME", f"{CACHE_MOUNT}/home"),
        # The root filesystem is read-only: temporary files go to the cache volume too.
        _env("TMPDIR", f"{CACHE_MOUNT}/tmp"),
    ]
    if hf.token_secret is not None:
        ref = {"name": hf.token_secret.name, "key": hf.token_secret.key}
        env.append({"name": HF_TOKEN_ENV, "valueFrom": {"secretKeyRef": ref}})
    return {
        "name": WEIGHTS_CONTAINER,
        "image": image,
        "command": command,
        "env": env,
        "volumeMounts": [{"name": CACHE_VOLUME, "mountPath": CACHE_MOUNT}],
    }


def _copy_init(source: ModelSource) -> dict[str, Any]:
    assert source.image is not None
    pull = {"imagePullPolicy": source.image.pull_policy} if source.image.pull_policy else {}
    return {
        "name": WEIGHTS_CONTAINER,
        "image": source.image.reference,
        **pull,
        "command": ["sh", "-c", COPY_SCRIPT, "copy", source.image.path, MODEL_MOUNT],
        "volumeMounts": [{"name": MODEL_VOLUME, "mountPath": MODEL_MOUNT}],
    }


def _volumes(source: ModelSource, copied: bool) -> list[dict[str, Any]]:
    empty = {"emptyDir": {"sizeLimit": source.cache.size_limit}}
    if source.hugging_face is not None:
        claim = source.cache.claim_name
        cache = {"persistentVolumeClaim": {"claimName": claim}} if claim else empty
        return [{"name": CACHE_VOLUME, **cache}]
    if source.pvc is not None:
        pvc = {"claimName": source.pvc.claim_name, "readOnly": True}
        return [{"name": MODEL_VOLUME, "persistentVolumeClaim": pvc}]
    assert source.image is not None
    if copied:
        return [{"name": MODEL_VOLUME, **empty}]
    image: dict[str, Any] = {"reference": source.image.reference}
    if source.image.pull_policy:
        image["pullPolicy"] = source.image.pull_policy
    return [{"name": MODEL_VOLUME, "image": image}]


def _serving_mount(source: ModelSource) -> dict[str, Any]:
    if source.hugging_face is not None:
        return {"name": CACHE_VOLUME, "mountPath": CACHE_MOUNT, "readOnly": True}
    mount = {"name": MODEL_VOLUME, "mountPath": MODEL_MOUNT, "readOnly": True}
    if source.pvc is not None and source.pvc.path:
        mount["subPath"] = source.pvc.path
    return mount


def apply(
    pod_spec: dict[str, Any],
    spec: OmniServiceSpec,
    config: ServingConfig,
    *,
    image: str,
    security: Mapping[str, Any],
    policy: SourcePolicy | None = None,
) -> None:
    """Add the model source's volumes, mounts, env and init container, and the engine flags,
    to a serving pod spec built by `builders.serving_pod` (in place). A spec with neither
    `modelSource` nor `engineArgs`, or the reference backend, leaves the pod as it was."""
    if spec.backend is not Backend.VLLM_OMNI or (
        spec.model_source is None and spec.engine_args is None
    ):
        return
    policy = policy or SourcePolicy.from_env()
    serving = next(c for c in pod_spec["containers"] if c["name"] == "serving")
    source = spec.model_source
    copied = source is not None and source.image is not None and not policy.image_volumes
    model, flags = served_model(spec, config, policy.image_volumes)
    command = list(serving["command"])
    # builders.serving_command: ["vllm", "serve", <model>, "--omni", ...]
    assert command[:3] == ["vllm", "serve", config.model], command
    command[2] = model
    serving["command"] = command + flags + engine_flags(spec.engine_args)
    if source is None:
        return
    serving["env"] = [*serving.get("env", ()), *(_env(n, "1") for n in OFFLINE_ENV)]
    if source.hugging_face is not None:
        serving["env"].append(_env("HF_HUB_CACHE", HF_HUB_DIR))
    serving["volumeMounts"] = [*serving.get("volumeMounts", ()), _serving_mount(source)]
    pod_spec["volumes"] = [*pod_spec.get("volumes", ()), *_volumes(source, copied)]
    init = None
    if source.hugging_face is not None:
        init = _hf_init(spec, config, image)
        if "imagePullPolicy" in serving:
            init["imagePullPolicy"] = serving["imagePullPolicy"]
    elif copied:
        init = _copy_init(source)
    if init is not None:
        init["resources"] = json.loads(json.dumps(WEIGHTS_RESOURCES))
        init["securityContext"] = {**security, "readOnlyRootFilesystem": True}
        init["terminationMessagePolicy"] = "FallbackToLogsOnError"
        # First: the download needs no GPU, and calibration may read the weights.
        # In place: the caller's list object (builders checks it for emptiness afterwards).
        pod_spec.setdefault("initContainers", []).insert(0, init)


# --- progress: the weights init container's state -> WeightsReady and Events ----------------

Step = Literal["pending", "running", "done", "failed"]
_FAILED_WAITING = (
    "ErrImagePull", "ImagePullBackOff", "InvalidImageName", "ErrImageNeverPull",
    "CreateContainerConfigError", "CreateContainerError", "CrashLoopBackOff",
)  # fmt: skip
MAX_DETAIL = 300
MAX_LISTED = 5


@dataclasses.dataclass(frozen=True)
class WeightsState:
    """One pod's weights, as its status shows them."""

    step: Step
    detail: str = ""
    started: str | None = None  # RFC 3339, while running
    restarts: int = 0


def _message(terminated: Mapping[str, Any]) -> str:
    text = str(terminated.get("message") or "").strip()
    if not text:
        code = terminated.get("exitCode")
        text = f"exit code {code}" + (
            f" ({terminated['reason']})" if terminated.get("reason") else ""
        )
    return text.splitlines()[-1][:MAX_DETAIL] if text else ""


def weights_state(status: Mapping[str, Any]) -> WeightsState | None:
    """From a pod's status: the `weights` init container's step; for a pod without one
    (pvc, image volume), whether the serving container got its mounts; None before the pod
    reports anything."""
    for st in status.get("initContainerStatuses") or ():
        if st.get("name") != WEIGHTS_CONTAINER:
            continue
        state = st.get("state") or {}
        restarts = int(st.get("restartCount") or 0)
        last = (st.get("lastState") or {}).get("terminated") or {}
        if "terminated" in state:
            done = state["terminated"]
            step: Step = "done" if done.get("exitCode") == 0 else "failed"
            return WeightsState(step, _message(done), restarts=restarts)
        if "running" in state:
            if restarts and last.get("exitCode") not in (None, 0):
                detail = f"retrying (attempt {restarts + 1}) after: {_message(last)}"
                return WeightsState("failed", detail, state["running"].get("startedAt"), restarts)
            return WeightsState("running", "", state["running"].get("startedAt"), restarts)
        waiting = state.get("waiting") or {}
        reason = str(waiting.get("reason") or "")
        if reason in _FAILED_WAITING:
            why = (
                _message(last) if reason == "CrashLoopBackOff" and last else waiting.get("message")
            )
            return WeightsState("failed", f"{reason}: {why or ''}".strip(": ")[:MAX_DETAIL])
        return WeightsState("pending", reason)
    for cond in status.get("conditions") or ():
        message = str(cond.get("message") or "")
        unschedulable = cond.get("type") == "PodScheduled" and cond.get("status") == "False"
        if unschedulable and "persistentvolumeclaim" in message.lower():
            return WeightsState("failed", message[:MAX_DETAIL])
    for st in status.get("containerStatuses") or ():
        if st.get("name") == "serving":
            state = st.get("state") or {}
            if "running" in state or "terminated" in state:
                return WeightsState("done", "mounted")
            return WeightsState("pending", str((state.get("waiting") or {}).get("reason") or ""))
    return None


class _Pod(Protocol):
    @property
    def weights(self) -> WeightsState | None: ...


def describe(source: ModelSource, image_volumes: bool) -> str:
    if source.hugging_face is not None:
        hf = source.hugging_face
        where = f"PVC {source.cache.claim_name}" if source.cache.claim_name else "emptyDir"
        rev = f"@{hf.revision}" if hf.revision else ""
        return f"Hugging Face {hf.repo or 'spec.model'}{rev} into a {where} cache"
    if source.pvc is not None:
        return f"PVC {source.pvc.claim_name}" + (f"/{source.pvc.path}" if source.pvc.path else "")
    assert source.image is not None
    how = "image volume" if image_volumes else "copied from the image"
    return f"{source.image.reference}:{source.image.path} ({how})"


def _seconds_since(stamp: str | None, now: float) -> str:
    if not stamp:
        return ""
    try:
        t = datetime.datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return ""
    s = max(0, int(now - t))
    return f" for {s // 60}m{s % 60:02d}s" if s >= 60 else f" for {s}s"


def _listing(items: Sequence[str]) -> str:
    more = len(items) - MAX_LISTED
    return ", ".join(items[:MAX_LISTED]) + (f" and {more} more" if more > 0 else "")


def verdict(
    spec: OmniServiceSpec | None,
    nodes: Sequence[tuple[str, _Pod | None]],
    now: float,
    policy: SourcePolicy | None = None,
) -> tuple[bool, str, str] | None:
    """The WeightsReady condition (ok, reason, message); None when spec.modelSource is unset
    (the condition is then absent: nothing tracks what the server fetches itself)."""
    if spec is None or spec.model_source is None or spec.backend is not Backend.VLLM_OMNI:
        return None
    source = spec.model_source
    policy = policy or SourcePolicy.from_env()
    what = describe(source, policy.image_volumes)
    if not nodes:
        return False, "NoMatchingNodes", f"no node to load the weights on ({what})"
    done, running, failed, waiting = [], [], [], []
    for name, pod in nodes:
        w = pod.weights if pod is not None else None
        if pod is None:
            waiting.append(f"{name} (no pod)")
        elif w is None or w.step == "pending":
            waiting.append(f"{name} ({w.detail})" if w is not None and w.detail else name)
        elif w.step == "done":
            done.append(name)
        elif w.step == "running":
            running.append(f"{name}{_seconds_since(w.started, now)}")
        else:
            failed.append(f"{name}: {w.detail or 'failed'}")
    n = len(nodes)
    head = f"{len(done)}/{n} nodes have the weights ({what})"
    if failed:
        return False, "WeightsFailed", f"{head}; failed: {_listing(failed)}"
    if len(done) == n:
        return True, "WeightsReady", head
    if running:
        verb = "downloading" if source.hugging_face is not None else "copying"
        reason = "WeightsDownloading" if source.hugging_face is not None else "WeightsCopying"
        return False, reason, f"{head}; {verb}: {_listing(running)}"
    return False, "WeightsPending", f"{head}; waiting: {_listing(waiting)}"


def _condition(status: Mapping[str, Any] | None) -> Mapping[str, Any]:
    for cond in (status or {}).get("conditions") or ():
        if isinstance(cond, Mapping) and cond.get("type") == "WeightsReady":
            return cond
    return {}


def weights_event(
    old: Mapping[str, Any] | None, new: Mapping[str, Any] | None
) -> tuple[str, str, str] | None:
    """(type, reason, message) of the Event to post when WeightsReady changed its reason
    between two statuses; None otherwise. A failure is a Warning, the rest Normal."""
    before, after = _condition(old), _condition(new)
    reason = after.get("reason")
    if not reason or reason == before.get("reason"):
        return None
    kind = "Warning" if reason == "WeightsFailed" else "Normal"
    return kind, str(reason), str(after.get("message") or "")[:1000]


def post_event(owner: Any, kind: str, reason: str, message: str) -> None:
    """Post an Event on the OmniService through kopf (outside a kopf context: only logged)."""
    import kopf

    ref = {
        "apiVersion": "horizonserve.io/v1alpha1",
        "kind": "OmniService",
        "metadata": {"name": owner.name, "namespace": owner.namespace, "uid": owner.uid},
    }
    try:
        kopf.event(ref, type=kind, reason=reason, message=message)
    except LookupError:  # no kopf settings in this context (unit tests)
        log.info("%s/%s %s %s: %s", owner.namespace, owner.name, kind, reason, message)


# --- the token Secret: it must carry the label that allows its use ---------------------------

PARTIAL_METADATA = "application/json;as=PartialObjectMetadata;g=meta.k8s.io;v=v1"


class _Kube(Protocol):
    async def request(
        self, method: str, path: str, body: Any = None, *, ok: tuple[int, ...] = (), accept: str
    ) -> tuple[int, Any]: ...


def token_secret(spec: OmniServiceSpec) -> str | None:
    source = spec.model_source
    ref = source.hugging_face.token_secret if source and source.hugging_face else None
    return ref.name if ref is not None else None


async def token_refusal(kube: _Kube, namespace: str, spec: OmniServiceSpec) -> str | None:
    """Why the huggingFace token Secret may not be used (field path first), or None.

    The same rule as spec.apiKeySecret's (`policy.py`): the Secret must exist and carry the
    allowing label, set by someone who may read it, so that creating an OmniService never
    hands a pod a Secret its author cannot read. Its metadata only is read, never its data."""
    name = token_secret(spec)
    if name is None:
        return None
    path = f"/api/v1/namespaces/{namespace}/secrets/{name}"
    status, body = await kube.request("GET", path, ok=(404,), accept=PARTIAL_METADATA)
    field = "spec.modelSource.huggingFace.tokenSecret.name"
    if status == 404:
        return f"{field}: Secret {name!r} does not exist in namespace {namespace!r}"
    if secret_labelled(((body or {}).get("metadata") or {}).get("labels")):
        return None
    return (
        f"{field}: Secret {name!r} does not carry the label {SECRET_LABEL}={SECRET_LABEL_VALUE}; "
        "whoever may read the Secret allows its use by an OmniService with "
        f"`kubectl label secret {name} {SECRET_LABEL}={SECRET_LABEL_VALUE}`"
    )
