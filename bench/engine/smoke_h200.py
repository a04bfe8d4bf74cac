"""Full-scale smoke run of the reference pipeline on one GPU (written for an H200).

Starts thinker-7b + talker + code2wav + DiT as three stage processes (random weights), then:
  1. decode probe: step time of a dummy thinker batch alone at every shared-stage SM level;
  2. a mixed Poisson trace (text / speech / image) for --duration seconds with the horizon
     policy, then the same trace with fcfs (policy switched in place, models stay loaded);
  3. prints per-class first-response p50/p95 and attainment, decode step time per shared SM
     count under co-running, per-stage GPU memory; writes everything as JSON under --out.

    python bench/engine/smoke_h200.py --out results/ --duration 40 --rate 4

Numbers are measured on real kernels at the paper's model dimensions; SLO targets are the
reference defaults (estimates), so attainment is relative to those, not a calibrated table.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import platform
import random
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from horizonserve.runtime.engine.reference import (
    PipelineOptions,
    ReferenceBackend,
    RequestSpec,
    TimedRequest,
)

# class -> (mix weight, priority)
MIX = {"text": (0.6, 0), "speech": (0.28, 10), "image": (0.12, 20)}


def lognormal(rng: random.Random, mean: float, sd: float, lo: int, hi: int) -> int:
    var = math.log1p((sd / mean) ** 2)
    x = rng.lognormvariate(math.log(mean) - var / 2, math.sqrt(var))
    return int(min(hi, max(lo, round(x))))


def make_trace(rate: float, duration_s: float, seed: int) -> list[TimedRequest]:
    rng = random.Random(seed)
    names = list(MIX)
    weights = [MIX[n][0] for n in names]
    out, t, i = [], 0.0, 0
    while True:
        t += rng.expovariate(rate)
        if t >= duration_s:
            return out
        name = rng.choices(names, weights)[0]
        prio = MIX[name][1]
        if name == "text":
            spec = RequestSpec(
                f"{name}-{i}",
                priority=prio,
                input_tokens=lognormal(rng, 400, 300, 16, 2048),
                output_tokens=lognormal(rng, 128, 80, 8, 512),
            )
        elif name == "speech":
            spec = RequestSpec(
                f"{name}-{i}",
                priority=prio,
                input_tokens=lognormal(rng, 40, 20, 4, 256),
                audio_seconds=rng.uniform(2.0, 8.0),
                output_tokens=lognormal(rng, 48, 20, 8, 160),
                downstream_tokens=lognormal(rng, 200, 80, 50, 500),  # ≈ 4 s of speech
            )
        else:
            spec = RequestSpec(
                f"{name}-{i}",
                priority=prio,
                input_tokens=lognormal(rng, 80, 40, 8, 256),
                output_tokens=lognormal(rng, 24, 10, 4, 64),
            )
        out.append(TimedRequest(t, spec))
        i += 1


def gpu_memory() -> str:
    try:
        return subprocess.run(
            ["nvidia-smi", "--query-gpu=memory.used,memory.total", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=10,
        ).stdout.strip()
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"nvidia-smi failed: {exc}"


def fmt(x: float | None, scale: float = 1e3) -> str:
    return "—" if x is None else f"{x * scale:.1f}"


def report(label: str, summary: dict[str, Any]) -> None:
    print(f"\n== {label}: {summary['requests']} requests, attainment {summary['attainment']}")
    print(f"{'class':8} {'n':>4} {'metric':6} {'SLO ms':>8} {'p50 ms':>8} {'p95 ms':>8} {'att':>5}")
    for name, c in summary["classes"].items():
        print(
            f"{name:8} {c['requests']:>4} {c['metric']:6} {fmt(c['slo_s']):>8} "
            f"{fmt(c['p50_s']):>8} {fmt(c['p95_s']):>8} {c['attainment']:>5.2f}"
        )
    print("decode-only iterations by shared SMs (co-running as it happened):")
    for sms, d in summary["decode_step_by_shared_sms"].items():
        print(f"  {sms:>4} SMs: {d['steps']:>6} steps, p50 {fmt(d['p50_s'])} ms")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--duration", type=float, default=40.0, help="trace seconds per policy")
    ap.add_argument("--rate", type=float, default=4.0, help="requests per second")
    ap.add_argument("--policies", default="horizon,fcfs")
    ap.add_argument("--preset", default="full")
    ap.add_argument("--device", default="cuda:0")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--drain", type=float, default=30.0, help="seconds to wait after a trace")
    ap.add_argument(
        "--backlog-timeout", type=float, default=120.0, help="wait for leftovers before a switch"
    )
    args = ap.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    args.out.mkdir(parents=True, exist_ok=True)
    summary: dict[str, Any] = {"command": " ".join(sys.argv), "args": vars(args)}

    def save() -> None:
        text = json.dumps(summary, indent=1, default=str)
        (args.out / "smoke_summary.json").write_text(text)

    import torch

    summary["env"] = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
    }
    print(f"env: {summary['env']}")
    policies = [p.strip() for p in args.policies.split(",") if p.strip()]
    options = PipelineOptions(preset=args.preset, device=args.device, policy=policies[0])
    t0 = time.monotonic()
    with ReferenceBackend(options) as backend:
        pipe = backend.pipeline
        summary["startup_s"] = time.monotonic() - t0
        summary["stages"] = pipe.stage_info
        summary["ladder"] = pipe.config.ladder.model_dump() if pipe.config else None
        summary["gpu_memory_after_start"] = gpu_memory()
        print(f"started in {summary['startup_s']:.1f} s; GPU memory {gpu_memory()}")
        for name, info in pipe.stage_info.items():
            print(f"  {name}: {json.dumps(info, default=str)}")
        save()

        probes = []
        for batch, context in ((8, 512), (32, 1024)):
            try:
                probe = pipe.probe_decode(batch=batch, context=context, steps=20)
            except Exception as exc:  # keep going: the traces matter more
                print(f"decode probe batch {batch} failed: {exc!r}")
                continue
            probes.append(probe)
            cells = ", ".join(
                f"{sms}: {v['p50_s'] * 1e3:.2f}" for sms, v in probe["levels"].items()
            )
            print(f"decode probe batch {batch} ctx {context} (p50 ms by SMs): {cells}")
        summary["decode_probe"] = probes
        save()

        trace = make_trace(args.rate, args.duration, args.seed)
        counts = {n: sum(1 for r in trace if r.spec.rid.startswith(n)) for n in MIX}
        print(f"trace: {len(trace)} requests over {args.duration:.0f} s: {counts}")
        summary["runs"] = {}
        for policy in policies:
            try:
                backend.set_policy(policy)
                result = backend.run(trace, drain_timeout_s=args.drain)
            except Exception as exc:
                print(f"run with {policy} failed: {exc!r}")
                summary.setdefault("errors", []).append(f"{policy}: {exc!r}")
                save()
                break
            s = result.summary()
            s["unfinished"] = result.unfinished
            s["duration_s"] = result.duration_s
            s["gpu_memory"] = gpu_memory()
            summary["runs"][policy] = s
            report(policy, s)
            raw = {"records": result.records, "trace": result.trace}
            (args.out / f"{policy}_raw.json").write_text(json.dumps(raw, default=str))
            save()
            if result.unfinished:  # let the backlog finish so the next policy starts clean
                print(f"{result.unfinished} requests unfinished after the drain; waiting")
                try:
                    backend.pipeline._wait_idle(args.backlog_timeout)
                except Exception as exc:
                    print(f"backlog did not clear: {exc!r}; stopping here")
                    break
    pipe = backend.pipeline  # set_policy restarts the stages when the sharing mode changes
    summary["stopped_stages"] = {n: i.get("stopped") for n, i in pipe.stage_info.items()}
    summary["total_s"] = time.monotonic() - t0
    save()
    print(f"done in {summary['total_s']:.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
