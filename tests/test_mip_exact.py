"""``optimal`` means optimal: nas.mip against an independent exact solve (scipy.milp on the
plain formulation, gap 0) on NVlabs-shaped libraries, whose KL coefficients span
~1e-4..500 (a catastrophic no-op next to differences of 1e-5 between good variants)."""

from __future__ import annotations

import math
from unittest import mock

import numpy as np
import pytest
import scipy.sparse as sp
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from library_generators import nvlabs_shaped_library, synthetic_library, typed_library
from scipy.optimize import Bounds, LinearConstraint, milp

from nas.library import BlockLibrary
from nas.mip import (
    GAP_FLOOR,
    Budget,
    CountRule,
    MipModel,
    SolveOptions,
    SolverTuning,
    diverse_pool,
    solve,
    sweep,
)
from nas.mip import model as mip_model
from nas.mip import steps as mip_steps

OBJ = "metrics.kl_div"


def parent_totals(lib: BlockLibrary) -> dict[str, float]:
    return lib.totals([int(np.flatnonzero(lib.start == b)[0]) for b in range(lib.num_blocks)])


def exact(lib: BlockLibrary, budgets: list[Budget], obj: str = OBJ,
          diversity: list[tuple[np.ndarray, int]] = ()) -> tuple[float, np.ndarray] | None:
    """scipy.milp (its own HiGHS build, default tolerances) on the plain model (objective
    ``obj`` as given, no shift, no fixing) with mip_rel_gap 0: (objective, chosen) or None.
    ``diversity``: (an earlier child's replacements, d): differ from it in >= d blocks."""
    R, L = lib.num_replacements, lib.num_blocks
    lens = lib.lengths  # a replacement covers every block of its span
    blocks = np.concatenate([np.arange(a, b) for a, b in zip(lib.start, lib.end)])
    cover = sp.csr_matrix((np.ones(blocks.size), (blocks, np.repeat(np.arange(R), lens))),
                          shape=(L, R))
    rows, lo, hi = [cover], [np.ones(L)], [np.ones(L)]
    for b in budgets:  # rows divided by their largest coefficient (see mip_baselines)
        v, c = lib.values(b.key), lib.constant(b.key)
        s = float(np.abs(v).max()) or 1.0
        rows.append(sp.csr_matrix(v[None, :] / s))
        lo.append(np.array([-np.inf if b.lo is None else (b.lo - c) / s]))
        hi.append(np.array([np.inf if b.hi is None else (b.hi - c) / s]))
    for prev, d in diversity:  # blocks covered by the earlier child's replacements
        v = np.zeros(R)
        v[np.asarray(prev, dtype=np.int64)] = lens[np.asarray(prev, dtype=np.int64)]
        rows.append(sp.csr_matrix(v[None, :]))
        lo.append(np.array([-np.inf]))
        hi.append(np.array([float(L - d)]))
    c = lib.values(obj)
    r = milp(c, constraints=LinearConstraint(sp.vstack(rows), np.concatenate(lo),
                                             np.concatenate(hi)),
             integrality=np.ones(R), bounds=Bounds(0, 1), options={"mip_rel_gap": 0.0})
    if r.x is None:
        return None
    chosen = np.flatnonzero(r.x > 0.5)
    return float(c[chosen].sum()) + lib.constant(obj), chosen


def check(lib: BlockLibrary, budgets: list[Budget], gap: float, fixing: bool = True) -> None:
    ref = exact(lib, budgets)
    res = solve(lib, OBJ, budgets, options=SolveOptions(mip_rel_gap=gap),
                tuning=SolverTuning(fixing=fixing))
    if ref is None:
        assert res.status == "infeasible"
        return
    best, chosen = ref
    tot = lib.totals(chosen)  # the independent solution is feasible for us too
    for b in budgets:
        assert b.hi is None or tot[b.key] <= b.hi * (1 + 1e-12)
    assert res.status == "optimal", res
    # the claimed bound is never above a known feasible child
    assert res.best_bound is not None and res.best_bound <= best + 1e-12 * abs(best)
    allowed = max(gap, GAP_FLOOR) * max(abs(best), 1.0)
    assert res.objective <= best + allowed, (res.objective, best)
    assert res.objective >= best - 1e-9 * max(abs(best), 1.0)  # no better than exact
    assert res.gap is not None and res.gap <= max(gap, GAP_FLOOR)


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 10_000), layers=st.integers(6, 40),
       mem=st.floats(0.3, 0.95), run=st.one_of(st.none(), st.floats(0.3, 0.95)),
       fixing=st.booleans())
def test_gap_zero_is_the_exact_optimum(seed, layers, mem, run, fixing):
    lib = nvlabs_shaped_library(layers, seed=seed)
    tot = parent_totals(lib)
    budgets = [Budget("stats.memory_mib", None, mem * tot["stats.memory_mib"])]
    if run is not None:
        budgets.append(Budget("stats.runtime_ms", None, run * tot["stats.runtime_ms"]))
    check(lib, budgets, 0.0, fixing)


@pytest.mark.parametrize("gap", [0.0, 1e-4])
def test_nvlabs_scale_80_layers(gap):
    # the notebook's shape: 80 layers x 16 variants, memory and runtime budgets
    lib = nvlabs_shaped_library(80, seed=1)
    tot = parent_totals(lib)
    check(lib, [Budget("stats.memory_mib", None, 0.7 * tot["stats.memory_mib"]),
                Budget("stats.runtime_ms", None, 0.6 * tot["stats.runtime_ms"])], gap)


def test_regression_outlier_scaled_under_tolerance():
    # before the fix (objective divided by its largest coefficient, a KL-400 no-op) this
    # instance came back "optimal" at 0.68810 where the optimum is 0.68256
    lib = nvlabs_shaped_library(25, seed=3)
    budget = Budget("stats.memory_mib", None, 0.7 * parent_totals(lib)["stats.memory_mib"])
    check(lib, [budget], 0.0)
    check(lib, [budget], 0.0, fixing=False)


@pytest.mark.parametrize("workers", [1, 2, 3])
def test_sweep_points_are_exact(workers):
    # with 2 and 3 worker threads too: each point is still its own exact optimum
    lib = nvlabs_shaped_library(30, seed=7)
    tot = parent_totals(lib)["stats.memory_mib"]
    values = list(np.linspace(0.35, 0.95, 5) * tot)
    seen: list[int] = []
    sw = sweep(lib, OBJ, [], key="stats.memory_mib", values=values,
               options=SolveOptions(mip_rel_gap=0.0), workers=workers,
               progress=lambda i, r: seen.append(i))
    assert sorted(seen) == list(range(5))
    assert sum(r.seconds > 0 for r in sw.results) >= 3  # points really solved, not reused
    for v, r in zip(values, sw.results):
        ref = exact(lib, [Budget("stats.memory_mib", None, v)])
        assert ref is not None and r.status == "optimal"
        assert abs(r.objective - ref[0]) <= GAP_FLOOR * max(abs(ref[0]), 1.0)
        assert r.totals["stats.memory_mib"] <= v * (1 + 1e-12)


def test_time_limited_result_is_not_called_optimal():
    lib = nvlabs_shaped_library(320, seed=3)
    tot = parent_totals(lib)
    res = solve(lib, OBJ, [Budget("stats.memory_mib", None, 0.5 * tot["stats.memory_mib"])],
                options=SolveOptions(mip_rel_gap=0.0, time_limit=0.05),
                tuning=SolverTuning(fixing=False))
    if res.status == "optimal":  # only with a bound that proves it
        assert res.gap is not None and res.gap <= GAP_FLOOR
    else:
        assert res.status in ("feasible", "error")
        if res.status == "feasible":
            assert res.gap is not None and res.best_bound <= res.objective


# (seed, gap) pairs whose first restricted run is stopped (with the first fixing threshold at
# 3e-4 of the LP bound, seed 1 at gap 1e-4 proves its first run's child instead)
@pytest.mark.parametrize(("seed", "gap"), [(1, 0.0), (2, 1e-4), (2, 0.0)])
def test_stopped_restricted_runs_keep_the_exact_optimum(seed, gap):
    # Super-like library, memory at 40 %: the first restricted run's bound soon shows it
    # cannot be the last, so it is stopped holding a child and the fixing threshold raised;
    # the answer is still scipy.milp's optimum and the bound reported still holds
    lib = synthetic_library(24, seed=seed)
    full = {"moe width=2688 top_k=22", "mamba state=128 heads=128", "attention kv=2 window=full"}
    tot = lib.totals([i for i, lab in enumerate(lib.labels) if lab in full])
    budgets = [Budget("memory_bytes@long-1m", None, 0.4 * tot["memory_bytes@long-1m"]),
               Budget("runtime_s@rag-32k", None, 0.6 * tot["runtime_s@rag-32k"])]
    # HiGHS' runs, not the exact path DP that solves these small restricted models
    m = MipModel(lib, "kl_div", budgets, options=SolveOptions(mip_rel_gap=gap),
                 tuning=SolverTuning(dp=False))
    res = m.solve()
    assert "stopped" in m.runs and m.runs[-1] != "stopped", m.runs
    ref = exact(lib, budgets, "kl_div")
    assert ref is not None and res.status == "optimal"
    best = ref[0]
    assert res.best_bound is not None and res.best_bound <= best + 1e-12 * abs(best)
    assert best - 1e-9 * abs(best) <= res.objective <= best + max(gap, GAP_FLOOR) * abs(best)
    # with the rule off every run ends on its own; same optimum within the gap
    off = MipModel(lib, "kl_div", budgets,
                   options=SolveOptions(mip_rel_gap=gap),
                   tuning=SolverTuning(stop=False, dp=False))
    res_off = off.solve()
    assert "stopped" not in off.runs and res_off.status == "optimal"
    assert abs(res_off.objective - res.objective) <= max(gap, GAP_FLOOR) * abs(best)
    # stopping at the root too (stop_after_root off): same optimum within the gap
    root = solve(lib, "kl_div", budgets,
                 options=SolveOptions(mip_rel_gap=gap),
                 tuning=SolverTuning(stop_after_root=False, dp=False))
    assert root.status == "optimal"
    assert abs(root.objective - res.objective) <= max(gap, GAP_FLOOR) * abs(best)


@pytest.mark.parametrize("gap", [1e-4, 0.0])
def test_lazy_rows_give_the_exact_optimum(gap):
    # Super-like library, 7 budget rows at 60 % of the parent and memory@long-1m at 42 %:
    # the LP leaves some rows far from binding and they stay out of the runs; the answer is
    # scipy.milp's, the same as with every row in (lazy_rows off), and meets every budget
    lib = synthetic_library(24, seed=0)
    full = {"moe width=2688 top_k=22", "mamba state=128 heads=128", "attention kv=2 window=full"}
    tot = lib.totals([i for i, lab in enumerate(lib.labels) if lab in full])
    keys = [k for k in lib.costs if k.startswith(("memory_bytes@", "runtime_s@"))] + ["params"]
    budgets = [Budget(k, None, (0.42 if k == "memory_bytes@long-1m" else 0.6) * tot[k])
               for k in keys]
    m = MipModel(lib, "kl_div", budgets, options=SolveOptions(mip_rel_gap=gap))
    res = m.solve()
    assert m.lazy_candidates().size >= 1
    ref = exact(lib, budgets, "kl_div")
    assert ref is not None and res.status == "optimal"
    best = ref[0]
    assert best - 1e-9 * abs(best) <= res.objective <= best + max(gap, GAP_FLOOR) * abs(best)
    assert all(res.totals[b.key] <= b.hi * (1 + 1e-12) for b in budgets)
    off = solve(lib, "kl_div", budgets, options=SolveOptions(mip_rel_gap=gap),
                tuning=SolverTuning(lazy_rows=False))
    assert abs(off.objective - res.objective) <= max(gap, GAP_FLOOR) * abs(best)


@pytest.mark.parametrize("seed", [1, 2])
def test_broken_lazy_rows_are_put_back(seed):
    # every row left out (binding ones too): the first child breaks the memory budget,
    # which is put back and the run repeated; the answer is still scipy.milp's optimum
    lib = synthetic_library(24, seed=seed)
    full = {"moe width=2688 top_k=22", "mamba state=128 heads=128", "attention kv=2 window=full"}
    tot = lib.totals([i for i, lab in enumerate(lib.labels) if lab in full])
    budgets = [Budget("memory_bytes@long-1m", None, 0.4 * tot["memory_bytes@long-1m"]),
               Budget("runtime_s@rag-32k", None, 0.6 * tot["runtime_s@rag-32k"])]
    m = MipModel(lib, "kl_div", budgets, options=SolveOptions(mip_rel_gap=0.0))
    with mock.patch.object(mip_steps, "LAZY_SLACK", -math.inf):
        res = m.solve()
    assert "lazy row broken" in m.runs, m.runs
    ref = exact(lib, budgets, "kl_div")
    assert ref is not None and res.status == "optimal"
    assert abs(res.objective - ref[0]) <= GAP_FLOOR * abs(ref[0])
    assert all(res.totals[b.key] <= b.hi * (1 + 1e-12) for b in budgets)
    # the rows are back in the model after the solve
    assert np.array_equal(m.h.getLp().row_upper_, m.row_hi)


@pytest.mark.parametrize("gap,abs_gap", [(1e-4, 0.0), (0.0, 0.0), (1e-3, 50.0)])
@pytest.mark.parametrize("t", [-250.0, -0.5, 0.0, 1e-4, 0.9, 83.6, 1e4])
def test_stop_threshold_is_the_least_bound_that_rules_a_run_out(t, gap, abs_gap):
    # a restricted run is stopped once its dual bound D passes stop_threshold(t): then
    # every child it can still find has U - allowed(U) > t, so it cannot be the last run;
    # just below the threshold that is no longer guaranteed
    lib = synthetic_library(8, seed=0)
    m = MipModel(lib, "kl_div", [], options=SolveOptions(mip_rel_gap=gap, mip_abs_gap=abs_gap))
    d = m.stop_threshold(t)
    for u in (d, d + 1e-9 * max(1.0, abs(d)), d + 1.0, d + 1e3):
        assert u - m.allowed_gap(u) > t
    below = d - 1e-6 * max(1.0, abs(d))
    assert below - m.allowed_gap(below) <= t


# ---------------------------------------------------------------- interchangeable classes
def typed_totals(lib: BlockLibrary) -> dict[str, float]:
    return lib.totals([int(np.flatnonzero(lib.start == b)[0]) for b in range(lib.num_blocks)])


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 10_000), blocks=st.integers(4, 30), groups=st.integers(1, 4),
       mem=st.floats(0.2, 0.95), run=st.one_of(st.none(), st.floats(0.2, 0.95)),
       spans=st.booleans())
def test_classes_keep_the_exact_optimum(seed, blocks, groups, mem, run, spans):
    """Counts over classes of alike layers (continuous members) prove the same optimum as
    scipy.milp on the plain binary model, at gap 0."""
    lib = typed_library(blocks, seed=seed, groups=groups, spans=spans)
    tot = typed_totals(lib)
    budgets = [Budget("mem", None, mem * tot["mem"])]
    if run is not None:
        budgets.append(Budget("time", None, run * tot["time"]))
    m = MipModel(lib, "kl", budgets, options=SolveOptions(mip_rel_gap=0.0))
    assert m.classes and m.num_columns == lib.num_replacements + len(m.classes)
    ref = exact(lib, budgets, "kl")
    res = m.solve()
    if ref is None:
        assert res.status == "infeasible"
        return
    assert res.status == "optimal", res
    assert abs(res.objective - ref[0]) <= GAP_FLOOR * max(abs(ref[0]), 1.0)
    assert res.best_bound <= ref[0] + 1e-12 * max(abs(ref[0]), 1.0)
    assert res.chosen.size and np.all(np.isin(res.chosen, np.arange(lib.num_replacements)))


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_classes_with_pins_forbids_counts_and_floors(seed):
    """Pins, forbids, count rules and lower budget bounds with classes: the same optimum as
    the plain binary model (aggregate off), both at gap 0."""
    lib = typed_library(20, seed=seed, groups=2)
    tot = typed_totals(lib)
    rng = np.random.default_rng(seed)
    kept = np.flatnonzero([lab.endswith("v0") for lab in lib.labels])
    pin = [int(rng.choice(kept))]
    forbid = [int(r) for r in rng.choice(np.flatnonzero([lab.endswith("v1") for lab in
                                                         lib.labels]), 4, replace=False)]
    budgets = [Budget("mem", None, 0.6 * tot["mem"]), Budget("params", 0.4 * tot["params"],
                                                           None)]
    counts = [CountRule("no_op", None, 6), CountRule("kept", 9, None, "blocks")]
    got = [solve(lib, "kl", budgets, counts=counts, pin=pin, forbid=forbid,
                 options=SolveOptions(mip_rel_gap=0.0), tuning=SolverTuning(aggregate=agg))
           for agg in (True, False)]
    assert got[0].status == got[1].status == "optimal"
    assert abs(got[0].objective - got[1].objective) <= GAP_FLOOR * max(abs(got[1].objective), 1)
    assert pin[0] in got[0].chosen and not set(forbid) & set(got[0].chosen.tolist())
    assert got[0].totals["params"] >= 0.4 * tot["params"] * (1 - 1e-12)


def test_pool_and_sweep_with_classes():
    """A pool's diversity rows make the members integers again; a sweep keeps its classes:
    both give the plain model's optima."""
    lib = typed_library(24, seed=4, groups=2)
    tot = typed_totals(lib)
    budgets = [Budget("mem", None, 0.55 * tot["mem"])]
    pools = [diverse_pool(lib, "kl", budgets, n=5, min_distance=2,
                          options=SolveOptions(mip_rel_gap=0.0),
                          tuning=SolverTuning(aggregate=agg))
             for agg in (True, False)]
    assert len(pools[0]) == len(pools[1]) == 5
    assert abs(pools[0][0].objective - pools[1][0].objective) <= 1e-9 * abs(pools[1][0].objective)
    for k, r in enumerate(pools[0]):  # each differs from every earlier one in >= 2 blocks
        for e in pools[0][:k]:
            assert sum(a != b for a, b in zip(r.choices, e.choices)) >= 2
    values = list(np.linspace(0.3, 0.9, 5) * tot["time"])
    sws = [sweep(lib, "kl", budgets, key="time", values=values,
                 options=SolveOptions(mip_rel_gap=0.0), tuning=SolverTuning(aggregate=agg))
           for agg in (True, False)]
    for a, b in zip(*(s.results for s in sws)):
        assert a.status == b.status
        if b.ok:
            assert abs(a.objective - b.objective) <= GAP_FLOOR * max(abs(b.objective), 1.0)


def test_fractional_members_are_made_whole():
    """A heuristic answer with fractional members (two optimal layouts of the same counts
    averaged) comes back 0/1, with the same counts, meeting every row, no worse."""
    lib = typed_library(16, seed=2, groups=1, spans=False)
    tot = typed_totals(lib)
    m = MipModel(lib, "kl", [Budget("mem", None, 0.6 * tot["mem"])],
                 options=SolveOptions(mip_rel_gap=0.0))
    res = m.solve()
    R = lib.num_replacements
    # swap the choices of two blocks of one kind that took members of different classes
    cls = np.full(R, -1)
    for k, mem in enumerate(m.classes):
        cls[mem] = k
    ch = np.asarray(res.choices)
    pair = next((a, b) for a in range(lib.num_blocks) for b in range(a + 2, lib.num_blocks, 2)
                if cls[ch[a]] >= 0 and cls[ch[b]] >= 0 and cls[ch[a]] != cls[ch[b]])
    a, b = pair
    x1 = np.zeros(R)
    x1[res.chosen] = 1.0
    x2 = x1.copy()
    twin = {(int(lib.start[r]), int(cls[r])): r for r in range(R) if cls[r] >= 0}
    x2[[ch[a], ch[b]]] = 0.0
    x2[[twin[(a, int(cls[ch[b]]))], twin[(b, int(cls[ch[a]]))]]] = 1.0
    frac = m.with_counts(0.5 * (x1 + x2))
    assert np.any((frac[:R] > 0.1) & (frac[:R] < 0.9))
    whole = m.integral(frac)
    assert np.all((whole[:R] == 0) | (whole[:R] == 1))
    assert np.array_equal(whole[R:], frac[R:])  # same counts
    m.verify(whole)
    assert m.c_min @ whole <= m.c_min @ frac + 1e-9


@pytest.mark.parametrize(("lattice", "dp"), [(True, True), (False, True), (True, False)])
@pytest.mark.parametrize("seed", [0, 1])
def test_pool_at_nvlabs_diversity_is_the_exact_greedy_sequence(seed, lattice, dp):
    """A pool of 6 at NVlabs' diversity (a quarter of the layers: 20 of 80 in its notebook)
    on an NVlabs-shaped library with NVlabs' measured sizes (its memory row has a lattice
    form: SolverTuning.lattice on and off) and a binding memory budget, the first child by
    the exact path DP or by HiGHS: each child is scipy.milp's optimum given the children
    before it (gap 0), and differs enough from every one of them."""
    lib = nvlabs_shaped_library(24, seed=seed, measured_sizes=True)
    tot = parent_totals(lib)
    budgets = [Budget("stats.memory_mib", None, 0.72 * tot["stats.memory_mib"]),
               Budget("stats.runtime_ms", None, 0.8 * tot["stats.runtime_ms"])]
    opts = SolveOptions(mip_rel_gap=0.0)
    tune = SolverTuning(lattice=lattice, dp=dp)
    assert bool(MipModel(lib, OBJ, budgets, options=opts, tuning=tune).lattice_row) == lattice
    d = 6
    pool = diverse_pool(lib, OBJ, budgets, n=6, min_distance=d, options=opts, tuning=tune)
    assert len(pool) == 6
    for k, res in enumerate(pool):
        ref = exact(lib, budgets, diversity=[(r.chosen, d) for r in pool[:k]])
        assert ref is not None
        best = ref[0]
        assert res.status == "optimal"
        assert res.objective <= best + GAP_FLOOR * max(abs(best), 1.0), (k, res.objective, best)
        assert res.objective >= best - 1e-9 * max(abs(best), 1.0), (k, res.objective, best)
        for e in pool[:k]:
            assert sum(a != b for a, b in zip(res.choices, e.choices)) >= d


def test_lattice_split_is_exact_and_only_where_the_step_is_coarse():
    """NVlabs' measured sizes: every coefficient is q * (d * w + residue) exactly, a 12 MiB
    step with 5 residues; sizes with measurement noise (no common binary grid) and a
    budget whose step is a sliver of its coefficients get no lattice form."""
    v = nvlabs_shaped_library(24, seed=0, measured_sizes=True).values("stats.memory_mib")
    split = mip_model.lattice_split(v)
    assert split is not None
    q, d, w, res, residues = split
    assert q * d == 12.0 and len(residues) == 5
    back = q * (d * w + np.where(res >= 0, np.asarray([0, *residues])[res + 1], 0))
    assert np.array_equal(back, v)
    assert mip_model.lattice_split(nvlabs_shaped_library(24, seed=0).values(
        "stats.memory_mib")) is None
    # sizes in bytes, multiples of 4 and nothing coarser: a step of 4 in 8e6 is not worth rows
    fine = np.array([0.0, 4.0, 400012.0, 1000000.0, 2999996.0, 5000008.0, 8000000.0])
    assert mip_model.lattice_split(fine) is None
    split = mip_model.lattice_split(np.array([0.0, 1, 2, 3, 1, 2, 3]) * 1e6 + 4.0)
    assert split is not None and split[0] * split[1] == 1e6


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 10_000), blocks=st.integers(3, 12), mem=st.floats(0.2, 0.95),
       second=st.sampled_from(["", "run", "floor"]), spans=st.booleans())
def test_path_dp_is_the_exact_optimum(seed, blocks, mem, second, spans):
    """nas.mip.dp.path_optimum (the exact DP that solves small restricted models, with
    two-block spans, one or two budgets, a lower bound written as a negated row) finds
    scipy.milp's optimum on the plain model; with the optimum as the cutoff it finds
    nothing below it, and a cutoff just above gives the optimum back; solve() with the DP
    on and off agree."""
    from nas.mip.dp import Row, path_optimum

    lib = typed_library(blocks, seed=seed, groups=2, spans=spans)
    tot = typed_totals(lib)
    budgets = [Budget("mem", None, mem * tot["mem"])]
    if second == "run":
        budgets.append(Budget("time", None, 0.6 * tot["time"]))
    if second == "floor":
        budgets.append(Budget("params", 0.3 * tot["params"], None))
    ref = exact(lib, budgets, "kl")
    rows = []
    for b in budgets:
        v, k = lib.values(b.key), lib.constant(b.key)
        s = float(np.abs(v).max()) or 1.0
        rows.append(Row(v, b.hi - k, s) if b.hi is not None else Row(-v, k - b.lo, s))
    c = lib.values("kl")
    allowed = np.ones(lib.num_replacements, dtype=bool)
    found = path_optimum(lib.start, lib.end, lib.num_blocks, c, rows, allowed, None,
                         max_labels=10**6, max_work=10**8)
    on, off = (solve(lib, "kl", budgets, options=SolveOptions(mip_rel_gap=0.0),
                      tuning=SolverTuning(dp=dp))
               for dp in (True, False))
    if ref is None:
        assert found is not None and found[0] == "infeasible"
        assert on.status == off.status == "infeasible"
        return
    assert found is not None and found[0] == "optimal"
    chosen = found[1][0]
    m = MipModel(lib, "kl", budgets)
    x = np.zeros(lib.num_replacements)
    x[chosen] = 1.0
    m.verify(m.with_counts(x))  # a path meeting every budget
    best = ref[0]
    got = float(c[chosen].sum())
    assert abs(got - best) <= 1e-12 * max(abs(best), 1.0), (got, best)
    # nothing below the optimum (a path found is the optimum again, its sum taken in
    # another order a rounding below)
    cut = path_optimum(lib.start, lib.end, lib.num_blocks, c, rows, allowed, got,
                       max_labels=10**6, max_work=10**8)
    assert cut is not None
    assert cut == ("cutoff", []) or abs(float(c[cut[1][0]].sum()) - got) <= 1e-14 * abs(got)
    again = path_optimum(lib.start, lib.end, lib.num_blocks, c, rows, allowed,
                         got + 1e-9 * max(abs(got), 1.0), max_labels=10**6, max_work=10**8)
    assert again is not None and again[0] == "optimal"
    assert float(c[again[1][0]].sum()) == got
    assert on.status == off.status == "optimal"
    assert abs(on.objective - best) <= GAP_FLOOR * max(abs(best), 1.0)
    assert abs(off.objective - best) <= GAP_FLOOR * max(abs(best), 1.0)
