"""What a caller asks of a solve (:class:`SolveOptions`) and how the solver does the work
(:class:`SolverTuning`, set by the tests and ``benchmarks/bench_mip.py`` only)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

from hwprofiles.errors import InputError

Status = Literal["optimal", "feasible", "infeasible", "error"]

#: ``mip_rel_gap = 0`` means optimal within this relative gap (see :mod:`nas.mip`).
GAP_FLOOR = 1e-9


@dataclass
class SolveOptions:
    """What a solve promises and how long it may take. ``time_limit`` in seconds (None:
    no limit); ``mip_rel_gap`` is relative to the block-sum objective (constants excluded,
    see :mod:`nas.mip`; 0 means within :data:`GAP_FLOOR`); ``mip_abs_gap`` in objective
    units; ``threads`` None leaves HiGHS' default; ``seed`` is HiGHS' random seed;
    ``verbose`` sends HiGHS' log to stderr (never stdout); ``tolerance`` is the relative
    slack of the re-verification (None: derived from the solver tolerance). How the work
    is done is :class:`SolverTuning`'s. A known child is given per solve, checked, as
    :meth:`~nas.mip.MipModel.solve`'s ``incumbent`` (never as a HiGHS MIP start)."""

    time_limit: float | None = None
    mip_rel_gap: float = 1e-4
    mip_abs_gap: float = 0.0
    threads: int | None = None
    seed: int = 0
    verbose: bool = False
    tolerance: float | None = None

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


@dataclass
class SolverTuning:
    """How the solver does the work; every field changes the work, never the answer's
    guarantee, and every default is chosen by ``benchmarks/bench_mip.py``.

    ``fixing`` turns on LP reduced-cost fixing before the MIP (see
    :meth:`~nas.mip.MipModel.solve`); ``shift`` rewrites each budget row by shortest-path
    potentials (nonnegative coefficients, same feasible set); ``restarts`` allows HiGHS'
    restarts (re-presolving after root fixings); ``stop`` interrupts a restricted run once
    its bound shows it cannot be the last; ``stop_after_root`` lets ``stop`` interrupt a run
    only once its root node is done (the root's heuristics often improve much on the first
    child, and the next run's threshold and cutoff come from it); ``incumbent_threshold``
    lets a given incumbent set the first fixing threshold (off: it is only a cutoff).

    ``node_cuts`` lets HiGHS separate cuts at every node, not only at the root
    (``mip_allow_cut_separation_at_nodes``); ``cut_pool`` is HiGHS' cut pool
    ``(mip_pool_soft_limit, mip_pool_age_limit)``, None for HiGHS' defaults (10,000, 30):
    the budget rows give HiGHS thousands of cuts and conflicts to propagate at every node,
    and a small pool that forgets unused cuts soon costs less than it loses. ``sub_mips``
    runs HiGHS' RINS and RENS heuristics (``mip_heuristic_run_rins`` / ``_rens``), small
    MIPs around the LP solution that took most of a run's time at the root here.

    ``aggregate`` gives each class of replacements alike in objective and every row one
    integer count and branches on it (:func:`nas.mip.rows.interchangeable_classes`).
    ``lazy_rows`` leaves out of the HiGHS runs the budget and count rows that the LP
    relaxation leaves slack by at least their largest coefficient
    (:data:`nas.mip.steps.LAZY_SLACK`), checks every child against them and puts back
    (re-running) any row a child breaks (it needs the LP, so it acts with ``fixing``
    only). ``lattice`` adds to each budget row whose coefficients are a step times an
    integer plus one of a few residues (measured sizes in MiB: a multiple of 6 MiB plus an
    attention part) the same row over integer columns (:func:`nas.mip.rows.lattice_split`),
    which lets HiGHS round the budget to the step. ``dp`` solves a restricted run with one
    or two budget rows in force, no count or diversity row and a few hundred free
    replacements exactly by dynamic programming over the replacement graph instead of
    HiGHS (:func:`nas.mip.dp.path_optimum`; HiGHS when the labels grow past a limit)."""

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
        if self.cut_pool is not None:
            pool = self.cut_pool
            ok = (isinstance(pool, (tuple, list)) and len(pool) == 2
                  and all(isinstance(v, int) and not isinstance(v, bool) for v in pool)
                  and pool[0] >= 1 and 0 <= pool[1] <= 1000)
            if not ok:
                raise InputError("cut_pool must be (soft limit >= 1, age limit 0..1000) as "
                                 f"integers, or None, got {pool!r}")
