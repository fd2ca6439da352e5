"""Inheritance rules for Gated DeltaNet blocks: fewer value heads, fewer query/key heads
(key groups with the largest summed value-head scores).
"""

from __future__ import annotations

import torch

from nas.arch import DeltaNet
from nas.child.inherit.common import _copy, _top
from nas.modules.deltanet import DeltaNetMixer


def inherit_deltanet(p: DeltaNetMixer, c: DeltaNetMixer, pc: DeltaNet, cc: DeltaNet,
              xin: torch.Tensor) -> str:
    if (pc.head_k_dim, pc.head_v_dim, pc.conv_kernel) != \
            (cc.head_k_dim, cc.head_v_dim, cc.conv_kernel):
        return "random (head sizes or conv kernel differ)"
    kp, vp, kc, vc = pc.num_k_heads, pc.num_v_heads, cc.num_k_heads, cc.num_v_heads
    rp, rc = vp // kp, vc // kc
    if kc > kp or vc > vp or rc > rp:
        return "random (more heads, or more value heads per key head, than the parent)"
    dk, dv = pc.head_k_dim, pc.head_v_dim
    dev = xin.device
    y = p.gated_output(xin)  # b n vp dv
    w_out = p.out_proj.weight.float().view(-1, vp, dv)
    score = (y.abs().float().mean(dim=(0, 1)) * w_out.norm(dim=0)).sum(-1)  # vp
    groups = _top(score.view(kp, rp).sum(-1), kc)
    local = [_top(score.view(kp, rp)[g], rc) for g in groups.tolist()]
    ar_k, ar_v = torch.arange(dk, device=dev), torch.arange(dv, device=dev)
    stride = 2 * dk + 2 * rp * dv
    rows, ba_b, ba_a, vheads = [], [], [], []
    for g, loc in zip(groups.tolist(), local):
        base = g * stride
        vch = (loc[:, None] * dv + ar_v).reshape(-1).to(dev)
        rows += [base + ar_k, base + dk + ar_k, base + 2 * dk + vch,
                 base + 2 * dk + rp * dv + vch]
        ba_b.append(g * 2 * rp + loc.to(dev))
        ba_a.append(g * 2 * rp + rp + loc.to(dev))
        vheads.append(g * rp + loc.to(dev))
    heads = torch.cat(vheads)
    kch = (groups.to(dev)[:, None] * dk + ar_k).reshape(-1)
    vch_all = (heads[:, None] * dv + ar_v).reshape(-1)
    conv_idx = torch.cat([kch, kp * dk + kch, 2 * kp * dk + vch_all])
    if p.split != c.split:
        return "random (projection layouts differ)"
    if p.split:  # Qwen3.5: [q | k | v] rows as in the conv, z per value channel, b / a per head
        _copy(c.in_proj_qkv.weight, p.in_proj_qkv.weight[conv_idx])
        _copy(c.in_proj_z.weight, p.in_proj_z.weight[vch_all])
        _copy(c.in_proj_b.weight, p.in_proj_b.weight[heads])
        _copy(c.in_proj_a.weight, p.in_proj_a.weight[heads])
    else:  # Qwen3-Next: in_proj rows grouped per key head, [q | k | v | z] and [b | a]
        _copy(c.in_proj_qkvz.weight, p.in_proj_qkvz.weight[torch.cat(rows)])
        _copy(c.in_proj_ba.weight, p.in_proj_ba.weight[torch.cat(
            [torch.cat([b, a]) for b, a in zip(ba_b, ba_a)])])
    _copy(c.conv1d.weight, p.conv1d.weight[conv_idx])
    for name in ("dt_bias", "A_log"):
        _copy(getattr(c, name), getattr(p, name)[heads])
    _copy(c.norm.weight, p.norm.weight)
    _copy(c.out_proj.weight, p.out_proj.weight[:, vch_all])
    notes = []
    if kc < kp:
        notes.append(f"key heads {kp} -> {kc} by summed value-head contribution")
    if vc < vp:
        notes.append(f"value heads {vp} -> {vc} by channel contribution")
    return "; ".join(notes) or "copied"
