"""The serving systems the simulator compares: a policy plus the GPU-sharing mode around it.

MPS is not a scheduling policy but a way the stage processes share the GPU, so "MPS" is vanilla
FCFS admission under MPS and "EDF-MPS" is EDF under MPS (paper §6.1): presets whose `mps` is set
(`config.PRESETS`). Every system drives the
control core's own policy object; nothing here re-implements a scheduling rule.

The sharing modes follow the reference engine (`engine.reference.gpu_control.sharing_for`):
HorizonServe and the no-rotation ablation run their Green-Context partition on top of MPS;
removing SM throttling removes the caps and keeps MPS, so "w/o SM throttling" is HorizonServe's
temporal policy uncapped under MPS (not time-sliced, which would also remove MPS).
"""

from __future__ import annotations

from dataclasses import dataclass

from horizonserve.runtime.config import PRESETS, PolicyName
from horizonserve.runtime.sim.model import Sharing


@dataclass(frozen=True, slots=True)
class System:
    name: str
    label: str
    policy: PolicyName

    @property
    def mps(self) -> bool:
        """Its stages share the GPU under MPS where the policy leaves them uncapped."""
        return PRESETS[self.policy].mps

    @property
    def uncapped_sharing(self) -> Sharing:
        """How stages share the GPU when the policy leaves the SMs uncapped."""
        return Sharing.MPS if self.mps else Sharing.TIMESLICE


_LABELS: dict[PolicyName, str] = {
    PolicyName.HORIZON: "HorizonServe",
    PolicyName.FCFS: "Vanilla (FCFS)",
    PolicyName.EDF: "EDF",
    PolicyName.MPS: "MPS",
    PolicyName.EDF_MPS: "EDF-MPS",
    PolicyName.NO_ROTATION: "w/o path rotation",
    PolicyName.PRIORITY: "Priority (vLLM)",
    PolicyName.PRIORITY_MPS: "Priority-MPS (vLLM)",
    PolicyName.NO_THROTTLING: "w/o SM throttling",
    PolicyName.NO_DOWNSTREAM: "w/o downstream control",
    PolicyName.NO_PREEMPTION: "w/o preemption",
    PolicyName.SHED: "Shed (vLLM queue limits)",
    PolicyName.SHED_EDF: "Shed-EDF",
    PolicyName.VLLM_OMNI_CURRENT: "vLLM-Omni current",
    PolicyName.MPS_STATIC: "MPS static shares",
}
SYSTEMS: dict[str, System] = {p.value: System(p.value, label, p) for p, label in _LABELS.items()}
BASELINES = ("fcfs", "edf", "mps", "edf-mps", "priority", "priority-mps")
ABLATIONS = (
    "horizon-no-rotation",
    "horizon-no-throttling",
    "horizon-no-downstream",
    "horizon-no-preemption",
)
MAIN = ("horizon", *BASELINES)
# The 2026 co-location baselines (`runtime.baselines`).
BASELINES_2026 = ("shed", "shed-edf", "vllm-omni-current", "mps-static")


def get_system(name: str | System) -> System:
    if isinstance(name, System):
        return name
    try:
        return SYSTEMS[name]
    except KeyError:
        raise ValueError(f"system: unknown {name!r}; choose from {', '.join(SYSTEMS)}") from None
