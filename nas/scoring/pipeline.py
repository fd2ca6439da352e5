"""Scoring with the parent sharded over ranks: ranges of blocks as pipeline stages.

``puzzle-nas score --nproc N`` (the default for ``N > 1``; ``--replicas`` loads the whole
parent on every rank instead). Rank ``r`` reads only its share of the parent's tensors
from the safetensors files, one submodule at a time: the blocks of its segments and, on
rank 0, the embedding, final norm and LM head. No rank ever holds the whole parent.

* **Segments** (:func:`nas.scoring.stages.placement`): contiguous ranges of blocks in
  pipeline order, each on one rank; a ring, so that rank 0 may hold the first and the last
  range (light early blocks with heavy late ones: memory and work both even). A span of
  blocks replaced together never crosses a cut.
* **Stations**: the segments in order, then the sum on rank 0 (the KL against the teacher,
  through the LM head), then the figures back on the rank that holds the item's block. An
  item's work at a station is a *task*; a rank runs its tasks in **wavefront order** (task
  ``(item k, station s)`` at step ``k + s``), so that while a later rank runs item ``k``'s
  rows, an earlier one already runs item ``k + 1``'s. Every task depends only on tasks of
  earlier steps, and sends are asynchronous, so no rank waits on one that waits on it; the
  messages between two ranks are sent and received in the same order, so point-to-point
  messages match without tags (as nccl needs).
* **Prefix cache per segment**: the parent runs once through the same stations; each rank
  keeps only the boundaries of its own blocks, and rank 0 keeps the teacher target, the last
  boundary of the held-out rows (the log-probabilities are recomputed from it when a score is
  summed: :func:`nas.scoring.core.kl_sums`).
* **Work flows to the blocks**: an alternative of block ``i`` is built, initialized and
  BLD-trained on the rank that holds block ``i``, from that rank's cached stream; its
  held-out rows then run through the new block and the rest of its segment, on through the
  later segments, and rank 0 sums the KL. Rank 0 sends the figures back to the block's rank,
  which keeps the better of the BLD-trained and initialized blocks and commits the row to
  its own store. Every rank walks the same list of alternatives (interleaved over the
  segments that hold them, so that every rank has work throughout).

Scores equal the single-process ones (:class:`nas.scoring.core.Scorer`) within float
tolerance: the same modules run on the same inputs, only in other processes.
"""

from __future__ import annotations

from collections import defaultdict, deque
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from nas.child.checkpoint import CheckpointReader
from nas.modules.model import Block, CausalLM
from nas.scoring.cache import PrefixCache
from nas.scoring.core import MAX_TOKENS, Item, Scorer, Sums, head_of
from nas.scoring.digest import combine_lines, tensor_line
from nas.scoring.job import Settings
from nas.scoring.stages import Segment, interleave, rank_ranges, wavefront


@dataclass
class _Pending:
    """An alternative built on this rank, waiting for rank 0's figures."""

    item: Item
    block: torch.nn.Module | None
    init: torch.nn.Module | None
    what: str
    info: dict[str, Any]
    t0: float


class Stage:
    """This rank's share of a sharded parent and the stations it runs."""

    def __init__(self, reader: CheckpointReader, segments: list[Segment], rank: int,
                 settings: Settings, dtype: torch.dtype | None, device: str, side: Any,
                 hash_weights: bool = True):
        self.reader, self.segments, self.rank = reader, list(segments), rank
        self.world = max(r for r, _, _ in self.segments) + 1
        self.S = len(self.segments)
        """Stations ``0..S-1`` are the segments; ``S`` is the sum on rank 0."""
        self.ranges = rank_ranges(self.segments, rank)
        self.L = reader.arch.num_blocks
        self.settings = settings
        self.dtype = dtype or reader.stored_dtype()
        self.device = torch.device(device)
        self.model: CausalLM = reader.model
        names = [f"blocks.{i}" for a, b in self.ranges for i in range(a, b)]
        if rank == 0:
            names = ["embed", "norm", "lm_head"] + names
        lines: dict[str, str] = {}
        for name in names:
            if getattr(self.model, name.split(".")[0], None) is None:
                continue  # no final norm / a tied head
            sub = reader.materialize(name, self.dtype).to(self.device)
            for k, t in sub.state_dict().items() if hash_weights else ():
                lines[f"{name}.{k}"] = tensor_line(f"{name}.{k}", t)
        self.model.eval()
        self._lines = lines
        self.held_elements = sum(t.numel() for t in self.model.state_dict().values()
                                 if t.device.type != "meta")
        """Parameter and buffer elements this rank holds (the rest stay on meta)."""
        self.side = side
        """A gloo group beside the activations' (nccl on CUDA, which matches messages by
        order alone): figures, losses and digests travel on it (CPU tensors, objects)."""
        self._local: dict[tuple[int, int], deque[torch.Tensor]] = defaultdict(deque)
        """Streams handed from one station to the next on this same rank."""

    def digest(self) -> str:
        """:func:`nas.scoring.digest.weights_digest` of the whole parent, from every rank's
        lines (a collective: every rank calls it)."""
        every: list[dict[str, str]] = [{} for _ in range(self.world)]
        dist.all_gather_object(every, self._lines, group=self.side)
        merged = {k: v for d in every for k, v in d.items()}
        order = list(self.model.state_dict().keys())
        missing = [k for k in order if k not in merged]
        if missing:
            raise RuntimeError(f"no rank holds {missing[0]}")
        return combine_lines([merged[k] for k in order])

    def owns(self, j: int) -> bool:
        return any(a <= j < b for a, b in self.ranges)

    def segment_of(self, j: int) -> int:
        """The station (segment) that holds block ``j``."""
        return next(s for s, (_, a, b) in enumerate(self.segments) if a <= j < b)

    def station_rank(self, s: int) -> int:
        return self.segments[s][0] if s < self.S else 0

    # ---- point to point ---------------------------------------------------------------
    def _recv(self, src: int, shape: tuple[int, ...]) -> torch.Tensor:
        t = torch.empty(shape, dtype=self.dtype, device=self.device)
        dist.recv(t, src)
        return t

    def _send(self, t: torch.Tensor, dst: int, waits: list[Any]) -> None:
        t = t.contiguous()
        waits.append((dist.isend(t, dst), t))

    def take(self, k: int, s: int, shape: tuple[int, ...]) -> torch.Tensor:
        """The next stream of item ``k`` entering station ``s`` (from station ``s - 1``)."""
        src = self.station_rank(s - 1)
        if src == self.rank:
            q = self._local[(k, s)]
            x = q.popleft()
            if not q:
                del self._local[(k, s)]
            return x
        return self._recv(src, shape)

    def give(self, k: int, s: int, x: torch.Tensor, waits: list[Any]) -> None:
        """Station ``s``'s stream of item ``k`` on to station ``s + 1``."""
        dst = self.station_rank(s + 1)
        if dst == self.rank:
            self._local[(k, s + 1)].append(x)
        else:
            self._send(x, dst, waits)

    def run_segment(self, x: torch.Tensor, s: int, start: int | None = None) -> torch.Tensor:
        """``x`` through segment ``s``'s blocks from ``start`` (default: its first) on."""
        _, a, b = self.segments[s]
        for j in range(a if start is None else start, b):
            x = self.model.blocks[j](x)
        return x

    def _block_of(self, j: int) -> torch.nn.Module:
        """Parent block ``j``: this rank's, or read from the checkpoint for the moment."""
        if self.owns(j):
            return self.model.blocks[j]
        with torch.device("meta"):
            blk = Block(self.reader.arch.blocks[j], self.reader.arch)
        keys = set(self.reader.keys(f"blocks.{j}."))
        sd = self.reader.tensors(keys, self.dtype)
        self.reader.close()
        blk.load_state_dict({k[len(f"blocks.{j}."):]: v for k, v in sd.items()}, assign=True)
        return blk.to(self.device).eval()

    # ---- the parent, once ---------------------------------------------------------------
    @torch.no_grad()
    def fill(self, batches: list[torch.Tensor], *, held: bool, max_bytes: float,
             spill_dir: Any, name: str) -> PrefixCache:
        """Run the parent on ``batches`` through the stations; keep this rank's boundaries
        (held-out: the inputs of its blocks; calibration: also each segment's last one,
        BLD's target), and on rank 0 the held-out teacher target."""
        cache = PrefixCache(None, batches, max_bytes=max_bytes, spill_dir=spill_dir,
                            name=name, device=self.device)
        h = self.reader.arch.hidden_size
        waits: list[Any] = []
        last = self.S if held else self.S - 1
        for bi, s in wavefront(self.rank, [0] * len(batches), last,
                               lambda k, s: self.station_rank(s)):
            tokens = batches[bi]
            shape = (tokens.shape[0], tokens.shape[1], h)
            if s == self.S:  # rank 0: the teacher target
                cache.add(bi, {f"h{self.L}": self.take(bi, s, shape)})
                continue
            x = self.model.embed_tokens(tokens.to(self.device)) if s == 0 else \
                self.take(bi, s, shape)
            _, a, b = self.segments[s]
            out = {}
            for j in range(a, b):
                out[f"h{j}"] = x
                x = self.model.blocks[j](x)
            if not held:
                out[f"h{b}"] = x
            cache.add(bi, out)
            if s < last:
                self.give(bi, s, x, waits)
        for w, _ in waits:
            w.wait()
        return cache


class PipelineScorer(Scorer):
    """A :class:`~nas.scoring.core.Scorer` over one :class:`Stage`: it builds (and BLD-trains)
    the alternatives of this rank's blocks from its own cached streams; :meth:`run` walks
    every alternative through the stations."""

    def __init__(self, stage: Stage, split: Any, settings: Settings, *,
                 cache_bytes: float, spill_dir: Any):
        if stage.world < 2:
            raise ValueError("a pipeline needs at least 2 ranks (one rank: Scorer)")
        self.stage = stage
        self.parent = stage.model
        self.settings = settings
        self.cached = True
        bs = settings.batch_size
        held = torch.as_tensor(split.held, dtype=torch.long)
        calib = torch.as_tensor(split.calib, dtype=torch.long)
        self.held = [held[k:k + bs] for k in range(0, len(held), bs)]
        self.calib = [calib[k:k + bs] for k in range(0, len(calib), bs)]
        self.init_rows = max(1, MAX_TOKENS // settings.seq_len)
        self.held_cache = stage.fill(self.held, held=True, max_bytes=cache_bytes,
                                     spill_dir=spill_dir, name="held")
        left = max(0.0, cache_bytes - self.held_cache.mem_bytes)
        self.calib_cache = stage.fill(self.calib, held=False, max_bytes=left,
                                      spill_dir=spill_dir, name="calib")
        self.block_of = stage._block_of
        self.tokens = sum(t[:, 1:].numel() for t in self.held)
        self.parent_loss = 0.0
        if stage.rank == 0:
            from nas.scoring.core import kl_sums

            self.head = head_of(stage.model)
            with torch.no_grad():
                self.parent_loss = sum(
                    kl_sums(self.head, self.held_cache.hidden(b, stage.L), None,
                            t.to(stage.device))[1] for b, t in enumerate(self.held))

    def owner(self, item: Item) -> int:
        return self.stage.station_rank(self.stage.segment_of(item.block))

    def variants(self, item: Item) -> int:
        """How many blocks of ``item`` are evaluated (2: the BLD-trained and the initialized
        one), decided alike on every rank."""
        s = self.settings
        if not s.bld_steps or (item.recipe is not None and item.alt.child == item.parent_block):
            return 1
        if item.alt.end is not None:
            return 1  # a span keeps its trained blocks (nas.scoring.span_scoring)
        return 1 if item.alt.child.kind == "noop" else 2

    def _shape(self, bi: int) -> tuple[int, int, int]:
        t = self.held[bi]
        return (t.shape[0], t.shape[1], self.stage.reader.arch.hidden_size)

    def _first(self, k: int, item: Item, s: int, waits: list[Any]) -> _Pending:
        """Item ``k``'s first task, on the rank that holds its block: build it (and
        BLD-train it), then its held-out rows from the cache through it and the rest of
        segment ``s``, on to the next station."""
        import time

        t0 = time.perf_counter()
        block, what, info = self.build(item)
        init = info.pop("init_block", None)
        p = _Pending(item, block, init, what, info, t0)
        with torch.no_grad():
            for b in [block] if self.variants(item) == 1 else [block, init or block]:
                for bi in range(len(self.held)):
                    x = b(self.held_cache.hidden(bi, item.block))
                    self.stage.give(k, s, self.stage.run_segment(x, s, item.alt.stop), waits)
        if not info.get("bld_steps"):
            p.block = p.init = None  # only a BLD-trained block is saved: free it now
        return p

    @torch.no_grad()
    def _middle(self, k: int, item: Item, s: int, waits: list[Any]) -> None:
        """Item ``k``'s rows through all of segment ``s``."""
        st = self.stage
        for _ in range(self.variants(item)):
            for bi in range(len(self.held)):
                st.give(k, s, st.run_segment(st.take(k, s, self._shape(bi)), s), waits)

    @torch.no_grad()
    def _sum(self, k: int, item: Item) -> torch.Tensor:
        """Rank 0: item ``k``'s final streams summed against the teacher (a ``(variants,
        4)`` float64 tensor: KL, cross-entropy, agreements, positions)."""
        st = self.stage
        rows = []
        for _ in range(self.variants(item)):
            s = Sums()
            for bi, tokens in enumerate(self.held):
                s.add(self.head, st.take(k, st.S, self._shape(bi)),
                      self.held_cache.hidden(bi, st.L), tokens.to(st.device))
            rows.append([s.kl, s.loss, float(s.agree), float(s.n)])
        return torch.tensor(rows, dtype=torch.float64)

    def result(self, p: _Pending, figures: torch.Tensor) -> tuple[dict[str, Any], Any]:
        """The row of a finished alternative and its kept block, from rank 0's figures (as
        :meth:`nas.scoring.core.Scorer.score` decides)."""
        import time

        def metrics(row: torch.Tensor) -> dict[str, Any]:
            kl, loss, agree, n = (float(v) for v in row)
            return {"kl_div": kl / n, "lm_loss_delta": (loss - self.parent_loss_sum) / n,
                    "top1_agreement": agree / n, "tokens": int(n)}

        out = metrics(figures[0])
        block, what = p.block, p.what
        if figures.shape[0] == 2 and p.init is not None:
            before = metrics(figures[1])
            out["kl_before_bld"] = before["kl_div"]
            if before["kl_div"] < out["kl_div"]:
                out, block = {**before, "kl_before_bld": before["kl_div"]}, p.init
                out["bld_kept"] = "init"
                what += "; BLD made it worse on held-out, the initialized block is kept"
            else:
                out["bld_kept"] = "trained"
        out.update(p.info)
        out["init"] = what
        out["seconds"] = time.perf_counter() - p.t0
        return out, block

    def run(self, todo: list[Item], commit: Any, bar: Any) -> None:
        """Score every item of ``todo`` (the same list on every rank): ``commit(item, row,
        block)`` on the item's rank; ``bar.update`` on rank 0 per item summed."""
        st = self.stage
        waits: list[Any] = []
        pending: dict[int, _Pending] = {}   # built here, figures not yet back
        figures: dict[int, torch.Tensor] = {}  # rank 0: summed for its own items
        # rank 0 needs every rank's parent loss for lm_loss_delta: share it once
        pl = torch.tensor([self.parent_loss], dtype=torch.float64)
        dist.broadcast(pl, 0, group=st.side)
        self.parent_loss_sum = float(pl[0])
        order = interleave(todo, lambda it: st.segment_of(it.block))
        firsts = [st.segment_of(it.block) for it in order]
        owners = [st.station_rank(f) for f in firsts]
        S = st.S

        def rank_of(k: int, s: int) -> int:
            return owners[k] if s == S + 1 else st.station_rank(s)

        for k, s in wavefront(st.rank, firsts, S + 1, rank_of):
            item = order[k]
            if s == firsts[k]:
                pending[k] = self._first(k, item, s, waits)
            elif s < S:
                self._middle(k, item, s, waits)
            elif s == S:
                f = self._sum(k, item)
                if owners[k] == 0:
                    figures[k] = f
                else:
                    waits.append((dist.isend(f, owners[k], group=st.side), f))
                bar.update(1, f"block {item.block} {item.alt.label[:28]}")
            else:
                f = figures.pop(k) if st.rank == 0 else \
                    torch.empty((self.variants(item), 4), dtype=torch.float64)
                if st.rank != 0:
                    dist.recv(f, 0, group=st.side)
                row, block = self.result(pending.pop(k), f)
                commit(item, row, block)
            _prune(waits)
        for w, _ in waits:
            w.wait()


def _prune(waits: list[Any]) -> None:
    """Drop the sends that have completed (their buffers with them)."""
    waits[:] = [(w, t) for w, t in waits if not w.is_completed()]
