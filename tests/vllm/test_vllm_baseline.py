"""Baseline behaviour of the REAL vLLM / vLLM-Omni schedulers, built on CPU by factory.py.

These pin the upstream behaviour the HorizonServe plugin builds on (what `schedule()` admits,
how `waiting`/`running` evolve, how preempted requests come back, queue ordering rules), so an
upstream change shows up here before it shows up as a plugin bug.
"""

from __future__ import annotations

import pytest
from factory import (
    add_requests,
    cached_req_ids,
    fake_model_output,
    make_request,
    new_req_ids,
    output_token_ids,
    queue_ids,
    require_vllm,
    run_step,
)

pytestmark = pytest.mark.vllm

SYNC_KINDS = ("omni_ar", "vllm")


@pytest.fixture(autouse=True)
def _needs_vllm() -> None:
    require_vllm()


def test_factory_builds_the_production_classes(make_scheduler):
    from vllm.v1.core.sched.async_scheduler import AsyncScheduler
    from vllm.v1.core.sched.request_queue import FCFSRequestQueue, PriorityRequestQueue
    from vllm.v1.core.sched.scheduler import Scheduler
    from vllm.v1.request import Request
    from vllm_omni.config.model import OmniModelConfig
    from vllm_omni.core.sched.omni_ar_scheduler import OmniARAsyncScheduler, OmniARScheduler

    omni = make_scheduler("omni_ar")
    assert type(omni) is OmniARScheduler
    assert isinstance(omni, Scheduler)
    assert isinstance(omni.vllm_config.model_config, OmniModelConfig)
    assert omni.vllm_config.model_config.stage_id == 0
    assert omni.vllm_config.model_config.model_stage == "thinker"
    assert isinstance(omni.waiting, FCFSRequestQueue)
    assert isinstance(omni.skipped_waiting, FCFSRequestQueue)
    assert omni.running == []

    omni_async = make_scheduler("omni_ar_async")
    assert type(omni_async) is OmniARAsyncScheduler
    assert isinstance(omni_async, AsyncScheduler)

    plain = make_scheduler("vllm", policy="priority")
    assert type(plain) is Scheduler
    assert isinstance(plain.waiting, PriorityRequestQueue)

    request = make_request("r0", 10, max_tokens=4, arrival_time=5.0, priority=3)
    assert isinstance(request, Request)
    assert (request.num_prompt_tokens, request.max_tokens) == (10, 4)
    assert (request.arrival_time, request.priority) == (5.0, 3)


@pytest.mark.parametrize("kind", SYNC_KINDS)
def test_prefill_then_decode(make_scheduler, kind):
    """Budget 64: r0 (40) fits, r1 (30) is chunked to 24, r2 (8) waits; next step all run."""
    scheduler = make_scheduler(kind, max_num_batched_tokens=64)
    add_requests(
        scheduler,
        [
            make_request("r0", 40, max_tokens=4, arrival_time=1.0),
            make_request("r1", 30, max_tokens=4, arrival_time=2.0),
            make_request("r2", 8, max_tokens=4, arrival_time=3.0),
        ],
    )
    assert queue_ids(scheduler.waiting) == ["r0", "r1", "r2"]

    out = scheduler.schedule()
    assert out.num_scheduled_tokens == {"r0": 40, "r1": 24}
    assert new_req_ids(out) == ["r0", "r1"]
    assert cached_req_ids(out) == []
    assert queue_ids(scheduler.waiting) == ["r2"]
    assert queue_ids(scheduler.running) == ["r0", "r1"]
    r0, r1, r2 = (scheduler.requests[i] for i in ("r0", "r1", "r2"))
    assert (r0.num_computed_tokens, r1.num_computed_tokens, r2.num_computed_tokens) == (40, 24, 0)
    assert not r0.is_prefill_chunk
    assert r1.is_prefill_chunk

    engine_outputs = scheduler.update_from_output(out, fake_model_output(scheduler, out))
    assert output_token_ids(engine_outputs) == {"r0": [7]}
    assert r0.num_output_tokens == 1
    assert r1.num_output_tokens == 0

    out = scheduler.schedule()
    assert out.num_scheduled_tokens == {"r0": 1, "r1": 6, "r2": 8}
    assert new_req_ids(out) == ["r2"]
    assert cached_req_ids(out) == ["r0", "r1"]
    assert len(scheduler.waiting) == 0
    assert queue_ids(scheduler.running) == ["r0", "r1", "r2"]


@pytest.mark.parametrize("kind", SYNC_KINDS)
def test_requests_finish_after_max_tokens(make_scheduler, kind):
    from vllm.v1.engine import FinishReason

    scheduler = make_scheduler(kind)
    add_requests(
        scheduler, [make_request("a", 12, max_tokens=3), make_request("b", 5, max_tokens=1)]
    )
    tokens: dict[str, list[int]] = {"a": [], "b": []}
    finish: dict[str, object] = {}
    for step in range(3):
        _, engine_outputs = run_step(scheduler, token_id=100 + step)
        for outputs in engine_outputs.values():
            for output in outputs.outputs:
                tokens[output.request_id].extend(output.new_token_ids)
                if output.finish_reason is not None:
                    finish[output.request_id] = output.finish_reason
    assert tokens == {"a": [100, 101, 102], "b": [100]}
    assert finish == {"a": FinishReason.LENGTH, "b": FinishReason.LENGTH}
    assert scheduler.running == []
    assert len(scheduler.waiting) == 0
    assert scheduler.requests == {}
    assert not scheduler.has_unfinished_requests()


@pytest.mark.parametrize("kind", SYNC_KINDS)
def test_max_num_seqs_leaves_the_rest_waiting_in_fcfs_order(make_scheduler, kind):
    scheduler = make_scheduler(kind, max_num_seqs=2)
    add_requests(scheduler, [make_request(f"r{i}", 8, arrival_time=float(i)) for i in range(4)])
    out, _ = run_step(scheduler)
    assert new_req_ids(out) == ["r0", "r1"]
    assert queue_ids(scheduler.running) == ["r0", "r1"]
    assert queue_ids(scheduler.waiting) == ["r2", "r3"]
    out = scheduler.schedule()
    assert cached_req_ids(out) == ["r0", "r1"]
    assert new_req_ids(out) == []


@pytest.mark.parametrize("kind", SYNC_KINDS)
def test_priority_policy_orders_by_priority_then_arrival(make_scheduler, kind):
    """policy="priority": waiting iterates and admits by (priority, arrival_time, request_id)."""
    scheduler = make_scheduler(kind, policy="priority", max_num_seqs=1)
    add_requests(
        scheduler,
        [
            make_request("late-urgent", 8, arrival_time=9.0, priority=0),
            make_request("early-normal", 8, arrival_time=1.0, priority=1),
            make_request("early-urgent", 8, arrival_time=2.0, priority=0),
            make_request("tie-b", 8, arrival_time=5.0, priority=1),
            make_request("tie-a", 8, arrival_time=5.0, priority=1),
        ],
    )
    assert queue_ids(scheduler.waiting) == [
        "early-urgent",
        "late-urgent",
        "early-normal",
        "tie-a",
        "tie-b",
    ]
    out = scheduler.schedule()
    assert new_req_ids(out) == ["early-urgent"]
    assert queue_ids(scheduler.waiting) == ["late-urgent", "early-normal", "tie-a", "tie-b"]


def test_fcfs_queue_remove_and_prepend_semantics(make_scheduler):
    """What a hide/restore wrapper must know about FCFSRequestQueue (a deque subclass)."""
    scheduler = make_scheduler("omni_ar")
    requests = [make_request(f"r{i}", 8, arrival_time=float(i)) for i in range(5)]
    add_requests(scheduler, requests)
    waiting = scheduler.waiting

    hidden = [requests[1], requests[3]]
    waiting.remove_requests(hidden)
    assert queue_ids(waiting) == ["r0", "r2", "r4"]

    # prepend_requests is deque.extendleft: it REVERSES the given sequence.
    waiting.prepend_requests(hidden)
    assert queue_ids(waiting) == ["r3", "r1", "r0", "r2", "r4"]

    # Exact original order has to be rebuilt explicitly.
    order = {request.request_id: i for i, request in enumerate(requests)}
    rebuilt = sorted(waiting, key=lambda r: order[r.request_id])
    waiting.clear()
    waiting.extend(rebuilt)
    assert queue_ids(waiting) == ["r0", "r1", "r2", "r3", "r4"]


def test_hidden_waiting_requests_are_not_scheduled_and_restore_in_order(make_scheduler):
    """The plugin's core move, done by hand around the real OmniARScheduler.schedule()."""
    scheduler = make_scheduler("omni_ar")
    requests = [make_request(f"r{i}", 8, arrival_time=float(i)) for i in range(5)]
    add_requests(scheduler, requests)
    original = list(scheduler.waiting)
    waiting = scheduler.waiting

    hidden = {"r1", "r3"}
    scheduler.waiting.remove_requests([r for r in original if r.request_id in hidden])
    out = scheduler.schedule()
    # OmniARScheduler.schedule() keeps the same queue object when it defers nothing.
    assert scheduler.waiting is waiting
    assert new_req_ids(out) == ["r0", "r2", "r4"]
    assert len(scheduler.waiting) == 0

    # Restore: every hidden request still waiting goes back at its original position.
    still_waiting = {id(r) for r in scheduler.waiting}
    restored = [r for r in original if r.request_id in hidden or id(r) in still_waiting]
    scheduler.waiting.clear()
    scheduler.waiting.extend(restored)
    assert queue_ids(scheduler.waiting) == ["r1", "r3"]

    scheduler.update_from_output(out, fake_model_output(scheduler, out))
    out = scheduler.schedule()
    assert new_req_ids(out) == ["r1", "r3"]
    assert cached_req_ids(out) == ["r0", "r2", "r4"]


@pytest.mark.parametrize("kind", SYNC_KINDS)
def test_preempted_request_returns_to_the_front_of_waiting(make_scheduler, kind):
    """A preempted decode sits in `waiting` with num_computed_tokens == 0, like a fresh
    prefill; status PREEMPTED / num_preemptions / num_output_tokens tell them apart."""
    from vllm.v1.request import RequestStatus

    # 4 usable blocks of 16 tokens: two 32-token prompts fill them; r0's first decode token
    # needs a fifth block, so the scheduler preempts the last running request (r1).
    scheduler = make_scheduler(kind, num_blocks=5, max_num_batched_tokens=64)
    add_requests(
        scheduler,
        [
            make_request("r0", 32, max_tokens=8, arrival_time=1.0),
            make_request("r1", 32, max_tokens=8, arrival_time=2.0),
            make_request("fresh", 8, max_tokens=8, arrival_time=3.0),
        ],
    )
    out, engine_outputs = run_step(scheduler)
    assert new_req_ids(out) == ["r0", "r1"]
    assert output_token_ids(engine_outputs) == {"r0": [7], "r1": [7]}

    out = scheduler.schedule()
    assert out.num_scheduled_tokens == {"r0": 1}
    assert out.preempted_req_ids == {"r1"}
    assert queue_ids(scheduler.waiting) == ["r1", "fresh"]
    assert queue_ids(scheduler.running) == ["r0"]

    preempted, fresh = scheduler.requests["r1"], scheduler.requests["fresh"]
    assert preempted.status == RequestStatus.PREEMPTED
    assert fresh.status == RequestStatus.WAITING
    assert preempted.num_computed_tokens == fresh.num_computed_tokens == 0
    assert (preempted.num_preemptions, preempted.num_output_tokens) == (1, 1)
    assert (fresh.num_preemptions, fresh.num_output_tokens) == (0, 0)
    # A resumed request recomputes prompt + generated tokens.
    assert preempted.num_tokens == 33


def test_async_scheduler_schedules_the_next_decode_before_the_output_arrives(make_scheduler):
    """OmniARAsyncScheduler (the default for AR stages) runs one step ahead via placeholders."""
    scheduler = make_scheduler("omni_ar_async")
    add_requests(scheduler, [make_request("a", 10, max_tokens=4)])
    first = scheduler.schedule()
    request = scheduler.requests["a"]
    assert first.num_scheduled_tokens == {"a": 10}
    assert (request.num_computed_tokens, request.num_output_placeholders) == (10, 1)
    first_output = fake_model_output(scheduler, first, token_id=11)

    second = scheduler.schedule()
    assert second.num_scheduled_tokens == {"a": 1}
    assert cached_req_ids(second) == ["a"]
    assert (request.num_computed_tokens, request.num_output_placeholders) == (11, 2)
    second_output = fake_model_output(scheduler, second, token_id=12)

    assert output_token_ids(scheduler.update_from_output(first, first_output)) == {"a": [11]}
    assert output_token_ids(scheduler.update_from_output(second, second_output)) == {"a": [12]}
    assert request.num_output_placeholders == 0
    assert list(request.output_token_ids) == [11, 12]


def test_sampling_extra_args_reach_the_scheduler_request(make_scheduler):
    """extra_args is the per-request channel that survives every stage hop."""
    scheduler = make_scheduler("omni_ar")
    tag = {"class": "long", "deadline": 12.5}
    scheduler.add_request(make_request("x", 8, extra_args={"horizonserve": tag}))
    request = scheduler.requests["x"]
    assert request.sampling_params.extra_args == {"horizonserve": tag}
    out = scheduler.schedule()
    assert type(out).__name__ == "OmniSchedulerOutput"
    assert new_req_ids(out) == ["x"]


def test_prefix_caching_needs_the_block_hasher(make_scheduler):
    """With prefix caching on, a repeated prompt is served from cache (block hasher attached)."""
    scheduler = make_scheduler("omni_ar", enable_prefix_caching=True)
    add_requests(scheduler, [make_request("p0", 40, token_id=5, block_size=16)])
    run_step(scheduler)
    add_requests(scheduler, [make_request("p1", 40, token_id=5, block_size=16)])
    out = scheduler.schedule()
    # 2 full blocks (32 tokens) are cached; the last 8 prompt tokens are computed.
    assert out.num_scheduled_tokens["p1"] == 8
