"""HTTP API of `horizonserve serve`: FastAPI/Starlette on uvicorn (vLLM's own stack).

POST /v1/requests   JSON body (api_models.GenerateRequest) → 200 at the first response with
                    the request's record; "stream": true → Server-Sent Events until it ends
GET  /health        liveness: 200 while the pipeline can recover by itself or some class is
                    served ("degraded"), else 503
GET  /ready         readiness: 200 while some class can be served (body: degraded classes)
GET  /healthz       everything: stages, pids, heartbeats, restarts, fault reasons, degraded
                    classes — to a caller with a valid API key (without keys: a loopback
                    caller); anyone else gets {"ok": ...} only
GET  /metrics       Prometheus text (runtime.metrics names, `horizonserve:` prefix)

Errors are JSON {"error": "<field>: <what to do>", "field": "<field>"}: 400 bad field, 401
missing or wrong API key, 403 class not allowed for the key, 404/405 route, 408 body too slow,
413 body too large, 503 (+ Retry-After) a stage the class needs is restarting or the server
stops, 504 no first response within timeout_s. A client that disconnects, or whose timeout
passes, has its request cancelled in every stage.

Connections (`ServerSettings`): listen backlog, a cap on open connections (503 beyond) that
/health and /ready ignore, a cap per client address (its further connections are closed at
once), a deadline for a request's headers (`GuardedH11Protocol`) and one for its body,
keep-alive timeout, TCP_NODELAY, header count and size bounds (431), CL + TE refused. An
oversize body is refused with `Connection: close` and never read, so a request hidden in it is
never parsed; the close is staged (`http_protocol`) so the refusal reaches the client before
the connection goes.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import logging
import math
import threading
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect

from horizonserve.runtime.engine.reference.api_models import (
    MAX_BODY_BYTES,
    ApiError,
    ApiLimits,
    GenerateRequest,
    parse_body,
    validate_request,
)
from horizonserve.runtime.engine.reference.http_protocol import (
    MAX_HEADER_BYTES,
    MAX_HEADERS,
    guarded_protocol,
    tcp_socket,
)
from horizonserve.runtime.engine.reference.pipeline import (
    CANCELLED,
    REJECTED,
    TIMED_OUT,
    UNAVAILABLE,
    Pipeline,
    PipelineError,
    RequestHandle,
    StageUnavailableError,
    downstream_of,
)
from horizonserve.runtime.engine.reference.presets import get_preset
from horizonserve.runtime.engine.reference.protocol import (
    CHUNK,
    DONE,
    ERROR,
    FIRST,
    HANDOFF,
    TOKENS,
    RequestSpec,
)

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ServerSettings:
    """HTTP-side limits and access policy of the reference server."""

    backlog: int = 2048  # listen queue (Python's default of 5 reset connections under load)
    max_connections: int = 1024  # open connections; beyond, 503 (not /health, /ready)
    max_connections_per_client: int | None = None  # per peer address; None: half the cap
    max_headers: int = MAX_HEADERS  # header fields of a request; beyond, 431
    max_header_bytes: int = MAX_HEADER_BYTES  # their bytes; beyond, 431
    header_timeout_s: float = 10.0  # a request's headers must be complete by then
    body_timeout_s: float = 10.0  # ... and its body
    keep_alive_s: float = 5.0  # idle keep-alive connections are closed after this
    graceful_s: float = 5.0  # shutdown: wait this long for responses in progress
    linger_s: float = 2.0  # a close mid-body drains the rest this long (so no reset)
    max_body_bytes: int = MAX_BODY_BYTES
    # API keys (`Authorization: Bearer <key>`) -> classes the key may request (None: all).
    # Empty: no authentication; `anonymous_classes` then bounds what anyone may request.
    api_keys: dict[str, frozenset[str] | None] = field(default_factory=dict)
    anonymous_classes: frozenset[str] | None = None


def _error(err: ApiError) -> JSONResponse:
    return JSONResponse(err.body(), status_code=err.status, headers=err.headers)


def _sse(event: str, data: dict[str, Any]) -> bytes:
    return f"event: {event}\ndata: {json.dumps(data, allow_nan=False)}\n\n".encode()


def _finite(payload: dict[str, Any]) -> dict[str, Any]:
    """NaN / inf (a stage's unknown value) as null: JSON has no such numbers."""
    return {
        k: (None if isinstance(v, float) and not math.isfinite(v) else v)
        for k, v in payload.items()
    }


class _Api:
    """The endpoints' shared state: the pipeline, limits and access policy."""

    def __init__(self, pipeline: Pipeline, settings: ServerSettings) -> None:
        self.pipeline = pipeline
        self.settings = settings
        self.limits = ApiLimits.for_preset(get_preset(pipeline.options.preset))

    def authenticated(self, request: Request) -> bool:
        """A caller with a valid API key; without keys configured, a loopback caller."""
        if not self.settings.api_keys:
            host = request.client.host if request.client else ""
            return host in ("127.0.0.1", "::1", "localhost")
        try:
            self.allowed_classes(request)
        except ApiError:
            return False
        return True

    # -- access -----------------------------------------------------------------------------
    def allowed_classes(self, request: Request) -> frozenset[str] | None:
        """Classes this caller may request (None: all); ApiError 401 without a valid key."""
        keys = self.settings.api_keys
        if not keys:
            return self.settings.anonymous_classes
        header = request.headers.get("authorization", "")
        scheme, _, token = header.partition(" ")
        given = token.strip().encode()
        if scheme.lower() == "bearer" and given:
            for key, classes in keys.items():
                if hmac.compare_digest(given, key.encode()):
                    return classes
        raise ApiError(
            401,
            "authorization",
            "give 'Authorization: Bearer <API key>' with a key this server accepts",
            headers={"WWW-Authenticate": "Bearer"},
            reason="unauthorized",
        )

    def resolve_class(self, req: GenerateRequest, allowed: frozenset[str] | None) -> str:
        """The configured class the request names (explicit class first, then the code)."""
        config = self.pipeline.config
        if config is None:
            raise ApiError(503, "server", "not started", reason="stopping")
        slo = config.slo
        if req.class_ is not None:
            names = [c.name for c in slo.classes]
            if req.class_ not in names:
                raise ApiError(400, "class", f"unknown class {req.class_!r}; known: {names}")
            name, where = req.class_, "class"
        else:
            codes = {int(c.priority): c.name for c in slo.classes}
            if req.priority not in codes:
                raise ApiError(
                    400, "priority", f"unknown code {req.priority}; known: {sorted(codes)}"
                )
            name, where = codes[req.priority], "priority"  # type: ignore[index]
        if allowed is not None and name not in allowed:
            raise ApiError(
                403,
                where,
                f"class {name!r} is not allowed for this key; allowed: {sorted(allowed)}",
                reason="forbidden",
            )
        if req.downstream_tokens is not None:  # each long path has its own bound
            cls = next(c for c in slo.classes if c.name == name)
            top, what = self.limits.downstream_bound(downstream_of(cls))
            if req.downstream_tokens > top:
                raise ApiError(400, "downstream_tokens", f"at most {top} {what} for class {name!r}")
        return name

    async def read_body(self, request: Request) -> bytes:
        limit = self.settings.max_body_bytes
        too_large = ApiError(
            413,
            "body",
            f"larger than {limit} bytes",
            headers={"Connection": "close"},
            reason="too_large",
        )
        declared = request.headers.get("content-length")
        if declared is not None and declared.isdigit() and int(declared) > limit:
            raise too_large
        chunks: list[bytes] = []
        size = 0

        async def read() -> None:
            nonlocal size
            async for chunk in request.stream():
                size += len(chunk)
                if size > limit:
                    raise too_large
                chunks.append(chunk)

        try:
            await asyncio.wait_for(read(), self.settings.body_timeout_s)
        except ClientDisconnect:  # closed mid-body: counted, one debug line, no answer
            log.debug("client closed the connection mid-body")
            raise ApiError(
                499, "body", "the client closed the connection mid-body", reason="client_closed"
            ) from None
        except TimeoutError:
            raise ApiError(
                408,
                "body",
                f"not complete within {self.settings.body_timeout_s:g} s",
                headers={"Connection": "close"},
                reason="invalid",
            ) from None
        return b"".join(chunks)

    # -- requests ---------------------------------------------------------------------------
    async def post_request(self, request: Request) -> Response:
        arrival = time.monotonic()
        class_name: str | None = None
        try:
            allowed = self.allowed_classes(request)
            req = validate_request(parse_body(await self.read_body(request)), self.limits)
            class_name = self.resolve_class(req, allowed)
            return await self._run(request, req, class_name, arrival)
        except ApiError as err:
            if not err.counted:
                self.pipeline.metrics.rejected(class_name, err.reason)
            return _error(err)

    async def _run(
        self, request: Request, req: GenerateRequest, class_name: str, arrival: float
    ) -> Response:
        spec = RequestSpec(
            rid=req.id or uuid.uuid4().hex,
            class_name=class_name,
            priority=req.priority,
            input_tokens=req.input_tokens,
            audio_seconds=req.audio_seconds,
            images=req.images,
            video_seconds=req.video_seconds,
            output_tokens=req.output_tokens,
            downstream_tokens=req.downstream_tokens,
            stream=req.stream,
        )
        loop = asyncio.get_running_loop()
        events: asyncio.Queue[tuple[str, dict[str, Any]]] = asyncio.Queue()

        def listener(kind: str, data: dict[str, Any]) -> None:  # dispatcher thread
            loop.call_soon_threadsafe(events.put_nowait, (kind, data))

        pipeline = self.pipeline
        try:
            handle = pipeline.submit(spec, arrival, listener)
        except StageUnavailableError as exc:
            retry = str(math.ceil(exc.retry_after_s))
            raise ApiError(  # the pipeline counted it
                503,
                "class",
                str(exc),
                headers={"Retry-After": retry},
                reason="unavailable",
                counted=True,
            ) from None
        except PipelineError as exc:
            raise ApiError(
                503, "server", f"{exc}; try another replica", reason="stopping"
            ) from None
        except (ValueError, KeyError) as exc:
            message = exc.args[0] if exc.args else str(exc)
            field_name = "id" if "in flight" in str(message) or "id:" in str(message) else "class"
            raise ApiError(400, field_name, str(message)) from None
        if req.stream:
            return StreamingResponse(
                self._stream(handle, events, req.timeout_s),
                media_type="text/event-stream",
                headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
            )
        return await self._answer(request, handle, events, req.timeout_s)

    async def _answer(
        self,
        request: Request,
        handle: RequestHandle,
        events: asyncio.Queue[tuple[str, dict[str, Any]]],
        timeout_s: float,
    ) -> Response:
        """Wait for the first response (or the end), the client's disconnect or the timeout."""
        rec = handle.record

        async def first() -> None:
            while not handle.first.is_set():
                kind, _ = await events.get()
                if kind in (FIRST, DONE, ERROR):
                    return

        waiter = asyncio.ensure_future(first())
        gone = asyncio.ensure_future(_disconnected(request))
        try:
            done, _ = await asyncio.wait(
                {waiter, gone}, timeout=timeout_s, return_when=asyncio.FIRST_COMPLETED
            )
        finally:
            for task in (waiter, gone):
                task.cancel()
        if waiter not in done and not handle.first.is_set():
            if gone in done:
                self.pipeline.cancel(rec.rid, "client disconnected", CANCELLED)
                return Response(status_code=499)
            self.pipeline.cancel(rec.rid, f"no first response within {timeout_s:g} s", TIMED_OUT)
            return _error(
                ApiError(
                    504,
                    "timeout_s",
                    f"no first response within {timeout_s:g} s; raise timeout_s or retry",
                )
            )
        if rec.first is None and rec.error is not None:
            return _error(_failure(rec))
        return JSONResponse(_finite(rec.as_dict()))

    async def _stream(
        self,
        handle: RequestHandle,
        events: asyncio.Queue[tuple[str, dict[str, Any]]],
        timeout_s: float,
    ) -> AsyncIterator[bytes]:
        """SSE: admitted, token (text), first, handoff, chunk (speech), then done or error."""
        rec = handle.record
        ended = False
        try:
            yield _sse("admitted", {"id": rec.rid, "class": rec.class_name, "slo_s": rec.slo_s})
            deadline = rec.arrival + timeout_s
            tokens = 0
            while True:
                wait = None if rec.first is not None else max(0.0, deadline - time.monotonic())
                try:
                    kind, data = await asyncio.wait_for(events.get(), wait)
                except TimeoutError:
                    msg = f"no first response within {timeout_s:g} s"
                    self.pipeline.cancel(rec.rid, msg, TIMED_OUT)
                    ended = True
                    yield _sse("error", {"status": 504, "field": "timeout_s", "error": msg})
                    return
                if kind == TOKENS:
                    tokens += 1
                    yield _sse("token", {"index": tokens, "token": data.get("token")})
                elif kind == FIRST:
                    first = {"first_response_s": rec.first_response_s, "slo_met": rec.slo_met}
                    yield _sse("first", _finite(first))
                elif kind == HANDOFF:
                    yield _sse("handoff", _finite({"handoff_s": rec.as_dict()["handoff_s"]}))
                elif kind == CHUNK:
                    yield _sse("chunk", dict(data))
                elif kind in (DONE, ERROR):
                    ended = True
                    if rec.failure is None:
                        yield _sse("done", _finite(rec.as_dict()))
                    else:
                        err = _failure(rec)
                        yield _sse("error", {"status": err.status, **err.body()})
                    return
        finally:
            if not ended:  # the client went away (the response task was cancelled)
                self.pipeline.cancel(rec.rid, "client disconnected", CANCELLED)

    # -- health -----------------------------------------------------------------------------
    def health(self) -> Response:
        """Liveness: 200 while the pipeline can recover by itself, or while some class is
        served (a stage that keeps failing degrades its classes; restarting the pod would
        stop the others too)."""
        pipeline = self.pipeline
        if pipeline.live():
            return JSONResponse({"status": "ok"})
        if pipeline.ready():
            return JSONResponse({"status": "degraded", "degraded": pipeline.degraded()})
        return JSONResponse({"status": "failed"}, status_code=503)

    def ready(self) -> Response:
        pipeline = self.pipeline
        ready = pipeline.ready()
        body = {"ready": ready, "degraded": pipeline.degraded()}
        return JSONResponse(body, status_code=200 if ready else 503)

    def healthz(self, request: Request) -> Response:
        health = self.pipeline.health()
        status = 200 if health["ok"] else 503
        if not self.authenticated(request):  # pids and fault reasons only to the operator
            return JSONResponse({"ok": health["ok"]}, status_code=status)
        return JSONResponse(_jsonable(health), status_code=status)

    def metrics(self) -> Response:
        self.pipeline.refresh_metrics()
        return Response(
            generate_latest(self.pipeline.metrics.registry), 200, None, CONTENT_TYPE_LATEST
        )


def _failure(rec: Any) -> ApiError:
    """The HTTP error of a request that ended without a first response."""
    message = str(rec.error)
    if rec.failure == UNAVAILABLE:
        retry = str(math.ceil(rec.retry_after_s)) if rec.retry_after_s else "5"
        return ApiError(503, "class", message, headers={"Retry-After": retry})
    if rec.failure == REJECTED:
        return ApiError(400, "body", message)
    if rec.failure == TIMED_OUT:
        return ApiError(504, "timeout_s", message)
    return ApiError(500, "server", message)


def _jsonable(doc: Any) -> Any:
    if isinstance(doc, dict):
        return {str(k): _jsonable(v) for k, v in doc.items()}
    if isinstance(doc, list | tuple):
        return [_jsonable(v) for v in doc]
    if isinstance(doc, float) and not math.isfinite(doc):
        return None
    return doc


async def _disconnected(request: Request) -> None:
    """Returns when the client closed the connection (body already read)."""
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return


def create_app(pipeline: Pipeline, settings: ServerSettings | None = None) -> FastAPI:
    """The ASGI app of the reference server."""
    api = _Api(pipeline, settings or ServerSettings())
    app = FastAPI(
        title="HorizonServe reference engine",
        docs_url=None,
        redoc_url=None,
        openapi_url=None,
    )
    app.state.api = api

    @app.post("/v1/requests")
    async def post_requests(request: Request) -> Response:
        return await api.post_request(request)

    app.add_api_route("/health", api.health, methods=["GET"])
    app.add_api_route("/ready", api.ready, methods=["GET"])

    @app.get("/healthz")
    def healthz(request: Request) -> Response:
        return api.healthz(request)

    app.add_api_route("/metrics", api.metrics, methods=["GET"])

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> Response:
        if exc.status_code == 404:
            err = ApiError(404, "path", f"no route {request.url.path}")
        elif exc.status_code == 405:
            err = ApiError(405, "method", f"{request.method} is not allowed on {request.url.path}")
        else:
            err = ApiError(exc.status_code, "request", str(exc.detail))
        return _error(err)

    @app.exception_handler(Exception)
    async def internal_error(request: Request, exc: Exception) -> Response:
        log.exception("internal error on %s", request.url.path)
        return _error(ApiError(500, "server", "internal error (logged)"))

    return app


class ApiServer:
    """uvicorn serving `create_app(pipeline)` on an explicitly bound socket."""

    def __init__(
        self,
        pipeline: Pipeline,
        host: str = "127.0.0.1",
        port: int = 8000,
        settings: ServerSettings | None = None,
    ) -> None:
        self.pipeline = pipeline
        self.settings = s = settings or ServerSettings()
        per_client = s.max_connections_per_client
        protocol = guarded_protocol(
            "ServerH11",
            header_timeout_s=s.header_timeout_s,
            linger_s=s.linger_s,
            max_per_client=max(1, s.max_connections // 2) if per_client is None else per_client,
            max_headers=s.max_headers,
            max_header_bytes=s.max_header_bytes,
        )
        self.app = create_app(pipeline, s)
        self._sock = tcp_socket(host, port)
        config = uvicorn.Config(
            self.app,
            http=protocol,
            backlog=s.backlog,
            limit_concurrency=s.max_connections,
            timeout_keep_alive=int(max(1, s.keep_alive_s)),
            timeout_graceful_shutdown=int(max(1, s.graceful_s)),
            h11_max_incomplete_event_size=16 * 1024,
            lifespan="off",
            access_log=False,
            log_level="warning",
            server_header=False,
        )
        self._server = uvicorn.Server(config)
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        host, port = self._sock.getsockname()[:2]
        return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"

    def serve_in_thread(self) -> threading.Thread:
        thread = threading.Thread(
            target=self._server.run, kwargs={"sockets": [self._sock]}, name="http", daemon=True
        )
        thread.start()
        deadline = time.monotonic() + 10
        while not self._server.started and thread.is_alive() and time.monotonic() < deadline:
            time.sleep(0.01)
        if not self._server.started:
            raise RuntimeError("the HTTP server did not start")
        self._thread = thread
        return thread

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def shutdown(self) -> None:
        """Stop accepting, let responses in progress finish (at most `graceful_s`)."""
        self._server.should_exit = True
        if self._thread is not None:
            self._thread.join(self.settings.graceful_s + 5)

    def server_close(self) -> None:
        self._sock.close()
