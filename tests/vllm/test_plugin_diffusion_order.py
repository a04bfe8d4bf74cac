"""Deadline order at the diffusion stage on vLLM-Omni's REAL diffusion scheduler
(`RequestScheduler`; CPU, no model): the requests the API hook stamped into the shared request
table are admitted earliest deadline first, unknown ones behind in arrival order; the
baselines keep vLLM-Omni's first come, first served."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

pytestmark = pytest.mark.vllm

IMAGE = 20


def _scheduler(install: bool) -> Any:
    from vllm_omni.diffusion import sched as diffusion_sched

    from horizonserve.runtime.engine.vllm_omni import diffusion_order

    module = SimpleNamespace(
        **{n: getattr(diffusion_sched, n) for n in diffusion_order.SCHEDULER_NAMES}
    )
    assert diffusion_order.install(module, downstream_control=install) is install  # type: ignore[arg-type]
    return module.RequestScheduler()


def _add(sched: Any, rid: str) -> None:
    from vllm_omni.diffusion.request import OmniDiffusionRequest
    from vllm_omni.inputs.data import OmniDiffusionSamplingParams

    params = OmniDiffusionSamplingParams()
    sched.add_request(OmniDiffusionRequest(prompt="x", sampling_params=params, request_id=rid))


def _admitted(sched: Any, n: int) -> list[str]:
    """Admit one request per schedule (one place), finishing it before the next."""
    from vllm_omni.diffusion.sched.interface import DiffusionRequestStatus

    order = []
    for _ in range(n):
        out = sched.schedule()
        rids = [d.request_id for d in out.scheduled_new_reqs]
        order += rids
        sched.finish_requests(rids, DiffusionRequestStatus.FINISHED_COMPLETED)
    return order


@pytest.fixture
def stamped_table(hs_env, clock):
    """A, B, C, D arrive in that order; deadlines C < A < B; D was never stamped."""
    from horizonserve.runtime.engine.vllm_omni import shared

    table = shared.request_table()
    now = clock.now_ns
    for rid, deadline_in in (("A", 5.0), ("B", 9.0), ("C", 1.0)):
        table.insert(rid, IMAGE, now, now + int(deadline_in * 1e9))
    return table


def test_the_dit_admits_by_deadline(stamped_table):
    sched = _scheduler(install=True)
    for rid in "ABCD":
        _add(sched, rid)
    assert _admitted(sched, 4) == ["C", "A", "B", "D"]
    assert sched.hs_reorders >= 1


def test_without_downstream_control_the_dit_keeps_arrival_order(stamped_table):
    sched = _scheduler(install=False)
    for rid in "ABCD":
        _add(sched, rid)
    assert _admitted(sched, 4) == ["A", "B", "C", "D"]


def test_install_is_idempotent_and_keeps_the_class_name_readable():
    from vllm_omni.diffusion.sched import RequestScheduler

    from horizonserve.runtime.engine.vllm_omni.diffusion_order import deadline_ordered

    cls = deadline_ordered(RequestScheduler)
    assert deadline_ordered(cls) is cls and cls.__name__ == "HorizonRequestScheduler"
    assert issubclass(cls, RequestScheduler)


@pytest.mark.parametrize(("policy", "installed"), [("horizon", True), ("fcfs", False)])
def test_install_follows_the_configured_policy(hs_env, policy, installed):
    from vllm_omni.diffusion import sched as diffusion_sched

    from horizonserve.runtime.engine.vllm_omni import diffusion_order

    hs_env(policy)
    module = SimpleNamespace(RequestScheduler=diffusion_sched.RequestScheduler)
    assert diffusion_order.install(module) is installed  # type: ignore[arg-type]
    assert (module.RequestScheduler.__name__ == "HorizonRequestScheduler") is installed
