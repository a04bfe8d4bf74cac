"""Model dimensions of every reference stage: the one place they are written down.

`full` follows the paper's models: a Qwen2.5-Omni-7B-sized thinker (the shared stage), a
talker of the Omni talker's size plus a code-to-waveform block (speech), and a DiT of the size
of current open image generators (image). `tiny` keeps the same structure at sizes a CPU runs
in milliseconds, for CI. Weights are random; only shapes and compute matter.

Serving limits (KV slots, token budgets, CUDA graphs or eager, code2wav chunking) are not
written here: they come from the deploy description (`horizonserve.runtime.engine.deploy`), the
vLLM-Omni deploy YAML of Qwen2.5-Omni for talker / code2wav and BAGEL's for the DiT, and for the
thinker the YAML of the pipeline served (BAGEL's when it is BAGEL, Qwen2.5-Omni's otherwise),
under a named profile ("stock": the files as shipped; "tuned": graphs and larger batches). Only
`max_len` (tokens per KV slot) is the preset's, a fact of the model size it runs.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from functools import lru_cache

from horizonserve.runtime.engine.deploy import DeployLimits, load_deploy

# The reference engine's profile until its stages take one from their config: "tuned" is what
# the engine ran before the deploy description existed (the H200 campaigns). "stock" (the
# shipped vLLM-Omni files, code2wav fed each answer whole) is `get_preset(name, "stock")`.
ENGINE_PROFILE = "tuned"


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
    code_chunk: int  # talker codes per later waveform chunk (max_len: the answer whole)
    dit: DitDims
    dit_max_batch: int
    first_chunk: int = 0  # codes in the first chunk, the first response (0: code_chunk)
    code2wav_max_batch: int = 0  # code2wav jobs vocoded per iteration (0: no limit)
    profile: str = ""  # the deploy profile the limits came from
    deploy: DeployLimits | None = None  # speech (Qwen2.5-Omni) deploy; per-stage graphs/eager
    image_deploy: DeployLimits | None = None  # image (BAGEL) deploy: the DiT stage
    tokens_per_audio_second: int = 25  # shared-stage prompt tokens per second of input audio
    tokens_per_image: int = 256  # shared-stage prompt tokens per input image
    tokens_per_video_second: int = 128  # shared-stage prompt tokens per second of input video
    codes_per_audio_second: int = 50  # talker codec codes per second of spoken answer

    def graphs_for(self, role: str) -> bool:
        """Whether the deploy description runs `role` (thinker, talker) with CUDA graphs."""
        return self.deploy is None or self.deploy.stage(role).cuda_graphs


@dataclass(frozen=True, slots=True)
class _Shape:
    """What a preset fixes itself: model dimensions and tokens per KV slot."""

    thinker: DecoderDims
    talker: DecoderDims
    code2wav: Code2WavDims
    dit: DitDims
    max_len: int
    media: dict[str, int]  # tokens_per_* / codes_per_audio_second overrides


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

_SHAPES: dict[str, _Shape] = {
    "full": _Shape(THINKER_7B, TALKER, CODE2WAV, DIT, max_len=4096, media={}),
    "tiny": _Shape(
        THINKER_TINY,
        TALKER_TINY,
        CODE2WAV_TINY,
        DIT_TINY,
        max_len=256,
        media={
            "tokens_per_audio_second": 4,
            "tokens_per_image": 8,
            "tokens_per_video_second": 8,
            "codes_per_audio_second": 4,
        },
    ),
}
SPEECH_PIPELINE = "qwen2_5_omni"  # whose deploy file sizes talker and code2wav
IMAGE_PIPELINE = "bagel"  # whose deploy file sizes the DiT


def thinker_pipeline(pipeline: str | None) -> str:
    """The deploy file that sizes the thinker when `pipeline` is served: BAGEL's own for BAGEL,
    Qwen2.5-Omni's otherwise (the reference engine runs MiMo-Audio's speech path as thinker,
    talker and code2wav, not MiMo-Audio's fused stage)."""
    return IMAGE_PIPELINE if pipeline == IMAGE_PIPELINE else SPEECH_PIPELINE


def _limits(deploy: DeployLimits, role: str, max_len: int) -> StageLimits:
    st = deploy.stage(role)
    slot_len = min(max_len, st.max_model_len) if st.max_model_len else max_len
    return StageLimits(
        max_batch=st.max_num_seqs, max_len=slot_len, max_prefill_tokens=st.max_num_batched_tokens
    )


def build_preset(
    name: str, profile: str = ENGINE_PROFILE, pipeline: str | None = None
) -> PipelinePreset:
    """Preset `name`'s model shapes with the serving limits of deploy profile `profile`, the
    thinker's from the deploy file of `pipeline` (`thinker_pipeline`)."""
    try:
        shape = _SHAPES[name]
    except KeyError:
        known = list(_SHAPES)
        raise ValueError(f"preset: unknown preset {name!r}; choose one of {known}") from None
    speech = load_deploy(SPEECH_PIPELINE, profile)
    image = load_deploy(IMAGE_PIPELINE, profile)
    thinker = image if thinker_pipeline(pipeline) == IMAGE_PIPELINE else speech
    talker = _limits(speech, "talker", shape.max_len)
    chunk = speech.chunking
    # Without chunking the code2wav stage gets each answer whole: one chunk as long as a slot.
    every = chunk.every if chunk else talker.max_len
    first = chunk.first if chunk else talker.max_len
    if name == "tiny" and chunk:  # the tiny codec speaks 4 codes a second, not 50
        per_s = shape.media["codes_per_audio_second"]
        every = first = max(1, round(per_s * chunk.first / 50))
    return PipelinePreset(
        name=name,
        thinker=shape.thinker,
        thinker_limits=_limits(thinker, "thinker", shape.max_len),
        talker=shape.talker,
        talker_limits=talker,
        code2wav=shape.code2wav,
        code_chunk=every,
        dit=shape.dit,
        dit_max_batch=image.stage("dit").max_num_seqs,
        first_chunk=first,
        code2wav_max_batch=speech.stage("code2wav").max_num_seqs,
        profile=profile,
        deploy=speech,
        image_deploy=image,
        **shape.media,
    )


PRESETS: dict[str, PipelinePreset] = {name: build_preset(name) for name in _SHAPES}


@lru_cache(maxsize=32)
def _built(name: str, profile: str, thinker: str) -> PipelinePreset:
    """`build_preset`, once per (preset, profile, thinker deploy): it reads the deploy YAML."""
    return build_preset(name, profile, thinker)


def get_preset(
    name: str, profile: str = ENGINE_PROFILE, pipeline: str | None = None, **limits: int
) -> PipelinePreset:
    """A preset under deploy profile `profile`, its thinker sized for `pipeline`;
    `max_batch=`/`max_len=` override the thinker's."""
    preset = _built(name, profile, thinker_pipeline(pipeline))
    if limits:
        preset = replace(preset, thinker_limits=replace(preset.thinker_limits, **limits))
    return preset
