"""Per-class first-response statistics handed from the serving process to the node sidecar.

The serving process (reference pipeline or the vLLM-Omni plugin) rewrites one small JSON file
in the pod's shared memory volume; the sidecar reads it to publish the node summary. Writes are
atomic (temp file + rename), so the reader sees the old or the new file, never half of one.
"""

from __future__ import annotations

import json
import math
import os
import stat
import tempfile
from pathlib import Path

from horizonserve.runtime.config import ClassSummary, SloTable
from horizonserve.runtime.metrics import MetricsRecorder

STATS_FILE_ENV = "HORIZONSERVE_STATS_FILE"
DEFAULT_STATS_FILE = "/dev/shm/horizonserve/node-stats.json"


def stats_path() -> Path:
    return Path(os.environ.get(STATS_FILE_ENV, DEFAULT_STATS_FILE))


def class_summaries(recorder: MetricsRecorder, slo: SloTable, now: float) -> list[ClassSummary]:
    """One entry per configured class, in table order (zero counts for silent classes)."""
    snap = recorder.refresh_attainment(now)
    out = []
    for cls in slo.classes:
        ca = snap.get(cls.name)
        out.append(
            ClassSummary(
                name=cls.name,
                priority=cls.priority,
                requests=ca.requests if ca else 0,
                met=ca.met if ca else 0,
                p95_s=ca.p95_s if ca else None,
                target_s=slo.target_s(cls.name),
            )
        )
    return out


def write_stats(path: Path, classes: list[ClassSummary], window_s: float, unix_now: float) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    doc = {
        "timestamp": unix_now,
        "window_s": window_s,
        "classes": [c.model_dump(mode="json") for c in classes],
    }
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".stats-", suffix=".json")
    with os.fdopen(fd, "w") as f:
        json.dump(doc, f)
    os.replace(tmp, path)


MAX_STATS_BYTES = 1 << 20  # a larger file is not a stats file this code wrote


def read_stats(path: Path) -> tuple[list[ClassSummary], float, float] | None:
    """(classes, window_s, timestamp), or None when the serving process has not written yet.

    Raises ValueError (saying what is wrong) for a file that is not a valid stats file:
    unreadable, too large, not JSON, wrong shape, invalid class entries, non-finite numbers.
    """
    try:
        # Non-blocking, and only a regular file: a FIFO or device at the path never blocks.
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise ValueError(f"stats file {path}: {exc.strerror or exc}") from None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise ValueError(f"stats file {path}: not a regular file; remove it")
        with os.fdopen(fd, "rb", closefd=False) as f:
            raw = f.read(MAX_STATS_BYTES + 1)
    except OSError as exc:
        raise ValueError(f"stats file {path}: {exc.strerror or exc}") from None
    finally:
        os.close(fd)
    if len(raw) > MAX_STATS_BYTES:
        raise ValueError(f"stats file {path}: larger than {MAX_STATS_BYTES} bytes")
    try:
        doc = json.loads(raw)
        if not isinstance(doc, dict) or not isinstance(doc.get("classes"), list):
            raise ValueError("expected an object with a 'classes' list")
        classes = [ClassSummary.model_validate(c) for c in doc["classes"]]
        window_s, timestamp = float(doc["window_s"]), float(doc["timestamp"])
    except (ValueError, TypeError, KeyError, RecursionError) as exc:
        # pydantic's ValidationError and json's JSONDecodeError are ValueErrors
        raise ValueError(f"stats file {path}: {str(exc).splitlines()[0][:200]}") from None
    if not (math.isfinite(window_s) and window_s > 0 and math.isfinite(timestamp)):
        raise ValueError(f"stats file {path}: window_s / timestamp must be finite (window > 0)")
    return classes, window_s, timestamp
