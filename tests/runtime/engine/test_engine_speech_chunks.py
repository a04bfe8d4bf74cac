"""The speech stage's chunking rules from the deploy description (no model needed)."""

from __future__ import annotations

import pytest

pytest.importorskip("torch")

from horizonserve.runtime.engine.reference.batching import Sequence
from horizonserve.runtime.engine.reference.presets import get_preset
from horizonserve.runtime.engine.reference.stages.speech import (
    SpeechJob,
    SpeechStage,
)


def _stage(limit: int) -> SpeechStage:
    stage = SpeechStage.__new__(SpeechStage)  # the chunk bookkeeping only, no models
    stage.vocode_max = limit
    stage._clock = lambda: 10.0
    return stage


def _seq(rid: str, chunks: int, credit_s: float) -> Sequence:
    job = SpeechJob(None, None)  # type: ignore[arg-type]
    job.chunks = chunks
    if chunks:
        job.clock.on_chunk(10.0 - 1.0, 1.0 + credit_s)  # started 1 s ago
    return Sequence(rid, 1, 10, job)


def test_code2wav_limit_serves_first_chunks_then_the_least_credit() -> None:
    ready = [_seq("ahead", 3, 5.0), _seq("first", 0, 0.0), _seq("behind", 2, 0.2)]
    picked = _stage(2)._vocode_order(list(ready))
    assert [s.rid for s in picked] == ["first", "behind"]
    assert [s.rid for s in _stage(0)._vocode_order(list(ready))] == ["ahead", "first", "behind"]


def test_preset_chunk_sizes_come_from_the_deploy_description() -> None:
    full = get_preset("full")
    assert (full.first_chunk, full.code_chunk, full.code2wav_max_batch) == (25, 25, 16)
