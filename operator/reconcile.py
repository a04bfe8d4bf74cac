"""Converge an OmniService's serving pods onto its matching GPU nodes.

`plan` is a pure function: (wanted nodes, observed pods, template hash) → pods to create and
pods to delete. It is level-triggered: the same inputs give the same answer whether the
operator just started, restarted mid-way, or missed events, so a restart never duplicates
pods (names are deterministic, `<osvc>-<node>`, and a create that meets an existing pod is
a no-op). `Expectations` cover the short gap between a write and the watch event that
reports it, so a burst of node events does not re-issue the same create or delete.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Awaitable, Callable, Iterable, Mapping
from typing import Any

from horizonserve.operator.builders import LABEL_SPEC_HASH, drifted, pod_name
from horizonserve.operator.kube import Kube, KubeError, object_path
from horizonserve.operator.nodes import Selection
from horizonserve.operator.pods import PodState

log = logging.getLogger(__name__)

EXPECTATION_TTL_S = 30.0


@dataclasses.dataclass(frozen=True)
class Plan:
    create: tuple[str, ...] = ()  # node names that get a new pod
    delete: tuple[PodState, ...] = ()  # pods to delete (wrong node, stray name, outdated)
    unavailable: int = 0  # wanted nodes without a ready pod, after this plan
    drifted: tuple[str, ...] = ()  # pods deleted because their spec is not what was built

    @property
    def empty(self) -> bool:
        return not self.create and not self.delete


def plan(
    osvc: str,
    selection: Selection,
    pods: Iterable[PodState],
    template_hash: str | Mapping[str, str],
    max_unavailable: int = 1,
    trust: Callable[[str], str] | None = None,
) -> Plan:
    """What to create and delete so every wanted node runs one current pod.

    * A pod on a node no longer kept, or not named `<osvc>-<node>`, is deleted.
    * A wanted node without a pod gets one (a node that is only kept, i.e. cordoned, does not).
    * An outdated pod (template hash differs) that is not ready is replaced at once: it
      serves nothing, and waiting on it would let a broken spec block its own fix.
    * Outdated ready pods are replaced while fewer than `max_unavailable` wanted nodes lack a
      ready pod; the rest wait for the next round.
    * A pod being deleted blocks its node until it is gone (the successor reuses the name).
    * An up-to-date pod whose spec differs from what the operator builds for its node
      (`trust(node)`, a `builders.trust_view`; say an image changed in place) is replaced at
      once, ready or not: the label says current, the spec says otherwise.

    `template_hash` is one hash for every node or the expected hash per node.
    """

    def expected(node: str) -> str:
        if isinstance(template_hash, str):
            return template_hash
        return template_hash.get(node, "")

    by_node: dict[str, PodState] = {}
    replaced: list[str] = []  # drifted pods
    delete: list[PodState] = []
    for pod in sorted(pods, key=lambda p: p.name):
        stray = pod.node not in selection.keep or pod.name != pod_name(osvc, pod.node)
        if stray or pod.node in by_node:
            if not pod.deleting:
                delete.append(pod)
            continue
        by_node[pod.node] = pod

    create: list[str] = []
    outdated_ready: list[PodState] = []
    unavailable = 0
    for node in sorted(selection.keep):
        pod = by_node.get(node)
        if pod is None:
            if node in selection.create:
                create.append(node)
                unavailable += 1
            continue
        if pod.deleting:
            unavailable += 1
        elif (
            trust is not None
            and pod.trust
            and pod.spec_hash == expected(node)
            and drifted(pod.trust, trust(node))
        ):
            delete.append(pod)
            replaced.append(pod.name)
            unavailable += 1
        elif pod.spec_hash != expected(node) and node in selection.create:
            if pod.ready:
                outdated_ready.append(pod)
            else:
                delete.append(pod)
                unavailable += 1
        elif not pod.ready:
            unavailable += 1
    budget = max(0, max_unavailable - unavailable)
    delete.extend(outdated_ready[:budget])
    unavailable += min(budget, len(outdated_ready))
    return Plan(
        create=tuple(create), delete=tuple(delete), unavailable=unavailable, drifted=tuple(replaced)
    )


class Expectations:
    """Writes not yet seen in the pod index (per OmniService).

    A created pod counts as present (not ready) until the index shows it; a deleted pod
    counts as terminating until the index drops it; both expire after `ttl_s` so that a lost
    event cannot wedge a node.
    """

    def __init__(self, ttl_s: float = EXPECTATION_TTL_S) -> None:
        self.ttl_s = ttl_s
        self._created: dict[str, tuple[PodState, float]] = {}
        self._deleted: dict[str, float] = {}  # uid → when

    def created(self, pod: PodState, now: float) -> None:
        self._created[pod.name] = (pod, now)

    def deleted(self, pod: PodState, now: float) -> None:
        self._deleted[pod.uid] = now
        self._created.pop(pod.name, None)

    def apply(self, observed: Iterable[PodState], now: float) -> list[PodState]:
        observed = list(observed)
        names = {p.name for p in observed}
        uids = {p.uid for p in observed}
        self._created = {
            n: (p, t)
            for n, (p, t) in self._created.items()
            if n not in names and now - t < self.ttl_s
        }
        self._deleted = {
            u: t for u, t in self._deleted.items() if u in uids and now - t < self.ttl_s
        }
        merged = [
            dataclasses.replace(p, deleting=True, ready=False) if p.uid in self._deleted else p
            for p in observed
        ]
        return merged + [p for p, _ in self._created.values()]


async def _ours(kube: Kube, body: Mapping[str, Any]) -> bool:
    """After a 409: is the existing pod ours (a create that raced its own watch event)?"""
    status, existing = await kube.request("GET", object_path(body), ok=(404,))
    if status == 404:
        return True  # gone again (being replaced): the next pass decides
    owners = {r.get("uid") for r in (existing.get("metadata") or {}).get("ownerReferences") or ()}
    return any(r["uid"] in owners for r in body["metadata"]["ownerReferences"])


async def execute(
    kube: Kube,
    the_plan: Plan,
    build_pod: Callable[[str], Mapping[str, Any]],
    expectations: Expectations,
    now: Callable[[], float],
    stopping: Callable[[], bool] = lambda: False,
    still_live: Callable[[], Awaitable[bool]] | None = None,
) -> list[str]:
    """Carry out a plan concurrently; returns error messages (the rest still happens).

    `stopping` is asked before every create: once the OmniService is being deleted, no pod
    more is created, also not by a pass already under way.
    """
    errors: list[str] = []

    async def create(node: str) -> None:
        # `still_live` (the API server's word, cached briefly) before every create: a delete
        # that lands mid-way stops the rest; what is in flight then still completes.
        if stopping() or (still_live is not None and not await still_live()):
            return
        body = build_pod(node)
        meta = body["metadata"]
        try:
            outcome = await kube.create(body)
            if outcome == "exists" and not await _ours(kube, body):
                errors.append(
                    f"create pod for node {node}: the name {meta['name']} is taken by a pod "
                    "that this OmniService does not own"
                )
        except KubeError as exc:
            errors.append(f"create pod for node {node}: {exc}")
            return
        log.info("pod %s/%s for node %s: %s", meta["namespace"], meta["name"], node, outcome)
        labels = meta.get("labels", {})
        expectations.created(
            PodState(
                name=meta["name"],
                namespace=meta["namespace"],
                uid="",
                node=node,
                spec_hash=labels.get(LABEL_SPEC_HASH),
                phase="Pending",
            ),
            now(),
        )

    async def delete(pod: PodState) -> None:
        try:
            outcome = await kube.delete("v1", "Pod", pod.namespace, pod.name, pod.uid or None)
        except KubeError as exc:
            errors.append(f"delete pod {pod.name}: {exc}")
            return
        log.info("pod %s/%s (node %s): %s", pod.namespace, pod.name, pod.node, outcome)
        expectations.deleted(pod, now())

    await asyncio.gather(
        *(create(n) for n in the_plan.create), *(delete(p) for p in the_plan.delete)
    )
    return errors
