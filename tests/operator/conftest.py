"""Operator tests: fast settings for the handlers (read when handlers.py is first imported)."""

from __future__ import annotations

import os
from pathlib import Path

os.environ.setdefault("HORIZONSERVE_STATUS_INTERVAL", "1")
os.environ.setdefault("HORIZONSERVE_RESYNC_INTERVAL", "1")
# The test images come from registry.example (tests/operator/data) and the default image's
# docker.io: the chart's registry allowlist, as a test install would set it.
os.environ.setdefault("HORIZONSERVE_ALLOWED_REGISTRIES", "docker.io,registry.example")

DATA = Path(__file__).resolve().parent / "data"
