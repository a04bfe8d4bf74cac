"""The reference engine under the shed preset: vLLM's queue limits at the front (CPU, tiny
models, the shared stage alone). A refused request never reaches a stage and is judged a miss
at its deadline; a request that finished frees its place."""

from __future__ import annotations

import time

import pytest

pytest.importorskip("torch")

from horizonserve.runtime.baselines import check_engine
from horizonserve.runtime.engine.reference import (
    PipelineOptions,
    ReferenceBackend,
    RequestSpec,
    TimedRequest,
)
from horizonserve.runtime.engine.reference.pipeline import QueueFullError
from horizonserve.runtime.shedding import QUEUE_FULL, QueueLimits, front_gate
from tests.runtime.builders import make_config


def test_only_the_shed_presets_gate_the_front() -> None:
    config = make_config()
    assert front_gate("horizon", config, 16) is None and front_gate("edf-mps", config, 16) is None
    gate = front_gate("shed-edf", config, 16)
    assert gate is not None and gate.gate.limits.max_num_queued_reqs == 32


@pytest.mark.parametrize("policy", ["vllm-omni-current", "mps-static"])
def test_a_preset_whose_rules_the_engine_lacks_is_refused_not_run_plain(policy: str) -> None:
    # The reference engine applies them now (tests/runtime/engine/test_baselines_2026_engine.py);
    # an engine without them (the plugin) still refuses them.
    with pytest.raises(ValueError, match=f"policy '{policy}': the vllm-omni engine does not"):
        check_engine(policy, "vllm-omni")
    check_engine("shed", "reference")
    check_engine(policy, "reference")
    check_engine(policy, "sim")


def test_the_front_refuses_past_the_request_limit_and_counts_the_refused_a_miss() -> None:
    options = PipelineOptions(
        preset="tiny",
        device="cpu",
        policy="shed",
        warmup=False,
        downstream=("image",),
        queue_limits=QueueLimits(max_num_queued_reqs=1),
    )
    with ReferenceBackend(options) as backend:
        p = backend.pipeline
        first = p.submit(RequestSpec("a", priority=0, input_tokens=8, output_tokens=64))
        t = time.monotonic()
        with pytest.raises(QueueFullError, match=r"queue limits \(queue_full\)") as exc:
            p.submit(RequestSpec("b", priority=0, input_tokens=8, output_tokens=4), arrival=t)
        assert exc.value.reason == QUEUE_FULL and exc.value.retry_after_s > 0
        # Never admitted, still judged: pending in the deadline book, a miss once it passes.
        assert p.metrics.book.pop(("b", t)) is not None
        assert first.wait_done(120) and first.record.failure is None
        again = p.submit(RequestSpec("c", priority=0, input_tokens=8, output_tokens=4))
        assert again.wait_done(120) and again.record.failure is None
        # A trace run keeps going past refusals and reports each one, with vLLM's reason.
        burst = [
            TimedRequest(0.0, RequestSpec(f"t{i}", priority=0, input_tokens=8, output_tokens=32))
            for i in range(3)
        ]
        result = backend.run(burst, drain_timeout_s=120)
        assert len(result.records) == 1 and result.unfinished == 0
        assert [e["shed"] for e in result.rejected] == [QUEUE_FULL, QUEUE_FULL]
