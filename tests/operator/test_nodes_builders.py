"""Which nodes an OmniService wants, and the objects built for them."""

from __future__ import annotations

import json

import pytest
import yaml

from horizonserve.operator import builders
from horizonserve.operator.nodes import GpuNode, gpu_count, gpu_node, is_gpu_node, select
from horizonserve.operator.translate import translate
from horizonserve.runtime.config import SERVING_CONFIG_ENV, ServingConfig

from .conftest import DATA
from .pss import restricted_violations

OWNER = builders.Owner(name="qwen-omni", namespace="serving", uid="1234-uid")


def _node(name: str, labels=None, taints=(), unschedulable=False, gpus=1) -> GpuNode:
    return GpuNode(name, labels or {}, tuple(taints), gpus, unschedulable)


@pytest.mark.parametrize(
    ("labels", "status", "count"),
    [
        ({}, {"allocatable": {"nvidia.com/gpu": "1"}}, 1),
        ({}, {"capacity": {"nvidia.com/gpu": "2"}}, 2),
        ({"nvidia.com/gpu.present": "true"}, {}, 1),
        ({"nvidia.com/gpu.present": "true", "nvidia.com/gpu.count": "4"}, {}, 4),
        ({}, {"capacity": {"cpu": "8"}}, 0),
        ({"nvidia.com/gpu.present": "false"}, {"allocatable": {"nvidia.com/gpu": "0"}}, 0),
    ],
)
def test_gpu_detection(labels: dict, status: dict, count: int) -> None:
    assert gpu_count(labels, status) == count
    assert is_gpu_node(labels, status) is (count > 0)


def test_gpu_node_keeps_only_blocking_non_lifecycle_taints() -> None:
    node = gpu_node(
        "n1",
        {"a": "b"},
        {
            "unschedulable": True,
            "taints": [
                {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"},
                {"key": "dedicated", "effect": "PreferNoSchedule"},
                {"key": "node.kubernetes.io/unschedulable", "effect": "NoSchedule"},
            ],
        },
        {"capacity": {"nvidia.com/gpu": "1"}},
    )
    assert node.taints == ({"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"},)
    assert node.unschedulable and node.labels == {"a": "b"}


def test_selection_by_labels_taints_and_cordon() -> None:
    spec, _ = translate({"pipeline": "bagel", "nodeSelector": {"pool": "omni"}})
    nodes = [
        _node("a", {"pool": "omni"}),
        _node("b", {"pool": "other"}),
        _node("c", {"pool": "omni"}, taints=[{"key": "nvidia.com/gpu", "effect": "NoSchedule"}]),
        _node("d", {"pool": "omni"}, taints=[{"key": "team", "value": "x", "effect": "NoExecute"}]),
        _node("e", {"pool": "omni"}, unschedulable=True),
        _node("f", {"pool": "omni"}, taints=[{"key": "maint", "effect": "NoSchedule"}]),
    ]
    selection = select(spec, nodes)
    # Untolerated NoSchedule (f): no new pod, a running one stays; NoExecute (d): goes.
    assert selection.keep == {"a", "c", "e", "f"}
    assert selection.create == {"a", "c"}
    spec2, _ = translate(
        {
            "pipeline": "bagel",
            "allGpuNodes": True,
            "tolerations": [{"key": "team", "operator": "Equal", "value": "x"}],
        }
    )
    sel2 = select(spec2, nodes)
    assert sel2.keep == {"a", "b", "c", "d", "e", "f"}
    assert sel2.create == {"a", "b", "d"}  # the gpu taint is no longer tolerated: c stays only


def test_no_execute_toleration_seconds_count_from_the_taint() -> None:
    spec, _ = translate({
        "pipeline": "bagel", "allGpuNodes": True,
        "tolerations": [{"key": "flaky", "operator": "Exists", "effect": "NoExecute",
                         "tolerationSeconds": 60}],
    })  # fmt: skip
    added = "2026-01-01T00:00:00Z"
    t0 = 1767225600.0  # that instant
    node = _node("n", taints=[{"key": "flaky", "effect": "NoExecute", "timeAdded": added}])
    assert select(spec, [node], now=t0 + 59).keep == {"n"}
    assert select(spec, [node], now=t0 + 60).keep == frozenset()
    # Without timeAdded: from when the operator first saw the taint.
    bare = _node("m", taints=[{"key": "flaky", "effect": "NoExecute"}])
    assert select(spec, [bare], now=100.0, since=lambda n, t: 90.0).keep == {"m"}
    assert select(spec, [bare], now=151.0, since=lambda n, t: 90.0).keep == frozenset()


def test_names_are_bounded_and_stable() -> None:
    assert builders.pod_name("svc", "node-1") == "svc-node-1"
    long = builders.pod_name("a-rather-long-omniservice-name", "gpu-node-" + "x" * 80 + ".local")
    assert len(long) == 63 and long == builders.pod_name(
        "a-rather-long-omniservice-name", "gpu-node-" + "x" * 80 + ".local"
    )
    other = builders.pod_name("a-rather-long-omniservice-name", "gpu-node-" + "x" * 80 + ".lan")
    assert other != long and other[:40] == long[:40]
    assert builders.label_value("n" * 100)[-9] == "-" and len(builders.label_value("n" * 100)) == 63
    owner = builders.Owner("svc", "ns", "uid-1")
    bound = builders.node_state_name(owner, "node-1", "node-uid", "abcd1234")
    assert bound.startswith("svc-node-1-") and len(bound) == len("svc-node-1-") + 12
    assert bound == builders.node_state_name(owner, "node-1", "node-uid", "abcd1234")
    # Another node object of the same name, another OmniService uid: another ConfigMap.
    assert bound != builders.node_state_name(owner, "node-1", "new-uid", "abcd1234")
    other = builders.Owner("svc", "ns", "uid-2")
    assert bound != builders.node_state_name(other, "node-1", "node-uid", "abcd1234")


def _pod(spec_overrides: dict | None = None, node: str = "gpu-7") -> dict:
    raw = yaml.safe_load((DATA / "omniservice.yaml").read_text())["spec"]
    raw.update(spec_overrides or {})
    spec, config = translate(raw)
    image = spec.image or "default:1"
    return builders.serving_pod(
        OWNER,
        spec,
        config,
        node,
        image=image,
        template_hash=builders.spec_hash(spec, config, image),
    )


def test_serving_pod_shape() -> None:
    pod = _pod()
    meta, spec = pod["metadata"], pod["spec"]
    assert meta["name"] == "qwen-omni-gpu-7" and meta["namespace"] == "serving"
    assert (
        meta["labels"].items()
        >= {
            "app.kubernetes.io/name": "horizonserve",
            "app.kubernetes.io/component": "serving",
            "app.kubernetes.io/instance": "qwen-omni",
            "horizonserve.io/omniservice": "qwen-omni",
            "horizonserve.io/node": "gpu-7",
        }.items()
    )
    (ref,) = meta["ownerReferences"]
    assert ref["kind"] == "OmniService" and ref["uid"] == "1234-uid" and ref["controller"]
    term = spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert term["nodeSelectorTerms"] == [
        {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["gpu-7"]}]}
    ]
    serving, sidecar = spec["containers"]
    assert serving["name"] == "serving" and sidecar["name"] == "sidecar"
    assert serving["resources"]["limits"]["nvidia.com/gpu"] == 1
    assert serving["resources"]["requests"] == {"cpu": "4", "memory": "32Gi", "nvidia.com/gpu": 1}
    assert "nvidia.com/gpu" not in sidecar["resources"].get("limits", {})
    assert sidecar["command"][:4] == ["python3", "-m", "horizonserve.operator.nodeagent", "upload"]
    assert sidecar["command"][-5:] == ["--", "horizonserve", "sidecar", "--host", "0.0.0.0"]
    assert sidecar["image"] == serving["image"] == "registry.example/horizonserve:test"
    # Explicit bind host and port (the contract with the serving side).
    assert serving["command"] == ["horizonserve", "serve", "--host", "0.0.0.0", "--port", "8000"]
    assert serving["livenessProbe"]["httpGet"]["path"] == "/health"
    assert serving["readinessProbe"]["httpGet"]["path"] == "/ready"
    state = builders.node_state_name(OWNER, "gpu-7", "", builders.calibration_key(
        "Qwen/Qwen2.5-Omni-7B", {}))  # fmt: skip
    for container in (serving, sidecar):
        assert {"readinessProbe", "livenessProbe"} <= set(container)
        env = {e["name"]: e for e in container["env"]}
        config = ServingConfig.model_validate_json(env[SERVING_CONFIG_ENV]["value"])
        assert config.pipeline == "qwen2_5_omni"
        assert env["HORIZONSERVE_POD_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"
        assert env["HORIZONSERVE_SUMMARY_CONFIGMAP"]["value"] == state
        assert {"mountPath": "/dev/shm", "name": "dshm"} in container["volumeMounts"]
    assert "startupProbe" in serving
    volumes = {v["name"]: v for v in spec["volumes"]}
    assert volumes["dshm"]["emptyDir"] == {"medium": "Memory", "sizeLimit": "16Gi"}
    assert not any("hostPath" in v for v in spec["volumes"])
    assert volumes["stored"]["configMap"] == {"name": state, "optional": True, "defaultMode": 0o444}
    assert spec["runtimeClassName"] == "nvidia"
    assert spec["serviceAccountName"] == "qwen-omni-sidecar"  # shared by the OmniService
    (init,) = spec["initContainers"]
    assert init["command"][-8:] == [
        "horizonserve", "calibrate", "--pipeline", "qwen2_5_omni",
        "--mode", "auto", "--out-dir", builders.ARTIFACT_MOUNT,
    ]  # fmt: skip
    assert init["resources"]["limits"]["nvidia.com/gpu"] == 1
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in spec[
        "tolerations"
    ]
    json.dumps(pod)  # plain JSON all the way down


def test_only_the_sidecar_holds_a_token() -> None:
    spec = _pod()["spec"]
    assert spec["automountServiceAccountToken"] is False
    token = {v["name"]: v for v in spec["volumes"]}["sidecar-token"]["projected"]["sources"]
    assert token[0]["serviceAccountToken"]["expirationSeconds"] == builders.TOKEN_EXPIRATION_S
    holders = [
        c["name"]
        for c in spec["containers"] + spec["initContainers"]
        if any(m["name"] == "sidecar-token" for m in c["volumeMounts"])
    ]
    assert holders == ["sidecar"]
    for c in spec["containers"] + spec["initContainers"]:
        writable = [m["name"] for m in c["volumeMounts"] if not m.get("readOnly")]
        expected = {"calibrate": ["dshm", "artifacts"]}.get(c["name"], ["dshm"])
        assert writable == expected, c["name"]  # the sidecar only reads the artifacts


def test_built_pod_passes_pod_security_restricted() -> None:
    pvc = {"pvc": {"claimName": "models"}}
    for overrides in (
        {},
        {"backend": "vllm-omni", "calibration": {"mode": "skip"}},
        {"backend": "vllm-omni", "modelSource": pvc},  # the engine calibration reads weights
    ):
        pod = _pod(overrides)
        assert restricted_violations(pod["spec"], pod["metadata"]["annotations"]) == []
    # The check is not vacuous: what the old pod had fails it.
    bad = _pod()["spec"]
    bad["volumes"].append({"name": "h", "hostPath": {"path": "/etc"}})
    bad["initContainers"][0]["securityContext"]["runAsUser"] = 0
    bad["initContainers"][0]["securityContext"].pop("runAsNonRoot")
    bad["containers"][0]["securityContext"]["capabilities"] = {"add": ["SYS_ADMIN"]}
    found = restricted_violations(bad)
    assert "volume h: hostPath" in found
    assert "calibrate: runAsUser 0" in found
    assert "serving: capabilities must drop ALL" in found


def test_api_key_secret_reaches_the_serving_container_only() -> None:
    pod = _pod({"backend": "vllm-omni", "apiKeySecret": {"name": "keys", "key": "token"}})
    serving, sidecar = pod["spec"]["containers"]
    env = {e["name"]: e for e in serving["env"]}
    ref = {"secretKeyRef": {"name": "keys", "key": "token"}}
    assert env["HORIZONSERVE_API_KEY"]["valueFrom"] == ref
    assert env["VLLM_API_KEY"]["valueFrom"] == ref
    assert "HORIZONSERVE_API_KEY" not in {e["name"] for e in sidecar["env"]}


def test_pod_variants() -> None:
    pod = _pod({"backend": "vllm-omni", "calibration": {"mode": "skip"}})
    serving = pod["spec"]["containers"][0]
    assert serving["command"][:4] == ["vllm", "serve", "Qwen/Qwen2.5-Omni-7B", "--omni"]
    assert serving["readinessProbe"]["httpGet"]["path"] == "/health"  # vLLM has no /ready
    assert "initContainers" not in pod["spec"]
    no_runtime = _pod({"runtimeClassName": None})
    assert "runtimeClassName" not in no_runtime["spec"]


def test_spec_hash_tracks_what_shapes_the_pod() -> None:
    def h(**changes) -> str:
        return _pod(changes)["metadata"]["labels"]["horizonserve.io/spec-hash"]

    base = h()
    assert h() == base
    assert h(nodeSelector={"pool": "x"}) == base  # where, not what
    assert h(rollout={"maxUnavailable": 3}) == base
    assert h(service={"internalTrafficPolicy": "Local"}) == base
    assert h(policy="fcfs") != base
    assert h(image="other:2") != base
    assert h(slo={"multiplier": 4}) != base


def test_gpu_discovery_labels_key_the_calibration() -> None:
    plain = builders.calibration_key("m", {})
    h200 = {"nvidia.com/gpu.product": "NVIDIA-H200", "nvidia.com/cuda.driver.major": "570"}
    keyed = builders.calibration_key("m", h200)
    assert keyed != plain and keyed == builders.calibration_key("m", dict(h200))
    upgraded = builders.calibration_key("m", {**h200, "nvidia.com/cuda.driver.major": "580"})
    assert upgraded != keyed  # a driver upgrade: a new ConfigMap, so the pod recalibrates
    assert builders.calibration_key("other", h200) != keyed
    assert "GPU NVIDIA-H200" in builders.calibration_for("m", h200)


def test_sidecar_rbac_is_the_omniservice_configmaps_only() -> None:
    sa = builders.sidecar_service_account(OWNER)
    role = builders.sidecar_role(OWNER, ["cm-b", "cm-a", "cm-a"])
    binding = builders.sidecar_role_binding(OWNER)
    name = "qwen-omni-sidecar"
    assert {o["metadata"]["name"] for o in (sa, role, binding)} == {name}
    assert role["rules"] == [
        {"apiGroups": [""], "resources": ["configmaps"], "verbs": ["patch"],
         "resourceNames": ["cm-a", "cm-b"]}
    ]  # fmt: skip
    # Always `<name>-sidecar`, also for the longest name (the node-state policy matches it).
    assert builders.sidecar_identity_name("a" * 63) == "a" * 63 + "-sidecar"
    # No ConfigMap: no rule at all (an empty resourceNames would mean every ConfigMap).
    assert builders.sidecar_role(OWNER, [])["rules"] == []
    assert sa["automountServiceAccountToken"] is False
    assert binding["roleRef"]["name"] == name
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": name, "namespace": "serving"}]
    cm = builders.node_state(OWNER, "gpu-a", "node-uid", "k1", "described")
    for obj in (sa, role, binding, cm):
        assert obj["metadata"]["ownerReferences"][0]["uid"] == "1234-uid"
        assert obj["metadata"]["labels"]["app.kubernetes.io/managed-by"] == "horizonserve-operator"
    assert cm["metadata"]["labels"]["horizonserve.io/calibration-key"] == "k1"


def test_toleration_seconds_reach_the_pod() -> None:
    tol = {"key": "maintenance", "operator": "Exists", "effect": "NoExecute",
           "tolerationSeconds": 300}  # fmt: skip
    pod = _pod({"tolerations": [tol]})
    assert tol in pod["spec"]["tolerations"]
    assert not any("toleration_seconds" in t for t in pod["spec"]["tolerations"])


def test_service_selects_the_serving_pods() -> None:
    spec, _ = translate({"pipeline": "bagel", "allGpuNodes": True,
                         "service": {"internalTrafficPolicy": "Local"}})  # fmt: skip
    svc = builders.service(OWNER, spec)
    assert svc["spec"]["selector"] == builders.selector_labels("qwen-omni")
    assert svc["spec"]["internalTrafficPolicy"] == "Local"
    assert svc["spec"]["ports"] == [
        {"name": "http", "port": 8000, "targetPort": "http", "protocol": "TCP"}
    ]
    assert builders.endpoint(OWNER) == "http://qwen-omni.serving.svc:8000"


def test_drift_is_what_the_operator_set_changed_not_what_admission_added() -> None:
    spec = _pod()["spec"]
    built = builders.trust_view(spec)

    def drift(change) -> bool:
        live = json.loads(json.dumps(spec))
        change(live)
        return builders.drifted(builders.trust_view(live), built)

    assert not drift(lambda s: None)

    # What the API server and the cluster's admission add at creation is not drift.
    def stored(s: dict) -> None:
        for c in s["containers"]:
            c.update(terminationMessagePath="/dev/termination-log", imagePullPolicy="Always")
        s.update(dnsPolicy="ClusterFirst", schedulerName="default-scheduler", priority=0)
        s["containers"].append({"name": "istio-proxy", "image": "istio/proxyv2:1"})
        s["volumes"].append({"name": "istio-envoy", "emptyDir": {}})
        s["securityContext"]["seLinuxOptions"] = {"level": "s0:c1,c2"}
        s["containers"][0]["securityContext"]["seLinuxOptions"] = {"level": "s0"}
        s["tolerations"].append({"key": "team", "operator": "Exists"})

    assert not drift(stored)
    # What a compromised pod, or someone with pod rights, could change: drift.
    assert drift(lambda s: s["containers"][0].update(image="evil:1"))
    assert drift(lambda s: s["initContainers"][0].update(image="evil:1"))
    assert drift(lambda s: s.update(activeDeadlineSeconds=1))
    assert drift(lambda s: s.update(ephemeralContainers=[{"name": "debug", "image": "x"}]))
    assert drift(lambda s: s["volumes"].append({"name": "h", "hostPath": {"path": "/"}}))
    assert drift(lambda s: s["containers"][0]["securityContext"].update(privileged=True))
    assert drift(lambda s: s.update(serviceAccountName="admin", automountServiceAccountToken=True))
    assert drift(lambda s: s.update(hostPID=True))
    assert drift(lambda s: s["containers"].pop(1))
