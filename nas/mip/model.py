"""The HiGHS model of one library and constraint set (see :mod:`nas.mip` for the model,
the tolerances and what each status promises)."""

from __future__ import annotations

import contextlib
import math
import os
import signal
import sys
import threading
import time
from collections.abc import Generator, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np

from hwprofiles.errors import InputError
from nas.library import BlockLibrary
from nas.mip import interrupt
from nas.mip.constraints import (
    Budget,
    CountRule,
    InfeasibleError,
    Objective,
    SolverError,
    Tie,
)

_DEBUG = bool(os.environ.get("PUZZLE_NAS_MIP_DEBUG"))
#: fault injection for tests: ``EVENT:N:SIG[:LABEL]`` makes the process send itself SIG
#: (``INT`` or ``TERM``) from inside the N-th (from 1, process-wide) HiGHS callback of kind
#: EVENT (``interrupt``, ``improving``), or just before the N-th HiGHS run (``run``, LPs
#: included); the count starts again whenever the value changes (a new LABEL) and after
#: the signal is sent
SIGNAL_ENV = "PUZZLE_NAS_MIP_SIGNAL_AT"
Status = Literal["optimal", "feasible", "infeasible", "error"]


#: ``mip_rel_gap = 0`` means optimal within this relative gap (see the module doc).
GAP_FLOOR = 1e-9
#: HiGHS' smallest accepted feasibility tolerance, and its default MIP one.
_FEASTOL_MIN, _FEASTOL_MAX = 1e-10, 1e-6
#: ``SolveOptions.lazy_rows``: a budget or count row is left out of the HiGHS runs when the
#: LP relaxation's solution leaves it this many of its largest coefficients of slack (one
#: replacement swapped for any other cannot break it from there)
LAZY_SLACK = 1.0
#: the first fixing threshold is at least this fraction of the LP bound (a guess at the
#: integrality gap; see :meth:`MipModel.first_threshold`). It was 1e-3, with four allowed
#: gaps: 3e-4 and three gaps took bench_mip's 9 instances and NVlabs' 3 scenarios from
#: 5.9 to 4.6 s of CPU at gap 0 and 5.2 to 3.8 s at 1e-4 (NVlabs' own scenarios 2-2.5x
#: faster; the nv80 instances 0.06 -> 0.09 s)
FIRST_FIX = 3e-4
#: ``SolveOptions.lattice``: a budget row gets its lattice form when its coefficients fall
#: into at most this many residues modulo a common step (see :func:`lattice_split`)
LATTICE_RESIDUES = 6
#: ... and when that step is at least this fraction of the row's largest coefficient: a finer
#: step leaves the LP little to round and the extra rows cost more than they save (measured:
#: super88's byte-sized rows, steps of 2e-4..4e-3 of their largest coefficient, solved 2-3x
#: slower with them; NVlabs' memory row, a step of 8e-3, 10-100x faster in pools)
LATTICE_MIN_STEP = 5e-3
#: ``SolveOptions.dp``: a restricted run is solved by :func:`nas.mip.dp.path_optimum` when
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


@dataclass
class SolveOptions:
    """HiGHS options. ``time_limit`` in seconds (None: no limit); ``mip_rel_gap`` is relative
    to the block-sum objective (constants excluded, see the module doc; 0 means within
    :data:`GAP_FLOOR`); ``mip_abs_gap`` in objective units; ``threads`` None leaves HiGHS'
    default; ``verbose`` sends HiGHS' log to stderr (never stdout); ``tolerance`` is the
    relative slack of the re-verification (None: derived from the solver tolerance);
    ``fixing`` turns on LP reduced-cost fixing before the MIP (see :meth:`MipModel.solve`);
    ``shift`` rewrites each budget row by shortest-path potentials (nonnegative
    coefficients, same feasible set); ``restarts`` allows HiGHS' restarts (re-presolving
    after root fixings); ``stop`` interrupts a restricted run once its bound shows it
    cannot be the last (see :meth:`MipModel.solve`); ``incumbent_threshold`` lets a given
    incumbent set the first fixing threshold (off: it is only a cutoff). ``node_cuts``
    lets HiGHS separate cuts at every node, not only at the root
    (``mip_allow_cut_separation_at_nodes``); ``cut_pool`` is HiGHS' cut pool
    ``(mip_pool_soft_limit, mip_pool_age_limit)``, None for HiGHS' defaults (10,000,
    30): the budget rows give HiGHS thousands of cuts and conflicts to propagate at every
    node, and a small pool that forgets unused cuts soon costs less than it loses.
    ``sub_mips`` runs HiGHS' RINS and RENS heuristics (``mip_heuristic_run_rins`` /
    ``_rens``), small MIPs around the LP solution that took most of a run's time at the
    root on the libraries here. ``aggregate`` gives each class of replacements alike in
    objective and every row one integer count and branches on it (see
    :func:`interchangeable_classes`). ``lazy_rows`` leaves out of the HiGHS runs the budget
    and count rows that the LP relaxation leaves slack by at least their largest coefficient
    (:data:`LAZY_SLACK`), checks every child against them and puts back (re-running) any
    row a child breaks (see :meth:`MipModel.solve`; it needs the LP, so it acts with
    ``fixing`` only). ``stop_after_root`` lets ``stop`` interrupt a run only once its root
    node is done (the root's heuristics often improve much on the first child, and the
    next run's threshold and cutoff come from it). ``lattice`` adds to each budget row whose
    coefficients are a step times an integer plus one of a few residues (measured sizes in
    MiB: a multiple of 6 MiB plus an attention part) the same row over integer columns
    (:func:`lattice_split`), which lets HiGHS round the budget to the step. ``dp`` solves
    a restricted run with one or two budget rows in force, no count or diversity row and a
    few hundred free replacements exactly by dynamic programming over the replacement graph
    instead of HiGHS (:func:`nas.mip.dp.path_optimum`; HiGHS when the labels grow past a
    limit): after reduced-cost fixing such runs are tiny, and HiGHS spent 0.5 ms a node on
    them.
    ``stop``, ``stop_after_root``, ``incumbent_threshold``, ``node_cuts``, ``cut_pool``,
    ``sub_mips``, ``aggregate``, ``lazy_rows``, ``lattice`` and ``dp`` change the work, never the answer's guarantee; their defaults are chosen by ``benchmarks/bench_mip.py``. A known child is given per solve, checked,
    as :meth:`MipModel.solve`'s ``incumbent`` (never as a HiGHS MIP start)."""

    time_limit: float | None = None
    mip_rel_gap: float = 1e-4
    mip_abs_gap: float = 0.0
    threads: int | None = None
    seed: int = 0
    verbose: bool = False
    tolerance: float | None = None
    fixing: bool = True
    shift: bool = False
    restarts: bool = False
    stop: bool = True
    incumbent_threshold: bool = False
    node_cuts: bool = False
    cut_pool: tuple[int, int] | None = (100, 5)
    sub_mips: bool = False
    aggregate: bool = True
    lazy_rows: bool = True
    stop_after_root: bool = True
    lattice: bool = True
    dp: bool = True

    def __post_init__(self) -> None:
        for name in ("mip_rel_gap", "mip_abs_gap"):
            v = getattr(self, name)
            if not (isinstance(v, (int, float)) and math.isfinite(v) and v >= 0):
                raise InputError(f"{name} must be a finite number >= 0, got {v!r}")
        if self.time_limit is not None and not (math.isfinite(self.time_limit)
                                                and self.time_limit > 0):
            raise InputError(f"time_limit must be a positive number of seconds, got "
                             f"{self.time_limit!r}")
        if self.threads is not None and int(self.threads) < 1:
            raise InputError(f"threads must be >= 1, got {self.threads!r}")
        if self.cut_pool is not None:
            pool = self.cut_pool
            ok = (isinstance(pool, (tuple, list)) and len(pool) == 2
                  and all(isinstance(v, int) and not isinstance(v, bool) for v in pool)
                  and pool[0] >= 1 and 0 <= pool[1] <= 1000)
            if not ok:
                raise InputError("cut_pool must be (soft limit >= 1, age limit 0..1000) as "
                                 f"integers, or None, got {pool!r}")




@dataclass
class Result:
    """One solve. ``chosen``: replacement indices sorted by start; ``choices``: for each
    parent block the index of the replacement covering it; ``totals``: every cost and score
    key summed over ``chosen`` plus constants. Empty/None when there is no solution."""

    status: Status
    objective: float | None
    best_bound: float | None
    gap: float | None
    nodes: int
    seconds: float
    chosen: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    choices: list[int] = field(default_factory=list)
    totals: dict[str, float] = field(default_factory=dict)
    message: str = ""

    @property
    def ok(self) -> bool:
        """True when a verified solution is present (optimal or feasible)."""
        return self.status in ("optimal", "feasible")

    def to_dict(self, library: BlockLibrary | None = None) -> dict[str, Any]:
        """JSON-able dict: status, objective, best_bound, gap, nodes, seconds, choices
        (one entry per parent block, with labels when ``library`` is given), totals, chosen,
        message."""
        if library is not None:
            choices: list[Any] = [
                {"block": b, "name": library.block_name(b), "replacement": r,
                 "label": library.labels[r],
                 "span": [int(library.start[r]), int(library.end[r])]}
                for b, r in enumerate(self.choices)]
        else:
            choices = list(self.choices)
        return {"status": self.status, "objective": self.objective,
                "best_bound": self.best_bound, "gap": self.gap, "nodes": self.nodes,
                "seconds": self.seconds, "choices": choices, "totals": self.totals,
                "chosen": [int(i) for i in self.chosen], "message": self.message}

    def raise_if_infeasible(self) -> Result:
        """Raise :class:`InfeasibleError` (message = explanation) unless a solution exists."""
        if self.status == "infeasible":
            raise InfeasibleError(self.message or "infeasible")
        if self.status == "error":
            raise SolverError(self.message or "HiGHS failed")
        return self




class _Fd1:
    """Process-wide state of :func:`_fd1_redirected`: how many threads are inside, and the
    saved fd 1 and its stand-in while they are (-1: none)."""

    lock = threading.Lock()
    depth = 0
    saved = target = -1


@contextlib.contextmanager
def _fd1_redirected(to_stderr: bool) -> Iterator[None]:
    """Point file descriptor 1 at stderr (``to_stderr``) or /dev/null for the duration:
    HiGHS prints its banner with C stdio when an instance is made (before any option can
    be set), which ``sys.stdout`` cannot catch. Thread-safe: the first thread in redirects
    and the last one out restores (threads that overlap share the first one's target)."""
    with _Fd1.lock:
        if _Fd1.depth == 0:
            try:
                sys.stdout.flush()
            except (AttributeError, ValueError):
                pass
            with contextlib.suppress(OSError):  # no fd 1 at all: nothing to redirect
                _Fd1.saved = os.dup(1)
                _Fd1.target = os.dup(2) if to_stderr else os.open(os.devnull, os.O_WRONLY)
                os.dup2(_Fd1.target, 1)
        _Fd1.depth += 1
    try:
        yield
    finally:
        with _Fd1.lock:
            _Fd1.depth -= 1
            if _Fd1.depth == 0 and _Fd1.saved >= 0:
                with contextlib.suppress(Exception):
                    import ctypes

                    ctypes.CDLL(None).fflush(None)
                os.dup2(_Fd1.saved, 1)
                os.close(_Fd1.saved)
                if _Fd1.target >= 0:
                    os.close(_Fd1.target)
                _Fd1.saved = _Fd1.target = -1


class _Inject:
    """State of :data:`SIGNAL_ENV`: the value parsed, and the calls counted since."""

    lock = threading.Lock()
    spec = ""
    at: tuple[str, int, int] | None = None
    seen = 0


def _inject(event: str) -> None:
    """Send the signal :data:`SIGNAL_ENV` asks for, when this ``event`` is the one."""
    spec = os.environ.get(SIGNAL_ENV, "")
    if not spec and _Inject.at is None:
        return
    with _Inject.lock:
        if spec != _Inject.spec:
            _Inject.spec, _Inject.seen, _Inject.at = spec, 0, None
            if spec:
                ev, n, sig = spec.split(":")[:3]
                _Inject.at = (ev, int(n), int(getattr(signal, "SIG" + sig)))
        at = _Inject.at
        if at is None or at[0] != event:
            return
        _Inject.seen += 1
        if _Inject.seen != at[1]:
            return
        _Inject.seen = 0
    os.kill(os.getpid(), at[2])


def _log_to_stderr(e: Any) -> None:
    """HiGHS' logging callback with ``SolveOptions.verbose``: its log goes to stderr (an
    exception never leaves a callback: HiGHS would swallow it, see :mod:`nas.mip.interrupt`;
    a log line that cannot be written is dropped)."""
    with contextlib.suppress(BaseException):
        sys.stderr.write(e.message)


_SCHEDULER: list[int | None] = [None]  # thread count HiGHS' global scheduler was started with


def _sync_scheduler(h: Any, threads: int | None) -> None:
    """HiGHS keeps one global thread scheduler per process and fails a run (model status
    "Not Set") whose ``threads`` differs from the one it started with: restart it when the
    requested count changes."""
    want = 0 if threads is None else int(threads)
    if _SCHEDULER[0] is not None and _SCHEDULER[0] != want:
        h.resetGlobalScheduler(True)
    _SCHEDULER[0] = want


def _new_highs(o: SolveOptions) -> Any:
    import highspy

    with _fd1_redirected(o.verbose):
        h = highspy.Highs()
    # the log goes through a callback, never through fd 1: runs need no redirection (which
    # would be process-wide), so models can run in several threads at once (nas.mip.sweep)
    h.setOptionValue("output_flag", bool(o.verbose))
    h.setOptionValue("log_to_console", False)
    if o.verbose:
        h.cbLogging.subscribe(_log_to_stderr)
    # SolveOptions.restarts: off by default, chosen by benchmarks/bench_mip.py (after
    # reduced-cost fixing the models are small and re-presolving costs more than it saves).
    h.setOptionValue("mip_allow_restart", bool(o.restarts))
    # SolveOptions.node_cuts, cut_pool and sub_mips: see there
    h.setOptionValue("mip_allow_cut_separation_at_nodes", bool(o.node_cuts))
    h.setOptionValue("mip_heuristic_run_rins", bool(o.sub_mips))
    h.setOptionValue("mip_heuristic_run_rens", bool(o.sub_mips))
    if o.cut_pool is not None:
        h.setOptionValue("mip_pool_soft_limit", int(o.cut_pool[0]))
        h.setOptionValue("mip_pool_age_limit", int(o.cut_pool[1]))
    return h




def allowed_mask(lib: BlockLibrary, pin: Sequence[int], forbid: Sequence[int]) -> np.ndarray:
    """bool[R]: replacements neither forbidden nor overlapping a pinned one."""
    ok = np.ones(lib.num_replacements, dtype=bool)
    ok[list(forbid)] = False
    for r in pin:
        overl = (lib.start < lib.end[r]) & (lib.end > lib.start[r])
        overl[r] = False
        ok &= ~overl
    return ok


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


def dead_columns(lib: BlockLibrary) -> np.ndarray:
    """bool[R]: replacements on no path 0 -> L."""
    fwd, bwd = lib.reach()
    return ~(fwd[lib.start] & bwd[lib.end])


class MipModel:
    """A HiGHS model of one library and constraint set, kept for re-solves (pools, sweeps).

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
    ) -> None:
        import scipy.sparse as sp

        self.lib = lib = library
        self.opts = options or SolveOptions()
        self.objective = Objective.parse(objective)
        self.budgets = [b if isinstance(b, Budget) else Budget.parse(b) for b in budgets]
        self.counts = [c if isinstance(c, CountRule) else CountRule.parse(c) for c in counts]
        self.ties = list(ties)
        R, L = lib.num_replacements, lib.num_blocks
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
        self.diversity: list[tuple[np.ndarray, int]] = []  # (chosen, min distance)
        #: status of each HiGHS run of the last :meth:`solve` (optimal, cutoff, stopped, ...)
        self.runs: list[str] = []
        self._callback_on = False
        #: HiGHS' improving solutions of every run so far, sparse (the model columns that
        #: are nonzero, and their values); see :meth:`found_children`
        self._found: list[tuple[np.ndarray, np.ndarray]] = []
        self._interrupted = False
        #: an exception raised in a HiGHS callback, raised again after the run
        self._cb_error: BaseException | None = None
        self._stop_above = self._stop_below = math.inf
        self.lp_activity: np.ndarray | None = None

        # objective, in typical-coefficient units (see the module doc)
        c = np.zeros(R)
        self.obj_const = 0.0
        for k, w in self.objective.weights.items():
            c += w * lib.values(k)
            self.obj_const += w * lib.constant(k)
        self.c = c
        self.dead = dead_columns(lib)
        live = np.abs(c[~self.dead])
        live = live[live > 0]
        self.obj_scale = float(np.median(live)) if live.size else 1.0

        lens = lib.lengths
        # cover rows: column r has ones in rows start[r]..end[r]-1
        rows = [np.repeat(lib.start, lens) + (np.arange(lens.sum()) - np.repeat(np.cumsum(lens) - lens, lens))]
        cols = [np.repeat(np.arange(R), lens)]
        vals = [np.ones(int(lens.sum()))]
        row_lo = [np.ones(L)]
        row_hi = [np.ones(L)]
        self.budget_row: list[int] = []
        self.budget_scale: list[float] = []
        nrow = L
        self.budget_shift: list[float] = []
        budget_v: list[np.ndarray] = []
        for b in self.budgets:
            # Shift the row by shortest-path potentials (a combination of cover rows):
            # v'[r] = v[r] - (p[end] - p[start]) >= 0 and sum v' x = sum v x - p[L] on every
            # cover, so the row is equivalent but nonnegative and each coefficient is the
            # extra cost of taking r over the cheapest path: tighter bounds and cuts.
            v0 = lib.values(b.key)
            if self.opts.shift:  # least sum to each boundary (0 where unreachable)
                p = lib.path_values(v0, ~self.dead)
                p[~np.isfinite(p)] = 0.0
            else:
                p = np.zeros(lib.num_blocks + 1)
            v = np.where(self.dead, 0.0, v0 - (p[lib.end] - p[lib.start]))
            v[np.abs(v) <= 1e-12 * (float(np.max(np.abs(v0))) or 1.0)] = 0.0
            s = float(np.max(np.abs(v))) or 1.0
            nz = np.flatnonzero(v)
            rows.append(np.full(nz.size, nrow))
            cols.append(nz)
            vals.append(v[nz] / s)
            budget_v.append(v)
            const = lib.constant(b.key) + float(p[lib.num_blocks])
            self.budget_shift.append(float(p[lib.num_blocks]))
            row_lo.append(np.array([-np.inf if b.lo is None else (b.lo - const) / s]))
            row_hi.append(np.array([np.inf if b.hi is None else (b.hi - const) / s]))
            self.budget_row.append(nrow)
            self.budget_scale.append(s)
            nrow += 1
        for cr in self.counts:
            mask = lib.tagged(cr.tag)
            nz = np.flatnonzero(mask)
            coef = lens[nz].astype(float) if cr.unit == "blocks" else np.ones(nz.size)
            rows.append(np.full(nz.size, nrow))
            cols.append(nz)
            vals.append(coef)
            row_lo.append(np.array([-np.inf if cr.min is None else float(cr.min)]))
            row_hi.append(np.array([np.inf if cr.max is None else float(cr.max)]))
            nrow += 1
        #: the rows of each tie (see Tie), after the count rows
        self.tie_rows: list[np.ndarray] = []
        for t in self.ties:
            t_rows, t_cols, t_vals, t_hi = self._tie_rows(t, nrow)
            rows.append(t_rows)
            cols.append(t_cols)
            vals.append(t_vals)
            row_lo.append(np.full(t_hi.size, -np.inf))
            row_hi.append(t_hi)
            self.tie_rows.append(nrow + np.arange(t_hi.size))
            nrow += t_hi.size
        A = sp.coo_matrix((np.concatenate(vals), (np.concatenate(rows), np.concatenate(cols))),
                          shape=(nrow, R)).tocoo()
        #: member indices of each class of interchangeable replacements (see
        #: interchangeable_classes); class k's count is column R + k
        Ac = A.tocsc()
        self.classes = interchangeable_classes(Ac, L, lens, self.dead, c) \
            if self.opts.aggregate else []
        C = len(self.classes)
        #: class of each replacement (-1: none); members are continuous until a diversity
        #: row (see add_diversity)
        self._class_of = np.full(R, -1, dtype=np.int64)
        for k, m in enumerate(self.classes):
            self._class_of[m] = k
        self.member = self._class_of >= 0
        lo = np.zeros(R + C)
        hi = np.ones(R + C)
        if C:
            # x[r] of a member keeps its cover row and moves its budget and count
            # coefficients (the same for every member) to its class count n_k; the class
            # row n_k - sum x[r] = 0 links them
            first = np.array([m[0] for m in self.classes])
            keep = ~(self.member[A.col] & (A.row >= L))
            sig = [Ac[L:, first].tocoo()]
            n_rows = [sig[0].row + L, nrow + np.arange(C)]
            n_cols = [R + sig[0].col, R + np.arange(C)]
            n_vals = [sig[0].data, np.ones(C)]
            sizes = np.array([m.size for m in self.classes])
            mem = np.concatenate(self.classes)
            n_rows.append(nrow + np.repeat(np.arange(C), sizes))
            n_cols.append(mem)
            n_vals.append(-np.ones(mem.size))
            A = sp.coo_matrix(
                (np.concatenate([A.data[keep], *n_vals]),
                 (np.concatenate([A.row[keep], *n_rows]),
                  np.concatenate([A.col[keep], *n_cols]))), shape=(nrow + C, R + C))
            row_lo.append(np.zeros(C))
            row_hi.append(np.zeros(C))
            nrow += C
            hi[R:] = sizes
        #: SolveOptions.lattice: budget index -> the row of its lattice form, and the map from
        #: replacements to the lattice columns' values (see lattice_split, with_counts)
        self.lattice_row: dict[int, int] = {}
        self._aux_map = sp.csr_matrix((0, R))
        if self.opts.lattice:
            A, nrow, lo, hi = self._add_lattice(A, nrow, lo, hi, budget_v, row_lo, row_hi)
        A = A.tocsc()
        A.sort_indices()
        hi[self.forbid] = 0.0
        hi[:R][self.dead] = 0.0
        lo[self.pin] = 1.0
        self.col_lo, self.col_hi = lo, hi
        self.row_lo = np.concatenate(row_lo)
        self.row_hi = np.concatenate(row_hi)
        for i, row in self.lattice_row.items():
            self.row_lo[row] = self.row_lo[self.budget_row[i]]
            self.row_hi[row] = self.row_hi[self.budget_row[i]]
        self.num_rows = nrow

        self.A = A.tocsr()
        self.sense = -1 if self.objective.sense == "max" else 1
        # minimized, scaled objective (class counts cost nothing themselves)
        G = self._aux_map.shape[0]
        self.c_min = np.concatenate([self.sense * c / self.obj_scale, np.zeros(C + G)])
        self.h = _new_highs(self.opts)
        # HiGHS always minimizes c_min (a "max" objective is negated here), so its dual
        # bound and objective cutoffs are in the same min-form units as everything below
        integ = np.ones(R + C + G, dtype=np.int32)
        integ[:R][self.member] = 0  # 0/1 at every vertex once the counts are integers
        st = self.h.passModel(
            R + C + G, nrow, int(A.nnz), 1, 1, 0.0,
            self.c_min, lo, hi, self.row_lo, self.row_hi,
            A.indptr.astype(np.int32), A.indices.astype(np.int32), A.data.astype(np.float64),
            integ)
        self._cur_lo, self._cur_hi = lo, hi
        if int(st) < 0:
            raise SolverError(f"HiGHS rejected the model ({st})")
        o = self.opts
        self.rel_gap = max(float(o.mip_rel_gap), GAP_FLOOR)
        self.abs_gap = float(o.mip_abs_gap) / self.obj_scale  # HiGHS units
        self._set("mip_rel_gap", float(o.mip_rel_gap))
        self._set("mip_abs_gap", max(self.abs_gap, self.rel_gap))
        self.feastol = _FEASTOL_MAX
        self._set_feastol(_FEASTOL_MAX)
        self._set("random_seed", int(o.seed))
        if o.threads is not None:
            self._set("threads", int(o.threads))
        _sync_scheduler(self.h, o.threads)

    def _tie_rows(self, t: Tie, first: int
                  ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """The rows of tie ``t`` (numbered from ``first``) as COO ``(rows, cols, vals)``
        and their upper bounds (the lower ones are -inf); see :class:`Tie`. Dead and
        forbidden replacements are 0 and take no part."""
        lib = self.lib
        R, L = lib.num_replacements, lib.num_blocks
        of = np.asarray(t.group_of(R), dtype=np.int64)
        live = ~dead_columns(lib)
        live[self.forbid] = False
        of[~live] = -1
        start, end = lib.start, lib.end
        covers = [(start <= b) & (end > b) & live for b in range(L)]
        anchor = next((b for b in range(L) if covers[b].any() and np.all(of[covers[b]] >= 0)),
                      None)
        rr: list[np.ndarray] = []
        cc: list[np.ndarray] = []
        vv: list[np.ndarray] = []
        his: list[float] = []
        n = first
        if anchor is not None:
            at = covers[anchor]
            for g in range(len(t.groups)):
                mine = np.flatnonzero((of == g) & ~at)
                base = np.flatnonzero((of == g) & at)
                for b in np.unique(start[mine]):
                    here = mine[start[mine] == b]
                    rr.append(np.full(here.size + base.size, n))
                    cc.append(np.concatenate([here, base]))
                    vv.append(np.concatenate([np.ones(here.size), -np.ones(base.size)]))
                    his.append(0.0)
                    n += 1
        else:
            member = np.flatnonzero(of >= 0)
            starts = np.unique(start[member])
            big = float(starts.size)
            for g in range(len(t.groups)):
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
        if not rr:
            z = np.zeros(0, dtype=np.int64)
            return z, z, np.zeros(0), np.zeros(0)
        return (np.concatenate(rr), np.concatenate(cc), np.concatenate(vv),
                np.asarray(his, dtype=np.float64))

    def _add_lattice(self, A: Any, nrow: int, lo: np.ndarray, hi: np.ndarray,
                     budget_v: list[np.ndarray], row_lo: list[np.ndarray],
                     row_hi: list[np.ndarray]) -> tuple[Any, int, np.ndarray, np.ndarray]:
        """Append the lattice form of every budget row that has one (:func:`lattice_split`):
        integer columns ``W`` and ``N_k`` (each with an equality row defining it from the
        replacements, through the class counts for members) and the budget over them, with
        the budget row's bounds. Returns the model's matrix, row count and column bounds."""
        import scipy.sparse as sp

        lib, R, L = self.lib, self.lib.num_replacements, self.lib.num_blocks
        ncol = A.shape[1]
        C = ncol - R
        live = ~self.dead
        first = np.array([m[0] for m in self.classes], dtype=np.int64)
        maps: list[np.ndarray] = []  # one coefficient vector over the replacements per column
        rows_, cols_, vals_ = [A.row], [A.col], [A.data]
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
            s = self.budget_scale[i]
            defs = [w.astype(np.float64)] + [(res == k).astype(np.float64)
                                             for k in range(len(residues))]
            coefs = [q * d / s] + [q * t / s for t in residues]
            cols = []
            for f in defs:
                j = ncol + len(maps)
                maps.append(f)
                cols.append(j)
                # defining row: column j - sum f[r] x[r] = 0 (members through their count)
                on = np.flatnonzero((f != 0) & ~self.member)
                rr = [np.full(on.size + 1, nrow)]
                cc = [np.append(on, j)]
                vv = [np.append(-f[on], 1.0)]
                if C:
                    fk = f[first]
                    ks = np.flatnonzero(fk != 0)
                    rr.append(np.full(ks.size, nrow))
                    cc.append(R + ks)
                    vv.append(-fk[ks])
                rows_ += rr
                cols_ += cc
                vals_ += vv
                row_lo.append(np.zeros(1))
                row_hi.append(np.zeros(1))
                nrow += 1
                # a child takes at most one replacement starting at each block
                top = np.zeros(L)
                bot = np.zeros(L)
                np.maximum.at(top, lib.start[live], f[live])
                np.minimum.at(bot, lib.start[live], f[live])
                new_lo.append(float(bot.sum()))
                new_hi.append(float(top.sum()))
            rows_.append(np.full(len(cols), nrow))
            cols_.append(np.array(cols))
            vals_.append(np.array(coefs))
            row_lo.append(np.array([-np.inf]))  # the budget row's bounds, set in __init__
            row_hi.append(np.array([np.inf]))
            self.lattice_row[i] = nrow
            nrow += 1
        if not maps:
            return A, nrow, lo, hi
        A = sp.coo_matrix((np.concatenate(vals_), (np.concatenate(rows_),
                                                   np.concatenate(cols_))),
                          shape=(nrow, ncol + len(maps)))
        self._aux_map = sp.csr_matrix(np.vstack(maps))
        return A, nrow, np.append(lo, new_lo), np.append(hi, new_hi)

    # ---------------------------------------------------------------- helpers
    @property
    def num_columns(self) -> int:
        """HiGHS columns: one per replacement, then one count per class of
        interchangeable replacements (see :func:`interchangeable_classes`)."""
        return int(self.c_min.size)

    def _index(self, i: int, what: str) -> int:
        i = int(i)
        if not 0 <= i < self.lib.num_replacements:
            raise InputError(f"{what}: replacement index {i} is out of range "
                             f"[0, {self.lib.num_replacements})")
        return i

    def _set(self, name: str, value: Any) -> None:
        st = self.h.setOptionValue(name, value)
        if int(st) < 0:
            raise InputError(f"HiGHS option {name}={value!r} was rejected")

    def _set_feastol(self, t: float) -> None:
        """HiGHS' MIP feasibility tolerance (its absolute objective resolution, in HiGHS
        units) and the primal/dual LP tolerances, never looser than HiGHS' defaults."""
        self.feastol = float(min(max(t, _FEASTOL_MIN), _FEASTOL_MAX))
        self._set("mip_feasibility_tolerance", self.feastol)
        lp = min(1e-7, self.feastol)
        self._set("primal_feasibility_tolerance", lp)
        self._set("dual_feasibility_tolerance", lp)

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
        if i in self.lattice_row:  # its lattice form (SolveOptions.lattice) follows it
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
    def _on_mip_interrupt(self, e: Any) -> None:
        """HiGHS' MIP interrupt callback: stop the run once it holds a child below the
        cutoff and its dual bound exceeds ``_stop_above`` (see :meth:`_run`), with
        ``SolveOptions.stop_after_root`` not before its root node is done. HiGHS keeps the
        interrupt flag between runs, so it is written on every call. A recorded SIGINT /
        SIGTERM stops the run at once (:mod:`nas.mip.interrupt`); an exception never leaves
        the callback (HiGHS would swallow it): it stops the run and is raised after it."""
        try:
            _inject("interrupt")
            if interrupt.pending() or self._cb_error is not None:
                e.interrupt(True)
                return
            out = e.data_out
            stop = (out.mip_primal_bound < self._stop_below
                    and out.mip_dual_bound > self._stop_above
                    and (out.mip_node_count >= 1 or not self.opts.stop_after_root))
            if stop:
                self._interrupted = True
            e.interrupt(bool(stop))
        except BaseException as exc:  # raised again by _run
            self._cb_error = self._cb_error or exc
            with contextlib.suppress(BaseException):
                e.interrupt(True)

    def _on_improving_solution(self, e: Any) -> None:
        """HiGHS' improving-solution callback: keep the child (see :meth:`found_children`;
        an exception is kept for :meth:`_run`, never let out)."""
        try:
            _inject("improving")
            x = np.asarray(e.data_out.mip_solution, dtype=np.float64)
            nz = np.flatnonzero(np.abs(x) > 1e-9)
            self._found.append((nz, x[nz].copy()))
        except BaseException as exc:  # raised again by _run
            self._cb_error = self._cb_error or exc

    def found_children(self) -> list[np.ndarray]:
        """Children HiGHS found in this model's runs so far (each as replacement indices,
        best first, duplicates dropped) that meet every current row, diversity rows
        included: an earlier solve's runner-up is a checked incumbent for the next solve of
        a pool (see :func:`nas.mip.diverse_pool`)."""
        out: dict[bytes, tuple[float, np.ndarray]] = {}
        for nz, vals in self._found:
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
        import highspy

        self._set("time_limit", float(time_limit) if time_limit is not None else math.inf)
        self._set("objective_bound", math.inf if cutoff is None else float(cutoff))
        self._stop_above = float(stop_above)
        # a child found by this run is below the cutoff; HiGHS reports the cutoff itself as
        # its primal bound until then
        self._stop_below = math.inf if cutoff is None else \
            float(cutoff) - 1e-9 * max(1.0, abs(float(cutoff)))
        self._interrupted = False
        if not self._callback_on:
            self.h.cbMipInterrupt.subscribe(self._on_mip_interrupt)
            self.h.cbMipImprovingSolution.subscribe(self._on_improving_solution)
            self._callback_on = True
        # HiGHS 1.16 reuses the previous run's solution as a MIP start, and the property
        # test caught it mis-valuing such a start after presolve (returning it as "optimal"
        # when it was not): every run starts clean, a known child is only a cutoff.
        self.h.clearSolver()
        run_status = self._highs_run()
        ms = self.h.getModelStatus()
        info = self.h.getInfo()
        nodes = int(max(info.mip_node_count, 0))
        MS = highspy.HighsModelStatus
        has_sol = int(info.primal_solution_status) == 2  # kSolutionStatusFeasible
        bound = float(info.mip_dual_bound)
        if self._interrupted and has_sol:
            x = self.integral(np.asarray(self.h.getSolution().col_value, dtype=np.float64))
            return "stopped", x, float(stop_above), nodes, ""
        if cutoff is not None and not has_sol and ms in (
                MS.kInfeasible, MS.kObjectiveBound, MS.kOptimal):
            return "cutoff", None, cutoff - self.feastol, nodes, ""
        if ms == MS.kOptimal:
            status = "optimal"
        elif ms in (MS.kInfeasible, MS.kUnboundedOrInfeasible):
            return "infeasible", None, math.inf, nodes, ""
        elif has_sol and ms in (MS.kTimeLimit, MS.kIterationLimit, MS.kSolutionLimit,
                                MS.kInterrupt, MS.kHighsInterrupt, MS.kObjectiveBound,
                                MS.kObjectiveTarget, MS.kMemoryLimit, MS.kUnknown):
            status = "feasible"
        else:
            msg = f"HiGHS stopped with model status {self.h.modelStatusToString(ms)}"
            if ms == MS.kTimeLimit:
                msg += " before finding any feasible child"
            return "error", None, -math.inf, nodes, f"{msg} ({run_status})"
        x = self.integral(np.asarray(self.h.getSolution().col_value, dtype=np.float64))
        if not math.isfinite(bound):
            bound = -math.inf
        # HiGHS prunes nodes within mip_feasibility_tolerance of the incumbent, so children
        # better by less than that are unseen: the bound it proved is at most U - feastol.
        u = float(self.c_min @ np.round(x))
        return status, x, min(bound, u - self.feastol), nodes, ""

    def _dp_run(self, lo: np.ndarray, hi: np.ndarray, cutoff: float | None,
                lazy: np.ndarray) -> tuple[str, np.ndarray | None, float, int, str] | None:
        """The run :meth:`_run` would make on the column bounds ``lo`` / ``hi`` (budget
        and count rows ``lazy`` left out), solved exactly by :func:`nas.mip.dp.path_optimum`
        instead of HiGHS (``SolveOptions.dp``): same statuses, with the restricted optimum
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
            self._found.append((nz, x[nz]))
        return "optimal", xs[0], float(self.c_min @ xs[0]), 0, ""

    def _highs_run(self) -> Any:
        """``Highs.run()`` with SIGINT / SIGTERM recorded, not raised inside HiGHS'
        callbacks: a signal stops the run, and :class:`~nas.mip.interrupt.Interrupted` is
        raised after it (and before it, when one came earlier), as is an exception a
        callback kept; see :mod:`nas.mip.interrupt`."""
        self._cb_error = None
        with interrupt.deferred():
            _inject("run")
            interrupt.check()
            status = self.h.run()
            err, self._cb_error = self._cb_error, None
            interrupt.check()
            if err is not None:
                raise err
        return status

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
        for (i, k), r in take.items():
            if i not in forced or forced[i][0] == k:
                cost[i, slot_class == k] = self.c_min[r]
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
        self._set("solve_relaxation", True)
        try:
            self._set("time_limit", math.inf if time_limit is None else float(time_limit))
            self._set("objective_bound", math.inf)
            self.h.clearSolver()
            self._highs_run()
            import highspy

            ms = self.h.getModelStatus()
            if ms in (highspy.HighsModelStatus.kInfeasible,
                      highspy.HighsModelStatus.kUnboundedOrInfeasible):
                return "infeasible", math.inf, np.zeros(0)
            if ms != highspy.HighsModelStatus.kOptimal:
                return "error", -math.inf, np.zeros(0)
            sol = self.h.getSolution()
            y0 = np.asarray(sol.row_dual, dtype=np.float64)
            #: row activities of the last LP solution (see lazy_candidates)
            self.lp_activity = np.asarray(sol.row_value, dtype=np.float64)
        finally:
            self._set("solve_relaxation", False)
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

    def lazy_candidates(self) -> np.ndarray:
        """Budget and count rows (indices into the model's rows) that the last LP
        relaxation's solution (:meth:`lp_bound`) leaves slack by at least
        :data:`LAZY_SLACK` times their largest coefficient: :meth:`solve` leaves them out of
        the HiGHS runs (``SolveOptions.lazy_rows``). On the bench_mip sweeps 4 of the 7
        budget rows are that slack at every point, and every node of the search paid for
        them (cuts, propagation, LP rows)."""
        if self.lp_activity is None:
            return np.zeros(0, dtype=np.int64)
        L = self.lib.num_blocks
        rows = np.arange(L, L + len(self.budgets) + len(self.counts))
        act = self.lp_activity[rows]
        slack = np.minimum(self.row_hi[rows] - act, act - self.row_lo[rows])
        big = np.abs(self.A[rows]).max(axis=1).toarray().ravel()
        out = rows[slack >= LAZY_SLACK * np.maximum(big, 1e-300)]
        # a budget row left out takes its lattice form (SolveOptions.lattice) with it
        by_row = {self.budget_row[i]: r for i, r in self.lattice_row.items()}
        extra = [by_row[int(r)] for r in out if int(r) in by_row]
        return np.concatenate([out, np.asarray(extra, dtype=np.int64)])

    def broken_rows(self, x: np.ndarray, rows: np.ndarray) -> np.ndarray:
        """Those of ``rows`` that ``x`` (HiGHS' solution, class counts included) breaks by
        more than the feasibility tolerance HiGHS keeps rows to."""
        act = self.A[rows] @ x
        return rows[(act > self.row_hi[rows] + self.feastol)
                    | (act < self.row_lo[rows] - self.feastol)]

    def first_threshold(self, lb0: float, d: np.ndarray) -> tuple[float, float]:
        """``(tau, span)``: the first reduced-cost fixing threshold after an LP bound
        ``lb0`` with reduced costs ``d`` (HiGHS units; three allowed gaps, or
        :data:`FIRST_FIX` of the bound), and ``span``, the largest reduced cost of a free
        column."""
        free = (self.col_lo == 0) & (self.col_hi == 1)
        span = float(np.max(np.abs(d[free]))) if free.any() else 0.0
        return max(3 * self.allowed_gap(lb0), FIRST_FIX * max(abs(lb0), 1e-3 * span)), span

    def threshold_for(self, u: float, lb0: float) -> float:
        """The fixing threshold ``tau`` (HiGHS units, above the LP bound ``lb0``) that puts
        ``lb0 + tau`` half the allowed gap below the incumbent's objective ``u`` (a hair
        above, against rounding): a restricted run that finds nothing better then proves
        ``u`` within the allowed gap."""
        return (u - 0.5 * self.allowed_gap(u) - lb0) * (1 + 1e-9) + 1e-12

    def stop_threshold(self, t: float) -> float:
        """The least dual bound ``D`` of a restricted run that proves ``D - allowed(D) >
        t`` (HiGHS units): past it, the run's optimum ``U'`` (``>= D``) has ``U' -
        allowed(U') > t``, because ``U - allowed(U)`` grows with ``U``."""
        g, a = self.rel_gap, self.abs_gap
        scaled = t / (1 - g) if t >= 0 else t / (1 + g)
        d = max(t + g, t + a, scaled)
        return d + 1e-12 * max(1.0, abs(d))

    def solve(self, incumbent: np.ndarray | None = None) -> Result:
        """Solve to the requested gap and verify. An infeasible model gives status
        ``infeasible`` with the message "infeasible" (:func:`nas.mip.solve` and the other
        public functions attach the explanation, see :func:`explain_infeasible`).

        ``incumbent``: replacement indices of a child known to meet the current rows (a
        sweep's previous point, as the bound loosens). It is checked here, never handed to
        HiGHS as a MIP start; it is the objective cutoff of every run (HiGHS looks only for
        better children) and is returned when nothing better exists. It does not set the
        first fixing threshold (a far-off incumbent would free nearly every column) unless
        ``SolveOptions.incumbent_threshold``.

        The feasibility tolerance is set from the data before each run (see the module
        doc); when HiGHS reports optimal but the honest bound misses the allowed gap, the
        run is repeated once with the tolerance set from the incumbent.

        With ``SolveOptions.fixing`` (default), the LP relaxation's duals give a lower bound
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
        (``SolveOptions.stop``, on by default). A run is not stopped before its root node is
        done (``SolveOptions.stop_after_root``): the root's heuristics often improve much on
        the first child.

        With ``SolveOptions.lazy_rows`` (default) the budget and count rows that the LP
        solution leaves slack by :data:`LAZY_SLACK` of their largest coefficient are left
        out of the runs (:meth:`lazy_candidates`). A run without them solves a relaxation, so
        its bound, its cutoff and its infeasibility hold for the whole model; every child is
        checked against them, and one that breaks a row puts that row back and the run is
        repeated ("lazy row broken" in ``runs``). The answer is verified against every row.
        ``runs`` lists the status of each run.
        """
        steps = self.solve_steps(incumbent)
        while True:
            try:
                next(steps)
            except StopIteration as done:
                return done.value

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
        o, m = self.opts, self
        t0 = time.perf_counter()
        spent = [0.0, t0]  # seconds in earlier steps, start of this one

        def elapsed() -> float:
            return spent[0] + time.perf_counter() - spent[1]

        left = (lambda: None) if o.time_limit is None else \
            (lambda: max(0.0, o.time_limit - elapsed()))
        nodes = 0
        lp_status, lb0, d = "skipped", -math.inf, np.zeros(0)
        if o.fixing:
            lp_status, lb0, d = m.lp_bound(left())
            if lp_status == "infeasible":
                return m._result(elapsed(), "infeasible", None, -math.inf, nodes, "")
        est = max(abs(lb0) if math.isfinite(lb0) else 0.0, abs(self._unconstrained_min()))
        m._set_feastol(self._tolerance_for(est))
        free = (self.col_lo == 0) & (self.col_hi == 1)
        if lp_status != "optimal" or not math.isfinite(lb0):
            # no LP bound (fixing off, or the LP stopped): nothing is ever fixed, and the
            # loop below is one run of the full model (plus the tightening re-run)
            lb0, d, tau, span = -math.inf, np.zeros(self.c_min.size), math.inf, 0.0
        else:
            tau, span = self.first_threshold(lb0, d)
        # rows the LP leaves far from binding stay out of the runs (see lazy_candidates)
        lazy = m.lazy_candidates() if o.lazy_rows and lp_status == "optimal" \
            else np.zeros(0, dtype=np.int64)
        inc: np.ndarray | None = None
        u = math.inf
        runs: list[str] = []
        self.runs = runs
        if incumbent is not None:
            x0 = np.zeros(self.lib.num_replacements)
            x0[np.asarray(incumbent, dtype=np.int64)] = 1.0
            x0 = self.with_counts(x0)
            try:
                self.verify(x0)
            except SolverError:
                pass  # not feasible under the current rows: ignore it
            else:
                # a cutoff from the first run; by default tau starts small as without it
                # (set from it, a sweep's far-off neighbour freed nearly every column:
                # bench_mip's sweep took 1.5-1.9x the CPU), and the stop rule ends runs
                # that cannot be the last
                inc, u = x0, float(self.c_min @ x0)
                if o.incumbent_threshold:
                    tau = max(tau, self.threshold_for(u, lb0))
        status = "error"
        msg = ""
        bound = -math.inf
        retightened = False
        try:
            while True:
                if runs:
                    # between runs: hand back the gap left, go on with the model sent
                    m._bounds(m.col_lo, m.col_hi)
                    hint = math.inf if inc is None else \
                        (u - max(bound, lb0)) / self.allowed_gap(u)
                    spent[0] += time.perf_counter() - spent[1]
                    nxt = yield hint
                    spent[1] = time.perf_counter()
                    if nxt is not None and nxt is not m:
                        nxt._set_feastol(m.feastol)
                        nxt.runs = runs
                        m = nxt
                fix0 = free & (d > tau)
                fix1 = free & (-d > tau)
                full = not (fix0.any() or fix1.any())
                lo, hi = self.col_lo.copy(), self.col_hi.copy()
                hi[fix0] = 0.0
                lo[fix1] = 1.0
                m._bounds(lo, hi)
                # with an incumbent, HiGHS searches only for children better than half the
                # allowed gap below it (a cutoff, never a MIP start; half, so that the
                # bound it proves clears the gap by more than rounding)
                cut = None if inc is None else u - 0.5 * self.allowed_gap(u) + m.feastol
                # this run is the last only if its optimum U' has lb0 + tau >= U' - allowed
                # (U'); once HiGHS' bound D on it shows otherwise, more search here is
                # wasted: stop holding a child and raise tau (see stop_threshold)
                stop = math.inf if full or not o.stop else self.stop_threshold(lb0 + tau)
                found = m._dp_run(lo, hi, cut, lazy) if o.dp else None
                st, x, bnd, n, msg = found if found is not None else \
                    m._run(left(), cut, stop, lazy)
                nodes += n
                broken = np.zeros(0, dtype=np.int64) if x is None else m.broken_rows(x, lazy)
                if broken.size:
                    # the child breaks a row left out: put it back and repeat the run (the
                    # run's bound held, but its child and its stop do not count)
                    lazy = np.setdiff1d(lazy, broken)
                    runs.append("lazy row broken")
                    continue
                runs.append(st)
                if _DEBUG:
                    print(f"tau={tau:.3g} free={int(free.sum() - fix0.sum() - fix1.sum())} "
                          f"st={st} n={n} feastol={m.feastol:.3g} lb0={lb0:.6g} "
                          f"bnd={bnd:.6g} u={u:.6g} "
                          f"t={time.perf_counter() - t0:.3f}", file=sys.stderr)
                if st == "stopped":
                    # a child using a fixed column costs >= lb0 + tau, one using none costs
                    # >= D > lb0 + tau: lb0 + tau is a global bound
                    assert x is not None
                    val = float(self.c_min @ np.round(x))
                    if val < u:
                        u, inc = val, x
                    bound = max(bound, min(lb0 + tau, u))
                    tau = self.threshold_for(u, lb0)
                    continue
                if st == "cutoff":
                    # no child below the cutoff among the free columns, and a child using
                    # a fixed one costs >= lb0 + tau (cutoff - feastol, without rounding)
                    bnd = u - 0.5 * self.allowed_gap(u)
                    bound = max(bound, bnd if full else min(bnd, lb0 + tau))
                    if full or lb0 + tau >= u - self.allowed_gap(u):
                        status = "optimal"
                        break
                    tau = self.threshold_for(u, lb0)
                    continue
                if st == "infeasible":
                    if inc is not None and lb0 + tau >= u - self.allowed_gap(u):
                        # nothing better among the free columns, and a child using a fixed
                        # one costs >= lb0 + tau: the incumbent is optimal
                        bound = max(bound, min(lb0 + tau, u))
                        status = "optimal"
                        break
                    if full:
                        status = "infeasible"
                        break
                    tau = max(4 * tau, 1e-2 * span)  # any child uses a fixed column
                    continue
                if st == "error":
                    if inc is not None:  # time ran out: keep the incumbent
                        status = "feasible"
                    else:
                        status = "error"
                    break
                assert x is not None
                val = float(self.c_min @ np.round(x))
                if val < u:
                    u, inc = val, x
                global_lb = bnd if full else min(bnd, lb0 + tau)
                if st == "feasible":  # restricted solve stopped early (time limit)
                    bound = max(bound, min(global_lb, u))
                    status = "feasible"
                    break
                if (u - bnd > self.allowed_gap(u) and not retightened
                        and m.feastol > _FEASTOL_MIN):
                    # HiGHS' optimum is within feastol, which the allowed gap at this
                    # incumbent cannot absorb: tighten and re-solve the same restriction
                    retightened = True
                    m._set_feastol(self._tolerance_for(abs(u)))
                    continue
                bound = max(bound, global_lb)
                if full or lb0 + tau >= u - self.allowed_gap(u):
                    status = "optimal"
                    break
                tau = self.threshold_for(u, lb0)
        finally:
            m._bounds(m.col_lo, m.col_hi)
        if status == "infeasible":
            return m._result(elapsed(), "infeasible", None, -math.inf, nodes, "")
        if inc is None:
            return m._result(elapsed(), "error", None, -math.inf, nodes, msg)
        return m._result(elapsed(), status, inc, bound, nodes, "")

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
        return Result(st, objective, bound, gap, nodes, secs,  # type: ignore[arg-type]
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
        lib, tol = self.lib, self.opts.tolerance
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
        for t in self.ties:
            groups = t.broken_by(chosen.tolist(), lib.num_replacements)
            if len(groups) > 1:
                shown = [t.values[g] if t.values else str(g) for g in groups]
                raise SolverError(f"solution breaks {t}: it takes {', '.join(shown)}")
        cs = set(chosen.tolist())
        for prev, d in self.diversity:
            same = int(sum(lib.lengths[r] for r in prev if r in cs))
            if lib.num_blocks - same < d:
                raise SolverError(f"solution differs from an earlier one in "
                                  f"{lib.num_blocks - same} < {d} blocks")
        return chosen
