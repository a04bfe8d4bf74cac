"""The dispatcher thread: every stage event, in the order the stages sent them, one at a time.

One pump thread per stage event queue feeds `_inbox` with (stage, generation, event); the
single dispatcher thread (`_collect`) turns them into the shared stage's step trace and
metrics, streamed tokens, stage state (READY, STOPPED, ERROR and the acknowledgements of
commands) and request results (`RequestRouting._on_request_event`).

Invariants:
- Only this thread writes `trace`, `trace_received_t`, `stage_info` on READY/STOPPED,
  `errors`, and the command acknowledgements (`_aborts`, `_probes`, `_policy_ack`); stage
  state is written under the `_ready` condition, whose waiters it wakes.
- Stage-state events of a replaced process (an older generation) are ignored.
- A bad event is logged and skipped; the thread ends only at the `None` that `stop` queues.
"""

from __future__ import annotations

import logging
import time

from horizonserve.runtime.engine.reference.protocol import (
    ABORTED,
    ERROR,
    POLICY,
    PROBE,
    READY,
    STOPPED,
    TOKENS,
    TRACE,
    Event,
)
from horizonserve.runtime.engine.reference.stage_processes import RUNNING

log = logging.getLogger(__name__.rpartition(".")[0] + ".pipeline")  # the pipeline's logger


class StageEvents:
    """The dispatcher thread's work: a part of `Pipeline`, whose `__init__` sets up the
    state. Owns `trace`, `trace_received_t`, `errors`, `_error_count` and `_stopped`."""

    def _collect(self) -> None:
        while True:
            item = self._inbox.get()
            if item is None:
                return
            name, gen, event = item
            slot = self._slots.get(name)
            try:
                self._on_event(event, slot is not None and slot.gen == gen)
            except Exception:
                log.exception("bad event %r", event)

    def _on_event(self, ev: Event, current: bool = True) -> None:
        if self.on_event is not None:
            self.on_event(ev)
        kind = ev.kind
        if kind == TRACE:
            rows = ev.data["rows"]
            self.trace.extend(rows)
            self.trace_received_t = ev.t
            last = rows[-1]
            pressure = last[4]
            kv = last[5] / self._kv_slots if self._kv_slots else None  # decode batch / slots
            self.metrics.step(last[1], last[2], pressure, last[10], kv)
            return
        if kind == TOKENS:
            with self._lock:
                targets = [(self._handles.get(rid), tok) for rid, tok in ev.data["tokens"]]
            for handle, tok in targets:
                if handle is not None:
                    handle.notify(TOKENS, {"token": tok})
            return
        if kind in (READY, STOPPED, ERROR, POLICY, PROBE, ABORTED) and ev.rid is None:
            if current:  # else from a stage process that was replaced
                self._on_stage_event(ev)
            return
        self._on_request_event(ev)

    def _on_stage_event(self, ev: Event) -> None:
        """A stage's own state or a command's acknowledgement; wakes the `_ready` waiters."""
        kind = ev.kind
        with self._ready:
            if kind == ABORTED:
                self._aborts[ev.stage] = ev.data["dropped"]
            elif kind == PROBE:
                self._probes[ev.stage] = ev.data
            elif kind == POLICY:
                self._policy_ack = ev.data["policy"]
            elif kind == READY:
                self.stage_info[ev.stage] = ev.data
                slot = self._slots.get(ev.stage)
                if slot is not None:
                    slot.state, slot.reason = RUNNING, None
                    slot.ready_ns = time.monotonic_ns()
                    slot.startup_s = time.monotonic() - slot.started
                    if slot.restarts:
                        log.warning("%s stage ready again after restart", ev.stage)
            elif kind == STOPPED:
                self._stopped.add(ev.stage)
                self.stage_info.setdefault(ev.stage, {})["stopped"] = ev.data
            else:
                self._error_count += 1
                self.errors.append(f"{ev.stage}: {ev.data.get('message')}")
                del self.errors[:-100]
                log.error("stage %s failed: %s", ev.stage, ev.data.get("message"))
            self._ready.notify_all()
