"""Tensor side of an AR stage: runs a `BatchPlan` through a `DecoderLM` and its KV cache.

Prefill pads the admitted prompts to the longest one (no mask when they are equally long);
decode feeds each running sequence's last token at position `length`. Next tokens come back to
the host each call (`tolist`), which is also the point where the iteration's GPU work is done,
so token timestamps taken right after are real completion times.
"""

from __future__ import annotations

import torch

from horizonserve.runtime.engine.reference.batching import Sequence
from horizonserve.runtime.engine.reference.models import DecoderLM
from horizonserve.runtime.engine.reference.presets import StageLimits


class ArExecutor:
    """One decoder with a pre-allocated cache (`max_batch` slots × `max_len` tokens)."""

    def __init__(self, model: DecoderLM, limits: StageLimits, *, keep_hidden: bool) -> None:
        self.model = model
        self.cache = model.new_cache(limits.max_batch, limits.max_len)
        weight = model.lm_head.weight
        self.device = weight.device
        self.dtype = weight.dtype
        # Final hidden state of every cached position: what a downstream stage is conditioned on.
        self.hidden: torch.Tensor | None = None
        if keep_hidden:
            shape = (limits.max_batch, limits.max_len, model.dims.hidden)
            self.hidden = torch.zeros(shape, device=self.device, dtype=self.dtype)

    def _slots(self, seqs: list[Sequence]) -> torch.Tensor:
        return torch.tensor([s.slot for s in seqs], device=self.device)

    @torch.inference_mode()
    def prefill(self, seqs: list[Sequence], embeds: list[torch.Tensor] | None = None) -> None:
        """Prefill `seqs` (token prompts at random, or the given `[L_i, h]` embeddings)."""
        if not seqs:
            return
        lens = [s.prompt_len for s in seqs]
        n = max(lens)
        if embeds is None:
            inputs = torch.randint(0, self.model.dims.vocab, (len(seqs), n), device=self.device)
        else:
            h = self.model.dims.hidden
            inputs = torch.zeros((len(seqs), n, h), device=self.device, dtype=self.dtype)
            for i, e in enumerate(embeds):
                inputs[i, : e.shape[0]] = e
        lengths = torch.tensor(lens, device=self.device)
        slots = self._slots(seqs)
        padded = min(lens) != n
        hid = self.model.prefill(inputs, lengths, slots, self.cache, padded=padded)
        if self.hidden is not None:
            self.hidden[slots, :n] = hid
        last = hid[torch.arange(len(seqs), device=self.device), lengths - 1]
        tokens = self.model.next_tokens(last).tolist()
        for seq, tok in zip(seqs, tokens, strict=True):
            seq.length = seq.prompt_len
            seq.generated = 1
            seq.last_token = tok

    @torch.inference_mode()
    def decode(self, seqs: list[Sequence], embeds: torch.Tensor | None = None) -> None:
        """One step for every sequence: feed `last_token` (or row of `embeds`) at `length`."""
        if not seqs:
            return
        positions_list = [s.length for s in seqs]
        positions = torch.tensor(positions_list, device=self.device)
        slots = self._slots(seqs)
        inputs = (
            embeds
            if embeds is not None
            else torch.tensor([s.last_token for s in seqs], device=self.device)
        )
        hid = self.model.decode(inputs, positions, slots, self.cache, max(positions_list) + 1)
        if self.hidden is not None:
            self.hidden[slots, positions] = hid
        tokens = self.model.next_tokens(hid).tolist()
        for seq, tok in zip(seqs, tokens, strict=True):
            seq.length += 1
            seq.generated += 1
            seq.last_token = tok

    def hidden_of(self, seq: Sequence, last: int | None = None) -> torch.Tensor:
        """Final hidden states `[L, h]` of a sequence's cached positions (the last `last`)."""
        if self.hidden is None:
            raise RuntimeError("executor was built without keep_hidden")
        start = 0 if last is None else max(0, seq.length - last)
        return self.hidden[seq.slot, start : seq.length]
