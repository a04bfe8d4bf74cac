"""CUDA driver-API pieces (cuda-python) that torch's Green Context API does not expose.

* `granted_sm_count`: how many SMs a request for N really yields. It runs the same split
  torch runs when it creates a Green Context (cuDevSmResourceSplitByCount, one group, no
  flags), so the answer matches the context torch builds, without building one.
* `DriverGreenContext`: a Green Context plus a stream on it. Besides "the first N SMs" (the
  split torch makes) it can be built on the *complement* of such a split (the SMs a process
  that took the first N did not get) or on the whole device. Two processes that both split the
  same device the same way get the same groups (the split is a pure function of the device's
  SM resource), so "first N" in one process and "complement of N" in another are disjoint:
  that is how the shared and downstream stage processes partition the GPU between them.

Everything here needs `cuda.bindings` (package cuda-bindings / cuda-python >= 12.8) and a
driver >= 12.8; callers catch ImportError / RuntimeError and degrade.
"""

from __future__ import annotations

from typing import Any


def _drv() -> Any:
    from cuda.bindings import driver  # imported lazily: optional dependency

    return driver


def _check(result: tuple[Any, ...], what: str) -> Any:
    """Unwrap a cuda-python result tuple (error first); raise RuntimeError on failure."""
    drv = _drv()
    err, *values = result
    if err != drv.CUresult.CUDA_SUCCESS:
        raise RuntimeError(f"{what} failed: {err!r}")
    if not values:
        return None
    return values[0] if len(values) == 1 else tuple(values)


def _whole(device_id: int) -> tuple[Any, Any]:
    """(device, its whole SM resource)."""
    drv = _drv()
    _check(drv.cuInit(0), "cuInit")
    device = _check(drv.cuDeviceGet(device_id), "cuDeviceGet")
    whole = _check(
        drv.cuDeviceGetDevResource(device, drv.CUdevResourceType.CU_DEV_RESOURCE_TYPE_SM),
        "cuDeviceGetDevResource",
    )
    return device, whole


def _split3(device_id: int, num_sms: int, flags: int = 0) -> tuple[Any, Any, Any]:
    """(device, the group of >= num_sms SMs, the remaining SMs); flags 0 = as torch splits."""
    drv = _drv()
    device, whole = _whole(device_id)
    groups, n_groups, remaining = _check(
        drv.cuDevSmResourceSplitByCount(1, whole, flags, num_sms), "cuDevSmResourceSplitByCount"
    )
    if n_groups != 1:
        raise RuntimeError(f"SM split for {num_sms} SMs gave {n_groups} groups, expected 1")
    return device, groups[0], remaining


def _split(device_id: int, num_sms: int, flags: int = 0) -> tuple[Any, Any]:
    """(device, SM resource of one group of >= num_sms SMs); flags 0 = as torch splits."""
    device, group, _remaining = _split3(device_id, num_sms, flags)
    return device, group


def granted_sm_count(device_id: int, num_sms: int, flags: int = 0) -> int:
    """SMs a Green Context asked for `num_sms` gets on this device (after rounding).

    `flags` are cuDevSmResourceSplitByCount's (e.g. IGNORE_SM_COSCHEDULING for finer groups);
    torch always splits with 0.
    """
    return int(_split(device_id, num_sms, flags)[1].sm.smCount)


def sm_granularity(device_id: int) -> dict[str, int | None]:
    """The device's SM count and split granularity as the driver reports them.

    `min_partition` / `alignment` exist only in newer bindings (CUDA 13); None otherwise.
    """
    sm = _whole(device_id)[1].sm
    return {
        "sm_count": int(sm.smCount),
        "min_partition": getattr(sm, "minSmPartitionSize", None),
        "alignment": getattr(sm, "smCoscheduledAlignment", None),
    }


class DriverGreenContext:
    """A Green Context and one non-blocking stream on it, made with the driver API.

    part="first": the first group of >= num_sms SMs (what torch's GreenContext.create gives);
    part="complement": the SMs left over when the first `num_sms` are split off (another
    process holding part="first" of the same `num_sms` runs on the other SMs);
    part="whole": every SM of the device (`num_sms` ignored): a full-GPU level that is still a
    stream of its own, never the legacy default stream.
    """

    def __init__(self, device_id: int, num_sms: int, part: str = "first") -> None:
        drv = _drv()
        if part == "whole":
            device, resource = _whole(device_id)
        elif part == "first":
            device, resource = _split(device_id, num_sms)
        elif part == "complement":
            device, _group, resource = _split3(device_id, num_sms)
            if int(resource.sm.smCount) <= 0:
                raise RuntimeError(f"no SMs left after splitting off {num_sms}")
        else:
            raise ValueError(f"part must be first, complement or whole, got {part!r}")
        desc = _check(drv.cuDevResourceGenerateDesc([resource], 1), "cuDevResourceGenerateDesc")
        self._stream: Any = None
        self._gctx = _check(
            drv.cuGreenCtxCreate(
                desc, device, drv.CUgreenCtxCreate_flags.CU_GREEN_CTX_DEFAULT_STREAM
            ),
            "cuGreenCtxCreate",
        )
        try:
            # Ask the context itself: the authoritative count of SMs it may use.
            own = _check(
                drv.cuGreenCtxGetDevResource(
                    self._gctx, drv.CUdevResourceType.CU_DEV_RESOURCE_TYPE_SM
                ),
                "cuGreenCtxGetDevResource",
            )
            self.granted_sms = int(own.sm.smCount)
            self._stream = _check(
                drv.cuGreenCtxStreamCreate(
                    self._gctx, drv.CUstream_flags.CU_STREAM_NON_BLOCKING, 0
                ),
                "cuGreenCtxStreamCreate",
            )
        except BaseException:
            _check(drv.cuGreenCtxDestroy(self._gctx), "cuGreenCtxDestroy")
            raise

    @property
    def stream_handle(self) -> int:
        """The raw CUstream, e.g. for torch.cuda.ExternalStream."""
        return int(self._stream)

    def close(self) -> None:
        """Destroy the stream, then the context (idempotent). Sync the stream first."""
        drv = _drv()
        if self._stream is not None:
            _check(drv.cuStreamDestroy(self._stream), "cuStreamDestroy")
            self._stream = None
        if self._gctx is not None:
            _check(drv.cuGreenCtxDestroy(self._gctx), "cuGreenCtxDestroy")
            self._gctx = None
