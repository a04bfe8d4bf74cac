"""The reference server over real sockets: framing, deadlines, access, SSE, cancellation.

One CPU pipeline (tiny preset) serves the module; servers with different settings share it.
"""

from __future__ import annotations

import contextlib
import json
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

pytest.importorskip("torch")

from horizonserve.runtime.engine.reference import PipelineOptions
from horizonserve.runtime.engine.reference.pipeline import CANCELLED, TIMED_OUT, Pipeline
from horizonserve.runtime.engine.reference.protocol import DONE, Event
from horizonserve.runtime.engine.reference.server import ApiServer, ServerSettings

FAST = ServerSettings(header_timeout_s=1.0, body_timeout_s=1.0, keep_alive_s=1.0)


@pytest.fixture(scope="module")
def pipeline() -> Iterator[Pipeline]:
    with Pipeline(PipelineOptions(preset="tiny", device="cpu", warmup=False)) as p:
        yield p


@pytest.fixture(scope="module")
def server(pipeline: Pipeline) -> Iterator[ApiServer]:
    srv = ApiServer(pipeline, "127.0.0.1", 0, FAST)
    srv.serve_in_thread()
    yield srv
    srv.shutdown()
    srv.server_close()


def _raw(server: ApiServer, data: bytes, wait_s: float = 5.0) -> bytes:
    """Send `data` on a fresh connection; everything the server sent until it closed."""
    host, port = server.url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=wait_s) as s:
        s.sendall(data)
        out = b""
        try:
            while chunk := s.recv(65536):
                out += chunk
        except TimeoutError:
            pass
    return out


def _json_of(reply: bytes) -> dict[str, Any]:
    return json.loads(reply.split(b"\r\n\r\n", 1)[1])


@pytest.mark.parametrize(
    "head",
    [
        b"POST /v1/requests HTTP/1.1\r\nHost: x\r\nContent-Length: -1\r\n\r\n",
        b"POST /v1/requests HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\n",
        b"POST /v1/requests HTTP/1.1\r\nHost: x\r\nContent-Length: 1e3\r\n\r\n",
        b"GARBAGE\r\n\r\n",
    ],
    ids=["negative", "duplicate", "not-a-number", "request-line"],
)
def test_bad_framing_is_a_json_400_and_the_connection_closes(
    server: ApiServer, head: bytes
) -> None:
    reply = _raw(server, head + b'{"priority": 0}')
    assert reply.startswith(b"HTTP/1.1 400"), reply[:200]
    assert reply.count(b"HTTP/1.1 ") == 1
    assert _json_of(reply)["field"] == "request"


def test_oversize_body_is_refused_unread_so_a_hidden_request_never_runs(
    server: ApiServer, pipeline: Pipeline
) -> None:
    hidden = b"GET /nowhere-hidden HTTP/1.1\r\nHost: x\r\n\r\n"
    body = hidden + b"x" * 70_000
    head = b"POST /v1/requests HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n" % len(body)
    reply = _raw(server, head + body)
    assert reply.startswith(b"HTTP/1.1 413"), reply[:200]
    assert reply.count(b"HTTP/1.1 ") == 1  # nothing answered the hidden request
    assert b"connection: close" in reply.lower()
    assert _json_of(reply)["field"] == "body"
    chunked = b"POST /v1/requests HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
    chunked += b"".join(b"%x\r\n%s\r\n" % (8192, b"y" * 8192) for _ in range(10)) + b"0\r\n\r\n"
    reply = _raw(server, chunked)
    assert reply.startswith(b"HTTP/1.1 413") and reply.count(b"HTTP/1.1 ") == 1


def test_a_refusal_reaches_the_client_while_its_body_is_still_arriving(
    server: ApiServer,
) -> None:
    """The server answers 413 from the head and stops reading; megabytes of body are still
    on the wire. Closing with unread input would reset the connection and could destroy the
    413 before the client reads it; the staged close drains instead, so every try sees it."""
    host, port = server.url.removeprefix("http://").split(":")
    size = 8 << 20
    head = b"POST /v1/requests HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n" % size
    for _ in range(5):
        with socket.create_connection((host, int(port)), timeout=10) as s:
            s.sendall(head)
            sender = threading.Thread(target=_send_quietly, args=(s, b"z" * size))
            sender.start()
            reply = b""
            while chunk := s.recv(65536):  # a reset would raise ConnectionResetError here
                reply += chunk
            sender.join(10)
        assert reply.startswith(b"HTTP/1.1 413"), reply[:200]
        assert _json_of(reply)["field"] == "body"


def _send_quietly(s: socket.socket, data: bytes) -> None:
    with contextlib.suppress(OSError):  # the linger may end before the last bytes arrive
        s.sendall(data)


def test_slow_headers_and_slow_body_hit_their_deadlines(server: ApiServer) -> None:
    host, port = server.url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=5) as s:
        t0 = time.monotonic()
        s.sendall(b"POST /v1/requests HTTP/1.1\r\nHost: x\r\n")
        for _ in range(10):  # a byte every 0.2 s: each byte would have reset uvicorn's timer
            time.sleep(0.2)
            try:
                s.sendall(b"X")
            except OSError:
                break
        assert s.recv(100) == b""  # closed
        assert time.monotonic() - t0 < FAST.header_timeout_s + 1.5
    head = b"POST /v1/requests HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{"
    t0 = time.monotonic()
    reply = _raw(server, head)
    assert reply.startswith(b"HTTP/1.1 408") and _json_of(reply)["field"] == "body"
    assert time.monotonic() - t0 < FAST.body_timeout_s + 1.5


def test_routes_and_methods_name_the_field(server: ApiServer) -> None:
    with httpx.Client(base_url=server.url, timeout=10) as c:
        r = c.get("/nowhere")
        assert r.status_code == 404 and r.json()["field"] == "path"
        r = c.get("/v1/requests")
        assert r.status_code == 405 and r.json()["field"] == "method"
        r = c.post("/v1/requests", json={"priority": 0, "audio_seconds": 1e308})
        assert r.status_code == 400 and r.json()["field"] == "audio_seconds"
        r = c.post("/v1/requests", content=b'{"priority": 10, "audio_seconds": NaN}')
        assert r.status_code == 400 and r.json()["field"] == "audio_seconds"
        r = c.post("/v1/requests", json={"priority": 20, "downstream_tokens": 10**9})
        assert r.status_code == 400 and r.json()["field"] == "downstream_tokens"
        r = c.post("/v1/requests", content=b'{"priority": 0, "priority": 10}')
        assert r.status_code == 400 and r.json()["field"] == "priority"
        r = c.post("/v1/requests", json={"priority": 0, "id": "x" * 500})
        assert r.status_code == 400 and r.json()["field"] == "id"


def test_health_ready_and_metrics(server: ApiServer) -> None:
    with httpx.Client(base_url=server.url, timeout=10) as c:
        assert c.get("/health").json() == {"status": "ok"}
        assert c.get("/ready").json() == {"ready": True, "degraded": {}}
        health = c.get("/healthz").json()
        assert health["ok"] and health["live"] and health["ready"]
        assert all(s["heartbeat_age_s"] < 2 for s in health["stages"].values())
        c.post("/v1/requests", json={"priority": 0, "output_tokens": 2})
        text = c.get("/metrics").text
    for family in (
        "horizonserve:first_response_seconds_bucket",
        "horizonserve:requests_total",
        "horizonserve:num_requests_running",
        "horizonserve:stage_requests",
        "horizonserve:stage_up",
        "horizonserve:shared_stage_sms",
        "horizonserve:request_rejections_total",
    ):
        assert family in text, family


def test_api_key_and_class_policy(pipeline: Pipeline) -> None:
    settings = ServerSettings(api_keys={"k-text": frozenset({"text"}), "k-all": None})
    srv = ApiServer(pipeline, "127.0.0.1", 0, settings)
    srv.serve_in_thread()
    try:
        with httpx.Client(base_url=srv.url, timeout=30) as c:
            body = {"priority": 0, "output_tokens": 2}
            r = c.post("/v1/requests", json=body)
            assert r.status_code == 401 and r.json()["field"] == "authorization"
            assert r.headers["www-authenticate"] == "Bearer"
            r = c.post("/v1/requests", json=body, headers={"Authorization": "Bearer wrong"})
            assert r.status_code == 401
            ok = {"Authorization": "Bearer k-text"}
            assert c.post("/v1/requests", json=body, headers=ok).status_code == 200
            r = c.post("/v1/requests", json={"priority": 20, "images": 1}, headers=ok)
            assert r.status_code == 403 and r.json()["field"] == "priority"
            r = c.post("/v1/requests", json={"class": "speech"}, headers=ok)
            assert r.status_code == 403 and r.json()["field"] == "class"
            every = {"Authorization": "Bearer k-all"}
            assert c.post("/v1/requests", json={"class": "image"}, headers=every).status_code == 200
            assert c.get("/health").status_code == 200  # probes need no key
            assert c.get("/metrics").status_code == 200
    finally:
        srv.shutdown()
        srv.server_close()


def _events(lines: list[str]) -> list[tuple[str, dict[str, Any]]]:
    out, kind = [], None
    for line in lines:
        if line.startswith("event: "):
            kind = line.removeprefix("event: ")
        elif line.startswith("data: "):
            out.append((kind, json.loads(line.removeprefix("data: "))))
    return out


def test_sse_streams_text_tokens_and_speech_chunks(server: ApiServer) -> None:
    with httpx.Client(base_url=server.url, timeout=60) as c:
        body = {"priority": 0, "output_tokens": 5, "stream": True}
        with c.stream("POST", "/v1/requests", json=body) as r:
            assert r.headers["content-type"].startswith("text/event-stream")
            events = _events(list(r.iter_lines()))
        kinds = [k for k, _ in events]
        assert kinds[0] == "admitted" and kinds[-1] == "done"
        assert kinds.count("token") == 5 and "first" in kinds
        body = {"priority": 10, "output_tokens": 2, "downstream_tokens": 40, "stream": True}
        with c.stream("POST", "/v1/requests", json=body) as r:
            events = _events(list(r.iter_lines()))
        kinds = [k for k, _ in events]
        assert kinds.index("handoff") < kinds.index("first") < kinds.index("chunk")
        chunks = [d["chunk"] for k, d in events if k == "chunk"]
        assert chunks == list(range(2, len(chunks) + 2)) and kinds[-1] == "done"
        assert events[-1][1]["info"]["samples"] > 0


def _wait(pred, timeout: float = 10.0) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while not pred():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


def test_disconnect_and_timeout_cancel_the_request_in_every_stage(
    server: ApiServer, pipeline: Pipeline
) -> None:
    seen: list[Event] = []
    pipeline.on_event = seen.append
    try:
        body = {"priority": 10, "output_tokens": 2, "downstream_tokens": 256, "stream": True}
        with (  # the control: the same request run to the end
            httpx.Client(base_url=server.url, timeout=60) as c,
            c.stream("POST", "/v1/requests", json=body) as r,
        ):
            events = _events(list(r.iter_lines()))
        full_s = events[-1][1]["done_s"] - events[-1][1]["first_response_s"]
        body = {"id": "gone-1", "priority": 10, "output_tokens": 2, "downstream_tokens": 256}
        with (
            httpx.Client(base_url=server.url, timeout=60) as c,
            c.stream("POST", "/v1/requests", json={**body, "stream": True}) as r,
        ):
            for line in r.iter_lines():
                if line == "event: first":  # deep inside the speech stage now
                    break
        t_gone = time.monotonic()
        _wait(lambda: pipeline.in_flight() == 0)
        rec = next(r for r in pipeline.finished if r.rid == "gone-1")
        assert rec.failure == CANCELLED and rec.error == "client disconnected"
        assert pipeline._record is not None
        _wait(lambda: pipeline._record.read_downstream(0).active == 0)  # the speech stage
        _wait(lambda: pipeline._record.read_downstream(2).active == 0)  # code2wav
        dropped_s = time.monotonic() - t_gone
        assert dropped_s < full_s / 2, (dropped_s, full_s)  # dropped, not run to the end
        time.sleep(full_s)
        assert not [e for e in seen if e.rid == "gone-1" and e.kind == DONE]

        body = {"id": "late-1", "priority": 20, "images": 1, "downstream_tokens": 100}
        r = httpx.post(server.url + "/v1/requests", json={**body, "timeout_s": 0.001}, timeout=30)
        assert r.status_code == 504 and r.json()["field"] == "timeout_s"
        _wait(lambda: pipeline.in_flight() == 0)
        rec = next(r for r in pipeline.finished if r.rid == "late-1")
        assert rec.failure == TIMED_OUT
        time.sleep(0.5)
        assert not [e for e in seen if e.rid == "late-1" and e.kind == DONE]
    finally:
        pipeline.on_event = None
    assert (
        httpx.post(
            server.url + "/v1/requests", json={"priority": 20, "images": 1}, timeout=30
        ).status_code
        == 200
    )  # the stages keep serving


@pytest.mark.parametrize("priority", [0, 10, 20])
def test_an_id_reused_after_its_cancel_is_served(server: ApiServer, priority: int) -> None:
    rid = f"reuse-{priority}"
    body = {"id": rid, "priority": priority, "images": int(priority == 20), "output_tokens": 2}
    with httpx.Client(base_url=server.url, timeout=30) as c:
        for _ in range(3):
            r = c.post("/v1/requests", json={**body, "timeout_s": 0.0005})
            assert r.status_code in (200, 504)  # usually cancelled before its first response
            # The same id again, right away; streamed to its end so the next round may reuse it.
            with c.stream("POST", "/v1/requests", json={**body, "stream": True}) as r:
                events = _events(list(r.iter_lines()))
            assert events[-1][0] == "done", events[-1]
            assert events[-1][1]["id"] == rid


def test_shutdown_refuses_new_work_at_once(server: ApiServer, pipeline: Pipeline) -> None:
    # Last test of the module: it stops the pipeline.
    with httpx.Client(base_url=server.url, timeout=30) as c:
        pipeline.refuse_new()
        t0 = time.monotonic()
        r = c.post("/v1/requests", json={"priority": 0})
        assert r.status_code == 503 and r.json()["field"] == "server"
        assert time.monotonic() - t0 < 1.0
        assert c.get("/ready").status_code == 503
    t0 = time.monotonic()
    pipeline.stop()
    assert time.monotonic() - t0 < 10
