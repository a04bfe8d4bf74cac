"""Turn the raw measurements (`measure.Calibrator.run`) into a `CalibrationArtifact`.

Every pipeline entry starts from the shipped estimate (`ESTIMATE_ARTIFACT`) and replaces what
was measured; `notes[field]` says "measured: …" or "carried over …" for each field, so a
reader knows which numbers came from this GPU. Model facts (tokens per second of audio, work
units of a downstream model, engine limits of the serving engine the simulator models) are
always carried over: the reference engine has the shapes of the models, not their tokenizers.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from horizonserve.runtime.artifact import (
    ESTIMATE_ARTIFACT,
    RESERVE_DECODE_TOL,
    CalibrationArtifact,
    GpuKey,
    PipelineCalibration,
    SmCurve,
    load_packaged,
)
from horizonserve.runtime.calibrate import derive
from horizonserve.runtime.calibrate.measure import PIPELINE_DOWNSTREAM, pipeline_stages
from horizonserve.runtime.calibrate.stats import quantile_ci
from horizonserve.runtime.config import SmLadder, default_ladder
from horizonserve.runtime.engine.deploy import load_deploy
from horizonserve.runtime.engine.reference.presets import get_preset
from horizonserve.runtime.engine.reference.protocol import CODE2WAV
from horizonserve.runtime.sim.limits import with_deploy

CARRIED = f"carried over from {ESTIMATE_ARTIFACT} (estimate)"


def _curve(points: dict[int, float]) -> SmCurve | None:
    pts = {int(s): float(v) for s, v in points.items() if v is not None and v > 0}
    if not pts:
        return None
    xs = sorted(pts)
    return SmCurve(sms=xs, values=[round(pts[x], 9) for x in xs])


def _p50(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def level_stat(probe: dict[str, Any], key: str) -> dict[int, float]:
    return {int(s): rec[key] for s, rec in probe["levels"].items() if rec.get(key)}


def prefill_per_token(probe: dict[str, Any]) -> dict[int, float]:
    out = {}
    for s, rec in probe["levels"].items():
        if rec.get("prefill_p50_s") and rec.get("prefill_tokens"):
            out[int(s)] = rec["prefill_p50_s"] / rec["prefill_tokens"]
    return out


def by_sms(rows: list[list[float]], part: int = 3, *, kind: str = "main") -> dict[int, float]:
    """Median component time per SM count from downstream rows.

    rows: (t0, t1, sms, main s, second s, n, prefilled). kind "main": the main part of
    iterations that admitted nothing (talker decode / DiT step); "chunk": the second part per
    iteration that vocoded (the code2wav stage's rows), divided by nothing (a batch of n
    chunks).
    """
    groups: dict[int, list[float]] = {}
    for r in rows:
        sms = int(r[2])
        if kind == "main" and r[6] == 0 and r[3] > 0:
            groups.setdefault(sms, []).append(r[3])
        elif kind == "chunk" and r[5] > 0 and r[4] > 0:
            groups.setdefault(sms, []).append(r[4])
    return {s: statistics.median(v) for s, v in groups.items() if v}


def in_windows(rows: list[list[float]], probe: dict[str, Any]) -> list[list[float]]:
    """Downstream rows that ran entirely while the shared stage was busy at a probe level.

    The shared stage is idle while it settles on a new split and between levels; rows from
    then are not co-running and would bias the co-running factors towards 1.
    """
    wins = [(rec["t_start"], rec["t_end"]) for rec in probe["levels"].values() if "t_start" in rec]
    return [r for r in rows if any(a <= r[0] and r[1] <= b for a, b in wins)]


def chunk_batch(rows: list[list[float]]) -> int:
    ns = [int(r[5]) for r in rows if r[5] > 0]
    return int(statistics.median(ns)) if ns else 1


_DEPLOY_FIELDS = (
    "shared.max_num_seqs",
    "shared.max_num_batched_tokens",
    "downstream.talker.max_batch",
    "downstream.talker.first_output_work",
    "downstream.code2wav.max_batch",
    "downstream.code2wav.first_output_work",
    "downstream.diffusion.max_batch",
)


def _r5(x: float | None) -> float | None:
    return None if x is None else round(x, 5)


class _Notes(dict[str, str]):
    def measured(self, key: str, text: str) -> None:
        self[key] = f"measured: {text}"

    def carried(self, key: str, extra: str = "") -> None:
        self[key] = CARRIED + (f"; {extra}" if extra else "")


def build_artifact(raw: dict[str, Any], command: str) -> tuple[CalibrationArtifact, dict[str, Any]]:
    """The artifact and a summary (ladder, SLO table, Figure-4 table) of one calibration run."""
    estimate = load_packaged(ESTIMATE_ARTIFACT)
    gpu = raw["gpu"]
    cuda = raw["device"].startswith("cuda")
    total = int(gpu.get("sm_count") or estimate.gpu.sm_count)
    iso = raw["iso"]
    iso_b8 = level_stat(iso["decode_b8"], "p50_s")
    iso_b1 = level_stat(iso["decode_b1"], "p50_s")
    prefill = prefill_per_token(iso["prefill"])
    f = iso["fracs"]
    d1, seq_frac, ctx_frac = derive.decode_fracs(
        f["b1_short"]["levels"][str(total)]["p50_s"],
        f["b8_short"]["levels"][str(total)]["p50_s"],
        f["b8_long"]["levels"][str(total)]["p50_s"],
        f["b1_short"]["context"],
        f["b8_long"]["context"],
    )
    ctx_short = f["b1_short"]["context"]
    summary: dict[str, Any] = {"gpu": gpu, "total_sms": total, "pipelines": {}}
    entries: dict[str, PipelineCalibration] = {}
    for name in raw["options"]["pipelines"]:
        entry, info = _pipeline(
            raw, estimate.pipeline(name), name, total, cuda, iso_b8, iso_b1, prefill,
            (d1, seq_frac, ctx_frac, ctx_short),
        )  # fmt: skip
        entries[name] = entry
        summary["pipelines"][name] = info
    # When the GPU measured it (a rebuild from a raw log keeps the measurement's time).
    when = raw.get("measured_at") or datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    what = "NVIDIA GPU" if cuda else "CPU (GPU-specific parts skipped: no SM ladder, no NVML)"
    source = (
        f"measured on {gpu['name']} ({what}) by horizonserve calibrate on {when}: `{command}`. "
        f"Reference engine, preset {raw['options']['preset']} (the models' shapes, random "
        "weights), stages as separate processes; per-field provenance in each pipeline's notes "
        f"(fields not measured are carried over from {ESTIMATE_ARTIFACT}, an estimate)."
    )
    mem = gpu.get("memory_gib") or estimate.gpu.memory_gib
    key = GpuKey(
        name=gpu["name"] if cuda else f"cpu ({gpu.get('machine', '?')})",
        driver=str(gpu.get("driver") or "unknown"),
        sm_count=total,
        memory_gib=round(float(mem), 2),
        peak_bandwidth_gbs=estimate.gpu.peak_bandwidth_gbs if cuda else None,
    )
    art = CalibrationArtifact(source=source, created=when, gpu=key, pipelines=entries)
    return art, summary


@dataclass(frozen=True)
class _Inputs:
    """One pipeline's calibration run, as every part of its entry reads it."""

    raw: dict[str, Any]
    tpl: PipelineCalibration  # the estimate: what is not measured is carried from it
    name: str
    total: int
    cuda: bool
    iso_b8: dict[int, float]
    iso_b1: dict[int, float]
    prefill: dict[int, float]
    seq_frac: float
    ctx_frac: float
    ctx_short: int
    stage: str
    p1: str  # pipeline 1's sharing mode
    how: str
    ctx: Any
    ptoks: Any
    corun_run: dict[str, Any] | None
    base_run: dict[str, Any] | None
    mps_run: dict[str, Any] | None  # pipeline 3: MPS without caps, in situ
    corun_b8: dict[int, float]
    corun_pre: dict[int, float]
    corun_pressure: dict[int, float]

    @classmethod
    def read(
        cls,
        raw: dict[str, Any],
        tpl: PipelineCalibration,
        name: str,
        total: int,
        cuda: bool,
        iso: tuple[dict[int, float], dict[int, float], dict[int, float]],
        fracs: tuple[float, float, float, int],
    ) -> _Inputs:
        _d1, seq_frac, ctx_frac, ctx_short = fracs
        stage = PIPELINE_DOWNSTREAM[name]
        p1 = raw.get("pipeline1", {}).get("sharing", "timeslice")
        how = {
            "mps-gc": "MPS + Green Contexts, disjoint SMs",
            "gc": "Green Contexts without MPS (time-sliced processes)",
        }.get(p1, f"{p1} sharing, no SM partition")
        levels = raw["iso"]["prefill"]["levels"].values()
        corun_run = raw.get("corun", {}).get(stage)
        probe = corun_run["probe"] if corun_run else None
        return cls(
            raw=raw, tpl=tpl, name=name, total=total, cuda=cuda, iso_b8=iso[0], iso_b1=iso[1],
            prefill=iso[2], seq_frac=seq_frac, ctx_frac=ctx_frac, ctx_short=ctx_short,
            stage=stage, p1=p1, how=how, ctx=raw["iso"]["decode_b8"]["context"],
            ptoks=next((r["prefill_tokens"] for r in levels), "?"), corun_run=corun_run,
            base_run=raw.get("baseline", {}).get(stage), mps_run=raw.get("mps", {}).get(stage),
            corun_b8=level_stat(probe, "p50_s") if probe else {},
            corun_pre=prefill_per_token(probe) if probe else {},
            corun_pressure=level_stat(probe, "pressure") if probe else {},
        )  # fmt: skip

    @property
    def swept(self) -> bool:
        """The SM counts were swept on a GPU (a ladder and a reservation can be chosen)."""
        return self.cuda and len([s for s in self.iso_b8 if s < self.total]) >= 2


@dataclass
class _SharedFactors:
    """What the shared stage's part measured that the sharing part reads."""

    ts_dec: float | None  # decode factor, both stages on the whole GPU, time-sliced
    mps_dec: float | None  # … under MPS
    mps1: bool  # the MPS figure is an MPS measurement
    mps_how: str


def _pipeline(
    raw: dict[str, Any],
    tpl: PipelineCalibration,
    name: str,
    total: int,
    cuda: bool,
    iso_b8: dict[int, float],
    iso_b1: dict[int, float],
    prefill: dict[int, float],
    fracs: tuple[float, float, float, int],
) -> tuple[PipelineCalibration, dict[str, Any]]:
    """One pipeline's entry and its summary, part by part (each records its provenance)."""
    run = _Inputs.read(raw, tpl, name, total, cuda, (iso_b8, iso_b1, prefill), fracs)
    notes = _Notes()
    ladder = _ladder(run, notes)
    sh, factors = _shared(run, notes)
    downs, ds_info, f_ts_down, f_mps_down = _downstream(run, notes, factors)
    sharing = _sharing(run, notes, factors, f_ts_down, f_mps_down)
    pressure, b_sat = _pressure(run, notes, ladder)
    p95s, src, cis, counts, walls = _solo(run, notes)
    entry = PipelineCalibration(
        pipeline=name,
        model=tpl.model,
        ladder=ladder,
        b_sat=round(b_sat, 4),
        shared=sh,
        downstream=downs,
        sharing=sharing,
        pressure=pressure,
        solo_p95_s=p95s,
        solo_p95_source=src,
        solo_p95_ci_s=cis,
        solo_samples=counts,
        solo_wall_s=walls,
        notes=dict(sorted(notes.items())),
    )
    entry = _with_engine(run, notes, _with_reserve(run, notes, entry))
    info = {
        "context": run.ctx,
        "sharing_mode": run.p1,
        "ladder": ladder.model_dump(),
        "s_cap": ladder.s_cap,
        "s_aggr": ladder.aggressive,
        "b_sat": entry.b_sat,
        "backlog_lift": entry.backlog_lift_pays(),
        "tpot_b8_iso_s": iso_b8,
        "tpot_b8_corun_s": run.corun_b8,
        "tpot_b8_timeslice_full_s": (
            run.base_run["probe"]["levels"][str(total)]["p50_s"] if run.base_run else None
        ),
        "pressure_corun": run.corun_pressure,
        "solo_p95_s": p95s,
        "solo_p95_ci_s": cis,
        "solo_wall_s": walls,
        "slo_s": {c: round(v * 5.0, 5) for c, v in p95s.items()},
        "downstream": ds_info,
        "sharing": sharing,
    }
    return entry, info


def _ladder(run: _Inputs, notes: _Notes) -> SmLadder:
    """The SM ladder: chosen from the sweep on a GPU, else the estimate's (or the default)."""
    # -- ladder --------------------------------------------------------------------------------
    if run.swept:
        choice = derive.choose_ladder(run.iso_b8, run.corun_b8, run.prefill, run.total)
        ladder = SmLadder(levels=list(choice.levels), aggressive=choice.s_aggr, total=run.total)
        notes.measured(
            "ladder",
            f"S_cap {choice.s_cap}: {choice.reason}; S_min {choice.s_min}: smallest swept count "
            f"with isolated TPOT <= {1 + derive.TOL_MIN:.2f} x best; S_aggr {choice.s_aggr}: "
            "smallest count >= S_cap at near-best isolated decode and prefill; swept "
            f"{sorted(run.iso_b8)} with the downstream stage ({run.stage}) on the complementary "
            "SMs",
        )
    else:
        ladder = run.tpl.ladder if run.tpl.ladder.total == run.total else default_ladder(run.total)
        notes.carried("ladder", "no SM sweep on this device")

    return ladder


def _shared(run: _Inputs, notes: _Notes) -> tuple[dict[str, Any], _SharedFactors]:
    """The shared stage's curves: decode and prefill per SM count, alone and co-running."""
    b8_desc = (
        f"decode step of 8 sequences at {run.ctx} cached tokens (CUDA-graph replay on GPU), p50"
    )
    # -- shared stage ----------------------------------------------------------------------------
    sh = run.tpl.shared.model_dump()
    scale = 1.0 + run.ctx_frac * run.ctx_short
    step = _curve({s: v / scale for s, v in run.iso_b1.items()})
    if step is not None:
        sh["decode_step_s"] = step.model_dump()
        notes.measured(
            "shared.decode_step_s",
            f"decode step of 1 sequence at {run.ctx_short} cached tokens per SM count (graph "
            "replay, p50), the context term removed",
        )
    sh["decode_seq_frac"] = round(run.seq_frac, 6)
    sh["decode_ctx_frac"] = round(run.ctx_frac, 9)
    ks = derive.slope_scale(
        run.iso_b8, run.iso_b1, run.seq_frac, run.ctx_frac, run.ctx, run.ctx_short, run.total
    )
    slope = _curve({s: v for s, v in ks.items() if v > 0}) if len(ks) >= 2 else None
    if slope is not None:
        sh["decode_slope_scale"] = slope.model_dump()
        notes.measured(
            "shared.decode_slope_scale",
            f"per SM count, batch 8 at {run.ctx} vs batch 1 at {run.ctx_short} cached tokens: the "
            "batch/context slope relative to the whole GPU",
        )
    for k in ("decode_seq_frac", "decode_ctx_frac"):
        notes.measured(
            f"shared.{k}",
            "batch 1 vs 8 at 128 tokens and batch 8 at 128 vs 1536 tokens, whole GPU; "
            "T = d1·(1 + seq·(B-1) + ctx·B·c) solved for seq and ctx",
        )
    pre = _curve(run.prefill)
    if pre is not None:
        sh["prefill_token_s"] = pre.model_dump()
        notes.measured(
            "shared.prefill_token_s", f"one prompt of {run.ptoks} tokens per SM count, p50"
        )
    ts_dec = ts_pre = None
    if run.base_run is not None:
        b_iso = run.raw["baseline"]["iso"]["levels"][str(run.total)]
        b_co = run.base_run["probe"]["levels"][str(run.total)]
        ts_dec = b_co["p50_s"] / b_iso["p50_s"]
        ts_pre = b_co["prefill_p50_s"] / b_iso["prefill_p50_s"]
    cd = {
        s: run.corun_b8[s] / run.iso_b8[s]
        for s in run.corun_b8
        if s in run.iso_b8 and s < run.total
    }
    cp = {
        s: run.corun_pre[s] / run.prefill[s]
        for s in run.corun_pre
        if s in run.prefill and s < run.total
    }
    mps_dec = (
        run.corun_b8[run.total] / run.iso_b8[run.total]
        if run.total in run.corun_b8 and run.total in run.iso_b8
        else None
    )
    mps_pre = (
        run.corun_pre[run.total] / run.prefill[run.total]
        if run.total in run.corun_pre and run.total in run.prefill
        else None
    )
    mps_run, mps1 = run.mps_run, run.p1 in ("mps-gc", "mps")
    mps_how = "pipeline 1 at S_tot (MPS + Green Contexts, the whole GPU each)"
    if mps_run is not None and "iso" in run.raw.get("mps", {}):
        m_iso = run.raw["mps"]["iso"]["levels"][str(run.total)]
        m_co = mps_run["probe"]["levels"][str(run.total)]
        mps_dec = m_co["p50_s"] / m_iso["p50_s"]
        mps1 = True
        mps_how = "pipeline 3 (MPS, no caps, both on the whole GPU, as the MPS baselines run)"
    full_dec = ts_dec if ts_dec is not None else mps_dec
    full_pre = ts_pre if ts_pre is not None else mps_pre
    if full_dec:
        cd[run.total] = full_dec
    if full_pre:
        cp[run.total] = full_pre
    cdc, cpc = _curve(cd), _curve(cp)
    at_full = (
        "at S_tot the Vanilla mode (no MPS, both stages on the whole GPU, time-sliced)"
        if ts_dec is not None
        else f"at S_tot both stages on the whole GPU ({run.p1})"
    )
    if cdc is not None and run.corun_run:
        sh["corun_decode_factor"] = cdc.model_dump()
        notes.measured(
            "shared.corun_decode_factor",
            f"{b8_desc} with the {run.stage} stage running flat out on S_tot - s SMs ({run.how}) / "
            f"the same alone; {at_full}",
        )
    if cpc is not None and run.corun_run:
        sh["corun_prefill_factor"] = cpc.model_dump()
        notes.measured(
            "shared.corun_prefill_factor",
            f"{run.ptoks}-token prefill, co-running / alone; {at_full}",
        )
    # The engine's own prompt template: media tokens per input image (not the model card's).
    image_tokens = get_preset(run.raw["options"]["preset"]).tokens_per_image
    if sh.get("tokens_per_image"):
        sh["tokens_per_image"] = float(image_tokens)
        notes["shared.tokens_per_image"] = (
            f"engine setting: the reference engine's prompt holds {image_tokens} tokens per "
            "input image"
        )
    for k in (
        "sm_switch_s", "max_num_seqs", "max_num_batched_tokens", "kv_capacity_tokens",
        "tokens_per_audio_second", "tokens_per_video_second",
        "decode_tokens_per_output_audio_second", "handoff_after_tokens",
    ):  # fmt: skip
        notes.carried(f"shared.{k}", "engine limits / model facts")
    if "shared.tokens_per_image" not in notes:
        notes.carried("shared.tokens_per_image", "engine limits / model facts")

    return sh, _SharedFactors(ts_dec, mps_dec, mps1, mps_how)


def _downstream(
    run: _Inputs, notes: _Notes, factors: _SharedFactors
) -> tuple[list[dict[str, Any]], dict[str, Any], float | None, float | None]:
    """Each downstream stage's step and co-run factor, and the whole-GPU factors the sharing
    part reads (time-sliced, MPS)."""
    # -- downstream -------------------------------------------------------------------------------
    alones = run.raw.get("downstream_alone", {})
    downs = [d.model_dump() for d in run.tpl.downstream]
    ds_info: dict[str, Any] = {}
    f_ts_down = f_mps_down = None
    # Each downstream entry from the stage process that runs it: the talker's decode step (or
    # the DiT's) is a main part, code2wav's chunk a vocoder part (see by_sms).
    for i, part in enumerate(pipeline_stages(run.name)[: len(downs)]):
        part_alone, part_corun = alones.get(part), run.raw.get("corun", {}).get(part)
        if part_alone is None:
            continue
        kind = "chunk" if part == CODE2WAV else "main"
        what = {"main": "talker decode step" if run.stage == "speech" else "DiT step",
                "chunk": "code2wav chunk"}[kind]  # fmt: skip
        d = downs[i]
        al = by_sms(part_alone["rows"], kind=kind)
        one = by_sms(part_alone["batch1_rows"], kind=kind)
        nb = part_alone["batch"] if kind == "main" else chunk_batch(part_alone["rows"])
        frac = derive.batch_frac(one.get(run.total, 0.0), al.get(run.total, 0.0), nb)
        if run.stage == "image":
            frac = d["batch_frac"]  # measured at batch 1 only (the DiT stage runs batch 1)
        unit = 1.0
        if kind == "chunk":  # the template's step is 1 s of audio; ours is code_chunk codes
            pr = get_preset(run.raw["options"]["preset"])
            unit = pr.codes_per_audio_second / pr.code_chunk
        steps = {s: unit * v / (1 + frac * (nb - 1)) for s, v in al.items()}
        c = _curve(steps)
        if c is not None:
            d["step_s"] = c.model_dump()
            d["batch_frac"] = round(frac, 5)
            notes.measured(
                f"downstream.{d['name']}.step_s",
                f"reference {what} alone ({part} stage) under synthetic load per SM count "
                f"(batch {nb}, normalised to batch 1 by batch_frac)"
                + (f"; x{unit:g} to the template's 1-s chunk" if unit != 1.0 else ""),
            )
        if part_corun:
            co = by_sms(in_windows(part_corun["rows"], part_corun["probe"]), kind=kind)
            fac = {run.total - s: co[s] / al[s] for s in co if s in al and s < run.total}
            if run.total in co and run.total in al:
                fac[run.total] = co[run.total] / al[run.total]  # both on the whole GPU (pipeline 1)
                if i == 0 and factors.mps1:
                    f_mps_down = fac[run.total]
            fc = _curve(fac)
            if fc is not None:
                d["corun_factor"] = fc.model_dump()
                notes.measured(
                    f"downstream.{d['name']}.corun_factor",
                    f"{what} while the shared stage decodes at s SMs (this stage on S_tot - s) "
                    "/ the same alone, vs s",
                )
        if run.base_run and i == 0:
            bco = by_sms(in_windows(run.base_run["rows"], run.base_run["probe"]), kind=kind)
            if run.total in bco and run.total in al:
                f_ts_down = bco[run.total] / al[run.total]
        if run.mps_run and i == 0:
            mco = by_sms(in_windows(run.mps_run["rows"], run.mps_run["probe"]), kind=kind)
            if run.total in mco and run.total in al:
                f_mps_down = mco[run.total] / al[run.total]
        ds_info[d["name"]] = {"alone_s": al, "batch": nb}
    for d in downs:
        facts = ["work_fixed", "work_per_audio_second", "work_per_input_image",
                 "first_output_work", "max_batch"]  # fmt: skip
        if d["name"] == "diffusion":  # the engine's own step count, not the model card's
            steps = get_preset(run.raw["options"]["preset"]).dit.steps
            d["work_fixed"], d["work_per_input_image"] = float(steps), 0.0
            how = f"reference engine: {steps} denoising steps per image, input images add none"
            for k in ("work_fixed", "work_per_input_image"):
                notes[f"downstream.diffusion.{k}"] = f"engine setting: {how}"
                facts.remove(k)
        for k in facts:
            notes.carried(f"downstream.{d['name']}.{k}", "model facts")
    return downs, ds_info, f_ts_down, f_mps_down


def _sharing(
    run: _Inputs,
    notes: _Notes,
    factors: _SharedFactors,
    f_ts_down: float | None,
    f_mps_down: float | None,
) -> dict[str, Any]:
    """How the stages slow each other on the whole GPU, time-sliced and under MPS."""
    # -- sharing ---------------------------------------------------------------------------------
    sharing = run.tpl.sharing.model_dump()

    def set_sharing(name: str, value: float | None, how: str) -> None:
        """Measured value (rounded) with how it was measured, or the estimate's, carried."""
        if value is None:
            notes.carried(f"sharing.{name}")
            return
        sharing[name] = round(value, 4)
        notes.measured(f"sharing.{name}", how)

    both_full = f"{run.stage} step with the shared stage decoding, both on the whole GPU"
    set_sharing(
        "timeslice_downstream_factor",
        max(1.0, f_ts_down) if f_ts_down else None,
        f"{both_full}, no MPS / alone",
    )
    set_sharing(
        "mps_downstream_factor",
        max(1.0, f_mps_down) if f_mps_down else None,
        f"{both_full}, MPS / alone; {factors.mps_how}",
    )
    excess = (
        derive.excess_share(factors.mps_dec, factors.ts_dec)
        if factors.ts_dec and factors.mps_dec and factors.mps1
        else None
    )
    set_sharing(
        "mps_shared_excess",
        excess,
        ""
        if excess is None
        else (
            f"(MPS co-run factor {factors.mps_dec:.3f} - 1) / (time-sliced factor "
            f"{factors.ts_dec:.3f} - 1); MPS from {factors.mps_how}"
        ),
    )
    return sharing


def _pressure(run: _Inputs, notes: _Notes, ladder: SmLadder) -> tuple[dict[str, Any], float]:
    """The NVML memory-activity model and B_sat."""
    # -- pressure --------------------------------------------------------------------------------
    pressure = run.tpl.pressure.model_dump()
    p_idle = run.raw.get("pressure_idle")
    p_shared = run.raw["iso"]["decode_b8"]["levels"].get(str(run.total), {}).get("pressure")
    alone = run.raw.get("downstream_alone", {}).get(run.stage)
    p_down = alone.get("pressure_full") if alone else None
    for key, val, what in (
        ("idle", p_idle, "nothing running"),
        ("shared_only", p_shared, "shared-stage decode alone, whole GPU"),
        ("downstream_only", p_down, f"{run.stage} stage alone, whole GPU"),
    ):
        if val is not None:
            pressure[key] = round(min(1.0, max(0.0, val)), 4)
            notes.measured(f"pressure.{key}", f"NVML memory activity, {what}")
        else:
            notes.carried(f"pressure.{key}", "no NVML reading")
    pc = _curve({s: v for s, v in run.corun_pressure.items() if v})
    if pc is not None:
        pressure["corun"] = pc.model_dump()
        notes.measured("pressure.corun", "NVML memory activity during the co-running sweep")
    else:
        notes.carried("pressure.corun", "no NVML reading")
    b_sat = derive.choose_b_sat(run.corun_pressure, ladder.s_cap) if run.corun_pressure else None
    if b_sat is not None:
        notes.measured("b_sat", "highest co-running NVML memory activity at or below S_cap")
    else:
        b_sat = run.tpl.b_sat
        notes.carried("b_sat", "no NVML on this device")
    if "noise_sd" in pressure:
        notes.carried("pressure.noise_sd")
    return pressure, b_sat


def _solo(
    run: _Inputs, notes: _Notes
) -> tuple[
    dict[str, float],
    str,
    dict[str, tuple[float | None, float | None]],
    dict[str, int],
    dict[str, float],
]:
    """Each class's solo p95 (the SLO basis), its confidence interval, sample count and wall
    time, and where the table comes from."""
    # -- solo p95 --------------------------------------------------------------------------------
    solo = run.raw.get("solo", {}).get(run.name, {})
    p95s: dict[str, float] = {}
    cis: dict[str, tuple[float | None, float | None]] = {}
    walls: dict[str, float] = {}
    counts: dict[str, int] = {}
    for cls, value in run.tpl.solo_p95_s.items():
        lat = solo.get(cls, {}).get("latency_s") or []
        if lat:
            p95s[cls] = round(derive.p95(lat), 5)
            est = quantile_ci(lat)
            cis[cls] = (_r5(est.lo), _r5(est.hi))
            counts[cls] = len(lat)
            if "wall_s" in solo[cls]:
                walls[cls] = float(solo[cls]["wall_s"])
        else:
            p95s[cls] = value
            notes.carried(f"solo_p95_s.{cls}", "not measured")
    src = run.tpl.solo_p95_source
    if solo:
        n = {c: len(v.get("latency_s", [])) for c, v in solo.items()}
        src = (
            "measured: each class alone (closed loop, one request at a time, fcfs, Vanilla "
            f"sharing on a GPU), nearest-rank p95 of {n} requests; reference engine with the "
            "model's prompt lengths (media tokens per the template), first response = first "
            "token / first audio chunk / finished image"
        )
    return p95s, src, cis, counts, walls


def _with_reserve(run: _Inputs, notes: _Notes, entry: PipelineCalibration) -> PipelineCalibration:
    """The entry with its reservation: a calibrated choice too, read from its own curves."""
    if run.swept:
        # The reservation is a calibrated choice too: it needs the entry's own curves.
        reserve = entry.reserve_choice()
        notes.measured(
            "ladder.reserve",
            f"{reserve} SMs: of the swept counts up to S_min, where the first downstream stage "
            "steps fastest beside the shared stage while its co-running decode stays within "
            f"{RESERVE_DECODE_TOL:g} x its best (PipelineCalibration.reserve_choice)",
        )
        entry = entry.model_copy(
            update={
                "ladder": entry.ladder.model_copy(update={"reserve": reserve}),
                "notes": dict(sorted(notes.items())),
            }
        )
    return entry


def _with_engine(run: _Inputs, notes: _Notes, entry: PipelineCalibration) -> PipelineCalibration:
    """The entry with the engine's own limits, read from its deploy description."""
    eng = run.raw.get("engine")
    if eng and eng.get("deploy_profile") and run.name in ("qwen2_5_omni", "bagel", "mimo_audio"):
        # The engine's own limits, read from its deploy description, not carried over.
        profile = eng["deploy_profile"]
        entry = with_deploy(entry, load_deploy(run.name, profile))
        note = f"engine: deploy profile {profile!r} ({eng.get('deploy_source')})"
        names = {f"downstream.{d.name}." for d in entry.downstream}
        extra = {k: note for k in _DEPLOY_FIELDS if not k.startswith("downstream.") or
                 any(k.startswith(n) for n in names)}  # fmt: skip
        notes_all = dict(sorted({**entry.notes, **extra}.items()))
        entry = entry.model_copy(update={"deploy_profile": profile, "notes": notes_all})
    return entry


def merge_artifacts(arts: list[CalibrationArtifact]) -> CalibrationArtifact:
    """One artifact holding every pipeline of `arts` (one GPU key; each pipeline once)."""
    if not arts:
        raise ValueError("nothing to merge")
    first = arts[0]
    pipelines: dict[str, PipelineCalibration] = {}
    for a in arts:
        if a.gpu != first.gpu:
            raise ValueError(f"cannot merge artifacts of {first.gpu.name} and {a.gpu.name}")
        for name, entry in a.pipelines.items():
            if name in pipelines:
                raise ValueError(f"pipeline {name!r} is in more than one artifact")
            pipelines[name] = entry
    if len(arts) == 1:
        return first
    source = " Then ".join(a.source for a in arts)
    created = max(a.created for a in arts)
    return first.model_copy(update={"source": source, "created": created, "pipelines": pipelines})
