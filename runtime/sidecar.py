"""`horizonserve sidecar`: the serving pod's helper container.

Three jobs, one loop:
  * calibration — collect this node's artifact (model + GPU + driver) from the artifact
    directory; the pod's init container ran `horizonserve calibrate` into it (modes auto and
    force; with skip the configured ladder is used);
  * metrics — serve /metrics (prometheus) and /healthz;
  * summary — every `--interval` seconds build a NodeSummary from the serving process's stats
    file and publish it as the pod annotation the operator aggregates.
Publishing failures are logged and carried in the next summary's `errors`; the loop never dies
of them. Configuration comes from the environment the operator sets (names in runtime.config).
"""

from __future__ import annotations

import argparse
import logging
import os
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Protocol

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Gauge, generate_latest

from horizonserve.runtime import config as cfg
from horizonserve.runtime.calibrate.store import GpuInfo, detect_gpu, find_artifact
from horizonserve.runtime.node_stats import read_stats, stats_path

log = logging.getLogger("horizonserve.sidecar")


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

    def __post_init__(self) -> None:
        self._attainment = Gauge(
            "horizonserve_node_slo_attainment_ratio",
            "SLO attainment per class over the summary window, as published.",
            ["request_class"],
            registry=self.registry,
        )
        self._calibrated = Gauge(
            "horizonserve_calibrated",
            "1 when a calibration artifact is loaded.",
            registry=self.registry,
        )
        self._published = Gauge(
            "horizonserve_summary_published_timestamp_seconds",
            "Unix time of the last successful summary publication.",
            registry=self.registry,
        )

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
        self._calibrated.set(1 if state.artifact else 0)
        return state

    def _load(self, path: Path) -> CalibrationState:
        from horizonserve.runtime.calibrate.artifact import load_artifact

        art = load_artifact(path)
        entry = art.pipeline(self.serving.pipeline)
        return CalibrationState(path, art.key(self.serving.pipeline), entry.ladder)

    # -- summary -------------------------------------------------------------------------------
    def summary(self, unix_now: float) -> cfg.NodeSummary:
        stats = read_stats(self.stats_file)
        classes, window_s = ([], 300.0) if stats is None else stats[:2]
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
        for c in summary.classes:
            if c.requests:
                self._attainment.labels(c.name).set(c.met / c.requests)
        if self.publisher is not None:
            try:
                self.publisher.publish(summary)
                self._published.set(unix_now)
            except Exception as exc:  # API server away, RBAC: keep going, report next time
                self._error(f"publishing the node summary failed: {exc}")
        return summary

    def _error(self, message: str) -> None:
        log.warning("%s", message)
        self.errors.append(message)

    # -- HTTP ----------------------------------------------------------------------------------
    def serve_http(self, port: int) -> ThreadingHTTPServer:
        registry = self.registry

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                if self.path == "/metrics":
                    body, ctype = generate_latest(registry), CONTENT_TYPE_LATEST
                elif self.path == "/healthz":
                    body, ctype = b"ok\n", "text/plain"
                else:
                    self.send_error(404)
                    return
                self.send_response(200)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: object) -> None:
                pass

        server = ThreadingHTTPServer(("0.0.0.0", port), Handler)
        threading.Thread(target=server.serve_forever, name="sidecar-http", daemon=True).start()
        return server


def _env(name: str, default: str | None = None) -> str:
    value = os.environ.get(name, default)
    if value is None:
        raise ValueError(f"environment variable {name} is not set (the operator sets it)")
    return value


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--interval", type=float, default=15.0, help="seconds between summaries")
    parser.add_argument("--once", action="store_true", help="publish one summary and exit")
    parser.add_argument("--no-publish", action="store_true", help="do not patch the pod")


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
    )
    if not args.once:
        sidecar.serve_http(int(_env(cfg.METRICS_PORT_ENV, "9400")))
    sidecar.calibrate()
    while True:
        sidecar.publish_once(time.time())
        if args.once:
            return 0
        time.sleep(args.interval)
