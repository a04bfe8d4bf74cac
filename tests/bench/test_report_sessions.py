"""bench/eval/report.py counts a HorizonServe item only beside others of the same controller."""

from __future__ import annotations

import gzip
import hashlib
import json
from pathlib import Path
from typing import Any

import pytest

from tests.bench.scripts import load_eval_script

ITEMS = ["r1/horizon/rep1", "r1/horizon/rep2", "r1/edf-mps/rep1"]


def _plan(path: Path, control: dict[str, Any]) -> str:
    plan = {
        "serving_config": {"control": control},
        "items": [{"id": i, "policy": i.split("/")[1].split("-")[0]} for i in ITEMS],
    }
    text = (json.dumps(plan, separators=(",", ":")) + "\n").encode()
    path.write_bytes(gzip.compress(text))
    return hashlib.sha256(text).hexdigest()


def _session(run: Path, name: str, summary: dict[str, Any], items: list[str]) -> None:
    d = run / name
    d.mkdir()
    summary["items"] = {i: {"status": "ok"} for i in items}
    (d / "summary.json").write_text(json.dumps(summary))
    members = b"".join(
        gzip.compress(json.dumps({"item": i, "records": [{"id": i}]}).encode() + b"\n")
        for i in items
    )
    (d / "records.jsonl.gz").write_bytes(members)


def test_other_controllers_items_are_left_out_and_baselines_carry_over(tmp_path: Path) -> None:
    ours = _plan(tmp_path / "plan.json.gz", {"deadline_order": True})
    older = _plan(tmp_path / "plan-older.json.gz", {"deadline_order": False})
    _session(tmp_path, "s00", {"plan_sha256": ours}, ["r1/horizon/rep1"])
    # Another plan's controller: its HorizonServe item is left out, its baseline counts.
    _session(tmp_path, "s01", {"plan_sha256": older}, ["r1/horizon/rep2", "r1/edf-mps/rep1"])
    data = load_eval_script("report").load_run(tmp_path)
    assert sorted(data["items"]) == ["r1/edf-mps/rep1", "r1/horizon/rep1"]
    assert data["foreign"] == ["r1/horizon/rep2 (s01)"]


def test_the_controller_a_session_records_decides_and_unknown_ones_count(tmp_path: Path) -> None:
    def run(name: str, second: dict[str, Any]) -> dict[str, Any]:
        d = tmp_path / name
        d.mkdir()
        ours = _plan(d / "plan.json.gz", {"place_admission": True})
        # A knob newer than the plan ran at today's default; the plan's first session says so.
        first = {"plan_sha256": ours, "control_defaults": {"deadline_order": True}}
        _session(d, "s00", first, ["r1/horizon/rep1"])
        _session(d, "s01", {"plan_sha256": "f" * 64, **second}, ["r1/horizon/rep2"])
        return load_eval_script("report").load_run(d)

    same = run("same", {"control": {"place_admission": True, "deadline_order": True}})
    assert sorted(same["items"]) == ["r1/horizon/rep1", "r1/horizon/rep2"]
    assert same["control_newer"] == {"deadline_order": True} and same["foreign"] == []
    other = run("other", {"control": {"place_admission": True, "deadline_order": False}})
    assert sorted(other["items"]) == ["r1/horizon/rep1"]
    assert other["foreign"] == ["r1/horizon/rep2 (s01)"]
    # An older session of a plan not linked here, recording no controller, still counts.
    unknown = run("unknown", {})
    assert sorted(unknown["items"]) == ["r1/horizon/rep1", "r1/horizon/rep2"]


def test_a_compacted_session_reads_back_the_same(tmp_path: Path) -> None:
    """`campaign.py compact` rewrites a finished session's gzip members as one xz stream of the
    same bytes; every reader takes either; a truncated member is refused, not dropped."""
    from horizonserve.runtime.calibrate.records import read_members

    compact_members = load_eval_script("compaction").compact_members

    _plan(tmp_path / "plan.json.gz", {})
    _session(tmp_path, "s00", {"plan_sha256": "0" * 64}, ITEMS)
    path = tmp_path / "s00" / "records.jsonl.gz"
    before = read_members(path)
    assert load_eval_script("campaign").main(["compact", str(tmp_path)]) == 0
    assert not path.exists() and path.with_suffix(".xz").exists()
    assert read_members(path) == before
    assert sorted(load_eval_script("report").load_run(tmp_path)["items"]) == sorted(ITEMS)
    cut = tmp_path / "cut.jsonl.gz"
    cut.write_bytes(gzip.compress(b'{"item": 1}\n') + gzip.compress(b'{"item": 2}\n')[:-6])
    assert read_members(cut) == [{"item": 1}]  # a run cut while writing: the rest reads
    with pytest.raises(ValueError, match="truncated"):
        compact_members(cut)
    assert cut.exists()


def test_step_traces_are_kept_at_the_clocks_nanosecond(tmp_path: Path) -> None:
    """`compact --steps-at-ns` rounds a compacted trace's floats to 1 ns (the clock's
    resolution) and leaves every other field and every non-float cell as it was; a second
    pass changes nothing."""
    from horizonserve.runtime.calibrate.records import read_members

    _plan(tmp_path / "plan.json.gz", {})
    _session(tmp_path, "s00", {"plan_sha256": "0" * 64}, ITEMS)
    noisy = [[0.457833, 132, 0.006608877000005009, None, "short", 4.021600000214676e-05]]
    steps = tmp_path / "s00" / "steps.jsonl.gz"
    member = {"item": ITEMS[0], "columns": list("abcdef"), "rows": noisy}
    steps.write_bytes(gzip.compress(json.dumps(member).encode() + b"\n"))
    campaign = load_eval_script("campaign")
    assert campaign.main(["compact", "--steps-at-ns", str(tmp_path)]) == 0
    (member,) = read_members(steps)
    assert member["item"] == ITEMS[0] and member["columns"] == list("abcdef")
    assert member["rows"] == [[0.457833, 132, 0.006608877, None, "short", 4.0216e-05]]
    xz = steps.with_suffix(".xz")
    before = xz.read_bytes()
    assert campaign.main(["compact", "--steps-at-ns", str(tmp_path)]) == 0
    assert xz.read_bytes() == before


def _meta(item: str) -> dict[str, Any]:
    point, system, rep = item.split("/")
    return {"status": "ok", "point": point, "system": system, "rep": int(rep.removeprefix("rep"))}


def test_a_repeat_session_counts_its_items_as_the_next_repetitions(tmp_path: Path) -> None:
    """A session linked as sNN-repeat ran items an earlier session counts: each becomes the
    next repetition of its point and system; a plain later session's same item is not counted,
    and a repeat of another controller is still left out."""
    ours = _plan(tmp_path / "plan.json.gz", {"deadline_order": True})
    knobs = {"plan_sha256": ours}
    _session(tmp_path, "s00", dict(knobs), ["r1/horizon/rep1", "r1/horizon/rep2"])
    _session(tmp_path, "s01", dict(knobs), ["r1/horizon/rep1"])
    _session(tmp_path, "s02-repeat", dict(knobs), ["r1/horizon/rep1", "r1/edf-mps/rep1"])
    other = {"plan_sha256": "f" * 64, "control": {"deadline_order": False}}
    _session(tmp_path, "s03-repeat", other, ["r1/horizon/rep1"])
    for name in ("s00", "s01", "s02-repeat", "s03-repeat"):
        path = tmp_path / name / "summary.json"
        summary = json.loads(path.read_text())
        summary["items"] = {i: _meta(i) for i in summary["items"]}
        path.write_text(json.dumps(summary))
    data = load_eval_script("report").load_run(tmp_path)
    items = data["items"]
    assert sorted(items) == [
        "r1/edf-mps/rep1",
        "r1/horizon/rep1",
        "r1/horizon/rep2",
        "r1/horizon/rep3",
    ]
    assert items["r1/horizon/rep3"]["session"] == "s02-repeat"
    assert items["r1/horizon/rep3"]["meta"]["rep"] == 3
    # The repeat's records are its own run's, filed under the new repetition.
    assert items["r1/horizon/rep3"]["records"] == [{"id": "r1/horizon/rep1"}]
    assert items["r1/horizon/rep1"]["session"] == "s00"  # s01's plain re-run is not counted
    assert items["r1/edf-mps/rep1"]["meta"]["rep"] == 1  # first run of its own: as it ran
    assert data["foreign"] == ["r1/horizon/rep1 (s03-repeat)"]


def test_a_knob_one_record_does_not_name_compares_at_its_value_before_the_knob(
    tmp_path: Path,
) -> None:
    """Two records of one controller, one written before a knob existed (it names none) and
    one after (it names the knob at the value that changes nothing), are the same controller;
    the knob at its other value is another."""

    def second(d: Path, control: dict[str, Any]) -> dict[str, Any]:
        d.mkdir()
        ours = _plan(d / "plan.json.gz", {"deadline_order": True})
        _session(d, "s00", {"plan_sha256": ours}, ["r1/horizon/rep1"])
        _session(d, "s01", {"plan_sha256": "f" * 64, "control": control}, ["r1/horizon/rep2"])
        return load_eval_script("report").load_run(d)

    same = second(tmp_path / "same", {"deadline_order": True, "place_wait_slack": False})
    assert sorted(same["items"]) == ["r1/horizon/rep1", "r1/horizon/rep2"]
    other = second(tmp_path / "other", {"deadline_order": True, "shared_hold_s": 1.0})
    assert other["foreign"] == ["r1/horizon/rep2 (s01)"]


def test_the_fit_reader_reads_a_campaign_as_fitted_without_its_repeats() -> None:
    """qwen-ship-v2's s05-repeat ran its HorizonServe points again (and r6 for the first time
    in that plan): the report counts them, the fit's reader does not, so the shipped fit's
    provenance still replays the runs it saw."""
    from horizonserve.runtime.calibrate.records import read_campaign

    run = Path(__file__).resolve().parents[2] / "bench/results/h200-eval/qwen-ship-v2"
    fitted = read_campaign(run)
    assert fitted.items["r10/horizon"].sessions == ("s00",)
    assert "r6/horizon" not in fitted.items
    reported = load_eval_script("report").load_run(run)["items"]
    assert reported["r10/horizon/rep2"]["session"] == "s05-repeat"
    assert reported["r6/horizon/rep1"]["session"] == "s05-repeat"
