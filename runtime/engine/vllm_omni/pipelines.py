"""Re-register the target pipelines with HorizonServe's stage schedulers.

vLLM-Omni fixes each stage's `scheduler_cls` in the frozen pipeline topology
(`vllm_omni/config/pipeline_registry.py`) and does not let a deploy yaml or the CLI override it.
So the plugin replaces the registry entries of the target pipelines by copies whose AR stages
name `scheduler.ar_scheduler` and whose generation stages name `scheduler.generation_scheduler`
(diffusion stages have no vLLM scheduler and keep theirs). The dict is mutated in place:
`config_factory` imported it by name.

A stage that already names a scheduler of its own is left alone (logged): HorizonServe does not
stack on top of a model-specific scheduler.

The pipeline's default deploy file (used when the command line gives no `--deploy-config`)
becomes HorizonServe's single-GPU one where there is one (`settings.deploy_file`): vLLM-Omni
resolves `default_deploy_config_name` as `<its deploy dir> / name`, so an absolute path works.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from horizonserve.runtime.engine.vllm_omni.settings import deploy_file

log = logging.getLogger(__name__)

_MODULE = "horizonserve.runtime.engine.vllm_omni.scheduler"
AR_SCHEDULER = f"{_MODULE}.ar_scheduler"
GENERATION_SCHEDULER = f"{_MODULE}.generation_scheduler"
HORIZON_SCHEDULERS = frozenset({AR_SCHEDULER, GENERATION_SCHEDULER})


def with_horizon_schedulers(pipeline: Any, deploy: Path | None = None) -> Any:
    """A copy of a `PipelineConfig` whose AR / generation stages use HorizonServe's schedulers
    (and whose default deploy file is `deploy`, when given)."""
    from vllm_omni.config.stage_config import StageExecutionType

    wanted = {
        StageExecutionType.LLM_AR: AR_SCHEDULER,
        StageExecutionType.LLM_GENERATION: GENERATION_SCHEDULER,
    }
    stages = []
    for stage in pipeline.stages:
        target = wanted.get(stage.execution_type)
        if target is None or stage.scheduler_cls == target:
            stages.append(stage)
        elif stage.scheduler_cls is not None:
            log.warning(
                "HorizonServe: %s stage %d (%s) keeps its own scheduler %s",
                pipeline.model_type,
                stage.stage_id,
                stage.model_stage,
                stage.scheduler_cls,
            )
            stages.append(stage)
        else:
            stages.append(dataclasses.replace(stage, scheduler_cls=target))
    changes: dict[str, Any] = {"stages": tuple(stages)}
    if deploy is not None:
        changes["default_deploy_config_name"] = str(deploy)
    return dataclasses.replace(pipeline, **changes)


def register_pipelines(registry: Any, keys: Iterable[str]) -> list[str]:
    """Patch `registry.OMNI_PIPELINES[key]` for each key; returns the keys patched (idempotent)."""
    from vllm_omni.config.stage_config import PipelineConfig

    pipelines = registry.OMNI_PIPELINES
    done = []
    for key in keys:
        entry = pipelines.get(key)
        if entry is None:
            log.warning("HorizonServe: pipeline %r is not registered in vLLM-Omni", key)
            continue
        if not isinstance(entry, PipelineConfig):
            log.warning("HorizonServe: pipeline %r is a resolver function; left as it is", key)
            continue
        patched = with_horizon_schedulers(entry, deploy_file(key))
        if patched != entry:
            pipelines[key] = patched  # what register_pipeline does, without its clobber warning
        done.append(key)
    if done:
        log.info("HorizonServe: stage schedulers installed for pipelines %s", done)
    return done
