"""The scheduling step (Algorithm 1) as one object, and the baselines behind the same interface.

A policy owns the profiler (annotation), the temporal index (queue view), the spatial
controller (SM split) and the downstream rules (admission order, preemption). Engines — the
simulator, the reference GPU pipeline and the vLLM-Omni plugin — tell it when requests enter or
leave the shared stage's waiting queue and call `step` once per shared-stage opportunity. Every
decision is a function of state and the `now` passed in; no clock is read here.

What a policy does is its control's axes (`config.ControlParams`) under its named preset
(`config.PRESETS`):

    policy                 rotation  view order          SM split   downstream  preemption
    horizon                path      deadline, late last slack      place       shared
    fcfs / mps             off       arrival             uncapped   fifo        none
    edf / edf-mps          off       deadline            uncapped   fifo        none
    priority / -mps        off       priority            uncapped   fifo        none (engine)
    horizon-no-rotation    off       …                   …          …           …
    horizon-no-throttling  …         …                   uncapped   …           …
    horizon-no-downstream  …         …                   …          fifo        …
    horizon-no-preemption  …         …                   …          …           none
"…": as the configured control says. The *-mps presets and horizon-no-throttling share the GPU
under MPS (a mode of the engine). "priority" is vLLM's own policy: waiting requests by
(priority code, arrival); under KV pressure the engine preempts its lowest-priority running
request (vLLM's rule, not HorizonServe's).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import TypeVar

from horizonserve.runtime.config import (
    PRESETS,
    DownstreamOrder,
    DownstreamUrgency,
    PolicyName,
    Preemption,
    ServingConfig,
    SmSplit,
    policy_name,
)
from horizonserve.runtime.downstream import AdmissionQueue, make_queue
from horizonserve.runtime.preemption import choose_victim
from horizonserve.runtime.profiler import InputFeatures, RequestProfiler, RequestSignals
from horizonserve.runtime.spatial import SmDecision, SpatialController, UncappedSpatial
from horizonserve.runtime.temporal import StepView, TemporalScheduler

T = TypeVar("T")


@dataclass(slots=True)
class StepDecision:
    """One step's decision: the view, the SM split, and (asked once the engine knows its
    running set and its batch) the preemption victim and the prefill's SMs. Every engine
    consumes it in that order: `victim`, then the view, then `prefill_sms`.

    Built once per step by `SchedulingPolicy.step`, positionally (a keyword call costs twice
    as much); every other caller names the fields."""

    view: StepView
    sm: SmDecision
    pressure: float | None  # B̂ after this step's sample
    # The slack ratios the split compared (None: not read, or no request on that side; the
    # shared side is −inf while a short-path or protected prompt waits, and the downstream
    # side None while the shared stage holds its SMs).
    shared_slack: float | None = None
    downstream_slack: float | None = None
    now: float = 0.0
    backlog: bool = False  # the running set was full with requests waiting
    policy: SchedulingPolicy | None = field(default=None, repr=False, compare=False)

    def victim(
        self,
        running: Iterable[T],
        signals: Callable[[T], RequestSignals],
        handed_off: Callable[[T], bool],
        next_free_s: float = 0.0,
    ) -> T | None:
        """The running request to preempt for a waiting short-path prompt, or None: only on
        a backlogged step (`SchedulingPolicy.preemption_victim`)."""
        if not self.backlog or self.policy is None or not self.policy.preemption:
            return None
        return self.policy.preemption_victim(running, self.now, signals, handed_off, next_free_s)

    def prefill_sms(self, prompts: Iterable[RequestSignals]) -> int:
        """SMs for the prefill of the prompts the step admitted (`SchedulingPolicy.prefill_sms`)."""
        return SchedulingPolicy.prefill_sms(self.sm, prompts, self.now)


class SchedulingPolicy:
    """One shared-stage scheduling policy; build with `make_policy`."""

    __slots__ = (
        "_backlog_at",
        "_hold_s",
        "control",
        "downstream_control",
        "horizon",
        "mps",
        "name",
        "place_admission",
        "playback_margin_s",
        "preemption",
        "profiler",
        "reject_late",
        "saturated_first",
        "slack_split",
        "spatial",
        "temporal",
    )

    def __init__(self, name: PolicyName, config: ServingConfig) -> None:
        preset = PRESETS[name]
        control = preset.apply(config.control)
        self.name = name
        self.control = control  # the resolved axes this policy runs
        self.mps = preset.mps  # its stages share the GPU under MPS where left uncapped
        self.horizon = not preset.baseline  # HorizonServe or one of its ablations
        self.profiler = RequestProfiler(config.slo, control.u_guard)
        self.temporal = TemporalScheduler(control)
        self.slack_split = control.sm_split is SmSplit.SLACK
        if control.sm_split is SmSplit.UNCAPPED:
            self.spatial: SpatialController | UncappedSpatial = UncappedSpatial(
                config.ladder, control
            )
        else:
            self.spatial = SpatialController(config.ladder, control, config.verdicts)
        self.downstream_control = control.downstream is not DownstreamOrder.FIFO
        self.preemption = control.preemption is Preemption.SHARED
        self.reject_late = control.reject_late
        # Place-aware admission order at streaming downstream stages (runtime.downstream).
        self.place_admission = control.downstream is DownstreamOrder.PLACE
        # Downstream stages report SATURATED while their places are full and requests wait
        # (runtime.downstream.reported_slack); only the split reads it.
        self.saturated_first = control.downstream_urgency is DownstreamUrgency.SATURATED
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
        running: Iterable[RequestSignals] | Callable[[], Iterable[RequestSignals]] = (),
        downstream_slack: float | Callable[[], float | None] | None = None,
    ) -> StepDecision:
        """Refresh signals, build the view, select the SM split (Algorithm 1, steps 1–3).

        `backlog`: the engine's running set is full while requests wait for a place.
        `running`, `downstream_slack`: the shared stage's running requests whose first
        response is still pending here (prefilling short-path, long-path before the hand-off),
        and the downstream side's smallest slack ratio (None when no downstream stage has a
        first response pending). Engines pass them as callables: they are read only when the
        split reads them (`slack_split`, downstream stages active).
        """
        pressure = self.spatial.observe(pressure_sample)
        view = self.temporal.plan(now)
        shared_slack = None
        if self.slack_split:
            if callable(running):
                running = running() if downstream_active else ()
            if callable(downstream_slack):
                downstream_slack = downstream_slack() if downstream_active else None
            shared_slack = self._shared_slack(now, running)
            if backlog:
                self._backlog_at = now
            if self._shared_holds(now):
                downstream_slack = None  # the shared stage keeps its SMs (`shared_hold_s`)
        else:
            downstream_slack = None  # not read without the slack split
        sm = self.spatial.select(downstream_active, backlog, shared_slack, downstream_slack)
        # Field order: view, sm, pressure, shared_slack, downstream_slack, now, backlog, policy.
        return StepDecision(view, sm, pressure, shared_slack, downstream_slack, now, backlog, self)

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
            u = (sig.deadline - now) / sig.remaining_s()  # sig.slack_ratio(now), inlined
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
    return SchedulingPolicy(policy_name(name), config)
