"""The search pipeline: spec -> parent -> alternatives -> priced -> scored -> library -> MIP.

Each step is a public function a training stack can call alone::

    problem = resolve(spec, base_dir)            # parent ModelArch, profile, recipe, workloads
    alts = alternatives(problem)                 # per parent block, its child blocks
    costs = price(problem, alts)                 # costmodels, one vectorized pass
    quality, source = score(problem, alts)       # score file, or the structural prior
    library = build_library(problem, alts, costs, quality)
    cons = constraints(problem, library)         # objective, budgets, count rules
    result = solve(problem, library, cons)       # HiGHS (or the homogeneous enumeration)
    child = child_arch(problem, library, result.chosen)

Library keys (all additive over blocks; the non-block term is a library constant):
``params``, ``active_params``, ``weight_bytes`` and, per workload ``W``,
``ttft_s@W``, ``tpot_s@W``, ``runtime_s@W`` (time one replica spends serving B requests),
``memory_bytes@W`` (weights + B x (KV at isl+osl + state) + workspace + reserve, per GPU);
the score key is ``quality``. Budgets translate as:

* throughput per GPU >= X  ->  ``runtime_s@W <= B * osl / (X * tp)``
* per-user decode speed >= X tok/s  ->  ``tpot_s@W <= 1 / X``
* max concurrency >= N at W's context  ->  memory with N sequences <= device memory
* relative bounds ("60%") are fractions of the parent's own total of the same key
  (for throughput / per-user speed, the runtime / TPOT bound is the parent's divided by
  the fraction).

Speculative decoding (MTP): a workload with ``draft_tokens = d`` and ``acceptance = A``
serves with the parent's MTP head drafting d tokens per verification step
(``costmodels.workload``). The head is not searched: every child keeps the parent's (as
the seeds' Puzzle-75B did), so its cost is one constant, priced once exactly as
``puzzle-nas cost --mtp`` prices it (``nas.arch.mtp_table``, draft rows) and added to the
non-block constants of every key: its d draft passes per step in TTFT / TPOT / runtime,
its weights in ``weight_bytes`` and memory, its KV and state per sequence in memory, and
its rows in the workspace maximum. The main blocks are priced with the verify shape (1 + d
tokens per decoding sequence), the LM head with its draft passes, every time per output
token divided by A, and memory holds the ``1 + d`` state snapshots speculative decoding
keeps per sequence (``costmodels.model.spec_state_snapshots``; not in the
``max_concurrency`` columns, which follow ``costmodels.model.max_concurrency``). The head
counts in weight bytes, not in ``params`` / ``active_params`` (as ``ModelArch.param_counts``
keeps MTP apart). A is the user's statement about the workload, the same for the parent and
every child: a child's real acceptance is unknown until it is trained (the seeds measured
3.45 for Nemotron-3-Super, 4.34 for their child after training); no per-child acceptance
is modeled. With several workloads the head is loaded for all of them: one that drafts
nothing pays its weights and KV but no draft passes.

The package, one module per concern: :mod:`~nas.search.problem` (resolve, alternatives,
price, score, library), :mod:`~nas.search.budgets` (objective, budget rows, solver options),
:mod:`~nas.search.solver` (one solve, verified; the child arch),
:mod:`~nas.search.baselines` (homogeneous and fixed-recipe children),
:mod:`~nas.search.sweeps` (budget, batch and SLO sweeps), :mod:`~nas.search.runner` (the
``puzzle-nas search`` driver), and the outputs :mod:`~nas.search.blueprint` and
:mod:`~nas.search.quant_config`. Every public name is importable from ``nas.search``.
"""

from __future__ import annotations

from nas.search.baselines import fixed_recipe_forbid, fixed_recipe_solve, homogeneous_solve
from nas.search.blueprint import nonblock_shape
from nas.search.budgets import (
    Constraints,
    budget_rows,
    constraints,
    objective_of,
    options_of,
    parent_max_concurrency,
    parent_totals,
)
from nas.search.problem import (
    Priced,
    Problem,
    alternatives,
    build_library,
    deploy_engines,
    deploy_notes,
    library_json,
    price,
    price_head,
    resolve,
    score,
)
from nas.search.runner import run
from nas.search.solver import check_in_time, child_arch, solve
from nas.search.sweeps import (
    SearchOutcome,
    SLOSweep,
    parent_slo_point,
    run_batch_sweep,
    run_sweep,
    slo_problem,
    slo_workload,
    solve_slo,
    sweep_values,
    with_batch,
)

__all__ = ["Constraints", "Priced", "Problem", "SLOSweep", "SearchOutcome", "alternatives",
           "budget_rows", "build_library", "check_in_time", "child_arch", "constraints",
           "deploy_engines", "deploy_notes", "fixed_recipe_forbid", "fixed_recipe_solve",
           "homogeneous_solve", "library_json", "nonblock_shape", "objective_of", "options_of",
           "parent_max_concurrency", "parent_slo_point", "parent_totals", "price", "price_head",
           "resolve", "run", "run_batch_sweep", "run_sweep", "score", "slo_problem",
           "slo_workload", "solve", "solve_slo", "sweep_values", "with_batch"]
