"""`ReferenceBackend`: the real pipeline as a benchmark backend, driven in-process.

The harness hands it a trace of timed requests; it submits each at its offset (open loop: the
arrival stamp is the trace's time, not when the submitting thread woke up), waits for every
request to finish, and returns per-request records plus the shared stage's step trace (SM
split, pressure, batch sizes, prefill/decode times). Results are measured, never simulated.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from typing import Any

from horizonserve.runtime.engine.reference.pipeline import (
    Pipeline,
    PipelineOptions,
    QueueFullError,
    RequestHandle,
    SharingMismatchError,
)
from horizonserve.runtime.engine.reference.presets import get_preset
from horizonserve.runtime.engine.reference.protocol import RequestSpec
from horizonserve.runtime.workload import Trace


@dataclass(frozen=True, slots=True)
class TimedRequest:
    at_s: float  # arrival offset from the start of the trace
    spec: RequestSpec


@dataclass
class BackendResult:
    backend: str
    policy: str
    preset: str
    device: str
    duration_s: float
    records: list[dict[str, Any]]  # RequestRecord.as_dict() + "arrival_offset_s"
    trace: list[dict[str, Any]]  # shared-stage step rows, "t" relative to the trace start
    stages: dict[str, dict[str, Any]] = field(default_factory=dict)
    unfinished: int = 0  # submitted but not finished when the drain timeout ran out
    rejected: list[dict[str, Any]] = field(default_factory=list)  # refused at submission

    def summary(self) -> dict[str, Any]:
        return summarize(self.records, self.trace)


def _pct(values: list[float], q: float) -> float | None:
    if not values:
        return None
    s = sorted(values)
    return s[min(len(s) - 1, max(0, round(q * (len(s) - 1))))]


def summarize(records: list[dict[str, Any]], trace: list[dict[str, Any]]) -> dict[str, Any]:
    """Per-class first-response p50/p95 and attainment; decode step time per shared SM count."""
    classes: dict[str, dict[str, Any]] = {}
    for name in sorted({r["class"] for r in records}):
        rs = [r for r in records if r["class"] == name]
        lat = [r["first_response_s"] for r in rs if r["first_response_s"] is not None]
        tpot = [r["shared_tpot_s"] for r in rs if r["shared_tpot_s"] is not None]
        classes[name] = {
            "requests": len(rs),
            "responded": len(lat),
            "metric": rs[0]["metric"],
            "slo_s": rs[0]["slo_s"],
            "attainment": sum(1 for r in rs if r["slo_met"]) / len(rs),
            "p50_s": _pct(lat, 0.5),
            "p95_s": _pct(lat, 0.95),
            "shared_tpot_mean_s": statistics.fmean(tpot) if tpot else None,
        }
    by_sms: dict[int, list[float]] = {}
    for row in trace:
        if row["decode_batch"] > 0 and row["prefill_batch"] == 0:
            by_sms.setdefault(row["shared_sms"], []).append(row["decode_s"])
    decode = {
        str(sms): {"steps": len(v), "p50_s": _pct(v, 0.5), "mean_s": statistics.fmean(v)}
        for sms, v in sorted(by_sms.items())
    }
    met = sum(1 for r in records if r["slo_met"])
    return {
        "requests": len(records),
        "attainment": met / len(records) if records else None,
        "classes": classes,
        "decode_step_by_shared_sms": decode,
    }


def requests_from_trace(trace: Trace, preset: str) -> list[TimedRequest]:
    """The bench/sim trace as timed requests (class names must exist in the serving config).

    Spoken-answer seconds become talker codes at the preset's code rate; image classes use the
    preset's denoising steps.
    """
    codes_per_s = get_preset(preset).codes_per_audio_second
    out = []
    for i in range(len(trace)):
        audio_out = float(trace.output_audio_s[i])
        out.append(
            TimedRequest(
                float(trace.arrival[i]),
                RequestSpec(
                    rid=f"req-{i}",
                    class_name=trace.classes[int(trace.cls[i])],
                    input_tokens=int(trace.text_tokens[i]),
                    audio_seconds=float(trace.audio_s[i]),
                    images=int(trace.images[i]),
                    video_seconds=float(trace.video_s[i]),
                    output_tokens=max(1, int(trace.output_tokens[i])),
                    downstream_tokens=max(1, round(audio_out * codes_per_s)) if audio_out else None,
                ),
            )
        )
    return out


class ReferenceBackend:
    """Start once, run one or more traces, close."""

    name = "reference"

    def __init__(self, options: PipelineOptions | None = None) -> None:
        self.options = options or PipelineOptions()
        self.pipeline = Pipeline(self.options)

    def start(self) -> ReferenceBackend:
        self.pipeline.start()
        return self

    def close(self) -> None:
        self.pipeline.stop()

    def __enter__(self) -> ReferenceBackend:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    def run_trace(self, trace: Trace, *, drain_timeout_s: float = 300.0) -> BackendResult:
        """Run a bench/sim `Trace` (arrival times in seconds from its start)."""
        return self.run(
            requests_from_trace(trace, self.options.preset), drain_timeout_s=drain_timeout_s
        )

    def set_policy(self, policy: str) -> None:
        """Switch policy between runs: in place, or with a restart of the stages when the new
        policy runs under another GPU-sharing mode (e.g. horizon under MPS + Green Contexts,
        fcfs time-sliced)."""
        try:
            self.pipeline.set_policy(policy)
        except SharingMismatchError:
            self.pipeline.stop()
            self.options = replace(self.options, policy=policy)
            self.pipeline = Pipeline(self.options)
            self.pipeline.start()

    def run(
        self, trace: Iterable[TimedRequest], *, drain_timeout_s: float = 300.0
    ) -> BackendResult:
        """Submit the trace in real time; wait until every request finished (or timeout)."""
        items = sorted(trace, key=lambda r: r.at_s)
        pipeline = self.pipeline
        t0 = time.monotonic() + 0.05
        handles: list[tuple[float, RequestHandle]] = []
        errors: list[dict[str, Any]] = []
        for item in items:
            due = t0 + item.at_s
            delay = due - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            try:
                handles.append((item.at_s, pipeline.submit(item.spec, arrival=due)))
            except ValueError as exc:
                errors.append({"id": item.spec.rid, "error": str(exc)})
            except QueueFullError as exc:  # shed by the queue limits: never served, a miss
                errors.append({"id": item.spec.rid, "error": str(exc), "shed": exc.reason})
        deadline = time.monotonic() + drain_timeout_s
        unfinished = 0
        for _, h in handles:
            if not h.wait_done(max(0.0, deadline - time.monotonic())):
                unfinished += 1
        duration = time.monotonic() - t0
        shared_end = [
            h.record.handoff if h.record.handoff is not None else h.record.done for _, h in handles
        ]
        pipeline.wait_trace(max([t for t in shared_end if t is not None], default=0.0))
        records = []
        for at_s, h in handles:
            rec = h.record.as_dict()
            rec["arrival_offset_s"] = at_s
            records.append(rec)
        rows = []
        for row in pipeline.trace_dicts():
            if row["t"] >= t0:
                row["t"] -= t0
                rows.append(row)
        config = pipeline.config
        return BackendResult(
            backend=self.name,
            policy=config.policy.value if config else self.options.policy,
            preset=self.options.preset,
            device=pipeline.device,
            duration_s=duration,
            records=records,
            trace=rows,
            stages=dict(pipeline.stage_info),
            unfinished=unfinished,
            rejected=errors,
        )
