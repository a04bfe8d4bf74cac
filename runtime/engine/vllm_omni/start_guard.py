"""Every engine core (one per vLLM-Omni stage) runs HorizonServe's scheduler, or refuses.

The plugin puts its schedulers into vLLM-Omni's pipeline registry (`pipelines.py`); a stage
takes its `scheduler_cls` from there when the stage configs are built. vLLM-Omni's in-process
entry points (`AsyncOmni`, the offline `Omni`) build them before vLLM loads the plugins, so
their stages were configured with vLLM-Omni's own schedulers while the plugin said it was on.
`SchedulerConfig.get_scheduler_cls` is what every engine core calls, after it has loaded the
plugins, to build its scheduler; while HorizonServe is on it
  * swaps vLLM-Omni's own stage schedulers (`OmniARScheduler`, `OmniARAsyncScheduler`,
    `OmniGenerationScheduler`) for HorizonServe's, exactly as the registry patch would have
    (logged once per engine core);
  * refuses, with one line naming the scheduler, any other scheduler that is not HorizonServe's
    (a model-specific one, or vLLM's default in a plain vLLM engine).
"""

from __future__ import annotations

import functools
import sys
from typing import Any

from horizonserve.runtime.engine.vllm_omni import settings
from horizonserve.runtime.engine.vllm_omni.hooks import HookRefused
from horizonserve.runtime.engine.vllm_omni.pipelines import (
    AR_SCHEDULER,
    GENERATION_SCHEDULER,
    HORIZON_SCHEDULERS,
)

WRAPPED = "__horizonserve_wrapped__"
_MODULE = "horizonserve.runtime.engine.vllm_omni.scheduler"
# vLLM-Omni's own stage schedulers -> what the re-registered pipelines name instead.
_OMNI = "vllm_omni.core.sched"
REPLACES = {
    f"{_OMNI}.omni_ar_scheduler.OmniARScheduler": AR_SCHEDULER,
    f"{_OMNI}.omni_ar_scheduler.OmniARAsyncScheduler": AR_SCHEDULER,
    f"{_OMNI}.omni_generation_scheduler.OmniGenerationScheduler": GENERATION_SCHEDULER,
}


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
        f"{scheduler_name(scheduler_cls)}, which HorizonServe does not schedule (it replaces "
        "only vLLM-Omni's own stage schedulers); serve a pipeline HorizonServe supports "
        f"(qwen2_5_omni, mimo_audio, bagel) or set {settings.ENABLE_ENV}=0 to run without it"
    )


def install_guard(cls: Any) -> bool:
    """Wrap `SchedulerConfig.get_scheduler_cls` (idempotent)."""
    orig = cls.get_scheduler_cls
    if getattr(orig, WRAPPED, False):
        return False

    @functools.wraps(orig)
    def get_scheduler_cls(self: Any) -> Any:
        if settings.enabled() and not is_horizon(self.scheduler_cls):
            name = scheduler_name(self.scheduler_cls)
            target = REPLACES.get(name)
            if target is None:
                raise refusal(self.scheduler_cls)
            # stderr, not a logger: engine cores leave the root logger to whatever their
            # imports configured, and this line must be seen wherever the stage runs
            print(
                f"HorizonServe: this stage was configured with {name} (its stage configs were "
                f"built before the plugin loaded); running {target} instead",
                file=sys.stderr,
                flush=True,
            )
            self.scheduler_cls = target
        return orig(self)

    setattr(get_scheduler_cls, WRAPPED, True)
    cls.get_scheduler_cls = get_scheduler_cls
    return True
