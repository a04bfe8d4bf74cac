"""Mixed-load scenarios on the REAL shared-stage scheduler (CPU, fake model runner).

Text (priority 0, short path) and speech (priority 10, long path) requests arrive over a
span, with a burst of speech requests early on that fills the running set with long speech
decodes; a share of the requests is aborted by its client at a random moment; the KV cache is
small enough that vLLM preempts under KV pressure too. Two shapes (`SHAPES`):

* `mixed`: 200 requests over ≈ 2 s, a 40-speech burst at 0.3 s, 5 % aborts, 160 KV blocks;
* `unseen`: 300 requests over ≈ 3 s, a 120-speech burst at 0.3 s, 10 % aborts, 128 KV blocks
  (the shape no policy was tuned on), run with three seeds.

Time is the fake monotonic clock, advanced per engine step by a step-time model close to the
classes' profile (conftest.hs_config): 6 ms per step plus 30 µs per prefilled token.

Reported (`ScenarioResult`): queued text requests' mean and p95 wait (arrival → first
scheduled), speech requests' mean wait, each class's SLO attainment (below), how many
preemptions vLLM (KV pressure) and HorizonServe (shared-stage rule) made, and what every
request got, for the no-loss checks.

Attainment: the share of the requests not aborted whose first response came by their
deadline (arrival + the class SLO, the stamp's `deadline_ns`). Text: the first token (end of
the step that sampled it). Speech: the step that sampled the thinker token the talker needs
for the first audio (the class profile's `decode_tokens_to_first_response`, capped at
`max_tokens`), plus the stamp's downstream estimate to the first audio.
"""

from __future__ import annotations

import random
import statistics
from dataclasses import dataclass, field
from typing import Any

from factory import fake_model_output
from horizon import new_ids, stamped

TEXT, SPEECH = 0, 10
STEP_S = 0.006
PREFILL_S_PER_TOKEN = 3e-5


@dataclass(frozen=True)
class Shape:
    """One scenario's load and scheduler shape."""

    name: str
    n_requests: int
    burst: int
    span_s: float
    abort_share: float
    num_blocks: int  # KV blocks of 16 tokens
    burst_at_s: float = 0.3
    text_share: float = 0.55  # of the requests outside the burst
    max_num_seqs: int = 16
    max_num_batched_tokens: int = 96

    @property
    def params(self) -> dict[str, int]:
        """`build(**params)`: the scheduler's places, token budget and KV blocks."""
        return {
            "max_num_seqs": self.max_num_seqs,
            "max_num_batched_tokens": self.max_num_batched_tokens,
            "num_blocks": self.num_blocks,
        }


MIXED = Shape("mixed", n_requests=200, burst=40, span_s=2.0, abort_share=0.05, num_blocks=160)
UNSEEN = Shape("unseen", n_requests=300, burst=120, span_s=3.0, abort_share=0.10, num_blocks=128)
SHAPES = {s.name: s for s in (MIXED, UNSEEN)}

# The original module constants (the `mixed` shape), for callers that read them.
N_REQUESTS = MIXED.n_requests
PARAMS = MIXED.params


@dataclass
class Arrival:
    rid: str
    at: float
    prio: int
    prompt: int
    max_tokens: int
    abort_at: float | None = None


@dataclass
class ScenarioResult:
    policy: str
    seed: int = 0
    text_wait_s: list[float] = field(default_factory=list)
    speech_wait_s: list[float] = field(default_factory=list)
    vllm_preemptions: int = 0
    hs_preemptions: int = 0
    hs_vetoes: int = 0  # victims the preemption cost rule turned down
    steps: int = 0
    want: dict[str, int] = field(default_factory=dict)
    got: dict[str, int] = field(default_factory=dict)
    finished: dict[str, int] = field(default_factory=dict)
    aborted: set[str] = field(default_factory=set)
    # Attainment: per class, [met, counted] over the requests not aborted.
    met: dict[int, list[int]] = field(default_factory=lambda: {TEXT: [0, 0], SPEECH: [0, 0]})
    # Short-path requests preempted by vLLM under KV pressure while a long-path decode ran.
    short_victims: int = 0

    def attainment(self, prio: int) -> float:
        met, counted = self.met[prio]
        return met / counted if counted else 1.0

    @property
    def text_mean_ms(self) -> float:
        return 1e3 * statistics.fmean(self.text_wait_s)

    @property
    def text_p95_ms(self) -> float:
        return 1e3 * p95(self.text_wait_s)

    @property
    def speech_mean_ms(self) -> float:
        return 1e3 * statistics.fmean(self.speech_wait_s)

    @property
    def speech_p95_ms(self) -> float:
        return 1e3 * p95(self.speech_wait_s)

    def row(self) -> str:
        return (
            f"{self.policy:<22} {self.seed:4d} {self.text_mean_ms:9.1f} {self.text_p95_ms:9.1f} "
            f"{len(self.text_wait_s):6d} {self.speech_mean_ms:10.1f} {self.speech_p95_ms:10.1f} "
            f"{100 * self.attainment(TEXT):7.1f} {100 * self.attainment(SPEECH):7.1f} "
            f"{self.vllm_preemptions:6d} {self.short_victims:6d} {self.hs_preemptions:6d} "
            f"{self.hs_vetoes:6d} {self.steps:6d}"
        )


HEADER = (
    f"{'policy':<22} {'seed':>4} {'text ms':>9} {'p95 ms':>9} {'texts':>6} {'speech ms':>10} "
    f"{'sp p95 ms':>10} {'text %':>7} {'sp %':>7} {'vLLM':>6} {'vShort':>6} {'HS':>6} "
    f"{'veto':>6} {'steps':>6}"
)
LEGEND = (
    "text ms / p95 ms, speech ms / sp p95 ms: queued requests' mean / p95 wait (arrival -> "
    "first scheduled), fake clock;\ntext % / sp %: SLO attainment (first token / first audio "
    "by the deadline, aborted requests excluded);\nvLLM: vLLM's KV-pressure preemptions, "
    "vShort: of them, text requests evicted while a speech decode ran;\nHS / veto: "
    "HorizonServe's shared-stage preemptions / candidates its cost rule turned down"
)


def p95(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(0.95 * len(ordered)))]


def workload(seed: int, shape: Shape = MIXED) -> list[Arrival]:
    """The shape's arrivals, in time order (see the module docstring)."""
    rng = random.Random(seed)
    out = []
    for i in range(shape.burst):
        out.append(
            Arrival(f"L{i}", shape.burst_at_s, SPEECH, rng.randint(16, 96), rng.randint(120, 240))
        )
    for i in range(shape.burst, shape.n_requests):
        at = rng.uniform(0.0, shape.span_s)
        if rng.random() < shape.text_share:
            out.append(Arrival(f"S{i}", at, TEXT, rng.randint(8, 64), rng.randint(8, 32)))
        else:
            out.append(Arrival(f"L{i}", at, SPEECH, rng.randint(16, 96), rng.randint(120, 240)))
    for a in rng.sample(out, int(shape.abort_share * shape.n_requests)):
        a.abort_at = a.at + rng.uniform(0.0, 1.0)
    out.sort(key=lambda a: (a.at, a.rid))
    return out


def _first_response_tokens(config: Any, a: Arrival) -> int:
    """Output tokens after which the request's first response is under way (see module doc)."""
    if a.prio == TEXT:
        return 1
    cls = config.slo.class_for_priority(a.prio)
    return max(1, min(a.max_tokens, cls.profile.decode_tokens_to_first_response))


def run(
    sched: Any, config: Any, clock: Any, policy: str, seed: int = 0, shape: Shape = MIXED
) -> ScenarioResult:
    """Drive `sched` through the workload until every request is done."""
    from vllm.v1.request import RequestStatus

    from horizonserve.runtime.engine.vllm_omni.stamps import make_stamp

    result = ScenarioResult(policy, seed)
    arrivals = workload(seed, shape)
    start = clock.now
    pending = list(arrivals)
    aborts = sorted((a for a in arrivals if a.abort_at is not None), key=lambda a: a.abort_at)
    arrival_of = {a.rid: a for a in arrivals}
    first_scheduled: dict[str, float] = {}
    first_response: dict[str, float] = {}  # fake-clock seconds since start
    due: dict[str, float] = {}  # deadline - downstream estimate, seconds since start
    for _ in range(40_000):
        now = clock.now - start
        while pending and pending[0].at <= now:
            a = pending.pop(0)
            result.want[a.rid] = a.max_tokens
            arrival_ns = clock.now_ns - int((now - a.at) * 1e9)
            stamp = make_stamp(config.slo, a.rid, a.prio, arrival_ns)
            due[a.rid] = a.at + (stamp.deadline_ns - stamp.downstream_ns - arrival_ns) * 1e-9
            sched.add_request(
                stamped(config, a.rid, a.prompt, a.prio, arrival_ns, max_tokens=a.max_tokens)
            )
        while aborts and aborts[0].abort_at <= now:
            a = aborts.pop(0)
            if a.rid in sched.requests:
                sched.finish_requests([a.rid], RequestStatus.FINISHED_ABORTED)
                result.aborted.add(a.rid)
        if not pending and not sched.has_unfinished_requests():
            break
        running_long = any(arrival_of[r.request_id].prio == SPEECH for r in sched.running)
        out = sched.schedule()
        result.vllm_preemptions += len(out.preempted_req_ids)
        if running_long:
            result.short_victims += sum(
                arrival_of[rid].prio == TEXT for rid in out.preempted_req_ids
            )
        for rid in new_ids(out):
            first_scheduled.setdefault(rid, now)
        outputs = sched.update_from_output(out, fake_model_output(sched, out))
        prefill_tokens = sum(
            n for rid, n in out.num_scheduled_tokens.items() if n > 1 or rid in new_ids(out)
        )
        clock.advance(STEP_S + PREFILL_S_PER_TOKEN * prefill_tokens)
        end = clock.now - start
        for client in outputs.values():
            for o in client.outputs:
                rid = o.request_id
                result.got[rid] = result.got.get(rid, 0) + len(o.new_token_ids)
                if rid not in first_response and result.got[rid] >= _first_response_tokens(
                    config, arrival_of[rid]
                ):
                    first_response[rid] = end
                if o.finish_reason is not None:
                    result.finished[rid] = result.finished.get(rid, 0) + 1
        result.steps += 1
    hs = sched.horizon
    result.hs_preemptions = hs.preemptions
    result.hs_vetoes = getattr(hs, "preemption_vetoes", 0)
    result.vllm_preemptions -= hs.preemptions  # preempted_req_ids holds both
    for rid, t in first_scheduled.items():
        a = arrival_of[rid]
        (result.text_wait_s if a.prio == TEXT else result.speech_wait_s).append(t - a.at)
    for a in arrivals:
        if a.rid in result.aborted:
            continue
        tally = result.met[a.prio]
        tally[1] += 1
        if first_response.get(a.rid, float("inf")) <= due[a.rid]:
            tally[0] += 1
    return result
