"""The front process's view of the pipeline: spawns the stage processes, routes requests in,
collects events out, supervises the stages and shuts everything down.

    Pipeline.start()   control record in /dev/shm (stale ones of killed runs removed first);
                       one spawned process per stage (shared, speech, code2wav, image);
                       waits until every stage reported READY
    Pipeline.submit()  class lookup + arrival stamp, then onto the shared stage's queue;
                       returns a RequestHandle whose events fire at first response / done
    Pipeline.cancel()  drop one request in every stage (client gone, wait timed out)
    Pipeline.abort()   drop every request in flight (and hand-offs still on their way) in all
                       stages without restarting them; their handles finish with an error
    Pipeline.stop()    refuse new work at once, answer the requests in flight, sentinel to
                       every stage, join, kill stragglers, remove the record

Every stage has its own inbound and event queues, so a stage killed mid-message can only
wedge its own queues, which a restart replaces. One reader thread per event queue feeds a
single dispatcher thread that turns stage events into request records, metrics and the
shared stage's step trace.

Supervision (`PipelineOptions.supervise`, on in `horizonserve serve`): a thread checks every
stage each `SUPERVISE_TICK_S` — process exited, or its heartbeat in the control record older
than `hang_timeout_s` (hung or stopped), in the future, or written by another process. A
failed stage is killed and started again after a doubling backoff; meanwhile the classes that
need it are unavailable (`StageUnavailableError`, HTTP 503 with Retry-After) and the other
classes keep serving. Hand-offs from the shared stage, and the talker's code chunks, then pass
through the front (a relay queue per producer and target) so a restarted stage gets fresh
queues.

Speech requests pass two downstream stages: the talker (speech) and code2wav, which makes the
waveform and so their first response; both are needed (`CHAINS`), and a cancel, an abort or a
failure reaches both.
"""

from __future__ import annotations

import contextlib
import logging
import math
import multiprocessing as mp
import os
import queue
import sys
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from horizonserve.runtime.baselines import check_engine, rules_for
from horizonserve.runtime.config import Path, PolicyName, Priority, RequestClass, ServingConfig
from horizonserve.runtime.downstream import PlaybackClock
from horizonserve.runtime.engine.reference.defaults import reference_config
from horizonserve.runtime.engine.reference.gpu_control import (
    GC,
    MPS_GC,
    SHARING_MODES,
    TIMESLICE,
    mps_percentage,
    sharing_for,
    static_shares,
    uses_caps,
    uses_mps,
)
from horizonserve.runtime.engine.reference.history import BoundedHistory, tuple_bytes
from horizonserve.runtime.engine.reference.presets import ENGINE_PROFILE, get_preset
from horizonserve.runtime.engine.reference.protocol import (
    ABORTED,
    CHUNK,
    CODE2WAV,
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
    TOKENS,
    TRACE,
    TRACE_COLUMNS,
    Abort,
    Admit,
    Cancel,
    CodeChunk,
    Event,
    Handoff,
    ProbeDecode,
    ProbeLoad,
    ProbeStop,
    RequestSpec,
    SetPolicy,
)
from horizonserve.runtime.engine.reference.stages import run_stage
from horizonserve.runtime.engine.reference.stages.common import StageConfig
from horizonserve.runtime.engine.reference.supervisor import (
    FaultConfirmation,
    RestartBackoff,
    RestartPolicy,
    stage_fault,
)
from horizonserve.runtime.metrics import MetricsRecorder
from horizonserve.runtime.monitor import ControlRecord, remove_stale, shm_dir, shm_path
from horizonserve.runtime.profiler import RequestProfiler
from horizonserve.runtime.shedding import FrontGate, QueueLimits, front_gate

log = logging.getLogger(__name__)

# Upstream first; a stage's index here is its control-record slot.
DOWNSTREAM_STAGES = (SPEECH, IMAGE, CODE2WAV)
# The downstream stages a long-path request passes, in order (speech: talker, then vocoder).
CHAINS: dict[str, tuple[str, ...]] = {SPEECH: (SPEECH, CODE2WAV), IMAGE: (IMAGE,)}
# Who hands work on to whom (the shared stage: Handoff; the talker: CodeChunk).
FEEDS: dict[str, tuple[str, ...]] = {"shared": (SPEECH, IMAGE), SPEECH: (CODE2WAV,)}
MAX_RID_CHARS = 128  # request ids longer than this are refused (memory, logs)
SUPERVISE_TICK_S = 0.1
RECORD_PREFIX = "horizonserve-control-"

# Stage states (supervision).
STARTING, RUNNING, DOWN = "starting", "running", "down"

# Why a request ended without an answer; the HTTP layer maps these to status codes.
REJECTED = "rejected"  # a stage refused the request itself (400)
UNAVAILABLE = "unavailable"  # a stage it needs failed or the pipeline stops (503)
CANCELLED = "cancelled"  # the client went away (499 in the logs; nobody reads the reply)
TIMED_OUT = "timeout"  # no first response within the client's timeout (504)


@dataclass
class PipelineOptions:
    preset: str = "tiny"
    profile: str = ENGINE_PROFILE  # deploy profile of the stage limits ("stock", "tuned")
    device: str = "auto"  # auto: cuda:0 when a GPU is visible, else cpu
    policy: str = "horizon"
    config: ServingConfig | None = None  # default: reference classes + default ladder
    downstream: tuple[str, ...] = DOWNSTREAM_STAGES  # "speech" brings code2wav along
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
    history: int = 100_000  # finished request records and trace rows kept (at most)
    history_bytes: int = 64 * 2**20  # ... and their estimated bytes (half each)
    # Supervision (serving): restart a dead or hung stage; off for benchmarks and calibration,
    # whose probes keep a stage busy without heartbeats and whose results a restart would void.
    supervise: bool = False
    hang_timeout_s: float = 5.0  # a ready stage without a heartbeat this long has failed
    restart: RestartPolicy = field(default_factory=RestartPolicy)
    stop_timeout_s: float = 10.0  # stages not gone by then are killed
    model_name: str = ""  # the `model_name` metrics label (default: reference-<preset>)
    # vLLM's queue limits under the shed presets (default: `runtime.shedding.config_limits`).
    queue_limits: QueueLimits | None = None
    # vllm-omni-current: the talker's window K (None: its places); mps-static: the shared
    # stage's SMs (None: `runtime.baselines.static_share`). See `runtime.baselines`.
    window: int | None = None
    static_share: int | None = None


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
    downstream: str | None = None  # the downstream stage of a long-path request
    failure: str | None = None  # REJECTED / UNAVAILABLE / CANCELLED / TIMED_OUT with `error`
    retry_after_s: float | None = None  # UNAVAILABLE: when to try again
    playback: PlaybackClock | None = None  # speech: the listener's playback, first chunk on

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

    @property
    def stage(self) -> str:
        """The stage holding the request now (by what the front has seen)."""
        if self.downstream is not None and self.handoff is not None:
            return self.downstream
        return "shared"

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


def record_bytes(rec: RequestRecord) -> int:
    """Estimated memory of a finished record (object, id, error, info)."""
    n = sys.getsizeof(rec) + sys.getsizeof(rec.rid) + 400  # floats, short strings, the dict
    if rec.error:
        n += sys.getsizeof(rec.error)
    return n + 120 * len(rec.info)


#: A listener gets (event kind, event data) from the dispatcher thread; it must not block.
Listener = Callable[[str, dict[str, Any]], None]


class RequestHandle:
    __slots__ = ("done", "first", "listener", "record")

    def __init__(self, record: RequestRecord, listener: Listener | None = None) -> None:
        self.record = record
        self.first = threading.Event()
        self.done = threading.Event()
        self.listener = listener

    def wait_first(self, timeout: float | None = None) -> bool:
        return self.first.wait(timeout)

    def wait_done(self, timeout: float | None = None) -> bool:
        return self.done.wait(timeout)

    def notify(self, kind: str, data: dict[str, Any]) -> None:
        if self.listener is not None:
            try:
                self.listener(kind, data)
            except Exception:  # a listener's bug must not stop the dispatcher
                log.exception("request listener failed")


class PipelineError(RuntimeError):
    pass


class SharingMismatchError(PipelineError):
    """The new policy needs another GPU-sharing mode: the stages must be restarted."""


class StageUnavailableError(PipelineError):
    """A stage the request's class needs is down or restarting; try again later."""

    def __init__(self, stage: str, class_name: str, retry_after_s: float, reason: str) -> None:
        super().__init__(f"class {class_name!r} is unavailable: {stage} stage {reason}")
        self.stage = stage
        self.class_name = class_name
        self.retry_after_s = retry_after_s


class QueueFullError(StageUnavailableError):
    """Shed by vLLM's queue limits (the shed presets, `runtime.shedding`): HTTP 503."""

    def __init__(self, class_name: str, reason: str) -> None:
        super().__init__("shared", class_name, 1.0, f"refused it by its queue limits ({reason})")
        self.reason = reason


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


def downstream_of(cls: RequestClass) -> str | None:
    """The downstream path a class's requests take, named by its first stage (None: short
    path)."""
    if cls.path is not Path.LONG:
        return None
    return SPEECH if cls.priority is Priority.AUDIO else IMAGE


def stages_of(downstream: str | None) -> tuple[str, ...]:
    """Every stage a request on this downstream path needs, upstream first."""
    return ("shared", *CHAINS.get(downstream or "", ()))


def downstream_stages(names: tuple[str, ...]) -> tuple[str, ...]:
    """The downstream stages to run for `names`, each path's whole chain (speech: code2wav
    too), in `DOWNSTREAM_STAGES` order; ValueError for an unknown name or a stage without the
    one that feeds it."""
    for name in names:
        if name not in DOWNSTREAM_STAGES:
            known = ", ".join(DOWNSTREAM_STAGES)
            raise ValueError(f"downstream: unknown stage {name!r}; use {known}")
    chosen = {s for name in names for s in CHAINS.get(name, (name,))}
    for name in chosen:
        feeders = [f for f, targets in FEEDS.items() if name in targets and f != "shared"]
        if feeders and not chosen.intersection(feeders):
            raise ValueError(f"downstream: {name} needs the {feeders[0]} stage that feeds it")
    return tuple(s for s in DOWNSTREAM_STAGES if s in chosen)


@dataclass
class StageSlot:
    """Supervision state of one stage (the process, its queues and its history)."""

    name: str
    proc: Any = None
    in_q: Any = None
    events: Any = None
    gen: int = 0
    state: str = STARTING
    started: float = 0.0  # monotonic s of the last spawn
    ready_ns: int = 0  # monotonic ns when the current process reported READY
    restart_at: float = 0.0
    reason: str | None = None  # why it is down
    restarts: int = 0
    startup_s: float = 5.0  # last measured spawn → READY (for Retry-After)
    backoff: RestartBackoff = field(default_factory=RestartBackoff)
    faults: deque[dict[str, Any]] = field(default_factory=lambda: deque(maxlen=20))
    confirm: FaultConfirmation = field(default_factory=FaultConfirmation)  # one bad read ≠ dead


class Pipeline:
    def __init__(self, options: PipelineOptions | None = None) -> None:
        self.options = opts = options or PipelineOptions()
        self.device = ""
        self.config: ServingConfig | None = None
        self.metrics = MetricsRecorder(model_name=opts.model_name or f"reference-{opts.preset}")
        self.stage_info: dict[str, dict[str, Any]] = {}
        half = max(1, opts.history_bytes // 2)
        self.trace: BoundedHistory[tuple[Any, ...]] = BoundedHistory(
            half, tuple_bytes, opts.history
        )
        self.trace_received_t = 0.0  # stage-side send time of the newest trace batch
        self.finished: BoundedHistory[RequestRecord] = BoundedHistory(
            half, record_bytes, opts.history
        )
        self.errors: list[str] = []  # stage-level failures (the newest 100)
        self._error_count = 0
        self._handles: dict[str, RequestHandle] = {}
        self._lock = threading.Lock()
        self._slots: dict[str, StageSlot] = {}
        self._procs: dict[str, Any] = {}
        self._queues: dict[str, Any] = {}
        # producer -> target -> relay queue of its hand-offs (supervised pipelines)
        self._relay: dict[str, dict[str, Any]] = {}
        self.downstream: tuple[str, ...] = ()  # the downstream stages run (downstream_stages)
        self._inbox: queue.Queue[tuple[str, int, Event] | None] = queue.Queue()
        self._ctx: Any = None
        self._base: StageConfig | None = None
        self._record: ControlRecord | None = None
        self._profiler: RequestProfiler | None = None
        self._collector: threading.Thread | None = None
        self._supervisor: threading.Thread | None = None
        self._pumps: list[threading.Thread] = []
        self._running = False
        self._stopping = False
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
        self._pids: dict[str, int] = {}  # pids of the last started stages (kept after stop)
        self.supervisor_tick_t = 0.0  # monotonic s of the supervisor's last tick
        self.record_repairs = 0  # control-record headers rewritten after corruption
        self._samples_per_second = 1.0
        self._kv_slots = 0  # shared-stage KV slots (kv_cache_usage_perc's denominator)
        self._gate: FrontGate | None = None  # the shed presets' queue limits
        self._queue_record: ControlRecord | None = None  # DTPS's downstream queue depths
        self.static_shares: dict[str, int] = {}  # mps-static: stage -> its fixed SMs
        self._total_sms = 0  # the device's SMs (the ladder's total on a CPU)

    @property
    def stage_pids(self) -> list[int]:
        return list(self._pids.values())

    # -- lifetime ---------------------------------------------------------------------------
    def start(self) -> Pipeline:
        opts = self.options
        self.downstream = downstream_stages(opts.downstream)
        self.device = resolve_device(opts.device)
        cuda = self.device.startswith("cuda")
        policy = opts.policy or (opts.config.policy.value if opts.config else "horizon")
        check_engine(policy, "reference")
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
        self.metrics.use_slo_buckets(config.slo.target_s(c.name) for c in config.slo.classes)
        self._profiler = RequestProfiler(config.slo, config.control.u_guard)
        preset = get_preset(opts.preset, opts.profile, config.pipeline, **opts.limits)
        self._kv_slots = preset.thinker_limits.max_batch
        # mps-static's fixed SMs per stage process (checked before anything is created).
        self._total_sms = sms or config.ladder.total
        stages = ("shared", *self.downstream)
        try:
            self.static_shares = static_shares(
                policy, config.pipeline, self._total_sms, stages, opts.static_share
            )
        except ValueError:
            if self._mps is not None:  # nothing else was started yet
                self._stop_mps()
            raise
        self._gate = front_gate(policy, config, self._kv_slots, opts.queue_limits)
        self._samples_per_second = float(
            preset.code2wav.samples_per_code * preset.codes_per_audio_second
        )

        remove_stale(shm_dir(), (RECORD_PREFIX,))  # records of front processes killed earlier
        name = f"{RECORD_PREFIX}{os.getpid()}-{uuid.uuid4().hex[:8]}"
        self._record = ControlRecord.create(shm_path(name), n_slots=len(DOWNSTREAM_STAGES))
        # Queue depths of the stages the shared stage feeds (vllm-omni-current's DTPS); a
        # record of its own, so the activity the control reads stays what it was.
        self._queue_record = ControlRecord.create(
            shm_path(f"{name}-queues"), n_slots=len(DOWNSTREAM_STAGES)
        )
        # Ladders are pre-allocated when the sharing mode caps; a policy that does not throttle
        # (set_policy within the same mode, e.g. calibration's solo runs) never activates them.
        capped = cuda and uses_caps(self.sharing)
        log.info("GPU sharing %s (policy %s, ladders %s)", self.sharing, policy, capped)
        self._base = StageConfig(
            preset=opts.preset,
            profile=opts.profile,
            pipeline=config.pipeline,
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
            window=opts.window,
        )
        self._ctx = mp.get_context("spawn")
        self._running = True
        self._stopping = False
        self._collector = threading.Thread(target=self._collect, name="events", daemon=True)
        self._collector.start()
        # Consumers before producers: a stage's targets have their queues when it starts.
        for name in (*reversed(self.downstream), "shared"):
            self._slots[name] = StageSlot(name)
            self._spawn(name)
        try:
            self._wait_ready(opts.startup_timeout_s)
        except BaseException:
            self.stop()
            raise
        if opts.supervise:
            self._supervisor = threading.Thread(
                target=self._supervise, name="supervisor", daemon=True
            )
            self._supervisor.start()
        return self

    def _spawn(self, name: str) -> None:
        """Start (or restart) stage `name` with fresh queues."""
        assert self._base is not None and self._ctx is not None
        ctx, opts, slot = self._ctx, self.options, self._slots[name]
        slot.gen += 1
        slot.in_q, slot.events = ctx.Queue(), ctx.Queue()
        slot.state, slot.started, slot.ready_ns = STARTING, time.monotonic(), 0
        cfg = self._base
        if name != "shared":
            index = DOWNSTREAM_STAGES.index(name)
            cfg = replace(cfg, downstream_slot=index, seed=opts.seed + index + 1)
        if self._queue_record is not None and (name == "shared" or name in FEEDS["shared"]):
            cfg = replace(cfg, queue_record_path=str(self._queue_record.path))
        share = self.static_shares.get(name)
        if share is not None:  # mps-static: this process's fixed SMs (stages.common)
            pct = mps_percentage(share, self._total_sms)
            cfg = replace(cfg, sm_share=share, mps_percentage=pct)
        args: tuple[Any, ...] = (name, cfg, slot.in_q, slot.events)
        feeds = [t for t in FEEDS.get(name, ()) if t in self._slots]
        if feeds and opts.supervise:
            targets = self._relay[name] = {t: ctx.Queue() for t in feeds}
            for target, q in targets.items():
                self._pump(q, name, slot.gen, lambda m, t=target: self._forward(t, m))
            args += (dict(targets),)
        elif feeds:
            args += ({t: self._slots[t].in_q for t in feeds},)
        slot.proc = ctx.Process(
            target=run_stage, args=args, name=f"horizonserve-{name}", daemon=True
        )
        self._procs[name] = slot.proc
        self._queues[name] = slot.in_q
        gen = slot.gen
        self._pump(slot.events, name, gen, lambda ev: self._inbox.put((name, gen, ev)))
        slot.proc.start()
        self._pids[name] = slot.proc.pid

    def _pump(self, q: Any, name: str, gen: int, sink: Callable[[Any], None]) -> None:
        """A reader thread: `q` → `sink` until the stage's generation changes (or the pipeline
        stops) and `q` is empty."""

        def loop() -> None:
            while True:
                try:
                    item = q.get(timeout=0.1)
                except queue.Empty:
                    if not self._running or self._slots[name].gen != gen:
                        return
                    continue
                except (EOFError, OSError, ValueError):
                    return
                try:
                    sink(item)
                except Exception:
                    log.exception("pump %s: bad item %r", name, item)

        thread = threading.Thread(target=loop, name=f"pump-{name}-{gen}", daemon=True)
        thread.start()
        self._pumps = [t for t in self._pumps if t.is_alive()]
        self._pumps.append(thread)

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

    def refuse_new(self) -> None:
        """Refuse new requests from now on and answer those in flight (503): the first step
        of a shutdown, safe to call from a signal handler's thread."""
        self._stopping = True
        self._fail_where(lambda _rec: True, "pipeline stopped", UNAVAILABLE, None)

    def stop(self, timeout: float | None = None) -> None:
        """Stop every stage; never leaves a stage process behind."""
        if not self._procs:
            return
        self.refuse_new()
        if self._supervisor is not None:
            self._supervisor.join(2.0)
        timeout = self.options.stop_timeout_s if timeout is None else timeout
        for q in self._queues.values():
            with contextlib.suppress(ValueError, OSError):
                q.put(None)
        deadline = time.monotonic() + timeout
        for p in self._procs.values():
            p.join(max(0.0, deadline - time.monotonic()))
        for p in self._procs.values():
            if p.is_alive():
                log.warning("stage process %s did not stop; killing it", p.name)
                p.kill()
                p.join(5.0)
        self._running = False
        for t in self._pumps:
            t.join(2.0)
        self._inbox.put(None)
        if self._collector is not None:
            self._collector.join(5.0)
        for slot in self._slots.values():
            _close_queues(slot.in_q, slot.events)
        for relay in self._relay.values():
            _close_queues(*relay.values())
        for rec in (self._record, self._queue_record):
            if rec is not None:
                rec.close()
                rec.unlink()
        self._record = self._queue_record = None
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

    # -- supervision ------------------------------------------------------------------------
    def _supervise(self) -> None:
        while self._running and not self._stopping:
            try:
                self._supervise_once(time.monotonic())
            except Exception:  # the supervisor must outlive any surprise
                log.exception("supervisor tick failed")
            self.supervisor_tick_t = time.monotonic()
            time.sleep(SUPERVISE_TICK_S)

    def _supervise_once(self, now: float) -> None:
        record = self._record
        if record is None:
            return
        problem = record.header_problem()
        if problem is not None:
            log.error("control record %s: %s; rewriting it", record.path, problem)
            record.repair_header()
            self.record_repairs += 1
        hang_ns = int(self.options.hang_timeout_s * 1e9)
        for name, slot in self._slots.items():
            if self._stopping:
                return
            if slot.state == RUNNING:
                fault = self._fault(slot, hang_ns)
                if slot.confirm.confirmed(fault, slot.proc.exitcode is not None, now):
                    self._stage_failed(slot, fault or "failed", now)
            elif slot.state == STARTING:
                if slot.proc.exitcode is not None:
                    self._stage_failed(slot, "exited during start-up", now)
                elif now - slot.started > self.options.startup_timeout_s:
                    self._stage_failed(slot, "not ready in time", now)
            elif now >= slot.restart_at:
                slot.restarts += 1
                log.warning("restarting the %s stage (restart %d)", name, slot.restarts)
                self._spawn(name)

    def _fault(self, slot: StageSlot, hang_ns: int) -> str | None:
        """Why a ready stage counts as failed now (supervisor.stage_fault), or None."""
        beat, writer = self._beat(slot.name)
        return stage_fault(
            exitcode=slot.proc.exitcode,
            pid=slot.proc.pid,
            beat_ns=beat,
            writer_pid=writer,
            ready_ns=slot.ready_ns,
            now_ns=time.monotonic_ns(),  # after the read: a stuck group's read takes time
            hang_ns=hang_ns,
        )

    def _beat(self, name: str) -> tuple[int, int]:
        """(heartbeat ns, writer pid or 0) of a stage from the control record."""
        assert self._record is not None
        if name == "shared":
            return self._record.read_alive_ns(), 0
        activity = self._record.read_downstream(DOWNSTREAM_STAGES.index(name))
        return activity.heartbeat_ns, activity.writer_pid

    def _stage_failed(self, slot: StageSlot, reason: str, now: float) -> None:
        name = slot.name
        log.error("%s stage failed: %s", name, reason)
        with self._lock:
            slot.state, slot.reason = DOWN, reason
            slot.restart_at = slot.backoff.failed(now)
            self.stage_info.pop(name, None)
        slot.faults.append({"t": now, "reason": reason, "restart_at": slot.restart_at})
        self.metrics.stage_restarted(name)
        proc = slot.proc
        if proc.is_alive():
            proc.kill()  # also ends a stopped (SIGSTOP) process
        proc.join(2.0)
        if self._record is not None and not proc.is_alive():
            # The successor is judged on its own beats, not on what the dead one left.
            if name == "shared":
                self._record.clear_alive()
            else:
                self._record.reset_slot(DOWNSTREAM_STAGES.index(name))
        _close_queues(slot.in_q)
        retry = self._retry_after(slot, now)
        message = f"{name} stage failed ({reason}); restarting"
        if name == "shared":
            self._fail_where(lambda r: r.stage == "shared", message, UNAVAILABLE, retry)
            return
        path = next(p for p, chain in CHAINS.items() if name in chain)
        hit = self._fail_where(lambda r: r.downstream == path, message, UNAVAILABLE, retry)
        for other in stages_of(path):  # the stages before and after it drop them too
            peer = self._slots.get(other)
            if hit and peer is not None and peer is not slot and peer.state == RUNNING:
                peer.in_q.put(Cancel(tuple(hit)))

    def _retry_after(self, slot: StageSlot, now: float) -> float:
        return max(1.0, slot.restart_at - now + slot.startup_s)

    def degraded(self) -> dict[str, str]:
        """Classes that cannot be served now, with the reason."""
        if self.config is None:
            return {}
        out: dict[str, str] = {}
        for cls in self.config.slo.classes:
            for stage in stages_of(downstream_of(cls)):
                slot = self._slots.get(stage)
                if slot is None:
                    out[cls.name] = f"the {stage} stage is not run by this server"
                elif slot.state != RUNNING:
                    out[cls.name] = f"the {stage} stage is {slot.state} ({slot.reason})"
                    break
        return out

    # -- requests ---------------------------------------------------------------------------
    def submit(
        self,
        spec: RequestSpec,
        arrival: float | None = None,
        listener: Listener | None = None,
    ) -> RequestHandle:
        """Send a request to the shared stage; raises ValueError for an unservable request,
        StageUnavailableError while a stage it needs is down, PipelineError when stopped."""
        if not self._running or self._stopping or self._profiler is None:
            raise PipelineError("pipeline is not running")
        if not spec.rid or len(spec.rid) > MAX_RID_CHARS:
            raise ValueError(f"id: 1 to {MAX_RID_CHARS} characters")
        costs = self._profiler.costs(priority=spec.priority, class_name=spec.class_name)
        cls = costs.cls
        downstream = downstream_of(cls)
        if downstream is not None and downstream not in self._procs:
            raise ValueError(f"class {cls.name!r} needs the {downstream} stage, not running")
        now = time.monotonic()
        for stage in stages_of(downstream):
            slot = self._slots.get(stage)
            if slot is not None and slot.state != RUNNING:
                reason = f"is {slot.state}" + (f" ({slot.reason})" if slot.reason else "")
                self.metrics.rejected(cls.name, "unavailable")
                raise StageUnavailableError(stage, cls.name, self._retry_after(slot, now), reason)
        arrival = now if arrival is None else arrival
        record = RequestRecord(
            spec.rid,
            cls.name,
            int(cls.priority),
            cls.path.value,
            cls.metric.value,
            costs.target_s,
            arrival,
            downstream=downstream,
        )
        handle = RequestHandle(record, listener)
        shed = None
        with self._lock:
            if spec.rid in self._handles:
                raise ValueError(f"request id {spec.rid!r} is already in flight")
            if self._gate is not None:
                shed = self._gate.admit(spec.rid, spec.input_tokens)
            if shed is None:
                self._handles[spec.rid] = handle
        if shed is not None:  # never served: a miss, judged at its deadline like every request
            self.metrics.rejected(cls.name, shed)
            self.metrics.expect((spec.rid, arrival), cls.name, arrival, costs.target_s)
            raise QueueFullError(cls.name, shed)
        self.metrics.admitted(
            cls.name,
            key=(spec.rid, arrival),  # judged at its deadline if no first response by then
            arrival=arrival,
            slo_s=costs.target_s,
            prompt_tokens=spec.input_tokens,
        )
        self._queues["shared"].put(Admit(spec, arrival, downstream))
        return handle

    def cancel(self, rid: str, reason: str = "cancelled", failure: str = CANCELLED) -> bool:
        """Drop request `rid` in every stage (its handle finishes with `reason`); False when
        it is not in flight (finished already)."""
        with self._lock:
            handle = self._handles.get(rid)
        if handle is None:
            return False
        rec = handle.record
        # Cancel goes out before the handle retires: a request reusing the id afterwards is
        # admitted behind it on the shared queue (and matches no (id, arrival) anyway).
        for stage in stages_of(rec.downstream):
            slot = self._slots.get(stage)
            if slot is not None and slot.state == RUNNING:
                slot.in_q.put(Cancel(((rid, rec.arrival),)))
        rec.error, rec.failure = reason, failure
        return self._retire(handle)

    def _forward(self, target: str, msg: Handoff | CodeChunk) -> None:
        """Relay a hand-off or code chunk to the current `target` stage (supervised)."""
        with self._lock:
            handle = self._handles.get(msg.rid)
        if handle is None or handle.record.arrival != msg.arrival:
            return  # cancelled or failed meanwhile: no downstream work for it
        slot = self._slots[target]
        if slot.state != RUNNING:
            rec = handle.record
            rec.error, rec.failure = f"{target} stage is {slot.state}", UNAVAILABLE
            rec.retry_after_s = self._retry_after(slot, time.monotonic())
            self._retire(handle)
            return
        slot.in_q.put(msg)

    def _fail_where(
        self,
        hit: Callable[[RequestRecord], bool],
        message: str,
        failure: str,
        retry_after_s: float | None,
    ) -> list[tuple[str, float]]:
        """Finish every in-flight request `hit` selects with an error; returns their
        (id, arrival)."""
        with self._lock:
            handles = [h for h in self._handles.values() if hit(h.record)]
        failed = []
        for handle in handles:
            rec = handle.record
            rec.error, rec.failure, rec.retry_after_s = message, failure, retry_after_s
            if self._retire(handle):
                failed.append((rec.rid, rec.arrival))
        return failed

    def _wait_locked(self, done: Callable[[], bool], timeout: float, what: str) -> None:
        """Wait (holding `_ready`) until `done()`; fail fast on a stage error or death."""
        errors = self._error_count
        deadline = time.monotonic() + timeout
        while not done():
            if self._error_count > errors:
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
        check_engine(name, "reference")
        if rules_for(name).static_share != rules_for(self.config.policy).static_share:
            # mps-static's shares are set when a stage process starts (its MPS client)
            raise SharingMismatchError(
                f"policy {name.value} and {self.config.policy.value} differ in fixed SM shares "
                "per stage process (mps-static): restart the pipeline"
            )
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
            for stage, q in self._queues.items():  # downstream stages: their admission rule
                if stage != "shared":
                    q.put(SetPolicy(name.value))
            self._queues["shared"].put(SetPolicy(name.value))
            self._wait_locked(lambda: self._policy_ack == name.value, timeout, "policy switch")
        self.config = self.config.model_copy(update={"policy": name})
        self._gate = front_gate(name.value, self.config, self._kv_slots, self.options.queue_limits)

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
            for name in ("shared", *self.downstream):  # producers before their consumers
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
        """Stages, degraded classes, liveness and readiness (see `live` / `ready`)."""
        stages: dict[str, Any] = {}
        for name, slot in self._slots.items():
            p = slot.proc
            info: dict[str, Any] = {
                "alive": p.is_alive() if p is not None else False,
                "pid": p.pid if p is not None else None,
                "ready": name in self.stage_info,
                "state": slot.state,
                "restarts": slot.restarts,
            }
            if self._record is not None and slot.state == RUNNING:
                beat = self._beat(name)[0]
                now_ns = time.monotonic_ns()
                info["heartbeat_age_s"] = round((now_ns - max(beat, slot.ready_ns)) / 1e9, 3)
            if slot.reason and slot.state != RUNNING:
                info["reason"] = slot.reason
            if slot.faults:
                info["last_fault"] = slot.faults[-1]["reason"]
            stages[name] = info
        ok = bool(stages) and all(s["alive"] and s["ready"] for s in stages.values())
        ok = ok and self._running and not self._stopping
        if not self.options.supervise:
            ok = ok and not self.errors
        return {
            "ok": ok,
            "live": self.live(),
            "ready": self.ready(),
            "degraded": self.degraded(),
            "stages": stages,
            "errors": self.errors[-5:],
            "record_repairs": self.record_repairs,
        }

    def live(self) -> bool:
        """Liveness: False only when this process cannot recover by itself (restart the pod).

        Supervised: the supervisor ticks and no stage exhausted its restart budget.
        Unsupervised: every stage process runs and beats in the control record.
        """
        if not self._running or self._stopping:
            return False
        now = time.monotonic()
        if self.options.supervise:
            if now - self.supervisor_tick_t > max(2.0, 20 * SUPERVISE_TICK_S):
                return False
            return not any(s.backoff.exhausted(now) for s in self._slots.values())
        hang_ns = int(self.options.hang_timeout_s * 1e9)
        return all(s.ready_ns and self._fault(s, hang_ns) is None for s in self._slots.values())

    def ready(self) -> bool:
        """Readiness: at least one class can be served now (the others: `degraded()`)."""
        if not self._running or self._stopping or self.config is None:
            return False
        return len(self.degraded()) < len(self.config.slo.classes)

    def stage_depths(self) -> dict[str, int]:
        """Requests held by each stage now (front-side accounting)."""
        depth = dict.fromkeys(self._slots, 0)
        with self._lock:
            for handle in self._handles.values():
                stage = handle.record.stage
                depth[stage] = depth.get(stage, 0) + 1
        return depth

    def refresh_metrics(self, now: float | None = None) -> None:
        """Bring the scrape-time gauges up to date (attainment window, depths, in flight)."""
        now = time.monotonic() if now is None else now
        self.metrics.refresh_attainment(now)
        self.metrics.set_stage_depths(self.stage_depths())
        self.metrics.set_stage_up({n: s.state == RUNNING for n, s in self._slots.items()})

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
        while True:
            item = self._inbox.get()
            if item is None:
                return
            name, gen, event = item
            slot = self._slots.get(name)
            try:
                self._on_event(event, slot is not None and slot.gen == gen)
            except Exception:
                log.exception("bad event %r", event)

    def _on_event(self, ev: Event, current: bool = True) -> None:
        if self.on_event is not None:
            self.on_event(ev)
        kind = ev.kind
        if kind == TRACE:
            rows = ev.data["rows"]
            self.trace.extend(rows)
            self.trace_received_t = ev.t
            last = rows[-1]
            pressure = last[4]
            kv = last[5] / self._kv_slots if self._kv_slots else None  # decode batch / slots
            self.metrics.step(last[1], last[2], pressure, last[10], kv)
            return
        if kind == TOKENS:
            with self._lock:
                targets = [(self._handles.get(rid), tok) for rid, tok in ev.data["tokens"]]
            for handle, tok in targets:
                if handle is not None:
                    handle.notify(TOKENS, {"token": tok})
            return
        if kind in (READY, STOPPED, ERROR, POLICY, PROBE, ABORTED) and ev.rid is None:
            if not current:
                return  # from a stage process that was replaced
            with self._ready:
                if kind == ABORTED:
                    self._aborts[ev.stage] = ev.data["dropped"]
                elif kind == PROBE:
                    self._probes[ev.stage] = ev.data
                elif kind == POLICY:
                    self._policy_ack = ev.data["policy"]
                elif kind == READY:
                    self.stage_info[ev.stage] = ev.data
                    slot = self._slots.get(ev.stage)
                    if slot is not None:
                        slot.state, slot.reason = RUNNING, None
                        slot.ready_ns = time.monotonic_ns()
                        slot.startup_s = time.monotonic() - slot.started
                        if slot.restarts:
                            log.warning("%s stage ready again after restart", ev.stage)
                elif kind == STOPPED:
                    self._stopped.add(ev.stage)
                    self.stage_info.setdefault(ev.stage, {})["stopped"] = ev.data
                else:
                    self._error_count += 1
                    self.errors.append(f"{ev.stage}: {ev.data.get('message')}")
                    del self.errors[:-100]
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
        gate = self._gate
        if kind == FIRST:
            if gate is not None:
                gate.prefilled(rec.rid)  # a short-path first token (or a long path's output)
            if rec.first is None:
                rec.first = ev.t
                rec.info.update({k: v for k, v in data.items() if k != "scheduled"})
                if "samples" in data:
                    self._playback(rec, ev.t, data["samples"])
                self.metrics.first_response_at(
                    ev.t, rec.class_name, ev.t - rec.arrival, rec.slo_s, key=(rec.rid, rec.arrival)
                )
            handle.first.set()
        elif kind == CHUNK:
            self._playback(rec, ev.t, data["samples"])
        elif kind == HANDOFF:
            if gate is not None:
                gate.finished(rec.rid)  # it left the shared stage
            rec.handoff = ev.t
            rec.shared_tpot_s = data.get("tpot")
            rec.shared_tokens = data.get("tokens")
            if data.get("preempted"):
                rec.info["preempted"] = data["preempted"]
        elif kind == DONE:
            rec.done = ev.t
            if ev.stage == "shared":
                rec.shared_tpot_s = data.get("tpot")
                rec.shared_tokens = data.get("tokens")
                if data.get("preempted"):
                    rec.info["preempted"] = data["preempted"]
            self._retire(handle)
            return
        elif kind == ERROR:
            rec.error, rec.failure = str(data.get("message")), REJECTED
            self._retire(handle)
            return
        handle.notify(kind, data)

    def _playback(self, rec: RequestRecord, t: float, samples: int) -> None:
        """The listener's playback of a speech answer (the control core's PlaybackClock):
        audio plays from the first chunk on; a chunk arriving after the audio before it ran
        out is an underrun. `samples` is the total delivered so far."""
        clock = rec.playback
        if clock is None:
            clock = rec.playback = PlaybackClock()
        if clock.on_chunk(t, samples / self._samples_per_second - clock.generated_s):
            self.metrics.underrun(rec.class_name)
            rec.info["underruns"] = clock.underruns

    def _retire(self, handle: RequestHandle) -> bool:
        """Finish a request once (True the first time): history, metrics, waiters."""
        rec = handle.record
        with self._lock:
            if self._handles.get(rec.rid) is not handle:
                return False
            del self._handles[rec.rid]
        if self._gate is not None:
            self._gate.finished(rec.rid)
        self.finished.append(rec)
        self.metrics.finished(
            rec.class_name,
            rec.failure,
            rec.done,
            rec.arrival,
            key=(rec.rid, rec.arrival),
            now=time.monotonic(),
            record=rec,
        )
        handle.first.set()
        handle.done.set()
        handle.notify(DONE if rec.failure is None else ERROR, {})
        return True


def _close_queues(*qs: Any) -> None:
    """Close queues without waiting for their feeder threads (the reader may be dead)."""
    for q in qs:
        if q is None:
            continue
        with contextlib.suppress(Exception):
            q.cancel_join_thread()
            q.close()
