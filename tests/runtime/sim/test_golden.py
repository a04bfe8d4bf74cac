"""Behaviour does not change by accident: every simulated system and every control mechanism
switch gives the per-class figures recorded in golden.json (see golden.py).

A figure that is meant to change (a mechanism removed, a rule changed) is regenerated with
`python -m tests.runtime.sim.golden --write` in its own commit, which names the change.
"""

from __future__ import annotations

import json

import pytest

from tests.runtime.sim.golden import GOLDEN_FILE, POINTS, VARIANTS, run_point

GOLDEN = json.loads(GOLDEN_FILE.read_text())


def test_golden_covers_every_system_and_variant() -> None:
    from horizonserve.runtime.sim.systems import SYSTEMS

    names = {*SYSTEMS, *(f"horizon+{v}" for v in VARIANTS)}
    for pipeline in POINTS:
        assert set(GOLDEN[pipeline]) == names, pipeline


@pytest.mark.parametrize("pipeline", list(POINTS))
def test_systems_and_variants_match_golden(pipeline: str) -> None:
    from horizonserve.runtime.sim.systems import SYSTEMS

    runs = {name: (name, None) for name in SYSTEMS}
    runs |= {f"horizon+{v}": ("horizon", c) for v, c in VARIANTS.items()}
    diffs = []
    for name, (system, control) in runs.items():
        got = run_point(pipeline, system, control)
        if got != GOLDEN[pipeline][name]:
            diffs.append(f"{name}: {got} != {GOLDEN[pipeline][name]}")
    assert not diffs, f"{pipeline}:\n" + "\n".join(diffs)
