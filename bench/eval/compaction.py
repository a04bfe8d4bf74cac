"""Storing a finished campaign session small: its gzip members as one xz stream, its step
traces' floats at the clock's nanosecond (`python bench/eval/campaign.py compact`).

The readers (`horizonserve.runtime.calibrate.records.read_members`) take either form, so this
is storage only: nothing here is needed to run, replay or fit a campaign. Invariants: the xz
copy holds the same bytes as the gzip members it replaces, checked before the original is
removed; a file is replaced through a temporary beside it, so a reader never sees half a file.
"""

from __future__ import annotations

import json
import lzma
from pathlib import Path
from typing import Any

from horizonserve.runtime.calibrate.records import _member_bytes, read_members


def compact_members(path: Path) -> int:
    """Replace the gzip members at `path` (`X.jsonl.gz`) by one xz stream of the same bytes
    (`X.jsonl.xz`, about a quarter smaller). For a finished session only: a run appends gzip
    members, and a truncated member is refused. Returns the bytes saved."""
    text = _member_bytes(path, whole=True)
    packed = lzma.compress(text, preset=9 | lzma.PRESET_EXTREME)
    if lzma.decompress(packed) != text:  # pragma: no cover - lzma's own guarantee
        raise RuntimeError(f"{path}: the xz copy does not read back the same")
    xz = path.with_suffix(".xz")
    _replace_bytes(xz, packed)
    saved = path.stat().st_size - len(packed)
    path.unlink()
    return saved


def rows_at_ns(rows: list[list[Any]]) -> list[list[Any]]:
    """A step trace's rows with every float rounded to 1 ns. Its floats are perf_counter
    readings and differences (the clock counts whole nanoseconds) and quantities derived from
    them or from NVML ratios; the digits below 1e-9 are float noise, and dropping them takes
    about 40 % off the compressed trace."""
    return [[round(x, 9) if isinstance(x, float) else x for x in row] for row in rows]


def steps_at_ns(path: Path) -> int:
    """Rewrite a finished session's compacted step trace (`steps.jsonl.xz`) with `rows_at_ns`;
    every other field unchanged. Returns the bytes saved (0 where already at 1 ns)."""
    lines = []
    for member in read_members(path.with_suffix(".gz")):
        member["rows"] = rows_at_ns(member["rows"])
        lines.append(json.dumps(member) + "\n")
    packed = lzma.compress("".join(lines).encode(), preset=9 | lzma.PRESET_EXTREME)
    saved = path.stat().st_size - len(packed)
    if saved > 0:
        _replace_bytes(path, packed)
    return max(saved, 0)


def _replace_bytes(path: Path, data: bytes) -> None:
    """Write `data` to `path` through a temporary beside it: a reader never sees half a file."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_bytes(data)
    tmp.replace(path)
