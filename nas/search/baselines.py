"""Baselines the search is compared with: the best homogeneous child (one alternative for
every block, by enumeration) and the fixed-recipe solve (the precision the spec gives for
all blocks, nothing searched).
"""

from __future__ import annotations

import math
from typing import cast

import numpy as np

from hwprofiles.errors import InputError
from nas import mip
from nas.library import BlockLibrary
from nas.search.budgets import Constraints, options_of
from nas.search.problem import Problem


# ---- homogeneous baseline -----------------------------------------------------------------
def homogeneous_solve(library: BlockLibrary, cons: Constraints,
                      max_combinations: int = 5_000_000) -> mip.Result:
    """Best child where every block of a kind (same parent block) takes the same choice.

    Exact: enumerates every combination of per-group choices with numpy (no MIP), so the
    baseline is the true optimum of the restricted space.
    """
    import time

    library = cons.extend(library)
    t0 = time.perf_counter()
    # group parent blocks by their set of alternative labels (same parent shape)
    by_block: dict[int, list[int]] = {}
    for r in range(library.num_replacements):
        if library.lengths[r] == 1:  # spans (nas.space.spans) are no per-block choice
            by_block.setdefault(int(library.start[r]), []).append(r)
    groups: dict[tuple[str, ...], list[int]] = {}
    for b in range(library.num_blocks):
        labels = tuple(library.labels[r] for r in by_block[b])
        groups.setdefault((library.block_name(b).split(":", 1)[-1],) + labels, []).append(b)
    keys = list(library.costs) + list(library.scores)
    tag_keys = sorted({c.tag for c in cons.counts})
    allv = {**library.costs, **library.scores}
    gmats: list[np.ndarray] = []
    glabels: list[list[int]] = []
    gbad: list[np.ndarray] = []
    gtie: list[list[np.ndarray]] = [[] for _ in cons.ties]
    forbidden = set(cons.forbid)
    tie_of = [t.group_of(library.num_replacements) for t in cons.ties]
    for gk, blocks in groups.items():
        labels = gk[1:]
        mat = np.zeros((len(labels), len(keys) + len(tag_keys)))
        for b in blocks:
            for li, r in enumerate(by_block[b]):
                mat[li, :len(keys)] += [allv[k][r] for k in keys]
                mat[li, len(keys):] += [float(t in library.tags[r]) * library.lengths[r]
                                        for t in tag_keys]
        gmats.append(mat)
        glabels.append(blocks)
        # a label is out when any of its blocks' replacement is forbidden; its tie group
        # is its first block's (the blocks of a group take one child alike)
        gbad.append(np.array([any(by_block[b][li] in forbidden for b in blocks)
                              for li in range(len(labels))]))
        for t, of in enumerate(tie_of):
            gtie[t].append(np.array([of[by_block[blocks[0]][li]] for li in range(len(labels))]))
    sizes = [m.shape[0] for m in gmats]
    total = math.prod(sizes)
    if total > max_combinations:
        raise InputError(f"homogeneous space has {total:,} combinations (limit "
                         f"{max_combinations:,}); narrow the search space")
    grids = np.meshgrid(*[np.arange(s) for s in sizes], indexing="ij")
    idx = [g.reshape(-1) for g in grids]
    # an array: every library has a block, so there is a group
    totals = cast(np.ndarray, sum(m[i] for m, i in zip(gmats, idx)))
    const = np.array([library.constants.get(k, 0.0) for k in keys] + [0.0] * len(tag_keys))
    totals = totals + const
    ok = np.ones(totals.shape[0], dtype=bool)
    for bad, i in zip(gbad, idx):
        ok &= ~bad[i]
    for per_group in gtie:  # every group that takes a value of a tie takes the same one
        v = np.stack([g[i] for g, i in zip(per_group, idx)])
        top = v.max(axis=0)
        low = np.where(v < 0, np.iinfo(np.int64).max, v).min(axis=0)
        ok &= (top < 0) | (low == top)
    col = {k: j for j, k in enumerate(keys + tag_keys)}
    for bud in cons.budgets:
        v = totals[:, col[bud.key]]
        bound = cast(float, bud.hi if bud.hi is not None else bud.lo)  # a row bounds a side
        tol = 1e-9 * max(1.0, abs(bound))
        if bud.hi is not None:
            ok &= v <= bud.hi + tol
        if bud.lo is not None:
            ok &= v >= bud.lo - tol
    for c in cons.counts:
        v = totals[:, col[c.tag]]
        if c.min is not None:
            ok &= v >= c.min
        if c.max is not None:
            ok &= v <= c.max
    # an array: an objective weighs at least one key
    obj = cast(np.ndarray, sum(w * totals[:, col[k]] for k, w in cons.objective.weights.items()))
    if cons.objective.sense == "max":
        obj = -obj
    secs = time.perf_counter() - t0
    if not ok.any():
        return mip.Result("infeasible", None, None, None, 0, secs,
                          message="no homogeneous child meets every budget")
    best = int(np.flatnonzero(ok)[np.argmin(obj[ok])])
    chosen = []
    for gi, blocks in enumerate(glabels):
        li = int(idx[gi][best])
        chosen += [by_block[b][li] for b in blocks]
    chosen_arr = np.asarray(sorted(chosen, key=lambda r: library.start[r]), dtype=np.int64)
    tot = {k: float(totals[best, col[k]]) for k in keys}
    val = float(sum(w * tot[k] for k, w in cons.objective.weights.items()))
    return mip.Result("optimal", val, val, 0.0, 0, secs, chosen=chosen_arr,
                      choices=[int(r) for r in chosen_arr], totals=tot,
                      message=f"exhaustive over {total:,} homogeneous combinations")


def fixed_recipe_forbid(library: BlockLibrary) -> np.ndarray:
    """Indices of the replacements with their own precision recipe (tag ``precision:<name>``,
    ``nas.space.spans``): forbidding them leaves the spec's one recipe for every block."""
    return np.flatnonzero([any(t.startswith("precision:") for t in tags)
                           for tags in library.tags])


def fixed_recipe_solve(problem: Problem, library: BlockLibrary, cons: Constraints
                       ) -> mip.Result:
    """The best child with the spec's one recipe for every block, same budgets: the
    baseline that searching precision per block is compared with (a subset of its space)."""
    library = cons.extend(library)
    return mip.solve(library, cons.objective, cons.budgets, counts=cons.counts,
                     forbid=[int(i) for i in fixed_recipe_forbid(library)] + cons.forbid,
                     options=options_of(problem), ties=cons.ties)
