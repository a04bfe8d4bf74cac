"""Fast unit tests of the handler steps against kmock's Kubernetes emulator.

These check which API requests a step makes (and which it does not). Behaviour against a real
API server (schema validation, garbage collection, watches, restarts) is in test_k8s_*.py.
"""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Any

import kmock
import pytest
import pytest_asyncio

from horizonserve.operator import controller, handlers, settings
from horizonserve.operator.builders import Owner, calibration_key
from horizonserve.operator.kube import Kube, KubeError, _resource_of
from horizonserve.operator.nodes import GpuNode
from horizonserve.operator.nodestate import node_state
from horizonserve.operator.pods import pod_state

pytestmark = pytest.mark.asyncio

OWNER = Owner(name="svc", namespace="ns", uid="uid-1")
SPEC = {"pipeline": "qwen2_5_omni", "backend": "reference", "allGpuNodes": True}
PODS = kmock.resource("v1/pods")
CONFIGMAPS = kmock.resource("v1/configmaps")
ROLES = kmock.resource("rbac.authorization.k8s.io/v1/roles")
OSVCS = kmock.resource("horizonserve.io/v1alpha1/omniservices")
KEY = calibration_key("Qwen/Qwen2.5-Omni-7B", {})


def _body(spec: dict | None = None) -> dict:
    meta = {"name": "svc", "namespace": "ns", "uid": OWNER.uid, "generation": 1,
            "creationTimestamp": "2026-01-01T00:00:00Z"}  # fmt: skip
    return {"metadata": meta, "spec": spec or SPEC}


def _nodes(*names: str) -> dict[str, list[GpuNode]]:
    return {n: [GpuNode(n, {})] for n in names}


@pytest_asyncio.fixture
async def state(kmock: kmock.KubernetesEmulator) -> Any:
    for res in ("v1/pods", "v1/serviceaccounts", "v1/configmaps", "v1/services"):
        kmock.resources[res] = {}
    for res in ("roles", "rolebindings"):
        kmock.resources[f"rbac.authorization.k8s.io/v1/{res}"] = {}
    kmock.resources["horizonserve.io/v1alpha1/omniservices"] = {}
    kmock.objects[OSVCS, "ns", "svc"] = _body()
    kube = Kube(str(kmock.url))
    st = controller.OperatorState(settings.OperatorConfig(serving_image="img:1"), kube)
    yield st
    await kube.close()


def _index_from_kmock(kmock: kmock.KubernetesEmulator) -> dict[tuple[str, str], list]:
    """What kopf's pod index would hold: the emulator's live pods as PodState."""
    pods = []
    for (res, _ns, _name), obj in kmock.objects.items():
        if res == PODS and not obj.deleted:
            raw = obj.raw
            pods.append(pod_state(raw["metadata"], raw.get("status") or {}, raw.get("spec")))
    return {("ns", "svc"): pods}


def _states_from_kmock(kmock: kmock.KubernetesEmulator) -> dict[tuple[str, str], list]:
    """What kopf's ConfigMap index would hold."""
    states = [
        node_state(obj.raw["metadata"], obj.raw.get("data"))
        for (res, _ns, _name), obj in kmock.objects.items()
        if res == CONFIGMAPS and not obj.deleted
    ]
    return {("ns", "svc"): states}


def _ix(kmock: kmock.KubernetesEmulator, *nodes: str) -> controller.Indices:
    return controller.Indices(_nodes(*nodes), _index_from_kmock(kmock), _states_from_kmock(kmock))


def _live_pods(kmock: kmock.KubernetesEmulator) -> set[str]:
    objects = kmock.objects.items()
    return {name for (res, _, name), obj in objects if res == PODS and not obj.deleted}


async def test_first_pass_creates_rbac_then_one_pod_per_node(kmock, state) -> None:
    result = await controller.sync_pods(state, OWNER, SPEC, _nodes("g1", "g2", "g3"), {})
    assert result is not None and sorted(result.create) == ["g1", "g2", "g3"]
    assert _live_pods(kmock) == {"svc-g1", "svc-g2", "svc-g3"}
    kinds = [_resource_of(r.url.path) for r in kmock["post"]]
    first_pod = kinds.index("pods")
    assert sorted(kinds[:first_pod]) == sorted(
        ["configmaps"] * 3 + ["services", "serviceaccounts", "rolebindings", "roles"]
    )  # every node's ConfigMap and the shared identity before any pod
    role = kmock.objects[ROLES, "ns", "svc-sidecar"].raw
    (rule,) = role["rules"]
    assert rule["verbs"] == ["patch"] and len(rule["resourceNames"]) == 3  # its ConfigMaps only
    assert all(name.startswith("svc-g") for name in rule["resourceNames"])
    assert state.kube.requests["POST pods"] == 3
    # Per node: one ConfigMap and one pod; the identity is per OmniService.
    assert len(kinds) == 3 * 2 + 4


async def test_second_pass_without_index_update_makes_no_requests(kmock, state) -> None:
    await controller.sync_pods(state, OWNER, SPEC, _nodes("g1", "g2"), {})
    before = len(kmock)
    # The watch has not delivered the pods yet: expectations prevent duplicate creates.
    again = await controller.sync_pods(state, OWNER, SPEC, _nodes("g1", "g2"), {})
    assert again is not None and again.empty
    assert len(kmock) == before


async def test_converged_pass_is_silent_and_node_removal_deletes_its_pod(kmock, state) -> None:
    await controller.sync_pods(state, OWNER, SPEC, _nodes("g1", "g2"), {})
    for name in ("svc-g1", "svc-g2"):  # the emulator assigns no uids; the API server would
        kmock.objects[PODS, "ns", name].patch({"metadata": {"uid": f"uid-{name}"}})
    ix = _ix(kmock, "g1", "g2")
    before = len(kmock)
    again = await controller.sync_pods(state, OWNER, SPEC, ix.nodes, ix.pods, ix.states)
    assert again.empty
    assert len(kmock) == before
    result = await controller.sync_pods(state, OWNER, SPEC, _nodes("g1"), ix.pods, ix.states)
    assert [p.name for p in result.delete] == ["svc-g2"]
    assert _live_pods(kmock) == {"svc-g1"}
    (delete,) = kmock["delete"]
    assert delete.data["preconditions"] == {"uid": "uid-svc-g2"}  # spares a same-named successor
    # Once the pod is gone, the node's ConfigMap stays for the grace period (a drain keeps
    # the calibration), then goes; the shared identity stays.
    ix = _ix(kmock, "g1")
    await controller.sync_pods(state, OWNER, SPEC, ix.nodes, ix.pods, ix.states)
    assert sorted(_resource_of(r.url.path) for r in kmock["delete"]) == ["pods"]
    state.config = dataclasses.replace(state.config, node_state_grace_s=0.001)
    await asyncio.sleep(0.01)
    ix = _ix(kmock, "g1")
    await controller.sync_pods(state, OWNER, SPEC, ix.nodes, ix.pods, ix.states)
    gone = sorted(_resource_of(r.url.path) for r in kmock["delete"])
    assert gone == ["configmaps", "pods"]


async def test_restart_with_existing_pods_creates_nothing(kmock, state) -> None:
    await controller.sync_pods(state, OWNER, SPEC, _nodes("g1", "g2"), {})
    ix = _ix(kmock, "g1", "g2")
    fresh = controller.OperatorState(state.config, state.kube)  # a restarted operator
    posts = len(kmock["post"])
    result = await controller.sync_pods(fresh, OWNER, SPEC, ix.nodes, ix.pods, ix.states)
    assert result.empty
    # The Service, ServiceAccount, RoleBinding and Role met 409 (then a GET each: ours)
    assert len(kmock["post"]) == posts + 4
    assert _live_pods(kmock) == {"svc-g1", "svc-g2"}


async def test_create_conflict_with_our_own_pod_is_not_an_error(kmock, state) -> None:
    ref = {"kind": "OmniService", "name": "svc", "uid": OWNER.uid, "controller": True}
    kmock.objects[PODS, "ns", "svc-g1"] = {
        "metadata": {"name": "svc-g1", "namespace": "ns", "ownerReferences": [ref]}
    }
    result = await controller.sync_pods(state, OWNER, SPEC, _nodes("g1"), {})
    assert result.create == ("g1",)
    assert len(kmock[PODS]["post"]) == 1
    assert state.services[OWNER.uid].errors == ()


async def test_pod_name_taken_by_a_stranger_is_reported(kmock, state) -> None:
    kmock.objects[PODS, "ns", "svc-g1"] = {"metadata": {"name": "svc-g1", "namespace": "ns"}}
    await controller.sync_pods(state, OWNER, SPEC, _nodes("g1"), {})
    (error,) = state.services[OWNER.uid].errors
    assert "svc-g1 is taken by a pod that this OmniService does not own" in error
    patch = controller.status_patch(state, OWNER, _body(), {}, controller.Indices(_nodes("g1"), {}))
    nodes_ready = next(c for c in patch["conditions"] if c["type"] == "NodesReady")
    assert nodes_ready["reason"] == "PodCreationFailed"


async def test_spec_update_replaces_outdated_pods(kmock, state) -> None:
    await controller.sync_pods(state, OWNER, SPEC, _nodes("g1"), {})
    index = _index_from_kmock(kmock)
    new_spec = {**SPEC, "policy": "edf"}
    result = await controller.sync_pods(state, OWNER, new_spec, _nodes("g1"), index)
    assert [p.name for p in result.delete] == ["svc-g1"] and result.create == ()
    assert _live_pods(kmock) == set()
    # Once the old pod is gone from the index, the new one is created.
    result = await controller.sync_pods(state, OWNER, new_spec, _nodes("g1"), {})
    assert result.create == ("g1",)
    (pod,) = [o.raw for (r, _, _), o in kmock.objects.items() if r == PODS and not o.deleted]
    assert '"policy":"edf"' in pod["spec"]["containers"][0]["env"][0]["value"]


async def test_invalid_spec_leaves_pods_alone(kmock, state) -> None:
    await controller.sync_pods(state, OWNER, SPEC, _nodes("g1"), {})
    before = len(kmock)
    bad = {**SPEC, "slo": {"classOverrides": {"poetry": 2}}}
    assert await controller.sync_pods(state, OWNER, bad, _nodes("g1", "g2"), {}) is None
    assert len(kmock) == before
    patch = controller.status_patch(
        state, OWNER, _body(bad), {}, controller.Indices(_nodes("g1"), {})
    )
    ready = next(c for c in patch["conditions"] if c["type"] == "Ready")
    assert ready["reason"] == "InvalidSpec"
    assert ready["message"].startswith("spec.slo.classOverrides.poetry:")


async def test_api_errors_are_reported_not_raised(kmock, state) -> None:
    kmock["post", PODS] << 403 << {"kind": "Status", "message": "forbidden by policy"}
    result = await controller.sync_pods(state, OWNER, SPEC, _nodes("g1"), {})
    assert result.create == ("g1",)
    assert state.services[OWNER.uid].expectations.apply([], 0.0) == []  # will retry


async def test_kube_error_carries_the_server_message(kmock) -> None:
    kube = Kube(str(kmock.url))
    kmock["get /api/v1/namespaces/ns/pods/x"] << 500 << {"message": "etcd on fire"}
    with pytest.raises(KubeError, match="etcd on fire"):
        await kube.request("GET", "/api/v1/namespaces/ns/pods/x")
    await kube.close()


async def test_reconciler_loop_wakes_on_node_events_and_stops(kmock, state) -> None:
    nodes: dict[str, list[GpuNode]] = {}
    body = _body()

    class Stop:
        flag = False

        def __bool__(self) -> bool:
            return self.flag

    stop = Stop()
    task = asyncio.create_task(
        controller.run_reconciler(state, OWNER, body, lambda: controller.Indices(nodes, {}), stop)
    )
    await asyncio.sleep(0.2)
    assert _live_pods(kmock) == set()
    node = GpuNode("g9", {})
    nodes["g9"] = [node]
    state.node_event(node)  # what the indexer does
    for _ in range(50):
        if _live_pods(kmock):
            break
        await asyncio.sleep(0.05)
    assert _live_pods(kmock) == {"svc-g9"}  # well before the 1 s resync
    stop.flag = True
    state.wake_all()
    await asyncio.wait_for(task, timeout=5)


async def test_handlers_module_registers_the_contract() -> None:
    from kopf._core.intents import registries

    registry = registries.get_default_registry()
    indexers = {h.id for h in registry._indexing.get_all_handlers()}
    assert {handlers.NODES_INDEX, handlers.PODS_INDEX, handlers.STATES_INDEX,
            handlers.CLAIMS_INDEX} <= indexers  # fmt: skip
    spawning = {h.id for h in registry._spawning.get_all_handlers()}
    assert {"reconcile_pods", "aggregate_status"} <= spawning

    def on_nodes(h: Any) -> bool:
        return "nodes" in (h.selector.any_name, h.selector.plural)

    assert [h.id for h in registry._indexing.get_all_handlers() if on_nodes(h)] == ["gpu_nodes"]
    # Nothing else touches Nodes: no change/spawn/watch handler, hence no annotation/finalizer.
    for reg in (registry._changing, registry._spawning, registry._watching):
        assert [h.id for h in reg.get_all_handlers() if on_nodes(h)] == []


async def test_settings_configure_and_env() -> None:
    import kopf

    s = kopf.OperatorSettings()
    settings.configure(s)
    assert s.peering.standalone is True
    assert s.persistence.finalizer == "horizonserve.io/finalizer"
    assert s.watching.server_timeout == 300 and s.watching.client_timeout > 300
    assert s.scanning.disabled is False  # cluster-wide: follows namespaces and CRDs
    assert s.background.cancellation_polling == 1.0  # a deletion waits ~1 s for a busy timer
    namespaced = kopf.OperatorSettings()
    settings.configure(namespaced, settings.OperatorConfig(namespace="serving"))
    assert namespaced.scanning.disabled is True  # no cluster-wide namespace listing
    cfg = settings.OperatorConfig.from_env(
        {
            "HORIZONSERVE_NAMESPACE": "serving",
            "HORIZONSERVE_SERVING_IMAGE": "img:2",
            "HORIZONSERVE_LOG_LEVEL": "debug",
        }
    )
    assert (cfg.namespace, cfg.serving_image, cfg.log_level) == ("serving", "img:2", "DEBUG")
    assert settings.OperatorConfig.from_env({}).namespace == ""
    with pytest.raises(ValueError, match="HORIZONSERVE_STATUS_INTERVAL"):
        settings.OperatorConfig.from_env({"HORIZONSERVE_STATUS_INTERVAL": "-1"})


async def test_deleting_omniservice_creates_nothing(kmock, state) -> None:
    meta = {**_body()["metadata"], "deletionTimestamp": "2026-01-01T00:00:01Z"}
    assert await controller.sync_pods(state, OWNER, SPEC, _nodes("g1"), {}, meta=meta) is None
    assert len(kmock["post"]) == 0


async def test_owner_live_asks_the_api_server(kmock, state) -> None:
    assert await controller.owner_live(state.kube, OWNER)
    # another object of the same name (deleted and created again) is not this owner
    assert not await controller.owner_live(state.kube, dataclasses.replace(OWNER, uid="uid-0"))
    kmock.objects[OSVCS, "ns", "svc"].patch(
        {"metadata": {"deletionTimestamp": "2026-01-01T00:00:01Z"}}
    )
    assert not await controller.owner_live(state.kube, OWNER)


async def test_a_pass_kopf_has_not_seen_deleted_yet_creates_no_pod(kmock, state) -> None:
    asked = []

    async def deleted_meanwhile() -> bool:  # the API server says so; kopf's meta does not yet
        asked.append(True)
        return False

    meta = _body()["metadata"]
    got = await controller.sync_pods(
        state, OWNER, SPEC, _nodes("g1", "g2"), {}, meta=meta, still_live=deleted_meanwhile
    )
    assert got is None and asked == [True]
    assert _live_pods(kmock) == set()
    # a pass with nothing to create does not ask
    ix = _ix(kmock, "g1", "g2")
    await controller.sync_pods(state, OWNER, SPEC, ix.nodes, ix.pods, ix.states, meta=meta)
    ix = _ix(kmock, "g1", "g2")
    assert len(_live_pods(kmock)) == 2
    again = await controller.sync_pods(
        state, OWNER, SPEC, ix.nodes, _index_from_kmock(kmock), ix.states, meta=meta,
        still_live=deleted_meanwhile,
    )  # fmt: skip
    assert again is not None and again.empty and asked == [True]


async def test_invalid_spec_and_pod_refusals_post_events_once(kmock, state) -> None:
    posted: list[tuple[str, str]] = []
    state.events = lambda owner, reason, message: posted.append((reason, message))
    bad = {**SPEC, "slo": {"classOverrides": {"poetry": 2}}}
    for _ in range(3):
        await controller.sync_pods(state, OWNER, bad, _nodes("g1"), {})
    assert [r for r, _ in posted] == ["InvalidSpec"]
    assert posted[0][1].startswith("spec.slo.classOverrides.poetry:")
    kmock["post", PODS] << 422 << {"kind": "Status", "message": "runtime class missing"}
    await controller.sync_pods(state, OWNER, SPEC, _nodes("g1"), {})
    assert posted[-1][0] == "PodCreationFailed" and "runtime class missing" in posted[-1][1]


async def test_webhook_refuses_with_the_field_and_passes_untouched_specs() -> None:
    import kopf

    from horizonserve.operator import webhook

    good = {"spec": SPEC}
    webhook.admit(good, None, None, "img:1")
    with pytest.raises(kopf.AdmissionError, match=r"^spec\.nodeSelector: empty"):
        webhook.admit({"spec": {"pipeline": "bagel"}}, None, None, "img:1")
    huge = {"spec": {**SPEC, "nodeSelector": {"k": "v" * 70_000}}}
    with pytest.raises(kopf.AdmissionError, match=r"^spec: \d+ bytes exceeds"):
        webhook.admit(huge, None, None, "img:1")
    stored_bad = {"spec": {"pipeline": "bagel", "node_selector": {}}}
    webhook.admit(stored_bad, stored_bad, None, "img:1")  # finalizer removal must pass
    webhook.admit(stored_bad, None, "status", "img:1")
