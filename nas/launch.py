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
