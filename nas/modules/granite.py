"""IBM Granite-4.0-H (``granitemoehybrid``) numerics and weight layout, as transformers'
``granitemoehybrid`` computes them.

Model-level scalars (:class:`Scalars`, read by :func:`scalars_of` from the config; one left
out is transformers' ``GraniteMoeHybridConfig`` default 1.0, as transformers computes such a
config, the rule :mod:`nas.hf.hybrids` imports by; the identity for every other type):

* ``embedding_multiplier``: the embeddings are multiplied by it before the first block;
* ``residual_multiplier``: every residual branch (mixer and MLP) is multiplied by it before
  it is added to the residual stream;
* ``logits_scaling``: the LM head's logits are divided by it;
* ``attention_multiplier``: the attention softmax scale (in place of ``1 / sqrt(head_dim)``).

MoE (:class:`GraniteMoEMixer`): parameters in the HF checkpoint layout, so checkpoints map
one to one: ``block_sparse_moe.router.layer.weight`` ``(E, h)``,
``block_sparse_moe.input_linear.weight`` ``(E, 2W, h)`` (rows ``[:W]`` the gate, ``[W:]`` the
up projection: transformers ``chunk(2)``\\s it in that order), ``block_sparse_moe.output_linear
.weight`` ``(E, h, W)``; the shared MLP ``shared_mlp.input_linear.weight`` ``(2S, h)`` (gate
then up) and ``shared_mlp.output_linear.weight`` ``(h, S)``. Routing: softmax over the top-k
router logits, i.e. :meth:`~nas.modules.moe.MoEMixer.route` with a softmax router and
``norm_topk``. The mixer exposes the :class:`~nas.modules.moe.MoEMixer` views (``gate``,
``experts_gate``, ``experts_up``, ``experts_down``, ``shared_experts``) as views of these
tensors, so the MoE inheritance rules of :mod:`nas.child.inherit` read and write them
unchanged. A dense layer (``num_local_experts: 0``) is the shared MLP alone
(:class:`GraniteFFNMixer`). Mamba-2 and attention layers are
:class:`~nas.modules.mamba.MambaMixer` and :class:`~nas.modules.layers.AttentionMixer`
(the HF names ``mamba.*`` / ``self_attn.*`` are a prefix change, :mod:`nas.child.checkpoint`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from hwprofiles.errors import InputError
from nas.arch import FFN, ModelArch, MoE
from nas.modules.layers import activation, gated_act
from nas.modules.moe import MoEMixer, grouped_mm

GRANITE = "granitemoehybrid"
MULTIPLIERS = ("embedding_multiplier", "residual_multiplier", "logits_scaling",
               "attention_multiplier")
"""Granite's config fields that scale the numerics (dimensionless); absent: 1.0, as in
transformers' ``GraniteMoeHybridConfig``."""


@dataclass(frozen=True)
class Scalars:
    """Model-level scalars of the forward pass (all the identity by default)."""

    embedding: float = 1.0
    """Embeddings are multiplied by it."""
    residual: float = 1.0
    """Every residual branch is multiplied by it before the addition."""
    logits_divisor: float = 1.0
    """Logits are divided by it."""
    attention_scale: float | None = None
    """Attention softmax scale (``None``: ``1 / sqrt(head_dim)``)."""


IDENTITY = Scalars()


def scalars_of(arch: ModelArch) -> Scalars:
    """The scalars of ``arch``'s forward pass: Granite's four multipliers read from its
    config (:data:`MULTIPLIERS`; a missing one is transformers' default 1.0, anything but a
    number an :class:`InputError` naming it); Falcon-H1's embedding and LM-head multipliers (``arch.mup``; logits divided by
    the inverse of ``lm_head``); the identity for every other model type."""
    if arch.mup is not None:  # Falcon-H1's embedding / LM-head muP multipliers (nas.arch.MuP)
        return Scalars(embedding=arch.mup.embedding, logits_divisor=1.0 / arch.mup.lm_head)
    if arch.model_type != GRANITE:
        return IDENTITY
    extra = arch.hf_extra
    vals = {}
    for k in MULTIPLIERS:
        v = extra.get(k, 1.0)  # transformers' GraniteMoeHybridConfig default
        if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v):
            raise InputError(f"{GRANITE}: {k} must be a finite number (it scales the "
                             f"numerics), got {v!r}", field=k)
        vals[k] = float(v)
    if vals["logits_scaling"] == 0:
        raise InputError("logits_scaling divides the logits; it must not be 0",
                         field="logits_scaling")
    return Scalars(embedding=vals["embedding_multiplier"],
                   residual=vals["residual_multiplier"],
                   logits_divisor=vals["logits_scaling"],
                   attention_scale=vals["attention_multiplier"])


class _Weight:
    """A stand-in for an ``nn.Linear`` whose ``weight`` is a view of a fused tensor."""

    def __init__(self, weight: torch.Tensor):
        self.weight = weight
        self.bias = None


class _Router(nn.Module):
    """Granite router ``layer`` ``(E, h)``, no bias."""

    def __init__(self, hidden: int, experts: int):
        super().__init__()
        self.layer = nn.Linear(hidden, experts, bias=False)

    @property
    def weight(self) -> torch.Tensor:
        return self.layer.weight

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layer(x)


class _FusedLinear(nn.Module):
    """``input_linear.weight`` (E, 2W, h) / ``output_linear.weight`` (E, h, W) holders."""

    def __init__(self, *shape: int):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(*shape))


class _Experts(nn.Module):
    def __init__(self, hidden: int, experts: int, width: int):
        super().__init__()
        self.router = _Router(hidden, experts)
        self.input_linear = _FusedLinear(experts, 2 * width, hidden)
        self.output_linear = _FusedLinear(experts, hidden, width)


class GraniteSharedMLP(nn.Module):
    """Granite's SwiGLU MLP with the gate and up projections fused in ``input_linear``
    (``[gate; up]`` rows); ``gate_proj`` / ``up_proj`` / ``down_proj`` are views for the
    :class:`~nas.modules.layers.FFNMixer` inheritance rules."""

    def __init__(self, cfg: FFN, hidden: int):
        super().__init__()
        if not cfg.gated or cfg.bias:
            raise ValueError("Granite's MLP is gated (SwiGLU) without biases")
        self.cfg = cfg
        self.act = activation(cfg.activation)
        self.input_linear = nn.Linear(hidden, 2 * cfg.width, bias=False)
        self.output_linear = nn.Linear(cfg.width, hidden, bias=False)

    @property
    def gate_proj(self) -> _Weight:
        return _Weight(self.input_linear.weight[:self.cfg.width])

    @property
    def up_proj(self) -> _Weight:
        return _Weight(self.input_linear.weight[self.cfg.width:])

    @property
    def down_proj(self) -> _Weight:
        return _Weight(self.output_linear.weight)

    def intermediate(self, x: torch.Tensor) -> torch.Tensor:
        """The activations entering ``output_linear`` (one per channel)."""
        g, u = self.input_linear(x).chunk(2, dim=-1)
        return gated_act(self.act, g, u)

    def forward(self, x: torch.Tensor, cache: dict[str, Any] | None = None,
                offset: int = 0) -> torch.Tensor:
        return self.output_linear(self.intermediate(x))

    @torch.no_grad()
    def reset_parameters(self, std: float = 0.02, out_std: float = 0.02) -> None:
        nn.init.normal_(self.input_linear.weight, std=std)
        nn.init.normal_(self.output_linear.weight, std=out_std)


class GraniteFFNMixer(nn.Module):
    """A dense Granite layer: the shared MLP alone (HF ``shared_mlp.*``)."""

    def __init__(self, cfg: FFN, hidden: int):
        super().__init__()
        self.cfg = cfg
        self.shared_mlp = GraniteSharedMLP(cfg, hidden)

    # the FFNMixer views
    @property
    def gate_proj(self) -> _Weight:
        return self.shared_mlp.gate_proj

    @property
    def up_proj(self) -> _Weight:
        return self.shared_mlp.up_proj

    @property
    def down_proj(self) -> _Weight:
        return self.shared_mlp.down_proj

    def intermediate(self, x: torch.Tensor) -> torch.Tensor:
        return self.shared_mlp.intermediate(x)

    def forward(self, x: torch.Tensor, cache: dict[str, Any] | None = None,
                offset: int = 0) -> torch.Tensor:
        return self.shared_mlp(x)

    @torch.no_grad()
    def reset_parameters(self, std: float = 0.02, out_std: float = 0.02) -> None:
        self.shared_mlp.reset_parameters(std, out_std)


class GraniteMoEMixer(MoEMixer):
    """Granite MoE + shared MLP (see the module docstring); a :class:`MoEMixer` for routing,
    masking and inheritance."""

    def __init__(self, cfg: MoE, hidden: int):
        nn.Module.__init__(self)
        if not (cfg.gated and cfg.router == "softmax" and cfg.norm_topk) or cfg.latent_size \
                or cfg.shared_gate or cfg.router_bias or cfg.routed_scaling != 1.0 \
                or cfg.expert_bias or cfg.router_linear_bias or cfg.swiglu_limit is not None:
            raise ValueError("the Granite MoE has SwiGLU experts, softmax top-k routing "
                             "(renormalized), an ungated shared MLP and no biases")
        self.cfg = cfg
        self.act = activation(cfg.activation)
        self.block_sparse_moe = _Experts(hidden, cfg.num_experts, cfg.expert_width)
        if cfg.shared_width:
            self.shared_mlp = GraniteSharedMLP(
                FFN(width=cfg.shared_width, gated=True, activation=cfg.activation), hidden)

    # the MoEMixer views: (E, W, h) gate / up, (E, h, W) down, the router as ``gate``
    @property
    def gate(self) -> nn.Module:  # type: ignore[override]  # read-only views of MoEMixer's attributes (Granite's fused tensors)
        return self.block_sparse_moe.router

    @property
    def experts_gate(self) -> torch.Tensor:  # type: ignore[override]  # read-only views of MoEMixer's attributes (Granite's fused tensors)
        return self.block_sparse_moe.input_linear.weight[:, :self.cfg.expert_width]

    @property
    def experts_up(self) -> torch.Tensor:  # type: ignore[override]  # read-only views of MoEMixer's attributes (Granite's fused tensors)
        return self.block_sparse_moe.input_linear.weight[:, self.cfg.expert_width:]

    @property
    def experts_down(self) -> torch.Tensor:  # type: ignore[override]  # read-only views of MoEMixer's attributes (Granite's fused tensors)
        return self.block_sparse_moe.output_linear.weight

    @property
    def shared_experts(self) -> GraniteSharedMLP:  # type: ignore[override]  # read-only views of MoEMixer's attributes (Granite's fused tensors)
        return self.shared_mlp

    def grouped_experts(self, xs: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
        """:meth:`MoEMixer.grouped_experts` on the fused tensors: one grouped GEMM for gate
        and up (``input_linear``), one for down (``output_linear``)."""
        W = self.cfg.expert_width
        gu = grouped_mm(xs, self.block_sparse_moe.input_linear.weight.transpose(1, 2), counts)
        h = gated_act(self.act, gu[:, :W], gu[:, W:]).contiguous()
        return grouped_mm(h, self.block_sparse_moe.output_linear.weight.transpose(1, 2), counts)

    @torch.no_grad()
    def reset_parameters(self, std: float = 0.02, out_std: float = 0.02) -> None:
        nn.init.normal_(self.block_sparse_moe.router.layer.weight, std=std)
        nn.init.normal_(self.block_sparse_moe.input_linear.weight, std=std)
        nn.init.normal_(self.block_sparse_moe.output_linear.weight, std=out_std)
        if self.cfg.shared_width:
            self.shared_mlp.reset_parameters(std, out_std)
