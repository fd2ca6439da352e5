"""Why no child meets every constraint: shortest paths first, then a deletion filter."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from nas.library import BlockLibrary
from nas.mip.constraints import Budget, CountRule, Objective, Tie
from nas.mip.model import MipModel
from nas.mip.options import SolveOptions
from nas.mip.rows import allowed_mask


def _extreme_path(lib: BlockLibrary, allowed: np.ndarray, v: np.ndarray, largest: bool
                  ) -> float | None:
    """Least (or largest) sum of ``v`` over a path 0 -> L of allowed replacements; None if
    there is no such path."""
    p = float(lib.path_values(v, allowed, largest)[-1])
    return p if np.isfinite(p) else None


def _fmt(v: float) -> str:
    return f"{v:.6g}"


def _pins_explained(lib: BlockLibrary, pin: list[int], forbid: list[int]) -> str:
    """Why pins and forbids alone leave no child ("" when they do not)."""
    clash = sorted(set(pin) & set(forbid))
    if clash:
        return f"replacement {clash[0]} ({lib.labels[clash[0]]!r}) is both pinned and forbidden"
    for a in pin:
        for b in pin:
            if a < b and lib.start[a] < lib.end[b] and lib.end[a] > lib.start[b]:
                return (f"pinned replacements {a} ({lib.labels[a]!r}) and {b} "
                        f"({lib.labels[b]!r}) overlap")
    allowed = allowed_mask(lib, pin, forbid)
    if _extreme_path(lib, allowed, np.zeros(lib.num_replacements), False) is None:
        reach, _ = lib.reach(allowed)
        b = int(np.flatnonzero(~reach)[0])
        return (f"pins and forbids leave no replacement path over the parent's blocks: nothing "
                f"allowed covers {lib.block_name(b - 1)} after the blocks before it")
    return ""


def _budgets_alone(lib: BlockLibrary, bl: list[Budget], pin: list[int], forbid: list[int]
                   ) -> str:
    """The budgets that no child meets even alone, with the best total a child reaches
    (shortest paths; "" when each can be met alone)."""
    allowed = allowed_mask(lib, pin, forbid)
    alone: list[str] = []
    for b in bl:
        v, const = lib.values(b.key), lib.constant(b.key)
        tol = 1e-9 * max(1.0, float(np.abs(v).max()) * lib.num_blocks, abs(const))
        if b.hi is not None:
            least = _extreme_path(lib, allowed, v, False)
            assert least is not None
            least += const
            if least > b.hi + tol:
                alone.append(f"{b.key} can go no lower than {_fmt(least)} (budget <= {_fmt(b.hi)})")
        if b.lo is not None:
            most = _extreme_path(lib, allowed, v, True)
            assert most is not None
            most += const
            if most < b.lo - tol:
                alone.append(f"{b.key} can go no higher than {_fmt(most)} (budget >= {_fmt(b.lo)})")
    return "infeasible: " + "; ".join(alone) if alone else ""


def explain_infeasible(
    library: BlockLibrary,
    budgets: Sequence[Budget | str] = (),
    *,
    counts: Sequence[CountRule | str] = (),
    pin: Sequence[int] = (),
    forbid: Sequence[int] = (),
    options: SolveOptions | None = None,
    max_resolves: int = 64,
    ties: Sequence[Tie] = (),
) -> str:
    """One-line explanation of why no child meets every constraint.

    1. Pins/forbids that leave no replacement path ``0 -> L`` are named.
    2. For each budget alone, the least (for ``<=``) / largest (for ``>=``) achievable
       total is found by shortest paths over the replacement graph (constants included);
       budgets that cannot be met even alone are named with that bound.
    3. Otherwise, a deletion filter over budgets and count rules (a few feasibility
       re-solves with HiGHS) finds a small set of constraints that conflict: removing any
       one of them makes the rest feasible. Ties (:class:`~nas.mip.constraints.Tie`) hold
       in every re-solve: when they alone leave no child, the message says so.
    """
    lib = library
    bl = [b if isinstance(b, Budget) else Budget.parse(b) for b in budgets]
    cl = [c if isinstance(c, CountRule) else CountRule.parse(c) for c in counts]
    pin = [int(i) for i in pin]
    forbid = [int(i) for i in forbid]
    why = _pins_explained(lib, pin, forbid) or _budgets_alone(lib, bl, pin, forbid)
    if why:
        return why

    # deletion filter over the constraints (budgets and count rules)
    items: list[Budget | CountRule] = [*bl, *cl]
    if max_resolves <= 0:
        return ("infeasible: each budget can be met alone, but not together "
                f"({', '.join(str(x) for x in items)}; conflict search skipped)")
    base = SolveOptions(time_limit=(options.time_limit if options else None) or 30.0,
                        mip_rel_gap=1.0, seed=options.seed if options else 0,
                        threads=options.threads if options else None)
    solves = 0

    def feasible(sub: list[Budget | CountRule]) -> bool | None:
        nonlocal solves
        solves += 1
        m = MipModel(lib, Objective({lib.keys()[0]: 0.0}),
                     [x for x in sub if isinstance(x, Budget)],
                     counts=[x for x in sub if isinstance(x, CountRule)],
                     pin=pin, forbid=forbid, options=base, ties=ties)
        r = m.solve()
        if r.status == "infeasible":
            return False
        return True if r.ok else None

    if feasible(items) is not False:
        return "infeasible (HiGHS), but a re-solve found a feasible child: numerically delicate budgets"
    core = list(items)
    i = 0
    while i < len(core) and solves < max_resolves:
        trial = core[:i] + core[i + 1:]
        if feasible(trial) is False:
            core = trial
        else:
            i += 1
    names = ", ".join(str(x) for x in core)
    if not core and ties:
        return ("infeasible: the tied choices leave no child (every block of a kind takes one "
                f"value: {'; '.join(str(t) for t in ties)})")
    if len(core) == 1:
        return f"infeasible: {names} cannot be met (with the pins and forbids)"
    return (f"infeasible: each budget can be met alone, but not together; "
            f"these {len(core)} conflict: {names}")
