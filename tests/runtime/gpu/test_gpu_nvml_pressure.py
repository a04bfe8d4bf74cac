"""NVML pressure sampler against a fake pynvml: scaling, rate limiting, degradation."""

from __future__ import annotations

import logging
import math
import sys
from types import SimpleNamespace

import pytest

from horizonserve.runtime.gpu import NvmlPressureSampler


class FakeNvml:
    def __init__(self, fail_init: bool = False) -> None:
        self.fail_init = fail_init
        self.memory = 37
        self.fail_calls = 0
        self.calls = 0
        self.shutdowns = 0

    def nvmlInit(self) -> None:
        if self.fail_init:
            raise RuntimeError("NVML Shared Library Not Found")

    def nvmlDeviceGetHandleByIndex(self, index: int) -> str:
        return f"handle{index}"

    def nvmlDeviceGetUtilizationRates(self, handle: str) -> SimpleNamespace:
        assert handle == "handle0"
        self.calls += 1
        if self.fail_calls:
            self.fail_calls -= 1
            raise RuntimeError("GPU is lost")
        return SimpleNamespace(gpu=99, memory=self.memory)

    def nvmlShutdown(self) -> None:
        self.shutdowns += 1


def _warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]


def test_fraction_of_memory_activity() -> None:
    nv = FakeNvml()
    s = NvmlPressureSampler(nvml=nv)  # type: ignore[arg-type]
    assert s.available
    assert s.sample(now_ns=1) == pytest.approx(0.37)
    nv.memory = 140  # never outside [0, 1]
    assert s.sample(now_ns=2) == 1.0
    nv.memory = 0
    assert s.sample(now_ns=3) == 0.0
    assert s.nvml_calls == 3


def test_rate_limit_returns_cached_value() -> None:
    nv = FakeNvml()
    s = NvmlPressureSampler(min_interval_ns=100, nvml=nv)  # type: ignore[arg-type]
    assert s.sample(now_ns=1000) == pytest.approx(0.37)
    nv.memory = 80
    assert s.sample(now_ns=1050) == pytest.approx(0.37)  # cached: NVML not asked
    assert nv.calls == 1
    assert s.sample(now_ns=1100) == pytest.approx(0.80)
    assert nv.calls == 2 and s.last_value == pytest.approx(0.80)
    assert 0.0 <= s.sample() <= 1.0  # default clock: monotonic_ns, far past the interval


def test_init_failure_is_unknown_with_one_line(caplog: pytest.LogCaptureFixture) -> None:
    s = NvmlPressureSampler(nvml=FakeNvml(fail_init=True))  # type: ignore[arg-type]
    assert not s.available and "Not Found" in (s.unavailable_reason or "")
    assert math.isnan(s.sample(now_ns=1)) and math.isnan(s.sample(now_ns=2))
    assert len(_warnings(caplog)) == 1


def test_missing_pynvml(monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", None)
    s = NvmlPressureSampler()
    assert not s.available and math.isnan(s.sample())
    assert len(_warnings(caplog)) == 1 and "pynvml" in _warnings(caplog)[0]


def test_call_failure_degrades_then_recovers(caplog: pytest.LogCaptureFixture) -> None:
    nv = FakeNvml()
    nv.fail_calls = 3
    s = NvmlPressureSampler(nvml=nv)  # type: ignore[arg-type]
    assert all(math.isnan(s.sample(now_ns=t)) for t in (1, 2, 3))
    assert len(_warnings(caplog)) == 1  # logged once, not per step
    assert s.sample(now_ns=4) == pytest.approx(0.37)


def test_close_shuts_down_once() -> None:
    nv = FakeNvml()
    with NvmlPressureSampler(nvml=nv) as s:  # type: ignore[arg-type]
        s.sample(now_ns=1)
    s.close()
    assert nv.shutdowns == 1 and math.isnan(s.sample(now_ns=5))
