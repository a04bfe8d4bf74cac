"""Write a figure as a compact PNG. The committed plots travel with every device call, whose
working tree is capped in size, so each is stored as small as its pixels allow without a
dependency of its own (Pillow comes with matplotlib).

Lossless: the pixels are matplotlib's own. An alpha channel that is opaque everywhere is
dropped, a figure of at most 256 colours is stored as a palette image, and the deflate stream
is written at the highest level (`optimize`).
"""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image

PALETTE_MAX = 256  # a PNG palette holds at most this many colours


def compact(image: Image.Image) -> Image.Image:
    """The smallest lossless form of `image`: RGB where its alpha is opaque everywhere, a
    palette image where it has at most PALETTE_MAX colours. Pixels read back identical."""
    if image.mode == "RGBA" and image.getchannel("A").getextrema() == (255, 255):
        image = image.convert("RGB")
    if image.mode != "RGB":
        return image
    pixels = np.asarray(image).reshape(-1, 3)
    colours, index = np.unique(pixels, axis=0, return_inverse=True)
    if len(colours) > PALETTE_MAX:
        return image
    palette = Image.fromarray(index.reshape(image.height, image.width).astype(np.uint8), "P")
    palette.putpalette(colours.astype(np.uint8).ravel().tolist())
    return palette


def save_png(fig: Any, path: Path, dpi: int = 110) -> str:
    """Render `fig` at `dpi` into `path` (`compact`, deflate at its highest level); returns the
    file's name."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi)
    buf.seek(0)
    with Image.open(buf) as rendered:
        small = compact(rendered.copy())
    small.save(path, format="PNG", optimize=True)
    return path.name
