"""A precision recipe per block: alternatives, pricing, and the search against one recipe."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from test_spans import prepare as prepare_priced

from costmodels.dtypes import TensorRole
from costmodels.shapes import role_params
from hwprofiles.errors import InputError
from nas import mip, search
from nas.arch import blocks_table
from nas.spec import parse_spec

EXAMPLES = Path(__file__).resolve().parents[1] / "nas" / "examples"
PRECISION = {"moe": ["nvfp4", "fp8"], "mamba": ["fp8", "bf16"], "attention": ["fp8", "bf16"]}


def example(name: str, precision: dict | None = PRECISION, sweep: bool = False) -> dict:
    data = json.loads((EXAMPLES / f"{name}.json").read_text())
    data["parent"] = str(EXAMPLES / data["parent"])
    if not sweep:
        data["solver"].pop("sweep", None)
    data["search_space"]["compare_homogeneous"] = False
    if precision is not None:
        data["search_space"]["precision"] = precision
    return data


def prepare(spec: dict):
    problem, alts, _, lib, cons = prepare_priced(spec)
    return problem, alts, lib, cons


@pytest.fixture(scope="module")
def super_prec():
    return prepare(example("nemotron3-super-h100"))


def test_precision_alternatives_and_labels(super_prec):
    problem, alts, lib, _ = super_prec
    pa = problem.parent
    for i, row in enumerate(alts):
        kind = pa.blocks[i].kind
        labels = {a.label for a in row}
        if kind == "moe":
            assert {"precision=nvfp4", "precision=fp8"} <= labels
            assert any(lab.endswith(",precision=fp8") for lab in labels)
        if kind == "attention":
            assert {"precision=fp8", "precision=bf16"} <= labels
        if kind == "mamba":
            # fp8 stores Mamba exactly as the spec's nvfp4-super does: no duplicate
            assert "precision=bf16" in labels and "precision=fp8" not in labels
        assert sum(a.is_parent for a in row) == 1
    tagged = search.fixed_recipe_forbid(lib)
    assert all(lib.labels[r].split(",")[-1].startswith("precision=") for r in tagged)


def test_precision_prices_weight_bytes_per_role(super_prec):
    """An FP8 MoE block stores routed and shared experts in 1 byte per parameter; the
    nvfp4-super one routed experts in 0.5625 (4 bits + an E4M3 scale per 16)."""
    problem, alts, lib, _ = super_prec
    flat = [a for row in alts for a in row]
    k = next(i for i, a in enumerate(flat) if a.label == "precision=fp8"
             and a.child.kind == "moe")
    p = next(i for i, a in enumerate(flat) if a.block == flat[k].block and a.is_parent)
    rp = role_params(blocks_table([flat[k].child], problem.parent.hidden_size))
    routed = float(rp[TensorRole.ROUTED_EXPERTS][0])
    shared = float(rp[TensorRole.SHARED_EXPERTS][0])
    other = sum(float(v[0]) for r, v in rp.items()
                if r not in (TensorRole.ROUTED_EXPERTS, TensorRole.SHARED_EXPERTS))
    assert lib.costs["weight_bytes"][k] == pytest.approx(routed + shared + 2 * other, rel=1e-12)
    assert lib.costs["weight_bytes"][p] == pytest.approx(
        0.5625 * routed + shared + 2 * other, rel=1e-12)
    # FP8 experts run slower in decode than NVFP4 (more bytes to stream)
    assert lib.costs["tpot_s@interactive"][k] > lib.costs["tpot_s@interactive"][p]


def test_searched_precision_is_at_least_as_good_as_one_recipe(super_prec):
    """The shipped Super example, same budgets: the best child with a recipe per block is
    no worse than the best with nvfp4-super everywhere. The one-recipe child is handed to
    the wider MIP as a checked incumbent (it meets every row there), so the wider answer
    can only improve on it; on this example it does."""
    problem, alts, lib, cons = super_prec
    opts = mip.SolveOptions(time_limit=60, mip_rel_gap=1e-4)
    lib2 = cons.extend(lib)
    forbid = search.fixed_recipe_forbid(lib2)
    fixed = mip.solve(lib2, cons.objective, cons.budgets, counts=cons.counts, forbid=forbid,
                      options=opts)
    assert fixed.ok
    assert not set(fixed.chosen.tolist()) & set(forbid.tolist())
    # the one-recipe child meets every budget of the wide library
    for b in cons.budgets:
        assert fixed.totals[b.key] <= b.hi * (1 + 1e-9)
    wide = mip.solve(lib2, cons.objective, cons.budgets, counts=cons.counts, options=opts,
                     warm_start=fixed.chosen.tolist())
    assert wide.ok
    assert wide.totals["quality"] <= fixed.totals["quality"] + 1e-9
    assert wide.totals["quality"] < fixed.totals["quality"] * (1 - 1e-3)
    assert set(wide.chosen.tolist()) & set(forbid.tolist())  # it uses other recipes


def test_unknown_recipe_names_the_field():
    with pytest.raises(InputError) as e:
        parse_spec(example("nemotron3-super-h100", {"moe": ["fp6"]}))
    assert "search_space.precision.moe" in str(e.value) and "fp6" in str(e.value)


def test_search_run_compares_one_recipe_with_searched_precision(tmp_path):
    """``compare_fixed``: report section, sweep line and plot of one recipe for all."""
    spec = example("llama3.1-8b-h100", {"attention": ["bf16"], "ffn": ["nvfp4"],
                                        "compare_fixed": True}, sweep=True)
    spec["solver"]["sweep"]["num"] = 3
    spec["solver"]["diverse"] = 1
    out = search.run(parse_spec(spec), EXAMPLES, tmp_path / "out", progress=False)
    report = (tmp_path / "out" / "report.md").read_text()
    assert "One recipe for all vs precision searched" in report
    assert "| precision |" in report
    sweep = json.loads((tmp_path / "out" / "sweep.json").read_text())
    assert len(sweep["fixed_recipe"]) == len(sweep["points"]) == 3
    for p, f in zip(sweep["points"], sweep["fixed_recipe"]):
        if p["quality"] is not None and f["quality"] is not None:
            assert p["quality"] <= f["quality"] + 1e-6
    assert (tmp_path / "out" / "pareto.png").stat().st_size > 0
    bp = json.loads((tmp_path / "out" / "blueprint.json").read_text())
    qc = bp["child"].get("quantization_config")
    assert qc is not None and qc["quant_algo"] == "MIXED_PRECISION"
    names = {c["precision"] for c in bp["choices"]}
    assert names <= {"fp8", "bf16", "nvfp4"}
    # no spans here: one child block per parent block, each standing in for its own
    assert bp["stand_in"] == list(range(len(bp["choices"])))
    assert bp["precision"] == [c["precision"] for c in bp["choices"]]
    # the child re-priced block by block under its own recipes (blueprint "predicted")
    # equals the library total the budget bounded
    b = next(b for b in bp["budgets"] if b["key"] == "runtime_s@chat")
    thr = 256 * 1024 / b["child_value"]
    assert bp["predicted"]["chat"]["child"]["throughput_tok_s"] == pytest.approx(thr, rel=1e-9)
    assert out.blueprints[0].quality["value"] == pytest.approx(bp["quality"]["value"])

