"""The reference pipeline on a real GPU (tiny models): Green Context ladders and the SM split."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs an NVIDIA GPU"),
]


def test_tiny_pipeline_caps_the_shared_stage_while_downstream_runs() -> None:
    from horizonserve.runtime.engine.reference import (
        PipelineOptions,
        ReferenceBackend,
        RequestSpec,
        TimedRequest,
    )

    options = PipelineOptions(preset="tiny", device="cuda:0", policy="horizon")
    with ReferenceBackend(options) as backend:
        info = backend.pipeline.stage_info
        for name, i in info.items():
            print(name, {k: v for k, v in i.items() if k.startswith("sm")})
        assert {info[s]["sm_cap"] for s in ("shared", "speech", "image")} == {"GreenContextCap"}
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
        alone = [r for r in result.trace if r["downstream_active"] == 0]
        assert all(r["shared_sms"] == ladder.aggressive for r in alone)
        probe = backend.pipeline.probe_decode(batch=4, context=64, steps=5)
        assert set(probe["levels"]) == {str(s) for s in (*ladder.levels, ladder.total)}
