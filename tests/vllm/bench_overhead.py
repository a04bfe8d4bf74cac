"""What HorizonServe adds to each `schedule()` call of the REAL vLLM-Omni AR scheduler (CPU).

    .venv/bin/python tests/vllm/bench_overhead.py [--waiting 16 256 1024] [--steps 400]
        [--scenarios full mixed burst urgent talker]

For each waiting-queue size N the shared stage's scheduler (`HorizonOmniARScheduler`, sync,
FCFS queue; the shipped Qwen2.5-Omni classes, paper control defaults: N adapted in [2, 8],
M = 2, long-path cap 2) runs `steps` engine steps (schedule → fake model output →
update_from_output) in a steady state that keeps N requests waiting:

* full    the running batch is full (16 decoding requests): nothing can be admitted, so the
          plugin only syncs, steps the policy and publishes the SM split;
* mixed   every request finishes after one token and new ones (half text, half speech)
          arrive to keep N waiting: up to 16 slots to fill every step, so every step applies a
          view; text drains faster, the queue fills with speech, and the text prompts taken
          sit deep in it: the slack view reads them from the prefill indexes, restoring vLLM's
          queue still reaches as deep;
* burst   the same with speech only (8 text requests at the back at the start): long-path
          phases show at most the cap (2) of N ordinary long prefills (the slack view reads
          them from the long-path index up to the cap's deadline limit; a queue-order view
          walks the whole queue), while the restore only pops the head.

* urgent  the running batch is full of 16 speech decodes and N protected text requests wait
          (nothing ordinary waits, so every step runs the shared-stage preemption check:
          `late` 'protect' keeps the texts protected however long the bench runs); the
          first 16 steps each preempt a decode through vLLM's `_preempt_request`, later steps
          find every decode preempted once and only pay the check;
* talker  a downstream stage (the talker's AR scheduler, stage 1) with N stamped speech
          requests waiting, deadlines shuffled, one-token requests refilled to keep N waiting:
          every step admits up to 16 in slack order (the `plugin` columns are the admission
          queue's part: reordering the head of `waiting`, then bookkeeping what was taken).

Reported per `schedule()` call: the time of the whole call (Omni's + vLLM's scheduler with the
plugin), the plugin's own part (the controller's `run` minus the base scheduler inside it), its
p95, and per arriving request the `_enqueue_waiting_request` hook (policy admission).
Plain `OmniARScheduler` on the same workload is shown for reference (`base` column).
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

BATCH = 16


def _setup_env(**control: Any) -> None:
    """The shipped Qwen2.5-Omni classes, paper control defaults (plus `control`)."""
    if "HORIZONSERVE_SHM_DIR" not in os.environ:
        os.environ["HORIZONSERVE_SHM_DIR"] = tempfile.mkdtemp(prefix="hs-bench-")
    os.environ["HORIZONSERVE_VLLM_RUN"] = "bench"
    os.environ["HORIZONSERVE_VLLM"] = "1"
    from horizonserve.runtime.config import (
        ControlParams,
        ServingConfig,
        default_ladder,
        load_pipeline,
    )

    spec = load_pipeline("qwen2_5_omni")
    config = ServingConfig(
        model=spec.model,
        pipeline=spec.name,
        slo=spec.slo,
        ladder=default_ladder(),
        control=ControlParams(**control),
    )
    os.environ["HORIZONSERVE_SERVING_CONFIG"] = config.model_dump_json()


def _request(config: Any, rid: str, prio: int, max_tokens: int, age_s: float = 0.0) -> Any:
    from horizon import stamped

    arrival = time.monotonic_ns() - int(age_s * 1e9)
    return stamped(config, rid, 8, prio, arrival, max_tokens=max_tokens)


class Probe:
    """Times the controller's `run` and the base scheduler inside it."""

    def __init__(self, controller: Any) -> None:
        self.total: list[float] = []
        self.base: list[float] = []
        orig_run = controller.run

        def run(sched: Any, base_schedule: Any, throttle: bool) -> Any:
            def timed_base(t: bool) -> Any:
                b0 = time.perf_counter()
                try:
                    return base_schedule(t)
                finally:
                    self.base.append(time.perf_counter() - b0)

            t0 = time.perf_counter()
            try:
                return orig_run(sched, timed_base, throttle)
            finally:
                self.total.append(time.perf_counter() - t0)

        controller.run = run

    def plugin_us(self) -> list[float]:
        return [(t - b) * 1e6 for t, b in zip(self.total, self.base, strict=True)]


class AdmissionProbe:
    """Times a downstream stage's admission (before and after vLLM's `schedule()`)."""

    def __init__(self, admission: Any) -> None:
        self.times: list[float] = []
        before, after = admission.before_schedule, admission.after_schedule
        self._t = 0.0

        def timed_before(sched: Any) -> None:
            t0 = time.perf_counter()
            before(sched)
            self._t = time.perf_counter() - t0

        def timed_after(sched: Any, out: Any) -> None:
            t0 = time.perf_counter()
            after(sched, out)
            self.times.append(self._t + time.perf_counter() - t0)

        admission.before_schedule = timed_before
        admission.after_schedule = timed_after

    def plugin_us(self) -> list[float]:
        return [t * 1e6 for t in self.times]


def _run(kind: str, scenario: str, waiting: int, steps: int, model_dir: Path) -> dict[str, Any]:
    from factory import SchedulerParams, fake_model_output, make_scheduler

    from horizonserve.runtime.engine.vllm_omni.scheduler import ar_scheduler
    from horizonserve.runtime.engine.vllm_omni.settings import resolve_config

    _setup_env(**({"late": "protect"} if scenario == "urgent" else {}))
    config = resolve_config()
    stage_id = 1 if scenario == "talker" else 0
    params = SchedulerParams(
        max_num_seqs=BATCH, max_num_batched_tokens=4096, num_blocks=20000, max_model_len=4096,
        stage_id=stage_id, model_stage="talker" if stage_id else "thinker",
    )  # fmt: skip
    cls = ar_scheduler if kind == "horizon" else None
    sched = make_scheduler("omni_ar", model_dir, params, scheduler_cls=cls)
    probe: Probe | AdmissionProbe | None = None
    if kind == "horizon":
        probe = AdmissionProbe(sched.hs_admission) if stage_id else Probe(sched.horizon)
    counter = 0
    rng = random.Random(0)

    def add(prio: int, max_tokens: int, age_s: float = 0.0) -> float:
        nonlocal counter
        counter += 1
        rid = f"{'S' if prio == 0 else 'L'}{counter}"
        request = _request(config, rid, prio, max_tokens, age_s)
        t0 = time.perf_counter()
        sched.add_request(request)
        return time.perf_counter() - t0

    admit_times: list[float] = []
    if scenario == "urgent":
        for _ in range(BATCH):  # the batch full of long speech decodes
            add(10, 100_000)
        while len(sched.running) < BATCH or sched.waiting:  # the long-path cap: 2 per step
            out = sched.schedule()
            sched.update_from_output(out, fake_model_output(sched, out))
        out = sched.schedule()  # one decode step: every request is past its prompt
        sched.update_from_output(out, fake_model_output(sched, out))
        text = config.slo.class_for_priority(0)  # the class priority code 0 maps to
        past_protect = config.slo.target_s(text.name)  # at its deadline: protected, kept so
        for _ in range(waiting):  # text requests waiting past their protection instant
            add(0, 100_000, age_s=past_protect)
    elif scenario == "talker":
        for _ in range(waiting):
            add(10, 1, age_s=rng.uniform(0.0, 9.0))
    elif scenario == "full":
        for _ in range(BATCH):  # fill the batch with long-decoding text requests
            add(0, 100_000)
        out = sched.schedule()
        sched.update_from_output(out, fake_model_output(sched, out))
        for i in range(waiting):
            add(10 if i % 2 else 0, 4)
    elif scenario == "mixed":
        for i in range(waiting):
            add(10 if i % 2 else 0, 1)
    else:  # burst
        for _ in range(waiting - 8):
            add(10, 1)
        for _ in range(8):
            add(0, 1)

    calls: list[float] = []
    admitted = 0
    for _ in range(steps):
        t0 = time.perf_counter()
        out = sched.schedule()
        calls.append((time.perf_counter() - t0) * 1e6)
        admitted += len(out.scheduled_new_reqs)
        sched.update_from_output(out, fake_model_output(sched, out))
        if scenario in ("mixed", "burst"):
            need = waiting - len(sched.waiting) - len(sched.skipped_waiting)
            for i in range(max(0, need)):
                prio = 10 if scenario == "burst" or i % 2 else 0
                admit_times.append(add(prio, 1))
        elif scenario == "talker":
            for _ in range(max(0, waiting - len(sched.waiting))):
                admit_times.append(add(10, 1, age_s=rng.uniform(0.0, 9.0)))
        assert abs(len(sched.waiting) - waiting) <= 2 * BATCH
    row: dict[str, Any] = {
        "call_p50": statistics.median(calls),
        "admitted": admitted / steps,
    }
    if probe is not None:
        plugin = probe.plugin_us()[5:]  # skip warm-up steps
        plugin.sort()
        row["plugin_p50"] = statistics.median(plugin)
        row["plugin_p95"] = plugin[int(0.95 * (len(plugin) - 1))]
        row["admit_us"] = statistics.median(admit_times) * 1e6 if admit_times else float("nan")
        if stage_id:
            row["swaps"] = sched.hs_admission.reorders
        else:
            row["swaps"] = sched.horizon.swaps
            row["preemptions"] = sched.horizon.preemptions
    return row


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--waiting", type=int, nargs="+", default=[16, 256, 1024])
    parser.add_argument("--steps", type=int, default=400)
    parser.add_argument(
        "--scenarios",
        nargs="+",
        default=["full", "mixed", "burst", "urgent", "talker"],
        choices=["full", "mixed", "burst", "urgent", "talker"],
    )
    args = parser.parse_args(argv)
    _setup_env()
    import logging

    logging.disable(logging.WARNING)
    from factory import require_vllm, write_tiny_model_dir

    del require_vllm
    model_dir = write_tiny_model_dir(tempfile.mkdtemp(prefix="hs-bench-model-"))
    print(f"# {_provenance()}")
    print(
        f"{'scenario':<8} {'waiting':>7} {'base call':>10} {'HS call':>9} {'plugin p50':>10} "
        f"{'plugin p95':>10} {'admit/req':>9} {'admitted/step':>13} {'views':>6} "
        f"{'preempt':>7}  (µs)"
    )
    for scenario in args.scenarios:
        for n in args.waiting:
            base = _run("base", scenario, n, args.steps, model_dir)
            hs = _run("horizon", scenario, n, args.steps, model_dir)
            admit = "-" if hs["admit_us"] != hs["admit_us"] else f"{hs['admit_us']:.1f}"
            print(
                f"{scenario:<8} {n:>7} {base['call_p50']:>10.1f} {hs['call_p50']:>9.1f} "
                f"{hs['plugin_p50']:>10.1f} {hs['plugin_p95']:>10.1f} {admit:>9} "
                f"{hs['admitted']:>13.2f} {hs['swaps']:>6} {hs.get('preemptions', '-'):>7}",
                flush=True,
            )
    print(f"# {_provenance()}")
    return 0


def _provenance() -> str:
    """The commit measured and the machine's load (the numbers are only as quiet as it)."""
    import subprocess

    try:
        commit = subprocess.run(
            ["git", "-C", str(HERE), "rev-parse", "--short", "HEAD"],
            capture_output=True, text=True, check=True,
        ).stdout.strip()  # fmt: skip
    except (OSError, subprocess.CalledProcessError):
        commit = "unknown"
    load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    return f"commit {commit}, {os.cpu_count()} CPUs, load average {load} (1/5/15 min)"


if __name__ == "__main__":
    raise SystemExit(main())
