"""Measured quality: replace-1-block scoring with blockwise local distillation (torch).

* :mod:`nas.scoring.data` - token files (``.npy``, ``.bin``, text + ``tokenizer.json``);
* :mod:`nas.scoring.core` - per-block init from the parent, the three metrics;
* :mod:`nas.scoring.cache` - the parent's activations at every block boundary (bounded
  memory, spilled to disk);
* :mod:`nas.scoring.bld` - blockwise local distillation and assembling a child from the
  trained blocks;
* :mod:`nas.scoring.store` - the resumable SQLite store;
* :mod:`nas.scoring.job` - the inputs, checked without torch;
* :mod:`nas.scoring.runner` - the job, one process or sharded under ``torchrun``.

From Python::

    from nas.scoring import Settings, prepare, run
    job = prepare("spec.json", "parent/", "tokens.npy", Settings(seq_len=256))
    record = run(job, "scores/")            # scores/scores.csv, scores.png, scores.json

The command line is ``puzzle-nas score`` (``--nproc N`` runs ``torchrun -m nas.cli.score``).
"""

from importlib import import_module
from typing import Any

_LAZY = {"METRICS": "core", "init_block": "core", "weights_digest": "core",
         "Settings": "job", "prepare": "job", "RunRecord": "runner", "run": "runner"}
__all__ = sorted(_LAZY)


def __getattr__(name: str) -> Any:  # lazy: nas.scoring.job / data / store need no torch
    if name in _LAZY:
        return getattr(import_module(f"nas.scoring.{_LAZY[name]}"), name)
    raise AttributeError(f"module 'nas.scoring' has no attribute {name!r}")
