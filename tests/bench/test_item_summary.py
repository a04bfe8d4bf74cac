"""bench/eval/campaign.py's per-item summary: per path, every request is met, late or never."""

from __future__ import annotations

from tests.bench.scripts import load_eval_script


def _rec(path: str, met: bool, answered: bool) -> dict:
    return {
        "class": f"{path}-class", "path": path, "slo_s": 1.0, "slo_met": met,
        "first_response_s": (0.5 if met else 2.0) if answered else None,
        "arrival_offset_s": 5.0, "shared_tpot_s": 0.01,
    }  # fmt: skip


def test_per_path_goodput_late_and_never() -> None:
    records = [
        *[_rec("short", True, True)] * 6,
        *[_rec("short", False, True)] * 3,
        _rec("short", False, False),
        *[_rec("long", True, True)] * 2,
        *[_rec("long", False, False)] * 4,
    ]
    cols = ["t", "shared_sms", "decode_batch", "prefill_batch", "decode_s", "downstream_active"]
    s = load_eval_script("campaign").item_summary(
        records, [[0.0, 132, 1, 0, 0.01, 0]], cols, span_s=10.0
    )
    assert (s["short_goodput_rps"], s["short_late"], s["short_never"]) == (0.6, 3, 1)
    assert (s["long_goodput_rps"], s["long_late"], s["long_never"]) == (0.2, 0, 4)
    assert s["short_attainment"] == 0.6 and s["long_attainment"] == 2 / 6
    assert s["underruns"] is None  # these records predate the playback-stall count


def test_underruns_are_summed_over_the_point() -> None:
    records = [{**_rec("long", True, True), "underruns": n} for n in (0, 2, 1)]
    cols = ["t", "shared_sms", "decode_batch", "prefill_batch", "decode_s", "downstream_active"]
    s = load_eval_script("campaign").item_summary(
        records, [[0.0, 132, 1, 0, 0.01, 0]], cols, span_s=10.0
    )
    assert s["underruns"] == 3
