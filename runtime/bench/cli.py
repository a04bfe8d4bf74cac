"""`horizonserve bench`: the simulated policy sweep (default) or `bench overhead`.

horizonserve bench                      # Qwen2.5-Omni, all systems, simulated backend
horizonserve bench --pipeline all       # the three pipelines, one folder each
horizonserve bench overhead             # control-core microbenchmarks (bench.overhead)
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from horizonserve.runtime import cli_types as ck
from horizonserve.runtime.config import PIPELINES


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="target", metavar="TARGET")
    overhead = sub.add_parser("overhead", help="microbenchmarks of the control core")
    overhead.set_defaults(_bench_target="overhead")
    _overhead_arguments(overhead)
    parser.set_defaults(_bench_target="sweep")
    g = parser.add_argument_group("simulated sweep (default target)")
    g.add_argument(
        "--pipeline",
        default="qwen2_5_omni",
        choices=[*PIPELINES, "all"],
        help="pipeline to simulate (default qwen2_5_omni; 'all' for the three)",
    )
    ck.add_systems_option(g)
    g.add_argument(
        "--rates",
        type=ck.number_list(ck.positive),
        help="arrival rates, req/s, each > 0 (default: workload file)",
    )
    g.add_argument(
        "--long-ratios",
        type=ck.number_list(ck.fraction),
        help="long-path shares, each 0–1 (default 0–0.6)",
    )
    g.add_argument(
        "--long-rate", type=ck.positive, help="offered load of the long-path sweep, req/s"
    )
    g.add_argument(
        "--duration", type=ck.positive, default=240.0, help="simulated s per point (240)"
    )
    g.add_argument(
        "--warmup",
        type=ck.non_negative,
        help="simulated s excluded at the start, below --duration (10 %%)",
    )
    g.add_argument("--seed", type=ck.non_negative_int, default=0)
    g.add_argument("--jobs", type=ck.positive_int, help="worker processes (default: all cores)")
    g.add_argument("--slo-multiplier", type=ck.positive, default=5.0, help="SLO = m × solo p95 (5)")
    g.add_argument(
        "--artifact",
        type=ck.artifact_file,
        help="calibration artifact JSON (default: the packaged one)",
    )
    g.add_argument(
        "--out",
        type=ck.output_dir,
        help="output folder (default horizonserve-out/bench-<ts>)",
    )
    g.add_argument("--no-plots", action="store_true", help="skip the PNG figures")
    g.add_argument("--no-progress", action="store_true", help="no progress bar")


def _overhead_arguments(parser: argparse.ArgumentParser) -> None:
    from horizonserve.runtime.bench.overhead import SIZES

    parser.add_argument("--sizes", type=ck.positive_int, nargs="+", default=list(SIZES))
    parser.add_argument(
        "--batch", type=ck.positive_int, default=16, help="prefills the base scheduler takes"
    )
    parser.add_argument("--rounds", type=ck.positive_int, default=25)
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")


def _run_overhead(args: argparse.Namespace) -> int:
    from horizonserve.runtime.bench.overhead import run_overhead, table

    result = run_overhead(tuple(args.sizes), batch=args.batch, rounds=args.rounds)
    print(json.dumps(result, indent=2) if args.json else table(result))
    return 0


def run(args: argparse.Namespace) -> int:
    if getattr(args, "_bench_target", "sweep") == "overhead":
        return _run_overhead(args)
    return _run_sweep(args)


def _run_sweep(args: argparse.Namespace) -> int:
    from horizonserve.runtime.bench.report import combined_summary, summary_table, write_report
    from horizonserve.runtime.bench.sweep import SweepConfig, run_sweep
    from horizonserve.runtime.progress import Progress, phase

    warmup = args.warmup if args.warmup is not None else 0.1 * args.duration
    if warmup >= args.duration:
        raise ValueError(
            f"--warmup {warmup:g} must be below --duration {args.duration:g}; lower it or "
            "leave it out (10 % of --duration)"
        )
    pipelines = list(PIPELINES) if args.pipeline == "all" else [args.pipeline]
    stamp = time.strftime("%Y%m%d-%H%M%S")
    root = args.out or Path("horizonserve-out") / f"bench-{stamp}"
    t0 = time.perf_counter()
    raws = {}
    for pipeline in pipelines:
        cfg = SweepConfig(
            pipeline=pipeline,
            systems=tuple(args.systems),
            rates=args.rates,
            long_ratios=args.long_ratios,
            long_sweep_rate=args.long_rate,
            duration_s=args.duration,
            warmup_s=warmup,
            seed=args.seed,
            jobs=args.jobs,
            slo_multiplier=args.slo_multiplier,
            artifact_path=args.artifact,
        )
        bar = Progress(f"simulating {pipeline}", "run", disable=args.no_progress)
        phase(
            f"horizonserve bench: {pipeline} — measuring solo p95 per class (simulated) …",
            disable=args.no_progress,
        )
        try:
            raw = run_sweep(cfg, on_total=bar.start, on_done=bar.step)
        finally:
            bar.close()
        out = root / pipeline if len(pipelines) > 1 else root
        write_report(raw, out, plots=not args.no_plots)
        print(summary_table(raw))
        print(f"results (simulated): {out.resolve()}")
        raws[pipeline] = raw
    if len(pipelines) > 1:
        print()
        print(combined_summary(raws, time.perf_counter() - t0))
        print(f"results (simulated): {root.resolve()}")
    return 0
