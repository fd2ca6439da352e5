"""gpt-oss blocks, numerically as transformers' ``gpt_oss``: attention with learned sinks and
the MoE with biased router and experts and the clamped SwiGLU.

Attention sinks: each query head ``h`` has a learned logit ``s_h`` that joins every softmax
denominator and attends to nothing: ``p_j = exp(l_j) / (sum_i exp(l_i) + exp(s_h))``. The
rest (GQA, RoPE, biases, sliding window, the KV cache and its ring) is
:class:`~nas.modules.layers.AttentionMixer`'s; only the attention product differs, computed
explicitly (SDPA has no sink).

MoE: parameters in the HF layout, so that checkpoints map one to one: ``router.weight``
``(E, h)``, ``router.bias`` ``(E)``; ``experts.gate_up_proj`` ``(E, h, 2W)`` with gate and up
*interleaved* along the last dim (gate = even columns), ``experts.gate_up_proj_bias``
``(E, 2W)``, ``experts.down_proj`` ``(E, W, h)``, ``experts.down_proj_bias`` ``(E, h)``.
Routing: softmax over the top-k router logits (:meth:`MoEMixer.route` with a softmax router
and ``norm_topk``: the same weights). Expert: ``g = min(gate, L)``, ``u = clamp(up, -L, L)``,
``(u + 1) * g * sigmoid(alpha * g)`` into ``down``. :class:`GptOssMoEMixer` exposes the
:class:`~nas.modules.moe.MoEMixer` views (``gate``, ``experts_gate``, ``experts_up``,
``experts_down``) over these tensors, so the MoE inheritance rules apply to it unchanged.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from nas.arch import Attention, MoE
from nas.modules.layers import AttentionMixer, activation
from nas.modules.moe import MoEMixer, grouped_mm

QUERY_CHUNK = 1024
"""Queries per explicit attention product of :class:`SinkAttentionMixer` (bounds the score
matrix it holds at ``heads x 1024 x keys``)."""


class SinkAttentionMixer(AttentionMixer):
    """:class:`AttentionMixer` with a learned sink logit per query head (``sinks``)."""

    def __init__(self, cfg: Attention, hidden: int, rope_theta: float = 10000.0,
                 eps: float = 1e-5, rope_scaling: dict[str, Any] | None = None,
                 norm_unit_offset: bool = False):
        super().__init__(cfg, hidden, rope_theta, eps, rope_scaling, norm_unit_offset)
        self.sinks = nn.Parameter(torch.zeros(cfg.num_heads))

    def _attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, past: int,
                kpos: torch.Tensor | None = None) -> torch.Tensor:
        b, H, n, d = q.shape
        s = k.shape[2]
        rep = H // self.n_kv
        if rep > 1:
            k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
        one = n == 1 and kpos is None  # one query over its cache sees every held key
        if kpos is None:
            kpos = torch.arange(s, device=q.device)
        sink = self.sinks.to(q.dtype).view(1, H, 1, 1)
        # queries in chunks: the explicit scores stay at most QUERY_CHUNK x keys per head
        outs = []
        for c0 in range(0, n, QUERY_CHUNK):
            qc = q[:, :, c0:c0 + QUERY_CHUNK]
            logits = (qc @ k.transpose(-1, -2)) * d ** -0.5
            if not one:
                qpos = torch.arange(past + c0, past + c0 + qc.shape[2], device=q.device)[:, None]
                mask = kpos[None, :] <= qpos
                if self.cfg.sliding_window is not None:
                    mask = mask & (qpos - kpos[None, :] < self.cfg.sliding_window)
                logits = logits.masked_fill(~mask, float("-inf"))
            comb = torch.cat([logits, sink.expand(b, H, qc.shape[2], 1)], dim=-1)
            comb = comb - comb.max(dim=-1, keepdim=True).values
            outs.append(torch.softmax(comb, dim=-1)[..., :-1] @ v)
        return outs[0] if len(outs) == 1 else torch.cat(outs, dim=2)

    @torch.no_grad()
    def reset_parameters(self, std: float = 0.02, out_std: float = 0.02) -> None:
        super().reset_parameters(std, out_std)
        nn.init.zeros_(self.sinks)


class _Router(nn.Module):
    """gpt-oss router: a linear layer with a bias."""

    def __init__(self, hidden: int, experts: int, bias: bool):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(experts, hidden))
        self.bias = nn.Parameter(torch.zeros(experts)) if bias else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.weight, self.bias)


class _Experts(nn.Module):
    def __init__(self, experts: int, hidden: int, width: int, bias: bool):
        super().__init__()
        self.gate_up_proj = nn.Parameter(torch.empty(experts, hidden, 2 * width))
        self.down_proj = nn.Parameter(torch.empty(experts, width, hidden))
        if bias:
            self.gate_up_proj_bias = nn.Parameter(torch.zeros(experts, 2 * width))
            self.down_proj_bias = nn.Parameter(torch.zeros(experts, hidden))


class GptOssMoEMixer(MoEMixer):
    """gpt-oss MoE (see the module docstring); a :class:`MoEMixer` for routing, masking and
    inheritance."""

    def __init__(self, cfg: MoE, hidden: int):
        nn.Module.__init__(self)
        if not cfg.gated or cfg.latent_size or cfg.shared_width:
            raise ValueError("the gpt-oss MoE layout has gated experts, no latent projections "
                             "and no shared expert")
        self.cfg = cfg
        self.act = activation(cfg.activation)
        self.router = _Router(hidden, cfg.num_experts, cfg.router_linear_bias)
        self.experts = _Experts(cfg.num_experts, hidden, cfg.expert_width, cfg.expert_bias)

    # the MoEMixer views: (E, W, in) gate / up, (E, in, W) down, the router as ``gate``
    @property
    def gate(self) -> nn.Module:  # type: ignore[override]  # read-only views of MoEMixer's attributes (its stacked tensors)
        return self.router

    @property
    def experts_gate(self) -> torch.Tensor:  # type: ignore[override]  # read-only views of MoEMixer's attributes (its stacked tensors)
        return self.experts.gate_up_proj[..., 0::2].transpose(1, 2)

    @property
    def experts_up(self) -> torch.Tensor:  # type: ignore[override]  # read-only views of MoEMixer's attributes (its stacked tensors)
        return self.experts.gate_up_proj[..., 1::2].transpose(1, 2)

    @property
    def experts_down(self) -> torch.Tensor:  # type: ignore[override]  # read-only views of MoEMixer's attributes (its stacked tensors)
        return self.experts.down_proj.transpose(1, 2)

    def _glu(self, gu: torch.Tensor) -> torch.Tensor:
        gate, up = gu[..., 0::2], gu[..., 1::2]
        lim, alpha = self.cfg.swiglu_limit, self.cfg.swiglu_alpha
        if lim is None:
            return self.act(gate) * up
        assert alpha is not None  # MoE validates: swiglu_limit and swiglu_alpha go together
        gate = gate.clamp(max=lim)
        up = up.clamp(min=-lim, max=lim)
        return (up + 1) * (gate * torch.sigmoid(gate * alpha))

    def expert_intermediate(self, e: int, x: torch.Tensor) -> torch.Tensor:
        gu = x @ self.experts.gate_up_proj[e]
        if self.cfg.expert_bias:
            gu = gu + self.experts.gate_up_proj_bias[e]
        return self._glu(gu)

    def expert(self, e: int, x: torch.Tensor) -> torch.Tensor:
        y = self.expert_intermediate(e, x) @ self.experts.down_proj[e]
        return y + self.experts.down_proj_bias[e] if self.cfg.expert_bias else y

    def routed(self, x: torch.Tensor, idx: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        T, k = idx.shape
        flat = idx.reshape(-1)
        order = torch.argsort(flat, stable=True)
        tokens = order // k
        group = flat[order]
        weights = w.reshape(-1)[order]
        counts = torch.bincount(flat, minlength=self.cfg.num_experts)
        xs = x.index_select(0, tokens)
        gu = grouped_mm(xs, self.experts.gate_up_proj, counts)
        if self.cfg.expert_bias:
            gu = gu + self.experts.gate_up_proj_bias[group]
        ye = grouped_mm(self._glu(gu), self.experts.down_proj, counts)
        if self.cfg.expert_bias:
            ye = ye + self.experts.down_proj_bias[group]
        out = torch.zeros(T, x.shape[-1], dtype=torch.float32, device=x.device)
        out.index_add_(0, tokens, ye.float() * weights[:, None])
        return out.to(x.dtype)

    @torch.no_grad()
    def reset_parameters(self, std: float = 0.02, out_std: float = 0.02) -> None:
        nn.init.normal_(self.router.weight, std=std)
        if self.router.bias is not None:
            nn.init.zeros_(self.router.bias)
        nn.init.normal_(self.experts.gate_up_proj, std=std)
        nn.init.normal_(self.experts.down_proj, std=out_std)
        if self.cfg.expert_bias:
            nn.init.zeros_(self.experts.gate_up_proj_bias)
            nn.init.zeros_(self.experts.down_proj_bias)


def is_gpt_oss_moe(cfg: MoE) -> bool:
    """Whether a MoE block needs :class:`GptOssMoEMixer` (its biases or clamped SwiGLU)."""
    return cfg.router_linear_bias or cfg.expert_bias or cfg.swiglu_limit is not None
