"""The serving systems the simulator compares: a policy plus the GPU-sharing mode around it.

MPS is not a scheduling policy but a way the stage processes share the GPU, so "MPS" is vanilla
FCFS admission under MPS and "EDF-MPS" is EDF under MPS (paper §6.1). Every system drives the
control core's own policy object; nothing here re-implements a scheduling rule.

The sharing modes follow the reference engine (`engine.reference.gpu_control.sharing_for`):
HorizonServe and the no-rotation ablation run their Green-Context partition on top of MPS;
removing SM throttling removes the caps and keeps MPS, so "w/o SM throttling" is HorizonServe's
temporal policy uncapped under MPS (not time-sliced, which would also remove MPS).
"""

from __future__ import annotations

from dataclasses import dataclass

from horizonserve.runtime.config import PolicyName
from horizonserve.runtime.sim.model import Sharing


@dataclass(frozen=True, slots=True)
class System:
    name: str
    label: str
    policy: PolicyName
    mps: bool = False

    @property
    def uncapped_sharing(self) -> Sharing:
        """How stages share the GPU when the policy leaves the SMs uncapped."""
        return Sharing.MPS if self.mps else Sharing.TIMESLICE


SYSTEMS: dict[str, System] = {
    s.name: s
    for s in (
        System("horizon", "HorizonServe", PolicyName.HORIZON),
        System("fcfs", "Vanilla (FCFS)", PolicyName.FCFS),
        System("edf", "EDF", PolicyName.EDF),
        System("mps", "MPS", PolicyName.FCFS, mps=True),
        System("edf-mps", "EDF-MPS", PolicyName.EDF, mps=True),
        System("horizon-no-rotation", "w/o path rotation", PolicyName.NO_ROTATION),
        System("priority", "Priority (vLLM)", PolicyName.PRIORITY),
        System("priority-mps", "Priority-MPS (vLLM)", PolicyName.PRIORITY, mps=True),
        System("horizon-no-throttling", "w/o SM throttling", PolicyName.NO_THROTTLING, mps=True),
        System("horizon-no-downstream", "w/o downstream control", PolicyName.NO_DOWNSTREAM),
        System("horizon-no-preemption", "w/o preemption", PolicyName.NO_PREEMPTION),
    )
}
BASELINES = ("fcfs", "edf", "mps", "edf-mps", "priority", "priority-mps")
ABLATIONS = (
    "horizon-no-rotation",
    "horizon-no-throttling",
    "horizon-no-downstream",
    "horizon-no-preemption",
)
MAIN = ("horizon", *BASELINES)


def get_system(name: str | System) -> System:
    if isinstance(name, System):
        return name
    try:
        return SYSTEMS[name]
    except KeyError:
        raise ValueError(f"system: unknown {name!r}; choose from {', '.join(SYSTEMS)}") from None
