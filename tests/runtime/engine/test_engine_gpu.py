"""The reference pipeline on a real GPU (tiny models): Green Context ladders and the SM split."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from horizonserve.runtime.engine.reference.ar import ArExecutor
    from horizonserve.runtime.engine.reference.presets import StageLimits

torch = pytest.importorskip("torch")

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs an NVIDIA GPU"),
]


def _tiny_horizon():  # type: ignore[no-untyped-def]
    """The tiny reference pipeline on the GPU under HorizonServe (a context manager)."""
    from horizonserve.runtime.engine.reference import PipelineOptions, ReferenceBackend

    return ReferenceBackend(PipelineOptions(preset="tiny", device="cuda:0", policy="horizon"))


def test_tiny_pipeline_caps_the_shared_stage_while_downstream_runs() -> None:
    from horizonserve.runtime.engine.reference import RequestSpec, TimedRequest

    with _tiny_horizon() as backend:
        info = backend.pipeline.stage_info
        for name, i in info.items():
            print(name, {k: v for k, v in i.items() if k.startswith("sm")})
        stages = ("shared", "speech", "code2wav", "image")
        assert {info[s]["sm_cap"] for s in stages} == {"GreenContextCap"}
        trace = [
            TimedRequest(0.0, RequestSpec("speech", priority=10, downstream_tokens=400)),
            *(
                TimedRequest(0.05 + 0.01 * i, RequestSpec(f"t{i}", priority=0, output_tokens=40))
                for i in range(20)
            ),
        ]
        result = backend.run(trace, drain_timeout_s=60)
        assert result.unfinished == 0
        ladder = backend.pipeline.config.ladder
        co_running = [r for r in result.trace if r["downstream_active"] > 0]
        assert co_running, "the talker never showed up as active"
        assert all(r["shared_sms"] <= ladder.s_cap for r in co_running)
        # Urgent (short-path) prefills ran above the cap while decode stayed at it.
        boosted = [
            r for r in co_running if r["prefill_batch"] and r["prefill_sms"] > r["shared_sms"]
        ]
        assert boosted and all(r["prefill_sms"] == ladder.aggressive for r in boosted)
        # Every decode graph was captured at start-up: none while serving.
        assert info["shared"]["graph_captures"] > 0
        alone = [r for r in result.trace if r["downstream_active"] == 0]
        assert all(r["shared_sms"] == ladder.aggressive for r in alone)
        probe = backend.pipeline.probe_decode(batch=4, context=64, steps=5)
        assert set(probe["levels"]) == {str(s) for s in (*ladder.levels, ladder.total)}


def test_precapture_covers_every_bucket_and_replays_match_eager() -> None:
    from horizonserve.runtime.engine.reference.ar import ArExecutor
    from horizonserve.runtime.engine.reference.models import DecoderLM, materialize
    from horizonserve.runtime.engine.reference.presets import THINKER_TINY, StageLimits

    limits = StageLimits(max_batch=6, max_len=256, max_prefill_tokens=512)
    torch.manual_seed(0)
    model = materialize(lambda: DecoderLM(THINKER_TINY), torch.device("cuda:0"), torch.float32)
    graphed = ArExecutor(model, limits, keep_hidden=False, graphs=True)
    eager = ArExecutor(model, limits, keep_hidden=False, graphs=False)
    # Graphs are captured on a non-default stream, as the engine's SM levels always are.
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        n = graphed.precapture()
        assert n == len(graphed.batch_buckets) * len(graphed.ctx_buckets)
        assert graphed.precapture() == 0  # idempotent per stream
        runs = _decode_both(graphed, eager, limits)
    assert graphed.graph_captures == n and graphed.graph_replays == 12  # no capture at serving
    assert runs[0] == runs[1]


def _decode_both(graphed: ArExecutor, eager: ArExecutor, limits: StageLimits) -> list[list[int]]:
    """Last tokens of five sequences after 12 decode steps, once per executor (same prompts)."""
    from horizonserve.runtime.engine.reference.batching import ContinuousBatcher, Sequence

    runs = []
    for ex in (graphed, eager):
        batcher = ContinuousBatcher(limits)
        seqs = [Sequence(f"s{i}", 7 + 5 * i, 20) for i in range(5)]
        torch.manual_seed(1)
        ex.prefill(batcher.plan(seqs).prefill)
        for _ in range(12):
            ex.decode(seqs)
        runs.append([s.last_token for s in seqs])
    return runs


def test_mixed_burst_with_downstream_control_loses_nothing_and_never_underruns() -> None:
    """HorizonServe's whole loop on the GPU (tiny models): deadline stamps across hand-offs,
    slack-ordered talker and DiT admission, playback yielding, the slack split and the
    preemption rule. A mixed burst (speech, images, text) within the talker's real-time
    capacity: every request answered exactly once, nothing failed, no speech underrun."""
    from horizonserve.runtime.engine.reference import RequestSpec, TimedRequest

    with _tiny_horizon() as backend:
        trace = [
            *(
                TimedRequest(0.02 * i, RequestSpec(f"s{i}", priority=10, downstream_tokens=200))
                for i in range(6)
            ),
            *(TimedRequest(0.01 + 0.03 * i, RequestSpec(f"i{i}", priority=20)) for i in range(4)),
            *(
                TimedRequest(0.05 + 0.01 * i, RequestSpec(f"t{i}", priority=0, output_tokens=30))
                for i in range(30)
            ),
        ]
        result = backend.run(trace, drain_timeout_s=90)
        assert result.unfinished == 0 and not result.rejected
        ids = [r["id"] for r in result.records]
        assert sorted(ids) == sorted(t.spec.rid for t in trace)  # nothing lost or duplicated
        assert all(r["error"] is None for r in result.records), [
            r for r in result.records if r["error"]
        ]
        assert all(r["first_response_s"] is not None for r in result.records)
        speech = [r for r in result.records if r["id"].startswith("s")]
        underruns = sum(r.get("info", {}).get("underruns", 0) for r in speech)
        print("underruns", underruns, "levels", sorted({row["level"] for row in result.trace}))
        assert underruns == 0
