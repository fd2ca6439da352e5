"""Init from parent for a child with spans (``nas.space.spans``): a shorter child built from its
parent with the builder's own rules.

Each child block stands in for one parent block (:func:`nas.space.spans.stand_in`: the first of
its kind in its span). The child is laid out at the parent's depth with those blocks in
their parent's places and no-ops elsewhere, initialized by
:func:`nas.child.init_from_parent` (each block fed the parent's own stream entering its
place, the rules of ``nas.child.inherit``), and the no-ops are dropped: the child's blocks,
embeddings, final norm and head are exactly those tensors. Parameter counts are the
child architecture's (the no-ops have none).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from hwprofiles.errors import InputError
from nas.arch import ModelArch, NoOp
from nas.child import init_from_parent
from nas.child.checkpoint import CheckpointReader
from nas.modules.model import CausalLM


def expanded(child: ModelArch, parent: ModelArch, positions: Sequence[int]) -> ModelArch:
    """``child`` at the parent's depth: block ``k`` at ``positions[k]``, no-ops elsewhere."""
    if len(positions) != child.num_blocks:
        raise InputError(f"{len(positions)} parent positions for {child.num_blocks} child "
                         "blocks", field="positions")
    if list(positions) != sorted(set(positions)) or (positions and (
            positions[0] < 0 or positions[-1] >= parent.num_blocks)):
        raise InputError("parent positions must increase strictly inside the parent's "
                         f"{parent.num_blocks} blocks", field="positions")
    blocks: list[Any] = [NoOp()] * parent.num_blocks
    for k, j in enumerate(positions):
        blocks[j] = child.blocks[k]
    return child.replace_blocks(blocks)


@torch.no_grad()
def init_from_parent_spans(child: ModelArch, positions: Sequence[int],
                           parent_model: CausalLM | CheckpointReader | str | Path,
                           calibration_tokens: torch.Tensor | list, seed: int = 0,
                           dtype: torch.dtype | None = None, progress: bool | None = None
                           ) -> CausalLM:
    """A :class:`CausalLM` of ``child`` (fewer blocks than the parent) whose block ``k`` is
    initialized from parent block ``positions[k]`` (see the module doc); ``init_report``
    says what happened to each block."""
    if isinstance(parent_model, (CausalLM, CheckpointReader)):
        pa = parent_model.arch
    else:
        parent_model = CheckpointReader(parent_model)  # opened once, handed to the init
        pa = parent_model.arch
    wide = init_from_parent(expanded(child, pa, positions), parent_model, calibration_tokens,
                            seed=seed, dtype=dtype, progress=progress)
    with torch.device("meta"):
        out = CausalLM(child)
    out.embed = wide.embed
    out.norm = wide.norm
    out.lm_head = wide.lm_head
    out.blocks = torch.nn.ModuleList([wide.blocks[j] for j in positions])
    rep = wide.init_report  # init_from_parent sets it
    out.init_report = [f"child block {k} <- {rep[j]}"
                       for k, j in enumerate(positions)]
    return out
