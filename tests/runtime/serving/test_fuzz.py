"""Fuzzing the running server (tiny preset, CPU) over request JSON and headers.

Every case must leave the server alive (/health 200, process running) and get a 2xx, or a
4xx whose JSON names the field at fault; meanwhile a thread sends valid requests of every
class, and all of them must complete with 200.
"""

from __future__ import annotations

import json
import math
import threading
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from tests.runtime.serving.served import Served, start_server

pytest.importorskip("torch")

FIELDS = [
    "id",
    "priority",
    "class",
    "input_tokens",
    "audio_seconds",
    "video_seconds",
    "images",
    "output_tokens",
    "downstream_tokens",
    "timeout_s",
    "stream",
]
EXAMPLES = 120  # per suite run: bounded (each case is one HTTP round trip + a health check)
STATS: dict[str, int] = {"cases": 0, "2xx": 0, "4xx": 0, "valid_background": 0}


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    srv = start_server(tmp_path_factory.mktemp("fuzz"))
    yield srv
    assert srv.stop() == 0
    assert list(srv.shm.iterdir()) == [], "a shared-memory file outlived the server"
    print(f"\nfuzz: {STATS}")


numbers = st.one_of(
    st.integers(min_value=-(10**20), max_value=10**20),
    st.sampled_from([0, 1, 10, 20, 255, 256, 4096, 10**9, 2**63, -1]),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([1e308, 1e-308, -0.0, 0.5, 3600.0, 3600.0001]),
)
scalars = st.one_of(
    numbers,
    st.booleans(),
    st.none(),
    st.text(max_size=40),
    st.sampled_from(["２０", " 20 ", "1_0", "20", "text", "image", "speech", "\x00", "a" * 300]),
)
values = st.recursive(
    scalars,
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3)
    ),
    max_leaves=6,
)
bodies = st.dictionaries(
    st.one_of(st.sampled_from(FIELDS), st.text(max_size=12)), values, max_size=8
)
# Mostly-valid bodies: known fields with in-range values, one of them possibly perturbed.
valid_like = st.fixed_dictionaries(
    {"priority": st.sampled_from([0, 10, 20])},
    optional={
        "input_tokens": st.integers(0, 300),
        "audio_seconds": st.floats(0, 5),
        "images": st.integers(0, 2),
        "output_tokens": st.integers(1, 4),
        "downstream_tokens": st.integers(1, 8),
        "timeout_s": st.floats(0.001, 60),
        "stream": st.booleans(),
        "id": st.text("abcdef0123456789-_.:", min_size=1, max_size=140),
        "class": st.sampled_from(["text", "speech", "image", "nope", ""]),
    },
)
raw_bodies = st.one_of(
    st.binary(max_size=200),
    st.sampled_from(
        [
            b"",
            b"null",
            b"[]",
            b'{"priority": 10, "audio_seconds": 1e400}',
            b'{"priority": 10, "audio_seconds": NaN}',
            b'{"priority": 10, "audio_seconds": Infinity}',
            b'{"priority": 20, "video_seconds": 1e400}',
            b'{"priority": 0, "priority": 10}',
            b"[" * 5000,
            b'{"priority": 0, "input_tokens": 1' + b"0" * 5000 + b"}",
            '{"priority": 0, "id": "\u00e9\u00e9"}'.encode(),
            b'{"priority": 0, "id": "\xff\xfe"}',
        ]
    ),
)
headers = st.dictionaries(
    st.sampled_from(["content-type", "authorization", "x-vllm-priority", "accept", "x-junk"]),
    st.text(st.characters(min_codepoint=32, max_codepoint=126), max_size=30),
    max_size=3,
)


def _short_timeout(body: Any) -> bool:
    t = body.get("timeout_s") if isinstance(body, dict) else None
    return isinstance(t, int | float) and not isinstance(t, bool) and t < 1.0


def _check(reply: httpx.Response, body: Any) -> None:
    """2xx, or 4xx naming the field; 504 (naming timeout_s) only for a sub-second timeout."""
    code = reply.status_code
    if code == 504:
        assert _short_timeout(body) and reply.json()["field"] == "timeout_s", reply.text
        STATS["504 (timeout_s < 1 s)"] = STATS.get("504 (timeout_s < 1 s)", 0) + 1
        return
    assert 200 <= code < 300 or 400 <= code < 500, (code, reply.text[:300], body)
    if code >= 400:
        doc = reply.json()
        field = doc.get("field")
        assert isinstance(field, str) and field, doc
        assert doc["error"].startswith(f"{field}: "), doc
        STATS["4xx"] += 1
    else:
        STATS["2xx"] += 1
        if reply.headers.get("content-type", "").startswith("text/event-stream"):
            assert "event: admitted" in reply.text
            assert "event: done" in reply.text or "event: error" in reply.text
        else:
            doc = reply.json()
            assert doc["first_response_s"] is not None and math.isfinite(doc["first_response_s"])


def _send(client: httpx.Client, content: bytes, hdrs: dict[str, str], body: Any) -> None:
    reply = client.post("/v1/requests", content=content, headers=hdrs)
    _check(reply, body)
    STATS["cases"] += 1


@pytest.fixture(scope="module")
def background(served: Served) -> Iterator[list[int]]:
    """Valid traffic of every class for the whole module; yields the status codes seen."""
    codes: list[int] = []
    stop = threading.Event()

    def loop() -> None:
        bodies = [
            {"priority": 0, "output_tokens": 3},
            {"priority": 10, "output_tokens": 2, "downstream_tokens": 8},
            {"priority": 20, "images": 1, "downstream_tokens": 2},
        ]
        with served.client() as c:
            i = 0
            while not stop.is_set():
                codes.append(c.post("/v1/requests", json=bodies[i % 3]).status_code)
                i += 1

    thread = threading.Thread(target=loop, daemon=True)
    thread.start()
    yield codes
    stop.set()
    thread.join(60)
    STATS["valid_background"] = len(codes)


_SETTINGS = settings(
    max_examples=EXAMPLES,
    deadline=None,
    phases=[Phase.explicit, Phase.reuse, Phase.generate],  # no shrinking: each case is I/O
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
    derandomize=True,
)


@_SETTINGS
@given(body=st.one_of(bodies, valid_like), hdrs=headers)
def test_json_bodies_and_headers(
    served: Served, background: list[int], body: Any, hdrs: Any
) -> None:
    content = json.dumps(body, allow_nan=True).encode()
    with served.client() as c:
        _send(c, content, hdrs, body)
    assert served.alive()


@settings(_SETTINGS, max_examples=EXAMPLES // 2)
@given(raw=raw_bodies)
def test_raw_bodies(served: Served, background: list[int], raw: bytes) -> None:
    with served.client() as c:
        _send(c, raw, {"content-type": "application/json"}, raw)
    assert served.alive()


def test_background_traffic_completed(served: Served, background: list[int]) -> None:
    # Runs last in the module (pytest keeps file order): the fuzz cases ran beside it.
    assert background, "no background request completed"
    assert set(background) == {200}, sorted(set(background))
    assert served.alive()
