"""The mixed-integer program: pick one replacement per covered span, best under every budget.

Model (one binary ``x[r]`` per replacement ``r`` of a :class:`~nas.library.BlockLibrary`):

- **exact cover**: for every parent block ``b``, ``sum_{r covers b} x[r] = 1`` (the path
  ``0 -> L`` of the replacement graph);
- **budgets** (:class:`Budget`): ``lo <= sum_r v_k[r] x[r] + constant_k <= hi`` on any cost
  or score key ``k``;
- **count rows** (:class:`CountRule`): bounds on the number of chosen replacements carrying a
  tag (``unit="replacements"``), or on the number of parent blocks those replacements
  cover (``unit="blocks"``, coefficient = span length);
- **pins / forbids**: ``x[r] = 1`` / ``x[r] = 0``;
- **objective** (:class:`Objective`): minimize or maximize a weighted sum of keys (scores
  for the usual "best quality under budgets", a cost for the dual form "least runtime under
  a quality bound").

The matrix is built as numpy arrays (CSC) and handed to HiGHS in one ``passModel`` call.

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

import contextlib
import math
import os
import re
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np

from hwprofiles.errors import InputError
from nas.library import BlockLibrary

_DEBUG = bool(os.environ.get("PUZZLE_NAS_MIP_DEBUG"))

Status = Literal["optimal", "feasible", "infeasible", "error"]


class InfeasibleError(InputError):
    """No child meets every constraint; the message is the explanation (CLI exit code 3)."""

    exit_code: int = 3


class SolverError(RuntimeError):
    """HiGHS returned a solution that breaks a row of the model (a bug, never bad input)."""


# --------------------------------------------------------------------------- specs

_NUM = r"[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?"


# unit of a library key, read from its name: (dimension, size of one key unit in base units)
_KEY_UNITS: list[tuple[str, str, float]] = [
    (r"(^|_)bytes?$", "memory", 1.0), (r"(^|_)kib$", "memory", 2.0**10),
    (r"(^|_)mib$", "memory", 2.0**20), (r"(^|_)gib$", "memory", 2.0**30),
    (r"(^|_)kb$", "memory", 1e3), (r"(^|_)mb$", "memory", 1e6), (r"(^|_)gb$", "memory", 1e9),
    (r"(^|_)(s|sec|seconds)$", "time", 1.0), (r"(^|_)ms$", "time", 1e-3),
    (r"(^|_)us$", "time", 1e-6), (r"(^|_)params$", "count", 1.0),
    (r"(^|_)(tok_s|tps|tok/s)$", "rate", 1.0),
]


def key_unit(key: str) -> tuple[str, float] | None:
    """``(dimension, base units per key unit)`` for a key whose name says its unit
    (``stats.memory_mib`` -> ``("memory", 2**20)``, ``runtime_s@chat`` -> ``("time", 1)``);
    None when the name says nothing."""
    leaf = key.split("@", 1)[0].rsplit(".", 1)[-1].lower()
    for pat, dim, size in _KEY_UNITS:
        if re.search(pat, leaf):
            return dim, size
    return None


_VALUE = re.compile(r"^\s*([-+]?(?:inf(?:inity)?|(?:\d[\d_]*\.?[\d_]*|\.\d[\d_]*)"
                    r"(?:[eE][-+]?\d+)?))\s*(.*?)\s*$", re.IGNORECASE)


def parse_value(text: str, key: str) -> float:
    """A budget value for ``key``: a number (``1e5``, ``80_000``, ``inf``) with an optional
    unit word from the spec's units (``80 GiB``, ``10 ms``, ``75B``, ``5000 tok/s``),
    converted to the key's own unit (:func:`key_unit`)."""
    from nas.spec import _UNITS  # the unit words spec budgets accept

    m = _VALUE.match(str(text))
    if not m:
        raise InputError(f"budget on {key!r}: cannot read {text!r} as a number "
                         "(e.g. 1e5, 80_000, inf, '80 GiB')")
    try:
        v = float(m.group(1).replace("_", ""))
    except ValueError:
        raise InputError(f"budget on {key!r}: cannot read {m.group(1)!r} as a number") from None
    word = m.group(2).strip()
    if not word:
        return v
    ku = key_unit(key)
    if ku is None:
        raise InputError(f"budget on {key!r}: unit {word!r} given, but the key's name says no "
                         "unit (write the number in the key's own units)")
    dim, size = ku
    units = _UNITS[dim]
    if word.lower() not in units:
        raise InputError(f"budget on {key!r}: unknown unit {word!r} for a {dim} key; expected "
                         f"one of {sorted(u for u in units if u)}")
    return v * units[word.lower()] / size


def _bounds_str(key: str, lo: float | None, hi: float | None) -> str:
    """``key<=hi``, ``key>=lo``, ``key==v`` or ``lo<=key<=hi`` (the form ``parse`` reads)."""
    if lo is not None and hi is not None:
        return f"{key}=={hi:g}" if lo == hi else f"{lo:g}<={key}<={hi:g}"
    return f"{key}<={hi:g}" if hi is not None else f"{key}>={lo:g}"


@dataclass(frozen=True)
class Budget:
    """``lo <= total(key) <= hi`` (either side may be None); totals include constants."""

    key: str
    lo: float | None = None
    hi: float | None = None

    def __post_init__(self) -> None:
        for v in (self.lo, self.hi):
            if v is not None and math.isnan(v):
                raise InputError(f"budget on {self.key!r}: bound is NaN")
        if self.lo == math.inf or self.hi == -math.inf:
            raise InputError(f"budget on {self.key!r} can never be met ({self})")
        # ``<= inf`` / ``>= -inf`` bound nothing (the NVlabs notebook passes runtime <= inf)
        if self.hi == math.inf:
            object.__setattr__(self, "hi", None)
        if self.lo == -math.inf:
            object.__setattr__(self, "lo", None)
        if self.lo is not None and self.hi is not None and self.lo > self.hi:
            raise InputError(f"budget on {self.key!r}: lower bound {self.lo} > upper {self.hi}")

    @property
    def unbounded(self) -> bool:
        """True for ``KEY<=inf``: a budget that bounds nothing."""
        return self.lo is None and self.hi is None

    @classmethod
    def parse(cls, text: str) -> Budget:
        """Parse ``KEY<=V``, ``KEY>=V``, ``KEY==V`` or ``LO<=KEY<=HI``.

        ``V`` is a number (``1e5``, ``80_000``, ``inf``) optionally followed by a unit word
        that spec budgets accept (``80 GiB``, ``10 ms``, ``75B``), converted to the unit the
        key's name says it is in (``memory_bytes``, ``stats.memory_mib``, ``runtime_s``,
        ``stats.runtime_ms``, ``params``); see :func:`parse_value`."""
        s = text.strip()
        m = re.fullmatch(r"\s*(.+?)\s*<=\s*([^<>=]+?)\s*<=\s*(.+?)\s*", s)
        if m:
            key = m.group(2)
            return cls(key, parse_value(m.group(1), key), parse_value(m.group(3), key))
        m = re.fullmatch(r"(.+?)\s*(<=|>=|==)\s*(.+?)\s*", s)
        if not m or not m.group(1).strip():
            raise InputError(f"cannot parse budget {text!r} (expected KEY<=VALUE, KEY>=VALUE, "
                             "KEY==VALUE or LO<=KEY<=HI)")
        key, op = m.group(1).strip(), m.group(2)
        v = parse_value(m.group(3), key)
        if op == "<=":
            return cls(key, None, v)
        if op == ">=":
            return cls(key, v, None)
        if not math.isfinite(v):
            raise InputError(f"budget {text!r}: {key} == {v} can never be met")
        return cls(key, v, v)

    def __str__(self) -> str:
        if self.unbounded:
            return f"{self.key}<=inf"
        return _bounds_str(self.key, self.lo, self.hi)


@dataclass(frozen=True)
class CountRule:
    """Bounds on how many chosen replacements carry ``tag`` (``unit="replacements"``), or
    on how many parent blocks they cover (``unit="blocks"``)."""

    tag: str
    min: int | None = None
    max: int | None = None
    unit: Literal["replacements", "blocks"] = "replacements"

    def __post_init__(self) -> None:
        if self.min is None and self.max is None:
            raise InputError(f"count rule on tag {self.tag!r} has neither min nor max")
        if self.unit not in ("replacements", "blocks"):
            raise InputError(f"count rule unit {self.unit!r} (expected replacements or blocks)")

    @classmethod
    def parse(cls, text: str) -> CountRule:
        """Parse ``TAG>=N``, ``TAG<=N``, ``TAG==N``; prefix ``blocks:`` counts parent blocks."""
        s = text.strip()
        unit: Literal["replacements", "blocks"] = "replacements"
        if s.startswith("blocks:"):
            unit, s = "blocks", s[len("blocks:"):]
        m = re.fullmatch(r"(.+?)\s*(<=|>=|==)\s*(\d+)\s*", s)
        if not m:
            raise InputError(f"cannot parse count rule {text!r} (expected [blocks:]TAG>=N, "
                             "TAG<=N or TAG==N)")
        tag, op, n = m.group(1).strip(), m.group(2), int(m.group(3))
        lo = n if op in (">=", "==") else None
        hi = n if op in ("<=", "==") else None
        return cls(tag, lo, hi, unit)

    def __str__(self) -> str:
        p = "blocks:" if self.unit == "blocks" else ""
        return p + _bounds_str(self.tag, self.min, self.max)


@dataclass(frozen=True)
class Objective:
    """Minimize (or maximize) ``sum_k weights[k] * total(k)``."""

    weights: Mapping[str, float]
    sense: Literal["min", "max"] = "min"

    @classmethod
    def parse(cls, text: str | Objective) -> Objective:
        """``KEY``, ``min:KEY``, ``max:KEY`` or a weighted sum ``KEY + 0.5*KEY2``."""
        if isinstance(text, Objective):
            return text
        s = text.strip()
        sense: Literal["min", "max"] = "min"
        if s[:4] in ("min:", "max:"):
            sense, s = s[:3], s[4:]  # type: ignore[assignment]
        weights: dict[str, float] = {}
        for term in re.split(r"(?<![eE*])\+", s):
            term = term.strip()
            if not term:
                raise InputError(f"cannot parse objective {text!r}")
            m = re.fullmatch(rf"({_NUM})\s*\*\s*(.+)", term)
            w, key = (float(m.group(1)), m.group(2).strip()) if m else (1.0, term)
            weights[key] = weights.get(key, 0.0) + w
        return cls(weights, sense)

    def __str__(self) -> str:
        body = " + ".join(k if w == 1 else f"{w:g}*{k}" for k, w in self.weights.items())
        return f"{self.sense}:{body}"


#: ``mip_rel_gap = 0`` means optimal within this relative gap (see the module doc).
GAP_FLOOR = 1e-9
#: HiGHS' smallest accepted feasibility tolerance, and its default MIP one.
_FEASTOL_MIN, _FEASTOL_MAX = 1e-10, 1e-6


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
    after root fixings); ``warm_start`` passes earlier children to HiGHS as MIP starts
    (off: see :meth:`MipModel.warm_start`)."""

    time_limit: float | None = None
    mip_rel_gap: float = 1e-4
    mip_abs_gap: float = 0.0
    threads: int | None = None
    seed: int = 0
    verbose: bool = False
    tolerance: float | None = None
    fixing: bool = True
    shift: bool = True
    restarts: bool = False
    warm_start: bool = False

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


# --------------------------------------------------------------------------- result


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


# --------------------------------------------------------------------------- stdout guard


@contextlib.contextmanager
def _fd1_redirected(to_stderr: bool) -> Iterator[None]:
    """Point file descriptor 1 at stderr (``to_stderr``) or /dev/null for the duration:
    HiGHS writes its banner and log with C stdio, which ``sys.stdout`` cannot catch."""
    try:
        sys.stdout.flush()
    except (AttributeError, ValueError):
        pass
    try:
        saved = os.dup(1)
    except OSError:  # no fd 1 at all
        yield
        return
    target = os.dup(2) if to_stderr else os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(target, 1)
        yield
    finally:
        with contextlib.suppress(Exception):
            import ctypes

            ctypes.CDLL(None).fflush(None)
        os.dup2(saved, 1)
        os.close(saved)
        os.close(target)


_SCHEDULER: list[int | None] = [None]  # thread count HiGHS' global scheduler was started with


def _sync_scheduler(h: Any, threads: int | None) -> None:
    """HiGHS keeps one global thread scheduler per process and fails a run (model status
    "Not Set") whose ``threads`` differs from the one it started with: restart it when the
    requested count changes."""
    want = 0 if threads is None else int(threads)
    if _SCHEDULER[0] is not None and _SCHEDULER[0] != want:
        h.resetGlobalScheduler(True)
    _SCHEDULER[0] = want


def _new_highs(verbose: bool, restarts: bool) -> Any:
    import highspy

    with _fd1_redirected(verbose):
        h = highspy.Highs()
    h.setOptionValue("output_flag", bool(verbose))
    h.setOptionValue("log_to_console", bool(verbose))
    # SolveOptions.restarts: off by default, chosen by benchmarks/bench_mip.py (after
    # reduced-cost fixing the models are small and re-presolving costs more than it saves).
    h.setOptionValue("mip_allow_restart", bool(restarts))
    return h


# --------------------------------------------------------------------------- model


def _allowed_mask(lib: BlockLibrary, pin: Sequence[int], forbid: Sequence[int]) -> np.ndarray:
    ok = np.ones(lib.num_replacements, dtype=bool)
    ok[list(forbid)] = False
    for r in pin:
        overl = (lib.start < lib.end[r]) & (lib.end > lib.start[r])
        overl[r] = False
        ok &= ~overl
    return ok


def _dead_columns(lib: BlockLibrary) -> np.ndarray:
    """Replacements on no path 0 -> L (start unreachable from 0, or L unreachable from end)."""
    L = lib.num_blocks
    order = np.argsort(lib.start, kind="stable")
    fwd = np.zeros(L + 1, dtype=bool)
    fwd[0] = True
    for r in order:
        if fwd[lib.start[r]]:
            fwd[lib.end[r]] = True
    bwd = np.zeros(L + 1, dtype=bool)
    bwd[L] = True
    for r in order[::-1]:
        if bwd[lib.end[r]]:
            bwd[lib.start[r]] = True
    return ~(fwd[lib.start] & bwd[lib.end])


def _potentials(lib: BlockLibrary, v: np.ndarray, dead: np.ndarray) -> np.ndarray:
    """Least sum of ``v`` over a path 0 -> i for every boundary i (0 where unreachable)."""
    p = np.full(lib.num_blocks + 1, np.inf)
    p[0] = 0.0
    for r in np.argsort(lib.start, kind="stable"):
        if not dead[r]:
            t = p[lib.start[r]] + v[r]
            if t < p[lib.end[r]]:
                p[lib.end[r]] = t
    p[~np.isfinite(p)] = 0.0
    return p


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
    ) -> None:
        import scipy.sparse as sp

        self.lib = lib = library
        self.opts = options or SolveOptions()
        self.objective = Objective.parse(objective)
        self.budgets = [b if isinstance(b, Budget) else Budget.parse(b) for b in budgets]
        self.counts = [c if isinstance(c, CountRule) else CountRule.parse(c) for c in counts]
        R, L = lib.num_replacements, lib.num_blocks
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

        # objective, in typical-coefficient units (see the module doc)
        c = np.zeros(R)
        self.obj_const = 0.0
        for k, w in self.objective.weights.items():
            c += w * lib.values(k)
            self.obj_const += w * lib.constant(k)
        self.c = c
        self.dead = _dead_columns(lib)
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
        for b in self.budgets:
            # Shift the row by shortest-path potentials (a combination of cover rows):
            # v'[r] = v[r] - (p[end] - p[start]) >= 0 and sum v' x = sum v x - p[L] on every
            # cover, so the row is equivalent but nonnegative and each coefficient is the
            # extra cost of taking r over the cheapest path: tighter bounds and cuts.
            v0 = lib.values(b.key)
            p = (_potentials(lib, v0, self.dead) if self.opts.shift
                 else np.zeros(lib.num_blocks + 1))
            v = np.where(self.dead, 0.0, v0 - (p[lib.end] - p[lib.start]))
            v[np.abs(v) <= 1e-12 * (float(np.max(np.abs(v0))) or 1.0)] = 0.0
            s = float(np.max(np.abs(v))) or 1.0
            nz = np.flatnonzero(v)
            rows.append(np.full(nz.size, nrow))
            cols.append(nz)
            vals.append(v[nz] / s)
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
        A = sp.coo_matrix((np.concatenate(vals), (np.concatenate(rows), np.concatenate(cols))),
                          shape=(nrow, R)).tocsc()
        A.sort_indices()
        lo = np.zeros(R)
        hi = np.ones(R)
        hi[self.forbid] = 0.0
        hi[self.dead] = 0.0
        lo[self.pin] = 1.0
        self.col_lo, self.col_hi = lo, hi
        self.row_lo = np.concatenate(row_lo)
        self.row_hi = np.concatenate(row_hi)
        self.num_rows = nrow

        self.A = A.tocsr()
        self.sense = -1 if self.objective.sense == "max" else 1
        self.c_min = self.sense * c / self.obj_scale  # minimized, scaled objective
        self.h = _new_highs(self.opts.verbose, self.opts.restarts)
        st = self.h.passModel(
            R, nrow, int(A.nnz), 1, self.sense, 0.0,
            c / self.obj_scale, lo, hi, self.row_lo, self.row_hi,
            A.indptr.astype(np.int32), A.indices.astype(np.int32), A.data.astype(np.float64),
            np.ones(R, dtype=np.int32))
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
        self._incumbent: np.ndarray | None = None
        self.explain_resolves = 64  # re-solves allowed when explaining infeasibility
        self._pending_start = False

    # ---------------------------------------------------------------- helpers
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
        allowed = ~self.dead & (self.col_hi > 0.5)
        v = np.where(allowed, self.c_min, np.inf)
        p = np.full(self.lib.num_blocks + 1, np.inf)
        p[0] = 0.0
        for r in np.argsort(self.lib.start, kind="stable"):
            t = p[self.lib.start[r]] + v[r]
            if t < p[self.lib.end[r]]:
                p[self.lib.end[r]] = t
        return float(p[-1]) if math.isfinite(p[-1]) else 0.0

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

    def add_diversity(self, chosen: np.ndarray, min_distance: int) -> None:
        """Require the next solutions to differ from ``chosen`` in >= ``min_distance`` parent
        blocks: ``sum_{r in chosen} len[r] x[r] <= L - min_distance``."""
        import scipy.sparse as sp

        idx = np.asarray(chosen, dtype=np.int32)
        coef = self.lib.lengths[idx].astype(np.float64)
        rhs = float(self.lib.num_blocks - min_distance)
        self.h.addRow(-np.inf, rhs, idx.size, idx, coef)
        self.diversity.append((idx.astype(np.int64), int(min_distance)))
        row = sp.csr_matrix((coef, (np.zeros(idx.size, dtype=np.int64), idx)),
                            shape=(1, self.lib.num_replacements))
        self.A = sp.vstack([self.A, row], format="csr")
        self.row_lo = np.append(self.row_lo, -np.inf)
        self.row_hi = np.append(self.row_hi, rhs)
        self.num_rows += 1

    def warm_start(self, chosen: np.ndarray) -> None:
        """Offer ``chosen`` as a starting incumbent (HiGHS ignores it if infeasible).

        Only with ``SolveOptions.warm_start``: the brute-force property test caught HiGHS
        1.16 returning a MIP start as "optimal" when it was not (the start's objective was
        mis-mapped through presolve), so starts are off by default.
        """
        if not self.opts.warm_start:
            return
        x = np.zeros(self.lib.num_replacements)
        x[np.asarray(chosen, dtype=np.int64)] = 1.0
        idx = np.arange(x.size, dtype=np.int32)
        self.h.clearSolver()
        self.h.setSolution(x.size, idx, x)
        self._pending_start = True

    # ---------------------------------------------------------------- solve
    def _run(self, time_limit: float | None) -> tuple[str, np.ndarray | None, float, int, str]:
        """One HiGHS run. Returns (status, x, dual bound in min-form scaled units, nodes,
        message); status is optimal / feasible / infeasible / error."""
        import highspy

        self._set("time_limit", float(time_limit) if time_limit is not None else math.inf)
        if not self._pending_start:
            # HiGHS 1.16 reuses the previous run's solution as a MIP start, and the property
            # test caught it mis-valuing such a start after presolve (returning it as
            # "optimal" when it was not): clear it unless a start was asked for.
            self.h.clearSolver()
        self._pending_start = False
        with _fd1_redirected(self.opts.verbose):
            run_status = self.h.run()
        ms = self.h.getModelStatus()
        info = self.h.getInfo()
        nodes = int(max(info.mip_node_count, 0))
        MS = highspy.HighsModelStatus
        has_sol = int(info.primal_solution_status) == 2  # kSolutionStatusFeasible
        bound = float(info.mip_dual_bound) * self.sense
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
        x = np.asarray(self.h.getSolution().col_value, dtype=np.float64)
        if not math.isfinite(bound):
            bound = -math.inf
        # HiGHS prunes nodes within mip_feasibility_tolerance of the incumbent, so children
        # better by less than that are unseen: the bound it proved is at most U - feastol.
        u = float(self.c_min @ np.round(x))
        return status, x, min(bound, u - self.feastol), nodes, ""

    def _lp_bound(self) -> tuple[str, float, np.ndarray]:
        """Solve the LP relaxation; return (status, a valid lower bound on the min-form scaled
        objective, reduced costs) from weak duality with the row duals (sign-clipped, so the
        bound holds for any duals HiGHS returns)."""
        self._set("solve_relaxation", True)
        try:
            self._set("time_limit", math.inf)
            self.h.clearSolver()
            with _fd1_redirected(self.opts.verbose):
                self.h.run()
            import highspy

            ms = self.h.getModelStatus()
            if ms in (highspy.HighsModelStatus.kInfeasible,
                      highspy.HighsModelStatus.kUnboundedOrInfeasible):
                return "infeasible", math.inf, np.zeros(0)
            if ms != highspy.HighsModelStatus.kOptimal:
                return "error", -math.inf, np.zeros(0)
            y0 = np.asarray(self.h.getSolution().row_dual, dtype=np.float64)
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

    def solve(self, explain: bool = True, incumbent: np.ndarray | None = None) -> Result:
        """Solve to the requested gap; verify; on infeasibility attach an explanation.

        ``incumbent``: replacement indices of a child known to meet the current rows (a
        sweep's previous point, as the bound loosens). It is checked here, never handed to
        HiGHS as a MIP start; with fixing it sets the fixing threshold at once (columns that
        cannot improve on it are fixed out) and is returned when nothing better exists.

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
        """
        o = self.opts
        t0 = time.perf_counter()
        left = (lambda: None) if o.time_limit is None else \
            (lambda: max(0.0, o.time_limit - (time.perf_counter() - t0)))
        nodes = 0
        lp_status, lb0, d = "skipped", -math.inf, np.zeros(0)
        if o.fixing:
            lp_status, lb0, d = self._lp_bound()
            if lp_status == "infeasible":
                return self._result("infeasible", None, -math.inf, nodes, t0, "", explain)
        est = max(abs(lb0) if math.isfinite(lb0) else 0.0, abs(self._unconstrained_min()))
        self._set_feastol(self._tolerance_for(est))
        if not o.fixing or lp_status != "optimal" or not math.isfinite(lb0):
            for attempt in range(2):
                st, x, bnd, n, msg = self._run(left())
                nodes += n
                if st != "optimal" or attempt:
                    break
                u = float(self.c_min @ np.round(x))
                if u - bnd <= self.allowed_gap(u) or self.feastol <= _FEASTOL_MIN:
                    break
                self._set_feastol(self._tolerance_for(abs(u)))
            return self._result(st, x, bnd, nodes, t0, msg, explain)
        free = (self.col_lo == 0) & (self.col_hi == 1)
        span = float(np.max(np.abs(d[free]))) if free.any() else 0.0
        g, a = self.rel_gap, self.abs_gap
        tau = max(4 * g * abs(lb0), 2 * a, 2 * g, 1e-3 * max(abs(lb0), 1e-3 * span))
        inc: np.ndarray | None = None
        u = math.inf
        if incumbent is not None:
            x0 = np.zeros(self.lib.num_replacements)
            x0[np.asarray(incumbent, dtype=np.int64)] = 1.0
            try:
                self.verify(x0)
            except SolverError:
                pass  # not feasible under the current rows: ignore it
            else:
                inc, u = x0, float(self.c_min @ x0)
                tau = max(tau, (u - self.allowed_gap(u) - lb0) * (1 + 1e-9) + 1e-12)
        status = "error"
        msg = ""
        bound = -math.inf
        retightened = False
        try:
            while True:
                fix0 = free & (d > tau)
                fix1 = free & (-d > tau)
                full = not (fix0.any() or fix1.any())
                lo, hi = self.col_lo.copy(), self.col_hi.copy()
                hi[fix0] = 0.0
                lo[fix1] = 1.0
                self._bounds(lo, hi)
                st, x, bnd, n, msg = self._run(left())
                nodes += n
                if _DEBUG:
                    print(f"tau={tau:.3g} free={int(free.sum() - fix0.sum() - fix1.sum())} "
                          f"st={st} n={n} feastol={self.feastol:.3g} "
                          f"t={time.perf_counter() - t0:.3f}", file=sys.stderr)
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
                        and self.feastol > _FEASTOL_MIN):
                    # HiGHS' optimum is within feastol, which the allowed gap at this
                    # incumbent cannot absorb: tighten and re-solve the same restriction
                    retightened = True
                    self._set_feastol(self._tolerance_for(abs(u)))
                    continue
                bound = max(bound, global_lb)
                if full or lb0 + tau >= u - self.allowed_gap(u):
                    status = "optimal"
                    break
                tau = (u - self.allowed_gap(u) - lb0) * (1 + 1e-9) + 1e-12
        finally:
            self._bounds(self.col_lo, self.col_hi)
        if status == "infeasible":
            return self._result("infeasible", None, -math.inf, nodes, t0, "", explain)
        if inc is None:
            return self._result("error", None, -math.inf, nodes, t0, msg, explain)
        return self._result(status, inc, bound, nodes, t0, "", explain)

    def _bounds(self, lo: np.ndarray, hi: np.ndarray) -> None:
        idx = np.arange(lo.size, dtype=np.int32)
        self.h.changeColsBounds(lo.size, idx, lo, hi)

    def _result(self, st: str, x: np.ndarray | None, bound_min: float, nodes: int, t0: float,
                msg: str, explain: bool) -> Result:
        secs = time.perf_counter() - t0
        if st == "infeasible":
            message = self.explain(self.explain_resolves) if explain else "infeasible"
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
            if st == "optimal" and u - bound_min > self.allowed_gap(u) * (1 + 1e-12):
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
        if x.size != lib.num_replacements:
            raise SolverError(f"HiGHS returned {x.size} values for {lib.num_replacements} columns")
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
        cs = set(chosen.tolist())
        for prev, d in self.diversity:
            same = int(sum(lib.lengths[r] for r in prev if r in cs))
            if lib.num_blocks - same < d:
                raise SolverError(f"solution differs from an earlier one in "
                                  f"{lib.num_blocks - same} < {d} blocks")
        return chosen

    def explain(self, max_resolves: int = 64) -> str:
        """Why the model is infeasible; see :func:`explain_infeasible`."""
        return explain_infeasible(self.lib, self.budgets, counts=self.counts, pin=self.pin,
                                  forbid=self.forbid, options=self.opts,
                                  max_resolves=max_resolves)


# --------------------------------------------------------------------------- public API


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
) -> Result:
    """Best child of ``library`` under every budget; see the module doc for the model.

    Returns a verified :class:`Result`; an infeasible model gives ``status="infeasible"``
    with the explanation in ``message`` (call ``.raise_if_infeasible()`` to raise).
    """
    m = MipModel(library, objective, budgets, counts=counts, pin=pin, forbid=forbid,
                 options=options)
    if warm_start is not None:
        m.warm_start(np.asarray(warm_start))
    return m.solve()


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
) -> list[Result]:
    """Up to ``n`` solutions, each the best child that differs from every earlier one in at
    least ``min_distance`` parent blocks (a block differs when the replacement covering it
    differs). Stops early when no further child exists; raises :class:`InfeasibleError`
    when not even the first one does."""
    if n < 1:
        raise InputError(f"pool size must be >= 1, got {n}")
    if not 1 <= min_distance <= library.num_blocks:
        raise InputError(f"min_distance must be in [1, {library.num_blocks}], got {min_distance}")
    m = MipModel(library, objective, budgets, counts=counts, pin=pin, forbid=forbid,
                 options=options)
    out: list[Result] = []
    for i in range(n):
        res = m.solve(explain=(i == 0))
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
) -> Sweep:
    """Re-solve with ``total(key) <= v`` for each ``v`` in ``values`` (replacing any upper
    bound on ``key`` in ``budgets``). Points are solved from the tightest value to the
    loosest on one HiGHS model (only the row bound changes); with
    ``SolveOptions.warm_start`` each starts from the previous child (which stays feasible
    as the bound loosens). Results come back in the order of ``values``. Infeasible points carry their
    explanation in ``message``."""
    bl = [b if isinstance(b, Budget) else Budget.parse(b) for b in budgets]
    library.kind(key)
    vals = [float(v) for v in values]
    if not vals:
        raise InputError("sweep needs at least one value")
    idx = next((i for i, b in enumerate(bl) if b.key == key and b.hi is not None), None)
    if idx is None:
        bl.append(Budget(key, None, max(vals)))
        idx = len(bl) - 1
    lo = bl[idx].lo
    m = MipModel(library, objective, bl, counts=counts, pin=pin, forbid=forbid, options=options)
    m.explain_resolves = 0  # infeasible points: shortest-path explanation only
    results: list[Result | None] = [None] * len(vals)
    prev: np.ndarray | None = None
    for i in sorted(range(len(vals)), key=lambda j: vals[j]):
        v = vals[i]
        if lo is not None and v < lo:
            raise InputError(f"sweep value {v:g} is below the lower bound {lo:g} on {key!r}")
        m.set_budget(idx, lo, v)
        if prev is not None:
            m.warm_start(prev)
        res = m.solve(incumbent=prev)
        results[i] = res
        if res.ok:
            prev = res.chosen
    done = [r for r in results if r is not None]
    pts = [(r.totals[key], r.objective) for r in done if r.ok and r.objective is not None]
    ok_idx = [i for i, r in enumerate(done) if r.ok and r.objective is not None]
    front = [ok_idx[j] for j in pareto_front(pts, m.objective.sense)]  # type: ignore[arg-type]
    return Sweep(key, vals, done, front)


def best_of(
    candidates: Mapping[str, tuple[BlockLibrary, Sequence[Budget | str]]],
    objective: str | Objective,
    *,
    counts: Sequence[CountRule | str] = (),
    options: SolveOptions | None = None,
) -> tuple[str | None, Result | None, dict[str, Result]]:
    """Solve each ``name -> (library, budgets)`` (e.g. one per batch size, as the Puzzle
    paper does for throughput targets) and keep the best objective among those with a
    solution. Returns ``(best name, best result, all results)``; ``(None, None, ...)``
    when none has a solution."""
    obj = Objective.parse(objective)
    results = {name: solve(lib, obj, b, counts=counts, options=options)
               for name, (lib, b) in candidates.items()}
    sgn = 1.0 if obj.sense == "min" else -1.0
    good = [(sgn * r.objective, name) for name, r in results.items()
            if r.ok and r.objective is not None]
    if not good:
        return None, None, results
    name = min(good)[1]
    return name, results[name], results


# --------------------------------------------------------------------------- infeasibility


def _extreme_path(lib: BlockLibrary, allowed: np.ndarray, v: np.ndarray, largest: bool
                  ) -> float | None:
    """Least (or largest) sum of ``v`` over a path 0 -> L using allowed edges, by networkx
    shortest paths over the replacement graph; None if no path."""
    import networkx as nx

    G = nx.DiGraph()
    G.add_nodes_from(range(lib.num_blocks + 1))
    w = -v if largest else v
    for r in np.flatnonzero(allowed):
        s, e, wr = int(lib.start[r]), int(lib.end[r]), float(w[r])
        if not G.has_edge(s, e) or G[s][e]["w"] > wr:
            G.add_edge(s, e, w=wr)
    try:
        d = nx.shortest_path_length(G, 0, lib.num_blocks, weight="w", method="bellman-ford")
    except nx.NetworkXNoPath:
        return None
    return -float(d) if largest else float(d)


def _fmt(v: float) -> str:
    return f"{v:.6g}"


def explain_infeasible(
    library: BlockLibrary,
    budgets: Sequence[Budget | str] = (),
    *,
    counts: Sequence[CountRule | str] = (),
    pin: Sequence[int] = (),
    forbid: Sequence[int] = (),
    options: SolveOptions | None = None,
    max_resolves: int = 64,
) -> str:
    """One-line explanation of why no child meets every constraint.

    1. Pins/forbids that leave no replacement path ``0 -> L`` are named.
    2. For each budget alone, the least (for ``<=``) / largest (for ``>=``) achievable
       total is found by shortest paths over the replacement graph (constants included);
       budgets that cannot be met even alone are named with that bound.
    3. Otherwise, a deletion filter over budgets and count rules (a few feasibility
       re-solves with HiGHS) finds a small set of constraints that conflict: removing any
       one of them makes the rest feasible.
    """
    lib = library
    bl = [b if isinstance(b, Budget) else Budget.parse(b) for b in budgets]
    cl = [c if isinstance(c, CountRule) else CountRule.parse(c) for c in counts]
    pin = [int(i) for i in pin]
    forbid = [int(i) for i in forbid]
    clash = sorted(set(pin) & set(forbid))
    if clash:
        return f"replacement {clash[0]} ({lib.labels[clash[0]]!r}) is both pinned and forbidden"
    for a in pin:
        for b in pin:
            if a < b and lib.start[a] < lib.end[b] and lib.end[a] > lib.start[b]:
                return (f"pinned replacements {a} ({lib.labels[a]!r}) and {b} "
                        f"({lib.labels[b]!r}) overlap")
    allowed = _allowed_mask(lib, pin, forbid)
    if _extreme_path(lib, allowed, np.zeros(lib.num_replacements), False) is None:
        reach = np.zeros(lib.num_blocks + 1, dtype=bool)
        reach[0] = True
        for r in np.argsort(lib.start, kind="stable"):
            if allowed[r] and reach[lib.start[r]]:
                reach[lib.end[r]] = True
        b = int(np.flatnonzero(~reach)[0])
        return (f"pins and forbids leave no replacement path over the parent's blocks: nothing "
                f"allowed covers {lib.block_name(b - 1)} after the blocks before it")
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
    if alone:
        return "infeasible: " + "; ".join(alone)

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
                     pin=pin, forbid=forbid, options=base)
        r = m.solve(explain=False)
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
    if len(core) == 1:
        return f"infeasible: {names} cannot be met (with the pins and forbids)"
    return (f"infeasible: each budget can be met alone, but not together; "
            f"these {len(core)} conflict: {names}")
