"""What users send: workload specs (shipped length distributions), Poisson traces, the trace type.

The bottom of the data flow: the simulator, the benchmarks, calibration and the reference
engine all read traces from here, and this package imports none of them.
"""

from horizonserve.runtime.workload.generate import generate, mix_weights
from horizonserve.runtime.workload.spec import (
    ClassWorkload,
    DatasetCard,
    DatasetRegistry,
    LengthDist,
    SweepDefaults,
    WorkloadSpec,
    load_datasets,
    load_workload,
)
from horizonserve.runtime.workload.trace import Trace

__all__ = [
    "ClassWorkload",
    "DatasetCard",
    "DatasetRegistry",
    "LengthDist",
    "SweepDefaults",
    "Trace",
    "WorkloadSpec",
    "generate",
    "load_datasets",
    "load_workload",
    "mix_weights",
]
