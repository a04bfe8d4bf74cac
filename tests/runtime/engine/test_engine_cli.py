"""`horizonserve serve` as a user runs it: a real process, HTTP, stats file, SIGTERM."""

from __future__ import annotations

import json
import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import pytest

pytest.importorskip("torch")


def _children(pid: int) -> list[int]:
    out = []
    for status in Path("/proc").glob("[0-9]*/status"):
        try:
            text = status.read_text()
        except OSError:
            continue
        m = re.search(r"^PPid:\s+(\d+)", text, re.M)
        if m and int(m.group(1)) == pid and "zombie" not in text:
            out.append(int(status.parent.name))
    return out


def _alive(pid: int) -> bool:
    try:
        text = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False
    return "zombie" not in text


def test_serve_answers_http_writes_stats_and_stops_on_sigterm(tmp_path: Path) -> None:
    stats = tmp_path / "node-stats.json"
    env = {**os.environ, "HORIZONSERVE_STATS_FILE": str(stats), "PYTHONUNBUFFERED": "1"}
    cmd = [sys.executable, "-m", "horizonserve.runtime.cli", "serve", "--preset", "tiny"]
    cmd += ["--device", "cpu", "--port", "0", "--no-warmup", "--stats-interval", "0.2"]
    proc = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env
    )
    lines: queue.Queue[str] = queue.Queue()
    threading.Thread(target=lambda: [lines.put(x) for x in proc.stdout], daemon=True).start()
    try:
        url = None
        deadline = time.monotonic() + 90
        log: list[str] = []
        while url is None and time.monotonic() < deadline:
            try:
                line = lines.get(timeout=1)
            except queue.Empty:
                assert proc.poll() is None, "".join(log)
                continue
            log.append(line)
            m = re.search(r"listening on (http://\S+)", line)
            url = m.group(1) if m else None
        assert url, "".join(log)
        stages = _children(proc.pid)
        assert len(stages) >= 4  # shared, speech, code2wav, image (+ the resource tracker)

        body = json.dumps({"priority": 10, "input_tokens": 12, "output_tokens": 3}).encode()
        req = urllib.request.Request(url + "/v1/requests", data=body, method="POST")
        with urllib.request.urlopen(req, timeout=60) as resp:
            out = json.loads(resp.read())
        assert out["metric"] == "ttfo" and out["first_response_s"] > 0

        deadline = time.monotonic() + 10
        doc = None
        while time.monotonic() < deadline:
            if stats.exists():
                doc = json.loads(stats.read_text())
                if any(c["requests"] for c in doc["classes"]):
                    break
            time.sleep(0.1)
        assert doc is not None
        speech = next(c for c in doc["classes"] if c["name"] == "speech")
        assert speech["requests"] == 1 and speech["target_s"] > 0

        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
        deadline = time.monotonic() + 5
        while any(_alive(p) for p in stages) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not any(_alive(p) for p in stages), "a stage process outlived serve"
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
