"""The shared stage's order by slack, where vLLM's own scheduler decides by queue position.

Three rules the plugin applies around vLLM's `Scheduler.schedule` (HorizonServe's policies
only; the baselines keep vLLM's order):

* **View order** (`view_order`): the swapped-in `waiting` queue holds the view's visible
  requests as (1) those at risk — continuations and protected requests, on-time short-path
  prefills — in deadline order, (2) late short-path prefills in queue order, (3) long-path
  requests that still have slack (unprotected, before `protect_at`) in deadline order, (4) late
  long-path prefills and those that can no longer meet their deadline, in deadline order. A
  late short-path prompt has missed its SLO, so it yields to requests that can still meet
  theirs; but never to long-path requests with seconds of slack, which lose nothing by a short
  prefill first. Late short-path prefills are visible in every phase (a long-path phase would
  otherwise hide them behind the speech it admits). A long-path prompt that can no longer make
  its deadline goes last: under overload the places go to those that still can.
* **Victim order** (`order_running`): vLLM's FCFS scheduler, when a running request cannot get
  its KV blocks, preempts `running[-1]`. The plugin keeps `running` ordered so that the tail is
  the request HorizonServe would give up first: short-path requests in front, then long-path
  ones whose first response is at risk (past `protect_at`, not yet handed downstream) by
  deadline, then the other long-path ones in admission order, newest last (the fewest tokens
  to recompute, as vLLM's priority policy picks). So vLLM's own KV preemption never picks a
  short-path request while a long-path request runs. The same order hands vLLM's token budget
  to short-path requests first. Applied only in steps where that preemption can act (fewer
  free KV blocks than the running requests could take).
* **Measured recompute cost** (`RecomputeCost`, `preemption_pays`): a shared-stage preemption
  costs the victim's recompute: its prompt and decoded tokens prefilled again, at the per-token
  prefill time measured from the engine's own steps (step interval against the tokens the step
  prefilled), not the profile's constant. It pays when that time, counted once for the
  preemption and once more for every pending request that the delay would push past its
  deadline (0 ≤ its wait margin < the recompute), is less than the wait saved.
* **Prefill indexes** (`PrefillIndex`): the waiting prefills of each path kept sorted by
  deadline, latest start and protection instant on entry and exit, so the rules above find the
  urgent ones, the margins they count, whether one is late and the head of the slack order
  without walking every waiting request per step.
"""

from __future__ import annotations

import math
from bisect import bisect_left, bisect_right
from collections.abc import Callable, Iterable, Iterator
from itertools import count
from typing import Any, Generic, TypeVar

from horizonserve.runtime.profiler import RequestSignals

T = TypeVar("T")

_INF = math.inf


def _deadline_key(sig: RequestSignals) -> tuple[float, int]:
    return sig.deadline, sig.seq


def view_order(
    visible: Callable[[RequestSignals], bool],
    queue: Iterable[T],
    signals: Callable[[T], RequestSignals],
    now: float,
) -> list[T]:
    """The visible requests of `queue` (per `visible`, plus every late short-path prefill) in
    the order of the module docstring. O(queue + visible log visible)."""
    front: list[tuple[tuple[float, int], T]] = []
    late_short: list[T] = []
    slack_long: list[tuple[tuple[float, int], T]] = []
    late_long: list[tuple[tuple[float, int], T]] = []
    for item in queue:
        sig = signals(item)
        if not sig.long_path:
            if sig.late and not sig.prefilled:
                late_short.append(item)  # visible in every phase
            elif visible(sig):
                front.append(((sig.deadline, sig.seq), item))
            continue
        if not visible(sig):
            continue
        if sig.prefilled:
            if now < sig.protect_at:
                slack_long.append(((sig.deadline, sig.seq), item))
            else:
                front.append(((sig.deadline, sig.seq), item))
        elif sig.late or sig.can_wait_s(now) < 0.0:
            late_long.append(((sig.deadline, sig.seq), item))  # late, or can no longer make it
        elif sig.protected or now >= sig.protect_at:
            front.append(((sig.deadline, sig.seq), item))
        else:
            slack_long.append(((sig.deadline, sig.seq), item))
    front.sort(key=_first)
    slack_long.sort(key=_first)
    late_long.sort(key=_first)
    out = [item for _, item in front]
    out.extend(late_short)
    out.extend(item for _, item in slack_long)
    out.extend(item for _, item in late_long)
    return out


def _first(pair: tuple[tuple[float, int], Any]) -> tuple[float, int]:
    return pair[0]


def running_key(sig: RequestSignals | None, now: float, handed_off: bool) -> tuple[int, float, int]:
    """Sort key of a running request: front = keep, tail = preempt first (module docstring).
    Unknown requests (no signals) stay in front."""
    if sig is None:
        return (0, 0.0, -1)
    if not sig.long_path:
        return (0, 0.0, sig.seq)
    if not handed_off and now >= sig.protect_at:
        return (1, sig.deadline, sig.seq)
    return (2, 0.0, sig.seq)


def order_running(
    running: list[Any],
    now: float,
    signals: Callable[[Any], RequestSignals | None],
    handed_off: Callable[[Any], bool],
) -> bool:
    """Sort `running` in place by `running_key`; True when the order changed. O(R log R)."""
    keys = []
    for request in running:
        sig = signals(request)
        keys.append(
            running_key(sig, now, sig is not None and sig.long_path and handed_off(request))
        )
    order = sorted(range(len(running)), key=keys.__getitem__)
    if all(i == j for i, j in enumerate(order)):
        return False
    running[:] = [running[i] for i in order]
    return True


class RecomputeCost:
    """Per-token prefill time measured from the engine's steps.

    `observe(dt_s, prefill_tokens)`: the interval since the last step began and the tokens the
    last step prefilled (its scheduled tokens beyond one per request). Decode-only intervals
    track the base step time; the others give (dt − base) / tokens. Both are exponential means
    (weight `alpha`); an interval above `gap_factor` × the prediction is an idle gap, skipped.
    Until a prefill was measured the estimate is `prior_s_per_token` (the class profile's).
    """

    __slots__ = ("_alpha", "_base", "_gap", "per_token_s", "samples")

    def __init__(
        self, prior_s_per_token: float, *, alpha: float = 0.1, gap_factor: float = 10.0
    ) -> None:
        self.per_token_s = prior_s_per_token
        self._alpha = alpha
        self._gap = gap_factor
        self._base: float | None = None
        self.samples = 0  # prefill intervals measured

    @property
    def base_s(self) -> float | None:
        return self._base

    def observe(self, dt_s: float, prefill_tokens: int) -> None:
        if dt_s <= 0.0:
            return
        base = self._base
        if prefill_tokens <= 0:
            if base is None:
                self._base = dt_s
            elif dt_s <= self._gap * base:
                self._base = base + self._alpha * (dt_s - base)
            return
        if base is None or dt_s > self._gap * (base + self.per_token_s * prefill_tokens):
            return
        sample = max(0.0, dt_s - base) / prefill_tokens
        if self.samples == 0:
            self.per_token_s = sample
        else:
            self.per_token_s += self._alpha * (sample - self.per_token_s)
        self.samples += 1

    def recompute_s(self, tokens: int) -> float:
        """Time to prefill `tokens` again."""
        return tokens * self.per_token_s


# Widening of the latest-start window: candidates within it are then tested with the exact
# `can_wait_s` expression, so float rounding of d − r̂ − now never changes the answer.
_WINDOW_EPS_S = 1e-6


class _Entry(Generic[T]):
    __slots__ = ("dl", "item", "prot", "rid", "sig", "start", "ticket")

    def __init__(self, rid: str, item: T, sig: RequestSignals, ticket: int) -> None:
        self.rid, self.item, self.sig, self.ticket = rid, item, sig, ticket
        self.start = (sig.deadline - sig.remaining_s(), sig.seq)
        self.dl = (sig.deadline, sig.seq)
        self.prot: tuple[float, int] | None = None  # key in the protect_at list, if there


def _ticket(entry: _Entry[Any]) -> int:
    return entry.ticket


class PrefillIndex(Generic[T]):
    """The shared stage's waiting prefills of one path, indexed so that the per-step questions
    of the preemption rule and the slack view do not walk every one of them.

    Relies on three invariants of the control core: while a prefill waits its r̂ is fixed
    (profiler.py), so its latest start d − r̂ and its protection instant `protect_at` are
    constants; `protected` is latched only once the clock passed `protect_at` (at entry or at a
    step's plan); `late`, once set, holds until the request leaves the queue, and a late
    request is never protected (temporal.py).

    * entry order: a dict by request id (iteration, `len`, membership);
    * by deadline: sorted (d, seq): the k earliest in O(k);
    * by latest start: sorted (d − r̂, seq): the ones with 0 ≤ can_wait < w in O(log n + k);
    * by protect_at: sorted (protect_at, seq) of those not yet seen late: every protected one
      lies in the prefix protect_at ≤ now; late ones met there move to `late` for good, so a
      query walks the protected ones (and those not yet latched), each late one once.

    Each order is one sorted list of (key, seq, entry) triples (seq is unique, so the entry is
    never compared). Maintained on add / discard (O(log n) search, one O(n) C-level list
    shift per order); equal to a full scan of the waiting prefills after any sequence of them.
    """

    __slots__ = ("_bound", "_by_id", "_dl", "_late", "_prot", "_start", "_tickets", "_windows")

    def __init__(self, *, windows: bool = True) -> None:
        # windows: keep the latest-start order (`urgent`, `margins_below`); off, those refuse.
        self._windows = windows
        self._by_id: dict[str, _Entry[T]] = {}
        self._dl: list[_Triple] = []
        self._start: list[_Triple] = []
        self._prot: list[_Triple] = []
        self._late: dict[str, _Entry[T]] = {}
        # Largest protect_at of a request latched protected at entry (it entered after the
        # step's plan, at a later clock): the protected prefix reaches at least this far.
        self._bound = -_INF
        self._tickets = count()

    def __len__(self) -> int:
        return len(self._by_id)

    def __contains__(self, rid: object) -> bool:
        return rid in self._by_id

    def __iter__(self) -> Iterator[T]:
        """The items in entry order."""
        return (e.item for e in self._by_id.values())

    def add(self, rid: str, item: T, sig: RequestSignals) -> None:
        """`item` (a waiting prefill, `sig` as the control core left it) entered."""
        if rid in self._by_id:
            self.discard(rid)
        e = _Entry(rid, item, sig, next(self._tickets))
        self._by_id[rid] = e
        if self._windows:
            _insert(self._start, e.start, e)
        _insert(self._dl, e.dl, e)
        if sig.late:
            self._late[rid] = e
            return
        e.prot = (sig.protect_at, sig.seq)
        _insert(self._prot, e.prot, e)
        if sig.protected and sig.protect_at > self._bound:
            self._bound = sig.protect_at

    def discard(self, rid: str) -> T | None:
        """The request left (taken, aborted, freed); its item, or None if not here."""
        e = self._by_id.pop(rid, None)
        if e is None:
            return None
        if self._windows:
            _remove(self._start, e.start, e)
        _remove(self._dl, e.dl, e)
        if e.prot is not None:
            _remove(self._prot, e.prot, e)
        else:
            self._late.pop(rid, None)
        return e.item

    def _protected(self, now: float) -> list[_Entry[T]]:
        """The protected entries; late ones met on the way leave the protect_at list."""
        prot = self._prot
        hi = bisect_right(prot, (max(now, self._bound), _INF))
        out: list[_Entry[T]] = []
        late: list[int] = []
        for i in range(hi):
            e = prot[i][2]
            sig = e.sig
            if sig.protected:
                out.append(e)
            elif sig.late:
                late.append(i)
        for i in reversed(late):
            e = prot[i][2]
            del prot[i]
            e.prot = None
            self._late[e.rid] = e
        return out

    def protected(self, now: float) -> list[T]:
        """The protected ones, in protection-instant order. O(protected + not yet latched)."""
        return [e.item for e in self._protected(now)]

    def earliest(self, k: int, exclude: Any = ()) -> list[T]:
        """The `k` with the earliest (deadline, seq) not in `exclude`, in that order.
        O(k + excluded ones met)."""
        out: list[T] = []
        if k <= 0:
            return out
        for _, _, e in self._dl:
            if e.item not in exclude:
                out.append(e.item)
                if len(out) == k:
                    break
        return out

    def upto(
        self, bound: tuple[float, int] | None, keep: Callable[[RequestSignals], bool]
    ) -> list[T]:
        """Those with (deadline, seq) ≤ `bound` (all with None) that `keep` accepts, in
        deadline order. O(those up to the bound)."""
        out: list[T] = []
        for d, seq, e in self._dl:
            if bound is not None and (d, seq) > bound:
                break
            if keep(e.sig):
                out.append(e.item)
        return out

    def _window(self, now: float, width_s: float) -> list[_Triple]:
        """Candidates for 0 ≤ can_wait_s(now) < width_s (a superset; callers test exactly)."""
        if not self._windows:
            raise ValueError("this index keeps no latest-start order (windows=False)")
        start = self._start
        lo = bisect_left(start, (now - _WINDOW_EPS_S,))
        hi = bisect_left(start, (now + width_s + _WINDOW_EPS_S,), lo)
        return start[lo:hi]

    def urgent(self, now: float, wait_s: float) -> list[T]:
        """The ones that need a place sooner than `wait_s` (in entry order): protected, or
        able to meet their deadline but not after that wait (0 ≤ d − now − r̂ < wait_s).
        O(log n + protected + k)."""
        out = self._protected(now)
        if wait_s > 0.0:
            for _, _, e in self._window(now, wait_s):
                sig = e.sig
                if not sig.protected and 0.0 <= sig.can_wait_s(now) < wait_s:
                    out.append(e)
        out.sort(key=_ticket)
        return [e.item for e in out]

    def margins_below(self, now: float, below_s: float, exclude: set[Any]) -> list[float]:
        """can_wait_s(now) of those not in `exclude` with 0 ≤ can_wait < `below_s`: the
        margins `preemption_pays` counts (the others it ignores). O(log n + k)."""
        if below_s <= 0.0:
            return []
        out = []
        for _, _, e in self._window(now, below_s):
            m = e.sig.can_wait_s(now)
            if 0.0 <= m < below_s and e.item not in exclude:
                out.append(m)
        return out

    def any_late(self, now: float) -> bool:
        """Some waiting prefill is late. O(protected) plus the newly late."""
        self._protected(now)
        return bool(self._late)


_Triple = tuple[float, int, Any]  # (key, seq, entry): sorted by (key, seq), unique seq


def _insert(lst: list[_Triple], key: tuple[float, int], e: Any) -> None:
    # A (key, seq) pair sorts before every triple that starts with it: no entry compared.
    lst.insert(bisect_left(lst, key), (key[0], key[1], e))


def _remove(lst: list[_Triple], key: tuple[float, int], e: Any) -> None:
    i = bisect_left(lst, key)
    n = len(lst)
    while i < n and lst[i][2] is not e:
        if (lst[i][0], lst[i][1]) != key:
            i = n
            break
        i += 1
    if i >= n:
        raise KeyError(key)  # the order lost an entry: a bug, not a state to carry on from
    del lst[i]


def preemption_pays(recompute_s: float, sooner_s: float, margins: Iterable[float]) -> bool:
    """The preemption's recompute, counted once and once more per pending request it would
    push past its deadline (its wait margin in [0, recompute)), costs less than the wait it
    saves the short-path prompt (`sooner_s`)."""
    hurt = 0
    for m in margins:
        if 0.0 <= m < recompute_s:
            hurt += 1
    return recompute_s * (1 + hurt) < sooner_s
