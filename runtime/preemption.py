"""Shared-stage preemption: which running request gives its place to a waiting urgent one.

When a protected short-path request waits and the shared stage's running set is full (batch
slots or KV), the running long-path decode with the most slack is preempted through the
engine's own preemption path (vLLM's `_preempt_request`, the reference engine's requeue), and
comes back as a decode continuation. Invariants: a short-path request is never chosen; a
request protected at `now` is never chosen; a prefill in progress is never chosen (only decodes);
a request already preempted once is never chosen again (its recompute is paid once, so
preemption cannot thrash an overloaded stage); among the candidates the one with the largest
slack ratio is chosen (ties: the latest admitted).
A request already handed downstream has no first response left at this stage: its slack is
infinite, so it goes first.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from typing import TypeVar

from horizonserve.runtime.profiler import RequestSignals

T = TypeVar("T")


def victim_slack(sig: RequestSignals, now: float, handed_off: bool) -> float | None:
    """Slack ratio of a running request as a preemption candidate; None if it may not be
    preempted (short-path, protected, or still prefilling)."""
    if not sig.long_path or not sig.prefilled or sig.preempted:
        return None
    if handed_off:
        return math.inf
    if now > sig.protect_at:
        return None
    return sig.slack_ratio(now)


def choose_victim(
    running: Iterable[T],
    now: float,
    signals: Callable[[T], RequestSignals],
    handed_off: Callable[[T], bool],
) -> T | None:
    """The running item to preempt (see module doc), or None when no candidate exists."""
    best: T | None = None
    best_key: tuple[float, int] | None = None
    for item in running:
        sig = signals(item)
        u = victim_slack(sig, now, handed_off(item))
        if u is None:
            continue
        key = (u, sig.seq)
        if best_key is None or key > best_key:
            best, best_key = item, key
    return best
