"""An operator a cluster admin can trust, on a real kube-apiserver (its own, with an audit log).

One operator process, as a ServiceAccount holding exactly the Helm chart's namespaced-mode RBAC
(rendered by helm), serving its validating webhook over TLS to the API server. Then:

* every invalid spec class is refused at `kubectl apply` with its field named (counted);
* one GPU, one owner: the older OmniService gets the node, the younger a Conflict + Event;
* taints: NoSchedule keeps a running pod and blocks new ones, NoExecute evicts;
* a serving pod's own credentials cannot write another OmniService's ConfigMap or any pod;
* a pod whose image is changed in place is replaced;
* the Service and status.endpoint; the live pod passes the PSS "restricted" rules;
* a deletion while pods are being created creates nothing more;
* at the end, the verbs the operator used (audit log) against the chart's rules.
"""

from __future__ import annotations

import base64
import json
import subprocess
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from horizonserve.operator.controller import LIVE_TTL_S
from tests.charts.chartlib import load_docs
from tests.helm.helmlib import rule_map, template_text
from tests.k8s.cluster import KubeCluster, find_binaries, free_port, wait_for
from tests.operator.k8s_helpers import (
    OSVC_PATH,
    as_service_account,
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
from tests.operator.pss import restricted_violations

pytestmark = pytest.mark.k8s

AUDIT_POLICY = """\
apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: ["RequestReceived"]
rules:
  - level: Metadata
"""
WEBHOOK_NS_LABEL = "horizonserve-trust-test"
OPERATOR_SA = "horizonserve-operator"

# (what is wrong, spec fields merged into a valid base, the field the refusal must name)
INVALID: list[tuple[str, dict[str, Any], str]] = [
    ("unknown field (snake_case typo)", {"node_selector": {"pool": "a"}}, "spec.node_selector"),
    ("unknown nested field", {"control": {"rotation_n_max": 4}}, "spec.control.rotation_n_max"),
    ("empty selector", {"nodeSelector": {}}, "spec.nodeSelector"),
    ("policy not in enum", {"policy": "fastest-first"}, "spec.policy"),
    ("pipeline not in enum", {"pipeline": "gpt4o"}, "spec.pipeline"),
    ("multiplier zero", {"slo": {"multiplier": 0}}, "spec.slo.multiplier"),
    ("multiplier 1e308", {"slo": {"multiplier": 1e308}}, "spec.slo.multiplier"),
    ("override unknown class", {"slo": {"classOverrides": {"poetry": 3}}}, "classOverrides"),
    ("override zero", {"slo": {"classOverrides": {"text-text": 0}}}, "classOverrides"),
    ("ewmaGamma > 1", {"control": {"ewmaGamma": 2}}, "spec.control.ewmaGamma"),
    ("rotationNMax 1e15", {"control": {"rotationNMax": 10**15}}, "spec.control.rotationNMax"),
    ("rotation min > max", {"control": {"rotationNMin": 6, "rotationNMax": 3}}, "spec.control"),
    ("ladder not increasing", {"ladder": {"levels": [64, 32], "aggressive": 100, "total": 132}},
     "spec.ladder.levels"),
    ("S_cap > S_aggr", {"ladder": {"levels": [32, 96], "aggressive": 80, "total": 132}},
     "spec.ladder.levels"),
    ("S_aggr > S_tot", {"ladder": {"levels": [32], "aggressive": 140, "total": 132}},
     "spec.ladder"),
    ("ladder total 2^62", {"ladder": {"levels": [32], "aggressive": 64, "total": 2**62}},
     "spec.ladder.total"),
    ("10,000-level ladder", {"ladder": {"levels": list(range(1, 10001)), "aggressive": 10001,
                                        "total": 10001}}, "spec.ladder.levels"),
    ("bad image", {"image": "UPPER CASE::bad"}, "spec.image"),
    ("100 KB image", {"image": "a" * 100_000}, "spec.image"),
    ("shmSize zero", {"shmSize": "0"}, "spec.shmSize"),
    ("shmSize garbage", {"shmSize": "lots"}, "spec.shmSize"),
    ("300 KB model", {"model": "m" * 300_000}, "spec.model"),
    ("requests > limits", {"resources": {"requests": {"cpu": "4"}, "limits": {"cpu": "2"}}},
     "spec.resources.requests.cpu"),
    ("two GPUs", {"resources": {"limits": {"nvidia.com/gpu": 2}}}, "nvidia.com/gpu"),
    ("bad quantity", {"resources": {"requests": {"memory": "a lot"}}}, "spec.resources"),
    ("negative tolerationSeconds", {"tolerations": [{"key": "k", "operator": "Exists",
                                                     "effect": "NoExecute",
                                                     "tolerationSeconds": -1}]},
     "spec.tolerations"),
    ("toleration Equal without key", {"tolerations": [{"operator": "Equal", "value": "v"}]},
     "spec.tolerations"),
    ("maxUnavailable 0", {"rollout": {"maxUnavailable": 0}}, "spec.rollout.maxUnavailable"),
    ("bad runtimeClassName", {"runtimeClassName": "Not A Name"}, "spec.runtimeClassName"),
    ("bad selector key", {"nodeSelector": {"bad key!": "x"}}, "spec.nodeSelector"),
    ("bad internalTrafficPolicy", {"service": {"internalTrafficPolicy": "Nearby"}},
     "spec.service.internalTrafficPolicy"),
    ("apiKeySecret without name", {"apiKeySecret": {"key": "k"}}, "spec.apiKeySecret"),
    ("calibration hostPath (removed)", {"calibration": {"hostPath": "/etc"}},
     "spec.calibration.hostPath"),
    ("30 selector labels too many", {"nodeSelector": {f"k{i}": "v" for i in range(40)}},
     "spec.nodeSelector"),
]  # fmt: skip
BASE = {"pipeline": "bagel", "backend": "reference", "nodeSelector": {"pool": "trust"}}


def _merge(base: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for k, v in extra.items():
        out[k] = v
    return out


def _tls(workdir: Path) -> tuple[Path, bytes]:
    """A CA and a server certificate for 127.0.0.1 (what the chart's genCA does)."""

    def ssl(*args: str) -> None:
        subprocess.run(["openssl", *args], check=True, capture_output=True)

    ca_key, ca, key, csr, crt = (workdir / n for n in ("ca.key", "ca.crt", "tls.key", "csr",
                                                        "tls.crt"))  # fmt: skip
    ec = ("-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes")
    ssl("req", "-x509", *ec, "-subj", "/CN=webhook-ca", "-days", "2", "-keyout", str(ca_key),
        "-out", str(ca))  # fmt: skip
    ssl("req", "-new", *ec, "-subj", "/CN=127.0.0.1", "-keyout", str(key), "-out", str(csr))
    ext = workdir / "ext.cnf"
    ext.write_text("subjectAltName = IP:127.0.0.1\nextendedKeyUsage = serverAuth\n")
    ssl("x509", "-req", "-in", str(csr), "-CA", str(ca), "-CAkey", str(ca_key),
        "-CAcreateserial", "-days", "2", "-extfile", str(ext), "-out", str(crt))  # fmt: skip
    return workdir, ca.read_bytes()


def _chart_rules(helm_bin: str, ns: str) -> tuple[list[dict], list[dict]]:
    docs = load_docs(template_text(helm_bin, {"operator.watchNamespace": ns}))
    (cluster_role,) = [d for d in docs if d["kind"] == "ClusterRole"]
    (role,) = [d for d in docs if d["kind"] == "Role"]
    return cluster_role["rules"], role["rules"]


@pytest.fixture(scope="module")
def env(helm_bin: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    work = tmp_path_factory.mktemp("trust")
    (work / "audit-policy.yaml").write_text(AUDIT_POLICY)
    audit = work / "audit.log"
    cluster = KubeCluster(
        find_binaries(build=True),
        workdir=work / "kube",
        extra_apiserver_args=(
            f"--audit-policy-file={work / 'audit-policy.yaml'}",
            f"--audit-log-path={audit}",
            "--audit-log-format=json",
        ),
    )
    cluster.start()
    try:
        install_crd(cluster)
        ns = "trust"
        status, body = cluster.request(
            "POST", "/api/v1/namespaces",
            {"metadata": {"name": ns, "labels": {WEBHOOK_NS_LABEL: "1"}}},
        )  # fmt: skip
        assert status == 201, body
        # Left by an earlier cluster-wide install: an OmniService elsewhere with our finalizer.
        assert cluster.request("POST", "/api/v1/namespaces", {"metadata": {"name": "other"}})[0]
        leftover = {"apiVersion": "horizonserve.io/v1alpha1", "kind": "OmniService",
                    "metadata": {"name": "leftover", "finalizers": ["horizonserve.io/finalizer"]},
                    "spec": BASE}  # fmt: skip
        status, body = cluster.request("POST", OSVC_PATH.format(ns="other"), leftover)
        assert status == 201, body
        cluster_rules, ns_rules = _chart_rules(helm_bin, ns)
        kubeconfig = operator_kubeconfig(
            cluster, ns, work / "operator.kubeconfig", cluster_rules, ns_rules
        )
        certs, ca = _tls(work)
        port = free_port()
        hook = {
            "apiVersion": "admissionregistration.k8s.io/v1",
            "kind": "ValidatingWebhookConfiguration",
            "metadata": {"name": "horizonserve-trust"},
            "webhooks": [{
                "name": "omniservices.horizonserve.io",
                "admissionReviewVersions": ["v1"], "sideEffects": "None",
                "failurePolicy": "Fail", "timeoutSeconds": 10,
                "rules": [{"apiGroups": ["horizonserve.io"], "apiVersions": ["v1alpha1"],
                           "operations": ["CREATE", "UPDATE"], "resources": ["omniservices"]}],
                "namespaceSelector": {"matchLabels": {WEBHOOK_NS_LABEL: "1"}},
                "clientConfig": {"url": f"https://127.0.0.1:{port}/validate-omniservice",
                                 "caBundle": base64.b64encode(ca).decode()},
            }],
        }  # fmt: skip
        status, body = cluster.request(
            "POST", "/apis/admissionregistration.k8s.io/v1/validatingwebhookconfigurations", hook
        )
        assert status == 201, body
        log = work / "operator.log"
        extra = {
            "HORIZONSERVE_WEBHOOK_CERT_DIR": str(certs),
            "HORIZONSERVE_WEBHOOK_ADDR": "127.0.0.1",
            "HORIZONSERVE_WEBHOOK_PORT": str(port),
        }
        with operator_process(cluster, ns, free_port(), log, kubeconfig, extra) as proc:
            # The webhook answers once the operator is up: a valid object goes through.
            probe = {"apiVersion": "horizonserve.io/v1alpha1", "kind": "OmniService",
                     "metadata": {"name": "probe"}, "spec": BASE}  # fmt: skip

            def admitted() -> bool:
                assert proc.poll() is None, log.read_text()[-3000:]
                code, _ = cluster.request("POST", OSVC_PATH.format(ns=ns), probe)
                return code in (201, 409)

            wait_for("the webhook to admit a valid OmniService", admitted, timeout=60)
            cluster.kubectl("delete", "osvc", "-n", ns, "probe", "--wait=true")
            yield {"cluster": cluster, "ns": ns, "audit": audit, "log": log,
                   "rules": (cluster_rules, ns_rules), "proc": proc}  # fmt: skip
    finally:
        cluster.stop()


def test_namespaced_mode_releases_finalizers_elsewhere(env: dict[str, Any]) -> None:
    cluster = env["cluster"]

    def released() -> bool:
        obj = get_osvc(cluster, "other", "leftover")
        assert obj is not None, "the leftover OmniService is gone"
        return "horizonserve.io/finalizer" not in (obj["metadata"].get("finalizers") or [])

    # The operator releases it as it starts, beside serving the webhook: wait, do not race it.
    wait_for("the finalizer in the other namespace released", released, timeout=30)
    cluster.kubectl("delete", "osvc", "-n", "other", "leftover", "--wait=true", "--timeout=20s")


def _apply(cluster: KubeCluster, ns: str, name: str, spec: dict[str, Any]) -> Any:
    obj = {"apiVersion": "horizonserve.io/v1alpha1", "kind": "OmniService",
           "metadata": {"name": name}, "spec": spec}  # fmt: skip
    return cluster.kubectl(
        "apply", "--validate=false", "-n", ns, "-f", "-", input=json.dumps(obj), check=False
    )


def test_every_invalid_spec_is_refused_at_apply_naming_the_field(env: dict[str, Any]) -> None:
    cluster, ns = env["cluster"], env["ns"]
    refused, missed = 0, []
    for i, (what, extra, field) in enumerate(INVALID):
        res = _apply(cluster, ns, f"bad-{i}", _merge(BASE, extra))
        if res.returncode != 0 and field in res.stderr:
            refused += 1
        else:
            missed.append(f"{what}: exit {res.returncode}, {res.stderr.strip()[:300]}")
    print(f"\n[trust] invalid specs tried {len(INVALID)}, refused at apply {refused}")
    assert not missed, "\n".join(missed)
    _, body = cluster.request("GET", OSVC_PATH.format(ns=ns))
    assert [o["metadata"]["name"] for o in body["items"]] == []


def _pods(cluster: KubeCluster, ns: str, osvc: str) -> dict[str, dict]:
    return {pod_node(p): p for p in live(serving_pods(cluster, ns, osvc))}


def _wait_nodes(cluster: KubeCluster, ns: str, osvc: str, nodes: set[str]) -> dict[str, dict]:
    def probe() -> dict[str, dict] | None:
        pods = _pods(cluster, ns, osvc)
        return pods if set(pods) == nodes else None

    return wait_for(f"{osvc} pods on {sorted(nodes)}", probe, timeout=30)


def test_one_gpu_one_owner_taints_drift_endpoint_and_pss(env: dict[str, Any]) -> None:
    cluster, ns = env["cluster"], env["ns"]
    for name in ("t-a", "t-b"):
        create_node(cluster, name, labels={"pool": "trust"})
    assert _apply(cluster, ns, "older", BASE).returncode == 0
    time.sleep(1.1)  # creationTimestamps have one-second resolution
    assert _apply(cluster, ns, "younger", BASE).returncode == 0
    pods = _wait_nodes(cluster, ns, "older", {"t-a", "t-b"})

    # Conflict: the younger gets no pod, a condition and an Event naming node and winner.
    def conflict() -> dict | None:
        c = condition(get_osvc(cluster, ns, "younger"), "Conflict")
        return c if c.get("status") == "True" else None

    cond = wait_for("Conflict=True on the younger OmniService", conflict)
    assert "t-a (owner trust/older)" in cond["message"], cond
    assert _pods(cluster, ns, "younger") == {}
    assert condition(get_osvc(cluster, ns, "older"), "Conflict")["status"] == "False"

    def event() -> list[dict]:
        _, body = cluster.request("GET", f"/api/v1/namespaces/{ns}/events")
        return [e for e in body["items"] if e["reason"] == "Conflict"
                and e["involvedObject"]["name"] == "younger"]  # fmt: skip

    (ev, *_) = wait_for("a Conflict Event", event)
    assert "node t-a is owned by OmniService trust/older" in ev["message"]

    # Service and endpoint.
    osvc = wait_for("status.endpoint", lambda: (o := get_osvc(cluster, ns, "older"))
                    and o.get("status", {}).get("endpoint") and o)  # fmt: skip
    assert osvc["status"]["endpoint"] == f"http://older.{ns}.svc:8000"
    code, svc = cluster.request("GET", f"/api/v1/namespaces/{ns}/services/older")
    assert code == 200 and svc["spec"]["selector"]["horizonserve.io/omniservice"] == "older"
    assert svc["spec"]["ports"][0]["targetPort"] == "http"

    # The live pod (after API defaulting) passes PSS "restricted".
    for pod in pods.values():
        assert restricted_violations(pod["spec"]) == [], pod["metadata"]["name"]

    # A serving pod's own credentials (one ServiceAccount per OmniService): its ConfigMap
    # yes; another OmniService's ConfigMap, any other ConfigMap, pods, no. (Its sibling
    # nodes' ConfigMaps, yes: on 1.30+ the chart's node-state admission policy refuses that by
    # the node bound into the pod's token; docs/operator.md says what older servers allow.)
    a, b = pods["t-a"], pods["t-b"]
    sa = a["spec"]["serviceAccountName"]
    cm_a = pod_env(a, "HORIZONSERVE_SUMMARY_CONFIGMAP")
    cms = f"/api/v1/namespaces/{ns}/configmaps"
    ok = as_service_account(cluster, ns, sa, "PATCH", f"{cms}/{cm_a}", {"data": {"x": "1"}})
    assert ok[0] == 200, ok
    foreign = {"metadata": {"name": "someone-elses"}, "data": {"k": "v"}}
    assert cluster.request("POST", cms, foreign)[0] == 201
    for method, path, body in (
        ("PATCH", f"{cms}/someone-elses", {"data": {"summary.json": "{}"}}),
        ("PATCH", f"{cms}/kube-root-ca.crt", {"data": {"ca.crt": "x"}}),
        ("PATCH", f"/api/v1/namespaces/{ns}/pods/{b['metadata']['name']}",
         {"spec": {"containers": [{"name": "serving", "image": "evil:1"}]}}),
        ("PATCH", f"/api/v1/namespaces/{ns}/pods/{a['metadata']['name']}",
         {"metadata": {"labels": {"x": "y"}}}),
        ("POST", cms, {"metadata": {"name": "new"}}),
    ):  # fmt: skip
        code, _ = as_service_account(cluster, ns, sa, method, path, body)
        assert code == 403, (method, path, code)

    # Drift: an admin changes a pod's image in place; the label still says current.
    evil = {"spec": {"containers": [{"name": "serving", "image": "registry.example/evil:1"}]}}
    cluster.kubectl("patch", "pod", "-n", ns, b["metadata"]["name"], "-p", json.dumps(evil))
    wait_for("the drifted pod replaced", lambda: (p := _pods(cluster, ns, "older").get("t-b"))
             and p["metadata"]["uid"] != b["metadata"]["uid"] and p)  # fmt: skip
    assert _pods(cluster, ns, "older")["t-a"]["metadata"]["uid"] == a["metadata"]["uid"]

    # GPU feature discovery labels key the calibration: a driver upgrade on t-b gives it a new
    # ConfigMap (recalibration) and a new pod; the old ConfigMap goes once its pod is gone.
    old_cm = pod_env(_pods(cluster, ns, "older")["t-b"], "HORIZONSERVE_SUMMARY_CONFIGMAP")
    gfd = {"nvidia.com/gpu.product": "NVIDIA-H200", "nvidia.com/cuda.driver.major": "580"}
    merge_patch(cluster, "/api/v1/nodes/t-b", {"metadata": {"labels": gfd}})

    def recalibrating() -> dict | None:
        pod = _pods(cluster, ns, "older").get("t-b")
        return pod if pod and pod_env(pod, "HORIZONSERVE_SUMMARY_CONFIGMAP") != old_cm else None

    new_cm = pod_env(wait_for("t-b on a new calibration key", recalibrating),
                     "HORIZONSERVE_SUMMARY_CONFIGMAP")  # fmt: skip
    wait_for(
        "the old ConfigMap deleted", lambda: cluster.request("GET", f"{cms}/{old_cm}")[0] == 404
    )
    _, stored = cluster.request("GET", f"{cms}/{new_cm}")
    assert "GPU NVIDIA-H200" in stored["metadata"]["annotations"]["horizonserve.io/calibration-for"]

    # Taints: NoSchedule keeps the running Ready pod and blocks a new node; NoExecute evicts.
    play_kubelet(cluster, ns, a["metadata"]["name"])
    taint = {"key": "maintenance", "value": "yes", "effect": "NoSchedule"}
    merge_patch(cluster, "/api/v1/nodes/t-a", {"spec": {"taints": [taint]}})
    create_node(cluster, "t-c", labels={"pool": "trust"}, taints=[taint])
    time.sleep(3)  # several passes
    now = _pods(cluster, ns, "older")
    assert now["t-a"]["metadata"]["uid"] == a["metadata"]["uid"], "NoSchedule evicted a pod"
    assert "t-c" not in now, "NoSchedule got a new pod"
    merge_patch(
        cluster, "/api/v1/nodes/t-a", {"spec": {"taints": [{**taint, "effect": "NoExecute"}]}}
    )
    wait_for("NoExecute to evict", lambda: "t-a" not in _pods(cluster, ns, "older"))
    # The younger OmniService still loses t-b; t-a and t-c are tainted for it too.
    for name in ("older", "younger"):
        cluster.kubectl("delete", "osvc", "-n", ns, name, "--wait=true", "--timeout=60s")
    for name in ("t-a", "t-b", "t-c"):
        cluster.request("DELETE", f"/api/v1/nodes/{name}")


def test_delete_during_creation_creates_nothing_more(env: dict[str, Any]) -> None:
    cluster, ns = env["cluster"], env["ns"]
    nodes = [f"d-{i:02d}" for i in range(40)]
    for name in nodes:
        create_node(cluster, name, labels={"pool": "del"})
    assert _apply(cluster, ns, "gone", {**BASE, "nodeSelector": {"pool": "del"}}).returncode == 0
    # Delete while the operator is still writing: its first node ConfigMaps exist, pods not all.
    selector = "horizonserve.io/omniservice=gone"

    def writing() -> bool:
        _, body = cluster.request(
            "GET", f"/api/v1/namespaces/{ns}/configmaps?labelSelector={selector}"
        )
        return bool(body["items"])

    wait_for("the operator writing", writing, every=0.02)
    # Orphan: the garbage collector leaves the pods, so every pod ever created can be counted.
    path = f"{OSVC_PATH.format(ns=ns)}/gone"
    code, body = cluster.request(
        "DELETE", path, {"kind": "DeleteOptions", "apiVersion": "v1",
                         "propagationPolicy": "Orphan"},
    )  # fmt: skip
    assert code == 200, body
    deleted_at = body["metadata"]["deletionTimestamp"]
    wait_for("the OmniService gone", lambda: cluster.request("GET", path)[0] == 404, timeout=60)
    time.sleep(2)
    pods = serving_pods(cluster, ns, "gone")
    late = [p["metadata"]["name"] for p in pods
            if p["metadata"]["creationTimestamp"] > deleted_at]  # fmt: skip
    print(f"\n[trust] pods created before the delete {len(pods) - len(late)}, after {len(late)}")
    assert late == []
    # Nor any ConfigMap, ServiceAccount, Role or RoleBinding after the delete.
    objects = []
    for base in (f"/api/v1/namespaces/{ns}", f"/apis/rbac.authorization.k8s.io/v1/namespaces/{ns}"):
        kinds = ("configmaps", "serviceaccounts") if base.startswith("/api/") else (
            "roles", "rolebindings")  # fmt: skip
        for kind in kinds:
            _, listed = cluster.request("GET", f"{base}/{kind}?labelSelector={selector}")
            objects += [(kind, o["metadata"]) for o in listed["items"]]
    # The operator's live gate lets a create start up to LIVE_TTL_S (0.25 s) after the delete;
    # timestamps are whole seconds, so such a create may read one second later, never more.
    grace = _rfc3339(deleted_at) + 1
    late_objects = [f"{k}/{m['name']}" for k, m in objects
                    if _rfc3339(m["creationTimestamp"]) > grace]  # fmt: skip
    assert late_objects == [], late_objects
    assert LIVE_TTL_S < 1
    for kind, meta in objects:
        group = "/api/v1" if kind in ("configmaps", "serviceaccounts") else (
            "/apis/rbac.authorization.k8s.io/v1")  # fmt: skip
        cluster.request("DELETE", f"{group}/namespaces/{ns}/{kind}/{meta['name']}")
    for pod in pods:
        cluster.request("DELETE", f"/api/v1/namespaces/{ns}/pods/{pod['metadata']['name']}")
    for name in nodes:
        cluster.request("DELETE", f"/api/v1/nodes/{name}")


def _rfc3339(stamp: str) -> float:
    """Seconds since the epoch of an API server timestamp ("2026-12-05T00:57:28Z")."""
    return datetime.strptime(stamp, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC).timestamp()


def _used_verbs(audit: Path, user: str) -> dict[tuple[str, str], set[str]]:
    used: dict[tuple[str, str], set[str]] = {}
    for line in audit.read_text().splitlines():
        event = json.loads(line)
        ref = event.get("objectRef") or {}
        if event["user"]["username"] != user or not ref.get("resource"):
            continue
        code = (event.get("responseStatus") or {}).get("code", 200)
        if code == 403:
            continue
        resource = ref["resource"] + (f"/{ref['subresource']}" if ref.get("subresource") else "")
        used.setdefault((ref.get("apiGroup", ""), resource), set()).add(event["verb"])
    return used


# Granted but not necessarily called in this run, each for a stated reason.
HELD_NOT_CALLED = {
    ("", "configmaps"): {"patch", "get"},  # granted on to the sidecars' Role; get after a 409
    ("", "pods"): {"get"},  # only after a create meets 409 (a pod of that name exists)
    ("", "services"): {"get", "patch", "delete"},  # after a 409; policy change; switched off
    ("", "serviceaccounts"): {"get"},  # only after a create meets 409 (whose is it?)
    ("rbac.authorization.k8s.io", "rolebindings"): {"get"},  # likewise
    ("rbac.authorization.k8s.io", "roles"): {"get"},  # likewise
    ("", "secrets"): {"get"},  # only for a spec.apiKeySecret (its label)
    ("horizonserve.io", "omniservices"): {"patch"},  # (cluster-scoped rule) finalizer cleanup
}


def test_chart_rbac_is_the_verbs_the_operator_used(env: dict[str, Any]) -> None:
    """Runs last in this module: the audit log holds the whole run by now."""
    cluster_rules, ns_rules = env["rules"]
    granted = rule_map(cluster_rules)
    for key, verbs in rule_map(ns_rules).items():
        granted.setdefault(key, set()).update(verbs)
    # Stop the operator first: a watch is logged when it ends.
    env["proc"].terminate()
    env["proc"].wait(timeout=30)
    time.sleep(1)
    used = _used_verbs(env["audit"], f"system:serviceaccount:{env['ns']}:{OPERATOR_SA}")
    print("\n[trust] verbs used by the operator (audit log):")
    for key in sorted(used):
        print(f"  {key[0] or 'core'}/{key[1]}: {sorted(used[key])}")
    missing = {k: v - granted.get(k, set()) for k, v in used.items() if v - granted.get(k, set())}
    assert not missing, f"used but not granted: {missing}"
    unused = {
        k: v - used.get(k, set()) - HELD_NOT_CALLED.get(k, set())
        for k, v in granted.items()
        if v - used.get(k, set()) - HELD_NOT_CALLED.get(k, set())
    }
    assert not unused, f"granted but never used: {unused}"
    text = env["log"].read_text()
    assert "Traceback" not in text, text[-4000:]
