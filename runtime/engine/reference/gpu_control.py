"""How a stage process applies its SM cap and reads memory pressure (adapters over runtime.gpu).

`open_sm_cap` returns an object whose `activate(sms)` makes the next kernels of this process
run on `sms` SMs (a pre-allocated Green Context of that ladder level, `SmLadderContexts`) or on
the whole GPU (`sms=None`). The whole GPU is a level too: a Green Context of every SM with a
stream of its own, so capped and uncapped steps (and every policy) run the same code path
and decode graphs can be captured for it (capture is impossible on the legacy default stream).
The smoke run's "uncapped is 3-4x slower" was not the stream: it was measured first, and the
first steps of a process pay a per-new-shape set-up cost (bench/results/engine/h200-graphs-1/:
88 ms, then 11.6 ms on the same legacy stream). Where the mechanism is
missing — CPU runs, hardware, driver or torch without Green Contexts — it returns `NoSmCap`,
and `runtime.gpu` has logged why.

How the stage processes share the GPU (`Sharing`), chosen per run by `sharing_for`:

* ``timeslice`` — separate CUDA contexts, no MPS, no caps: what an unmodified multi-process
  runtime does (Vanilla, EDF). The GPU time-slices between the processes.
* ``mps`` — an MPS control daemon for the run, every stage an MPS client, no caps (the MPS
  and EDF-MPS baselines; the no-throttling ablation, which keeps HorizonServe's runtime).
* ``mps-gc`` — HorizonServe: MPS clients (so the processes' kernels really run at the same
  time) *and* a Green Context ladder per process. Green Contexts alone partition SMs only
  inside one process: without MPS the processes are still time-sliced, so a cap would only
  shrink the shared stage's slice (measured on the H200: bench/results/engine/). MPS must
  not set CUDA_MPS_ACTIVE_THREAD_PERCENTAGE (below 100 it overrides the Green Context split).
  The downstream processes build their levels on the complement of the shared stage's SMs
  (`partition="complement"`), so the split is disjoint across processes.
* ``gc`` — Green Context ladders without MPS (where the MPS binaries are missing): the cap is
  applied, the processes time-slice.

The `mps-static` baseline (`runtime.baselines`) runs under ``mps`` with no HorizonServe control
(no SM split, FCFS) and one exception to the rule above: each stage process is an MPS client
with its own fixed CUDA_MPS_ACTIVE_THREAD_PERCENTAGE (`static_shares`: the shared stage
`baselines.static_share` SMs, or an override; every downstream process the rest), set in that
process before its CUDA context exists (`apply_static_share`). The percentage caps how many SMs
a client's kernels may occupy at once; it does not pin SMs, so the shared stage's and a
downstream stage's kernels may still meet on one SM, and each downstream process has the
whole rest to itself. On a CPU run (or without an MPS daemon) the shares are computed, checked
and reported per process but have no effect.
"""

from __future__ import annotations

import logging
import math
import os
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Protocol

from horizonserve.runtime.baselines import rules_for, static_share
from horizonserve.runtime.config import PRESETS, ControlParams, SmSplit, policy_name

if TYPE_CHECKING:
    from horizonserve.runtime.gpu import SmLadderContexts

log = logging.getLogger(__name__)

# NVML refreshes memory activity every 1/6–1 s; sampling faster only re-reads the cache.
NVML_MIN_INTERVAL_NS = 20_000_000


TIMESLICE = "timeslice"
MPS = "mps"
MPS_GC = "mps-gc"
GC = "gc"
SHARING_MODES = (TIMESLICE, MPS, MPS_GC, GC)


def sharing_for(policy: str, *, mps: bool, cuda: bool, mps_available: bool = True) -> str:
    """The GPU-sharing mode a policy runs under (see the module docstring)."""
    if not cuda:
        return TIMESLICE  # CPU: nothing to share, nothing to cap
    preset = PRESETS[policy_name(policy)]
    if preset.apply(ControlParams()).sm_split is not SmSplit.UNCAPPED:
        return MPS_GC if mps_available else GC
    if mps or preset.mps:  # the *-mps presets, and w/o SM throttling: uncapped, under MPS
        return MPS if mps_available else TIMESLICE
    return TIMESLICE


MPS_PERCENT_ENV = "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"


def mps_percentage(sms: int, total_sms: int) -> int:
    """CUDA_MPS_ACTIVE_THREAD_PERCENTAGE for a client held to `sms` of `total_sms` SMs,
    rounded up so the client gets no less than its share. Invariant: 1 ≤ result ≤ 100."""
    if not 0 < sms <= total_sms:
        raise ValueError(f"mps-static: {sms} SMs of {total_sms} is not a share of the GPU")
    return min(100, max(1, math.ceil(100 * sms / total_sms)))


def static_shares(
    policy: str,
    pipeline: str,
    total_sms: int,
    stages: Sequence[str],
    override: int | None = None,
) -> dict[str, int]:
    """Each stage process's fixed SMs under `mps-static` (empty under every other policy):
    the shared stage `baselines.static_share(pipeline, total_sms, override)`, each downstream
    stage in `stages` the rest. Invariant: shared + rest = total_sms."""
    if not rules_for(policy).static_share:
        return {}
    share = static_share(pipeline, total_sms, override)
    return {name: share if name == "shared" else total_sms - share for name in stages}


def apply_static_share(percentage: int | None, sharing: str, device_type: str) -> bool:
    """Hold this stage process to its fixed share (`mps-static`): CUDA_MPS_ACTIVE_THREAD_PERCENTAGE
    in its environment, which the MPS client reads when its CUDA context is created, so this
    must run before any CUDA call. False (nothing set) without a share, off a CUDA device or
    outside MPS."""
    if percentage is None or device_type != "cuda" or sharing != MPS:
        return False
    os.environ[MPS_PERCENT_ENV] = str(percentage)
    return True


def uses_mps(sharing: str) -> bool:
    return sharing in (MPS, MPS_GC)


def uses_caps(sharing: str) -> bool:
    return sharing in (MPS_GC, GC)


class SmCap(Protocol):
    levels: tuple[int, ...]

    def activate(self, sms: int | None) -> None: ...

    def close(self) -> None: ...


class NoSmCap:
    """Every kernel may use the whole device."""

    def __init__(self, reason: str) -> None:
        self.levels: tuple[int, ...] = ()
        self.reason = reason

    def activate(self, sms: int | None) -> None:
        return None

    def close(self) -> None:
        return None


class GreenContextCap:
    """Adapter over `runtime.gpu.SmLadderContexts`: SM counts in, ladder level indices out.

    `levels` are the capped levels; the ladder's last entry, when it covers the whole device,
    is the full-GPU level that `activate(None)` selects.
    """

    def __init__(self, ladder: SmLadderContexts, partition: str = "first") -> None:
        self._ladder = ladder
        total = ladder.total_sms or 0
        all_levels = tuple(ladder.levels)
        self._full: int | None = None
        if all_levels and total and all_levels[-1] >= total:
            self._full = len(all_levels) - 1
            all_levels = all_levels[:-1]
        self.levels = all_levels
        self.granted = tuple(ladder.granted_sms[: len(all_levels)])
        self.full_granted = None if self._full is None else ladder.granted_sms[self._full]
        self.mode = ladder.mode
        self.partition = partition
        self._index = {sms: i for i, sms in enumerate(self.levels)}

    def activate(self, sms: int | None) -> None:
        if sms is None:
            if self._full is not None:
                self._ladder.activate(self._full)
            else:
                self._ladder.deactivate()
            return
        i = self._index.get(sms)
        if i is None:
            raise ValueError(f"{sms} SMs is not a pre-allocated level {self.levels}")
        self._ladder.activate(i)

    def close(self) -> None:
        self._ladder.close()


def open_sm_cap(
    device_type: str, device_index: int, levels: Sequence[int], *, partition: str = "first"
) -> SmCap:
    """The ladder for `levels` (+ the full-GPU level) on this device, or `NoSmCap`.

    `levels` empty = uncapped: only the full-GPU level (its own stream). partition
    "complement": each level sits on the SMs the shared stage does not hold at total - level.
    """
    if device_type != "cuda":
        return NoSmCap("not a CUDA device")
    import torch

    from horizonserve.runtime.gpu import SmLadderContexts

    total = torch.cuda.get_device_properties(device_index).multi_processor_count
    wanted = [*sorted({s for s in levels if 0 < s < total}), total]
    ladder = SmLadderContexts(
        wanted, device_index, mode="stream", partition=partition, full_level="green"
    )
    if not ladder.available and partition == "first":
        # cuda-python missing (driver streams): torch's own Green Context streams still work
        ladder = SmLadderContexts(wanted, device_index, mode="stream")
    if not ladder.available:  # SmLadderContexts logged why
        return NoSmCap(ladder.unavailable_reason or "Green Contexts unavailable")
    log.info(
        "SM ladder %s (granted %s, mode %s, partition %s)",
        ladder.levels,
        ladder.granted_sms,
        ladder.mode,
        partition,
    )
    cap = GreenContextCap(ladder, partition)
    cap.activate(None)  # start on the full-GPU level's stream, never the legacy default stream
    return cap


def open_pressure_sampler(device_type: str, device_index: int) -> Callable[[], float | None]:
    """Zero-argument sampler of NVML memory activity in [0, 1]; None while unknown."""
    if device_type != "cuda":
        return _unknown
    from horizonserve.runtime.gpu import NvmlPressureSampler

    sampler = NvmlPressureSampler(device_index, min_interval_ns=NVML_MIN_INTERVAL_NS)
    if not sampler.available:  # the sampler logged why
        return _unknown

    def sample() -> float | None:
        value = sampler.sample()
        return None if math.isnan(value) else value

    return sample


def sm_info(sm: SmCap) -> dict[str, object]:
    """What a stage reports about its SM mechanism at start-up."""
    info: dict[str, object] = {"sm_cap": type(sm).__name__, "sm_levels": list(sm.levels)}
    if isinstance(sm, GreenContextCap):
        info.update(
            sm_granted=list(sm.granted),
            sm_mode=sm.mode,
            sm_partition=sm.partition,
            sm_full_granted=sm.full_granted,
        )
    elif isinstance(sm, NoSmCap):
        info["sm_reason"] = sm.reason
    return info


def _unknown() -> float | None:
    return None
