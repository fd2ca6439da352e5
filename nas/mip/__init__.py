"""The mixed-integer program: pick one replacement per covered span, best under every budget.

Model (one binary ``x[r]`` per replacement ``r`` of a :class:`~nas.library.BlockLibrary`):

- **exact cover**: for every parent block ``b``, ``sum_{r covers b} x[r] = 1`` (the path
  ``0 -> L`` of the replacement graph);
- **budgets** (:class:`Budget`): ``lo <= sum_r v_k[r] x[r] + constant_k <= hi`` on any cost
  or score key ``k``;
- **count rows** (:class:`CountRule`): bounds on the number of chosen replacements carrying a
  tag (``unit="replacements"``), or on the number of parent blocks those replacements
  cover (``unit="blocks"``, coefficient = span length);
- **ties** (:class:`Tie`): groups of replacements (one per value of an axis an engine
  reads once per model) of which a child takes at most one, as rows over the replacement
  columns (see :class:`Tie`); a model with a tie is solved by HiGHS, never by the DP;
- **pins / forbids**: ``x[r] = 1`` / ``x[r] = 0``;
- **objective** (:class:`Objective`): minimize or maximize a weighted sum of keys (scores
  for the usual "best quality under budgets", a cost for the dual form "least runtime under
  a quality bound").

The matrix is built as numpy arrays (CSC) and handed to HiGHS in one ``passModel`` call.

A budget whose coefficients are exact binary fractions that move in a coarse common step
(``v[r] = q * (d * w[r] + residue)`` with at most a few residues; measured sizes in MiB)
is also written over integer columns, ``q * (d * W + sum_k residue_k * N_k)`` with ``W =
sum w[r] x[r]`` and ``N_k`` the number of chosen replacements with residue ``k``
(``SolverTuning.lattice``, :func:`nas.mip.rows.lattice_split`): the same feasible set, but
HiGHS' rounding cuts then see that no child can spend the last fraction of a step, which
the LP relaxation does (NVlabs' Llama-3.3-70B library: a 12 MiB step; its pools' hardest
solves went from 10^5 nodes to a few thousand).

A restricted model (after the reduced-cost fixing below) with one or two budget rows in
force and no count, tie or diversity row is solved exactly by dynamic programming over the
replacement graph (``SolverTuning.dp``, :mod:`nas.mip.dp`: a resource-constrained shortest
path with Pareto labels, each budget compared to its bound with only a 1e-12 rounding
allowance) instead of by HiGHS, which falls back in when the labels grow past a limit. Its
answer is the restricted optimum itself, so the guarantees below hold unchanged.

Scaling, tolerances and gaps
----------------------------
The objective is handed to HiGHS in *typical-coefficient units*: divided by ``unit``, the
median of its nonzero absolute coefficients over the live columns. The median, not the
largest coefficient: real libraries mix a catastrophic alternative (KL in the hundreds)
with differences of 1e-5 between good ones, and dividing by the outlier pushed those real
differences under HiGHS' absolute tolerances (a worse child reported as proven optimal).

HiGHS prunes any node whose bound is within ``mip_feasibility_tolerance`` of the
incumbent, so that tolerance is an absolute resolution of the objective. It is set from
the data: ``feastol = clip(allowed(est) / 10, 1e-10, 1e-6)`` where ``allowed(U) =
max(G * |U|, G, abs_gap / unit)`` (HiGHS units) is the gap the caller accepts,
``G = max(mip_rel_gap, 1e-9)`` and ``est`` a lower bound on ``|U|`` (the LP bound or the
budget-free shortest path). The primal and dual feasibility tolerances are
``min(1e-7, feastol)``. ``mip_rel_gap = 0`` therefore means "optimal within 1e-9 relative"
(or 1e-9 of a typical coefficient when the optimum is near 0).

The reported bound is honest: ``min(HiGHS' dual bound, U - feastol)`` (HiGHS cannot see
children better than the incumbent by less than ``feastol``), and with reduced-cost fixing
also ``<= LP bound + fixing threshold``. ``optimal`` is reported only when ``U - bound <=
allowed(U)``; when HiGHS says optimal but the bound does not support it, the solve is
repeated once with the tolerance tightened to the incumbent's scale, and otherwise the
result is ``feasible`` with its true gap. The ``gap`` reported is ``(U - bound) / max(|U|, unit)``
(block sums, HiGHS units), so ``gap <= mip_rel_gap`` is what ``optimal`` promises.

Budget rows are divided by their largest coefficient (after the shortest-path shift
below), so the feasibility tolerance is relative to the row's own scale; the
re-verification checks every budget to ``feastol`` of that scale.
The objective's non-block constants are **not** passed to HiGHS (no offset): HiGHS' relative
gap, the ``gap`` reported and ``mip_rel_gap`` all refer to the block sum only, which is the
stricter choice (a large constant would otherwise make a loose gap look tight).
``objective`` and ``best_bound`` are reported with the constants added back, in the
objective's own units; ``mip_abs_gap`` is in those units too.

Status
------
``optimal`` only when HiGHS proved optimality within the requested gaps; ``feasible`` when
it stopped (time limit, ...) holding an incumbent; ``infeasible`` when no child satisfies
every row (``message`` then explains why, see :func:`explain_infeasible`); ``error``
otherwise. Every solution is re-verified against the library (cover, budgets, counts,
pins, forbids, diversity) and :class:`SolverError` is raised if HiGHS returned one that
breaks a row.
"""

from __future__ import annotations

from nas.mip.constraints import (
    Budget,
    CountRule,
    InfeasibleError,
    Objective,
    SolverError,
    Tie,
    key_unit,
    parse_value,
)
from nas.mip.explain import explain_infeasible
from nas.mip.model import MipModel
from nas.mip.options import GAP_FLOOR, SolveOptions, SolverTuning, Status
from nas.mip.pool import Sweep, diverse_pool, pareto_front, solve, sweep
from nas.mip.result import Result

__all__ = [
    "GAP_FLOOR", "Budget", "CountRule", "InfeasibleError", "MipModel", "Objective", "Result",
    "SolveOptions", "SolverError", "SolverTuning", "Status", "Sweep", "Tie", "diverse_pool",
    "explain_infeasible", "key_unit", "pareto_front", "parse_value", "solve", "sweep",
]
