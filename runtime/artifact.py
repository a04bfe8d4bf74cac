"""The calibration artifact: what one model on one GPU costs, as the simulator and runtime read it.

One JSON file per GPU (name + driver + SM count), holding one entry per pipeline (model). The
GPU calibration writes it from measurements; until then the package ships an artifact whose
`source` says where each number comes from. Everything is plain data with units in the field
names (`_s` seconds, `sms` SM counts); curves over SM counts are piecewise linear between their
points and flat outside them.

Key of an entry: (model, gpu.name, gpu.driver, gpu.sm_count) — `CalibrationArtifact.key`.
Bump `SCHEMA_VERSION` on any incompatible change; readers refuse other versions.
"""

from __future__ import annotations

import itertools
from bisect import bisect_right
from pathlib import Path as FsPath
from typing import Literal, Self

from pydantic import BaseModel, ConfigDict, Field, model_validator

from horizonserve.runtime.config import ControlParams, SharingVerdicts, SmLadder

SCHEMA_VERSION = 1
# The reservation may slow the shared stage's co-running decode to at most this multiple of
# its best isolated step (3 × 6.2 ms on the H200: text still streams at > 50 tokens/s).
RESERVE_DECODE_TOL = 3.0
# The H200 calibration with its contention factors fitted to the measured campaign
# (`horizonserve calibrate fit`, provenance in each fitted entry's `fit`).
DEFAULT_ARTIFACT = "h200-fitted.json"
MEASURED_ARTIFACT = "h200-measured.json"  # measured by horizonserve calibrate, not fitted
# The shipped estimate built from the paper's figures: the calibration's template for every
# field it does not measure (whatever DEFAULT_ARTIFACT points to).
ESTIMATE_ARTIFACT = "default-h200.json"
# Names `load_artifact` (and every --artifact option) accepts for the shipped artifacts.
NAMED_ARTIFACTS = {
    "fitted": DEFAULT_ARTIFACT,
    "measured": MEASURED_ARTIFACT,
    "estimate": ESTIMATE_ARTIFACT,
}


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class SmCurve(_Model):
    """A positive quantity sampled at increasing SM counts; piecewise-linear in between."""

    sms: list[int] = Field(min_length=1, description="SM counts, strictly increasing.")
    values: list[float] = Field(min_length=1, description="The quantity at each SM count.")

    @model_validator(mode="after")
    def _check(self) -> Self:
        if len(self.sms) != len(self.values):
            raise ValueError(f"sms has {len(self.sms)} points but values has {len(self.values)}")
        if any(b <= a for a, b in itertools.pairwise(self.sms)):
            raise ValueError(f"sms must be strictly increasing, got {self.sms}")
        if any(s <= 0 for s in self.sms) or any(v <= 0 for v in self.values):
            raise ValueError("SM counts and values must be positive")
        return self

    def at(self, sms: float) -> float:
        """Linear interpolation; held flat beyond the first and last point."""
        xs, ys = self.sms, self.values
        if sms <= xs[0]:
            return ys[0]
        if sms >= xs[-1]:
            return ys[-1]
        i = bisect_right(xs, sms)
        x0, x1, y0, y1 = xs[i - 1], xs[i], ys[i - 1], ys[i]
        return y0 + (y1 - y0) * (sms - x0) / (x1 - x0)


class GpuKey(_Model):
    name: str = Field(min_length=1, description="GPU product name as NVML reports it.")
    driver: str = Field(min_length=1, description="Driver version, or 'unknown'.")
    sm_count: int = Field(gt=0)
    memory_gib: float = Field(gt=0)
    peak_bandwidth_gbs: float | None = Field(None, gt=0, description="Peak DRAM bandwidth.")


class SharedStageCalibration(_Model):
    """The shared (thinker/LLM) stage: iteration cost and engine limits.

    Iteration time alone at s SMs:
        decode_step_s(s) · (1 + k(s) · (decode_seq_frac · (rows − 1) + decode_ctx_frac · cached))
        + prefill_call_s + prefill_token_s(s) · prefill tokens   (the last two: with a prefill)
    k(s) = decode_slope_scale(s) (1 when absent): the batch/context slope at s SMs relative to
    the whole GPU, where the fractions are measured. rows = seqs, or with CUDA graphs the
    captured batch size that holds them (`graph_batch_sizes`: the engine pads to it). Prefill
    tokens are padded when `prefill_buckets` is set (every prompt at the batch's longest one,
    rounded up to a bucket); with `prefill_then_decode` the decode term counts only the
    sequences already running (none: no decode term).
    While a downstream stage co-runs, the first term is multiplied by corun_decode_factor(s) and
    the second by corun_prefill_factor(s): measured with the shared stage capped at s SMs and the
    downstream stage on the complementary S_tot − s (at s = S_tot: both on the whole GPU).
    """

    decode_step_s: SmCurve = Field(description="One decode iteration, batch 1, stage alone.")
    decode_seq_frac: float = Field(ge=0, description="Extra fraction per extra sequence.")
    decode_ctx_frac: float = Field(ge=0, description="Extra fraction per cached token read.")
    prefill_token_s: SmCurve = Field(description="Seconds per prefill token, stage alone.")
    corun_decode_factor: SmCurve = Field(description="Decode slowdown while downstream co-runs.")
    corun_prefill_factor: SmCurve = Field(description="Prefill slowdown while downstream co-runs.")
    decode_slope_scale: SmCurve | None = Field(
        None, description="Batch/context slope of decode at s SMs relative to S_tot (k(s))."
    )
    graph_batch_sizes: list[int] | None = Field(
        None, description="Decode batch sizes captured as CUDA graphs (None: eager, no padding)."
    )
    prefill_buckets: list[int] | None = Field(
        None,
        description="Prompt lengths the engine pads a prefill to: every prompt of the batch runs "
        "at the batch's longest one, rounded up to the next length listed (the reference engine "
        "on CUDA). None: prompts run at their own length.",
    )
    prefill_call_s: float = Field(
        0.0,
        ge=0,
        description="Fixed seconds of one prefill call at any SM count, stage alone (launch-"
        "bound eager prefill), on top of prefill_token_s per token; co-running slows it as "
        "it slows the tokens.",
    )
    prefill_then_decode: bool = Field(
        False,
        description="The engine runs an iteration as two calls, the new prompts' prefill and "
        "then one decode step of the sequences already running (the reference engine): a "
        "prompt's first token comes when the prefill ends, and an iteration without running "
        "sequences has no decode step. False: one forward pass over both, the first token "
        "when it ends (vLLM).",
    )
    sm_switch_s: float = Field(5e-6, ge=0, description="Cost of changing the SM cap.")
    max_num_seqs: int = Field(gt=0, description="Engine limit: sequences per iteration.")
    max_num_batched_tokens: int = Field(gt=0, description="Engine limit: tokens per iteration.")
    kv_capacity_tokens: int = Field(gt=0, description="KV-cache capacity in tokens.")
    tokens_per_audio_second: float = Field(ge=0, description="Prompt tokens per input audio s.")
    tokens_per_image: float = Field(ge=0, description="Prompt tokens per input image.")
    tokens_per_video_second: float = Field(ge=0, description="Prompt tokens per input video s.")
    decode_tokens_per_output_audio_second: float = Field(
        0.0,
        ge=0,
        description="Speech output decoded by the shared stage itself (0: it decodes text only).",
    )
    handoff_after_tokens: int | None = Field(
        None,
        ge=0,
        description="Shared-stage tokens before a long-path request is handed downstream; "
        "None: after its whole output (vLLM-Omni stage edges with window_size -1).",
    )


class DownstreamStageCalibration(_Model):
    """One downstream stage process (talker, code2wav, diffusion …), in chain order.

    Step time = step_s(s_down) · (1 + batch_frac · (jobs − 1)), × corun factor while the shared
    stage runs. A request brings `work_fixed + work_per_audio_second · output audio s +
    work_per_input_image · input images` steps. After `first_output_work` steps the stage emits
    its first chunk — to the next stage, or, for the last stage, as the first user-visible output.
    """

    name: str = Field(min_length=1)
    kind: Literal["ar", "chunk", "diffusion"]
    step_s: SmCurve = Field(description="One step at batch 1 vs SMs given to this stage, alone.")
    batch_frac: float = Field(ge=0, description="Extra fraction per extra job in the batch.")
    max_batch: int = Field(gt=0)
    corun_factor: SmCurve = Field(
        description="Step slowdown while the shared stage runs, vs the shared stage's SM cap."
    )
    work_fixed: float = Field(0.0, ge=0)
    work_per_audio_second: float = Field(0.0, ge=0)
    work_per_input_image: float = Field(0.0, ge=0)
    first_output_work: float | None = Field(
        None, gt=0, description="Steps before the first chunk; None: the whole job."
    )


MPS_DECODE_ROWS = 8  # decode rows of the calibration's co-running decode probe (measure.py)


class SharingCalibration(_Model):
    """Co-running without HorizonServe's SM partition (the baselines' GPU sharing).

    timeslice: separate CUDA contexts, no MPS: the shared stage pays the co-run factors at
    S_tot; the downstream stage pays `timeslice_downstream_factor`.
    mps: NVIDIA MPS: the shared stage pays 1 + mps_shared_excess · (factor(S_tot) − 1); the
    downstream stage pays `mps_downstream_factor`. The excess may exceed 1: MPS can cost the
    shared stage more than time slicing (beside the DiT, H200: ×6.3 against ×2.2).
    """

    timeslice_downstream_factor: float = Field(ge=1)
    mps_shared_excess: float = Field(ge=0, le=50)
    mps_downstream_factor: float = Field(ge=1)
    boost_prefill_excess: float = Field(
        1.0,
        ge=0,
        le=1,
        description="Share of the MPS prefill excess an urgent prefill pays when it runs on "
        "S_aggr over a partitioned downstream stage's SMs (the prefill boost): it keeps its "
        "own partition's SMs, so it overlaps the co-runner less than on the whole GPU. "
        "1: as if fully overlapped.",
    )

    mps_decode_rows_frac: float = Field(
        0.0,
        ge=0,
        description="Growth of the shared stage's MPS decode excess per decode row beyond the "
        "8 rows it was measured with (excess × (1 + frac · (rows − 8)), at least 0): the "
        "co-runner takes SM time in proportion to the step's work. 0: the same at any batch.",
    )

    def mps_shared_factor(self, full_factor: float) -> float:
        """The shared stage's co-run slowdown under MPS, from its partition factor at S_tot."""
        return 1.0 + self.mps_shared_excess * (full_factor - 1.0)

    def mps_decode_factor(self, full_factor: float, rows: int) -> float:
        """The MPS decode slowdown of a step of `rows` rows (`mps_decode_rows_frac`)."""
        grow = max(0.0, 1.0 + self.mps_decode_rows_frac * (rows - MPS_DECODE_ROWS))
        return 1.0 + (self.mps_shared_factor(full_factor) - 1.0) * grow

    def boost_prefill_factor(self, full_factor: float) -> float:
        """A boosted prefill's co-run slowdown: `boost_prefill_excess` of the MPS excess."""
        return 1.0 + self.boost_prefill_excess * (self.mps_shared_factor(full_factor) - 1.0)


class PressureCalibration(_Model):
    """NVML memory-activity fraction as a function of what runs (before noise).

    occupancy o = downstream jobs in service / the first downstream stage's max_batch, ≤ 1.
      idle                     → idle
      downstream alone         → idle + (downstream_only − idle) · o
      shared alone             → shared_only
      shared + downstream      → shared_only + (corun(s) − shared_only) · o
    """

    idle: float = Field(ge=0, le=1)
    shared_only: float = Field(ge=0, le=1)
    downstream_only: float = Field(ge=0, le=1)
    corun: SmCurve
    noise_sd: float = Field(0.0, ge=0, le=0.5)


class FitProvenance(_Model):
    """How an entry's contention factors were fitted to measured runs (`calibrate fit`)."""

    runs: list[str] = Field(min_length=1, description="Campaign directories fitted to.")
    date: str = Field(description="ISO-8601 time of the fit.")
    base: str = Field(description="The artifact the fit started from.")
    deploy_profile: str | None = None
    warmup_s: float = Field(0.0, ge=0, description="Requests before this arrival are not scored.")
    factors: dict[str, float] = Field(description="Fitted multipliers, factor → value.")
    fit_items: list[str] = Field(description="point/system items the fit saw.")
    holdout_items: list[str] = Field(default_factory=list, description="Items held out.")
    residuals_pp: dict[str, float] = Field(description="Simulated − measured, per item, pp.")
    mae_in_pp: float
    mae_out_pp: float | None = None
    largest_miss: str = Field(description="The item with the largest |residual|.")
    note: str = ""
    engine: str | None = Field(
        None,
        description="How the replay modelled the campaign's engine: 'reference' (the reference "
        "engine's limits and step rules, the controller's class table as the plan recorded "
        "it: `calibrate.fit.reference_engine`); None: the deploy file's limits and the class "
        "profiles derived from the entry.",
    )


class PipelineCalibration(_Model):
    pipeline: str = Field(min_length=1, description="qwen2_5_omni, mimo_audio or bagel.")
    model: str = Field(min_length=1)
    ladder: SmLadder
    b_sat: float = Field(gt=0, le=1, description="Saturation pressure B_sat.")
    shared: SharedStageCalibration
    downstream: list[DownstreamStageCalibration] = Field(min_length=1, max_length=2)
    sharing: SharingCalibration
    pressure: PressureCalibration
    solo_p95_s: dict[str, float] = Field(
        default_factory=dict, description="Measured solo p95 first-response latency per class."
    )
    solo_p95_source: str | None = Field(None, description="How solo_p95_s was measured.")
    tpot_s: dict[str, float] = Field(
        default_factory=dict,
        description="Measured shared-stage seconds per output token per class (p50 of solo "
        "requests on the serving engine); replaces that class profile's tpot_s when applied.",
        # not written when empty: artifacts without it keep their bytes (and their sha256,
        # which recorded reports name)
        exclude_if=lambda v: not v,
    )
    solo_p95_ci_s: dict[str, tuple[float | None, float | None]] = Field(
        default_factory=dict,
        description="95 % order-statistic CI of each solo p95 (None: unbounded that side).",
    )
    solo_samples: dict[str, int] = Field(default_factory=dict, description="Solo samples/class.")
    solo_wall_s: dict[str, float] = Field(
        default_factory=dict, description="Wall time of each class's solo measurement."
    )
    notes: dict[str, str] = Field(
        default_factory=dict, description="Provenance of individual fields (field → source)."
    )
    fit: FitProvenance | None = Field(None, description="Set when factors were fitted to runs.")
    deploy_profile: str | None = Field(
        None,
        description="Deploy profile (engine.deploy) the engine ran when this was measured; the "
        "simulator takes slot limits, token budgets and first-chunk sizes from it. None: the "
        "limits written in this entry.",
    )

    def backlog_lift_pays(self) -> bool:
        """Whether the shared stage decodes faster on S_aggr as an MPS client next to a
        co-running downstream stage than on its cap S_cap: the premise of the backlog lift.
        True on the measured H200 (7.6 vs 7.9 ms per step); false for the paper-derived
        estimate, whose decode slows down above 80 SMs."""
        s, ladder = self.shared, self.ladder
        mps = self.sharing.mps_shared_factor(s.corun_decode_factor.at(ladder.total))
        lifted = s.decode_step_s.at(ladder.aggressive) * mps
        capped = s.decode_step_s.at(ladder.s_cap) * s.corun_decode_factor.at(ladder.s_cap)
        return lifted < capped

    def throttling_pays(self) -> bool:
        """Whether capping the shared stage beside its co-runner costs it less than uncapped
        co-running as an MPS client: the premise of the SM cap (paper §4.4). The same two
        measurements as the backlog lift, read the other way. Measured H200: false for the
        Qwen2.5-Omni and MiMo-Audio calibrations (next to the talker the cap slows decode
        more than co-running does), true for BAGEL and the paper-derived estimate."""
        return not self.backlog_lift_pays()

    def reserve_choice(self) -> int:
        """The shared stage's SMs while an urgent downstream side holds the reservation: of
        the swept counts up to S_min, the one at which the first downstream stage (talker or
        DiT) steps fastest beside it, among those where the shared stage's co-running decode
        stays within `RESERVE_DECODE_TOL` of its best (text keeps streaming; ties go to the
        larger count). Measured H200, BAGEL: 16 SMs (DiT step 77.6 ms on 116 SMs against
        86.2 ms on 100, thinker decode 15.1 ms against a best of 6.2)."""
        ladder, bound = self.ladder, self._reserve_decode_bound()
        swept = sorted({*self.shared.corun_decode_factor.sms, ladder.s_min})
        fits = [c for c in swept if c <= ladder.s_min and self._shared_corun_step(c) <= bound]
        return min(fits or [ladder.s_min], key=lambda c: (self._downstream_corun_step(c), -c))

    def _reserve_decode_bound(self) -> float:
        """The slowest co-running decode step the reservation may leave the shared stage."""
        return RESERVE_DECODE_TOL * min(self.shared.decode_step_s.values)

    def _shared_corun_step(self, sms: int) -> float:
        """The shared stage's decode step on `sms` SMs beside the first downstream stage."""
        s = self.shared
        return s.decode_step_s.at(sms) * s.corun_decode_factor.at(sms)

    def _downstream_corun_step(self, shared_sms: int) -> float:
        """The first downstream stage's step on the SMs a `shared_sms` shared stage leaves."""
        d = self.downstream[0]
        return d.step_s.at(self.ladder.headroom(shared_sms)) * d.corun_factor.at(shared_sms)

    def reservation_pays(self) -> bool:
        """Whether an urgent downstream side is better served by the reservation (the shared
        stage on `SmLadder.s_reserve`, the downstream on the rest) than by uncapped co-running
        as MPS clients. It pays when uncapped co-running would slow the shared stage's decode
        past `RESERVE_DECODE_TOL` of its best (the shared side cannot be left to MPS), or when
        the first downstream stage (talker or DiT), the side the reservation serves, steps
        faster on it than as an uncapped MPS client while the shared stage's decode there
        stays within that bound. The shared side's cost needs no further weight: the
        reservation only engages while the downstream side is the more urgent and the shared
        stage is not the bottleneck (`spatial`), and the bound keeps text streaming.

        Measured H200: it pays on all three pipelines. BAGEL: uncapped, the DiT slows the
        thinker's decode about x6.3. Qwen2.5-Omni and MiMo-Audio: the talker steps x1.4 its
        solo time on the reservation against x1.9 as an MPS client. An earlier rule summed
        both sides' slowdowns and left those two to MPS; on the same requests the reservation
        then measured +1.8 pp (Qwen2.5-Omni, 8 req/s), +1.1 pp (10 req/s, mean of two runs)
        and +2.6 pp (MiMo-Audio, 8 req/s), bench/results/h200-eval/*-reserve-v1."""
        s, reserve, total = self.shared, self.ladder.s_reserve, self.ladder.total
        bound = self._reserve_decode_bound()
        shared_open = self.sharing.mps_shared_factor(s.corun_decode_factor.at(total))
        if s.decode_step_s.at(total) * shared_open > bound:
            return True
        down_open = self.downstream[0].step_s.at(total) * self.sharing.mps_downstream_factor
        return (
            self._shared_corun_step(reserve) <= bound
            and self._downstream_corun_step(reserve) < down_open
        )

    def control(self) -> ControlParams:
        """The control parameters this calibration decides: B_sat."""
        return ControlParams(b_sat=self.b_sat)

    def verdicts(self) -> SharingVerdicts:
        """Which SM configurations pay here: throttling, the downstream reservation, the
        backlog lift."""
        return SharingVerdicts(
            throttling_pays=self.throttling_pays(),
            reservation_pays=self.reservation_pays(),
            backlog_lift_pays=self.backlog_lift_pays(),
        )


class CalibrationArtifact(_Model):
    schema_version: Literal[1] = SCHEMA_VERSION
    source: str = Field(min_length=1, description="Where the numbers come from.")
    created: str | None = Field(None, description="ISO-8601 creation time.")
    gpu: GpuKey
    pipelines: dict[str, PipelineCalibration] = Field(min_length=1)

    @model_validator(mode="after")
    def _consistent(self) -> Self:
        for name, p in self.pipelines.items():
            if p.pipeline != name:
                raise ValueError(f"pipelines[{name!r}].pipeline is {p.pipeline!r}")
            if p.ladder.total != self.gpu.sm_count:
                raise ValueError(
                    f"pipelines[{name!r}].ladder.total {p.ladder.total} differs from "
                    f"gpu.sm_count {self.gpu.sm_count}"
                )
        return self

    def pipeline(self, name: str) -> PipelineCalibration:
        try:
            return self.pipelines[name]
        except KeyError:
            raise ValueError(
                f"calibration artifact has no pipeline {name!r}; it has {sorted(self.pipelines)}"
            ) from None

    def key(self, name: str) -> str:
        """model|GPU|driver|SMs — what a node looks an artifact up by."""
        p = self.pipeline(name)
        g = self.gpu
        return f"{p.model}|{g.name}|{g.driver}|{g.sm_count}"


def load_packaged(name: str) -> CalibrationArtifact:
    """An artifact shipped in the package (`runtime/data/calibration/<name>`)."""
    from importlib import resources

    ref = resources.files("horizonserve.runtime").joinpath(f"data/calibration/{name}")
    return CalibrationArtifact.model_validate_json(ref.read_text())


def load_artifact(path: str | FsPath | None = None) -> CalibrationArtifact:
    """Read an artifact; None reads the package's default artifact, a name of
    `NAMED_ARTIFACTS` ("fitted", "measured", "estimate") the shipped one of that name."""
    if path is None:
        return load_packaged(DEFAULT_ARTIFACT)
    if str(path) in NAMED_ARTIFACTS:
        return load_packaged(NAMED_ARTIFACTS[str(path)])
    p = FsPath(path)
    if not p.is_file():
        raise FileNotFoundError(f"calibration artifact {str(p)!r} does not exist")
    return CalibrationArtifact.model_validate_json(p.read_text())
