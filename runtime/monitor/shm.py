"""Shared-memory files: where they live and how they are mapped.

A record is a plain file in /dev/shm (tmpfs, so RAM only) mapped with mmap in every stage
process. Where /dev/shm is missing or not writable (macOS, some sandboxes) the system temp
dir is used instead; that is slower only when the page cache is flushed, which is harmless.
"""

from __future__ import annotations

import mmap
import os
import tempfile
import time
from pathlib import Path
from typing import Self

#: Environment variable that overrides the directory for all shared-memory files.
SHM_DIR_ENV = "HORIZONSERVE_SHM_DIR"
_DEV_SHM = Path("/dev/shm")


def shm_dir() -> Path:
    """Directory for shared-memory files: $HORIZONSERVE_SHM_DIR, /dev/shm, else the temp dir."""
    override = os.environ.get(SHM_DIR_ENV)
    if override:
        return Path(override)
    if _DEV_SHM.is_dir() and os.access(_DEV_SHM, os.W_OK | os.X_OK):
        return _DEV_SHM
    return Path(tempfile.gettempdir())


def shm_path(name: str) -> Path:
    """Path of the shared-memory file called `name` (a bare file name, no directories)."""
    if not name or "/" in name or name in (".", ".."):
        raise ValueError(f"shared-memory name must be a bare file name, got {name!r}")
    return shm_dir() / name


def create_mapping(path: str | os.PathLike[str], size: int) -> tuple[int, mmap.mmap]:
    """Create (or truncate) `path` to `size` zero bytes and map it; returns (fd, map)."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.ftruncate(fd, size)  # tmpfs zero-fills: every seq counter starts even (0)
        return fd, mmap.mmap(fd, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
    except BaseException:
        os.close(fd)
        raise


def open_mapping(path: str | os.PathLike[str], min_size: int) -> tuple[int, mmap.mmap]:
    """Map an existing file read-write; raises FileNotFoundError or ValueError (too small)."""
    fd = os.open(path, os.O_RDWR)
    try:
        size = os.fstat(fd).st_size
        if size < min_size:
            raise ValueError(f"{path}: {size} bytes, expected at least {min_size}")
        return fd, mmap.mmap(fd, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
    except BaseException:
        os.close(fd)
        raise


#: A seqlock reader gives up when one group stays mid-write this long (its writer likely died).
STUCK_TIMEOUT_S = 1.0


class Backoff:
    """Pacing of a seqlock reader's retries: spin, yield the CPU every 64 tries, time out.

    Time-based, not count-based: a writer preempted mid-write on a busy host can hold a group
    odd for many milliseconds, which is no reason to fail.
    """

    __slots__ = ("_deadline", "_timeout_s", "_tries")

    def __init__(self, timeout_s: float | None = None) -> None:
        self._tries = 0
        self._timeout_s = STUCK_TIMEOUT_S if timeout_s is None else timeout_s
        self._deadline: float | None = None

    def again(self) -> bool:
        """Call after a failed attempt; False once the timeout has passed."""
        self._tries += 1
        if self._tries & 63:
            return True
        now = time.monotonic()
        if self._deadline is None:
            self._deadline = now + self._timeout_s
        elif now > self._deadline:
            return False
        os.sched_yield()  # let a preempted writer on this CPU finish its update
        return True


class MappedFile:
    """Lifetime of one mapped shm file: close, unlink, use as a context manager.

    Subclasses set `path`, `_fd`, `_buf` and `_words` (a u64 memoryview of `_buf`).
    """

    path: Path
    _fd: int
    _buf: mmap.mmap
    _words: memoryview

    def _attach(self, path: Path, fd: int, buf: mmap.mmap) -> None:
        self.path = path
        self._fd = fd
        self._buf = buf
        self._words = memoryview(buf).cast("Q")  # u64 view: seq loads/stores are single words

    def close(self) -> None:
        """Unmap and close; writers made from this mapping stop working."""
        if self._fd < 0:
            return
        self._words.release()
        self._buf.close()
        os.close(self._fd)
        self._fd = -1

    def unlink(self) -> None:
        """Remove the file (processes that still map it keep their mapping)."""
        self.path.unlink(missing_ok=True)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
