"""Downstream speech stage: talker (AR over codec codes) + code-to-waveform, one process.

The talker is prompted with the thinker's hidden states (projected to its width) and decodes
codec codes with its own continuous batch; every `code_chunk` codes of a request become one
waveform chunk through `Code2Wav`. A request's first chunk is its first response (TTFO).
The stage marks how many requests it has in flight in its control-record slot and runs its
kernels on the complementary SM count the shared stage published.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from horizonserve.runtime.downstream import PlaybackClock
from horizonserve.runtime.engine.reference.ar import ArExecutor
from horizonserve.runtime.engine.reference.batching import BatchPlan, ContinuousBatcher, Sequence
from horizonserve.runtime.engine.reference.models import Code2Wav
from horizonserve.runtime.engine.reference.presets import PipelinePreset
from horizonserve.runtime.engine.reference.protocol import (
    CHUNK,
    DONE,
    FIRST,
    SPEECH,
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


@dataclass(slots=True)
class SpeechJob:
    handoff: Handoff | None  # None: a synthetic calibration job
    cond: torch.Tensor  # [L, thinker_hidden] on the device
    codes: list[int] = field(default_factory=list)
    emitted: int = 0  # codes already turned into waveform
    chunks: int = 0
    samples: int = 0
    clock: PlaybackClock = field(default_factory=PlaybackClock)  # the stream's playback


def _rid(seq: Sequence) -> str:
    return seq.rid


class SpeechStage:
    def __init__(
        self,
        talker: ArExecutor,
        cond_proj: nn.Module,
        code2wav: Code2Wav,
        preset: PipelinePreset,
        *,
        emit: Callable[[Event], None],
        clock: Callable[[], float] = time.monotonic,
        rules: DownstreamRules | None = None,
    ) -> None:
        self.talker = talker
        self.cond_proj = cond_proj
        self.code2wav = code2wav
        self.chunk = preset.code_chunk  # codes per later waveform chunk
        self.first = preset.first_chunk or preset.code_chunk  # codes in the first chunk
        self.vocode_max = preset.code2wav_max_batch  # chunks vocoded per iteration (0: all)
        self.batcher = ContinuousBatcher(preset.talker_limits)
        self.rules = rules or DownstreamRules()
        self.pending: StageQueue[Sequence] = StageQueue(self.rules.slack, clock)
        self.audio_per_code_s = 1.0 / preset.codes_per_audio_second
        self.yielded = 0  # decode steps started streams gave up to first chunks
        self.emit = emit
        self._clock = clock
        self._synthetic = 0
        # Timing of the last iteration (calibration): talker part, vocoder part, chunks made.
        self.last_timing: tuple[float, float, int, int] = (0.0, 0.0, 0, 0)

    @property
    def in_flight(self) -> int:
        return len(self.pending) + len(self.batcher.running)

    @property
    def idle(self) -> bool:
        return self.in_flight == 0

    def submit(self, msg: Handoff) -> None:
        cond = msg.cond.to(self.talker.device).to(self.talker.dtype)
        target = msg.target if msg.target else DEFAULT_CHUNKS * self.chunk
        prompt, target = self.batcher.fit(cond.shape[0], target)
        job = SpeechJob(msg, cond[-prompt:])
        self.pending.append(Sequence(msg.rid, prompt, target, job), msg.stamp)

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
        return {"late_admitted": self.pending.late, "yielded_steps": self.yielded}

    def configure(self, rules: DownstreamRules) -> None:
        """The policy's rules: admission order, playback yielding, late refusal."""
        self.rules = rules
        self.pending.set_order(rules.slack)

    def _yielding(self, plan: BatchPlan) -> list[Sequence]:
        """This step's decodes: while a request waits for its first chunk, started streams
        holding more playback credit than the margin sit the step out (their audio is ahead
        of the listener, so a skipped step cannot make them underrun)."""
        margin = self.rules.yield_margin_s
        decode = plan.decode
        if margin is None or not decode:
            return decode
        if not (plan.prefill or self.pending or any(s.payload.chunks == 0 for s in decode)):
            return decode
        now = self._clock()
        kept = [s for s in decode if not s.payload.clock.may_yield(now, margin)]
        self.yielded += len(decode) - len(kept)
        return kept

    def min_slack(self) -> float:
        """Pending first outputs: queued requests and running ones before their first chunk
        (share left = codes still to make for it / the chunk size)."""
        first = self.first
        started = (
            (seq.payload.handoff.stamp, max(0, first - len(seq.payload.codes)) / first)
            for seq in self.batcher.running
            if seq.payload.handoff is not None and seq.payload.chunks == 0
        )
        return min_slack(self.pending, started, self._clock())

    @torch.inference_mode()
    def iterate(self) -> None:
        t0 = time.monotonic()
        refuse_late(self.pending, self.rules, STAGE, _rid, self.emit)
        if self.idle:
            return  # every queued request was refused as late
        # Candidates in the policy's admission order; listed only when a slot is free.
        free = self.pending and self.batcher.slots.free
        plan = self.batcher.plan(list(self.pending) if free else ())
        if plan.prefill:
            self.pending.take(plan.prefill)
        embeds = [self.cond_proj(seq.payload.cond) for seq in plan.prefill]
        self.talker.prefill(plan.prefill, embeds)
        decode = self._yielding(plan)
        self.talker.decode(decode)
        t1 = time.monotonic()
        ready: list[Sequence] = []
        for seq in plan.prefill + decode:
            job: SpeechJob = seq.payload
            job.codes.append(seq.last_token)
            size = self.first if job.chunks == 0 else self.chunk
            if len(job.codes) - job.emitted >= size or (seq.done and job.emitted < seq.target):
                ready.append(seq)
        ready = self._vocode_order(ready)
        emitted = [seq.payload.emitted for seq in ready]
        self._vocode(ready)
        t = self._clock()
        for seq, before in zip(ready, emitted, strict=True):
            job = seq.payload
            job.clock.on_chunk(t, (job.emitted - before) * self.audio_per_code_s)
        self.last_timing = (t1 - t0, time.monotonic() - t1, len(ready), len(plan.prefill))
        for seq in ready:
            job = seq.payload
            if job.chunks == 1:
                self.emit(Event(FIRST, STAGE, t, seq.rid, {"samples": job.samples}))
            else:  # later chunks: streaming and the front's underrun count
                data = {"chunk": job.chunks, "codes": job.emitted, "samples": job.samples}
                self.emit(Event(CHUNK, STAGE, t, seq.rid, data))
            if seq.done:
                data = {"chunks": job.chunks, "codes": len(job.codes), "samples": job.samples}
                self.emit(Event(DONE, STAGE, t, seq.rid, data))
                self.batcher.finish(seq)

    def _vocode_order(self, ready: list[Sequence]) -> list[Sequence]:
        """At most `code2wav_max_batch` chunks this iteration (the deploy's code2wav limit):
        first chunks first, then the streams with the least playback credit; the rest keep
        their codes for the next iteration."""
        limit = self.vocode_max
        if not limit or len(ready) <= limit:
            return ready
        now = self._clock()
        ready.sort(key=lambda s: (s.payload.chunks > 0, s.payload.clock.credit(now)))
        return ready[:limit]

    def _vocode(self, ready: list[Sequence]) -> None:
        """Turn each ready request's next chunk of codes into waveform (batched by length)."""
        by_len: dict[int, list[Sequence]] = {}
        for seq in ready:
            job: SpeechJob = seq.payload
            size = self.first if job.chunks == 0 else self.chunk
            n = min(size, len(job.codes) - job.emitted)
            by_len.setdefault(n, []).append(seq)
        device = self.talker.device
        for n, group in by_len.items():
            codes = torch.tensor(
                [s.payload.codes[s.payload.emitted : s.payload.emitted + n] for s in group],
                device=device,
            )
            codes = codes.clamp_(0, self.code2wav.dims.codebook - 1)
            wav = self.code2wav(codes)
            peak = wav.abs().amax(dim=1).tolist()  # host sync: the chunk exists now
            for s, _ in zip(group, peak, strict=True):
                s.payload.emitted += n
                s.payload.chunks += 1
                s.payload.samples += wav.shape[1]


# -- process entry ----------------------------------------------------------------------------


def main(cfg: Any, in_q: Any, events: Any) -> None:
    """Process body of the speech stage (see `stages.run_stage`)."""
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
    code2wav = materialize(lambda: Code2Wav(preset.code2wav), device, dtype)
    sink: list[Event] = []
    rules = downstream_rules(loop.config)
    stage = SpeechStage(talker, cond_proj, code2wav, preset, emit=sink.append, rules=rules)
    if cfg.warmup:
        h = preset.thinker.hidden
        loop.sm.activate(None)
        talker.warm_prefill(preset.talker_limits.max_prefill_tokens)
        for level in loop.warmup_levels():
            loop.sm.activate(level)
            stage.submit(_warmup_handoff(h, 2 * preset.code_chunk, dtype))
            while not stage.idle:
                stage.iterate()
            talker.precapture()
        loop.sm.activate(None)
    stage.emit = events.put
    info = {
        "params": preset.talker.params(),
        "load_s": time.monotonic() - t_load,
        "kv_cache_gib": talker.cache.nbytes() / 2**30,
        **talker.graph_info(),
    }
    loop.serve(stage, info)


def _warmup_handoff(hidden: int, codes: int, dtype: torch.dtype) -> Handoff:
    from horizonserve.runtime.engine.reference.protocol import WireTensor

    cond = WireTensor.of(torch.zeros(16, hidden, dtype=dtype))
    return Handoff("warmup", 0.0, cond, codes)
