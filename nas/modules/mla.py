"""Multi-head latent attention (DeepSeek-V2/V3), numerically as transformers' ``deepseek_v3``.

Parameters (HF names): ``q_a_proj``, ``q_a_layernorm``, ``q_b_proj`` (or ``q_proj`` without a
query bottleneck), ``kv_a_proj_with_mqa``, ``kv_a_layernorm``, ``kv_b_proj``, ``o_proj``; the
latent norms use epsilon 1e-6 (transformers' ``DeepseekV3RMSNorm`` default).

Per token: ``q = q_b(norm(q_a(x)))`` split per head into ``q_nope`` (``qk_nope_head_dim``)
and ``q_rot`` (``qk_rope_head_dim``); ``kv_a(x)`` gives the latent ``c`` (``kv_lora_rank``,
normed) and one RoPE key ``k_rot`` shared by all heads. The KV cache of this block holds
``c`` and ``k_rot`` only (preallocated buffers, grown geometrically). Attention up-projects the cached latents, ``kv_b(c)`` -> per-head
``k_nope`` and ``v``; keys are ``[k_nope | k_rot]``. With ``rope_interleave`` the RoPE pairs
are adjacent channels (DeepSeek's layout); they are de-interleaved into halves first, for
queries and keys alike, which leaves every dot product as transformers computes it. The
softmax scale is ``(nope + rope)^-0.5``, times ``mscale^2`` with a YaRN ``mscale_all_dim``
(``0.1 * mscale_all_dim * ln(factor) + 1``), as transformers does.
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from nas.arch import MLA
from nas.modules.layers import RMSNorm, append_to_buffers, apply_rope, rope_tables

LATENT_NORM_EPS = 1e-6


def softmax_scale(cfg: MLA, rope_scaling: dict[str, Any] | None) -> float:
    """The attention scale of an MLA block (see the module docstring)."""
    scale = (cfg.qk_nope_head_dim + cfg.qk_rope_head_dim) ** -0.5
    if rope_scaling and rope_scaling.get("rope_type", rope_scaling.get("type")) not in (
            None, "default"):
        ms_all = rope_scaling.get("mscale_all_dim") or 0.0
        factor = float(rope_scaling.get("factor") or 1.0)
        if ms_all and factor > 1:
            m = 0.1 * ms_all * math.log(factor) + 1.0
            scale *= m * m
    return scale


class MLAMixer(nn.Module):
    """Multi-head latent attention over a latent KV cache (see the module docstring)."""

    def __init__(self, cfg: MLA, hidden: int, rope_theta: float = 10000.0,
                 rope_scaling: dict[str, Any] | None = None):
        super().__init__()
        kind = (rope_scaling or {}).get("rope_type", (rope_scaling or {}).get("type"))
        if kind not in (None, "default", "linear", "llama3", "yarn"):
            raise ValueError(f"RoPE type {kind!r} is not computed here (supported: default, "
                             "linear, llama3, yarn)")
        self.cfg = cfg
        self.rope_theta, self.rope_scaling = rope_theta, rope_scaling
        H, D = cfg.num_heads, cfg.qk_nope_head_dim + cfg.qk_rope_head_dim
        R, P = cfg.kv_lora_rank, cfg.qk_rope_head_dim
        if cfg.q_lora_rank:
            self.q_a_proj = nn.Linear(hidden, cfg.q_lora_rank, bias=False)
            self.q_a_layernorm = RMSNorm(cfg.q_lora_rank, LATENT_NORM_EPS)
            self.q_b_proj = nn.Linear(cfg.q_lora_rank, H * D, bias=False)
        else:
            self.q_proj = nn.Linear(hidden, H * D, bias=False)
        self.kv_a_proj_with_mqa = nn.Linear(hidden, R + P, bias=False)
        self.kv_a_layernorm = RMSNorm(R, LATENT_NORM_EPS)
        self.kv_b_proj = nn.Linear(R, H * (cfg.qk_nope_head_dim + cfg.v_head_dim), bias=False)
        self.o_proj = nn.Linear(H * cfg.v_head_dim, hidden, bias=False)
        self.scale = softmax_scale(cfg, rope_scaling)

    # ---- pieces -------------------------------------------------------------------------
    def query(self, x: torch.Tensor) -> torch.Tensor:
        """Queries ``(b, n, heads, nope + rope)`` before RoPE."""
        b, n, _ = x.shape
        q = self.q_b_proj(self.q_a_layernorm(self.q_a_proj(x))) if self.cfg.q_lora_rank \
            else self.q_proj(x)
        return q.view(b, n, self.cfg.num_heads, -1)

    def latent(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The normed latent ``(b, n, kv_lora_rank)`` and the RoPE key ``(b, n, rope)``
        before RoPE."""
        c, k_rot = self.kv_a_proj_with_mqa(x).split(
            [self.cfg.kv_lora_rank, self.cfg.qk_rope_head_dim], dim=-1)
        return self.kv_a_layernorm(c), k_rot

    def _rot(self, t: torch.Tensor, offset: int) -> torch.Tensor:
        """RoPE over the last dim of ``t (b, n, ..., rope)`` at positions ``offset..``."""
        n = t.shape[1]
        if self.cfg.rope_interleave:  # adjacent pairs -> halves (as transformers outputs)
            t = torch.cat([t[..., 0::2], t[..., 1::2]], dim=-1)
        cache = self.__dict__.setdefault("_rope_cache", {})
        key = (t.device, t.dtype)
        tabs = cache.get(key)
        if tabs is None or tabs[0].shape[0] < offset + n:
            size = max(offset + n, 2 * (tabs[0].shape[0] if tabs is not None else 0), 256)
            tabs = rope_tables(torch.arange(size, device=t.device), self.cfg.qk_rope_head_dim,
                               self.rope_theta, t.dtype, self.rope_scaling)
            cache[key] = tabs
        cos, sin = tabs[0][offset:offset + n], tabs[1][offset:offset + n]
        shape = (n,) + (1,) * (t.dim() - 3) + (t.shape[-1],)
        return apply_rope(t.contiguous(), cos.view(shape), sin.view(shape))

    def head_outputs(self, x: torch.Tensor) -> torch.Tensor:
        """Each head's attention output ``(b, heads, n, v_head_dim)`` over ``x`` alone (what
        ``o_proj`` reads), for ranking heads."""
        cfg = self.cfg
        b, n, _ = x.shape
        H, nope, V = cfg.num_heads, cfg.qk_nope_head_dim, cfg.v_head_dim
        q_nope, q_rot = self.query(x).split([nope, cfg.qk_rope_head_dim], dim=-1)
        q = torch.cat([q_nope, self._rot(q_rot, 0)], dim=-1).transpose(1, 2)
        c, k_rot = self.latent(x)
        k_nope, v = self.kv_b_proj(c).view(b, n, H, nope + V).split([nope, V], dim=-1)
        k = torch.cat([k_nope, self._rot(k_rot, 0)[:, :, None, :].expand(b, n, H, -1)], -1)
        return F.scaled_dot_product_attention(q, k.transpose(1, 2), v.transpose(1, 2),
                                              is_causal=n > 1, scale=self.scale)

    def forward(self, x: torch.Tensor, cache: dict[str, Any] | None = None,
                offset: int = 0) -> torch.Tensor:
        cfg = self.cfg
        b, n, _ = x.shape
        H, nope, V = cfg.num_heads, cfg.qk_nope_head_dim, cfg.v_head_dim
        q = self.query(x)
        q_nope, q_rot = q.split([nope, cfg.qk_rope_head_dim], dim=-1)
        q = torch.cat([q_nope, self._rot(q_rot, offset)], dim=-1).transpose(1, 2)
        c, k_rot = self.latent(x)
        k_rot = self._rot(k_rot, offset)
        past = 0
        if cache is not None:
            past = cache.get("len", 0)
            c, k_rot = append_to_buffers(
                cache, (("latent_buf", "latent", c), ("rot_buf", "k_rot", k_rot)), dim=1)
        s = c.shape[1]
        kv = self.kv_b_proj(c).view(b, s, H, nope + V)
        k_nope, v = kv.split([nope, V], dim=-1)
        k = torch.cat([k_nope, k_rot[:, :, None, :].expand(b, s, H, -1)], dim=-1)
        k, v = k.transpose(1, 2), v.transpose(1, 2)
        if past == 0 and n == s:
            out = F.scaled_dot_product_attention(q, k, v, is_causal=n > 1, scale=self.scale)
        else:
            qpos = torch.arange(past, past + n, device=x.device)[:, None]
            mask = torch.arange(s, device=x.device)[None, :] <= qpos
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=self.scale)
        return self.o_proj(out.transpose(1, 2).reshape(b, n, H * V))

    @torch.no_grad()
    def reset_parameters(self, std: float = 0.02, out_std: float = 0.02) -> None:
        lins = [self.kv_a_proj_with_mqa, self.kv_b_proj]
        lins += [self.q_a_proj, self.q_b_proj] if self.cfg.q_lora_rank else [self.q_proj]
        for lin in lins:
            nn.init.normal_(lin.weight, std=std)
        nn.init.normal_(self.o_proj.weight, std=out_std)
        self.kv_a_layernorm.reset_parameters()
        if self.cfg.q_lora_rank:
            self.q_a_layernorm.reset_parameters()


def make_mixer(cfg: MLA, arch: Any) -> MLAMixer:
    """The mixer of an MLA block (the model's factory finds it by the kind's name)."""
    return MLAMixer(cfg, arch.hidden_size, arch.rope_theta, arch.hf_extra.get("rope_scaling"))
