"""bench/eval/campaign.py plan --control: an experiment on a calibrated decision, recorded in
the plan, on the same requests and SLO table as the plan without it."""

from __future__ import annotations

import hashlib
import itertools
import json
from pathlib import Path

import pytest

from horizonserve.runtime.config import ControlParams, ViewOrder
from tests.bench.scripts import load_eval_script

ROOT = Path(__file__).resolve().parents[2]
ARTIFACT = ROOT / "bench/results/calibration/h200-1/h200-measured-shipped.json"


def _plan(tmp_path: Path, name: str, *extra: str) -> dict:
    out = tmp_path / name
    argv = ["plan", "--out", str(out), "--pipeline", "qwen2_5_omni", "--artifact", str(ARTIFACT),
            "--duration", "10", "--rates", "8", "--stress-rate", "8", "--long-ratios", "0",
            *extra]  # fmt: skip
    assert load_eval_script("campaign").main(argv) == 0
    return json.loads(out.read_text())


def test_an_override_changes_that_decision_only(tmp_path: Path) -> None:
    base = _plan(tmp_path, "a.json")
    exp = _plan(tmp_path, "b.json", "--control", "reservation_pays=false")
    # The calibration decides for the reservation on this pipeline; the plan overrides it.
    assert base["serving_config"]["verdicts"]["reservation_pays"] is True
    assert exp["serving_config"]["verdicts"]["reservation_pays"] is False
    assert exp["control_overrides"] == {"reservation_pays": "false"}
    assert base["control_overrides"] == {}
    del base["serving_config"]["verdicts"]["reservation_pays"]
    del exp["serving_config"]["verdicts"]["reservation_pays"]
    for key in ("serving_config", "slo", "points"):
        assert exp[key] == base[key], key


@pytest.mark.parametrize(
    ("pair", "says"),
    [
        ("nope=1", "unknown knob(s) ['nope']"),
        ("sm_split=maybe", "sm_split: Input should be 'uncapped', 'ladder' or 'slack'"),
        ("late_yield=false", "late_yield: no longer a control parameter; use late"),
        ("reservation_pays", "give KEY=VALUE"),
    ],
)
def test_a_bad_override_names_the_knob(tmp_path: Path, pair: str, says: str) -> None:
    with pytest.raises(SystemExit, match="--control") as exc:
        _plan(tmp_path, "c.json", "--control", pair)
    assert says in str(exc.value)
    assert not (tmp_path / "c.json").exists()


def test_a_knob_newer_than_the_plan_is_named_with_the_value_it_runs(tmp_path: Path) -> None:
    """A plan records every knob of its day; one added since runs at its default, and the
    session's summary says so (`control_defaults`) instead of replaying it silently."""
    campaign = load_eval_script("campaign")
    plan = _plan(tmp_path, "a.json")
    assert campaign.unrecorded_control(plan) == {}
    del plan["serving_config"]["control"]["view_order"]
    assert campaign.unrecorded_control(plan) == {"view_order": "deadline"}
    # The summary records the whole controller, the newer knob at the value it ran.
    ran = campaign.run_control(plan)
    assert ran["view_order"] == "deadline" and set(ran) == set(ControlParams().model_dump())


def test_a_plan_written_gzipped_reads_back_the_same(tmp_path: Path) -> None:
    from horizonserve.runtime.calibrate.records import load_plan

    plain = _plan(tmp_path, "a.json")
    argv = ["plan", "--out", str(tmp_path / "b.json.gz"), "--pipeline", "qwen2_5_omni",
            "--artifact", str(ARTIFACT), "--duration", "10", "--rates", "8", "--stress-rate",
            "8", "--long-ratios", "0"]  # fmt: skip
    assert load_eval_script("campaign").main(argv) == 0
    packed = load_plan(tmp_path / "b.json")  # X.json absent: X.json.gz is read
    assert {k: v for k, v in packed.items() if k != "command"} == {
        k: v for k, v in plain.items() if k != "command"
    }


def test_a_simulation_replays_the_knobs_a_session_ran(tmp_path: Path) -> None:
    """`simulate --as-run SESSION`: a knob newer than the plan is replayed at the value the
    session ran (its summary), not at its value from before the knob; a session of another
    plan is refused by name."""
    campaign = load_eval_script("campaign")
    plan = _plan(tmp_path, "a.json")
    del plan["serving_config"]["control"]["view_order"]
    path = tmp_path / "old.json"
    path.write_text(json.dumps(plan))
    session = tmp_path / "s00"
    session.mkdir()
    sha = hashlib.sha256(path.read_bytes()).hexdigest()
    summary = {"plan_sha256": sha, "control_defaults": campaign.unrecorded_control(plan)}
    (session / "summary.json").write_text(json.dumps(summary))
    assert campaign._as_run(plan, sha, str(path), session)[0].view_order is ViewOrder.DEADLINE
    summary["plan_sha256"] = "0" * 64
    (session / "summary.json").write_text(json.dumps(summary))
    with pytest.raises(SystemExit, match=r"--as-run: .* ran another plan"):
        campaign._as_run(plan, sha, str(path), session)


def test_a_bursty_plan_records_its_arrivals_and_replays_them(tmp_path: Path) -> None:
    """`plan --burstiness b`: the points carry b, a Poisson plan's bytes stay as they were, and
    the simulator's replay of the campaign regenerates the same requests from the point."""
    from horizonserve.runtime.artifact import load_artifact
    from horizonserve.runtime.calibrate.fit import replay_of
    from horizonserve.runtime.calibrate.records import plan_campaign

    poisson = _plan(tmp_path, "a.json")
    bursty = _plan(tmp_path, "b.json", "--burstiness", "0.25")
    assert all("burstiness" not in p for p in poisson["points"].values())
    (pid, point), *_ = bursty["points"].items()
    assert point["burstiness"] == 0.25

    def gaps(requests: list[dict]) -> list[float]:
        at = [r["at_s"] for r in requests]
        return [b - a for a, b in itertools.pairwise(at)]

    # Lulls between bursts: a longer longest gap than the Poisson draw of the same seed.
    assert max(gaps(point["requests"])) > max(gaps(poisson["points"][pid]["requests"]))
    campaign = plan_campaign(bursty, str(tmp_path))
    assert campaign.points[pid].burstiness == 0.25
    trace = replay_of(campaign, load_artifact(ARTIFACT)).trace(pid)
    assert [round(float(t), 6) for t in trace.arrival] == [r["at_s"] for r in point["requests"]]
