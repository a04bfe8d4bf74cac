"""Calibration with enough samples: the p95's confidence interval, the artifact round trip,
resuming a cut run, and the one-line refusals of `horizonserve calibrate`."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import numpy as np
import pytest

from horizonserve.runtime.artifact import CalibrationArtifact, load_packaged
from horizonserve.runtime.calibrate.stats import (
    MIN_SOLO_SAMPLES,
    SOLO_SAMPLES,
    bootstrap_ci,
    nearest_rank,
    quantile_ci,
)
from horizonserve.runtime.cli import main


def test_p95_ci_is_the_binomial_order_statistic_interval() -> None:
    xs = list(range(1, 101))  # x_(r) = r
    est = quantile_ci(xs)
    assert est.value == nearest_rank(xs, 0.95) == 95
    # Bin(100, 0.95): P(B >= 91) = 0.9718 < 0.975 <= P(B >= 90) = 0.9885 → lo = x_(90);
    # P(B <= 98) = 0.9629 < 0.975 <= P(B <= 99) = 0.9941 → hi = x_(100).
    assert (est.lo, est.hi) == (90, 100)
    assert 0.95 <= est.coverage < 1
    assert quantile_ci(xs[::-1]) == est  # order of the samples does not matter


def test_p95_ci_upper_end_needs_72_samples() -> None:
    # P(all n below the p95) = 0.95^n must fall to 2.5 %: n >= 72, hence SOLO_SAMPLES = 80.
    assert quantile_ci(range(71)).hi is None
    assert quantile_ci(range(72)).hi is not None
    assert SOLO_SAMPLES >= 72 and MIN_SOLO_SAMPLES == 30
    six = quantile_ci([3.6, 5.9, 12.4, 4.0, 7.7, 9.1])  # 6 samples: only a lower end
    assert six.hi is None and six.lo is not None and six.lo <= six.value


def test_p95_ci_covers_the_true_p95() -> None:
    """Monte Carlo over lognormal solo latencies: the order-statistic CI holds its level, the
    bootstrap undercovers (why the artifact records the former)."""
    rng = np.random.default_rng(7)
    true = math.exp(1.6448536 * 0.5)  # p95 of lognormal(0, 0.5)
    reps, hit_os, hit_bs = 400, 0, 0
    for _ in range(reps):
        x = rng.lognormal(0.0, 0.5, SOLO_SAMPLES)
        e = quantile_ci(x)
        assert e.lo is not None and e.hi is not None
        hit_os += e.lo <= true <= e.hi
        lo, hi = bootstrap_ci(x, reps=200, seed=int(rng.integers(1 << 30)))
        hit_bs += lo <= true <= hi
    # Nominal exact coverage at n = 80 is 0.965; ±3 binomial sd over 400 runs ≈ ±0.028.
    assert hit_os / reps >= 0.93
    assert hit_bs / reps < hit_os / reps


def test_artifact_round_trip_keeps_the_sample_fields() -> None:
    art = load_packaged("h200-measured.json")
    p = art.pipeline("qwen2_5_omni")
    p2 = p.model_copy(
        update={
            "solo_p95_ci_s": {"text-speech": (2.1, None), "text-text": (0.019, 0.024)},
            "solo_samples": {"text-speech": 80, "text-text": 80},
            "solo_wall_s": {"text-speech": 181.5, "text-text": 2.4},
            "deploy_profile": "tuned",
        }
    )
    art2 = art.model_copy(update={"pipelines": {**art.pipelines, "qwen2_5_omni": p2}})
    back = CalibrationArtifact.model_validate_json(art2.model_dump_json())
    assert back == art2
    q = back.pipeline("qwen2_5_omni")
    assert q.solo_p95_ci_s["text-speech"] == (2.1, None) and q.solo_samples["text-text"] == 80
    raw = json.loads(art2.model_dump_json())["pipelines"]["qwen2_5_omni"]["solo_p95_ci_s"]
    assert raw["text-speech"] == [2.1, None]  # JSON: null is the unbounded side


def _calibrate(*args: str) -> list[str]:
    return ["calibrate", "--pipeline", "qwen2_5_omni", "--no-progress", *args]


def test_full_preset_on_a_cpu_is_refused_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip("torch")
    rc = main(_calibrate("--device", "cpu", "--preset", "full", "--out-dir", str(tmp_path)))
    err = capsys.readouterr().err.strip()
    assert rc == 2 and "\n" not in err and "--preset full on a CPU" in err
    assert "--allow-cpu-full" in err and not list(tmp_path.iterdir())


def test_too_few_solo_samples_and_missing_gpu_are_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    torch = pytest.importorskip("torch")
    args = ("--preset", "full", "--allow-cpu-full", "--device", "cpu", "--solo-requests", "6")
    assert main(_calibrate(*args, "--out-dir", str(tmp_path))) == 2
    assert "needs at least 30 per class" in capsys.readouterr().err
    if not torch.cuda.is_available():
        assert main(_calibrate("--device", "cuda:0", "--out-dir", str(tmp_path))) == 2
        err = capsys.readouterr().err.strip()
        assert "--device cuda:0:" in err and "\n" not in err


def test_missing_torch_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "torch", None)  # import torch → ImportError
    assert main(_calibrate("--preset", "tiny", "--out-dir", str(tmp_path))) == 2
    err = capsys.readouterr().err.strip()
    assert "needs PyTorch" in err and "\n" not in err


def test_a_cut_run_resumes_from_its_checkpoint(tmp_path: Path) -> None:
    """The second run of the same command with a full checkpoint starts no pipeline: every
    phase reports 'done before' and the measurements are the first run's."""
    pytest.importorskip("torch")
    from horizonserve.runtime.calibrate.measure import CalibrationOptions, Calibrator

    ck = tmp_path / "ck.json"
    opts = CalibrationOptions(
        pipelines=("qwen2_5_omni",),
        preset="tiny",
        device="cpu",
        solo_requests=2,
        checkpoint=str(ck),
        resume=True,
    )
    first = Calibrator(opts).run()
    assert ck.exists() and "iso" in json.loads(ck.read_text())["done"]
    labels: list[str] = []
    second = Calibrator(opts, labels.append).run()
    resumed = [x for x in labels if x.endswith("(done before: resumed)")]
    assert len(resumed) == len(json.loads(ck.read_text())["done"]) >= 4
    assert not any(x.startswith("start pipeline") for x in labels)
    assert second["iso"] == json.loads(json.dumps(first["iso"], default=str))
    other = CalibrationOptions(**{**vars(opts), "seed": 1})
    with pytest.raises(ValueError, match="--resume: checkpoint"):
        Calibrator(other)
