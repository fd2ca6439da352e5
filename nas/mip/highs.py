"""The HiGHS adapter: one ``highspy.Highs`` instance per model, its options, its callbacks,
the run (SIGINT / SIGTERM deferred, see :mod:`nas.mip.interrupt`) and the mapping of
HiGHS' model status to the statuses the solve steps read."""

from __future__ import annotations

import atexit
import contextlib
import math
import os
import signal
import sys
import threading
from collections.abc import Iterator
from typing import Any

import numpy as np

from hwprofiles.errors import InputError
from nas.mip import interrupt
from nas.mip.options import SolveOptions, SolverTuning

#: fault injection for tests: ``EVENT:N:SIG[:LABEL]`` makes the process send itself SIG
#: (``INT`` or ``TERM``) from inside the N-th (from 1, process-wide) HiGHS callback of kind
#: EVENT (``interrupt``, ``improving``), or just before the N-th HiGHS run (``run``, LPs
#: included); the count starts again whenever the value changes (a new LABEL) and after
#: the signal is sent
SIGNAL_ENV = "PUZZLE_NAS_MIP_SIGNAL_AT"
#: HiGHS' smallest accepted feasibility tolerance, and its default MIP one.
FEASTOL_MIN, FEASTOL_MAX = 1e-10, 1e-6

#: one HiGHS run: (status, HiGHS' column values or None, dual bound in min-form scaled
#: units, nodes, message); see :meth:`HighsModel.mip_run`
RawRun = tuple[str, "np.ndarray | None", float, int, str]


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


def _stop_scheduler(h: Any) -> None:
    """At exit, before the interpreter finalizes: stop HiGHS' global scheduler's worker
    threads (blocking). Left running into finalization, a native worker can touch Python
    there, and the process aborts ("PyThreadState_Get: ... GIL is released", exit -6) after
    its work is done: seen twice in full suites, in a search ended by SIGTERM."""
    with contextlib.suppress(BaseException):
        h.resetGlobalScheduler(True)


def _sync_scheduler(h: Any, threads: int | None) -> None:
    """HiGHS keeps one global thread scheduler per process and fails a run (model status
    "Not Set") whose ``threads`` differs from the one it started with: restart it when the
    requested count changes."""
    want = 0 if threads is None else int(threads)
    if _SCHEDULER[0] is None:
        atexit.register(_stop_scheduler, h)
    if _SCHEDULER[0] is not None and _SCHEDULER[0] != want:
        h.resetGlobalScheduler(True)
    _SCHEDULER[0] = want


def new_highs(o: SolveOptions, t: SolverTuning) -> Any:
    """A ``highspy.Highs`` with its banner kept off stdout, its log through a callback
    (``o.verbose``) and the HiGHS settings of ``t``."""
    import highspy

    with _fd1_redirected(o.verbose):
        h = highspy.Highs()
    # the log goes through a callback, never through fd 1: runs need no redirection (which
    # would be process-wide), so models can run in several threads at once (nas.mip.sweep)
    h.setOptionValue("output_flag", bool(o.verbose))
    h.setOptionValue("log_to_console", False)
    if o.verbose:
        h.cbLogging.subscribe(_log_to_stderr)
    # SolverTuning.restarts: off by default, chosen by benchmarks/bench_mip.py (after
    # reduced-cost fixing the models are small and re-presolving costs more than it saves).
    h.setOptionValue("mip_allow_restart", bool(t.restarts))
    # SolverTuning.node_cuts, cut_pool and sub_mips: see there
    h.setOptionValue("mip_allow_cut_separation_at_nodes", bool(t.node_cuts))
    h.setOptionValue("mip_heuristic_run_rins", bool(t.sub_mips))
    h.setOptionValue("mip_heuristic_run_rens", bool(t.sub_mips))
    if t.cut_pool is not None:
        h.setOptionValue("mip_pool_soft_limit", int(t.cut_pool[0]))
        h.setOptionValue("mip_pool_age_limit", int(t.cut_pool[1]))
    return h


class HighsModel:
    """One model's HiGHS instance (:attr:`h`) and the state its callbacks share with the
    runs: the stop rule's bounds, whether the rule fired, an exception a callback kept, and
    every improving solution HiGHS reported (:attr:`found`, sparse: the nonzero columns and
    their values)."""

    def __init__(self, options: SolveOptions, tuning: SolverTuning) -> None:
        self.tuning = tuning
        self.h = new_highs(options, tuning)
        self.found: list[tuple[np.ndarray, np.ndarray]] = []
        self.interrupted = False
        #: an exception raised in a HiGHS callback, raised again after the run
        self.cb_error: BaseException | None = None
        self.stop_above = self.stop_below = math.inf
        self._callback_on = False

    def set(self, name: str, value: Any) -> None:
        """Set a HiGHS option; :class:`InputError` when HiGHS rejects it."""
        st = self.h.setOptionValue(name, value)
        if int(st) < 0:
            raise InputError(f"HiGHS option {name}={value!r} was rejected")

    def set_feastol(self, t: float) -> float:
        """HiGHS' MIP feasibility tolerance (its absolute objective resolution, in HiGHS
        units) and the primal/dual LP tolerances, never looser than HiGHS' defaults;
        returns the tolerance set."""
        feastol = float(min(max(t, FEASTOL_MIN), FEASTOL_MAX))
        self.set("mip_feasibility_tolerance", feastol)
        lp = min(1e-7, feastol)
        self.set("primal_feasibility_tolerance", lp)
        self.set("dual_feasibility_tolerance", lp)
        return feastol

    def _on_mip_interrupt(self, e: Any) -> None:
        """HiGHS' MIP interrupt callback: stop the run once it holds a child below
        :attr:`stop_below` and its dual bound exceeds :attr:`stop_above` (see
        :meth:`mip_run`), with ``SolverTuning.stop_after_root`` not before its root node is
        done. HiGHS keeps the interrupt flag between runs, so it is written on every call.
        A recorded SIGINT / SIGTERM stops the run at once (:mod:`nas.mip.interrupt`); an
        exception never leaves the callback (HiGHS would swallow it): it stops the run and
        is raised after it."""
        try:
            _inject("interrupt")
            if interrupt.pending() or self.cb_error is not None:
                e.interrupt(True)
                return
            out = e.data_out
            stop = (out.mip_primal_bound < self.stop_below
                    and out.mip_dual_bound > self.stop_above
                    and (out.mip_node_count >= 1 or not self.tuning.stop_after_root))
            if stop:
                self.interrupted = True
            e.interrupt(bool(stop))
        except BaseException as exc:  # raised again by run
            self.cb_error = self.cb_error or exc
            with contextlib.suppress(BaseException):
                e.interrupt(True)

    def _on_improving_solution(self, e: Any) -> None:
        """HiGHS' improving-solution callback: keep the child in :attr:`found` (an
        exception is kept for :meth:`run`, never let out)."""
        try:
            _inject("improving")
            x = np.asarray(e.data_out.mip_solution, dtype=np.float64)
            nz = np.flatnonzero(np.abs(x) > 1e-9)
            self.found.append((nz, x[nz].copy()))
        except BaseException as exc:  # raised again by run
            self.cb_error = self.cb_error or exc

    def run(self) -> Any:
        """``Highs.run()`` with SIGINT / SIGTERM recorded, not raised inside HiGHS'
        callbacks: a signal stops the run, and :class:`~nas.mip.interrupt.Interrupted` is
        raised after it (and before it, when one came earlier), as is an exception a
        callback kept; see :mod:`nas.mip.interrupt`."""
        self.cb_error = None
        with interrupt.deferred():
            _inject("run")
            interrupt.check()
            status = self.h.run()
            err, self.cb_error = self.cb_error, None
            interrupt.check()
            if err is not None:
                raise err
        return status

    def mip_run(self, time_limit: float | None, cutoff: float | None, stop_above: float,
                feastol: float) -> RawRun:
        """One MIP run from a clean solver. Status ``stopped`` (the stop rule fired holding
        a child; bound ``stop_above``), ``cutoff`` (no child below ``cutoff``; bound
        ``cutoff - feastol``), ``infeasible``, ``error``, or ``optimal`` / ``feasible``
        with HiGHS' dual bound (-inf when not finite); the column values come with
        ``stopped``, ``optimal`` and ``feasible``."""
        self.set("time_limit", float(time_limit) if time_limit is not None else math.inf)
        self.set("objective_bound", math.inf if cutoff is None else float(cutoff))
        self.stop_above = float(stop_above)
        # a child found by this run is below the cutoff; HiGHS reports the cutoff itself as
        # its primal bound until then
        self.stop_below = math.inf if cutoff is None else \
            float(cutoff) - 1e-9 * max(1.0, abs(float(cutoff)))
        self.interrupted = False
        if not self._callback_on:
            self.h.cbMipInterrupt.subscribe(self._on_mip_interrupt)
            self.h.cbMipImprovingSolution.subscribe(self._on_improving_solution)
            self._callback_on = True
        # HiGHS 1.16 reuses the previous run's solution as a MIP start, and the property
        # test caught it mis-valuing such a start after presolve (returning it as "optimal"
        # when it was not): every run starts clean, a known child is only a cutoff.
        self.h.clearSolver()
        run_status = self.run()
        return self._mip_status(run_status, cutoff, stop_above, feastol)

    def _mip_status(self, run_status: Any, cutoff: float | None, stop_above: float,
                    feastol: float) -> RawRun:
        """The :data:`RawRun` of the run just made (see :meth:`mip_run`)."""
        import highspy

        ms = self.h.getModelStatus()
        info = self.h.getInfo()
        nodes = int(max(info.mip_node_count, 0))
        MS = highspy.HighsModelStatus
        has_sol = int(info.primal_solution_status) == 2  # kSolutionStatusFeasible
        bound = float(info.mip_dual_bound)
        if self.interrupted and has_sol:
            return "stopped", self._solution(), float(stop_above), nodes, ""
        if cutoff is not None and not has_sol and ms in (
                MS.kInfeasible, MS.kObjectiveBound, MS.kOptimal):
            return "cutoff", None, cutoff - feastol, nodes, ""
        if ms == MS.kOptimal:
            status = "optimal"
        elif ms in (MS.kInfeasible, MS.kUnboundedOrInfeasible):
            return "infeasible", None, math.inf, nodes, ""
        elif has_sol and ms in (MS.kTimeLimit, MS.kIterationLimit, MS.kSolutionLimit,
                                # kHighsInterrupt is in highspy's enum, not its stubs
                                MS.kInterrupt, MS.kHighsInterrupt,  # type: ignore[attr-defined]  # kHighsInterrupt is in highspy's enum, not its stubs (comment above)
                                MS.kObjectiveBound,
                                MS.kObjectiveTarget, MS.kMemoryLimit, MS.kUnknown):
            status = "feasible"
        else:
            msg = f"HiGHS stopped with model status {self.h.modelStatusToString(ms)}"
            if ms == MS.kTimeLimit:
                msg += " before finding any feasible child"
            return "error", None, -math.inf, nodes, f"{msg} ({run_status})"
        if not math.isfinite(bound):
            bound = -math.inf
        return status, self._solution(), bound, nodes, ""

    def _solution(self) -> np.ndarray:
        return np.asarray(self.h.getSolution().col_value, dtype=np.float64)

    def lp_run(self, time_limit: float | None
               ) -> tuple[str, np.ndarray | None, np.ndarray | None]:
        """Solve the LP relaxation: (``optimal``, row duals, row activities), or
        (``infeasible`` / ``error``, None, None)."""
        import highspy

        self.set("solve_relaxation", True)
        try:
            self.set("time_limit", math.inf if time_limit is None else float(time_limit))
            self.set("objective_bound", math.inf)
            self.h.clearSolver()
            self.run()
            ms = self.h.getModelStatus()
            if ms in (highspy.HighsModelStatus.kInfeasible,
                      highspy.HighsModelStatus.kUnboundedOrInfeasible):
                return "infeasible", None, None
            if ms != highspy.HighsModelStatus.kOptimal:
                return "error", None, None
            sol = self.h.getSolution()
            return ("optimal", np.asarray(sol.row_dual, dtype=np.float64),
                    np.asarray(sol.row_value, dtype=np.float64))
        finally:
            self.set("solve_relaxation", False)

    def configure(self, options: SolveOptions, rel_gap: float, abs_gap: float) -> float:
        """Set the gaps, the loosest feasibility tolerance, the seed and the threads of
        ``options`` (``rel_gap`` / ``abs_gap`` in HiGHS units); returns the tolerance."""
        self.set("mip_rel_gap", float(options.mip_rel_gap))
        self.set("mip_abs_gap", max(abs_gap, rel_gap))
        feastol = self.set_feastol(FEASTOL_MAX)
        self.set("random_seed", int(options.seed))
        if options.threads is not None:
            self.set("threads", int(options.threads))
        _sync_scheduler(self.h, options.threads)
        return feastol
