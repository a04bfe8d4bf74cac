"""Downstream stage processes (talker, code2wav, diffusion …) as fluid batch servers.

A stage serves up to `max_batch` jobs at once (continuous batching, admission below); each step
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

Admission is the policy's (`SchedulingPolicy.downstream_queue`, the control core's queue): head
jobs wait in it (slack order under HorizonServe, FIFO for the baselines); tail jobs carry a
stream that has already started, so they go first, in arrival order. A free place is filled in
queue order; under the policy's `place_admission`, a streaming stage lists its queue in the
place-aware order (`AdmissionQueue.order` with the places' free times: the free ones now, the
others when their job completes at the last step rate). Under downstream control a streaming
stage also stops admitting head jobs at its real-time stream capacity (`realtime_streams`).

Batch choice under downstream control (`runtime.batch_admission`, the rule of the reference
image stage). At the chain's last stage when its first output is its completion (the image
generator: no `first_output_work`, not streaming) and its queue is slack-ordered (the policy's
downstream control), the stage does not fill free places in queue order: `choose_batch` picks
which jobs run, from the jobs in service and the queued ones alike, whenever the set can change
(a job arrives or finishes), whenever the conditions re-rate the stage, and at a re-rate one
step of the batch after the last choice (the engine chooses before every step; the fluid stage
re-chooses at events only). Its step time per batch size (`StepTimes`) is fed, at each choice,
the cost model's `step_s(b, …)` for b = 1 … max_batch under the current conditions, as the
engine feeds it the steps it measures. A job left out is paused: back in the queue with its
done work kept (done = v − v0 on pausing, v0 = v − done on resuming); the heap holds the
batch's completions only and is rebuilt whenever the batch changes, so a paused job fires no
milestone. Nothing is lost: the choice is non-empty whenever there is a job, and a late job
still runs whenever it makes no job on time late. Late admissions count a job's first start
only; `paused` counts the pauses. The baselines (FIFO queue) and the other stages keep filling.

Playback (streaming stages, `work_per_audio_second` > 0): a job's audio is produced at the
stage's step rate, `work_per_audio_second` steps per second of audio; from its first chunk on,
the client plays it in real time. Between two condition changes a job's credit moves linearly,
so checking it at every change (`_play`) finds every underrun of the fluid model. Step yielding
is not modelled (the fluid stage has no per-step batch).
"""

from __future__ import annotations

import heapq
import itertools
from collections import deque
from collections.abc import Callable

from horizonserve.runtime.batch_admission import StepTimes, Work, choose_batch
from horizonserve.runtime.downstream import (
    AdmissionQueue,
    FifoQueue,
    SlackQueue,
    Stamp,
    reported_slack,
)
from horizonserve.runtime.sim.model import DownstreamCost, Sharing
from horizonserve.runtime.sim.request import SimRequest

_EPS = 1e-7


class Job:
    __slots__ = ("clock", "done", "first", "head", "req", "stage", "started", "v0", "work")

    def __init__(
        self, req: SimRequest, stage: int, work: float, first: float | None, head: bool
    ) -> None:
        self.req = req
        self.stage = stage
        self.work = work
        self.first = first if first is not None and first < work else None
        self.head = head
        # The stage's virtual step counter when the job entered service, less the work it had
        # done before (batch choice resumes paused jobs): in service, work done = v − v0.
        self.v0 = 0.0
        self.done = 0.0  # work done when last paused (batch choice; 0 otherwise)
        self.started = False  # has been in service (late admissions count once)
        self.clock: _Playback | None = None  # set at its first chunk (streaming stages)


class _Playback:
    """Playback of one stream in the fluid model: audio = (v − v0) / steps per audio second."""

    __slots__ = ("generated", "start")

    def __init__(self, start: float) -> None:
        self.start = start  # shifted by every stall
        self.generated = 0.0


class FluidStage:
    """One downstream stage process."""

    __slots__ = (
        "_seq",
        "admit_limit",
        "awaiting",
        "batch",
        "busy_since",
        "busy_time",
        "choose",
        "cond",
        "cost",
        "heap",
        "in_service",
        "index",
        "late",
        "max_batch",
        "paused",
        "places",
        "playing",
        "queue",
        "rate",
        "rechoose_at",
        "reject_late",
        "rejected",
        "s_per_step",
        "saturated_first",
        "schedule",
        "steps_per_audio_s",
        "t_last",
        "tails",
        "times",
        "underruns",
        "v",
        "version",
    )

    def __init__(
        self,
        index: int,
        cost: DownstreamCost,
        schedule: Callable[[float, int, int], None],
        queue: AdmissionQueue | None = None,
        admit_limit: int | None = None,
        reject_late: bool = False,
        last: bool = False,
        places: bool = False,
        saturated_first: bool = False,
    ) -> None:
        self.index = index
        self.cost = cost
        self.max_batch = cost.cal.max_batch
        # Head jobs in service at most this many (real-time capacity; max_batch by default).
        self.admit_limit = (
            self.max_batch if admit_limit is None else min(admit_limit, self.max_batch)
        )
        self.schedule = schedule  # schedule(time, stage index, version)
        self.in_service = 0
        self.queue: AdmissionQueue[Job] = FifoQueue() if queue is None else queue
        self.tails: deque[Job] = deque()  # started streams' remaining work: admitted first
        self.late = 0  # head jobs admitted after they could no longer meet their deadline
        self.reject_late = reject_late  # refuse those instead (they never respond)
        self.rejected = 0
        # Place-aware admission (runtime.downstream.place_order), at the last step rate seen.
        self.places = places
        self.saturated_first = saturated_first  # report SATURATED when full with waiters
        self.s_per_step = 0.0
        self.steps_per_audio_s = cost.cal.work_per_audio_second  # 0: not a streaming stage
        self.playing: list[Job] = []  # jobs in service whose first chunk is out
        self.awaiting: list[Job] = []  # head jobs in service before their first output here
        self.underruns = 0
        self.heap: list[tuple[float, int, Job, bool]] = []  # (v target, seq, job, is_first)
        self._seq = itertools.count()
        self.v = 0.0
        self.t_last = 0.0
        self.rate = 0.0
        self.version = 0
        self.busy_time = 0.0
        self.busy_since = -1.0
        # Batch choice (module doc): only at the chain's last stage whose first output is its
        # completion, and only under downstream control (the policy handed a slack queue).
        choose = (
            last
            and isinstance(self.queue, SlackQueue)
            and cost.cal.first_output_work is None
            and self.steps_per_audio_s == 0.0
        )
        self.choose = choose
        # The step time per batch size `choose_batch` reads (set at the first choice).
        self.times: StepTimes | None = None
        # The conditions of the last choice, and when a step of its batch has passed: between
        # set changes the batch is re-chosen when either moves on (at most once a step while
        # the conditions hold, as the engine re-chooses before each step).
        self.cond: tuple[int, bool, int, Sharing] | None = None
        self.rechoose_at = 0.0
        self.batch: list[Job] = []  # batch choice: the jobs in service, in the order chosen
        self.paused = 0  # batch choice: in-service jobs left out of a choice (back in queue)

    @property
    def active(self) -> bool:
        return self.in_service > 0 or bool(self.queue) or bool(self.tails)

    @property
    def waiting(self) -> int:
        return len(self.queue) + len(self.tails)

    def advance(self, now: float) -> None:
        if self.rate:
            self.v += (now - self.t_last) * self.rate
        self.t_last = now
        if self.playing:
            self._play(now)

    def _play(self, now: float) -> None:
        """Bring every playing stream's credit up to `now`; count the underruns."""
        per_s = self.steps_per_audio_s
        v = self.v
        for job in self.playing:
            clock = job.clock
            assert clock is not None
            clock.generated = (v - job.v0) / per_s
            dry = (now - clock.start) - clock.generated
            if dry > 1e-9:
                self.underruns += 1
                clock.start += dry

    def _start(self, job: Job, now: float) -> None:
        if self.in_service == 0:
            self.busy_since = now
        self.in_service += 1
        seq = next(self._seq)
        v = self.v
        job.v0 = v
        if job.head:
            self.awaiting.append(job)
        if job.first is not None:
            heapq.heappush(self.heap, (v + job.first, seq, job, True))
        heapq.heappush(self.heap, (v + job.work, seq, job, False))

    def _fill(self, now: float) -> None:
        """Admit while a place is free: started streams first, then the policy's queue (new
        streams only up to `admit_limit`)."""
        tails = self.tails
        while tails and self.in_service < self.max_batch:
            self._start(tails.popleft(), now)
        queue = self.queue
        if self.places:
            self._fill_by_places(now)
            return
        while queue and self.in_service < self.admit_limit:
            popped = queue.pop(now)
            assert popped is not None
            self._admit(*popped, now)

    def _admit(self, job: Job, late: bool, now: float) -> None:
        """Start a job the queue handed out, or refuse it when late under `reject_late`."""
        if late and self.reject_late:
            self.rejected += 1  # refused with a reason: never answered, counted
            return
        if late:
            self.late += 1
        self._start(job, now)

    def _fill_by_places(self, now: float) -> None:
        """Admit new streams in the queue's place-aware order: the free places now, the others
        when their job completes (its remaining work at the last step rate)."""
        free = self.admit_limit - self.in_service
        if free <= 0 or not self.queue:
            return
        free_at = self._free_at(now)
        limit = None if self.reject_late else free  # refused late ones make room for more
        for job, late in self.queue.order(now, free_at, self.s_per_step, limit):
            if self.in_service >= self.admit_limit:
                return
            self.queue.take(job, late)
            self._admit(job, late, now)

    def _free_at(self, now: float) -> list[float]:
        """When each of the `admit_limit` places frees: now for a free one, a job in service's
        once its work left is done at the last step rate (`s_per_step`, refreshed here; `v`
        is up to date: caller)."""
        if self.rate:
            self.s_per_step = 1.0 / self.rate
        per, v = self.s_per_step, self.v
        busy = sorted(now + max(0.0, vt - v) * per for vt, _, _, first in self.heap if not first)
        free = max(0, self.admit_limit - self.in_service)
        return [now] * free + busy[: self.admit_limit - free]

    def _choose(
        self, now: float, sms: int, shared_busy: bool, shared_sms: int, sharing: Sharing
    ) -> bool:
        """Batch choice (module doc): `choose_batch` over the batch and the queued jobs under
        the current step times; pauses the jobs left out, starts the ones chosen and rebuilds
        the milestone heap. True when the batch changed. `v` is up to date (caller).

        Invariants: `batch` holds `in_service` jobs, all with first output = completion; the
        heap holds exactly their completions; a waiting job (queued or paused) is in the queue
        with its done work in `done`; every job is in exactly one of the two.
        """
        batch, queue = self.batch, self.queue
        if not batch and not queue:
            return False
        step = self.cost.step_s
        waiting = self._drain(now)
        times = self.times
        if times is None:  # the engine's prior: the profile's solo step of the first job
            first = (batch or [entry[0] for entry in waiting])[0]
            times = self.times = StepTimes(_stamp(first).downstream_s / first.work)
        if sms > 0:  # what the engine would measure now (a stage without SMs runs no step)
            for b in range(1, self.max_batch + 1):
                times.observe(b, step(b, sms, shared_busy, shared_sms, sharing))
        if self.reject_late:  # refuse a waiting job late even alone (the engine's rule)
            solo = times.fastest_solo()
            kept = []
            for entry in waiting:
                job = entry[0]
                if now > _stamp(job).deadline - (job.work - job.done) * solo:
                    self.rejected += 1  # refused with a reason: never answered, counted
                else:
                    kept.append(entry)
            waiting = kept
        v = self.v
        pool = batch + [job for job, _ in waiting]
        # Steps left are fractional in the fluid model (the engine's are whole steps;
        # `finish_times` is exact for fractions too).
        left = [max(j.work - (v - j.v0), 0.0) for j in batch] + [
            j.work - j.done for j, _ in waiting
        ]
        works = [Work(_stamp(j).deadline, n) for j, n in zip(pool, left, strict=True)]
        chosen = [pool[i] for i in choose_batch(works, now, times, self.max_batch)]
        picked = {id(j) for j in chosen}
        was = {id(j) for j in batch}
        changed = picked != was
        late = 0
        for job, is_late in waiting:
            if id(job) in picked:  # start (or resume) it: work done = v − v0 stays `done`
                job.v0 = v - job.done
                if not job.started:
                    job.started = True
                    late += is_late
                if job.head:
                    self.awaiting.append(job)
            else:
                queue.push(job, _stamp(job), _stamp(job).downstream_s)
        for job in batch:
            if id(job) not in picked:  # pause it: back in the queue with its done work
                job.done = v - job.v0
                if job.head:
                    self.awaiting.remove(job)
                queue.push(job, _stamp(job), _stamp(job).downstream_s)
                self.paused += 1
        self.late += late
        queue.late_popped += late
        self.cond = (sms, shared_busy, shared_sms, sharing)
        self.rechoose_at = now + times.at(max(1, len(chosen)))  # one step on: the engine's cadence
        if not changed:
            return False
        # `choose_batch` keeps a job whenever one is given: the batch empties only when there
        # was none and every waiting job was refused (then nothing changed above).
        if not batch and self.busy_since < 0:
            self.busy_since = now
        self.batch = chosen
        self.in_service = len(chosen)
        seq = self._seq
        self.heap = [(j.v0 + j.work, next(seq), j, False) for j in chosen]
        heapq.heapify(self.heap)
        return True

    def _drain(self, now: float) -> list[tuple[Job, bool]]:
        """Every queued job with whether the queue finds it late now, in admission order; the
        queue is left empty (its late count untouched: the caller counts admissions)."""
        queue = self.queue
        late_popped = queue.late_popped
        out = []
        while (got := queue.pop(now)) is not None:
            out.append(got)
        queue.late_popped = late_popped
        return out

    def min_slack(self, now: float) -> float | None:
        """The smallest slack ratio among this stage's requests whose first output is pending:
        the queue's next admission and the head jobs in service (r̂ = the stamp's estimate
        scaled by the share of first-output work left). While every place is taken under
        `saturated_first`: `SATURATED` while an on-time request waits (`reported_slack`)."""
        best = queued = self.queue.peek_slack(now)
        if self.awaiting:
            self.advance(now)
            v = self.v
            for job in self.awaiting:
                first = job.first if job.first is not None else job.work
                left = first - (v - job.v0)
                stamp = job.req.stamp
                assert stamp is not None
                u = stamp.slack_ratio(now, stamp.downstream_s * max(left, 0.0) / first)
                if best is None or u < best:
                    best = u
        full = self.in_service >= self.admit_limit
        return reported_slack(best, full, queued, self.saturated_first)

    def submit(self, job: Job, now: float) -> None:
        """A job arrives; the caller re-rates the stage afterwards (`rerate`)."""
        self.advance(now)
        if not job.head:
            self.tails.append(job)
        else:
            req = job.req
            stamp = req.stamp
            assert stamp is not None
            self.queue.push(job, stamp, stamp.downstream_s, job.work)
        if not self.choose:  # batch choice: the caller's `rerate` chooses
            self._fill(now)

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

        `force`: reschedule even at an unchanged rate (the set of milestones changed). Under
        batch choice the batch is chosen first (`_choose`), under these conditions.
        """
        self.advance(now)
        if self.choose:
            due = force or now >= self.rechoose_at
            if (due or (sms, shared_busy, shared_sms, sharing) != self.cond) and self._choose(
                now, sms, shared_busy, shared_sms, sharing
            ):
                force = True  # the batch changed: its milestones are new
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
            if job.head and (is_first or job.first is None):
                self.awaiting.remove(job)
            if is_first:
                if self.steps_per_audio_s > 0.0:
                    job.clock = _Playback(now)  # the first chunk's audio is credit
                    self.playing.append(job)
            else:
                self.in_service -= 1
                if job.clock is not None:
                    self.playing.remove(job)
                if self.choose:
                    self.batch.remove(job)
        if not self.choose:  # batch choice: the caller's `rerate` chooses
            self._fill(now)
        if self.in_service == 0 and self.busy_since >= 0:
            self.busy_time += now - self.busy_since
            self.busy_since = -1.0
        return due

    def finish(self, now: float) -> None:
        """Close the busy-time accounting at the end of a run."""
        if self.busy_since >= 0:
            self.busy_time += now - self.busy_since
            self.busy_since = now


def _stamp(job: Job) -> Stamp:
    stamp = job.req.stamp
    assert stamp is not None  # stamped at the hand-off, before any downstream stage
    return stamp
