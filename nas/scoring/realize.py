"""Realize a search's children and measure them: the sum of block scores is an estimate.

The MIP maximizes the sum of replace-1-block scores. Blocks that are each harmless alone
compound when removed together (on SmolLM2-135M the sum of a child's block KLs was 1.22
and the assembled child's KL to the parent 3.38), so the child that the sum ranks first
need not be the best. :func:`realize` builds every child of a search's pool
(``blueprint.json``, ``blueprint-2.json``, ...: the ``solver.diverse`` solutions), each
from the parent (from the BLD-trained blocks of ``score_dir`` where the scoring run trained
them, else initialized from the parent by ``nas.child``'s rules), measures its held-out KL
to the parent (``nas.train.distill.evaluate``: KL, LM loss, next-token accuracy, top-1
agreement) and writes ``realized.json`` (:class:`RealizeRecord`) beside them: the
measurement beside the additive prediction, Spearman's rank correlation of the two, and the
child with the lowest measured KL (``chosen``), which ``blueprint-realized.json`` copies.

Needs torch. ``puzzle-nas search SPEC --realize DATA`` runs it after a search.
"""

from __future__ import annotations

import json
import math
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from hwprofiles.errors import InputError

FORMAT: Literal["puzzle-nas/realized"] = "puzzle-nas/realized"


class RealizedChild(BaseModel):
    """One realized child of a pool."""

    model_config = ConfigDict(extra="forbid")

    file: str = Field(description="its blueprint file, in the search folder")
    pool_rank: int = Field(description="its place in the MIP's pool (0: the MIP's first)")
    predicted: float = Field(description="the additive prediction: the blueprint's quality "
                             "value (sum of its blocks' scores)")
    params: int = Field(description="stored parameters of the child")
    init: str = Field(description="bld (blocks from the scoring run) or parent (nas.child "
                      "rules)")
    measured: dict[str, float] = Field(description="held-out figures against the parent: "
                                       "kl_div and lm_loss (nats), accuracy, top1_agreement")


class RealizeRecord(BaseModel):
    """``realized.json``: every child of a pool, predicted and measured."""

    model_config = ConfigDict(extra="forbid")

    format: Literal["puzzle-nas/realized"] = FORMAT
    version: Literal[1] = 1
    metric: str = Field(description="the spec's quality metric (what ``predicted`` sums)")
    data: str = Field(description="where the held-out tokens came from")
    tokens: int = Field(description="held-out tokens each child was measured on")
    seq_len: int
    children: list[RealizedChild]
    spearman: float | None = Field(description="Spearman's rank correlation of predicted "
                                   "and measured KL over the pool (None below 3 children)")
    chosen: str = Field(description="blueprint file of the child with the lowest measured KL")
    seconds: float


def pool_files(search_dir: str | Path) -> list[Path]:
    """The blueprints of a search folder in pool order: ``blueprint.json``, then
    ``blueprint-2.json``, ``blueprint-3.json``, ..."""
    d = Path(search_dir)
    first = d / "blueprint.json"
    if not first.is_file():
        raise InputError("no blueprint.json: not a search output folder", path=str(d))
    rest = [f for f in d.glob("blueprint-*.json") if f.stem.split("-", 1)[1].isdigit()]
    return [first, *sorted(rest, key=lambda f: int(f.stem.split("-", 1)[1]))]


def spearman(a: list[float], b: list[float]) -> float | None:
    """Spearman's rank correlation (scipy, ties averaged); None below 3 points or when a
    side is constant."""
    if len(a) < 3:
        return None
    from scipy.stats import spearmanr

    r = float(spearmanr(a, b).statistic)
    return r if math.isfinite(r) else None


def _has_bld(score_dir: Path | None) -> bool:
    return score_dir is not None and (score_dir / "blocks" / "index.json").is_file()


def realize(search_dir: str | Path, parent_dir: str | Path, tokens: np.ndarray,
            score_dir: str | Path | None = None, *, seq_len: int = 256, batch: int = 8,
            calib: np.ndarray | None = None, data_source: str = "",
            log: Callable[[str], None] | None = None) -> RealizeRecord:
    """Build and measure every child of ``search_dir``'s pool against the parent
    ``parent_dir`` (a checkpoint folder) on ``tokens`` (1-D ids, held out from whatever the
    scores were computed on where possible), write ``realized.json`` and
    ``blueprint-realized.json`` (the chosen child's blueprint) into ``search_dir``, and
    return the record. ``score_dir``: a scoring run's folder whose BLD blocks build the
    children (None: init from the parent by ``nas.child``'s rules, calibrated on ``calib``,
    1-D ids, default the first 8 rows of ``tokens``). The children are not kept:
    ``puzzle-nas build blueprint-realized.json`` makes the chosen one."""
    import torch

    from nas.child import init_from_parent, load_pretrained
    from nas.hf import from_hf
    from nas.scoring.bld import assemble_child
    from nas.train.distill import evaluate

    t0 = time.perf_counter()
    say = log if log is not None else (lambda s: print(s, file=sys.stderr))
    d = Path(search_dir)
    files = pool_files(d)
    sd = Path(score_dir) if score_dir is not None else None
    ids = np.asarray(tokens).reshape(-1)
    n_rows = len(ids) // seq_len
    if n_rows < 1:
        raise InputError(f"{len(ids)} tokens: fewer than one row of {seq_len}",
                         field="--realize")
    parent = load_pretrained(parent_dir).eval()
    if int(ids.max()) >= parent.arch.vocab_size or int(ids.min()) < 0:
        raise InputError(f"token ids must lie in [0, {parent.arch.vocab_size}) (the parent's "
                         "vocabulary)", field="--realize")
    rows = torch.as_tensor(ids[: n_rows * seq_len].astype(np.int64)).reshape(n_rows, seq_len)
    cal = rows[:8] if calib is None else torch.as_tensor(
        np.asarray(calib).reshape(-1).astype(np.int64))
    bld = _has_bld(sd)
    kids: list[RealizedChild] = []
    for k, f in enumerate(files):
        bp = json.loads(f.read_text())
        arch = from_hf(bp["child"], source=str(f))
        if bld:
            assert sd is not None
            child = assemble_child(arch, parent, sd)
        else:
            child = init_from_parent(arch, parent, cal)
        child.eval()
        with torch.no_grad():
            m = evaluate(child, parent, rows, batch=batch)
        kids.append(RealizedChild(file=f.name, pool_rank=k,
                                  predicted=float(bp["quality"]["value"]),
                                  params=int(child.num_stored()), init="bld" if bld else "parent",
                                  measured={key: float(v) for key, v in m.items()}))
        say(f"realized {k + 1}/{len(files)} {f.name}: predicted {kids[-1].predicted:.4g}, "
            f"measured KL {m['kl_div']:.4g}")
        del child
    best = min(kids, key=lambda c: (c.measured["kl_div"], c.pool_rank))
    first = json.loads(files[0].read_text())
    rec = RealizeRecord(
        metric=str(first["quality"].get("source", "")), data=data_source,
        tokens=n_rows * seq_len, seq_len=seq_len, children=kids,
        spearman=spearman([c.predicted for c in kids], [c.measured["kl_div"] for c in kids]),
        chosen=best.file, seconds=time.perf_counter() - t0)
    for name, text in (("blueprint-realized.json", (d / best.file).read_text()),
                       ("realized.json", rec.model_dump_json(indent=1) + "\n")):
        tmp = d / (name + ".tmp")
        tmp.write_text(text)
        os.replace(tmp, d / name)
    return rec


def summary(rec: RealizeRecord) -> list[str]:
    """Lines for a terminal: each child's prediction and measurement, the rank agreement and
    the choice."""
    out = [f"{'blueprint':<22} {'predicted':>10} {'measured KL':>12} {'LM loss':>9}"]
    for c in rec.children:
        mark = "  <- chosen" if c.file == rec.chosen else ""
        out.append(f"{c.file:<22} {c.predicted:>10.4g} {c.measured['kl_div']:>12.4g} "
                   f"{c.measured['lm_loss']:>9.4f}{mark}")
    rho = "n/a (under 3 children)" if rec.spearman is None else f"{rec.spearman:.3f}"
    out.append(f"Spearman(predicted, measured) over {len(rec.children)} children: {rho}; "
               f"measured on {rec.tokens:,} tokens")
    return out


def load_record(search_dir: str | Path) -> RealizeRecord:
    """Read ``realized.json`` of a search folder."""
    from hwprofiles.errors import read_json

    path = Path(search_dir) / "realized.json"
    return RealizeRecord.model_validate(read_json(path))


__all__ = ["FORMAT", "RealizeRecord", "RealizedChild", "load_record", "pool_files", "realize",
           "spearman", "summary"]
