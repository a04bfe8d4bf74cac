"""What the ConfigMap index keeps about each node's ConfigMap (pure functions over its body).

`node` and `key` come from labels and annotations, which the sidecar's `patch` could change:
they are hints (which node a ConfigMap was made for, for its cleanup), never the binding. The
operator binds a ConfigMap to a node by its name (`builders.node_state_name`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from horizonserve.operator.builders import ANNOTATION_NODE, LABEL_CALIBRATION_KEY, LABEL_NODE
from horizonserve.operator.pods import owner_uid
from horizonserve.runtime.config import SUMMARY_KEY


@dataclasses.dataclass(frozen=True)
class NodeState:
    """One node's ConfigMap: which node and calibration key, and the sidecar's summary."""

    name: str
    namespace: str
    node: str
    key: str
    summary: str | None = None  # the sidecar's raw NodeSummary JSON
    artifacts: int = 0  # calibration artifacts stored
    owner_uid: str = ""
    uid: str = ""  # the ConfigMap's own uid (delete precondition)


def node_state(meta: Mapping[str, Any], data: Mapping[str, Any] | None) -> NodeState:
    labels = meta.get("labels") or {}
    annotations = meta.get("annotations") or {}
    data = data or {}
    return NodeState(
        name=meta["name"],
        namespace=meta.get("namespace", ""),
        node=annotations.get(ANNOTATION_NODE) or labels.get(LABEL_NODE, ""),
        key=labels.get(LABEL_CALIBRATION_KEY, ""),
        summary=data.get(SUMMARY_KEY),
        artifacts=sum(1 for k in data if k.startswith("artifact.")),
        owner_uid=owner_uid(meta),
        uid=str(meta.get("uid", "")),
    )
