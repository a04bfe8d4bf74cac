"""Config validation: bad values fail with a message naming the field."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from horizonserve.runtime.config import (
    PIPELINES,
    ControlParams,
    Metric,
    Path,
    Priority,
    RequestClass,
    SloTable,
    SmLadder,
    default_ladder,
)
from tests.runtime.builders import make_slo


def _error_text(exc: pytest.ExceptionInfo[ValidationError]) -> str:
    return str(exc.value)


def test_control_defaults_follow_the_paper() -> None:
    c = ControlParams()
    assert (c.rotation_m, c.rotation_n_min, c.rotation_n_max) == (2, 2, 8)
    assert c.ewma_gamma == 0.4
    assert c.hysteresis_steps == 1


def test_slo_target_is_solo_p95_times_multiplier() -> None:
    slo = make_slo(multiplier=5.0)
    assert slo.target_s("text") == pytest.approx(0.5)
    assert slo.target_s("image-out") == pytest.approx(20.0)


def test_per_class_multiplier_overrides_global() -> None:
    base = make_slo()
    classes = [
        c.model_copy(update={"slo_multiplier": 2.0}) if c.name == "text" else c
        for c in base.classes
    ]
    slo = SloTable(multiplier=5.0, classes=classes)
    assert slo.target_s("text") == pytest.approx(0.2)
    assert slo.target_s("audio-out") == pytest.approx(5.0)


@pytest.mark.parametrize(
    ("kwargs", "field", "hint"),
    [
        ({"levels": [], "aggressive": 132, "total": 132}, "levels", "at least 1"),
        ({"levels": [64, 48], "aggressive": 132, "total": 132}, "levels", "strictly increasing"),
        ({"levels": [48, 48], "aggressive": 132, "total": 132}, "levels", "strictly increasing"),
        ({"levels": [48, 96], "aggressive": 80, "total": 132}, "levels", "exceeds aggressive"),
        ({"levels": [48, 64], "aggressive": 140, "total": 132}, "aggressive", "exceeds total"),
        ({"levels": [0, 64], "aggressive": 132, "total": 132}, "levels", "positive"),
    ],
)
def test_bad_ladder_names_the_field(kwargs: dict[str, object], field: str, hint: str) -> None:
    with pytest.raises(ValidationError) as exc:
        SmLadder(**kwargs)  # type: ignore[arg-type]
    text = _error_text(exc)
    assert field in text
    assert hint in text


def test_multiplier_must_be_positive() -> None:
    with pytest.raises(ValidationError) as exc:
        SloTable(multiplier=0, classes=make_slo().classes)
    assert "multiplier" in _error_text(exc)


def test_duplicate_and_unknown_classes_are_refused() -> None:
    classes = make_slo().classes
    with pytest.raises(ValidationError, match="duplicate class name 'text'"):
        SloTable(classes=[*classes, classes[0]])
    with pytest.raises(ValidationError, match=r"default_class\[10\]: unknown class 'speech'"):
        SloTable(classes=classes, default_class={Priority.AUDIO: "speech"})
    with pytest.raises(KeyError, match="unknown request class 'video'"):
        make_slo().get("video")


def test_unknown_priority_code_is_refused() -> None:
    with pytest.raises(ValueError, match="priority 5: unknown code"):
        make_slo().class_for_priority(5)


def test_metric_must_match_path() -> None:
    with pytest.raises(ValidationError, match="short-path class is judged by metric 'ttft'"):
        RequestClass(
            name="x", priority=Priority.TEXT, path=Path.SHORT, metric=Metric.E2E, solo_p95_s=1
        )


def test_rotation_range_must_be_ordered() -> None:
    with pytest.raises(ValidationError, match="rotation_n_min 9 exceeds rotation_n_max 8"):
        ControlParams(rotation_n_min=9)


def test_unknown_field_is_refused() -> None:
    with pytest.raises(ValidationError, match="u_gaurd"):
        ControlParams(u_gaurd=1.0)  # type: ignore[call-arg]


def test_default_ladder_is_valid_for_common_gpus() -> None:
    for sms in (132, 142, 188, 84):
        ladder = default_ladder(sms)
        assert ladder.s_cap < ladder.total
        assert ladder.aggressive == sms


def test_pipeline_names_are_stable() -> None:
    assert PIPELINES == ("qwen2_5_omni", "mimo_audio", "bagel")


def test_ladder_reserve_is_at_most_s_min_and_defaults_to_it() -> None:
    from horizonserve.runtime.config import SmLadder

    ladder = SmLadder(levels=[32, 48, 64, 80], aggressive=132, total=132)
    assert ladder.s_reserve == 32
    assert SmLadder(levels=[32, 80], aggressive=132, total=132, reserve=16).s_reserve == 16
    with pytest.raises(ValueError, match="reserve: 40 SMs exceeds S_min 32"):
        SmLadder(levels=[32, 80], aggressive=132, total=132, reserve=40)
