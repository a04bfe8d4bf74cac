"""What `horizonserve bench` prints and draws: one name per system (the registry's, never cut),
every column explained, signed differences named by their direction, the long-path anomaly
explained, legends beside the plots and value labels on the bars."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import matplotlib
import pytest

from horizonserve.runtime.bench import report
from horizonserve.runtime.bench.sweep import SweepConfig, run_sweep
from horizonserve.runtime.sim.systems import SYSTEMS

SWEPT = ("horizon", "fcfs", "mps", "horizon-no-rotation", "horizon-no-throttling")


@pytest.fixture(scope="module")
def raw() -> dict[str, Any]:
    cfg = SweepConfig(
        systems=SWEPT,
        rates=(3.0, 7.0),
        long_ratios=(0.0, 0.6),
        long_sweep_rate=6.0,
        duration_s=30.0,
        warmup_s=3.0,
        jobs=1,
        solo_requests=50,
    )
    return run_sweep(cfg)


def test_summary_uses_the_registry_names_uncut_and_explains_every_table(
    raw: dict[str, Any],
) -> None:
    text = report.summary_table(raw)
    rows = [line.split()[0] for line in text.splitlines() if line.split()]
    flat = text.replace("\n    ", " ")
    for s in SWEPT:
        assert rows.count(s) >= 3, s  # rate table, long-path table, details table
        assert f"{s} = {SYSTEMS[s].label}" in flat
    for label in ("Vanilla (FCFS)", "w/o path rotation"):  # descriptions only in the key
        assert flat.count(label) == 1
    assert "cells: SLO attainment %" in text
    assert "columns: attain = SLO attainment %" in text and "co-run = " in text
    assert "SM cap = " in text
    assert "(falls: True)" not in text and "(falls: False)" not in text
    assert "mean reduction" not in text


def test_signed_quantities_read_by_their_direction(raw: dict[str, Any]) -> None:
    lines = report.findings_lines(raw["findings"])
    text = "\n".join(lines)
    assert "(+ = horizon slower)" in text.replace("\n    ", " ")
    abl = [ln for ln in lines if ln.strip().startswith("ablation ")]
    assert abl
    for ln in abl:
        assert "same as horizon" in ln or ("points vs horizon: " in ln)
        if "points vs horizon: worse" in ln:
            assert "(-" in ln
        if "points vs horizon: better" in ln:
            assert "(+" in ln


def test_versus_names_the_sign() -> None:
    assert report._versus(-3.25) == "-3.2 points vs horizon: worse"
    assert report._versus(2.0) == "+2.0 points vs horizon: better"
    assert report._versus(0.01) == "same as horizon"


def _with_long_attainment(raw: dict[str, Any], at: dict[float, float]) -> dict[str, Any]:
    """The sweep with every system's long-path attainment set per share (the rest as run)."""
    results = [
        {**r, "attainment": at[r["point"]["long_ratio"]]} if r["point"]["sweep"] == "long" else r
        for r in raw["results"]
    ]
    return {**raw, "results": results}


def test_long_share_note_explains_a_rise_with_the_runs_own_numbers(raw: dict[str, Any]) -> None:
    t = raw["workload_tokens"]
    assert t["short"] > t["long"] > 0  # typed answers are longer than spoken ones
    rising = _with_long_attainment(raw, {0.0: 0.6, 0.6: 0.99})
    note = report.long_share_note(rising)
    assert note is not None
    assert f"averages {t['short']:.0f} shared-stage output tokens" in note
    assert f"a long-path one {t['long']:.0f}" in note
    assert "co-running 0 %" in note  # nothing downstream at 0 % long-path
    assert "every system saturates alike (60.0 %)" in note
    assert "summary" not in note and note in report.summary_table(rising).replace("\n    ", " ")
    falling = _with_long_attainment(raw, {0.0: 0.99, 0.6: 0.6})
    assert report.long_share_note(falling) is None  # the paper's direction: nothing to explain
    assert "why attainment rises" not in report.summary_table(falling)


def test_every_registry_system_has_its_own_style() -> None:
    styles = [report.system_style(s)[:2] for s in SYSTEMS]
    assert len(set(styles)) == len(styles)
    assert report.system_style("horizon")[2] == "-"
    assert report.system_style("fcfs")[2] == "--"
    assert report.system_style("horizon-no-rotation")[2] == ":"


def test_figures_put_the_legend_beside_the_plots_and_label_bars(
    raw: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figures: dict[str, Any] = {}
    real_close = plt.close

    def keep(fig: Any = None) -> None:  # inspect the figure instead of closing it
        if fig is not None:
            figures[fig.get_suptitle() or fig.axes[0].get_title()] = fig
        else:
            real_close(fig)

    monkeypatch.setattr(plt, "close", keep)
    report.fig_attainment(raw, tmp_path / "f8.png")
    report.fig_per_class(raw, tmp_path / "f9.png")
    report.fig_ablation(raw, tmp_path / "f11.png")
    assert len(figures) == 3
    for title, fig in figures.items():
        fig.canvas.draw()
        renderer = fig.canvas.get_renderer()
        legend = fig.legends[0].get_window_extent(renderer)
        for ax in fig.axes:
            assert not legend.overlaps(ax.get_window_extent(renderer)), title
        if "ablation" in title:
            texts = [t.get_text() for t in fig.axes[0].texts]
            assert len(texts) == len(fig.axes[0].patches) and all(texts), texts
        if "Fig. 9" in title and "∞" not in title:
            assert all(t.get_text() != "∞" for t in fig.axes[0].texts)
        real_close(fig)
    (f8,) = [f for t, f in figures.items() if "Fig. 8" in t]
    xs = {tuple(line.get_xdata()) for line in f8.axes[0].get_lines()}
    assert len(xs) == len(f8.axes[0].get_lines())  # offset: no two lines share their x
