"""Commands to the running stages that wait for an answer: switching the policy between runs,
aborting every request in flight, and the calibration probes.

Invariants:
- A command is sent and awaited holding the `_ready` condition; the dispatcher thread stores
  the stages' answers (`_policy_ack`, `_aborts`, `_probes`) under it and wakes the waiter.
  Each command clears its answer slot before sending, so an older answer never counts.
- A waiter fails fast (`PipelineError`) on a new stage error or a dead stage process, and
  after its timeout.
- The policy changes only when nothing is in flight (`_wait_idle`), downstream stages first,
  then the shared stage, whose acknowledgement ends the wait; the front's config and gate
  follow only after it. A policy that needs another GPU-sharing mode or other fixed SM
  shares is refused (`SharingMismatchError`): those are set when a stage process starts.
- An abort goes to producers before their consumers, each acknowledged before the next.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from horizonserve.runtime.baselines import check_engine, rules_for
from horizonserve.runtime.config import PolicyName
from horizonserve.runtime.engine.reference.errors import PipelineError, SharingMismatchError
from horizonserve.runtime.engine.reference.gpu_control import GC, MPS_GC
from horizonserve.runtime.engine.reference.protocol import (
    Abort,
    ProbeDecode,
    ProbeLoad,
    ProbeStop,
    SetPolicy,
)
from horizonserve.runtime.shedding import front_gate


class StageCommands:
    """Commands and their waits: a part of `Pipeline`, whose `__init__` sets up the state.
    Owns the answers `_policy_ack`, `_aborts` and `_probes` (written by the dispatcher)."""

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
            wanted = self._gpu.choose(name.value, True)
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
