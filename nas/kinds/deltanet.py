"""Gated DeltaNet (the linear attention of arXiv 2412.06464, in Qwen3-Next's layout): the
whole kind.

Its pricing is :mod:`costmodels.kinds.deltanet`, its torch module
:mod:`nas.modules.deltanet`, its inheritance rule :mod:`nas.child.inherit.deltanet` and the
family that ships it :mod:`nas.hf.qwen3_next`; everything else the library asks of a kind
is declared here.
"""

from __future__ import annotations

from itertools import product
from typing import Annotated, Literal

from pydantic import Field, PositiveInt, model_validator

from costmodels.dtypes import TensorRole
from costmodels.shapes import Kind
from nas.kinds.base import (
    MAX_DIM,
    MAX_HEADS,
    AxisSpace,
    BlockConfig,
    KindSpec,
    NoOp,
    register,
)

_MAX_DIM_WHY = "MAX_DIM: 10x the widest published LLM"
_MAX_HEADS_WHY = "MAX_HEADS: 64x the most heads published"


class DeltaNet(BlockConfig):
    """Gated DeltaNet linear attention (Qwen3-Next / Qwen3.5 layout, arXiv 2412.06464).

    ``num_k_heads`` query/key heads of ``head_k_dim`` and ``num_v_heads`` value heads of
    ``head_v_dim`` (a multiple: each query/key head serves ``num_v_heads / num_k_heads``
    consecutive value heads). Per value head a ``head_k_dim x head_v_dim`` state ``S`` is
    decayed by ``exp(g_t)`` and corrected by the delta rule, ``S += beta_t k_t (v_t - S^T
    k_t)^T``; the output ``S^T q_t`` goes through a gated RMSNorm (``silu(z)``) and
    ``out_proj``. A causal depthwise conv (no bias) of ``conv_kernel`` taps runs over
    ``[q | k | v]``. The state is fixed-size: no KV cache.
    """

    kind: Literal["deltanet"] = "deltanet"
    num_k_heads: PositiveInt
    num_v_heads: PositiveInt
    head_k_dim: PositiveInt
    head_v_dim: PositiveInt
    conv_kernel: PositiveInt = 4

    @model_validator(mode="after")
    def _check(self) -> DeltaNet:
        if self.num_v_heads % self.num_k_heads:
            raise ValueError(f"num_v_heads ({self.num_v_heads}) must be a multiple of "
                             f"num_k_heads ({self.num_k_heads})")
        return self

    def describe(self) -> str:
        return (f"deltanet k{self.num_k_heads}x{self.head_k_dim} "
                f"v{self.num_v_heads}x{self.head_v_dim}")


class DeltaNetSpace(AxisSpace):
    """Gated DeltaNet (Qwen3-Next) axes: fewer value heads and / or query-key heads (every
    pair with ``v_heads`` a multiple of ``k_heads``, both at most the parent's, and at most
    the parent's value heads per key head, so that the child inherits whole groups), no-op,
    and
    ``swap``: at every block in range, attention <-> DeltaNet (an attention block may become
    the parent's first DeltaNet shape and a DeltaNet block the parent's first attention
    shape; the model must have both kinds)."""

    v_heads: list[Annotated[int, Field(ge=1, le=MAX_HEADS)]] = Field(default_factory=list)
    k_heads: list[Annotated[int, Field(ge=1, le=MAX_HEADS)]] = Field(default_factory=list)
    noop: bool = False
    swap: bool = False


def _row(b: DeltaNet) -> dict[str, int]:
    return {"dn_k_heads": b.num_k_heads, "dn_v_heads": b.num_v_heads,
            "dn_k_dim": b.head_k_dim, "dn_v_dim": b.head_v_dim, "conv_kernel": b.conv_kernel}


def _alternatives(b: DeltaNet, d: DeltaNetSpace) -> list[BlockConfig]:
    """Value heads x key heads, whole key groups kept (``search_space.deltanet``)."""
    vs = {b.num_v_heads, *d.v_heads}
    ks = {b.num_k_heads, *d.k_heads}
    out: list[BlockConfig] = [b.model_copy(update={"num_v_heads": v, "num_k_heads": k})
                              for v, k in product(sorted(vs, reverse=True),
                                                  sorted(ks, reverse=True))
                              if v <= b.num_v_heads and k <= b.num_k_heads and v % k == 0
                              and v // k <= b.num_v_heads // b.num_k_heads]
    if d.noop:
        out.append(NoOp())
    return out


def _damage(parent: BlockConfig, child: BlockConfig) -> float:
    """Value heads kept, times the key heads kept to the power 0.3; a swap: 0.4 from
    attention, 0.3 back to attention."""
    if not isinstance(parent, DeltaNet):
        return 0.4
    if not isinstance(child, DeltaNet):
        return 0.3
    kept = child.num_v_heads / parent.num_v_heads \
        * (child.num_k_heads / parent.num_k_heads) ** 0.3
    return min(1.0 - kept, 0.95)


def _tp_check(b: DeltaNet, tp: int) -> str | None:
    if b.num_k_heads % tp:
        return f"{b.num_k_heads} DeltaNet key heads"
    return None


_DIALECTS = ("qwen3_next", "qwen3_5_moe_text", "qwen3_5_moe")

SPEC = register(KindSpec(
    name="deltanet",
    config=DeltaNet,
    code=Kind.DELTANET,
    title="Gated DeltaNet",
    row=_row,
    space=DeltaNetSpace,
    alternatives=_alternatives,
    value_axes=(("v_heads", "num_v_heads",
                 "must be <= a DeltaNet block's num_v_heads and a multiple of a k_heads tried "
                 "({})"),
                ("k_heads", "num_k_heads",
                 "must be <= a DeltaNet block's num_k_heads and divide a v_heads tried ({})")),
    damage=_damage,
    tp_check=_tp_check,
    engine_axes={"v_heads": lambda b: b.num_v_heads, "k_heads": lambda b: b.num_k_heads},
    stateful=True,  # conv + recurrent state
    inherit="nas.child.inherit.deltanet:inherit_deltanet",
    # no linears: the Qwen3-Next quantization configs list none of its layers
    hf_dialects=frozenset(_DIALECTS),
    hf_module=dict.fromkeys(_DIALECTS, "linear_attn."),
    caps={"head_k_dim": (MAX_DIM, _MAX_DIM_WHY), "head_v_dim": (MAX_DIM, _MAX_DIM_WHY),
          "num_k_heads": (MAX_HEADS, _MAX_HEADS_WHY),
          "num_v_heads": (MAX_HEADS, _MAX_HEADS_WHY)},
    roles=(TensorRole.ATTENTION, TensorRole.OTHER),
    swap_with="attention",
))
