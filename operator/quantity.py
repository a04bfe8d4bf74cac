"""Kubernetes resource quantities ("500m", "8Gi", "1e3", 4) as exact numbers.

Only what the cross-field rules need: comparing a request with its limit, and a size with a
floor. The grammar is the one `models.QUANTITY_PATTERN` accepts (the CRD schema checks it).
"""

from __future__ import annotations

import re
from fractions import Fraction

_SUFFIX = {
    "n": Fraction(1, 10**9),
    "u": Fraction(1, 10**6),
    "m": Fraction(1, 1000),
    "": Fraction(1),
    "k": Fraction(10**3),
    "M": Fraction(10**6),
    "G": Fraction(10**9),
    "T": Fraction(10**12),
    "P": Fraction(10**15),
    "E": Fraction(10**18),
    **{s: Fraction(1024**i) for i, s in enumerate(("Ki", "Mi", "Gi", "Ti", "Pi", "Ei"), 1)},
}
_FORM = re.compile(r"^([+-]?(?:\d+(?:\.\d*)?|\.\d+))(?:[eE]([+-]?\d+)|([KMGTPE]i|[numkMGTPE])?)$")


def parse_quantity(value: int | str) -> Fraction:
    """The quantity's exact value; ValueError names what is wrong."""
    if isinstance(value, int):
        return Fraction(value)
    match = _FORM.match(value.strip())
    if match is None or (match.group(3) or "") not in _SUFFIX:
        raise ValueError(f"{value!r} is not a Kubernetes quantity (e.g. 500m, 8Gi, 4)")
    number, exponent, suffix = match.groups()
    scale = Fraction(10) ** int(exponent) if exponent else _SUFFIX[suffix or ""]
    return Fraction(number) * scale
