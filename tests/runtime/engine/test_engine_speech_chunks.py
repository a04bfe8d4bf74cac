"""The talker → code2wav split in-process (tiny models, CPU): the talker's chunks follow the
deploy description's sizes, code2wav's batch limit and order, abort and cancel there."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import replace

import pytest

torch = pytest.importorskip("torch")

from horizonserve.runtime.downstream import SATURATED, Stamp  # noqa: E402
from horizonserve.runtime.engine.reference.ar import ArExecutor  # noqa: E402
from horizonserve.runtime.engine.reference.models import (  # noqa: E402
    Code2Wav,
    DecoderLM,
    materialize,
)
from horizonserve.runtime.engine.reference.presets import get_preset  # noqa: E402
from horizonserve.runtime.engine.reference.protocol import (  # noqa: E402
    CHUNK,
    CODE2WAV,
    DONE,
    FIRST,
    CodeChunk,
    Event,
    Handoff,
    WireTensor,
)
from horizonserve.runtime.engine.reference.stages.admission import DownstreamRules  # noqa: E402
from horizonserve.runtime.engine.reference.stages.code2wav import Code2WavStage  # noqa: E402
from horizonserve.runtime.engine.reference.stages.speech import (  # noqa: E402
    WARMUP_CODES,
    SpeechStage,
    warmup_codes,
)

CPU = torch.device("cpu")
# first chunk and later chunks of different sizes, and a code2wav limit of 2 per iteration
PRESET = replace(get_preset("tiny"), first_chunk=3, code_chunk=2, code2wav_max_batch=2)


def _talker(
    chunks: list[CodeChunk],
    slots: int | None = None,
    clock: Callable[[], float] | None = None,
    rules: DownstreamRules | None = None,
) -> SpeechStage:
    """A tiny talker on CPU; `slots` places (the preset's by default), `clock` its clock."""
    preset = PRESET
    if slots is not None:
        preset = replace(PRESET, talker_limits=replace(PRESET.talker_limits, max_batch=slots))
    torch.manual_seed(0)
    model = materialize(lambda: DecoderLM(preset.talker), CPU, torch.float32)
    talker = ArExecutor(model, preset.talker_limits, keep_hidden=False, graphs=False)
    proj = materialize(
        lambda: torch.nn.Linear(preset.thinker.hidden, preset.talker.hidden), CPU, torch.float32
    )
    timing = {} if clock is None else {"clock": clock}
    return SpeechStage(
        talker, proj, preset, emit=lambda _ev: None, send=chunks.append, rules=rules, **timing
    )


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def _vocoder(events: list[Event], clock: Clock) -> Code2WavStage:
    torch.manual_seed(0)
    model = materialize(lambda: Code2Wav(PRESET.code2wav), CPU, torch.float32)
    return Code2WavStage(model, PRESET, emit=events.append, clock=clock)


def _handoff(rid: str, codes: int, arrival: float = 1.0) -> Handoff:
    cond = WireTensor.of(torch.zeros(4, PRESET.thinker.hidden))
    return Handoff(rid, arrival, cond, codes, Stamp(rid, "speech", 10, arrival, 50.0, 1.0))


def test_talker_hands_on_a_first_chunk_then_chunks_of_the_deploys_sizes() -> None:
    chunks: list[CodeChunk] = []
    stage = _talker(chunks)
    stage.submit(_handoff("a", 8))
    stage.submit(_handoff("b", 2))  # shorter than the first chunk: one last, partial chunk
    while not stage.idle:
        stage.iterate()
    a = [c for c in chunks if c.rid == "a"]
    assert [len(c.codes) for c in a] == [3, 2, 2, 1]  # first_chunk, code_chunk ..., the rest
    assert [c.index for c in a] == [0, 1, 2, 3] and [c.last for c in a] == [0, 0, 0, 1]
    assert all(c.stamp is not None and c.arrival == 1.0 for c in a)
    (b,) = [c for c in chunks if c.rid == "b"]
    assert (b.index, len(b.codes), b.last) == (0, 2, True)
    assert stage.last_timing[1] == 0.0  # the vocoder's part is code2wav's now


def test_the_warm_up_answer_runs_both_chunk_paths_and_stays_short_when_answers_go_whole() -> None:
    chunks: list[CodeChunk] = []
    stage = _talker(chunks)
    stage.submit(_handoff("warmup", warmup_codes(PRESET)))
    while not stage.idle:
        stage.iterate()
    assert [len(c.codes) for c in chunks] == [3, 2]  # a first chunk, then a later one
    streamed, whole = get_preset("full", "tuned"), get_preset("full", "stock")
    assert warmup_codes(streamed) == streamed.first_chunk + streamed.code_chunk
    # stock sends each answer whole: its one "chunk" is a KV slot, far past the bound
    assert whole.code_chunk == whole.talker_limits.max_len > WARMUP_CODES
    assert warmup_codes(whole) == WARMUP_CODES


def test_talker_playback_credit_counts_the_codes_it_handed_on() -> None:
    chunks: list[CodeChunk] = []
    stage = _talker(chunks)
    stage.submit(_handoff("a", 100))
    while len(chunks) < 2:
        stage.iterate()
    (seq,) = stage.batcher.running
    handed = sum(len(c.codes) for c in chunks)
    assert seq.payload.clock.generated_s == pytest.approx(handed / PRESET.codes_per_audio_second)
    assert seq.payload.chunks == 2 and not seq.payload.codes  # nothing held past a chunk


def _chunk(rid: str, index: int, n: int, last: bool = False, arrival: float = 1.0) -> CodeChunk:
    stamp = Stamp(rid, "speech", 10, arrival, 150.0, 1.0)
    return CodeChunk(rid, arrival, index, tuple(range(n)), last, stamp)


def test_code2wav_serves_first_chunks_first_then_the_least_credit_within_its_limit() -> None:
    events: list[Event] = []
    clock = Clock()
    stage = _vocoder(events, clock)
    stage.submit(_chunk("ahead", 0, 6))  # two started streams, one with more audio ...
    stage.submit(_chunk("behind", 0, 3))
    stage.iterate()
    assert [(e.kind, e.rid) for e in events] == [(FIRST, "ahead"), (FIRST, "behind")]
    assert all(e.stage == CODE2WAV for e in events)
    stage.submit(_chunk("ahead", 1, 2))
    stage.submit(_chunk("ahead", 2, 2))
    clock.t += 0.5
    stage.submit(_chunk("behind", 1, 2))
    stage.submit(_chunk("first", 0, 3))  # ... and a request still waiting for its first chunk
    events.clear()
    stage.iterate()
    assert [(e.kind, e.rid) for e in events] == [(FIRST, "first"), (CHUNK, "behind")]
    assert stage.last_timing[2] == 2 and stage.in_flight == 2  # the limit: 2 per iteration
    events.clear()
    stage.iterate()  # one chunk per stream and iteration: its chunks stay in order
    assert [(e.kind, e.rid, e.data["chunk"]) for e in events] == [(CHUNK, "ahead", 2)]
    stage.submit(_chunk("behind", 2, 1, last=True))
    events.clear()
    while not stage.idle:
        stage.iterate()
    kinds = [(e.kind, e.rid) for e in events]
    assert kinds == [(CHUNK, "ahead"), (CHUNK, "behind"), (DONE, "behind")]
    spc = PRESET.code2wav.samples_per_code
    done = events[-1].data
    assert done == {"chunks": 3, "codes": 6, "samples": 6 * spc}
    assert events[-2].data == {"chunk": 3, "codes": 6, "samples": 6 * spc}


def test_code2wav_reports_its_pending_first_chunks_as_slack() -> None:
    stage = _vocoder([], Clock())
    assert stage.min_slack() != stage.min_slack()  # NaN: nothing pending
    stage.submit(_chunk("a", 0, 3))
    assert stage.min_slack() > 0  # its deadline (150 s) is ahead of the clock (100 s)
    stage.iterate()
    stage.submit(_chunk("a", 1, 2))
    assert stage.min_slack() != stage.min_slack()  # a later chunk is not a first output


def test_a_full_talker_with_an_on_time_request_waiting_reports_itself_saturated() -> None:
    clock = Clock()
    rules = DownstreamRules(slack=True, saturated_first=True)
    stage = _talker([], slots=1, clock=clock, rules=rules)
    plain = _talker([], slots=1, clock=clock, rules=DownstreamRules(slack=True))

    def handoff(rid: str, deadline: float) -> Handoff:
        cond = WireTensor.of(torch.zeros(4, PRESET.thinker.hidden))
        return Handoff(rid, 1.0, cond, 40, Stamp(rid, "speech", 10, 1.0, deadline, 1.0))

    for st in (stage, plain):
        st.submit(handoff("a", 150.0))
        st.iterate()  # "a" takes the one place
        assert st.min_slack() > 0  # nobody waits: its own first chunk's slack
        st.submit(handoff("b", 150.0))  # on time (150 - 100 s left against 1 s of work)
    assert stage.min_slack() == SATURATED
    assert math.isfinite(plain.min_slack()) and plain.min_slack() > 0  # off: the slack itself
    clock.t = 149.5  # "b" can no longer start in time: a late waiter does not count
    assert stage.min_slack() != SATURATED


def test_code2wav_abort_and_cancel_drop_streams_and_their_queued_chunks() -> None:
    events: list[Event] = []
    stage = _vocoder(events, Clock())
    for rid, arrival in (("a", 1.0), ("b", 2.0), ("c", 3.0)):
        stage.submit(_chunk(rid, 0, 3, arrival=arrival))
        stage.submit(_chunk(rid, 1, 2, arrival=arrival))
    assert stage.abort(1.5) == 1 and stage.in_flight == 4
    assert stage.cancel((("b", 2.0), ("c", 99.0))) == 1 and stage.in_flight == 2
    while not stage.idle:
        stage.iterate()
    assert {e.rid for e in events} == {"c"}
    assert stage.counters() == {"chunks_vocoded": 2}


def test_preset_chunk_sizes_come_from_the_deploy_description() -> None:
    full = get_preset("full")
    assert (full.first_chunk, full.code_chunk, full.code2wav_max_batch) == (25, 25, 16)


def _yielding_talker(chunks: list[CodeChunk], slots: int) -> SpeechStage:
    """A talker with `slots` places whose streams yield above 0.5 s of credit; its clock
    stands still, so a started stream's credit only grows."""
    stage = _talker(chunks, slots, clock=lambda: 100.0)
    stage.configure(DownstreamRules(slack=True, yield_margin_s=0.5))
    return stage


def _codes(chunks: list[CodeChunk], rid: str) -> int:
    return sum(len(c.codes) for c in chunks if c.rid == rid)


def test_a_started_stream_yields_to_a_first_chunk_in_the_step() -> None:
    chunks: list[CodeChunk] = []
    stage = _yielding_talker(chunks, slots=2)
    stage.submit(_handoff("a", 40))
    for _ in range(4):  # its first chunk (3 codes, 0.75 s of audio at 4 codes/s) is out
        stage.iterate()
    before = len(stage.batcher.running[0].payload.codes) + _codes(chunks, "a")
    stage.submit(_handoff("b", 8))
    stage.iterate()  # b is admitted: a, 0.75 s ahead of its listener, sits the step out
    assert stage.yielded == 1
    assert len(stage.batcher.running[0].payload.codes) + _codes(chunks, "a") == before
    while not stage.idle:
        stage.iterate()
    assert _codes(chunks, "a") == 40 and _codes(chunks, "b") == 8


def test_no_stream_yields_while_a_request_waits_for_a_place() -> None:
    """Yielding frees no place: with every place taken and a request waiting, the started
    stream keeps decoding until it finishes, and the waiting request is served after it."""
    chunks: list[CodeChunk] = []
    stage = _yielding_talker(chunks, slots=1)
    stage.submit(_handoff("a", 40))
    for _ in range(4):
        stage.iterate()
    stage.submit(_handoff("b", 8))  # no place: it waits
    for _ in range(200):
        if stage.idle:
            break
        stage.iterate()
    assert stage.idle, "a stream yielding to a request without a place never finishes"
    assert stage.yielded == 0
    assert _codes(chunks, "a") == 40 and _codes(chunks, "b") == 8


def _stamped(rid: str, codes: int, late_at: float) -> Handoff:
    cond = WireTensor.of(torch.zeros(4, PRESET.thinker.hidden))
    return Handoff(rid, 1.0, cond, codes, Stamp(rid, "speech", 10, 1.0, late_at + 1.0, 1.0))


def test_with_places_the_talker_admits_two_short_answers_before_one_long_one() -> None:
    """One place, held by a stream with 4 codes left; at 1 s a step (set, so the test does not
    hang on CPU timing) it frees at 104. Deadline order would start the long answer (60 codes)
    there and both short ones (4 codes each) would miss; the place-aware order starts them."""
    chunks: list[CodeChunk] = []
    stage = _talker(chunks, slots=1, clock=Clock())
    stage.configure(DownstreamRules(slack=True, places=True))
    stage.submit(_stamped("run", 5, 1e9))
    stage.iterate()  # its prefill: the first code, 4 left
    for rid, codes, late_at in (("long", 60, 105.0), ("short-a", 4, 110.0), ("short-b", 4, 111.0)):
        stage.submit(_stamped(rid, codes, late_at))
    # The place "run" holds frees at 104 (4 codes at 1 s); deadline order lists "long" first.
    assert [s.rid for s in stage.pending] == ["long", "short-a", "short-b"]
    placed = stage.pending.ordered([104.0], 1.0, 3)
    assert [s.rid for s in placed] == ["short-a", "short-b", "long"]
    stage.step_s = 1.0
    assert stage._candidates() == []  # no slot free: nothing to list
    firsts: list[str] = []
    while not stage.idle:
        stage.step_s = 1.0  # the measured steps are CPU-fast; hold the scale the test reads
        stage.iterate()
        for c in chunks:
            if c.index == 0 and c.rid not in firsts:
                firsts.append(c.rid)
    assert firsts == ["run", "short-a", "short-b", "long"]
