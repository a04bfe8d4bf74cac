"""`horizonserve serve` as a subprocess for the serving suites (tiny preset, CPU).

Each suite starts its own server with a private shared-memory directory, so a test can check
that nothing is left behind in it, and finds the stage processes through /healthz.
"""

from __future__ import annotations

import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx


@dataclass
class Served:
    proc: subprocess.Popen[str]
    url: str
    shm: Path
    log: list[str] = field(default_factory=list)

    def client(self, **kw: Any) -> httpx.Client:
        return httpx.Client(base_url=self.url, timeout=kw.pop("timeout", 60.0), **kw)

    def healthz(self) -> dict[str, Any]:
        return httpx.get(self.url + "/healthz", timeout=10).json()

    def stage_pid(self, stage: str) -> int:
        return int(self.healthz()["stages"][stage]["pid"])

    def alive(self) -> bool:
        if self.proc.poll() is not None:
            return False
        return httpx.get(self.url + "/health", timeout=10).status_code == 200

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                return self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
                return -9
        return int(self.proc.returncode)


def start_server(
    tmp: Path, *extra: str, env: dict[str, str] | None = None, warmup: bool = False
) -> Served:
    shm = tmp / "shm"
    shm.mkdir(parents=True, exist_ok=True)
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("HORIZONSERVE_API_KEY")}
    full_env.update(
        HORIZONSERVE_SHM_DIR=str(shm),
        HORIZONSERVE_STATS_FILE=str(tmp / "node-stats.json"),
        PYTHONUNBUFFERED="1",
    )
    full_env.update(env or {})
    cmd = [sys.executable, "-m", "horizonserve.runtime.cli", "serve", "--device", "cpu"]
    cmd += ["--preset", "tiny", "--port", "0", *([] if warmup else ["--no-warmup"]), *extra]
    proc = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=full_env
    )
    lines: queue.Queue[str] = queue.Queue()
    log: list[str] = []

    def read() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            log.append(line)
            lines.put(line)

    threading.Thread(target=read, daemon=True).start()
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        try:
            line = lines.get(timeout=1)
        except queue.Empty:
            if proc.poll() is not None:
                break
            continue
        m = re.search(r"listening on (http://\S+)", line)
        if m:
            return Served(proc, m.group(1), shm, log)
    proc.kill()
    raise RuntimeError("serve did not start:\n" + "".join(log))


def pid_alive(pid: int) -> bool:
    try:
        text = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False
    return "zombie" not in text
