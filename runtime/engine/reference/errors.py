"""The errors the pipeline raises to its callers (the HTTP layer maps them to status codes).

`PipelineError`: not running, a stage failed during start-up or a command got no answer.
`StageUnavailableError` (503 with Retry-After) while a stage a class needs is down;
`QueueFullError`, a subclass, when the shed presets' queue limits refuse a request.
"""

from __future__ import annotations


class PipelineError(RuntimeError):
    pass


class SharingMismatchError(PipelineError):
    """The new policy needs another GPU-sharing mode: the stages must be restarted."""


class StageUnavailableError(PipelineError):
    """A stage the request's class needs is down or restarting; try again later."""

    def __init__(self, stage: str, class_name: str, retry_after_s: float, reason: str) -> None:
        super().__init__(f"class {class_name!r} is unavailable: {stage} stage {reason}")
        self.stage = stage
        self.class_name = class_name
        self.retry_after_s = retry_after_s


class QueueFullError(StageUnavailableError):
    """Shed by vLLM's queue limits (the shed presets, `runtime.shedding`): HTTP 503."""

    def __init__(self, class_name: str, reason: str) -> None:
        super().__init__("shared", class_name, 1.0, f"refused it by its queue limits ({reason})")
        self.reason = reason
