"""uvicorn's h11 connection protocol with the guards the reference server and the sidecar need.

* A deadline for each request's headers. uvicorn re-arms no timer while headers trickle in
  (every byte cancels its keep-alive timer), so a client sending one byte a second held a
  connection for ever. Here the connection closes when no complete request head arrived
  `header_timeout_s` after it opened, or after the previous response.
* A staged close (RFC 9112 §9.6). A response may leave request bytes unread: an oversize body
  is refused without reading it. Closing a socket whose input is not drained makes the kernel
  answer with a reset, and a reset can discard the response before the client has read it.
  So a close while the request's body is still arriving first ends the write side (FIN after
  the response), then discards whatever still arrives, and closes for good when the client
  closes or `linger_s` has passed. Other closes (idle keep-alive, shutdown) are immediate.
* Framing as RFC 9112 asks: a request with both Transfer-Encoding and Content-Length is
  refused (400) and the connection closed (§6.3: nothing after it can be trusted); more than
  `max_headers` header fields or `max_header_bytes` of them: 431, closed.
* Probes no client can starve: `probe_paths` (GET /health, /ready) are served whatever the
  connection cap (uvicorn's `limit_concurrency`) says; a client (peer address) holding more
  than `max_per_client` connections has its next ones closed at once, so one client cannot
  take the whole cap.
* TCP_NODELAY on every accepted connection (uvicorn's own sockets have it; a socket bound by
  hand without IPPROTO_TCP does not, and a kept-alive response then waits for the client's
  delayed ACK).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import socket
from collections import Counter
from typing import Any, ClassVar

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

log = logging.getLogger(__name__)

MAX_HEADERS = 100
MAX_HEADER_BYTES = 16 * 1024
PROBE_PATHS = frozenset({"/health", "/ready"})
HEAD_LINE_BYTES = 8 * 1024  # the request line's allowance on top of the header bytes


class _Refusal(h11.RemoteProtocolError):
    """A request head this server refuses (status, message)."""


class _GuardedConnection(h11.Connection):
    """h11's server connection that lets the protocol judge each request head."""

    def __init__(self, protocol: GuardedH11Protocol, max_incomplete: int) -> None:
        super().__init__(h11.SERVER, max_incomplete)
        self._protocol = protocol

    def next_event(self) -> Any:
        try:
            event = super().next_event()
        except h11.RemoteProtocolError as exc:
            self._protocol.refusal = (exc.error_status_hint, str(exc))
            raise
        if isinstance(event, h11.Request):
            self._protocol.on_request_head(event)
        return event


def set_nodelay(transport: asyncio.BaseTransport) -> None:
    """TCP_NODELAY on the connection's socket (a response leaves at once, not after an ACK)."""
    sock = transport.get_extra_info("socket")
    if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


def tcp_socket(host: str, port: int) -> socket.socket:
    """A bound listening socket built with IPPROTO_TCP: asyncio then sets TCP_NODELAY on
    every connection it accepts (as on uvicorn's own sockets)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError:
        sock.close()
        raise
    sock.set_inheritable(False)
    return sock


class _StagedClose:
    """The connection's transport as uvicorn sees it: every call passes through except
    `close()`, which starts the staged close. Once closing, `is_closing()` is true and
    writes are dropped (nothing may follow the write side's end)."""

    def __init__(self, transport: asyncio.Transport, protocol: GuardedH11Protocol) -> None:
        self._transport = transport
        self._protocol = protocol
        self.lingering = False

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)

    def is_closing(self) -> bool:
        return self.lingering or self._transport.is_closing()

    def write(self, data: bytes) -> None:
        if not self.lingering:
            self._transport.write(data)

    def close(self) -> None:
        t = self._transport
        if self.lingering or t.is_closing():
            return
        if not (self._protocol.body_unread() and t.can_write_eof()):
            t.close()  # nothing more is coming: an ordinary close resets nothing
            return
        self.lingering = True
        t.write_eof()  # FIN once the response is flushed
        t.resume_reading()  # drain: flow control may have paused reads mid-body
        self._protocol.linger_until_closed()


class GuardedH11Protocol(H11Protocol):
    """uvicorn's h11 protocol plus a deadline for request heads, a staged close, strict
    framing, header bounds, probes outside the connection cap and a per-client cap.
    `guarded_protocol` makes a subclass per server (its own settings and client table)."""

    header_timeout_s = 10.0
    linger_s = 2.0  # a close mid-body discards the rest of the body at most this long
    max_headers = MAX_HEADERS
    max_header_bytes = MAX_HEADER_BYTES
    max_per_client: int | None = None  # connections one peer address may hold
    probe_paths: frozenset[str] = PROBE_PATHS
    clients: ClassVar[Counter[str]] = Counter()  # open connections per peer (per subclass)
    _header_timer: asyncio.TimerHandle | None = None
    _linger_timer: asyncio.TimerHandle | None = None
    _peer: str | None = None
    _head_bytes = 0  # bytes of the request head received so far (while h11 waits for one)
    _head_tail = b""  # its last 3 bytes
    _refused = False
    refusal: tuple[int, str] | None = None

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.conn = _GuardedConnection(self, self.config.h11_max_incomplete_event_size)
        self._cap = self.limit_concurrency  # uvicorn's; lifted per request for probes

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        set_nodelay(transport)
        self._raw_transport = transport
        self._staged = _StagedClose(transport, self)
        super().connection_made(self._staged)  # type: ignore[arg-type]
        peer = transport.get_extra_info("peername")
        host = str(peer[0]) if isinstance(peer, tuple) and peer else None
        if host is not None and self.max_per_client is not None:
            if self.clients[host] >= self.max_per_client:
                log.debug("closing a connection from %s: over its %d", host, self.max_per_client)
                transport.close()
                return
            self.clients[host] += 1
            self._peer = host
        self._arm_header_timer()

    # -- request heads ----------------------------------------------------------------------------
    def on_request_head(self, event: h11.Request) -> None:
        """Refuse bad framing and header floods; lift the cap for probes (before uvicorn
        compares its connection count with `limit_concurrency`)."""
        names = [name for name, _ in event.headers]
        if b"transfer-encoding" in names and b"content-length" in names:
            self._refuse(
                400,
                "request: both Transfer-Encoding and Content-Length (RFC 9112 6.3); send one",
            )
        size = sum(len(n) + len(v) + 4 for n, v in event.headers)
        if len(names) > self.max_headers or size > self.max_header_bytes:
            self._refuse(
                431,
                f"headers: at most {self.max_headers} fields and {self.max_header_bytes} "
                f"bytes (got {len(names)}, {size} bytes)",
            )
        self._head_bytes, self._head_tail = 0, b""
        path = event.target.partition(b"?")[0]
        probe = event.method in (b"GET", b"HEAD") and path.decode("ascii", "replace") in (
            self.probe_paths
        )
        self.limit_concurrency = None if probe else self._cap

    def _refuse(self, status: int, message: str) -> None:
        self.refusal = (status, message)
        raise _Refusal(message, error_status_hint=status)

    # -- staged close -------------------------------------------------------------------------
    # Ends when the client closes its side (uvicorn's eof_received returns None, so asyncio
    # closes the transport) or when the linger timer fires.
    def body_unread(self) -> bool:
        """The client is still sending the current request's body (a response came first)."""
        return self.conn.their_state is h11.SEND_BODY

    def linger_until_closed(self) -> None:
        self._cancel_header_timer()
        self._linger_timer = self.loop.call_later(self.linger_s, self._raw_transport.close)

    def data_received(self, data: bytes) -> None:
        if self._staged.lingering or self._refused:
            return  # input after the response is discarded, never parsed
        if self.conn.their_state is h11.IDLE and self._head_too_large(data):
            return
        super().data_received(data)

    def _head_too_large(self, data: bytes) -> bool:
        """Refuse (431, close) a request head longer than the bound before h11 parses it: a
        complete 100 KB head of 10,000 fields would otherwise be parsed whole first."""
        tail = self._head_tail  # a terminator may straddle two reads
        end = (tail + data).find(b"\r\n\r\n")
        self._head_bytes += len(data) if end < 0 else max(0, end - len(tail))
        if self._head_bytes <= self.max_header_bytes + HEAD_LINE_BYTES:
            if end >= 0:  # complete: h11 judges it (and its field count)
                self._head_bytes, self._head_tail = 0, b""
            else:
                self._head_tail = (tail + data)[-3:]
            return False
        self._refused = True
        message = f"headers: the request head is larger than {self.max_header_bytes} bytes"
        body = json.dumps({"error": message, "field": "headers"}).encode()
        self.transport.write(
            b"HTTP/1.1 431 Request Header Fields Too Large\r\ncontent-type: application/json\r\n"
            b"content-length: %d\r\nconnection: close\r\n\r\n%s" % (len(body), body)
        )
        self._raw_transport.close()  # the head is unread: nothing of it is parsed
        return True

    # -- header deadline ------------------------------------------------------------------------
    def _arm_header_timer(self) -> None:
        self._cancel_header_timer()
        self._header_timer = self.loop.call_later(self.header_timeout_s, self._header_expired)

    def _cancel_header_timer(self) -> None:
        if self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None

    def _header_expired(self) -> None:
        self._header_timer = None
        in_request = self.cycle is not None and not self.cycle.response_complete
        if not in_request and not self.transport.is_closing():
            self.transport.close()

    def handle_events(self) -> None:
        before = self.cycle
        super().handle_events()
        if self.cycle is not None and self.cycle is not before:
            self._cancel_header_timer()  # a request head arrived

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if not self.transport.is_closing():
            self._arm_header_timer()

    def connection_lost(self, exc: Exception | None) -> None:
        if self._peer is not None:
            self.clients[self._peer] -= 1
            if self.clients[self._peer] <= 0:
                del self.clients[self._peer]
            self._peer = None
        self._cancel_header_timer()
        if self._linger_timer is not None:
            self._linger_timer.cancel()
            self._linger_timer = None
        super().connection_lost(exc)

    def send_400_response(self, msg: str) -> None:
        """h11 or `on_request_head` refused the request (bad or repeated Content-Length, CL
        with TE, a negative length, a malformed line, too many or too large headers): the
        API's JSON error shape, then close the connection."""
        status, detail = self.refusal or (400, "")
        self.refusal = None
        if status == 431:
            if not detail.startswith("headers:"):  # h11's own bound on an incomplete head
                detail = f"headers: the request head is larger than {self.max_header_bytes} bytes"
            error = {"error": detail, "field": "headers"}
        elif detail.startswith("request:"):
            error = {"error": detail, "field": "request"}
        else:
            status = 400
            error = {
                "error": "request: not a valid HTTP request (request line, headers or framing "
                "such as a bad or repeated Content-Length); fix the client",
                "field": "request",
            }
        body = json.dumps(error).encode()
        headers = [
            (b"content-type", b"application/json"),
            (b"content-length", str(len(body)).encode()),
            (b"connection", b"close"),
        ]
        reason = b"Request Header Fields Too Large" if status == 431 else b"Bad Request"
        try:
            for event in (
                h11.Response(status_code=status, headers=headers, reason=reason),
                h11.Data(data=body),
                h11.EndOfMessage(),
            ):
                self.transport.write(self.conn.send(event))
        except h11.LocalProtocolError:  # a response had already started: just close
            pass
        self.transport.close()


def guarded_protocol(name: str, **settings: Any) -> type[GuardedH11Protocol]:
    """A GuardedH11Protocol subclass with these class settings and its own client table."""
    unknown = set(settings) - set(vars(GuardedH11Protocol)) - {"max_per_client"}
    if unknown:
        raise TypeError(f"unknown protocol settings {sorted(unknown)}")
    return type(name, (GuardedH11Protocol,), {**settings, "clients": Counter()})
