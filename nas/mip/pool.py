"""One solve, a diverse pool of solves, a sweep of a budget, and the Pareto front."""

from __future__ import annotations

import math
import queue
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any, Literal

import numpy as np

from hwprofiles.errors import InputError
from nas.library import BlockLibrary
from nas.mip.constraints import Budget, CountRule, Objective, Tie
from nas.mip.explain import explain_infeasible
from nas.mip.model import MipModel
from nas.mip.options import SolveOptions, SolverTuning
from nas.mip.result import Result


def explained(m: MipModel, res: Result, max_resolves: int = 64) -> Result:
    """``res`` with the explanation of an infeasible model in ``message`` (shortest paths,
    then up to ``max_resolves`` feasibility re-solves; see :func:`explain_infeasible`)."""
    if res.status == "infeasible":
        res.message = explain_infeasible(m.lib, m.budgets, counts=m.counts, pin=m.pin,
                                         forbid=m.forbid, options=m.opts, ties=m.ties,
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
    ties: Sequence[Tie] = (),
    tuning: SolverTuning | None = None,
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

    ``ties``: tied choices (:class:`~nas.mip.constraints.Tie`), e.g. an engine that reads
    an axis once per model.
    """
    m = MipModel(library, objective, budgets, counts=counts, pin=pin, forbid=forbid,
                 options=options, ties=ties, tuning=tuning)
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
    ties: Sequence[Tie] = (),
    tuning: SolverTuning | None = None,
) -> list[Result]:
    """Up to ``n`` solutions, each the best child that differs from every earlier one in at
    least ``min_distance`` parent blocks (a block differs when the replacement covering it
    differs). Stops early when no further child exists; raises :class:`InfeasibleError`
    when not even the first one does. ``progress(i, result)`` is called after each solve.

    Each solve starts from the best child that HiGHS found on the way in an earlier one
    and that differs enough from every solution so far (a runner-up, checked against every
    row; see :meth:`MipModel.found_children`): it is the incumbent, never a MIP start, so
    the answers are the same optimum within the gap, found with fewer nodes."""
    if n < 1:
        raise InputError(f"pool size must be >= 1, got {n}")
    if not 1 <= min_distance <= library.num_blocks:
        raise InputError(f"min_distance must be in [1, {library.num_blocks}], got {min_distance}")
    m = MipModel(library, objective, budgets, counts=counts, pin=pin, forbid=forbid,
                 options=options, ties=ties, tuning=tuning)
    out: list[Result] = []
    for i in range(n):
        # the best child an earlier run found that differs enough from every solution so
        # far (checked against every row) is the incumbent
        known = m.found_children()
        res = m.solve(incumbent=known[0] if known else None)
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
    ties: Sequence[Tie] = (),
    tuning: SolverTuning | None = None,
) -> Sweep:
    """Re-solve with ``total(key) <= v`` for each ``v`` in ``values`` (replacing any upper
    bound on ``key`` in ``budgets``), on one HiGHS model (only the row bound changes).

    The loosest point is solved first; every point whose bound its child meets has the
    same optimum (the feasible set only shrinks), so it is reused, not re-solved. The other
    points are solved from the tightest to the loosest, each given as a checked incumbent
    the best child found so far whose total meets its bound (a tighter point's child stays
    feasible as the bound loosens; see :meth:`MipModel.solve`).

    ``workers > 1`` solves the points in that many threads, each with its own HiGHS model
    (HiGHS releases Python's lock while it runs, so the threads use as many cores; no
    process is started). While one thread solves the loosest point the others start on
    the tightest. Every other point is paused after its first HiGHS run (which finishes
    the easy ones; see :meth:`MipModel.solve_steps`), and once all have started, the
    threads go on with the paused solves, the largest gap left first: the hard points
    start early instead of one of them keeping a thread busy alone at the end. Every
    point is solved to the same gap as alone, so the answers are the same optimum within
    the gap whatever the number of workers (which child is returned at a tie within the
    gap may differ between runs).

    Results come back in the order of ``values``; ``progress(i, result)`` is called in the
    calling thread as each point is done. Infeasible points carry their explanation in
    ``message``."""
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
    m = MipModel(library, objective, bl, counts=counts, pin=pin, forbid=forbid, options=options,
                 ties=ties, tuning=tuning)
    for v in vals:
        if lo is not None and v < lo:
            raise InputError(f"sweep value {v:g} is below the lower bound {lo:g} on {key!r}")
    results: list[Result | None] = [None] * len(vals)

    def done_point(i: int, res: Result) -> None:
        results[i] = res
        if progress is not None:
            progress(i, res)

    order = sorted(range(len(vals)), key=lambda j: vals[j])
    plan = _SweepPlan(key, vals, [order[-1], *order[:-1]], m.objective.sense, idx, lo)
    n = min(int(workers), len(vals))
    if n == 1:
        plan.work(m, done_point)
    else:
        plan.work_threads([m] + [MipModel(library, m.objective, bl, counts=m.counts, pin=m.pin,
                                          forbid=m.forbid, options=m.opts, ties=m.ties,
                                          tuning=m.tuning)
                                 for _ in range(n - 1)], done_point)
    done = [r for r in results if r is not None]
    pts = [(r.totals[key], r.objective) for r in done if r.ok and r.objective is not None]
    ok_idx = [i for i, r in enumerate(done) if r.ok and r.objective is not None]
    front = [ok_idx[j] for j in pareto_front(pts, m.objective.sense)]
    return Sweep(key, vals, done, front)


class _SweepPlan:
    """The points of a sweep still to solve (the loosest first, then the tightest up),
    the loosest point's result (which answers every point whose bound its child meets),
    the children found so far (a checked incumbent for every point whose bound they
    meet) and, with threads, the solves paused after their first run; shared by the
    worker threads under one lock. ``idx`` and ``lo``: the swept budget's row and lower
    bound."""

    def __init__(self, key: str, vals: list[float], order: list[int], sense: str, idx: int,
                 lo: float | None) -> None:
        self.key, self.vals, self.queue, self.idx, self.lo = key, vals, order, idx, lo
        self.loosest = order[0]
        self.top: Result | None = None
        self.sgn = 1.0 if sense == "min" else -1.0
        self.found: list[tuple[float, float, np.ndarray]] = []  # (total, sgn * obj, chosen)
        #: (gap left, point, its solve) after a first run (see MipModel.solve_steps)
        self.paused: list[tuple[float, int, Any]] = []
        self.lock = threading.Lock()

    def take(self) -> tuple[int, np.ndarray | None, Result | None, Any] | None:
        """The next task: a point to start, with its incumbent, or (instead, for a point
        the loosest child meets) its result; once every point is started, the paused solve
        with the largest gap left (the last field). None when nothing is left."""
        with self.lock:
            if self.queue:
                i = self.queue.pop(0)
                v, top = self.vals[i], self.top
                if top is not None and top.status == "optimal" and top.totals[self.key] <= v:
                    lv = self.vals[self.loosest]
                    return i, None, replace(top, seconds=0.0, message=(
                        f"the child at {self.key}<={lv:g} meets this bound: same optimum")), None
                fits = [(o, c) for t, o, c in self.found if t <= v]
                return i, (min(fits, key=lambda f: f[0])[1] if fits else None), None, None
            if self.paused:
                k = max(range(len(self.paused)), key=lambda j: self.paused[j][0])
                _, i, steps = self.paused.pop(k)
                return i, None, None, steps
            return None

    def solve(self, m: MipModel, task: tuple[int, np.ndarray | None, Result | None, Any],
              pause: bool = False) -> Result | None:
        """The result of a task from :meth:`take`, solved on ``m`` unless reused. With
        ``pause``, a point other than the loosest is paused after its first HiGHS run
        (None is returned; :meth:`take` hands it out again, hardest first)."""
        i, incumbent, reused, steps = task
        if reused is not None:
            return reused
        m.set_budget(self.idx, self.lo, self.vals[i])
        try:
            if steps is not None:  # a paused solve goes on here, on this thread's model
                steps.send(m)
                while True:
                    next(steps)
            if not pause or i == self.loosest:
                res = m.solve(incumbent=incumbent)
            else:
                steps = m.solve_steps(incumbent)
                gap = next(steps)
                with self.lock:
                    self.paused.append((gap, i, steps))
                return None
        except StopIteration as done:
            res = done.value
        # infeasible points: the shortest-path explanation only
        res = explained(m, res, max_resolves=0)
        with self.lock:
            if i == self.loosest:
                self.top = res
            if res.ok and res.objective is not None:
                self.found.append((res.totals[self.key], self.sgn * res.objective, res.chosen))
        return res

    def work(self, m: MipModel, done_point: Callable[[int, Result], None]) -> None:
        """Solve the points one after the other on ``m``."""
        while (task := self.take()) is not None:
            res = self.solve(m, task)
            assert res is not None
            done_point(task[0], res)

    def work_threads(self, models: list[MipModel],
                     done_point: Callable[[int, Result], None]) -> None:
        """Solve the points in one thread per model: every point's first HiGHS run, then the
        paused solves with the largest gap left first (the hardest start first, so that no
        thread is left alone with a long one at the end). Results (or the first exception)
        come back to this thread, which calls ``done_point``. On an exception (or Ctrl-C)
        here, the threads take no further task and finish the run they are in."""
        out: queue.SimpleQueue[tuple[int, Result | None, BaseException | None]] = \
            queue.SimpleQueue()
        stop = threading.Event()

        def run(m: MipModel) -> None:
            try:
                while not stop.is_set() and (task := self.take()) is not None:
                    res = self.solve(m, task, pause=True)
                    if res is not None:
                        out.put((task[0], res, None))
            except BaseException as e:  # raised again in the calling thread
                out.put((-1, None, e))
            finally:
                out.put((-1, None, None))  # this thread is done

        threads = [threading.Thread(target=run, args=(m,), daemon=True) for m in models]
        for t in threads:
            t.start()
        try:
            running = len(threads)
            while running:
                try:
                    i, res, err = out.get(timeout=0.1)
                except queue.Empty:
                    continue
                if err is not None:
                    raise err
                if res is None:
                    running -= 1
                else:
                    done_point(i, res)
        finally:
            stop.set()
            for t in threads:
                t.join()
