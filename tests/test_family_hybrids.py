"""Mamba hybrids under other config dialects (``nas.hf.hybrids``).

``granitemoehybrid`` (IBM Granite-4.0-H): imports, exports, counts, prices and searches; its
torch model computes Granite's embedding / residual / logits multipliers and attention scale
and reads / writes its fused expert tensors (``input_linear``): logits parity with
transformers' ``GraniteMoeHybridForCausalLM`` both ways, init_from_parent on every axis the
shipped example searches, ``puzzle-nas build`` from a transformers-written parent
(``falcon_h1``, parallel attention + Mamba within a layer: ``tests/test_family_falcon_h1.py``;
``jamba``: ``tests/test_family_jamba.py``).

Granite-4.0-H-Small (https://huggingface.co/ibm-granite/granite-4.0-h-small, model card and
IBM's Granite 4.0 announcement: "32B total parameters, 9B active"). The sizes in
``tests/data/configs/granite-4.0-h-small.json`` (hidden 4096, 40 layers: 36 Mamba-2 + 4
attention, 32 heads / 8 KV, 72 experts top-10 of width 768, shared MLP 1536, Mamba 128 heads
x 64, state 128, vocabulary 100,352, tied embeddings) are the Hub config's; the order of the
4 attention layers and the multipliers do not change any count. Computed: total
32,207,337,984 = 32B; active 8,803,121,664 = 9B (10 of 72 experts, the shared MLP and every
mixer, with the tied embedding / LM head counted once).
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
from nas.arch import Mamba, MoE, NoOp
from nas.hf import from_hf, load_config, to_hf

GRANITE = Path(__file__).parent / "data" / "configs" / "granite-4.0-h-small.json"

try:  # one thread, as tests/test_build.py: two torch threads per process oversubscribe a
    import torch  # shared 2-core CI box and tiny ops get ~30x slower

    torch.set_num_threads(1)
except ImportError:  # the config-level tests run without torch
    pass


def test_granite_counts_memory_and_round_trip():
    arch = load_config(GRANITE)
    assert arch.kind_counts() == {"mamba": 36, "attention": 4, "moe": 40}
    pc = arch.param_counts()
    assert pc.total == 32_207_337_984 and round(pc.total / 1e9) == 32
    assert pc.active == 8_803_121_664 and round(pc.active / 1e9) == 9
    att = arch.blocks[10]
    assert not att.rope and att.num_kv_heads == 8  # position_embedding_type "nope"
    assert arch.kv_bytes_per_token("bf16") == 4 * 2 * 8 * 128 * 2  # 16,384
    mamba = arch.blocks[0]
    assert isinstance(mamba, Mamba) and (mamba.num_heads, mamba.head_dim) == (128, 64)
    moe = arch.blocks[1]
    assert isinstance(moe, MoE) and not moe.shared_gate and moe.shared_width == 1536
    cfg = to_hf(arch)
    assert cfg["model_type"] == "granitemoehybrid" and cfg["embedding_multiplier"] == 12
    assert from_hf(json.loads(json.dumps(cfg))) == arch


def test_granite_time_step_limit_reads_as_transformers_decodes_it():
    """The Mamba dt clamp is read by the one reader falcon_h1 uses: transformers' spelling of
    an infinite bound is no clamp, a finite one is kept, anything else is refused by name."""
    cfg = json.loads(GRANITE.read_text())
    cfg["time_step_limit"] = [0.0, {"__float__": "Infinity"}]
    assert "time_step_limit" not in from_hf(cfg).hf_extra
    cfg["time_step_limit"] = [0.01, 2]
    assert from_hf(cfg).hf_extra["time_step_limit"] == [0.01, 2.0]
    for bad in ([0.0, {"__float__": "inf"}], [2.0, 1.0], [0.5]):
        cfg["time_step_limit"] = bad
        with pytest.raises(InputError, match="time_step_limit"):
            from_hf(cfg)


def test_granite_export_refusals_name_the_block():
    arch = load_config(GRANITE)
    blocks = list(arch.blocks)
    blocks[7] = blocks[7].model_copy(update={"norm_topk": False})
    with pytest.raises(InputError, match="block 7: granitemoehybrid experts"):
        to_hf(arch.replace_blocks(blocks), "granitemoehybrid")


def test_granite_child_round_trip_and_pricing():
    import hwprofiles
    from costmodels.dtypes import get_recipe
    from costmodels.model import NonBlockShape, price_model

    arch = load_config(GRANITE)
    blocks = list(arch.blocks)
    blocks[0] = blocks[0].model_copy(update={"num_heads": 96})
    blocks[1] = blocks[1].model_copy(update={"num_experts": 48, "top_k": 6})
    blocks[2] = NoOp()
    child = arch.replace_blocks(blocks)
    cfg = to_hf(child)
    assert cfg["model_type"] == "granitemoehybrid" and len(cfg["puzzle_layers"]) == 40
    assert from_hf(json.loads(json.dumps(cfg))) == child
    hw = hwprofiles.get("h100-sxm")
    wl = ["isl=8192,osl=1024,concurrency=16"]
    p = price_model(arch.table, NonBlockShape(arch.hidden_size, arch.vocab_size), hw,
                    get_recipe("fp8"), wl)
    c = price_model(child.table, NonBlockShape(arch.hidden_size, arch.vocab_size), hw,
                    get_recipe("fp8"), wl)
    assert float(c.tpot_s[0]) < float(p.tpot_s[0])


# ---- torch model: parity with transformers' granitemoehybrid --------------------------------
TINY = dict(vocab_size=96, hidden_size=32, num_hidden_layers=4, num_attention_heads=4,
            num_key_value_heads=2, intermediate_size=16, shared_intermediate_size=24,
            num_local_experts=4, num_experts_per_tok=2,
            layer_types=["mamba", "attention", "mamba", "attention"], mamba_n_heads=4,
            mamba_d_head=16, mamba_d_state=8, mamba_n_groups=2, mamba_d_conv=4, mamba_expand=2,
            mamba_chunk_size=8, embedding_multiplier=3.0, residual_multiplier=0.4,
            logits_scaling=2.5, attention_multiplier=0.09, position_embedding_type="nope",
            tie_word_embeddings=False, bos_token_id=1, eos_token_id=None, pad_token_id=0)
"""A tiny Granite-4.0-H: Mamba-2 (2 groups) and NoPE attention layers, MoE + shared MLP, and
multipliers far from 1 (Granite-4.0-H-Small's are 12, 0.22, 8 and 1/128)."""


def _hf_granite(seed: int = 0, **over):
    transformers = pytest.importorskip("transformers")
    from test_hf_parity import random_hf_model

    cfg = transformers.GraniteMoeHybridConfig(**{**TINY, **over})
    return random_hf_model(cfg, seed)


@pytest.mark.parametrize("over", [{}, {"num_local_experts": 0, "position_embedding_type": "rope",
                                       "tie_word_embeddings": True}],
                         ids=["moe-nope", "dense-rope-tied"])
def test_granite_parity_theirs_to_ours(over, tmp_path):
    """A transformers Granite checkpoint (fused input_linear experts, shared MLP, Mamba and
    attention layers) loads here and computes its logits and greedy generations."""
    from test_hf_parity import check_theirs_to_ours

    ours = check_theirs_to_ours(_hf_granite(**over), tmp_path)
    assert ours.arch.model_type == "granitemoehybrid"


def test_granite_parity_ours_to_theirs(tmp_path):
    pytest.importorskip("transformers")
    from test_hf_parity import check_ours_to_theirs

    _hf_granite().save_pretrained(tmp_path / "ref")
    ours = check_ours_to_theirs(load_config(tmp_path / "ref"), tmp_path)
    cfg = json.loads((tmp_path / "ours" / "config.json").read_text())
    assert (cfg["embedding_multiplier"], cfg["residual_multiplier"], cfg["logits_scaling"],
            cfg["attention_multiplier"]) == (3.0, 0.4, 2.5, 0.09)
    assert ours.num_stored() == ours.arch.param_counts().total


def test_granite_multipliers_all_matter():
    """Each of the four multipliers moves the logits on these weights (the parity above is
    not blind to any of them), and decoding through the caches equals the full forward."""
    torch = pytest.importorskip("torch")
    from nas.child import from_transformers
    from nas.modules.granite import Scalars

    ours = from_transformers(_hf_granite()).eval()
    prompt = torch.randint(2, 96, (2, 11), generator=torch.Generator().manual_seed(1))
    base, _ = check_cached_decode(ours, prompt, 6)
    with torch.no_grad():
        s = ours.scalars
        for ident in ({"embedding": 1.0}, {"logits_divisor": 1.0}):
            ours.scalars = Scalars(**{**s.__dict__, **ident})
            assert float((ours(prompt) - base).abs().max()) > 1e-2, ident
        ours.scalars = s
        for blk in ours.blocks:
            blk.residual_multiplier = 1.0
        assert float((ours(prompt) - base).abs().max()) > 1e-2
        for blk in ours.blocks:
            blk.residual_multiplier = 0.4
            if hasattr(blk.mixer, "scale"):
                blk.mixer.scale = None
        assert float((ours(prompt) - base).abs().max()) > 1e-2


MULTIPLIERS = ("embedding_multiplier", "residual_multiplier", "logits_scaling",
               "attention_multiplier")


def test_granite_absent_multipliers_compute_as_transformers_reads_them(tmp_path):
    """A Granite config that leaves the multipliers out: transformers computes with its
    GraniteMoeHybridConfig defaults (1.0 each, so a softmax scale of 1, not 1/sqrt(d)); the
    import takes exactly those (written back on export) and the logits equal transformers'
    on that very file."""
    torch = pytest.importorskip("torch")
    from test_hf_parity import _check, _prompt

    from nas.child import load_pretrained

    theirs = _hf_granite(**{k: 1.0 for k in MULTIPLIERS})
    theirs.save_pretrained(tmp_path / "hf")
    cfg = json.loads((tmp_path / "hf" / "config.json").read_text())
    for k in MULTIPLIERS:
        del cfg[k]
    (tmp_path / "hf" / "config.json").write_text(json.dumps(cfg))
    again = type(theirs).from_pretrained(tmp_path / "hf").eval()
    assert [getattr(again.config, k) for k in MULTIPLIERS] == [1.0] * 4
    ours = load_pretrained(tmp_path / "hf").eval()
    assert [ours.arch.hf_extra[k] for k in MULTIPLIERS] == [1.0] * 4
    assert all(to_hf(ours.arch)[k] == 1.0 for k in MULTIPLIERS)
    assert ours.scalars.attention_scale == 1.0
    _check(ours, again, _prompt())
    with torch.no_grad():  # not blind: the file's own numerics differ from TINY's
        other = _hf_granite()
        other.load_state_dict(theirs.state_dict())
        assert float((ours(_prompt()) - other(_prompt()).logits).abs().max()) > 1e-2


@pytest.mark.parametrize("field", MULTIPLIERS)
def test_granite_null_or_bad_multiplier_is_named(field):
    """transformers keeps a null multiplier as None and cannot run the model: refused by
    name at import, as is a non-number."""
    cfg = json.loads(GRANITE.read_text())
    for bad in (None, "12", True):
        cfg[field] = bad
        with pytest.raises(InputError, match=field):
            from_hf(cfg)


def test_other_types_export_as_granite_with_unit_multipliers():
    """A non-Granite architecture written as granitemoehybrid states its (identity) numerics
    instead of leaving transformers to default them."""
    from nas.arch import FFN, Attention, ModelArch

    a = ModelArch(hidden_size=64, vocab_size=128, model_type="llama", blocks=(
        Attention(num_heads=4, num_kv_heads=2, head_dim=16, rope=False),
        FFN(width=96, gated=True, activation="silu")))
    cfg = to_hf(a, "granitemoehybrid")
    assert all(cfg[k] == 1.0 for k in ("embedding_multiplier", "residual_multiplier",
                                       "logits_scaling", "attention_multiplier"))
    assert cfg["num_local_experts"] == 0


# ---- init_from_parent on Granite's axes --------------------------------------------------
@pytest.fixture(scope="module")
def granite_parent():
    pytest.importorskip("torch")
    return tiny_parent_of(_hf_granite(seed=5))


AXES = {  # the axes the shipped example searches, at the tiny model's sizes
    "mamba-heads-4-to-2": (0, {"num_heads": 2}),
    "mamba-state-8-to-4": (4, {"state_size": 4}),
    "kv-heads-2-to-1": (2, {"num_kv_heads": 1}),
    "experts-4-to-2": (1, {"num_experts": 2}),
    "expert-width-16-to-8": (3, {"expert_width": 8}),
    "shared-width-24-to-12": (5, {"shared_width": 12}),
    "top-k-2-to-1": (7, {"top_k": 1}),
}


@pytest.mark.parametrize("axis", list(AXES))
def test_granite_inheritance_beats_random_init(granite_parent, axis):
    torch = pytest.importorskip("torch")
    parent, calib, held = granite_parent
    i, upd = AXES[axis]
    child = check_inheritance_beats_random(parent, with_block(parent.arch, i, upd), i, calib,
                                           held, axis)
    if axis == "top-k-2-to-1":  # routing only: every tensor is the parent's
        sd, psd = child.state_dict(), parent.state_dict()
        assert all(torch.equal(sd[k], psd[k]) for k in psd)


def test_granite_child_equal_to_parent_is_bitwise_equal(granite_parent):
    pytest.importorskip("torch")
    check_unchanged_child_is_the_parent(*granite_parent)


def test_granite_bld_trains_the_scaled_branch(granite_parent):
    """Block-local distillation fits the residual branch the block adds, which Granite
    scales by residual_multiplier: the parent's own block fits its residual exactly."""
    import copy
    from types import SimpleNamespace

    torch = pytest.importorskip("torch")
    from nas.scoring.bld import train_block

    parent, calib, _ = granite_parent
    with torch.no_grad():
        x = parent.embed_tokens(calib)
        y = parent.blocks[0](x) - x
    settings = SimpleNamespace(bld_steps=1, bld_lr=0.0, bld_batch=2)
    out = train_block(copy.deepcopy(parent.blocks[0]), x, y, settings, seed=0)
    assert out["bld_loss"] < 1e-10


def test_granite_build_cli_from_a_transformers_parent(tmp_path, capsys):
    """``puzzle-nas build --parent`` on a Granite folder transformers wrote (bf16): a
    heterogeneous child (fewer Mamba heads, a no-op MoE, fewer experts) is written with the
    puzzle_layers extension, reads back here with the same logits, and a homogeneous child
    loads in transformers with the same logits."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from test_hf_parity import _prompt

    from nas.child import load_pretrained
    from nas.cli import main

    _hf_granite(seed=2).to(torch.bfloat16).save_pretrained(tmp_path / "hf")
    calib = tmp_path / "calib.json"
    calib.write_text(json.dumps(_prompt().tolist()))
    arch = load_config(tmp_path / "hf")
    blocks = list(arch.blocks)
    blocks[0] = blocks[0].model_copy(update={"num_heads": 2})
    blocks[1] = NoOp()
    blocks[5] = blocks[5].model_copy(update={"num_experts": 3})
    hetero = arch.replace_blocks(blocks)
    homo = arch.replace_blocks([b.model_copy(update={"num_experts": 3, "top_k": 1})
                                if isinstance(b, MoE) else b for b in arch.blocks])
    for child, name in [(hetero, "hetero"), (homo, "homo")]:
        (tmp_path / f"{name}.json").write_text(json.dumps(to_hf(child)))
        assert main(["build", str(tmp_path / f"{name}.json"), "--parent", str(tmp_path / "hf"),
                     "--calib", str(calib), "-o", str(tmp_path / name)]) == 0
    out = capsys.readouterr().out
    assert "heads 4 -> 2" in out and "experts 4 -> 3" in out
    cfg = json.loads((tmp_path / "hetero" / "config.json").read_text())
    assert cfg["model_type"] == "granitemoehybrid" and len(cfg["puzzle_layers"]) == 4
    ours = load_pretrained(tmp_path / "hetero")
    assert ours.arch.blocks == hetero.blocks and ours.embed.weight.dtype == torch.bfloat16
    homo_ours = load_pretrained(tmp_path / "homo", dtype=torch.float32).eval()
    theirs = transformers.AutoModelForCausalLM.from_pretrained(
        tmp_path / "homo", dtype=torch.float32).eval()
    with torch.no_grad():
        diff = float((homo_ours(_prompt(5)) - theirs(_prompt(5)).logits).abs().max())
    assert diff <= 1e-4


def test_granite_fused_tensors_are_quantized_by_role():
    """Precision: the fused experts / shared MLP are fake-quantized in their roles (a dense
    layer's shared_mlp is its FFN), and the ModelOpt-style quantization_config names the
    checkpoint's modules (experts as the one fused input_linear / output_linear module),
    every entry matching a saved tensor, read back per block."""
    pytest.importorskip("torch")
    from costmodels.dtypes import DType, PrecisionRecipe, TensorRole
    from nas.arch import FFN, Attention
    from nas.child import build_model, hf_layout
    from nas.scoring.fakequant import quantize_block
    from nas.search.quant_config import block_formats, expand, quantization_config

    arch = from_hf({**TINY, "model_type": "granitemoehybrid"}).model_copy(update={"blocks": (
        Mamba(num_heads=4, head_dim=16, state_size=8, n_groups=2),
        MoE(num_experts=4, top_k=2, expert_width=16, shared_width=24, norm_topk=True),
        Attention(num_heads=4, num_kv_heads=2, head_dim=8, rope=False),
        FFN(width=24, gated=True))})
    model = build_model(arch)
    rec = PrecisionRecipe(default=DType.BF16, weights={TensorRole.ROUTED_EXPERTS: DType.FP8,
                                                       TensorRole.FFN: DType.FP8})
    moe = quantize_block(model.blocks[1], rec)
    assert moe["mixer.block_sparse_moe.input_linear.weight"] == "fp8"
    assert moe["mixer.shared_mlp.input_linear.weight"] == "bf16"  # shared experts: bf16
    assert quantize_block(model.blocks[3], rec)["mixer.shared_mlp.input_linear.weight"] == "fp8"
    qc = quantization_config(arch, ["fp8", "nvfp4", "fp8", "bf16"], "granitemoehybrid")
    assert {"model.layers.0.mamba.in_proj", "model.layers.0.block_sparse_moe.input_linear",
            "model.layers.0.shared_mlp.output_linear", "model.layers.1.self_attn.q_proj",
            } <= set(qc["quantized_layers"])
    names = [n for _, n, _ in hf_layout(model, "granitemoehybrid")]
    assert len(expand(qc, names)) == len(qc["quantized_layers"]) == 2 + 4 + 4
    assert [f.get("mamba") or f.get("routed_experts") or f.get("attention")
            for f in block_formats(arch, qc, "granitemoehybrid")] == ["fp8", "nvfp4", "fp8",
                                                                       None]


def test_refused_families_say_why(monkeypatch):
    """A type in REFUSED_TYPES is refused at import with its reason (none is refused today:
    falcon_h1 imports, tests/test_family_falcon_h1.py; jamba too)."""
    from nas.hf import REFUSED_TYPES

    monkeypatch.setitem(REFUSED_TYPES, "some_hybrid", "some_hybrid runs its mixers in a way "
                        "this library does not compute")
    with pytest.raises(InputError, match="does not compute") as exc:
        from_hf({"model_type": "some_hybrid", "hidden_size": 64, "vocab_size": 128},
                source="cfg.json")
    assert "cfg.json" in str(exc.value)


@pytest.mark.parametrize("name,parent_total", [("granite-4.0-h-small-h100", 32_207_337_984),
                                               ("qwen3.5-35b-a3b-h100", 34_660_610_688)])
def test_shipped_example_searches_run(name, parent_total, tmp_path):
    """The shipped examples search (prior scores): every budget holds, the child's config
    reads back with the counts the blueprint states."""
    bp = search_example(name, tmp_path, sweep=True)
    assert bp["params"]["parent_total"] == parent_total
    assert from_hf(bp["child"]).param_counts().total == bp["params"]["child_total"] \
        < parent_total
