"""The front process's view of the pipeline: spawns the stage processes, routes requests in,
collects events out, and shuts everything down.

    Pipeline.start()   control record in /dev/shm; one spawned process per stage (shared,
                       speech, image); waits until every stage reported READY
    Pipeline.submit()  class lookup + arrival stamp, then onto the shared stage's queue;
                       returns a RequestHandle whose events fire at first response / done
    Pipeline.abort()   drop every request in flight (and hand-offs still on their way) in all
                       stages without restarting them; their handles finish with an error
    Pipeline.stop()    sentinel to every stage, join, terminate stragglers, remove the record

A collector thread turns stage events into request records, metrics (MetricsRecorder) and the
shared stage's step trace (SM split, pressure, batch, timings).
"""

from __future__ import annotations

import contextlib
import logging
import math
import multiprocessing as mp
import os
import queue
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from horizonserve.runtime.config import Path, PolicyName, Priority, ServingConfig
from horizonserve.runtime.engine.reference.defaults import reference_config
from horizonserve.runtime.engine.reference.gpu_control import (
    GC,
    MPS_GC,
    SHARING_MODES,
    TIMESLICE,
    sharing_for,
    uses_caps,
    uses_mps,
)
from horizonserve.runtime.engine.reference.protocol import (
    ABORTED,
    DONE,
    ERROR,
    FIRST,
    HANDOFF,
    IMAGE,
    POLICY,
    PROBE,
    READY,
    SPEECH,
    STOPPED,
    TRACE,
    TRACE_COLUMNS,
    Abort,
    Admit,
    Event,
    ProbeDecode,
    ProbeLoad,
    ProbeStop,
    RequestSpec,
    SetPolicy,
)
from horizonserve.runtime.engine.reference.stages import run_stage
from horizonserve.runtime.engine.reference.stages.common import StageConfig
from horizonserve.runtime.metrics import MetricsRecorder
from horizonserve.runtime.monitor import ControlRecord, shm_path
from horizonserve.runtime.profiler import RequestProfiler

log = logging.getLogger(__name__)

DOWNSTREAM_STAGES = (SPEECH, IMAGE)


@dataclass
class PipelineOptions:
    preset: str = "tiny"
    device: str = "auto"  # auto: cuda:0 when a GPU is visible, else cpu
    policy: str = "horizon"
    config: ServingConfig | None = None  # default: reference classes + default ladder
    downstream: tuple[str, ...] = DOWNSTREAM_STAGES
    mps: bool = False  # GPU-sharing mode of the MPS baselines
    # How the stage processes share the GPU: "auto" picks it from the policy (gpu_control:
    # horizon -> MPS + Green Context ladders, fcfs/edf -> time-sliced, mps flag -> MPS); or one
    # of gpu_control.SHARING_MODES explicitly (calibration measures each mode it needs).
    sharing: str = "auto"
    graphs: bool = True  # CUDA graphs for AR decode (CUDA only)
    seed: int = 0
    threads: int = 1  # torch threads per stage (CPU)
    warmup: bool = True
    startup_timeout_s: float = 900.0
    trace_interval_s: float = 0.25
    limits: dict[str, int] = field(default_factory=dict)  # thinker max_batch / max_len / …
    history: int = 100_000  # finished request records and trace rows kept


@dataclass
class RequestRecord:
    """One request as the front process saw it (times: monotonic seconds)."""

    rid: str
    class_name: str
    priority: int
    path: str
    metric: str
    slo_s: float
    arrival: float
    scheduled: float | None = None  # prompt entered a shared-stage batch
    first: float | None = None  # first response
    handoff: float | None = None  # left the shared stage (long path)
    done: float | None = None
    shared_tpot_s: float | None = None
    shared_tokens: int | None = None
    error: str | None = None
    info: dict[str, Any] = field(default_factory=dict)

    @property
    def queueing_s(self) -> float | None:
        return None if self.scheduled is None else self.scheduled - self.arrival

    @property
    def first_response_s(self) -> float | None:
        return None if self.first is None else self.first - self.arrival

    @property
    def slo_met(self) -> bool | None:
        fr = self.first_response_s
        return None if fr is None else fr <= self.slo_s

    def as_dict(self) -> dict[str, Any]:
        return {
            "id": self.rid,
            "class": self.class_name,
            "priority": self.priority,
            "path": self.path,
            "metric": self.metric,
            "slo_s": self.slo_s,
            "arrival": self.arrival,
            "queueing_s": self.queueing_s,
            "first_response_s": self.first_response_s,
            "slo_met": self.slo_met,
            "handoff_s": None if self.handoff is None else self.handoff - self.arrival,
            "done_s": None if self.done is None else self.done - self.arrival,
            "shared_tpot_s": self.shared_tpot_s,
            "shared_tokens": self.shared_tokens,
            "error": self.error,
            **({"info": self.info} if self.info else {}),
        }


class RequestHandle:
    __slots__ = ("done", "first", "record")

    def __init__(self, record: RequestRecord) -> None:
        self.record = record
        self.first = threading.Event()
        self.done = threading.Event()

    def wait_first(self, timeout: float | None = None) -> bool:
        return self.first.wait(timeout)

    def wait_done(self, timeout: float | None = None) -> bool:
        return self.done.wait(timeout)


class PipelineError(RuntimeError):
    pass


class SharingMismatchError(PipelineError):
    """The new policy needs another GPU-sharing mode: the stages must be restarted."""


def resolve_device(device: str) -> str:
    if device != "auto":
        return device
    try:
        import torch
    except ImportError:
        return "cpu"
    return "cuda:0" if torch.cuda.is_available() else "cpu"


def device_sms(device: str) -> int | None:
    if not device.startswith("cuda"):
        return None
    import torch

    return int(torch.cuda.get_device_properties(torch.device(device)).multi_processor_count)


class Pipeline:
    def __init__(self, options: PipelineOptions | None = None) -> None:
        self.options = options or PipelineOptions()
        self.device = ""
        self.config: ServingConfig | None = None
        self.metrics = MetricsRecorder()
        self.stage_info: dict[str, dict[str, Any]] = {}
        self.trace: deque[tuple[Any, ...]] = deque(maxlen=self.options.history)
        self.trace_received_t = 0.0  # stage-side send time of the newest trace batch
        self.finished: deque[RequestRecord] = deque(maxlen=self.options.history)
        self.errors: list[str] = []
        self._handles: dict[str, RequestHandle] = {}
        self._lock = threading.Lock()
        self._procs: dict[str, Any] = {}
        self._queues: dict[str, Any] = {}
        self._events: Any = None
        self._record: ControlRecord | None = None
        self._profiler: RequestProfiler | None = None
        self._collector: threading.Thread | None = None
        self._running = False
        self._ready = threading.Condition(self._lock)
        self._stopped: set[str] = set()
        self._mps: Any = None
        self._policy_ack: str | None = None
        self._mps_env: dict[str, str | None] = {}
        self.mps_active = False
        self.sharing = "timeslice"
        self._probes: dict[str, dict[str, Any]] = {}
        self._aborts: dict[str, int] = {}  # stage → requests dropped, per `abort` call
        self.on_event: Callable[[Event], None] | None = None  # test hook
        self.stage_pids: list[int] = []  # pids of the last started stages (kept after stop)

    # -- lifetime ---------------------------------------------------------------------------
    def start(self) -> Pipeline:
        opts = self.options
        for name in opts.downstream:
            if name not in DOWNSTREAM_STAGES:
                raise ValueError(f"downstream: unknown stage {name!r}; use speech and/or image")
        self.device = resolve_device(opts.device)
        cuda = self.device.startswith("cuda")
        policy = opts.policy or (opts.config.policy.value if opts.config else "horizon")
        self.sharing = self._choose_sharing(policy, cuda)
        if uses_mps(self.sharing):
            self._start_mps()
            if not self.mps_active:
                self.sharing = GC if self.sharing == MPS_GC else TIMESLICE
        sms = device_sms(self.device)  # after the MPS daemon: the front is a client too
        config = opts.config or reference_config(opts.preset, total_sms=sms or 132)
        if opts.policy:
            config = config.model_copy(update={"policy": PolicyName(opts.policy)})
        if sms is not None and config.ladder.total != sms:
            log.warning("ladder total %d SMs, device has %d", config.ladder.total, sms)
        self.config = config
        self._profiler = RequestProfiler(config.slo, config.control.u_guard)

        name = f"horizonserve-control-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        self._record = ControlRecord.create(shm_path(name), n_slots=len(DOWNSTREAM_STAGES))
        # Ladders are pre-allocated when the sharing mode caps; a policy that does not throttle
        # (set_policy within the same mode, e.g. calibration's solo runs) never activates them.
        capped = cuda and uses_caps(self.sharing)
        log.info("GPU sharing %s (policy %s, ladders %s)", self.sharing, policy, capped)
        base = StageConfig(
            preset=opts.preset,
            device=self.device,
            serving_json=config.model_dump_json(),
            record_path=str(self._record.path),
            capped=capped,
            sharing=self.sharing,
            graphs=opts.graphs,
            seed=opts.seed,
            threads=opts.threads,
            trace_interval_s=opts.trace_interval_s,
            warmup=opts.warmup,
            limits=dict(opts.limits),
        )
        ctx = mp.get_context("spawn")
        self._events = ctx.Queue()
        self._queues = {"shared": ctx.Queue()}
        for name in opts.downstream:
            self._queues[name] = ctx.Queue()
        handoff_qs = {n: self._queues[n] for n in opts.downstream}
        procs = {
            "shared": ctx.Process(
                target=run_stage,
                args=("shared", base, self._queues["shared"], self._events, handoff_qs),
                name="horizonserve-shared",
                daemon=True,
            )
        }
        for name in opts.downstream:
            slot = DOWNSTREAM_STAGES.index(name)
            cfg = replace(base, downstream_slot=slot, seed=opts.seed + slot + 1)
            procs[name] = ctx.Process(
                target=run_stage,
                args=(name, cfg, self._queues[name], self._events),
                name=f"horizonserve-{name}",
                daemon=True,
            )
        self._procs = procs
        self._running = True
        self.stage_pids = []
        self._collector = threading.Thread(target=self._collect, name="events", daemon=True)
        self._collector.start()
        for p in procs.values():
            p.start()
            self.stage_pids.append(p.pid)
        try:
            self._wait_ready(opts.startup_timeout_s)
        except BaseException:
            self.stop()
            raise
        return self

    def _wait_ready(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        with self._ready:
            while set(self.stage_info) != set(self._procs):
                if self.errors:
                    raise PipelineError(f"stage failed during start-up: {self.errors[0]}")
                dead = [n for n, p in self._procs.items() if p.exitcode is not None]
                if dead:
                    raise PipelineError(f"stage process exited during start-up: {dead}")
                left = deadline - time.monotonic()
                if left <= 0:
                    missing = sorted(set(self._procs) - set(self.stage_info))
                    raise PipelineError(f"stages not ready after {timeout:.0f} s: {missing}")
                self._ready.wait(min(left, 0.2))

    def stop(self, timeout: float = 20.0) -> None:
        """Stop every stage; never leaves a stage process behind."""
        if not self._procs:
            return
        for q in self._queues.values():
            with contextlib.suppress(ValueError, OSError):
                q.put(None)
        deadline = time.monotonic() + timeout
        for p in self._procs.values():
            p.join(max(0.0, deadline - time.monotonic()))
        for p in self._procs.values():
            if p.is_alive():
                log.warning("stage process %s did not stop; terminating", p.name)
                p.terminate()
                p.join(5.0)
            if p.is_alive():
                p.kill()
                p.join(5.0)
        self._running = False
        if self._collector is not None:
            self._collector.join(5.0)
        for q in [*self._queues.values(), self._events]:
            if q is not None:
                q.cancel_join_thread()
                q.close()
        with self._lock:
            for h in self._handles.values():
                if not h.done.is_set():
                    h.record.error = h.record.error or "pipeline stopped"
                    h.first.set()
                    h.done.set()
        if self._record is not None:
            self._record.close()
            self._record.unlink()
            self._record = None
        if self._mps is not None:
            self._stop_mps()
        self._procs = {}

    def __enter__(self) -> Pipeline:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _choose_sharing(self, policy: str, cuda: bool) -> str:
        opts = self.options
        if opts.sharing != "auto":
            if opts.sharing not in SHARING_MODES:
                raise ValueError(f"sharing: unknown mode {opts.sharing!r}; use {SHARING_MODES}")
            return opts.sharing if cuda else TIMESLICE
        from horizonserve.runtime.gpu import mps_available

        return sharing_for(policy, mps=opts.mps, cuda=cuda, mps_available=mps_available())

    # -- MPS (GPU-sharing modes mps and mps-gc) ------------------------------------------------
    def _start_mps(self) -> None:
        """Start a private MPS daemon; stage processes inherit its client environment."""
        from horizonserve.runtime.gpu import MpsDaemon, mps_available

        if not mps_available():
            log.warning("MPS mode requested but nvidia-cuda-mps-control is missing: no MPS")
            self.mps_active = False
            return
        daemon = MpsDaemon()
        try:
            daemon.start()
        except Exception as exc:  # MpsError / OSError: run without MPS, say so
            log.warning("MPS daemon did not start (%s): running without MPS", exc)
            self.mps_active = False
            return
        # No CUDA_MPS_ACTIVE_THREAD_PERCENTAGE: below 100 it would override the Green Context
        # split of the mps-gc mode (and the MPS baselines run uncapped by definition).
        env = daemon.client_env()
        self._mps_env = {k: os.environ.get(k) for k in env}
        os.environ.update(env)  # spawned stage processes inherit it
        self._mps = daemon
        self.mps_active = True

    def _stop_mps(self) -> None:
        for key, value in self._mps_env.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        self._mps.stop()
        self._mps = None

    # -- requests ---------------------------------------------------------------------------
    def submit(self, spec: RequestSpec, arrival: float | None = None) -> RequestHandle:
        """Send a request to the shared stage; raises ValueError for an unservable request."""
        if not self._running or self._profiler is None:
            raise PipelineError("pipeline is not running")
        costs = self._profiler.costs(priority=spec.priority, class_name=spec.class_name)
        cls = costs.cls
        downstream: str | None = None
        if cls.path is Path.LONG:
            downstream = SPEECH if cls.priority is Priority.AUDIO else IMAGE
            if downstream not in self._procs:
                raise ValueError(f"class {cls.name!r} needs the {downstream} stage, not running")
        arrival = time.monotonic() if arrival is None else arrival
        record = RequestRecord(
            spec.rid,
            cls.name,
            int(cls.priority),
            cls.path.value,
            cls.metric.value,
            costs.target_s,
            arrival,
        )
        handle = RequestHandle(record)
        with self._lock:
            if spec.rid in self._handles:
                raise ValueError(f"request id {spec.rid!r} is already in flight")
            self._handles[spec.rid] = handle
        self._queues["shared"].put(Admit(spec, arrival, downstream))
        return handle

    def _wait_locked(self, done: Callable[[], bool], timeout: float, what: str) -> None:
        """Wait (holding `_ready`) until `done()`; fail fast on a stage error or death."""
        errors = len(self.errors)
        deadline = time.monotonic() + timeout
        while not done():
            if len(self.errors) > errors:
                raise PipelineError(f"{what}: {self.errors[-1]}")
            dead = [n for n, p in self._procs.items() if p.exitcode is not None]
            if dead:
                raise PipelineError(f"{what}: stage process exited: {dead}")
            left = deadline - time.monotonic()
            if left <= 0:
                raise PipelineError(f"{what}: no answer from the shared stage in {timeout} s")
            self._ready.wait(min(left, 0.1))

    def _wait_idle(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while self.in_flight():
            if time.monotonic() >= deadline:
                raise PipelineError("requests still in flight")
            time.sleep(0.01)

    def set_policy(self, policy: str, timeout: float = 30.0) -> None:
        """Switch the shared stage's policy between runs; waits until nothing is in flight."""
        if self.config is None or not self._running:
            raise PipelineError("pipeline is not running")
        name = PolicyName(policy)
        if self.options.sharing == "auto" and self.device.startswith("cuda"):
            wanted = self._choose_sharing(name.value, True)
            if wanted != self.sharing and not (wanted == MPS_GC and self.sharing == GC):
                raise SharingMismatchError(
                    f"policy {name.value} runs with GPU sharing {wanted}, this pipeline runs "
                    f"{self.sharing}: restart the pipeline"
                )
        self._wait_idle(timeout)
        with self._ready:
            self._policy_ack = None
            self._queues["shared"].put(SetPolicy(name.value))
            self._wait_locked(lambda: self._policy_ack == name.value, timeout, "policy switch")
        self.config = self.config.model_copy(update={"policy": name})

    def abort(self, before: float | None = None, timeout: float = 30.0) -> dict[str, int]:
        """Drop every request that arrived at or before `before` (default: now) in every stage,
        the models staying loaded; returns the requests each stage dropped.

        The shared stage acknowledges first, so whatever it handed off before dropping is
        already on the downstream queues; the downstream stages also drop hand-offs of these
        requests that reach them later. Handles still open finish with the error "aborted".
        """
        if not self._running:
            raise PipelineError("pipeline is not running")
        before = time.monotonic() if before is None else before
        with self._ready:
            self._aborts = {}
            for name in ("shared", *[n for n in self._queues if n != "shared"]):
                self._queues[name].put(Abort(before))
                self._wait_locked(lambda n=name: n in self._aborts, timeout, f"abort ({name})")
            dropped = dict(self._aborts)
        with self._lock:
            stale = [h for h in self._handles.values() if h.record.arrival <= before]
        for handle in stale:
            handle.record.error = "aborted"
            self._retire(handle)
        return dropped

    def probe_decode(
        self, batch: int, context: int, steps: int = 20, timeout: float = 300.0, **kw: Any
    ) -> dict[str, Any]:
        """Decode (and/or prefill) step times of a dummy batch at shared-stage SM levels.

        Keyword arguments are `ProbeDecode` fields (kind, levels, corun, min_seconds, …).
        """
        if not self._running:
            raise PipelineError("pipeline is not running")
        self._wait_idle(timeout)
        with self._ready:
            self._probes.pop("shared", None)
            self._queues["shared"].put(ProbeDecode(batch, context, steps, **kw))
            self._wait_locked(lambda: "shared" in self._probes, timeout, "decode probe")
            return self._probes.pop("shared")

    def probe_load(
        self,
        stage: str,
        seconds: float,
        batch: int,
        levels: tuple[int | None, ...] | None = None,
    ) -> None:
        """Start a synthetic load on a downstream stage (answer: `wait_probe(stage)`)."""
        if stage not in self._procs or stage == "shared":
            raise PipelineError(f"no downstream stage {stage!r} is running")
        with self._ready:
            self._probes.pop(stage, None)
        self._queues[stage].put(ProbeLoad(seconds, batch, levels))

    def stop_probe_load(self, stage: str) -> None:
        self._queues[stage].put(ProbeStop())

    def wait_probe(self, stage: str, timeout: float = 300.0) -> dict[str, Any]:
        with self._ready:
            self._wait_locked(lambda: stage in self._probes, timeout, f"{stage} probe")
            return self._probes.pop(stage)

    def health(self) -> dict[str, Any]:
        stages = {
            name: {"alive": p.is_alive(), "pid": p.pid, "ready": name in self.stage_info}
            for name, p in self._procs.items()
        }
        ok = bool(stages) and all(s["alive"] and s["ready"] for s in stages.values())
        return {"ok": ok and not self.errors, "stages": stages, "errors": self.errors[-5:]}

    def in_flight(self) -> int:
        with self._lock:
            return len(self._handles)

    def wait_trace(self, until: float, timeout: float = 2.0) -> bool:
        """Wait until the shared stage sent trace rows at or after `until` (monotonic)."""
        deadline = time.monotonic() + timeout
        while self.trace_received_t < until:
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.01)
        return True

    def trace_dicts(self) -> list[dict[str, Any]]:
        return [dict(zip(TRACE_COLUMNS, row, strict=True)) for row in list(self.trace)]

    # -- events -----------------------------------------------------------------------------
    def _collect(self) -> None:
        while self._running or not self._events.empty():
            try:
                event = self._events.get(timeout=0.1)
            except (queue.Empty, EOFError, OSError, ValueError):
                if not self._running:
                    return
                continue
            try:
                self._on_event(event)
            except Exception:
                log.exception("bad event %r", event)

    def _on_event(self, ev: Event) -> None:
        if self.on_event is not None:
            self.on_event(ev)
        kind = ev.kind
        if kind == TRACE:
            rows = ev.data["rows"]
            self.trace.extend(rows)
            self.trace_received_t = ev.t
            last = rows[-1]
            pressure = last[4]
            self.metrics.step(last[1], last[2], pressure, last[10])
            return
        if kind in (READY, STOPPED, ERROR, POLICY, PROBE, ABORTED) and ev.rid is None:
            with self._ready:
                if kind == ABORTED:
                    self._aborts[ev.stage] = ev.data["dropped"]
                elif kind == PROBE:
                    self._probes[ev.stage] = ev.data
                elif kind == POLICY:
                    self._policy_ack = ev.data["policy"]
                elif kind == READY:
                    self.stage_info[ev.stage] = ev.data
                elif kind == STOPPED:
                    self._stopped.add(ev.stage)
                    self.stage_info.setdefault(ev.stage, {})["stopped"] = ev.data
                else:
                    self.errors.append(f"{ev.stage}: {ev.data.get('message')}")
                    log.error("stage %s failed: %s", ev.stage, ev.data.get("message"))
                self._ready.notify_all()
            return
        with self._lock:
            handle = self._handles.get(ev.rid or "")
        if handle is None:
            return
        rec = handle.record
        data = ev.data
        if "scheduled" in data and not math.isnan(data["scheduled"]):
            rec.scheduled = data["scheduled"]
        if kind == FIRST:
            if rec.first is None:
                rec.first = ev.t
                rec.info.update({k: v for k, v in data.items() if k != "scheduled"})
                self.metrics.first_response_at(ev.t, rec.class_name, ev.t - rec.arrival, rec.slo_s)
            handle.first.set()
        elif kind == HANDOFF:
            rec.handoff = ev.t
            rec.shared_tpot_s = data.get("tpot")
            rec.shared_tokens = data.get("tokens")
        elif kind == DONE:
            rec.done = ev.t
            if ev.stage == "shared":
                rec.shared_tpot_s = data.get("tpot")
                rec.shared_tokens = data.get("tokens")
            self._retire(handle)
        elif kind == ERROR:
            rec.error = str(data.get("message"))
            self._retire(handle)

    def _retire(self, handle: RequestHandle) -> None:
        with self._lock:
            self._handles.pop(handle.record.rid, None)
        self.finished.append(handle.record)
        handle.first.set()
        handle.done.set()
