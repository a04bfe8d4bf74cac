"""GPU nodes: what the node index keeps about each, and which nodes an OmniService wants.

All pure functions over plain data: the kopf indexer turns a Node object into a compact
`GpuNode`, and `select` decides per OmniService, so the selection rules are unit-testable
without any API server.
"""

from __future__ import annotations

import dataclasses
import datetime
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from horizonserve.operator.models import GPU_RESOURCE, OmniServiceSpec

GPU_PRESENT_LABEL = "nvidia.com/gpu.present"  # set by NVIDIA GPU feature discovery
GPU_COUNT_LABEL = "nvidia.com/gpu.count"
# Taints the node lifecycle controller sets for node conditions and cordons. They describe a
# transient state, not who may run there: the scheduler and the pod's own tolerations handle
# them, so they never decide whether a node is wanted.
CONDITION_TAINT_PREFIX = "node.kubernetes.io/"
_BLOCKING_EFFECTS = ("NoSchedule", "NoExecute")
# When a taint appeared (Unix time), for tolerationSeconds: its `timeAdded`, else when the
# operator first saw it (the caller remembers that).
TaintClock = Callable[[str, Mapping[str, str]], float]


@dataclasses.dataclass(frozen=True)
class GpuNode:
    """The part of a Node the operator looks at (kept in the kopf index, compared on change)."""

    name: str
    labels: Mapping[str, str]
    taints: tuple[Mapping[str, str], ...] = ()
    gpus: int = 1
    unschedulable: bool = False
    uid: str = ""  # binds the node's ConfigMap to this node object


def _quantity_int(value: Any) -> int:
    try:
        return int(str(value))
    except (TypeError, ValueError):
        return 0


def gpu_count(labels: Mapping[str, str], status: Mapping[str, Any]) -> int:
    """NVIDIA GPUs the node offers: allocatable/capacity, else GPU-feature-discovery labels."""
    for field in ("allocatable", "capacity"):
        count = _quantity_int((status.get(field) or {}).get(GPU_RESOURCE))
        if count > 0:
            return count
    if labels.get(GPU_PRESENT_LABEL) == "true":
        return max(1, _quantity_int(labels.get(GPU_COUNT_LABEL, 1)))
    return 0


def is_gpu_node(labels: Mapping[str, str], status: Mapping[str, Any]) -> bool:
    return gpu_count(labels, status) > 0


def gpu_node(
    name: str,
    labels: Mapping[str, str],
    spec: Mapping[str, Any],
    status: Mapping[str, Any],
    uid: str = "",
) -> GpuNode:
    taints = tuple(
        {k: str(t[k]) for k in ("key", "value", "effect", "timeAdded") if t.get(k) is not None}
        for t in spec.get("taints") or ()
        if t.get("effect") in _BLOCKING_EFFECTS
        and not str(t.get("key", "")).startswith(CONDITION_TAINT_PREFIX)
    )
    return GpuNode(
        name=name,
        labels=dict(labels),
        taints=taints,
        gpus=gpu_count(labels, status),
        unschedulable=bool(spec.get("unschedulable")),
        uid=uid,
    )


def labels_match(spec: OmniServiceSpec, node: GpuNode) -> bool:
    return all(node.labels.get(k) == v for k, v in spec.node_selector.items())


def time_added(taint: Mapping[str, str]) -> float | None:
    raw = taint.get("timeAdded")
    if not raw:
        return None
    try:
        return datetime.datetime.fromisoformat(raw.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def placement(
    spec: OmniServiceSpec, node: GpuNode, now: float, since: TaintClock | None = None
) -> tuple[bool, bool]:
    """(keep, create) for one labelled node, by Kubernetes taint semantics.

    * NoSchedule not tolerated: no new pod, a running one stays (as the scheduler does).
    * NoExecute not tolerated: the pod goes. Tolerated with tolerationSeconds: it stays that
      long after the taint appeared (the shortest matching toleration counts), then goes.
    * A cordoned node (unschedulable) keeps its pod and gets no new one.
    """
    create = not node.unschedulable
    for taint in node.taints:
        matching = [t for t in spec.tolerations if t.tolerates(taint)]
        if taint.get("effect") == "NoSchedule":
            create = create and bool(matching)
            continue
        if not matching:
            return False, False
        seconds = [t.toleration_seconds for t in matching]
        if all(s is not None for s in seconds):  # every match is time-limited
            start = time_added(taint)
            if start is None:
                start = since(node.name, taint) if since else now
            if now >= start + min(s for s in seconds if s is not None):
                return False, False
    return True, create


def can_serve(spec: OmniServiceSpec, node: GpuNode, now: float, since: TaintClock | None) -> bool:
    """The OmniService could run a new pod on the node, a cordon aside (a cordon is transient:
    it never decides who owns a node): labels match and every blocking taint is tolerated."""
    if not labels_match(spec, node):
        return False
    stays, new = placement(spec, dataclasses.replace(node, unschedulable=False), now, since)
    return stays and new


def matches(spec: OmniServiceSpec, node: GpuNode, now: float = 0.0) -> bool:
    """The node may hold a pod of this OmniService (labels and taints)."""
    return labels_match(spec, node) and placement(spec, node, now)[0]


@dataclasses.dataclass(frozen=True)
class Selection:
    """`create`: nodes that should get a pod; `keep`: nodes whose pod may stay (⊇ create).

    A cordoned node keeps its running pod (a drain evicts it explicitly) but gets no new one.
    """

    create: frozenset[str]
    keep: frozenset[str]


def select(
    spec: OmniServiceSpec,
    nodes: Iterable[GpuNode],
    now: float = 0.0,
    since: TaintClock | None = None,
) -> Selection:
    keep: set[str] = set()
    create: set[str] = set()
    for node in nodes:
        if not labels_match(spec, node):
            continue
        stays, new = placement(spec, node, now, since)
        if stays:
            keep.add(node.name)
        if stays and new:
            create.add(node.name)
    return Selection(create=frozenset(create), keep=frozenset(keep))
