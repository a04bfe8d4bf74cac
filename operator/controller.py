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

from horizonserve.operator import builders, model_source, reconcile, status
from horizonserve.operator.claims import Claim, lost_nodes
from horizonserve.operator.kube import Kube, KubeError, owned_by
from horizonserve.operator.model_source import SourcePolicy
from horizonserve.operator.models import API_VERSION, PLURAL, OmniServiceSpec
from horizonserve.operator.nodes import GpuNode, Selection, can_serve, labels_match, select
from horizonserve.operator.nodestate import NodeState
from horizonserve.operator.pods import PodState
from horizonserve.operator.policy import (
    Policy,
    model_refusal,
    name_refusal,
    secret_labelled,
    secret_refusal_message,
)
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


def parse(
    raw_spec: Mapping[str, Any],
    default_image: str,
    load: PipelineLoader,
    policy: Policy | None = None,
) -> Parsed:
    """The spec parsed, translated and held to the chart's policy (`policy.py`)."""
    try:
        spec = parse_spec(raw_spec)
    except SpecError as exc:
        return Parsed(None, None, str(exc), None, None)
    refusal = (policy or Policy()).refusal(
        image=spec.image,
        default_image=default_image,
        priority_class=spec.priority_class_name,
        model=spec.model,
    )
    if refusal is not None:
        return Parsed(spec, None, refusal, None, None)
    try:
        config = serving_config(spec, load)
    except SpecError as exc:
        return Parsed(spec, None, str(exc), None, None)
    if (refusal := model_refusal(config.model)) is not None:
        return Parsed(spec, None, refusal, None, None)
    registries = (policy or Policy()).allowed_registries(default_image)
    if (refusal := model_source.refusal(spec, SourcePolicy.from_env(), registries)) is not None:
        return Parsed(spec, None, refusal, None, None)
    image = spec.image or default_image
    return Parsed(spec, config, None, image, builders.spec_hash(spec, config, image))


@dataclasses.dataclass
class ServiceState:
    """Per-OmniService memory: pending writes, last Role contents, wake-up event."""

    expectations: reconcile.Expectations = dataclasses.field(default_factory=reconcile.Expectations)
    wake: asyncio.Event = dataclasses.field(default_factory=asyncio.Event)
    role_names: tuple[str, ...] | None = None  # the sidecar Role's ConfigMaps, as written
    role_uid: str | None = None  # the Role's uid: patched only with it as a precondition
    role_patched_at: float = -1e9  # monotonic time of the last Role write
    identity: bool = False  # the sidecars' ServiceAccount and RoleBinding exist and are ours
    # Objects of this OmniService's names held by someone else: kind/name → message.
    foreign: dict[str, str] = dataclasses.field(default_factory=dict)
    # Node ConfigMaps whose node left (gone, no longer matching, lost): name → since when.
    leaving: dict[str, float] = dataclasses.field(default_factory=dict)
    # Errors of the last pass that wrote something (e.g. pod creation refused by admission),
    # shown in the status until a pass succeeds.
    errors: tuple[str, ...] = ()
    # Nodes lost to an older OmniService: node → winner (condition Conflict, Events).
    conflicts: Mapping[str, Claim] = dataclasses.field(default_factory=dict)
    # Node objects (ConfigMap + RBAC) written but maybe not yet in the index: (node, key) → t.
    ensured: dict[str, float] = dataclasses.field(default_factory=dict)  # ConfigMap name → t
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
        self.policy = config.policy
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
            cached = (key, parse(raw_spec, self.config.serving_image, self.load, self.policy))
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
            svc._parsed = parse(raw_spec, self.config.serving_image, self.load, self.policy)
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
    pods_index: Mapping[tuple[str, str], Iterable[PodState]],
    namespace: str,
    name: str,
    uid: str | None = None,
) -> list[PodState]:
    """The pods owned by the OmniService; with `uid`, only those of that very object (a pod
    left by an earlier OmniService of the same name is not ours to touch)."""
    store = pods_index.get((namespace, name))
    pods = list(store) if store is not None else []
    return [p for p in pods if not uid or not p.owner_uid or p.owner_uid == uid]


def index_states(
    states_index: Mapping[tuple[str, str], Iterable[NodeState]] | None,
    namespace: str,
    name: str,
    uid: str | None = None,
) -> list[NodeState]:
    store = (states_index or {}).get((namespace, name))
    states = list(store) if store is not None else []
    return [s for s in states if not uid or not s.owner_uid or s.owner_uid == uid]


def index_claims(
    claims_index: Mapping[Any, Iterable[tuple[Claim, Mapping[str, Any]]]] | None,
) -> list[tuple[Claim, Mapping[str, Any]]]:
    return [entry for store in (claims_index or {}).values() for entry in store]


def index_names(index: Mapping[Any, Iterable[str]] | None) -> frozenset[str] | None:
    """Names of the cluster-scoped objects an index holds (None: no index, assume present)."""
    if index is None:
        return None
    return frozenset(name for store in index.values() for name in store)


@dataclasses.dataclass(frozen=True)
class Placement:
    """Where one OmniService serves after taints and conflicts, with each node's key."""

    selection: Selection
    keys: Mapping[str, str]  # node → calibration key (model × GPU × driver)
    labels: Mapping[str, Mapping[str, str]]
    conflicts: Mapping[str, Claim]
    # Nodes that exist, match the selector and are not another's: their ConfigMaps stay.
    matched: frozenset[str] = frozenset()
    uids: Mapping[str, str] = dataclasses.field(default_factory=dict)  # node → uid
    missing: tuple[str, ...] = ()  # what keeps this OmniService off every node (no class)


def _classes_missing(
    spec: OmniServiceSpec, runtime: frozenset[str] | None, priority: frozenset[str] | None
) -> tuple[str, ...]:
    out = []
    if spec.runtime_class_name and runtime is not None and spec.runtime_class_name not in runtime:
        out.append(f"spec.runtimeClassName: RuntimeClass {spec.runtime_class_name!r} not found")
    name = spec.priority_class_name
    if name and priority is not None and name not in priority:
        out.append(f"spec.priorityClassName: PriorityClass {name!r} not found")
    return tuple(out)


def place(
    state: OperatorState,
    me: Claim,
    parsed: Parsed,
    nodes: list[GpuNode],
    claims: list[tuple[Claim, Mapping[str, Any]]],
    all_pods: Iterable[PodState] = (),
    runtime_classes: frozenset[str] | None = None,
    priority_classes: frozenset[str] | None = None,
) -> Placement:
    """Selection (labels, taints), minus nodes another OmniService owns (`claims.py`).

    Every claim, this one included, contends only for the nodes it can serve (labels,
    tolerated taints, RuntimeClass and PriorityClass present) or already holds a pod on; the
    same function decides for every claim, so all reconcilers agree.
    """
    assert parsed.spec is not None and parsed.config is not None
    now = state.clock()
    classes = (runtime_classes, priority_classes)
    selection = select(parsed.spec, nodes, now, state.taint_since)
    occupants: dict[str, set[str]] = {}
    for pod in all_pods:
        if pod.owner_uid:
            occupants.setdefault(pod.node, set()).add(pod.owner_uid)

    def contends(claim: Claim, spec: OmniServiceSpec) -> frozenset[str]:
        if _classes_missing(spec, *classes):
            return frozenset(n.name for n in nodes if claim.uid in occupants.get(n.name, ()))
        return frozenset(
            n.name
            for n in nodes
            if can_serve(spec, n, now, state.taint_since) or claim.uid in occupants.get(n.name, ())
        )

    missing = _classes_missing(parsed.spec, *classes)
    mine = contends(me, parsed.spec) & selection.keep
    wanted: dict[Claim, frozenset[str]] = {me: mine}
    for claim, raw in claims:
        if claim.uid == me.uid:
            continue
        other = state.parsed_claim(claim.uid, raw)
        if other.spec is not None and other.valid:
            wanted[claim] = contends(claim, other.spec) & selection.keep
    by_name = {n.name: n for n in nodes}
    gpus = {n: by_name[n].gpus for n in selection.keep}
    lost = lost_nodes(me, wanted, gpus, occupants) if len(wanted) > 1 else {}
    create = selection.create - set(lost)
    if missing:
        create = frozenset()  # admission would refuse every pod
    selection = Selection(frozenset(create), selection.keep - set(lost))
    matched = frozenset(n.name for n in nodes if labels_match(parsed.spec, n)) - set(lost)
    labels = {n: by_name[n].labels for n in selection.keep | matched}
    keys = {n: builders.calibration_key(parsed.config.model, labels[n]) for n in labels}
    uids = {n: by_name[n].uid for n in labels}
    return Placement(selection, keys, labels, lost, matched, uids, missing)


def claim_of(owner: builders.Owner, meta: Mapping[str, Any] | None) -> Claim:
    return Claim(
        owner.namespace, owner.name, owner.uid, str((meta or {}).get("creationTimestamp", ""))
    )


# --- the steps -----------------------------------------------------------------------------


def _tolerated(result: BaseException) -> bool:
    return isinstance(result, KubeError | OSError | aiohttp.ClientError | TimeoutError)


async def sync_node_states(
    state: OperatorState,
    owner: builders.Owner,
    svc: ServiceState,
    placement: Placement,
    states: list[NodeState],
    pods: list[PodState],
    model: str,
    may_create: Callable[[], Awaitable[bool]],
) -> dict[str, str]:
    """Each node's ConfigMap; returns node → ConfigMap name for the nodes whose ConfigMap
    exists (only they may get a pod: the pod mounts it and the sidecar patches it).

    Created for every node that gets a pod (one API write per node). Kept while the node
    exists and matches the selector (a drain, a cordon, a NoSchedule taint or an evicted pod
    keep it), and for `node_state_grace_s` after it left; a ConfigMap of an obsolete key on
    a node that still matches (a new GPU or driver: calibrate again) goes as soon as no pod
    uses it.
    """
    now = time.monotonic()
    svc.ensured = {k: t for k, t in svc.ensured.items() if now - t < ENSURED_TTL_S}
    by_name = {s.name: s for s in states}

    def name_of(node: str, key: str) -> str:
        return builders.node_state_name(owner, node, placement.uids.get(node, ""), key)

    current = {n: name_of(n, k) for n, k in placement.keys.items()}
    keep = {current[n] for n in placement.matched | placement.selection.keep if n in current}
    keep |= {
        name_of(p.node, p.calibration_key or "")
        for p in pods
        if p.node in placement.selection.keep and not p.deleting
    }
    wanted = {n: current[n] for n in placement.selection.create}
    missing = sorted(
        (n, name) for n, name in wanted.items() if name not in by_name and name not in svc.ensured
    )

    async def create(node: str, name: str) -> None:
        if not await may_create():  # a delete that lands mid-way stops the rest
            return
        described = builders.calibration_for(model, placement.labels.get(node, {}))
        body = builders.node_state(
            owner, node, placement.uids.get(node, ""), placement.keys[node], described
        )
        outcome, _ = await state.kube.create_owned(body, owner.uid)
        if outcome == "foreign":
            svc.foreign[f"ConfigMap/{name}"] = _foreign_message("ConfigMap", name)
        elif outcome != "gone":  # gone: deleted right after a 409, the next pass creates it
            svc.ensured[name] = time.monotonic()

    # Stale: ours (the index holds owned ConfigMaps only), not kept, no pod on it.
    stale: list[NodeState] = []
    used = {name_of(p.node, p.calibration_key or "") for p in pods}
    for st in states:
        if st.name in keep or st.name in used:
            svc.leaving.pop(st.name, None)
            continue
        if st.node in placement.matched:  # the node matches under another name: obsolete key
            stale.append(st)
            continue
        since = svc.leaving.setdefault(st.name, now)
        if now - since >= state.config.node_state_grace_s:
            stale.append(st)
    svc.leaving = {n: t for n, t in svc.leaving.items() if n in by_name}

    async def delete(st: NodeState) -> None:
        await state.kube.delete("v1", "ConfigMap", owner.namespace, st.name, st.uid or None)
        svc.leaving.pop(st.name, None)

    results = await asyncio.gather(
        *(create(n, name) for n, name in missing),
        *(delete(s) for s in stale),
        return_exceptions=True,
    )
    for result in results:
        if isinstance(result, BaseException):
            if not _tolerated(result):
                raise result
            svc.errors = (*svc.errors, f"node ConfigMaps: {result}")
    present = set(by_name) | set(svc.ensured)
    return {n: name for n, name in current.items() if name in present}


def _foreign_message(kind: str, name: str) -> str:
    return (
        f"{kind} {name!r} exists and is not owned by this OmniService: it is left untouched; "
        f"rename the OmniService or remove that {kind}"
    )


ROLE_BATCH_S = 1.0  # at most one Role write per this interval (nodes arriving in a burst)


async def sync_identity(
    state: OperatorState,
    owner: builders.Owner,
    svc: ServiceState,
    configmaps: list[str],
    may_create: Callable[[], Awaitable[bool]],
) -> frozenset[str]:
    """The sidecars' ServiceAccount, Role (patch on the node ConfigMaps) and RoleBinding,
    shared by all pods of the OmniService: three writes per OmniService, plus at most one
    Role patch per ROLE_BATCH_S while nodes come and go. Returns the ConfigMaps the Role
    grants now: only their nodes may get a pod (empty without the identity)."""
    names = tuple(sorted(set(configmaps)))
    granted = frozenset(svc.role_names or ()) if svc.identity else frozenset()
    if svc.identity and svc.role_names == names:
        return granted
    if svc.identity and svc.role_names is not None and svc.role_uid:
        wait = svc.role_patched_at + ROLE_BATCH_S - time.monotonic()
        if wait > 0:  # batch: the nodes waiting for the Role get their pods a moment later
            asyncio.get_running_loop().call_later(wait, svc.wake.set)
            return granted
        if set(names) - granted and not await may_create():
            return granted
        role = builders.sidecar_role(owner, list(names))
        # A merge patch replaces the list (exactly these names, never an empty list); the uid
        # precondition makes it fail on any Role but ours.
        patch = {"metadata": {"uid": svc.role_uid}, "rules": role["rules"]}
        try:
            present = await state.kube.patch(role, patch)
        except KubeError as exc:
            if exc.status != 409:
                raise
            present = False  # replaced by another object of the name: check it anew
        svc.role_patched_at = time.monotonic()
        if present:
            svc.role_names = names
            return frozenset(names)
        svc.identity, svc.role_names, svc.role_uid = False, None, None
    if not await may_create():
        return frozenset()

    async def ensure(body: dict[str, Any]) -> Mapping[str, Any] | None:
        outcome, stored = await state.kube.create_owned(body, owner.uid)
        if outcome == "foreign":
            kind, name = body["kind"], body["metadata"]["name"]
            svc.foreign[f"{kind}/{name}"] = _foreign_message(kind, name)
        if outcome in ("foreign", "gone"):  # gone: deleted after a 409; the next pass
            return None
        return stored or {}

    if await ensure(builders.sidecar_service_account(owner)) is None:
        return frozenset()
    # The Role before its RoleBinding: the API server checks a binding against its Role.
    role = builders.sidecar_role(owner, list(names))
    stored = await ensure(role)
    if stored is None:
        return frozenset()
    svc.role_uid = str((stored.get("metadata") or {}).get("uid") or "") or None
    if stored.get("rules") != role["rules"]:
        await state.kube.patch(role, {"metadata": {"uid": svc.role_uid}, "rules": role["rules"]})
    svc.role_names, svc.role_patched_at = names, time.monotonic()
    if await ensure(builders.sidecar_role_binding(owner)) is None:
        return frozenset()
    svc.identity = True
    return frozenset(names)


async def sync_service(
    state: OperatorState,
    owner: builders.Owner,
    svc: ServiceState,
    spec: OmniServiceSpec,
    may_create: Callable[[], Awaitable[bool]] | None = None,
) -> None:
    """The Service in front of the Ready pods: created once, patched when its spec changes,
    deleted when switched off: each only when the Service is ours (owner reference with our
    uid). A Service of the name that is someone else's is never touched: Conflict."""
    key = f"Service/{builders.service_name(owner.name)}"
    if not spec.service.enabled:
        svc.foreign.pop(key, None)
        if svc.service != {}:  # once per switch-off (also after a restart)
            body = builders.service(owner, spec)
            existing = await state.kube.get(body)
            if existing is not None and owned_by(existing, owner.uid):
                uid = (existing.get("metadata") or {}).get("uid")
                await state.kube.delete("v1", "Service", owner.namespace, body["metadata"]["name"],
                                        uid)  # fmt: skip
            svc.service = {}
        return
    body = builders.service(owner, spec)
    if svc.service == body["spec"] and key not in svc.foreign:
        return
    if may_create is not None and not await may_create():
        return
    outcome, existing = await state.kube.create_owned(body, owner.uid)
    if outcome in ("foreign", "gone"):  # gone: deleted right after a 409; the next pass
        if outcome == "foreign":
            svc.foreign[key] = _foreign_message("Service", body["metadata"]["name"])
        svc.service = None
        return
    svc.foreign.pop(key, None)
    if outcome == "ours":
        want = body["spec"].get("internalTrafficPolicy")
        if ((existing or {}).get("spec") or {}).get("internalTrafficPolicy") != want:
            await state.kube.patch(body, {"spec": {"internalTrafficPolicy": want}})
    svc.service = body["spec"]


async def secret_refusal(kube: Kube, namespace: str, name: str) -> str | None:
    """The referenced Secret must carry the allowing label: its metadata only is read
    (PartialObjectMetadata), never its data."""
    path = f"/api/v1/namespaces/{namespace}/secrets/{name}"
    status, body = await kube.request("GET", path, ok=(404,), accept=PARTIAL_METADATA)
    if status == 404:
        return secret_refusal_message(name, found=False)
    labels = ((body or {}).get("metadata") or {}).get("labels")
    return None if secret_labelled(labels) else secret_refusal_message(name, found=True)


PARTIAL_METADATA = "application/json;as=PartialObjectMetadata;g=meta.k8s.io;v=v1"


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


class _LiveGate:
    """`still_live`, asked before every create unless asked within LIVE_TTL_S (concurrent
    creates share one question), so a delete that lands mid-pass stops the creates that
    follow; False at once when kopf's view already shows the deletion, and for good once the
    API server said so."""

    def __init__(
        self, still_live: Callable[[], Awaitable[bool]] | None, meta: Mapping[str, Any] | None
    ) -> None:
        self._ask = still_live
        self._meta = meta
        self._answer: bool | None = None
        self._at = 0.0
        self._lock = asyncio.Lock()  # concurrent creates share one question

    @property
    def answer(self) -> bool | None:
        """What the API server said last (None: not asked in this pass)."""
        return self._answer

    async def __call__(self) -> bool:
        if _deleting(self._meta) or self._answer is False:
            return False
        if self._ask is None:
            return True
        async with self._lock:
            if self._answer is None or time.monotonic() - self._at > LIVE_TTL_S:
                self._answer = await self._ask()
                self._at = time.monotonic()
        return self._answer


LIVE_TTL_S = 0.25  # a delete stops the creates that start this long after it, at most


def _all_pods(pods_index: Mapping[tuple[str, str], Iterable[PodState]]) -> list[PodState]:
    return [p for store in pods_index.values() for p in store]


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
    runtime_classes: frozenset[str] | None = None,
    priority_classes: frozenset[str] | None = None,
) -> reconcile.Plan | None:
    """One reconciliation pass; None when the spec is invalid or the OmniService is being
    deleted (then nothing is created: its children go with it).

    `meta` is kopf's view, which trails the API server by a watch event: a pass that began
    before a deletion would still create objects after it. `still_live`, when given, is asked
    before the pass creates anything (ConfigMap, identity, Service or pod)."""
    svc = state.service(owner.namespace, owner.name, owner.uid)
    parsed = state.parsed(svc, raw_spec)
    error = name_refusal(owner.name) or parsed.error
    if error is not None or parsed.spec is None or parsed.config is None:
        state.post(owner, svc, "InvalidSpec", error or "invalid spec")
        return None
    svc.posted.pop("InvalidSpec", None)
    if _deleting(meta):
        return None
    spec, config = parsed.spec, parsed.config
    all_pods = _all_pods(pods_index)
    placement = place(
        state, claim_of(owner, meta), parsed, index_nodes(nodes_index), index_claims(claims_index),
        all_pods, runtime_classes, priority_classes,
    )  # fmt: skip
    svc.conflicts = placement.conflicts
    svc.errors = tuple(placement.missing)
    pods = index_pods(pods_index, owner.namespace, owner.name, owner.uid)
    states = index_states(states_index, owner.namespace, owner.name, owner.uid)
    live = _LiveGate(still_live, meta)  # asked once per pass, before the first create
    configmaps = await sync_node_states(
        state, owner, svc, placement, states, pods, config.model, live
    )
    await sync_service(state, owner, svc, spec, live)
    granted = await sync_identity(state, owner, svc, list(configmaps.values()), live)
    if live.answer is False:
        log.info("%s/%s: being deleted (API server); creating nothing",
                 owner.namespace, owner.name)  # fmt: skip
        return None
    # One Conflict Event per distinct situation: nodes lost, names taken by foreign objects.
    conflicts = sorted(svc.foreign.values())
    if placement.conflicts:
        conflicts.append(conflict_message(placement.conflicts))
    if conflicts:
        state.post(owner, svc, "Conflict", "; ".join(conflicts))
    else:
        svc.posted.pop("Conflict", None)
    # A pod only where its ConfigMap exists and the sidecars' Role already grants it.
    ready_nodes = {n for n, name in configmaps.items() if name in granted}
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
            node_uid=placement.uids.get(node, ""),
        )

    def trust(node: str) -> str:
        key = (base_hash, node, placement.keys[node], placement.uids.get(node, ""))
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
    if the_plan.create and (spec.api_key_secret or model_source.token_secret(spec)):
        refused = (
            await secret_refusal(state.kube, owner.namespace, spec.api_key_secret.name)
            if spec.api_key_secret is not None
            else None
        ) or await model_source.token_refusal(state.kube, owner.namespace, spec)
        if refused is not None:
            svc.errors = (*svc.errors, refused)
            state.post(owner, svc, "SecretNotAllowed", refused)
            the_plan = dataclasses.replace(the_plan, create=())
        else:
            svc.posted.pop("SecretNotAllowed", None)
    if the_plan.empty:
        if not svc.errors:
            svc.posted.pop("PodCreationFailed", None)
        return the_plan
    if the_plan.create and not await live():
        log.info("%s/%s: being deleted (API server); creating nothing",
                 owner.namespace, owner.name)  # fmt: skip
        return None
    errors = await reconcile.execute(
        state.kube, the_plan, build, svc.expectations, time.monotonic,
        stopping=lambda: _deleting(meta), still_live=live,
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
    runtime_classes: Mapping[Any, Iterable[str]] | None = None
    priority_classes: Mapping[Any, Iterable[str]] | None = None


def bound_summaries(
    owner: builders.Owner, placement: Placement, states: list[NodeState]
) -> tuple[dict[str, str | None], list[str]]:
    """node → summary, each read only from the ConfigMap bound to that node (its name); and
    the ConfigMaps whose labels claim another node than their name binds them to (ignored)."""
    bound = {
        builders.node_state_name(owner, n, placement.uids.get(n, ""), k): n
        for n, k in placement.keys.items()
    }
    summaries: dict[str, str | None] = {}
    mismatched: list[str] = []
    for st in states:
        node = bound.get(st.name)
        if node is not None:
            summaries[node] = st.summary
            if st.node and st.node != node:
                mismatched.append(
                    f"ConfigMap {st.name} is bound to node {node} but labelled {st.node!r}: "
                    "its labels are ignored"
                )
        elif st.node in placement.keys and st.summary:
            mismatched.append(
                f"ConfigMap {st.name} claims node {st.node} but is not bound to it: its "
                "summary is ignored"
            )
    return summaries, sorted(mismatched)


def observe(
    state: OperatorState,
    owner: builders.Owner,
    body: Mapping[str, Any],
    ix: Indices,
) -> status.Observed:
    svc = state.service(owner.namespace, owner.name, owner.uid)
    meta = body.get("metadata") or {}
    parsed = state.parsed(svc, body.get("spec") or {})
    summaries: dict[str, str | None] = {}
    name_error = name_refusal(owner.name)
    if parsed.spec is not None and parsed.config is not None and name_error is None:
        placement = place(
            state, claim_of(owner, meta), parsed, index_nodes(ix.nodes), index_claims(ix.claims),
            _all_pods(ix.pods), index_names(ix.runtime_classes), index_names(ix.priority_classes),
        )  # fmt: skip
        selection, keys = placement.selection, placement.keys
        conflicts = {n: str(w) for n, w in placement.conflicts.items()}
        states = index_states(ix.states, owner.namespace, owner.name, owner.uid)
        summaries, mismatched = bound_summaries(owner, placement, states)
        if mismatched:
            log.warning("%s/%s: %s", owner.namespace, owner.name, "; ".join(mismatched))
            state.post(owner, svc, "SummaryIgnored", "; ".join(mismatched))
    else:
        selection, keys, conflicts = Selection(frozenset(), frozenset()), {}, {}
    hashes = (
        {n: builders.node_hash(parsed.template_hash, k) for n, k in keys.items()}
        if parsed.template_hash
        else None
    )
    enabled = parsed.spec is not None and parsed.spec.service.enabled
    service_key = f"Service/{builders.service_name(owner.name)}"
    ours = enabled and name_error is None and service_key not in svc.foreign
    return status.Observed(
        generation=meta.get("generation"),
        spec=parsed.spec,
        config=parsed.config,
        spec_error=name_error or parsed.error,
        selection=selection,
        pods=index_pods(ix.pods, owner.namespace, owner.name, owner.uid),
        template_hash=parsed.template_hash,
        write_errors=svc.errors,
        summaries=summaries,
        node_hashes=hashes,
        conflicts=conflicts,
        # The endpoint only when the Service of that name is ours: never someone else's pods.
        endpoint=builders.endpoint(owner) if ours else None,
        foreign=tuple(sorted(svc.foreign.values())),
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
    if (event := model_source.weights_event(current, new)) is not None:
        model_source.post_event(owner, *event)  # WeightsReady changed its reason
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
                runtime_classes=index_names(ix.runtime_classes),
                priority_classes=index_names(ix.priority_classes),
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
