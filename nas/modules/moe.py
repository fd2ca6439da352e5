"""Routed mixture of experts: router, top-k, optional latent projections, shared expert.

Routing: ``scores = softmax(logits)`` or ``sigmoid(logits)``; the top-k experts are chosen
by ``scores + e_score_correction_bias`` (the bias only selects, as in Nemotron-H / DeepSeek-V3),
among the ``topk_group`` best of ``n_group`` expert groups when grouped (DeepSeek-V3);
the weights are the chosen ``scores``, divided by their sum when ``norm_topk`` and times
``routed_scaling``. With a latent size the routed experts see ``fc1_latent_proj(x)`` and
their sum goes through ``fc2_latent_proj``; the shared expert works in the full hidden size
(gated by ``sigmoid(shared_expert_gate(x))`` when ``shared_gate``, as in Qwen2-MoE).

Routed experts are stored stacked: ``experts_up`` / ``experts_gate`` of shape
``(E, width, in)`` and ``experts_down`` of shape ``(E, in, width)``. Dispatch sorts the
(token, expert) pairs by expert once, gathers the tokens in that order, runs every expert
at once as grouped matmuls (:func:`grouped_mm`: ``torch._grouped_mm`` where the torch
build has it for the device and dtype, a padded ``bmm`` otherwise; no Python loop over
experts) and combines in float32 with one ``index_add_`` in the same (expert-sorted)
order as a per-expert loop would.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from nas.arch import FFN, MoE
from nas.modules.layers import FFNMixer, activation, gated_act


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
        if cfg.n_group > 1:  # group-limited routing (DeepSeek-V3): keep the topk_group best
            # groups, each scored by the sum of its two best selection scores
            per = cfg.num_experts // cfg.n_group
            grp = sel.view(-1, cfg.n_group, per).topk(2, dim=-1).values.sum(-1)
            best = torch.topk(grp, cfg.topk_group, dim=-1).indices
            keep = torch.zeros_like(grp, dtype=torch.bool).scatter_(1, best, True)
            sel = sel.masked_fill(~keep.repeat_interleave(per, dim=1), float("-inf"))
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
        """Sum of the chosen experts' outputs weighted by ``w`` (in the expert space): the
        ``T * k`` (token, expert) pairs sorted by expert, run through
        :meth:`grouped_experts`, summed back per token in float32."""
        T, k = idx.shape
        flat = idx.reshape(-1)
        order = torch.argsort(flat, stable=True)
        tokens = order // k
        weights = w.reshape(-1)[order]
        counts = torch.bincount(flat, minlength=self.cfg.num_experts)
        xs = x.index_select(0, tokens)  # (T*k, in), grouped by expert
        ye = self.grouped_experts(xs, counts)
        out = torch.zeros(T, x.shape[-1], dtype=torch.float32, device=x.device)
        out.index_add_(0, tokens, ye.float() * weights[:, None])
        return out.to(x.dtype)

    def grouped_experts(self, xs: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
        """The experts on ``xs (T*k, in)`` sorted by expert, ``counts[e]`` rows for expert
        ``e``: ``(T*k, out)`` unweighted outputs, one grouped GEMM per projection."""
        up = grouped_mm(xs, self.experts_up.transpose(1, 2), counts)
        if self.cfg.gated:
            h = gated_act(self.act, grouped_mm(xs, self.experts_gate.transpose(1, 2), counts), up)
        else:
            h = self.act(up)
        return grouped_mm(h, self.experts_down.transpose(1, 2), counts)

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

    e_score_correction_bias: torch.Tensor  # the buffer, registered only when ``bias``

    def __init__(self, hidden: int, experts: int, bias: bool):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(experts, hidden))
        if bias:  # a buffer, as in transformers: selection only, never trained by SGD
            self.register_buffer("e_score_correction_bias", torch.zeros(experts))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x @ self.weight.t()


class _GroupedMM(torch.autograd.Function):
    """``torch._grouped_mm`` with its backward spelled out as two more grouped matmuls
    (torch 2.13's CPU derivative of ``_grouped_mm`` fails with strided-layout errors)."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, w: torch.Tensor, offs: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(x, w, offs)
        return torch._grouped_mm(x, w, offs=offs)

    @staticmethod
    def backward(ctx, g: torch.Tensor):
        x, w, offs = ctx.saved_tensors
        g = g.contiguous()
        gx = torch._grouped_mm(g, w.transpose(1, 2), offs=offs) \
            if ctx.needs_input_grad[0] else None
        gw = torch._grouped_mm(x.t(), g, offs=offs) if ctx.needs_input_grad[1] else None
        return gx, gw, None


_GROUPED_OK: dict[tuple[str, torch.dtype], bool] = {}


def _grouped_supported(device: torch.device, dtype: torch.dtype) -> bool:
    """Whether ``torch._grouped_mm`` runs (forward and the backward above) here."""
    key = (device.type, dtype)
    if key not in _GROUPED_OK:
        ok = hasattr(torch, "_grouped_mm")
        if ok:
            try:
                x = torch.ones(5, 16, dtype=dtype, device=device, requires_grad=True)
                w = torch.ones(2, 16, 16, dtype=dtype, device=device, requires_grad=True)
                offs = torch.tensor([2, 5], dtype=torch.int32, device=device)
                with torch.enable_grad():
                    _GroupedMM.apply(x, w, offs).sum().backward()
                want = torch.tensor([2.0, 3.0], dtype=dtype, device=device)[:, None, None]
                assert x.grad is not None and w.grad is not None  # leaves: backward set them
                ok = bool((x.grad == 16).all()) and bool((w.grad == want).all())
            except (RuntimeError, NotImplementedError):
                ok = False
        _GROUPED_OK[key] = ok
    return _GROUPED_OK[key]


def grouped_mm(x: torch.Tensor, w: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
    """Rows of ``x (S, in)`` sorted by group times their group's ``w[e] (in, out)``.

    ``counts (E,)``: rows per group, in order. ``torch._grouped_mm`` where it runs for this
    device and dtype and both sizes span whole 16-byte units, else one ``bmm`` over the
    groups padded to the largest count.
    """
    es = x.element_size()
    if (x.shape[1] * es) % 16 == 0 and (w.shape[2] * es) % 16 == 0 \
            and _grouped_supported(x.device, x.dtype):  # the kernel wants 16-byte strides
        offs = torch.cumsum(counts, 0, dtype=torch.int32)
        return _GroupedMM.apply(x, w, offs)
    return _padded_bmm(x, w, counts)


def _padded_bmm(x: torch.Tensor, w: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
    """The fallback of :func:`grouped_mm`: scatter into ``(E, max count, in)``, one bmm."""
    E = w.shape[0]
    S = x.shape[0]
    if S == 0:
        return x.new_zeros(0, w.shape[-1])
    group = torch.repeat_interleave(torch.arange(E, device=x.device), counts, output_size=S)
    starts = torch.cumsum(counts, 0) - counts
    rank = torch.arange(S, device=x.device) - starts[group]
    width = int(counts.max())
    padded = x.new_zeros(E, width, x.shape[-1]).index_put((group, rank), x)
    return torch.bmm(padded, w)[group, rank]
