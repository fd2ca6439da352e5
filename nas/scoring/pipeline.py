"""Scoring with the parent sharded over ranks: contiguous ranges of blocks as pipeline stages.

``puzzle-nas score --nproc N`` (the default for ``N > 1``; ``--replicas`` loads the whole
parent on every rank instead). Rank ``r`` reads only its share of the parent's tensors
from the safetensors files, one submodule at a time: blocks ``a_r..b_r-1`` and, on rank 0,
the embedding, final norm and LM head. No rank ever holds the whole parent.

* **Stages** (:func:`nas.scoring.stages.stage_bounds`): the blocks are cut into ``N`` contiguous ranges that
  minimize the largest rank's share of memory (parameters) and of work (each block's
  parameters times the number of alternatives whose held-out rows run through it, plus the
  LM head of every alternative, teacher and student, on rank 0), the larger of the two
  shares counting. A span of blocks replaced together never crosses a cut.
* **Prefix cache per stage**: the parent runs once as a pipeline (rank ``r`` receives the
  residual stream entering its first block from ``r-1`` and sends the one leaving its
  last block to ``r+1``); each rank keeps only the boundaries of its own blocks, and rank
  0 keeps the teacher target, the last boundary of the held-out rows (the log-probabilities
  are recomputed from it when a score is summed: :func:`nas.scoring.core.kl_sums`).
* **Work flows to the blocks**: an alternative of block ``i`` is built, initialized and
  BLD-trained on the rank that holds block ``i``, from that rank's cached stream; its
  held-out rows then run through the new block and the rest of that stage, are sent
  through the later stages, and rank 0 sums the KL. Rank 0 sends the figures back to the
  block's rank, which keeps the better of the BLD-trained and initialized blocks and
  commits the row to its own store. Every rank walks the same list of alternatives in the
  same order, so each point-to-point message is matched in order (sends are asynchronous,
  so a rank works ahead while the later stages finish the previous alternative).

Scores equal the single-process ones (:class:`nas.scoring.core.Scorer`) within float
tolerance: the same modules run on the same inputs, only in other processes.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist

from nas.build.checkpoint import CheckpointReader
from nas.modules.model import Block, CausalLM
from nas.scoring.cache import PrefixCache
from nas.scoring.core import MAX_TOKENS, Item, Scorer, Sums, head_of
from nas.scoring.digest import combine_lines, tensor_line
from nas.scoring.job import Settings


@dataclass
class _Pending:
    """An alternative built on this rank, waiting for rank 0's figures."""

    k: int
    item: Item
    block: torch.nn.Module | None
    init: torch.nn.Module | None
    what: str
    info: dict[str, Any]
    t0: float
    figures: torch.Tensor | None = None
    waits: list[Any] = field(default_factory=list)


class Stage:
    """This rank's share of a sharded parent and the pipeline that scores through it."""

    def __init__(self, reader: CheckpointReader, bounds: list[tuple[int, int]], rank: int,
                 settings: Settings, dtype: torch.dtype | None, device: str, side: Any,
                 hash_weights: bool = True):
        self.reader, self.bounds, self.rank, self.world = reader, bounds, rank, len(bounds)
        self.a, self.b = bounds[rank]
        self.L = reader.arch.num_blocks
        self.settings = settings
        self.dtype = dtype or reader.stored_dtype()
        self.device = torch.device(device)
        self.model: CausalLM = reader.model
        names = [f"blocks.{i}" for i in range(self.a, self.b)]
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

    # ---- point to point ---------------------------------------------------------------
    def _recv(self, src: int, shape: tuple[int, ...]) -> torch.Tensor:
        t = torch.empty(shape, dtype=self.dtype, device=self.device)
        dist.recv(t, src)
        return t

    def _send(self, t: torch.Tensor, dst: int, waits: list[Any]) -> None:
        t = t.contiguous()
        waits.append((dist.isend(t, dst), t))

    def _run_own(self, x: torch.Tensor, start: int) -> torch.Tensor:
        for j in range(start, self.b):
            x = self.model.blocks[j](x)
        return x

    def _block_of(self, j: int) -> torch.nn.Module:
        """Parent block ``j``: this rank's, or read from the checkpoint for the moment."""
        if self.a <= j < self.b:
            return self.model.blocks[j]
        with torch.device("meta"):
            blk = Block(self.reader.arch.blocks[j], self.reader.arch)
        keys = {k for k in self.reader._shapes if k.startswith(f"blocks.{j}.")}
        sd = self.reader.tensors(keys, self.dtype)
        self.reader.close()
        blk.load_state_dict({k[len(f"blocks.{j}."):]: v for k, v in sd.items()}, assign=True)
        return blk.to(self.device).eval()

    # ---- the parent, once ---------------------------------------------------------------
    @torch.no_grad()
    def fill(self, batches: list[torch.Tensor], *, held: bool, max_bytes: float,
             spill_dir: Any, name: str) -> PrefixCache:
        """Run the parent on ``batches`` through the pipeline; keep this stage's boundaries
        (held-out: the inputs of its blocks; calibration: also the last one, BLD's target),
        and on rank 0 the held-out teacher target."""
        cache = PrefixCache(None, batches, max_bytes=max_bytes, spill_dir=spill_dir,
                            name=name, device=self.device)
        keep = set(range(self.a, self.b + (0 if held else 1)))
        h = self.reader.arch.hidden_size
        waits: list[Any] = []
        last = self.world - 1
        for bi, tokens in enumerate(batches):
            shape = (tokens.shape[0], tokens.shape[1], h)
            x = self.model.embed_tokens(tokens.to(self.device)) if self.rank == 0 else \
                self._recv(self.rank - 1, shape)
            out = {}
            for j in range(self.a, self.b):
                if j in keep:
                    out[f"h{j}"] = x
                x = self.model.blocks[j](x)
            if self.b in keep:
                out[f"h{self.b}"] = x
            if self.rank < last:
                self._send(x, self.rank + 1, waits)
            elif held:
                if self.rank == 0:
                    out[f"h{self.L}"] = x
                else:
                    self._send(x, 0, waits)
            cache.add(bi, out)
        if held and self.rank == 0 and last > 0:
            for bi, tokens in enumerate(batches):
                t = self._recv(last, (tokens.shape[0], tokens.shape[1], h))
                cache.add(bi, {f"h{self.L}": t})
        for w, _ in waits:
            w.wait()
        return cache


class PipelineScorer(Scorer):
    """A :class:`~nas.scoring.core.Scorer` over one :class:`Stage`: it builds (and BLD-trains)
    the alternatives of this rank's blocks from its own cached streams; :meth:`run` walks
    every alternative through the pipeline."""

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
        return next(r for r, (a, b) in enumerate(self.stage.bounds) if a <= item.block < b)

    def variants(self, item: Item) -> int:
        """How many blocks of ``item`` are evaluated (2: the BLD-trained and the initialized
        one), decided alike on every rank."""
        s = self.settings
        if not s.bld_steps or (item.recipe is not None and item.alt.child == item.parent_block):
            return 1
        if item.alt.end is not None:
            return 1  # a span keeps its trained blocks (nas.scoring.span_scoring)
        return 1 if item.alt.child.kind == "noop" else 2

    @torch.no_grad()
    def _through(self, item: Item, block: torch.nn.Module | None, waits: list[Any]) -> None:
        """This rank's part of one evaluation of ``item``: from the cache through ``block``
        (the block's own rank) or from the previous stage (a later rank), through the rest
        of this stage, and on to the next rank (the last rank: to rank 0, which sums)."""
        st = self.stage
        o, r, last = self.owner(item), st.rank, st.world - 1
        h = st.reader.arch.hidden_size
        for bi, tokens in enumerate(self.held):
            if r == o:
                x = st._run_own(block(self.held_cache.hidden(bi, item.block)),  # type: ignore[misc]  # block is given to the rank that owns the item (r == o)
                                item.alt.stop)
            else:
                x = st._run_own(st._recv(r - 1, (tokens.shape[0], tokens.shape[1], h)), st.a)
            st._send(x, r + 1 if r < last else 0, waits)

    def start(self, k: int, item: Item, waits: list[Any]) -> _Pending | None:
        """Build this rank's alternative (when it holds the block) and send its rows on."""
        import time

        st = self.stage
        o = self.owner(item)
        pend = None
        blocks: list[torch.nn.Module | None]
        if st.rank == o:
            t0 = time.perf_counter()
            block, what, info = self.build(item)
            init = info.pop("init_block", None)
            pend = _Pending(k, item, block, init, what, info, t0)
            blocks = [block] if self.variants(item) == 1 else [block, init or block]
        else:
            blocks = [None] * self.variants(item)
        if st.rank >= o:
            for b in blocks:
                self._through(item, b, waits)
        if pend is not None and not pend.info.get("bld_steps"):
            pend.block = pend.init = None  # only a BLD-trained block is saved: free it now
        return pend

    def finish(self, item: Item) -> torch.Tensor | None:
        """Rank 0: receive ``item``'s final streams and sum its figures (a ``(variants,
        4)`` float64 tensor: KL, cross-entropy, agreements, positions)."""
        st = self.stage
        if st.rank != 0:
            return None
        rows = []
        for _ in range(self.variants(item)):
            s = Sums()
            self._recv_only(item, s)
            rows.append([s.kl, s.loss, float(s.agree), float(s.n)])
        return torch.tensor(rows, dtype=torch.float64)

    @torch.no_grad()
    def _recv_only(self, item: Item, s: Sums) -> None:
        st = self.stage
        h = st.reader.arch.hidden_size
        for bi, tokens in enumerate(self.held):
            hq = st._recv(st.world - 1, (tokens.shape[0], tokens.shape[1], h))
            s.add(self.head, hq, self.held_cache.hidden(bi, st.L), tokens.to(st.device))

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
        block)`` on the item's rank; ``bar.update`` on rank 0 per item finished."""
        st = self.stage
        waits: list[Any] = []
        mine: deque[_Pending] = deque()   # built here, figures not yet back
        queue: deque[Item] = deque()      # rank 0: started, not yet summed
        # rank 0 needs every rank's parent loss for lm_loss_delta: share it once
        pl = torch.tensor([self.parent_loss], dtype=torch.float64)
        dist.broadcast(pl, 0, group=st.side)
        self.parent_loss_sum = float(pl[0])

        def land(p: _Pending, figures: torch.Tensor) -> None:
            row, block = self.result(p, figures)
            commit(p.item, row, block)

        def collect(upto: int) -> None:
            """Figures of this rank's items older than ``upto`` from rank 0."""
            while mine and mine[0].k < upto:
                p = mine.popleft()
                if st.rank == 0:
                    assert p.figures is not None
                    land(p, p.figures)
                else:
                    f = torch.empty((self.variants(p.item), 4), dtype=torch.float64)
                    dist.recv(f, 0, group=st.side)
                    land(p, f)

        def summed(item: Item) -> None:
            f = self.finish(item)
            assert f is not None
            o = self.owner(item)
            if o == 0:
                next(p for p in mine if p.item is item).figures = f
            else:
                self._send_figures(f, o, waits)
            bar.update(1, f"block {item.block} {item.alt.label[:28]}")

        for k, item in enumerate(todo):
            p = self.start(k, item, waits)
            if p is not None:
                mine.append(p)
            if st.rank == 0:
                queue.append(item)
                while len(queue) > 1:  # one item ahead: the later stages stay busy
                    summed(queue.popleft())
            collect(k - 1)
            _prune(waits)
        if st.rank == 0:
            while queue:
                summed(queue.popleft())
        collect(len(todo))
        for w, _ in waits:
            w.wait()

    def _send_figures(self, f: torch.Tensor, dst: int, waits: list[Any]) -> None:
        waits.append((dist.isend(f.contiguous(), dst, group=self.stage.side), f))


def _prune(waits: list[Any]) -> None:
    """Drop the sends that have completed (their buffers with them)."""
    waits[:] = [(w, t) for w, t in waits if not w.is_completed()]
