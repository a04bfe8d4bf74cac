"""Kubernetes objects the operator owns, as plain functions returning dicts.

Why one owned pod per node and not a DaemonSet per OmniService:

* Which nodes qualify is decided by the operator, not by a label selector: a node is a GPU
  node when it *offers* `nvidia.com/gpu` (allocatable/capacity) or carries the GPU feature
  discovery label, and its blocking taints must be tolerated. A DaemonSet can only express
  labels/fields in node affinity, so it would place pods on GPU-less nodes that merely match
  the labels, where they would stay Pending forever.
* Calibration is per node. Each pod calibrates on its own GPU (init container) and keeps the
  artifact on that node; the sidecar publishes the node's summary on *its* pod. With owned
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
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from typing import Any

from horizonserve.operator import models
from horizonserve.operator.models import GPU_RESOURCE, Backend, OmniServiceSpec
from horizonserve.runtime.config import (
    ARTIFACT_DIR_ENV,
    CALIBRATION_MODE_ENV,
    METRICS_PORT_ENV,
    NODE_NAME_ENV,
    POD_NAME_ENV,
    POD_NAMESPACE_ENV,
    SERVING_CONFIG_ENV,
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
ANNOTATION_NODE = f"{models.GROUP}/node-name"  # the full node name (labels cap at 63)
COMPONENT_SERVING = "serving"
COMPONENT_RBAC = "node-rbac"
MANAGED_BY = "horizonserve-operator"

SERVING_PORT = 8000
METRICS_PORT = 9090
SIDECAR_UID = 65532
SERVING_UID = 65532  # the serving image's user (runtime/engine/vllm_omni/Dockerfile)
# Every container drops all capabilities and cannot escalate. The serving container and the
# sidecar run as the image's non-root user; only the calibration init container runs as root,
# because it writes the node's artifact hostPath, which the kubelet creates root-owned.
CONTAINER_SECURITY: dict[str, Any] = {
    "allowPrivilegeEscalation": False,
    "capabilities": {"drop": ["ALL"]},
    "privileged": False,
}
ARTIFACT_MOUNT = "/var/lib/horizonserve"
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


def node_account_name(osvc: str) -> str:
    """ServiceAccount, Role and RoleBinding of the sidecars: `<osvc>-node`."""
    return bounded_name(osvc, "node", limit=253)


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
    shaped = spec.model_dump(mode="json", exclude={"node_selector", "rollout"})
    payload = {"spec": shaped, "config": config.model_dump(mode="json"), "image": image}
    return _digest(json.dumps(payload, sort_keys=True, separators=(",", ":")), 10)


def _env(spec: OmniServiceSpec, config: ServingConfig, node: str) -> list[dict[str, Any]]:
    def field_ref(path: str) -> dict[str, Any]:
        return {"valueFrom": {"fieldRef": {"fieldPath": path}}}

    return [
        {"name": SERVING_CONFIG_ENV, "value": config.model_dump_json()},
        {"name": CALIBRATION_MODE_ENV, "value": spec.calibration.mode.value},
        {"name": ARTIFACT_DIR_ENV, "value": ARTIFACT_MOUNT},
        {"name": METRICS_PORT_ENV, "value": str(METRICS_PORT)},
        {"name": NODE_NAME_ENV, "value": node},
        {"name": POD_NAME_ENV, **field_ref("metadata.name")},
        {"name": POD_NAMESPACE_ENV, **field_ref("metadata.namespace")},
    ]


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
            "--host", "0.0.0.0", "--port", str(SERVING_PORT),
        ]  # fmt: skip
    return ["horizonserve", "serve", "--host", "0.0.0.0", "--port", str(SERVING_PORT)]


def _http_probe(path: str, port: str, period: int, failures: int) -> dict[str, Any]:
    return {
        "httpGet": {"path": path, "port": port},
        "periodSeconds": period,
        "timeoutSeconds": 5,
        "failureThreshold": failures,
    }


def serving_pod(
    owner: Owner,
    spec: OmniServiceSpec,
    config: ServingConfig,
    node: str,
    *,
    image: str,
    template_hash: str,
) -> dict[str, Any]:
    """The serving pod of one node: stage processes + sidecar, bound to `node`."""
    name = pod_name(owner.name, node)
    labels = {
        **selector_labels(owner.name),
        LABEL_NODE: label_value(node),
        LABEL_SPEC_HASH: template_hash,
    }
    env = _env(spec, config, node)
    mounts = [
        {"name": "dshm", "mountPath": "/dev/shm"},
        {"name": "artifacts", "mountPath": ARTIFACT_MOUNT},
    ]
    pull = {"imagePullPolicy": spec.image_pull_policy} if spec.image_pull_policy else {}
    serving = {
        "name": "serving",
        "image": image,
        **pull,
        "command": serving_command(spec, config),
        "env": env,
        "ports": [{"name": "http", "containerPort": SERVING_PORT, "protocol": "TCP"}],
        "resources": _gpu_resources(spec),
        "volumeMounts": mounts,
        # Model download + load can take many minutes; the startup probe holds the others off.
        "startupProbe": _http_probe("/health", "http", period=10, failures=180),
        "readinessProbe": _http_probe("/health", "http", period=10, failures=3),
        "livenessProbe": _http_probe("/health", "http", period=30, failures=4),
        "securityContext": {**CONTAINER_SECURITY, "runAsNonRoot": True, "runAsUser": SERVING_UID},
    }
    sidecar = {
        "name": "sidecar",
        "image": image,
        **pull,
        "command": ["horizonserve", "sidecar"],
        "env": env,
        "ports": [{"name": "metrics", "containerPort": METRICS_PORT, "protocol": "TCP"}],
        "resources": spec.sidecar.resources.model_dump(),
        "volumeMounts": mounts,
        "readinessProbe": _http_probe("/healthz", "metrics", period=10, failures=3),
        "livenessProbe": _http_probe("/healthz", "metrics", period=30, failures=4),
        # The sidecar only reads the artifact and talks HTTP: no GPU, no root, no writes.
        "securityContext": {
            **CONTAINER_SECURITY,
            "runAsNonRoot": True,
            "runAsUser": SIDECAR_UID,
            "readOnlyRootFilesystem": True,
        },
    }
    init: list[dict[str, Any]] = []
    if spec.calibration.mode is not CalibrationMode.SKIP:
        # Calibration needs the GPU alone (solo latencies, fixed-SM sweeps), so it runs before
        # the stages start, in an init container holding the pod's one GPU; with mode `auto`
        # it returns at once when the node already has an artifact for model + GPU + driver.
        init.append({
            "name": "calibrate",
            "image": image,
            **pull,
            # --mode and --out-dir also come from the env; explicit here for `kubectl describe`.
            "command": [
                "horizonserve", "calibrate", "--pipeline", config.pipeline,
                "--mode", spec.calibration.mode.value, "--out-dir", ARTIFACT_MOUNT,
            ],
            "env": env,
            "resources": _gpu_resources(spec),
            "volumeMounts": mounts,
            "securityContext": {**CONTAINER_SECURITY, "runAsUser": 0},
        })  # fmt: skip
    artifacts: dict[str, Any] = (
        {"hostPath": {"path": spec.calibration.host_path, "type": "DirectoryOrCreate"}}
        if spec.calibration.persistent
        else {"emptyDir": {}}
    )
    pod_spec: dict[str, Any] = {
        "securityContext": {"seccompProfile": {"type": "RuntimeDefault"}},
        "serviceAccountName": node_account_name(owner.name),
        "automountServiceAccountToken": True,
        "enableServiceLinks": False,
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
        "tolerations": [t.model_dump(exclude_none=True) for t in spec.tolerations]
        + _lifecycle_tolerations(),
        "initContainers": init,
        "containers": [serving, sidecar],
        "volumes": [
            {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": spec.shm_size}},
            {"name": "artifacts", **artifacts},
        ],
    }
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


def _lifecycle_tolerations() -> list[dict[str, Any]]:
    # Like DaemonSet pods: an edge node that loses its network for a while keeps serving
    # local clients; the pod is not evicted and rescheduled elsewhere (it cannot be).
    return [
        {"key": "node.kubernetes.io/not-ready", "operator": "Exists", "effect": "NoExecute"},
        {"key": "node.kubernetes.io/unreachable", "operator": "Exists", "effect": "NoExecute"},
    ]


# --- RBAC of the sidecars: publish the node summary on their own pods ---------------------


def _rbac_labels(owner: Owner) -> dict[str, str]:
    return {
        LABEL_NAME: APP,
        LABEL_COMPONENT: COMPONENT_RBAC,
        LABEL_INSTANCE: label_value(owner.name),
        LABEL_OSVC: label_value(owner.name),
    }


def node_service_account(owner: Owner) -> dict[str, Any]:
    name = node_account_name(owner.name)
    return {
        "apiVersion": "v1",
        "kind": "ServiceAccount",
        "metadata": _metadata(owner, name, _rbac_labels(owner)),
    }


def node_role_rules(pod_names: list[str]) -> list[dict[str, Any]]:
    """`get, patch` on exactly the OmniService's serving pods.

    An empty `resourceNames` would mean *every* pod, so no pods means no rule at all.
    """
    if not pod_names:
        return []
    return [
        {
            "apiGroups": [""],
            "resources": ["pods"],
            "verbs": ["get", "patch"],
            "resourceNames": sorted(pod_names),
        }
    ]


def node_role(owner: Owner, pod_names: list[str]) -> dict[str, Any]:
    name = node_account_name(owner.name)
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "Role",
        "metadata": _metadata(owner, name, _rbac_labels(owner)),
        "rules": node_role_rules(pod_names),
    }


def node_role_binding(owner: Owner) -> dict[str, Any]:
    name = node_account_name(owner.name)
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "RoleBinding",
        "metadata": _metadata(owner, name, _rbac_labels(owner)),
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name},
        "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": owner.namespace}],
    }
