"""A minimal progress bar on stderr (no extra dependency); silent when stderr is not a TTY
unless ``force`` is set."""

from __future__ import annotations

import sys
import time
from collections.abc import Iterable, Iterator
from typing import TypeVar

T = TypeVar("T")


class Progress:
    """``with Progress(total, "pricing") as p: ... p.update(n)``; prints to stderr."""

    def __init__(self, total: int, label: str, enabled: bool | None = None, width: int = 30):
        self.total = max(int(total), 1)
        self.label = label
        self.done = 0
        self.width = width
        self.enabled = sys.stderr.isatty() if enabled is None else enabled
        self.start = time.perf_counter()

    def update(self, n: int = 1, note: str = "") -> None:
        self.done = min(self.done + n, self.total)
        if not self.enabled:
            return
        frac = self.done / self.total
        bar = "#" * int(frac * self.width)
        el = time.perf_counter() - self.start
        sys.stderr.write(
            f"\r{self.label:<12} [{bar:<{self.width}}] {self.done}/{self.total} {el:6.1f}s {note}"
        )
        sys.stderr.flush()

    def __enter__(self) -> Progress:
        self.update(0)
        return self

    def __exit__(self, *exc: object) -> None:
        if self.enabled:
            sys.stderr.write("\n")
            sys.stderr.flush()


def progress(items: Iterable[T], total: int, label: str, enabled: bool | None = None
             ) -> Iterator[T]:
    """Iterate ``items`` with a progress bar."""
    with Progress(total, label, enabled) as p:
        for item in items:
            yield item
            p.update(1)
