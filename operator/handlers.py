"""kopf registrations: thin wrappers around `controller.py`.

* `gpu_nodes` (index, Node): compact GpuNode per GPU node. No handler, annotation or finalizer
  ever touches a Node; the indexer only reads.
* `serving_pods` (index, Pod): PodState of every serving pod, keyed by its owning OmniService.
* `reconcile_pods` (daemon, OmniService): one loop per OmniService that keeps one serving pod
  on each matching node, woken by the indexers and by spec updates.
* `aggregate_status` (timer, OmniService): status and conditions from the per-node summaries.
* `spec_changed` (create/update): immediate status (e.g. an invalid spec) and a wake-up.
* `deleted` (delete, optional: no finalizer of its own): children go by owner references.

kopf adds its finalizer (`horizonserve.io/finalizer`) to OmniServices because daemons and
timers must be stopped before the object disappears.
"""

from __future__ import annotations

import logging
from typing import Any

import kopf

from horizonserve.operator import controller, kube, models
from horizonserve.operator import settings as op_settings
from horizonserve.operator.builders import (
    APP,
    COMPONENT_SERVING,
    LABEL_COMPONENT,
    LABEL_NAME,
    Owner,
)
from horizonserve.operator.nodes import gpu_node, is_gpu_node
from horizonserve.operator.pods import owner_key, pod_state

CONFIG = op_settings.OperatorConfig.from_env()
OSVC = (models.GROUP, models.VERSION, models.PLURAL)
NODES_INDEX = "gpu_nodes"
PODS_INDEX = "serving_pods"


@kopf.on.startup()
async def startup(settings: kopf.OperatorSettings, memo: kopf.Memo, **_: Any) -> None:
    op_settings.configure(settings, CONFIG)
    logging.getLogger("horizonserve").setLevel(CONFIG.log_level)
    if getattr(memo, "hs", None) is None:  # tests may inject their own state
        memo.hs = controller.OperatorState(CONFIG, kube.from_environment())


@kopf.on.login()
def login(**_: Any) -> kopf.ConnectionInfo:
    """kopf's credentials from the same source as our own client (see kube.py)."""
    cfg = kube.client_configuration()
    scheme, _sep, token = (kube.bearer_token(cfg) or "").partition(" ")
    return kopf.ConnectionInfo(
        server=cfg.host,
        ca_path=cfg.ssl_ca_cert,
        insecure=not cfg.verify_ssl,
        scheme=scheme or None,
        token=token or None,
        certificate_path=cfg.cert_file,
        private_key_path=cfg.key_file,
        username=cfg.username or None,
        password=cfg.password or None,
    )


@kopf.on.cleanup()
async def cleanup(memo: kopf.Memo, **_: Any) -> None:
    state: controller.OperatorState | None = getattr(memo, "hs", None)
    if state is not None:
        await state.kube.close()


def _gpu(labels: Any, status: Any, **_: Any) -> bool:
    return is_gpu_node(labels, status)


@kopf.index("nodes", id=NODES_INDEX, when=_gpu)
async def gpu_nodes(
    name: str, labels: Any, spec: Any, status: Any, memo: kopf.Memo, **_: Any
) -> dict[str, Any]:
    node = gpu_node(name, labels, spec, status)
    memo.hs.node_event(node)
    return {name: node}


def _owned(meta: Any, **_: Any) -> bool:
    return owner_key(meta) is not None


@kopf.index(
    "pods",
    id=PODS_INDEX,
    labels={LABEL_NAME: APP, LABEL_COMPONENT: COMPONENT_SERVING},
    when=_owned,
)
async def serving_pods(meta: Any, status: Any, memo: kopf.Memo, **_: Any) -> dict[Any, Any]:
    key = owner_key(meta)
    pod = pod_state(meta, status)
    memo.hs.pod_event(key, pod)
    return {key: pod}


@kopf.daemon(*OSVC, id="reconcile_pods", cancellation_timeout=1.0)
async def reconcile_pods(
    body: kopf.Body, memo: kopf.Memo, stopped: kopf.DaemonStopped, **kwargs: Any
) -> None:
    state: controller.OperatorState = memo.hs
    owner = Owner.from_body(body)
    nodes, pods = kwargs[NODES_INDEX], kwargs[PODS_INDEX]  # live: kopf updates them in place
    try:
        await controller.run_reconciler(state, owner, body, lambda: (nodes, pods), stopped)
    finally:
        if stopped:
            state.forget(owner.namespace, owner.name, owner.uid)


@kopf.timer(*OSVC, id="aggregate_status", interval=CONFIG.status_interval_s)
async def aggregate_status(
    body: kopf.Body, status: Any, patch: kopf.Patch, memo: kopf.Memo, **kwargs: Any
) -> None:
    _patch_status(memo.hs, body, status, patch, kwargs)


@kopf.on.create(*OSVC, id="spec_changed")
@kopf.on.update(*OSVC, id="spec_changed", field="spec")
async def spec_changed(
    body: kopf.Body, status: Any, patch: kopf.Patch, memo: kopf.Memo, **kwargs: Any
) -> None:
    _patch_status(memo.hs, body, status, patch, kwargs)
    memo.hs.wake(body["metadata"]["namespace"], body["metadata"]["name"])


@kopf.on.delete(*OSVC, id="deleted", optional=True)
async def deleted(name: str, namespace: str, logger: kopf.Logger, **_: Any) -> None:
    logger.info("OmniService %s/%s deleted; its children go by owner references", namespace, name)


def _patch_status(
    state: controller.OperatorState,
    body: kopf.Body,
    status: Any,
    patch: kopf.Patch,
    kwargs: dict[str, Any],
) -> None:
    owner = Owner.from_body(body)
    diff = controller.status_patch(
        state,
        owner,
        body.get("spec") or {},
        body["metadata"].get("generation"),
        dict(status or {}),
        kwargs[NODES_INDEX],
        kwargs[PODS_INDEX],
    )
    if diff:
        patch.setdefault("status", {}).update(diff)
