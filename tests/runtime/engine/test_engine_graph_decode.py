"""The row-per-slot decode (the CUDA-graph body) on the CPU: same results as the gather decode,
dummy rows never touch live cache entries; buckets; the GPU-sharing mode per policy."""

from __future__ import annotations

import itertools

import pytest

torch = pytest.importorskip("torch")

from horizonserve.runtime.engine.reference.ar import (  # noqa: E402
    ArExecutor,
    batch_buckets,
    bucket,
    ctx_buckets,
    prefill_buckets,
)
from horizonserve.runtime.engine.reference.batching import ContinuousBatcher, Sequence  # noqa: E402
from horizonserve.runtime.engine.reference.gpu_control import sharing_for  # noqa: E402
from horizonserve.runtime.engine.reference.models import DecoderLM, materialize  # noqa: E402
from horizonserve.runtime.engine.reference.presets import THINKER_TINY, StageLimits  # noqa: E402

LIMITS = StageLimits(max_batch=6, max_len=48, max_prefill_tokens=256)


@pytest.fixture(scope="module")
def model() -> DecoderLM:
    torch.manual_seed(0)
    return materialize(lambda: DecoderLM(THINKER_TINY), torch.device("cpu"), torch.float32)


def test_rows_decode_matches_gather_decode(model: DecoderLM) -> None:
    ex = ArExecutor(model, LIMITS, keep_hidden=True)
    batcher = ContinuousBatcher(LIMITS)
    seqs = [Sequence(f"s{i}", 5 + 3 * i, 10) for i in range(4)]
    torch.manual_seed(1)
    ex.prefill(batcher.plan(seqs).prefill)
    batcher.finish(seqs[1])  # slot 1 free: a dummy row between live ones
    live = [seqs[0], seqs[2], seqs[3]]
    cache = ex.cache
    k_before = cache.k.clone()
    slots = torch.tensor([s.slot for s in live])
    positions = torch.tensor([s.length for s in live])
    tokens = torch.tensor([s.last_token for s in live])
    ref = model.decode(tokens, positions, slots, cache, int(positions.max()) + 1)
    cache.k.copy_(k_before)
    ex.decode(live)
    torch.testing.assert_close(ex.hidden[slots, positions], ref, atol=1e-5, rtol=1e-5)
    assert [s.last_token for s in live] == model.next_tokens(ref).tolist()
    # The dummy row (free slot 1) wrote only at max_len - 1; live rows kept their prefix.
    for s in live:
        torch.testing.assert_close(cache.k[:, s.slot, :, : s.length - 1],
                                   k_before[:, s.slot, :, : s.length - 1])  # fmt: skip


def test_dummy_row_spares_a_slot_prefilled_this_step(model: DecoderLM) -> None:
    ex = ArExecutor(model, LIMITS, keep_hidden=True)
    batcher = ContinuousBatcher(LIMITS)
    x, a = Sequence("x", 4, 10), Sequence("a", 7, 10)
    ex.prefill(batcher.plan([x, a]).prefill)
    batcher.finish(x)  # slot 0 free again
    b = Sequence("b", 9, 10)
    plan = batcher.plan([b])  # b takes slot 0 and is prefilled; a decodes in the same step
    assert b.slot == 0 and a.slot == 1 and plan.decode == [a]
    ex.prefill(plan.prefill)
    before = ex.cache.k[:, 0, :, : b.prompt_len].clone()
    ex.decode(plan.decode)  # rows 0..1: row 0 is a dummy over b's fresh prefix
    torch.testing.assert_close(ex.cache.k[:, 0, :, : b.prompt_len], before)


def test_buckets() -> None:
    assert batch_buckets(48) == (1, 2, 4, 8, 16, 32, 48)
    assert ctx_buckets(4096) == (128, 256, 512, 1024, 2048, 4096)
    assert ctx_buckets(100) == (100,)
    pb = prefill_buckets(4096)
    assert pb[:5] == (16, 32, 64, 128, 256) and pb[5] == 512 and pb[-1] == 4096
    assert all(b2 > b1 for b1, b2 in itertools.pairwise(pb))
    assert bucket(pb, 300) == 512 and bucket(pb, 513) == 768
    with pytest.raises(ValueError):
        bucket((8, 16), 17)


def test_sharing_mode_per_policy() -> None:
    assert sharing_for("horizon", mps=False, cuda=True) == "mps-gc"
    assert sharing_for("horizon-no-rotation", mps=False, cuda=True) == "mps-gc"
    assert sharing_for("horizon", mps=False, cuda=True, mps_available=False) == "gc"
    assert sharing_for("fcfs", mps=False, cuda=True) == "timeslice"
    assert sharing_for("edf", mps=True, cuda=True) == "mps"
    assert sharing_for("horizon-no-throttling", mps=False, cuda=True) == "mps"
    assert sharing_for("horizon", mps=False, cuda=False) == "timeslice"
