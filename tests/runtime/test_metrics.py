"""Metrics: the exporter's samples, cleared gauges and the rolling attainment window."""

from __future__ import annotations

import math

from prometheus_client import generate_latest

from horizonserve.runtime.metrics import VLLM_EQUIVALENT, AttainmentWindow, MetricsRecorder

M = "m"


def _v(m: MetricsRecorder, name: str, **labels: str) -> float | None:
    return m.registry.get_sample_value(name, {"model_name": M, **labels})


def test_first_responses_feed_counters_histogram_and_attainment() -> None:
    m = MetricsRecorder(window_s=10.0, model_name=M)
    m.first_response_at(1.0, "text", 0.05, slo_s=0.4)
    m.first_response_at(2.0, "text", 0.9, slo_s=0.4)
    m.first_response_at(3.0, "speech", 1.2, slo_s=5.0)
    snap = m.refresh_attainment(4.0)
    assert snap["text"].attainment == 0.5
    assert snap["speech"].attainment == 1.0
    assert snap["text"].p95_s == 0.9
    assert _v(m, "horizonserve:first_responses_total", request_class="text") == 2.0
    assert _v(m, "horizonserve:late_first_responses_total", request_class="text") == 1.0
    assert _v(m, "horizonserve:first_response_seconds_count", request_class="text") == 2.0
    assert _v(m, "horizonserve:slo_attainment_ratio", request_class="text") == 0.5
    assert b"horizonserve:first_response_seconds_bucket" in generate_latest(m.registry)


def test_attainment_gauge_is_removed_when_the_window_empties() -> None:
    m = MetricsRecorder(window_s=5.0, model_name=M)
    m.first_response_at(1.0, "text", 0.05, slo_s=0.4)
    m.refresh_attainment(2.0)
    assert _v(m, "horizonserve:slo_attainment_ratio", request_class="text") == 1.0
    m.refresh_attainment(60.0)
    assert _v(m, "horizonserve:slo_attainment_ratio", request_class="text") is None


def test_request_lifecycle_counters_and_in_flight() -> None:
    m = MetricsRecorder(model_name=M)
    for _ in range(4):
        m.admitted("image")
    assert _v(m, "horizonserve:num_requests_running", request_class="image") == 4
    m.finished("image", None, done=3.0, arrival=1.0)
    m.finished("image", "timeout", None, 1.0)
    m.finished("image", "cancelled", None, 1.0)
    m.finished("image", "unavailable", None, 1.0)
    m.rejected(None, "invalid")
    assert _v(m, "horizonserve:requests_total", request_class="image") == 4
    assert _v(m, "horizonserve:num_requests_running", request_class="image") == 0
    assert _v(m, "horizonserve:e2e_request_latency_seconds_sum", request_class="image") == 2.0
    assert _v(m, "horizonserve:request_timeouts_total", request_class="image") == 1
    assert _v(m, "horizonserve:requests_cancelled_total", request_class="image") == 1
    labels = {"request_class": "image", "reason": "unavailable"}
    assert _v(m, "horizonserve:request_errors_total", **labels) == 1
    labels = {"request_class": "", "reason": "invalid"}
    assert _v(m, "horizonserve:request_rejections_total", **labels) == 1


def test_step_and_stage_gauges_and_unknown_pressure() -> None:
    m = MetricsRecorder(model_name=M)
    m.step(64, 68, None, 12)
    m.set_stage_depths({"shared": 3, "image": 1})
    m.set_stage_up({"shared": True, "image": False})
    m.stage_restarted("image")
    m.underrun("speech")
    assert _v(m, "horizonserve:shared_stage_sms") == 64
    assert _v(m, "horizonserve:num_requests_waiting", stage="shared") == 12
    assert math.isnan(_v(m, "horizonserve:memory_pressure_ratio"))  # type: ignore[arg-type]
    assert _v(m, "horizonserve:stage_requests", stage="image") == 1
    assert _v(m, "horizonserve:stage_up", stage="image") == 0
    assert _v(m, "horizonserve:stage_restarts_total", stage="image") == 1
    assert _v(m, "horizonserve:speech_underruns_total", request_class="speech") == 1


def test_every_family_is_documented_and_none_clashes_with_vllm() -> None:
    m = MetricsRecorder(model_name=M)
    names = set()
    for metric in m.registry.collect():
        name = metric.name + ("_total" if metric.type == "counter" else "")
        names.add(name)
        assert name.startswith("horizonserve:") and not name.startswith("vllm:")
    assert names == set(VLLM_EQUIVALENT)


def test_window_forgets_old_responses_and_is_bounded() -> None:
    w = AttainmentWindow(window_s=5.0)
    w.record(0.0, "text", False, 0.9)
    w.record(6.0, "text", True, 0.1)
    assert w.snapshot(6.5)["text"].requests == 1
    assert w.snapshot(6.5)["text"].p95_s == 0.1
    assert w.snapshot(20.0) == {}
    small = AttainmentWindow(window_s=1e9, max_events=10)
    for i in range(100):
        small.record(float(i), "text", True, 0.1)
    assert small.snapshot(100.0)["text"].requests == 10
