"""Bounded load: 200 concurrent clients on loopback, every request on a fresh connection.

Asserts zero connection resets or other transport errors and an answer to every request;
prints throughput and latency percentiles as a benchmark (no timed assertion: the figures
depend on the machine).
"""

from __future__ import annotations

import asyncio
import statistics
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.runtime.serving.served import Served, start_server

pytest.importorskip("torch")

CLIENTS = 200
PER_CLIENT = 3


KEY = "load-test-key"


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    # The key comes the way a Kubernetes Secret brings it: a file named by the environment.
    tmp = tmp_path_factory.mktemp("load")
    (tmp / "keys").write_text(f"# mounted Secret\n{KEY} text\n")
    srv = start_server(tmp, env={"HORIZONSERVE_API_KEY_FILE": str(tmp / "keys")})
    yield srv
    assert srv.stop() == 0
    assert list(Path(srv.shm).iterdir()) == []


async def _client(url: str, i: int, out: list[tuple[float, int | str]]) -> None:
    body = {"priority": 0, "input_tokens": 16, "output_tokens": 2, "timeout_s": 120}
    headers = {"Connection": "close", "Authorization": f"Bearer {KEY}"}  # a new connection each
    async with httpx.AsyncClient(base_url=url, timeout=180) as c:
        for _ in range(PER_CLIENT):
            t0 = time.monotonic()
            try:
                r = await c.post("/v1/requests", json=body, headers=headers)
                out.append((time.monotonic() - t0, r.status_code))
            except httpx.HTTPError as exc:  # resets, refused connections, timeouts
                out.append((time.monotonic() - t0, type(exc).__name__))


def test_the_key_file_and_its_class_policy_apply(served: Served) -> None:
    with served.client() as c:
        r = c.post("/v1/requests", json={"priority": 0})
        assert r.status_code == 401 and r.json()["field"] == "authorization"
        auth = {"Authorization": f"Bearer {KEY}"}
        r = c.post("/v1/requests", json={"priority": 20, "images": 1}, headers=auth)
        assert r.status_code == 403 and r.json()["field"] == "priority"
        assert c.post("/v1/requests", json={"priority": 0}, headers=auth).status_code == 200
        assert c.get("/health").status_code == 200


def test_200_concurrent_clients_get_every_answer(served: Served) -> None:
    out: list[tuple[float, int | str]] = []

    async def run() -> float:
        t0 = time.monotonic()
        await asyncio.gather(*(_client(served.url, i, out) for i in range(CLIENTS)))
        return time.monotonic() - t0

    wall = asyncio.run(run())
    errors = [s for _, s in out if not isinstance(s, int)]
    codes = [s for _, s in out if isinstance(s, int)]
    lat = sorted(t for t, s in out if s == 200)
    p50 = statistics.median(lat) if lat else float("nan")
    p95 = lat[int(0.95 * (len(lat) - 1))] if lat else float("nan")
    print(
        f"\nload: {CLIENTS} clients x {PER_CLIENT} requests = {len(out)} in {wall:.1f} s, "
        f"{len(lat) / wall:.1f} req/s, p50 {p50 * 1e3:.0f} ms, p95 {p95 * 1e3:.0f} ms, "
        f"max {lat[-1] * 1e3 if lat else float('nan'):.0f} ms, transport errors {len(errors)}"
    )
    assert len(out) == CLIENTS * PER_CLIENT
    assert errors == [], errors[:10]
    assert set(codes) == {200}, sorted(set(codes))
    assert served.alive()
