"""Requests in and results out: admission at the front gate, cancel, relayed hand-offs, and
the request events that fill a request's record and wake its handle.

Invariants:
- `_handles` (request id -> handle of a request in flight) is guarded by the pipeline's
  `_lock`; so is the front gate's admission together with the entry (`_gate.admit` and the
  insert happen under one hold). The gate's other updates (`prefilled`, `finished`) come
  from the dispatcher thread or from retiring, outside the lock.
- A request retires once (`_retire` returns True the first time): it leaves `_handles` under
  the lock, then its record goes to `finished` and the metrics, then its handle's events are
  set and its listener told -- in that order, so a waiter sees a finished record.
- Cancel reaches the stages before the handle retires, so a request reusing the id later is
  queued behind the Cancel on the shared stage's queue.
- Only the dispatcher thread writes a record's times and stage results; an error ending
  (`error`, `failure`, `retry_after_s`) is written just before its retire.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable

from horizonserve.runtime.downstream import PlaybackClock
from horizonserve.runtime.engine.reference.errors import (
    PipelineError,
    QueueFullError,
    StageUnavailableError,
)
from horizonserve.runtime.engine.reference.protocol import (
    CHUNK,
    DONE,
    ERROR,
    FIRST,
    HANDOFF,
    Admit,
    Cancel,
    CodeChunk,
    Event,
    Handoff,
    RequestSpec,
)
from horizonserve.runtime.engine.reference.request_records import (
    CANCELLED,
    MAX_RID_CHARS,
    REJECTED,
    UNAVAILABLE,
    Listener,
    RequestHandle,
    RequestRecord,
)
from horizonserve.runtime.engine.reference.stage_graph import downstream_of, stages_of
from horizonserve.runtime.engine.reference.stage_processes import RUNNING


class RequestRouting:
    """Requests and their results: a part of `Pipeline`, whose `__init__` sets up the
    state. Owns `_handles` and `finished`; admits through `_gate`."""

    def submit(
        self,
        spec: RequestSpec,
        arrival: float | None = None,
        listener: Listener | None = None,
    ) -> RequestHandle:
        """Send a request to the shared stage; raises ValueError for an unservable request,
        StageUnavailableError while a stage it needs is down, PipelineError when stopped."""
        if not self._running or self._stopping or self._profiler is None:
            raise PipelineError("pipeline is not running")
        if not spec.rid or len(spec.rid) > MAX_RID_CHARS:
            raise ValueError(f"id: 1 to {MAX_RID_CHARS} characters")
        costs = self._profiler.costs(priority=spec.priority, class_name=spec.class_name)
        cls = costs.cls
        downstream = downstream_of(cls)
        if downstream is not None and downstream not in self._procs:
            raise ValueError(f"class {cls.name!r} needs the {downstream} stage, not running")
        now = time.monotonic()
        for stage in stages_of(downstream):
            slot = self._slots.get(stage)
            if slot is not None and slot.state != RUNNING:
                reason = f"is {slot.state}" + (f" ({slot.reason})" if slot.reason else "")
                self.metrics.rejected(cls.name, "unavailable")
                raise StageUnavailableError(stage, cls.name, self._retry_after(slot, now), reason)
        arrival = now if arrival is None else arrival
        record = RequestRecord(
            spec.rid,
            cls.name,
            int(cls.priority),
            cls.path.value,
            cls.metric.value,
            costs.target_s,
            arrival,
            downstream=downstream,
        )
        handle = RequestHandle(record, listener)
        shed = None
        with self._lock:
            if spec.rid in self._handles:
                raise ValueError(f"request id {spec.rid!r} is already in flight")
            if self._gate is not None:
                shed = self._gate.admit(spec.rid, spec.input_tokens)
            if shed is None:
                self._handles[spec.rid] = handle
        if shed is not None:  # never served: a miss, judged at its deadline like every request
            self.metrics.rejected(cls.name, shed)
            self.metrics.expect((spec.rid, arrival), cls.name, arrival, costs.target_s)
            raise QueueFullError(cls.name, shed)
        self.metrics.admitted(
            cls.name,
            key=(spec.rid, arrival),  # judged at its deadline if no first response by then
            arrival=arrival,
            slo_s=costs.target_s,
            prompt_tokens=spec.input_tokens,
        )
        self._queues["shared"].put(Admit(spec, arrival, downstream))
        return handle

    def cancel(self, rid: str, reason: str = "cancelled", failure: str = CANCELLED) -> bool:
        """Drop request `rid` in every stage (its handle finishes with `reason`); False when
        it is not in flight (finished already)."""
        with self._lock:
            handle = self._handles.get(rid)
        if handle is None:
            return False
        rec = handle.record
        # Cancel goes out before the handle retires: a request reusing the id afterwards is
        # admitted behind it on the shared queue (and matches no (id, arrival) anyway).
        for stage in stages_of(rec.downstream):
            slot = self._slots.get(stage)
            if slot is not None and slot.state == RUNNING:
                slot.in_q.put(Cancel(((rid, rec.arrival),)))
        rec.error, rec.failure = reason, failure
        return self._retire(handle)

    def _forward(self, target: str, msg: Handoff | CodeChunk) -> None:
        """Relay a hand-off or code chunk to the current `target` stage (supervised)."""
        with self._lock:
            handle = self._handles.get(msg.rid)
        if handle is None or handle.record.arrival != msg.arrival:
            return  # cancelled or failed meanwhile: no downstream work for it
        slot = self._slots[target]
        if slot.state != RUNNING:
            rec = handle.record
            rec.error, rec.failure = f"{target} stage is {slot.state}", UNAVAILABLE
            rec.retry_after_s = self._retry_after(slot, time.monotonic())
            self._retire(handle)
            return
        slot.in_q.put(msg)

    def _fail_where(
        self,
        hit: Callable[[RequestRecord], bool],
        message: str,
        failure: str,
        retry_after_s: float | None,
    ) -> list[tuple[str, float]]:
        """Finish every in-flight request `hit` selects with an error; returns their
        (id, arrival)."""
        with self._lock:
            handles = [h for h in self._handles.values() if hit(h.record)]
        failed = []
        for handle in handles:
            rec = handle.record
            rec.error, rec.failure, rec.retry_after_s = message, failure, retry_after_s
            if self._retire(handle):
                failed.append((rec.rid, rec.arrival))
        return failed

    def in_flight(self) -> int:
        with self._lock:
            return len(self._handles)

    def _on_request_event(self, ev: Event) -> None:
        """A request's progress or result from a stage (dispatcher thread)."""
        kind = ev.kind
        with self._lock:
            handle = self._handles.get(ev.rid or "")
        if handle is None:
            return
        rec = handle.record
        data = ev.data
        if "scheduled" in data and not math.isnan(data["scheduled"]):
            rec.scheduled = data["scheduled"]
        gate = self._gate
        if kind == FIRST:
            if gate is not None:
                gate.prefilled(rec.rid)  # a short-path first token (or a long path's output)
            if rec.first is None:
                rec.first = ev.t
                rec.info.update({k: v for k, v in data.items() if k != "scheduled"})
                if "samples" in data:
                    self._playback(rec, ev.t, data["samples"])
                self.metrics.first_response_at(
                    ev.t, rec.class_name, ev.t - rec.arrival, rec.slo_s, key=(rec.rid, rec.arrival)
                )
            handle.first.set()
        elif kind == CHUNK:
            self._playback(rec, ev.t, data["samples"])
        elif kind == HANDOFF:
            if gate is not None:
                gate.finished(rec.rid)  # it left the shared stage
            rec.handoff = ev.t
            rec.shared_tpot_s = data.get("tpot")
            rec.shared_tokens = data.get("tokens")
            if data.get("preempted"):
                rec.info["preempted"] = data["preempted"]
        elif kind == DONE:
            rec.done = ev.t
            if ev.stage == "shared":
                rec.shared_tpot_s = data.get("tpot")
                rec.shared_tokens = data.get("tokens")
                if data.get("preempted"):
                    rec.info["preempted"] = data["preempted"]
            self._retire(handle)
            return
        elif kind == ERROR:
            rec.error, rec.failure = str(data.get("message")), REJECTED
            self._retire(handle)
            return
        handle.notify(kind, data)

    def _playback(self, rec: RequestRecord, t: float, samples: int) -> None:
        """The listener's playback of a speech answer (the control core's PlaybackClock):
        audio plays from the first chunk on; a chunk arriving after the audio before it ran
        out is an underrun. `samples` is the total delivered so far."""
        clock = rec.playback
        if clock is None:
            clock = rec.playback = PlaybackClock()
        if clock.on_chunk(t, samples / self._samples_per_second - clock.generated_s):
            self.metrics.underrun(rec.class_name)
            rec.info["underruns"] = clock.underruns

    def _retire(self, handle: RequestHandle) -> bool:
        """Finish a request once (True the first time): history, metrics, waiters."""
        rec = handle.record
        with self._lock:
            if self._handles.get(rec.rid) is not handle:
                return False
            del self._handles[rec.rid]
        if self._gate is not None:
            self._gate.finished(rec.rid)
        self.finished.append(rec)
        self.metrics.finished(
            rec.class_name,
            rec.failure,
            rec.done,
            rec.arrival,
            key=(rec.rid, rec.arrival),
            now=time.monotonic(),
            record=rec,
        )
        handle.first.set()
        handle.done.set()
        handle.notify(DONE if rec.failure is None else ERROR, {})
        return True
