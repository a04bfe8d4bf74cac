"""bench/eval/report.py bins the step trace for the control figure, the split's inputs too."""

from __future__ import annotations

import math

from tests.bench.scripts import load_eval_script


def test_bins_keep_each_sides_most_urgent_slack_and_read_old_traces() -> None:
    cols = ["t", "downstream_active", "pressure", "shared_sms", "shared_slack", "downstream_slack"]
    ix = {c: i for i, c in enumerate(cols)}
    rows = [
        [0.0, 1, 0.5, 16, 2.0, None],
        [0.1, 1, 0.7, 48, 0.5, 1.5],
        [0.3, 0, None, 132, None, None],
    ]
    first, second = load_eval_script("report")._bin(rows, ix, 0.25)
    assert first == (0.0, 1.0, 0.6, 32.0, 0.5, 1.5)  # means, and the smallest slack per side
    assert second[:4] == (0.25, 0.0, second[2], 132.0) and math.isnan(second[2])
    assert math.isnan(second[4]) and math.isnan(second[5])  # no slack offered in that bin
    old = {c: i for i, c in enumerate(cols[:4])}  # a trace from before the slack columns
    (only,) = load_eval_script("report")._bin([r[:4] for r in rows[:2]], old, 0.25)
    assert only[:4] == (0.0, 1.0, 0.6, 32.0) and math.isnan(only[4]) and math.isnan(only[5])
