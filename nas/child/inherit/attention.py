"""Inheritance rules for attention blocks: fewer / more KV heads (mean-pooled K/V per new
group), and attention -> linear.
"""

from __future__ import annotations

import torch

from nas.arch import (
    Attention,
)
from nas.child.inherit.common import _copy, _flat, _lsq_scale
from nas.modules.gpt_oss import SinkAttentionMixer
from nas.modules.layers import AttentionMixer, LinearMixer


# ---- per-kind rules ---------------------------------------------------------------------
def _attention(p: AttentionMixer, c: AttentionMixer, pc: Attention, cc: Attention) -> str:
    if (pc.num_heads, pc.head_dim) != (cc.num_heads, cc.head_dim):
        return "random (query heads or head_dim differ)"
    nq, d = pc.num_heads, pc.head_dim
    _copy(c.q_proj.weight, p.q_proj.weight)
    _copy(c.o_proj.weight, p.o_proj.weight)
    if p.o_proj.bias is not None and c.o_proj.bias is not None:
        _copy(c.o_proj.bias, p.o_proj.bias)
    if p.q_proj.bias is not None and c.q_proj.bias is not None:
        _copy(c.q_proj.bias, p.q_proj.bias)
    if pc.qk_norm and cc.qk_norm:
        _copy(c.q_norm.weight, p.q_norm.weight)
        _copy(c.k_norm.weight, p.k_norm.weight)
    if pc.sinks and cc.sinks:  # gpt-oss: one sink logit per query head
        assert isinstance(p, SinkAttentionMixer) and isinstance(c, SinkAttentionMixer)
        _copy(c.sinks, p.sinks)
    # pooling matrix: child kv head j = mean over its query heads q of parent kv head(q)
    kp, kc = pc.num_kv_heads, cc.num_kv_heads
    pool = torch.zeros(kc, kp, dtype=torch.float64)
    for q in range(nq):
        pool[q // (nq // kc), q // (nq // kp)] += 1.0
    pool = pool / pool.sum(1, keepdim=True)
    for name in ("k_proj", "v_proj"):
        pl, cl = getattr(p, name), getattr(c, name)
        w = pl.weight.double().view(kp, d, -1)
        pool = pool.to(w.device)
        _copy(cl.weight, torch.einsum("cp,pdh->cdh", pool, w).reshape(kc * d, -1))
        if pl.bias is not None and cl.bias is not None:
            _copy(cl.bias, (pool @ pl.bias.double().view(kp, d)).reshape(-1))
    if kp == kc:
        return "copied (attention flags changed)"
    return f"kv heads {kp} -> {kc} by mean pooling"


def _attention_to_linear(p: AttentionMixer, c: LinearMixer, pc: Attention,
                         xin: torch.Tensor) -> str:
    d = pc.head_dim
    wv = p.v_proj.weight.double().view(pc.num_kv_heads, d, -1)
    wv = wv.repeat_interleave(pc.num_heads // pc.num_kv_heads, dim=0).reshape(-1, wv.shape[-1])
    w = p.o_proj.weight.double() @ wv
    s = _lsq_scale(_flat(p(xin)), _flat(xin) @ w.t().to(xin.dtype))
    _copy(c.linear.weight, s * w)
    return f"linear from W_o @ W_v (scale {s:.3g})"
