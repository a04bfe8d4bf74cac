"""Where a node keeps its calibration artifacts, and which one fits this GPU."""

from __future__ import annotations

import gzip
import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class GpuInfo:
    name: str
    driver: str


def detect_gpu() -> GpuInfo | None:
    """The node's GPU through NVML, or None where there is none (or no NVML)."""
    try:
        import pynvml

        pynvml.nvmlInit()
        handle = pynvml.nvmlDeviceGetHandleByIndex(0)
        name = pynvml.nvmlDeviceGetName(handle)
        driver = pynvml.nvmlSystemGetDriverVersion()
    except Exception:  # ImportError, NVMLError: no usable GPU here
        return None
    return GpuInfo(name if isinstance(name, str) else name.decode(), str(driver))


def find_artifact(directory: Path, pipeline: str, model: str, gpu: GpuInfo) -> Path | None:
    """The newest artifact in `directory` for this pipeline's model on this GPU and driver."""
    from horizonserve.runtime.artifact import load_artifact

    matches = []
    for path in directory.glob("*.json"):
        try:
            art = load_artifact(path)
            entry = art.pipelines.get(pipeline)
        except (ValueError, OSError) as exc:
            log.warning("ignoring unreadable artifact %s: %s", path, exc)
            continue
        if (
            entry is not None
            and entry.model == model
            and art.gpu.name == gpu.name
            and art.gpu.driver == gpu.driver
        ):
            matches.append(path)
    return max(matches, key=lambda p: p.stat().st_mtime) if matches else None


def read_raw_log(path: Path | str) -> dict[str, Any]:
    """A calibration's raw log (JSON); a committed one may be gzipped (`….raw.log.gz`).

    Raises OSError, EOFError, UnicodeDecodeError or json.JSONDecodeError for an unreadable one.
    """
    path = Path(path)
    if path.suffix == ".gz":
        with gzip.open(path, "rt", encoding="utf-8") as f:
            return json.load(f)
    return json.loads(path.read_text())
