"""Helpers for the HorizonServe plugin tests: stamped real requests, queue snapshots."""

from __future__ import annotations

from typing import Any

from factory import make_request


def stamp_args(config: Any, rid: str, priority: int, arrival_ns: int) -> dict[str, Any]:
    """The `extra_args` the API hook would stamp for a request of `priority` arriving then."""
    from horizonserve.runtime.engine.vllm_omni.stamps import STAMP_KEY, make_stamp

    return {STAMP_KEY: make_stamp(config.slo, rid, priority, arrival_ns).to_dict()}


def stamped(
    config: Any,
    rid: str,
    prompt_len: int,
    priority: int,
    arrival_ns: int,
    *,
    max_tokens: int = 16,
) -> Any:
    """A real vLLM-Omni request carrying HorizonServe's stamp (class by priority code) and, as
    the API hook passes it, the priority code as vLLM's request priority."""
    return make_request(
        rid,
        prompt_len,
        max_tokens=max_tokens,
        priority=priority,
        extra_args=stamp_args(config, rid, priority, arrival_ns),
    )


def ids(queue: Any) -> list[str]:
    return [r.request_id for r in queue]


def new_ids(out: Any) -> list[str]:
    return [d.req_id for d in out.scheduled_new_reqs]


def resumed_ids(out: Any) -> list[str]:
    cached = out.scheduled_cached_reqs
    resumed = getattr(cached, "resumed_req_ids", None)
    if resumed is not None:
        return [rid for rid in cached.req_ids if rid in resumed]
    return list(cached.req_ids)


def add(
    sched: Any, config: Any, clock: Any, specs: list[tuple[str, int, float]], n: int = 8, **kw: Any
) -> None:
    """Add requests (id, priority, age in seconds at arrival) in this queue order."""
    for rid, prio, age in specs:
        arrival = clock.now_ns - int(age * 1e9)
        sched.add_request(stamped(config, rid, n, prio, arrival, **kw))


def assert_index_in_sync(sched: Any) -> None:
    """The shared-stage policy's waiting index holds exactly vLLM's queued requests."""
    hs = sched.horizon
    queued = ids(sched.waiting) + ids(sched.skipped_waiting)
    assert sorted(hs.waiting) == sorted(queued)
    for request in list(sched.waiting) + list(sched.skipped_waiting):
        assert request._hs_sig.waiting
    assert hs.n_short_prefill + hs.n_long_prefill <= len(hs.waiting)
