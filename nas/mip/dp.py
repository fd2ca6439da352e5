"""Exact dynamic programming over the replacement graph for small restricted models.

After LP reduced-cost fixing (see :meth:`nas.mip.MipModel.solve`) the model HiGHS is
handed is often tiny: on NVlabs' Llama-3.3-70B library with a runtime budget alone, 139 of
1,280 replacements stay free and HiGHS' presolve leaves 17 rows and 64 columns, yet its
branch and bound spends 102 nodes and ~50 ms closing the last 1e-4 of the gap (about 0.5
ms a node, most of the solve). The same restricted problem is a resource-constrained
shortest path: a child is a path ``0 -> L`` of replacements, each budget a resource.
:func:`path_optimum` solves it exactly with Pareto labels (a label at boundary ``b`` is the
budget totals and the objective of one path ``0 -> b``; a label that another beats or ties
on every budget and on the objective is dropped, as are labels that cannot meet a budget
or beat the cutoff on any completion), and gives up (None) past a label limit, when the
caller falls back to HiGHS.

The answer is the restricted optimum itself, not a solution within a tolerance: budgets
are compared to their bounds with a slack of ``1e-12`` of the row's scale (the rounding of
a sum taken in another order, far under HiGHS' feasibility tolerance), and the objective
is compared exactly.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

#: rounding allowance of a sum of doubles taken in another order, relative to the scale
#: of its terms (budgets are checked in :meth:`nas.mip.MipModel.verify` with the same)
ROUNDING = 1e-12
#: a label of a two-row model counts this many in :func:`path_optimum`'s work limit
#: (measured: its dominance test, a Python loop, takes ~0.45 us a label; the one-row test,
#: a sort, ~0.07 us)
TWO_ROWS_WORK = 6


@dataclass
class Row:
    """One budget as the DP sees it: ``sum_r v[r] x[r] <= hi`` (a lower bound is written
    as ``-v <= -lo`` by the caller), with ``scale`` the row's largest coefficient."""

    v: np.ndarray
    hi: float
    scale: float


def _remaining(start: np.ndarray, end: np.ndarray, L: int, edges: np.ndarray,
               w: np.ndarray) -> np.ndarray:
    """float[L+1]: the least sum of ``w`` over a path of ``edges`` from each boundary to
    ``L`` (+inf where none reaches it)."""
    p = np.full(L + 1, np.inf)
    p[L] = 0.0
    order = edges[np.argsort(-start[edges], kind="stable")]
    for r in order:
        v = p[end[r]] + w[r]
        if v < p[start[r]]:
            p[start[r]] = v
    return p


def _pareto(cost: np.ndarray, obj: np.ndarray) -> np.ndarray:
    """Indices of the labels no other label beats or ties on every cost and on the
    objective (of labels equal on all, the first)."""
    n, k = cost.shape
    assert k <= 2
    if n <= 1:
        return np.arange(n)
    if k == 1:
        order = np.lexsort((obj, cost[:, 0]))
        o = obj[order]
        best = np.minimum.accumulate(o)
        keep = np.ones(n, dtype=bool)
        keep[1:] = o[1:] < best[:-1]
        return order[keep]
    # two rows: in the order of the objective, a label is beaten or tied by an earlier one
    # iff by one on the staircase of the earlier labels' (cost 1, cost 2) minima (cost 1
    # increasing, cost 2 decreasing): the one with the largest cost 1 not above its own
    order = np.lexsort((cost[:, 1], cost[:, 0], obj))
    xs_all, ys_all = cost[order, 0].tolist(), cost[order, 1].tolist()
    xs: list[float] = []
    ys: list[float] = []
    kept: list[int] = []
    for i in range(n):
        x, y = xs_all[i], ys_all[i]
        p = bisect.bisect_right(xs, x)
        if p and ys[p - 1] <= y:
            continue
        kept.append(i)
        q = e = bisect.bisect_left(xs, x)
        while e < len(xs) and ys[e] >= y:  # the staircase points it beats or ties
            e += 1
        xs[q:e] = [x]
        ys[q:e] = [y]
    return order[np.array(kept, dtype=np.int64)]


def path_optimum(start: np.ndarray, end: np.ndarray, L: int, c: np.ndarray,
                 rows: Sequence[Row], allowed: np.ndarray, cutoff: float | None,
                 max_labels: int = 5000, keep: int = 1, max_work: int = 400_000
                 ) -> tuple[str, list[np.ndarray]] | None:
    """The least-``c`` path ``0 -> L`` over the ``allowed`` replacements that meets every
    row (and, with ``cutoff``, has an objective below it): ``("optimal", children)``,
    the replacement indices of that path first, then of up to ``keep - 1`` more paths
    that meet the rows (the next best of the labels kept at ``L``: runner-ups, not the
    second-best paths in general), best first; ``("cutoff", [])`` when no path beats the
    cutoff, ``("infeasible", [])`` when none meets the rows; None when some boundary would
    hold more than ``max_labels`` labels, or once more than ``max_work`` labels were made
    (with two rows each counts :data:`TWO_ROWS_WORK`): the caller solves the model
    otherwise."""
    edges = np.flatnonzero(allowed)
    k = len(rows)
    if k == 0 or k > 2:
        return None
    rem_obj = _remaining(start, end, L, edges, c)
    if not np.isfinite(rem_obj[0]):
        return ("infeasible", [])
    rem = [_remaining(start, end, L, edges, row.v) for row in rows]
    slack = np.array([ROUNDING * max(abs(row.hi), row.scale) for row in rows])
    his = np.array([row.hi for row in rows]) + slack
    by_end: list[list[int]] = [[] for _ in range(L + 1)]
    for r in edges[np.argsort(start[edges], kind="stable")]:
        by_end[int(end[r])].append(int(r))
    V = np.stack([row.v for row in rows], axis=1)
    # labels per boundary: costs (n, k), objective (n,), predecessor label, edge
    lab_cost: list[np.ndarray | None] = [None] * (L + 1)
    lab_obj: list[np.ndarray | None] = [None] * (L + 1)
    lab_pred: list[np.ndarray | None] = [None] * (L + 1)
    lab_edge: list[np.ndarray | None] = [None] * (L + 1)
    lab_cost[0], lab_obj[0] = np.zeros((1, k)), np.zeros(1)
    lab_pred[0] = lab_edge[0] = np.full(1, -1, dtype=np.int64)
    work = 0
    eps_obj = ROUNDING * (1.0 + float(np.abs(c[edges]).sum()))
    for b in range(1, L + 1):
        parts = [(r, int(start[r])) for r in by_end[b] if lab_obj[int(start[r])] is not None]
        if not parts:
            continue
        sizes: list[int] = [lab_obj[s].size for _, s in parts]  # type: ignore[union-attr]  # parts holds only labelled positions (the filter above)
        made = sum(sizes)
        work += made * (1 if k == 1 else TWO_ROWS_WORK)
        if work > max_work:
            return None
        cost = np.concatenate([lab_cost[s] + V[r] for r, s in parts])
        obj = np.concatenate([lab_obj[s] + c[r] for r, s in parts])
        pred = np.concatenate([np.arange(lab_obj[s].size) for r, s in parts])  # type: ignore[union-attr]  # parts holds only labelled positions (the filter above)
        edge = np.concatenate([np.full(lab_obj[s].size, r) for r, s in parts])  # type: ignore[union-attr]  # parts holds only labelled positions (the filter above)
        ok = np.all(cost + np.array([rm[b] for rm in rem]) <= his + slack, axis=1) \
            & np.isfinite(rem_obj[b])
        if cutoff is not None:
            ok &= obj + rem_obj[b] - eps_obj < cutoff
        idx = np.flatnonzero(ok)
        if not idx.size:
            continue
        idx = idx[_pareto(cost[idx], obj[idx])]
        if idx.size > max_labels:
            return None
        lab_cost[b], lab_obj[b], lab_pred[b], lab_edge[b] = cost[idx], obj[idx], pred[idx], edge[idx]
    final = lab_obj[L]
    if final is not None:
        fc = lab_cost[L]
        assert fc is not None
        ok = np.all(fc <= his, axis=1)
        if cutoff is not None:
            ok &= final < cutoff
        cand = np.flatnonzero(ok)
    else:
        cand = np.zeros(0, dtype=np.int64)
    if not cand.size:
        return ("infeasible", []) if cutoff is None else ("cutoff", [])
    out = []
    for i in cand[np.argsort(final[cand], kind="stable")][:keep]:  # type: ignore[index]  # final is set once the DP has reached the last position
        i = int(i)
        chosen: list[int] = []
        b = L
        while b > 0:
            r = int(lab_edge[b][i])  # type: ignore[index]  # the back-pointers of a reached position are set
            chosen.append(r)
            i = int(lab_pred[b][i])  # type: ignore[index]  # the back-pointers of a reached position are set
            b = int(start[r])
        out.append(np.array(chosen[::-1], dtype=np.int64))
    return ("optimal", out)
