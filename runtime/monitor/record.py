"""The control record: one small shared-memory file read and written by every stage process.

Layout (native byte order and alignment: the file never leaves the host), 64-byte groups::

    offset 0    header     magic, version, n_slots, size, created_ns, creator_pid
    offset 64   decision   seq | pressure_smoothed, pressure_raw, heartbeat_ns, steps,
                                 shared_sms, downstream_sms, level_index, writer_pid
    offset 128  slot i     seq | heartbeat_ns, updates, active, kind, writer_pid   (64 B each)

Who writes what (one writer per group, so writers never race each other):

* the shared stage ("thinker") writes the decision group: the SM split it picked, the ladder
  level index, and the raw and smoothed memory pressure, once per scheduling step;
* downstream stage process k writes slot k only: how many requests it has in flight.

Everyone may read every group. Each group is a seqlock: the writer makes `seq` odd, writes the
payload, then makes `seq` even again; a reader copies seq+payload, re-reads seq, and retries
unless both reads gave the same even value. So a reader never returns a torn group. This
relies on stores and loads not being reordered across the calls, which holds on x86-64 (TSO).

Every `seq` store goes through a memoryview cast to u64 (one aligned 8-byte store), never
through `struct.pack_into`: CPython's pack_into zero-fills its target before writing the
fields, so a reader could catch a seq of 0 (even) in the middle of a write. Payload fields
may be written with pack_into because seq is odd the whole time.

Heartbeats are `time.monotonic_ns()` of the writer: CLOCK_MONOTONIC is one clock for all
processes of a Linux host, so readers compare them with their own monotonic time.
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
    shm_path,
)

MAGIC = 0x524D5A48  # b"HZMR" read as a little-endian u32
VERSION = 1
DEFAULT_RECORD_NAME = "horizonserve-control"
DEFAULT_DOWNSTREAM_SLOTS = 4
GROUP_BYTES = 64
_tuple_new = tuple.__new__  # NamedTuple._make without its Python-level length check

_HEADER = struct.Struct("@IIIIqq")  # magic, version, n_slots, size, created_ns, creator_pid
_SEQ_BYTES = 8
# Decision payload after its seq; field order matches SmDecision.
_DECISION = struct.Struct("@ddqqiiii")
_DECISION_READ = struct.Struct("@Qddqqiiii")
# Slot payload after its seq; field order matches DownstreamActivity.
_SLOT = struct.Struct("@qqiii")
_SLOT_READ = struct.Struct("@Qqqiii")

_DECISION_OFFSET = GROUP_BYTES
_SLOTS_OFFSET = 2 * GROUP_BYTES
assert _HEADER.size <= GROUP_BYTES and _DECISION_READ.size <= GROUP_BYTES
assert _SLOT_READ.size <= GROUP_BYTES
assert _DECISION_READ.size == _SEQ_BYTES + _DECISION.size  # no padding between seq and payload
assert _SLOT_READ.size == _SEQ_BYTES + _SLOT.size


class RecordFormatError(ValueError):
    """The file is not a control record of this version (or is not initialised yet)."""


class RecordBusyError(RuntimeError):
    """A group stayed mid-write for too long: its writer probably died inside an update."""


class SmDecision(NamedTuple):
    """One consistent copy of the decision group (field order = struct order)."""

    seq: int
    pressure_smoothed: float  # NaN = unknown
    pressure_raw: float  # NaN = unknown
    heartbeat_ns: int  # 0 = never written
    steps: int  # number of publishes so far
    shared_sms: int
    downstream_sms: int
    level_index: int  # -1 = no decision yet
    writer_pid: int


class DownstreamActivity(NamedTuple):
    """One consistent copy of a downstream slot (field order = struct order)."""

    seq: int
    heartbeat_ns: int  # 0 = never written
    updates: int
    active: int  # requests in flight in that stage
    kind: int  # caller-defined stage code (e.g. talker, code2wav, DiT); 0 = unused
    writer_pid: int


def record_size(n_slots: int) -> int:
    """Bytes of a record with `n_slots` downstream slots."""
    return _SLOTS_OFFSET + n_slots * GROUP_BYTES


def _stale(heartbeat_ns: int, now_ns: int, max_age_ns: int) -> bool:
    return heartbeat_ns == 0 or now_ns - heartbeat_ns > max_age_ns


class ControlRecord(MappedFile):
    """A mapped control record. Create it once (`create`), attach elsewhere (`open`)."""

    def __init__(self, path: Path, fd: int, buf: mmap.mmap, n_slots: int) -> None:
        self._attach(path, fd, buf)
        self.n_slots = n_slots
        self.read_retries = 0  # how often a reader saw a write in progress (diagnostics)
        self._slot_offsets = tuple(_SLOTS_OFFSET + i * GROUP_BYTES for i in range(n_slots))

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
        fd, buf = create_mapping(p, size)
        nan = math.nan
        _DECISION.pack_into(buf, _DECISION_OFFSET + _SEQ_BYTES, nan, nan, 0, 0, 0, 0, -1, 0)
        # Magic goes in last: an opener that sees it sees an initialised file.
        _HEADER.pack_into(buf, 0, 0, VERSION, n_slots, size, time.monotonic_ns(), os.getpid())
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
        magic, version, n_slots, size, _, _ = _HEADER.unpack_from(buf, 0)
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

    def read_decision(self) -> SmDecision:
        """Consistent copy of the decision group (retries while a write is in progress)."""
        buf = self._buf
        values = _DECISION_READ.unpack_from(buf, _DECISION_OFFSET)
        seq = values[0]
        if seq & 1 or self._words[_DECISION_OFFSET >> 3] != seq:
            values = self._read_slow(_DECISION_READ, _DECISION_OFFSET)
        return _tuple_new(SmDecision, values)

    def read_downstream(self, slot: int) -> DownstreamActivity:
        """Consistent copy of downstream slot `slot`."""
        self._check_slot(slot)
        offset = _SLOTS_OFFSET + slot * GROUP_BYTES
        buf = self._buf
        values = _SLOT_READ.unpack_from(buf, offset)
        seq = values[0]
        if seq & 1 or self._words[offset >> 3] != seq:
            values = self._read_slow(_SLOT_READ, offset)
        return _tuple_new(DownstreamActivity, values)

    def downstream_active_total(
        self, now_ns: int | None = None, max_age_ns: int | None = None
    ) -> int:
        """Requests in flight over all downstream slots.

        With `now_ns` and `max_age_ns`, slots whose heartbeat is older are skipped, so a
        crashed downstream process cannot pin the shared stage below its aggressive level.
        """
        # Oldest heartbeat still counted as alive; None = count every slot.
        oldest = now_ns - max_age_ns if now_ns is not None and max_age_ns is not None else None
        buf, read, words = self._buf, _SLOT_READ.unpack_from, self._words
        total = 0
        for offset in self._slot_offsets:
            values = read(buf, offset)
            seq = values[0]
            if seq & 1 or words[offset >> 3] != seq:
                values = self._read_slow(_SLOT_READ, offset)
            _, heartbeat, _, active, _, _ = values
            if active and (oldest is None or (heartbeat != 0 and heartbeat >= oldest)):
                total += active
        return total

    def is_stale(self, now_ns: int, max_age_ns: int) -> bool:
        """True when the shared stage never published or its heartbeat is older than allowed."""
        return _stale(self.read_decision().heartbeat_ns, now_ns, max_age_ns)

    def slot_is_stale(self, slot: int, now_ns: int, max_age_ns: int) -> bool:
        """True when downstream slot `slot` never wrote or its heartbeat is too old."""
        return _stale(self.read_downstream(slot).heartbeat_ns, now_ns, max_age_ns)

    def _read_slow(self, layout: struct.Struct, offset: int) -> tuple:
        """Retry loop of a seqlock read: a write was in progress at the first attempt."""
        buf, words, backoff = self._buf, self._words, Backoff()
        while backoff.again():
            self.read_retries += 1
            values = layout.unpack_from(buf, offset)
            seq = values[0]
            if not seq & 1 and words[offset >> 3] == seq:
                return values
        raise RecordBusyError(f"{self.path}: group at offset {offset} stuck mid-write")

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
        self._seq = seq + 1
        self._steps = steps


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

    def set_active(self, active: int, now_ns: int) -> None:
        """Publish how many requests this stage has in flight; `now_ns` is the heartbeat."""
        words, index, seq = self._words, self._index, self._seq + 1
        updates = self._updates + 1
        words[index] = seq  # odd: write in progress
        _SLOT.pack_into(
            self._buf, self._offset + _SEQ_BYTES, now_ns, updates, active, self._kind, self._pid
        )
        words[index] = seq + 1  # even: consistent again
        self._seq = seq + 1
        self._updates = updates
