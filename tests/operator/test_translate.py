"""Spec → ServingConfig: what the schema cannot check is caught here, naming the field."""

from __future__ import annotations

import pytest

from horizonserve.operator.models import Toleration
from horizonserve.operator.translate import SpecError, field_path, parse_spec, translate
from horizonserve.runtime.config import PolicyName, default_ladder, load_pipeline


def test_minimal_spec_takes_the_pipeline_defaults() -> None:
    spec, config = translate({"pipeline": "bagel", "allGpuNodes": True})
    pipeline = load_pipeline("bagel")
    assert config.model == pipeline.model and config.pipeline == "bagel"
    assert config.policy is PolicyName.HORIZON
    assert config.ladder == default_ladder()
    assert [c.name for c in config.slo.classes] == [c.name for c in pipeline.slo.classes]
    assert config.slo.multiplier == 5.0
    assert spec.tolerations[0].key == "nvidia.com/gpu"


def test_multiplier_overrides_and_control_reach_the_runtime_config() -> None:
    _, config = translate(
        {
            "pipeline": "qwen2_5_omni",
            "allGpuNodes": True,
            "model": "/models/qwen-omni",
            "policy": "edf",
            "slo": {"multiplier": 3, "classOverrides": {"text-speech": 8}},
            "control": {"uGuard": 2.0, "rotationNMax": 6},
            "ladder": {"levels": [24, 40, 56], "aggressive": 100, "total": 114},
        }
    )
    assert config.model == "/models/qwen-omni" and config.policy is PolicyName.EDF
    table = config.slo
    solo = table.get("text-speech").solo_p95_s
    assert table.target_s("text-speech") == pytest.approx(solo * 8)
    assert table.target_s("text-text") == pytest.approx(table.get("text-text").solo_p95_s * 3)
    assert config.control.u_guard == 2.0 and config.control.rotation_n_max == 6
    assert config.ladder.levels == [24, 40, 56] and config.ladder.total == 114


@pytest.mark.parametrize(
    ("spec", "path", "words"),
    [
        (
            {
                "pipeline": "qwen2_5_omni",
                "allGpuNodes": True,
                "slo": {"classOverrides": {"poetry": 2}},
            },
            "spec.slo.classOverrides.poetry",
            ["unknown request class 'poetry'", "text-speech"],
        ),
        (
            {"pipeline": "bagel", "allGpuNodes": True, "control": {"rotationNMin": 9}},
            "spec.control",
            ["rotationNMin 9 exceeds rotationNMax 8"],
        ),
        (
            {
                "pipeline": "bagel",
                "allGpuNodes": True,
                "ladder": {"levels": [64, 48], "aggressive": 132, "total": 132},
            },
            "spec.ladder.levels",
            ["strictly increasing"],
        ),
        (
            {
                "pipeline": "bagel",
                "allGpuNodes": True,
                "ladder": {"levels": [32, 140], "aggressive": 132, "total": 132},
            },
            "spec.ladder.levels",
            ["exceeds aggressive"],
        ),
        (
            {
                "pipeline": "bagel",
                "allGpuNodes": True,
                "resources": {"limits": {"nvidia.com/gpu": 2}},
            },
            "spec.resources.limits",
            ["exactly one GPU"],
        ),
        (
            {"pipeline": "bagel", "allGpuNodes": True, "tolerations": [{"effect": "NoSchedule"}]},
            "spec.tolerations[0].operator",
            ["only with 'Exists'"],
        ),
        ({"pipeline": "llama", "allGpuNodes": True}, "spec.pipeline", ["qwen2_5_omni"]),
        (
            {"pipeline": "bagel", "allGpuNodes": True, "replicas": 3},
            "spec.replicas",
            ["unknown field", "camelCase"],
        ),
        (
            {"pipeline": "bagel", "allGpuNodes": True, "shmSize": "lots"},
            "spec.shmSize",
            ["pattern"],
        ),
    ],
)
def test_errors_name_the_field(spec: dict, path: str, words: list[str]) -> None:
    with pytest.raises(SpecError) as info:
        translate(spec)
    assert info.value.path == path
    assert str(info.value).startswith(f"{path}: ")
    for word in words:
        assert word in info.value.message


def test_unloadable_pipeline_is_a_spec_error() -> None:
    def broken(name: str):
        raise FileNotFoundError(f"no data for {name}")

    with pytest.raises(SpecError) as info:
        translate({"pipeline": "bagel", "allGpuNodes": True}, load=broken)
    assert info.value.path == "spec.pipeline"


def test_field_path_brackets_list_indices_and_dotted_keys() -> None:
    assert field_path(("tolerations", 0, "key")) == "spec.tolerations[0].key"
    assert field_path(("resources", "limits", "nvidia.com/gpu")) == (
        "spec.resources.limits[nvidia.com/gpu]"
    )


def test_snake_case_field_is_an_unknown_field() -> None:
    """A snake_case typo is refused, not read as the field (nor pruned into "every node")."""
    with pytest.raises(SpecError) as info:
        parse_spec({"pipeline": "bagel", "allGpuNodes": True, "node_selector": {"a": "b"}})
    assert info.value.path == "spec.node_selector"
    assert info.value.message.startswith("unknown field")


def test_empty_selector_needs_all_gpu_nodes() -> None:
    with pytest.raises(SpecError) as info:
        parse_spec({"pipeline": "bagel"})
    assert info.value.path == "spec.nodeSelector" and "allGpuNodes: true" in info.value.message
    assert parse_spec({"pipeline": "bagel", "allGpuNodes": True}).all_gpu_nodes


@pytest.mark.parametrize(
    ("toleration", "taint", "ok"),
    [
        ({"key": "nvidia.com/gpu", "operator": "Exists"}, {"key": "nvidia.com/gpu"}, True),
        ({"operator": "Exists"}, {"key": "anything", "effect": "NoExecute"}, True),
        ({"key": "k", "value": "v"}, {"key": "k", "value": "v", "effect": "NoSchedule"}, True),
        ({"key": "k", "value": "v"}, {"key": "k", "value": "w", "effect": "NoSchedule"}, False),
        (
            {"key": "k", "operator": "Exists", "effect": "NoExecute"},
            {"key": "k", "effect": "NoSchedule"},
            False,
        ),
    ],
)
def test_toleration_matching(toleration: dict, taint: dict, ok: bool) -> None:
    assert Toleration.model_validate(toleration).tolerates(taint) is ok
