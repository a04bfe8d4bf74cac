"""Start-up cleanup of shared-memory files that a killed process left behind.

A front process killed with SIGKILL cannot remove its control record, so every start sweeps
the directory: a file under one of our name prefixes is removed when it is this user's regular
file and holds no live record (its header's creator process is gone, or it never got a header
and is older than `UNINITIALISED_GRACE_S`, so a file being created right now is left alone).
Symlinks, directories and other users' files are never touched.
"""

from __future__ import annotations

import logging
import os
import stat
import time
from collections.abc import Callable, Iterable
from pathlib import Path

from horizonserve.runtime.monitor.record import stale_record
from horizonserve.runtime.monitor.request_table import stale_table

log = logging.getLogger(__name__)

UNINITIALISED_GRACE_S = 10.0

#: Name prefix -> stale check, for the files this project creates.
STALE_CHECKS: dict[str, Callable[[Path], bool]] = {
    "horizonserve-control-": stale_record,
    "horizonserve-vllm-control-": stale_record,
    "horizonserve-vllm-requests-": stale_table,
}


def remove_stale(directory: Path, prefixes: Iterable[str] = tuple(STALE_CHECKS)) -> list[Path]:
    """Remove stale records under `prefixes` in `directory`; returns the paths removed."""
    removed: list[Path] = []
    try:
        entries = list(os.scandir(directory))
    except OSError:
        return removed
    now = time.time()
    for prefix in prefixes:
        check = STALE_CHECKS[prefix]
        for entry in entries:
            if not entry.name.startswith(prefix) or entry.name.endswith(".lock"):
                continue
            path = Path(entry.path)
            try:
                st = path.lstat()
            except FileNotFoundError:
                continue
            if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid():
                continue
            young = now - st.st_mtime < UNINITIALISED_GRACE_S
            if check(path) and not (young and st.st_size and _no_magic(path)):
                path.unlink(missing_ok=True)
                removed.append(path)
    if removed:
        log.info("removed %d stale shared-memory file(s): %s", len(removed), removed)
    return removed


def _no_magic(path: Path) -> bool:
    """True for a file whose magic word is still zero (its creator is writing the header)."""
    try:
        with open(path, "rb", buffering=0) as f:
            return f.read(4) == b"\0\0\0\0"
    except OSError:
        return False
