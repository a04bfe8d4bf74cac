"""The scheduling step (Algorithm 1) as one object, and the baselines behind the same interface.

A policy owns the profiler (annotation), the temporal index (queue view) and the spatial
controller (SM cap). Engines — the simulator, the reference GPU pipeline and the vLLM-Omni
plugin — tell it when requests enter or leave the shared stage's waiting queue and call `step`
once per shared-stage opportunity. Every decision is a function of state and the `now` passed
in; no clock is read here.

    policy   rotation+cap  slack guard  order     SM cap
    horizon        yes          yes      FIFO      Eq. (1) ladder
    fcfs            no           —       FIFO      whole GPU
    edf             no           —       deadline  whole GPU
    horizon-no-rotation   no     —       FIFO      Eq. (1) ladder
    horizon-no-throttling yes   yes      FIFO      whole GPU
MPS / EDF-MPS are a GPU-sharing mode of the engine, combined with fcfs / edf.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from horizonserve.runtime.config import PolicyName, ServingConfig
from horizonserve.runtime.profiler import InputFeatures, RequestProfiler, RequestSignals
from horizonserve.runtime.spatial import SmDecision, SpatialController, UncappedSpatial
from horizonserve.runtime.temporal import StepView, TemporalScheduler

# (rotation, edf, throttling) per policy.
_POLICY_FLAGS: dict[PolicyName, tuple[bool, bool, bool]] = {
    PolicyName.HORIZON: (True, False, True),
    PolicyName.FCFS: (False, False, False),
    PolicyName.EDF: (False, True, False),
    PolicyName.NO_ROTATION: (False, False, True),
    PolicyName.NO_THROTTLING: (True, False, False),
}


@dataclass(slots=True, frozen=True)
class StepDecision:
    view: StepView
    sm: SmDecision
    pressure: float | None  # B̂ after this step's sample


class SchedulingPolicy:
    """One shared-stage scheduling policy; build with `make_policy`."""

    __slots__ = ("name", "profiler", "spatial", "temporal")

    def __init__(self, name: PolicyName, config: ServingConfig) -> None:
        rotation, edf, throttling = _POLICY_FLAGS[name]
        self.name = name
        self.profiler = RequestProfiler(config.slo, config.control.u_guard)
        self.temporal = TemporalScheduler(config.control, rotation=rotation, edf=edf)
        spatial_cls = SpatialController if throttling else UncappedSpatial
        self.spatial: SpatialController | UncappedSpatial = spatial_cls(
            config.ladder, config.control
        )

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
    ) -> StepDecision:
        """Refresh signals, build the view, select the SM split (Algorithm 1, steps 1–3).

        `backlog`: the engine's running set is full while requests wait for a place.
        """
        pressure = self.spatial.observe(pressure_sample)
        view = self.temporal.plan(now)
        return StepDecision(view, self.spatial.select(downstream_active, backlog), pressure)

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
