"""Per-class offline profiles (the profiler's r̂ inputs) derived from a calibration artifact.

The profiler estimates a request's remaining time from a coarse per-class profile (paper §4.2).
Here that profile is computed from the same artifact the simulator runs on, at the shared
stage's aggressive SM cap and with the downstream stage alone — the solo view a calibration run
would record. `python -m horizonserve.runtime.sim.profiles` rewrites the shipped pipeline files
from the package's default artifact and records which one in their `source`.
"""

from __future__ import annotations

import json
import sys

import numpy as np

from horizonserve.runtime.bench.workload import ClassWorkload, WorkloadSpec, load_workload
from horizonserve.runtime.calibrate.artifact import (
    DEFAULT_ARTIFACT,
    CalibrationArtifact,
    PipelineCalibration,
    load_packaged,
)
from horizonserve.runtime.config import Metric, Path, RequestClass, StageProfile

_TYPICAL_BATCH = 8  # sequences assumed in a decode iteration when turning steps into TPOT


def _mean(dist: object, seed: int = 0) -> float:
    if dist is None:
        return 0.0
    return float(np.mean(dist.sample(np.random.default_rng(seed), 20000)))  # type: ignore[attr-defined]


def derive_profile(
    cal: PipelineCalibration, workload: WorkloadSpec, cw: ClassWorkload, cls: RequestClass
) -> StageProfile:
    sh = cal.shared
    s = cal.ladder.aggressive
    per_token = sh.prefill_token_s.at(s)
    step = sh.decode_step_s.at(s)
    tpot = step * (1 + sh.decode_seq_frac * (_TYPICAL_BATCH - 1))
    decode_first = 0
    down_steps = 0
    down_step_s = 0.0
    if cls.path is Path.LONG:
        out_tokens = _mean(cw.output_tokens)
        audio_s = out_tokens * workload.speech_seconds_per_token
        if cls.metric is Metric.TTFO and sh.decode_tokens_per_output_audio_second > 0:
            decode_len = audio_s * sh.decode_tokens_per_output_audio_second
        else:
            decode_len = out_tokens
        handoff = sh.handoff_after_tokens
        decode_first = round(decode_len if handoff is None else min(handoff, decode_len))
        total = cal.ladder.total
        steps: list[tuple[float, float]] = []  # (steps before the first output, step seconds)
        for d in cal.downstream:
            work = d.work_fixed + d.work_per_audio_second * audio_s
            work += d.work_per_input_image * cw.images
            first = d.first_output_work if d.first_output_work is not None else work
            steps.append((min(first, work), d.step_s.at(total)))
        n = sum(k for k, _ in steps)
        down_steps = round(n)
        down_step_s = sum(k * t for k, t in steps) / n if n else 0.0
    return StageProfile(
        prefill_base_s=round(step, 6),
        prefill_s_per_token=round(per_token, 9),
        prefill_s_per_audio_second=round(sh.tokens_per_audio_second * per_token, 7),
        prefill_s_per_image=round(sh.tokens_per_image * per_token, 7),
        decode_tokens_to_first_response=decode_first,
        tpot_s=round(tpot, 6),
        downstream_steps_to_first_response=down_steps,
        downstream_step_s=round(down_step_s, 6),
    )


SOLO_REQUESTS = 200  # requests per class behind the shipped solo_p95_s defaults (seed 0)


def pipeline_source(artifact_name: str, artifact: CalibrationArtifact) -> str:
    """The `source` line of a shipped pipeline file derived from `artifact_name`."""
    measured = artifact.source.startswith("measured")
    what = (
        "measured on the GPU by `horizonserve calibrate` (per-field provenance in its notes)"
        if measured
        else "an ESTIMATE anchored on the paper's figures, not a calibration"
    )
    return (
        "Classes from the HorizonServe paper (§6.1). Profiles (r̂ inputs) derived by "
        f"horizonserve.runtime.sim.profiles from the calibration artifact "
        f"runtime/data/calibration/{artifact_name} ({what}; key "
        f"{artifact.gpu.name}|{artifact.gpu.driver}|{artifact.gpu.sm_count} SMs); solo_p95_s "
        f"measured by the simulator on that artifact (each class alone, FCFS backend, "
        f"{SOLO_REQUESTS} requests, seed 0) — simulated, not GPU measurements (the artifact's "
        "own solo_p95_s holds what the GPU measured)."
    )


def write_pipeline(name: str, path: str, artifact_name: str = DEFAULT_ARTIFACT) -> None:
    """Refresh the profiles, simulated solo p95 defaults and source of a shipped pipeline file."""
    from horizonserve.runtime.config import PipelineSpec
    from horizonserve.runtime.sim.setup import SimSetup
    from horizonserve.runtime.sim.solo import measure_solo_p95

    with open(path) as f:
        data = json.load(f)
    artifact = load_packaged(artifact_name)
    cal = artifact.pipeline(name)
    wl = load_workload(name)
    for c in data["slo"]["classes"]:
        rc = RequestClass.model_validate(c)
        c["profile"] = derive_profile(cal, wl, wl.get(rc.name), rc).model_dump()
    spec = PipelineSpec.model_validate(data)
    setup = SimSetup(spec=spec, cal=cal, slo=spec.slo)
    p95 = measure_solo_p95(setup, wl, n=SOLO_REQUESTS, seed=0)
    for c in data["slo"]["classes"]:
        c["solo_p95_s"] = round(p95[c["name"]], 4)
    data["source"] = pipeline_source(artifact_name, artifact)
    with open(path, "w") as f:
        json.dump(data, f, indent=2, ensure_ascii=False)
        f.write("\n")


def main(argv: list[str]) -> None:
    """`python -m horizonserve.runtime.sim.profiles [pipeline=file ...]`.

    Without arguments: every shipped pipeline file, from the package's default artifact.
    """
    if not argv:
        from importlib import resources

        from horizonserve.runtime.config import PIPELINES

        root = resources.files("horizonserve.runtime").joinpath("data/pipelines")
        argv = [f"{p}={root.joinpath(p + '.json')}" for p in PIPELINES]
    for arg in argv:
        pipeline, _, file = arg.partition("=")
        write_pipeline(pipeline, file)
        print(f"wrote {file} (from {DEFAULT_ARTIFACT})")


if __name__ == "__main__":  # pragma: no cover - maintenance entry point
    main(sys.argv[1:])
