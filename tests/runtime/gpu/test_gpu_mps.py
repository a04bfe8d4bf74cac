"""MPS daemon control against a stand-in `nvidia-cuda-mps-control` script."""

from __future__ import annotations

import os
import stat
import sys
from pathlib import Path

import pytest

from horizonserve.runtime.gpu import MpsDaemon, MpsError, MpsUnavailableError, mps_available
from horizonserve.runtime.gpu import mps as mps_mod

# Mimics the real tool: `-d` creates the control FIFO in $CUDA_MPS_PIPE_DIRECTORY and returns;
# without arguments it reads commands from stdin; `quit` makes the daemon go away.
_FAKE = """#!{python}
import os, sys
pipe = os.environ["CUDA_MPS_PIPE_DIRECTORY"]
log = os.environ["CUDA_MPS_LOG_DIRECTORY"]
control = os.path.join(pipe, "control")
if sys.argv[1:] == ["-d"]:
    if os.environ.get("FAKE_MPS_FAIL"):
        print("An instance of this daemon is already running", file=sys.stderr)
        sys.exit(1)
    os.mkfifo(control)
    with open(os.path.join(log, "control.log"), "a") as f:
        f.write("daemon started\\n")
    sys.exit(0)
cmd = sys.stdin.read().strip()
if not os.path.exists(control):
    sys.exit(1)
if cmd == "quit":
    os.unlink(control)
elif cmd == "get_server_list":
    print("")
else:
    print(f"echo {{cmd}}")
"""


@pytest.fixture
def fake_mps(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    bindir = tmp_path / "bin"
    bindir.mkdir()
    exe = bindir / "nvidia-cuda-mps-control"
    exe.write_text(_FAKE.format(python=sys.executable))
    exe.chmod(exe.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{bindir}{os.pathsep}{os.environ['PATH']}")
    return str(exe)


def test_missing_binary_raises_clearly() -> None:
    assert not mps_available("no-such-mps-control")
    daemon = MpsDaemon(binary="no-such-mps-control")
    with pytest.raises(MpsUnavailableError, match="not found"), daemon:
        pass
    assert daemon.base_dir is None  # temp dir removed again


def test_start_stop_with_private_dirs(fake_mps: str) -> None:
    assert mps_available()
    with MpsDaemon() as mps:
        base = mps.base_dir
        assert base is not None and (mps.pipe_dir / "control").exists()
        env = mps.client_env(active_thread_percentage=40)
        assert env == {
            "CUDA_MPS_PIPE_DIRECTORY": str(mps.pipe_dir),
            "CUDA_MPS_LOG_DIRECTORY": str(mps.log_dir),
            "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "40",
        }
        assert mps.command("hello") == "echo hello"
        assert mps.running and mps.start_seconds is not None
    assert not mps.running and not base.exists()
    assert mps.stop_seconds is not None


def test_start_helper_and_given_dir_is_kept(fake_mps: str, tmp_path: Path) -> None:
    daemon = mps_mod.start(tmp_path / "mps")
    assert (tmp_path / "mps" / "pipe" / "control").exists()
    daemon.stop()
    daemon.stop()  # idempotent
    assert (tmp_path / "mps").exists() and not (tmp_path / "mps" / "pipe" / "control").exists()


def test_start_failure_reports_and_cleans_up(
    fake_mps: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FAKE_MPS_FAIL", "1")
    daemon = MpsDaemon()
    with pytest.raises(MpsError, match="already running"):
        daemon.start()
    assert not daemon.running and daemon.base_dir is None


def test_thread_percentage_validated() -> None:
    with pytest.raises(ValueError):
        MpsDaemon().client_env(active_thread_percentage=0)
