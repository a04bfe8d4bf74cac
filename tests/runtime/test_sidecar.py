"""Sidecar: calibration lookup, summaries from the serving stats file, publication."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from horizonserve.runtime import config as cfg
from horizonserve.runtime.artifact import load_artifact
from horizonserve.runtime.artifact_store import GpuInfo, find_artifact
from horizonserve.runtime.metrics import MetricsRecorder
from horizonserve.runtime.node_stats import class_summaries, read_stats, write_stats
from horizonserve.runtime.sidecar import Sidecar
from tests.runtime.builders import make_config


class Recorder:
    def __init__(self, fail: bool = False) -> None:
        self.fail = fail
        self.published: list[cfg.NodeSummary] = []

    def publish(self, summary: cfg.NodeSummary) -> None:
        if self.fail:
            raise ConnectionError("api server unreachable")
        self.published.append(summary)


def _sidecar(tmp_path: Path, **kw: object) -> Sidecar:
    args: dict = {
        "serving": make_config(),
        "node": "gpu-1",
        "mode": cfg.CalibrationMode.AUTO,
        "artifact_dir": tmp_path / "artifacts",
        "stats_file": tmp_path / "stats.json",
        "publisher": Recorder(),
        "gpu": None,
    }
    args.update(kw)
    return Sidecar(**args)


def test_stats_round_trip_through_the_file(tmp_path: Path) -> None:
    config = make_config()
    rec = MetricsRecorder(window_s=60)
    rec.first_response_at(1.0, "text", 0.2, config.slo.target_s("text"))
    rec.first_response_at(1.5, "text", 0.9, config.slo.target_s("text"))
    classes = class_summaries(rec, config.slo, 2.0)
    write_stats(tmp_path / "s.json", classes, 60.0, 1234.0)
    back, window, ts = read_stats(tmp_path / "s.json")  # type: ignore[misc]
    assert (window, ts) == (60.0, 1234.0)
    text = next(c for c in back if c.name == "text")
    assert (text.requests, text.met, text.p95_s) == (2, 1, 0.9)
    assert [c.name for c in back] == [c.name for c in config.slo.classes]


def test_summary_carries_stats_and_publishes(tmp_path: Path) -> None:
    sc = _sidecar(tmp_path)
    config = make_config()
    rec = MetricsRecorder()
    rec.first_response_at(1.0, "audio-out", 1.0, config.slo.target_s("audio-out"))
    write_stats(sc.stats_file, class_summaries(rec, config.slo, 2.0), 300.0, 10.0)
    summary = sc.publish_once(20.0)
    assert sc.publisher.published == [summary]  # type: ignore[union-attr]
    assert summary.requests == 1 and summary.met == 1
    assert summary.ladder == config.ladder
    assert cfg.NodeSummary.from_annotation(summary.to_annotation()) == summary
    labels = {"model_name": config.model, "request_class": "audio-out"}
    value = sc.registry.get_sample_value("horizonserve:node_slo_attainment_ratio", labels)
    assert value == 1.0
    # The class's window empties: its gauge goes away instead of keeping the old value.
    write_stats(sc.stats_file, class_summaries(rec, config.slo, 1000.0), 300.0, 11.0)
    sc.publish_once(30.0)
    assert sc.registry.get_sample_value("horizonserve:node_slo_attainment_ratio", labels) is None


_BAD_STATS = [
    b"",
    b"{not json",
    b"[]",
    b'{"classes": 3, "window_s": 1, "timestamp": 1}',
    b'{"classes": [{"name": ""}], "window_s": 1, "timestamp": 1}',
    b'{"classes": [], "window_s": "x", "timestamp": 1}',
    b'{"classes": [], "window_s": NaN, "timestamp": 1}',
    b'{"classes": [], "timestamp": 1}',
    b"\xff\xfe\x00garbage",
    b"[" * 100_000,
    b'{"classes": [{"name": "t", "priority": 0, "requests": 1, "met": 5}], '
    b'"window_s": 1, "timestamp": 1}',
    b" " * ((1 << 20) + 10),
]


@pytest.mark.parametrize("raw", _BAD_STATS, ids=range(len(_BAD_STATS)))
def test_malformed_stats_file_is_reported_never_fatal(tmp_path: Path, raw: bytes) -> None:
    sc = _sidecar(tmp_path)
    sc.stats_file.write_bytes(raw)
    with pytest.raises(ValueError, match="stats file"):
        read_stats(sc.stats_file)
    summary = sc.publish_once(5.0)  # must not raise
    assert summary.classes == [] and any("stats file" in e for e in summary.errors)


def test_stats_path_that_is_a_directory_is_reported(tmp_path: Path) -> None:
    sc = _sidecar(tmp_path)
    sc.stats_file.mkdir()
    assert any("stats file" in e for e in sc.publish_once(1.0).errors)


def test_broken_artifact_is_reported_not_fatal(tmp_path: Path) -> None:
    art = load_artifact()
    pipeline = next(iter(art.pipelines))
    entry = art.pipelines[pipeline]
    d = tmp_path / "artifacts"
    d.mkdir()
    sc = _sidecar(tmp_path, gpu=GpuInfo(art.gpu.name, art.gpu.driver))
    state = sc._load(d / "missing.json")
    assert state.artifact is None and "unusable" in (state.error or "")
    assert entry.ladder is not None


def test_one_metrics_endpoint_relays_the_serving_process(tmp_path: Path) -> None:
    import httpx
    from prometheus_client import start_http_server

    serving = MetricsRecorder(model_name="m")
    serving.first_response_at(1.0, "text", 0.1, 0.5)
    server, _thread = start_http_server(0, addr="127.0.0.1", registry=serving.registry)
    try:
        url = f"http://127.0.0.1:{server.server_port}/metrics"
        sc = _sidecar(tmp_path, serving_metrics_url=url)
        http = sc.serve_http(0, "127.0.0.1")
        try:
            r = httpx.get(f"http://127.0.0.1:{http.port}/metrics", timeout=10)
            assert r.status_code == 200
            assert (
                'horizonserve:first_responses_total{model_name="m",request_class="text"} 1.0'
                in r.text
            )
            assert "horizonserve:serving_scrape_up{" in r.text and "} 1.0" in r.text
            assert r.text.count("# TYPE horizonserve:serving_scrape_up gauge") == 1
            assert httpx.get(f"http://127.0.0.1:{http.port}/healthz", timeout=5).text == "ok\n"
        finally:
            http.shutdown()
    finally:
        server.shutdown()
    # The serving process is gone: /metrics still answers, saying the relay failed.
    text = sc.metrics_text().decode()
    assert "horizonserve:first_responses_total" not in text
    assert "horizonserve:serving_scrape_up{" in text and "} 0.0" in text


def test_no_gpu_is_reported_not_fatal(tmp_path: Path) -> None:
    sc = _sidecar(tmp_path)
    state = sc.calibrate()
    assert state.artifact is None
    assert "no NVIDIA GPU" in (state.error or "")
    assert "no NVIDIA GPU" in sc.summary(1.0).calibration_error  # type: ignore[operator]


def test_publish_failure_is_carried_in_the_next_summary(tmp_path: Path) -> None:
    sc = _sidecar(tmp_path, publisher=Recorder(fail=True))
    sc.publish_once(1.0)
    assert any("api server unreachable" in e for e in sc.summary(2.0).errors)


def test_auto_mode_finds_the_matching_artifact(tmp_path: Path) -> None:
    art = load_artifact()
    pipeline = next(iter(art.pipelines))
    entry = art.pipelines[pipeline]
    d = tmp_path / "artifacts"
    d.mkdir()
    (d / "node.json").write_text(art.model_dump_json())
    (d / "garbage.json").write_text(json.dumps({"schema_version": 99}))
    gpu = GpuInfo(art.gpu.name, art.gpu.driver)
    assert find_artifact(d, pipeline, entry.model, gpu) == d / "node.json"
    assert find_artifact(d, pipeline, entry.model, GpuInfo("other", "1")) is None
    serving = make_config().model_copy(update={"pipeline": pipeline, "model": entry.model})
    sc = _sidecar(tmp_path, serving=serving, gpu=gpu)
    state = sc.calibrate()
    assert state.artifact == d / "node.json"
    assert state.ladder == entry.ladder
    assert sc.summary(1.0).calibrated


@pytest.mark.k8s
def test_publishes_the_pod_annotation_on_a_real_api_server(
    kube_cluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from kubernetes import client, config

    from horizonserve.runtime.sidecar import PodAnnotationPublisher

    config.load_kube_config(str(kube_cluster.kubeconfig))
    api = client.CoreV1Api()
    pod = {
        "metadata": {"name": "sidecar-publish"},
        "spec": {"containers": [{"name": "c", "image": "busybox"}]},
    }
    api.create_namespaced_pod("default", pod)
    try:
        monkeypatch.setenv("KUBECONFIG", str(kube_cluster.kubeconfig))
        sc = _sidecar(tmp_path, publisher=PodAnnotationPublisher("default", "sidecar-publish"))
        sent = sc.publish_once(42.0)
        got = api.read_namespaced_pod("sidecar-publish", "default")
        text = got.metadata.annotations[cfg.SUMMARY_ANNOTATION]
        assert cfg.NodeSummary.from_annotation(text) == sent
    finally:
        api.delete_namespaced_pod("sidecar-publish", "default", grace_period_seconds=0)


def test_missing_artifact_is_reported(tmp_path: Path) -> None:
    sc = _sidecar(tmp_path, gpu=GpuInfo("NVIDIA H200", "580.1"))
    state = sc.calibrate()
    assert state.artifact is None
    assert "no calibration artifact for test/omni on NVIDIA H200" in (state.error or "")


def test_skip_mode_uses_the_configured_ladder(tmp_path: Path) -> None:
    sc = _sidecar(tmp_path, mode=cfg.CalibrationMode.SKIP, gpu=GpuInfo("NVIDIA H200", "1"))
    assert sc.calibrate().error is None
    assert sc.summary(1.0).ladder == make_config().ladder
