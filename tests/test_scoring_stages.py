"""Where sharded scoring puts the parent's blocks and in what order each rank runs its work
(nas.scoring.stages; no torch)."""

from __future__ import annotations

import itertools
import random
from collections import defaultdict

import numpy as np
import pytest

from hwprofiles.errors import InputError
from nas.arch import FFN, Attention, ModelArch
from nas.scoring.stages import interleave, placement, rank_ranges, wavefront
from nas.space import Alternative, alternatives
from nas.spec import SearchSpace

ARCH = ModelArch(hidden_size=256, vocab_size=512, model_type="llama",
                 blocks=(Attention(num_heads=4, num_kv_heads=4, head_dim=64),
                         FFN(width=1024)) * 5)
SPACE = SearchSpace.model_validate({"attention": {"noop": True}, "ffn": {"fractions": [0.5]}})


def _shares(arch: ModelArch, alts: list[list[Alternative]], segs, world: int) -> list[float]:
    """Each rank's max(memory share, work share) x world, as the placement's docstring
    defines them (computed here block by block, independently of its prefix sums)."""
    mem = arch.block_params().astype(float)
    act = arch.block_params(active=True).astype(float)
    n = np.zeros(arch.num_blocks)
    for a in (a for b in alts for a in b if not a.is_parent):
        n[a.block] += 1
    work = act * np.cumsum(n) + act * n
    head = arch.hidden_size * arch.vocab_size
    hm, hw = 2.0 * head, 2.0 * head * n.sum()
    tm, tw = mem.sum() + hm, work.sum() + hw
    out = []
    for r in range(world):
        idx = [j for a, b in rank_ranges(segs, r) for j in range(a, b)]
        m, w = mem[idx].sum() + (hm if r == 0 else 0), work[idx].sum() + (hw if r == 0 else 0)
        out.append(max(m / tm, w / tw) * world)
    return out


def _rings(L: int, world: int):
    """Every ring: ranks 0..world-1 on contiguous ranges of [0, t), rank 0 also on [t, L)."""
    for t in range(world, L + 1):
        for cuts in itertools.combinations(range(1, t), world - 1):
            c = [0, *cuts, t]
            segs = [(r, c[r], c[r + 1]) for r in range(world)]
            yield segs + ([(0, t, L)] if t < L else [])


@pytest.mark.parametrize("world", [2, 3, 4])
def test_the_placement_is_the_best_ring_and_beats_one_range_per_rank(world):
    """Exact: no ring has a smaller largest share; at 2 ranks on this parent (whose late
    blocks carry most of the work) rank 0 holds the first and the last blocks, and the
    largest share is below the best contiguous cut's."""
    alts = alternatives(ARCH, SPACE)
    segs = placement(ARCH, world, alts)
    top = max(_shares(ARCH, alts, segs, world))
    every = [max(_shares(ARCH, alts, s, world)) for s in _rings(ARCH.num_blocks, world)]
    assert top == pytest.approx(min(every), rel=1e-9)
    blocks = sorted(j for _, a, b in segs for j in range(a, b))
    assert blocks == list(range(ARCH.num_blocks)) and segs[0][:2] == (0, 0)
    contiguous = min(max(_shares(ARCH, alts, s, world)) for s in _rings(ARCH.num_blocks, world)
                     if len(s) == world)
    if world == 2:
        assert segs[-1][0] == 0 and len(segs) == 3
        assert top < contiguous - 0.1  # 1.03 against 1.24 of an even share
    assert top <= contiguous


def test_one_rank_holds_everything_and_too_many_ranks_are_refused():
    alts = alternatives(ARCH, SPACE)
    assert placement(ARCH, 1, alts) == [(0, 0, ARCH.num_blocks)]
    with pytest.raises(InputError, match="10 blocks cannot be split over 11 ranks"):
        placement(ARCH, 11, alts)


def test_a_replaced_span_is_never_cut():
    """A span alternative over blocks 3..6 keeps those blocks on one rank, in one segment."""
    alts = alternatives(ARCH, SPACE)
    alts[3] = alts[3] + [Alternative(3, ARCH.blocks[3], "span", False, end=7, children=())]
    for world in (2, 3, 4, 7):
        segs = placement(ARCH, world, alts)
        assert any(a <= 3 and 7 <= b for _, a, b in segs), segs
    with pytest.raises(InputError, match=r"cannot be split over 8 ranks \(7 pieces"):
        placement(ARCH, 8, alts)


def _stations(segs):
    return [r for r, _, _ in segs] + [0]  # the segments, then the sum on rank 0


@pytest.mark.parametrize("segs", [
    [(0, 0, 2), (1, 2, 6), (0, 6, 7)],                         # a ring over 2 ranks
    [(0, 0, 3), (1, 3, 4), (2, 4, 6), (3, 6, 7)],              # contiguous over 4
    [(0, 0, 1), (1, 1, 2), (2, 2, 3), (1, 3, 4), (0, 4, 7)],   # a V: pairs met twice
])
def test_wavefront_runs_without_deadlock_and_messages_match_in_order(segs):
    """Simulated with blocking receives and buffered sends, as the ranks run: every task
    runs, and on every (sender, receiver) pair the items arrive in the order they were
    sent (point-to-point messages match by order alone)."""
    st = _stations(segs)
    world = max(st) + 1
    rng = random.Random(0)
    firsts = [rng.randrange(len(segs)) for _ in range(23)]
    last = len(st)  # the figures, back on the item's first rank
    owner = [st[f] for f in firsts]

    def rank_of(k: int, s: int) -> int:
        return owner[k] if s == last else st[s]

    todo = {r: wavefront(r, firsts, last, rank_of) for r in range(world)}
    assert sorted(t for r in todo for t in todo[r]) == \
        sorted((k, s) for k, f in enumerate(firsts) for s in range(f, last + 1))
    done: set[tuple[int, int]] = set()
    sent: dict[tuple[int, int], list[int]] = defaultdict(list)
    got: dict[tuple[int, int], list[int]] = defaultdict(list)
    pos = dict.fromkeys(range(world), 0)
    while any(pos[r] < len(todo[r]) for r in range(world)):
        moved = False
        for r in range(world):
            if pos[r] == len(todo[r]):
                continue
            k, s = todo[r][pos[r]]
            if s > firsts[k] and (k, s - 1) not in done:
                continue  # a blocking receive: its sender has not run yet
            src = rank_of(k, s - 1) if s > firsts[k] else r
            if src != r:
                got[(src, r)].append(k)
            dst = rank_of(k, s + 1) if s < last else r
            if dst != r:
                sent[(r, dst)].append(k)
            done.add((k, s))
            pos[r] += 1
            moved = True
        assert moved, "deadlock"
    assert sent == got


def test_interleave_spreads_each_station_and_keeps_its_order():
    items = [(s, j) for s, n in ((0, 4), (1, 9), (2, 3)) for j in range(n)]
    out = interleave(items, lambda it: it[0])
    assert sorted(out) == sorted(items)
    for s in (0, 1, 2):
        mine = [i for i, it in enumerate(out) if it[0] == s]
        assert [out[i][1] for i in mine] == sorted(out[i][1] for i in mine)
        assert mine[0] < 4 and mine[-1] >= len(out) - 4  # from the start to the end
