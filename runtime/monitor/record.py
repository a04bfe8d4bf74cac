"""The control record: one small shared-memory file read and written by every stage process.

Layout (native byte order and alignment: the file never leaves the host), 64-byte groups::

    offset 0    header     magic, version, n_slots, size, created_ns, creator_pid, owner_uid
    offset 64   decision   seq | pressure_smoothed, pressure_raw, heartbeat_ns, steps,
                                 shared_sms, downstream_sms, level_index, writer_pid
                           alive_ns (offset 120, one word outside the seqlock)
    offset 128  slot i     seq | heartbeat_ns, updates, active, kind, writer_pid, slack
                                                                          (64 B each)

Who writes what (one writer per group, so writers never race each other):

* the shared stage ("thinker") writes the decision group: the SM split it picked, the ladder
  level index, and the raw and smoothed memory pressure, once per scheduling step;
* downstream stage process k writes slot k only: how many requests it has in flight, and the
  smallest slack ratio among its requests whose first output is still pending (NaN: none),
  which the shared stage's slack split reads.

Everyone may read every group. Each group is a seqlock: the writer makes `seq` odd, writes the
payload, then makes `seq` even again; a reader copies seq+payload, re-reads seq, and retries
unless both reads gave the same even value. So a reader never returns a torn group. This
relies on stores and loads not being reordered across the calls, which holds on x86-64 (TSO).

Every `seq` store goes through a memoryview cast to u64 (one aligned 8-byte store), never
through `struct.pack_into`: CPython's pack_into zero-fills its target before writing the
fields, so a reader could catch a seq of 0 (even) in the middle of a write. Payload fields
may be written with pack_into because seq is odd the whole time.

Heartbeats are `time.monotonic_ns()` of the writer: CLOCK_MONOTONIC is one clock for all
processes of a Linux host, so readers compare them with their own monotonic time. The decision
heartbeat means "last decision" (a downstream stage takes the whole GPU when it is old), so the
shared stage's liveness while idle has its own word, `alive_ns` (`DecisionWriter.beat`).

Readers never fail on what another process did to the file (fault isolation):
* the header is compared with the one seen at attach time on every read; a changed header
  makes every group read as stale (`header_problem()` says what changed);
* a group stuck mid-write for `STUCK_TIMEOUT_S` (its writer died or was stopped inside an
  update) reads as stale; while its seq stays at that odd value later reads return stale at
  once, without spinning again;
* a heartbeat stamped in the future (more than `FUTURE_SLACK_NS` ahead) counts as stale, and
  so does one whose `writer_pid` no longer exists (checked at most every `PID_CHECK_S`).

Files are created with O_EXCL|O_NOFOLLOW (mode 0600); `create` replaces an existing file
only when it is this user's regular file whose creator process is gone (`stale_record`).
"""

from __future__ import annotations

import math
import mmap
import os
import struct
import time
from pathlib import Path
from typing import NamedTuple

from horizonserve.runtime.monitor.shm import (
    Backoff,
    MappedFile,
    create_mapping,
    open_mapping,
    pid_alive,
    shm_path,
    stale_file,
)
from horizonserve.runtime.spatial import NO_DECISION

MAGIC = 0x524D5A48  # b"HZMR" read as a little-endian u32
VERSION = 3  # 2: owner_uid in the header, alive_ns in the decision group; 3: slot slack
FUTURE_SLACK_NS = 50_000_000  # a heartbeat this far ahead of the reader's clock is bogus
PID_CHECK_S = 0.5  # how often a reader re-checks that a slot's writer process exists
DEFAULT_RECORD_NAME = "horizonserve-control"
DEFAULT_DOWNSTREAM_SLOTS = 4
GROUP_BYTES = 64
_tuple_new = tuple.__new__  # NamedTuple._make without its Python-level length check

# magic, version, n_slots, size, created_ns, creator_pid, owner_uid
_HEADER = struct.Struct("@IIIIqqq")
_SEQ_BYTES = 8
# Decision payload after its seq; field order matches PublishedDecision.
_DECISION = struct.Struct("@ddqqiiii")
_DECISION_READ = struct.Struct("@Qddqqiiii")
# Slot payload after its seq; field order matches DownstreamActivity.
_SLOT = struct.Struct("@qqiiid")
_SLOT_READ = struct.Struct("@Qqqiiid")

_DECISION_OFFSET = GROUP_BYTES
_ALIVE_WORD = (_DECISION_OFFSET + GROUP_BYTES - 8) >> 3  # u64 index of alive_ns
_SLOTS_OFFSET = 2 * GROUP_BYTES
assert _HEADER.size <= GROUP_BYTES and _DECISION_READ.size <= GROUP_BYTES
assert _SLOT_READ.size <= GROUP_BYTES
assert _DECISION_READ.size == _SEQ_BYTES + _DECISION.size  # no padding between seq and payload
assert _SLOT_READ.size == _SEQ_BYTES + _SLOT.size
assert _DECISION_OFFSET + _DECISION_READ.size <= _ALIVE_WORD << 3  # alive_ns is spare room


class RecordFormatError(ValueError):
    """The file is not a control record of this version (or is not initialised yet)."""


class RecordBusyError(RuntimeError):
    """A group stayed mid-write for too long (`read_*(strict=True)` only; the default reads
    return a stale copy instead, so a stuck writer never ends a reader)."""


class PublishedDecision(NamedTuple):
    """One consistent copy of the decision group (field order = struct order)."""

    seq: int
    pressure_smoothed: float  # NaN = unknown
    pressure_raw: float  # NaN = unknown
    heartbeat_ns: int  # 0 = never written
    steps: int  # number of publishes so far
    shared_sms: int
    downstream_sms: int
    level_index: int  # a ladder index or a `spatial.Level`; NO_DECISION when none
    writer_pid: int


class DownstreamActivity(NamedTuple):
    """One consistent copy of a downstream slot (field order = struct order)."""

    seq: int
    heartbeat_ns: int  # 0 = never written
    updates: int
    active: int  # requests in flight in that stage
    kind: int  # caller-defined stage code (e.g. talker, code2wav, DiT); 0 = unused
    writer_pid: int
    slack: float  # smallest slack ratio of a pending first output; NaN = none


def record_size(n_slots: int) -> int:
    """Bytes of a record with `n_slots` downstream slots."""
    return _SLOTS_OFFSET + n_slots * GROUP_BYTES


#: What a stuck, corrupt or never-written group reads as: no decision / no activity.
STALE_DECISION = PublishedDecision(0, math.nan, math.nan, 0, 0, 0, 0, NO_DECISION, 0)
STALE_SLOT = DownstreamActivity(0, 0, 0, 0, 0, 0, math.nan)


def _stale(heartbeat_ns: int, now_ns: int, max_age_ns: int) -> bool:
    """Never written, too old, or stamped in the future."""
    return (
        heartbeat_ns == 0
        or now_ns - heartbeat_ns > max_age_ns
        or heartbeat_ns - now_ns > FUTURE_SLACK_NS
    )


def stale_record(path: Path) -> bool:
    """True when `path` holds no live control record (what `create` may replace, what the
    start-up cleanup removes)."""
    return stale_file(path, _HEADER, MAGIC, creator_field=5)


class ControlRecord(MappedFile):
    """A mapped control record. Create it once (`create`), attach elsewhere (`open`)."""

    def __init__(self, path: Path, fd: int, buf: mmap.mmap, n_slots: int) -> None:
        self._attach(path, fd, buf)
        self.n_slots = n_slots
        self.read_retries = 0  # how often a reader saw a write in progress (diagnostics)
        self.stale_reads = 0  # reads answered with a stale copy (stuck group, bad header)
        self._slot_offsets = tuple(_SLOTS_OFFSET + i * GROUP_BYTES for i in range(n_slots))
        self._header = bytes(buf[: _HEADER.size])  # what every read checks against
        self._stuck: dict[int, int] = {}  # group offset -> the odd seq it was stuck at
        self._pid_seen: dict[int, tuple[float, bool]] = {}  # pid -> (checked at, alive)

    # -- integrity --------------------------------------------------------------------------

    def header_problem(self) -> str | None:
        """None while the header is the one seen at attach time, else what is wrong."""
        now = bytes(self._buf[: _HEADER.size])
        if now == self._header:
            return None
        magic, version, n_slots, size, _, creator, uid = _HEADER.unpack(now)
        if magic != MAGIC:
            return f"header corrupt: magic {magic:#x}"
        return (
            f"header changed: version {version}, {n_slots} slots, {size} bytes, "
            f"creator {creator}, uid {uid}"
        )

    def repair_header(self) -> None:
        """Owner only: write back the header seen at attach time (magic last)."""
        self._buf[4 : _HEADER.size] = self._header[4:]
        self._buf[0:4] = self._header[0:4]

    def clear_alive(self) -> None:
        """Owner only, while no shared stage runs: forget the liveness beat a dead one left.
        `alive_ns` sits outside the seqlock, so a predecessor's beat (or one a corrupt write
        stamped in the future) would otherwise be judged as its successor's until that one
        first beats; cleared, the successor's age counts from its own ready time."""
        self._words[_ALIVE_WORD] = 0

    def reset_slot(self, slot: int) -> None:
        """Owner only, while slot `slot`'s writer is dead: the slot as a successor should
        find it (no heartbeat, nothing in flight, no writer), under the seqlock, so neither a
        predecessor's beat nor a corrupt one is judged as the successor's."""
        self._check_slot(slot)
        offset = _SLOTS_OFFSET + slot * GROUP_BYTES
        index = offset >> 3
        seq = self._words[index] | 1  # odd: a reset in progress (also from a stuck odd seq)
        updates, kind = _SLOT_READ.unpack_from(self._buf, offset)[2:5:2]
        self._words[index] = seq
        _SLOT.pack_into(self._buf, offset + _SEQ_BYTES, 0, updates, 0, kind, 0, math.nan)
        self._words[index] = seq + 1

    @property
    def creator_pid(self) -> int:
        return int(_HEADER.unpack(self._header)[5])

    def _header_ok(self) -> bool:
        return self._buf[: _HEADER.size] == self._header

    def _writer_alive(self, pid: int) -> bool:
        """Cached liveness of a writer process (re-checked every PID_CHECK_S)."""
        if pid == os.getpid():
            return True
        now = time.monotonic()
        seen = self._pid_seen.get(pid)
        if seen is None or now - seen[0] > PID_CHECK_S:
            if len(self._pid_seen) > 64:
                self._pid_seen.clear()
            seen = (now, pid_alive(pid))
            self._pid_seen[pid] = seen
        return seen[1]

    # -- lifetime ---------------------------------------------------------------------------

    @classmethod
    def create(
        cls, path: str | os.PathLike[str] | None = None, n_slots: int = DEFAULT_DOWNSTREAM_SLOTS
    ) -> ControlRecord:
        """Create (or reset) the record file; readers may `open` it once this returns."""
        if not 1 <= n_slots <= 255:
            raise ValueError(f"n_slots must be in [1, 255], got {n_slots}")
        p = Path(path) if path is not None else shm_path(DEFAULT_RECORD_NAME)
        size = record_size(n_slots)
        fd, buf = create_mapping(p, size, stale=stale_record)
        nan = math.nan
        _DECISION.pack_into(
            buf, _DECISION_OFFSET + _SEQ_BYTES, nan, nan, 0, 0, 0, 0, NO_DECISION, 0
        )
        # Magic goes in last: an opener that sees it sees an initialised file.
        created, pid, uid = time.monotonic_ns(), os.getpid(), os.geteuid()
        _HEADER.pack_into(buf, 0, 0, VERSION, n_slots, size, created, pid, uid)
        struct.pack_into("@I", buf, 0, MAGIC)
        return cls(p, fd, buf, n_slots)

    @classmethod
    def open(cls, path: str | os.PathLike[str] | None = None) -> ControlRecord:
        """Attach to an existing record; raises FileNotFoundError or RecordFormatError."""
        p = Path(path) if path is not None else shm_path(DEFAULT_RECORD_NAME)
        try:
            fd, buf = open_mapping(p, _SLOTS_OFFSET)
        except ValueError as exc:
            raise RecordFormatError(str(exc)) from exc
        magic, version, n_slots, size, _, _, _ = _HEADER.unpack_from(buf, 0)
        problem = None
        if magic != MAGIC:
            problem = f"bad magic {magic:#x} (not initialised, or not a control record)"
        elif version != VERSION:
            problem = f"version {version}, this code reads version {VERSION}"
        elif size != record_size(n_slots) or len(buf) < size:
            problem = f"size {len(buf)} does not match {n_slots} slots"
        if problem is not None:
            buf.close()
            os.close(fd)
            raise RecordFormatError(f"{p}: {problem}")
        return cls(p, fd, buf, n_slots)

    # -- writers ----------------------------------------------------------------------------

    def decision_writer(self) -> DecisionWriter:
        """Writer for the decision group; only the shared stage may hold one."""
        return DecisionWriter(self._buf, self._words)

    def downstream_writer(self, slot: int, kind: int = 1) -> DownstreamWriter:
        """Writer for slot `slot`; only downstream stage `slot` may hold it."""
        self._check_slot(slot)
        return DownstreamWriter(self._buf, self._words, _SLOTS_OFFSET + slot * GROUP_BYTES, kind)

    # -- readers ----------------------------------------------------------------------------

    def read_decision(self, *, strict: bool = False) -> PublishedDecision:
        """Consistent copy of the decision group (retries while a write is in progress).

        A stuck group or a changed header reads as `STALE_DECISION` (`strict`: raises
        RecordBusyError / RecordFormatError instead).
        """
        values = self._read(_DECISION_READ, _DECISION_OFFSET, strict)
        return STALE_DECISION if values is None else _tuple_new(PublishedDecision, values)

    def read_downstream(self, slot: int, *, strict: bool = False) -> DownstreamActivity:
        """Consistent copy of downstream slot `slot` (`STALE_SLOT` when stuck or corrupt)."""
        self._check_slot(slot)
        values = self._read(_SLOT_READ, _SLOTS_OFFSET + slot * GROUP_BYTES, strict)
        return STALE_SLOT if values is None else _tuple_new(DownstreamActivity, values)

    def read_alive_ns(self) -> int:
        """The shared stage's liveness beat (0: never beaten, or the header is corrupt)."""
        return self._words[_ALIVE_WORD] if self._header_ok() else 0

    def downstream_active_total(
        self, now_ns: int | None = None, max_age_ns: int | None = None
    ) -> int:
        """Requests in flight over all downstream slots.

        With `now_ns` and `max_age_ns`, slots whose heartbeat is older (or in the future, or
        whose writer process is gone) are skipped, so a crashed or stopped downstream process
        cannot pin the shared stage below its aggressive level.
        """
        if not self._header_ok():
            self.stale_reads += 1
            return 0
        check = now_ns is not None and max_age_ns is not None
        buf, read, words = self._buf, _SLOT_READ.unpack_from, self._words
        total = 0
        for offset in self._slot_offsets:
            values = read(buf, offset)
            seq = values[0]
            if seq & 1 or words[offset >> 3] != seq:
                values = self._read_slow(_SLOT_READ, offset, strict=False)
                if values is None:
                    continue
            _, heartbeat, _, active, _, pid, _ = values
            if not active:
                continue
            if check and (
                _stale(heartbeat, now_ns, max_age_ns)  # type: ignore[arg-type]
                or not self._writer_alive(pid)
            ):
                continue
            total += active
        return total

    def downstream_min_slack(self, now_ns: int, max_age_ns: int) -> float | None:
        """The smallest slack ratio any fresh, active downstream slot published (None: none
        has a first output pending). Stale slots are skipped as in `downstream_active_total`."""
        if not self._header_ok():
            return None
        best: float | None = None
        for slot in range(self.n_slots):
            a = self.read_downstream(slot)
            if not a.active or a.slack != a.slack:  # idle, or NaN: nothing pending
                continue
            if _stale(a.heartbeat_ns, now_ns, max_age_ns) or not self._writer_alive(a.writer_pid):
                continue
            if best is None or a.slack < best:
                best = a.slack
        return best

    def is_stale(self, now_ns: int, max_age_ns: int) -> bool:
        """True when the shared stage never published, its heartbeat is too old or in the
        future, or its writer process is gone."""
        d = self.read_decision()
        return _stale(d.heartbeat_ns, now_ns, max_age_ns) or not self._writer_alive(d.writer_pid)

    def slot_is_stale(self, slot: int, now_ns: int, max_age_ns: int) -> bool:
        """True when downstream slot `slot` never wrote, its heartbeat is too old or in the
        future, or its writer process is gone."""
        a = self.read_downstream(slot)
        return _stale(a.heartbeat_ns, now_ns, max_age_ns) or not self._writer_alive(a.writer_pid)

    def _read(self, layout: struct.Struct, offset: int, strict: bool) -> tuple | None:
        if not self._header_ok():
            if strict:
                raise RecordFormatError(f"{self.path}: {self.header_problem()}")
            self.stale_reads += 1
            return None
        values = layout.unpack_from(self._buf, offset)
        seq = values[0]
        if seq & 1 or self._words[offset >> 3] != seq:
            return self._read_slow(layout, offset, strict)
        return values

    def _read_slow(self, layout: struct.Struct, offset: int, strict: bool) -> tuple | None:
        """Retry loop of a seqlock read: a write was in progress at the first attempt.

        None (stale) when the group stays mid-write past STUCK_TIMEOUT_S; while its seq stays
        at that odd value, later calls return None at once.
        """
        buf, words = self._buf, self._words
        index = offset >> 3
        stuck = self._stuck.get(offset)
        if stuck is not None:
            if words[index] == stuck and not strict:
                self.stale_reads += 1
                return None
            del self._stuck[offset]
        backoff = Backoff()
        while backoff.again():
            self.read_retries += 1
            values = layout.unpack_from(buf, offset)
            seq = values[0]
            if not seq & 1 and words[index] == seq:
                return values
        if strict:
            raise RecordBusyError(f"{self.path}: group at offset {offset} stuck mid-write")
        seq = words[index]
        if seq & 1:
            self._stuck[offset] = seq
        self.stale_reads += 1
        return None

    def _check_slot(self, slot: int) -> None:
        if not 0 <= slot < self.n_slots:
            raise IndexError(f"slot {slot} out of range [0, {self.n_slots})")


class DecisionWriter:
    """Writes the decision group. Invariant: one DecisionWriter per record at a time."""

    __slots__ = ("_buf", "_pid", "_seq", "_steps", "_words")

    def __init__(self, buf: mmap.mmap, words: memoryview) -> None:
        self._buf = buf
        self._words = words
        self._pid = os.getpid()
        seq = words[_DECISION_OFFSET >> 3]
        self._seq = seq + (seq & 1)  # a predecessor that died mid-write left seq odd
        self._steps = _DECISION_READ.unpack_from(buf, _DECISION_OFFSET)[4]

    def publish(
        self,
        shared_sms: int,
        downstream_sms: int,
        level_index: int,
        pressure_smoothed: float,
        pressure_raw: float,
        now_ns: int,
    ) -> None:
        """Publish one step's SM decision and pressure; `now_ns` is the heartbeat."""
        words, seq = self._words, self._seq + 1
        steps = self._steps + 1
        words[_DECISION_OFFSET >> 3] = seq  # odd: write in progress
        _DECISION.pack_into(
            self._buf,
            _DECISION_OFFSET + _SEQ_BYTES,
            pressure_smoothed,
            pressure_raw,
            now_ns,
            steps,
            shared_sms,
            downstream_sms,
            level_index,
            self._pid,
        )
        words[_DECISION_OFFSET >> 3] = seq + 1  # even: consistent again
        words[_ALIVE_WORD] = now_ns
        self._seq = seq + 1
        self._steps = steps

    def beat(self, now_ns: int) -> None:
        """Liveness without a decision (the stage is idle): one aligned word store."""
        self._words[_ALIVE_WORD] = now_ns


class DownstreamWriter:
    """Writes one downstream slot. Invariant: one writer per slot at a time."""

    __slots__ = ("_buf", "_index", "_kind", "_offset", "_pid", "_seq", "_updates", "_words")

    def __init__(self, buf: mmap.mmap, words: memoryview, offset: int, kind: int) -> None:
        self._buf = buf
        self._words = words
        self._offset = offset
        self._index = offset >> 3  # seq's index in the u64 view
        self._kind = kind
        self._pid = os.getpid()
        seq = words[self._index]
        self._seq = seq + (seq & 1)
        self._updates = _SLOT_READ.unpack_from(buf, offset)[2]

    def set_active(self, active: int, now_ns: int, slack: float = math.nan) -> None:
        """Publish how many requests this stage has in flight and the smallest slack ratio of
        a pending first output (NaN: none); `now_ns` is the heartbeat."""
        words, index, seq = self._words, self._index, self._seq + 1
        updates = self._updates + 1
        words[index] = seq  # odd: write in progress
        _SLOT.pack_into(
            self._buf,
            self._offset + _SEQ_BYTES,
            now_ns,
            updates,
            active,
            self._kind,
            self._pid,
            slack,
        )
        words[index] = seq + 1  # even: consistent again
        self._seq = seq + 1
        self._updates = updates
