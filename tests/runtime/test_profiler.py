"""Profiler: class from priority, deadline stamping, remaining time, slack and protection."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from horizonserve.runtime.profiler import InputFeatures, RequestProfiler
from tests.runtime.builders import make_slo


@pytest.fixture
def profiler() -> RequestProfiler:
    return RequestProfiler(make_slo(), u_guard=1.5)


def test_class_from_priority_and_deadline(profiler: RequestProfiler) -> None:
    sig = profiler.annotate("r1", arrival=10.0, priority=10)
    assert sig.cls.name == "audio-out"
    assert sig.long_path
    assert sig.deadline == pytest.approx(10.0 + 5.0)


def test_remaining_time_uses_profile_and_progress(profiler: RequestProfiler) -> None:
    sig = profiler.annotate(
        "r1", 0.0, class_name="audio-out", features=InputFeatures(input_tokens=1000)
    )
    p = sig.cls.profile
    prefill = p.prefill_base_s + 1000 * p.prefill_s_per_token
    full = prefill + 20 * p.tpot_s + 10 * 0.02
    assert sig.remaining_s() == pytest.approx(full)
    sig.record_progress(prefilled=True, decoded=20)
    assert sig.remaining_s() == pytest.approx(10 * 0.02)
    sig.record_progress(downstream_steps=10)
    assert sig.remaining_s() == pytest.approx(1e-4)  # floor keeps u finite


@given(
    now=st.floats(min_value=0.0, max_value=30.0),
    tokens=st.integers(min_value=0, max_value=20_000),
    audio=st.floats(min_value=0, max_value=60),
    decoded=st.integers(min_value=0, max_value=40),
)
def test_protected_iff_slack_below_guard(
    now: float, tokens: int, audio: float, decoded: int
) -> None:
    profiler = RequestProfiler(make_slo(), u_guard=1.5)
    sig = profiler.annotate(
        "r", 0.0, class_name="audio-out", features=InputFeatures(tokens, audio, 0)
    )
    sig.record_progress(prefilled=decoded > 0, decoded=decoded)
    u = sig.slack_ratio(now)
    # The closed form protect_at must agree with the definition u < u_guard (away from the edge).
    if abs(u - 1.5) > 1e-9:
        assert sig.is_protected(now) == (u < 1.5)


def test_protection_grows_as_deadline_nears(profiler: RequestProfiler) -> None:
    sig = profiler.annotate("r", 0.0, class_name="text")
    assert not sig.is_protected(0.0)
    assert sig.is_protected(sig.deadline - 0.5 * sig.remaining_s())
