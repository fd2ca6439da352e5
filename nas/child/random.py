"""Random initialization of a model: built on the meta device and materialized block by
block in the target dtype (:func:`build_model`); :class:`Materializer` is shared with
:mod:`nas.child.inherit`, which materializes the blocks it does not inherit the same way.

Importing this module needs torch (an optional extra of puzzle-nas).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar, cast

import torch
from torch import nn

from nas.arch import ModelArch
from nas.modules.layers import RMSNorm, default_out_std
from nas.modules.model import Block, CausalLM
from nas.progress import Progress

__all__ = ["INIT_STD", "Materializer", "build_model"]

INIT_STD = 0.02  # CausalLM.reset_parameters' default

_M = TypeVar("_M", bound=nn.Module)


def _real(factory: Callable[[], _M]) -> _M:
    """Construct a module on the CPU without touching the caller's RNG stream (whatever
    default init the constructor draws is overwritten by the caller)."""
    with torch.random.fork_rng(devices=[]), torch.device("cpu"):
        return factory()


class Materializer:
    """Turns a meta-device :class:`CausalLM` into a real one, one piece at a time, drawing
    the random init in exactly the order of :meth:`CausalLM.reset_parameters`."""

    def __init__(self, model: CausalLM, dtype: torch.dtype, std: float = INIT_STD):
        self.model, self.dtype, self.std = model, dtype, std
        self.out_std = default_out_std(len(model.blocks), std)

    def nonblock(self) -> None:
        m, arch = self.model, self.model.arch
        h, v = arch.hidden_size, arch.vocab_size
        emb = _real(lambda: nn.Embedding(v, h))
        nn.init.normal_(emb.weight, std=self.std)
        m.embed = emb.to(self.dtype)
        if m.lm_head is not None:
            head = _real(lambda: nn.Linear(h, v, bias=False))
            nn.init.normal_(head.weight, std=self.std)
            m.lm_head = head.to(self.dtype)
        if m.norm is not None:
            m.norm = _real(lambda: RMSNorm(h, arch.norm_eps, arch.norm_unit_offset)
                           ).to(self.dtype)

    def block(self, i: int, dtype: torch.dtype | None = None) -> Block:
        """Block ``i`` randomly initialized (in float32, then cast to ``dtype``, default the
        target dtype); not yet put into the model.

        Allocated uninitialized (no constructor-time default init to pay for) and set by
        ``reset_parameters``, which sets every parameter and persistent buffer; a block with
        non-persistent buffers (derived values the constructor computes) is constructed for
        real instead.
        """
        arch = self.model.arch
        meta = cast(Block, self.model.blocks[i])  # CausalLM's blocks are Blocks
        if any(getattr(m, "_non_persistent_buffers_set", None) for m in meta.modules()):
            blk = _real(lambda: Block(arch.blocks[i], arch))
        else:
            blk = meta.to_empty(device="cpu")
        blk.reset_parameters(self.std, self.out_std)
        return blk.to(dtype or self.dtype)


def build_model(arch: ModelArch, seed: int | None = 0,
                dtype: torch.dtype = torch.float32, progress: bool | None = None) -> CausalLM:
    """A randomly initialized model of ``arch`` (seeded; ``seed=None`` uses the global RNG).

    Built on the meta device and materialized block by block: each block is initialized in
    float32 and cast to ``dtype``, so the values do not depend on ``dtype`` beyond the cast
    and the peak memory is the model in ``dtype`` plus one block in float32 (a progress bar
    on a terminal, or as ``progress`` says). Stored
    elements match ``arch.param_counts().total`` exactly (MTP blocks are not built).
    """
    with torch.device("meta"):
        model = CausalLM(arch)

    def fill() -> None:
        mat = Materializer(model, dtype)
        mat.nonblock()
        with Progress(len(model.blocks), "build", progress) as bar:
            for i in range(len(model.blocks)):
                model.blocks[i] = mat.block(i)
                bar.update(1)

    if seed is None:
        fill()
    else:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            fill()
    return model
