"""Compact real PyTorch modules for the reference stages (random weights, real shapes).

* `DecoderLM`  — Llama/Qwen2-style decoder (RMSNorm, rotary embeddings, grouped-query attention
  with q/k/v biases, SwiGLU MLP) running against a pre-allocated `KvCache`: `prefill` for newly
  admitted prompts (right-padded batch), `decode` for one token of every running request.
* `Code2Wav`   — codec codes → waveform chunk (embedding, transformer layers, transposed convs).
* `DiT`        — diffusion transformer with adaLN-Zero-style modulation and joint attention
  over [conditioning tokens; latent patches], plus a small convolutional latent decoder.

`materialize` builds any of them on the target device without a CPU initialisation pass.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import TypeVar

import torch
import torch.nn.functional as F
from torch import nn

from horizonserve.runtime.engine.reference.kv_cache import KvCache
from horizonserve.runtime.engine.reference.presets import Code2WavDims, DecoderDims, DitDims

INIT_STD = 0.02
M = TypeVar("M", bound=nn.Module)


def materialize(module_fn: Callable[[], M], device: torch.device, dtype: torch.dtype) -> M:
    """Build `module_fn()` directly on `device` in `dtype`, then fill it at random.

    Weights ~ N(0, 0.02²) (output projections scaled by the module's `out_scale`), norm scales
    1, biases 0. Parameters are created and filled on the device: no 15 GB CPU pass.
    """
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(device):
            module = module_fn()
    finally:
        torch.set_default_dtype(previous)
    out_scale = getattr(module, "out_scale", 1.0)
    with torch.no_grad():
        for name, p in module.named_parameters():
            if name.endswith("norm.weight"):
                p.fill_(1.0)
            elif p.ndim == 1:
                p.zero_()
            else:
                p.normal_(0.0, INIT_STD * (out_scale if _is_out(name) else 1.0))
    module.eval()
    module.requires_grad_(False)
    return module


def _is_out(name: str) -> bool:
    return name.endswith("o_proj.weight") or name.endswith("down_proj.weight")


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.rms_norm(x, (x.shape[-1],), self.weight, self.eps)


def rotary(
    positions: torch.Tensor, inv_freq: torch.Tensor, dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor]:
    """cos/sin `[B, L, 1, d]` for integer positions `[B, L]` (rotate-half layout)."""
    freqs = positions.to(torch.float32).unsqueeze(-1) * inv_freq
    emb = torch.cat((freqs, freqs), dim=-1).unsqueeze(2)
    return emb.cos().to(dtype), emb.sin().to(dtype)


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x `[B, L, heads, d]`; cos/sin `[B, L, 1, d]`."""
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rotated * sin


class GqaAttention(nn.Module):
    """Grouped-query attention with one fused q/k/v projection (biases as in Qwen2)."""

    def __init__(self, dims: DecoderDims) -> None:
        super().__init__()
        h, d = dims.hidden, dims.head_dim
        self.q_heads, self.kv_heads, self.head_dim = dims.q_heads, dims.kv_heads, d
        self.groups = dims.q_heads // dims.kv_heads
        self.qkv_proj = nn.Linear(h, (dims.q_heads + 2 * dims.kv_heads) * d, bias=True)
        self.o_proj = nn.Linear(dims.q_heads * d, h, bias=False)

    def _qkv(
        self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """q `[B, L, Hq, d]`, k and v `[B, L, Hkv, d]`; rotary applied to q and k together."""
        b, n, _ = x.shape
        hq, hkv = self.q_heads, self.kv_heads
        qkv = self.qkv_proj(x).view(b, n, hq + 2 * hkv, self.head_dim)
        qk = apply_rotary(qkv[:, :, : hq + hkv], cos, sin)
        return qk[:, :, :hq], qk[:, :, hq:], qkv[:, :, hq + hkv :]

    def prefill(
        self,
        x: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        mask: torch.Tensor | None,
        cache: KvCache,
        layer: int,
        slots: torch.Tensor,
    ) -> torch.Tensor:
        """x `[P, L, h]`; mask `[P, 1, L, L]` (None: no padding, plain causal)."""
        p, n, _ = x.shape
        q, k, v = self._qkv(x, cos, sin)
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
        cache.write_prefill(layer, slots, k, v)
        if mask is None:
            out = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        else:
            k = k.repeat_interleave(self.groups, dim=1)
            v = v.repeat_interleave(self.groups, dim=1)
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        return self.o_proj(out.transpose(1, 2).reshape(p, n, -1))

    def decode(
        self,
        x: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        mask: torch.Tensor,
        cache: KvCache,
        layer: int,
        slots: torch.Tensor,
        positions: torch.Tensor,
        read_len: int,
        *,
        rows: bool,
    ) -> torch.Tensor:
        """x `[B, 1, h]`; mask `[B, 1, 1, read_len]` (key position ≤ the request's position).

        rows: request i is KV slot i (slots = arange(B)), so keys/values are cache views and
        nothing is gathered (CUDA-graph friendly); otherwise the given slots are gathered.
        The q heads sharing one kv head are laid out as that head's query rows, so attention
        runs on the cached keys/values without repeating them.
        """
        b = x.shape[0]
        q, k, v = self._qkv(x, cos, sin)
        cache.write_decode(layer, slots, positions, k[:, 0], v[:, 0])
        if rows:
            keys, values = cache.rows(layer, b, read_len)
        else:
            keys, values = cache.read(layer, slots, read_len)
        q = q.view(b, self.kv_heads, self.groups, self.head_dim)
        out = F.scaled_dot_product_attention(q, keys, values, attn_mask=mask)
        return self.o_proj(out.reshape(b, 1, -1))


class SwiGlu(nn.Module):
    """SwiGLU MLP with the gate and up projections fused into one matrix."""

    def __init__(self, hidden: int, intermediate: int) -> None:
        super().__init__()
        self.gate_up_proj = nn.Linear(hidden, 2 * intermediate, bias=False)
        self.down_proj = nn.Linear(intermediate, hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_up_proj(x).chunk(2, dim=-1)
        return self.down_proj(F.silu(gate) * up)


class DecoderLayer(nn.Module):
    def __init__(self, dims: DecoderDims) -> None:
        super().__init__()
        self.input_norm = RMSNorm(dims.hidden, dims.rms_eps)
        self.attn = GqaAttention(dims)
        self.post_attn_norm = RMSNorm(dims.hidden, dims.rms_eps)
        self.mlp = SwiGlu(dims.hidden, dims.intermediate)


class DecoderLM(nn.Module):
    """Decoder-only transformer driven by a `KvCache` (see module docstring)."""

    def __init__(self, dims: DecoderDims) -> None:
        super().__init__()
        self.dims = dims
        self.out_scale = 1.0 / math.sqrt(2 * dims.layers)
        self.embed = nn.Embedding(dims.vocab, dims.hidden)
        self.layers = nn.ModuleList(DecoderLayer(dims) for _ in range(dims.layers))
        self.final_norm = RMSNorm(dims.hidden, dims.rms_eps)
        self.lm_head = nn.Linear(dims.hidden, dims.vocab, bias=False)
        self._inv_freq: torch.Tensor | None = None

    @property
    def inv_freq(self) -> torch.Tensor:
        """Rotary frequencies in float32 on the weights' device (not a buffer: stays fp32)."""
        if self._inv_freq is None:
            d = self.dims.head_dim
            exps = torch.arange(0, d, 2, dtype=torch.float32, device=self.lm_head.weight.device)
            self._inv_freq = 1.0 / (self.dims.rope_theta ** (exps / d))
        return self._inv_freq

    def new_cache(self, slots: int, max_len: int) -> KvCache:
        p = self.lm_head.weight
        d = self.dims
        return KvCache(
            d.layers, slots, d.kv_heads, max_len, d.head_dim, device=p.device, dtype=p.dtype
        )

    def prefill(
        self,
        inputs: torch.Tensor,
        lengths: torch.Tensor,
        slots: torch.Tensor,
        cache: KvCache,
        *,
        padded: bool,
    ) -> torch.Tensor:
        """Run prompts through the model, filling their slots; returns hidden `[P, L, h]`.

        inputs: token ids `[P, L]` or embeddings `[P, L, h]`, right-padded to L; lengths `[P]`
        on the device. With `padded=False` every prompt is exactly L long.
        """
        x = self.embed(inputs) if inputs.dtype == torch.long else inputs
        p, n = x.shape[:2]
        positions = torch.arange(n, device=x.device).expand(p, n)
        cos, sin = rotary(positions, self.inv_freq, x.dtype)
        mask = None
        if padded:
            idx = torch.arange(n, device=x.device)
            causal = idx.view(1, n, 1) >= idx.view(1, 1, n)
            valid = idx.view(1, 1, n) < lengths.view(p, 1, 1)
            mask = (causal & valid).unsqueeze(1)
        for i, layer in enumerate(self.layers):
            h = layer.input_norm(x)
            x = x + layer.attn.prefill(h, cos, sin, mask, cache, i, slots)
            x = x + layer.mlp(layer.post_attn_norm(x))
        return self.final_norm(x)

    def decode(
        self,
        inputs: torch.Tensor,
        positions: torch.Tensor,
        slots: torch.Tensor,
        cache: KvCache,
        read_len: int,
    ) -> torch.Tensor:
        """One token per request at `positions` (`[B]`) in the given KV slots (gathered);
        returns hidden `[B, h]`. inputs: token ids `[B]` or embeddings `[B, h]`;
        read_len = max(positions) + 1."""
        keys = torch.arange(read_len, device=positions.device)
        return self._decode(inputs, positions, slots, keys, cache, rows=False)

    def decode_rows(
        self,
        inputs: torch.Tensor,
        positions: torch.Tensor,
        rows: torch.Tensor,
        keys: torch.Tensor,
        cache: KvCache,
    ) -> torch.Tensor:
        """One token for each of the KV slots 0..B-1 (row i = slot i); returns hidden `[B, h]`.

        inputs `[B]` token ids (or `[B, h]` embeddings), positions `[B]`, rows = arange(B),
        keys = arange(read_len). Every shape is fixed by (B, read_len) and nothing syncs with
        the host, so the step can be captured as a CUDA graph and replayed.
        """
        return self._decode(inputs, positions, rows, keys, cache, rows=True)

    def _decode(
        self,
        inputs: torch.Tensor,
        positions: torch.Tensor,
        slots: torch.Tensor,
        keys: torch.Tensor,
        cache: KvCache,
        *,
        rows: bool,
    ) -> torch.Tensor:
        x = self.embed(inputs) if inputs.dtype == torch.long else inputs
        x = x.unsqueeze(1)
        read_len = keys.shape[0]
        cos, sin = rotary(positions.unsqueeze(1), self.inv_freq, x.dtype)
        mask = (keys.view(1, -1) <= positions.view(-1, 1)).view(-1, 1, 1, read_len)
        for i, layer in enumerate(self.layers):
            h = layer.input_norm(x)
            attn = layer.attn.decode(
                h, cos, sin, mask, cache, i, slots, positions, read_len, rows=rows
            )
            x = x + attn
            x = x + layer.mlp(layer.post_attn_norm(x))
        return self.final_norm(x)[:, 0]

    def next_tokens(self, hidden: torch.Tensor) -> torch.Tensor:
        """Greedy next token from final hidden states `[..., h]` (weights are random anyway)."""
        return self.lm_head(hidden).argmax(dim=-1)


class EncoderBlock(nn.Module):
    """Pre-norm bidirectional transformer block (plain multi-head attention, GELU MLP)."""

    def __init__(self, hidden: int, heads: int, mlp_ratio: int = 4) -> None:
        super().__init__()
        self.heads = heads
        self.attn_norm = nn.LayerNorm(hidden)
        self.qkv = nn.Linear(hidden, 3 * hidden)
        self.o_proj = nn.Linear(hidden, hidden)
        self.mlp_norm = nn.LayerNorm(hidden)
        self.fc1 = nn.Linear(hidden, mlp_ratio * hidden)
        self.down_proj = nn.Linear(mlp_ratio * hidden, hidden)

    def attend(self, x: torch.Tensor) -> torch.Tensor:
        b, n, h = x.shape
        q, k, v = self.qkv(x).view(b, n, 3, self.heads, h // self.heads).permute(2, 0, 3, 1, 4)
        out = F.scaled_dot_product_attention(q, k, v)
        return self.o_proj(out.transpose(1, 2).reshape(b, n, h))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attend(self.attn_norm(x))
        return x + self.down_proj(F.gelu(self.fc1(self.mlp_norm(x)), approximate="tanh"))


class Code2Wav(nn.Module):
    """Codec codes `[B, C]` → waveform `[B, C · samples_per_code]` in [-1, 1]."""

    def __init__(self, dims: Code2WavDims) -> None:
        super().__init__()
        self.dims = dims
        self.out_scale = 1.0
        self.embed = nn.Embedding(dims.codebook, dims.hidden)
        self.blocks = nn.ModuleList(
            EncoderBlock(dims.hidden, dims.heads) for _ in range(dims.layers)
        )
        ups = []
        ch = dims.hidden
        for stride in dims.upsample:
            nxt = max(32, ch // 2)
            ups.append(nn.ConvTranspose1d(ch, nxt, kernel_size=stride, stride=stride))
            ch = nxt
        self.ups = nn.ModuleList(ups)
        self.out = nn.Conv1d(ch, 1, kernel_size=7, padding=3)

    def forward(self, codes: torch.Tensor) -> torch.Tensor:
        x = self.embed(codes)
        for block in self.blocks:
            x = block(x)
        y = x.transpose(1, 2)
        for up in self.ups:
            y = F.silu(up(y))
        return torch.tanh(self.out(y))[:, 0]


def timestep_embedding(t: torch.Tensor, dim: int) -> torch.Tensor:
    """Sinusoidal embedding of diffusion times `t` in [0, 1] → `[B, dim]`."""
    half = dim // 2
    freqs = torch.exp(
        -math.log(10_000.0) * torch.arange(half, device=t.device, dtype=torch.float32) / half
    )
    args = (t.float() * 1000.0).unsqueeze(-1) * freqs
    return torch.cat((args.cos(), args.sin()), dim=-1)


class DitBlock(nn.Module):
    def __init__(self, hidden: int, heads: int, mlp_ratio: int) -> None:
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(hidden, 3 * hidden)
        self.o_proj = nn.Linear(hidden, hidden)
        self.fc1 = nn.Linear(hidden, mlp_ratio * hidden)
        self.down_proj = nn.Linear(mlp_ratio * hidden, hidden)
        self.modulation = nn.Linear(hidden, 6 * hidden)

    def forward(self, x: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
        b, n, h = x.shape
        shift1, scale1, gate1, shift2, scale2, gate2 = self.modulation(c).unsqueeze(1).chunk(6, -1)
        y = F.layer_norm(x, (h,)) * (1 + scale1) + shift1
        q, k, v = self.qkv(y).view(b, n, 3, self.heads, h // self.heads).permute(2, 0, 3, 1, 4)
        attn = F.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(b, n, h)
        x = x + gate1 * self.o_proj(attn)
        y = F.layer_norm(x, (h,)) * (1 + scale2) + shift2
        return x + gate2 * self.down_proj(F.gelu(self.fc1(y), approximate="tanh"))


class DiT(nn.Module):
    """Velocity model v(x_t, t, cond) on latent patches `[B, T, C]` (rectified flow)."""

    def __init__(self, dims: DitDims, cond_dim: int) -> None:
        super().__init__()
        self.dims = dims
        self.out_scale = 1.0
        h = dims.hidden
        self.x_in = nn.Linear(dims.latent_channels, h)
        self.cond_in = nn.Linear(cond_dim, h)
        self.pos = nn.Parameter(torch.zeros(dims.patch_tokens, h))
        self.t_fc1 = nn.Linear(256, h)
        self.t_fc2 = nn.Linear(h, h)
        self.blocks = nn.ModuleList(
            DitBlock(h, dims.heads, dims.mlp_ratio) for _ in range(dims.layers)
        )
        self.final_modulation = nn.Linear(h, 2 * h)
        self.x_out = nn.Linear(h, dims.latent_channels)

    def forward(self, x: torch.Tensor, t: torch.Tensor, cond: torch.Tensor) -> torch.Tensor:
        h = self.dims.hidden
        c = self.t_fc2(F.silu(self.t_fc1(timestep_embedding(t, 256).to(x.dtype))))
        k = cond.shape[1]
        tokens = torch.cat((self.cond_in(cond), self.x_in(x) + self.pos), dim=1)
        for block in self.blocks:
            tokens = block(tokens, c)
        shift, scale = self.final_modulation(c).unsqueeze(1).chunk(2, -1)
        out = F.layer_norm(tokens[:, k:], (h,)) * (1 + scale) + shift
        return self.x_out(out)


class LatentDecoder(nn.Module):
    """Latent patches `[B, T, C]` (T a square) → RGB image `[B, 3, 8·√T, 8·√T]`."""

    def __init__(self, latent_channels: int, width: int = 128) -> None:
        super().__init__()
        self.out_scale = 1.0
        self.conv_in = nn.Conv2d(latent_channels, width, 3, padding=1)
        self.ups = nn.ModuleList(nn.Conv2d(width, width, 3, padding=1) for _ in range(3))
        self.conv_out = nn.Conv2d(width, 3, 3, padding=1)

    def forward(self, latents: torch.Tensor) -> torch.Tensor:
        b, t, c = latents.shape
        side = math.isqrt(t)
        y = latents.transpose(1, 2).reshape(b, c, side, side)
        y = F.silu(self.conv_in(y))
        for conv in self.ups:
            y = F.silu(conv(F.interpolate(y, scale_factor=2.0, mode="nearest")))
        return torch.tanh(self.conv_out(y))
