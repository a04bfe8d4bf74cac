"""How a stage process applies its SM cap and reads memory pressure (adapters over runtime.gpu).

`open_sm_cap` returns an object whose `activate(sms)` makes the next kernels of this process
run on `sms` SMs (a pre-allocated Green Context of that ladder level) or on the whole GPU
(`sms=None`). Where the mechanism is missing — CPU runs, baselines, hardware or driver without
Green Contexts — it returns `NoSmCap`, which logs once why and does nothing.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Protocol

log = logging.getLogger(__name__)


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
    """Adapter over the process's Green Context ladder from `runtime.gpu`."""

    def __init__(self, ladder: object, levels: Sequence[int]) -> None:
        self._ladder = ladder
        self.levels = tuple(levels)
        self._current: int | None = None

    def activate(self, sms: int | None) -> None:
        if sms == self._current:
            return
        self._ladder.activate(sms)  # type: ignore[attr-defined]
        self._current = sms

    def close(self) -> None:
        close = getattr(self._ladder, "close", None)
        if close is not None:
            close()


def open_sm_cap(device_type: str, device_index: int, levels: Sequence[int]) -> SmCap:
    """The ladder for `levels` on this device, or `NoSmCap` with the reason logged."""
    if device_type != "cuda":
        return NoSmCap("not a CUDA device")
    if not levels:
        return NoSmCap("uncapped policy")
    try:
        from horizonserve.runtime.gpu import SmLadderContexts  # type: ignore[attr-defined]
    except ImportError as exc:
        log.warning("SM cap unavailable (runtime.gpu ladder missing: %s); running uncapped", exc)
        return NoSmCap(str(exc))
    try:
        ladder = SmLadderContexts(levels=list(levels), device_index=device_index)
    except Exception as exc:
        log.warning("SM cap unavailable (%s); running uncapped", exc)
        return NoSmCap(str(exc))
    return GreenContextCap(ladder, levels)


def open_pressure_sampler(device_type: str, device_index: int) -> Callable[[], float | None]:
    """A zero-argument sampler of the normalised memory-activity signal, or one that says None."""
    if device_type != "cuda":
        return _unknown
    try:
        from horizonserve.runtime.gpu import NvmlSampler  # type: ignore[attr-defined]
    except ImportError as exc:
        log.warning("memory-pressure sampler unavailable (%s); pressure is unknown", exc)
        return _unknown
    try:
        sampler = NvmlSampler(device_index)
    except Exception as exc:
        log.warning("memory-pressure sampler unavailable (%s); pressure is unknown", exc)
        return _unknown
    return sampler.sample  # type: ignore[no-any-return]


def _unknown() -> float | None:
    return None
