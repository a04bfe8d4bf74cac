"""Runs replay at their own commit: `sim run --json` records the commit, the command line and
the fully resolved ServingConfig; `sim replay` runs that command with that commit's code, so a
controller that has since changed (or a knob that has left) is replayed as it ran."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from horizonserve.runtime.bench.provenance import REPO, run_at
from horizonserve.runtime.cli import main

# A commit whose controller had boolean knobs (before the policy axes).
BEFORE_AXES = "d311b05"
ARGV = ["sim", "run", "--pipeline", "bagel", "--rate", "3", "--duration", "15", "--slo",
        "defaults"]  # fmt: skip


def _has(commit: str) -> bool:
    probe = ["git", "-C", str(REPO), "cat-file", "-e", f"{commit}^{{commit}}"]
    return subprocess.run(probe, capture_output=True).returncode == 0


def test_a_simulation_records_its_commit_command_and_resolved_config(tmp_path: Path) -> None:
    out = tmp_path / "run.json"
    assert main([*ARGV, "--system", "horizon-no-downstream", "--json", str(out)]) == 0
    prov = json.loads(out.read_text())["provenance"]
    assert prov["argv"][:2] == ["sim", "run"] and "horizon-no-downstream" in prov["argv"]
    assert prov["commit"] is None or len(prov["commit"]) == 40
    control = prov["serving_config"]["control"]
    assert control["downstream"] == "fifo" and control["downstream_urgency"] == "slack"


@pytest.mark.skipif(not _has(BEFORE_AXES), reason=f"needs commit {BEFORE_AXES} (a full clone)")
def test_a_run_with_a_knob_that_left_replays_at_its_commit(tmp_path: Path, capsys) -> None:
    """Today's code refuses the old knob; the replay runs it with the code that had it and
    gets the attainment that run recorded."""
    old = [*ARGV, "--control", "saturated_downstream_first=false"]
    with pytest.raises(SystemExit):
        main(old)  # refused here: the knob is `downstream_urgency` now
    capsys.readouterr()
    ran = tmp_path / "ran.json"
    proc = run_at(BEFORE_AXES, [*old, "--json", str(ran)])
    assert proc.returncode == 0, proc.stderr
    data = json.loads(ran.read_text())
    data["provenance"] = {"commit": BEFORE_AXES, "dirty": False, "argv": old}
    record = tmp_path / "record.json"
    record.write_text(json.dumps(data))
    assert main(["sim", "replay", str(record)]) == 0
    assert "same per-class attainment" in capsys.readouterr().out
    # A record whose figures differ from what its commit gives is reported, not hidden.
    first = next(iter(data["summary"]["classes"].values()))
    first["attainment"] = -1.0
    record.write_text(json.dumps(data))
    assert main(["sim", "replay", str(record)]) == 1
