"""Inheritance rules for MoE blocks: fewer experts (ranked by the output change when one
expert is masked), narrower experts / shared expert (channel contribution), other top-k
(weights kept); gpt-oss biases (the router bias follows the kept experts; each kept
expert's gate / up biases follow its kept channels and its down bias is copied).
"""

from __future__ import annotations

import torch

from nas.arch import (
    MoE,
)
from nas.child.inherit.common import _copy, _flat, _top
from nas.child.inherit.ffn import _ffn
from nas.modules.gpt_oss import GptOssMoEMixer
from nas.modules.moe import MoEMixer


def _moe(p: MoEMixer, c: MoEMixer, pc: MoE, cc: MoE, xin: torch.Tensor) -> str:
    if (pc.gated, pc.activation, pc.latent_size, pc.router) != \
            (cc.gated, cc.activation, cc.latent_size, cc.router):
        return "random (expert gating, activation, latent size or router differs)"
    x = _flat(xin)
    notes = []
    ep, ec = pc.num_experts, cc.num_experts
    if ec < ep:
        y = p(x)
        score = torch.empty(ep, device=x.device)
        for e in range(ep):
            mask = torch.zeros(ep, dtype=torch.bool, device=x.device)
            mask[e] = True
            score[e] = (y - p(x, expert_mask=mask)).float().pow(2).sum(-1).mean()
        keep = _top(score, ec)
        notes.append(f"experts {ep} -> {ec} by output change when masked")
    else:
        keep = torch.arange(ep, device=x.device)
        if ec > ep:
            notes.append(f"experts {ep} -> {ec} (new experts random)")
    n = len(keep)
    _copy(c.gate.weight[:n], p.gate.weight[keep])
    if pc.router_bias and cc.router_bias:
        _copy(c.gate.e_score_correction_bias[:n], p.gate.e_score_correction_bias[keep])
    if pc.router_linear_bias and cc.router_linear_bias:
        copy_router_bias(p, c, keep)
    if pc.latent_size:
        _copy(c.fc1_latent_proj.weight, p.fc1_latent_proj.weight)
        _copy(c.fc2_latent_proj.weight, p.fc2_latent_proj.weight)
    wp, wc = pc.expert_width, cc.expert_width
    if wc < wp:
        xe = p.fc1_latent_proj(x) if pc.latent_size else x
        idx, _ = p.route(x)
    for j, e in enumerate(keep.tolist()):
        if wc < wp:
            tok = (idx == e).any(-1).nonzero()[:, 0]
            dnorm = p.experts_down[e].float().norm(dim=0)
            if len(tok):
                score = p.expert_intermediate(e, xe[tok]).abs().float().mean(0) * dnorm
            else:  # never routed on the calibration data: weight norms only
                score = p.experts_up[e].float().norm(dim=1) * dnorm
            ch = _top(score, wc)
        else:
            ch = torch.arange(wp, device=x.device)
        k = len(ch)
        names = ["experts_up"] + (["experts_gate"] if pc.gated else [])
        for name in names:
            _copy(getattr(c, name)[j, :k], getattr(p, name)[e, ch])
        _copy(c.experts_down[j, :, :k], p.experts_down[e][:, ch])
        c.experts_down[j, :, k:] = 0
        if pc.expert_bias and cc.expert_bias:
            copy_expert_biases(p, c, j, e, ch)
    if wc != wp:
        how = "channel contribution" if wc < wp else "zero-grown"
        notes.append(f"expert width {wp} -> {wc} by {how}")
    if pc.shared_width and cc.shared_width:
        notes.append("shared " + _ffn(p.shared_experts, c.shared_experts,
                                      p.shared_experts.cfg, c.shared_experts.cfg, x))
        if pc.shared_gate and cc.shared_gate:
            _copy(c.shared_expert_gate.weight, p.shared_expert_gate.weight)
    elif cc.shared_width:
        notes.append("shared expert random (parent has none)")
    if pc.top_k != cc.top_k:
        notes.append(f"top-k {pc.top_k} -> {cc.top_k} (weights kept)")
    return "; ".join(notes) or "copied (routing flags changed)"


def copy_router_bias(p: torch.nn.Module, c: torch.nn.Module, keep: torch.Tensor) -> None:
    """gpt-oss: the router bias of the kept experts."""
    assert isinstance(p, GptOssMoEMixer) and isinstance(c, GptOssMoEMixer)  # is_gpt_oss_moe
    pbias, cbias = p.router.bias, c.router.bias  # the ``gate`` view
    assert pbias is not None and cbias is not None  # router_linear_bias on both sides
    _copy(cbias[: len(keep)], pbias[keep])


def copy_expert_biases(p: torch.nn.Module, c: torch.nn.Module, j: int, e: int,
                       ch: torch.Tensor) -> None:
    """gpt-oss: child expert ``j`` takes parent expert ``e``'s biases on channels ``ch``
    (gate / up interleaved in ``gate_up_proj_bias``); channels past ``len(ch)`` get 0."""
    assert isinstance(p, GptOssMoEMixer) and isinstance(c, GptOssMoEMixer)  # is_gpt_oss_moe
    pb, cb = p.experts.gate_up_proj_bias, c.experts.gate_up_proj_bias
    k = len(ch)
    for par in (0, 1):
        _copy(cb[j, par::2][:k], pb[e, par::2][ch])
        cb[j, par::2][k:] = 0
    _copy(c.experts.down_proj_bias[j], p.experts.down_proj_bias[e])
