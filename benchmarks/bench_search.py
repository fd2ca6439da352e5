"""Spec -> blueprint timing for the shipped Nemotron-3-Super example.

Run: ``pytest benchmarks/bench_search.py --benchmark-only``.
Two variants: the example as shipped (one solve + a 12-point throughput sweep for the
Pareto plot + the homogeneous baseline beside it), and the plain search (one solve, no
sweep, no baseline).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from nas.search import run
from nas.spec import parse_spec

EXAMPLE = Path(__file__).resolve().parents[1] / "nas" / "examples" / "nemotron3-super-h100.json"


def _spec(plain: bool):
    data = json.loads(EXAMPLE.read_text())
    if plain:
        data["solver"].pop("sweep", None)
        data["search_space"]["compare_homogeneous"] = False
    return parse_spec(data)


@pytest.mark.parametrize("variant", ["plain", "as-shipped"])
def test_super_spec_to_blueprint(benchmark, tmp_path, variant):
    spec = _spec(variant == "plain")
    out = benchmark.pedantic(run, args=(spec, EXAMPLE.parent, tmp_path / variant),
                             kwargs={"progress": False}, rounds=3, iterations=1)
    assert out.blueprints[0].solver["status"] == "optimal"
    benchmark.extra_info.update({k: round(v, 3) for k, v in out.timings.items()})
    benchmark.extra_info["alternatives"] = out.library.num_replacements
