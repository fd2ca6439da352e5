"""Launching ranks: one node's ``torchrun`` for the commands that run as ranks (scoring,
distillation), callable from the command line and from the library (``iterate`` runs its
stages through it), and the end of a rank (:func:`exit_rank`). Torch-free at import:
torchrun is a child process."""

from __future__ import annotations

import os
import subprocess
import sys


def run_ranks(module: str, nproc: int, argv: list[str]) -> int:
    """Run ``python -m module *argv`` as ``nproc`` ranks on this node under torchrun
    (``--standalone``; ``OMP_NUM_THREADS=1`` unless it is set); returns torchrun's exit
    status."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone",
           f"--nproc-per-node={nproc}", "-m", module, *argv]
    env = dict(os.environ)
    env.setdefault("OMP_NUM_THREADS", "1")
    return subprocess.call(cmd, env=env)


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
    import torch.distributed as dist

    if rc == 0 and dist.is_available() and dist.is_initialized():
        try:
            dist.barrier()
        except RuntimeError:
            pass
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(rc)
