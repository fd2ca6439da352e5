"""The HiGHS MIP against brute-force enumeration on small random libraries."""

from __future__ import annotations

import contextlib
import math
import os
import threading
from unittest import mock

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from library_generators import synthetic_library

from hwprofiles.errors import InputError
from nas.library import BlockLibrary
from nas.mip import (
    Budget,
    CountRule,
    InfeasibleError,
    MipModel,
    Objective,
    Result,
    SolveOptions,
    SolverError,
    SolverTuning,
    diverse_pool,
    explain_infeasible,
    pareto_front,
    solve,
    sweep,
)
from nas.mip import steps as mip_steps

EXACT = SolveOptions(mip_rel_gap=0.0, mip_abs_gap=0.0)


# --------------------------------------------------------------------------- brute force


def all_covers(lib: BlockLibrary) -> list[tuple[int, ...]]:
    """Every exact cover (path 0 -> L) as a tuple of replacement indices."""
    by_start: dict[int, list[int]] = {}
    for r in range(lib.num_replacements):
        by_start.setdefault(int(lib.start[r]), []).append(r)
    out: list[tuple[int, ...]] = []

    def walk(node: int, acc: list[int]) -> None:
        if node == lib.num_blocks:
            out.append(tuple(acc))
            return
        for r in by_start.get(node, []):
            walk(int(lib.end[r]), acc + [r])

    walk(0, [])
    return out


def feasible(lib: BlockLibrary, cover: tuple[int, ...], budgets, counts=(), pin=(), forbid=()
             ) -> bool:
    t = lib.totals(cover)
    for b in budgets:
        if b.hi is not None and t[b.key] > b.hi + 1e-9:
            return False
        if b.lo is not None and t[b.key] < b.lo - 1e-9:
            return False
    for c in counts:
        tagged = [r for r in cover if c.tag in lib.tags[r]]
        n = sum(int(lib.lengths[r]) for r in tagged) if c.unit == "blocks" else len(tagged)
        if (c.min is not None and n < c.min) or (c.max is not None and n > c.max):
            return False
    if set(pin) - set(cover) or set(forbid) & set(cover):
        return False
    return True


def brute(lib, objective: Objective, budgets, **kw):
    """(best objective, covers) by enumeration; (None, []) when nothing is feasible."""
    sgn = 1 if objective.sense == "min" else -1
    best = None
    for cov in all_covers(lib):
        if not feasible(lib, cov, budgets, **kw):
            continue
        t = lib.totals(cov)
        v = sum(w * t[k] for k, w in objective.weights.items())
        if best is None or sgn * v < sgn * best:
            best = v
    return best


# --------------------------------------------------------------------------- strategies


@st.composite
def libraries(draw, max_blocks: int = 6, max_alts: int = 5):
    L = draw(st.integers(1, max_blocks))
    ncost = draw(st.integers(1, 3))
    starts, ends = [], []
    for b in range(L):
        for _ in range(draw(st.integers(1, max_alts))):
            starts.append(b)
            ends.append(b + 1)
    for _ in range(draw(st.integers(0, 3)) if L >= 2 else 0):
        s = draw(st.integers(0, L - 2))
        e = draw(st.integers(s + 2, min(L, s + 3)))
        starts.append(s)
        ends.append(e)
    R = len(starts)
    ints = st.integers(0, 20)
    costs = {f"c{i}": draw(st.lists(ints, min_size=R, max_size=R)) for i in range(ncost)}
    scores = {"q": draw(st.lists(st.integers(-5, 20), min_size=R, max_size=R))}
    tags = [["even"] if draw(st.booleans()) else ["odd"] for _ in range(R)]
    constants = {f"c{i}": float(draw(st.integers(0, 5))) for i in range(ncost)}
    return BlockLibrary(L, starts, ends, costs, scores, tags=tags, constants=constants)


@st.composite
def problems(draw):
    lib = draw(libraries())
    covers = all_covers(lib)
    keys = list(lib.costs)
    nb = draw(st.integers(1, min(3, len(keys))))
    budgets = []
    for k in draw(st.permutations(keys))[:nb]:
        tot = [lib.totals(c)[k] for c in covers]
        lo_t, hi_t = min(tot), max(tot)
        hi = draw(st.integers(int(lo_t) - 2, int(hi_t) + 1))
        lo = draw(st.one_of(st.none(), st.integers(min(int(lo_t) - 1, hi), hi)))
        budgets.append(Budget(k, None if lo is None else float(lo), float(hi)))
    if draw(st.booleans()):
        budgets.append(Budget("q", None, float(draw(st.integers(-10, 60)))))
    sense = draw(st.sampled_from(["min", "max"]))
    if draw(st.booleans()):
        obj = Objective({"q": 1.0}, sense)
    else:
        obj = Objective({"q": 1.0, keys[0]: draw(st.sampled_from([0.5, -1.0, 2.0]))}, sense)
    return lib, obj, budgets


# --------------------------------------------------------------------------- properties


def every_row_lazy(on: bool) -> contextlib.AbstractContextManager:
    """With ``on``, every budget and count row is left out of the HiGHS runs (LAZY_SLACK
    -inf): binding rows too, so children break them and the put-back loop must still give
    the exact answer."""
    return mock.patch.object(mip_steps, "LAZY_SLACK", -math.inf) if on else \
        contextlib.nullcontext()


@settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(problems(), st.booleans(), st.booleans())
def test_optimum_equals_brute_force(prob, fixing, all_lazy):
    lib, obj, budgets = prob
    best = brute(lib, obj, budgets)
    opts = SolveOptions(mip_rel_gap=0.0, mip_abs_gap=0.0)
    with every_row_lazy(all_lazy):
        res = solve(lib, obj, budgets, options=opts, tuning=SolverTuning(fixing=fixing))
    if best is None:
        assert res.status == "infeasible"
        assert res.message
        with pytest.raises(InfeasibleError):
            res.raise_if_infeasible()
    else:
        assert res.status == "optimal", res.message
        assert res.objective == pytest.approx(best, abs=1e-6)
        assert res.best_bound is not None and res.gap is not None
        assert res.gap <= 1e-6
        # the result is a real cover meeting every budget
        cov = tuple(int(r) for r in res.chosen)
        assert cov in set(all_covers(lib))
        assert feasible(lib, cov, budgets)
        assert res.totals == pytest.approx(lib.totals(cov))
        assert len(res.choices) == lib.num_blocks
        for b, r in enumerate(res.choices):
            assert lib.start[r] <= b < lib.end[r]


@settings(max_examples=100, deadline=None)
@given(libraries(), st.integers(0, 6), st.sampled_from(["replacements", "blocks"]),
       st.data())
def test_counts_pins_forbids_against_brute_force(lib, n, unit, data):
    R = lib.num_replacements
    lo, hi = data.draw(st.sampled_from([(n, None), (None, n), (n, n + 1)]))
    counts = [CountRule("even", min=lo, max=hi, unit=unit)]
    if not any("even" in t for t in lib.tags):
        counts = []
    pin = data.draw(st.lists(st.integers(0, R - 1), max_size=1))
    forbid = data.draw(st.lists(st.integers(0, R - 1), max_size=2))
    obj = Objective({"q": 1.0})
    best = brute(lib, obj, [], counts=counts, pin=pin, forbid=forbid)
    with every_row_lazy(data.draw(st.booleans())):
        res = solve(lib, obj, [], counts=counts, pin=pin, forbid=forbid, options=EXACT)
    if best is None:
        assert res.status == "infeasible" and res.message
    else:
        assert res.status == "optimal"
        assert res.objective == pytest.approx(best, abs=1e-6)
        assert set(pin) <= set(res.chosen.tolist())
        assert not set(forbid) & set(res.chosen.tolist())


@settings(max_examples=60, deadline=None)
@given(problems(), st.integers(1, 3), st.integers(2, 4))
def test_diverse_pool_is_the_greedy_sequence(prob, d, n):
    lib, obj, budgets = prob
    d = min(d, lib.num_blocks)
    sgn = 1 if obj.sense == "min" else -1
    covers = [c for c in all_covers(lib) if feasible(lib, c, budgets)]
    if not covers:
        with pytest.raises(InfeasibleError):
            diverse_pool(lib, obj, budgets, n=n, min_distance=d, options=EXACT)
        return
    pool = diverse_pool(lib, obj, budgets, n=n, min_distance=d, options=EXACT)

    def value(c):
        t = lib.totals(c)
        return sum(w * t[k] for k, w in obj.weights.items())

    def blocks(c):
        return [r for r in c for _ in range(int(lib.lengths[r]))]

    prev: list[tuple[int, ...]] = []
    for res in pool:
        cands = [c for c in covers
                 if all(sum(a != b for a, b in zip(blocks(c), blocks(p))) >= d for p in prev)]
        assert cands, "solver returned a solution brute force says cannot exist"
        assert res.objective == pytest.approx(min(sgn * value(c) for c in cands) * sgn, abs=1e-6)
        prev.append(tuple(int(r) for r in res.chosen))
    if len(pool) < n:  # the pool stopped: nothing else differs enough
        assert not [c for c in covers
                    if all(sum(a != b for a, b in zip(blocks(c), blocks(p))) >= d for p in prev)]


def test_found_children_meet_every_row_and_start_the_next_pool_solve():
    # the children HiGHS found on the way are kept; after a diversity row only those that
    # differ enough remain, best first, each meeting every row (the pool's next incumbent).
    # The seed is one on which HiGHS finds runner-ups on the way (which instances give them
    # depends on the search path: with the first fixing threshold at 3e-4 of the LP bound
    # most seeds' first run finds the answer at once)
    lib = synthetic_library(40, seed=11, pair_noops=True)
    base = lib.totals([int(np.flatnonzero(lib.start == b)[0]) for b in range(40)])
    budgets = [f"params<={0.7 * base['params']}",
               f"memory_bytes@chat-4k<={0.6 * base['memory_bytes@chat-4k']}"]
    m = MipModel(lib, "kl_div", budgets, options=SolveOptions(mip_rel_gap=1e-4, threads=1))
    first = m.solve()
    known = m.found_children()
    assert known and sorted(known[0].tolist()) == sorted(first.chosen.tolist())
    m.add_diversity(first.chosen, 3)
    later = m.found_children()
    assert later, "HiGHS found no runner-up to keep"
    values = [float(m.c[c].sum()) for c in later]
    assert values == sorted(values)
    for c in later:
        x = np.zeros(lib.num_replacements)
        x[c] = 1.0
        m.verify(x)  # every row, the diversity row included
        assert sum(a != b for a, b in zip(m.choices_of(c), first.choices)) >= 3
    second = m.solve(incumbent=later[0])
    alone = MipModel(lib, "kl_div", budgets, options=SolveOptions(mip_rel_gap=1e-4, threads=1))
    alone.add_diversity(first.chosen, 3)
    ref = alone.solve()
    assert second.status == ref.status == "optimal"
    assert second.objective == pytest.approx(ref.objective, rel=2e-4)


# --------------------------------------------------------------------------- examples


def tiny() -> BlockLibrary:
    # 3 blocks; per block: full (cost 10, q 0), half (5, 1), none (0, 5); plus a [0, 2) pair
    start = [0, 0, 0, 1, 1, 1, 2, 2, 2, 0]
    end = [1, 1, 1, 2, 2, 2, 3, 3, 3, 2]
    mem = [10, 5, 0] * 3 + [3]
    t = [1, 0.6, 0.0] * 3 + [0.2]
    q = [0, 1, 5] * 3 + [4]
    labels = ["full", "half", "none"] * 3 + ["pair"]
    tags = [["kept"], ["kept"], ["none"]] * 3 + [["none"]]
    return BlockLibrary(3, start, end, {"mem": mem, "time": t}, {"q": q}, labels=labels,
                        tags=tags, constants={"mem": 2.0})


def test_budget_parse_and_errors():
    assert Budget.parse("mem<=12") == Budget("mem", None, 12.0)
    assert Budget.parse("runtime_s@chat>=1e-3") == Budget("runtime_s@chat", 1e-3, None)
    assert Budget.parse("1<=mem<=2") == Budget("mem", 1.0, 2.0)
    assert Budget.parse("mem==3") == Budget("mem", 3.0, 3.0)
    with pytest.raises(InputError):
        Budget.parse("mem<12")
    with pytest.raises(InputError):
        Budget("mem", 3.0, 1.0)
    with pytest.raises(InputError, match="unknown key 'memory'"):
        solve(tiny(), "q", ["memory<=3"])
    with pytest.raises(InputError, match="unknown tag"):
        solve(tiny(), "q", counts=["attention>=1"])
    with pytest.raises(InputError, match="out of range"):
        solve(tiny(), "q", pin=[99])


def test_objective_parse():
    o = Objective.parse("max:q + 0.5*mem")
    assert o.sense == "max" and dict(o.weights) == {"q": 1.0, "mem": 0.5}
    assert Objective.parse("1e-3*time").weights == {"time": 1e-3}


def test_constants_in_totals_and_budgets():
    lib = tiny()
    res = solve(lib, "q", ["mem<=17"], options=EXACT)  # 15 of blocks + 2 constant
    assert res.status == "optimal"
    assert res.totals["mem"] <= 17 + 1e-9
    assert res.totals["mem"] == pytest.approx(lib.costs["mem"][res.chosen].sum() + 2.0)
    assert res.objective == pytest.approx(3.0)  # half x3 (mem 15); full+half+half is 20
    d = res.to_dict(lib)
    assert [c["label"] for c in d["choices"]] == ["half"] * 3


def test_dual_form_min_cost_under_quality_bound():
    res = solve(tiny(), "time", ["q<=2"], options=EXACT)
    assert res.status == "optimal"
    assert res.totals["q"] <= 2
    assert res.objective == pytest.approx(2.2)  # half, half, full; the pair (q 4) breaks q<=2
    lib = tiny()
    assert res.objective == pytest.approx(brute(lib, Objective({"time": 1.0}), [Budget("q", None, 2)]))


def test_infeasible_alone_names_budget_and_least_value():
    lib = tiny()
    res = solve(lib, "q", ["mem<=1.5"])
    assert res.status == "infeasible"
    assert "mem can go no lower than 2" in res.message and "<= 1.5" in res.message
    with pytest.raises(InfeasibleError) as ei:
        res.raise_if_infeasible()
    assert ei.value.exit_code == 3


def test_infeasible_together_finds_conflicting_pair():
    lib = tiny()
    # q <= 2 needs mem >= 2 + 10 + 5 + 5 = 22; mem <= 15 alone is fine; time is irrelevant
    budgets = ["mem<=15", "q<=2", "time<=10"]
    msg = explain_infeasible(lib, [Budget.parse(b) for b in budgets])
    assert "not together" in msg
    assert "mem<=15" in msg and "q<=2" in msg and "time<=10" not in msg
    assert solve(lib, "q", budgets).message == msg


def test_infeasible_by_pins():
    lib = tiny()
    res = solve(lib, "q", pin=[0, 9])
    assert res.status == "infeasible" and "overlap" in res.message
    res = solve(lib, "q", forbid=[0, 1, 2, 9])
    assert res.status == "infeasible" and "block" in res.message


def test_sweep_frontier():
    lib = synthetic_library(12, seed=3, pair_noops=True)
    base = lib.totals([int(np.flatnonzero(lib.start == b)[0]) for b in range(12)])
    key = "memory_bytes@chat-4k"
    values = list(np.linspace(0.3, 1.0, 6) * base[key])
    sw = sweep(lib, "kl_div", [f"params<={base['params'] * 0.9}"], key=key, values=values,
               options=EXACT)
    assert len(sw.results) == 6 and sw.values == values
    for v, r in zip(values, sw.results):
        one = solve(lib, "kl_div", [f"params<={base['params'] * 0.9}", f"{key}<={v}"],
                    options=EXACT)
        assert r.status == one.status
        if r.ok:
            assert r.objective == pytest.approx(one.objective, rel=1e-9, abs=1e-12)
            assert r.totals[key] <= v * (1 + 1e-9)
    objs = [sw.results[i].objective for i in sw.frontier]
    costs = [sw.results[i].totals[key] for i in sw.frontier]
    assert costs == sorted(costs) and objs == sorted(objs, reverse=True)


def sweep_case() -> tuple[BlockLibrary, list[str], str, list[float]]:
    lib = synthetic_library(12, seed=3, pair_noops=True)
    base = lib.totals([int(np.flatnonzero(lib.start == b)[0]) for b in range(12)])
    key = "memory_bytes@chat-4k"
    return lib, [f"params<={base['params'] * 0.9}"], key, list(np.linspace(0.3, 1.0, 6) * base[key])


def test_threaded_sweep_keeps_stdout_and_reports_in_the_calling_thread(capfd):
    # the worker threads' HiGHS runs redirect no file descriptor (HiGHS' log goes through a
    # callback), so what the caller prints meanwhile reaches stdout; progress is called in
    # the calling thread, once per point
    lib, budgets, key, values = sweep_case()
    where: list[bool] = []

    def progress(i: int, res: Result) -> None:
        where.append(threading.current_thread() is threading.main_thread())
        print(f"point {i} {res.status}", flush=True)

    sw = sweep(lib, "kl_div", budgets, key=key, values=values, workers=2, progress=progress,
               options=EXACT)
    out, _ = capfd.readouterr()
    assert sorted(int(line.split()[1]) for line in out.splitlines()) == list(range(6))
    assert len(where) == 6 and all(where)
    one = sweep(lib, "kl_div", budgets, key=key, values=values, options=EXACT)
    for a, b in zip(sw.results, one.results):
        assert a.status == b.status
        if b.ok:
            assert a.objective == pytest.approx(b.objective, rel=1e-9, abs=1e-12)


def test_a_solve_leaves_file_descriptor_1_alone(monkeypatch):
    # a run that pointed fd 1 at /dev/null would hide, for its duration, whatever every
    # other thread of the process prints (a threaded sweep's progress, the caller's log)
    m = MipModel(tiny(), "q", ["mem<=20"], options=SolveOptions(verbose=True))
    moved: list[int] = []
    real = os.dup2

    def dup2(fd: int, fd2: int, *a: object) -> int:
        moved.append(fd2)
        return real(fd, fd2, *a)

    monkeypatch.setattr(os, "dup2", dup2)
    assert m.solve().status == "optimal"
    m.set_budget(0, None, 10.0)
    m.solve()
    assert moved == []


@pytest.mark.parametrize("seed,frac", [(0, 0.5), (2, 0.6), (3, 0.6)])
def test_a_solve_paused_after_its_first_run_goes_on_on_another_model(seed, frac):
    # solve_steps yields the gap left between runs; the model sent back (another of the
    # same rows) runs the rest, and the answer is the one the solve gives in one go
    lib = synthetic_library(40, seed=seed, pair_noops=True)
    base = lib.totals([int(np.flatnonzero(lib.start == b)[0]) for b in range(40)])
    budgets = [f"params<={0.7 * base['params']}",
               f"memory_bytes@chat-4k<={frac * base['memory_bytes@chat-4k']}",
               f"runtime_s@chat-4k<={0.6 * base['runtime_s@chat-4k']}"]
    opts = SolveOptions(mip_rel_gap=0.0, threads=1)
    one = MipModel(lib, "kl_div", budgets, options=opts).solve()
    a, b = (MipModel(lib, "kl_div", budgets, options=opts) for _ in range(2))
    steps = a.solve_steps()
    gap = next(steps)
    assert gap > 0  # a first run that could not be the last left this much gap
    with pytest.raises(StopIteration) as done:
        steps.send(b)
        while True:
            next(steps)
    res = done.value.value
    assert res.status == one.status == "optimal" and len(b.runs) >= 2
    assert res.objective == pytest.approx(one.objective, rel=2e-9, abs=1e-12)  # both exact
    assert res.seconds > 0
    # the first model is free again: its bounds are the model's own
    assert np.array_equal(a._cur_lo, a.col_lo) and np.array_equal(a._cur_hi, a.col_hi)


def test_threaded_sweep_raises_what_a_worker_raised(monkeypatch):
    real = MipModel.solve_steps
    calls: list[int] = []

    def failing(self: MipModel, incumbent: np.ndarray | None = None):  # noqa: ANN202
        calls.append(1)
        if len(calls) == 3:
            raise SolverError("HiGHS failed on the third point")
        return real(self, incumbent)

    monkeypatch.setattr(MipModel, "solve_steps", failing)
    lib, budgets, key, values = sweep_case()
    with pytest.raises(SolverError, match="third point"):
        sweep(lib, "kl_div", budgets, key=key, values=values, workers=2, options=EXACT)


def test_sweep_workers_must_be_positive():
    with pytest.raises(InputError, match="workers"):
        sweep(tiny(), "q", [], key="mem", values=[10, 20], workers=0)


def test_pareto_front():
    pts = [(1, 5), (2, 4), (2, 6), (3, 4), (4, 1)]
    assert pareto_front(pts) == [0, 1, 4]
    assert pareto_front([(1, 1), (2, 3)], "max") == [0, 1]


def _super88() -> tuple[BlockLibrary, list[str]]:
    lib = synthetic_library(88, seed=0)
    base = lib.totals([int(np.flatnonzero(lib.start == b)[0]) for b in range(88)])
    return lib, [f"{k}<={0.6 * base[k]}" for k in lib.costs if k != "active_params"]


@pytest.mark.parametrize("fixing", [True, False])
def test_time_limit_before_any_child_is_an_error(fixing):
    # a microsecond is too short for the LP relaxation (it honours the limit) and for
    # HiGHS to find any child: the status says so, with no objective or bound
    lib, budgets = _super88()
    res = solve(lib, "kl_div", budgets,
                options=SolveOptions(time_limit=1e-6, mip_rel_gap=0),
                tuning=SolverTuning(fixing=fixing))
    assert res.status == "error"
    assert "time limit" in res.message.lower() and "before finding any feasible child" \
        in res.message
    assert (res.objective, res.best_bound, res.gap, res.chosen.size) == (None, None, None, 0)
    with pytest.raises(SolverError):
        res.raise_if_infeasible()


def test_lp_relaxation_honours_the_time_limit():
    lib, budgets = _super88()
    m = MipModel(lib, "kl_div", budgets)
    assert m.lp_bound(1e-6)[:2] == ("error", -math.inf)  # stopped: no bound claimed
    status, lb, d = m.lp_bound(None)
    assert status == "optimal" and math.isfinite(lb) and d.size == m.num_columns


@pytest.mark.parametrize("fixing", [True, False])
def test_time_limit_keeps_the_warm_start_as_feasible(fixing):
    # the "feasible" path: the time limit stops the search holding a child (here the
    # checked warm start); it is returned as feasible, never optimal, and any bound is
    # below it
    lib, budgets = _super88()
    # the smallest child (a shortest path) meets every budget; it is the only child known
    loose = solve(lib, "params", [])
    res = solve(lib, "kl_div", budgets, warm_start=loose.chosen,
                options=SolveOptions(time_limit=1e-6, mip_rel_gap=0),
                tuning=SolverTuning(fixing=fixing))
    assert res.status == "feasible"
    assert res.chosen.tolist() == loose.chosen.tolist()
    assert res.objective == pytest.approx(loose.totals["kl_div"], rel=1e-12)
    assert res.best_bound is None or res.best_bound <= res.objective
    assert res.gap is None or res.gap >= 0
    assert res.raise_if_infeasible() is res


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(problems(), st.data())
def test_warm_start_gives_the_same_optimum(prob, data):
    # any cover as warm start (meeting the budgets or not): the answer is brute force's;
    # a start that breaks a row is ignored, one that meets them never hides a better child
    lib, obj, budgets = prob
    start = data.draw(st.sampled_from(all_covers(lib)))
    # the start is a cutoff only, or also sets the first fixing threshold (the old default)
    opts = SolveOptions(mip_rel_gap=0.0)
    tune = SolverTuning(incumbent_threshold=data.draw(st.booleans()),
                        stop=data.draw(st.booleans()))
    best = brute(lib, obj, budgets)
    res = solve(lib, obj, budgets, options=opts, warm_start=list(start), tuning=tune)
    if best is None:
        assert res.status == "infeasible"
    else:
        assert res.status == "optimal", res.message
        assert res.objective == pytest.approx(best, abs=1e-6)
        assert feasible(lib, tuple(int(r) for r in res.chosen), budgets)


def test_warm_start_index_out_of_range_is_input_error():
    with pytest.raises(InputError, match="warm_start"):
        solve(tiny(), "q", ["mem<=20"], warm_start=[0, 3, 99])


def test_banner_and_log_stay_off_stdout(capfd):
    lib = tiny()
    solve(lib, "q", ["mem<=20"])
    solve(lib, "q", ["mem<=20"], options=SolveOptions(verbose=True))
    out, err = capfd.readouterr()
    assert "HiGHS" not in out
    assert out == ""
    assert "HiGHS" in err  # verbose log goes to stderr


def test_verify_rejects_broken_solutions():
    lib = tiny()
    m = MipModel(lib, "q", ["mem<=20"])
    x = np.zeros(lib.num_replacements)
    x[[0, 3]] = 1  # block 2 uncovered
    with pytest.raises(SolverError, match="covers"):
        m.verify(x)
    x = np.zeros(lib.num_replacements)
    x[[0, 3, 6]] = 1  # mem 32 > 20
    with pytest.raises(SolverError, match="budget"):
        m.verify(x)


def test_fixing_matches_plain_highs_on_synthetic():
    lib = synthetic_library(30, seed=5)
    base = lib.totals([int(np.flatnonzero(lib.start == b)[0]) for b in range(30)])
    budgets = [f"{k}<={0.65 * base[k]}" for k in lib.costs]
    a = solve(lib, "kl_div", budgets, options=SolveOptions(mip_rel_gap=1e-6),
              tuning=SolverTuning(fixing=True))
    b = solve(lib, "kl_div", budgets, options=SolveOptions(mip_rel_gap=1e-6),
              tuning=SolverTuning(fixing=False))
    assert b.gap is not None and b.gap <= 1e-6
    assert a.status == b.status == "optimal"
    assert a.objective == pytest.approx(b.objective, rel=2e-6)
    assert a.best_bound <= a.objective + 1e-12
    assert math.isfinite(a.gap) and a.gap <= 1e-6


def test_brute_force_helper_enumerates_every_cover():
    # the reference the property tests trust: tiny()'s covers written out by hand, one
    # replacement per block (3 x 3 x 3) plus the [0, 2) pair followed by any block-2 choice
    lib = tiny()
    by_hand = {(a, b, c) for a in (0, 1, 2) for b in (3, 4, 5) for c in (6, 7, 8)}
    by_hand |= {(9, c) for c in (6, 7, 8)}
    covers = all_covers(lib)
    assert len(covers) == len(set(covers)) == 30
    assert set(covers) == by_hand


def test_changing_thread_counts_between_solves():
    # HiGHS has one global scheduler per process; a run asking another thread count used to
    # fail with model status "Not Set"
    lib = tiny()
    for t in (None, 1, 2, None, 1):
        assert solve(lib, "q", ["mem<=20"], options=SolveOptions(threads=t)).status == "optimal"


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(problems(), st.lists(st.integers(-2, 60), min_size=1, max_size=5), st.booleans())
def test_sweep_points_equal_brute_force(prob, raw, incumbent_threshold):
    # the sweep reuses the loosest point's child and passes incumbents as cutoffs (or, the
    # old default, also as the first fixing threshold); every point must still be the
    # brute-force optimum of its own budget
    lib, obj, budgets = prob
    key = budgets[0].key
    others = budgets[1:]
    opts = SolveOptions(mip_rel_gap=0.0)
    sw = sweep(lib, obj, others, key=key, values=[float(v) for v in raw], options=opts,
               tuning=SolverTuning(incumbent_threshold=incumbent_threshold))
    for v, res in zip(raw, sw.results):
        best = brute(lib, obj, [*others, Budget(key, None, float(v))])
        if best is None:
            assert res.status == "infeasible"
        else:
            assert res.status == "optimal"
            assert res.objective == pytest.approx(best, abs=1e-6)


def test_cut_options_reach_highs_and_keep_the_answer():
    """``node_cuts``, ``cut_pool`` and ``sub_mips`` are HiGHS settings (the defaults chosen by
    bench_mip.py); every combination proves the same optimum, and a malformed pool is
    refused by name."""
    lib = synthetic_library(24, seed=5)
    tot = lib.totals([int(np.flatnonzero(lib.start == b)[0]) for b in range(lib.num_blocks)])
    budgets = [Budget("memory_bytes@long-1m", None, 0.5 * tot["memory_bytes@long-1m"]),
               Budget("runtime_s@rag-32k", None, 0.7 * tot["runtime_s@rag-32k"])]
    got = []
    for node_cuts, pool, subs in ((False, (100, 5), False), (True, None, True),
                                  (False, None, True), (True, (7, 0), False)):
        m = MipModel(lib, "kl_div", budgets,
                     tuning=SolverTuning(node_cuts=node_cuts, cut_pool=pool, sub_mips=subs))
        assert m.h.getOptionValue("mip_allow_cut_separation_at_nodes")[1] is node_cuts
        assert m.h.getOptionValue("mip_heuristic_run_rins")[1] is subs
        assert m.h.getOptionValue("mip_heuristic_run_rens")[1] is subs
        want = (10000, 30) if pool is None else pool
        assert (m.h.getOptionValue("mip_pool_soft_limit")[1],
                m.h.getOptionValue("mip_pool_age_limit")[1]) == want
        got.append(m.solve())
    ref = got[0]
    assert all(r.status == "optimal" for r in got)
    for r in got[1:]:
        assert abs(r.objective - ref.objective) <= 1e-4 * abs(ref.objective)
        assert r.best_bound <= ref.objective + 1e-12 and ref.best_bound <= r.objective + 1e-12
    for bad in ((0, 5), (100, 2000), (100,), 100, (1.5, 5)):
        with pytest.raises(InputError, match="cut_pool"):
            SolverTuning(cut_pool=bad)
