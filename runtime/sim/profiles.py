"""Per-class offline profiles (the profiler's r̂ inputs) derived from a calibration artifact.

The profiler estimates a request's remaining time from a coarse per-class profile (paper §4.2).
Here that profile is computed from the same artifact the simulator runs on, at the shared
stage's aggressive SM cap and with the downstream stage alone — the solo view a calibration run
would record. `python -m horizonserve.runtime.sim.refresh` rewrites the shipped pipeline files
with these profiles.
"""

from __future__ import annotations

import numpy as np

from horizonserve.runtime.artifact import PipelineCalibration
from horizonserve.runtime.config import Metric, Path, RequestClass, StageProfile
from horizonserve.runtime.workload import ClassWorkload, WorkloadSpec

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
    # A prompt's first token: one iteration (a decode step's time) with the prefill riding in
    # it, or the prefill call's own fixed cost when the engine runs it apart from the decode.
    base = sh.prefill_call_s if sh.prefill_then_decode else step
    return StageProfile(
        prefill_base_s=round(base, 6),
        prefill_s_per_token=round(per_token, 9),
        prefill_s_per_audio_second=round(sh.tokens_per_audio_second * per_token, 7),
        prefill_s_per_image=round(sh.tokens_per_image * per_token, 7),
        decode_tokens_to_first_response=decode_first,
        tpot_s=round(tpot, 6),
        downstream_steps_to_first_response=down_steps,
        downstream_step_s=round(down_step_s, 6),
    )
