"""OmniService status: aggregate the per-node summaries and set the conditions.

Pure functions: the timer handler passes in what it observed (spec, wanted nodes, pods from
the index, the previous status) and the current time; nothing here reads a clock or the API.

Conditions (each with a CamelCase reason and a message for humans):

* `Ready`: the spec is valid and every wanted node has a ready serving pod.
  Reasons: Ready, InvalidSpec (the message starts with the field path), and otherwise the
  NodesReady reason.
* `NodesReady`: AllNodesReady, NodesNotReady (names the waiting nodes), NoMatchingNodes,
  PodCreationFailed (the API server refused a serving pod, e.g. an unknown RuntimeClass).
* `Calibrated`: Calibrated, CalibrationPending, CalibrationFailed, LadderFromSpec (mode skip
  with a ladder), CalibrationSkipped (mode skip, default ladder), NoMatchingNodes.
* `MetricsAvailable`: SummariesFresh, NoSummaries, StaleSummaries, NoMatchingNodes.
* `Conflict` (True is the problem): NodesOwnedByOthers names each node lost to an older
  OmniService and its owner; NoConflict.
* `WeightsReady` (only while spec.modelSource is set; `model_source.verdict`): WeightsReady,
  WeightsDownloading / WeightsCopying (names the nodes and for how long), WeightsFailed (the
  init container's last line, e.g. a refused token), WeightsPending, NoMatchingNodes.

Summaries come from each node's ConfigMap (the only object its sidecar may write). One that
names another node, or is dated more than MAX_CLOCK_SKEW_S into the future, is not counted
and shows as an error of that node: a future date would otherwise stay "fresh" for ever.
"""

from __future__ import annotations

import dataclasses
import datetime
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from pydantic import ValidationError

from horizonserve.operator import model_source
from horizonserve.operator.models import (
    ClassStatus,
    Condition,
    ModalityAttainment,
    NodeStatus,
    OmniServiceSpec,
    OmniServiceStatus,
)
from horizonserve.operator.nodes import Selection
from horizonserve.operator.pods import PodState
from horizonserve.runtime.config import (
    CalibrationMode,
    NodeSummary,
    Priority,
    ServingConfig,
)

DEFAULT_STALE_AFTER_S = 180.0
MAX_CLOCK_SKEW_S = 60.0  # a summary dated further ahead than this is refused
MAX_LISTED = 5  # node names spelled out in a condition message
MAX_NODE_ERRORS = 3
MAX_ERROR_CHARS = 300
_MODALITY = {Priority.TEXT: "text", Priority.AUDIO: "audio", Priority.IMAGE: "image"}


def rfc3339(t: float) -> str:
    return (
        datetime.datetime.fromtimestamp(t, tz=datetime.UTC)
        .replace(microsecond=0)
        .strftime("%Y-%m-%dT%H:%M:%SZ")
    )


def _listing(names: Sequence[str]) -> str:
    shown = ", ".join(names[:MAX_LISTED])
    more = len(names) - MAX_LISTED
    return f"{shown} and {more} more" if more > 0 else shown


def _ratio(met: int, requests: int) -> float | None:
    return round(met / requests, 4) if requests else None


@dataclasses.dataclass(frozen=True)
class Observed:
    """Everything the aggregation looks at for one OmniService."""

    generation: int | None
    spec: OmniServiceSpec | None  # None when the spec does not even parse
    config: ServingConfig | None  # None when it does not translate
    spec_error: str | None  # "spec.x.y: why", when invalid
    selection: Selection
    pods: Sequence[PodState]
    template_hash: str | None
    write_errors: Sequence[str] = ()  # the reconciler's refused writes, newest pass
    summaries: Mapping[str, str | None] = dataclasses.field(default_factory=dict)  # node → JSON
    node_hashes: Mapping[str, str] | None = None  # node → expected spec-hash label
    conflicts: Mapping[str, str] = dataclasses.field(default_factory=dict)  # node → winner
    endpoint: str | None = None
    foreign: Sequence[str] = ()  # objects of our names owned by someone else (untouched)

    def expected_hash(self, node: str) -> str | None:
        if self.node_hashes is not None and node in self.node_hashes:
            return self.node_hashes[node]
        return self.template_hash


@dataclasses.dataclass
class _Node:
    name: str
    pod: PodState | None
    summary: NodeSummary | None = None
    summary_error: str | None = None
    fresh: bool = False


def _parse(node: str, text: str | None, now: float) -> tuple[NodeSummary | None, str | None]:
    if not text:
        return None, None
    try:
        summary = NodeSummary.from_annotation(text)
    except (ValidationError, ValueError) as exc:
        first = str(exc).splitlines()[0]
        return None, f"summary unreadable: {first}"[:MAX_ERROR_CHARS]
    if summary.node != node:
        return None, f"summary names node {summary.node[:100]!r}, not {node!r}: ignored"
    if summary.timestamp > now + MAX_CLOCK_SKEW_S:
        ahead = summary.timestamp - now
        return None, (
            f"summary dated {ahead:.0f}s in the future (more than {MAX_CLOCK_SKEW_S:.0f}s of "
            "clock skew): ignored; check the node's clock"
        )
    return summary, None


def _nodes(obs: Observed, now: float, stale_after_s: float) -> list[_Node]:
    by_node = {p.node: p for p in obs.pods if p.node in obs.selection.keep}
    # A node that is only kept (cordoned) counts while its pod is still there.
    wanted = sorted(obs.selection.create | set(by_node))
    out = []
    for name in wanted:
        pod = by_node.get(name)
        summary, error = _parse(name, obs.summaries.get(name), now) if pod else (None, None)
        fresh = summary is not None and now - summary.timestamp <= stale_after_s
        out.append(_Node(name, pod, summary, error, fresh))
    return out


def _condition(
    type_: str,
    ok: bool,
    reason: str,
    message: str,
    *,
    now: float,
    generation: int | None,
    previous: Mapping[str, Mapping[str, Any]],
) -> Condition:
    status = "True" if ok else "False"
    before = previous.get(type_)
    since = (
        before["lastTransitionTime"]
        if before and before.get("status") == status and before.get("lastTransitionTime")
        else rfc3339(now)
    )
    return Condition(
        type=type_,
        status=status,
        reason=reason,
        message=message,
        last_transition_time=since,
        observed_generation=generation,
    )


def _nodes_ready(nodes: list[_Node], obs: Observed) -> tuple[bool, str, str]:
    if not nodes:
        if obs.conflicts:
            return (
                False,
                "NodesOwnedByOthers",
                "every matching node is owned by another OmniService",
            )
        return False, "NoMatchingNodes", "no GPU node matches spec.nodeSelector and tolerations"
    ready = [n for n in nodes if n.pod is not None and n.pod.ready]
    outdated = sum(
        1
        for n in nodes
        if n.pod is not None and obs.template_hash and n.pod.spec_hash != obs.expected_hash(n.name)
    )
    rolling = f"; {outdated} pod(s) still on the previous spec" if outdated else ""
    waiting = [
        f"{n.name} ({n.pod.phase if n.pod else 'Missing'})"
        for n in nodes
        if n.pod is None or not n.pod.ready
    ]
    if not waiting:
        return True, "AllNodesReady", f"{len(ready)}/{len(nodes)} serving pods ready{rolling}"
    return (
        False,
        "NodesNotReady",
        f"{len(ready)}/{len(nodes)} serving pods ready; waiting: {_listing(waiting)}{rolling}",
    )


def _calibrated(obs: Observed, nodes: list[_Node]) -> tuple[bool, str, str]:
    spec = obs.spec
    if spec is not None and spec.calibration.mode is CalibrationMode.SKIP:
        if spec.ladder is not None:
            return True, "LadderFromSpec", "calibration.mode is skip; using spec.ladder"
        return (
            False,
            "CalibrationSkipped",
            "calibration.mode is skip and spec.ladder is unset: serving with the default ladder",
        )
    if not nodes:
        return False, "NoMatchingNodes", "no node to calibrate"
    failed = [
        f"{n.name}: {n.summary.calibration_error}"
        for n in nodes
        if n.summary is not None and n.summary.calibration_error
    ]
    if failed:
        return False, "CalibrationFailed", _listing(failed)[: MAX_ERROR_CHARS * MAX_LISTED]
    done = [n.name for n in nodes if n.summary is not None and n.summary.calibrated]
    if len(done) == len(nodes):
        return True, "Calibrated", f"{len(done)}/{len(nodes)} nodes calibrated"
    running = [n.name for n in nodes if n.pod is not None and n.pod.calibrating]
    pending = [n.name for n in nodes if n.name not in done]
    detail = f"calibrating: {_listing(running)}" if running else f"pending: {_listing(pending)}"
    return False, "CalibrationPending", f"{len(done)}/{len(nodes)} nodes calibrated; {detail}"


def _metrics(nodes: list[_Node], stale_after_s: float) -> tuple[bool, str, str]:
    if not nodes:
        return False, "NoMatchingNodes", "no node publishes metrics"
    fresh = [n for n in nodes if n.fresh]
    if fresh:
        return (
            True,
            "SummariesFresh",
            f"{len(fresh)}/{len(nodes)} nodes published a summary in the last {stale_after_s:.0f}s",
        )
    if any(n.summary is not None for n in nodes):
        return False, "StaleSummaries", f"no summary newer than {stale_after_s:.0f}s"
    return False, "NoSummaries", "no node has published a summary yet"


def _classes(config: ServingConfig | None, nodes: Iterable[_Node]) -> list[ClassStatus]:
    totals: dict[str, list[int]] = {}
    priorities: dict[str, int] = {}
    for n in nodes:
        if not n.fresh or n.summary is None:
            continue
        for c in n.summary.classes:
            t = totals.setdefault(c.name, [0, 0])
            t[0] += c.requests
            t[1] += c.met
            priorities.setdefault(c.name, int(c.priority))
    out: list[ClassStatus] = []
    configured = list(config.slo.classes) if config is not None else []
    for cls in configured:
        requests, met = totals.pop(cls.name, [0, 0])
        out.append(
            ClassStatus(
                name=cls.name,
                priority=int(cls.priority),
                metric=cls.metric.value,
                target_seconds=round(config.slo.target_s(cls.name), 6) if config else None,
                requests=requests,
                met=met,
                attainment=_ratio(met, requests),
            )
        )
    for name, (requests, met) in sorted(totals.items()):  # published but not configured
        out.append(
            ClassStatus(
                name=name,
                priority=priorities[name],
                requests=requests,
                met=met,
                attainment=_ratio(met, requests),
            )
        )
    return out


def _by_modality(classes: Iterable[ClassStatus]) -> ModalityAttainment:
    sums: dict[str, list[int]] = {}
    for c in classes:
        try:
            key = _MODALITY[Priority(c.priority)]
        except ValueError:
            continue
        s = sums.setdefault(key, [0, 0])
        s[0] += c.requests
        s[1] += c.met
    return ModalityAttainment(**{k: _ratio(met, req) for k, (req, met) in sums.items()})


def _conflict(obs: Observed) -> tuple[bool, str, str]:
    if obs.foreign:
        return True, "NameTakenByForeignObject", _listing(list(obs.foreign))
    if not obs.conflicts:
        return False, "NoConflict", "no matching node is owned by another OmniService"
    shown = sorted(obs.conflicts.items())
    listing = _listing([f"{node} (owner {winner})" for node, winner in shown])
    return (
        True,
        "NodesOwnedByOthers",
        f"{len(shown)} matching node(s) owned by an older OmniService, no pod there: {listing}",
    )


def _weights(obs: Observed, nodes: list[_Node], now: float) -> tuple[bool, str, str] | None:
    return model_source.verdict(obs.spec, [(n.name, n.pod) for n in nodes], now)


def _node_status(n: _Node, obs: Observed) -> NodeStatus:
    errors: list[str] = []
    if n.summary_error:
        errors.append(n.summary_error)
    if n.summary is not None:
        errors.extend(e[:MAX_ERROR_CHARS] for e in n.summary.errors[-MAX_NODE_ERRORS:])
    pod = n.pod
    return NodeStatus(
        node=n.name,
        pod=pod.name if pod else None,
        phase=pod.phase if pod else "Missing",
        ready=bool(pod and pod.ready),
        up_to_date=bool(pod and pod.spec_hash == obs.expected_hash(n.name))
        if obs.template_hash
        else True,
        calibrated=n.summary.calibrated if n.summary is not None else None,
        attainment=_ratio(n.summary.met, n.summary.requests) if n.summary else None,
        requests=n.summary.requests if n.summary else 0,
        summary_time=rfc3339(n.summary.timestamp) if n.summary else None,
        fresh=n.fresh,
        errors=errors[-MAX_NODE_ERRORS:],
    )


def build_status(
    obs: Observed,
    *,
    now: float,
    previous: Mapping[str, Any] | None = None,
    stale_after_s: float = DEFAULT_STALE_AFTER_S,
) -> dict[str, Any]:
    """The full status (wire form, camelCase, no nulls) for one OmniService."""
    previous = previous or {}
    before = {c.get("type"): c for c in previous.get("conditions") or () if isinstance(c, dict)}
    nodes = _nodes(obs, now, stale_after_s)
    ready_count = sum(1 for n in nodes if n.pod is not None and n.pod.ready)

    def cond(type_: str, verdict: tuple[bool, str, str]) -> Condition:
        ok, reason, message = verdict
        return _condition(
            type_, ok, reason, message, now=now, generation=obs.generation, previous=before
        )

    nodes_ready = _nodes_ready(nodes, obs)
    if obs.write_errors and not nodes_ready[0]:
        more = len(obs.write_errors) - 1
        nodes_ready = (
            False,
            "PodCreationFailed",
            obs.write_errors[0][:MAX_ERROR_CHARS] + (f" (and {more} more)" if more else ""),
        )
    if obs.spec_error:
        ready = (False, "InvalidSpec", obs.spec_error)
    elif not nodes_ready[0]:
        ready = (False, nodes_ready[1], nodes_ready[2])
    else:
        ready = (True, "Ready", f"serving on {ready_count} node(s)")
    classes = _classes(obs.config, nodes)
    total_req = sum(n.summary.requests for n in nodes if n.fresh and n.summary)
    total_met = sum(n.summary.met for n in nodes if n.fresh and n.summary)
    model = (
        obs.config.model
        if obs.config is not None
        else (obs.spec.model if obs.spec is not None else previous.get("model"))
    )
    status = OmniServiceStatus(
        observed_generation=obs.generation,
        model=model,
        conditions=[
            cond("Ready", ready),
            cond("Calibrated", _calibrated(obs, nodes)),
            cond("NodesReady", nodes_ready),
            cond("MetricsAvailable", _metrics(nodes, stale_after_s)),
            cond("Conflict", _conflict(obs)),
            # Only while spec.modelSource is set: the `weights` init container's progress.
            *(cond("WeightsReady", w) for w in [_weights(obs, nodes, now)] if w is not None),
        ],
        nodes_desired=len(nodes),
        nodes_ready=ready_count,
        nodes=f"{ready_count}/{len(nodes)}",
        attainment=_ratio(total_met, total_req),
        classes=classes,
        by_modality=_by_modality(classes),
        node_summaries=[_node_status(n, obs) for n in nodes],
        spec_hash=obs.template_hash,
        endpoint=obs.endpoint,
    )
    return status.model_dump(by_alias=True, exclude_none=True, mode="json")


def merge_patch(old: Mapping[str, Any], new: Mapping[str, Any]) -> dict[str, Any]:
    """RFC 7386 merge patch turning `old` into `new` (nulls remove keys); {} if equal."""
    patch: dict[str, Any] = {}
    for key in old.keys() - new.keys():
        patch[key] = None
    for key, value in new.items():
        before = old.get(key)
        if isinstance(value, Mapping) and isinstance(before, Mapping):
            sub = merge_patch(before, value)
            if sub:
                patch[key] = sub
        elif before != value:
            patch[key] = value
    return patch
