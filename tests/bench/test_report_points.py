"""bench/eval/report.py's per-point means and its compact figures."""

from __future__ import annotations

from pathlib import Path

from tests.bench.scripts import load_eval_script

COLS = ["t", "shared_sms", "decode_batch", "prefill_batch", "decode_s", "downstream_active"]


def _item(system: str, rep: int, met: list[bool]) -> dict:
    records = [
        {
            "class": "text-text", "path": "short", "slo_s": 1.0, "slo_met": m,
            "first_response_s": 0.5 if m else 2.0, "arrival_offset_s": 5.0,
            "shared_tpot_s": 0.01,
        }
        for m in met
    ]  # fmt: skip
    meta = {"point": "r1-l0", "system": system, "rep": rep, "sharing": "mps", "mps_active": True}
    return {
        "session": "s00", "meta": meta, "records": records,
        "columns": COLS, "rows": [[0.0, 132, 1, 0, 0.01, 0]],
    }  # fmt: skip


def test_a_point_without_long_path_requests_has_no_long_attainment() -> None:
    data = {
        "plan": {"points": {"r1-l0": {"duration_s": 10.0}}},
        "items": {
            "r1-l0/edf-mps/rep1": _item("edf-mps", 1, [True, True, True, False]),
            "r1-l0/edf-mps/rep2": _item("edf-mps", 2, [True, True, False, False]),
        },
        "sims": {},
    }
    row = load_eval_script("report").metrics(data)["points"]["r1-l0"]["edf-mps"]
    assert row["reps"] == 2 and row["attainment_reps"] == [0.75, 0.5]
    assert row["short_attainment"] == 0.625
    assert row["long_attainment"] is None  # no long-path request: nothing to average


def test_figures_are_written_pixel_identical_and_smaller(tmp_path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np
    from PIL import Image

    fig, ax = plt.subplots(figsize=(4, 3))
    ax.plot(np.arange(50), np.sin(np.arange(50) / 5.0), label="attainment")
    ax.legend()
    plain = tmp_path / "plain.png"
    fig.savefig(plain, dpi=110)
    compact = tmp_path / "compact.png"
    name = load_eval_script("figures").save_png(fig, compact)
    plt.close(fig)
    assert name == "compact.png"
    with Image.open(plain) as a, Image.open(compact) as b:
        assert a.size == b.size and b.mode != "RGBA"  # the opaque alpha channel is dropped
        assert a.convert("RGB").tobytes() == b.convert("RGB").tobytes()
        assert a.getchannel("A").getextrema() == (255, 255)
    assert compact.stat().st_size < plain.stat().st_size
