"""Inheritance rules for Mamba-2 blocks: fewer heads (per group, by the gated norm output's
contribution into ``out_proj``) and a smaller state (per group, by SSM output energy).
"""

from __future__ import annotations

import torch

from nas.arch import (
    Mamba,
)
from nas.child.inherit.common import _copy, _flat, _top
from nas.modules.mamba import MambaMixer, ssd_chunked


def _mamba(p: MambaMixer, c: MambaMixer, pc: Mamba, cc: Mamba, xin: torch.Tensor) -> str:
    if (pc.head_dim, pc.n_groups, pc.conv_kernel) != (cc.head_dim, cc.n_groups, cc.conv_kernel):
        return "random (head_dim, n_groups or conv kernel differs)"
    if cc.num_heads > pc.num_heads or cc.state_size > pc.state_size:
        return "random (more heads or a larger state than the parent)"
    G, P = pc.n_groups, pc.head_dim
    Hp, Hc, Np, Nc = pc.num_heads, cc.num_heads, pc.state_size, cc.state_size
    hpg, hcg = Hp // G, Hc // G
    notes = []
    dev = xin.device
    heads = torch.arange(Hp, device=dev)
    states = [torch.arange(Np, device=dev) for _ in range(G)]
    if Hc < Hp or Nc < Np:
        s = p.ssm_inputs(xin)
    if Hc < Hp:
        y, _ = ssd_chunked(s["x"], s["dt"], s["A"], s["B"], s["C"], p.chunk_size)
        y = (y + s["x"].float() * p.D.float()[:, None]).reshape(*xin.shape[:-1], -1)
        g = _flat(p.gated_norm(y.to(xin.dtype), s["z"]))
        ch = g.abs().float().mean(0) * p.out_proj.weight.float().norm(dim=0)
        hs = ch.view(Hp, P).sum(-1).view(G, hpg)
        heads = torch.cat([gi * hpg + _top(hs[gi], hcg) for gi in range(G)])
        notes.append(f"heads {Hp} -> {Hc} by channel contribution")
    if Nc < Np:
        energy = torch.empty(Hp, Np, device=dev)
        for n in range(Np):
            yn, _ = ssd_chunked(s["x"], s["dt"], s["A"], s["B"][..., n:n + 1],
                                s["C"][..., n:n + 1], p.chunk_size)
            energy[:, n] = yn.pow(2).sum(-1).mean(dim=(0, 1))
        kept = torch.zeros(Hp, dtype=torch.bool, device=dev)
        kept[heads] = True
        per_group = (energy * kept[:, None]).view(G, hpg, Np).sum(1)
        states = [_top(per_group[gi], Nc) for gi in range(G)]
        notes.append(f"state {Np} -> {Nc} by SSM output energy per state channel")
    inner_p = Hp * P
    iidx = (heads[:, None] * P + torch.arange(P, device=dev)).reshape(-1)
    bidx = torch.cat([gi * Np + states[gi] for gi in range(G)])
    conv_idx = torch.cat([iidx, inner_p + bidx, inner_p + G * Np + bidx])
    rows = torch.cat([iidx, inner_p + conv_idx, 2 * inner_p + 2 * G * Np + heads])
    _copy(c.in_proj.weight, p.in_proj.weight[rows])
    if p.in_proj.bias is not None and c.in_proj.bias is not None:
        _copy(c.in_proj.bias, p.in_proj.bias[rows])
    _copy(c.conv1d.weight, p.conv1d.weight[conv_idx])
    if p.conv1d.bias is not None and c.conv1d.bias is not None:
        _copy(c.conv1d.bias, p.conv1d.bias[conv_idx])
    for name in ("dt_bias", "A_log", "D"):
        _copy(getattr(c, name), getattr(p, name)[heads])
    if hasattr(p, "norm") and hasattr(c, "norm"):  # (Falcon-H1's may have no norm weight)
        _copy(c.norm.weight, p.norm.weight[iidx])
    _copy(c.out_proj.weight, p.out_proj.weight[:, iidx])
    if p.out_proj.bias is not None and c.out_proj.bias is not None:
        _copy(c.out_proj.bias, p.out_proj.bias)
    return "; ".join(notes) or "copied (mamba flags changed)"
