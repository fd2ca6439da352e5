"""Progress on stderr (no extra dependency): a bar redrawn in place on a terminal, and, when
stderr is a file or a pipe (a background run's log), one plain line at most every
:data:`LOG_EVERY_S` seconds with the count, the rate and the time left."""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Iterable, Iterator
from typing import TypeVar

T = TypeVar("T")

LOG_EVERY_S = 60.0
"""Seconds between two progress lines in a log (stderr not a terminal): a run shorter than
that prints none, a longer one a line a minute and one when it ends. The environment
variable ``PUZZLE_NAS_LOG_EVERY`` (seconds) overrides it."""


def log_every_s() -> float:
    """:data:`LOG_EVERY_S`, or ``PUZZLE_NAS_LOG_EVERY`` where it is set to a number >= 0."""
    raw = os.environ.get("PUZZLE_NAS_LOG_EVERY")
    try:
        value = float(raw) if raw is not None else LOG_EVERY_S
    except ValueError:
        return LOG_EVERY_S
    return value if value >= 0 else LOG_EVERY_S


def _clock(seconds: float) -> str:
    s = int(round(seconds))
    return f"{s // 3600}:{s // 60 % 60:02d}:{s % 60:02d}"


def _rate(done: int, seconds: float) -> str:
    if done <= 0 or seconds <= 0:
        return "-"
    per = done / seconds
    return f"{per:.3g}/s" if per >= 1 else f"{seconds / done:.3g} s each"


class Progress:
    """``with Progress(total, "pricing") as p: ... p.update(n)``; prints to stderr.

    ``enabled``: True draws the bar, False prints nothing, None (the default) draws the bar
    on a terminal and writes log lines otherwise (at most one every ``log_every`` seconds:
    ``scoring: 12/300 (4 %), 36.1 s each, ETA 2:53:17``, and a last one at the end if any
    was written)."""

    def __init__(self, total: int, label: str, enabled: bool | None = None, width: int = 30,
                 log_every: float | None = None):
        self.total = max(int(total), 1)
        self.label = label
        self.done = 0
        self.width = width
        tty = sys.stderr.isatty()
        self.mode = ("bar" if tty else "log") if enabled is None else \
            "bar" if enabled else "off"
        self.enabled = self.mode == "bar"
        self.log_every = log_every if log_every is not None else log_every_s()
        self.start = time.perf_counter()
        self._last_line = self.start
        self.lines = 0
        """Log lines written so far."""
        self.skipped = 0
        """Items done before this run (a resume): counted, not in the rate."""

    def skip(self, n: int) -> None:
        """Count ``n`` items done earlier (a resumed run's): in the count, not the rate."""
        self.skipped += n
        self.update(n)

    def update(self, n: int = 1, note: str = "") -> None:
        self.done = min(self.done + n, self.total)
        if self.mode == "log":
            now = time.perf_counter()
            if n > 0 and now - self._last_line >= self.log_every:
                self._last_line = now
                self._line(now, note)
            return
        if self.mode != "bar":
            return
        frac = self.done / self.total
        bar = "#" * int(frac * self.width)
        el = time.perf_counter() - self.start
        sys.stderr.write(f"\r{self.label:<12} [{bar:<{self.width}}] {self.done}/{self.total} "
                         f"{el:6.1f}s ETA {self._eta(el)} {note}")
        sys.stderr.flush()

    def _eta(self, elapsed: float) -> str:
        """The time left at this run's rate (h:mm:ss), "-" before its first item."""
        now_done = self.done - self.skipped
        if now_done <= 0:
            return "-"
        return _clock((self.total - self.done) * elapsed / now_done)

    def _line(self, now: float, note: str = "", end: bool = False) -> None:
        el = now - self.start
        head = f"{self.label}: {self.done}/{self.total} ({100 * self.done / self.total:.0f} %)"
        if end:
            text = f"{head} in {_clock(el)}"
        else:
            text = f"{head}, {_rate(self.done - self.skipped, el)}, ETA {self._eta(el)}"
        sys.stderr.write(f"{text}{', ' + note.strip() if note.strip() else ''}\n")
        sys.stderr.flush()
        self.lines += 1

    def __enter__(self) -> Progress:
        self.update(0)
        return self

    def __exit__(self, *exc: object) -> None:
        if self.mode == "bar":
            sys.stderr.write("\n")
            sys.stderr.flush()
        elif self.mode == "log" and self.lines:
            self._line(time.perf_counter(), end=True)


def progress(items: Iterable[T], total: int, label: str, enabled: bool | None = None
             ) -> Iterator[T]:
    """Iterate ``items`` with a progress bar (log lines when stderr is not a terminal)."""
    with Progress(total, label, enabled) as p:
        for item in items:
            yield item
            p.update(1)
