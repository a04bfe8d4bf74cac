"""Do two stage processes really run at the same time on one GPU, and is the SM split real?

Process A is the shared stage (7B thinker, graph-replayed decode of 8 sequences at 512 tokens
of context); process B a downstream stage (the reference DiT, one 4096-patch image per step).
Each runs alone, then both together; then the same with a compute-bound probe (an 8192^3 bf16
matmul replayed as a graph), where disjoint SM partitions that really co-run show no slowdown
and time-slicing shows ~2x. Modes:

  timeslice-nocap   no MPS, no caps            (what an unmodified multi-process runtime does)
  timeslice-gc      no MPS, A on the first 64 SMs, B on the other 68 (Green Contexts)
  mps-nocap         MPS daemon, no caps        (the MPS baselines)
  mps-gc            MPS daemon + Green Contexts (A first 64, B the complement: disjoint SMs)
  mps-gc-overlap    MPS + Green Contexts, B takes its own first 72 SMs (overlapping A's)
  mps-pct           MPS, CUDA_MPS_ACTIVE_THREAD_PERCENTAGE 48 / 52, no Green Contexts

    python bench/engine/concurrency.py --out concurrency.json [--modes a,b] [--seconds 1.0]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import statistics
import sys
import time
from typing import Any

SHARED_SMS = 64
MODES: dict[str, dict[str, Any]] = {
    "timeslice-nocap": {"mps": False, "a": ("whole", 0), "b": ("whole", 0)},
    "timeslice-gc": {"mps": False, "a": ("first", SHARED_SMS), "b": ("complement", SHARED_SMS)},
    "mps-nocap": {"mps": True, "a": ("whole", 0), "b": ("whole", 0)},
    "mps-gc": {"mps": True, "a": ("first", SHARED_SMS), "b": ("complement", SHARED_SMS)},
    "mps-gc-overlap": {"mps": True, "a": ("first", SHARED_SMS), "b": ("first", 72)},
    "mps-pct": {
        "mps": True,
        "a": ("none", 0),
        "b": ("none", 0),
        "env_a": {"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "48"},
        "env_b": {"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "52"},
    },
}
PHASES = (("work-A", "A"), ("work-B", "B"), ("work-AB", "AB"), ("mm-A", "A"), ("mm-B", "B"),
          ("mm-AB", "AB"))  # fmt: skip


def _set_level(spec: tuple[str, int]) -> dict[str, Any]:
    import torch

    from horizonserve.runtime.engine.reference.gpu_control import open_sm_cap

    part, sms = spec
    torch.cuda.set_stream(torch.cuda.Stream())
    if part == "none":
        return {"cap": "none"}
    if part == "whole":
        cap = open_sm_cap("cuda", 0, [])
        cap.activate(None)
    elif part == "first":
        cap = open_sm_cap("cuda", 0, [sms])
        cap.activate(sms)
    else:  # complement of the first `sms`: this process gets total - sms SMs
        total = torch.cuda.get_device_properties(0).multi_processor_count
        cap = open_sm_cap("cuda", 0, [total - sms], partition="complement")
        cap.activate(total - sms)
    info = {"cap": type(cap).__name__, "levels": list(cap.levels)}
    info.update({k: v for k, v in vars(cap).items() if k in ("granted", "full_granted")})
    return info


def worker(role: str, spec: tuple[str, int], env: dict[str, str], barrier: Any, conn: Any,
           seconds: float) -> None:  # fmt: skip
    os.environ.update(env)
    out: dict[str, Any] = {"role": role, "env": env}
    try:
        import torch

        from horizonserve.runtime.engine.reference.ar import ArExecutor
        from horizonserve.runtime.engine.reference.batching import ContinuousBatcher, Sequence
        from horizonserve.runtime.engine.reference.models import DecoderLM, DiT, materialize
        from horizonserve.runtime.engine.reference.presets import DIT, THINKER_7B, StageLimits

        torch.cuda.set_device(0)
        out["level"] = _set_level(spec)
        dev, dt = torch.device("cuda:0"), torch.bfloat16
        if role == "A":
            limits = StageLimits(max_batch=8, max_len=1024, max_prefill_tokens=8192)
            model = materialize(lambda: DecoderLM(THINKER_7B), dev, dt)
            ex = ArExecutor(model, limits, keep_hidden=False, graphs=True)
            batcher = ContinuousBatcher(limits)

            def start() -> list[Sequence]:
                seqs = [Sequence(f"s{i}", 512, 500) for i in range(8)]
                ex.prefill(batcher.plan(seqs).prefill)
                ex.decode(seqs)
                ex.decode(seqs)
                return seqs

            state = {"seqs": start()}

            def work() -> None:
                seqs = state["seqs"]
                if seqs[0].length >= 1000:
                    for s in seqs:
                        batcher.finish(s)
                    state["seqs"] = seqs = start()
                ex.decode(seqs)
        else:
            dit = materialize(lambda: DiT(DIT, THINKER_7B.hidden), dev, dt)
            x = torch.randn(1, DIT.patch_tokens, DIT.latent_channels, device=dev, dtype=dt)
            cond = torch.randn(1, DIT.cond_tokens, THINKER_7B.hidden, device=dev, dtype=dt)
            t = torch.full((1,), 0.5, device=dev)

            @torch.inference_mode()
            def work() -> None:
                dit(x, t, cond).view(-1)[0].item()

        a = torch.randn(8192, 8192, device=dev, dtype=dt)
        b = torch.randn_like(a)
        c = a @ b
        g = torch.cuda.CUDAGraph()
        g.capture_begin(capture_error_mode="thread_local")
        c = a @ b
        g.capture_end()

        def mm() -> None:
            g.replay()
            torch.cuda.current_stream().synchronize()

        for _ in range(2):
            work()
            mm()
        torch.cuda.synchronize()
        out["phases"] = {}
        for name, who in PHASES:
            barrier.wait(timeout=300)
            if role in who:
                fn = mm if name.startswith("mm") else work
                times = []
                t_end = time.monotonic() + seconds
                while time.monotonic() < t_end:
                    t0 = time.perf_counter()
                    fn()
                    times.append((time.perf_counter() - t0) * 1e3)
                out["phases"][name] = {
                    "p50_ms": statistics.median(times),
                    "mean_ms": statistics.fmean(times),
                    "n": len(times),
                }
            barrier.wait(timeout=300)
        del c
    except Exception as exc:
        out["error"] = repr(exc)
        barrier.abort()
    conn.send(out)


def run_mode(name: str, seconds: float) -> dict[str, Any]:
    from horizonserve.runtime.gpu import MpsDaemon

    mode = MODES[name]
    daemon = None
    env: dict[str, str] = {}
    if mode["mps"]:
        daemon = MpsDaemon()
        daemon.start()
        env = daemon.client_env()
    ctx = mp.get_context("spawn")
    barrier = ctx.Barrier(2)
    results: dict[str, Any] = {"mode": name}
    procs = []
    try:
        pipes = {}
        for role in ("A", "B"):
            recv, send = ctx.Pipe(duplex=False)
            role_env = {**env, **mode.get(f"env_{role.lower()}", {})}
            p = ctx.Process(
                target=worker,
                args=(role, mode[role.lower()], role_env, barrier, send, seconds),
                daemon=True,
            )
            p.start()
            procs.append(p)
            pipes[role] = recv
        for role, recv in pipes.items():
            if recv.poll(240):
                results[role] = recv.recv()
            else:
                results[role] = {"error": "no answer in 240 s"}
    finally:
        for p in procs:
            p.join(30)
            if p.is_alive():
                p.kill()
        if daemon is not None:
            daemon.stop()
    return results


def summarize(res: dict[str, Any]) -> dict[str, Any]:
    def ph(role: str, name: str) -> float | None:
        return res.get(role, {}).get("phases", {}).get(name, {}).get("p50_ms")

    out = {
        "A_decode_alone_ms": ph("A", "work-A"),
        "A_decode_corun_ms": ph("A", "work-AB"),
        "B_dit_alone_ms": ph("B", "work-B"),
        "B_dit_corun_ms": ph("B", "work-AB"),
        "A_mm_alone_ms": ph("A", "mm-A"),
        "A_mm_corun_ms": ph("A", "mm-AB"),
        "B_mm_alone_ms": ph("B", "mm-B"),
        "B_mm_corun_ms": ph("B", "mm-AB"),
    }
    for k in ("A_decode", "B_dit", "A_mm", "B_mm"):
        a, c = out[f"{k}_alone_ms"], out[f"{k}_corun_ms"]
        out[f"{k}_slowdown"] = None if not a or not c else c / a
    out["errors"] = [res[r]["error"] for r in ("A", "B") if "error" in res.get(r, {})]
    out["levels"] = {r: res.get(r, {}).get("level") for r in ("A", "B")}
    return out


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--modes", default=",".join(MODES))
    ap.add_argument("--seconds", type=float, default=1.0)
    args = ap.parse_args()
    report: dict[str, Any] = {"argv": sys.argv, "shared_sms": SHARED_SMS, "modes": {}}
    for name in [m.strip() for m in args.modes.split(",") if m.strip()]:
        t0 = time.monotonic()
        try:
            res = run_mode(name, args.seconds)
        except Exception as exc:
            res = {"error": repr(exc)}
        res["summary"] = summarize(res) if "error" not in res else {}
        res["wall_s"] = time.monotonic() - t0
        report["modes"][name] = res
        print(name, json.dumps(res["summary"]), f"{res['wall_s']:.1f}s", flush=True)
        with open(args.out, "w") as f:
            json.dump(report, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
