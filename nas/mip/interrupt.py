"""Ctrl-C and SIGTERM while HiGHS runs.

HiGHS calls Python callbacks while it runs (the MIP interrupt check, each improving
solution, the log). Python's own SIGINT handler raises ``KeyboardInterrupt`` at the next
bytecode the main thread runs, which during a run is a callback's; an exception raised
there is caught on HiGHS' C++ side, and the run ends as "interrupted" (a feasible child) or
"error": the caller saw a degraded answer, or an "internal solver error", never the Ctrl-C.
So, while a solve runs:

* :func:`deferred` (main thread; nested uses share the outermost) swaps the SIGINT and
  SIGTERM handlers for ones that only record the signal;
* the MIP interrupt callback asks HiGHS to stop as soon as one is recorded
  (:func:`pending`; every thread's runs see it), and the callbacks never let an exception
  out;
* after a run (and before the next) :func:`check` raises :class:`Interrupted`, so no
  further run starts and no result is made of the stopped one;
* at the exit of the outermost :func:`deferred` the handlers are put back and each recorded
  signal is handed to the handler that was there before: ``KeyboardInterrupt`` for SIGINT
  (by default), ``nas.cli.Terminated`` for SIGTERM under the CLI, the process ended for a
  default SIGTERM. The caller sees what it would have seen without HiGHS in between.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator
from types import FrameType
from typing import Any

from nas.io import deliver_signals

_SIGNALS = (signal.SIGINT, signal.SIGTERM)


class Interrupted(BaseException):
    """A recorded SIGINT / SIGTERM stops the solve (not an ``Exception``: nothing on the way
    may take it for a solver failure). The outermost :func:`deferred` turns it into the
    signal's own exception."""


class _State:
    lock = threading.Lock()
    depth = 0
    saved: dict[int, Any] = {}
    got: list[int] = []
    event = threading.Event()


def _record(signum: int, frame: FrameType | None) -> None:
    _State.got.append(signum)
    _State.event.set()


def pending() -> bool:
    """Whether a signal was recorded: the running solve is to stop (any thread may ask)."""
    return _State.event.is_set()


def check() -> None:
    """Raise :class:`Interrupted` when a signal was recorded."""
    if _State.event.is_set():
        raise Interrupted()


@contextlib.contextmanager
def deferred() -> Iterator[None]:
    """SIGINT / SIGTERM recorded instead of raised for the block, then delivered (see the
    module doc). Outside the main thread (where handlers cannot be set) it changes nothing:
    the main thread's own :func:`deferred` records for every thread."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    with _State.lock:
        _State.depth += 1
        if _State.depth == 1:
            _State.got = []
            _State.event.clear()
            _State.saved = {sig: signal.signal(sig, _record) for sig in _SIGNALS}
    outermost = _State.depth == 1
    try:
        yield
    except Interrupted:
        if not outermost:
            raise
        # delivered below (with nothing recorded, e.g. a stop asked for by code: Ctrl-C)
        if not _State.got:
            _State.got.append(signal.SIGINT)
    finally:
        with _State.lock:
            _State.depth -= 1
            sigs: list[int] = []
            saved: dict[int, Any] = {}
            if _State.depth == 0:
                saved = _State.saved
                for sig, handler in saved.items():
                    if handler is not None:  # None: set from C, cannot be put back
                        signal.signal(sig, handler)
                sigs, _State.got, _State.saved = list(_State.got), [], {}
                _State.event.clear()
        deliver_signals(sigs, saved)
