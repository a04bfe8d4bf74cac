"""spec.modelSource and spec.engineArgs: validation, the pod-spec pieces, weights progress.

The pod is built by the operator's own builder (builders.serving_pod); the fetch helper runs
the real huggingface_hub against a real cache folder, offline; the copy script runs under the
real /bin/sh. The same specs on the real API server: test_model_source_k8s.py.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any, get_args

import pytest
import yaml
from pydantic.alias_generators import to_snake

from horizonserve.operator import builders, model_fetch, model_source, models
from horizonserve.operator.model_source import SourcePolicy, WeightsState, weights_state
from horizonserve.operator.pods import pod_state
from horizonserve.operator.translate import translate
from horizonserve.operator.webhook import refusal

from .pss import restricted_violations

OWNER = builders.Owner(name="omni", namespace="serving", uid="uid-1")
ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "manifests" / "examples"
BASE = {"pipeline": "qwen2_5_omni", "allGpuNodes": True, "backend": "vllm-omni"}
IMAGE = "registry.example/horizonserve:test"
HF = {"huggingFace": {"repo": "Qwen/Qwen2.5-Omni-3B", "revision": "main"}}


def _pod(extra: dict[str, Any]) -> dict:
    spec, config = translate({**BASE, "image": IMAGE, **extra})
    return builders.serving_pod(
        OWNER, spec, config, "gpu-1", image=IMAGE, template_hash="h", node_uid="n-uid"
    )


def _container(pod: dict, name: str) -> dict:
    for key in ("initContainers", "containers"):
        for c in pod["spec"].get(key) or ():
            if c["name"] == name:
                return c
    raise AssertionError(f"no container {name}")


def _env(container: dict) -> dict[str, Any]:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container.get("env") or ()}


def _volumes(pod: dict) -> dict[str, dict]:
    return {v["name"]: v for v in pod["spec"]["volumes"]}


def _refusal(extra: dict[str, Any]) -> str | None:
    return refusal({**BASE, **extra}, IMAGE)


# --- backward compatibility --------------------------------------------------------------


def test_plain_model_id_builds_the_same_pod_and_hash_as_before() -> None:
    spec, config = translate({**BASE, "model": "Qwen/Qwen2.5-Omni-7B"})
    # The new fields stay out of the dump when unset: the spec hash (and so the pods) of an
    # OmniService stored before them does not change.
    dumped = spec.model_dump(mode="json")
    assert "model_source" not in dumped and "engine_args" not in dumped
    pod = builders.serving_pod(OWNER, spec, config, "gpu-1", image=IMAGE, template_hash="h")
    serving = _container(pod, "serving")
    assert serving["command"][:4] == ["vllm", "serve", "Qwen/Qwen2.5-Omni-7B", "--omni"]
    assert "--served-model-name" not in serving["command"]
    assert not {"HF_HUB_OFFLINE", "HF_TOKEN"} & set(_env(serving))
    assert [c["name"] for c in pod["spec"].get("initContainers", ())] == ["calibrate"]
    assert not {"model", "model-cache"} & set(_volumes(pod))


# --- each kind's pod pieces ----------------------------------------------------------------


def test_hugging_face_downloads_in_an_init_container_and_serves_offline() -> None:
    token = {"name": "hf-token", "key": "token"}
    pod = _pod({"modelSource": {"huggingFace": {**HF["huggingFace"], "tokenSecret": token}}})
    init = pod["spec"]["initContainers"]
    assert [c["name"] for c in init] == ["weights", "calibrate"]  # weights first, no GPU
    weights = init[0]
    assert weights["image"] == IMAGE
    assert weights["command"][:4] == [
        "python3",
        "-m",
        "horizonserve.operator.model_fetch",
        "huggingface",
    ]
    assert weights["command"][4:] == [
        "--repo", "Qwen/Qwen2.5-Omni-3B", "--cache-dir", model_source.HF_HUB_DIR,
        "--revision", "main",
    ]  # fmt: skip
    assert "nvidia.com/gpu" not in json.dumps(weights["resources"])
    # The token reaches the init container alone.
    assert _env(weights)["HF_TOKEN"] == {"secretKeyRef": token}
    serving = _container(pod, "serving")
    assert "HF_TOKEN" not in _env(serving) and "HF_TOKEN" not in json.dumps(
        pod["spec"]["containers"]
    )
    assert _env(serving)["HF_HUB_OFFLINE"] == "1" and _env(serving)["TRANSFORMERS_OFFLINE"] == "1"
    assert _env(serving)["HF_HUB_CACHE"] == model_source.HF_HUB_DIR
    cmd = serving["command"]
    assert cmd[2] == "Qwen/Qwen2.5-Omni-3B" and cmd[cmd.index("--revision") + 1] == "main"
    # The repo differs from the pipeline's model: clients keep using the served name.
    assert cmd[cmd.index("--served-model-name") + 1] == "Qwen/Qwen2.5-Omni-7B"
    cache = _volumes(pod)["model-cache"]
    assert cache["emptyDir"] == {"sizeLimit": models.DEFAULT_MODEL_CACHE_SIZE}
    mounts = {m["name"]: m for m in serving["volumeMounts"]}
    assert mounts["model-cache"]["readOnly"] is True
    assert weights["volumeMounts"] == [
        {"name": "model-cache", "mountPath": model_source.CACHE_MOUNT}
    ]
    assert weights["securityContext"]["readOnlyRootFilesystem"] is True
    assert restricted_violations(pod["spec"], pod["metadata"]["annotations"]) == []


def test_hugging_face_cache_on_a_claim_keeps_the_download() -> None:
    source = {**HF, "cache": {"claimName": "hf-cache"}}
    pod = _pod({"modelSource": source})
    assert _volumes(pod)["model-cache"] == {
        "name": "model-cache",
        "persistentVolumeClaim": {"claimName": "hf-cache"},
    }


def test_pvc_is_mounted_read_only_and_served_offline() -> None:
    pod = _pod({"modelSource": {"pvc": {"claimName": "models", "path": "qwen/omni-7b"}}})
    assert _volumes(pod)["model"]["persistentVolumeClaim"] == {
        "claimName": "models",
        "readOnly": True,
    }
    serving = _container(pod, "serving")
    mount = next(m for m in serving["volumeMounts"] if m["name"] == "model")
    assert mount == {
        "name": "model",
        "mountPath": model_source.MODEL_MOUNT,
        "readOnly": True,
        "subPath": "qwen/omni-7b",
    }
    cmd = serving["command"]
    assert cmd[2] == model_source.MODEL_MOUNT
    assert cmd[cmd.index("--served-model-name") + 1] == "Qwen/Qwen2.5-Omni-7B"
    assert _env(serving)["HF_HUB_OFFLINE"] == "1"
    assert [c["name"] for c in pod["spec"]["initContainers"]] == ["calibrate"]  # nothing fetched
    assert restricted_violations(pod["spec"], pod["metadata"]["annotations"]) == []


def test_image_is_copied_into_a_bounded_empty_dir_without_image_volumes() -> None:
    ref = "registry.example/weights/qwen-omni:1"
    source = {"image": {"reference": ref, "path": "/models/qwen"}, "cache": {"sizeLimit": "30Gi"}}
    pod = _pod({"modelSource": source})  # HORIZONSERVE_IMAGE_VOLUMES unset: copy
    weights = pod["spec"]["initContainers"][0]
    assert weights["name"] == "weights" and weights["image"] == ref
    assert weights["command"][:2] == ["sh", "-c"]
    assert weights["command"][-2:] == ["/models/qwen", model_source.MODEL_MOUNT]
    assert _volumes(pod)["model"] == {"name": "model", "emptyDir": {"sizeLimit": "30Gi"}}
    serving = _container(pod, "serving")
    assert serving["command"][2] == model_source.MODEL_MOUNT
    assert restricted_violations(pod["spec"], pod["metadata"]["annotations"]) == []


def test_image_volume_where_the_cluster_supports_it(monkeypatch: pytest.MonkeyPatch) -> None:
    ref = "registry.example/weights/qwen-omni:1"
    source = {"image": {"reference": ref, "path": "/models/qwen", "pullPolicy": "IfNotPresent"}}
    monkeypatch.setenv(model_source.IMAGE_VOLUMES_ENV, "true")
    pod = _pod({"modelSource": source})
    assert _volumes(pod)["model"] == {
        "name": "model",
        "image": {"reference": ref, "pullPolicy": "IfNotPresent"},
    }
    assert [c["name"] for c in pod["spec"]["initContainers"]] == ["calibrate"]
    serving = _container(pod, "serving")
    assert serving["command"][2] == f"{model_source.MODEL_MOUNT}/models/qwen"
    # An image volume is not among the volume types Pod Security "restricted" lists: where a
    # namespace enforces it, leave modelSource.imageVolumes off (the copy passes).
    assert restricted_violations(pod["spec"]) == ["volume model: type ['image']"]


@pytest.mark.parametrize("version", ["1.25.0", "1.33.0", "1.37.0"])
def test_pods_of_every_kind_are_valid_kubernetes(
    version: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each kind's pod against Kubernetes' own schema (`kubernetes-validate --strict`,
    offline): the image volume from 1.33 on (ImageVolume), the rest on every version."""
    from tests.charts.chartlib import kubernetes_validate

    image = {"image": {"reference": "registry.example/w:1", "pullPolicy": "IfNotPresent"}}
    sources = [HF, {"pvc": {"claimName": "m", "path": "a/b"}}, image]
    pods = [_pod({"modelSource": s, "engineArgs": {"maxModelLen": 4096}}) for s in sources]
    if version != "1.25.0":
        monkeypatch.setenv(model_source.IMAGE_VOLUMES_ENV, "true")
        pods.append(_pod({"modelSource": image}))
    path = tmp_path / "pods.yaml"
    path.write_text(yaml.safe_dump_all(pods))
    res = kubernetes_validate(path, version)
    assert res.returncode == 0, res.stdout + res.stderr
    if version == "1.25.0":  # not vacuous: an image volume is unknown before 1.31
        monkeypatch.setenv(model_source.IMAGE_VOLUMES_ENV, "true")
        path.write_text(yaml.safe_dump(_pod({"modelSource": image})))
        assert kubernetes_validate(path, version).returncode != 0


def test_policy_comes_from_the_operator_environment() -> None:
    env = {
        model_source.ALLOW_TRUST_REMOTE_CODE_ENV: "true",
        model_source.IMAGE_VOLUMES_ENV: "false",
        model_source.CACHE_MAX_ENV: "100Gi",
    }
    assert SourcePolicy.from_env(env) == SourcePolicy(True, False, "100Gi")
    assert SourcePolicy.from_env({}) == SourcePolicy()
    with pytest.raises(ValueError, match="HORIZONSERVE_IMAGE_VOLUMES"):
        SourcePolicy.from_env({model_source.IMAGE_VOLUMES_ENV: "maybe"})
    with pytest.raises(ValueError, match="HORIZONSERVE_MODEL_CACHE_MAX"):
        SourcePolicy.from_env({model_source.CACHE_MAX_ENV: "lots"})


# --- engine arguments --------------------------------------------------------------------


def test_engine_args_become_allowlisted_flags() -> None:
    args = {
        "maxModelLen": 8192,
        "gpuMemoryUtilization": 0.85,
        "dtype": "bfloat16",
        "enforceEager": True,
        "enablePrefixCaching": False,
        "limitMmPerPrompt": {"image": 2, "audio": 1},
    }
    serving = _container(_pod({"engineArgs": args}), "serving")
    cmd = serving["command"]
    assert cmd[2] == "Qwen/Qwen2.5-Omni-7B"  # no source: the model as before
    tail = cmd[cmd.index("--port") + 2 :]
    assert tail == [
        "--max-model-len", "8192", "--gpu-memory-utilization", "0.85", "--dtype", "bfloat16",
        "--enforce-eager", "--no-enable-prefix-caching",
        "--limit-mm-per-prompt", '{"audio":1,"image":2}',
    ]  # fmt: skip
    assert "HF_HUB_OFFLINE" not in _env(serving)  # no source: the server still fetches


@pytest.mark.parametrize(
    ("extra", "field"),
    [
        ({"engineArgs": {"tensorParallelSize": 2}}, "spec.engineArgs.tensorParallelSize"),
        ({"engineArgs": {"gpuMemoryUtilization": 1.5}}, "spec.engineArgs.gpuMemoryUtilization"),
        ({"engineArgs": {"dtype": "int3"}}, "spec.engineArgs.dtype"),
        ({"engineArgs": {"maxModelLen": "8k"}}, "spec.engineArgs.maxModelLen"),
        ({"engineArgs": {"limitMmPerPrompt": {"smell": 1}}}, "spec.engineArgs.limitMmPerPrompt"),
        ({"engineArgs": {"trustRemoteCode": True}}, "spec.engineArgs.trustRemoteCode"),
        ({"model": "--trust-remote-code"}, "spec.model"),
        ({"modelSource": {}}, "spec.modelSource"),
        ({"modelSource": {"pvc": {"claimName": "m"}, **HF}}, "spec.modelSource"),
        ({"modelSource": {"pvc": {"claimName": "m", "path": "../etc"}}},
         "spec.modelSource.pvc.path"),
        ({"modelSource": {"pvc": {"claimName": "M!"}}}, "spec.modelSource.pvc.claimName"),
        ({"modelSource": {"image": {"reference": "r.example/w:1", "path": "models"}}},
         "spec.modelSource.image.path"),
        ({"modelSource": {"image": {"reference": "evil.example/w:1"}}},
         "spec.modelSource.image.reference"),
        ({"modelSource": {"huggingFace": {"repo": "-rf/x"}}}, "spec.modelSource.huggingFace.repo"),
        ({"modelSource": {"huggingFace": {"revision": "--x"}}},
         "spec.modelSource.huggingFace.revision"),
        ({"model": "/models/local", "modelSource": {"huggingFace": {}}},
         "spec.modelSource.huggingFace.repo"),
        ({"modelSource": {"huggingFace": {"tokenSecret": {"name": "a_b"}}}},
         "spec.modelSource.huggingFace.tokenSecret.name"),
        ({"modelSource": {**HF, "cache": {"sizeLimit": "0"}}}, "spec.modelSource.cache.sizeLimit"),
        ({"modelSource": {"pvc": {"claimName": "m"}, "cache": {"claimName": "c"}}},
         "spec.modelSource.cache.claimName"),
        ({"backend": "reference", "modelSource": HF}, "spec.modelSource"),
        ({"backend": "reference", "engineArgs": {"seed": 1}}, "spec.engineArgs"),
    ],
)  # fmt: skip
def test_bad_inputs_are_refused_naming_the_field(extra: dict, field: str) -> None:
    why = _refusal(extra)
    # The path starts with the field (pydantic may add a key or index after it).
    assert why is not None and why.startswith(field) and why[len(field)] in ":.[", why


def test_trust_remote_code_only_when_the_chart_allows_it(monkeypatch: pytest.MonkeyPatch) -> None:
    extra = {"engineArgs": {"trustRemoteCode": True}}
    assert "chart value modelSource.allowTrustRemoteCode" in (_refusal(extra) or "")
    monkeypatch.setenv(model_source.ALLOW_TRUST_REMOTE_CODE_ENV, "true")
    assert _refusal(extra) is None
    assert "--trust-remote-code" in _container(_pod(extra), "serving")["command"]
    assert _refusal({"engineArgs": {"trustRemoteCode": False}}) is None


def test_cache_size_bounded_by_the_chart(monkeypatch: pytest.MonkeyPatch) -> None:
    big = {"modelSource": {**HF, "cache": {"sizeLimit": "500Gi"}}}
    assert _refusal(big) is None
    monkeypatch.setenv(model_source.CACHE_MAX_ENV, "200Gi")
    assert (_refusal(big) or "").startswith("spec.modelSource.cache.sizeLimit: 500Gi exceeds")
    assert _refusal({"modelSource": {**HF, "cache": {"sizeLimit": "200Gi"}}}) is None


def test_enum_values_are_vllms_own() -> None:
    """The allowlist's enums are subsets of what the installed vLLM accepts, and every flag
    names a field of vLLM's engine configuration."""
    cache = pytest.importorskip("vllm.config.cache", reason="vLLM not installed")
    model = pytest.importorskip("vllm.config.model")
    quant = pytest.importorskip("vllm.model_executor.layers.quantization")
    assert set(get_args(models.VllmDType)) <= set(get_args(model.ModelDType))
    assert set(get_args(models.VllmKvCacheDType)) <= set(get_args(cache.CacheDType))
    assert set(get_args(models.VllmQuantization)) <= set(get_args(quant.QuantizationMethods))
    from vllm.engine.arg_utils import EngineArgs

    fields = set(EngineArgs.__dataclass_fields__)
    assert set(models.EngineArgs.model_fields) <= fields


ALL_ARGS = {
    "maxModelLen": 8192,
    "gpuMemoryUtilization": 0.85,
    "dtype": "bfloat16",
    "kvCacheDtype": "fp8",
    "quantization": "awq",
    "maxNumSeqs": 8,
    "maxNumBatchedTokens": 4096,
    "enforceEager": True,
    "enablePrefixCaching": False,
    "enableChunkedPrefill": True,
    "seed": 3,
    "maxLogprobs": 5,
    "limitMmPerPrompt": {"image": 2, "audio": 1},
    "trustRemoteCode": True,
}


def test_the_built_command_parses_in_vllms_own_serve_parser(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The serving command the operator builds, every engine argument set, goes through
    `vllm serve`'s real argument parser; each value lands where the spec meant it."""
    pytest.importorskip("vllm.entrypoints.launchers.cli_args", reason="vLLM not installed")
    from vllm import platforms

    if platforms.current_platform.is_unspecified():
        # What vLLM-Omni's `serve` does before parsing on a machine without a GPU.
        from vllm.platforms.cpu import CpuPlatform

        monkeypatch.setattr(platforms, "current_platform", CpuPlatform())
    from vllm.entrypoints.launchers.cli_args import make_arg_parser
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser = make_arg_parser(FlexibleArgumentParser(prog="vllm serve"))
    monkeypatch.setenv(model_source.ALLOW_TRUST_REMOTE_CODE_ENV, "true")
    assert set(models.EngineArgs.model_fields) == {to_snake(k) for k in ALL_ARGS}
    for source in (HF, {"pvc": {"claimName": "m"}}):
        command = _container(_pod({"modelSource": source, "engineArgs": ALL_ARGS}), "serving")[
            "command"
        ]
        assert command[:2] == ["vllm", "serve"] and "--omni" in command
        # `--omni` is vLLM-Omni's own flag, added by its CLI on top of this parser.
        args = parser.parse_args([a for a in command[2:] if a != "--omni"])
        for key, value in ALL_ARGS.items():
            assert getattr(args, to_snake(key)) == value, key
        assert args.served_model_name == ["Qwen/Qwen2.5-Omni-7B"]
        assert args.model_tag == command[2]


# --- examples -----------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["hf", "pvc", "image"])
def test_example_per_kind_is_accepted(kind: str) -> None:
    doc = yaml.safe_load((EXAMPLES / f"qwen2_5_omni-{kind}.yaml").read_text())
    spec = doc["spec"]
    assert refusal(spec, "ghcr.io/horizonserve/horizonserve-serving:1") is None
    parsed, _ = translate(spec)
    assert parsed.model_source is not None
    assert parsed.model_source.kind == {"hf": "huggingFace", "pvc": "pvc", "image": "image"}[kind]


# --- progress: the weights init container -> WeightsReady --------------------------------


def _status(state: dict, last: dict | None = None, restarts: int = 0) -> dict:
    st: dict[str, Any] = {"name": "weights", "state": state, "restartCount": restarts}
    if last:
        st["lastState"] = {"terminated": last}
    return {"phase": "Pending", "initContainerStatuses": [st]}


def test_weights_state_from_the_init_container() -> None:
    running = _status({"running": {"startedAt": "2026-01-01T00:00:00Z"}})
    assert weights_state(running) == WeightsState("running", "", "2026-01-01T00:00:00Z")
    done = _status({"terminated": {"exitCode": 0, "message": "Qwen/x: 9 files, 3.10 GiB"}})
    assert weights_state(done) == WeightsState("done", "Qwen/x: 9 files, 3.10 GiB")
    denied = {"exitCode": 1, "message": "Qwen/x not found, or private and the token ..."}
    assert weights_state(_status({"terminated": denied})).step == "failed"
    backoff = _status({"waiting": {"reason": "CrashLoopBackOff"}}, last=denied, restarts=2)
    assert weights_state(backoff) == WeightsState(
        "failed", "CrashLoopBackOff: Qwen/x not found, or private and the token ..."
    )
    retry = _status({"running": {"startedAt": "t"}}, last=denied, restarts=1)
    assert weights_state(retry).detail.startswith("retrying (attempt 2) after: Qwen/x not found")
    pull = _status({"waiting": {"reason": "ImagePullBackOff", "message": "not found"}})
    assert weights_state(pull) == WeightsState("failed", "ImagePullBackOff: not found")
    assert weights_state(_status({"waiting": {"reason": "PodInitializing"}})).step == "pending"
    # No weights init container (pvc, image volume): the serving container's start.
    mounted = {"containerStatuses": [{"name": "serving", "state": {"running": {}}}]}
    assert weights_state(mounted) == WeightsState("done", "mounted")
    lost = {"conditions": [{"type": "PodScheduled", "status": "False",
                            "message": 'persistentvolumeclaim "models" not found'}]}  # fmt: skip
    assert weights_state(lost).step == "failed"
    assert weights_state({}) is None
    # The pod index keeps it, and shows a loading pod as such.
    meta = {"name": "p", "namespace": "n", "labels": {}, "annotations": {}}
    assert pod_state(meta, running).weights == weights_state(running)
    assert pod_state(meta, running).phase == "LoadingWeights"


class _P:
    def __init__(self, weights: WeightsState | None) -> None:
        self.weights = weights


def test_weights_condition_and_events() -> None:
    spec, _ = translate({**BASE, "modelSource": HF})
    now = 1_767_225_690.0  # 2026-01-01T00:01:30Z
    started = WeightsState("running", "", "2026-01-01T00:00:00Z")
    ok, reason, message = model_source.verdict(
        spec, [("a", _P(WeightsState("done"))), ("b", _P(started)), ("c", None)], now
    )
    assert (ok, reason) == (False, "WeightsDownloading")
    assert message.endswith("; downloading: b for 1m30s"), message
    assert message.startswith("1/3 nodes have the weights (Hugging Face Qwen/Qwen2.5-Omni-3B@main")
    failed = WeightsState("failed", "Qwen/x is gated: accept its terms")
    _, reason, message = model_source.verdict(spec, [("a", _P(failed)), ("b", _P(started))], now)
    assert reason == "WeightsFailed" and "a: Qwen/x is gated" in message
    assert model_source.verdict(spec, [("a", _P(WeightsState("done")))], now)[:2] == (
        True,
        "WeightsReady",
    )
    assert model_source.verdict(spec, [], now)[1] == "NoMatchingNodes"
    plain, _ = translate(BASE)
    assert model_source.verdict(plain, [("a", _P(started))], now) is None  # not tracked

    def status(reason: str) -> dict:
        return {"conditions": [{"type": "WeightsReady", "reason": reason, "message": reason}]}

    assert model_source.weights_event({}, status("WeightsDownloading"))[:2] == (
        "Normal",
        "WeightsDownloading",
    )
    assert (
        model_source.weights_event(status("WeightsDownloading"), status("WeightsDownloading"))
        is None
    )
    assert model_source.weights_event(status("WeightsDownloading"), status("WeightsFailed"))[0] == (
        "Warning"
    )


def test_status_carries_weights_ready_only_with_a_source() -> None:
    from horizonserve.operator import status as status_mod
    from horizonserve.operator.nodes import Selection
    from horizonserve.operator.pods import PodState

    def build(extra: dict) -> dict:
        spec, config = translate({**BASE, **extra})
        pod = PodState("p", "n", "u", "gpu-1", "h", "LoadingWeights",
                       weights=WeightsState("running", "", "2026-01-01T00:00:00Z"))  # fmt: skip
        obs = status_mod.Observed(
            generation=1, spec=spec, config=config, spec_error=None,
            selection=Selection(frozenset({"gpu-1"}), frozenset({"gpu-1"})), pods=[pod],
            template_hash="h",
        )  # fmt: skip
        return status_mod.build_status(obs, now=1_767_225_630.0)

    types = [c["type"] for c in build({"modelSource": HF})["conditions"]]
    assert types[-1] == "WeightsReady"
    cond = build({"modelSource": HF})["conditions"][-1]
    assert cond["reason"] == "WeightsDownloading" and "gpu-1 for 30s" in cond["message"]
    assert "WeightsReady" not in [c["type"] for c in build({})["conditions"]]


# --- what runs in the pod ------------------------------------------------------------------


def _fake_hf_cache(root: Path, repo: str, files: dict[str, str]) -> None:
    """A Hugging Face cache as huggingface_hub lays it out (refs -> snapshots/<commit>)."""
    commit = "0" * 40
    base = root / f"models--{repo.replace('/', '--')}"
    (base / "refs").mkdir(parents=True)
    (base / "refs" / "main").write_text(commit)
    snap = base / "snapshots" / commit
    snap.mkdir(parents=True)
    for name, text in files.items():
        (snap / name).write_text(text)


def test_fetch_serves_from_the_cache_offline_and_says_why_it_cannot(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip("huggingface_hub")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # no network in tests; the node may have none
    log = tmp_path / "termination-log"
    monkeypatch.setenv(model_fetch.TERMINATION_LOG_ENV, str(log))
    # A fresh cache volume: the dirs the pod's env names are made (read-only root filesystem).
    home = tmp_path / "volume" / "home"
    monkeypatch.setenv("HOME", str(home))
    cache = tmp_path / "hub"
    _fake_hf_cache(cache, "tiny/omni", {"config.json": "{}", "model.safetensors": "x" * 1000})
    assert model_fetch.main(["huggingface", "--repo", "tiny/omni", "--cache-dir", str(cache)]) == 0
    assert home.is_dir()
    assert log.read_text().startswith("tiny/omni: 2 files, 0.00 GiB, already in the cache")
    # Not cached, and the hub out of reach: one line that names the way out.
    assert model_fetch.main(["huggingface", "--repo", "tiny/other", "--cache-dir", str(cache)]) == 1
    assert "not in the cache and the hub cannot be reached" in log.read_text()
    assert "modelSource.pvc" in capsys.readouterr().out


TINY_CONFIG = {"model_type": "qwen2", "architectures": ["Qwen2ForCausalLM"], "hidden_size": 64}
LOAD = (
    "import sys, transformers; c = transformers.AutoConfig.from_pretrained(sys.argv[1], "
    "revision=sys.argv[2] or None); print(c.model_type, c.hidden_size)"
)


@pytest.mark.parametrize("kind", ["huggingFace", "pvc"])
def test_the_serving_container_loads_offline_from_what_the_pod_mounts(
    kind: str, tmp_path: Path
) -> None:
    """What vLLM does first with the model argument (resolve its config through transformers
    and huggingface_hub), run with the serving container's own environment and arguments: a
    HF cache as the weights init container leaves it, or a directory as the PVC mounts it.
    Offline: no network is reached (HF_HUB_OFFLINE=1 comes from the pod)."""
    pytest.importorskip("transformers")
    source = HF if kind == "huggingFace" else {"pvc": {"claimName": "m", "path": "qwen"}}
    serving = _container(_pod({"modelSource": source}), "serving")
    env = {k: v for k, v in _env(serving).items() if isinstance(v, str)}
    assert env["HF_HUB_OFFLINE"] == "1"
    command = serving["command"]
    model = command[2]
    revision = command[command.index("--revision") + 1] if "--revision" in command else ""
    files = {"config.json": json.dumps(TINY_CONFIG)}
    if kind == "huggingFace":
        # The cache volume: the layout huggingface_hub's snapshot_download leaves.
        hub = tmp_path / "hub"
        _fake_hf_cache(hub, model, files)
        env["HF_HUB_CACHE"] = str(hub)  # the pod's path, moved under tmp_path
    else:
        # The claim's directory, as the subPath mount shows it at MODEL_MOUNT.
        model_dir = tmp_path / "model"
        model_dir.mkdir()
        (model_dir / "config.json").write_text(files["config.json"])
        model = str(model_dir)
    run_env = {**os.environ, **env, "HF_HOME": str(tmp_path / "home")}
    done = subprocess.run(
        [sys.executable, "-c", LOAD, model, revision],
        env=run_env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["qwen2", "64"]
    # Not vacuous: the same offline load of a repo the cache lacks fails.
    if kind == "huggingFace":
        missing = subprocess.run(
            [sys.executable, "-c", LOAD, "tiny/not-cached", ""],
            env=run_env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert missing.returncode != 0


def test_copy_script_copies_and_reports(tmp_path: Path) -> None:
    src = tmp_path / "image" / "models"
    (src / "sub").mkdir(parents=True)
    (src / "config.json").write_text("{}")
    (src / "sub" / "w.bin").write_bytes(b"\0" * 4096)
    dst = tmp_path / "dst"
    dst.mkdir()
    log = tmp_path / "termination-log"
    env = {**os.environ, "TERMINATION_LOG": str(log)}
    run = ["sh", "-c", model_source.COPY_SCRIPT, "copy"]
    done = subprocess.run([*run, str(src), str(dst)], env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
    assert (dst / "sub" / "w.bin").stat().st_size == 4096 and (dst / "config.json").exists()
    assert log.read_text().startswith(f"copied 0 MiB from {src} in ")
    missing = subprocess.run(
        [*run, str(tmp_path / "nope"), str(dst)], env=env, capture_output=True, text=True
    )
    assert missing.returncode == 1
    assert "set spec.modelSource.image.path" in log.read_text()
