"""The whole reference pipeline on CPU (tiny models): HTTP API, harness backend, shutdown.

One pipeline (four spawned stage processes: shared, speech, code2wav, image) serves the whole
module; the last test stops it and checks that no stage process and no shared-memory record is
left behind.
"""

from __future__ import annotations

import json
import math
import os
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch")

from horizonserve.runtime.engine.reference import (
    PipelineOptions,
    ReferenceBackend,
    RequestSpec,
    TimedRequest,
)
from horizonserve.runtime.engine.reference.pipeline import UNAVAILABLE, downstream_stages
from horizonserve.runtime.engine.reference.presets import get_preset
from horizonserve.runtime.engine.reference.protocol import CHUNK, CODE2WAV, DONE, FIRST, Event
from horizonserve.runtime.engine.reference.server import ApiServer


@pytest.fixture(scope="module")
def backend() -> Iterator[ReferenceBackend]:
    options = PipelineOptions(preset="tiny", device="cpu", policy="horizon", warmup=False)
    with ReferenceBackend(options) as b:
        yield b


@pytest.fixture(scope="module")
def server(backend: ReferenceBackend) -> Iterator[ApiServer]:
    srv = ApiServer(backend.pipeline, "127.0.0.1", 0)
    srv.serve_in_thread()
    yield srv
    srv.shutdown()
    srv.server_close()


def _call(server: ApiServer, path: str, body: Any = None) -> tuple[int, bytes]:
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(server.url + path, data=data, method="POST" if data else "GET")
    req.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(req, timeout=60) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as err:
        return err.code, err.read()


@pytest.mark.parametrize(
    ("body", "cls", "metric"),
    [
        ({"priority": 0, "input_tokens": 24, "output_tokens": 6}, "text", "ttft"),
        ({"priority": 10, "audio_seconds": 2.0, "output_tokens": 5}, "speech", "ttfo"),
        ({"class": "image", "input_tokens": 8, "images": 1, "output_tokens": 3}, "image", "e2e"),
    ],
)
def test_post_returns_at_first_response_of_each_modality(
    server: ApiServer, body: dict[str, Any], cls: str, metric: str
) -> None:
    status, raw = _call(server, "/v1/requests", body)
    assert status == 200, raw
    out = json.loads(raw)
    assert out["class"] == cls and out["metric"] == metric
    assert 0 <= out["queueing_s"] <= out["first_response_s"]
    assert out["slo_s"] > 0 and isinstance(out["slo_met"], bool)
    if cls != "text":  # long path: handed off before its downstream stage responded
        assert out["handoff_s"] is not None and out["handoff_s"] <= out["first_response_s"]


@pytest.mark.parametrize(
    "body",
    [
        {"priority": 7},
        {"input_tokens": 5},
        {"priority": 0, "input_tokens": -1},
        {"class": "nope"},
        {"priority": 0, "bogus": 1},
    ],
)
def test_bad_requests_are_rejected(server: ApiServer, body: dict[str, Any]) -> None:
    status, raw = _call(server, "/v1/requests", body)
    assert status == 400, raw
    assert "error" in json.loads(raw)


def test_healthz_and_metrics(server: ApiServer) -> None:
    status, raw = _call(server, "/healthz")
    health = json.loads(raw)
    assert status == 200 and health["ok"]
    assert set(health["stages"]) == {"shared", "speech", "code2wav", "image"}
    assert _call(server, "/health")[0] == 200  # the operator's probe path
    _call(server, "/v1/requests", {"priority": 0, "output_tokens": 2})
    status, raw = _call(server, "/metrics")
    text = raw.decode()
    assert status == 200
    assert 'horizonserve:first_response_seconds_count{model_name="reference-tiny",' in text
    assert "horizonserve:shared_stage_sms" in text
    assert _call(server, "/nowhere")[0] == 404


def test_backend_runs_a_mixed_trace(backend: ReferenceBackend) -> None:
    trace = [
        TimedRequest(
            0.02 * i,
            RequestSpec(
                f"trace-{i}",
                priority=(0, 10, 20)[i % 3],
                input_tokens=16 + i,
                output_tokens=4 + i % 5,
                downstream_tokens=(None, 8, 2)[i % 3],
            ),
        )
        for i in range(12)
    ]
    result = backend.run(trace, drain_timeout_s=60)
    assert result.unfinished == 0 and not result.rejected
    assert len(result.records) == 12
    assert all(r["first_response_s"] is not None and r["error"] is None for r in result.records)
    assert all(r["done_s"] >= r["first_response_s"] for r in result.records)
    summary = result.summary()
    assert set(summary["classes"]) == {"text", "speech", "image"}
    assert all(c["p95_s"] >= c["p50_s"] > 0 for c in summary["classes"].values())
    assert result.trace, "the shared stage's step trace was collected"
    row = result.trace[0]
    assert row["shared_sms"] > 0 and row["decode_batch"] + row["prefill_batch"] > 0
    assert max(r["decode_batch"] + r["prefill_batch"] for r in result.trace) <= 8
    # The slacks the split compared cross the process boundary as numbers or None (−inf: a
    # short-path or protected prompt waits; the JSON writers turn non-finite values into None).
    slacks = [r[k] for r in result.trace for k in ("shared_slack", "downstream_slack")]
    assert all(u is None or (isinstance(u, float) and not math.isnan(u)) for u in slacks)


def test_policy_switch_and_bench_trace(backend: ReferenceBackend) -> None:
    np = pytest.importorskip("numpy")
    from horizonserve.runtime.workload import Trace

    n = 6
    trace = Trace(
        classes=("text", "speech", "image"),
        cls=np.array([0, 1, 2, 0, 1, 2]),
        arrival=np.linspace(0.0, 0.1, n),
        text_tokens=np.full(n, 12),
        audio_s=np.array([0.0, 1.5, 0.0, 0.0, 0.0, 0.0]),
        images=np.array([0, 0, 1, 0, 0, 0]),
        video_s=np.zeros(n),
        output_tokens=np.full(n, 3),
        output_audio_s=np.array([0.0, 2.0, 0.0, 0.0, 1.0, 0.0]),
    )
    backend.set_policy("fcfs")
    try:
        result = backend.run_trace(trace, drain_timeout_s=60)
    finally:
        backend.set_policy("horizon")
    assert result.policy == "fcfs" and result.unfinished == 0
    assert [r["class"] for r in result.records] == ["text", "speech", "image"] * 2
    assert all(r["slo_met"] is not None for r in result.records)
    phases = {row["phase"] for row in result.trace}
    assert phases == {"all"}  # fcfs: no rotation
    speech = [r for r in result.records if r["class"] == "speech"]
    assert [r["info"]["samples"] > 0 for r in speech] == [True, True]


def test_speech_chunks_come_from_the_code2wav_process_in_the_deploys_sizes(
    backend: ReferenceBackend,
) -> None:
    pipeline = backend.pipeline
    preset = get_preset("tiny")
    seen: list[Event] = []
    pipeline.on_event = seen.append
    try:
        handle = pipeline.submit(
            RequestSpec("chunks", priority=10, output_tokens=2, downstream_tokens=7)
        )
        assert handle.wait_done(30) and handle.record.error is None
    finally:
        pipeline.on_event = None
    mine = [e for e in seen if e.rid == "chunks" and e.kind in (FIRST, CHUNK, DONE)]
    assert {e.stage for e in mine} == {CODE2WAV}
    assert [e.kind for e in mine] == [FIRST, CHUNK, CHUNK, CHUNK, DONE]
    spc = preset.code2wav.samples_per_code
    samples = [e.data["samples"] for e in mine[:-1]]
    sizes = [b - a for a, b in zip([0, *samples], samples, strict=False)]
    first, every = preset.first_chunk, preset.code_chunk  # from the deploy description
    assert sizes == [first * spc, every * spc, every * spc, (7 - first - 2 * every) * spc]
    assert mine[-1].data == {"chunks": 4, "codes": 7, "samples": 7 * spc}
    assert pipeline.stage_info["code2wav"]["params"] > 0  # a stage process of its own


def test_the_downstream_option_runs_each_paths_whole_chain() -> None:
    assert downstream_stages(("image", "speech")) == ("speech", "image", "code2wav")
    assert downstream_stages(("speech", "code2wav")) == ("speech", "code2wav")
    assert downstream_stages(("image",)) == ("image",)
    with pytest.raises(ValueError, match="code2wav needs the speech stage"):
        downstream_stages(("code2wav",))
    with pytest.raises(ValueError, match="unknown stage 'talker'"):
        downstream_stages(("talker",))


def test_decode_probe_reports_each_sm_level(backend: ReferenceBackend) -> None:
    probe = backend.pipeline.probe_decode(batch=3, context=20, steps=4)
    assert probe["batch"] == 3 and probe["steps"] == 4
    assert list(probe["levels"]) == ["132"]  # CPU: no ladder, the whole "GPU" only
    assert probe["levels"]["132"]["p50_s"] > 0
    assert backend.pipeline.health()["ok"]


def test_abort_drops_everything_in_flight_and_the_stages_keep_serving(
    backend: ReferenceBackend,
) -> None:
    pipeline = backend.pipeline
    long_text = RequestSpec("ab-text", priority=0, input_tokens=16, output_tokens=100_000)
    long_speech = RequestSpec("ab-speech", priority=10, output_tokens=2, downstream_tokens=100_000)
    handles = [pipeline.submit(long_text), pipeline.submit(long_speech)]
    assert all(h.wait_first(30) for h in handles)  # both are now deep inside their stages
    assert pipeline.in_flight() == 2
    dropped = pipeline.abort()
    assert set(dropped) == {"shared", "speech", "code2wav", "image"}
    assert dropped["shared"] == 1 and dropped["image"] == 0
    assert dropped["speech"] == 1 and dropped["code2wav"] == 1  # its open stream, mid-answer
    assert pipeline.in_flight() == 0
    assert [h.record.error for h in handles] == ["aborted", "aborted"]
    assert all(h.done.is_set() for h in handles)
    after = pipeline.submit(RequestSpec("ab-after", priority=10, output_tokens=2))
    assert after.wait_done(30) and after.record.error is None  # same stages, freed slots
    assert pipeline.health()["ok"]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    status = Path(f"/proc/{pid}/status")
    return not (status.exists() and "zombie" in status.read_text())


def test_stop_leaves_no_stage_process_or_record(backend: ReferenceBackend) -> None:
    pipeline = backend.pipeline
    pids = list(pipeline.stage_pids)
    record_path = pipeline._record.path if pipeline._record else None
    assert len(pids) == 4 and all(_alive(p) for p in pids)
    handle = pipeline.submit(RequestSpec("last", priority=10, output_tokens=3))
    assert handle.wait_done(30)
    # Mid-answer: chunks between the talker and code2wav when the pipeline stops.
    talking = pipeline.submit(
        RequestSpec("talking", priority=10, output_tokens=2, downstream_tokens=100_000)
    )
    assert talking.wait_first(30)
    backend.close()
    assert talking.done.is_set() and talking.record.failure == UNAVAILABLE
    assert not any(_alive(p) for p in pids)
    assert record_path is not None and not record_path.exists()
    assert pipeline.health()["ok"] is False
    stopped = {name for name, info in pipeline.stage_info.items() if "stopped" in info}
    assert stopped == {"shared", "speech", "code2wav", "image"}  # each left its loop itself
