"""gpt-oss (``gpt_oss``: attention with learned sinks and alternating sliding windows, MoE with
biases and clamped SwiGLU, MXFP4 experts): config import and export, exact parameter counts
against the published totals, KV memory, MXFP4 weights, torch parity with transformers,
search axes and inheritance.

Published figures (cited where asserted): the gpt-oss-120b & gpt-oss-20b model card (OpenAI,
2025-08-05, arXiv 2508.10925), Table 1 "Model parameter counts": gpt-oss-120b total 116.83B,
active 5.13B ("MLP 114.71B, attention 0.96B, embed + unembed 1.16B"); gpt-oss-20b total 20.91B,
active 3.61B (MLP 19.12B, attention 0.64B). The card counts active parameters without the
input embedding table (an unembedding is counted). The Hub pages round these to "117B
parameters with 5.1B active" and "21B ... 3.6B active". ``tests/data/configs/gpt-oss-*.json``:
huggingface.co/openai/gpt-oss-{120b,20b} config.json.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import (
    check_cached_decode,
    check_inheritance_beats_random,
    check_unchanged_child_is_the_parent,
    search_example,
    tiny_parent_of,
    with_block,
)

from hwprofiles.errors import InputError
from nas.arch import Attention, MoE, NoOp
from nas.hf import from_hf, load_config, to_hf

DATA = Path(__file__).parent / "data" / "configs"
G120 = DATA / "gpt-oss-120b.json"
G20 = DATA / "gpt-oss-20b.json"


def test_import_shapes():
    a = load_config(G120)
    assert a.model_type == "gpt_oss" and a.num_blocks == 72
    att0, att1 = a.blocks[0], a.blocks[2]
    assert isinstance(att0, Attention) and att0.sinks and att0.qkv_bias and att0.o_bias
    assert (att0.num_heads, att0.num_kv_heads, att0.head_dim) == (64, 8, 64)
    assert (att0.sliding_window, att1.sliding_window) == (128, None)
    moe = a.blocks[1]
    assert isinstance(moe, MoE) and moe.router_linear_bias and moe.expert_bias
    assert (moe.num_experts, moe.top_k, moe.expert_width) == (128, 4, 2880)
    assert (moe.swiglu_limit, moe.swiglu_alpha) == (7.0, 1.702)


@pytest.mark.parametrize("path,total,active,pub_total,pub_active", [
    (G120, 116_829_156_672, 5_132_849_472, 116.83, 5.13),
    (G20, 20_914_757_184, 3_608_307_264, 20.91, 3.61),
])
def test_exact_counts_against_published(path, total, active, pub_total, pub_active):
    pc = load_config(path).param_counts()
    assert pc.total == total
    assert pc.active_without_embeddings == active
    assert round(pc.total / 1e9, 2) == pub_total
    assert round(pc.active_without_embeddings / 1e9, 2) == pub_active
    # the card's split: embed + unembed 1.16B; attention; MLP
    assert round((pc.embeddings + pc.lm_head) / 1e9, 2) == 1.16
    att = pc.by_kind_total["attention"]
    moe = pc.by_kind_total["moe"]
    layers = 36 if path == G120 else 24
    norms = layers * 2880  # the block pre-norms, which the card does not list apart
    assert round((att - norms / 2) / 1e9, 2) == (0.96 if path == G120 else 0.64)
    assert round((moe - norms / 2) / 1e9, 2) == (114.71 if path == G120 else 19.12)


@pytest.mark.parametrize("path", [G120, G20])
def test_round_trip_identity(path):
    a = load_config(path)
    cfg = to_hf(a)
    assert cfg["model_type"] == "gpt_oss"
    b = from_hf(json.loads(json.dumps(cfg)))
    assert b == a and to_hf(b) == cfg
    orig = json.loads(path.read_text())
    changed = {k for k in orig if cfg.get(k) != orig[k]}
    assert changed <= {"transformers_version"}


def test_heterogeneous_child_exports_as_puzzle():
    a = load_config(G20)
    blocks = list(a.blocks)
    blocks[2] = NoOp()
    blocks[3] = blocks[3].model_copy(update={"num_experts": 16, "expert_width": 1440})
    child = a.replace_blocks(blocks)
    with pytest.raises(InputError):
        to_hf(child, "gpt_oss")
    cfg = to_hf(child)
    assert cfg["model_type"] == "gpt_oss_puzzle"
    back = from_hf(json.loads(json.dumps(cfg)))
    assert back == child.model_copy(update={"model_type": "gpt_oss_puzzle",
                                            "hf_extra_json": back.hf_extra_json})
    assert to_hf(back) == cfg


@pytest.mark.parametrize("field,value,match", [
    ("experts_per_token", 2, "num_experts_per_tok"),
    ("layer_types", ["full_attention"], "layer types"),
    ("rope_scaling", None, "rope_scaling"),
    ("swiglu_limit", -1.0, "swiglu_limit"),
])
def test_bad_fields_named(field, value, match):
    cfg = {**json.loads(G20.read_text()), field: value}
    with pytest.raises(InputError, match=match) as e:
        from_hf(cfg, source="g20.json")
    assert "g20.json" in str(e.value)


def test_kv_memory_sinks_and_alternating_windows():
    """Sinks are one logit per head: no KV. Sliding layers hold at most 128 tokens, so at a
    128k context the 18 full layers hold all the KV but 18 x 128 tokens."""
    a = load_config(G120)
    per_layer_tok = 2 * 8 * 64 * 2  # K and V, 8 KV heads of 64, bf16
    assert a.kv_bytes_per_token("bf16") == 36 * per_layer_tok
    ctx = 131072
    assert a.kv_bytes(ctx, "bf16") == 18 * per_layer_tok * ctx + 18 * per_layer_tok * 128
    no_sinks = a.replace_blocks([b.model_copy(update={"sinks": False})
                                 if isinstance(b, Attention) else b for b in a.blocks])
    assert no_sinks.kv_bytes(ctx) == a.kv_bytes(ctx)
    assert a.param_counts().total - no_sinks.param_counts().total == 36 * 64


# ---- MXFP4 and memory ---------------------------------------------------------------------
def test_mxfp4_recipe_matches_the_published_checkpoint_sizes():
    """MXFP4: 32 E2M1 values (4 bits) share one E8M0 scale (8 bits): 4.25 bits per weight.
    The gpt-oss model card (Table 1) gives the checkpoint sizes: 60.8 GiB (120b), 12.8 GiB
    (20b) with the MoE weights in MXFP4 and the rest in BF16."""
    from costmodels.dtypes import DType, get_recipe

    assert DType.MXFP4.bytes * 8 == (32 * 4 + 8) / 32 == 4.25
    r = get_recipe("mxfp4")
    assert r.weight_dtype("routed_experts") == DType.MXFP4
    assert r.weight_dtype("attention") == DType.BF16 and r.kv_cache == DType.BF16
    assert round(load_config(G120).weight_bytes(r) / 2**30, 1) == 60.8
    assert round(load_config(G20).weight_bytes(r) / 2**30, 1) == 12.8


def test_priced_memory_caps_sliding_layers():
    import hwprofiles
    from costmodels.blocks import price_blocks
    from costmodels.dtypes import get_recipe

    a = load_config(G120)
    bc = price_blocks(a.table, hwprofiles.get("h200-sxm"), get_recipe("mxfp4"),
                      ["isl=131072,osl=1,batch=1"])
    kv = bc.memory_bytes[:, 0] - bc.weight_bytes
    per_tok = 2 * 8 * 64 * 2
    assert kv[0] == 128 * per_tok and kv[2] == (131072 + 1) * per_tok
    assert kv.sum() == a.kv_bytes(131073, "mxfp4")


# ---- torch modules: parity with transformers ------------------------------------------------
def _hf_tiny(seed: int = 0):
    transformers = pytest.importorskip("transformers")
    from test_hf_parity import random_hf_model

    cfg = transformers.GptOssConfig(
        vocab_size=96, hidden_size=32, num_hidden_layers=3, num_attention_heads=4,
        num_key_value_heads=2, head_dim=8, intermediate_size=16, num_local_experts=4,
        num_experts_per_tok=2, sliding_window=4, max_position_embeddings=512,
        tie_word_embeddings=False, bos_token_id=1, eos_token_id=None, pad_token_id=0,
        swiglu_limit=1.5,
        rope_parameters={"rope_type": "yarn", "rope_theta": 1.5e5, "factor": 8.0,
                         "beta_fast": 32.0, "beta_slow": 1.0, "truncate": False,
                         "original_max_position_embeddings": 64})
    return random_hf_model(cfg, seed)


def test_parity_theirs_to_ours(tmp_path):
    from test_hf_parity import check_theirs_to_ours

    ours = check_theirs_to_ours(_hf_tiny(), tmp_path)
    assert ours.arch.model_type == "gpt_oss"
    assert [getattr(b, "sliding_window", 0) for b in ours.arch.blocks[::2]] == [4, None, 4]


def test_parity_ours_to_theirs(tmp_path):
    pytest.importorskip("transformers")
    from test_hf_parity import check_ours_to_theirs

    _hf_tiny().save_pretrained(tmp_path / "ref")
    check_ours_to_theirs(load_config(tmp_path / "ref"), tmp_path)


def test_sinks_and_clamp_matter():
    """On these weights the sinks and the SwiGLU clamp both move the logits (the parity above
    is not blind to them), and decoding through the (ring) caches equals the full forward."""
    torch = pytest.importorskip("torch")
    from nas.child import from_transformers

    ours = from_transformers(_hf_tiny()).eval()
    prompt = torch.randint(2, 96, (2, 11), generator=torch.Generator().manual_seed(1))
    base, _ = check_cached_decode(ours, prompt, 6)
    with torch.no_grad():
        sinks = [b.mixer.sinks for b in ours.blocks[::2]]
        saved = [s.clone() for s in sinks]
        for s in sinks:
            s.fill_(-1e9)
        assert float((ours(prompt) - base).abs().max()) > 1e-2
        for s, v in zip(sinks, saved):
            s.copy_(v)
        moe = ours.blocks[1].mixer
        moe.cfg = moe.cfg.model_copy(update={"swiglu_limit": 1e9})
        assert float((ours(prompt) - base).abs().max()) > 1e-2


@pytest.mark.parametrize("mt", ["nemotron_h_puzzle", "qwen3_moe", "mixtral", "deepseek_v3"])
def test_other_types_refuse_sinks_and_biased_experts(mt):
    a = load_config(G20)
    with pytest.raises(InputError):  # by the writer or by the refusal in base_config
        to_hf(a, mt)


# ---- search axes and init_from_parent -------------------------------------------------------
@pytest.fixture(scope="module")
def tiny_parent():
    pytest.importorskip("torch")
    return tiny_parent_of(_hf_tiny(seed=5))


AXES = {
    "experts-4-to-2": (1, {"num_experts": 2}),
    "expert-width-16-to-6": (1, {"expert_width": 6}),
    "top-k-2-to-1": (3, {"top_k": 1}),
    "kv-heads-2-to-1": (2, {"num_kv_heads": 1}),
}


@pytest.mark.parametrize("axis", list(AXES))
def test_inheritance_beats_random_init(tiny_parent, axis):
    torch = pytest.importorskip("torch")
    parent, calib, held = tiny_parent
    i, upd = AXES[axis]
    child = check_inheritance_beats_random(parent, with_block(parent.arch, i, upd), i, calib,
                                           held, axis)
    if axis == "top-k-2-to-1":  # routing only: every tensor is the parent's
        sd, psd = child.state_dict(), parent.state_dict()
        assert all(torch.equal(sd[k], psd[k]) for k in psd)


def test_child_equal_to_parent_is_bitwise_equal(tiny_parent):
    pytest.importorskip("torch")
    check_unchanged_child_is_the_parent(*tiny_parent)


def test_search_axes_moe_and_attention():
    from nas.space import alternatives, check_all_used
    from nas.spec import SearchSpace

    a = load_config(G120)
    s = SearchSpace.model_validate({
        "attention": {"kv_heads": [4], "sliding_window": [128], "noop": True},
        "moe": {"experts": [64, 96], "top_k": [2], "expert_widths": [1440], "noop": True}})
    alts = alternatives(a, s)
    check_all_used(a, s, alts)
    full = [x.child for x in alts[2]]  # a full-attention layer: may become sliding
    assert any(isinstance(c, Attention) and c.sinks and c.sliding_window == 128 for c in full)
    assert any(isinstance(c, NoOp) for c in full)
    moes = [x.child for x in alts[1]]
    assert {c.num_experts for c in moes if isinstance(c, MoE)} == {128, 96, 64}
    assert all(c.expert_bias and c.swiglu_limit == 7.0 for c in moes if isinstance(c, MoE))
    assert len(moes) == 3 * 2 * 2 + 1


def test_shipped_example_search_runs(tmp_path):
    """examples/gpt-oss-120b-h100.json (without its sweep): the parent in MXFP4 does not fit
    12 requests of 128K tokens on one H100; the child fits and meets the throughput budget,
    and its config reads back with the sinks and biased experts."""
    bp = search_example("gpt-oss-120b-h100", tmp_path)
    assert bp["params"]["parent_total"] == 116_829_156_672
    child = from_hf(bp["child"])
    assert child.model_type in ("gpt_oss", "gpt_oss_puzzle")
    assert child.param_counts().total == bp["params"]["child_total"]
    assert all(b.sinks for b in child.blocks if isinstance(b, Attention))
    assert all(b.expert_bias for b in child.blocks if isinstance(b, MoE))


# ---- MXFP4-packed checkpoints (as the Hub publishes gpt-oss) --------------------------------
def test_unpack_mxfp4_closed_form():
    torch = pytest.importorskip("torch")
    from nas.child.formats.mxfp4 import unpack_mxfp4

    blocks = torch.zeros(1, 2, 1, 16, dtype=torch.uint8)
    blocks[0, 0, 0, 0] = 0x71  # low nibble 1 (0.5) first, then 7 (6.0)
    blocks[0, 1, 0, 15] = 0xF9  # 9 (-0.5), then 15 (-6.0): the block's last two values
    scales = torch.tensor([[[127 + 2], [127 - 1]]], dtype=torch.uint8)  # 2**2 and 2**-1
    w = unpack_mxfp4(blocks, scales)
    assert w.shape == (1, 32, 2)  # (experts, in = 32 values, out = rows)
    assert (w[0, 0, 0], w[0, 1, 0]) == (2.0, 24.0)
    assert (w[0, 30, 1], w[0, 31, 1]) == (-0.25, -3.0)
    assert int((w != 0).sum()) == 4


def hub_mxfp4_checkpoint(path, dtype=None):  # type: ignore[no-untyped-def]
    """A tiny random gpt-oss saved in the Hub's layout (experts as MXFP4 ``*_blocks`` /
    ``*_scales``, ``quantization_config.quant_method: mxfp4``) in ``dtype`` (default
    float32) for the tensors that are not quantized; returns ``path``."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from safetensors.torch import load_file, save_file
    from test_hf_parity import randomize

    cfg = transformers.GptOssConfig(
        vocab_size=96, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=16, intermediate_size=32, num_local_experts=4,
        num_experts_per_tok=2, sliding_window=4, max_position_embeddings=512,
        tie_word_embeddings=False, bos_token_id=1, eos_token_id=None, pad_token_id=0,
        rope_parameters={"rope_type": "yarn", "rope_theta": 1.5e5, "factor": 8.0,
                         "beta_fast": 32.0, "beta_slow": 1.0, "truncate": False,
                         "original_max_position_embeddings": 64})
    torch.manual_seed(0)
    m = transformers.AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
    randomize(m, 0)
    m.to(dtype or torch.float32).save_pretrained(path)
    sd = load_file(str(path / "model.safetensors"))
    g = torch.Generator().manual_seed(0)
    for k in [k for k in sd if k.endswith(("experts.gate_up_proj", "experts.down_proj"))]:
        E, rows_in, cols_out = sd.pop(k).shape  # (experts, in, out)
        sd[k + "_blocks"] = torch.randint(0, 256, (E, cols_out, rows_in // 32, 16),
                                          generator=g, dtype=torch.uint8)
        sd[k + "_scales"] = torch.randint(122, 126, (E, cols_out, rows_in // 32),
                                          generator=g, dtype=torch.uint8)
    save_file(sd, str(path / "model.safetensors"), metadata={"format": "pt"})
    c = json.loads((path / "config.json").read_text())
    c["quantization_config"] = {"quant_method": "mxfp4", "modules_to_not_convert": [
        "model.layers.*.self_attn", "model.layers.*.mlp.router", "model.embed_tokens",
        "lm_head"]}
    (path / "config.json").write_text(json.dumps(c))
    return path


def test_hub_mxfp4_checkpoint_loads_as_transformers_dequantizes_it(tmp_path):
    """A checkpoint in the Hub's gpt-oss layout (:func:`hub_mxfp4_checkpoint`) loads here,
    and the logits match the model transformers builds from the same files (its own MXFP4
    dequantization)."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from test_hf_parity import _prompt

    from nas.child import load_pretrained

    hub_mxfp4_checkpoint(tmp_path)
    theirs = transformers.AutoModelForCausalLM.from_pretrained(
        tmp_path, quantization_config=transformers.Mxfp4Config(dequantize=True),
        dtype=torch.float32).eval()
    ours = load_pretrained(tmp_path).eval()
    assert torch.equal(ours.blocks[1].mixer.experts.gate_up_proj,
                       theirs.model.layers[0].mlp.experts.gate_up_proj)
    with torch.no_grad():
        diff = float((ours(_prompt()) - theirs(_prompt()).logits).abs().max())
    assert diff <= 1e-4
    from nas.child import save_pretrained  # saved again: plain tensors, no MXFP4 claim

    save_pretrained(ours, tmp_path / "saved")
    assert "quantization_config" not in json.loads((tmp_path / "saved" / "config.json").read_text())
    again = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "saved").eval()
    with torch.no_grad():
        assert float((again(_prompt()).logits - theirs(_prompt()).logits).abs().max()) <= 1e-4
    from safetensors.torch import load_file, save_file

    sd = load_file(str(tmp_path / "model.safetensors"))
    (tmp_path / "model.safetensors").unlink()  # a blocks tensor without its scales
    del sd["model.layers.1.mlp.experts.down_proj_scales"]
    save_file(sd, str(tmp_path / "model.safetensors"), metadata={"format": "pt"})
    with pytest.raises(InputError, match="missing tensor model.layers.1.mlp.experts.down_proj"):
        load_pretrained(tmp_path)


def test_sink_attention_query_chunks_are_exact(monkeypatch):
    """Chunking the queries (bounded score memory) gives the same output as one product,
    up to float32 summation order: the chunks are GEMMs of other shapes, for which the BLAS
    may pick other kernels (a difference of 1.19e-6, one float32 step at logits of ~10, was
    measured under MKL_ENABLE_INSTRUCTIONS=SSE4_2), so the bound is a few float32 steps at
    the logits' scale, not an absolute figure below one step."""
    torch = pytest.importorskip("torch")
    import nas.modules.gpt_oss as go
    from nas.child import from_transformers

    ours = from_transformers(_hf_tiny()).eval()
    prompt = torch.randint(2, 96, (2, 13), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        whole = ours(prompt)
        monkeypatch.setattr(go, "QUERY_CHUNK", 4)
        chunked = ours(prompt)
    step = torch.finfo(torch.float32).eps * float(whole.abs().max())  # one float32 step
    assert float((whole - chunked).abs().max()) <= 8 * step


def test_absent_fields_take_transformers_defaults():
    """A config that leaves out head_dim, num_key_value_heads, sliding_window, layer_types,
    attention_bias and the SwiGLU constants reads as transformers' GptOssConfig fills them."""
    transformers = pytest.importorskip("transformers")
    cfg = {k: v for k, v in json.loads(G20.read_text()).items()
           if k not in ("head_dim", "num_key_value_heads", "sliding_window", "layer_types",
                        "attention_bias", "swiglu_limit")}
    hf = transformers.GptOssConfig(**{k: v for k, v in cfg.items()
                                      if k not in ("architectures", "model_type")})
    a = from_hf(cfg)
    att = [b for b in a.blocks if isinstance(b, Attention)]
    assert {(b.head_dim, b.num_kv_heads, b.qkv_bias) for b in att} == {
        (hf.head_dim, hf.num_key_value_heads, hf.attention_bias)}
    assert [b.sliding_window for b in att] == [
        hf.sliding_window if t == "sliding_attention" else None for t in hf.layer_types]
    moe = a.blocks[1]
    assert (moe.swiglu_limit, moe.swiglu_alpha) == (hf.swiglu_limit, hf.swiglu_alpha)
