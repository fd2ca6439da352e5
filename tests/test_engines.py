"""Engines and the search space: tied choices in the MIP (exact against brute force), the
per-engine capability table (nas.engines) and ``deploy.engines`` in a search."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
from library_generators import typed_library

from nas.library import BlockLibrary
from nas.mip import Budget, MipModel, SolveOptions, SolverError, Tie, diverse_pool, solve, sweep


def brute_force(lib: BlockLibrary, obj: str, budgets: list[Budget], ties: list[Tie]
                ) -> tuple[float, list[int]] | None:
    """Every path 0 -> L of the replacement graph, the best that meets every budget and
    tie: (objective, chosen) or None."""
    by_start: dict[int, list[int]] = {}
    for r in range(lib.num_replacements):
        by_start.setdefault(int(lib.start[r]), []).append(r)
    best: tuple[float, list[int]] | None = None
    of = [t.group_of(lib.num_replacements) for t in ties]

    def walk(b: int, path: list[int]) -> None:
        nonlocal best
        if b == lib.num_blocks:
            for g in of:
                if len({g[r] for r in path if g[r] >= 0}) > 1:
                    return
            tot = lib.totals(path)
            for bu in budgets:
                if (bu.hi is not None and tot[bu.key] > bu.hi) or \
                        (bu.lo is not None and tot[bu.key] < bu.lo):
                    return
            if best is None or tot[obj] < best[0]:
                best = (tot[obj], list(path))
            return
        for r in by_start.get(b, []):
            walk(int(lib.end[r]), [*path, r])

    walk(0, [])
    return best


def by_value(lib: BlockLibrary, obj: str, budgets: list[Budget], tie: Tie
             ) -> float | None:
    """The tied optimum by another route: for each group of ``tie`` (one value), scipy's
    milp on the plain model with every other group's replacements forbidden; the best."""
    import scipy.sparse as sp
    from scipy.optimize import Bounds, LinearConstraint, milp

    R, L = lib.num_replacements, lib.num_blocks
    blocks = np.concatenate([np.arange(a, b) for a, b in zip(lib.start, lib.end)])
    cover = sp.csr_matrix((np.ones(blocks.size), (blocks, np.repeat(np.arange(R),
                                                                    lib.lengths))), (L, R))
    rows, lo, hi = [cover], [np.ones(L)], [np.ones(L)]
    for b in budgets:
        rows.append(sp.csr_matrix(lib.values(b.key)[None, :]))
        c = lib.constant(b.key)
        lo.append(np.array([-np.inf if b.lo is None else b.lo - c]))
        hi.append(np.array([np.inf if b.hi is None else b.hi - c]))
    of = np.asarray(tie.group_of(R))
    best = None
    for g in range(len(tie.groups)):
        ub = np.where((of >= 0) & (of != g), 0.0, 1.0)
        r = milp(lib.values(obj), constraints=LinearConstraint(
            sp.vstack(rows), np.concatenate(lo), np.concatenate(hi)), integrality=np.ones(R),
            bounds=Bounds(0, ub), options={"mip_rel_gap": 0.0})
        if r.x is not None:
            v = float(lib.values(obj) @ np.round(r.x)) + lib.constant(obj)
            best = v if best is None else min(best, v)
    return best


def kind_ties(lib: BlockLibrary, noop_grouped: bool) -> list[Tie]:
    """Kind A's variants tied by pairs (v0 v1 | v2 v3 | v4), its no-op in a group of its
    own (an anchor exists) or in none (free: no anchor, the big-M rows)."""
    groups: dict[str, list[int]] = {}
    for r, lab in enumerate(lib.labels):
        kind, _, var = lab.partition(" ")
        if kind != "A":
            continue
        if var == "no_op":
            if noop_grouped:
                groups.setdefault("noop", []).append(r)
            continue
        groups.setdefault(f"pair{int(var[1:]) // 2}", []).append(r)
    names = sorted(groups)
    return [Tie("A.variant", tuple(tuple(groups[n]) for n in names), tuple(names))]


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("spans,noop_grouped", [(False, True), (False, False), (True, True)])
def test_ties_give_the_brute_force_optimum(seed, spans, noop_grouped):
    """Tied groups (anchored rows, and the big-M rows when no block always takes a value)
    give the exact optimum of the tied space at gap 0, and the optimum of the untied space
    is no worse."""
    lib = typed_library(6, seed=seed, groups=2, spans=spans)
    tot = lib.totals([int(np.flatnonzero(lib.start == b)[0]) for b in range(lib.num_blocks)])
    budgets = [Budget("mem", None, (0.35 + 0.1 * seed) * tot["mem"])]
    ties = kind_ties(lib, noop_grouped)
    ref = brute_force(lib, "kl", budgets, ties)
    res = solve(lib, "kl", budgets, ties=ties, options=SolveOptions(mip_rel_gap=0.0))
    if ref is None:
        assert res.status == "infeasible"
        return
    assert res.status == "optimal", res
    assert abs(res.objective - ref[0]) <= 1e-9 * max(abs(ref[0]), 1.0)
    assert len(ties[0].broken_by(res.chosen.tolist(), lib.num_replacements)) <= 1
    free = solve(lib, "kl", budgets, options=SolveOptions(mip_rel_gap=0.0))
    assert free.objective <= res.objective + 1e-12


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("spans,noop_grouped", [(False, True), (True, False), (True, True)])
def test_ties_on_larger_libraries_match_one_solve_per_value(seed, spans, noop_grouped):
    """24 blocks (too many paths to enumerate): the tied optimum equals the best of one
    plain solve per tied value (scipy.milp, the other values forbidden), at gap 0."""
    lib = typed_library(24, seed=seed, groups=3, spans=spans)
    tot = lib.totals([int(np.flatnonzero(lib.start == b)[0]) for b in range(lib.num_blocks)])
    budgets = [Budget("mem", None, (0.4 + 0.1 * seed) * tot["mem"])]
    ties = kind_ties(lib, noop_grouped)
    ref = by_value(lib, "kl", budgets, ties[0])
    res = solve(lib, "kl", budgets, ties=ties, options=SolveOptions(mip_rel_gap=0.0))
    if ref is None:
        assert res.status == "infeasible"
        return
    assert res.status == "optimal", res
    assert res.objective == pytest.approx(ref, rel=1e-9, abs=1e-9)


def test_ties_bind_and_hold_in_pools_and_sweeps():
    """Unconstrained, the optimum mixes A's variants; with the tie it takes one pair; every
    child of a pool and of a sweep keeps the tie; the DP (off with ties) is not used."""
    lib = typed_library(10, seed=3, groups=2, spans=False)
    tot = lib.totals([int(np.flatnonzero(lib.start == b)[0]) for b in range(lib.num_blocks)])
    budgets = [Budget("mem", None, 0.7 * tot["mem"])]
    ties = kind_ties(lib, True)
    free = solve(lib, "kl", budgets, options=SolveOptions(mip_rel_gap=0.0))
    assert len(ties[0].broken_by(free.chosen.tolist(), lib.num_replacements)) > 1
    tied = solve(lib, "kl", budgets, ties=ties, options=SolveOptions(mip_rel_gap=0.0))
    assert tied.objective == pytest.approx(by_value(lib, "kl", budgets, ties[0]), rel=1e-9)
    pool = diverse_pool(lib, "kl", budgets, n=4, min_distance=2, ties=ties,
                        options=SolveOptions(mip_rel_gap=0.0))
    assert len(pool) == 4
    sw = sweep(lib, "kl", budgets, key="mem", values=[0.4 * tot["mem"], 0.6 * tot["mem"],
                                                       0.8 * tot["mem"]], ties=ties,
               options=SolveOptions(mip_rel_gap=0.0))
    for r in [*pool, *sw.results]:
        assert r.ok and len(ties[0].broken_by(r.chosen.tolist(), lib.num_replacements)) == 1
    for r, v in zip(sw.results, sw.values):
        assert r.objective == pytest.approx(by_value(lib, "kl", [Budget("mem", None, v)],
                                                     ties[0]), rel=1e-9)


def test_a_broken_tie_is_caught_and_ties_alone_explain_infeasibility():
    lib = typed_library(6, seed=1, groups=2, spans=False)
    ties = kind_ties(lib, True)
    m = MipModel(lib, "kl", ties=ties)
    a_rows = [r for r, lab in enumerate(lib.labels) if lab.startswith("A")]
    mixed = []
    for b in range(lib.num_blocks):  # block 0 (an A) takes v0, block 2 (an A) takes v2
        want = {0: "A v0", 2: "A v2"}.get(b)
        mixed.append(next(r for r in range(lib.num_replacements) if lib.start[r] == b
                          and (want is None or lib.labels[r] == want)))
    x = np.zeros(m.num_columns)
    x[mixed] = 1.0
    with pytest.raises(SolverError, match="breaks tie A.variant"):
        m.verify(m.with_counts(x[:lib.num_replacements]))
    # every A block's replacements in a group of their own: a child could take a value at
    # one A block only, but each must be covered -> no child, and the message says why
    own = tuple(tuple(r for r in a_rows if lib.start[r] == b)
                for b in sorted({int(lib.start[r]) for r in a_rows}))
    res = solve(lib, "kl", [], ties=[Tie("A.own", own)])
    assert res.status == "infeasible"
    assert "tied choices leave no child" in res.message


def test_nas_mip_does_not_import_nas_spec():
    """The solver is a layer under the spec: the budget units live in nas.units."""
    out = subprocess.run([sys.executable, "-c", "import sys, nas.mip; "
                          "print('nas.spec' in sys.modules)"], capture_output=True, text=True,
                         check=True)
    assert out.stdout.strip() == "False"
    from nas.mip.constraints import parse_value
    assert parse_value("2 GiB", "memory_bytes") == 2 * 2**30
    assert parse_value("10 ms", "runtime_s") == pytest.approx(0.01)

