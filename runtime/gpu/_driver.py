"""CUDA driver-API pieces (cuda-python) that torch's Green Context API does not expose.

* `granted_sm_count`: how many SMs a request for N really yields. It runs the same split
  torch runs when it creates a Green Context (cuDevSmResourceSplitByCount, one group, no
  flags), so the answer matches the context torch builds, without building one.
* `DriverGreenContext`: a Green Context plus a stream on it, for torch builds whose
  GreenContext has no `Stream()`.

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


def _split(device_id: int, num_sms: int, flags: int = 0) -> tuple[Any, Any]:
    """(device, SM resource of one group of >= num_sms SMs); flags 0 = as torch splits."""
    drv = _drv()
    device, whole = _whole(device_id)
    groups, n_groups, _remaining = _check(
        drv.cuDevSmResourceSplitByCount(1, whole, flags, num_sms), "cuDevSmResourceSplitByCount"
    )
    if n_groups != 1:
        raise RuntimeError(f"SM split for {num_sms} SMs gave {n_groups} groups, expected 1")
    return device, groups[0]


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
    """A Green Context and one non-blocking stream on it, made with the driver API."""

    def __init__(self, device_id: int, num_sms: int) -> None:
        drv = _drv()
        device, group = _split(device_id, num_sms)
        desc = _check(drv.cuDevResourceGenerateDesc([group], 1), "cuDevResourceGenerateDesc")
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
