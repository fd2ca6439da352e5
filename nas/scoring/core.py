"""Replace-1-block scoring: the parent with exactly one block swapped, against the parent.

For every (block ``i``, alternative ``j``) of ``search.alternatives(problem)``:

1. the alternative is built as a :class:`~nas.modules.model.Block` and initialized from
   parent block ``i`` by the rules of :func:`nas.child.inherit.inherit_block` (what
   :func:`nas.child.init_from_parent` does per block), fed the parent's own activations at
   block ``i`` on the calibration rows (seeded random init where no rule applies);
2. optionally trained by blockwise local distillation (:mod:`nas.scoring.bld`);
3. the held-out rows run from the cached parent stream at block ``i``
   (:class:`~nas.scoring.cache.PrefixCache`) through the new block and parent blocks
   ``i+1..L-1``; its next-token distribution ``q`` is compared with the parent's ``p``
   at every position that has a next token:

   * ``kl_div`` = mean over positions of ``KL(p || q)`` (nats), from float64 log-softmax;
   * ``lm_loss_delta`` = mean cross-entropy of the replaced model minus the parent's;
   * ``top1_agreement`` = fraction of positions where both argmaxes agree.

The parent's own alternative scores 0 (and top-1 agreement 1) by definition.
"""

from __future__ import annotations

import copy
import functools
import hashlib
import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import torch

from nas.arch import BlockConfig, ModelArch
from nas.child.inherit import MAX_TOKENS, inherit_block
from nas.kinds import swap_of
from nas.modules.layers import default_out_std
from nas.modules.mamba import MambaMixer
from nas.modules.model import Block, CausalLM
from nas.scoring.bld import train_block
from nas.scoring.cache import PrefixCache
from nas.scoring.data import Split
from nas.scoring.digest import code_digest, weights_digest  # noqa: F401  (re-exported)
from nas.scoring.job import Settings, check_parent  # noqa: F401  (re-exported)
from nas.space import Alternative

VERSION = "replace-1-block v3"  # part of every key: bump when the numerics change



@dataclass(frozen=True)
class Item:
    """One unit of work: block ``alt.block`` replaced by ``alt.child``."""

    alt: Alternative
    parent_block: BlockConfig
    key: str
    recipe: str | None = None
    """Precision recipe the block's weights are fake-quantized with (None: not quantized)."""

    @property
    def block(self) -> int:
        return self.alt.block

    @property
    def seed(self) -> int:
        return int(self.key[:15], 16)


def make_items(parent: ModelArch, alts: list[list[Alternative]], parent_hash: str,
               data_hash: str, settings: Settings, base_recipe: str | None = None
               ) -> list[Item]:
    """Every non-parent alternative, in block order, with its content key.

    ``base_recipe`` (precision searched per block, ``nas.space.spans``): every alternative's
    weights are fake-quantized with its recipe (this one when it has none), and the parent
    block in this recipe is scored too (it is no longer the unquantized parent)."""
    code = code_digest()
    out = []
    for block_alts in alts:
        for a in block_alts:
            if a.is_parent and base_recipe is None:
                continue
            pb = parent.blocks[a.block]
            recipe = a.recipe if a.recipe is not None else base_recipe
            d = {"version": VERSION, "code": code, "parent": parent_hash, "data": data_hash,
                 "block": a.block, "parent_block": pb.model_dump(),
                 "child": a.child.model_dump(), "settings": settings.model_dump()}
            if recipe is not None:  # keys of the narrow space are unchanged
                d["recipe"] = recipe
            if a.end is not None:
                d["span"] = [a.block, a.end, [c.model_dump() for c in a.blocks]]
            blob = json.dumps(d, sort_keys=True)
            out.append(Item(a, pb, hashlib.sha256(blob.encode()).hexdigest(), recipe))
    return out


@torch.no_grad()
def init_block(parent: CausalLM, i: int, child: BlockConfig, x: torch.Tensor,
               seed: int, block_of: Callable[[int], torch.nn.Module] | None = None
               ) -> tuple[Block, str]:
    """Block ``i`` of the parent replaced by ``child``, initialized from the parent block
    given the parent's residual stream ``x`` entering block ``i`` on calibration tokens
    (the per-block step of :func:`nas.child.init_from_parent`); returns the block and what
    was done. ``block_of(j)`` gives parent block ``j`` when an attention <-> DeltaNet swap
    initializes from another block (default ``parent.blocks[j]``; a pipeline stage that
    does not hold block ``j`` reads it from the checkpoint)."""
    pa = parent.arch
    pc, pb = pa.blocks[i], cast(Block, parent.blocks[i])  # CausalLM's blocks are Blocks
    w = x  # the block's device and compute dtype (a pipeline stage's embedding is on meta)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        cb = Block(child, pa)
        cb.reset_parameters(0.02, default_out_std(pa.num_blocks, 0.02))
    cb = cb.to(device=w.device, dtype=w.dtype)
    if pc == child:
        cb.load_state_dict(pb.state_dict())
        what = "copied"
    elif swap_of(pc, child) is not None:
        from nas.child.inherit import swap_init, swap_source

        j = swap_source(pa, i, child)
        what = (f"random (no parent {child.kind} block of this config)"
                if j is None else swap_init(cb, pb, (block_of or parent.blocks.__getitem__)(j),
                                            j, x))
    elif cb.mixer is None or pb.mixer is None:
        what = inherit_block(pc, pb.mixer, child, cb.mixer, x)
    else:
        assert cb.norm is not None and pb.norm is not None  # a Block with a mixer has a norm
        cb.norm.weight.copy_(pb.norm.weight)
        what = inherit_block(pc, pb.mixer, child, cb.mixer, pb.norm(x))
    if isinstance(pb.mixer, MambaMixer) and isinstance(cb.mixer, MambaMixer):
        cb.mixer.chunk_size = pb.mixer.chunk_size
    cb.eval()
    return cb, what


CHUNK_BYTES = 16 * 2**20
"""Float64 logits per chunk of positions when a score is summed (:func:`kl_sums`)."""


class Sums:
    """Float64 running sums of the three metrics over held-out positions."""

    def __init__(self) -> None:
        self.kl = 0.0
        self.loss = 0.0
        self.agree = 0
        self.n = 0

    def add(self, logits: Callable[[torch.Tensor], torch.Tensor], hq: torch.Tensor,
            ht: torch.Tensor, targets: torch.Tensor) -> None:
        """Add one held-out batch: ``hq`` the replaced model's and ``ht`` the parent's
        last residual stream ``(rows, length, hidden)``, ``logits`` the parent's final norm
        and LM head, ``targets`` the batch's token ids (:func:`kl_sums`)."""
        kl, loss, agree, n = kl_sums(logits, hq, ht, targets)
        self.kl += kl
        self.loss += loss
        self.agree += agree
        self.n += n


def kl_sums(logits: Callable[[torch.Tensor], torch.Tensor], hq: torch.Tensor,
            ht: torch.Tensor | None, targets: torch.Tensor, chunk_bytes: int = CHUNK_BYTES
            ) -> tuple[float, float, int, int]:
    """Summed ``KL(p || q)``, cross-entropy of ``q`` on the next tokens, top-1 agreements
    and positions, over every position that has a next token. ``p`` and ``q`` are the
    softmaxes (float64) of ``logits(ht)`` and ``logits(hq)``, computed chunk by chunk over
    positions (at most ``chunk_bytes`` of float64 logits per chunk), so neither side's
    full-vocabulary distribution is ever held for a whole batch. ``ht=None``: the KL and
    agreement terms are 0 (the parent's own loss)."""
    h = hq.shape[-1]
    xq = hq[:, :-1].reshape(-1, h)
    xt = None if ht is None else ht[:, :-1].reshape(-1, h)
    tg = targets[:, 1:].reshape(-1).to(hq.device)
    n = xq.shape[0]
    vocab = int(logits(xq[:1]).shape[-1])
    step = max(1, chunk_bytes // (8 * vocab))
    kl = loss = 0.0
    agree = 0
    for s in range(0, n, step):
        lq = logits(xq[s:s + step]).double().log_softmax(-1)
        loss -= float(lq.gather(-1, tg[s:s + step, None]).sum())
        if xt is not None:
            lt = logits(xt[s:s + step]).double().log_softmax(-1)
            agree += int((lt.argmax(-1) == lq.argmax(-1)).sum())
            lq.neg_().add_(lt)  # log p - log q, in place: one float64 chunk less at a time
            kl += float(torch.dot(lt.exp_().reshape(-1), lq.reshape(-1)))
    return kl, loss, agree, n


def head_of(parent: CausalLM) -> Callable[[torch.Tensor], torch.Tensor]:
    """The parent's final norm and LM head: last residual stream -> logits."""
    if parent.norm is None:
        return parent.logits
    norm = parent.norm
    return lambda h: parent.logits(norm(h))


class Scorer:
    """The parent, its prefix caches on both splits, and the per-item computations."""

    def __init__(self, parent: CausalLM, split: Split, settings: Settings, *,
                 cache_bytes: float = 4 * 2**30, spill_dir: Path | None = None,
                 cached: bool = True):
        self.parent = parent.eval()
        self.settings = settings
        self.cached = cached
        dev = parent.embed.weight.device
        bs = settings.batch_size
        held = torch.as_tensor(split.held, dtype=torch.long)
        calib = torch.as_tensor(split.calib, dtype=torch.long)
        self.held = [held[k:k + bs].to(dev) for k in range(0, len(held), bs)]
        self.calib = [calib[k:k + bs].to(dev) for k in range(0, len(calib), bs)]
        self.init_rows = max(1, MAX_TOKENS // settings.seq_len)
        # the held-out cache's last boundary is the teacher target; in naive mode only it
        # is used
        L = len(parent.blocks)
        self.held_cache = PrefixCache(parent, self.held, max_bytes=cache_bytes,
                                      spill_dir=spill_dir, name="held",
                                      keep=None if cached else {L})
        left = max(0.0, cache_bytes - self.held_cache.mem_bytes)
        self.calib_cache = PrefixCache(parent, self.calib, max_bytes=left,
                                       spill_dir=spill_dir, name="calib") if cached else None
        self.head = head_of(parent)
        with torch.no_grad():
            self.parent_loss = sum(kl_sums(self.head, self.held_cache.hidden(b, L), None,
                                           t)[1] for b, t in enumerate(self.held))
        self.block_of: Callable[[int], torch.nn.Module] | None = None
        """Parent block ``j`` for an attention <-> DeltaNet swap (None: ``parent.blocks``)."""
        self.tokens = sum(t[:, 1:].numel() for t in self.held)

    @property
    def cache_stats(self) -> dict[str, float]:
        out = dict(self.held_cache.stats)
        if self.calib_cache is not None:
            for k, v in self.calib_cache.stats.items():
                out[k] += v
        return out

    def close(self) -> None:
        self.held_cache.close()
        if self.calib_cache is not None:
            self.calib_cache.close()

    # ---- calibration stream --------------------------------------------------------
    @torch.no_grad()
    def calib_stream(self, i: int) -> torch.Tensor:
        """The parent's residual stream entering block ``i`` on every calibration row."""
        if self.calib_cache is not None:
            return self.calib_cache.all_hidden(i)
        outs = []
        for t in self.calib:  # naive: run the prefix again
            x = self.parent.embed_tokens(t)
            for blk in self.parent.blocks[:i]:
                x = blk(x)
            outs.append(x)
        return torch.cat(outs)

    def build(self, item: Item, bld_dir: Path | None = None
              ) -> tuple[Block, str, dict[str, Any]]:
        """The initialized (and, with ``bld_steps``, trained) block of ``item`` (a span
        item: its child blocks, :mod:`nas.scoring.span_scoring`); fake-quantized last when
        the item has a recipe."""
        if item.alt.end is not None:
            from nas.scoring.span_scoring import build_span

            return build_span(self, item, functools.partial(  # type: ignore[return-value]  # build_span's SpanBlocks stands in for a Block (same interface)
                init_block, block_of=self.block_of))
        x = self.calib_stream(item.block)
        block, what = init_block(self.parent, item.block, item.alt.child,
                                 x[: self.init_rows], item.seed, self.block_of)
        info: dict[str, Any] = {"bld_steps": 0, "bld_loss": None}
        # a precision change alone is scored as stored (post-training quantization, no BLD)
        if self.settings.bld_steps and block.mixer is not None \
                and not (item.recipe is not None and item.alt.child == item.parent_block):
            with torch.no_grad():
                y = self.calib_stream(item.block + 1) - x if self.calib_cache is not None \
                    else self.parent.blocks[item.block](x) - x
            init = copy.deepcopy(block)  # BLD keeps the better of the two (:meth:`score`)
            info = train_block(block, x, y, self.settings, item.seed)
            if info["bld_steps"]:
                info["init_block"] = init
        if item.recipe is not None:
            from costmodels.dtypes import get_recipe
            from nas.scoring.fakequant import quantize_block

            for b in (block, info.get("init_block")):
                if b is not None:
                    quantize_block(b, get_recipe(item.recipe))
            what += f"; weights as {item.recipe}"
        return block, what, info

    # ---- held-out evaluation -------------------------------------------------------
    @torch.no_grad()
    def evaluate(self, item: Item, block: Block) -> dict[str, float]:
        """The three metrics of the parent with block ``item.block`` replaced by ``block``."""
        p = self.parent
        i = item.block
        s = Sums()
        for b, tokens in enumerate(self.held):
            if self.cached:
                x = self.held_cache.hidden(b, i)
            else:
                x = p.embed_tokens(tokens)
                for blk in p.blocks[:i]:
                    x = blk(x)
            x = block(x)
            for blk in p.blocks[item.alt.stop:]:  # after the replaced block (or span)
                x = blk(x)
            s.add(self.head, x, self.held_cache.hidden(b, len(p.blocks)), tokens)
        return {"kl_div": s.kl / s.n, "lm_loss_delta": (s.loss - self.parent_loss) / s.n,
                "top1_agreement": s.agree / s.n, "tokens": s.n}

    def score(self, item: Item) -> tuple[dict[str, Any], Block]:
        """The metrics of ``item`` and its block. After BLD the initialized block is scored
        too and the better of the two on the held-out split is kept (BLD never returns a
        block worse than the one it started from): ``kl_before_bld`` is the initialized
        block's KL, ``bld_kept`` ``"trained"`` or ``"init"``."""
        t0 = time.perf_counter()
        block, what, info = self.build(item)
        init = info.pop("init_block", None)
        out: dict[str, Any] = self.evaluate(item, block)  # and the strings below
        if init is not None:
            before = self.evaluate(item, init)
            out["kl_before_bld"] = before["kl_div"]
            if before["kl_div"] < out["kl_div"]:
                out, block = {**before, "kl_before_bld": before["kl_div"]}, init
                out["bld_kept"] = "init"
                what += "; BLD made it worse on held-out, the initialized block is kept"
            else:
                out["bld_kept"] = "trained"
        out.update(info)
        out["init"] = what
        out["seconds"] = time.perf_counter() - t0
        return out, block
