"""The shared stage in-process: the policy's view is what gets scheduled; events; SM cap."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from horizonserve.runtime.config import Boost  # noqa: E402
from horizonserve.runtime.engine.reference.ar import ArExecutor  # noqa: E402
from horizonserve.runtime.engine.reference.defaults import reference_config  # noqa: E402
from horizonserve.runtime.engine.reference.models import DecoderLM, materialize  # noqa: E402
from horizonserve.runtime.engine.reference.presets import get_preset  # noqa: E402
from horizonserve.runtime.engine.reference.protocol import (  # noqa: E402
    DONE,
    FIRST,
    HANDOFF,
    IMAGE,
    SPEECH,
    Admit,
    Event,
    Handoff,
    RequestSpec,
)
from horizonserve.runtime.engine.reference.stages.shared import SharedStage  # noqa: E402
from horizonserve.runtime.policy import StepDecision, make_policy  # noqa: E402
from horizonserve.runtime.spatial import AGGRESSIVE, LIFTED  # noqa: E402

PRESET = get_preset("tiny")


@pytest.fixture(scope="module")
def model() -> DecoderLM:
    torch.manual_seed(0)
    return materialize(lambda: DecoderLM(PRESET.thinker), torch.device("cpu"), torch.float32)


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        self.t += 1e-4
        return self.t


class Harness:
    def __init__(self, model: DecoderLM, policy: str, active: int = 0, boost: bool = True) -> None:
        config = reference_config("tiny", policy=policy)
        control = config.control.model_copy(
            update={"boost": Boost.PREFILL_BACKLOG if boost else Boost.BACKLOG}
        )
        self.config = config.model_copy(update={"control": control})
        self.events: list[Event] = []
        self.handoffs: list[tuple[str, Handoff]] = []
        self.published: list[StepDecision] = []
        self.activated: list[int | None] = []
        self.active = active
        self.clock = Clock()
        harness = self

        class RecordingCap:
            levels = (32, 48, 64, 80)

            def activate(self, sms: int | None) -> None:
                harness.activated.append(sms)

            def close(self) -> None:
                pass

        self.stage = SharedStage(
            make_policy(policy, self.config),
            ArExecutor(model, PRESET.thinker_limits, keep_hidden=True),
            PRESET,
            self.config,
            emit=self.events.append,
            handoff=lambda target, msg: self.handoffs.append((target, msg)),
            downstream_active=lambda: self.active,
            pressure=lambda: 0.5,
            publish=lambda decision, raw: self.published.append(decision),
            sm=RecordingCap(),
            clock=self.clock,
        )

    def submit(self, rid: str, priority: int, output_tokens: int = 3) -> None:
        spec = RequestSpec(rid, priority=priority, input_tokens=10, output_tokens=output_tokens)
        down = {0: None, 10: SPEECH, 20: IMAGE}[priority]
        self.stage.submit(Admit(spec, self.clock.t, down))

    def kinds(self, rid: str) -> list[str]:
        return [e.kind for e in self.events if e.rid == rid]


def test_short_phase_hides_long_path_prefills(model: DecoderLM) -> None:
    h = Harness(model, "horizon")
    for rid, prio in [("s1", 10), ("i1", 20), ("t1", 0), ("t2", 0)]:
        h.submit(rid, prio)
    decision = h.stage.iterate()
    assert decision.view.phase.value == "short"
    assert h.stage.last_plan_rids == ["t1", "t2"]  # long-path prompts stayed hidden
    assert set(h.stage.waiting) == {"s1", "i1"}
    for _ in range(10):  # no short-path prompt is left: the next phases admit the long ones
        h.stage.iterate()
        if not h.stage.waiting:
            break
    assert not h.stage.waiting


def test_fcfs_schedules_in_arrival_order(model: DecoderLM) -> None:
    h = Harness(model, "fcfs")
    for rid, prio in [("s1", 10), ("i1", 20), ("t1", 0), ("t2", 0)]:
        h.submit(rid, prio)
    h.stage.iterate()
    assert h.stage.last_plan_rids == ["s1", "i1", "t1", "t2"]
    assert set(h.activated) == {None}  # baselines run uncapped, prefill and decode alike


def test_first_token_handoff_and_done_events(model: DecoderLM) -> None:
    h = Harness(model, "horizon")
    h.submit("t", 0, output_tokens=3)
    h.submit("s", 10, output_tokens=4)
    h.submit("i", 20, output_tokens=2)
    for _ in range(20):
        if h.stage.idle:
            break
        h.stage.iterate()
    assert h.stage.idle
    assert h.kinds("t") == [FIRST, DONE]
    assert h.kinds("s") == [HANDOFF] and h.kinds("i") == [HANDOFF]
    first = next(e for e in h.events if e.kind == FIRST)
    assert first.data["scheduled"] <= first.t
    targets = {msg.rid: (target, msg) for target, msg in h.handoffs}
    speech_target, speech = targets["s"]
    assert speech_target == SPEECH
    hidden = PRESET.thinker.hidden
    assert speech.cond.shape == (10 + 4 - 1, hidden)  # prompt + generated tokens fed back
    image_target, image = targets["i"]
    assert image_target == IMAGE
    assert image.cond.shape == (PRESET.dit.cond_tokens, hidden)
    done = next(e for e in h.events if e.kind == DONE)
    assert done.data["tokens"] == 3 and done.data["tpot"] > 0


def test_sm_cap_follows_downstream_activity(model: DecoderLM) -> None:
    h = Harness(model, "horizon", active=0)
    h.submit("a", 0, output_tokens=6)
    h.stage.iterate()
    assert h.published[-1].sm.level == AGGRESSIVE
    assert h.activated[-1] is None  # S_aggr is the whole GPU here
    h.active = 1
    h.stage.iterate()
    sm = h.published[-1].sm
    ladder = h.config.ladder
    assert sm.shared in ladder.levels and sm.shared <= ladder.s_cap
    assert sm.downstream == ladder.total - sm.shared
    assert h.activated[-1] == sm.shared
    assert len(h.published) == h.stage.steps == 2


def _one_step_activations(h: Harness) -> list[int | None]:
    before = len(h.activated)
    h.stage.iterate()
    return h.activated[before:]


def test_urgent_prefill_runs_above_the_cap_and_decode_at_it(model: DecoderLM) -> None:
    h = Harness(model, "horizon", active=1)
    h.submit("warm", 0, output_tokens=8)
    h.stage.iterate()  # the cap is set; "warm" keeps decoding
    h.submit("t", 0)
    acts = _one_step_activations(h)
    cap = h.published[-1].sm.shared
    assert cap < h.config.ladder.total
    # Short-path prompt: its prefill is its first token, so it gets S_aggr (the whole GPU).
    assert acts == [None, cap]
    assert h.stage.last_plan_rids == ["t"]


def test_relaxed_long_path_prefill_keeps_the_cap(model: DecoderLM) -> None:
    h = Harness(model, "horizon", active=1)
    h.submit("warm", 0, output_tokens=8)
    h.stage.iterate()
    h.submit("s", 10)  # seconds of slack: not protected
    acts = _one_step_activations(h)
    cap = h.published[-1].sm.shared
    assert h.stage.last_plan_rids == ["s"]
    assert acts == [cap, cap]


def test_boost_off_keeps_prefill_at_the_cap(model: DecoderLM) -> None:
    h = Harness(model, "horizon", active=1, boost=False)
    h.submit("warm", 0, output_tokens=8)
    h.stage.iterate()
    h.submit("t", 0)
    acts = _one_step_activations(h)
    cap = h.published[-1].sm.shared
    assert acts == [cap, cap]


def test_abort_frees_slots_and_the_policy_index(model: DecoderLM) -> None:
    h = Harness(model, "horizon")
    h.submit("run", 0, output_tokens=50)
    h.stage.iterate()  # "run" is decoding
    h.submit("wait", 10)
    cut = h.clock.t
    assert h.stage.abort(cut) == 2
    assert h.stage.idle and not h.stage.batcher.running
    assert h.stage.policy.step(h.clock(), downstream_active=False).view.visible == 0
    h.stage.submit(Admit(RequestSpec("late", priority=0), cut - 1.0, None))
    assert h.stage.idle  # arrived before the cut: dropped on arrival
    h.submit("new", 0)
    assert not h.stage.idle and h.stage.abort(cut) == 0


def test_full_running_set_with_waiting_requests_lifts_the_cap(model: DecoderLM) -> None:
    h = Harness(model, "horizon", active=1)
    slots = PRESET.thinker_limits.max_batch
    for i in range(slots + 1):
        h.submit(f"r{i}", 0, output_tokens=20)
    h.stage.iterate()  # admits `slots` prompts; one waits for a place
    assert len(h.stage.batcher.running) == slots and h.stage.waiting
    h.stage.iterate()
    assert h.published[-1].sm.level == LIFTED
    assert h.activated[-1] is None  # S_aggr is the whole GPU here


def test_unknown_class_is_reported_not_fatal(model: DecoderLM) -> None:
    h = Harness(model, "horizon")
    spec = RequestSpec("x", class_name="nope")
    h.stage.submit(Admit(spec, 0.0, None))
    assert h.kinds("x") == ["error"] and h.stage.idle
