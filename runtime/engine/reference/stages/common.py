"""What every stage process shares: its configuration, torch set-up, queue and parent handling."""

from __future__ import annotations

import logging
import multiprocessing as mp
import os
import queue
from dataclasses import dataclass, field
from typing import Any

from horizonserve.runtime.engine.reference.presets import ENGINE_PROFILE, PipelinePreset, get_preset

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class StageConfig:
    """Everything a stage process needs; picklable, built by the front process."""

    preset: str
    device: str  # "cpu" or "cuda:N"
    serving_json: str  # ServingConfig as JSON (the shared stage builds its policy from it)
    record_path: str  # the control record in /dev/shm
    capped: bool  # apply the SM ladder (False: baselines, no-throttling ablation, CPU)
    sharing: str = "timeslice"  # GPU-sharing mode of the run (gpu_control.SHARING_MODES)
    graphs: bool = True  # CUDA graphs for AR decode (CUDA only; CPU always runs eagerly)
    downstream_slot: int = 0  # control-record slot a downstream stage writes
    seed: int = 0
    threads: int = 1  # torch intra-op threads (CPU runs)
    trace_interval_s: float = 0.25
    heartbeat_max_age_s: float = 2.0  # downstream slots older than this count as inactive
    warmup: bool = True
    limits: dict[str, int] = field(default_factory=dict)  # thinker limit overrides
    profile: str = ENGINE_PROFILE  # deploy profile the stage limits come from
    pipeline: str | None = None  # the pipeline served: whose deploy file sizes the thinker
    # The 2026 baselines (`runtime.baselines`). vllm-omni-current: the talker's window K (None:
    # its places) and the record where the stages the shared stage feeds publish their queue
    # depth for DTPS ("" none). mps-static: this process's fixed SMs and their MPS percentage.
    window: int | None = None
    queue_record_path: str = ""
    sm_share: int | None = None
    mps_percentage: int | None = None

    def get_preset(self) -> PipelinePreset:
        return get_preset(self.preset, self.profile, self.pipeline, **self.limits)


def setup_torch(cfg: StageConfig) -> tuple[Any, Any]:
    """Seed, threads, default device; returns (device, dtype): bf16 on CUDA, fp32 on CPU.
    Under mps-static the process's MPS share is set first, before its CUDA context exists."""
    import torch

    from horizonserve.runtime.engine.reference.gpu_control import apply_static_share

    device = torch.device(cfg.device)
    apply_static_share(cfg.mps_percentage, cfg.sharing, device.type)
    torch.manual_seed(cfg.seed)
    if device.type == "cuda":
        torch.cuda.set_device(device)
        torch.backends.cuda.matmul.allow_tf32 = True
        # Never the legacy default stream: CUDA graphs cannot be captured on it, and every
        # level (the whole GPU too) runs on a stream of its own. SM levels replace this one.
        torch.cuda.set_stream(torch.cuda.Stream(device))
        return device, torch.bfloat16
    torch.set_num_threads(max(1, cfg.threads))
    return device, torch.float32


def share_info(cfg: StageConfig, device: Any) -> dict[str, object]:
    """What a stage reports about its fixed share (mps-static; empty otherwise): the share,
    its percentage, whether it applies (a CUDA device under MPS) and, on the GPU, the SM count
    the process sees."""
    from horizonserve.runtime.engine.reference.gpu_control import MPS, MPS_PERCENT_ENV

    if cfg.sm_share is None:
        return {}
    applied = device.type == "cuda" and cfg.sharing == MPS
    info: dict[str, object] = {
        "sm_share": cfg.sm_share,
        "mps_thread_percentage": cfg.mps_percentage,
        "sm_share_applied": applied and os.environ.get(MPS_PERCENT_ENV) == str(cfg.mps_percentage),
    }
    if device.type != "cuda":
        info["sm_share_reason"] = "not a CUDA device: recorded, no effect"
    elif not applied:
        info["sm_share_reason"] = f"GPU sharing {cfg.sharing}, not MPS: no effect"
    else:
        import torch

        info["sms_visible"] = torch.cuda.get_device_properties(device).multi_processor_count
    return info


def memory_info(device: Any) -> dict[str, float]:
    """GiB allocated / reserved by this process on a CUDA device (empty on CPU)."""
    import torch

    if device.type != "cuda":
        return {}
    return {
        "allocated_gib": torch.cuda.memory_allocated(device) / 2**30,
        "reserved_gib": torch.cuda.memory_reserved(device) / 2**30,
        "max_allocated_gib": torch.cuda.max_memory_allocated(device) / 2**30,
    }


def drain(q: Any, *, block: bool, timeout: float = 0.05, limit: int = 256) -> list[Any]:
    """Messages waiting on `q` (waits up to `timeout` for the first one when `block`)."""
    out: list[Any] = []
    try:
        out.append(q.get(timeout=timeout) if block else q.get_nowait())
    except queue.Empty:
        return out
    while len(out) < limit:
        try:
            out.append(q.get_nowait())
        except queue.Empty:
            break
    return out


class ParentWatch:
    """True once the front process is gone, so a stage never outlives it as an orphan."""

    def __init__(self, every_s: float = 0.5) -> None:
        self._parent = mp.parent_process()
        self._ppid = os.getppid()
        self._every = every_s
        self._next = 0.0

    def gone(self, now: float) -> bool:
        if now < self._next:
            return False
        self._next = now + self._every
        if os.getppid() != self._ppid:
            return True
        return self._parent is not None and not self._parent.is_alive()
