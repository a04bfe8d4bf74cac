"""The spec policy (what an OmniService may ask for) and the node ownership order, as pure
functions; the real-API-server counterparts are in tests/k8s/test_ownership.py."""

from __future__ import annotations

from horizonserve.operator import controller, settings
from horizonserve.operator.claims import Claim, lost_nodes
from horizonserve.operator.kube import Kube
from horizonserve.operator.nodes import GpuNode, can_serve
from horizonserve.operator.policy import Policy, name_refusal, registry_of
from horizonserve.operator.translate import parse_spec

DEFAULT = "ghcr.io/horizonserve/horizonserve-serving:0.1.0"


def _refusal(policy: Policy, **spec: str | None) -> str | None:
    base = {"image": None, "priority_class": None, "model": None}
    return policy.refusal(default_image=DEFAULT, **{**base, **spec})


def test_registries_default_to_the_chart_image_registry() -> None:
    assert registry_of("ghcr.io/a/b:1") == "ghcr.io"
    assert registry_of("localhost:5000/a") == "localhost:5000"
    assert registry_of("library/ubuntu") == registry_of("ubuntu") == "docker.io"
    policy = Policy()
    assert _refusal(policy, image="ghcr.io/me/serving:2") is None
    why = _refusal(policy, image="evil.example/miner:1")
    assert why is not None and why.startswith("spec.image:") and "ghcr.io" in why
    listed = Policy(registries=("registry.example:5000",))
    assert _refusal(listed, image="registry.example:5000/x:1") is None
    assert _refusal(listed, image="ghcr.io/x:1") is not None


def test_priority_classes_never_system_unless_listed() -> None:
    assert _refusal(Policy(), priority_class="gpu-serving") is None
    why = _refusal(Policy(), priority_class="system-node-critical")
    assert why is not None and why.startswith("spec.priorityClassName:")
    listed = Policy(priority_classes=("system-cluster-critical",))
    assert _refusal(listed, priority_class="system-cluster-critical") is None
    assert _refusal(listed, priority_class="gpu-serving") is not None


def test_a_model_is_never_a_flag_and_names_are_dns_1035() -> None:
    assert _refusal(Policy(), model="Qwen/Qwen2.5-Omni-7B") is None
    why = _refusal(Policy(), model="--trust-remote-code")
    assert why is not None and why.startswith("spec.model:")
    assert name_refusal("payments") is None
    for bad in ("my.svc", "9lives", "a" * 64):
        assert (name_refusal(bad) or "").startswith("metadata.name:"), bad


def test_an_incumbent_keeps_its_node_and_ties_are_total() -> None:
    old = Claim("a", "old", "u1", "2026-01-01T00:00:00Z")
    young = Claim("b", "young", "u2", "2026-01-02T00:00:00Z")
    wanted = {old: {"n"}, young: {"n"}}
    assert lost_nodes(young, wanted, {"n": 1}) == {"n": old}  # by age when the node is free
    # The younger one holds a pod there: the node changes hands only when it is free.
    assert lost_nodes(old, wanted, {"n": 1}, {"n": {"u2"}}) == {"n": young}
    assert lost_nodes(young, wanted, {"n": 1}, {"n": {"u2"}}) == {}
    # Same second, same namespace and name (re-created): the uid decides, the same for all.
    x = Claim("a", "s", "u-a", "2026-01-01T00:00:00Z")
    y = Claim("a", "s", "u-b", "2026-01-01T00:00:00Z")
    both = {x: {"n"}, y: {"n"}}
    assert lost_nodes(y, both, {"n": 1}) == {"n": x} and lost_nodes(x, both, {"n": 1}) == {}


def test_an_owner_that_cannot_serve_blocks_nobody() -> None:
    state = controller.OperatorState(settings.OperatorConfig(), Kube("http://unused"))
    taint = {"key": "dedicated", "value": "b", "effect": "NoSchedule"}
    node = GpuNode("n", {"pool": "p"}, taints=(taint,), uid="nu")
    untolerant = {"pipeline": "bagel", "backend": "reference", "nodeSelector": {"pool": "p"}}
    tolerant = {**untolerant, "tolerations": [{"key": "dedicated", "operator": "Equal",
                                               "value": "b", "effect": "NoSchedule"}]}  # fmt: skip
    classless = {**tolerant, "runtimeClassName": "missing"}
    assert not can_serve(parse_spec(untolerant), node, 0.0, None)
    assert can_serve(parse_spec(tolerant), node, 0.0, None)
    # A cordon is transient: it never decides who owns the node.
    cordoned = GpuNode("n", {"pool": "p"}, taints=(taint,), unschedulable=True)
    assert can_serve(parse_spec(tolerant), cordoned, 0.0, None)
    me = Claim("ns", "me", "u-me", "2026-01-02T00:00:00Z")
    for older_spec in (untolerant, classless):
        older = Claim("other", "older", "u-old", "2026-01-01T00:00:00Z")
        parsed = controller.parse(tolerant, DEFAULT, state.load)
        placement = controller.place(
            state, me, parsed, [node], [(older, older_spec)], (),
            runtime_classes=frozenset({"nvidia"}), priority_classes=frozenset(),
        )  # fmt: skip
        assert placement.conflicts == {}, older_spec
        assert placement.selection.create == {"n"}
