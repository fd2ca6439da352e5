"""The serving model against published measurements it never fitted (issue 30).

The hold-out rows of ``costmodels/data/serving_measurements.csv`` were fixed before any fit (the
split rule is written in the CSV's header) and no shipped figure is fitted to them; the
seeds' rows (Super -> Puzzle-75B on 8xB200) are among them. The bounds below are what the
shipped profiles achieve, asserted as they are (the goal is <= 15 % in every regime): a
change that makes any regime worse fails here.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import hwprofiles
from costmodels.calibrate import load_measurements, score
from hwprofiles.engines import available_engines, get_engine
from nas.cli.calibrate import shape_resolver

REPO = Path(__file__).resolve().parents[1]
CSV = REPO / "costmodels" / "data" / "serving_measurements.csv"
CONFIGS: list[str] = []  # the default: the CSV's configs/ folder, then the examples'
SEED_SOURCE = "Nemotron-Labs-3-Puzzle-75B-A9B model card"

# hold-out MAPE per regime the shipped profiles reach (measured: 12.0 %, 22.5 %, 47.5 %;
# TTFT: row 155, Qwen3-235B at concurrency 64 with ~4k-token prompts, measures 238 ms, less
# than the same run's 284 ms at concurrency 16, where the first wave of 64 prompts (256k
# tokens) alone takes the model ~1 s: 17.6 % without it; TPOT: the six 8xB200 SGLang 0.5.6
# rows at concurrency 1 are 31-32 % slower than the model, whose only such fit row, SGLang
# 0.5.8's Qwen3-235B with the same launch command, is 34 % faster than 0.5.6's)
HOLDOUT_MAPE = {"throughput": 0.125, "TPOT": 0.23, "TTFT": 0.48}


@pytest.fixture(scope="module")
def scored():
    ms = load_measurements(CSV)
    return score(ms, shape_resolver(CSV, CONFIGS), hwprofiles.get)


def test_seed_rows_are_held_out():
    seeds = [m for m in load_measurements(CSV) if m.source.startswith(SEED_SOURCE)]
    assert len(seeds) == 2 and all(m.split == "holdout" for m in seeds)


def test_no_shipped_figure_is_fitted_to_a_held_out_source():
    # a figure fitted while the seed rows were fit rows names their source; none may remain
    for name in ("h100-sxm", "h200-sxm", "b200"):
        for path, src in hwprofiles.get(name).sourced_figures():
            assert not (src.startswith("fitted") and SEED_SOURCE in src), (name, path)
    for e in available_engines():
        prof = get_engine(e)
        for key in ("step_overhead_s", "request_overhead_s", "request_latency_s"):
            assert SEED_SOURCE not in getattr(prof, key).source, (e, key)


@pytest.mark.parametrize("regime", sorted(HOLDOUT_MAPE))
def test_holdout_mape_per_regime(scored, regime):
    errs = np.array([s.error for s in scored if s.m.split == "holdout" and s.m.regime == regime])
    assert errs.size >= 8
    assert float(np.mean(np.abs(errs))) <= HOLDOUT_MAPE[regime]


def test_seeds_ratio_with_the_seed_rows_held_out(scored):
    by = {s.m.model: s.predicted for s in scored if s.m.source.startswith(SEED_SOURCE)}
    ratio = by["nemotron-labs-3-puzzle-75b-a9b"] / by["nemotron-3-super-120b-a12b"]
    assert 1.75 <= ratio <= 2.35  # published 42,601 / 20,939 = 2.03x
