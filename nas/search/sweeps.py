"""Sweeps: one budget over a range (:func:`run_sweep`, warm-started solves), the batch size
of one workload (:func:`run_batch_sweep`), and the SLO sweep that traces throughput
against per-user speed (:func:`solve_slo`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import numpy as np

from costmodels.serving import SLOPoint, concurrency_grid, parse_slo, slo_throughput
from hwprofiles.errors import InputError
from nas import mip, space
from nas.arch import serving_table
from nas.library import BlockLibrary
from nas.progress import Progress
from nas.search.baselines import homogeneous_solve
from nas.search.blueprint import nonblock_shape
from nas.search.budgets import Constraints, budget_rows, constraints, options_of, parent_totals
from nas.search.problem import Priced, Problem, build_library, price
from nas.search.solver import solve
from nas.spec import HIGHER_IS_BETTER, BudgetSpec, parse_quantity


def sweep_values(problem: Problem) -> list[str | float]:
    sw = problem.spec.solver.sweep
    assert sw is not None
    if sw.values:
        return list(sw.values)
    if sw.start is None or sw.stop is None:
        raise InputError("give values, or start and stop", field="solver.sweep")
    b = problem.spec.budgets[sw.budget]
    a, rel_a = parse_quantity(sw.start, b.metric, "solver.sweep.start")
    z, rel_z = parse_quantity(sw.stop, b.metric, "solver.sweep.stop")
    if rel_a != rel_z:
        raise InputError("start and stop must both be absolute or both relative",
                         field="solver.sweep")
    vals = np.linspace(a, z, sw.num)
    return [f"{v * 100:.6g}%" for v in vals] if rel_a else [float(v) for v in vals]


# ---- the whole job -------------------------------------------------------------------------
@dataclass
class SearchOutcome:
    """What :func:`run` produced: blueprints (best first), files written, and the pieces."""

    problem: Problem
    library: BlockLibrary
    blueprints: list[Any]
    homogeneous: Any | None
    sweep: dict[str, Any] | None
    files: list[Path]
    timings: dict[str, float]
    deploy: Any | None = None
    """With ``deploy.candidates``: the joint search's ``nas.search.deploy.DeployResult``."""


_SWEEP_UNITS = {"memory": ("GiB", 2**30), "weight_memory": ("GiB", 2**30),
                "ttft": ("ms", 1e-3), "tpot": ("ms", 1e-3), "runtime": ("s", 1.0),
                "per_user_tps": ("tok/s", 1.0), "throughput": ("tok/s per GPU", 1.0),
                "total_params": ("B params", 1e9), "active_params": ("B params", 1e9),
                "quality": ("score", 1.0)}


def _metric_value(problem: Problem, b: BudgetSpec, key: str, total: float) -> float:
    """A library total of ``key`` in the spec metric's own units (for plots)."""
    unit = _SWEEP_UNITS.get(b.metric, ("", 1.0))[1]
    if b.metric == "throughput":
        w = problem.workloads[b.workload]  # type: ignore[index]  # the spec validates that a throughput budget names a workload
        return w.sequences * w.osl / (total * problem.tp)
    if b.metric == "per_user_tps":
        return 1.0 / total
    return total / unit


def _chosen_point(problem: Problem, sweep: dict[str, Any], res: mip.Result
                  ) -> tuple[float, float] | None:
    """The returned child (``res``, blueprint.json) as a point of the sweep's plot: its swept
    metric and its quality (None when its totals lack the swept key)."""
    b = problem.spec.budgets[sweep["budget"]]
    if not res.ok or sweep["key"] not in res.totals or "quality" not in res.totals:
        return None
    return (_metric_value(problem, b, sweep["key"], res.totals[sweep["key"]]),
            res.totals["quality"])


def run_sweep(problem: Problem, library: BlockLibrary, cons: Constraints, priced: Priced,
              homogeneous: bool = False, on_point: Any = None,
              forbid: np.ndarray | Sequence[int] = ()) -> dict[str, Any]:
    """Re-solve over the spec's sweep grid; returns points (metric value, quality).
    ``on_point()`` is called as each point is solved (a progress bar); ``forbid``:
    replacements no point may take (e.g. :func:`fixed_recipe_forbid`)."""
    library = cons.extend(library)
    sw = problem.spec.solver.sweep
    assert sw is not None
    b = problem.spec.budgets[sw.budget]
    if b.metric in ("kept_blocks", "max_concurrency"):
        raise InputError(f"cannot sweep a {b.metric} budget", field="solver.sweep.budget")
    values = sweep_values(problem)
    others = [r for (bi, _), r in zip(cons.origin, cons.budgets) if bi != sw.budget]
    keyed = []
    for v in values:
        rows, _, _ = budget_rows(problem, library, b, sw.budget, priced, override=v)
        keyed.append(rows[0])
    key = keyed[0].key
    points: list[dict[str, Any]] = []
    results = []
    for v, row in zip(values, keyed):
        if homogeneous:
            c2 = Constraints(cons.objective, others + [row], cons.counts, ties=cons.ties,
                             forbid=cons.forbid)
            res = homogeneous_solve(library, c2)
            if on_point is not None:
                on_point()
        else:
            res = None
        results.append((v, row, res))
    if not homogeneous:
        # budget_rows gives each swept row its bound, on one side
        hi = cast(list[float], [r.hi if r.hi is not None else r.lo for _, r, _ in results])
        sw_res = mip.sweep(library, cons.objective, others, key=key, values=hi,
                           counts=cons.counts, options=options_of(problem),
                           forbid=[int(i) for i in forbid] + cons.forbid, workers=sw.workers,
                           ties=cons.ties,
                           progress=None if on_point is None else lambda i, r: on_point())
        results = [(v, r, res) for (v, r, _), res in zip(results, sw_res.results)]
    for v, _, res in results:
        if res is not None and res.ok:
            points.append({"value": v, "metric": _metric_value(problem, b, key, res.totals[key]),
                           "quality": res.totals["quality"], "status": res.status,
                           "chosen": [int(i) for i in res.chosen]})
        else:
            points.append({"value": v, "metric": None, "quality": None,
                           "status": res.status if res is not None else "error",
                           "chosen": []})
    parent = parent_totals(library)
    return {"budget": sw.budget, "metric": b.metric, "workload": b.workload, "key": key,
            "unit": _SWEEP_UNITS.get(b.metric, ("", 1.0))[0],
            "parent": {"metric": _metric_value(problem, b, key, parent[key]),
                       "quality": parent["quality"]},
            "points": points}


def with_batch(problem: Problem, workload: str, size: int) -> Problem:
    """A copy of ``problem`` with ``workload``'s batch (or concurrency) set to ``size``."""
    w = problem.workloads[workload]
    field_ = "batch" if w.batch is not None else "concurrency"
    wls = dict(problem.workloads)
    wls[workload] = w.model_copy(update={field_: size})
    return Problem(problem.spec, problem.base_dir, problem.spec_hash, problem.parent,
                   problem.hw, problem.recipe, wls, problem.reserve_bytes)


def run_batch_sweep(problem: Problem, alts: list[list[space.Alternative]],
                    quality: np.ndarray, homogeneous: bool = False,
                    progress: bool | None = None) -> dict[str, Any]:
    """The sweep grid solved once per batch size; per grid point the best child is kept.

    Relative bounds resolve against the parent at each batch size, so give absolute targets
    (e.g. tok/s) when sweeping batch sizes.
    """
    sw = problem.spec.solver.sweep
    assert sw is not None and sw.workload is not None and sw.batch_sizes
    per_batch = []
    with Progress(len(sw.batch_sizes), "batch sizes", progress) as bar:
        for size in sw.batch_sizes:
            pb = with_batch(problem, sw.workload, size)
            priced = price(pb, alts, progress=False)
            lib = build_library(pb, alts, priced, quality)
            cons = constraints(pb, lib, priced)
            res = run_sweep(pb, lib, cons, priced, homogeneous)
            per_batch.append((size, res))
            bar.update(1)
    out = dict(per_batch[0][1])
    points = []
    for i in range(len(out["points"])):
        cands = [(res["points"][i], size) for size, res in per_batch
                 if res["points"][i]["quality"] is not None]
        if not cands:
            points.append({**per_batch[0][1]["points"][i], "batch": None})
            continue
        best, size = min(cands, key=lambda c: c[0]["quality"])
        points.append({**best, "batch": size})
    out["points"] = points
    # the parent at its best batch size for the swept metric
    better = max if out["metric"] in HIGHER_IS_BETTER else min
    psize, pres = better(per_batch, key=lambda c: c[1]["parent"]["metric"])
    out["parent"] = {**pres["parent"], "batch": psize}
    out["batch_sizes"] = list(sw.batch_sizes)
    out["batch_workload"] = sw.workload
    return out


def slo_workload(problem: Problem) -> str | None:
    """The workload with an SLO (at most one), or None."""
    names = [n for n, w in problem.spec.workloads.items() if w.slo]
    if len(names) > 1:
        raise InputError(f"only one workload may carry an slo, got {names}", field="workloads")
    return names[0] if names else None


def parent_slo_point(problem: Problem, wname: str) -> SLOPoint:
    """The parent's best throughput under ``wname``'s SLO (``costmodels.serving``)."""
    ws = problem.spec.workloads[wname]
    table, draft = serving_table(problem.parent, problem.mtp)  # with its MTP head if drafting
    return slo_throughput(table, nonblock_shape(problem.parent), problem.hw,
                          problem.recipe, problem.workloads[wname], parse_slo(ws.slo),
                          reserve_bytes=problem.reserve_bytes,
                          concurrencies=ws.concurrency_sweep, draft=draft,
                          **problem.target.serving_kwargs())


def slo_problem(problem: Problem, wname: str, parent_pt: SLOPoint) -> Problem:
    """``problem`` with the SLO of ``wname`` as budgets (per-user speed, TTFT, memory <=
    device) and its relative throughput bounds turned into tok/s per GPU against the
    parent's SLO throughput, so that every concurrency of the sweep answers the same
    question."""
    spec = problem.spec
    slo = parse_slo(spec.workloads[wname].slo)
    budgets = []
    for i, b in enumerate(spec.budgets):
        if b.metric == "throughput" and b.workload == wname and b.min is not None:
            val, rel = parse_quantity(b.min, "throughput", f"budgets[{i}].min")
            if rel:
                if not parent_pt.feasible:
                    raise InputError(f"the parent meets {slo.label()} at no concurrency, so "
                                     f"{b.min} of it means nothing; give tok/s",
                                     field=f"budgets[{i}].min")
                b = b.model_copy(update={"min": f"{val * parent_pt.throughput_tok_s:.6g} tok/s"})
        budgets.append(b)
    extra = [BudgetSpec(metric="memory", workload=wname, max="device")]
    if slo.per_user_tps is not None:
        extra.append(BudgetSpec(metric="per_user_tps", workload=wname,
                                min=f"{slo.per_user_tps:g} tok/s"))
    if slo.ttft_s is not None:
        extra.append(BudgetSpec(metric="ttft", workload=wname, max=f"{slo.ttft_s * 1e3:g} ms"))
    spec2 = spec.model_copy(update={"budgets": budgets + extra})
    return Problem(spec2, problem.base_dir, problem.spec_hash, problem.parent, problem.hw,
                   problem.recipe, dict(problem.workloads), problem.reserve_bytes)


@dataclass
class SLOSweep:
    """The concurrency sweep of an SLO workload: the best point and every point tried."""

    workload: str
    parent: SLOPoint
    best: int | None
    points: list[dict[str, Any]]


def solve_slo(problem: Problem, alts: list[list[space.Alternative]], quality: np.ndarray,
              wname: str, progress: bool | None = None
              ) -> tuple[Problem, Priced, BlockLibrary, Constraints, list[mip.Result], SLOSweep]:
    """Solve once per concurrency of the SLO workload ``wname`` (the Puzzle paper's sweep
    over batch sizes) and keep the best child: the lowest objective, or for a throughput
    objective on ``wname`` the highest throughput. Raises ``InfeasibleError`` when no
    concurrency admits a child."""
    ws = problem.spec.workloads[wname]
    parent_pt = parent_slo_point(problem, wname)
    base = slo_problem(problem, wname, parent_pt)
    w = problem.workloads[wname]
    grid = ws.concurrency_sweep or concurrency_grid(w.max_num_seqs)
    obj = problem.spec.objective.maximize or ""
    by_throughput = obj == f"throughput@{wname}"
    best: tuple | None = None
    points: list[dict[str, Any]] = []
    with Progress(len(grid), f"SLO sweep of {wname}", progress) as bar:
        for c in grid:
            pb = with_batch(base, wname, c)
            priced = price(pb, alts, progress=False)
            lib = build_library(pb, alts, priced, quality)
            cons = constraints(pb, lib, priced)
            try:
                results = solve(pb, lib, cons)
            except mip.InfeasibleError:
                points.append({"concurrency": c, "feasible": False})
                bar.update(1)
                continue
            r = results[0]
            thr = c * w.osl / (r.totals[f"runtime_s@{wname}"] * pb.tp)
            points.append({"concurrency": c, "feasible": True, "objective": r.objective,
                           "throughput_tok_s": thr})
            key = -thr if by_throughput else float(r.objective or 0.0)
            if best is None or key < best[0]:
                best = (key, c, (pb, priced, lib, cons, results))
            bar.update(1)
    if best is None:
        raise mip.InfeasibleError(
            f"no concurrency of {wname} in {grid[0]}..{grid[-1]} admits a child under "
            f"{ws.slo} and the budgets (the parent's best: concurrency "
            f"{parent_pt.concurrency}, {parent_pt.throughput_tok_s:,.0f} tok/s per GPU)")
    pb, priced, lib, cons, results = best[2]
    return pb, priced, lib, cons, results, SLOSweep(wname, parent_pt, best[1], points)
