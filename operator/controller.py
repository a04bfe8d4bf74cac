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
from collections.abc import Awaitable, Callable, Iterable, Iterator, Mapping
from typing import Any
from urllib.parse import quote

import aiohttp

from horizonserve.operator import builders, reconcile, status
from horizonserve.operator.claims import Claim, lost_nodes
from horizonserve.operator.kube import Kube, KubeError
from horizonserve.operator.models import API_VERSION, PLURAL, OmniServiceSpec
from horizonserve.operator.nodes import GpuNode, Selection, select
from horizonserve.operator.nodestate import NodeState
from horizonserve.operator.pods import PodState
from horizonserve.operator.settings import OperatorConfig
from horizonserve.operator.translate import PipelineLoader, SpecError, parse_spec, serving_config
from horizonserve.runtime.config import ServingConfig, load_pipeline

log = logging.getLogger(__name__)

SETTLE_S = 0.1  # after a wake-up, let a burst of events land before reconciling
ENSURED_TTL_S = 30.0  # a created node ConfigMap counts as present until the index shows it
EventPoster = Callable[[builders.Owner, str, str], None]  # (owner, reason, message)


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
    # Nodes lost to an older OmniService: node → winner (condition Conflict, Events).
    conflicts: Mapping[str, Claim] = dataclasses.field(default_factory=dict)
    # Node objects (ConfigMap + RBAC) written but maybe not yet in the index: (node, key) → t.
    ensured: dict[tuple[str, str], float] = dataclasses.field(default_factory=dict)
    service: dict[str, Any] | None = None  # the Service spec last written
    # Last Event per reason (posted again only when the message changes).
    posted: dict[str, str] = dataclasses.field(default_factory=dict)
    trust: dict[tuple[str, str, str], str] = dataclasses.field(default_factory=dict)
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
        events: EventPoster | None = None,
    ) -> None:
        self.config = config
        self.kube = kube
        self.load: PipelineLoader = functools.lru_cache(maxsize=16)(load)
        self.clock = clock
        self.events = events
        self.services: dict[str, ServiceState] = {}
        self.names: dict[tuple[str, str], str] = {}  # (namespace, name) → uid
        self._nodes_seen: dict[str, GpuNode] = {}
        self._pods_seen: dict[tuple[str, str], tuple[Any, ...]] = {}
        self._taints_seen: dict[tuple[str, str, str, str], float] = {}
        self._claims_parsed: dict[str, tuple[str, Parsed]] = {}  # uid → (spec key, parsed)

    def taint_since(self, node: str, taint: Mapping[str, str]) -> float:
        """When a taint without `timeAdded` was first seen (for tolerationSeconds)."""
        key = (node, taint.get("key", ""), taint.get("value", ""), taint.get("effect", ""))
        return self._taints_seen.setdefault(key, self.clock())

    def parsed_claim(self, uid: str, raw_spec: Mapping[str, Any]) -> Parsed:
        """Another OmniService's spec, parsed once per change (for the conflict check)."""
        key = repr(sorted(_flatten(raw_spec)))
        cached = self._claims_parsed.get(uid)
        if cached is None or cached[0] != key:
            cached = (key, parse(raw_spec, self.config.serving_image, self.load))
            self._claims_parsed[uid] = cached
        return cached[1]

    def post(self, owner: builders.Owner, svc: ServiceState, reason: str, message: str) -> None:
        """A Warning Event on the OmniService, once per distinct message and reason."""
        if self.events is None or svc.posted.get(reason) == message:
            return
        svc.posted[reason] = message
        try:
            self.events(owner, reason, message)
        except Exception:  # an Event is a courtesy: never fail a pass for it
            log.exception("posting a %s Event failed", reason)

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
        seen = (pod.uid, pod.ready, pod.deleting, pod.spec_hash, pod.node, pod.trust)
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


def index_states(
    states_index: Mapping[tuple[str, str], Iterable[NodeState]] | None, namespace: str, name: str
) -> list[NodeState]:
    store = (states_index or {}).get((namespace, name))
    return list(store) if store is not None else []


def index_claims(
    claims_index: Mapping[Any, Iterable[tuple[Claim, Mapping[str, Any]]]] | None,
) -> list[tuple[Claim, Mapping[str, Any]]]:
    return [entry for store in (claims_index or {}).values() for entry in store]


@dataclasses.dataclass(frozen=True)
class Placement:
    """Where one OmniService serves after taints and conflicts, with each node's key."""

    selection: Selection
    keys: Mapping[str, str]  # node → calibration key (model × GPU × driver)
    labels: Mapping[str, Mapping[str, str]]
    conflicts: Mapping[str, Claim]


def place(
    state: OperatorState,
    me: Claim,
    parsed: Parsed,
    nodes: list[GpuNode],
    claims: list[tuple[Claim, Mapping[str, Any]]],
) -> Placement:
    """Selection (labels, taints), minus nodes an older OmniService owns."""
    assert parsed.spec is not None and parsed.config is not None
    now = state.clock()
    selection = select(parsed.spec, nodes, now, state.taint_since)
    wanted: dict[Claim, frozenset[str]] = {me: selection.keep}
    for claim, raw in claims:
        if claim.uid == me.uid:
            continue
        other = state.parsed_claim(claim.uid, raw)
        if other.spec is not None and other.valid:
            wanted[claim] = select(other.spec, nodes, now, state.taint_since).keep & selection.keep
    by_name = {n.name: n for n in nodes}
    gpus = {n: by_name[n].gpus for n in selection.keep}
    lost = lost_nodes(me, wanted, gpus) if len(wanted) > 1 else {}
    if lost:
        selection = Selection(selection.create - set(lost), selection.keep - set(lost))
    labels = {n: by_name[n].labels for n in selection.keep}
    keys = {n: builders.calibration_key(parsed.config.model, labels[n]) for n in selection.keep}
    return Placement(selection, keys, labels, lost)


def claim_of(owner: builders.Owner, meta: Mapping[str, Any] | None) -> Claim:
    return Claim(
        owner.namespace, owner.name, owner.uid, str((meta or {}).get("creationTimestamp", ""))
    )


# --- the steps -----------------------------------------------------------------------------


async def sync_node_objects(
    state: OperatorState,
    owner: builders.Owner,
    svc: ServiceState,
    placement: Placement,
    states: list[NodeState],
    pods: list[PodState],
    model: str,
) -> set[str]:
    """Each node's ConfigMap, ServiceAccount, Role and RoleBinding; returns the nodes whose
    objects exist (only they may get a pod: the pod names the ServiceAccount).

    Needed: the current key of every node that gets a pod, and the key of every pod still
    there (a cordoned node keeps its pod, and so its objects). Objects of a (node, key) no
    longer needed and without a pod are deleted, the ConfigMap last.
    """
    now = time.monotonic()
    svc.ensured = {k: t for k, t in svc.ensured.items() if now - t < ENSURED_TTL_S}
    have = {(s.node, s.key) for s in states}
    need = {(n, placement.keys[n]) for n in placement.selection.create}
    need |= {(p.node, p.calibration_key or "") for p in pods if p.node in placement.selection.keep}
    missing = sorted(need - have - set(svc.ensured))

    async def create(node: str, key: str) -> None:
        described = builders.calibration_for(model, placement.labels.get(node, {}))
        for obj in builders.node_objects(owner, node, key, described):
            await state.kube.create(obj)
        svc.ensured[(node, key)] = time.monotonic()

    async def delete(st: NodeState) -> None:
        rbac = "rbac.authorization.k8s.io/v1"
        for api, kind in (("v1", "ServiceAccount"), (rbac, "RoleBinding"), (rbac, "Role")):
            await state.kube.delete(api, kind, owner.namespace, st.name)
        await state.kube.delete("v1", "ConfigMap", owner.namespace, st.name)

    used = {(p.node, p.calibration_key or "") for p in pods}
    stale = [s for s in states if (s.node, s.key) not in need and (s.node, s.key) not in used]
    results = await asyncio.gather(
        *(create(n, k) for n, k in missing), *(delete(s) for s in stale), return_exceptions=True
    )
    for result in results:
        if isinstance(result, BaseException):
            if not isinstance(result, KubeError | OSError | aiohttp.ClientError | TimeoutError):
                raise result
            svc.errors = (*svc.errors, f"node objects: {result}")
    present = have | set(svc.ensured)
    return {n for n, k in placement.keys.items() if (n, k) in present}


async def sync_service(
    state: OperatorState, owner: builders.Owner, svc: ServiceState, spec: OmniServiceSpec
) -> None:
    """The Service in front of the Ready pods: created once, patched when its spec changes."""
    if not spec.service.enabled:
        if svc.service != {}:  # once per switch-off (also after a restart)
            name = builders.service_name(owner.name)
            await state.kube.delete("v1", "Service", owner.namespace, name)
            svc.service = {}
        return
    body = builders.service(owner, spec)
    if svc.service == body["spec"]:
        return
    patch = {"spec": {"internalTrafficPolicy": body["spec"].get("internalTrafficPolicy")}}
    await state.kube.ensure(body, patch=patch)
    svc.service = body["spec"]


def _deleting(meta: Mapping[str, Any] | None) -> bool:
    return bool((meta or {}).get("deletionTimestamp"))


async def owner_live(kube: Kube, owner: builders.Owner) -> bool:
    """The API server's answer, not the watch's: the OmniService exists, is this uid and is
    not being deleted. A LIST narrowed to its name (the `list` verb kopf already holds); an
    API error propagates, so an unanswered check creates nothing."""
    path = (
        f"/apis/{API_VERSION}/namespaces/{owner.namespace}/{PLURAL}"
        f"?fieldSelector={quote(f'metadata.name={owner.name}')}"
    )
    _, body = await kube.request("GET", path)
    for item in (body or {}).get("items") or ():
        meta = item.get("metadata") or {}
        if meta.get("name") == owner.name and meta.get("uid") == owner.uid:
            return not _deleting(meta)
    return False


async def sync_pods(
    state: OperatorState,
    owner: builders.Owner,
    raw_spec: Mapping[str, Any],
    nodes_index: Mapping[str, Iterable[GpuNode]],
    pods_index: Mapping[tuple[str, str], Iterable[PodState]],
    states_index: Mapping[tuple[str, str], Iterable[NodeState]] | None = None,
    claims_index: Mapping[Any, Iterable[tuple[Claim, Mapping[str, Any]]]] | None = None,
    meta: Mapping[str, Any] | None = None,
    still_live: Callable[[], Awaitable[bool]] | None = None,
) -> reconcile.Plan | None:
    """One reconciliation pass; None when the spec is invalid or the OmniService is being
    deleted (then nothing is created: its children go with it).

    `meta` is kopf's view, which trails the API server by a watch event: a pass that began
    before a deletion (its node ConfigMaps take a while on many nodes) would still create pods
    after it. `still_live`, when given, is asked once before the pass creates any pod."""
    svc = state.service(owner.namespace, owner.name, owner.uid)
    parsed = state.parsed(svc, raw_spec)
    if not parsed.valid or parsed.spec is None or parsed.config is None:
        state.post(owner, svc, "InvalidSpec", parsed.error or "invalid spec")
        return None
    svc.posted.pop("InvalidSpec", None)
    if _deleting(meta):
        return None
    spec, config = parsed.spec, parsed.config
    placement = place(
        state, claim_of(owner, meta), parsed, index_nodes(nodes_index), index_claims(claims_index)
    )
    svc.conflicts = placement.conflicts
    if placement.conflicts:
        state.post(owner, svc, "Conflict", conflict_message(placement.conflicts))
    else:
        svc.posted.pop("Conflict", None)
    svc.errors = ()
    pods = index_pods(pods_index, owner.namespace, owner.name)
    ready_nodes = await sync_node_objects(
        state, owner, svc, placement, index_states(states_index, owner.namespace, owner.name),
        pods, config.model,
    )  # fmt: skip
    await sync_service(state, owner, svc, spec)
    selection = Selection(placement.selection.create & ready_nodes, placement.selection.keep)
    image = parsed.image or state.config.serving_image
    base_hash = parsed.template_hash or ""
    hashes = {n: builders.node_hash(base_hash, k) for n, k in placement.keys.items()}

    def build(node: str) -> dict[str, Any]:
        return builders.serving_pod(
            owner,
            spec,
            config,
            node,
            image=image,
            template_hash=hashes[node],
            node_labels=placement.labels.get(node, {}),
        )

    def trust(node: str) -> str:
        key = (base_hash, node, placement.keys[node])
        if key not in svc.trust:
            if len(svc.trust) > 4 * max(1, len(placement.keys)):
                svc.trust.clear()
            svc.trust[key] = builders.trust_view(build(node)["spec"])
        return svc.trust[key]

    now = time.monotonic()
    observed = svc.expectations.apply(pods, now)
    the_plan = reconcile.plan(
        owner.name, selection, observed, hashes, spec.rollout.max_unavailable, trust
    )
    for name in the_plan.drifted:
        log.warning("%s/%s: pod %s drifted from its built spec; replacing it",
                    owner.namespace, owner.name, name)  # fmt: skip
    if the_plan.empty:
        if not svc.errors:
            svc.posted.pop("PodCreationFailed", None)
        return the_plan
    if the_plan.create and still_live is not None and not await still_live():
        log.info("%s/%s: being deleted (API server); creating nothing",
                 owner.namespace, owner.name)  # fmt: skip
        return None
    errors = await reconcile.execute(
        state.kube, the_plan, build, svc.expectations, time.monotonic,
        stopping=lambda: _deleting(meta),
    )  # fmt: skip
    for err in errors:
        log.warning("%s/%s: %s", owner.namespace, owner.name, err)
    svc.errors = (*svc.errors, *errors)
    if errors:
        state.post(owner, svc, "PodCreationFailed", errors[0])
    return the_plan


def conflict_message(conflicts: Mapping[str, Claim]) -> str:
    shown = sorted(conflicts.items())[: status.MAX_LISTED]
    parts = [f"node {n} is owned by OmniService {w} (older)" for n, w in shown]
    more = len(conflicts) - len(shown)
    tail = f" and {more} more node(s)" if more > 0 else ""
    return "; ".join(parts) + tail + "; no pod of this OmniService runs there"


@dataclasses.dataclass(frozen=True)
class Indices:
    """kopf's live indices (updated in place by kopf; read anew on every pass)."""

    nodes: Mapping[str, Iterable[GpuNode]]
    pods: Mapping[tuple[str, str], Iterable[PodState]]
    states: Mapping[tuple[str, str], Iterable[NodeState]] | None = None
    claims: Mapping[Any, Iterable[tuple[Claim, Mapping[str, Any]]]] | None = None


def observe(
    state: OperatorState,
    owner: builders.Owner,
    body: Mapping[str, Any],
    ix: Indices,
) -> status.Observed:
    svc = state.service(owner.namespace, owner.name, owner.uid)
    meta = body.get("metadata") or {}
    parsed = state.parsed(svc, body.get("spec") or {})
    if parsed.spec is not None and parsed.config is not None:
        placement = place(
            state, claim_of(owner, meta), parsed, index_nodes(ix.nodes), index_claims(ix.claims)
        )
        selection, keys = placement.selection, placement.keys
        conflicts = {n: str(w) for n, w in placement.conflicts.items()}
    else:
        selection, keys, conflicts = Selection(frozenset(), frozenset()), {}, {}
    summaries = {
        st.node: st.summary
        for st in index_states(ix.states, owner.namespace, owner.name)
        if keys.get(st.node) == st.key
    }
    hashes = (
        {n: builders.node_hash(parsed.template_hash, k) for n, k in keys.items()}
        if parsed.template_hash
        else None
    )
    enabled = parsed.spec is not None and parsed.spec.service.enabled
    return status.Observed(
        generation=meta.get("generation"),
        spec=parsed.spec,
        config=parsed.config,
        spec_error=parsed.error,
        selection=selection,
        pods=index_pods(ix.pods, owner.namespace, owner.name),
        template_hash=parsed.template_hash,
        write_errors=svc.errors,
        summaries=summaries,
        node_hashes=hashes,
        conflicts=conflicts,
        endpoint=builders.endpoint(owner) if enabled else None,
    )


def status_patch(
    state: OperatorState,
    owner: builders.Owner,
    body: Mapping[str, Any],
    current: Mapping[str, Any],
    ix: Indices,
) -> dict[str, Any]:
    """The merge patch from the current status to the aggregated one ({} if unchanged)."""
    obs = observe(state, owner, body, ix)
    new = status.build_status(
        obs, now=state.clock(), previous=current, stale_after_s=state.config.stale_after_s
    )
    return status.merge_patch(dict(current or {}), new)


async def run_reconciler(
    state: OperatorState,
    owner: builders.Owner,
    body: Mapping[str, Any],
    indices: Callable[[], Indices],
    stopped: Any,
) -> None:
    """The per-OmniService loop: reconcile, then sleep until woken or the resync interval.

    Woken by node changes (indexer), serving-pod changes (indexer) and spec updates; the
    periodic pass catches what no event announces (a deleted node or pod, a lost watch).
    `body` is kopf's live view: a deletion request seen there stops every further create.
    """
    svc = state.service(owner.namespace, owner.name, owner.uid)
    live = functools.partial(owner_live, state.kube, owner)
    failures = 0
    while not stopped and not _deleting(body.get("metadata")):
        svc.wake.clear()
        try:
            ix = indices()
            await sync_pods(
                state, owner, body.get("spec") or {}, ix.nodes, ix.pods, ix.states, ix.claims,
                meta=body.get("metadata"), still_live=live,
            )  # fmt: skip
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
