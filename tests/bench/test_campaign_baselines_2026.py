"""bench/eval/campaign.py and the 2026 baselines: the plan can hold them (beside the paper's
systems, or as a capacity campaign bracketing each system's simulated 90 % crossing), each item
records what its baseline runs with, and a run counts every refused request as a miss."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from tests.bench.scripts import load_eval_script

ROOT = Path(__file__).resolve().parents[2]
ARTIFACT = ROOT / "bench/results/calibration/h200-1/h200-measured-shipped.json"
NEW = ("shed", "shed-edf", "vllm-omni-current", "mps-static")


def _plan(tmp_path: Path, *extra: str) -> dict:
    out = tmp_path / "plan.json"
    argv = ["plan", "--out", str(out), "--pipeline", "qwen2_5_omni", "--artifact", str(ARTIFACT),
            "--duration", "10", *extra]  # fmt: skip
    assert load_eval_script("campaign").main(argv) == 0
    return json.loads(out.read_text())


def test_new_baselines_join_the_main_systems_and_mps_static_groups_apart(tmp_path: Path) -> None:
    plan = _plan(tmp_path, "--rates", "8", "--stress-rate", "8", "--long-ratios", "0.6",
                 "--long-rate", "6", "--new-baselines", "--window", "4")  # fmt: skip
    at_stress = {i["system"]: i for i in plan["items"] if i["point"] == "r8" and i["rep"] == 1}
    assert set(NEW) <= set(at_stress) and all(at_stress[s]["tier"] == 1 for s in NEW)
    heavy = {i["system"] for i in plan["items"] if i["point"] == "r6-l60"}
    assert set(NEW) <= heavy
    static = at_stress["mps-static"]
    assert static["mode"] == "mps-static" and static["static_share"] == 64  # 132-SM H200
    assert at_stress["vllm-omni-current"]["window"] == 4 and "window" not in static
    assert at_stress["shed"]["mode"] == "mps" and "static_share" not in at_stress["shed"]
    # Without the flag, the plan is the paper's.
    paper = _plan(tmp_path, "--rates", "8", "--stress-rate", "8", "--long-ratios", "0.6")
    assert not {i["system"] for i in paper["items"]} & set(NEW)


def test_bracket_straddles_the_crossing_on_the_grid() -> None:
    campaign = load_eval_script("campaign")
    assert campaign.bracket(9.012, 0.5) == (8.0, 10.0)
    assert campaign.bracket(4.044, 0.5) == (3.5, 4.5)
    assert campaign.bracket(0.55, 0.25) == (0.25, 0.75)
    assert campaign.bracket(0.1, 0.5) == (0.5, 1.0)  # tiny: the grid's first two rates
    for cap in (0.3, 1.11, 2.511, 5.417, 10.152):
        low, high = campaign.bracket(cap, 0.25)
        assert low <= 0.9 * cap or low == 0.25
        assert high >= 1.1 * cap and high > low


def _sim_plan(path: Path, caps: dict[str, float]) -> Path:
    rows = [
        {"system": s, "target": 0.9, "rate_ok": c, "rate_fail": c * 1.01} for s, c in caps.items()
    ]
    path.write_text(json.dumps({"pipelines": {"qwen2_5_omni": {"target": 0.9, "systems": rows}}}))
    return path


def test_capacity_campaign_brackets_each_system_then_the_long_and_past_points(
    tmp_path: Path,
) -> None:
    caps = {"horizon": 9.0, "mps": 4.0, "shed": 4.0, "mps-static": 4.8, "vllm-omni-current": 4.0}
    first = _sim_plan(tmp_path / "a.json", {**caps, "mps-static": 3.0})
    # A rerun of one system wins; one pipeline's entry alone, gzipped as committed.
    second = tmp_path / "b.json.gz"
    rows = [{"system": "mps-static", "rate_ok": 4.8, "rate_fail": 4.9}]
    entry = {"pipeline": "qwen2_5_omni", "target": 0.9, "systems": rows}
    second.write_bytes(gzip.compress(json.dumps(entry).encode()))
    plan = _plan(tmp_path, "--capacity", str(first), "--capacity", str(second), "--systems",
                 ",".join(caps), "--long-rate", "6", "--stress-long", "0.6")  # fmt: skip
    assert plan["capacity"]["simulated_capacity"]["mps-static"] == 4.8
    assert plan["capacity"]["past_rate"] == 11.0  # 1.2 x 9.0, up to the grid
    by = {(i["point"], i["system"]): i["tier"] for i in plan["items"]}
    # The lead systems (HorizonServe, the best new baseline by simulation) go first.
    assert by["r8", "horizon"] == by["r10", "horizon"] == 1
    assert by["r4", "mps-static"] == by["r5.5", "mps-static"] == 1
    assert by["r6-l60", "horizon"] == by["r11", "mps-static"] == 2
    assert by["r3.5", "shed"] == by["r4.5", "vllm-omni-current"] == 3
    assert by["r6-l60", "shed"] == 4 and by["r3.5", "mps"] == 5 and by["r11", "mps"] == 6
    assert len(by) == len(plan["items"]) == 5 * 2 + 5 * 2  # brackets, then two points each
    assert plan["points"]["r6-l60"]["long_ratio"] == 0.6
    with pytest.raises(SystemExit, match="no simulated capacity"):
        _plan(tmp_path, "--capacity", str(first), "--systems", "horizon,edf")


def test_refused_requests_are_misses_in_the_items_attainment() -> None:
    campaign = load_eval_script("campaign")
    plan = {
        "slo": {"text-text": 0.1},
        "serving_config": {"slo": {"classes": [{"name": "text-text", "path": "short",
                                                "priority": 0, "metric": "ttft"}]}},
    }  # fmt: skip
    r = {"class": "text-text", "at_s": 3.0}
    refused = campaign.refused_record(plan, r, "shed-1-req-9", "queue limits", "queue_full")
    assert refused["slo_met"] is False and refused["first_response_s"] is None
    assert (refused["path"], refused["slo_s"], refused["refused"]) == ("short", 0.1, "queue_full")
    met = {**refused, "first_response_s": 0.05, "slo_met": True, "refused": None}
    cols = ["t", "shared_sms", "decode_batch", "prefill_batch", "decode_s", "downstream_active"]
    s = campaign.item_summary([met, met, refused], [], cols, span_s=10.0)
    assert s["attainment"] == pytest.approx(2 / 3) and s["refused"] == 1
    assert s["attainment_answered"] == 1.0 and s["short_never"] == 1


def test_a_shed_item_on_the_cpu_engine_counts_its_refusals_as_misses(tmp_path: Path) -> None:
    """The real reference engine (tiny preset, CPU) under `shed` at an arrival rate far past
    what it serves: vLLM's queue limits refuse requests, and the item's attainment is over
    every request of the point, the refused ones missed."""
    pytest.importorskip("torch")
    campaign = load_eval_script("campaign")
    plan_path = tmp_path / "plan.json"
    argv = ["plan", "--out", str(plan_path), "--pipeline", "qwen2_5_omni", "--preset", "tiny",
            "--artifact", str(ARTIFACT), "--duration", "0.5", "--rates", "300", "--stress-rate",
            "300", "--long-rate", "300", "--long-ratios", "0", "--new-baselines"]  # fmt: skip
    assert campaign.main(argv) == 0
    out = tmp_path / "run"
    argv = ["run", "--plan", str(plan_path), "--out", str(out), "--budget-s", "300", "--only",
            "r300/shed/rep1", "--device", "cpu", "--no-warmup"]  # fmt: skip
    assert campaign.main(argv) == 0
    item = json.loads((out / "summary.json").read_text())["items"]["r300/shed/rep1"]
    n = len(json.loads(plan_path.read_text())["points"]["r300"]["requests"])
    assert item["status"] == "ok" and item["requests"] == n
    assert item["refused"] > 0 and item["refused"] == len(item["rejected"])
    assert {r["reason"] for r in item["rejected"]} <= {"queue_full", "max_queued_tokens"}
    assert item["answered"] <= n - item["refused"]
    assert item["attainment"] <= (n - item["refused"]) / n
