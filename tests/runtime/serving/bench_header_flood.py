"""Benchmark (not a test): header floods against `horizonserve serve --preset tiny --device
cpu`. S senders (source 127.0.0.2) each send requests with N header fields (about 12 bytes
each) back to back for D seconds, while a user (127.0.0.1) sends a text request every 0.2 s on
a fresh connection. Prints the user's latency without and with the flood, what the senders
got back, and the front process's resident memory.

    .venv/bin/python -m tests.runtime.serving.bench_header_flood [--senders 40]
        [--headers 10000] [--seconds 20]
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import statistics
import tempfile
import time
from pathlib import Path
from urllib.parse import urlsplit

from tests.runtime.serving.served import start_server

BODY = json.dumps({"priority": 0, "input_tokens": 8, "output_tokens": 2}).encode()


def _rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


async def _user(addr: tuple[str, int], until: float, out: list[float]) -> None:
    head = (
        f"POST /v1/requests HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(BODY)}\r\n\r\n"
    ).encode()
    while time.monotonic() < until:
        t0 = time.perf_counter()
        try:
            reader, writer = await asyncio.open_connection(*addr, local_addr=("127.0.0.1", 0))
            writer.write(head + BODY)
            await asyncio.wait_for(reader.read(), 30)
            writer.close()
            out.append(time.perf_counter() - t0)
        except (OSError, TimeoutError):
            out.append(float("inf"))
        await asyncio.sleep(0.2)


async def _sender(
    addr: tuple[str, int], request: bytes, until: float, seen: collections.Counter[str]
) -> None:
    while time.monotonic() < until:
        try:
            reader, writer = await asyncio.open_connection(*addr, local_addr=("127.0.0.2", 0))
            writer.write(request)
            await writer.drain()
            line = await asyncio.wait_for(reader.readline(), 30)
            parts = line.split()
            seen[parts[1].decode() if len(parts) > 1 else "closed"] += 1
            writer.close()
        except (OSError, TimeoutError) as exc:
            seen[type(exc).__name__] += 1
            await asyncio.sleep(0.05)


async def run(url: str, pid: int, senders: int, headers: int, seconds: float) -> None:
    parts = urlsplit(url)
    addr = (parts.hostname or "127.0.0.1", parts.port or 80)
    fields = b"".join(b"X-F%d: v\r\n" % i for i in range(headers))
    request = (
        b"POST /v1/requests HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n" % len(BODY)
        + fields
        + b"\r\n"
        + BODY
    )
    quiet: list[float] = []
    await _user(addr, time.monotonic() + 5, quiet)
    rss0 = _rss_mb(pid)
    until = time.monotonic() + seconds
    seen: collections.Counter[str] = collections.Counter()
    loud: list[float] = []
    await asyncio.gather(
        _user(addr, until, loud), *(_sender(addr, request, until, seen) for _ in range(senders))
    )
    rss1 = _rss_mb(pid)
    await asyncio.sleep(5)
    rss2 = _rss_mb(pid)

    def p50(v: list[float]) -> str:
        return f"{1e3 * statistics.median(v):.1f} ms" if v else "-"

    print(f"{senders} senders x {len(request) / 1024:.0f} KB requests ({headers} headers):")
    print(f"  text p50 quiet {p50(quiet)} (n={len(quiet)}), flooded {p50(loud)} (n={len(loud)})")
    print(f"  senders got {dict(seen)}")
    print(f"  front RSS {rss0:.0f} MB -> {rss1:.0f} MB during -> {rss2:.0f} MB 5 s after")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--senders", type=int, default=40)
    ap.add_argument("--headers", type=int, default=10_000)
    ap.add_argument("--seconds", type=float, default=20.0)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        served = start_server(Path(tmp))
        try:
            asyncio.run(run(served.url, served.proc.pid, args.senders, args.headers, args.seconds))
        finally:
            served.stop()


if __name__ == "__main__":
    main()
