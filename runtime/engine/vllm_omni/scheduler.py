"""HorizonServe inside vLLM-Omni's stage schedulers.

The shared stage (stage 0: Qwen2.5-Omni's thinker, MiMo-Audio's fused thinker-talker, BAGEL's
thinker) owns the one `SchedulingPolicy`. Per `schedule()` call (one shared-stage opportunity):

  1. the policy's waiting index is already in sync with `waiting` + `skipped_waiting`: hooks on
     `_enqueue_waiting_request` (new → `admit`, a resumed streaming session → `requeue`),
     `_preempt_request` (→ `requeue` as a continuation) and `_free_request` (→ `dequeue`) keep it
     so in O(1) per change; a cheap length check triggers a full audit only when the queues
     changed behind the hooks' back;
  2. `policy.step(now, downstream_active=<control record>, pressure_sample=<NVML>,
     backlog=<no free slot while requests wait>, running=<running requests whose first
     response is pending here>, downstream_slack=<the downstream slots' smallest slack>)`
     gives the queue view and the SM split (the last two only while downstream stages are
     active and the policy's slack split reads them);
     `backlog` is vLLM's own admission limit: `running` plus paused streaming sessions fill
     `max_num_running_reqs` while `waiting` / `skipped_waiting` hold requests other than
     those sessions (they wait for input, not for a place). The shared stage is then the
     bottleneck and, with downstream stages active, the policy lifts it to S_aggr (level
     LIFTED, published headroom S_tot − S_aggr; downstream workers keep their guaranteed
     S_tot − S_cap, see `worker.py`; `ControlParams.boost`);
  3. Omni's own gates run (`OmniARScheduler.schedule`), then — between them and vLLM's
     `Scheduler.schedule` — the view is applied: `waiting` / `skipped_waiting` are swapped for
     queues holding only the visible requests (at most `free slots + margin` of `waiting`, in
     queue order), vLLM's scheduler runs on them, and the originals are restored exactly:
     taken requests leave, requests the base scheduler put back (preempted, skipped) go to the
     front as it left them, every other request keeps its original position;
  2b. shared-stage preemption (policies with `preemption`): when a short-path prefill needs
     a place sooner than one frees by itself (protected, or able to meet its deadline only
     without that wait: `TemporalScheduler.short_needs_place`) and the running set is full —
     no free place (`max_num_running_reqs`) or too few free KV blocks for its first chunk —
     the policy may name a running long-path decode to preempt (`policy.preemption_victim`:
     most slack, never short-path, protected, still prefilling or preempted before, and only
     when its recompute costs less than the wait it saves). It is preempted through vLLM's
     own `_preempt_request` (KV blocks freed, back to the front of `waiting` as a decode
     continuation, reported to the model runner in `preempted_req_ids`), once per place those
     prefills need. In that step the view hides the victims and shows those short-path
     prefills first, so the freed places go to them and not straight back to the victims;
  4. requests the base scheduler took are `dequeue`d;
  5. the split is published in the control record, which the workers read before the forward.
     vLLM runs a step's prefills and decodes in one forward, so the shared count published is
     `policy.prefill_sms`: S_aggr when the step prefills an urgent prompt (short-path, or
     protected by now) toward its first token — new, resumed before any output, or a chunk
     continuation — else the cap; the downstream headroom stays as decided, so downstream
     stages keep their level (urgent-prefill boost, `ControlParams.boost`).

The view hook sits *inside* `OmniARScheduler.schedule()` (the class `_ViewHook` is placed
between Omni's scheduler and vLLM's in the MRO), exactly where Omni's own whole-queue deferral
hides `waiting`, so Omni's input gates, aborted-request drops and queue restores run on the real
queues, unchanged.

Downstream stages (talker, code2wav; the diffusion stage has no vLLM scheduler, see
`worker.py`) get thin subclasses that publish how many requests they run into their slot of
the control record, remember each request's carried stamp (class, original deadline,
downstream estimate) and admit from `waiting` in the order of the policy's downstream queue
(`admission.py`: slack order under HorizonServe, vLLM's own order for the baselines); with
slack order they also publish the smallest slack ratio of a first output pending there.

`ar_scheduler` / `generation_scheduler` are what the re-registered pipelines name as
`scheduler_cls`: vLLM's EngineCore calls them like a class.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Iterable
from itertools import chain, filterfalse, islice
from operator import attrgetter
from typing import Any

from vllm.v1.core.sched.request_queue import FCFSRequestQueue, create_request_queue
from vllm.v1.core.sched.scheduler import Scheduler as VLLMScheduler
from vllm.v1.request import RequestStatus
from vllm_omni.core.sched.omni_ar_scheduler import OmniARAsyncScheduler, OmniARScheduler
from vllm_omni.core.sched.omni_generation_scheduler import OmniGenerationScheduler

from horizonserve.runtime.config import ServingConfig, ViewOrder
from horizonserve.runtime.downstream import reported_slack
from horizonserve.runtime.engine.vllm_omni import shared
from horizonserve.runtime.engine.vllm_omni.admission import DownstreamAdmission
from horizonserve.runtime.engine.vllm_omni.settings import Knobs, resolve_config
from horizonserve.runtime.engine.vllm_omni.slack_order import (
    PrefillIndex,
    RecomputeCost,
    order_running,
    preemption_pays,
    view_order,
)
from horizonserve.runtime.engine.vllm_omni.stamps import (
    Stamp,
    external_id,
    known_priority,
    monotonic_from_wall,
    stamp_of_request,
)
from horizonserve.runtime.monitor import ControlRecord, RequestTable
from horizonserve.runtime.policy import SchedulingPolicy, StepDecision, make_policy
from horizonserve.runtime.preemption import choose_victim
from horizonserve.runtime.profiler import InputFeatures, RequestSignals
from horizonserve.runtime.spatial import SpatialController
from horizonserve.runtime.temporal import Phase, StepView

log = logging.getLogger(__name__)

SIG_ATTR = "_hs_sig"  # RequestSignals stored on the vLLM Request (no lookup on the hot path)
_SIG = attrgetter(SIG_ATTR)
STAMP_ATTR = "_hs_stamp"  # Stamp stored on a downstream stage's Request
_NAN = math.nan
_ANSWERED = (RequestStatus.FINISHED_STOPPED, RequestStatus.FINISHED_LENGTH_CAPPED)

# Stage kind codes written into a downstream slot (diagnostics only).
KIND_AR = 1
KIND_GENERATION = 2
KIND_DIFFUSION = 3


def _sig(request: Any) -> RequestSignals | None:
    return request.__dict__.get(SIG_ATTR)


def _paused_sessions(sched: Any) -> int:
    """Streaming sessions paused between inputs: in `skipped_waiting`, holding a place."""
    return getattr(sched, "num_waiting_for_streaming_input", 0)


def free_slots(sched: Any) -> int:
    """Places vLLM's scheduler may still admit into: `max_num_running_reqs` less `running` and
    the paused streaming sessions, which hold a model-runner slot outside `running`."""
    return sched.max_num_running_reqs - len(sched.running) - _paused_sessions(sched)


def backlogged(sched: Any, queued: int) -> bool:
    """No free place while a request waits for one; `queued` = len(waiting + skipped_waiting),
    of which the paused sessions wait for input, not for a place. O(1)."""
    paused = _paused_sessions(sched)
    return queued > paused and sched.max_num_running_reqs - len(sched.running) - paused <= 0


def is_continuation(request: Any) -> bool:
    """Prefill already done (or in progress) once: preempted, KV arrived, streaming resume."""
    return bool(request.num_computed_tokens or request.num_output_tokens or request.num_preemptions)


def _pressure_sampler() -> Callable[[], float | None] | None:
    """NVML memory activity when this process runs on a CUDA platform, else None."""
    try:
        from vllm.platforms import current_platform

        if not current_platform.is_cuda():
            return None
    except Exception:  # platform detection failed: behave as CPU
        return None
    from horizonserve.runtime.gpu import NvmlPressureSampler

    sampler = NvmlPressureSampler(0, min_interval_ns=20_000_000)
    if not sampler.available:  # logged once by the sampler
        return None

    def sample() -> float | None:
        value = sampler.sample()
        return None if value != value else value  # NaN → unknown

    return sample


class _Token:
    """What `hide` swapped out, for `restore`."""

    __slots__ = ("s", "vis_s", "vis_w", "vs", "vw", "w")

    def __init__(self, w: Any, s: Any, vis_w: list, vis_s: list, vw: Any, vs: Any) -> None:
        self.w, self.s, self.vis_w, self.vis_s, self.vw, self.vs = w, s, vis_w, vis_s, vw, vs


class SharedStageController:
    """The shared stage's decision-maker: one policy, its waiting index, the view, the record."""

    def __init__(
        self,
        config: ServingConfig,
        *,
        knobs: Knobs | None = None,
        record: ControlRecord | None = None,
        table: RequestTable | None = None,
        pressure: Callable[[], float | None] | None = None,
        clock_ns: Callable[[], int] = time.monotonic_ns,
        answers: shared.AnswerLengths | None = None,
    ) -> None:
        self.config = config
        self.knobs = knobs or Knobs()
        self.policy: SchedulingPolicy = make_policy(config.policy, config)
        # Long-path answer lengths for the first downstream stage's place-aware order.
        self.answers = answers if self.policy.place_admission else None
        self.record = record
        self.writer = record.decision_writer() if record is not None else None
        self.table = table
        self.pressure = pressure
        self.clock_ns = clock_ns
        self.max_age_ns = int(self.knobs.max_age_s * 1e9)
        self._class_names = frozenset(c.name for c in config.slo.classes)
        # Waiting requests by id (== the policy's waiting set), and per-category counts.
        self.waiting: dict[str, Any] = {}
        self.n_short_prefill = 0
        self.n_long_prefill = 0
        # Waiting prefills of each path, indexed by deadline, latest start and protection
        # instant (slack_order.PrefillIndex), and the waiting continuations (prefilled): the
        # preemption rule and the slack view ask them without walking every waiting request.
        # Together they hold exactly `waiting`'s requests.
        self._short_prefills: PrefillIndex[Any] = PrefillIndex()
        self._long_prefills: PrefillIndex[Any] = PrefillIndex(windows=False)
        self._continuations: dict[str, Any] = {}
        self._gap = 0  # len(queues) - len(self.waiting) after the last audit
        # Urgent-prefill boost: only a throttling policy has a cap to rise above.
        self._boost = self.policy.control.boost.prefill and isinstance(
            self.policy.spatial, SpatialController
        )
        # Requests whose prompt is partly computed (chunked prefill), by id: the only running
        # requests whose next chunk may carry an urgent prefill.
        self._chunked: dict[str, Any] = {}
        self._step_ns = 0
        self._sample: float | None = None
        # Diagnostics (tests, bench).
        self.steps = 0
        self.audits = 0
        self.swaps = 0
        self.last_decision: StepDecision | None = None
        self.last_shared_sms = config.ladder.aggressive  # SMs published for the last forward
        self.last_visible: list[str] = []
        self.preemptions = 0  # running decodes preempted for protected short-path prefills
        self.preemption_vetoes = 0  # victims the measured recompute cost turned down
        self.last_victims: list[str] = []
        self._urgent: list = []  # the short-path prefills the last preemption served
        # Slack order around vLLM's scheduler (slack_order.py), HorizonServe's policies only:
        # the view's order (late short-path prompts never behind long-path ones with slack)
        # and `running` kept so that vLLM's KV preemption takes the request with most slack.
        hs_rules = policy_is_horizon(self.policy)
        self.slack_view = hs_rules
        self.victim_order = hs_rules
        self.measured_cost = hs_rules  # the recompute cost measured (else the core's rule)
        self.recompute = RecomputeCost(_prior_prefill_s_per_token(config))
        self._last_begin_ns: int | None = None
        self._last_prefill_tokens = 0

    # -- waiting-index sync (called by the scheduler hooks) ----------------------------------
    def _enter(self, request: Any, sig: RequestSignals) -> None:
        rid = request.request_id
        self.waiting[rid] = request
        if sig.prefilled:
            self._continuations[rid] = request
        elif sig.long_path:
            self.n_long_prefill += 1
            self._long_prefills.add(rid, request, sig)
        else:
            self.n_short_prefill += 1
            self._short_prefills.add(rid, request, sig)

    def _leave(self, request: Any, sig: RequestSignals) -> None:
        rid = request.request_id
        if self.waiting.pop(rid, None) is None:
            return
        if sig.prefilled:
            self._continuations.pop(rid, None)
        elif sig.long_path:
            self.n_long_prefill -= 1
            self._long_prefills.discard(rid)
        else:
            self.n_short_prefill -= 1
            self._short_prefills.discard(rid)
        self.policy.dequeue(sig)

    def _class_of(self, request: Any) -> tuple[int, str | None, int, bool]:
        """(priority, class name or None, original arrival ns, rider) of a new request."""
        stamp = stamp_of_request(request)
        if stamp is not None:
            name = stamp.class_name if stamp.class_name in self._class_names else None
            # A request derived from another (BAGEL's CFG companions carry the parent's stamp)
            # rides with it: always visible, never counted against the long-path cap.
            rider = stamp.rid != external_id(request)
            return stamp.priority, name, stamp.arrival_ns, rider
        if self.table is not None:
            entry = self.table.lookup(external_id(request))
            if entry is not None:
                return entry.priority, None, entry.arrival_ns, False
        slo = self.config.slo
        prio = request.priority if known_priority(slo, request.priority) else 0
        return prio, None, monotonic_from_wall(request.arrival_time), False

    def adopt(self, request: Any, now: float) -> RequestSignals:
        """Annotate a request seen for the first time and enter it into the waiting index."""
        prio, name, arrival_ns, rider = self._class_of(request)
        if not known_priority(self.config.slo, prio) and name is None:
            prio = 0
        features = InputFeatures(input_tokens=request.num_prompt_tokens)
        arrival = arrival_ns * 1e-9
        policy = self.policy
        if rider or is_continuation(request):
            sig = policy.profiler.annotate(
                external_id(request), arrival, priority=prio, class_name=name, features=features
            )
            sig.record_progress(prefilled=True)
            policy.requeue(sig, now)
        else:
            sig = policy.admit(
                external_id(request), arrival, priority=prio, class_name=name, features=features
            )
        request.__dict__[SIG_ATTR] = sig
        self._enter(request, sig)
        return sig

    def on_enqueue(self, request: Any) -> None:
        """`request` was put into `waiting` / `skipped_waiting`."""
        sig = _sig(request)
        now = self.clock_ns() * 1e-9
        if sig is None:
            self.adopt(request, now)
        elif not sig.waiting:
            if not sig.prefilled and is_continuation(request):
                sig.record_progress(prefilled=True)
            self.policy.requeue(sig, now)
            self._enter(request, sig)

    def on_preempt(self, request: Any) -> None:
        """`request` went from running back to the front of `waiting`."""
        sig = _sig(request)
        if sig is None:
            self.adopt(request, self.clock_ns() * 1e-9)
            return
        if sig.waiting:
            return
        if not sig.prefilled:
            sig.record_progress(prefilled=True)
        self.policy.requeue(sig, self.clock_ns() * 1e-9)
        self._enter(request, sig)

    def on_free(self, request: Any) -> None:
        """`request` finished or was aborted; a long-path answer's length is recorded."""
        if self._chunked:
            self._chunked.pop(request.request_id, None)
        sig = _sig(request)
        if sig is not None and sig.waiting:
            self._leave(request, sig)
        if (
            self.answers is not None
            and sig is not None
            and sig.long_path
            and request.status in _ANSWERED
        ):
            self.answers.record(external_id(request), request.num_output_tokens)

    def _sig_of(self, request: Any) -> RequestSignals:
        sig = request.__dict__.get(SIG_ATTR)
        if sig is None or not sig.waiting:  # entered the queues behind the hooks' back
            self.on_enqueue(request)
            sig = request.__dict__[SIG_ATTR]
        return sig

    def audit(self, sched: Any) -> None:
        """O(queue) resync: adopt unknown queued requests, drop vanished ones."""
        self.audits += 1
        present = set()
        for request in chain(sched.waiting, sched.skipped_waiting):
            present.add(request)
            self._sig_of(request)
        live = sched.requests
        for rid, request in list(self.waiting.items()):
            if request in present:
                continue
            if request.is_finished() or live.get(rid) is not request:
                self._leave(request, request.__dict__[SIG_ATTR])
            # else: parked by an Omni input gate (it comes back); stays waiting for the policy
        self._gap = len(present) - len(self.waiting)

    # -- one step ------------------------------------------------------------------------------
    def begin_step(self, sched: Any) -> StepDecision:
        """Signals, view and SM split for this step (published by `end_step`)."""
        now_ns = self.clock_ns()
        if self._last_begin_ns is not None:
            self.recompute.observe((now_ns - self._last_begin_ns) * 1e-9, self._last_prefill_tokens)
        self._last_begin_ns = now_ns
        queued = len(sched.waiting) + len(sched.skipped_waiting)
        if queued - len(self.waiting) != self._gap:
            self.audit(sched)
        record = self.record
        active = (
            record.downstream_active_total(now_ns, self.max_age_ns) if record is not None else 0
        )
        sample = self.pressure() if self.pressure is not None else None
        decision = self.policy.step(
            now_ns * 1e-9,
            downstream_active=active > 0,
            pressure_sample=sample,
            backlog=backlogged(sched, queued),
            running=lambda: _first_pending(sched.running),
            downstream_slack=lambda: record.downstream_min_slack(now_ns, self.max_age_ns),
        )
        self._step_ns, self._sample = now_ns, sample
        self.steps += 1
        self.last_decision = decision
        return decision

    def end_step(self, sched: Any, out: Any) -> int:
        """Publish the step's split once its batch is known; returns the shared SMs published.

        The shared count is `decision.prefill_sms` over the prompts the step prefills (the whole
        forward, prefill and decode, runs on it); downstream headroom and level stay as
        `begin_step` decided them.
        """
        decision = self.last_decision
        assert decision is not None
        # Tokens this step prefills (beyond one per scheduled request): O(1), for RecomputeCost.
        scheduled = out.num_scheduled_tokens
        self._last_prefill_tokens = out.total_num_scheduled_tokens - len(scheduled)
        sm = decision.sm
        sms = sm.shared
        if self._boost:
            prompts = self._prefill_prompts(sched, out)  # every step: keeps `_chunked` current
            if prompts and sm.prefill != sm.shared:
                sms = decision.prefill_sms(prompts)  # at the step's own `now`
        self.last_shared_sms = sms
        if self.writer is not None:
            smoothed = _NAN if decision.pressure is None else decision.pressure
            raw = _NAN if self._sample is None else self._sample
            self.writer.publish(sms, sm.downstream, sm.level, smoothed, raw, self._step_ns)
        return sms

    def _prefill_prompts(self, sched: Any, out: Any) -> list[RequestSignals]:
        """Signals of the prompts this step prefills toward their first token: new requests,
        resumed ones without output yet and chunk continuations (a resumed request that has
        output recomputes for its decode, not for a first token). O(new + resumed + chunked).
        """
        chunked = self._chunked
        new = out.scheduled_new_reqs
        resumed = getattr(out.scheduled_cached_reqs, "resumed_req_ids", None)
        if not new and not resumed and not chunked:
            return []  # decode-only step (the common case under a full batch)
        rids = [data.req_id for data in new]
        if resumed:
            rids.extend(resumed)
        if chunked:
            scheduled = out.num_scheduled_tokens
            rids.extend(rid for rid in chunked if rid in scheduled)
        requests = sched.requests
        prompts: list[RequestSignals] = []
        for rid in rids:
            request = requests.get(rid)
            sig = None if request is None else request.__dict__.get(SIG_ATTR)
            if sig is None or request.num_output_tokens:
                chunked.pop(rid, None)
                continue
            # num_computed_tokens already counts this step's tokens (vLLM advances it in
            # schedule()): below the prompt, the next step continues this prefill.
            if request.num_computed_tokens < request.num_prompt_tokens:
                chunked[rid] = request
            else:
                chunked.pop(rid, None)
            prompts.append(sig)
        return prompts

    def _may_hide(self, view: StepView) -> bool:
        """False when the view certainly hides nothing and keeps queue order (O(1))."""
        if view.edf or view.late or self.slack_view:
            return True  # the view reorders
        if view.phase is Phase.ALL:
            return False
        if view.phase is Phase.SHORT:
            return self.n_long_prefill > 0
        return self.n_short_prefill > 0 or (view.long_hidden and self.n_long_prefill > 0)

    def hide(self, sched: Any, view: StepView, victims: list | None = None) -> _Token | None:
        """Swap in queues holding only what the base scheduler may see; None: nothing to do.

        `victims`: requests preempted for this step's protected short-path prefills; hidden
        this step, and those prefills shown first (see the module docstring, step 2b).
        """
        w, s = sched.waiting, sched.skipped_waiting
        if not w and not s:
            return None
        free = free_slots(sched)
        if free <= 0 or not (victims or self._may_hide(view)):
            return None
        try:
            vis_w, vis_s = self._walk(view, w, s, free, victims)
        except AttributeError:  # a queued request without signals: adopt everything, again
            self.audit(sched)
            vis_w, vis_s = self._walk(view, w, s, free, victims)
        vw = create_request_queue(sched.policy)
        vs = create_request_queue(sched.policy)
        _fill(vw, vis_w)
        _fill(vs, vis_s)
        sched.waiting, sched.skipped_waiting = vw, vs
        self.swaps += 1
        self.last_visible = [r.request_id for r in chain(vis_s, vis_w)]
        return _Token(w, s, vis_w, vis_s, vw, vs)

    def _walk(
        self, view: StepView, w: Any, s: Any, free: int, victims: list | None = None
    ) -> tuple[list, list]:
        """Visible requests of `skipped_waiting` (all) and `waiting` (at most free + margin).

        The walk stops once the window is full, so it costs O(window + hidden requests before
        the window's last one); with few visible requests (a long-path phase under the cap)
        it walks the whole queue. `_SIG` is a C-level attribute read: no Python call per item.
        """
        if victims:
            return self._walk_preempted(view, w, s, free, victims)
        margin = self.knobs.window_margin
        vis_s = list(view.iter_visible(s, _SIG)) if s else []
        if self.slack_view:
            vis_w = self._slack_walk(view, w, s, None if margin is None else free + margin)
            if margin is not None and len(vis_w) > free + margin:
                # The base scheduler takes at most `free` of them, in this order: the head of
                # the order is what it can reach (as the queue-order window below).
                del vis_w[free + margin :]
        elif margin is None or view.edf:
            vis_w = list(view.iter_visible(w, _SIG))
        else:
            vis_w = list(islice(view.iter_visible(w, _SIG), free + margin))
        return vis_w, vis_s

    def _slack_walk(self, view: StepView, w: Any, s: Any, window: int | None) -> list:
        """`waiting`'s visible requests in the slack order (slack_order.view_order); with a
        `window`, at least its first `window` ones. Only a late short-path prefill, which the
        view may hide, needs the whole queue walked; otherwise the view's own walk (which stops
        after its last visible request) gives the set, reordered, or — where every short-path
        prefill is visible and no ordinary long-path one is — the indexes give the head
        (`_slack_head`) without walking the queue."""
        now = self._step_ns * 1e-9
        if self._short_prefills.any_late(now):
            return view_order(view.is_visible, w, _SIG, now)
        if window is not None:
            head = self._slack_head(view, w, s, window, now)
            if head is not None:
                return head
        return view_order(_shown, list(view.iter_visible(w, _SIG)), _SIG, now)

    def _slack_head(self, view: StepView, w: Any, s: Any, k: int, now: float) -> list | None:
        """The first `k` of the slack order of `waiting`'s visible requests, from the indexes,
        or None where they cannot tell it (then the queue is walked).

        Applies when no short-path prefill is late (the caller checked) and the queues hold
        exactly the indexed requests (none parked by an input gate: the lengths agree;
        `begin_step` adopted any unknown one). The visible set, less what `skipped_waiting`
        holds, is then: the continuations and the protected prefills (always shown); every
        short-path prefill where the view shows them (not a long-path phase, or one that shows
        the on-time ones: none is late); the ordinary long-path prefills the view shows, all of
        them up to its deadline limits. The short-path ones all go to the order's
        deadline-sorted front, so only the `k` earliest of them can be among its first `k`:
        O(k + continuations + protected + long-path prefills up to the limits +
        skipped_waiting + log n), the same head as `view_order` over the whole visible set.
        """
        if len(w) + len(s) != len(self.waiting):
            return None
        skipped = set(s) if s else ()
        shorts = self._short_prefills
        if view.phase is not Phase.LONG or view.short_on_time:
            visible = shorts.earliest(k, skipped)
        else:
            visible = shorts.protected(now)
        longs = self._long_prefills
        limits = []
        if view.long_visible:
            limits.append(view.long_limit)
        if view.late_long_visible:
            limits.append(view.late_limit)
        if limits:  # the ordinary ones shown lie up to the larger limit (None: no limit)
            bound = None if None in limits else max(limits)
            visible.extend(longs.upto(bound, view.is_visible))
            if bound is not None:  # protected ones past it
                for r in longs.protected(now):
                    sig = r.__dict__[SIG_ATTR]
                    if (sig.deadline, sig.seq) > bound:
                        visible.append(r)
        else:
            visible.extend(longs.protected(now))
        visible.extend(self._continuations.values())
        if skipped:
            visible = [r for r in visible if r not in skipped]
        return view_order(_shown, visible, _SIG, now)

    def _walk_preempted(
        self, view: StepView, w: Any, s: Any, free: int, victims: list
    ) -> tuple[list, list]:
        """The view of a step that preempted `victims`: those hidden, the protected short-path
        prefills first (queue order), then the step's visible window as `_walk` gives it.

        The victims were running when the view was planned, so they are not part of its
        `visible` count: the walk skips them instead of counting them.
        """
        hidden = set(victims)
        urgent = set(self._urgent)
        skip = hidden | urgent
        rest_w = [r for r in w if r not in skip]
        rest_s = [r for r in s if r not in skip]
        vis_w, vis_s = self._walk(view, rest_w, rest_s, free)
        first_w = [r for r in w if r in urgent]
        first_s = [r for r in s if r in urgent]
        return first_w + vis_w, first_s + vis_s

    # -- shared-stage preemption -------------------------------------------------------------
    def preempt(self, sched: Any) -> list:
        """Preempt running long-path decodes for the protected short-path prefills waiting on a
        full running set (module docstring, step 2b); returns the victims (usually none).

        O(1) while no short-path prefill waits, O(running) while none of the running requests
        could be a victim; otherwise O(log short waiting + protected + urgent) to find the
        prefills that need a place (`PrefillIndex.urgent`), then O(running) per policy call
        (plus the policy's own check). Victims are bounded by the places and blocks the urgent
        prefills need.
        """
        policy = self.policy
        if not policy.preemption:
            return []
        if not policy.temporal.short_waiting:
            return []
        if not _victim_possible(sched.running):
            # No running request could be chosen (`choose_victim`'s candidates: long-path
            # decodes never preempted), so the loop below would end with none: O(running).
            if self.last_victims:
                self.last_victims = []
            self._urgent = []
            return []
        next_free = _next_free_s(sched.running)
        urgent = self._urgent = self._urgent_shorts(next_free)
        n_urgent = len(urgent)
        if not n_urgent:
            return []
        free = free_slots(sched)
        pool = sched.kv_cache_manager.block_pool
        need_blocks: int | None = None  # KV for the protected prompts' first chunks, when asked
        now = self._step_ns * 1e-9
        victims: list = []
        while True:
            short_of_places = n_urgent > free + len(victims)
            if not short_of_places:  # places enough: do their first chunks fit in the KV?
                if need_blocks is None:
                    need_blocks = _first_chunk_blocks(sched, urgent)
                if pool.get_num_free_blocks() >= need_blocks:
                    break
            if self.measured_cost:
                victim = self._victim(sched, now, next_free, urgent)
            else:
                victim = policy.preemption_victim(
                    self._decodes(sched), now, _SIG, self._handed_off, next_free
                )
            if victim is None:
                break
            if not short_of_places and not sched._request_blocks_can_be_freed(victim):
                break  # its blocks come back only after the step in flight: no KV gained now
            self._preempt_one(sched, victim)
            victims.append(victim)
        if victims or self.last_victims:
            self.last_victims = [v.request_id for v in victims]
        return victims

    def _victim(self, sched: Any, now: float, next_free_s: float, urgent: list) -> Any:
        """`policy.preemption_victim` with the recompute cost measured (slack_order.py): the
        same candidates (`choose_victim`) for the same need (`short_needs_place`); the victim
        is taken when `preemption_pays` on the measured per-token prefill time, counting the
        pending requests the recompute would make late — the waiting short-path prefills other
        than `urgent` and the running requests whose first response is pending — instead of
        every waiting request. O(running + log short waiting + those in the margin) per
        call."""
        temporal = self.policy.temporal
        sooner = temporal.short_needs_place(now, next_free_s)
        if sooner is None:
            return None
        victim = choose_victim(self._decodes(sched), now, _SIG, self._handed_off)
        if victim is None:
            return None
        recompute = self.recompute.recompute_s(victim.num_tokens)
        # Only margins in [0, recompute) count: the index gives those, O(log n + k).
        margins = self._short_prefills.margins_below(now, recompute, set(urgent))
        margins.extend(sig.can_wait_s(now) for sig in _first_pending(sched.running))
        if preemption_pays(recompute, sooner, margins):
            return victim
        self.preemption_vetoes += 1
        return None

    def _urgent_shorts(self, next_free_s: float) -> list:
        """Waiting short-path prefills that need a place sooner than one frees (queue entry
        order): protected ones, and those that can still meet their deadline but not after
        `next_free_s` (the rule of `TemporalScheduler.short_needs_place`, per request).
        O(log short waiting + protected + found)."""
        return self._short_prefills.urgent(self._step_ns * 1e-9, next_free_s)

    @staticmethod
    def _decodes(sched: Any) -> list:
        """Running long-path requests past their prompt (the preemption candidates), with their
        signals' progress brought up to date (decoded tokens: the slack estimate)."""
        out = []
        for request in sched.running:
            sig = request.__dict__.get(SIG_ATTR)
            if sig is None or not sig.long_path or request.is_prefill_chunk:
                continue
            if request.num_computed_tokens < request.num_prompt_tokens:
                continue
            done = request.num_output_tokens - sig.decoded_tokens
            if not sig.prefilled or done > 0:
                sig.record_progress(prefilled=True, decoded=max(done, 0))
            out.append(request)
        return out

    @staticmethod
    def _handed_off_any(request: Any) -> bool:
        """`_handed_off` with the decoded tokens read from the request (any running one)."""
        sig = request.__dict__[SIG_ATTR]
        return max(sig.decoded_tokens, request.num_output_tokens) >= sig.costs.decode_tokens

    @staticmethod
    def _handed_off(request: Any) -> bool:
        """The shared stage produced the tokens the downstream stages need for the first
        response (the class profile's decode tokens before hand-off)."""
        sig = request.__dict__[SIG_ATTR]
        return sig.decoded_tokens >= sig.costs.decode_tokens

    def _preempt_one(self, sched: Any, victim: Any) -> None:
        """vLLM's preemption path, as its own `schedule()` uses it under KV pressure: out of
        `running` (by identity), `_preempt_request` (blocks freed, status PREEMPTED, to the
        front of `waiting`, id into the next output's `preempted_req_ids`); the hook on
        `_preempt_request` re-queues it in the policy as a decode continuation."""
        running = sched.running
        for i, request in enumerate(running):
            if request is victim:
                del running[i]
                break
        victim.__dict__[SIG_ATTR].preempted += 1  # the rule preempts a request once
        sched._preempt_request(
            victim, time.monotonic(), drop_stale_output=sched.requires_kv_delivery
        )
        # As reset_prefix_cache does: the model runner drops its state; a later resume sends
        # the full token ids.
        sched.prev_step_scheduled_req_ids.discard(victim.request_id)
        self.preemptions += 1

    def restore(self, sched: Any, token: _Token) -> None:
        """Put the original queues back: taken requests out, re-queued ones in front."""
        left_w, left_s = sched.waiting, sched.skipped_waiting
        sched.waiting, sched.skipped_waiting = token.w, token.s
        now_w, now_s = list(left_w), list(left_s)
        set_w, set_s = set(now_w), set(now_s)
        _restore_queue(token.w, token.vis_w, now_w, set_w)
        _restore_queue(token.s, token.vis_s, now_s, set_s)
        for request in chain(token.vis_w, token.vis_s):
            if request not in set_w and request not in set_s:  # taken into the batch
                self._leave(request, request.__dict__[SIG_ATTR])

    def run(self, sched: Any, base_schedule: Callable[[bool], Any], throttle: bool) -> Any:
        decision = self.begin_step(sched)
        victims = self.preempt(sched)
        if self.victim_order and len(sched.running) > 1 and _kv_may_preempt(sched):
            order_running(sched.running, self._step_ns * 1e-9, _sig, self._handed_off_any)
        token = self.hide(sched, decision.view, victims)
        if token is None:
            out = base_schedule(throttle)
            self._dequeue_scheduled(sched, out)
        else:
            try:
                out = base_schedule(throttle)
            finally:
                self.restore(sched, token)
        self.end_step(sched, out)
        return out

    def _dequeue_scheduled(self, sched: Any, out: Any) -> None:
        """Requests the base scheduler took from the real queues: O(admitted)."""
        requests = sched.requests
        for data in out.scheduled_new_reqs:
            self._taken(requests.get(data.req_id))
        resumed = getattr(out.scheduled_cached_reqs, "resumed_req_ids", None) or ()
        for rid in resumed:
            self._taken(requests.get(rid))

    def _taken(self, request: Any) -> None:
        sig = None if request is None else request.__dict__.get(SIG_ATTR)
        if sig is not None and sig.waiting:
            self._leave(request, sig)


def policy_is_horizon(policy: SchedulingPolicy) -> bool:
    """HorizonServe's own order rules apply (its policies and ablations, not
    the baselines fcfs / edf / priority, which keep vLLM's order)."""
    return policy.horizon


def _prior_prefill_s_per_token(config: ServingConfig) -> float:
    """The class profiles' per-token prefill time (largest), until the engine measured one."""
    return max((c.profile.prefill_s_per_token for c in config.slo.classes), default=0.0)


def _first_pending(running: list) -> list[RequestSignals]:
    """Signals of the running requests whose first response is still pending at this stage:
    short-path ones without output yet, long-path ones before the hand-off (progress synced)."""
    out = []
    for request in running:
        sig = request.__dict__.get(SIG_ATTR)
        if sig is None:
            continue
        if not sig.long_path:
            if not request.num_output_tokens:
                out.append(sig)
            continue
        done = request.num_output_tokens - sig.decoded_tokens
        if done > 0:
            sig.record_progress(prefilled=True, decoded=done)
        if sig.decoded_tokens < sig.costs.decode_tokens:
            out.append(sig)
    return out


def _victim_possible(running: list) -> bool:
    """Some running request may be a preemption victim: long-path, past its prompt (what
    `_decodes` keeps) and never preempted (`victim_slack`). Reads only, O(running)."""
    for request in running:
        sig = request.__dict__.get(SIG_ATTR)
        if sig is None or not sig.long_path or sig.preempted or request.is_prefill_chunk:
            continue
        if request.num_computed_tokens >= request.num_prompt_tokens:
            return True
    return False


def _next_free_s(running: list) -> float:
    """When the running request nearest completion frees its place by itself: its tokens left
    (`max_tokens`; vLLM cannot know an earlier EOS) × its class's decode step time."""
    best = math.inf
    for request in running:
        sig = request.__dict__.get(SIG_ATTR)
        if sig is None:
            continue
        left = request.max_tokens - request.num_output_tokens
        t = (left if left > 0 else 0) * sig.costs.tpot_s
        if t < best:
            best = t
    return 0.0 if best == math.inf else best


def _shown(sig: RequestSignals) -> bool:
    """Every request of an already visible list."""
    return True


def _kv_may_preempt(sched: Any) -> bool:
    """vLLM's KV preemption may act this step: fewer free blocks than the running requests
    could take (one block boundary each, plus the token budget's prefill chunks). O(1)."""
    need = len(sched.running) + -(-sched.max_num_scheduled_tokens // sched.block_size)
    return sched.kv_cache_manager.block_pool.get_num_free_blocks() <= need


def _first_chunk_blocks(sched: Any, requests: list) -> int:
    """KV blocks the first scheduled chunk of each request needs (token budget bound)."""
    budget = sched.max_num_scheduled_tokens
    size = sched.block_size
    total = 0
    for request in requests:
        tokens = min(request.num_tokens - request.num_computed_tokens, budget)
        total += -(-tokens // size)
    return total


def _fill(queue: Any, requests: list) -> None:
    if isinstance(queue, FCFSRequestQueue):
        queue.extend(requests)
    else:
        for request in requests:
            queue.add_request(request)


_RESTORE_WALK = 64  # queue positions restored by popping before one C-level filter pass


def _restore_queue(queue: Any, visible: list, now: list, now_set: set) -> None:
    """`queue` held `visible` (among others); after the step the view held `now`.

    FCFS: the queue is popped from the head up to the last request that left, the others of
    that prefix are pushed back: O(that prefix), identity-hashed set lookups. Past
    `_RESTORE_WALK` requests (a request taken from deep in the queue: the slack order's head
    need not be the queue's) the rest is filtered in one C-level pass instead. Never
    `deque.remove`: vLLM's Request defines `__lt__`, so each element comparison would go
    through a Python-level rich-compare slot.
    """
    shown = set(visible)
    gone = {r for r in visible if r not in now_set}  # taken, or moved to the other queue
    added = [r for r in now if r not in shown]  # preempted / skipped into this queue
    if isinstance(queue, FCFSRequestQueue):
        left = len(gone)
        kept = []
        pop = queue.popleft
        budget = _RESTORE_WALK
        while left and budget:
            budget -= 1
            request = pop()
            if request in gone:
                left -= 1
            else:
                kept.append(request)
        if left:  # the rest, less what left, in order (C-level filter)
            rest = list(queue)
            queue.clear()
            queue.extend(filterfalse(gone.__contains__, rest))
        if kept:
            queue.extendleft(reversed(kept))
        if added:
            queue.extendleft(reversed(added))
    else:  # priority heap: order is the heap's own
        if gone:
            queue.remove_requests(gone)
        for request in added:
            queue.add_request(request)


# -- scheduler classes -------------------------------------------------------------------------


class _ViewHook(VLLMScheduler):
    """Between Omni's `schedule()` and vLLM's: applies the controller's view."""

    _hs: SharedStageController | None

    def schedule(self, throttle_prefills: bool = False) -> Any:
        hs = self.__dict__.get("_hs")
        if hs is None:
            return super().schedule(throttle_prefills)
        return hs.run(self, super().schedule, throttle_prefills)


class SharedStageHooks:
    """Hooks of the shared stage's scheduler that keep the policy's waiting index in sync."""

    _hs: SharedStageController | None

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self._hs = None
        vllm_config = _config_of(args, kwargs)
        controller = build_shared_controller(vllm_config)
        use_vllm_priority(controller.config, vllm_config)
        super().__init__(*args, **kwargs)
        self._hs = controller
        log.info(
            "HorizonServe: shared stage scheduler %s, policy %s, ladder %s",
            type(self).__name__,
            self._hs.config.policy.value,
            self._hs.config.ladder.levels,
        )

    @property
    def horizon(self) -> SharedStageController:
        assert self._hs is not None
        return self._hs

    def _enqueue_waiting_request(self, request: Any) -> None:
        super()._enqueue_waiting_request(request)  # type: ignore[misc]
        if self._hs is not None:
            self._hs.on_enqueue(request)

    def _preempt_request(self, request: Any, timestamp: float, *args: Any, **kwargs: Any) -> None:
        super()._preempt_request(request, timestamp, *args, **kwargs)  # type: ignore[misc]
        if self._hs is not None:
            self._hs.on_preempt(request)

    def _free_request(self, request: Any, *args: Any, **kwargs: Any) -> Any:
        result = super()._free_request(request, *args, **kwargs)  # type: ignore[misc]
        if self._hs is not None:
            self._hs.on_free(request)
        return result


class HorizonOmniARScheduler(SharedStageHooks, OmniARScheduler, _ViewHook):
    """The shared stage's synchronous AR scheduler with HorizonServe."""


class HorizonOmniARAsyncScheduler(SharedStageHooks, OmniARAsyncScheduler, _ViewHook):
    """The shared stage's async AR scheduler (vLLM-Omni's default) with HorizonServe."""


class DownstreamStage:
    """A downstream stage's share of the control state: its activity slot, the stamps, the
    admission order."""

    def __init__(
        self,
        stage_id: int,
        kind: int,
        *,
        record: ControlRecord | None,
        table: RequestTable | None,
        config: ServingConfig | None = None,
        clock_ns: Callable[[], int] = time.monotonic_ns,
        answers: shared.AnswerLengths | None = None,
    ) -> None:
        self.stage_id = stage_id
        self.slot = max(0, min(stage_id - 1, shared.N_SLOTS - 1))
        self.writer = record.downstream_writer(self.slot, kind) if record is not None else None
        self.table = table
        self.stamps: dict[str, Stamp | None] = {}
        self._last_active = -1
        self.admission: DownstreamAdmission | None = None
        self.saturated_first = False  # report SATURATED while full with waiters
        if config is not None:
            policy = make_policy(config.policy, config)
            self.admission = DownstreamAdmission(
                policy.downstream_queue(),
                first_stage=stage_id == 1,
                clock_ns=self._now_ns,
                place=policy.place_admission,
            )
            self.saturated_first = policy.saturated_first
        self.clock_ns = clock_ns
        # Answer lengths from the shared stage: the work of the place-aware order.
        self.answers = answers if self.admission is not None and self.admission.place else None

    def _now_ns(self) -> int:
        return self.clock_ns()  # read late: tests swap `clock_ns` after construction

    def on_enqueue(self, request: Any) -> None:
        if request.request_id in self.stamps:
            return
        stamp = stamp_of_request(request)
        if stamp is None and self.table is not None:
            entry = self.table.lookup(external_id(request))
            if entry is not None:
                stamp = Stamp(
                    external_id(request), entry.priority, "", entry.arrival_ns, entry.deadline_ns
                )
        self.stamps[request.request_id] = stamp
        request.__dict__[STAMP_ATTR] = stamp
        if self.admission is not None:
            work = 0.0
            if self.answers is not None:
                work = float(self.answers.take(external_id(request)) or 0)
            self.admission.on_enqueue(request, None if stamp is None else stamp.as_core(), work)

    def on_free(self, request: Any) -> None:
        self.stamps.pop(request.request_id, None)
        if self.admission is not None:
            self.admission.on_leave(request)

    def publish(self, active: int, running: list | None = None, saturated: bool = False) -> None:
        """Requests this stage is running and the smallest slack ratio of a first output still
        pending here, or SATURATED while `saturated` (no free place while requests wait) and
        the next admission can still start in time (`reported_slack`); the shared stage's
        slack split reads it. Refreshed every step (it is also the heartbeat)."""
        if self.writer is not None:
            now_ns = self.clock_ns()
            now = now_ns * 1e-9
            slack = self.min_slack(now, running or ())
            if saturated and self.admission is not None:  # the queue's head only then
                queued = self.admission.queue.peek_slack(now)
                slack = reported_slack(slack, saturated, queued, self.saturated_first)
            self.writer.set_active(active, now_ns, math.nan if slack is None else slack)
        self._last_active = active

    def min_slack(self, now: float, running: Iterable[Any]) -> float | None:
        """Smallest slack ratio among this stage's requests whose first output is pending: the
        admission queue's next one, and running ones that have produced nothing yet (their
        remaining time: the stage's estimate from the stamp). None: none pending, or no order
        kept (the baselines: nothing reads it there)."""
        admission = self.admission
        if admission is None or not admission.slack_order:
            return None
        best = admission.queue.peek_slack(now)
        for request in running:
            stamp = request.__dict__.get(STAMP_ATTR)
            if stamp is None or request.num_output_tokens:
                continue
            core = stamp.as_core()
            u = core.slack_ratio(now, admission.first_output_s(core))
            if best is None or u < best:
                best = u
        return best


class DownstreamHooks:
    """Thin downstream-stage scheduler: marks activity, remembers the carried stamps."""

    _hs_down: DownstreamStage | None
    _hs_kind = KIND_AR

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self._hs_down = None
        super().__init__(*args, **kwargs)
        model_config = self.vllm_config.model_config  # type: ignore[attr-defined]
        stage_id = int(getattr(model_config, "stage_id", 1) or 1)
        hint = getattr(getattr(model_config, "hf_config", None), "model_type", None)
        self._hs_down = DownstreamStage(
            stage_id,
            self._hs_kind,
            record=shared.control_record(),
            table=shared.request_table(),
            config=resolve_config(hint),
            answers=shared.answer_lengths(),
        )

    def hs_stamp(self, request_id: str) -> Stamp | None:
        """The class and original deadline a request of this stage carries."""
        return self._hs_down.stamps.get(request_id) if self._hs_down is not None else None

    def _enqueue_waiting_request(self, request: Any) -> None:
        super()._enqueue_waiting_request(request)  # type: ignore[misc]
        if self._hs_down is not None:
            self._hs_down.on_enqueue(request)

    def _free_request(self, request: Any, *args: Any, **kwargs: Any) -> Any:
        result = super()._free_request(request, *args, **kwargs)  # type: ignore[misc]
        if self._hs_down is not None:
            self._hs_down.on_free(request)
        return result

    def schedule(self, *args: Any, **kwargs: Any) -> Any:
        down = self._hs_down
        admission = None if down is None else down.admission
        if admission is not None:
            admission.before_schedule(self)
        out = super().schedule(*args, **kwargs)  # type: ignore[misc]
        if admission is not None:
            admission.after_schedule(self, out)
        if down is not None:
            saturated = self._hs_saturated()
            down.publish(len(self.running), self.running, saturated)  # type: ignore[attr-defined]
        return out

    def _hs_saturated(self) -> bool:
        """No free place while a request waits for one (what `reported_slack` is told)."""
        queued = len(self.waiting) + len(self.skipped_waiting)  # type: ignore[attr-defined]
        return backlogged(self, queued)

    @property
    def hs_admission(self) -> DownstreamAdmission | None:
        """This stage's admission order (None before construction finished)."""
        return None if self._hs_down is None else self._hs_down.admission

    def update_from_output(self, *args: Any, **kwargs: Any) -> Any:
        out = super().update_from_output(*args, **kwargs)  # type: ignore[misc]
        down = self._hs_down
        if down is not None:
            saturated = self._hs_saturated()
            down.publish(len(self.running), self.running, saturated)  # type: ignore[attr-defined]
        return out


class HorizonDownstreamARScheduler(DownstreamHooks, OmniARScheduler):
    """A downstream AR stage (Qwen2.5-Omni's talker), synchronous."""


class HorizonDownstreamARAsyncScheduler(DownstreamHooks, OmniARAsyncScheduler):
    """A downstream AR stage (Qwen2.5-Omni's talker), async (the default)."""


class HorizonGenerationScheduler(DownstreamHooks, OmniGenerationScheduler):
    """A generation stage (code2wav of Qwen2.5-Omni / MiMo-Audio)."""

    _hs_kind = KIND_GENERATION


# -- construction ------------------------------------------------------------------------------


def use_vllm_priority(config: ServingConfig, vllm_config: Any) -> bool:
    """The "priority" baseline is vLLM's own priority scheduler: waiting requests by (API
    priority code, arrival), preemption of the lowest-priority running request under KV
    pressure. Under that policy the stage's `scheduling_policy` becomes "priority" before
    vLLM builds its queues (whatever the command line said); the plugin's view then hides
    nothing and never preempts, so vLLM's scheduler is in charge. True when switched."""
    if config.resolved().view_order is not ViewOrder.PRIORITY:
        return False
    sc = vllm_config.scheduler_config
    if sc.policy != "priority":
        log.info("HorizonServe: policy priority: scheduling_policy %s -> priority", sc.policy)
        sc.policy = "priority"
    return True


def build_shared_controller(vllm_config: Any) -> SharedStageController:
    hint = getattr(getattr(vllm_config.model_config, "hf_config", None), "model_type", None)
    config = resolve_config(hint)
    return SharedStageController(
        config,
        knobs=Knobs.from_env(),
        record=shared.control_record(),
        table=shared.request_table(),
        pressure=_pressure_sampler(),
        answers=shared.answer_lengths(),
    )


def _config_of(args: tuple, kwargs: dict) -> Any:
    config = kwargs.get("vllm_config")
    if config is None and args:
        config = args[0]
    if config is None:
        raise TypeError("scheduler factory needs vllm_config")
    return config


def ar_scheduler_class(vllm_config: Any) -> type:
    """The HorizonServe class for an AR stage: shared (stage 0) or downstream, sync or async."""
    is_async = bool(vllm_config.scheduler_config.async_scheduling)
    stage_id = int(getattr(vllm_config.model_config, "stage_id", 0) or 0)
    if stage_id == 0:
        return HorizonOmniARAsyncScheduler if is_async else HorizonOmniARScheduler
    return HorizonDownstreamARAsyncScheduler if is_async else HorizonDownstreamARScheduler


def ar_scheduler(*args: Any, **kwargs: Any) -> Any:
    """`scheduler_cls` of the AR stages of the re-registered pipelines (called like a class)."""
    return ar_scheduler_class(_config_of(args, kwargs))(*args, **kwargs)


def generation_scheduler(*args: Any, **kwargs: Any) -> Any:
    """`scheduler_cls` of the generation stages (code2wav)."""
    return HorizonGenerationScheduler(*args, **kwargs)


AR_SCHEDULER_PATH = f"{__name__}.ar_scheduler"
GENERATION_SCHEDULER_PATH = f"{__name__}.generation_scheduler"


def queued_ids(queue: Iterable[Any]) -> list[str]:
    """Request ids of a queue in its iteration order (tests, diagnostics)."""
    return [r.request_id for r in queue]
