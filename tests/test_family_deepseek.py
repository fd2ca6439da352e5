"""DeepSeek-V3 (``deepseek_v3``, multi-head latent attention + group-routed MoE): config import
and export, exact parameter counts against the published totals, MLA cost and latent KV
memory, torch parity with transformers, search axes and inheritance.

Published figures (cited where asserted):

* DeepSeek-V3 technical report (arXiv 2412.19437), abstract: "671B total parameters with 37B
  activated for each token"; the model card (huggingface.co/deepseek-ai/DeepSeek-V3, README
  "Model Downloads"): "685B ... 671B of the Main Model weights and 14B of the Multi-Token
  Prediction (MTP) Module weights".
* ``tests/data/configs/deepseek-v3.json``: huggingface.co/deepseek-ai/DeepSeek-V3 config.json.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from conftest import (
    check_cached_decode,
    check_inheritance_beats_random,
    search_example,
    tiny_parent_of,
    with_block,
)

from hwprofiles.errors import InputError
from nas.arch import FFN, MLA, ModelArch, MoE
from nas.hf import from_hf, load_config, to_hf

DATA = Path(__file__).parent / "data" / "configs"
DSV3 = DATA / "deepseek-v3.json"


def _v3() -> ModelArch:
    return load_config(DSV3)


# ---- import / export / counts -------------------------------------------------------------
def test_import_shapes():
    a = _v3()
    assert a.model_type == "deepseek_v3" and a.num_blocks == 122
    mla = a.blocks[0]
    assert mla == MLA(num_heads=128, q_lora_rank=1536, kv_lora_rank=512, qk_nope_head_dim=128,
                      qk_rope_head_dim=64, v_head_dim=128, rope_interleave=True)
    assert [type(b) for b in a.blocks[1:6:2]] == [FFN, FFN, FFN]
    moe = a.blocks[7]
    assert isinstance(moe, MoE)
    assert (moe.num_experts, moe.top_k, moe.expert_width, moe.shared_width) == (256, 8, 2048,
                                                                                2048)
    assert (moe.router, moe.router_bias, moe.n_group, moe.topk_group, moe.routed_scaling) == \
        ("sigmoid", True, 8, 4, 2.5)
    assert [b.kind for b in a.mtp_blocks] == ["mla", "moe"]


def test_exact_counts_against_published():
    pc = _v3().param_counts()
    # exact, from the config (arithmetic in the module docstring of costmodels.shapes)
    assert pc.total == 671_026_419_200
    assert pc.active_without_embeddings == 36_625_618_432
    # published: 671B total (main model, MTP excluded)
    assert round(pc.total / 1e9) == 671
    # published: 37B activated; the convention (as gpt-oss's model card states it) counts the
    # LM head but not the input embedding table (a lookup): 36.63B; with it, 37.55B
    assert round(pc.active_without_embeddings / 1e9) == 37
    assert pc.active - pc.active_without_embeddings == 129280 * 7168
    # published: 685B on the Hub = 671B + 14B MTP. Our MTP count is the MTP layer (MLA + MoE),
    # its 2h->h projection and 3 norms: 11.61B; the checkpoint's MTP module also stores its own
    # copy of the embedding table and the LM head (2 x 0.93B): 13.46B, "14B" rounded up
    h, v = 7168, 129280
    assert pc.mtp == 11_610_068_224
    hub_mtp = pc.mtp + 2 * h * v
    assert hub_mtp == 13_463_426_304
    assert round((pc.total + hub_mtp) / 1e9) == 684 or round((pc.total + hub_mtp) / 1e9) == 685


def test_round_trip_identity():
    a = _v3()
    cfg = to_hf(a)
    assert cfg["model_type"] == "deepseek_v3"
    b = from_hf(json.loads(json.dumps(cfg)))
    assert b == a
    assert to_hf(b) == cfg
    orig = json.loads(DSV3.read_text())
    same = {k for k in orig if k in cfg and cfg[k] == orig[k]}
    # every published field comes back (the RoPE dict in its normalized spelling), but
    # auto_map: it names DeepSeek's modeling files, which a child's folder does not hold
    assert set(orig) - same <= {"rope_scaling", "torch_dtype", "transformers_version",
                                "auto_map"}


def test_heterogeneous_child_exports_as_puzzle():
    a = _v3()
    blocks = list(a.blocks)
    blocks[0] = blocks[0].model_copy(update={"kv_lora_rank": 256, "num_heads": 64})
    blocks[9] = blocks[9].model_copy(update={"num_experts": 128, "n_group": 8})
    from nas.arch import NoOp

    blocks[11] = NoOp()
    child = a.replace_blocks(blocks)
    with pytest.raises(InputError):
        to_hf(child, "deepseek_v3")
    cfg = to_hf(child)
    assert cfg["model_type"] == "deepseek_v3_puzzle"
    back = from_hf(json.loads(json.dumps(cfg)))
    assert back.blocks == child.blocks and back.param_counts() == child.param_counts()
    assert to_hf(back) == cfg


@pytest.mark.parametrize("field,value,match", [
    ("attention_bias", True, "biased MLA"),
    ("num_key_value_heads", 64, "must equal num_attention_heads"),
    ("scoring_func", "softmax", "sigmoid"),
    ("topk_method", "greedy", "noaux_tc"),
    ("moe_layer_freq", 2, "only 1"),
    ("n_group", 3, "equal groups"),
    ("kv_lora_rank", 0, "kv_lora_rank"),
])
def test_bad_fields_named(field, value, match):
    cfg = {**json.loads(DSV3.read_text()), field: value}
    with pytest.raises(InputError, match=match) as e:
        from_hf(cfg, source="v3.json")
    assert "v3.json" in str(e.value)


def test_mla_latent_kv_bytes_per_token():
    """The latent cache: (kv_lora_rank + qk_rope_head_dim) elements per token per layer,
    against the 2 x heads x head_dim a GQA/MHA layer of the same heads would store."""
    a = _v3()
    assert a.kv_bytes_per_token("bf16") == 61 * (512 + 64) * 2 == 70_272
    assert a.kv_bytes_per_token("fp8") == 61 * 576
    # uncompressed MHA with the same heads (128 x (192 + 128) per token per layer): 71x more
    mha = 61 * 128 * (192 + 128) * 2
    assert mha / a.kv_bytes_per_token("bf16") == pytest.approx(71.11, abs=0.01)
    assert a.kv_bytes(131072, "bf16") == 70_272 * 131072
    assert np.isfinite(a.weight_bytes("fp8"))


# ---- cost model ---------------------------------------------------------------------------
def _price(arch: ModelArch, rows: list[int], wls: list[str], tp: int = 1, recipe: str = "bf16"):
    import hwprofiles
    from costmodels.blocks import price_blocks
    from costmodels.dtypes import get_recipe

    return price_blocks(arch.table.take(rows), hwprofiles.get("h200-sxm"), get_recipe(recipe),
                        wls, tp=tp)


def test_mla_ops_closed_forms():
    from costmodels.kinds import mla

    # absorbed decode: one latent head of R + rope for all nq heads; no up-projection
    f, b = mla.decode(2.0, 1000.0, 128, 64, 512, 2.0, 1.0)
    assert f == 2 * 2 * 128 * (2 * 512 + 64) * 1000
    assert b == 2 * (1001 * 576 * 1 + 128 * (2 * 512 + 64) * 2)
    # the absorbed W_UK / W_UV GEMMs read all of kv_b once
    f, b = mla.absorb(4.0, 128, 128, 512, 128, 1.0, 2.0)
    assert f == 2 * 4 * 128 * 512 * 256
    assert b == 128 * 512 * 256 + 4 * 128 * (128 + 1024 + 128) * 2
    # prefill attends over up-projected heads: QK over nope + rope, PV over v
    f, b = mla.prefill(1.0, 10.0, 128, 128, 64, 128, 512, 2.0, 1.0)
    assert f == 2 * 128 * 320 * 55
    assert b == 10 * (2 * 128 * 320 * 2 + 576)


def test_mla_decode_reads_the_latent_cache_only():
    """Decode time grows with context by the latent cache read, (R + rope) bytes per token,
    whatever the head count; an MHA layer of the same heads reads 71x more."""
    a = _v3()
    short, long_ = "isl=1024,osl=2,batch=64", "isl=65536,osl=2,batch=64"
    mla = _price(a, [0], [short, long_])
    heads64 = a.replace_blocks([a.blocks[0].model_copy(update={"num_heads": 64})])
    mla64 = _price(heads64, [0], [short, long_])
    from nas.arch import Attention

    mha = ModelArch(hidden_size=7168, vocab_size=129280,
                    blocks=(Attention(num_heads=128, num_kv_heads=128, head_dim=160),))
    gqa = _price(mha, [0], [short, long_])
    d_mla = mla.decode_s[0, 1] - mla.decode_s[0, 0]
    d_mha = gqa.decode_s[0, 1] - gqa.decode_s[0, 0]
    # MLA's absorbed decode is compute-bound at the H200's fitted attention fraction: the
    # time ratio stays well below the 71x of bytes
    assert d_mha / d_mla > 15
    assert mla.kv_bytes_per_token[0] == 576 * 2
    # fewer query heads: less compute, the same cache read
    assert mla64.decode_s[0, 1] < mla.decode_s[0, 1]
    assert mla64.kv_bytes_per_token[0] == mla.kv_bytes_per_token[0]


def test_mla_tensor_parallel_replicates_the_latent():
    a = _v3()
    one = _price(a, [0], ["isl=4096,osl=512,batch=32"], tp=1)
    eight = _price(a, [0], ["isl=4096,osl=512,batch=32"], tp=8)
    assert eight.kv_bytes_per_token[0] == one.kv_bytes_per_token[0]
    assert eight.weight_bytes[0] < one.weight_bytes[0] / 4  # q_b, kv_b, o split by heads
    assert eight.prefill_s[0, 0] < one.prefill_s[0, 0]


def test_smaller_kv_lora_rank_is_cheaper_and_smaller():
    a = _v3()
    small = a.replace_blocks([a.blocks[0].model_copy(update={"kv_lora_rank": 256})])
    wl = ["isl=32768,osl=1024,batch=32"]
    big_c, small_c = _price(a, [0], wl), _price(small, [0], wl)
    assert small_c.kv_bytes_per_token[0] == (256 + 64) * 2
    assert small_c.decode_s[0, 0] < big_c.decode_s[0, 0]
    assert small_c.memory_bytes[0, 0] < big_c.memory_bytes[0, 0]
    assert small.param_counts().total < a.param_counts().total


# ---- torch modules: parity with transformers ------------------------------------------------
def _tiny_hf_config():
    transformers = pytest.importorskip("transformers")
    return transformers.DeepseekV3Config(
        vocab_size=96, hidden_size=32, num_hidden_layers=3, num_attention_heads=4,
        num_key_value_heads=4, intermediate_size=48, moe_intermediate_size=16,
        n_routed_experts=8, n_shared_experts=1, num_experts_per_tok=2, n_group=4, topk_group=2,
        first_k_dense_replace=1, q_lora_rank=24, kv_lora_rank=16, qk_nope_head_dim=8,
        qk_rope_head_dim=4, v_head_dim=12, max_position_embeddings=256,
        tie_word_embeddings=False, bos_token_id=1, eos_token_id=None, pad_token_id=0,
        routed_scaling_factor=2.5,
        rope_parameters={"rope_type": "yarn", "rope_theta": 1e4, "factor": 4.0,
                         "original_max_position_embeddings": 64, "mscale": 0.8,
                         "mscale_all_dim": 0.7})


def _hf_tiny(seed: int = 0, **overrides):
    pytest.importorskip("transformers")
    from test_hf_parity import random_hf_model

    cfg = _tiny_hf_config()
    for k, v in overrides.items():
        setattr(cfg, k, v)
    return random_hf_model(cfg, seed)


@pytest.mark.parametrize("overrides", [{}, {"q_lora_rank": None, "rope_interleave": False}])
def test_parity_theirs_to_ours(tmp_path, overrides):
    from test_hf_parity import check_theirs_to_ours

    ours = check_theirs_to_ours(_hf_tiny(**overrides), tmp_path)
    assert ours.arch.model_type == "deepseek_v3"
    assert [b.kind for b in ours.arch.blocks] == ["mla", "ffn", "mla", "moe", "mla", "moe"]


def test_parity_ours_to_theirs(tmp_path):
    pytest.importorskip("transformers")
    from test_hf_parity import check_ours_to_theirs

    _hf_tiny().save_pretrained(tmp_path / "ref")
    check_ours_to_theirs(load_config(tmp_path / "ref"), tmp_path)


def test_group_routing_and_latent_cache_matter():
    """Group-limited routing changes which experts run (the parity above would not see a
    routing that ignored it only if every token's best experts sat in the best groups), and
    decoding through the latent cache equals the full forward."""
    torch = pytest.importorskip("torch")
    from nas.child import from_transformers

    ours = from_transformers(_hf_tiny()).eval()
    moe = ours.blocks[3].mixer
    x = torch.randn(64, 32, generator=torch.Generator().manual_seed(0))
    grouped, _ = moe.route(x)
    moe.cfg = moe.cfg.model_copy(update={"n_group": 1, "topk_group": 1})
    free, _ = moe.route(x)
    assert not torch.equal(grouped.sort(-1).values, free.sort(-1).values)
    moe.cfg = moe.cfg.model_copy(update={"n_group": 4, "topk_group": 2})
    prompt = torch.randint(2, 96, (2, 9), generator=torch.Generator().manual_seed(1))
    _, cache = check_cached_decode(ours, prompt, 5)
    assert cache.layers[0]["latent"].shape == (2, 9, 16)  # kv_lora_rank per token
    assert cache.layers[0]["k_rot"].shape == (2, 9, 4)  # the shared RoPE key


@pytest.mark.parametrize("mt", ["nemotron_h_puzzle", "nemotron-nas", "qwen3_moe",
                                "gpt_oss_puzzle"])
def test_other_types_refuse_mla_instead_of_dropping_it(mt):
    a = _v3().model_copy(update={"mtp_blocks": ()})
    if mt == "gpt_oss_puzzle":  # the puzzle types hold any block
        assert from_hf(to_hf(a, mt)).blocks == a.blocks
        return
    with pytest.raises(InputError, match="latent attention|group-limited|MLA|needs"):
        to_hf(a, mt)


# ---- init_from_parent for the MLA axes ------------------------------------------------------
@pytest.fixture(scope="module")
def tiny_parent():
    pytest.importorskip("torch")
    return tiny_parent_of(_hf_tiny(seed=5))


MLA_AXES = {
    "kv-lora-16-to-6": {"kv_lora_rank": 6},
    "q-lora-24-to-8": {"q_lora_rank": 8},
    "heads-4-to-2": {"num_heads": 2},
    "all-three": {"num_heads": 3, "kv_lora_rank": 8, "q_lora_rank": 12},
}


@pytest.mark.parametrize("axis", list(MLA_AXES))
def test_mla_inheritance_beats_random_init(tiny_parent, axis):
    pytest.importorskip("torch")
    parent, calib, held = tiny_parent
    check_inheritance_beats_random(parent, with_block(parent.arch, 2, MLA_AXES[axis]), 2, calib,
                                   held, axis)


def test_mla_svd_full_rank_is_exact_and_truncation_is_worse(tiny_parent):
    """At r = R the SVD re-factoring reproduces the block (V is a rotation); at r < R it
    beats keeping the first r latent channels."""
    pytest.importorskip("torch")
    from nas.child.inherit.mla import svd_bottleneck

    parent, calib, held = tiny_parent
    p = parent.blocks[2].mixer
    x = parent.embed(calib).reshape(-1, 32).detach()
    W, g, U = (t.detach() for t in (p.kv_a_proj_with_mqa.weight[:16], p.kv_a_layernorm.weight,
                                    p.kv_b_proj.weight))

    def out(down, gw, up, r):
        z = x.double() @ down.t()
        c = gw * z / (z.pow(2).mean(-1, keepdim=True) + 1e-6).sqrt()
        return c @ up.t()

    ref = out(W.double(), g.double(), U.double(), 16)
    full = out(*svd_bottleneck(W, g, U, 16, x), 16)
    assert float((full - ref).abs().max()) < 1e-9 * float(ref.abs().max()) + 1e-9
    svd = out(*svd_bottleneck(W, g, U, 6, x), 6)
    cut = out(W[:6].double(), g[:6].double(), U[:, :6].double(), 6)
    assert float((svd - ref).pow(2).mean()) < float((cut - ref).pow(2).mean())


def test_search_axes():
    from nas.space import alternatives, check_all_used
    from nas.spec import SearchSpace

    a = _v3()
    s = SearchSpace.model_validate({
        "mla": {"heads": [64], "kv_lora_ranks": [256], "q_lora_ranks": [768], "noop": True},
        "moe": {"experts": [128, 100], "top_k": [4], "expert_widths": [1024], "noop": True},
        "ffn": {"fractions": [0.5], "noop": True}})
    alts = alternatives(a, s)
    with pytest.raises(InputError, match="experts: 100 is not usable.*n_group"):
        check_all_used(a, s, alts)
    mla = [x.child for x in alts[0]]
    assert len(mla) == 2 * 2 * 2 + 1  # heads x kv rank x q rank, + no-op
    assert MLA(num_heads=64, q_lora_rank=768, kv_lora_rank=256, qk_nope_head_dim=128,
               qk_rope_head_dim=64, v_head_dim=128) in mla
    moes = [x.child for x in alts[7] if isinstance(x.child, MoE)]
    # 100 experts do not split into 8 groups: never offered to a group-routed block
    assert {m.num_experts for m in moes} == {256, 128}
    assert all(m.num_experts % m.n_group == 0 for m in moes)
    with pytest.raises(InputError, match="kv_lora_ranks: 1024 is not usable"):
        bad = SearchSpace.model_validate({"mla": {"kv_lora_ranks": [1024]}})
        check_all_used(a, bad, alternatives(a, bad))


def test_shipped_example_search_runs(tmp_path):
    """examples/deepseek-v3-8xh200.json (without its sweep, to stay quick): the parent does
    not fit 32 requests of 128K tokens on 8 H200s in FP8 (the latent cache is replicated on
    every GPU under TP); the child fits by a smaller latent and meets the throughput budget,
    and its config reads back as a DeepSeek-V3 model with the MTP head."""
    bp = search_example("deepseek-v3-8xh200", tmp_path)
    assert bp["params"]["parent_total"] == 671_026_419_200
    assert len(bp["choices"]) == 122
    assert any(c["kind"] == "mla" and "kv_lora_rank" in c["change"] for c in bp["choices"])
    child = from_hf(bp["child"])
    assert child.model_type in DEEPSEEK_TYPES and len(child.mtp_blocks) == 2
    assert child.param_counts().total == bp["params"]["child_total"]
    assert child.kv_bytes_per_token() < _v3().kv_bytes_per_token()


DEEPSEEK_TYPES = ("deepseek_v3", "deepseek_v3_puzzle")


def test_hub_mtp_layer_tensors_are_skipped_others_refused(tmp_path):
    """Hub DeepSeek-V3 checkpoints store the MTP layer as model.layers.{num_hidden_layers}.*;
    they load (MTP is not built), while any other stray tensor is still refused."""
    torch = pytest.importorskip("torch")
    from safetensors.torch import load_file, save_file

    from nas.child import load_pretrained

    _hf_tiny().save_pretrained(tmp_path)
    f = tmp_path / "model.safetensors"
    sd = load_file(str(f))
    sd["model.layers.3.eh_proj.weight"] = torch.zeros(32, 64)  # 3 layers: index 3 is MTP
    save_file(sd, str(f), metadata={"format": "pt"})
    model = load_pretrained(tmp_path)
    assert len(model.arch.mtp_blocks) == 2
    sd["model.layers.4.eh_proj.weight"] = torch.zeros(32, 64)
    save_file(sd, str(f), metadata={"format": "pt"})
    with pytest.raises(InputError, match="unexpected tensor model.layers.4"):
        load_pretrained(tmp_path)


def test_build_cli_streams_a_transformers_parent(tmp_path, capsys):
    """``puzzle-nas build --parent`` on a folder transformers wrote (bf16, sharded): a child
    with a smaller latent, fewer heads and fewer experts builds block by block from the
    streamed parent, and its init report names the SVD / head / expert rules."""
    torch = pytest.importorskip("torch")
    from nas.child import load_pretrained
    from nas.cli import main

    theirs = _hf_tiny().to(torch.bfloat16)
    theirs.save_pretrained(tmp_path / "hf", max_shard_size="20KB")
    arch = load_config(tmp_path / "hf")
    blocks = list(arch.blocks)
    blocks[2] = blocks[2].model_copy(update={"kv_lora_rank": 8, "num_heads": 2})
    blocks[3] = blocks[3].model_copy(update={"num_experts": 4, "n_group": 2, "topk_group": 1})
    child_cfg = tmp_path / "child.json"
    child_cfg.write_text(json.dumps(to_hf(arch.replace_blocks(blocks))))
    calib = tmp_path / "calib.json"
    calib.write_text(json.dumps(torch.randint(2, 96, (2, 16)).tolist()))
    assert main(["build", str(child_cfg), "--parent", str(tmp_path / "hf"), "--calib",
                 str(calib), "-o", str(tmp_path / "child")]) == 0
    out = capsys.readouterr().out
    assert "kv_lora_rank 16 -> 8 by SVD" in out and "heads 4 -> 2" in out
    assert "experts 8 -> 4" in out
    child = load_pretrained(tmp_path / "child")
    assert child.embed.weight.dtype == torch.bfloat16
    assert child.arch.blocks == tuple(blocks)


def test_quantization_config_names_mla_and_gpt_oss_modules():
    """A per-block precision child's ModelOpt quantization_config lists the MLA projections
    (and its KV-cache format) and gpt-oss's stacked experts under their checkpoint names,
    and reads back per block."""
    from nas.search.quant_config import block_formats, quantization_config

    a = _v3()
    rec = ["fp8" if b.kind == "mla" else "nvfp4" if b.kind == "moe" else "bf16"
           for b in a.blocks]
    qc = quantization_config(a, rec, "deepseek_v3")
    assert qc["quantized_layers"]["model.layers.0.self_attn.kv_b_proj"] == {"quant_algo": "FP8"}
    assert qc["quantized_layers"]["model.layers.3.mlp.experts.*.gate_proj"]["quant_algo"] == \
        "NVFP4"
    assert block_formats(a, qc, "deepseek_v3")[0] == {"attention": "fp8", "kv_cache": "fp8"}
    g = load_config(DATA / "gpt-oss-20b.json")
    qg = quantization_config(g, ["bf16" if b.kind == "attention" else "fp8" for b in g.blocks],
                             "gpt_oss")
    assert set(qg["quantized_layers"]) == {f"model.layers.{i}.mlp.experts" for i in range(24)}


# Kimi-K2 (model_type kimi_k2, DeepseekV3ForCausalLM): the shape fields of
# moonshotai/Kimi-K2-Instruct's config.json (its README: "reuses DeepSeek-V3's architecture";
# "1 trillion total parameters, 32 billion activated"); RoPE scaling left out (it does not
# change counts).
KIMI_K2 = {
    "model_type": "kimi_k2", "architectures": ["DeepseekV3ForCausalLM"], "hidden_size": 7168,
    "vocab_size": 163840, "num_hidden_layers": 61, "num_attention_heads": 64,
    "num_key_value_heads": 64, "q_lora_rank": 1536, "kv_lora_rank": 512,
    "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "v_head_dim": 128,
    "intermediate_size": 18432, "moe_intermediate_size": 2048, "n_routed_experts": 384,
    "n_shared_experts": 1, "num_experts_per_tok": 8, "n_group": 1, "topk_group": 1,
    "first_k_dense_replace": 1, "routed_scaling_factor": 2.827, "norm_topk_prob": True,
    "scoring_func": "sigmoid", "topk_method": "noaux_tc", "rms_norm_eps": 1e-6,
    "rope_theta": 50000.0, "tie_word_embeddings": False, "num_nextn_predict_layers": 0,
}


def test_kimi_k2_counts_and_round_trip():
    a = from_hf(KIMI_K2)
    pc = a.param_counts()
    assert pc.total == 1_026_408_232_448  # published "1 trillion total"
    assert pc.active_without_embeddings == 31_687_095_808  # published "32B activated"
    assert round(pc.total / 1e12, 2) == 1.03 and round(pc.active_without_embeddings / 1e9) == 32
    assert a.kv_bytes_per_token() == _v3().kv_bytes_per_token()  # same latent, half the heads
    cfg = to_hf(a)
    assert cfg["model_type"] == "kimi_k2" and cfg["architectures"] == ["DeepseekV3ForCausalLM"]
    assert from_hf(json.loads(json.dumps(cfg))) == a


def test_hub_fp8_checkpoint_loads_unscaled(tmp_path):
    """A checkpoint in the Hub's DeepSeek-V3 layout (linear weights float8_e4m3fn plus a
    float32 ``weight_scale_inv`` per ``weight_block_size`` block, partial edge blocks
    included) loads with every weight = FP8 value x its block's scale: the logits equal those
    of transformers' model holding the same unscaled weights (computed here block by block)."""
    torch = pytest.importorskip("torch")
    from safetensors.torch import load_file, save_file
    from test_hf_parity import _prompt

    from nas.child import load_pretrained

    transformers = pytest.importorskip("transformers")
    _hf_tiny().save_pretrained(tmp_path)
    sd = load_file(str(tmp_path / "model.safetensors"))
    B = 16  # blocks of 16 x 16: the 24- and 48-wide matrices have partial edge blocks
    ref = {}
    for k in [k for k in sd if k.endswith(".weight") and sd[k].dim() == 2
              and (".self_attn." in k or ".mlp." in k) and ".mlp.gate." not in k]:
        w = sd[k]
        r, c = w.shape
        s = torch.zeros(-(-r // B), -(-c // B))
        for i in range(s.shape[0]):
            for j in range(s.shape[1]):
                s[i, j] = w[i * B:(i + 1) * B, j * B:(j + 1) * B].abs().max() / 448
        q = torch.empty_like(w, dtype=torch.float8_e4m3fn)
        back = torch.empty_like(w)
        for i in range(s.shape[0]):
            for j in range(s.shape[1]):
                blk = (slice(i * B, (i + 1) * B), slice(j * B, (j + 1) * B))
                q[blk] = (w[blk] / s[i, j]).to(torch.float8_e4m3fn)
                back[blk] = q[blk].float() * s[i, j]
        sd[k], sd[k + "_scale_inv"], ref[k] = q, s, back
    # the reference: the same checkpoint with the unscaled weights in float32
    (tmp_path / "ref").mkdir()
    (tmp_path / "ref" / "config.json").write_text((tmp_path / "config.json").read_text())
    save_file({k: ref.get(k, v) for k, v in sd.items() if not k.endswith("_scale_inv")},
              str(tmp_path / "ref" / "model.safetensors"), metadata={"format": "pt"})
    save_file(sd, str(tmp_path / "model.safetensors"), metadata={"format": "pt"})
    c = json.loads((tmp_path / "config.json").read_text())
    c["quantization_config"] = {"quant_method": "fp8", "fmt": "e4m3",
                                "activation_scheme": "dynamic", "weight_block_size": [B, B]}
    (tmp_path / "config.json").write_text(json.dumps(c))
    ours = load_pretrained(tmp_path).eval()
    assert ours.embed.weight.dtype == torch.float32
    theirs = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "ref").eval()
    with torch.no_grad():
        diff = float((ours(_prompt()) - theirs(_prompt()).logits).abs().max())
    assert diff <= 1e-4
    assert len(ref) > 10
    # saved again, the weights are plain tensors: the FP8 packing is not claimed any more
    from nas.child import save_pretrained

    save_pretrained(ours, tmp_path / "saved")
    assert "quantization_config" not in json.loads((tmp_path / "saved" / "config.json").read_text())
    again = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "saved").eval()
    with torch.no_grad():
        assert float((again(_prompt()).logits - theirs(_prompt()).logits).abs().max()) <= 1e-4


def test_absent_q_lora_rank_takes_transformers_default_explicit_null_means_none():
    transformers = pytest.importorskip("transformers")
    cfg = {k: v for k, v in json.loads(DSV3.read_text()).items() if k != "q_lora_rank"}
    assert from_hf(cfg).blocks[0].q_lora_rank == transformers.DeepseekV3Config().q_lora_rank
    assert from_hf({**cfg, "q_lora_rank": None}).blocks[0].q_lora_rank is None
