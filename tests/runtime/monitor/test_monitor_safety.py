"""Control record and request table against a hostile or failing host: symlinks, stale files
of dead processes, corrupt headers, stuck writers, future heartbeats, orphaned writers."""

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

from horizonserve.runtime.engine.reference.supervisor import stage_fault
from horizonserve.runtime.monitor import (
    ControlRecord,
    RecordFormatError,
    RequestTable,
    TableBusyError,
    remove_stale,
)
from horizonserve.runtime.monitor import record as record_mod
from horizonserve.runtime.monitor import request_table as table_mod
from horizonserve.runtime.monitor import shm as shm_mod


def _dead_pid() -> int:
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


def test_create_never_follows_a_symlink_or_clobbers_a_file(tmp_path: Path) -> None:
    victim = tmp_path / "victim"
    victim.write_bytes(b"precious")
    link = tmp_path / "horizonserve-control-x"
    link.symlink_to(victim)
    with pytest.raises(FileExistsError):
        ControlRecord.create(link)
    assert victim.read_bytes() == b"precious"
    with pytest.raises(RecordFormatError, match="symlink"):
        ControlRecord.open(link)
    live = ControlRecord.create(tmp_path / "live")
    try:
        with pytest.raises(FileExistsError):  # its creator (this process) is alive
            ControlRecord.create(tmp_path / "live")
    finally:
        live.close()
    assert (tmp_path / "live").exists()
    with pytest.raises(FileExistsError):
        RequestTable.create(link)
    assert victim.read_bytes() == b"precious"
    assert oct(os.stat(tmp_path / "live").st_mode & 0o777) == "0o600"


def test_a_dead_creators_record_is_replaced_and_cleaned_up(tmp_path: Path) -> None:
    path = tmp_path / "horizonserve-control-old"
    with ControlRecord.create(path) as rec:
        rec.decision_writer().publish(1, 2, 3, 0.0, 0.0, now_ns=5)
    # Pretend a killed front process made it: its creator pid no longer exists.
    with open(path, "r+b") as f:
        f.seek(24)
        f.write(struct.pack("@q", _dead_pid()))
    assert record_mod.stale_record(path)
    with ControlRecord.create(path) as fresh:
        assert fresh.read_decision().steps == 0  # a new record, not the old contents
        assert fresh.creator_pid == os.getpid()
    with open(path, "r+b") as f:
        f.seek(24)
        f.write(struct.pack("@q", _dead_pid()))
    table = tmp_path / "horizonserve-vllm-requests-old"
    RequestTable.create(table).close()
    with open(table, "r+b") as f:
        f.seek(40)
        f.write(struct.pack("@q", _dead_pid()))
    live = tmp_path / "horizonserve-control-live"
    other = tmp_path / "unrelated-file"
    ControlRecord.create(live).close()
    other.write_bytes(b"x")
    removed = remove_stale(tmp_path)
    assert sorted(removed) == sorted([path, table])
    assert live.exists() and other.exists()


def test_a_record_left_by_a_killed_process_is_removed_at_the_next_start(tmp_path: Path) -> None:
    code = textwrap.dedent(
        f"""
        import os
        from horizonserve.runtime.monitor import ControlRecord
        ControlRecord.create({str(tmp_path / "horizonserve-control-killed")!r})
        os._exit(0)  # no cleanup, as under SIGKILL
        """
    )
    subprocess.run([sys.executable, "-c", code], check=True)
    assert (tmp_path / "horizonserve-control-killed").exists()
    assert remove_stale(tmp_path) == [tmp_path / "horizonserve-control-killed"]


def test_a_corrupt_header_reads_as_stale_until_repaired(tmp_path: Path) -> None:
    with ControlRecord.create(tmp_path / "c", n_slots=2) as rec:
        rec.decision_writer().publish(64, 68, 1, 0.1, 0.2, now_ns=time.monotonic_ns())
        rec.downstream_writer(0).set_active(3, time.monotonic_ns())
        assert rec.header_problem() is None
        rec._buf[0:4] = b"\xde\xad\xbe\xef"
        assert "magic" in (rec.header_problem() or "")
        assert rec.read_decision() == record_mod.STALE_DECISION
        assert rec.read_downstream(0) == record_mod.STALE_SLOT
        assert rec.downstream_active_total(time.monotonic_ns(), 10**9) == 0
        assert rec.read_alive_ns() == 0
        with pytest.raises(RecordFormatError):
            rec.read_decision(strict=True)
        rec.repair_header()
        assert rec.header_problem() is None
        assert rec.read_decision().shared_sms == 64 and rec.read_downstream(0).active == 3


def test_stuck_slot_future_and_orphaned_heartbeats_are_stale(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(shm_mod, "STUCK_TIMEOUT_S", 0.05)
    with ControlRecord.create(tmp_path / "c", n_slots=3) as rec:
        now = time.monotonic_ns()
        max_age = 10**9
        rec.downstream_writer(0).set_active(2, now)
        rec.downstream_writer(1).set_active(5, now + 60 * 10**9)  # stamped a minute ahead
        orphan = rec.downstream_writer(2)
        orphan.set_active(7, now)
        with open(rec.path, "r+b") as f:  # slot 2's writer pid: a process that is gone
            f.seek(2 * 64 + 2 * 64 + 32)  # seq, heartbeat, updates, active, kind, writer_pid
            f.write(struct.pack("@i", _dead_pid()))
        assert rec.downstream_active_total(now, max_age) == 2
        assert rec.slot_is_stale(1, now, max_age) and rec.slot_is_stale(2, now, max_age)
        assert not rec.slot_is_stale(0, now, max_age)
        # Slot 0's writer freezes mid-write: the shared stage keeps going, the slot is stale.
        struct.pack_into("@Q", rec._buf, 2 * 64, 11)
        t0 = time.monotonic()
        assert rec.downstream_active_total(now, max_age) == 0
        assert rec.downstream_active_total(now, max_age) == 0  # the second read is instant
        assert time.monotonic() - t0 < 0.5
        assert rec.read_downstream(0) == record_mod.STALE_SLOT
        rec.downstream_writer(0).set_active(4, now)  # a restarted writer recovers the slot
        assert rec.read_downstream(0).active == 4
        # A future decision heartbeat counts as stale too.
        rec.decision_writer().publish(1, 1, 1, 0.0, 0.0, now_ns=now + 60 * 10**9)
        assert rec.is_stale(now, max_age)


def test_alive_beat_is_separate_from_the_decision_heartbeat(tmp_path: Path) -> None:
    with ControlRecord.create(tmp_path / "c") as rec:
        w = rec.decision_writer()
        w.publish(1, 2, 3, 0.0, 0.0, now_ns=100)
        w.beat(500)
        assert rec.read_alive_ns() == 500 and rec.read_decision().heartbeat_ns == 100


def test_a_dead_shared_stages_future_beat_is_not_its_successors(tmp_path: Path) -> None:
    """A corrupt write can stamp `alive_ns` in the future; cleared by the owner once that
    stage is dead, a successor that has not beaten yet is judged from its ready time."""
    with ControlRecord.create(tmp_path / "c") as rec:
        now = time.monotonic_ns()

        def fault() -> str | None:  # the supervisor's check of a stage ready at `now`
            return stage_fault(
                exitcode=None, pid=os.getpid(), beat_ns=rec.read_alive_ns(), writer_pid=0,
                ready_ns=now, now_ns=now, hang_ns=10**9,
            )  # fmt: skip

        rec.decision_writer().beat(now + 10 * 10**9)
        assert "future" in (fault() or "")
        rec.clear_alive()
        assert rec.read_alive_ns() == 0 and fault() is None


@pytest.mark.parametrize("stuck", [False, True])
def test_a_reset_slot_holds_nothing_of_its_dead_writer(tmp_path: Path, stuck: bool) -> None:
    """What a dead downstream writer left, a future beat or a seq stuck odd mid-write, is
    gone after the owner's reset; the successor's writer then takes the slot over."""
    with ControlRecord.create(tmp_path / "c", n_slots=2) as rec:
        now = time.monotonic_ns()
        rec.downstream_writer(1, kind=3).set_active(4, now + 10 * 10**9, slack=0.5)
        if stuck:
            struct.pack_into("@Q", rec._buf, 2 * 64 + 64, 9)  # frozen inside a write
        rec.reset_slot(1)
        slot = rec.read_downstream(1)
        assert (slot.heartbeat_ns, slot.active, slot.writer_pid, slot.kind) == (0, 0, 0, 3)
        assert slot.seq % 2 == 0 and math.isnan(slot.slack)
        rec.downstream_writer(1, kind=3).set_active(2, now)
        assert rec.read_downstream(1).active == 2 and rec.read_downstream(1).heartbeat_ns == now


def test_table_survives_a_stuck_writer_and_any_str_id(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(shm_mod, "STUCK_TIMEOUT_S", 0.05)
    monkeypatch.setattr(table_mod, "LOCK_TIMEOUT_S", 0.1)
    with RequestTable.create(tmp_path / "t", capacity=8) as t:
        odd = b"id-\xff".decode("utf-8", "surrogateescape")
        assert t.insert(odd, 10, 1, 2) and t.lookup(odd) is not None
        assert t.insert("\ud800", 0, 1, 2)  # a lone surrogate too
        t._words[table_mod._GEN_WORD] += 1  # a writer froze mid-write: gen stays odd
        assert t.lookup(odd) is None  # unknown, not an exception
        code = f"import fcntl, time; f = open({str(t.path)!r}, 'rb'); "
        code += "fcntl.flock(f, fcntl.LOCK_EX); print('locked', flush=True); time.sleep(30)"
        holder = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
        try:
            assert holder.stdout is not None and holder.stdout.readline().strip() == "locked"
            with pytest.raises(TableBusyError):
                t.insert("x", 0, 1, 2)
        finally:
            holder.kill()
            holder.wait()
        assert t.insert("x", 0, 1, 2)  # lock free again: writes work (gen made even)
        assert t.lookup("x") is not None
