"""Block shapes as numpy columns, and exact parameter / cache sizes computed from them.

``costmodels`` speaks in shapes, not in ``nas`` objects: a :class:`BlockTable` holds one
row per block (or per alternative) with plain integer columns, and every function here is
vectorized over rows. ``nas.arch`` turns its block configs into a table and reads its
parameter counts from here, so the counting lives in one place.

Parameter layout per kind (h = hidden size; every block but NoOp has a pre-norm of h):

* attention: q ``h*nq*d``, k and v ``h*nkv*d`` each, o ``nq*d*h``; optional qkv bias
  ``(nq+2nkv)*d``, o bias ``h``, q/k norm ``2*d``.
* mamba (Mamba-2, HF NemotronH layout): I = heads*head_dim; in_proj ``h*(2I + 2*g*N + heads)``;
  depthwise conv over ``I + 2*g*N`` channels, ``kernel`` taps (+ bias); ``dt_bias``,
  ``A_log``, ``D`` of ``heads`` each; gated RMSNorm ``I``; out_proj ``I*h``.
* moe: router ``E*h`` (+ ``E`` correction bias; + ``h`` for a sigmoid shared-expert gate,
  as in Qwen2-MoE); with a latent size L the routed experts
  work in L dims, with ``h*L`` down and ``L*h`` up projections around them; each routed
  expert has 2 (relu2) or 3 (SwiGLU) matrices of ``in*width``; a shared expert works in h.
* ffn: 2 or 3 matrices of ``h*width`` (+ biases ``(mats-1)*width + h``).
* linear: one ``h*h`` matrix.
* noop: nothing.
* attention with an output gate (Qwen3-Next): q projection ``2*h*nq*d`` (query and gate).
* deltanet (Gated DeltaNet, Qwen3-Next layout; K = nk*dk, V = nv*dv): in_proj_qkvz
  ``h*(2K + 2V)``, in_proj_ba ``h*2nv``; depthwise conv over ``2K + V`` channels, ``kernel``
  taps, no bias; ``dt_bias`` and ``A_log`` of ``nv`` each; gated RMSNorm ``dv`` (shared by
  the heads); out_proj ``V*h``. State per sequence: ``nv*dk*dv`` recurrent + conv
  ``(2K + V)*(kernel-1)``.
* mla (DeepSeek-V3; nq heads, D = nope + rope, R = kv_lora, Q = q_lora): q_a ``h*Q`` +
  norm ``Q`` + q_b ``Q*nq*D`` (or one q_proj ``h*nq*D`` when Q = 0); kv_a ``h*(R + rope)``
  + norm ``R``; kv_b ``R*nq*(nope + v)``; o ``nq*v*h``. KV cache per token: ``R + rope``.
* attention sinks (gpt-oss): ``nq`` logits. MoE router linear bias ``E``; expert biases
  ``(mats-1)*width + in`` per expert (counted ``top_k`` times when active).
* parallel (Falcon-H1): an attention branch and a Mamba branch (each as its kind above,
  either absent) under one pre-norm; the Mamba branch's gated-norm weight ``I`` only with
  ``ssm_norm``. KV cache of the attention branch and conv + SSM state of the Mamba branch.
* a kind registered in :mod:`costmodels.kinds` (Mamba-1): its module there.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from enum import IntEnum
from typing import Any

import numpy as np

from costmodels.dtypes import PrecisionRecipe, TensorRole


class Kind(IntEnum):
    """Block kind codes used in the ``kind`` column."""

    NOOP = 0
    ATTENTION = 1
    MAMBA = 2
    MOE = 3
    FFN = 4
    LINEAR = 5
    DELTANET = 6
    MLA = 7
    MAMBA1 = 8
    PARALLEL = 9


KIND_NAMES = {k: k.name.lower() for k in Kind}


@dataclass
class BlockTable:
    """Columns describing N blocks; irrelevant columns of a row are 0.

    All columns are int64 numpy arrays of equal length. ``window`` is the sliding-window
    length of an attention block (0 = full attention).
    """

    kind: np.ndarray
    hidden: np.ndarray
    # attention
    n_heads: np.ndarray
    n_kv_heads: np.ndarray
    head_dim: np.ndarray
    window: np.ndarray
    qkv_bias: np.ndarray
    o_bias: np.ndarray
    qk_norm: np.ndarray
    # mamba
    m_heads: np.ndarray
    m_head_dim: np.ndarray
    state: np.ndarray
    groups: np.ndarray
    conv_kernel: np.ndarray
    conv_bias: np.ndarray
    proj_bias: np.ndarray
    # moe
    experts: np.ndarray
    top_k: np.ndarray
    expert_width: np.ndarray
    shared_width: np.ndarray
    latent: np.ndarray
    router_bias: np.ndarray
    shared_gate: np.ndarray
    # moe + ffn
    gated: np.ndarray
    # ffn
    ffn_width: np.ndarray
    ffn_bias: np.ndarray
    # attention output gate (Qwen3-Next gated attention)
    attn_gate: np.ndarray
    # deltanet (conv taps in conv_kernel)
    dn_k_heads: np.ndarray
    dn_v_heads: np.ndarray
    dn_k_dim: np.ndarray
    dn_v_dim: np.ndarray
    # mla (query heads in n_heads; q_lora 0 = a plain q_proj)
    q_lora: np.ndarray
    kv_lora: np.ndarray
    qk_nope: np.ndarray
    qk_rope: np.ndarray
    v_head: np.ndarray
    # gpt-oss: attention sinks; MoE router linear bias and per-expert biases
    sinks: np.ndarray
    router_lbias: np.ndarray
    expert_bias: np.ndarray
    # mamba1 (Jamba; state size in state, conv taps / biases in conv_kernel, conv_bias,
    # proj_bias): inner channels and the time-step rank
    m1_inner: np.ndarray
    dt_rank: np.ndarray
    # parallel (Falcon-H1): the attention and Mamba columns of its two branches, and whether
    # the Mamba branch's gated RMSNorm has a weight (1) or is a plain silu(z) gate (0)
    ssm_norm: np.ndarray

    @classmethod
    def columns(cls) -> list[str]:
        return [f.name for f in fields(cls)]

    @classmethod
    def from_rows(cls, rows: list[dict[str, int]]) -> BlockTable:
        """Build a table from dicts of column values (missing columns are 0)."""
        names = cls.columns()
        unknown = {k for r in rows for k in r} - set(names)
        if unknown:
            raise KeyError(f"unknown BlockTable columns: {sorted(unknown)}")
        data = {n: np.fromiter((int(r.get(n, 0)) for r in rows), dtype=np.int64, count=len(rows))
                for n in names}
        return cls(**data)

    @classmethod
    def concat(cls, tables: list[BlockTable]) -> BlockTable:
        return cls(**{n: np.concatenate([getattr(t, n) for t in tables]) for n in cls.columns()})

    def take(self, index: np.ndarray | list[int]) -> BlockTable:
        idx = np.asarray(index, dtype=np.int64)
        return BlockTable(**{n: getattr(self, n)[idx] for n in self.columns()})

    def __len__(self) -> int:
        return int(self.kind.shape[0])


def _is(t: BlockTable, kind: Kind) -> np.ndarray:
    return (t.kind == int(kind)).astype(np.int64)


def mamba_dims(t: BlockTable) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(inner I = heads*head_dim, in_proj output width, conv channels) per row."""
    inner = t.m_heads * t.m_head_dim
    bc = 2 * t.groups * t.state
    return inner, 2 * inner + bc + t.m_heads, inner + bc


def role_params(t: BlockTable, active: bool = False) -> dict[TensorRole, np.ndarray]:
    """Parameters per tensor role, per row (int64).

    ``active=True`` counts what one token touches: ``top_k`` routed experts instead of all.
    """
    h = t.hidden
    att, mam, moe, ffn, lin = (_is(t, k) for k in
                               (Kind.ATTENTION, Kind.MAMBA, Kind.MOE, Kind.FFN, Kind.LINEAR))
    norm = h * (t.kind != int(Kind.NOOP)).astype(np.int64)

    qd, kvd = t.n_heads * t.head_dim, t.n_kv_heads * t.head_dim
    att_w = att * (2 * h * qd + 2 * h * kvd + t.attn_gate * h * qd)
    att_o = att * (t.qkv_bias * (qd + 2 * kvd) + t.o_bias * h + t.qk_norm * 2 * t.head_dim)

    inner, in_out, conv_ch = mamba_dims(t)
    mam_w = mam * (h * in_out + inner * h)
    mam_o = mam * (t.proj_bias * (in_out + h) + conv_ch * t.conv_kernel
                   + t.conv_bias * conv_ch + 3 * t.m_heads + inner)

    mats = 2 + t.gated
    exp_in = np.where(t.latent > 0, t.latent, h)
    n_exp = t.top_k if active else t.experts
    routed = moe * n_exp * mats * exp_in * t.expert_width
    shared = moe * mats * h * t.shared_width
    moe_o = moe * (t.experts * h + t.router_bias * t.experts + 2 * h * t.latent
                   + t.shared_gate * h)

    ffn_w = ffn * mats * h * t.ffn_width
    ffn_o = ffn * t.ffn_bias * ((mats - 1) * t.ffn_width + h)

    att_o = att_o + att * t.sinks * t.n_heads
    moe_o = moe_o + moe * (t.router_lbias * t.experts
                           + t.expert_bias * n_exp * ((mats - 1) * t.expert_width + exp_in))

    par_roles = parallel_role_params(t, active)
    if par_roles is not None:
        att_w = att_w + par_roles[TensorRole.ATTENTION]
        mam_w = mam_w + par_roles[TensorRole.MAMBA]
        norm = norm + par_roles[TensorRole.OTHER]

    out = {
        TensorRole.ATTENTION: att_w,
        TensorRole.MAMBA: mam_w,
        TensorRole.ROUTED_EXPERTS: routed,
        TensorRole.SHARED_EXPERTS: shared,
        TensorRole.FFN: ffn_w,
        TensorRole.OTHER: norm + att_o + mam_o + moe_o + ffn_o + lin * h * h,
    }
    for code, k in _registered().items():  # costmodels.kinds: each kind's own count
        mask = (t.kind == code).astype(np.int64)
        if mask.any():
            for role, n in k.role_params(t, active).items():
                out[role] = out[role] + mask * n
    return out


def _registered() -> dict[int, Any]:
    from costmodels.kinds import registered  # its modules import this one

    return registered()


def _registered_sum(t: BlockTable, what: str) -> np.ndarray:
    """The sum over registered kinds (:mod:`costmodels.kinds`) of their ``what`` per row,
    each on its own rows (0 elsewhere)."""
    out = np.zeros(len(t), dtype=np.int64)
    for code, k in _registered().items():
        fn = getattr(k, what)
        mask = (t.kind == code).astype(np.int64)
        if fn is not None and mask.any():
            out = out + mask * fn(t)
    return out


def parallel_role_params(t: BlockTable, active: bool = False
                         ) -> dict[TensorRole, np.ndarray] | None:
    """A parallel row's parameters per role, its attention branch's plus its Mamba branch's
    (each counted by its own kind's formula), one pre-norm, and the Mamba gated-norm
    weight only with ``ssm_norm``; ``None`` when no row is parallel."""
    par = _is(t, Kind.PARALLEL)
    if not par.any():
        return None
    noop = int(Kind.NOOP)
    att = role_params(replace(t, kind=np.where(par > 0, int(Kind.ATTENTION), noop)), active)
    mam = role_params(replace(t, kind=np.where(par > 0, int(Kind.MAMBA), noop)), active)
    out = {role: att[role] + mam[role] for role in att}
    # each branch's count has the pre-norm, which the caller counts once already
    out[TensorRole.OTHER] = out[TensorRole.OTHER] - par * (
        2 * t.hidden + (1 - t.ssm_norm) * t.m_heads * t.m_head_dim)
    return out


def params(t: BlockTable, active: bool = False) -> np.ndarray:
    """Total (or active) parameters per row."""
    return sum(role_params(t, active).values())  # type: ignore[return-value]  # sum(): ndarray | int


def weight_bytes(t: BlockTable, recipe: PrecisionRecipe, active: bool = False) -> np.ndarray:
    """Weight bytes per row under ``recipe`` (float64)."""
    out = np.zeros(len(t), dtype=np.float64)
    for role, n in role_params(t, active).items():
        out += n * recipe.weight_bytes_per_param(role)
    return out


def kv_elems_per_token(t: BlockTable) -> np.ndarray:
    """KV-cache elements stored per token of context (K and V), per row; an MLA row stores
    its latent and its shared RoPE key, ``kv_lora + qk_rope``."""
    return (_is(t, Kind.ATTENTION) * 2 * t.n_kv_heads * t.head_dim
            + _is(t, Kind.PARALLEL) * 2 * t.n_kv_heads * t.head_dim
            + _registered_sum(t, "kv_per_token"))


def kv_bytes(t: BlockTable, recipe: PrecisionRecipe, context: int | np.ndarray) -> np.ndarray:
    """KV-cache bytes of one sequence at ``context`` tokens; sliding windows cap the length."""
    ctx = np.asarray(context, dtype=np.float64)
    length = np.where(t.window > 0, np.minimum(t.window, ctx), ctx)
    return kv_elems_per_token(t) * length * recipe.kv_cache.bytes


def conv_state_elems(t: BlockTable) -> np.ndarray:
    """Mamba / DeltaNet conv-state elements per sequence: conv channels x (kernel - 1) past
    inputs."""
    _, _, conv_ch = mamba_dims(t)
    return ((_is(t, Kind.MAMBA) * conv_ch + _is(t, Kind.PARALLEL) * conv_ch * (t.m_heads > 0))
            * np.maximum(t.conv_kernel - 1, 0) + _registered_sum(t, "conv_state"))


def ssm_state_elems(t: BlockTable) -> np.ndarray:
    """Recurrent-state elements per sequence: Mamba heads x head_dim x state size; DeltaNet
    value heads x head_k_dim x head_v_dim; a registered kind's own count."""
    return (_is(t, Kind.MAMBA) * t.m_heads * t.m_head_dim * t.state
            + _is(t, Kind.PARALLEL) * t.m_heads * t.m_head_dim * t.state
            + _registered_sum(t, "ssm_state"))


def state_bytes_per_sequence(t: BlockTable, recipe: PrecisionRecipe) -> np.ndarray:
    """Conv state + SSM state bytes of one sequence, each in its own recipe dtype."""
    return (conv_state_elems(t) * recipe.conv_state.bytes
            + ssm_state_elems(t) * recipe.ssm_state.bytes)


def nonblock_role_params(hidden: int, vocab: int, tied: bool, final_norm: bool = True
                         ) -> dict[TensorRole, int]:
    """Embedding, LM head and final-norm parameters (the non-block term)."""
    emb = hidden * vocab
    return {
        TensorRole.EMBEDDINGS: emb,
        TensorRole.LM_HEAD: 0 if tied else emb,
        TensorRole.OTHER: hidden if final_norm else 0,
    }
