"""Kubernetes objects the operator owns, as plain functions returning dicts.

Why one owned pod per node and not a DaemonSet per OmniService:

* Which nodes qualify is decided by the operator, not by a label selector: a node is a GPU
  node when it *offers* `nvidia.com/gpu` (allocatable/capacity) or carries the GPU feature
  discovery label, and its blocking taints must be tolerated. A DaemonSet can only express
  labels/fields in node affinity, so it would place pods on GPU-less nodes that merely match
  the labels, where they would stay Pending forever.
* Calibration is per node. Each pod calibrates on its own GPU (init container); the sidecar
  keeps the artifact in the node's ConfigMap and publishes the node's summary there. With owned
  pods the operator maps pod ↔ node ↔ summary directly and reports per-node state, replaces
  exactly the pods whose template changed, never restarts a node that is mid-calibration for
  an unrelated node's change, and can give a node a different template later (e.g. a ladder
  pinned from that node's artifact) without a second DaemonSet.
* Rollout: a DaemonSet's rolling update counts availability across the set, but one pod per
  GPU node cannot surge (one GPU), and a pod that never became ready (bad image, long
  calibration) must not block the fix. The plan in `reconcile.py` replaces not-ready pods at
  once and ready ones `maxUnavailable` at a time.

The pods are bound with required node affinity on `metadata.name` (what the DaemonSet
controller itself does since 1.12) rather than `spec.nodeName`, so the scheduler still
accounts the GPU and other resources, preemption works, and a pod whose node vanished is not
stuck Terminating without a kubelet.

Trust (what a compromised serving pod can reach):

* No host path, no root: every container runs as the image's non-root user with no
  capabilities and no privilege escalation; the volumes are emptyDirs, the node's ConfigMap
  (read-only) and a projected token; the pod passes Pod Security Standards "restricted".
* Calibration artifacts live in the Kubernetes API: one ConfigMap per node × model × GPU ×
  driver (`node_state_name`; the GPU and driver come from GPU feature discovery labels when the
  node has them). The init container starts from it (mounted read-only, copied into an
  emptyDir), the sidecar uploads a new artifact into it and publishes the node summary there.
* Only the sidecar holds an API token (a projected, expiring one); the serving and calibration
  containers have none. The token belongs to one ServiceAccount per OmniService (shared by its
  pods: a per-node identity cost three API writes per node), whose Role allows `patch` on the
  node ConfigMaps of that OmniService and nothing else: not a pod, not another ConfigMap.
* A node speaks only for itself: a node's ConfigMap is named from the OmniService's uid, the
  node's uid and the calibration key (`node_state_name`), and the operator maps a ConfigMap
  to its node by that name alone, never by a label or annotation (which the sidecar's `patch`
  could change); a summary whose `node` is not that node is ignored. The shared Role would
  still let a sidecar write a sibling's ConfigMap (its names are visible to it through a
  SelfSubjectRulesReview): on 1.30+ the chart's node-state admission policy refuses that by
  the node bound into the pod's token (docs/operator.md).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import shlex
from collections.abc import Mapping
from typing import Any

from horizonserve.operator import model_source, models
from horizonserve.operator.models import GPU_RESOURCE, Backend, OmniServiceSpec
from horizonserve.runtime.config import (
    ARTIFACT_DIR_ENV,
    CALIBRATION_MODE_ENV,
    METRICS_PORT_ENV,
    NODE_NAME_ENV,
    POD_NAME_ENV,
    POD_NAMESPACE_ENV,
    SERVING_CONFIG_ENV,
    SUMMARY_CONFIGMAP_ENV,
    CalibrationMode,
    ServingConfig,
)

APP = "horizonserve"
LABEL_NAME = "app.kubernetes.io/name"
LABEL_COMPONENT = "app.kubernetes.io/component"
LABEL_INSTANCE = "app.kubernetes.io/instance"
LABEL_MANAGED_BY = "app.kubernetes.io/managed-by"
LABEL_OSVC = f"{models.GROUP}/omniservice"
LABEL_NODE = f"{models.GROUP}/node"
LABEL_SPEC_HASH = f"{models.GROUP}/spec-hash"
LABEL_CALIBRATION_KEY = f"{models.GROUP}/calibration-key"
ANNOTATION_NODE = f"{models.GROUP}/node-name"  # the full node name (labels cap at 63)
ANNOTATION_CALIBRATION = f"{models.GROUP}/calibration-for"  # model, GPU, driver in words
COMPONENT_SERVING = "serving"
COMPONENT_NODE_STATE = "node-state"
COMPONENT_RBAC = "sidecar-rbac"
COMPONENT_ENDPOINT = "endpoint"
MANAGED_BY = "horizonserve-operator"

SERVING_PORT = 8000
METRICS_PORT = 9090
RUN_AS_UID = 65532  # the serving image's user (runtime/engine/vllm_omni/Dockerfile)
SIDECAR_UID = SERVING_UID = RUN_AS_UID
# Every container: non-root, no capabilities, no privilege escalation (PSS "restricted").
CONTAINER_SECURITY: dict[str, Any] = {
    "allowPrivilegeEscalation": False,
    "capabilities": {"drop": ["ALL"]},
    "privileged": False,
    "runAsNonRoot": True,
    "runAsUser": RUN_AS_UID,
}
ARTIFACT_MOUNT = "/var/lib/horizonserve/calibration"  # emptyDir: the artifacts of this pod
STORED_MOUNT = "/var/lib/horizonserve/stored"  # the node's ConfigMap, read-only
TOKEN_MOUNT = "/var/run/secrets/kubernetes.io/serviceaccount"  # where client libraries look
TOKEN_EXPIRATION_S = 3600  # the kubelet refreshes the projected token before it expires
# GPU feature discovery labels that key the calibration (GPU model and driver), if present.
GFD_LABELS = (
    "nvidia.com/gpu.product",
    "nvidia.com/gpu.memory",
    "nvidia.com/cuda.driver.major",
    "nvidia.com/cuda.driver.minor",
    "nvidia.com/cuda.driver.rev",
    "nvidia.com/cuda.driver-version.full",
)
API_KEY_ENV = "HORIZONSERVE_API_KEY"
VLLM_API_KEY_ENV = "VLLM_API_KEY"  # what `vllm serve --api-key` reads from the environment
MAX_NAME = 63  # pod names are also hostnames: keep them DNS labels
TERMINATION_GRACE_S = 60


@dataclasses.dataclass(frozen=True)
class Owner:
    """The OmniService that owns the children."""

    name: str
    namespace: str
    uid: str

    @classmethod
    def from_body(cls, body: Any) -> Owner:
        meta = body["metadata"]
        return cls(name=meta["name"], namespace=meta["namespace"], uid=meta["uid"])


def _digest(text: str, n: int = 8) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:n]


def bounded_name(*parts: str, limit: int = MAX_NAME) -> str:
    """`a-b`, or when longer than `limit` a truncated prefix plus a hash of the whole."""
    name = "-".join(parts).lower()
    if len(name) <= limit:
        return name
    suffix = _digest(name)
    return f"{name[: limit - len(suffix) - 1].rstrip('-.')}-{suffix}"


def label_value(value: str) -> str:
    """A label value (≤ 63 characters, alphanumeric at both ends)."""
    return bounded_name(value) if len(value) > MAX_NAME else value


def pod_name(osvc: str, node: str) -> str:
    return bounded_name(osvc, node)


def calibration_key(model: str, labels: Mapping[str, str]) -> str:
    """8 hex digits naming model × GPU × driver (from GPU feature discovery labels, if any).

    A node without the labels keys on the model alone; the artifact itself records GPU and
    driver, and calibration (mode auto) measures again when they do not match.
    """
    parts = [model, *(f"{k}={labels[k]}" for k in GFD_LABELS if labels.get(k))]
    return _digest("\n".join(parts))


def calibration_for(model: str, labels: Mapping[str, str]) -> str:
    gpu = labels.get("nvidia.com/gpu.product", "GPU from NVML at start")
    driver = labels.get("nvidia.com/cuda.driver-version.full") or ".".join(
        labels[k] for k in GFD_LABELS[2:5] if labels.get(k)
    )
    return f"model {model}; GPU {gpu}; driver {driver or 'from NVML at start'}"


def node_state_name(owner: Owner, node: str, node_uid: str, key: str) -> str:
    """The node's ConfigMap: bound to the node object (its uid) and the calibration key.

    A node deleted and re-created is a new node (new uid): it calibrates again. A drain or a
    reboot keeps the uid.
    """
    bound = _digest(f"{owner.uid}/{node}/{node_uid}/{key}", 12)
    return bounded_name(owner.name, node, bound, limit=253)


def sidecar_identity_name(osvc: str) -> str:
    """The ServiceAccount, Role and RoleBinding shared by an OmniService's sidecars. Always
    ends in `-sidecar` (the chart's node-state admission policy matches on it): an OmniService
    name is at most 63 characters, the limit here is 253."""
    return bounded_name(osvc, "sidecar", limit=253)


def selector_labels(osvc: str) -> dict[str, str]:
    """Labels that select every serving pod of one OmniService."""
    return {
        LABEL_NAME: APP,
        LABEL_COMPONENT: COMPONENT_SERVING,
        LABEL_INSTANCE: label_value(osvc),
        LABEL_OSVC: label_value(osvc),
    }


def owner_reference(owner: Owner) -> dict[str, Any]:
    # blockOwnerDeletion stays false: setting it true needs `update` on omniservices/finalizers
    # wherever the OwnerReferencesPermissionEnforcement admission plugin is on, and the
    # garbage collector removes the children after the OmniService either way.
    return {
        "apiVersion": models.API_VERSION,
        "kind": models.KIND,
        "name": owner.name,
        "uid": owner.uid,
        "controller": True,
        "blockOwnerDeletion": False,
    }


def _metadata(owner: Owner, name: str, labels: dict[str, str]) -> dict[str, Any]:
    return {
        "name": name,
        "namespace": owner.namespace,
        "labels": {**labels, LABEL_MANAGED_BY: MANAGED_BY},
        "ownerReferences": [owner_reference(owner)],
    }


def spec_hash(spec: OmniServiceSpec, config: ServingConfig, image: str) -> str:
    """Hash of everything that shapes a serving pod; a change rolls the pods.

    The node selector and rollout settings choose *where* and *how fast*, not *what*: they
    are left out so that changing them does not restart healthy pods.
    """
    shaped = spec.model_dump(
        mode="json", exclude={"node_selector", "all_gpu_nodes", "rollout", "service"}
    )
    payload = {"spec": shaped, "config": config.model_dump(mode="json"), "image": image}
    return _digest(json.dumps(payload, sort_keys=True, separators=(",", ":")), 10)


def _env(
    spec: OmniServiceSpec, config: ServingConfig, node: str, state: str
) -> list[dict[str, Any]]:
    def field_ref(path: str) -> dict[str, Any]:
        return {"valueFrom": {"fieldRef": {"apiVersion": "v1", "fieldPath": path}}}

    return [
        {"name": SERVING_CONFIG_ENV, "value": config.model_dump_json()},
        {"name": CALIBRATION_MODE_ENV, "value": spec.calibration.mode.value},
        {"name": ARTIFACT_DIR_ENV, "value": ARTIFACT_MOUNT},
        {"name": METRICS_PORT_ENV, "value": str(METRICS_PORT)},
        {"name": NODE_NAME_ENV, "value": node},
        {"name": SUMMARY_CONFIGMAP_ENV, "value": state},
        {"name": POD_NAME_ENV, **field_ref("metadata.name")},
        {"name": POD_NAMESPACE_ENV, **field_ref("metadata.namespace")},
    ]


def _api_key_env(spec: OmniServiceSpec) -> list[dict[str, Any]]:
    ref = spec.api_key_secret
    if ref is None:
        return []
    source = {"valueFrom": {"secretKeyRef": {"name": ref.name, "key": ref.key}}}
    names = [API_KEY_ENV] + ([VLLM_API_KEY_ENV] if spec.backend is Backend.VLLM_OMNI else [])
    return [{"name": n, **source} for n in names]


def _gpu_resources(spec: OmniServiceSpec) -> dict[str, Any]:
    requests = {**spec.resources.requests, GPU_RESOURCE: 1}
    limits = {**spec.resources.limits, GPU_RESOURCE: 1}
    return {"requests": requests, "limits": limits}


def serving_command(spec: OmniServiceSpec, config: ServingConfig) -> list[str]:
    if spec.backend is Backend.VLLM_OMNI:
        # vLLM-Omni's server; the HorizonServe plugin (a vLLM general plugin) reads the
        # ServingConfig from the environment and wraps the stage schedulers.
        return [
            "vllm", "serve", config.model, "--omni",
            "--host", SERVING_HOST, "--port", str(SERVING_PORT),
        ]  # fmt: skip
    return ["horizonserve", "serve", "--host", SERVING_HOST, "--port", str(SERVING_PORT)]


# The serving process binds every interface of the pod's network namespace, explicitly (its
# own default is loopback only); the chart's NetworkPolicy limits who may connect.
SERVING_HOST = "0.0.0.0"
# The serving image is vLLM's CUDA image: `python3` (there may be no `python`).
# Probe paths per backend: vLLM's server answers /health only; the reference server answers
# /health (liveness: heartbeat-based) and /ready (200 while it serves).
PROBES = {
    Backend.VLLM_OMNI: {"live": "/health", "ready": "/health"},
    Backend.REFERENCE: {"live": "/health", "ready": "/ready"},
}


def _http_probe(path: str, port: str, period: int, failures: int) -> dict[str, Any]:
    return {
        "httpGet": {"path": path, "port": port, "scheme": "HTTP"},
        "periodSeconds": period,
        "timeoutSeconds": 5,
        "failureThreshold": failures,
        "successThreshold": 1,
    }


def _token_volume() -> dict[str, Any]:
    """What the kubelet would automount, as an explicit volume for the sidecar alone."""
    return {
        "name": "sidecar-token",
        "projected": {
            "defaultMode": 0o444,
            "sources": [
                {
                    "serviceAccountToken": {
                        "path": "token",
                        "expirationSeconds": TOKEN_EXPIRATION_S,
                    }
                },
                {"configMap": {"name": "kube-root-ca.crt", "items": [
                    {"key": "ca.crt", "path": "ca.crt"}]}},
                {"downwardAPI": {"items": [{"path": "namespace", "fieldRef": {
                    "apiVersion": "v1", "fieldPath": "metadata.namespace"}}]}},
            ],
        },
    }  # fmt: skip


def serving_pod(
    owner: Owner,
    spec: OmniServiceSpec,
    config: ServingConfig,
    node: str,
    *,
    image: str,
    template_hash: str,
    node_labels: Mapping[str, str] | None = None,
    node_uid: str = "",
) -> dict[str, Any]:
    """The serving pod of one node: stage processes + sidecar, bound to `node`.

    `template_hash` labels the pod; pass `node_hash(...)` of the spec hash and the node's
    calibration key, so that a node whose GPU or driver changed is rolled (and recalibrates).
    """
    name = pod_name(owner.name, node)
    key = calibration_key(config.model, node_labels or {})
    state = node_state_name(owner, node, node_uid, key)
    labels = {
        **selector_labels(owner.name),
        LABEL_NODE: label_value(node),
        LABEL_SPEC_HASH: template_hash,
        LABEL_CALIBRATION_KEY: key,
    }
    env = _env(spec, config, node, state)
    shm = {"name": "dshm", "mountPath": "/dev/shm"}
    artifacts = {"name": "artifacts", "mountPath": ARTIFACT_MOUNT}
    stored = {"name": "stored", "mountPath": STORED_MOUNT, "readOnly": True}
    token = {"name": "sidecar-token", "mountPath": TOKEN_MOUNT, "readOnly": True}
    pull = {"imagePullPolicy": spec.image_pull_policy} if spec.image_pull_policy else {}
    probes = PROBES[spec.backend]
    serving = {
        "name": "serving",
        "image": image,
        **pull,
        "command": serving_command(spec, config),
        "env": env + _api_key_env(spec),
        "ports": [{"name": "http", "containerPort": SERVING_PORT, "protocol": "TCP"}],
        "resources": _gpu_resources(spec),
        "volumeMounts": [shm, {**artifacts, "readOnly": True}],
        # Model download + load can take many minutes; the startup probe holds the others off.
        "startupProbe": _http_probe(probes["live"], "http", period=10, failures=180),
        "readinessProbe": _http_probe(probes["ready"], "http", period=10, failures=3),
        "livenessProbe": _http_probe(probes["live"], "http", period=30, failures=4),
        "securityContext": dict(CONTAINER_SECURITY),
    }
    sidecar = {
        "name": "sidecar",
        "image": image,
        **pull,
        # The node agent uploads a new calibration artifact into the node's ConfigMap, then
        # becomes `horizonserve sidecar` (metrics, summary into the same ConfigMap).
        "command": [
            "python3",
            "-m",
            "horizonserve.operator.nodeagent",
            "upload",
            "--from",
            ARTIFACT_MOUNT,
            "--configmap",
            state,
            "--",
            "horizonserve",
            "sidecar",
            "--host",
            SERVING_HOST,
        ],
        "env": env,
        "ports": [{"name": "metrics", "containerPort": METRICS_PORT, "protocol": "TCP"}],
        "resources": spec.sidecar.resources.model_dump(),
        # The sidecar only reads the artifacts (the upload goes through the API).
        "volumeMounts": [shm, {**artifacts, "readOnly": True}, token],
        "readinessProbe": _http_probe("/healthz", "metrics", period=10, failures=3),
        "livenessProbe": _http_probe("/healthz", "metrics", period=30, failures=4),
        "securityContext": {**CONTAINER_SECURITY, "readOnlyRootFilesystem": True},
    }
    init: list[dict[str, Any]] = []
    if spec.calibration.mode is not CalibrationMode.SKIP:
        # Calibration needs the GPU alone (solo latencies, fixed-SM sweeps), so it runs before
        # the stages start, in an init container holding the pod's one GPU. It starts from the
        # node's stored artifacts (copied out of the read-only ConfigMap); with mode `auto`
        # it returns at once when one fits model + GPU + driver. No API token.
        init.append({
            "name": "calibrate",
            "image": image,
            **pull,
            "command": [
                "python3", "-m", "horizonserve.operator.nodeagent", "restore",
                "--from", STORED_MOUNT, "--to", ARTIFACT_MOUNT, "--",
                "horizonserve", "calibrate", "--pipeline", config.pipeline,
                "--mode", spec.calibration.mode.value, "--out-dir", ARTIFACT_MOUNT,
            ],
            "env": env,
            "resources": _gpu_resources(spec),
            "volumeMounts": [shm, artifacts, stored],
            "securityContext": dict(CONTAINER_SECURITY),
        })  # fmt: skip
    pod_spec: dict[str, Any] = {
        "securityContext": {
            "runAsNonRoot": True,
            "runAsUser": RUN_AS_UID,
            "runAsGroup": RUN_AS_UID,
            "fsGroup": RUN_AS_UID,
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        "serviceAccountName": sidecar_identity_name(owner.name),
        # No token in the serving and calibration containers: the sidecar alone mounts one.
        "automountServiceAccountToken": False,
        "enableServiceLinks": False,
        "hostNetwork": False,
        "hostPID": False,
        "hostIPC": False,
        "restartPolicy": "Always",
        "terminationGracePeriodSeconds": TERMINATION_GRACE_S,
        "affinity": {
            "nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {
                    "nodeSelectorTerms": [
                        {
                            "matchFields": [
                                {"key": "metadata.name", "operator": "In", "values": [node]}
                            ]
                        }
                    ]
                }
            }
        },
        # by_alias: the wire names (tolerationSeconds), which the API server knows.
        "tolerations": [t.model_dump(exclude_none=True, by_alias=True) for t in spec.tolerations]
        + _lifecycle_tolerations(),
        "initContainers": init,
        "containers": [serving, sidecar],
        "volumes": [
            {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": spec.shm_size}},
            {"name": "artifacts", "emptyDir": {"sizeLimit": "64Mi"}},
            {
                "name": "stored",
                "configMap": {"name": state, "optional": True, "defaultMode": 0o444},
            },
            _token_volume(),
        ],
    }
    # Weights (spec.modelSource) and engine flags (spec.engineArgs): volumes, mounts, env,
    # the `weights` init container; a spec without them is left as it was.
    model_source.apply(pod_spec, spec, config, image=image, security=CONTAINER_SECURITY)
    calibrate = next((c for c in init if c["name"] == "calibrate"), None)
    if calibrate is not None and spec.backend is Backend.VLLM_OMNI:
        _calibrate_served_engine(calibrate, serving)
    if spec.runtime_class_name:
        pod_spec["runtimeClassName"] = spec.runtime_class_name
    if spec.priority_class_name:
        pod_spec["priorityClassName"] = spec.priority_class_name
    if not init:
        del pod_spec["initContainers"]
    metadata = _metadata(owner, name, labels)
    metadata["annotations"] = {
        ANNOTATION_NODE: node,
        "kubectl.kubernetes.io/default-container": "serving",
        "prometheus.io/scrape": "true",
        "prometheus.io/port": str(METRICS_PORT),
    }
    return {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": pod_spec}


def _calibrate_served_engine(calibrate: dict[str, Any], serving: dict[str, Any]) -> None:
    """A vLLM-Omni service's calibration container: after the reference calibration (ladder,
    B_sat, stage costs), `horizonserve calibrate --backend vllm-omni` on the engine the serving
    container runs: its model and its flags (weights source, spec.engineArgs) exactly as the
    serving command has them, its weights mount and offline settings; it measures the solo p95
    table and the shared stage's per-token decode time and writes beside the reference
    artifact, where the plugin finds it (the newest for model + GPU + driver). One container
    (`sh -c A && exec B`): the pod shows one calibration step. In place."""
    served = serving["command"]
    # serving_command + model_source.apply: vllm serve MODEL --omni --host H --port P FLAGS...
    head = ["--omni", "--host", SERVING_HOST, "--port", str(SERVING_PORT)]
    assert served[:2] == ["vllm", "serve"] and served[3:8] == head, served
    command = calibrate["command"]
    cut = command.index("--") + 1  # nodeagent restore ... -- <the reference calibration>
    reference = command[cut:]
    mode, out_dir = reference[reference.index("--mode") + 1], reference[-1]
    engine = [
        "horizonserve", "calibrate", "--backend", "vllm-omni",
        "--pipeline", reference[reference.index("--pipeline") + 1],
        "--mode", mode, "--out-dir", out_dir, "--model", served[2],
    ]  # fmt: skip
    if served[8:]:
        engine.append("--serve-args=" + shlex.join(served[8:]))
    script = f"{shlex.join(reference)} && exec {shlex.join(engine)}"
    calibrate["command"] = [*command[:cut], "sh", "-c", script]
    # The weights as the serving container reads them; no API key (the calibration's server
    # listens on loopback only).
    secret = {API_KEY_ENV, VLLM_API_KEY_ENV}
    have = {e["name"] for e in calibrate["env"]}
    calibrate["env"] = calibrate["env"] + [
        e for e in serving.get("env", ()) if e["name"] not in have | secret
    ]
    mounted = {m["name"] for m in calibrate["volumeMounts"]}
    calibrate["volumeMounts"] = calibrate["volumeMounts"] + [
        m for m in serving.get("volumeMounts", ()) if m["name"] not in mounted
    ]


def node_hash(template_hash: str, key: str) -> str:
    """The pod's spec-hash label: the OmniService's template and the node's calibration key."""
    return _digest(f"{template_hash}/{key}", 10)


def _lifecycle_tolerations() -> list[dict[str, Any]]:
    # Like DaemonSet pods: an edge node that loses its network for a while keeps serving
    # local clients; the pod is not evicted and rescheduled elsewhere (it cannot be).
    return [
        {"key": "node.kubernetes.io/not-ready", "operator": "Exists", "effect": "NoExecute"},
        {"key": "node.kubernetes.io/unreachable", "operator": "Exists", "effect": "NoExecute"},
    ]


# --- per-node objects: the node's ConfigMap; the sidecars' shared identity ----------------


def _node_labels(owner: Owner, node: str, key: str, component: str) -> dict[str, str]:
    return {
        LABEL_NAME: APP,
        LABEL_COMPONENT: component,
        LABEL_INSTANCE: label_value(owner.name),
        LABEL_OSVC: label_value(owner.name),
        LABEL_NODE: label_value(node),
        LABEL_CALIBRATION_KEY: key,
    }


def node_state(owner: Owner, node: str, node_uid: str, key: str, described: str) -> dict[str, Any]:
    """The node's ConfigMap: calibration artifacts and the summary, written by its sidecar.

    Created empty by the operator (RBAC cannot limit `create` to one name, so the sidecar
    never creates); owned by the OmniService, so it outlives pod replacements and drains (it
    lives while the node exists and matches, plus a grace period) and goes with the
    OmniService. Its labels and annotations are for people: the operator binds it to its
    node by name (`node_state_name`).
    """
    name = node_state_name(owner, node, node_uid, key)
    meta = _metadata(owner, name, _node_labels(owner, node, key, COMPONENT_NODE_STATE))
    meta["annotations"] = {ANNOTATION_NODE: node, ANNOTATION_CALIBRATION: described}
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": meta, "data": {}}


def sidecar_role_rules(configmaps: list[str]) -> list[dict[str, Any]]:
    """`patch` on exactly the OmniService's node ConfigMaps (summary and artifact).

    Never an empty `resourceNames`: that would mean every ConfigMap of the namespace. With no
    node ConfigMap the Role has no rule at all.
    """
    names = sorted(set(configmaps))
    if not names:
        return []
    return [
        {
            "apiGroups": [""],
            "resources": ["configmaps"],
            "verbs": ["patch"],
            "resourceNames": names,
        }
    ]


def _identity_metadata(owner: Owner) -> dict[str, Any]:
    labels = {
        LABEL_NAME: APP,
        LABEL_COMPONENT: COMPONENT_RBAC,
        LABEL_INSTANCE: label_value(owner.name),
        LABEL_OSVC: label_value(owner.name),
    }
    return _metadata(owner, sidecar_identity_name(owner.name), labels)


def sidecar_service_account(owner: Owner) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "ServiceAccount",
        "metadata": _identity_metadata(owner),
        # Only the projected volume of the sidecar carries a token (see serving_pod).
        "automountServiceAccountToken": False,
    }


def sidecar_role(owner: Owner, configmaps: list[str]) -> dict[str, Any]:
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "Role",
        "metadata": _identity_metadata(owner),
        "rules": sidecar_role_rules(configmaps),
    }


def sidecar_role_binding(owner: Owner) -> dict[str, Any]:
    name = sidecar_identity_name(owner.name)
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "RoleBinding",
        "metadata": _identity_metadata(owner),
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name},
        "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": owner.namespace}],
    }


# --- the endpoint --------------------------------------------------------------------------


def service_name(osvc: str) -> str:
    return bounded_name(osvc)


def endpoint(owner: Owner) -> str:
    return f"http://{service_name(owner.name)}.{owner.namespace}.svc:{SERVING_PORT}"


def service(owner: Owner, spec: OmniServiceSpec) -> dict[str, Any]:
    """A ClusterIP Service in front of the OmniService's Ready serving pods (the endpoints
    controller lists only Ready pods). `internalTrafficPolicy: Local` keeps a client on a GPU
    node on that node's pod."""
    labels = {**selector_labels(owner.name), LABEL_COMPONENT: COMPONENT_ENDPOINT}
    body: dict[str, Any] = {
        "type": "ClusterIP",
        "selector": selector_labels(owner.name),
        "ports": [{"name": "http", "port": SERVING_PORT, "targetPort": "http", "protocol": "TCP"}],
    }
    if spec.service.internal_traffic_policy == "Local":
        body["internalTrafficPolicy"] = "Local"
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": _metadata(owner, service_name(owner.name), labels),
        "spec": body,
    }


# --- drift: what a pod may not differ in from what the operator built ----------------------


def _env_view(env: list[dict[str, Any]] | None) -> list[Any]:
    out = []
    for item in env or ():
        ref = item.get("valueFrom") or {}
        field = (ref.get("fieldRef") or {}).get("fieldPath")
        secret = ref.get("secretKeyRef") or {}
        out.append(
            [item.get("name"), item.get("value"), field, secret.get("name"), secret.get("key")]
        )
    return out


def _container_view(c: Mapping[str, Any]) -> dict[str, Any]:
    mounts = [
        [m.get("name"), m.get("mountPath"), bool(m.get("readOnly"))]
        for m in c.get("volumeMounts") or ()
    ]
    return {
        "image": c.get("image"),
        "command": c.get("command"),
        "args": c.get("args"),
        "env": _env_view(c.get("env")),
        "envFrom": c.get("envFrom"),
        "securityContext": c.get("securityContext") or {},
        "mounts": sorted(mounts),
    }


def trust_view(pod_spec: Mapping[str, Any]) -> str:
    """The parts of a pod spec that decide what it runs and what it may reach, as canonical
    JSON: containers and volumes by name (images, commands, env, security contexts, mounts,
    volume kinds), identity and token, host namespaces, ephemeral containers, the deadline.

    Computed alike on the pod the operator builds and on the pod the API server returns, from
    fields that defaulting leaves alone. Images and activeDeadlineSeconds are what can change
    in a pod after creation (and ephemeral containers be added); the rest guards against a pod
    made under this name by someone else. No label is trusted for this.
    """
    containers = {
        c.get("name", ""): _container_view(c)
        for key in ("initContainers", "containers")
        for c in pod_spec.get(key) or ()
    }
    volumes = {
        v.get("name", ""): [
            sorted(k for k in v if k != "name"),
            (v.get("hostPath") or {}).get("path"),
        ]
        for v in pod_spec.get("volumes") or ()
    }
    view = {
        "containers": containers,
        "volumes": volumes,
        "ephemeral": bool(pod_spec.get("ephemeralContainers")),
        "serviceAccountName": pod_spec.get("serviceAccountName"),
        "automount": pod_spec.get("automountServiceAccountToken"),
        "host": [bool(pod_spec.get(k)) for k in ("hostNetwork", "hostPID", "hostIPC")],
        "securityContext": pod_spec.get("securityContext") or {},
        "activeDeadlineSeconds": pod_spec.get("activeDeadlineSeconds"),
        "runtimeClassName": pod_spec.get("runtimeClassName"),
    }
    return json.dumps(view, sort_keys=True, separators=(",", ":"))


def _within(live: Mapping[str, Any], built: Mapping[str, Any]) -> dict[str, Any]:
    """`live` cut to the keys `built` sets (what admission adds elsewhere is not drift)."""
    return {k: live.get(k) for k in built}


def drifted(live_view: str, built_view: str) -> bool:
    """Whether a live pod differs from what the operator built, in what the operator set.

    Containers and volumes the cluster's admission added (a mesh sidecar, a CA bundle) and
    security-context keys a platform fills in (OpenShift's SELinux options) are not drift:
    they came at creation, by the cluster's own policy, and would make every rebuilt pod
    "drifted" again. A changed image, command, env or mount of a container the operator built,
    a missing container or volume, an added hostPath, an ephemeral container, another identity
    or token, host namespaces: drift.
    """
    live, built = json.loads(live_view), json.loads(built_view)
    if live["ephemeral"] or any(v[1] for v in live["volumes"].values()):  # hostPath
        return True
    for name, want in built["containers"].items():
        have = live["containers"].get(name)
        if have is None:
            return True
        sc = _within(have["securityContext"], want["securityContext"])
        if {**have, "securityContext": sc} != want:
            return True
    if any(live["volumes"].get(n) != v for n, v in built["volumes"].items()):
        return True
    rest = ("serviceAccountName", "automount", "host", "activeDeadlineSeconds", "runtimeClassName")
    if any(live[k] != built[k] for k in rest):
        return True
    return _within(live["securityContext"], built["securityContext"]) != built["securityContext"]
