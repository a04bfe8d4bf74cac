"""The scheduling step (Algorithm 1) as one object, and the baselines behind the same interface.

A policy owns the profiler (annotation), the temporal index (queue view), the spatial
controller (SM split) and the downstream rules (admission order, preemption). Engines — the
simulator, the reference GPU pipeline and the vLLM-Omni plugin — tell it when requests enter or
leave the shared stage's waiting queue and call `step` once per shared-stage opportunity. Every
decision is a function of state and the `now` passed in; no clock is read here.

    policy                 rotation  order           SM split   downstream  preemption
    horizon                   yes    deadline, late  ladder     slack       yes
    fcfs                       no    FIFO            whole GPU  FIFO        no
    edf                        no    deadline        whole GPU  FIFO        no
    priority                   no    priority        whole GPU  FIFO        on KV pressure (engine)
    horizon-no-rotation        no    deadline, late  ladder     slack       yes
    horizon-no-throttling     yes    deadline, late  whole GPU  slack       yes
    horizon-no-downstream     yes    deadline, late  ladder     FIFO        yes
    horizon-no-preemption     yes    deadline, late  ladder     slack       no
"deadline, late": on-time requests in deadline order (`deadline_order`; off: queue order), late
prefills after them (`late_yield`).
MPS / EDF-MPS are a GPU-sharing mode of the engine, combined with fcfs / edf. "priority" is
vLLM's own policy: waiting requests by (priority code, arrival); under KV pressure the engine
preempts its lowest-priority running request (vLLM's rule, not HorizonServe's).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TypeVar

from horizonserve.runtime.config import PolicyName, ServingConfig
from horizonserve.runtime.downstream import AdmissionQueue, make_queue
from horizonserve.runtime.preemption import choose_victim
from horizonserve.runtime.profiler import InputFeatures, RequestProfiler, RequestSignals
from horizonserve.runtime.spatial import SmDecision, SpatialController, UncappedSpatial
from horizonserve.runtime.temporal import StepView, TemporalScheduler

T = TypeVar("T")


@dataclass(slots=True, frozen=True)
class PolicyTraits:
    rotation: bool  # N:M path rotation + slack guard + long-path cap
    edf: bool  # the view in deadline order
    by_priority: bool  # the view in (priority code, arrival) order
    throttling: bool  # the SM ladder (else every stage may use the whole GPU)
    downstream_control: bool  # slack-ordered downstream admission and playback yielding
    preemption: bool  # a protected short-path request may preempt a long-path decode
    late_yield: bool  # late prefills follow the on-time ones in the view (HorizonServe's rule)
    deadline_order: bool  # on-time requests in deadline order in the view (HorizonServe's rule)


_TRAITS: dict[PolicyName, PolicyTraits] = {
    PolicyName.HORIZON: PolicyTraits(True, False, False, True, True, True, True, True),
    PolicyName.FCFS: PolicyTraits(False, False, False, False, False, False, False, False),
    PolicyName.EDF: PolicyTraits(False, True, False, False, False, False, False, False),
    PolicyName.PRIORITY: PolicyTraits(False, False, True, False, False, False, False, False),
    PolicyName.NO_ROTATION: PolicyTraits(False, False, False, True, True, True, True, True),
    PolicyName.NO_THROTTLING: PolicyTraits(True, False, False, False, True, True, True, True),
    PolicyName.NO_DOWNSTREAM: PolicyTraits(True, False, False, True, False, True, True, True),
    PolicyName.NO_PREEMPTION: PolicyTraits(True, False, False, True, True, False, True, True),
}


def traits_of(name: PolicyName | str) -> PolicyTraits:
    """What a policy does (engines read it to pick a GPU-sharing mode)."""
    return _TRAITS[PolicyName(name)]


@dataclass(slots=True, frozen=True)
class StepDecision:
    view: StepView
    sm: SmDecision
    pressure: float | None  # B̂ after this step's sample
    # The slack ratios the split compared (None: not read, or no request on that side; the
    # shared side is −inf while a short-path or protected prompt waits, and the downstream
    # side None while the shared stage holds its SMs).
    shared_slack: float | None = None
    downstream_slack: float | None = None


class SchedulingPolicy:
    """One shared-stage scheduling policy; build with `make_policy`."""

    __slots__ = (
        "_backlog_at",
        "_hold_s",
        "downstream_control",
        "name",
        "place_admission",
        "place_wait",
        "playback_margin_s",
        "preemption",
        "profiler",
        "reject_late",
        "saturated_first",
        "slack_split",
        "spatial",
        "temporal",
        "traits",
    )

    def __init__(self, name: PolicyName, config: ServingConfig) -> None:
        t = _TRAITS[name]
        control = config.control
        self.name = name
        self.traits = t
        self.profiler = RequestProfiler(config.slo, control.u_guard)
        self.temporal = TemporalScheduler(
            control,
            rotation=t.rotation,
            edf=t.edf,
            by_priority=t.by_priority,
            late_yield=t.late_yield and control.late_yield,
            deadline_order=t.deadline_order and control.deadline_order,
        )
        spatial_cls = SpatialController if t.throttling else UncappedSpatial
        self.spatial: SpatialController | UncappedSpatial = spatial_cls(config.ladder, control)
        self.downstream_control = t.downstream_control and control.downstream_admission
        self.preemption = t.preemption and control.shared_preemption
        self.reject_late = self.downstream_control and control.reject_late
        # Place-aware admission order at streaming downstream stages (runtime.downstream).
        self.place_admission = self.downstream_control and control.place_admission
        # The engines compute the slack inputs of `step` only when the split reads them.
        self.slack_split = t.throttling and control.slack_split
        # Downstream stages report SATURATED while their places are full and requests wait
        # (runtime.downstream.reported_slack); only the split reads it.
        self.saturated_first = (
            self.downstream_control and self.slack_split and control.saturated_downstream_first
        )
        # A full stage that projects its places reports the wait for one instead
        # (runtime.downstream.start_slack); needs the places' projection.
        self.place_wait = self.saturated_first and self.place_admission and control.place_wait_slack
        self._hold_s = control.shared_hold_s
        self._backlog_at = -math.inf  # when the running set was last full with requests waiting
        # Playback yielding is part of downstream control; None: streams never yield.
        self.playback_margin_s = control.playback_margin_s if self.downstream_control else None

    # -- request lifecycle ------------------------------------------------------------------
    def admit(
        self,
        request_id: str,
        arrival: float,
        *,
        priority: int | None = None,
        class_name: str | None = None,
        features: InputFeatures | None = None,
    ) -> RequestSignals:
        """Annotate a new request and enter it into the waiting queue."""
        sig = self.profiler.annotate(
            request_id, arrival, priority=priority, class_name=class_name, features=features
        )
        self.temporal.add(sig, arrival)
        return sig

    def requeue(self, sig: RequestSignals, now: float) -> None:
        """A request went back to waiting (e.g. preempted)."""
        self.temporal.add(sig, now)

    def dequeue(self, sig: RequestSignals) -> None:
        """A request left waiting: taken into a batch, aborted or finished."""
        self.temporal.remove(sig)

    # -- one scheduling step ------------------------------------------------------------------
    def step(
        self,
        now: float,
        *,
        downstream_active: bool,
        pressure_sample: float | None = None,
        backlog: bool = False,
        running: Iterable[RequestSignals] = (),
        downstream_slack: float | None = None,
    ) -> StepDecision:
        """Refresh signals, build the view, select the SM split (Algorithm 1, steps 1–3).

        `backlog`: the engine's running set is full while requests wait for a place.
        `running`, `downstream_slack` (read only when `slack_split`): the shared stage's
        running requests whose first response is still pending here (prefilling short-path,
        long-path before the hand-off), and the downstream side's smallest slack ratio
        (`downstream_slack` over its stages; None when none has a first response pending).
        """
        pressure = self.spatial.observe(pressure_sample)
        view = self.temporal.plan(now)
        shared_slack = None
        if self.slack_split:
            shared_slack = self._shared_slack(now, running)
            if backlog:
                self._backlog_at = now
            if self._shared_holds(now):
                downstream_slack = None  # the shared stage keeps its SMs (`shared_hold_s`)
        else:
            downstream_slack = None  # not read without the slack split
        sm = self.spatial.select(downstream_active, backlog, shared_slack, downstream_slack)
        return StepDecision(view, sm, pressure, shared_slack, downstream_slack)

    def _shared_holds(self, now: float) -> bool:
        """The shared stage is the bottleneck: prompts wait for their prefill, or its running
        set was full with requests waiting less than `shared_hold_s` ago (0: never holds)."""
        if not self._hold_s:
            return False
        t = self.temporal
        return bool(t.short_waiting or t.long_waiting) or now - self._backlog_at < self._hold_s

    def _shared_slack(self, now: float, running: Iterable[RequestSignals]) -> float | None:
        """The shared side's smallest slack ratio: −inf while a short-path prompt or a
        protected request waits (the shared stage then needs its SMs); otherwise over its
        running requests and the waiting prefill nearest protection."""
        temporal = self.temporal
        if temporal.short_waiting or temporal.protected_waiting:
            return -math.inf
        best: float | None = None
        for sig in running:
            u = sig.slack_ratio(now)
            if best is None or u < best:
                best = u
        waiting = temporal.earliest_waiting_slack(now)
        if waiting is not None and (best is None or waiting < best):
            best = waiting
        return best

    # -- downstream and preemption ----------------------------------------------------------
    def downstream_queue(self) -> AdmissionQueue:
        """A fresh admission queue for one downstream stage under this policy."""
        return make_queue(self.downstream_control)

    def preemption_victim(
        self,
        running: Iterable[T],
        now: float,
        signals: Callable[[T], RequestSignals],
        handed_off: Callable[[T], bool],
        next_free_s: float = 0.0,
    ) -> T | None:
        """With the running set full: the running request to preempt for a waiting short-path
        prompt (as of the last `step`), or None (see `preemption`).

        `next_free_s`: the engine's estimate of when a running request frees its place by
        itself. A preemption costs the victim's recompute, so it is taken only for a short-path
        prompt that needs a place sooner (`TemporalScheduler.short_needs_place`): a protected
        one, or one that can still meet its deadline but not after that wait; never for one
        already late; and only when the victim's recompute, paid by every request waiting at
        the shared stage, costs less than the wait saved (so an overloaded stage, with a long
        queue, stops converting its throughput into recomputes).
        """
        temporal = self.temporal
        if not self.preemption or not temporal.short_waiting:
            return None
        sooner = temporal.short_needs_place(now, next_free_s)
        if sooner is None:
            return None
        victim = choose_victim(running, now, signals, handed_off)
        if victim is None:
            return None
        # The victim's recompute (its prompt and decoded tokens, prefilled again) delays every
        # waiting request by its length: their sum must be less than the wait it saves, or the
        # preemption only adds work.
        sig = signals(victim)
        recompute = sig.prefill_s + sig.decoded_tokens * sig.costs.prefill_s_per_token
        waiting = max(1, temporal.short_waiting + temporal.long_waiting)
        return victim if recompute * waiting < sooner else None

    @staticmethod
    def prefill_sms(sm: SmDecision, prompts: Iterable[RequestSignals], now: float) -> int:
        """SMs for the prefill of the prompts a step admitted (after `step`, once the batch is
        formed): `sm.prefill` when one of them is urgent — short-path (its prefill produces the
        first response) or protected by now — else the step's cap `sm.shared`."""
        if sm.prefill == sm.shared:
            return sm.shared
        for sig in prompts:
            if not sig.long_path or now > sig.protect_at:
                return sm.prefill
        return sm.shared


def make_policy(name: PolicyName | str, config: ServingConfig) -> SchedulingPolicy:
    try:
        policy = PolicyName(name)
    except ValueError:
        choices = ", ".join(p.value for p in PolicyName)
        raise ValueError(f"policy: unknown policy {name!r}; choose one of {choices}") from None
    return SchedulingPolicy(policy, config)
