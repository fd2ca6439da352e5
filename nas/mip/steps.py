"""The solve, one HiGHS run at a time: LP reduced-cost fixing and its thresholds, the
lazy rows, and the rule that stops a restricted run that cannot be the last (see
:meth:`nas.mip.MipModel.solve` for what each step proves)."""

from __future__ import annotations

import math
import os
import sys
import time
from collections.abc import Generator
from typing import TYPE_CHECKING

import numpy as np

from nas.mip.constraints import SolverError
from nas.mip.highs import FEASTOL_MIN
from nas.mip.result import Result

if TYPE_CHECKING:
    from nas.mip.model import MipModel

_DEBUG = bool(os.environ.get("PUZZLE_NAS_MIP_DEBUG"))
#: ``SolverTuning.lazy_rows``: a budget or count row is left out of the HiGHS runs when the
#: LP relaxation's solution leaves it this many of its largest coefficients of slack (one
#: replacement swapped for any other cannot break it from there)
LAZY_SLACK = 1.0
#: the first fixing threshold is at least this fraction of the LP bound (a guess at the
#: integrality gap; see :func:`first_threshold`). It was 1e-3, with four allowed
#: gaps: 3e-4 and three gaps took bench_mip's 9 instances and NVlabs' 3 scenarios from
#: 5.9 to 4.6 s of CPU at gap 0 and 5.2 to 3.8 s at 1e-4 (NVlabs' own scenarios 2-2.5x
#: faster; the nv80 instances 0.06 -> 0.09 s)
FIRST_FIX = 3e-4


def lazy_candidates(m: MipModel) -> np.ndarray:
    """Budget and count rows (indices into the model's rows) that the last LP
    relaxation's solution (:meth:`MipModel.lp_bound`) leaves slack by at least
    :data:`LAZY_SLACK` times their largest coefficient: the solve leaves them out of
    the HiGHS runs (``SolverTuning.lazy_rows``). On the bench_mip sweeps 4 of the 7
    budget rows are that slack at every point, and every node of the search paid for
    them (cuts, propagation, LP rows)."""
    if m.lp_activity is None:
        return np.zeros(0, dtype=np.int64)
    L = m.lib.num_blocks
    rows = np.arange(L, L + len(m.budgets) + len(m.counts))
    act = m.lp_activity[rows]
    slack = np.minimum(m.row_hi[rows] - act, act - m.row_lo[rows])
    big = np.abs(m.A[rows]).max(axis=1).toarray().ravel()
    out = rows[slack >= LAZY_SLACK * np.maximum(big, 1e-300)]
    # a budget row left out takes its lattice form (SolverTuning.lattice) with it
    by_row = {m.budget_row[i]: r for i, r in m.lattice_row.items()}
    extra = [by_row[int(r)] for r in out if int(r) in by_row]
    return np.concatenate([out, np.asarray(extra, dtype=np.int64)])


def broken_rows(m: MipModel, x: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """Those of ``rows`` that ``x`` (HiGHS' solution, class counts included) breaks by
    more than the feasibility tolerance HiGHS keeps rows to."""
    act = m.A[rows] @ x
    return rows[(act > m.row_hi[rows] + m.feastol)
                | (act < m.row_lo[rows] - m.feastol)]


def first_threshold(m: MipModel, lb0: float, d: np.ndarray) -> tuple[float, float]:
    """``(tau, span)``: the first reduced-cost fixing threshold after an LP bound
    ``lb0`` with reduced costs ``d`` (HiGHS units; three allowed gaps, or
    :data:`FIRST_FIX` of the bound), and ``span``, the largest reduced cost of a free
    column."""
    free = (m.col_lo == 0) & (m.col_hi == 1)
    span = float(np.max(np.abs(d[free]))) if free.any() else 0.0
    return max(3 * m.allowed_gap(lb0), FIRST_FIX * max(abs(lb0), 1e-3 * span)), span


def threshold_for(m: MipModel, u: float, lb0: float) -> float:
    """The fixing threshold ``tau`` (HiGHS units, above the LP bound ``lb0``) that puts
    ``lb0 + tau`` half the allowed gap below the incumbent's objective ``u`` (a hair
    above, against rounding): a restricted run that finds nothing better then proves
    ``u`` within the allowed gap."""
    return (u - 0.5 * m.allowed_gap(u) - lb0) * (1 + 1e-9) + 1e-12


def stop_threshold(m: MipModel, t: float) -> float:
    """The least dual bound ``D`` of a restricted run that proves ``D - allowed(D) >
    t`` (HiGHS units): past it, the run's optimum ``U'`` (``>= D``) has ``U' -
    allowed(U') > t``, because ``U - allowed(U)`` grows with ``U``."""
    g, a = m.rel_gap, m.abs_gap
    scaled = t / (1 - g) if t >= 0 else t / (1 + g)
    d = max(t + g, t + a, scaled)
    return d + 1e-12 * max(1.0, abs(d))


def solve_steps(model: MipModel, incumbent: np.ndarray | None = None
                ) -> Generator[float, MipModel | None, Result]:
    """:meth:`MipModel.solve_steps`: yields the gap left before every run after the first,
    is sent the model that runs the rest (None: the same), returns the :class:`Result`."""
    s = _Solve(model)
    early = s.start(incumbent)
    if early is not None:
        return early
    try:
        while True:
            if s.runs:
                # between runs: hand back the gap left, go on with the model sent
                nxt = yield s.pause()
                s.resume(nxt)
            if s.step():
                break
    finally:
        s.m._bounds(s.m.col_lo, s.m.col_hi)
    return s.result()


class _Solve:
    """The state of one solve between its runs. ``first`` is the model the solve began
    on (its rows, bounds and options define the problem), ``m`` the model that runs now
    (another thread's model of the same problem, see :meth:`MipModel.solve_steps`).
    ``lb0`` and ``d``: the LP bound and reduced costs; ``tau``: the fixing threshold;
    ``inc`` / ``u``: the incumbent and its objective; ``bound``: the global bound proven
    so far (all in HiGHS units)."""

    def __init__(self, model: MipModel) -> None:
        self.first = self.m = model
        self.tune = model.tuning
        self.t0 = time.perf_counter()
        self.spent = [0.0, self.t0]  # seconds in earlier steps, start of this one
        self.nodes = 0
        self.runs: list[str] = []
        self.inc: np.ndarray | None = None
        self.u = math.inf
        self.status, self.msg = "error", ""
        self.bound = -math.inf
        self.retightened = False
        self.lb0, self.d = -math.inf, np.zeros(0)
        self.tau, self.span = math.inf, 0.0
        self.free = np.zeros(0, dtype=bool)
        self.lazy = np.zeros(0, dtype=np.int64)

    def elapsed(self) -> float:
        return self.spent[0] + time.perf_counter() - self.spent[1]

    def left(self) -> float | None:
        limit = self.first.opts.time_limit
        return None if limit is None else max(0.0, limit - self.elapsed())

    def start(self, incumbent: np.ndarray | None) -> Result | None:
        """Before the first run: the LP bound and reduced costs (``fixing``), the first
        tolerance and threshold, the lazy rows and the incumbent. Returns the result when
        the LP already shows the model infeasible."""
        first, m = self.first, self.m
        lp_status = "skipped"
        if self.tune.fixing:
            lp_status, self.lb0, self.d = m.lp_bound(self.left())
            if lp_status == "infeasible":
                return m._result(self.elapsed(), "infeasible", None, -math.inf, self.nodes, "")
        lb0 = self.lb0
        est = max(abs(lb0) if math.isfinite(lb0) else 0.0, abs(first._unconstrained_min()))
        m._set_feastol(first._tolerance_for(est))
        self.free = (first.col_lo == 0) & (first.col_hi == 1)
        if lp_status != "optimal" or not math.isfinite(lb0):
            # no LP bound (fixing off, or the LP stopped): nothing is ever fixed, and the
            # loop is one run of the full model (plus the tightening re-run)
            self.lb0, self.d = -math.inf, np.zeros(first.c_min.size)
            self.tau, self.span = math.inf, 0.0
        else:
            self.tau, self.span = first.first_threshold(lb0, self.d)
        # rows the LP leaves far from binding stay out of the runs (see lazy_candidates)
        if self.tune.lazy_rows and lp_status == "optimal":
            self.lazy = m.lazy_candidates()
        first.runs = self.runs
        if incumbent is not None:
            self.take_incumbent(incumbent)
        return None

    def take_incumbent(self, incumbent: np.ndarray) -> None:
        """A given child that meets the current rows is the incumbent: a cutoff from the
        first run; by default tau starts small as without it (set from it, a sweep's
        far-off neighbour freed nearly every column: bench_mip's sweep took 1.5-1.9x the
        CPU), and the stop rule ends runs that cannot be the last."""
        first = self.first
        x0 = np.zeros(first.lib.num_replacements)
        x0[np.asarray(incumbent, dtype=np.int64)] = 1.0
        x0 = first.with_counts(x0)
        try:
            first.verify(x0)
        except SolverError:
            return  # not feasible under the current rows: ignore it
        self.inc, self.u = x0, float(first.c_min @ x0)
        if self.tune.incumbent_threshold:
            self.tau = max(self.tau, first.threshold_for(self.u, self.lb0))

    def pause(self) -> float:
        """Between runs: the bounds back to the model's, and the gap left (relative to the
        allowed gap; inf without a child)."""
        m = self.m
        m._bounds(m.col_lo, m.col_hi)
        hint = math.inf if self.inc is None else \
            (self.u - max(self.bound, self.lb0)) / self.first.allowed_gap(self.u)
        self.spent[0] += time.perf_counter() - self.spent[1]
        return hint

    def resume(self, nxt: MipModel | None) -> None:
        """Go on, on ``nxt`` when another model was sent."""
        self.spent[1] = time.perf_counter()
        if nxt is not None and nxt is not self.m:
            nxt._set_feastol(self.m.feastol)
            nxt.runs = self.runs
            self.m = nxt

    def step(self) -> bool:
        """One run and what it proves; True when the solve is done."""
        run = self.run()
        if run is None:
            return False
        st, x, bnd, full = run
        if st == "stopped":
            return self.on_stopped(x)
        if st == "cutoff":
            return self.on_cutoff(full)
        if st == "infeasible":
            return self.on_infeasible(full)
        if st == "error":
            # time ran out: keep the incumbent
            self.status = "feasible" if self.inc is not None else "error"
            return True
        return self.on_solved(st, x, bnd, full)

    def run(self) -> tuple[str, np.ndarray | None, float, bool] | None:
        """One run on the restriction that fixes the columns whose reduced cost passes
        ``tau``: (status, child, bound, whether nothing was fixed), or None when its child
        broke a lazy row (put back; the run is to be repeated)."""
        first, m, tau = self.first, self.m, self.tau
        fix0 = self.free & (self.d > tau)
        fix1 = self.free & (-self.d > tau)
        full = not (fix0.any() or fix1.any())
        lo, hi = first.col_lo.copy(), first.col_hi.copy()
        hi[fix0] = 0.0
        lo[fix1] = 1.0
        m._bounds(lo, hi)
        # with an incumbent, HiGHS searches only for children better than half the
        # allowed gap below it (a cutoff, never a MIP start; half, so that the
        # bound it proves clears the gap by more than rounding)
        u = self.u
        cut = None if self.inc is None else u - 0.5 * first.allowed_gap(u) + m.feastol
        # this run is the last only if its optimum U' has lb0 + tau >= U' - allowed
        # (U'); once HiGHS' bound D on it shows otherwise, more search here is
        # wasted: stop holding a child and raise tau (see stop_threshold)
        stop = math.inf if full or not self.tune.stop else first.stop_threshold(self.lb0 + tau)
        found = m._dp_run(lo, hi, cut, self.lazy) if self.tune.dp else None
        st, x, bnd, n, self.msg = found if found is not None else \
            m._run(self.left(), cut, stop, self.lazy)
        self.nodes += n
        broken = np.zeros(0, dtype=np.int64) if x is None else m.broken_rows(x, self.lazy)
        if broken.size:
            # the child breaks a row left out: put it back and repeat the run (the
            # run's bound held, but its child and its stop do not count)
            self.lazy = np.setdiff1d(self.lazy, broken)
            self.runs.append("lazy row broken")
            return None
        self.runs.append(st)
        if _DEBUG:
            print(f"tau={tau:.3g} free={int(self.free.sum() - fix0.sum() - fix1.sum())} "
                  f"st={st} n={n} feastol={m.feastol:.3g} lb0={self.lb0:.6g} "
                  f"bnd={bnd:.6g} u={u:.6g} "
                  f"t={time.perf_counter() - self.t0:.3f}", file=sys.stderr)
        return st, x, bnd, full

    def keep(self, x: np.ndarray | None) -> None:
        """The run's child becomes the incumbent when it is better."""
        assert x is not None
        val = float(self.first.c_min @ np.round(x))
        if val < self.u:
            self.u, self.inc = val, x

    def on_stopped(self, x: np.ndarray | None) -> bool:
        # a child using a fixed column costs >= lb0 + tau, one using none costs
        # >= D > lb0 + tau: lb0 + tau is a global bound
        self.keep(x)
        self.bound = max(self.bound, min(self.lb0 + self.tau, self.u))
        self.tau = self.first.threshold_for(self.u, self.lb0)
        return False

    def on_cutoff(self, full: bool) -> bool:
        # no child below the cutoff among the free columns, and a child using
        # a fixed one costs >= lb0 + tau (cutoff - feastol, without rounding)
        first, u, lb0, tau = self.first, self.u, self.lb0, self.tau
        bnd = u - 0.5 * first.allowed_gap(u)
        self.bound = max(self.bound, bnd if full else min(bnd, lb0 + tau))
        if full or lb0 + tau >= u - first.allowed_gap(u):
            self.status = "optimal"
            return True
        self.tau = first.threshold_for(u, lb0)
        return False

    def on_infeasible(self, full: bool) -> bool:
        u, lb0, tau = self.u, self.lb0, self.tau
        if self.inc is not None and lb0 + tau >= u - self.first.allowed_gap(u):
            # nothing better among the free columns, and a child using a fixed
            # one costs >= lb0 + tau: the incumbent is optimal
            self.bound = max(self.bound, min(lb0 + tau, u))
            self.status = "optimal"
            return True
        if full:
            self.status = "infeasible"
            return True
        self.tau = max(4 * tau, 1e-2 * self.span)  # any child uses a fixed column
        return False

    def on_solved(self, st: str, x: np.ndarray | None, bnd: float, full: bool) -> bool:
        """An optimal or feasible (stopped early, time limit) restricted run."""
        first, m = self.first, self.m
        self.keep(x)
        u, lb0, tau = self.u, self.lb0, self.tau
        global_lb = bnd if full else min(bnd, lb0 + tau)
        if st == "feasible":  # restricted solve stopped early (time limit)
            self.bound = max(self.bound, min(global_lb, u))
            self.status = "feasible"
            return True
        if (u - bnd > first.allowed_gap(u) and not self.retightened
                and m.feastol > FEASTOL_MIN):
            # HiGHS' optimum is within feastol, which the allowed gap at this
            # incumbent cannot absorb: tighten and re-solve the same restriction
            self.retightened = True
            m._set_feastol(first._tolerance_for(abs(u)))
            return False
        self.bound = max(self.bound, global_lb)
        if full or lb0 + tau >= u - first.allowed_gap(u):
            self.status = "optimal"
            return True
        self.tau = first.threshold_for(u, lb0)
        return False

    def result(self) -> Result:
        """The verified result once the runs are done."""
        m, t = self.m, self.elapsed()
        if self.status == "infeasible":
            return m._result(t, "infeasible", None, -math.inf, self.nodes, "")
        if self.inc is None:
            return m._result(t, "error", None, -math.inf, self.nodes, self.msg)
        return m._result(t, self.status, self.inc, self.bound, self.nodes, "")
