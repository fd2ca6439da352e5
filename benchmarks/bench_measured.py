"""Pricing from measured blocks vs the analytic model, side by side in one process.

The table is the shipped CPU example's search space (``examples/measured-cpu``: Llama-3.1-8B
at 1/8 width, 480 alternatives, 2 workloads) priced from its ``BLOCKS.json``. Baseline:
``price_blocks`` on the same table (``price_measured`` calls it for the memory columns, then
looks up each distinct shape once per workload). Run: ``pytest benchmarks/bench_measured.py
--benchmark-only``; the timer is process CPU time (a shared machine's load does not inflate
it).
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

import hwprofiles
from costmodels.blocks import price_blocks
from costmodels.measured import load_blocks, price_measured
from nas.arch import blocks_table
from nas.search import alternatives, resolve
from nas.spec import load_spec

EXAMPLE = Path(__file__).resolve().parents[1] / "nas" / "examples" / "measured-cpu"


@pytest.fixture(scope="module")
def case():
    spec, base, _ = load_spec(EXAMPLE / "llama3.1-8b-w512-cpu-measured.json")
    problem = resolve(spec, base)
    flat = [a.child for blk in alternatives(problem) for a in blk]
    table = blocks_table(flat, problem.parent.hidden_size)
    meas = load_blocks(EXAMPLE / "BLOCKS.json")
    wls = list(problem.workloads.values())
    hw = hwprofiles.get(str(EXAMPLE / "cpu-calibrated.json"))
    return table, hw, problem.recipe, meas, wls


@pytest.mark.benchmark(timer=time.process_time, group="measured-pricing")
def test_price_blocks_baseline(benchmark, case):
    table, hw, recipe, _, wls = case
    benchmark.pedantic(price_blocks, args=(table, hw, recipe, wls), rounds=20, iterations=1,
                       warmup_rounds=2)


@pytest.mark.benchmark(timer=time.process_time, group="measured-pricing")
def test_price_measured(benchmark, case):
    table, hw, recipe, meas, wls = case
    benchmark.pedantic(price_measured, args=(table, hw, recipe, meas, wls), rounds=20,
                       iterations=1, warmup_rounds=2)
