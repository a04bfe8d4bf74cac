"""SM ladder logic, fallback and switching order, without a GPU (fakes stand in for torch)."""

from __future__ import annotations

import logging
import sys
from types import SimpleNamespace
from typing import Any

import pytest

from horizonserve.runtime.gpu import SmLadderContexts, ladder_variant
from horizonserve.runtime.gpu import _torch_green as tg

# -- fallback (no torch / no CUDA) -----------------------------------------------------------


def _warnings(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.levelno == logging.WARNING]


def _assert_uncapped(ladder: SmLadderContexts, caplog: pytest.LogCaptureFixture) -> None:
    assert not ladder.available and ladder.mode == "none"
    assert ladder.unavailable_reason
    warnings = _warnings(caplog)
    assert len(warnings) == 1 and "\n" not in warnings[0].getMessage()
    assert "Green Contexts unavailable" in warnings[0].getMessage()
    ladder.activate(1)  # still tracks the level so callers behave the same
    ladder.activate(1)
    ladder.activate_sms(48)
    assert ladder.current == 0 and ladder.switches == 2
    ladder.close()
    assert len(_warnings(caplog)) == 1


def test_fallback_without_torch(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setitem(sys.modules, "torch", None)  # import torch -> ImportError
    ladder = SmLadderContexts([48, 64, 80])
    assert ladder.unavailable_reason == "torch is not installed"
    assert ladder.granted_sms == (None, None, None)
    _assert_uncapped(ladder, caplog)


def test_fallback_without_cuda(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    fake_torch = SimpleNamespace(cuda=SimpleNamespace(is_available=lambda: False))
    monkeypatch.setitem(sys.modules, "torch", fake_torch)
    ladder = SmLadderContexts([48, 64, 80])
    assert ladder.unavailable_reason == "torch sees no CUDA device"
    _assert_uncapped(ladder, caplog)


def test_real_backend_here_falls_back_when_no_gpu(caplog: pytest.LogCaptureFixture) -> None:
    try:
        import torch

        if torch.cuda.is_available():
            pytest.skip("a GPU is present: covered by the gpu tests")
    except ImportError:
        pass
    _assert_uncapped(SmLadderContexts([48, 64, 80]), caplog)


def test_rejects_bad_arguments() -> None:
    with pytest.raises(ValueError):
        SmLadderContexts([])
    with pytest.raises(ValueError):
        SmLadderContexts([0, 64])
    with pytest.raises(ValueError):
        SmLadderContexts([64], mode="mps")
    ladder = SmLadderContexts([64], backend_factory=_FakeBackend)
    with pytest.raises(IndexError):
        ladder.activate(1)
    with pytest.raises(ValueError, match="not a level"):
        ladder.activate_sms(70)


# -- switching logic against a fake backend --------------------------------------------------


class _FakeLevel:
    def __init__(self, log: list[str], sms: int, granted: int | None) -> None:
        self.log, self.sms, self.granted_sms = log, sms, granted

    def switch_from(self, prev: Any) -> None:
        self.log.append(f"{prev.sms if prev else '-'}->{self.sms}")

    def leave(self) -> None:
        self.log.append(f"leave {self.sms}")

    def close(self) -> None:
        self.log.append(f"close {self.sms}")


class _FakeBackend:
    def __init__(self, device_id: int, mode: str, fail_at: int | None = None) -> None:
        self.mode = "stream" if mode == "auto" else mode
        self.total_sms = 132
        self.log: list[str] = []
        self.fail_at = fail_at

    def make_level(self, num_sms: int) -> _FakeLevel:
        if num_sms == self.fail_at:
            raise RuntimeError("CUDA_ERROR_INVALID_RESOURCE_CONFIGURATION")
        # Hopper-like granularity: round up to a multiple of 8, capped at the device.
        return _FakeLevel(self.log, num_sms, min(-(-num_sms // 8) * 8, self.total_sms))


def test_switching_order_and_noop() -> None:
    backends: list[_FakeBackend] = []

    def factory(device_id: int, mode: str) -> _FakeBackend:
        backends.append(_FakeBackend(device_id, mode))
        return backends[-1]

    ladder = SmLadderContexts([20, 64, 132], device_id=0, backend_factory=factory)
    log = backends[0].log
    assert ladder.available and ladder.mode == "stream" and ladder.total_sms == 132
    assert ladder.granted_sms == (24, 64, 132)
    ladder.activate(0)
    ladder.activate(0)  # no-op
    ladder.activate(2)
    ladder.activate_sms(64)
    ladder.deactivate()
    ladder.activate(1)
    assert log == ["-->20", "20->132", "132->64", "leave 64", "-->64"]
    assert ladder.switches == 4 and ladder.current == 1
    ladder.close()
    assert log[-4:] == ["leave 64", "close 132", "close 64", "close 20"]
    assert ladder.alloc_seconds >= 0


def test_allocation_failure_releases_and_falls_back(caplog: pytest.LogCaptureFixture) -> None:
    backends: list[_FakeBackend] = []

    def factory(device_id: int, mode: str) -> _FakeBackend:
        backends.append(_FakeBackend(device_id, mode, fail_at=80))
        return backends[-1]

    ladder = SmLadderContexts([48, 64, 80], backend_factory=factory)
    assert backends[0].log == ["close 64", "close 48"]  # what was built is freed
    assert "INVALID_RESOURCE" in (ladder.unavailable_reason or "")
    assert ladder.total_sms == 132 and ladder.granted_sms == (132, 132, 132)
    _assert_uncapped(ladder, caplog)


# -- torch level objects against a fake torch ------------------------------------------------


class _FakeStream:
    def __init__(self, name: str, log: list[str]) -> None:
        self.name, self.log = name, log

    def wait_event(self, ev: _FakeEvent) -> None:
        self.log.append(f"{self.name} waits {ev.recorded_on}")

    def synchronize(self) -> None:
        self.log.append(f"sync {self.name}")


class _FakeEvent:
    recorded_on = ""

    def record(self, stream: _FakeStream) -> None:
        self.recorded_on = stream.name


def _fake_torch(log: list[str]) -> Any:
    return SimpleNamespace(
        cuda=SimpleNamespace(Event=_FakeEvent, set_stream=lambda s: log.append(f"set {s.name}"))
    )


def test_stream_levels_keep_work_ordered() -> None:
    log: list[str] = []
    torch = _fake_torch(log)
    base = tg._StreamLevel(torch, _FakeStream("base", log), None, 132)
    full = tg._StreamLevel(torch, base.stream, base, 132)
    a = tg._StreamLevel(torch, _FakeStream("a", log), base, 48)
    b = tg._StreamLevel(torch, _FakeStream("b", log), base, 64)
    a.switch_from(None)  # from the stream that was current at construction
    b.switch_from(a)
    full.switch_from(b)
    full.leave()  # already on base: nothing to do
    a.switch_from(full)
    a.leave()
    assert log == [
        "set a",
        "a waits base",
        "set b",
        "b waits a",
        "set base",
        "base waits b",
        "set a",
        "a waits base",
        "set base",
        "base waits a",
    ]


def test_context_levels_push_and_pop_balanced() -> None:
    stack: list[str] = []

    class Ctx:
        def __init__(self, name: str) -> None:
            self.name = name

        def set_context(self) -> None:
            stack.append(self.name)

        def pop_context(self) -> None:
            assert stack.pop() == self.name

    levels = [tg._ContextLevel(Ctx("48"), 48), tg._ContextLevel(Ctx("64"), 64)]
    levels.append(tg._ContextLevel(None, 132))  # uncapped: nothing pushed

    ladder = SmLadderContexts([48, 64, 132], backend_factory=lambda d, m: _ListBackend(levels))
    ladder.activate(0)
    assert stack == ["48"]
    ladder.activate(1)
    assert stack == ["64"]
    ladder.activate(2)
    assert stack == []
    ladder.activate(0)
    ladder.close()
    assert stack == []


class _ListBackend:
    mode = "context"
    total_sms = 132

    def __init__(self, levels: list[Any]) -> None:
        self._levels = iter(levels)

    def make_level(self, num_sms: int) -> Any:
        return next(self._levels)


@pytest.mark.parametrize("variant", ["stream", "context", "stream-driver"])
def test_ladder_variants_build_and_degrade_without_cuda(
    variant: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake_torch = SimpleNamespace(cuda=SimpleNamespace(is_available=lambda: False))
    monkeypatch.setitem(sys.modules, "torch", fake_torch)
    ladder = ladder_variant([48, 64], variant)
    assert ladder.levels == (48, 64)
    assert not ladder.available and ladder.unavailable_reason == "torch sees no CUDA device"


def test_ladder_variant_names_the_choices() -> None:
    with pytest.raises(ValueError, match="stream-driver"):
        ladder_variant([48], "driver")
