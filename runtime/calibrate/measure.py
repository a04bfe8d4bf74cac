"""The calibration measurements, on the reference stage pipeline (`engine.reference`).

Everything measured lands in one JSON-able dict (the raw log, written next to the artifact):

  pipeline 1 (HorizonServe's runtime: MPS + Green Context ladders, the swept SM counts as its
  ladder; on a CPU a plain pipeline, no ladder):
    pressure.idle            NVML memory activity with nothing running
    iso.decode_b8            decode of 8 sequences at 512 tokens, shared stage alone, per SM count
                             (the isolated curve of the paper's Figure 4)
    iso.decode_b1            batch 1 at 128 tokens per SM count (decode_step_s)
    iso.fracs                batch 1/8 at 128 tokens and batch 8 at 1536 tokens, whole GPU
                             (decode_seq_frac, decode_ctx_frac)
    iso.prefill              one 2048-token prompt per SM count (prefill_token_s)
    downstream_alone.<stage> a downstream stage alone under synthetic load at each of its
                             complementary SM counts (+ batch 1 on the whole GPU); every stage
                             process of the pipeline (speech: talker, then code2wav) on its own
    corun.<stage>            the decode/prefill sweep again while that downstream stage runs
                             flat out on the complementary SMs (the co-running curve of Figure 4)
  pipeline 2 (Vanilla: time-sliced processes, no MPS, no caps; GPU only):
    baseline.<stage>         decode/prefill at the whole GPU with the pipeline's first downstream
                             stage co-running and alone (timeslice co-running factors)
    solo.<pipeline>.<class>  first-response latency of each class alone (closed loop, one
                             request at a time, fcfs): the SLO table's solo p95, with the wall
                             time the class took
  pipeline 3 (MPS without caps, the MPS baselines' mode; GPU only):
    mps.<stage>              decode/prefill at the whole GPU with the first downstream stage
                             co-running under MPS, and alone (the MPS co-running factors, in situ)
  engine                     the limits the running engine was built with (deploy profile)
On a CPU pipelines 2 and 3 are skipped and the solo runs use pipeline 1.

Resumable: with a checkpoint file every finished phase is written to it at once, and a run
with `resume` skips the phases it holds (same options and device required), so a device call
cut by its time limit continues where it stopped.
"""

from __future__ import annotations

import json
import logging
import math
import os
import platform
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Any

import numpy as np

from horizonserve.runtime.artifact import ESTIMATE_ARTIFACT, load_packaged
from horizonserve.runtime.calibrate.stats import SOLO_SAMPLES
from horizonserve.runtime.config import (
    Path,
    Priority,
    RequestClass,
    ServingConfig,
    SloTable,
    SmLadder,
    load_pipeline,
)
from horizonserve.runtime.engine.reference.pipeline import CHAINS
from horizonserve.runtime.workload import load_workload

log = logging.getLogger(__name__)

# The reference engine's downstream path standing in for each pipeline's (named by its first
# stage, whose co-running sets the shared stage's factors).
PIPELINE_DOWNSTREAM = {"qwen2_5_omni": "speech", "mimo_audio": "speech", "bagel": "image"}


def pipeline_stages(name: str) -> tuple[str, ...]:
    """The downstream stage processes pipeline `name` runs, in the order of its artifact's
    downstream entries (speech: talker, then code2wav)."""
    return CHAINS[PIPELINE_DOWNSTREAM[name]]


def _stages(pipelines: tuple[str, ...]) -> tuple[list[str], list[str]]:
    """(every downstream stage, the first stage of each path) the pipelines run, sorted."""
    every = sorted({s for p in pipelines for s in pipeline_stages(p)})
    return every, sorted({PIPELINE_DOWNSTREAM[p] for p in pipelines})


QUICK_LEVELS = (16, 32, 48, 64, 80, 96, 112)


@dataclass
class CalibrationOptions:
    pipelines: tuple[str, ...] = ("qwen2_5_omni",)
    preset: str = "full"
    quick: bool = False
    device: str = "auto"
    solo_requests: int | None = None  # per class; None: by preset / quick
    seed: int = 0
    levels: tuple[int, ...] | None = None  # swept shared-stage SM counts (None: by GPU)
    baseline: bool = True  # pipeline 2 (time-sliced co-running factors, solo runs) on a GPU
    mps: bool = True  # pipeline 3 (MPS co-running factors, uncapped) on a GPU
    checkpoint: str | None = None  # file holding finished phases (raw JSON)
    resume: bool = False  # skip the phases the checkpoint holds
    extra: dict[str, Any] = field(default_factory=dict)

    def identity(self) -> dict[str, Any]:
        """What a resumed run must share with the checkpoint it continues."""
        keep = ("pipelines", "preset", "quick", "solo_requests", "seed", "levels", "baseline")
        return {
            k: list(v) if isinstance(v, tuple) else v for k, v in vars(self).items() if k in keep
        }


def sweep_levels(total: int, quick: bool) -> list[int]:
    """Shared-stage SM counts to sweep: the 8-SM grid from 16, leaving the downstream >= 16."""
    if quick:
        return [s for s in QUICK_LEVELS if s <= total - 16]
    return list(range(16, total - 16 + 1, 8))


class NvmlTrace:
    """NVML memory activity sampled every `period_s` in a thread: (monotonic t, fraction)."""

    def __init__(self, period_s: float = 0.02) -> None:
        self.samples: list[tuple[float, float]] = []
        self.available = False
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._period = period_s
        try:
            from horizonserve.runtime.gpu import NvmlPressureSampler

            self._sampler = NvmlPressureSampler(0)
            self.available = self._sampler.available
        except Exception:  # pragma: no cover - import failure means no NVML
            self.available = False

    def start(self) -> NvmlTrace:
        if self.available:
            self._thread = threading.Thread(target=self._run, name="nvml", daemon=True)
            self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.wait(self._period):
            v = self._sampler.sample()
            if v == v:
                self.samples.append((time.monotonic(), v))

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(2.0)
        if self.available:
            self._sampler.close()

    def mean(self, t0: float, t1: float, skip: float = 0.25) -> float | None:
        """Mean over [t0 + skip·(t1 - t0), t1] (NVML lags: skip the window's start)."""
        a = t0 + skip * (t1 - t0)
        vals = [v for t, v in list(self.samples) if a <= t <= t1]
        return float(np.mean(vals)) if vals else None


def gpu_identity(device: str) -> dict[str, Any]:
    """Name, driver, SM count, memory of the device (CPU: a description of the host)."""
    info: dict[str, Any] = {"python": platform.python_version(), "machine": platform.machine()}
    try:
        import torch

        info["torch"] = torch.__version__
        info["torch_cuda"] = torch.version.cuda
    except ImportError:  # pragma: no cover - the calibration needs torch
        pass
    if not device.startswith("cuda"):
        info.update(name="cpu", driver="none", sm_count=None, memory_gib=None)
        return info
    import torch

    idx = torch.device(device).index or 0
    props = torch.cuda.get_device_properties(idx)
    info.update(
        name=torch.cuda.get_device_name(idx),
        sm_count=int(props.multi_processor_count),
        memory_gib=props.total_memory / 2**30,
        driver="unknown",
    )
    try:
        import pynvml

        pynvml.nvmlInit()
        handle = pynvml.nvmlDeviceGetHandleByIndex(idx)
        name = pynvml.nvmlDeviceGetName(handle)
        info["name"] = name if isinstance(name, str) else name.decode()
        drv = pynvml.nvmlSystemGetDriverVersion()
        info["driver"] = drv if isinstance(drv, str) else drv.decode()
        info["memory_gib"] = pynvml.nvmlDeviceGetMemoryInfo(handle).total / 2**30
    except Exception as exc:  # no NVML: keep torch's answers
        info["nvml_error"] = repr(exc)
    return info


def merged_classes(pipelines: tuple[str, ...]) -> list[RequestClass]:
    """Every requested pipeline's classes, each name once (solo runs use fcfs: profiles unused)."""
    seen: dict[str, RequestClass] = {}
    for name in pipelines:
        for c in load_pipeline(name).slo.classes:
            seen.setdefault(c.name, c)
    return list(seen.values())


def _config(preset: str, total: int, levels: list[int], pipelines: tuple[str, ...]) -> Any:
    ladder = SmLadder(levels=levels, aggressive=total, total=total) if levels else None
    from horizonserve.runtime.engine.reference.defaults import reference_config

    base = reference_config(preset, total_sms=total, ladder=ladder)
    slo = SloTable(multiplier=5.0, classes=merged_classes(pipelines))
    return ServingConfig.model_validate({**base.model_dump(), "slo": slo.model_dump()})


def _level_times(probe: dict[str, Any], key: str = "p50_s") -> dict[int, float]:
    return {int(s): v[key] for s, v in probe["levels"].items() if key in v}


class Calibrator:
    """Runs the measurements; `progress(label)` is called before each step."""

    def __init__(
        self, opts: CalibrationOptions, progress: Callable[[str], None] | None = None
    ) -> None:
        from horizonserve.runtime.engine.reference.pipeline import resolve_device
        from horizonserve.runtime.engine.reference.presets import ENGINE_PROFILE, get_preset

        self.opts = opts
        self.device = resolve_device(opts.device)
        self.cuda = self.device.startswith("cuda")
        self.preset = get_preset(opts.preset)
        self._progress = progress or (lambda _label: None)
        self.raw: dict[str, Any] = {"options": {**vars(opts)}, "device": self.device}
        self.raw["engine"] = engine_limits(self.preset, ENGINE_PROFILE)
        self.done: list[str] = []
        self._resume()
        self.stages, self.first_stages = _stages(opts.pipelines)
        q = opts.quick
        tiny = opts.preset == "tiny"
        self.level_s = 0.25 if tiny else (0.6 if q else 1.0)  # seconds per level (loads, NVML)
        self.steps = 6 if tiny else (20 if q else 40)
        self.solo_n = opts.solo_requests or (3 if tiny else (6 if q else SOLO_SAMPLES))
        self.solo_short_n = opts.solo_requests or (3 if tiny else (20 if q else SOLO_SAMPLES))
        self.ctx = 32 if tiny else 512
        self.ctx_short, self.ctx_long = (16, 96) if tiny else (128, 1536)
        self.prefill_tokens = 64 if tiny else 2048

    # -- steps ------------------------------------------------------------------------------------
    @staticmethod
    def steps_for(opts: CalibrationOptions, cuda: bool) -> int:
        """How many progress steps `run` reports (for the progress bar's total)."""
        every, first = _stages(opts.pipelines)
        n = 8 + 2 * len(every) + (2 + len(first) if cuda and opts.baseline else 0)
        return n + (2 + len(first) if cuda and opts.mps else 0)

    # -- checkpoint -------------------------------------------------------------------------------
    def _resume(self) -> None:
        path = self.opts.checkpoint
        if not (self.opts.resume and path):
            return
        try:
            with open(path) as f:
                old = json.load(f)
        except FileNotFoundError:
            return
        want, have = self.opts.identity(), old.get("identity")
        if have != want or old.get("device") != self.device:
            raise ValueError(
                f"--resume: checkpoint {path} was made with {have} on {old.get('device')}, "
                f"this run is {want} on {self.device}; remove it or drop --resume"
            )
        self.raw.update({k: v for k, v in old.items() if k not in ("options", "engine")})
        self.raw["wall_s_before"] = old.get("wall_s", 0.0)
        self.done = list(old.get("done", []))
        log.info("resuming from %s: %d phases done (%s)", path, len(self.done), self.done)

    def _save(self) -> None:
        if not self.opts.checkpoint:
            return
        self.raw["done"] = self.done
        self.raw["identity"] = self.opts.identity()
        tmp = f"{self.opts.checkpoint}.tmp"
        with open(tmp, "w") as f:
            json.dump(self.raw, f, default=str)
        os.replace(tmp, self.opts.checkpoint)

    def _phases(
        self, phases: list[tuple[str, Callable[[Any], None]]], start: Callable[[], Any]
    ) -> None:
        """Run the pending phases on one pipeline (started only when one is pending)."""
        todo = [(k, fn) for k, fn in phases if k not in self.done]
        for k, _fn in phases:
            if k in self.done:
                self._progress(f"{k} (done before: resumed)")
        if not todo:
            return
        pipe = start()
        try:
            for key, fn in todo:
                fn(pipe)
                self.done.append(key)
                self._save()
        finally:
            pipe.stop()

    def run(self) -> dict[str, Any]:
        from horizonserve.runtime.engine.reference.pipeline import Pipeline, PipelineOptions

        step = self._progress
        t_start = time.monotonic()
        step("GPU identity")
        gpu = gpu_identity(self.device)
        self.raw["gpu"] = gpu
        total = gpu["sm_count"] or 132
        self.total = total
        levels = []
        if self.cuda:
            levels = list(self.opts.levels or sweep_levels(total, self.opts.quick))
        self.raw["levels"] = [*levels, total]
        config = _config(self.opts.preset, total, levels, self.opts.pipelines)
        sharing = "mps-gc" if self.cuda else "auto"
        opts = PipelineOptions(
            preset=self.opts.preset,
            device=self.device,
            policy="horizon",
            config=config,
            downstream=tuple(self.stages),
            sharing=sharing,
            seed=self.opts.seed,
        )
        trace = NvmlTrace().start()
        self.nvml = trace
        two = self.cuda and self.opts.baseline
        three = self.cuda and self.opts.mps

        def start1() -> Any:
            nonlocal opts
            step("start pipeline (HorizonServe runtime)")
            pipe = Pipeline(opts).start()
            if self.cuda and pipe.stage_info.get("shared", {}).get("sm_cap") != "GreenContextCap":
                # Green Contexts did not come up under MPS: sweep time-sliced instead (the
                # isolated curve stays valid; the co-running one then shows time-slicing).
                reason = pipe.stage_info.get("shared", {}).get("sm_reason")
                log.warning("no SM ladder under %s (%s): retrying with sharing gc", sharing, reason)
                self.raw["pipeline1_failed"] = {"sharing": pipe.sharing, "reason": reason}
                pipe.stop()
                opts = replace(opts, sharing="gc")
                pipe = Pipeline(opts).start()
            self.raw["pipeline1"] = {
                "sharing": pipe.sharing,
                "mps": pipe.mps_active,
                "stages": pipe.stage_info,
            }
            return pipe

        def uncapped(policy: str, mode: str, key: str, label: str) -> Callable[[], Any]:
            def start() -> Any:
                step(f"start pipeline ({label})")
                o = PipelineOptions(
                    preset=self.opts.preset,
                    device=self.device,
                    policy=policy,
                    config=_config(self.opts.preset, total, [], self.opts.pipelines),
                    downstream=tuple(self.stages),
                    sharing=mode,
                    seed=self.opts.seed,
                )
                pipe = Pipeline(o).start()
                self.raw[key] = {"sharing": pipe.sharing, "stages": pipe.stage_info}
                return pipe

            return start

        def whole_alone(key: str, label: str) -> Callable[[Any], None]:
            def run(pipe: Any) -> None:
                step(f"{label}: whole GPU alone")
                self.raw.setdefault(key, {})["iso"] = pipe.probe_decode(
                    8, self.ctx, self.steps, kind="both", levels=(total,),
                    min_seconds=self.level_s, prefill_tokens=self.prefill_tokens,
                )  # fmt: skip

            return run

        def corun(stage: str, key: str, levels: tuple[int, ...] | None) -> Callable[[Any], None]:
            return lambda pipe: self._corun(pipe, stage, step, key, levels=levels)

        try:
            p1: list[tuple[str, Callable[[Any], None]]] = [
                ("iso", lambda pipe: self._isolated(pipe, step))
            ]
            p1 += [(f"downstream_alone.{s}", self._alone_phase(s, step)) for s in self.stages]
            p1 += [(f"corun.{s}", corun(s, "corun", None)) for s in self.stages]
            if not two:
                p1.append(("solo", lambda pipe: self._solo(pipe, step)))
            self._phases(p1, start1)
            full = (total,)
            if two:
                p2 = [("baseline.iso", whole_alone("baseline", "baseline"))]
                p2 += [(f"baseline.{s}", corun(s, "baseline", full)) for s in self.first_stages]
                p2.append(("solo", lambda pipe: self._solo(pipe, step)))
                self._phases(
                    p2, uncapped("fcfs", "timeslice", "pipeline2", "Vanilla: time-sliced, no caps")
                )
            if three:
                p3 = [("mps.iso", whole_alone("mps", "MPS"))]
                p3 += [(f"mps.{s}", corun(s, "mps", full)) for s in self.first_stages]
                self._phases(p3, uncapped("fcfs", "mps", "pipeline3", "MPS, no caps"))
        finally:
            trace.stop()
            self.raw["nvml_samples"] = len(trace.samples)
            self.raw["wall_s"] = self.raw.get("wall_s_before", 0.0) + time.monotonic() - t_start
            self.raw["measured_at"] = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
            self._save()
        return self.raw

    def _alone_phase(self, stage: str, step: Callable[[str], None]) -> Callable[[Any], None]:
        return lambda pipe: self._downstream_alone(pipe, stage, step)

    def _window(self, t0: float, t1: float) -> float | None:
        return self.nvml.mean(t0, t1) if self.nvml.available else None

    def _isolated(self, pipe: Any, step: Callable[[str], None]) -> None:
        iso: dict[str, Any] = {}
        self.raw["iso"] = iso
        step("idle memory activity")
        t0 = time.monotonic()
        time.sleep(1.0 if self.cuda else 0.05)
        self.raw["pressure_idle"] = self._window(t0, time.monotonic())
        step("decode sweep, shared stage alone (batch 8)")
        iso["decode_b8"] = pipe.probe_decode(
            8, self.ctx, self.steps, min_seconds=self.level_s if self.cuda else 0.0
        )
        self._pressure(iso["decode_b8"])
        step("decode sweep, batch 1")
        iso["decode_b1"] = pipe.probe_decode(1, self.ctx_short, self.steps)
        step("decode cost of batch and context (whole GPU)")
        full = (self.total,)
        iso["fracs"] = {
            "b1_short": pipe.probe_decode(1, self.ctx_short, self.steps, levels=full),
            "b8_short": pipe.probe_decode(8, self.ctx_short, self.steps, levels=full),
            "b8_long": pipe.probe_decode(8, self.ctx_long, self.steps, levels=full),
        }
        step("prefill sweep")
        iso["prefill"] = pipe.probe_decode(
            1, self.prefill_tokens, 1, kind="prefill", prefill_tokens=self.prefill_tokens,
            prefill_reps=2,
        )  # fmt: skip

    def _pressure(self, probe: dict[str, Any]) -> None:
        for rec in probe["levels"].values():
            if "t_start" in rec:
                rec["pressure"] = self._window(rec["t_start"], rec["t_end"])

    def _load_batch(self, stage: str) -> int:
        talker = self.preset.talker_limits.max_batch
        if stage == "code2wav":  # chunks per iteration: the deploy's limit (0: none)
            return self.preset.code2wav_max_batch or talker
        return talker if stage == "speech" else 1

    def _downstream_alone(self, pipe: Any, stage: str, step: Callable[[str], None]) -> None:
        step(f"{stage} stage alone, per SM count")
        total = self.total
        levels: tuple[int | None, ...] = (None,)
        if self.cuda:
            shared = [s for s in self.raw["levels"] if s < total]
            levels = (None, *sorted({total - s for s in shared}, reverse=True))
        batch = self._load_batch(stage)
        pipe.probe_load(stage, self.level_s, batch, levels)
        sweep = pipe.wait_probe(stage)
        pipe.probe_load(stage, self.level_s, 1, (None,))
        one = pipe.wait_probe(stage)
        rows = sweep["rows"]  # (t0, t1, sms, main part s, second part s, batch, prefilled)
        pressure = None
        full_rows = [r for r in rows if r[2] >= total]
        if full_rows:
            pressure = self._window(full_rows[0][0], full_rows[-1][1])
        self.raw.setdefault("downstream_alone", {})[stage] = {
            "batch": batch,
            "rows": rows,
            "batch1_rows": one["rows"],
            "pressure_full": pressure,
        }

    def _corun(
        self,
        pipe: Any,
        stage: str,
        step: Callable[[str], None],
        key: str,
        levels: tuple[int, ...] | None = None,
    ) -> None:
        step(f"{'decode sweep' if key == 'corun' else 'whole GPU'} co-running with {stage}")
        batch = self._load_batch(stage)
        pipe.probe_load(stage, 600.0, batch)
        try:
            probe = pipe.probe_decode(
                8, self.ctx, self.steps, kind="both", levels=levels, corun=True,
                min_seconds=self.level_s if self.cuda else 0.0,
                prefill_tokens=self.prefill_tokens, prefill_reps=1,
                settle_s=0.6 if stage == "image" and self.cuda else 0.3 if self.cuda else 0.02,
            )  # fmt: skip
        finally:
            pipe.stop_probe_load(stage)
        rows = pipe.wait_probe(stage)["rows"]
        self._pressure(probe)
        self.raw.setdefault(key, {})[stage] = {"probe": probe, "rows": rows, "batch": batch}

    # -- solo -------------------------------------------------------------------------------------
    def _solo(self, pipe: Any, step: Callable[[str], None]) -> None:
        step("solo first-response latency per class")
        if pipe.config is not None and pipe.config.policy.value != "fcfs":
            pipe.set_policy("fcfs")
        out: dict[str, Any] = {}
        for name in self.opts.pipelines:
            out[name] = self._solo_pipeline(pipe, name)
        self.raw["solo"] = out

    def _solo_pipeline(self, pipe: Any, name: str) -> dict[str, Any]:
        from horizonserve.runtime.engine.reference.protocol import RequestSpec

        spec = load_pipeline(name)
        workload = load_workload(name)
        template = load_packaged(ESTIMATE_ARTIFACT).pipeline(name)
        sh = template.shared
        rng = np.random.default_rng(self.opts.seed)
        preset = self.preset
        out: dict[str, Any] = {}
        for cls in spec.slo.classes:
            cw = workload.get(cls.name)
            n = self.solo_n if cls.path is Path.LONG else self.solo_short_n
            if cls.priority is Priority.IMAGE and self.opts.quick and not self.opts.solo_requests:
                n = min(n, 4)  # ~3-5 s per image alone: keep the quick run short
            draws = _draw(cw, rng, n)
            lat: list[float] = []
            errors: list[str] = []
            t_cls = time.monotonic()
            for i in range(n):
                text, audio, video, out_tok = (float(d[i]) for d in draws)
                media = audio * sh.tokens_per_audio_second + video * sh.tokens_per_video_second
                media += cw.images * sh.tokens_per_image
                tokens = max(1, round(text + media))
                shared_tokens = 1  # short path: the first token is the first response
                down: int | None = None
                if cls.path is Path.LONG:
                    audio_out = out_tok * workload.speech_seconds_per_token
                    if cls.priority is Priority.IMAGE:
                        d0 = template.downstream[0]
                        steps = d0.work_fixed + d0.work_per_input_image * cw.images
                        down = max(1, round(steps))
                        if sh.handoff_after_tokens is None:
                            shared_tokens = max(1, round(out_tok))
                        else:
                            shared_tokens = max(1, sh.handoff_after_tokens)
                    else:
                        per_s = sh.decode_tokens_per_output_audio_second
                        shared_tokens = max(1, round(audio_out * per_s if per_s else out_tok))
                        down = preset.code_chunk + 1  # the first chunk is the first response
                rs = RequestSpec(
                    f"solo-{name}-{cls.name}-{i}",
                    class_name=cls.name,
                    input_tokens=tokens,
                    output_tokens=shared_tokens,
                    downstream_tokens=down,
                )
                h = pipe.submit(rs)
                if not h.wait_done(600):
                    errors.append(f"{rs.rid}: not done in 600 s")
                    continue
                fr = h.record.first_response_s
                if fr is None or h.record.error:
                    errors.append(f"{rs.rid}: {h.record.error}")
                else:
                    lat.append(fr)
            out[cls.name] = {
                "latency_s": lat,
                "errors": errors,
                "metric": cls.metric.value,
                "wall_s": round(time.monotonic() - t_cls, 3),
            }
        return out


def engine_limits(preset: Any, profile: str) -> dict[str, Any]:
    """The limits the engine's stages were built with (from the deploy description)."""
    return {
        "deploy_profile": profile,
        "deploy_source": preset.deploy.source if preset.deploy is not None else None,
        "thinker_max_num_seqs": preset.thinker_limits.max_batch,
        "thinker_max_num_batched_tokens": preset.thinker_limits.max_prefill_tokens,
        "talker_max_num_seqs": preset.talker_limits.max_batch,
        "code2wav_max_num_seqs": preset.code2wav_max_batch,
        "first_chunk_codes": preset.first_chunk,
        "chunk_codes": preset.code_chunk,
        "dit_max_num_seqs": preset.dit_max_batch,
    }


def _draw(cw: Any, rng: np.random.Generator, n: int) -> list[np.ndarray]:
    def d(dist: Any) -> np.ndarray:
        return np.zeros(n) if dist is None else np.asarray(dist.sample(rng, n), dtype=float)

    return [d(cw.text_tokens), d(cw.audio_s), d(cw.video_s), d(cw.output_tokens)]


def finite(x: float | None) -> bool:
    return x is not None and math.isfinite(x)
