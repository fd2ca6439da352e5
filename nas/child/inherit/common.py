"""Helpers the per-kind inheritance rules share: top-k indices, least-squares scalars,
copies cast to the child's dtype.
"""

from __future__ import annotations

import torch


def _top(scores: torch.Tensor, k: int) -> torch.Tensor:
    """Indices of the ``k`` largest scores, in increasing index order."""
    return torch.topk(scores.float(), k).indices.sort().values


def _flat(x: torch.Tensor) -> torch.Tensor:
    return x.reshape(-1, x.shape[-1])


def _lsq_scale(y: torch.Tensor, z: torch.Tensor) -> float:
    """The scalar ``s`` minimizing ``||y - s z||^2``."""
    den = float((z.double() * z.double()).sum())
    return float((y.double() * z.double()).sum()) / den if den > 0 else 0.0


def _copy(dst: torch.Tensor, src: torch.Tensor) -> None:
    dst.copy_(src.to(dst.dtype))


def _copy_all(dst: torch.nn.Module, src: torch.nn.Module) -> None:
    """Every tensor of ``src`` into ``dst``'s, in state-dict order (same config, so the same
    layout), cast to ``dst``'s dtype."""
    for (_, d), (_, s) in zip(dst.state_dict(keep_vars=True).items(),
                              src.state_dict(keep_vars=True).items()):
        _copy(d, s)
