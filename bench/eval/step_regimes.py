"""Fast and slow regimes of the shared stage's full decode steps, per item.

Reads a campaign session's step trace (steps.jsonl.gz, or its compacted .xz; one row per
shared-stage step) and splits the decode steps that run at least `--min-batch` sequences at a
step time threshold. Per item it prints each regime's share of those steps, its median step
time and the mean of the columns that could explain it (decode batch, downstream requests in
flight, waiting prompts, memory pressure, SMs), then how many times the regime flipped and
the median length of a run of steps in one regime. Measured figures from raw records;
nothing is simulated.

An eager thinker (the `stock` deploy profile) shows two regimes whose shares differ between
runs; a step-time median across them then says which regime a run spent longer in, not what a
step of its policy costs.

    python bench/eval/step_regimes.py bench/results/h200-eval/eval-v5/q30
"""

from __future__ import annotations

import argparse
import itertools
import statistics
from pathlib import Path

from horizonserve.runtime.calibrate.records import read_members

EXPLAIN = ("decode_batch", "downstream_active", "waiting", "pressure", "shared_sms")


def _mean(rows: list[list[float]], col: int | None) -> float:
    if col is None or not rows:
        return float("nan")
    return statistics.fmean(r[col] or 0.0 for r in rows)


def _median_ms(rows: list[list[float]], col: int) -> float:
    return 1e3 * statistics.median(r[col] for r in rows) if rows else float("nan")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("session", type=Path, help="folder with steps.jsonl.gz (or .xz)")
    ap.add_argument("--threshold-ms", type=float, default=45.0, help="fast below, slow above")
    ap.add_argument("--min-batch", type=int, default=9, help="decode steps of this many or more")
    args = ap.parse_args(argv)
    limit = args.threshold_ms / 1e3
    head = " | ".join(f"{c} fast / slow" for c in EXPLAIN)
    print(f"item | steps | fast % | fast ms | slow ms | {head} | flips | median run")
    for item in read_members(args.session / "steps.jsonl.gz"):
        cols, rows = item["columns"], item["rows"]
        decode, batch = cols.index("decode_s"), cols.index("decode_batch")
        full = [r for r in rows if r[batch] >= args.min_batch]
        if not full:
            continue
        fast = [r for r in full if r[decode] < limit]
        slow = [r for r in full if r[decode] >= limit]
        runs = [len(list(g)) for _, g in itertools.groupby(r[decode] < limit for r in full)]
        at = [cols.index(c) if c in cols else None for c in EXPLAIN]
        means = " | ".join(f"{_mean(fast, i):.3g} / {_mean(slow, i):.3g}" for i in at)
        print(
            f"{item['item']} | {len(full)} | {100 * len(fast) / len(full):.1f} | "
            f"{_median_ms(fast, decode):.1f} | {_median_ms(slow, decode):.1f} | {means} | "
            f"{len(runs) - 1} | {statistics.median(runs):g}"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
