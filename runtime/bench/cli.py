"""`horizonserve bench`: the simulated policy sweep (default) or `bench overhead`.

horizonserve bench                      # Qwen2.5-Omni, all systems, simulated backend
horizonserve bench --pipeline all       # the three pipelines, one folder each
horizonserve bench overhead             # control-core microbenchmarks (bench.overhead)
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import time
from pathlib import Path

from horizonserve.runtime.config import PIPELINES

OVERHEAD_MODULE = "horizonserve.runtime.bench.overhead"


def _floats(text: str) -> tuple[float, ...]:
    try:
        return tuple(float(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected comma-separated numbers, got {text!r}"
        ) from None


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from horizonserve.runtime.sim.systems import SYSTEMS

    sub = parser.add_subparsers(dest="target", metavar="TARGET")
    overhead = sub.add_parser("overhead", help="microbenchmarks of the control core")
    overhead.set_defaults(_bench_target="overhead")
    with contextlib.suppress(ImportError):  # the module is owned elsewhere
        importlib.import_module(OVERHEAD_MODULE).add_arguments(overhead)
    parser.set_defaults(_bench_target="sweep")
    g = parser.add_argument_group("simulated sweep (default target)")
    g.add_argument(
        "--pipeline",
        default="qwen2_5_omni",
        choices=[*PIPELINES, "all"],
        help="pipeline to simulate (default qwen2_5_omni; 'all' for the three)",
    )
    g.add_argument(
        "--systems",
        default=",".join(SYSTEMS),
        help="comma-separated systems (default: all): " + ", ".join(SYSTEMS),
    )
    g.add_argument("--rates", type=_floats, help="arrival rates, req/s (default: workload file)")
    g.add_argument("--long-ratios", type=_floats, help="long-path shares 0–1 (default 0–0.6)")
    g.add_argument("--long-rate", type=float, help="offered load of the long-path sweep, req/s")
    g.add_argument("--duration", type=float, default=240.0, help="simulated s per point (240)")
    g.add_argument("--warmup", type=float, help="simulated s excluded at the start (10 %%)")
    g.add_argument("--seed", type=int, default=0)
    g.add_argument("--jobs", type=int, help="worker processes (default: all cores)")
    g.add_argument("--slo-multiplier", type=float, default=5.0, help="SLO = m × solo p95 (5)")
    g.add_argument("--artifact", help="calibration artifact JSON (default: the packaged one)")
    g.add_argument("--out", type=Path, help="output folder (default horizonserve-out/bench-<ts>)")
    g.add_argument("--no-plots", action="store_true", help="skip the PNG figures")
    g.add_argument("--no-progress", action="store_true", help="no progress bar")


def run(args: argparse.Namespace) -> int:
    if getattr(args, "_bench_target", "sweep") == "overhead":
        return int(importlib.import_module(OVERHEAD_MODULE).run(args) or 0)
    return _run_sweep(args)


def _run_sweep(args: argparse.Namespace) -> int:
    from horizonserve.runtime.bench.report import summary_table, write_report
    from horizonserve.runtime.bench.sweep import SweepConfig, run_sweep
    from horizonserve.runtime.sim.systems import get_system

    systems = tuple(get_system(s.strip()).name for s in args.systems.split(",") if s.strip())
    pipelines = list(PIPELINES) if args.pipeline == "all" else [args.pipeline]
    stamp = time.strftime("%Y%m%d-%H%M%S")
    root = args.out or Path("horizonserve-out") / f"bench-{stamp}"
    for pipeline in pipelines:
        cfg = SweepConfig(
            pipeline=pipeline,
            systems=systems,
            rates=args.rates,
            long_ratios=args.long_ratios,
            long_sweep_rate=args.long_rate,
            duration_s=args.duration,
            warmup_s=args.warmup if args.warmup is not None else 0.1 * args.duration,
            seed=args.seed,
            jobs=args.jobs,
            slo_multiplier=args.slo_multiplier,
            artifact_path=args.artifact,
        )
        progress = _Progress(f"simulating {pipeline}", disable=args.no_progress)
        print(f"horizonserve bench: {pipeline} — measuring solo p95 per class (simulated) …")
        raw = run_sweep(cfg, on_total=progress.start, on_done=progress.step)
        progress.close()
        out = root / pipeline if len(pipelines) > 1 else root
        write_report(raw, out, plots=not args.no_plots)
        print(summary_table(raw))
        print(f"results (simulated): {out.resolve()}")
    return 0


class _Progress:
    """A tqdm bar opened once the number of runs is known."""

    def __init__(self, desc: str, disable: bool) -> None:
        self.desc = desc
        self.disable = disable
        self.bar: object | None = None

    def start(self, total: int) -> None:
        from tqdm import tqdm

        self.bar = tqdm(total=total, desc=self.desc, unit="run", disable=self.disable, leave=False)

    def step(self, _result: object) -> None:
        if self.bar is not None:
            self.bar.update(1)  # type: ignore[attr-defined]

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()  # type: ignore[attr-defined]
