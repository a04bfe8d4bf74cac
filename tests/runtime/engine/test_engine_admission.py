"""The reference engine's downstream queue adapter: the policy's order, late refusal, and the
rules each policy asks of a downstream stage (no torch needed)."""

from __future__ import annotations

from horizonserve.runtime.downstream import Stamp
from horizonserve.runtime.engine.reference.protocol import ERROR
from horizonserve.runtime.engine.reference.stages.admission import (
    DownstreamRules,
    StageQueue,
    downstream_rules,
    refuse_late,
)
from tests.runtime.builders import make_config


def _stamp(rid: str, deadline: float, first_s: float = 1.0) -> Stamp:
    return Stamp(rid, "audio-out", 10, 0.0, deadline, first_s)


def test_slack_order_and_switching_keep_every_job() -> None:
    now = [0.0]
    q: StageQueue[str] = StageQueue(True, lambda: now[0])
    q.append("late-deadline", _stamp("a", 9.0))
    q.append("early-deadline", _stamp("b", 3.0))
    q.append("synthetic", None)  # no deadline: behind every stamped job
    assert list(q) == ["early-deadline", "late-deadline", "synthetic"]
    q.set_order(False)  # FIFO now, nothing lost
    assert len(q) == 3 and q.popleft() == "early-deadline"
    q.take(["synthetic"])
    assert list(q) == ["late-deadline"]


def test_refuse_late_answers_each_hopeless_request_with_a_reason() -> None:
    now = [5.0]
    q: StageQueue[str] = StageQueue(True, lambda: now[0])
    q.append("hopeless", _stamp("h", 5.5, first_s=1.0))  # 5 > 5.5 − 1: cannot make it
    q.append("fine", _stamp("f", 20.0))
    events: list = []
    assert refuse_late(q, DownstreamRules(reject_late=False), "speech", str, events.append) == 0
    assert len(q) == 2 and not events
    assert refuse_late(q, DownstreamRules(True, None, True), "speech", str, events.append) == 1
    assert list(q) == ["fine"]
    (ev,) = events
    assert ev.kind == ERROR and ev.rid == "hopeless" and "deadline" in ev.data["message"]


def test_each_policy_asks_its_own_downstream_rules() -> None:
    config = make_config()
    horizon = downstream_rules(config, "horizon")
    assert horizon.slack and horizon.yield_margin_s is not None and not horizon.reject_late
    for name in ("fcfs", "priority", "horizon-no-downstream"):
        rules = downstream_rules(config, name)
        assert not rules.slack and rules.yield_margin_s is None
    strict = config.model_copy(
        update={"control": config.control.model_copy(update={"reject_late": True})}
    )
    assert downstream_rules(strict, "horizon").reject_late
    assert not downstream_rules(strict, "fcfs").reject_late  # baselines never refuse
