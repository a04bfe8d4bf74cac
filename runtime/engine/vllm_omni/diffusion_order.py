"""Deadline order at the diffusion stage (BAGEL's DiT).

vLLM-Omni's diffusion engine admits from its own scheduler's `_waiting` deque of request ids
(`StepScheduler` or `RequestScheduler`, chosen in `DiffusionEngine._init_scheduler`), first come
first served. Under a policy with downstream control the plugin replaces both classes in
`vllm_omni.diffusion.diffusion_engine` by subclasses that, before each `schedule()`, put
`_waiting` in first-response deadline order, as the reference engine's DiT admits: diffusion
sampling params carry no `extra_args`, so each request's deadline is read once from the shared
request table (stamped by the API hook under the orchestrator's id) and cached. A request with
no entry keeps its place behind every one with a deadline, in arrival order (the sort is
stable). Cost per `schedule()`: O(W log W) for W waiting requests, one table lookup per new
request.
"""

from __future__ import annotations

import logging
import math
from collections import deque
from collections.abc import Callable
from types import ModuleType
from typing import Any

log = logging.getLogger(__name__)

SCHEDULER_NAMES = ("StepScheduler", "RequestScheduler")


def order_waiting(waiting: deque[str], deadline_of: Callable[[str], float]) -> bool:
    """Sort `waiting` (request ids) in place by deadline, stable; True when it changed."""
    if len(waiting) < 2:
        return False
    keyed = sorted(enumerate(waiting), key=lambda p: (deadline_of(p[1]), p[0]))
    if all(i == pos for pos, (i, _) in enumerate(keyed)):
        return False
    waiting.clear()
    waiting.extend(rid for _, rid in keyed)
    return True


class TableDeadlines:
    """Deadlines (monotonic s) by request id from the shared request table, cached; inf when
    the table has no entry."""

    def __init__(self, table: Any) -> None:
        self.table = table
        self._cache: dict[str, float] = {}

    def __call__(self, request_id: str) -> float:
        got = self._cache.get(request_id)
        if got is None:
            entry = self.table.lookup(request_id) if self.table is not None else None
            got = math.inf if entry is None else entry.deadline_ns * 1e-9
            self._cache[request_id] = got
        return got

    def forget_except(self, live: set[str]) -> None:
        """Drop cached ids no longer queued or running (bounded memory)."""
        if len(self._cache) > 2 * len(live) + 64:
            self._cache = {k: v for k, v in self._cache.items() if k in live}


class DeadlineOrder:
    """Mixin over a vLLM-Omni diffusion scheduler: `_waiting` in deadline order per step."""

    _hs_deadlines: TableDeadlines | None = None
    hs_reorders = 0

    def schedule(self) -> Any:
        deadlines = self._hs_deadlines
        if deadlines is None:
            from horizonserve.runtime.engine.vllm_omni import shared

            deadlines = self._hs_deadlines = TableDeadlines(shared.request_table())
        waiting: deque[str] = self._waiting  # type: ignore[attr-defined]
        if order_waiting(waiting, deadlines):
            self.hs_reorders += 1
        deadlines.forget_except(set(waiting) | set(self._running))  # type: ignore[attr-defined]
        return super().schedule()  # type: ignore[misc]


def deadline_ordered(cls: type) -> type:
    """`cls` with `DeadlineOrder` in front (idempotent)."""
    if issubclass(cls, DeadlineOrder):
        return cls
    return type(f"Horizon{cls.__name__}", (DeadlineOrder, cls), {"__module__": __name__})


def install(module: ModuleType, *, downstream_control: bool | None = None) -> bool:
    """Replace the diffusion engine module's scheduler classes by deadline-ordered ones when
    the configured policy orders downstream stages (`downstream_control`; read from the
    resolved config when not given). True when installed."""
    if downstream_control is None:
        from horizonserve.runtime.engine.vllm_omni.settings import resolve_config
        from horizonserve.runtime.policy import make_policy

        config = resolve_config("bagel")
        downstream_control = make_policy(config.policy, config).downstream_control
    if not downstream_control:
        return False
    for name in SCHEDULER_NAMES:
        cls = getattr(module, name, None)
        if cls is not None:
            setattr(module, name, deadline_ordered(cls))
    log.info("HorizonServe: diffusion schedulers admit by deadline")
    return True
