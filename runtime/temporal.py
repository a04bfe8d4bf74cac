"""Temporal control: which waiting requests the base scheduler may see this step.

Each step is one shared-stage opportunity. The scheduler rotates phases N:M — within a
rotation cycle of N + M steps, the first N are short-path phases and the last M long-path
phases (step k is short-path when k mod (N + M) < N). N is re-derived only at a cycle start,
from the protected share of waiting short-path prefills, so a cycle is never cut short and any
window of N_max + M consecutive steps holds at least M long-path phases.

Visibility rules for one step (hidden requests stay in the queue, untouched):
  * decode continuations (prefill done, e.g. preempted) and protected requests: always visible
    (a waiting prefill is protected from `protect_at` until its deadline; once late it has
    missed its SLO and is ordinary again, unless `late` is 'protect');
  * ordinary short-path prefills: visible in short-path phases;
  * ordinary long-path prefills: visible in long-path phases, at most `long_path_cap` of them,
    earliest deadline first.
A phase whose path has no ordinary prefill waiting yields to the other path (work conserving).

Late prefills yield (`late` 'yield' or 'yield-phase', HorizonServe's): a waiting prefill past
its deadline has missed its SLO, so the view puts every visible late one after the on-time ones,
and the long-path cap goes to on-time prefills first; with 'yield-phase' a short-path phase
whose ordinary prefills are all late yields to on-time long-path ones. Late requests still fill
whatever the on-time ones leave, so nothing is dropped; but under overload the stage stops
spending itself on requests that are already lost, which otherwise makes every request behind
them late too.

Deadline order (`view_order` 'deadline', HorizonServe's): the view shows its on-time requests
in deadline order instead of entry order (late ones after them, in entry order, with
late yielding), and a long-path phase keeps the on-time short-path prefills visible, ordered with
the capped long-path ones. The rotation then decides when long-path prefills may enter (and
how many), not that a tight-SLO prompt waits behind a loose one: in entry order a loose-SLO
prompt that came first (a summary, a protected speech prompt, the capped long-path prefills of
a long-path phase) takes the running set's last place from a text prompt due in milliseconds.

The index is incremental: add/remove are O(log n) and `plan` costs O(log n) amortised, so the
per-step cost does not grow with the waiting queue. The base scheduler then walks the queue with
`StepView.iter_visible` (lazy) or takes `split` (materialised) and `restore` afterwards.

A long-path phase's visible set is held by the index itself: decode continuations and protected
requests (kept in entry order) plus the capped long-path prefills. An engine whose queue is in
entry order (FIFO; a re-queued request goes to the tail) passes `lookup` to `iter_visible` and
gets exactly the walk's sequence in O(visible), without touching hidden requests. A short-path
phase with late prefills reads the index the same way (the shown requests and the on-time
short-path prefills merged in entry order, then the late ones), so the walk never crosses the
late head of an overloaded queue; without a lookup (the vLLM-Omni plugin) it walks, deferring
the late ones.
"""

from __future__ import annotations

import heapq
import itertools
from bisect import bisect_left, insort
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from operator import attrgetter, itemgetter
from typing import Any, Generic, TypeVar

from horizonserve.runtime.config import ControlParams, LateRule, Rotation, ViewOrder
from horizonserve.runtime.profiler import RequestSignals

T = TypeVar("T")
K = TypeVar("K", int, tuple[float, int])  # an _EntryList's key: entry ticket or (deadline, seq)

# `iter_visible` with a lookup reads a long-path phase's members from the index (O(A + C log C):
# A continuations and protected, C visible ordinary long-path prefills) instead of walking the
# queue (O(position of the last visible)) unless C exceeds both MEMBERS_LONG_MAX and a quarter of
# the waiting queue (a big cap shows so many that the walk is cheaper). Both yield one sequence.
MEMBERS_LONG_MAX = 64
# Deadline order: up to this many visible requests are sorted; more are merged lazily from the
# index's deadline-sorted on-time list (`TemporalScheduler._by_deadline`).
MERGE_MIN = 64
_sig_of_entry = itemgetter(2)
_sig_of_pair = itemgetter(1)
_deadline_of = attrgetter("deadline", "seq")  # deadline order (C-level key)
_SHORT = "short"  # `TemporalScheduler._memo`'s key for a short-path phase's members


class _EntryList(Generic[K]):
    """Requests sorted by a unique key (parallel lists): the entry ticket, or (deadline, seq)
    for deadline order. O(1) append at the tail (a new entry has the largest ticket), O(log n)
    search plus a C-level move to insert and discard elsewhere.

    `tickets` (the keys, sorted) and `sigs` (the requests, index for index) are plain
    attributes, read on every step: read only, mutate through the methods."""

    __slots__ = ("sigs", "tickets")

    def __init__(self) -> None:
        self.tickets: list[K] = []
        self.sigs: list[RequestSignals] = []

    def __len__(self) -> int:
        return len(self.tickets)

    def append(self, ticket: K, sig: RequestSignals) -> None:
        self.tickets.append(ticket)
        self.sigs.append(sig)

    def insert(self, ticket: K, sig: RequestSignals) -> None:
        tickets = self.tickets
        if not tickets or tickets[-1] < ticket:  # the newest (a new entry): at the tail
            tickets.append(ticket)
            self.sigs.append(sig)
            return
        i = bisect_left(tickets, ticket)
        tickets.insert(i, ticket)
        self.sigs.insert(i, sig)

    def discard(self, ticket: K) -> None:
        tickets = self.tickets
        i = bisect_left(tickets, ticket)
        if i < len(tickets) and tickets[i] == ticket:
            del tickets[i]
            del self.sigs[i]

    def first(self) -> tuple[K, RequestSignals] | None:
        return (self.tickets[0], self.sigs[0]) if self.tickets else None

    def snapshot(self) -> tuple[list[K], list[RequestSignals]]:
        return self.tickets[:], self.sigs[:]


class _Members(_EntryList[int]):
    """Waiting requests by entry ticket and, in deadline order, the same members again by
    (deadline, seq) in `by_deadline`, so the view reads either order without sorting."""

    __slots__ = ("by_deadline",)

    def __init__(self, deadline_order: bool) -> None:
        super().__init__()
        self.by_deadline: _EntryList[tuple[float, int]] | None = (
            _EntryList() if deadline_order else None
        )

    def add(self, entry: int, sig: RequestSignals) -> None:
        self.insert(entry, sig)  # an append when `entry` is the newest
        if self.by_deadline is not None:
            self.by_deadline.insert((sig.deadline, sig.seq), sig)

    def drop(self, entry: int, sig: RequestSignals) -> None:
        self.discard(entry)
        if self.by_deadline is not None:
            self.by_deadline.discard((sig.deadline, sig.seq))


class Phase(StrEnum):
    SHORT = "short"
    LONG = "long"
    ALL = "all"  # no path filtering (rotation disabled)


@dataclass(slots=True)
class StepView:
    """The decision of one step: a predicate over waiting requests.

    Built once per step by `TemporalScheduler.plan`, positionally (`_view_fields` lists the
    fields after `step` in this order); every other caller names them."""

    step: int
    phase: Phase  # effective phase after work conservation
    n: int  # short-path phases in the current cycle
    long_limit: tuple[float, int] | None  # on-time ordinary long visible iff (d, seq) <= this
    long_visible: bool  # False: no on-time ordinary long-path prefill is visible this step
    visible: int  # how many waiting requests are visible: a walk stops after that many
    # The base scheduler sees visible requests in deadline order (with `late`: the on-time ones
    # in deadline order, then the late ones in queue order).
    edf: bool = False
    by_priority: bool = False  # … in (API priority code, admission) order (vLLM's priority)
    # Long-path phases: the index that holds this step's visible set (see `members`).
    index: TemporalScheduler | None = field(default=None, repr=False, compare=False)
    # Late ordinary long-path prefills: visible iff late_long_visible and (d, seq) <= late_limit.
    late_limit: tuple[float, int] | None = None
    late_long_visible: bool = False
    late: int = 0  # visible late prefills, yielded after every on-time one (0: queue order)
    long_hidden: bool = False  # some ordinary long-path prefill is hidden this step
    short_on_time: bool = False  # a long-path phase shows on-time short-path prefills too

    def is_visible(self, sig: RequestSignals) -> bool:
        if sig.prefilled or sig.protected:
            return True
        if not sig.long_path:
            return self.phase is not Phase.LONG or (self.short_on_time and not sig.late)
        if sig.late:
            visible, limit = self.late_long_visible, self.late_limit
        else:
            visible, limit = self.long_visible, self.long_limit
        return visible and (limit is None or (sig.deadline, sig.seq) <= limit)

    def members(self) -> list[RequestSignals] | None:
        """This step's visible requests in view order, read from the index in O(visible).

        Long-path phases only (None otherwise; a short-path phase with late prefills reads the
        index through `iter_visible` with a lookup). Valid until the waiting queue changes: call it
        right after `plan`. Equals the walk's sequence on a queue kept in entry order.
        """
        index = self.index
        if index is None or self.phase is not Phase.LONG:
            return None
        members = index._long_members(self.long_visible or self.late_long_visible, False)
        return None if members is None else list(members)

    def iter_visible(
        self,
        waiting: Iterable[T],
        signals: Callable[[T], RequestSignals],
        lookup: Callable[[RequestSignals], T] | None = None,
    ) -> Iterator[T]:
        """Lazily yield the visible requests in view order (materialised when EDF).

        View order is queue order (deadline order when EDF), late prefills after the on-time
        ones (in queue order) when the view has any (`late`). `lookup` maps a waiting request's
        signals to its item in `waiting`; pass it only when `waiting` is in index-entry order
        (FIFO, re-queued requests at the tail). With it a long-path phase yields `members`
        mapped through `lookup` (see MEMBERS_LONG_MAX): the same sequence, without walking past
        hidden requests. The members are read by this call, so the caller may dequeue
        (from `waiting` and the index) what it takes while it iterates.
        """
        index = self.index
        if lookup is not None and index is not None:
            if self.phase is Phase.SHORT:
                return map(lookup, index._short_members())
            members = index._long_members(self.long_visible or self.late_long_visible, True)
            if members is not None:
                return map(lookup, members)
        return self._walk(waiting, signals)

    def _walk(self, waiting: Iterable[T], signals: Callable[[T], RequestSignals]) -> Iterator[T]:
        """The queue walk behind `iter_visible`: visible requests of `waiting` in view order."""
        if self.by_priority:
            yield from self.split(waiting, signals)[0]
            return
        left = self.visible
        if left <= 0:
            return
        # is_visible, inlined: this loop is the per-step cost the base scheduler pays. It ends
        # after the last visible request, so it costs O(position of the last one it yields).
        # Late visible requests wait in `deferred` and follow the on-time ones. In deadline
        # order (EDF) the on-time ones are collected in `front` and sorted once the walk ends.
        front: list[T] | None = [] if self.edf else None
        show_short = self.phase is not Phase.LONG
        short_on_time = self.short_on_time
        long_visible, limit = self.long_visible, self.long_limit
        late_long, late_limit = self.late_long_visible, self.late_limit
        deferred: list[T] | None = [] if self.late else None
        for item in waiting:
            sig = signals(item)
            if sig.prefilled or sig.protected:
                pass
            elif not sig.long_path:
                if not show_short and not (short_on_time and not sig.late):
                    continue
            elif sig.late:
                if not late_long or (
                    late_limit is not None and (sig.deadline, sig.seq) > late_limit
                ):
                    continue
            elif not long_visible or (limit is not None and (sig.deadline, sig.seq) > limit):
                continue
            if deferred is not None and sig.late:
                deferred.append(item)
            elif front is not None:
                front.append(item)
            else:
                yield item
            left -= 1
            if not left:
                break
        if front:
            front.sort(key=lambda item: _deadline_of(signals(item)))
            yield from front
        if deferred:
            yield from deferred

    def split(
        self, waiting: Iterable[T], signals: Callable[[T], RequestSignals]
    ) -> tuple[list[T], list[T]]:
        """(visible in view order, hidden in queue order)."""
        visible: list[T] = []
        hidden: list[T] = []
        is_visible = self.is_visible
        for item in waiting:
            (visible if is_visible(signals(item)) else hidden).append(item)
        if self.edf and self.late:  # on-time by deadline, then late in queue order (stable)
            visible.sort(key=lambda item: _yield_key(signals(item)))
        elif self.edf:
            visible.sort(key=lambda item: _deadline_key(signals(item)))
        elif self.by_priority:
            visible.sort(key=lambda item: _priority_key(signals(item)))
        elif self.late:
            visible.sort(key=lambda item: signals(item).late)  # stable: queue order within
        return visible, hidden


def _copied_when_reached(sigs: list[RequestSignals]) -> Iterator[RequestSignals]:
    """`sigs`, copied once the walk reaches them (a walk that stops before does not pay)."""
    yield from sigs[:]


def _deadline_key(sig: RequestSignals) -> tuple[float, int]:
    return sig.deadline, sig.seq


def _yield_key(sig: RequestSignals) -> tuple[bool, float, int]:
    return (True, 0.0, 0) if sig.late else (False, sig.deadline, sig.seq)


def _priority_key(sig: RequestSignals) -> tuple[int, int]:
    return int(sig.costs.cls.priority), sig.seq


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
        "_by_priority",
        "_cap",
        "_continuations",
        "_control",
        "_cycle_pos",
        "_dl",
        "_entry",
        "_expiry",
        "_heap",
        "_keep_late",
        "_late_last",
        "_long_late",
        "_long_ordinary",
        "_long_waiting",
        "_m",
        "_memo",
        "_n",
        "_phase_yield",
        "_rotation",
        "_short_late",
        "_short_on",
        "_short_protected",
        "_short_waiting",
        "_shown",
        "_step",
        "_tickets",
    )

    def __init__(self, control: ControlParams) -> None:
        # Axes (ControlParams refuses priority order with rotation or late yielding).
        self._control = control
        self._rotation = control.rotation is Rotation.PATH
        self._dl = control.view_order is ViewOrder.DEADLINE
        self._by_priority = control.view_order is ViewOrder.PRIORITY
        self._cap = control.long_path_cap
        self._n = control.rotation_n_min
        self._m = control.rotation_m  # long-path phases per cycle
        self._cycle_pos = 0
        self._step = 0
        self._keep_late = control.late is LateRule.PROTECT
        self._late_last = control.late in (LateRule.YIELD, LateRule.YIELD_PHASE)
        self._phase_yield = control.late is LateRule.YIELD_PHASE
        # (protect_at, seq, sig) of waiting ordinary prefills; stale entries skipped lazily.
        self._heap: list[tuple[float, int, RequestSignals]] = []
        # (deadline, seq, sig) of waiting protected prefills, for expiry; stale entries skipped.
        self._expiry: list[tuple[float, int, RequestSignals]] = []
        # (deadline, seq, sig) of waiting, unprotected, on-time long-path prefills, sorted; and
        # of the late ones. After `plan`'s refresh every late deadline is below every on-time
        # one, so the two lists, late first, are the ordinary long-path prefills in deadline order.
        self._long_ordinary: list[tuple[float, int, RequestSignals]] = []
        self._long_late: list[tuple[float, int, RequestSignals]] = []
        # Entry order: a waiting request's ticket, increasing with each `add`.
        self._entry: dict[RequestSignals, int] = {}
        self._tickets = itertools.count()
        # Waiting requests visible in every phase (continuations, protected), by entry.
        self._shown = _Members(self._dl)
        self._short_waiting = 0  # short-path prefills waiting
        self._short_protected = 0  # … of which protected
        # … the unprotected ones, on time and late, each as (tickets, sigs) in entry order.
        self._short_on = _Members(self._dl)
        self._short_late: _EntryList[int] = _EntryList()
        self._long_waiting = 0  # long-path prefills waiting (protected = this − ordinary)
        self._continuations = 0  # decode continuations waiting
        # What a view reads from the index, built once per state of the index and reused by
        # the steps that follow while it stands (a running set that is full takes nothing from
        # the queue): a view's fields but its step (key: the rotation's (short-path phase?,
        # N), None without rotation; `_view_fields`), a long-path phase's members (key:
        # `long_visible`) and a short-path phase's in deadline order (key: _SHORT, up to
        # MERGE_MIN late ones). Only materialised lists are kept; no caller mutates them.
        # Invalidation: every change to the index (`add`, `remove`, a prefill protected or
        # found late) clears it.
        self._memo: dict[object, Any] = {}

    # -- queue membership -------------------------------------------------------------------
    def add(self, sig: RequestSignals, now: float) -> None:
        """A request entered the waiting queue (new, or preempted back into it)."""
        if sig.waiting:
            raise ValueError(f"request {sig.request_id!r} is already waiting")
        sig.waiting = True
        self._memo.clear()
        self._entry[sig] = entry = next(self._tickets)
        if sig.prefilled:
            self._continuations += 1  # always visible, not part of the rotation's counts
            self._shown.add(entry, sig)  # the newest entry: sorted order holds
            return
        sig.late = not self._keep_late and now > sig.deadline
        sig.protected = not sig.late and sig.is_protected(now)
        if sig.long_path:
            self._long_waiting += 1
            if not sig.protected:
                insort(self._long_list(sig), (sig.deadline, sig.seq, sig))
        else:
            self._short_waiting += 1
            if sig.protected:
                self._short_protected += 1
            elif sig.late:
                self._short_late.append(entry, sig)
            else:
                self._short_on.add(entry, sig)
        if sig.protected:
            self._shown.add(entry, sig)
            self._watch_expiry(sig)
        elif not sig.late:
            heapq.heappush(self._heap, (sig.protect_at, sig.seq, sig))

    def remove(self, sig: RequestSignals) -> None:
        """A request left the waiting queue (scheduled, aborted or finished)."""
        if not sig.waiting:
            return
        sig.waiting = False
        self._memo.clear()
        entry = self._entry.pop(sig, -1)
        if sig.prefilled:
            self._continuations -= 1
            self._shown.drop(entry, sig)
            return
        if sig.protected:
            self._shown.drop(entry, sig)
        if sig.long_path:
            self._long_waiting -= 1
            if not sig.protected:
                self._drop_long(sig)
        else:
            self._short_waiting -= 1
            if sig.protected:
                self._short_protected -= 1
            elif sig.late:
                self._short_late.discard(entry)
            else:
                self._short_on.drop(entry, sig)
        sig.protected = False  # heap entries become stale and are skipped when popped
        sig.late = False

    def _long_list(self, sig: RequestSignals) -> list[tuple[float, int, RequestSignals]]:
        """The sorted list an unprotected long-path prefill belongs to (by `sig.late`)."""
        return self._long_late if sig.late else self._long_ordinary

    def _drop_long(self, sig: RequestSignals) -> None:
        lst = self._long_list(sig)
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
            self._memo.clear()
            if sig.long_path:
                self._drop_long(sig)
            else:
                self._short_protected += 1
                self._short_on.drop(self._entry[sig], sig)
            self._shown.add(self._entry[sig], sig)
            self._watch_expiry(sig)
        expiry = self._expiry
        while expiry and expiry[0][0] < now:
            _, _, sig = heapq.heappop(expiry)
            if sig.waiting and sig.protected and not sig.prefilled:
                self._mark_late(sig, was_protected=True)

    def _mark_late(self, sig: RequestSignals, *, was_protected: bool) -> None:
        """Past its deadline: the request competes as an ordinary, late one from now on."""
        if sig.late:
            return
        self._memo.clear()
        entry = self._entry[sig]
        if was_protected:
            sig.protected = False
            self._shown.drop(entry, sig)
            if not sig.long_path:
                self._short_protected -= 1
        elif sig.long_path:
            self._drop_long(sig)  # from the on-time list
        else:
            self._short_on.drop(entry, sig)
        sig.late = True
        if sig.long_path:
            insort(self._long_late, (sig.deadline, sig.seq, sig))
        else:
            self._short_late.insert(entry, sig)

    def plan(self, now: float) -> StepView:
        """Decide this step's view and advance the rotation by one step."""
        self._refresh_protected(now)
        step = self._step
        self._step = step + 1
        if not self._rotation:
            key: tuple[bool, int] | None = None  # every waiting request, every step
        else:
            if self._cycle_pos == 0:
                self._n = rotation_n(self._control, self._short_protected, self._short_waiting)
            n = self._n
            key = (self._cycle_pos < n, n)  # the rotation's phase (short-path?) and its N
            self._cycle_pos = (self._cycle_pos + 1) % (n + self._m)
        fields = self._memo.get(key)
        if fields is None:  # the rest of the view is a function of the index and the key
            fields = self._memo[key] = self._view_fields(key)
        return StepView(step, *fields)

    def _view_fields(self, rotation: tuple[bool, int] | None) -> tuple[Any, ...]:
        """A view's fields after `step`, in their order (phase, n, long_limit, long_visible,
        visible, edf, by_priority, index, late_limit, late_long_visible, late, long_hidden,
        short_on_time), for the rotation's (short-path phase?, N), or None without rotation."""
        on_time, late = self._long_ordinary, self._long_late
        long_n = len(on_time) + len(late)
        cont = self._continuations
        long_protected = self._long_waiting - long_n
        late_last = self._late_last
        dl = self._dl
        # Defaults of the view's fields; each case below sets what differs.
        phase, n, index = Phase.ALL, 0, self
        long_limit: tuple[float, int] | None = None
        late_limit: tuple[float, int] | None = None
        long_visible = late_long_visible = long_hidden = short_on_time = False
        n_late = 0
        if rotation is None:  # every waiting request, every step
            visible = cont + self._short_waiting + self._long_waiting
            n_late = len(self._short_late.sigs) + len(late) if late_last else 0
            long_visible = late_long_visible = True
            index = None
        else:
            short, n = rotation
            short_ordinary = self._short_waiting - self._short_protected
            if self._phase_yield and on_time:
                # Late short-path prefills have missed their SLO: they do not hold a short-path
                # phase against on-time long-path ones (they run once none of those waits).
                short_ordinary -= len(self._short_late.sigs)
            if short and short_ordinary == 0 and long_n:
                short = False
            elif not short and long_n == 0:
                short = True
            if short:
                phase = Phase.SHORT
                visible = cont + self._short_waiting + long_protected
                n_late = len(self._short_late.sigs) if late_last else 0
                long_hidden = long_n > 0
                # With late prefills (or in deadline order) the view reads its sequence from
                # the index (`iter_visible` with a lookup), so it need not walk past the late
                # ones at the queue's head (nor sort the queue).
                if not (n_late or dl):
                    index = None
            else:
                phase = Phase.LONG
                visible, long_limit, long_visible, late_limit, late_long_visible, n_late = (
                    self._long_phase(cont + self._short_protected + long_protected)
                )
                long_hidden = long_n > self._cap
                short_on_time = dl
        return (
            phase,
            n,
            long_limit,
            long_visible,
            visible,
            dl,
            self._by_priority,
            index,
            late_limit,
            late_long_visible,
            n_late,
            long_hidden,
            short_on_time,
        )

    def _long_phase(
        self, visible: int
    ) -> tuple[int, tuple[float, int] | None, bool, tuple[float, int] | None, bool, int]:
        """A long-path phase's (visible, long_limit, long_visible, late_limit,
        late_long_visible, late) given the `visible` count of what it shows in any case: the
        capped ordinary long-path prefills (on-time ones first with `late_last`)."""
        on_time, late, cap = self._long_ordinary, self._long_late, self._cap
        long_n = len(on_time) + len(late)
        if self._dl:  # the on-time short-path prefills stay visible, in deadline order
            visible += len(self._short_on.sigs)
        if cap == 0:
            return visible, None, False, None, False, 0
        if not self._late_last:
            # One deadline order over both lists (late first): the cap's earliest deadlines.
            limit = None
            if long_n > cap:
                limit = late[cap - 1][:2] if cap <= len(late) else on_time[cap - 1 - len(late)][:2]
            return visible + min(cap, long_n), limit, True, limit, True, 0
        # On-time long-path prefills take the cap first; late ones get the places left.
        shown_on = cap if cap < len(on_time) else len(on_time)
        rest = cap - shown_on
        shown_late = rest if rest < len(late) else len(late)
        return (
            visible + shown_on + shown_late,
            on_time[cap - 1][:2] if len(on_time) > cap else None,
            shown_on > 0,
            late[rest - 1][:2] if len(late) > rest > 0 else None,
            shown_late > 0,
            shown_late,
        )

    def _long_members(self, long_visible: bool, gate: bool) -> Iterable[RequestSignals] | None:
        """A long-path phase's visible set in entry order: the shown requests (in entry order)
        with the capped ordinary long-path prefills merged in (late ones after every on-time
        one, with late yielding); in deadline order, `_long_members_by_deadline`. gate: None
        where walking the queue is cheaper (see MEMBERS_LONG_MAX). `long_visible`: the view
        shows ordinary long-path prefills."""
        on_time, late = self._long_ordinary, self._long_late
        cap = self._cap
        if gate and cap > MEMBERS_LONG_MAX:
            shown_long = min(cap, len(on_time) + len(late))
            if shown_long > MEMBERS_LONG_MAX and 4 * shown_long > len(self._entry):
                return None
        members = self._memo.get(long_visible)
        if members is None:
            if self._dl:
                members = self._long_members_by_deadline(long_visible)
            else:
                members = self._long_members_by_entry(long_visible)
            if isinstance(members, list):
                self._memo[long_visible] = members
        return members

    def _long_members_by_entry(self, long_visible: bool) -> list[RequestSignals]:
        """`_long_members` in entry order."""
        on_time, late = self._long_ordinary, self._long_late
        cap = self._cap
        if not long_visible or cap == 0 or not (on_time or late):
            return self._shown.sigs[:]
        entry = self._entry
        if not late:
            capped, tail = self._first_by_entry(on_time, cap), []
        elif self._late_last:
            capped = self._first_by_entry(on_time, cap)
            tail = self._first_by_entry(late, cap - len(capped))
        else:
            capped, tail = self._first_by_entry(late[:cap] + on_time[:cap], cap), []
        if not self._shown.sigs:
            return capped + tail
        members = self._shown.sigs[:]
        entries = self._shown.tickets
        for sig in reversed(capped):  # descending entry: earlier positions stay valid
            members.insert(bisect_left(entries, entry[sig]), sig)
        members.extend(tail)
        return members

    def _long_members_by_deadline(
        self, long_visible: bool
    ) -> list[RequestSignals] | Iterator[RequestSignals]:
        """`_long_members` in deadline order: the shown requests, the on-time short-path
        prefills and the capped on-time long-path prefills by deadline; with late yielding the
        capped late ones follow in entry order. Without it the cap takes the earliest deadlines
        over both lists (late first), all in one deadline order. Lazy where `_by_deadline`
        is."""
        on_time, late, cap = self._long_ordinary, self._long_late, self._cap
        capped: list[RequestSignals] = []
        tail: list[RequestSignals] = []
        in_order = False  # `capped` in deadline order already
        if long_visible and cap:
            if self._late_last:
                capped = list(map(_sig_of_entry, on_time[:cap]))  # a sorted list's head
                in_order = True
                if late and len(capped) < cap:
                    tail = self._first_by_entry(late, cap - len(capped))
            else:
                capped = list(map(_sig_of_entry, (late[:cap] + on_time[:cap])[:cap]))
        members = self._by_deadline(capped, in_order)
        if not tail:
            return members
        return members + tail if isinstance(members, list) else itertools.chain(members, tail)

    def _by_deadline(
        self, extra: list[RequestSignals] | None = None, in_order: bool = False
    ) -> list[RequestSignals] | Iterator[RequestSignals]:
        """The shown requests and the on-time short-path prefills in deadline order (copies of
        their `by_deadline`), with the `extra` requests (capped or late ones, sorted here
        unless `in_order`) merged in: a new list where one run or a short list (≤ MERGE_MIN)
        has them all, else a lazy merge (a caller that stops after k requests pays O(k log)
        above the copies). `extra` is the caller's own list: returned as is when alone and
        in order."""
        shown_dl, on_dl = self._shown.by_deadline, self._short_on.by_deadline
        assert shown_dl is not None and on_dl is not None
        if extra and not in_order:  # given in entry order (a re-queued one sits at the tail)
            extra = sorted(extra, key=_deadline_of)
        if not shown_dl.sigs and not on_dl.sigs:  # an overloaded queue's: nothing else to merge
            return extra or []
        shown, on = shown_dl.sigs[:], on_dl.sigs[:]
        runs = [r for r in (shown, on, extra) if r]
        if len(runs) < 2:
            return runs[0] if runs else []
        if sum(map(len, runs)) <= MERGE_MIN:  # a short list sorts faster than a merge starts
            members = list(itertools.chain.from_iterable(runs))
            members.sort(key=_deadline_of)
            return members
        return heapq.merge(*runs, key=_deadline_of)

    def _short_members(self) -> Iterator[RequestSignals]:
        """A short-path phase's visible set in view order: the shown requests and the on-time
        short-path prefills merged in entry order, then the late ones in entry order. Reads
        snapshots (C-level copies; a long late list's taken when the walk reaches it), so the
        caller may dequeue what it takes while it iterates; a long queue's merge is lazy, so a
        caller that stops after k requests pays O(k) above the copies. In deadline order
        (`view_order` 'deadline') the shown and on-time ones merge by deadline (`_by_deadline`);
        without late yielding the late ones join that merge."""
        if not self._dl:
            return self._short_members_by_entry()
        members = self._memo.get(_SHORT)
        if members is None:
            head = self._by_deadline(None if self._late_last else self._short_late.sigs)
            late = self._short_late.sigs if self._late_last else []
            if not isinstance(head, list) or len(late) > MERGE_MIN:
                return itertools.chain(head, _copied_when_reached(late))
            members = self._memo[_SHORT] = head + late
        return iter(members)

    def _short_members_by_entry(self) -> Iterator[RequestSignals]:
        """`_short_members` in entry order."""
        on_tickets, on = self._short_on.snapshot()
        if not self._shown.sigs:
            yield from on
        elif not on:
            yield from self._shown.sigs[:]
        else:
            shown = zip(*self._shown.snapshot(), strict=True)
            yield from map(_sig_of_pair, heapq.merge(shown, zip(on_tickets, on, strict=True)))
        yield from self._short_late.snapshot()[1]

    def _first_by_entry(
        self, lst: list[tuple[float, int, RequestSignals]], k: int
    ) -> list[RequestSignals]:
        """The first k of a deadline-sorted list, in entry order."""
        if k <= 0 or not lst:
            return []
        entry = self._entry
        if k == 1 or len(lst) == 1:
            return [lst[0][2]]
        if k == 2 or len(lst) == 2:  # the default cap, spelled out: this is the hot path
            first, second = lst[0][2], lst[1][2]
            return [first, second] if entry[first] < entry[second] else [second, first]
        capped = list(map(_sig_of_entry, lst[:k]))
        capped.sort(key=entry.__getitem__)
        return capped

    # -- introspection (tests, metrics) -------------------------------------------------------
    @property
    def protected_short_fraction(self) -> float:
        w = self._short_waiting
        return self._short_protected / w if w else 0.0

    @property
    def current_n(self) -> int:
        return self._n

    def earliest_waiting_slack(self, now: float) -> float | None:
        """Slack ratio of the unprotected waiting prefill that becomes protected first (the
        heap's top; stale tops dropped), or None. The request nearest the guard by this order
        is not always the smallest u (r̂ differs), but it is the one the view acts on next."""
        heap = self._heap
        while heap:
            protect_at, _, sig = heap[0]
            if not sig.waiting or sig.protected or sig.prefilled or sig.protect_at != protect_at:
                heapq.heappop(heap)
                continue
            return sig.slack_ratio(now)
        return None

    def short_needs_place(self, now: float, next_free_s: float) -> float | None:
        """How much sooner than `next_free_s` (when a running request frees its place by
        itself) a waiting short-path prefill needs one, or None when none does: a protected
        one needs it now; otherwise the earliest-entered one, if it can still meet its
        deadline but not after that wait (0 ≤ d − now − r̂ < next_free_s). O(protected)
        when one is protected, else O(1) amortised."""
        if self._short_protected:
            shown = self._shown.sigs
            waits = [s.can_wait_s(now) for s in shown if not s.long_path and not s.prefilled]
            return next_free_s - max(0.0, min(waits, default=0.0))
        # The earliest-entered unprotected one; with late yielding the earliest on-time one (a
        # late head follows the on-time ones, so they are the next to be served).
        on, late = self._short_on, self._short_late
        head = on.first()
        if not self._late_last:
            first_late = late.first()
            if head is None or (first_late is not None and first_late[0] < head[0]):
                head = first_late
        if head is None:
            return None
        left = head[1].can_wait_s(now)
        return next_free_s - left if 0.0 <= left < next_free_s else None

    @property
    def short_waiting(self) -> int:
        """Short-path prefills waiting, protected or not."""
        return self._short_waiting

    @property
    def long_waiting(self) -> int:
        """Long-path prefills waiting, protected or not."""
        return self._long_waiting

    @property
    def protected_waiting(self) -> int:
        """Prefills waiting while protected, either path (as of the last `plan`)."""
        return (
            self._short_protected
            + self._long_waiting
            - len(self._long_ordinary)
            - len(self._long_late)
        )
