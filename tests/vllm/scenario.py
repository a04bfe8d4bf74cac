"""The mixed-load scenario on the REAL shared-stage scheduler (CPU, fake model runner).

200 requests (seeded): text (priority 0, short path) and speech (priority 10, long path)
arrive over ≈ 2 s, with a burst of 40 speech requests at 0.3 s that fills the running set with
long speech decodes; 5 % of the requests are aborted by their client at a random moment;
the KV cache is small enough that vLLM preempts under KV pressure too.

Time is the fake monotonic clock, advanced per engine step by a step-time model close to the
classes' profile (conftest.hs_config): 6 ms per step plus 30 µs per prefilled token.

Reported (`ScenarioResult`): the queued text requests' mean and p95 wait (arrival → first
scheduled), speech requests' mean wait, how many preemptions vLLM (KV pressure) and
HorizonServe (shared-stage rule) made, and what every request got, for the no-loss checks.
"""

from __future__ import annotations

import random
import statistics
from dataclasses import dataclass, field
from typing import Any

from factory import fake_model_output
from horizon import new_ids, stamped

TEXT, SPEECH = 0, 10
N_REQUESTS = 200
BURST = 40
BURST_AT_S = 0.3
SPAN_S = 2.0
ABORT_SHARE = 0.05
STEP_S = 0.006
PREFILL_S_PER_TOKEN = 3e-5
# Scheduler shape: 16 places, 96-token budget, 160 blocks of 16 tokens.
PARAMS = {"max_num_seqs": 16, "max_num_batched_tokens": 96, "num_blocks": 160}


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
    text_wait_s: list[float] = field(default_factory=list)
    speech_wait_s: list[float] = field(default_factory=list)
    vllm_preemptions: int = 0
    hs_preemptions: int = 0
    steps: int = 0
    want: dict[str, int] = field(default_factory=dict)
    got: dict[str, int] = field(default_factory=dict)
    finished: dict[str, int] = field(default_factory=dict)
    aborted: set[str] = field(default_factory=set)

    @property
    def text_mean_ms(self) -> float:
        return 1e3 * statistics.fmean(self.text_wait_s)

    @property
    def text_p95_ms(self) -> float:
        waits = sorted(self.text_wait_s)
        return 1e3 * waits[min(len(waits) - 1, int(0.95 * len(waits)))]

    @property
    def speech_mean_ms(self) -> float:
        return 1e3 * statistics.fmean(self.speech_wait_s)

    def row(self) -> str:
        return (
            f"{self.policy:<22} {self.text_mean_ms:9.1f} {self.text_p95_ms:9.1f} "
            f"{len(self.text_wait_s):6d} {self.speech_mean_ms:10.1f} "
            f"{self.vllm_preemptions:6d} {self.hs_preemptions:6d} {self.steps:6d}"
        )


HEADER = (
    f"{'policy':<22} {'text ms':>9} {'p95 ms':>9} {'texts':>6} {'speech ms':>10} "
    f"{'vLLM':>6} {'HS':>6} {'steps':>6}"
)


def workload(seed: int) -> list[Arrival]:
    """The 200 arrivals, in time order (see the module docstring)."""
    rng = random.Random(seed)
    out = []
    for i in range(BURST):
        out.append(Arrival(f"L{i}", BURST_AT_S, SPEECH, rng.randint(16, 96), rng.randint(120, 240)))
    for i in range(BURST, N_REQUESTS):
        at = rng.uniform(0.0, SPAN_S)
        if rng.random() < 0.55:
            out.append(Arrival(f"S{i}", at, TEXT, rng.randint(8, 64), rng.randint(8, 32)))
        else:
            out.append(Arrival(f"L{i}", at, SPEECH, rng.randint(16, 96), rng.randint(120, 240)))
    for a in rng.sample(out, int(ABORT_SHARE * N_REQUESTS)):
        a.abort_at = a.at + rng.uniform(0.0, 1.0)
    out.sort(key=lambda a: (a.at, a.rid))
    return out


def run(sched: Any, config: Any, clock: Any, policy: str, seed: int = 0) -> ScenarioResult:
    """Drive `sched` through the workload until every request is done."""
    from vllm.v1.request import RequestStatus

    result = ScenarioResult(policy)
    arrivals = workload(seed)
    start = clock.now
    pending = list(arrivals)
    aborts = sorted((a for a in arrivals if a.abort_at is not None), key=lambda a: a.abort_at)
    arrival_of = {a.rid: a for a in arrivals}
    first_scheduled: dict[str, float] = {}
    for _ in range(20_000):
        now = clock.now - start
        while pending and pending[0].at <= now:
            a = pending.pop(0)
            result.want[a.rid] = a.max_tokens
            arrival_ns = clock.now_ns - int((now - a.at) * 1e9)
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
        out = sched.schedule()
        result.vllm_preemptions += len(out.preempted_req_ids)
        for rid in new_ids(out):
            first_scheduled.setdefault(rid, now)
        outputs = sched.update_from_output(out, fake_model_output(sched, out))
        for client in outputs.values():
            for o in client.outputs:
                result.got[o.request_id] = result.got.get(o.request_id, 0) + len(o.new_token_ids)
                if o.finish_reason is not None:
                    result.finished[o.request_id] = result.finished.get(o.request_id, 0) + 1
        prefill_tokens = sum(
            n for rid, n in out.num_scheduled_tokens.items() if n > 1 or rid in new_ids(out)
        )
        clock.advance(STEP_S + PREFILL_S_PER_TOKEN * prefill_tokens)
        result.steps += 1
    hs = sched.horizon
    result.hs_preemptions = hs.preemptions
    result.vllm_preemptions -= hs.preemptions  # preempted_req_ids holds both
    for rid, t in first_scheduled.items():
        a = arrival_of[rid]
        (result.text_wait_s if a.prio == TEXT else result.speech_wait_s).append(t - a.at)
    return result
