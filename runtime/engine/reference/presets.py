"""Model dimensions of every reference stage: the one place they are written down.

`full` follows the paper's models: a Qwen2.5-Omni-7B-sized thinker (the shared stage), a
talker of the Omni talker's size plus a code-to-waveform block (speech), and a DiT of the size
of current open image generators (image). `tiny` keeps the same structure at sizes a CPU runs
in milliseconds, for CI. Weights are random; only shapes and compute matter.
"""

from __future__ import annotations

from dataclasses import dataclass, replace


@dataclass(frozen=True, slots=True)
class DecoderDims:
    """A Llama/Qwen2-style decoder-only transformer."""

    hidden: int
    layers: int
    q_heads: int
    kv_heads: int
    intermediate: int
    vocab: int
    rope_theta: float = 1_000_000.0
    rms_eps: float = 1e-6

    @property
    def head_dim(self) -> int:
        return self.hidden // self.q_heads

    def params(self) -> int:
        """Parameter count (embedding and head untied)."""
        h, kv = self.hidden, self.kv_heads * self.head_dim
        attn = 2 * h * h + 2 * h * kv + 2 * kv + h  # q/o, k/v, k/v/q biases
        mlp = 3 * h * self.intermediate
        return self.layers * (attn + mlp + 2 * h) + 2 * self.vocab * h + h


@dataclass(frozen=True, slots=True)
class Code2WavDims:
    """Codec codes → waveform: embedding, a few transformer layers, transposed-conv upsampling."""

    codebook: int
    hidden: int
    layers: int
    heads: int
    upsample: tuple[int, ...]  # strides; their product is waveform samples per code

    @property
    def samples_per_code(self) -> int:
        n = 1
        for s in self.upsample:
            n *= s
        return n


@dataclass(frozen=True, slots=True)
class DitDims:
    """Diffusion transformer with adaLN modulation and joint attention over [cond; patches]."""

    hidden: int
    layers: int
    heads: int
    patch_tokens: int  # latent patches per image
    latent_channels: int  # channels of one patch token (patch² × latent channels)
    cond_tokens: int  # conditioning tokens taken from the shared stage's hidden states
    steps: int  # denoising steps per image
    mlp_ratio: int = 4


@dataclass(frozen=True, slots=True)
class StageLimits:
    """Continuous-batching limits of one AR stage (KV slots are pre-allocated)."""

    max_batch: int  # KV slots = most requests in flight
    max_len: int  # tokens per slot (prompt + generated)
    max_prefill_tokens: int  # prompt tokens admitted per iteration (one prompt always fits)


@dataclass(frozen=True, slots=True)
class PipelinePreset:
    name: str
    thinker: DecoderDims
    thinker_limits: StageLimits
    talker: DecoderDims
    talker_limits: StageLimits
    code2wav: Code2WavDims
    code_chunk: int  # talker codes per waveform chunk (the first chunk is the first response)
    dit: DitDims
    dit_max_batch: int
    tokens_per_audio_second: int = 25  # shared-stage prompt tokens per second of input audio
    tokens_per_image: int = 256  # shared-stage prompt tokens per input image
    tokens_per_video_second: int = 128  # shared-stage prompt tokens per second of input video
    codes_per_audio_second: int = 50  # talker codec codes per second of spoken answer


THINKER_7B = DecoderDims(
    hidden=3584, layers=28, q_heads=28, kv_heads=4, intermediate=18944, vocab=152064
)
TALKER = DecoderDims(hidden=896, layers=24, q_heads=14, kv_heads=2, intermediate=4864, vocab=8448)
CODE2WAV = Code2WavDims(codebook=8448, hidden=1024, layers=4, heads=16, upsample=(8, 5, 4, 3))
DIT = DitDims(
    hidden=3072,
    layers=28,
    heads=24,
    patch_tokens=4096,
    latent_channels=64,
    cond_tokens=64,
    steps=20,
)

THINKER_TINY = DecoderDims(hidden=64, layers=2, q_heads=4, kv_heads=2, intermediate=128, vocab=256)
TALKER_TINY = DecoderDims(hidden=32, layers=2, q_heads=4, kv_heads=2, intermediate=64, vocab=128)
CODE2WAV_TINY = Code2WavDims(codebook=128, hidden=32, layers=1, heads=4, upsample=(4, 2))
DIT_TINY = DitDims(
    hidden=32, layers=2, heads=4, patch_tokens=16, latent_channels=8, cond_tokens=4, steps=4
)

PRESETS: dict[str, PipelinePreset] = {
    "full": PipelinePreset(
        name="full",
        thinker=THINKER_7B,
        thinker_limits=StageLimits(max_batch=48, max_len=4096, max_prefill_tokens=8192),
        talker=TALKER,
        talker_limits=StageLimits(max_batch=16, max_len=4096, max_prefill_tokens=16384),
        code2wav=CODE2WAV,
        code_chunk=25,
        dit=DIT,
        dit_max_batch=4,
    ),
    "tiny": PipelinePreset(
        name="tiny",
        thinker=THINKER_TINY,
        thinker_limits=StageLimits(max_batch=8, max_len=256, max_prefill_tokens=512),
        talker=TALKER_TINY,
        talker_limits=StageLimits(max_batch=4, max_len=256, max_prefill_tokens=512),
        code2wav=CODE2WAV_TINY,
        code_chunk=4,
        dit=DIT_TINY,
        dit_max_batch=2,
        tokens_per_audio_second=4,
        tokens_per_image=8,
        tokens_per_video_second=8,
        codes_per_audio_second=4,
    ),
}


def get_preset(name: str, **limits: int) -> PipelinePreset:
    """A preset by name; `max_batch=`/`max_len=` override the thinker's limits."""
    try:
        preset = PRESETS[name]
    except KeyError:
        known = list(PRESETS)
        raise ValueError(f"preset: unknown preset {name!r}; choose one of {known}") from None
    if limits:
        preset = replace(preset, thinker_limits=replace(preset.thinker_limits, **limits))
    return preset
