"""Per class at Qwen2.5-Omni 6 req/s, the same requests under the three rules for a full talker
(measured, raw records): attainment, the thinker's hand-off p50 (arrival to the talker getting
the request), first response p50 and the thinker's TPOT p50.

    python bench/results/h200-eval/qwen-place-wait-v1/handoff.py
"""

from __future__ import annotations

import statistics
from pathlib import Path

from horizonserve.runtime.calibrate.records import read_members

E = Path("bench/results/h200-eval/eval-v5")
RUNS = {  # rule -> (session, item)
    "SATURATED (ships; q34)": (E / "q34", "r6/horizon/rep1"),
    "SATURATED (ships; q38)": (E / "q38", "r6/horizon/rep1"),
    "wait for a place (q36)": (E / "q36", "r6/horizon/rep1"),
    "wait for a place (q40)": (E / "q40", "r6/horizon/rep1"),
    "off (q35)": (E / "q35", "r6/horizon/rep1"),
}


def _p50(values: list[float]) -> str:
    return f"{statistics.median(values):.2f}" if values else "—"


def main() -> None:
    print("rule | class | n | SLO s | met % | hand-off p50 s | first response p50 s | TPOT p50 ms")
    for rule, (session, item) in RUNS.items():
        members = read_members(session / "records.jsonl.gz")
        records = next(m["records"] for m in members if m["item"] == item)
        by: dict[str, list[dict]] = {}
        for r in records:
            by.setdefault(r["class"], []).append(r)
        for cls in sorted(by):
            rs = by[cls]
            met = 100 * sum(r["slo_met"] for r in rs) / len(rs)
            handoff = [r["handoff_s"] for r in rs if r.get("handoff_s") is not None]
            first = [r["first_response_s"] for r in rs if r.get("first_response_s") is not None]
            tpot = [1e3 * r["shared_tpot_s"] for r in rs if r.get("shared_tpot_s")]
            print(
                f"{rule} | {cls} | {len(rs)} | {rs[0]['slo_s']:.2f} | {met:.1f} | "
                f"{_p50(handoff)} | {_p50(first)} | {_p50(tpot)}"
            )


if __name__ == "__main__":
    main()
