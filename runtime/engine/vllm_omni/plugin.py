"""The plugin entry point (`vllm.general_plugins` and `vllm_omni.general_plugins`).

`register()` runs in every vLLM / vLLM-Omni process, possibly several times; it is idempotent.
Off unless `HORIZONSERVE_VLLM=1` or a ServingConfig is given (`HORIZONSERVE_SERVING_CONFIG` /
`HORIZONSERVE_CONFIG_FILE`) — installing the package never changes vLLM's behaviour silently.

When on, it:
  * in the first (root) process — the API server, which loads plugins while building its
    argument parser, before any stage process is spawned — names this server's shared-memory
    files (`HORIZONSERVE_VLLM_RUN`), creates them, resolves the ServingConfig once and exports
    it to the children, and optionally starts an MPS daemon for the stage processes;
  * everywhere: arranges for the target pipelines to be re-registered with HorizonServe's
    stage schedulers, and for the API, worker and diffusion hooks to be installed, each when
    (and only where) its vLLM-Omni module is imported.
"""

from __future__ import annotations

import atexit
import logging
import os
import sys
from collections.abc import Sequence
from types import ModuleType

from horizonserve.runtime.engine.vllm_omni import compat, settings, shared
from horizonserve.runtime.engine.vllm_omni.hooks import when_imported

log = logging.getLogger(__name__)

_registered = False

# Model-name fragments (lower case) → HorizonServe pipeline, for `HORIZONSERVE_VLLM=1` alone.
_MODEL_HINTS = (
    ("qwen2.5-omni", "qwen2_5_omni"),
    ("qwen2_5_omni", "qwen2_5_omni"),
    ("mimo-audio", "mimo_audio"),
    ("mimo_audio", "mimo_audio"),
    ("bagel", "bagel"),
)


def guess_pipeline(argv: Sequence[str]) -> str | None:
    """The pipeline a command line serves, from the model name in it (None if unclear)."""
    found = {
        name
        for arg in argv
        if not arg.startswith("-")
        for fragment, name in _MODEL_HINTS
        if fragment in arg.lower()
    }
    return found.pop() if len(found) == 1 else None


def _start_mps() -> None:
    from horizonserve.runtime.gpu import MpsDaemon, mps_available

    if not mps_available():
        log.warning("HorizonServe: %s=1 but nvidia-cuda-mps-control is missing", settings.MPS_ENV)
        return
    daemon = MpsDaemon()
    daemon.start()
    os.environ.update(daemon.client_env())
    atexit.register(daemon.stop)
    log.info("HorizonServe: MPS daemon started for the stage processes (%s)", daemon.pipe_dir)


def _init_root() -> None:
    env = os.environ
    if not (
        env.get(settings.SERVING_CONFIG_ENV)
        or env.get(settings.CONFIG_FILE_ENV)
        or env.get(settings.PIPELINE_ENV)
    ):
        guessed = guess_pipeline(sys.argv)
        if guessed is None:
            raise settings.PluginConfigError(
                f"{settings.ENABLE_ENV}=1 but no ServingConfig: set "
                f"{settings.SERVING_CONFIG_ENV} (JSON), {settings.CONFIG_FILE_ENV} (file) or "
                f"{settings.PIPELINE_ENV} (qwen2_5_omni, mimo_audio or bagel)"
            )
        env[settings.PIPELINE_ENV] = guessed
    compat.check_present()  # a hooked module moved: refuse now, not silently later
    config = settings.resolve_config()
    settings.Knobs.from_env()  # fail now on a bad knob, not in a stage process
    env[settings.RESOLVED_CONFIG_ENV] = config.model_dump_json()
    shared.create_fresh()
    if settings.Knobs.from_env().mps:
        _start_mps()
    log.info(
        "HorizonServe on: pipeline %s, policy %s, classes %s, ladder %s (run %s)",
        config.pipeline,
        config.policy.value,
        [c.name for c in config.slo.classes],
        config.ladder.levels,
        shared.run_id(),
    )


def _patch_registry(module: ModuleType) -> None:
    from horizonserve.runtime.engine.vllm_omni.pipelines import register_pipelines

    register_pipelines(module, settings.target_pipelines())


def _patch_async_omni(module: ModuleType) -> None:
    from horizonserve.runtime.engine.vllm_omni.api import install_generate

    install_generate(module.AsyncOmni)


def _patch_engine(module: ModuleType) -> None:
    from horizonserve.runtime.engine.vllm_omni.api import install_add_request

    install_add_request(module.AsyncOmniEngine)


def _patch_chat(module: ModuleType) -> None:
    from horizonserve.runtime.engine.vllm_omni.api import install_chat

    install_chat(module.OmniOpenAIServingChat)


def _patch_ar_worker(module: ModuleType) -> None:
    from horizonserve.runtime.engine.vllm_omni.worker import install_ar_worker

    install_ar_worker(module.GPUARWorker)


def _patch_generation_worker(module: ModuleType) -> None:
    from horizonserve.runtime.engine.vllm_omni.worker import install_generation_worker

    install_generation_worker(module.GPUGenerationWorker)


def _patch_diffusion_worker(module: ModuleType) -> None:
    from horizonserve.runtime.engine.vllm_omni.worker import install_diffusion_worker

    install_diffusion_worker(module.DiffusionWorker)


def _guard_scheduler_config(module: ModuleType) -> None:
    from horizonserve.runtime.engine.vllm_omni.start_guard import install_guard

    install_guard(module.SchedulerConfig)


def _patch_diffusion_engine(module: ModuleType) -> None:
    from horizonserve.runtime.engine.vllm_omni import diffusion_order
    from horizonserve.runtime.engine.vllm_omni.worker import install_diffusion_engine

    install_diffusion_engine(module.DiffusionEngine)
    diffusion_order.install(module)  # its schedulers admit by deadline (downstream control)


# vLLM-Omni 0.30.0 module → what to patch in it when it is imported.
PATCHES = {
    "vllm_omni.config.pipeline_registry": _patch_registry,
    "vllm_omni.entrypoints.async_omni": _patch_async_omni,
    "vllm_omni.engine.async_omni_engine": _patch_engine,
    "vllm_omni.entrypoints.openai.serving_chat": _patch_chat,
    "vllm_omni.worker.gpu_ar_worker": _patch_ar_worker,
    "vllm_omni.worker.gpu_generation_worker": _patch_generation_worker,
    "vllm_omni.diffusion.worker.diffusion_worker": _patch_diffusion_worker,
    "vllm_omni.diffusion.diffusion_engine": _patch_diffusion_engine,
    # every engine core (one per stage) refuses to start on a scheduler not HorizonServe's
    "vllm.config.scheduler": _guard_scheduler_config,
}


def register() -> None:
    """Entry point of both plugin groups; a no-op unless HorizonServe is switched on."""
    global _registered
    if _registered or not settings.enabled():
        return
    if shared.become_root():
        _init_root()
    _registered = True
    # Version checks first: a hooked module is checked when it is imported (at once if it
    # already is), before it is patched; a mismatch stops the import, so vLLM does not start.
    for module in compat.modules():
        when_imported(module, compat.check)
    for module, patch in PATCHES.items():
        when_imported(module, patch)


def is_registered() -> bool:
    return _registered
