"""Launching ranks: one node's ranks for the commands that run as ranks (scoring,
distillation), callable from the command line and from the library (``iterate`` runs its
stages through it), and the end of a rank (:func:`exit_rank`). Torch-free at import: torch
is imported when ranks are launched."""

from __future__ import annotations

import os
import signal
import sys
import threading
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from hwprofiles.errors import InputError

SHUTDOWN_TIMEOUT_S = 5
"""Seconds the ranks get to stop on a signal (their clean-up: temp files removed) before
they are SIGKILLed. Every output is written to a temp file and renamed, so a rank killed
mid-write leaves nothing half-written either."""

EXIT_PEER_LOST = 75
"""A rank's exit status when a collective failed because another rank is gone (it prints
nothing: the launcher names the rank that died)."""


class Terminated(BaseException):
    """Raised in the main thread on SIGTERM, so that ``finally`` / ``except BaseException``
    clean-ups run (temp files and staged folders are removed) as they do on Ctrl-C (the
    CLI's handler raises it; so does :func:`run_ranks` once its ranks are stopped; also
    ``nas.cli.Terminated``)."""


class RanksFailed(InputError):
    """A rank died without a word (killed by a signal): :func:`run_ranks` says which, in
    one line; the CLI prints it and exits with ``exit_code`` (not bad input, but reported
    the same way)."""

    exit_code: int = 1


def _quiet_elastic() -> dict[str, int]:
    """Silence torch.distributed.elastic's loggers (each sets its own level: its progress
    and shutdown messages would go to the user's stderr); returns the old levels."""
    import logging

    old = {}
    for name, lg in list(logging.Logger.manager.loggerDict.items()):
        if isinstance(lg, logging.Logger) and name.startswith(
                ("torch.distributed.elastic", "torch.distributed.launcher")):
            old[name] = lg.level
            lg.setLevel(logging.CRITICAL + 1)
    return old


@contextmanager
def _launching() -> Iterator[None]:
    """The process state a launch changes, put back after it: the signal handlers (the
    elastic agent installs its own and leaves them), ``OMP_NUM_THREADS`` (1 unless set:
    the ranks share the cores) and torch's ``TORCHELASTIC_SIGNALS_TO_HANDLE``."""
    sigs = (signal.SIGINT, signal.SIGTERM)
    main = threading.current_thread() is threading.main_thread()
    handlers = {s: signal.getsignal(s) for s in sigs} if main else {}
    env = {k: os.environ.get(k) for k in ("OMP_NUM_THREADS", "TORCHELASTIC_SIGNALS_TO_HANDLE")}
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    try:
        yield
    finally:
        for k, v in env.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        for s, h in handlers.items():
            signal.signal(s, h)


def _cause(failures: Mapping[int, Any]) -> tuple[int, Any]:
    """The failure to report: a rank killed by a signal before one that exited on its own
    (the others are its consequence), one that lost a peer last; the earliest, then the
    lowest rank."""
    def order(item: tuple[int, Any]) -> tuple[int, float, int]:
        rank, f = item
        code = f.exitcode
        kind = 0 if code < 0 else 2 if code == EXIT_PEER_LOST else 1
        return kind, f.timestamp, rank
    return min(failures.items(), key=order)


def run_ranks(module: str, nproc: int, argv: list[str]) -> int:
    """Run ``python -m module *argv`` as ``nproc`` ranks on this node, with torch's elastic
    agent in this process (the launcher ``torchrun --standalone`` runs), and return 0 once
    every rank has ended well.

    The ranks never outlive the call: SIGINT or SIGTERM stops them (each gets the same
    signal, then SIGKILL after :data:`SHUTDOWN_TIMEOUT_S` seconds) and is raised here as
    KeyboardInterrupt or :class:`Terminated` once they are gone; a rank that dies stops
    the others. A rank killed by a signal raises :class:`RanksFailed`, one line naming it
    and its signal; a rank that exits non-zero on its own (it printed why) gives its exit
    status. The ranks see ``OMP_NUM_THREADS=1`` unless it is set."""
    import logging
    import tempfile
    import uuid

    from torch.distributed.elastic.multiprocessing import DefaultLogsSpecs, SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.launcher.api import LaunchConfig, launch_agent

    with tempfile.TemporaryDirectory(prefix="puzzle-nas-ranks-") as logs, _launching():
        config = LaunchConfig(
            min_nodes=1, max_nodes=1, nproc_per_node=nproc, run_id=str(uuid.uuid4()),
            rdzv_backend="c10d", rdzv_endpoint="localhost:0", max_restarts=0,
            monitor_interval=0.1, logs_specs=DefaultLogsSpecs(log_dir=logs),
            signals_to_handle="SIGTERM,SIGINT", shutdown_timeout=SHUTDOWN_TIMEOUT_S)
        old = _quiet_elastic()
        try:
            launch_agent(config, sys.executable, ["-u", "-m", module, *argv])
        except SignalException as exc:
            if exc.sigval == signal.SIGINT:
                raise KeyboardInterrupt from None
            raise Terminated from None
        except ChildFailedError as exc:
            rank, f = _cause(exc.failures)
            code = f.exitcode
            if code == EXIT_PEER_LOST:
                raise RanksFailed(f"rank {rank} of {nproc} lost contact with another rank "
                                  "(a collective failed); rerun the same command to "
                                  "resume") from None
            if code > 0:
                return code
            try:
                how = f"was killed by {signal.Signals(-code).name}"
            except ValueError:
                how = f"ended with status {code}"
            pid = f.pid
            raise RanksFailed(f"rank {rank} of {nproc} (pid {pid}) {how}; the other ranks were "
                              "stopped, and every output is as it was or complete: rerun the "
                              "same command to resume") from None
        finally:
            for name, level in old.items():
                logging.getLogger(name).setLevel(level)
    return 0


MMAP_THRESHOLD = 1 << 20
"""Bytes from which glibc's ``malloc`` maps an allocation on its own and returns it to the
system when it is freed (:func:`unpool_large_allocations`)."""

HOLDS_A_MODEL = ("score", "distill", "iterate")
"""The commands whose processes hold a parent (or its share): the CLI calls
:func:`unpool_large_allocations` for them, and every rank does."""


def unpool_large_allocations() -> bool:
    """Make glibc return every freed allocation of at least :data:`MMAP_THRESHOLD` bytes to
    the system at once (``mallopt(M_MMAP_THRESHOLD)`` and ``M_TRIM_THRESHOLD``); returns
    whether it could (False off glibc: nothing changes).

    By default glibc raises its mapping threshold to the size of the largest block freed so
    far (up to 32 MiB), so that after the first large tensor is freed, activations, logits
    and weight copies of up to 32 MiB come from the heap, whose freed space is kept, in
    pieces, instead of given back. In ``score`` on a 2.3 GB fp32 parent (``bench_scoring``)
    that kept 80-140 MiB per process at the peak: 2,860 -> 2,783 MiB in one process and
    1,916 -> 1,779 MiB on the larger of 2 ranks, at the same speed (scoring 141.4 vs
    143.9 s, 102.2 vs 102.4 s). Process-wide, so the library leaves it to the caller: the
    CLI sets it for :data:`HOLDS_A_MODEL`, and every rank sets it."""
    import ctypes
    import ctypes.util

    name = ctypes.util.find_library("c")
    if name is None:
        return False
    try:
        libc = ctypes.CDLL(name)
        mallopt = libc.mallopt
    except (OSError, AttributeError):  # not glibc (musl has no mallopt; macOS, Windows)
        return False
    m_trim_threshold, m_mmap_threshold = -1, -3  # glibc's malloc.h
    return bool(mallopt(m_mmap_threshold, MMAP_THRESHOLD)) and \
        bool(mallopt(m_trim_threshold, MMAP_THRESHOLD))


def exit_rank(rc: int) -> None:
    """End a torchrun rank once every rank is done (a barrier), without the interpreter's
    teardown: left to it, gloo's threads can be destroyed while joinable and a rank whose
    work is complete aborts ("terminate called without an active exception", SIGABRT; seen
    in distillation twice in 8 full suites, and once in a 2-rank sharded scoring run). Every
    output is written (atomically) before this point; a failed rank leaves at once (torchrun
    stops the others)."""
    # looked up, not imported: a rank stopped by a signal while importing torch holds a
    # half-imported torch, which a second import breaks with a traceback
    dist = sys.modules.get("torch.distributed")
    if rc == 0 and dist is not None and dist.is_available() and dist.is_initialized():
        try:
            dist.barrier()
        except RuntimeError:
            pass
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(rc)
