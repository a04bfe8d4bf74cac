"""GPU nodes: what the node index keeps about each, and which nodes an OmniService wants.

All pure functions over plain data: the kopf indexer turns a Node object into a compact
`GpuNode`, and `select` decides per OmniService, so the selection rules are unit-testable
without any API server.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from typing import Any

from horizonserve.operator.models import GPU_RESOURCE, OmniServiceSpec

GPU_PRESENT_LABEL = "nvidia.com/gpu.present"  # set by NVIDIA GPU feature discovery
GPU_COUNT_LABEL = "nvidia.com/gpu.count"
# Taints the node lifecycle controller sets for node conditions and cordons. They describe a
# transient state, not who may run there: the scheduler and the pod's own tolerations handle
# them, so they never decide whether a node is wanted.
CONDITION_TAINT_PREFIX = "node.kubernetes.io/"
_BLOCKING_EFFECTS = ("NoSchedule", "NoExecute")


@dataclasses.dataclass(frozen=True)
class GpuNode:
    """The part of a Node the operator looks at (kept in the kopf index, compared on change)."""

    name: str
    labels: Mapping[str, str]
    taints: tuple[Mapping[str, str], ...] = ()
    gpus: int = 1
    unschedulable: bool = False


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
    name: str, labels: Mapping[str, str], spec: Mapping[str, Any], status: Mapping[str, Any]
) -> GpuNode:
    taints = tuple(
        {k: str(t[k]) for k in ("key", "value", "effect") if t.get(k) is not None}
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
    )


def matches(spec: OmniServiceSpec, node: GpuNode) -> bool:
    """The node carries the selector's labels and every blocking taint is tolerated."""
    if any(node.labels.get(k) != v for k, v in spec.node_selector.items()):
        return False
    return all(any(t.tolerates(taint) for t in spec.tolerations) for taint in node.taints)


@dataclasses.dataclass(frozen=True)
class Selection:
    """`create`: nodes that should get a pod; `keep`: nodes whose pod may stay (⊇ create).

    A cordoned node keeps its running pod (a drain evicts it explicitly) but gets no new one.
    """

    create: frozenset[str]
    keep: frozenset[str]


def select(spec: OmniServiceSpec, nodes: Iterable[GpuNode]) -> Selection:
    wanted = [n for n in nodes if matches(spec, n)]
    keep = {n.name for n in wanted}
    create = {n.name for n in wanted if not n.unschedulable}
    return Selection(create=frozenset(create), keep=frozenset(keep))
