"""What each stage's worker was asked to run, for the pipeline tests (off unless HS_OMNI_TRACE).

The worker sees every `SchedulerOutput` its engine core's scheduler produced: which requests
it admitted (in order), with the sampling parameters they carry (so the HorizonServe stamp in
`extra_args`), which it preempted, and the scheduler class and policy its stage was configured
with. One JSON line per event, appended to the file HS_OMNI_TRACE names (O_APPEND: the stage
processes share it). This observes vLLM-Omni from outside; it changes nothing it traces.
"""

from __future__ import annotations

import json
import os
import time
from typing import Any

TRACE_ENV = "HS_OMNI_TRACE"
STAMP_KEY = "horizonserve"


def _write(event: dict[str, Any]) -> None:
    path = os.environ.get(TRACE_ENV)
    if not path:
        return
    line = json.dumps(event, default=str) + "\n"
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line.encode())
    finally:
        os.close(fd)


def stage_of(vllm_config: Any) -> str:
    return str(getattr(vllm_config.model_config, "model_stage", None) or "?")


def trace_init(vllm_config: Any) -> None:
    sc = vllm_config.scheduler_config
    cls = getattr(sc, "scheduler_cls", None)
    _write({
        "ev": "init", "stage": stage_of(vllm_config), "pid": os.getpid(),
        "scheduler_cls": cls if isinstance(cls, str) or cls is None else
        f"{cls.__module__}.{cls.__qualname__}",
        "policy": str(getattr(sc, "policy", None)),
    })  # fmt: skip


def _stamp(params: Any) -> Any:
    extra = getattr(params, "extra_args", None) or {}
    return extra.get(STAMP_KEY)


def trace_step(vllm_config: Any, out: Any) -> None:
    """Admissions, preemptions and the scheduled ids of one step (empty steps not written)."""
    new = getattr(out, "scheduled_new_reqs", None) or []
    preempted = sorted(getattr(out, "preempted_req_ids", None) or ())
    resumed = sorted(getattr(getattr(out, "scheduled_cached_reqs", None), "resumed_req_ids",
                             None) or ())  # fmt: skip
    scheduled = sorted(getattr(out, "num_scheduled_tokens", None) or ())
    if not (new or preempted or resumed or scheduled):
        return
    _write({
        "ev": "step", "stage": stage_of(vllm_config), "t_ns": time.monotonic_ns(),
        "new": [{"id": r.req_id, "stamp": _stamp(r.sampling_params),
                 "prompt_len": len(r.prompt_token_ids or ())} for r in new],
        "preempted": preempted, "resumed": resumed,
        "ids": scheduled,
    })  # fmt: skip
