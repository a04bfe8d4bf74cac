"""The loop every downstream stage process runs around its stage object.

Per iteration: take hand-offs from the inbound queue, publish the in-flight count in this
stage's control-record slot (the shared stage reads it as downstream activity), activate the
complementary SM level read from the record's decision group, run one stage iteration, publish
again. While idle it refreshes its heartbeat every `IDLE_BEAT_S`.

Complementary ladder: this process pre-allocates a context for `S_tot − s` for every level
`s` the shared stage may take (the co-running levels and S_aggr), so the split always sums to
the GPU. Right after a stage becomes active the shared stage may still hold S_aggr (headroom
0) for one step; the downstream stage then runs on `S_tot − S_cap`, the headroom it is
guaranteed once the shared stage reacts.

Under `vllm-omni-current` a stage the shared stage feeds (talker, DiT) also publishes how many
hand-offs wait for a place in its slot of the queue-depth record (`StageConfig.
queue_record_path`, a control record of its own, so the activity sums stay as they are): DTPS
at the shared stage reads it (`stages.shared`).
"""

from __future__ import annotations

import math
import time
from collections import deque
from typing import Any, Protocol

from horizonserve.runtime.baselines import rules_for
from horizonserve.runtime.config import ServingConfig
from horizonserve.runtime.engine.reference.gpu_control import open_sm_cap, sm_info
from horizonserve.runtime.engine.reference.protocol import (
    ABORTED,
    PROBE,
    READY,
    STOPPED,
    WORK,
    Abort,
    Cancel,
    Event,
    ProbeLoad,
    ProbeStop,
    SetPolicy,
)
from horizonserve.runtime.engine.reference.stages.admission import (
    DownstreamRules,
    downstream_rules,
)
from horizonserve.runtime.engine.reference.stages.common import (
    ParentWatch,
    StageConfig,
    drain,
    memory_info,
    setup_torch,
    share_info,
)
from horizonserve.runtime.gpu.split import Role, StageLadder
from horizonserve.runtime.monitor import ControlRecord
from horizonserve.runtime.spatial import NO_DECISION

IDLE_BEAT_S = 0.1
CANCELLED_KEPT = 1024  # cancelled ids remembered for hand-offs still on their way
STAGE_KIND = {"speech": 1, "image": 2, "code2wav": 3}  # control-record slot kind codes


class DownstreamStage(Protocol):
    @property
    def in_flight(self) -> int: ...

    @property
    def idle(self) -> bool: ...

    @property
    def waiting(self) -> int:
        """Hand-offs queued for a place (DTPS's downstream queue depth)."""
        ...

    def submit(self, msg: Any) -> None: ...

    def iterate(self) -> None: ...

    def min_slack(self) -> float:
        """Smallest slack ratio of a request whose first output is pending here (NaN: none)."""
        ...

    def counters(self) -> dict[str, int]:
        """What the stage's downstream rules did (reported when it stops)."""
        ...

    def configure(self, rules: DownstreamRules) -> None:
        """The policy's downstream rules (admission order, yielding, late refusal)."""
        ...

    # calibration: synthetic load, cancellation, last iteration's timing as (main part s
    # (talker / DiT step), vocoder part s (code2wav), jobs, prompts prefilled)
    last_timing: tuple[float, float, int, int]
    emit: Any

    def add_synthetic(self, n: int) -> None: ...

    def cancel_all(self) -> None: ...

    def abort(self, before: float) -> int: ...

    def cancel(self, requests: tuple[tuple[str, float], ...]) -> int: ...


class DownstreamLoop:
    def __init__(self, cfg: StageConfig, name: str, in_q: Any, events: Any) -> None:
        self.cfg = cfg
        self.name = name
        self.in_q = in_q
        self.events = events
        self.device, self.dtype = setup_torch(cfg)
        self.preset = cfg.get_preset()
        self.config = ServingConfig.model_validate_json(cfg.serving_json)
        self.record = ControlRecord.open(cfg.record_path)
        self.writer = self.record.downstream_writer(cfg.downstream_slot, STAGE_KIND.get(name, 1))
        self.policy = self.config.policy
        # The queue-depth record (vllm-omni-current's DTPS reads it; None: not a stage the
        # shared stage feeds). Written only while the policy is tiered.
        self.queues: ControlRecord | None = None
        self.queue_writer = None
        if cfg.queue_record_path:
            self.queues = ControlRecord.open(cfg.queue_record_path)
            kind = STAGE_KIND.get(name, 1)
            self.queue_writer = self.queues.downstream_writer(cfg.downstream_slot, kind)
        self.split = StageLadder.open(Role.DOWNSTREAM, self.config.ladder, cfg.capped)
        self.levels = list(self.split.contexts)
        # Complementary levels sit on the SMs the shared stage does not hold (disjoint across
        # the two processes), see gpu_control.
        self.sm = open_sm_cap(
            self.device.type, self.device.index or 0, self.levels, partition="complement"
        )
        self.total = self.config.ladder.total

    def warmup_levels(self) -> tuple[int | None, ...]:
        return (None, *getattr(self.sm, "levels", ()))

    def sms_now(self) -> int | None:
        """SMs for the next iteration: the published headroom, snapped to a level."""
        d = self.record.read_decision()
        level = d.level_index if d.steps else NO_DECISION
        return self.split.sms_for(level, d.shared_sms, d.downstream_sms)

    def run_load(self, stage: DownstreamStage, load: ProbeLoad) -> bool:
        """Serve a ProbeLoad (see protocol); returns False when a stop sentinel arrived."""
        emit, stage.emit = stage.emit, lambda _ev: None
        rows: list[tuple[float, ...]] = []
        keep_going = True
        plan: list[tuple[bool, int | None]] = (
            [(True, None)] if load.levels is None else [(False, lvl) for lvl in load.levels]
        )
        try:
            for follow, fixed in plan:
                if fixed is not None and self.levels:
                    fixed = self.split.snap(fixed)
                elif fixed is not None:
                    fixed = None  # no ladder here (CPU, uncapped run): the whole device
                deadline = time.monotonic() + load.seconds
                while time.monotonic() < deadline:
                    for msg in drain(self.in_q, block=False):
                        if msg is None:
                            keep_going = False
                        elif isinstance(msg, ProbeStop):
                            deadline = 0.0
                    if not keep_going or deadline == 0.0:
                        break
                    stage.add_synthetic(load.batch)
                    sms = self.sms_now() if follow else fixed
                    self.sm.activate(sms)
                    self.writer.set_active(stage.in_flight, time.monotonic_ns())
                    t0 = time.monotonic()
                    stage.iterate()
                    t1 = time.monotonic()
                    rows.append((t0, t1, sms or self.total, *stage.last_timing))
                if not keep_going or deadline == 0.0:
                    break
        finally:
            stage.cancel_all()
            stage.emit = emit
            self.writer.set_active(0, time.monotonic_ns())
        data = {"rows": rows, "batch": load.batch, "total_sms": self.total}
        self.events.put(Event(PROBE, self.name, time.monotonic(), data=data))
        return keep_going

    def serve(self, stage: DownstreamStage, info: dict[str, Any]) -> None:
        info = {**info, "sharing": self.cfg.sharing, **sm_info(self.sm)}
        info.update(share_info(self.cfg, self.device))
        info.update(memory_info(self.device))
        self.events.put(Event(READY, self.name, time.monotonic(), data=info))
        watch = ParentWatch()
        beat = 0.0
        aborted_before = -math.inf  # hand-offs of requests that arrived by then are dropped
        # (id, arrival) of cancelled requests: their hand-offs still on the way are dropped
        cancelled: deque[tuple[str, float]] = deque(maxlen=CANCELLED_KEPT)
        while True:
            msgs = drain(self.in_q, block=stage.idle)
            stop = False
            for msg in msgs:
                if msg is None:
                    stop = True
                elif isinstance(msg, ProbeLoad):
                    stop = stop or not self.run_load(stage, msg)
                elif isinstance(msg, ProbeStop):
                    continue
                elif isinstance(msg, Abort):
                    aborted_before = max(aborted_before, msg.before)
                    dropped = stage.abort(msg.before)
                    ev = Event(ABORTED, self.name, time.monotonic(), data={"dropped": dropped})
                    self.events.put(ev)
                elif isinstance(msg, SetPolicy):  # between runs: the admission rule follows
                    stage.configure(downstream_rules(self.config, msg.policy, self.cfg.window))
                    self.policy = msg.policy
                    self.publish_waiting(stage, force=True)
                elif isinstance(msg, Cancel):
                    cancelled.extend(msg.requests)
                    stage.cancel(msg.requests)
                elif isinstance(msg, WORK) and (
                    msg.arrival <= aborted_before or (msg.rid, msg.arrival) in cancelled
                ):
                    continue  # its request was aborted while it was on its way
                else:
                    stage.submit(msg)
            now = time.monotonic()
            if stop or watch.gone(now):
                break
            if msgs or not stage.idle or now - beat > IDLE_BEAT_S:
                self.writer.set_active(stage.in_flight, time.monotonic_ns(), stage.min_slack())
                self.publish_waiting(stage)
                beat = now
            if not stage.idle:
                self.sm.activate(self.sms_now())
                stage.iterate()
                self.writer.set_active(stage.in_flight, time.monotonic_ns(), stage.min_slack())
                self.publish_waiting(stage)
        self.writer.set_active(0, time.monotonic_ns())
        if self.queue_writer is not None:
            self.queue_writer.set_active(0, time.monotonic_ns())
        data = {**memory_info(self.device), **stage.counters()}
        self.events.put(Event(STOPPED, self.name, time.monotonic(), data=data))
        # The SM ladder stays open until the process leaves (see stages.shared.main).
        self.record.close()
        if self.queues is not None:
            self.queues.close()

    def publish_waiting(self, stage: DownstreamStage, force: bool = False) -> None:
        """The stage's queue depth in the queue-depth record, while the policy is tiered (or
        once after a switch, `force`, so a count left from an earlier policy is cleared)."""
        if self.queue_writer is None:
            return
        if rules_for(self.policy).tiered:
            self.queue_writer.set_active(stage.waiting, time.monotonic_ns())
        elif force:
            self.queue_writer.set_active(0, time.monotonic_ns())
