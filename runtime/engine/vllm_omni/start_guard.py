"""Every engine core (one per vLLM-Omni stage) runs HorizonServe's scheduler, or refuses.

The plugin puts its schedulers into vLLM-Omni's pipeline registry (`pipelines.py`); a stage
takes its `scheduler_cls` from there when the stage configs are built. An entry point that
builds them before the plugin is loaded starts its stages on vLLM-Omni's own schedulers while
the plugin says it is on. So, while HorizonServe is on, `SchedulerConfig.get_scheduler_cls`
(what vLLM's EngineCore calls, after it has loaded the plugins, to build its scheduler) checks
that the class it resolves is HorizonServe's and otherwise refuses with one line naming the
stage's scheduler.
"""

from __future__ import annotations

import functools
from typing import Any

from horizonserve.runtime.engine.vllm_omni import settings
from horizonserve.runtime.engine.vllm_omni.hooks import HookRefused
from horizonserve.runtime.engine.vllm_omni.pipelines import HORIZON_SCHEDULERS

WRAPPED = "__horizonserve_wrapped__"
_MODULE = "horizonserve.runtime.engine.vllm_omni.scheduler"


class StartRefused(HookRefused):
    """An engine core would run without HorizonServe's scheduler while HorizonServe is on."""


def scheduler_name(scheduler_cls: Any) -> str:
    if scheduler_cls is None or isinstance(scheduler_cls, str):
        return str(scheduler_cls)
    module = getattr(scheduler_cls, "__module__", "?")
    return f"{module}.{getattr(scheduler_cls, '__qualname__', scheduler_cls)}"


def is_horizon(scheduler_cls: Any) -> bool:
    name = scheduler_name(scheduler_cls)
    return name in HORIZON_SCHEDULERS or name.startswith(f"{_MODULE}.")


def refusal(scheduler_cls: Any) -> StartRefused:
    return StartRefused(
        f"HorizonServe refuses to start: an engine core was configured with "
        f"{scheduler_name(scheduler_cls)}, not HorizonServe's scheduler (its stage configs were "
        "built before the plugin loaded); start with `vllm serve --omni` or AsyncOmni, or call "
        "horizonserve.runtime.engine.vllm_omni.plugin.register() before importing vllm_omni, "
        f"or set {settings.ENABLE_ENV}=0 to run without HorizonServe"
    )


def install_guard(cls: Any) -> bool:
    """Wrap `SchedulerConfig.get_scheduler_cls` (idempotent)."""
    orig = cls.get_scheduler_cls
    if getattr(orig, WRAPPED, False):
        return False

    @functools.wraps(orig)
    def get_scheduler_cls(self: Any) -> Any:
        if settings.enabled() and not is_horizon(self.scheduler_cls):
            raise refusal(self.scheduler_cls)
        return orig(self)

    setattr(get_scheduler_cls, WRAPPED, True)
    cls.get_scheduler_cls = get_scheduler_cls
    return True
