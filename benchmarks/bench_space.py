"""The wider search space (issue 17) on the shipped Nemotron-3-Super example: library size
and MIP solve time with spans (length <= 3) and 3 precisions per block kind, side by side
with the example's own space (the baseline) in one process.

Run: ``pytest benchmarks/bench_space.py --benchmark-only``. Goal: the spans + 3-precision
library solves in <= 2 s. ``extra_info`` of each case records the library size, the seconds
to build it (alternatives, pricing, prior, library), the solve status and gap, the best
quality found, the ratio of the solve time to the baseline's median, and the quality to
compare it with: the baseline's for a case without precision (same prior), the one-recipe
child of the same library for a case with it (its prior includes every recipe's damage).

Cases (all with the example's budgets and objective, no sweep):

* ``baseline``: the example as shipped (one recipe, nvfp4-super; one block per alternative);
* ``precision``: 3 recipes per block kind (the spec's nvfp4-super and two more: MoE
  nvfp4 / fp8, Mamba fp8 / bf16, attention fp8 / bf16; duplicates of what a block reads
  are dropped);
* ``spans``: merges of 2-3 blocks (Mamba+MoE -> no-op or one MoE, attention+MoE -> one
  MoE, Mamba+MoE+Mamba -> one Mamba of both widths + the MoE);
* ``spans+precision``: both (the goal's case);
* ``spans-drop+precision``: also every tiled run of 3 blocks less one of them (k -> k-1).
"""

from __future__ import annotations

import copy
import json
import statistics
import time
from pathlib import Path

import pytest

from nas import mip, search
from nas.spec import parse_spec

EXAMPLE = Path(__file__).resolve().parents[1] / "nas" / "examples" / "nemotron3-super-h100.json"
PRECISION = {"moe": ["nvfp4", "fp8"], "mamba": ["fp8", "bf16"], "attention": ["fp8", "bf16"]}
MERGES = [
    {"kinds": ["mamba", "moe"], "replace_with": [{"noop": True}, {"block": {"kind": "moe"}}]},
    {"kinds": ["attention", "moe"], "replace_with": [{"block": {"kind": "moe"}}]},
    {"kinds": ["mamba", "moe", "mamba"], "replace_with": [
        {"blocks": [{"kind": "mamba", "fields": {"num_heads": 256}}, {"kind": "moe"}]}]},
]
DROP = [{"length": 3, "stride": 3, "replace_with": [{"drop_one": True}]}]
CASES = {
    "baseline": (None, None),
    "precision": (None, PRECISION),
    "spans": (MERGES, None),
    "spans+precision": (MERGES, PRECISION),
    "spans-drop+precision": (MERGES + DROP, PRECISION),
}
_BASE: dict[str, float] = {}


def _prepare(case: str):
    spans, precision = CASES[case]
    data = json.loads(EXAMPLE.read_text())
    data["solver"].pop("sweep", None)
    data["search_space"]["compare_homogeneous"] = False
    if spans:
        data["search_space"]["spans"] = copy.deepcopy(spans)
    if precision:
        data["search_space"]["precision"] = precision
    t0 = time.perf_counter()
    problem = search.resolve(parse_spec(data), EXAMPLE.parent)
    alts = search.alternatives(problem)
    priced = search.price(problem, alts, progress=False)
    q, _ = search.score(problem, alts)
    lib = search.build_library(problem, alts, priced, q)
    cons = search.constraints(problem, lib, priced)
    return problem, cons.extend(lib), cons, time.perf_counter() - t0


@pytest.mark.parametrize("case", list(CASES))
def test_solve_wider_space(benchmark, case):
    problem, lib, cons, build_s = _prepare(case)
    opts = search.options_of(problem)

    def solve() -> mip.Result:
        return mip.solve(lib, cons.objective, cons.budgets, counts=cons.counts, options=opts)

    rounds = 1 if case == "spans-drop+precision" else 3
    res = benchmark.pedantic(solve, rounds=rounds, iterations=1)
    assert res.ok
    med = statistics.median(benchmark.stats.stats.data)
    if case == "baseline":
        _BASE["median_s"] = med
        _BASE["quality"] = res.totals["quality"]
    # the comparable one-recipe child: the same library (same prior: with precision
    # searched every block's score includes its recipe's damage) without the other recipes
    fixed = mip.solve(lib, cons.objective, cons.budgets, counts=cons.counts, options=opts,
                      forbid=search.fixed_recipe_forbid(lib).tolist()) \
        if CASES[case][1] else None
    benchmark.extra_info.update({
        "replacements": lib.num_replacements, "build_s": round(build_s, 3),
        "status": res.status, "gap": res.gap, "quality": res.totals["quality"],
        "one_recipe_quality": None if fixed is None else fixed.totals["quality"],
        "baseline_quality": _BASE.get("quality") if not CASES[case][1] else None,
        "median_solve_s": round(med, 3),
        "solve_vs_baseline": round(med / _BASE["median_s"], 2) if "median_s" in _BASE else None,
        "spans_chosen": int(sum(int(lib.end[r] - lib.start[r] > 1) for r in res.chosen)),
    })
