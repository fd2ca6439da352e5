"""Inheritance rules for MLA blocks (DeepSeek-V3, Kimi; used by :mod:`nas.child.inherit`):

* MLA, fewer query heads: heads ranked by their channel contribution on the calibration data
  (``mean |o_h| * ||W_o[:, h]||`` summed over the head's ``v_head_dim`` channels); the kept
  heads' rows of ``q_b`` (``q_proj``) and ``kv_b`` and columns of ``o_proj`` are copied.
* MLA, smaller ``kv_lora_rank`` (``q_lora_rank``): the latent bottleneck is re-factored by
  an SVD. With the latent norm's scale ``g`` folded into the up-projection,
  ``M = W_up diag(g) = U S V^T``; the child keeps the top ``r`` directions: down-projection
  ``V_r^T W_down``, up-projection ``U_r S_r``, and a latent-norm scale equal to the mean over
  the calibration tokens of ``rms_r(V_r^T W_down x) / rms_R(W_down x)`` (the child normalizes
  over ``r`` channels where the parent normalized over ``R``). At ``r = R`` this reproduces
  the parent block exactly (``V`` is a rotation); the RoPE rows of ``kv_a_proj_with_mqa`` are
  copied.
"""

from __future__ import annotations

import torch

from nas.arch import MLA
from nas.modules.mla import LATENT_NORM_EPS, MLAMixer


def _copy(dst: torch.Tensor, src: torch.Tensor) -> None:
    dst.copy_(src.to(dst.dtype))


@torch.no_grad()
def svd_bottleneck(down: torch.Tensor, norm_w: torch.Tensor, up: torch.Tensor, r: int,
                   x: torch.Tensor, eps: float = LATENT_NORM_EPS
                   ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The rank-``r`` re-factoring of ``up @ (norm_w * rmsnorm(down @ x))`` (see the module
    docstring): ``(down (r, h), norm weight (r,), up (out, r))`` in float64. ``x``: the
    calibration inputs ``(T, h)``."""
    m = up.double() * norm_w.double()[None, :]
    u, s, vh = torch.linalg.svd(m, full_matrices=False)
    vr = vh[:r]
    new_down = vr @ down.double()
    new_up = u[:, :r] * s[:r]
    z = x.double() @ down.double().t()
    zr = z @ vr.t()
    ratio = (zr.pow(2).mean(-1) + eps).sqrt() / (z.pow(2).mean(-1) + eps).sqrt()
    scale = float(ratio.mean()) if ratio.numel() else 1.0
    return new_down, torch.full((r,), scale, dtype=torch.float64, device=down.device), new_up


def inherit_mla(p: MLAMixer, c: MLAMixer, pc: MLA, cc: MLA, xin: torch.Tensor) -> str:
    """Initialize MLA block ``c`` from ``p`` (see the module docstring); what was done."""
    if (pc.qk_nope_head_dim, pc.qk_rope_head_dim, pc.v_head_dim, pc.rope_interleave) != \
            (cc.qk_nope_head_dim, cc.qk_rope_head_dim, cc.v_head_dim, cc.rope_interleave) \
            or bool(pc.q_lora_rank) != bool(cc.q_lora_rank) or cc.num_heads > pc.num_heads \
            or cc.kv_lora_rank > pc.kv_lora_rank \
            or (cc.q_lora_rank or 0) > (pc.q_lora_rank or 0):
        return "random (MLA head sizes, RoPE layout or a grown rank differ)"
    H, D, V, nope = pc.num_heads, pc.qk_nope_head_dim + pc.qk_rope_head_dim, pc.v_head_dim, \
        pc.qk_nope_head_dim
    x = xin.reshape(-1, xin.shape[-1])
    notes = []
    if cc.num_heads < H:
        o = p.head_outputs(xin).abs().float().mean(dim=(0, 2))  # (H, V)
        wo = p.o_proj.weight.float().norm(dim=0).view(H, V)
        keep = torch.topk((o * wo).sum(-1), cc.num_heads).indices.sort().values
        notes.append(f"heads {H} -> {cc.num_heads} by channel contribution")
    else:
        keep = torch.arange(H, device=x.device)
    q_up = (p.q_b_proj if pc.q_lora_rank else p.q_proj).weight.view(H, D, -1)[keep]
    q_up = q_up.reshape(-1, q_up.shape[-1])
    kv_up = p.kv_b_proj.weight.view(H, nope + V, -1)[keep].reshape(-1, pc.kv_lora_rank)
    _copy(c.o_proj.weight, p.o_proj.weight.view(-1, H, V)[:, keep].reshape(-1, len(keep) * V))
    R, r = pc.kv_lora_rank, cc.kv_lora_rank
    kv_a = p.kv_a_proj_with_mqa.weight
    _copy(c.kv_a_proj_with_mqa.weight[r:], kv_a[R:])
    if r < R:
        down, g, up = svd_bottleneck(kv_a[:R], p.kv_a_layernorm.weight, kv_up, r, x)
        _copy(c.kv_a_proj_with_mqa.weight[:r], down)
        _copy(c.kv_a_layernorm.weight, g)
        _copy(c.kv_b_proj.weight, up)
        notes.append(f"kv_lora_rank {R} -> {r} by SVD")
    else:
        _copy(c.kv_a_proj_with_mqa.weight[:r], kv_a[:R])
        _copy(c.kv_a_layernorm.weight, p.kv_a_layernorm.weight)
        _copy(c.kv_b_proj.weight, kv_up)
    if pc.q_lora_rank:
        Q, q = pc.q_lora_rank, cc.q_lora_rank or 0
        if q < Q:
            down, g, up = svd_bottleneck(p.q_a_proj.weight, p.q_a_layernorm.weight, q_up, q, x)
            _copy(c.q_a_proj.weight, down)
            _copy(c.q_a_layernorm.weight, g)
            _copy(c.q_b_proj.weight, up)
            notes.append(f"q_lora_rank {Q} -> {q} by SVD")
        else:
            _copy(c.q_a_proj.weight, p.q_a_proj.weight)
            _copy(c.q_a_layernorm.weight, p.q_a_layernorm.weight)
            _copy(c.q_b_proj.weight, q_up)
    else:
        _copy(c.q_proj.weight, q_up)
    return "; ".join(notes) or "copied (MLA flags changed)"
