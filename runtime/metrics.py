"""Prometheus metrics and the rolling per-class attainment the node summary reports.

Engines call the recorder on every first response and every scheduling step; the sidecar
serves the registry on /metrics and turns `AttainmentWindow.snapshot()` into the node summary.
Metric names are prefixed `horizonserve_`.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

# First-response latency buckets (seconds): text TTFT is tens of ms, images take seconds.
LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 25.0, 60.0)


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
    """SLO attainment per class over the last `window_s` seconds of first responses."""

    __slots__ = ("_events", "window_s")

    def __init__(self, window_s: float = 300.0) -> None:
        self.window_s = window_s
        self._events: deque[tuple[float, str, bool, float]] = deque()

    def record(self, now: float, class_name: str, met: bool, latency_s: float) -> None:
        self._events.append((now, class_name, met, latency_s))

    def snapshot(self, now: float) -> dict[str, ClassAttainment]:
        events = self._events
        horizon = now - self.window_s
        while events and events[0][0] < horizon:
            events.popleft()
        latencies: dict[str, list[float]] = {}
        met: dict[str, int] = {}
        for _, name, ok, latency in events:
            latencies.setdefault(name, []).append(latency)
            met[name] = met.get(name, 0) + ok
        return {
            name: ClassAttainment(len(lat), met[name], p95(lat)) for name, lat in latencies.items()
        }


class MetricsRecorder:
    """All HorizonServe metrics of one serving process, in their own registry."""

    def __init__(self, registry: CollectorRegistry | None = None, window_s: float = 300.0) -> None:
        self.registry = registry or CollectorRegistry()
        r = self.registry
        self.first_response = Histogram(
            "horizonserve_first_response_seconds",
            "First-response latency including queueing (TTFT text, TTFO speech, E2E image).",
            ["request_class"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.requests = Counter(
            "horizonserve_requests",
            "Requests that produced a first response, by SLO outcome.",
            ["request_class", "slo"],
            registry=r,
        )
        self.attainment = Gauge(
            "horizonserve_slo_attainment_ratio",
            "Rolling SLO attainment per class.",
            ["request_class"],
            registry=r,
        )
        self.sm_shared = Gauge(
            "horizonserve_shared_stage_sms", "SMs the shared stage may use.", registry=r
        )
        self.sm_downstream = Gauge(
            "horizonserve_downstream_sms", "SM headroom given to downstream stages.", registry=r
        )
        self.pressure = Gauge(
            "horizonserve_memory_pressure_ratio",
            "Smoothed memory-activity signal (NaN while unknown).",
            registry=r,
        )
        self.queue_depth = Gauge(
            "horizonserve_waiting_requests", "Requests waiting for the shared stage.", registry=r
        )
        self.window = AttainmentWindow(window_s)

    def first_response_at(
        self, now: float, class_name: str, latency_s: float, slo_s: float
    ) -> None:
        met = latency_s <= slo_s
        self.first_response.labels(class_name).observe(latency_s)
        self.requests.labels(class_name, "met" if met else "missed").inc()
        self.window.record(now, class_name, met, latency_s)

    def step(
        self, shared_sms: int, downstream_sms: int, pressure: float | None, waiting: int
    ) -> None:
        self.sm_shared.set(shared_sms)
        self.sm_downstream.set(downstream_sms)
        self.pressure.set(float("nan") if pressure is None else pressure)
        self.queue_depth.set(waiting)

    def refresh_attainment(self, now: float) -> dict[str, ClassAttainment]:
        snap = self.window.snapshot(now)
        for name, ca in snap.items():
            if ca.attainment is not None:
                self.attainment.labels(name).set(ca.attainment)
        return snap
