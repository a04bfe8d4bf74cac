"""The sidecar's HTTP over real sockets (header and idle deadlines, per-client cap, /healthz
beyond the cap, CL + TE, TCP_NODELAY) and its stats-file reading (stale files, FIFOs), and one
`model_name` on the serving process's and the sidecar's metrics."""

from __future__ import annotations

import contextlib
import os
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from horizonserve.runtime import config as cfg
from horizonserve.runtime import sidecar as sc_mod
from horizonserve.runtime.engine.reference.defaults import reference_config
from horizonserve.runtime.metrics import MetricsRecorder
from horizonserve.runtime.node_stats import class_summaries, write_stats
from horizonserve.runtime.sidecar import Sidecar, SidecarHttp


def _sidecar(tmp_path: Path) -> Sidecar:
    return Sidecar(
        serving=reference_config("tiny"),
        node="n1",
        mode=cfg.CalibrationMode.SKIP,
        artifact_dir=tmp_path / "art",
        stats_file=tmp_path / "stats.json",
        publisher=None,
        gpu=None,
    )


@pytest.fixture
def http(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[SidecarHttp]:
    monkeypatch.setattr(sc_mod, "HEADER_TIMEOUT_S", 1.0)
    monkeypatch.setattr(sc_mod, "MAX_CONNECTIONS", 4)
    monkeypatch.setattr(sc_mod, "MAX_CONNECTIONS_PER_CLIENT", 2)
    server = _sidecar(tmp_path).serve_http(0, "127.0.0.1")
    yield server
    server.shutdown()


def _connect(http: SidecarHttp, source: str = "127.0.0.1") -> socket.socket:
    return socket.create_connection(("127.0.0.1", http.port), timeout=5, source_address=(source, 0))


def test_a_stalled_head_and_an_idle_connection_are_closed(http: SidecarHttp) -> None:
    with _connect(http) as idle, _connect(http, "127.0.0.2") as slow:
        slow.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n")  # never finished
        t0 = time.monotonic()
        assert idle.recv(1) == b"" and slow.recv(1) == b""
        assert time.monotonic() - t0 < 4.0  # the 1 s deadline, not never


def test_healthz_answers_while_stalled_clients_hold_every_connection(http: SidecarHttp) -> None:
    held = [_connect(http, "127.0.0.2") for _ in range(2)]
    extra = _connect(http, "127.0.0.2")  # over its client's cap: closed at once
    assert extra.recv(1) == b""
    held += [_connect(http, "127.0.0.3") for _ in range(2)]  # the cap (4) is full
    time.sleep(0.2)
    try:
        base = f"http://127.0.0.1:{http.port}"
        assert httpx.get(base + "/healthz", timeout=5).status_code == 200
        assert httpx.get(base + "/metrics", timeout=5).status_code == 503
    finally:
        for s in [*held, extra]:
            s.close()


def test_cl_with_te_is_refused_and_closed_and_connections_have_nodelay(
    http: SidecarHttp,
) -> None:
    assert http._sock.proto == socket.IPPROTO_TCP
    smuggled = (
        b"POST /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n"
        b"Transfer-Encoding: chunked\r\n\r\n0\r\n\r\nGET /metrics HTTP/1.1\r\nHost: x\r\n\r\n"
    )
    with _connect(http) as s:
        s.sendall(smuggled)
        out = b""
        with contextlib.suppress(TimeoutError, ConnectionResetError):
            while chunk := s.recv(65536):
                out += chunk
    assert out.startswith(b"HTTP/1.1 400") and out.count(b"HTTP/1.1") == 1


def test_a_day_old_stats_file_is_not_published_as_current(tmp_path: Path) -> None:
    sidecar = _sidecar(tmp_path)
    rec = MetricsRecorder()
    rec.first_response_at(1.0, "text", 0.1, 0.5)
    slo = sidecar.serving.slo
    now = time.time()
    write_stats(sidecar.stats_file, class_summaries(rec, slo, 2.0), 300.0, now - 86_400)
    summary = sidecar.publish_once(now)
    assert summary.classes == [] and summary.requests == 0
    assert any("old" in e and "stats file" in e for e in summary.errors)
    write_stats(sidecar.stats_file, class_summaries(rec, slo, 2.0), 300.0, now - 5)
    assert sidecar.publish_once(now).requests == 1  # a fresh file is published


def test_a_fifo_at_the_stats_path_never_blocks(tmp_path: Path) -> None:
    sidecar = _sidecar(tmp_path)
    os.mkfifo(sidecar.stats_file)
    done: list[cfg.NodeSummary] = []
    worker = threading.Thread(target=lambda: done.append(sidecar.publish_once(time.time())))
    worker.daemon = True
    worker.start()
    worker.join(5)
    assert done, "publish_once blocked on the FIFO"
    assert any("not a regular file" in e for e in done[0].errors)


def test_serving_and_sidecar_metrics_carry_one_model_name() -> None:
    import argparse

    from horizonserve.runtime.engine.reference.cli import add_arguments, options_from_args

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    options = options_from_args(parser.parse_args(["--preset", "tiny"]))
    assert options.model_name == reference_config("tiny").model  # what the sidecar labels
