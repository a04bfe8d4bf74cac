"""Workloads, the sweep report and the `horizonserve bench` / `sim` command lines."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from horizonserve.runtime.bench.report import summary_table, write_report
from horizonserve.runtime.bench.sweep import SweepConfig, run_sweep
from horizonserve.runtime.cli import build_parser, main
from horizonserve.runtime.config import PIPELINES
from horizonserve.runtime.workload import (
    generate,
    load_datasets,
    load_workload,
    mix_weights,
)

LONG = ("text-speech", "audio-speech", "image-speech")


@pytest.mark.parametrize("name", PIPELINES)
def test_workloads_cite_known_datasets(name: str) -> None:
    wl = load_workload(name)
    known = load_datasets().datasets
    assert wl.provenance
    for c in wl.classes:
        assert set(c.datasets) <= set(known)


def test_long_ratio_mix_keeps_the_long_share() -> None:
    wl = load_workload("qwen2_5_omni")
    for r in (0.0, 0.15, 0.6):
        mix = mix_weights(wl, LONG, r)
        assert sum(mix.values()) == pytest.approx(1.0)
        assert sum(mix[k] for k in LONG) == pytest.approx(r)
    with pytest.raises(ValueError, match="unknown classes"):
        mix_weights(wl, LONG, override={"nope": 1.0})


def test_poisson_trace_is_seeded_and_rescales() -> None:
    wl = load_workload("qwen2_5_omni")
    mix = mix_weights(wl, LONG)
    a = generate(wl, mix, rate=5.0, duration_s=400.0, seed=1)
    b = generate(wl, mix, rate=5.0, duration_s=400.0, seed=1)
    np.testing.assert_array_equal(a.arrival, b.arrival)
    np.testing.assert_array_equal(a.output_tokens, b.output_tokens)
    assert len(a) / 400.0 == pytest.approx(5.0, rel=0.1)
    gaps = np.diff(a.arrival)
    assert np.std(gaps) / np.mean(gaps) == pytest.approx(1.0, rel=0.15)  # exponential gaps
    share = np.isin(np.array(a.classes)[a.cls], LONG).mean()
    assert share == pytest.approx(0.3, abs=0.05)
    c = a.scaled(10.0)  # same requests, twice as fast
    np.testing.assert_allclose(c.arrival, a.arrival / 2)
    np.testing.assert_array_equal(c.cls, a.cls)


@pytest.mark.parametrize("burstiness", [0.25, 4.0])
def test_bursty_trace_keeps_the_rate_and_the_requests(burstiness: float) -> None:
    """Gamma gaps of shape b (vLLM's serving benchmark's `--burstiness`): the same mean rate,
    gaps whose coefficient of variation is 1/sqrt(b), the same classes and features as the
    Poisson trace of the seed (only the arrival stream differs)."""
    wl = load_workload("qwen2_5_omni")
    mix = mix_weights(wl, LONG)
    poisson = generate(wl, mix, rate=5.0, n_requests=4000, seed=1)
    bursty = generate(wl, mix, rate=5.0, n_requests=4000, seed=1, burstiness=burstiness)
    gaps = np.diff(bursty.arrival)
    assert np.mean(gaps) == pytest.approx(1 / 5.0, rel=0.1)
    assert np.std(gaps) / np.mean(gaps) == pytest.approx(burstiness**-0.5, rel=0.15)
    np.testing.assert_array_equal(bursty.cls, poisson.cls)
    np.testing.assert_array_equal(bursty.output_tokens, poisson.output_tokens)
    window = generate(wl, mix, rate=5.0, duration_s=400.0, seed=1, burstiness=burstiness)
    assert window.arrival[-1] < 400.0 and len(window) / 400.0 == pytest.approx(5.0, rel=0.2)
    # Burstiness 1 is the Poisson trace itself, draw for draw.
    one = generate(wl, mix, rate=5.0, n_requests=4000, seed=1, burstiness=1.0)
    np.testing.assert_array_equal(one.arrival, poisson.arrival)


@pytest.mark.parametrize("bad", [0.0, -1.0, float("nan"), float("inf")])
def test_burstiness_must_be_a_positive_number(bad: float) -> None:
    wl = load_workload("qwen2_5_omni")
    with pytest.raises(ValueError, match="burstiness must be a positive number"):
        generate(wl, mix_weights(wl, LONG), rate=5.0, n_requests=10, burstiness=bad)


def test_sweep_report_is_labelled_simulated(tmp_path: Path) -> None:
    cfg = SweepConfig(
        systems=("horizon", "fcfs", "horizon-no-rotation"),
        rates=(2.0, 6.0),
        long_ratios=(0.0, 0.6),
        long_sweep_rate=6.0,
        duration_s=30.0,
        warmup_s=3.0,
        jobs=1,
        solo_requests=50,
    )
    raw = run_sweep(cfg)
    paths = write_report(raw, tmp_path)
    names = {p.name for p in paths}
    assert {"results.json", "summary.txt", "fig8_attainment.png"} <= names
    assert {"fig9_p95_per_class.png", "fig10_control_trace.png", "fig11_ablation.png"} <= names
    data = json.loads((tmp_path / "results.json").read_text())  # strict JSON
    assert data["label"] == "simulated"
    assert all(r["label"] == "simulated" for r in data["results"])
    f = data["findings"]
    assert f["stressed_rate"]["rate"] == 6.0 and f["max_long_ratio"]["long_ratio"] == 0.6
    assert f["speed"]["per_core_x_real_time"] > 0
    assert f["stressed_rate"]["best_non_mps_baseline"] == "fcfs"  # the only one swept here
    # The default artifact is the measured H200 one, and the report says which it used.
    assert data["artifact"]["measured"] and data["artifact"]["file"].endswith("h200-fitted.json")
    text = summary_table(raw)
    assert "SIMULATED" in text and "calibration artifact:" in text and "measured on the GPU" in text


def test_bench_cli_writes_the_named_folder(tmp_path: Path, capsys) -> None:
    out = tmp_path / "b"
    rc = main(
        [
            "bench",
            "--systems",
            "horizon,fcfs",
            "--rates",
            "3",
            "--long-ratios",
            "0.3",
            "--duration",
            "20",
            "--jobs",
            "1",
            "--no-progress",
            "--no-plots",
            "--out",
            str(out),
        ]
    )
    assert rc == 0
    text = capsys.readouterr().out
    assert "SIMULATED" in text and str(out.resolve()) in text
    assert (out / "summary.txt").exists()


def test_bench_dispatches_overhead() -> None:
    args = build_parser(["bench", "overhead"]).parse_args(["bench", "overhead"])
    assert args._bench_target == "overhead"
    args = build_parser(["bench"]).parse_args(["bench"])
    assert args._bench_target == "sweep"


def test_sim_run_cli(capsys) -> None:
    assert main(["sim", "run", "--rate", "2", "--duration", "20", "--slo", "defaults"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("SIMULATED") and "text-text" in out


def test_sim_run_cli_takes_bursty_arrivals(capsys) -> None:
    argv = ["sim", "run", "--rate", "2", "--duration", "20", "--slo", "defaults"]
    assert main([*argv, "--burstiness", "0.25"]) == 0
    assert "burstiness 0.25: attainment" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        main([*argv, "--burstiness", "0"])
    assert "--burstiness" in capsys.readouterr().err
