"""Simulator: data validity, determinism, speed, and the policy relations it must show.

Short seeded runs of Qwen2.5-Omni; each relation is what the bench reports at full length, so a
regression in any policy (or in the model) fails here. Two calibration artifacts, always named:

* `h200-fitted.json` (DEFAULT_ARTIFACT): measured on the H200 by `horizonserve calibrate`, its
  Qwen contention factors fitted to the H200 campaign qwen-v5 as the reference engine ran it
  (`horizonserve calibrate fit --engine reference`: the "tuned" deploy profile's limits written
  into the entry, prefill and decode as two calls, prompts padded to buckets; the objective
  also scores the simulated solo text latency), what users get. The shipped pipeline profiles
  and solo p95 defaults derive from it; the "measured" fixtures below run it.
* `default-h200.json` (the paper-derived ESTIMATE): a contention model anchored on the paper's
  figures (full allocation under co-running costs the shared stage 1.6x, MPS keeps a quarter of
  that). Relations that are properties of the policy under such a model are pinned to it.

Relation thresholds hold on every tested seed (0, 1, 2); each comment gives the smallest value
the statistic took over seeds 0–7 on that artifact (the margin), re-measured with the defaults:
the urgent-prefill boost on (while downstream stages run, a prefill carrying a short-path or
protected prompt runs on S_aggr, its decode at the cap), and the backlog lift as the artifact
decides it (`PipelineCalibration.control()`: while the shared stage's running set is full and
requests wait, the whole iteration runs on S_aggr; on for the measured artifact's Qwen, off for
the estimate's, whose co-running decode is slower at S_aggr under MPS than at the cap). Where
the measured H200 model reverses a paper relation (HorizonServe vs MPS; SM throttling vs
uncapped MPS), the test asserts what does hold there and says so.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np
import pytest

from horizonserve.runtime.artifact import DEFAULT_ARTIFACT, load_artifact, load_packaged
from horizonserve.runtime.config import PIPELINES, ControlParams, load_pipeline
from horizonserve.runtime.sim import LABEL, SimResult, SimSetup, simulate
from horizonserve.runtime.sim.engine import Simulator
from horizonserve.runtime.sim.model import SharedCost, Sharing
from horizonserve.runtime.sim.plan import attainment_at, plan_system
from horizonserve.runtime.sim.profiles import derive_profile
from horizonserve.runtime.sim.setup import engine_calibration
from horizonserve.runtime.sim.solo import measure_solo_p95
from horizonserve.runtime.sim.systems import BASELINES
from horizonserve.runtime.spatial import LIFTED, UNCAPPED
from horizonserve.runtime.workload import (
    Trace,
    WorkloadSpec,
    generate,
    load_workload,
    mix_weights,
)

PIPE = "qwen2_5_omni"
MEASURED = "h200-fitted.json"  # the default: the H200 calibration, fitted to the campaign
PAPER_ESTIMATE = "default-h200.json"  # the paper-derived estimate, pinned by name
STRESSED_RATES = (6.0, 7.0, 8.0)  # req/s: the top half of the default Qwen sweep (2 … 8)
LONG_SWEEP_RATE = 6.0  # req/s: the workload file's long-path sweep load
SEEDS = (0, 1, 2)  # trace and simulator seed of each relation run
NON_MPS_BASELINES = tuple(b for b in BASELINES if "mps" not in b)


def _axes(setup: SimSetup, **axes: str) -> ControlParams:
    """`setup`'s control with `axes` set (validated: the axes become enums)."""
    return ControlParams.model_validate({**setup.control.model_dump(), **axes})


def _solo_setup(artifact: str) -> SimSetup:
    s = SimSetup.load(PIPE, load_packaged(artifact))
    p95 = measure_solo_p95(s, load_workload(PIPE), n=200, seed=0)
    return s.with_solo_p95(p95, "test")


@pytest.fixture(scope="module")
def setup() -> SimSetup:
    """The default artifact (the measured H200 one), SLOs from simulated solo p95."""
    return _solo_setup(DEFAULT_ARTIFACT)


@pytest.fixture(scope="module")
def estimate_setup() -> SimSetup:
    return _solo_setup(PAPER_ESTIMATE)


@pytest.fixture(scope="module")
def workload() -> WorkloadSpec:
    return load_workload(PIPE)


def _trace(
    setup: SimSetup,
    workload: WorkloadSpec,
    rate: float,
    long_ratio: float | None = None,
    dur: float = 120.0,
    seed: int = 0,
) -> Trace:
    mix = mix_weights(workload, setup.long_classes, long_ratio)
    return generate(workload, mix, rate=rate, duration_s=dur, warmup_s=dur / 10, seed=seed)


class Runs:
    """Seeded runs of one artifact, memoised so that relations share their runs."""

    def __init__(self, setup: SimSetup, workload: WorkloadSpec) -> None:
        self.setup = setup
        self.workload = workload
        self._cache: dict[tuple[object, ...], SimResult] = {}

    def run(
        self,
        system: str,
        rate: float,
        ratio: float | None = None,
        dur: float = 120.0,
        seed: int = 0,
    ) -> SimResult:
        key = (system, rate, ratio, dur, seed)
        if key not in self._cache:
            tr = _trace(self.setup, self.workload, rate, ratio, dur, seed)
            self._cache[key] = simulate(self.setup, tr, system, seed=seed)
        return self._cache[key]

    def stressed(self, system: str, seed: int) -> float:
        """Mean attainment over the stressed rates at the default class mix."""
        return float(np.mean([self.run(system, r, seed=seed).attainment() for r in STRESSED_RATES]))


@pytest.fixture(scope="module")
def measured_runs(setup: SimSetup, workload: WorkloadSpec) -> Runs:
    return Runs(setup, workload)


@pytest.fixture(scope="module")
def estimate_runs(estimate_setup: SimSetup, workload: WorkloadSpec) -> Runs:
    return Runs(estimate_setup, workload)


# -- data ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", PIPELINES)
def test_data_files_validate_and_agree(name: str) -> None:
    spec = load_pipeline(name)
    workload = load_workload(name)
    cal = engine_calibration(name, load_artifact().pipeline(name))  # + its deploy profile
    assert spec.model == cal.model
    classes = {c.name for c in spec.slo.classes}
    assert classes == {c.name for c in workload.classes}
    assert set(cal.solo_p95_s) == classes
    # The shipped r̂ profiles are exactly what the default artifact derives, and say so.
    for rc in spec.slo.classes:
        assert rc.profile == derive_profile(cal, workload, workload.get(rc.name), rc)
    assert f"runtime/data/calibration/{DEFAULT_ARTIFACT}" in spec.source
    assert "measured on the GPU" in spec.source and "simulated" in spec.source
    assert len(spec.slo.classes) == {"qwen2_5_omni": 8, "mimo_audio": 4, "bagel": 4}[name]


def test_default_artifact_is_the_measured_h200() -> None:
    art = load_artifact()
    assert DEFAULT_ARTIFACT == MEASURED
    assert art.schema_version == 1
    assert art.source.startswith("measured on NVIDIA H200")
    assert "horizonserve calibrate" in art.source
    assert art.key(PIPE) == "Qwen/Qwen2.5-Omni-7B|NVIDIA H200|580.159.04|132"
    cal = art.pipeline(PIPE)
    # Fitted as the reference engine ran the campaign: the "tuned" profile's limits are in the
    # entry itself (no profile to apply on top).
    assert cal.fit is not None and cal.fit.engine == "reference"
    assert cal.fit.deploy_profile == "tuned" and cal.deploy_profile is None
    assert engine_calibration(PIPE, cal, "tuned") == cal
    for p in art.pipelines.values():
        assert p.solo_p95_source and p.solo_p95_source.startswith("measured")


def test_paper_estimate_is_keyed_and_sourced() -> None:
    art = load_packaged(PAPER_ESTIMATE)
    assert art.schema_version == 1
    assert "not an H200 calibration" in art.source
    assert art.key(PIPE) == "Qwen/Qwen2.5-Omni-7B|NVIDIA H200|unknown (not measured)|132"
    decode = art.pipeline(PIPE).shared.decode_step_s
    # The paper's published points (§3.3) are in the curve.
    assert decode.at(64) == pytest.approx(4.80e-3)
    assert decode.at(80) == pytest.approx(4.65e-3)
    assert decode.at(120) == pytest.approx(5.57e-3)


def test_profiles_follow_the_simulated_artifact(setup: SimSetup, estimate_setup) -> None:
    """r̂ profiles come from the artifact being simulated; on the default one, the shipped ones."""
    shipped = load_pipeline(PIPE).slo.classes
    assert [c.profile for c in setup.slo.classes] == [c.profile for c in shipped]
    assert [c.profile for c in estimate_setup.slo.classes] != [c.profile for c in shipped]


def test_solo_p95_defaults_are_reproducible(setup: SimSetup) -> None:
    """The pipeline file's solo p95 defaults are the simulator's on the default artifact."""
    shipped = {c.name: c.solo_p95_s for c in load_pipeline(PIPE).slo.classes}
    measured = {c.name: c.solo_p95_s for c in setup.slo.classes}
    for name, v in shipped.items():
        assert measured[name] == pytest.approx(v, rel=1e-3, abs=1e-4), name


def test_paper_estimate_solo_p95_is_the_simulators(estimate_setup: SimSetup) -> None:
    """The estimate has no GPU measurement: its solo p95 are simulated on itself, and say so."""
    cal = load_packaged(PAPER_ESTIMATE).pipeline(PIPE)
    assert cal.solo_p95_source and cal.solo_p95_source.startswith("simulated")
    for c in estimate_setup.slo.classes:
        assert c.solo_p95_s == pytest.approx(cal.solo_p95_s[c.name], rel=1e-3, abs=1e-4), c.name


# -- determinism and speed ------------------------------------------------------------------------
def test_deterministic_for_a_seed(setup: SimSetup, workload) -> None:
    tr = _trace(setup, workload, 5.0, dur=60.0)
    a = simulate(setup, tr, "horizon", seed=3)
    b = simulate(setup, tr, "horizon", seed=3)
    np.testing.assert_array_equal(a.latency, b.latency)
    assert a.stats["iterations"] == b.stats["iterations"]
    c = simulate(setup, _trace(setup, workload, 5.0, dur=60.0, seed=4), "horizon", seed=4)
    assert not np.array_equal(np.nan_to_num(a.latency[:50]), np.nan_to_num(c.latency[:50]))
    assert a.label == LABEL == "simulated"


def test_at_least_100x_real_time(setup: SimSetup, workload) -> None:
    r = simulate(setup, _trace(setup, workload, LONG_SWEEP_RATE, dur=120.0), "horizon")
    # CPU time of this process, so a busy CI machine does not fail the test.
    assert r.stats["cpu_speed_x"] >= 100, r.stats


# -- urgent-prefill boost --------------------------------------------------------------------------
T1 = 1.0  # s: arrival of the probe request; the first request's speech is still downstream then


def _probe_trace(setup: SimSetup, cls: str, prompt: int, out: int = 3, t1: float = T1) -> Trace:
    """A long-path request at 0 (2 tokens, then 20 s of speech downstream), then the probe:
    `cls` with a `prompt`-token text prompt at `t1`, when the shared stage is idle."""
    names = setup.class_names
    return Trace(
        classes=names,
        cls=np.array([names.index("text-speech"), names.index(cls)]),
        arrival=np.array([0.0, t1]),
        text_tokens=np.array([16, prompt]),
        audio_s=np.zeros(2),
        images=np.zeros(2, dtype=np.int64),
        video_s=np.zeros(2),
        output_tokens=np.array([2, out]),
        output_audio_s=np.array([20.0, 0.0]),
        duration_s=t1 + 1.0,
    )


def _probe(
    setup: SimSetup, trace: Trace, system: str = "horizon", boost: bool = True
) -> tuple[SimResult, int, bool, list[int]]:
    """(result, boosted iterations, downstream active at the probe, caps from the probe on)."""
    # Eq. (1)'s ladder alone: the slack split and an OPEN shared level would pick other caps.
    control = _axes(
        setup, boost="prefill-backlog" if boost else "backlog", sm_split="ladder",
        downstream_urgency="slack",
    )  # fmt: skip
    verdicts = setup.cal.verdicts().model_copy(update={"throttling_pays": True})
    r = simulate(
        replace(setup, control=control, verdicts=verdicts), trace, system, record_trace=True
    )
    tr = r.trace
    assert tr is not None
    i = tr["t"].index(float(trace.arrival[1]))
    boosted = round(r.stats["boosted_frac"] * r.stats["iterations"])
    return r, boosted, bool(tr["down_active"][i]), tr["cap"][i:]


def test_boost_runs_a_short_path_prefill_on_s_aggr_while_downstream_is_active(setup) -> None:
    """The probe's TTFT is the prefill part of its one prefill iteration, on S_aggr with the MPS
    co-run factor (the default artifact's engine runs prefill and decode as two calls, and pads
    the 500-token prompt to its 512 bucket); its decode iterations are not boosted."""
    cost, aggr = SharedCost(setup.cal), setup.cal.ladder.aggressive
    assert setup.cal.shared.prefill_then_decode and 512 in (setup.cal.shared.prefill_buckets or ())
    r, boosted, active, caps = _probe(setup, _probe_trace(setup, "text-text", 500))
    assert active and caps[0] < aggr and boosted == 1
    prefill, _ = cost.boosted_iteration_s(caps[0], aggr, 0, 512, 0)
    assert r.latency[1] == pytest.approx(prefill)
    # Off: the same prefill call at the cap (a cap switch: the stage was last at S_aggr).
    off, boosted, _, caps_off = _probe(setup, _probe_trace(setup, "text-text", 500), boost=False)
    capped = cost.iteration_s(caps_off[0], 0, 512, 0, True, Sharing.PARTITION, True)
    assert boosted == 0 and off.latency[1] == pytest.approx(capped)
    # Fitted H200 default, cap 48: the prefill part, the TTFT, runs ×2.27 faster on S_aggr
    # (20.6 against 47.0 ms; bench/results/sim-fit-qwen/margins/margins.txt).
    assert r.latency[1] < 0.5 * off.latency[1]


def test_boost_covers_chunk_continuations_of_an_urgent_prompt(setup) -> None:
    """A prompt of 1.5 token budgets (8192 on the default artifact, the tuned profile's) takes
    two chunks; both run on S_aggr. With prefill and decode as two calls the first token comes
    at the second prefill call's end; the first iteration has no sequence to decode (only its
    switch back to the cap); 8192 is past the largest bucket, 4096 is one."""
    budget = setup.cal.shared.max_num_batched_tokens
    prompt = budget + budget // 2
    cost, aggr = SharedCost(setup.cal), setup.cal.ladder.aggressive
    r, boosted, active, caps = _probe(setup, _probe_trace(setup, "text-text", prompt, out=1))
    first = cost.boosted_iteration_s(caps[0], aggr, 0, budget, 0)
    second = cost.boosted_iteration_s(caps[1], aggr, 0, prompt - budget, 0)
    assert setup.cal.shared.prefill_then_decode and active and boosted == 2
    assert r.latency[1] == pytest.approx(sum(first) + second[0])


@pytest.mark.parametrize(
    ("case", "system", "t1"),
    [
        ("relaxed long-path prompt", "horizon", T1),
        ("downstream idle: S_aggr anyway", "horizon", 60.0),
        ("uncapped baseline", "mps", T1),
        ("uncapped ablation", "horizon-no-throttling", T1),
    ],
)
def test_boost_leaves_every_other_iteration_alone(setup, case, system, t1) -> None:
    cls = "text-speech" if case.startswith("relaxed") else "text-text"
    _, boosted, active, _ = _probe(setup, _probe_trace(setup, cls, 500, t1=t1), system)
    assert active == (t1 == T1), case
    assert boosted == 0, case


def test_boost_covers_a_protected_long_path_prompt(setup) -> None:
    """With targets of a thousandth of solo p95, the long-path probe is protected on arrival."""
    tight = setup.with_solo_p95({}, "test", multiplier=1e-3)
    _, boosted, active, _ = _probe(tight, _probe_trace(tight, "text-speech", 500))
    assert active and boosted == 1


# -- backlog lift ----------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Iteration:
    """One shared-stage iteration: the state it started from, and what the engine ran."""

    full: bool  # every sequence slot taken before admission
    waiting: bool  # requests waiting before admission
    active: bool  # a downstream stage active
    level: int
    sms: int
    down_sms: int
    sharing: Sharing
    duration: float
    seqs: int  # the decode step's rows (only the running ones when prefill is its own call)
    prefill_tokens: int  # padded to the engine's prefill bucket
    cached_tokens: int
    switched: bool  # SM count differs from the previous decision's


class LoggingSimulator(Simulator):
    """The simulator, recording every iteration it starts (its own state, nothing replaced)."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.log: list[Iteration] = []

    def _start_iteration(self, now: float) -> None:
        shared = self.shared
        full, waiting = len(shared.running) >= shared.max_seqs, bool(shared.waiting)
        active, busy, prev = self._downstream_active(), self.busy_time, self.prev_decided_sms
        super()._start_iteration(now)
        batch = self.batch
        if batch is None:
            return
        self.log.append(
            Iteration(
                full,
                waiting,
                active,
                self.level,  # type: ignore[arg-type]
                self.sms,
                self.down_sms,
                self.sharing,
                self.busy_time - busy,
                len(batch.decodes) if self.split else batch.seqs,
                batch.padded_tokens,
                batch.cached_tokens,
                prev is not None and prev != self.sms,
            )
        )


def _logged(
    setup: SimSetup, system: str, *, lift: bool = True, long_ratio: float | None = None
) -> tuple[SimResult, list[Iteration]]:
    """30 s at 16 req/s, default artifact: the shared stage's 48-slot running set fills (at
    seed 0, 1449–1616 backlogged co-running iterations of 2894–3177 for every system; at
    12 req/s 62–526, the uncapped MPS systems 62–70; at 8 req/s none at all)."""
    control = _axes(setup, sm_split="ladder", downstream_urgency="slack")
    verdicts = setup.cal.verdicts().model_copy(
        update={"backlog_lift_pays": lift, "throttling_pays": True}
    )
    tr = _trace(setup, load_workload(PIPE), 16.0, long_ratio, dur=30.0)
    sim = LoggingSimulator(replace(setup, control=control, verdicts=verdicts), tr, system)
    return sim.run(), sim.log


def test_lift_runs_exactly_the_backlogged_co_running_iterations_on_s_aggr(setup) -> None:
    """Lifted ⇔ running set full, requests waiting, a downstream stage active. A lifted
    iteration is an S_aggr iteration overlapping the downstream as under MPS (`iteration_s`
    with the MPS factors); the downstream keeps S_tot − S_cap."""
    ladder, cost = setup.cal.ladder, SharedCost(setup.cal)
    r, log = _logged(setup, "horizon")
    lifted = [it for it in log if it.level == LIFTED]
    backlogged = [it.full and it.waiting and it.active for it in log]
    assert [it.level == LIFTED for it in log] == backlogged
    assert 0 < len(lifted) < len(log) and r.stats["lifted_frac"] == len(lifted) / len(log)
    assert any(it.active and it.level >= 0 for it in log)  # the cap still runs when not full
    for it in lifted:
        assert (it.sms, it.down_sms, it.sharing) == (
            ladder.aggressive,
            ladder.total - ladder.s_cap,
            Sharing.MPS,
        )
        expected = cost.iteration_s(
            it.sms, it.seqs, it.prefill_tokens, it.cached_tokens, True, Sharing.MPS, it.switched
        )
        assert it.duration == pytest.approx(expected)


def test_lift_needs_an_active_downstream_stage(setup) -> None:
    """Short-path traffic only: the running set fills, but nothing co-runs (S_aggr anyway)."""
    r, log = _logged(setup, "horizon", long_ratio=0.0)
    assert any(it.full and it.waiting for it in log)
    assert not any(it.active or it.level == LIFTED for it in log)
    assert r.stats["lifted_frac"] == 0.0


@pytest.mark.parametrize("system", ["horizon", *BASELINES, "horizon-no-throttling"])
def test_no_lift_when_switched_off_or_uncapped(setup, system: str) -> None:
    """backlog_lift_pays=False keeps HorizonServe on its ladder; uncapped systems never lift."""
    lift = system != "horizon"
    r, log = _logged(setup, system, lift=lift)
    assert any(it.full and it.waiting and it.active for it in log)
    assert r.stats["lifted_frac"] == 0.0
    if lift:
        assert {it.level for it in log} == {UNCAPPED}
    else:
        assert {it.level for it in log if it.active} <= set(range(len(setup.cal.ladder.levels)))


# -- relations -------------------------------------------------------------------------------------
FCFS_FALL = 0.15  # short-path attainment points lost from 0 % to 30 % and to 60 % long-path
# Fall over seeds 0–7 (30 % / 60 %): estimate ≥ 0.417 / 0.264; on the tested seeds ≥ 0.343.
# (FCFS has no SM controller, so neither the hysteresis change nor the backlog lift changed
# these.) Not on the fitted H200 default: with the engine's 48 thinker slots and 8192-token
# budget the shared stage barely queues at 6 req/s, and the fall was −0.011–0.009 /
# −0.015–0.007 on seeds 0–7 (bench/results/sim-fit-qwen/margins/margins.txt) — as on the H200
# itself (FCFS short-path 95.9 % at 30 % long-path, 97.3 % at 60 %, campaign qwen2_5_omni-2).
# On the measured artifact before any fit (16 slots, 4096 tokens) it was ≥ 0.303 / 0.180.


@pytest.mark.parametrize("art", ["estimate"])
def test_fcfs_short_path_attainment_falls_as_long_path_share_rises(request, art: str) -> None:
    runs: Runs = request.getfixturevalue(f"{art}_runs")
    for seed in SEEDS:
        short = {}
        for ratio in (0.0, 0.3, 0.6):
            r = runs.run("fcfs", LONG_SWEEP_RATE, ratio, dur=90.0, seed=seed)
            short[ratio] = r.attainment(r.short_mask())
        assert short[0.3] < short[0.0] - FCFS_FALL, (seed, short)
        assert short[0.6] < short[0.0] - FCFS_FALL, (seed, short)


def test_horizon_beats_every_baseline_under_the_paper_estimate(estimate_runs: Runs) -> None:
    """Paper Fig. 8 under the paper-like contention model, MPS and EDF-MPS included.

    Per seed, mean attainment over the stressed rates. Over seeds 0–7 HorizonServe led the best
    baseline (MPS each time) by ≥ 0.113 (ratio ≥ 1.158, seed 3); tested seeds ≥ 0.138 (1.227).
    The backlog lift is off here, as the artifact decides: on this model a co-running decode
    step at S_aggr under MPS is slower than at the cap in its partition (16 sequences: 7.5
    against 6.8 ms; the paper's decode points rise from 4.65 ms at 80 SMs to 5.57 ms at 120),
    so lifting would slow the shared stage and, through the MPS factor, the talker. Forced on,
    the lead shrank to ≥ 0.033 (ratio ≥ 1.047, seed 3).
    """
    for seed in SEEDS:
        att = {s: estimate_runs.stressed(s, seed) for s in ("horizon", *BASELINES)}
        best = max(att[s] for s in BASELINES)
        assert att["horizon"] > best + 0.08, (seed, att)
        assert att["horizon"] / best > 1.12, (seed, att)


def test_horizon_beats_the_non_mps_baselines_on_the_measured_h200(measured_runs: Runs) -> None:
    """What holds on the fitted H200 default: HorizonServe ≫ Vanilla (FCFS) and EDF.

    Over seeds 0–7 the lead over the better of FCFS/EDF/priority was 0.263–0.306 (mean
    attainment over the stressed rates; seed 2 the smallest;
    bench/results/sim-fit-h200-2/margins/margins.txt; 0.246–0.297 on the default fitted to the
    quick calibration, bench/results/sim-fit-qwen/margins/). The time-sliced systems rest on
    the entry's time-slice factor, carried from the fit to qwen2_5_omni-2's time-sliced runs:
    the campaign of the current fit measured none.
    """
    for seed in SEEDS:
        att = {s: measured_runs.stressed(s, seed) for s in ("horizon", *NON_MPS_BASELINES)}
        best = max(att[s] for s in NON_MPS_BASELINES)
        assert att["horizon"] > best + 0.18, (seed, att)


def test_horizon_beats_every_baseline_on_the_fitted_h200(measured_runs: Runs) -> None:
    """The fitted H200 default, every baseline (Priority and the MPS ones included).

    Mean attainment over the stressed rates. Over seeds 0–7 HorizonServe led the best baseline
    (MPS each time) by 0.124–0.259 (seed 2 the smallest; margins.txt as above; 0.126–0.261 on
    the default fitted to the quick calibration). The lead is
    the talker's slack-ordered admission and the split the calibration picks for this pipeline
    (uncapped under MPS, no reservation)."""
    for seed in SEEDS:
        att = {s: measured_runs.stressed(s, seed) for s in ("horizon", *BASELINES)}
        best = max(att[s] for s in BASELINES)
        assert att["horizon"] > best + 0.09, (seed, att)


def test_removing_downstream_control_loses_on_the_fitted_h200(measured_runs: Runs) -> None:
    """The "w/o downstream control" ablation (FIFO talker admission, nothing yields).

    Over seeds 0–7 it lost 0.011–0.106 of mean attainment over the stressed rates (seed 7 the
    smallest); tested seeds ≥ 0.026 (bench/results/sim-fit-h200-2/margins/margins.txt; 0.007–0.093
    on the default fitted to the quick calibration). The loss is at 7 and 8 req/s (0.001–0.202
    per seed); at 6 req/s the two are within 0.017. The
    previous entry (fitted to qwen2_5_omni-2) lost 0.036–0.158 on today's code
    (margins-previous-entry.txt there); its margin 0.05 came from 0.069–0.178, measured before
    later controller changes."""
    for seed in SEEDS:
        full = measured_runs.stressed("horizon", seed)
        ablated = measured_runs.stressed("horizon-no-downstream", seed)
        assert ablated < full - 0.005, (seed, full, ablated)


def test_preemption_never_costs_attainment_on_the_fitted_h200(measured_runs: Runs) -> None:
    """The never-worse rule for the preemption mechanism: HorizonServe with it is not below
    the "w/o preemption" ablation. Over seeds 0–7 the two were equal at the stressed rates
    (0.000 each seed): the rule's conditions — a protected short-path prompt blocked by a full
    running set, no place freeing in time, no unprotected short-path prompt waiting — never
    met there (the shared stage's 48 places do not fill)."""
    for seed in SEEDS:
        full = measured_runs.stressed("horizon", seed)
        ablated = measured_runs.stressed("horizon-no-preemption", seed)
        assert full >= ablated - 0.01, (seed, full, ablated)


def test_slack_split_beats_the_split_without_it_on_the_fitted_h200(
    setup: SimSetup, workload: WorkloadSpec, measured_runs: Runs
) -> None:
    """The never-worse rule for the slack split: HorizonServe with `sm_split` 'slack' against the
    same controller without it (here: uncapped under MPS throughout, as the calibration's
    `throttling_pays` false leaves it). Over seeds 0–7 the split gained 0.014–0.036 of mean
    attainment over the stressed rates (seed 2 the smallest; tested seeds ≥ 0.014): an urgent
    talker gets S_tot − S_min instead of sharing the whole GPU as an MPS client
    (bench/results/sim/defaults-places-deadline/margins/margins.txt). Before place admission
    and the deadline-ordered view it gained 0.036–0.085: place admission starts the streams
    that can still make it, part of what the faster talker bought."""
    off = replace(setup, control=_axes(setup, sm_split="ladder", downstream_urgency="slack"))
    off_runs = Runs(off, workload)
    for seed in SEEDS:
        on, without = measured_runs.stressed("horizon", seed), off_runs.stressed("horizon", seed)
        assert on > without + 0.01, (seed, on, without)


def test_removing_sm_throttling_loses_under_the_paper_estimate(estimate_runs: Runs) -> None:
    """Paper Fig. 11 (throttling bar) under the paper-like contention model.

    The ablation is HorizonServe's temporal policy uncapped under MPS, as the reference engine
    runs it (`sharing_for`). Per seed, mean attainment over the stressed rates: over seeds 0–7
    the loss was 0.058–0.095 (seed 3 the smallest); tested seeds ≥ 0.079. Both sides yield late
    prefills (`late` yielding); without it the loss was 0.101–0.152, mostly from the overloaded
    ablation's late requests blocking on-time ones. The backlog lift is
    off on this artifact; forced on, the loss was 0.023–0.066: at the stressed rates the running
    set is then full most of the time (59–81 % of the iterations at λ = 8 lifted), so the
    throttled policy runs uncapped under MPS much of the time too. Not asserted, because not
    robust:
    * at 60 % long-path and λ = 6 the loss was 0.015–0.171 on seeds 0–6 and 0.000 on seed 7;
    * on the fitted H200 default (lift on) throttling wins by 0.036–0.085 at the stressed rates
      on seeds 0–7 (bench/results/sim-fit-qwen/margins/margins.txt; the unfitted measured
      artifact reversed it: uncapped MPS ahead by 0.015–0.033, see
      bench/results/sim-fit/README.md).
    """
    for seed in SEEDS:
        full = estimate_runs.stressed("horizon", seed)
        ablated = estimate_runs.stressed("horizon-no-throttling", seed)
        assert ablated < full - 0.05, (seed, full, ablated)


def _burst_trace(
    setup: SimSetup, seed: int = 0, bursts: int = 10, size: int = 30, gap: float = 20.0
) -> Trace:
    """Bursts of mixed requests, two thirds long-path, arriving within 20 ms of each other.

    The situation path rotation exists for (paper Fig. 6): under FCFS a long-path burst takes
    the shared stage's sequence slots ahead of the short requests that arrive among it.
    """
    wl = load_workload(PIPE)
    rng = np.random.default_rng(seed)
    n = bursts * size
    names = setup.class_names
    kinds = np.where(rng.random(n) < 2 / 3, names.index("text-speech"), names.index("text-text"))
    arrival = np.sort(np.repeat(np.arange(bursts) * gap, size) + rng.uniform(0, 0.02, n))
    base = generate(wl, {"text-text": 1.0}, rate=1.0, n_requests=n, seed=seed + 1)
    spoken = wl.get("text-speech").output_tokens.sample(rng, n)
    out = np.where(kinds == names.index("text-speech"), spoken, base.output_tokens)
    return replace(
        base,
        cls=kinds.astype(np.int64),
        arrival=arrival,
        output_tokens=out,
        output_audio_s=out * wl.speech_seconds_per_token,
        duration_s=float(bursts * gap),
        warmup_s=0.0,
    )


# Path rotation's gain (short-path, all) under long-path bursts that a test requires, per artifact.
ROTATION_GAIN = {"measured": (0.006, 0.002), "estimate": (0.12, 0.04)}


@pytest.mark.parametrize("art", ["measured", "estimate"])
def test_removing_path_rotation_loses_under_long_path_bursts(request, art: str) -> None:
    """Smallest gains over seeds 0–7 (short-path / all): estimate 0.158 / 0.050 (seed 2; with
    deadline order, which the ablation keeps and which gains it 0.03–0.17 / 0.01–0.05), its
    thresholds three quarters of those (before deadline order 0.171 / 0.063, thresholds
    0.15 / 0.05, set before the H200 artifact); with deadline order the measured minima are
    0.036 / 0.013 (seed 6). Fitted H200 default on the 30-sample
    calibration 0.008 / 0.003 (seed 4; 0.008–0.189 / 0.003–0.060, tested seeds ≥ 0.041 / 0.013;
    bench/results/sim-fit-h200-2/margins/margins.txt), its thresholds three quarters of those
    minima: its simulated text SLOs are 5 × 15.7 ms, so a 30-request burst leaves few
    short-path requests on time either way (5–25 % with rotation, 1–11 % without). On the
    default fitted to the quick calibration the minima were 0.020 / 0.007 (seed 1,
    bench/results/sim-fit-qwen/margins/margins.txt). On the entry before that (fitted to
    qwen2_5_omni-2, text SLOs 5 × 23–35 ms) the minima were 0.421 / 0.133 (seed 2) on today's
    code (margins-previous-entry.txt there; 0.505 / 0.160 when first measured), on the unfitted
    measured artifact 0.200 / 0.063. The urgent-prefill boost speeds both systems'
    short-path prefills, so it narrowed the measured gains. The backlog lift (on for the
    measured artifact, off for the estimate) leaves these minima unchanged either way."""
    setup: SimSetup = request.getfixturevalue("setup" if art == "measured" else "estimate_setup")
    short_gain, all_gain = ROTATION_GAIN[art]
    for seed in SEEDS:
        tr = _burst_trace(setup, seed)
        full = simulate(setup, tr, "horizon", seed=seed)
        ablated = simulate(setup, tr, "horizon-no-rotation", seed=seed)
        short = full.short_mask()
        assert full.attainment(short) > ablated.attainment(short) + short_gain, seed
        assert full.attainment() > ablated.attainment() + all_gain, seed


def test_planner_brackets_the_sustainable_rate(setup: SimSetup, workload) -> None:
    unit = generate(workload, mix_weights(workload, setup.long_classes), rate=1.0, n_requests=500)
    unit = replace(unit, warmup_s=0.1 * unit.duration_s)
    res = plan_system(setup, unit, "horizon", target=0.9, tol=0.05, start=2.0)
    assert 0 < res.rate_ok < res.rate_fail <= res.rate_ok * 1.05 + 1e-12
    assert attainment_at(setup, unit, "horizon", res.rate_ok, 0) >= 0.9
    assert attainment_at(setup, unit, "horizon", res.rate_fail, 0) < 0.9
    assert res.attainment_ok is not None and res.attainment_ok >= 0.9


def test_late_yield_gains_past_capacity_and_costs_nothing_below_it(
    setup: SimSetup, workload: WorkloadSpec, measured_runs: Runs
) -> None:
    """The never-worse rule for late yielding: HorizonServe with late prefills behind the on-time
    ones against the same controller serving them in queue order. Over seeds 0–7 the two were
    equal at the stressed rates (no prefill waits past its deadline there) and the rule gained
    0.038–0.297 at 14 req/s, past capacity (seed 5 the smallest, tested seeds ≥ 0.131): in
    queue order the oldest, already late prompts go first and every prompt behind them turns
    late too."""
    off = replace(setup, control=_axes(setup, late="compete"))
    off_runs = Runs(off, workload)
    for seed in SEEDS:
        on, without = measured_runs.stressed("horizon", seed), off_runs.stressed("horizon", seed)
        assert on >= without - 0.005, (seed, on, without)
        past_on = measured_runs.run("horizon", 14.0, seed=seed).attainment()
        past_off = off_runs.run("horizon", 14.0, seed=seed).attainment()
        assert past_on > past_off + 0.04, (seed, past_on, past_off)
