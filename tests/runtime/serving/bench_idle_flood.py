"""Benchmark (not a test): can one client starve the probes? `horizonserve serve --preset tiny
--device cpu` with its default connection cap; one client (source 127.0.0.2) holds N idle
connections, reopening each as the server closes it, for D seconds, while the kubelet's
probes and a user's text requests (source 127.0.0.1, a fresh connection each) are sent every
0.5 s. Prints the status codes each saw.

    .venv/bin/python -m tests.runtime.serving.bench_idle_flood [--idle 1100] [--seconds 30]
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import json
import tempfile
import time
from pathlib import Path
from urllib.parse import urlsplit

from tests.runtime.serving.served import start_server

BODY = json.dumps({"priority": 0, "input_tokens": 8, "output_tokens": 2}).encode()


async def _hold(addr: tuple[str, int], until: float, opened: list[int]) -> None:
    """One idle connection from 127.0.0.2, reopened whenever the server closes it."""
    while time.monotonic() < until:
        try:
            reader, writer = await asyncio.open_connection(*addr, local_addr=("127.0.0.2", 0))
        except OSError:
            await asyncio.sleep(0.05)
            continue
        opened[0] += 1
        with contextlib.suppress(TimeoutError, OSError):
            await asyncio.wait_for(reader.read(), max(0.01, until - time.monotonic()))
        writer.close()


async def _ask(addr: tuple[str, int], method: str, path: str, body: bytes | None) -> str:
    head = f"{method} {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
    if body is not None:
        head += f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n"
    try:
        reader, writer = await asyncio.wait_for(
            asyncio.open_connection(*addr, local_addr=("127.0.0.1", 0)), 5
        )
        writer.write((head + "\r\n").encode() + (body or b""))
        line = await asyncio.wait_for(reader.readline(), 5)
        writer.close()
    except (TimeoutError, OSError) as exc:
        return type(exc).__name__
    parts = line.split()
    return parts[1].decode() if len(parts) > 1 else "closed"


async def flood(url: str, idle: int, seconds: float) -> dict[str, collections.Counter[str]]:
    parts = urlsplit(url)
    addr = (parts.hostname or "127.0.0.1", parts.port or 80)
    until = time.monotonic() + seconds
    opened = [0]
    holders = [asyncio.create_task(_hold(addr, until, opened)) for _ in range(idle)]
    await asyncio.sleep(2.0)  # the idle connections are open
    seen: dict[str, collections.Counter[str]] = collections.defaultdict(collections.Counter)
    while time.monotonic() < until - 0.5:
        results = await asyncio.gather(
            _ask(addr, "GET", "/health", None),
            _ask(addr, "GET", "/ready", None),
            _ask(addr, "POST", "/v1/requests", BODY),
        )
        for what, status in zip(("/health", "/ready", "POST /v1/requests"), results, strict=True):
            seen[what][status] += 1
        await asyncio.sleep(0.5)
    await asyncio.gather(*holders, return_exceptions=True)
    seen["idle connections opened"]["count"] = opened[0]
    return seen


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--idle", type=int, default=1100)
    ap.add_argument("--seconds", type=float, default=30.0)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        served = start_server(Path(tmp))
        try:
            seen = asyncio.run(flood(served.url, args.idle, args.seconds))
        finally:
            served.stop()
    print(f"{args.idle} idle connections from 127.0.0.2 for {args.seconds:g} s:")
    for what, counts in seen.items():
        print(f"  {what:<26} {dict(sorted(counts.items()))}")


if __name__ == "__main__":
    main()
