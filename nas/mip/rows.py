"""The rows and columns of the model, as numpy arrays: cover rows, tie rows, the class
counts of interchangeable replacements and the lattice form of budget rows (see
:mod:`nas.mip`; :class:`~nas.mip.model.MipModel` assembles them)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from nas.library import BlockLibrary
from nas.mip.constraints import Tie

#: ``SolverTuning.lattice``: a budget row gets its lattice form when its coefficients fall
#: into at most this many residues modulo a common step (see :func:`lattice_split`)
LATTICE_RESIDUES = 6
#: ... and when that step is at least this fraction of the row's largest coefficient: a finer
#: step leaves the LP little to round and the extra rows cost more than they save (measured:
#: super88's byte-sized rows, steps of 2e-4..4e-3 of their largest coefficient, solved 2-3x
#: slower with them; NVlabs' memory row, a step of 8e-3, 10-100x faster in pools)
LATTICE_MIN_STEP = 5e-3


@dataclass
class Parts:
    """The model's matrix being assembled: COO pieces (``rows``, ``cols``, ``vals``), the
    bounds of each piece of rows (``row_lo``, ``row_hi``) and the number of rows so far."""

    nrow: int = 0
    rows: list[np.ndarray] = field(default_factory=list)
    cols: list[np.ndarray] = field(default_factory=list)
    vals: list[np.ndarray] = field(default_factory=list)
    row_lo: list[np.ndarray] = field(default_factory=list)
    row_hi: list[np.ndarray] = field(default_factory=list)

    def add(self, rows: np.ndarray, cols: np.ndarray, vals: np.ndarray) -> None:
        """Append COO entries."""
        self.rows.append(rows)
        self.cols.append(cols)
        self.vals.append(vals)

    def bounds(self, lo: np.ndarray, hi: np.ndarray) -> None:
        """Append the bounds of the next ``lo.size`` rows and count them."""
        self.row_lo.append(lo)
        self.row_hi.append(hi)
        self.nrow += int(lo.size)


def allowed_mask(lib: BlockLibrary, pin: Sequence[int], forbid: Sequence[int]) -> np.ndarray:
    """bool[R]: replacements neither forbidden nor overlapping a pinned one."""
    ok = np.ones(lib.num_replacements, dtype=bool)
    ok[list(forbid)] = False
    for r in pin:
        overl = (lib.start < lib.end[r]) & (lib.end > lib.start[r])
        overl[r] = False
        ok &= ~overl
    return ok


def dead_columns(lib: BlockLibrary) -> np.ndarray:
    """bool[R]: replacements on no path 0 -> L."""
    fwd, bwd = lib.reach()
    return ~(fwd[lib.start] & bwd[lib.end])


def cover_rows(lib: BlockLibrary) -> Parts:
    """The exact-cover rows (one per parent block, = 1): column r has ones in rows
    ``start[r] .. end[r] - 1``."""
    lens, R, L = lib.lengths, lib.num_replacements, lib.num_blocks
    parts = Parts()
    parts.add(np.repeat(lib.start, lens)
              + (np.arange(lens.sum()) - np.repeat(np.cumsum(lens) - lens, lens)),
              np.repeat(np.arange(R), lens), np.ones(int(lens.sum())))
    parts.bounds(np.ones(L), np.ones(L))
    return parts


def interchangeable_classes(A: Any, num_blocks: int, lengths: np.ndarray, dead: np.ndarray,
                            obj: np.ndarray) -> list[np.ndarray]:
    """Classes of interchangeable replacements: live single-block columns with the same
    objective coefficient ``obj`` and the same coefficient in every row past the
    ``num_blocks`` cover rows of ``A`` (CSC; budgets and count rules). Only classes of two
    or more are returned, each as sorted indices.

    A real library prices every layer of one configuration alike, and a structural prior
    scores many layers alike too, so most of its replacements fall into such classes (the
    Nemotron-3-Super example: 78 classes hold 1,575 of its 1,576 replacements). With
    ``n_k`` the number of blocks that take a member of class ``k``, the objective and every
    budget and count row are functions of the ``n_k`` and the other columns alone; once
    those are integers, the members left form a transportation problem (each member is in
    one block row and one class row), whose vertices are 0/1. So the members can be
    continuous and the search branches on the ``n_k`` ("two more blocks take this
    variant") instead of on which of 40 alike blocks takes it; the optimum is the same.
    Classes alike in cost but not in objective are not formed: measured, branching on
    their counts made some points 2-15x slower. A row over single members (a pool's
    diversity row) breaks the argument, and :meth:`MipModel.add_diversity` makes them
    integers again."""
    L = num_blocks
    groups: dict[bytes, list[int]] = {}
    for r in np.flatnonzero((lengths == 1) & ~dead):
        a, b = A.indptr[r], A.indptr[r + 1]
        rows, vals = A.indices[a:b], A.data[a:b]
        past = rows >= L
        key = rows[past].astype(np.int64).tobytes() + vals[past].astype(np.float64).tobytes() \
            + np.float64(obj[r]).tobytes()
        groups.setdefault(key, []).append(int(r))
    return [np.array(g, dtype=np.int64) for g in groups.values() if len(g) > 1]


def add_class_counts(A: Any, Ac: Any, parts: Parts, classes: list[np.ndarray],
                     member: np.ndarray, num_blocks: int) -> tuple[Any, np.ndarray, np.ndarray]:
    """Give each class of interchangeable replacements its count column ``n_k`` (after the
    replacements) and the row ``n_k - sum x[r] = 0``: a member keeps its cover row and
    moves its budget and count coefficients (the same for every member) to the count.
    ``A`` is the COO matrix of ``parts``' rows, ``Ac`` the same in CSC. Returns the
    matrix and the column bounds."""
    import scipy.sparse as sp

    L, R, C, nrow = num_blocks, A.shape[1], len(classes), parts.nrow
    lo, hi = np.zeros(R + C), np.ones(R + C)
    if not C:
        return A, lo, hi
    first = np.array([m[0] for m in classes])
    keep = ~(member[A.col] & (A.row >= L))
    sig = [Ac[L:, first].tocoo()]
    n_rows = [sig[0].row + L, nrow + np.arange(C)]
    n_cols = [R + sig[0].col, R + np.arange(C)]
    n_vals = [sig[0].data, np.ones(C)]
    sizes = np.array([m.size for m in classes])
    mem = np.concatenate(classes)
    n_rows.append(nrow + np.repeat(np.arange(C), sizes))
    n_cols.append(mem)
    n_vals.append(-np.ones(mem.size))
    A = sp.coo_matrix(
        (np.concatenate([A.data[keep], *n_vals]),
         (np.concatenate([A.row[keep], *n_rows]),
          np.concatenate([A.col[keep], *n_cols]))), shape=(nrow + C, R + C))
    parts.bounds(np.zeros(C), np.zeros(C))
    hi[R:] = sizes
    return A, lo, hi


def tie_rows(lib: BlockLibrary, t: Tie, forbid: Sequence[int], first: int
             ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The rows of tie ``t`` (numbered from ``first``) as COO ``(rows, cols, vals)``
    and their upper bounds (the lower ones are -inf); see :class:`Tie`. Dead and
    forbidden replacements are 0 and take no part."""
    R, L = lib.num_replacements, lib.num_blocks
    of = np.asarray(t.group_of(R), dtype=np.int64)
    live = ~dead_columns(lib)
    live[list(forbid)] = False
    of[~live] = -1
    start, end = lib.start, lib.end
    covers = [(start <= b) & (end > b) & live for b in range(L)]
    anchor = next((b for b in range(L) if covers[b].any() and np.all(of[covers[b]] >= 0)),
                  None)
    out: tuple[list[np.ndarray], list[np.ndarray], list[np.ndarray], list[float]] = \
        ([], [], [], [])
    if anchor is not None:
        _anchored_tie_rows(start, of, covers[anchor], len(t.groups), first, out)
    else:
        _pairwise_tie_rows(start, of, len(t.groups), first, out)
    rr, cc, vv, his = out
    if not rr:
        z = np.zeros(0, dtype=np.int64)
        return z, z, np.zeros(0), np.zeros(0)
    return (np.concatenate(rr), np.concatenate(cc), np.concatenate(vv),
            np.asarray(his, dtype=np.float64))


def _anchored_tie_rows(start: np.ndarray, of: np.ndarray, at: np.ndarray, groups: int,
                       n: int, out: tuple[list[np.ndarray], list[np.ndarray],
                                          list[np.ndarray], list[float]]) -> None:
    """Tie rows against an anchor block (``at``: the replacements covering it, all tied):
    a group is taken at a block only if the anchor takes it."""
    rr, cc, vv, his = out
    for g in range(groups):
        mine = np.flatnonzero((of == g) & ~at)
        base = np.flatnonzero((of == g) & at)
        for b in np.unique(start[mine]):
            here = mine[start[mine] == b]
            rr.append(np.full(here.size + base.size, n))
            cc.append(np.concatenate([here, base]))
            vv.append(np.concatenate([np.ones(here.size), -np.ones(base.size)]))
            his.append(0.0)
            n += 1


def _pairwise_tie_rows(start: np.ndarray, of: np.ndarray, groups: int, n: int,
                       out: tuple[list[np.ndarray], list[np.ndarray],
                                  list[np.ndarray], list[float]]) -> None:
    """Tie rows without an anchor block: a group taken at a block excludes every other
    group at every other block (big-M over the member starts)."""
    rr, cc, vv, his = out
    member = np.flatnonzero(of >= 0)
    starts = np.unique(start[member])
    big = float(starts.size)
    for g in range(groups):
        for b in starts:
            here = member[(of[member] == g) & (start[member] == b)]
            if not here.size:
                continue
            other = member[(of[member] != g) & (start[member] != b)]
            rr.append(np.full(here.size + other.size, n))
            cc.append(np.concatenate([here, other]))
            vv.append(np.concatenate([np.full(here.size, big), np.ones(other.size)]))
            his.append(big)
            n += 1


def lattice_split(v: np.ndarray) -> tuple[float, int, np.ndarray, np.ndarray, list[int]] | None:
    """The lattice form of a budget row's coefficients ``v``: ``(q, d, w, res, residues)``
    with ``v == q * (d * w + residues[res])`` exactly (``res`` -1 for a residue of 0), or
    None. ``q`` is the power of two that makes every coefficient an integer (measured sizes
    are binary fractions: 1/128 MiB on NVlabs' library; None when there is none),
    ``d`` (in units of ``q``) the largest step modulo which the distinct coefficients fall
    into at most :data:`LATTICE_RESIDUES` residues, fewer than half of them (``w`` integer
    per coefficient, ``residues`` the nonzero residues, in units of ``q``); None as well when
    that step is under :data:`LATTICE_MIN_STEP` of the largest coefficient.

    With ``W = sum w[r] x[r]`` and ``N_k = sum_{res[r] = k} x[r]`` as integer columns the
    budget reads ``q * (d * W + sum_k residues[k] * N_k) <= b``: the same feasible set, but
    one HiGHS' mixed-integer rounding cuts round to the step. On NVlabs' Llama-3.3-70B
    library (every FFN size a multiple of 6 MiB plus 1/128 MiB, attention 765.1 MiB) the
    LP relaxation spends the last few MiB of an 80,000 MiB budget that no child can, and
    the pool's hardest solves spent 10^5 nodes proving that; with the lattice form the
    root bound closes it."""
    vals = np.unique(v)
    if vals.size < 3 or vals.size > 64 or not np.all(np.isfinite(vals)):
        return None
    for k in range(25):
        sc = vals * 2.0 ** k
        if np.all(sc == np.round(sc)):
            break
    else:
        return None
    if float(np.max(np.abs(sc))) >= 2.0 ** 50:
        return None
    ints = np.round(sc).astype(np.int64)
    # candidate steps: the differences and the gcds of every two of them
    diffs = np.unique(np.abs(ints[:, None] - ints[None, :])[np.triu_indices(ints.size, 1)])
    cands = np.unique(np.concatenate([diffs, np.gcd(diffs[:, None], diffs[None, :]).ravel()]))
    cands = cands[cands > 1][::-1]
    limit = min(LATTICE_RESIDUES, (ints.size - 1) // 2)
    res_sorted = np.sort(ints[None, :] % cands[:, None], axis=1)
    n_res = 1 + np.count_nonzero(np.diff(res_sorted, axis=1), axis=1)
    ok = np.flatnonzero(n_res <= limit)
    d = int(cands[ok[0]]) if ok.size else None
    q = 2.0 ** -k
    if d is None or q * d < LATTICE_MIN_STEP * float(np.max(np.abs(vals))):
        return None
    vi = np.round(np.asarray(v, dtype=np.float64) / q).astype(np.int64)
    r = vi % d
    residues = sorted({int(t) for t in r if t})
    pos = {t: i for i, t in enumerate(residues)}
    res = np.array([pos.get(int(t), -1) for t in r], dtype=np.int64)
    return q, int(d), (vi - r) // d, res, residues


@dataclass
class Lattice:
    """What :func:`add_lattice` adds: budget index -> the row of its lattice form, and the
    map from replacements to the lattice columns' values (one row per column)."""

    row: dict[int, int] = field(default_factory=dict)
    maps: list[np.ndarray] = field(default_factory=list)


def add_lattice(lib: BlockLibrary, A: Any, parts: Parts, lo: np.ndarray, hi: np.ndarray,
                budget_v: list[np.ndarray], budget_scale: list[float], dead: np.ndarray,
                classes: list[np.ndarray], member: np.ndarray
                ) -> tuple[Any, np.ndarray, np.ndarray, Lattice]:
    """Append the lattice form of every budget row that has one (:func:`lattice_split`):
    integer columns ``W`` and ``N_k`` (each with an equality row defining it from the
    replacements, through the class counts for members) and the budget over them, with
    infinite bounds (the caller copies the budget row's). ``A`` is the COO matrix of
    ``parts``' rows; returns the matrix, the column bounds and the :class:`Lattice`."""
    import scipy.sparse as sp

    R = lib.num_replacements
    ncol = A.shape[1]
    live = ~dead
    first = np.array([m[0] for m in classes], dtype=np.int64)
    lat = Lattice()
    entries = Parts(parts.nrow, [A.row], [A.col], [A.data], parts.row_lo, parts.row_hi)
    new_lo: list[float] = []
    new_hi: list[float] = []
    for i, v in enumerate(budget_v):
        split = lattice_split(v[live])
        if split is None:
            continue
        q, d, w_live, res_live, residues = split
        w = np.zeros(R, dtype=np.int64)
        w[live] = w_live
        res = np.full(R, -1, dtype=np.int64)
        res[live] = res_live
        s = budget_scale[i]
        defs = [w.astype(np.float64)] + [(res == k).astype(np.float64)
                                         for k in range(len(residues))]
        coefs = [q * d / s] + [q * t / s for t in residues]
        cols = []
        for f in defs:
            j = ncol + len(lat.maps)
            lat.maps.append(f)
            cols.append(j)
            _lattice_definition(lib, entries, f, j, live, first, member)
            new_lo.append(_least_per_block(lib, f, live, np.minimum))
            new_hi.append(_least_per_block(lib, f, live, np.maximum))
        entries.add(np.full(len(cols), entries.nrow), np.array(cols), np.array(coefs))
        entries.bounds(np.array([-np.inf]), np.array([np.inf]))
        lat.row[i] = entries.nrow - 1
    parts.nrow = entries.nrow
    if not lat.maps:
        return A, lo, hi, lat
    A = sp.coo_matrix((np.concatenate(entries.vals), (np.concatenate(entries.rows),
                                                      np.concatenate(entries.cols))),
                      shape=(entries.nrow, ncol + len(lat.maps)))
    return A, np.append(lo, new_lo), np.append(hi, new_hi), lat


def _lattice_definition(lib: BlockLibrary, entries: Parts, f: np.ndarray, j: int,
                        live: np.ndarray, first: np.ndarray, member: np.ndarray) -> None:
    """The defining row of lattice column ``j``: ``x_j - sum f[r] x[r] = 0``, members
    through their class count."""
    R = lib.num_replacements
    nrow = entries.nrow
    on = np.flatnonzero((f != 0) & ~member)
    entries.add(np.full(on.size + 1, nrow), np.append(on, j), np.append(-f[on], 1.0))
    if first.size:
        fk = f[first]
        ks = np.flatnonzero(fk != 0)
        entries.add(np.full(ks.size, nrow), R + ks, -fk[ks])
    entries.bounds(np.zeros(1), np.zeros(1))


def _least_per_block(lib: BlockLibrary, f: np.ndarray, live: np.ndarray, pick: Any) -> float:
    """The least (``np.minimum``) or largest (``np.maximum``) value of ``sum f[r] x[r]``
    that the starts allow: a child takes at most one replacement starting at each block."""
    out = np.zeros(lib.num_blocks)
    pick.at(out, lib.start[live], f[live])
    return float(out.sum())
