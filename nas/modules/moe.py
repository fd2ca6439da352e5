"""Routed mixture of experts: router, top-k, optional latent projections, shared expert.

Routing: ``scores = softmax(logits)`` or ``sigmoid(logits)``; the top-k experts are chosen
by ``scores + e_score_correction_bias`` (the bias only selects, as in Nemotron-H / DeepSeek-V3);
the weights are the chosen ``scores``, divided by their sum when ``norm_topk`` and times
``routed_scaling``. With a latent size the routed experts see ``fc1_latent_proj(x)`` and
their sum goes through ``fc2_latent_proj``; the shared expert works in the full hidden size
(gated by ``sigmoid(shared_expert_gate(x))`` when ``shared_gate``, as in Qwen2-MoE).

Routed experts are stored stacked: ``experts_up`` / ``experts_gate`` of shape
``(E, width, in)`` and ``experts_down`` of shape ``(E, in, width)``; dispatch sorts the
(token, expert) pairs by expert and loops over experts (not tokens) with index_select /
index_add.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from nas.arch import FFN, MoE
from nas.modules.layers import FFNMixer, activation


class MoEMixer(nn.Module):
    """Mixture of experts (see the module docstring for the exact routing)."""

    def __init__(self, cfg: MoE, hidden: int):
        super().__init__()
        self.cfg = cfg
        self.act = activation(cfg.activation)
        E, W = cfg.num_experts, cfg.expert_width
        inner = cfg.latent_size or hidden
        self.gate = _Router(hidden, E, cfg.router_bias)
        if cfg.latent_size:
            self.fc1_latent_proj = nn.Linear(hidden, cfg.latent_size, bias=False)
            self.fc2_latent_proj = nn.Linear(cfg.latent_size, hidden, bias=False)
        if cfg.gated:
            self.experts_gate = nn.Parameter(torch.empty(E, W, inner))
        self.experts_up = nn.Parameter(torch.empty(E, W, inner))
        self.experts_down = nn.Parameter(torch.empty(E, inner, W))
        if cfg.shared_width:
            self.shared_experts = FFNMixer(FFN(width=cfg.shared_width, gated=cfg.gated,
                                               activation=cfg.activation), hidden)
            if cfg.shared_gate:
                self.shared_expert_gate = nn.Linear(hidden, 1, bias=False)

    # ---- routing ------------------------------------------------------------------------
    def route(self, x: torch.Tensor, expert_mask: torch.Tensor | None = None,
              top_k: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Chosen expert ids ``(T, k)`` and their weights ``(T, k)`` for tokens ``x (T, h)``.

        ``expert_mask`` (bool, E): experts whose router logit is set to -inf.
        """
        cfg = self.cfg
        k = top_k or cfg.top_k
        logits = self.gate(x).float()
        if expert_mask is not None:
            logits = logits.masked_fill(expert_mask, float("-inf"))
        scores = torch.softmax(logits, -1) if cfg.router == "softmax" else torch.sigmoid(logits)
        sel = scores
        if cfg.router_bias:
            sel = scores + self.gate.e_score_correction_bias.float()
        if expert_mask is not None:
            sel = sel.masked_fill(expert_mask, float("-inf"))
        idx = torch.topk(sel, k, dim=-1).indices
        w = scores.gather(-1, idx)
        if cfg.norm_topk:
            w = w / (w.sum(-1, keepdim=True) + 1e-20)
        return idx, w * cfg.routed_scaling

    def expert(self, e: int, x: torch.Tensor) -> torch.Tensor:
        """Routed expert ``e`` on ``x (T, in)``."""
        return self.expert_intermediate(e, x) @ self.experts_down[e].t()

    def expert_intermediate(self, e: int, x: torch.Tensor) -> torch.Tensor:
        """The activations entering expert ``e``'s down projection."""
        up = x @ self.experts_up[e].t()
        if self.cfg.gated:
            return self.act(x @ self.experts_gate[e].t()) * up
        return self.act(up)

    def routed(self, x: torch.Tensor, idx: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        """Sum of the chosen experts' outputs weighted by ``w`` (in the expert space)."""
        T, k = idx.shape
        flat = idx.reshape(-1)
        order = torch.argsort(flat, stable=True)
        tokens = order // k
        weights = w.reshape(-1)[order]
        counts = torch.bincount(flat, minlength=self.cfg.num_experts).tolist()
        out = torch.zeros(T, x.shape[-1], dtype=torch.float32, device=x.device)
        start = 0
        for e, cnt in enumerate(counts):
            if not cnt:
                continue
            t = tokens[start:start + cnt]
            ye = self.expert(e, x.index_select(0, t)).float() * weights[start:start + cnt, None]
            out.index_add_(0, t, ye)
            start += cnt
        return out.to(x.dtype)

    def forward(self, x: torch.Tensor, cache: dict[str, Any] | None = None, offset: int = 0,
                expert_mask: torch.Tensor | None = None) -> torch.Tensor:
        shape = x.shape
        x = x.reshape(-1, shape[-1])
        idx, w = self.route(x, expert_mask)
        xin = self.fc1_latent_proj(x) if self.cfg.latent_size else x
        out = self.routed(xin, idx, w)
        if self.cfg.latent_size:
            out = self.fc2_latent_proj(out)
        if self.cfg.shared_width:
            s = self.shared_experts(x)
            if self.cfg.shared_gate:
                s = torch.sigmoid(self.shared_expert_gate(x)) * s
            out = out + s
        return out.reshape(shape)

    @torch.no_grad()
    def reset_parameters(self, std: float = 0.02, out_std: float = 0.02) -> None:
        nn.init.normal_(self.gate.weight, std=std)
        if self.cfg.router_bias:
            nn.init.zeros_(self.gate.e_score_correction_bias)
        if self.cfg.latent_size:
            nn.init.normal_(self.fc1_latent_proj.weight, std=std)
            nn.init.normal_(self.fc2_latent_proj.weight, std=out_std)
        for p in ([self.experts_gate] if self.cfg.gated else []) + [self.experts_up]:
            nn.init.normal_(p, std=std)
        nn.init.normal_(self.experts_down, std=out_std)
        if self.cfg.shared_width:
            self.shared_experts.reset_parameters(std, out_std)
            if self.cfg.shared_gate:
                nn.init.normal_(self.shared_expert_gate.weight, std=std)


class _Router(nn.Module):
    """Router weight ``(E, h)`` and optional selection-only correction bias ``(E)``."""

    def __init__(self, hidden: int, experts: int, bias: bool):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(experts, hidden))
        if bias:  # a buffer, as in transformers: selection only, never trained by SGD
            self.register_buffer("e_score_correction_bias", torch.zeros(experts))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x @ self.weight.t()
