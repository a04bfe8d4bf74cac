"""On a GPU: the supervisor restarts a killed or stopped downstream stage whose Green Context
ladder and CUDA graphs were set up at start, and the restarted stage serves again while the
other classes keep being served (the CPU suites cover the same on CPU)."""

from __future__ import annotations

import os
import signal
import time

import pytest

torch = pytest.importorskip("torch")

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs an NVIDIA GPU"),
]


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGSTOP])
def test_downstream_stage_restarts_on_the_gpu(sig: signal.Signals) -> None:
    from horizonserve.runtime.engine.reference import PipelineOptions, RequestSpec
    from horizonserve.runtime.engine.reference.pipeline import (
        Pipeline,
        StageUnavailableError,
    )

    options = PipelineOptions(
        preset="tiny", device="cuda:0", policy="horizon", supervise=True, hang_timeout_s=2.0
    )
    with Pipeline(options) as p:
        old = p.health()["stages"]["image"]["pid"]
        cap_before = p.stage_info["image"].get("sm_cap")
        t0 = time.monotonic()
        os.kill(old, sig)
        while p.health()["stages"]["image"]["state"] == "running":
            assert time.monotonic() - t0 < 5, "not detected"
            time.sleep(0.05)
        with pytest.raises(StageUnavailableError):
            p.submit(RequestSpec("img-down", priority=20, images=1))
        text = p.submit(RequestSpec("txt-during", priority=0, output_tokens=3))
        assert text.wait_done(60) and text.record.error is None
        while p.health()["stages"]["image"]["state"] != "running":
            assert time.monotonic() - t0 < 300, "not restarted"
            time.sleep(0.1)
        assert p.health()["stages"]["image"]["pid"] != old
        assert p.stage_info["image"].get("sm_cap") == cap_before  # its SM ladder again
        img = p.submit(RequestSpec("img-after", priority=20, images=1, downstream_tokens=4))
        assert img.wait_done(120) and img.record.error is None
