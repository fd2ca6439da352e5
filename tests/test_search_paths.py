"""Search paths the spec offers beyond the default: precision recipes as JSON, score files as
JSON, objectives other than quality, and the homogeneous baseline under count rules."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest
from test_search import llama_spec, prepare, solve_spec

from costmodels.dtypes import DType
from hwprofiles.errors import InputError
from nas import search
from nas.arch import FFN, Attention, NoOp
from nas.search.blueprint import predict
from nas.spec import parse_spec

H = 4096  # Llama-3.1-8B hidden size


def _library(spec: dict, base_dir) -> tuple[search.Problem, list, object]:
    problem = search.resolve(parse_spec(spec), base_dir)
    alts = search.alternatives(problem)
    priced = search.price(problem, alts, progress=False)
    q, _ = search.score(problem, alts)
    return problem, [a for block in alts for a in block], search.build_library(
        problem, alts, priced, q)


# ---- precision recipes as JSON ---------------------------------------------------------------
def test_json_precision_recipe_file_and_inline(tmp_path):
    recipe = {"name": "ffn-fp8", "default": "bf16", "weights": {"ffn": "fp8"},
              "kv_cache": "fp8"}
    (tmp_path / "recipe.json").write_text(json.dumps(recipe))
    space = {"attention": {"kv_heads": [8, 4], "noop": True}, "ffn": {"widths": [7168]}}
    spec = llama_spec(precision="recipe.json", search_space=space, budgets=[])
    problem, flat, lib = _library(spec, tmp_path)  # the file is found beside the spec
    assert problem.recipe.name == "ffn-fp8"
    assert problem.recipe.weight_dtype("ffn") == DType.FP8
    assert problem.recipe.weight_dtype("attention") == DType.BF16
    wb, params = lib.costs["weight_bytes"], lib.costs["params"]
    for r, a in enumerate(flat):
        if isinstance(a.child, FFN):
            # gate, up, down at 1 byte; the block's norm (h weights, role "other") at 2
            mats = 3 * H * a.child.width
            assert params[r] == mats + H and wb[r] == mats + 2 * H
        elif isinstance(a.child, Attention):
            assert wb[r] == 2 * params[r]
        else:
            assert isinstance(a.child, NoOp) and wb[r] == 0
    # the same recipe inline in the spec prices identically
    _, _, inline = _library(llama_spec(precision=recipe, search_space=space, budgets=[]),
                            tmp_path)
    assert inline.costs.keys() == lib.costs.keys()
    for k in lib.costs:
        np.testing.assert_array_equal(inline.costs[k], lib.costs[k], err_msg=k)
    # FP8 KV halves an attention block's KV memory against a BF16-KV recipe
    bf16_kv = {**recipe, "kv_cache": "bf16"}
    _, _, other = _library(llama_spec(precision=bf16_kv, search_space=space, budgets=[]),
                           tmp_path)
    att = [r for r, a in enumerate(flat) if isinstance(a.child, Attention)]
    kv8 = lib.costs["memory_bytes@long"][att] - wb[att]
    kv16 = other.costs["memory_bytes@long"][att] - other.costs["weight_bytes"][att]
    np.testing.assert_allclose(kv16, 2 * kv8, rtol=1e-12)
    # a bad dtype in the file is one-line input error naming the value
    (tmp_path / "recipe.json").write_text(json.dumps({**recipe, "default": "fp7"}))
    with pytest.raises(InputError, match="fp7"):
        search.resolve(parse_spec(spec), tmp_path)


# ---- score files as JSON ---------------------------------------------------------------------
def _scores() -> dict[int, dict[str, float]]:
    out = {b: {"num_kv_heads=4": 0.5} if b % 2 == 0 else {"width=7168": 0.3}
           for b in range(64)}
    out[63] = {"width=7168": 0.001}  # FFN pruning in the last block is the cheapest by far
    return out


@pytest.mark.parametrize("layout", ["nested", "records"])
def test_json_score_files(tmp_path, layout):
    spec = llama_spec(search_space={"attention": {"kv_heads": [8, 4]},
                                    "ffn": {"widths": [7168]}},
                      budgets=[{"metric": "total_params", "max": "95%"}])
    table = _scores()
    if layout == "nested":
        data: object = {str(b): alts for b, alts in table.items()}
    else:
        data = {"scores": [{"block": b, "alternative": a, "kl_div": v, "lm_loss": 9.0}
                           for b, alts in table.items() for a, v in alts.items()]}
    f = tmp_path / "scores.json"
    f.write_text(json.dumps(data))
    spec["quality"] = {"scores": str(f)}
    _, lib, _, res, child = solve_spec(spec)
    # every alternative got its file score, the parent 0
    want = [0.0 if lab == "parent" else table[lib.start[r]][lab]
            for r, lab in enumerate(lib.labels)]
    np.testing.assert_array_equal(lib.scores["quality"], want)
    assert child.blocks[63].width == 7168
    assert res.totals["quality"] == pytest.approx(sum(want[r] for r in res.chosen))
    # a non-numeric score is an input error naming where it is
    if layout == "nested":
        data["5"] = {"width=7168": "low"}  # type: ignore[index]
        where = "5.width=7168"
    else:
        data["scores"][3]["kl_div"] = "low"  # type: ignore[index]
        where = "scores[3]"
    f.write_text(json.dumps(data))
    with pytest.raises(InputError, match=re.escape(f"{where}: expected an integer block and "
                                                   "a numeric kl_div")):
        solve_spec(spec)


# ---- objectives other than quality -----------------------------------------------------------
BUDGETS = [{"metric": "throughput", "workload": "chat", "min": "130%"}]

# objective -> (how it reads a child's re-priced figures, True when larger is better)
OBJECTIVES = {
    ("minimize", "total_params"): (lambda c, p: c.param_counts().total, False),
    ("minimize", "active_params"): (lambda c, p: c.param_counts().active, False),
    ("minimize", "memory@long"): (lambda c, p: predict(c, p)["long"]["memory_bytes"], False),
    ("minimize", "ttft@long"): (lambda c, p: predict(c, p)["long"]["ttft_s"], False),
    ("minimize", "tpot@chat"): (lambda c, p: predict(c, p)["chat"]["tpot_s"], False),
    ("maximize", "throughput@chat"):
        (lambda c, p: predict(c, p)["chat"]["throughput_tok_s"], True),
    ("maximize", "per_user_tps@long"):
        (lambda c, p: predict(c, p)["long"]["per_user_tok_s"], True),
}


@pytest.fixture(scope="module")
def quality_optimum():
    """The quality-optimal child under BUDGETS, and its quality."""
    problem, _, _, res, child = solve_spec(llama_spec(budgets=BUDGETS))
    return problem, child, res.totals["quality"]


@pytest.mark.parametrize("sense,target", list(OBJECTIVES), ids=lambda v: str(v))
def test_objectives_other_than_quality(quality_optimum, sense, target):
    """The child chosen for an objective beats, re-priced independently, another child
    meeting the same budgets (the quality-optimal one) on that objective."""
    problem, best_q, q_best = quality_optimum
    read, larger_better = OBJECTIVES[(sense, target)]
    # a quality bound keeps the objective from emptying the model (3x the best quality)
    budgets = BUDGETS + [{"metric": "quality", "max": 3 * q_best}]
    spec = llama_spec(budgets=budgets, objective={sense: target}, solver={"gap": 1e-6})
    prob, _, cons, res, child = solve_spec(spec)
    assert res.status == "optimal" and res.totals["quality"] <= 3 * q_best * (1 + 1e-9)
    assert predict(child, prob)["chat"]["throughput_tok_s"] >= 1.3 * predict(
        prob.parent, prob)["chat"]["throughput_tok_s"] * (1 - 1e-9)
    # the quality-optimal child is feasible here too, so the objective's child is at least
    # as good; with 3x the quality to spend it is far better (by 1.5x to 6x on Llama)
    mine, other = read(child, prob), read(best_q, problem)
    if larger_better:
        assert mine >= 1.25 * other
    else:
        assert mine <= 0.8 * other
    assert cons.objective.weights != {"quality": 1.0}


def test_unknown_objective_is_input_error():
    with pytest.raises(InputError, match="minimize takes"):
        solve_spec(llama_spec(objective={"minimize": "latency@chat"}))


# ---- homogeneous search with count rules -----------------------------------------------------
@pytest.mark.parametrize("rule,kept", [({"max": 16}, 0), ({"min": 16}, 32)])
def test_homogeneous_search_with_count_rules(rule, kept):
    """Homogeneous: every attention block takes one choice, so a cap of 16 kept attention
    blocks (of 32) leaves none, and a floor of 16 keeps all 32; the free search meets the
    same rule with a child at least as good."""
    budgets = BUDGETS + [{"metric": "kept_blocks", "kind": "attention", **rule}]
    spec = llama_spec(budgets=budgets)
    spec["search_space"] = {**spec["search_space"], "homogeneous": True}
    _, lib, cons, hom, child = solve_spec(spec)
    assert len(cons.counts) == 1
    attn = child.blocks[0::2]
    assert len({b.kind for b in attn}) == 1
    assert sum(not isinstance(b, NoOp) for b in attn) == kept
    assert hom.totals["runtime_s@chat"] <= cons.budgets[0].hi * (1 + 1e-9)
    problem, _, lib2, cons2 = prepare(llama_spec(budgets=budgets))
    free = search.solve(problem, lib2, cons2)[0]
    kept_free = sum("kept:attention" in lib2.tags[r] for r in free.chosen)
    assert kept_free <= 16 if "max" in rule else kept_free >= 16
    assert free.objective <= hom.objective + 1e-6 * max(1.0, abs(hom.objective))


# ---- constraints are new data ----------------------------------------------------------------
def test_constraints_leave_the_library_unchanged():
    """A max_concurrency budget bounds a column the library lacks: constraints() returns it
    in Constraints.columns and the solve reads an extended copy; the library stays as built."""
    spec = llama_spec(budgets=[{"metric": "max_concurrency", "workload": "long", "min": "150%"}])
    problem = search.resolve(parse_spec(spec), ".")
    alts = search.alternatives(problem)
    priced = search.price(problem, alts, progress=False)
    q, _ = search.score(problem, alts)
    lib = search.build_library(problem, alts, priced, q)
    costs, constants = {k: v.copy() for k, v in lib.costs.items()}, dict(lib.constants)
    cons = search.constraints(problem, lib, priced)
    assert lib.costs.keys() == costs.keys() and lib.constants == constants
    # the parent's figure is costmodels' (the same as predict's), 1.5x of it is asked
    parent_n = search.parent_max_concurrency(problem, lib, priced, "long")
    assert parent_n == predict(problem.parent, problem)["long"]["max_concurrency"] > 0
    key = f"memory_bytes@long#{-(-3 * parent_n // 2)}"
    assert list(cons.columns) == [key] and [b.key for b in cons.budgets] == [key]
    ext = cons.extend(lib)
    assert ext is not lib and key in ext.costs and key not in lib.costs
    assert cons.extend(ext) is ext
    res = search.solve(problem, lib, cons)[0]
    child = search.child_arch(problem, lib, res.chosen, alts)
    assert predict(child, problem)["long"]["max_concurrency"] >= 1.5 * parent_n
    assert lib.costs.keys() == costs.keys()


# ---- sweep by start / stop -------------------------------------------------------------------
def _sweep_spec(sweep: dict) -> dict:
    return llama_spec(budgets=[{"metric": "throughput", "workload": "chat", "min": "130%"}],
                      solver={"gap": 1e-6, "sweep": {"budget": 0, **sweep}})


def test_sweep_start_stop_grid_and_points():
    """start/stop/num is the evenly spaced grid, relative bounds kept relative; every point
    is the child a plain spec with that bound gets (solved on its own, not by the sweep)."""
    spec = _sweep_spec({"start": "130%", "stop": "160%", "num": 3})
    problem = search.resolve(parse_spec(spec), ".")
    assert search.sweep_values(problem) == ["130%", "145%", "160%"]
    alts = search.alternatives(problem)
    priced = search.price(problem, alts, progress=False)
    q, _ = search.score(problem, alts)
    lib = search.build_library(problem, alts, priced, q)
    cons = search.constraints(problem, lib, priced)
    out = search.run_sweep(problem, lib, cons, priced)
    assert [p["value"] for p in out["points"]] == ["130%", "145%", "160%"]
    for p in out["points"]:
        one = llama_spec(budgets=[{"metric": "throughput", "workload": "chat",
                                   "min": p["value"]}], solver={"gap": 1e-6})
        _, _, _, res, _ = solve_spec(one)
        assert p["status"] == res.status == "optimal"
        assert p["quality"] == pytest.approx(res.totals["quality"], rel=2e-6)
    # the spec's workers solve the same grid in other threads: the same points
    two = search.resolve(parse_spec(_sweep_spec({"start": "130%", "stop": "160%", "num": 3,
                                                 "workers": 2})), ".")
    out2 = search.run_sweep(two, lib, cons, priced)
    for a, b in zip(out["points"], out2["points"]):
        assert (a["value"], a["status"]) == (b["value"], b["status"])
        assert a["quality"] == pytest.approx(b["quality"], rel=2e-6)
    # absolute ends give numbers (tok/s), the same linspace
    absolute = search.resolve(parse_spec(_sweep_spec(
        {"start": "30000 tok/s", "stop": "45000 tok/s", "num": 4})), ".")
    assert search.sweep_values(absolute) == pytest.approx([30000.0, 35000.0, 40000.0, 45000.0])


@pytest.mark.parametrize("sweep,match", [
    ({"start": "130%", "stop": "45000 tok/s"}, "both be absolute or both relative"),
    ({"start": "130%"}, "give values, or start and stop"),
])
def test_sweep_start_stop_errors(sweep, match):
    problem = search.resolve(parse_spec(_sweep_spec(sweep)), ".")
    with pytest.raises(InputError, match=match) as exc:
        search.sweep_values(problem)
    assert "solver.sweep" in str(exc.value)
