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
    ]
    selection = select(spec, nodes)
    assert selection.keep == {"a", "c", "e"}
    assert selection.create == {"a", "c"}
    spec2, _ = translate(
        {
            "pipeline": "bagel",
            "tolerations": [{"key": "team", "operator": "Equal", "value": "x"}],
        }
    )
    assert select(spec2, nodes).keep == {"a", "b", "d", "e"}  # gpu taint no longer tolerated


def test_names_are_bounded_and_stable() -> None:
    assert builders.pod_name("svc", "node-1") == "svc-node-1"
    long = builders.pod_name("a-rather-long-omniservice-name", "gpu-node-" + "x" * 80 + ".local")
    assert len(long) == 63 and long == builders.pod_name(
        "a-rather-long-omniservice-name", "gpu-node-" + "x" * 80 + ".local"
    )
    other = builders.pod_name("a-rather-long-omniservice-name", "gpu-node-" + "x" * 80 + ".lan")
    assert other != long and other[:40] == long[:40]
    assert builders.label_value("n" * 100)[-9] == "-" and len(builders.label_value("n" * 100)) == 63
    assert builders.node_account_name("svc") == "svc-node"


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
    assert sidecar["command"] == ["horizonserve", "sidecar"]
    assert sidecar["image"] == serving["image"] == "registry.example/horizonserve:test"
    assert serving["command"][:2] == ["horizonserve", "serve"]  # backend: reference
    for container in (serving, sidecar):
        assert {"readinessProbe", "livenessProbe"} <= set(container)
        env = {e["name"]: e for e in container["env"]}
        config = ServingConfig.model_validate_json(env[SERVING_CONFIG_ENV]["value"])
        assert config.pipeline == "qwen2_5_omni"
        assert env["HORIZONSERVE_POD_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"
        assert {"mountPath": "/dev/shm", "name": "dshm"} in container["volumeMounts"]
    assert "startupProbe" in serving
    volumes = {v["name"]: v for v in spec["volumes"]}
    assert volumes["dshm"]["emptyDir"] == {"medium": "Memory", "sizeLimit": "16Gi"}
    assert volumes["artifacts"]["hostPath"]["path"] == "/var/lib/horizonserve"
    assert spec["runtimeClassName"] == "nvidia"
    assert spec["serviceAccountName"] == "qwen-omni-node"
    (init,) = spec["initContainers"]
    assert init["command"] == [
        "horizonserve", "calibrate", "--pipeline", "qwen2_5_omni",
        "--mode", "auto", "--out-dir", builders.ARTIFACT_MOUNT,
    ]  # fmt: skip
    assert init["resources"]["limits"]["nvidia.com/gpu"] == 1
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in spec[
        "tolerations"
    ]
    json.dumps(pod)  # plain JSON all the way down


def test_pod_variants() -> None:
    pod = _pod({"backend": "vllm-omni", "calibration": {"mode": "skip", "persistent": False}})
    serving = pod["spec"]["containers"][0]
    assert serving["command"][:4] == ["vllm", "serve", "Qwen/Qwen2.5-Omni-7B", "--omni"]
    assert "initContainers" not in pod["spec"]
    assert {v["name"]: v for v in pod["spec"]["volumes"]}["artifacts"] == {
        "name": "artifacts",
        "emptyDir": {},
    }
    no_runtime = _pod({"runtimeClassName": None})
    assert "runtimeClassName" not in no_runtime["spec"]


def test_spec_hash_tracks_what_shapes_the_pod() -> None:
    def h(**changes) -> str:
        return _pod(changes)["metadata"]["labels"]["horizonserve.io/spec-hash"]

    base = h()
    assert h() == base
    assert h(nodeSelector={"pool": "x"}) == base  # where, not what
    assert h(rollout={"maxUnavailable": 3}) == base
    assert h(policy="fcfs") != base
    assert h(image="other:2") != base
    assert h(slo={"multiplier": 4}) != base


def test_sidecar_rbac_is_scoped_to_the_serving_pods() -> None:
    sa = builders.node_service_account(OWNER)
    role = builders.node_role(OWNER, ["qwen-omni-b", "qwen-omni-a"])
    binding = builders.node_role_binding(OWNER)
    assert sa["metadata"]["name"] == role["metadata"]["name"] == "qwen-omni-node"
    assert role["rules"] == [
        {
            "apiGroups": [""],
            "resources": ["pods"],
            "verbs": ["get", "patch"],
            "resourceNames": ["qwen-omni-a", "qwen-omni-b"],
        }
    ]
    assert builders.node_role(OWNER, [])["rules"] == []  # never "all pods"
    assert binding["roleRef"]["name"] == "qwen-omni-node"
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": "qwen-omni-node", "namespace": "serving"}
    ]
    for obj in (sa, role, binding):
        assert obj["metadata"]["ownerReferences"][0]["uid"] == "1234-uid"


def test_serving_pod_runs_without_extra_privilege() -> None:
    pod = _pod()["spec"]
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    containers = pod["containers"] + pod.get("initContainers", [])
    for c in containers:
        sc = c["securityContext"]
        assert sc["allowPrivilegeEscalation"] is False
        assert sc["capabilities"] == {"drop": ["ALL"]}
        assert sc["privileged"] is False
    sidecar = next(c for c in containers if c["name"] == "sidecar")["securityContext"]
    assert sidecar["runAsNonRoot"] and sidecar["readOnlyRootFilesystem"]
    serving = next(c for c in containers if c["name"] == "serving")["securityContext"]
    assert serving["runAsNonRoot"] and serving["runAsUser"] == builders.SERVING_UID
    assert "nvidia.com/gpu" not in str(next(c for c in containers if c["name"] == "sidecar"))
