"""Temporal control: which waiting requests the base scheduler may see this step.

Each step is one shared-stage opportunity. The scheduler rotates phases N:M — within a
rotation cycle of N + M steps, the first N are short-path phases and the last M long-path
phases (step k is short-path when k mod (N + M) < N). N is re-derived only at a cycle start,
from the protected share of waiting short-path prefills, so a cycle is never cut short and any
window of N_max + M consecutive steps holds at least M long-path phases.

Visibility rules for one step (hidden requests stay in the queue, untouched):
  * decode continuations (prefill done, e.g. preempted) and protected requests: always visible
    (a waiting prefill is protected from `protect_at` until its deadline; once late it has
    missed its SLO and is ordinary again, unless `protect_past_deadline`);
  * ordinary short-path prefills: visible in short-path phases;
  * ordinary long-path prefills: visible in long-path phases, at most `long_path_cap` of them,
    earliest deadline first.
A phase whose path has no ordinary prefill waiting yields to the other path (work conserving).

The index is incremental: add/remove are O(log n) and `plan` costs O(log n) amortised, so the
per-step cost does not grow with the waiting queue. The base scheduler then walks the queue with
`StepView.is_visible` (lazy) or takes `split` (materialised) and `restore` afterwards.
"""

from __future__ import annotations

import heapq
from bisect import bisect_left, insort
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import TypeVar

from horizonserve.runtime.config import ControlParams
from horizonserve.runtime.profiler import RequestSignals

T = TypeVar("T")


class Phase(StrEnum):
    SHORT = "short"
    LONG = "long"
    ALL = "all"  # no path filtering (rotation disabled)


@dataclass(slots=True)
class StepView:
    """The decision of one step: a predicate over waiting requests."""

    step: int
    phase: Phase  # effective phase after work conservation
    n: int  # short-path phases in the current cycle
    long_limit: tuple[float, int] | None  # ordinary long visible iff (deadline, seq) <= this
    long_visible: bool  # False: no ordinary long-path prefill is visible this step
    visible: int  # how many waiting requests are visible: a walk stops after that many
    edf: bool = False  # the base scheduler sees visible requests in deadline order

    def is_visible(self, sig: RequestSignals) -> bool:
        if sig.prefilled or sig.protected:
            return True
        if not sig.long_path:
            return self.phase is not Phase.LONG
        if not self.long_visible:
            return False
        limit = self.long_limit
        return limit is None or (sig.deadline, sig.seq) <= limit

    def iter_visible(
        self, waiting: Iterable[T], signals: Callable[[T], RequestSignals]
    ) -> Iterator[T]:
        """Lazily yield the visible requests in view order (materialised when EDF)."""
        if self.edf:
            yield from self.split(waiting, signals)[0]
            return
        # is_visible, inlined: this loop is the per-step cost the base scheduler pays. It ends
        # after the last visible request, so a long-path phase that shows only a few (they
        # are old, near the queue's front) does not walk the whole queue.
        left = self.visible
        if left <= 0:
            return
        show_short = self.phase is not Phase.LONG
        long_visible = self.long_visible
        limit = self.long_limit
        for item in waiting:
            sig = signals(item)
            if sig.prefilled or sig.protected:
                pass
            elif not sig.long_path:
                if not show_short:
                    continue
            elif not long_visible or (limit is not None and (sig.deadline, sig.seq) > limit):
                continue
            yield item
            left -= 1
            if not left:
                return

    def split(
        self, waiting: Iterable[T], signals: Callable[[T], RequestSignals]
    ) -> tuple[list[T], list[T]]:
        """(visible in view order, hidden in queue order)."""
        visible: list[T] = []
        hidden: list[T] = []
        is_visible = self.is_visible
        for item in waiting:
            (visible if is_visible(signals(item)) else hidden).append(item)
        if self.edf:
            visible.sort(key=lambda item: _deadline_key(signals(item)))
        return visible, hidden


def _deadline_key(sig: RequestSignals) -> tuple[float, int]:
    return sig.deadline, sig.seq


def restore(original: Sequence[T], left_in_view: Iterable[T], hidden: Iterable[T]) -> list[T]:
    """The waiting queue after the base scheduler ran on a view of `original`.

    `left_in_view` is what the base scheduler left in its view queue: visible requests it did
    not take, plus any request it added (vLLM prepends preempted requests). Added requests come
    first in the order the base scheduler left them; every request of `original` that was hidden
    or left untaken keeps its original relative order. Taken requests are gone.
    """
    keep = set(hidden)
    known = set(original)
    added: list[T] = []
    for item in left_in_view:
        if item in known:
            keep.add(item)
        else:
            added.append(item)
    added.extend(item for item in original if item in keep)
    return added


def rotation_n(control: ControlParams, protected_short: int, waiting_short: int) -> int:
    """N from the protected share of waiting short-path prefills: linear, rounded, monotone."""
    frac = protected_short / waiting_short if waiting_short else 0.0
    span = control.rotation_n_max - control.rotation_n_min
    return control.rotation_n_min + round(frac * span)


class TemporalScheduler:
    """Incremental waiting-queue index plus the N:M rotation state."""

    __slots__ = (
        "_cap",
        "_continuations",
        "_control",
        "_cycle_pos",
        "_edf",
        "_expiry",
        "_heap",
        "_keep_late",
        "_long_ordinary",
        "_long_waiting",
        "_n",
        "_rotation",
        "_short_protected",
        "_short_waiting",
        "_step",
    )

    def __init__(self, control: ControlParams, *, rotation: bool = True, edf: bool = False) -> None:
        self._control = control
        self._rotation = rotation
        self._edf = edf
        self._cap = control.long_path_cap
        self._n = control.rotation_n_min
        self._cycle_pos = 0
        self._step = 0
        self._keep_late = control.protect_past_deadline
        # (protect_at, seq, sig) of waiting ordinary prefills; stale entries skipped lazily.
        self._heap: list[tuple[float, int, RequestSignals]] = []
        # (deadline, seq, sig) of waiting protected prefills, for expiry; stale entries skipped.
        self._expiry: list[tuple[float, int, RequestSignals]] = []
        # (deadline, seq, sig) of waiting, unprotected long-path prefills, sorted.
        self._long_ordinary: list[tuple[float, int, RequestSignals]] = []
        self._short_waiting = 0  # short-path prefills waiting
        self._short_protected = 0  # … of which protected
        self._long_waiting = 0  # long-path prefills waiting (protected = this − ordinary)
        self._continuations = 0  # decode continuations waiting

    # -- queue membership -------------------------------------------------------------------
    def add(self, sig: RequestSignals, now: float) -> None:
        """A request entered the waiting queue (new, or preempted back into it)."""
        if sig.waiting:
            raise ValueError(f"request {sig.request_id!r} is already waiting")
        sig.waiting = True
        if sig.prefilled:
            self._continuations += 1  # always visible, not part of the rotation's counts
            return
        sig.late = not self._keep_late and now > sig.deadline
        sig.protected = not sig.late and sig.is_protected(now)
        if sig.long_path:
            self._long_waiting += 1
            if not sig.protected:
                insort(self._long_ordinary, (sig.deadline, sig.seq, sig))
        else:
            self._short_waiting += 1
            if sig.protected:
                self._short_protected += 1
        if sig.protected:
            self._watch_expiry(sig)
        elif not sig.late:
            heapq.heappush(self._heap, (sig.protect_at, sig.seq, sig))

    def remove(self, sig: RequestSignals) -> None:
        """A request left the waiting queue (scheduled, aborted or finished)."""
        if not sig.waiting:
            return
        sig.waiting = False
        if sig.prefilled:
            self._continuations -= 1
            return
        if sig.long_path:
            self._long_waiting -= 1
            if not sig.protected:
                self._drop_long(sig)
        else:
            self._short_waiting -= 1
            if sig.protected:
                self._short_protected -= 1
        sig.protected = False  # heap entries become stale and are skipped when popped
        sig.late = False

    def _drop_long(self, sig: RequestSignals) -> None:
        lst = self._long_ordinary
        i = bisect_left(lst, (sig.deadline, sig.seq))
        if i < len(lst) and lst[i][2] is sig:
            del lst[i]

    # -- per step ----------------------------------------------------------------------------
    def _watch_expiry(self, sig: RequestSignals) -> None:
        if not self._keep_late:
            heapq.heappush(self._expiry, (sig.deadline, sig.seq, sig))

    def _refresh_protected(self, now: float) -> None:
        heap = self._heap
        while heap and heap[0][0] < now:
            protect_at, _, sig = heapq.heappop(heap)
            if not sig.waiting or sig.protected or sig.prefilled or sig.protect_at != protect_at:
                continue  # stale entry
            if sig.late or (not self._keep_late and now > sig.deadline):
                self._mark_late(sig, was_protected=False)
                continue
            sig.protected = True
            if sig.long_path:
                self._drop_long(sig)
            else:
                self._short_protected += 1
            self._watch_expiry(sig)
        expiry = self._expiry
        while expiry and expiry[0][0] < now:
            _, _, sig = heapq.heappop(expiry)
            if sig.waiting and sig.protected and not sig.prefilled:
                self._mark_late(sig, was_protected=True)

    def _mark_late(self, sig: RequestSignals, *, was_protected: bool) -> None:
        """Past its deadline: the request competes as an ordinary one from now on."""
        sig.late = True
        if not was_protected:
            return  # already counted (and listed, if long-path) as ordinary
        sig.protected = False
        if sig.long_path:
            insort(self._long_ordinary, (sig.deadline, sig.seq, sig))
        else:
            self._short_protected -= 1

    def plan(self, now: float) -> StepView:
        """Decide this step's view and advance the rotation by one step."""
        self._refresh_protected(now)
        step = self._step
        self._step = step + 1
        long_n = len(self._long_ordinary)
        cont = self._continuations
        long_protected = self._long_waiting - long_n
        if not self._rotation:
            total = cont + self._short_waiting + self._long_waiting
            return StepView(step, Phase.ALL, 0, None, True, total, self._edf)
        control = self._control
        if self._cycle_pos == 0:
            self._n = rotation_n(control, self._short_protected, self._short_waiting)
        n = self._n
        phase = Phase.SHORT if self._cycle_pos < n else Phase.LONG
        self._cycle_pos = (self._cycle_pos + 1) % (n + control.rotation_m)
        short_ordinary = self._short_waiting - self._short_protected
        if phase is Phase.SHORT and short_ordinary == 0 and long_n:
            phase = Phase.LONG
        elif phase is Phase.LONG and long_n == 0:
            phase = Phase.SHORT
        if phase is Phase.SHORT:
            visible = cont + self._short_waiting + long_protected
            return StepView(step, phase, n, None, False, visible)
        visible = cont + self._short_protected + long_protected
        cap = self._cap
        if cap == 0:
            return StepView(step, phase, n, None, False, visible)
        limit = self._long_ordinary[cap - 1][:2] if long_n > cap else None
        return StepView(step, phase, n, limit, True, visible + min(cap, long_n))

    # -- introspection (tests, metrics) -------------------------------------------------------
    @property
    def protected_short_fraction(self) -> float:
        w = self._short_waiting
        return self._short_protected / w if w else 0.0

    @property
    def current_n(self) -> int:
        return self._n
