"""Alternatives per block: parent first, deduplicated, constrained, range-restricted."""

from __future__ import annotations

from conftest import SUPER

from nas.arch import FFN, Attention, Linear, Mamba, ModelArch, MoE, NoOp
from nas.hf import load_config
from nas.space import alternatives
from nas.space.quality import structural_prior
from nas.spec import SearchSpace

ATT = Attention(num_heads=8, num_kv_heads=4, head_dim=16)
ARCH = ModelArch(hidden_size=128, vocab_size=100,
                 blocks=(ATT, FFN(width=512), ATT, FFN(width=512)))


def test_parent_first_deduplicated_and_labelled():
    space = SearchSpace.model_validate({
        "attention": {"kv_heads": [4, 2, 2, 3], "noop": True, "linear": True},
        "ffn": {"widths": [512, 256], "fractions": [0.5], "noop": True}})
    alts = alternatives(ARCH, space)
    att = [a.child for a in alts[0]]
    assert att[0] == ATT and alts[0][0].label == "parent" and alts[0][0].is_parent
    # 3 does not divide 8 heads: skipped; duplicates collapse
    assert [b.num_kv_heads for b in att if isinstance(b, Attention)] == [4, 2]
    assert isinstance(att[-2], Linear) and isinstance(att[-1], NoOp)
    assert len(att) == len(set(att))
    ffn = [a.child for a in alts[1]]
    assert [f.width for f in ffn if isinstance(f, FFN)] == [512, 256]  # 0.5 * 512 = 256 too
    labels = [a.label for a in alts[0]]
    assert labels == ["parent", "num_kv_heads=2", "linear", "noop"]


def test_block_ranges_restrict_alternatives():
    space = SearchSpace.model_validate({"ffn": {"widths": [256], "blocks": [[2, 4]]}})
    alts = alternatives(ARCH, space)
    assert len(alts[1]) == 1 and len(alts[3]) == 2


def test_moe_and_mamba_axes_never_grow_the_block():
    a = load_config(SUPER)
    space = SearchSpace.model_validate({
        "moe": {"experts": [512, 256, 1024], "expert_widths": [4096, 1344], "top_k": [22, 8, 30],
                "shared_widths": [0]},
        "mamba": {"state_sizes": [256, 64], "heads": [128, 100, 64]}})
    alts = alternatives(a, space)
    moe = [x.child for x in alts[1]]
    assert all(isinstance(m, MoE) and m.num_experts <= 512 and m.expert_width <= 2688
               and m.top_k <= 22 and m.top_k <= m.num_experts for m in moe)
    assert len(moe) == 2 * 2 * 2 * 2  # experts x widths x top-k x shared, parent included
    mam = [x.child for x in alts[0]]
    # 100 heads is not a multiple of 8 groups; state 256 and heads > 128 would grow it
    assert {(m.num_heads, m.state_size) for m in mam if isinstance(m, Mamba)} == \
        {(128, 128), (128, 64), (64, 128), (64, 64)}


def test_prior_is_zero_for_parent_and_orders_damage():
    space = SearchSpace.model_validate({"ffn": {"fractions": [0.75, 0.5, 0.25], "noop": True}})
    alts = alternatives(ARCH, space)
    prior = structural_prior(list(ARCH.blocks), alts)
    per_block = [len(b) for b in alts]
    ffn_scores = prior[per_block[0]:per_block[0] + per_block[1]]
    assert ffn_scores[0] == 0.0
    assert list(ffn_scores) == sorted(ffn_scores)  # narrower -> more damage, no-op worst
