"""`sim plan --slo artifact`: the SLO table of the H200 evaluations (5 × the artifact's solo
p95, as `bench/eval/campaign.py` plans use), so a planned capacity compares with a measured one."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from horizonserve.runtime.artifact import DEFAULT_ARTIFACT, load_artifact
from horizonserve.runtime.calibrate.records import load_plan
from tests.cli.test_cli_errors import assert_refused, run_cli

PACKAGED = Path(__file__).resolve().parents[2] / "runtime/data/calibration" / DEFAULT_ARTIFACT


def test_plan_takes_the_artifacts_solo_p95(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "plan.json"
    argv = ["sim", "plan", "--pipeline", "bagel", "--slo", "artifact", "--systems", "priority",
            "--requests", "150", "--no-progress", "--jobs", "1", "--json", str(out)]  # fmt: skip
    code, stdout, err = run_cli(argv, capsys)
    assert code == 0, err
    solo = load_artifact(None).pipeline("bagel").solo_p95_s
    got = json.loads(out.read_text())
    assert got["slo_targets_s"] == pytest.approx({k: 5.0 * v for k, v in solo.items()})
    assert "solo p95 of the artifact" in got["slo_source"]
    assert "SIMULATED capacity plan" in stdout


def test_an_artifact_without_solo_p95_is_refused_naming_the_option(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data = json.loads(PACKAGED.read_text())
    data["pipelines"]["bagel"]["solo_p95_s"] = {}
    bad = tmp_path / "no-solo.json"
    bad.write_text(json.dumps(data))
    argv = ["sim", "plan", "--pipeline", "bagel", "--slo", "artifact", "--artifact", str(bad),
            "--no-progress"]  # fmt: skip
    line = assert_refused(argv, "--slo artifact", capsys)
    assert "--slo measured" in line


PLAN = Path(__file__).resolve().parents[2] / "bench/results/h200-eval/eval-v5/bagel-plan.json"


def test_slo_plan_judges_by_the_campaigns_table(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`--slo-plan`: the SLO table a GPU campaign ran (not the artifact's newer calibration)."""
    out = tmp_path / "plan.json"
    argv = ["sim", "plan", "--pipeline", "bagel", "--slo-plan", str(PLAN), "--systems",
            "priority", "--requests", "150", "--no-progress", "--jobs", "1",
            "--json", str(out)]  # fmt: skip
    code, stdout, err = run_cli(argv, capsys)
    assert code == 0, err
    recorded = load_plan(PLAN)["slo"]  # committed as bagel-plan.json.gz
    got = json.loads(out.read_text())
    assert got["slo_targets_s"] == pytest.approx(recorded)
    art = {k: 5.0 * v for k, v in load_artifact(None).pipeline("bagel").solo_p95_s.items()}
    assert got["slo_targets_s"]["text-chat"] != pytest.approx(art["text-chat"])
    assert f"SLO table: the SLO table of {PLAN}" in stdout


@pytest.mark.parametrize(
    ("edit", "says"),
    [
        (lambda p: p.update(pipeline="qwen2_5_omni"), "a qwen2_5_omni plan, not bagel"),
        (lambda p: p["slo"].pop("image-editing"), "no SLO for ['image-editing']"),
        (lambda p: p.pop("serving_config"), "not a campaign plan"),
    ],
)
def test_slo_plan_refuses_a_plan_that_does_not_fit(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], edit, says: str
) -> None:
    plan = load_plan(PLAN)
    edit(plan)
    bad = tmp_path / "plan.json"
    bad.write_text(json.dumps(plan))
    argv = ["sim", "plan", "--pipeline", "bagel", "--slo-plan", str(bad), "--no-progress"]
    line = assert_refused(argv, "--slo-plan", capsys)
    assert says in line, line


def test_point_s_scores_every_rate_on_a_point_of_that_length(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`--point-s`: each rate gets its own point of a campaign's length, all of it scored."""
    out = tmp_path / "plan.json"
    argv = ["sim", "plan", "--pipeline", "bagel", "--slo-plan", str(PLAN), "--systems",
            "priority", "--point-s", "40", "--seeds", "2", "--tol", "0.1", "--no-progress",
            "--jobs", "1", "--json", str(out)]  # fmt: skip
    code, stdout, err = run_cli(argv, capsys)
    assert code == 0, err
    got = json.loads(out.read_text())
    assert (got["point_s"], got["warmup_s"], got["requests"]) == (40, 0.0, None)
    (res,) = got["systems"]
    assert (res["warmup_s"], res["window_s"]) == (0.0, 40.0)
    assert got["seeds"] == 2
    assert "40-s points (all scored), mean of seeds 0–1" in stdout


def test_a_warm_up_as_long_as_the_point_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["sim", "plan", "--pipeline", "bagel", "--point-s", "30", "--warmup-s", "30",
            "--no-progress"]  # fmt: skip
    line = assert_refused(argv, "--warmup-s", capsys)
    assert "--point-s" in line, line


def test_a_warm_up_without_points_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["sim", "plan", "--pipeline", "bagel", "--warmup-s", "10", "--no-progress"]
    assert "give --point-s too" in assert_refused(argv, "--warmup-s", capsys)


def test_requests_and_point_s_together_are_refused(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["sim", "plan", "--pipeline", "bagel", "--point-s", "60", "--requests", "300",
            "--no-progress"]  # fmt: skip
    assert "give one" in assert_refused(argv, "--requests and --point-s", capsys)
