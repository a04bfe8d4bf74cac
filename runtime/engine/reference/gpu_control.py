"""How a stage process applies its SM cap and reads memory pressure (adapters over runtime.gpu).

`open_sm_cap` returns an object whose `activate(sms)` makes the next kernels of this process
run on `sms` SMs (a pre-allocated Green Context of that ladder level, `SmLadderContexts`) or on
the whole GPU (`sms=None`). Where the mechanism is missing — CPU runs, hardware, driver or
torch without Green Contexts — it returns `NoSmCap`, and `runtime.gpu` has logged why.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from horizonserve.runtime.gpu import SmLadderContexts

log = logging.getLogger(__name__)

# NVML refreshes memory activity every 1/6–1 s; sampling faster only re-reads the cache.
NVML_MIN_INTERVAL_NS = 20_000_000


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
    """Adapter over `runtime.gpu.SmLadderContexts`: SM counts in, ladder level indices out."""

    def __init__(self, ladder: SmLadderContexts) -> None:
        self._ladder = ladder
        self.levels = tuple(ladder.levels)
        self.granted = tuple(ladder.granted_sms)
        self.mode = ladder.mode
        self._index = {sms: i for i, sms in enumerate(self.levels)}

    def activate(self, sms: int | None) -> None:
        if sms is None:
            self._ladder.deactivate()
            return
        i = self._index.get(sms)
        if i is None:
            raise ValueError(f"{sms} SMs is not a pre-allocated level {self.levels}")
        self._ladder.activate(i)

    def close(self) -> None:
        self._ladder.close()


def open_sm_cap(device_type: str, device_index: int, levels: Sequence[int]) -> SmCap:
    """The ladder for `levels` on this device, or `NoSmCap` with the reason logged."""
    if device_type != "cuda":
        return NoSmCap("not a CUDA device")
    if not levels:
        return NoSmCap("no SM levels (uncapped)")
    from horizonserve.runtime.gpu import SmLadderContexts

    ladder = SmLadderContexts(sorted(levels), device_index)
    if not ladder.available:  # SmLadderContexts logged why
        return NoSmCap(ladder.unavailable_reason or "Green Contexts unavailable")
    log.info("SM ladder %s (granted %s, mode %s)", ladder.levels, ladder.granted_sms, ladder.mode)
    return GreenContextCap(ladder)


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
        info.update(sm_granted=list(sm.granted), sm_mode=sm.mode)
    elif isinstance(sm, NoSmCap):
        info["sm_reason"] = sm.reason
    return info


def _unknown() -> float | None:
    return None
