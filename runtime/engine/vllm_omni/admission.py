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
served and counted (`late_admitted`), never dropped (`reject_late` is not applied here), and
`place_admission` is not applied either: it needs each request's answer length at admission,
which vLLM-Omni's talker learns only when it stops, so this stage keeps deadline order.

Cost per step: O(k log n) for the k handed out, plus one O(n) pass over `waiting` when the head
is not already in slack order (n = the stage's waiting requests, few in practice).
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


class DownstreamAdmission:
    """One downstream stage's admission order (see the module docstring)."""

    def __init__(
        self,
        queue: AdmissionQueue,
        *,
        first_stage: bool,
        clock_ns: Callable[[], int],
    ) -> None:
        self.queue = queue
        self.slack_order = isinstance(queue, SlackQueue)
        self.first_stage = first_stage
        self.clock_ns = clock_ns
        # id(request) -> (request, stamp, first_output_s) of the requests the queue manages.
        self._managed: dict[int, tuple[Any, CoreStamp, float]] = {}
        self._offered: list[Any] = []  # handed out for the step in progress
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
    def on_enqueue(self, request: Any, stamp: CoreStamp | None) -> None:
        """A request entered `waiting` for the first time (an unstamped one is not managed)."""
        key = id(request)
        if stamp is None or key in self._managed:
            return
        first_s = self.first_output_s(stamp)
        self._managed[key] = (request, stamp, first_s)
        self.queue.push(request, stamp, first_s)

    def on_leave(self, request: Any) -> None:
        """A request left for good (finished or aborted)."""
        if self._managed.pop(id(request), None) is not None:
            self.queue.remove(request)

    # -- per step -----------------------------------------------------------------------------
    def before_schedule(self, sched: Any) -> None:
        """Bring the requests to admit next to the head of `waiting` (slack order only)."""
        waiting = sched.waiting
        if not self.slack_order or not self._managed or not isinstance(waiting, FCFSRequestQueue):
            return
        free = sched.max_num_running_reqs - len(sched.running)
        want = min(max(free, 1), len(self._managed))
        now = self.clock_ns() * 1e-9
        offered: list[Any] = []
        parked: list[Any] = []  # handed out, but not in `waiting` now (an input gate holds it)
        queue = self.queue
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
        for request in self._offered:
            if id(request) in self._managed:
                self._push_back(request)
        self._offered = []

    def _push_back(self, request: Any) -> None:
        _, stamp, first_s = self._managed[id(request)]
        self.queue.push(request, stamp, first_s)
