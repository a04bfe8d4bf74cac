"""Tensor side of an AR stage: runs a `BatchPlan` through a `DecoderLM` and its KV cache.

Prefill pads the admitted prompts to the longest one and runs eagerly: few, large kernels. On
CUDA the padded length is also rounded up to a bucket (`prefill_buckets`): on the H200 the
first prefill at a new length cost ~70-90 ms more than a repeated one (per-shape library
set-up), which made solo TTFT of short prompts 4-5x their compute time; with buckets every
shape is warmed once at start (`warm_prefill`). Right padding needs no mask: under causal
attention a real token never sees a later (padded) position, and the cache positions the
padding writes are rewritten by decode before anything reads them.

Decode runs one row per KV slot: row i of the step is slot i, so keys and values are views of
the cache (nothing gathered) and every tensor of the step lives in static buffers. Rows of slots
that do not decode this step are dummies: token 0 at position `max_len - 1`, a cache position no
request ever reaches (`ContinuousBatcher.fit` keeps prompt + target <= max_len, so the last
decode writes at most position max_len - 2). The step's shape is fixed by (rows, read length),
both rounded up to a bucket on CUDA, so each (stream, rows, read length) is captured once as a
CUDA graph and replayed: one launch instead of ~1,200 kernel launches per 28-layer step, which
made eager decode launch-bound (about 19 ms per step on the H200 at any SM count, against
about 4-5 ms of weight streaming). A graph is captured on the stream current at the time,
i.e. on the active SM level's Green Context stream, so its kernels keep that level's SM cap;
the key includes the stream, so each level has its own graphs. Where capture is impossible
(CPU, a failed capture) the same step runs eagerly with exact sizes.

Next tokens come back to the host each call (`tolist`), which is also the point where the
iteration's GPU work is done, so token timestamps taken right after are real completion times.
"""

from __future__ import annotations

import logging
from typing import Any

import torch

from horizonserve.runtime.engine.deploy import graph_batch_sizes
from horizonserve.runtime.engine.reference.batching import Sequence
from horizonserve.runtime.engine.reference.models import DecoderLM
from horizonserve.runtime.engine.reference.presets import StageLimits

log = logging.getLogger(__name__)

MIN_CTX_BUCKET = 128
PREFILL_SMALL = (16, 32, 64, 128, 256)
PREFILL_STEP = 256


def batch_buckets(max_batch: int) -> tuple[int, ...]:
    """Row counts graphs are captured for: the deploy description's rule, the one the
    simulator pads with (`engine.deploy.graph_batch_sizes`)."""
    return graph_batch_sizes(max_batch)


def ctx_buckets(max_len: int) -> tuple[int, ...]:
    """Read lengths graphs are captured for: powers of two from 128 below max_len, then max_len."""
    out, n = [], MIN_CTX_BUCKET
    while n < max_len:
        out.append(n)
        n *= 2
    out.append(max_len)
    return tuple(out)


def prefill_buckets(limit: int) -> tuple[int, ...]:
    """Prompt lengths prefill is padded to: 16..256 by doubling, then steps of 256, then limit."""
    out = [b for b in PREFILL_SMALL if b < limit]
    n = PREFILL_STEP * 2
    while n < limit:
        out.append(n)
        n += PREFILL_STEP
    out.append(limit)
    return tuple(out)


def bucket(buckets: tuple[int, ...], n: int) -> int:
    for b in buckets:
        if b >= n:
            return b
    raise ValueError(f"{n} exceeds the largest bucket {buckets[-1]}")


class _Graph:
    __slots__ = ("graph", "hidden", "tokens")

    def __init__(self, graph: Any, tokens: torch.Tensor, hidden: torch.Tensor) -> None:
        self.graph = graph
        self.tokens = tokens
        self.hidden = hidden


class ArExecutor:
    """One decoder with a pre-allocated cache (`max_batch` slots × `max_len` tokens)."""

    def __init__(
        self,
        model: DecoderLM,
        limits: StageLimits,
        *,
        keep_hidden: bool,
        graphs: bool | None = None,
    ) -> None:
        self.model = model
        self.limits = limits
        self.cache = model.new_cache(limits.max_batch, limits.max_len)
        weight = model.lm_head.weight
        self.device = weight.device
        self.dtype = weight.dtype
        self.max_len = limits.max_len
        # Final hidden state of every cached position: what a downstream stage is conditioned on.
        self.hidden: torch.Tensor | None = None
        if keep_hidden:
            shape = (limits.max_batch, limits.max_len, model.dims.hidden)
            self.hidden = torch.zeros(shape, device=self.device, dtype=self.dtype)
        cuda = self.device.type == "cuda"
        self.use_graphs = cuda if graphs is None else (graphs and cuda)
        n = limits.max_batch
        # Static step inputs: row 0 = token ids, row 1 = positions (one host->device copy).
        self._io = torch.zeros((2, n), dtype=torch.long, device=self.device)
        self._io_host = torch.zeros((2, n), dtype=torch.long, pin_memory=cuda)
        self._rows = torch.arange(n, device=self.device)
        self._keys = torch.arange(limits.max_len, device=self.device)
        self.batch_buckets = batch_buckets(n)
        self.ctx_buckets = ctx_buckets(limits.max_len)
        self.bucket_prefill = cuda
        self.prefill_buckets = prefill_buckets(limits.max_len)
        self._graphs: dict[tuple[int, int, int], _Graph | None] = {}
        self._pool: Any = torch.cuda.graph_pool_handle() if self.use_graphs else None
        self.graph_captures = 0
        self.graph_replays = 0
        self.eager_steps = 0
        self.graph_error: str | None = None

    def _slots(self, seqs: list[Sequence]) -> torch.Tensor:
        return torch.tensor([s.slot for s in seqs], device=self.device)

    @torch.inference_mode()
    def prefill(self, seqs: list[Sequence], embeds: list[torch.Tensor] | None = None) -> None:
        """Prefill `seqs` (token prompts at random, or the given `[L_i, h]` embeddings)."""
        if not seqs:
            return
        lens = [s.prompt_len for s in seqs]
        n = max(lens)
        padded = min(lens) != n
        if self.bucket_prefill:
            n = bucket(self.prefill_buckets, n)
            padded = False  # right padding: causal attention alone is exact (module docstring)
        if embeds is None:
            inputs = torch.randint(0, self.model.dims.vocab, (len(seqs), n), device=self.device)
        else:
            h = self.model.dims.hidden
            inputs = torch.zeros((len(seqs), n, h), device=self.device, dtype=self.dtype)
            for i, e in enumerate(embeds):
                inputs[i, : e.shape[0]] = e
        lengths = torch.tensor(lens, device=self.device)
        slots = self._slots(seqs)
        hid = self.model.prefill(inputs, lengths, slots, self.cache, padded=padded)
        if self.hidden is not None:
            self.hidden[slots, :n] = hid
        last = hid[torch.arange(len(seqs), device=self.device), lengths - 1]
        tokens = self.model.next_tokens(last).tolist()
        for seq, tok in zip(seqs, tokens, strict=True):
            seq.length = seq.prompt_len
            seq.generated += 1  # 0 → 1 for a new request; a recompute after preemption goes on
            seq.last_token = tok

    def warm_prefill(self, limit: int) -> None:
        """Prefill one prompt of every bucket length up to `limit` (slot 0; CUDA only)."""
        if not self.bucket_prefill:
            return
        for b in self.prefill_buckets:
            if b > min(limit, self.max_len - 1):
                break
            seq = Sequence("warm", b, 1, slot=0)
            self.prefill([seq])

    @torch.inference_mode()
    def precapture(self) -> int:
        """Capture the decode graph of every (batch, context) bucket pair on the current stream
        (the active SM level), so no request pays a capture (~0.1 s on an H200) while serving.
        Only at start-up: the dummy rows write position `max_len - 1`, which no request reaches.
        Returns how many graphs were captured."""
        if not self.use_graphs:
            return 0
        before = self.graph_captures
        stream = torch.cuda.current_stream(self.device).cuda_stream
        self._io[0].zero_()
        self._io[1].fill_(self.max_len - 1)
        for rows in self.batch_buckets:
            for read_len in self.ctx_buckets:
                key = (stream, rows, read_len)
                if key not in self._graphs:
                    self._step(rows, read_len)  # eager first: lazy initialisation off-graph
                    self._capture(key, rows, read_len)
        return self.graph_captures - before

    # -- decode -------------------------------------------------------------------------------
    def _step(
        self, rows: int, read_len: int, embeds: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The decode step over rows 0..rows-1 from the static buffers (graph body)."""
        positions = self._io[1, :rows]
        inputs = self._io[0, :rows] if embeds is None else embeds
        row_ids = self._rows[:rows]
        hid = self.model.decode_rows(inputs, positions, row_ids, self._keys[:read_len], self.cache)
        if self.hidden is not None:
            self.hidden[row_ids, positions] = hid
        return self.model.next_tokens(hid), hid

    def _capture(self, key: tuple[int, int, int], rows: int, read_len: int) -> None:
        """Capture the step for `key` on the current stream (after one eager run on it)."""
        graph = torch.cuda.CUDAGraph()
        try:
            graph.capture_begin(pool=self._pool, capture_error_mode="thread_local")
            try:
                tokens, hidden = self._step(rows, read_len)
            finally:
                graph.capture_end()
        except Exception as exc:  # capture impossible here: this key stays eager
            self._graphs[key] = None
            if self.graph_error is None:
                self.graph_error = f"{type(exc).__name__}: {exc}"
                log.warning("CUDA graph capture failed (%s): decode runs eagerly", exc)
            return
        self._graphs[key] = _Graph(graph, tokens, hidden)
        self.graph_captures += 1

    def _fill(self, seqs: list[Sequence], rows: int) -> None:
        tokens = [0] * rows
        positions = [self.max_len - 1] * rows  # dummy rows: a position no request reaches
        for seq in seqs:
            tokens[seq.slot] = seq.last_token
            positions[seq.slot] = seq.length
        host = self._io_host[:, :rows]
        host.copy_(torch.tensor((tokens, positions), dtype=torch.long))
        # Pinned: an async copy on the current stream; the previous step's copy is done (its
        # tokens were read back), so the host buffer is free to reuse.
        self._io[:, :rows].copy_(host, non_blocking=self._io_host.is_pinned())

    @torch.inference_mode()
    def decode(self, seqs: list[Sequence], embeds: torch.Tensor | None = None) -> None:
        """One step for every sequence: feed `last_token` (or row of `embeds`) at `length`."""
        if not seqs:
            return
        need_rows = max(s.slot for s in seqs) + 1
        need_len = max(s.length for s in seqs) + 1
        graphs = self.use_graphs and embeds is None
        if graphs:
            rows = bucket(self.batch_buckets, need_rows)
            read_len = bucket(self.ctx_buckets, need_len)
        else:
            rows, read_len = need_rows, need_len
        self._fill(seqs, rows)
        rows_embeds = None
        if embeds is not None:
            rows_embeds = torch.zeros(
                (rows, embeds.shape[-1]), device=self.device, dtype=embeds.dtype
            )
            rows_embeds[self._slots(seqs)] = embeds
        entry = None
        key = (0, rows, read_len)
        if graphs:
            key = (torch.cuda.current_stream(self.device).cuda_stream, rows, read_len)
            entry = self._graphs.get(key)
        if entry is not None:
            entry.graph.replay()
            self.graph_replays += 1
            out = entry.tokens
        else:
            out, _ = self._step(rows, read_len, rows_embeds)
            self.eager_steps += 1
            if graphs and key not in self._graphs:
                self._capture(key, rows, read_len)  # this step's result came from the eager run
        tokens = out.tolist()
        for seq in seqs:
            seq.length += 1
            seq.generated += 1
            seq.last_token = tokens[seq.slot]

    def graph_info(self) -> dict[str, Any]:
        return {
            "graphs": self.use_graphs,
            "graph_captures": self.graph_captures,
            "graph_replays": self.graph_replays,
            "eager_decode_steps": self.eager_steps,
            "graph_error": self.graph_error,
        }

    def hidden_of(self, seq: Sequence, last: int | None = None) -> torch.Tensor:
        """Final hidden states `[L, h]` of a sequence's cached positions (the last `last`)."""
        if self.hidden is None:
            raise RuntimeError("executor was built without keep_hidden")
        start = 0 if last is None else max(0, seq.length - last)
        return self.hidden[seq.slot, start : seq.length]
