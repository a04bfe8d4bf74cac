"""Prometheus metrics of one serving process and the rolling per-class attainment window.

Engines call the recorder on every admission, first response, end and scheduling step; the
serving process exposes the registry on its `/metrics` (vLLM's own `/metrics` for the
vLLM-Omni engine, whose default registry this shares), and the node sidecar turns
`AttainmentWindow.snapshot()` (through the stats file) into the node summary.

Every admitted request is judged once (`DeadlineBook`): met when its first response came
within the class SLO, missed the moment its deadline passes without one, whether it is still
waiting, was answered late, timed out, failed or was dropped by the server. Only a request
whose client went away before its deadline is not judged (nobody was failed).

Names sit beside vLLM's `vllm:` metrics: prefix `horizonserve:`, every family labelled with
`model_name` like vLLM's, per-class families with `request_class`. The mapping to the vLLM
metric a reader would compare with is `VLLM_EQUIVALENT` (documented in
runtime/engine/reference/README.md). Gauges of a class whose window emptied are removed, not
left at their last value.
"""

from __future__ import annotations

import heapq
import itertools
import math
import threading
from collections import deque
from collections.abc import Hashable, Iterable
from dataclasses import dataclass
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

PREFIX = "horizonserve:"
# First-response latency buckets (seconds): text TTFT is tens of ms, images take seconds;
# finer around the 100-250 ms text SLOs. `slo_buckets` adds edges around each class's SLO.
LATENCY_BUCKETS = (
    0.01, 0.025, 0.05, 0.075, 0.1, 0.125, 0.15, 0.2, 0.25, 0.3, 0.4, 0.5, 0.75,
    1.0, 2.5, 5.0, 10.0, 25.0, 60.0,
)  # fmt: skip
SLO_FRACTIONS = (0.5, 0.8, 0.9, 1.0, 1.1, 1.25, 1.5, 2.0)  # bucket edges as fractions of a SLO
# vLLM's buckets for time per output token and queue time (seconds).
TPOT_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5)
QUEUE_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
# Why a request left: vLLM's finished_reason values plus the ends an omni pipeline has.
FINISHED_REASONS = ("stop", "timeout", "cancelled", "rejected", "unavailable")
WINDOW_MAX_EVENTS = 200_000  # the attainment window's memory bound (oldest dropped first)
LATE_MAX = 10_000  # missed requests still waiting whose late answer may raise their latency

#: HorizonServe family -> the vLLM family it is closest to (None: no vLLM counterpart).
VLLM_EQUIVALENT: dict[str, str | None] = {
    "horizonserve:first_response_seconds": "vllm:time_to_first_token_seconds",
    "horizonserve:e2e_request_latency_seconds": "vllm:e2e_request_latency_seconds",
    "horizonserve:requests_total": None,
    "horizonserve:request_queue_time_seconds": "vllm:request_queue_time_seconds",
    "horizonserve:request_time_per_output_token_seconds": "vllm:time_per_output_token_seconds",
    "horizonserve:prompt_tokens_total": "vllm:prompt_tokens_total",
    "horizonserve:generation_tokens_total": "vllm:generation_tokens_total",
    "horizonserve:num_preemptions_total": "vllm:num_preemptions_total",
    "horizonserve:kv_cache_usage_perc": "vllm:kv_cache_usage_perc (KV slots in use, shared)",
    "horizonserve:request_success_total": "vllm:request_success_total (finished_reason)",
    "horizonserve:slo_misses_total": None,
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


def slo_buckets(targets: Iterable[float]) -> tuple[float, ...]:
    """LATENCY_BUCKETS plus edges at SLO_FRACTIONS of each target (sorted, no duplicates)."""
    edges = set(LATENCY_BUCKETS)
    for target in targets:
        if math.isfinite(target) and target > 0:
            edges.update(round(f * target, 6) for f in SLO_FRACTIONS)
    return tuple(sorted(edges))


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
    """SLO attainment per class over the last `window_s` seconds of judged requests (and at
    most `max_events` of them). An event is [time, class, met, latency]; a miss judged at its
    deadline gets its latency raised when the late answer comes (`raise_latency`)."""

    __slots__ = ("_events", "window_s")

    def __init__(self, window_s: float = 300.0, max_events: int = WINDOW_MAX_EVENTS) -> None:
        self.window_s = window_s
        self._events: deque[list[Any]] = deque(maxlen=max_events)

    def record(self, now: float, class_name: str, met: bool, latency_s: float) -> list[Any]:
        event = [now, class_name, met, latency_s]
        self._events.append(event)
        return event

    @staticmethod
    def raise_latency(event: list[Any], latency_s: float) -> None:
        event[3] = max(event[3], latency_s)

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


@dataclass(slots=True)
class _Pending:
    class_name: str
    arrival: float
    deadline: float
    missed: list[Any] | None = None  # the window event once judged a miss


class DeadlineBook:
    """Admitted requests not yet judged, by deadline.

    Invariant: each admitted request is judged exactly once — met at a first response by
    its deadline, or missed when `expire(now)` finds its deadline passed (still waiting,
    answered late, timed out, failed or dropped by the server). `drop` un-admits a request
    whose client went away before its deadline. Entries leave at their judgement, so the
    book holds at most the requests admitted within the longest SLO.
    """

    def __init__(self) -> None:
        self._pending: dict[Hashable, _Pending] = {}
        self._heap: list[tuple[float, int, Hashable]] = []
        self._seq = itertools.count()

    def __len__(self) -> int:
        return len(self._pending)

    def add(self, key: Hashable, class_name: str, arrival: float, slo_s: float) -> None:
        deadline = arrival + slo_s
        self._pending[key] = _Pending(class_name, arrival, deadline)
        heapq.heappush(self._heap, (deadline, next(self._seq), key))

    def pop(self, key: Hashable) -> _Pending | None:
        return self._pending.pop(key, None)

    def drop(self, key: Hashable, now: float) -> bool:
        """Forget a request its client cancelled; False (kept) once its deadline passed."""
        entry = self._pending.get(key)
        if entry is None or now > entry.deadline:
            return False
        del self._pending[key]
        return True

    def expire(self, now: float) -> Iterable[tuple[Hashable, _Pending]]:
        """The requests whose deadline passed by `now` (each once), earliest first."""
        heap = self._heap
        while heap and heap[0][0] < now:
            _, _, key = heapq.heappop(heap)
            entry = self._pending.pop(key, None)
            if entry is not None and entry.deadline < now:
                yield key, entry
            elif entry is not None:  # the key was admitted again with a later deadline
                self._pending[key] = entry


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
        self.first_response = self._first_response_family(LATENCY_BUCKETS)
        self.queue_time = self._family(
            Histogram,
            "request_queue_time_seconds",
            "Arrival to the prompt's first shared-stage batch (vLLM: time in WAITING).",
            cls,
            buckets=QUEUE_BUCKETS,
        )
        self.tpot = self._family(
            Histogram,
            "request_time_per_output_token_seconds",
            "Mean time per output token of the shared stage's decode, per request.",
            cls,
            buckets=TPOT_BUCKETS,
        )
        self.prompt_tokens = self._family(
            Counter, "prompt_tokens", "Prompt tokens of admitted requests.", cls
        )
        self.generation_tokens = self._family(
            Counter, "generation_tokens", "Tokens the shared stage generated.", cls
        )
        self.preemptions = self._family(
            Counter,
            "num_preemptions",
            "Shared-stage preemptions (a running sequence evicted and recomputed later).",
            cls,
        )
        self.kv_usage = self._family(
            Gauge,
            "kv_cache_usage_perc",
            "Fraction of the shared stage's KV slots in use at the last step (0-1).",
            model,
        )
        self.success = self._family(
            Counter,
            "request_success",
            "Admitted requests that left, by finished_reason (stop, timeout, cancelled, "
            "rejected, unavailable).",
            (*cls, "finished_reason"),
        )
        self.misses = self._family(
            Counter,
            "slo_misses",
            "Requests judged a SLO miss: counted when the deadline passes without a first "
            "response (waiting, late, timed out, failed or dropped) or at a late first response.",
            cls,
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
        self.book = DeadlineBook()
        self._late: dict[Hashable, list[Any]] = {}  # missed, still waiting: their window event
        self._lock = threading.Lock()  # the book, the window and `_late`
        self._attained: set[str] = set()  # classes with an attainment sample exported

    def _first_response_family(self, buckets: Iterable[float]) -> Any:
        return self._family(
            Histogram,
            "first_response_seconds",
            "First-response latency including queueing (TTFT text, TTFO speech, E2E image); "
            "bucket edges at fractions of each class's SLO.",
            ("model_name", "request_class"),
            buckets=tuple(buckets),
        )

    def use_slo_buckets(self, targets: Iterable[float]) -> None:
        """First-response buckets around each class SLO (call before the first response)."""
        self.registry.unregister(self.first_response)
        self.first_response = self._first_response_family(slo_buckets(targets))

    # -- requests ---------------------------------------------------------------------------
    def _family(self, kind: type, short: str, doc: str, labels: tuple[str, ...], **kw: Any) -> Any:
        """A metric family `horizonserve:<short>` in this recorder's registry."""
        return kind(PREFIX + short, doc, list(labels), registry=self.registry, **kw)

    def admitted(
        self,
        class_name: str,
        *,
        key: Hashable | None = None,
        arrival: float | None = None,
        slo_s: float | None = None,
        prompt_tokens: int | None = None,
    ) -> None:
        """An admitted request; with `key`, `arrival` and `slo_s` it is judged against its
        deadline (`expect`)."""
        m = self.model_name
        self.requests.labels(m, class_name).inc()
        self.running.labels(m, class_name).inc()
        if prompt_tokens:
            self.prompt_tokens.labels(m, class_name).inc(prompt_tokens)
        if key is not None and arrival is not None and slo_s is not None:
            self.expect(key, class_name, arrival, slo_s)

    def expect(self, key: Hashable, class_name: str, arrival: float, slo_s: float) -> None:
        """Judge request `key` against the deadline `arrival + slo_s` (monotonic seconds)."""
        with self._lock:
            self._expire(arrival)
            self.book.add(key, class_name, arrival, slo_s)

    def finished(
        self,
        class_name: str,
        failure: str | None,
        done: float | None,
        arrival: float,
        *,
        key: Hashable | None = None,
        now: float | None = None,
        record: Any = None,
    ) -> None:
        """An admitted request left (`failure`: None, or the pipeline's failure kind).

        With `key`, a request cancelled by its client before its deadline is not judged;
        any other end leaves the judgement to its deadline. `record` (the engine's request
        record: queueing_s, shared_tpot_s, shared_tokens, info["preempted"]) feeds the
        per-request families.
        """
        m = self.model_name
        self.running.labels(m, class_name).dec()
        self.success.labels(m, class_name, failure or "stop").inc()
        if failure is None:
            if done is not None:
                self.latency.labels(m, class_name).observe(max(0.0, done - arrival))
        elif failure == "timeout":
            self.timeouts.labels(m, class_name).inc()
        elif failure == "cancelled":
            self.cancelled.labels(m, class_name).inc()
        else:
            self.errors.labels(m, class_name, failure).inc()
        if key is not None:
            with self._lock:
                self._late.pop(key, None)
                if failure == "cancelled" and now is not None:
                    self.book.drop(key, now)
        if record is not None:
            self._observe_record(class_name, record)

    def _observe_record(self, class_name: str, rec: Any) -> None:
        m = self.model_name
        queued = getattr(rec, "queueing_s", None)
        if queued is not None and math.isfinite(queued):
            self.queue_time.labels(m, class_name).observe(max(0.0, queued))
        tpot = getattr(rec, "shared_tpot_s", None)
        if tpot is not None and math.isfinite(tpot):
            self.tpot.labels(m, class_name).observe(max(0.0, tpot))
        tokens = getattr(rec, "shared_tokens", None)
        if tokens:
            self.generation_tokens.labels(m, class_name).inc(tokens)
        preempted = (getattr(rec, "info", None) or {}).get("preempted")
        if preempted:
            self.preemptions.labels(m, class_name).inc(preempted)

    def client_gone(self, key: Hashable, now: float) -> None:
        """The client of request `key` went away: not judged if its deadline had not passed."""
        with self._lock:
            self.book.drop(key, now)

    def rejected(self, class_name: str | None, reason: str) -> None:
        self.rejections.labels(self.model_name, class_name or "", reason).inc()

    def first_response_at(
        self,
        now: float,
        class_name: str,
        latency_s: float,
        slo_s: float,
        *,
        key: Hashable | None = None,
    ) -> None:
        """A first response. With `key` (a request given to `expect`), a response after the
        deadline only raises the latency of the miss judged at the deadline."""
        met = latency_s <= slo_s
        m = self.model_name
        self.first_response.labels(m, class_name).observe(latency_s)
        self.first_responses.labels(m, class_name).inc()
        if not met:
            self.late.labels(m, class_name).inc()
        with self._lock:
            if key is None:
                self._judge(now, class_name, met, latency_s)
                return
            entry = self.book.pop(key)
            if entry is not None:  # not yet judged: now, at the response (or its deadline)
                when = now if met else min(now, entry.deadline)
                self._judge(when, class_name, met, latency_s)
                return
            event = self._late.pop(key, None)
            if event is not None:
                self.window.raise_latency(event, latency_s)

    def _judge(self, when: float, class_name: str, met: bool, latency_s: float) -> list[Any]:
        if not met:
            self.misses.labels(self.model_name, class_name).inc()
        return self.window.record(when, class_name, met, latency_s)

    def _expire(self, now: float) -> None:
        """Judge as missed every request whose deadline passed by `now` (lock held)."""
        for key, entry in self.book.expire(now):
            slo_s = entry.deadline - entry.arrival  # a lower bound of its latency
            event = self._judge(entry.deadline, entry.class_name, False, slo_s)
            self._late[key] = event
            while len(self._late) > LATE_MAX:
                self._late.pop(next(iter(self._late)))

    def underrun(self, class_name: str) -> None:
        self.underruns.labels(self.model_name, class_name).inc()

    # -- stages -----------------------------------------------------------------------------
    def step(
        self,
        shared_sms: int,
        downstream_sms: int,
        pressure: float | None,
        waiting: int,
        kv_usage: float | None = None,
    ) -> None:
        m = self.model_name
        if kv_usage is not None:
            self.kv_usage.labels(m).set(kv_usage)
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
        with self._lock:
            self._expire(now)
            snap = self.window.snapshot(now)
        for name, ca in snap.items():
            if ca.attainment is not None:
                self.attainment.labels(self.model_name, name).set(ca.attainment)
        for gone in self._attained - snap.keys():
            self.attainment.remove(self.model_name, gone)
        self._attained = set(snap)
        return snap
