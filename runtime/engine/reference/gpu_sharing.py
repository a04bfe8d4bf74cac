"""The device and the GPU-sharing mode the stage processes run under.

`resolve_device` and `device_sms` read the device; `GpuSharing` picks the sharing mode for a
policy (`gpu_control.sharing_for`, or the mode `PipelineOptions.sharing` names) and owns the
private MPS daemon of the modes that use MPS. Invariant: while `daemon` is set, this process's
environment holds the daemon's client variables (stage processes spawned meanwhile inherit
them); `stop_mps` restores the environment as it was and clears `daemon`. Only
`Pipeline.start` and `Pipeline.stop` start and stop the daemon; `choose` has no state.
"""

from __future__ import annotations

import logging
import os
from typing import TYPE_CHECKING, Any

from horizonserve.runtime.engine.reference.gpu_control import SHARING_MODES, TIMESLICE, sharing_for

if TYPE_CHECKING:
    from horizonserve.runtime.engine.reference.pipeline import PipelineOptions

log = logging.getLogger(__name__.rpartition(".")[0] + ".pipeline")  # the pipeline's logger


def resolve_device(device: str) -> str:
    if device != "auto":
        return device
    try:
        import torch
    except ImportError:
        return "cpu"
    return "cuda:0" if torch.cuda.is_available() else "cpu"


def device_sms(device: str) -> int | None:
    if not device.startswith("cuda"):
        return None
    import torch

    return int(torch.cuda.get_device_properties(torch.device(device)).multi_processor_count)


class GpuSharing:
    """The sharing-mode choice and the MPS daemon of one pipeline."""

    def __init__(self, options: PipelineOptions) -> None:
        self.options = options  # read at each choice (sharing, mps), as the pipeline's own
        self.daemon: Any = None  # the private MPS daemon while it runs
        self.active = False  # the last start_mps() started a daemon
        self._env: dict[str, str | None] = {}  # what start_mps() overwrote in os.environ

    def choose(self, policy: str, cuda: bool) -> str:
        """The sharing mode for `policy` (time-sliced off CUDA when a mode is named)."""
        opts = self.options
        if opts.sharing != "auto":
            if opts.sharing not in SHARING_MODES:
                raise ValueError(f"sharing: unknown mode {opts.sharing!r}; use {SHARING_MODES}")
            return opts.sharing if cuda else TIMESLICE
        from horizonserve.runtime.gpu import mps_available

        return sharing_for(policy, mps=opts.mps, cuda=cuda, mps_available=mps_available())

    def start_mps(self) -> None:
        """Start a private MPS daemon; stage processes inherit its client environment."""
        from horizonserve.runtime.gpu import MpsDaemon, mps_available

        if not mps_available():
            log.warning("MPS mode requested but nvidia-cuda-mps-control is missing: no MPS")
            self.active = False
            return
        daemon = MpsDaemon()
        try:
            daemon.start()
        except Exception as exc:  # MpsError / OSError: run without MPS, say so
            log.warning("MPS daemon did not start (%s): running without MPS", exc)
            self.active = False
            return
        # No CUDA_MPS_ACTIVE_THREAD_PERCENTAGE: below 100 it would override the Green Context
        # split of the mps-gc mode (and the MPS baselines run uncapped by definition).
        env = daemon.client_env()
        self._env = {k: os.environ.get(k) for k in env}
        os.environ.update(env)  # spawned stage processes inherit it
        self.daemon = daemon
        self.active = True

    def stop_mps(self) -> None:
        for key, value in self._env.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        self.daemon.stop()
        self.daemon = None
