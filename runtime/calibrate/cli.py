"""`horizonserve calibrate`: measure the SLO table, SM ladder and stage costs on this GPU.

    horizonserve calibrate --pipeline qwen2_5_omni --out-dir DIR [--preset full|tiny] [--quick]

Runs the reference stage pipeline (`engine.reference`, the models' shapes with random weights)
on this machine: solo p95 first response per class (→ SLO table × multiplier), a fixed-SM sweep
of the shared stage alone and with each downstream stage co-running on the complementary SMs
(→ S_cap, ladder, S_aggr, B_sat), downstream step times per SM count, and the co-running factors
of the Vanilla and MPS sharing modes. Writes one versioned artifact
`<pipelines>--<gpu>--<driver>.json` into --out-dir (the node sidecar looks it up by model + GPU
name + driver), the raw measurements next to it (`.raw.log`, JSON), and prints a summary.
On a CPU (`--preset tiny`) the GPU-specific parts are skipped and the artifact says so; the
full-size preset is refused on a CPU unless `--allow-cpu-full` (it takes hours there).

Resumable: `--resume` keeps finished phases in `<out-dir>/<pipelines>.checkpoint.json` and skips
them when the same command runs again (a device call cut by its time limit continues); the file
is removed once the artifact is written.

    horizonserve calibrate --backend vllm-omni [--model M] [--url URL] --out-dir DIR

`--backend vllm-omni` measures the SLO table on vLLM-Omni itself instead: it starts
`vllm serve MODEL --omni` with HorizonServe off (or uses the server at --url), probes each
class alone from the client side and writes an artifact the plugin applies
(`horizonserve.runtime.calibrate.vllm_omni`).

    horizonserve calibrate fit --records RUN --out ARTIFACT [--holdout-points r10,r6-l60]

`fit` fits the contention factors the calibration cannot isolate to a measured campaign
(`horizonserve.runtime.calibrate.fit`) and writes a new artifact version with its provenance;
`--engine reference --step-constants` replays the reference engine as the campaign ran it and
first reads the step costs the calibration does not measure from the fit points' step rows.

    horizonserve calibrate rebuild --raw A.raw.log [--raw B.raw.log …] --out ARTIFACT

`rebuild` builds the artifact again from recorded raw logs (after a change of the build rules),
merging the logs of one GPU into one artifact.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import sys
import time
from pathlib import Path
from typing import Any

from horizonserve.runtime import config as cfg
from horizonserve.runtime.artifact_store import detect_gpu, find_artifact, read_raw_log
from horizonserve.runtime.calibrate.stats import MIN_SOLO_SAMPLES as MIN_SOLO

PIPELINES = ("qwen2_5_omni", "mimo_audio", "bagel")


BACKENDS = ("reference", "vllm-omni")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--backend",
        choices=BACKENDS,
        default="reference",
        help="reference: HorizonServe's reference engine (SLO table, SM ladder, stage costs); "
        "vllm-omni: the SLO table measured on vLLM-Omni itself (`vllm serve MODEL --omni`, "
        "HorizonServe off; see --model, --url)",
    )
    parser.add_argument(
        "--pipeline",
        help="pipeline(s) to calibrate, comma separated, or 'all' (default: the pipeline of "
        f"${cfg.SERVING_CONFIG_ENV}, else qwen2_5_omni)",
    )
    parser.add_argument(
        "--out-dir",
        type=Path,
        help=f"where the artifact and raw log go (default ${cfg.ARTIFACT_DIR_ENV}, else .)",
    )
    parser.add_argument(
        "--mode",
        choices=[m.value for m in cfg.CalibrationMode],
        help="auto: only when --out-dir has no artifact for this model, GPU and driver; "
        f"force: always; skip: do nothing (default ${cfg.CALIBRATION_MODE_ENV}, else force)",
    )
    parser.add_argument(
        "--preset", choices=("full", "tiny"), default="full", help="reference model sizes"
    )
    parser.add_argument("--quick", action="store_true", help="fewer SM levels and requests")
    parser.add_argument("--device", default="auto", help="auto, cpu or cuda:N (default auto)")
    parser.add_argument("--solo-requests", type=int, help="requests per class for solo p95")
    parser.add_argument("--levels", help="shared-stage SM counts to sweep, comma separated")
    parser.add_argument(
        "--no-baseline",
        action="store_true",
        help="skip the Vanilla (time-sliced) pipeline; solo runs then use the first one",
    )
    parser.add_argument(
        "--no-mps", action="store_true", help="skip the uncapped-MPS pipeline (MPS co-run factors)"
    )
    parser.add_argument(
        "--resume",
        action="store_true",
        help="keep finished phases in a checkpoint in --out-dir and skip them on a re-run",
    )
    parser.add_argument(
        "--allow-cpu-full",
        action="store_true",
        help="run the full-size preset on a CPU anyway (hours; normally refused)",
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    from horizonserve.runtime.calibrate import vllm_omni

    vllm_omni.add_arguments(parser)
    sub = parser.add_subparsers(dest="calibrate_action", metavar="ACTION")
    fit = sub.add_parser(
        "fit",
        help="fit contention factors to a measured campaign; write a new artifact version",
        description="Fit the simulator's remaining contention factors to recorded campaign "
        "runs (simulated vs measured attainment per point x system) and write the artifact.",
    )
    from horizonserve.runtime.calibrate.fit import add_fit_arguments

    add_fit_arguments(fit)
    rebuild = sub.add_parser(
        "rebuild",
        help="rebuild artifacts from recorded raw logs (no measuring); merge several into one",
        description="Build the artifact again from one or more `.raw.log` files a calibration "
        "wrote (today's build rules, the measurements unchanged). Several logs of the same GPU "
        "and driver merge into one artifact holding every pipeline.",
    )
    rebuild.add_argument(
        "--raw", type=Path, action="append", required=True, help="a .raw.log (or .raw.log.gz)"
    )
    rebuild.add_argument("--out", type=Path, required=True, help="the artifact to write (JSON)")
    rebuild.add_argument(
        "--measured-at",
        action="append",
        help="the measurement's UTC time per --raw, in order (logs written before the raw log "
        "recorded it); default: the log's own, else now",
    )


def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9.]+", "-", text.lower()).strip("-") or "unknown"


def artifact_name(pipelines: tuple[str, ...], gpu: str, driver: str) -> str:
    return f"{'-'.join(pipelines)}--{_slug(gpu)}--{_slug(driver)}"


def parse_pipelines(text: str) -> tuple[str, ...]:
    names = PIPELINES if text == "all" else tuple(p.strip() for p in text.split(",") if p.strip())
    for n in names:
        if n not in PIPELINES:
            raise ValueError(f"--pipeline: unknown pipeline {n!r}; choose from {PIPELINES}")
    if not names:
        raise ValueError("--pipeline: name at least one pipeline")
    return names


def _resolve_node_defaults(args: argparse.Namespace) -> cfg.CalibrationMode:
    """Fill --pipeline / --out-dir / --mode from the environment the operator sets."""
    serving_json = os.environ.get(cfg.SERVING_CONFIG_ENV)
    serving = cfg.ServingConfig.model_validate_json(serving_json) if serving_json else None
    if args.pipeline is None:
        args.pipeline = serving.pipeline if serving else "qwen2_5_omni"
    if args.out_dir is None:
        args.out_dir = Path(os.environ.get(cfg.ARTIFACT_DIR_ENV, "."))
    return cfg.CalibrationMode(args.mode or os.environ.get(cfg.CALIBRATION_MODE_ENV, "force"))


def _existing_artifact(pipelines: tuple[str, ...], out_dir: Path) -> Path | None:
    """An artifact in out_dir covering every pipeline on this GPU and driver, if any."""
    gpu = detect_gpu()
    if gpu is None or not out_dir.is_dir():
        return None
    found = [find_artifact(out_dir, p, cfg.load_pipeline(p).model, gpu) for p in pipelines]
    return found[0] if found and all(found) else None


class CalibrateError(ValueError):
    """A refused calibration request: one line naming the option and the fix."""


def check_environment(args: argparse.Namespace) -> str:
    """The device the run will use, or a CalibrateError saying why it cannot run here."""
    try:
        import torch
    except ImportError:
        raise CalibrateError(
            "calibrate: needs PyTorch (pip install 'horizonserve[gpu]'); it is not installed"
        ) from None
    device = args.device
    if device == "auto":
        device = "cuda:0" if torch.cuda.is_available() else "cpu"
    elif device.startswith("cuda"):
        if not torch.cuda.is_available():
            why = "this PyTorch has no CUDA" if torch.version.cuda is None else "no GPU visible"
            raise CalibrateError(f"--device {device}: {why}; use --device cpu --preset tiny")
        idx = int(device.split(":", 1)[1]) if ":" in device else 0
        if idx >= torch.cuda.device_count():
            raise CalibrateError(
                f"--device {device}: only {torch.cuda.device_count()} GPU(s) visible"
            )
    elif device != "cpu":
        raise CalibrateError(f"--device {device!r}: use auto, cpu or cuda:N")
    if device == "cpu" and args.preset == "full" and not args.allow_cpu_full:
        raise CalibrateError(
            "--preset full on a CPU takes hours: use --preset tiny, a GPU, or --allow-cpu-full"
        )
    few = args.solo_requests is not None and args.solo_requests < MIN_SOLO
    if few and not args.quick and args.preset == "full":
        raise CalibrateError(
            f"--solo-requests {args.solo_requests}: a full calibration needs at least "
            f"{MIN_SOLO} per class for its p95 (or pass --quick)"
        )
    return device


def rebuild(args: argparse.Namespace) -> int:
    """`calibrate rebuild`: artifacts from raw logs, merged into one (same GPU key)."""
    from horizonserve.runtime.calibrate.build import build_artifact, merge_artifacts

    times = args.measured_at or []
    if times and len(times) != len(args.raw):
        raise CalibrateError(
            f"--measured-at: give one per --raw ({len(args.raw)}), or none; got {len(times)}"
        )
    built, summaries = [], []
    for i, path in enumerate(args.raw):
        try:
            raw = read_raw_log(path)
        except (OSError, EOFError, UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise CalibrateError(f"--raw {path}: not a readable raw log ({exc})") from None
        if times:
            raw["measured_at"] = times[i]
        command = raw.get("command") or "horizonserve calibrate (command not recorded)"
        art, summary = build_artifact(raw, command)
        built.append(art)
        summaries.append(format_summary(summary, command))
    art = merge_artifacts(built)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(art.model_dump_json(indent=2) + "\n")
    print("\n\n".join(summaries))
    print(f"artifact: {args.out} ({', '.join(art.pipelines)}; rebuilt from {len(built)} raw logs)")
    return 0


def run(args: argparse.Namespace) -> int:
    """Dispatch to the action; its expected errors become one line and exit status 2."""
    action = getattr(args, "calibrate_action", None)
    handler: Any
    if action == "fit":
        from horizonserve.runtime.calibrate.fit import run_fit

        handler, expected = run_fit, (ValueError, FileNotFoundError)
    elif action == "rebuild":
        handler, expected = rebuild, (ValueError,)  # CalibrateError is a ValueError
    else:
        handler, expected = _run, (CalibrateError,)
    try:
        return handler(args)
    except expected as exc:
        print(f"horizonserve calibrate{f' {action}' if action else ''}: {exc}", file=sys.stderr)
        return 2


def _run(args: argparse.Namespace) -> int:
    from horizonserve.runtime.calibrate import vllm_omni

    try:
        vllm_omni.check_backend_options(args)
        mode = _resolve_node_defaults(args)
        pipelines = parse_pipelines(args.pipeline)
        if mode is cfg.CalibrationMode.SKIP:
            print("calibration skipped (mode skip)")
            return 0
        if args.backend == vllm_omni.BACKEND:
            return _run_vllm_omni(args, mode, pipelines)
    except vllm_omni.VllmOmniCalibrationError as exc:
        raise CalibrateError(str(exc)) from None
    return _run_reference(args, mode, pipelines)


def _run_vllm_omni(
    args: argparse.Namespace, mode: cfg.CalibrationMode, pipelines: tuple[str, ...]
) -> int:
    """`--backend vllm-omni`: the SLO table measured on the served engine."""
    from horizonserve.runtime.calibrate import vllm_omni

    one = len(pipelines) == 1
    found = vllm_omni.existing(args, pipelines[0], artifact_name) if one else None
    if mode is cfg.CalibrationMode.AUTO and found:
        print(f"artifact present, not calibrating again (mode auto): {found}")
        return 0
    command = "horizonserve calibrate " + " ".join(shlex.quote(a) for a in _argv())
    return vllm_omni.run(args, pipelines, command, artifact_name)


def _run_reference(
    args: argparse.Namespace, mode: cfg.CalibrationMode, pipelines: tuple[str, ...]
) -> int:
    from tqdm import tqdm

    from horizonserve.runtime.calibrate.build import build_artifact
    from horizonserve.runtime.calibrate.measure import CalibrationOptions, Calibrator

    if mode is cfg.CalibrationMode.AUTO and (found := _existing_artifact(pipelines, args.out_dir)):
        print(f"artifact present, not calibrating again (mode auto): {found}")
        return 0
    check_environment(args)
    levels = None
    if args.levels:
        levels = tuple(int(x) for x in args.levels.split(",") if x.strip())
    checkpoint = args.out_dir / f"{'-'.join(pipelines)}.checkpoint.json"
    if args.resume:
        args.out_dir.mkdir(parents=True, exist_ok=True)
    opts = CalibrationOptions(
        pipelines=pipelines,
        preset=args.preset,
        quick=args.quick,
        device=args.device,
        solo_requests=args.solo_requests,
        seed=args.seed,
        levels=levels,
        baseline=not args.no_baseline,
        mps=not args.no_mps,
        checkpoint=str(checkpoint) if args.resume else None,
        resume=args.resume,
    )
    command = "horizonserve calibrate " + " ".join(shlex.quote(a) for a in _argv())
    bar: Any = None
    t0 = time.monotonic()
    started = [False]

    def progress(label: str) -> None:
        if bar is None:
            return
        if started[0]:
            bar.update(1)
        started[0] = True
        bar.set_description_str(label)
        if args.no_progress:  # still say what runs, one line per step
            print(f"[calibrate {time.monotonic() - t0:6.1f}s] {label}", file=sys.stderr)

    try:
        cal = Calibrator(opts, progress)
    except ValueError as exc:  # a checkpoint of another run
        raise CalibrateError(str(exc)) from None
    total = Calibrator.steps_for(opts, cal.cuda)
    bar = tqdm(total=total, disable=args.no_progress, file=sys.stderr, unit="step", desc="")
    try:
        raw = cal.run()
    finally:
        bar.update(bar.total - bar.n)
        bar.close()
    raw["command"] = command
    art, summary = build_artifact(raw, command)
    out_dir: Path = args.out_dir
    out_dir.mkdir(parents=True, exist_ok=True)
    stem = artifact_name(pipelines, art.gpu.name, art.gpu.driver)
    path = out_dir / f"{stem}.json"
    path.write_text(art.model_dump_json(indent=2) + "\n")
    (out_dir / f"{stem}.raw.log").write_text(json.dumps(raw, indent=1, default=str) + "\n")
    (out_dir / f"{stem}.summary.txt").write_text(format_summary(summary, command) + "\n")
    print(format_summary(summary, command))
    print(f"artifact: {path} ({time.monotonic() - t0:.0f} s)")
    if args.resume:
        checkpoint.unlink(missing_ok=True)
    return 0


def _argv() -> list[str]:
    argv = sys.argv[1:]
    return argv[argv.index("calibrate") + 1 :] if "calibrate" in argv else argv


def _ms(x: float | None) -> str:
    return "—" if x is None else f"{x * 1e3:.2f}"


def format_summary(summary: dict[str, Any], command: str) -> str:
    """Figure-4 table (decode TPOT vs shared SMs), SLO table and ladder, as plain text."""
    gpu = summary["gpu"]
    lines = [
        f"calibration on {gpu['name']} (driver {gpu.get('driver')}, "
        f"{summary['total_sms']} SMs): {command}"
    ]
    for name, p in summary["pipelines"].items():
        lines.append(f"\n== {name}")
        iso, co = p["tpot_b8_iso_s"], p["tpot_b8_corun_s"]
        lines.append(
            f"decode TPOT, batch 8 x {p['context']} tokens (ms, p50) vs shared-stage SMs "
            f"(co-run: {p['sharing_mode']}, downstream on the other SMs):"
        )
        lines.append(f"{'SMs':>5} {'isolated':>9} {'co-run':>9} {'NVML mem':>9}")
        for s in sorted(set(iso) | set(co)):
            pr = p["pressure_corun"].get(s)
            pr_s = "—" if pr is None else f"{pr:.2f}"
            lines.append(f"{s:>5} {_ms(iso.get(s)):>9} {_ms(co.get(s)):>9} {pr_s:>9}")
        if p.get("tpot_b8_timeslice_full_s"):
            ts = _ms(p["tpot_b8_timeslice_full_s"])
            lines.append(f"whole GPU, Vanilla (no MPS, time-sliced) co-running: {ts} ms")
        lad = p["ladder"]
        lines.append(
            f"ladder {lad['levels']}  S_cap {p['s_cap']}  S_aggr {p['s_aggr']}  "
            f"S_tot {lad['total']}  B_sat {p['b_sat']}  "
            f"backlog lift {'on' if p.get('backlog_lift') else 'off'}"
        )
        lines.append(
            f"{'class':16} {'solo p95 ms':>12} {'95% CI ms':>19} {'SLO ms (x5)':>12} {'wall s':>7}"
        )
        cis, walls = p.get("solo_p95_ci_s", {}), p.get("solo_wall_s", {})
        for c, v in p["solo_p95_s"].items():
            lo, hi = cis.get(c, (None, None))
            ci = "—" if c not in cis else f"[{_ms(lo)}, {'∞' if hi is None else _ms(hi)}]"
            wall = f"{walls[c]:.1f}" if c in walls else "—"
            lines.append(f"{c:16} {v * 1e3:>12.1f} {ci:>19} {p['slo_s'][c] * 1e3:>12.1f} {wall:>7}")
    return "\n".join(lines)
