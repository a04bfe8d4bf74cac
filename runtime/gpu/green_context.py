"""One Green Context per SM ladder level, allocated at process start, switched per step.

Each stage process builds an `SmLadderContexts` for its ladder (the shared stage for the
levels the spatial controller picks from, a downstream stage for the complementary ladder) and
calls `activate(i)` before each forward pass. Allocation is the slow part (driver calls) and
happens once; a switch only changes which pre-built context receives the next kernels, and a
switch to the level already active costs one comparison.

Two ways to put kernels under a Green Context (`mode`):

* ``"stream"``: each level owns a CUDA stream created from its Green Context; activating a
  level makes that stream current (with an event so the new stream waits for everything
  queued on the previous one: work stays totally ordered across switches). Works with CUDA
  graph capture. Uses torch's `GreenContext.Stream()` (torch >= 2.11) or, where torch lacks
  it, a stream made through the driver API (cuda-python).
* ``"context"``: torch's `set_context()` / `pop_context()` push the green context on the
  driver's context stack (torch 2.9+; deprecated in later torch in favour of streams).

A level whose request is >= the device's SM count is "uncapped": by default no Green Context,
kernels run on the stream that was current at construction; with `full_level="green"` it is a
Green Context of every SM with a stream of its own, so the whole-device level runs exactly the
code path of every other level (the serving stages use this; it also lets CUDA graphs be
captured for the whole-GPU level). `partition="complement"` builds each
level on the SMs *not* in the first `total - level` (a downstream process's complementary
ladder, disjoint from the shared stage's SMs even across processes).

Where torch, CUDA, the driver or the GPU lacks Green Contexts, the ladder is built anyway with
`available = False`: one warning line is logged, `activate` only records the level, and every
kernel runs on all SMs.

SM counts are granular, so the driver may grant more than requested; `granted_sms` records
what each level really got (None where it could not be queried). Measured on the H200 (132
SMs, driver 580): groups come in multiples of 8 with a minimum of 8, rounded up (20 -> 24,
130 -> 132). Ladders on the 8-SM grid get exactly what they ask for.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from typing import Protocol

logger = logging.getLogger(__name__)

MODES = ("auto", "stream", "context")


class LevelHandle(Protocol):
    """One allocated ladder level."""

    granted_sms: int | None

    def switch_from(self, prev: LevelHandle | None) -> None:
        """Make this level receive subsequent kernels; `prev` is the level active until now."""
        ...

    def leave(self) -> None:
        """Undo this level: kernels go back to the full device."""
        ...

    def close(self) -> None: ...


class LadderBackend(Protocol):
    """What SmLadderContexts needs from the GPU side (torch, or a fake in tests)."""

    mode: str  # "stream" or "context": the mode actually used
    total_sms: int

    def make_level(self, num_sms: int) -> LevelHandle: ...


class _Unavailable(Exception):
    """Raised by a backend factory when the hardware or software lacks Green Contexts."""


VARIANTS = ("stream", "context", "stream-driver")


def ladder_variant(levels: Sequence[int], variant: str, device_id: int = 0) -> SmLadderContexts:
    """A ladder in one of the measured variants: "stream" / "context" are `mode`s;
    "stream-driver" is stream mode on driver-API streams (torch's green-context `Stream`
    bypassed), the path every complementary ladder takes."""
    if variant not in VARIANTS:
        raise ValueError(f"variant must be one of {VARIANTS}, got {variant!r}")
    if variant != "stream-driver":
        return SmLadderContexts(levels, device_id, mode=variant)
    from horizonserve.runtime.gpu._torch_green import TorchLadderBackend

    return SmLadderContexts(
        levels,
        device_id,
        mode="stream",
        backend_factory=lambda d, m: TorchLadderBackend(d, m, force_driver_streams=True),
    )


def _validate_levels(levels: Sequence[int]) -> tuple[int, ...]:
    out = tuple(int(level) for level in levels)
    if not out:
        raise ValueError("the SM ladder needs at least one level")
    if any(level <= 0 for level in out):
        raise ValueError(f"SM ladder levels must be positive, got {out}")
    return out


class SmLadderContexts:
    """Pre-allocated Green Contexts for an SM ladder; `activate(i)` selects level i."""

    def __init__(
        self,
        levels: Sequence[int],
        device_id: int = 0,
        *,
        mode: str = "auto",
        backend_factory: Callable[[int, str], LadderBackend] | None = None,
        partition: str = "first",
        full_level: str = "base",
    ) -> None:
        if mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
        self.levels = _validate_levels(levels)
        self.device_id = device_id
        self.available = False
        self.unavailable_reason: str | None = None
        self.mode = "none"
        self.total_sms: int | None = None
        self.granted_sms: tuple[int | None, ...] = (None,) * len(self.levels)
        self.alloc_seconds = 0.0
        self.current: int | None = None  # active level index; None = nothing entered yet
        self.switches = 0  # real switches (no-op activations not counted)
        self._handles: list[LevelHandle] = []

        if backend_factory is None:
            from functools import partial

            from horizonserve.runtime.gpu._torch_green import make_backend

            backend_factory = partial(make_backend, partition=partition, full_level=full_level)
        start = time.perf_counter()
        try:
            backend = backend_factory(device_id, mode)
            self.total_sms = backend.total_sms
            for level in self.levels:
                self._handles.append(backend.make_level(level))
        except Exception as exc:  # any failure: run uncapped, say so once
            self._release()
            self.unavailable_reason = str(exc) or type(exc).__name__
            self.granted_sms = (self.total_sms,) * len(self.levels)
            logger.warning(
                "Green Contexts unavailable on device %d (%s): SM ladder %s is not enforced, "
                "every stage runs on all SMs",
                device_id,
                self.unavailable_reason,
                list(self.levels),
            )
            return
        finally:
            self.alloc_seconds = time.perf_counter() - start
        self.available = True
        self.mode = backend.mode
        self.granted_sms = tuple(h.granted_sms for h in self._handles)

    def activate(self, level_index: int) -> None:
        """Send subsequent kernels of this process to level `level_index`'s SMs.

        Invariant: at most one level is entered at a time; `current` names it.
        """
        if level_index == self.current:
            return
        if not 0 <= level_index < len(self.levels):
            raise IndexError(f"level {level_index} out of range [0, {len(self.levels)})")
        if self._handles:
            prev = None if self.current is None else self._handles[self.current]
            self._handles[level_index].switch_from(prev)
        self.current = level_index
        self.switches += 1

    def activate_sms(self, sms: int | None) -> None:
        """`activate` by SM count (a ladder entry); None = `deactivate` (whole device)."""
        if sms is None:
            self.deactivate()
            return
        try:
            index = self.levels.index(sms)
        except ValueError:
            msg = f"{sms} SMs is not a level of this ladder {list(self.levels)}"
            raise ValueError(msg) from None
        self.activate(index)

    def deactivate(self) -> None:
        """Leave the active level: kernels go back to the full device."""
        if self.current is not None and self._handles:
            self._handles[self.current].leave()
        self.current = None

    def close(self) -> None:
        """Leave the active level and free every Green Context (idempotent)."""
        if self._handles:
            self.deactivate()
        self._release()

    def _release(self) -> None:
        handles, self._handles = self._handles, []
        for h in reversed(handles):
            try:
                h.close()
            except Exception:  # freeing during teardown must not mask the real error
                logger.debug("closing a Green Context failed", exc_info=True)

    def __enter__(self) -> SmLadderContexts:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return (
            f"SmLadderContexts(levels={list(self.levels)}, granted={list(self.granted_sms)}, "
            f"mode={self.mode!r}, available={self.available}, current={self.current})"
        )
