"""Falcon-H1 (``falcon_h1``): attention and Mamba-2 in parallel within every layer
(:class:`nas.arch.Parallel`, ``Kind.PARALLEL``), with its muP multipliers.

Published sizes and configs (the counts below are exact; the published figures are the
size-class names of the model cards, tiiuae/Falcon-H1-{0.5B,3B,7B}-Base on the Hugging Face
Hub, and the transformers Falcon-H1 documentation's architecture table, depth / width /
heads / Mamba heads / head sizes / state: https://huggingface.co/docs/transformers/model_doc/falcon_h1):

* ``tests/data/configs/falcon-h1-0.5b.json``: tiiuae/Falcon-H1-0.5B-Instruct's config.json as
  NVIDIA Megatron-Bridge's Falcon-H1 bridge test reproduces it (every multiplier included),
  plus ``mamba_d_ssm: 1536`` (= 24 Mamba heads x 64, the documentation table's shape; that
  copy leaves the key out, and transformers' default 1024 would not load). Computed total
  521,411,104 (0.52B); without the embedding table and LM head (2 x 32,784 x 1,024)
  454,269,472 = "0.5B".
* ``tests/data/configs/falcon-h1-7b.json``: Falcon-H1-7B's sizes (hidden 3,072, 44 layers,
  12 query / 2 KV heads of 128, MLP 12,288, Mamba 24 heads x 128 = 3,072 channels, state
  256, 1 group, vocabulary 130,048, untied) as an open-source context-sizing tool's test
  reproduces the Hub config; its muP multipliers and ``mamba_rms_norm`` are not in that copy,
  so transformers' defaults apply (multipliers change no count or cost; the norm weight
  would add 44 x 3,072 = 135,168 parameters, 0.002 %). Computed total 7,585,513,568 (7.59B);
  the "7B" of the name is the count without the embedding table and LM head, 6,786,498,656
  (2 x 130,048 x 3,072 = 799,014,912 apart).
* Falcon-H1-3B (inline below, same source as the 7B: hidden 2,560, 32 layers, 10 / 2 heads of
  128, MLP 6,144, Mamba 32 x 128, state 256, vocabulary 65,536): total 3,149,256,192 = "3B".

Every count also equals transformers' own ``FalconH1ForCausalLM`` parameter count (built on
the meta device from the same config).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from hwprofiles.errors import InputError
from nas.arch import FFN, Attention, Mamba, ModelArch, NoOp, Parallel
from nas.hf import ExportError, from_hf, load_config, to_hf

DATA = Path(__file__).parent / "data" / "configs"
H05 = DATA / "falcon-h1-0.5b.json"
H7 = DATA / "falcon-h1-7b.json"
H3 = {"model_type": "falcon_h1", "hidden_size": 2560, "num_hidden_layers": 32,
      "num_attention_heads": 10, "num_key_value_heads": 2, "head_dim": 128,
      "intermediate_size": 6144, "vocab_size": 65536, "tie_word_embeddings": False,
      "mamba_d_state": 256, "mamba_n_groups": 1, "mamba_n_heads": 32, "mamba_d_head": 128,
      "mamba_d_ssm": 4096, "mamba_expand": 2, "mamba_d_conv": 4, "mamba_chunk_size": 128}

PUBLISHED = [  # (config, exact total, exact total without embeddings + LM head, name)
    (H05, 521_411_104, 454_269_472, 0.5),
    (H3, 3_149_256_192, 2_813_711_872, 3),
    (H7, 7_585_513_568, 6_786_498_656, 7),
]


def _cfg(src: Path | dict) -> dict:
    return json.loads(src.read_text()) if isinstance(src, Path) else dict(src)


@pytest.mark.parametrize("src,total,body,name", PUBLISHED, ids=["0.5B", "3B", "7B"])
def test_counts_pinned_to_the_published_sizes(src, total, body, name):
    arch = from_hf(_cfg(src))
    pc = arch.param_counts()
    assert pc.total == total and pc.total_without_embeddings == body
    assert round(body / 1e9, 1 if name < 1 else 0) == name  # the size in the model's name
    assert pc.active == pc.total  # dense: every parameter is active
    assert arch.kind_counts() == {"parallel": len(arch.blocks) // 2,
                                  "ffn": len(arch.blocks) // 2}


@pytest.mark.parametrize("src", [H05, H3, H7], ids=["0.5B", "3B", "7B"])
def test_counts_equal_transformers(src):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    cfg = {k: v for k, v in _cfg(src).items() if k not in ("architectures", "model_type",
                                                           "torch_dtype")}
    with torch.device("meta"):
        m = transformers.FalconH1ForCausalLM(transformers.FalconH1Config(**cfg))
    assert sum(p.numel() for p in m.parameters()) == from_hf(_cfg(src)).param_counts().total


def test_import_reads_every_multiplier_and_round_trips():
    arch = load_config(H05)
    par, ffn = arch.blocks[0], arch.blocks[1]
    assert isinstance(par, Parallel) and isinstance(ffn, FFN) and ffn.width == 2048
    assert par.attention == Attention(num_heads=8, num_kv_heads=2, head_dim=64)
    assert par.mamba == Mamba(num_heads=24, head_dim=64, state_size=128, n_groups=1)
    assert not par.mamba_rms_norm and not par.mamba_norm_before_gate
    m = arch.mup
    assert (m.embedding, m.lm_head, m.key, m.attention_out) == \
        (5.656854249492381, 0.0390625, 0.39062499999999994, 0.9375)
    assert (m.mlp_gate, m.mlp_down, m.ssm_in, m.ssm_out) == \
        (0.8838834764831844, 0.5859375, 1.25, 0.23570226039551587)
    assert m.ssm == (0.3535533905932738, 0.25, 0.3535533905932738, 0.5, 0.3535533905932738)
    assert arch.rope_theta == 1e11
    cfg = to_hf(arch)
    assert cfg["model_type"] == "falcon_h1" and "puzzle_layers" not in cfg
    src = _cfg(H05)
    for k in ("embedding_multiplier", "lm_head_multiplier", "mlp_multipliers",
              "ssm_multipliers", "key_multiplier", "mamba_d_ssm", "mamba_rms_norm"):
        assert cfg[k] == src[k], k
    assert from_hf(json.loads(json.dumps(cfg))) == arch


def test_heterogeneous_child_round_trips_and_other_types_refuse_it():
    arch = load_config(H7)
    b = list(arch.blocks)
    p0 = b[0]
    b[0] = p0.model_copy(update={"attention": None})  # Mamba-only layer
    b[2] = p0.model_copy(update={"mamba": None})  # attention-only layer
    b[4] = p0.model_copy(update={"attention": p0.attention.model_copy(
        update={"num_kv_heads": 1}), "mamba": p0.mamba.model_copy(update={"state_size": 128})})
    b[5] = b[5].model_copy(update={"width": 6144})
    b[7] = NoOp()
    child = arch.replace_blocks(b)
    cfg = to_hf(child)
    assert cfg["model_type"] == "falcon_h1" and len(cfg["puzzle_layers"]) == 44
    assert from_hf(json.loads(json.dumps(cfg))) == child
    for mt in ("nemotron_h_puzzle", "nemotron-nas", "granitemoehybrid", "llama"):
        with pytest.raises(ExportError):  # none of them holds it (nemotron_h_puzzle holds
            to_hf(child, mt)  # any sequence of other blocks: it says why)
    with pytest.raises(ExportError, match="parallel attention . Mamba|muP"):
        to_hf(child, "nemotron_h_puzzle")
    with pytest.raises(ExportError, match="muP"):  # the multipliers alone are not dropped
        to_hf(arch.replace_blocks([Attention(num_heads=4, num_kv_heads=2, head_dim=8),
                                   FFN(width=64)]), "llama")
    with pytest.raises(ValueError, match="neither"):
        Parallel(attention=None, mamba=None, mamba_rms_norm=False,
                 mamba_norm_before_gate=False)


def test_export_refusals_name_the_block():
    arch = load_config(H05)
    blocks = list(arch.blocks)
    blocks[5] = blocks[5].model_copy(update={"gated": False})
    with pytest.raises(ExportError, match="block 5: falcon_h1 MLPs are SwiGLU"):
        to_hf(arch.replace_blocks(blocks), "falcon_h1")
    blocks = list(arch.blocks)
    blocks[2] = FFN(width=64)
    with pytest.raises(ExportError, match="block 2: falcon_h1 has a parallel"):
        to_hf(arch.replace_blocks(blocks), "falcon_h1")


@pytest.mark.parametrize("key,value,match", [
    ("hidden_act", "gelu", "silu"),
    ("projectors_bias", True, "mamba_proj_bias"),
    ("attn_layer_indices", [0, 3], "every layer"),
    ("ssm_multipliers", [1.0, 1.0], "5 numbers"),
    ("mlp_multipliers", [1.0, "x"], "finite number"),
    ("lm_head_multiplier", 0.0, "lm_head"),
    ("key_multiplier", None, "key_multiplier"),  # transformers keeps None: it cannot run
    ("mamba_d_head", 100, "mamba_d_ssm"),
])
def test_unsupported_variants_are_named(key, value, match):
    cfg = dict(_cfg(H05), **{key: value})
    with pytest.raises(InputError, match=match) as exc:
        from_hf(cfg, source="falcon.json")
    assert "falcon.json" in str(exc.value)


# ---- memory and pricing ---------------------------------------------------------------
def test_kv_and_state_memory():
    arch = load_config(H7)
    # every layer's attention branch: 2 x 2 KV heads x 128, bf16
    assert arch.kv_bytes_per_token("bf16") == 44 * 2 * 2 * 128 * 2
    # every layer's Mamba branch: conv (3,072 + 2 x 256) x 3 taps + SSM 24 x 128 x 256, bf16
    # conv state and fp32 SSM state (the bf16 recipe's)
    from costmodels.dtypes import get_recipe

    r = get_recipe("bf16")
    per = (3072 + 512) * 3 * r.conv_state.bytes + 24 * 128 * 256 * r.ssm_state.bytes
    assert arch.state_bytes_per_sequence("bf16") == 44 * per
    b = list(arch.blocks)
    b[0] = b[0].model_copy(update={"attention": None})
    b[2] = b[2].model_copy(update={"mamba": None})
    child = arch.replace_blocks(b)
    assert child.kv_bytes_per_token("bf16") == 43 * 2 * 2 * 128 * 2
    assert child.state_bytes_per_sequence("bf16") == 43 * per


@pytest.mark.parametrize("tp", [1, 2])
def test_pricing_is_the_sum_of_the_two_branches(tp):
    """A parallel row prices as its attention branch plus its Mamba branch under one norm and
    one all-reduce; a dropped branch costs exactly nothing (the attention-only row prices as
    an attention block, the Mamba-only row as a Mamba block)."""
    import hwprofiles
    from costmodels.blocks import price_blocks
    from costmodels.dtypes import get_recipe
    from nas.arch import blocks_table

    p = load_config(H7).blocks[0]
    rows = [p, p.model_copy(update={"mamba": None}), p.model_copy(update={"attention": None}),
            p.attention, p.mamba, NoOp()]
    wl = ["isl=8192,osl=1024,concurrency=32", "isl=126976,osl=4096,batch=8"]
    c = price_blocks(blocks_table(rows, 3072), hwprofiles.get("h100-sxm"), get_recipe("fp8"),
                     wl, tp=tp)
    for f in ("prefill_s", "decode_s", "runtime_s"):
        v = getattr(c, f)
        np.testing.assert_allclose(v[1], v[3], rtol=1e-12)
        np.testing.assert_allclose(v[2], v[4], rtol=1e-12)
        # both branches, less one norm + residual and one all-reduce (one block's overhead)
        np.testing.assert_array_less(v[0], v[3] + v[4])
        assert np.all(v[0] > np.maximum(v[3], v[4]))
    assert c.kv_bytes_per_token[0] == c.kv_bytes_per_token[3] > 0 == c.kv_bytes_per_token[2]
    assert c.state_bytes_per_sequence[0] == c.state_bytes_per_sequence[4] \
        == c.state_bytes_per_sequence[2] > 0 == c.state_bytes_per_sequence[1]
    assert c.weight_bytes[1] == c.weight_bytes[3]  # same tensors: the mamba-only row lacks
    assert c.weight_bytes[2] < c.weight_bytes[4]  # only the norm weight (no mamba_rms_norm)


def test_max_concurrency_grows_when_attention_is_dropped():
    """At 128k tokens of context the KV cache dominates: Mamba-only layers (fixed-size
    state) in the first half of the model fit more sequences on one H100."""
    import hwprofiles
    from costmodels.blocks import price_blocks
    from costmodels.dtypes import get_recipe
    from costmodels.model import NonBlockShape, max_concurrency, price_nonblock

    arch = load_config(H7)
    b = [x.model_copy(update={"attention": None}) if isinstance(x, Parallel) and i < 44
         else x for i, x in enumerate(arch.blocks)]
    child = arch.replace_blocks(b)
    wl = ["isl=126976,osl=4096,concurrency=8"]
    hw, r = hwprofiles.get("h100-sxm"), get_recipe("fp8")
    nb = price_nonblock(NonBlockShape(arch.hidden_size, arch.vocab_size), hw, r, wl)
    n = [max_concurrency(price_blocks(a.table, hw, r, wl), nb, hw, 131072).max_concurrency
         for a in (arch, child)]
    assert n[1] > n[0] > 0


def test_tp_must_split_both_branches():
    arch = load_config(H7)
    arch.check_tp(4)  # 12 query heads split, 2 KV heads replicated, 24 Mamba heads split
    with pytest.raises(InputError, match="block 0's attention branch"):
        arch.check_tp(8)  # 8 does not divide 12 query heads
    with pytest.raises(InputError, match="Mamba heads"):
        arch.replace_blocks([arch.blocks[0].model_copy(update={"attention": None})]
                            ).check_tp(16)


# ---- search axes ---------------------------------------------------------------------------
def test_search_axes_and_unusable_values():
    from nas.space import alternatives, check_all_used
    from nas.spec import SearchSpace

    arch = load_config(H7)
    space = SearchSpace.model_validate({"parallel": {
        "kv_heads": [1], "mamba_heads": [16], "state_sizes": [128], "drop_attention": True,
        "drop_mamba": True, "noop": True}})
    alts = alternatives(arch, space)
    check_all_used(arch, space, alts)
    labels = [a.label for a in alts[0]]
    assert labels[:6] == ["parent", "state_size=128", "mamba_heads=16",
                          "mamba_heads=16,state_size=128", "mamba=drop", "num_kv_heads=1"]
    assert "attention=drop" in labels and "num_kv_heads=1,mamba=drop" in labels
    assert labels[-1] == "noop" and len(labels) == 3 * 5 - 1 + 1  # (2 KV + drop) x (4 + drop)
    assert [a.label for a in alts[1]] == ["parent"]  # the MLP: no axis asked
    for bad, match in (({"kv_heads": [5]}, "divide"), ({"mamba_heads": [48]}, "<= the Mamba"),
                       ({"state_sizes": [512]}, "state size")):
        sp = SearchSpace.model_validate({"parallel": bad})
        with pytest.raises(InputError, match=match):
            check_all_used(arch, sp, alternatives(arch, sp))


def test_shipped_example_search_runs(tmp_path):
    from conftest import search_example

    bp = search_example("falcon-h1-7b-h100", tmp_path)
    assert bp["params"]["parent_total"] == 7_585_513_568
    child = from_hf(bp["child"])
    assert child.param_counts().total == bp["params"]["child_total"]
    # the 128k-context memory budget: the child halves the KV heads of every layer
    pars = [b for b in child.blocks if isinstance(b, Parallel)]
    assert all(p.attention is None or p.attention.num_kv_heads == 1 for p in pars)


# ---- torch: parity with transformers, init_from_parent ----------------------------------
def _hf_config(**over):
    transformers = pytest.importorskip("transformers")
    kw = dict(vocab_size=96, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
              num_attention_heads=4, num_key_value_heads=2, head_dim=8, mamba_d_ssm=32,
              mamba_n_heads=4, mamba_d_head=8, mamba_n_groups=2, mamba_d_state=8,
              mamba_d_conv=4, mamba_chunk_size=8, mamba_rms_norm=True,
              mamba_norm_before_gate=False, attention_in_multiplier=1.2, key_multiplier=0.8,
              attention_out_multiplier=0.7, ssm_in_multiplier=1.1, ssm_out_multiplier=0.6,
              mlp_multipliers=[1.5, 0.5], ssm_multipliers=[0.9, 1.1, 0.8, 1.2, 1.3],
              embedding_multiplier=2.0, lm_head_multiplier=0.5, rope_theta=1e4,
              time_step_limit=(0.05, 2.0), tie_word_embeddings=False, bos_token_id=1,
              eos_token_id=None, pad_token_id=0, max_position_embeddings=256)
    kw.update(over)
    return transformers.FalconH1Config(**kw)


def _hf_model(seed: int = 0, **over):
    pytest.importorskip("transformers")
    from test_hf_parity import random_hf_model

    return random_hf_model(_hf_config(**over), seed)


VARIANTS = {  # the three Mamba norm variants; biases everywhere but the conv in one
    "norm-after-gate": {},
    "norm-before-gate-biases": {"mamba_norm_before_gate": True, "attention_bias": True,
                                "mlp_bias": True, "mamba_proj_bias": True,
                                "projectors_bias": True, "mamba_conv_bias": False},
    "no-norm": {"mamba_rms_norm": False},
}


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_parity_both_ways(variant, tmp_path):
    pytest.importorskip("torch")
    from test_hf_parity import check_ours_to_theirs, check_theirs_to_ours

    ours = check_theirs_to_ours(_hf_model(**VARIANTS[variant]), tmp_path)
    assert ours.arch.mup is not None and ours.arch.hf_extra["time_step_limit"] == [0.05, 2.0]
    check_ours_to_theirs(load_config(tmp_path / "hf"), tmp_path)


MUP_KEYS = ("embedding_multiplier", "lm_head_multiplier", "attention_in_multiplier",
            "key_multiplier", "attention_out_multiplier", "ssm_in_multiplier",
            "ssm_out_multiplier", "mlp_multipliers", "ssm_multipliers")


def test_absent_multipliers_compute_as_transformers_reads_them(tmp_path):
    """A Falcon-H1 file without the muP multipliers (as the Hub copies of the 3B / 7B
    configs in tests/data): transformers computes with FalconH1Config's defaults (1.0, null
    lists [1.0] * n), the import takes exactly those and the logits equal transformers' on
    that very file."""
    pytest.importorskip("torch")
    from test_hf_parity import _check, _prompt

    from nas.child import load_pretrained

    theirs = _hf_model()
    theirs.save_pretrained(tmp_path / "hf")
    cfg = json.loads((tmp_path / "hf" / "config.json").read_text())
    for k in MUP_KEYS:
        del cfg[k]
    cfg["ssm_multipliers"] = None
    (tmp_path / "hf" / "config.json").write_text(json.dumps(cfg))
    again = type(theirs).from_pretrained(tmp_path / "hf").eval()
    ours = load_pretrained(tmp_path / "hf").eval()
    m = ours.arch.mup
    assert (m.embedding, m.lm_head, m.key, m.mlp_gate, m.ssm) == (1.0, 1.0, 1.0, 1.0, (1.0,) * 5)
    _check(ours, again, _prompt())


def test_multipliers_change_the_logits(tmp_path):
    """Every muP multiplier is computed: dropping them moves the logits far."""
    torch = pytest.importorskip("torch")
    from test_hf_parity import _prompt

    from nas.child import load_pretrained

    _hf_model().save_pretrained(tmp_path / "hf")
    ours = load_pretrained(tmp_path / "hf").eval()
    plain = ours.arch.model_copy(update={"mup": None})
    from nas.modules.model import CausalLM

    other = CausalLM(plain).eval()
    other.load_state_dict(ours.state_dict())
    with torch.no_grad():
        assert float((ours(_prompt()) - other(_prompt())).abs().max()) > 1e-1


@pytest.fixture(scope="module")
def tiny_parent():
    pytest.importorskip("torch")
    from conftest import tiny_parent_of

    return tiny_parent_of(_hf_model(seed=5))


AXES = {
    "kv-heads-2-to-1": lambda p: p.model_copy(update={
        "attention": p.attention.model_copy(update={"num_kv_heads": 1})}),
    "mamba-heads-4-to-2": lambda p: p.model_copy(update={
        "mamba": p.mamba.model_copy(update={"num_heads": 2})}),
    "state-8-to-4": lambda p: p.model_copy(update={
        "mamba": p.mamba.model_copy(update={"state_size": 4})}),
    "drop-attention": lambda p: p.model_copy(update={"attention": None}),
    "drop-mamba": lambda p: p.model_copy(update={"mamba": None}),
    "ffn-48-to-24": None,
}


@pytest.mark.parametrize("axis", list(AXES))
def test_init_from_parent_beats_random_init(tiny_parent, axis):
    pytest.importorskip("torch")
    from conftest import check_inheritance_beats_random

    parent, calib, held = tiny_parent
    i = 3 if axis.startswith("ffn") else 2
    blocks = list(parent.arch.blocks)
    blocks[i] = blocks[i].model_copy(update={"width": 24}) if axis.startswith("ffn") \
        else AXES[axis](blocks[i])
    check_inheritance_beats_random(parent, parent.arch.replace_blocks(blocks), i, calib, held,
                                   axis)


def test_searched_child_checkpoint_round_trips(tiny_parent, tmp_path):
    """A child with a Mamba-only layer, an attention-only layer and a narrower MLP saves as
    falcon_h1 (puzzle_layers) and loads back with the same logits."""
    torch = pytest.importorskip("torch")
    from nas.child import init_from_parent, load_pretrained, save_pretrained

    parent, calib, held = tiny_parent
    b = list(parent.arch.blocks)
    b[0] = b[0].model_copy(update={"attention": None})
    b[1] = b[1].model_copy(update={"width": 24})
    b[2] = b[2].model_copy(update={"mamba": None})
    child = init_from_parent(parent.arch.replace_blocks(b), parent, calib)
    save_pretrained(child, tmp_path / "child")
    cfg = json.loads((tmp_path / "child" / "config.json").read_text())
    assert cfg["model_type"] == "falcon_h1" and len(cfg["puzzle_layers"]) == 2
    again = load_pretrained(tmp_path / "child").eval()
    with torch.no_grad():
        assert torch.equal(again(held), child.eval()(held))


def test_unchanged_child_is_the_parent(tiny_parent):
    pytest.importorskip("torch")
    from conftest import check_unchanged_child_is_the_parent

    check_unchanged_child_is_the_parent(*tiny_parent)


def test_quantization_config_names_the_checkpoint_modules(tiny_parent):
    """A Falcon-H1 child's ModelOpt-style quantization_config names both branches' modules
    (``self_attn.*`` and ``mamba.*`` of a parallel block, ``feed_forward.*``), each pattern
    matches a saved tensor, the KV-cache format covers the attention branches, and it reads
    back per block."""
    from nas.child import build_model, hf_layout
    from nas.search.quant_config import block_formats, expand, quantization_config

    parent = tiny_parent[0]
    b = list(parent.arch.blocks)
    b[2] = b[2].model_copy(update={"attention": None})
    arch = parent.arch.replace_blocks(b)
    qc = quantization_config(arch, ["fp8", "nvfp4", "fp8", "bf16"], "falcon_h1")
    layers = qc["quantized_layers"]
    assert {"model.layers.0.self_attn.q_proj", "model.layers.0.mamba.in_proj",
            "model.layers.0.feed_forward.gate_proj", "model.layers.1.mamba.out_proj"} \
        <= set(layers)
    assert not any("layers.1.self_attn" in k or "layers.1.feed_forward" in k for k in layers)
    assert qc["kv_cache_quant_algo"] == "FP8"  # the one attention branch left
    names = [n for _, n, _ in hf_layout(build_model(arch), "falcon_h1")]
    assert len(expand(qc, names)) == 6 + 3 + 2
    assert [f.get("attention") or f.get("mamba") or f.get("ffn")
            for f in block_formats(arch, qc, "falcon_h1")] == ["fp8", "nvfp4", "fp8", None]


def test_model_arch_is_plain_data():
    """The parallel block and the multipliers are plain (JSON) data of the architecture."""
    arch = load_config(H05)
    again = ModelArch.model_validate_json(arch.model_dump_json())
    assert again == arch and again.table.kind[0] == 9
