"""Attention <-> DeltaNet swaps: the swapped-in block copied from the nearest parent block
of that exact config, its output projection scaled by the least-squares scalar.
"""

from __future__ import annotations

import torch

from nas.arch import (
    BlockConfig,
    ModelArch,
)
from nas.child.inherit.common import _copy_all, _flat, _lsq_scale


def _branch(b: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
    """``mixer(norm(x))`` of block ``b`` (attention or DeltaNet: it has both)."""
    mixer, norm = b.mixer, b.norm
    assert isinstance(mixer, torch.nn.Module) and isinstance(norm, torch.nn.Module)
    return mixer(norm(x))


def _swap_scale(pb: torch.nn.Module, cb: torch.nn.Module, x: torch.Tensor) -> float:
    """Scale the copied block's output projection by the least-squares scalar ``s`` that best
    maps its output onto the replaced parent block's on the calibration activations ``x``
    (so the swapped block is never worse than a no-op there: ``s = 0`` is one choice)."""
    y = _branch(pb, x)
    yc = _branch(cb, x)
    s = _lsq_scale(_flat(y), _flat(yc))
    mixer = cb.mixer
    assert isinstance(mixer, torch.nn.Module)
    out = mixer.o_proj if hasattr(mixer, "o_proj") else mixer.out_proj
    assert isinstance(out, torch.nn.Linear)  # attention's o_proj, DeltaNet's out_proj
    out.weight.mul_(s)
    if out.bias is not None:
        out.bias.mul_(s)
    return s


def swap_init(cb: torch.nn.Module, pb: torch.nn.Module, src: torch.nn.Module, j: int,
              x: torch.Tensor) -> str:
    """Child block ``cb`` (attention <-> DeltaNet swapped in for parent block ``pb``) as a copy
    of parent block ``src`` (block ``j``, :func:`swap_source`), its output projection scaled
    by :func:`_swap_scale` on the residual stream ``x`` entering ``pb``; what was done."""
    _copy_all(cb, src)
    return f"swap: copied from parent block {j} (output scale {_swap_scale(pb, cb, x):.3g})"


def swap_source(parent: ModelArch, i: int, cc: BlockConfig) -> int | None:
    """For an attention <-> DeltaNet swap at block ``i``: the nearest parent block whose
    config equals the child's (ties to the earlier one), or None."""
    same = [j for j, b in enumerate(parent.blocks) if b == cc]
    return min(same, key=lambda j: (abs(j - i), j)) if same else None
