"""bench/eval/reserved_steps.py: each SM count's share of a trace and a reserved step's cost."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from tests.bench.scripts import load_eval_script

COLS = ["t", "shared_sms", "decode_batch", "prefill_batch", "prefill_s", "decode_s"]


def test_shares_and_the_cost_of_a_reserved_step(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rows = [
        [0.0, 132, 10, 0, 0.0, 0.008],
        [0.1, 132, 12, 0, 0.0, 0.010],
        [0.2, 132, 12, 1, 0.030, 0.010],  # a prefill in it: no decode-only median, busy time
        [0.3, 16, 11, 0, 0.0, 0.027],
        [0.4, 16, 2, 0, 0.0, 0.015],  # batch 0-7: no whole-GPU step to compare with
    ]
    with gzip.open(tmp_path / "steps.jsonl.gz", "wt") as f:
        f.write(json.dumps({"item": "r6/horizon/rep1", "columns": COLS, "rows": rows}) + "\n")
        f.write(json.dumps({"item": "r6/edf-mps/rep1", "columns": COLS, "rows": rows[:2]}) + "\n")
    assert load_eval_script("reserved_steps").main([str(tmp_path)]) == 0
    out = [[c.strip() for c in line.split("|")] for line in capsys.readouterr().out.splitlines()]
    busy = 0.008 + 0.010 + 0.040 + 0.027 + 0.015
    assert out[0] == ["r6/horizon/rep1", "16 SMs", "40.0 % of steps",
                      f"{100 * 0.042 / busy:.1f} % of busy time"]  # fmt: skip
    assert out[1][1:3] == ["132 SMs", "60.0 % of steps"]
    assert out[2] == ["r6/horizon/rep1", "decode batch 8-15", "16 SMs 27.0 ms (n=1)",
                      "132 SMs 9.0 ms (n=2)", "x3.00"]  # fmt: skip
    assert out[3] == ["r6/edf-mps/rep1", "132 SMs", "100.0 % of steps", "100.0 % of busy time"]
    assert len(out) == 4  # one SM count: no cost line


def test_a_session_without_a_trace_is_refused(tmp_path: Path) -> None:
    with pytest.raises(SystemExit):
        load_eval_script("reserved_steps").main([str(tmp_path)])
