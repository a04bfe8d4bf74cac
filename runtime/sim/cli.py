"""`horizonserve sim`: one simulated run, or capacity planning.

horizonserve sim run --system horizon --rate 5
horizonserve sim plan --target 0.9 --mix text-text=3,text-speech=1
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

from horizonserve.runtime.config import PIPELINES


def _mix(text: str) -> dict[str, float]:
    out: dict[str, float] = {}
    for part in text.split(","):
        if not part.strip():
            continue
        name, sep, w = part.partition("=")
        try:
            out[name.strip()] = float(w) if sep else 1.0
        except ValueError:
            raise argparse.ArgumentTypeError(f"mix: bad weight in {part!r}") from None
    return out


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--pipeline", default="qwen2_5_omni", choices=PIPELINES)
    p.add_argument("--artifact", help="calibration artifact JSON (default: the packaged one)")
    p.add_argument("--mix", type=_mix, help="class weights, e.g. text-text=3,text-speech=1")
    p.add_argument("--long-ratio", type=float, help="share of long-path requests (0–1)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--slo-multiplier", type=float, default=5.0)
    p.add_argument(
        "--slo",
        choices=("measured", "defaults"),
        default="measured",
        help="SLO from solo runs through the simulator (default) or the pipeline file",
    )
    p.add_argument("--json", type=Path, help="also write the result as JSON here")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from horizonserve.runtime.sim.systems import SYSTEMS

    sub = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    r = sub.add_parser("run", help="simulate one system at one arrival rate")
    _common(r)
    r.add_argument("--system", default="horizon", choices=list(SYSTEMS))
    r.add_argument("--rate", type=float, default=5.0, help="arrival rate, req/s")
    r.add_argument("--duration", type=float, default=240.0, help="simulated seconds")
    r.add_argument("--trace", action="store_true", help="include the control trace in --json")
    p = sub.add_parser("plan", help="highest sustainable rate per system at a target attainment")
    _common(p)
    p.add_argument("--target", type=float, default=0.9, help="attainment target (0.9)")
    p.add_argument("--systems", default=",".join(SYSTEMS), help="comma-separated systems")
    p.add_argument("--requests", type=int, default=1500, help="requests per evaluation (1500)")
    p.add_argument("--tol", type=float, default=0.02, help="relative bracket width (0.02)")
    p.add_argument("--start", type=float, default=1.0, help="first rate tried, req/s")
    p.add_argument("--jobs", type=int, help="worker processes (default: all cores)")


def artifact_info(path: str | None) -> dict[str, Any]:
    """Which calibration artifact a run used, as the reports name it."""
    from horizonserve.runtime.calibrate.artifact import DEFAULT_ARTIFACT, load_artifact

    art = load_artifact(path)
    return {
        "file": path or f"runtime/data/calibration/{DEFAULT_ARTIFACT}",
        "measured": art.source.startswith("measured"),
        "gpu": f"{art.gpu.name}|{art.gpu.driver}|{art.gpu.sm_count}",
    }


def artifact_line(info: dict[str, Any]) -> str:
    kind = (
        "measured on the GPU by horizonserve calibrate"
        if info["measured"]
        else "ESTIMATE, not a GPU calibration"
    )
    return f"calibration artifact: {info['file']} ({kind}; {info['gpu']})"


def _setup(args: argparse.Namespace) -> tuple[Any, Any, dict[str, float]]:
    from horizonserve.runtime.calibrate.artifact import load_artifact
    from horizonserve.runtime.sim.setup import SimSetup
    from horizonserve.runtime.sim.solo import measure_solo_p95, solo_source
    from horizonserve.runtime.workload import load_workload, mix_weights

    setup = SimSetup.load(args.pipeline, load_artifact(args.artifact))
    workload = load_workload(args.pipeline)
    if args.slo == "measured":
        p95 = measure_solo_p95(setup, workload, seed=args.seed, n=200)
        setup = setup.with_solo_p95(p95, solo_source(200, args.seed), args.slo_multiplier)
    mix = mix_weights(workload, setup.long_classes, args.long_ratio, args.mix)
    return setup, workload, mix


def run(args: argparse.Namespace) -> int:
    return _run(args) if args.action == "run" else _plan(args)


def _dump(path: Path | None, data: dict[str, Any]) -> None:
    if path is None:
        return
    from horizonserve.runtime.bench.report import clean_json

    path.write_text(json.dumps(clean_json(data), indent=1, allow_nan=False) + "\n")
    print(f"wrote {path}")


def _run(args: argparse.Namespace) -> int:
    from horizonserve.runtime.bench.metrics import summarize
    from horizonserve.runtime.sim.engine import simulate
    from horizonserve.runtime.workload import generate

    setup, workload, mix = _setup(args)
    trace = generate(
        workload,
        mix,
        rate=args.rate,
        duration_s=args.duration,
        warmup_s=0.1 * args.duration,
        seed=args.seed,
    )
    result = simulate(setup, trace, args.system, seed=args.seed, record_trace=args.trace)
    s = summarize(result)
    st = result.stats
    print(
        f"SIMULATED {args.pipeline} / {args.system} at {args.rate:g} req/s, "
        f"{args.duration:g} s, seed {args.seed}: attainment {_p(s['attainment'])} "
        f"(short {_p(s['short_attainment'])}, long {_p(s['long_attainment'])}), goodput "
        f"{s['goodput_rps']:.2f} req/s, TPOT p50/p95 {_ms(s['tpot_p50_ms'])}/"
        f"{_ms(s['tpot_p95_ms'])} ms"
    )
    print(artifact_line(artifact_info(args.artifact)))
    print(f"{'class':<22}{'n':>6}{'attain':>9}{'p50 s':>9}{'p95 s':>9}{'SLO s':>9}")
    for name, c in s["classes"].items():
        print(
            f"{name:<22}{c['requests']:>6}{_p(c['attainment']):>9}{_s(c['p50_s']):>9}"
            f"{_s(c['p95_s']):>9}{c['target_s']:>9.3f}"
        )
    print(
        f"speed {st['speed_x']:.0f}x real time ({st['sim_s']:.0f} simulated s in "
        f"{st['wall_s']:.2f} s); shared busy {st['shared_busy_frac']:.0%}, co-running "
        f"{st['corun_frac']:.0%}"
    )
    data = result.to_json()
    data["summary"] = s
    _dump(args.json, data)
    return 0


def _plan(args: argparse.Namespace) -> int:
    from dataclasses import replace

    from horizonserve.runtime.sim.plan import plan
    from horizonserve.runtime.sim.systems import get_system
    from horizonserve.runtime.workload import generate

    t0 = time.perf_counter()
    setup, workload, mix = _setup(args)
    systems = [get_system(s.strip()).name for s in args.systems.split(",") if s.strip()]
    unit = generate(workload, mix, rate=1.0, n_requests=args.requests, seed=args.seed)
    unit = replace(unit, warmup_s=0.1 * unit.duration_s)
    import os

    results = plan(
        setup,
        unit,
        systems,
        target=args.target,
        tol=args.tol,
        start=args.start,
        seed=args.seed,
        jobs=args.jobs or os.cpu_count() or 1,
    )
    wall = time.perf_counter() - t0
    mix_txt = ", ".join(f"{k} {v:.0%}" for k, v in mix.items() if v > 0)
    print(
        f"SIMULATED capacity plan — {args.pipeline}, target {args.target:.0%} SLO attainment "
        f"(SLO = {setup.slo.multiplier:g} x solo p95), {args.requests} requests, seed "
        f"{args.seed}, tolerance {args.tol:.0%}\nmix: {mix_txt}"
    )
    info = artifact_info(args.artifact)
    print(artifact_line(info))
    print(
        f"{'system':<24}{'sustains req/s':>15}{'attain':>8}{'fails at':>10}{'attain':>8}{'runs':>6}"
    )
    for r in sorted(results, key=lambda r: -r.rate_ok):
        fail = "–" if r.rate_fail == float("inf") else f"{r.rate_fail:.3f}"
        print(
            f"{get_system(r.system).label:<24}{r.rate_ok:>15.3f}{_p(r.attainment_ok):>8}"
            f"{fail:>10}{_p(r.attainment_fail):>8}{len(r.evaluations):>6}"
        )
    evals = sum(len(r.evaluations) for r in results)
    print(f"{evals} simulated runs in {wall:.1f} s (wall, incl. solo SLO measurement)")
    _dump(
        args.json,
        {
            "label": "simulated",
            "pipeline": args.pipeline,
            "artifact": info,
            "target": args.target,
            "mix": mix,
            "slo_targets_s": setup.targets(),
            "slo_source": setup.slo_source,
            "requests": args.requests,
            "tol": args.tol,
            "seed": args.seed,
            "wall_s": wall,
            "systems": [r.to_json() for r in results],
        },
    )
    return 0


def _p(v: float | None) -> str:
    return "–" if v is None else f"{100 * v:.1f}%"


def _s(v: float | None) -> str:
    return "∞" if v is None else f"{v:.3f}"


def _ms(v: float | None) -> str:
    return "–" if v is None else f"{v:.2f}"
