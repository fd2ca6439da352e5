"""The spec -> blueprint pipeline: budgets met when re-priced independently, relative
budgets, homogeneous baseline, infeasibility, schema errors, score files, the examples."""

from __future__ import annotations

import copy
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from conftest import LLAMA, SUPER

from costmodels.memory import DEFAULT_RESERVE_BYTES
from hwprofiles.errors import InputError
from nas import search
from nas.hf import from_hf, to_hf
from nas.mip import InfeasibleError
from nas.search.blueprint import predict
from nas.spec import parse_spec

EXAMPLES = Path(__file__).resolve().parents[1] / "nas" / "examples"


def llama_spec(**over) -> dict:
    spec = {
        "name": "t",
        "parent": str(LLAMA),
        "hardware": "h100-sxm",
        "precision": "fp8",
        "workloads": {"chat": {"isl": 128, "osl": 512, "batch": 128},
                      "long": {"isl": 4096, "osl": 256, "concurrency": 32}},
        "search_space": {
            "attention": {"kv_heads": [8, 4, 2, 1], "noop": True, "linear": True},
            "ffn": {"fractions": [1.0, 0.75, 0.5, 0.25], "round_to": 256, "noop": True},
        },
        "budgets": [{"metric": "throughput", "workload": "chat", "min": "160%"}],
        "solver": {"time_limit": 30},
    }
    spec.update(over)
    return spec


def pipeline(spec: dict):
    """spec -> (problem, alternatives, priced, library, constraints), the pipeline's first
    steps (resolve, alternatives, price, score, library, constraints)."""
    problem = search.resolve(parse_spec(spec), ".")
    alts = search.alternatives(problem)
    priced = search.price(problem, alts, progress=False)
    q, _ = search.score(problem, alts)
    lib = search.build_library(problem, alts, priced, q)
    return problem, alts, priced, lib, search.constraints(problem, lib, priced)


def prepare(spec: dict):
    """spec -> (problem, alternatives, library, constraints), the pipeline's first steps."""
    problem, alts, _, lib, cons = pipeline(spec)
    return problem, alts, lib, cons


def solve_spec(spec: dict):
    problem, alts, lib, cons = prepare(spec)
    res = search.solve(problem, lib, cons)[0]
    child = search.child_arch(problem, lib, res.chosen, alts)
    return problem, lib, cons, res, child


def test_tight_budgets_met_when_repriced(tmp_path):
    spec = llama_spec(budgets=[
        {"metric": "throughput", "workload": "chat", "min": "170%"},
        {"metric": "ttft", "workload": "long", "max": "900 ms"},
        {"metric": "memory", "workload": "long", "max": "20 GiB"},
        {"metric": "per_user_tps", "workload": "long", "min": "180 tok/s"},
    ])
    problem, lib, cons, res, child = solve_spec(spec)
    assert res.status == "optimal"
    parent_pred = predict(problem.parent, problem)
    pred = predict(child, problem)  # independent re-pricing from the child architecture
    assert pred["chat"]["throughput_tok_s"] >= 1.7 * parent_pred["chat"]["throughput_tok_s"] \
        * (1 - 1e-9)
    assert pred["long"]["ttft_s"] <= 0.9 + 1e-12
    assert pred["long"]["memory_bytes"] <= 20 * 2**30
    assert pred["long"]["per_user_tok_s"] >= 180 * (1 - 1e-9)
    # the library sums equal the independent pricing (costs are additive)
    for w in ("chat", "long"):
        assert res.totals[f"ttft_s@{w}"] == pytest.approx(pred[w]["ttft_s"], rel=1e-9)
        assert res.totals[f"tpot_s@{w}"] == pytest.approx(pred[w]["tpot_s"], rel=1e-9)
        # memory: the library holds the parent's workspace (an upper bound for any child)
        assert pred[w]["memory_bytes"] <= res.totals[f"memory_bytes@{w}"] * (1 + 1e-12)
    # at least one budget binds (the search spent what it was allowed; the library is
    # discrete, so the tightest one sits within half a percent of its bound)
    assert min(abs(b.hi - res.totals[b.key]) / b.hi for b in cons.budgets) < 5e-3


def test_relative_budgets_resolve_against_parent():
    problem, lib, cons, res, child = solve_spec(llama_spec(budgets=[
        {"metric": "memory", "workload": "long", "max": "60%"},
        {"metric": "total_params", "max": "80%"},
        {"metric": "throughput", "workload": "chat", "min": "125%"},
    ]))
    parent = search.parent_totals(lib)
    keys = {b.key: b.hi for b in cons.budgets}
    assert keys["memory_bytes@long"] == pytest.approx(0.6 * parent["memory_bytes@long"])
    assert keys["params"] == pytest.approx(0.8 * 8_030_261_248)
    assert keys["runtime_s@chat"] == pytest.approx(parent["runtime_s@chat"] / 1.25)
    pp = predict(problem.parent, problem)
    pc = predict(child, problem)
    assert pc["chat"]["throughput_tok_s"] >= 1.25 * pp["chat"]["throughput_tok_s"] * (1 - 1e-9)
    assert child.param_counts().total <= 0.8 * 8_030_261_248
    # parent totals are the parent's own priced figures
    assert parent["ttft_s@long"] == pytest.approx(pp["long"]["ttft_s"], rel=1e-12)


@pytest.mark.parametrize("target", ["130%", "160%", "200%"])
def test_homogeneous_never_beats_search(target):
    spec = llama_spec(budgets=[{"metric": "throughput", "workload": "chat", "min": target}])
    problem, lib, cons, res, child = solve_spec(spec)
    hom = search.homogeneous_solve(lib, cons)
    assert hom.ok
    assert res.objective <= hom.objective + 1e-6 * max(1.0, abs(hom.objective))
    # homogeneous: every attention block and every FFN block takes one choice
    labels = [lib.labels[r] for r in hom.chosen]
    assert len(set(labels[0::2])) == 1 and len(set(labels[1::2])) == 1
    # and the homogeneous optimum is exact: its totals meet the budget
    assert hom.totals["runtime_s@chat"] <= cons.budgets[0].hi * (1 + 1e-9)


def test_homogeneous_spec_flag():
    spec = llama_spec()
    spec["search_space"] = {**spec["search_space"], "homogeneous": True}
    _, lib, _, res, child = solve_spec(spec)
    kinds = {}
    for b in child.blocks:
        kinds.setdefault(b.kind if b.kind in ("attention", "ffn") else "other", set()).add(b)
    assert all(len(v) == 1 for v in kinds.values())


@pytest.mark.parametrize("target", [8, "300%"])
def test_max_concurrency_budget_super(target):
    """'Fit 8 requests of 1M tokens on one H100' is one budget (or 3x the parent's)."""
    spec = {
        "parent": str(SUPER), "hardware": "h100-sxm", "precision": "nvfp4-super",
        "workloads": {"long": {"isl": 1040000, "osl": 8576, "concurrency": 1}},
        "search_space": {"attention": {"kv_heads": [2, 1]},
                         "moe": {"expert_widths": [2688, 2048, 1536, 1024],
                                 "top_k": [22, 12, 6]},
                         "mamba": {"state_sizes": [128, 64]}},
        "budgets": [{"metric": "max_concurrency", "workload": "long", "min": target}],
    }
    problem, lib, cons, res, child = solve_spec(spec)
    parent_n = predict(problem.parent, problem)["long"]["max_concurrency"]
    want = 8 if target == 8 else 3 * parent_n
    assert parent_n < want <= predict(child, problem)["long"]["max_concurrency"]


def test_score_file_csv(tmp_path):
    spec = llama_spec(search_space={"attention": {"kv_heads": [8, 4]},
                                    "ffn": {"widths": [7168]}},
                      budgets=[{"metric": "total_params", "max": "95%"}])
    # measured scores: make FFN pruning in block 63 the cheapest by far
    rows = ["block,alternative,kl_div"]
    for b in range(64):
        rows.append(f"{b},num_kv_heads=4,0.5" if b % 2 == 0 else f"{b},width=7168,0.3")
    rows[-1] = "63,width=7168,0.001"
    f = tmp_path / "scores.csv"
    f.write_text("\n".join(rows) + "\n")
    spec["quality"] = {"scores": str(f)}
    _, lib, _, res, child = solve_spec(spec)
    assert child.blocks[63].width == 7168
    assert res.totals["quality"] == pytest.approx(
        sum(lib.scores["quality"][r] for r in res.chosen))
    # a missing score is an error naming the block and alternative
    f.write_text("\n".join(rows[:-1]) + "\n")
    with pytest.raises(InputError, match="block 63 alternative 'width=7168'"):
        solve_spec(spec)


def run_cli(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "nas", *args], capture_output=True, text=True,
                          cwd=cwd)


def test_infeasible_spec_exits_3_with_explanation(tmp_path):
    spec = llama_spec(budgets=[{"metric": "total_params", "max": "1B"}])
    spec["search_space"] = {"attention": {"kv_heads": [4]}, "ffn": {"fractions": [0.5]}}
    f = tmp_path / "spec.json"
    f.write_text(json.dumps(spec))
    p = run_cli("search", str(f), "-o", str(tmp_path / "out"), "--quiet")
    assert p.returncode == 3, p.stderr
    assert "params" in p.stderr and "can go no lower than" in p.stderr
    assert "Traceback" not in p.stderr
    assert not (tmp_path / "out" / "blueprint.json").exists()


@pytest.mark.parametrize("mutate,path", [
    (lambda s: s["budgets"].append({"metric": "memory", "workload": "nope", "max": "1 GB"}),
     "budgets"),
    (lambda s: s["workloads"]["chat"].update(isl=-3), "workloads.chat.isl"),
    (lambda s: s["budgets"].append({"metric": "speed", "max": 3}), "budgets[1].metric"),
    (lambda s: s["search_space"]["ffn"].update(fractions=[1.5]),
     "search_space.ffn.fractions[0]"),
    (lambda s: s.update(colour="blue"), "colour"),
    (lambda s: s["budgets"][0].update(min="fast"), "budgets[0].min"),
])
def test_schema_errors_exit_2_with_json_path(tmp_path, mutate, path):
    spec = llama_spec()
    mutate(spec)
    f = tmp_path / "spec.json"
    f.write_text(json.dumps(spec))
    p = run_cli("search", str(f), "-o", str(tmp_path / "out"), "--quiet")
    assert p.returncode == 2, p.stderr
    assert path in p.stderr, p.stderr
    assert len(p.stderr.strip().splitlines()) == 1 and "Traceback" not in p.stderr


def test_schema_command_prints_json_schema():
    p = run_cli("schema")
    assert p.returncode == 0
    schema = json.loads(p.stdout)
    assert "workloads" in schema["properties"] and "budgets" in schema["properties"]


def test_inline_parent_and_export_roundtrip():
    cfg = json.loads(LLAMA.read_text())
    spec = llama_spec(parent=cfg)
    problem, lib, cons, res, child = solve_spec(spec)
    exported = to_hf(child)
    assert from_hf(exported).blocks == child.blocks
    assert problem.reserve_bytes == DEFAULT_RESERVE_BYTES


@pytest.mark.parametrize("name", ["nemotron3-super-h100", "llama3.1-8b-h100",
                                  "nemotron3-super-8xb200"])
def test_shipped_examples_run(tmp_path, name):
    out = tmp_path / name
    p = run_cli("search", str(EXAMPLES / f"{name}.json"), "-o", str(out), "--quiet")
    assert p.returncode == 0, p.stderr
    bp = json.loads((out / "blueprint.json").read_text())
    assert {"child", "predicted", "solver"} <= set(bp)
    assert bp["solver"]["status"] == "optimal"
    assert bp["quality"]["is_prior"] and "prior" in (out / "report.md").read_text()
    spec = json.loads((EXAMPLES / f"{name}.json").read_text())
    if spec["solver"].get("sweep"):
        assert (out / "pareto.png").read_bytes()[:4] == b"\x89PNG"
    # every child config (a pool writes blueprint-2.json, ...) is what `inspect` reads
    files = sorted(out.glob("blueprint*.json"))
    assert len(files) == spec["solver"].get("diverse", 1)
    for f in files:
        b = json.loads(f.read_text())
        child_cfg = out / "child.json"
        child_cfg.write_text(json.dumps(b["child"]))
        q = run_cli("inspect", str(child_cfg), "--json")
        assert q.returncode == 0, q.stderr
        assert json.loads(q.stdout)["total_params"] == b["params"]["child_total"]


def test_super_example_fits_eight_1m_requests(tmp_path):
    """The default example reproduces the published 1M-context claim: 8 requests fit."""
    spec = json.loads((EXAMPLES / "nemotron3-super-h100.json").read_text())
    spec["parent"] = str(SUPER)
    spec["solver"].pop("sweep")
    spec["search_space"]["compare_homogeneous"] = False
    problem, lib, cons, res, child = solve_spec(spec)
    pred, ppred = predict(child, problem), predict(problem.parent, problem)
    assert ppred["long-1m"]["max_concurrency"] < 8 <= pred["long-1m"]["max_concurrency"]
    assert pred["interactive"]["throughput_tok_s"] >= \
        1.5 * ppred["interactive"]["throughput_tok_s"] * (1 - 1e-9)
    assert np.isclose(res.totals["quality"], res.objective)


def test_diverse_pool_from_spec():
    spec = llama_spec(solver={"diverse": 3, "min_distance": 3, "time_limit": 30})
    problem, _, lib, cons = prepare(spec)
    pool = search.solve(problem, lib, cons)
    assert len(pool) == 3
    for i in range(3):
        for j in range(i):
            diff = sum(a != b for a, b in zip(pool[i].choices, pool[j].choices))
            assert diff >= 3
    # each is the best child left within the gap (1e-4 here): no later one beats the
    # first by more than that (equal children sum their KL in another order)
    gap = problem.spec.solver.gap
    assert all(r.objective >= pool[0].objective - gap * abs(pool[0].objective) for r in pool)


def test_copy_of_spec_is_not_mutated():
    spec = llama_spec()
    before = copy.deepcopy(spec)
    solve_spec(spec)
    assert spec == before


def test_batch_size_sweep_keeps_best_per_target(tmp_path):
    """Puzzle's way: the batch size is not a MIP variable; solve per batch, keep the best."""
    spec = llama_spec(budgets=[
        {"metric": "throughput", "workload": "chat", "min": "30000 tok/s"},
        {"metric": "memory", "workload": "chat", "max": "12 GiB"},
    ])
    spec["solver"] = {"sweep": {"budget": 0, "values": ["30000 tok/s", "45000 tok/s"],
                                "workload": "chat", "batch_sizes": [32, 128, 512]}}
    out = search.run(parse_spec(spec), ".", tmp_path, progress=False)
    pts = out.sweep["points"]
    assert [p["value"] for p in pts] == ["30000 tok/s", "45000 tok/s"]
    # each point is the best over the batch sizes. The expectation does not go through the
    # sweep or with_batch: one plain spec per (target, batch size), solved once, best kept.
    for i, p in enumerate(pts):
        best = None
        for size in (32, 128, 512):
            one = llama_spec(budgets=[
                {"metric": "throughput", "workload": "chat", "min": p["value"]},
                {"metric": "memory", "workload": "chat", "max": "12 GiB"},
            ], solver={"gap": 1e-6})
            one["workloads"]["chat"]["batch"] = size
            try:
                res = solve_spec(one)[3]
            except InfeasibleError:
                continue
            if best is None or res.objective < best:
                best = res.objective
        assert best is not None
        assert p["quality"] == pytest.approx(best, rel=2e-4)
        assert p["batch"] in (32, 128, 512) and p["metric"] >= [30000, 45000][i] * (1 - 1e-9)
    assert (tmp_path / "pareto.png").exists()
