"""HTTP API of `horizonserve serve` (standard library only).

POST /v1/requests   JSON {"priority": 0|10|20 or "class": name, "input_tokens", "audio_seconds",
                    "images", "output_tokens", "downstream_tokens"?, "id"?, "timeout_s"?}
                    → 200 when the first response happened: class, metric, queueing and
                      first-response latency, SLO target and outcome
                    → 400 bad request, 504 no first response within timeout_s, 503 stopped
GET  /healthz       200 {"ok": true, "stages": …} while every stage is alive, else 503
GET  /metrics       Prometheus text of the pipeline's MetricsRecorder registry
"""

from __future__ import annotations

import json
import logging
import threading
import time
import uuid
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from horizonserve.runtime.engine.reference.pipeline import Pipeline, PipelineError
from horizonserve.runtime.engine.reference.protocol import RequestSpec

log = logging.getLogger(__name__)

DEFAULT_TIMEOUT_S = 300.0
MAX_BODY = 64 * 1024
_INT_FIELDS = ("input_tokens", "images", "output_tokens")


def parse_request(body: dict[str, Any]) -> tuple[RequestSpec, float]:
    """A RequestSpec and wait timeout from the JSON body; ValueError names the bad field."""
    if not isinstance(body, dict):
        raise ValueError("body must be a JSON object")
    known = {"id", "priority", "class", *_INT_FIELDS, "audio_seconds", "video_seconds"}
    known.add("downstream_tokens")
    unknown = set(body) - known - {"timeout_s"}
    if unknown:
        raise ValueError(f"unknown field(s) {sorted(unknown)}; known: {sorted(known)}")
    priority = body.get("priority")
    class_name = body.get("class")
    if priority is None and class_name is None:
        raise ValueError("give 'priority' (0 text, 10 audio, 20 image) or 'class'")
    if priority is not None and (isinstance(priority, bool) or not isinstance(priority, int)):
        raise ValueError("'priority' must be an integer")
    if class_name is not None and not isinstance(class_name, str):
        raise ValueError("'class' must be a string")
    values: dict[str, Any] = {}
    for name in _INT_FIELDS:
        if name in body:
            v = body[name]
            if isinstance(v, bool) or not isinstance(v, int) or v < 0:
                raise ValueError(f"'{name}' must be a non-negative integer")
            values[name] = v
    for name in ("audio_seconds", "video_seconds"):
        if name in body:
            v = body[name]
            if isinstance(v, bool) or not isinstance(v, int | float) or v < 0:
                raise ValueError(f"'{name}' must be a non-negative number")
            values[name] = float(v)
    down = body.get("downstream_tokens")
    if down is not None and (isinstance(down, bool) or not isinstance(down, int) or down <= 0):
        raise ValueError("'downstream_tokens' must be a positive integer")
    timeout = body.get("timeout_s", DEFAULT_TIMEOUT_S)
    if isinstance(timeout, bool) or not isinstance(timeout, int | float) or timeout <= 0:
        raise ValueError("'timeout_s' must be a positive number")
    rid = body.get("id") or uuid.uuid4().hex
    if not isinstance(rid, str):
        raise ValueError("'id' must be a string")
    spec = RequestSpec(
        rid=rid,
        priority=priority,
        class_name=class_name,
        downstream_tokens=down,
        **values,
    )
    return spec, float(timeout)


class _Handler(BaseHTTPRequestHandler):
    server: ApiServer
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("%s " + format, self.address_string(), *args)

    def _send(self, status: int, body: bytes, content_type: str) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _json(self, status: int, payload: dict[str, Any]) -> None:
        self._send(status, json.dumps(payload).encode(), "application/json")

    def do_GET(self) -> None:
        pipeline = self.server.pipeline
        if self.path in ("/health", "/healthz"):  # /health: the name vLLM and the probes use
            health = pipeline.health()
            self._json(HTTPStatus.OK if health["ok"] else HTTPStatus.SERVICE_UNAVAILABLE, health)
        elif self.path == "/metrics":
            pipeline.metrics.refresh_attainment(time.monotonic())
            self._send(
                HTTPStatus.OK, generate_latest(pipeline.metrics.registry), CONTENT_TYPE_LATEST
            )
        else:
            self._json(HTTPStatus.NOT_FOUND, {"error": f"no route {self.path}"})

    def do_POST(self) -> None:
        if self.path != "/v1/requests":
            self._json(HTTPStatus.NOT_FOUND, {"error": f"no route {self.path}"})
            return
        arrival = time.monotonic()
        try:
            length = int(self.headers.get("Content-Length") or 0)
            if length > MAX_BODY:
                raise ValueError(f"body larger than {MAX_BODY} bytes")
            body = json.loads(self.rfile.read(length) or b"null")
            spec, timeout = parse_request(body)
            handle = self.server.pipeline.submit(spec, arrival)
        except (ValueError, KeyError) as exc:
            message = exc.args[0] if isinstance(exc, KeyError) and exc.args else str(exc)
            self._json(HTTPStatus.BAD_REQUEST, {"error": str(message)})
            return
        except PipelineError as exc:
            self._json(HTTPStatus.SERVICE_UNAVAILABLE, {"error": str(exc)})
            return
        if not handle.wait_first(timeout):
            self._json(HTTPStatus.GATEWAY_TIMEOUT, {"error": "no first response in time"})
            return
        record = handle.record
        if record.error is not None and record.first is None:
            self._json(HTTPStatus.SERVICE_UNAVAILABLE, {"id": record.rid, "error": record.error})
            return
        self._json(HTTPStatus.OK, record.as_dict())


class ApiServer(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, pipeline: Pipeline, host: str = "127.0.0.1", port: int = 8000) -> None:
        self.pipeline = pipeline
        super().__init__((host, port), _Handler)

    @property
    def url(self) -> str:
        host, port = self.server_address[:2]
        return f"http://{host}:{port}"

    def serve_in_thread(self) -> threading.Thread:
        thread = threading.Thread(target=self.serve_forever, name="http", daemon=True)
        thread.start()
        return thread
