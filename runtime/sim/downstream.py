"""Downstream stage processes (talker, code2wav, diffusion …) as fluid batch servers.

A stage serves up to `max_batch` jobs at once (continuous batching, FIFO admission); each step
advances every job in service by one unit of work, and a step takes
`DownstreamCost.step_s(jobs, SMs, shared busy, …)`. Between changes of those conditions the
stage progresses at a constant rate, so instead of one event per step the stage keeps a virtual
step counter `v` and only schedules the next *milestone* (a job's first chunk or completion).
Whenever the conditions change (a job joins or leaves, the shared stage starts or stops, the SM
split moves) the counter is brought up to date and the rate recomputed — exact for the fluid
model, and independent of how many steps a request needs.

Chains: a long-path request walks the pipeline's stages in order. A stage's *head* job emits its
first chunk after `first_output_work` steps: to the next stage (which then processes that chunk
as its own head job) or, at the last stage, as the request's first user-visible output. When a
non-last job completes, the rest of the request's work goes to the next stage as a *tail* job.
"""

from __future__ import annotations

import heapq
import itertools
from collections import deque
from collections.abc import Callable

from horizonserve.runtime.sim.model import DownstreamCost, Sharing
from horizonserve.runtime.sim.request import SimRequest

_EPS = 1e-7


class Job:
    __slots__ = ("first", "head", "req", "stage", "work")

    def __init__(
        self, req: SimRequest, stage: int, work: float, first: float | None, head: bool
    ) -> None:
        self.req = req
        self.stage = stage
        self.work = work
        self.first = first if first is not None and first < work else None
        self.head = head


class FluidStage:
    """One downstream stage process."""

    __slots__ = (
        "_seq",
        "busy_since",
        "busy_time",
        "cost",
        "heap",
        "in_service",
        "index",
        "max_batch",
        "queue",
        "rate",
        "schedule",
        "t_last",
        "v",
        "version",
    )

    def __init__(
        self, index: int, cost: DownstreamCost, schedule: Callable[[float, int, int], None]
    ) -> None:
        self.index = index
        self.cost = cost
        self.max_batch = cost.cal.max_batch
        self.schedule = schedule  # schedule(time, stage index, version)
        self.in_service = 0
        self.queue: deque[Job] = deque()
        self.heap: list[tuple[float, int, Job, bool]] = []  # (v target, seq, job, is_first)
        self._seq = itertools.count()
        self.v = 0.0
        self.t_last = 0.0
        self.rate = 0.0
        self.version = 0
        self.busy_time = 0.0
        self.busy_since = -1.0

    @property
    def active(self) -> bool:
        return self.in_service > 0 or bool(self.queue)

    def advance(self, now: float) -> None:
        if self.rate:
            self.v += (now - self.t_last) * self.rate
        self.t_last = now

    def _start(self, job: Job, now: float) -> None:
        if self.in_service == 0:
            self.busy_since = now
        self.in_service += 1
        seq = next(self._seq)
        v = self.v
        if job.first is not None:
            heapq.heappush(self.heap, (v + job.first, seq, job, True))
        heapq.heappush(self.heap, (v + job.work, seq, job, False))

    def submit(self, job: Job, now: float) -> None:
        """A job arrives; the caller re-rates the stage afterwards (`rerate`)."""
        self.advance(now)
        if self.in_service < self.max_batch:
            self._start(job, now)
        else:
            self.queue.append(job)

    def rerate(
        self,
        now: float,
        sms: int,
        shared_busy: bool,
        shared_sms: int,
        sharing: Sharing,
        force: bool = False,
    ) -> None:
        """Recompute the step rate under the current conditions and schedule the next milestone.

        `force`: reschedule even at an unchanged rate (the set of milestones changed).
        """
        self.advance(now)
        if self.in_service == 0:
            if self.rate:
                self.rate = 0.0
                self.version += 1
            return
        rate = 1.0 / self.cost.step_s(self.in_service, sms, shared_busy, shared_sms, sharing)
        if rate == self.rate and not force:
            return
        self.rate = rate
        self.version += 1
        self.schedule(now + max(0.0, self.heap[0][0] - self.v) / rate, self.index, self.version)

    def pop_due(self, now: float) -> list[tuple[Job, bool]]:
        """Milestones reached by `now` (first chunks and completions), in order."""
        self.advance(now)
        due: list[tuple[Job, bool]] = []
        heap = self.heap
        limit = self.v + _EPS * (1.0 + abs(self.v))
        while heap and heap[0][0] <= limit:
            _, _, job, is_first = heapq.heappop(heap)
            due.append((job, is_first))
            if not is_first:
                self.in_service -= 1
        while self.queue and self.in_service < self.max_batch:
            self._start(self.queue.popleft(), now)
        if self.in_service == 0 and self.busy_since >= 0:
            self.busy_time += now - self.busy_since
            self.busy_since = -1.0
        return due

    def finish(self, now: float) -> None:
        """Close the busy-time accounting at the end of a run."""
        if self.busy_since >= 0:
            self.busy_time += now - self.busy_since
            self.busy_since = now
