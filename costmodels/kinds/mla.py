"""Multi-head latent attention (DeepSeek-V3 layout): parameters, KV cache and the ops of one
block, as MLA serving engines run it. nq query heads (the table's ``n_heads``), D = nope +
rope per head, R = ``kv_lora``, Q = ``q_lora`` (0: a plain ``q_proj``), h the hidden size;
the configuration and search space are :mod:`nas.kinds.mla`.

Parameters (attention role): q_a ``h*Q`` + q_b ``Q*nq*D`` (or q_proj ``h*nq*D``),
kv_a_proj_with_mqa ``h*(R + rope)``, kv_b ``R*nq*(nope + v)``, o_proj ``nq*v*h``; the latent
norms ``Q + R`` in OTHER. KV cache per token: the latent and the shared RoPE key,
``R + rope``, whatever the head count.
"""

from __future__ import annotations

import numpy as np

from costmodels import ops
from costmodels.blocks import K_ATTN, _add, _Pricing, _Rows, _scale
from costmodels.dtypes import TensorRole
from costmodels.kinds import KindCosts, register
from costmodels.ops import Arr
from costmodels.shapes import BlockTable, Kind

K_MLA_PROJ = 4  # MLA: fused q_a + kv_a GEMM, q_b (or q) GEMM, latent norms, o GEMM
K_MLA_ABSORB = 2  # MLA decode: the batched W_UK (before) and W_UV (after attention) GEMMs
K_MLA_UP = 1  # MLA prefill: the kv_b up-projection GEMM of the chunk's (and context's) latents


def prefill(seqs: Arr, length: Arr, nq: Arr, nope: Arr, rope: Arr, v: Arr, latent: Arr,
            a: Arr, kv: Arr) -> tuple[Arr, Arr]:
    """MLA prefill: flash attention over the up-projected keys (``nope + rope`` per head) and
    values (``v`` per head) of ``seqs`` prompts of ``length`` tokens.

    FLOPs: ``2*nq*pairs*(nope + rope + v)*seqs`` (QK^T over ``nope + rope``, PV over ``v``).
    Bytes: per sequence ``2*S*nq*(nope + rope + v)*a`` (read Q and the up-projected K, V;
    write O, each once) + ``S*(latent + rope)*kv`` (write the latent cache).
    """
    pairs = ops.causal_pairs(length, 0.0)
    per_head = nope + rope + v
    flops = 2.0 * nq * per_head * pairs * seqs
    byts = seqs * length * (2.0 * nq * per_head * a + (latent + rope) * kv)
    return flops, byts


def decode(seqs: Arr, context: Arr, nq: Arr, rope: Arr, latent: Arr, a: Arr, kv: Arr
           ) -> tuple[Arr, Arr]:
    """One MLA decode step in the absorbed form (FlashMLA, vLLM / SGLang MLA decode): multi-
    query attention of ``nq`` heads over the single cached latent head, keys ``latent +
    rope`` wide, values the ``latent`` part of the same rows.

    FLOPs: ``2*nq*L*(2*latent + rope)*seqs`` (L = context). Bytes: per sequence
    ``(L + 1)*(latent + rope)*kv`` (read the cache once, append this token) +
    ``nq*(2*latent + rope)*a`` (read the absorbed query, write the latent-space output).
    """
    L = np.asarray(context, dtype=np.float64)
    flops = 2.0 * nq * (2.0 * latent + rope) * L * seqs
    byts = seqs * ((L + 1.0) * (latent + rope) * kv + nq * (2.0 * latent + rope) * a)
    return flops, byts


def absorb(tokens: Arr, nq: Arr, nope: Arr, latent: Arr, v: Arr, w: Arr, a: Arr
           ) -> tuple[Arr, Arr]:
    """The decode-time absorbed projections, batched over heads: ``q_nope @ W_UK`` (``nope ->
    latent``) before attention and ``o_latent @ W_UV`` (``latent -> v``) after it; together
    they read all of ``kv_b_proj`` once.

    FLOPs: ``2*T*nq*latent*(nope + v)``. Bytes: ``nq*latent*(nope + v)*w`` +
    ``T*nq*(nope + 2*latent + v)*a``.
    """
    flops = (2.0 * nq * latent * (nope + v)) * tokens
    byts = nq * latent * (nope + v) * w + (nq * (nope + 2.0 * latent + v) * a) * tokens
    return flops, byts


def role_params(t: BlockTable, active: bool = False) -> dict[TensorRole, np.ndarray]:
    """The projections in the attention role; the latent norms in OTHER."""
    h, nq, Q, R = t.hidden, t.n_heads, t.q_lora, t.kv_lora
    D = t.qk_nope + t.qk_rope
    q = np.where(Q > 0, h * Q + Q * nq * D, h * nq * D)
    mats = q + h * (R + t.qk_rope) + R * nq * (t.qk_nope + t.v_head) + nq * t.v_head * h
    return {TensorRole.ATTENTION: mats, TensorRole.OTHER: Q + R}


def price(c: _Pricing, r: _Rows) -> None:
    """Multi-head latent attention, as MLA serving engines run it (vLLM / SGLang / TRT-LLM):

    * every token: the fused ``q_a + kv_a`` projection (``h -> q_lora + kv_lora + rope``), the
      latent norms, ``q_b`` (or ``q_proj``) and ``o_proj``;
    * prompt tokens (prefill, mixed step): ``kv_b`` up-projects the chunk's latents (and the
      earlier chunks' cached latents it attends to) to per-head keys and values, then flash
      attention over them (:func:`prefill`); the latent is cached;
    * decoding tokens: the absorbed form, no up-projection of the cache: ``W_UK`` folds into
      the query and ``W_UV`` into the output (:func:`absorb`), and
      attention reads the latent cache once as one shared head for all query heads
      (:func:`decode`).

    Under TP the query heads split over the GPUs; the latent cache and the ``q_a / kv_a``
    projections are replicated (every GPU attends over the whole latent).
    """
    h, q1, a, kvb = r.h, r.q1, c.a, c.kvb
    nq, Q, R, nope, P, V = (r.col(n) for n in ("n_heads", "q_lora", "kv_lora", "qk_nope",
                                               "qk_rope", "v_head"))
    w, dt, wo = c.wb[TensorRole.ATTENTION], c.cd[TensorRole.ATTENTION], c.wb[TensorRole.OTHER]
    q_in = np.where(Q > 0, Q, h)
    for _, dseq, T, out in r.steps:
        proj = _add(_add(ops.gemm(T, h, Q + R + P, w, a), ops.gemm(T, q_in, nq * (nope + P), w, a)),
                    ops.gemm(T, nq * V, h, w, a))
        out.append(c.gemm_t(proj, dt, K_MLA_PROJ))
        out.append(c.elem_t(ops.rms_norm(T, Q + R, a, wo), 0.0))  # fused in K_MLA_PROJ
        on = (dseq > 0) * 1.0
        out.append(c.gemm_t(_scale(absorb(dseq * q1, nq, nope, R, V, w, a), on), dt,
                            K_MLA_ABSORB * on))
        fa, ba = decode(dseq, c.C, nq, P, R, a, kvb)
        # a verification step: 1 + d query tokens per sequence over one read of the cache
        out.append(c.attn_t((fa * q1, ba + dseq * (q1 - 1.0) * nq * (2.0 * R + P) * a),
                            K_ATTN * on, kv_read=True))
    up = ops.gemm(c.Tc + c.reread, R, nq * (nope + V), w, a)
    r.out_m.append(c.gemm_t(up, dt, K_MLA_UP))
    r.out_m.append(c.attn_t(prefill(c.Bp, c.S, nq, nope, P, V, R, a, kvb), K_ATTN))
    rr = c.reread * (R + P) * kvb
    r.out_m.append(c.attn_t((0.0 * rr, rr), 0.0, kv_read=True))


COSTS = register(KindCosts(
    code=Kind.MLA,
    role_params=role_params,
    price=price,
    kv_per_token=lambda t: t.kv_lora + t.qk_rope,
    widest=lambda t: t.n_heads * (2 * t.qk_nope + t.qk_rope + t.v_head),
    # the query heads split (n_heads, which attention splits too); the latent cache and the
    # q_a / kv_a projections are replicated
))
