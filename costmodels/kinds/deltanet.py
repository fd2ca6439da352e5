"""Gated DeltaNet (Qwen3-Next layout): parameters, state and the ops of one block, as FLA's
kernels run it in vLLM. K = nk*dk key width, V = nv*dv value width, h the hidden size; the
configuration and search space are :mod:`nas.kinds.deltanet`.

Parameters: in_proj_qkvz ``h*(2K + 2V)`` and in_proj_ba ``h*2nv`` (attention role, with
out_proj ``V*h``); the depthwise conv over ``[q | k | v]`` (``2K + V`` channels, ``kernel``
taps, no bias), ``dt_bias`` and ``A_log`` (``nv`` each) and the gated norm's ``dv`` weights.
State per sequence: ``nv*dk*dv`` recurrent + conv ``(2K + V)*(kernel-1)``.
"""

from __future__ import annotations

import numpy as np

from costmodels import ops
from costmodels.blocks import K_PROJ2, _add, _Pricing, _Rows, _scale, _verify_state_bytes
from costmodels.dtypes import TensorRole
from costmodels.kinds import KindCosts, register
from costmodels.ops import Arr
from costmodels.shapes import BlockTable, Kind

DEFAULT_GDN_CHUNK = 64  # Gated DeltaNet chunk length (tokens): FLA's and transformers' chunk
GDN_DECODE_FLOPS = 7  # per state element: decay (1), S^T k (2), rank-1 update (2), S^T q (2)
K_GDN_PREFILL = 6  # FLA chunk_gated_delta_rule: chunk-local cumsum of g, beta K K^T, triangular
#                    solve, recompute w and u, chunked state recurrence, chunk output
K_GDN_DECODE = 1  # one fused recurrent gated-delta-rule kernel per decode step


def dims(t: BlockTable) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(key width K = nk*dk, value width V = nv*dv, input projection width 2K + 2V + 2nv,
    conv channels 2K + V) per row."""
    kd = t.dn_k_heads * t.dn_k_dim
    vd = t.dn_v_heads * t.dn_v_dim
    return kd, vd, 2 * kd + 2 * vd + 2 * t.dn_v_heads, 2 * kd + vd


def scan_prefill(seqs: Arr, length: Arr, k_heads: Arr, v_heads: Arr, dk: Arr, dv: Arr,
                 chunk: Arr, a: Arr, st: Arr) -> tuple[Arr, Arr]:
    """Gated DeltaNet chunked prefill (the WY / UT-transform form that FLA's
    ``chunk_gated_delta_rule`` runs and transformers' torch path mirrors), chunk
    ``Q = min(chunk, S)``, per sequence and value head:

    FLOPs per token ``4*Q*dk`` (``beta K K^T`` and ``Q K^T`` within the chunk) ``+ Q^2/3``
    (inverting the unit-lower ``Q x Q`` system once per chunk) ``+ 2*Q*(dk + dv)`` (the
    transformed keys ``w`` and values ``u``) ``+ 2*Q*dv`` (intra-chunk attention times the
    corrected values) ``+ 6*dk*dv`` (corrected values ``u - w S``, readout ``q S`` and the
    chunk's state update ``K^T U``).
    Bytes ``S*(2*nk*dk + 2*nv*dv + 2*nv)*a`` (read q, k, v, g, beta; write o) ``+
    nv*dk*dv*st`` (final state written).
    """
    q = np.minimum(chunk, length)
    per_tok = 4.0 * q * dk + q * q / 3.0 + 2.0 * q * (dk + dv) + 2.0 * q * dv + 6.0 * dk * dv
    flops = seqs * length * v_heads * per_tok
    byts = seqs * (length * (2.0 * k_heads * dk + 2.0 * v_heads * dv + 2.0 * v_heads) * a
                   + v_heads * dk * dv * st)
    return flops, byts


def scan_decode(seqs: Arr, k_heads: Arr, v_heads: Arr, dk: Arr, dv: Arr, a: Arr,
                st: Arr) -> tuple[Arr, Arr]:
    """One recurrent gated-delta-rule step: FLOPs ``7*B*nv*dk*dv``; bytes ``B*(2*nv*dk*dv*st``
    (state read and written) ``+ (2*nk*dk + 2*nv*dv + 2*nv)*a)`` (q, k, v, g, beta in; o out)."""
    flops = GDN_DECODE_FLOPS * seqs * v_heads * dk * dv
    byts = seqs * (2.0 * v_heads * dk * dv * st
                   + (2.0 * k_heads * dk + 2.0 * v_heads * dv + 2.0 * v_heads) * a)
    return flops, byts


def role_params(t: BlockTable, active: bool = False) -> dict[TensorRole, np.ndarray]:
    """The input and output projections in the attention role; conv, ``dt_bias``, ``A_log``
    and the gated norm in OTHER."""
    h = t.hidden
    _, vd, in_w, conv_ch = dims(t)
    return {TensorRole.ATTENTION: h * in_w + vd * h,
            TensorRole.OTHER: conv_ch * t.conv_kernel + 2 * t.dn_v_heads + t.dn_v_dim}


def price(c: _Pricing, r: _Rows) -> None:
    """Gated DeltaNet: fused input projection (qkvz + ba), causal conv over ``[q | k | v]``,
    the gated delta rule (chunked in prefill, recurrent in decode), gated RMSNorm,
    output projection. Weights in the attention role; conv and state in the recipe's conv-
    and SSM-state dtypes."""
    h, q1, a = r.h, r.q1, c.a
    nk, nv, dk, dv, K = (r.col(n) for n in ("dn_k_heads", "dn_v_heads", "dn_k_dim",
                                            "dn_v_dim", "conv_kernel"))
    kd, vd = nk * dk, nv * dv
    in_w, conv_ch = 2 * kd + 2 * vd + 2 * nv, 2 * kd + vd
    w, dt, wo = c.wb[TensorRole.ATTENTION], c.cd[TensorRole.ATTENTION], c.wb[TensorRole.OTHER]
    for _, dseq, T, out in r.steps:
        proj = _add(ops.gemm(T, h, in_w, w, a), ops.gemm(T, vd, h, w, a))
        out.append(c.gemm_t(proj, dt, K_PROJ2))
        out.append(c.elem_t(ops.gated_norm(T, vd, a, wo), 1))
        on = (dseq > 0) * 1.0
        out.append(c.state_t(_scale(ops.conv_decode(dseq * q1, conv_ch, K, a, wo, c.csb),
                                    on), on))
        fs, bs = scan_decode(dseq, nk, nv, dk, dv, a, c.ssb)
        st_io = dseq * nv * dk * dv * c.ssb
        out.append(c.state_t((fs * q1, _verify_state_bytes(bs, st_io, q1)),
                             K_GDN_DECODE * on))
    r.out_m.append(c.elem_t(ops.conv_prefill(c.Bp, c.S, conv_ch, K, a, wo, c.csb), 1))
    r.out_m.append(c.gemm_t(scan_prefill(c.Bp, c.S, nk, nv, dk, dv, DEFAULT_GDN_CHUNK,
                                         a, c.ssb), c.act_dtype, K_GDN_PREFILL))


COSTS = register(KindCosts(
    code=Kind.DELTANET,
    role_params=role_params,
    price=price,
    conv_state=lambda t: dims(t)[3] * np.maximum(t.conv_kernel - 1, 0),
    ssm_state=lambda t: t.dn_v_heads * t.dn_k_dim * t.dn_v_dim,
    widest=lambda t: dims(t)[2],  # the fused input projection
    # vLLM shards both head counts; every GPU keeps whole key/value head groups
    tp_columns=("dn_k_heads", "dn_v_heads"),
))
