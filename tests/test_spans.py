"""Multi-block (span) replacements: spec, pricing, the child, export and build (nas.space.spans)."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import numpy as np
import pytest

from costmodels.blocks import price_blocks
from costmodels.dtypes import get_recipe
from hwprofiles.errors import InputError
from nas import search
from nas.arch import Mamba, MoE, NoOp, blocks_table
from nas.hf import from_hf, to_hf
from nas.search.blueprint import predict
from nas.search.quant_config import block_formats, quantization_config
from nas.space import spans
from nas.spec import parse_spec

EXAMPLES = Path(__file__).resolve().parents[1] / "nas" / "examples"

SUPER_SPANS = [
    {"kinds": ["mamba", "moe"], "replace_with": [{"noop": True}, {"block": {"kind": "moe"}}]},
    {"kinds": ["attention", "moe"], "replace_with": [{"block": {"kind": "moe"}}]},
    {"kinds": ["mamba", "moe", "mamba"], "replace_with": [
        {"blocks": [{"kind": "mamba", "fields": {"num_heads": 256}}, {"kind": "moe"}]}]},
    {"length": 3, "stride": 3, "blocks": [[0, 30]], "replace_with": [{"drop_one": True}]},
]


def super_spec(spans_: list | None = None, precision: dict | None = None) -> dict:
    data = json.loads((EXAMPLES / "nemotron3-super-h100.json").read_text())
    data["parent"] = str(EXAMPLES / data["parent"])
    data["solver"].pop("sweep")
    data["search_space"]["compare_homogeneous"] = False
    if spans_ is not None:
        data["search_space"]["spans"] = spans_
    if precision is not None:
        data["search_space"]["precision"] = precision
    return data


def prepare(spec: dict):
    problem = search.resolve(parse_spec(spec), EXAMPLES)
    alts = search.alternatives(problem)
    priced = search.price(problem, alts, progress=False)
    q, _ = search.score(problem, alts)
    lib = search.build_library(problem, alts, priced, q)
    return problem, alts, priced, lib, search.constraints(problem, lib, priced)


@pytest.fixture(scope="module")
def super_wide():
    return prepare(super_spec(SUPER_SPANS, {"moe": ["fp8"], "mamba": ["bf16"]}))


def test_span_alternatives_follow_the_rules(super_wide):
    problem, alts, _, lib, _ = super_wide
    pa = problem.parent
    flat = [a for row in alts for a in row]
    spans_ = [a for a in flat if a.end is not None]
    assert spans_
    for a in spans_:
        kinds = [b.kind for b in pa.blocks[a.block:a.end]]
        assert 2 <= a.end - a.block <= 3
        assert len(a.blocks) < a.end - a.block
        if a.label == "span2:noop":
            assert kinds == ["mamba", "moe"] and a.blocks == ()
        if a.label.startswith("span3:drop"):
            assert a.end <= 30 and a.block % 3 == 0
            j = int(a.label[-1])
            assert a.blocks == tuple(b for m, b in enumerate(pa.blocks[a.block:a.end]) if m != j)
        if kinds == ["mamba", "moe", "mamba"] and len(a.blocks) == 2 \
                and isinstance(a.blocks[0], Mamba) and a.blocks[0].num_heads == 256:
            assert a.blocks[1] == pa.blocks[a.block + 1]
    # the library carries the spans as edges start -> end, with their child lists
    r = [i for i, a in enumerate(flat) if a.end is not None]
    assert (lib.end[r] - lib.start[r] >= 2).all()
    assert lib.children[r[0]] == [c.model_dump() for c in flat[r[0]].blocks]
    assert "span" in lib.tags[r[0]]
    # labels are unique within a start block (score files key on them)
    for row in alts:
        labels = [a.label for a in row]
        assert len(labels) == len(set(labels))


def test_span_priced_as_the_sum_of_its_blocks(super_wide):
    """Every span alternative's costs equal price_blocks of its child blocks, summed; a
    removed span costs exactly 0 (no norm, no all-reduce)."""
    problem, alts, priced, lib, _ = super_wide
    flat = [a for row in alts for a in row]
    wl = list(problem.workloads.values())
    h = problem.parent.hidden_size
    checked = 0
    for k, a in enumerate(flat):
        if a.end is None:
            continue
        if not a.blocks:
            for key in lib.costs:
                assert lib.costs[key][k] == 0.0
            continue
        ref = price_blocks(blocks_table(list(a.blocks), h), problem.hw,
                           spans.recipe_of(a, problem.recipe), wl, tp=problem.tp, ep=problem.ep)
        for j, w in enumerate(wl):
            for key, col in (("runtime_s", ref.runtime_s), ("tpot_s", ref.decode_s),
                             ("ttft_s", ref.prefill_s), ("memory_bytes", ref.memory_bytes)):
                assert lib.costs[f"{key}@{w.name}"][k] == pytest.approx(
                    col[:, j].sum(), rel=1e-12)
        assert lib.costs["weight_bytes"][k] == pytest.approx(ref.weight_bytes.sum(), rel=1e-12)
        checked += 1
    assert checked >= 10


def test_child_with_spans_repriced_equals_library_totals(super_wide):
    """Solve with spans forced in: the child's library totals equal the child architecture
    re-priced whole (blocks + the non-block term), so spans are exact end to end."""
    problem, alts, _, lib, cons = super_wide
    from nas import mip

    flat = [a for row in alts for a in row]
    pin: list[int] = []
    used: set[int] = set()
    for want, n in (("span2:noop", 2), ("span3:", 2), ("precision=fp8", 3)):
        for k, a in enumerate(flat):
            cover = set(range(a.block, a.stop))
            if n and a.label.startswith(want) and not cover & used:
                pin.append(k)
                used |= cover
                n -= 1
    lib2 = cons.extend(lib)
    res = mip.solve(lib2, cons.objective, [], counts=cons.counts, pin=pin,
                    options=mip.SolveOptions(time_limit=30, mip_rel_gap=1e-3))
    assert res.ok
    child = search.child_arch(problem, lib2, res.chosen, alts)
    _, recipes, _ = spans.child_blocks(problem.parent, [flat[r] for r in res.chosen],
                                       problem.recipe)
    assert child.num_blocks < problem.parent.num_blocks
    pred = predict(child, problem, recipes)
    for w in problem.workloads:
        assert res.totals[f"tpot_s@{w}"] == pytest.approx(pred[w]["tpot_s"], rel=1e-9)
        assert res.totals[f"ttft_s@{w}"] == pytest.approx(pred[w]["ttft_s"], rel=1e-9)
    assert res.totals["params"] == pytest.approx(child.param_counts().total, rel=1e-12)


def test_child_with_spans_exports_and_reimports(super_wide):
    problem, alts, _, lib, cons = super_wide
    # a path: a noop span, a merged Mamba+MoE span, an fp8 MoE; the parent elsewhere
    chosen, pos = [], 0
    want = {"span2:noop", "precision=fp8"}
    while pos < problem.parent.num_blocks:
        row = alts[pos]
        pick = next((a for a in row if a.label in want or (
            a.end is not None and len(a.blocks) == 2 and a.end - a.block == 3)), row[0])
        want.discard(pick.label)
        chosen.append(pick)
        pos = pick.stop
    blocks, recipes, origin = spans.child_blocks(problem.parent, chosen, problem.recipe)
    child = problem.parent.replace_blocks(blocks)
    assert child.num_blocks < problem.parent.num_blocks
    cfg = to_hf(child)
    assert cfg["model_type"] == "nemotron_h_puzzle"
    assert len(cfg["block_configs"]) == child.num_blocks
    cfg["quantization_config"] = quantization_config(child, recipes, cfg["model_type"])
    back = from_hf(json.loads(json.dumps(cfg)))
    assert back.blocks == child.blocks
    assert back.param_counts() == child.param_counts()
    assert to_hf(back)["quantization_config"] == cfg["quantization_config"]
    # the precision per block reads back: routed experts of the fp8 MoE in FP8, the
    # others in NVFP4 (nvfp4-super), Mamba projections FP8
    fmts = block_formats(back, back.hf_extra["quantization_config"], "nemotron_h_puzzle")
    for b, r, f in zip(back.blocks, recipes, fmts):
        if isinstance(b, MoE):
            assert f["routed_experts"] == ("fp8" if r == "fp8" else "nvfp4")
        if isinstance(b, Mamba):
            assert f["mamba"] == "fp8"


def test_paired_parent_keeps_depth_with_noop_pairs():
    """A Llama parent: a span [attention, FFN] removed keeps the layer as a DeciLM no-op
    pair; the child exports as nemotron-nas and reimports with identical counts."""
    spec = json.loads((EXAMPLES / "llama3.1-8b-h100.json").read_text())
    spec["parent"] = str(EXAMPLES / spec["parent"])
    spec["solver"].pop("sweep")
    spec["search_space"]["compare_homogeneous"] = False
    spec["search_space"]["spans"] = [
        {"kinds": ["attention", "ffn"], "stride": 2, "replace_with": [
            {"noop": True}, {"block": {"kind": "ffn", "fields": {"width": 7168}}}]}]
    problem, alts, _, lib, _ = prepare(spec)
    flat = [a for row in alts for a in row]
    pick = {4: "span2:noop", 10: next(a.label for a in alts[10] if a.label.startswith(
        "span2:ffn"))}
    chosen, pos = [], 0
    while pos < problem.parent.num_blocks:
        a = next((a for a in alts[pos] if a.label == pick.get(pos)), alts[pos][0])
        chosen.append(a)
        pos = a.stop
    k = [flat.index(a) for a in chosen]
    child = search.child_arch(problem, lib, np.asarray(k), alts)
    assert child.num_blocks == problem.parent.num_blocks
    assert isinstance(child.blocks[4], NoOp) and isinstance(child.blocks[5], NoOp)
    assert isinstance(child.blocks[10], NoOp)
    assert child.blocks[11] == problem.parent.blocks[11].model_copy(update={"width": 7168})
    cfg = to_hf(child)
    assert cfg["model_type"] == "nemotron-nas"
    assert cfg["block_configs"][2] == {
        "attention": {"no_op": True, "replace_with_linear": False, "n_heads_in_group": None},
        "ffn": {"no_op": True, "replace_with_linear": False, "ffn_mult": None}}
    back = from_hf(cfg)
    assert back.param_counts() == child.param_counts()
    assert lib.totals(k)["params"] == pytest.approx(child.param_counts().total, rel=1e-12)


def test_builder_counts_match_a_child_with_spans(super_wide):
    torch = pytest.importorskip("torch")
    from nas.child import build_model

    problem, alts, _, _, _ = super_wide
    small = problem.parent.model_copy(update={"hidden_size": 64, "vocab_size": 128})
    blocks = [Mamba(num_heads=4, head_dim=8, state_size=8, n_groups=2),
              MoE(num_experts=4, top_k=2, expert_width=16, shared_width=16, gated=False,
                  activation="relu2"),
              Mamba(num_heads=4, head_dim=8, state_size=8, n_groups=2)]
    small = small.replace_blocks(blocks)
    a = spans.span_alternatives(small, parse_spec(super_spec([
        {"kinds": ["mamba", "moe", "mamba"], "replace_with": [
            {"blocks": [{"kind": "mamba", "fields": {"num_heads": 8}}, {"kind": "moe"}]}]}
    ])).search_space.spans)[0][0]
    kids, _, _ = spans.child_blocks(small, [a], get_recipe("bf16"))
    child = small.replace_blocks(kids)
    model = build_model(child, seed=0)
    n = sum(p.numel() for p in model.parameters())
    assert n == child.param_counts().total
    x = torch.randint(0, 128, (1, 8))
    assert model(x).shape[-1] == 128


@pytest.mark.parametrize("rule,field", [
    ({"length": 2, "replace_with": [{"noop": True, "drop_one": True}]}, "replace_with"),
    ({"replace_with": [{"noop": True}]}, "spans"),
    ({"length": 4, "replace_with": [{"noop": True}]}, "length"),
    ({"kinds": ["mamba", "moe"], "length": 3, "replace_with": [{"noop": True}]}, "spans"),
    ({"length": 2, "replace_with": [{"blocks": [{"kind": "moe"}, {"kind": "moe"}]}]},
     "spans"),
])
def test_bad_span_rules_name_the_field(rule, field):
    with pytest.raises(InputError) as e:
        parse_spec(super_spec([rule]))
    assert "search_space.spans[0]" in str(e.value) and field in str(e.value)


def test_span_block_field_errors():
    spec = super_spec([{"kinds": ["mamba", "moe"], "replace_with": [
        {"block": {"kind": "moe", "fields": {"widthh": 3}}}]}])
    with pytest.raises(InputError, match=r"'widthh' is not a field of a moe block"):
        prepare(spec)
    spec = super_spec([{"kinds": ["mamba", "moe"], "replace_with": [
        {"block": {"kind": "attention"}}]}])
    with pytest.raises(InputError, match="needs a attention parent block"):
        prepare(spec)


def test_span_rule_matching_nothing_is_an_error():
    spec = super_spec([{"kinds": ["attention", "attention"], "replace_with": [{"noop": True}]}])
    with pytest.raises(InputError, match=r"no span of the parent matches") as e:
        prepare(spec)
    assert "search_space.spans[0]" in str(e.value)


def test_wide_space_is_off_by_default():
    """No spans and no precision: the alternatives are exactly nas.space's."""
    spec = super_spec()
    problem = search.resolve(parse_spec(spec), EXAMPLES)
    from nas import space

    a = search.alternatives(problem)
    b = space.alternatives(problem.parent, problem.spec.search_space)
    assert a == b and not spans.is_wide(a)


def test_spans_never_make_the_search_worse():
    """Spans only add edges: the best child with them is no worse (the parent-path child of
    the narrower space is a warm start the wider MIP must accept)."""
    from nas import mip

    rules = [SUPER_SPANS[0], SUPER_SPANS[1]]
    narrow = prepare(super_spec())
    wide = prepare(super_spec(copy.deepcopy(rules)))
    opts = mip.SolveOptions(time_limit=60, mip_rel_gap=1e-4)
    pn, an, _, ln, cn = narrow
    pw, aw, _, lw, cw = wide
    rn = mip.solve(cn.extend(ln), cn.objective, cn.budgets, counts=cn.counts, options=opts)
    # the same child in the wide library: same labels at the same blocks
    fw = [a for row in aw for a in row]
    fn = [a for row in an for a in row]
    idx = {(a.block, a.stop, a.label): k for k, a in enumerate(fw)}
    warm = [idx[(fn[r].block, fn[r].stop, fn[r].label)] for r in rn.chosen]
    rw = mip.solve(cw.extend(lw), cw.objective, cw.budgets, counts=cw.counts, options=opts,
                   warm_start=warm)
    assert rw.ok and rn.ok
    assert rw.totals["quality"] <= rn.totals["quality"] + 1e-9


def _noop_and_drop1_child(small):
    """``small`` with its span 2 replaced by a no-op and its span 3 by one block fewer: the
    shorter child and its ``stand_in`` positions (the parent block each child block is)."""
    rules = parse_spec(super_spec([
        {"kinds": ["mamba", "moe"], "replace_with": [{"noop": True}]},
        {"kinds": ["attention", "moe", "mamba"], "replace_with": [{"drop_one": True}]},
    ])).search_space.spans
    alts = spans.span_alternatives(small, rules)
    chosen = [next(a for a in alts[0] if a.label == "span2:noop"),
              next(a for a in alts[2] if a.label == "span3:drop1")]
    kids, _, origin = spans.child_blocks(small, chosen, get_recipe("bf16"))
    return small.replace_blocks(kids), spans.stand_in(small, kids, origin)


def test_init_from_parent_for_a_shorter_child():
    """A child with a removed span and a merged span, built from a (random) parent: each
    kept block is its parent block's tensors, the child computes what the parent-depth
    layout with no-ops computes, and the stored parameters are the architecture's."""
    torch = pytest.importorskip("torch")
    from nas.child import build_model
    from nas.child.spans import expanded, init_from_parent_spans

    small = ModelArch_small()
    parent = build_model(small, seed=0)
    child, pos = _noop_and_drop1_child(small)
    assert pos == [2, 4] and child.num_blocks == 2
    tokens = torch.randint(0, 128, (2, 16), generator=torch.Generator().manual_seed(0))
    model = init_from_parent_spans(child, pos, parent, tokens)
    assert model.num_stored() == child.param_counts().total
    for k, j in enumerate(pos):
        for (n, a), (_, b) in zip(model.blocks[k].state_dict().items(),
                                  parent.blocks[j].state_dict().items()):
            assert torch.equal(a, b), n
    ref = build_model(expanded(child, small, pos), seed=0)
    ref.load_state_dict({k: v for k, v in ref.state_dict().items()} | {
        f"blocks.{j}.{n}": v for k, j in enumerate(pos)
        for n, v in model.blocks[k].state_dict().items()} | {
        n: v for n, v in model.state_dict().items() if not n.startswith("blocks.")})
    x = torch.randint(0, 128, (1, 12))
    torch.testing.assert_close(model(x), ref(x), rtol=0, atol=0)


def ModelArch_small():  # noqa: N802
    from nas.arch import Attention, ModelArch

    return ModelArch(hidden_size=32, vocab_size=128, blocks=(
        Mamba(num_heads=4, head_dim=8, state_size=8, n_groups=2),
        MoE(num_experts=4, top_k=2, expert_width=16, shared_width=16),
        Attention(num_heads=4, num_kv_heads=2, head_dim=8),
        MoE(num_experts=4, top_k=2, expert_width=16, shared_width=16),
        Mamba(num_heads=4, head_dim=8, state_size=8, n_groups=2)))


@pytest.mark.parametrize("adp", [False, True])
def test_spans_under_tensor_parallelism_sum_their_blocks(adp):
    """8 GPUs (tp 8, ep 8, with and without attention data parallelism): a span's times
    are its child blocks' with their own all-reduces (or all-to-alls), and a removed span
    costs 0."""
    spec = super_spec([SUPER_SPANS[0], SUPER_SPANS[1]], {"moe": ["fp8"]})
    spec["hardware"] = {"profile": "b200", "tp": 8, "ep": 8, "attention_dp": adp}
    problem = search.resolve(parse_spec(spec), EXAMPLES)
    alts = search.alternatives(problem)
    priced = search.price(problem, alts, progress=False)
    flat = [a for row in alts for a in row]
    wl = list(problem.workloads.values())
    for k, a in enumerate(flat):
        if a.end is None:
            continue
        if not a.blocks:
            assert (priced.rows.runtime_s[k] == 0).all()
            continue
        ref = price_blocks(blocks_table(list(a.blocks), problem.parent.hidden_size),
                           problem.hw, spans.recipe_of(a, problem.recipe), wl, tp=8, ep=8,
                           attention_dp=adp)
        np.testing.assert_allclose(priced.rows.runtime_s[k], ref.runtime_s.sum(0), rtol=1e-12)
        np.testing.assert_allclose(priced.rows.memory_bytes[k], ref.memory_bytes.sum(0),
                                   rtol=1e-12)


def test_spans_leave_the_single_block_prior_unchanged():
    """Spans alone add edges; every one-block alternative keeps its structural prior, so
    a narrow and a wide search compare on one scale."""
    from nas.space import quality

    problem = search.resolve(parse_spec(super_spec([SUPER_SPANS[0]])), EXAMPLES)
    alts = search.alternatives(problem)
    wide, _ = search.score(problem, alts)
    narrow_alts = [[a for a in row if a.end is None] for row in alts]
    ref = quality.structural_prior(list(problem.parent.blocks), narrow_alts)
    flat = [a for row in alts for a in row]
    np.testing.assert_array_equal(wide[[k for k, a in enumerate(flat) if a.end is None]], ref)
    noop = [wide[k] for k, a in enumerate(flat) if a.label == "span2:noop"]
    assert noop and all(v >= 2.0 for v in noop)  # two blocks removed: two no-ops at least


def test_cli_build_initializes_a_span_child_from_its_stand_in_blocks(tmp_path, capsys):
    """``puzzle-nas build BLUEPRINT --parent --calib`` on a blueprint with spans: the shorter
    child is built from the parent blocks its ``stand_in`` names, saved, and reloads with the
    architecture's exact parameter count; a malformed stand_in is one line, exit 2."""
    torch = pytest.importorskip("torch")
    from nas.child import build_model, load_pretrained, save_pretrained
    from nas.cli import main

    small = ModelArch_small()
    parent_dir = save_pretrained(build_model(small, seed=0), tmp_path / "parent")
    child, pos = _noop_and_drop1_child(small)
    bp = tmp_path / "blueprint.json"
    bp.write_text(json.dumps({"child": to_hf(child), "stand_in": pos}))
    calib = tmp_path / "calib.json"
    calib.write_text(json.dumps([i % 128 for i in range(256)]))
    rc = main(["build", str(bp), "--parent", str(parent_dir), "--calib", str(calib),
               "-o", str(tmp_path / "child"), "--calib-len", "32", "--json"])
    assert rc == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["num_blocks"] == 2
    assert summary["parameters"] == child.param_counts().total
    model, parent = load_pretrained(tmp_path / "child"), load_pretrained(parent_dir)
    assert model.arch.blocks == child.blocks
    for k, j in enumerate(pos):
        for a, b in zip(model.blocks[k].parameters(), parent.blocks[j].parameters()):
            assert torch.equal(a, b)
    bp.write_text(json.dumps({"child": to_hf(child), "stand_in": [0]}))
    rc = main(["build", str(bp), "--parent", str(parent_dir), "--calib", str(calib),
               "-o", str(tmp_path / "child2")])
    err = capsys.readouterr().err
    assert rc == 2 and "stand_in" in err and err.count("\n") == 1
    assert not (tmp_path / "child2").exists()
