"""Vectorized per-block costs: N block rows x W workloads in one numpy pass per block kind.

The contract the search relies on: **costs are additive over blocks**. For a model made of
rows ``i`` of a :class:`BlockTable` plus the non-block term (``costmodels.model``):

* ``TTFT[w]   = sum_i prefill_s[i, w] + nonblock.prefill_s[w]``                  (seconds)
* ``TPOT[w]   = sum_i decode_s[i, w]  + nonblock.decode_s[w]``                   (seconds)
* ``runtime[w] = sum_i runtime_s[i, w] + nonblock.runtime_s[w]``: the cycle in which the
  ``tp`` GPUs of one model instance serve B requests (B = batch, or the running requests
  of a concurrency); TTFT, TPOT and cycle are fixed combinations of one block's time in a
  *mixed* step (prompt chunk + decodes) and in a *decode* step (:func:`serving_shares`,
  derivation in ``costmodels.model``).
* weights / KV / state bytes per GPU: plain sums over rows.

Each block's time is the sum of its ops' roofline times (``costmodels.roofline``) plus its
tensor-parallel all-reduce. Decode is priced at the mean context of the generated tokens
(``isl + osl/2``): exact wherever a block's decode time is linear in context.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from costmodels import ops
from costmodels.dtypes import PrecisionRecipe, TensorRole
from costmodels.kinds import registered as registered_kinds
from costmodels.parallel import allreduce_bytes, check_parallel, linear_cols, shard_table
from costmodels.roofline import Roof
from costmodels.shapes import (
    KIND_NAMES,
    BlockTable,
    Kind,
    kv_elems_per_token,
    mamba_dims,
    role_params,
    state_bytes_per_sequence,
)
from costmodels.workload import Workload, parse_workload
from hwprofiles.engines import compute_dtype, find_engine
from hwprofiles.errors import InputError
from hwprofiles.schema import EngineProfile, HardwareProfile

DEFAULT_SSD_CHUNK = 128  # Mamba-2 chunk length (tokens), the NemotronH / Mamba-2 default

# Kernels launched per op in one pass of a block; each launch pays the profile's
# ``kernel_overhead_s`` once. The counts are those of a fused serving engine's kernels
# (TensorRT-LLM / vLLM), not of an eager framework.
K_NORM = 1  # residual add fused with RMSNorm
K_PROJ2 = 2  # a mixer's two projections: fused input (QKV, in_proj, up+gate) and output
K_ATTN = 2  # attention: the KV-cache append (RoPE fused in) and the flash-attention kernel
K_SSD_PREFILL = 5  # Mamba-2 chunked scan (SSD): chunk cumsum, chunk states, state passing
#                    across chunks, C B^T per chunk, chunk scan (mamba_chunk_scan_combined)
K_SSD_DECODE = 1  # one selective-state-update kernel per decode step
K_GATE = 1  # gated attention: sigmoid(g) * o, one elementwise kernel
K_ROUTER = 2  # MoE router GEMM, then top-k selection / softmax
K_EXPERTS = 5  # routed experts: expert offsets (sort tokens by expert), grouped GEMM up
#                (and gate), activation, grouped GEMM down, top-k weighted finalize
K_SHARED = 3  # shared expert: up (and gate) GEMM, activation, down GEMM
K_PERMUTE = 2  # permute tokens into expert order, and un-permute (weighted scatter)


@dataclass
class BlockCosts:
    """Per-row x per-workload costs of a block table on one hardware profile.

    All byte figures are **per GPU** of the ``tp`` GPUs serving one model instance.

    Attributes:
        workloads: the W workloads, in column order.
        tp, ep: the parallel layout priced.
        prefill_s: ``[N, W]`` seconds, each block's share of the time to first token (one
            pass over the ``B * isl`` prompt tokens in batch mode).
        decode_s: ``[N, W]`` seconds, each block's share of the time per output token at
            the mean generated context ``isl + osl/2`` (one decode step of batch B in batch
            mode).
        runtime_s: ``[N, W]`` seconds, ``prefill_s + (osl-1) * decode_s``: the block's share
            of the cycle that serves B requests.
        memory_bytes: ``[N, W]`` bytes, ``weight_bytes + B * (kv at isl+osl + state)``.
        weight_bytes: ``[N]`` bytes of weights.
        kv_bytes_per_token: ``[N]`` KV-cache bytes per token of context (uncapped).
        window: ``[N]`` sliding window (tokens; 0 = full): KV length is ``min(ctx, window)``.
        state_bytes_per_sequence: ``[N]`` conv + SSM state bytes per sequence.
        workspace_bytes_per_token: ``[N]`` activation bytes per in-flight token (the
            widest intermediate plus input and output); the model's workspace is a max over
            rows, not a sum.
    """

    workloads: tuple[Workload, ...]
    tp: int
    ep: int
    prefill_s: np.ndarray
    decode_s: np.ndarray
    runtime_s: np.ndarray
    memory_bytes: np.ndarray
    weight_bytes: np.ndarray
    kv_bytes_per_token: np.ndarray
    window: np.ndarray
    state_bytes_per_sequence: np.ndarray
    workspace_bytes_per_token: np.ndarray
    no_overlap: np.ndarray | None = None
    """``[N, W]`` bool: the row makes the serving engine run that workload without its
    overlap scheduler (``EngineProfile.no_overlap``, :func:`no_overlap_rows`); ``None``:
    no row does."""

    def __len__(self) -> int:
        return int(self.weight_bytes.shape[0])

    def kv_bytes(self, context: int | float) -> np.ndarray:
        """``[N]`` KV-cache bytes of one sequence at ``context`` tokens (windows cap it)."""
        return self.kv_bytes_per_token * ops.attended(float(context), self.window)

    def take(self, rows: Sequence[int] | np.ndarray) -> BlockCosts:
        """The costs of a subset of rows (e.g. one child architecture), same workloads."""
        idx = np.asarray(rows, dtype=np.int64)
        return BlockCosts(
            workloads=self.workloads, tp=self.tp, ep=self.ep,
            **{k: getattr(self, k)[idx] for k in _ROW_FIELDS},
            no_overlap=None if self.no_overlap is None else self.no_overlap[idx],
        )

    @staticmethod
    def concat(parts: Sequence[BlockCosts]) -> BlockCosts:
        """The rows of ``parts`` one after the other (same workloads, tp and ep), e.g. a
        model's main blocks and its MTP head priced with ``draft`` rows."""
        first = parts[0]
        for p in parts[1:]:
            if (p.workloads, p.tp, p.ep) != (first.workloads, first.tp, first.ep):
                raise ValueError("BlockCosts.concat needs the same workloads, tp and ep")
        flags = None
        if any(p.no_overlap is not None for p in parts):
            flags = np.concatenate([p.no_overlap if p.no_overlap is not None else
                                    np.zeros((len(p), len(p.workloads)), bool) for p in parts])
        return BlockCosts(
            workloads=first.workloads, tp=first.tp, ep=first.ep,
            **{k: np.concatenate([getattr(p, k) for p in parts]) for k in _ROW_FIELDS},
            no_overlap=flags,
        )


_ROW_FIELDS = ("prefill_s", "decode_s", "runtime_s", "memory_bytes", "weight_bytes",
               "kv_bytes_per_token", "window", "state_bytes_per_sequence",
               "workspace_bytes_per_token")


def _scale(fb: tuple, m: np.ndarray) -> tuple:
    """(flops, bytes) times a 0/1 presence mask (an absent op moves no activations)."""
    return fb[0] * m, fb[1] * m


def _workload_columns(workloads: Sequence[Workload]) -> dict[str, np.ndarray]:
    def row(vals: list[float]) -> np.ndarray:
        return np.asarray(vals, dtype=np.float64)[None, :]

    return {
        "B": row([w.sequences for w in workloads]),
        "NC": row([w.prefill_chunks for w in workloads]),
        "Bp": row([w.prefill_sequences / w.prefill_chunks for w in workloads]),
        "S": row([w.isl for w in workloads]),
        "C": row([w.mean_decode_context for w in workloads]),
        "M": row([max(1.0, w.isl / w.chunk_tokens) for w in workloads]),
        "O": row([w.osl for w in workloads]),
        "D": row([w.draft_tokens for w in workloads]),
        "A": row([w.acceptance for w in workloads]),
        "ctx": row([w.max_context for w in workloads]),
        "MX": row([1.0 if w.mixed_prefill or not w.chunked else 0.0 for w in workloads]),
    }


def decode_steps(wc: dict[str, np.ndarray]) -> np.ndarray:
    """Decode-only steps per cycle: ``max(O' - n_c, 0)`` when prompt chunks ride with the
    decodes (the other ``n_c`` steps of a request's life are mixed steps), ``O' - 1`` when
    prefill steps run alone (``mixed_prefill`` off: every request decodes in its own
    ``O' - 1`` steps, all B together, and waits through the cycle's ``n_c`` prefill steps)."""
    NC, Osl, A, MX = wc["NC"], wc["O"], wc["A"], wc["MX"]
    oeff = 1.0 + (Osl - 1.0) / A
    return np.where(MX > 0, np.maximum(oeff - NC, 0.0), np.maximum(oeff - 1.0, 0.0))


def serving_shares(mix: np.ndarray, dec: np.ndarray, wc: dict[str, np.ndarray]
                   ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """TTFT, TPOT and cycle shares from the times of a mixed step and of a decode step
    (``costmodels.model`` derives them): with ``n_c`` chunks per cycle and ``O' = 1 +
    (osl - 1) / acceptance`` engine steps in a request's life,

    * ``cycle = n_c * mix + n_d * dec`` (``n_d``: :func:`decode_steps`),
    * ``ttft = (max(n_c - O', 0) + m) * mix`` (``m = max(1, isl / chunk)`` steps carry
      one prompt's chunks),
    * ``tpot = (cycle - ttft) / (osl - 1)`` (``dec / acceptance`` when ``osl == 1``).
    """
    NC, Osl, A, M = wc["NC"], wc["O"], wc["A"], wc["M"]
    oeff = 1.0 + (Osl - 1.0) / A
    cycle = NC * mix + decode_steps(wc) * dec
    ttft = (np.maximum(NC - oeff, 0.0) + M) * mix
    tpot = np.where(Osl > 1, (cycle - ttft) / np.maximum(Osl - 1.0, 1.0), dec / A)
    return ttft, tpot, cycle


def _add(f1: tuple, f2: tuple) -> tuple:
    return f1[0] + f2[0], f1[1] + f2[1]


class _Pricing:
    """What every block kind's pricing reads: the device's roofs, the recipe's bytes and
    compute dtypes, the sharded table, the parallel layout and the workload columns
    (``[1, W]`` arrays) of :func:`price_blocks`; and the roofline time of each kind of op."""

    def __init__(self, hw: HardwareProfile, recipe: PrecisionRecipe, st: BlockTable, *,
                 tpx: int, ep: int, dp: int, attention_dp: bool, ssd_chunk: int,
                 Bp: np.ndarray, S: np.ndarray, C: np.ndarray, Tc: np.ndarray,
                 reread: np.ndarray, engine: str | None = None):
        self.hw, self.st = hw, st
        self.tpx, self.ep, self.dp, self.attention_dp, self.ssd_chunk = (
            tpx, ep, dp, attention_dp, ssd_chunk)
        self.Bp, self.S, self.C, self.Tc, self.reread = Bp, S, C, Tc, reread
        self.roof = Roof(hw)
        self.eff = hw.efficiency
        self.a = recipe.activations.bytes
        self.kvb, self.ssb, self.csb = (recipe.kv_cache.bytes, recipe.ssm_state.bytes,
                                        recipe.conv_state.bytes)
        self.wb = {r: recipe.weight_bytes_per_param(r) for r in TensorRole}
        self.cd = {r: compute_dtype(hw, recipe.weight_dtype(r).value, engine)
                   for r in TensorRole}
        self.act_dtype = compute_dtype(hw, recipe.activations.value, engine)
        self.link = hw.interconnect
        self.link_eff = self.eff.link.peak_fraction
        self.imbalance = (max(1.0, hw.moe_imbalance.value) if hw.moe_imbalance is not None
                          else 1.0)

    def gemm_t(self, fb: tuple, dtype: str, k: float | np.ndarray) -> np.ndarray:
        f, b = fb
        roof = self.roof
        return roof.time(f, b, roof.matmul(dtype, f), roof.memory(b), k)

    def elem_t(self, fb: tuple, k: float | np.ndarray) -> np.ndarray:
        f, b = fb
        roof = self.roof
        return roof.time(f, b, roof.matmul(self.act_dtype, f), roof.memory(b), k)

    def attn_t(self, fb: tuple, k: float | np.ndarray, kv_read: bool = False) -> np.ndarray:
        f, b = fb
        roof, eff = self.roof, self.eff
        mem = roof.memory(b, eff.kv_read() if kv_read else None)
        return roof.time(f, b, roof.compute(self.act_dtype, eff.attention, f), mem, k)

    def state_t(self, fb: tuple, k: float | np.ndarray) -> np.ndarray:
        f, b = fb
        roof = self.roof
        return roof.time(f, b, roof.matmul(self.act_dtype, f),
                         roof.memory(b, self.eff.state_io()), k)

    def grouped_t(self, fb: tuple, dtype: str, k: float | np.ndarray, decode: bool,
                  tpe: np.ndarray, kinv: float | np.ndarray = 1.0) -> np.ndarray:
        # many tokens per expert (prefill): compute at the grouped-GEMM fraction of peak and
        # plain streaming; few tokens per expert (decode): weight streaming at the grouped
        # decode fraction of bandwidth. ``kinv``: 1 / the reduction-length factor
        # (``grouped_matmul_k``), FLOP-weighted over the up and down GEMMs.
        f, b = fb
        roof, eff = self.roof, self.eff
        mem = roof.memory(b, eff.grouped_matmul_decode if decode else None)
        scale = self.grouped_dtype_scale(dtype)
        if eff.grouped_matmul_tokens is not None:
            inv_c = 1.0 / (self.hw.peak(dtype) * eff.grouped_matmul_tokens.at(tpe) * scale)
        else:
            inv_c = roof.compute(dtype, eff.grouped_matmul_prefill, f) / scale
        return roof.time(f, b, inv_c * kinv, mem, k)

    def grouped_dtype_scale(self, dtype: str) -> float:
        """The grouped GEMM's fraction in ``dtype`` relative to its curve's (FP8: DeepGEMM's
        tables): ``matmul[dtype] / matmul[fp8]``. Padding and tile scheduling cost a grouped
        GEMM the same share in any dtype; its ceiling is that dtype's dense GEMM (a BF16
        grouped GEMM on B200 is not held to the FP8 kernels' fraction of the BF16 peak)."""
        m = self.eff.matmul
        ref = "fp8" if "fp8" in m else "bf16"
        if dtype not in m or ref not in m:
            return 1.0
        return m[dtype].peak_fraction / m[ref].peak_fraction

    def grouped_kinv(self, e_in: np.ndarray, width: np.ndarray, mats: np.ndarray
                     ) -> float | np.ndarray:
        """``1 / g`` of the routed experts' GEMMs under the profile's reduction-length curve
        ``g = grouped_matmul_k`` (1 without one): the up GEMM(s) reduce over ``e_in``, the
        down GEMM over the (per-GPU) expert width; weighted by their FLOPs,
        ``((mats - 1) / g(e_in) + 1 / g(width)) / mats``."""
        g = self.eff.grouped_matmul_k
        if g is None:
            return 1.0
        return ((mats - 1.0) / g.at(e_in) + 1.0 / g.at(width)) / mats


class _Rows:
    """The rows of one block kind: their columns, and the two kinds of engine step they are
    priced for, ``(prompt seqs, decoding seqs, tokens, op times)``: a mixed step (a prompt
    chunk plus decodes; times in ``out_m``) and a decode step (times in ``out_d``)."""

    def __init__(self, c: _Pricing, idx: np.ndarray, q1: np.ndarray, Dm: np.ndarray,
                 B: np.ndarray):
        self.c, self.idx, self.q1 = c, idx, q1
        self.h = self.col("hidden")
        self.out_m: list = []
        self.out_d: list = []
        self.steps = ((c.Bp, Dm, c.Tc + Dm * q1, self.out_m),
                      (0.0 * c.Bp, B, B * q1, self.out_d))

    def col(self, name: str) -> np.ndarray:
        return getattr(self.c.st, name)[self.idx].astype(np.float64)[:, None]


def _price_attention(c: _Pricing, r: _Rows) -> None:
    h, q1, a, kvb = r.h, r.q1, c.a, c.kvb
    nq, nkv, d, wdw = r.col("n_heads"), r.col("n_kv_heads"), r.col("head_dim"), r.col("window")
    w, dt = c.wb[TensorRole.ATTENTION], c.cd[TensorRole.ATTENTION]
    gate = r.col("attn_gate")  # Qwen3-Next: q_proj also emits a gate of nq*d channels
    for _, dseq, T, out in r.steps:
        proj = _add(ops.gemm(T, h, (nq * (1 + gate) + 2 * nkv) * d, w, a),
                    ops.gemm(T, nq * d, h, w, a))
        out.append(c.gemm_t(proj, dt, K_PROJ2))
        out.append(c.elem_t(_scale(ops.output_gate(T, nq * d, a), gate), K_GATE * gate))
        fa, ba = ops.attention_decode(dseq, c.C, wdw, nq, nkv, d, a, kvb)
        # a verification step: 1 + d query tokens per sequence over one read of the KV
        out.append(c.attn_t((fa * q1, ba + dseq * (q1 - 1.0) * 2.0 * nq * d * a),
                            K_ATTN * (dseq > 0), kv_read=True))
    r.out_m.append(c.attn_t(ops.attention_prefill(c.Bp, c.S, wdw, nq, nkv, d, a, kvb), K_ATTN))
    rr = ops.attended(c.reread, wdw) * 2.0 * nkv * d * kvb
    r.out_m.append(c.attn_t((0.0 * rr, rr), 0.0, kv_read=True))


SPEC_STATE_COPY = 2.0
"""State transfers per sequence and recurrent layer, beyond the verify pass's own, that
commit the accepted state after a speculative verification step: the state of the last
accepted draft position is read from the per-position (intermediate) cache and written to
the request's slot. TensorRT-LLM's Mamba-2 speculative decoding ("at each state update, for
each token we write to an intermediate cache the state that would be correct if that token
was the last accepted token. Then, at step end ... we copy that 'winning' state to the
per-request, main mamba cache", https://github.com/NVIDIA/TensorRT-LLM/pull/13453) and
SGLang's ``intermediate_ssm_state_cache`` both do this. vLLM's native path reads the
accepted snapshot in place on the next step (``T`` writes, one read:
https://github.com/vllm-project/vllm/pull/49847), i.e. 2 transfers fewer per step."""


def _verify_state_bytes(bs: np.ndarray | float, st_io: np.ndarray | float, q1: np.ndarray
                        ) -> np.ndarray:
    """Bytes of a recurrent state update over ``q1 = 1 + d`` tokens per sequence (``bs``:
    one plain decode step's bytes, two of them ``st_io`` state transfers): the token inputs
    and outputs ``q1`` times; the state read once; written ``q1`` times, one snapshot per
    draft position kept for rollback (https://github.com/vllm-project/vllm/pull/49847:
    "writes T full states and reads one back"); plus, in a verification step
    (``q1 > 1``), :data:`SPEC_STATE_COPY` transfers that commit the accepted state.
    ``q1 = 1`` is a plain decode step: ``bs``."""
    return ((bs - 2.0 * st_io) * q1 + st_io * (1.0 + q1)
            + SPEC_STATE_COPY * st_io * (q1 > 1.0))


def _price_mamba(c: _Pricing, r: _Rows) -> None:
    h, q1, a = r.h, r.q1, c.a
    H, Pd, N, G, K = (r.col(n) for n in ("m_heads", "m_head_dim", "state", "groups",
                                         "conv_kernel"))
    inner = H * Pd
    in_w = 2 * inner + 2 * G * N + H
    conv_ch = inner + 2 * G * N
    w, dt, wo = c.wb[TensorRole.MAMBA], c.cd[TensorRole.MAMBA], c.wb[TensorRole.OTHER]
    for _, dseq, T, out in r.steps:
        proj = _add(ops.gemm(T, h, in_w, w, a), ops.gemm(T, inner, h, w, a))
        out.append(c.gemm_t(proj, dt, K_PROJ2))
        out.append(c.elem_t(ops.gated_norm(T, inner, a, wo), 1))
        on = (dseq > 0) * 1.0
        out.append(c.state_t(_scale(ops.conv_decode(dseq * q1, conv_ch, K, a, wo, c.csb),
                                    on), on))
        fs, bs = ops.ssd_decode(dseq, H, Pd, N, G, a, c.ssb)
        st_io = dseq * H * Pd * N * c.ssb
        out.append(c.state_t((fs * q1, _verify_state_bytes(bs, st_io, q1)),
                             K_SSD_DECODE * on))
    r.out_m.append(c.elem_t(ops.conv_prefill(c.Bp, c.S, conv_ch, K, a, wo, c.csb), 1))
    r.out_m.append(c.gemm_t(ops.ssd_prefill(c.Bp, c.S, H, Pd, N, G, c.ssd_chunk, a, c.ssb),
                            c.act_dtype, K_SSD_PREFILL))


def _price_moe(c: _Pricing, r: _Rows) -> None:
    h, a, ep, dp = r.h, c.a, c.ep, c.dp
    E, k, F, Sw, L, gated = (r.col(n) for n in ("experts", "top_k", "expert_width",
                                                "shared_width", "latent", "gated"))
    mats = 2 + gated
    e_in = np.where(L > 0, L, h)
    wo, do = c.wb[TensorRole.OTHER], c.cd[TensorRole.OTHER]
    has_lat = (L > 0).astype(np.float64)
    has_sh = (Sw > 0).astype(np.float64)
    link = c.link
    kinv = c.grouped_kinv(e_in, F, mats)  # expert width enters through the down GEMM's K
    for _, _, T, out in r.steps:
        router = ops.gemm(T, h, E, wo, a)
        lat = _scale(_add(ops.gemm(T, h, L, wo, a), ops.gemm(T, L, h, wo, a)), has_lat)
        out.append(c.gemm_t(_add(router, lat), do, K_ROUTER + 2 * has_lat))
        Tx = T * dp  # tokens of all ranks whose routed copies reach the experts
        fr, br = ops.moe_experts(Tx, E, k, F, e_in, mats, c.wb[TensorRole.ROUTED_EXPERTS], a)
        # routed tokens per expert that receives any: the grouped GEMM pads each such
        # expert's rows (few tokens touch few experts, each with ~1 row at batch 1)
        tpe = Tx * k / np.maximum(ops.expected_experts(E, k, Tx), 1.0)
        imb = c.imbalance if ep > 1 else 1.0  # the busiest EP rank sets the step
        out.append(c.grouped_t((fr * imb / ep, br * imb / ep),
                               c.cd[TensorRole.ROUTED_EXPERTS], K_EXPERTS * (E > 0),
                               decode=out is r.out_d, tpe=tpe, kinv=kinv))
        # permute into expert order and un-permute (weighted scatter) per routed token
        out.append(c.elem_t(_scale(ops.moe_permute(Tx, k, e_in, a, ep), (E > 0) * 1.0),
                            K_PERMUTE * (E > 0)))
        if c.attention_dp and ep > 1:  # dispatch + combine all-to-all
            a2a = ops.alltoall_time(T * k * e_in * a * (ep - 1) / ep, ep,
                                    link.bandwidth.value, c.link_eff, link.latency.value)
            out.append(2.0 * a2a * (E > 0))
        ws = c.wb[TensorRole.SHARED_EXPERTS]
        sh = _scale(_add(_add(ops.gemm(T, h, (mats - 1) * Sw, ws, a),
                              ops.gemm(T, Sw, h, ws, a)),
                         ops.activation(T, Sw, gated, a)), has_sh)
        out.append(c.gemm_t(sh, c.cd[TensorRole.SHARED_EXPERTS], K_SHARED * has_sh))


def _price_ffn(c: _Pricing, r: _Rows) -> None:
    h, a = r.h, c.a
    F, gated = r.col("ffn_width"), r.col("gated")
    mats = 2 + gated
    w, dt = c.wb[TensorRole.FFN], c.cd[TensorRole.FFN]
    for _, _, T, out in r.steps:
        proj = _add(ops.gemm(T, h, (mats - 1) * F, w, a), ops.gemm(T, F, h, w, a))
        out.append(c.gemm_t(proj, dt, K_PROJ2))
        out.append(c.elem_t(ops.activation(T, F, gated, a), 1))


def _price_linear(c: _Pricing, r: _Rows) -> None:
    cols = linear_cols(c.st, c.tpx)[r.idx].astype(np.float64)[:, None]
    for _, _, T, out in r.steps:
        out.append(c.gemm_t(ops.gemm(T, r.h, cols, c.wb[TensorRole.OTHER], c.a),
                            c.cd[TensorRole.OTHER], 1))


def _price_parallel(c: _Pricing, r: _Rows) -> None:
    """Falcon-H1's parallel mixer: the attention branch's ops (:func:`_price_attention`)
    plus the Mamba branch's (:func:`_price_mamba`) on the same normed input, each priced
    only on the rows that keep that branch (a dropped branch costs nothing: no kernel, no
    bytes). One pre-norm, one residual add and one TP all-reduce of the summed outputs,
    as for any block. The muP multipliers are scalar factors a serving engine folds into
    the adjacent weights: no op of their own."""
    Dm, B = r.steps[0][1], r.steps[1][1]
    for col, price in (("n_heads", _price_attention), ("m_heads", _price_mamba)):
        keep = np.flatnonzero(getattr(c.st, col)[r.idx] > 0)
        if keep.size == 0:
            continue
        sub = _Rows(c, r.idx[keep], r.q1[keep], Dm, B)
        price(c, sub)
        for part, out in ((sub.out_m, r.out_m), (sub.out_d, r.out_d)):
            full = np.zeros((len(r.idx), r.q1.shape[1]))
            full[keep] = sum(part)
            out.append(full)


# each block kind's ops (beyond the norm every kind has and the TP all-reduce)
_PRICE_KIND = {Kind.ATTENTION: _price_attention, Kind.MAMBA: _price_mamba,
               Kind.MOE: _price_moe, Kind.FFN: _price_ffn, Kind.LINEAR: _price_linear,
               Kind.PARALLEL: _price_parallel}


def price_blocks(table: BlockTable, hw: HardwareProfile, recipe: PrecisionRecipe,
                 workloads: Sequence[Workload | str], tp: int = 1, ep: int = 1,
                 ssd_chunk: int = DEFAULT_SSD_CHUNK, attention_dp: bool = False,
                 draft: np.ndarray | Sequence[bool] | None = None,
                 engine: str | None = None) -> BlockCosts:
    """Price every row of ``table`` for every workload on ``hw`` under ``recipe``.

    Args:
        table: N block rows (``costmodels.shapes.BlockTable``).
        hw: the device.
        recipe: weight dtype per tensor role, KV / SSM-state / conv-state / activation dtypes.
            A GEMM computes in ``hwprofiles.engines.compute_dtype(hw, weight dtype, engine)``:
            the serving engine's documented math where ``hwprofiles/data/compute_dtypes.json``
            has a rule (MXFP4 weights run with BF16 math on Hopper under TensorRT-LLM), else
            the device's fallback (e.g. NVFP4 weights compute in FP8 on Hopper: fewer bytes,
            same math speed as FP8).
        workloads: W workloads (``Workload`` or strings like ``"isl=8192,osl=1024,batch=64"``).
        tp, ep: GPUs per model instance; expert parallel degree (1 or ``tp``).
        ssd_chunk: Mamba-2 chunk length for the prefill scan.
        attention_dp: attention data parallelism (TensorRT-LLM's ``enable_attention_dp``):
            every block but the routed experts runs unsharded on each of the ``tp`` GPUs over
            its own ``1/tp`` of the sequences (no all-reduce; each GPU holds the KV cache and
            state of its own sequences only); routed experts are expert-parallel over
            ``ep`` GPUs, reached by an all-to-all dispatch and combine of every routed token
            (``T_gpu * top_k * e_in * act_bytes * (ep-1)/ep`` bytes each way per GPU).
        draft: per row, True for the MTP (draft) head's blocks: in decode they run
            ``draft_tokens`` passes over B tokens per verification step (the other rows one
            pass over ``B * (1 + draft_tokens)`` tokens); all decode times are per output
            token (divided by ``acceptance``). Default: no draft rows.
        engine: the serving engine's profile name, for its compute dtypes (above).

    Returns:
        :class:`BlockCosts` with ``[N, W]`` seconds / bytes and ``[N]`` per-row bytes.
    """
    check_parallel(tp, ep)
    wls = tuple(parse_workload(w) for w in workloads)
    if not wls:
        raise ValueError("price_blocks needs at least one workload")
    n, nw = len(table), len(wls)
    wc = _workload_columns(wls)
    dp = tp if attention_dp else 1  # data-parallel ranks of the non-expert parts
    tpx = 1 if attention_dp else tp  # tensor-parallel degree of the non-expert parts
    Bg, NC, S, C = wc["B"], wc["NC"], wc["S"], wc["C"]
    D1, A = wc["D"] + 1.0, wc["A"]
    Oeff = 1.0 + (wc["O"] - 1.0) / A  # engine steps in one request's life (prefill step + verifies)
    B = Bg / dp  # sequences per GPU
    Bp = B / NC  # prompts per GPU whose last chunk runs in one mixed step
    Tc = Bp * S  # prompt tokens per GPU in one mixed step
    # decoding sequences in a mixed step (none when prefill steps run alone)
    Dm = wc["MX"] * B * np.minimum(NC - 1.0, Oeff - 1.0) / NC
    is_draft = (np.zeros(n, dtype=bool) if draft is None
                else np.asarray(draft, dtype=bool).reshape(n))
    D1n = np.where(is_draft[:, None], 1.0, D1)  # [n, W] query tokens per decoding sequence
    passes = np.where(is_draft[:, None], wc["D"], 1.0)  # [n, W] passes per step
    # prompts longer than a chunk span m chunks; chunk j re-reads the KV of the j*c tokens
    # before it: S*(m-1)/2 tokens per prompt, Bp*S*(m-1)/2 per mixed step
    reread = Tc * (np.maximum(S / np.maximum(Tc * dp, 1e-9), 1.0) - 1.0) / 2.0

    st = shard_table(table, tpx, 1 if attention_dp else ep)
    c = _Pricing(hw, recipe, st, tpx=tpx, ep=ep, dp=dp, attention_dp=attention_dp,
                 ssd_chunk=ssd_chunk, Bp=Bp, S=S, C=C, Tc=Tc, reread=reread, engine=engine)
    a = c.a
    mix = np.zeros((n, nw))
    dec = np.zeros((n, nw))
    kind = table.kind

    pricers = {**_PRICE_KIND, **{Kind(code): k.price for code, k in registered_kinds().items()}}
    for kd, price_kind in pricers.items():  # one pass per kind over all its rows
        idx = np.flatnonzero(kind == int(kd))
        if idx.size == 0:
            continue
        r = _Rows(c, idx, D1n[idx], Dm, B)
        for _, _, T, out in r.steps:
            out.append(c.elem_t(ops.norm_residual(T, r.h, a, c.wb[TensorRole.OTHER]), K_NORM))
        price_kind(c, r)
        if tpx > 1:
            for _, _, T, out in r.steps:
                out.append(ops.allreduce_time(allreduce_bytes(T, r.h, a), tpx,
                                              c.link.bandwidth.value, c.link_eff,
                                              c.link.latency.value))
        mix[idx] = sum(r.out_m) * passes[idx]
        dec[idx] = sum(r.out_d) * passes[idx]

    prefill, decode, runtime = serving_shares(mix, dec, wc)

    # memory, per GPU
    wb, kvb = c.wb, c.kvb
    rp = role_params(st)
    is_lin = (table.kind == int(Kind.LINEAR)).astype(np.float64)
    other = rp[TensorRole.OTHER] - is_lin * table.hidden * (table.hidden - linear_cols(st, tpx))
    weight = (rp[TensorRole.ROUTED_EXPERTS] / ep * wb[TensorRole.ROUTED_EXPERTS]
              + other * wb[TensorRole.OTHER])
    for role in (TensorRole.ATTENTION, TensorRole.MAMBA, TensorRole.SHARED_EXPERTS,
                 TensorRole.FFN):
        weight = weight + rp[role] * wb[role]
    kv_tok = kv_elems_per_token(st) * kvb / dp  # per GPU, averaged over the dp ranks
    window = table.window.astype(np.float64)
    state = state_bytes_per_sequence(st, recipe) / dp
    mem = weight[:, None] + wc["B"] * (kv_tok[:, None] * ops.attended(wc["ctx"], window[:, None])
                                 + state[:, None])

    _, in_w, _ = mamba_dims(st)
    mats = 2 + st.gated
    widest = np.select(
        [kind == int(Kind.ATTENTION), kind == int(Kind.MAMBA), kind == int(Kind.MOE),
         kind == int(Kind.FFN), kind == int(Kind.LINEAR), kind == int(Kind.PARALLEL)],
        [(st.n_heads * (1 + st.attn_gate) + 2 * st.n_kv_heads) * st.head_dim, in_w,
         st.experts + np.maximum(-(-st.top_k // ep) * (mats - 1) * st.expert_width,
                                 (mats - 1) * st.shared_width),
         (mats - 1) * st.ffn_width, st.hidden,
         (st.n_heads + 2 * st.n_kv_heads) * st.head_dim + in_w],
        0,
    ).astype(np.float64)
    for code, k in registered_kinds().items():
        if k.widest is not None:
            widest = np.where(kind == code, k.widest(st).astype(np.float64), widest)
    workspace = np.where(kind == int(Kind.NOOP), 0.0, (2.0 * table.hidden + widest) * a)

    return BlockCosts(
        workloads=wls, tp=int(tp), ep=int(ep), prefill_s=prefill, decode_s=decode,
        runtime_s=runtime, memory_bytes=mem, weight_bytes=weight.astype(np.float64),
        kv_bytes_per_token=kv_tok.astype(np.float64), window=window,
        state_bytes_per_sequence=state.astype(np.float64), workspace_bytes_per_token=workspace,
        no_overlap=no_overlap_rows(table, engine, wls),
    )


def no_overlap_rows(table: BlockTable, engine: str | None,
                    workloads: Sequence[Workload | str],
                    engines: dict[str, EngineProfile] | None = None) -> np.ndarray | None:
    """``[N, W]`` bool: the rows of ``table`` whose block kind makes the serving engine
    ``engine`` run workload w without its overlap scheduler (a rule of its profile's
    ``no_overlap``: e.g. SGLang's Mamba radix cache turns it off for Nemotron-H; a rule
    with ``except_draft`` holds only for workloads without draft tokens); ``None`` when the
    engine has no such rule (or none is named). ``engines``: profiles by name that take
    precedence over the shipped ones."""
    prof = find_engine(engine, engines) if engine else None
    if prof is None or not prof.no_overlap:
        return None
    wls = tuple(parse_workload(w) for w in workloads)
    drafting = np.array([w.draft_tokens > 0 for w in wls])
    out = np.zeros((len(table), len(wls)), dtype=bool)
    for i, rule in enumerate(prof.no_overlap):
        codes = []
        for k in rule.kinds:
            if k.upper() not in Kind.__members__:
                raise InputError(f"engine profile {prof.name!r}: unknown block kind {k!r}; "
                                 f"expected one of {', '.join(KIND_NAMES.values())}",
                                 field=f"no_overlap.{i}.kinds")
            codes.append(int(Kind[k.upper()]))
        hit = np.isin(table.kind, codes)[:, None]
        out |= hit & ~(drafting[None, :] & rule.except_draft)
    return out
