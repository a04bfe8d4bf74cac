"""Finished request records and step-trace rows the front process keeps, bounded in bytes.

A long-running server finishes millions of requests; each record (with its client id) and each
shared-stage trace row stays in memory only while the history's byte budget allows. The size
of an item is estimated once, when it is added (`sys.getsizeof` of the item and its strings),
so the bound holds within the estimate's accuracy, not to the byte.
"""

from __future__ import annotations

import sys
from collections import deque
from collections.abc import Callable, Iterator
from typing import Generic, TypeVar

T = TypeVar("T")


def tuple_bytes(row: tuple[object, ...]) -> int:
    """Approximate bytes of a flat tuple of scalars."""
    return sys.getsizeof(row) + sum(sys.getsizeof(v) for v in row)


class BoundedHistory(Generic[T]):
    """Oldest-first items whose estimated total size stays within `max_bytes` (and `max_items`).

    Invariant: `nbytes` is the sum of the sizes of the items held, and `nbytes <= max_bytes`
    after every `append` (an item larger than the whole budget is not kept at all).
    """

    __slots__ = ("_items", "_size_of", "max_bytes", "max_items", "nbytes")

    def __init__(self, max_bytes: int, size_of: Callable[[T], int], max_items: int = 0) -> None:
        self.max_bytes = max_bytes
        self.max_items = max_items  # 0: no count bound
        self.nbytes = 0
        self._size_of = size_of
        self._items: deque[tuple[int, T]] = deque()

    def append(self, item: T) -> None:
        size = self._size_of(item)
        if size > self.max_bytes:
            return
        items = self._items
        items.append((size, item))
        self.nbytes += size
        while self.nbytes > self.max_bytes or (self.max_items and len(items) > self.max_items):
            self.nbytes -= items.popleft()[0]

    def extend(self, items: list[T]) -> None:
        for item in items:
            self.append(item)

    def clear(self) -> None:
        self._items.clear()
        self.nbytes = 0

    def __len__(self) -> int:
        return len(self._items)

    def __iter__(self) -> Iterator[T]:
        return (item for _, item in list(self._items))

    def __getitem__(self, index: int) -> T:
        return self._items[index][1]
