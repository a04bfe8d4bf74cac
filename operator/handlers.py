"""kopf registrations: thin wrappers around `controller.py`.

* `gpu_nodes` (index, Node): compact GpuNode per GPU node. No handler, annotation or finalizer
  ever touches a Node; the indexer only reads.
* `serving_pods` (index, Pod): PodState of every serving pod, keyed by its owning OmniService.
* `node_states` (index, ConfigMap): each node's ConfigMap (calibration key, summary), by owner.
* `omniservice_claims` (index, OmniService): every OmniService with its age, for the one-GPU-
  one-owner rule (`claims.py`).
* `runtime_classes`, `priority_classes` (index, cluster-scoped, read-only): which exist, so
  that an OmniService whose class is missing (no pod could ever be admitted) owns no node.
* `validate` (validating admission webhook, when HORIZONSERVE_WEBHOOK_CERT_DIR is set): the
  whole spec (unknown fields, cross-field rules, size) refused at `kubectl apply`.
* `reconcile_pods` (daemon, OmniService): one loop per OmniService that keeps one serving pod
  on each matching node, woken by the indexers and by spec updates.
* `aggregate_status` (timer, OmniService): status and conditions from the per-node summaries.
* `spec_changed` (create/update): immediate status (e.g. an invalid spec) and a wake-up.
* `deleted` (delete, optional: no finalizer of its own): children go by owner references.

kopf adds its finalizer (`horizonserve.io/finalizer`) to OmniServices because daemons and
timers must be stopped before the object disappears.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import kopf

from horizonserve.operator import cleanup as finalizer_cleanup
from horizonserve.operator import controller, kube, model_source, models, webhook
from horizonserve.operator import settings as op_settings
from horizonserve.operator.builders import (
    APP,
    COMPONENT_NODE_STATE,
    COMPONENT_SERVING,
    LABEL_COMPONENT,
    LABEL_NAME,
    Owner,
)
from horizonserve.operator.claims import Claim
from horizonserve.operator.nodes import gpu_node, is_gpu_node
from horizonserve.operator.nodestate import node_state
from horizonserve.operator.pods import owner_key, pod_state

CONFIG = op_settings.OperatorConfig.from_env()
# The chart's modelSource values (read again where used): a bad one stops the operator here.
model_source.SourcePolicy.from_env()
OSVC = (models.GROUP, models.VERSION, models.PLURAL)
NODES_INDEX = "gpu_nodes"
PODS_INDEX = "serving_pods"
STATES_INDEX = "node_states"
CLAIMS_INDEX = "omniservice_claims"
RUNTIME_INDEX = "runtime_classes"
PRIORITY_INDEX = "priority_classes"
RELEASE_RETRY_S = (1.0, 30.0)  # first and longest wait between finalizer-release attempts


def _post_event(owner: Owner, reason: str, message: str) -> None:
    ref = {
        "apiVersion": models.API_VERSION,
        "kind": models.KIND,
        "metadata": {"name": owner.name, "namespace": owner.namespace, "uid": owner.uid},
    }
    kopf.warn(ref, reason=reason, message=message[:1000])


@kopf.on.startup()
async def startup(settings: kopf.OperatorSettings, memo: kopf.Memo, **_: Any) -> None:
    op_settings.configure(settings, CONFIG)
    logging.getLogger("horizonserve").setLevel(CONFIG.log_level)
    if getattr(memo, "hs", None) is None:  # tests may inject their own state
        memo.hs = controller.OperatorState(CONFIG, kube.from_environment(), events=_post_event)
    if CONFIG.namespace:
        # In the background, retried until every foreign finalizer is released: the writes
        # may go through this operator's own webhook, which serves only once startup is done.
        memo.release = asyncio.create_task(
            finalizer_cleanup.release_until_done(memo.hs.kube, CONFIG.namespace, *RELEASE_RETRY_S)
        )


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
    release: asyncio.Task[Any] | None = getattr(memo, "release", None)
    if release is not None and not release.done():
        release.cancel()
    state: controller.OperatorState | None = getattr(memo, "hs", None)
    if state is not None:
        await state.kube.close()


def _gpu(labels: Any, status: Any, **_: Any) -> bool:
    return is_gpu_node(labels, status)


@kopf.index("nodes", id=NODES_INDEX, when=_gpu)
async def gpu_nodes(
    name: str, labels: Any, spec: Any, status: Any, uid: Any, memo: kopf.Memo, **_: Any
) -> dict[str, Any]:
    node = gpu_node(name, labels, spec, status, str(uid or ""))
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
async def serving_pods(
    meta: Any, spec: Any, status: Any, memo: kopf.Memo, **_: Any
) -> dict[Any, Any]:
    key = owner_key(meta)
    pod = pod_state(meta, status, spec)
    memo.hs.pod_event(key, pod)
    return {key: pod}


@kopf.index(
    "configmaps",
    id=STATES_INDEX,
    labels={LABEL_NAME: APP, LABEL_COMPONENT: COMPONENT_NODE_STATE},
    when=_owned,
)
async def node_states(meta: Any, body: Any, **_: Any) -> dict[Any, Any]:
    return {owner_key(meta): node_state(meta, body.get("data"))}


@kopf.index(*OSVC, id=CLAIMS_INDEX)
async def omniservice_claims(meta: Any, spec: Any, **_: Any) -> dict[Any, Any]:
    if meta.get("deletionTimestamp"):
        return {}  # an OmniService being deleted claims nothing
    claim = Claim(
        meta.get("namespace", ""), meta["name"], meta.get("uid", ""),
        str(meta.get("creationTimestamp", "")),
    )  # fmt: skip
    return {None: (claim, dict(spec or {}))}


@kopf.index("node.k8s.io", "v1", "runtimeclasses", id=RUNTIME_INDEX)
async def runtime_classes(name: str, memo: kopf.Memo, **_: Any) -> dict[Any, Any]:
    memo.hs.wake_all()  # a class appearing may make an OmniService servable
    return {None: name}


@kopf.index("scheduling.k8s.io", "v1", "priorityclasses", id=PRIORITY_INDEX)
async def priority_classes(name: str, memo: kopf.Memo, **_: Any) -> dict[Any, Any]:
    memo.hs.wake_all()
    return {None: name}


def _indices(kwargs: dict[str, Any]) -> controller.Indices:
    return controller.Indices(
        kwargs[NODES_INDEX], kwargs[PODS_INDEX], kwargs[STATES_INDEX], kwargs[CLAIMS_INDEX],
        kwargs[RUNTIME_INDEX], kwargs[PRIORITY_INDEX],
    )  # fmt: skip


@kopf.daemon(*OSVC, id="reconcile_pods", cancellation_timeout=1.0)
async def reconcile_pods(
    body: kopf.Body, memo: kopf.Memo, stopped: kopf.DaemonStopped, **kwargs: Any
) -> None:
    state: controller.OperatorState = memo.hs
    owner = Owner.from_body(body)
    ix = _indices(kwargs)  # live: kopf updates the indices in place
    try:
        await controller.run_reconciler(state, owner, body, lambda: ix, stopped)
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
    diff = controller.status_patch(state, owner, body, dict(status or {}), _indices(kwargs))
    if diff:
        patch.setdefault("status", {}).update(diff)


if CONFIG.webhook_cert_dir:
    # Registered only with a certificate: kopf refuses to start admission handlers without a
    # server. The chart always gives one (and the ValidatingWebhookConfiguration).
    @kopf.on.validate(*OSVC, id=webhook.WEBHOOK_ID, operations=["CREATE", "UPDATE"])
    def validate(body: kopf.Body, old: Any, subresource: Any, **_: Any) -> None:
        webhook.admit(body, old, subresource, CONFIG.serving_image, CONFIG.policy)
