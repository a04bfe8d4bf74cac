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


# -- every admitted request is judged once, against its deadline -----------------------------


def test_a_request_without_a_first_response_is_a_miss_when_its_deadline_passes() -> None:
    m = MetricsRecorder(window_s=60.0, model_name=M)
    m.admitted("image", key="r1", arrival=0.0, slo_s=1.0)
    assert m.refresh_attainment(0.5) == {}  # still within its SLO: not judged yet
    snap = m.refresh_attainment(1.5)  # deadline passed, still waiting: a miss at once
    assert (snap["image"].requests, snap["image"].met) == (1, 0)
    assert _v(m, "horizonserve:slo_misses_total", request_class="image") == 1
    assert _v(m, "horizonserve:slo_attainment_ratio", request_class="image") == 0.0
    # The late answer raises the miss's latency; it is not counted a second time.
    m.first_response_at(3.0, "image", 3.0, 1.0, key="r1")
    snap = m.refresh_attainment(3.5)
    assert (snap["image"].requests, snap["image"].met, snap["image"].p95_s) == (1, 0, 3.0)
    assert _v(m, "horizonserve:slo_misses_total", request_class="image") == 1


def test_timeouts_failures_and_server_drops_count_client_cancels_do_not() -> None:
    m = MetricsRecorder(window_s=60.0, model_name=M)
    for rid in ("timeout", "rejected", "unavailable", "cancelled-late", "cancelled-early"):
        m.admitted("text", key=rid, arrival=0.0, slo_s=0.25)
    m.finished("text", "timeout", None, 0.0, key="timeout", now=0.1)
    m.finished("text", "rejected", None, 0.0, key="rejected", now=0.1)
    m.finished("text", "unavailable", None, 0.0, key="unavailable", now=0.1)
    m.finished("text", "cancelled", None, 0.0, key="cancelled-early", now=0.1)  # client gone
    m.finished("text", "cancelled", None, 0.0, key="cancelled-late", now=0.3)  # after deadline
    snap = m.refresh_attainment(1.0)
    assert (snap["text"].requests, snap["text"].met) == (4, 0)
    reasons = {"timeout": 1, "rejected": 1, "unavailable": 1, "cancelled": 2}
    for reason, n in reasons.items():
        labels = {"request_class": "text", "finished_reason": reason}
        assert _v(m, "horizonserve:request_success_total", **labels) == n


def test_on_time_and_late_answers_are_judged_once() -> None:
    m = MetricsRecorder(window_s=60.0, model_name=M)
    m.admitted("text", key="a", arrival=0.0, slo_s=0.25)
    m.admitted("text", key="b", arrival=0.0, slo_s=0.25)
    m.first_response_at(0.1, "text", 0.1, 0.25, key="a")  # met
    m.first_response_at(0.4, "text", 0.4, 0.25, key="b")  # late, before any sweep
    m.finished("text", None, 0.2, 0.0, key="a", now=0.2)
    m.finished("text", None, 0.5, 0.0, key="b", now=0.5)
    snap = m.refresh_attainment(2.0)
    assert (snap["text"].requests, snap["text"].met) == (2, 1)
    assert len(m.book) == 0  # nothing left waiting for a judgement


def test_vllm_aligned_families_from_a_finished_record() -> None:
    from types import SimpleNamespace

    rec = SimpleNamespace(
        queueing_s=0.02, shared_tpot_s=0.012, shared_tokens=7, info={"preempted": 2}
    )
    m = MetricsRecorder(model_name=M)
    m.admitted("text", prompt_tokens=40)
    m.finished("text", None, 1.0, 0.0, record=rec)
    m.step(64, 68, 0.1, 0, kv_usage=0.25)
    assert _v(m, "horizonserve:prompt_tokens_total", request_class="text") == 40
    assert _v(m, "horizonserve:generation_tokens_total", request_class="text") == 7
    assert _v(m, "horizonserve:num_preemptions_total", request_class="text") == 2
    assert _v(m, "horizonserve:request_queue_time_seconds_count", request_class="text") == 1
    assert _v(m, "horizonserve:request_time_per_output_token_seconds_sum", request_class="text")
    assert _v(m, "horizonserve:kv_cache_usage_perc") == 0.25


def test_first_response_buckets_sit_around_each_class_slo() -> None:
    m = MetricsRecorder(model_name=M)
    m.use_slo_buckets([0.1, 0.25, 7.0])
    m.first_response_at(1.0, "text", 0.26, 0.25)
    le = {
        float(s.labels["le"])
        for metric in m.registry.collect()
        if metric.name == "horizonserve:first_response_seconds"
        for s in metric.samples
        if s.name.endswith("_bucket") and s.labels["le"] != "+Inf"
    }
    for slo in (0.1, 0.25, 7.0):
        assert {round(f * slo, 6) for f in (0.9, 1.0, 1.1)} <= le
