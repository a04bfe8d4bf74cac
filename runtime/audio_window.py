"""vLLM-Omni's current rules, as the `vllm-omni-current` baseline runs them.

Bounded-K active streams (merged upstream: vllm-project/vllm-omni PR #3592, "Bounded-K
active-stream window for Stage 1"; in vLLM-Omni 0.30 `OmniChunkTransferAdapter`,
`active_stream_window`, K = min(window, max_num_seqs)): at most K streams of a streaming stage
are active at once; the others wait, and an active stream keeps its place until it is done.

EDF playback (vllm-project/vllm-omni PR #6600, open; its first version PR #6599 closed unmerged:
`active_stream_policy: edf`): the window is filled by deadline (first-audio deadline for a
stream not yet started) instead of FIFO, and established streams near buffer exhaustion are
protected. `EdfQueue` is that order: earliest deadline first, with no late-last rule (a stream
past its deadline keeps its place in deadline order, unlike HorizonServe's `SlackQueue`).

DTPS tiered admission at the shared stage (vllm-project/vllm-omni PR #6315, open, RFC #6237;
`vllm_omni/core/sched/dtps_scheduler.py`, `DTPSScheduler.maybe_reorder_waiting`): each step the
waiting queue is reordered into four tiers, with fixed budgets and no deadlines:

    L0  any request waiting longer than `aging_s` (100 s), FCFS
    L1  downstream-bound requests within the budget, shortest prompt first
    L2  requests that end at the shared stage, FCFS
    L3  downstream-bound requests beyond the budget, shortest prompt first

budget = max(0, threshold − effective), effective = the downstream stage's waiting count +
the shared stage's running downstream-bound requests (one replica); threshold 2 (the PR's
default `dit_load_threshold`).
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable, Sequence
from typing import TypeVar

from horizonserve.runtime.downstream import Stamp, _Entry, _Handout

T = TypeVar("T")

DTPS_AGING_S = 100.0  # `_DEFAULT_AGING_S`
DTPS_THRESHOLD = 2  # `_DEFAULT_DIT_LOAD_THRESHOLD`


def window_size(window: int | None, max_num_seqs: int) -> int:
    """K, the bounded-K window's active streams: min(window, max_num_seqs) as PR #3592's
    `OmniChunkTransferAdapter._active_window` (None: the stage's `max_num_seqs`, no bound
    below its places). Invariant: 1 ≤ K ≤ max_num_seqs."""
    if max_num_seqs < 1:
        raise ValueError(f"window: the stage has {max_num_seqs} places; it needs at least one")
    k = max_num_seqs if window is None else min(window, max_num_seqs)
    if k < 1:
        raise ValueError(f"window: K = {window} admits no stream; use K >= 1")
    return k


def window_room(k: int, active: int) -> int:
    """New streams the window admits now: K minus the active ones (PR #3592: an active stream
    keeps its place until it is done, so only a finished one frees room)."""
    return max(0, k - active)


def dtps_budget(threshold: int, downstream_waiting: int, running_downstream: int) -> int:
    """L1's budget: how many downstream-bound requests go ahead of the shared-only ones."""
    return max(0, threshold - (downstream_waiting + running_downstream))


def dtps_order(
    waiting: Sequence[T],
    now: float,
    *,
    downstream: Callable[[T], bool],
    prompt_tokens: Callable[[T], int],
    arrival: Callable[[T], float],
    budget: int,
    aging_s: float = DTPS_AGING_S,
) -> list[T]:
    """`waiting` (in queue order) in DTPS's tier order (module doc). Invariants: a
    permutation of `waiting`; at most `budget` downstream-bound requests of L1 precede the
    first shared-only one; sorts are stable (ties keep queue order)."""
    starving: list[T] = []
    shared_only: list[T] = []
    bound: list[T] = []
    for item in waiting:
        if now - arrival(item) > aging_s:
            starving.append(item)
        elif downstream(item):
            bound.append(item)
        else:
            shared_only.append(item)
    bound.sort(key=prompt_tokens)
    return starving + bound[:budget] + shared_only + bound[budget:]


class EdfQueue(_Handout[T]):
    """Earliest deadline first, no late-last rule (EDF playback's admission order)."""

    __slots__ = ("_heap", "_items", "_seq")

    def __init__(self) -> None:
        self._heap: list[tuple[float, int, _Entry[T]]] = []
        self._items: dict[int, _Entry[T]] = {}  # id(item) -> live entry
        self._seq = itertools.count()
        self.late_popped = 0

    def __len__(self) -> int:
        return len(self._items)

    def push(self, item: T, stamp: Stamp, first_output_s: float, work: float = 0.0) -> None:
        if id(item) in self._items:
            raise ValueError(f"request {stamp.request_id!r} is already queued")
        e = _Entry(item, stamp, first_output_s, next(self._seq), work)
        self._items[id(item)] = e
        heapq.heappush(self._heap, (e.deadline, e.seq, e))

    def _top(self) -> _Entry[T] | None:
        heap = self._heap
        while heap and self._items.get(id(heap[0][2].item)) is not heap[0][2]:
            heapq.heappop(heap)  # removed (or re-pushed) since: dropped lazily
        return heap[0][2] if heap else None

    def pop(self, now: float) -> tuple[T, bool] | None:
        e = self._top()
        if e is None:
            return None
        heapq.heappop(self._heap)
        del self._items[id(e.item)]
        late = now > e.late_at
        self.late_popped += late
        return e.item, late

    def peek_slack(self, now: float) -> float | None:
        e = self._top()
        return None if e is None else e.stamp.slack_ratio(now, e.first_s)

    def order(
        self,
        now: float,
        free_at: Sequence[float] | None = None,
        s_per_work: float = 0.0,
        limit: int | None = None,
    ) -> list[tuple[T, bool]]:
        live = sorted(self._items.values(), key=lambda e: (e.deadline, e.seq))
        if limit is not None:
            live = live[:limit]
        return [(e.item, now > e.late_at) for e in live]

    def remove(self, item: T) -> bool:
        return self._items.pop(id(item), None) is not None  # its heap entry goes lazily
