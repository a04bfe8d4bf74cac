"""What the pod index keeps about each serving pod (pure functions over the pod body)."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from horizonserve.operator import models
from horizonserve.operator.builders import (
    ANNOTATION_NODE,
    LABEL_CALIBRATION_KEY,
    LABEL_NODE,
    LABEL_SPEC_HASH,
    trust_view,
)
from horizonserve.operator.model_source import WeightsState, weights_state


@dataclasses.dataclass(frozen=True)
class PodState:
    """A serving pod as the reconciler and the status aggregation see it."""

    name: str
    namespace: str
    uid: str
    node: str
    spec_hash: str | None
    phase: str  # Pending / Running / … or a finer word: Calibrating, ImagePullBackOff, …
    ready: bool = False
    deleting: bool = False
    calibrating: bool = False
    trust: str = ""  # builders.trust_view of the live pod spec ("" when unknown)
    calibration_key: str | None = None
    owner_uid: str = ""  # uid of the controlling OmniService
    weights: WeightsState | None = None  # model_source.weights_state of the pod's status


def owner_key(meta: Mapping[str, Any]) -> tuple[str, str] | None:
    """(namespace, OmniService name) of the controlling OmniService, if any."""
    for ref in meta.get("ownerReferences") or ():
        if (
            ref.get("controller")
            and ref.get("kind") == models.KIND
            and str(ref.get("apiVersion", "")).startswith(f"{models.GROUP}/")
        ):
            return meta.get("namespace", ""), ref["name"]
    return None


def owner_uid(meta: Mapping[str, Any]) -> str:
    for ref in meta.get("ownerReferences") or ():
        if ref.get("controller") and ref.get("kind") == models.KIND:
            return str(ref.get("uid", ""))
    return ""


def _waiting_reason(statuses: list[Mapping[str, Any]] | None) -> str | None:
    for st in statuses or ():
        waiting = (st.get("state") or {}).get("waiting")
        if waiting and waiting.get("reason") not in (None, "PodInitializing"):
            return str(waiting["reason"])
    return None


def pod_state(
    meta: Mapping[str, Any], status: Mapping[str, Any], spec: Mapping[str, Any] | None = None
) -> PodState:
    labels = meta.get("labels") or {}
    annotations = meta.get("annotations") or {}
    conditions = {c.get("type"): c.get("status") for c in status.get("conditions") or ()}
    init = status.get("initContainerStatuses") or []
    calibrating = any(
        st.get("name") == "calibrate" and "running" in (st.get("state") or {}) for st in init
    )
    deleting = bool(meta.get("deletionTimestamp"))
    weights = weights_state(status)
    if deleting:
        phase = "Terminating"
    elif calibrating:
        phase = "Calibrating"
    elif weights is not None and weights.step == "running":
        phase = "LoadingWeights"
    else:
        phase = (
            _waiting_reason(init)
            or _waiting_reason(status.get("containerStatuses"))
            or str(status.get("phase") or "Pending")
        )
    return PodState(
        name=meta["name"],
        namespace=meta.get("namespace", ""),
        uid=meta.get("uid", ""),
        node=annotations.get(ANNOTATION_NODE) or labels.get(LABEL_NODE, ""),
        spec_hash=labels.get(LABEL_SPEC_HASH),
        phase=phase,
        ready=conditions.get("Ready") == "True" and not deleting,
        deleting=deleting,
        calibrating=calibrating,
        trust=trust_view(spec) if spec is not None else "",
        calibration_key=labels.get(LABEL_CALIBRATION_KEY),
        owner_uid=owner_uid(meta),
        weights=weights,
    )
