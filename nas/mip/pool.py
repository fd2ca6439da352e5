"""One solve, a diverse pool of solves, a sweep of a budget, and the Pareto front."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any, Literal

import numpy as np

from hwprofiles.errors import InputError
from nas.library import BlockLibrary
from nas.mip.constraints import Budget, CountRule, Objective
from nas.mip.explain import explain_infeasible
from nas.mip.model import MipModel, Result, SolveOptions


def explained(m: MipModel, res: Result, max_resolves: int = 64) -> Result:
    """``res`` with the explanation of an infeasible model in ``message`` (shortest paths,
    then up to ``max_resolves`` feasibility re-solves; see :func:`explain_infeasible`)."""
    if res.status == "infeasible":
        res.message = explain_infeasible(m.lib, m.budgets, counts=m.counts, pin=m.pin,
                                         forbid=m.forbid, options=m.opts,
                                         max_resolves=max_resolves)
    return res


def solve(
    library: BlockLibrary,
    objective: str | Objective,
    budgets: Sequence[Budget | str] = (),
    *,
    counts: Sequence[CountRule | str] = (),
    pin: Sequence[int] = (),
    forbid: Sequence[int] = (),
    options: SolveOptions | None = None,
    warm_start: Sequence[int] | None = None,
) -> Result:
    """Best child of ``library`` under every budget; see the module doc for the model.

    Returns a verified :class:`Result`; an infeasible model gives ``status="infeasible"``
    with the explanation in ``message`` (call ``.raise_if_infeasible()`` to raise).

    ``warm_start``: replacement indices of a known child (an earlier solution). It is
    checked against every row and ignored when it breaks one; otherwise it is the
    incumbent from the start (every HiGHS run looks only for better children) and is
    returned, ``feasible``, when the time limit stops the search
    before anything better is found. The answer is the same as without it (see
    :meth:`MipModel.solve`).
    """
    m = MipModel(library, objective, budgets, counts=counts, pin=pin, forbid=forbid,
                 options=options)
    inc = None if warm_start is None else np.asarray(
        [m._index(i, "warm_start") for i in warm_start], dtype=np.int64)
    return explained(m, m.solve(incumbent=inc))


def diverse_pool(
    library: BlockLibrary,
    objective: str | Objective,
    budgets: Sequence[Budget | str] = (),
    *,
    n: int,
    min_distance: int,
    counts: Sequence[CountRule | str] = (),
    pin: Sequence[int] = (),
    forbid: Sequence[int] = (),
    options: SolveOptions | None = None,
    progress: Callable[[int, Result], None] | None = None,
) -> list[Result]:
    """Up to ``n`` solutions, each the best child that differs from every earlier one in at
    least ``min_distance`` parent blocks (a block differs when the replacement covering it
    differs). Stops early when no further child exists; raises :class:`InfeasibleError`
    when not even the first one does. ``progress(i, result)`` is called after each solve."""
    if n < 1:
        raise InputError(f"pool size must be >= 1, got {n}")
    if not 1 <= min_distance <= library.num_blocks:
        raise InputError(f"min_distance must be in [1, {library.num_blocks}], got {min_distance}")
    m = MipModel(library, objective, budgets, counts=counts, pin=pin, forbid=forbid,
                 options=options)
    out: list[Result] = []
    for i in range(n):
        res = m.solve()
        if i == 0:
            res = explained(m, res)
        if progress is not None:
            progress(i, res)
        if res.status == "infeasible" and i == 0:
            res.raise_if_infeasible()
        if not res.ok:
            break
        out.append(res)
        m.add_diversity(res.chosen, min_distance)
    return out


@dataclass
class Sweep:
    """Results of a budget sweep: ``values[i]`` gave ``results[i]``; ``frontier`` lists the
    indices of the Pareto-optimal points (objective vs the swept key's total), by total."""

    key: str
    values: list[float]
    results: list[Result]
    frontier: list[int]

    def to_dict(self, library: BlockLibrary | None = None) -> dict[str, Any]:
        """JSON-able dict."""
        return {"key": self.key, "values": self.values, "frontier": self.frontier,
                "results": [r.to_dict(library) for r in self.results]}


def pareto_front(points: Sequence[tuple[float, float]], sense: Literal["min", "max"] = "min"
                 ) -> list[int]:
    """Indices of the non-dominated ``(cost, objective)`` points (lower cost is better;
    objective lower is better for ``min``), sorted by cost."""
    sgn = 1.0 if sense == "min" else -1.0
    order = sorted(range(len(points)), key=lambda i: (points[i][0], sgn * points[i][1]))
    out: list[int] = []
    best = math.inf
    for i in order:
        v = sgn * points[i][1]
        if not out or v < best - 1e-12 * max(1.0, abs(best)):
            out.append(i)
            best = v
    return out


# the model of a sweep worker process (built once per process by _sweep_worker_init)
_WORKER: dict[str, Any] = {}


def _sweep_worker_init(library: BlockLibrary, objective: Objective, budgets: list[Budget],
                       counts: Sequence[CountRule | str], pin: Sequence[int],
                       forbid: Sequence[int], options: SolveOptions | None, idx: int,
                       lo: float | None) -> None:
    _WORKER["model"] = MipModel(library, objective, budgets, counts=counts, pin=pin,
                                forbid=forbid, options=options)
    _WORKER["idx"], _WORKER["lo"] = idx, lo


def _sweep_worker_solve(value: float | None, incumbent: np.ndarray | None) -> Result | None:
    """Solve the worker's model at ``total(key) <= value``; None does nothing (a task that
    makes the pool start its processes, which build their model as they start)."""
    if value is None:
        return None
    m = _WORKER["model"]
    m.set_budget(_WORKER["idx"], _WORKER["lo"], value)
    return explained(m, m.solve(incumbent=incumbent), max_resolves=0)


def sweep(
    library: BlockLibrary,
    objective: str | Objective,
    budgets: Sequence[Budget | str] = (),
    *,
    key: str,
    values: Sequence[float],
    counts: Sequence[CountRule | str] = (),
    pin: Sequence[int] = (),
    forbid: Sequence[int] = (),
    options: SolveOptions | None = None,
    progress: Callable[[int, Result], None] | None = None,
    workers: int = 1,
) -> Sweep:
    """Re-solve with ``total(key) <= v`` for each ``v`` in ``values`` (replacing any upper
    bound on ``key`` in ``budgets``), on one HiGHS model (only the row bound changes).

    The loosest point is solved first; every point whose bound its child meets has the
    same optimum (the feasible set only shrinks), so it is reused, not re-solved. The other
    points are solved from the tightest to the loosest, each given a child of a tighter
    point as a checked incumbent (it stays feasible as the bound loosens; see
    :meth:`MipModel.solve`).

    ``workers > 1`` solves those points in that many processes (spawned; each builds the
    model once and takes the next point as it finishes one; the incumbent is the best
    child of the tighter points done by then). Every point is solved to the same gap as
    alone, so the answers are the same optimum within the gap whatever the number of
    workers. Scripts that call it with ``workers > 1`` need the usual
    ``if __name__ == "__main__":`` guard of process pools.

    Results come back in the order of ``values``; ``progress(i, result)`` is called as each
    point is done. Infeasible points carry their explanation in ``message``."""
    bl = [b if isinstance(b, Budget) else Budget.parse(b) for b in budgets]
    library.kind(key)
    vals = [float(v) for v in values]
    if not vals:
        raise InputError("sweep needs at least one value")
    if int(workers) < 1:
        raise InputError(f"sweep workers must be >= 1, got {workers!r}")
    idx = next((i for i, b in enumerate(bl) if b.key == key and b.hi is not None), None)
    if idx is None:
        bl.append(Budget(key, None, max(vals)))
        idx = len(bl) - 1
    lo = bl[idx].lo
    m = MipModel(library, objective, bl, counts=counts, pin=pin, forbid=forbid, options=options)
    for v in vals:
        if lo is not None and v < lo:
            raise InputError(f"sweep value {v:g} is below the lower bound {lo:g} on {key!r}")
    results: list[Result | None] = [None] * len(vals)

    def done_point(i: int, res: Result) -> None:
        results[i] = res
        if progress is not None:
            progress(i, res)

    order = sorted(range(len(vals)), key=lambda j: vals[j])
    loosest = order[-1]
    pool = None
    if int(workers) > 1 and len(vals) > 2:
        # the workers start (imports, model) while this process solves the loosest point
        import multiprocessing
        from concurrent.futures import ProcessPoolExecutor

        n = min(int(workers), len(vals) - 1)
        pool = ProcessPoolExecutor(
            n, mp_context=multiprocessing.get_context("spawn"),
            initializer=_sweep_worker_init,
            initargs=(library, m.objective, bl, m.counts, m.pin, m.forbid, m.opts, idx, lo))
        for _ in range(n):
            pool.submit(_sweep_worker_solve, None, None)
    try:
        m.set_budget(idx, lo, vals[loosest])
        top = explained(m, m.solve(), max_resolves=0)  # shortest-path explanation only
        done_point(loosest, top)
        todo = []
        for i in order[:-1]:
            if top.status == "optimal" and top.totals[key] <= vals[i]:
                done_point(i, replace(top, seconds=0.0, message=(
                    f"the child at {key}<={vals[loosest]:g} meets this bound: same optimum")))
            else:
                todo.append(i)
        if pool is not None and len(todo) > 1:
            _sweep_parallel(pool, n, vals, todo, m.objective.sense, done_point)
        else:
            prev: np.ndarray | None = None
            for i in todo:
                m.set_budget(idx, lo, vals[i])
                res = explained(m, m.solve(incumbent=prev), max_resolves=0)
                done_point(i, res)
                if res.ok:
                    prev = res.chosen
    finally:
        if pool is not None:
            pool.shutdown(wait=True, cancel_futures=True)
    done = [r for r in results if r is not None]
    pts = [(r.totals[key], r.objective) for r in done if r.ok and r.objective is not None]
    ok_idx = [i for i, r in enumerate(done) if r.ok and r.objective is not None]
    front = [ok_idx[j] for j in pareto_front(pts, m.objective.sense)]  # type: ignore[arg-type]
    return Sweep(key, vals, done, front)


def _sweep_parallel(pool: Any, n: int, vals: list[float], todo: list[int], sense: str,
                    done_point: Callable[[int, Result], None]) -> None:
    """Hand the points ``todo`` (tightest first) to ``pool``'s ``n`` workers one at a time; each
    goes with the best child found so far at a tighter bound (feasible at its own)."""
    from concurrent.futures import FIRST_COMPLETED, wait

    sgn = 1.0 if sense == "min" else -1.0
    found: list[tuple[float, float, np.ndarray]] = []  # (bound, sgn * objective, chosen)
    queue = list(todo)
    running: dict[Any, int] = {}

    def submit() -> None:
        i = queue.pop(0)
        tighter = [(o, c) for v, o, c in found if v <= vals[i]]
        inc = min(tighter, key=lambda t: t[0])[1] if tighter else None
        running[pool.submit(_sweep_worker_solve, vals[i], inc)] = i

    while queue and len(running) < n:
        submit()
    while running:
        finished, _ = wait(list(running), return_when=FIRST_COMPLETED)
        for f in finished:
            i = running.pop(f)
            res = f.result()
            done_point(i, res)
            if res.ok and res.objective is not None:
                found.append((vals[i], sgn * res.objective, res.chosen))
        while queue and len(running) < n:
            submit()
