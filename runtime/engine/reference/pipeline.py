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
shared stage's step trace. Supervision (`PipelineOptions.supervise`, on in `horizonserve
serve`) restarts a dead or hung stage while the classes that need it are unavailable and the
other classes keep serving.

Speech requests pass two downstream stages: the talker (speech) and code2wav, which makes the
waveform and so their first response; both are needed (`CHAINS`), and a cancel, an abort or a
failure reaches both.

`Pipeline` is this module's lifetime (start, stop) and state; each job is a part of its own,
which `Pipeline` combines:

    stage_graph        which stages run and who feeds whom (CHAINS, FEEDS)
    stage_processes    stage slots, control records, spawning, event pumps
    stage_supervision  the supervisor thread: fault detection, failing requests, restarts
    stage_events       the dispatcher thread: trace, tokens, stage state, acknowledgements
    request_routing    submit, cancel, relayed hand-offs, request results, retiring
    stage_commands     policy switching, abort, calibration probes (commands with an answer)
    pipeline_status    health, liveness, readiness, degraded classes, metrics gauges
    gpu_sharing        the device, the GPU-sharing mode and the MPS daemon
    request_records    RequestRecord, RequestHandle and the failure kinds
    errors             PipelineError and the errors derived from it

Locking: `_lock` guards `_handles` and the front gate's admission; `_ready`, a condition on
the same lock, guards stage state (`stage_info`, slot states on failure, `_stopped`) and the
command acknowledgements (`_policy_ack`, `_aborts`, `_probes`), and wakes their waiters.
"""

from __future__ import annotations

import contextlib
import logging
import multiprocessing as mp
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from horizonserve.runtime.baselines import check_engine
from horizonserve.runtime.config import PolicyName, ServingConfig
from horizonserve.runtime.engine.reference.defaults import reference_config
from horizonserve.runtime.engine.reference.errors import (
    PipelineError,
    QueueFullError,
    SharingMismatchError,
    StageUnavailableError,
)
from horizonserve.runtime.engine.reference.gpu_control import (
    GC,
    MPS_GC,
    TIMESLICE,
    static_shares,
    uses_mps,
)
from horizonserve.runtime.engine.reference.gpu_sharing import (
    GpuSharing,
    device_sms,
    resolve_device,
)
from horizonserve.runtime.engine.reference.history import BoundedHistory, tuple_bytes
from horizonserve.runtime.engine.reference.pipeline_status import PipelineStatus
from horizonserve.runtime.engine.reference.presets import ENGINE_PROFILE, get_preset
from horizonserve.runtime.engine.reference.protocol import Event
from horizonserve.runtime.engine.reference.request_records import (
    CANCELLED,
    MAX_RID_CHARS,
    REJECTED,
    TIMED_OUT,
    UNAVAILABLE,
    Listener,
    RequestHandle,
    RequestRecord,
    record_bytes,
)
from horizonserve.runtime.engine.reference.request_routing import RequestRouting
from horizonserve.runtime.engine.reference.stage_commands import StageCommands
from horizonserve.runtime.engine.reference.stage_events import StageEvents
from horizonserve.runtime.engine.reference.stage_graph import (
    CHAINS,
    DOWNSTREAM_STAGES,
    FEEDS,
    downstream_of,
    downstream_stages,
    stages_of,
)
from horizonserve.runtime.engine.reference.stage_processes import (
    DOWN,
    RECORD_PREFIX,
    RUNNING,
    STARTING,
    StageProcesses,
    StageSlot,
    close_queues,
)
from horizonserve.runtime.engine.reference.stage_supervision import (
    SUPERVISE_TICK_S,
    StageSupervision,
)
from horizonserve.runtime.engine.reference.stages.common import StageConfig
from horizonserve.runtime.engine.reference.supervisor import RestartPolicy
from horizonserve.runtime.metrics import MetricsRecorder
from horizonserve.runtime.monitor import ControlRecord
from horizonserve.runtime.profiler import RequestProfiler
from horizonserve.runtime.shedding import FrontGate, QueueLimits, front_gate

# The names importers take from here, wherever they are defined now.
__all__ = [
    "CANCELLED",
    "CHAINS",
    "DOWN",
    "DOWNSTREAM_STAGES",
    "FEEDS",
    "MAX_RID_CHARS",
    "RECORD_PREFIX",
    "REJECTED",
    "RUNNING",
    "STARTING",
    "SUPERVISE_TICK_S",
    "TIMED_OUT",
    "UNAVAILABLE",
    "Listener",
    "Pipeline",
    "PipelineError",
    "PipelineOptions",
    "QueueFullError",
    "RequestHandle",
    "RequestRecord",
    "SharingMismatchError",
    "StageSlot",
    "StageUnavailableError",
    "device_sms",
    "downstream_of",
    "downstream_stages",
    "record_bytes",
    "resolve_device",
    "stages_of",
]

log = logging.getLogger(__name__)


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


class Pipeline(
    StageProcesses, StageSupervision, StageEvents, RequestRouting, StageCommands, PipelineStatus
):
    """The stage processes of one front process and the requests in flight through them; the
    parts it combines are listed in this module's docstring."""

    def __init__(self, options: PipelineOptions | None = None) -> None:
        self.options = opts = options or PipelineOptions()
        self.device = ""
        self.config: ServingConfig | None = None
        self.metrics = MetricsRecorder(model_name=opts.model_name or f"reference-{opts.preset}")
        self.downstream: tuple[str, ...] = ()  # the downstream stages run (downstream_stages)
        self._running = False
        self._stopping = False
        self._lock = threading.Lock()
        self._ready = threading.Condition(self._lock)
        # GPU sharing (gpu_sharing)
        self._gpu = GpuSharing(opts)
        self.sharing = "timeslice"
        self.static_shares: dict[str, int] = {}  # mps-static: stage -> its fixed SMs
        self._total_sms = 0  # the device's SMs (the ladder's total on a CPU)
        # Stage processes (stage_processes)
        self._slots: dict[str, StageSlot] = {}
        self._procs: dict[str, Any] = {}
        self._queues: dict[str, Any] = {}
        # producer -> target -> relay queue of its hand-offs (supervised pipelines)
        self._relay: dict[str, dict[str, Any]] = {}
        self._inbox: queue.Queue[tuple[str, int, Event] | None] = queue.Queue()
        self._ctx: Any = None
        self._base: StageConfig | None = None
        self._record: ControlRecord | None = None
        self._queue_record: ControlRecord | None = None  # DTPS's downstream queue depths
        self._pumps: list[threading.Thread] = []
        self._pids: dict[str, int] = {}  # pids of the last started stages (kept after stop)
        # Supervision (stage_supervision)
        self._supervisor: threading.Thread | None = None
        self.supervisor_tick_t = 0.0  # monotonic s of the supervisor's last tick
        self.record_repairs = 0  # control-record headers rewritten after corruption
        # Stage state and command answers, under _ready (stage_events, stage_commands)
        self.stage_info: dict[str, dict[str, Any]] = {}
        self.errors: list[str] = []  # stage-level failures (the newest 100)
        self._error_count = 0
        self._stopped: set[str] = set()
        self._policy_ack: str | None = None
        self._probes: dict[str, dict[str, Any]] = {}
        self._aborts: dict[str, int] = {}  # stage → requests dropped, per `abort` call
        self._collector: threading.Thread | None = None
        self.on_event: Callable[[Event], None] | None = None  # test hook
        half = max(1, opts.history_bytes // 2)
        self.trace: BoundedHistory[tuple[Any, ...]] = BoundedHistory(
            half, tuple_bytes, opts.history
        )
        self.trace_received_t = 0.0  # stage-side send time of the newest trace batch
        # Requests (request_routing)
        self._handles: dict[str, RequestHandle] = {}  # under _lock
        self._profiler: RequestProfiler | None = None
        self._gate: FrontGate | None = None  # the shed presets' queue limits
        self.finished: BoundedHistory[RequestRecord] = BoundedHistory(
            half, record_bytes, opts.history
        )
        self._samples_per_second = 1.0
        self._kv_slots = 0  # shared-stage KV slots (kv_cache_usage_perc's denominator)

    @property
    def mps_active(self) -> bool:
        """A private MPS daemon was started for this pipeline's stages."""
        return self._gpu.active

    @property
    def stage_pids(self) -> list[int]:
        return list(self._pids.values())

    # -- lifetime ---------------------------------------------------------------------------
    def start(self) -> Pipeline:
        opts = self.options
        config, policy, cuda = self._configure()
        self._open_records()
        self._base = self._stage_config(config, policy, cuda)
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

    def _configure(self) -> tuple[ServingConfig, str, bool]:
        """Device, GPU sharing (the MPS daemon started if it needs one), serving config and
        the front's limits; returns (config, policy, whether the device is CUDA). Nothing
        but the MPS daemon is started yet, and a refused config stops that again."""
        opts = self.options
        self.downstream = downstream_stages(opts.downstream)
        self.device = resolve_device(opts.device)
        cuda = self.device.startswith("cuda")
        policy = opts.policy or (opts.config.policy.value if opts.config else "horizon")
        check_engine(policy, "reference")
        self.sharing = self._gpu.choose(policy, cuda)
        if uses_mps(self.sharing):
            self._gpu.start_mps()
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
            if self._gpu.daemon is not None:  # nothing else was started yet
                self._gpu.stop_mps()
            raise
        self._gate = front_gate(policy, config, self._kv_slots, opts.queue_limits)
        self._samples_per_second = float(
            preset.code2wav.samples_per_code * preset.codes_per_audio_second
        )
        return config, policy, cuda

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
            close_queues(slot.in_q, slot.events)
        for relay in self._relay.values():
            close_queues(*relay.values())
        for rec in (self._record, self._queue_record):
            if rec is not None:
                rec.close()
                rec.unlink()
        self._record = self._queue_record = None
        if self._gpu.daemon is not None:
            self._gpu.stop_mps()
        self._procs = {}

    def __enter__(self) -> Pipeline:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
