"""Stage 0, the shared AR stage ("thinker"): the policy is its scheduler.

One iteration (Algorithm 1, one shared-stage opportunity):
  1. read downstream activity from the control record and sample memory pressure; note a
     backlog (every KV slot taken while prompts wait);
  2. `policy.step` → the queue view and the SM split; publish the decision in the control
     record;
  3. batch = every running sequence (one decode token each) + visible waiting prompts in view
     order while KV slots and the prefill token budget allow; taken prompts leave the waiting
     queue (`policy.dequeue`);
  4. prefill on `policy.prefill_sms` SMs (S_aggr when it carries an urgent prompt), then
     decode on the step's cap; record progress on each request's signals; emit the first token of
     short-path requests; hand long-path requests (hidden states of all their cached positions)
     to their downstream stage once their shared-stage tokens are generated.

Under `vllm-omni-current` (`runtime.baselines`) step 3 takes the visible prompts in DTPS's tier
order instead, vllm-project/vllm-omni PR #6315 (RFC #6237), `vllm_omni/core/sched/
dtps_scheduler.py`, `DTPSScheduler.maybe_reorder_waiting` (commit 1cf390de4e7b of the upstream
repository): `runtime.audio_window.dtps_order` with the budget `dtps_budget(threshold 2,
downstream waiting, running downstream-bound here)`, the rule the simulator runs. The
downstream waiting count is what the stages this one feeds publish in the queue-depth record
(`stages.downstream`); the control core (`policy.step`) is not involved.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from horizonserve.runtime.audio_window import DTPS_THRESHOLD, dtps_budget, dtps_order
from horizonserve.runtime.baselines import rules_for
from horizonserve.runtime.config import ServingConfig
from horizonserve.runtime.downstream import Stamp
from horizonserve.runtime.engine.reference.ar import ArExecutor, bucket
from horizonserve.runtime.engine.reference.batching import ContinuousBatcher, Sequence
from horizonserve.runtime.engine.reference.gpu_control import SmCap
from horizonserve.runtime.engine.reference.presets import PipelinePreset
from horizonserve.runtime.engine.reference.protocol import (
    ABORTED,
    DONE,
    ERROR,
    FIRST,
    HANDOFF,
    TOKENS,
    TRACE,
    Abort,
    Admit,
    Cancel,
    Event,
    Handoff,
    ProbeDecode,
    SetPolicy,
    WireTensor,
)
from horizonserve.runtime.gpu.split import Role, StageLadder
from horizonserve.runtime.policy import SchedulingPolicy, StepDecision
from horizonserve.runtime.profiler import InputFeatures, RequestSignals
from horizonserve.runtime.spatial import UNCAPPED

STAGE = "shared"


@dataclass(slots=True)
class SharedJob:
    sig: RequestSignals
    admit: Admit
    scheduled: float = math.nan  # when its prompt entered a batch


def _never_handed(seq: Sequence) -> bool:
    """A running shared-stage request is handed downstream only when it finishes here."""
    return False


def _signals(seq: Sequence) -> RequestSignals:
    return seq.payload.sig  # type: ignore[no-any-return]


def _bound(seq: Sequence) -> bool:
    return seq.payload.admit.downstream is not None  # type: ignore[no-any-return]


def _prompt(seq: Sequence) -> int:
    return seq.prompt_len


def _arrival(seq: Sequence) -> float:
    return seq.payload.admit.arrival  # type: ignore[no-any-return]


def tpot_of(times: list[float]) -> float | None:
    """Mean inter-token time after the first token (None with fewer than two tokens)."""
    if len(times) < 2:
        return None
    return (times[-1] - times[0]) / (len(times) - 1)


class SharedStage:
    """The shared stage's scheduling loop body; I/O goes through the callables given."""

    def __init__(
        self,
        policy: SchedulingPolicy,
        executor: ArExecutor,
        preset: PipelinePreset,
        config: ServingConfig,
        *,
        emit: Callable[[Event], None],
        handoff: Callable[[str, Handoff], None],
        downstream_active: Callable[[], int],
        pressure: Callable[[], float | None],
        publish: Callable[[StepDecision, float | None], None],
        sm: SmCap,
        trace_interval_s: float = 0.25,
        clock: Callable[[], float] = time.monotonic,
        downstream_slack: Callable[[], float | None] = lambda: None,
        downstream_waiting: Callable[[], int] = lambda: 0,
    ) -> None:
        self.policy = policy
        self.executor = executor
        self.preset = preset
        self.batcher = ContinuousBatcher(preset.thinker_limits)
        self.total_sms = config.ladder.total
        self._split = StageLadder.open(Role.SHARED, config.ladder)
        self.waiting: dict[str, Sequence] = {}  # arrival order
        self.steps = 0
        self._emit = emit
        self._handoff = handoff
        self._downstream_active = downstream_active
        self._downstream_slack = downstream_slack
        self._downstream_waiting = downstream_waiting  # DTPS: hand-offs waiting downstream
        self._tiered = rules_for(policy.name).tiered
        self.dtps_budgets: dict[int, int] = {}  # DTPS: budget -> steps that ran under it
        self._pressure = pressure
        self._publish = publish
        self._sm = sm
        self._clock = clock
        self._trace: list[tuple[Any, ...]] = []
        self._trace_every = trace_interval_s
        self._trace_next = 0.0
        self.last_plan_rids: list[str] = []  # prompts admitted by the last iteration (tests)
        self.aborted_before = -math.inf  # requests that arrived at or before this are dropped
        self.preemptions = 0
        self._step_s = 0.0  # the last iteration's duration (the next-free estimate)

    # -- requests ---------------------------------------------------------------------------
    def prompt_len(self, admit: Admit) -> int:
        s, p = admit.spec, self.preset
        n = s.input_tokens + round(s.audio_seconds * p.tokens_per_audio_second)
        n += round(s.video_seconds * p.tokens_per_video_second)
        return max(1, n + s.images * p.tokens_per_image)

    def set_policy(self, policy: SchedulingPolicy) -> None:
        """Replace the policy; only between runs (nothing waiting or running)."""
        if not self.idle:
            raise RuntimeError("cannot switch policy while requests are in the stage")
        self.policy = policy
        self._tiered = rules_for(policy.name).tiered
        self.dtps_budgets = {}

    def submit(self, admit: Admit) -> None:
        s = admit.spec
        if admit.arrival <= self.aborted_before:
            return
        try:
            video_tokens = round(s.video_seconds * self.preset.tokens_per_video_second)
            features = InputFeatures(s.input_tokens + video_tokens, s.audio_seconds, s.images)
            sig = self.policy.admit(
                s.rid,
                admit.arrival,
                priority=s.priority,
                class_name=s.class_name,
                features=features,
            )
            prompt, target = self.batcher.fit(self.prompt_len(admit), max(1, s.output_tokens))
        except (KeyError, ValueError, OverflowError) as exc:
            self._emit(Event(ERROR, STAGE, self._clock(), s.rid, {"message": str(exc)}))
            return
        self.waiting[s.rid] = Sequence(s.rid, prompt, target, SharedJob(sig, admit))

    @property
    def idle(self) -> bool:
        return not self.waiting and self.batcher.idle

    def abort(self, before: float) -> int:
        """Drop waiting and running requests that arrived at or before `before`; KV slots are
        freed and the policy's waiting index forgets them. Returns how many were dropped."""
        self.aborted_before = max(self.aborted_before, before)
        dropped = 0
        for rid, seq in list(self.waiting.items()):
            if seq.payload.admit.arrival <= before:
                self.policy.dequeue(seq.payload.sig)
                del self.waiting[rid]
                dropped += 1
        for seq in list(self.batcher.running):
            if seq.payload.admit.arrival <= before:
                self.batcher.finish(seq)
                dropped += 1
        return dropped

    def cancel(self, requests: tuple[tuple[str, float], ...]) -> int:
        """Drop these (id, arrival) requests, waiting or running; returns how many."""
        gone = dict(requests)
        dropped = 0
        for rid in gone.keys() & self.waiting.keys():
            if self.waiting[rid].payload.admit.arrival == gone[rid]:
                self.policy.dequeue(self.waiting.pop(rid).payload.sig)
                dropped += 1
        for seq in list(self.batcher.running):
            if gone.get(seq.rid) == seq.payload.admit.arrival:
                self.batcher.finish(seq)
                dropped += 1
        return dropped

    def _queued(self, sig: RequestSignals) -> Sequence:
        """The waiting sequence of a request's signals (the view's lookup)."""
        return self.waiting[sig.request_id]

    # -- one iteration ------------------------------------------------------------------------
    def iterate(self) -> StepDecision:
        now = self._clock()
        active = self._downstream_active()
        sample = self._pressure()
        batcher = self.batcher
        backlog = bool(self.waiting) and len(batcher.running) >= batcher.limits.max_batch
        decision = self.policy.step(
            now,
            downstream_active=active > 0,
            pressure_sample=sample,
            backlog=backlog,
            running=lambda: (s.payload.sig for s in batcher.running if s.payload.admit.downstream),
            downstream_slack=self._downstream_slack,
        )
        sm = decision.sm
        self._publish(decision, sample)
        self._preempt_for_urgent(decision)

        visible = decision.view.iter_visible(self.waiting.values(), _signals, self._queued)
        plan = batcher.plan(self._tiers(visible, now) if self._tiered else visible)
        self.last_plan_rids = [seq.rid for seq in plan.prefill]
        prefill_sms = (
            decision.prefill_sms(map(_signals, plan.prefill)) if plan.prefill else sm.shared
        )
        t0 = self._clock()
        for seq in plan.prefill:
            self.policy.dequeue(seq.payload.sig)
            del self.waiting[seq.rid]
            seq.payload.scheduled = t0

        # Prefill (compute-bound) may run above the cap when it carries an urgent prompt;
        # decode always runs at the step's cap.
        if plan.prefill:
            self._sm.activate(self._level(sm.level, prefill_sms))
            self.executor.prefill(plan.prefill)
        t1 = self._clock()
        self._sm.activate(self._level(sm.level, sm.shared))
        self.executor.decode(plan.decode)
        t2 = self._clock()

        for seq in plan.prefill:
            job: SharedJob = seq.payload
            job.sig.record_progress(prefilled=True, decoded=1)
            seq.token_times.append(t1)
            if job.admit.downstream is None:
                self._emit(Event(FIRST, STAGE, t1, seq.rid, {"scheduled": job.scheduled}))
        for seq in plan.decode:
            seq.payload.sig.record_progress(decoded=1)
            seq.token_times.append(t2)
        streamed = [
            (seq.rid, seq.last_token)
            for seq in plan.prefill + plan.decode
            if seq.payload.admit.spec.stream
        ]
        if streamed:  # one event per step for all streaming requests
            self._emit(Event(TOKENS, STAGE, t2, data={"tokens": streamed}))
        for seq in plan.prefill + plan.decode:
            if seq.done:
                self._finish(seq)

        self.steps += 1
        self._step_s = t2 - now
        self._trace.append(
            (
                now,
                sm.shared,
                sm.downstream,
                sm.level,
                decision.pressure,
                len(plan.decode),
                len(plan.prefill),
                plan.prefill_tokens,
                t1 - t0,
                t2 - t1,
                len(self.waiting),
                active,
                decision.view.phase.value,
                prefill_sms,
                t0 - now,
                decision.shared_slack,
                decision.downstream_slack,
            )
        )
        self.flush_trace()
        return decision

    def _tiers(self, visible: Iterable[Sequence], now: float) -> list[Sequence]:
        """The visible prompts in DTPS's tier order (module doc); the budget counts the
        downstream stages' waiting hand-offs and the downstream-bound requests running here."""
        running = sum(1 for s in self.batcher.running if _bound(s))
        budget = dtps_budget(DTPS_THRESHOLD, self._downstream_waiting(), running)
        self.dtps_budgets[budget] = self.dtps_budgets.get(budget, 0) + 1
        return dtps_order(
            list(visible),
            now,
            downstream=_bound,
            prompt_tokens=_prompt,
            arrival=_arrival,
            budget=budget,
        )

    def _preempt_for_urgent(self, decision: StepDecision) -> None:
        """The step's victim (if it names one) leaves the running set, its KV slot freed,
        and waits again as a decode continuation that re-prefills its prompt and the tokens it
        generated (recompute, as vLLM does)."""
        if not (decision.backlog and self.policy.preemption):
            return
        batcher, now = self.batcher, decision.now
        next_free = min(s.target - s.generated for s in batcher.running) * self._step_s
        victim = decision.victim(batcher.running, _signals, _never_handed, next_free)
        if victim is None:
            return
        batcher.finish(victim)
        again = Sequence(
            victim.rid,
            victim.prompt_len + victim.generated,
            victim.target,
            victim.payload,
            generated=victim.generated,
            token_times=victim.token_times,
        )
        sig = victim.payload.sig
        sig.preempted += 1
        self.policy.requeue(sig, now)
        self.waiting[victim.rid] = again
        self.preemptions += 1

    def _level(self, level: int, sms: int) -> int | None:
        """The SM count to activate for a step's level (None: the whole GPU)."""
        return self._split.sms_for(level, sms, 0)

    def _finish(self, seq: Sequence) -> None:
        job: SharedJob = seq.payload
        t = self._clock()
        data = {"scheduled": job.scheduled, "tpot": tpot_of(seq.token_times)}
        data["tokens"] = seq.generated
        if job.sig.preempted:
            data["preempted"] = job.sig.preempted
        target = job.admit.downstream
        if target is not None:
            dims = self.preset
            keep = dims.dit.cond_tokens if target == "image" else None
            cond = WireTensor.of(self.executor.hidden_of(seq, keep))
            spec = job.admit.spec
            stamp = Stamp.of(job.sig)  # travels with the request; no stage recomputes it
            self._handoff(
                target,
                Handoff(seq.rid, job.admit.arrival, cond, spec.downstream_tokens, stamp),
            )
            self._emit(Event(HANDOFF, STAGE, t, seq.rid, data))
        else:
            self._emit(Event(DONE, STAGE, t, seq.rid, data))
        self.batcher.finish(seq)

    def flush_trace(self, force: bool = False) -> None:
        now = self._clock()
        if self._trace and (force or now >= self._trace_next):
            self._emit(Event(TRACE, STAGE, now, data={"rows": self._trace}))
            self._trace = []
            self._trace_next = now + self._trace_every


# -- process entry ----------------------------------------------------------------------------


def main(cfg: Any, in_q: Any, events: Any, handoff_qs: dict[str, Any]) -> None:
    """Process body of the shared stage (see `stages.run_stage`)."""
    from horizonserve.runtime.engine.reference.gpu_control import (
        open_pressure_sampler,
        open_sm_cap,
        sm_info,
    )
    from horizonserve.runtime.engine.reference.models import DecoderLM, materialize
    from horizonserve.runtime.engine.reference.protocol import READY, STOPPED
    from horizonserve.runtime.engine.reference.stages.common import (
        ParentWatch,
        drain,
        memory_info,
        setup_torch,
        share_info,
    )
    from horizonserve.runtime.monitor import ControlRecord
    from horizonserve.runtime.policy import make_policy

    device, dtype = setup_torch(cfg)
    preset = cfg.get_preset()
    config = ServingConfig.model_validate_json(cfg.serving_json)
    t_load = time.monotonic()
    model = materialize(lambda: DecoderLM(preset.thinker), device, dtype)
    executor = ArExecutor(
        model,
        preset.thinker_limits,
        keep_hidden=True,
        graphs=cfg.graphs and preset.graphs_for("thinker"),
    )
    policy = make_policy(config.policy, config)
    record = ControlRecord.open(cfg.record_path)
    writer = record.decision_writer()
    index = device.index or 0
    split = StageLadder.open(Role.SHARED, config.ladder, cfg.capped)
    sm = open_sm_cap(device.type, index, list(split.contexts))
    sampler = open_pressure_sampler(device.type, index)
    max_age_ns = int(cfg.heartbeat_max_age_s * 1e9)
    nan = math.nan

    def downstream_active() -> int:
        return record.downstream_active_total(time.monotonic_ns(), max_age_ns)

    def downstream_slack() -> float | None:
        return record.downstream_min_slack(time.monotonic_ns(), max_age_ns)

    # DTPS's downstream queue depth: the waiting hand-offs the fed stages publish there.
    queues = ControlRecord.open(cfg.queue_record_path) if cfg.queue_record_path else None

    def downstream_waiting() -> int:
        if queues is None:
            return 0
        return queues.downstream_active_total(time.monotonic_ns(), max_age_ns)

    def publish(decision: StepDecision, raw: float | None) -> None:
        s = decision.sm
        smoothed = nan if decision.pressure is None else decision.pressure
        writer.publish(
            s.shared,
            s.downstream,
            s.level,
            smoothed,
            nan if raw is None else raw,
            time.monotonic_ns(),
        )

    def publish_split(shared: int, down: int) -> None:
        level = UNCAPPED if down == 0 else 0  # a probe level: the downstream takes `down`
        writer.publish(shared, down, level, nan, nan, time.monotonic_ns())

    stage = SharedStage(
        policy,
        executor,
        preset,
        config,
        emit=events.put,
        handoff=lambda target, msg: handoff_qs[target].put(msg),
        downstream_active=downstream_active,
        pressure=sampler,
        publish=publish,
        sm=sm,
        trace_interval_s=cfg.trace_interval_s,
        downstream_slack=downstream_slack,
        downstream_waiting=downstream_waiting,
    )
    if cfg.warmup:
        warmup_ar(executor, stage.batcher, sm)
    info = {
        "params": preset.thinker.params(),
        "load_s": time.monotonic() - t_load,
        "kv_cache_gib": executor.cache.nbytes() / 2**30,
        "sharing": cfg.sharing,
        **sm_info(sm),
        **share_info(cfg, device),
        **executor.graph_info(),
        **memory_info(device),
    }
    events.put(Event(READY, STAGE, time.monotonic(), data=info))
    watch = ParentWatch()
    while True:
        stop = False
        for msg in drain(in_q, block=stage.idle):
            if msg is None:
                stop = True
            elif isinstance(msg, SetPolicy):
                switch_policy(stage, config, msg.policy, events)
            elif isinstance(msg, Abort):
                dropped = stage.abort(msg.before)
                events.put(Event(ABORTED, STAGE, time.monotonic(), data={"dropped": dropped}))
            elif isinstance(msg, Cancel):
                stage.cancel(msg.requests)
            elif isinstance(msg, ProbeDecode):
                events.put(
                    probe_decode(
                        stage,
                        sm,
                        msg,
                        config.ladder.total,
                        publish_split=publish_split,
                        downstream_active=downstream_active,
                    )
                )
            else:
                stage.submit(msg)
        if stop or watch.gone(time.monotonic()):
            break
        if stage.idle:
            stage.flush_trace(force=True)
            writer.beat(time.monotonic_ns())  # liveness while idle (the supervisor reads it)
        else:
            stage.iterate()
    stage.flush_trace(force=True)
    stopped: dict[str, Any] = dict(memory_info(device))
    if stage.dtps_budgets:  # DTPS: steps per budget (what the tiers followed)
        stopped["dtps_budget_steps"] = {str(b): n for b, n in sorted(stage.dtps_budgets.items())}
    events.put(Event(STOPPED, STAGE, time.monotonic(), data=stopped))
    # The SM ladder is not closed: the process leaves right after (os._exit), and destroying
    # the Green Contexts first made a later free of a pinned buffer record an event on a dead
    # stream ("invalid device context", std::terminate) on the H200.
    record.close()
    if queues is not None:
        queues.close()


def switch_policy(stage: SharedStage, config: ServingConfig, name: str, events: Any) -> None:
    from horizonserve.runtime.config import PolicyName
    from horizonserve.runtime.engine.reference.protocol import POLICY
    from horizonserve.runtime.policy import make_policy

    try:
        policy = PolicyName(name)
        stage.set_policy(make_policy(name, config.model_copy(update={"policy": policy})))
    except (RuntimeError, ValueError) as exc:
        events.put(Event(ERROR, STAGE, time.monotonic(), data={"message": str(exc)}))
        return
    events.put(Event(POLICY, STAGE, time.monotonic(), data={"policy": name}))


def _level_plan(probe: ProbeDecode, sm: SmCap, total_sms: int) -> list[int]:
    """SM counts the probe visits: the full GPU first, then every ladder level (or as asked)."""
    if probe.levels is None:
        return [total_sms, *sm.levels]
    known = set(sm.levels)
    return [s for s in probe.levels if s >= total_sms or s in known]


def _prefill_all(stage: SharedStage, seqs: list[Sequence]) -> None:
    """Prefill `seqs` (the token budget may split them over several executor calls)."""
    batcher, executor = stage.batcher, stage.executor
    pending = seqs
    while pending:
        plan = batcher.plan(pending)
        executor.prefill(plan.prefill)
        pending = pending[len(plan.prefill) :]


def _stats(times: list[float], prefix: str = "") -> dict[str, float]:
    times = sorted(times)
    return {
        f"{prefix}mean_s": sum(times) / len(times),
        f"{prefix}p50_s": times[len(times) // 2],
        f"{prefix}min_s": times[0],
        f"{prefix}n": len(times),
    }


def _probe_decode_level(stage: SharedStage, probe: ProbeDecode, batch: int) -> dict[str, float]:
    batcher, executor = stage.batcher, stage.executor
    max_len = batcher.limits.max_len
    context, target = batcher.fit(probe.context, max_len - min(probe.context, max_len - 1))
    seqs = [Sequence(f"probe-{i}", context, target) for i in range(batch)]
    _prefill_all(stage, seqs)
    room = target - 1
    if executor.use_graphs:  # stay inside one read-length bucket: no capture mid-measurement
        room = min(room, bucket(executor.ctx_buckets, context + 1) - context - 1)
    try:
        for _ in range(min(probe.warmup_steps, room)):  # first use of a graph key captures it
            executor.decode(seqs)
            room -= 1
        times: list[float] = []
        t_start = time.monotonic()
        while room > 0 and (
            len(times) < probe.steps or time.monotonic() - t_start < probe.min_seconds
        ):
            t0 = time.monotonic()
            executor.decode(seqs)
            times.append(time.monotonic() - t0)
            room -= 1
        t_end = time.monotonic()
    finally:
        for seq in seqs:
            batcher.finish(seq)
    return {**_stats(times), "t_start": t_start, "t_end": t_end}


def _probe_prefill_level(stage: SharedStage, probe: ProbeDecode) -> dict[str, float]:
    batcher = stage.batcher
    tokens = probe.prefill_tokens or probe.context
    prompt, target = batcher.fit(tokens, 1)
    times: list[float] = []
    for rep in range(probe.prefill_reps + 1):  # the first repetition warms up
        seqs = [Sequence(f"probe-p{i}", prompt, target) for i in range(probe.prefill_batch)]
        t0 = time.monotonic()
        _prefill_all(stage, seqs)
        dt = time.monotonic() - t0
        for seq in seqs:
            batcher.finish(seq)
        if rep:
            times.append(dt)
    out = _stats(times, "prefill_")
    out["prefill_tokens"] = prompt * probe.prefill_batch
    return out


def probe_decode(
    stage: SharedStage,
    sm: SmCap,
    probe: ProbeDecode,
    total_sms: int,
    *,
    publish_split: Callable[[int, int], None] | None = None,
    downstream_active: Callable[[], int] | None = None,
) -> Event:
    """Decode (and/or prefill) step times of a dummy batch at SM levels (the stage idle).

    With `probe.corun` each level's split is published (the downstream stages take the
    complement) after a downstream stage became active, so the times are co-running ones.
    """
    from horizonserve.runtime.engine.reference.protocol import PROBE

    if not stage.idle:
        return Event(ERROR, STAGE, time.monotonic(), data={"message": "probe: stage is busy"})
    if probe.kind not in ("decode", "prefill", "both"):
        msg = f"probe: unknown kind {probe.kind!r}"
        return Event(ERROR, STAGE, time.monotonic(), data={"message": msg})
    batch = max(1, min(probe.batch, stage.batcher.limits.max_batch))
    if probe.corun and downstream_active is not None:
        deadline = time.monotonic() + 60.0
        while downstream_active() <= 0:
            if time.monotonic() > deadline:
                msg = "probe: no downstream stage became active for the co-running probe"
                return Event(ERROR, STAGE, time.monotonic(), data={"message": msg})
            time.sleep(0.01)
    levels: dict[str, dict[str, float]] = {}
    try:
        for level in _level_plan(probe, sm, total_sms):
            full = level >= total_sms
            sm.activate(None if full else level)
            if probe.corun and publish_split is not None:
                publish_split(level, 0 if full else total_sms - level)
                time.sleep(probe.settle_s)  # the downstream stage switches at its next step
            rec: dict[str, float] = {}
            if probe.kind in ("decode", "both"):
                rec.update(_probe_decode_level(stage, probe, batch))
            if probe.kind in ("prefill", "both"):
                t0 = time.monotonic()
                rec.update(_probe_prefill_level(stage, probe))
                rec.setdefault("t_start", t0)
                rec["t_end"] = time.monotonic()
            levels[str(total_sms if full else level)] = rec
    finally:
        sm.activate(None)
    data = {
        "kind": probe.kind,
        "batch": batch,
        "context": probe.context,
        "steps": probe.steps,
        "corun": probe.corun,
        "levels": levels,
        **stage.executor.graph_info(),
    }
    return Event(PROBE, STAGE, time.monotonic(), data=data)


def warmup_ar(executor: ArExecutor, batcher: ContinuousBatcher, sm: SmCap) -> None:
    """Every prefill length bucket once (whole GPU), then per SM level one prefill + decode and
    every decode graph, so requests pay no lazy initialisation or graph capture."""
    sm.activate(None)
    executor.warm_prefill(batcher.limits.max_prefill_tokens)
    for level in (None, *getattr(sm, "levels", ())):
        sm.activate(level)
        seq = Sequence("warmup", min(32, batcher.limits.max_len // 2), 2)
        plan = batcher.plan([seq])
        executor.prefill(plan.prefill)
        executor.decode(plan.prefill)
        batcher.finish(seq)
        executor.precapture()
    sm.activate(None)
