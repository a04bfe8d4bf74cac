"""The operator against a real kube-apiserver + etcd + kube-controller-manager (tests/k8s).

kopf's KopfRunner runs the operator in-process (one test runs `python -m horizonserve.operator`
as a process, to kill it). No kubelet or scheduler exists: tests create Node objects and play
the kubelet (pod status) and the sidecar (the summary annotation, under the sidecar's own
ServiceAccount, so its RBAC is exercised too).
"""

from __future__ import annotations

import socket
import time
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest
from kopf.testing import KopfRunner

from horizonserve.operator.builders import LABEL_SPEC_HASH
from horizonserve.runtime.config import ClassSummary, NodeSummary

from .conftest import DATA
from .k8s_helpers import (
    OSVC_PATH,
    condition,
    create_node,
    delete_all_nodes,
    drop_namespace,
    get_osvc,
    install_crd,
    kopf_args,
    live,
    merge_patch,
    new_namespace,
    operator_kubeconfig,
    operator_process,
    play_kubelet,
    pod_node,
    publish_summary,
    serving_pods,
    wait_for,
)

pytestmark = pytest.mark.k8s


@pytest.fixture(scope="module")
def cluster(kube_cluster: Any) -> Any:
    install_crd(kube_cluster)
    # The example asks for runtimeClassName: nvidia; admission refuses pods naming a missing one.
    status, body = kube_cluster.request(
        "POST",
        "/apis/node.k8s.io/v1/runtimeclasses",
        {"metadata": {"name": "nvidia"}, "handler": "nvidia"},
    )
    assert status in (201, 409), body
    return kube_cluster


@pytest.fixture
def ns(cluster: Any, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """A fresh namespace, no Node objects left from other tests, KUBECONFIG for kopf."""
    monkeypatch.setenv("KUBECONFIG", str(cluster.kubeconfig))
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    delete_all_nodes(cluster)
    name = new_namespace(cluster)
    yield name
    drop_namespace(cluster, name)


def _runner(ns: str) -> KopfRunner:
    return KopfRunner(kopf_args(ns), timeout=30)


def _pods_by_node(cluster: Any, ns: str, osvc: str | None = None) -> dict[str, dict]:
    pods = live(serving_pods(cluster, ns, osvc))
    by_node: dict[str, dict] = {}
    for pod in pods:
        node = pod_node(pod)
        assert node not in by_node, f"two pods for node {node}"
        by_node[node] = pod
    return by_node


def _wait_pods(cluster: Any, ns: str, nodes: set[str], osvc: str | None = None, t=30.0) -> dict:
    def probe() -> dict | None:
        by_node = _pods_by_node(cluster, ns, osvc)
        return by_node if set(by_node) == nodes else None

    return wait_for(f"serving pods on exactly {sorted(nodes)}", probe, timeout=t)


def _summary(node: str, met: int, requests: int) -> str:
    return NodeSummary(
        node=node,
        timestamp=time.time(),
        calibrated=True,
        classes=[
            ClassSummary(name="text-text", priority=0, requests=requests, met=met),
            ClassSummary(name="text-speech", priority=10, requests=requests, met=requests),
        ],
    ).to_annotation()


def _get_osvc_table(cluster: Any, ns: str, *extra: str) -> list[list[str]]:
    out = cluster.kubectl("get", "osvc", "-n", ns, *extra).stdout
    return [line.split() for line in out.strip().splitlines()]


def test_invalid_specs_are_refused_by_the_schema_with_the_field_path(cluster: Any) -> None:
    ns = new_namespace(cluster)
    res = cluster.kubectl("apply", "-n", ns, "-f", str(DATA / "invalid-schema.yaml"), check=False)
    assert res.returncode != 0
    assert "spec.policy" in res.stderr and "fastest-first" in res.stderr
    bad_multiplier = """
apiVersion: horizonserve.io/v1alpha1
kind: OmniService
metadata: {name: zero}
spec: {pipeline: bagel, allGpuNodes: true, slo: {multiplier: 0}, control: {ewmaGamma: 2}}
"""
    # --validate=false: no client-side check, the API server's schema must refuse it.
    res = cluster.kubectl(
        "apply", "--validate=false", "-n", ns, "-f", "-", input=bad_multiplier, check=False
    )
    assert res.returncode != 0
    assert "spec.slo.multiplier" in res.stderr and "spec.control.ewmaGamma" in res.stderr
    res = cluster.kubectl("apply", "-n", ns, "-f", "-", input="""
apiVersion: horizonserve.io/v1alpha1
kind: OmniService
metadata: {name: nopipe}
spec: {policy: edf}
""", check=False)  # fmt: skip
    assert res.returncode != 0 and "spec.pipeline" in res.stderr
    status, body = cluster.request("GET", OSVC_PATH.format(ns=ns))
    assert status == 200 and body["items"] == []


def test_example_on_three_gpu_nodes_and_one_cpu_node(cluster: Any, ns: str) -> None:
    for i in range(3):
        create_node(cluster, f"gpu-{i}")
    create_node(cluster, "cpu-0", gpu=False)
    with _runner(ns):
        cluster.kubectl("apply", "-n", ns, "-f", str(DATA / "omniservice.yaml"))
        pods = _wait_pods(cluster, ns, {"gpu-0", "gpu-1", "gpu-2"})

        # Each pod: bound to its node, the sidecar, one GPU, /dev/shm in memory, owned.
        for node, pod in pods.items():
            assert pod["metadata"]["name"] == f"qwen-omni-{node}"
            assert pod["metadata"]["labels"]["horizonserve.io/node"] == node
            names = [c["name"] for c in pod["spec"]["containers"]]
            assert names == ["serving", "sidecar"]
            assert pod["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == "1"
            shm = {v["name"]: v for v in pod["spec"]["volumes"]}["dshm"]
            assert shm["emptyDir"]["medium"] == "Memory"
            (ref,) = pod["metadata"]["ownerReferences"]
            assert ref["kind"] == "OmniService" and ref["name"] == "qwen-omni"
            assert pod["spec"]["serviceAccountName"] == "qwen-omni-sidecar"  # shared
            assert pod["spec"]["automountServiceAccountToken"] is False
            assert pod["spec"]["runtimeClassName"] == "nvidia"

        # `kubectl get osvc` before anything runs: 0/3, not ready.
        osvc = wait_for(
            "status", lambda: (o := get_osvc(cluster, ns, "qwen-omni")) and o.get("status") and o
        )
        assert osvc["status"]["nodes"].endswith("/3")

        # Play the kubelet and the sidecars (each as its own pod's ServiceAccount, writing
        # the summary into its node's ConfigMap).
        for i, (node, pod) in enumerate(sorted(pods.items())):
            play_kubelet(cluster, ns, pod["metadata"]["name"])
            publish_summary(cluster, ns, pod, _summary(node, met=8 + i, requests=10))
        sa = f"system:serviceaccount:{ns}:{pods['gpu-0']['spec']['serviceAccountName']}"

        def ready() -> dict | None:
            o = get_osvc(cluster, ns, "qwen-omni")
            return o if condition(o, "Ready").get("status") == "True" else None

        osvc = wait_for("Ready=True", ready, timeout=30)
        st = osvc["status"]
        assert st["nodes"] == "3/3" and st["nodesReady"] == 3
        assert st["attainment"] == pytest.approx((27 + 30) / 60, abs=1e-4)
        assert condition(osvc, "Calibrated")["status"] == "True"
        assert condition(osvc, "MetricsAvailable")["reason"] == "SummariesFresh"
        classes = {c["name"]: c for c in st["classes"]}
        assert classes["text-text"]["attainment"] == pytest.approx(0.9)
        assert st["byModality"] == {"text": 0.9, "audio": 1.0}

        table = _get_osvc_table(cluster, ns)
        assert table[0] == ["NAME", "MODEL", "NODES", "ATTAINMENT", "READY", "ENDPOINT", "AGE"]
        assert table[1][:6] == [
            "qwen-omni", "Qwen/Qwen2.5-Omni-7B", "3/3", "0.95", "True",
            f"http://qwen-omni.{ns}.svc:8000",
        ]  # fmt: skip
        wide = _get_osvc_table(cluster, ns, "-o", "wide")
        assert wide[0][7:] == ["PIPELINE", "POLICY", "TEXT", "AUDIO", "IMAGE", "REASON"]
        assert wide[1][7:11] == ["qwen2_5_omni", "horizon", "0.9", "1"]

        # A sidecar may write nothing but its OmniService's node ConfigMaps: not a pod.
        for verb, what in (("patch", "pods/qwen-omni-gpu-0"), ("patch", "pods/qwen-omni-gpu-1"),
                           ("create", "configmaps"), ("get", "secrets")):  # fmt: skip
            res = cluster.kubectl("auth", "can-i", verb, what, "-n", ns, f"--as={sa}", check=False)
            assert res.stdout.strip() == "no", (verb, what)

        # A node removed: its pod goes; relabelled to a CPU-only node: same.
        cluster.request("DELETE", "/api/v1/nodes/gpu-2")
        _wait_pods(cluster, ns, {"gpu-0", "gpu-1"})
        no_gpu = {"nvidia.com/gpu": "0"}
        merge_patch(
            cluster,
            "/api/v1/nodes/gpu-1/status",
            {"status": {"capacity": no_gpu, "allocatable": no_gpu}},
        )
        _wait_pods(cluster, ns, {"gpu-0"})
        # A node added: it gets a pod on the next event.
        create_node(cluster, "gpu-3")
        _wait_pods(cluster, ns, {"gpu-0", "gpu-3"})
        roles = cluster.request("GET", f"/apis/rbac.authorization.k8s.io/v1/namespaces/{ns}/roles")
        (role,) = roles[1]["items"]  # one Role for the OmniService's sidecars
        names = {n.rsplit("-", 1)[0] for n in role["rules"][0]["resourceNames"]}
        # gpu-1 and gpu-2 left: their ConfigMaps (and names) stay for the grace period.
        assert (
            {"qwen-omni-gpu-0", "qwen-omni-gpu-3"}
            <= names
            <= {f"qwen-omni-gpu-{i}" for i in range(4)}
        )

        # The OmniService deleted: everything it owns is garbage-collected.
        cluster.kubectl("delete", "osvc", "-n", ns, "qwen-omni", "--wait=true", "--timeout=60s")

        def children() -> list[str]:
            left = [p["metadata"]["name"] for p in serving_pods(cluster, ns)]
            rbac = "apis/rbac.authorization.k8s.io/v1"
            kinds = (("api/v1", "serviceaccounts"), (rbac, "roles"), (rbac, "rolebindings"),
                     ("api/v1", "configmaps"), ("api/v1", "services"))  # fmt: skip
            selector = "app.kubernetes.io/managed-by=horizonserve-operator"
            for group, kind in kinds:
                _, body = cluster.request(
                    "GET", f"/{group}/namespaces/{ns}/{kind}?labelSelector={selector}"
                )
                left += [f"{kind}/{i['metadata']['name']}" for i in body.get("items", [])]
            return left

        wait_for("children garbage-collected", lambda: not children(), timeout=60)


def test_invalid_override_is_reported_by_the_operator(cluster: Any, ns: str) -> None:
    create_node(cluster, "gpu-a")
    with _runner(ns):
        cluster.kubectl("apply", "-n", ns, "-f", str(DATA / "invalid-override.yaml"))

        def invalid() -> dict | None:
            c = condition(get_osvc(cluster, ns, "bad-override"), "Ready")
            return c if c.get("reason") == "InvalidSpec" else None

        ready = wait_for("Ready=False InvalidSpec", invalid)
        assert ready["status"] == "False"
        assert ready["message"].startswith("spec.slo.classOverrides.poetry:")
        time.sleep(1.5)  # a few reconcile passes
        assert serving_pods(cluster, ns) == []
        # Fixing the spec brings the pods.
        merge_patch(
            cluster,
            f"{OSVC_PATH.format(ns=ns)}/bad-override",
            {"spec": {"slo": {"classOverrides": {"poetry": None, "text-speech": 3}}}},
        )
        _wait_pods(cluster, ns, {"gpu-a"})
        cluster.kubectl("delete", "osvc", "-n", ns, "bad-override", "--wait=true")


def test_refused_pods_surface_in_status(cluster: Any, ns: str) -> None:
    create_node(cluster, "gpu-a")
    manifest = """
apiVersion: horizonserve.io/v1alpha1
kind: OmniService
metadata: {name: norc}
spec: {pipeline: bagel, allGpuNodes: true, runtimeClassName: no-such-class}
"""
    with _runner(ns):
        cluster.kubectl("apply", "-n", ns, "-f", "-", input=manifest)

        def refused() -> dict | None:
            c = condition(get_osvc(cluster, ns, "norc"), "NodesReady")
            return c if c.get("reason") == "PodCreationFailed" else None

        cond = wait_for("NodesReady=False PodCreationFailed", refused)
        # Known before any pod is tried (the RuntimeClass index), naming the field.
        assert "spec.runtimeClassName: RuntimeClass 'no-such-class' not found" in cond["message"]
        ready = condition(get_osvc(cluster, ns, "norc"), "Ready")
        assert ready["reason"] == "PodCreationFailed"
        cluster.kubectl("delete", "osvc", "-n", ns, "norc", "--wait=true")


def test_spec_update_rolls_pods_and_selector_relabel_converges(cluster: Any, ns: str) -> None:
    for name in ("gpu-a", "gpu-b"):
        create_node(cluster, name, labels={"pool": "omni"})
    create_node(cluster, "gpu-c", labels={"pool": "other"})
    manifest = """
apiVersion: horizonserve.io/v1alpha1
kind: OmniService
metadata: {name: roll}
spec: {pipeline: bagel, nodeSelector: {pool: omni}, rollout: {maxUnavailable: 1}}
"""
    with _runner(ns):
        cluster.kubectl("apply", "-n", ns, "-f", "-", input=manifest)
        before = _wait_pods(cluster, ns, {"gpu-a", "gpu-b"})
        for pod in before.values():
            play_kubelet(cluster, ns, pod["metadata"]["name"])
        old_hash = before["gpu-a"]["metadata"]["labels"][LABEL_SPEC_HASH]
        merge_patch(cluster, f"{OSVC_PATH.format(ns=ns)}/roll", {"spec": {"policy": "edf"}})

        def rolled() -> dict | None:
            pods = _pods_by_node(cluster, ns)
            hashes = {p["metadata"]["labels"][LABEL_SPEC_HASH] for p in pods.values()}
            if set(pods) == {"gpu-a", "gpu-b"} and old_hash not in hashes:
                return pods
            # Ready pods go one at a time: never both gone at once.
            assert len(pods) >= 1, "maxUnavailable=1 violated"
            for pod in pods.values():  # the kubelet starts each replacement
                if not pod.get("status", {}).get("conditions"):
                    play_kubelet(cluster, ns, pod["metadata"]["name"])
            return None

        after = wait_for("pods on the new spec", rolled, timeout=60)
        assert all(a["metadata"]["uid"] != before[n]["metadata"]["uid"] for n, a in after.items())
        assert '"policy":"edf"' in after["gpu-a"]["spec"]["containers"][0]["env"][0]["value"]

        # Relabel: gpu-c joins the pool, gpu-a leaves it.
        merge_patch(cluster, "/api/v1/nodes/gpu-c", {"metadata": {"labels": {"pool": "omni"}}})
        merge_patch(cluster, "/api/v1/nodes/gpu-a", {"metadata": {"labels": {"pool": "other"}}})
        _wait_pods(cluster, ns, {"gpu-b", "gpu-c"})
        # Someone deletes a serving pod: it comes back.
        cluster.kubectl("delete", "pod", "-n", ns, "roll-gpu-b", "--wait=false")
        wait_for(
            "pod recreated",
            lambda: (
                (p := _pods_by_node(cluster, ns).get("gpu-b"))
                and p["metadata"]["uid"] != after["gpu-b"]["metadata"]["uid"]
            ),
        )
        cluster.kubectl("delete", "osvc", "-n", ns, "roll", "--wait=true")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _healthz(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=1) as r:
            return r.status == 200
    except OSError:
        return False


def test_operator_killed_mid_way_and_restarted_makes_no_duplicates(
    cluster: Any, ns: str, tmp_path: Any
) -> None:
    nodes = {f"gpu-{i:02d}" for i in range(12)}
    for name in sorted(nodes):
        create_node(cluster, name)
    port = _free_port()
    log = tmp_path / "operator.log"
    # The process runs as a ServiceAccount with exactly the chart's RBAC (namespaced mode).
    kubeconfig = operator_kubeconfig(cluster, ns, tmp_path / "operator.kubeconfig")
    manifest = """
apiVersion: horizonserve.io/v1alpha1
kind: OmniService
metadata: {name: fleet}
spec: {pipeline: mimo_audio, allGpuNodes: true}
"""
    with operator_process(cluster, ns, port, log, kubeconfig) as proc:
        wait_for("liveness endpoint", lambda: _healthz(port), timeout=30)
        cluster.kubectl("apply", "-n", ns, "-f", "-", input=manifest)
        wait_for("the first pods", lambda: len(serving_pods(cluster, ns)) >= 1, every=0.02)
        proc.kill()  # SIGKILL: no cleanup, the finalizer stays, maybe half the pods exist
        proc.wait(timeout=10)
    first = {p["metadata"]["name"]: p["metadata"]["uid"] for p in serving_pods(cluster, ns)}
    # While it is down: one node leaves, one joins.
    cluster.request("DELETE", "/api/v1/nodes/gpu-00")
    create_node(cluster, "gpu-99")
    nodes = (nodes - {"gpu-00"}) | {"gpu-99"}

    with operator_process(cluster, ns, port, log, kubeconfig):
        pods = _wait_pods(cluster, ns, nodes, t=60)
        time.sleep(2)  # a couple of resync passes: nothing more may appear
        again = serving_pods(cluster, ns)
        assert len(again) == len(nodes) == len({p["metadata"]["name"] for p in again})
        for pod in pods.values():  # pods that survived the kill were kept, not recreated
            name = pod["metadata"]["name"]
            if name in first and name != "fleet-gpu-00":
                assert pod["metadata"]["uid"] == first[name]
        cluster.kubectl("delete", "osvc", "-n", ns, "fleet", "--wait=true", "--timeout=60s")
    text = log.read_text()
    assert "Traceback" not in text and "forbidden" not in text.lower(), text[-4000:]


def test_one_tenants_unusable_service_blocks_no_other_tenant(cluster: Any, ns: str) -> None:
    """Cluster-wide: an older allGpuNodes OmniService in one namespace that can never run a pod
    (its RuntimeClass is missing) does not own the GPU nodes of another namespace's service."""
    other = new_namespace(cluster, prefix="tenant")
    create_node(cluster, "gpu-t")
    older = """
apiVersion: horizonserve.io/v1alpha1
kind: OmniService
metadata: {name: greedy}
spec: {pipeline: bagel, backend: reference, allGpuNodes: true, runtimeClassName: absent}
"""
    younger = """
apiVersion: horizonserve.io/v1alpha1
kind: OmniService
metadata: {name: modest}
spec: {pipeline: bagel, backend: reference, allGpuNodes: true}
"""
    args = ["run", "--standalone", "--all-namespaces", "-m", "horizonserve.operator.handlers"]
    with KopfRunner(args, timeout=30):
        cluster.kubectl("apply", "-n", other, "-f", "-", input=older)
        time.sleep(1.1)  # creationTimestamps have one-second resolution
        cluster.kubectl("apply", "-n", ns, "-f", "-", input=younger)
        _wait_pods(cluster, ns, {"gpu-t"}, "modest")
        assert condition(get_osvc(cluster, ns, "modest"), "Conflict").get("status") != "True"
        assert live(serving_pods(cluster, other)) == []
        for name, space in (("greedy", other), ("modest", ns)):
            cluster.kubectl("delete", "osvc", "-n", space, name, "--wait=true", "--timeout=60s")
    cluster.request("DELETE", f"/api/v1/namespaces/{other}")
