"""The shared stage's base scheduler: iteration-level batching with engine limits.

This is the vLLM-style batch builder the policies wrap; it holds no scheduling rule of its own
beyond the engine's: running requests first (decodes and unfinished prefill chunks), then the
waiting requests the policy's view shows, in view order, while the batch has a sequence slot,
token budget and KV capacity left (the first request that does not fit stops admission, as in
vLLM). Prefills are chunked to the token budget. A request's KV footprint (prompt + output) is
reserved at admission, so KV never forces a preemption. With `prefill_buckets` (the reference
engine) a batch's prefill runs every prompt at the longest one rounded up to a bucket
(`Batch.padded_tokens`, what the cost model charges).

Preemption is the policy's (`SchedulingPolicy.preemption_victim`, the control core's rule):
while every sequence slot is taken and a protected short-path request waits, the chosen
long-path decode leaves the running set, frees its slot and KV, and goes back to waiting as a
decode continuation that re-prefills its prompt and decoded tokens (vLLM's recompute).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from horizonserve.runtime.artifact import SharedStageCalibration
from horizonserve.runtime.policy import SchedulingPolicy, StepDecision
from horizonserve.runtime.profiler import RequestSignals
from horizonserve.runtime.sim.request import SimRequest, sig_of, sync_sig
from horizonserve.runtime.temporal import StepView


@dataclass(slots=True)
class Batch:
    """One iteration's work."""

    chunks: list[tuple[SimRequest, int]] = field(default_factory=list)  # prefill (req, tokens)
    decodes: list[SimRequest] = field(default_factory=list)
    prefill_tokens: int = 0
    cached_tokens: int = 0  # KV read by the decodes
    padded_tokens: int = 0  # tokens the prefill runs: prefill_tokens, or padded (`_pad`)

    @property
    def seqs(self) -> int:
        return len(self.chunks) + len(self.decodes)


class SharedStage:
    __slots__ = (
        "buckets",
        "kv_capacity",
        "kv_used",
        "max_seqs",
        "max_tokens",
        "preemptions",
        "reorder",
        "running",
        "waiting",
    )

    def __init__(self, cal: SharedStageCalibration) -> None:
        self.max_seqs = cal.max_num_seqs
        self.max_tokens = cal.max_num_batched_tokens
        self.kv_capacity = cal.kv_capacity_tokens
        self.kv_used = 0
        self.running: list[SimRequest] = []
        # Signals -> request, in FIFO arrival order (the policy's entry order): O(1) removal,
        # and the view's lookup from a request's signals.
        self.waiting: dict[RequestSignals, SimRequest] = {}
        self.preemptions = 0
        self.buckets = tuple(cal.prefill_buckets) if cal.prefill_buckets else ()
        # A baseline's reordering of the visible waiting requests (DTPS tiers), or None.
        self.reorder: Callable[[list[SimRequest]], list[SimRequest]] | None = None

    @property
    def has_work(self) -> bool:
        return bool(self.running) or bool(self.waiting)

    def fits_ever(self, req: SimRequest) -> bool:
        return req.kv_need <= self.kv_capacity

    def _next_free_s(self, tpot_s: float) -> float:
        """When the running request nearest completion frees its place (decode steps left ×
        the step time)."""
        left = min((r.decode_len - r.decoded for r in self.running), default=0)
        return max(left, 0) * tpot_s

    def preempt_for_urgent(
        self, decision: StepDecision, policy: SchedulingPolicy, tpot_s: float
    ) -> SimRequest | None:
        """With every slot taken: preempt the step's victim, if it names one (`decision`, as
        `policy.step` returned it, before `form_batch`; `tpot_s`: the current step time). The
        victim waits again as a continuation."""
        if len(self.running) < self.max_seqs:
            return None
        victim = decision.victim(self.running, sync_sig, _handed, self._next_free_s(tpot_s))
        if victim is None:
            return None
        now = decision.now
        self.running.remove(victim)
        self.kv_used -= victim.kv_need
        victim.preempt()
        sig = sync_sig(victim)
        sig.preempted += 1
        sig.prefilled = True  # a continuation for the view: always visible
        policy.requeue(sig, now)
        self.waiting[sig] = victim
        self.preemptions += 1
        return victim

    def form_batch(self, view: StepView, policy: SchedulingPolicy) -> Batch:
        """Build this iteration's batch; admitted requests leave the policy's waiting queue."""
        batch = self._form(view, policy)
        batch.padded_tokens = self._pad(batch)
        return batch

    def _pad(self, batch: Batch) -> int:
        """Tokens the batch's prefill runs: with `prefill_buckets`, every chunk at the longest
        one rounded up to a bucket (the reference engine pads the batch's prompts to one
        length); without, the tokens themselves."""
        if not self.buckets or not batch.chunks:
            return batch.prefill_tokens
        longest = max(n for _r, n in batch.chunks)
        size = next((b for b in self.buckets if b >= longest), longest)
        return size * len(batch.chunks)

    def _form(self, view: StepView, policy: SchedulingPolicy) -> Batch:
        batch = Batch()
        budget = self.max_tokens
        for req in self.running:
            left = req.prompt - req.prefilled
            if left > 0:
                if budget <= 0:
                    continue
                take = left if left < budget else budget
                batch.chunks.append((req, take))
                batch.prefill_tokens += take
                budget -= take
            else:
                batch.decodes.append(req)
                batch.cached_tokens += req.base_prompt + req.decoded
                budget -= 1
        running = self.running
        if budget <= 0 or len(running) >= self.max_seqs or not self.waiting:
            return batch
        taken: list[SimRequest] = []
        waiting = self.waiting
        visible: Iterable[SimRequest] = view.iter_visible(
            waiting.values(), sig_of, waiting.__getitem__
        )
        if self.reorder is not None:
            visible = self.reorder(list(visible))
        for req in visible:
            if len(running) >= self.max_seqs or budget <= 0:
                break
            if self.kv_used + req.kv_need > self.kv_capacity:
                break
            take = req.prompt if req.prompt < budget else budget
            self.kv_used += req.kv_need
            running.append(req)
            taken.append(req)
            policy.dequeue(sig_of(req))
            batch.chunks.append((req, take))
            batch.prefill_tokens += take
            budget -= take
        for req in taken:
            del waiting[sig_of(req)]
        return batch

    def release(self, req: SimRequest) -> None:
        """A request finished its shared-stage work."""
        self.kv_used -= req.kv_need

    def prune(self) -> None:
        """Drop finished requests from the running list."""
        self.running = [
            r for r in self.running if r.prefilled < r.prompt or r.decoded < r.decode_len
        ]


def _handed(req: SimRequest) -> bool:
    return req.handed
