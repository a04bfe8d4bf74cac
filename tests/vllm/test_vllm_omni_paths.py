"""Pins of the vLLM-Omni plugin paths the HorizonServe plugin will use (CPU, no download):
pipeline registry + per-stage `scheduler_cls`, the plugin entry-point groups, and the modules
the API-layer hook lives in."""

from __future__ import annotations

import dataclasses

import pytest
from factory import import_pipeline_registry, require_vllm, stage_configs_for

pytestmark = pytest.mark.vllm

AR_ASYNC = "vllm_omni.core.sched.omni_ar_scheduler.OmniARAsyncScheduler"
GENERATION = "vllm_omni.core.sched.omni_generation_scheduler.OmniGenerationScheduler"
HS_SCHEDULER = "horizonserve.runtime.engine.vllm_omni.scheduler.NotWrittenYet"


@pytest.fixture(autouse=True)
def _needs_vllm() -> None:
    require_vllm()


@pytest.fixture
def registry():
    """The real pipeline registry; OMNI_PIPELINES is restored in place after the test.

    In place, because config_factory imports the dict by name: a plugin (and this fixture) must
    mutate that one dict object, never rebind the module attribute.
    """
    module = import_pipeline_registry()
    saved = dict(module.OMNI_PIPELINES)
    yield module
    module.OMNI_PIPELINES.clear()
    module.OMNI_PIPELINES.update(saved)


@pytest.mark.parametrize(
    ("model_type", "expected"),
    [
        (
            "qwen2_5_omni",
            [
                ("thinker", AR_ASYNC, True),
                ("talker", AR_ASYNC, True),
                ("code2wav", GENERATION, False),
            ],
        ),
        ("mimo_audio", [("fused_thinker_talker", AR_ASYNC, True), ("code2wav", GENERATION, False)]),
        ("bagel", [("thinker", AR_ASYNC, True), ("dit", None, None)]),
    ],
)
def test_default_stage_schedulers_of_the_target_pipelines(registry, model_type, expected):
    pipeline = registry.resolve_pipeline_config(model_type)
    assert all(stage.scheduler_cls is None for stage in pipeline.stages)
    stages = stage_configs_for(pipeline)
    got = [
        (s.model_stage, s.scheduler_cls, s.yaml_engine_args.get("async_scheduling")) for s in stages
    ]
    assert got == expected


def test_reregistered_pipeline_carries_scheduler_cls_to_the_ar_stages(registry):
    from vllm_omni.config.stage_config import StageExecutionType

    original = registry.resolve_pipeline_config("qwen2_5_omni")
    patched = dataclasses.replace(
        original,
        stages=tuple(
            dataclasses.replace(stage, scheduler_cls=HS_SCHEDULER)
            if stage.execution_type == StageExecutionType.LLM_AR
            else stage
            for stage in original.stages
        ),
    )
    registry.register_pipeline(patched)
    assert registry.resolve_pipeline_config("qwen2_5_omni") is patched
    from vllm_omni.config import config_factory

    assert config_factory.OMNI_PIPELINES is registry.OMNI_PIPELINES

    stages = stage_configs_for(registry.resolve_pipeline_config("qwen2_5_omni"))
    assert [(s.model_stage, s.scheduler_cls) for s in stages] == [
        ("thinker", HS_SCHEDULER),
        ("talker", HS_SCHEDULER),
        ("code2wav", GENERATION),
    ]
    # The sync/async choice is still made from the default class, not from scheduler_cls.
    assert [s.yaml_engine_args.get("async_scheduling") for s in stages] == [True, True, False]


def test_frozen_topology_dataclasses():
    from vllm_omni.config.stage_config import PipelineConfig, StagePipelineConfig

    fields = {f.name: f for f in dataclasses.fields(StagePipelineConfig)}
    assert fields["scheduler_cls"].default is None
    assert StagePipelineConfig.__dataclass_params__.frozen
    assert PipelineConfig.__dataclass_params__.frozen


def test_plugin_groups_and_vllm_omnis_own_entry_point():
    from importlib.metadata import entry_points

    import vllm.plugins
    import vllm_omni.plugins

    assert vllm.plugins.DEFAULT_PLUGINS_GROUP == "vllm.general_plugins"
    assert vllm_omni.plugins.OMNI_DEFAULT_PLUGINS_GROUP == "vllm_omni.general_plugins"
    names = {ep.name: ep.value for ep in entry_points(group="vllm.general_plugins")}
    assert names["vllm_omni_register_models"] == (
        "vllm_omni.engine.arg_utils:register_omni_models_to_vllm"
    )


def test_async_omni_generate_and_orchestrator_import_on_cpu():
    """The API-layer hook point imports here (serving_chat does not: it needs torchaudio)."""
    import inspect

    import_pipeline_registry()
    from vllm_omni.engine import orchestrator
    from vllm_omni.entrypoints.async_omni import AsyncOmni

    params = inspect.signature(AsyncOmni.generate).parameters
    for name in ("sampling_params_list", "output_modalities", "priority", "arrival_time"):
        assert name in params
    assert (
        "priority"
        not in inspect.signature(orchestrator.build_engine_core_request_from_tokens).parameters
    )
