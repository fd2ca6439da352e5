"""Pricing speed: 10,000 block configs x 16 workloads in one call (target: <= 50 ms median).

Run: ``pytest benchmarks/bench_costmodels.py --benchmark-only``. The timer is the process's
CPU time (``time.process_time``): numpy's elementwise work is single-threaded, so this is the
cost on one core, and other load on a shared machine does not inflate it (wall-clock times
match it on an idle machine).
"""

from __future__ import annotations

import time

import numpy as np
import pytest

import hwprofiles
from costmodels.blocks import price_blocks
from costmodels.dtypes import get_recipe
from costmodels.shapes import BlockTable, Kind

N_BLOCKS = 10_000


def _table(n: int, seed: int = 0) -> BlockTable:
    """A mixed menu of alternatives around Nemotron-3-Super shapes, all six kinds."""
    rng = np.random.default_rng(seed)
    kind = rng.integers(0, 6, n)
    cols = {c: np.zeros(n, dtype=np.int64) for c in BlockTable.columns()}
    cols.update(
        kind=kind, hidden=np.full(n, 4096),
        n_heads=np.full(n, 32), n_kv_heads=rng.choice([1, 2, 4, 8], n), head_dim=np.full(n, 128),
        window=rng.choice([0, 0, 4096], n),
        m_heads=np.full(n, 128), m_head_dim=np.full(n, 64), state=rng.choice([64, 96, 128], n),
        groups=np.full(n, 8), conv_kernel=np.full(n, 4), conv_bias=np.ones(n, dtype=np.int64),
        experts=rng.choice([256, 384, 512], n), top_k=rng.integers(4, 23, n),
        expert_width=rng.choice([1280, 1792, 2688], n), shared_width=np.full(n, 5376),
        latent=np.full(n, 1024), gated=(kind == int(Kind.FFN)).astype(np.int64),
        ffn_width=rng.choice([3584, 7168, 14336], n),
    )
    return BlockTable(**{k: np.asarray(v, dtype=np.int64) for k, v in cols.items()})


WORKLOADS = (
    [f"isl={i},osl={o},batch={b}" for i in (128, 2048, 8192, 32768) for o, b in ((128, 1), (1024, 64))]
    + [f"isl={i},osl={o},concurrency={b}" for i in (128, 2048, 8192, 131072)
       for o, b in ((128, 8), (1024, 256))]
)


@pytest.mark.benchmark(timer=time.process_time, min_rounds=20)
@pytest.mark.parametrize("device,recipe", [("h100-sxm", "nvfp4"), ("b200", "fp8")])
def test_price_10k_blocks_16_workloads(benchmark, device, recipe):
    table = _table(N_BLOCKS)
    hw, rec = hwprofiles.get(device), get_recipe(recipe)
    assert len(WORKLOADS) == 16
    out = benchmark(price_blocks, table, hw, rec, WORKLOADS, 8, 8)
    assert out.runtime_s.shape == (N_BLOCKS, 16)
    assert np.all(np.isfinite(out.runtime_s))
