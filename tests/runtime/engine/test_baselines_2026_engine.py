"""The 2026 baselines in the reference engine (CPU, tiny models, real PyTorch).

vllm-omni-current: the talker's bounded-K window never holds more than K streams and fills by
deadline; DTPS at the shared stage orders by tier within a budget read from the fed stages'
queue depths. mps-static: each stage process gets its fixed share, recorded (and checked) on
CPU where it has no effect. Each preset starts and serves a mixed burst end to end."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

import pytest

torch = pytest.importorskip("torch")

from horizonserve.runtime.audio_window import DTPS_AGING_S  # noqa: E402
from horizonserve.runtime.baselines import static_share  # noqa: E402
from horizonserve.runtime.downstream import Stamp  # noqa: E402
from horizonserve.runtime.engine.reference import (  # noqa: E402
    PipelineOptions,
    ReferenceBackend,
    RequestSpec,
    TimedRequest,
)
from horizonserve.runtime.engine.reference.ar import ArExecutor  # noqa: E402
from horizonserve.runtime.engine.reference.defaults import reference_config  # noqa: E402
from horizonserve.runtime.engine.reference.gpu_control import (  # noqa: E402
    mps_percentage,
    static_shares,
)
from horizonserve.runtime.engine.reference.models import DecoderLM, materialize  # noqa: E402
from horizonserve.runtime.engine.reference.pipeline import (  # noqa: E402
    Pipeline,
    SharingMismatchError,
)
from horizonserve.runtime.engine.reference.presets import get_preset  # noqa: E402
from horizonserve.runtime.engine.reference.protocol import (  # noqa: E402
    IMAGE,
    SPEECH,
    Admit,
    CodeChunk,
    Handoff,
    WireTensor,
)
from horizonserve.runtime.engine.reference.stages.admission import (  # noqa: E402
    downstream_rules,
)
from horizonserve.runtime.engine.reference.stages.shared import SharedStage  # noqa: E402
from horizonserve.runtime.engine.reference.stages.speech import SpeechStage  # noqa: E402
from horizonserve.runtime.policy import make_policy  # noqa: E402

CPU = torch.device("cpu")
PRESET = replace(get_preset("tiny"), first_chunk=2, code_chunk=2)


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        self.t += 1e-4
        return self.t


# -- the talker's window ----------------------------------------------------------------------
def _talker(policy: str, window: int | None) -> SpeechStage:
    torch.manual_seed(0)
    model = materialize(lambda: DecoderLM(PRESET.talker), CPU, torch.float32)
    talker = ArExecutor(model, PRESET.talker_limits, keep_hidden=False, graphs=False)
    proj = materialize(
        lambda: torch.nn.Linear(PRESET.thinker.hidden, PRESET.talker.hidden), CPU, torch.float32
    )
    rules = downstream_rules(reference_config("tiny", policy=policy), window=window)
    chunks: list[CodeChunk] = []
    return SpeechStage(
        talker, proj, PRESET, emit=lambda _ev: None, send=chunks.append, rules=rules, clock=Clock()
    )


def _handoff(rid: str, arrival: float, deadline: float, codes: int = 6) -> Handoff:
    cond = WireTensor.of(torch.zeros(4, PRESET.thinker.hidden))
    return Handoff(rid, arrival, cond, codes, Stamp(rid, "speech", 10, arrival, deadline, 0.1))


def _admission_order(stage: SpeechStage, peak: list[int]) -> list[str]:
    """Run the stage dry; the order streams took a place in, and the most active at once."""
    order: list[str] = []
    while not stage.idle:
        stage.iterate()
        running = [seq.rid for seq in stage.batcher.running]
        peak.append(len(running))
        order += [rid for rid in running if rid not in order]
    return order


# Hand-off order differs from deadline order (the thinker finishes them out of arrival order).
HANDOFFS = [("a", 1.0, 40.0), ("b", 2.0, 10.0), ("c", 3.0, 30.0), ("d", 4.0, 5.0), ("e", 5.0, 20.0)]


def test_the_window_holds_at_most_k_streams_and_fills_by_deadline() -> None:
    stage = _talker("vllm-omni-current", window=2)
    assert stage.window_k == 2 and stage.rules.edf
    for rid, arrival, deadline in HANDOFFS:
        stage.submit(_handoff(rid, arrival, deadline))
    peak: list[int] = []
    order = _admission_order(stage, peak)
    # The first place goes by deadline among all five: d (5), b (10); then each freed place
    # to the earliest deadline still waiting: e (20), c (30), a (40).
    assert order == ["d", "b", "e", "c", "a"]
    assert max(peak) == 2  # bound reached, never exceeded (16 KV slots were free)
    assert stage.counters()["window_peak"] == 2 and stage.counters()["window_k"] == 2


def test_without_the_window_the_same_handoffs_go_fifo_and_all_at_once() -> None:
    stage = _talker("edf-mps", window=2)  # window K ignored: not vllm-omni-current
    assert stage.window_k is None and "window_peak" not in stage.counters()
    for rid, arrival, deadline in HANDOFFS:
        stage.submit(_handoff(rid, arrival, deadline))
    peak: list[int] = []
    assert _admission_order(stage, peak) == ["a", "b", "c", "d", "e"]
    assert max(peak) == 5


def test_k_is_capped_at_the_talkers_places_and_a_late_stream_keeps_its_deadline_place() -> None:
    stage = _talker("vllm-omni-current", window=1000)
    assert stage.window_k == PRESET.talker_limits.max_batch  # K = min(window, max_num_seqs)
    stage = _talker("vllm-omni-current", window=1)
    now = stage._clock()
    # "late" is past its deadline already: EDF keeps it first (no late-last rule).
    stage.submit(_handoff("on-time", now, now + 50.0))
    stage.submit(_handoff("late", now - 10.0, now - 1.0))
    peak: list[int] = []
    assert _admission_order(stage, peak) == ["late", "on-time"] and max(peak) == 1


# -- DTPS at the shared stage -------------------------------------------------------------------
@pytest.fixture(scope="module")
def thinker() -> DecoderLM:
    torch.manual_seed(0)
    return materialize(lambda: DecoderLM(PRESET.thinker), CPU, torch.float32)


class NoCap:
    levels: tuple[int, ...] = ()

    def activate(self, sms: int | None) -> None:
        assert sms is None  # the baselines run uncapped

    def close(self) -> None:
        pass


def _shared(model: DecoderLM, policy: str, waiting: Callable[[], int]) -> SharedStage:
    config = reference_config("tiny", policy=policy)
    return SharedStage(
        make_policy(policy, config),
        ArExecutor(model, PRESET.thinker_limits, keep_hidden=True),
        PRESET,
        config,
        emit=lambda _ev: None,
        handoff=lambda _target, _msg: None,
        downstream_active=waiting,
        pressure=lambda: None,
        publish=lambda _decision, _raw: None,
        sm=NoCap(),
        clock=Clock(),
        downstream_waiting=waiting,
    )


def _submit(stage: SharedStage, rid: str, down: str | None, tokens: int, age_s: float = 0) -> None:
    prio = {None: 0, SPEECH: 10, IMAGE: 20}[down]
    spec = RequestSpec(rid, priority=prio, input_tokens=tokens, output_tokens=2)
    stage.submit(Admit(spec, stage._clock() - age_s, down))


def _first_step(model: DecoderLM, policy: str, downstream_waiting: int) -> list[str]:
    stage = _shared(model, policy, lambda: downstream_waiting)
    _submit(stage, "text", None, 8)
    _submit(stage, "speech-long", SPEECH, 40)
    _submit(stage, "speech-short", SPEECH, 4)
    _submit(stage, "image", IMAGE, 12)
    _submit(stage, "text-2", None, 6)
    stage.iterate()
    return stage.last_plan_rids


def test_dtps_tiers_follow_the_downstream_queue_depth(thinker: DecoderLM) -> None:
    # Empty downstream queue: budget 2, the two shortest downstream-bound prompts go first.
    assert _first_step(thinker, "vllm-omni-current", 0) == [
        "speech-short", "image", "text", "text-2", "speech-long"
    ]  # fmt: skip
    # One waiting downstream: budget 1.
    assert _first_step(thinker, "vllm-omni-current", 1) == [
        "speech-short", "text", "text-2", "image", "speech-long"
    ]  # fmt: skip
    # Two or more waiting: budget 0, the shared-only requests go first, then shortest first.
    assert _first_step(thinker, "vllm-omni-current", 5) == [
        "text", "text-2", "speech-short", "image", "speech-long"
    ]  # fmt: skip
    # The same queue under plain MPS (FCFS): arrival order whatever the depth.
    assert _first_step(thinker, "mps", 5) == [
        "text", "speech-long", "speech-short", "image", "text-2"
    ]  # fmt: skip


def test_dtps_counts_running_downstream_bound_requests_and_serves_the_starving_first(
    thinker: DecoderLM,
) -> None:
    stage = _shared(thinker, "vllm-omni-current", lambda: 0)
    _submit(stage, "bound-running", SPEECH, 4)
    stage.iterate()  # now running here, downstream-bound: the budget drops to 1
    _submit(stage, "text", None, 8)
    _submit(stage, "image", IMAGE, 4)
    _submit(stage, "speech", SPEECH, 6)
    _submit(stage, "old-image", IMAGE, 30, age_s=DTPS_AGING_S + 1)  # L0: waited past aging
    stage.iterate()
    assert stage.last_plan_rids == ["old-image", "image", "text", "speech"]
    assert stage.dtps_budgets == {2: 1, 1: 1}


# -- end to end ----------------------------------------------------------------------------------
def _burst() -> list[TimedRequest]:
    """Speech, image and text requests arriving together (speech outnumbers the window)."""
    out = []
    for i in range(6):
        spec = RequestSpec(
            f"speech-{i}", priority=10, input_tokens=8, output_tokens=4, downstream_tokens=24
        )
        out.append(TimedRequest(0.01 * i, spec))
    for i in range(3):
        for name, prio in (("text", 0), ("image", 20)):
            spec = RequestSpec(f"{name}-{i}", priority=prio, input_tokens=8, output_tokens=4)
            out.append(TimedRequest(0.01 * i, spec))
    return out


def _served_all(result: object, n: int) -> None:
    records = result.records  # type: ignore[attr-defined]
    assert len(records) == n and not result.rejected and result.unfinished == 0  # type: ignore[attr-defined]
    assert all(r["error"] is None and r["first_response_s"] is not None for r in records)


def test_vllm_omni_current_serves_a_mixed_burst_within_its_window_and_tiers() -> None:
    options = PipelineOptions(
        preset="tiny", device="cpu", policy="vllm-omni-current", warmup=False, window=1
    )
    with ReferenceBackend(options) as backend:
        burst = _burst()
        _served_all(backend.run(burst, drain_timeout_s=120), len(burst))
        pipe = backend.pipeline
    speech = pipe.stage_info[SPEECH]["stopped"]
    assert speech["window_k"] == 1 and speech["window_peak"] == 1
    # Six speech streams through a window of one: hand-offs queue at the talker, the depth the
    # shared stage reads drops DTPS's budget to 0 (it starts at 2 on an empty queue).
    budgets = pipe.stage_info["shared"]["stopped"]["dtps_budget_steps"]
    assert int(budgets.get("0", 0)) > 0, budgets
    assert set(budgets) <= {"0", "1", "2"}


def test_mps_static_records_each_processs_share_and_runs_without_control() -> None:
    with pytest.raises(ValueError, match="share 132 SMs out of range"):
        Pipeline(
            PipelineOptions(preset="tiny", device="cpu", policy="mps-static", static_share=132)
        ).start()
    options = PipelineOptions(
        preset="tiny", device="cpu", policy="mps-static", warmup=False, static_share=40
    )
    with ReferenceBackend(options) as backend:
        burst = _burst()
        result = backend.run(burst, drain_timeout_s=120)
        _served_all(result, len(burst))
        pipe = backend.pipeline
        total = pipe.config.ladder.total
        assert pipe.static_shares == {
            "shared": 40, SPEECH: total - 40, IMAGE: total - 40, "code2wav": total - 40
        }  # fmt: skip
        for name, share in pipe.static_shares.items():
            info = pipe.stage_info[name]
            assert info["sm_share"] == share
            assert info["mps_thread_percentage"] == mps_percentage(share, total)
            assert info["sm_share_applied"] is False  # CPU: recorded, no effect
            assert "not a CUDA device" in info["sm_share_reason"]
        # No HorizonServe control: every step uncapped, FCFS, no DTPS tiers.
        assert result.trace and {row["level"] for row in result.trace} == {result.trace[0]["level"]}
        assert {row["shared_sms"] for row in result.trace} == {total}
        # The shares are fixed when a stage process starts: another policy needs a restart.
        with pytest.raises(SharingMismatchError, match="fixed SM shares"):
            pipe.set_policy("mps")
    assert "dtps_budget_steps" not in pipe.stage_info["shared"]["stopped"]


def test_default_share_is_the_sweeps_and_every_other_policy_has_none() -> None:
    stages = ("shared", SPEECH, "code2wav")
    got = static_shares("mps-static", "mimo_audio", 132, stages)
    assert got == {"shared": 112, SPEECH: 20, "code2wav": 20}
    assert got["shared"] == static_share("mimo_audio", 132)
    assert static_shares("mps", "mimo_audio", 132, stages) == {}
    assert mps_percentage(64, 132) == 49 and mps_percentage(132, 132) == 100
    with pytest.raises(ValueError):
        mps_percentage(0, 132)
