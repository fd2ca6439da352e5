"""Measured quality: replace-1-block scoring with blockwise local distillation (torch).

* :mod:`nas.scoring.data` - token files (``.npy``, ``.bin``, text + ``tokenizer.json``);
* :mod:`nas.scoring.core` - per-block init from the parent, the three metrics;
* :mod:`nas.scoring.cache` - the parent's activations at every block boundary (bounded
  memory, spilled to disk);
* :mod:`nas.scoring.bld` - blockwise local distillation and assembling a child from the
  trained blocks;
* :mod:`nas.scoring.store` - the resumable SQLite store;
* :mod:`nas.scoring.run` - the job, one process or sharded under ``torchrun``.

From Python::

    from nas.scoring import Settings, prepare, run
    job = prepare("spec.json", "parent/", "tokens.npy", Settings(seq_len=256))
    record = run(job, "scores/")            # scores/scores.csv, scores.png, scores.json

The command line is ``puzzle-nas score`` (``--nproc N`` runs ``torchrun -m nas.scoring``).
"""

from nas.scoring.core import METRICS, Settings, init_block, weights_digest
from nas.scoring.run import RunRecord, prepare, run

__all__ = ["METRICS", "RunRecord", "Settings", "init_block", "prepare", "run", "weights_digest"]
