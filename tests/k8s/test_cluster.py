"""Proof that ``kube_cluster`` is a real, usable Kubernetes control plane for the operator:
CRDs with structural schemas / status subresource / printer columns, real kubectl, RBAC,
Nodes, Pods and the garbage collector (ownerReferences)."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from kubernetes import client, config
from kubernetes.client.rest import ApiException

from .cluster import KubeCluster

pytestmark = pytest.mark.k8s

GROUP = "k8stest.horizonserve.io"
VERSION = "v1alpha1"
PLURAL = "widgets"
KIND = "Widget"
CRD_NAME = f"{PLURAL}.{GROUP}"

CRD: dict[str, Any] = {
    "apiVersion": "apiextensions.k8s.io/v1",
    "kind": "CustomResourceDefinition",
    "metadata": {"name": CRD_NAME},
    "spec": {
        "group": GROUP,
        "scope": "Namespaced",
        "names": {"plural": PLURAL, "singular": "widget", "kind": KIND, "shortNames": ["wdg"]},
        "versions": [
            {
                "name": VERSION,
                "served": True,
                "storage": True,
                "subresources": {"status": {}},
                "additionalPrinterColumns": [
                    {"name": "Model", "type": "string", "jsonPath": ".spec.model"},
                    {"name": "Replicas", "type": "integer", "jsonPath": ".spec.replicas"},
                    {"name": "Phase", "type": "string", "jsonPath": ".status.phase"},
                    {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
                ],
                "schema": {
                    "openAPIV3Schema": {
                        "type": "object",
                        "properties": {
                            "spec": {
                                "type": "object",
                                "required": ["model"],
                                "properties": {
                                    "model": {"type": "string", "minLength": 1},
                                    "replicas": {"type": "integer", "minimum": 0, "default": 1},
                                    "sloMs": {"type": "number"},
                                },
                            },
                            "status": {
                                "type": "object",
                                "properties": {
                                    "phase": {"type": "string", "enum": ["Pending", "Ready"]},
                                    "readyReplicas": {"type": "integer"},
                                    "observedGeneration": {"type": "integer"},
                                },
                            },
                        },
                    }
                },
            }
        ],
    },
}


def wait_for(what: str, predicate: Callable[[], Any], timeout: float = 60.0) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        result = predicate()
        if result:
            return result
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(0.25)


def gone(read: Callable[[], Any]) -> bool:
    try:
        read()
    except ApiException as exc:
        if exc.status == 404:
            return True
        raise
    return False


@pytest.fixture(scope="module")
def api(kube_cluster: KubeCluster) -> Iterator[client.ApiClient]:
    api_client = config.new_client_from_config(config_file=str(kube_cluster.kubeconfig))
    yield api_client
    api_client.close()


@pytest.fixture
def namespace(kube_cluster: KubeCluster, api: client.ApiClient) -> Iterator[str]:
    name = f"t-{uuid.uuid4().hex[:10]}"
    core = client.CoreV1Api(api)
    core.create_namespace({"metadata": {"name": name}})
    kube_cluster.wait_for_default_service_account(name)
    yield name
    core.delete_namespace(name)


@pytest.fixture(scope="module")
def widget_crd(kube_cluster: KubeCluster, api: client.ApiClient) -> Iterator[str]:
    ext = client.ApiextensionsV1Api(api)
    # Raw JSON: the generated models of a newer client are stricter than a 1.20 server's answers.
    ext.create_custom_resource_definition(CRD, _preload_content=False)
    kube_cluster.wait_crd_established(CRD_NAME, 30)
    yield CRD_NAME
    ext.delete_custom_resource_definition(CRD_NAME, _preload_content=False)


def widget(name: str, **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": KIND,
        "metadata": {"name": name},
        "spec": spec,
    }


def test_control_plane_is_real(kube_cluster: KubeCluster) -> None:
    status, version = kube_cluster.request("GET", "/version")
    assert status == 200
    assert version["gitVersion"].startswith("v1.20."), version
    assert kube_cluster.request("GET", "/readyz")[0] == 200
    assert kube_cluster.kubectl("get", "--raw", "/readyz").stdout.strip() == "ok"
    namespaces = kube_cluster.kubectl("get", "namespaces", "-o", "name").stdout.split()
    assert {"namespace/default", "namespace/kube-system"} <= set(namespaces)
    # RBAC is enforced: the admin (system:masters) may do anything, impersonated users may not.
    assert kube_cluster.kubectl("auth", "can-i", "*", "*").stdout.strip() == "yes"
    denied = kube_cluster.kubectl(
        "auth", "can-i", "create", "pods", "--as=system:serviceaccount:default:default",
        check=False,
    )  # fmt: skip
    assert (denied.returncode, denied.stdout.strip()) == (1, "no")
    env = kube_cluster.env()
    assert env["KUBECONFIG"] == str(kube_cluster.kubeconfig)
    assert kube_cluster.server.startswith("https://127.0.0.1:")


def test_crd_status_subresource_and_printer_columns(
    kube_cluster: KubeCluster, api: client.ApiClient, widget_crd: str, namespace: str
) -> None:
    co = client.CustomObjectsApi(api)
    args = (GROUP, VERSION, namespace, PLURAL)

    body = widget("w1", model="qwen-omni", sloMs=250.0, bogus="pruned")
    body["status"] = {"phase": "Ready"}  # ignored on create: status is a subresource
    created = co.create_namespaced_custom_object(*args, body)
    assert created["spec"] == {"model": "qwen-omni", "replicas": 1, "sloMs": 250.0}  # default+prune
    assert "status" not in created
    assert created["metadata"]["generation"] == 1

    # The structural schema validates.
    with pytest.raises(ApiException) as err:
        co.create_namespaced_custom_object(*args, widget("bad", model="m", replicas="three"))
    assert err.value.status == 422
    with pytest.raises(ApiException) as err:
        co.create_namespaced_custom_object(*args, widget("bad", replicas=2))  # model required
    assert err.value.status == 422

    # Status through the status subresource; it does not bump the generation.
    patched = co.patch_namespaced_custom_object_status(
        *args, "w1", {"status": {"phase": "Ready", "readyReplicas": 1, "observedGeneration": 1}}
    )
    assert patched["status"]["phase"] == "Ready"
    with pytest.raises(ApiException) as err:
        co.patch_namespaced_custom_object_status(*args, "w1", {"status": {"phase": "Exploded"}})
    assert err.value.status == 422

    # A status change through the main resource is ignored; a spec change bumps the generation.
    co.patch_namespaced_custom_object(
        *args, "w1", {"spec": {"replicas": 3}, "status": {"phase": "Pending"}}
    )
    got = co.get_namespaced_custom_object(*args, "w1")
    assert got["spec"]["replicas"] == 3
    assert got["status"] == {"phase": "Ready", "readyReplicas": 1, "observedGeneration": 1}
    assert got["metadata"]["generation"] == 2

    # The real kubectl prints the CRD's printer columns.
    out = kube_cluster.kubectl("get", f"{PLURAL}.{GROUP}", "-n", namespace).stdout
    header, row = out.strip().splitlines()
    assert header.split() == ["NAME", "MODEL", "REPLICAS", "PHASE", "AGE"]
    assert row.split()[:4] == ["w1", "qwen-omni", "3", "Ready"]
    short = kube_cluster.kubectl("get", "wdg", "w1", "-n", namespace, "-o", "json").stdout
    assert json.loads(short)["status"]["phase"] == "Ready"


def test_garbage_collector_deletes_dependents_of_a_configmap(
    kube_cluster: KubeCluster, api: client.ApiClient, namespace: str
) -> None:
    core = client.CoreV1Api(api)
    node_name = f"edge-{namespace}"
    core.create_node(
        {
            "metadata": {"name": node_name, "labels": {"horizonserve.io/edge": "true"}},
            "status": {
                "capacity": {"cpu": "8", "memory": "32Gi", "pods": "110", "nvidia.com/gpu": "1"},
                "allocatable": {"cpu": "8", "memory": "32Gi", "pods": "110", "nvidia.com/gpu": "1"},
            },
        }
    )
    try:
        core.patch_node_status(
            node_name,
            {"status": {"conditions": [{"type": "Ready", "status": "True", "reason": "Test"}]}},
        )
        node = core.read_node(node_name)
        assert node.status.allocatable["nvidia.com/gpu"] == "1"
        assert {c.type: c.status for c in node.status.conditions}["Ready"] == "True"

        owner = core.create_namespaced_config_map(
            namespace, {"metadata": {"name": "owner"}, "data": {"k": "v"}}
        )
        owner_ref = {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "name": "owner",
            "uid": owner.metadata.uid,
        }

        def pod(name: str, node: str | None) -> dict[str, Any]:
            spec: dict[str, Any] = {"containers": [{"name": "c", "image": "busybox"}]}
            if node:
                spec["nodeName"] = node
            return {"metadata": {"name": name, "ownerReferences": [owner_ref]}, "spec": spec}

        core.create_namespaced_pod(namespace, pod("unscheduled", None))
        core.create_namespaced_pod(namespace, pod("on-node", node_name))
        bound = core.read_namespaced_pod("on-node", namespace)
        assert bound.spec.node_name == node_name
        assert bound.status.phase == "Pending"  # no kubelet: it never runs

        core.delete_namespaced_config_map("owner", namespace)
        wait_for(
            "GC to delete the unscheduled pod",
            lambda: gone(lambda: core.read_namespaced_pod("unscheduled", namespace)),
            60,
        )
        # A pod bound to a node is deleted gracefully: without a kubelet to confirm, it stays
        # Terminating until force-deleted.
        wait_for(
            "GC to delete the bound pod",
            lambda: core.read_namespaced_pod("on-node", namespace).metadata.deletion_timestamp,
            60,
        )
        core.delete_namespaced_pod("on-node", namespace, grace_period_seconds=0)
        wait_for(
            "force-deleted pod to vanish",
            lambda: gone(lambda: core.read_namespaced_pod("on-node", namespace)),
            30,
        )
    finally:
        core.delete_node(node_name)


def test_garbage_collector_deletes_dependents_of_a_custom_object(
    api: client.ApiClient, widget_crd: str, namespace: str
) -> None:
    co = client.CustomObjectsApi(api)
    core = client.CoreV1Api(api)
    owner = co.create_namespaced_custom_object(
        GROUP, VERSION, namespace, PLURAL, widget("owner", model="m")
    )
    core.create_namespaced_config_map(
        namespace,
        {
            "metadata": {
                "name": "dependent",
                "ownerReferences": [
                    {
                        "apiVersion": f"{GROUP}/{VERSION}",
                        "kind": KIND,
                        "name": "owner",
                        "uid": owner["metadata"]["uid"],
                        "controller": True,
                        "blockOwnerDeletion": True,
                    }
                ],
            },
            "data": {"k": "v"},
        },
    )
    co.delete_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, "owner")
    # The GC learns about new resource types on its 30 s discovery resync, and retries owner
    # look-ups with exponential backoff: for a CRD created moments ago this takes ~40 s (and
    # could take ~80 s). Install CRDs early in a session to get prompt GC.
    wait_for(
        "GC to delete the custom object's dependent",
        lambda: gone(lambda: core.read_namespaced_config_map("dependent", namespace)),
        150,
    )
