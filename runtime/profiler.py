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
from dataclasses import dataclass

from horizonserve.runtime.config import Path, RequestClass, SloTable

# r̂ never drops below this, so the slack ratio stays finite for a request about to respond.
MIN_REMAINING_S = 1e-4


@dataclass(slots=True, frozen=True)
class InputFeatures:
    """The profile keys of one request."""

    input_tokens: int = 0
    audio_seconds: float = 0.0
    images: int = 0


@dataclass(slots=True, frozen=True)
class ClassCosts:
    """A class's profile flattened for the hot path (built once per class)."""

    cls: RequestClass
    long_path: bool
    target_s: float  # Δc
    prefill_base_s: float
    prefill_s_per_token: float
    prefill_s_per_audio_second: float
    prefill_s_per_image: float
    decode_tokens: int  # shared-stage tokens before the first response / hand-off
    tpot_s: float
    downstream_steps: int  # downstream steps before the first output
    downstream_step_s: float

    @classmethod
    def of(cls, rc: RequestClass, target_s: float) -> ClassCosts:
        p = rc.profile
        return cls(
            rc,
            rc.path is Path.LONG,
            target_s,
            p.prefill_base_s,
            p.prefill_s_per_token,
            p.prefill_s_per_audio_second,
            p.prefill_s_per_image,
            p.decode_tokens_to_first_response,
            p.tpot_s,
            p.downstream_steps_to_first_response,
            p.downstream_step_s,
        )

    def prefill_s(self, features: InputFeatures | None) -> float:
        if features is None:
            return self.prefill_base_s
        return (
            self.prefill_base_s
            + features.input_tokens * self.prefill_s_per_token
            + features.audio_seconds * self.prefill_s_per_audio_second
            + features.images * self.prefill_s_per_image
        )


@dataclass(slots=True, eq=False)
class RequestSignals:
    """Per-request scheduling signals, created once at admission and updated with progress.

    Identity (not value) equality: the temporal index keys on the object itself.
    """

    request_id: str
    costs: ClassCosts
    long_path: bool
    arrival: float
    deadline: float
    seq: int  # admission order; breaks deadline ties deterministically
    prefill_s: float  # estimated shared-stage prefill time
    guard: float
    protect_at: float  # deadline − guard · r̂ at the current progress
    # Online progress.
    prefilled: bool = False  # prefill done: a waiting request is then a decode continuation
    decoded_tokens: int = 0
    downstream_steps_done: int = 0
    # Maintained by the temporal index while the request waits.
    waiting: bool = False
    protected: bool = False  # latched once protected while waiting
    late: bool = False  # its deadline passed while waiting: no longer protected
    preempted: int = 0  # times the shared stage preempted it (a request is preempted once)

    @property
    def cls(self) -> RequestClass:
        return self.costs.cls

    def remaining_s(self) -> float:
        """r̂: estimated time until the first response from the current progress."""
        c = self.costs
        r = 0.0 if self.prefilled else self.prefill_s
        left_decode = c.decode_tokens - self.decoded_tokens
        if left_decode > 0:
            r += left_decode * c.tpot_s
        left_down = c.downstream_steps - self.downstream_steps_done
        if left_down > 0:
            r += left_down * c.downstream_step_s
        return r if r > MIN_REMAINING_S else MIN_REMAINING_S

    def slack_ratio(self, now: float) -> float:
        """u = (d − t) / r̂; u < 1 means the request is already expected to miss."""
        return (self.deadline - now) / self.remaining_s()

    def can_wait_s(self, now: float) -> float:
        """How long it may still wait and meet its deadline: d − now − r̂ (< 0: it cannot)."""
        return self.deadline - now - self.remaining_s()

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

    __slots__ = ("_by_name", "_by_priority", "_guard", "_seq", "_slo")

    def __init__(self, slo: SloTable, u_guard: float) -> None:
        self._slo = slo
        self._guard = u_guard
        self._by_name = {c.name: ClassCosts.of(c, slo.target_s(c.name)) for c in slo.classes}
        self._by_priority: dict[int, ClassCosts] = {}
        for prio in {int(c.priority) for c in slo.classes}:
            self._by_priority[prio] = self._by_name[slo.class_for_priority(prio).name]
        self._seq = itertools.count()

    @property
    def slo(self) -> SloTable:
        return self._slo

    def costs(self, *, priority: int | None = None, class_name: str | None = None) -> ClassCosts:
        """Class from an explicit name, else from the API priority code (modality)."""
        if class_name is not None:
            costs = self._by_name.get(class_name)
            if costs is None:
                self._slo.get(class_name)  # raises KeyError naming the known classes
            return costs  # type: ignore[return-value]
        if priority is None:
            raise ValueError("request carries neither a class name nor a priority code")
        costs = self._by_priority.get(priority)
        if costs is None:
            self._slo.class_for_priority(priority)  # raises ValueError naming the code
        return costs  # type: ignore[return-value]

    def annotate(
        self,
        request_id: str,
        arrival: float,
        *,
        priority: int | None = None,
        class_name: str | None = None,
        features: InputFeatures | None = None,
    ) -> RequestSignals:
        c = self.costs(priority=priority, class_name=class_name)
        prefill = c.prefill_s(features)
        r = prefill + c.decode_tokens * c.tpot_s + c.downstream_steps * c.downstream_step_s
        deadline = arrival + c.target_s
        guard = self._guard
        return RequestSignals(
            request_id,
            c,
            c.long_path,
            arrival,
            deadline,
            next(self._seq),
            prefill,
            guard,
            deadline - guard * (r if r > MIN_REMAINING_S else MIN_REMAINING_S),
        )
