"""FLOPs and bytes moved by each op, per phase, as closed forms over numpy arrays.

Every function takes broadcastable arrays (one row per block, one column per workload,
or scalars) and returns ``(flops, bytes)`` as float64 arrays. Conventions:

* ``tokens`` is the number of token rows in the pass: ``sequences * isl`` in prefill,
  ``sequences`` in a decode step.
* A multiply-add counts 2 FLOPs. Bytes count reads plus writes of device memory once each
  (flash-style, no spills): weights, activations (``a`` bytes/element), KV cache (``kv``),
  recurrent state (``st``).
* Sizes are per GPU: callers pass already-sharded widths/heads under tensor parallelism.
"""

from __future__ import annotations

import numpy as np

Arr = np.ndarray | float

# FLOPs per element of the small elementwise ops (documented so tests can rebuild them).
NORM_RESIDUAL_FLOPS = 5  # RMSNorm: square, accumulate, scale, weight (4) + residual add (1)
GATED_NORM_FLOPS = 8  # silu(z) (4) + gate multiply (1) + RMSNorm (3)
ACT_FLOPS_GATED = 5  # silu (4) + multiply by the up projection (1)
ACT_FLOPS_PLAIN = 2  # relu^2: max + square
SSD_DECODE_FLOPS = 5  # per state element: decay-multiply, B*x multiply, add (3); C*h (2)
OUTPUT_GATE_FLOPS = 5  # sigmoid (4) + multiply (1) per gated attention output channel
SAMPLING_BYTES_PER_LOGIT = 8  # fp32 logits written by the LM head GEMM epilogue, read by sampling


def gemm(tokens: Arr, k: Arr, n: Arr, w: Arr, a: Arr) -> tuple[Arr, Arr]:
    """``[tokens, k] @ [k, n]``: FLOPs ``2*T*k*n``; bytes ``k*n*w + T*(k+n)*a``."""
    # row-only factors first, so the [rows, workloads] broadcast happens once per term
    kn = k * n
    return (2.0 * kn) * tokens, kn * w + ((k + n) * a) * tokens


def norm_residual(tokens: Arr, h: Arr, a: Arr, w: Arr) -> tuple[Arr, Arr]:
    """Fused residual add + RMSNorm over ``h``: FLOPs ``5*T*h``; bytes ``4*T*h*a + h*w``
    (read input and residual, write residual and normed output; read the norm weight)."""
    return (NORM_RESIDUAL_FLOPS * h) * tokens, (4.0 * h * a) * tokens + h * w


def causal_pairs(length: Arr, window: Arr) -> Arr:
    """Query-key pairs of causal attention over ``length`` tokens, per head and sequence.

    Full attention (``window == 0``): ``S(S+1)/2``. A sliding window ``w < S`` lets each
    query see at most ``w`` keys: ``w(w+1)/2 + (S-w)*w``.
    """
    s = np.asarray(length, dtype=np.float64)
    wdw = np.asarray(window, dtype=np.float64)
    capped = np.where((wdw > 0) & (wdw < s), wdw * (wdw + 1) / 2.0 + (s - wdw) * wdw, 0.0)
    return np.where((wdw > 0) & (wdw < s), capped, s * (s + 1) / 2.0)


def attended(context: Arr, window: Arr) -> Arr:
    """Keys one query attends to at ``context`` tokens: ``min(context, window)`` or context."""
    c = np.asarray(context, dtype=np.float64)
    wdw = np.asarray(window, dtype=np.float64)
    return np.where(wdw > 0, np.minimum(c, wdw), c)


def attention_prefill(seqs: Arr, length: Arr, window: Arr, nq: Arr, nkv: Arr, d: Arr,
                      a: Arr, kv: Arr) -> tuple[Arr, Arr]:
    """Flash-style causal attention over prompts of ``length`` tokens, ``seqs`` of them.

    FLOPs: ``4*d*nq*pairs*seqs`` (QK^T and PV, 2 FLOPs per multiply-add each).
    Bytes: per sequence ``S*(2*nq*d)*a`` (read Q, write O) + ``S*2*nkv*d*a`` (read K, V) +
    ``min(S, window)*2*nkv*d*kv`` (write the KV cache).
    """
    pairs = causal_pairs(length, window)
    flops = 4.0 * d * nq * pairs * seqs
    kept = attended(length, window)
    byts = seqs * (length * (2.0 * nq * d + 2.0 * nkv * d) * a + kept * 2.0 * nkv * d * kv)
    return flops, byts


def attention_decode(seqs: Arr, context: Arr, window: Arr, nq: Arr, nkv: Arr, d: Arr,
                     a: Arr, kv: Arr) -> tuple[Arr, Arr]:
    """One decode step at ``context`` tokens for ``seqs`` sequences (L = attended keys).

    FLOPs: ``4*d*nq*L*seqs``. Bytes: per sequence ``2*nkv*d*L*kv`` (read the cache) +
    ``2*nkv*d*kv`` (append this token's K, V) + ``2*nq*d*a`` (read q, write o).
    """
    L = attended(context, window)
    flops = 4.0 * d * nq * L * seqs
    byts = seqs * (2.0 * nkv * d * (L + 1.0) * kv + 2.0 * nq * d * a)
    return flops, byts


def conv_prefill(seqs: Arr, length: Arr, channels: Arr, kernel: Arr, a: Arr, w: Arr,
                 st: Arr) -> tuple[Arr, Arr]:
    """Causal depthwise conv over ``channels``: FLOPs ``2*T*C*K``; bytes ``2*T*C*a + C*K*w``
    + the final conv state written, ``seqs*C*(K-1)*st`` (T = seqs*length)."""
    t = seqs * length
    flops = 2.0 * t * channels * kernel
    byts = 2.0 * t * channels * a + channels * kernel * w + seqs * channels * (kernel - 1) * st
    return flops, byts


def conv_decode(seqs: Arr, channels: Arr, kernel: Arr, a: Arr, w: Arr, st: Arr
                ) -> tuple[Arr, Arr]:
    """One conv step: FLOPs ``2*B*C*K``; bytes ``2*B*C*a + C*K*w + 2*B*C*(K-1)*st``
    (conv state read and written back)."""
    flops = 2.0 * seqs * channels * kernel
    byts = 2.0 * seqs * channels * a + channels * kernel * w + 2.0 * seqs * channels * (kernel - 1) * st
    return flops, byts


def ssd_prefill(seqs: Arr, length: Arr, heads: Arr, head_dim: Arr, state: Arr, groups: Arr,
                chunk: Arr, a: Arr, st: Arr) -> tuple[Arr, Arr]:
    """Mamba-2 chunked SSD scan over a prompt (chunk ``Q = min(chunk, S)``), per sequence:

    FLOPs ``2*S*Q*(N*G + P*H)`` (intra-chunk C B^T per group, masked product with X per
    head) + ``4*S*N*P*H`` (chunk states B^T X, and outputs C h, per head).
    Bytes ``S*(2*H*P + 2*G*N + H)*a`` (read x, B, C, dt; write y) + ``H*P*N*st`` (final
    state written).
    """
    q = np.minimum(chunk, length)
    flops = seqs * (2.0 * length * q * (state * groups + head_dim * heads)
                    + 4.0 * length * state * head_dim * heads)
    byts = seqs * (length * (2.0 * heads * head_dim + 2.0 * groups * state + heads) * a
                   + heads * head_dim * state * st)
    return flops, byts


def ssd_decode(seqs: Arr, heads: Arr, head_dim: Arr, state: Arr, groups: Arr, a: Arr,
               st: Arr) -> tuple[Arr, Arr]:
    """One recurrent SSM step: FLOPs ``5*B*H*P*N``; bytes ``B*(2*H*P*N*st`` (state read and
    written) ``+ (2*H*P + 2*G*N + H)*a)`` (x, B, C, dt in; y out)."""
    flops = SSD_DECODE_FLOPS * seqs * heads * head_dim * state
    byts = seqs * (2.0 * heads * head_dim * state * st
                   + (2.0 * heads * head_dim + 2.0 * groups * state + heads) * a)
    return flops, byts


def output_gate(tokens: Arr, width: Arr, a: Arr) -> tuple[Arr, Arr]:
    """Gated attention's ``o * sigmoid(g)`` over ``width`` channels: FLOPs ``5*T*W``; bytes
    ``3*T*W*a`` (read o and g, write)."""
    return (OUTPUT_GATE_FLOPS * width) * tokens, (3.0 * width * a) * tokens


def gated_norm(tokens: Arr, inner: Arr, a: Arr, w: Arr) -> tuple[Arr, Arr]:
    """Mamba's gated RMSNorm ``norm(y * silu(z))``: FLOPs ``8*T*I``; bytes ``3*T*I*a + I*w``."""
    return (GATED_NORM_FLOPS * inner) * tokens, (3.0 * inner * a) * tokens + inner * w


def activation(tokens: Arr, width: Arr, gated: Arr, a: Arr) -> tuple[Arr, Arr]:
    """FFN activation over ``width`` channels. Gated (SwiGLU): FLOPs ``5*T*F``, bytes
    ``3*T*F*a`` (read gate and up, write). Plain (relu^2): ``2*T*F``, ``2*T*F*a``."""
    g = np.asarray(gated, dtype=np.float64)
    per = np.where(g > 0, ACT_FLOPS_GATED, ACT_FLOPS_PLAIN)
    io = np.where(g > 0, 3.0, 2.0)
    return (per * width) * tokens, (io * width * a) * tokens


def expected_experts(experts: Arr, top_k: Arr, tokens: Arr) -> Arr:
    """Expected distinct experts touched by ``tokens`` tokens under uniform top-k routing:
    ``E * (1 - (1 - k/E)^T)`` (0 where E = 0)."""
    e = np.asarray(experts, dtype=np.float64)
    safe = np.where(e > 0, e, 1.0)
    frac = np.clip(1.0 - np.asarray(top_k, dtype=np.float64) / safe, 0.0, 1.0)
    return np.where(e > 0, e * (1.0 - frac ** np.asarray(tokens, dtype=np.float64)), 0.0)


def moe_experts(tokens: Arr, experts: Arr, top_k: Arr, width: Arr, e_in: Arr, mats: Arr,
                w: Arr, a: Arr) -> tuple[Arr, Arr]:
    """Routed experts as a grouped GEMM (activation included).

    FLOPs: ``2*T*k*mats*e_in*F`` (each token through k experts of ``mats`` matrices of
    ``e_in x F``) + the activation ``T*k*F*(5 if gated else 2)``.
    Bytes: the weights of the expected distinct experts touched,
    ``E_t*mats*e_in*F*w`` with ``E_t = expected_experts(E, k, T)``, plus per routed token
    copy ``(2*e_in + 2*F)*a`` (input, output, intermediate written and read).
    """
    touched = expected_experts(experts, top_k, tokens)
    gated = np.asarray(mats, dtype=np.float64) > 2
    act = np.where(gated, ACT_FLOPS_GATED, ACT_FLOPS_PLAIN)
    per_copy_flops = (2.0 * mats * e_in + act) * width
    per_copy_bytes = (2.0 * e_in + 2.0 * width) * a
    flops = (top_k * per_copy_flops) * tokens
    byts = touched * (mats * e_in * width * w) + (top_k * per_copy_bytes) * tokens
    return flops, byts


def moe_permute(tokens: Arr, top_k: Arr, e_in: Arr, a: Arr, ep: Arr = 1) -> tuple[Arr, Arr]:
    """Token permutation into expert order and the weighted un-permutation, per GPU:
    no FLOPs to speak of; bytes ``2 * T*k*e_in*a / ep`` each way (read + write a copy of
    every routed token's input, and of its output) = ``4*T*k*e_in*a/ep``."""
    copies = np.asarray(tokens, dtype=np.float64) * top_k / ep
    return 0.0 * copies, 4.0 * copies * e_in * a


def embedding(tokens: Arr, h: Arr, w: Arr, a: Arr) -> tuple[Arr, Arr]:
    """Embedding lookup: no FLOPs; bytes ``T*h*(w + a)`` (gather rows, write activations)."""
    return 0.0 * tokens * h, tokens * h * (w + a)


def lm_head(tokens: Arr, h: Arr, vocab: Arr, w: Arr, a: Arr) -> tuple[Arr, Arr]:
    """LM head GEMM ``[T, h] @ [h, V]`` plus sampling: ``gemm`` + ``8*T*V`` bytes (fp32
    logits written, then read by sampling)."""
    f, b = gemm(tokens, h, vocab, w, a)
    return f, b + SAMPLING_BYTES_PER_LOGIT * tokens * vocab


def alltoall_time(nbytes: Arr, gpus: int, bandwidth: float, efficiency: float,
                  latency: float) -> Arr:
    """All-to-all where each GPU sends ``nbytes`` (already the part leaving it) to the other
    ``gpus - 1``, seconds: ``latency + nbytes / (bandwidth * efficiency)``; 0 when p == 1."""
    if gpus <= 1:
        return 0.0 * np.asarray(nbytes, dtype=np.float64)
    return latency + np.asarray(nbytes, dtype=np.float64) / (bandwidth * efficiency)


def allreduce_time(nbytes: Arr, gpus: int, bandwidth: float, efficiency: float,
                   latency: float) -> Arr:
    """Ring all-reduce of ``nbytes`` over ``gpus`` GPUs, seconds:
    ``latency + 2*(p-1)/p * nbytes / (bandwidth * efficiency)``; 0 when ``p == 1``."""
    if gpus <= 1:
        return 0.0 * np.asarray(nbytes, dtype=np.float64)
    return latency + 2.0 * (gpus - 1) / gpus * np.asarray(nbytes, dtype=np.float64) / (
        bandwidth * efficiency)


# ---- multi-head latent attention (DeepSeek-V2/V3) -----------------------------------------
def rms_norm(tokens: Arr, width: Arr, a: Arr, w: Arr) -> tuple[Arr, Arr]:
    """A plain RMSNorm over ``width`` channels (MLA's latent norms): FLOPs ``4*T*width``
    (square, accumulate, scale, weight); bytes ``2*T*width*a + width*w``."""
    return (4.0 * width) * tokens, (2.0 * width * a) * tokens + width * w
