"""One solve: the MIP on HiGHS (or the homogeneous enumeration), the result verified against
its rows and the time limit, and the chosen alternatives as a child :class:`ModelArch`.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from hwprofiles.errors import InputError
from nas import mip, space
from nas.arch import ModelArch
from nas.library import BlockLibrary
from nas.search.baselines import homogeneous_solve
from nas.search.budgets import Constraints, options_of
from nas.search.problem import Problem, _flat
from nas.space import spans


def solve(problem: Problem, library: BlockLibrary, cons: Constraints,
          homogeneous: bool | None = None,
          on_solve: Callable[[], None] | None = None) -> list[mip.Result]:
    """Solve (a diverse pool when the spec asks for one); ``on_solve()`` is called after
    each solve of a pool (a progress bar). Raises ``InfeasibleError``."""
    library = cons.extend(library)
    hom = problem.spec.search_space.homogeneous if homogeneous is None else homogeneous
    if hom:
        res = homogeneous_solve(library, cons)
        if res.status == "infeasible":
            raise mip.InfeasibleError("homogeneous search: " + res.message)
        return [res]
    s = problem.spec.solver
    if s.diverse > 1:
        first: list[mip.Result] = []

        def progress(i: int, r: mip.Result) -> None:
            if i == 0:
                first.append(r)
            if on_solve is not None:
                on_solve()

        pool = mip.diverse_pool(library, cons.objective, cons.budgets, n=s.diverse,
                                min_distance=s.min_distance, counts=cons.counts,
                                options=options_of(problem), progress=progress,
                                ties=cons.ties, forbid=cons.forbid)
        if not pool and first:
            check_in_time(problem, first[0])
        return pool
    res = mip.solve(library, cons.objective, cons.budgets, counts=cons.counts,
                    options=options_of(problem), ties=cons.ties, forbid=cons.forbid)
    check_in_time(problem, res)
    return [res.raise_if_infeasible()]


def check_in_time(problem: Problem, res: mip.Result) -> None:
    """Raise a one-line ``InputError`` (naming ``solver.time_limit``) when the solve ran out
    of time before HiGHS found any child: a limit too small for this library, not a solver
    failure."""
    limit = problem.spec.solver.time_limit
    if res.status != "error" or limit is None:
        return
    if "Time limit" in res.message or res.seconds >= 0.95 * limit:
        raise InputError(f"no child found within the time limit of {limit:g} s (HiGHS had "
                         f"not found any child that meets every budget after "
                         f"{res.seconds:.3g} s); raise the limit or remove it",
                         field="solver.time_limit")


def child_arch(problem: Problem, library: BlockLibrary, chosen: np.ndarray,
               alts: list[list[space.Alternative]]) -> ModelArch:
    """The child ``ModelArch`` of a solution."""
    flat = _flat(alts)
    if spans.is_wide(alts):  # spans shorten the child (nas.space.spans.child_blocks)
        kids, _, _ = spans.child_blocks(problem.parent, [flat[int(r)] for r in chosen],
                                        problem.recipe)
        return problem.parent.replace_blocks(kids)
    blocks = [None] * problem.parent.num_blocks
    for r in chosen:
        blocks[int(library.start[r])] = flat[int(r)].child  # type: ignore[call-overload]  # blocks starts as Nones; every position is filled by the chosen rows
    return problem.parent.replace_blocks(blocks)  # type: ignore[arg-type]  # every position is filled by the chosen rows (a partition of the blocks)
