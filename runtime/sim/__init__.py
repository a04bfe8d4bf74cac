"""Discrete-event simulator of one GPU serving an omni pipeline. Results are simulated, always.

setup = SimSetup.load("qwen2_5_omni")            # pipeline classes + calibration artifact
result = simulate(setup, trace, "horizon", seed=0)
"""

from horizonserve.runtime.sim.engine import Simulator, simulate
from horizonserve.runtime.sim.result import LABEL, SimResult
from horizonserve.runtime.sim.setup import SimSetup
from horizonserve.runtime.sim.systems import SYSTEMS, System, get_system

__all__ = [
    "LABEL",
    "SYSTEMS",
    "SimResult",
    "SimSetup",
    "Simulator",
    "System",
    "get_system",
    "simulate",
]
