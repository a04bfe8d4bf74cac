"""Shared-memory files: where they live and how they are mapped.

A record is a plain file in /dev/shm (tmpfs, so RAM only) mapped with mmap in every stage
process. Where /dev/shm is missing or not writable (macOS, some sandboxes) the system temp
dir is used instead; that is slower only when the page cache is flushed, which is harmless.
"""

from __future__ import annotations

import errno
import mmap
import os
import stat
import struct
import tempfile
import time
from collections.abc import Callable
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


_CREATE_FLAGS = os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
_OPEN_FLAGS = os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC


def create_mapping(
    path: str | os.PathLike[str], size: int, *, stale: Callable[[Path], bool] | None = None
) -> tuple[int, mmap.mmap]:
    """Create `path` as a new file of `size` zero bytes (mode 0600) and map it; (fd, map).

    Never follows a symlink and never reuses a file: O_EXCL|O_NOFOLLOW. When the name is taken,
    `stale(path)` may declare the old file dead (its creator is gone); it is then removed and
    the creation retried once. Anything else there (a symlink, another user's file, a live
    owner's record) raises FileExistsError.
    """
    p = Path(path)
    try:
        fd = os.open(p, _CREATE_FLAGS, 0o600)
    except FileExistsError:
        if stale is None or not _own_regular_file(p) or not stale(p):
            msg = f"{p} exists (not a stale record of this user): not replaced"
            raise FileExistsError(msg) from None
        p.unlink(missing_ok=True)
        fd = os.open(p, _CREATE_FLAGS, 0o600)
    try:
        os.ftruncate(fd, size)  # tmpfs zero-fills: every seq counter starts even (0)
        return fd, mmap.mmap(fd, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
    except BaseException:
        os.close(fd)
        raise


def open_mapping(path: str | os.PathLike[str], min_size: int) -> tuple[int, mmap.mmap]:
    """Map an existing regular file of this user read-write (never through a symlink).

    Raises FileNotFoundError, or ValueError (too small, not a regular file, foreign owner).
    """
    try:
        fd = os.open(path, _OPEN_FLAGS)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise ValueError(f"{path}: is a symlink, not a shared-memory file") from exc
        raise
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise ValueError(f"{path}: not a regular file")
        if st.st_uid != os.geteuid():
            raise ValueError(f"{path}: owned by uid {st.st_uid}, not this user")
        if st.st_size < min_size:
            raise ValueError(f"{path}: {st.st_size} bytes, expected at least {min_size}")
        return fd, mmap.mmap(fd, st.st_size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
    except BaseException:
        os.close(fd)
        raise


def _own_regular_file(path: Path) -> bool:
    try:
        st = path.lstat()
    except FileNotFoundError:
        return True  # gone meanwhile: creating again is fine
    return stat.S_ISREG(st.st_mode) and st.st_uid == os.geteuid()


def stale_file(path: Path, header: struct.Struct, magic: int, creator_field: int) -> bool:
    """True when `path` holds no live shared-memory file of this kind: short or unreadable
    header (False: unreadable file, left alone), another magic, or a creator pid (field
    `creator_field` of `header`) that no longer exists."""
    try:
        with open(path, "rb", buffering=0) as f:
            raw = f.read(header.size)
    except OSError:
        return False
    if len(raw) < header.size:
        return True
    fields = header.unpack(raw)
    return fields[0] != magic or not pid_alive(fields[creator_field])


def pid_alive(pid: int) -> bool:
    """True while process `pid` exists and is not a zombie (0 or negative: never alive)."""
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # exists, another user's
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            # State is the field after the parenthesised command name.
            return f.read().rsplit(b")", 1)[1].split()[0] != b"Z"
    except (OSError, IndexError):
        return True  # no /proc (macOS): kill() said it exists


#: A seqlock reader gives up when one group stays mid-write this long (its writer died or is
#: stopped); the group then reads as stale, never as an error that could end the reader.
STUCK_TIMEOUT_S = 0.25


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
