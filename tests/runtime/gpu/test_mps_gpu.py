"""The real MPS control daemon: start, answer a command, stop, clean up."""

from __future__ import annotations

import pytest

from horizonserve.runtime.gpu import MpsDaemon, mps_available

pytestmark = pytest.mark.gpu

if not mps_available():
    pytest.skip("nvidia-cuda-mps-control not installed", allow_module_level=True)


def test_daemon_start_command_stop() -> None:
    with MpsDaemon(timeout_s=30) as mps:
        assert (mps.pipe_dir / "control").exists()
        mps.command("get_server_list")  # no clients yet: empty list, but it must answer
        base = mps.base_dir
    assert base is not None and not base.exists()
    assert not mps.running
