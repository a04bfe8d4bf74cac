"""`horizonserve bench overhead --json` prints every figure for every queue size."""

from __future__ import annotations

import json

from horizonserve.runtime.cli import main


def test_overhead_json_has_all_figures(capsys) -> None:  # type: ignore[no-untyped-def]
    assert main(["bench", "overhead", "--json", "--sizes", "16", "64", "--rounds", "2"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert set(out["waiting"]) == {"16", "64"}
    for row in out["waiting"].values():
        assert set(row) >= {
            "annotation",
            "view",
            "view-worst",
            "walk-worst",
            "view-split",
            "sm-cap",
            "split",
            "downstream",
        }
        assert all(v > 0 for v in row.values())
        # The whole control step: annotation, view, SM cap, slack split, downstream admission
        # and the place ordering of a freed place.
        parts = ("annotation", "view", "sm-cap", "split", "downstream", "places")
        total = sum(row[k] for k in parts)
        assert abs(row["per-step-total"] - total) < 1e-9
    assert out["paper_table4_us"]["view"] == 1.0
