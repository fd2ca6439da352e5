"""Mamba-1 (Jamba layout): parameters, state and the ops of one block, as vLLM's
``MambaMixer`` runs it. I = ``m1_inner`` channels, N = ``state``, R = ``dt_rank``, h the
hidden size; the configuration and search space are :mod:`nas.kinds.mamba1`.

Parameters: in_proj ``h*2I`` (+ ``2I`` bias), depthwise conv over ``I`` channels,
``kernel`` taps (+ ``I`` bias), x_proj ``I*(R + 2N)``, dt_proj ``R*I`` + bias ``I``,
``A_log`` ``I*N``, ``D`` ``I``, RMSNorms on dt, B, C ``R + 2N``, out_proj ``I*h`` (+ ``h``
bias). State per sequence: ``I*N`` recurrent + conv ``I*(kernel-1)``.
"""

from __future__ import annotations

import numpy as np

from costmodels import ops
from costmodels.blocks import K_PROJ2, _add, _Pricing, _Rows, _scale, _verify_state_bytes
from costmodels.dtypes import TensorRole
from costmodels.kinds import KindCosts, register
from costmodels.ops import Arr
from costmodels.parallel import allreduce_bytes
from costmodels.shapes import BlockTable, Kind

SCAN_FLOPS = 7  # per state element and token: exp(dt*A) (2), dt*x*B (1), update (2),
#                 readout S*C (2)
CHANNEL_FLOPS = 7  # per channel and token: dt*x (1), D*x skip (2), silu(z) gate (4)
K_XDT = 3  # kernels: the x_proj GEMM, the dt / B / C RMSNorms, the dt_proj GEMM
K_SCAN = 1  # kernels: one fused selective-scan kernel (prefill) or state update (decode)


def scan_prefill(seqs: Arr, length: Arr, inner: Arr, state: Arr, a: Arr, st: Arr
                 ) -> tuple[Arr, Arr]:
    """Mamba-1 selective scan over a prompt (``mamba_ssm``'s ``selective_scan_fwd``: one
    fused kernel, the scan sequential in time and parallel over channels; the ``D`` skip and
    the ``silu(z)`` gate fused in), per sequence of ``S`` tokens:

    FLOPs ``S*I*(7*N + 7)``: per channel and state element the discretized decay
    ``exp(dt*A)`` (2), ``dt*x*B`` (1), the state update ``dA*S + dBx`` (2) and the readout
    ``S*C`` (2); per channel ``dt*x`` (1), the skip ``D*x`` (2) and the gate ``silu(z)*y``
    (4). Bytes ``S*(4*I + 2*N)*a`` (read x, dt, z, B, C; write y) ``+ I*N*st`` (final state
    written).
    """
    flops = seqs * length * inner * (SCAN_FLOPS * state + CHANNEL_FLOPS)
    byts = seqs * (length * (4.0 * inner + 2.0 * state) * a + inner * state * st)
    return flops, byts


def scan_decode(seqs: Arr, inner: Arr, state: Arr, a: Arr, st: Arr) -> tuple[Arr, Arr]:
    """One Mamba-1 state update (``selective_state_update``): FLOPs ``B*I*(7*N + 7)`` (as
    :func:`scan_prefill` per token); bytes ``B*(2*I*N*st`` (state read and written)
    ``+ (4*I + 2*N)*a)`` (x, dt, z, B, C in; y out)."""
    flops = seqs * inner * (SCAN_FLOPS * state + CHANNEL_FLOPS)
    byts = seqs * (2.0 * inner * state * st + (4.0 * inner + 2.0 * state) * a)
    return flops, byts


def role_params(t: BlockTable, active: bool = False) -> dict[TensorRole, np.ndarray]:
    """Matrices (in_proj, x_proj, dt_proj, out_proj) in the Mamba role; conv, biases,
    ``A_log``, ``D`` and the dt / B / C norms in OTHER."""
    h, inner, n, r = t.hidden, t.m1_inner, t.state, t.dt_rank
    mats = 2 * h * inner + inner * (r + 2 * n) + r * inner + inner * h
    rest = (inner * t.conv_kernel + t.conv_bias * inner + inner + inner * n + inner
            + r + 2 * n + t.proj_bias * (2 * inner + h))
    return {TensorRole.MAMBA: mats, TensorRole.OTHER: rest}


def price(c: _Pricing, r: _Rows) -> None:
    """The ``in_proj`` GEMM (``h -> 2I``: x and the gate z); the causal conv over the I
    channels of x; ``x_proj`` (``I -> R + 2N``), Jamba's RMSNorms on dt, B and C, ``dt_proj``
    (``R -> I``); the selective scan (chunk-free: one fused kernel over the prompt,
    :func:`scan_prefill`; one state update per decoding token, :func:`scan_decode`) with the
    D skip and the ``silu(z)`` gate fused in; the ``out_proj`` GEMM. Projections in the
    Mamba role; conv and state in the recipe's conv- and SSM-state dtypes. The state is
    ``I x N`` per sequence, whatever the context. Under TP the channels split
    (``I/tp`` per GPU); ``x_proj`` is row-parallel, so its ``R + 2N`` outputs per token are
    all-reduced before the norms (beyond the block's output all-reduce). The scan is priced
    on the activation dtype's roof, as the other scans: at ``(7N + 7) / (4a)`` FLOP per byte
    (about 15 for N = 16 in bf16) it is memory-bound on every profile."""
    h, q1, a = r.h, r.q1, c.a
    inner, N, R, K = (r.col(n) for n in ("m1_inner", "state", "dt_rank", "conv_kernel"))
    w, dt, wo = c.wb[TensorRole.MAMBA], c.cd[TensorRole.MAMBA], c.wb[TensorRole.OTHER]
    link = c.link
    for _, dseq, T, out in r.steps:
        proj = _add(ops.gemm(T, h, 2 * inner, w, a), ops.gemm(T, inner, h, w, a))
        out.append(c.gemm_t(proj, dt, K_PROJ2))
        xdt = _add(ops.gemm(T, inner, R + 2 * N, w, a), ops.gemm(T, R, inner, w, a))
        out.append(c.gemm_t(_add(xdt, ops.rms_norm(T, R + 2 * N, a, wo)), dt, K_XDT))
        if c.tpx > 1:
            out.append(ops.allreduce_time(allreduce_bytes(T, R + 2 * N, a), c.tpx,
                                          link.bandwidth.value, c.link_eff,
                                          link.latency.value))
        on = (dseq > 0) * 1.0
        out.append(c.state_t(_scale(ops.conv_decode(dseq * q1, inner, K, a, wo, c.csb), on),
                             on))
        fs, bs = scan_decode(dseq, inner, N, a, c.ssb)
        st_io = dseq * inner * N * c.ssb  # verify steps: as Mamba-2's (_verify_state_bytes)
        out.append(c.state_t((fs * q1, _verify_state_bytes(bs, st_io, q1)), K_SCAN * on))
    r.out_m.append(c.elem_t(ops.conv_prefill(c.Bp, c.S, inner, K, a, wo, c.csb), 1))
    r.out_m.append(c.state_t(scan_prefill(c.Bp, c.S, inner, N, a, c.ssb), K_SCAN))


COSTS = register(KindCosts(
    code=Kind.MAMBA1,
    role_params=role_params,
    price=price,
    conv_state=lambda t: t.m1_inner * np.maximum(t.conv_kernel - 1, 0),
    ssm_state=lambda t: t.m1_inner * t.state,
    widest=lambda t: 2 * t.m1_inner,  # in_proj: x and z
    # vLLM's MambaMixer: in_proj and dt_proj column-parallel, x_proj and out_proj
    # row-parallel; the dt / B / C norms are replicated
    tp_columns=("m1_inner",),
))
