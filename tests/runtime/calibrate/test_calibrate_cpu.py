"""`horizonserve calibrate --preset tiny` on the CPU: a valid artifact in seconds."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("torch")

from horizonserve.runtime.artifact import load_artifact, load_packaged
from horizonserve.runtime.calibrate.cli import artifact_name, parse_pipelines
from horizonserve.runtime.cli import main
from horizonserve.runtime.engine.deploy import load_deploy


@pytest.fixture(scope="module")
def out_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("cal")
    argv = ["calibrate", "--pipeline", "qwen2_5_omni,bagel", "--preset", "tiny", "--device",
            "cpu", "--out-dir", str(out), "--no-progress", "--solo-requests", "2"]  # fmt: skip
    assert main(argv) == 0
    return out


def test_artifact_validates_and_is_keyed(out_dir: Path) -> None:
    files = sorted(out_dir.glob("*.json"))
    assert len(files) == 1 and files[0].name.startswith("qwen2_5_omni-bagel--cpu")
    art = load_artifact(files[0])
    assert set(art.pipelines) == {"qwen2_5_omni", "bagel"}
    assert art.source.startswith("measured on cpu") and "GPU-specific parts skipped" in art.source
    assert art.gpu.driver == "none" and art.created
    estimate = load_packaged("default-h200.json")
    for name, p in art.pipelines.items():
        assert p.model == estimate.pipeline(name).model  # the sidecar matches on the model
        levels = p.ladder.levels
        assert levels == sorted(levels) and p.ladder.s_cap <= p.ladder.aggressive
        assert p.ladder.total == art.gpu.sm_count
        assert set(p.solo_p95_s) == set(estimate.pipeline(name).solo_p95_s)
        assert all(v > 0 for v in p.solo_p95_s.values())
        assert p.solo_p95_source and p.solo_p95_source.startswith("measured")
        assert p.notes["ladder"].startswith("carried over")  # no SM sweep on a CPU
        assert p.notes["shared.decode_step_s"].startswith("measured")
        # Engine limits: the deploy description the engine ran, not carried numbers.
        assert p.notes["shared.max_num_seqs"].startswith("engine: deploy profile 'tuned'")
        assert p.deploy_profile == "tuned"
        thinker = load_deploy(name, "tuned").stage("thinker")
        assert p.shared.max_num_seqs == thinker.max_num_seqs
        # At least 2 samples per class here (--solo-requests 2), each with its CI and wall time.
        assert set(p.solo_samples) == set(p.solo_p95_s) == set(p.solo_wall_s)
        assert all(lo is None or lo <= p.solo_p95_s[c] for c, (lo, _hi) in p.solo_p95_ci_s.items())


def test_raw_log_and_summary_are_written(out_dir: Path) -> None:
    raw = json.loads(next(out_dir.glob("*.raw.log")).read_text())
    assert raw["device"] == "cpu" and raw["iso"]["decode_b8"]["levels"]
    assert set(raw["solo"]) == {"qwen2_5_omni", "bagel"}
    assert set(raw["downstream_alone"]) == {"speech", "code2wav", "image"}
    assert set(raw["corun"]) == {"speech", "code2wav", "image"}
    talker, vocoder = raw["downstream_alone"]["speech"], raw["downstream_alone"]["code2wav"]
    assert all(r[4] == 0.0 for r in talker["rows"])  # the talker's process vocodes nothing
    assert all(r[3] == 0.0 and r[4] > 0 and r[5] > 0 for r in vocoder["rows"])
    summary = next(out_dir.glob("*.summary.txt")).read_text()
    assert "SLO ms" in summary and "ladder" in summary


def test_names_and_pipeline_parsing() -> None:
    assert artifact_name(("qwen2_5_omni",), "NVIDIA H200", "580.159.04") == (
        "qwen2_5_omni--nvidia-h200--580.159.04"
    )
    assert parse_pipelines("all") == ("qwen2_5_omni", "mimo_audio", "bagel")
    with pytest.raises(ValueError):
        parse_pipelines("nope")


def test_shipped_h200_artifact_is_measured() -> None:
    art = load_packaged("h200-measured.json")
    assert art.source.startswith("measured on NVIDIA H200")
    assert "horizonserve calibrate" in art.source
    assert art.gpu.name == "NVIDIA H200" and art.gpu.driver != "unknown"
    for p in art.pipelines.values():
        assert p.ladder.levels == sorted(p.ladder.levels)
        assert p.ladder.s_cap <= p.ladder.aggressive <= p.ladder.total == 132
        assert p.notes["ladder"].startswith("measured")


def test_auto_mode_does_not_recalibrate_a_calibrated_node(
    out_dir: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from horizonserve.runtime.artifact_store import GpuInfo
    from horizonserve.runtime.calibrate import cli

    art = load_artifact(next(out_dir.glob("*.json")))
    monkeypatch.setattr(cli, "detect_gpu", lambda: GpuInfo(art.gpu.name, art.gpu.driver))
    before = sorted(out_dir.iterdir())
    argv = ["calibrate", "--pipeline", "qwen2_5_omni", "--mode", "auto", "--out-dir", str(out_dir)]
    assert main(argv) == 0
    assert "artifact present" in capsys.readouterr().out
    assert sorted(out_dir.iterdir()) == before


def test_node_defaults_come_from_the_operator_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from horizonserve.runtime import config as cfg

    monkeypatch.setenv(cfg.CALIBRATION_MODE_ENV, "skip")
    monkeypatch.setenv(cfg.ARTIFACT_DIR_ENV, str(tmp_path))
    assert main(["calibrate"]) == 0
    assert "calibration skipped" in capsys.readouterr().out
    assert list(tmp_path.iterdir()) == []
