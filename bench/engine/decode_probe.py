"""Decode step of the 7B thinker on one GPU: eager vs CUDA graphs, and on which stream.

Answers two questions of the first H200 smoke run (bench/results/engine/h200-smoke-1/):
  1. how much of the ~19 ms decode step is kernel-launch overhead (eager vs graph replay);
  2. why the uncapped path (the legacy default stream, no Green Context) was 3-4x slower than
     any capped level: the same step is timed on the legacy default stream before and after
     Green Contexts exist in the process, on a plain side stream, on torch Green Context
     streams (the smoke's ladder), and on the serving ladder (driver Green Context streams,
     whole-GPU level with its own stream). `launch_us` is the host cost of one tiny kernel
     launch on that stream (2,000 `add_` on one element), which isolates per-launch overhead.

    python bench/engine/decode_probe.py --out probe.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from typing import Any

import torch

from horizonserve.runtime.engine.reference.ar import ArExecutor
from horizonserve.runtime.engine.reference.batching import ContinuousBatcher, Sequence
from horizonserve.runtime.engine.reference.gpu_control import open_sm_cap
from horizonserve.runtime.engine.reference.models import DecoderLM, materialize
from horizonserve.runtime.engine.reference.presets import THINKER_7B, THINKER_TINY, StageLimits

RESULTS: dict[str, Any] = {"argv": sys.argv, "rows": []}


def decode_ms(ex: ArExecutor, batch: int, ctx: int, steps: int) -> dict[str, float]:
    batcher = ContinuousBatcher(ex.limits)
    seqs = [Sequence(f"p{i}", ctx, ex.limits.max_len - ctx) for i in range(batch)]
    pending = seqs
    while pending:
        plan = batcher.plan(pending)
        ex.prefill(plan.prefill)
        pending = pending[len(plan.prefill) :]
    for _ in range(3):
        ex.decode(seqs)
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        ex.decode(seqs)  # ends with .tolist(): a host sync
        times.append((time.perf_counter() - t0) * 1e3)
    for s in seqs:
        batcher.finish(s)
    return {"p50_ms": statistics.median(times), "min_ms": min(times), "n": len(times)}


def launch_us(n: int = 2000) -> float:
    x = torch.zeros(1, device="cuda")
    torch.cuda.current_stream().synchronize()
    t0 = time.perf_counter()
    for _ in range(n):
        x.add_(1)
    torch.cuda.current_stream().synchronize()
    return (time.perf_counter() - t0) / n * 1e6


def sm_clock_mhz() -> int | None:
    try:
        import pynvml

        pynvml.nvmlInit()
        h = pynvml.nvmlDeviceGetHandleByIndex(0)
        return int(pynvml.nvmlDeviceGetClockInfo(h, pynvml.NVML_CLOCK_SM))
    except Exception:
        return None


def prefill_ms(ex: ArExecutor, n: int) -> float:
    seq = Sequence("pf", n, 1, slot=0)
    t0 = time.perf_counter()
    ex.prefill([seq])  # ends with .tolist(): a host sync
    return (time.perf_counter() - t0) * 1e3


def row(phase: str, stream: str, **kw: Any) -> None:
    r = {"phase": phase, "stream": stream, "sm_mhz_after": sm_clock_mhz(), **kw}
    RESULTS["rows"].append(r)
    print(json.dumps(r), flush=True)


def matmul_graph_ms(level_fn: Any) -> float:
    """An 8192^3 bf16 matmul captured as a graph on the current stream; replay time."""
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    b = torch.randn_like(a)
    c = a @ b
    g = torch.cuda.CUDAGraph()
    g.capture_begin(capture_error_mode="thread_local")
    c = a @ b
    g.capture_end()
    s = torch.cuda.current_stream()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    g.replay()
    start.record(s)
    for _ in range(5):
        g.replay()
    end.record(s)
    end.synchronize()
    del c
    return start.elapsed_time(end) / 5


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--tiny", action="store_true", help="tiny model (CPU-free smoke of the script)")
    ap.add_argument("--steps", type=int, default=10)
    args = ap.parse_args()
    torch.manual_seed(0)
    dev = torch.device("cuda:0")
    dims = THINKER_TINY if args.tiny else THINKER_7B
    limits = StageLimits(max_batch=32, max_len=2048, max_prefill_tokens=8192)
    t0 = time.perf_counter()
    model = materialize(lambda: DecoderLM(dims), dev, torch.bfloat16)
    eager = ArExecutor(model, limits, keep_hidden=False, graphs=False)
    graph = ArExecutor(model, limits, keep_hidden=False, graphs=True)
    RESULTS["load_s"] = time.perf_counter() - t0
    RESULTS["gpu"] = torch.cuda.get_device_name(0)
    RESULTS["torch"] = torch.__version__
    steps = args.steps

    # A: legacy default stream, no Green Context exists in the process yet; measured twice in
    # a row (A1 = the first decode steps of the process, as the smoke's first probe level).
    legacy = torch.cuda.default_stream()
    RESULTS["sm_mhz_start"] = sm_clock_mhz()
    with torch.cuda.stream(legacy):
        for name in ("A1-no-gc", "A2-no-gc-again"):
            b8 = decode_ms(eager, 8, 512, steps)
            row(name, "legacy-default", b8=b8, launch_us=launch_us())
    # B: a plain side stream.
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        row(
            "B-no-gc",
            "side-stream",
            b8=decode_ms(eager, 8, 512, steps),
            b8_graph=decode_ms(graph, 8, 512, steps),
            launch_us=launch_us(),
        )
    # C: the smoke's ladder: torch Green Context streams, whole GPU = the base stream (legacy).
    from horizonserve.runtime.gpu import SmLadderContexts

    with torch.cuda.stream(legacy):
        old = SmLadderContexts([32, 64, 132], 0, mode="stream")
        for i, sms in enumerate(old.levels):
            old.activate(i)
            name = "legacy-default (smoke's uncapped)" if sms >= 132 else f"torch-gc-{sms}"
            row("C-smoke-ladder", name, b8=decode_ms(eager, 8, 512, steps), launch_us=launch_us())
        old.deactivate()
        row("C-smoke-ladder", "legacy-default after deactivate", launch_us=launch_us())
    # D: the serving ladder: driver Green Context streams, whole GPU as a level of its own.
    cap = open_sm_cap("cuda", 0, [16, 32, 48, 64, 80])
    RESULTS["serving_ladder"] = {"type": type(cap).__name__, "levels": list(cap.levels)}
    for sms in (None, 16, 32, 48, 64, 80):
        cap.activate(sms)
        name = f"gc-{sms}" if sms else "gc-whole-gpu"
        kw: dict[str, Any] = {
            "b8_graph": decode_ms(graph, 8, 512, 2 * steps),
            "b32_graph": decode_ms(graph, 32, 1024, 2 * steps),
            "launch_us": launch_us(),
        }
        if sms in (None, 32, 64):
            kw["b8"] = decode_ms(eager, 8, 512, steps)
        if sms in (None, 16):
            kw["matmul8192_graph_ms"] = matmul_graph_ms(None)
        row("D-serving-ladder", name, **kw)
    cap.activate(None)
    # P: prefill of one prompt, lengths never seen vs repeated (raw shapes, no buckets), then
    # at another SM level, then the bucketed executor (its buckets warmed first).
    eager.bucket_prefill = False
    raw = {str(n): prefill_ms(eager, n) for n in (301, 302, 303)}
    again = {str(n): prefill_ms(eager, n) for n in (301, 302, 303)}
    cap.activate(64)
    at64 = {"304 (new)": prefill_ms(eager, 304), "301 (seen at whole GPU)": prefill_ms(eager, 301)}
    cap.activate(None)
    t0 = time.perf_counter()
    graph.warm_prefill(2048)
    warm_s = time.perf_counter() - t0
    bucketed = {str(n): prefill_ms(graph, n) for n in (305, 306, 777, 1500)}
    row("P-prefill-shapes", "gc-whole-gpu", new_len_ms=raw, repeated_len_ms=again,
        level64_ms=at64, warm_prefill_s=warm_s, bucketed_new_len_ms=bucketed)  # fmt: skip
    # E: legacy default stream again, Green Contexts now exist in the process.
    with torch.cuda.stream(legacy):
        b8 = decode_ms(eager, 8, 512, steps)
        row("E-gc-exist", "legacy-default", b8=b8, launch_us=launch_us())
    RESULTS["graph_info"] = graph.graph_info()
    with open(args.out, "w") as f:
        json.dump(RESULTS, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
