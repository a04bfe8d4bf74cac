"""The stage processes: their slots, control records, spawning and event pumps.

One spawned process per stage, each with its own inbound and event queues (`StageSlot`), so a
stage killed mid-message can only wedge its own queues, which a restart replaces.

Invariants:
- A slot's `gen` grows by one at every spawn; a pump thread reads its queue until the
  generation changes (or the pipeline stops) and the queue is empty, and tags every event
  with the generation it read it for, so the dispatcher can ignore a replaced process.
- `slot.state` and `stage_info` change under the pipeline's `_lock` (the `_ready`
  condition's lock) when a stage fails; the dispatcher thread sets RUNNING on READY under it.
- Consumers are spawned before producers, so a stage's targets have queues when it starts;
  supervised pipelines route hand-offs through the front (`_relay`, `_forward`) so that a
  restarted target gets fresh queues.
- The control record (heartbeats, activity) and the queue record (DTPS's downstream queue
  depths) live from `start` to `stop`; their names start with `RECORD_PREFIX`, so a later
  front process removes those of one that was killed.
"""

from __future__ import annotations

import contextlib
import logging
import os
import queue
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from horizonserve.runtime.config import ServingConfig
from horizonserve.runtime.engine.reference.errors import PipelineError
from horizonserve.runtime.engine.reference.gpu_control import mps_percentage, uses_caps
from horizonserve.runtime.engine.reference.stage_graph import DOWNSTREAM_STAGES, FEEDS
from horizonserve.runtime.engine.reference.stages import run_stage
from horizonserve.runtime.engine.reference.stages.common import StageConfig
from horizonserve.runtime.engine.reference.supervisor import FaultConfirmation, RestartBackoff
from horizonserve.runtime.monitor import ControlRecord, remove_stale, shm_dir, shm_path

log = logging.getLogger(__name__.rpartition(".")[0] + ".pipeline")  # the pipeline's logger

RECORD_PREFIX = "horizonserve-control-"

# Stage states (supervision).
STARTING, RUNNING, DOWN = "starting", "running", "down"


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


def close_queues(*qs: Any) -> None:
    """Close queues without waiting for their feeder threads (the reader may be dead)."""
    for q in qs:
        if q is None:
            continue
        with contextlib.suppress(Exception):
            q.cancel_join_thread()
            q.close()


class StageProcesses:
    """Spawning the stage processes and pumping their queues: a part of `Pipeline`, whose
    `__init__` sets up the state. Owns `_slots`, `_procs`, `_queues`, `_relay`, `_pumps`,
    `_pids`, `_ctx`, `_base`, `_record` and `_queue_record`."""

    def _open_records(self) -> None:
        """Create this run's control and queue records (stale ones of killed runs removed)."""
        remove_stale(shm_dir(), (RECORD_PREFIX,))  # records of front processes killed earlier
        name = f"{RECORD_PREFIX}{os.getpid()}-{uuid.uuid4().hex[:8]}"
        self._record = ControlRecord.create(shm_path(name), n_slots=len(DOWNSTREAM_STAGES))
        # Queue depths of the stages the shared stage feeds (vllm-omni-current's DTPS); a
        # record of its own, so the activity the control reads stays what it was.
        self._queue_record = ControlRecord.create(
            shm_path(f"{name}-queues"), n_slots=len(DOWNSTREAM_STAGES)
        )

    def _stage_config(self, config: ServingConfig, policy: str, cuda: bool) -> StageConfig:
        """What every stage process starts from (`_spawn` adds a stage's own fields)."""
        opts = self.options
        # Ladders are pre-allocated when the sharing mode caps; a policy that does not throttle
        # (set_policy within the same mode, e.g. calibration's solo runs) never activates them.
        capped = cuda and uses_caps(self.sharing)
        log.info("GPU sharing %s (policy %s, ladders %s)", self.sharing, policy, capped)
        return StageConfig(
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
