"""`horizonserve sim`: one simulated run, or capacity planning.

horizonserve sim run --system horizon --rate 5
horizonserve sim plan --target 0.9 --mix text-text=3,text-speech=1
horizonserve sim replay RUN.json   (the recorded command, at the commit that ran it)

Every --json output records its provenance (`bench.provenance.record`): the git commit, the
command line and the fully resolved ServingConfig.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from horizonserve.runtime import cli_types as ck
from horizonserve.runtime.bench.report import note
from horizonserve.runtime.config import PIPELINES

if TYPE_CHECKING:
    from horizonserve.runtime.sim.setup import SimSetup


def _mix(text: str) -> dict[str, float]:
    out: dict[str, float] = {}
    for part in text.split(","):
        if not part.strip():
            continue
        name, sep, w = part.partition("=")
        try:
            out[name.strip()] = ck.non_negative(w) if sep else 1.0
        except argparse.ArgumentTypeError as exc:
            raise argparse.ArgumentTypeError(f"weight of {name.strip()!r}: {exc}") from None
    if not any(v > 0 for v in out.values()):
        raise argparse.ArgumentTypeError("give at least one class a weight > 0")
    return out


def _common(p: argparse.ArgumentParser, *, allow_all: bool) -> None:
    choices = [*PIPELINES, "all"] if allow_all else list(PIPELINES)
    p.add_argument(
        "--pipeline",
        default="qwen2_5_omni",
        choices=choices,
        help="pipeline (default qwen2_5_omni)" + ("; 'all' for the three" if allow_all else ""),
    )
    p.add_argument(
        "--artifact",
        type=ck.artifact_file,
        help="calibration artifact JSON (default: the packaged one)",
    )
    p.add_argument("--mix", type=_mix, help="class weights, e.g. text-text=3,text-speech=1")
    p.add_argument("--long-ratio", type=ck.fraction, help="share of long-path requests (0–1)")
    p.add_argument("--seed", type=ck.non_negative_int, default=0)
    p.add_argument(
        "--burstiness",
        type=ck.positive,
        default=1.0,
        help="arrival burstiness: gamma gaps of shape b, as vLLM's serving benchmark (1: "
        "Poisson, the default; 0.25: gaps with 2x the Poisson spread)",
    )
    p.add_argument("--slo-multiplier", type=ck.positive, default=5.0, help="SLO = m × solo p95 (5)")
    p.add_argument(
        "--slo",
        choices=("measured", "artifact", "defaults"),
        default="measured",
        help="SLO from solo runs through the simulator (default), from the artifact's solo "
        "p95 (what the GPU calibration measured), or the pipeline file",
    )
    p.add_argument(
        "--slo-plan",
        type=Path,
        help="SLO table of a campaign plan (bench/eval/campaign.py plan): the targets a GPU "
        "campaign judged by, to compare with its measured capacity; overrides --slo",
    )
    p.add_argument("--json", type=ck.output_file, help="also write the result as JSON here")
    p.add_argument(
        "--control",
        type=ck.control_pair,
        action="append",
        metavar="KEY=VALUE",
        help="override a control knob (repeatable), e.g. downstream_urgency=slack: "
        "the controller a campaign ran, or a what-if",
    )


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from horizonserve.runtime.sim.systems import SYSTEMS

    sub = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    r = sub.add_parser("run", help="simulate one system at one arrival rate")
    _common(r, allow_all=False)
    r.add_argument("--system", default="horizon", choices=list(SYSTEMS))
    r.add_argument("--rate", type=ck.positive, default=5.0, help="arrival rate, req/s (> 0)")
    r.add_argument(
        "--duration", type=ck.positive, default=240.0, help="simulated seconds (> 0; 240)"
    )
    r.add_argument("--trace", action="store_true", help="include the control trace in --json")
    p = sub.add_parser("plan", help="highest sustainable rate per system at a target attainment")
    _common(p, allow_all=True)
    p.add_argument(
        "--target", type=ck.attainment, default=0.9, help="attainment target, (0, 1] (0.9)"
    )
    ck.add_systems_option(p)
    p.add_argument("--requests", type=ck.positive_int, help="requests per evaluation (1500)")
    p.add_argument(
        "--point-s",
        type=ck.positive,
        help="instead of --requests: every rate's point is this many seconds of arrivals at "
        "its own rate, as a GPU campaign's points are (e.g. 120)",
    )
    p.add_argument(
        "--seeds",
        type=ck.positive_int,
        default=1,
        help="points per rate, from seeds --seed, --seed+1, ...: a rate's attainment is their "
        "mean (1; several for short --point-s points, which one seed leaves noisy)",
    )
    p.add_argument(
        "--warmup-s",
        type=ck.non_negative,
        default=0.0,
        help="with --point-s: the point's first seconds, simulated but not scored (0: every "
        "request scored, as a campaign's attainment column)",
    )
    p.add_argument(
        "--tol",
        type=ck.bounded(0.0, 1.0, low_open=True, high_open=True),
        default=0.02,
        help="relative bracket width, (0, 1) (0.02)",
    )
    p.add_argument("--start", type=ck.positive, default=1.0, help="first rate tried, req/s")
    p.add_argument("--jobs", type=ck.positive_int, help="worker processes (default: all cores)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    rp = sub.add_parser(
        "replay", help="run a recorded simulation again with the code of the commit that ran it"
    )
    rp.add_argument("record", type=Path, help="a `sim run --json` output")


def artifact_info(path: str | None) -> dict[str, Any]:
    """Which calibration artifact a run used, as the reports name it."""
    from horizonserve.runtime.artifact import DEFAULT_ARTIFACT, load_artifact

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


def _setup(args: argparse.Namespace, pipeline: str) -> tuple[Any, Any, dict[str, float]]:
    from horizonserve.runtime.artifact import load_artifact
    from horizonserve.runtime.sim.setup import SimSetup
    from horizonserve.runtime.sim.solo import measure_solo_p95, solo_source
    from horizonserve.runtime.workload import load_workload, mix_weights

    art = load_artifact(args.artifact)
    setup = SimSetup.load(pipeline, art)
    workload = load_workload(pipeline)
    mix = mix_weights(workload, setup.long_classes, args.long_ratio, args.mix)
    if args.control:
        from dataclasses import replace

        from horizonserve.runtime.config import control_with

        try:
            setup = replace(setup, control=control_with(setup.control, dict(args.control)))
        except ValueError as exc:
            raise ValueError(f"--control {exc}") from None
    if getattr(args, "slo_plan", None) is not None:
        setup = _plan_slo(setup, args.slo_plan, pipeline)
    elif args.slo == "measured":
        p95 = measure_solo_p95(setup, workload, seed=args.seed, n=200)
        setup = setup.with_solo_p95(p95, solo_source(200, args.seed), args.slo_multiplier)
    elif args.slo == "artifact":
        where = f"the artifact {artifact_info(args.artifact)['file']}"
        try:
            setup = setup.with_calibrated_slo(art.pipeline(pipeline), where, args.slo_multiplier)
        except ValueError as exc:
            raise ValueError(
                f"--slo artifact: {exc}; use --slo measured (simulated solo runs) or calibrate them"
            ) from None
    return setup, workload, mix


def _plan_slo(setup: SimSetup, path: Path, pipeline: str) -> SimSetup:
    """`setup` judged by the SLO table a campaign plan recorded (its classes and multiplier)."""
    from horizonserve.runtime.calibrate.records import load_plan, plan_campaign

    try:
        plan = plan_campaign(load_plan(path), str(path))
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ValueError(f"--slo-plan {path}: not a campaign plan ({exc})") from None
    if plan.pipeline != pipeline:
        raise ValueError(f"--slo-plan {path}: a {plan.pipeline} plan, not {pipeline}")
    missing = sorted({c.name for c in setup.slo.classes} - set(plan.targets_s))
    if missing:
        raise ValueError(f"--slo-plan {path}: no SLO for {missing}")
    p95 = {k: v / plan.multiplier for k, v in plan.targets_s.items()}
    return setup.with_solo_p95(p95, f"the SLO table of {path}", plan.multiplier)


def run(args: argparse.Namespace) -> int:
    if args.action == "replay":
        return _replay(args.record)
    return _run(args) if args.action == "run" else _plan(args)


def _replay(path: Path) -> int:
    """The recorded `sim run` again at its commit; 0 when every class's attainment matches."""
    import tempfile

    from horizonserve.runtime.bench.provenance import run_at

    try:
        data = json.loads(path.read_text())
        prov = data["provenance"]
        commit, argv = prov["commit"], list(prov["argv"])
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ValueError(f"{path}: not a recorded `sim run --json` output ({exc})") from None
    if commit is None or argv[:2] != ["sim", "run"]:
        raise ValueError(f"{path}: records no commit or no `sim run` command; cannot replay it")
    if prov.get("dirty"):
        print(f"note: {path} ran with uncommitted changes to {commit[:12]}; they are not replayed")
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "replay.json"
        argv = [*_without_json(argv), "--json", str(out)]
        proc = run_at(commit, argv)
        if proc.returncode != 0 or not out.exists():
            print(proc.stdout + proc.stderr, file=sys.stderr)
            raise ValueError(f"replay at {commit[:12]} failed (exit {proc.returncode})")
        again = json.loads(out.read_text())
    was, now = _attainment(data), _attainment(again)
    print(f"replayed {path} at {commit[:12]}: {' '.join(argv[:-2])}")
    print(f"{'class':<22}{'recorded':>10}{'replayed':>10}")
    for name in sorted(set(was) | set(now)):
        print(f"{name:<22}{_p(was.get(name)):>10}{_p(now.get(name)):>10}")
    same = was == now
    print("same per-class attainment" if same else "DIFFERS from the record")
    return 0 if same else 1


def _without_json(argv: list[str]) -> list[str]:
    out: list[str] = []
    skip = False
    for a in argv:
        if skip:
            skip = False
        elif a == "--json":
            skip = True
        elif not a.startswith("--json="):
            out.append(a)
    return out


def _attainment(data: dict[str, Any]) -> dict[str, float | None]:
    return {k: c["attainment"] for k, c in data["summary"]["classes"].items()}


def _dump(path: Path | None, data: dict[str, Any]) -> None:
    if path is None:
        return
    from horizonserve.runtime.bench.report import clean_json

    path.write_text(json.dumps(clean_json(data), indent=1, allow_nan=False) + "\n")
    print(f"wrote {path}")


def _burst_txt(args: argparse.Namespace) -> str:
    return "" if args.burstiness == 1.0 else f", burstiness {args.burstiness:g}"


def _run(args: argparse.Namespace) -> int:
    from horizonserve.runtime.bench.metrics import summarize
    from horizonserve.runtime.sim.engine import simulate
    from horizonserve.runtime.workload import generate

    setup, workload, mix = _setup(args, args.pipeline)
    trace = generate(
        workload,
        mix,
        rate=args.rate,
        duration_s=args.duration,
        warmup_s=0.1 * args.duration,
        seed=args.seed,
        burstiness=args.burstiness,
    )
    result = simulate(setup, trace, args.system, seed=args.seed, record_trace=args.trace)
    s = summarize(result)
    st = result.stats
    print(
        f"SIMULATED {args.pipeline} / {args.system} at {args.rate:g} req/s, "
        f"{args.duration:g} s, seed {args.seed}{_burst_txt(args)}: attainment "
        f"{_p(s['attainment'])} "
        f"(short-path {_p(s['short_attainment'])}, long-path {_p(s['long_attainment'])}), "
        f"goodput {s['goodput_rps']:.2f} req/s, TPOT p50/p95 {_ms(s['tpot_p50_ms'])}/"
        f"{_ms(s['tpot_p95_ms'])} ms"
    )
    print(artifact_line(artifact_info(args.artifact)))
    print(f"{'class':<22}{'n':>6}{'attain':>9}{'p50 s':>9}{'p95 s':>9}{'SLO s':>9}")
    for name, c in s["classes"].items():
        print(
            f"{name:<22}{c['requests']:>6}{_p(c['attainment']):>9}{_s(c['p50_s']):>9}"
            f"{_s(c['p95_s']):>9}{c['target_s']:>9.3f}"
        )
    print(note(RUN_COLUMNS))
    print(
        f"speed {st['speed_x']:.0f}x real time ({st['sim_s']:.0f} simulated s in "
        f"{st['wall_s']:.2f} s); shared stage busy {st['shared_busy_frac']:.0%} of the time, "
        f"downstream stages co-running with it {st['corun_frac']:.0%}"
    )
    if not s["classes"] or all(c["requests"] == 0 for c in s["classes"].values()):
        print(
            "note: no request arrived after the warm-up; raise --duration or --rate",
            file=sys.stderr,
        )
    data = result.to_json()
    data["summary"] = s
    data["provenance"] = {**_provenance(setup, args.system), "argv": _run_argv(args)}
    _dump(args.json, data)
    return 0


def _run_argv(args: argparse.Namespace) -> list[str]:
    """The `sim run` command line that runs `args` again (every option spelled out)."""
    argv = ["sim", "run", "--pipeline", args.pipeline, "--system", args.system]
    argv += ["--rate", repr(args.rate), "--duration", repr(args.duration)]
    argv += ["--seed", str(args.seed), "--burstiness", repr(args.burstiness)]
    argv += ["--slo-multiplier", repr(args.slo_multiplier), "--slo", args.slo]
    if args.artifact:
        argv += ["--artifact", str(args.artifact)]
    if args.mix:
        argv += ["--mix", ",".join(f"{k}={v!r}" for k, v in args.mix.items())]
    if args.long_ratio is not None:
        argv += ["--long-ratio", repr(args.long_ratio)]
    if getattr(args, "slo_plan", None) is not None:
        argv += ["--slo-plan", str(args.slo_plan)]
    for key, value in args.control or ():
        argv += ["--control", f"{key}={value}"]
    if args.trace:
        argv.append("--trace")
    return argv


def _provenance(setup: Any, system: str) -> dict[str, Any]:
    from horizonserve.runtime.bench.provenance import record
    from horizonserve.runtime.sim.systems import get_system

    return record(setup.serving_config(get_system(system).policy))


RUN_COLUMNS = (
    "columns: n = requests of the class that arrived after the warm-up (first 10 %); "
    "attain = share answered within the class's SLO; p50 s / p95 s = first-response latency "
    "(∞: some never answered within the run); SLO s = the class's first-response target"
)
PLAN_COLUMNS = (
    "columns: sustains req/s = highest arrival rate simulated at or above the target; "
    "attain = its attainment; fails at req/s = a rate just above it simulated below the target "
    "(–: none found up to 10^4 req/s); attain = attainment there; runs = simulations the "
    "search took"
)


def _plan(args: argparse.Namespace) -> int:
    """One plan per pipeline (`--pipeline all`: the three, then a combined table)."""
    _check_points(args)
    pipelines = list(PIPELINES) if args.pipeline == "all" else [args.pipeline]
    t0 = time.perf_counter()
    plans = {p: _plan_one(args, p, len(pipelines) > 1) for p in pipelines}
    if len(pipelines) > 1:
        print()
        print(combined_plan_table(plans, args.target, time.perf_counter() - t0))
    if args.json is not None:
        data = plans[pipelines[0]] if len(pipelines) == 1 else {"pipelines": plans}
        _dump(args.json, data)
    return 0


def _plan_one(args: argparse.Namespace, pipeline: str, several: bool) -> dict[str, Any]:
    from horizonserve.runtime.progress import Progress, phase
    from horizonserve.runtime.sim.plan import plan

    t0 = time.perf_counter()
    quiet = args.no_progress
    if args.slo == "measured":
        phase(f"{pipeline}: measuring each class's solo p95 (simulated) …", disable=quiet)
    setup, workload, mix = _setup(args, pipeline)
    systems = list(args.systems)
    unit = _plan_unit(args, workload, mix)
    bar = Progress(f"planning {pipeline}", "system", disable=quiet)
    bar.start(len(systems))
    try:
        results = plan(
            setup,
            unit,
            systems,
            target=args.target,
            tol=args.tol,
            start=args.start,
            seed=args.seed,
            jobs=args.jobs or os.cpu_count() or 1,
            on_done=bar.step,
        )
    finally:
        bar.close()
    wall = time.perf_counter() - t0
    mix_txt = ", ".join(f"{k} {v:.0%}" for k, v in mix.items() if v > 0)
    if several:
        print()
    print(
        f"SIMULATED capacity plan — {pipeline}, target {args.target:.0%} SLO attainment "
        f"(SLO = {setup.slo.multiplier:g} x solo p95), {_points_txt(args)}, "
        f"{_seeds_txt(args)}, tolerance {args.tol:.0%}{_burst_txt(args)}\nmix: {mix_txt}\n"
        f"SLO table: {setup.slo_source}"
    )
    info = artifact_info(args.artifact)
    print(artifact_line(info))
    overrides = dict(args.control or ())
    if overrides:
        print("control overrides: " + ", ".join(f"{k}={v}" for k, v in overrides.items()))
    width = max(len("system"), *(len(s) for s in systems)) + 2
    print(
        f"{'system':<{width}}{'sustains req/s':>15}{'attain':>8}{'fails at req/s':>16}"
        f"{'attain':>8}{'runs':>6}"
    )
    for r in sorted(results, key=lambda r: -r.rate_ok):
        fail = "–" if r.rate_fail == float("inf") else f"{r.rate_fail:.3f}"
        print(
            f"{r.system:<{width}}{r.rate_ok:>15.3f}{_p(r.attainment_ok):>8}"
            f"{fail:>16}{_p(r.attainment_fail):>8}{len(r.evaluations):>6}"
        )
    print(note(PLAN_COLUMNS))
    evals = sum(len(r.evaluations) for r in results)
    print(f"{evals} simulated runs in {wall:.1f} s (wall, incl. solo SLO measurement)")
    return {
        "label": "simulated",
        "pipeline": pipeline,
        "artifact": info,
        "target": args.target,
        "mix": mix,
        "slo_targets_s": setup.targets(),
        "slo_source": setup.slo_source,
        "requests": None if args.point_s else args.requests,
        "point_s": args.point_s,
        "warmup_s": args.warmup_s if args.point_s else None,
        "tol": args.tol,
        "seed": args.seed,
        "seeds": args.seeds,
        "burstiness": args.burstiness,
        "control_overrides": overrides,
        "provenance": {
            **_provenance(setup, "horizon"),
            "systems": {s: _provenance(setup, s)["serving_config"]["control"] for s in systems},
        },
        "wall_s": wall,
        "systems": [r.to_json() for r in results],
    }


DEFAULT_PLAN_REQUESTS = 1500  # requests in the unit trace a plan compresses to each rate


def _check_points(args: argparse.Namespace) -> None:
    """The point options that only make sense together, refused before any simulation; fills
    in `--requests`' default where the points are request counts."""
    if args.point_s is not None and args.requests is not None:
        raise ValueError(
            "--requests and --point-s both size the points; give one (--point-s: seconds of "
            "arrivals at each rate, as a campaign's)"
        )
    if args.point_s is None:
        args.requests = args.requests or DEFAULT_PLAN_REQUESTS
        if args.warmup_s:
            raise ValueError("--warmup-s applies to --point-s points only; give --point-s too")
    elif args.warmup_s >= args.point_s:
        raise ValueError(
            f"--warmup-s {args.warmup_s:g} leaves nothing of --point-s {args.point_s:g} "
            "to score; give a warm-up shorter than the point"
        )


def _plan_unit(args: argparse.Namespace, workload: Any, mix: dict[str, float]) -> Any:
    """Where each evaluated rate's point comes from: one unit-rate trace of `--requests`
    compressed to each rate (its first 10 % not scored), or, with `--point-s`, a point of that
    length at every rate (`sim.plan.SteadyTraces`); with `--seeds` > 1, one per seed."""
    from dataclasses import replace

    from horizonserve.runtime.sim.plan import SeedPanel, SteadyState, SteadyTraces
    from horizonserve.runtime.workload import generate

    def one(seed: int) -> Any:
        if args.point_s is not None:
            steady = SteadyState(warmup_s=args.warmup_s, window_s=args.point_s - args.warmup_s)
            return SteadyTraces(workload, mix, seed=seed, steady=steady, burstiness=args.burstiness)
        unit = generate(
            workload, mix, rate=1.0, n_requests=args.requests, seed=seed,
            burstiness=args.burstiness,
        )  # fmt: skip
        return replace(unit, warmup_s=0.1 * unit.duration_s)

    seeds = tuple(range(args.seed, args.seed + args.seeds))
    if len(seeds) == 1:
        return one(args.seed)
    return SeedPanel(tuple(one(k) for k in seeds), seeds)


def _seeds_txt(args: argparse.Namespace) -> str:
    if args.seeds == 1:
        return f"seed {args.seed}"
    return f"mean of seeds {args.seed}–{args.seed + args.seeds - 1}"


def _points_txt(args: argparse.Namespace) -> str:
    if args.point_s is None:
        return f"{args.requests} requests"
    scored = f"first {args.warmup_s:g} s not scored" if args.warmup_s else "all scored"
    return f"{args.point_s:g}-s points ({scored})"


def combined_plan_table(plans: dict[str, dict[str, Any]], target: float, wall: float) -> str:
    """Sustained req/s per system (rows) and pipeline (columns), one line per system."""
    pipelines = list(plans)
    systems = list(dict.fromkeys(r["system"] for p in plans.values() for r in p["systems"]))
    rate = {(p, r["system"]): r["rate_ok"] for p, d in plans.items() for r in d["systems"]}
    width = max(len("system"), *(len(s) for s in systems)) + 2
    cols = [max(len(p), 8) + 2 for p in pipelines]
    lines = [
        f"SIMULATED capacity plan, all pipelines — sustained req/s at {target:.0%} attainment",
        f"{'system':<{width}}" + "".join(f"{p:>{w}}" for p, w in zip(pipelines, cols, strict=True)),
    ]
    for s in systems:
        cells = [
            f"{rate[(p, s)]:>{w}.3f}" if (p, s) in rate else f"{'–':>{w}}"
            for p, w in zip(pipelines, cols, strict=True)
        ]
        lines.append(f"{s:<{width}}" + "".join(cells))
    lines.append(
        note(
            "columns: each pipeline's highest arrival rate (req/s) simulated at or above the target"
        )
    )
    lines.append(f"wall: {wall:.1f} s for the {len(pipelines)} pipelines")
    return "\n".join(lines)


def _p(v: float | None) -> str:
    return "–" if v is None else f"{100 * v:.1f}%"


def _s(v: float | None) -> str:
    return "∞" if v is None else f"{v:.3f}"


def _ms(v: float | None) -> str:
    return "–" if v is None else f"{v:.2f}"
