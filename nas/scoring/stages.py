"""Where a parent's blocks go when scoring shards it over ranks (no torch: ``score --nproc N``
checks it before any rank starts; :mod:`nas.scoring.pipeline` runs it).

A placement is a list of **segments** ``(rank, start, stop)`` in pipeline order: contiguous
ranges of blocks that together cover the parent once, the residual stream flowing from one
segment to the next. Rank 0 holds the first segment (it embeds the tokens) and the LM head
(it sums the scores).

The placement searched is a **ring**: ranks ``0, 1, ..., N-1`` hold contiguous ranges of the
blocks, and rank 0 may also hold a last range (the stream comes back to it for the final
blocks and the head). Every alternative of a block runs its held-out rows through all later
blocks, so the work per block grows along the parent while its memory does not: a cut that
gives each rank one range either balances memory and leaves the last rank most of the work,
or the reverse. The ring pairs rank 0's light first blocks with the heavy last ones, so that
memory and work can both be even (an empty last range is the plain contiguous cut, chosen
when nothing beats it).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable
from typing import TypeVar

import numpy as np

from hwprofiles.errors import InputError
from nas.arch import ModelArch
from nas.space import Alternative

Segment = tuple[int, int, int]
"""``(rank, start, stop)``: blocks ``[start, stop)`` on ``rank``."""
T = TypeVar("T")


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


def rank_ranges(segments: list[Segment], rank: int) -> list[tuple[int, int]]:
    """The block ranges ``[start, stop)`` that ``rank`` holds, in pipeline order."""
    return [(a, b) for r, a, b in segments if r == rank]


def placement(arch: ModelArch, world: int, alts: list[list[Alternative]]) -> list[Segment]:
    """The segments of ``world`` ranks (see the module docstring): the ring minimizing the
    largest rank's ``max(memory share, work share) x world``, then, among those, the sum of
    the squared costs (so that the ranks below the largest are as even as they can be).

    Memory is a block's parameters (rank 0 also the embedding and LM head); work is a
    block's active parameters times the alternatives whose held-out rows run through it,
    plus the block's own alternatives (built and BLD-trained where it is held), plus on
    rank 0 the LM head of every alternative, teacher and student. Exact for a ring: every
    last range is tried, with the cut of the rest by dynamic programming over the cut
    points. Raises :class:`InputError` when the ranks outnumber the pieces the blocks can
    be cut into."""
    L = arch.num_blocks
    if world == 1:
        return [(0, 0, L)]
    units = _units(L, alts)
    if world > len(units):
        tied = "" if len(units) == L else \
            f" ({len(units)} pieces: replaced spans are not cut)"
        raise InputError(f"--nproc {world}: the parent's {L} blocks cannot be "
                         f"split over {world} ranks{tied}; use at most {len(units)} ranks, "
                         "or --replicas for a parent that fits one rank")
    mem = arch.block_params().astype(float)
    act = arch.block_params(active=True).astype(float)
    n_items = np.zeros(L)
    for block_alts in alts:
        for a in block_alts:
            if not a.is_parent:
                n_items[a.block] += 1
    through = np.cumsum(n_items)  # alternatives whose held-out rows run through block j
    work = act * through + act * n_items  # + init / BLD on the block's own rank
    head = float(arch.hidden_size * arch.vocab_size)
    head_mem = head * (1 if arch.tie_embeddings is not False else 2)
    head_work = 2 * head * n_items.sum()  # the student's and the teacher's logits
    u = len(units)
    cm = np.concatenate([[0.0], np.cumsum([mem[s:e].sum() for s, e in units])])
    cw = np.concatenate([[0.0], np.cumsum([work[s:e].sum() for s, e in units])])
    total_m, total_w = cm[u] + head_mem, max(cw[u] + head_work, 1.0)
    v_, e_ = np.meshgrid(np.arange(u + 1), np.arange(u + 1), indexing="ij")
    share = np.maximum((cm[e_] - cm[v_]) / total_m, (cw[e_] - cw[v_]) / total_w) * world
    share[v_ >= e_] = np.inf  # units [v, e) on one rank; a rank holds at least one unit

    def solve(t: int, cap: float | None) -> tuple[float, list[int]]:
        """Units ``[0, t)`` cut into ``world`` ranges, rank 0 also holding units ``[t, u)``:
        the largest cost (``cap`` None), or with every cost at most ``cap`` the sum of the
        squared costs; and the cut points."""
        cost = share[:t + 1, :t + 1].copy()
        m0, w0 = cm[u] - cm[t] + head_mem, cw[u] - cw[t] + head_work
        cost[0, 1:] = np.maximum((cm[1:t + 1] + m0) / total_m,
                                 (cw[1:t + 1] + w0) / total_w) * world
        if cap is not None:
            cost = np.where(cost <= cap, cost * cost, np.inf)
        best = np.full(t + 1, np.inf)
        best[0] = 0.0
        args = []
        for _ in range(world):
            cand = np.maximum(best[:, None], cost) if cap is None else best[:, None] + cost
            arg = np.argmin(cand, axis=0)
            best = cand[arg, np.arange(t + 1)]
            args.append(arg)
        cuts, e = [t], t
        for arg in args[::-1]:
            e = int(arg[e])
            cuts.append(e)
        return float(best[t]), cuts[::-1]

    tails = range(u, world - 1, -1)  # the last range's first unit; u: none (contiguous)
    tops = {t: solve(t, None)[0] for t in tails}
    top = min(tops.values())
    best_t, best_cuts, best_sq = u, [], np.inf
    for t in tails:
        if tops[t] <= top * (1 + 1e-9):
            sq, cuts = solve(t, top * (1 + 1e-9))
            if sq < best_sq * (1 - 1e-12):
                best_t, best_cuts, best_sq = t, cuts, sq
    segs = [(r, units[v][0], units[e - 1][1])
            for r, (v, e) in enumerate(zip(best_cuts, best_cuts[1:]))]
    if best_t < u:
        segs.append((0, units[best_t][0], L))
    return segs


def wavefront(rank: int, firsts: list[int], last: int, station_rank: Callable[[int, int], int]
              ) -> list[tuple[int, int]]:
    """This rank's tasks ``(k, s)``, item ``k`` at its stations ``firsts[k]..last``, in
    wavefront order: by step ``k + s``, then station, then item (one total order that every
    rank restricts to its own tasks). ``station_rank(k, s)`` is the rank that runs it."""
    tasks = [(k + s, s, k) for k, f in enumerate(firsts) for s in range(f, last + 1)
             if station_rank(k, s) == rank]
    return [(k, s) for _, s, k in sorted(tasks)]


def interleave(items: list[T], station: Callable[[T], int]) -> list[T]:
    """``items`` with each station's own spread evenly over the list (the ``j``-th of ``n``
    at ``(j + 1/2) / n``), keeping their order within a station: every rank then has its
    share of the work all along, not all of it at the end."""
    groups: dict[int, list[T]] = defaultdict(list)
    for it in items:
        groups[station(it)].append(it)
    keyed = [((j + 0.5) / len(g), s, j) for s, g in groups.items() for j in range(len(g))]
    return [groups[s][j] for _, s, j in sorted(keyed)]
