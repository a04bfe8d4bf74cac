"""The simulator's side of the 2026 baselines (`runtime.baselines`): one object the engine
calls at arrival, at a prompt's first token, when a request leaves the shared stage, when it
builds a downstream stage, and when it picks an iteration's SMs. Under every other policy
each hook is the identity (`BaselineHooks.active` False: the engine skips them)."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from horizonserve.runtime.audio_window import (
    DTPS_THRESHOLD,
    EdfQueue,
    dtps_budget,
    dtps_order,
    window_size,
)
from horizonserve.runtime.baselines import BaselineRules, rules_for, static_share
from horizonserve.runtime.config import Path
from horizonserve.runtime.downstream import AdmissionQueue, realtime_streams
from horizonserve.runtime.shedding import QueueGate, QueueLimits, limits_for
from horizonserve.runtime.sim.model import DownstreamCost, Sharing
from horizonserve.runtime.sim.request import SimRequest

if TYPE_CHECKING:
    from horizonserve.runtime.sim.engine import Simulator

    DownstreamStageCalibration = Any  # the calibration artifact's stage entry


def default_limits(sim: Simulator) -> QueueLimits:
    """vLLM's sizing advice (`shedding.limits_for`) on the simulated pipeline: the tightest
    short-path SLO × the calibrated prefill tokens/s on the whole GPU, and 2 × max_num_seqs."""
    setup = sim.setup
    targets = setup.targets()
    short = [targets[c.name] for c in setup.slo.classes if c.path is Path.SHORT]
    ttft = min(short) if short else min(targets.values())
    per_token = sim.cost.prefill_token_s(setup.cal.ladder.total)
    return limits_for(setup.cal.shared.max_num_seqs, ttft, 1.0 / max(per_token, 1e-12))


class BaselineHooks:
    """One run's baseline rules over the simulator's state."""

    def __init__(
        self,
        sim: Simulator,
        limits: QueueLimits | None = None,
        share: int | None = None,
        window: int | None = None,
    ) -> None:
        self.sim = sim
        self.rules: BaselineRules = rules_for(sim.system.policy)
        r = self.rules
        self.active = r.shed or r.window or r.tiered or r.static_share
        self.gate = QueueGate(limits or default_limits(sim)) if r.shed else None
        total = sim.setup.cal.ladder.total
        self.share = static_share(sim.setup.spec.name, total, share) if r.static_share else None
        self.window_k = window  # None: each streaming stage's real-time stream count
        self.windows: list[int] = []  # K per streaming stage, as built
        self.shed_ids: list[int] = []  # trace indices the queue limits refused
        self.now = 0.0

    # -- shared stage -----------------------------------------------------------------------
    def admit(self, req: SimRequest) -> bool:
        """False: refused by the queue limits (never served, a miss)."""
        if self.gate is None or self.gate.admit(str(req.idx), req.prompt) is None:
            return True
        self.shed_ids.append(req.idx)
        return False

    def prefilled(self, req: SimRequest) -> None:
        if self.gate is not None:
            self.gate.prefilled(str(req.idx))

    def finished(self, req: SimRequest) -> None:
        if self.gate is not None:
            self.gate.finished(str(req.idx))

    def reorder(self) -> Callable[[list[SimRequest]], list[SimRequest]] | None:
        """The shared stage's reordering of its visible waiting requests (DTPS), or None."""
        if not self.rules.tiered:
            return None
        sim = self.sim

        def tiers(waiting: list[SimRequest]) -> list[SimRequest]:
            queued = sim.stages[0].waiting if sim.stages else 0
            running = sum(1 for r in sim.shared.running if r.long_path)
            return dtps_order(
                waiting,
                self.now,
                downstream=_long,
                prompt_tokens=_prompt,
                arrival=_arrival,
                budget=dtps_budget(DTPS_THRESHOLD, queued, running),
            )

        return tiers

    def split(self, now: float, sms: int, down: int, sharing: Sharing) -> tuple[int, int, Sharing]:
        """An iteration's (shared SMs, downstream SMs, sharing): mps-static fixes them."""
        self.now = now
        if self.share is None:
            return sms, down, sharing
        return self.share, self.sim.total_sms - self.share, Sharing.PARTITION

    def idle_down_sms(self, total: int) -> int:
        """The downstream stages' SMs while the shared stage is idle."""
        return total if self.share is None else total - self.share

    # -- downstream stages --------------------------------------------------------------------
    def stage(
        self,
        cal: DownstreamStageCalibration,
        cost: DownstreamCost,
        queue: AdmissionQueue,
        limit: int | None,
    ) -> tuple[AdmissionQueue, int | None]:
        """A streaming stage under the bounded-K window: an EDF queue and K places for new
        streams (K: `window`, else the streams it keeps at real time uncapped under MPS beside
        a busy shared stage: the best-informed fixed K)."""
        if not self.rules.window or cal.work_per_audio_second <= 0:
            return queue, limit
        total = self.sim.setup.cal.ladder.total
        k = self.window_k
        if k is None:

            def step_s(b: int) -> float:
                return cost.step_s(b, total, True, total, Sharing.MPS)

            k = realtime_streams(step_s, 1.0 / cal.work_per_audio_second, cal.max_batch)
        k = window_size(k, cal.max_batch)  # K = min(window, max_num_seqs)
        self.windows.append(k)
        return EdfQueue(), k

    def stats(self) -> dict[str, float]:
        out: dict[str, float] = {}
        if self.gate is not None:
            out["shed"] = float(self.gate.refused_total)
        if self.share is not None:
            out["static_share_sms"] = float(self.share)
        if self.windows:
            out["window_k"] = float(self.windows[0])
        return out


def _long(req: SimRequest) -> bool:
    return req.long_path


def _prompt(req: SimRequest) -> int:
    return req.base_prompt


def _arrival(req: SimRequest) -> float:
    return req.arrival
