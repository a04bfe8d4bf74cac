"""What the pipeline reports about itself: health, liveness, readiness, degraded classes, the
scrape-time metrics gauges and the step trace.

Read-only views of the state the other parts keep (no thread of their own): slot states
are read without the lock (each a single attribute read), the in-flight requests under the
pipeline's `_lock`. `refresh_metrics` is the one writer here, and it writes only the
metrics recorder's gauges.
"""

from __future__ import annotations

import time
from typing import Any

from horizonserve.runtime.engine.reference.protocol import TRACE_COLUMNS
from horizonserve.runtime.engine.reference.stage_graph import downstream_of, stages_of
from horizonserve.runtime.engine.reference.stage_processes import RUNNING
from horizonserve.runtime.engine.reference.stage_supervision import SUPERVISE_TICK_S


class PipelineStatus:
    """Health and metrics views: a part of `Pipeline`, whose `__init__` sets up the state.
    Owns no state of its own."""

    def health(self) -> dict[str, Any]:
        """Stages, degraded classes, liveness and readiness (see `live` / `ready`)."""
        stages: dict[str, Any] = {}
        for name, slot in self._slots.items():
            p = slot.proc
            info: dict[str, Any] = {
                "alive": p.is_alive() if p is not None else False,
                "pid": p.pid if p is not None else None,
                "ready": name in self.stage_info,
                "state": slot.state,
                "restarts": slot.restarts,
            }
            if self._record is not None and slot.state == RUNNING:
                beat = self._beat(name)[0]
                now_ns = time.monotonic_ns()
                info["heartbeat_age_s"] = round((now_ns - max(beat, slot.ready_ns)) / 1e9, 3)
            if slot.reason and slot.state != RUNNING:
                info["reason"] = slot.reason
            if slot.faults:
                info["last_fault"] = slot.faults[-1]["reason"]
            stages[name] = info
        ok = bool(stages) and all(s["alive"] and s["ready"] for s in stages.values())
        ok = ok and self._running and not self._stopping
        if not self.options.supervise:
            ok = ok and not self.errors
        return {
            "ok": ok,
            "live": self.live(),
            "ready": self.ready(),
            "degraded": self.degraded(),
            "stages": stages,
            "errors": self.errors[-5:],
            "record_repairs": self.record_repairs,
        }

    def live(self) -> bool:
        """Liveness: False only when this process cannot recover by itself (restart the pod).

        Supervised: the supervisor ticks and no stage exhausted its restart budget.
        Unsupervised: every stage process runs and beats in the control record.
        """
        if not self._running or self._stopping:
            return False
        now = time.monotonic()
        if self.options.supervise:
            if now - self.supervisor_tick_t > max(2.0, 20 * SUPERVISE_TICK_S):
                return False
            return not any(s.backoff.exhausted(now) for s in self._slots.values())
        hang_ns = int(self.options.hang_timeout_s * 1e9)
        return all(s.ready_ns and self._fault(s, hang_ns) is None for s in self._slots.values())

    def ready(self) -> bool:
        """Readiness: at least one class can be served now (the others: `degraded()`)."""
        if not self._running or self._stopping or self.config is None:
            return False
        return len(self.degraded()) < len(self.config.slo.classes)

    def stage_depths(self) -> dict[str, int]:
        """Requests held by each stage now (front-side accounting)."""
        depth = dict.fromkeys(self._slots, 0)
        with self._lock:
            for handle in self._handles.values():
                stage = handle.record.stage
                depth[stage] = depth.get(stage, 0) + 1
        return depth

    def refresh_metrics(self, now: float | None = None) -> None:
        """Bring the scrape-time gauges up to date (attainment window, depths, in flight)."""
        now = time.monotonic() if now is None else now
        self.metrics.refresh_attainment(now)
        self.metrics.set_stage_depths(self.stage_depths())
        self.metrics.set_stage_up({n: s.state == RUNNING for n, s in self._slots.items()})

    def wait_trace(self, until: float, timeout: float = 2.0) -> bool:
        """Wait until the shared stage sent trace rows at or after `until` (monotonic)."""
        deadline = time.monotonic() + timeout
        while self.trace_received_t < until:
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.01)
        return True

    def trace_dicts(self) -> list[dict[str, Any]]:
        return [dict(zip(TRACE_COLUMNS, row, strict=True)) for row in list(self.trace)]

    def degraded(self) -> dict[str, str]:
        """Classes that cannot be served now, with the reason."""
        if self.config is None:
            return {}
        out: dict[str, str] = {}
        for cls in self.config.slo.classes:
            for stage in stages_of(downstream_of(cls)):
                slot = self._slots.get(stage)
                if slot is None:
                    out[cls.name] = f"the {stage} stage is not run by this server"
                elif slot.state != RUNNING:
                    out[cls.name] = f"the {stage} stage is {slot.state} ({slot.reason})"
                    break
        return out
