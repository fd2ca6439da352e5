"""Qwen3-Next (``qwen3_next``): Gated DeltaNet / gated attention hybrid with high-sparsity MoE.

Published figures (model card, https://huggingface.co/Qwen/Qwen3-Next-80B-A3B-Instruct:
"Number of Parameters: 80B in total and 3B activated; Number of Parameters
(Non-Embedding): 79B"; the Qwen blog https://qwen.ai/blog?id=4074cca80393150c248e508aa62983f9cb7d27cd
"80B total parameters, only 3B active"). Computed here from the Hub config
(``tests/data/configs/qwen3-next-80b-a3b-instruct.json``, MTP not counted):

* total 79,674,391,296 = 80B rounded; without the input embedding and LM head
  (2 x 151,936 x 2,048 = 622,329,856) 79,052,061,440 = the card's "79B non-embedding";
* active 3,874,929,408 with embedding and LM head; without both 3,252,599,552 = the
  card's "3B activated" (10 routed + 1 shared expert of 3 x 2,048 x 512 per layer,
  48 layers, plus all mixers, routers and norms).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from conftest import check_cached_decode, search_example

from costmodels.blocks import price_blocks
from costmodels.dtypes import get_recipe
from costmodels.kinds import deltanet as gdn
from nas.arch import Attention, DeltaNet, MoE, NoOp, blocks_table
from nas.hf import from_hf, load_config, to_hf

CONFIG = Path(__file__).parent / "data" / "configs" / "qwen3-next-80b-a3b-instruct.json"


def test_config_round_trip_and_exact_counts():
    arch = load_config(CONFIG)
    assert arch.kind_counts() == {"deltanet": 36, "attention": 12, "moe": 48}
    assert arch.norm_unit_offset
    att = arch.blocks[6]
    assert isinstance(att, Attention) and att.output_gate and att.qk_norm
    assert att.rope_dim == 64  # partial_rotary_factor 0.25 of head_dim 256
    pc = arch.param_counts()
    assert pc.total == 79_674_391_296
    assert pc.active == 3_874_929_408
    assert pc.total_without_embeddings == 79_052_061_440  # "79B non-embedding"
    assert pc.active - pc.embeddings - pc.lm_head == 3_252_599_552  # "3B activated"
    assert round(pc.total / 1e9) == 80 and round((pc.active - 2 * pc.embeddings) / 1e9) == 3
    cfg = to_hf(arch)
    assert cfg["model_type"] == "qwen3_next" and "puzzle_layers" not in cfg
    assert from_hf(cfg) == arch
    orig = json.loads(CONFIG.read_text())
    for k in ("linear_num_value_heads", "partial_rotary_factor", "num_experts",
              "shared_expert_intermediate_size", "rope_theta", "head_dim"):
        assert cfg[k] == orig[k], k


def test_state_and_kv_memory():
    """DeltaNet layers hold a fixed state: 32 x 128 x 128 float32 plus the conv's last 3
    inputs of 2*16*128 + 32*128 channels in bf16 per layer; only the 12 attention layers
    hold KV (2 x 2 heads x 256 per token each)."""
    arch = load_config(CONFIG)
    per_layer = 32 * 128 * 128 * 4 + (2 * 16 * 128 + 32 * 128) * 3 * 2
    assert arch.state_bytes_per_sequence("bf16") == 36 * per_layer
    assert arch.kv_bytes_per_token("bf16") == 12 * 2 * 2 * 256 * 2


def test_deltanet_pricing_follows_the_formulas():
    import hwprofiles

    dn = DeltaNet(num_k_heads=16, num_v_heads=32, head_k_dim=128, head_v_dim=128)
    f, b = gdn.scan_prefill(1.0, 4096.0, 16, 32, 128, 128, 64, 2.0, 4.0)
    per_tok = 4 * 64 * 128 + 64 * 64 / 3 + 2 * 64 * 256 + 2 * 64 * 128 + 6 * 128 * 128
    assert f == pytest.approx(4096 * 32 * per_tok)
    assert b == pytest.approx(4096 * (2 * 2048 + 2 * 4096 + 64) * 2 + 32 * 128 * 128 * 4)
    f1, b1 = gdn.scan_decode(8.0, 16, 32, 128, 128, 2.0, 4.0)
    assert f1 == 8 * 7 * 32 * 128 * 128
    # decode does not grow with the context for DeltaNet; it does for attention
    att = Attention(num_heads=16, num_kv_heads=2, head_dim=256, output_gate=True, rope_dim=64)
    t = blocks_table([dn, att], 2048)
    c = price_blocks(t, hwprofiles.get("h100-sxm"), get_recipe("bf16"),
                     ["isl=4096,osl=256,batch=8", "isl=262144,osl=256,batch=8"])
    assert c.decode_s[0, 1] == pytest.approx(c.decode_s[0, 0])
    assert c.decode_s[1, 1] > 10 * c.decode_s[1, 0]
    assert c.kv_bytes_per_token[0] == 0 and c.state_bytes_per_sequence[0] > 0
    # the gated q projection is priced: a gate costs more than the same attention without
    t2 = blocks_table([att, att.model_copy(update={"output_gate": False})], 2048)
    c2 = price_blocks(t2, hwprofiles.get("h100-sxm"), get_recipe("bf16"),
                      ["isl=4096,osl=256,batch=8"])
    assert c2.prefill_s[0, 0] > c2.prefill_s[1, 0]
    assert c2.weight_bytes[0] - c2.weight_bytes[1] == 2048 * 16 * 256 * 2


def test_heterogeneous_child_round_trip_and_refused_elsewhere():
    from nas.hf import ExportError

    arch = load_config(CONFIG)
    blocks = list(arch.blocks)
    blocks[6] = DeltaNet(num_k_heads=16, num_v_heads=32, head_k_dim=128, head_v_dim=128)
    blocks[1] = blocks[1].model_copy(update={"num_experts": 256, "top_k": 6})
    blocks[2] = blocks[2].model_copy(update={"num_v_heads": 16})
    blocks[5] = NoOp()
    child = arch.replace_blocks(blocks)
    cfg = to_hf(child)
    assert cfg["model_type"] == "qwen3_next" and len(cfg["puzzle_layers"]) == 48
    assert from_hf(json.loads(json.dumps(cfg))) == child
    for mt in ("nemotron_h_puzzle", "qwen3_moe"):
        with pytest.raises(ExportError):
            to_hf(child, mt)
    bad = dict(cfg, puzzle_layers=cfg["puzzle_layers"][:3])
    with pytest.raises(Exception, match="puzzle_layers"):
        from_hf(bad)


def test_bad_partial_rotary_is_named():
    from hwprofiles.errors import InputError

    cfg = json.loads(CONFIG.read_text())
    cfg["partial_rotary_factor"] = 1.5
    with pytest.raises(InputError, match="partial_rotary_factor"):
        from_hf(cfg)


# ---- torch: modules and parity with transformers ------------------------------------
torch = pytest.importorskip("torch")


def test_chunked_equals_recurrent_and_cached_decode():
    from nas.child import build_model
    from nas.modules.deltanet import gated_delta_chunked, gated_delta_step

    g = torch.Generator().manual_seed(0)
    b, n, nk, nv, dk, dv = 2, 45, 2, 4, 8, 6
    q, k = torch.randn(b, n, nk, dk, generator=g), torch.randn(b, n, nk, dk, generator=g)
    v = torch.randn(b, n, nv, dv, generator=g)
    gl, beta = -torch.rand(b, n, nv, generator=g), torch.rand(b, n, nv, generator=g)
    s0 = torch.randn(b, nv, dk, dv, generator=g)
    o1, s1 = gated_delta_chunked(q, k, v, gl, beta, s0, chunk=16)
    o2, s2 = gated_delta_step(q, k, v, gl, beta, s0)
    assert float((o1 - o2).abs().max()) < 1e-5 and float((s1 - s2).abs().max()) < 1e-5

    arch = load_config(CONFIG)
    tiny = arch.model_copy(update={"hidden_size": 32, "vocab_size": 64, "blocks": (
        DeltaNet(num_k_heads=2, num_v_heads=4, head_k_dim=8, head_v_dim=8),
        MoE(num_experts=4, top_k=2, expert_width=16, shared_width=16, shared_gate=True),
        arch.blocks[6].model_copy(update={"num_heads": 4, "num_kv_heads": 2, "head_dim": 8,
                                          "rope_dim": 4}),
        MoE(num_experts=4, top_k=2, expert_width=16, shared_width=16, shared_gate=True))})
    model = build_model(tiny, seed=0).eval()
    check_cached_decode(model, torch.randint(0, 64, (2, 11), generator=g), 7)


transformers = pytest.importorskip("transformers")


def _hf_config():
    return transformers.Qwen3NextConfig(
        vocab_size=96, hidden_size=32, num_hidden_layers=4, num_attention_heads=4,
        num_key_value_heads=2, head_dim=16, intermediate_size=48, max_position_embeddings=256,
        tie_word_embeddings=False, bos_token_id=1, eos_token_id=None, pad_token_id=0,
        linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=8,
        linear_value_head_dim=6, linear_conv_kernel_dim=4, num_experts=4,
        num_experts_per_tok=2, moe_intermediate_size=16, shared_expert_intermediate_size=24,
        mlp_only_layers=[2],
        layer_types=["linear_attention", "full_attention", "linear_attention",
                     "full_attention"],
        rope_parameters={"rope_type": "default", "rope_theta": 1e4,
                         "partial_rotary_factor": 0.5})


def _hf_model(seed: int = 0):
    from test_hf_parity import random_hf_model

    return random_hf_model(_hf_config(), seed)


def test_parity_theirs_to_ours(tmp_path):
    from test_hf_parity import check_theirs_to_ours

    from nas.child import load_pretrained

    ours = check_theirs_to_ours(_hf_model(), tmp_path)
    assert ours.arch.model_type == "qwen3_next" and ours.arch.blocks[2].rope_dim == 8
    _zero_centred_norm_matters(load_pretrained(tmp_path / "hf").eval())
    # the 4.x spelling (top-level rope_theta and partial_rotary_factor) reads the same
    cfg = json.loads((tmp_path / "hf" / "config.json").read_text())
    rp = cfg.pop("rope_parameters")
    cfg.update(rope_theta=rp["rope_theta"], partial_rotary_factor=rp["partial_rotary_factor"])
    (tmp_path / "hf" / "config.json").write_text(json.dumps(cfg))
    assert load_pretrained(tmp_path / "hf").arch == ours.arch


def test_parity_ours_to_theirs(tmp_path):
    from test_hf_parity import check_ours_to_theirs

    _hf_model().save_pretrained(tmp_path / "ref")
    check_ours_to_theirs(load_config(tmp_path / "ref"), tmp_path)


def _zero_centred_norm_matters(ours):
    """The (1 + weight) norms are not a no-op on these weights."""
    from test_hf_parity import _prompt

    with torch.no_grad():
        a = ours(_prompt())
        for m in ours.modules():
            if hasattr(m, "unit_offset"):
                m.unit_offset = False
        b = ours(_prompt())
    assert float((a - b).abs().max()) > 1e-2
    assert np.isfinite(float(a.abs().max()))


# ---- search axes and init_from_parent -------------------------------------------------
def test_search_axes():
    from nas.space import alternatives, check_all_used
    from nas.spec import SearchSpace

    arch = load_config(CONFIG)
    space = SearchSpace.model_validate({"deltanet": {"v_heads": [16, 8], "k_heads": [8],
                                                     "swap": True, "noop": True}})
    alts = alternatives(arch, space)
    check_all_used(arch, space, alts)
    labels = [a.label for a in alts[0]]
    # (v, k) pairs with v <= 32, k <= 16, k | v and v/k <= 2 (the parent's ratio)
    assert labels == ["parent", "num_v_heads=16", "num_k_heads=8,num_v_heads=16",
                      "num_k_heads=8,num_v_heads=8", "noop", "swap:attention"]
    assert [a.label for a in alts[6]] == ["parent", "swap:deltanet"]
    assert alts[6][1].child == arch.blocks[0] and alts[0][-1].child == arch.blocks[6]


def _tiny_parent():
    import tempfile

    from test_hf_parity import randomize

    from nas.child import load_pretrained

    with tempfile.TemporaryDirectory() as tmp:
        _hf_model(5).save_pretrained(tmp)
        parent = load_pretrained(tmp).eval()
    randomize(parent, 11)
    return parent


def test_init_fewer_heads_keeps_the_function_of_the_kept_heads():
    """Zero the out_proj columns of value heads 1 and 3 (one per key group) of DeltaNet
    block 0: the child with 2 of 4 value heads must pick heads 0 and 2 and compute exactly
    the parent's function; zeroing key group 1 (heads 2, 3), the child with 1 of 2 key
    heads and 2 value heads must keep group 0."""
    from nas.child import init_from_parent

    parent = _tiny_parent()
    dv = 6
    calib = torch.randint(0, 96, (2, 16), generator=torch.Generator().manual_seed(0))
    for dead, update, keep in (([1, 3], {"num_v_heads": 2}, [0, 2]),
                               ([2, 3], {"num_v_heads": 2, "num_k_heads": 1}, [0, 1])):
        with torch.no_grad():
            w = parent.blocks[0].mixer.out_proj.weight
            saved = w.clone()
            for h in dead:
                w[:, h * dv:(h + 1) * dv] = 0.0
        blocks = list(parent.arch.blocks)
        blocks[0] = blocks[0].model_copy(update=update)
        child = init_from_parent(parent.arch.replace_blocks(blocks), parent, calib)
        assert "by channel contribution" in child.init_report[0] or "key heads" in \
            child.init_report[0], child.init_report[0]
        with torch.no_grad():
            diff = float((child(calib) - parent(calib)).abs().max())
            assert diff < 1e-4, diff
            cm = child.blocks[0].mixer
            assert torch.equal(cm.A_log, parent.blocks[0].mixer.A_log[keep])
            w.copy_(saved)


def test_init_swap_copies_the_nearest_block_scaled():
    """The swapped-in DeltaNet is parent block 0's, its out_proj scaled by the least-squares
    scalar onto the replaced attention's output: its block-output error on the calibration
    activations is at most a no-op's and minimal over the scale. (Whether it beats a random
    init needs a trained parent: on random weights the copy is uncorrelated with the
    replaced block and the scale comes out near 0.) With the scale near 0 (about 1e-3) the
    three errors differ by only a few float32 steps of their size (~0.93): halving the scale
    costs 1.6 to 2.7 steps, depending on the BLAS kernels MKL picks (SSE4.2, AVX2, AVX-512),
    and rounding moves each error by about a step, so the comparisons allow 4 float32 steps
    of the no-op's error."""
    from test_hf_parity import _prompt

    from nas.child import init_from_parent

    parent = _tiny_parent()
    pa = parent.arch
    blocks = list(pa.blocks)
    blocks[2] = pa.blocks[0]  # layer 1's attention becomes the DeltaNet of layer 0
    child_arch = pa.replace_blocks(blocks)
    calib = _prompt(5)
    child = init_from_parent(child_arch, parent, calib)
    assert "swap: copied from parent block 0 (output scale" in child.init_report[2]
    csd, psd = child.blocks[2].state_dict(), parent.blocks[0].state_dict()
    assert all(torch.equal(csd[k], psd[k]) for k in psd if "out_proj" not in k)
    s = float(csd["mixer.out_proj.weight"].flatten()[0] / psd["mixer.out_proj.weight"].flatten()[0])
    assert torch.allclose(csd["mixer.out_proj.weight"], s * psd["mixer.out_proj.weight"])
    with torch.no_grad():
        x = parent.embed(calib)
        for blk in parent.blocks[:2]:
            x = blk(x)
        want = parent.blocks[2](x) - x

        def err(blk):
            return float(((blk(x) - x) - want).square().mean())

        best, noop = err(child.blocks[2]), float(want.square().mean())
        tol = 4 * torch.finfo(torch.float32).eps * noop  # a few float32 steps of the errors
        assert best <= noop + tol  # no worse than a no-op
        w = child.blocks[2].mixer.out_proj.weight
        for f in (0.5, 2.0):  # and the least-squares scale is the best one
            w.mul_(f)
            assert err(child.blocks[2]) >= best - tol
            w.div_(f)


def test_shipped_example_search_runs(tmp_path):
    """examples/qwen3-next-80b-h100.json (without its sweep, to stay quick): the parent does
    not fit 16 requests of 256K tokens on one H100 in NVFP4; the child fits and meets the
    throughput budget, and the child's config reads back as a qwen3_next model."""
    bp = search_example("qwen3-next-80b-h100", tmp_path)
    assert bp["params"]["parent_total"] == 79_674_391_296
    assert len(bp["choices"]) == 96
    child = from_hf(bp["child"])
    assert child.model_type == "qwen3_next" and child.param_counts().total == \
        bp["params"]["child_total"]


# ---- Qwen3.5 MoE (qwen3_5_moe / qwen3_5_moe_text) ---------------------------------------
CONFIG35 = Path(__file__).parent / "data" / "configs" / "qwen3.5-35b-a3b.json"


def test_qwen35_counts_and_round_trip():
    """Qwen3.5-35B-A3B (text_config as on the Hub; model card
    https://huggingface.co/Qwen/Qwen3.5-35B-A3B: 35B total, 3B activated).

    The language model counts 34,660,610,688 (MTP not counted); the vision tower of the
    image-text wrapper is not modeled: by its vision_config (27 ViT blocks of width 1152,
    MLP 4304, patch embedding, 2304 position embeddings, a 2x2 merger into 2048) it is about
    0.45B, which brings the total to about 35.1B = the published 35B. Active: 2,946,429,568
    without the input embedding (the LM head computes every token) = the published 3B.
    """
    from nas.hf import ExportError

    arch = load_config(CONFIG35)
    assert arch.model_type == "qwen3_5_moe" and arch.kind_counts() == {
        "deltanet": 30, "attention": 10, "moe": 40}
    pc = arch.param_counts()
    assert pc.total == 34_660_610_688
    assert pc.active_without_embeddings == 2_946_429_568
    assert round(pc.active_without_embeddings / 1e9) == 3
    assert arch.blocks[6].rope_dim == 64 and arch.blocks[1].norm_topk
    with pytest.raises(ExportError, match="vision tower"):
        to_hf(arch, "qwen3_5_moe")
    cfg = to_hf(arch)
    assert cfg["model_type"] == "qwen3_5_moe_text" and "vision_config" not in cfg
    text = from_hf(cfg)
    assert text.blocks == arch.blocks and text.param_counts().total == pc.total
    with pytest.raises(ExportError, match="split"):  # the tensors are laid out differently
        to_hf(load_config(CONFIG), "qwen3_5_moe_text")


def _hf35_model(seed: int = 0):
    from test_hf_parity import random_hf_model

    cfg = transformers.Qwen3_5MoeTextConfig(
        vocab_size=96, hidden_size=32, num_hidden_layers=4, num_attention_heads=4,
        num_key_value_heads=2, head_dim=16, max_position_embeddings=256,
        tie_word_embeddings=False, bos_token_id=1, eos_token_id=None, pad_token_id=0,
        linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=8,
        linear_value_head_dim=6, linear_conv_kernel_dim=4, num_experts=4,
        num_experts_per_tok=2, moe_intermediate_size=16, shared_expert_intermediate_size=24,
        layer_types=["linear_attention", "full_attention", "linear_attention",
                     "full_attention"],
        rope_parameters={"rope_type": "default", "rope_theta": 1e4,
                         "partial_rotary_factor": 0.5, "mrope_section": [2, 1, 1],
                         "mrope_interleaved": True})
    return random_hf_model(cfg, seed)


def test_qwen35_parity_both_ways(tmp_path):
    from test_hf_parity import _check, _prompt, check_theirs_to_ours, randomize

    from nas.child import build_model, save_pretrained, to_transformers

    ours = check_theirs_to_ours(_hf35_model(), tmp_path)
    assert ours.arch.model_type == "qwen3_5_moe_text" and ours.blocks[0].mixer.split
    mine = build_model(ours.arch, seed=3).eval()
    randomize(mine, 7)
    save_pretrained(mine, tmp_path / "ours")
    back, info = transformers.AutoModelForCausalLM.from_pretrained(
        tmp_path / "ours", output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"], info
    _check(mine, back.eval(), _prompt(3))
    with pytest.raises(Exception, match="puzzle_layers"):  # a heterogeneous child cannot go
        blocks = list(mine.arch.blocks)  # into transformers' class
        blocks[1] = NoOp()
        to_transformers(build_model(mine.arch.replace_blocks(blocks), seed=0))


def test_qwen35_init_fewer_heads_split_layout():
    """The head-pruning rule on the split layout: dead value heads 1 and 3 dropped exactly."""
    from test_hf_parity import randomize

    from nas.child import from_transformers, init_from_parent

    parent = from_transformers(_hf35_model(2)).eval()
    randomize(parent, 3)
    with torch.no_grad():
        for h in (1, 3):
            parent.blocks[0].mixer.out_proj.weight[:, h * 6:(h + 1) * 6] = 0.0
    blocks = list(parent.arch.blocks)
    blocks[0] = blocks[0].model_copy(update={"num_v_heads": 2})
    calib = torch.randint(0, 96, (2, 16), generator=torch.Generator().manual_seed(0))
    child = init_from_parent(parent.arch.replace_blocks(blocks), parent, calib)
    with torch.no_grad():
        assert float((child(calib) - parent(calib)).abs().max()) < 1e-4


def test_scoring_initializes_swaps_and_pruned_heads():
    """Replace-1-block scoring initializes a swapped-in DeltaNet and a pruned DeltaNet from
    the parent as init_from_parent does."""
    from nas.scoring.core import init_block

    parent = _tiny_parent()
    pa = parent.arch
    tokens = torch.randint(0, 96, (2, 16), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        x0 = parent.embed(tokens)
        x = parent.blocks[1](parent.blocks[0](x0))
        _, what = init_block(parent, 2, pa.blocks[0], x, 0)
        assert what.startswith("swap: copied from parent block 0")
        _, what = init_block(parent, 0, pa.blocks[0].model_copy(update={"num_v_heads": 2}),
                             x0, 0)
        assert what == "value heads 4 -> 2 by channel contribution"
