"""bench/eval/capacity.py: the sustainable rate read from measured sweeps, and the committed
capacity tables kept equal to what the committed reports give."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.bench.scripts import load_eval_script

cap = load_eval_script("capacity")
tables = load_eval_script("capacity_tables")
SPEC = Path(__file__).resolve().parents[2] / "bench/results/h200-eval/capacity/spec.json"


def _pts(*pairs: tuple[float, float]) -> list:
    return [cap.Point(r, a, a, a, (a,), 0, 0, ()) for r, a in pairs]


def test_capacity_interpolates_at_the_first_crossing() -> None:
    # 8 -> 93.8 %, 10 -> 89.4 %: 8 + 2 x 3.8 / 4.4
    c = cap.capacity(_pts((10, 0.894), (8, 0.938), (18, 0.44)), 0.9)
    assert c.bound == "=" and c.bracket == (8, 10)
    assert c.rate == pytest.approx(8 + 2 * 0.038 / 0.044)


def test_capacity_takes_the_first_fall_of_a_non_monotone_sweep() -> None:
    # attainment recovers at 6 req/s on one finite trace: the first fall (4 -> 5) counts
    c = cap.capacity(_pts((4, 0.95), (5, 0.85), (6, 0.91)), 0.9)
    assert c.bracket == (4, 5) and c.rate == pytest.approx(4.5)


def test_unbracketed_sweeps_give_bounds() -> None:
    assert cap.capacity(_pts((6, 0.726)), 0.9) == cap.Capacity(6, "<", None)
    assert cap.capacity(_pts((2, 0.97), (3, 0.95)), 0.9) == cap.Capacity(3, ">=", None)
    assert cap.capacity(_pts((2, 0.9)), 0.9).bound == ">="  # the target itself is met


def test_best_baseline_lists_those_a_bound_cannot_place_below_it() -> None:
    caps = {
        "horizon": cap.Capacity(9.7, "=", (8, 10)),
        "edf-mps": cap.Capacity(4.97, "=", (4, 6)),
        "priority": cap.Capacity(6.0, "<", None),  # anywhere below 6: not excluded
        "fcfs": cap.Capacity(4.0, "<", None),  # below 4 < 4.97: shown below the best
    }
    assert cap.best_baseline(caps) == ("edf-mps", ["priority"])
    # a sweep still above the target at 5.5 req/s beats the exact 4.97: it is the best
    caps["mps"] = cap.Capacity(5.5, ">=", None)
    assert cap.best_baseline(caps) == ("mps", ["priority"])
    # an exact value wins a tie with a lower bound
    caps["mps"] = cap.Capacity(4.97, ">=", None)
    assert cap.best_baseline(caps)[0] == "edf-mps"
    assert cap.best_baseline({"horizon": caps["horizon"], "fcfs": caps["fcfs"]}) == (None, ["fcfs"])


def test_committed_capacity_tables_match_the_committed_reports() -> None:
    committed = json.loads((SPEC.parent / "capacity.json").read_text())
    assert json.loads(json.dumps(cap.summarise(SPEC))) == committed, (
        "run: python bench/eval/capacity.py bench/results/h200-eval/capacity/spec.json"
    )
    assert (SPEC.parent / "capacity.md").read_text() == tables.capacity_md(committed)


def test_a_spec_naming_an_item_of_another_rate_is_refused(tmp_path: Path) -> None:
    (tmp_path / "rep").mkdir()
    item = {"attainment": 0.9, "short_attainment": 1.0, "long_attainment": 0.8,
            "short_late": 0, "long_late": 0, "short_never": 0, "long_never": 0}  # fmt: skip
    (tmp_path / "rep" / "results.json").write_text(json.dumps({"items": {"r8/horizon/rep1": item}}))
    spec = tmp_path / "capacity" / "spec.json"
    spec.parent.mkdir()
    body = {"target": 0.9, "past_capacity_below": 0.3, "pipelines": {"p": {
        "label": "P", "systems": {"horizon": {"10": ["rep/r8/horizon/rep1"]}}}}}  # fmt: skip
    spec.write_text(json.dumps(body))
    with pytest.raises(SystemExit, match="another point's or system's item"):
        cap.load_points(cap.Reports(spec))
    body["pipelines"]["p"]["systems"]["horizon"] = {"8": ["rep/r8/horizon/rep2"]}
    spec.write_text(json.dumps(body))
    with pytest.raises(SystemExit, match=r"is not in rep/results\.json"):
        cap.load_points(cap.Reports(spec))


def test_long_path_points_take_the_default_mix_point_for_its_share(tmp_path: Path) -> None:
    item = {"attainment": 0.8, "short_attainment": 1.0, "long_attainment": 0.5,
            "short_late": 1, "long_late": 2, "short_never": 0, "long_never": 3}  # fmt: skip
    items = {"r6/horizon/rep1": item, "r6-l60/horizon/rep1": {**item, "attainment": 0.6}}
    (tmp_path / "rep").mkdir()
    (tmp_path / "rep" / "results.json").write_text(json.dumps({"items": items}))
    spec = tmp_path / "capacity" / "spec.json"
    spec.parent.mkdir()
    shares = {"0.3": {"horizon": ["rep/r6/horizon/rep1"]},
              "0.6": {"horizon": ["rep/r6-l60/horizon/rep1"]}}  # fmt: skip
    body = {"pipelines": {"p": {"label": "P", "systems": {}, "long_path": {
        "rate": 6, "default_share": 0.3, "shares": shares}}}}  # fmt: skip
    spec.write_text(json.dumps(body))
    got = cap.load_long_path(cap.Reports(spec))["p"]["shares"]
    assert got["0.3"]["horizon"].attainment == 0.8 and got["0.6"]["horizon"].attainment == 0.6
    assert got["0.6"]["horizon"].late == 3 and got["0.6"]["horizon"].never == 3
    # the plain rate point is the default share's only: at 60 % it is refused
    shares["0.6"]["horizon"] = ["rep/r6/horizon/rep1"]
    spec.write_text(json.dumps(body))
    with pytest.raises(SystemExit, match="expected r6-l60 of horizon"):
        cap.load_long_path(cap.Reports(spec))


def test_rep_range_reads_the_capacity_from_the_lowest_and_highest_runs() -> None:
    p8 = cap.Point(8, 0.938, 1, 1, (0.938,), 0, 0, ())
    p10 = cap.Point(10, 0.8935, 1, 1, (0.889, 0.898), 0, 0, ())
    lo, hi = cap.rep_range([p8, p10], 0.9)
    assert lo == pytest.approx(8 + 2 * 0.038 / 0.049)
    assert hi == pytest.approx(8 + 2 * 0.038 / 0.040)  # 89.8 %: still below 90 %
    assert lo < cap.capacity([p8, p10], 0.9).rate < hi
    assert cap.rep_range([p8], 0.9) == (8, 8)  # nothing repeated, nothing bracketed: one end


def test_the_model_error_reads_the_simulator_on_the_items_own_requests(tmp_path: Path) -> None:
    """Only sim rows of today's shipped artifact count; the sweep's linear rule reads both."""

    def item(a: float) -> dict:
        return {"attainment": a, "short_attainment": a, "long_attainment": a,
                "short_late": 0, "long_late": 0, "short_never": 0, "long_never": 0}  # fmt: skip

    shipped = cap.Reports(SPEC).shipped_sha
    rows = {"r4/edf-mps": {"simulated": 0.98}, "r6/edf-mps": {"simulated": 0.82}}
    old = {"artifact": {"path": cap.SHIPPED_ARTIFACT, "sha256": "0" * 64},
           "rows": {k: {"simulated": 0.5} for k in rows}}  # fmt: skip
    now = {"artifact": {"path": cap.SHIPPED_ARTIFACT, "sha256": shipped}, "rows": rows}
    results = {"items": {"r4/edf-mps/rep1": item(0.99), "r6/edf-mps/rep1": item(0.805)},
               "sim": {"sim_old": old, "sim_fitted": now}}  # fmt: skip
    (tmp_path / "rep").mkdir()
    (tmp_path / "rep" / "results.json").write_text(json.dumps(results))
    spec = tmp_path / "capacity" / "spec.json"
    spec.parent.mkdir()
    body = {"pipelines": {"p": {"label": "P", "systems": {"edf-mps": {
        "4": ["rep/r4/edf-mps/rep1"], "6": ["rep/r6/edf-mps/rep1"]}}}}}  # fmt: skip
    spec.write_text(json.dumps(body))
    reports = cap.Reports(spec)
    systems = cap.load_points(reports)["p"]
    caps = {s: cap.capacity(p, 0.9) for s, p in systems.items()}
    got = cap._error_sources(reports, systems, caps, 0.9)["edf-mps"]
    assert got["points"] == [[4.0, 0.99, 0.98], [6.0, 0.805, 0.82]]
    same = 4 + 2 * 0.08 / 0.16  # 98 -> 82 % crosses 90 % at 5.0
    assert got["capacity"]["rate"] == pytest.approx(same)
    assert got["model"] == pytest.approx(same / caps["edf-mps"].rate - 1)
    # a report whose only rows are of another artifact gives no same-requests figure
    results["sim"] = {"sim_old": old}
    (tmp_path / "rep" / "results.json").write_text(json.dumps(results))
    reports = cap.Reports(spec)
    assert cap._error_sources(reports, systems, caps, 0.9)["edf-mps"] is None
