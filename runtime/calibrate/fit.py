"""Fit the contention factors the calibration cannot isolate to measured campaign runs.

The calibration measures each stage alone and against a synthetic co-runner; what it cannot see
is how much the stages slow each other under the real mix (the talker next to a thinker that
prefills and decodes bursts, with code2wav in the same loop). Those few factors are fitted here:
each is a multiplier on one group of artifact numbers (`FACTORS`), the simulator replays every
measured item (point × system) on the campaign's own requests (the trace regenerated from the
point's seed and checked against the plan's request count) with the campaign's SLO table and
the deploy profile the engine ran, and a bounded compass search in log space minimises the mean
absolute attainment error over the items it may see. Items held out are only predicted.

`--engine reference` replays the engine a campaign ran, the reference engine, as it ran
(`reference_engine`: its thinker limits, media tokens, prefill padding and two-call
iteration, written into the entry; the controller's class table as the plan recorded it).
`--step-constants` first reads three costs the calibration does not measure from the fit
points' step rows (`step_constants`: the prefill call, the boosted prefill's share of the MPS
excess, the MPS decode excess's growth with rows), so that the fitted factors are left only
what the step rows cannot show.

Deterministic: one simulator seed per point (the point's own), so the objective is a fixed
function of the factors; a finite trace makes it piecewise constant, hence a direct search
rather than gradients.
"""

from __future__ import annotations

import json
import math
import statistics
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path as FsPath
from typing import Any

from horizonserve.runtime.artifact import (
    MPS_DECODE_ROWS,
    CalibrationArtifact,
    FitProvenance,
    PipelineCalibration,
    SmCurve,
    load_artifact,
)
from horizonserve.runtime.artifact_store import read_raw_log
from horizonserve.runtime.calibrate import derive
from horizonserve.runtime.calibrate.legacy import recorded_control
from horizonserve.runtime.calibrate.records import Campaign, read_campaign, read_steps
from horizonserve.runtime.config import Path, SloTable, load_pipeline
from horizonserve.runtime.engine.deploy import graph_batch_sizes, load_deploy
from horizonserve.runtime.sim.engine import simulate
from horizonserve.runtime.sim.limits import with_deploy
from horizonserve.runtime.sim.model import SharedCost, Sharing
from horizonserve.runtime.sim.setup import SimSetup
from horizonserve.runtime.sim.solo import measure_solo_p95
from horizonserve.runtime.sim.systems import get_system
from horizonserve.runtime.spatial import LIFTED, OPEN, UNCAPPED, partitioned
from horizonserve.runtime.workload import Trace, generate, load_workload, mix_weights


def _scale_curve(curve: dict[str, Any], a: float, floor: float = 1.0) -> None:
    curve["values"] = [max(floor, round(v * a, 6)) for v in curve["values"]]


def _first_down_partition(p: dict[str, Any], a: float) -> None:
    _scale_curve(p["downstream"][0]["corun_factor"], a)


def _down_mps(p: dict[str, Any], a: float) -> None:
    p["sharing"]["mps_downstream_factor"] = max(1.0, p["sharing"]["mps_downstream_factor"] * a)


def _down_timeslice(p: dict[str, Any], a: float) -> None:
    s = p["sharing"]
    s["timeslice_downstream_factor"] = max(1.0, s["timeslice_downstream_factor"] * a)


def _shared_partition(p: dict[str, Any], a: float) -> None:
    """The shared stage's co-run excess below S_tot (its partition factors), × a."""
    total = p["ladder"]["total"]
    for key in ("corun_decode_factor", "corun_prefill_factor"):
        c = p["shared"][key]
        c["values"] = [
            v if s >= total else max(1.0, round(1 + (v - 1) * a, 6))
            for s, v in zip(c["sms"], c["values"], strict=True)
        ]


def _shared_full(p: dict[str, Any], a: float) -> None:
    """The shared stage's co-run excess at S_tot (both on the whole GPU: time-sliced, and MPS
    through its share of that excess), × a."""
    total = p["ladder"]["total"]
    for key in ("corun_decode_factor", "corun_prefill_factor"):
        c = p["shared"][key]
        c["values"] = [
            max(1.0, round(1 + (v - 1) * a, 6)) if s >= total else v
            for s, v in zip(c["sms"], c["values"], strict=True)
        ]


def _shared_mps(p: dict[str, Any], a: float) -> None:
    """The MPS share of the shared stage's co-run excess (`mps_shared_excess`), × a."""
    s = p["sharing"]
    s["mps_shared_excess"] = min(50.0, round(s["mps_shared_excess"] * a, 6))


def _shared_prefill(p: dict[str, Any], a: float) -> None:
    """Prefill seconds per token at every SM count, × a (the engine pads a batch's prompts to
    the longest one and to a length bucket; the simulator counts real tokens)."""
    c = p["shared"]["prefill_token_s"]
    c["values"] = [round(v * a, 12) for v in c["values"]]


@dataclass(frozen=True)
class Factor:
    name: str
    what: str
    apply: Callable[[dict[str, Any], float], None]
    lo: float = 0.25
    hi: float = 8.0


FACTORS: dict[str, Factor] = {
    f.name: f
    for f in (
        Factor(
            "down_partition",
            "first downstream stage's co-run factor next to the capped shared stage (Green "
            "Context split; the talker for Qwen2.5-Omni)",
            _first_down_partition,
        ),
        Factor("down_mps", "downstream co-run factor under MPS, uncapped", _down_mps),
        Factor("down_timeslice", "downstream co-run factor time-sliced", _down_timeslice),
        Factor(
            "shared_partition",
            "excess of the shared stage's co-run factors below S_tot",
            _shared_partition,
            lo=0.0,
        ),
        Factor(
            "shared_full",
            "excess of the shared stage's co-run factors at S_tot (time-sliced; MPS keeps "
            "its measured share of it)",
            _shared_full,
            lo=0.0,
        ),
        Factor(
            "shared_mps",
            "the shared stage's co-run excess under MPS, as a share of the time-sliced one "
            "(mps_shared_excess)",
            _shared_mps,
        ),
        Factor("shared_prefill", "prefill cost per token (padding)", _shared_prefill, lo=0.5),
    )
}
DEFAULT_FACTORS = (
    "down_partition",
    "down_mps",
    "down_timeslice",
    "shared_partition",
    "shared_full",
    "shared_prefill",
)


def apply_factors(cal: PipelineCalibration, factors: dict[str, float]) -> PipelineCalibration:
    data = cal.model_dump()
    for name, a in factors.items():
        FACTORS[name].apply(data, a)
    return PipelineCalibration.model_validate(data)


# -- the reference engine as a campaign ran it ------------------------------------------------
REFERENCE = "reference"  # FitProvenance.engine / `--engine` of a reference-engine replay


def reference_engine(
    cal: PipelineCalibration, preset: str = "full", profile: str = "tuned"
) -> PipelineCalibration:
    """`cal` with the limits and step rules of the reference engine (`engine.reference`, what
    `bench/eval/campaign.py` runs) under `preset` and deploy `profile`:

    * the thinker's slots, token budget and CUDA graphs from the preset. The preset sizes the
      thinker from the speech deploy file for every pipeline (BAGEL's thinker ran 48 slots and
      8192 tokens, not its own deploy file's 12 and 32768); KV: its slots × tokens per slot;
    * each downstream stage's slots (and code2wav's chunks) from the pipeline's deploy file, as
      the preset reads them (`sim.limits.with_deploy`);
    * prompt tokens per image, audio second and video second: the preset's;
    * prefill padded to the executor's length buckets (`engine.reference.ar.prefill_buckets`:
      the batch at its longest prompt), prefill and decode as two calls (`prefill_then_decode`);
    * the thinker decodes each answer's text tokens, spoken answers included (the trace's
      `output_tokens`: `engine.reference.backend` hands the thinker nothing else), so
      `decode_tokens_per_output_audio_second` is 0. A model whose thinker decodes speech
      tokens itself (MiMo-Audio's 6.25 per second of speech in the vLLM-Omni deployment) does
      so only on the deploy path.

    The entry's `deploy_profile` becomes None: its limits are written in it (the simulator would
    otherwise re-read them from the deploy file, which the reference thinker does not follow).
    Costs are untouched."""
    from horizonserve.runtime.engine.reference.ar import prefill_buckets  # torch: lazily
    from horizonserve.runtime.engine.reference.presets import get_preset

    ref = get_preset(preset, profile, cal.pipeline)
    lim = ref.thinker_limits
    cal = with_deploy(cal, load_deploy(cal.pipeline, profile))
    where = f"reference engine: preset {preset!r}, deploy profile {profile!r}"
    shared = cal.shared.model_copy(
        update={
            "max_num_seqs": lim.max_batch,
            "max_num_batched_tokens": lim.max_prefill_tokens,
            "graph_batch_sizes": list(graph_batch_sizes(lim.max_batch))
            if ref.graphs_for("thinker")
            else None,
            "kv_capacity_tokens": lim.max_batch * lim.max_len,
            "tokens_per_image": float(ref.tokens_per_image),
            "tokens_per_audio_second": float(ref.tokens_per_audio_second),
            "tokens_per_video_second": float(ref.tokens_per_video_second),
            "prefill_buckets": list(prefill_buckets(lim.max_len)),
            "prefill_then_decode": True,
            "decode_tokens_per_output_audio_second": 0.0,
        }
    )
    notes = dict(cal.notes)
    for key, what in (
        ("max_num_seqs", "the thinker's slots (presets: the speech deploy file's thinker)"),
        ("max_num_batched_tokens", "the thinker's prompt tokens per iteration"),
        ("graph_batch_sizes", "decode graphs of the thinker"),
        ("kv_capacity_tokens", "slots × tokens per slot (pre-allocated)"),
        ("tokens_per_image", "prompt tokens per input image (presets.tokens_per_image)"),
        ("tokens_per_audio_second", "prompt tokens per input audio second"),
        ("tokens_per_video_second", "prompt tokens per input video second"),
        ("prefill_buckets", "prompt lengths prefill pads to (ar.prefill_buckets)"),
        ("prefill_then_decode", "prefill and decode as two calls (stages/shared.py iterate)"),
        (
            "decode_tokens_per_output_audio_second",
            "none: the thinker decodes each answer's text tokens, spoken answers included "
            "(the trace's output_tokens, engine.reference.backend)",
        ),
    ):
        notes[f"shared.{key}"] = f"{where}: {what}"
    for d in cal.downstream:
        notes[f"downstream.{d.name}.max_batch"] = f"{where}: slots from its deploy file"
    return cal.model_copy(
        update={"shared": shared, "deploy_profile": None, "notes": dict(sorted(notes.items()))}
    )


@dataclass(frozen=True)
class StepConstants:
    """Three costs the calibration does not measure, read from a campaign's step rows (and,
    with `line`, the prefill call's line: its fixed cost and a scale on the per-token cost)."""

    prefill_call_s: float
    boost_prefill_excess: float
    mps_decode_rows_frac: float
    call_steps: int  # single-prompt prefills co-running at the cap of a partition
    boost_steps: int  # single-prompt prefills boosted above the cap
    mps_steps: int  # decode steps co-running under MPS (an MPS system's items)
    prefill_token_scale: float = 1.0  # × prefill_token_s (the line's slope; 1: not measured)
    line_steps: int = 0  # single-prompt prefills behind the line (0: not measured)


def campaign_steps(campaign: Campaign, keys: Iterable[str]) -> list[tuple[str, dict[str, Any]]]:
    """(system, step-trace member) of every repetition of items `keys` (`records.read_steps`)."""
    return [(campaign.items[k].system, m) for k in keys for m in read_steps(campaign, k)]


def step_constants(
    cal: PipelineCalibration, steps: Iterable[tuple[str, dict[str, Any]]], line: bool = False
) -> StepConstants:
    """`prefill_call_s`, `boost_prefill_excess` and `mps_decode_rows_frac` from engine step
    traces (`campaign_steps`: each system's {"columns", "rows"}; the simulator's own with
    `record_steps`): the entry's own formulas solved for each constant, the prompt at its
    padded length (`prefill_buckets`), decode rows as the simulator pads them
    (`SharedCost.decode_rows`):

      call:  median over single-prompt prefills co-running on a partition at the step's
             cap s — prefill_s / corun_prefill_factor(s) − prefill_token_s(s) · padded;
      line:  (with `line`, in place of call) the prefill call's line, call + scale ·
             prefill_token_s(s) · padded, over every single-prompt prefill co-running
             unboosted and not time-sliced (`prefill_line`): both the fixed cost and the
             per-token slope from the campaign's own prompts;
      boost: median over single-prompt prefills above the cap, over the downstream's SMs —
             (prefill_s / (call + prefill_token_s(S_aggr) · padded) − 1) / (MPS factor − 1),
             clipped to [0, 1];
      rows:  decode steps of the MPS systems' items while the downstream runs: per row count
             r the median g(r) of (decode_s / decode alone − 1) / (MPS factor − 1), then the
             least-squares slope of g − 1 against r − 8 (the probe's rows), steps weighted.
    A constant whose steps the items lack keeps the entry's value.
    """
    sh, sharing = cal.shared, cal.sharing
    buckets = sorted(sh.prefill_buckets or [])
    total = cal.ladder.total
    mps = sharing.mps_shared_factor(sh.corun_prefill_factor.at(total))
    mps_d = sharing.mps_shared_factor(sh.corun_decode_factor.at(total))
    cost = SharedCost(cal)
    calls: list[float] = []
    boosted: list[tuple[float, int, int]] = []
    by_rows: dict[int, list[float]] = {}
    for system, member in steps:
        under_mps = get_system(system).mps
        ix = {c: i for i, c in enumerate(member["columns"])}
        for r in member["rows"]:
            if not r[ix["downstream_active"]]:
                continue
            s, level, seqs = r[ix["shared_sms"]], r[ix["level"]], r[ix["decode_batch"]]
            if under_mps and level == UNCAPPED and seqs > 0 and mps_d > 1:
                alone = cost.iteration_parts(s, seqs, 0, 0, False, Sharing.MPS)[1]
                g = (r[ix["decode_s"]] / alone - 1) / (mps_d - 1)
                by_rows.setdefault(cost.decode_rows(seqs), []).append(g)
            if r[ix["prefill_batch"]] != 1 or not partitioned(level):
                continue
            ps, y = r[ix["prefill_sms"]], r[ix["prefill_s"]]
            n = _padded(buckets, r[ix["prefill_tokens"]])
            if ps == s:
                calls.append(y / sh.corun_prefill_factor.at(s) - sh.prefill_token_s.at(s) * n)
            elif ps > s:
                boosted.append((y, ps, n))
    call = max(0.0, statistics.median(calls)) if calls else sh.prefill_call_s
    scale, line_steps = 1.0, 0
    if line:
        fitted = prefill_line(cal, steps)
        if fitted is not None:
            call, scale, line_steps = fitted
    excess = [
        (y / (call + scale * sh.prefill_token_s.at(ps) * n) - 1) / (mps - 1) if mps > 1 else 1.0
        for y, ps, n in boosted
    ]
    boost = (
        min(1.0, max(0.0, statistics.median(excess))) if excess else sharing.boost_prefill_excess
    )
    num = sum(
        len(v) * (statistics.median(v) - 1) * (r - MPS_DECODE_ROWS) for r, v in by_rows.items()
    )
    den = sum(len(v) * (r - MPS_DECODE_ROWS) ** 2 for r, v in by_rows.items())
    rows = max(0.0, num / den) if den else sharing.mps_decode_rows_frac
    return StepConstants(
        round(call, 6),
        round(boost, 4),
        round(rows, 4),
        len(calls),
        len(boosted),
        sum(len(v) for v in by_rows.values()),
        round(scale, 4),
        line_steps,
    )


def _padded(buckets: list[int], tokens: int) -> int:
    """The prompt length a prefill pads to (the first bucket that holds it; sorted buckets)."""
    return next((b for b in buckets if b >= tokens), tokens)


LINE_MIN_STEPS = 5  # a (SM count, padded length) group enters the prefill line from this many


def prefill_line(
    cal: PipelineCalibration, steps: Iterable[tuple[str, dict[str, Any]]]
) -> tuple[float, float, int] | None:
    """(prefill_call_s, scale on prefill_token_s, steps) of the line the step rows show.

    The entry charges a prefill call `fp · (prefill_call_s + prefill_token_s(s) · padded)`;
    the calibration measures the per-token cost from one long prompt alone (2048 tokens), so
    a fixed cost per call lands in the slope. A campaign's prompts are short (most pad to
    32-768 tokens) and show both. Rows: single-prompt prefills while the downstream runs,
    at the shared stage's own SMs (not boosted), not time-sliced (the co-run factor there is
    the fitted `shared_full`; under MPS and on a partition it is within ~15 % of 1). Each row
    is divided by the co-run factor the simulator charges it (`SharedCost.corun_factors`: the
    partition's at its cap, the MPS share at S_tot for OPEN, LIFTED and the MPS systems'
    uncapped steps); the medians per (SM count, padded length) are fitted to
    call + scale · prefill_token_s(s) · padded by least squares, each weighted by its rows.
    None where fewer than two padded lengths qualify."""
    sh = cal.shared
    buckets = sorted(sh.prefill_buckets or [])
    cost = SharedCost(cal)
    groups: dict[tuple[int, int], list[float]] = {}
    for system, member in steps:
        uncapped = get_system(system).uncapped_sharing
        ix = {c: i for i, c in enumerate(member["columns"])}
        for r in member["rows"]:
            if not r[ix["downstream_active"]] or r[ix["prefill_batch"]] != 1:
                continue
            s, level = r[ix["shared_sms"]], r[ix["level"]]
            if r[ix["prefill_sms"]] != s:
                continue
            if partitioned(level):
                sharing = Sharing.PARTITION
            elif level == UNCAPPED:
                sharing = uncapped
            elif level in (LIFTED, OPEN):
                sharing = Sharing.MPS
            else:  # AGGRESSIVE: nothing co-runs by the controller's reading
                continue
            if sharing is Sharing.TIMESLICE:
                continue
            n = _padded(buckets, r[ix["prefill_tokens"]])
            fp = cost.corun_factors(s, sharing)[1]
            groups.setdefault((s, n), []).append(r[ix["prefill_s"]] / fp)
    pts = [
        (sh.prefill_token_s.at(s) * n, statistics.median(v), len(v))
        for (s, n), v in groups.items()
        if len(v) >= LINE_MIN_STEPS
    ]
    if len({round(x, 9) for x, _y, _w in pts}) < 2:
        return None
    w = sum(c for _x, _y, c in pts)
    mx = sum(c * x for x, _y, c in pts) / w
    my = sum(c * y for _x, y, c in pts) / w
    sxx = sum(c * (x - mx) ** 2 for x, _y, c in pts)
    sxy = sum(c * (x - mx) * (y - my) for x, y, c in pts)
    scale = max(0.05, sxy / sxx)
    call = max(0.0, my - scale * mx)
    return call, scale, sum(c for _x, _y, c in pts)


def with_step_constants(
    cal: PipelineCalibration, k: StepConstants, where: str
) -> PipelineCalibration:
    """`cal` with the step-row constants `k` (`step_constants`), their provenance in notes."""
    call_note = (
        f"measured: {where} step rows, median over {k.call_steps} "
        "single-prompt prefills co-running at a partition's cap (sim.fit.step_constants)"
    )
    shared_update: dict[str, Any] = {"prefill_call_s": k.prefill_call_s}
    line_notes: dict[str, str] = {}
    if k.line_steps:
        call_note = (
            f"measured: {where} step rows, the fixed cost of the prefill line over "
            f"{k.line_steps} single-prompt prefills co-running (sim.fit.prefill_line)"
        )
        tok = cal.shared.prefill_token_s
        shared_update["prefill_token_s"] = tok.model_copy(
            update={"values": [round(v * k.prefill_token_scale, 12) for v in tok.values]}
        )
        line_notes["shared.prefill_token_s"] = (
            f"{cal.notes.get('shared.prefill_token_s', 'calibration')}; × "
            f"{k.prefill_token_scale}: the slope of the prefill line over {k.line_steps} "
            f"single-prompt prefills of {where} step rows (sim.fit.prefill_line)"
        )
    notes = {
        **cal.notes,
        **line_notes,
        "shared.prefill_call_s": call_note,
        "sharing.boost_prefill_excess": f"measured: {where} step rows, median over "
        f"{k.boost_steps} boosted single-prompt prefills (sim.fit.step_constants)",
        "sharing.mps_decode_rows_frac": f"measured: {where} step rows, {k.mps_steps} decode "
        "steps of the MPS systems beside a busy downstream stage (sim.fit.step_constants)",
    }
    sharing = {
        "boost_prefill_excess": k.boost_prefill_excess,
        "mps_decode_rows_frac": k.mps_decode_rows_frac,
    }
    return cal.model_copy(
        update={
            "shared": cal.shared.model_copy(update=shared_update),
            "sharing": cal.sharing.model_copy(update=sharing),
            "notes": dict(sorted(notes.items())),
        }
    )


@dataclass
class Replay:
    """The simulator on a campaign's items, for one artifact entry (traces built once)."""

    campaign: Campaign
    artifact: CalibrationArtifact
    deploy_profile: str | None
    # The controller's class table as the campaign's plan recorded it (the profiles behind its
    # r̂), instead of the profiles the simulator derives from the entry (`engine` reference).
    recorded_classes: bool = False
    # Deploy profile whose limits replace the entry's (`replay_of`); None: the entry's own.
    limits_profile: str | None = None
    _traces: dict[str, Trace] = field(default_factory=dict)

    @property
    def caveat(self) -> str | None:
        """Why this replay's prediction is weaker than the fit's, or None."""
        fit = self.artifact.pipeline(self.campaign.pipeline).fit
        if self.limits_profile is None or fit is None:
            return None
        return (
            f"the campaign ran deploy profile {self.limits_profile!r}, the entry was fitted to "
            f"{fit.deploy_profile!r} campaigns: replayed with "
            f"{self.limits_profile!r}'s limits on the fitted step costs, so whatever that "
            "profile changes in a step's cost (eager launches, a stage's contention) is not "
            "modelled; calibrate and fit under it for a prediction"
        )

    def trace(self, pid: str) -> Trace:
        if pid not in self._traces:
            c = self.campaign
            p = c.points[pid]
            wl = load_workload(c.pipeline)
            classes = load_pipeline(c.pipeline).slo.classes
            long = tuple(x.name for x in classes if x.path is Path.LONG)
            mix = mix_weights(wl, long, p.long_ratio)
            tr = generate(
                wl,
                mix,
                rate=p.rate,
                duration_s=p.duration_s,
                warmup_s=c.warmup_s,
                seed=p.seed,
                burstiness=p.burstiness,
            )
            if len(tr) != p.n_requests:
                raise ValueError(
                    f"{pid}: regenerated trace has {len(tr)} requests, the campaign "
                    f"{p.n_requests}: the workload changed since it ran"
                )
            self._traces[pid] = tr
        return self._traces[pid]

    def setup(self, cal: PipelineCalibration, key: str | None = None) -> SimSetup:
        """`cal` set up as the campaign ran: its SLO table, class table and engine limits, and
        the controller item `key` ran (its session's record), or the plan's without a key."""
        c = self.campaign
        if self.limits_profile is not None:
            cal = reference_engine(cal, c.preset or "full", self.limits_profile)
        art = self.artifact.model_copy(
            update={"pipelines": {**self.artifact.pipelines, c.pipeline: cal}}
        )
        setup = SimSetup.load(c.pipeline, art, deploy_profile=self.deploy_profile)
        # The controller the campaign ran, not today's defaults.
        item = c.items.get(key) if key is not None else None
        ran = item.control if item is not None and item.control is not None else c.control
        control, verdicts = recorded_control(ran)
        setup = replace(setup, control=control, verdicts=verdicts)
        if self.recorded_classes and c.serving_slo:
            setup = replace(setup, slo=_recorded_slo(setup.slo, c.serving_slo))
        p95 = {k: v / c.multiplier for k, v in c.targets_s.items()}
        return setup.with_solo_p95(p95, f"campaign {c.path} SLO table", c.multiplier)

    def attainment(self, cal: PipelineCalibration, keys: Iterable[str]) -> dict[str, float]:
        """Each item simulated on its own requests under the controller its session ran."""
        setups: dict[str, SimSetup] = {}
        out = {}
        for key in keys:
            it = self.campaign.items[key]
            point = self.campaign.points[it.point]
            ran = json.dumps(it.control, sort_keys=True)
            if ran not in setups:
                setups[ran] = self.setup(cal, key)
            r = simulate(setups[ran], self.trace(it.point), it.system, seed=point.seed)
            a = r.attainment()
            out[key] = 0.0 if math.isnan(a) else a
        return out


def items_by_run(fit: FitProvenance) -> dict[str, dict[str, str]]:
    """The items a fit record names (fit and held out), by run: record key → the item's key in
    its campaign. A fit of one run names its items point/system; a fit of several runs names
    each RUN/point/system, held-out items of campaigns outside `runs` included."""
    keys = [*fit.fit_items, *fit.holdout_items]
    if len(fit.runs) == 1:
        return {fit.runs[0]: {k: k for k in keys}}
    out: dict[str, dict[str, str]] = {}
    for k in keys:
        run, point, system = k.rsplit("/", 2)
        out.setdefault(run, {})[k] = f"{point}/{system}"
    return out


def replay_of(campaign: Campaign, artifact: CalibrationArtifact) -> Replay:
    """The replay an entry's fit used (`FitProvenance.engine`): the reference engine's with
    the plan's class table, else the deploy file's with the derived profiles; the engine
    limits those the entry carries (its own deploy profile, or the limits written in it).

    A campaign that ran another deploy profile than the entry's fit (a `stock` plan against an
    entry fitted to `tuned` campaigns) is replayed with that profile's limits
    (`reference_engine`: slots, CUDA graphs or eager, code2wav chunking) on the entry's costs;
    `Replay.caveat` says what that cannot model."""
    fit = artifact.pipeline(campaign.pipeline).fit
    reference = fit is not None and fit.engine == REFERENCE
    profile = None
    if reference and campaign.profile and fit.deploy_profile not in (None, campaign.profile):
        profile = campaign.profile
    return Replay(campaign, artifact, None, recorded_classes=reference, limits_profile=profile)


def _recorded_slo(slo: SloTable, recorded: dict[str, Any]) -> SloTable:
    """`slo` with each class as the campaign recorded it (same classes, the spec's order)."""
    table = SloTable.model_validate(recorded)
    by_name = {c.name: c for c in table.classes}
    missing = [c.name for c in slo.classes if c.name not in by_name]
    if missing:
        raise ValueError(f"the campaign's class table lacks {missing}")
    classes = [by_name[c.name] for c in slo.classes]
    return SloTable.model_validate({**table.model_dump(), "classes": classes})


def errors_pp(sim: dict[str, float], campaign: Campaign) -> dict[str, float]:
    """Simulated − measured attainment per item, percentage points."""
    return {k: 100 * (v - campaign.items[k].attainment) for k, v in sim.items()}


def mae(err: dict[str, float], keys: Iterable[str] | None = None) -> float:
    ks = list(err if keys is None else keys)
    return statistics.fmean(abs(err[k]) for k in ks) if ks else float("nan")


@dataclass
class FitResult:
    factors: dict[str, float]
    before: dict[str, float]  # item → simulated attainment with the base entry
    after: dict[str, float]  # ... with the fitted entry
    fit_items: list[str]
    holdout_items: list[str]
    evaluations: int
    history: list[tuple[dict[str, float], float]]
    cal: PipelineCalibration

    def residuals(self, campaign: Campaign) -> dict[str, float]:
        return errors_pp(self.after, campaign)

    def largest_miss(self, campaign: Campaign) -> str:
        err = self.residuals(campaign)
        k = max(err, key=lambda x: abs(err[x]))
        return f"{k} ({err[k]:+.1f} pp)"


def compass_search(
    f: Callable[[dict[str, float]], float],
    names: Sequence[str],
    x0: dict[str, float],
    *,
    step: float = 1.0,
    min_step: float = 1 / 32,
    max_evals: int = 200,
) -> tuple[dict[str, float], float, list[tuple[dict[str, float], float]]]:
    """Minimise f over the factors `names` by a compass search in log2 space, inside each
    factor's [lo, hi]: try ± step on every coordinate, move on the first improvement, halve
    the step when none improves. Returns (best x, best value, history)."""
    x = dict(x0)
    hist: list[tuple[dict[str, float], float]] = []

    def ev(z: dict[str, float]) -> float:
        v = f(z)
        hist.append((dict(z), v))
        return v

    best = ev(x)
    while step >= min_step and len(hist) < max_evals:
        moved = False
        for name in names:
            fac = FACTORS[name]
            for sign in (1, -1):
                cur = x[name]
                base = math.log2(cur) if cur > 0 else math.log2(max(fac.lo, 1 / 64))
                cand = min(fac.hi, max(fac.lo, 2 ** (base + sign * step)))
                if cur == 0 and sign < 0:
                    continue
                if fac.lo == 0 and sign < 0 and cand <= 1 / 64:
                    cand = 0.0
                if cand == cur:
                    continue
                z = {**x, name: cand}
                v = ev(z)
                if v < best - 1e-9:
                    x, best, moved = z, v, True
                    break
                if len(hist) >= max_evals:
                    break
        if not moved:
            step /= 2
    return x, best, hist


SOLO_MIN_SAMPLES = 20  # a class's measured solo p95 enters the solo term from this many samples
SOLO_REQUESTS = 200  # simulated solo requests per class behind the solo term (seed 0)


def solo_classes(cal: PipelineCalibration) -> list[str]:
    """The classes whose measured solo p95 the solo term scores by default: those with at least
    SOLO_MIN_SAMPLES samples, or every class with a solo p95 when the entry records no counts."""
    p95 = cal.solo_p95_s or {}
    if not cal.solo_samples:
        return sorted(p95)
    return sorted(k for k in p95 if cal.solo_samples.get(k, 0) >= SOLO_MIN_SAMPLES)


def solo_error_pct(
    replay: Replay, cal: PipelineCalibration, classes: Sequence[str]
) -> dict[str, float]:
    """Per class of `classes`: (simulated − measured) / measured solo p95, in %. The simulator
    derives its SLO tables from simulated solo runs, so an entry that predicts attainment under
    load but not the solo latency would shift every simulated SLO."""
    p95 = cal.solo_p95_s or {}
    measured = {k: p95[k] for k in classes if p95.get(k, 0) > 0}
    if not measured:
        return {}
    setup = replay.setup(cal)
    wl = load_workload(replay.campaign.pipeline)
    sim = measure_solo_p95(setup, wl, seed=0, n=SOLO_REQUESTS)
    return {k: 100.0 * (sim[k] - v) / v for k, v in measured.items() if k in sim}


def fit(
    replay: Replay,
    base: PipelineCalibration,
    fit_items: Sequence[str],
    holdout_items: Sequence[str] = (),
    names: Sequence[str] = DEFAULT_FACTORS,
    *,
    max_evals: int = 200,
    progress: Callable[[int, float], None] | None = None,
    solo_weight: float = 0.0,
    solo_on: Sequence[str] | None = None,
) -> FitResult:
    """Fit `names` on `fit_items` (module docstring); predict `holdout_items` after.

    `solo_weight` > 0 adds the mean absolute solo-latency error (`solo_error_pct`, in %) times
    the weight to the objective (pp of attainment): the fit may not buy attainment with a solo
    latency the GPU did not show. `solo_on`: the classes scored (default `solo_classes`)."""
    unknown = [n for n in names if n not in FACTORS]
    if unknown:
        raise ValueError(f"unknown factors {unknown}; known: {sorted(FACTORS)}")
    all_items = [*fit_items, *holdout_items]
    before = replay.attainment(base, all_items)
    scored = list(solo_on) if solo_on is not None else solo_classes(base)
    n = [0]

    def objective(x: dict[str, float]) -> float:
        cal = apply_factors(base, x)
        sim = replay.attainment(cal, fit_items)
        v = mae(errors_pp(sim, replay.campaign))
        if solo_weight > 0:
            solo = solo_error_pct(replay, cal, scored)
            if solo:
                v += solo_weight * sum(map(abs, solo.values())) / len(solo)
        n[0] += 1
        if progress is not None:
            progress(n[0], v)
        return v

    x, _best, hist = compass_search(objective, names, {k: 1.0 for k in names}, max_evals=max_evals)
    cal = apply_factors(base, x)
    after = replay.attainment(cal, all_items)
    return FitResult(
        factors={k: round(v, 4) for k, v in x.items()},
        before=before,
        after=after,
        fit_items=list(fit_items),
        holdout_items=list(holdout_items),
        evaluations=len(hist),
        history=hist,
        cal=cal,
    )


def provenance(
    result: FitResult,
    campaign: Campaign,
    base_name: str,
    profile: str | None,
    note: str = "",
    engine: str | None = None,
) -> FitProvenance:
    err = result.residuals(campaign)
    return FitProvenance(
        runs=[campaign.path],
        date=datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        base=base_name,
        deploy_profile=profile,
        warmup_s=campaign.warmup_s,
        factors=result.factors,
        fit_items=result.fit_items,
        holdout_items=result.holdout_items,
        residuals_pp={k: round(v, 2) for k, v in err.items()},
        mae_in_pp=round(mae(err, result.fit_items), 2),
        mae_out_pp=round(mae(err, result.holdout_items), 2) if result.holdout_items else None,
        largest_miss=result.largest_miss(campaign),
        note=note,
        engine=engine,
    )


# -- `horizonserve calibrate fit` -------------------------------------------------------------
def add_fit_arguments(p: Any) -> None:
    p.add_argument("--records", required=True, help="campaign directory (plan.json, s*/)")
    p.add_argument("--out", required=True, help="the fitted artifact to write (JSON)")
    p.add_argument(
        "--base", help="artifact to start from (default: the one the campaign ran, its plan)"
    )
    p.add_argument(
        "--deploy-profile",
        default="tuned",
        help="deploy profile the campaign's engine ran (engine.deploy; default tuned)",
    )
    p.add_argument("--fit-points", help="points the fit may see, comma separated (default all)")
    p.add_argument("--holdout-points", default="", help="points only predicted, comma separated")
    p.add_argument(
        "--factors",
        default=",".join(DEFAULT_FACTORS),
        help=f"factors to fit (default {','.join(DEFAULT_FACTORS)}; known: {','.join(FACTORS)})",
    )
    p.add_argument("--warmup-s", type=float, default=0.0, help="score arrivals after this only")
    p.add_argument("--calibration-raw", help="raw log of the base's calibration: adds the "
                   "per-SM decode slope (decode_slope_scale) before fitting")  # fmt: skip
    p.add_argument("--max-evals", type=int, default=300, help="simulated evaluations at most")
    p.add_argument(
        "--solo-weight",
        type=float,
        default=0.0,
        help="add this × the mean |solo p95 error| (%%, simulated vs the base's measured, "
        f"classes with >= {SOLO_MIN_SAMPLES} samples) to the objective (default 0: off)",
    )
    p.add_argument(
        "--solo-classes",
        help="classes the solo term scores, comma separated (default: those with >= "
        f"{SOLO_MIN_SAMPLES} solo samples; every class when the entry records no counts)",
    )
    p.add_argument(
        "--engine",
        choices=("deploy", REFERENCE),
        default="deploy",
        help="deploy (default): the entry with --deploy-profile's deploy-file limits, class "
        "profiles derived from it; reference: the reference engine as the campaign ran it "
        "(`reference_engine` with the plan's preset and profile; the controller's class table "
        "as the plan recorded it; the written entry carries the limits, deploy_profile none)",
    )
    p.add_argument(
        "--step-constants",
        action="store_true",
        help="before fitting, measure prefill_call_s and boost_prefill_excess from the fit "
        "points' step rows (`step_constants`; needs prefill_buckets, i.e. --engine reference)",
    )
    p.add_argument(
        "--prefill-line",
        action="store_true",
        help="with --step-constants: measure the prefill call's line from the fit points' "
        "step rows (`prefill_line`: its fixed cost as prefill_call_s and its slope as a scale "
        "on prefill_token_s) instead of the call alone",
    )


def _points(text: str | None, campaign: Campaign, flag: str) -> list[str]:
    if not text:
        return []
    pts = [x.strip() for x in text.split(",") if x.strip()]
    unknown = [x for x in pts if x not in campaign.points]
    if unknown:
        raise ValueError(
            f"{flag}: unknown points {unknown}; the campaign has {sorted(campaign.points)}"
        )
    return pts


def run_fit(args: Any) -> int:
    """The fit as a command: writes the artifact and `<out>.fit.json` (per-item table)."""
    if not args.warmup_s >= 0 or not math.isfinite(args.warmup_s):
        raise ValueError(f"--warmup-s {args.warmup_s}: give seconds >= 0")
    if args.max_evals < 1:
        raise ValueError(f"--max-evals {args.max_evals}: give at least 1")
    if not args.solo_weight >= 0 or not math.isfinite(args.solo_weight):
        raise ValueError(f"--solo-weight {args.solo_weight}: give a weight >= 0")
    campaign = read_campaign(args.records, warmup_s=args.warmup_s)
    base_path = args.base or campaign.artifact_path
    art = load_artifact(base_path)
    names = [x.strip() for x in args.factors.split(",") if x.strip()]
    holdout = _points(args.holdout_points, campaign, "--holdout-points")
    fit_pts = _points(args.fit_points, campaign, "--fit-points") or [
        p for p in campaign.points if p not in holdout
    ]
    keys = list(campaign.items)
    fit_items = [k for k in keys if campaign.items[k].point in fit_pts]
    hold_items = [k for k in keys if campaign.items[k].point in holdout]
    if not fit_items:
        raise ValueError(f"--fit-points: no measured item at {fit_pts}")
    base = art.pipeline(campaign.pipeline)
    note = ""
    if args.calibration_raw:
        base = with_slope_from_raw(base, args.calibration_raw)
        note = f"decode_slope_scale from {args.calibration_raw}. "
    engine = REFERENCE if args.engine == REFERENCE else None
    profile: str | None = args.deploy_profile
    if engine:
        preset, ran = campaign.preset or "full", campaign.profile or args.deploy_profile
        base = reference_engine(base, preset, ran)
        profile = None  # the entry carries the limits (reference_engine)
        note += (
            f"Replayed as the reference engine ran (preset {preset!r}, deploy profile "
            f"{ran!r}: sim.fit.reference_engine) with the plan's class table. "
        )
    if args.prefill_line and not args.step_constants:
        raise ValueError("--prefill-line: add --step-constants (it is one of the step constants)")
    if args.step_constants:
        if not base.shared.prefill_buckets:
            raise ValueError("--step-constants: the entry pads no prefill; add --engine reference")
        k = step_constants(base, campaign_steps(campaign, fit_items), line=args.prefill_line)
        where = f"{campaign.path} fit points {sorted({campaign.items[i].point for i in fit_items})}"
        base = with_step_constants(base, k, where)
        line = (
            f" (the prefill line's fixed cost; its slope prefill_token_s x "
            f"{k.prefill_token_scale}, over {k.line_steps} prefills)"
            if k.line_steps
            else ""
        )
        note += (
            f"prefill_call_s {k.prefill_call_s} s{line}, boost_prefill_excess "
            f"{k.boost_prefill_excess} and mps_decode_rows_frac {k.mps_decode_rows_frac} "
            f"measured from {where} step rows. "
        )
    replay = Replay(campaign, art, profile, recorded_classes=engine is not None)

    def progress(n: int, v: float) -> None:
        if n % 20 == 0:
            print(f"[fit] {n} evaluations, in-sample MAE {v:.2f} pp", flush=True)

    scored = solo_classes(base)
    if args.solo_classes:
        scored = [x.strip() for x in args.solo_classes.split(",") if x.strip()]
        unknown = [k for k in scored if k not in (base.solo_p95_s or {})]
        if unknown:
            raise ValueError(
                f"--solo-classes: no measured solo p95 for {unknown} in the base entry; "
                f"known: {sorted(base.solo_p95_s or {})}"
            )
    result = fit(
        replay,
        base,
        fit_items,
        hold_items,
        names,
        max_evals=args.max_evals,
        progress=progress,
        solo_weight=args.solo_weight,
        solo_on=scored,
    )
    if args.solo_weight > 0:
        solo = solo_error_pct(replay, result.cal, scored)
        note += (
            f"Objective: attainment MAE + {args.solo_weight:g} x mean |solo p95 error| (%); "
            f"solo p95 error after the fit { ({k: round(v, 1) for k, v in solo.items()}) } %. "
        )
    prov = provenance(
        result,
        campaign,
        str(base_path),
        args.deploy_profile,
        note + "Fitted multipliers stand for what the simulator does not model structurally "
        "(see bench/results/sim-fit/README.md); holdout items are from the same campaign.",
        engine=engine,
    )
    cal = result.cal.model_copy(update={"fit": prov, "deploy_profile": profile})
    when = prov.date
    out_art = art.model_copy(
        update={
            "pipelines": {**art.pipelines, campaign.pipeline: cal},
            "created": when,
            "source": (
                f"{art.source.rstrip()} Then {campaign.pipeline}'s contention factors fitted by "
                f"`horizonserve calibrate fit` on {when} to the measured campaign "
                f"{campaign.path} (factors {prov.factors}, in-sample MAE {prov.mae_in_pp} pp, "
                f"holdout {prov.mae_out_pp} pp; base {base_path}; provenance in its `fit`)."
            ),
        }
    )
    out = FsPath(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(out_art.model_dump_json(indent=2) + "\n")
    table = fit_table(result, campaign)
    report = out.with_name(out.stem + ".fit.json")
    report.write_text(
        json.dumps({"provenance": prov.model_dump(), "items": table}, indent=1) + "\n"
    )
    print(format_fit(result, campaign, prov))
    print(f"artifact: {out}; per-item table: {report}")
    return 0


def with_slope_from_raw(cal: PipelineCalibration, raw_path: str) -> PipelineCalibration:
    """`cal` with decode_slope_scale derived from a calibration raw log (its decode sweeps)."""
    iso = read_raw_log(raw_path)["iso"]
    b8 = {int(s): v["p50_s"] for s, v in iso["decode_b8"]["levels"].items() if "p50_s" in v}
    b1 = {int(s): v["p50_s"] for s, v in iso["decode_b1"]["levels"].items() if "p50_s" in v}
    sh = cal.shared
    ks = derive.slope_scale(
        b8, b1, sh.decode_seq_frac, sh.decode_ctx_frac, iso["decode_b8"]["context"],
        iso["decode_b1"]["context"], cal.ladder.total,
    )  # fmt: skip
    pts = {s: round(v, 4) for s, v in sorted(ks.items()) if v > 0}
    if len(pts) < 2:
        return cal
    curve = SmCurve(sms=list(pts), values=list(pts.values()))
    notes = {**cal.notes, "shared.decode_slope_scale": f"measured: from {raw_path} decode sweeps"}
    shared = sh.model_copy(update={"decode_slope_scale": curve})
    return cal.model_copy(update={"shared": shared, "notes": dict(sorted(notes.items()))})


def fit_table(result: FitResult, campaign: Campaign) -> list[dict[str, Any]]:
    rows = []
    for k in [*result.fit_items, *result.holdout_items]:
        m = campaign.items[k]
        rows.append(
            {
                "item": k,
                "set": "fit" if k in result.fit_items else "holdout",
                "measured": round(100 * m.attainment, 2),
                "reps": len(m.reps),
                "sim_base": round(100 * result.before[k], 2),
                "sim_fitted": round(100 * result.after[k], 2),
                "error_base_pp": round(100 * (result.before[k] - m.attainment), 2),
                "error_fitted_pp": round(100 * (result.after[k] - m.attainment), 2),
            }
        )
    return rows


def format_fit(result: FitResult, campaign: Campaign, prov: FitProvenance) -> str:
    before = errors_pp(result.before, campaign)
    lines = [
        f"fit to {campaign.path} ({len(result.fit_items)} items; {len(result.holdout_items)} "
        f"held out), {result.evaluations} evaluations — SIMULATED vs measured attainment, %",
        f"factors: {prov.factors}",
        f"{'item':30} {'set':8} {'measured':>9} {'base':>7} {'fitted':>7} {'error pp':>9}",
    ]
    for row in fit_table(result, campaign):
        lines.append(
            f"{row['item']:30} {row['set']:8} {row['measured']:>9.1f} {row['sim_base']:>7.1f} "
            f"{row['sim_fitted']:>7.1f} {row['error_fitted_pp']:>+9.1f}"
        )
    lines.append(
        f"MAE in-sample {prov.mae_in_pp:.2f} pp (base {mae(before, result.fit_items):.2f}); "
        + (
            f"holdout {prov.mae_out_pp:.2f} pp (base {mae(before, result.holdout_items):.2f}); "
            if prov.mae_out_pp is not None
            else ""
        )
        + f"largest miss {prov.largest_miss}"
    )
    return "\n".join(lines)
