"""Prometheus metrics of one serving process and the rolling per-class attainment window.

Engines call the recorder on every admission, first response, end and scheduling step; the
serving process exposes the registry on its `/metrics` (vLLM's own `/metrics` for the
vLLM-Omni engine, whose default registry this shares), and the node sidecar turns
`AttainmentWindow.snapshot()` (through the stats file) into the node summary.

Names sit beside vLLM's `vllm:` metrics: prefix `horizonserve:`, every family labelled with
`model_name` like vLLM's, per-class families with `request_class`. The mapping to the vLLM
metric a reader would compare with is `VLLM_EQUIVALENT` (documented in
runtime/engine/reference/README.md). Gauges of a class whose window emptied are removed, not
left at their last value.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

PREFIX = "horizonserve:"
# First-response latency buckets (seconds): text TTFT is tens of ms, images take seconds.
LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 25.0, 60.0)
WINDOW_MAX_EVENTS = 200_000  # the attainment window's memory bound (oldest dropped first)

#: HorizonServe family -> the vLLM family it is closest to (None: no vLLM counterpart).
VLLM_EQUIVALENT: dict[str, str | None] = {
    "horizonserve:first_response_seconds": "vllm:time_to_first_token_seconds",
    "horizonserve:e2e_request_latency_seconds": "vllm:e2e_request_latency_seconds",
    "horizonserve:requests_total": "vllm:request_success_total (admitted, not finished)",
    "horizonserve:first_responses_total": None,
    "horizonserve:late_first_responses_total": None,
    "horizonserve:request_errors_total": None,
    "horizonserve:request_timeouts_total": None,
    "horizonserve:requests_cancelled_total": None,
    "horizonserve:request_rejections_total": None,
    "horizonserve:slo_attainment_ratio": None,
    "horizonserve:num_requests_running": "vllm:num_requests_running (per class, all stages)",
    "horizonserve:stage_requests": "vllm:num_requests_running + waiting (per stage)",
    "horizonserve:num_requests_waiting": "vllm:num_requests_waiting (shared stage)",
    "horizonserve:stage_up": None,
    "horizonserve:stage_restarts_total": None,
    "horizonserve:shared_stage_sms": None,
    "horizonserve:downstream_sms": None,
    "horizonserve:memory_pressure_ratio": None,
    "horizonserve:speech_underruns_total": None,
}


@dataclass(slots=True, frozen=True)
class ClassAttainment:
    requests: int
    met: int
    p95_s: float

    @property
    def attainment(self) -> float | None:
        return self.met / self.requests if self.requests else None


def p95(values: list[float]) -> float:
    """Nearest-rank 95th percentile of a non-empty list."""
    ordered = sorted(values)
    return ordered[max(0, math.ceil(0.95 * len(ordered)) - 1)]


class AttainmentWindow:
    """SLO attainment per class over the last `window_s` seconds of first responses (and at
    most `max_events` of them)."""

    __slots__ = ("_events", "window_s")

    def __init__(self, window_s: float = 300.0, max_events: int = WINDOW_MAX_EVENTS) -> None:
        self.window_s = window_s
        self._events: deque[tuple[float, str, bool, float]] = deque(maxlen=max_events)

    def record(self, now: float, class_name: str, met: bool, latency_s: float) -> None:
        self._events.append((now, class_name, met, latency_s))

    def snapshot(self, now: float) -> dict[str, ClassAttainment]:
        events = self._events
        horizon = now - self.window_s
        while events and events[0][0] < horizon:
            events.popleft()
        latencies: dict[str, list[float]] = {}
        met: dict[str, int] = {}
        for _, name, ok, latency in list(events):
            latencies.setdefault(name, []).append(latency)
            met[name] = met.get(name, 0) + ok
        return {
            name: ClassAttainment(len(lat), met[name], p95(lat)) for name, lat in latencies.items()
        }


class MetricsRecorder:
    """All HorizonServe metrics of one serving process, in their own registry (or the one
    given, e.g. vLLM's default registry)."""

    def __init__(
        self,
        registry: CollectorRegistry | None = None,
        window_s: float = 300.0,
        model_name: str = "horizonserve",
    ) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        self.model_name = model_name
        cls = ("model_name", "request_class")
        model = ("model_name",)
        stage = ("model_name", "stage")
        self.first_response = self._family(
            Histogram,
            "first_response_seconds",
            "First-response latency including queueing (TTFT text, TTFO speech, E2E image).",
            cls,
            buckets=LATENCY_BUCKETS,
        )
        self.latency = self._family(
            Histogram,
            "e2e_request_latency_seconds",
            "Arrival to the last output of requests that finished without error.",
            cls,
            buckets=LATENCY_BUCKETS,
        )
        self.requests = self._family(Counter, "requests", "Requests admitted to the pipeline.", cls)
        self.first_responses = self._family(
            Counter, "first_responses", "Requests that produced a first response.", cls
        )
        self.late = self._family(
            Counter, "late_first_responses", "First responses after the class's SLO target.", cls
        )
        self.errors = self._family(
            Counter,
            "request_errors",
            "Admitted requests that ended with an error (reason: rejected by a stage, "
            "unavailable = a stage they needed failed or the server stopped).",
            (*cls, "reason"),
        )
        self.timeouts = self._family(
            Counter,
            "request_timeouts",
            "Requests without a first response within the client's timeout (cancelled).",
            cls,
        )
        self.cancelled = self._family(
            Counter,
            "requests_cancelled",
            "Requests whose client went away before the answer (cancelled in every stage).",
            cls,
        )
        self.rejections = self._family(
            Counter,
            "request_rejections",
            "Requests refused before admission (reason: invalid, unauthorized, forbidden, "
            "too_large, unavailable, stopping); request_class empty when unknown.",
            (*cls, "reason"),
        )
        self.attainment = self._family(
            Gauge,
            "slo_attainment_ratio",
            "Rolling SLO attainment per class (absent while the class's window is empty).",
            cls,
        )
        self.running = self._family(
            Gauge,
            "num_requests_running",
            "Requests in flight (admitted, not finished) per class.",
            cls,
        )
        self.stage_requests = self._family(
            Gauge,
            "stage_requests",
            "Requests each stage holds now, waiting or running (queue depth per stage).",
            stage,
        )
        self.waiting = self._family(
            Gauge,
            "num_requests_waiting",
            "Prompts waiting for a shared-stage batch at the last step.",
            stage,
        )
        self.stage_up = self._family(
            Gauge, "stage_up", "1 while a stage runs, 0 while it restarts.", stage
        )
        self.restarts = self._family(
            Counter, "stage_restarts", "Stage processes the supervisor restarted.", stage
        )
        self.sm_shared = self._family(
            Gauge, "shared_stage_sms", "SMs the shared stage may use.", model
        )
        self.sm_downstream = self._family(
            Gauge, "downstream_sms", "SM headroom given to downstream stages.", model
        )
        self.pressure = self._family(
            Gauge,
            "memory_pressure_ratio",
            "Smoothed memory-activity signal (NaN while unknown).",
            model,
        )
        self.underruns = self._family(
            Counter,
            "speech_underruns",
            "Speech chunks that arrived after the audio before them had finished playing.",
            cls,
        )
        self.window = AttainmentWindow(window_s)
        self._attained: set[str] = set()  # classes with an attainment sample exported

    # -- requests ---------------------------------------------------------------------------
    def _family(self, kind: type, short: str, doc: str, labels: tuple[str, ...], **kw: Any) -> Any:
        """A metric family `horizonserve:<short>` in this recorder's registry."""
        return kind(PREFIX + short, doc, list(labels), registry=self.registry, **kw)

    def admitted(self, class_name: str) -> None:
        self.requests.labels(self.model_name, class_name).inc()
        self.running.labels(self.model_name, class_name).inc()

    def finished(
        self, class_name: str, failure: str | None, done: float | None, arrival: float
    ) -> None:
        """An admitted request left (`failure`: None, or the pipeline's failure kind)."""
        m = self.model_name
        self.running.labels(m, class_name).dec()
        if failure is None:
            if done is not None:
                self.latency.labels(m, class_name).observe(max(0.0, done - arrival))
        elif failure == "timeout":
            self.timeouts.labels(m, class_name).inc()
        elif failure == "cancelled":
            self.cancelled.labels(m, class_name).inc()
        else:
            self.errors.labels(m, class_name, failure).inc()

    def rejected(self, class_name: str | None, reason: str) -> None:
        self.rejections.labels(self.model_name, class_name or "", reason).inc()

    def first_response_at(
        self, now: float, class_name: str, latency_s: float, slo_s: float
    ) -> None:
        met = latency_s <= slo_s
        m = self.model_name
        self.first_response.labels(m, class_name).observe(latency_s)
        self.first_responses.labels(m, class_name).inc()
        if not met:
            self.late.labels(m, class_name).inc()
        self.window.record(now, class_name, met, latency_s)

    def underrun(self, class_name: str) -> None:
        self.underruns.labels(self.model_name, class_name).inc()

    # -- stages -----------------------------------------------------------------------------
    def step(
        self, shared_sms: int, downstream_sms: int, pressure: float | None, waiting: int
    ) -> None:
        m = self.model_name
        self.sm_shared.labels(m).set(shared_sms)
        self.sm_downstream.labels(m).set(downstream_sms)
        self.pressure.labels(m).set(float("nan") if pressure is None else pressure)
        self.waiting.labels(m, "shared").set(waiting)

    def set_stage_depths(self, depths: dict[str, int]) -> None:
        for stage, n in depths.items():
            self.stage_requests.labels(self.model_name, stage).set(n)

    def set_stage_up(self, up: dict[str, bool]) -> None:
        for stage, ok in up.items():
            self.stage_up.labels(self.model_name, stage).set(1 if ok else 0)

    def stage_restarted(self, stage: str) -> None:
        self.restarts.labels(self.model_name, stage).inc()

    def refresh_attainment(self, now: float) -> dict[str, ClassAttainment]:
        """Attainment gauges from the window; a class whose window emptied loses its gauge."""
        snap = self.window.snapshot(now)
        for name, ca in snap.items():
            if ca.attainment is not None:
                self.attainment.labels(self.model_name, name).set(ca.attainment)
        for gone in self._attained - snap.keys():
            self.attainment.remove(self.model_name, gone)
        self._attained = set(snap)
        return snap
