"""Request table: open addressing, collisions, deletion, capacity, cross-process use."""

from __future__ import annotations

import random
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from horizonserve.runtime.monitor import (
    RequestEntry,
    RequestTable,
    TableFormatError,
    TableFullError,
)
from horizonserve.runtime.monitor import request_table as rt


def test_insert_lookup_delete(tmp_path: Path) -> None:
    with RequestTable.create(tmp_path / "t", capacity=16) as t:
        assert t.lookup("a") is None and len(t) == 0
        assert t.insert("a", 0, 100, 150) is True
        assert t.insert("b", 10, 200, 900) is True
        assert t.lookup("a") == RequestEntry(priority=0, arrival_ns=100, deadline_ns=150)
        assert "b" in t and "c" not in t
        assert t.insert("a", 20, 101, 151) is False  # overwrite, count unchanged
        assert t.lookup("a") == RequestEntry(20, 101, 151) and len(t) == 2
        assert t.delete("a") is True and t.delete("a") is False
        assert t.lookup("a") is None and len(t) == 1


def test_full_table_raises_clearly(tmp_path: Path) -> None:
    with RequestTable.create(tmp_path / "t", capacity=4) as t:
        for i in range(4):
            t.insert(f"r{i}", 0, i, i)
        with pytest.raises(TableFullError, match="full"):
            t.insert("r4", 0, 0, 0)
        t.insert("r2", 10, 5, 5)  # overwriting a live id still works when full
        assert t.lookup("r2") == RequestEntry(10, 5, 5)
        t.delete("r0")
        t.insert("r4", 0, 0, 0)
        assert len(t) == 4


def test_hash_collisions_keep_ids_apart(tmp_path: Path) -> None:
    """Every id hashes alike: prefix + length tell them apart, deletion keeps runs intact."""
    with RequestTable.create(tmp_path / "t", capacity=8, key_hash=lambda b: 42) as t:
        ids = ["x", "y", "zz", "x" * 40, "x" * 41]  # last two share a 34-byte prefix
        for i, rid in enumerate(ids):
            t.insert(rid, i, i, i)
        for i, rid in enumerate(ids):
            assert t.lookup(rid) == RequestEntry(i, i, i)
        assert t.delete("y")
        for i, rid in enumerate(ids):
            assert t.lookup(rid) == (None if rid == "y" else RequestEntry(i, i, i))
        assert t.lookup("w") is None
        # Documented limit: equal hash, length and 34-byte prefix are taken as one id.
        assert t.lookup("x" * 39 + "y") == RequestEntry(3, 3, 3)


def test_same_long_prefix_different_hash(tmp_path: Path) -> None:
    with RequestTable.create(tmp_path / "t", capacity=8) as t:
        a, b = "req-" + "0" * 60 + "a", "req-" + "0" * 60 + "b"
        t.insert(a, 0, 1, 1)
        t.insert(b, 10, 2, 2)
        assert t.lookup(a) == RequestEntry(0, 1, 1) and t.lookup(b) == RequestEntry(10, 2, 2)


def test_matches_a_dict_under_random_churn(tmp_path: Path) -> None:
    """Model check with a 3-bucket hash, so probe runs wrap around and deletions shift."""
    rng = random.Random(7)
    cap = 11
    with RequestTable.create(tmp_path / "t", capacity=cap, key_hash=lambda b: b[-1] % 3 + 9) as t:
        model: dict[str, RequestEntry] = {}
        for step in range(5000):
            rid = f"id{rng.randrange(20)}"
            if rng.random() < 0.55:
                entry = RequestEntry(rng.choice((0, 10, 20)), step, step + 7)
                if rid not in model and len(model) == cap:
                    with pytest.raises(TableFullError):
                        t.insert(rid, *entry)
                    continue
                assert t.insert(rid, *entry) == (rid not in model)
                model[rid] = entry
            else:
                assert t.delete(rid) == (model.pop(rid, None) is not None)
            assert len(t) == len(model)
            probe = f"id{rng.randrange(20)}"
            assert t.lookup(probe) == model.get(probe)
        for k in range(20):
            assert t.lookup(f"id{k}") == model.get(f"id{k}")


def test_open_and_share_across_processes(tmp_path: Path) -> None:
    path = tmp_path / "t"
    with RequestTable.create(path, capacity=64) as t:
        t.insert("req-1", 10, 111, 222)
        code = textwrap.dedent(
            """
            import sys
            from horizonserve.runtime.monitor import RequestTable
            with RequestTable.open(sys.argv[1]) as t:
                e = t.lookup("req-1")
                assert (e.priority, e.arrival_ns, e.deadline_ns) == (10, 111, 222), e
                t.insert("req-2", 20, 333, 444)
                t.delete("req-1")
            """
        )
        # cwd=tmp_path: the repo root's `operator/` folder would shadow the stdlib module.
        subprocess.run(
            [sys.executable, "-c", code, str(path)], check=True, cwd=tmp_path, timeout=60
        )
        assert t.lookup("req-1") is None
        assert t.lookup("req-2") == RequestEntry(20, 333, 444)


def test_open_rejects_bad_files(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        RequestTable.open(tmp_path / "missing")
    (tmp_path / "zeros").write_bytes(bytes(rt.HEADER_BYTES + rt.ENTRY_BYTES))
    with pytest.raises(TableFormatError, match="magic"):
        RequestTable.open(tmp_path / "zeros")
    with pytest.raises(ValueError):
        RequestTable.create(tmp_path / "z", capacity=0)


def test_stable_hash_never_zero() -> None:
    assert rt.blake2b_key_hash(b"abc") == rt.blake2b_key_hash(b"abc") != 0


_CHURN = textwrap.dedent(
    """
    import sys
    from horizonserve.runtime.monitor import RequestTable
    with RequestTable.open(sys.argv[1]) as t:
        for k in range(int(sys.argv[2])):
            t.insert(f"r{k}", k % 3 * 10, k, 2 * k)  # fields are functions of k
            if k >= 12:
                t.delete(f"r{k - 12}")  # 12-13 live ids in 16 slots: long runs, many shifts
    """
)


def test_lookups_stay_consistent_under_concurrent_churn(tmp_path: Path) -> None:
    path = tmp_path / "t"
    n = 20_000
    with RequestTable.create(path, capacity=16) as t:
        # cwd=tmp_path: the repo root's `operator/` folder would shadow the stdlib module.
        writer = subprocess.Popen([sys.executable, "-c", _CHURN, str(path), str(n)], cwd=tmp_path)
        rng = random.Random(3)
        found = 0
        try:
            while writer.poll() is None:
                k = rng.randrange(n)
                e = t.lookup(f"r{k}")
                if e is not None:
                    assert e == RequestEntry(k % 3 * 10, k, 2 * k)
                    found += 1
        finally:
            writer.wait(timeout=120)
        assert writer.returncode == 0
        assert len(t) == 12
        for k in range(n - 12, n):
            assert t.lookup(f"r{k}") == RequestEntry(k % 3 * 10, k, 2 * k)
        assert t.lookup(f"r{n - 13}") is None
