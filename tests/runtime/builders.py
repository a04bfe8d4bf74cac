"""Shared builders for control-core tests."""

from __future__ import annotations

from horizonserve.runtime.config import (
    ControlParams,
    Metric,
    Path,
    Priority,
    RequestClass,
    ServingConfig,
    SloTable,
    SmLadder,
    StageProfile,
)


def make_slo(multiplier: float = 5.0) -> SloTable:
    return SloTable(
        multiplier=multiplier,
        classes=[
            RequestClass(
                name="text",
                priority=Priority.TEXT,
                path=Path.SHORT,
                metric=Metric.TTFT,
                solo_p95_s=0.1,
                profile=StageProfile(prefill_base_s=0.02, decode_tokens_to_first_response=1),
            ),
            RequestClass(
                name="audio-out",
                priority=Priority.AUDIO,
                path=Path.LONG,
                metric=Metric.TTFO,
                solo_p95_s=1.0,
                profile=StageProfile(
                    prefill_base_s=0.03,
                    decode_tokens_to_first_response=20,
                    downstream_steps_to_first_response=10,
                    downstream_step_s=0.02,
                ),
            ),
            RequestClass(
                name="image-out",
                priority=Priority.IMAGE,
                path=Path.LONG,
                metric=Metric.E2E,
                solo_p95_s=4.0,
                profile=StageProfile(
                    prefill_base_s=0.03,
                    decode_tokens_to_first_response=1,
                    downstream_steps_to_first_response=50,
                    downstream_step_s=0.05,
                ),
            ),
        ],
    )


def make_config(**control: object) -> ServingConfig:
    return ServingConfig(
        model="test/omni",
        pipeline="qwen2_5_omni",
        slo=make_slo(),
        ladder=SmLadder(levels=[32, 48, 64, 80], aggressive=132, total=132),
        control=ControlParams(**control),  # type: ignore[arg-type]
    )
