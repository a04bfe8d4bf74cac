"""NVML memory-activity sampler on a real GPU."""

from __future__ import annotations

import time

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("pynvml")
if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU", allow_module_level=True)

from horizonserve.runtime.gpu import NvmlPressureSampler  # noqa: E402

pytestmark = pytest.mark.gpu


def test_sampler_sees_a_copy_loop() -> None:
    with NvmlPressureSampler(0) as s:
        assert s.available, s.unavailable_reason
        idle = s.sample()
        assert 0.0 <= idle <= 1.0
        src = torch.empty(2**30, dtype=torch.uint8, device="cuda")
        dst = torch.empty_like(src)
        busy = 0.0
        deadline = time.monotonic() + 3.0
        while time.monotonic() < deadline and busy < 0.3:
            for _ in range(50):
                dst.copy_(src)
            torch.cuda.synchronize()
            busy = max(busy, s.sample())
        assert busy >= 0.3, (idle, busy)
