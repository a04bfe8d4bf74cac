"""The 2026 co-location baselines: each rule acting, pure and inside the simulator.

shed / shed-edf refuse exactly what vLLM's queue limits say and the refused count as misses;
vllm-omni-current's talker never runs more than K streams, fills its window by deadline, and
its shared stage keeps DTPS's budgets; mps-static keeps its fixed split on every iteration.
"""

from __future__ import annotations

import math
from functools import cache

import numpy as np
import pytest

from horizonserve.runtime.audio_window import (
    DTPS_AGING_S,
    EdfQueue,
    dtps_budget,
    dtps_order,
    window_room,
    window_size,
)
from horizonserve.runtime.baselines import check_engine, rules_for, static_share
from horizonserve.runtime.bench.metrics import summarize
from horizonserve.runtime.config import (
    ControlParams,
    DownstreamOrder,
    PolicyName,
    SmSplit,
    ViewOrder,
    preset_control,
)
from horizonserve.runtime.downstream import SlackQueue, Stamp
from horizonserve.runtime.shedding import (
    QUEUE_FULL,
    QUEUED_TOKENS,
    QueueGate,
    QueueLimits,
    limits_for,
)
from horizonserve.runtime.sim.engine import Simulator
from horizonserve.runtime.sim.setup import SimSetup
from horizonserve.runtime.workload import Trace, generate, load_workload, mix_weights

NEW = ("shed", "shed-edf", "vllm-omni-current", "mps-static")


# -- presets -----------------------------------------------------------------------------------
@pytest.mark.parametrize("name", NEW)
def test_each_new_baseline_is_a_preset_with_every_horizon_axis_off(name: str) -> None:
    c = preset_control(name, ControlParams())
    assert c.sm_split is SmSplit.UNCAPPED and c.downstream is DownstreamOrder.FIFO
    assert c.view_order is (ViewOrder.DEADLINE if name == "shed-edf" else ViewOrder.ARRIVAL)
    r = rules_for(name)
    assert (r.shed, r.window, r.tiered, r.static_share) == (
        name.startswith("shed"), name == "vllm-omni-current", name == "vllm-omni-current",
        name == "mps-static",
    )  # fmt: skip
    assert rules_for(PolicyName.HORIZON) == rules_for("edf-mps")  # no rule for the others


def test_static_share_scales_with_the_gpu_and_refuses_a_split_that_leaves_nothing() -> None:
    assert static_share("qwen2_5_omni", 132, 64) == 64
    assert 1 <= static_share("qwen2_5_omni", 66) < 66
    with pytest.raises(ValueError, match="mps-static: share 132 SMs out of range"):
        static_share("qwen2_5_omni", 132, 132)


# -- shedding: vLLM's rule ---------------------------------------------------------------------
def test_request_limit_refuses_when_unfinished_plus_n_exceeds_it() -> None:
    gate = QueueGate(QueueLimits(max_num_queued_reqs=2))
    assert gate.admit("a", 10) is None and gate.admit("b", 10) is None
    assert gate.admit("c", 10) == QUEUE_FULL  # 2 + 1 > 2
    assert gate.check(n=0) is None  # current + n > max, not ≥
    gate.prefilled("a")  # a running request still counts
    assert gate.admit("c2", 10) == QUEUE_FULL
    gate.finished("a")
    assert gate.admit("d", 10) is None
    assert gate.unfinished == 2 and gate.refused == {QUEUE_FULL: 2}
    with pytest.raises(ValueError, match="already admitted"):
        gate.admit("d", 1)


def test_token_limit_counts_whole_prompts_until_their_first_output_and_not_the_new_one() -> None:
    gate = QueueGate(QueueLimits(max_num_queued_tokens=100))
    assert gate.admit("a", 60) is None  # 0 < 100: admitted, whatever its own length
    assert gate.admit("b", 500) is None  # 60 < 100: the new prompt is not part of the test
    assert gate.queued_tokens == 560
    assert gate.admit("c", 1) == QUEUED_TOKENS  # 560 ≥ 100
    gate.prefilled("b")
    assert gate.queued_tokens == 60 and gate.admit("c", 1) is None
    gate.prefilled("c")
    gate.prefilled("c")  # idempotent
    gate.prefilled("a")
    assert gate.queued_tokens == 0 and gate.unfinished == 3
    gate.finished("b")
    gate.finished("b")
    assert gate.unfinished == 2


def test_limits_follow_vllms_sizing_advice_and_name_the_field() -> None:
    assert limits_for(16, 0.08, 50_000.0) == QueueLimits(32, 4000)
    with pytest.raises(ValueError, match="max_num_queued_reqs: -1 is negative"):
        QueueLimits(max_num_queued_reqs=-1)


@cache
def _setup(pipeline: str) -> SimSetup:
    return SimSetup.load(pipeline)


def _trace(pipeline: str, rate: float, duration_s: float, seed: int = 0) -> Trace:
    wl = load_workload(pipeline)
    mix = mix_weights(wl, _setup(pipeline).long_classes, None)
    return generate(wl, mix, rate=rate, duration_s=duration_s, warmup_s=2.0, seed=seed)


def test_shed_in_the_simulator_refuses_per_the_limit_and_every_refused_request_is_a_miss() -> None:
    setup = _setup("qwen2_5_omni")
    tr = _trace("qwen2_5_omni", 12.0, 20.0)
    limits = QueueLimits(max_num_queued_reqs=6)
    sim = Simulator(setup, tr, "shed", seed=0, baseline={"limits": limits})
    gate = sim.hooks.gate
    assert gate is not None
    peak = 0
    admit = sim.hooks.admit

    def admit_watch(req):  # the count never passes the limit, before or after a decision
        nonlocal peak
        ok = admit(req)
        peak = max(peak, gate.unfinished)
        assert ok == (req.idx not in sim.hooks.shed_ids)
        return ok

    sim.hooks.admit = admit_watch
    res = sim.run()
    shed = sim.hooks.shed_ids
    assert shed and peak == 6 and res.stats["shed"] == len(shed) == gate.refused[QUEUE_FULL]
    assert np.isnan(res.latency[shed]).all()  # never answered
    window = res.window()
    met = res.met()
    assert not met[shed].any()
    summary = summarize(res)
    # Attainment is over every arrival in the window, the refused ones among them as misses.
    assert summary["requests"] == int(window.sum())
    assert math.isclose(summary["attainment"], met[window].sum() / window.sum())
    in_window = [i for i in shed if window[i]]
    assert in_window and summary["attainment"] <= 1 - len(in_window) / window.sum() + 1e-12


def test_shed_without_pressure_refuses_nothing() -> None:
    setup = _setup("qwen2_5_omni")
    tr = _trace("qwen2_5_omni", 1.0, 20.0)
    sim = Simulator(setup, tr, "shed-edf", seed=0)
    res = sim.run()
    assert res.stats["shed"] == 0.0 and not sim.hooks.shed_ids


# -- vllm-omni-current: the window and the tiers -----------------------------------------------
def _stamp(rid: str, deadline: float) -> Stamp:
    return Stamp(rid, "c", 10, 0.0, deadline, 1.0)


def test_edf_window_fills_by_deadline_and_keeps_late_ones_in_deadline_order() -> None:
    edf: EdfQueue[str] = EdfQueue()
    slack: SlackQueue[str] = SlackQueue()
    for rid, d in (("late", 2.0), ("soon", 5.0), ("later", 9.0)):
        edf.push(rid, _stamp(rid, d), 1.0)
        slack.push(rid, _stamp(rid, d), 1.0)
    now = 3.0  # "late" can no longer meet its deadline (late_at 1.0)
    assert [i for i, _ in edf.order(now)] == ["late", "soon", "later"]
    assert [i for i, _ in slack.order(now)] == ["soon", "later", "late"]  # HorizonServe's
    assert edf.remove("soon") and len(edf) == 2
    assert edf.pop(now) == ("late", True) and edf.pop(now) == ("later", False)
    assert edf.pop(now) is None and edf.late_popped == 1


def test_dtps_orders_by_tier_within_the_budget() -> None:
    # (name, downstream-bound, prompt tokens, arrival)
    reqs = [
        ("old-text", False, 50, -200.0),
        ("speech-long", True, 900, 0.0),
        ("text-a", False, 10, 1.0),
        ("speech-short", True, 100, 2.0),
        ("text-b", False, 20, 3.0),
        ("speech-mid", True, 400, 4.0),
    ]

    def order(budget: int) -> list[str]:
        out = dtps_order(
            reqs,
            10.0,
            downstream=lambda r: r[1],
            prompt_tokens=lambda r: r[2],
            arrival=lambda r: r[3],
            budget=budget,
        )
        return [r[0] for r in out]

    assert order(2) == [
        "old-text", "speech-short", "speech-mid", "text-a", "text-b", "speech-long",
    ]  # fmt: skip
    assert order(0) == [
        "old-text", "text-a", "text-b", "speech-short", "speech-mid", "speech-long",
    ]  # fmt: skip
    assert dtps_budget(2, 0, 0) == 2 and dtps_budget(2, 1, 0) == 1 and dtps_budget(2, 1, 5) == 0
    assert DTPS_AGING_S == 100.0


def test_the_talker_never_runs_more_than_k_streams_and_the_tiers_keep_their_budget() -> None:
    setup = _setup("qwen2_5_omni")
    tr = _trace("qwen2_5_omni", 10.0, 20.0)
    k = 3
    sim = Simulator(setup, tr, "vllm-omni-current", seed=0, baseline={"window": k})
    talker = sim.stages[0]
    assert talker.admit_limit == k and isinstance(talker.queue, EdfQueue)
    peak = 0
    rerate = sim._rerate

    def watch(stage, now, force=False):
        nonlocal peak
        if stage is talker:
            peak = max(peak, stage.in_service)
            assert stage.in_service <= k
        rerate(stage, now, force)

    sim._rerate = watch
    reorder = sim.shared.reorder
    assert reorder is not None
    budgets: list[tuple[int, int]] = []

    def tiers(waiting):
        out = reorder(waiting)
        budget = dtps_budget(2, talker.waiting, sum(1 for r in sim.shared.running if r.long_path))
        head = 0  # downstream-bound requests ahead of the first shared-only one (no aging here)
        for r in out:
            if not r.long_path:
                break
            head += 1
        if any(not r.long_path for r in out):
            assert head <= budget
        budgets.append((head, budget))
        return out

    sim.shared.reorder = tiers
    res = sim.run()
    assert peak == k and res.stats["window_k"] == k
    assert any(b == 0 for _, b in budgets) and any(h > 0 for h, _ in budgets)


def test_mps_static_keeps_its_split_on_every_iteration() -> None:
    setup = _setup("bagel")
    tr = _trace("bagel", 1.5, 20.0)
    sim = Simulator(setup, tr, "mps-static", seed=0, record_steps=True, baseline={"share": 64})
    res = sim.run()
    assert res.steps is not None
    cols = res.steps["columns"]
    shared, down = cols.index("shared_sms"), cols.index("downstream_sms")
    total = setup.cal.ladder.total
    assert res.steps["rows"]
    assert all(r[shared] == 64 and r[down] == total - 64 for r in res.steps["rows"])
    assert sim.hooks.idle_down_sms(total) == total - 64


# -- engines ------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", NEW)
def test_the_simulator_and_the_reference_engine_run_each_new_baseline_the_plugin_refuses(
    name: str,
) -> None:
    check_engine(name, "sim")
    check_engine(name, "reference")
    with pytest.raises(ValueError, match=f"policy '{name}': the vllm-omni engine does not"):
        check_engine(name, "vllm-omni")
    check_engine("horizon", "vllm-omni")  # the presets the plugin applies are not refused


def test_the_window_is_min_of_k_and_the_places_and_admits_only_into_room() -> None:
    assert window_size(None, 16) == 16 and window_size(4, 16) == 4 and window_size(40, 16) == 16
    with pytest.raises(ValueError, match="admits no stream"):
        window_size(0, 16)
    assert [window_room(4, active) for active in (0, 3, 4, 6)] == [4, 1, 0, 0]
