"""Per-request table in shared memory: request id -> (class priority code, arrival, deadline).

The shared stage stamps a request's class and deadline at admission; downstream stages look
them up by request id, so the original deadline travels with the request across processes.

Fixed-capacity open addressing with linear probing, 64-byte entries::

    header (64 B)  magic u32, version u32, capacity, count, gen, created_ns, creator_pid
                   (u64 each)
    entry  (64 B)  key_hash u64 (0 = empty), arrival_ns, deadline_ns, priority, id_len,
                   id_prefix[34]

A key is a 64-bit BLAKE2b hash of the UTF-8 id (0 is remapped to 1), plus the id's length and
first 34 bytes to tell apart two ids whose hashes collide. Ids that agree on hash, length and
prefix are taken to be equal (probability ~2^-64).

Concurrency: writers (insert/delete, any process) serialise on an flock of the file; readers
take no lock. The whole table is one seqlock (`gen`): every write makes gen odd, changes
entries, then makes it even; `lookup` retries until it probed under one even gen. Deletion
shifts later entries of the probe run back (no tombstones), which is safe only because readers
retry on any gen change. `gen` and `count` are stored through a u64 memoryview (one aligned
store), never struct.pack_into, which zero-fills its target first (see record.py).
"""

from __future__ import annotations

import fcntl
import hashlib
import mmap
import os
import struct
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

from horizonserve.runtime.monitor.shm import (
    Backoff,
    MappedFile,
    create_mapping,
    open_mapping,
    shm_path,
    stale_file,
)

MAGIC = 0x545A5248  # b"HRZT" read as a little-endian u32
VERSION = 2  # 2: creator_pid in the header
DEFAULT_TABLE_NAME = "horizonserve-requests"
DEFAULT_CAPACITY = 4096
ENTRY_BYTES = 64
HEADER_BYTES = 64
ID_PREFIX_BYTES = 34

# magic, version, capacity, count, gen, created_ns, creator_pid
_HEADER = struct.Struct("@IIQQQqq")
_COUNT_WORD = 2  # index of `count` in the u64 view
_GEN_WORD = 3  # index of `gen` in the u64 view
_U32 = struct.Struct("@I")
_ENTRY = struct.Struct(f"@QqqiH{ID_PREFIX_BYTES}s")
assert _ENTRY.size == ENTRY_BYTES and _HEADER.size <= HEADER_BYTES


class TableFullError(RuntimeError):
    """Every slot holds a live request; raise the capacity or delete finished requests."""


class TableBusyError(RuntimeError):
    """The table's write lock stayed taken for LOCK_TIMEOUT_S (a writer stopped or stuck)."""


LOCK_TIMEOUT_S = 1.0


class TableFormatError(ValueError):
    """The file is not a request table of this version (or is not initialised yet)."""


class RequestEntry(NamedTuple):
    priority: int  # class priority code (0 text, 10 audio, 20 image)
    arrival_ns: int  # monotonic ns at admission
    deadline_ns: int  # monotonic ns: arrival + the class's SLO


def stale_table(path: Path) -> bool:
    """True when `path` holds no live request table (what `create` may replace, what the
    start-up cleanup removes)."""
    return stale_file(path, _HEADER, MAGIC, creator_field=6)


def blake2b_key_hash(data: bytes) -> int:
    """Stable 64-bit hash of an id (Python's hash() differs per process); never 0."""
    return int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "little") or 1


class RequestTable(MappedFile):
    """A mapped request table. Create it once (`create`), attach elsewhere (`open`)."""

    def __init__(
        self,
        path: Path,
        fd: int,
        buf: mmap.mmap,
        capacity: int,
        key_hash: Callable[[bytes], int] = blake2b_key_hash,
    ) -> None:
        self._attach(path, fd, buf)  # u64 words hold count and gen
        self.capacity = capacity
        self._hash = key_hash  # every process must use the same function
        self._thread_lock = threading.Lock()  # flock does not exclude threads sharing the fd
        self.stale_reads = 0  # lookups answered None because the table stayed mid-write

    @classmethod
    def create(
        cls,
        path: str | os.PathLike[str] | None = None,
        capacity: int = DEFAULT_CAPACITY,
        key_hash: Callable[[bytes], int] = blake2b_key_hash,
    ) -> RequestTable:
        """Create (or reset) an empty table with `capacity` slots."""
        if capacity < 1:
            raise ValueError(f"capacity must be positive, got {capacity}")
        p = Path(path) if path is not None else shm_path(DEFAULT_TABLE_NAME)
        fd, buf = create_mapping(p, HEADER_BYTES + capacity * ENTRY_BYTES, stale=stale_table)
        _HEADER.pack_into(buf, 0, 0, VERSION, capacity, 0, 0, time.monotonic_ns(), os.getpid())
        _U32.pack_into(buf, 0, MAGIC)  # last: an opener that sees it sees an initialised file
        return cls(p, fd, buf, capacity, key_hash)

    @classmethod
    def open(
        cls,
        path: str | os.PathLike[str] | None = None,
        key_hash: Callable[[bytes], int] = blake2b_key_hash,
    ) -> RequestTable:
        """Attach to an existing table; raises FileNotFoundError or TableFormatError."""
        p = Path(path) if path is not None else shm_path(DEFAULT_TABLE_NAME)
        try:
            fd, buf = open_mapping(p, HEADER_BYTES)
        except ValueError as exc:
            raise TableFormatError(str(exc)) from exc
        magic, version, capacity, _, _, _, _ = _HEADER.unpack_from(buf, 0)
        problem = None
        if magic != MAGIC:
            problem = f"bad magic {magic:#x} (not initialised, or not a request table)"
        elif version != VERSION:
            problem = f"version {version}, this code reads version {VERSION}"
        elif len(buf) != HEADER_BYTES + capacity * ENTRY_BYTES:
            problem = f"size {len(buf)} does not match capacity {capacity}"
        if problem is not None:
            buf.close()
            os.close(fd)
            raise TableFormatError(f"{p}: {problem}")
        return cls(p, fd, buf, capacity, key_hash)

    def __len__(self) -> int:
        return self._words[_COUNT_WORD]

    # -- key helpers ------------------------------------------------------------------------

    def _key(self, request_id: str) -> tuple[int, int, bytes]:
        # surrogatepass: an id decoded from non-UTF-8 bytes still has one stable key
        data = request_id.encode("utf-8", "surrogatepass")
        # struct's 's' pads with NUL bytes on write, so the stored prefix compares equal.
        prefix = data[:ID_PREFIX_BYTES].ljust(ID_PREFIX_BYTES, b"\0")
        return self._hash(data), min(len(data), 0xFFFF), prefix

    def _find(self, h: int, n: int, prefix: bytes) -> tuple[int, tuple | None]:
        """Probe for a key: (slot, entry fields) where it lives, else (empty slot or -1, None)."""
        buf, cap, unpack = self._buf, self.capacity, _ENTRY.unpack_from
        slot = h % cap
        for _ in range(cap):
            fields = unpack(buf, HEADER_BYTES + slot * ENTRY_BYTES)
            if fields[0] == 0:
                return slot, None
            if fields[0] == h and fields[4] == n and fields[5] == prefix:
                return slot, fields
            slot = slot + 1 if slot + 1 < cap else 0
        return -1, None

    # -- readers ----------------------------------------------------------------------------

    def lookup(self, request_id: str) -> RequestEntry | None:
        """Entry for `request_id`, or None. Lock-free; retries while a writer is active.

        A table stuck mid-write (its writer died or is stopped inside an update) answers None,
        as for an unknown id: the caller falls back to the stamps the request carries.
        """
        h, n, prefix = self._key(request_id)
        words = self._words
        backoff = Backoff()
        while True:
            gen = words[_GEN_WORD]
            if not gen & 1:
                fields = self._find(h, n, prefix)[1]
                if words[_GEN_WORD] == gen:
                    return None if fields is None else RequestEntry(fields[3], fields[1], fields[2])
            if not backoff.again():
                self.stale_reads += 1
                return None

    def __contains__(self, request_id: str) -> bool:
        return self.lookup(request_id) is not None

    # -- writers ----------------------------------------------------------------------------

    def insert(self, request_id: str, priority: int, arrival_ns: int, deadline_ns: int) -> bool:
        """Insert or overwrite; True when the id was new. Raises TableFullError when full."""
        h, n, prefix = self._key(request_id)
        with self._locked():
            slot, fields = self._find(h, n, prefix)
            found = fields is not None
            if slot < 0:
                raise TableFullError(
                    f"{self.path}: request table full ({self.capacity} live requests); "
                    "raise its capacity or delete finished requests"
                )
            self._begin_write()
            _ENTRY.pack_into(
                self._buf,
                HEADER_BYTES + slot * ENTRY_BYTES,
                h,
                arrival_ns,
                deadline_ns,
                priority,
                n,
                prefix,
            )
            if not found:
                self._words[_COUNT_WORD] += 1
            self._end_write()
            return not found

    def delete(self, request_id: str) -> bool:
        """Remove `request_id`; True when it was present."""
        h, n, prefix = self._key(request_id)
        with self._locked():
            hole, fields = self._find(h, n, prefix)
            if fields is None:
                return False
            buf, cap = self._buf, self.capacity
            self._begin_write()
            # Backward-shift deletion: pull later entries of this probe run into the hole
            # unless that would move them before their home slot.
            j = hole
            for _ in range(cap - 1):  # bounded: a full table has no empty slot to stop at
                j = j + 1 if j + 1 < cap else 0
                off_j = HEADER_BYTES + j * ENTRY_BYTES
                e_hash = self._words[off_j >> 3]
                if e_hash == 0:
                    break
                home = e_hash % cap
                # Entry j may move to `hole` iff home is not cyclically within (hole, j].
                stays = (hole < home <= j) if hole <= j else (home > hole or home <= j)
                if not stays:
                    off_h = HEADER_BYTES + hole * ENTRY_BYTES
                    buf[off_h : off_h + ENTRY_BYTES] = buf[off_j : off_j + ENTRY_BYTES]
                    hole = j
            off_h = HEADER_BYTES + hole * ENTRY_BYTES
            buf[off_h : off_h + ENTRY_BYTES] = bytes(ENTRY_BYTES)
            self._words[_COUNT_WORD] -= 1
            self._end_write()
            return True

    def _begin_write(self) -> None:
        gen = self._words[_GEN_WORD]
        self._words[_GEN_WORD] = gen + 1 + (gen & 1)  # odd (also after a writer died mid-write)

    def _end_write(self) -> None:
        self._words[_GEN_WORD] += 1  # even

    def _locked(self) -> _FileLock:
        return _FileLock(self._fd, self._thread_lock)


class _FileLock:
    """Exclusive flock on the table file plus a thread lock: one writer at a time, host-wide."""

    __slots__ = ("_fd", "_thread_lock")

    def __init__(self, fd: int, thread_lock: threading.Lock) -> None:
        self._fd = fd
        self._thread_lock = thread_lock

    def __enter__(self) -> None:
        if not self._thread_lock.acquire(timeout=LOCK_TIMEOUT_S):
            raise TableBusyError("request table: write lock held too long in this process")
        try:
            deadline = time.monotonic() + LOCK_TIMEOUT_S
            while True:
                try:
                    fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    if time.monotonic() > deadline:
                        raise TableBusyError(
                            "request table: another process holds its write lock (stopped?)"
                        ) from None
                    time.sleep(0.001)
        except BaseException:
            self._thread_lock.release()
            raise

    def __exit__(self, *exc: object) -> None:
        try:
            fcntl.flock(self._fd, fcntl.LOCK_UN)
        finally:
            self._thread_lock.release()
