"""Supervision faults: one corrupt heartbeat word does not restart a healthy stage (a hung or
stopped one is still restarted: tests/runtime/serving/test_chaos.py), and a stage that keeps
failing degrades its own classes without ending `serve` or failing liveness."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator

import pytest

pytest.importorskip("torch")

from horizonserve.runtime.engine.reference import PipelineOptions
from horizonserve.runtime.engine.reference.cli import ExitWatch
from horizonserve.runtime.engine.reference.pipeline import DOWNSTREAM_STAGES, Pipeline
from horizonserve.runtime.engine.reference.server import ApiServer, ServerSettings
from horizonserve.runtime.engine.reference.supervisor import FaultConfirmation
from horizonserve.runtime.monitor.record import _ALIVE_WORD, GROUP_BYTES

WORD = 8


@pytest.fixture(scope="module")
def pipeline() -> Iterator[Pipeline]:
    options = PipelineOptions(
        preset="tiny", device="cpu", warmup=False, supervise=True, hang_timeout_s=5.0
    )
    with Pipeline(options) as p:
        yield p


def _restarts(pipeline: Pipeline) -> dict[str, int]:
    return {name: s["restarts"] for name, s in pipeline.health()["stages"].items()}


def test_one_corrupt_heartbeat_word_restarts_no_healthy_stage(pipeline: Pipeline) -> None:
    assert pipeline._record is not None
    path = pipeline._record.path
    offsets = {"shared": _ALIVE_WORD * WORD}  # the shared stage's liveness word
    for name in ("image", "speech"):  # a downstream slot's heartbeat (after its seq word)
        offsets[name] = 2 * GROUP_BYTES + DOWNSTREAM_STAGES.index(name) * GROUP_BYTES + WORD
    before = _restarts(pipeline)
    for _ in range(5):
        for offset in offsets.values():
            with open(path, "r+b") as f:
                f.seek(offset)
                f.write(os.urandom(WORD))
        time.sleep(0.6)
    time.sleep(0.5)
    assert _restarts(pipeline) == before
    assert all(s["state"] == "running" for s in pipeline.health()["stages"].values())


def test_a_persistent_heartbeat_fault_still_counts_and_an_exit_at_once() -> None:
    c = FaultConfirmation()
    assert not c.confirmed("no heartbeat", False, 10.0)
    assert not c.confirmed("no heartbeat", False, 10.3)
    assert c.confirmed("no heartbeat", False, 10.6)
    assert not c.confirmed(None, False, 10.7)  # rewritten: the count starts again
    assert c.confirmed("process exited with code -9", True, 10.8)


def test_a_crash_looping_stage_ends_neither_serve_nor_liveness(pipeline: Pipeline) -> None:
    watch = ExitWatch(grace_s=1.0)
    # Not live (a stage spent its restart budget) but other classes are served: keep going.
    assert not any(watch.give_up(False, True, t) for t in (0.0, 5.0, 60.0))
    assert not watch.give_up(False, False, 61.0)
    assert watch.give_up(False, False, 62.5)  # nothing served, no recovery: give up
    slot = pipeline._slots["image"]
    saved = list(slot.backoff.failures)
    now = time.monotonic()
    slot.backoff.failures.extend([now] * (slot.backoff.policy.max_restarts + 1))
    srv = ApiServer(pipeline, "127.0.0.1", 0, ServerSettings())
    srv.serve_in_thread()
    try:
        import httpx

        assert not pipeline.live() and pipeline.ready()
        r = httpx.get(srv.url + "/health", timeout=10)
        assert r.status_code == 200 and r.json()["status"] == "degraded"
    finally:
        slot.backoff.failures.clear()
        slot.backoff.failures.extend(saved)
        srv.shutdown()
        srv.server_close()
