"""Operator configuration (environment) and kopf settings.

Environment (the Helm chart sets the first three):

| variable | default | meaning |
|---|---|---|
| HORIZONSERVE_NAMESPACE | "" | only this namespace; empty: all namespaces |
| HORIZONSERVE_SERVING_IMAGE | horizonserve:<version> | serving image when a spec omits `image` |
| HORIZONSERVE_LOG_LEVEL | INFO | DEBUG / INFO / WARNING / ERROR |
| HORIZONSERVE_STATUS_INTERVAL | 10 | seconds between status aggregations |
| HORIZONSERVE_RESYNC_INTERVAL | 2 | seconds between level-triggered pod reconciliations |
| HORIZONSERVE_SUMMARY_STALE_AFTER | 180 | a node summary older than this does not count |
| HORIZONSERVE_LIVENESS | http://0.0.0.0:8080/healthz | kopf's liveness endpoint |
| HORIZONSERVE_WEBHOOK_CERT_DIR | "" | tls.crt + tls.key of the webhook; empty: no webhook |
| HORIZONSERVE_WEBHOOK_ADDR | 0.0.0.0 | where the webhook listens (HTTPS) |
| HORIZONSERVE_WEBHOOK_PORT | 9443 | the webhook's port |
| HORIZONSERVE_ALLOWED_REGISTRIES | "" | registries a spec's image may name; "": the default's |
| HORIZONSERVE_ALLOWED_PRIORITY_CLASSES | "" | PriorityClasses a spec may name; "": not system-* |
| HORIZONSERVE_NODE_STATE_GRACE | 600 | seconds a node's ConfigMap outlives its node's match |
"""

from __future__ import annotations

import dataclasses
import logging
import os
from collections.abc import Mapping
from pathlib import Path

import kopf

from horizonserve.operator import models
from horizonserve.operator.policy import Policy, split_list
from horizonserve.runtime import __version__

DEFAULT_IMAGE = f"horizonserve:{__version__}"
DEFAULT_LIVENESS = "http://0.0.0.0:8080/healthz"
DEFAULT_WEBHOOK_PORT = 9443
FINALIZER = f"{models.GROUP}/finalizer"


def _float(env: Mapping[str, str], name: str, default: float) -> float:
    raw = env.get(name, "")
    try:
        value = float(raw) if raw else default
    except ValueError:
        raise ValueError(f"{name}={raw!r}: not a number") from None
    if value <= 0:
        raise ValueError(f"{name}={raw!r}: must be positive")
    return value


@dataclasses.dataclass(frozen=True)
class OperatorConfig:
    namespace: str = ""
    serving_image: str = DEFAULT_IMAGE
    log_level: str = "INFO"
    status_interval_s: float = 10.0
    resync_interval_s: float = 2.0
    stale_after_s: float = 180.0
    liveness_endpoint: str = DEFAULT_LIVENESS
    webhook_cert_dir: str = ""
    webhook_addr: str = "0.0.0.0"
    webhook_port: int = DEFAULT_WEBHOOK_PORT
    allowed_registries: tuple[str, ...] = ()
    allowed_priority_classes: tuple[str, ...] = ()
    node_state_grace_s: float = 600.0

    @property
    def policy(self) -> Policy:
        return Policy(self.allowed_registries, self.allowed_priority_classes)

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> OperatorConfig:
        env = os.environ if env is None else env
        level = (env.get("HORIZONSERVE_LOG_LEVEL") or "INFO").upper()
        if level not in ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"):
            raise ValueError(f"HORIZONSERVE_LOG_LEVEL={level!r}: use DEBUG/INFO/WARNING/ERROR")
        return cls(
            namespace=env.get("HORIZONSERVE_NAMESPACE", "").strip(),
            serving_image=env.get("HORIZONSERVE_SERVING_IMAGE", "").strip() or DEFAULT_IMAGE,
            log_level=level,
            status_interval_s=_float(env, "HORIZONSERVE_STATUS_INTERVAL", 10.0),
            resync_interval_s=_float(env, "HORIZONSERVE_RESYNC_INTERVAL", 2.0),
            stale_after_s=_float(env, "HORIZONSERVE_SUMMARY_STALE_AFTER", 180.0),
            liveness_endpoint=env.get("HORIZONSERVE_LIVENESS", "").strip() or DEFAULT_LIVENESS,
            webhook_cert_dir=env.get("HORIZONSERVE_WEBHOOK_CERT_DIR", "").strip(),
            webhook_addr=env.get("HORIZONSERVE_WEBHOOK_ADDR", "").strip() or "0.0.0.0",
            webhook_port=int(_float(env, "HORIZONSERVE_WEBHOOK_PORT", DEFAULT_WEBHOOK_PORT)),
            allowed_registries=split_list(env.get("HORIZONSERVE_ALLOWED_REGISTRIES")),
            allowed_priority_classes=split_list(env.get("HORIZONSERVE_ALLOWED_PRIORITY_CLASSES")),
            node_state_grace_s=_float(env, "HORIZONSERVE_NODE_STATE_GRACE", 600.0),
        )


def configure(settings: kopf.OperatorSettings, config: OperatorConfig | None = None) -> None:
    """kopf settings; called from the startup handler."""
    if config is not None and config.namespace:
        # One fixed namespace: no namespace scanning. kopf would otherwise try to list
        # namespaces cluster-wide (not granted in namespaced mode) and retry for about a
        # minute before serving. The CRD must then exist when the operator starts (the chart
        # installs it first); a restart picks up a CRD installed later.
        settings.scanning.disabled = True
    # One replica (the chart's Deployment uses Recreate): no peering objects, no peering RBAC.
    settings.peering.standalone = True
    # Handler progress and the diff base live in our own annotations, never in `status`
    # (the CRD declares every status field; anything else would be pruned).
    settings.persistence.finalizer = FINALIZER
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=models.GROUP)
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
        prefix=models.GROUP, key="last-handled-configuration"
    )
    # Watches: ask the server to end each stream after 5 min and give up client-side a bit
    # later, so a silently dead connection (edge networks, load balancers) is replaced; kopf
    # resumes from the last resourceVersion.
    settings.watching.server_timeout = 300
    settings.watching.client_timeout = 330
    settings.watching.connect_timeout = 10
    settings.networking.request_timeout = 60
    settings.networking.connect_timeout = 10
    # A deleted OmniService keeps kopf's finalizer until its daemon and status timer have
    # exited. A timer caught in the middle of a run is re-checked only after
    # `cancellation_polling` (kopf's default: 60 s), so `kubectl delete` could hang a minute;
    # re-check every second instead (one annotation patch per second while it exits).
    settings.background.cancellation_polling = 1.0
    # Kubernetes Events only for warnings and errors: a 500-node fleet must not emit one per
    # handler run.
    settings.posting.level = logging.WARNING
    if config is not None and config.webhook_cert_dir:
        # The validating webhook (webhook.py) over HTTPS with the chart's certificate; the
        # chart's ValidatingWebhookConfiguration points the API server here, so kopf manages
        # no webhook configuration (and needs no RBAC for one).
        certs = Path(config.webhook_cert_dir)
        settings.admission.server = kopf.WebhookServer(
            addr=config.webhook_addr,
            port=config.webhook_port,
            certfile=str(certs / "tls.crt"),
            pkeyfile=str(certs / "tls.key"),
        )
        settings.admission.managed = None
