"""The control record and request table this server's processes share (in /dev/shm).

Names carry the run id `HORIZONSERVE_VLLM_RUN`, which the root process (the first to register
the plugin: the API server) sets before any stage process is spawned, so every process of one
server maps the same two files and two servers on one host never share them. The root creates
both files fresh and removes them at exit; the others attach, creating them if they are
missing (a stage started by something other than the API server, e.g. `Omni(...)` in a
script that did not call `register()` first).
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
    TableFormatError,
    remove_stale,
    shm_dir,
    shm_path,
)

log = logging.getLogger(__name__)
T = TypeVar("T")

RECORD_PREFIX = "horizonserve-vllm-control"
TABLE_PREFIX = "horizonserve-vllm-requests"
N_SLOTS = 4  # downstream stages 1..4 → slots 0..3
TABLE_CAPACITY = 4096

_lock = threading.Lock()
_record: ControlRecord | None = None
_table: RequestTable | None = None


def run_id() -> str:
    return os.environ.get(RUN_ENV, "default")


def record_path() -> Path:
    return shm_path(f"{RECORD_PREFIX}-{run_id()}")


def table_path() -> Path:
    return shm_path(f"{TABLE_PREFIX}-{run_id()}")


def become_root() -> bool:
    """Set the run id if no ancestor did; True for the process that set it (the root)."""
    if os.environ.get(RUN_ENV):
        return False
    os.environ[RUN_ENV] = f"{os.getpid()}-{time.time_ns() // 1_000_000}"
    return True


def create_fresh() -> None:
    """Root only: create both files anew and remove them when this process exits."""
    global _record, _table
    remove_stale(shm_dir())  # files of servers killed before they could remove them
    with _lock:
        _record = ControlRecord.create(record_path(), n_slots=N_SLOTS)
        _table = RequestTable.create(table_path(), capacity=TABLE_CAPACITY)
        record, table = _record, _table
    atexit.register(_unlink, record, table)


def _unlink(record: ControlRecord, table: RequestTable) -> None:
    for obj in (record, table):
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
    fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o600)
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


def request_table() -> RequestTable:
    """This process's mapping of the request table (attached once)."""
    global _table
    with _lock:
        if _table is None:
            _table = _attach(
                table_path(),
                RequestTable.open,
                lambda p: RequestTable.create(p, capacity=TABLE_CAPACITY),
                (TableFormatError,),
            )
        return _table


def reset_for_tests() -> None:
    """Forget the mappings of this process (tests point HORIZONSERVE_SHM_DIR elsewhere)."""
    global _record, _table
    with _lock:
        for obj in (_record, _table):
            if obj is not None:
                obj.close()
        _record = _table = None
