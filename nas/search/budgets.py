"""Budgets as MIP rows: the objective, every ``budgets`` entry of the spec translated to a
bound on an additive library key (:func:`budget_rows`; relative bounds are fractions of the
parent's own total), the count rules, and the solver options the spec sets.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from costmodels.memory import workspace_bytes as memory_workspace
from costmodels.model import (
    max_concurrency,
)
from hwprofiles.errors import InputError
from nas import engines, mip
from nas.library import BlockLibrary
from nas.search.problem import Priced, Problem, deploy_engines, deploy_notes
from nas.spec import BudgetSpec, parse_quantity


# ---- constraints ------------------------------------------------------------------------
@dataclass
class Constraints:
    """The MIP's objective, budget rows and count rows, with where each came from."""

    objective: mip.Objective
    budgets: list[mip.Budget]
    counts: list[mip.CountRule]
    described: list[str] = field(default_factory=list)
    # per budget row: (index of the spec budget it came from, library key it bounds)
    origin: list[tuple[int, str]] = field(default_factory=list)
    count_origin: list[int] = field(default_factory=list)
    # cost columns the rows bound beyond the library's own (memory_bytes@W#N: memory with N
    # sequences at W's context), each with its constant; see extend()
    columns: dict[str, tuple[np.ndarray, float]] = field(default_factory=dict)
    # deploy.engines: the tied choices (one per axis a target engine holds global), the
    # replacements no target engine loads (a span holding two values of a tied axis), and
    # what the engines took out of the space (deploy_notes)
    ties: list[mip.Tie] = field(default_factory=list)
    forbid: list[int] = field(default_factory=list)
    engine_notes: list[str] = field(default_factory=list)

    def extend(self, library: BlockLibrary) -> BlockLibrary:
        """``library`` with :attr:`columns` added: a new library (``library`` itself when it
        already has them all); the MIP reads this one."""
        new = {k: v for k, v in self.columns.items() if k not in library.costs}
        if not new:
            return library
        return BlockLibrary(
            library.num_blocks, library.start, library.end,
            {**library.costs, **{k: v for k, (v, _) in new.items()}}, library.scores,
            labels=library.labels, tags=library.tags, children=library.children,
            constants={**library.constants, **{k: c for k, (_, c) in new.items()}},
            block_names=library.block_names, descriptive=library.descriptive,
            source=library.source)


def parent_totals(library: BlockLibrary) -> dict[str, float]:
    """Totals of every key for the parent (its own alternative in every block)."""
    idx = [i for i, lab in enumerate(library.labels) if lab == "parent"]
    return {k: float(v[idx].sum()) + library.constants.get(k, 0.0)
            for k, v in {**library.costs, **library.scores}.items()}


def _concurrency_key(problem: Problem, library: BlockLibrary, priced: Priced | None,
                     wname: str, n: int, columns: dict[str, tuple[np.ndarray, float]]) -> str:
    """The key of ``memory_bytes@W#N`` (memory with N sequences at W's context), its column
    and constant put in ``columns`` unless ``library`` has it (the library is not changed)."""
    key = f"memory_bytes@{wname}#{n}"
    if key in library.costs or key in columns:
        return key
    w = problem.workloads[wname]
    if priced is None:
        raise InputError("max_concurrency budgets need the priced rows")
    rows = priced.rows
    per_seq = rows.kv_bytes(w.max_context) + rows.state_bytes_per_sequence
    head = 0.0  # the MTP head's weights and its n sequences' KV and state (a constant)
    if priced.head is not None:
        hd = priced.head
        head = float(hd.weight_bytes.sum() + n * (hd.kv_bytes(w.max_context).sum()
                                                  + hd.state_bytes_per_sequence.sum()))
    ctx = float(w.max_context)  # costmodels' max_concurrency at a context: prompts of ctx
    ws = float(memory_workspace(priced.workspace_bytes["#widest"],
                                max(min(n * ctx, w.max_num_batched_tokens), n), n,
                                priced.nonblock.vocab_per_gpu))
    columns[key] = (rows.weight_bytes + n * per_seq,
                    priced.nonblock.weight_bytes + ws + problem.reserve_bytes + head)
    return key


def budget_rows(problem: Problem, library: BlockLibrary, b: BudgetSpec, index: int,
                priced: Priced | None = None, override: str | float | None = None,
                columns: dict[str, tuple[np.ndarray, float]] | None = None
                ) -> tuple[list[mip.Budget], list[mip.CountRule], str]:
    """Translate one spec budget into MIP rows (``override`` replaces its bound); cost
    columns the rows need beyond the library's go into ``columns``."""
    columns = {} if columns is None else columns
    where = f"budgets[{index}]"
    parent = parent_totals(library)
    m, wname = b.metric, b.workload
    if m == "kept_blocks":
        lo = None if b.min is None else int(parse_quantity(b.min, m, where + ".min")[0])
        hi = None if b.max is None else int(parse_quantity(b.max, m, where + ".max")[0])
        if override is not None:
            v = int(parse_quantity(override, m, where)[0])
            lo, hi = (v, hi) if b.min is not None else (lo, v)
        rule = mip.CountRule(f"kept:{b.kind}", lo, hi, unit="blocks")
        return [], [rule], f"kept_blocks {str(rule).removeprefix('blocks:kept:')}"

    w = problem.workloads.get(wname or "")
    out: list[mip.Budget] = []
    text = []
    for side in ("max", "min"):
        raw = getattr(b, side)
        if raw is None:
            continue
        if override is not None:
            raw = override
        val, rel = parse_quantity(raw, m, f"{where}.{side}")
        lower_is_bound = side == "min"
        if m in ("throughput", "per_user_tps"):
            if side != "min":
                raise InputError(f"{m} takes a min (a speed target)", field=f"{where}.max")
            key = f"runtime_s@{wname}" if m == "throughput" else f"tpot_s@{wname}"
            if rel:
                bound = parent[key] / val
            elif m == "throughput":
                bound = w.sequences * w.osl / (val * problem.tp)  # type: ignore[union-attr]  # the spec validates that a throughput budget names a workload
            else:
                bound = 1.0 / val
            out.append(mip.Budget(key, None, bound))
            text.append(f"{m}@{wname} >= {raw}")
            continue
        if m == "max_concurrency":
            if side != "min":
                raise InputError("max_concurrency takes a min", field=f"{where}.max")
            assert wname is not None  # BudgetSpec: a workload metric names its workload
            n = int(math.ceil(val * (parent_max_concurrency(problem, library, priced, wname)
                                     if rel else 1.0)))
            key = _concurrency_key(problem, library, priced, wname, n, columns)
            out.append(mip.Budget(key, None, problem.device_bytes))
            text.append(f"max_concurrency@{wname} >= {n}")
            continue
        key = {"memory": f"memory_bytes@{wname}", "ttft": f"ttft_s@{wname}",
               "tpot": f"tpot_s@{wname}", "runtime": f"runtime_s@{wname}",
               "total_params": "params", "active_params": "active_params",
               "weight_memory": "weight_bytes", "quality": "quality"}[m]
        if math.isnan(val):  # "device"
            val = problem.device_bytes
        bound = parent[key] * val if rel else val
        out.append(mip.Budget(key, bound, None) if lower_is_bound
                   else mip.Budget(key, None, bound))
        text.append(f"{m}{'@' + wname if wname else ''} {'>=' if lower_is_bound else '<='} "
                    f"{raw}")
    return out, [], "; ".join(text)


def parent_max_concurrency(problem: Problem, library: BlockLibrary, priced: Priced | None,
                           wname: str) -> int:
    """Largest concurrency the parent fits at workload ``wname``'s context (per GPU):
    ``costmodels.model.max_concurrency`` of the parent's rows (and its MTP head's)."""
    if priced is None:
        raise InputError("max_concurrency budgets need the priced rows")
    idx = [i for i, lab in enumerate(library.labels) if lab == "parent"]
    return max_concurrency(priced.with_head(priced.rows.take(idx)), priced.nonblock,
                           problem.hw, problem.workloads[wname].max_context,
                           reserve_bytes=problem.reserve_bytes).max_concurrency


def objective_of(problem: Problem) -> mip.Objective:
    o = problem.spec.objective
    if o.minimize == "quality":
        return mip.Objective({"quality": 1.0}, "min")
    target = o.minimize or o.maximize or ""
    metric, _, wname = target.partition("@")
    if o.maximize is not None:
        key = {"throughput": f"runtime_s@{wname}", "per_user_tps": f"tpot_s@{wname}"}.get(metric)
        if key is None or not wname:
            raise InputError("maximize takes 'throughput@WORKLOAD' or 'per_user_tps@WORKLOAD'",
                             field="objective.maximize")
        return mip.Objective({key: 1.0}, "min")
    key = {"runtime": f"runtime_s@{wname}", "tpot": f"tpot_s@{wname}",
           "ttft": f"ttft_s@{wname}", "memory": f"memory_bytes@{wname}",
           "total_params": "params", "active_params": "active_params",
           "weight_memory": "weight_bytes"}.get(metric)
    if key is None or (metric in ("runtime", "tpot", "ttft", "memory") and not wname):
        raise InputError("minimize takes 'quality', 'runtime@W', 'tpot@W', 'ttft@W', "
                         "'memory@W', 'total_params', 'active_params' or 'weight_memory'",
                         field="objective.minimize")
    return mip.Objective({key: 1.0}, "min")


def constraints(problem: Problem, library: BlockLibrary, priced: Priced | None = None
                ) -> Constraints:
    """Objective, budget rows and count rows of the spec (new data: ``library`` is not
    changed; rows on columns it lacks bring them in ``Constraints.columns``)."""
    cons = Constraints(objective_of(problem), [], [])
    eng = deploy_engines(problem)
    if eng:
        cons.ties, cons.forbid = engines.ties(library, engines.tied_axes(problem.parent, eng))
        cons.engine_notes = deploy_notes(problem)
    for i, b in enumerate(problem.spec.budgets):
        rows, counts, text = budget_rows(problem, library, b, i, priced, columns=cons.columns)
        cons.budgets += rows
        cons.counts += counts
        cons.described.append(text)
        cons.origin += [(i, r.key) for r in rows]
        cons.count_origin += [i] * len(counts)
    return cons


def options_of(problem: Problem) -> mip.SolveOptions:
    s = problem.spec.solver
    return mip.SolveOptions(time_limit=s.time_limit, mip_rel_gap=s.gap, threads=s.threads,
                            seed=s.seed)
