"""Launching ranks: one node's ``torchrun`` for the commands that run as ranks (scoring,
distillation), callable from the command line and from the library (``iterate`` runs its
stages through it). Torch-free: torchrun is a child process."""

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
