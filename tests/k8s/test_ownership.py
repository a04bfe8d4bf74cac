"""An operator that touches only what it owns, on a real kube-apiserver (its own, 1.20).

One operator process in namespaced mode, as a ServiceAccount holding exactly the chart's RBAC
(rendered by helm), behind the chart's ValidatingWebhookConfiguration as rendered (only the
client config points at 127.0.0.1, since the API server cannot reach a cluster Service). It
watches `default`, where the API server's own `kubernetes` Service lives. Then:

* names that cannot name a Service are refused at apply; a Service of the OmniService's name
  that someone else owns (`payments`, `default/kubernetes`) is neither patched nor deleted,
  and the OmniService gets a Conflict condition and Event naming it;
* the finalizer release outside the watched namespace, through that webhook, is retried
  until it passes;
* hostile specs (foreign registry, system priority, a model that is a flag, unlabelled
  Secret) are refused, and counted;
* a drain keeps the node's ConfigMap and identity; a node gone loses it after the grace;
* ownership goes to who can serve; a selector edit never evicts another's pod;
* a sidecar relabelling its ConfigMap as another node's is ignored;
* tolerationSeconds reaches the pod.
"""

from __future__ import annotations

import base64
import json
import time
from collections.abc import Iterator
from typing import Any

import pytest

from horizonserve.runtime.config import ClassSummary, NodeSummary
from tests.charts.chartlib import load_docs
from tests.helm.helmlib import template_text
from tests.k8s.cluster import KubeCluster, find_binaries, free_port, wait_for
from tests.k8s.test_trust import _tls
from tests.operator.k8s_helpers import (
    OSVC_PATH,
    as_service_account,
    call,
    condition,
    create_node,
    get_osvc,
    install_crd,
    live,
    merge_patch,
    operator_kubeconfig,
    operator_process,
    play_kubelet,
    pod_env,
    pod_node,
    serving_pods,
)

pytestmark = pytest.mark.k8s

NS = "default"  # the watched namespace: where default/kubernetes lives
RELEASE_NS = "horizonserve-system"
GRACE_S = 6  # HORIZONSERVE_NODE_STATE_GRACE for this module
BASE = {"pipeline": "bagel", "backend": "reference", "nodeSelector": {"pool": "own"}}
CM_ENV = "HORIZONSERVE_SUMMARY_CONFIGMAP"


def _render(helm_bin: str) -> list[dict]:
    text = template_text(
        helm_bin,
        {"operator.watchNamespace": NS},
        namespace=RELEASE_NS,
        extra=("--kube-version", "1.20.2"),
    )
    return load_docs(text)


def _osvc(name: str, spec: dict[str, Any]) -> dict[str, Any]:
    return {"apiVersion": "horizonserve.io/v1alpha1", "kind": "OmniService",
            "metadata": {"name": name}, "spec": spec}  # fmt: skip


@pytest.fixture(scope="module")
def env(helm_bin: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    work = tmp_path_factory.mktemp("ownership")
    cluster = KubeCluster(find_binaries(build=True), workdir=work / "kube")
    cluster.start()
    try:
        install_crd(cluster)
        for ns in (RELEASE_NS, "other"):
            code, body = cluster.request("POST", "/api/v1/namespaces", {"metadata": {"name": ns}})
            assert code == 201, body
        # Left by an earlier cluster-wide install: an OmniService elsewhere with our finalizer.
        leftover = _osvc("leftover", BASE)
        leftover["metadata"]["finalizers"] = ["horizonserve.io/finalizer"]
        code, body = cluster.request("POST", OSVC_PATH.format(ns="other"), leftover)
        assert code == 201, body
        docs = _render(helm_bin)
        (cluster_role,) = [d for d in docs if d["kind"] == "ClusterRole"]
        (role,) = [d for d in docs if d["kind"] == "Role"]
        kubeconfig = operator_kubeconfig(
            cluster, NS, work / "operator.kubeconfig", cluster_role["rules"], role["rules"]
        )
        # The chart's webhook as rendered, registered BEFORE the operator starts (so its first
        # finalizer release meets a webhook that does not answer yet).
        (hook,) = [d for d in docs if d["kind"] == "ValidatingWebhookConfiguration"]
        certs, ca = _tls(work)
        port = free_port()
        for webhook in hook["webhooks"]:
            webhook["clientConfig"] = {
                "url": f"https://127.0.0.1:{port}/validate-omniservice",
                "caBundle": base64.b64encode(ca).decode(),
            }
        code, body = cluster.request(
            "POST", "/apis/admissionregistration.k8s.io/v1/validatingwebhookconfigurations", hook
        )
        assert code == 201, body
        code, body = cluster.request(
            "POST", "/apis/node.k8s.io/v1/runtimeclasses",
            {"metadata": {"name": "nvidia"}, "handler": "nvidia"},
        )  # fmt: skip
        assert code == 201, body
        (deployment,) = [d for d in docs if d["kind"] == "Deployment"]
        container = deployment["spec"]["template"]["spec"]["containers"][0]
        chart_env = {e["name"]: e["value"] for e in container["env"] if "value" in e}
        extra = {
            "HORIZONSERVE_WEBHOOK_CERT_DIR": str(certs),
            "HORIZONSERVE_WEBHOOK_ADDR": "127.0.0.1",
            "HORIZONSERVE_WEBHOOK_PORT": str(port),
            "HORIZONSERVE_ALLOWED_REGISTRIES": chart_env["HORIZONSERVE_ALLOWED_REGISTRIES"],
            "HORIZONSERVE_ALLOWED_PRIORITY_CLASSES": chart_env[
                "HORIZONSERVE_ALLOWED_PRIORITY_CLASSES"
            ],
            "HORIZONSERVE_NODE_STATE_GRACE": str(GRACE_S),
        }
        log = work / "operator.log"
        with operator_process(cluster, NS, free_port(), log, kubeconfig, extra) as proc:
            probe = _osvc("probe", BASE)

            def admitted() -> bool:
                assert proc.poll() is None, log.read_text()[-3000:]
                code, _ = cluster.request("POST", OSVC_PATH.format(ns=NS), probe)
                return code in (201, 409)

            wait_for("the webhook to admit a valid OmniService", admitted, timeout=60)
            cluster.kubectl("delete", "osvc", "-n", NS, "probe", "--wait=true")
            yield {"cluster": cluster, "log": log, "proc": proc}
            assert "Traceback" not in log.read_text(), log.read_text()[-4000:]
    finally:
        cluster.stop()


def _apply(cluster: KubeCluster, name: str, spec: dict[str, Any]) -> Any:
    return cluster.kubectl(
        "apply", "--validate=false", "-n", NS, "-f", "-",
        input=json.dumps(_osvc(name, spec)), check=False,
    )  # fmt: skip


def _delete(cluster: KubeCluster, *names: str) -> None:
    for name in names:
        cluster.kubectl("delete", "osvc", "-n", NS, name, "--wait=true", "--timeout=60s",
                        "--ignore-not-found")  # fmt: skip


def _pods(cluster: KubeCluster, osvc: str) -> dict[str, dict]:
    return {pod_node(p): p for p in live(serving_pods(cluster, NS, osvc))}


def _wait_nodes(cluster: KubeCluster, osvc: str, nodes: set[str], t: float = 30) -> dict:
    def probe() -> dict[str, dict] | None:
        pods = _pods(cluster, osvc)
        return pods if set(pods) == nodes else None

    return wait_for(f"{osvc} pods on {sorted(nodes)}", probe, timeout=t)


def _events(cluster: KubeCluster, osvc: str, reason: str) -> list[dict]:
    _, body = cluster.request("GET", f"/api/v1/namespaces/{NS}/events")
    return [e for e in body["items"]
            if e["reason"] == reason and e["involvedObject"]["name"] == osvc]  # fmt: skip


def _conflict(cluster: KubeCluster, osvc: str) -> dict | None:
    c = condition(get_osvc(cluster, NS, osvc), "Conflict")
    return c if c.get("status") == "True" else None


def _cm(cluster: KubeCluster, name: str) -> int:
    return cluster.request("GET", f"/api/v1/namespaces/{NS}/configmaps/{name}")[0]


def test_finalizer_release_outside_the_namespace_is_retried_through_the_webhook(
    env: dict[str, Any],
) -> None:
    cluster = env["cluster"]

    def released() -> bool:
        obj = get_osvc(cluster, "other", "leftover")
        assert obj is not None, "the leftover OmniService is gone"
        return "horizonserve.io/finalizer" not in (obj["metadata"].get("finalizers") or [])

    wait_for("the finalizer in the other namespace released", released, timeout=60)
    cluster.kubectl("delete", "osvc", "-n", "other", "leftover", "--wait=true", "--timeout=20s")
    text = env["log"].read_text()
    assert "attempt 1" in text, "the first release was expected to meet the silent webhook"


def test_names_that_cannot_name_a_service_are_refused_at_apply(env: dict[str, Any]) -> None:
    cluster = env["cluster"]
    for name in ("my.svc", "9lives", "a" * 64):
        res = _apply(cluster, name, BASE)
        assert res.returncode != 0, name
        assert "metadata.name" in res.stderr, res.stderr
    # Refused by the CRD schema itself, so also with the webhook out of the way.
    code, body = cluster.request("POST", OSVC_PATH.format(ns="other"), _osvc("9lives", BASE))
    assert code == 422 and "metadata.name" in json.dumps(body), body


def _foreign_service(cluster: KubeCluster, name: str) -> dict:
    svc = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": name},
        "spec": {"selector": {"app": name}, "ports": [{"port": 80, "targetPort": 8080}]},
    }
    code, body = cluster.request("POST", f"/api/v1/namespaces/{NS}/services", svc)
    assert code == 201, body
    return body  # fmt: skip


def _same_service(cluster: KubeCluster, before: dict) -> None:
    name = before["metadata"]["name"]
    code, now = cluster.request("GET", f"/api/v1/namespaces/{NS}/services/{name}")
    assert code == 200, f"Service {name} was deleted"
    assert now["metadata"]["uid"] == before["metadata"]["uid"], "Service replaced"
    assert now["metadata"]["resourceVersion"] == before["metadata"]["resourceVersion"], now
    assert not now["metadata"].get("ownerReferences"), now["metadata"]


def test_a_foreign_service_of_the_name_is_never_patched_nor_deleted(env: dict[str, Any]) -> None:
    cluster = env["cluster"]
    create_node(cluster, "svc-a", labels={"pool": "own"})
    payments = _foreign_service(cluster, "payments")
    code, kubernetes = cluster.request("GET", f"/api/v1/namespaces/{NS}/services/kubernetes")
    assert code == 200
    local = {**BASE, "service": {"internalTrafficPolicy": "Local"}}  # would be patched in
    for name in ("payments", "kubernetes"):
        assert _apply(cluster, name, local).returncode == 0, name
    for name in ("payments", "kubernetes"):
        cond = wait_for(
            f"Conflict on {name} naming its Service",
            lambda n=name: (c := _conflict(cluster, n)) and f"Service {n!r}" in c["message"] and c,
        )
        assert "not owned" in cond["message"] and "untouched" in cond["message"], cond
        wait_for(
            f"a Conflict Event on {name} naming its Service",
            lambda n=name: [
                e for e in _events(cluster, n, "Conflict") if f"Service {n!r}" in e["message"]
            ],
        )
        assert not (get_osvc(cluster, NS, name).get("status") or {}).get("endpoint")
    # Switching the Service off must not delete the foreign one either.
    off = {**BASE, "service": {"enabled": False}}
    for name in ("payments", "kubernetes"):
        assert _apply(cluster, name, off).returncode == 0
    time.sleep(4)  # several passes
    _same_service(cluster, payments)
    _same_service(cluster, kubernetes)
    _delete(cluster, "payments", "kubernetes")
    _same_service(cluster, kubernetes)
    cluster.request("DELETE", f"/api/v1/namespaces/{NS}/services/payments")
    cluster.request("DELETE", "/api/v1/nodes/svc-a")


HOSTILE: list[tuple[str, dict[str, Any], str]] = [
    ("image from a foreign registry", {"image": "evil.example/miner:1"}, "spec.image"),
    ("system priority", {"priorityClassName": "system-node-critical"},
     "spec.priorityClassName"),
    ("cluster priority", {"priorityClassName": "system-cluster-critical"},
     "spec.priorityClassName"),
    ("model as a flag", {"model": "--trust-remote-code"}, "spec.model"),
]  # fmt: skip


def test_hostile_specs_are_refused(env: dict[str, Any]) -> None:
    cluster = env["cluster"]
    refused, missed = 0, []
    for i, (what, extra, field) in enumerate(HOSTILE):
        res = _apply(cluster, f"hostile-{i}", {**BASE, **extra})
        if res.returncode != 0 and field in res.stderr:
            refused += 1
        else:
            missed.append(f"{what}: exit {res.returncode}, {res.stderr.strip()[:300]}")
    for name in ("my.svc", "9lives"):  # no Service can take these names
        res = _apply(cluster, name, BASE)
        refused += res.returncode != 0 and "metadata.name" in res.stderr
    # A Secret the user may not read: not labelled by whoever may, so no pod gets it.
    create_node(cluster, "sec-a", labels={"pool": "sec"})
    secret = {"metadata": {"name": "payments-key"}, "stringData": {"api-key": "s3cret"}}
    assert cluster.request("POST", f"/api/v1/namespaces/{NS}/secrets", secret)[0] == 201
    spec = {**BASE, "nodeSelector": {"pool": "sec"}, "apiKeySecret": {"name": "payments-key"}}
    assert _apply(cluster, "borrower", spec).returncode == 0
    (event, *_) = wait_for("a SecretNotAllowed Event",
                           lambda: _events(cluster, "borrower", "SecretNotAllowed"))  # fmt: skip
    assert "horizonserve.io/api-key=allowed" in event["message"], event
    assert _pods(cluster, "borrower") == {}
    refused += 1
    total = len(HOSTILE) + 3
    print(f"\n[ownership] hostile specs tried {total}, refused {refused}")
    assert not missed, "\n".join(missed)
    assert refused == total
    # Once labelled by whoever may read it, the pod comes.
    merge_patch(cluster, f"/api/v1/namespaces/{NS}/secrets/payments-key",
                {"metadata": {"labels": {"horizonserve.io/api-key": "allowed"}}})  # fmt: skip
    _wait_nodes(cluster, "borrower", {"sec-a"})
    _delete(cluster, "borrower")
    cluster.request("DELETE", "/api/v1/nodes/sec-a")


def test_a_drain_keeps_the_calibration_and_a_gone_node_loses_it(env: dict[str, Any]) -> None:
    cluster = env["cluster"]
    create_node(cluster, "drain-a", labels={"pool": "drain"})
    spec = {**BASE, "nodeSelector": {"pool": "drain"},
            "tolerations": [{"key": "maint", "operator": "Exists", "effect": "NoExecute",
                             "tolerationSeconds": 300}]}  # fmt: skip
    assert _apply(cluster, "drained", spec).returncode == 0
    pod = _wait_nodes(cluster, "drained", {"drain-a"})["drain-a"]
    # tolerationSeconds reaches the pod.
    assert {"key": "maint", "operator": "Exists", "effect": "NoExecute",
            "tolerationSeconds": 300} in pod["spec"]["tolerations"]  # fmt: skip
    cm, sa = pod_env(pod, CM_ENV), pod["spec"]["serviceAccountName"]
    merge_patch(cluster, f"/api/v1/namespaces/{NS}/configmaps/{cm}",
                {"data": {"artifact.calibration.json": "{}"}})  # fmt: skip
    # kubectl drain: cordon plus a NoSchedule taint, then the pod evicted.
    merge_patch(cluster, "/api/v1/nodes/drain-a", {"spec": {"unschedulable": True, "taints": [
        {"key": "node.kubernetes.io/unschedulable", "effect": "NoSchedule"}]}})  # fmt: skip
    name = pod["metadata"]["name"]
    code, body = call(cluster, "POST", f"/api/v1/namespaces/{NS}/pods/{name}/eviction",
                      {"apiVersion": "policy/v1beta1", "kind": "Eviction",
                       "metadata": {"name": name, "namespace": NS}},
                      content_type="application/json")  # fmt: skip
    assert code == 201, body
    wait_for("the evicted pod gone", lambda: _pods(cluster, "drained") == {})
    time.sleep(GRACE_S + 3)  # longer than the grace: a drained node still exists and matches
    assert _cm(cluster, cm) == 200, "the drain deleted the node's calibration ConfigMap"
    code, _ = cluster.request("GET", f"/api/v1/namespaces/{NS}/serviceaccounts/{sa}")
    assert code == 200, "the drain deleted the sidecar's ServiceAccount"
    merge_patch(cluster, "/api/v1/nodes/drain-a",
                {"spec": {"unschedulable": None, "taints": None}})  # fmt: skip
    again = _wait_nodes(cluster, "drained", {"drain-a"})["drain-a"]
    assert pod_env(again, CM_ENV) == cm  # the same stored calibration: no recalibration
    _, stored = cluster.request("GET", f"/api/v1/namespaces/{NS}/configmaps/{cm}")
    assert "artifact.calibration.json" in stored["data"]
    # The node deleted: its ConfigMap goes after the grace period, not before.
    cluster.request("DELETE", "/api/v1/nodes/drain-a")
    gone_at = time.monotonic()
    wait_for("the ConfigMap of the deleted node gone", lambda: _cm(cluster, cm) == 404,
             timeout=GRACE_S + 20)  # fmt: skip
    assert time.monotonic() - gone_at >= GRACE_S - 1
    _delete(cluster, "drained")


def test_ownership_goes_to_who_can_serve(env: dict[str, Any]) -> None:
    cluster = env["cluster"]
    taint = {"key": "dedicated", "value": "b", "effect": "NoSchedule"}
    create_node(cluster, "own-t", labels={"pool": "owner"}, taints=[taint])
    create_node(cluster, "own-r", labels={"pool": "owner2"})
    create_node(cluster, "own-p", labels={"pool": "owner3"})
    # Older, but can never run there: does not tolerate the taint; its RuntimeClass, its
    # PriorityClass are missing.
    unusable = {
        "untolerant": {"nodeSelector": {"pool": "owner"}},
        "classless": {"nodeSelector": {"pool": "owner2"}, "runtimeClassName": "missing"},
        "prioless": {"nodeSelector": {"pool": "owner3"}, "priorityClassName": "missing-prio"},
    }
    for name, extra in unusable.items():
        assert _apply(cluster, name, {**BASE, **extra}).returncode == 0, name
    time.sleep(1.1)  # creationTimestamps have one-second resolution
    tolerant = {**BASE, "nodeSelector": {"pool": "owner"},
                "tolerations": [{"key": "dedicated", "operator": "Equal", "value": "b",
                                 "effect": "NoSchedule"}]}  # fmt: skip
    assert _apply(cluster, "tolerant", tolerant).returncode == 0
    for name, pool in (("classy", "owner2"), ("prioritised", "owner3")):
        assert _apply(cluster, name, {**BASE, "nodeSelector": {"pool": pool}}).returncode == 0
    _wait_nodes(cluster, "tolerant", {"own-t"})
    _wait_nodes(cluster, "classy", {"own-r"})
    _wait_nodes(cluster, "prioritised", {"own-p"})
    for name in ("tolerant", "classy", "prioritised"):
        assert condition(get_osvc(cluster, NS, name), "Conflict").get("status") == "False", name
    _delete(cluster, "untolerant", "classless", "prioless", "tolerant", "classy", "prioritised")
    for node in ("own-t", "own-r", "own-p"):
        cluster.request("DELETE", f"/api/v1/nodes/{node}")


def test_a_selector_edit_never_evicts_another_services_pod(env: dict[str, Any]) -> None:
    cluster = env["cluster"]
    create_node(cluster, "sel-a", labels={"pool": "sel-a"})
    create_node(cluster, "sel-b", labels={"pool": "sel-b"})
    assert _apply(cluster, "first", {**BASE, "nodeSelector": {"pool": "sel-a"}}).returncode == 0
    time.sleep(1.1)
    assert _apply(cluster, "second", {**BASE, "nodeSelector": {"pool": "sel-b"}}).returncode == 0
    held = _wait_nodes(cluster, "second", {"sel-b"})["sel-b"]
    play_kubelet(cluster, NS, held["metadata"]["name"])
    merge_patch(cluster, "/api/v1/nodes/sel-a", {"metadata": {"labels": {"pool": "sel-b"}}})
    wait_for("the older one off sel-a", lambda: not _pods(cluster, "first"))
    # The older one's selector now names sel-b too: the younger one's Ready pod stays.
    assert _apply(cluster, "first", {**BASE, "nodeSelector": {"pool": "sel-b"}}).returncode == 0
    cond = wait_for("Conflict on the older one", lambda: _conflict(cluster, "first"))
    assert "owner default/second" in cond["message"], cond
    time.sleep(3)
    pods = _pods(cluster, "second")
    assert pods["sel-b"]["metadata"]["uid"] == held["metadata"]["uid"], "the Ready pod evicted"
    assert "sel-b" not in _pods(cluster, "first")
    _delete(cluster, "first", "second")
    for node in ("sel-a", "sel-b"):
        cluster.request("DELETE", f"/api/v1/nodes/{node}")


def _summary(node: str, requests: int, met: int) -> str:
    return NodeSummary(
        node=node, timestamp=time.time(), calibrated=True,
        classes=[ClassSummary(name="t2i", priority=20, requests=requests, met=met)],
    ).to_annotation()  # fmt: skip


def test_a_node_speaks_only_for_itself(env: dict[str, Any]) -> None:
    cluster = env["cluster"]
    for name in ("sp-a", "sp-b"):
        create_node(cluster, name, labels={"pool": "speak"})
    assert _apply(cluster, "speak", {**BASE, "nodeSelector": {"pool": "speak"}}).returncode == 0
    pods = _wait_nodes(cluster, "speak", {"sp-a", "sp-b"})
    for pod in pods.values():
        play_kubelet(cluster, NS, pod["metadata"]["name"])
    cms = f"/api/v1/namespaces/{NS}/configmaps"
    sa = pods["sp-b"]["spec"]["serviceAccountName"]
    # sp-b's sidecar publishes its honest 10 %.
    code, _ = as_service_account(cluster, NS, sa, "PATCH", f"{cms}/{pod_env(pods['sp-b'], CM_ENV)}",
                                 {"data": {"summary.json": _summary("sp-b", 100, 10)}})  # fmt: skip
    assert code == 200

    def attainment() -> float | None:
        return (get_osvc(cluster, NS, "speak").get("status") or {}).get("attainment")

    wait_for("attainment from sp-b", lambda: attainment() is not None)
    assert attainment() == pytest.approx(0.1)
    # sp-a's sidecar relabels its own ConfigMap as sp-b's and forges sp-b's summary.
    forged = {
        "metadata": {
            "labels": {"horizonserve.io/node": "sp-b"},
            "annotations": {"horizonserve.io/node-name": "sp-b"},
        },
        "data": {"summary.json": _summary("sp-b", 1_000_000, 1_000_000)},
    }
    code, _ = as_service_account(cluster, NS, sa, "PATCH",
                                 f"{cms}/{pod_env(pods['sp-a'], CM_ENV)}", forged)  # fmt: skip
    assert code == 200  # RBAC lets it write its own ConfigMap: the binding must hold anyway
    (event, *_) = wait_for("a SummaryIgnored Event",
                           lambda: _events(cluster, "speak", "SummaryIgnored"))  # fmt: skip
    assert "sp-b" in event["message"]
    time.sleep(3)
    assert attainment() == pytest.approx(0.1), "a forged summary changed the attainment"
    # The sidecars may patch this OmniService's node ConfigMaps only; nothing else.
    for method, path, body in (
        ("PATCH", f"{cms}/kube-root-ca.crt", {"data": {"x": "1"}}),
        ("POST", cms, {"metadata": {"name": "new"}}),
        ("PATCH", f"/api/v1/namespaces/{NS}/pods/{pods['sp-a']['metadata']['name']}",
         {"metadata": {"labels": {"x": "y"}}}),
    ):  # fmt: skip
        code, _ = as_service_account(cluster, NS, sa, method, path, body)
        assert code == 403, (method, path, code)
    _delete(cluster, "speak")
    for name in ("sp-a", "sp-b"):
        cluster.request("DELETE", f"/api/v1/nodes/{name}")


def test_writes_per_node_are_two(env: dict[str, Any]) -> None:
    """A pod and its node's ConfigMap; the identity is per OmniService (three objects)."""
    cluster = env["cluster"]
    nodes = [f"w-{i}" for i in range(6)]
    for name in nodes:
        create_node(cluster, name, labels={"pool": "writes"})
    assert _apply(cluster, "writes", {**BASE, "nodeSelector": {"pool": "writes"}}).returncode == 0
    _wait_nodes(cluster, "writes", set(nodes))
    sel = "labelSelector=horizonserve.io/omniservice=writes"
    counts = {}
    for res in ("configmaps", "serviceaccounts"):
        _, body = cluster.request("GET", f"/api/v1/namespaces/{NS}/{res}?{sel}")
        counts[res] = len(body["items"])
    for res in ("roles", "rolebindings"):
        _, body = cluster.request(
            "GET", f"/apis/rbac.authorization.k8s.io/v1/namespaces/{NS}/{res}?{sel}"
        )
        counts[res] = len(body["items"])
    assert counts == {"configmaps": 6, "serviceaccounts": 1, "roles": 1, "rolebindings": 1}
    _delete(cluster, "writes")
    for name in nodes:
        cluster.request("DELETE", f"/api/v1/nodes/{name}")
