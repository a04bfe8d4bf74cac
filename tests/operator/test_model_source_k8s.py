"""spec.modelSource and spec.engineArgs on the real API server (tests/k8s): each source kind
gives the pod the operator builds (as the API server stored it), bad inputs are refused with
the field named, and the weights' progress reaches the status and the Events.

The operator runs in-process (kopf's KopfRunner); no kubelet runs, so the test plays it by
writing the pod status the kubelet would (the `weights` init container running, then done).
"""

from __future__ import annotations

import json
import shlex
import time
from collections.abc import Iterator
from typing import Any

import pytest
from kopf.testing import KopfRunner

from horizonserve.operator import builders, model_source

from .k8s_helpers import (
    OSVC_PATH,
    call,
    condition,
    create_node,
    delete_all_nodes,
    drop_namespace,
    get_osvc,
    install_crd,
    kopf_args,
    live,
    new_namespace,
    serving_pods,
    wait_for,
)

pytestmark = pytest.mark.k8s

HF = {"repo": "Qwen/Qwen2.5-Omni-3B", "revision": "main"}


@pytest.fixture(scope="module")
def cluster(kube_cluster: Any) -> Any:
    install_crd(kube_cluster)
    return kube_cluster


@pytest.fixture
def ns(cluster: Any, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    monkeypatch.setenv("KUBECONFIG", str(cluster.kubeconfig))
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    for name in (
        model_source.ALLOW_TRUST_REMOTE_CODE_ENV,
        model_source.IMAGE_VOLUMES_ENV,
        model_source.CACHE_MAX_ENV,
    ):
        monkeypatch.delenv(name, raising=False)
    delete_all_nodes(cluster)
    name = new_namespace(cluster)
    yield name
    drop_namespace(cluster, name)


def _osvc(name: str, pool: str, **spec: Any) -> dict:
    return {
        "apiVersion": "horizonserve.io/v1alpha1",
        "kind": "OmniService",
        "metadata": {"name": name},
        "spec": {
            "pipeline": "qwen2_5_omni",
            "backend": "vllm-omni",
            "nodeSelector": {"pool": pool},
            "calibration": {"mode": "skip"},
            **spec,
        },
    }


def _apply(cluster: Any, ns: str, obj: dict, check: bool = True) -> Any:
    # --validate=false: no client-side check; the API server's schema decides.
    return cluster.kubectl(
        "apply", "--validate=false", "-n", ns, "-f", "-", input=json.dumps(obj), check=check
    )


def _one_pod(cluster: Any, ns: str, osvc: str, timeout: float = 30.0) -> dict:
    def probe() -> dict | None:
        pods = live(serving_pods(cluster, ns, osvc))
        return pods[0] if len(pods) == 1 else None

    return wait_for(f"the serving pod of {osvc}", probe, timeout=timeout)


def _container(pod: dict, name: str) -> dict:
    for key in ("initContainers", "containers"):
        for c in pod["spec"].get(key) or ():
            if c["name"] == name:
                return c
    raise AssertionError(f"{pod['metadata']['name']}: no container {name}")


def _env(container: dict) -> dict[str, Any]:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container.get("env") or ()}


def _volumes(pod: dict) -> dict[str, dict]:
    return {v["name"]: v for v in pod["spec"]["volumes"]}


def _secret(cluster: Any, ns: str, name: str, labels: dict[str, str]) -> None:
    body = {"metadata": {"name": name, "labels": labels}, "stringData": {"token": "hf_test"}}
    status, resp = cluster.request("POST", f"/api/v1/namespaces/{ns}/secrets", body)
    assert status == 201, resp


def _ready_message(cluster: Any, ns: str, name: str, starts: str, t: float = 30.0) -> str:
    def probe() -> str | None:
        message = condition(get_osvc(cluster, ns, name), "Ready").get("message", "")
        return message if message.startswith(starts) or starts in message else None

    return wait_for(f"{name}: Ready message with {starts!r}", probe, timeout=t)


def test_each_source_kind_builds_its_pod(cluster: Any, ns: str) -> None:
    for pool in ("plain", "hf", "pvc", "image"):
        create_node(cluster, f"gpu-{pool}", labels={"pool": pool})
    _secret(cluster, ns, "hf-token", {"horizonserve.io/api-key": "allowed"})
    weights_image = "horizonserve/weights-qwen-omni:1"  # the default image's registry
    with KopfRunner(kopf_args(ns), timeout=30):
        _apply(cluster, ns, _osvc("plain", "plain", model="Qwen/Qwen2.5-Omni-7B"))
        hf = {"huggingFace": {**HF, "tokenSecret": {"name": "hf-token", "key": "token"}}}
        _apply(cluster, ns, _osvc("hf", "hf", modelSource=hf, engineArgs={"maxModelLen": 4096}))
        pvc = {"pvc": {"claimName": "models", "path": "qwen/omni"}}
        _apply(cluster, ns, _osvc("pvc", "pvc", modelSource=pvc))
        image = {"image": {"reference": weights_image}, "cache": {"sizeLimit": "30Gi"}}
        _apply(cluster, ns, _osvc("image", "image", modelSource=image))

        # A plain model id: the pod as before, the server fetches the model itself.
        plain = _one_pod(cluster, ns, "plain")
        assert _container(plain, "serving")["command"][:4] == [
            "vllm", "serve", "Qwen/Qwen2.5-Omni-7B", "--omni",
        ]  # fmt: skip
        assert "initContainers" not in plain["spec"]
        assert "HF_HUB_OFFLINE" not in _env(_container(plain, "serving"))
        assert condition(get_osvc(cluster, ns, "plain"), "WeightsReady") == {}

        # Hugging Face: the download in the `weights` init container, with the token.
        pod = _one_pod(cluster, ns, "hf")
        weights = _container(pod, "weights")
        assert weights["command"][3:6] == ["huggingface", "--repo", HF["repo"]]
        token = {"secretKeyRef": {"name": "hf-token", "key": "token"}}
        assert _env(weights)["HF_TOKEN"] == token
        assert _volumes(pod)["model-cache"]["emptyDir"] == {"sizeLimit": "64Gi"}
        serving = _container(pod, "serving")
        assert "HF_TOKEN" not in _env(serving) and _env(serving)["HF_HUB_OFFLINE"] == "1"
        assert serving["command"][-2:] == ["--max-model-len", "4096"]

        # PVC: mounted read-only, the model path served under the spec's name.
        pod = _one_pod(cluster, ns, "pvc")
        assert _volumes(pod)["model"]["persistentVolumeClaim"] == {
            "claimName": "models",
            "readOnly": True,
        }
        serving = _container(pod, "serving")
        mount = next(m for m in serving["volumeMounts"] if m["name"] == "model")
        assert mount["readOnly"] is True and mount["subPath"] == "qwen/omni"
        assert serving["command"][2] == model_source.MODEL_MOUNT
        assert "initContainers" not in pod["spec"]

        # OCI image without image volumes (this server is 1.20): copied into a bounded emptyDir.
        pod = _one_pod(cluster, ns, "image")
        assert _container(pod, "weights")["image"] == weights_image
        assert _volumes(pod)["model"]["emptyDir"] == {"sizeLimit": "30Gi"}

        # The pods as stored are what the operator built: no drift, so no replacement over
        # several resync passes (1 s each here).
        uids = {p["metadata"]["uid"] for p in live(serving_pods(cluster, ns))}
        assert len(uids) == 4
        time.sleep(5)
        assert {p["metadata"]["uid"] for p in live(serving_pods(cluster, ns))} == uids


def _calibration_steps(pod: dict) -> tuple[list[str], list[str]]:
    """The calibration init container's two commands (`sh -c 'A && exec B'`, after the
    artifact restore), split as the shell would."""
    command = _container(pod, "calibrate")["command"]
    cut = command.index("--") + 1
    assert command[cut : cut + 2] == ["sh", "-c"] and len(command) == cut + 3, command
    words = shlex.split(command[-1])
    amp = words.index("&&")
    assert words[amp + 1] == "exec"
    return words[:amp], words[amp + 2 :]


def test_vllm_omni_calibration_measures_the_engine_the_pod_serves(cluster: Any, ns: str) -> None:
    """A vLLM-Omni service's calibration container runs the reference calibration, then
    `calibrate --backend vllm-omni` with the serving command's model and flags (weights
    source, engineArgs) into the artifact directory the plugin reads, with the serving
    container's weights mount and offline settings and without its API key."""
    create_node(cluster, "gpu-cal", labels={"pool": "cal"})
    create_node(cluster, "gpu-ref", labels={"pool": "ref"})
    _secret(cluster, ns, "keys", {"horizonserve.io/api-key": "allowed"})
    pvc = {"pvc": {"claimName": "models", "path": "qwen/omni"}}
    args = {"maxModelLen": 4096, "enforceEager": True}
    with KopfRunner(kopf_args(ns), timeout=30):
        _apply(cluster, ns, _osvc("cal", "cal", modelSource=pvc, engineArgs=args,
                                  calibration={"mode": "auto"},
                                  apiKeySecret={"name": "keys", "key": "token"}))  # fmt: skip
        ref = _osvc("ref", "ref", calibration={"mode": "force"})
        ref["spec"]["backend"] = "reference"
        _apply(cluster, ns, ref)
        pod = _one_pod(cluster, ns, "cal")
        serving = _container(pod, "serving")["command"]
        reference, engine = _calibration_steps(pod)
        out = ["--out-dir", builders.ARTIFACT_MOUNT]
        assert reference == ["horizonserve", "calibrate", "--pipeline", "qwen2_5_omni",
                             "--mode", "auto", *out]  # fmt: skip
        # the served model (the mounted weights) and every flag after the listen address
        assert serving[2] == model_source.MODEL_MOUNT
        assert serving[8:] == ["--served-model-name", "Qwen/Qwen2.5-Omni-7B",
                               "--max-model-len", "4096", "--enforce-eager"]  # fmt: skip
        assert engine == [
            "horizonserve", "calibrate", "--backend", "vllm-omni", "--pipeline",
            "qwen2_5_omni", "--mode", "auto", *out, "--model", model_source.MODEL_MOUNT,
            "--serve-args=" + shlex.join(serving[8:]),
        ]  # fmt: skip
        calibrate = _container(pod, "calibrate")
        env = _env(calibrate)
        assert env["HF_HUB_OFFLINE"] == "1" and env["HORIZONSERVE_ARTIFACT_DIR"] == out[1]
        assert not {"VLLM_API_KEY", "HORIZONSERVE_API_KEY"} & set(env)
        assert "VLLM_API_KEY" in _env(_container(pod, "serving"))
        mounts = {m["name"]: m for m in calibrate["volumeMounts"]}
        assert mounts["model"]["readOnly"] is True and mounts["model"]["subPath"] == "qwen/omni"
        assert not mounts["artifacts"].get("readOnly")  # it writes the artifacts
        # The reference backend's calibration is the one command it was.
        ref_init = _container(_one_pod(cluster, ns, "ref"), "calibrate")["command"]
        assert ref_init[-9:] == ["--", "horizonserve", "calibrate", "--pipeline",
                                 "qwen2_5_omni", "--mode", "force", *out]  # fmt: skip
        # Stored as built: no drift, no replacement over several resync passes.
        uids = {p["metadata"]["uid"] for p in live(serving_pods(cluster, ns))}
        time.sleep(5)
        assert {p["metadata"]["uid"] for p in live(serving_pods(cluster, ns))} == uids


def test_token_secret_must_carry_the_allowing_label(cluster: Any, ns: str) -> None:
    create_node(cluster, "gpu-0", labels={"pool": "a"})
    _secret(cluster, ns, "hf-token", {})
    source = {"huggingFace": {**HF, "tokenSecret": {"name": "hf-token"}}}
    with KopfRunner(kopf_args(ns), timeout=30):
        _apply(cluster, ns, _osvc("gated", "a", modelSource=source))
        field = "spec.modelSource.huggingFace.tokenSecret.name"
        message = _ready_message(cluster, ns, "gated", field)
        assert "horizonserve.io/api-key=allowed" in message
        assert live(serving_pods(cluster, ns, "gated")) == []
        # Whoever may read the Secret allows it: the pod follows.
        status, resp = call(
            cluster,
            "PATCH",
            f"/api/v1/namespaces/{ns}/secrets/hf-token",
            {"metadata": {"labels": {"horizonserve.io/api-key": "allowed"}}},
        )
        assert status == 200, resp
        _one_pod(cluster, ns, "gated")


@pytest.mark.parametrize(
    ("source", "args", "fields"),
    [
        (None, {"gpuMemoryUtilization": 1.5, "dtype": "int3"},
         ["spec.engineArgs.gpuMemoryUtilization", "spec.engineArgs.dtype"]),
        ({"image": {"reference": "r.example/w:1", "path": "models"}}, None,
         ["spec.modelSource.image.path"]),
        ({"pvc": {"claimName": "Models!"}, "cache": {"sizeLimit": "0"}}, None,
         ["spec.modelSource.pvc.claimName", "spec.modelSource.cache.sizeLimit"]),
        ({"huggingFace": {"revision": "--force"}}, {"maxModelLen": "8k"},
         ["spec.modelSource.huggingFace.revision", "spec.engineArgs.maxModelLen"]),
    ],
)  # fmt: skip
def test_the_schema_refuses_bad_values_naming_the_field(
    cluster: Any, source: dict | None, args: dict | None, fields: list[str]
) -> None:
    ns = new_namespace(cluster)
    spec: dict[str, Any] = {}
    if source is not None:
        spec["modelSource"] = source
    if args is not None:
        spec["engineArgs"] = args
    res = _apply(cluster, ns, _osvc("bad", "a", **spec), check=False)
    assert res.returncode != 0
    for field in fields:
        assert field in res.stderr, res.stderr
    status, body = cluster.request("GET", OSVC_PATH.format(ns=ns))
    assert status == 200 and body["items"] == []


def test_what_the_schema_cannot_say_is_refused_by_the_operator(cluster: Any, ns: str) -> None:
    """Two kinds at once, --trust-remote-code the chart does not allow, a source on the
    reference backend: the API server stores them (no CEL on 1.20, and this test runs no
    webhook); the operator says Ready=False with the field and creates no pod."""
    create_node(cluster, "gpu-0", labels={"pool": "a"})
    cases = {
        "two": ({"modelSource": {"pvc": {"claimName": "m"}, "huggingFace": HF}},
                "spec.modelSource: set exactly one of huggingFace, pvc or image"),
        "trust": ({"engineArgs": {"trustRemoteCode": True}},
                  "spec.engineArgs.trustRemoteCode: refused here"),
        "ref": ({"backend": "reference", "modelSource": {"pvc": {"claimName": "m"}}},
                "spec.modelSource: the reference backend"),
    }  # fmt: skip
    with KopfRunner(kopf_args(ns), timeout=30):
        for name, (spec, _) in cases.items():
            _apply(cluster, ns, _osvc(name, "a", **spec))
        for name, (_, message) in cases.items():
            ready = wait_for(
                f"{name}: Ready=False InvalidSpec",
                lambda n=name: (
                    (c := condition(get_osvc(cluster, ns, n), "Ready")).get("reason")
                    == "InvalidSpec"
                    and c
                ),
                timeout=30,
            )
            assert ready["message"].startswith(message), ready["message"]
        assert live(serving_pods(cluster, ns)) == []


def _kubelet_weights(cluster: Any, ns: str, pod: str, state: dict) -> None:
    """What the kubelet reports while the `weights` init container runs or after it ends."""
    body = {
        "status": {
            "phase": "Pending",
            "initContainerStatuses": [
                {
                    "name": "weights",
                    "image": "horizonserve:test",
                    "imageID": "",
                    "ready": "terminated" in state,
                    "restartCount": 0,
                    "state": state,
                }
            ],
        }
    }
    status, resp = call(cluster, "PATCH", f"/api/v1/namespaces/{ns}/pods/{pod}/status", body)
    assert status == 200, resp


def _events(cluster: Any, ns: str, name: str) -> list[tuple[str, str]]:
    status, body = cluster.request(
        "GET", f"/api/v1/namespaces/{ns}/events?fieldSelector=involvedObject.name={name}"
    )
    assert status == 200, body
    return [(e["type"], e["reason"]) for e in body["items"]]


def test_weights_progress_reaches_status_and_events(cluster: Any, ns: str) -> None:
    create_node(cluster, "gpu-0", labels={"pool": "a"})
    with KopfRunner(kopf_args(ns), timeout=30):
        _apply(cluster, ns, _osvc("omni", "a", modelSource={"huggingFace": HF}))
        pod = _one_pod(cluster, ns, "omni")["metadata"]["name"]

        def weights(reason: str) -> Any:
            def probe() -> dict | None:
                cond = condition(get_osvc(cluster, ns, "omni"), "WeightsReady")
                return cond if cond.get("reason") == reason else None

            return wait_for(f"WeightsReady reason {reason}", probe, timeout=30)

        assert weights("WeightsPending")["status"] == "False"
        _kubelet_weights(cluster, ns, pod, {"running": {"startedAt": "2026-01-01T00:00:00Z"}})
        cond = weights("WeightsDownloading")
        assert "downloading: gpu-0 for" in cond["message"], cond
        line = "Qwen/Qwen2.5-Omni-3B@main: 12 files, 6.90 GiB, downloaded in 212s"
        done = {"terminated": {"exitCode": 0, "reason": "Completed", "message": line}}
        _kubelet_weights(cluster, ns, pod, done)
        assert weights("WeightsReady")["status"] == "True"
        wait_for(
            "Normal Events for each step",
            lambda: (
                {("Normal", "WeightsDownloading"), ("Normal", "WeightsReady")}
                <= set(_events(cluster, ns, "omni"))
            ),
            timeout=30,
        )
        # A failed download: a Warning with the init container's last line.
        refused = "Qwen/x not found, or private and the token is missing or refused"
        failed = {"terminated": {"exitCode": 1, "reason": "Error", "message": refused}}
        _kubelet_weights(cluster, ns, pod, failed)
        cond = weights("WeightsFailed")
        assert f"gpu-0: {refused}" in cond["message"]
        wait_for(
            "a Warning Event",
            lambda: ("Warning", "WeightsFailed") in _events(cluster, ns, "omni"),
            timeout=30,
        )
