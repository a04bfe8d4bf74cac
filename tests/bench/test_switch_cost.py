"""bench/eval/switch_cost.py counts SM-count switches between consecutive shared-stage steps."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from tests.bench.scripts import load_eval_script


def test_counts_level_changes_and_their_share(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cols = ["t", "shared_sms", "prefill_s", "decode_s", "control_s"]
    # 132 -> 16 -> 16 -> 132 -> 48: three switches over 4 s, 1 s of busy time
    rows = [[0.0, 132, 0.1, 0.1, 0.0], [1.0, 16, 0.0, 0.2, 0.0], [2.0, 16, 0.0, 0.2, 0.0],
            [3.0, 132, 0.2, 0.0, 0.0], [4.0, 48, 0.0, 0.2, 0.0]]  # fmt: skip
    with gzip.open(tmp_path / "steps.jsonl.gz", "wt") as f:
        f.write(json.dumps({"item": "r2/horizon/rep1", "columns": cols, "rows": rows}) + "\n")
        f.write(json.dumps({"item": "empty", "columns": cols, "rows": rows[:1]}) + "\n")
    assert load_eval_script("switch_cost").main([str(tmp_path), "--switch-us", "1000"]) == 0
    out = capsys.readouterr().out.splitlines()
    # 3 switches x 1 ms over 1 s busy = 0.3 %; an item with one step has no switches to count
    assert out[1:] == ["r2/horizon/rep1 | 5 | 3 | 0.75 | 0.3000"]
