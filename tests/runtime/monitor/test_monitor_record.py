"""Control record: layout, single-writer groups, seqlock consistency across processes."""

from __future__ import annotations

import math
import os
import struct
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from horizonserve.runtime.monitor import (
    ControlRecord,
    RecordBusyError,
    RecordFormatError,
    shm_dir,
    shm_path,
)
from horizonserve.runtime.monitor import record as record_mod
from horizonserve.runtime.monitor import shm as shm_mod
from horizonserve.runtime.spatial import NO_DECISION


@pytest.fixture
def rec(tmp_path: Path):
    r = ControlRecord.create(tmp_path / "control", n_slots=3)
    yield r
    r.close()


def test_fresh_record_has_no_decision(rec: ControlRecord) -> None:
    d = rec.read_decision()
    assert d.seq == 0 and d.steps == 0 and d.heartbeat_ns == 0
    assert d.level_index == NO_DECISION
    assert math.isnan(d.pressure_smoothed) and math.isnan(d.pressure_raw)
    assert rec.downstream_active_total() == 0
    assert rec.is_stale(now_ns=10**12, max_age_ns=10**15)  # never written = stale


def test_publish_then_read_back(rec: ControlRecord) -> None:
    w = rec.decision_writer()
    w.publish(64, 68, 1, 0.25, math.nan, now_ns=1234)
    d = rec.read_decision()
    assert (d.shared_sms, d.downstream_sms, d.level_index) == (64, 68, 1)
    assert d.pressure_smoothed == 0.25 and math.isnan(d.pressure_raw)
    assert d.heartbeat_ns == 1234 and d.writer_pid == os.getpid()
    assert d.seq == 2 and d.steps == 1
    w.publish(80, 52, 2, 0.5, 0.75, now_ns=2000)
    d = rec.read_decision()
    assert (d.shared_sms, d.level_index, d.seq, d.steps) == (80, 2, 4, 2)


def test_downstream_slots_are_independent(rec: ControlRecord) -> None:
    talker = rec.downstream_writer(0, kind=1)
    dit = rec.downstream_writer(2, kind=3)
    talker.set_active(2, now_ns=100)
    dit.set_active(5, now_ns=200)
    assert rec.read_downstream(0).active == 2
    assert rec.read_downstream(1).active == 0
    s2 = rec.read_downstream(2)
    assert (s2.active, s2.kind, s2.heartbeat_ns, s2.updates) == (5, 3, 200, 1)
    assert rec.downstream_active_total() == 7
    # The decision group is untouched by slot writers.
    assert rec.read_decision().seq == 0
    with pytest.raises(IndexError):
        rec.downstream_writer(3)
    with pytest.raises(IndexError):
        rec.read_downstream(-1)


def test_second_handle_sees_writes(tmp_path: Path) -> None:
    path = tmp_path / "c"
    with ControlRecord.create(path, n_slots=2) as a, ControlRecord.open(path) as b:
        assert b.n_slots == 2
        a.decision_writer().publish(48, 84, 0, 0.1, 0.2, now_ns=5)
        b.downstream_writer(1).set_active(3, now_ns=6)
        assert b.read_decision().shared_sms == 48
        assert a.read_downstream(1).active == 3


def test_stale_detection(rec: ControlRecord) -> None:
    max_age = 50_000_000
    rec.decision_writer().publish(64, 68, 1, 0.0, 0.0, now_ns=1_000_000_000)
    assert not rec.is_stale(1_000_000_000 + max_age, max_age)
    assert rec.is_stale(1_000_000_000 + max_age + 1, max_age)

    rec.downstream_writer(0).set_active(4, now_ns=1_000)
    rec.downstream_writer(1).set_active(1, now_ns=900_000)
    assert not rec.slot_is_stale(1, 1_000_000, 200_000)
    assert rec.slot_is_stale(0, 1_000_000, 200_000)
    assert rec.slot_is_stale(2, 1_000_000, 200_000)  # never written
    assert rec.downstream_active_total() == 5
    # Slot 0's writer stopped beating: its 4 requests no longer count.
    assert rec.downstream_active_total(now_ns=1_000_000, max_age_ns=200_000) == 1


def test_writer_resumes_after_dead_writer(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(shm_mod, "STUCK_TIMEOUT_S", 0.4)
    with ControlRecord.create(tmp_path / "c") as rec:
        rec.decision_writer().publish(64, 68, 1, 0.0, 0.0, now_ns=1)
        # Simulate a writer that died between "seq odd" and "seq even".
        struct.pack_into("@Q", rec._buf, record_mod.GROUP_BYTES, 3)
        with pytest.raises(RecordBusyError):
            rec.read_decision(strict=True)
        # The default read never raises: a stuck group reads as stale, and fast the next time.
        assert rec.read_decision() == record_mod.STALE_DECISION
        t0 = time.monotonic()
        assert rec.read_decision() == record_mod.STALE_DECISION
        assert time.monotonic() - t0 < 0.2  # no second spin of STUCK_TIMEOUT_S
        assert rec.is_stale(2, 10**12)
        rec.decision_writer().publish(80, 52, 2, 0.0, 0.0, now_ns=2)
        d = rec.read_decision()
        assert d.seq % 2 == 0 and d.shared_sms == 80 and d.steps == 2


def test_open_rejects_bad_files(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        ControlRecord.open(tmp_path / "missing")
    (tmp_path / "short").write_bytes(b"x" * 10)
    with pytest.raises(RecordFormatError):
        ControlRecord.open(tmp_path / "short")
    (tmp_path / "zeros").write_bytes(bytes(4096))
    with pytest.raises(RecordFormatError, match="magic"):
        ControlRecord.open(tmp_path / "zeros")
    with ControlRecord.create(tmp_path / "v") as r:
        struct.pack_into("@I", r._buf, 4, record_mod.VERSION + 1)
    with pytest.raises(RecordFormatError, match="version"):
        ControlRecord.open(tmp_path / "v")
    with pytest.raises(ValueError):
        ControlRecord.create(tmp_path / "n", n_slots=0)


def test_default_path_honours_env_and_falls_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(shm_mod.SHM_DIR_ENV, str(tmp_path))
    assert shm_dir() == tmp_path
    with ControlRecord.create() as r:
        assert r.path == tmp_path / record_mod.DEFAULT_RECORD_NAME
        r.unlink()
    monkeypatch.delenv(shm_mod.SHM_DIR_ENV)
    monkeypatch.setattr(shm_mod, "_DEV_SHM", tmp_path / "no-dev-shm")
    import tempfile

    assert shm_dir() == Path(tempfile.gettempdir())
    with pytest.raises(ValueError):
        shm_path("a/b")


# -- torn reads across processes -------------------------------------------------------------

_WRITER = textwrap.dedent(
    """
    import sys
    from horizonserve.runtime.monitor import ControlRecord
    path, group, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
    rec = ControlRecord.open(path)
    if group == "decision":
        w = rec.decision_writer()
        for i in range(1, n + 1):
            # Every field is a function of i: a torn copy mixes two i's and fails the check.
            w.publish(i, 3 * i, i % 7, float(i), 2.0 * i, now_ns=i)
    else:
        w = rec.downstream_writer(int(group))
        for i in range(1, n + 1):
            w.set_active(i, now_ns=i)
    rec.close()
    """
)


def _check_decision(d: record_mod.PublishedDecision) -> None:
    i = d.heartbeat_ns
    assert d.seq == 2 * i and d.steps == i
    if i == 0:  # the writer has not published yet: the fresh record
        assert d.level_index == NO_DECISION and math.isnan(d.pressure_raw)
        return
    assert (d.shared_sms, d.downstream_sms, d.level_index) == (i, 3 * i, i % 7)
    assert d.pressure_smoothed == float(i) and d.pressure_raw == 2.0 * i


def test_no_torn_reads_across_processes(tmp_path: Path) -> None:
    n = 200_000
    path = tmp_path / "control"
    rec = ControlRecord.create(path, n_slots=2)
    # cwd=tmp_path: the repo root's `operator/` folder would shadow the stdlib module.
    writers = [
        subprocess.Popen([sys.executable, "-c", _WRITER, str(path), g, str(n)], cwd=tmp_path)
        for g in ("decision", "0")
    ]
    reads = 0
    last_i = last_a = 0
    try:
        while any(p.poll() is None for p in writers) or reads == 0:
            d = rec.read_decision()
            _check_decision(d)
            assert d.heartbeat_ns >= last_i  # a single writer's seq never goes back
            last_i = d.heartbeat_ns
            a = rec.read_downstream(0)
            assert a.active == a.heartbeat_ns == a.updates and a.seq == 2 * a.active
            assert a.active >= last_a
            last_a = a.active
            reads += 1
    finally:
        for p in writers:
            p.wait(timeout=60)
    assert [p.returncode for p in writers] == [0, 0]
    assert reads > 100
    _check_decision(rec.read_decision())
    assert rec.read_decision().heartbeat_ns == n and rec.read_downstream(0).active == n
    print(f"reads={reads} retries={rec.read_retries}")
    rec.close()
