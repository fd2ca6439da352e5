"""Iterative Puzzle: compress in stages, distilling and re-scoring between them (torch).

A spec's ``stages`` list budgets that tighten step by step (:class:`nas.spec.StageSpec`).
For each stage ``k`` (parent ``P_0`` = the original parent, ``P_k`` = stage ``k-1``'s
distilled child):

1. **score** every alternative of ``P_k`` (replace-1-block KL with BLD,
   :mod:`nas.scoring`; stage 0 may reuse an existing score run of ``P_0``);
2. **search** with those scores under the stage's budgets (:func:`nas.search.run`);
   relative bounds resolve against ``P_0``'s figures (:func:`absolute_budgets`), so the
   last stage's budget is the one-shot budget;
3. **build** the child from ``P_k`` and the BLD-trained blocks
   (:func:`nas.scoring.bld.assemble_child`);
4. **distill** it from the teacher (``P_0`` by default) (:func:`nas.train.distill.distill`).

Every stage writes ``stage-<k>/``: ``spec.json`` (the stage's search spec: parent
``P_k`` inline, absolute budgets, ``quality.scores`` pointing at ``scores/scores.csv``),
``scores/``, ``search/`` (``blueprint.json``, ``report.md``, ``library.json``),
``child/`` (the built child), ``distill/`` (``model/``, ``distill.json``,
``kd_curve.png``) and, last, ``stage.json`` (:class:`StageRecord`). A rerun skips stages
whose ``stage.json`` matches, and each step inside a stage resumes (scoring and
distillation are resumable themselves). ``iterate.json`` (:class:`IterateRecord`) lists
the stages.

**Ranks.** With ``nproc`` > 1 each stage's scoring and distillation run as ``nproc`` ranks
under torchrun on ``device`` (``puzzle-nas score`` / ``distill --nproc N``: the stage's
parent sharded as pipeline stages, teacher and student sharded with FSDP2; ``replicas``: a
whole copy per rank for both); the search runs in this process, and so does the build,
which reads the stage's parent one block at a time (:func:`nas.scoring.bld.assemble_child`:
the child plus one parent block in memory). A stage
done on one rank count is reused on another (the rank count is not part of its key).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ConfigDict, ValidationError

from hwprofiles.errors import InputError, read_json
from nas import search
from nas.io import atomic_write_json
from nas.spec import BudgetSpec, SearchSpec, load_spec, parse_quantity

if TYPE_CHECKING:
    from nas.train.distill import DistillRecord

VERSION = "iterate v1"


class StageRecord(BaseModel):
    """``stage-<k>/stage.json``: what one stage chose, built and measured."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    version: str
    index: int
    name: str
    parent: str
    teacher: str
    budgets: list[dict[str, Any]]
    pruned: list[str]
    scores: str
    blueprint: str
    child: str
    distilled: str
    params: dict[str, Any]
    predicted: dict[str, Any]
    changed_blocks: int
    kd_curve: list[dict[str, Any]]
    final: dict[str, Any]
    teacher_eval: dict[str, Any]
    key: str
    seconds: float


class IterateRecord(BaseModel):
    """``iterate.json``: the stages of an iterative run, in order."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    version: str
    spec: str
    parent: str
    teacher: str
    stages: list[StageRecord]
    final_model: str
    seconds: float


def absolute_budgets(problem: search.Problem, budgets: list[BudgetSpec]) -> list[BudgetSpec]:
    """``budgets`` with every relative bound (``"60%"``) replaced by the absolute figure it
    means for ``problem``'s parent (the figures :func:`nas.search.budget_rows` uses:
    ``parent_totals`` of the parent's own alternatives, throughput from its runtime)."""
    alts = search.alternatives(problem)
    priced = search.price(problem, alts, False)
    from nas.space.quality import structural_prior

    # any score works here: only the parent's cost totals are read
    quality = structural_prior(list(problem.parent.blocks), alts)
    library = search.build_library(problem, alts, priced, quality)
    totals = search.parent_totals(library)
    out = []
    for i, b in enumerate(budgets):
        upd: dict[str, Any] = {}
        for side in ("max", "min"):
            raw = getattr(b, side)
            if raw is None:
                continue
            val, rel = parse_quantity(raw, b.metric, f"budgets[{i}].{side}")
            if not rel:
                continue
            m, w = b.metric, problem.workloads.get(b.workload or "")
            if m == "throughput":
                runtime = totals[f"runtime_s@{b.workload}"] / val
                upd[side] = f"{w.sequences * w.osl / (runtime * problem.tp)!r} tok/s"  # type: ignore[union-attr]  # the spec validates that a throughput budget names a workload
            elif m == "per_user_tps":
                upd[side] = f"{val / totals[f'tpot_s@{b.workload}']!r} tok/s"
            elif m == "max_concurrency":
                n = search.parent_max_concurrency(problem, library, priced, b.workload or "")
                upd[side] = float(-(-val * n // 1))
            elif m in ("memory", "ttft", "tpot", "runtime", "total_params", "active_params",
                       "weight_memory"):
                key = {"memory": f"memory_bytes@{b.workload}", "ttft": f"ttft_s@{b.workload}",
                       "tpot": f"tpot_s@{b.workload}", "runtime": f"runtime_s@{b.workload}",
                       "total_params": "params", "active_params": "active_params",
                       "weight_memory": "weight_bytes"}[m]
                upd[side] = totals[key] * val
            else:
                raise InputError(f"a relative {m} bound cannot carry over between stages; "
                                 "give it as an absolute figure", field=f"budgets[{i}].{side}")
        out.append(b.model_copy(update=upd))
    return out


def prune_space(parent_cfg: dict[str, Any], space_data: dict[str, Any]
                ) -> tuple[dict[str, Any], list[str]]:
    """The search space with the listed values no block of the stage's parent can take
    removed (after a stage, e.g. ``kv_heads: [1]`` when every attention block was
    dropped), and what was removed; :func:`nas.search.alternatives` refuses such values,
    which is right for a hand-written spec but not for a stage whose parent an earlier
    stage chose."""
    from nas import space
    from nas.hf import from_hf
    from nas.spec import SearchSpace

    arch = from_hf(parent_cfg, source="stage parent")
    ss = SearchSpace.model_validate(space_data)
    alts = space.alternatives(arch, ss)
    out = json.loads(json.dumps(space_data))
    dropped = []
    for axis_name, fname, cls, attr, _ in space.VALUE_AXES:
        values = getattr(getattr(ss, axis_name), fname)
        used = {getattr(a.child, attr) for row in alts for a in row if isinstance(a.child, cls)}
        keep = [v for v in values if v in used]
        if len(keep) != len(values):
            dropped += [f"search_space.{axis_name}.{fname}: {v}" for v in values
                        if v not in used]
            out.setdefault(axis_name, {})[fname] = keep
    return out, dropped


def _stage_spec(spec_data: dict[str, Any], spec: SearchSpec, parent_cfg: dict[str, Any],
                k: int, budgets: list[BudgetSpec], base: Path
                ) -> tuple[dict[str, Any], list[str]]:
    st = spec.stages[k]
    out = {key: v for key, v in spec_data.items() if key not in ("stages", "budgets", "quality",
                                                                  "parent", "name")}
    out["name"] = f"{spec.name}-stage-{k}"
    out["parent"] = parent_cfg
    out["budgets"] = [b.model_dump(exclude_none=True) for b in budgets]
    if st.search_space is not None:
        out["search_space"] = st.search_space.model_dump(exclude_defaults=True)
    out["search_space"], dropped = prune_space(parent_cfg, out.get("search_space", {}))
    out["quality"] = {"scores": "scores/scores.csv", "metric": spec.quality.metric}
    # relative paths of the original spec (hardware profile / precision files) stay valid
    for key in ("hardware", "precision"):
        v = out.get(key)
        if isinstance(v, str) and v.endswith(".json") and not Path(v).is_absolute():
            out[key] = str((base / v).resolve())
        if isinstance(v, dict) and isinstance(v.get("profile"), str) \
                and v["profile"].endswith(".json") and not Path(v["profile"]).is_absolute():
            out[key] = dict(v, profile=str((base / v["profile"]).resolve()))
    return out, dropped


def _flag(name: str, v: Any) -> list[str]:
    """``--name value`` (floats as ``repr``, so they travel exactly), nothing for None."""
    if v is None:
        return []
    return ["--" + name.replace("_", "-"), repr(v) if isinstance(v, float) else str(v)]


def score_argv(spec: Path, parent: Path, data: str | Path, out: Path, settings: Any,
               tokenizer: str | Path | None, bin_dtype: str | None, device: str,
               replicas: bool) -> list[str]:
    """The rank command line of ``torchrun -m nas.cli.score`` for one stage's scoring."""
    argv = [str(spec), "--parent", str(parent), "--data", str(data), "-o", str(out)]
    for name in ("seq_len", "batch_size", "max_tokens", "calib_tokens", "bld_steps", "bld_lr",
                 "bld_batch", "seed", "dtype"):
        argv += _flag(name, getattr(settings, name))
    argv += _flag("tokenizer", tokenizer) + _flag("bin_dtype", bin_dtype)
    argv += ["--device", device] + (["--replicas"] if replicas else [])
    return argv


def distill_argv(child: Path, teacher: Path, data: str | Path, out: Path, settings: Any,
                 eval_data: str | Path | None, tokenizer: str | Path | None,
                 bin_dtype: str | None, device: str, replicas: bool,
                 checkpointing: bool, keep_checkpoint: bool = False) -> list[str]:
    """The rank command line of ``torchrun -m nas.cli.distill`` for one stage's
    distillation (every field of :class:`nas.train.distill.DistillSettings` as its flag;
    ``keep_checkpoint``: ``--keep-checkpoint``, the stage's ``distill/checkpoint/`` kept
    after it finishes)."""
    s = settings
    argv = [str(child), "--teacher", str(teacher), "--data", str(data), "-o", str(out)]
    argv += _flag("batch", s.batch_size) + _flag("micro_batch", s.micro_batch)
    for name in ("tokens", "seq_len", "lr", "min_lr_fraction", "warmup_steps", "weight_decay",
                 "grad_clip", "lm_weight", "eval_every", "eval_tokens", "checkpoint_every",
                 "seed", "dtype", "patience", "sweep_steps"):
        argv += _flag(name, getattr(s, name))
    # None travels as "none": the rank's flag defaults to "auto"
    argv += _flag("mixed_precision", s.mixed_precision or "none")
    if s.lr_sweep:
        argv += ["--lr-sweep", ",".join(repr(x) for x in s.lr_sweep)]
    argv += _flag("eval_data", eval_data) + _flag("tokenizer", tokenizer)
    argv += _flag("bin_dtype", bin_dtype) + ["--device", device]
    for flag, on in (("--keep-last", not s.keep_best), ("--replicas", replicas),
                     ("--activation-checkpointing", checkpointing),
                     ("--keep-checkpoint", keep_checkpoint)):
        if on:
            argv.append(flag)
    return argv


def _ranks(k: int, what: str, module: str, nproc: int, argv: list[str]) -> None:
    """Run one stage's step as ``nproc`` ranks (:func:`nas.launch.run_ranks`); a failure is
    one line (a rank that exited on its own printed why above it)."""
    from nas.launch import RanksFailed, run_ranks

    try:
        rc = run_ranks(module, nproc, argv)
    except RanksFailed as exc:
        raise RanksFailed(f"stage {k}: the {what}: {exc}") from None
    if rc != 0:
        raise InputError(f"stage {k}: the {what} on {nproc} ranks failed (exit status "
                         f"{rc}; the ranks' error is above); rerun the same command to "
                         "resume")


def _key(*parts: Any) -> str:
    import hashlib

    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()


def run_iterate(spec_path: str | Path, parent_dir: str | Path, data: str | Path,
                out_dir: str | Path, score_settings: Any, distill_settings: Any, *,
                eval_data: str | Path | None = None, tokenizer: str | Path | None = None,
                bin_dtype: str | None = None, teacher: str | Path | None = None,
                parent_scores: str | Path | None = None, progress: bool | None = None,
                log: Callable[[str], None] | None = None, nproc: int = 1,
                device: str = "cpu", replicas: bool = False,
                checkpointing: bool = False, keep_checkpoint: bool = False,
                score_data: str | Path | None = None) -> IterateRecord:
    """Run every stage of ``spec_path`` (see the module docstring) on the checkpoint
    ``parent_dir``; ``data`` trains (BLD calibration and scoring come from it too, unless
    ``score_data`` is given: then scoring and BLD read that instead, so that the
    distillation's tokens and the calibration's can be kept apart), ``eval_data`` is the
    distillation's held-out set. ``teacher`` defaults to the parent.
    ``parent_scores``: an existing ``puzzle-nas score`` folder of the parent (with the same
    settings) that stage 0 reuses. ``nproc``, ``device``, ``replicas``: the ranks each
    stage's scoring and distillation run on (see the module docstring); ``checkpointing``:
    the distillation's activation checkpointing; ``keep_checkpoint``: keep each stage's
    ``distill/checkpoint/`` once its distillation finished (deleted by default)."""
    import sys

    import torch

    from nas.child import save_pretrained
    from nas.child.checkpoint import CheckpointReader
    from nas.hf import from_hf, read_parent
    from nas.scoring import prepare
    from nas.scoring import run as run_scoring
    from nas.scoring.bld import assemble_child
    from nas.scoring.data import load_tokens
    from nas.tokens import copy_tokenizer
    from nas.train.distill import distill

    t0 = time.perf_counter()
    log = log if log is not None else (lambda s: print(s, file=sys.stderr))
    spec, base, _ = load_spec(spec_path)
    if not spec.stages:
        raise InputError("the spec lists no stages (give \"stages\": [{\"budgets\": [...]}, "
                         "...])", path=str(spec_path), field="stages")
    spec_data = read_json(spec_path)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    teacher = Path(teacher or parent_dir)
    # the teacher's config, read once for every stage's distillation (its precision, its
    # reader) and for the spec's parent where that is the same file; a stage's parent is
    # read once per stage (its spec, scoring, the build)
    t_par = read_parent(teacher) if (teacher / "config.json").is_file() else None
    problem0 = search.resolve(spec, base, known=t_par)
    train = load_tokens(data, tokenizer, bin_dtype)
    held = None if eval_data is None else load_tokens(eval_data, tokenizer, bin_dtype)
    current = Path(parent_dir)
    records: list[StageRecord] = []
    for k, st in enumerate(spec.stages):
        t1 = time.perf_counter()
        sdir = out / f"stage-{k}"
        sdir.mkdir(exist_ok=True)
        budgets = absolute_budgets(problem0, st.budgets)
        cur = read_parent(current, known=t_par)
        parent_cfg = cur.config
        sdata, pruned = _stage_spec(spec_data, spec, parent_cfg, k, budgets, base)
        if pruned:
            log(f"stage {k}: values no block of its parent can take are left out: "
                + "; ".join(pruned))
        ds_dump = distill_settings.model_dump()
        if ds_dump.get("mixed_precision") is None:  # keys of runs made before the field
            ds_dump.pop("mixed_precision", None)
        key = _key(VERSION, sdata, str(current), score_settings.model_dump(), ds_dump,
                   str(teacher), str(data), str(eval_data),
                   *([] if score_data is None else [str(score_data)]))
        done = sdir / "stage.json"
        if done.is_file():
            try:
                rec = StageRecord.model_validate(read_json(done))
            except ValidationError:
                rec = None
            if rec is not None and rec.key == key:
                log(f"stage {k}: done before ({done})")
                records.append(rec)
                current = Path(rec.distilled)
                continue
        # 1. score the stage's parent (stage 0 may reuse a score run of the parent)
        reuse = Path(parent_scores) if k == 0 and parent_scores is not None else None
        scores = reuse or sdir / "scores"
        if reuse is not None:
            sdata = dict(sdata, quality={"scores": str((scores / "scores.csv").resolve()),
                                         "metric": spec.quality.metric})
        atomic_write_json(sdir / "spec.json", sdata)
        if reuse is None:
            log(f"stage {k}: scoring {current}"
                + (f" on {nproc} ranks" if nproc > 1 else ""))
            sd = data if score_data is None else score_data
            job = prepare(sdir / "spec.json", current, sd, score_settings, tokenizer,
                          bin_dtype, checkpoint=cur)
            if nproc > 1:
                _ranks(k, "scoring", "nas.cli.score", nproc, score_argv(
                    sdir / "spec.json", current, sd, scores, score_settings, tokenizer,
                    bin_dtype, device, replicas))
            else:
                run_scoring(job, scores, progress=progress, log=log, device=device)
        # 2. search
        sspec, sbase, shash = load_spec(sdir / "spec.json")
        res = search.run(sspec, sbase, sdir / "search", shash, progress=progress)
        bp = res.blueprints[0]
        changed = sum(c["change"] != "parent" for c in bp.choices)
        log(f"stage {k}: {changed} of {len(bp.choices)} blocks changed, "
            f"params {bp.params['child_total']:,}")
        # 3. build from the BLD blocks
        child_arch = from_hf(bp.child, source=str(sdir / "search" / "blueprint.json"))
        dtype = None if score_settings.dtype is None else getattr(torch, score_settings.dtype)
        child = assemble_child(child_arch, CheckpointReader(current, arch=cur.arch), scores,
                               dtype)  # one block at a time
        save_pretrained(child, sdir / "child",  # with its parent's tokenizer
                        extra=partial(copy_tokenizer, [current]))
        # 4. distill
        dist_dir = sdir / "distill"
        if nproc > 1:
            from nas.train.distill import (
                layout_of,
                load_record,
                resolve_precision,
                resume_conflict,
            )

            ds = resolve_precision(distill_settings, sdir / "child", t_par or teacher,
                                   replicas)
            why = resume_conflict(dist_dir, ds, layout_of(nproc, ds, replicas))
            if why is not None:
                raise InputError(f"stage {k}: {why}")
            _ranks(k, "distillation", "nas.cli.distill", nproc, distill_argv(
                sdir / "child", teacher, data, dist_dir, distill_settings, eval_data,
                tokenizer, bin_dtype, device, replicas, checkpointing, keep_checkpoint))
            rec_d: DistillRecord | None = load_record(dist_dir)
        else:
            rec_d = distill(sdir / "child", t_par or teacher, train, dist_dir, distill_settings,
                            held=held, data_source=str(data),
                            eval_source=None if eval_data is None else str(eval_data),
                            progress=progress, log=log, device=device,
                            checkpointing=checkpointing, keep_checkpoint=keep_checkpoint)
        assert rec_d is not None
        rec = StageRecord(
            version=VERSION, index=k, name=st.name or f"stage {k}", parent=str(current),
            teacher=str(teacher), budgets=[b.model_dump(exclude_none=True) for b in budgets],
            pruned=pruned,
            scores=str(scores), blueprint=str(sdir / "search" / "blueprint.json"),
            child=str(sdir / "child"), distilled=str(dist_dir / "model"), params=bp.params,
            predicted=bp.predicted,
            changed_blocks=changed,
            kd_curve=[p.model_dump() for p in rec_d.curve], final=rec_d.final.model_dump(),
            teacher_eval=rec_d.teacher_eval.model_dump(), key=key,
            seconds=time.perf_counter() - t1)
        atomic_write_json(done, rec.model_dump())
        records.append(rec)
        current = dist_dir / "model"
    record = IterateRecord(version=VERSION, spec=str(spec_path), parent=str(parent_dir),
                           teacher=str(teacher), stages=records, final_model=str(current),
                           seconds=time.perf_counter() - t0)
    atomic_write_json(out / "iterate.json", record.model_dump())
    return record
