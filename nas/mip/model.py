"""The model of one library and constraint set: its columns and rows, the HiGHS and DP
runs on it, and the verification of every answer (see :mod:`nas.mip` for the model, the
tolerances and what each status promises; :mod:`nas.mip.steps` for the solve)."""

from __future__ import annotations

import math
from collections.abc import Generator, Sequence
from typing import Any, cast

import numpy as np

from hwprofiles.errors import InputError
from nas.library import BlockLibrary
from nas.mip import steps
from nas.mip.constraints import (
    Budget,
    CountRule,
    Objective,
    SolverError,
    Tie,
)
from nas.mip.highs import SIGNAL_ENV, HighsModel
from nas.mip.options import GAP_FLOOR, SolveOptions, SolverTuning, Status
from nas.mip.result import Result
from nas.mip.rows import (
    LATTICE_MIN_STEP,
    LATTICE_RESIDUES,
    Parts,
    add_class_counts,
    add_lattice,
    allowed_mask,
    cover_rows,
    dead_columns,
    interchangeable_classes,
    lattice_split,
    tie_rows,
)

__all__ = [
    "DP_FREE", "DP_KEEP", "DP_LABELS", "DP_OPEN", "DP_ROWS", "DP_WORK", "GAP_FLOOR",
    "LATTICE_MIN_STEP", "LATTICE_RESIDUES", "SIGNAL_ENV", "MipModel", "Result",
    "SolveOptions", "SolverTuning", "Status", "allowed_mask", "dead_columns",
    "interchangeable_classes", "lattice_split",
]

#: ``SolverTuning.dp``: a restricted run is solved by :func:`nas.mip.dp.path_optimum` when
#: at most this many budget rows are in force, at most ``DP_FREE`` replacements are free,
#: no boundary holds more than ``DP_LABELS`` labels and at most ``DP_WORK`` are made (see
#: :func:`nas.mip.dp.path_optimum`)
DP_ROWS, DP_FREE, DP_LABELS, DP_WORK = 2, 400, 5000, 150_000
#: ... and at most this many blocks are open (more than one replacement allowed to start
#: there): measured, the DP finished every NVlabs-library and nv80 run (<= 40 open blocks,
#: <= 75,000 labels made) and gave up on nv320's (84-87 open of 320) after ~20 ms
DP_OPEN = 64
#: ... and its best ``DP_KEEP`` children are kept for :meth:`MipModel.found_children`
DP_KEEP = 32


class MipModel:
    """A HiGHS model of one library and constraint set, kept for re-solves (pools, sweeps).
    ``options``: what the solve promises (:class:`SolveOptions`); ``tuning``: how the work
    is done (:class:`SolverTuning`, defaults chosen by ``benchmarks/bench_mip.py``).

    Most users call :func:`solve`, :func:`diverse_pool` or :func:`sweep` instead.
    """

    def __init__(
        self,
        library: BlockLibrary,
        objective: str | Objective,
        budgets: Sequence[Budget | str] = (),
        *,
        counts: Sequence[CountRule | str] = (),
        pin: Sequence[int] = (),
        forbid: Sequence[int] = (),
        options: SolveOptions | None = None,
        ties: Sequence[Tie] = (),
        tuning: SolverTuning | None = None,
    ) -> None:
        self.lib = library
        self.opts = options or SolveOptions()
        self.tuning = tuning or SolverTuning()
        self._read(objective, budgets, counts, pin, forbid, ties)
        self.diversity: list[tuple[np.ndarray, int]] = []  # (chosen, min distance)
        #: status of each HiGHS run of the last :meth:`solve` (optimal, cutoff, stopped, ...)
        self.runs: list[str] = []
        self.lp_activity: np.ndarray | None = None
        self._objective()
        parts, budget_v = self._rows()
        A, lo, hi = self._columns(parts, budget_v)
        self._pass(self._finish(A, lo, hi, parts))

    def _read(self, objective: str | Objective, budgets: Sequence[Budget | str],
              counts: Sequence[CountRule | str], pin: Sequence[int], forbid: Sequence[int],
              ties: Sequence[Tie]) -> None:
        """Parse and check the constraints against the library."""
        lib = self.lib
        self.objective = Objective.parse(objective)
        self.budgets = [b if isinstance(b, Budget) else Budget.parse(b) for b in budgets]
        self.counts = [c if isinstance(c, CountRule) else CountRule.parse(c) for c in counts]
        self.ties = list(ties)
        for t in self.ties:
            for g in t.groups:
                for r in g:
                    self._index(r, f"tie {t.name!r}")
        self.pin = sorted({self._index(i, "pin") for i in pin})
        self.forbid = sorted({self._index(i, "forbid") for i in forbid})
        for k in self.objective.weights:
            lib.kind(k)
        for b in self.budgets:
            lib.kind(b.key)
        known_tags = sorted({t for ts in lib.tags for t in ts})
        for c in self.counts:
            if c.tag not in known_tags:
                raise InputError(f"count rule on unknown tag {c.tag!r}; the library's tags are "
                                 f"{known_tags[:20]}", path=lib.source)

    def _objective(self) -> None:
        """The objective over the replacements, in typical-coefficient units (see
        :mod:`nas.mip`): ``c``, its constant, the dead columns and ``obj_scale``."""
        lib = self.lib
        c = np.zeros(lib.num_replacements)
        self.obj_const = 0.0
        for k, w in self.objective.weights.items():
            c += w * lib.values(k)
            self.obj_const += w * lib.constant(k)
        self.c = c
        self.dead = dead_columns(lib)
        live = np.abs(c[~self.dead])
        live = live[live > 0]
        self.obj_scale = float(np.median(live)) if live.size else 1.0

    def _rows(self) -> tuple[Parts, list[np.ndarray]]:
        """Cover, budget, count and tie rows; returns them and each budget row's
        coefficients (after the shift)."""
        parts = cover_rows(self.lib)
        self.budget_row: list[int] = []
        self.budget_scale: list[float] = []
        self.budget_shift: list[float] = []
        budget_v = [self._budget_row(parts, b) for b in self.budgets]
        for cr in self.counts:
            self._count_row(parts, cr)
        #: the rows of each tie (see Tie), after the count rows
        self.tie_rows: list[np.ndarray] = []
        for t in self.ties:
            t_rows, t_cols, t_vals, t_hi = tie_rows(self.lib, t, self.forbid, parts.nrow)
            parts.add(t_rows, t_cols, t_vals)
            self.tie_rows.append(parts.nrow + np.arange(t_hi.size))
            parts.bounds(np.full(t_hi.size, -np.inf), t_hi)
        return parts, budget_v

    def _budget_row(self, parts: Parts, b: Budget) -> np.ndarray:
        """Append budget ``b``'s row, divided by its largest coefficient; returns the
        coefficients."""
        lib = self.lib
        # Shift the row by shortest-path potentials (a combination of cover rows):
        # v'[r] = v[r] - (p[end] - p[start]) >= 0 and sum v' x = sum v x - p[L] on every
        # cover, so the row is equivalent but nonnegative and each coefficient is the
        # extra cost of taking r over the cheapest path: tighter bounds and cuts.
        v0 = lib.values(b.key)
        if self.tuning.shift:  # least sum to each boundary (0 where unreachable)
            p = lib.path_values(v0, ~self.dead)
            p[~np.isfinite(p)] = 0.0
        else:
            p = np.zeros(lib.num_blocks + 1)
        v = np.where(self.dead, 0.0, v0 - (p[lib.end] - p[lib.start]))
        v[np.abs(v) <= 1e-12 * (float(np.max(np.abs(v0))) or 1.0)] = 0.0
        s = float(np.max(np.abs(v))) or 1.0
        nz = np.flatnonzero(v)
        nrow = parts.nrow
        parts.add(np.full(nz.size, nrow), nz, v[nz] / s)
        const = lib.constant(b.key) + float(p[lib.num_blocks])
        self.budget_shift.append(float(p[lib.num_blocks]))
        parts.bounds(np.array([-np.inf if b.lo is None else (b.lo - const) / s]),
                     np.array([np.inf if b.hi is None else (b.hi - const) / s]))
        self.budget_row.append(nrow)
        self.budget_scale.append(s)
        return v

    def _count_row(self, parts: Parts, cr: CountRule) -> None:
        """Append count rule ``cr``'s row."""
        nz = np.flatnonzero(self.lib.tagged(cr.tag))
        coef = self.lib.lengths[nz].astype(float) if cr.unit == "blocks" else np.ones(nz.size)
        parts.add(np.full(nz.size, parts.nrow), nz, coef)
        parts.bounds(np.array([-np.inf if cr.min is None else float(cr.min)]),
                     np.array([np.inf if cr.max is None else float(cr.max)]))

    def _columns(self, parts: Parts, budget_v: list[np.ndarray]
                 ) -> tuple[Any, np.ndarray, np.ndarray]:
        """The matrix with the class counts (``SolverTuning.aggregate``) and the lattice
        forms (``SolverTuning.lattice``) added, and the column bounds."""
        import scipy.sparse as sp

        lib, R, L = self.lib, self.lib.num_replacements, self.lib.num_blocks
        A = sp.coo_matrix((np.concatenate(parts.vals),
                           (np.concatenate(parts.rows), np.concatenate(parts.cols))),
                          shape=(parts.nrow, R)).tocoo()
        #: member indices of each class of interchangeable replacements (see
        #: interchangeable_classes); class k's count is column R + k
        Ac = A.tocsc()
        self.classes = interchangeable_classes(Ac, L, lib.lengths, self.dead, self.c) \
            if self.tuning.aggregate else []
        #: class of each replacement (-1: none); members are continuous until a diversity
        #: row (see add_diversity)
        self._class_of = np.full(R, -1, dtype=np.int64)
        for k, m in enumerate(self.classes):
            self._class_of[m] = k
        self.member = self._class_of >= 0
        A, lo, hi = add_class_counts(A, Ac, parts, self.classes, self.member, L)
        #: SolverTuning.lattice: budget index -> the row of its lattice form, and the map
        #: from replacements to the lattice columns' values (see lattice_split, with_counts)
        self.lattice_row: dict[int, int] = {}
        self._aux_map = sp.csr_matrix((0, R))
        if self.tuning.lattice:
            A, lo, hi, lat = add_lattice(lib, A, parts, lo, hi, budget_v, self.budget_scale,
                                         self.dead, self.classes, self.member)
            self.lattice_row = lat.row
            if lat.maps:
                self._aux_map = sp.csr_matrix(np.vstack(lat.maps))
        return A, lo, hi

    def _finish(self, A: Any, lo: np.ndarray, hi: np.ndarray, parts: Parts) -> Any:
        """Pins, forbids and dead columns in the bounds, the row bounds, and the minimized,
        scaled objective ``c_min`` (class counts and lattice columns cost nothing);
        returns the matrix in CSC."""
        R = self.lib.num_replacements
        A = A.tocsc()
        A.sort_indices()
        hi[self.forbid] = 0.0
        hi[:R][self.dead] = 0.0
        lo[self.pin] = 1.0
        self.col_lo, self.col_hi = lo, hi
        self.row_lo = np.concatenate(parts.row_lo)
        self.row_hi = np.concatenate(parts.row_hi)
        for i, row in self.lattice_row.items():
            self.row_lo[row] = self.row_lo[self.budget_row[i]]
            self.row_hi[row] = self.row_hi[self.budget_row[i]]
        self.num_rows = parts.nrow
        self.A = A.tocsr()
        self.sense = -1 if self.objective.sense == "max" else 1
        extra = len(self.classes) + self._aux_map.shape[0]
        self.c_min = np.concatenate([self.sense * self.c / self.obj_scale, np.zeros(extra)])
        return A

    def _pass(self, A: Any) -> None:
        """Hand the model to a new HiGHS instance and set its gaps and tolerances."""
        R, n = self.lib.num_replacements, int(self.c_min.size)
        self.highs = HighsModel(self.opts, self.tuning)
        self.h = self.highs.h
        # HiGHS always minimizes c_min (a "max" objective is negated here), so its dual
        # bound and objective cutoffs are in the same min-form units as everything below
        integ = np.ones(n, dtype=np.int32)
        integ[:R][self.member] = 0  # 0/1 at every vertex once the counts are integers
        lo, hi = self.col_lo, self.col_hi
        st = self.h.passModel(
            n, self.num_rows, int(A.nnz), 1, 1, 0.0,
            self.c_min, lo, hi, self.row_lo, self.row_hi,
            A.indptr.astype(np.int32), A.indices.astype(np.int32), A.data.astype(np.float64),
            integ)
        self._cur_lo, self._cur_hi = lo, hi
        if int(st) < 0:
            raise SolverError(f"HiGHS rejected the model ({st})")
        o = self.opts
        self.rel_gap = max(float(o.mip_rel_gap), GAP_FLOOR)
        self.abs_gap = float(o.mip_abs_gap) / self.obj_scale  # HiGHS units
        self.feastol = self.highs.configure(o, self.rel_gap, self.abs_gap)

    # ---------------------------------------------------------------- helpers
    @property
    def num_columns(self) -> int:
        """HiGHS columns: one per replacement, then one count per class of
        interchangeable replacements (see :func:`interchangeable_classes`), then the
        lattice columns."""
        return int(self.c_min.size)

    def _index(self, i: int, what: str) -> int:
        i = int(i)
        if not 0 <= i < self.lib.num_replacements:
            raise InputError(f"{what}: replacement index {i} is out of range "
                             f"[0, {self.lib.num_replacements})")
        return i

    def _set_feastol(self, t: float) -> None:
        """HiGHS' MIP feasibility tolerance (its absolute objective resolution, in HiGHS
        units) and the primal/dual LP tolerances, never looser than HiGHS' defaults."""
        self.feastol = self.highs.set_feastol(t)

    def allowed_gap(self, u: float) -> float:
        """The gap the caller accepts at an objective of ``u`` (both in HiGHS units):
        ``max(G * |u|, G, abs_gap)``, ``G = max(mip_rel_gap, GAP_FLOOR)``."""
        return max(self.rel_gap * abs(u), self.rel_gap, self.abs_gap)

    def _tolerance_for(self, est: float) -> float:
        """The feasibility tolerance that resolves the allowed gap at ``|U| >= est``."""
        return self.allowed_gap(est) / 10.0

    def _unconstrained_min(self) -> float:
        """Least objective (HiGHS units, minimized) over all children, budgets ignored: a
        lower bound on the optimum by shortest path over the replacement graph."""
        R = self.lib.num_replacements
        p = self.lib.path_values(self.c_min[:R], ~self.dead & (self.col_hi[:R] > 0.5))[-1]
        return float(p) if math.isfinite(p) else 0.0

    def set_budget(self, i: int, lo: float | None, hi: float | None) -> None:
        """Change budget ``i``'s bounds (totals, constants included) for the next solve."""
        b = self.budgets[i]
        self.budgets[i] = Budget(b.key, lo, hi)
        s, row = self.budget_scale[i], self.budget_row[i]
        const = self.lib.constant(b.key) + self.budget_shift[i]
        rlo = -np.inf if lo is None else (lo - const) / s
        rhi = np.inf if hi is None else (hi - const) / s
        self.row_lo[row], self.row_hi[row] = rlo, rhi
        self.h.changeRowBounds(row, rlo, rhi)
        if i in self.lattice_row:  # its lattice form (SolverTuning.lattice) follows it
            row = self.lattice_row[i]
            self.row_lo[row], self.row_hi[row] = rlo, rhi
            self.h.changeRowBounds(row, rlo, rhi)

    def add_diversity(self, chosen: np.ndarray, min_distance: int) -> None:
        """Require the next solutions to differ from ``chosen`` in >= ``min_distance`` parent
        blocks: ``sum_{r in chosen} len[r] x[r] <= L - min_distance``."""
        import scipy.sparse as sp

        idx = np.asarray(chosen, dtype=np.int32)
        coef = self.lib.lengths[idx].astype(np.float64)
        rhs = float(self.lib.num_blocks - min_distance)
        self.h.addRow(-np.inf, rhs, idx.size, idx, coef)
        self.diversity.append((idx.astype(np.int64), int(min_distance)))
        if self.member.any():
            # a row over single members: a fixed count no longer leaves 0/1 vertices, so the
            # members are integers again (the counts stay, as redundant integers)
            mem = np.flatnonzero(self.member).astype(np.int32)
            self.h.changeColsIntegrality(mem.size, mem, np.ones(mem.size, dtype=np.int32))
            self.member[:] = False
        row = sp.csr_matrix((coef, (np.zeros(idx.size, dtype=np.int64), idx)),
                            shape=(1, self.c_min.size))
        self.A = sp.vstack([self.A, row], format="csr")
        self.row_lo = np.append(self.row_lo, -np.inf)
        self.row_hi = np.append(self.row_hi, rhs)
        self.num_rows += 1

    # ---------------------------------------------------------------- solve
    def found_children(self) -> list[np.ndarray]:
        """Children HiGHS found in this model's runs so far (each as replacement indices,
        best first, duplicates dropped) that meet every current row, diversity rows
        included: an earlier solve's runner-up is a checked incumbent for the next solve of
        a pool (see :func:`nas.mip.diverse_pool`)."""
        out: dict[bytes, tuple[float, np.ndarray]] = {}
        for nz, vals in self.highs.found:
            x = np.zeros(self.num_columns)
            x[nz] = vals
            try:
                chosen = self.verify(self.integral(x))
            except SolverError:
                continue
            out.setdefault(chosen.tobytes(), (float(self.c_min[chosen].sum()), chosen))
        return [c for _, c in sorted(out.values(), key=lambda t: t[0])]

    def _run(self, time_limit: float | None, cutoff: float | None = None,
             stop_above: float = math.inf, relax: np.ndarray | None = None
             ) -> tuple[str, np.ndarray | None, float, int, str]:
        """One HiGHS run. Returns (status, x, dual bound in min-form scaled units, nodes,
        message); status is optimal / feasible / infeasible / error, or ``cutoff`` when a
        ``cutoff`` (HiGHS' objective_bound, min-form units) was given and no child below it
        exists (the bound returned is then ``cutoff - feastol``), or ``stopped`` when
        ``stop_above`` is finite and the run was interrupted holding a child (below the
        cutoff) while its dual bound exceeded ``stop_above``: x is that child, the bound
        returned is ``stop_above`` (HiGHS' bound, which is higher, holds for this
        restriction only). The rows ``relax`` are left out of this run (the model without
        them is a relaxation: its bounds, cutoffs and infeasibility hold for the whole
        model; its child may break them, see :meth:`broken_rows`)."""
        if relax is not None and relax.size:
            idx = relax.astype(np.int32)
            free = np.full(idx.size, np.inf)
            self.h.changeRowsBounds(idx.size, idx, -free, free)
            try:
                return self._run(time_limit, cutoff, stop_above)
            finally:
                self.h.changeRowsBounds(idx.size, idx, self.row_lo[idx], self.row_hi[idx])
        st, x, bound, nodes, msg = self.highs.mip_run(time_limit, cutoff, stop_above,
                                                      self.feastol)
        if x is None:
            return st, x, bound, nodes, msg
        x = self.integral(x)
        if st == "stopped":
            return st, x, bound, nodes, msg
        # HiGHS prunes nodes within mip_feasibility_tolerance of the incumbent, so children
        # better by less than that are unseen: the bound it proved is at most U - feastol.
        u = float(self.c_min @ np.round(x))
        return st, x, min(bound, u - self.feastol), nodes, msg

    def _dp_run(self, lo: np.ndarray, hi: np.ndarray, cutoff: float | None,
                lazy: np.ndarray) -> tuple[str, np.ndarray | None, float, int, str] | None:
        """The run :meth:`_run` would make on the column bounds ``lo`` / ``hi`` (budget
        and count rows ``lazy`` left out), solved exactly by :func:`nas.mip.dp.path_optimum`
        instead of HiGHS (``SolverTuning.dp``): same statuses, with the restricted optimum
        as its own bound. None when the model is not one it takes (a diversity row, a tie, a count
        row in force, more than :data:`DP_ROWS` budgets in force, a budget with both bounds,
        more free replacements than :data:`DP_FREE` or open blocks than :data:`DP_OPEN`,
        bounds changed on a column past the replacements) or when its labels outgrow
        :data:`DP_LABELS` or :data:`DP_WORK`."""
        from nas.mip.dp import Row, path_optimum

        lib, R = self.lib, self.lib.num_replacements
        if self.diversity or self.ties:  # tie rows are no budget the labels carry
            return None
        out = set(int(r) for r in lazy)
        L = lib.num_blocks
        if any(L + len(self.budgets) + j not in out for j in range(len(self.counts))):
            return None
        if not (np.array_equal(lo[R:], self.col_lo[R:])
                and np.array_equal(hi[R:], self.col_hi[R:])):
            return None
        rows = []
        for b, row in zip(self.budgets, self.budget_row):
            if row in out:
                continue
            if b.lo is not None and b.hi is not None:
                return None
            v = np.where(self.dead, 0.0, lib.values(b.key))
            const = lib.constant(b.key)
            if b.hi is not None:
                rows.append(Row(v, b.hi - const, float(np.max(np.abs(v))) or 1.0))
            elif b.lo is not None:
                rows.append(Row(-v, const - b.lo, float(np.max(np.abs(v))) or 1.0))
        if not rows or len(rows) > DP_ROWS:
            return None
        allowed = (hi[:R] > 0.5) & ~self.dead
        forced = allowed & (lo[:R] > 0.5)
        if forced.any():
            # a forced replacement's blocks take no other one
            cover = np.zeros(L + 1, dtype=np.int64)
            np.add.at(cover, lib.start[forced], 1)
            np.add.at(cover, lib.end[forced], -1)
            taken = np.concatenate([[0], np.cumsum(np.cumsum(cover)[:-1] > 0)])
            allowed &= forced | (taken[lib.end] == taken[lib.start])
        if int((allowed & ~forced).sum()) > DP_FREE or int(
                (np.bincount(lib.start[allowed], minlength=L) > 1).sum()) > DP_OPEN:
            return None
        found = path_optimum(lib.start, lib.end, L, self.c_min[:R], rows, allowed,
                             cutoff, DP_LABELS, DP_KEEP, DP_WORK)
        if found is None:
            return None
        st, children = found
        if st == "infeasible":
            return "infeasible", None, math.inf, 0, ""
        if st == "cutoff":
            assert cutoff is not None
            return "cutoff", None, cutoff - self.feastol, 0, ""
        xs = []
        for chosen in children:
            x = np.zeros(R)
            x[chosen] = 1.0
            xs.append(self.with_counts(x))
        # the runner-ups are kept as HiGHS' improving solutions are (found_children)
        for x in xs[::-1]:
            nz = np.flatnonzero(x)
            self.highs.found.append((nz, x[nz]))
        return "optimal", xs[0], float(self.c_min @ xs[0]), 0, ""

    def integral(self, x: np.ndarray) -> np.ndarray:
        """``x`` (HiGHS' solution, class counts included) with 0/1 members: given the
        counts and the other columns, the members form a transportation problem (see
        :func:`interchangeable_classes`). HiGHS' answer is usually a vertex, hence 0/1
        already; when a heuristic leaves members fractional, the least-objective
        assignment of the blocks left to the counts' slots (within the run's bounds,
        exact by ``linear_sum_assignment``) replaces them: same rows, objective no
        higher. Returned unchanged when it cannot be repaired (``verify`` then names the
        broken row)."""
        lib, R = self.lib, self.lib.num_replacements
        xm = x[:R][self.member]
        if not self.member.any() or np.all(np.abs(xm - np.round(xm)) <= 1e-6):
            return x
        from scipy.optimize import linear_sum_assignment

        y = np.where(self.member, 0.0, np.round(x[:R]))
        fixed = np.flatnonzero(y > 0.5)
        cover = np.zeros(lib.num_blocks + 1, dtype=np.int64)
        np.add.at(cover, lib.start[fixed], 1)
        np.add.at(cover, lib.end[fixed], -1)
        left = np.flatnonzero(np.cumsum(cover)[:-1] == 0)
        counts = np.round(x[R:R + len(self.classes)]).astype(np.int64)
        slot_class = np.repeat(np.arange(len(self.classes)), np.maximum(counts, 0))
        if slot_class.size != left.size:
            return x
        # per block left and class: the member it would take, the cheapest the run allows;
        # a block whose member the run's bounds pin takes that one and no other class
        pos = {int(b): i for i, b in enumerate(left)}
        take: dict[tuple[int, int], int] = {}
        forced: dict[int, tuple[int, int]] = {}
        for r in np.flatnonzero((self._class_of >= 0) & (self._cur_hi[:R] > 0.5)):
            i = pos.get(int(lib.start[r]))
            if i is None:
                continue
            k = int(self._class_of[r])
            if self._cur_lo[r] > 0.5:
                forced[i] = (k, int(r))
            old = take.get((i, k))
            if old is None or self.c_min[r] < self.c_min[old]:
                take[(i, k)] = int(r)
        take.update({(i, k): r for i, (k, r) in forced.items()})
        cost = np.full((left.size, slot_class.size), np.inf)
        for (i, k), rk in take.items():
            if i not in forced or forced[i][0] == k:
                cost[i, slot_class == k] = self.c_min[rk]
        big = 1.0 + 2.0 * float(np.abs(self.c_min).sum()) * max(left.size, 1)
        rows, cols = linear_sum_assignment(np.where(np.isfinite(cost), cost, big))
        if not np.all(np.isfinite(cost[rows, cols])):
            return x
        for i, j in zip(rows, cols):
            y[take[(int(i), int(slot_class[j]))]] = 1.0
        return self.with_counts(y)

    def with_counts(self, x: np.ndarray) -> np.ndarray:
        """A vector over the replacements, extended by its class counts and lattice columns
        (the model's columns)."""
        R = self.lib.num_replacements
        counts = np.bincount(self._class_of[self._class_of >= 0],
                             weights=x[:R][self._class_of >= 0], minlength=len(self.classes))
        return np.concatenate([x[:R], counts, self._aux_map @ x[:R]])

    def lp_bound(self, time_limit: float | None = None) -> tuple[str, float, np.ndarray]:
        """Solve the LP relaxation (within ``time_limit`` seconds); return (status, a valid
        lower bound on the min-form scaled objective ``c_min``, reduced costs of the
        :attr:`num_columns` columns: replacements, then class counts) from weak
        duality with the row duals (sign-clipped, so the bound holds for any duals HiGHS
        returns). Status is optimal, infeasible, or error (stopped, e.g. by the limit)."""
        st, y0, activity = self.highs.lp_run(time_limit)
        if st == "infeasible":
            return "infeasible", math.inf, np.zeros(0)
        if y0 is None:
            return "error", -math.inf, np.zeros(0)
        #: row activities of the last LP solution (see lazy_candidates)
        self.lp_activity = activity
        best = (-math.inf, np.zeros(0))
        for y in (y0, -y0):
            y = np.where((y > 0) & ~np.isfinite(self.row_lo), 0.0, y)
            y = np.where((y < 0) & ~np.isfinite(self.row_hi), 0.0, y)
            d = self.c_min - self.A.T @ y
            lb = float(np.sum(np.where(y > 0, y * np.where(np.isfinite(self.row_lo), self.row_lo, 0),
                                       y * np.where(np.isfinite(self.row_hi), self.row_hi, 0))))
            lb += float(np.sum(np.minimum(d * self.col_lo, d * self.col_hi)))
            if lb > best[0]:
                best = (lb, d)
        return "optimal", best[0], best[1]

    # ------------------------------------- the solve's rules (see nas.mip.steps)
    def lazy_candidates(self) -> np.ndarray:
        """The rows the runs leave out (:func:`nas.mip.steps.lazy_candidates`)."""
        return steps.lazy_candidates(self)

    def broken_rows(self, x: np.ndarray, rows: np.ndarray) -> np.ndarray:
        """Those of ``rows`` that ``x`` breaks (:func:`nas.mip.steps.broken_rows`)."""
        return steps.broken_rows(self, x, rows)

    def first_threshold(self, lb0: float, d: np.ndarray) -> tuple[float, float]:
        """The first fixing threshold (:func:`nas.mip.steps.first_threshold`)."""
        return steps.first_threshold(self, lb0, d)

    def threshold_for(self, u: float, lb0: float) -> float:
        """The fixing threshold that proves ``u`` (:func:`nas.mip.steps.threshold_for`)."""
        return steps.threshold_for(self, u, lb0)

    def stop_threshold(self, t: float) -> float:
        """The dual bound past which a run is stopped (:func:`nas.mip.steps.stop_threshold`)."""
        return steps.stop_threshold(self, t)

    def solve(self, incumbent: np.ndarray | None = None) -> Result:
        """Solve to the requested gap and verify. An infeasible model gives status
        ``infeasible`` with the message "infeasible" (:func:`nas.mip.solve` and the other
        public functions attach the explanation, see :func:`explain_infeasible`).

        ``incumbent``: replacement indices of a child known to meet the current rows (a
        sweep's previous point, as the bound loosens). It is checked here, never handed to
        HiGHS as a MIP start; it is the objective cutoff of every run (HiGHS looks only for
        better children) and is returned when nothing better exists. It does not set the
        first fixing threshold (a far-off incumbent would free nearly every column) unless
        ``SolverTuning.incumbent_threshold``.

        The feasibility tolerance is set from the data before each run (see the module
        doc); when HiGHS reports optimal but the honest bound misses the allowed gap, the
        run is repeated once with the tolerance set from the incumbent.

        With ``SolverTuning.fixing`` (default), the LP relaxation's duals give a lower bound
        ``LB`` and reduced costs ``d``; columns whose ``d`` exceeds a threshold ``tau`` are
        fixed out and HiGHS solves the restricted MIP. Any child using a fixed column costs at
        least ``LB + tau`` (weak duality, computed here from the duals, whatever HiGHS'
        tolerances), so once ``LB + tau >= U - allowed gap`` (``U`` the incumbent) the
        restricted optimum is the global one; otherwise ``tau`` is raised to that value and
        the restricted MIP re-solved. The bound and gap reported are the global ones:
        ``min(restricted bound, LB + tau)``.

        A restricted run that cannot be the last is stopped early: its optimum ``U'`` is at
        least HiGHS' bound ``D`` on it, so once ``D - allowed(D) > LB + tau`` (with a child
        in hand; see :meth:`stop_threshold`) the run is interrupted, its child kept as the
        incumbent and ``tau`` raised as above. Only the search for a proof that would not
        be used is skipped; every answer is still proved by a run that ends on its own
        (``SolverTuning.stop``, on by default). A run is not stopped before its root node is
        done (``SolverTuning.stop_after_root``): the root's heuristics often improve much on
        the first child.

        With ``SolverTuning.lazy_rows`` (default) the budget and count rows that the LP
        solution leaves slack by :data:`nas.mip.steps.LAZY_SLACK` of their largest coefficient are left
        out of the runs (:meth:`lazy_candidates`). A run without them solves a relaxation, so
        its bound, its cutoff and its infeasibility hold for the whole model; every child is
        checked against them, and one that breaks a row puts that row back and the run is
        repeated ("lazy row broken" in ``runs``). The answer is verified against every row.
        ``runs`` lists the status of each run.
        """
        gen = self.solve_steps(incumbent)
        while True:
            try:
                next(gen)
            except StopIteration as done:
                return cast(Result, done.value)

    def solve_steps(self, incumbent: np.ndarray | None = None
                    ) -> Generator[float, MipModel | None, Result]:
        """:meth:`solve` one HiGHS run at a time: a generator that yields before every run
        after the first (and returns the :class:`Result`). It yields the remaining relative
        gap, ``(U - bound) / allowed gap`` (inf without a child yet): a sweep runs every
        point's first run, then the rest of the points with the largest gap first. The
        value sent back is the model that runs the rest (another :class:`MipModel` of the
        same library, rows and options, with the same row bounds; None: this one), so a
        solve can move to another thread's model between runs. ``seconds`` counts the
        time spent in the steps, not between them; so does ``time_limit``."""
        return steps.solve_steps(self, incumbent)

    def _bounds(self, lo: np.ndarray, hi: np.ndarray) -> None:
        self._cur_lo, self._cur_hi = lo, hi
        idx = np.arange(lo.size, dtype=np.int32)
        self.h.changeColsBounds(lo.size, idx, lo, hi)

    def _result(self, secs: float, st: str, x: np.ndarray | None, bound_min: float, nodes: int,
                msg: str) -> Result:
        """The verified :class:`Result` of a solve that spent ``secs`` seconds."""
        if st == "infeasible":
            message = "infeasible"
            return Result("infeasible", None, None, None, nodes, secs, message=message)
        if st == "error" or x is None:
            return Result("error", None, None, None, nodes, secs, message=msg or "HiGHS failed")
        chosen = self.verify(x)
        u = float(self.c_min[chosen].sum())
        gap: float | None = None
        bound: float | None = None
        if math.isfinite(bound_min):
            bound_min = min(bound_min, u)
            # relative to |U|, or to one typical coefficient when |U| is smaller (see
            # allowed_gap): a gap <= mip_rel_gap is exactly what "optimal" promises
            gap = max(0.0, u - bound_min) / max(abs(u), 1.0)
            bound = self.sense * bound_min * self.obj_scale + self.obj_const
            if st == "optimal" and u - bound_min > (self.allowed_gap(u) * (1 + 1e-9)
                                                   + 4e-16 * abs(u)):
                st = "feasible"  # the proven bound does not support "optimal"
        elif st == "optimal":
            st = "feasible"
        objective = float(self.c[chosen].sum()) + self.obj_const
        return Result(cast(Status, st), objective, bound, gap, nodes, secs,
                      chosen, self.choices_of(chosen), self.lib.totals(chosen))

    def choices_of(self, chosen: np.ndarray) -> list[int]:
        """Replacement index covering each parent block."""
        out = [-1] * self.lib.num_blocks
        for r in chosen:
            for b in range(int(self.lib.start[r]), int(self.lib.end[r])):
                out[b] = int(r)
        return out

    def verify(self, x: np.ndarray) -> np.ndarray:
        """Check a 0/1 vector against every row; return the chosen indices sorted by start;
        raise :class:`SolverError` naming the first broken row."""
        lib = self.lib
        if x.size not in (lib.num_replacements, self.c_min.size):
            raise SolverError(f"HiGHS returned {x.size} values for {lib.num_replacements} "
                              "replacements")
        x = x[:lib.num_replacements]
        if np.any(np.abs(x - np.round(x)) > 1e-5):
            raise SolverError("HiGHS returned a fractional solution")
        chosen = np.flatnonzero(x > 0.5)
        chosen = chosen[np.argsort(lib.start[chosen], kind="stable")]
        cover = np.zeros(lib.num_blocks + 1, dtype=np.int64)
        np.add.at(cover, lib.start[chosen], 1)
        np.add.at(cover, lib.end[chosen], -1)
        per_block = np.cumsum(cover)[:-1]
        bad = np.flatnonzero(per_block != 1)
        if bad.size:
            b = int(bad[0])
            raise SolverError(f"solution covers {lib.block_name(b)} {per_block[b]} times")
        if set(self.pin) - set(chosen.tolist()):
            raise SolverError("solution drops a pinned replacement")
        if set(self.forbid) & set(chosen.tolist()):
            raise SolverError("solution uses a forbidden replacement")
        self._verify_rows(chosen)
        return chosen

    def _verify_rows(self, chosen: np.ndarray) -> None:
        """Check the chosen replacements against the budget, count, tie and diversity
        rows; raise :class:`SolverError` naming the first broken row."""
        lib, tol = self.lib, self.opts.tolerance
        totals = lib.totals(chosen)
        for b, s in zip(self.budgets, self.budget_scale):
            t = totals[b.key]
            # HiGHS keeps each scaled row feasible to feastol, i.e. feastol * s in the
            # budget's units; rounding of the sums adds ~1e-12 relative
            slack = (10 * self.feastol * s if tol is None else tol * max(abs(t), s)) \
                + 1e-12 * max(abs(t), s)
            if b.hi is not None and t > b.hi + slack:
                raise SolverError(f"solution breaks budget {b}: total {t:g}")
            if b.lo is not None and t < b.lo - slack:
                raise SolverError(f"solution breaks budget {b}: total {t:g}")
        for cr in self.counts:
            m = lib.tagged(cr.tag)[chosen]
            n = int((lib.lengths[chosen][m]).sum()) if cr.unit == "blocks" else int(m.sum())
            if (cr.min is not None and n < cr.min) or (cr.max is not None and n > cr.max):
                raise SolverError(f"solution breaks count rule {cr}: count {n}")
        for tie in self.ties:
            groups = tie.broken_by(chosen.tolist(), lib.num_replacements)
            if len(groups) > 1:
                shown = [tie.values[g] if tie.values else str(g) for g in groups]
                raise SolverError(f"solution breaks {tie}: it takes {', '.join(shown)}")
        cs = set(chosen.tolist())
        for prev, d in self.diversity:
            same = int(sum(lib.lengths[r] for r in prev if r in cs))
            if lib.num_blocks - same < d:
                raise SolverError(f"solution differs from an earlier one in "
                                  f"{lib.num_blocks - same} < {d} blocks")
