"""A replay simulates each measured item under the controller its session ran: a session takes
the defaults of knobs newer than its plan, and records them; the plan alone would replay those
items with the knobs off."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from horizonserve.runtime.artifact import load_artifact
from horizonserve.runtime.calibrate.fit import replay_of
from horizonserve.runtime.calibrate.records import read_campaign
from horizonserve.runtime.config import DownstreamUrgency

ROOT = Path(__file__).resolve().parents[3]
RUN = ROOT / "bench/results/h200-eval/qwen-ship-v2"  # s00 ran knobs newer than its plan


def test_items_carry_the_knobs_their_session_ran() -> None:
    c = read_campaign(RUN)
    assert "saturated_downstream_first" not in c.control  # the plan predates the knob
    ran = c.items["r10/horizon"].control
    assert ran is not None and ran["saturated_downstream_first"] is True
    art = load_artifact(ROOT / "runtime/data/calibration/h200-fitted.json")
    replay = replay_of(c, art)
    cal = art.pipeline(c.pipeline)
    saturated = DownstreamUrgency.SATURATED
    assert replay.setup(cal, "r10/horizon").control.downstream_urgency is saturated
    assert replay.setup(cal).control.downstream_urgency is not saturated  # the plan's


def test_a_replay_matches_the_simulation_of_the_session_as_run() -> None:
    """Two paths to one prediction: the fit's replay of the item, and `campaign.py simulate
    --as-run` of its session (the report's sim rows, committed)."""
    c = read_campaign(RUN)
    art = load_artifact(ROOT / "runtime/data/calibration/h200-fitted.json")
    committed = json.loads((RUN / "sim_fitted.json").read_text())
    assert committed["control"]["saturated_downstream_first"] is True
    want = committed["points"]["r10"]["horizon"]["attainment_seeds"][0]
    got = replay_of(c, art).attainment(art.pipeline(c.pipeline), ["r10/horizon"])
    assert got["r10/horizon"] == pytest.approx(want)
