"""Replace-1-span scoring: a span of parent blocks replaced by its child blocks (nas.space.spans).

Works as replace-1-block (:mod:`nas.scoring.core`): the span's child blocks are initialized
from the parent, optionally trained by blockwise local distillation, and the held-out rows
run from the parent's stream entering the span through the child blocks and the parent
blocks after it.

* **Init from parent**: each child block takes the place of the first parent block of its
  kind in the span not yet taken (in order) and is initialized from it by
  :func:`nas.scoring.core.init_block` (the builder's rules), fed the parent's own stream
  entering that parent block; a removed span is the identity.
* **BLD for a span**: the child blocks are trained together to map the span's input ``x``
  to the span's output: normalized MSE ``||f(x) - x - y||^2 / ||y||^2`` with
  ``y = parent_span(x) - x``, AdamW with the scoring settings (steps, lr, rows per step,
  rows sampled by a generator seeded from the result's key), as single-block BLD does.
* Precision: the span's blocks are fake-quantized as their recipe stores them (after BLD).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from costmodels.dtypes import get_recipe
from nas.scoring.bld import train_residual
from nas.scoring.fakequant import quantize_block


class SpanBlocks(torch.nn.Module):
    """The child blocks of a span, run in order (a residual stream in, one out)."""

    def __init__(self, blocks: list[torch.nn.Module]) -> None:
        super().__init__()
        self.blocks = torch.nn.ModuleList(blocks)
        self.mixer = None  # no single mixer: nas.scoring.core trains spans here

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for b in self.blocks:
            x = b(x)
        return x


def train_span(m: SpanBlocks, x: torch.Tensor, y: torch.Tensor, settings: Any,
               seed: int) -> dict[str, Any]:
    """BLD of a whole span in place (see the module doc); returns ``bld_steps`` and the
    final normalized MSE on all rows."""
    return train_residual(m, lambda t: m(t) - t, x, y, settings, seed)


@torch.no_grad()
def build_span(scorer: Any, item: Any, init_block: Callable[..., tuple[torch.nn.Module, str]]
               ) -> tuple[SpanBlocks, str, dict[str, Any]]:
    """The initialized (and, with ``bld_steps``, trained) child blocks of a span item of a
    :class:`nas.scoring.core.Scorer`, each block initialized by ``init_block`` (core's:
    parent, block index, child, stream, seed -> block, what); returns ``(module, what was
    done, BLD info)``."""
    parent = scorer.parent
    i, end = item.alt.block, item.alt.stop
    x = scorer.calib_stream(i)
    # the parent's stream entering each block of the span, and leaving it
    streams = [x]
    for j in range(i, end):
        streams.append(parent.blocks[j](streams[-1]))
    taken: set[int] = set()
    blocks, what = [], []
    for k, c in enumerate(item.alt.blocks):
        j = next(j for j in range(i, end) if j not in taken
                 and parent.arch.blocks[j].kind == c.kind)
        taken.add(j)
        b, w = init_block(parent, j, c, streams[j - i][: scorer.init_rows], item.seed + k)
        blocks.append(b)
        what.append(f"{k}<-{j}: {w}")
    m = SpanBlocks(blocks).eval()
    info: dict[str, Any] = {"bld_steps": 0, "bld_loss": None}
    if scorer.settings.bld_steps and blocks:
        info = train_span(m, x, streams[-1] - x, scorer.settings, item.seed)
    if item.recipe is not None:
        r = get_recipe(item.recipe)
        for b in blocks:
            quantize_block(b, r)
    return m, ("; ".join(what) or "removed"), info
