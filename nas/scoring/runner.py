"""The scoring job: spec + parent checkpoint + tokens -> ``scores.csv`` and friends.

One process or many: under ``torchrun`` (``WORLD_SIZE`` set) the (block, alternative)
items are shared out to the ranks over ``torch.distributed`` (gloo on CPU, nccl on
CUDA); each rank commits its results to its own SQLite file, and rank 0, after a barrier,
merges every rank's rows and writes the outputs. Results are keyed by content
(:func:`nas.scoring.core.make_items`), so a rerun, with any number of ranks, skips
finished work and recomputes only what is missing.

Files in the output folder: ``scores.csv`` (one row per block x alternative, the parent's
rows 0), ``scores.png``, ``scores.json`` (:class:`RunRecord`), ``scores.sqlite`` (merged
store), ``store/rank-<r>.sqlite`` (per-rank stores), ``blocks/`` (BLD-trained blocks and
``index.json``), and, while running, ``cache/`` (the spilled part of the prefix cache).
"""

from __future__ import annotations

import datetime
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from pydantic import BaseModel, ConfigDict

from hwprofiles.errors import InputError
from nas.arch import ModelArch
from nas.child import load_pretrained
from nas.io import atomic_write_json
from nas.progress import Progress
from nas.scoring import bld
from nas.scoring.core import VERSION, Item, Scorer, make_items, weights_digest
from nas.scoring.digest import record_digest, recorded_digest
from nas.scoring.job import Job, Settings, prepare  # noqa: F401  (re-exported)
from nas.scoring.report import plot_heatmap, summary_lines, write_csv
from nas.scoring.store import ScoreRow, Store, read_all

KILL_ENV = "PUZZLE_NAS_SCORE_KILL_AFTER"  # fault injection for tests: SIGKILL mid-item


class RunRecord(BaseModel):
    """``scores.json``: what a scoring run measured, on what, and how."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    version: str
    spec: str
    parent: str
    parent_weights: str
    data: str
    data_sha256: str
    settings: dict[str, Any]
    calib_rows: int
    held_rows: int
    held_tokens_scored: int
    alternatives: int
    scored_now: int
    reused: int
    world_size: int
    cache: dict[str, float]
    """Rank 0's prefix cache: bytes in memory and spilled to disk, batches in each, and
    ``teacher_target_bytes``, the held-out teacher target it keeps (the parent's last
    hidden state in the compute dtype, :mod:`nas.scoring.cache`). Empty when nothing was
    left to score."""
    seconds: float
    most_sensitive: list[dict[str, Any]]
    summary: list[str]
    parent_left_out: str | None = None
    """What the parent checkpoint holds that is not read, and why (e.g. a wrapper's vision
    tower): :attr:`nas.child.checkpoint.CheckpointReader.left_out_note`, as ``puzzle-nas
    build`` reports it; ``None`` when every tensor is read."""
    scoring_seconds: float | None = None
    """Seconds of the scoring phase on rank 0 (after the parent is loaded and its prefix
    cache filled; ``None`` when nothing was left to score)."""
    stages: list[dict[str, Any]] | None = None
    """A sharded run's ranks (:mod:`nas.scoring.pipeline`): each one's blocks ``[a, b)``,
    the parameter and buffer elements it held, its peak resident memory (bytes) and its
    prefix-cache figures (:attr:`cache`; ``teacher_target_bytes`` is 0 on the ranks that
    keep no teacher target); ``None`` on one rank or with replicas."""


def rank_and_world() -> tuple[int, int]:
    """This process's (rank, world size): ``(0, 1)`` outside a torch.distributed group."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def init_distributed(device: str) -> tuple[int, int, str]:
    """Join the torchrun group when launched by torchrun (gloo on CPU, nccl on CUDA);
    returns (rank, world size, device)."""
    if int(os.environ.get("WORLD_SIZE", "1")) > 1 and not dist.is_initialized():
        backend = "nccl" if device.startswith("cuda") else "gloo"
        dist.init_process_group(backend, timeout=datetime.timedelta(hours=12))
    rank, world = rank_and_world()
    if device == "cuda":
        device = f"cuda:{int(os.environ.get('LOCAL_RANK', '0'))}"
    return rank, world, device


def shard(parent: ModelArch, items: list[Item], world: int) -> list[list[Item]]:
    """Items per rank, balanced by estimated cost (longest first to the least loaded rank;
    the same on every rank). An item of block ``i`` runs parent blocks ``i+1..L-1`` and the
    LM head on every held-out token, so its cost is taken as their parameters plus the
    replaced block's."""
    bp = parent.block_params(active=True).astype(float)
    tail = np.concatenate([np.cumsum(bp[::-1])[::-1][1:], [0.0]])
    head = float(parent.hidden_size * parent.vocab_size)
    cost = [tail[it.block] + head + float(bp[it.block]) for it in items]
    order = sorted(range(len(items)), key=lambda k: (-cost[k], k))
    load = [0.0] * world
    out: list[list[int]] = [[] for _ in range(world)]
    for k in order:
        r = min(range(world), key=lambda j: (load[j], j))
        out[r].append(k)
        load[r] += cost[k]
    return [[items[k] for k in sorted(ks)] for ks in out]


def _rows(job: Job, items: list[Item], results: dict[str, ScoreRow], tokens: int
          ) -> list[dict[str, Any]]:
    by_key = {it.alt: it.key for it in items}
    out = []
    for block_alts in job.alts:
        for a in block_alts:
            pk = job.parent_arch.blocks[a.block].kind
            if a.is_parent:
                out.append({"block": a.block, "alternative": a.label, "parent_kind": pk,
                            "kind": a.child.kind, "kl_div": 0.0, "lm_loss_delta": 0.0,
                            "top1_agreement": 1.0, "tokens": tokens, "bld_steps": 0,
                            "bld_loss": None, "seconds": 0.0})
                continue
            r = results[by_key[a]]
            out.append({"block": a.block, "alternative": a.label, "parent_kind": pk,
                        "kind": a.child.kind, "kl_div": r.kl_div,
                        "lm_loss_delta": r.lm_loss_delta, "top1_agreement": r.top1_agreement,
                        "tokens": r.tokens, "bld_steps": r.bld_steps, "bld_loss": r.bld_loss,
                        "kl_before_bld": r.kl_before_bld, "bld_kept": r.bld_kept,
                        "seconds": r.seconds})
    return out


def run(job: Job, out_dir: str | Path, *, cache_bytes: float = 4 * 2**30,
        device: str = "cpu", cached: bool = True, progress: bool | None = None,
        log: Any = None, replicas: bool = False) -> RunRecord | None:
    """Score every alternative of ``job`` (this rank's share); on rank 0 merge and write
    the outputs and return the :class:`RunRecord` (``None`` on other ranks).

    Under torchrun with more than one rank the parent is sharded over the ranks as
    pipeline stages (:mod:`nas.scoring.pipeline`); ``replicas=True`` loads the whole parent
    on every rank instead and shares the alternatives out (data parallelism, for a parent
    that fits one rank)."""
    t0 = time.perf_counter()
    log = log if log is not None else (lambda s: print(s, file=sys.stderr))
    rank, world, device = init_distributed(device)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    left_out = job.reader().left_out_note
    dtype = None if job.settings.dtype is None else getattr(torch, job.settings.dtype)
    if world > 1 and not replicas:
        if not cached:
            raise InputError("--naive runs every alternative through the whole parent on "
                             "one rank: with --nproc N > 1 add --replicas")
        return _run_sharded(job, out, t0, rank, world, device, dtype, cache_bytes, progress,
                            log, left_out)
    dname = job.settings.dtype or "stored"
    phash = recorded_digest(out, job.parent_dir, dname)
    parent = None
    if phash is None:  # (a resume with unchanged parent files neither reads nor hashes it)
        parent = load_pretrained(job.reader(), dtype=dtype).to(device).eval()
        phash = weights_digest(parent)
    if rank == 0:  # beside the run too when this machine's cache had it
        record_digest(out, job.parent_dir, dname, phash)
    items = make_items(job.parent_arch, job.alts, phash, job.split.digest, job.settings,
                       base_recipe=job.base_recipe)
    keys = [it.key for it in items]
    done = read_all(out, keys)
    mine = shard(job.parent_arch, items, world)[rank]
    todo = [it for it in mine if it.key not in done]
    kill_after = int(os.environ.get(KILL_ENV, "-1"))
    stats: dict[str, float] = {}
    scoring_s = None
    tokens = job.split.held[:, 1:].size
    if todo:
        if parent is None:
            parent = load_pretrained(job.reader(), dtype=dtype).to(device).eval()
        scorer = Scorer(parent, job.split, job.settings, cache_bytes=cache_bytes,
                        spill_dir=out / "cache" / f"rank-{rank}", cached=cached)
        stats = _with_target(scorer, len(parent.blocks))
        tokens = scorer.tokens
        _log_spill(rank, stats, out, log)
        store = Store(out / "store" / f"rank-{rank}.sqlite")
        label = f"scoring r{rank}/{world}" if world > 1 else "scoring"
        with Progress(len(todo), label, progress if rank == 0 else False) as bar:
            t1 = time.perf_counter()
            for n, it in enumerate(todo):
                res, block = scorer.score(it)
                _commit(store, out, it, res, block, phash, kill=n == kill_after)
                bar.update(1, f"block {it.block} {it.alt.label[:28]}")  # the bar has the ETA
            scoring_s = time.perf_counter() - t1
        store.close()
        scorer.close()
    if world > 1:
        dist.barrier()
    if rank != 0:
        return None
    return _outputs(job, out, items, len(done), phash, tokens, stats, world, t0, left_out,
                    log, scoring_s=scoring_s)


def _with_target(scorer: Scorer, num_blocks: int) -> dict[str, float]:
    """``scorer``'s prefix-cache figures, with the bytes of the held-out teacher target
    (boundary ``h<L>``, the last block's output) that it keeps."""
    stats = dict(scorer.cache_stats)
    stats["teacher_target_bytes"] = float(scorer.held_cache.tensor_bytes(f"h{num_blocks}"))
    return stats


def _log_spill(rank: int, stats: dict[str, float], out: Path, log: Any) -> None:
    if rank == 0 and stats["batches_on_disk"]:
        log(f"prefix cache: {stats['memory_bytes'] / 1e9:.3f} GB in memory, "
            f"{stats['disk_bytes'] / 1e9:.3f} GB spilled to {out / 'cache'} "
            f"(over --cache-gib)")


def _commit(store: Store, out: Path, it: Item, res: dict[str, Any], block: Any, phash: str,
            kill: bool = False) -> None:
    """Save ``it``'s BLD-trained block (when trained) and commit its row to ``store``."""
    bld_file = None
    if res["bld_steps"] and it.alt.end is None:  # (trained spans are not kept)
        bld_file = f"{it.key[:32]}.safetensors"
        bld.save_block(out / "blocks" / bld_file, block, bld.BldMeta(
            key=it.key, block=it.block, alternative=it.alt.label,
            child=it.alt.child.model_dump(), parent_weights=phash,
            steps=res["bld_steps"], loss=res["bld_loss"], kept=res.get("bld_kept")))
    if kill:
        os.kill(os.getpid(), signal.SIGKILL)
    store.put(ScoreRow(key=it.key, block=it.block, alternative=it.alt.label,
                       kind=it.alt.child.kind, kl_div=res["kl_div"],
                       lm_loss_delta=res["lm_loss_delta"],
                       top1_agreement=res["top1_agreement"], tokens=res["tokens"],
                       bld_steps=res["bld_steps"], bld_loss=res["bld_loss"],
                       bld_file=bld_file, seconds=res["seconds"],
                       kl_before_bld=res.get("kl_before_bld"), bld_kept=res.get("bld_kept")))


def _run_sharded(job: Job, out: Path, t0: float, rank: int, world: int, device: str,
                 dtype: torch.dtype | None, cache_bytes: float, progress: bool | None,
                 log: Any, left_out: str | None) -> RunRecord | None:
    """:func:`run` with the parent sharded over the ranks (:mod:`nas.scoring.pipeline`)."""
    from nas.scoring.pipeline import PipelineScorer, Stage
    from nas.scoring.stages import placement, rank_ranges

    segments = placement(job.parent_arch, world, job.alts)
    side = dist.new_group(backend="gloo")
    dname = job.settings.dtype or "stored"
    box: list[Any] = [recorded_digest(out, job.parent_dir, dname) if rank == 0 else None]
    dist.broadcast_object_list(box, 0, group=side)
    phash = box[0]
    stage = None
    if phash is None:  # (a resume with unchanged parent files neither reads nor hashes it)
        stage = Stage(job.reader(), segments, rank, job.settings, dtype,
                      device, side)
        phash = stage.digest()
    if rank == 0:  # beside the run too when this machine's cache had it
        record_digest(out, job.parent_dir, dname, phash)
    items = make_items(job.parent_arch, job.alts, phash, job.split.digest, job.settings,
                       base_recipe=job.base_recipe)
    keys = [it.key for it in items]
    box = [sorted(read_all(out, keys)) if rank == 0 else None]
    dist.broadcast_object_list(box, 0, group=side)  # one view of what is done
    done = set(box[0])
    todo = [it for it in items if it.key not in done]
    kill_after = int(os.environ.get(KILL_ENV, "-1"))
    stats: dict[str, float] = {}
    scoring_s = None
    per_rank: list[Any] = [None] * world
    tokens = job.split.held[:, 1:].size
    held_elements = 0
    if todo:
        if stage is None:
            stage = Stage(job.reader(), segments, rank, job.settings,
                          dtype, device, side, hash_weights=False)
        held_elements = stage.held_elements
        scorer = PipelineScorer(stage, job.split, job.settings, cache_bytes=cache_bytes,
                                spill_dir=out / "cache" / f"rank-{rank}")
        stats, tokens = _with_target(scorer, stage.L), scorer.tokens
        _log_spill(rank, stats, out, log)
        store = Store(out / "store" / f"rank-{rank}.sqlite")
        count = [0]

        def commit(it: Item, res: dict[str, Any], block: Any) -> None:
            _commit(store, out, it, res, block, phash, kill=count[0] == kill_after)
            count[0] += 1

        with Progress(len(todo), f"scoring ({world} stages)",
                      progress if rank == 0 else False) as bar:
            t1 = time.perf_counter()
            scorer.run(todo, commit, bar)
            scoring_s = time.perf_counter() - t1
        store.close()
        scorer.close()
    import resource

    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux: KiB
    dist.all_gather_object(per_rank, {"blocks": [list(r) for r in rank_ranges(segments, rank)],
                                      "elements_held": held_elements,
                                      "peak_rss_bytes": peak, **stats}, group=side)
    dist.barrier(group=side)
    if rank != 0:
        return None
    return _outputs(job, out, items, len(done), phash, tokens, stats, world, t0, left_out,
                    log, stages=per_rank, scoring_s=scoring_s)


def _outputs(job: Job, out: Path, items: list[Item], reused: int, phash: str, tokens: int,
             stats: dict[str, float], world: int, t0: float, left_out: str | None,
             log: Any, stages: list[Any] | None = None, scoring_s: float | None = None
             ) -> RunRecord:
    """Rank 0, every rank finished: merge the stores and write the outputs."""
    keys = [it.key for it in items]
    results = read_all(out, keys)
    missing = [k for k in keys if k not in results]
    if missing:
        raise RuntimeError(f"{len(missing)} results missing after all ranks finished")
    with Store(out / "scores.sqlite") as merged:
        merged.put_many(results[k] for k in keys)
    rows = _rows(job, items, results, tokens)
    write_csv(out / "scores.csv", rows)
    metas, files = [], []
    for it in items:
        r = results[it.key]
        if r.bld_file:
            metas.append(bld.BldMeta(key=it.key, block=it.block, alternative=it.alt.label,
                                     child=it.alt.child.model_dump(), parent_weights=phash,
                                     steps=r.bld_steps, loss=r.bld_loss or 0.0,
                                     kept=r.bld_kept))
            files.append(r.bld_file)
    if metas:
        bld.write_index(out, phash, metas, files)
    title = (f"{job.spec.name}: replace-1-block KL"
             + (f" after {job.settings.bld_steps} BLD steps" if job.settings.bld_steps else ""))
    png = plot_heatmap(out / "scores.png", rows, title)
    if png is None:
        log("scores.png not written (matplotlib is not installed: pip install "
            "'puzzle-nas[plot]')")
    from nas.scoring.report import sensitivity

    sens = [{"block": b, "kind": k, "kl_div": v, "alternative": a}
            for b, k, v, a in sensitivity(rows)]
    record = RunRecord(
        version=VERSION, spec=str(job.spec_path), parent=str(job.parent_dir),
        parent_weights=phash, data=job.split.source, data_sha256=job.split.digest,
        settings=job.settings.model_dump(), calib_rows=len(job.split.calib),
        held_rows=len(job.split.held), held_tokens_scored=tokens, alternatives=len(items),
        scored_now=len(items) - reused, reused=reused, world_size=world, cache=stats,
        seconds=time.perf_counter() - t0, most_sensitive=sens[:5],
        summary=summary_lines(rows), parent_left_out=left_out, stages=stages,
        scoring_seconds=scoring_s)
    atomic_write_json(out / "scores.json", record.model_dump())
    return record
