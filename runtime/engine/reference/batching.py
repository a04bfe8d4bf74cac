"""Iteration-level (continuous) batching for an AR stage: pure bookkeeping, no tensors.

Each iteration runs every running sequence one decode step and prefills newly admitted ones.
Admission walks the candidates in the order given (for the shared stage: the policy's view) and
stops at the first that does not fit, so the view's order is never overtaken:

  * a KV slot must be free (slots = `max_batch`, so the batch never exceeds it);
  * the prompt tokens admitted this iteration stay within `max_prefill_tokens`, except that the
    first prompt of an iteration is always admitted (a long prompt is never starved).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from horizonserve.runtime.engine.reference.kv_cache import SlotAllocator
from horizonserve.runtime.engine.reference.presets import StageLimits


@dataclass(slots=True, eq=False)
class Sequence:
    """One request inside an AR stage."""

    rid: str
    prompt_len: int  # tokens prefilled at admission
    target: int  # tokens to generate in this stage (≥ 1; the prefill yields the first)
    payload: Any = None  # stage-specific data (policy signals, conditioning, …)
    slot: int = -1
    length: int = 0  # tokens in the KV cache
    generated: int = 0
    last_token: int = 0
    token_times: list[float] = field(default_factory=list)  # completion time of each token

    @property
    def done(self) -> bool:
        return self.generated >= self.target


@dataclass(slots=True)
class BatchPlan:
    decode: list[Sequence]  # running sequences, one token each
    prefill: list[Sequence]  # admitted this iteration (slots already assigned)

    @property
    def size(self) -> int:
        return len(self.decode) + len(self.prefill)

    @property
    def prefill_tokens(self) -> int:
        return sum(s.prompt_len for s in self.prefill)


class ContinuousBatcher:
    """Slots, the running set, and the admission rule above."""

    __slots__ = ("limits", "running", "slots")

    def __init__(self, limits: StageLimits) -> None:
        self.limits = limits
        self.slots = SlotAllocator(limits.max_batch)
        self.running: list[Sequence] = []

    def fit(self, prompt_len: int, target: int) -> tuple[int, int]:
        """Clamp (prompt, target) so prompt + target ≤ max_len (prompt trimmed first)."""
        max_len = self.limits.max_len
        target = max(1, min(target, max_len - 1))
        prompt = max(1, min(prompt_len, max_len - target))
        return prompt, target

    def plan(self, candidates: Iterable[Sequence]) -> BatchPlan:
        """Decode every running sequence; admit candidates in order while they fit."""
        decode = list(self.running)
        prefill: list[Sequence] = []
        free = self.slots.free
        budget = self.limits.max_prefill_tokens
        for seq in candidates:
            if free == 0:
                break
            if prefill and seq.prompt_len > budget:
                break
            prefill.append(seq)
            budget -= seq.prompt_len
            free -= 1
        for seq in prefill:
            seq.slot = self.slots.take()
            self.running.append(seq)
        return BatchPlan(decode, prefill)

    def finish(self, seq: Sequence) -> None:
        """Free a finished sequence's slot."""
        self.running.remove(seq)
        self.slots.release(seq.slot)
        seq.slot = -1

    @property
    def idle(self) -> bool:
        return not self.running
