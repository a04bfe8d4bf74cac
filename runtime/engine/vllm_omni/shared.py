"""The control record, request table and answer lengths this server's processes share (in
/dev/shm).

Names carry the run id `HORIZONSERVE_VLLM_RUN`, which the root process (the first to register
the plugin: the API server) sets before any stage process is spawned, so every process of one
server maps the same files and two servers on one host never share them. The root creates
them fresh and removes them at exit; the others attach, creating them if they are missing (a
stage started by something other than the API server, e.g. `Omni(...)` in a script that did
not call `register()` first).

Answer lengths (`AnswerLengths`): the shared stage records how many tokens a long-path
request's answer has when it finishes there; the first downstream stage takes the count when
the request arrives (its talker prompt carries only the thinker prompt's length), as the
request's work for the place-aware admission order (`admission.py`).
"""

from __future__ import annotations

import atexit
import contextlib
import fcntl
import logging
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from horizonserve.runtime.engine.vllm_omni.settings import RUN_ENV
from horizonserve.runtime.monitor import (
    ControlRecord,
    RecordFormatError,
    RequestTable,
    TableBusyError,
    TableFormatError,
    TableFullError,
    remove_stale,
    shm_dir,
    shm_path,
)
from horizonserve.runtime.monitor.cleanup import STALE_CHECKS
from horizonserve.runtime.monitor.request_table import stale_table

log = logging.getLogger(__name__)
T = TypeVar("T")

RECORD_PREFIX = "horizonserve-vllm-control"
TABLE_PREFIX = "horizonserve-vllm-requests"
ANSWERS_PREFIX = "horizonserve-vllm-answers"
# The answers file is a request table: a killed server's is removed like its request table.
STALE_CHECKS.setdefault(f"{ANSWERS_PREFIX}-", stale_table)
N_SLOTS = 4  # downstream stages 1..4 → slots 0..3
TABLE_CAPACITY = 4096

_lock = threading.Lock()
_record: ControlRecord | None = None
_table: RequestTable | None = None
_answers: AnswerLengths | None = None


def run_id() -> str:
    return os.environ.get(RUN_ENV, "default")


def record_path() -> Path:
    return shm_path(f"{RECORD_PREFIX}-{run_id()}")


def table_path() -> Path:
    return shm_path(f"{TABLE_PREFIX}-{run_id()}")


def answers_path() -> Path:
    return shm_path(f"{ANSWERS_PREFIX}-{run_id()}")


class AnswerLengths:
    """Answer lengths (output tokens at the shared stage) by request id, in a request-table file:
    an entry's `priority` field holds the token count, `arrival_ns` when it was recorded. An
    entry lives from the shared stage's finish to the first downstream stage's `take`; a full
    or busy table drops the record (counted): the request is then ordered without its length.
    """

    MAX_TOKENS = 2**31 - 1  # the field is an i32

    def __init__(self, table: RequestTable) -> None:
        self.table = table
        self.dropped = 0

    def record(self, request_id: str, tokens: int) -> bool:
        """Store `tokens` for `request_id`; False when the table could not take it."""
        try:
            self.table.insert(request_id, min(tokens, self.MAX_TOKENS), time.monotonic_ns(), 0)
        except (TableFullError, TableBusyError):
            self.dropped += 1
            return False
        return True

    def take(self, request_id: str) -> int | None:
        """The recorded length, removed from the table; None when none was recorded."""
        entry = self.table.lookup(request_id)
        if entry is None:
            return None
        try:
            self.table.delete(request_id)
        except TableBusyError:  # left behind: a later record of the same id overwrites it
            self.dropped += 1
        return entry.priority

    def close(self) -> None:
        self.table.close()

    def unlink(self) -> None:
        self.table.unlink()


def become_root() -> bool:
    """Set the run id if no ancestor did; True for the process that set it (the root)."""
    if os.environ.get(RUN_ENV):
        return False
    os.environ[RUN_ENV] = f"{os.getpid()}-{time.time_ns() // 1_000_000}"
    return True


def create_fresh() -> None:
    """Root only: create both files anew and remove them when this process exits."""
    global _record, _table, _answers
    remove_stale(shm_dir(), tuple(STALE_CHECKS))  # files of servers killed before removing them
    with _lock:
        _record = ControlRecord.create(record_path(), n_slots=N_SLOTS)
        _table = RequestTable.create(table_path(), capacity=TABLE_CAPACITY)
        _answers = AnswerLengths(RequestTable.create(answers_path(), capacity=TABLE_CAPACITY))
        record, table, answers = _record, _table, _answers
    atexit.register(_unlink, record, table, answers)


def _unlink(record: ControlRecord, table: RequestTable, answers: AnswerLengths) -> None:
    for obj in (record, table, answers):
        with contextlib.suppress(OSError):
            obj.unlink()


def _attach(
    path: Path,
    open_fn: Callable[[Path], T],
    create_fn: Callable[[Path], T],
    errors: tuple[type[Exception], ...],
) -> T:
    """Open `path`; create it under an flock when missing or never initialised."""
    try:
        return open_fn(path)
    except (FileNotFoundError, *errors):
        pass
    path.parent.mkdir(parents=True, exist_ok=True)
    lock_path = path.with_name(path.name + ".lock")
    # O_NOFOLLOW: a symlink planted at the lock path never redirects the open (ELOOP instead).
    try:
        fd = os.open(lock_path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    except OSError as err:
        raise OSError(
            err.errno,
            f"{lock_path}: cannot open the lock file ({err.strerror}); remove it if it "
            "is a symlink or not a regular file",
        ) from err
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        try:
            return open_fn(path)
        except (FileNotFoundError, *errors):
            return create_fn(path)
    finally:
        os.close(fd)


def control_record() -> ControlRecord:
    """This process's mapping of the control record (attached once)."""
    global _record
    with _lock:
        if _record is None:
            _record = _attach(
                record_path(),
                ControlRecord.open,
                lambda p: ControlRecord.create(p, n_slots=N_SLOTS),
                (RecordFormatError,),
            )
        return _record


def _attach_table(path: Path) -> RequestTable:
    return _attach(
        path,
        RequestTable.open,
        lambda p: RequestTable.create(p, capacity=TABLE_CAPACITY),
        (TableFormatError,),
    )


def request_table() -> RequestTable:
    """This process's mapping of the request table (attached once)."""
    global _table
    with _lock:
        if _table is None:
            _table = _attach_table(table_path())
        return _table


def answer_lengths() -> AnswerLengths:
    """This process's mapping of the answer lengths (attached once)."""
    global _answers
    with _lock:
        if _answers is None:
            _answers = AnswerLengths(_attach_table(answers_path()))
        return _answers


def reset_for_tests() -> None:
    """Forget the mappings of this process (tests point HORIZONSERVE_SHM_DIR elsewhere)."""
    global _record, _table, _answers
    with _lock:
        for obj in (_record, _table, _answers):
            if obj is not None:
                obj.close()
        _record = _table = _answers = None
