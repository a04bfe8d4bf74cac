"""The torch backend of SmLadderContexts (imported only when a ladder is built).

`make_backend` raises when Green Contexts cannot work here; SmLadderContexts turns that into
its one warning line and runs uncapped.
"""

from __future__ import annotations

import logging
from typing import Any

logger = logging.getLogger(__name__)


def _granted(device_id: int, num_sms: int) -> int | None:
    """Actual SMs for a request of `num_sms`, via the driver API; None if it cannot tell."""
    try:
        from horizonserve.runtime.gpu._driver import granted_sm_count

        return granted_sm_count(device_id, num_sms)
    except Exception as exc:  # cuda-python missing or too old: the count stays unknown
        logger.debug("cannot query granted SM count: %s", exc)
        return None


class _StreamLevel:
    """A level as a stream: switching = event on the old stream, new stream waits on it."""

    def __init__(
        self,
        torch: Any,
        stream: Any,
        base: _StreamLevel | None,
        granted_sms: int | None,
        owner: Any = None,
    ) -> None:
        self._torch = torch
        self.stream = stream
        self._event = torch.cuda.Event()  # reused: record() overwrites, wait uses the latest
        self._base = base  # the uncapped level (None for the uncapped level itself)
        self._owner = owner  # keeps the Green Context alive as long as its stream is used
        self.granted_sms = granted_sms

    def switch_from(self, prev: Any) -> None:
        src = (prev or self._base or self).stream
        if src is self.stream:
            return
        ev = self._event
        ev.record(src)  # everything queued so far on the old stream ...
        self._torch.cuda.set_stream(self.stream)
        self.stream.wait_event(ev)  # ... runs before anything queued on this one

    def leave(self) -> None:
        if self._base is not None:
            self._base.switch_from(self)

    def close(self) -> None:
        if self._owner is not None:
            self.stream.synchronize()
            if hasattr(self._owner, "close"):
                self._owner.close()
            self._owner = None


class _ContextLevel:
    """A level as torch's set_context/pop_context; None context = uncapped (no push)."""

    def __init__(self, ctx: Any, granted_sms: int | None) -> None:
        self._ctx = ctx
        self.granted_sms = granted_sms

    def switch_from(self, prev: Any) -> None:
        if prev is not None:
            prev.leave()
        if self._ctx is not None:
            self._ctx.set_context()

    def leave(self) -> None:
        if self._ctx is not None:
            self._ctx.pop_context()

    def close(self) -> None:
        self._ctx = None  # torch destroys the context with the object


class TorchLadderBackend:
    """Builds levels with torch.cuda.green_contexts (and cuda-python where torch lacks a part).

    `partition="complement"` builds level d on the SMs a process holding the first
    `total - d` SMs does not have (driver streams; see `_driver.DriverGreenContext`), so a
    downstream process's levels are disjoint from the shared stage's. `full_level="green"`
    gives the whole-device level a Green Context and stream of its own (driver API; a plain
    side stream where that fails) instead of the stream current at construction. Either
    option makes every level a driver-API Green Context stream (needs cuda-python).
    """

    def __init__(
        self,
        device_id: int,
        mode: str,
        *,
        force_driver_streams: bool = False,
        partition: str = "first",
        full_level: str = "base",
    ) -> None:
        if partition not in ("first", "complement"):
            raise ValueError(f"partition must be first or complement, got {partition!r}")
        if full_level not in ("base", "green"):
            raise ValueError(f"full_level must be base or green, got {full_level!r}")
        self.partition = partition
        self.full_level = full_level
        if partition == "complement" or full_level == "green":
            # Every level through the same driver split, so a "first" level in one process and
            # a "complement" level in another are computed by the same code (disjoint SMs).
            force_driver_streams = True
        try:
            import torch
        except ImportError as exc:
            raise RuntimeError("torch is not installed") from exc
        if not torch.cuda.is_available():
            raise RuntimeError("torch sees no CUDA device")
        if torch.version.hip is not None:
            raise RuntimeError("Green Contexts are CUDA-only (this torch is built for ROCm)")
        try:
            from torch.cuda import green_contexts
        except ImportError as exc:
            msg = f"torch {torch.__version__} has no torch.cuda.green_contexts"
            raise RuntimeError(msg) from exc
        if not getattr(green_contexts, "SUPPORTED", True):
            raise RuntimeError(f"torch {torch.__version__} was built without Green Contexts")
        self._torch = torch
        self._gc = green_contexts.GreenContext
        self.device_id = device_id
        self.total_sms = torch.cuda.get_device_properties(device_id).multi_processor_count
        # A primary context must exist before green contexts are made from it.
        torch.empty(1, device=f"cuda:{device_id}")
        has_stream = hasattr(self._gc, "Stream") and not force_driver_streams
        if mode == "auto":
            mode = "stream"
        if mode == "context" and not hasattr(self._gc, "set_context"):
            raise RuntimeError("this torch's GreenContext has no set_context (use mode='stream')")
        self.mode = mode
        self._use_driver_streams = mode == "stream" and not has_stream
        if self._use_driver_streams:
            from horizonserve.runtime.gpu import _driver

            _driver._drv()  # ImportError here means: no cuda-python, no driver streams
        self._base: _StreamLevel | None = None
        if mode == "stream":
            base_stream = torch.cuda.current_stream(device_id)
            self._base = _StreamLevel(torch, base_stream, None, self.total_sms)

    def make_level(self, num_sms: int) -> Any:
        torch, device_id = self._torch, self.device_id
        if num_sms >= self.total_sms:  # uncapped: the whole device
            if self._base is not None and self.full_level == "green":
                return self._whole_level()
            if self._base is not None:
                return _StreamLevel(torch, self._base.stream, self._base, self.total_sms)
            return _ContextLevel(None, self.total_sms)
        if self.partition == "complement":
            from horizonserve.runtime.gpu._driver import DriverGreenContext

            dctx = DriverGreenContext(device_id, self.total_sms - num_sms, part="complement")
            stream = torch.cuda.ExternalStream(dctx.stream_handle, device=device_id)
            return _StreamLevel(torch, stream, self._base, dctx.granted_sms, owner=dctx)
        if self.mode == "context":
            ctx = self._gc.create(num_sms=num_sms, device_id=device_id)
            return _ContextLevel(ctx, _granted(device_id, num_sms))
        if self._use_driver_streams:
            from horizonserve.runtime.gpu._driver import DriverGreenContext

            dctx = DriverGreenContext(device_id, num_sms)
            stream = torch.cuda.ExternalStream(dctx.stream_handle, device=device_id)
            return _StreamLevel(torch, stream, self._base, dctx.granted_sms, owner=dctx)
        ctx = self._gc.create(num_sms=num_sms, device_id=device_id)
        return _StreamLevel(torch, ctx.Stream(), self._base, _granted(device_id, num_sms), ctx)

    def _whole_level(self) -> Any:
        """The whole device as a level with its own stream (a Green Context of every SM)."""
        torch, device_id = self._torch, self.device_id
        try:
            from horizonserve.runtime.gpu._driver import DriverGreenContext

            dctx = DriverGreenContext(device_id, self.total_sms, part="whole")
        except Exception as exc:  # no cuda-python / driver: a plain side stream still avoids
            logger.info("whole-device Green Context unavailable (%s): side stream", exc)
            return _StreamLevel(torch, torch.cuda.Stream(device_id), self._base, self.total_sms)
        stream = torch.cuda.ExternalStream(dctx.stream_handle, device=device_id)
        return _StreamLevel(torch, stream, self._base, dctx.granted_sms, owner=dctx)


def make_backend(device_id: int, mode: str, **options: Any) -> TorchLadderBackend:
    return TorchLadderBackend(device_id, mode, **options)
