"""Model-level figures from per-block sums plus the non-block term.

How the serving figures relate to the additive per-block runtimes (all per workload w,
B = batch or concurrency, ``O = osl``, ``tp`` GPUs per model instance):

* ``ttft_s   = sum_i blocks.prefill_s[i, w] + nonblock.prefill_s[w]``            seconds
* ``tpot_s   = sum_i blocks.decode_s[i, w]  + nonblock.decode_s[w]``             seconds
  (one decode step of batch B at the mean generated context ``isl + O/2``)
* ``latency_s = ttft_s + (O - 1) * tpot_s``: one request, first token to last.
* ``runtime_s = prefill_passes * ttft_s + (O - 1) * tpot_s
              = sum_i blocks.runtime_s[i, w] + nonblock.runtime_s[w]``: seconds the
  instance spends serving B requests (``prefill_passes`` = 1 in batch mode, B in
  concurrency mode where each prompt is prefilled alone; prefill and decode do not overlap).
* ``throughput_tok_s = B * O / (runtime_s * tp)``: output tokens/s **per GPU**;
  ``throughput_node_tok_s = throughput_tok_s * gpus_per_node`` (replicas fill the node).
  So ``throughput_tok_s >= X``  <=>  ``sum_i blocks.runtime_s[i, w] + nonblock.runtime_s[w]
  <= B * O / (X * tp)``: a linear bound on the summed runtimes.
* ``per_user_tok_s = 1 / tpot_s`` (decode speed one user sees, ignoring interleaved
  prefills). So ``per_user_tok_s >= U``  <=>  ``sum_i decode_s[i, w] + nonblock.decode_s[w]
  <= 1 / U``.
* ``memory_bytes = weights + B * (kv_bytes(isl + O) + state) + workspace + reserve`` (per
  GPU); all but the workspace (a max over blocks) and the reserve are sums over blocks.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from costmodels import ops
from costmodels.blocks import BlockCosts, price_blocks
from costmodels.dtypes import PrecisionRecipe, TensorRole
from costmodels.memory import (
    DEFAULT_PREFILL_CHUNK,
    DEFAULT_RESERVE_BYTES,
    fit_concurrency,
    memory_bytes,
)
from costmodels.memory import workspace_bytes as _workspace
from costmodels.parallel import check_parallel
from costmodels.roofline import Roof
from costmodels.shapes import BlockTable
from costmodels.workload import Workload, parse_workload
from hwprofiles.errors import InputError
from hwprofiles.schema import HardwareProfile

K_NONBLOCK = 4  # embedding, final norm, LM head, sampling


@dataclass(frozen=True)
class NonBlockShape:
    """The parts of a model outside its blocks: embeddings, final norm, LM head."""

    hidden: int
    vocab: int
    tied: bool = False
    final_norm: bool = True


@dataclass
class NonBlockCosts:
    """The non-block term, per workload (``[W]`` arrays) and per GPU.

    ``prefill_s`` / ``decode_s`` / ``runtime_s`` have the meaning of the per-block fields in
    :class:`costmodels.blocks.BlockCosts`; they include ``step_overhead_s`` (framework /
    scheduler time per forward pass). ``weight_bytes``: embedding + LM head + final norm.
    ``vocab_per_gpu``: LM-head columns per GPU (sizes the fp32 logits workspace).
    """

    prefill_s: np.ndarray
    decode_s: np.ndarray
    runtime_s: np.ndarray
    weight_bytes: float
    vocab_per_gpu: float
    hidden: int


def price_nonblock(shape: NonBlockShape, hw: HardwareProfile, recipe: PrecisionRecipe,
                   workloads: Sequence[Workload | str], tp: int = 1,
                   step_overhead_s: float = 0.0) -> NonBlockCosts:
    """Price embeddings + final norm + LM head (vocab-sharded over ``tp``) per workload.

    In prefill the LM head runs on the last token of each prompt only; in decode on the B
    tokens of the step. ``step_overhead_s`` is added once per forward pass.
    """
    check_parallel(tp, 1)
    wls = tuple(parse_workload(w) for w in workloads)
    h, v = float(shape.hidden), float(-(-shape.vocab // tp))
    roof = Roof(hw)
    a = recipe.activations.bytes
    we, wl, wo = (recipe.weight_bytes_per_param(r) for r in
                  (TensorRole.EMBEDDINGS, TensorRole.LM_HEAD, TensorRole.OTHER))
    dt = hw.compute_dtype(recipe.weight_dtype(TensorRole.LM_HEAD).value)
    act_dt = hw.compute_dtype(recipe.activations.value)

    def step(tokens: np.ndarray, heads: np.ndarray) -> np.ndarray:
        fe, be = ops.embedding(tokens, h, we, a)
        fn, bn = (ops.norm_residual(heads, h, a, wo) if shape.final_norm else (0.0, 0.0))
        fl, bl = ops.lm_head(heads, h, v, wl, a)
        t = roof.time(fe + fn, be + bn, roof.matmul(act_dt, fe + fn), roof.memory(be + bn), 2)
        t = t + roof.time(fl, bl, roof.matmul(dt, fl), roof.memory(bl), 2)
        return t + step_overhead_s

    B = np.array([w.sequences for w in wls], dtype=np.float64)
    Bp = np.array([w.prefill_sequences for w in wls], dtype=np.float64)
    S = np.array([w.isl for w in wls], dtype=np.float64)
    P = np.array([w.prefill_passes for w in wls], dtype=np.float64)
    osl = np.array([w.osl for w in wls], dtype=np.float64)
    prefill = step(Bp * S, Bp)
    decode = step(B, B)
    emb = shape.hidden * shape.vocab
    params_gpu = -(-emb // tp) * (we + (0.0 if shape.tied else wl))
    weight = params_gpu + (shape.hidden * wo if shape.final_norm else 0.0)
    return NonBlockCosts(prefill_s=prefill, decode_s=decode, runtime_s=P * prefill + (osl - 1) * decode,
                         weight_bytes=float(weight), vocab_per_gpu=v, hidden=shape.hidden)


@dataclass
class ModelCosts:
    """Serving figures per workload (``[W]`` arrays; see the module docstring for formulas).

    Bytes are per GPU; ``fits`` says whether ``memory_bytes <= hw.memory_bytes``.
    """

    workloads: tuple[Workload, ...]
    device: str
    tp: int
    gpus_per_node: int
    ttft_s: np.ndarray
    tpot_s: np.ndarray
    latency_s: np.ndarray
    runtime_s: np.ndarray
    throughput_tok_s: np.ndarray
    throughput_node_tok_s: np.ndarray
    per_user_tok_s: np.ndarray
    weight_bytes: float
    kv_bytes: np.ndarray
    state_bytes: np.ndarray
    workspace_bytes: np.ndarray
    reserve_bytes: float
    memory_bytes: np.ndarray
    usable_bytes: float
    fits: np.ndarray

    def to_dict(self) -> dict:
        """Plain JSON-able dict: top-level scalars and a list of per-workload dicts."""
        per = []
        for i, w in enumerate(self.workloads):
            per.append({
                "name": w.name, "isl": w.isl, "osl": w.osl, "batch": w.batch,
                "concurrency": w.concurrency,
                "ttft_s": float(self.ttft_s[i]), "tpot_s": float(self.tpot_s[i]),
                "latency_s": float(self.latency_s[i]),
                "throughput_tok_s": float(self.throughput_tok_s[i]),
                "throughput_node_tok_s": float(self.throughput_node_tok_s[i]),
                "per_user_tok_s": float(self.per_user_tok_s[i]),
                "memory_bytes": float(self.memory_bytes[i]),
                "kv_bytes": float(self.kv_bytes[i]), "state_bytes": float(self.state_bytes[i]),
                "workspace_bytes": float(self.workspace_bytes[i]),
                "fits": bool(self.fits[i]),
            })
        return {"device": self.device, "tp": self.tp, "gpus_per_node": self.gpus_per_node,
                "weight_bytes": self.weight_bytes, "reserve_bytes": self.reserve_bytes,
                "usable_bytes": self.usable_bytes, "workloads": per}


def _rows(blocks: BlockCosts, rows: Sequence[int] | np.ndarray | None) -> BlockCosts:
    return blocks if rows is None else blocks.take(rows)


def workspace_bytes(blocks: BlockCosts, nonblock: NonBlockCosts, tokens: np.ndarray | float,
                    logit_rows: np.ndarray | float) -> np.ndarray:
    """Activation workspace per GPU for a pass of ``tokens`` in-flight tokens, bytes:
    ``tokens * max_i workspace_bytes_per_token[i]`` + ``logit_rows`` fp32 logit rows."""
    widest = float(blocks.workspace_bytes_per_token.max()) if len(blocks) else 0.0
    return _workspace(widest, tokens, logit_rows, nonblock.vocab_per_gpu)


def summarize(blocks: BlockCosts, nonblock: NonBlockCosts, hw: HardwareProfile,
              rows: Sequence[int] | np.ndarray | None = None,
              reserve_bytes: float = DEFAULT_RESERVE_BYTES,
              prefill_chunk: int = DEFAULT_PREFILL_CHUNK) -> ModelCosts:
    """Model figures for the model made of ``rows`` of ``blocks`` (default: all) + non-block.

    Workspace tokens per workload: ``min(prefill tokens of one pass, prefill_chunk)`` but at
    least B (a decode step).
    """
    b = _rows(blocks, rows)
    wls = b.workloads
    B = np.array([w.sequences for w in wls], dtype=np.float64)
    Bp = np.array([w.prefill_sequences for w in wls], dtype=np.float64)
    S = np.array([w.isl for w in wls], dtype=np.float64)
    osl = np.array([w.osl for w in wls], dtype=np.float64)
    P = np.array([w.prefill_passes for w in wls], dtype=np.float64)
    ttft = b.prefill_s.sum(axis=0) + nonblock.prefill_s
    tpot = b.decode_s.sum(axis=0) + nonblock.decode_s
    runtime = P * ttft + (osl - 1.0) * tpot
    tp = b.tp
    thr = B * osl / (runtime * tp)
    gpn = int(hw.gpus_per_node.value)
    weights = float(b.weight_bytes.sum()) + nonblock.weight_bytes
    ctx = np.array([w.max_context for w in wls], dtype=np.float64)
    kv = B * np.array([float(b.kv_bytes(c).sum()) for c in ctx])
    state = B * float(b.state_bytes_per_sequence.sum())
    ws = workspace_bytes(b, nonblock, np.maximum(np.minimum(Bp * S, prefill_chunk), B),
                         np.maximum(Bp, B))
    mem = memory_bytes(weights, kv / B, state / B, B, ws, reserve_bytes)
    usable = hw.memory_bytes.value
    return ModelCosts(
        workloads=wls, device=hw.name, tp=tp, gpus_per_node=gpn, ttft_s=ttft, tpot_s=tpot,
        latency_s=ttft + (osl - 1.0) * tpot, runtime_s=runtime, throughput_tok_s=thr,
        throughput_node_tok_s=thr * gpn, per_user_tok_s=1.0 / tpot, weight_bytes=weights,
        kv_bytes=kv, state_bytes=state + 0.0 * B, workspace_bytes=ws,
        reserve_bytes=float(reserve_bytes), memory_bytes=mem, usable_bytes=usable,
        fits=mem <= usable,
    )


@dataclass
class Concurrency:
    """The largest number of sequences of ``context`` tokens that fit in one GPU's memory.

    ``max_concurrency = floor((usable - weights - workspace - reserve) / per_sequence)``
    (0 when even the weights do not fit); bytes per GPU.
    """

    context: int
    max_concurrency: int
    usable_bytes: float
    weight_bytes: float
    workspace_bytes: float
    reserve_bytes: float
    kv_bytes_per_sequence: float
    state_bytes_per_sequence: float
    free_bytes: float = field(default=0.0)

    @property
    def per_sequence_bytes(self) -> float:
        return self.kv_bytes_per_sequence + self.state_bytes_per_sequence

    def to_dict(self) -> dict:
        return {"context": self.context, "max_concurrency": self.max_concurrency,
                "usable_bytes": self.usable_bytes, "weight_bytes": self.weight_bytes,
                "workspace_bytes": self.workspace_bytes, "reserve_bytes": self.reserve_bytes,
                "kv_bytes_per_sequence": self.kv_bytes_per_sequence,
                "state_bytes_per_sequence": self.state_bytes_per_sequence,
                "per_sequence_bytes": self.per_sequence_bytes, "free_bytes": self.free_bytes}


def max_concurrency(blocks: BlockCosts, nonblock: NonBlockCosts, hw: HardwareProfile,
                    context: int, rows: Sequence[int] | np.ndarray | None = None,
                    reserve_bytes: float = DEFAULT_RESERVE_BYTES,
                    prefill_chunk: int = DEFAULT_PREFILL_CHUNK) -> Concurrency:
    """Largest concurrency whose KV cache + state at ``context`` tokens fits (see
    :class:`Concurrency`). The workspace is that of one prefill chunk of
    ``min(context, prefill_chunk)`` tokens of one sequence (one logits row)."""
    if int(context) != context or context < 1:
        raise InputError(f"context must be a positive integer, got {context!r}", field="context")
    b = _rows(blocks, rows)
    weights = float(b.weight_bytes.sum()) + nonblock.weight_bytes
    kv = float(b.kv_bytes(context).sum())
    state = float(b.state_bytes_per_sequence.sum())
    ws = float(workspace_bytes(b, nonblock, min(int(context), prefill_chunk), 1.0))
    usable = hw.memory_bytes.value
    free = usable - weights - ws - reserve_bytes
    per = kv + state
    if free > 0 and per <= 0:
        raise InputError("the model keeps no per-sequence memory (no KV cache, no state): "
                         "concurrency is not memory-bound", field="context")
    n = fit_concurrency(usable, weights, per, ws, reserve_bytes)
    return Concurrency(context=int(context), max_concurrency=n, usable_bytes=usable,
                       weight_bytes=weights, workspace_bytes=ws, reserve_bytes=float(reserve_bytes),
                       kv_bytes_per_sequence=kv, state_bytes_per_sequence=state, free_bytes=free)


def price_model(table: BlockTable, nonblock: NonBlockShape, hw: HardwareProfile,
                recipe: PrecisionRecipe, workloads: Sequence[Workload | str], tp: int = 1,
                ep: int = 1, reserve_bytes: float = DEFAULT_RESERVE_BYTES,
                step_overhead_s: float = 0.0) -> ModelCosts:
    """One call: price every block and the non-block term, then :func:`summarize`."""
    wls = tuple(parse_workload(w) for w in workloads)
    blocks = price_blocks(table, hw, recipe, wls, tp=tp, ep=ep)
    nb = price_nonblock(nonblock, hw, recipe, wls, tp=tp, step_overhead_s=step_overhead_s)
    return summarize(blocks, nb, hw, reserve_bytes=reserve_bytes)
