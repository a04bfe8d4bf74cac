"""`horizonserve calibrate --backend vllm-omni`: the SLO table measured on vLLM-Omni itself.

    horizonserve calibrate --backend vllm-omni [--model M] [--pipeline P] [--out-dir DIR]
        [--url URL | --vllm-command CMD --serve-args ARGS] [--classes a,b] [--solo-requests N]

Starts `vllm serve <model> --omni` (the serving container's command; `--serve-args` appends
to it, e.g. a deploy file) with HorizonServe off (HORIZONSERVE_VLLM=0), or uses the server at
`--url`. Each class is then probed alone: `--warmup` unmeasured requests, then
`--solo-requests` measured ones, one at a time (the next is sent when the previous stream has
ended). The first-response latency is taken at the client from the streamed chat completion:
from sending the request to the first event carrying the class metric's output (ttft: a text
token, ttfo: an audio chunk, e2e: the image). Nothing here imports vLLM: the process talks
HTTP, so a GPU node and a CPU machine run the same code; only the started command differs.

The same streams give the shared stage's (thinker's) decode time per output token: per request,
the mean of the inter-token latencies the engine itself reports for stage 0 in the stream
(`return_stage_metrics`; vLLM's TPOT), else the client's first to last text delta over the
answer tokens after the first; nearest-rank p50 / p95 over the class's requests (every
interval, both views, is in the raw log); and the answer length (`usage.completion_tokens`).
The probing (HTTP/SSE, the started server) is `vllm_omni_probe`; this module builds the
artifact.

Writes `<pipeline>--<gpu>--<driver>--vllm-omni.json` into --out-dir: a `CalibrationArtifact`
whose `solo_p95_s` holds the measured classes (nearest-rank p95, as the reference calibration
takes it). The plugin applies it as it applies any artifact (`settings.resolve_config`:
`HORIZONSERVE_CALIBRATION_ARTIFACT`, or the newest match for model + GPU + driver in
`HORIZONSERVE_ARTIFACT_DIR`): measured classes get their solo p95, so their SLO targets;
classes not measured keep the ServingConfig's. The per-token time sets the level of
`shared.decode_step_s` (the p50 of the text-answer classes; its shape over SM counts is
borrowed), and each class's p50 / p95 and answer lengths are in `notes`
(`profile.<class>.tpot_s`, `profile.<class>.answer_tokens`): the artifact schema has no
per-class profile fields. The fields this calibration does not measure (ladder, B_sat, the
other stage costs) are carried over from the newest reference-calibration artifact for this
pipeline and GPU in --out-dir (`--backend reference` measured them here), else from the
shipped estimate; `notes` and `source` say which.
Beside it: `.raw.log` (every sample, the requests and the server command), `.summary.txt`,
and the server's own log `.serve.log` when this command started it.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import platform
import shlex
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from horizonserve.runtime import config as cfg
from horizonserve.runtime.artifact import (
    ESTIMATE_ARTIFACT,
    CalibrationArtifact,
    GpuKey,
    PipelineCalibration,
    SmCurve,
    load_artifact,
    load_packaged,
)
from horizonserve.runtime.calibrate.derive import p95
from horizonserve.runtime.calibrate.stats import nearest_rank, quantile_ci
from horizonserve.runtime.calibrate.vllm_omni_probe import (
    INPUTS,
    ProbeSettings,
    Server,
    StartedServer,
    VllmOmniCalibrationError,
    _free_port,
    measure,
    probes_for,
    serve_command,
    served_models,
)
from horizonserve.runtime.engine.vllm_omni.settings import deploy_file

__all__ = ["BACKEND", "VllmOmniCalibrationError", "add_arguments", "check_backend_options", "run"]

BACKEND = "vllm-omni"
SUFFIX = "--vllm-omni"  # artifact stem suffix: never overwrites the reference calibration's
CARRIED_FIELDS = ("ladder", "b_sat", "shared", "downstream", "sharing", "pressure")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of `--backend vllm-omni` (refused with the reference backend)."""
    g = parser.add_argument_group("--backend vllm-omni")
    g.add_argument(
        "--model",
        help="model to serve, id or directory (default: the ServingConfig's, else the "
        "pipeline's); with --url: the served model (default: the server's only one)",
    )
    g.add_argument("--url", help="calibrate the vLLM-Omni server at this URL (started by you)")
    g.add_argument(
        "--vllm-command",
        help="how to run vLLM (default: `vllm` from PATH), e.g. '/opt/venv/bin/vllm'",
    )
    g.add_argument(
        "--serve-args",
        help="more arguments for `vllm serve MODEL --omni`, one string, e.g. "
        "--serve-args='--deploy-config deploy.yaml'",
    )
    g.add_argument(
        "--classes",
        help="classes to probe, comma separated (default: every class of the pipeline whose "
        f"input is one of {', '.join(INPUTS)})",
    )
    g.add_argument("--warmup", type=int, help="unmeasured requests per class first (default 2)")
    g.add_argument("--max-tokens", type=int, help="answer length cap of a probe (default 128)")
    g.add_argument(
        "--min-tokens",
        type=int,
        help="fixed answer length for random-weight models (default: the model decides)",
    )
    g.add_argument(
        "--start-timeout", type=float, help="seconds the server may take to start (default 900)"
    )
    g.add_argument("--request-timeout", type=float, help="seconds one probe may take (default 600)")


# Options that only one backend reads: a value given for the other is refused.
OWN_OPTIONS = (
    "model", "url", "vllm_command", "serve_args", "classes", "warmup", "max_tokens",
    "min_tokens", "start_timeout", "request_timeout",
)  # fmt: skip
REFERENCE_ONLY = ("levels", "resume", "no_mps", "no_baseline", "allow_cpu_full")


def option(name: str) -> str:
    return "--" + name.replace("_", "-")


def check_backend_options(args: argparse.Namespace) -> None:
    """Refuse an option the chosen backend does not read (naming it)."""
    if args.backend == BACKEND:
        given = [n for n in REFERENCE_ONLY if getattr(args, n, None)]
        if args.device != "auto":
            given.append("device")
        if given:
            raise VllmOmniCalibrationError(
                f"{option(given[0])}: an option of the reference backend; --backend vllm-omni "
                "measures the served engine (leave it out)"
            )
        return
    given = [n for n in OWN_OPTIONS if getattr(args, n, None) is not None]
    if given:
        raise VllmOmniCalibrationError(
            f"{option(given[0])}: an option of --backend vllm-omni (the default backend is "
            "the reference engine)"
        )


# -- the artifact ------------------------------------------------------------------------------


def gpu_key() -> GpuKey:
    """The key of this machine's GPU (NVML name and driver; SMs and memory from PyTorch), or a
    CPU key (the estimate's SM count: no ladder is measured there)."""
    from horizonserve.runtime.artifact_store import detect_gpu

    tpl = load_packaged(ESTIMATE_ARTIFACT).gpu
    gpu = detect_gpu()
    if gpu is None:
        return GpuKey(
            name=f"cpu ({platform.machine()})",
            driver="unknown",
            sm_count=tpl.sm_count,
            memory_gib=tpl.memory_gib,
        )
    sms, mem = _cuda_props()
    if sms is None:
        if gpu.name != tpl.name:
            raise VllmOmniCalibrationError(
                f"cannot read the SM count of {gpu.name} (the artifact is keyed by it): "
                "needs PyTorch with CUDA here (pip install 'horizonserve[gpu]')"
            )
        sms, mem = tpl.sm_count, tpl.memory_gib
    return GpuKey(name=gpu.name, driver=gpu.driver, sm_count=sms, memory_gib=mem)


def _cuda_props() -> tuple[int | None, float]:
    try:
        import torch

        if not torch.cuda.is_available():
            return None, 0.0
        props = torch.cuda.get_device_properties(0)
        return int(props.multi_processor_count), round(props.total_memory / 2**30, 2)
    except ImportError:
        return None, 0.0


def base_entry(out_dir: Path, pipeline: str, key: GpuKey) -> tuple[PipelineCalibration, str]:
    """Where the fields this calibration does not measure come from, and its name: the newest
    reference-calibration artifact in `out_dir` for this pipeline on this GPU (name, driver,
    SMs: its ladder, B_sat and stage costs were measured here), else the shipped estimate."""
    found = []
    for path in sorted(out_dir.glob("*.json")) if out_dir.is_dir() else []:
        if path.name.endswith(SUFFIX + ".json"):
            continue
        try:
            art = load_artifact(path)
        except (OSError, ValueError):  # a checkpoint, another JSON file
            continue
        entry = art.pipelines.get(pipeline)
        same_gpu = (art.gpu.name, art.gpu.driver, art.gpu.sm_count) == (
            key.name,
            key.driver,
            key.sm_count,
        )
        if entry is not None and same_gpu:
            found.append((path.stat().st_mtime, path.name, entry))
    if found:
        _, name, entry = max(found, key=lambda f: f[0])
        return entry, f"{name} (the reference calibration of this GPU)"
    return load_packaged(ESTIMATE_ARTIFACT).pipeline(pipeline), f"{ESTIMATE_ARTIFACT} (estimate)"


@dataclass(frozen=True, slots=True)
class TokenStats:
    """One class's shared-stage decode, from its solo probes' streams (nearest rank)."""

    tpot_p50_s: float  # over requests: seconds per output token after the first
    tpot_p95_s: float
    tpot_s: list[float]  # per measured request with at least two text deltas
    answer_tokens: list[int]  # usage.completion_tokens per request (empty: none sent)
    engine: bool  # every request timed by the engine (else some at the client)


def request_tpot(gaps: list[float], tokens: int | None) -> float | None:
    """One request's decode time per output token from the client's view: its first text delta
    to its last, over the tokens after the first (`tokens`: the answer length; None: one per
    delta), as vLLM's benchmarks take TPOT."""
    n = tokens if tokens is not None else len(gaps) + 1
    return sum(gaps) / (n - 1) if gaps and n > 1 else None


def token_stats(rec: dict[str, Any]) -> TokenStats | None:
    """The per-token decode time and answer lengths of one class's raw record; None when no
    request has one. Per request: the mean of the engine's own inter-token latencies of the
    shared stage (its TPOT), else, when the server sent no stage metrics, `request_tpot` (a
    busy server loop can deliver the deltas bunched, down to all at once: 0 s per token)."""
    per_request = [
        (sum(itl) / len(itl) if itl else None) if itl is not None else request_tpot(gaps, n)
        for gaps, n, itl in zip(
            rec["token_interval_s"], rec["answer_tokens"], rec["engine_token_interval_s"],
            strict=True,
        )
    ]  # fmt: skip
    tpots = [round(t, 6) for t in per_request if t is not None]
    if not tpots:
        return None
    answers = [n for n in rec["answer_tokens"] if n is not None]
    engine = all(itl is not None for itl in rec["engine_token_interval_s"])
    return TokenStats(nearest_rank(tpots, 0.5), nearest_rank(tpots, 0.95), tpots, answers, engine)


def _answers(t: TokenStats) -> str:
    a = t.answer_tokens
    if not a:
        return "not sent by the server"
    return (
        f"p50 {nearest_rank(a, 0.5)}, p95 {nearest_rank(a, 0.95)}, mean {sum(a) / len(a):.1f} "
        f"over {len(a)} answers (usage.completion_tokens)"
    )


def build_artifact(
    pipeline: str,
    model: str,
    key: GpuKey,
    solo: dict[str, dict[str, Any]],
    command: str,
    when: str,
    base: tuple[PipelineCalibration, str] | None = None,
) -> CalibrationArtifact:
    """`base`'s entry for `pipeline` (default: the shipped estimate's) with what the probes
    measured: the solo p95 table (only the measured classes: the plugin keeps the
    ServingConfig's solo p95 for the others) and the shared stage's per-token decode time.
    The latter sets `shared.decode_step_s` (one decode iteration, batch 1, stage alone, whose
    whole-GPU value the class profiles' per-token time derives from): the carried curve
    scaled so that its whole-GPU value is the p50 of the text-answer (ttft) classes' per-token
    times, measured alone on the whole device; its shape over SM counts stays borrowed."""
    tpl, origin = base or (
        load_packaged(ESTIMATE_ARTIFACT).pipeline(pipeline),
        f"{ESTIMATE_ARTIFACT} (estimate)",
    )
    ladder = tpl.ladder if tpl.ladder.total == key.sm_count else cfg.default_ladder(key.sm_count)
    p95s, cis, counts, walls = {}, {}, {}, {}
    tpots: dict[str, float] = {}  # the class profiles' tpot_s the plugin applies (p50, > 0)
    carried = (
        f"carried over from {origin}: calibrate --backend vllm-omni measures only solo_p95_s "
        "and the shared stage's per-token decode time"
    )
    notes = dict.fromkeys(CARRIED_FIELDS, carried)
    text_tpots: list[float] = []
    for name, rec in solo.items():
        lat = rec["latency_s"]
        p95s[name] = round(p95(lat), 5)
        est = quantile_ci(lat)
        cis[name] = (_r5(est.lo), _r5(est.hi))
        counts[name] = len(lat)
        walls[name] = float(rec["wall_s"])
        notes[f"solo_p95_s.{name}"] = (
            f"measured: vLLM-Omni, first {rec['output']} at the client, {len(lat)} solo "
            f"requests after {rec['warmup']} warm-up"
        )
        t = token_stats(rec)
        if t is None:
            continue
        how = (
            "the mean of the shared stage's inter-token latencies as the engine timed them "
            "(stream metrics.stage_metrics)"
            if t.engine
            else "its first streamed text delta to its last over its answer tokens after the "
            "first (at the client)"
        )
        notes[f"profile.{name}.tpot_s"] = (
            f"measured: vLLM-Omni, p50 {t.tpot_p50_s} s, p95 {t.tpot_p95_s} s (nearest rank) "
            f"over {len(t.tpot_s)} solo requests, each {how}"
        )
        notes[f"profile.{name}.answer_tokens"] = f"measured: vLLM-Omni, {_answers(t)}"
        if t.tpot_p50_s > 0:
            tpots[name] = t.tpot_p50_s
        if rec["metric"] == cfg.Metric.TTFT.value:
            text_tpots += t.tpot_s
    shared = tpl.shared
    if text_tpots:
        level = nearest_rank(text_tpots, 0.5)
        scale = level / shared.decode_step_s.at(ladder.total)
        curve = shared.decode_step_s
        scaled = SmCurve(sms=curve.sms, values=[round(v * scale, 7) for v in curve.values])
        shared = shared.model_copy(update={"decode_step_s": scaled})
        notes["shared"] = carried + "; decode_step_s excepted"
        notes["shared.decode_step_s"] = (
            f"level measured: vLLM-Omni, {level} s at {ladder.total} SMs (p50 of the per-token "
            f"time of {len(text_tpots)} solo requests of the text-answer classes); shape "
            f"over SM counts carried over from {origin} (x{scale:.3g})"
        )
    source = (
        f"solo_p95_s and the shared stage's per-token decode time measured on vLLM-Omni "
        f"(HorizonServe off) by horizonserve calibrate --backend vllm-omni on {when}: "
        f"`{command}`. Each class alone, one streamed chat request at a time; first response "
        "taken at the client (first text token / audio chunk / image), nearest-rank p95; "
        "per-token time: per request the mean of the shared stage's inter-token latencies "
        "the engine reports in the stream (notes profile.<class>.*; shared.decode_step_s "
        "holds the text-answer classes' p50). Classes not listed "
        f"in solo_p95_s were not measured. Every other field is carried over from {origin}."
    )
    entry = tpl.model_copy(
        update={
            "model": model,
            "ladder": ladder,
            "shared": shared,
            "solo_p95_s": p95s,
            "solo_p95_source": "measured: vLLM-Omni, client-side first response, solo",
            "tpot_s": tpots,
            "solo_p95_ci_s": cis,
            "solo_samples": counts,
            "solo_wall_s": walls,
            "notes": dict(sorted(notes.items())),
        }
    )
    entry = type(entry).model_validate(entry.model_dump())  # validate the replaced fields
    return CalibrationArtifact(source=source, created=when, gpu=key, pipelines={pipeline: entry})


def _r5(x: float | None) -> float | None:
    return None if x is None else round(x, 5)


def summary(
    art: CalibrationArtifact,
    pipeline: str,
    slo: cfg.SloTable,
    solo: dict[str, dict[str, Any]],
    skipped: list[str],
) -> str:
    """The measured table as text: per class its samples, solo p50 / p95, SLO target,
    per-token decode time p50 / p95 and mean answer length."""
    entry = art.pipelines[pipeline]
    lines = [
        f"vLLM-Omni calibration of {entry.model} ({pipeline}) on {art.gpu.name}",
        f"{'class':16} {'metric':6} {'n':>3} {'solo p50 s':>10} {'solo p95 s':>10} {'SLO s':>8}"
        f" {'tpot p50 ms':>11} {'tpot p95 ms':>11} {'tokens':>6}",
    ]
    for c in slo.classes:
        if c.name not in entry.solo_p95_s:
            continue
        lat = sorted(solo[c.name]["latency_s"])
        v = entry.solo_p95_s[c.name]
        mult = c.slo_multiplier if c.slo_multiplier is not None else slo.multiplier
        t = token_stats(solo[c.name])
        ms = (t.tpot_p50_s * 1e3, t.tpot_p95_s * 1e3) if t else None
        tpot = f"{ms[0]:>11.1f} {ms[1]:>11.1f}" if ms else f"{'-':>11} {'-':>11}"
        a = t.answer_tokens if t else []
        tokens = f"{sum(a) / len(a):>6.1f}" if a else f"{'-':>6}"
        lines.append(
            f"{c.name:16} {c.metric.value:6} {len(lat):>3} {lat[len(lat) // 2]:>10.3f} "
            f"{v:>10.3f} {v * mult:>8.3f} {tpot} {tokens}"
        )
    if skipped:
        lines.append(f"not measured (no probe input): {', '.join(skipped)}")
    return "\n".join(lines)


# -- the command ---------------------------------------------------------------------------------


def serving_slo(pipeline: str) -> tuple[cfg.SloTable, str]:
    """The SLO table (multipliers) and model of the ServingConfig in the environment, else
    of the shipped pipeline."""
    raw = os.environ.get(cfg.SERVING_CONFIG_ENV)
    if raw:
        serving = cfg.ServingConfig.model_validate_json(raw)
        if serving.pipeline == pipeline:
            return serving.slo, serving.model
    spec = cfg.load_pipeline(pipeline)
    return spec.slo, spec.model


# The artifact stem of (pipelines, GPU name, driver): the entry point's naming rule.
StemOf = Callable[[tuple[str, ...], str, str], str]


def run(args: argparse.Namespace, pipelines: tuple[str, ...], command: str, stem_of: StemOf) -> int:
    """Calibrate `pipelines[0]` on vLLM-Omni; write the artifact. Errors: this module's."""
    if len(pipelines) != 1:
        raise VllmOmniCalibrationError(
            f"--pipeline {','.join(pipelines)}: --backend vllm-omni calibrates one pipeline, "
            "the served model's"
        )
    pipeline = pipelines[0]
    slo, default_model = serving_slo(pipeline)
    probes, skipped = probes_for(slo, args.classes)
    repeats = args.solo_requests if args.solo_requests is not None else (5 if args.quick else 20)
    warmup = 2 if args.warmup is None else args.warmup
    for name, value, low in (("solo-requests", repeats, 1), ("warmup", warmup, 0)):
        if value < low:
            raise VllmOmniCalibrationError(f"--{name} {value}: at least {low}")
    max_tokens = 128 if args.max_tokens is None else args.max_tokens
    settings = ProbeSettings(max_tokens=max_tokens, min_tokens=args.min_tokens)
    if settings.max_tokens < 1 or (settings.min_tokens or 0) > settings.max_tokens:
        raise VllmOmniCalibrationError(
            f"--max-tokens {settings.max_tokens} / --min-tokens {settings.min_tokens}: need "
            "1 <= min <= max"
        )
    if args.url:
        for name in ("vllm_command", "serve_args", "start_timeout"):
            if getattr(args, name) is not None:
                raise VllmOmniCalibrationError(
                    f"{option(name)}: only for a server this command starts (not with --url)"
                )
    key = gpu_key()
    out_dir: Path = args.out_dir
    out_dir.mkdir(parents=True, exist_ok=True)
    stem = stem_of((pipeline,), key.name, key.driver) + SUFFIX
    started: StartedServer | None = None
    t0 = time.monotonic()
    if args.url:
        server = Server.parse(args.url)
        try:
            models = served_models(server)
        except (OSError, http.client.HTTPException, ValueError) as exc:
            raise VllmOmniCalibrationError(
                f"--url {args.url}: no vLLM-Omni server answers ({exc})"
            ) from None
        model = args.model or (models[0] if len(models) == 1 else "")
        if model not in models:
            raise VllmOmniCalibrationError(
                f"--model {args.model or '(not given)'}: the server at --url serves {models}"
            )
        start_s = None
        server_cmd = f"(running server at {args.url})"
        where = f"--url {args.url}"
    else:
        model = args.model or default_model
        port = _free_port()
        cmd = serve_command(args, model, port, deploy_file(pipeline))
        server_cmd = shlex.join(cmd)
        print(f"[calibrate] starting {server_cmd}", flush=True)
        started = StartedServer(cmd, out_dir / f"{stem}.serve.log")
        server = Server("127.0.0.1", port)
        where = f"the server this command started (log {started.log})"
    try:
        if started is not None:
            start_s = started.wait_ready(server, args.start_timeout or 900.0, model)
            print(f"[calibrate] server ready in {start_s:.0f} s", flush=True)
            model = _served_name(server, model)
        solo = measure(
            server, model, probes, warmup, repeats, settings, args.request_timeout or 600.0,
            where, say=lambda s: print(s, flush=True),
        )  # fmt: skip
    finally:
        if started is not None:
            started.stop()
    when = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    base = base_entry(out_dir, pipeline, key)
    art = build_artifact(pipeline, model, key, solo, command, when, base)
    raw = {
        "backend": BACKEND,
        "command": command,
        "server_command": server_cmd,
        "server_start_s": start_s,
        "measured_at": when,
        "pipeline": pipeline,
        "model": model,
        "gpu": key.model_dump(),
        "settings": {
            "warmup": warmup,
            "repeats": repeats,
            "max_tokens": settings.max_tokens,
            "min_tokens": settings.min_tokens,
        },
        "skipped": skipped,
        "solo": solo,
        "wall_s": round(time.monotonic() - t0, 1),
    }
    path = out_dir / f"{stem}.json"
    path.write_text(art.model_dump_json(indent=2) + "\n")
    (out_dir / f"{stem}.raw.log").write_text(json.dumps(raw, indent=1) + "\n")
    text = summary(art, pipeline, slo, solo, skipped)
    (out_dir / f"{stem}.summary.txt").write_text(f"{command}\n{text}\n")
    print(text)
    print(f"artifact: {path} ({time.monotonic() - t0:.0f} s)")
    return 0


def _served_name(server: Server, model: str) -> str:
    """The name the started server serves `model` under: `model`, or the one name it lists
    (`--serve-args` gave --served-model-name, as the operator does for mounted weights).
    Requests and the artifact's model use it (the plugin matches it to its ServingConfig)."""
    try:
        models = served_models(server)
    except (OSError, http.client.HTTPException, ValueError):
        return model
    return models[0] if model not in models and len(models) == 1 else model


def existing(args: argparse.Namespace, pipeline: str, stem_of: StemOf) -> Path | None:
    """This backend's artifact for `pipeline` on this machine in --out-dir, if present."""
    key = gpu_key()
    path = Path(args.out_dir) / (stem_of((pipeline,), key.name, key.driver) + SUFFIX + ".json")
    return path if path.is_file() else None
