"""Messages between the front process and the stage processes (plain picklable dataclasses).

    front ──RequestSpec+arrival──▶ shared stage ──Handoff──▶ speech (talker) ──CodeChunk──▶ code2wav
      ▲                                 │          ╲──Handoff──▶ image                        │
      └──────────── Event (ready, first, chunk, handoff, done, trace, error, stopped) ◀───────┘

A speech answer's FIRST / CHUNK / DONE events come from the code2wav stage (the waveform);
the talker reports only refusals and failures.

Times are `time.monotonic()` seconds: CLOCK_MONOTONIC is one clock for every process of a
Linux host, so a stamp taken in one process is comparable in another.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from horizonserve.runtime.downstream import Stamp

if TYPE_CHECKING:
    import torch

# Event kinds.
READY = "ready"  # a stage finished start-up (data: memory, dims)
FIRST = "first"  # first response: first token / first audio chunk / finished image
HANDOFF = "handoff"  # the shared stage handed a long-path request downstream
DONE = "done"  # the request left the stage that finishes it
TRACE = "trace"  # shared-stage step rows (data["rows"])
ERROR = "error"  # a stage failed (data["message"]); rid set when one request failed
STOPPED = "stopped"  # a stage left its loop
POLICY = "policy"  # the shared stage switched policy (data["policy"])
PROBE = "probe"  # step times per SM level (data: see ProbeDecode / ProbeLoad)
ABORTED = "aborted"  # a stage dropped requests for an Abort (data["dropped"])
TOKENS = "tokens"  # shared-stage tokens of streaming requests this step (data["tokens"]: rid, id)
CHUNK = "chunk"  # a speech chunk after the first (data: chunk, codes, samples)

SPEECH = "speech"  # the talker: codec codes from the thinker's hidden states
CODE2WAV = "code2wav"  # codec codes to waveform, fed chunk by chunk by the talker

# Columns of one shared-stage trace row (one per iteration).
TRACE_COLUMNS = (
    "t",
    "shared_sms",
    "downstream_sms",
    "level",
    "pressure",
    "decode_batch",
    "prefill_batch",
    "prefill_tokens",
    "prefill_s",
    "decode_s",
    "waiting",
    "downstream_active",
    "phase",
    "prefill_sms",  # SMs the prefill ran on (the cap unless an urgent prompt was in it)
    "control_s",  # policy step + publish + batch formation, before the GPU work
    "shared_slack",  # the slack ratios the split compared (StepDecision; None: not read)
    "downstream_slack",
)
IMAGE = "image"


@dataclass(slots=True, frozen=True)
class RequestSpec:
    """What a request asks for; lengths come from the workload trace."""

    rid: str
    priority: int | None = None  # API code: 0 text, 10 audio, 20 image
    class_name: str | None = None  # explicit class (takes precedence over priority)
    input_tokens: int = 64
    audio_seconds: float = 0.0
    images: int = 0
    video_seconds: float = 0.0
    output_tokens: int = 16  # shared-stage (thinker) tokens
    downstream_tokens: int | None = None  # talker codes (speech) / denoising steps (image)
    stream: bool = False  # the shared stage reports each token (TOKENS events)


@dataclass(slots=True, frozen=True)
class Admit:
    spec: RequestSpec
    arrival: float  # monotonic stamp taken by the front process
    downstream: str | None  # SPEECH / IMAGE for long-path classes, None for short-path


@dataclass(slots=True, frozen=True)
class SetPolicy:
    """Swap the shared stage's policy between runs (models stay loaded; stage must be idle)."""

    policy: str


@dataclass(slots=True, frozen=True)
class Abort:
    """Drop every request that arrived at or before `before` (monotonic s): those in the stage
    now and those that reach it later (a hand-off still on its way). Acknowledged with one
    ABORTED event per stage; the stage's models, caches and SM ladder stay as they are."""

    before: float


@dataclass(slots=True, frozen=True)
class Cancel:
    """Drop these requests (a client went away or its wait timed out): wherever they are in
    the stage now, and hand-offs of them that reach it later. Not acknowledged.

    Each request is (id, arrival): a client may reuse an id once its request ended, so only
    the request with that arrival stamp is dropped."""

    requests: tuple[tuple[str, float], ...]


@dataclass(slots=True, frozen=True)
class ProbeDecode:
    """Time `steps` decode iterations of a dummy batch at every SM level (stage idle).

    kind "decode": decode steps of `batch` sequences with `context` cached tokens each;
    kind "prefill": prefill of `batch` prompts of `context` tokens (`steps` repetitions);
    kind "both": per level the decode steps, then the prefill repetitions.
    `levels`: shared-stage SM counts to visit (None: the full GPU, then every ladder level).
    `corun`: publish each level's split (shared s, downstream S_tot - s) in the control record
    and wait until a downstream stage is active first (the front keeps one busy, ProbeLoad).
    `min_seconds`: keep stepping a level at least this long (NVML refreshes every 1/6-1 s).
    """

    batch: int
    context: int  # cached tokens per sequence
    steps: int
    kind: str = "decode"
    levels: tuple[int, ...] | None = None
    corun: bool = False
    min_seconds: float = 0.0
    warmup_steps: int = 2
    prefill_tokens: int = 0  # prompt length of the prefill probe (0: `context`)
    prefill_batch: int = 1
    prefill_reps: int = 2
    settle_s: float = 0.3  # co-running: wait after publishing a split


@dataclass(slots=True, frozen=True)
class ProbeLoad:
    """Keep a downstream stage busy with `batch` synthetic jobs and time its iterations.

    `levels` None: follow the split the shared stage publishes, until `seconds` pass or a
    `ProbeStop` arrives. `levels` given: `seconds` at each of these SM counts in turn (None =
    the full GPU), the downstream stage alone. Replies with a PROBE event (rows of
    t_start, t_end, sms, batch, component seconds).
    """

    seconds: float
    batch: int
    levels: tuple[int | None, ...] | None = None


@dataclass(slots=True, frozen=True)
class ProbeStop:
    """End a running ProbeLoad early."""


@dataclass(slots=True, frozen=True)
class WireTensor:
    """A tensor passed by value (raw bytes), so no shared-memory handle outlives a message."""

    data: bytes
    dtype: str
    shape: tuple[int, ...]

    @classmethod
    def of(cls, tensor: torch.Tensor) -> WireTensor:
        import torch  # the front process never needs torch

        t = tensor.detach().contiguous().cpu()
        raw = t.view(-1).view(torch.uint8).numpy().tobytes()
        return cls(raw, str(t.dtype).removeprefix("torch."), tuple(t.shape))

    def to(self, device: torch.device | str) -> torch.Tensor:
        import torch

        dtype = getattr(torch, self.dtype)
        buf = torch.from_numpy(np.frombuffer(self.data, dtype=np.uint8).copy())
        return buf.view(dtype).reshape(self.shape).to(device)


@dataclass(slots=True, frozen=True)
class Handoff:
    """A long-path request leaving the shared stage, with its conditioning hidden states."""

    rid: str
    arrival: float
    cond: WireTensor  # [L, thinker_hidden]
    target: int | None  # talker codes / denoising steps (None: the preset's default)
    stamp: Stamp | None = None  # class, deadline and estimate, set once by the shared stage


@dataclass(slots=True, frozen=True)
class CodeChunk:
    """One chunk of a speech answer's codec codes, from the talker to the code2wav stage.

    Chunks of a request are sent in order: index 0 holds the first `first_chunk` codes (its
    waveform is the first response), later ones `code_chunk` codes; `last` marks the final
    (possibly shorter) one."""

    rid: str
    arrival: float
    index: int
    codes: tuple[int, ...]
    last: bool
    stamp: Stamp | None = None  # the shared stage's stamp, passed on unchanged


#: Per-request work a downstream stage receives (dropped on arrival once aborted / cancelled).
WORK = (Handoff, CodeChunk)


@dataclass(slots=True)
class Event:
    kind: str
    stage: str
    t: float
    rid: str | None = None
    data: dict[str, Any] = field(default_factory=dict)
