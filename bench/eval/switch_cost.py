"""How often the shared stage changed its SM count, and what the switches cost, per item.

Reads a campaign session's step trace (steps.jsonl.gz, or its compacted .xz; one row per
shared-stage step) and prints, per item, the steps, the SM-count switches (a switch happens
only at a step boundary), switches per second and the switches' share of the stage's busy time
at a given cost per switch (default: the Green Context switch measured on the H200,
bench/results/gpu/mechanisms-h200.txt). Measured figures from raw records; nothing is
simulated.

    python bench/eval/switch_cost.py bench/results/h200-eval/eval-v5/b14
"""

from __future__ import annotations

import argparse
import itertools
from pathlib import Path

from horizonserve.runtime.calibrate.records import read_members


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("session", type=Path, help="folder with steps.jsonl.gz")
    ap.add_argument("--switch-us", type=float, default=3.9, help="cost of one switch, µs")
    args = ap.parse_args(argv)
    print("item | steps | switches | per s | share of busy time %")
    for item in read_members(args.session / "steps.jsonl.gz"):
        cols, rows = item["columns"], item["rows"]
        if len(rows) < 2:
            continue
        sms, t = cols.index("shared_sms"), cols.index("t")
        busy_cols = [cols.index(c) for c in ("prefill_s", "decode_s", "control_s")]
        switches = sum(1 for a, b in itertools.pairwise(rows) if a[sms] != b[sms])
        busy = sum(r[c] for r in rows for c in busy_cols)
        span = rows[-1][t] - rows[0][t]
        share = 100 * switches * args.switch_us * 1e-6 / busy if busy else 0.0
        rate = switches / span
        print(f"{item['item']} | {len(rows)} | {switches} | {rate:.2f} | {share:.4f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
