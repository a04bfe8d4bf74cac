"""Downstream speech stage: the talker, AR over codec codes; the waveform is code2wav's.

The talker is prompted with the thinker's hidden states (projected to its width) and decodes
codec codes with its own continuous batch. A request's codes leave in chunks for the code2wav
stage (`CodeChunk`, sent as soon as a chunk is complete): the first `first_chunk` codes, then
every `code_chunk` codes, the rest when the request is done. Its first chunk becomes the first
response (TTFO) there. The talker's playback clock per request counts the audio it handed on
(codes × the codec's seconds per code), which its step yielding reads. The stage marks how many
requests it has in flight in its control-record slot and runs its kernels on the complementary
SM count the shared stage published.

Under `vllm-omni-current` (`runtime.baselines`) the talker runs vLLM-Omni's current rules, as
the simulator does (`runtime.audio_window`, the one home of both):

* bounded-K active streams, vllm-project/vllm-omni PR #3592 (merged; vLLM-Omni 0.30
  `OmniChunkTransferAdapter._active_window = min(active_stream_window, max_num_seqs)`): at
  most K streams hold a place (`audio_window.window_size`), a new one is admitted only into
  the room a finished one left (`audio_window.window_room`), an active stream keeps its place
  until it is done;
* EDF playback, vllm-project/vllm-omni PR #6600 (open; its first version PR #6599 closed
  unmerged; `active_stream_policy: edf`): the window is filled by first-audio deadline,
  earliest first, with no late-last rule (`audio_window.EdfQueue`).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from horizonserve.runtime.audio_window import window_room, window_size
from horizonserve.runtime.downstream import (
    PlaybackClock,
    reported_slack,
    streams_may_yield,
)
from horizonserve.runtime.engine.reference.ar import ArExecutor
from horizonserve.runtime.engine.reference.batching import BatchPlan, ContinuousBatcher, Sequence
from horizonserve.runtime.engine.reference.presets import PipelinePreset
from horizonserve.runtime.engine.reference.protocol import (
    CODE2WAV,
    SPEECH,
    CodeChunk,
    Event,
    Handoff,
)
from horizonserve.runtime.engine.reference.stages.admission import (
    DownstreamRules,
    StageQueue,
    downstream_rules,
    min_slack,
    refuse_late,
)

STAGE = SPEECH
DEFAULT_CHUNKS = 4  # chunks of speech per request when the trace gives no length
WARMUP_CODES = 64  # most codes the warm-up answer decodes per SM level (`warmup_codes`)


@dataclass(slots=True)
class SpeechJob:
    handoff: Handoff | None  # None: a synthetic calibration job (its chunks go nowhere)
    cond: torch.Tensor  # [L, thinker_hidden] on the device
    codes: list[int] = field(default_factory=list)  # codes not handed on yet (< one chunk)
    chunks: int = 0  # chunks handed on
    clock: PlaybackClock = field(default_factory=PlaybackClock)  # audio handed on vs playback


def _rid(seq: Sequence) -> str:
    return seq.rid


class SpeechStage:
    def __init__(
        self,
        talker: ArExecutor,
        cond_proj: nn.Module,
        preset: PipelinePreset,
        *,
        emit: Callable[[Event], None],
        send: Callable[[CodeChunk], None],
        clock: Callable[[], float] = time.monotonic,
        rules: DownstreamRules | None = None,
    ) -> None:
        self.talker = talker
        self.cond_proj = cond_proj
        self.chunk = preset.code_chunk  # codes per later waveform chunk
        self.first = preset.first_chunk or preset.code_chunk  # codes in the first chunk
        self.batcher = ContinuousBatcher(preset.talker_limits)
        self.rules = rules or DownstreamRules()
        self.pending: StageQueue[Sequence] = StageQueue(self.rules.slack, clock, self.rules.edf)
        self.window_k = self._window(self.rules)  # K of the bounded-K window (None: no window)
        self.window_peak = 0  # most streams active at once since the window was set
        self.audio_per_code_s = 1.0 / preset.codes_per_audio_second
        self.yielded = 0  # decode steps started streams gave up to first chunks
        # Seconds per decode step (one code per stream), an EWMA of the talker's measured steps:
        # the place-aware admission's time per unit of work (0 until a step was measured).
        self.step_s = 0.0
        self.emit = emit
        self.send = send  # a chunk to the code2wav stage
        self._clock = clock
        self._synthetic = 0
        # Timing of the last iteration (calibration): talker s, 0 (the vocoder's part, made by
        # the code2wav stage), chunks handed on, prompts prefilled.
        self.last_timing: tuple[float, float, int, int] = (0.0, 0.0, 0, 0)

    @property
    def in_flight(self) -> int:
        return len(self.pending) + len(self.batcher.running)

    @property
    def idle(self) -> bool:
        return self.in_flight == 0

    @property
    def waiting(self) -> int:
        """Hand-offs queued for a place (the queue depth DTPS reads at the shared stage)."""
        return len(self.pending)

    def _window(self, rules: DownstreamRules) -> int | None:
        if not rules.window:
            return None
        return window_size(rules.window_k, self.batcher.limits.max_batch)

    def _room(self) -> int:
        """Places a new stream may take now: the free KV slots, and within the window's room."""
        free = self.batcher.slots.free
        if self.window_k is None:
            return free
        return min(free, window_room(self.window_k, len(self.batcher.running)))

    def submit(self, msg: Handoff) -> None:
        cond = msg.cond.to(self.talker.device).to(self.talker.dtype)
        target = msg.target if msg.target else DEFAULT_CHUNKS * self.chunk
        prompt, target = self.batcher.fit(cond.shape[0], target)
        job = SpeechJob(msg, cond[-prompt:])
        self.pending.append(Sequence(msg.rid, prompt, target, job), msg.stamp, target)

    def add_synthetic(self, n: int, prompt: int = 64) -> None:
        """Top the stage up to `n` in flight with endless synthetic jobs (calibration load)."""
        hidden = self.cond_proj.in_features
        while self.in_flight < n:
            cond = torch.randn(prompt, hidden, device=self.talker.device, dtype=self.talker.dtype)
            p, target = self.batcher.fit(prompt, self.batcher.limits.max_len - prompt)
            self._synthetic += 1
            seq = Sequence(f"load-{self._synthetic}", p, target, SpeechJob(None, cond[-p:]))
            self.pending.append(seq, None)

    def abort(self, before: float) -> int:
        """Drop requests that arrived at or before `before` (KV slots freed); returns how many."""

        def hit(seq: Sequence) -> bool:
            h = seq.payload.handoff
            return h is not None and h.arrival <= before

        n = self.in_flight
        self.pending.retain(lambda seq: not hit(seq))
        for seq in [seq for seq in self.batcher.running if hit(seq)]:
            self.batcher.finish(seq)
        return n - self.in_flight

    def cancel(self, requests: tuple[tuple[str, float], ...]) -> int:
        """Drop these (id, arrival) requests (KV slots freed); returns how many."""
        n, gone = self.in_flight, dict(requests)

        def hit(seq: Sequence) -> bool:
            h = seq.payload.handoff
            return h is not None and gone.get(seq.rid) == h.arrival

        self.pending.retain(lambda seq: not hit(seq))
        for seq in [seq for seq in self.batcher.running if hit(seq)]:
            self.batcher.finish(seq)
        return n - self.in_flight

    def cancel_all(self) -> None:
        """Drop every job (calibration only: nothing real is in flight then)."""
        self.pending.clear()
        for seq in list(self.batcher.running):
            self.batcher.finish(seq)

    def counters(self) -> dict[str, int]:
        """Admissions past the point where the deadline could be met; decode steps started
        streams yielded to first chunks."""
        out = {"late_admitted": self.pending.late, "yielded_steps": self.yielded}
        if self.window_k is not None:
            out.update(window_k=self.window_k, window_peak=self.window_peak)
        return out

    def configure(self, rules: DownstreamRules) -> None:
        """The policy's rules: admission order, playback yielding, late refusal, window."""
        self.rules = rules
        self.pending.set_order(rules.slack, rules.edf)
        self.window_k = self._window(rules)
        self.window_peak = 0

    def _yielding(self, plan: BatchPlan) -> list[Sequence]:
        """This step's decodes: while a request in the step waits for its first chunk and none
        waits for a place (`streams_may_yield`), started streams holding more playback credit
        than the margin sit the step out (their audio is ahead of the listener, so a skipped
        step cannot make them underrun). Call after admission: `pending` is what waits."""
        margin = self.rules.yield_margin_s
        decode = plan.decode
        if margin is None or not decode:
            return decode
        first_in_step = bool(plan.prefill) or any(s.payload.chunks == 0 for s in decode)
        if not streams_may_yield(first_in_step, waiting_for_place=bool(self.pending)):
            return decode
        now = self._clock()
        kept = [s for s in decode if not s.payload.clock.may_yield(now, margin)]
        self.yielded += len(decode) - len(kept)
        return kept

    def _candidates(self) -> list[Sequence]:
        """The queued requests in admission order. Under `places` (and once a step was timed),
        the head of the place-aware order, as many as slots are free: the free slots now, each
        running stream's slot once its codes left are made at the measured step time."""
        if not self._projects_places():
            listed = list(self.pending)
            return listed if self.window_k is None else listed[: self._room()]
        free = self._room()
        return self.pending.ordered(self._free_at(self._clock()), self.step_s, free)

    def _projects_places(self) -> bool:
        """Place admission is on and a step was timed: each place's free time is known."""
        return self.rules.places and self.step_s > 0.0

    def _free_at(self, now: float) -> list[float]:
        """When each place frees: now for a free one, a running stream's once its codes left
        are made at the measured step time."""
        per, running = self.step_s, self.batcher.running
        busy = sorted(now + (seq.target - seq.generated) * per for seq in running)
        return [now] * self.batcher.slots.free + busy

    def min_slack(self) -> float:
        """Pending first outputs: queued requests and running ones before their first chunk
        (share left = codes still to make for it / the chunk size). While every place is taken
        under `saturated_first`: SATURATED while an on-time request waits (`reported_slack`)."""
        first = self.first
        started = (
            (seq.payload.handoff.stamp, (first - len(seq.payload.codes)) / first)
            for seq in self.batcher.running
            if seq.payload.handoff is not None and seq.payload.chunks == 0
        )
        now = self._clock()
        u = min_slack(self.pending, started, now)
        full = self._room() == 0
        return reported_slack(u, full, self.pending.peek_slack(), self.rules.saturated_first)

    @torch.inference_mode()
    def iterate(self) -> None:
        t0 = time.monotonic()
        refuse_late(self.pending, self.rules, STAGE, _rid, self.emit)
        if self.idle:
            return  # every queued request was refused as late
        # Candidates in the policy's admission order; listed only when a place is free (a KV
        # slot, and room in the window where there is one).
        free = self.pending and self._room()
        plan = self.batcher.plan(self._candidates() if free else ())
        if plan.prefill:
            self.pending.take(plan.prefill)
        # Invariant under the window: never more than K streams active.
        self.window_peak = max(self.window_peak, len(self.batcher.running))
        embeds = [self.cond_proj(seq.payload.cond) for seq in plan.prefill]
        self.talker.prefill(plan.prefill, embeds)
        decode = self._yielding(plan)
        self.talker.decode(decode)
        t1 = time.monotonic()
        if decode and not plan.prefill:  # a pure decode step: one code per stream
            dt = t1 - t0
            self.step_s = dt if self.step_s == 0.0 else 0.8 * self.step_s + 0.2 * dt
        now, sent = self._clock(), 0
        for seq in plan.prefill + decode:
            job: SpeechJob = seq.payload
            job.codes.append(seq.last_token)
            size = self.first if job.chunks == 0 else self.chunk
            if len(job.codes) >= size or seq.done:  # never more than a chunk is held back
                self._hand_on(seq, job, now)
                sent += 1
            if seq.done:
                self.batcher.finish(seq)
        self.last_timing = (t1 - t0, 0.0, sent, len(plan.prefill))

    def _hand_on(self, seq: Sequence, job: SpeechJob, now: float) -> None:
        """Send the job's held codes as its next chunk; its playback clock gets their audio."""
        h = job.handoff
        if h is not None:
            msg = CodeChunk(seq.rid, h.arrival, job.chunks, tuple(job.codes), seq.done, h.stamp)
            self.send(msg)
        job.clock.on_chunk(now, len(job.codes) * self.audio_per_code_s)
        job.chunks += 1
        job.codes.clear()


# -- process entry ----------------------------------------------------------------------------


def main(cfg: Any, in_q: Any, events: Any, handoff_qs: dict[str, Any]) -> None:
    """Process body of the speech stage (see `stages.run_stage`); its chunks go to
    `handoff_qs[CODE2WAV]`."""
    from horizonserve.runtime.engine.reference.models import DecoderLM, materialize
    from horizonserve.runtime.engine.reference.stages.downstream import DownstreamLoop

    loop = DownstreamLoop(cfg, STAGE, in_q, events)
    preset = loop.preset
    device, dtype = loop.device, loop.dtype
    t_load = time.monotonic()
    talker_model = materialize(lambda: DecoderLM(preset.talker), device, dtype)
    talker = ArExecutor(
        talker_model,
        preset.talker_limits,
        keep_hidden=False,
        graphs=cfg.graphs and preset.graphs_for("talker"),
    )
    cond_proj = materialize(
        lambda: nn.Linear(preset.thinker.hidden, preset.talker.hidden), device, dtype
    )
    sink: list[Any] = []  # warm-up events and chunks, never sent
    rules = downstream_rules(loop.config, window=cfg.window)
    stage = SpeechStage(talker, cond_proj, preset, emit=sink.append, send=sink.append, rules=rules)
    if cfg.warmup:
        h = preset.thinker.hidden
        loop.sm.activate(None)
        talker.warm_prefill(preset.talker_limits.max_prefill_tokens)
        for level in loop.warmup_levels():
            loop.sm.activate(level)
            stage.submit(_warmup_handoff(h, warmup_codes(preset), dtype))
            while not stage.idle:
                stage.iterate()
            talker.precapture()
        loop.sm.activate(None)
    stage.emit, stage.send = events.put, handoff_qs[CODE2WAV].put
    info = {
        "params": preset.talker.params(),
        "load_s": time.monotonic() - t_load,
        "kv_cache_gib": talker.cache.nbytes() / 2**30,
        **talker.graph_info(),
    }
    loop.serve(stage, info)


def warmup_codes(preset: PipelinePreset) -> int:
    """Codes of the warm-up answer decoded at every SM level: the first chunk and one later
    chunk where the answer streams, so both hand-off paths run. At most `WARMUP_CODES`: where the
    deploy sends each answer whole, a "chunk" is a whole KV slot, and decoding two slots per level
    eagerly (the stock profile) held the full preset's start-up for minutes."""
    first = preset.first_chunk or preset.code_chunk
    return min(first + preset.code_chunk, WARMUP_CODES)


def _warmup_handoff(hidden: int, codes: int, dtype: torch.dtype) -> Handoff:
    from horizonserve.runtime.engine.reference.protocol import WireTensor

    cond = WireTensor.of(torch.zeros(16, hidden, dtype=dtype))
    return Handoff("warmup", 0.0, cond, codes)
