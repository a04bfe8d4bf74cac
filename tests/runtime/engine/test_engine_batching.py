"""Continuous batching: limits, admission order, KV isolation of running requests."""

from __future__ import annotations

import random

import pytest

from horizonserve.runtime.engine.reference.batching import ContinuousBatcher, Sequence
from horizonserve.runtime.engine.reference.presets import StageLimits

LIMITS = StageLimits(max_batch=4, max_len=64, max_prefill_tokens=40)


def _seq(rid: str, prompt: int, target: int = 3) -> Sequence:
    return Sequence(rid, prompt, target)


def test_batch_never_exceeds_limits_under_random_traffic() -> None:
    rng = random.Random(7)
    batcher = ContinuousBatcher(LIMITS)
    waiting: list[Sequence] = []
    n = 0
    for _ in range(500):
        for _ in range(rng.randint(0, 3)):
            waiting.append(_seq(f"r{n}", rng.randint(1, 60)))
            n += 1
        plan = batcher.plan(waiting)
        assert plan.size <= LIMITS.max_batch
        assert len(plan.prefill) == 1 or plan.prefill_tokens <= LIMITS.max_prefill_tokens
        slots = [s.slot for s in batcher.running]
        assert len(set(slots)) == len(slots) and all(0 <= s < LIMITS.max_batch for s in slots)
        assert plan.prefill == waiting[: len(plan.prefill)]  # admitted in order, a prefix
        del waiting[: len(plan.prefill)]
        for seq in plan.decode + plan.prefill:
            seq.generated += 1
        for seq in [s for s in batcher.running if s.done or rng.random() < 0.1]:
            batcher.finish(seq)
        assert batcher.slots.used == len(batcher.running)


def test_admission_stops_at_the_first_prompt_that_does_not_fit() -> None:
    batcher = ContinuousBatcher(LIMITS)
    a, b, c = _seq("a", 30), _seq("b", 20), _seq("c", 5)
    plan = batcher.plan([a, b, c])
    assert plan.prefill == [a]  # b would overflow the budget; c must not overtake it
    plan = batcher.plan([b, c])
    assert plan.prefill == [b, c] and plan.decode == [a]


def test_a_long_prompt_alone_is_admitted_over_the_budget() -> None:
    batcher = ContinuousBatcher(LIMITS)
    plan = batcher.plan([_seq("long", 60)])
    assert [s.rid for s in plan.prefill] == ["long"]


def test_fit_keeps_prompt_plus_output_within_a_slot() -> None:
    batcher = ContinuousBatcher(LIMITS)
    assert batcher.fit(10, 5) == (10, 5)
    prompt, target = batcher.fit(100, 30)
    assert prompt + target <= LIMITS.max_len and target == 30
    assert batcher.fit(5, 500) == (1, 63)


def test_running_requests_kv_is_not_disturbed_by_a_mid_way_admission() -> None:
    torch = pytest.importorskip("torch")
    from horizonserve.runtime.engine.reference.ar import ArExecutor
    from horizonserve.runtime.engine.reference.models import DecoderLM, materialize
    from horizonserve.runtime.engine.reference.presets import THINKER_TINY

    torch.manual_seed(0)
    model = materialize(lambda: DecoderLM(THINKER_TINY), torch.device("cpu"), torch.float32)

    def run(admit_b_at: int | None) -> tuple[list[int], torch.Tensor, Sequence]:
        ex = ArExecutor(model, LIMITS, keep_hidden=True)
        batcher = ContinuousBatcher(LIMITS)
        a = _seq("a", 9, target=8)
        torch.manual_seed(1)
        plan = batcher.plan([a])
        ex.prefill(plan.prefill)
        tokens = [a.last_token]
        for step in range(6):
            pending = [_seq("b", 13, target=8)] if step == admit_b_at else []
            plan = batcher.plan(pending)
            if plan.prefill:
                before = ex.cache.k[:, a.slot, :, : a.length].clone()
                ex.prefill(plan.prefill)
                assert torch.equal(ex.cache.k[:, a.slot, :, : a.length], before)
                assert plan.prefill[0].slot != a.slot
            ex.decode(plan.decode)
            tokens.append(a.last_token)
        return tokens, ex.hidden_of(a).clone(), a

    solo_tokens, solo_hidden, _ = run(None)
    mixed_tokens, mixed_hidden, a = run(2)
    assert mixed_tokens == solo_tokens
    assert a.length == 9 + 6
    torch.testing.assert_close(mixed_hidden, solo_hidden, atol=1e-5, rtol=1e-5)


def test_padded_prefill_matches_single_prompt_prefill() -> None:
    torch = pytest.importorskip("torch")
    from horizonserve.runtime.engine.reference.models import DecoderLM, materialize
    from horizonserve.runtime.engine.reference.presets import THINKER_TINY

    torch.manual_seed(0)
    model = materialize(lambda: DecoderLM(THINKER_TINY), torch.device("cpu"), torch.float32)
    cache = model.new_cache(4, 32)
    long_p, short_p = torch.randint(0, 256, (7,)), torch.randint(0, 256, (4,))
    batch = torch.zeros(2, 7, dtype=torch.long)
    batch[0], batch[1, :4] = long_p, short_p
    hidden = model.prefill(batch, torch.tensor([7, 4]), torch.tensor([0, 1]), cache, padded=True)
    alone = model.prefill(short_p[None], torch.tensor([4]), torch.tensor([2]), cache, padded=False)
    torch.testing.assert_close(hidden[1, :4], alone[0], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(cache.k[:, 1, :, :4], cache.k[:, 2, :, :4], atol=1e-5, rtol=1e-5)
