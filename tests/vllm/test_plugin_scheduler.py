"""HorizonServe plugged into the REAL vLLM-Omni AR scheduler (CPU), driven with real requests.

The schedulers are built through `ar_scheduler`, the callable the re-registered pipelines
name as `scheduler_cls` (what vLLM's EngineCore calls). Requests carry the stamp the API hook
puts into `SamplingParams.extra_args`; a fake monotonic clock makes deadlines and protection
deterministic. Rotation is fixed at N:M = 2:2 (steps 0, 1 short-path phases, 2, 3 long-path
phases, ...) and the long-path cap is 2 unless a test says otherwise.

Classes (conftest.hs_config, fixed numbers): priority 0 → `text` (short path), 10 → `speech`
(long path, SLO 9.0 s, estimated remaining time ≈ 0.87 s, so protected once less than
≈ 1.3 s of slack is left).
"""

from __future__ import annotations

import random
from typing import Any

import pytest
from factory import fake_model_output, run_step
from horizon import add, assert_index_in_sync, ids, new_ids, resumed_ids, stamped

pytestmark = pytest.mark.vllm

TEXT, SPEECH = 0, 10


def test_factory_builds_the_stage_classes(build, make_scheduler):
    from vllm_omni.core.sched.omni_ar_scheduler import OmniARAsyncScheduler, OmniARScheduler

    from horizonserve.runtime.engine.vllm_omni import scheduler as hs

    sync, _ = build("omni_ar")
    assert type(sync) is hs.HorizonOmniARScheduler and isinstance(sync, OmniARScheduler)
    asynchronous, _ = build("omni_ar_async")
    assert type(asynchronous) is hs.HorizonOmniARAsyncScheduler
    assert isinstance(asynchronous, OmniARAsyncScheduler)
    talker = make_scheduler(
        "omni_ar_async", scheduler_cls=hs.ar_scheduler, stage_id=1, model_stage="talker"
    )
    assert type(talker) is hs.HorizonDownstreamARAsyncScheduler
    # The view hook sits between Omni's schedule() and vLLM's.
    mro = type(asynchronous).__mro__
    assert mro.index(OmniARScheduler) < mro.index(hs._ViewHook) < mro.index(hs.VLLMScheduler)


@pytest.mark.parametrize("kind", ["omni_ar", "omni_ar_async"])
def test_short_phase_hides_long_prefills_and_restores_them_exactly(build, clock, kind):
    sched, config = build(kind, max_num_seqs=3)
    add(sched, config, clock, [("L0", SPEECH, 0), ("S1", TEXT, 0), ("L2", SPEECH, 0),
                                ("S3", TEXT, 0), ("L4", SPEECH, 0), ("S5", TEXT, 0),
                                ("S6", TEXT, 0)])  # fmt: skip
    out = sched.schedule()
    assert sched.horizon.last_decision.view.phase.value == "short"
    assert new_ids(out) == ["S1", "S3", "S5"]  # max_num_seqs 3: shorts only, in FCFS order
    assert ids(sched.waiting) == ["L0", "L2", "L4", "S6"]  # original order, taken ones gone
    assert sched.horizon.swaps == 1
    assert_index_in_sync(sched)


def test_long_phase_caps_long_prefills_earliest_deadline_first(build, clock):
    sched, config = build(max_num_seqs=8)
    # Ages 1, 3, 2, 4, 0.5 s: deadlines in order L3 < L1 < L2 < L0 < L4, none protected yet.
    add(sched, config, clock, [("L0", SPEECH, 1), ("L1", SPEECH, 3), ("L2", SPEECH, 2),
                                ("L3", SPEECH, 4), ("L4", SPEECH, 0.5)])  # fmt: skip
    out, _ = run_step(sched)
    assert sched.horizon.last_decision.view.phase.value == "long"  # no short work: yields
    assert new_ids(out) == ["L3", "L1"]  # the cap (2), earliest deadlines, in deadline order
    assert ids(sched.waiting) == ["L0", "L2", "L4"]
    out, _ = run_step(sched)
    assert new_ids(out) == ["L2", "L0"]  # again at most 2 per step
    assert ids(sched.waiting) == ["L4"]
    assert_index_in_sync(sched)


def test_protected_requests_bypass_rotation_until_their_deadline(build, clock):
    sched, config = build(max_num_seqs=8)
    add(sched, config, clock, [
        ("S0", TEXT, 0),
        ("L1", SPEECH, 8.0),   # 1.0 s of slack < u_guard · r̂ ≈ 1.3 s: protected
        ("L2", SPEECH, 0),     # ordinary
        ("L3", SPEECH, 10.0),  # past its deadline (9 s): late, ordinary again
    ])  # fmt: skip
    out, _ = run_step(sched)
    assert sched.horizon.last_decision.view.phase.value == "short"
    assert new_ids(out) == ["S0", "L1"]
    assert ids(sched.waiting) == ["L2", "L3"]
    l3 = sched.requests["L3"]._hs_sig
    assert l3.late and not l3.protected
    assert_index_in_sync(sched)


def test_decode_continuations_stay_visible_in_every_phase(build, clock):
    sched, config = build(max_num_seqs=8)
    add(sched, config, clock, [("L0", SPEECH, 0)])
    for _ in range(4):  # steps 0-3 (one rotation cycle): L0 prefills, then decodes
        run_step(sched)
    l0 = sched.requests["L0"]
    assert l0.num_output_tokens == 4
    sched.reset_prefix_cache(reset_running_requests=True)  # real preemption back to waiting
    assert ids(sched.waiting) == ["L0"] and l0._hs_sig.prefilled
    add(sched, config, clock, [("S1", TEXT, 0), ("L2", SPEECH, 0)])
    out, _ = run_step(sched)  # step 4: a short-path phase again
    assert sched.horizon.last_decision.view.phase.value == "short"
    assert resumed_ids(out) == ["L0"]  # the continuation is not hidden
    assert new_ids(out) == ["S1"]
    assert ids(sched.waiting) == ["L2"]
    assert_index_in_sync(sched)


def test_preempted_inside_a_hidden_step_goes_back_in_front(build, clock):
    # 5 blocks of 16 tokens: A and B (30-token prompts) hold 4; S2 (40 tokens) cannot get in.
    # Decoding A past 32 tokens needs a block, so vLLM preempts B inside a step whose view
    # hides S2 (a long-path phase) or L0/L1 (a short-path phase).
    sched, config = build(max_num_seqs=4, num_blocks=5, max_num_batched_tokens=512)
    add(sched, config, clock, [("A", TEXT, 0), ("B", TEXT, 0)], n=30)
    run_step(sched)
    add(sched, config, clock, [("S2", TEXT, 0)], n=40)
    add(sched, config, clock, [("L0", SPEECH, 0), ("L1", SPEECH, 0)])
    b = sched.requests["B"]
    for _ in range(6):
        swaps = sched.horizon.swaps
        run_step(sched)
        if b.num_preemptions:
            break
    assert b.num_preemptions == 1
    assert sched.horizon.swaps == swaps + 1  # it happened under an active view
    assert ids(sched.waiting) == ["B", "S2", "L0", "L1"]  # preempted first, rest in place
    assert b._hs_sig.prefilled and b._hs_sig.waiting  # back as a continuation
    assert_index_in_sync(sched)


@pytest.mark.parametrize("kind", ["omni_ar", "omni_ar_async"])
def test_vllm_priority_policy_queue(hs_env, make_scheduler, clock, kind):
    from horizonserve.runtime.engine.vllm_omni.scheduler import ar_scheduler

    config = hs_env()
    sched = make_scheduler(kind, scheduler_cls=ar_scheduler, max_num_seqs=2, policy="priority")
    sched.horizon.clock_ns = clock
    assert type(sched.waiting).__name__ == "PriorityRequestQueue"
    add(sched, config, clock, [("L0", SPEECH, 0), ("S1", TEXT, 0), ("L2", SPEECH, 0),
                                ("S3", TEXT, 0), ("S4", TEXT, 0)])  # fmt: skip
    out = sched.schedule()
    assert sorted(new_ids(out)) == ["S1", "S3"]
    assert sorted(ids(sched.waiting)) == ["L0", "L2", "S4"]
    assert_index_in_sync(sched)


def test_fcfs_policy_is_vanilla(build, clock):
    sched, config = build(max_num_seqs=3, policy="fcfs")
    add(sched, config, clock, [("L0", SPEECH, 0), ("S1", TEXT, 0), ("L2", SPEECH, 0),
                                ("S3", TEXT, 0)])  # fmt: skip
    out, _ = run_step(sched)
    assert new_ids(out) == ["L0", "S1", "L2"]
    assert sched.horizon.swaps == 0
    sm = sched.horizon.last_decision.sm
    assert (sm.shared, sm.level) == (132, -2)  # uncapped


def test_decision_follows_downstream_activity_through_the_control_record(build, clock):
    from horizonserve.runtime.engine.vllm_omni import shared

    sched, config = build()
    record = shared.control_record()
    talker = record.downstream_writer(0)
    run_step(sched)
    decision = record.read_decision()
    assert (decision.shared_sms, decision.level_index) == (config.ladder.aggressive, -1)
    talker.set_active(2, clock.now_ns)
    run_step(sched)
    decision = record.read_decision()
    assert decision.level_index >= 0 and decision.shared_sms <= config.ladder.s_cap
    assert decision.shared_sms + decision.downstream_sms == config.ladder.total
    assert decision.steps == 2
    clock.advance(5.0)  # the talker's heartbeat is now older than HORIZONSERVE_VLLM_MAX_AGE_S
    run_step(sched)
    assert record.read_decision().shared_sms == config.ladder.aggressive


def test_requests_entering_behind_the_hooks_are_adopted(build, clock):
    sched, config = build(max_num_seqs=8)
    add(sched, config, clock, [("S0", TEXT, 0)])
    sneaky = stamped(config, "L9", 8, SPEECH, clock.now_ns)
    sched.requests["L9"] = sneaky
    sched.waiting.add_request(sneaky)  # no _enqueue_waiting_request: the audit must find it
    run_step(sched)
    assert sched.horizon.audits == 1
    assert "L9" in sched.horizon.waiting or "L9" in [r.request_id for r in sched.running]
    assert_index_in_sync(sched)


def test_aborted_waiting_requests_leave_the_policy(build, clock):
    from vllm.v1.request import RequestStatus

    sched, config = build(max_num_seqs=1)
    add(sched, config, clock, [("S0", TEXT, 0), ("L1", SPEECH, 0), ("S2", TEXT, 0)])
    run_step(sched)
    sched.finish_requests(["L1"], RequestStatus.FINISHED_ABORTED)
    assert "L1" not in sched.horizon.waiting
    assert sched.horizon.n_long_prefill == 0
    assert_index_in_sync(sched)
    assert sched.horizon.audits == 0


def _drive(sched: Any, config: Any, clock: Any, seed: int) -> list[tuple]:
    """A random workload: arrivals, steps, aborts, preemptions; returns what each step did."""
    from vllm.v1.request import RequestStatus

    rng = random.Random(seed)
    trace = []
    next_id = 0
    for _ in range(60):
        for _ in range(rng.choice([0, 0, 1, 2, 4])):
            prio = rng.choice([TEXT, TEXT, SPEECH])
            age = rng.choice([0.0, 0.0, 0.5, 7.9, 8.2, 9.5])
            rid = f"{'S' if prio == TEXT else 'L'}{next_id}"
            next_id += 1
            arrival = clock.now_ns - int(age * 1e9)
            sched.add_request(
                stamped(
                    config, rid, rng.randint(4, 40), prio, arrival, max_tokens=rng.randint(1, 6)
                )
            )
        roll = rng.random()
        if roll < 0.05 and sched.running:
            sched.reset_prefix_cache(reset_running_requests=True)
        elif roll < 0.12 and sched.waiting:
            victim = rng.choice(list(sched.waiting))
            sched.finish_requests([victim.request_id], RequestStatus.FINISHED_ABORTED)
        out = sched.schedule()
        sched.update_from_output(out, fake_model_output(sched, out))
        assert_index_in_sync(sched)
        trace.append((new_ids(out), resumed_ids(out), ids(sched.waiting)))
        clock.advance(0.01)
    assert sched.horizon.audits == 0
    assert sched.horizon.swaps > 10  # views were really applied
    return trace


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_window_view_matches_hiding_from_the_whole_queue(hs_env, make_scheduler, seed, monkeypatch):
    """The bounded view (free slots + margin) schedules exactly what hiding everything does."""
    from conftest import FakeClock

    from horizonserve.runtime.engine.vllm_omni.scheduler import ar_scheduler

    config = hs_env(long_path_cap=1)
    traces = []
    for margin in ("2", "all"):
        monkeypatch.setenv("HORIZONSERVE_VLLM_WINDOW_MARGIN", margin)
        clock = FakeClock()
        sched = make_scheduler(
            "omni_ar", scheduler_cls=ar_scheduler, max_num_seqs=4, num_blocks=40,
            max_num_batched_tokens=96,
        )  # fmt: skip
        sched.horizon.clock_ns = clock
        traces.append(_drive(sched, config, clock, seed))
    assert traces[0] == traces[1]
    assert sum(len(new) for new, _, _ in traces[0]) > 30  # the workload did schedule things
    assert any(resumed for _, resumed, _ in traces[0])  # and preempted ones came back


# -- urgent-prefill boost ---------------------------------------------------------------------
# Default ladder: levels [32, 48, 64, 80], S_aggr = S_tot = 132. No NVML on CPU: unknown
# pressure, so the cap while the talker runs is S_cap = 80 (level 3), headroom 52.
CAP, HEADROOM, AGGR = 80, 52, 132


def talker_busy(clock: Any) -> Any:
    """Mark the talker's slot active (2 requests); returns the control record."""
    from horizonserve.runtime.engine.vllm_omni import shared

    record = shared.control_record()
    record.downstream_writer(0).set_active(2, clock.now_ns)
    return record


def published(record: Any) -> tuple[int, int, int]:
    d = record.read_decision()
    return d.shared_sms, d.downstream_sms, d.level_index


@pytest.mark.parametrize("kind", ["omni_ar", "omni_ar_async"])
def test_a_step_prefilling_a_short_path_prompt_runs_on_s_aggr(build, clock, kind):
    sched, config = build(kind, max_num_seqs=8)
    record = talker_busy(clock)
    add(sched, config, clock, [("S0", TEXT, 0), ("L1", SPEECH, 0)])
    out, _ = run_step(sched)  # step 0, a short-path phase: S0 only
    assert new_ids(out) == ["S0"]
    # The whole forward on S_aggr; the headroom and level the talker follows stay the cap's.
    assert published(record) == (AGGR, HEADROOM, 3)
    assert sched.horizon.last_decision.sm.shared == CAP
    out, _ = run_step(sched)  # step 1: no short-path work left, L1 (relaxed) prefills
    assert new_ids(out) == ["L1"] and published(record) == (CAP, HEADROOM, 3)
    out, _ = run_step(sched)  # decodes only
    assert not new_ids(out) and published(record) == (CAP, HEADROOM, 3)


@pytest.mark.parametrize(
    ("specs", "control", "expected"),
    [
        ([("L0", SPEECH, 0), ("L1", SPEECH, 2.0)], {}, CAP),  # relaxed long-path prompts
        ([("L0", SPEECH, 0), ("L1", SPEECH, 8.0)], {}, AGGR),  # L1 protected (1 s of slack)
        ([("S0", TEXT, 0)], {"boost": "backlog"}, CAP),  # boost off
    ],
    ids=["relaxed-long-path", "protected-long-path", "boost-off"],
)
def test_only_urgent_prompts_raise_the_step_above_the_cap(build, clock, specs, control, expected):
    sched, config = build(max_num_seqs=8, control=control)
    record = talker_busy(clock)
    add(sched, config, clock, specs)
    out, _ = run_step(sched)
    assert sorted(new_ids(out)) == sorted(rid for rid, _, _ in specs)  # all (deadline order)
    assert published(record) == (expected, HEADROOM, 3)
    assert sched.horizon.last_shared_sms == expected


def test_boost_off_publishes_what_the_policy_decided(build, clock):
    """With boost "backlog" (no prefill boost) every published split is the policy's decision."""
    sched, config = build(max_num_seqs=8, control={"boost": "backlog"})
    record = talker_busy(clock)
    add(sched, config, clock, [("S0", TEXT, 0), ("L1", SPEECH, 8.0)], n=300)
    for _ in range(4):  # chunked prefills, then decodes
        run_step(sched)
        sm = sched.horizon.last_decision.sm
        assert sm.prefill == sm.shared == CAP
        assert published(record) == (sm.shared, sm.downstream, sm.level)


def test_chunk_continuations_of_an_urgent_prompt_stay_boosted(build, clock):
    # 300-token prompt, 256-token budget: chunks of 256 and 44, then decodes.
    sched, config = build(max_num_seqs=8, max_num_batched_tokens=256)
    record = talker_busy(clock)
    add(sched, config, clock, [("S0", TEXT, 0)], n=300)
    out, _ = run_step(sched)
    assert out.num_scheduled_tokens == {"S0": 256} and published(record)[0] == AGGR
    out, _ = run_step(sched)
    assert not new_ids(out) and out.num_scheduled_tokens == {"S0": 44}
    assert published(record)[0] == AGGR
    out, _ = run_step(sched)
    assert out.num_scheduled_tokens == {"S0": 1} and published(record)[0] == CAP


def test_a_resumed_request_with_output_recomputes_at_the_cap(build, clock):
    """Its prompt already gave its first token: the recompute serves decode, not TTFT."""
    sched, config = build(max_num_seqs=8)
    record = talker_busy(clock)
    add(sched, config, clock, [("S0", TEXT, 0)])
    for _ in range(3):
        run_step(sched)
    sched.reset_prefix_cache(reset_running_requests=True)  # real preemption back to waiting
    out, _ = run_step(sched)
    assert resumed_ids(out) == ["S0"], (resumed_ids(out), new_ids(out))
    assert published(record)[0] == CAP


def _reference_sms(sched: Any, out: Any, now: float) -> int:
    """The boost from a scan of the whole batch: new requests and cached ones still without
    output (prompt chunks, resumed before any output) are the prompts prefilled this step."""
    sm = sched.horizon.last_decision.sm
    cached = out.scheduled_cached_reqs
    rids = [d.req_id for d in out.scheduled_new_reqs]
    rids += [rid for rid in cached.req_ids if cached.is_context_phase(rid)]
    sigs = [sched.requests[rid]._hs_sig for rid in rids]
    urgent = any(not s.long_path or now > s.protect_at for s in sigs)
    return sm.prefill if urgent else sm.shared


@pytest.mark.parametrize("seed", [1, 2])
def test_boost_tracking_matches_a_scan_of_the_whole_batch(build, clock, seed):
    """Random arrivals (prompts up to 3 chunks), aborts and preemptions while the talker runs:
    the O(new + chunked) tracking publishes what a full scan of every step's batch gives."""
    from vllm.v1.request import RequestStatus

    sched, config = build(max_num_seqs=4, num_blocks=60, max_num_batched_tokens=64)
    record = talker_busy(clock)
    rng = random.Random(seed)
    seen = set()
    for step in range(80):
        for _ in range(rng.choice([0, 0, 0, 1, 2])):
            prio = rng.choice([TEXT, SPEECH, SPEECH])
            add(sched, config, clock, [(f"R{step}-{rng.random():.6f}", prio,
                                        rng.choice([0.0, 2.0, 8.0]))],
                n=rng.randint(4, 150))  # fmt: skip
        roll = rng.random()
        if roll < 0.05 and sched.running:
            sched.reset_prefix_cache(reset_running_requests=True)
        elif roll < 0.1 and sched.waiting:
            victim = rng.choice(list(sched.waiting))
            sched.finish_requests([victim.request_id], RequestStatus.FINISHED_ABORTED)
        record.downstream_writer(0).set_active(2, clock.now_ns)  # heartbeat
        out = sched.schedule()
        assert published(record)[0] == _reference_sms(sched, out, clock.now), step
        seen.add(published(record)[0])
        sched.update_from_output(out, fake_model_output(sched, out))
        clock.advance(0.01)
    assert seen == {CAP, AGGR}


# -- backlog lift -----------------------------------------------------------------------------
# While the talker runs and vLLM has no free place for a waiting request, the step runs on
# S_aggr at level LIFTED; the published headroom is S_tot − S_aggr = 0 (workers keep S_tot −
# S_cap, see test_plugin_worker.py).
LIFTED, AGGRESSIVE, UNCAPPED = -3, -1, -2
LIFT = (AGGR, 0, LIFTED)


@pytest.mark.parametrize("kind", ["omni_ar", "omni_ar_async"])
def test_a_full_running_set_with_requests_waiting_lifts_the_step(build, clock, kind):
    sched, config = build(kind, max_num_seqs=2)
    record = talker_busy(clock)
    add(sched, config, clock, [("S0", TEXT, 0), ("S1", TEXT, 0), ("S2", TEXT, 0)])
    out, _ = run_step(sched)  # places free: S0 and S1 admitted (boosted prefill, level 3)
    assert new_ids(out) == ["S0", "S1"] and published(record) == (AGGR, HEADROOM, 3)
    lifted = 0
    while "S2" in ids(sched.waiting):
        record.downstream_writer(0).set_active(2, clock.now_ns)  # heartbeat
        out, _ = run_step(sched)
        if new_ids(out):  # S0 and S1 finished last step: places free again, no lift
            assert new_ids(out) == ["S2"] and published(record) == (AGGR, HEADROOM, 3)
        else:  # both places taken, S2 waits
            assert published(record) == LIFT and sched.horizon.last_decision.sm.level == LIFTED
            lifted += 1
    assert lifted == 15  # S0 and S1 decode their 15 remaining tokens, every step lifted
    out, _ = run_step(sched)  # S2 decodes, nothing waits
    assert published(record) == (CAP, HEADROOM, 3)


@pytest.mark.parametrize(
    ("policy", "control", "talker", "specs", "expected"),
    [
        ("horizon", {}, True, [("S0", TEXT, 0), ("S1", TEXT, 0)], (CAP, HEADROOM, 3)),
        ("horizon", {}, False, [("S0", TEXT, 0), ("S1", TEXT, 0), ("S2", TEXT, 0)],
         (AGGR, 0, AGGRESSIVE)),
        ("horizon", {"boost": "prefill"}, True,
         [("S0", TEXT, 0), ("S1", TEXT, 0), ("S2", TEXT, 0)], (CAP, HEADROOM, 3)),
        ("fcfs", {}, True, [("S0", TEXT, 0), ("S1", TEXT, 0), ("S2", TEXT, 0)],
         (AGGR, AGGR, UNCAPPED)),
    ],
    ids=["full-nothing-waits", "no-downstream", "lift-off", "uncapped-baseline"],
)  # fmt: skip
def test_no_lift_otherwise(build, clock, policy, control, talker, specs, expected):
    """Step 1 runs with both places taken: lifted only with a waiting request, an active
    downstream stage and a throttling policy that has the lift on."""
    sched, config = build(policy=policy, control=control, max_num_seqs=2)
    from horizonserve.runtime.engine.vllm_omni import shared

    record = talker_busy(clock) if talker else shared.control_record()
    add(sched, config, clock, specs)
    run_step(sched)
    out, _ = run_step(sched)
    assert len(sched.running) == 2 and not new_ids(out)
    assert published(record) == expected


def test_a_paused_streaming_session_holds_a_place_but_does_not_wait_for_one(build, clock):
    """vLLM counts a streaming session paused between inputs (in `skipped_waiting`) against
    `max_num_running_reqs`; it waits for its next input, not for a place."""
    sched, config = build(max_num_seqs=2)
    record = talker_busy(clock)
    session = stamped(config, "P0", 8, TEXT, clock.now_ns, max_tokens=1)
    session.resumable = True  # a streaming-input session: pauses once its output is done
    sched.add_request(session)
    add(sched, config, clock, [("S1", TEXT, 0)])
    run_step(sched)  # P0 and S1 admitted; P0 stops after its one token and pauses
    assert ids(sched.skipped_waiting) == ["P0"] and sched.num_waiting_for_streaming_input == 1
    run_step(sched)  # S1 running + P0 paused fill both places, but no one waits for one
    assert published(record) == (CAP, HEADROOM, 3)
    add(sched, config, clock, [("S2", TEXT, 0)])
    out, _ = run_step(sched)  # now S2 waits: lifted, and S2 is not admitted
    assert not new_ids(out) and published(record) == LIFT
