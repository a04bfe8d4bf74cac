"""Benchmark (not a test): text-request latency on one kept-alive connection against a fresh
connection per request, on `horizonserve serve --preset tiny --device cpu` (loopback), and the
same for the sidecar's /healthz.

    .venv/bin/python -m tests.runtime.serving.bench_keepalive [--requests 60] [--no-uvloop]

uvicorn runs on uvloop when it is installed (vLLM brings it), and uvloop sets TCP_NODELAY on
every TCP socket itself; a plain `pip install horizonserve` has no uvloop, so uvicorn runs on
asyncio, which sets it only on sockets built with IPPROTO_TCP. `--no-uvloop` hides uvloop
from both servers to measure that case.

A raw socket client sends each request in one write and reads the response by its
Content-Length, so the figures are the servers' (no client-side Nagle delay). Without
TCP_NODELAY on the server a kept-alive response waits for the client's delayed ACK (~40 ms on
Linux) before its body leaves; a fresh connection does not, the first segment going at once.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import sys
import tempfile
import time
from pathlib import Path
from urllib.parse import urlsplit

from tests.runtime.serving.served import start_server

BODY = json.dumps({"priority": 0, "input_tokens": 8, "output_tokens": 2}).encode()


def _request(path: str, host: str, body: bytes | None) -> bytes:
    method = "POST" if body is not None else "GET"
    head = f"{method} {path} HTTP/1.1\r\nHost: {host}\r\n"
    if body is not None:
        head += f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n"
    return (head + "\r\n").encode() + (body or b"")


def _read_response(sock: socket.socket) -> int:
    buf = b""
    while b"\r\n\r\n" not in buf:
        chunk = sock.recv(65536)
        if not chunk:
            raise ConnectionError("closed before the response head")
        buf += chunk
    head, _, rest = buf.partition(b"\r\n\r\n")
    lines = head.split(b"\r\n")
    status = int(lines[0].split()[1])
    length = 0
    for line in lines[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            length = int(value)
    while len(rest) < length:
        chunk = sock.recv(65536)
        if not chunk:
            raise ConnectionError("closed mid-body")
        rest += chunk
    return status


def measure(url: str, path: str, body: bytes | None, n: int) -> tuple[list[float], list[float]]:
    """(kept-alive latencies, fresh-connection latencies) in seconds."""
    parts = urlsplit(url)
    addr = (parts.hostname or "127.0.0.1", parts.port or 80)
    raw = _request(path, parts.netloc, body)
    kept: list[float] = []
    with socket.create_connection(addr) as sock:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.sendall(raw)
        _read_response(sock)  # warm the connection
        for _ in range(n):
            t0 = time.perf_counter()
            sock.sendall(raw)
            status = _read_response(sock)
            kept.append(time.perf_counter() - t0)
            assert status == 200, status
    fresh: list[float] = []
    for _ in range(n):
        t0 = time.perf_counter()
        with socket.create_connection(addr) as sock:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            sock.sendall(raw)
            status = _read_response(sock)
        fresh.append(time.perf_counter() - t0)
        assert status == 200, status
    return kept, fresh


def _line(what: str, kept: list[float], fresh: list[float]) -> str:
    def ms(v: list[float], q: int) -> float:
        return 1e3 * statistics.quantiles(v, n=100)[q - 1]

    return (
        f"{what:<28} keep-alive p50 {ms(kept, 50):7.1f} ms  p90 {ms(kept, 90):7.1f} ms | "
        f"fresh p50 {ms(fresh, 50):7.1f} ms  p90 {ms(fresh, 90):7.1f} ms  (n={len(kept)})"
    )


def _sidecar(tmp: Path) -> tuple[object, str]:
    from horizonserve.runtime import config as cfg
    from horizonserve.runtime.engine.reference.defaults import reference_config
    from horizonserve.runtime.sidecar import Sidecar

    sc = Sidecar(
        serving=reference_config("tiny"),
        node="bench",
        mode=cfg.CalibrationMode.SKIP,
        artifact_dir=tmp / "art",
        stats_file=tmp / "none.json",
        publisher=None,
        gpu=None,
    )
    http = sc.serve_http(0)
    return http, f"http://127.0.0.1:{http.port}"  # type: ignore[attr-defined]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=60)
    ap.add_argument("--no-uvloop", action="store_true", help="serve on asyncio's loop")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        env = None
        if args.no_uvloop:
            shim = Path(tmp) / "no-uvloop" / "uvloop"
            shim.mkdir(parents=True)
            (shim / "__init__.py").write_text("raise ImportError('hidden by the benchmark')\n")
            path = os.pathsep.join(p for p in (str(shim.parent), os.environ.get("PYTHONPATH")) if p)
            env = {"PYTHONPATH": path}
            sys.modules["uvloop"] = None  # type: ignore[assignment]  # the in-process sidecar
        print(f"loop: {'asyncio' if args.no_uvloop else 'uvloop if installed'}", flush=True)
        served = start_server(Path(tmp), env=env)
        try:
            kept, fresh = measure(served.url, "/v1/requests", BODY, args.requests)
            print(_line("serve POST /v1/requests", kept, fresh), flush=True)
            kept, fresh = measure(served.url, "/health", None, args.requests)
            print(_line("serve GET /health", kept, fresh), flush=True)
        finally:
            served.stop()
        http, url = _sidecar(Path(tmp))
        try:
            kept, fresh = measure(url, "/healthz", None, args.requests)
            print(_line("sidecar GET /healthz", kept, fresh), flush=True)
        finally:
            http.shutdown()  # type: ignore[attr-defined]


if __name__ == "__main__":
    main()
