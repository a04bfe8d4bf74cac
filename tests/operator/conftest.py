"""Operator tests: fast settings for the handlers (read when handlers.py is first imported)."""

from __future__ import annotations

import os
from pathlib import Path

os.environ.setdefault("HORIZONSERVE_STATUS_INTERVAL", "1")
os.environ.setdefault("HORIZONSERVE_RESYNC_INTERVAL", "1")

DATA = Path(__file__).resolve().parent / "data"
