"""Pre-allocated KV cache for continuous batching: `slots × max_len` per layer.

A request owns one slot from admission to completion; its keys/values live at positions
`[0, length)` of that slot. Prefill writes positions `[0, prompt_len)`; each decode step writes
position `length` and reads `[0, length]`. Nothing is ever copied between slots, so admitting a
request cannot disturb the cache rows of running ones (tests check this).
"""

from __future__ import annotations

import heapq

import torch


class SlotAllocator:
    """Free KV slots; always hands out the lowest free index (keeps the active range dense)."""

    __slots__ = ("_free", "_used", "capacity")

    def __init__(self, capacity: int) -> None:
        if capacity <= 0:
            raise ValueError(f"capacity must be positive, got {capacity}")
        self.capacity = capacity
        self._free = list(range(capacity))
        self._used: set[int] = set()

    @property
    def free(self) -> int:
        return len(self._free)

    @property
    def used(self) -> int:
        return len(self._used)

    def take(self) -> int:
        if not self._free:
            raise RuntimeError("no free KV slot")
        slot = heapq.heappop(self._free)
        self._used.add(slot)
        return slot

    def release(self, slot: int) -> None:
        if slot not in self._used:
            raise ValueError(f"slot {slot} is not in use")
        self._used.remove(slot)
        heapq.heappush(self._free, slot)


class KvCache:
    """Keys and values of every layer: tensors `[layers, slots, kv_heads, max_len, head_dim]`."""

    __slots__ = ("_k", "_v", "k", "max_len", "slots", "v")

    def __init__(
        self,
        layers: int,
        slots: int,
        kv_heads: int,
        max_len: int,
        head_dim: int,
        *,
        device: torch.device,
        dtype: torch.dtype,
    ) -> None:
        shape = (layers, slots, kv_heads, max_len, head_dim)
        # Zero-filled so that never-written positions are finite (they are masked anyway).
        self.k = torch.zeros(shape, device=device, dtype=dtype)
        self.v = torch.zeros(shape, device=device, dtype=dtype)
        self.slots = slots
        self.max_len = max_len
        self._k = self.k.unbind(0)  # per-layer views: no select op on the hot path
        self._v = self.v.unbind(0)

    def nbytes(self) -> int:
        return 2 * self.k.numel() * self.k.element_size()

    def write_prefill(
        self, layer: int, slots: torch.Tensor, k: torch.Tensor, v: torch.Tensor
    ) -> None:
        """Store a padded prompt batch `k, v: [P, kv_heads, L, d]` at positions [0, L)."""
        n = k.shape[2]
        self._k[layer][slots, :, :n] = k
        self._v[layer][slots, :, :n] = v

    def write_decode(
        self,
        layer: int,
        slots: torch.Tensor,
        positions: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
    ) -> None:
        """Store one token per request: `k, v: [B, kv_heads, d]` at `positions[b]`."""
        self._k[layer][slots, :, positions] = k
        self._v[layer][slots, :, positions] = v

    def read(
        self, layer: int, slots: torch.Tensor, length: int
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Keys/values `[B, kv_heads, length, d]` of the given slots (a gathered copy)."""
        return self._k[layer][slots, :, :length], self._v[layer][slots, :, :length]

    def rows(self, layer: int, n: int, length: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Keys/values `[n, kv_heads, length, d]` of slots 0..n-1: views, nothing copied."""
        return self._k[layer][:n, :, :length], self._v[layer][:n, :, :length]
