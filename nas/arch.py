"""The architecture model: frozen block configs per kind and ``ModelArch``.

A block is one residual branch with its own pre-norm: a Llama layer is two blocks
(attention, then FFN); a Nemotron-H layer is one (Mamba, MoE, attention or MLP).
Parameter, weight-byte, KV and state accounting is exact and comes from
:mod:`costmodels.shapes` (one place for the formulas), so the cost model and the
architecture can never disagree.
"""

from __future__ import annotations

import json
import math
from collections import Counter
from collections.abc import Mapping
from functools import cached_property
from typing import TYPE_CHECKING, Annotated, Any, Literal, Union

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, NonNegativeInt, PositiveInt, model_validator

from costmodels import shapes
from costmodels.dtypes import PrecisionRecipe, TensorRole, get_recipe
from costmodels.shapes import BlockTable, Kind
from nas.kinds.base import (  # noqa: F401  (the caps and the base are public here)
    MAX_BLOCKS,
    MAX_CONTEXT,
    MAX_DIM,
    MAX_EXPERTS,
    MAX_HEADS,
    MAX_VOCAB,
    BlockConfig,
    NoOp,
    cap_of,
    check_caps,
    kinds,
    spec_of,
)


class Attention(BlockConfig):
    """Grouped-query attention."""

    kind: Literal["attention"] = "attention"
    num_heads: PositiveInt
    num_kv_heads: PositiveInt
    head_dim: PositiveInt
    sliding_window: PositiveInt | None = None
    rope: bool = True
    qk_norm: bool = False
    qkv_bias: bool = False
    o_bias: bool = False
    output_gate: bool = False
    """Qwen3-Next gated attention: ``q_proj`` also emits a per-channel gate ``g`` (its
    output is ``2 * num_heads * head_dim`` wide, ``[q_h | g_h]`` per head) and the attention
    output is multiplied by ``sigmoid(g)`` before ``o_proj``."""
    rope_dim: PositiveInt | None = None
    """Partial rotary embedding: only the first ``rope_dim`` channels of each head are
    rotated (``partial_rotary_factor * head_dim``); ``None`` rotates all of them."""
    sinks: bool = False
    """gpt-oss learned attention sinks: one logit per query head joins every softmax
    denominator (``num_heads`` parameters; nothing in the KV cache)."""

    @model_validator(mode="after")
    def _check(self) -> Attention:
        if self.num_heads % self.num_kv_heads:
            raise ValueError(
                f"num_heads ({self.num_heads}) must be a multiple of num_kv_heads "
                f"({self.num_kv_heads})"
            )
        if self.rope_dim is not None and (self.rope_dim > self.head_dim or self.rope_dim % 2):
            raise ValueError(f"rope_dim ({self.rope_dim}) must be even and at most head_dim "
                             f"({self.head_dim})")
        return self

    def describe(self) -> str:
        s = f"attention q{self.num_heads}/kv{self.num_kv_heads} d{self.head_dim}"
        return s + (f" window{self.sliding_window}" if self.sliding_window else "")


class Mamba(BlockConfig):
    """Mamba-2 mixer (HF NemotronH layout)."""

    kind: Literal["mamba"] = "mamba"
    num_heads: PositiveInt
    head_dim: PositiveInt
    state_size: PositiveInt
    n_groups: PositiveInt = 1
    conv_kernel: PositiveInt = 4
    conv_bias: bool = True
    proj_bias: bool = False

    @model_validator(mode="after")
    def _check(self) -> Mamba:
        if self.num_heads % self.n_groups:
            raise ValueError(
                f"num_heads ({self.num_heads}) must be a multiple of n_groups ({self.n_groups})"
            )
        return self

    def describe(self) -> str:
        return f"mamba h{self.num_heads}x{self.head_dim} state{self.state_size}"


class MoE(BlockConfig):
    """Routed mixture of experts, optional latent projections and shared expert."""

    kind: Literal["moe"] = "moe"
    num_experts: PositiveInt
    top_k: PositiveInt
    expert_width: PositiveInt
    shared_width: NonNegativeInt = 0
    latent_size: PositiveInt | None = None
    gated: bool = True
    activation: str = "silu"
    router: Literal["softmax", "sigmoid"] = "softmax"
    router_bias: bool = False
    norm_topk: bool = True
    routed_scaling: float = 1.0
    shared_gate: bool = False
    n_group: PositiveInt = 1
    """Group-limited routing (DeepSeek-V3 ``noaux_tc``): the experts form ``n_group`` equal
    groups, each scored by the sum of its two best selection scores; only the experts of the
    ``topk_group`` best groups can be chosen. 1 = no grouping."""
    topk_group: PositiveInt = 1
    router_linear_bias: bool = False
    """gpt-oss: the router is a linear layer with a bias (``num_experts`` parameters)."""
    expert_bias: bool = False
    """gpt-oss: every routed expert has biases on its up/gate (``2 * width``) and down
    (``hidden``) projections."""
    swiglu_limit: float | None = None
    """gpt-oss clamped SwiGLU: with a limit ``L`` and ``swiglu_alpha`` ``a`` an expert
    computes ``(clamp(up, -L, L) + 1) * g * sigmoid(a * g)``, ``g = min(gate, L)``."""
    swiglu_alpha: float | None = None

    @model_validator(mode="after")
    def _check(self) -> MoE:
        if self.top_k > self.num_experts:
            raise ValueError(
                f"top_k ({self.top_k}) must not exceed num_experts ({self.num_experts})"
            )
        if self.n_group > 1 or self.topk_group > 1:
            if self.num_experts % self.n_group or self.num_experts // self.n_group < 2:
                raise ValueError(f"num_experts ({self.num_experts}) must split into n_group "
                                 f"({self.n_group}) equal groups of at least 2")
            if self.topk_group > self.n_group:
                raise ValueError(f"topk_group ({self.topk_group}) must not exceed n_group "
                                 f"({self.n_group})")
            if self.top_k > self.topk_group * (self.num_experts // self.n_group):
                raise ValueError(f"top_k ({self.top_k}) exceeds the experts of the "
                                 f"{self.topk_group} groups routing may pick")
        if (self.swiglu_limit is None) != (self.swiglu_alpha is None):
            raise ValueError("swiglu_limit and swiglu_alpha go together (gpt-oss clamped "
                             "SwiGLU)")
        if self.swiglu_limit is not None and (not self.gated or not (
                math.isfinite(self.swiglu_limit) and self.swiglu_limit > 0
                and math.isfinite(self.swiglu_alpha or 0.0))):
            raise ValueError("the clamped SwiGLU needs gated experts, a finite swiglu_limit > 0 "
                             "and a finite swiglu_alpha")
        return self

    def describe(self) -> str:
        s = f"moe {self.num_experts}x{self.expert_width} top{self.top_k}"
        if self.shared_width:
            s += f" shared{self.shared_width}"
        return s + (f" latent{self.latent_size}" if self.latent_size else "")


class Parallel(BlockConfig):
    """Attention and a Mamba-2 mixer in parallel on the same normed input, outputs summed
    (Falcon-H1's hybrid mixer, HF ``falcon_h1``; the muP multipliers of each branch are the
    model's, :class:`MuP`).

    Either branch may be dropped (``None``: an attention-only or Mamba-only layer), not
    both (that is a :class:`NoOp`). ``mamba_rms_norm``: the Mamba branch ends in a gated
    RMSNorm over groups of ``I / n_groups`` channels (else ``y * silu(z)``, no norm
    weight); ``mamba_norm_before_gate``: that norm is ``norm(y) * silu(z)`` (else ``norm(y
    * silu(z))``, the NemotronH order). The Mamba branch's ``proj_bias`` is the bias of
    both its ``in_proj`` and ``out_proj``. KV cache of the attention branch and conv + SSM
    state of the Mamba branch, both per sequence.
    """

    kind: Literal["parallel"] = "parallel"
    attention: Attention | None
    mamba: Mamba | None
    mamba_rms_norm: bool
    mamba_norm_before_gate: bool

    @model_validator(mode="after")
    def _check(self) -> Parallel:
        if self.attention is None and self.mamba is None:
            raise ValueError("a parallel block needs an attention or a Mamba branch (with "
                             "neither it is a noop block)")
        return self

    def describe(self) -> str:
        a = self.attention.describe() if self.attention else "no attention"
        m = self.mamba.describe() if self.mamba else "no mamba"
        return f"parallel [{a} + {m}]"


class FFN(BlockConfig):
    """Dense MLP: gated (SwiGLU-style, 3 matrices) or not (2 matrices)."""

    kind: Literal["ffn"] = "ffn"
    width: PositiveInt
    gated: bool = True
    activation: str = "silu"
    bias: bool = False

    def describe(self) -> str:
        return f"ffn {self.width}"


class Linear(BlockConfig):
    """A block replaced by one hidden x hidden matrix (keeps its pre-norm)."""

    kind: Literal["linear"] = "linear"


_BUILTIN: tuple[type[BlockConfig], ...] = (Attention, Mamba, MoE, FFN, Linear, NoOp, Parallel)
"""The kinds that predate the registry; the registered ones (:mod:`nas.kinds`) follow."""
if TYPE_CHECKING:  # a registered kind is a BlockConfig to the type checker
    Block = Annotated[Attention | Mamba | MoE | FFN | Linear | NoOp | Parallel | BlockConfig,
                      Field(discriminator="kind")]
else:
    Block = Annotated[Union[(*_BUILTIN, *(k.config for k in kinds().values()))],  # noqa: UP007
                      Field(discriminator="kind")]
BLOCK_TYPES: dict[str, type[BlockConfig]] = {
    "attention": Attention, "mamba": Mamba, "moe": MoE, "ffn": FFN, "linear": Linear, "noop": NoOp,
    "parallel": Parallel,
    **{name: k.config for name, k in kinds().items()},
}
_KIND_CODE = {"attention": Kind.ATTENTION, "mamba": Kind.MAMBA, "moe": Kind.MOE,
              "ffn": Kind.FFN, "linear": Kind.LINEAR, "noop": Kind.NOOP,
              "parallel": Kind.PARALLEL,
              **{name: k.code for name, k in kinds().items()}}


def __getattr__(name: str) -> Any:
    """A registered kind's config class by its name (``nas.arch.Mamba1``): every kind's
    config is importable from here, the registered ones (:mod:`nas.kinds`) as the others."""
    for k in kinds().values():
        if k.config.__name__ == name:
            return k.config
    raise AttributeError(f"module 'nas.arch' has no attribute {name!r}")


def block_row(block: BlockConfig, hidden: int) -> dict[str, int]:
    """The :class:`costmodels.shapes.BlockTable` columns of one block."""
    row: dict[str, int] = {"kind": int(_KIND_CODE[block.kind]), "hidden": hidden}
    registered = spec_of(block)
    if registered is not None:
        row.update(registered.row(block))
    elif isinstance(block, Attention):
        row.update(n_heads=block.num_heads, n_kv_heads=block.num_kv_heads,
                   head_dim=block.head_dim, window=block.sliding_window or 0,
                   qkv_bias=int(block.qkv_bias), o_bias=int(block.o_bias),
                   qk_norm=int(block.qk_norm), attn_gate=int(block.output_gate))
    elif isinstance(block, Mamba):
        row.update(m_heads=block.num_heads, m_head_dim=block.head_dim, state=block.state_size,
                   groups=block.n_groups, conv_kernel=block.conv_kernel,
                   conv_bias=int(block.conv_bias), proj_bias=int(block.proj_bias))
    elif isinstance(block, MoE):
        row.update(experts=block.num_experts, top_k=block.top_k,
                   expert_width=block.expert_width, shared_width=block.shared_width,
                   latent=block.latent_size or 0, router_bias=int(block.router_bias),
                   shared_gate=int(block.shared_gate), gated=int(block.gated))
    elif isinstance(block, FFN):
        row.update(ffn_width=block.width, gated=int(block.gated), ffn_bias=int(block.bias))
    elif isinstance(block, Parallel):  # both branches' columns (a dropped one's stay 0)
        for sub in (block.attention, block.mamba):
            if sub is not None:
                row.update({k: v for k, v in block_row(sub, hidden).items()
                            if k not in ("kind", "hidden")})
        row["ssm_norm"] = int(block.mamba_rms_norm and block.mamba is not None)
    if isinstance(block, Attention) and block.sinks:
        row["sinks"] = 1
    if isinstance(block, MoE):
        row.update(router_lbias=int(block.router_linear_bias),
                   expert_bias=int(block.expert_bias))
    return row


def blocks_table(blocks: list[BlockConfig] | tuple[BlockConfig, ...], hidden: int) -> BlockTable:
    """A :class:`BlockTable` with one row per block."""
    return BlockTable.from_rows([block_row(b, hidden) for b in blocks])


def mtp_table(arch: ModelArch) -> BlockTable | None:
    """The cost rows of ``arch``'s MTP (multi-token prediction) head, or ``None`` without
    one: its blocks, then the head's 2h->h projection priced as two hidden x hidden LINEAR
    rows (an approximation: same weights and FLOPs as the 2h x h matrix, norms as a LINEAR
    row's). Priced with ``draft=True`` rows (``costmodels.blocks.price_blocks``), these are
    what ``puzzle-nas cost --mtp`` and the search add to the main blocks."""
    if not arch.mtp_blocks:
        return None
    proj = BlockTable.from_rows([{"kind": int(Kind.LINEAR), "hidden": arch.hidden_size}] * 2)
    return BlockTable.concat([blocks_table(arch.mtp_blocks, arch.hidden_size), proj])


def serving_table(arch: ModelArch, mtp: bool) -> tuple[BlockTable, np.ndarray | None]:
    """``arch``'s main block rows and, with ``mtp`` and an MTP head, the head's rows after
    them (:func:`mtp_table`), with the ``draft`` mask ``price_blocks`` takes (True on the
    head's rows; ``None`` when no head is priced)."""
    table = arch.table
    head = mtp_table(arch) if mtp else None
    if head is None:
        return table, None
    draft = np.arange(len(table) + len(head)) >= len(table)
    return BlockTable.concat([table, head]), draft


class ParamCounts(BaseModel):
    """Exact parameter counts. Totals include embeddings and LM head and exclude MTP."""

    model_config = ConfigDict(frozen=True)

    total: int
    active: int
    embeddings: int
    lm_head: int
    final_norm: int
    blocks_total: int
    blocks_active: int
    by_kind_total: dict[str, int]
    by_kind_active: dict[str, int]
    mtp: int

    @property
    def total_without_embeddings(self) -> int:
        """Total without the input embedding table and the LM head."""
        return self.total - self.embeddings - self.lm_head

    @property
    def active_without_embeddings(self) -> int:
        """Active without the input embedding table (the LM head is computed every token)."""
        return self.active - self.embeddings


class MuP(BaseModel):
    """Falcon-H1's muP multipliers (HF ``falcon_h1``; every one is a plain scalar factor):
    embeddings times ``embedding``, logits times ``lm_head``; every dense MLP computes
    ``down(act(mlp_gate * gate(x)) * up(x)) * mlp_down``; in every :class:`Parallel` block
    the attention branch reads ``attention_in * x`` with keys times ``key`` and its output
    times ``attention_out``, and the Mamba branch reads ``ssm_in * x``, multiplies the
    parts ``[z | x | B | C | dt]`` of its ``in_proj`` output by ``ssm`` (before the conv)
    and its output by ``ssm_out``."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    embedding: float
    lm_head: float
    mlp_gate: float
    mlp_down: float
    attention_in: float
    key: float
    attention_out: float
    ssm_in: float
    ssm_out: float
    ssm: tuple[float, float, float, float, float]

    @model_validator(mode="after")
    def _finite(self) -> MuP:
        for name, v in self.model_dump().items():
            for x in (v if isinstance(v, tuple | list) else (v,)):
                if not math.isfinite(x):
                    raise ValueError(f"muP multiplier {name} must be finite, got {x!r}")
        if self.lm_head == 0:
            raise ValueError("muP multiplier lm_head must not be 0 (every logit would be 0)")
        return self


class ModelArch(BaseModel):
    """A (possibly heterogeneous) decoder-only model: an ordered list of residual blocks.

    ``model_type`` is the HF type it was imported from (used to pick the export type);
    ``hf_extra`` keeps the HF fields that do not shape the architecture (token ids,
    rope scaling, ...) so that an export carries them through.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    hidden_size: PositiveInt
    vocab_size: PositiveInt
    tie_embeddings: bool = False
    final_norm: bool = True
    blocks: tuple[Block, ...]
    mtp_blocks: tuple[Block, ...] = ()
    norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    model_type: str = ""
    hf_extra_json: str = "{}"
    mup: MuP | None = None
    """Falcon-H1's muP multipliers (``None``: none, every factor 1)."""
    norm_unit_offset: bool = False
    """Zero-centred RMSNorm weights (Qwen3-Next, Gemma): every block pre-norm, the final norm
    and attention's q/k norms scale by ``1 + weight`` (stored weights start at 0). The
    DeltaNet gated norm is not affected (plain ``weight``, as in transformers)."""

    @model_validator(mode="after")
    def _check(self) -> ModelArch:
        check_caps(self)
        n = len(self.blocks) + len(self.mtp_blocks)
        if n > MAX_BLOCKS:
            raise ValueError(f"{n:,} blocks exceed the cap {MAX_BLOCKS:,} (MAX_BLOCKS: 16x the "
                             "deepest published LLM; nas.arch explains each cap)")
        for name in ("norm_eps", "rope_theta"):
            v = getattr(self, name)
            if not math.isfinite(v) or v < 0:
                raise ValueError(f"{name} must be a finite number >= 0, got {v!r}")
        return self

    def check_tp(self, tp: int, field: str = "tp", attention: bool = True) -> None:
        """Tensor parallelism over ``tp`` GPUs must split every head evenly: attention query
        heads and Mamba heads divide by ``tp``, and KV heads are either split (``tp`` divides
        them) or replicated (they divide ``tp``), as vLLM and TensorRT-LLM require. With
        ``attention=False`` (attention data parallelism) attention is not split."""
        from hwprofiles.errors import InputError

        if tp <= 1:
            return
        for i, b in enumerate(self.blocks):
            if isinstance(b, Attention) and attention:
                if b.num_heads % tp:
                    raise InputError(f"{tp} does not divide block {i}'s {b.num_heads} query "
                                     "heads", field=field)
                if b.num_kv_heads % tp and tp % b.num_kv_heads:
                    raise InputError(f"{tp} GPUs cannot split or replicate block {i}'s "
                                     f"{b.num_kv_heads} KV heads (expected tp to divide them "
                                     "or be a multiple of them)", field=field)
            elif isinstance(b, Mamba) and b.num_heads % tp:
                raise InputError(f"{tp} does not divide block {i}'s {b.num_heads} Mamba heads",
                                 field=field)
            elif (k := spec_of(b)) is not None and k.tp_check is not None and \
                    (attention or not k.attention) and \
                    (why := k.tp_check(b, tp)) is not None:
                raise InputError(f"{tp} does not divide block {i}'s {why}", field=field)
        for i, b in enumerate(self.blocks):  # a parallel block splits both of its branches
            if not isinstance(b, Parallel):
                continue
            a, m = b.attention, b.mamba
            if a is not None and attention and (a.num_heads % tp or (
                    a.num_kv_heads % tp and tp % a.num_kv_heads)):
                raise InputError(f"{tp} GPUs cannot split block {i}'s attention branch "
                                 f"({a.num_heads} query heads, {a.num_kv_heads} KV heads; "
                                 "expected tp to divide the query heads and to divide or be "
                                 "a multiple of the KV heads)", field=field)
            if m is not None and m.num_heads % tp:
                raise InputError(f"{tp} does not divide block {i}'s {m.num_heads} Mamba heads",
                                 field=field)

    @property
    def hf_extra(self) -> dict[str, Any]:
        return json.loads(self.hf_extra_json)

    @property
    def num_blocks(self) -> int:
        return len(self.blocks)

    def kind_counts(self) -> dict[str, int]:
        return dict(Counter(b.kind for b in self.blocks))

    def replace_blocks(self, blocks: list[BlockConfig] | tuple[BlockConfig, ...]) -> ModelArch:
        """A copy with other blocks (same embeddings, norms, MTP)."""
        return self.model_copy(update={"blocks": tuple(blocks)})

    def model_copy(self, *, update: Mapping[str, Any] | None = None, deep: bool = False
                   ) -> ModelArch:
        """A copy (``update`` replaces fields); cached derived data is not carried over."""
        new = super().model_copy(update=update, deep=deep)
        new.__dict__.pop("table", None)
        return new

    # ---- accounting -----------------------------------------------------------------
    @cached_property
    def table(self) -> BlockTable:
        """The blocks as a :class:`costmodels.shapes.BlockTable`."""
        return blocks_table(self.blocks, self.hidden_size)

    def block_table(self) -> BlockTable:
        return self.table

    def block_params(self, active: bool = False) -> np.ndarray:
        """Parameters per block (int64)."""
        return shapes.params(self.table, active)

    def nonblock_role_params(self) -> dict[TensorRole, int]:
        return shapes.nonblock_role_params(self.hidden_size, self.vocab_size,
                                           self.tie_embeddings, self.final_norm)

    def mtp_params(self) -> int:
        """MTP parameters: its blocks plus, per MTP depth, the 2h->h projection and 3 norms."""
        if not self.mtp_blocks:
            return 0
        h = self.hidden_size
        t = blocks_table(self.mtp_blocks, h)
        return int(shapes.params(t).sum()) + 2 * h * h + 3 * h

    def param_counts(self) -> ParamCounts:
        """Exact total and active parameter counts, per kind, MTP apart."""
        tot, act = self.block_params(), self.block_params(active=True)
        nb = self.nonblock_role_params()
        by_t: Counter[str] = Counter()
        by_a: Counter[str] = Counter()
        for b, t, a in zip(self.blocks, tot, act):
            by_t[b.kind] += int(t)
            by_a[b.kind] += int(a)
        nonblock = sum(nb.values())
        return ParamCounts(
            total=int(tot.sum()) + nonblock,
            active=int(act.sum()) + nonblock,
            embeddings=nb[TensorRole.EMBEDDINGS],
            lm_head=nb[TensorRole.LM_HEAD],
            final_norm=nb[TensorRole.OTHER],
            blocks_total=int(tot.sum()),
            blocks_active=int(act.sum()),
            by_kind_total=dict(by_t),
            by_kind_active=dict(by_a),
            mtp=self.mtp_params(),
        )

    def weight_bytes(self, recipe: PrecisionRecipe | str = "bf16") -> float:
        """Weight bytes of blocks + embeddings + LM head + final norm under ``recipe`` (no MTP)."""
        r = get_recipe(recipe)
        nb = sum(n * r.weight_bytes_per_param(role) for role, n in
                 self.nonblock_role_params().items())
        return float(shapes.weight_bytes(self.table, r).sum()) + nb

    def weight_bytes_by_role(self, recipe: PrecisionRecipe | str = "bf16") -> dict[str, float]:
        r = get_recipe(recipe)
        out: dict[str, float] = {}
        for role, n in shapes.role_params(self.table).items():
            out[role.value] = float(n.sum()) * r.weight_bytes_per_param(role)
        for role, count in self.nonblock_role_params().items():
            out[role.value] = out.get(role.value, 0.0) + count * r.weight_bytes_per_param(role)
        return {k: v for k, v in out.items() if v}

    def kv_bytes_per_token(self, recipe: PrecisionRecipe | str = "bf16") -> float:
        """KV-cache bytes per token of context, summed over attention blocks.

        Sliding-window blocks count here too; their total is capped at the window length
        (see :meth:`kv_bytes`).
        """
        r = get_recipe(recipe)
        return float(shapes.kv_elems_per_token(self.table).sum()) * r.kv_cache.bytes

    def kv_bytes(self, context: int, recipe: PrecisionRecipe | str = "bf16") -> float:
        """KV-cache bytes of one sequence at ``context`` tokens (windows capped)."""
        return float(shapes.kv_bytes(self.table, get_recipe(recipe), context).sum())

    def state_bytes_per_sequence(self, recipe: PrecisionRecipe | str = "bf16") -> float:
        """Mamba and DeltaNet conv state + recurrent state bytes per sequence (each in its
        own dtype)."""
        return float(shapes.state_bytes_per_sequence(self.table, get_recipe(recipe)).sum())

    def summary(self, recipe: PrecisionRecipe | str = "bf16") -> dict[str, Any]:
        """Plain-data summary (what ``puzzle-nas inspect --json`` prints)."""
        r = get_recipe(recipe)
        pc = self.param_counts()
        return {
            "model_type": self.model_type,
            "num_blocks": self.num_blocks,
            "blocks_by_kind": self.kind_counts(),
            "total_params": pc.total,
            "active_params": pc.active,
            "total_params_without_embeddings": pc.total_without_embeddings,
            "active_params_without_embeddings": pc.active_without_embeddings,
            "embedding_params": pc.embeddings,
            "lm_head_params": pc.lm_head,
            "params_by_kind": pc.by_kind_total,
            "active_params_by_kind": pc.by_kind_active,
            "mtp_params": pc.mtp,
            "precision": r.name,
            "weight_bytes": self.weight_bytes(r),
            "weight_bytes_by_role": self.weight_bytes_by_role(r),
            "kv_bytes_per_token": self.kv_bytes_per_token(r),
            "state_bytes_per_sequence": self.state_bytes_per_sequence(r),
        }
