"""Device memory per GPU: weights + concurrency x (KV at context + state) + workspace + reserve.

Plain functions over numbers or numpy arrays, in bytes. The per-block pieces come from
``costmodels.blocks.BlockCosts``; ``costmodels.model`` assembles a model's figures.
"""

from __future__ import annotations

import numpy as np

DEFAULT_RESERVE_BYTES = 2 * 2**30
"""Runtime reserve per GPU (CUDA/ROCm context, allocator slack, communication buffers):
2 GiB, an assumption; configurable everywhere it is used."""

DEFAULT_PREFILL_CHUNK = 8192
"""Tokens per prefill chunk assumed when sizing the activation workspace (chunked prefill)."""

LOGIT_BYTES = 4.0  # fp32 logits


def memory_bytes(weight_bytes: float | np.ndarray, kv_bytes_per_sequence: float | np.ndarray,
                 state_bytes_per_sequence: float | np.ndarray,
                 concurrency: float | np.ndarray, workspace_bytes: float | np.ndarray = 0.0,
                 reserve_bytes: float = DEFAULT_RESERVE_BYTES) -> np.ndarray:
    """Bytes per GPU: ``weights + concurrency * (kv + state) + workspace + reserve``."""
    return (np.asarray(weight_bytes, dtype=np.float64)
            + np.asarray(concurrency, dtype=np.float64)
            * (np.asarray(kv_bytes_per_sequence, dtype=np.float64) + state_bytes_per_sequence)
            + workspace_bytes + reserve_bytes)


def workspace_bytes(widest_bytes_per_token: float, tokens: float | np.ndarray,
                    logit_rows: float | np.ndarray, vocab_per_gpu: float) -> np.ndarray:
    """Activation workspace of one pass, bytes: ``tokens * widest_bytes_per_token``
    (the widest block's in-flight activations) + ``logit_rows * vocab * 4`` (fp32 logits)."""
    return (np.asarray(tokens, dtype=np.float64) * widest_bytes_per_token
            + np.asarray(logit_rows, dtype=np.float64) * vocab_per_gpu * LOGIT_BYTES)


def fit_concurrency(usable_bytes: float, weight_bytes: float, per_sequence_bytes: float,
                    workspace_bytes: float = 0.0, reserve_bytes: float = DEFAULT_RESERVE_BYTES
                    ) -> int:
    """Largest integer n with ``memory_bytes(weights, per_seq, 0, n, workspace, reserve) <=
    usable``; 0 when even n = 1 does not fit. ``per_sequence_bytes`` must be > 0."""
    free = usable_bytes - weight_bytes - workspace_bytes - reserve_bytes
    if free <= 0:
        return 0
    if per_sequence_bytes <= 0:
        raise ValueError("per_sequence_bytes must be > 0")
    return int(free // per_sequence_bytes)
