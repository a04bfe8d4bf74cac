"""Stage supervision: find a dead or hung stage, fail its requests, restart it after a backoff.

On with `PipelineOptions.supervise` (`horizonserve serve`): a thread checks every stage each
`SUPERVISE_TICK_S` -- process exited, or its heartbeat in the control record older than
`hang_timeout_s` (hung or stopped), in the future, or written by another process
(`supervisor.stage_fault`; a fault counts once `FaultConfirmation` confirms it). A failed
stage is killed and started again after a doubling backoff (`RestartBackoff`); meanwhile the
classes that need it are unavailable (`StageUnavailableError` with Retry-After) and the other
classes keep serving.

Invariants:
- Only the supervisor thread changes a slot's state to DOWN and respawns it; it does so under
  the pipeline's `_lock`, together with dropping the stage from `stage_info`.
- A failed stage's in-flight requests finish with UNAVAILABLE before it restarts, and the
  other stages on their path get a Cancel for them, so no stage keeps work of a request the
  front has already answered.
- A successor process is judged on its own heartbeats: the dead one's record slot is cleared
  once it is gone.
"""

from __future__ import annotations

import logging
import time

from horizonserve.runtime.engine.reference.protocol import Cancel
from horizonserve.runtime.engine.reference.request_records import UNAVAILABLE
from horizonserve.runtime.engine.reference.stage_graph import CHAINS, DOWNSTREAM_STAGES, stages_of
from horizonserve.runtime.engine.reference.stage_processes import (
    DOWN,
    RUNNING,
    STARTING,
    StageSlot,
    close_queues,
)
from horizonserve.runtime.engine.reference.supervisor import stage_fault

log = logging.getLogger(__name__.rpartition(".")[0] + ".pipeline")  # the pipeline's logger

SUPERVISE_TICK_S = 0.1


class StageSupervision:
    """The supervisor thread's work: a part of `Pipeline`, whose `__init__` sets up the
    state. Owns `supervisor_tick_t` and `record_repairs`; fails stages in `_slots`."""

    def _supervise(self) -> None:
        while self._running and not self._stopping:
            try:
                self._supervise_once(time.monotonic())
            except Exception:  # the supervisor must outlive any surprise
                log.exception("supervisor tick failed")
            self.supervisor_tick_t = time.monotonic()
            time.sleep(SUPERVISE_TICK_S)

    def _supervise_once(self, now: float) -> None:
        record = self._record
        if record is None:
            return
        problem = record.header_problem()
        if problem is not None:
            log.error("control record %s: %s; rewriting it", record.path, problem)
            record.repair_header()
            self.record_repairs += 1
        hang_ns = int(self.options.hang_timeout_s * 1e9)
        for name, slot in self._slots.items():
            if self._stopping:
                return
            if slot.state == RUNNING:
                fault = self._fault(slot, hang_ns)
                if slot.confirm.confirmed(fault, slot.proc.exitcode is not None, now):
                    self._stage_failed(slot, fault or "failed", now)
            elif slot.state == STARTING:
                if slot.proc.exitcode is not None:
                    self._stage_failed(slot, "exited during start-up", now)
                elif now - slot.started > self.options.startup_timeout_s:
                    self._stage_failed(slot, "not ready in time", now)
            elif now >= slot.restart_at:
                slot.restarts += 1
                log.warning("restarting the %s stage (restart %d)", name, slot.restarts)
                self._spawn(name)

    def _fault(self, slot: StageSlot, hang_ns: int) -> str | None:
        """Why a ready stage counts as failed now (supervisor.stage_fault), or None."""
        beat, writer = self._beat(slot.name)
        return stage_fault(
            exitcode=slot.proc.exitcode,
            pid=slot.proc.pid,
            beat_ns=beat,
            writer_pid=writer,
            ready_ns=slot.ready_ns,
            now_ns=time.monotonic_ns(),  # after the read: a stuck group's read takes time
            hang_ns=hang_ns,
        )

    def _beat(self, name: str) -> tuple[int, int]:
        """(heartbeat ns, writer pid or 0) of a stage from the control record."""
        assert self._record is not None
        if name == "shared":
            return self._record.read_alive_ns(), 0
        activity = self._record.read_downstream(DOWNSTREAM_STAGES.index(name))
        return activity.heartbeat_ns, activity.writer_pid

    def _stage_failed(self, slot: StageSlot, reason: str, now: float) -> None:
        name = slot.name
        log.error("%s stage failed: %s", name, reason)
        with self._lock:
            slot.state, slot.reason = DOWN, reason
            slot.restart_at = slot.backoff.failed(now)
            self.stage_info.pop(name, None)
        slot.faults.append({"t": now, "reason": reason, "restart_at": slot.restart_at})
        self.metrics.stage_restarted(name)
        proc = slot.proc
        if proc.is_alive():
            proc.kill()  # also ends a stopped (SIGSTOP) process
        proc.join(2.0)
        if self._record is not None and not proc.is_alive():
            # The successor is judged on its own beats, not on what the dead one left.
            if name == "shared":
                self._record.clear_alive()
            else:
                self._record.reset_slot(DOWNSTREAM_STAGES.index(name))
        close_queues(slot.in_q)
        retry = self._retry_after(slot, now)
        message = f"{name} stage failed ({reason}); restarting"
        if name == "shared":
            self._fail_where(lambda r: r.stage == "shared", message, UNAVAILABLE, retry)
            return
        path = next(p for p, chain in CHAINS.items() if name in chain)
        hit = self._fail_where(lambda r: r.downstream == path, message, UNAVAILABLE, retry)
        for other in stages_of(path):  # the stages before and after it drop them too
            peer = self._slots.get(other)
            if hit and peer is not None and peer is not slot and peer.state == RUNNING:
                peer.in_q.put(Cancel(tuple(hit)))

    def _retry_after(self, slot: StageSlot, now: float) -> float:
        return max(1.0, slot.restart_at - now + slot.startup_s)
