"""`horizonserve sidecar`: the serving pod's helper container.

Three jobs, one loop:
  * calibration — collect this node's artifact (model + GPU + driver) from the artifact
    directory; the pod's init container ran `horizonserve calibrate` into it (modes auto and
    force; with skip the configured ladder is used);
  * metrics — serve the pod's one /metrics (and /healthz) on FastAPI/uvicorn: the serving
    process's own /metrics (the reference server's, or vLLM's with its `vllm:` families),
    relayed, followed by the sidecar's families; `horizonserve:serving_scrape_up` says whether
    the relay worked;
  * summary — every `--interval` seconds build a NodeSummary from the serving process's stats
    file and publish it as the pod annotation the operator aggregates.
Bad input never ends the process: a malformed stats file, a broken artifact, an API server
away or a failing relay are logged and carried in the next summary's `errors`; a stats file
older than `STATS_MAX_AGE_S` (the serving process stopped writing) is reported, not published
as current. HTTP is guarded as the serving process's is (`http_protocol`): a deadline for
request heads (idle connections included), TCP_NODELAY, a per-client connection cap, header
bounds, and /healthz outside the connection cap. Configuration
comes from the environment the operator sets (names in runtime.config and below); the bind
address is explicit (`--host` / $HORIZONSERVE_METRICS_HOST, default 127.0.0.1).
"""

from __future__ import annotations

import argparse
import logging
import os
import threading
import time
import urllib.error
import urllib.request
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Gauge, generate_latest

from horizonserve.runtime import config as cfg
from horizonserve.runtime.artifact_store import GpuInfo, detect_gpu, find_artifact
from horizonserve.runtime.node_stats import read_stats, stats_path

log = logging.getLogger("horizonserve.sidecar")

METRICS_HOST_ENV = "HORIZONSERVE_METRICS_HOST"  # the sidecar's bind address
SERVING_METRICS_URL_ENV = "HORIZONSERVE_SERVING_METRICS_URL"  # what /metrics relays
DEFAULT_SERVING_METRICS_URL = "http://127.0.0.1:8000/metrics"
RELAY_TIMEOUT_S = 2.0
RELAY_MAX_BYTES = 8 << 20
STATS_MAX_AGE_S = 120.0  # an older stats file is not the serving process's current state
HEADER_TIMEOUT_S = 5.0  # a connection's request head (or its next one) must arrive by then
MAX_CONNECTIONS = 64
MAX_CONNECTIONS_PER_CLIENT = 8


class Publisher(Protocol):
    def publish(self, summary: cfg.NodeSummary) -> None: ...


class PodAnnotationPublisher:
    """Writes the summary into this pod's `horizonserve.io/summary` annotation."""

    def __init__(self, namespace: str, pod: str) -> None:
        from kubernetes import client, config

        try:
            config.load_incluster_config()
        except config.ConfigException:
            # Outside a cluster (tests, local runs): KUBECONFIG as it is now, not at import time.
            config.load_kube_config(config_file=os.environ.get("KUBECONFIG"))
        self._api = client.CoreV1Api()
        self._namespace = namespace
        self._pod = pod

    def publish(self, summary: cfg.NodeSummary) -> None:
        body = {"metadata": {"annotations": {cfg.SUMMARY_ANNOTATION: summary.to_annotation()}}}
        self._api.patch_namespaced_pod(self._pod, self._namespace, body)


class ConfigMapPublisher(PodAnnotationPublisher):
    """Writes the summary into the node's ConfigMap (SUMMARY_CONFIGMAP_ENV) under SUMMARY_KEY:
    a merge patch of one key, the one write the sidecar's RBAC allows."""

    def publish(self, summary: cfg.NodeSummary) -> None:
        body = {"data": {cfg.SUMMARY_KEY: summary.to_annotation()}}
        self._api.patch_namespaced_config_map(self._pod, self._namespace, body)


@dataclass
class CalibrationState:
    artifact: Path | None = None
    artifact_id: str | None = None
    ladder: cfg.SmLadder | None = None
    error: str | None = None


@dataclass
class Sidecar:
    serving: cfg.ServingConfig
    node: str
    mode: cfg.CalibrationMode
    artifact_dir: Path
    stats_file: Path
    publisher: Publisher | None
    gpu: GpuInfo | None
    calibration: CalibrationState = field(default_factory=CalibrationState)
    errors: deque[str] = field(default_factory=lambda: deque(maxlen=5))
    registry: CollectorRegistry = field(default_factory=CollectorRegistry)
    serving_metrics_url: str | None = None  # relayed in front of our families on /metrics

    def __post_init__(self) -> None:
        model = ["model_name"]
        self._model = self.serving.model
        self._attainment = Gauge(
            "horizonserve:node_slo_attainment_ratio",
            "SLO attainment per class over the summary window, as published (absent for a "
            "class without first responses in the window).",
            ["model_name", "request_class"],
            registry=self.registry,
        )
        self._calibrated = Gauge(
            "horizonserve:calibrated",
            "1 when a calibration artifact is loaded.",
            model,
            registry=self.registry,
        )
        self._published = Gauge(
            "horizonserve:summary_published_timestamp_seconds",
            "Unix time of the last successful summary publication.",
            model,
            registry=self.registry,
        )
        self._scrape_up = Gauge(
            "horizonserve:serving_scrape_up",
            "1 when the last relay of the serving process's /metrics worked.",
            model,
            registry=self.registry,
        )
        self._attained: set[str] = set()

    # -- calibration ---------------------------------------------------------------------------
    def calibrate(self) -> CalibrationState:
        """Collect the artifact the init container wrote; report why there is none."""
        state = CalibrationState()
        if self.mode is not cfg.CalibrationMode.SKIP:
            if self.gpu is None:
                state.error = "no NVIDIA GPU visible through NVML; using the configured ladder"
            else:
                self.artifact_dir.mkdir(parents=True, exist_ok=True)
                found = find_artifact(
                    self.artifact_dir, self.serving.pipeline, self.serving.model, self.gpu
                )
                if found is not None:
                    state = self._load(found)
                else:
                    state.error = (
                        f"no calibration artifact for {self.serving.model} on {self.gpu.name} "
                        f"(driver {self.gpu.driver}) in {self.artifact_dir}"
                    )
        if state.error:
            self._error(state.error)
        self.calibration = state
        self._calibrated.labels(self._model).set(1 if state.artifact else 0)
        return state

    def _load(self, path: Path) -> CalibrationState:
        from horizonserve.runtime.artifact import load_artifact

        try:
            art = load_artifact(path)
            entry = art.pipeline(self.serving.pipeline)
            return CalibrationState(path, art.key(self.serving.pipeline), entry.ladder)
        except Exception as exc:  # a broken artifact file: report it, use the configured ladder
            return CalibrationState(error=f"calibration artifact {path} is unusable: {exc}")

    # -- summary -------------------------------------------------------------------------------
    def summary(self, unix_now: float) -> cfg.NodeSummary:
        try:
            stats = read_stats(self.stats_file)
        except ValueError as exc:  # a malformed file: an empty summary that says why
            self._error(str(exc))
            stats = None
        classes, window_s = ([], 300.0) if stats is None else stats[:2]
        if stats is not None and unix_now - stats[2] > STATS_MAX_AGE_S:
            age = unix_now - stats[2]
            self._error(
                f"stats file {self.stats_file} is {age:.0f} s old (over {STATS_MAX_AGE_S:g} s): "
                "the serving process stopped writing it; not published as current"
            )
            classes = []
        return cfg.NodeSummary(
            node=self.node,
            timestamp=unix_now,
            window_s=window_s,
            calibrated=self.calibration.artifact is not None,
            calibration_artifact=self.calibration.artifact_id,
            calibration_error=self.calibration.error,
            ladder=self.calibration.ladder or self.serving.ladder,
            gpu=self.gpu.name if self.gpu else None,
            classes=classes,
            errors=list(self.errors),
        )

    def publish_once(self, unix_now: float) -> cfg.NodeSummary:
        summary = self.summary(unix_now)
        attained = {c.name for c in summary.classes if c.requests}
        for c in summary.classes:
            if c.requests:
                self._attainment.labels(self._model, c.name).set(c.met / c.requests)
        for gone in self._attained - attained:  # the class's window emptied
            self._attainment.remove(self._model, gone)
        self._attained = attained
        if self.publisher is not None:
            try:
                self.publisher.publish(summary)
                self._published.labels(self._model).set(unix_now)
            except Exception as exc:  # API server away, RBAC: keep going, report next time
                self._error(f"publishing the node summary failed: {exc}")
        return summary

    def _error(self, message: str) -> None:
        log.warning("%s", message)
        self.errors.append(message)

    # -- HTTP ----------------------------------------------------------------------------------
    def relay(self) -> bytes:
        """The serving process's /metrics text (empty when there is none or it failed)."""
        if not self.serving_metrics_url:
            return b""
        try:
            with urllib.request.urlopen(self.serving_metrics_url, timeout=RELAY_TIMEOUT_S) as r:
                body = r.read(RELAY_MAX_BYTES + 1)
            if len(body) > RELAY_MAX_BYTES:
                raise ValueError(f"larger than {RELAY_MAX_BYTES} bytes")
        except (OSError, ValueError, urllib.error.URLError) as exc:
            self._scrape_up.labels(self._model).set(0)
            log.debug("relay of %s failed: %s", self.serving_metrics_url, exc)
            return b""
        self._scrape_up.labels(self._model).set(1)
        return body if body.endswith(b"\n") or not body else body + b"\n"

    def metrics_text(self) -> bytes:
        """The pod's /metrics: the serving process's families, then the sidecar's."""
        relayed = self.relay()
        return relayed + generate_latest(self.registry)

    def app(self) -> Any:
        from fastapi import FastAPI
        from fastapi.responses import PlainTextResponse, Response

        app = FastAPI(title="HorizonServe sidecar", docs_url=None, redoc_url=None, openapi_url=None)

        @app.get("/metrics")
        def metrics() -> Response:
            return Response(self.metrics_text(), media_type=CONTENT_TYPE_LATEST)

        @app.get("/healthz")
        def healthz() -> Response:
            return PlainTextResponse("ok\n")

        return app

    def serve_http(self, port: int, host: str = "127.0.0.1") -> SidecarHttp:
        """Serve /metrics and /healthz on uvicorn in a thread."""
        http = SidecarHttp(self.app(), host, port)
        http.start()
        return http


class SidecarHttp:
    """uvicorn in a daemon thread (its own loop; the publish loop keeps the main thread)."""

    def __init__(self, app: Any, host: str, port: int) -> None:
        import uvicorn

        from horizonserve.runtime.engine.reference.http_protocol import (
            guarded_protocol,
            tcp_socket,
        )

        self._sock = tcp_socket(host, port)
        protocol = guarded_protocol(
            "SidecarH11",
            header_timeout_s=HEADER_TIMEOUT_S,
            max_per_client=MAX_CONNECTIONS_PER_CLIENT,
            probe_paths=frozenset({"/healthz"}),
        )
        config = uvicorn.Config(
            app,
            http=protocol,
            backlog=256,
            limit_concurrency=MAX_CONNECTIONS,
            timeout_keep_alive=5,
            h11_max_incomplete_event_size=16 * 1024,
            lifespan="off",
            access_log=False,
            log_level="warning",
            server_header=False,
        )
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(
            target=self._server.run, kwargs={"sockets": [self._sock]}, daemon=True
        )

    @property
    def port(self) -> int:
        return int(self._sock.getsockname()[1])

    def start(self) -> None:
        self._thread.start()
        deadline = time.monotonic() + 10
        while not self._server.started and time.monotonic() < deadline:
            time.sleep(0.01)

    def shutdown(self) -> None:
        self._server.should_exit = True
        self._thread.join(10)
        self._sock.close()


def _env(name: str, default: str | None = None) -> str:
    value = os.environ.get(name, default)
    if value is None:
        raise ValueError(f"environment variable {name} is not set (the operator sets it)")
    return value


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--interval", type=float, default=15.0, help="seconds between summaries")
    parser.add_argument("--once", action="store_true", help="publish one summary and exit")
    parser.add_argument("--no-publish", action="store_true", help="do not patch the pod")
    parser.add_argument(
        "--host",
        default=None,
        help=f"bind address of /metrics and /healthz (default ${METRICS_HOST_ENV} or 127.0.0.1;"
        " in a pod give the pod IP or 0.0.0.0 so Prometheus can scrape it)",
    )
    parser.add_argument(
        "--serving-metrics-url",
        default=None,
        help=f"serving process /metrics to relay (default ${SERVING_METRICS_URL_ENV} or "
        f"{DEFAULT_SERVING_METRICS_URL}; 'none': do not relay)",
    )


def run(args: argparse.Namespace) -> int:
    serving = cfg.ServingConfig.model_validate_json(_env(cfg.SERVING_CONFIG_ENV))
    publisher = None
    if not args.no_publish:
        namespace, configmap = (
            _env(cfg.POD_NAMESPACE_ENV),
            os.environ.get(cfg.SUMMARY_CONFIGMAP_ENV),
        )
        publisher = (
            ConfigMapPublisher(namespace, configmap)
            if configmap
            else PodAnnotationPublisher(namespace, _env(cfg.POD_NAME_ENV))
        )
    sidecar = Sidecar(
        serving=serving,
        node=_env(cfg.NODE_NAME_ENV),
        mode=cfg.CalibrationMode(_env(cfg.CALIBRATION_MODE_ENV, "auto")),
        artifact_dir=Path(_env(cfg.ARTIFACT_DIR_ENV, "/var/lib/horizonserve/calibration")),
        stats_file=stats_path(),
        publisher=publisher,
        gpu=detect_gpu(),
        serving_metrics_url=_relay_url(args.serving_metrics_url),
    )
    if not args.once:
        host = args.host or os.environ.get(METRICS_HOST_ENV) or "127.0.0.1"
        sidecar.serve_http(int(_env(cfg.METRICS_PORT_ENV, "9400")), host)
    try:
        sidecar.calibrate()
    except Exception as exc:  # never fatal: the configured ladder is used
        sidecar._error(f"calibration lookup failed: {exc}")
    while True:
        try:
            sidecar.publish_once(time.time())
        except Exception as exc:  # bad input never ends the sidecar
            sidecar._error(f"summary failed: {exc}")
        if args.once:
            return 0
        time.sleep(args.interval)


def _relay_url(flag: str | None) -> str | None:
    url = flag or os.environ.get(SERVING_METRICS_URL_ENV) or DEFAULT_SERVING_METRICS_URL
    return None if url.lower() == "none" else url
