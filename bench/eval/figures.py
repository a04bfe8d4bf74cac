"""Write a figure as a compact PNG. The committed plots travel with every device call, whose
working tree is capped in size, so each is stored as small as its pixels allow.

oxipng recompresses losslessly: the pixels are matplotlib's own, an alpha channel that is opaque
everywhere is dropped and the colour type and filters are chosen for size.
"""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import oxipng


def save_png(fig: Any, path: Path, dpi: int = 110) -> str:
    """Render `fig` at `dpi` into `path`; returns the file's name."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi)
    path.write_bytes(oxipng.optimize_from_memory(buf.getvalue(), level=2))
    return path.name
