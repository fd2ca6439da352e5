"""Multi-head latent attention (DeepSeek-V2/V3, arXiv 2405.04434): the whole kind.

Its pricing is :mod:`costmodels.kinds.mla`, its torch module :mod:`nas.modules.mla`, its
inheritance rule :mod:`nas.child.inherit.mla` and the family that ships it
:mod:`nas.hf.deepseek`; everything else the library asks of a kind is declared here.
"""

from __future__ import annotations

from collections.abc import Sequence
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


class MLA(BlockConfig):
    """Multi-head latent attention (DeepSeek-V2/V3, arXiv 2405.04434), HF ``deepseek_v3``
    layout.

    Queries: ``q_b_proj(norm(q_a_proj(x)))`` through a ``q_lora_rank`` bottleneck (or one
    ``q_proj`` when it is ``None``), ``qk_nope_head_dim + qk_rope_head_dim`` per head. Keys
    and values: ``kv_a_proj_with_mqa`` gives a ``kv_lora_rank`` latent (normed) plus one
    shared ``qk_rope_head_dim`` RoPE key; ``kv_b_proj`` up-projects the latent to each head's
    no-RoPE key and ``v_head_dim`` value. The KV cache holds the latent and the RoPE key:
    ``kv_lora_rank + qk_rope_head_dim`` elements per token, whatever the head count.
    ``rope_interleave``: RoPE pairs adjacent channels (DeepSeek's layout) instead of halves.
    """

    kind: Literal["mla"] = "mla"
    num_heads: PositiveInt
    q_lora_rank: PositiveInt | None = None
    kv_lora_rank: PositiveInt
    qk_nope_head_dim: PositiveInt
    qk_rope_head_dim: PositiveInt
    v_head_dim: PositiveInt
    rope_interleave: bool = True

    @model_validator(mode="after")
    def _check(self) -> MLA:
        if self.qk_rope_head_dim % 2:
            raise ValueError(f"qk_rope_head_dim ({self.qk_rope_head_dim}) must be even (RoPE)")
        return self

    def describe(self) -> str:
        q = f" qlora{self.q_lora_rank}" if self.q_lora_rank else ""
        return f"mla q{self.num_heads} kvlora{self.kv_lora_rank}{q}"


class MLASpace(AxisSpace):
    """Multi-head latent attention (DeepSeek-V3) axes, each value at most the parent's:
    query ``heads`` (the output projection shrinks with them; the latent KV cache does not),
    ``kv_lora_ranks`` (the cached latent: KV bytes per token are ``kv_lora_rank +
    qk_rope_head_dim``), ``q_lora_ranks`` (the query bottleneck), every combination; and
    no-op."""

    heads: list[Annotated[int, Field(ge=1, le=MAX_HEADS)]] = Field(default_factory=list)
    kv_lora_ranks: list[Annotated[int, Field(ge=1, le=MAX_DIM)]] = Field(default_factory=list)
    q_lora_ranks: list[Annotated[int, Field(ge=1, le=MAX_DIM)]] = Field(default_factory=list)
    noop: bool = False


def _row(b: MLA) -> dict[str, int]:
    return {"n_heads": b.num_heads, "q_lora": b.q_lora_rank or 0, "kv_lora": b.kv_lora_rank,
            "qk_nope": b.qk_nope_head_dim, "qk_rope": b.qk_rope_head_dim,
            "v_head": b.v_head_dim}


def _alternatives(b: MLA, m: MLASpace) -> list[BlockConfig]:
    """Query heads x latent ranks x query ranks, each at most the parent's
    (``search_space.mla``)."""
    heads = sorted({h for h in {b.num_heads, *m.heads} if h <= b.num_heads}, reverse=True)
    kvr = sorted({r for r in {b.kv_lora_rank, *m.kv_lora_ranks} if r <= b.kv_lora_rank},
                 reverse=True)
    qr: Sequence[int | None] = [b.q_lora_rank]
    if b.q_lora_rank:
        qr = sorted({r for r in {b.q_lora_rank, *m.q_lora_ranks} if r <= b.q_lora_rank},
                    reverse=True)
    out: list[BlockConfig] = [b.model_copy(update={"num_heads": h, "kv_lora_rank": r,
                                                   "q_lora_rank": q})
                              for h, r, q in product(heads, kvr, qr)]
    if m.noop:
        out.append(NoOp())
    return out


def _damage(parent: MLA, child: MLA) -> float:
    """Query heads kept to the power 0.5, times the latent rank kept to the power 0.4 and
    the query rank kept to the power 0.2."""
    kept = ((child.num_heads / parent.num_heads) ** 0.5
            * (child.kv_lora_rank / parent.kv_lora_rank) ** 0.4
            * ((child.q_lora_rank or 1) / (parent.q_lora_rank or 1)) ** 0.2)
    return min(1.0 - kept, 0.95)


def _tp_check(b: MLA, tp: int) -> str | None:
    if b.num_heads % tp:
        return f"{b.num_heads} MLA query heads"
    return None


def _linears(b: MLA) -> tuple[tuple[str, TensorRole], ...]:
    q = ("q_a_proj", "q_b_proj") if b.q_lora_rank else ("q_proj",)
    return tuple((n, TensorRole.ATTENTION)
                 for n in (*q, "kv_a_proj_with_mqa", "kv_b_proj", "o_proj"))


SPEC = register(KindSpec(
    name="mla",
    config=MLA,
    code=Kind.MLA,
    title="multi-head latent attention",
    row=_row,
    space=MLASpace,
    alternatives=_alternatives,
    value_axes=(("heads", "num_heads", "must be <= an MLA block's num_heads ({})"),
                ("kv_lora_ranks", "kv_lora_rank", "must be <= an MLA block's kv_lora_rank ({})"),
                ("q_lora_ranks", "q_lora_rank", "must be <= an MLA block's q_lora_rank ({})")),
    damage=_damage,
    tp_check=_tp_check,
    engine_axes={"heads": lambda b: b.num_heads, "kv_lora_rank": lambda b: b.kv_lora_rank,
                 "q_lora_rank": lambda b: b.q_lora_rank},
    stateful=True,  # the latent KV cache
    inherit="nas.child.inherit.mla:inherit_mla",
    # the writers that hold (or check) it: DeepSeek-V3's family, and gpt-oss's, which shares
    # its refusal rules
    hf_dialects=frozenset({"deepseek_v3", "deepseek_v3_puzzle", "kimi_k2", "gpt_oss",
                           "gpt_oss_puzzle"}),
    caps={"q_lora_rank": (MAX_DIM, _MAX_DIM_WHY), "kv_lora_rank": (MAX_DIM, _MAX_DIM_WHY),
          "qk_nope_head_dim": (MAX_DIM, _MAX_DIM_WHY),
          "qk_rope_head_dim": (MAX_DIM, _MAX_DIM_WHY), "v_head_dim": (MAX_DIM, _MAX_DIM_WHY)},
    attention=True,
    roles=(TensorRole.ATTENTION, TensorRole.OTHER),
    linears_of=_linears,
))
