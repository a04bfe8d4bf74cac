"""bench/eval/step_regimes.py splits full decode steps into a fast and a slow regime."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from tests.bench.scripts import load_eval_script

COLS = ["t", "shared_sms", "decode_batch", "decode_s", "downstream_active", "waiting", "pressure"]


def _row(t: float, batch: int, decode_s: float, active: int) -> list[float]:
    return [t, 132, batch, decode_s, active, 0, 0.2 if decode_s < 0.045 else 0.05]


def test_regime_shares_medians_and_flips(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Full steps: fast, fast, slow, slow, slow, fast (two flips, runs 2 / 3 / 1); a 2-row
    # step and an item without full steps are left out.
    steps = [(0.02, 40), (0.018, 42), (0.09, 20), (0.085, 22), (0.087, 24), (0.019, 38)]
    rows = [_row(i, 16, d, a) for i, (d, a) in enumerate(steps)] + [_row(9, 2, 0.09, 0)]
    with gzip.open(tmp_path / "steps.jsonl.gz", "wt") as f:
        f.write(json.dumps({"item": "r2/horizon/rep1", "columns": COLS, "rows": rows}) + "\n")
        f.write(json.dumps({"item": "idle", "columns": COLS, "rows": rows[-1:]}) + "\n")
    assert load_eval_script("step_regimes").main([str(tmp_path)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert len(out) == 2  # the header and the one item with full steps
    cells = [c.strip() for c in out[1].split("|")]
    assert cells[:5] == ["r2/horizon/rep1", "6", "50.0", "19.0", "87.0"]
    assert cells[5:8] == ["16 / 16", "40 / 22", "0 / 0"]  # batch, in flight, waiting
    assert cells[8] == "0.2 / 0.05"  # pressure
    assert cells[9] == "132 / 132"
    assert cells[10:] == ["2", "2"]  # flips, median run


def test_each_regime_gets_the_gpu_samples_its_steps_ran_under(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Steps 1 s apart from the item's t0: fast at 0, 1 and 5 s, slow at 2, 3 and 4 s.
    steps = [0.02, 0.02, 0.09, 0.09, 0.09, 0.02]
    rows = [_row(float(i), 16, d, 30) for i, d in enumerate(steps)]
    with gzip.open(tmp_path / "steps.jsonl.gz", "wt") as f:
        f.write(json.dumps({"item": "r1/horizon/rep1", "columns": COLS, "rows": rows}) + "\n")
        f.write(json.dumps({"item": "r1/edf-mps/rep1", "columns": COLS, "rows": rows}) + "\n")
    summary = {"items": {"r1/horizon/rep1": {"t0_local": "2026-12-03 10:00:00.000"},
                         "r1/edf-mps/rep1": {}}}  # fmt: skip
    (tmp_path / "summary.json").write_text(json.dumps(summary))
    log = tmp_path / "gpu.csv"
    log.write_text(
        "timestamp, clocks.current.sm [MHz], clocks.current.memory [MHz], power.draw [W], "
        "utilization.gpu [%]\n"  # the header of --format=csv without noheader: skipped
        "2026/12/03 09:59:59.500, 1980, 3201, 300.0, 90\n"
        "2026/12/03 10:00:01.900, 1200, 3201, 150.0, [N/A]\n"
        "2026/12/03 10:00:03.500, 1980, 3201, 310.0, 95\n"
    )
    assert load_eval_script("step_regimes").main([str(tmp_path), "--gpu-log", str(log)]) == 0
    out = capsys.readouterr().out.splitlines()
    cells = [c.strip() for c in out[1].split("|")]
    # fast steps ran under the 09:59:59.5 sample (0 s, 1 s) and the 10:00:03.5 one (5 s);
    # slow steps under 10:00:01.9 (2, 3 s) and 10:00:03.5 (4 s); [N/A] is left out
    assert cells[10:14] == ["1980 / 1460", "3201 / 3201", "303.3 / 203.3", "91.67 / 95"]
    edf = [c.strip() for c in out[2].split("|")]
    assert edf[10:14] == ["- / -"] * 4  # no recorded start: not placed on the wall clock
