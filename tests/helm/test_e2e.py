"""End to end on a real Kubernetes 1.20 control plane (``kube_cluster``, tests/k8s).

1. Render the chart with helm, `kubectl apply` it (CRD, ServiceAccount, RBAC, Deployment) as
   cluster admin, then run `charts/upgrade-crds.sh` against the installed CRD.
2. Run the operator as a local process started from the rendered Deployment: its command, its
   environment, and the token of the chart's ServiceAccount. The operator therefore holds
   exactly the chart's RBAC; a missing rule shows up as a 403 and fails the test.
3. Make GPU Node objects (no kubelet runs: pods are stored, never started), apply an example
   OmniService and see one serving pod per matching GPU node, owned by the OmniService, plus
   the sidecars' shared ServiceAccount/Role/RoleBinding and a status written by the operator.
4. Uninstall: delete the OmniService (operator still running), stop the operator, `kubectl
   delete -f` the rendered manifests, and check that nothing of the chart or the operator is
   left (the controller manager's garbage collector removes owned children).

A second test runs the real `helm install` / `helm uninstall` (NOTES, CRD from crds/, CRDs
kept by Helm on uninstall, as the README says).
"""

from __future__ import annotations

import base64
import contextlib
import importlib.util
import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from ..charts.chartlib import (
    CHART,
    CRD_FILE,
    CRD_NAME,
    EXAMPLES,
    INSTALL_YAML,
    ROOT,
    crd_version,
    load_docs,
    load_yaml_file,
    one,
)
from ..k8s.cluster import KubeCluster, free_port, wait_for
from .helmlib import helm, set_args

pytestmark = pytest.mark.k8s

OPERATOR_MODULE = "horizonserve.operator"
SERVING_SELECTOR = "app.kubernetes.io/name=horizonserve,app.kubernetes.io/component=serving"
# What the operator creates (the chart's own Role/RoleBinding in namespaced mode is not).
OPERATOR_CHILDREN = "app.kubernetes.io/managed-by=horizonserve-operator"
EXAMPLE = "qwen2_5_omni"


def kubectl(
    cluster: KubeCluster, *args: str, input: str | None = None, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    """kubectl as cluster admin; a failure shows kubectl's own error message."""
    res = cluster.kubectl(*args, input=input, check=False, timeout=timeout)
    assert res.returncode == 0, f"kubectl {' '.join(args)}: exit {res.returncode}\n{res.stderr}"
    return res


def kubectl_json(cluster: KubeCluster, *args: str) -> dict[str, Any]:
    return json.loads(kubectl(cluster, *args, "-o", "json").stdout)


def names(cluster: KubeCluster, kind: str, *args: str) -> list[str]:
    items = kubectl_json(cluster, "get", kind, *args)["items"]
    return sorted(i["metadata"]["name"] for i in items)


def require_chart_crd() -> None:
    if not list((CHART / "crds").glob("*.yaml")):
        pytest.fail(
            "charts/horizonserve/crds/ holds no CRD: generate crds/ from the operator's models "
            "and run `bash charts/sync-crds.sh`"
        )


def require_operator() -> None:
    if importlib.util.find_spec(f"{OPERATOR_MODULE}.__main__") is None:
        pytest.fail(
            f"`python -m {OPERATOR_MODULE}` is not available (operator/__main__.py missing): "
            "the chart's Deployment runs it, so the end-to-end test cannot run the operator"
        )


def render(helm_bin: str, release: str, namespace: str, values: dict[str, Any]) -> str:
    return helm(
        helm_bin,
        "template",
        release,
        str(CHART),
        "--namespace",
        namespace,
        "--include-crds",
        *set_args(values),
    ).stdout


def crd_exists(cluster: KubeCluster) -> bool:
    res = cluster.kubectl("get", "crd", CRD_NAME, "--ignore-not-found", "-o", "name", check=False)
    return bool(res.stdout.strip())


def create_namespace(cluster: KubeCluster, name: str) -> None:
    kubectl(cluster, "create", "namespace", name)
    cluster.wait_for_default_service_account(name)


def service_account_kubeconfig(cluster: KubeCluster, namespace: str, sa: str, path: Path) -> Path:
    """A kubeconfig that authenticates with the ServiceAccount's own token (what the operator
    pod would mount), so the API server applies exactly the chart's RBAC to it."""

    def token_secret() -> str:
        obj = kubectl_json(cluster, "get", "serviceaccount", sa, "-n", namespace)
        secrets = obj.get("secrets") or []
        return secrets[0]["name"] if secrets else ""

    secret = wait_for(f"token secret of {namespace}/{sa}", token_secret)
    data = kubectl_json(cluster, "get", "secret", secret, "-n", namespace)["data"]
    token = base64.b64decode(data["token"]).decode()
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {
                "name": "e2e",
                "cluster": {
                    "server": cluster.server,
                    "certificate-authority": str(cluster.ca_file),
                },
            }
        ],
        "users": [{"name": sa, "user": {"token": token}}],
        "contexts": [
            {"name": "e2e", "context": {"cluster": "e2e", "user": sa, "namespace": namespace}}
        ],
        "current-context": "e2e",
    }
    path.write_text(json.dumps(config, indent=2))
    path.chmod(0o600)
    return path


def gpu_node(name: str, labels: dict[str, str], gpus: int) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name, **labels}},
        "status": {
            "capacity": {"cpu": "32", "memory": "256Gi", "pods": "110", "nvidia.com/gpu": gpus},
            "allocatable": {"cpu": "32", "memory": "250Gi", "pods": "110", "nvidia.com/gpu": gpus},
        },
    }


def create_node(cluster: KubeCluster, node: dict[str, Any]) -> None:
    """Create a Node and set its status (capacity) through the status subresource."""
    name = node["metadata"]["name"]
    kubectl(cluster, "create", "-f", "-", input=json.dumps({**node, "status": {}}))
    for _ in range(20):  # the controller manager may update the new Node meanwhile: retry
        status, body = cluster.request("GET", f"/api/v1/nodes/{name}")
        assert status == 200, body
        body["status"] = {**body.get("status", {}), **node["status"]}
        status, body = cluster.request("PUT", f"/api/v1/nodes/{name}/status", body)
        if status != 409:
            break
        time.sleep(0.2)
    assert status == 200, body


@contextlib.contextmanager
def operator_process(
    deployment: dict[str, Any], kubeconfig: Path, workdir: Path
) -> Iterator[tuple[subprocess.Popen[bytes], Path, str]]:
    """The operator, started from the Deployment's container command and environment."""
    (c,) = deployment["spec"]["template"]["spec"]["containers"]
    command = list(c["command"]) + list(c.get("args", []))
    assert command[0] == "python", command
    command[0] = sys.executable
    env = {k: v for k, v in os.environ.items() if not k.startswith("KUBERNETES_")}
    for item in c.get("env", []):
        assert "value" in item, f"env {item['name']}: only literal values are supported here"
        env[item["name"]] = item["value"]
    # The container's port 8080 may be taken on this machine: same endpoint, a free port.
    liveness = f"http://127.0.0.1:{free_port()}/healthz"
    env.update(KUBECONFIG=str(kubeconfig), HORIZONSERVE_LIVENESS=liveness, PYTHONUNBUFFERED="1")
    log = workdir / "operator.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            command,
            cwd=workdir,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        yield proc, log, liveness
    finally:
        stop_operator(proc)


def stop_operator(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)


def log_tail(log: Path, lines: int = 60) -> str:
    text = log.read_text(errors="replace").splitlines() if log.exists() else []
    return "\n".join(text[-lines:])


def healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as r:
            return r.status == 200
    except OSError:
        return False


def can_i(cluster: KubeCluster, sa: str, verb: str, resource: str, namespace: str = "") -> bool:
    args = ["auth", "can-i", verb, resource, f"--as={sa}"]
    args += ["-n", namespace] if namespace else []
    res = cluster.kubectl(*args, check=False)
    return res.stdout.strip() == "yes"


def crd_index(crd: dict[str, Any]) -> int:
    """Index of the storage version in spec.versions."""
    return next(i for i, v in enumerate(crd["spec"]["versions"]) if v.get("storage"))


def load_example(pipeline: str, run_label: dict[str, str]) -> dict[str, Any]:
    obj = yaml.safe_load((EXAMPLES / f"{pipeline}.yaml").read_text())
    # Only this test's nodes: the session cluster may hold other tests' Node objects.
    obj["spec"]["nodeSelector"] = {**obj["spec"].get("nodeSelector", {}), **run_label}
    return obj


# ------------------------------------------------------------------ the operator, end to end


@pytest.mark.parametrize("mode", ["cluster-wide", "namespaced"])
def test_chart_install_serve_uninstall(
    kube_cluster: KubeCluster, helm_bin: str, tmp_path: Path, mode: str
) -> None:
    require_operator()
    require_chart_crd()
    cluster = kube_cluster
    run = uuid.uuid4().hex[:6]
    release = f"hs-{run}"
    release_ns = f"hs-system-{run}"
    apps_ns = f"hs-apps-{run}"
    values = {"operator.watchNamespace": apps_ns} if mode == "namespaced" else {}
    values["operator.logLevel"] = "DEBUG"
    # The operator runs here, outside the cluster, where the API server cannot call the
    # chart's webhook Service; tests/k8s/test_trust.py runs the webhook over TLS instead.
    values["webhook.enabled"] = False

    text = render(helm_bin, release, release_ns, values)
    rendered = tmp_path / "rendered.yaml"
    rendered.write_text(text)
    docs = load_docs(text)
    deployment = one(docs, "Deployment")
    sa_name = one(docs, "ServiceAccount")["metadata"]["name"]
    sa_user = f"system:serviceaccount:{release_ns}:{sa_name}"

    crd_preexisting = crd_exists(cluster)
    if crd_preexisting:  # another test's CRD: leave it, manage only our own objects
        ours = [d for d in docs if d["kind"] != "CustomResourceDefinition"]
        rendered.write_text(yaml.safe_dump_all(ours, sort_keys=False))

    run_label = {"horizonserve-e2e/run": run}
    example = load_example(EXAMPLE, run_label)
    pool = example["spec"]["nodeSelector"]
    wanted_nodes = [f"gpu-a-{run}", f"gpu-b-{run}"]
    other_nodes = [f"cpu-{run}", f"gpu-other-pool-{run}"]
    osvc_name = example["metadata"]["name"]

    try:
        # 1. install: namespaces, then everything the chart renders, as cluster admin.
        create_namespace(cluster, release_ns)
        create_namespace(cluster, apps_ns)
        kubectl(cluster, "apply", "--server-side", "-f", str(rendered))
        cluster.wait_crd_established(CRD_NAME)
        res = subprocess.run(
            ["bash", str(ROOT / "charts" / "upgrade-crds.sh")],
            env=cluster.env(),
            capture_output=True,
            text=True,
            check=False,
            timeout=120,
        )
        assert res.returncode == 0, res.stderr
        assert f"customresourcedefinition.apiextensions.k8s.io/{CRD_NAME} established" in (
            res.stderr
        )

        # The chart's RBAC, as the API server sees it for the operator's ServiceAccount.
        watched = apps_ns
        for verb, resource in [
            ("watch", "omniservices.horizonserve.io"),
            ("patch", "omniservices.horizonserve.io"),
            ("patch", "omniservices.horizonserve.io/status"),
            ("create", "pods"),
            ("delete", "pods"),
            ("create", "roles.rbac.authorization.k8s.io"),
            ("create", "rolebindings.rbac.authorization.k8s.io"),
            ("create", "serviceaccounts"),
            ("create", "events"),
        ]:
            assert can_i(cluster, sa_user, verb, resource, watched), (verb, resource)
        assert can_i(cluster, sa_user, "watch", "nodes")
        # kopf scans CRDs only cluster-wide.
        crds = can_i(cluster, sa_user, "list", "customresourcedefinitions")
        assert crds is (mode == "cluster-wide")
        # `get` on secrets: a referenced Secret's label, read as metadata; never list/watch.
        assert can_i(cluster, sa_user, "get", "secrets", watched)
        for verb, resource, ns in [
            ("list", "secrets", watched),
            ("watch", "secrets", watched),
            ("patch", "nodes", ""),
            ("delete", "omniservices.horizonserve.io", watched),
            ("create", "clusterroles.rbac.authorization.k8s.io", ""),
            ("escalate", "roles.rbac.authorization.k8s.io", watched),
        ]:
            assert not can_i(cluster, sa_user, verb, resource, ns), (verb, resource)
        if mode == "namespaced":
            assert not can_i(cluster, sa_user, "create", "pods", "default")
            assert not can_i(cluster, sa_user, "create", "configmaps", "default")
            assert not can_i(cluster, sa_user, "watch", "omniservices.horizonserve.io", "default")
            # list (+ patch) everywhere only for releasing a cluster-wide install's finalizers.
            assert can_i(cluster, sa_user, "list", "omniservices.horizonserve.io", "default")
        # kopf reads no namespaces in either mode (one namespace: no scanning).
        assert not can_i(cluster, sa_user, "list", "namespaces")

        # 3a. GPU nodes: two in the example's pool, one GPU-less, one in another pool.
        for name in wanted_nodes:
            create_node(cluster, gpu_node(name, pool, gpus=1))
        create_node(cluster, gpu_node(other_nodes[0], pool, gpus=0))
        create_node(cluster, gpu_node(other_nodes[1], {**run_label, "pool": "x"}, gpus=1))

        # 2. the operator, with the ServiceAccount's own token.
        kubeconfig = service_account_kubeconfig(
            cluster, release_ns, sa_name, tmp_path / "operator.kubeconfig"
        )
        with operator_process(deployment, kubeconfig, tmp_path) as (proc, log, liveness):

            def up() -> bool:
                assert proc.poll() is None, f"operator exited {proc.returncode}:\n{log_tail(log)}"
                return healthy(liveness)

            wait_for("the operator's liveness endpoint", up, timeout=90)

            # 3b. an example OmniService, applied as a user would.
            kubectl(cluster, "apply", "-n", apps_ns, "-f", "-", input=json.dumps(example))
            osvc = kubectl_json(cluster, "get", "omniservice", osvc_name, "-n", apps_ns)

            def serving_pods() -> list[dict[str, Any]]:
                assert proc.poll() is None, f"operator exited {proc.returncode}:\n{log_tail(log)}"
                items = kubectl_json(cluster, "get", "pods", "-n", apps_ns, "-l", SERVING_SELECTOR)[
                    "items"
                ]
                nodes = sorted(
                    p["metadata"]["annotations"]["horizonserve.io/node-name"] for p in items
                )
                return items if nodes == sorted(wanted_nodes) else []

            try:
                pods = wait_for("one serving pod per matching GPU node", serving_pods, 90)
            except AssertionError as exc:
                raise AssertionError(f"{exc}\noperator log:\n{log_tail(log)}") from None
            for pod in pods:
                spec = pod["spec"]
                assert not (spec.get("hostNetwork") or spec.get("hostPID") or spec.get("hostIPC"))
                for c in spec["containers"] + spec.get("initContainers", []):
                    assert not (c.get("securityContext") or {}).get("privileged"), c["name"]
                (ref,) = pod["metadata"]["ownerReferences"]
                assert ref["uid"] == osvc["metadata"]["uid"] and ref["kind"] == "OmniService"
                assert pod["spec"]["containers"][0]["image"] == (
                    "ghcr.io/horizonserve/horizonserve-serving:0.1.0"
                )
            # One identity for the OmniService's sidecars; each node its own ConfigMap.
            accounts = {pod["spec"]["serviceAccountName"] for pod in pods}
            assert accounts == {f"{osvc_name}-sidecar"}, accounts
            for pod in pods:
                assert pod["spec"]["automountServiceAccountToken"] is False
                stored = pod["spec"]["volumes"]
                (cm,) = [v["configMap"]["name"] for v in stored if v["name"] == "stored"]
                assert cm in names(cluster, "configmap", "-n", apps_ns), cm
            for kind in ("serviceaccount", "role", "rolebinding"):
                assert accounts <= set(names(cluster, kind, "-n", apps_ns)), kind

            def status_written() -> Any:
                obj = kubectl_json(cluster, "get", "omniservice", osvc_name, "-n", apps_ns)
                return (obj.get("status") or {}).get("nodesDesired") == len(wanted_nodes)

            wait_for("the operator to write the OmniService status", status_written, 60)

            # 4a. delete the OmniService while the operator runs (it holds a finalizer).
            kubectl(
                cluster,
                "delete",
                "omniservice",
                osvc_name,
                "-n",
                apps_ns,
                "--wait",
                "--timeout=60s",
            )

            def children_left() -> list[str]:
                left = []
                for kind in (
                    "pods",
                    "serviceaccounts",
                    "roles",
                    "rolebindings",
                    "configmaps",
                    "services",
                ):
                    found = names(cluster, kind, "-n", apps_ns, "-l", OPERATOR_CHILDREN)
                    left += [f"{kind}/{n}" for n in found]
                return left

            try:
                wait_for(
                    "the garbage collector to remove the operator's children",
                    lambda: not children_left(),
                    90,
                )
            except AssertionError as exc:
                raise AssertionError(
                    f"{exc}\nleft: {children_left()}\noperator log:\n{log_tail(log)}"
                ) from None
            # RBAC denials read 'User "…" cannot <verb> resource "…"' or, for a Role that
            # grants more than the operator holds, '… attempting to grant RBAC permissions …'.
            # Other 403s are admission races the operator retries (e.g. a pod created before the
            # ServiceAccount admission plugin sees the account it just made), not missing rules.
            forbidden = [
                line
                for line in log.read_text(errors="replace").splitlines()
                if ("cannot " in line and "resource" in line)
                or "attempting to grant RBAC permissions" in line
            ]
            assert not forbidden, "the operator hit missing RBAC:\n" + "\n".join(forbidden[:20])
        assert proc.returncode is not None

        # 4b. uninstall what the chart installed.
        kubectl(cluster, "delete", "-f", str(rendered), "--wait", "--timeout=120s")

        def nothing_left() -> list[str]:
            left = []
            for ns in (release_ns, apps_ns):
                for kind in ("deployments", "replicasets", "pods", "roles", "rolebindings"):
                    left += [f"{ns}/{kind}/{n}" for n in names(cluster, kind, "-n", ns)]
                sas = [n for n in names(cluster, "serviceaccounts", "-n", ns) if n != "default"]
                left += [f"{ns}/serviceaccount/{n}" for n in sas]
                secrets = kubectl_json(cluster, "get", "secrets", "-n", ns)["items"]
                left += [
                    f"{ns}/secret/{s['metadata']['name']}"
                    for s in secrets
                    if s["metadata"]
                    .get("annotations", {})
                    .get("kubernetes.io/service-account.name")
                    != "default"
                ]
            for kind in ("clusterroles", "clusterrolebindings"):
                left += [
                    f"{kind}/{n}"
                    for n in names(cluster, kind, "-l", f"app.kubernetes.io/instance={release}")
                ]
            if not crd_preexisting and crd_exists(cluster):
                left.append(f"crd/{CRD_NAME}")
            return left

        def clean() -> bool:
            return not nothing_left()

        try:
            wait_for("uninstall to leave nothing behind", clean, 90)
        except AssertionError as exc:
            raise AssertionError(f"{exc}\nleft behind: {nothing_left()}") from None
    finally:
        for node in wanted_nodes + other_nodes:
            cluster.kubectl("delete", "node", node, "--ignore-not-found", check=False)
        for ns in (apps_ns, release_ns):
            cluster.kubectl(
                "delete", "namespace", ns, "--ignore-not-found", "--wait=false", check=False
            )
        cluster.kubectl(
            "delete", "-f", str(rendered), "--ignore-not-found", "--wait=false", check=False
        )


# ------------------------------------------------------------------ helm install / uninstall


def test_helm_install_and_uninstall(kube_cluster: KubeCluster, helm_bin: str) -> None:
    """The real `helm install` / `helm uninstall` against the API server: the release
    installs (CRD from crds/ included) and prints NOTES; uninstall removes the release's
    objects and, as Helm does and the README says, keeps the CRD."""
    require_chart_crd()
    cluster = kube_cluster
    run = uuid.uuid4().hex[:6]
    release, ns = f"hs-helm-{run}", f"hs-helm-{run}"
    chart_crd = one(load_yaml_file(CHART / "crds" / CRD_FILE), "CustomResourceDefinition")
    env = cluster.env()
    crd_preexisting = crd_exists(cluster)

    def run_helm(*args: str) -> subprocess.CompletedProcess[str]:
        res = subprocess.run(
            [helm_bin, *args, "--kubeconfig", str(cluster.kubeconfig)],
            env=env,
            capture_output=True,
            text=True,
            check=False,
            timeout=180,
        )
        assert res.returncode == 0, f"helm {' '.join(args)}:\n{res.stdout}\n{res.stderr}"
        return res

    try:
        res = run_helm("install", release, str(CHART), "-n", ns, "--create-namespace")
        assert "STATUS: deployed" in res.stdout
        # NOTES.txt tells the user what to apply next.
        assert "manifests/examples/qwen2_5_omni.yaml" in res.stdout
        assert "kubectl get omniservices -A" in res.stdout
        assert "kubectl label node <gpu-node> horizonserve.io/pool=qwen-omni" in res.stdout
        assert "does NOT upgrade the OmniService CRD" in res.stdout
        assert crd_exists(cluster)
        fullname = f"{release}-horizonserve"  # the release name lacks the chart name
        assert names(cluster, "deployment", "-n", ns) == [fullname]
        assert f"{fullname}-{ns}" in names(cluster, "clusterrole")

        # Helm's values schema also guards upgrades.
        bad = subprocess.run(
            [helm_bin, "upgrade", release, str(CHART), "-n", ns, "--set", "replicaCount=2"],
            env=env,
            capture_output=True,
            text=True,
            check=False,
            timeout=120,
        )
        assert bad.returncode != 0 and "replicaCount" in bad.stderr

        # The CRD upgrade the README documents. Make the live CRD an "older" one (a printer
        # column less), see that `helm upgrade` leaves it so, and that charts/upgrade-crds.sh
        # brings it to the chart's version although Helm created it.
        def printer_columns() -> list[str]:
            crd = kubectl_json(cluster, "get", "crd", CRD_NAME)
            return [c["name"] for c in crd_version(crd)["additionalPrinterColumns"]]

        shipped = [c["name"] for c in crd_version(chart_crd)["additionalPrinterColumns"]]
        assert printer_columns() == shipped
        index = crd_index(chart_crd)
        kubectl(
            cluster,
            "patch",
            "crd",
            CRD_NAME,
            "--type=json",
            "-p",
            json.dumps(
                [{"op": "remove", "path": f"/spec/versions/{index}/additionalPrinterColumns/0"}]
            ),
        )
        assert printer_columns() == shipped[1:]
        run_helm("upgrade", release, str(CHART), "-n", ns, "--set", "operator.logLevel=DEBUG")
        assert printer_columns() == shipped[1:], "Helm does not upgrade CRDs"
        upgrade = [ROOT / "charts" / "upgrade-crds.sh"]
        dry = subprocess.run(
            ["bash", *map(str, upgrade)],
            env={**env, "DRY_RUN": "1"},
            capture_output=True,
            text=True,
            check=False,
            timeout=120,
        )
        assert dry.returncode == 0, dry.stderr
        assert printer_columns() == shipped[1:], "a dry run changes nothing"
        res = subprocess.run(
            ["bash", *map(str, upgrade)],
            env=env,
            capture_output=True,
            text=True,
            check=False,
            timeout=120,
        )
        assert res.returncode == 0, res.stderr
        assert printer_columns() == shipped

        run_helm("uninstall", release, "-n", ns, "--wait", "--timeout", "120s")

        def released() -> bool:
            return not (
                names(cluster, "deployment", "-n", ns)
                or [n for n in names(cluster, "serviceaccount", "-n", ns) if n != "default"]
                or names(cluster, "clusterrole", "-l", f"app.kubernetes.io/instance={release}")
                or names(
                    cluster, "clusterrolebinding", "-l", f"app.kubernetes.io/instance={release}"
                )
            )

        wait_for("helm uninstall to remove the release's objects", released, 60)
        assert crd_exists(cluster), "Helm keeps CRDs on uninstall"
    finally:
        subprocess.run(
            [helm_bin, "uninstall", release, "-n", ns, "--kubeconfig", str(cluster.kubeconfig)],
            env=env,
            capture_output=True,
            check=False,
            timeout=120,
        )
        if not crd_preexisting:
            cluster.kubectl("delete", "crd", CRD_NAME, "--ignore-not-found", "--wait", check=False)
        cluster.kubectl(
            "delete", "namespace", ns, "--ignore-not-found", "--wait=false", check=False
        )


# ------------------------------------------------------------------ the plain-YAML install


def test_plain_install_yaml_applies_and_deletes(kube_cluster: KubeCluster) -> None:
    """README's install without Helm: `kubectl apply --server-side -f manifests/install.yaml`
    creates the namespace, CRD, RBAC and Deployment; `kubectl delete -f` removes them all."""
    cluster = kube_cluster
    if crd_exists(cluster):
        pytest.fail(f"{CRD_NAME} already exists: an earlier test did not clean up after itself")
    docs = load_yaml_file(INSTALL_YAML)
    ns = one(docs, "Namespace")["metadata"]["name"]
    try:
        kubectl(cluster, "apply", "--server-side", "-f", str(INSTALL_YAML))
        cluster.wait_crd_established(CRD_NAME)
        for doc in docs:
            kind, name = doc["kind"].lower(), doc["metadata"]["name"]
            args = ["-n", doc["metadata"]["namespace"]] if "namespace" in doc["metadata"] else []
            kubectl(cluster, "get", kind, name, *args)
        # Re-applying (the README's upgrade without Helm) is a no-op that succeeds.
        kubectl(cluster, "apply", "--server-side", "--force-conflicts", "-f", str(INSTALL_YAML))
        kubectl(cluster, "delete", "-f", str(INSTALL_YAML), "--wait", "--timeout=120s")

        def gone() -> bool:
            left = cluster.kubectl("get", "namespace", ns, "--ignore-not-found", "-o", "name")
            return not left.stdout.strip() and not crd_exists(cluster)

        wait_for("the plain install to be deleted", gone, 120)
        cluster_scoped = [
            n
            for kind in ("clusterroles", "clusterrolebindings")
            for n in names(cluster, kind, "-l", "app.kubernetes.io/part-of=horizonserve")
        ]
        assert cluster_scoped == []
    finally:
        cluster.kubectl("delete", "-f", str(INSTALL_YAML), "--ignore-not-found", check=False)
