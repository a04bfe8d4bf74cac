"""The one split rule (`runtime.gpu.split`): which SMs each role runs on for a published
decision, the contexts each role pre-allocates, and the one fallback (no GPU needed)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from horizonserve.runtime.config import SmLadder
from horizonserve.runtime.gpu.split import Role, StageLadder, level_name
from horizonserve.runtime.spatial import NO_DECISION, Level

LADDER = SmLadder(levels=[32, 48, 64, 80], aggressive=120, total=132)
GUARANTEED = 132 - 80  # S_tot − S_cap


def test_contexts_cover_every_level_of_each_role() -> None:
    down = StageLadder.open(Role.DOWNSTREAM, LADDER)
    assert down.contexts == (12, 52, 68, 84, 100)
    assert StageLadder.open(Role.SHARED, LADDER).contexts == (32, 48, 64, 80, 120)
    assert StageLadder.open("downstream", LADDER, capped=False).contexts == ()


@pytest.mark.parametrize(
    ("level", "published", "expected"),
    [
        (2, 68, 68),  # a ladder level: the complement
        (0, 20, 12),  # a calibration probe above S_cap asks less: snapped down
        (Level.LIFTED, 12, GUARANTEED),  # backlog with S_aggr 120 < S_tot: the guarantee
        (Level.AGGRESSIVE, 0, GUARANTEED),  # just became active: the cap follows next step
        (Level.UNCAPPED, 132, None),  # baselines: the whole GPU
        (Level.OPEN, 132, None),  # the cap does not pay: both on the whole GPU under MPS
        (NO_DECISION, 0, None),  # the shared stage is idle
    ],
)
def test_downstream_sms_for_each_level(level: int, published: int, expected: int | None) -> None:
    down = StageLadder.open(Role.DOWNSTREAM, LADDER)
    assert down.sms_for(level, 132 - published, published) == expected


def test_shared_sms_for_each_level() -> None:
    shared = StageLadder.open(Role.SHARED, LADDER)
    assert shared.sms_for(1, 48, 84) == 48
    assert shared.sms_for(Level.AGGRESSIVE, 120, 0) == 120
    assert shared.sms_for(Level.OPEN, 132, 132) is None
    assert shared.sms_for(Level.UNCAPPED, 132, 132) is None
    assert shared.sms_for(NO_DECISION, 0, 0) == 120  # S_aggr before the first decision
    assert level_name(2) == "ladder[2]" and level_name(Level.OPEN) == "open"


@given(st.integers(1, 200))
def test_fallback_snaps_down_to_a_context_and_never_takes_more(sms: int) -> None:
    for role in Role:
        ladder = StageLadder.open(role, LADDER)
        got = ladder.snap(sms)
        if sms >= LADDER.total:
            assert got is None
        else:
            assert got in ladder.contexts
            assert got <= sms or got == ladder.contexts[0]


def test_the_reservation_has_its_own_contexts_and_runs_on_them() -> None:
    reserved = LADDER.model_copy(update={"reserve": 16})
    shared = StageLadder.open(Role.SHARED, reserved)
    down = StageLadder.open(Role.DOWNSTREAM, reserved)
    assert 16 in shared.contexts and 116 in down.contexts
    assert shared.sms_for(Level.RESERVED, 16, 116) == 16
    assert down.sms_for(Level.RESERVED, 16, 116) == 116  # the headroom, not the guarantee
    assert level_name(Level.RESERVED) == "reserved"
    # Without a calibrated reserve the reservation is S_min, whose contexts exist anyway.
    assert StageLadder.open(Role.SHARED, LADDER).contexts == (32, 48, 64, 80, 120)
