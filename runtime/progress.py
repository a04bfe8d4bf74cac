"""Progress bars for the long commands (`bench`, `sim plan`): tqdm on stderr, opened lazily.

A bar is opened once its total is known (`start`) and advanced per finished unit (`step`);
`disable=True` (the commands' `--no-progress`) turns every call into a no-op.
"""

from __future__ import annotations

import sys
from typing import Any


class Progress:
    """One tqdm bar, created when the number of units is known."""

    def __init__(self, desc: str, unit: str, *, disable: bool = False) -> None:
        self.desc = desc
        self.unit = unit
        self.disable = disable
        self.bar: Any = None

    def start(self, total: int) -> None:
        from tqdm import tqdm

        self.bar = tqdm(
            total=total, desc=self.desc, unit=self.unit, disable=self.disable, leave=False
        )

    def step(self, _done: object = None) -> None:
        if self.bar is not None:
            self.bar.update(1)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None


def phase(text: str, *, disable: bool = False) -> None:
    """A one-line note on stderr before a step whose length is not counted (e.g. solo runs)."""
    if not disable:
        print(text, file=sys.stderr, flush=True)
