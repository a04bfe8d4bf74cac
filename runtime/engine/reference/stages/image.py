"""Downstream image stage: a diffusion-transformer denoising loop with continuous batching.

Each request is a latent of `patch_tokens` patches, conditioned on the thinker's last
`cond_tokens` hidden states. Every iteration runs one denoising step (rectified-flow Euler
update) for up to `dit_max_batch` images, each at its own step; new images join at any
iteration. After its last step an image goes through the latent decoder: the finished image
is the first (and only) response (end-to-end latency).

Under downstream control the batch is admitted by `runtime.batch_admission`: the stage measures
its own step time per batch size and chooses each step's batch by it (see that module).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from horizonserve.runtime.batch_admission import StepTimes, Work, choose_batch
from horizonserve.runtime.downstream import Stamp, reported_slack
from horizonserve.runtime.engine.reference.models import DiT, LatentDecoder
from horizonserve.runtime.engine.reference.presets import PipelinePreset
from horizonserve.runtime.engine.reference.protocol import DONE, FIRST, IMAGE, Event, Handoff
from horizonserve.runtime.engine.reference.stages.admission import (
    DownstreamRules,
    StageQueue,
    downstream_rules,
    min_slack,
    refuse_late,
)

STAGE = IMAGE


@dataclass(slots=True)
class ImageJob:
    rid: str
    cond: torch.Tensor  # [cond_tokens, thinker_hidden]
    x: torch.Tensor  # [patch_tokens, latent_channels], noise at t = 1
    steps: int
    arrival: float = float("inf")  # the request's arrival (synthetic load: never aborted)
    done_steps: int = 0
    stamp: Stamp | None = None  # the shared stage's deadline stamp (None: synthetic)


def _rid(job: ImageJob) -> str:
    return job.rid


def _work(job: ImageJob) -> Work:
    deadline = job.stamp.deadline if job.stamp is not None else math.inf
    return Work(deadline, job.steps - job.done_steps)


class ImageStage:
    def __init__(
        self,
        dit: DiT,
        decoder: nn.Module,
        preset: PipelinePreset,
        *,
        emit: Callable[[Event], None],
        clock: Callable[[], float] = time.monotonic,
        rules: DownstreamRules | None = None,
    ) -> None:
        self.dit = dit
        self.decoder = decoder
        self.dims = preset.dit
        self.max_batch = preset.dit_max_batch
        p = next(dit.parameters())
        self.device, self.dtype = p.device, p.dtype
        self.rules = rules or DownstreamRules()
        self.pending: StageQueue[ImageJob] = StageQueue(self.rules.slack, clock)
        self.active: list[ImageJob] = []
        self.emit = emit
        self._clock = clock
        self._synthetic = 0
        self.times: StepTimes | None = None  # measured step time per batch (from the first stamp)
        self.paused = 0  # in-service jobs left out of a step's batch (back in the queue)
        self.last_timing: tuple[float, float, int, int] = (0.0, 0.0, 0, 0)

    def add_synthetic(self, n: int) -> None:
        """Top the stage up to `n` in flight with endless denoising jobs (calibration load)."""
        d = self.dims
        while self.in_flight < n:
            self._synthetic += 1
            cond = torch.randn(d.cond_tokens, self.dit.cond_in.in_features, device=self.device)
            x = torch.randn(d.patch_tokens, d.latent_channels, device=self.device)
            job = ImageJob(f"load-{self._synthetic}", cond.to(self.dtype), x.to(self.dtype), 10**9)
            self.pending.append(job, None)

    def cancel_all(self) -> None:
        self.pending.clear()
        self.active = []

    def abort(self, before: float) -> int:
        """Drop jobs whose request arrived at or before `before`; returns how many."""
        n = self.in_flight
        self.pending.retain(lambda j: j.arrival > before)
        self.active = [j for j in self.active if j.arrival > before]
        return n - self.in_flight

    def cancel(self, requests: tuple[tuple[str, float], ...]) -> int:
        """Drop the jobs of these (id, arrival) requests; returns how many."""
        n, gone = self.in_flight, dict(requests)
        self.pending.retain(lambda j: gone.get(j.rid) != j.arrival)
        self.active = [j for j in self.active if gone.get(j.rid) != j.arrival]
        return n - self.in_flight

    @property
    def in_flight(self) -> int:
        return len(self.pending) + len(self.active)

    @property
    def idle(self) -> bool:
        return self.in_flight == 0

    @property
    def waiting(self) -> int:
        """Hand-offs queued for a place (the queue depth DTPS reads at the shared stage)."""
        return len(self.pending)

    def submit(self, msg: Handoff) -> None:
        d = self.dims
        cond = msg.cond.to(self.device).to(self.dtype)[-d.cond_tokens :]
        if cond.shape[0] < d.cond_tokens:  # left-pad short prompts with zeros
            pad = cond.new_zeros(d.cond_tokens - cond.shape[0], cond.shape[1])
            cond = torch.cat((pad, cond))
        x = torch.randn(d.patch_tokens, d.latent_channels, device=self.device, dtype=self.dtype)
        steps = msg.target if msg.target else d.steps
        job = ImageJob(msg.rid, cond, x, max(1, steps), msg.arrival, stamp=msg.stamp)
        if self.times is None and msg.stamp is not None and msg.stamp.downstream_s > 0:
            self.times = StepTimes(msg.stamp.downstream_s / job.steps)  # prior: the solo step
        self.pending.append(job, msg.stamp)

    def counters(self) -> dict[str, int]:
        """Admissions past the point where the deadline could be met, and jobs paused."""
        return {"late_admitted": self.pending.late, "paused": self.paused}

    def configure(self, rules: DownstreamRules) -> None:
        """The policy's rules (no streams here: nothing yields)."""
        self.rules = rules
        self.pending.set_order(rules.slack)

    def min_slack(self) -> float:
        """The image is the first output: every active job's denoising is pending; SATURATED
        while the batch is full and an on-time job waits (`reported_slack`)."""
        started = ((j.stamp, 1.0 - j.done_steps / j.steps) for j in self.active)
        u = min_slack(self.pending, started, self._clock())
        full = len(self.active) >= self.max_batch
        return reported_slack(u, full, self.pending.peek_slack(), self.rules.saturated_first)

    @torch.inference_mode()
    def iterate(self) -> None:
        n = min(self.max_batch, len(self.active) + len(self.pending))
        t0 = time.monotonic()
        ran, finished = self._iterate()
        dt = time.monotonic() - t0
        if self.times is not None and not finished:  # a finishing step also runs the decoder
            self.times.observe(ran, dt)
        self.last_timing = (dt, 0.0, n, 0)

    def _admit(self) -> None:
        """Set the batch for the next step: by measured batch time under downstream control
        (`choose_batch`, over the jobs in service and the queued ones), else topped up to
        `max_batch` in queue order."""
        times = self.times if self.rules.slack else None
        if times is None:
            refuse_late(self.pending, self.rules, STAGE, _rid, self.emit)
            while self.pending and len(self.active) < self.max_batch:
                self.active.append(self.pending.popleft())
            return
        refuse_late(
            self.pending,
            self.rules,
            STAGE,
            _rid,
            self.emit,
            lambda j: (j.steps - j.done_steps) * times.fastest_solo(),  # late even alone
        )
        queued = list(self.pending)
        pool = self.active + queued
        chosen = [
            pool[i]
            for i in choose_batch([_work(j) for j in pool], self._clock(), times, self.max_batch)
        ]
        ids = {id(j) for j in chosen}
        for job in self.active:
            if id(job) not in ids:  # paused: back to the queue with its progress
                self.pending.append(job, job.stamp)
                self.paused += 1
        self.pending.take([j for j in queued if id(j) in ids])
        self.active = chosen

    def _iterate(self) -> tuple[int, bool]:
        """One denoising step; returns the batch size run and whether an image finished."""
        self._admit()
        jobs = self.active
        if not jobs:
            return 0, False  # every queued request was refused as late
        x = torch.stack([j.x for j in jobs])
        t = torch.tensor([1.0 - j.done_steps / j.steps for j in jobs], device=self.device)
        dt = torch.tensor([1.0 / j.steps for j in jobs], device=self.device, dtype=self.dtype)
        v = self.dit(x, t, torch.stack([j.cond for j in jobs]))
        x = x - dt.view(-1, 1, 1) * v
        finished: list[int] = []
        for i, j in enumerate(jobs):
            j.x = x[i]
            j.done_steps += 1
            if j.done_steps >= j.steps:
                finished.append(i)
        if finished:
            images = self.decoder(x[finished])
            shape = list(images.shape[1:])
            images.float().mean().item()  # host sync: the images exist now
            t_done = self._clock()
            for i in finished:
                job = jobs[i]
                data = {"steps": job.steps, "shape": shape}
                self.emit(Event(FIRST, STAGE, t_done, job.rid, data))
                self.emit(Event(DONE, STAGE, t_done, job.rid, data))
            self.active = [j for j in jobs if j.done_steps < j.steps]
        else:
            x.view(-1)[0].item()  # host sync per step keeps the step time honest
        return len(jobs), bool(finished)


# -- process entry ----------------------------------------------------------------------------


def main(cfg: Any, in_q: Any, events: Any) -> None:
    """Process body of the image stage (see `stages.run_stage`)."""
    from horizonserve.runtime.engine.reference.models import materialize
    from horizonserve.runtime.engine.reference.protocol import WireTensor
    from horizonserve.runtime.engine.reference.stages.downstream import DownstreamLoop

    loop = DownstreamLoop(cfg, STAGE, in_q, events)
    preset = loop.preset
    device, dtype = loop.device, loop.dtype
    t_load = time.monotonic()
    dit = materialize(lambda: DiT(preset.dit, preset.thinker.hidden), device, dtype)
    width = 128 if preset.name == "full" else 16
    decoder = materialize(lambda: LatentDecoder(preset.dit.latent_channels, width), device, dtype)
    sink: list[Event] = []
    rules = downstream_rules(loop.config)
    stage = ImageStage(dit, decoder, preset, emit=sink.append, rules=rules)
    if cfg.warmup:
        cond = WireTensor.of(torch.zeros(4, preset.thinker.hidden, dtype=dtype))
        for level in loop.warmup_levels():
            loop.sm.activate(level)
            stage.submit(Handoff("warmup", 0.0, cond, 2))
            while not stage.idle:
                stage.iterate()
        loop.sm.activate(None)
    stage.emit = events.put
    n_params = sum(p.numel() for p in dit.parameters())
    info = {"params": n_params, "load_s": time.monotonic() - t_load}
    loop.serve(stage, info)
