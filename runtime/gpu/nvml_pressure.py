"""Memory-pressure sampler: NVML's device memory activity, read at scheduling-step boundaries.

`nvmlDeviceGetUtilizationRates(handle).memory` is the percentage of the last sample period
during which device memory was being read or written. NVML refreshes it once per sample
period (1/6 s to 1 s depending on the GPU), so reading it more often returns the same number:
`min_interval_ns` caches the last value and skips the call until the interval has passed.

The sampler does not smooth: the spatial controller owns the EWMA. Unknown is NaN (NVML
missing, init failed, or the call failed); each kind of failure is logged once.
"""

from __future__ import annotations

import logging
import math
import time
from types import ModuleType
from typing import Any

logger = logging.getLogger(__name__)

UNKNOWN = math.nan


def _import_pynvml() -> ModuleType:
    import pynvml  # nvidia-ml-py: optional dependency

    return pynvml


class NvmlPressureSampler:
    """Samples one GPU's memory activity as a fraction in [0, 1] (NaN = unknown)."""

    def __init__(
        self,
        device_index: int = 0,
        *,
        min_interval_ns: int = 0,
        nvml: ModuleType | None = None,
    ) -> None:
        self.device_index = device_index
        self.min_interval_ns = min_interval_ns
        self.available = False
        self.unavailable_reason: str | None = None
        self.last_value: float = UNKNOWN  # last value returned (cached between samples)
        self.nvml_calls = 0  # real NVML queries made (cache hits excluded)
        self._last_ns: int | None = None
        self._call_failed_logged = False
        self._nvml: Any = None
        self._handle: Any = None
        self._query: Any = None
        try:
            nv = nvml if nvml is not None else _import_pynvml()
            nv.nvmlInit()
            self._handle = nv.nvmlDeviceGetHandleByIndex(device_index)
            self._query = nv.nvmlDeviceGetUtilizationRates  # bound once: hot path
            self._nvml = nv
            self.available = True
        except Exception as exc:  # ImportError or an NVMLError: pressure stays unknown
            self.unavailable_reason = f"{type(exc).__name__}: {exc}"
            logger.warning(
                "NVML unavailable for GPU %d (%s): memory pressure is unknown (NaN)",
                device_index,
                self.unavailable_reason,
            )

    def sample(self, now_ns: int | None = None) -> float:
        """Memory activity in [0, 1], or NaN; cached when called within `min_interval_ns`."""
        if not self.available:
            return UNKNOWN
        if self.min_interval_ns:  # rate limit only when asked: the clock read costs too
            if now_ns is None:
                now_ns = time.monotonic_ns()
            last = self._last_ns
            if last is not None and now_ns - last < self.min_interval_ns:
                return self.last_value
            self._last_ns = now_ns
        try:
            percent = self._query(self._handle).memory
        except Exception as exc:  # NVMLError (GPU lost, driver reset, ...): unknown this time
            if not self._call_failed_logged:
                self._call_failed_logged = True
                logger.warning(
                    "NVML memory-utilisation query failed on GPU %d (%s: %s): pressure unknown",
                    self.device_index,
                    type(exc).__name__,
                    exc,
                )
            self.last_value = UNKNOWN
            return UNKNOWN
        self.nvml_calls += 1
        value = percent * 0.01  # NVML reports an unsigned percentage
        if value > 1.0:
            value = 1.0
        self.last_value = value
        return value

    def close(self) -> None:
        """Shut NVML down (idempotent). NVML reference-counts init/shutdown per process."""
        if self._nvml is not None:
            try:
                self._nvml.nvmlShutdown()
            except Exception:
                logger.debug("nvmlShutdown failed", exc_info=True)
            self._nvml = None
        self.available = False

    def __enter__(self) -> NvmlPressureSampler:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
