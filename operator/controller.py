"""The controller's steps, callable without kopf: the handlers in `handlers.py` are thin
wrappers around these, and the kmock unit tests call them directly.

State kept in memory (`OperatorState`, stored in kopf's memo at startup) is only a cache and
a set of wake-up events: everything is recomputed from the indices on every pass, so a
restarted operator converges to the same pods without duplicates.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import logging
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

import aiohttp

from horizonserve.operator import builders, reconcile, status
from horizonserve.operator.kube import Kube, KubeError
from horizonserve.operator.models import OmniServiceSpec
from horizonserve.operator.nodes import GpuNode, Selection, select
from horizonserve.operator.pods import PodState
from horizonserve.operator.settings import OperatorConfig
from horizonserve.operator.translate import PipelineLoader, SpecError, parse_spec, serving_config
from horizonserve.runtime.config import ServingConfig, load_pipeline

log = logging.getLogger(__name__)

SETTLE_S = 0.1  # after a wake-up, let a burst of events land before reconciling


@dataclasses.dataclass(frozen=True)
class Parsed:
    """An OmniService spec as the controller uses it (or why it cannot)."""

    spec: OmniServiceSpec | None
    config: ServingConfig | None
    error: str | None
    image: str | None
    template_hash: str | None

    @property
    def valid(self) -> bool:
        return self.error is None


def parse(raw_spec: Mapping[str, Any], default_image: str, load: PipelineLoader) -> Parsed:
    try:
        spec = parse_spec(raw_spec)
    except SpecError as exc:
        return Parsed(None, None, str(exc), None, None)
    try:
        config = serving_config(spec, load)
    except SpecError as exc:
        return Parsed(spec, None, str(exc), None, None)
    image = spec.image or default_image
    return Parsed(spec, config, None, image, builders.spec_hash(spec, config, image))


@dataclasses.dataclass
class ServiceState:
    """Per-OmniService memory: pending writes, last Role contents, wake-up event."""

    expectations: reconcile.Expectations = dataclasses.field(default_factory=reconcile.Expectations)
    wake: asyncio.Event = dataclasses.field(default_factory=asyncio.Event)
    role_names: tuple[str, ...] | None = None
    rbac_ready: bool = False
    # Errors of the last pass that wrote something (e.g. pod creation refused by admission),
    # shown in the status until a pass succeeds.
    errors: tuple[str, ...] = ()
    _parsed_key: str | None = None
    _parsed: Parsed | None = None


class OperatorState:
    """Shared by all handlers via kopf's memo (`memo.hs`)."""

    def __init__(
        self,
        config: OperatorConfig,
        kube: Kube,
        load: PipelineLoader = load_pipeline,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.config = config
        self.kube = kube
        self.load: PipelineLoader = functools.lru_cache(maxsize=16)(load)
        self.clock = clock
        self.services: dict[str, ServiceState] = {}
        self.names: dict[tuple[str, str], str] = {}  # (namespace, name) → uid
        self._nodes_seen: dict[str, GpuNode] = {}
        self._pods_seen: dict[tuple[str, str], tuple[Any, ...]] = {}

    def service(self, namespace: str, name: str, uid: str) -> ServiceState:
        self.names[(namespace, name)] = uid
        return self.services.setdefault(uid, ServiceState())

    def forget(self, namespace: str, name: str, uid: str) -> None:
        self.services.pop(uid, None)
        if self.names.get((namespace, name)) == uid:
            del self.names[(namespace, name)]

    def wake_all(self) -> None:
        for svc in self.services.values():
            svc.wake.set()

    def wake(self, namespace: str, name: str) -> None:
        uid = self.names.get((namespace, name))
        if uid is not None and uid in self.services:
            self.services[uid].wake.set()

    def node_event(self, node: GpuNode) -> None:
        """From the node indexer: wake the reconcilers when a node really changed.

        kopf drops deleted objects from an index without calling the indexer, so a deleted
        node wakes nobody: the periodic resync (a few seconds) notices it instead.
        """
        if self._nodes_seen.get(node.name) != node:
            self._nodes_seen[node.name] = node
            self.wake_all()

    def pod_event(self, owner: tuple[str, str], pod: PodState) -> None:
        """From the pod indexer: wake the owner when something the plan reads changed."""
        key = (pod.namespace, pod.name)
        seen = (pod.uid, pod.ready, pod.deleting, pod.spec_hash, pod.node)
        if self._pods_seen.get(key) != seen:
            self._pods_seen[key] = seen
            self.wake(*owner)

    def parsed(self, svc: ServiceState, raw_spec: Mapping[str, Any]) -> Parsed:
        key = repr(sorted(_flatten(raw_spec)))
        if svc._parsed_key != key or svc._parsed is None:
            svc._parsed = parse(raw_spec, self.config.serving_image, self.load)
            svc._parsed_key = key
        return svc._parsed


def _flatten(value: Any, prefix: str = "") -> Iterator[tuple[str, str]]:
    if isinstance(value, Mapping):
        for k, v in value.items():
            yield from _flatten(v, f"{prefix}.{k}")
    elif isinstance(value, list | tuple):
        for i, v in enumerate(value):
            yield from _flatten(v, f"{prefix}[{i}]")
    else:
        yield prefix, repr(value)


# --- reading the indices -------------------------------------------------------------------


def index_nodes(nodes_index: Mapping[str, Iterable[GpuNode]]) -> list[GpuNode]:
    return [node for store in nodes_index.values() for node in store]


def index_pods(
    pods_index: Mapping[tuple[str, str], Iterable[PodState]], namespace: str, name: str
) -> list[PodState]:
    store = pods_index.get((namespace, name))
    return list(store) if store is not None else []


# --- the steps -----------------------------------------------------------------------------


async def ensure_rbac(
    kube: Kube, owner: builders.Owner, svc: ServiceState, pod_names: Iterable[str]
) -> None:
    """ServiceAccount + Role + RoleBinding of the sidecars; afterwards only the Role's rules.

    The first pass (also after a restart) creates all three, tolerating existing ones; later
    passes patch the Role when the set of pod names changed, recreating it if it vanished.
    """
    names = tuple(sorted(pod_names))
    role = builders.node_role(owner, list(names))
    if svc.rbac_ready and await kube.patch(role, {"rules": role["rules"]}):
        svc.role_names = names
        return
    await kube.ensure(builders.node_service_account(owner))
    await kube.ensure(role, patch={"rules": role["rules"]})
    await kube.ensure(builders.node_role_binding(owner))
    svc.role_names = names
    svc.rbac_ready = True


async def sync_pods(
    state: OperatorState,
    owner: builders.Owner,
    raw_spec: Mapping[str, Any],
    nodes_index: Mapping[str, Iterable[GpuNode]],
    pods_index: Mapping[tuple[str, str], Iterable[PodState]],
) -> reconcile.Plan | None:
    """One reconciliation pass; None when the spec is invalid (the pods are left alone)."""
    svc = state.service(owner.namespace, owner.name, owner.uid)
    parsed = state.parsed(svc, raw_spec)
    if not parsed.valid or parsed.spec is None or parsed.config is None:
        return None
    spec, config = parsed.spec, parsed.config
    selection = select(spec, index_nodes(nodes_index))
    names = sorted(builders.pod_name(owner.name, n) for n in selection.keep)
    if not svc.rbac_ready or svc.role_names != tuple(names):
        # Before any pod: the pods name the ServiceAccount, and admission wants it to exist.
        await ensure_rbac(state.kube, owner, svc, names)
    now = time.monotonic()
    observed = svc.expectations.apply(index_pods(pods_index, owner.namespace, owner.name), now)
    the_plan = reconcile.plan(
        owner.name,
        selection,
        observed,
        parsed.template_hash or "",
        spec.rollout.max_unavailable,
    )
    if the_plan.empty:
        svc.errors = ()
        return the_plan

    def build(node: str) -> dict[str, Any]:
        return builders.serving_pod(
            owner,
            spec,
            config,
            node,
            image=parsed.image or state.config.serving_image,
            template_hash=parsed.template_hash or "",
        )

    errors = await reconcile.execute(state.kube, the_plan, build, svc.expectations, time.monotonic)
    for err in errors:
        log.warning("%s/%s: %s", owner.namespace, owner.name, err)
    svc.errors = tuple(errors)
    return the_plan


def observe(
    state: OperatorState,
    owner: builders.Owner,
    raw_spec: Mapping[str, Any],
    generation: int | None,
    nodes_index: Mapping[str, Iterable[GpuNode]],
    pods_index: Mapping[tuple[str, str], Iterable[PodState]],
) -> status.Observed:
    svc = state.service(owner.namespace, owner.name, owner.uid)
    parsed = state.parsed(svc, raw_spec)
    selection = (
        select(parsed.spec, index_nodes(nodes_index))
        if parsed.spec is not None
        else Selection(frozenset(), frozenset())
    )
    return status.Observed(
        generation=generation,
        spec=parsed.spec,
        config=parsed.config,
        spec_error=parsed.error,
        selection=selection,
        pods=index_pods(pods_index, owner.namespace, owner.name),
        template_hash=parsed.template_hash,
        write_errors=svc.errors,
    )


def status_patch(
    state: OperatorState,
    owner: builders.Owner,
    raw_spec: Mapping[str, Any],
    generation: int | None,
    current: Mapping[str, Any],
    nodes_index: Mapping[str, Iterable[GpuNode]],
    pods_index: Mapping[tuple[str, str], Iterable[PodState]],
) -> dict[str, Any]:
    """The merge patch from the current status to the aggregated one ({} if unchanged)."""
    obs = observe(state, owner, raw_spec, generation, nodes_index, pods_index)
    new = status.build_status(
        obs, now=state.clock(), previous=current, stale_after_s=state.config.stale_after_s
    )
    return status.merge_patch(dict(current or {}), new)


async def run_reconciler(
    state: OperatorState,
    owner: builders.Owner,
    body: Mapping[str, Any],
    indices: Callable[[], tuple[Any, Any]],
    stopped: Any,
) -> None:
    """The per-OmniService loop: reconcile, then sleep until woken or the resync interval.

    Woken by node changes (indexer), serving-pod changes (indexer) and spec updates; the
    periodic pass catches what no event announces (a deleted node or pod, a lost watch).
    """
    svc = state.service(owner.namespace, owner.name, owner.uid)
    failures = 0
    while not stopped:
        svc.wake.clear()
        try:
            nodes_index, pods_index = indices()
            await sync_pods(state, owner, body.get("spec") or {}, nodes_index, pods_index)
            failures = failures + 1 if svc.errors else 0  # refused writes back off too
        except (TimeoutError, KubeError, OSError, aiohttp.ClientError) as exc:
            failures += 1
            log.warning("%s/%s: reconcile failed (%s); retrying", owner.namespace, owner.name, exc)
        except Exception:  # a bug must not end the loop: log it and retry with backoff
            failures += 1
            log.exception("%s/%s: reconcile crashed; retrying", owner.namespace, owner.name)
        delay = state.config.resync_interval_s * min(8, 2**failures)
        try:
            await asyncio.wait_for(svc.wake.wait(), timeout=delay)
            await asyncio.sleep(SETTLE_S)
        except TimeoutError:
            pass
