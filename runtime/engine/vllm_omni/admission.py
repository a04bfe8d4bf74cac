"""Downstream admission by slack in vLLM-Omni's downstream stage schedulers.

A downstream stage (Qwen2.5-Omni's talker and code2wav, MiMo-Audio's code2wav) admits from its
`waiting` queue in the order of the control core's admission queue for the policy
(`SchedulingPolicy.downstream_queue()`): `SlackQueue` — earliest first-response deadline among
requests that can still meet it, late ones behind — or `FifoQueue` for the baselines and the
"w/o downstream control" ablation, where vLLM's own order is left as it is.

Each request is pushed once, with the stamp it carries from the API hook (`stamps.Stamp.
as_core`: class, deadline, downstream estimate; nothing is recomputed here). Its remaining time
to the first output at this stage is the stamp's downstream estimate at the first downstream
stage (the hand-off from the shared stage) and 0 at later ones, whose own step is the last one
before the first output: there a request is late once its deadline has passed.

Before each `schedule()` the stage moves the requests the queue hands out next — as many as
vLLM may admit this step (free places, at least one) — to the head of `waiting`, in that
order, right behind the requests the queue does not manage: continuations (a request vLLM
preempted, a native generation chunk re-queued) and unstamped requests keep the head, as vLLM
left it. Every other request keeps its relative position. After the step, what vLLM took leaves
the queue (counted, late or not); what it did not take goes back into it. Late requests are
served and counted (`late_admitted`), never dropped (`reject_late` is not applied here).

Place-aware order (`place`: the policy's `place_admission`, at the first downstream stage): a
request's work is its answer's length at the shared stage (`shared.AnswerLengths`, recorded
when the thinker finished: the talker's own prompt carries only the thinker prompt's length),
and the stage's seconds per unit of work are measured from the requests it finished
(admission to finish over their work: exponential mean). Once both are known and the places
cannot take every waiting request, the requests to admit into the free places are the control
core's place-aware listing (`SlackQueue.order` over the running requests' estimated free times:
Moore–Hodgson, a long answer that would make shorter ones miss goes behind them) instead of
plain deadline order. Without a length (a streaming thinker hands off before it finishes,
a record dropped) a request has work 0 and keeps its deadline place.

Cost per step: O(k log n) for the k handed out, plus one O(n) pass over `waiting` when the head
is not already in slack order (n = the stage's waiting requests, few in practice); a step that
admits under the place-aware order lists instead (`SlackQueue.order`: ≈ 7 µs at 16 waiting,
250 µs at 256 waiting on 16 places, on a loaded 2-core CPU).
"""

from __future__ import annotations

from collections.abc import Callable
from itertools import filterfalse, islice
from typing import Any

from vllm.v1.core.sched.request_queue import FCFSRequestQueue
from vllm.v1.request import RequestStatus

from horizonserve.runtime.downstream import AdmissionQueue, SlackQueue
from horizonserve.runtime.downstream import Stamp as CoreStamp

_WAITING = RequestStatus.WAITING
_DONE = (RequestStatus.FINISHED_STOPPED, RequestStatus.FINISHED_LENGTH_CAPPED)
WORK_ALPHA = 0.2  # weight of a new sample in the measured seconds per unit of work


class DownstreamAdmission:
    """One downstream stage's admission order (see the module docstring)."""

    def __init__(
        self,
        queue: AdmissionQueue,
        *,
        first_stage: bool,
        clock_ns: Callable[[], int],
        place: bool = False,
    ) -> None:
        self.queue = queue
        self.slack_order = isinstance(queue, SlackQueue)
        self.first_stage = first_stage
        self.clock_ns = clock_ns
        self.place = place and self.slack_order and first_stage
        # id(request) -> (request, stamp, first_output_s) of the requests the queue manages.
        self._managed: dict[int, tuple[Any, CoreStamp, float]] = {}
        self._offered: list[Any] = []  # handed out for the step in progress
        self._listed = False  # `_offered` was listed (still queued), not popped
        # Place-aware order: work (answer tokens) of managed and running requests, admission
        # time of running ones, and the measured seconds per unit of work (0: not yet).
        self._work: dict[int, float] = {}
        self._started: dict[int, float] = {}
        self.s_per_work = 0.0
        self.work_samples = 0
        self.place_steps = 0  # steps whose head came from the place-aware listing
        # Counters (metrics, tests).
        self.admitted = 0
        self.late_admitted = 0  # admitted after they could no longer meet their deadline
        self.reorders = 0  # steps whose head of `waiting` was rearranged

    def __len__(self) -> int:
        return len(self._managed)

    def first_output_s(self, stamp: CoreStamp) -> float:
        return stamp.downstream_s if self.first_stage else 0.0

    def is_late(self, stamp: CoreStamp, first_output_s: float, now: float) -> bool:
        return now > stamp.deadline - first_output_s

    # -- membership -------------------------------------------------------------------------
    def on_enqueue(self, request: Any, stamp: CoreStamp | None, work: float = 0.0) -> None:
        """A request entered `waiting` for the first time (an unstamped one is not managed);
        `work`: its answer's length (0: unknown)."""
        key = id(request)
        if stamp is None or key in self._managed:
            return
        first_s = self.first_output_s(stamp)
        self._managed[key] = (request, stamp, first_s)
        if work > 0.0 and self.place:
            self._work[key] = work
        self.queue.push(request, stamp, first_s, self._work.get(key, 0.0))

    def on_leave(self, request: Any) -> None:
        """A request left for good (finished or aborted); a finished one with a known work
        is a sample of the stage's seconds per unit of work."""
        key = id(request)
        if self._managed.pop(key, None) is not None:
            self.queue.remove(request)
        work = self._work.pop(key, 0.0)
        started = self._started.pop(key, None)
        if started is not None and work > 0.0 and request.status in _DONE:
            sample = (self.clock_ns() * 1e-9 - started) / work
            n = self.work_samples
            self.s_per_work = (
                sample if n == 0 else self.s_per_work + WORK_ALPHA * (sample - self.s_per_work)
            )
            self.work_samples = n + 1

    # -- per step -----------------------------------------------------------------------------
    def before_schedule(self, sched: Any) -> None:
        """Bring the requests to admit next to the head of `waiting` (slack order only)."""
        waiting = sched.waiting
        if not self.slack_order or not self._managed or not isinstance(waiting, FCFSRequestQueue):
            return
        free = sched.max_num_running_reqs - len(sched.running)
        want = min(max(free, 1), len(self._managed))
        now = self.clock_ns() * 1e-9
        queue = self.queue
        # Place order where a place is free but not one for every waiting request: with none
        # free vLLM admits nothing this step, and the listing costs O(PLACE_HORIZON² · places).
        if self.place and self.s_per_work > 0.0 and 0 < free < len(self._managed):
            listing = queue.order(now, self._free_at(sched, now, free), self.s_per_work, want)
            offered = [item for item, _ in listing if item.status == _WAITING]
            self._offered, self._listed = offered, True
            self.place_steps += 1
            if offered:
                self._reorder(waiting, offered)
            return
        offered: list[Any] = []
        parked: list[Any] = []  # handed out, but not in `waiting` now (an input gate holds it)
        while len(offered) < want:
            popped = queue.pop(now)
            if popped is None:
                break
            request = popped[0]
            # A managed request sits in `waiting` exactly while its status is WAITING: Omni's
            # input gates park it under their own status, blocked ones go to skipped_waiting.
            (offered if request.status == _WAITING else parked).append(request)
        for request in parked:
            self._push_back(request)
        self._offered = offered
        if offered:
            self._reorder(waiting, offered)

    def _free_at(self, sched: Any, now: float, free: int) -> list[float]:
        """When each place frees: a running request at its admission + work × the measured
        seconds per unit of work (now when overdue or unknown), a free place now."""
        out = [now] * max(free, 0)
        work, started, s = self._work, self._started, self.s_per_work
        for request in sched.running:
            key = id(request)
            t0 = started.get(key)
            w = work.get(key, 0.0)
            end = now if t0 is None or w <= 0.0 else t0 + w * s
            out.append(end if end > now else now)
        return out

    def _reorder(self, waiting: FCFSRequestQueue, offered: list[Any]) -> None:
        """`waiting` = unmanaged head + `offered` + every other request in its order."""
        managed = self._managed
        head = 0
        for request in waiting:  # the unmanaged requests vLLM left at the head stay there
            if id(request) in managed:
                break
            head += 1
        n = len(offered)
        if all(waiting[head + i] is offered[i] for i in range(min(n, len(waiting) - head))):
            return  # already in order (the common case: FIFO arrivals with equal classes)
        chosen = set(offered)
        order = list(waiting)
        waiting.clear()
        waiting.extend(order[:head])
        waiting.extend(offered)
        waiting.extend(filterfalse(chosen.__contains__, islice(order, head, None)))  # C loop
        self.reorders += 1

    def after_schedule(self, sched: Any, out: Any) -> None:
        """What vLLM took leaves the queue (counted); the offered rest goes back into it."""
        requests = sched.requests
        now = self.clock_ns() * 1e-9
        taken = [data.req_id for data in out.scheduled_new_reqs]
        for rid in taken:
            request = requests.get(rid)
            entry = None if request is None else self._managed.pop(id(request), None)
            if entry is None:
                continue
            self.queue.remove(request)  # False when it was handed out (already popped)
            self.admitted += 1
            if self.is_late(entry[1], entry[2], now):
                self.late_admitted += 1
            if self.place:
                self._started[id(request)] = now
        if not self._listed:  # listed ones were never popped: they are still queued
            for request in self._offered:
                if id(request) in self._managed:
                    self._push_back(request)
        self._offered = []
        self._listed = False

    def _push_back(self, request: Any) -> None:
        key = id(request)
        _, stamp, first_s = self._managed[key]
        self.queue.push(request, stamp, first_s, self._work.get(key, 0.0))
