"""Which SM level a downstream stage takes for a published split (no GPU needed)."""

from __future__ import annotations

import pytest

pytest.importorskip("torch")

from horizonserve.runtime.config import SmLadder
from horizonserve.runtime.engine.reference.defaults import reference_config
from horizonserve.runtime.engine.reference.stages.downstream import (
    complementary_levels,
    granted_sms,
    pick_level,
)
from horizonserve.runtime.spatial import AGGRESSIVE, LIFTED

GUARANTEED = 132 - 80  # S_tot − S_cap


@pytest.mark.parametrize(
    ("level", "published", "expected"),
    [
        (2, 68, 68),  # a ladder level: the complement
        (0, 20, 20),  # a calibration probe above S_cap: the small complement it asked for
        (LIFTED, 12, GUARANTEED),  # backlog with S_aggr 120 < S_tot: never below the guarantee
        (LIFTED, 0, GUARANTEED),
        (AGGRESSIVE, 0, GUARANTEED),  # a stage just became active, the cap follows next step
    ],
)
def test_granted_sms(level: int, published: int, expected: int) -> None:
    assert granted_sms(level, published, GUARANTEED) == expected


def test_levels_cover_every_shared_level_and_snap_down() -> None:
    config = reference_config("tiny", policy="horizon")
    ladder = SmLadder(levels=[32, 48, 64, 80], aggressive=120, total=132)
    config = config.model_copy(update={"ladder": ladder})
    levels = complementary_levels(config, capped=True)
    assert levels == [12, 52, 68, 84, 100]
    assert complementary_levels(config, capped=False) == []
    assert pick_level(levels, 60) == 52 and pick_level(levels, 5) == 12
