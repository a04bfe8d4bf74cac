"""Reference stage pipeline: a real multi-process torch pipeline (shared AR stage, then the
talker and code-to-waveform stages for speech and the DiT stage for images, each its own
process) with random weights, scheduled by the control core's policy.

Heavy modules (torch) load only inside the stage processes; importing this package and the
front-side classes below does not import torch.
"""

from horizonserve.runtime.engine.reference.backend import (
    BackendResult,
    ReferenceBackend,
    TimedRequest,
    summarize,
)
from horizonserve.runtime.engine.reference.pipeline import (
    Pipeline,
    PipelineError,
    PipelineOptions,
    RequestHandle,
    RequestRecord,
)
from horizonserve.runtime.engine.reference.protocol import RequestSpec

__all__ = [
    "BackendResult",
    "Pipeline",
    "PipelineError",
    "PipelineOptions",
    "ReferenceBackend",
    "RequestHandle",
    "RequestRecord",
    "RequestSpec",
    "TimedRequest",
    "summarize",
]
