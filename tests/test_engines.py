"""Engines and the search space: tied choices in the MIP (exact against brute force), the
per-engine capability table (nas.engines) and ``deploy.engines`` in a search."""

from __future__ import annotations

import itertools
import json
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from conftest import LLAMA, SUPER
from library_generators import typed_library

from hwprofiles.errors import InputError
from nas import engines, search
from nas.arch import NoOp
from nas.hf import SUPPORTED_TYPES, load_config, to_hf
from nas.hf.nemotron_h import puzzle_schema_problems
from nas.library import BlockLibrary
from nas.mip import (
    Budget,
    MipModel,
    Objective,
    SolveOptions,
    SolverError,
    Tie,
    diverse_pool,
    solve,
    sweep,
)
from nas.spec import parse_spec


def brute_force(lib: BlockLibrary, obj: str, budgets: list[Budget], ties: list[Tie]
                ) -> tuple[float, list[int]] | None:
    """Every path 0 -> L of the replacement graph, the best that meets every budget and
    tie: (objective, chosen) or None."""
    by_start: dict[int, list[int]] = {}
    for r in range(lib.num_replacements):
        by_start.setdefault(int(lib.start[r]), []).append(r)
    best: tuple[float, list[int]] | None = None
    of = [t.group_of(lib.num_replacements) for t in ties]

    def walk(b: int, path: list[int]) -> None:
        nonlocal best
        if b == lib.num_blocks:
            for g in of:
                if len({g[r] for r in path if g[r] >= 0}) > 1:
                    return
            tot = lib.totals(path)
            for bu in budgets:
                if (bu.hi is not None and tot[bu.key] > bu.hi) or \
                        (bu.lo is not None and tot[bu.key] < bu.lo):
                    return
            if best is None or tot[obj] < best[0]:
                best = (tot[obj], list(path))
            return
        for r in by_start.get(b, []):
            walk(int(lib.end[r]), [*path, r])

    walk(0, [])
    return best


def by_value(lib: BlockLibrary, obj: str, budgets: list[Budget], tie: Tie
             ) -> float | None:
    """The tied optimum by another route: for each group of ``tie`` (one value), scipy's
    milp on the plain model with every other group's replacements forbidden; the best."""
    import scipy.sparse as sp
    from scipy.optimize import Bounds, LinearConstraint, milp

    R, L = lib.num_replacements, lib.num_blocks
    blocks = np.concatenate([np.arange(a, b) for a, b in zip(lib.start, lib.end)])
    cover = sp.csr_matrix((np.ones(blocks.size), (blocks, np.repeat(np.arange(R),
                                                                    lib.lengths))), (L, R))
    rows, lo, hi = [cover], [np.ones(L)], [np.ones(L)]
    for b in budgets:
        rows.append(sp.csr_matrix(lib.values(b.key)[None, :]))
        c = lib.constant(b.key)
        lo.append(np.array([-np.inf if b.lo is None else b.lo - c]))
        hi.append(np.array([np.inf if b.hi is None else b.hi - c]))
    of = np.asarray(tie.group_of(R))
    best = None
    for g in range(len(tie.groups)):
        ub = np.where((of >= 0) & (of != g), 0.0, 1.0)
        r = milp(lib.values(obj), constraints=LinearConstraint(
            sp.vstack(rows), np.concatenate(lo), np.concatenate(hi)), integrality=np.ones(R),
            bounds=Bounds(0, ub), options={"mip_rel_gap": 0.0})
        if r.x is not None:
            v = float(lib.values(obj) @ np.round(r.x)) + lib.constant(obj)
            best = v if best is None else min(best, v)
    return best


def kind_ties(lib: BlockLibrary, noop_grouped: bool) -> list[Tie]:
    """Kind A's variants tied by pairs (v0 v1 | v2 v3 | v4), its no-op in a group of its
    own (an anchor exists) or in none (free: no anchor, the big-M rows)."""
    groups: dict[str, list[int]] = {}
    for r, lab in enumerate(lib.labels):
        kind, _, var = lab.partition(" ")
        if kind != "A":
            continue
        if var == "no_op":
            if noop_grouped:
                groups.setdefault("noop", []).append(r)
            continue
        groups.setdefault(f"pair{int(var[1:]) // 2}", []).append(r)
    names = sorted(groups)
    return [Tie("A.variant", tuple(tuple(groups[n]) for n in names), tuple(names))]


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("spans,noop_grouped", [(False, True), (False, False), (True, True)])
def test_ties_give_the_brute_force_optimum(seed, spans, noop_grouped):
    """Tied groups (anchored rows, and the big-M rows when no block always takes a value)
    give the exact optimum of the tied space at gap 0, and the optimum of the untied space
    is no worse."""
    lib = typed_library(6, seed=seed, groups=2, spans=spans)
    tot = lib.totals([int(np.flatnonzero(lib.start == b)[0]) for b in range(lib.num_blocks)])
    budgets = [Budget("mem", None, (0.35 + 0.1 * seed) * tot["mem"])]
    ties = kind_ties(lib, noop_grouped)
    ref = brute_force(lib, "kl", budgets, ties)
    res = solve(lib, "kl", budgets, ties=ties, options=SolveOptions(mip_rel_gap=0.0))
    if ref is None:
        assert res.status == "infeasible"
        return
    assert res.status == "optimal", res
    assert abs(res.objective - ref[0]) <= 1e-9 * max(abs(ref[0]), 1.0)
    assert len(ties[0].broken_by(res.chosen.tolist(), lib.num_replacements)) <= 1
    free = solve(lib, "kl", budgets, options=SolveOptions(mip_rel_gap=0.0))
    assert free.objective <= res.objective + 1e-12


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("spans,noop_grouped", [(False, True), (True, False), (True, True)])
def test_ties_on_larger_libraries_match_one_solve_per_value(seed, spans, noop_grouped):
    """24 blocks (too many paths to enumerate): the tied optimum equals the best of one
    plain solve per tied value (scipy.milp, the other values forbidden), at gap 0."""
    lib = typed_library(24, seed=seed, groups=3, spans=spans)
    tot = lib.totals([int(np.flatnonzero(lib.start == b)[0]) for b in range(lib.num_blocks)])
    budgets = [Budget("mem", None, (0.4 + 0.1 * seed) * tot["mem"])]
    ties = kind_ties(lib, noop_grouped)
    ref = by_value(lib, "kl", budgets, ties[0])
    res = solve(lib, "kl", budgets, ties=ties, options=SolveOptions(mip_rel_gap=0.0))
    if ref is None:
        assert res.status == "infeasible"
        return
    assert res.status == "optimal", res
    assert res.objective == pytest.approx(ref, rel=1e-9, abs=1e-9)


def test_ties_bind_and_hold_in_pools_and_sweeps():
    """Unconstrained, the optimum mixes A's variants; with the tie it takes one pair; every
    child of a pool and of a sweep keeps the tie; the DP (off with ties) is not used."""
    lib = typed_library(10, seed=3, groups=2, spans=False)
    tot = lib.totals([int(np.flatnonzero(lib.start == b)[0]) for b in range(lib.num_blocks)])
    budgets = [Budget("mem", None, 0.7 * tot["mem"])]
    ties = kind_ties(lib, True)
    free = solve(lib, "kl", budgets, options=SolveOptions(mip_rel_gap=0.0))
    assert len(ties[0].broken_by(free.chosen.tolist(), lib.num_replacements)) > 1
    tied = solve(lib, "kl", budgets, ties=ties, options=SolveOptions(mip_rel_gap=0.0))
    assert tied.objective == pytest.approx(by_value(lib, "kl", budgets, ties[0]), rel=1e-9)
    pool = diverse_pool(lib, "kl", budgets, n=4, min_distance=2, ties=ties,
                        options=SolveOptions(mip_rel_gap=0.0))
    assert len(pool) == 4
    sw = sweep(lib, "kl", budgets, key="mem", values=[0.4 * tot["mem"], 0.6 * tot["mem"],
                                                       0.8 * tot["mem"]], ties=ties,
               options=SolveOptions(mip_rel_gap=0.0))
    for r in [*pool, *sw.results]:
        assert r.ok and len(ties[0].broken_by(r.chosen.tolist(), lib.num_replacements)) == 1
    for r, v in zip(sw.results, sw.values):
        assert r.objective == pytest.approx(by_value(lib, "kl", [Budget("mem", None, v)],
                                                     ties[0]), rel=1e-9)


def test_a_broken_tie_is_caught_and_ties_alone_explain_infeasibility():
    lib = typed_library(6, seed=1, groups=2, spans=False)
    ties = kind_ties(lib, True)
    m = MipModel(lib, "kl", ties=ties)
    a_rows = [r for r, lab in enumerate(lib.labels) if lab.startswith("A")]
    mixed = []
    for b in range(lib.num_blocks):  # block 0 (an A) takes v0, block 2 (an A) takes v2
        want = {0: "A v0", 2: "A v2"}.get(b)
        mixed.append(next(r for r in range(lib.num_replacements) if lib.start[r] == b
                          and (want is None or lib.labels[r] == want)))
    x = np.zeros(m.num_columns)
    x[mixed] = 1.0
    with pytest.raises(SolverError, match="breaks tie A.variant"):
        m.verify(m.with_counts(x[:lib.num_replacements]))
    # every A block's replacements in a group of their own: a child could take a value at
    # one A block only, but each must be covered -> no child, and the message says why
    own = tuple(tuple(r for r in a_rows if lib.start[r] == b)
                for b in sorted({int(lib.start[r]) for r in a_rows}))
    res = solve(lib, "kl", [], ties=[Tie("A.own", own)])
    assert res.status == "infeasible"
    assert "tied choices leave no child" in res.message


def test_nas_mip_does_not_import_nas_spec():
    """The solver is a layer under the spec: the budget units live in nas.units."""
    out = subprocess.run([sys.executable, "-c", "import sys, nas.mip; "
                          "print('nas.spec' in sys.modules)"], capture_output=True, text=True,
                         check=True)
    assert out.stdout.strip() == "False"
    from nas.mip.constraints import parse_value
    assert parse_value("2 GiB", "memory_bytes") == 2 * 2**30
    assert parse_value("10 ms", "runtime_s") == pytest.approx(0.01)



# ---- the capability table -----------------------------------------------------------------
EXAMPLES = Path(__file__).resolve().parents[1] / "nas" / "examples"


def test_table_covers_every_family_and_cites_its_rows():
    """Every HF type the project reads has a family and every engine an entry; every row
    read in an engine's code names the file and a full commit, every other says so."""
    for t in SUPPORTED_TYPES:
        assert engines.family_of(t) is not None, t
        for e in engines.ENGINES:
            assert engines.entry(t, e).engine == e
    rows = engines.table_rows()
    assert rows
    for r in rows:
        assert r["axis"] in engines.AXES and r["take"] in ("per_layer", "global", "none")
        if r["verified"]:
            assert re.fullmatch(r".+/.+@[0-9a-f]{10}:.+\.py", r["source"]), r
        else:
            assert not r["source"] and r["note"], r
    nh = engines.entry("nemotron_h", "vllm")
    assert {a for a in engines.AXES if nh.row(a).take == "per_layer"} >= {
        "moe.experts", "moe.expert_width", "moe.top_k"}
    assert nh.row("mamba.state_size").take == nh.row("mamba.heads").take == "global"
    assert nh.row("moe.noop").take == nh.row("mamba.noop").take == "none"
    for key in engines.TABLE.values():
        for row in key.rows.values():
            if row.source is not None:
                assert len(row.source.commit) == 40


HEX40 = re.compile(r"[0-9a-f]{40}")


def test_every_entry_read_in_full_cites_every_row():
    """All 40 (family, engine) entries were read: each says where (a full commit) and which
    class loads the family; one that serves the family and is not flagged as read in part
    has every row verified at a full commit (per-block precision, where not read, says
    so); one that does not serve it lists no type and no row."""
    assert len(engines.TABLE) == len(engines.FAMILIES) * len(engines.ENGINES) == 40
    partial = []
    for (fam, eng), ef in engines.TABLE.items():
        assert ef.source is not None and HEX40.fullmatch(ef.source.commit), (fam, eng)
        assert ef.note, (fam, eng)
        assert set(ef.types) <= set(engines.FAMILIES[fam]), (fam, eng)
        if not ef.serves:
            assert ef.types == () and ef.rows == {} and not ef.unread, (fam, eng)
            continue
        assert ef.types and ef.rows, (fam, eng)
        if ef.unread:
            partial.append((fam, eng))
        for axis, row in ef.rows.items():
            assert axis in engines.AXES, (fam, eng, axis)
            if axis == "precision" and not row.verified:
                assert row.source is None and "not read" in row.note, (fam, eng)
                continue
            assert row.verified and row.source is not None, (fam, eng, axis)
            assert HEX40.fullmatch(row.source.commit), (fam, eng, axis)
            assert row.source.path.endswith(".py") and row.note, (fam, eng, axis)
    assert partial == [("nemotron_h", "transformers")]
    assert sorted(k for k, ef in engines.TABLE.items() if not ef.serves) == [
        ("falcon_h1", "trtllm"), ("granitemoehybrid", "trtllm"), ("jamba", "sglang"),
        ("jamba", "trtllm")]
    # the subtleties the readers flagged
    deci = engines.entry("nemotron-nas", "sglang")
    assert "nemotron-nas" in deci.types
    assert deci.row("attention.kv_heads").take == "global"
    assert "get_total_num_kv_heads" in deci.row("attention.kv_heads").note
    assert deci.row("ffn.width").take == "per_layer" and deci.row("ffn.width").multiple == 256
    assert deci.row("ffn.noop").take == deci.row("attention.noop").take == "per_layer"
    assert engines.entry("qwen3_next", "sglang").row("deltanet.swap").take == "none"
    for e in ("vllm", "trtllm", "transformers"):
        assert engines.entry("qwen3_next", e).row("deltanet.swap").take == "per_layer", e
    for e in ("sglang", "trtllm"):  # the Qwen MoE classes build no dense layer
        assert engines.entry("qwen3_moe", e).row("ffn.width").take == "none", e
    assert "kimi_k2" not in engines.entry("deepseek_v3", "transformers").types
    assert engines.serving("kimi_k2") == ["vllm", "trtllm", "sglang"]


def test_a_granite_kind_change_is_a_swap_row():
    """Granite-4.0-H builds each layer by layer_types (Mamba or attention): block_axes
    files a Mamba block that becomes attention under deltanet.swap, which that row takes."""
    parent = load_config(EXAMPLES / "configs" / "granite-4.0-h-small.json")
    att = next(b for b in parent.blocks if b.kind == "attention")
    i = next(i for i, b in enumerate(parent.blocks) if b.kind == "mamba")
    assert engines.block_axes(parent.blocks[i], att) == {"deltanet.swap"}
    blocks = list(parent.blocks)
    blocks[i] = att
    child = parent.replace_blocks(blocks)
    for e in ("vllm", "sglang", "transformers"):
        assert engines.loads(parent, child, e) == (True, ""), e
    ok, why = engines.loads(parent, child, "trtllm")
    assert not ok and "trtllm has no class" in why


@pytest.mark.parametrize("family,config,engine", [
    ("jamba", "jamba-1.5-mini.json", "trtllm"), ("jamba", "jamba-1.5-mini.json", "sglang"),
    ("falcon_h1", "falcon-h1-7b.json", "trtllm"),
    ("granitemoehybrid", "granite-4.0-h-small.json", "trtllm")])
def test_an_engine_that_does_not_serve_the_family_is_refused(family, config, engine):
    parent = load_config(EXAMPLES / "configs" / config)
    assert engine not in engines.serving(parent.model_type)
    with pytest.raises(InputError) as e:
        engines.tied_axes(parent, [engine])
    msg = str(e.value)
    assert "\n" not in msg and "deploy.engines" in msg
    assert f"{engine} has no class for the parent's type" in msg
    assert f"does not serve the {family} family" in msg


def test_deploy_on_trtllm_refuses_a_jamba_parent():
    """A spec whose deploy.engines names an engine without a class for the parent's family
    stops before any pricing, in one line naming the engine, the family and who serves
    it."""
    spec = json.loads((EXAMPLES / "jamba-1.5-mini-h100.json").read_text())
    spec["parent"] = str(EXAMPLES / spec["parent"])
    spec["deploy"] = {"engines": ["vllm", "trtllm"]}
    problem = search.resolve(parse_spec(spec), ".")
    with pytest.raises(InputError) as e:
        search.alternatives(problem)
    msg = str(e.value)
    assert "\n" not in msg
    assert "trtllm has no class for the parent's type 'jamba'" in msg
    assert "does not serve the jamba family" in msg and "engines that do: vllm, transformers" in msg


def test_deepseek_child_for_sglang_keeps_mla_and_moe_global():
    """SGLang's DeepSeek-V3 reads every MLA and MoE shape from the model config: the child
    for deploy.engines ["sglang"] takes one MLA and one MoE shape (tied choices), where the
    free child of the same spec mixes them and loads in no engine."""
    def child(deploy):
        spec = json.loads((EXAMPLES / "deepseek-v3-8xh200.json").read_text())
        spec["parent"] = str(EXAMPLES / spec["parent"])
        spec["solver"].pop("sweep")
        spec["search_space"]["compare_homogeneous"] = False
        if deploy is not None:
            spec["deploy"] = {"engines": deploy}
        problem, _, _, cons, res, child = _solved(spec)
        assert res.status == "optimal", res
        return problem, cons, res, child

    problem, _, free, c = child(None)
    shapes = {k: {b for b in c.blocks if b.kind == k} for k in ("mla", "moe")}
    assert max(len(v) for v in shapes.values()) > 1  # the free child mixes them
    assert not engines.loads(problem.parent, c, "sglang")[0]
    problem, cons, res, c = child(["sglang"])
    assert {t.name.split(" ")[0] for t in cons.ties} >= {
        "mla.heads", "mla.kv_lora_rank", "mla.q_lora_rank", "moe.experts", "moe.top_k"}
    assert res.objective >= free.objective - 1e-9
    assert engines.loads(problem.parent, c, "sglang") == (True, "")
    for kind in ("mla", "moe", "ffn"):
        assert len({b for b in c.blocks if b.kind == kind}) == 1, kind


def test_docs_print_the_table_and_every_shipped_parent_loads_as_it_is():
    """docs/engines.md holds the table exactly as nas.engines has it; every shipped parent
    config loads in every engine of its family as it is (no global axis it varies)."""
    doc = (Path(__file__).resolve().parents[1] / "docs" / "engines.md").read_text()
    assert engines.markdown_table() in doc
    for cfg in sorted((EXAMPLES / "configs").glob("*.json")):
        parent = load_config(cfg)
        for e in engines.serving(parent.model_type):
            engines.tied_axes(parent, [e])  # raises when the parent breaks a global axis
            assert engines.loads(parent, parent, e) == (True, ""), (cfg.name, e)


def test_loads_names_the_axis_that_stops_an_engine():
    parent = load_config(SUPER)
    for e in engines.ENGINES:  # the parent (a stock nemotron_h) loads everywhere
        assert engines.loads(parent, parent, e) == (True, "")
    moe = [i for i, b in enumerate(parent.blocks) if b.kind == "moe"]
    mamba = [i for i, b in enumerate(parent.blocks) if b.kind == "mamba"]
    blocks = list(parent.blocks)
    blocks[moe[0]] = blocks[moe[0]].model_copy(update={"top_k": 4})
    per_layer_moe = parent.replace_blocks(blocks)
    assert engines.loads(parent, per_layer_moe, "vllm") == (True, "")
    assert engines.loads(parent, per_layer_moe, "trtllm") == (True, "")
    assert engines.loads(parent, per_layer_moe, "sglang") == (True, "")
    ok, why = engines.loads(parent, per_layer_moe, "transformers")
    assert not ok and "moe.top_k" in why and "global" in why
    blocks[mamba[0]] = blocks[mamba[0]].model_copy(update={"state_size": 64})
    ok, why = engines.loads(parent, parent.replace_blocks(blocks), "vllm")
    assert not ok and "mamba.state_size takes 2 values" in why
    blocks = list(parent.blocks)
    blocks[moe[1]] = NoOp()
    ok, why = engines.loads(parent, parent.replace_blocks(blocks), "trtllm")
    assert not ok and f"block {moe[1]} varies moe.noop" in why


def test_deploy_engines_is_checked():
    spec = json.loads((EXAMPLES / "nemotron3-super-h100.json").read_text())
    spec["parent"] = str(SUPER)
    for bad, msg in ((["vllm", "vllm"], "twice"), (["tgi"], "vllm"), ([], "at least 1")):
        with pytest.raises(InputError, match=msg) as e:
            parse_spec({**spec, "deploy": {"engines": bad}})
        assert "deploy.engines" in str(e.value)
    # an engine with no class for the parent's own type: one line naming the field
    puzzle = load_config(SUPER).model_copy(update={"model_type": "nemotron_h_puzzle"})
    assert "transformers" not in engines.serving("nemotron_h_puzzle")
    with pytest.raises(InputError, match="transformers has no class for the parent's type"):
        engines.tied_axes(puzzle, ["transformers"])


def _super(deploy: list[str] | None, throughput: str = "180%"):
    spec = json.loads((EXAMPLES / "nemotron3-super-h100.json").read_text())
    spec["parent"] = str(SUPER)
    spec["solver"].pop("sweep")
    spec["search_space"]["compare_homogeneous"] = False
    spec["search_space"]["mamba"]["noop"] = True
    spec["search_space"]["moe"]["noop"] = True
    spec["budgets"][1]["min"] = throughput
    if deploy is not None:
        spec["deploy"] = {"engines": deploy}
    return _solved(spec)


def _solved(spec: dict):
    """The search's steps on ``spec`` (its priors for quality): the problem, its
    alternatives, library and constraints, the first result and its child."""
    problem = search.resolve(parse_spec(spec), ".")
    alts = search.alternatives(problem)
    priced = search.price(problem, alts, progress=False)
    q, _ = search.score(problem, alts)
    lib = search.build_library(problem, alts, priced, q)
    cons = search.constraints(problem, lib, priced)
    res = search.solve(problem, lib, cons)[0]
    return problem, alts, lib, cons, res, search.child_arch(problem, lib, res.chosen, alts)


def test_super_child_for_vllm_varies_only_what_vllm_varies():
    """Done-when of issue 29 B: on the Super example, the child found for
    ``deploy.engines: ["vllm"]`` keeps one Mamba shape and one attention shape for every
    block of the kind and no no-op; only MoE expert count / width / top-k vary per layer.
    Without ``deploy`` the same spec's child is one vLLM cannot load, and the tied optimum
    is the best of one solve per (state size, KV heads) value pair."""
    problem, alts, lib, cons, res, child = _super(None)
    assert not engines.loads(problem.parent, child, "vllm")[0]
    assert puzzle_schema_problems(to_hf(child))  # the export says so too (a no-op block)
    free = res.objective
    problem, alts, lib, cons, res, child = _super(["vllm"])
    assert res.status == "optimal" and res.objective >= free - 1e-12
    assert engines.loads(problem.parent, child, "vllm") == (True, "")
    cfg = to_hf(child)  # written in NVIDIA's nemotron_h_puzzle schema, as vLLM reads it
    assert cfg["model_type"] == "nemotron_h_puzzle" and puzzle_schema_problems(cfg) == []
    parent = problem.parent
    for kind in ("mamba", "attention"):
        assert len({b for b in child.blocks if b.kind == kind}) == 1, kind
    assert not any(isinstance(b, NoOp) for b in child.blocks)
    for p, c in zip(parent.blocks, child.blocks):
        assert engines.block_axes(p, c) <= {"moe.experts", "moe.expert_width", "moe.top_k",
                                            "moe.shared_width", "attention.kv_heads",
                                            "mamba.state_size", "mamba.heads"}
    moe = {b for b in child.blocks if b.kind == "moe"}
    assert len(moe) > 1  # per layer, as vLLM takes it
    notes = " | ".join(cons.engine_notes)
    assert "vllm does not take moe.noop: dropped 40 alternatives" in notes
    assert "vllm does not take mamba.noop: dropped 40 alternatives" in notes
    assert {t.name.split(" ")[0] for t in cons.ties} == {"mamba.state_size",
                                                        "attention.kv_heads"}
    # exact: the best of one solve per pair of tied values (the others forbidden)
    best = None
    groups = [t.groups for t in cons.ties]
    for pick in itertools.product(*[range(len(g)) for g in groups]):
        forbid = [r for g, k in zip(groups, pick) for j, grp in enumerate(g) if j != k
                  for r in grp]
        r = solve(cons.extend(lib), cons.objective, cons.budgets, forbid=forbid,
                  options=SolveOptions(mip_rel_gap=problem.spec.solver.gap))
        if r.ok:
            best = r.objective if best is None else min(best, r.objective)
    gap = problem.spec.solver.gap
    assert best is not None and abs(res.objective - best) <= 2 * gap * abs(best)


def test_several_engines_intersect_and_the_report_says_who_loads(tmp_path):
    """vllm + transformers: stock transformers holds the MoE global (unverified, read
    conservatively), so the child's MoE blocks are one shape too; the blueprint and the CLI
    summary name each engine and why not."""
    problem, alts, lib, cons, res, child = _super(["vllm", "transformers"], "150%")
    assert len({b for b in child.blocks if b.kind == "moe"}) == 1
    assert all(engines.loads(problem.parent, child, e)[0] for e in ("vllm", "transformers"))
    spec = json.loads((EXAMPLES / "nemotron3-super-h100.json").read_text())
    spec["parent"] = str(SUPER)
    spec["solver"].pop("sweep")
    spec["search_space"]["compare_homogeneous"] = False
    spec["deploy"] = {"engines": ["vllm"]}
    f = tmp_path / "spec.json"
    f.write_text(json.dumps(spec))
    out = tmp_path / "out"
    p = subprocess.run([sys.executable, "-m", "nas", "search", str(f), "-o", str(out)],
                       capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    assert "engine vllm (target): loads" in p.stdout
    assert re.search(r"engine transformers: does not load: moe\.\w+ takes \d+ values",
                     p.stdout)
    bp = json.loads((out / "blueprint.json").read_text())
    assert bp["engines"]["targets"] == ["vllm"]
    assert {r["engine"]: r["loads"] for r in bp["engines"]["load"]}["vllm"] is True
    assert "## Engines" in (out / "report.md").read_text()


def test_llama_for_vllm_keeps_no_ops_and_drops_linear():
    """DeciLM in vLLM: KV heads, FFN width (multiples of 256, as ffn_mult writes them) and
    no-ops per layer, no linear blocks; TensorRT-LLM's DeciLM takes linear blocks too, so
    vllm + trtllm is vLLM's space; with SGLang (its DeciLM: no-ops and FFN widths per layer,
    but one KV head count, which its ModelConfig requires) the space is the intersection."""
    spec = {"name": "t", "parent": str(LLAMA), "hardware": "h100-sxm", "precision": "fp8",
            "workloads": {"chat": {"isl": 128, "osl": 512, "batch": 64}},
            "search_space": {"attention": {"kv_heads": [4, 2], "noop": True, "linear": True},
                             "ffn": {"fractions": [0.5], "widths": [7000], "noop": True}},
            "deploy": {"engines": ["vllm"]}}
    for eng in (["vllm"], ["vllm", "trtllm"]):
        spec["deploy"] = {"engines": eng}
        problem = search.resolve(parse_spec(spec), ".")
        alts = search.alternatives(problem)
        kinds = {a.child.kind for row in alts for a in row}
        assert "noop" in kinds and "linear" not in kinds
        widths = {a.child.width for row in alts for a in row if a.child.kind == "ffn"}
        assert widths == {14336, 7168}  # 7000 is no ffn_mult width
        assert not engines.tied_axes(problem.parent, eng)
        assert any("ffn.width=7000" in n for n in search.deploy_notes(problem))
    spec["deploy"] = {"engines": ["vllm", "sglang"]}
    problem = search.resolve(parse_spec(spec), ".")
    alts = search.alternatives(problem)
    assert {a.child.kind for row in alts for a in row} == {"attention", "ffn", "noop"}
    assert {a.child.width for row in alts for a in row if a.child.kind == "ffn"} == {
        14336, 7168}
    assert set(engines.tied_axes(problem.parent, ["vllm", "sglang"])) == {
        "attention.kv_heads"}  # SGLang's ModelConfig: one KV head count (no VGQA)


def test_homogeneous_baseline_keeps_the_ties():
    """The homogeneous enumeration (one choice per group of alike blocks) keeps a tie that
    spans two groups: A and B blocks take the same variant index (or a no-op); the best
    of the 36 group pairs by hand equals it."""
    lib = typed_library(8, seed=0, groups=1, spans=False)
    lib = BlockLibrary(lib.num_blocks, lib.start, lib.end, lib.costs, lib.scores,
                       labels=lib.labels, tags=lib.tags, constants=lib.constants,
                       block_names=[f"{b}:{'AB'[b % 2]}" for b in range(lib.num_blocks)])
    groups: dict[str, list[int]] = {}
    for r, lab in enumerate(lib.labels):
        var = lab.split(" ")[1]
        if var != "no_op":
            groups.setdefault(var, []).append(r)
    names = sorted(groups)
    tie = Tie("variant", tuple(tuple(groups[n]) for n in names), tuple(names))
    tot = lib.totals([int(np.flatnonzero(lib.start == b)[0]) for b in range(lib.num_blocks)])
    budget = Budget("mem", None, 0.6 * tot["mem"])
    cons = search.Constraints(Objective({"kl": 1.0}), [budget], [], ties=[tie])
    res = search.homogeneous_solve(lib, cons)
    best = None
    for a, b in itertools.product(range(6), range(6)):  # variant of the A and the B blocks
        if a < 5 and b < 5 and a != b:
            continue
        chosen = [int(np.flatnonzero(lib.start == blk)[a if blk % 2 == 0 else b])
                  for blk in range(lib.num_blocks)]
        t = lib.totals(chosen)
        if t["mem"] <= budget.hi and (best is None or t["kl"] < best):
            best = t["kl"]
    assert res.status == "optimal" and res.objective == pytest.approx(best, rel=1e-12)
    assert len(tie.broken_by(res.chosen.tolist(), lib.num_replacements)) <= 1
    free = search.homogeneous_solve(lib, search.Constraints(Objective({"kl": 1.0}), [budget],
                                                             []))
    assert free.objective < res.objective  # the tie binds here


def test_qwen3_next_for_vllm_swaps_layers_and_ties_every_shape():
    """vLLM's Qwen3-Next reads a layer type per layer (layer_types) and every shape once:
    the child for vllm may swap attention <-> DeltaNet per layer, and takes one DeltaNet,
    one attention and one MoE shape."""
    spec = json.loads((EXAMPLES / "qwen3-next-80b-h100.json").read_text())
    spec["parent"] = str(EXAMPLES / spec["parent"])
    spec["solver"].pop("sweep")
    spec["search_space"]["compare_homogeneous"] = False
    spec["deploy"] = {"engines": ["vllm"]}
    problem = search.resolve(parse_spec(spec), ".")
    alts = search.alternatives(problem)
    assert any(a.label.startswith("swap:") for row in alts for a in row)
    priced = search.price(problem, alts, progress=False)
    q, _ = search.score(problem, alts)
    lib = search.build_library(problem, alts, priced, q)
    cons = search.constraints(problem, lib, priced)
    assert {t.name.split(" ")[0] for t in cons.ties} >= {"moe.experts", "moe.top_k"}
    res = search.solve(problem, lib, cons)[0]
    child = search.child_arch(problem, lib, res.chosen, alts)
    assert engines.loads(problem.parent, child, "vllm") == (True, "")
    for kind in ("deltanet", "attention", "moe"):
        assert len({b for b in child.blocks if b.kind == kind}) <= 1, kind
