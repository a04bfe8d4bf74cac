"""Metrics: the exporter's samples and the rolling attainment window."""

from __future__ import annotations

import math

from prometheus_client import generate_latest

from horizonserve.runtime.metrics import AttainmentWindow, MetricsRecorder


def test_first_responses_feed_counters_histogram_and_attainment() -> None:
    m = MetricsRecorder(window_s=10.0)
    m.first_response_at(1.0, "text", 0.05, slo_s=0.4)
    m.first_response_at(2.0, "text", 0.9, slo_s=0.4)
    m.first_response_at(3.0, "speech", 1.2, slo_s=5.0)
    snap = m.refresh_attainment(4.0)
    assert snap["text"].attainment == 0.5
    assert snap["speech"].attainment == 1.0
    assert snap["text"].p95_s == 0.9
    r = m.registry
    assert (
        r.get_sample_value(
            "horizonserve_requests_total", {"request_class": "text", "slo": "missed"}
        )
        == 1.0
    )
    assert (
        r.get_sample_value("horizonserve_first_response_seconds_count", {"request_class": "text"})
        == 2.0
    )
    assert r.get_sample_value("horizonserve_slo_attainment_ratio", {"request_class": "text"}) == 0.5
    assert b"horizonserve_first_response_seconds_bucket" in generate_latest(r)


def test_step_gauges_and_unknown_pressure() -> None:
    m = MetricsRecorder()
    m.step(64, 68, None, 12)
    assert m.registry.get_sample_value("horizonserve_shared_stage_sms") == 64
    assert m.registry.get_sample_value("horizonserve_waiting_requests") == 12
    assert math.isnan(m.registry.get_sample_value("horizonserve_memory_pressure_ratio"))


def test_window_forgets_old_responses() -> None:
    w = AttainmentWindow(window_s=5.0)
    w.record(0.0, "text", False, 0.9)
    w.record(6.0, "text", True, 0.1)
    assert w.snapshot(6.5)["text"].requests == 1
    assert w.snapshot(6.5)["text"].p95_s == 0.1
    assert w.snapshot(20.0) == {}
