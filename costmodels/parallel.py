"""Tensor and expert parallelism: per-GPU shapes and collective costs.

A model instance runs on ``tp`` GPUs (Megatron-style tensor parallelism):

* attention: query heads ``ceil(nq/tp)`` per GPU, KV heads ``ceil(nkv/tp)`` (replicated
  when ``nkv < tp``, as serving engines do);
* Mamba-2: heads ``ceil(H/tp)``, B/C groups ``ceil(G/tp)`` (replicated when ``G < tp``);
* Gated DeltaNet: key heads ``ceil(nk/tp)``, value heads ``ceil(nv/tp)`` (vLLM shards
  both; every GPU keeps whole key/value head groups);
* a kind registered in :mod:`costmodels.kinds`: the columns it names (``tp_columns``)
  ``ceil(c/tp)`` (Mamba-1: its inner channels);
* FFN and the MoE shared expert: width ``ceil(F/tp)``; a linear block: ``ceil(h/tp)``
  output columns;
* routed experts: with ``ep == 1`` each expert's width is sharded ``ceil(F/tp)``; with
  ``ep == tp`` each GPU holds ``E/ep`` whole experts (expected distinct experts touched and
  routed FLOPs divide by ``ep``). Router, latent projections and norms are replicated.
  Under tensor parallelism every GPU already holds every token's activations, so expert
  parallelism needs no dispatch: each GPU runs its own experts on the tokens routed to them
  and the block's all-reduce is the combine. An all-to-all dispatch and combine is priced
  only under attention data parallelism (``costmodels.blocks.price_blocks``), where each
  GPU holds its own tokens.

Every non-NoOp block ends with one all-reduce of its output (``tokens * hidden``
activations) over the ``tp`` GPUs, priced as a ring over the profile's scale-up link.
"""

from __future__ import annotations

import numpy as np

from costmodels.shapes import BlockTable, Kind
from hwprofiles.errors import InputError


def check_parallel(tp: int, ep: int) -> None:
    """Validate the parallel layout: ``tp >= 1`` and ``ep`` in ``{1, tp}``."""
    if int(tp) != tp or tp < 1:
        raise InputError(f"tp must be a positive integer, got {tp!r}", field="tp")
    if int(ep) != ep or ep < 1 or (ep != 1 and ep != tp):
        raise InputError(f"ep must be 1 or equal to tp ({tp}), got {ep!r}", field="ep")


def _ceil_div(x: np.ndarray, n: int) -> np.ndarray:
    return -(-x // n)


def shard_table(t: BlockTable, tp: int, ep: int = 1) -> BlockTable:
    """Per-GPU shapes of every row under ``tp``/``ep`` (see module docstring).

    Routed experts under ``ep > 1`` keep their full count and width here (the router still
    sees all ``E``); callers divide routed weights, touched experts and FLOPs by ``ep``.
    A linear block's ``h/tp`` output columns have no column here; see ``linear_cols``.
    """
    check_parallel(tp, ep)
    if tp == 1:
        return t
    cols = {n: getattr(t, n) for n in BlockTable.columns()}
    from costmodels.kinds import registered  # its modules import this one

    split = {"n_heads", "n_kv_heads", "m_heads", "groups", "ffn_width", "shared_width",
             *(c for k in registered().values() for c in k.tp_columns)}
    for name in sorted(split):
        cols[name] = _ceil_div(cols[name], tp)
    if ep == 1:
        cols["expert_width"] = _ceil_div(cols["expert_width"], tp)
    return BlockTable(**cols)


def linear_cols(t: BlockTable, tp: int) -> np.ndarray:
    """Output columns per GPU of each row's linear replacement matrix (0 for other kinds)."""
    return np.where(t.kind == int(Kind.LINEAR), _ceil_div(t.hidden, tp), 0)


def allreduce_bytes(tokens: np.ndarray | float, hidden: np.ndarray | float, act_bytes: float
                    ) -> np.ndarray:
    """Bytes all-reduced after a block: ``tokens * hidden * act_bytes``."""
    return np.asarray(tokens, dtype=np.float64) * hidden * act_bytes
