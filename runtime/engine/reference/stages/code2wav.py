"""Downstream code-to-waveform stage: the talker's codec codes become waveform, chunk by chunk.

The talker (speech stage) sends each request's codes as `CodeChunk`s: the first `first_chunk`
codes, then `code_chunk` codes each, the last one possibly shorter. Every iteration vocodes at
most `code2wav_max_batch` chunks (the deploy's code2wav limit; 0: all), at most one per request
so a stream's chunks come out in order: first chunks first (a first chunk is its request's
first response, TTFO), then the streams with the least playback credit. The rest wait for the
next iteration. A request's first chunk emits FIRST, later ones CHUNK, its last one DONE too.
"""

from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from horizonserve.runtime.downstream import PlaybackClock
from horizonserve.runtime.engine.reference.models import Code2Wav
from horizonserve.runtime.engine.reference.presets import PipelinePreset
from horizonserve.runtime.engine.reference.protocol import (
    CHUNK,
    CODE2WAV,
    DONE,
    FIRST,
    CodeChunk,
    Event,
)
from horizonserve.runtime.engine.reference.stages.admission import DownstreamRules, min_slack

STAGE = CODE2WAV


@dataclass(slots=True)
class Stream:
    """One request's waveform so far; its chunks wait in `queued`, oldest first."""

    rid: str
    arrival: float
    queued: deque[CodeChunk] = field(default_factory=deque)
    codes: int = 0  # codes vocoded
    samples: int = 0  # waveform samples made
    clock: PlaybackClock = field(default_factory=PlaybackClock)  # the stream's playback


def vocode_order(
    heads: list[tuple[CodeChunk, Stream]], limit: int, now: float
) -> list[tuple[CodeChunk, Stream]]:
    """At most `limit` chunks (0: all): first chunks first, then the streams with the least
    playback credit."""
    if not limit or len(heads) <= limit:
        return heads
    heads.sort(key=lambda h: (h[0].index > 0, h[1].clock.credit(now)))
    return heads[:limit]


class Code2WavStage:
    def __init__(
        self,
        code2wav: Code2Wav,
        preset: PipelinePreset,
        *,
        emit: Callable[[Event], None],
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.code2wav = code2wav
        p = next(code2wav.parameters())
        self.device = p.device
        self.chunk = preset.code_chunk  # codes per later chunk (the synthetic load's size)
        self.max_batch = preset.code2wav_max_batch
        self.audio_per_code_s = 1.0 / preset.codes_per_audio_second
        self.streams: dict[tuple[str, float], Stream] = {}
        self.queued = 0  # chunks waiting over all streams
        self.vocoded = 0  # chunks made (reported when the stage stops)
        self.emit = emit
        self._clock = clock
        self._synthetic = 0
        # Timing of the last iteration (calibration): (0, vocoder s, chunks, 0), the row
        # layout the talker shares (its part first, the vocoder's second).
        self.last_timing: tuple[float, float, int, int] = (0.0, 0.0, 0, 0)

    @property
    def in_flight(self) -> int:
        return self.queued

    @property
    def idle(self) -> bool:
        return self.queued == 0

    @property
    def waiting(self) -> int:
        """Chunks queued (no hand-off from the shared stage reaches this stage: DTPS never
        reads it)."""
        return self.queued

    def submit(self, msg: CodeChunk) -> None:
        key = (msg.rid, msg.arrival)
        stream = self.streams.get(key)
        if stream is None:
            stream = self.streams[key] = Stream(msg.rid, msg.arrival)
        stream.queued.append(msg)
        self.queued += 1

    def add_synthetic(self, n: int) -> None:
        """Top the stage up to `n` queued chunks of `code_chunk` random codes (calibration)."""
        codebook = self.code2wav.dims.codebook
        while self.queued < n:
            self._synthetic += 1
            codes = tuple(torch.randint(0, codebook, (self.chunk,)).tolist())
            self.submit(CodeChunk(f"load-{self._synthetic}", math.inf, 1, codes, True))

    def _drop(self, hit: Callable[[Stream], bool]) -> int:
        gone = [key for key, s in self.streams.items() if hit(s)]
        for key in gone:
            self.queued -= len(self.streams.pop(key).queued)
        return len(gone)

    def abort(self, before: float) -> int:
        """Drop the streams of requests that arrived at or before `before`; returns how many."""
        return self._drop(lambda s: s.arrival <= before)

    def cancel(self, requests: tuple[tuple[str, float], ...]) -> int:
        """Drop the streams of these (id, arrival) requests; returns how many."""
        gone = set(requests)
        return self._drop(lambda s: (s.rid, s.arrival) in gone)

    def cancel_all(self) -> None:
        self._drop(lambda _s: True)

    def counters(self) -> dict[str, int]:
        return {"chunks_vocoded": self.vocoded}

    def configure(self, rules: DownstreamRules) -> None:
        """Nothing to follow: the chunk order is the deploy's (first chunks, then credit) under
        every policy, and a chunk of an admitted request is never refused."""

    def min_slack(self) -> float:
        """Queued first chunks: the talker's part of their first output is done (share 0)."""
        firsts = (
            (s.queued[0].stamp, 0.0)
            for s in self.streams.values()
            if s.queued and s.queued[0].index == 0
        )
        return min_slack(None, firsts, self._clock())

    @torch.inference_mode()
    def iterate(self) -> None:
        t0 = time.monotonic()
        heads = [(s.queued[0], s) for s in self.streams.values() if s.queued]
        picked = vocode_order(heads, self.max_batch, self._clock())
        self._vocode(picked)
        t = self._clock()
        self.last_timing = (0.0, time.monotonic() - t0, len(picked), 0)
        for msg, stream in picked:
            stream.clock.on_chunk(t, len(msg.codes) * self.audio_per_code_s)
            if msg.index == 0:
                self.emit(Event(FIRST, STAGE, t, msg.rid, {"samples": stream.samples}))
            else:  # later chunks: streaming and the front's underrun count
                data = {"chunk": msg.index + 1, "codes": stream.codes, "samples": stream.samples}
                self.emit(Event(CHUNK, STAGE, t, msg.rid, data))
            if msg.last:
                data = {"chunks": msg.index + 1, "codes": stream.codes, "samples": stream.samples}
                self.emit(Event(DONE, STAGE, t, msg.rid, data))
                self.streams.pop((msg.rid, msg.arrival), None)

    def _vocode(self, picked: list[tuple[CodeChunk, Stream]]) -> None:
        """Turn each picked chunk into waveform (batched by length); dequeues them."""
        by_len: dict[int, list[tuple[CodeChunk, Stream]]] = {}
        for msg, stream in picked:
            by_len.setdefault(len(msg.codes), []).append((msg, stream))
        for n, group in by_len.items():
            codes = torch.tensor([msg.codes for msg, _ in group], device=self.device)
            codes = codes.clamp_(0, self.code2wav.dims.codebook - 1)
            wav = self.code2wav(codes)
            wav.abs().amax(dim=1).tolist()  # host sync: the chunks exist now
            for _msg, stream in group:
                stream.queued.popleft()
                stream.codes += n
                stream.samples += wav.shape[1]
        self.queued -= len(picked)
        self.vocoded += len(picked)


# -- process entry ----------------------------------------------------------------------------


def main(cfg: Any, in_q: Any, events: Any) -> None:
    """Process body of the code2wav stage (see `stages.run_stage`)."""
    from horizonserve.runtime.engine.reference.models import materialize
    from horizonserve.runtime.engine.reference.stages.downstream import DownstreamLoop

    loop = DownstreamLoop(cfg, STAGE, in_q, events)
    preset = loop.preset
    t_load = time.monotonic()
    code2wav = materialize(lambda: Code2Wav(preset.code2wav), loop.device, loop.dtype)
    sink: list[Event] = []
    stage = Code2WavStage(code2wav, preset, emit=sink.append)
    if cfg.warmup:
        first = preset.first_chunk or preset.code_chunk
        for level in loop.warmup_levels():
            loop.sm.activate(level)
            for i, n in enumerate((first, preset.code_chunk)):  # both chunk lengths
                stage.submit(CodeChunk("warmup", 0.0, i, (0,) * n, i == 1))
            while not stage.idle:
                stage.iterate()
        loop.sm.activate(None)
    stage.emit = events.put
    n_params = sum(p.numel() for p in code2wav.parameters())
    loop.serve(stage, {"params": n_params, "load_s": time.monotonic() - t_load})
