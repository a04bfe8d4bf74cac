"""Start and stop an MPS control daemon for one run (the EDF-MPS / MPS baselines).

The daemon talks to its clients through named pipes in CUDA_MPS_PIPE_DIRECTORY and logs to
CUDA_MPS_LOG_DIRECTORY. `MpsDaemon` points both at a private temp dir, so the run neither
needs root-owned /tmp/nvidia-mps nor collides with another daemon on the host. Every stage
process of the run must get `client_env()` in its environment, otherwise it does not use MPS.

    with MpsDaemon() as mps:
        subprocess.Popen(cmd, env=os.environ | mps.client_env(active_thread_percentage=50))

Where `nvidia-cuda-mps-control` is missing, `start` raises MpsUnavailableError; call
`mps_available()` first to choose a fallback.
"""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

logger = logging.getLogger(__name__)

MPS_CONTROL = "nvidia-cuda-mps-control"
PIPE_DIR_ENV = "CUDA_MPS_PIPE_DIRECTORY"
LOG_DIR_ENV = "CUDA_MPS_LOG_DIRECTORY"
THREAD_PCT_ENV = "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"
_CONTROL_PIPE = "control"  # the daemon's command FIFO inside the pipe dir
_PID_FILE = "nvidia-cuda-mps-control.pid"


class MpsUnavailableError(RuntimeError):
    """The MPS control binary is not installed (or not on PATH)."""


class MpsError(RuntimeError):
    """The MPS control daemon did not start or stop as expected."""


def mps_available(binary: str = MPS_CONTROL) -> bool:
    """True when the MPS control binary can be found."""
    return shutil.which(binary) is not None


class MpsDaemon:
    """An MPS control daemon with private pipe and log dirs; a context manager."""

    def __init__(
        self,
        base_dir: str | os.PathLike[str] | None = None,
        *,
        binary: str = MPS_CONTROL,
        timeout_s: float = 10.0,
    ) -> None:
        self.binary = binary
        self.timeout_s = timeout_s
        self._own_dir = base_dir is None
        self.base_dir = Path(base_dir) if base_dir is not None else None
        self.running = False
        self.start_seconds: float | None = None
        self.stop_seconds: float | None = None

    @property
    def pipe_dir(self) -> Path:
        return self._base() / "pipe"

    @property
    def log_dir(self) -> Path:
        return self._base() / "log"

    def _base(self) -> Path:
        if self.base_dir is None:
            self.base_dir = Path(tempfile.mkdtemp(prefix="horizonserve-mps-"))
        return self.base_dir

    def client_env(self, active_thread_percentage: int | None = None) -> dict[str, str]:
        """Environment entries a stage process needs to run as a client of this daemon.

        `active_thread_percentage` caps that client's share of SMs (MPS's own SM cap).
        """
        if active_thread_percentage is not None and not 1 <= active_thread_percentage <= 100:
            raise ValueError(f"active_thread_percentage {active_thread_percentage} not in 1..100")
        env = {PIPE_DIR_ENV: str(self.pipe_dir), LOG_DIR_ENV: str(self.log_dir)}
        if active_thread_percentage is not None:
            env[THREAD_PCT_ENV] = str(active_thread_percentage)
        return env

    def _run(self, args: list[str], stdin: str | None = None) -> subprocess.CompletedProcess[str]:
        exe = shutil.which(self.binary)
        if exe is None:
            raise MpsUnavailableError(
                f"{self.binary} not found on PATH: MPS needs the NVIDIA driver's MPS tools"
            )
        return subprocess.run(
            [exe, *args],
            input=stdin,
            env=os.environ | self.client_env(),
            capture_output=True,
            text=True,
            timeout=self.timeout_s,
            check=False,
        )

    def start(self) -> None:
        """Start the daemon (`-d`) and wait until its control pipe exists."""
        if self.running:
            return
        t0 = time.perf_counter()
        try:
            self.pipe_dir.mkdir(parents=True, exist_ok=True)
            self.log_dir.mkdir(parents=True, exist_ok=True)
            proc = self._run(["-d"])
            if proc.returncode != 0:
                raise MpsError(
                    f"{self.binary} -d exited {proc.returncode}: "
                    f"{(proc.stderr or proc.stdout).strip()} {self._log_tail()}"
                )
            if not self._wait(lambda: (self.pipe_dir / _CONTROL_PIPE).exists()):
                raise MpsError(f"no MPS control pipe in {self.pipe_dir} {self._log_tail()}")
        except BaseException:
            self._cleanup()
            raise
        self.running = True
        self.start_seconds = time.perf_counter() - t0

    def command(self, text: str) -> str:
        """Send one control command (e.g. 'get_server_list') and return its reply."""
        proc = self._run([], stdin=text + "\n")
        if proc.returncode != 0:
            raise MpsError(f"MPS command {text!r} exited {proc.returncode}: {proc.stderr.strip()}")
        return proc.stdout.strip()

    def stop(self) -> None:
        """`quit` the daemon, wait for it to go, remove the temp dir it used (if ours)."""
        if not self.running:
            self._cleanup()
            return
        t0 = time.perf_counter()
        pid = self._daemon_pid()
        proc = self._run([], stdin="quit\n")
        if proc.returncode != 0:
            logger.warning("MPS quit exited %d: %s", proc.returncode, proc.stderr.strip())
        if pid is not None:
            gone = self._wait(lambda: not _alive(pid))
        else:
            gone = self._wait(lambda: not (self.pipe_dir / _CONTROL_PIPE).exists(), soft=True)
        if not gone:
            logger.warning("MPS control daemon still running %.0f s after quit", self.timeout_s)
        self.running = False
        self.stop_seconds = time.perf_counter() - t0
        self._cleanup()

    def _daemon_pid(self) -> int | None:
        try:
            return int((self.pipe_dir / _PID_FILE).read_text().strip())
        except (OSError, ValueError):
            return None

    def _wait(self, done: Callable[[], bool], soft: bool = False) -> bool:
        """Poll `done()` until true or the timeout (1 s when `soft`: best-effort checks)."""
        deadline = time.monotonic() + (1.0 if soft else self.timeout_s)
        while not done():
            if time.monotonic() > deadline:
                return False
            time.sleep(0.01)
        return True

    def _log_tail(self) -> str:
        try:
            text = (self.log_dir / "control.log").read_text()
        except OSError:
            return ""
        return f"(control.log: {text.strip()[-400:]})"

    def _cleanup(self) -> None:
        if self._own_dir and self.base_dir is not None:
            shutil.rmtree(self.base_dir, ignore_errors=True)
            self.base_dir = None

    def __enter__(self) -> MpsDaemon:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def start(
    base_dir: str | os.PathLike[str] | None = None,
    *,
    binary: str = MPS_CONTROL,
    timeout_s: float = 10.0,
) -> MpsDaemon:
    """Start a daemon and return it; the caller must `stop()` it (or use `MpsDaemon` in with)."""
    daemon = MpsDaemon(base_dir, binary=binary, timeout_s=timeout_s)
    daemon.start()
    return daemon


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
