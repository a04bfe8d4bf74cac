"""GPU mechanisms: Green Context SM ladders, NVML memory-pressure sampling, MPS daemon control.

Each degrades with one clear log line where the hardware or software lacks it. Heavy imports
(torch, cuda-python, pynvml) happen only when a mechanism is built.
"""

from horizonserve.runtime.gpu.green_context import (
    SmLadderContexts,
    ladder_variant,
)
from horizonserve.runtime.gpu.mps import (
    MpsDaemon,
    MpsError,
    MpsUnavailableError,
    mps_available,
)
from horizonserve.runtime.gpu.nvml_pressure import NvmlPressureSampler

__all__ = [
    "MpsDaemon",
    "MpsError",
    "MpsUnavailableError",
    "NvmlPressureSampler",
    "SmLadderContexts",
    "ladder_variant",
    "mps_available",
]
