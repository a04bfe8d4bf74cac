"""Campaign plans are committed gzipped; every reader takes X.json or X.json.gz alike."""

from __future__ import annotations

import gzip
import hashlib
import json
from pathlib import Path

import pytest

from horizonserve.runtime.calibrate.records import load_plan, plan_bytes

REPO = Path(__file__).resolve().parents[3]
EVAL = REPO / "bench/results/h200-eval"


def test_a_gzipped_plan_reads_as_its_json_bytes(tmp_path: Path) -> None:
    text = json.dumps({"schema": 1, "points": {}}).encode()
    (tmp_path / "a.json").write_bytes(text)
    (tmp_path / "b.json.gz").write_bytes(gzip.compress(text))
    assert plan_bytes(tmp_path / "a.json") == text
    assert plan_bytes(tmp_path / "b.json") == text  # the .gz beside an absent X.json
    assert plan_bytes(tmp_path / "b.json.gz") == text
    assert load_plan(tmp_path / "b.json") == {"schema": 1, "points": {}}


def test_a_missing_plan_names_both_files(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match=r"c\.json \(nor c\.json\.gz\)"):
        plan_bytes(tmp_path / "c.json")


def test_committed_plans_keep_the_digest_their_sessions_recorded() -> None:
    """A session's `plan_sha256` is the digest of the JSON it ran; gzipping keeps it."""
    plan = EVAL / "eval-v5/qwen-places-plan.json"
    digest = hashlib.sha256(plan_bytes(plan)).hexdigest()
    summary = json.loads((EVAL / "eval-v5/q16/summary.json").read_text())
    assert summary["plan_sha256"] == digest
