"""The cut of a parent's blocks into pipeline stages for sharded scoring (no torch: ``score
--nproc N`` checks it before any rank starts; :mod:`nas.scoring.pipeline` runs it)."""

from __future__ import annotations

import numpy as np

from hwprofiles.errors import InputError
from nas.arch import ModelArch
from nas.space import Alternative


def _units(num_blocks: int, alts: list[list[Alternative]]) -> list[tuple[int, int]]:
    """Blocks grouped so that no replaced span is cut: ``[start, stop)`` per unit."""
    tied = np.zeros(num_blocks + 1, dtype=bool)  # tied[j]: no cut between j-1 and j
    for block_alts in alts:
        for a in block_alts:
            if a.end is not None:
                tied[a.block + 1:a.stop] = True
    out, start = [], 0
    for j in range(1, num_blocks + 1):
        if j == num_blocks or not tied[j]:
            out.append((start, j))
            start = j
    return out


def stage_bounds(arch: ModelArch, world: int, alts: list[list[Alternative]]
                 ) -> list[tuple[int, int]]:
    """The blocks ``[a_r, b_r)`` of each of ``world`` ranks (see the module docstring): the
    contiguous cut minimizing the largest rank's ``max(memory share, work share) x world``,
    then, among those, the sum of the squared costs, by dynamic programming over the cut
    points (exact). Raises :class:`InputError` when the
    ranks outnumber the pieces the blocks can be cut into."""
    units = _units(arch.num_blocks, alts)
    if world > len(units):
        tied = "" if len(units) == arch.num_blocks else \
            f" ({len(units)} pieces: replaced spans are not cut)"
        raise InputError(f"--nproc {world}: the parent's {arch.num_blocks} blocks cannot be "
                         f"split over {world} ranks{tied}; use at most {len(units)} ranks, "
                         "or --replicas for a parent that fits one rank")
    mem = arch.block_params().astype(float)
    act = arch.block_params(active=True).astype(float)
    n_items = np.zeros(arch.num_blocks)
    for block_alts in alts:
        for a in block_alts:
            if not a.is_parent:
                n_items[a.block] += 1
    through = np.cumsum(n_items)  # alternatives whose held-out rows run through block j
    work = act * through + act * n_items  # + init / BLD on the block's own rank
    head = float(arch.hidden_size * arch.vocab_size)
    head_mem = head * (1 if arch.tie_embeddings is not False else 2)
    head_work = 2 * head * n_items.sum()  # the student's and the teacher's logits
    um = np.array([mem[s:e].sum() for s, e in units])
    uw = np.array([work[s:e].sum() for s, e in units])
    total_m, total_w = um.sum() + head_mem, uw.sum() + head_work
    cm, cw = np.concatenate([[0.0], np.cumsum(um)]), np.concatenate([[0.0], np.cumsum(uw)])
    u = len(units)

    def cost(v: int, e: int) -> float:  # units [v, e) on one rank
        m, w = cm[e] - cm[v], cw[e] - cw[v]
        if v == 0:
            m, w = m + head_mem, w + head_work
        return max(m / total_m, w / max(total_w, 1.0)) * world

    inf = float("inf")

    def solve(cap: float | None) -> tuple[float, list[tuple[int, int]]]:
        """Cut minimizing the largest cost (``cap`` None) or, with every cost at most
        ``cap``, the sum of squared costs (so that the ranks below the largest are as even
        as they can be: a min-max cut alone leaves them arbitrary)."""
        best = np.full((world + 1, u + 1), inf)
        arg = np.zeros((world + 1, u + 1), dtype=int)
        best[0, 0] = 0.0
        for k in range(1, world + 1):
            for e in range(k, u - (world - k) + 1):
                for v in range(k - 1, e):
                    c = cost(v, e)
                    if cap is None:
                        val = max(best[k - 1, v], c)
                    elif c > cap:
                        continue
                    else:
                        val = best[k - 1, v] + c * c
                    if val < best[k, e]:
                        best[k, e], arg[k, e] = val, v
        cuts, e = [], u
        for k in range(world, 0, -1):
            v = int(arg[k, e])
            cuts.append((units[v][0], units[e - 1][1]))
            e = v
        return float(best[world, u]), cuts

    top, cuts = solve(None)
    _, cuts = solve(top * (1 + 1e-9))
    return cuts[::-1]
