"""The baselines nas.mip is measured against, on the same block library and budgets.

- ``highs_default``: the plain formulation (cover rows + raw budget rows, objective as
  given) handed to HiGHS with its default options: what a user writing the MIP directly
  with highspy gets.
- ``pulp_cbc``: the same plain formulation through PuLP and its bundled CBC, as
  NVIDIA's Puzzletron and NVlabs/puzzle (python-mip/CBC) solve it.
- ``cbc_fixed``: CBC after the same LP reduced-cost fixing as nas.mip (nas.mip's LP bound,
  reduced costs, first threshold and re-solve rule; CBC solves each restricted plain
  model): how much of nas.mip's lead is the fixing, how much HiGHS.
- ``scipy_exact``: scipy.milp (its own HiGHS build) on the plain formulation at gap 0, the
  independent reference the answers are checked against.

Times are wall clock from the library's arrays to a solution, model building included.
"""

from __future__ import annotations

import time
import warnings

import numpy as np
import scipy.sparse as sp

from nas.library import BlockLibrary
from nas.mip import Budget, MipModel, SolveOptions, SolverTuning


def plain_model(lib: BlockLibrary, objective: str, budgets: list[Budget]
                ) -> tuple[np.ndarray, sp.csr_matrix, np.ndarray, np.ndarray]:
    """``(c, A, row_lo, row_hi)``: cover rows then one row per budget (divided by its
    largest coefficient); the objective as given."""
    R, L = lib.num_replacements, lib.num_blocks
    lens = lib.lengths
    rows = np.concatenate([np.arange(lib.start[r], lib.end[r]) for r in range(R)])
    cover = sp.csr_matrix((np.ones(rows.size), (rows, np.repeat(np.arange(R), lens))),
                          shape=(L, R))
    blocks, lo, hi = [cover], [np.ones(L)], [np.ones(L)]
    for b in budgets:
        # each budget row divided by its largest coefficient: on raw rows in seconds
        # (~1e-3) the solvers' absolute tolerances (1e-6) accepted children over budget
        # (scipy.milp: a runtime 3e-5 relative over on super88-s1)
        c, v = lib.constant(b.key), lib.values(b.key)
        s = float(np.abs(v).max()) or 1.0
        blocks.append(sp.csr_matrix(v[None, :] / s))
        lo.append(np.array([-np.inf if b.lo is None else (b.lo - c) / s]))
        hi.append(np.array([np.inf if b.hi is None else (b.hi - c) / s]))
    return (lib.values(objective), sp.vstack(blocks).tocsr(), np.concatenate(lo),
            np.concatenate(hi))


def violation(lib: BlockLibrary, budgets: list[Budget], chosen) -> float:
    """Largest relative amount by which ``chosen`` breaks a budget (0 if none)."""
    tot = lib.totals(np.asarray(chosen, dtype=np.int64))
    worst = 0.0
    for b in budgets:
        t = tot[b.key]
        if b.hi is not None:
            worst = max(worst, (t - b.hi) / max(abs(b.hi), 1e-300))
        if b.lo is not None:
            worst = max(worst, (b.lo - t) / max(abs(b.lo), 1e-300))
    return worst


def _value(lib: BlockLibrary, objective: str, chosen) -> float:
    return float(lib.values(objective)[np.asarray(chosen, dtype=np.int64)].sum()
                 + lib.constant(objective))


def highs_default(lib: BlockLibrary, objective: str, budgets: list[Budget], gap: float,
                  threads: int = 1) -> tuple[float, float, float]:
    """(seconds, objective, budget violation) of HiGHS with default options on the plain
    model."""
    import highspy

    t = time.perf_counter()
    c, A, lo, hi = plain_model(lib, objective, budgets)
    A = A.tocsc()
    h = highspy.Highs()
    h.setOptionValue("output_flag", False)
    h.setOptionValue("mip_rel_gap", gap)
    h.setOptionValue("threads", threads)
    n = c.size
    h.passModel(n, A.shape[0], int(A.nnz), 1, 1, 0.0, c, np.zeros(n), np.ones(n), lo, hi,
                A.indptr.astype(np.int32), A.indices.astype(np.int32), A.data,
                np.ones(n, dtype=np.int32))
    h.run()
    x = np.asarray(h.getSolution().col_value)
    dt = time.perf_counter() - t
    chosen = np.flatnonzero(x > 0.5)
    return dt, _value(lib, objective, chosen), violation(lib, budgets, chosen)


def _cbc(c: np.ndarray, A: sp.csr_matrix, lo: np.ndarray, hi: np.ndarray, gap: float,
         threads: int, free: np.ndarray | None = None, ones: np.ndarray | None = None
         ) -> list[int] | None:
    """PuLP + CBC on ``min c x, lo <= A x <= hi``, x binary; columns outside ``free`` fixed
    at 0 (left out of the model), columns in ``ones`` fixed at 1. Returns the chosen
    columns, None when CBC proves the model infeasible; asserts CBC reports optimal
    otherwise."""
    import pulp

    R = c.size
    keep = np.ones(R, dtype=bool) if free is None else free.copy()
    one = np.zeros(R, dtype=bool) if ones is None else ones
    keep |= one
    prob = pulp.LpProblem("puzzle", pulp.LpMinimize)
    # prob.add_variable, not LpVariable(...): PuLP 3.3 warns per LpVariable (a
    # DeprecationWarning each, 20,000 on nv1280, timed with the baseline)
    x = {r: prob.add_variable(f"x{r}", lowBound=1 if one[r] else 0, upBound=1, cat="Integer")
         for r in np.flatnonzero(keep).tolist()}
    prob += pulp.lpSum(float(c[r]) * v for r, v in x.items() if c[r])
    for i in range(A.shape[0]):
        s, e = A.indptr[i], A.indptr[i + 1]
        expr = pulp.lpSum(float(v) * x[j] for j, v in zip(A.indices[s:e].tolist(), A.data[s:e])
                          if v and j in x)
        if lo[i] == hi[i]:
            prob += expr == float(hi[i])
        else:
            if np.isfinite(hi[i]):
                prob += expr <= float(hi[i])
            if np.isfinite(lo[i]):
                prob += expr >= float(lo[i])
    with warnings.catch_warnings():  # PULP_CBC_CMD (the CBC bundled with PuLP) is deprecated
        warnings.simplefilter("ignore", DeprecationWarning)
        prob.solve(pulp.PULP_CBC_CMD(msg=0, gapRel=gap, threads=threads))
    if pulp.LpStatus[prob.status] == "Infeasible":
        return None
    assert pulp.LpStatus[prob.status] == "Optimal", pulp.LpStatus[prob.status]
    return [r for r, v in x.items() if (v.value() or 0) > 0.5]


def pulp_cbc(lib: BlockLibrary, objective: str, budgets: list[Budget], gap: float,
             threads: int = 1) -> tuple[float, float, float]:
    """(seconds, objective, budget violation) of PuLP + CBC on the plain model."""
    t = time.perf_counter()
    c, A, lo, hi = plain_model(lib, objective, budgets)
    chosen = _cbc(c, A, lo, hi, gap, threads)
    dt = time.perf_counter() - t
    assert chosen is not None, "infeasible instance"
    return dt, _value(lib, objective, chosen), violation(lib, budgets, chosen)


def cbc_fixed(lib: BlockLibrary, objective: str, budgets: list[Budget], gap: float,
              threads: int = 1) -> tuple[float, float, float]:
    """(seconds, objective, budget violation) of CBC after nas.mip's LP fixing.

    nas.mip's LP relaxation gives a bound ``LB`` and reduced costs ``d`` (HiGHS units);
    columns with ``d > tau`` are left out and CBC solves the restricted plain model to
    ``gap``; a child using a left-out column costs at least ``LB + tau``, so the restricted
    optimum ``U`` is global once ``LB + tau >= U - allowed gap``, else ``tau`` rises to
    ``U - LB`` and CBC solves again (nas.mip's rule, without its HiGHS cutoffs and without
    stopping a restricted run early: PuLP cannot interrupt CBC). Model and LP building are
    timed."""
    t = time.perf_counter()
    # the plain model's columns (no class counts), which the CBC model below has too
    m = MipModel(lib, objective, budgets,
                 options=SolveOptions(mip_rel_gap=gap, threads=1),
                 tuning=SolverTuning(aggregate=False))
    status, lb0, d = m.lp_bound()
    assert status == "optimal", status
    c, A, lo, hi = plain_model(lib, objective, budgets)
    free0 = (m.col_lo == 0) & (m.col_hi == 1)
    tau, span = m.first_threshold(lb0, d)
    while True:
        out = free0 & (d > tau)  # fixed at 0
        ones = (free0 & (-d > tau)) | (m.col_lo == 1)  # fixed at 1 (and pins)
        chosen = _cbc(c, A, lo, hi, gap, threads, free0 & ~out, ones)
        if chosen is None:  # every child uses a left-out column
            assert out.any(), "infeasible instance"
            tau = max(4 * tau, 1e-2 * span)
            continue
        u = float(m.c_min[chosen].sum())
        if lb0 + tau >= u - m.allowed_gap(u) or not out.any():
            break
        tau = (u - 0.5 * m.allowed_gap(u) - lb0) * (1 + 1e-9) + 1e-12
    dt = time.perf_counter() - t
    return dt, _value(lib, objective, chosen), violation(lib, budgets, chosen)


def scipy_exact(lib: BlockLibrary, objective: str, budgets: list[Budget]) -> float | None:
    """The optimum by scipy.milp at gap 0 (None if infeasible)."""
    from scipy.optimize import Bounds, LinearConstraint, milp

    c, A, lo, hi = plain_model(lib, objective, budgets)
    r = milp(c, constraints=LinearConstraint(A, lo, hi), integrality=np.ones(c.size),
             bounds=Bounds(0, 1), options={"mip_rel_gap": 0.0})
    if r.x is None:
        return None
    chosen = np.flatnonzero(r.x > 0.5)
    assert violation(lib, budgets, chosen) <= 1e-9, violation(lib, budgets, chosen)
    return _value(lib, objective, chosen)
