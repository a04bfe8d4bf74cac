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

With `--gpu-log`, a GPU sample log recorded during the session,

    nvidia-smi --query-gpu=timestamp,clocks.sm,clocks.mem,power.draw,utilization.gpu \
        --format=csv,noheader,nounits -lms 500 > gpu.csv

each step also gets the latest sample taken at or before it (items are placed on the wall
clock by their summary's `t0_local`), and each regime's mean of those columns is printed.

    python bench/eval/step_regimes.py bench/results/h200-eval/eval-v5/q30
"""

from __future__ import annotations

import argparse
import bisect
import itertools
import json
import statistics
from datetime import datetime
from pathlib import Path

from horizonserve.runtime.calibrate.records import read_members

EXPLAIN = ("decode_batch", "downstream_active", "waiting", "pressure", "shared_sms")
GPU_FIELDS = ("sm_clock_mhz", "mem_clock_mhz", "power_w", "gpu_util_pct")  # after timestamp
_STAMP_FORMATS = ("%Y/%m/%d %H:%M:%S.%f", "%Y/%m/%d %H:%M:%S")  # nvidia-smi's timestamp

Row = list[float]


def _stamp(text: str) -> float:
    for fmt in _STAMP_FORMATS:
        try:
            return datetime.strptime(text.strip(), fmt).timestamp()
        except ValueError:
            continue
    raise ValueError(f"unknown timestamp {text!r}: expected nvidia-smi's YYYY/MM/DD HH:MM:SS.mmm")


def _number(text: str) -> float:
    try:
        return float(text)
    except ValueError:  # "[N/A]", "[Not Supported]"
        return float("nan")


class GpuLog:
    """Samples of `nvidia-smi --query-gpu=timestamp,<GPU_FIELDS>` (csv, noheader, nounits),
    in time order; one GPU (the first index's lines when there are several)."""

    def __init__(self, path: Path) -> None:
        self.t: list[float] = []
        self.values: list[tuple[float, ...]] = []
        for line in path.read_text().splitlines():
            cells = line.split(",")
            if len(cells) != 1 + len(GPU_FIELDS) or cells[0].strip() == "timestamp":
                continue  # a header, or a message nvidia-smi printed instead of a sample
            t = _stamp(cells[0])
            if self.t and t <= self.t[-1]:
                continue  # another GPU's line of the same sample
            self.t.append(t)
            self.values.append(tuple(_number(c) for c in cells[1:]))

    def at(self, t: float) -> tuple[float, ...] | None:
        """The latest sample taken at or before `t` (None: before the first one)."""
        i = bisect.bisect_right(self.t, t) - 1
        return self.values[i] if i >= 0 else None


def _mean(values: list[float]) -> float:
    finite = [v for v in values if v == v]
    return statistics.fmean(finite) if finite else float("nan")


def _column_mean(rows: list[Row], col: int | None) -> float:
    return float("nan") if col is None else _mean([r[col] or 0.0 for r in rows])


def _median_ms(rows: list[Row], col: int) -> float:
    return 1e3 * statistics.median(r[col] for r in rows) if rows else float("nan")


def _gpu_means(log: GpuLog, t0: float, rows: list[Row], t_col: int) -> list[float]:
    """Per GPU field, the mean over `rows` of the sample each step ran under."""
    samples = [s for s in (log.at(t0 + r[t_col]) for r in rows) if s is not None]
    return [_mean([s[i] for s in samples]) for i in range(len(GPU_FIELDS))]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("session", type=Path, help="folder with steps.jsonl.gz (or .xz)")
    ap.add_argument("--threshold-ms", type=float, default=45.0, help="fast below, slow above")
    ap.add_argument("--min-batch", type=int, default=9, help="decode steps of this many or more")
    ap.add_argument("--gpu-log", type=Path, help="nvidia-smi --query-gpu samples (see above)")
    args = ap.parse_args(argv)
    limit = args.threshold_ms / 1e3
    log = GpuLog(args.gpu_log) if args.gpu_log else None
    starts: dict[str, float] = {}
    if log is not None:
        summary = json.loads((args.session / "summary.json").read_text())
        for item_id, s in summary["items"].items():
            if s.get("t0_local"):
                starts[item_id] = datetime.fromisoformat(s["t0_local"]).timestamp()
    head = " | ".join(f"{c} fast / slow" for c in EXPLAIN)
    if log is not None:
        head += " | " + " | ".join(f"{f} fast / slow" for f in GPU_FIELDS)
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
        cells = [f"{_column_mean(fast, i):.3g} / {_column_mean(slow, i):.3g}" for i in at]
        if log is not None:
            t0 = starts.get(item["item"])
            if t0 is None:  # a session from before items recorded their start
                cells += ["- / -"] * len(GPU_FIELDS)
            else:
                t_col = cols.index("t")
                pairs = zip(
                    _gpu_means(log, t0, fast, t_col), _gpu_means(log, t0, slow, t_col), strict=True
                )
                cells += [f"{a:.4g} / {b:.4g}" for a, b in pairs]
        print(
            f"{item['item']} | {len(full)} | {100 * len(fast) / len(full):.1f} | "
            f"{_median_ms(fast, decode):.1f} | {_median_ms(slow, decode):.1f} | "
            f"{' | '.join(cells)} | {len(runs) - 1} | {statistics.median(runs):g}"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
