"""Overload shedding as vLLM does it: the API server's queue limits.

vLLM (0.30, `vllm/v1/engine/async_llm.py`, `AsyncLLM.check_admission`; the limits are
`SchedulerConfig.max_num_queued_reqs` / `max_num_queued_tokens`, the flags
`--max-num-queued-reqs` / `--max-num-queued-tokens`) refuses a new request with HTTP 503, before
it reaches the scheduler, when

* requests: the unfinished requests (waiting + running) plus the new one's `n` would exceed
  `max_num_queued_reqs` (`current + n > max`);
* tokens: the prompt tokens of the requests still in their prefill phase (each counted at its
  whole `prompt_len` until its first output, chunked progress and cache hits not subtracted)
  already reach `max_num_queued_tokens` (`current >= max`; the new request's own prompt is not
  part of the test).

A refused request is never served: it counts as a miss in attainment, as every request that
arrived does. `QueueGate` keeps both counts for one shared stage; it reads no clock.

Limits where a deployment sets none (`limits_for`), following vLLM's own sizing advice in
those fields' documentation: `max_num_queued_reqs` = `max_num_seqs` plus the queue depth
wanted (here one more running set: 2 × `max_num_seqs`), `max_num_queued_tokens` = target
TTFT × prefill throughput (the tightest short-path SLO × the calibrated prefill tokens/s).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

from horizonserve.runtime.config import Path, ServingConfig

QUEUE_FULL = "queue_full"  # QueueOverflowError: max_num_queued_reqs
QUEUED_TOKENS = "max_queued_tokens"  # MaxQueuedTokensError: max_num_queued_tokens


@dataclass(frozen=True, slots=True)
class QueueLimits:
    """vLLM's two queue limits (None: no limit)."""

    max_num_queued_reqs: int | None = None
    max_num_queued_tokens: int | None = None

    def __post_init__(self) -> None:
        for name in ("max_num_queued_reqs", "max_num_queued_tokens"):
            v = getattr(self, name)
            if v is not None and v < 0:
                raise ValueError(f"{name}: {v} is negative; use a count ≥ 0 or None (no limit)")


def limits_for(max_num_seqs: int, ttft_target_s: float, prefill_tokens_per_s: float) -> QueueLimits:
    """The limits by vLLM's sizing advice (module doc)."""
    if max_num_seqs < 1 or ttft_target_s <= 0 or prefill_tokens_per_s <= 0:
        raise ValueError(
            f"limits_for: max_num_seqs {max_num_seqs}, ttft_target_s {ttft_target_s} and "
            f"prefill_tokens_per_s {prefill_tokens_per_s} must be positive"
        )
    return QueueLimits(2 * max_num_seqs, max(1, round(ttft_target_s * prefill_tokens_per_s)))


@dataclass(slots=True)
class QueueGate:
    """The API server's counts behind `check_admission`, for one shared stage.

    Invariants: `unfinished` = requests admitted and not finished; `queued_tokens` = the sum of
    `prompt_len` over admitted requests not past their prefill; a refused request changes
    neither. Each request id is admitted once; `prefilled` and `finished` are idempotent.
    """

    limits: QueueLimits
    unfinished: int = 0
    queued_tokens: int = 0
    refused: dict[str, int] = field(default_factory=dict)  # reason -> count
    _prefilling: dict[str, int] = field(default_factory=dict)  # id -> prompt_len
    _live: set[str] = field(default_factory=set)

    def check(self, n: int = 1) -> str | None:
        """Why a new request of `n` sequences would be refused now (None: admitted)."""
        lim = self.limits
        if lim.max_num_queued_reqs is not None and self.unfinished + n > lim.max_num_queued_reqs:
            return QUEUE_FULL
        if lim.max_num_queued_tokens is not None and (
            self.queued_tokens >= lim.max_num_queued_tokens
        ):
            return QUEUED_TOKENS
        return None

    def admit(self, request_id: str, prompt_len: int, n: int = 1) -> str | None:
        """Admit the request, or refuse it: the reason (`QUEUE_FULL` / `QUEUED_TOKENS`)."""
        if request_id in self._live:
            raise ValueError(f"request {request_id!r} is already admitted")
        reason = self.check(n)
        if reason is not None:
            self.refused[reason] = self.refused.get(reason, 0) + 1
            return reason
        self._live.add(request_id)
        self.unfinished += n
        self._prefilling[request_id] = prompt_len
        self.queued_tokens += prompt_len
        return None

    def prefilled(self, request_id: str) -> None:
        """The request produced its first output: its prompt leaves the token count."""
        tokens = self._prefilling.pop(request_id, None)
        if tokens is not None:
            self.queued_tokens -= tokens

    def finished(self, request_id: str, n: int = 1) -> None:
        """The request finished (or was aborted) at this stage."""
        if request_id not in self._live:
            return
        self.prefilled(request_id)
        self._live.discard(request_id)
        self.unfinished -= n

    @property
    def refused_total(self) -> int:
        return sum(self.refused.values())


def config_limits(config: ServingConfig, max_num_seqs: int) -> QueueLimits:
    """`limits_for` from a serving config: the tightest short-path SLO and that class's
    profiled prefill seconds per token (the engines' front, which has no cost model)."""
    short = [c for c in config.slo.classes if c.path is Path.SHORT] or list(config.slo.classes)
    tight = min(short, key=lambda c: config.slo.target_s(c.name))
    per_token = tight.profile.prefill_s_per_token
    return limits_for(
        max_num_seqs, config.slo.target_s(tight.name), 1.0 / per_token if per_token else 1e9
    )


class FrontGate:
    """`QueueGate` for an engine's front under a shed preset, thread-safe: admission in the
    request threads, first outputs and finishes from the event thread. A request leaves the
    token count at its first output from the shared stage (a short-path first token, a
    long-path hand-off) and the request count when the shared stage is done with it (done,
    handed off, refused downstream or cancelled)."""

    def __init__(self, limits: QueueLimits) -> None:
        self.gate = QueueGate(limits)
        self._lock = threading.Lock()

    def admit(self, request_id: str, prompt_len: int) -> str | None:
        with self._lock:
            return self.gate.admit(request_id, prompt_len)

    def prefilled(self, request_id: str) -> None:
        with self._lock:
            self.gate.prefilled(request_id)

    def finished(self, request_id: str) -> None:
        with self._lock:
            self.gate.finished(request_id)


def front_gate(
    policy: str, config: ServingConfig, max_num_seqs: int, limits: QueueLimits | None = None
) -> FrontGate | None:
    """The front's gate under a shed preset (`limits`, else `config_limits`), else None."""
    from horizonserve.runtime.baselines import rules_for

    if not rules_for(policy).shed:
        return None
    return FrontGate(limits or config_limits(config, max(1, max_num_seqs)))
