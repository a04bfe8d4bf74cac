"""GPU check of the worker hook's mechanism (run by hand on an NVIDIA GPU; not collected).

    python3 tests/vllm/gpu_check_worker.py > gpu-check.json

No vLLM needed: it drives `worker.SmControl` (the object the patched vLLM workers use) with
the real Green Context ladder (`runtime.gpu.SmLadderContexts`) and a real control record, and
times an 8192³ bf16 matmul:

* eager, for each published decision: does the shared stage run at the SMs the record says,
  and the downstream stage at the complement?
* CUDA graphs, the way vLLM captures them (a fresh side stream of the primary context, what
  `graph_capture()` does without the plugin) and the way the plugin makes it capture (on the
  capture level's Green Context stream, `capture_on`), each replayed from different levels:
  does a replay follow the stream it is launched on, or keep the SMs of its capture stream?
"""

from __future__ import annotations

import json
import math
import sys
import tempfile
import time
from pathlib import Path


def main() -> int:
    import torch

    from horizonserve.runtime.config import (
        ControlParams,
        RequestClass,
        ServingConfig,
        SloTable,
        default_ladder,
    )
    from horizonserve.runtime.engine.vllm_omni.settings import Knobs
    from horizonserve.runtime.engine.vllm_omni.worker import SmControl
    from horizonserve.runtime.monitor import ControlRecord

    total = torch.cuda.get_device_properties(0).multi_processor_count
    ladder = default_ladder(total)
    cls = RequestClass(name="text", priority=0, path="short", metric="ttft", solo_p95_s=0.02)
    config = ServingConfig(
        model="m", pipeline="qwen2_5_omni", slo=SloTable(classes=[cls]), ladder=ladder,
        control=ControlParams(),
    )  # fmt: skip
    record = ControlRecord.create(Path(tempfile.mkdtemp()) / "record")
    writer = record.decision_writer()
    knobs = Knobs(capture_level="cap")
    shared = SmControl("shared", config, record, knobs=knobs, device_index=0)
    down = SmControl("downstream", config, record, knobs=knobs, device_index=0)
    out: dict = {
        "gpu": torch.cuda.get_device_name(0),
        "torch": torch.__version__,
        "total_sms": total,
        "ladder": ladder.model_dump(),
        "shared": {"available": shared.available, "levels": list(shared.contexts.levels),
                   "granted": list(shared.contexts.granted_sms), "mode": shared.contexts.mode,
                   "reason": shared.contexts.unavailable_reason},
        "downstream": {"available": down.available, "levels": list(down.contexts.levels),
                       "granted": list(down.contexts.granted_sms), "mode": down.contexts.mode,
                       "reason": down.contexts.unavailable_reason},
    }  # fmt: skip
    n = 8192
    a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)

    def ms(fn, iters: int = 20) -> float:
        stream = torch.cuda.current_stream()
        for _ in range(3):
            fn()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record(stream)
        for _ in range(iters):
            fn()
        end.record(stream)
        end.synchronize()
        return round(start.elapsed_time(end) / iters, 3)

    def publish(shared_sms: int) -> None:
        level = ladder.levels.index(shared_sms) if shared_sms in ladder.levels else -1
        writer.publish(shared_sms, total - shared_sms, level, math.nan, math.nan,
                       time.monotonic_ns())  # fmt: skip

    eager = {}
    for sms in [*ladder.levels, ladder.aggressive]:
        publish(sms)
        shared.before_forward()
        eager[f"shared@{sms}"] = ms(lambda: a @ b)
        down.before_forward()
        eager[f"downstream@{down.target_sms(record.read_decision(), time.monotonic_ns())}"] = ms(
            lambda: a @ b
        )
    out["eager_ms"] = eager

    graphs = {}
    low, cap = ladder.levels[0], ladder.s_cap

    def replays(name: str, graph) -> None:
        for sms in (low, cap, total):
            shared.activate_sms(sms)
            graphs[f"{name}, replayed on the {sms}-SM level"] = ms(graph.replay)

    # vLLM without the plugin's capture hook: graph_capture() makes a fresh side stream current.
    shared.activate_sms(total)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    g_side = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g_side, stream=side):
        a @ b
    replays("captured on a plain side stream", g_side)
    # The plugin: capture on the capture level's stream (S_cap), and for contrast on S_min's.
    for sms in (cap, low):
        shared.activate_sms(sms)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, stream=torch.cuda.current_stream()):
            a @ b
        replays(f"captured on the {sms}-SM level stream", graph)
    out["graph_ms"] = graphs
    json.dump(out, sys.stdout, indent=1)
    print()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
