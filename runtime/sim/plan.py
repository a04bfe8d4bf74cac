"""Capacity planning: the highest arrival rate each system sustains at a target attainment.

For one calibration artifact, class mix and seed, every system is evaluated on the *same*
requests (one unit-rate trace, compressed in time to each candidate rate — common random
numbers), so attainment(λ) is a deterministic function of λ. The search brackets the answer by
doubling / halving from a starting rate, then bisects geometrically until the bracket
[λ_ok, λ_fail] is tighter than `tol` (relative): attainment(λ_ok) ≥ target and
attainment(λ_fail) < target were both simulated. The reported capacity is λ_ok.

Attainment(λ) need not be monotone on one finite trace; bisection returns *a* crossing inside
the first bracket found, which the report states with its two measured endpoints.

Steady state: a 30-s point is a transient (an overloaded talker's backlog is still growing at
its end, so attainment depends on the point's length). `SteadyTraces` gives every evaluated
rate its own point of `STEADY` length — a stated warm-up whose requests are not scored, then a
scored window — cut from one long unit-rate trace, so the points of different rates share
their requests (the point at rate λ is the time-compressed prefix of that sequence that fits
the point's length). Each result states the warm-up and window it was scored on.
"""

from __future__ import annotations

import math
import multiprocessing as mp
import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from typing import Any

import numpy as np

from horizonserve.runtime.sim.engine import simulate
from horizonserve.runtime.sim.setup import SimSetup
from horizonserve.runtime.workload import Trace, WorkloadSpec, generate


@dataclass(frozen=True)
class SteadyState:
    """The length of a steady-state point, in seconds at the point's own rate."""

    warmup_s: float = 60.0  # arrivals before this are simulated, not scored
    window_s: float = 240.0  # then this long is scored

    def describe(self) -> str:
        return (
            f"steady state: each rate simulated for {self.warmup_s + self.window_s:g} s, "
            f"attainment over the last {self.window_s:g} s (first {self.warmup_s:g} s warm-up)"
        )


STEADY = SteadyState()


@dataclass
class SteadyTraces:
    """Points of `steady` length at any rate up to `max_rate` from one unit-rate sequence:
    `scaled(rate)` stands in for `Trace.scaled` (module docstring). Above `max_rate` the
    sequence is drawn again, longer (its requests then differ from the earlier points')."""

    workload: WorkloadSpec
    mix: dict[str, float]
    seed: int = 0
    steady: SteadyState = STEADY
    burstiness: float = 1.0  # gamma shape of the gaps (1: Poisson), as `generate` takes it
    max_rate: float = 128.0
    _unit: Trace | None = field(default=None, repr=False)

    def _sequence(self, rate: float) -> Trace:
        if rate > self.max_rate or self._unit is None:
            self.max_rate = max(self.max_rate, rate)
            span = self.steady.warmup_s + self.steady.window_s
            n = math.ceil(self.max_rate * span * 1.2) + 64
            self._unit = generate(
                self.workload,
                self.mix,
                rate=1.0,
                n_requests=n,
                seed=self.seed,
                burstiness=self.burstiness,
            )
        return self._unit

    def scaled(self, rate: float) -> Trace:
        s = self.steady
        span = s.warmup_s + s.window_s
        t = self._sequence(rate).scaled(rate)
        n = int(np.searchsorted(t.arrival, span, side="left"))
        cols = ("cls", "arrival", "text_tokens", "audio_s", "images", "video_s",
                "output_tokens", "output_audio_s")  # fmt: skip
        return replace(
            t, **{c: getattr(t, c)[:n] for c in cols}, duration_s=span, warmup_s=s.warmup_s
        )


@dataclass(frozen=True)
class SeedPanel:
    """One point per seed at every rate: a rate's attainment is the mean over the panel's
    points, each simulated with its own seed (short points are noisy; the mean of several is
    what a sweep of repeated runs measures). Every source has the same shape."""

    sources: tuple[Trace | SteadyTraces, ...]
    seeds: tuple[int, ...]

    def __post_init__(self) -> None:
        if not self.sources or len(self.sources) != len(self.seeds):
            raise ValueError("a seed panel needs one seed per source, at least one")


Source = Trace | SteadyTraces | SeedPanel


def scored_window(unit: Source, rate: float) -> tuple[float, float]:
    """(warm-up s, scored window s) of the point `unit` gives at `rate`."""
    if isinstance(unit, SeedPanel):
        return scored_window(unit.sources[0], rate)
    if isinstance(unit, SteadyTraces):
        return unit.steady.warmup_s, unit.steady.window_s
    k = unit.rate / rate
    return unit.warmup_s * k, (unit.duration_s - unit.warmup_s) * k


MIN_RATE = 1e-3
MAX_RATE = 1e4


@dataclass
class PlanResult:
    system: str
    target: float
    rate_ok: float  # highest rate measured with attainment ≥ target (0: none found)
    rate_fail: float  # a rate above it measured below target (inf: none found)
    attainment_ok: float | None
    attainment_fail: float | None
    evaluations: list[tuple[float, float]] = field(default_factory=list)
    wall_s: float = 0.0
    warmup_s: float | None = None  # warm-up of the point at rate_ok (not scored)
    window_s: float | None = None  # scored window of the point at rate_ok

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        d["rate_fail"] = None if math.isinf(self.rate_fail) else self.rate_fail
        return d


def attainment_at(setup: SimSetup, unit: Source, system: str, rate: float, seed: int) -> float:
    """Attainment of `system` at `rate` (a panel: the mean over its seeds, `seed` unused)."""
    if isinstance(unit, SeedPanel):
        return statistics.fmean(
            attainment_at(setup, u, system, rate, k)
            for u, k in zip(unit.sources, unit.seeds, strict=True)
        )
    r = simulate(setup, unit.scaled(rate), system, seed=seed)
    a = r.attainment()
    return 0.0 if math.isnan(a) else a


def plan_system(
    setup: SimSetup,
    unit: Source,
    system: str,
    *,
    target: float = 0.9,
    tol: float = 0.01,
    start: float = 1.0,
    seed: int = 0,
) -> PlanResult:
    """Bracket then bisect the sustainable rate of one system (see module docstring)."""
    if not 0 < target <= 1:
        raise ValueError(f"target attainment must be in (0, 1], got {target}")
    if tol <= 0:
        raise ValueError(f"tolerance must be positive, got {tol}")
    t0 = time.perf_counter()
    evals: list[tuple[float, float]] = []

    def f(rate: float) -> float:
        a = attainment_at(setup, unit, system, rate, seed)
        evals.append((rate, a))
        return a

    ok, fail = 0.0, math.inf
    a_ok: float | None = None
    a_fail: float | None = None
    rate = start
    a = f(rate)
    if a >= target:
        ok, a_ok = rate, a
        while math.isinf(fail) and rate < MAX_RATE:
            rate *= 2
            a = f(rate)
            if a >= target:
                ok, a_ok = rate, a
            else:
                fail, a_fail = rate, a
    else:
        fail, a_fail = rate, a
        while ok == 0.0 and rate > MIN_RATE:
            rate /= 2
            a = f(rate)
            if a >= target:
                ok, a_ok = rate, a
            else:
                fail, a_fail = rate, a
    while ok > 0 and not math.isinf(fail) and fail / ok - 1 > tol:
        mid = math.sqrt(ok * fail)
        a = f(mid)
        if a >= target:
            ok, a_ok = mid, a
        else:
            fail, a_fail = mid, a
    warm, window = scored_window(unit, ok) if ok > 0 else (None, None)
    return PlanResult(
        system=system,
        target=target,
        rate_ok=ok,
        rate_fail=fail,
        attainment_ok=a_ok,
        attainment_fail=a_fail,
        evaluations=evals,
        wall_s=time.perf_counter() - t0,
        warmup_s=warm,
        window_s=window,
    )


_CTX: tuple[SimSetup, Source, dict[str, Any]] | None = None


def _init(setup: SimSetup, unit: Source, kw: dict[str, Any]) -> None:
    global _CTX
    _CTX = (setup, unit, kw)


def _one(system: str) -> PlanResult:
    assert _CTX is not None
    setup, unit, kw = _CTX
    return plan_system(setup, unit, system, **kw)


def plan(
    setup: SimSetup,
    unit: Source,
    systems: list[str],
    *,
    target: float = 0.9,
    tol: float = 0.01,
    start: float = 1.0,
    seed: int = 0,
    jobs: int = 1,
    on_done: Callable[[PlanResult], None] | None = None,
) -> list[PlanResult]:
    """`plan_system` for each system, spread over `jobs` processes (results in `systems`
    order; `on_done` is called as each system finishes, e.g. for a progress bar)."""
    kw = {"target": target, "tol": tol, "start": start, "seed": seed}
    done = on_done or (lambda _r: None)
    if jobs <= 1 or len(systems) <= 1:
        out = []
        for s in systems:
            out.append(plan_system(setup, unit, s, **kw))  # type: ignore[arg-type]
            done(out[-1])
        return out
    ctx = mp.get_context("fork") if "fork" in mp.get_all_start_methods() else mp.get_context()
    by_system: dict[str, PlanResult] = {}
    with ctx.Pool(min(jobs, len(systems)), initializer=_init, initargs=(setup, unit, kw)) as pool:
        for r in pool.imap_unordered(_one, systems):
            by_system[r.system] = r
            done(r)
    return [by_system[s] for s in systems]
