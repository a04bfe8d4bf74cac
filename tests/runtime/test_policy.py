"""Policies: Algorithm 1 composition and the baselines' distinguishing behaviour."""

from __future__ import annotations

import pytest

from horizonserve.runtime.config import PolicyName
from horizonserve.runtime.policy import make_policy
from horizonserve.runtime.spatial import UNCAPPED
from horizonserve.runtime.temporal import Phase
from tests.runtime.builders import make_config


def _ident(x):  # type: ignore[no-untyped-def]
    return x


def _queue(policy):  # type: ignore[no-untyped-def]
    items = [policy.admit(f"a{i}", 0.0, priority=10) for i in range(3)]
    items += [policy.admit(f"t{i}", 0.0, priority=0) for i in range(2)]
    return items


def test_horizon_rotates_and_throttles() -> None:
    policy = make_policy("horizon", make_config())
    items = _queue(policy)
    d = policy.step(0.01, downstream_active=True, pressure_sample=0.2)
    assert d.view.phase is Phase.SHORT
    visible, hidden = d.view.split(items, _ident)
    assert [s.cls.name for s in visible] == ["text", "text"]
    assert len(hidden) == 3
    assert d.sm.shared <= policy.spatial.ladder.s_cap
    assert d.pressure == pytest.approx(0.2)


@pytest.mark.parametrize("name", ["fcfs", "edf"])
def test_baselines_see_everything_uncapped(name: str) -> None:
    policy = make_policy(name, make_config())
    items = _queue(policy)
    d = policy.step(0.01, downstream_active=True, pressure_sample=0.9)
    visible, hidden = d.view.split(items, _ident)
    assert hidden == []
    assert d.sm.level == UNCAPPED
    if name == "edf":  # text deadlines (0.5 s) precede audio ones (5 s)
        assert [s.cls.name for s in visible][:2] == ["text", "text"]
    else:
        assert visible == items


def test_ablations_drop_exactly_one_mechanism() -> None:
    no_rot = make_policy(PolicyName.NO_ROTATION, make_config())
    items = _queue(no_rot)
    d = no_rot.step(0.01, downstream_active=True, pressure_sample=0.0)
    assert d.view.split(items, _ident)[1] == []
    assert d.sm.shared == 32

    no_thr = make_policy(PolicyName.NO_THROTTLING, make_config())
    items = _queue(no_thr)
    d = no_thr.step(0.01, downstream_active=True, pressure_sample=0.0)
    assert len(d.view.split(items, _ident)[1]) == 3
    assert d.sm.level == UNCAPPED


def test_dequeue_and_requeue_track_the_waiting_queue() -> None:
    policy = make_policy("horizon", make_config())
    sig = policy.admit("t", 0.0, priority=0)
    policy.dequeue(sig)
    assert not sig.waiting
    sig.record_progress(prefilled=True, decoded=1)
    policy.requeue(sig, 0.5)  # preempted: comes back as a decode continuation
    assert sig.waiting
    assert policy.step(0.5, downstream_active=False).view.is_visible(sig)


def test_unknown_policy_names_the_field() -> None:
    with pytest.raises(ValueError, match="policy: unknown policy 'sjf'"):
        make_policy("sjf", make_config())


def test_prefill_sms_boosts_only_urgent_prompts() -> None:
    policy = make_policy("horizon", make_config())
    audio = policy.admit("a", 0.0, priority=10)  # long path, 5 s target
    text = policy.admit("t", 0.0, priority=0)  # short path: its prefill is the first token
    sm = policy.step(0.01, downstream_active=True, pressure_sample=0.2).sm
    assert sm.shared < sm.prefill == 132
    assert policy.prefill_sms(sm, [], 0.01) == sm.shared
    assert policy.prefill_sms(sm, [audio], 0.01) == sm.shared  # plenty of slack
    assert policy.prefill_sms(sm, [audio, text], 0.01) == 132
    assert policy.prefill_sms(sm, [audio], audio.protect_at + 1e-3) == 132  # protected now
    idle = policy.step(0.02, downstream_active=False).sm
    assert policy.prefill_sms(idle, [text], 0.02) == idle.shared == 132


@pytest.mark.parametrize(
    ("name", "boost"), [("horizon", False), ("fcfs", True), ("horizon-no-throttling", True)]
)
def test_prefill_sms_is_the_cap_without_boost_or_throttling(name: str, boost: bool) -> None:
    policy = make_policy(name, make_config(boost="prefill-backlog" if boost else "backlog"))
    text = policy.admit("t", 0.0, priority=0)
    sm = policy.step(0.01, downstream_active=True, pressure_sample=0.2).sm
    assert policy.prefill_sms(sm, [text], 0.01) == sm.shared


@pytest.mark.parametrize(
    ("name", "late_yield", "late_last"),
    [("horizon", True, True), ("horizon-no-rotation", True, True), ("horizon", False, False),
     ("fcfs", True, False)],
)  # fmt: skip
def test_late_prefills_follow_on_time_ones_under_horizonserve_only(
    name: str, late_yield: bool, late_last: bool
) -> None:
    """`late` yielding: a prompt past its deadline (text: 0.5 s) goes behind the on-time ones
    in HorizonServe's view, not hidden; the baselines and late 'compete' keep queue order."""
    config = make_config(late="yield-phase" if late_yield else "compete")
    policy = make_policy(name, config)
    old = policy.admit("old", 0.0, priority=0)
    new = policy.admit("new", 0.9, priority=0)
    view = policy.step(1.0, downstream_active=False).view
    assert old.late
    expected = [new, old] if late_last else [old, new]
    assert list(view.iter_visible([old, new], _ident)) == expected
    assert view.split([old, new], _ident) == (expected, [])


def test_the_step_reads_the_split_inputs_only_when_the_split_does() -> None:
    """Engines pass the running set and the downstream slack as callables: a policy without
    the slack split, or a step with no downstream stage active, never calls them."""
    calls: list[str] = []

    def running() -> list:
        calls.append("running")
        return []

    def down() -> float:
        calls.append("down")
        return 1.0

    for name, active in (("fcfs", True), ("horizon-no-throttling", True), ("horizon", False)):
        make_policy(name, make_config()).step(
            0.0, downstream_active=active, running=running, downstream_slack=down
        )
    assert calls == []
    decision = make_policy("horizon", make_config()).step(
        0.0, downstream_active=True, running=running, downstream_slack=down
    )
    assert calls == ["running", "down"] and decision.downstream_slack == 1.0


def test_one_decision_carries_the_victim_and_the_prefill_sms() -> None:
    policy = make_policy("horizon", make_config())
    text = policy.admit("t", 0.0, priority=0)
    quiet = policy.step(0.01, downstream_active=True, pressure_sample=0.2)
    assert quiet.prefill_sms([text]) == policy.prefill_sms(quiet.sm, [text], 0.01)
    # No backlog: no victim, whatever runs.
    long_sig = policy.profiler.annotate("l", 0.0, priority=10)
    assert quiet.victim([long_sig], _ident, lambda s: False) is None
    no_pre = make_policy("horizon-no-preemption", make_config())
    no_pre.admit("t", 0.0, priority=0)
    backlogged = no_pre.step(0.01, downstream_active=True, backlog=True)
    assert backlogged.victim([long_sig], _ident, lambda s: False) is None
