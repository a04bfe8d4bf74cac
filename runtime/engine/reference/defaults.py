"""The reference pipeline's request classes until a calibration artifact provides measured ones.

Three classes, one per output modality (API priority codes 0/10/20). Profile numbers are
estimates for the `full` preset on one H200 (thinker TPOT ≈ 6 ms, 7B prefill ≈ 25 µs/token,
talker step ≈ 8 ms per code, DiT step ≈ 45 ms) and for `tiny` on a CPU; `horizonserve
calibrate` measures the real solo p95 values and replaces them (pass `--config`).
"""

from __future__ import annotations

from horizonserve.runtime.config import (
    ControlParams,
    Metric,
    Path,
    PolicyName,
    Priority,
    RequestClass,
    ServingConfig,
    SloTable,
    SmLadder,
    StageProfile,
    default_ladder,
)

# preset -> class -> (solo p95 s, StageProfile)
_PROFILES: dict[str, dict[str, tuple[float, StageProfile]]] = {
    "full": {
        "text": (
            0.10,
            StageProfile(prefill_base_s=0.015, prefill_s_per_token=2.5e-5, tpot_s=0.006),
        ),
        "speech": (
            0.9,
            StageProfile(
                prefill_base_s=0.015,
                prefill_s_per_token=2.5e-5,
                prefill_s_per_audio_second=6e-4,
                decode_tokens_to_first_response=48,
                tpot_s=0.006,
                downstream_steps_to_first_response=25,
                downstream_step_s=0.008,
            ),
        ),
        "image": (
            1.6,
            StageProfile(
                prefill_base_s=0.015,
                prefill_s_per_token=2.5e-5,
                prefill_s_per_image=6e-3,
                decode_tokens_to_first_response=16,
                tpot_s=0.006,
                downstream_steps_to_first_response=20,
                downstream_step_s=0.045,
            ),
        ),
    },
    "tiny": {
        "text": (0.05, StageProfile(prefill_base_s=0.005, prefill_s_per_token=1e-5, tpot_s=0.003)),
        "speech": (
            0.3,
            StageProfile(
                prefill_base_s=0.005,
                prefill_s_per_token=1e-5,
                decode_tokens_to_first_response=8,
                tpot_s=0.003,
                downstream_steps_to_first_response=4,
                downstream_step_s=0.004,
            ),
        ),
        "image": (
            0.3,
            StageProfile(
                prefill_base_s=0.005,
                prefill_s_per_token=1e-5,
                decode_tokens_to_first_response=4,
                tpot_s=0.003,
                downstream_steps_to_first_response=4,
                downstream_step_s=0.01,
            ),
        ),
    },
}

_CLASS_SHAPE = {
    "text": (Priority.TEXT, Path.SHORT, Metric.TTFT),
    "speech": (Priority.AUDIO, Path.LONG, Metric.TTFO),
    "image": (Priority.IMAGE, Path.LONG, Metric.E2E),
}


def reference_slo(preset: str, multiplier: float = 5.0) -> SloTable:
    profiles = _PROFILES.get(preset)
    if profiles is None:
        raise ValueError(f"no default classes for preset {preset!r}; pass --config")
    classes = []
    for name, (p95, profile) in profiles.items():
        prio, path, metric = _CLASS_SHAPE[name]
        classes.append(
            RequestClass(
                name=name,
                priority=prio,
                path=path,
                metric=metric,
                solo_p95_s=p95,
                profile=profile,
            )
        )
    return SloTable(multiplier=multiplier, classes=classes)


def reference_config(
    preset: str,
    *,
    policy: PolicyName | str = PolicyName.HORIZON,
    total_sms: int = 132,
    ladder: SmLadder | None = None,
    control: ControlParams | None = None,
) -> ServingConfig:
    """A ServingConfig for the reference pipeline (default ladder from the SM count)."""
    return ServingConfig(
        model=f"reference/{preset}",
        pipeline="reference",
        policy=PolicyName(policy),
        slo=reference_slo(preset),
        ladder=ladder or default_ladder(total_sms),
        control=control or ControlParams(),
    )
