"""The reference server's HTTP guards over real sockets: TCP_NODELAY, framing (CL + TE),
header bounds, probes outside the connection cap, the per-client cap, mid-body closes, the
per-class downstream bound, prompts larger than a KV slot, 503s counted once, /healthz details
and blank API keys.

One CPU pipeline (tiny preset) serves the module; servers with other settings share it.
Clients use distinct loopback source addresses (127.0.0.x) to be distinct clients.
"""

from __future__ import annotations

import contextlib
import json
import logging
import socket
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

pytest.importorskip("torch")

from horizonserve.runtime.engine.reference import PipelineOptions
from horizonserve.runtime.engine.reference.pipeline import DOWN, RUNNING, Pipeline
from horizonserve.runtime.engine.reference.server import ApiServer, ServerSettings

FAST = ServerSettings(header_timeout_s=2.0, body_timeout_s=2.0, keep_alive_s=2.0)


@pytest.fixture(scope="module")
def pipeline() -> Iterator[Pipeline]:
    with Pipeline(PipelineOptions(preset="tiny", device="cpu", warmup=False)) as p:
        yield p


@contextlib.contextmanager
def serving(pipeline: Pipeline, settings: ServerSettings = FAST) -> Iterator[ApiServer]:
    srv = ApiServer(pipeline, "127.0.0.1", 0, settings)
    srv.serve_in_thread()
    try:
        yield srv
    finally:
        srv.shutdown()
        srv.server_close()


@pytest.fixture(scope="module")
def server(pipeline: Pipeline) -> Iterator[ApiServer]:
    with serving(pipeline) as srv:
        yield srv


def _addr(server: ApiServer) -> tuple[str, int]:
    host, port = server.url.removeprefix("http://").split(":")
    return host, int(port)


def _connect(server: ApiServer, source: str = "127.0.0.1") -> socket.socket:
    return socket.create_connection(_addr(server), timeout=5, source_address=(source, 0))


def _exchange(sock: socket.socket, data: bytes, wait_s: float = 5.0) -> bytes:
    """Send `data`; everything received until the server closed (or `wait_s` passed)."""
    sock.settimeout(wait_s)
    sock.sendall(data)
    out = b""
    with contextlib.suppress(TimeoutError, ConnectionResetError):
        while chunk := sock.recv(65536):
            out += chunk
    return out


def _rejections(pipeline: Pipeline, reason: str, cls: str = "") -> float:
    value = pipeline.metrics.registry.get_sample_value(
        "horizonserve:request_rejections_total",
        {"model_name": pipeline.metrics.model_name, "request_class": cls, "reason": reason},
    )
    return value or 0.0


def _requests(pipeline: Pipeline, cls: str) -> float:
    value = pipeline.metrics.registry.get_sample_value(
        "horizonserve:requests_total",
        {"model_name": pipeline.metrics.model_name, "request_class": cls},
    )
    return value or 0.0


def _body(**fields: Any) -> bytes:
    return json.dumps({"priority": 0, "output_tokens": 2, **fields}).encode()


# -- sockets --------------------------------------------------------------------------------------


def test_listening_socket_is_tcp_and_connections_have_nodelay(server: ApiServer) -> None:
    assert server._sock.proto == socket.IPPROTO_TCP  # asyncio sets TCP_NODELAY on its accepts
    with _connect(server) as s:
        s.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
        assert s.recv(4096).startswith(b"HTTP/1.1 200")
        conns = list(server._server.server_state.connections)
        flags = {
            c.transport.get_extra_info("socket").getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY)
            for c in conns
        }
    assert conns and flags == {1}


# -- framing --------------------------------------------------------------------------------------


def test_content_length_with_transfer_encoding_is_refused_and_closed(
    server: ApiServer, pipeline: Pipeline
) -> None:
    body = _body(id="cl-te-visible")
    hidden = b"POST /v1/requests HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n%s" % (
        len(_body(id="cl-te-hidden")),
        _body(id="cl-te-hidden"),
    )
    chunked = b"%x\r\n%s\r\n0\r\n\r\n" % (len(body), body)
    head = (
        b"POST /v1/requests HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n"
        b"Transfer-Encoding: chunked\r\n\r\n" % len(chunked)
    )
    before = _requests(pipeline, "text")
    with _connect(server) as s:
        reply = _exchange(s, head + chunked + hidden)
    assert reply.startswith(b"HTTP/1.1 400"), reply[:200]
    assert reply.count(b"HTTP/1.1") == 1  # nothing after the refusal was parsed
    assert b"Transfer-Encoding and Content-Length" in reply
    assert _requests(pipeline, "text") == before  # neither request ran


@pytest.mark.parametrize(
    "headers",
    [
        b"".join(b"X-H%d: v\r\n" % i for i in range(101)),  # 101 fields, 1.2 KB
        b"X-Big: " + b"a" * 17_000 + b"\r\n",  # one field over 16 KiB
        b"".join(b"X-H%d: %s\r\n" % (i, b"b" * 200) for i in range(90)),  # 90 fields, 19 KB
    ],
    ids=["count", "one-large", "total-size"],
)
def test_header_floods_get_431_and_the_connection_closes(server: ApiServer, headers: bytes) -> None:
    body = _body()
    request = (
        b"POST /v1/requests HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n" % len(body)
        + headers
        + b"\r\n"
        + body
    )
    with _connect(server) as s:
        reply = _exchange(s, request)
    assert reply.startswith(b"HTTP/1.1 431"), reply[:200]
    assert json.loads(reply.split(b"\r\n\r\n", 1)[1])["field"] == "headers"


def test_a_10000_field_head_is_refused_before_it_is_parsed(server: ApiServer) -> None:
    fields = b"".join(b"X-F%d: v\r\n" % i for i in range(10_000))  # 116 KB, one write
    body = _body()
    request = b"POST /v1/requests HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n" % len(body)
    with _connect(server) as s:
        reply = _exchange(s, request + fields + b"\r\n" + body)
    assert reply.startswith(b"HTTP/1.1 431"), reply[:200]


def test_a_head_split_at_its_end_and_a_large_body_are_served(server: ApiServer) -> None:
    body = _body()[:-1] + b" " * 60_000 + b"}"  # valid JSON, 60 KB
    head = b"POST /v1/requests HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
    head += b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(body)
    with _connect(server) as s:
        s.sendall(head[:-2])  # the terminator straddles two writes
        time.sleep(0.2)
        reply = _exchange(s, head[-2:] + body)
    assert reply.startswith(b"HTTP/1.1 200"), reply[:200]


def test_a_hundred_headers_are_still_served(server: ApiServer) -> None:
    headers = {f"X-H{i}": "v" for i in range(95)}  # + httpx's Host, Accept, ... = 100
    with httpx.Client(base_url=server.url, timeout=30) as c:
        assert c.get("/health", headers=headers).status_code == 200


# -- connection caps ------------------------------------------------------------------------------


def test_probes_are_served_beyond_the_cap_and_one_client_cannot_take_it(
    pipeline: Pipeline,
) -> None:
    settings = ServerSettings(max_connections=4, max_connections_per_client=2, header_timeout_s=30)
    with serving(pipeline, settings) as srv:
        idle = [_connect(srv, "127.0.0.2") for _ in range(2)]
        extra = _connect(srv, "127.0.0.2")  # over its client's cap: closed at once
        extra.settimeout(5)
        assert extra.recv(1) == b""
        idle += [_connect(srv, "127.0.0.3") for _ in range(2)]  # now the server's cap is full
        time.sleep(0.2)
        try:
            with httpx.Client(base_url=srv.url, timeout=30) as c:
                assert c.get("/health").status_code == 200
                assert c.get("/ready").status_code == 200
                assert c.post("/v1/requests", content=_body()).status_code == 503
            for s in idle[2:]:
                s.close()
            time.sleep(0.3)
            with httpx.Client(base_url=srv.url, timeout=30) as c:
                assert c.post("/v1/requests", content=_body()).status_code == 200
        finally:
            for s in [*idle, extra]:
                s.close()


# -- requests -------------------------------------------------------------------------------------


def test_a_client_closing_mid_body_is_counted_without_a_traceback(
    server: ApiServer, pipeline: Pipeline, caplog: pytest.LogCaptureFixture
) -> None:
    before = _rejections(pipeline, "client_closed")
    with caplog.at_level(logging.INFO), _connect(server) as s:
        s.sendall(b'POST /v1/requests HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{"pri')
        time.sleep(0.2)
    deadline = time.monotonic() + 5
    while _rejections(pipeline, "client_closed") == before and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _rejections(pipeline, "client_closed") == before + 1
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING], caplog.text


def test_each_long_path_has_its_own_downstream_bound(server: ApiServer) -> None:
    # tiny: 4 denoising steps, bound 100; speech codes up to the talker's slot (256)
    with httpx.Client(base_url=server.url, timeout=60) as c:
        r = c.post("/v1/requests", json={"class": "image", "downstream_tokens": 200})
        assert r.status_code == 400 and r.json()["field"] == "downstream_tokens"
        assert "denoising steps" in r.json()["error"]
        r = c.post(
            "/v1/requests", json={"class": "speech", "downstream_tokens": 200, "output_tokens": 2}
        )
        assert r.status_code == 200


def test_a_prompt_larger_than_a_kv_slot_is_refused_not_clamped(server: ApiServer) -> None:
    # tiny: 256 tokens a slot; 200 text + 10 images x 8 tokens + 16 output = 296
    with httpx.Client(base_url=server.url, timeout=60) as c:
        body = {"priority": 0, "input_tokens": 200, "images": 10, "output_tokens": 16}
        r = c.post("/v1/requests", json=body)
        assert r.status_code == 400 and r.json()["field"] == "input_tokens"
        assert "KV slot" in r.json()["error"]
        body["images"] = 4  # 200 + 32 + 16 = 248: fits
        assert c.post("/v1/requests", json=body).status_code == 200


def test_a_503_for_a_down_stage_is_counted_once(server: ApiServer, pipeline: Pipeline) -> None:
    slot = pipeline._slots["image"]
    before = _rejections(pipeline, "unavailable", "image")
    slot.state, slot.reason = DOWN, "test"
    try:
        with httpx.Client(base_url=server.url, timeout=30) as c:
            r = c.post("/v1/requests", json={"class": "image"})
    finally:
        slot.state, slot.reason = RUNNING, None
    assert r.status_code == 503 and "retry-after" in r.headers
    assert _rejections(pipeline, "unavailable", "image") == before + 1


# -- access ---------------------------------------------------------------------------------------


def test_healthz_details_only_for_authenticated_callers(pipeline: Pipeline) -> None:
    settings = ServerSettings(api_keys={"k": None})
    with serving(pipeline, settings) as srv, httpx.Client(base_url=srv.url, timeout=30) as c:
        anonymous = c.get("/healthz")
        assert anonymous.json() == {"ok": True}
        detailed = c.get("/healthz", headers={"Authorization": "Bearer k"}).json()
        assert detailed["stages"]["shared"]["pid"] > 0


def test_healthz_without_keys_gives_details_to_loopback_only(server: ApiServer) -> None:
    with _connect(server, "127.0.0.1") as s:
        local = _exchange(s, b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    assert b'"stages"' in local
    host, _ = _addr(server)
    if host != "127.0.0.1":
        pytest.skip("the server is not on IPv4 loopback")
    # 127.0.0.2 is loopback too; the rule is by address, so it stands in for a remote caller.
    with _connect(server, "127.0.0.2") as s:
        remote = _exchange(s, b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    assert remote.startswith(b"HTTP/1.1 200") and b'"stages"' not in remote


def test_a_blank_key_matches_no_bearer_token(pipeline: Pipeline) -> None:
    # What `--api-key ' '` used to become: an empty key (serve now refuses it outright).
    body = _body()
    with serving(pipeline, ServerSettings(api_keys={"": None})) as srv:
        for token in (b"Bearer \xa0", b"Bearer  ", b"Bearer", b"Bearer \t"):
            head = b"POST /v1/requests HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
            head += b"Authorization: %s\r\nContent-Length: %d\r\n\r\n" % (token, len(body))
            with _connect(srv) as s:
                reply = _exchange(s, head + body)
            assert reply.startswith(b"HTTP/1.1 401"), (token, reply[:100])
