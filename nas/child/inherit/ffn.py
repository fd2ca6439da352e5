"""Inheritance rules for FFN blocks: narrower FFN (channel contribution), FFN -> linear,
and the least-squares linear fit any block -> linear uses.
"""

from __future__ import annotations

import torch

from nas.arch import (
    FFN,
)
from nas.child.inherit.common import _copy, _flat, _lsq_scale, _top
from nas.modules.layers import FFNMixer, LinearMixer


def _ffn_channels(p: FFNMixer, c: FFNMixer, keep: torch.Tensor) -> None:
    """Copy channels ``keep`` of ``p`` into the first channels of ``c``; zero the rest's
    output weights."""
    k = len(keep)
    mats = ["up_proj"] + (["gate_proj"] if p.cfg.gated else [])
    for name in mats:
        pl, cl = getattr(p, name), getattr(c, name)
        _copy(cl.weight[:k], pl.weight[keep])
        if pl.bias is not None and cl.bias is not None:
            _copy(cl.bias[:k], pl.bias[keep])
    _copy(c.down_proj.weight[:, :k], p.down_proj.weight[:, keep])
    c.down_proj.weight[:, k:] = 0
    if p.down_proj.bias is not None and c.down_proj.bias is not None:
        _copy(c.down_proj.bias, p.down_proj.bias)


def _ffn(p: FFNMixer, c: FFNMixer, pc: FFN, cc: FFN, xin: torch.Tensor) -> str:
    if (pc.gated, pc.activation) != (cc.gated, cc.activation):
        return "random (FFN gating or activation differs)"
    if cc.width >= pc.width:
        _ffn_channels(p, c, torch.arange(pc.width, device=xin.device))
        return "copied" if cc.width == pc.width else f"width {pc.width} -> {cc.width} (zero-grown)"
    acts = _flat(p.intermediate(xin))
    score = acts.abs().float().mean(0) * p.down_proj.weight.float().norm(dim=0)
    _ffn_channels(p, c, _top(score, cc.width))
    return f"width {pc.width} -> {cc.width} by channel contribution"


def _ffn_to_linear(p: FFNMixer, c: LinearMixer, xin: torch.Tensor) -> str:
    w = p.down_proj.weight.double() @ p.up_proj.weight.double()
    s = _lsq_scale(_flat(p(xin)), _flat(xin) @ w.t().to(xin.dtype))
    _copy(c.linear.weight, s * w)
    return f"linear from W_down @ W_up (scale {s:.3g})"


def _lstsq_linear(p: torch.nn.Module, c: LinearMixer, xin: torch.Tensor, kind: str) -> str:
    x = _flat(xin).double()
    y = _flat(p(xin)).double()
    h = x.shape[1]
    ridge = 1e-4 * float((x * x).sum()) / max(x.numel(), 1)
    gram = x.t() @ x + ridge * x.shape[0] * torch.eye(h, dtype=torch.float64, device=x.device)
    w = torch.linalg.solve(gram, x.t() @ y).t()
    _copy(c.linear.weight, w)
    return f"linear by least squares on the {kind} output"
