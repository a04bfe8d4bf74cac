"""Costs and effects of HorizonServe's GPU mechanisms, printed as one JSON document.

    python bench/gpu/mechanisms.py [--out FILE] [--quick]

Sections (each independent; a failing section records its error and the rest still run):

* env        versions, GPU, SM count
* shm        control-record update/read, request-table insert/lookup/delete (CPU only)
* nvml       one memory-utilisation sample through the sampler, raw pynvml, cached path
* green      per mode (torch stream, torch set/pop_context, driver-API stream): ladder
             pre-allocation time, switch cost alternating two levels, switch+launch
* granted    SMs actually granted for requests of 16..128 step 8, 132, and off-grid counts
* matmul     8192^3 bf16 matmul time under several levels (is the cap real?)
* mps        MPS control daemon start/stop time, and a client's matmul at two
             CUDA_MPS_ACTIVE_THREAD_PERCENTAGE values

Latencies are in microseconds: `mean` is a batch mean (N calls / total time); p50/p99 come from
timing each call alone with perf_counter_ns, so they include ~0.05-0.1 us of timer overhead.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

# -- timing helpers --------------------------------------------------------------------------


def _pct(sorted_ns: list[int], q: float) -> float:
    return sorted_ns[min(len(sorted_ns) - 1, int(q * len(sorted_ns)))] / 1000.0


def time_calls(fn: Callable[[int], object], n: int) -> dict[str, float]:
    """Batch mean over n calls, then p50/p99 of n individually timed calls (us)."""
    clock = time.perf_counter_ns
    t0 = clock()
    for i in range(n):
        fn(i)
    mean = (clock() - t0) / n / 1000.0
    samples = []
    for i in range(n):
        a = clock()
        fn(i)
        samples.append(clock() - a)
    samples.sort()
    return {"n": n, "mean": round(mean, 3), "p50": _pct(samples, 0.5), "p99": _pct(samples, 0.99)}


class Skip(Exception):
    """A section that cannot run here (no GPU, no NVML, ...)."""


def section(results: dict[str, Any], name: str, fn: Callable[[], Any]) -> None:
    t0 = time.perf_counter()
    try:
        results[name] = fn()
    except Skip as exc:
        results[name] = {"skipped": str(exc)}
    except Exception as exc:  # a broken section must not lose the others
        results[name] = {"error": f"{type(exc).__name__}: {exc}", "trace": traceback.format_exc()}
    print(f"[{name}] {time.perf_counter() - t0:.2f} s", file=sys.stderr, flush=True)


def _cuda() -> Any:
    import torch

    if not torch.cuda.is_available():
        raise Skip("no CUDA device")
    return torch


# -- sections --------------------------------------------------------------------------------


def env_info() -> dict[str, Any]:
    info: dict[str, Any] = {"python": sys.version.split()[0], "machine": platform.machine()}
    try:
        import torch

        info["torch"] = torch.__version__
        info["torch_cuda"] = torch.version.cuda
        if torch.cuda.is_available():
            p = torch.cuda.get_device_properties(0)
            info["gpu"] = p.name
            info["sms"] = p.multi_processor_count
            from torch.cuda import green_contexts as gcm

            info["green_context_api"] = sorted(
                a for a in dir(gcm.GreenContext) if not a.startswith("__")
            )
    except ImportError:
        info["torch"] = None
    for mod in ("cuda.bindings", "pynvml"):
        try:
            m = __import__(mod, fromlist=["_"])
            info[mod] = getattr(m, "__version__", "present")
        except ImportError:
            info[mod] = None
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=20,
        )
        info["driver"] = out.stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        info["driver"] = None
    return info


def shm_costs(n: int) -> dict[str, Any]:
    from horizonserve.runtime.monitor import ControlRecord, RequestTable

    out: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(dir="/dev/shm" if os.path.isdir("/dev/shm") else None) as d:
        rec = ControlRecord.create(Path(d) / "control", n_slots=4)
        w = rec.decision_writer()
        s = rec.downstream_writer(0)
        out["record_publish_us"] = time_calls(lambda i: w.publish(64, 68, 1, 0.5, 0.4, i + 1), n)
        out["record_read_decision_us"] = time_calls(lambda i: rec.read_decision(), n)
        out["slot_set_active_us"] = time_calls(lambda i: s.set_active(i & 7, i + 1), n)
        out["downstream_active_total_4slots_us"] = time_calls(
            lambda i: rec.downstream_active_total(i, 10**9), n
        )
        out["record_read_retries"] = rec.read_retries
        rec.close()
        m = min(n, 2000)
        tab = RequestTable.create(Path(d) / "requests", capacity=4096)
        ids = [f"req-{i:08d}" for i in range(m)]
        out["table_insert_us"] = time_calls(lambda i: tab.insert(ids[i], 10, i, i + 5), m)
        out["table_lookup_hit_us"] = time_calls(lambda i: tab.lookup(ids[i]), m)
        out["table_delete_us"] = time_calls(lambda i: tab.delete(ids[i]), m)
        tab.close()
    return out


def nvml_costs(n: int) -> dict[str, Any]:
    from horizonserve.runtime.gpu import NvmlPressureSampler

    s = NvmlPressureSampler(0)
    if not s.available:
        raise Skip(f"NVML unavailable: {s.unavailable_reason}")
    nv, h = s._nvml, s._handle
    out = {
        "sampler_sample_us": time_calls(lambda i: s.sample(), n),
        "raw_nvmlDeviceGetUtilizationRates_us": time_calls(
            lambda i: nv.nvmlDeviceGetUtilizationRates(h), n
        ),
    }
    cached = NvmlPressureSampler(0, min_interval_ns=10**12)
    cached.sample()
    out["sampler_cached_us"] = time_calls(lambda i: cached.sample(), n)
    out["value_idle"] = s.sample()
    cached.close()
    s.close()
    return out


def _green_mode(mode: str, levels: list[int], n: int, x: Any) -> dict[str, Any]:
    from horizonserve.runtime.gpu import ladder_variant

    torch = _cuda()
    ladder = ladder_variant(levels, mode)
    r: dict[str, Any] = {
        "available": ladder.available,
        "mode": ladder.mode,
        "reason": ladder.unavailable_reason,
        "alloc_ms": round(ladder.alloc_seconds * 1000, 2),
        "granted_sms": list(ladder.granted_sms),
    }
    if ladder.available:
        act = ladder.activate
        act(0)
        r["noop_activate_us"] = time_calls(lambda i: act(0), n)
        r["switch_48_64_us"] = time_calls(lambda i: act(i & 1), n)
        r["switch_64_uncapped_us"] = time_calls(lambda i: act(1 + 2 * (i & 1)), n)
        act(0)
        r["launch_only_us"] = time_calls(lambda i: x.add_(1), n)
        r["switch_plus_launch_us"] = time_calls(lambda i: (act(i & 1), x.add_(1)), n)
        torch.cuda.synchronize()
        r["switches"] = ladder.switches
    ladder.close()
    torch.cuda.synchronize()
    return r


def green_costs(n: int) -> dict[str, Any]:
    torch = _cuda()
    levels = [48, 64, 80, 132]
    out: dict[str, Any] = {"ladder": levels}
    x = torch.ones(1024, device="cuda")
    for mode in ("stream", "context", "stream-driver"):
        try:
            out[mode] = _green_mode(mode, levels, n, x)
        except Exception as exc:
            out[mode] = {"error": f"{type(exc).__name__}: {exc}"}
    return out


def granted_counts() -> dict[str, Any]:
    torch = _cuda()
    from torch.cuda import green_contexts as gcm

    from horizonserve.runtime.gpu._driver import _drv, granted_sm_count, sm_granularity

    total = torch.cuda.get_device_properties(0).multi_processor_count
    out: dict[str, Any] = {"total_sms": total}
    try:
        out["granularity"] = sm_granularity(0)
    except Exception as exc:
        out["granularity"] = f"{type(exc).__name__}: {exc}"
    ignore = getattr(
        getattr(_drv(), "CUdevSmResourceSplitByCount_flags", None),
        "CU_DEV_SM_RESOURCE_SPLIT_IGNORE_SM_COSCHEDULING",
        None,
    )
    from horizonserve.runtime.gpu._driver import DriverGreenContext

    rows = []
    # The ladder grid 16..128 step 8 plus requests off the 8-SM grid, to see the rounding.
    odd = {1, 4, 8, 12, 20, 36, 50, 66, 100, 130, 131, total}
    for req in sorted(set(range(16, total + 1, 8)) | odd):
        row: dict[str, Any] = {"requested": req}
        try:  # what the created context itself reports (cuGreenCtxGetDevResource)
            dctx = DriverGreenContext(0, req)
            row["context_reports"] = dctx.granted_sms
            dctx.close()
        except Exception as exc:
            row["context_reports"] = f"{type(exc).__name__}: {exc}"
        try:
            row["granted"] = granted_sm_count(0, req)
        except Exception as exc:
            row["granted_error"] = f"{type(exc).__name__}: {exc}"
        if ignore is not None:
            try:  # finer groups torch does not use: what a driver-API ladder could get
                row["granted_ignore_cosched"] = granted_sm_count(0, req, int(ignore))
            except Exception as exc:
                row["granted_ignore_cosched"] = f"{type(exc).__name__}: {exc}"
        t0 = time.perf_counter()
        try:
            ctx = gcm.GreenContext.create(num_sms=req, device_id=0)
            row["create_ms"] = round((time.perf_counter() - t0) * 1000, 3)
            del ctx
        except Exception as exc:
            row["create_error"] = f"{type(exc).__name__}: {exc}"
        rows.append(row)
    out["levels"] = rows
    return out


def matmul_under_levels(size: int, reps: int) -> dict[str, Any]:
    torch = _cuda()
    total = torch.cuda.get_device_properties(0).multi_processor_count
    levels = [16, 20, 24, 32, 48, 64, 96, 128, total]
    a = torch.randn(size, size, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(size, size, device="cuda", dtype=torch.bfloat16)
    flop = 2.0 * size**3
    from horizonserve.runtime.gpu import ladder_variant

    out: dict[str, Any] = {"size": size, "reps": reps, "dtype": "bf16"}
    for mode in ("stream", "context"):
        ladder = ladder_variant(levels, mode)
        rows = []
        for i, lvl in enumerate(levels):
            ladder.activate(i)
            for _ in range(2):
                a @ b
            start = torch.cuda.Event(enable_timing=True)
            end = torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(reps):
                a @ b
            end.record()
            end.synchronize()
            ms = start.elapsed_time(end) / reps
            rows.append(
                {
                    "level": lvl,
                    "granted": ladder.granted_sms[i],
                    "ms": round(ms, 3),
                    "tflops": round(flop / ms / 1e9, 1),
                }
            )
        ladder.close()
        torch.cuda.synchronize()
        out[mode] = rows
    return out


_MPS_CLIENT = """
import time, torch
a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16); b = torch.randn_like(a)
for _ in range(2): a @ b
torch.cuda.synchronize(); t = time.perf_counter()
for _ in range(5): a @ b
torch.cuda.synchronize(); print((time.perf_counter() - t) / 5 * 1000)
"""


def mps_check() -> dict[str, Any]:
    _cuda()
    from horizonserve.runtime.gpu import MpsDaemon, mps_available

    if not mps_available():
        raise Skip("nvidia-cuda-mps-control not on PATH")
    out: dict[str, Any] = {"available": True}
    with MpsDaemon(timeout_s=30) as mps:
        out["start_ms"] = round((mps.start_seconds or 0) * 1000, 1)
        out["pipe_dir_after_start"] = sorted(p.name for p in mps.pipe_dir.iterdir())
        for pct in (25, 100):
            env = os.environ | mps.client_env(active_thread_percentage=pct)
            try:
                proc = subprocess.run(
                    [sys.executable, "-c", _MPS_CLIENT],
                    env=env,
                    capture_output=True,
                    text=True,
                    timeout=90,
                )
                ok = proc.returncode == 0
                out[f"client_matmul_ms_at_{pct}pct"] = (
                    float(proc.stdout.strip()) if ok else proc.stderr[-500:]
                )
            except subprocess.TimeoutExpired:
                out[f"client_at_{pct}pct"] = "timeout"
        try:
            out["server_list"] = mps.command("get_server_list")
        except Exception as exc:
            out["server_list"] = str(exc)
        pipe_dir = mps.pipe_dir
    out["stop_ms"] = round((mps.stop_seconds or 0) * 1000, 1)
    out["pipe_dir_removed"] = not pipe_dir.exists()
    return out


def _clean(obj: Any) -> Any:
    """JSON-safe copy: NaN/inf (unknown pressure) become null."""
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    if isinstance(obj, dict):
        return {k: _clean(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [_clean(v) for v in obj]
    return obj


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, help="also write the JSON here")
    ap.add_argument("--quick", action="store_true", help="fewer iterations (smoke test)")
    ap.add_argument("--only", nargs="*", help="run only these sections")
    args = ap.parse_args()
    n = 2_000 if args.quick else 100_000
    results: dict[str, Any] = {"argv": sys.argv, "started": time.strftime("%Y-%m-%dT%H:%M:%S")}
    sections: list[tuple[str, Callable[[], Any]]] = [
        ("env", env_info),
        ("shm", lambda: shm_costs(n)),
        ("nvml", lambda: nvml_costs(min(n, 20_000))),
        ("green", lambda: green_costs(min(n, 20_000))),
        ("granted", granted_counts),
        ("matmul", lambda: matmul_under_levels(8192, 5)),
        ("mps", mps_check),
    ]
    for name, fn in sections:
        if not args.only or name in args.only:
            section(results, name, fn)
    text = json.dumps(_clean(results), indent=2, default=str)
    print(text)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text + "\n")


if __name__ == "__main__":
    main()
