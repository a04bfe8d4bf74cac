"""`horizonserve calibrate rebuild`: the shipped measured artifact follows from its raw logs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from horizonserve.runtime.artifact import load_artifact
from horizonserve.runtime.calibrate.build import merge_artifacts
from horizonserve.runtime.cli import main

ROOT = Path(__file__).resolve().parents[3]
RAW = ROOT / "bench" / "results" / "calibration" / "h200-2"
SHIPPED = ROOT / "runtime" / "data" / "calibration" / "h200-measured.json"
# The three H200 calibrations behind the shipped artifact, each with its measurement time.
LOGS = (
    ("qwen2_5_omni", "2026-12-01T19:31:46Z"),
    ("mimo_audio", "2026-12-01T19:42:04Z"),
    ("bagel", "2026-12-01T19:48:52Z"),
)


def _args(out: Path) -> list[str]:
    argv = ["calibrate", "rebuild", "--out", str(out)]
    for name, when in LOGS:
        argv += ["--raw", str(RAW / name / f"{name}--nvidia-h200--580.159.04.raw.log.gz")]
        argv += ["--measured-at", when]
    return argv


@pytest.fixture(scope="module")
def rebuilt(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("rebuild") / "h200-measured.json"
    assert main(_args(out)) == 0
    return out


def test_the_shipped_measured_artifact_is_rebuilt_from_its_raw_logs(rebuilt: Path) -> None:
    assert json.loads(rebuilt.read_text()) == json.loads(SHIPPED.read_text())


def test_every_entry_carries_its_calibrated_reservation(rebuilt: Path) -> None:
    art = load_artifact(rebuilt)
    for name, _when in LOGS:
        entry = art.pipeline(name)
        assert entry.solo_samples and min(entry.solo_samples.values()) >= 30
        assert entry.ladder.reserve == entry.reserve_choice() <= entry.ladder.s_min
        assert entry.notes["ladder.reserve"].startswith("measured:")
    # BAGEL: the thinker on its reserve, the DiT on the rest, where MPS would starve it.
    bagel = art.pipeline("bagel")
    assert bagel.reservation_pays() and bagel.throttling_pays()


def test_a_time_per_log_or_none(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    argv = _args(tmp_path / "a.json")[:-2]  # one --measured-at short
    assert main(argv) == 2
    assert "--measured-at: give one per --raw (3)" in capsys.readouterr().err
    assert not (tmp_path / "a.json").exists()


def test_a_log_that_is_not_json_is_named(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / "x.raw.log"
    bad.write_text("not json")
    assert main(["calibrate", "rebuild", "--raw", str(bad), "--out", str(tmp_path / "o")]) == 2
    assert f"--raw {bad}: not a readable raw log" in capsys.readouterr().err


def test_merge_refuses_a_pipeline_twice() -> None:
    art = load_artifact(SHIPPED)
    with pytest.raises(ValueError, match="'bagel' is in more than one artifact"):
        merge_artifacts(
            [art, art.model_copy(update={"pipelines": {"bagel": art.pipeline("bagel")}})]
        )
    other = art.model_copy(update={"gpu": art.gpu.model_copy(update={"name": "NVIDIA L4"})})
    with pytest.raises(ValueError, match="cannot merge artifacts of NVIDIA H200 and NVIDIA L4"):
        merge_artifacts([art, other])
