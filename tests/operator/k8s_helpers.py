"""Helpers for the real-API-server operator tests (and the scale benchmark).

The control plane has no kubelet and no scheduler: the tests create Node objects themselves
and play the kubelet (pod status) and the sidecar (summary annotation) where they need to.
"""

from __future__ import annotations

import base64
import contextlib
import json
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any, TypeVar

from horizonserve.operator import crd
from horizonserve.operator.builders import LABEL_COMPONENT, LABEL_OSVC
from horizonserve.operator.models import GROUP, PLURAL
from tests.k8s.cluster import wait_for

T = TypeVar("T")
ROOT = Path(__file__).resolve().parents[2]
OSVC_PATH = "/apis/horizonserve.io/v1alpha1/namespaces/{ns}/omniservices"
CRD_NAME = f"{PLURAL}.{GROUP}"
CRD_PATH = f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{CRD_NAME}"


def install_crd(cluster: Any) -> None:
    """Apply the shipped CRD and wait until it serves. A CRD an earlier module is still
    deleting (its objects are being removed) is waited out first: applying it while it
    terminates is a no-op and the delete then completes under the new test."""

    def not_terminating() -> bool:
        status, body = cluster.request("GET", CRD_PATH)
        return status == 404 or not body.get("metadata", {}).get("deletionTimestamp")

    wait_for("the OmniService CRD's earlier delete to finish", not_terminating, 180)
    cluster.kubectl("apply", "-f", str(crd.default_path()))
    cluster.wait_crd_established(CRD_NAME)


def new_namespace(cluster: Any, prefix: str = "hs") -> str:
    name = f"{prefix}-{uuid.uuid4().hex[:6]}"
    status, body = cluster.request("POST", "/api/v1/namespaces", {"metadata": {"name": name}})
    assert status == 201, body
    return name


def drop_namespace(cluster: Any, ns: str) -> None:
    """Delete a test namespace once no operator runs: release the operator's finalizer on
    its OmniServices first, or they (and so the namespace, and a later CRD delete) would stay
    Terminating for the rest of the session."""
    status, body = cluster.request("GET", OSVC_PATH.format(ns=ns))
    for item in body.get("items", []) if status == 200 else []:
        path = f"{OSVC_PATH.format(ns=ns)}/{item['metadata']['name']}"
        call(cluster, "PATCH", path, {"metadata": {"finalizers": None}})
    cluster.request("DELETE", f"/api/v1/namespaces/{ns}")


def delete_all_nodes(cluster: Any) -> None:
    status, body = cluster.request("DELETE", "/api/v1/nodes")
    assert status == 200, body
    wait_for("no nodes", lambda: not cluster.request("GET", "/api/v1/nodes")[1]["items"])


def node_body(
    name: str,
    *,
    gpu: bool = True,
    labels: dict[str, str] | None = None,
    taints: list[dict[str, str]] | None = None,
) -> dict:
    capacity = {"cpu": "16", "memory": "64Gi", "pods": "110"}
    if gpu:
        capacity["nvidia.com/gpu"] = "1"
    body = {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name, **(labels or {})}},
        "status": {"capacity": capacity, "allocatable": capacity},
    }
    if taints:
        body["spec"] = {"taints": taints}
    return body


def create_node(
    cluster: Any,
    name: str,
    *,
    gpu: bool = True,
    labels: dict[str, str] | None = None,
    taints: list[dict[str, str]] | None = None,
) -> None:
    """A Node object; `taints` are there from its creation (a later patch leaves a window in
    which the operator may rightly place a pod on it)."""
    body = node_body(name, gpu=gpu, labels=labels, taints=taints)
    status, body = cluster.request("POST", "/api/v1/nodes", body)
    assert status == 201, body


def serving_pods(cluster: Any, ns: str, osvc: str | None = None) -> list[dict]:
    selector = f"{LABEL_COMPONENT}=serving"
    if osvc:
        selector += f",{LABEL_OSVC}={osvc}"
    status, body = cluster.request("GET", f"/api/v1/namespaces/{ns}/pods?labelSelector={selector}")
    assert status == 200, body
    return body["items"]


def live(pods: list[dict]) -> list[dict]:
    return [p for p in pods if not p["metadata"].get("deletionTimestamp")]


def pod_node(pod: dict) -> str:
    terms = pod["spec"]["affinity"]["nodeAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"
    ]["nodeSelectorTerms"]
    (value,) = terms[0]["matchFields"][0]["values"]
    return value


def get_osvc(cluster: Any, ns: str, name: str) -> dict | None:
    status, body = cluster.request("GET", f"{OSVC_PATH.format(ns=ns)}/{name}")
    return body if status == 200 else None


def condition(osvc: dict | None, type_: str) -> dict:
    for cond in ((osvc or {}).get("status") or {}).get("conditions") or ():
        if cond["type"] == type_:
            return cond
    return {}


def play_kubelet(cluster: Any, ns: str, pod: str, ready: bool = True) -> None:
    """What a kubelet would report for a running pod."""
    status = "True" if ready else "False"
    body = {
        "status": {
            "phase": "Running",
            "conditions": [
                {"type": "Ready", "status": status},
                {"type": "ContainersReady", "status": status},
            ],
        }
    }
    code, resp = _merge_patch(cluster, f"/api/v1/namespaces/{ns}/pods/{pod}/status", body)
    assert code == 200, resp


def call(
    cluster: Any,
    method: str,
    path: str,
    body: Any = None,
    *,
    content_type: str = "application/merge-patch+json",
    headers: dict[str, str] | None = None,
) -> tuple[int, Any]:
    """One API call as cluster admin (a PATCH needs a patch content type, which
    cluster.request does not send); `headers` may add impersonation."""
    import urllib.error
    import urllib.request

    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(cluster.server + path, data=data, method=method)
    req.add_header("Authorization", f"Bearer {cluster.token}")
    for key, value in (headers or {}).items():
        req.add_header(key, value)
    if data is not None:
        req.add_header("Content-Type", content_type)
    try:
        with urllib.request.urlopen(req, timeout=10, context=cluster._ssl_context()) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode()


def _merge_patch(cluster: Any, path: str, body: dict) -> tuple[int, Any]:
    return call(cluster, "PATCH", path, body)


def pod_env(pod: dict, name: str) -> str:
    (serving, *_) = pod["spec"]["containers"]
    return next(e["value"] for e in serving["env"] if e["name"] == name)


def as_service_account(
    cluster: Any, ns: str, sa: str, method: str, path: str, body: Any
) -> tuple[int, Any]:
    """One API call impersonating a ServiceAccount (what its token may do)."""
    user = {"Impersonate-User": f"system:serviceaccount:{ns}:{sa}"}
    return call(cluster, method, path, body, headers=user)


def publish_summary(cluster: Any, ns: str, pod: dict, summary: str) -> None:
    """What the pod's sidecar does: patch the summary into its node's ConfigMap, with the
    pod's own ServiceAccount (impersonated), so its RBAC is what is tested."""
    from horizonserve.runtime.config import SUMMARY_CONFIGMAP_ENV, SUMMARY_KEY

    configmap = pod_env(pod, SUMMARY_CONFIGMAP_ENV)
    sa = pod["spec"]["serviceAccountName"]

    def patched() -> bool:
        code, _ = as_service_account(
            cluster, ns, sa, "PATCH", f"/api/v1/namespaces/{ns}/configmaps/{configmap}",
            {"data": {SUMMARY_KEY: summary}},
        )  # fmt: skip
        return code == 200

    wait_for(f"summary published into ConfigMap {configmap}", patched, timeout=20)


def merge_patch(cluster: Any, path: str, body: dict) -> dict:
    code, resp = _merge_patch(cluster, path, body)
    assert code == 200, resp
    return resp


# The operator's RBAC as the Helm chart grants it in namespaced mode (charts/horizonserve/
# templates/_rbac.tpl): cluster-scoped objects by a ClusterRole, the rest by a Role; without
# namespaces list/watch, which the operator does not need (no namespace scanning when it
# serves one namespace), so a test passing here proves that too.
CLUSTER_RULES = [
    {"apiGroups": ["apiextensions.k8s.io"], "resources": ["customresourcedefinitions"],
     "verbs": ["list", "watch"]},
    {"apiGroups": [""], "resources": ["nodes"], "verbs": ["list", "watch"]},
    {"apiGroups": ["node.k8s.io"], "resources": ["runtimeclasses"], "verbs": ["list", "watch"]},
    {"apiGroups": ["scheduling.k8s.io"], "resources": ["priorityclasses"],
     "verbs": ["list", "watch"]},
    # Namespaced mode: release OmniServices elsewhere from a cluster-wide install's finalizer.
    {"apiGroups": ["horizonserve.io"], "resources": ["omniservices"], "verbs": ["list", "patch"]},
]  # fmt: skip
NAMESPACED_RULES = [
    {"apiGroups": ["horizonserve.io"], "resources": ["omniservices"],
     "verbs": ["list", "watch", "patch"]},
    {"apiGroups": ["horizonserve.io"], "resources": ["omniservices/status"], "verbs": ["patch"]},
    {"apiGroups": [""], "resources": ["pods"],
     "verbs": ["get", "list", "watch", "create", "delete"]},
    {"apiGroups": [""], "resources": ["configmaps"],
     "verbs": ["get", "list", "watch", "create", "delete", "patch"]},
    {"apiGroups": [""], "resources": ["services"], "verbs": ["get", "create", "patch", "delete"]},
    {"apiGroups": [""], "resources": ["serviceaccounts"], "verbs": ["get", "create"]},
    {"apiGroups": ["rbac.authorization.k8s.io"], "resources": ["rolebindings"],
     "verbs": ["get", "create"]},
    {"apiGroups": ["rbac.authorization.k8s.io"], "resources": ["roles"],
     "verbs": ["get", "create", "patch"]},
    {"apiGroups": [""], "resources": ["secrets"], "verbs": ["get"]},
    {"apiGroups": [""], "resources": ["events"], "verbs": ["create"]},
]  # fmt: skip
RBAC = "/apis/rbac.authorization.k8s.io/v1"


def operator_kubeconfig(
    cluster: Any,
    ns: str,
    path: Path,
    cluster_rules: list[dict] | None = None,
    namespaced_rules: list[dict] | None = None,
) -> Path:
    """A kubeconfig for ServiceAccount `horizonserve-operator` in `ns`, holding only the
    chart's namespaced-mode RBAC (so a missing permission fails the test)."""
    sa = "horizonserve-operator"
    name = f"{sa}-{ns}"
    subject = [{"kind": "ServiceAccount", "name": sa, "namespace": ns}]
    for method, url, body in (
        ("POST", f"/api/v1/namespaces/{ns}/serviceaccounts", {"metadata": {"name": sa}}),
        ("POST", f"{RBAC}/clusterroles",
         {"metadata": {"name": name}, "rules": cluster_rules or CLUSTER_RULES}),
        ("POST", f"{RBAC}/clusterrolebindings", {
            "metadata": {"name": name}, "subjects": subject,
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                        "name": name}}),
        ("POST", f"{RBAC}/namespaces/{ns}/roles",
         {"metadata": {"name": sa}, "rules": namespaced_rules or NAMESPACED_RULES}),
        ("POST", f"{RBAC}/namespaces/{ns}/rolebindings", {
            "metadata": {"name": sa}, "subjects": subject,
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": sa}}),
    ):  # fmt: skip
        status, resp = cluster.request(method, url, body)
        assert status in (201, 409), resp

    def secret_name() -> str | None:
        _, body = cluster.request("GET", f"/api/v1/namespaces/{ns}/serviceaccounts/{sa}")
        return (body.get("secrets") or [{}])[0].get("name")

    secret = wait_for("the operator's token secret", secret_name)
    _, body = cluster.request("GET", f"/api/v1/namespaces/{ns}/secrets/{secret}")
    token = base64.b64decode(body["data"]["token"]).decode()
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "c", "cluster": {
            "server": cluster.server, "certificate-authority": str(cluster.ca_file)}}],
        "users": [{"name": sa, "user": {"token": token}}],
        "contexts": [{"name": "c", "context": {"cluster": "c", "user": sa, "namespace": ns}}],
        "current-context": "c",
    }  # fmt: skip
    path.write_text(json.dumps(config))
    return path


@contextlib.contextmanager
def operator_process(
    cluster: Any,
    ns: str,
    liveness_port: int,
    log_path: Path,
    kubeconfig: Path | None = None,
    extra_env: dict[str, str] | None = None,
) -> Iterator[subprocess.Popen[bytes]]:
    """`python -m horizonserve.operator` as a real process (killed on exit if still alive)."""
    env = cluster.env()
    env.update(extra_env or {})
    if kubeconfig is not None:
        env["KUBECONFIG"] = str(kubeconfig)
    env.update(
        HORIZONSERVE_NAMESPACE=ns,
        HORIZONSERVE_LOG_LEVEL="INFO",
        HORIZONSERVE_STATUS_INTERVAL="1",
        HORIZONSERVE_RESYNC_INTERVAL="1",
        HORIZONSERVE_LIVENESS=f"http://127.0.0.1:{liveness_port}/healthz",
    )
    env.pop("KUBERNETES_SERVICE_HOST", None)
    with log_path.open("ab") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "horizonserve.operator"],
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=ROOT,
        )
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)


def kopf_args(ns: str) -> list[str]:
    return ["run", "--standalone", "-n", ns, "-m", "horizonserve.operator.handlers"]


def env_kubeconfig(cluster: Any) -> dict[str, str]:
    return {"KUBECONFIG": str(cluster.kubeconfig)}
