"""Discrete-event simulation of one GPU serving an omni pipeline under one system.

Processes that co-run on the simulated GPU:
  * the shared stage: back-to-back iterations while it has work. Each iteration is one
    scheduling opportunity: `policy.step(now, downstream_active=…, pressure_sample=…,
    backlog=…)` (the control core's own object), then the base scheduler (`sim.shared`) builds
    the batch from the policy's view, and the iteration lasts `SharedCost.iteration_parts`
    (prefill part, decode part) at the SM cap the policy chose, slowed by co-running when a
    downstream stage is active. Where the engine runs them as two calls (`prefill_then_decode`,
    the reference engine) a prompt's first token comes at the end of the prefill part and
    the decode step holds only the sequences already running; otherwise both ride one pass
    and the first token comes at the iteration's end. When the
    batch's prefill carries an urgent prompt (`policy.prefill_sms`: short-path, or protected by
    now; chunk continuations included) the prefill part runs on S_aggr, overlapping the
    downstream's SMs as under MPS, and the decode part at the cap
    (`SharedCost.boosted_iteration_s`); one extra event at the end of that prefill part
    re-rates the downstream stages. While the running list is full and requests wait
    (`backlog`), a co-running iteration is lifted to S_aggr (level LIFTED): all of it overlaps
    the downstream's SMs as under MPS, and the downstream stages keep S_tot − S_cap;
  * the downstream stages (`sim.downstream`), fluid batch servers whose step time depends on
    their SM share (S_tot − cap under HorizonServe's partition while the shared stage runs,
    S_tot − S_cap while it is lifted, the whole GPU otherwise) and on whether the shared stage
    is running.
The memory-pressure sample handed to the policy at each step is the artifact's pressure model
for what ran during the previous interval, plus seeded Gaussian noise. With `record_steps` the
result carries one row per iteration in the reference engine's step-trace columns
(`STEP_COLUMNS`), to set beside a campaign's `steps.jsonl.gz`.

Deterministic for a given trace, system and seed: one event heap ordered by (time, sequence),
no wall clock in any decision, one seeded RNG (pressure noise).
"""

from __future__ import annotations

import heapq
import itertools
import math
import random
import time
from typing import Any

import numpy as np

from horizonserve.runtime.artifact import DownstreamStageCalibration
from horizonserve.runtime.config import Metric, Path
from horizonserve.runtime.downstream import Stamp, realtime_streams
from horizonserve.runtime.policy import SchedulingPolicy, make_policy
from horizonserve.runtime.profiler import InputFeatures
from horizonserve.runtime.sim.baselines import BaselineHooks
from horizonserve.runtime.sim.downstream import FluidStage, Job
from horizonserve.runtime.sim.model import DownstreamCost, PressureModel, SharedCost, Sharing
from horizonserve.runtime.sim.request import NOT_YET, SimRequest, sig_of, sync_sig
from horizonserve.runtime.sim.result import SimResult
from horizonserve.runtime.sim.setup import SimSetup
from horizonserve.runtime.sim.shared import Batch, SharedStage
from horizonserve.runtime.sim.systems import System, get_system
from horizonserve.runtime.spatial import (
    AGGRESSIVE,
    LIFTED,
    OPEN,
    RESERVED,
    UNCAPPED,
    partitioned,
)
from horizonserve.runtime.workload import Trace

_ARRIVAL, _SHARED_DONE, _DOWN, _POLL, _PREFILL_DONE = 0, 1, 2, 3, 4
_POLL_S = 1e-3  # retry delay when nothing in the view can run (only with long_path_cap = 0)
_TRACE_DT = 0.02  # control-trace resolution (s) unless the cap changes
# `record_steps`: the reference engine's step-trace columns the simulator has (bench/eval
# campaign steps.jsonl.gz), one row per iteration; prefill_s / decode_s are its two parts.
STEP_COLUMNS = (
    "t", "shared_sms", "downstream_sms", "level", "decode_batch", "prefill_batch",
    "prefill_tokens", "prefill_s", "decode_s", "downstream_active", "prefill_sms",
)  # fmt: skip
_PARTITION, _MPS = Sharing.PARTITION, Sharing.MPS  # hot path: no enum lookups


class Simulator:
    """One run. Build, `run()`, read the SimResult."""

    def __init__(
        self,
        setup: SimSetup,
        trace: Trace,
        system: System | str,
        *,
        seed: int = 0,
        record_trace: bool = False,
        solo: bool = False,
        record_steps: bool = False,
        baseline: dict[str, Any] | None = None,
    ) -> None:
        self.setup = setup
        self.trace = trace
        self.system = get_system(system)
        self.seed = seed
        self.solo = solo  # closed loop: each request arrives once the GPU is idle
        cal = setup.cal
        self.policy = _make_policy(setup, self.system)
        self.shared = SharedStage(cal.shared)
        self.cost = SharedCost(cal)
        self.hooks = BaselineHooks(self, **(baseline or {}))  # `runtime.baselines`' rules
        self.shared.reorder = self.hooks.reorder()
        self.pressure = PressureModel(cal)
        self.noise_sd = cal.pressure.noise_sd
        self.rng = random.Random(seed)
        self.total_sms = cal.ladder.total
        self.lifted_down_sms = cal.ladder.headroom(cal.ladder.s_cap)  # S_tot − S_cap
        self.uncapped_sharing = self.system.uncapped_sharing
        self.events: list[tuple[float, int, int, int, int]] = []
        self._seq = itertools.count()
        self.stages = [self._make_stage(i, d) for i, d in enumerate(cal.downstream)]
        self.preemptive = self.policy.preemption
        self.ref_batch = cal.downstream[0].max_batch
        self.requests: list[SimRequest] = []
        self._class_meta = [(c.path is Path.LONG, c.metric, c.name) for c in setup.slo.classes]
        names = [c.name for c in setup.slo.classes]
        self._cls_map = [names.index(n) for n in trace.classes]
        # Shared-stage state.
        self.busy = False
        self.batch: Batch | None = None
        self.sms = self.total_sms
        self.down_sms = self.total_sms
        self.sharing = self.uncapped_sharing
        self.level: int | None = None  # the spatial level of the last decision
        self.prev_decided_sms: int | None = None  # the last iteration's SMs (switch cost)
        self.prev_busy_until = -1.0  # end time of the last iteration
        self.prev_sms = self.total_sms
        self.split = cal.shared.prefill_then_decode  # prefill and decode as two calls
        self.prefill_end = 0.0  # when the current iteration's prefill part ends
        self.responded = 0
        self.record_trace = record_trace
        self.trace_out: dict[str, list[float]] | None = (
            {"t": [], "cap": [], "pressure": [], "sample": [], "down_jobs": [], "down_active": []}
            if record_trace
            else None
        )
        self._trace_last = -1.0
        self._trace_last_cap = -1
        # One row per iteration, the engine's step-trace columns (`STEP_COLUMNS`).
        self.steps_out: list[tuple[float | int, ...]] | None = [] if record_steps else None
        # Statistics.
        self.iterations = 0
        self.boosted = 0  # iterations whose prefill ran above the cap
        self.lifted = 0  # iterations lifted to S_aggr by a backlog while co-running
        self.reserved = 0  # iterations on the reservation (level RESERVED)
        self.events_done = 0
        self.busy_time = 0.0
        self.corun_time = 0.0
        self.cap_time = 0.0  # Σ cap · duration over co-running iterations
        self.pressure_sum = 0.0
        self.pressure_n = 0

    # -- events -------------------------------------------------------------------------------
    def _push(self, t: float, kind: int, a: int = 0, b: int = 0) -> None:
        heapq.heappush(self.events, (t, next(self._seq), kind, a, b))

    def _schedule_down(self, t: float, stage: int, version: int) -> None:
        self._push(t, _DOWN, stage, version)

    def _make_stage(self, i: int, cal: DownstreamStageCalibration) -> FluidStage:
        """A downstream stage with the policy's admission queue; under downstream control a
        streaming stage admits new streams only up to its real-time capacity, judged at the
        guaranteed co-running split (S_tot − S_cap, next to a busy shared stage), and the last
        stage, when its first output is its completion, chooses its batch (`choose_batch`)."""
        cost = DownstreamCost(cal, self.setup.cal)
        limit = None
        if self.policy.downstream_control and cal.work_per_audio_second > 0:
            ladder = self.setup.cal.ladder
            down = ladder.headroom(ladder.s_cap)

            def step_s(b: int) -> float:
                return cost.step_s(b, down, True, ladder.s_cap, Sharing.PARTITION)

            limit = realtime_streams(step_s, 1.0 / cal.work_per_audio_second, cal.max_batch)
        queue = self.policy.downstream_queue()
        if self.hooks.active:
            queue, limit = self.hooks.stage(cal, cost, queue, limit)
        return FluidStage(
            i,
            cost,
            self._schedule_down,
            queue,
            limit,
            reject_late=self.policy.reject_late and i == 0,  # refused at the hand-off
            places=self.policy.place_admission and cal.work_per_audio_second > 0,
            last=i == len(self.setup.cal.downstream) - 1,  # batch choice (sim.downstream)
            saturated_first=self.policy.saturated_first,
        )

    # -- requests ------------------------------------------------------------------------------
    def _make_request(self, i: int) -> tuple[SimRequest, InputFeatures]:
        tr = self.trace
        cal = self.setup.cal.shared
        ci = self._cls_map[int(tr.cls[i])]
        long_path, metric, _ = self._class_meta[ci]
        audio_in = float(tr.audio_s[i])
        video = float(tr.video_s[i])
        images = int(tr.images[i])
        text = int(tr.text_tokens[i])
        video_tokens = round(video * cal.tokens_per_video_second)
        prompt = (
            text
            + round(audio_in * cal.tokens_per_audio_second)
            + round(images * cal.tokens_per_image)
            + video_tokens
        )
        prompt = max(prompt, 1)
        audio_out = float(tr.output_audio_s[i])
        out_tokens = int(tr.output_tokens[i])
        if long_path and metric is Metric.TTFO and cal.decode_tokens_per_output_audio_second > 0:
            decode_len = max(1, round(audio_out * cal.decode_tokens_per_output_audio_second))
        elif long_path:
            decode_len = max(0, out_tokens)
        else:
            decode_len = max(1, out_tokens)
        handoff = cal.handoff_after_tokens
        handoff_at = decode_len if handoff is None else min(handoff, decode_len)
        req = SimRequest(
            i,
            ci,
            float(tr.arrival[i]),
            prompt,
            decode_len,
            handoff_at,
            long_path,
            audio_out,
            images,
        )
        features = InputFeatures(
            input_tokens=text + video_tokens, audio_seconds=audio_in, images=images
        )
        return req, features

    def _on_arrival(self, i: int, now: float) -> None:
        req, features = self._make_request(i)
        req.arrival = now  # equals the trace's time except in the solo closed loop
        self.requests.append(req)
        if not self.solo and i + 1 < len(self.trace):
            self._push(float(self.trace.arrival[i + 1]), _ARRIVAL, i + 1)
        if not self.shared.fits_ever(req):
            return  # can never be admitted: counted as a miss
        if self.hooks.active and not self.hooks.admit(req):
            return  # refused by the queue limits (shed): counted as a miss
        req.sig = self.policy.admit(
            str(i), now, class_name=self._class_meta[req.cls][2], features=features
        )
        self.shared.waiting[req.sig] = req
        if not self.busy:
            self._start_iteration(now)
            self._rerate_all(now)

    # -- shared stage ---------------------------------------------------------------------------
    def _downstream_active(self) -> bool:
        return any(s.active for s in self.stages)

    def _occupancy(self) -> float:
        return sum(s.in_service for s in self.stages) / self.ref_batch

    def _sample(self, now: float) -> float:
        """The memory-activity sample for the interval that just ended."""
        busy_before = self.prev_busy_until >= now - 1e-12
        level = self.pressure.level(busy_before, self.prev_sms, self._occupancy(), self.sharing)
        if self.noise_sd:
            level += self.rng.gauss(0.0, self.noise_sd)
        return 0.0 if level < 0.0 else 1.0 if level > 1.0 else level

    def _start_iteration(self, now: float) -> None:
        shared = self.shared
        active = self._downstream_active()
        sample = self._sample(now)
        # Backlog, "no place for a waiting request": every sequence slot is taken. KV is
        # reserved at admission and (500k tokens for 16 sequences) does not bind first; the
        # reference engine (one KV slot per sequence) and vLLM (max_num_running_reqs) count
        # slots too.
        backlog = len(shared.running) >= shared.max_seqs and bool(shared.waiting)
        dec = self.policy.step(
            now,
            downstream_active=active,
            pressure_sample=sample,
            backlog=backlog,
            running=lambda: (sync_sig(r) for r in shared.running if _first_pending(r)),
            downstream_slack=lambda: self._downstream_slack(now),
        )
        sm = dec.sm
        level = sm.level
        if level == AGGRESSIVE or partitioned(level):  # nothing co-running, or a partition
            sms, down, sharing = sm.shared, sm.downstream, _PARTITION
        elif level == UNCAPPED:
            sms, down, sharing = self.total_sms, self.total_sms, self.uncapped_sharing
        elif level == OPEN:  # uncapped beside the downstream, as MPS clients
            sms, down, sharing = self.total_sms, self.total_sms, _MPS
        else:  # LIFTED (the one level left): S_aggr over the downstream's SMs (MPS clients
            # under the Green Contexts, as a boosted prefill); the downstream keeps S_tot − S_cap.
            sms, down, sharing = sm.shared, self.lifted_down_sms, _MPS
        if self.hooks.active:
            sms, down, sharing = self.hooks.split(now, sms, down, sharing)
        # A Green Context switch is paid when the SM count changes (S_aggr ↔ LIFTED: none).
        switched = self.prev_decided_sms is not None and sms != self.prev_decided_sms
        self.prev_decided_sms = sms
        self.level = level
        if backlog and self.preemptive:
            tpot = self.cost.iteration_s(sms, len(shared.running), 0, 0, active, sharing, False)
            shared.preempt_for_urgent(dec, self.policy, tpot)
        batch = shared.form_batch(dec.view, self.policy)
        if not batch.seqs:
            self.busy = False
            self.batch = None
            if shared.waiting:
                self._push(now + _POLL_S, _POLL)
            return
        prefill_sms = sms
        if sm.prefill != sm.shared and batch.chunks:  # a boost is possible: ask the decision
            # Every chunk counts: a continuation of an urgent prompt is still urgent.
            prefill_sms = dec.prefill_sms(sig_of(req) for req, _ in batch.chunks)
        # The decode step's rows: every sequence of a one-pass iteration, or only those
        # already running when the prefill is its own call (`prefill_then_decode`).
        seqs = len(batch.decodes) if self.split else batch.seqs
        if prefill_sms == sms:
            pre, dec_s = self.cost.iteration_parts(
                sms, seqs, batch.padded_tokens, batch.cached_tokens, active, sharing
            )
            if switched:
                pre += self.cost.switch_s
            dur = pre + dec_s
        else:  # only under the partition while co-running (sm.prefill > sm.shared)
            pre, dec_s = self.cost.boosted_iteration_s(
                sms, prefill_sms, seqs, batch.padded_tokens, batch.cached_tokens
            )
            dur = pre + dec_s
            sharing = Sharing.MPS  # the downstream's view until the prefill part ends
            self.boosted += 1
            self._push(now + pre, _PREFILL_DONE)
        self.prefill_end = now + pre
        self.busy = True
        self.batch = batch
        self.sms, self.down_sms, self.sharing = sms, down, sharing
        self.iterations += 1
        if level == LIFTED:
            self.lifted += 1
        elif level == RESERVED:
            self.reserved += 1
        self.busy_time += dur
        if active:
            self.corun_time += dur
            self.cap_time += sms * dur
        if dec.pressure is not None:
            self.pressure_sum += dec.pressure
            self.pressure_n += 1
        if self.trace_out is not None:
            self._record(now, sms, dec.pressure, sample, active)
        if self.steps_out is not None:
            self.steps_out.append(
                (now, sms, down, int(level), len(batch.decodes), len(batch.chunks),
                 batch.prefill_tokens, pre, dec_s, int(active), prefill_sms)
            )  # fmt: skip
        self._push(now + dur, _SHARED_DONE)

    def _downstream_slack(self, now: float) -> float | None:
        """The downstream side's smallest slack ratio over its stages (None: none pending)."""
        best = None
        for stage in self.stages:
            u = stage.min_slack(now)
            if u is not None and (best is None or u < best):
                best = u
        return best

    def _on_prefill_done(self, now: float) -> None:
        """The boosted prefill part ended: the decode part runs inside the partition."""
        self.sharing = Sharing.PARTITION
        self._rerate_all(now)

    def _record(
        self, now: float, sms: int, pressure: float | None, sample: float, active: bool
    ) -> None:
        if now - self._trace_last < _TRACE_DT and sms == self._trace_last_cap:
            return
        self._trace_last = now
        self._trace_last_cap = sms
        out = self.trace_out
        assert out is not None
        out["t"].append(round(now, 6))
        out["cap"].append(sms)
        out["pressure"].append(float("nan") if pressure is None else round(pressure, 4))
        out["sample"].append(round(sample, 4))
        s0 = self.stages[0]
        out["down_jobs"].append(s0.in_service + s0.waiting)
        out["down_active"].append(1 if active else 0)

    def _on_shared_done(self, now: float) -> None:
        batch = self.batch
        assert batch is not None
        self.prev_busy_until = now
        self.prev_sms = self.sms
        shared = self.shared
        for req, tokens in batch.chunks:
            req.prefilled += tokens
            if req.prefilled >= req.prompt and req.restart:  # recompute done: one more token
                req.restart = False
                req.decoded += 1
                req.last_token = now
                self._progress(req, now)
            elif req.prefilled >= req.prompt:
                first = self.prefill_end if self.split else now  # the prefill call's end
                if self.hooks.active:
                    self.hooks.prefilled(req)
                if req.decode_len > 0:
                    req.decoded = 1
                    req.first_token = first
                    req.last_token = first
                if not req.long_path:
                    self._respond(req, first)
                self._progress(req, now)
        for req in batch.decodes:
            req.decoded += 1
            req.last_token = now
            self._progress(req, now)
        shared.prune()
        self.batch = None
        if shared.has_work:
            self._start_iteration(now)
        else:
            self.busy = False
        self._rerate_all(now)
        if self.solo and not self.busy and not self._downstream_active():
            self._next_solo(now)

    def _progress(self, req: SimRequest, now: float) -> None:
        if req.long_path and not req.handed and req.decoded >= req.handoff_at:
            req.handed = True
            req.stamp = Stamp.of(sync_sig(req))
            self._submit(0, req, now, head=True, from_chunk=False)
        if req.decoded >= req.decode_len and req.prefilled >= req.prompt:
            self.shared.release(req)
            if self.hooks.active:
                self.hooks.finished(req)

    # -- downstream chain ----------------------------------------------------------------------
    def _submit(self, k: int, req: SimRequest, now: float, head: bool, from_chunk: bool) -> None:
        stage = self.stages[k]
        cal = stage.cost.cal
        total = stage.cost.work(req.audio_out_s, req.images)
        first = cal.first_output_work
        if head and from_chunk:
            work = first if first is not None and first < total else total
            job = Job(req, k, work, None, True)
        elif head:
            job = Job(req, k, total, first, True)
        else:
            rest = total - (first if first is not None and first < total else total)
            if rest <= 1e-9:
                return
            job = Job(req, k, rest, None, False)
        stage.submit(job, now)
        self._rerate(stage, now, force=True)

    def _on_down(self, k: int, version: int, now: float) -> None:
        stage = self.stages[k]
        if version != stage.version:
            return
        last = k == len(self.stages) - 1
        for job, is_first in stage.pop_due(now):
            req = job.req
            if is_first:
                if last:
                    self._respond(req, now)
                else:
                    self._submit(k + 1, req, now, head=True, from_chunk=True)
            elif job.head and job.first is None:
                if last:
                    self._respond(req, now)
                else:
                    self._submit(k + 1, req, now, head=True, from_chunk=False)
            elif job.head and not last:
                self._submit(k + 1, req, now, head=False, from_chunk=False)
        self._rerate(stage, now, force=True)
        if self.solo and not self.busy and not self._downstream_active():
            self._next_solo(now)

    def _rerate(self, stage: FluidStage, now: float, force: bool = False) -> None:
        if self.busy:
            stage.rerate(now, self.down_sms, True, self.sms, self.sharing, force)
        else:
            down = self.hooks.idle_down_sms(self.total_sms)
            stage.rerate(now, down, False, self.total_sms, self.sharing, force)

    def _rerate_all(self, now: float) -> None:
        for stage in self.stages:
            self._rerate(stage, now)

    def _respond(self, req: SimRequest, now: float) -> None:
        if req.first_response == NOT_YET:
            req.first_response = now
            self.responded += 1

    # -- solo (closed loop) ----------------------------------------------------------------------
    def _next_solo(self, now: float) -> None:
        i = len(self.requests)
        if i < len(self.trace):
            self._push(now + 1e-3, _ARRIVAL, i)

    # -- run ---------------------------------------------------------------------------------------
    def run(self) -> SimResult:
        wall0 = time.perf_counter()
        cpu0 = time.process_time()
        tr = self.trace
        n = len(tr)
        targets = self.setup.targets()
        max_target = max(targets.values()) if targets else 0.0
        horizon = (float(tr.arrival[-1]) if n else 0.0) + max_target * 1.05 + 1.0
        if self.solo:
            horizon = math.inf
        if n:
            self._push(0.0 if self.solo else float(tr.arrival[0]), _ARRIVAL, 0)
        events = self.events
        now = 0.0
        pop = heapq.heappop
        while events:
            t, _, kind, a, b = pop(events)
            if t > horizon:
                break
            now = t
            self.events_done += 1
            if kind == _SHARED_DONE:
                self._on_shared_done(now)
            elif kind == _DOWN:
                self._on_down(a, b, now)
            elif kind == _ARRIVAL:
                self._on_arrival(a, now)
            elif kind == _PREFILL_DONE:
                self._on_prefill_done(now)
            elif kind == _POLL and not self.busy and self.shared.has_work:
                self._start_iteration(now)
                self._rerate_all(now)
            if self.responded == n and len(self.requests) == n and not self.shared.has_work:
                break
        for s in self.stages:
            s.finish(now)
        wall = time.perf_counter() - wall0
        cpu = time.process_time() - cpu0
        return self._result(now, wall, cpu)

    def _result(self, end: float, wall: float, cpu: float) -> SimResult:
        setup = self.setup
        tr = self.trace
        n = len(tr)
        cls = np.array([self._cls_map[int(c)] for c in tr.cls], dtype=np.int64)
        latency = np.full(n, np.nan)
        tpot = np.full(n, np.nan)
        for req in self.requests:
            if req.first_response != NOT_YET:
                latency[req.idx] = req.first_response - req.arrival
            if req.decoded >= 2 and req.decoded >= req.decode_len:
                tpot[req.idx] = (req.last_token - req.first_token) / (req.decoded - 1)
        names = setup.class_names
        targets = setup.targets()
        sim_s = max(end, 1e-9)
        stats = {
            "sim_s": sim_s,
            "wall_s": wall,
            "cpu_s": cpu,
            "speed_x": sim_s / wall if wall > 0 else float("inf"),
            "cpu_speed_x": sim_s / cpu if cpu > 0 else float("inf"),
            "events": float(self.events_done),
            "iterations": float(self.iterations),
            "boosted_frac": self.boosted / self.iterations if self.iterations else 0.0,
            "lifted_frac": self.lifted / self.iterations if self.iterations else 0.0,
            "reserved_frac": self.reserved / self.iterations if self.iterations else 0.0,
            "shared_busy_frac": self.busy_time / sim_s,
            "corun_frac": self.corun_time / sim_s,
            "mean_cap_corun": self.cap_time / self.corun_time if self.corun_time else float("nan"),
            "mean_pressure": self.pressure_sum / self.pressure_n
            if self.pressure_n
            else float("nan"),
        }
        for s in self.stages:
            stats[f"{s.cost.cal.name}_busy_frac"] = s.busy_time / sim_s
        stats["downstream_late"] = float(sum(s.late for s in self.stages))
        stats["downstream_rejected"] = float(sum(s.rejected for s in self.stages))
        stats["downstream_paused"] = float(sum(s.paused for s in self.stages))
        stats["underruns"] = float(sum(s.underruns for s in self.stages))
        stats["preemptions"] = float(self.shared.preemptions)
        stats.update(self.hooks.stats())
        return SimResult(
            system=self.system.name,
            pipeline=setup.spec.name,
            seed=self.seed,
            rate=tr.rate,
            duration_s=tr.duration_s if tr.duration_s else float(tr.arrival[-1]) + 1e-9,
            warmup_s=tr.warmup_s,
            classes=names,
            long_class=np.array([c.path is Path.LONG for c in setup.slo.classes]),
            targets=np.array([targets[c] for c in names]),
            cls=cls,
            arrival=np.array([r.arrival for r in sorted(self.requests, key=lambda r: r.idx)])
            if self.solo
            else tr.arrival.copy(),
            latency=latency,
            tpot=tpot,
            stats=stats,
            trace=self.trace_out,
            steps=None
            if self.steps_out is None
            else {"columns": list(STEP_COLUMNS), "rows": self.steps_out},
        )


def _first_pending(req: SimRequest) -> bool:
    """The request's first response still depends on the shared stage."""
    return not req.handed if req.long_path else req.prefilled < req.prompt


def _make_policy(setup: SimSetup, system: System) -> SchedulingPolicy:

    return make_policy(system.policy, setup.serving_config(system.policy))


def simulate(
    setup: SimSetup,
    trace: Trace,
    system: System | str,
    *,
    seed: int = 0,
    record_trace: bool = False,
    record_steps: bool = False,
    baseline: dict[str, Any] | None = None,
) -> SimResult:
    """Run `trace` through `system` on the simulated GPU (see module docstring). `baseline`:
    keyword settings of the 2026 baselines' rules (`sim.baselines.BaselineHooks`: limits,
    share, window)."""
    sim = Simulator(
        setup,
        trace,
        system,
        seed=seed,
        record_trace=record_trace,
        record_steps=record_steps,
        baseline=baseline,
    )
    return sim.run()
