"""The reconcile plan (pure), expectations, and the status aggregation (pure)."""

from __future__ import annotations

import dataclasses
import json

from horizonserve.operator import status
from horizonserve.operator.builders import pod_name
from horizonserve.operator.claims import Claim, lost_nodes
from horizonserve.operator.nodes import Selection
from horizonserve.operator.pods import PodState, owner_key, pod_state
from horizonserve.operator.reconcile import Expectations, plan
from horizonserve.operator.translate import translate
from horizonserve.runtime.config import ClassSummary, NodeSummary

OSVC = "svc"
H = "hash-new"


SUMMARIES: dict[str, str] = {}  # node → summary JSON, as the node's ConfigMap holds it


def _pod(node: str, h: str = H, ready: bool = True, **kw) -> PodState:
    name = kw.pop("name", pod_name(OSVC, node))
    summary = kw.pop("summary", None)
    if summary is not None:
        SUMMARIES[node] = summary
    return PodState(name, "ns", f"uid-{name}", node, h, "Running" if ready else "Pending",
                    ready=ready, **kw)  # fmt: skip


def _sel(create: set[str], keep: set[str] | None = None) -> Selection:
    return Selection(frozenset(create), frozenset(keep if keep is not None else create))


def test_plan_creates_missing_and_deletes_strays() -> None:
    pods = [_pod("a"), _pod("gone"), _pod("b", name="svc-b-old")]
    p = plan(OSVC, _sel({"a", "b", "c"}), pods, H)
    assert p.create == ("b", "c")
    assert {x.name for x in p.delete} == {"svc-gone", "svc-b-old"}


def test_plan_is_idempotent_when_converged() -> None:
    pods = [_pod("a"), _pod("b")]
    assert plan(OSVC, _sel({"a", "b"}), pods, H).empty


def test_plan_waits_for_a_terminating_pod() -> None:
    p = plan(OSVC, _sel({"a"}), [_pod("a", h="old", ready=False, deleting=True)], H)
    assert p.empty and p.unavailable == 1


def test_rollout_replaces_not_ready_at_once_and_ready_within_budget() -> None:
    pods = [
        _pod("a", h="old", ready=False),
        _pod("b", h="old"),
        _pod("c", h="old"),
        _pod("d", h="old"),
    ]
    p = plan(OSVC, _sel({"a", "b", "c", "d"}), pods, H, max_unavailable=2)
    assert {x.node for x in p.delete} == {"a", "b"}  # a is free; budget 2 - 1 leaves one more
    p = plan(OSVC, _sel({"a", "b", "c", "d"}), pods, H, max_unavailable=1)
    assert {x.node for x in p.delete} == {"a"}


def test_cordoned_node_keeps_its_pod_but_gets_none() -> None:
    p = plan(OSVC, _sel({"a"}, {"a", "b", "c"}), [_pod("b", h="old")], H)
    assert p.create == ("a",) and p.delete == ()


def test_expectations_bridge_the_watch_gap() -> None:
    exp = Expectations(ttl_s=30)
    created = _pod("a", ready=False)
    exp.created(dataclasses.replace(created, uid=""), now=0.0)
    seen = exp.apply([], now=1.0)
    assert [p.name for p in seen] == ["svc-a"]
    assert plan(OSVC, _sel({"a"}), seen, H).create == ()
    assert exp.apply([], now=31.0) == []  # expired: try again
    old = _pod("b", h="old")
    exp.deleted(old, now=40.0)
    (b,) = exp.apply([old], now=41.0)
    assert b.deleting and not b.ready
    assert exp.apply([], now=42.0) == []  # gone from the index: forgotten


def _pod_body(**status_overrides) -> tuple[dict, dict]:
    meta = {
        "name": "svc-a",
        "namespace": "ns",
        "uid": "u1",
        "labels": {"horizonserve.io/spec-hash": H, "horizonserve.io/node": "a"},
        "annotations": {"horizonserve.io/node-name": "a"},
        "ownerReferences": [
            {"apiVersion": "horizonserve.io/v1alpha1", "kind": "OmniService", "name": "svc",
             "uid": "x", "controller": True},
        ],
    }  # fmt: skip
    return meta, {"phase": "Pending", **status_overrides}


def test_pod_state_reads_phase_readiness_and_calibration() -> None:
    meta, st = _pod_body()
    assert owner_key(meta) == ("ns", "svc")
    assert owner_key({"ownerReferences": [{"kind": "ReplicaSet", "controller": True}]}) is None
    p = pod_state(meta, st)
    assert (p.node, p.spec_hash, p.phase, p.ready) == ("a", H, "Pending", False)
    calibrating = {"initContainerStatuses": [{"name": "calibrate", "state": {"running": {}}}]}
    assert pod_state(meta, {**st, **calibrating}).phase == "Calibrating"
    waiting = {"containerStatuses": [{"state": {"waiting": {"reason": "ImagePullBackOff"}}}]}
    assert pod_state(meta, {**st, **waiting}).phase == "ImagePullBackOff"
    ready = {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]}
    assert pod_state(meta, ready).ready
    deleting = pod_state({**meta, "deletionTimestamp": "2024-01-01T00:00:00Z"}, ready)
    assert deleting.deleting and not deleting.ready and deleting.phase == "Terminating"


# --- status ------------------------------------------------------------------------------

NOW = 1_800_000_000.0


def _summary(node: str, requests: dict[str, tuple[int, int]], **kw) -> str:
    prio = {"text-text": 0, "text-speech": 10, "audio-text": 0}
    classes = [
        ClassSummary(name=n, priority=prio[n], requests=r, met=m) for n, (r, m) in requests.items()
    ]
    kw.setdefault("timestamp", NOW - 5)
    kw.setdefault("calibrated", True)
    return NodeSummary(node=node, classes=classes, **kw).to_annotation()


def _observed(pods, create=("a", "b", "c"), error=None, raw=None) -> status.Observed:
    spec, config = translate(raw or {"pipeline": "qwen2_5_omni", "allGpuNodes": True})
    summaries = {p.node: SUMMARIES.pop(p.node) for p in pods if p.node in SUMMARIES}
    return status.Observed(
        summaries=summaries,
        generation=3,
        spec=spec,
        config=config,
        spec_error=error,
        selection=_sel(set(create)),
        pods=pods,
        template_hash=H,
    )


def _conditions(st: dict) -> dict[str, dict]:
    return {c["type"]: c for c in st["conditions"]}


def test_status_aggregates_fresh_summaries() -> None:
    pods = [
        _pod("a", summary=_summary("a", {"text-text": (10, 9), "text-speech": (10, 5)})),
        _pod("b", summary=_summary("b", {"text-text": (10, 10), "audio-text": (0, 0)})),
        _pod("c", summary=_summary("c", {"text-text": (50, 0)}, timestamp=NOW - 999)),  # stale
    ]
    st = status.build_status(_observed(pods), now=NOW, stale_after_s=180)
    assert st["observedGeneration"] == 3 and st["nodes"] == "3/3"
    assert st["nodesDesired"] == 3 and st["nodesReady"] == 3
    assert st["attainment"] == round(24 / 30, 4)
    classes = {c["name"]: c for c in st["classes"]}
    assert classes["text-text"]["attainment"] == 0.95 and classes["text-text"]["requests"] == 20
    assert classes["text-speech"]["attainment"] == 0.5
    assert "attainment" not in classes["audio-text"]  # no requests: unknown, not 0
    assert classes["text-speech"]["targetSeconds"] > 0 and classes["text-speech"]["metric"]
    assert st["byModality"] == {"text": 0.95, "audio": 0.5}
    cond = _conditions(st)
    assert cond["Ready"]["status"] == "True" and cond["Ready"]["reason"] == "Ready"
    assert cond["NodesReady"]["reason"] == "AllNodesReady"
    assert cond["MetricsAvailable"]["status"] == "True"
    assert "2/3" in cond["MetricsAvailable"]["message"]
    assert cond["Calibrated"]["status"] == "True"
    nodes = {n["node"]: n for n in st["nodeSummaries"]}
    assert nodes["c"]["fresh"] is False and nodes["a"]["attainment"] == 0.7
    assert all(c["observedGeneration"] == 3 for c in st["conditions"])


def test_status_conditions_when_things_are_missing() -> None:
    pods = [_pod("a", ready=False, calibrating=True), _pod("b", h="old")]
    st = status.build_status(_observed(pods), now=NOW)
    cond = _conditions(st)
    assert st["nodes"] == "1/3"
    assert cond["Ready"]["status"] == "False" and cond["Ready"]["reason"] == "NodesNotReady"
    assert "c (Missing)" in cond["NodesReady"]["message"]
    assert "previous spec" in cond["NodesReady"]["message"]
    assert cond["Calibrated"]["reason"] == "CalibrationPending"
    assert "calibrating: a" in cond["Calibrated"]["message"]
    assert cond["MetricsAvailable"]["reason"] == "NoSummaries"
    nodes = {n["node"]: n for n in st["nodeSummaries"]}
    assert "pod" not in nodes["c"] and nodes["c"]["phase"] == "Missing"
    assert nodes["b"]["upToDate"] is False
    assert "attainment" not in st


def test_invalid_spec_and_no_nodes() -> None:
    st = status.build_status(
        _observed([], create=(), error="spec.slo.classOverrides.poetry: unknown"), now=NOW
    )
    cond = _conditions(st)
    assert cond["Ready"]["reason"] == "InvalidSpec"
    assert cond["Ready"]["message"].startswith("spec.slo.classOverrides.poetry")
    assert cond["NodesReady"]["reason"] == "NoMatchingNodes" and st["nodes"] == "0/0"


def test_calibration_failure_and_skip() -> None:
    bad = _summary("a", {}, calibrated=False, calibration_error="sweep diverged")
    st = status.build_status(_observed([_pod("a", summary=bad)], create=("a",)), now=NOW)
    assert _conditions(st)["Calibrated"]["reason"] == "CalibrationFailed"
    assert "a: sweep diverged" in _conditions(st)["Calibrated"]["message"]
    skip = {"pipeline": "qwen2_5_omni", "allGpuNodes": True, "calibration": {"mode": "skip"}}
    st = status.build_status(_observed([], raw=skip), now=NOW)
    assert _conditions(st)["Calibrated"]["reason"] == "CalibrationSkipped"
    ladder = {**skip, "ladder": {"levels": [32, 64], "aggressive": 132, "total": 132}}
    st = status.build_status(_observed([], raw=ladder), now=NOW)
    assert _conditions(st)["Calibrated"]["status"] == "True"


def test_unreadable_summary_is_reported_per_node() -> None:
    st = status.build_status(_observed([_pod("a", summary="{not json")], create=("a",)), now=NOW)
    (node,) = st["nodeSummaries"]
    assert node["errors"] and "unreadable" in node["errors"][0]


def test_transition_time_kept_while_status_holds() -> None:
    obs = _observed([_pod("a")], create=("a",))
    first = status.build_status(obs, now=NOW)
    later = status.build_status(obs, now=NOW + 600, previous=first)
    assert later["conditions"] == first["conditions"]
    assert status.merge_patch(first, later) == {}
    flipped = status.build_status(_observed([], create=("a",)), now=NOW + 700, previous=later)
    ready = _conditions(flipped)["Ready"]
    assert (
        ready["status"] == "False"
        and ready["lastTransitionTime"] != (_conditions(first)["Ready"]["lastTransitionTime"])
    )


def test_merge_patch_nulls_removed_keys() -> None:
    old = {"a": 1, "b": {"x": 1, "y": 2}, "c": [1]}
    new = {"a": 1, "b": {"x": 1}, "c": [2], "d": "new"}
    assert status.merge_patch(old, new) == {"b": {"y": None}, "c": [2], "d": "new"}


def test_future_dated_or_foreign_summaries_are_not_counted() -> None:
    ahead = _summary("a", {"text-text": (10, 10)}, timestamp=NOW + 3600)
    foreign = _summary("elsewhere", {"text-text": (10, 10)})
    pods = [_pod("a", summary=ahead), _pod("b", summary=foreign)]
    st = status.build_status(_observed(pods, create=("a", "b")), now=NOW)
    nodes = {n["node"]: n for n in st["nodeSummaries"]}
    assert not nodes["a"]["fresh"] and "in the future" in nodes["a"]["errors"][0]
    assert not nodes["b"]["fresh"] and "names node 'elsewhere'" in nodes["b"]["errors"][0]
    assert "attainment" not in st  # nothing counted
    # Within the allowed clock skew it counts.
    skewed = _summary("a", {"text-text": (10, 5)}, timestamp=NOW + status.MAX_CLOCK_SKEW_S - 1)
    st = status.build_status(_observed([_pod("a", summary=skewed)], create=("a",)), now=NOW)
    assert st["attainment"] == 0.5


def test_conflict_condition_and_endpoint() -> None:
    obs = _observed([_pod("a")], create=("a",))
    st = status.build_status(
        dataclasses.replace(obs, conflicts={"b": "ns/older"}, endpoint="http://svc.ns.svc:8000"),
        now=NOW,
    )
    cond = _conditions(st)["Conflict"]
    assert cond["status"] == "True" and cond["reason"] == "NodesOwnedByOthers"
    assert "b (owner ns/older)" in cond["message"]
    assert st["endpoint"] == "http://svc.ns.svc:8000"
    assert _conditions(status.build_status(obs, now=NOW))["Conflict"]["status"] == "False"


def test_plan_replaces_a_drifted_pod_at_once() -> None:
    container = {"image": "ok", "command": None, "args": None, "env": [], "envFrom": None,
                 "securityContext": {}, "mounts": []}  # fmt: skip
    built = json.dumps({"containers": {"c": container}, "volumes": {}, "ephemeral": False,
                        "serviceAccountName": "sa", "automount": False, "host": [False] * 3,
                        "securityContext": {}, "activeDeadlineSeconds": None,
                        "runtimeClassName": None})  # fmt: skip
    evil = built.replace('"ok"', '"evil"')
    pods = [_pod("a", trust=evil), _pod("b", trust=built), _pod("c", h="old", trust=evil)]
    p = plan(OSVC, _sel({"a", "b", "c"}), pods, H, max_unavailable=1, trust=lambda n: built)
    assert p.drifted == ("svc-a",)
    # The drifted pod goes although the budget is spent; the outdated c is not a drift.
    assert {d.name for d in p.delete} == {"svc-a"}


def test_one_gpu_one_owner_is_deterministic() -> None:
    old = Claim("ns", "old", "u1", "2026-01-01T00:00:00Z")
    new = Claim("ns", "new", "u2", "2026-01-02T00:00:00Z")
    twin = Claim("ns", "a-twin", "u3", "2026-01-02T00:00:00Z")  # same second: by name
    wanted = {old: {"n1"}, new: {"n1", "n2"}, twin: {"n2", "n3"}}
    assert lost_nodes(old, wanted, {"n1": 1}) == {}
    assert lost_nodes(new, wanted, {"n1": 1, "n2": 1}) == {"n1": old, "n2": twin}
    assert lost_nodes(twin, wanted, {"n2": 1, "n3": 1}) == {}
    assert lost_nodes(new, wanted, {"n1": 2, "n2": 2}) == {}  # a two-GPU node: both fit
