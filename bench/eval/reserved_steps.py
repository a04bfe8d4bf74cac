"""What the reservation costs the shared stage, per item: its decode steps on each SM count.

Reads a campaign session's step trace (steps.jsonl.gz, or its compacted .xz; one row per
shared-stage step). Per item and SM count it prints the share of the steps and of the stage's
busy time (prefill + decode) spent there; then, for decode-only steps (no prefill in them)
grouped by decode batch, the median step time on each SM count and the ratio of the smallest
count's to the largest's. On the H200's campaigns the smallest count is the 16-SM reservation
and the largest the whole GPU, so the ratio is what a reserved step costs at the same batch.
Measured figures from raw records; nothing is simulated.

    python bench/eval/reserved_steps.py bench/results/h200-eval/eval-v5/q34
"""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path

from horizonserve.runtime.calibrate.records import read_members

Row = list[float]


def _median_ms(values: list[float]) -> float:
    return 1e3 * statistics.median(values) if values else float("nan")


def report(item: str, columns: list[str], rows: list[Row], bucket: int) -> list[str]:
    """The lines for one item's trace (none where it has no decode steps)."""
    ix = {c: i for i, c in enumerate(columns)}
    sms, decode, prefill = ix["shared_sms"], ix["decode_s"], ix["prefill_s"]
    batch, prefill_batch = ix["decode_batch"], ix["prefill_batch"]
    busy = sum(r[prefill] + r[decode] for r in rows)
    if busy <= 0:
        return []  # no rows, or no GPU work in them
    counts = sorted({int(r[sms]) for r in rows})
    lines = []
    for n in counts:
        mine = [r for r in rows if r[sms] == n]
        share = 100 * sum(r[prefill] + r[decode] for r in mine) / busy
        lines.append(f"{item} | {n} SMs | {100 * len(mine) / len(rows):.1f} % of steps | "
                     f"{share:.1f} % of busy time")  # fmt: skip
    if len(counts) < 2:
        return lines
    low, high = counts[0], counts[-1]
    by: dict[tuple[int, int], list[float]] = {}
    for r in rows:
        if r[prefill_batch] == 0 and r[batch] > 0:
            by.setdefault((int(r[sms]), int(r[batch]) // bucket), []).append(r[decode])
    for b in sorted({k[1] for k in by}):
        lo, hi = by.get((low, b), []), by.get((high, b), [])
        if not lo or not hi:
            continue
        a, z = _median_ms(lo), _median_ms(hi)
        lines.append(
            f"{item} | decode batch {b * bucket}-{b * bucket + bucket - 1} | {low} SMs {a:.1f} ms "
            f"(n={len(lo)}) | {high} SMs {z:.1f} ms (n={len(hi)}) | x{a / z:.2f}"
        )
    return lines


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("session", type=Path, help="folder with steps.jsonl.gz (or .xz)")
    ap.add_argument("--item", action="append", help="only these items (default: all)")
    ap.add_argument("--bucket", type=int, default=8, help="decode-batch group width")
    args = ap.parse_args(argv)
    if args.bucket < 1:
        ap.error(f"--bucket must be at least 1 (got {args.bucket})")
    members = read_members(args.session / "steps.jsonl.gz")
    if not members:
        ap.error(f"{args.session}: no steps.jsonl.gz or steps.jsonl.xz there")
    for m in members:
        if args.item and m["item"] not in args.item:
            continue
        for line in report(m["item"], m["columns"], m["rows"], args.bucket):
            print(line)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
