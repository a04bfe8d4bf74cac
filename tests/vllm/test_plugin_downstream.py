"""Downstream admission by slack in the REAL vLLM-Omni downstream schedulers (CPU): the
talker's AR scheduler (stage 1) and the generation scheduler of code2wav (stage 2).

Requests carry the stamp the API hook puts into every stage's `SamplingParams` (conftest.
hs_config classes: `speech`, long path, SLO 9.0 s, downstream estimate 51 × 3 ms = 0.153 s).
At the first downstream stage a request is late once less than its downstream estimate is
left before its deadline; at later stages once its deadline has passed.
"""

from __future__ import annotations

import random
from typing import Any

import pytest
from factory import fake_model_output, make_request, run_step
from horizon import ids, new_ids, stamped

pytestmark = pytest.mark.vllm

SPEECH = 10
# (id, age at arrival in s), in arrival order. Deadlines (arrival + 9 s): B < E < C < A;
# N is 8.9 s old: 0.1 s left — less than the 0.153 s downstream estimate (late at stage 1), but
# its deadline has not passed (meetable at stage 2, and the earliest there).
ARRIVALS = [("A", 1.0), ("B", 4.0), ("C", 2.0), ("N", 8.9), ("E", 3.0)]
SLACK_ORDER_STAGE1 = ["B", "E", "C", "A", "N"]
SLACK_ORDER_STAGE2 = ["N", "B", "E", "C", "A"]
ARRIVAL_ORDER = [rid for rid, _ in ARRIVALS]


@pytest.fixture
def stage(hs_env, make_scheduler, clock):
    """`stage(which="talker"|"code2wav", policy="horizon", kind="omni_ar", **params)`."""
    from horizonserve.runtime.engine.vllm_omni.scheduler import (
        ar_scheduler,
        generation_scheduler,
    )

    def build(which: str = "talker", policy: str = "horizon", kind: str = "omni_ar", **params):
        config = hs_env(policy)
        if which == "talker":
            sched = make_scheduler(
                kind, scheduler_cls=ar_scheduler, stage_id=1, model_stage="talker", **params
            )
        else:
            sched = make_scheduler(
                "omni_ar", scheduler_cls=generation_scheduler, stage_id=2,
                model_stage="code2wav", **params,
            )  # fmt: skip
        sched._hs_down.clock_ns = clock
        return sched, config

    return build


def arrive(sched: Any, config: Any, clock: Any, specs=ARRIVALS, **kw: Any) -> None:
    for rid, age in specs:
        sched.add_request(stamped(config, rid, 6, SPEECH, clock.now_ns - int(age * 1e9), **kw))


def admission_order(sched: Any, steps: int = 12) -> list[str]:
    """Admit one request per step (max_num_seqs=1, one token each) until all are served."""
    order: list[str] = []
    for _ in range(steps):
        out, _ = run_step(sched)
        order += new_ids(out)
        if not sched.has_unfinished_requests():
            break
    return order


def generation_order(sched: Any, steps: int = 12) -> list[str]:
    """The generation stage admits one request per step; it is finished (stopped by its
    client) before the next step, as a one-shot code2wav chunk would be."""
    from vllm.v1.request import RequestStatus

    order: list[str] = []
    for _ in range(steps):
        out = sched.schedule()
        order += new_ids(out)
        sched.finish_requests(new_ids(out), RequestStatus.FINISHED_STOPPED)
        if not sched.has_unfinished_requests():
            break
    return order


@pytest.mark.parametrize("kind", ["omni_ar", "omni_ar_async"])
def test_talker_admits_by_deadline_among_meetable_late_behind(stage, clock, kind):
    sched, config = stage("talker", kind=kind, max_num_seqs=1)
    arrive(sched, config, clock, max_tokens=1)
    order = admission_order(sched) if kind == "omni_ar" else _async_order(sched)
    assert order == SLACK_ORDER_STAGE1
    admission = sched.hs_admission
    assert (admission.admitted, admission.late_admitted, len(admission)) == (5, 1, 0)


def _async_order(sched: Any) -> list[str]:
    """The async scheduler: schedule one step ahead, outputs one step late."""
    order, pending = [], None
    for _ in range(20):
        out = sched.schedule()
        order += new_ids(out)
        if pending is not None:
            sched.update_from_output(*pending)
        pending = (out, fake_model_output(sched, out))
        if not sched.has_unfinished_requests():
            break
    return order


def test_code2wav_admits_by_deadline_a_request_is_late_only_past_its_deadline(stage, clock):
    sched, config = stage("code2wav", max_num_seqs=1)
    arrive(sched, config, clock)
    assert generation_order(sched) == SLACK_ORDER_STAGE2
    assert sched.hs_admission.late_admitted == 0


@pytest.mark.parametrize("which", ["talker", "code2wav"])
@pytest.mark.parametrize("policy", ["fcfs", "priority", "horizon-no-downstream"])
def test_baselines_and_the_ablation_keep_arrival_order(stage, clock, which, policy):
    sched, config = stage(which, policy=policy, max_num_seqs=1)
    arrive(sched, config, clock, max_tokens=1)
    order = admission_order(sched) if which == "talker" else generation_order(sched)
    assert order == ARRIVAL_ORDER
    assert sched.hs_admission.reorders == 0


def test_a_request_vllm_preempted_keeps_the_head(stage, clock):
    """A talker request vLLM put back (its stream started) stays ahead of new arrivals, even
    of ones with an earlier deadline: the admission queue manages only first admissions."""
    sched, config = stage("talker", max_num_seqs=1)
    arrive(sched, config, clock, [("A", 1.0)], max_tokens=4)
    run_step(sched)
    arrive(sched, config, clock, [("B", 4.0), ("C", 6.0)], max_tokens=1)
    sched.reset_prefix_cache(reset_running_requests=True)  # vLLM's own preemption path
    assert ids(sched.waiting)[0] == "A"
    out, _ = run_step(sched)
    assert [*new_ids(out), *out.scheduled_cached_reqs.req_ids] == ["A"]  # resumed first
    assert admission_order(sched) == ["C", "B"]  # then by deadline


def test_stamps_cross_stages_unchanged(hs_env, make_scheduler, clock):
    """One stamp, made once: the thinker's signals, the talker's and code2wav's admission
    stamps hold the same class, priority, arrival, deadline and downstream estimate."""
    from vllm.v1.request import Request

    from horizonserve.runtime.engine.vllm_omni.scheduler import (
        ar_scheduler,
        generation_scheduler,
    )
    from horizonserve.runtime.engine.vllm_omni.stamps import (
        STAMP_KEY,
        Stamp,
        make_stamp,
        stamp_of_request,
    )

    config = hs_env()
    stamp = make_stamp(config.slo, "r1", SPEECH, clock.now_ns - 2_000_000_000)
    assert stamp.downstream_ns == round(51 * 0.003 * 1e9)  # the speech profile's estimate
    assert Stamp.from_dict(stamp.to_dict()) == stamp
    legacy = {k: v for k, v in stamp.to_dict().items() if k != "downstream_ns"} | {"v": 1}
    assert Stamp.from_dict(legacy).downstream_ns == 0  # a version-1 stamp still reads
    assert Stamp.from_dict({**stamp.to_dict(), "v": 9}) is None
    extra = {STAMP_KEY: stamp.to_dict()}

    thinker = make_scheduler("omni_ar", scheduler_cls=ar_scheduler)
    talker = make_scheduler("omni_ar", scheduler_cls=ar_scheduler, stage_id=1)
    code2wav = make_scheduler("omni_ar", scheduler_cls=generation_scheduler, stage_id=2)
    seen = []
    for sched in (thinker, talker, code2wav):
        request = make_request("r1", 6, extra_args=dict(extra))
        assert isinstance(request, Request)
        sched.add_request(request)
        seen.append(stamp_of_request(request))
    assert seen == [stamp, stamp, stamp]
    core = stamp.as_core()
    sig = thinker.requests["r1"]._hs_sig
    assert (sig.arrival, sig.deadline) == pytest.approx((core.arrival, core.deadline), abs=1e-6)
    for sched in (talker, code2wav):
        entry = sched.hs_admission._managed[id(sched.requests["r1"])]
        assert entry[1] == core  # the stamp itself, not a recomputation
    assert talker.hs_admission.first_output_s(core) == pytest.approx(0.153)
    assert code2wav.hs_admission.first_output_s(core) == 0.0


@pytest.mark.parametrize("seed", [1, 2])
def test_random_talker_load_with_aborts_loses_nothing(stage, clock, seed):
    """Arrivals with random ages, aborts of waiting and running requests, vLLM's KV
    preemptions: every request not aborted finishes once with all its tokens; the admission
    queue ends empty; the admitted count is the number of distinct requests admitted."""
    from vllm.v1.request import RequestStatus

    sched, config = stage("talker", max_num_seqs=3, num_blocks=12, max_num_batched_tokens=64)
    rng = random.Random(seed)
    want: dict[str, int] = {}
    got: dict[str, int] = {}
    finished: dict[str, int] = {}
    admitted: set[str] = set()
    aborted: set[str] = set()
    for step in range(600):
        if step >= 100 and not sched.has_unfinished_requests():
            break
        if step < 100:
            for _ in range(rng.choice([0, 0, 1, 2])):
                rid = f"R{len(want)}"
                want[rid] = rng.randint(1, 8)
                age = rng.choice([0.0, 3.0, 8.9, 9.5])
                sched.add_request(
                    stamped(config, rid, rng.randint(4, 40), SPEECH,
                            clock.now_ns - int(age * 1e9), max_tokens=want[rid])
                )  # fmt: skip
            if rng.random() < 0.08:
                live = [r for r in [*sched.waiting, *sched.running] if not r.is_finished()]
                if live:
                    victim = rng.choice(live).request_id
                    sched.finish_requests([victim], RequestStatus.FINISHED_ABORTED)
                    aborted.add(victim)
        out = sched.schedule()
        assert not admitted & set(new_ids(out))  # a first admission happens once
        admitted.update(new_ids(out))
        outputs = sched.update_from_output(out, fake_model_output(sched, out))
        for client in outputs.values():
            for o in client.outputs:
                got[o.request_id] = got.get(o.request_id, 0) + len(o.new_token_ids)
                if o.finish_reason is not None:
                    finished[o.request_id] = finished.get(o.request_id, 0) + 1
        queued = ids(sched.waiting)
        assert len(queued) == len(set(queued))
        clock.advance(0.01)
    assert not sched.has_unfinished_requests()
    admission = sched.hs_admission
    assert len(admission) == 0 and admission.admitted == len(admitted)
    assert admission.late_admitted > 0 and admission.reorders > 0
    for rid, n in want.items():
        if rid in aborted:
            assert finished.get(rid, 0) <= 1
        else:
            assert (finished.get(rid), got.get(rid)) == (1, n), rid


def test_downstream_slack_reaches_the_shared_stage_split(stage, build, clock):
    """The talker publishes the smallest slack ratio of a first output pending there (its
    slot of the control record); the shared stage's slack split reads it: a more urgent
    downstream side gets the SMs (the reservation: the shared stage on the ladder's reserve),
    a more urgent shared side keeps Eq. (1)'s cap."""
    from horizonserve.runtime.engine.vllm_omni import shared
    from horizonserve.runtime.spatial import Level

    talker, config = stage("talker", max_num_seqs=1)
    arrive(talker, config, clock, [("A", 0.0)], max_tokens=50)
    run_step(talker)  # A runs (first token out)
    arrive(talker, config, clock, [("U", 8.95)], max_tokens=1)  # 0.05 s left, r̂ 0.153 s
    run_step(talker)
    record = shared.control_record()
    assert record.downstream_min_slack(clock.now_ns, 2_000_000_000) == pytest.approx(
        0.05 / 0.153, rel=1e-3
    )
    thinker, _ = build(max_num_seqs=8)
    run_step(thinker)  # nothing pending on the shared side: the downstream side is first
    assert thinker.horizon.last_decision.sm.level == Level.RESERVED
    assert record.read_decision().shared_sms == config.ladder.s_reserve
    thinker.add_request(stamped(config, "S0", 8, 0, clock.now_ns - 95_000_000))  # protected
    run_step(thinker)
    assert thinker.horizon.last_decision.sm.level == 3  # Eq. (1) at unknown pressure: S_cap


def test_a_saturated_talker_takes_the_split_unless_a_prompt_waits(stage, build, clock):
    """Every talker place taken while an on-time request waits for one: the talker publishes
    SATURATED (runtime.downstream.reported_slack) and gets the reservation however much slack
    the shared side's requests have; a waiting protected prompt still keeps the shared SMs. A
    late waiter (the test above) publishes its slack instead."""
    from horizonserve.runtime.downstream import SATURATED
    from horizonserve.runtime.engine.vllm_omni import shared
    from horizonserve.runtime.spatial import Level

    talker, config = stage("talker", max_num_seqs=1)
    arrive(talker, config, clock, [("A", 0.0)], max_tokens=50)
    run_step(talker)  # A holds the only place
    arrive(talker, config, clock, [("W", 1.0)], max_tokens=1)  # 8 s left against 0.153 s
    run_step(talker)
    record = shared.control_record()
    assert record.downstream_min_slack(clock.now_ns, 2_000_000_000) == SATURATED
    thinker, _ = build(max_num_seqs=8)
    run_step(thinker)
    assert thinker.horizon.last_decision.sm.level == Level.RESERVED
    thinker.add_request(stamped(config, "S0", 8, 0, clock.now_ns - 95_000_000))  # protected
    run_step(thinker)
    assert thinker.horizon.last_decision.sm.level != Level.RESERVED


@pytest.mark.parametrize("policy", ["fcfs", "horizon-no-downstream"])
def test_without_downstream_control_no_slack_is_published(stage, clock, policy):
    from horizonserve.runtime.engine.vllm_omni import shared

    talker, config = stage("talker", policy=policy, max_num_seqs=1)
    arrive(talker, config, clock, [("A", 0.0), ("U", 8.95)], max_tokens=2)
    run_step(talker)
    assert shared.control_record().downstream_min_slack(clock.now_ns, 2_000_000_000) is None
