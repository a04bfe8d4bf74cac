"""`horizonserve bench overhead`: per-request and per-step cost of the control core.

Measures, at several waiting-queue sizes, what the scheduler adds to each shared-stage step:
  * annotation   — classify, stamp deadline, estimate r̂, enter the waiting index (per request)
  * view         — plan the step and take the visible requests until the base scheduler's batch
                   is full (lazy view, batch of `--batch` prefills), averaged over whole rotation
                   cycles; the queue is in entry order and the engine passes a lookup, as the
                   simulator and the reference engine do, so long-path phases read their
                   members from the index. The queue stands between steps (the running set is
                   full: nothing is taken), so the index's views kept per state of the index
                   (`TemporalScheduler._memo`) serve every step after the first
  * view-changed — the same, each step right after a change to the index (an arrival, a request
                   taken): nothing kept is reused
  * view-on-time — the view on a queue whose requests all arrived in the last 10 ms and stay on
                   time (planned at one instant): every short-path prompt is visible, in
                   deadline order (`view_order`); `view`'s queue is an overloaded one whose
                   short-path prompts are late
  * view-worst   — the same on a queue ordered so that a long-path phase's few visible requests
                   sit at its tail
  * walk-worst   — view-worst without a lookup: the queue walk (the vLLM-Omni plugin's path),
                   which covers the whole queue there
  * view-split   — the materialised alternative: split the whole queue into visible / hidden
  * sm-cap       — EWMA update + Eq. (1) selection with hysteresis (per step)
  * split        — the slack split: the shared side's slack (16 running requests and the
                   waiting heap's top) and the choice between the two sides (per step)
  * downstream   — a downstream stage's admission with `waiting` requests queued there: one
                   arrival, the slack peek the split reads, one admission (per step)
  * places       — place-aware admission (`downstream` 'place') with `waiting` requests
                   queued and 16 places all taken: one arrival, the listing in place order and
                   the admission of its head (per freed place, not per step)
  * per-step-total — the sum of the medians of annotation (one request) + view + sm-cap +
                   split + downstream + places (`STEP_PARTS`): the whole step, place ordering
                   included (one freed place per step, the worst case); sm-cap and split each
                   hold one SM selection. The view is that of a standing queue
  * per-step-total-changed — the same with view-changed: a step right after the index changed
Times are wall-clock medians over repeated rounds of `time.perf_counter_ns` loops (CPython, one
core). The paper's Table 4 reference: 0.4 µs/request, 1.0 µs/step view, 0.3 µs/step SM cap.
"""

from __future__ import annotations

import itertools
import random
import statistics
import time
from collections.abc import Callable
from itertools import islice

from horizonserve.runtime.config import (
    ControlParams,
    ServingConfig,
    default_ladder,
    load_pipeline,
)
from horizonserve.runtime.downstream import SlackQueue, Stamp
from horizonserve.runtime.policy import SchedulingPolicy, make_policy
from horizonserve.runtime.profiler import InputFeatures, RequestSignals

SIZES = (16, 256, 1024, 4096)
# What per-step-total sums (a median each); per-step-total-changed has view-changed for view.
STEP_PARTS = ("annotation", "view", "sm-cap", "split", "downstream", "places")
PAPER_US = {"annotation": 0.4, "view": 1.0, "sm-cap": 0.3}


def _config() -> ServingConfig:
    """The embedded Qwen2.5-Omni classes (8 classes, text/speech output) and default ladder."""
    spec = load_pipeline("qwen2_5_omni")
    return ServingConfig(
        model=spec.model,
        pipeline=spec.name,
        slo=spec.slo,
        ladder=default_ladder(132),
        control=ControlParams(),
    )


def _ident(sig: RequestSignals) -> RequestSignals:
    return sig


def _median_ns(
    fn: Callable[[], int], rounds: int, setup: Callable[[], None] | None = None
) -> float:
    """Median over rounds of (elapsed ns / operations) for a function returning its op count."""
    samples = []
    for _ in range(rounds):
        if setup is not None:
            setup()
        t0 = time.perf_counter_ns()
        ops = fn()
        samples.append((time.perf_counter_ns() - t0) / ops)
    return statistics.median(samples)


def _filled_policy(n: int, seed: int, *, worst: bool = False, age_s: float = 1.0):  # type: ignore[no-untyped-def]
    """A horizon policy and its FCFS waiting queue of n requests of the embedded classes,
    arrived within the last `age_s` before time 0.

    The requests enter the index in queue order, as an engine's FIFO queue has them.
    worst: the queue is ordered so that a long-path phase's few visible requests (the
    earliest-deadline long-path prefills) sit at its tail, so a walk reaches the end.
    """
    rng = random.Random(seed)
    config = _config()
    names = [c.name for c in config.slo.classes]
    policy = make_policy("horizon", config)
    queue = []
    for i in range(n):
        arrival = rng.uniform(-age_s, 0.0)
        feats = InputFeatures(input_tokens=rng.randint(20, 2000))
        sig = policy.profiler.annotate(
            f"r{i}", arrival, class_name=rng.choice(names), features=feats
        )
        queue.append(sig)
    if worst:
        queue.sort(key=lambda s: (s.long_path, -s.deadline))
    else:
        queue.sort(key=lambda s: s.arrival)  # FCFS queue order
    for sig in queue:
        policy.temporal.add(sig, sig.arrival)
    return policy, queue


def measure(n: int, *, batch: int, rounds: int, seed: int = 0) -> dict[str, float]:
    rng = random.Random(seed)
    cfg = _config()

    # Annotation: admit n fresh requests into an empty policy (built outside the timing).
    fresh = [make_policy("horizon", cfg)]
    ids = [f"r{i}" for i in range(n)]
    prios = [(0, 10)[i % 2] for i in range(n)]  # API priority codes, as requests carry them

    def new_policy() -> None:
        fresh[0] = make_policy("horizon", cfg)

    def annotate() -> int:
        admit = fresh[0].admit
        for i in range(n):
            admit(ids[i], i * 1e-3, priority=prios[i])
        return n

    policy, queue = _filled_policy(n, seed)
    cycle = ControlParams().rotation_n_max + ControlParams().rotation_m
    clock = [0.0]

    def walk(
        p: SchedulingPolicy,
        q: list[RequestSignals],
        *,
        lookup: bool = True,
        tick: float = 0.005,
        changed: bool = False,
    ) -> Callable[[], int]:
        # The engine's map from a request's signals to its queued item (here: itself).
        get = {sig: sig for sig in q}.__getitem__ if lookup else None
        memo = p.temporal._memo  # what the index keeps while it stands; `changed`: forgotten

        def run() -> int:
            for _ in range(cycle):
                clock[0] += tick  # tick 0: planned at one instant (t = 0, every prompt on time)
                if changed:
                    memo.clear()  # as a change to the index does (the change's cost not timed)
                plan = p.temporal.plan(clock[0] if tick else 0.0)
                for _ in islice(plan.iter_visible(q, _ident, get), batch):
                    pass
            return cycle

        return run

    view = walk(policy, queue)
    view_changed = walk(*_filled_policy(n, seed), changed=True)
    view_on_time = walk(*_filled_policy(n, seed, age_s=0.01), tick=0.0)
    view_worst = walk(*_filled_policy(n, seed, worst=True))
    walk_worst = walk(*_filled_policy(n, seed, worst=True), lookup=False)

    def view_split() -> int:
        clock[0] += 0.005
        policy.temporal.plan(clock[0]).split(queue, _ident)
        return 1

    samples = [rng.random() for _ in range(1024)]
    spatial = policy.spatial

    def sm_cap() -> int:
        for i, s in enumerate(samples):
            spatial.observe(s)
            spatial.select(i % 7 != 0)
        return len(samples)

    # The slack split's inputs and choice: the shared side's slack over 16 running requests
    # (the engines pass those whose first response is pending) plus the waiting heap's top.
    # Only long-path requests wait, so the shared side's slack is computed in full (a waiting
    # short-path prompt would end it at once).
    longs = make_policy("horizon", cfg)
    for i in range(n):
        longs.admit(f"l{i}", i * 1e-6, priority=10)
    running = [longs.profiler.annotate(f"run{i}", 0.0, priority=10) for i in range(16)]
    slacks = [rng.uniform(-1.0, 8.0) for _ in range(64)]
    long_spatial = longs.spatial

    def split() -> int:
        for u_down in slacks:
            u_shared = longs._shared_slack(0.01, running)
            long_spatial.select(True, False, u_shared, u_down)
        return len(slacks)

    # Downstream admission with n requests queued at the stage: one arrival and one
    # admission (push + peek for the split + pop), as each freed place costs.
    down: SlackQueue[int] = SlackQueue()
    stamps = [
        Stamp(f"d{i}", "audio-speech", 10, 0.0, rng.uniform(1.0, 30.0), rng.uniform(0.1, 2.0))
        for i in range(256)
    ]
    ticket = itertools.count()
    for i in range(n):
        st = stamps[i % 256]
        down.push(next(ticket), st, st.downstream_s)

    def downstream() -> int:
        for k in range(64):
            st = stamps[k]
            down.push(next(ticket), st, st.downstream_s)  # keeps n queued: one in, one out
            down.peek_slack(0.5)
            down.pop(0.5)
        return 64

    placed: SlackQueue[int] = SlackQueue()
    for i in range(n):
        st = stamps[i % 256]
        placed.push(next(ticket), st, st.downstream_s, rng.uniform(50.0, 5000.0))
    free_at = sorted(rng.uniform(0.5, 10.0) for _ in range(16))

    def places() -> int:
        for k in range(8):
            st = stamps[k]
            placed.push(next(ticket), st, st.downstream_s, 1000.0)  # keeps n queued
            item, late = placed.order(0.5, free_at, 0.0058, 1)[0]
            placed.take(item, late)
        return 8

    return {
        "annotation": _median_ns(annotate, rounds, new_policy) / 1e3,
        "split": _median_ns(split, rounds) / 1e3,
        "downstream": _median_ns(downstream, rounds) / 1e3,
        "places": _median_ns(places, rounds) / 1e3,
        "view": _median_ns(view, rounds) / 1e3,
        "view-changed": _median_ns(view_changed, rounds) / 1e3,
        "view-on-time": _median_ns(view_on_time, rounds) / 1e3,
        "view-worst": _median_ns(view_worst, rounds) / 1e3,
        "walk-worst": _median_ns(walk_worst, rounds) / 1e3,
        "view-split": _median_ns(view_split, rounds) / 1e3,
        "sm-cap": _median_ns(sm_cap, rounds) / 1e3,
    }


def run_overhead(sizes: tuple[int, ...], *, batch: int, rounds: int) -> dict:
    rows = {str(n): measure(n, batch=batch, rounds=rounds) for n in sizes}
    for row in rows.values():
        row["per-step-total"] = sum(row[k] for k in STEP_PARTS)
        row["per-step-total-changed"] = row["per-step-total"] - row["view"] + row["view-changed"]
    return {
        "unit": "microseconds (annotation per request; others per step)",
        "per-step-total": " + ".join(STEP_PARTS),
        "per-step-total-changed": "per-step-total with view-changed for view",
        "batch": batch,
        "paper_table4_us": PAPER_US,
        "waiting": rows,
    }


def table(result: dict) -> str:
    cols = (
        "annotation",
        "view",
        "view-changed",
        "view-on-time",
        "view-worst",
        "walk-worst",
        "view-split",
        "sm-cap",
        "split",
        "downstream",
        "places",
        "per-step-total",
        "per-step-total-changed",
    )
    lines = [
        f"control-core overhead, µs (synthetic queue, batch {result['batch']}; "
        "annotation per request, the rest per step)",
        f"{'waiting':>8} " + " ".join(f"{c:>14}" for c in cols),
    ]
    for n, row in result["waiting"].items():
        lines.append(f"{n:>8} " + " ".join(f"{row[c]:>14.2f}" for c in cols))
    paper = result["paper_table4_us"]
    blank = f"{'':>14}"
    lines.append(
        f"{'paper':>8} {paper['annotation']:>14.2f} {paper['view']:>14.2f} {blank} {blank} "
        f"{blank} {blank} {blank} {paper['sm-cap']:>14.2f} {blank} {blank} {blank} {blank} "
        f"{blank}"
    )
    return "\n".join(lines)
