"""Request profiler: class, deadline, remaining-time estimate and slack of each request.

Times are seconds on a monotonic clock and are always passed in; nothing here reads a clock.

Invariant used by the temporal scheduler: while a request waits, its remaining-time estimate r̂
does not change (only progress changes it), so the instant it becomes protected,

    u(t) = (d − t) / r̂ < u_guard   ⟺   t > d − u_guard · r̂  =: protect_at,

is known when it is annotated. Waiting requests are never re-scanned to find who became
protected; a heap ordered by `protect_at` yields them in order.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field

from horizonserve.runtime.config import Path, RequestClass, SloTable

# r̂ never drops below this, so the slack ratio stays finite for a request about to respond.
MIN_REMAINING_S = 1e-4


@dataclass(slots=True, frozen=True)
class InputFeatures:
    """The profile keys of one request."""

    input_tokens: int = 0
    audio_seconds: float = 0.0
    images: int = 0


@dataclass(slots=True, eq=False)
class RequestSignals:
    """Per-request scheduling signals, created once at admission and updated with progress.

    Identity (not value) equality: the temporal index keys on the object itself.
    """

    request_id: str
    cls: RequestClass
    long_path: bool
    arrival: float
    deadline: float
    seq: int  # admission order; breaks deadline ties deterministically
    prefill_s: float  # estimated shared-stage prefill time
    decode_tokens: int  # shared-stage tokens before the first response / hand-off
    tpot_s: float
    downstream_steps: int  # downstream steps before the first output
    downstream_step_s: float
    guard: float
    # Online progress.
    prefilled: bool = False  # prefill done: a waiting request is then a decode continuation
    decoded_tokens: int = 0
    downstream_steps_done: int = 0
    protect_at: float = field(init=False)
    # Maintained by the temporal index while the request waits.
    waiting: bool = field(default=False, init=False)
    protected: bool = field(default=False, init=False)  # latched once protected while waiting

    def __post_init__(self) -> None:
        self.protect_at = self.deadline - self.guard * self.remaining_s()

    def remaining_s(self) -> float:
        """r̂: estimated time until the first response from the current progress."""
        r = 0.0 if self.prefilled else self.prefill_s
        left_decode = self.decode_tokens - self.decoded_tokens
        if left_decode > 0:
            r += left_decode * self.tpot_s
        left_down = self.downstream_steps - self.downstream_steps_done
        if left_down > 0:
            r += left_down * self.downstream_step_s
        return max(r, MIN_REMAINING_S)

    def slack_ratio(self, now: float) -> float:
        """u = (d − t) / r̂; u < 1 means the request is already expected to miss."""
        return (self.deadline - now) / self.remaining_s()

    def is_protected(self, now: float) -> bool:
        return now > self.protect_at

    def record_progress(
        self, *, prefilled: bool | None = None, decoded: int = 0, downstream_steps: int = 0
    ) -> None:
        """Apply progress and refresh the protection instant."""
        if prefilled is not None:
            self.prefilled = prefilled
        self.decoded_tokens += decoded
        self.downstream_steps_done += downstream_steps
        self.protect_at = self.deadline - self.guard * self.remaining_s()


class RequestProfiler:
    """Maps requests to classes and stamps deadlines d = a + Δc."""

    __slots__ = ("_guard", "_seq", "_slo", "_target_s")

    def __init__(self, slo: SloTable, u_guard: float) -> None:
        self._slo = slo
        self._guard = u_guard
        self._target_s = {c.name: slo.target_s(c.name) for c in slo.classes}
        self._seq = itertools.count()

    @property
    def slo(self) -> SloTable:
        return self._slo

    def classify(
        self, *, priority: int | None = None, class_name: str | None = None
    ) -> RequestClass:
        """Class from an explicit name, else from the API priority code (modality)."""
        if class_name is not None:
            return self._slo.get(class_name)
        if priority is None:
            raise ValueError("request carries neither a class name nor a priority code")
        return self._slo.class_for_priority(priority)

    def annotate(
        self,
        request_id: str,
        arrival: float,
        *,
        priority: int | None = None,
        class_name: str | None = None,
        features: InputFeatures = InputFeatures(),
    ) -> RequestSignals:
        cls = self.classify(priority=priority, class_name=class_name)
        p = cls.profile
        prefill = (
            p.prefill_base_s
            + features.input_tokens * p.prefill_s_per_token
            + features.audio_seconds * p.prefill_s_per_audio_second
            + features.images * p.prefill_s_per_image
        )
        return RequestSignals(
            request_id=request_id,
            cls=cls,
            long_path=cls.path is Path.LONG,
            arrival=arrival,
            deadline=arrival + self._target_s[cls.name],
            seq=next(self._seq),
            prefill_s=prefill,
            decode_tokens=p.decode_tokens_to_first_response,
            tpot_s=p.tpot_s,
            downstream_steps=p.downstream_steps_to_first_response,
            downstream_step_s=p.downstream_step_s,
            guard=self._guard,
        )
