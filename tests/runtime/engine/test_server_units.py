"""Pure parts of the serving path: request parsing, access policy, supervisor decisions,
byte-bounded history."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from horizonserve.runtime.engine.reference.access import access_policy, read_key_file
from horizonserve.runtime.engine.reference.api_models import (
    ApiError,
    ApiLimits,
    parse_body,
    validate_request,
)
from horizonserve.runtime.engine.reference.history import BoundedHistory
from horizonserve.runtime.engine.reference.supervisor import (
    RestartBackoff,
    RestartPolicy,
    stage_fault,
)

# The tiny preset's bounds (its media token rates included: prompt + output fit a KV slot).
LIMITS = ApiLimits(
    max_tokens=256,
    max_speech_codes=256,
    max_image_steps=100,
    tokens_per_audio_second=4,
    tokens_per_video_second=8,
    tokens_per_image=8,
)


@pytest.mark.parametrize(
    ("raw", "status", "field"),
    [
        (b'{"priority": 10, "audio_seconds": 1e308}', 400, "audio_seconds"),
        (b'{"priority": 10, "audio_seconds": 1e400}', 400, "audio_seconds"),
        (b'{"priority": 10, "audio_seconds": NaN}', 400, "audio_seconds"),
        (b'{"priority": 10, "video_seconds": -Infinity}', 400, "video_seconds"),
        (b'{"priority": "20"}', 400, "priority"),
        (b'{"priority": true}', 400, "priority"),
        (b'{"priority": 20.0}', 400, "priority"),
        (b'{"priority": 0, "input_tokens": 257}', 400, "input_tokens"),
        (b'{"priority": 0, "output_tokens": 0}', 400, "output_tokens"),
        (b'{"priority": 0, "timeout_s": 0}', 400, "timeout_s"),
        (b'{"priority": 0, "id": "a b"}', 400, "id"),
        (b'{"priority": 0, "bogus": 1}', 400, "bogus"),
        (b'{"priority": 0, "priority": 0}', 400, "priority"),
        (b'{"input_tokens": 5}', 400, "priority"),
        (b"[1]", 400, "body"),
        (b"\xff", 400, "body"),
        (b"{", 400, "body"),
        (b" " * (64 * 1024 + 1), 413, "body"),
    ],
)
def test_bad_bodies_name_their_field(raw: bytes, status: int, field: str) -> None:
    with pytest.raises(ApiError) as info:
        validate_request(parse_body(raw), LIMITS)
    assert (info.value.status, info.value.field) == (status, field)
    assert info.value.body()["error"].startswith(f"{field}: ")


def test_a_valid_body_keeps_its_values() -> None:
    req = validate_request(
        parse_body(b'{"class": "image", "images": 1, "downstream_tokens": 100, "stream": true}'),
        LIMITS,
    )
    assert (req.class_, req.images, req.downstream_tokens, req.stream) == ("image", 1, 100, True)


def test_key_file_and_class_policy(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    f = tmp_path / "keys"
    f.write_text("# keys\nk1 text,speech\n\nk2\n")
    assert read_key_file(f) == {"k1": frozenset({"text", "speech"}), "k2": None}
    monkeypatch.setenv("HORIZONSERVE_API_KEY", "envkey")
    keys, anon = access_policy(None, f, "text")
    assert keys["envkey"] == frozenset({"text"}) and anon is None
    monkeypatch.delenv("HORIZONSERVE_API_KEY")
    assert access_policy(None, None, "image") == ({}, frozenset({"image"}))
    f.write_text("k1 a b\n")
    with pytest.raises(ValueError, match=":1:"):
        read_key_file(f)


def test_backoff_doubles_resets_and_runs_out() -> None:
    b = RestartBackoff(RestartPolicy(initial_s=0.5, max_s=4, stable_s=60, max_restarts=3))
    assert [b.failed(t) - t for t in (0.0, 1.0, 2.0, 3.0, 4.0)] == [0.5, 1.0, 2.0, 4.0, 4.0]
    assert b.exhausted(4.0)
    assert b.failed(100.0) - 100.0 == 0.5  # running 96 s since the last failure: reset
    assert not b.exhausted(1000.0)


def _fault(**kw: int | None) -> str | None:
    s = 10**9
    args = {"exitcode": None, "pid": 7, "writer_pid": 7, "ready_ns": 1 * s, "hang_ns": 2 * s}
    args.update({"beat_ns": 9 * s, "now_ns": 10 * s})
    args.update(kw)
    return stage_fault(**args)  # type: ignore[arg-type]


def test_stage_fault_reasons() -> None:
    s = 10**9
    assert _fault() is None
    assert "exited with code -9" in (_fault(exitcode=-9) or "")
    assert "no heartbeat for 3.0 s" in (_fault(beat_ns=7 * s) or "")
    assert "in the future" in (_fault(beat_ns=20 * s) or "")
    assert "pid 8" in (_fault(writer_pid=8) or "")
    # A restarted stage before its first beat: the predecessor's pid and beat are not a fault.
    assert _fault(writer_pid=8, ready_ns=9 * s, beat_ns=5 * s) is None


def test_missing_torch_or_gpu_is_one_line_with_the_cpu_hint(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import importlib.util

    from horizonserve.runtime.engine.reference.cli import device_problem

    pytest.importorskip("torch")
    import torch

    hint = "--device cpu --preset tiny"
    assert device_problem("cpu") is None
    if not torch.cuda.is_available():
        problem = device_problem("cuda:0") or ""
        assert "no CUDA GPU" in problem and hint in problem and "\n" not in problem
    assert "use auto, cpu or cuda:N" in (device_problem("tpu") or "")
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda n, *a: None if n == "torch" else real(n, *a)
    )
    problem = device_problem("auto") or ""
    assert "PyTorch is not installed" in problem and hint in problem


def test_history_is_bounded_in_bytes() -> None:
    h: BoundedHistory[str] = BoundedHistory(10_000, sys.getsizeof)
    for i in range(10_000):
        h.append(f"record-{i}-" + "x" * 100)
    assert h.nbytes <= 10_000 and len(h) > 10
    assert h[len(h) - 1].startswith("record-9999-")  # the newest kept, the oldest dropped
    h.append("y" * 20_000)  # larger than the whole budget: not kept
    assert h[len(h) - 1].startswith("record-9999-")
    assert sum(sys.getsizeof(x) for x in h) == h.nbytes
