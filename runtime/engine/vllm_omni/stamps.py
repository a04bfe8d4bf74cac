"""The per-request stamp that carries class and original deadline to every stage.

vLLM-Omni builds each downstream stage's request itself (engine/orchestrator.py) with no
priority and a fresh arrival time, but from the per-stage `SamplingParams` the API layer
passed in, and vLLM's `Request` keeps them. So the API hook puts one small dict into
`SamplingParams.extra_args["horizonserve"]` of every stage; the request table in /dev/shm
(keyed by the orchestrator's request id, the same on every stage) backs it up for stages whose
parameters carry no `extra_args` (the diffusion stage).

Times are integer nanoseconds of CLOCK_MONOTONIC, one clock for every process of the host.

The stamp is the control core's hand-off stamp (`runtime.downstream.Stamp`) in the plugin's
units: class, priority code, original arrival, first-response deadline and the downstream
estimate to the first response (from the class profile). It is made once, by the API hook,
and every stage reads it (`as_core`); no stage recomputes any of it. Version 1 stamps (no
downstream estimate) still read, with the estimate 0.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from horizonserve.runtime.config import Priority, SloTable
from horizonserve.runtime.downstream import Stamp as CoreStamp

STAMP_KEY = "horizonserve"
STAMP_VERSION = 2
_READABLE_VERSIONS = (1, 2)

# Default priority code by requested output modality (paper §5): image > audio > text.
_MODALITY_PRIORITY = (("image", Priority.IMAGE), ("audio", Priority.AUDIO))


@dataclass(frozen=True, slots=True)
class Stamp:
    rid: str  # the orchestrator's request id (same on every stage)
    priority: int  # API priority code: 0 text, 10 audio, 20 image
    class_name: str
    arrival_ns: int  # original arrival, monotonic ns
    deadline_ns: int  # arrival + the class SLO Δc, monotonic ns
    # Estimated downstream time to the first response (all downstream stages), from the class
    # profile: downstream steps to the first response × the step time. 0 for short-path.
    downstream_ns: int = 0

    def to_dict(self) -> dict[str, Any]:
        return {
            "v": STAMP_VERSION,
            "rid": self.rid,
            "priority": self.priority,
            "class": self.class_name,
            "arrival_ns": self.arrival_ns,
            "deadline_ns": self.deadline_ns,
            "downstream_ns": self.downstream_ns,
        }

    @classmethod
    def from_dict(cls, raw: Any) -> Stamp | None:
        if not isinstance(raw, Mapping) or raw.get("v") not in _READABLE_VERSIONS:
            return None
        try:
            return cls(
                str(raw["rid"]),
                int(raw["priority"]),
                str(raw["class"]),
                int(raw["arrival_ns"]),
                int(raw["deadline_ns"]),
                int(raw.get("downstream_ns", 0)),
            )
        except (KeyError, TypeError, ValueError):
            return None

    def as_core(self) -> CoreStamp:
        """The control core's hand-off stamp (seconds on the same monotonic clock)."""
        return CoreStamp(
            self.rid,
            self.class_name,
            self.priority,
            self.arrival_ns * 1e-9,
            self.deadline_ns * 1e-9,
            self.downstream_ns * 1e-9,
        )

    @property
    def arrival_s(self) -> float:
        return self.arrival_ns * 1e-9

    @property
    def deadline_s(self) -> float:
        return self.deadline_ns * 1e-9


def priority_for_modalities(modalities: Iterable[str] | None) -> int:
    """Default priority code from the requested output modalities (text 0, audio 10, image 20)."""
    mods = set(modalities or ())
    for name, prio in _MODALITY_PRIORITY:
        if name in mods:
            return int(prio)
    return int(Priority.TEXT)


def known_priority(slo: SloTable, priority: int | None) -> bool:
    if priority is None:
        return False
    try:
        slo.class_for_priority(priority)
    except ValueError:
        return False
    return True


def make_stamp(
    slo: SloTable, rid: str, priority: int, arrival_ns: int, *, class_name: str | None = None
) -> Stamp:
    """Class from the priority code (or name), deadline = arrival + Δc on the monotonic clock,
    downstream estimate from the class profile (what `runtime.downstream.Stamp.of` gives a
    request with no downstream step done)."""
    cls = slo.get(class_name) if class_name is not None else slo.class_for_priority(priority)
    target_ns = round(slo.target_s(cls.name) * 1e9)
    p = cls.profile
    downstream_ns = round(p.downstream_steps_to_first_response * p.downstream_step_s * 1e9)
    return Stamp(
        rid, int(cls.priority), cls.name, arrival_ns, arrival_ns + target_ns, downstream_ns
    )


def monotonic_from_wall(wall_s: float | None, *, now_ns: int | None = None) -> int:
    """A wall-clock instant (time.time()) as monotonic ns; never later than now."""
    mono = time.monotonic_ns() if now_ns is None else now_ns
    if wall_s is None:
        return mono
    age_ns = time.time_ns() - round(wall_s * 1e9)
    return mono - age_ns if age_ns > 0 else mono


def stamp_of_params(params: Any) -> Stamp | None:
    extra = getattr(params, "extra_args", None)
    if not extra:
        return None
    return Stamp.from_dict(extra.get(STAMP_KEY))


def stamp_of_request(request: Any) -> Stamp | None:
    """The stamp a vLLM `Request` carries in its sampling params, if any."""
    return stamp_of_params(getattr(request, "sampling_params", None))


def external_id(request: Any) -> str:
    """The orchestrator's id of a stage request (vLLM appends a suffix to `request_id`)."""
    return getattr(request, "external_req_id", None) or request.request_id


def with_stamp(params: Any, stamp: Stamp) -> Any:
    """A copy of `params` whose extra_args carry `stamp`; params without extra_args unchanged."""
    if params is None or not hasattr(params, "extra_args"):
        return params
    from vllm.sampling_params import SamplingParams

    if not isinstance(params, SamplingParams):
        return params  # diffusion / pooling params: the request table carries the stamp
    copy = params.clone()
    copy.extra_args = {**(params.extra_args or {}), STAMP_KEY: stamp.to_dict()}
    return copy
