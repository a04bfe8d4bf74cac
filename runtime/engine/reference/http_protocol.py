"""uvicorn's h11 connection protocol with the two guards the reference server needs.

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
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol


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
    """uvicorn's h11 protocol plus a deadline for request heads and a staged close."""

    header_timeout_s = 10.0
    linger_s = 2.0  # a close mid-body discards the rest of the body at most this long
    _header_timer: asyncio.TimerHandle | None = None
    _linger_timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        self._raw_transport = transport
        self._staged = _StagedClose(transport, self)
        super().connection_made(self._staged)  # type: ignore[arg-type]
        self._arm_header_timer()

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
        if self._staged.lingering:
            return  # input after the response is discarded, never parsed
        super().data_received(data)

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
        self._cancel_header_timer()
        if self._linger_timer is not None:
            self._linger_timer.cancel()
            self._linger_timer = None
        super().connection_lost(exc)

    def send_400_response(self, msg: str) -> None:
        """h11 refused the request head (bad or repeated Content-Length, a negative length,
        a malformed line): the API's JSON error shape, then close the connection."""
        body = json.dumps(
            {
                "error": "request: not a valid HTTP request (request line, headers or framing "
                "such as a bad or repeated Content-Length); fix the client",
                "field": "request",
            }
        ).encode()
        headers = [
            (b"content-type", b"application/json"),
            (b"content-length", str(len(body)).encode()),
            (b"connection", b"close"),
        ]
        try:
            for event in (
                h11.Response(status_code=400, headers=headers, reason=b"Bad Request"),
                h11.Data(data=body),
                h11.EndOfMessage(),
            ):
                self.transport.write(self.conn.send(event))
        except h11.LocalProtocolError:  # a response had already started: just close
            pass
        self.transport.close()
