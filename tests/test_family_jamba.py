"""Jamba (``jamba``): Mamba-1 / attention hybrids with a MoE every other layer.

Published figures:

* Jamba-v0.1 (model card https://huggingface.co/ai21labs/Jamba-v0.1: "12B active parameters
  and a total of 52B parameters across all experts"; arXiv 2403.19887, Table 1: "Jamba 12B
  active / 52B available, KV cache (256K context, 16bit) 4GB");
* Jamba-1.5-Mini and -Large (model card https://huggingface.co/ai21labs/AI21-Jamba-1.5-Mini:
  "Jamba 1.5 Mini has 12B active and 52B total parameters", "Jamba 1.5 Large has 94B active
  and 398B total parameters"; arXiv 2408.12570, Table 1: KV cache at 256K 4GB and 9GB).

Configs in ``tests/data/configs/``: ``jamba-1.5-mini.json`` is the Hub config of
ai21labs/AI21-Jamba-1.5-Mini; ``jamba-v0.1.json`` ai21labs/Jamba-v0.1's (revision 871ab2b,
written for its remote code: ``n_ctx``, ``mamba_inner_layernorms``, ``auto_map``); ``jamba-1.5-large.json`` takes the sizes of arXiv 2408.12570
section 2 (9 blocks of 8 layers, 1 attention : 7 Mamba, hidden 8192, 64 query / 8 KV heads,
MoE of 16 experts top-2 every other layer) with the Hub config's ``intermediate_size`` 24576
and the ``"auto"`` dt rank 8192 / 16 = 512.

Computed here (MTP: none):

* Jamba-v0.1 = Jamba-1.5-Mini: total 51,570,323,328 (the published "52B" rounded); active
  12,110,311,296 (the published "12B"): 2 of 16 experts in the 16 MoE layers.
* Jamba-1.5-Large: total 398,555,145,696, 0.56B (0.14 %) above the published "398B", which
  is this total truncated (rounded it would read 399B; without the untied LM head, 65,536 x
  8,192 = 536,870,912, it is 398,018,274,784); active 94,149,338,592 (the published "94B").
* KV cache at 262,144 tokens in bf16: 4 attention layers x 2 x 8 x 128 x 2 B per token =
  4 GiB (Mini), 9 x 2 x 8 x 128 x 2 B = 9 GiB (Large): the papers' "4GB" and "9GB".
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hwprofiles.errors import InputError
from nas.arch import FFN, Attention, Mamba1, MoE, NoOp
from nas.hf import ExportError, from_hf, load_config, to_hf

DATA = Path(__file__).parent / "data" / "configs"
MINI = DATA / "jamba-1.5-mini.json"
V01 = DATA / "jamba-v0.1.json"
LARGE = DATA / "jamba-1.5-large.json"
GIB = 2**30


@pytest.mark.parametrize("path,total,active,kv_gib", [
    (V01, 51_570_323_328, 12_110_311_296, 4),
    (MINI, 51_570_323_328, 12_110_311_296, 4),
    (LARGE, 398_555_145_696, 94_149_338_592, 9),
])
def test_exact_counts_against_the_published_ones(path, total, active, kv_gib):
    arch = load_config(path)
    pc = arch.param_counts()
    assert pc.total == total and pc.active == active
    published = {51_570_323_328: (52, 12), 398_555_145_696: (398, 94)}[total]
    assert round(pc.active / 1e9) == published[1]
    if total < 10**11:
        assert round(pc.total / 1e9) == published[0]
    else:  # "398B": the total truncated (see the module docstring)
        assert int(pc.total / 1e9) == published[0] and (pc.total - pc.lm_head) // 10**9 == 398
    assert arch.kv_bytes(262_144, "bf16") == kv_gib * GIB


def test_layout_and_round_trip():
    arch = load_config(MINI)
    assert arch.kind_counts() == {"mamba1": 28, "attention": 4, "ffn": 16, "moe": 16}
    assert [i for i, b in enumerate(arch.blocks) if isinstance(b, Attention)] == [8, 24, 40, 56]
    assert isinstance(arch.blocks[3], MoE) and isinstance(arch.blocks[1], FFN)
    m, a, e = arch.blocks[0], arch.blocks[8], arch.blocks[3]
    assert m == Mamba1(inner_size=8192, state_size=16, dt_rank=256, conv_kernel=4)
    assert not a.rope and a.num_kv_heads == 8 and a.head_dim == 128
    assert not e.norm_topk and e.router == "softmax" and e.top_k == 2
    cfg = to_hf(arch)
    assert cfg["model_type"] == "jamba" and "puzzle_layers" not in cfg
    assert from_hf(json.loads(json.dumps(cfg))) == arch
    orig = json.loads(MINI.read_text())
    for k in ("attn_layer_period", "attn_layer_offset", "expert_layer_period",
              "expert_layer_offset", "mamba_dt_rank", "mamba_expand", "intermediate_size",
              "num_experts", "eos_token_id", "max_position_embeddings", "use_mamba_kernels",
              "num_logits_to_keep", "router_aux_loss_coef"):
        assert cfg[k] == orig[k], k
    with pytest.raises(ExportError, match="Mamba-1"):  # no other type holds Mamba-1 blocks
        to_hf(arch, "nemotron_h_puzzle")
    # Jamba-v0.1's remote-code config: the same blocks, its own keys carried through
    v01 = load_config(V01)
    assert v01.blocks == arch.blocks and from_hf(to_hf(v01)) == v01
    assert to_hf(v01)["n_ctx"] == 262144 and to_hf(v01)["mamba_inner_layernorms"] is True
    # "auto" dt rank = ceil(hidden / 16); transformers 5.x's num_local_experts spelling
    auto = dict(orig, mamba_dt_rank="auto", num_local_experts=16)
    del auto["num_experts"]
    assert from_hf(auto) == arch


def test_state_memory_per_sequence():
    """28 Mamba-1 layers, each an 8192 x 16 float32 state plus the conv's last 3 inputs of
    8192 channels in bf16 (recipe bf16: SSM state float32)."""
    arch = load_config(MINI)
    assert arch.state_bytes_per_sequence("bf16") == 28 * (8192 * 16 * 4 + 8192 * 3 * 2)


def test_mamba1_pricing_follows_the_formulas():
    """The scan's FLOPs and bytes are the documented closed forms; a Mamba-1 block's decode
    does not grow with the context (attention's does), it holds no KV but I x N state, and
    its weights are the exact parameter bytes."""
    import hwprofiles
    from costmodels.blocks import price_blocks
    from costmodels.dtypes import get_recipe
    from costmodels.kinds import mamba1 as ops
    from nas.arch import blocks_table

    f, b = ops.scan_prefill(2.0, 4096.0, 8192, 16, 2.0, 4.0)
    assert f == 2 * 4096 * 8192 * (7 * 16 + 7)
    assert b == 2 * (4096 * (4 * 8192 + 2 * 16) * 2 + 8192 * 16 * 4)
    f1, b1 = ops.scan_decode(8.0, 8192, 16, 2.0, 4.0)
    assert f1 == 8 * 8192 * (7 * 16 + 7) and b1 == 8 * (2 * 8192 * 16 * 4 + (4 * 8192 + 32) * 2)
    arch = load_config(MINI)
    m, att = arch.blocks[0], arch.blocks[8]
    t = blocks_table([m, att], arch.hidden_size)
    hw, r = hwprofiles.get("h100-sxm"), get_recipe("bf16")
    c = price_blocks(t, hw, r, ["isl=4096,osl=256,batch=8", "isl=262144,osl=256,batch=8"])
    assert c.decode_s[0, 1] == pytest.approx(c.decode_s[0, 0])
    assert c.decode_s[1, 1] > 10 * c.decode_s[1, 0]
    assert c.kv_bytes_per_token[0] == 0 and c.state_bytes_per_sequence[0] == 8192 * (16 * 4 + 3 * 2)
    assert c.weight_bytes[0] == 2 * int(arch.block_params()[0])
    # halving the channels or the state saves time and memory
    t2 = blocks_table([m, m.model_copy(update={"inner_size": 4096}),
                       m.model_copy(update={"state_size": 8})], arch.hidden_size)
    c2 = price_blocks(t2, hw, r, ["isl=32768,osl=1024,batch=32"], tp=2)
    assert c2.prefill_s[1, 0] < c2.prefill_s[0, 0] and c2.decode_s[1, 0] < c2.decode_s[0, 0]
    assert c2.decode_s[2, 0] < c2.decode_s[0, 0]
    assert c2.state_bytes_per_sequence[2] < c2.state_bytes_per_sequence[0]
    assert c2.weight_bytes[1] < c2.weight_bytes[0] / 1.9
    # under TP the channels split (vLLM's MambaMixer): per-GPU state halves at tp = 2, and
    # a tp that does not divide the channels is refused
    assert c2.state_bytes_per_sequence[0] == c.state_bytes_per_sequence[0] / 2
    with pytest.raises(InputError, match="8192 Mamba-1 channels"):
        arch.check_tp(3)


def test_heterogeneous_child_round_trip():
    arch = load_config(MINI)
    blocks = list(arch.blocks)
    blocks[0] = blocks[0].model_copy(update={"inner_size": 4096, "state_size": 8})
    blocks[3] = blocks[3].model_copy(update={"num_experts": 8})
    blocks[10] = NoOp()
    child = arch.replace_blocks(blocks)
    cfg = to_hf(child)
    assert cfg["model_type"] == "jamba" and len(cfg["puzzle_layers"]) == 32
    assert from_hf(json.loads(json.dumps(cfg))) == child
    # a child whose attention layers stay periodic and shapes uniform stays stock: layers
    # 12 and 28 to Mamba leaves attention at 4 and 20 (period 16, offset 4) ...
    blocks = list(arch.blocks)
    blocks[24] = blocks[56] = blocks[0]
    stock = to_hf(arch.replace_blocks(blocks))
    assert "puzzle_layers" not in stock
    assert (stock["attn_layer_period"], stock["attn_layer_offset"]) == (16, 4)
    assert from_hf(stock) == arch.replace_blocks(blocks)
    # ... but layer 4 alone leaves 12, 20, 28: no offset < period says that
    blocks = list(arch.blocks)
    blocks[8] = blocks[0]
    assert "puzzle_layers" in to_hf(arch.replace_blocks(blocks))


@pytest.mark.parametrize("key,value,match", [
    ("hidden_act", "gelu", "silu"),
    ("sliding_window", 4096, "full attention"),
    ("attn_layer_offset", 8, "smaller than attn_layer_period"),
    ("layers_block_type", ["mamba"] * 32, "periods and offsets"),
    ("mamba_d_state", 0, "mamba_d_state"),
    ("mamba_inner_layernorms", False, "RMS-normalizes dt, B and C"),
])
def test_unsupported_fields_are_named(key, value, match):
    cfg = json.loads(MINI.read_text())
    cfg[key] = value
    with pytest.raises(InputError, match=match) as exc:
        from_hf(cfg, source="jamba.json")
    assert key in str(exc.value) and "jamba.json" in str(exc.value)


def test_absent_kv_heads_is_transformers_default_null_is_heads():
    """num_key_value_heads as transformers' JambaConfig reads it: left out, its class
    default 8 (the KV cache and its cost follow); null, one KV head per query head, as
    Jamba-v0.1's remote-code config class and JambaConfig's own post-init rule read it
    (transformers 5's strict field check refuses the null before that rule runs)."""
    transformers = pytest.importorskip("transformers")
    cfg = json.loads(MINI.read_text())
    for value, want in ((None, cfg["num_attention_heads"]), ("absent", 8), (4, 4)):
        c = {k: v for k, v in cfg.items() if k != "num_key_value_heads"}
        if value != "absent":
            c["num_key_value_heads"] = value
        got = {b.num_kv_heads for b in from_hf(c).blocks if isinstance(b, Attention)}
        assert got == {want}, (value, got)
        if value is not None:
            assert transformers.JambaConfig(**c).num_key_value_heads == want


def test_export_refusals_name_the_block():
    arch = load_config(MINI)
    blocks = list(arch.blocks)
    blocks[3] = blocks[3].model_copy(update={"norm_topk": True})
    with pytest.raises(ExportError, match="block 3: jamba experts"):
        to_hf(arch.replace_blocks(blocks), "jamba")
    blocks = list(arch.blocks)
    blocks[2] = FFN(width=64)
    with pytest.raises(ExportError, match="block 2: jamba has a Mamba-1 or attention mixer"):
        to_hf(arch.replace_blocks(blocks), "jamba")


# ---- torch: modules and parity with transformers ------------------------------------
torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")


def _hf_config(**kw):
    base = dict(vocab_size=96, hidden_size=32, num_hidden_layers=4, num_attention_heads=4,
                num_key_value_heads=2, intermediate_size=48, max_position_embeddings=256,
                tie_word_embeddings=False, bos_token_id=1, eos_token_id=None, pad_token_id=0,
                attn_layer_period=2, attn_layer_offset=1, expert_layer_period=2,
                expert_layer_offset=1, num_experts=4, num_experts_per_tok=2, mamba_d_state=8,
                mamba_d_conv=4, mamba_expand=2, mamba_dt_rank=4, mamba_conv_bias=True,
                mamba_proj_bias=True)
    base.update(kw)
    return transformers.JambaConfig(**base)


def _hf_model(seed: int = 0, **kw):
    from test_hf_parity import random_hf_model

    return random_hf_model(_hf_config(**kw), seed)


def test_parity_theirs_to_ours(tmp_path):
    from test_hf_parity import check_theirs_to_ours

    ours = check_theirs_to_ours(_hf_model(), tmp_path)
    assert ours.arch.model_type == "jamba"
    assert [b.kind for b in ours.arch.blocks] == ["mamba1", "ffn", "attention", "moe"] * 2


def test_parity_ours_to_theirs(tmp_path):
    from test_hf_parity import check_ours_to_theirs

    _hf_model(mamba_conv_bias=False, mamba_proj_bias=False,
              tie_word_embeddings=True).save_pretrained(tmp_path / "ref")
    arch = load_config(tmp_path / "ref")
    assert arch.tie_embeddings and not arch.blocks[0].conv_bias
    check_ours_to_theirs(arch, tmp_path)


def test_chunked_scan_equals_the_recurrence_and_cached_decode():
    from conftest import check_cached_decode

    from nas.child import build_model
    from nas.modules.mamba1 import selective_scan

    g = torch.Generator().manual_seed(0)
    b, n, inner, N = 2, 37, 6, 4
    x, dt = torch.randn(b, n, inner, generator=g), torch.rand(b, n, inner, generator=g)
    A = -torch.rand(inner, N, generator=g) * 3
    B, C = torch.randn(b, n, N, generator=g), torch.randn(b, n, N, generator=g)
    s0 = torch.randn(b, inner, N, generator=g)
    y1, s1 = selective_scan(x, dt, A, B, C, s0, chunk=8)
    s, ys = s0.clone(), []
    for t in range(n):  # the recurrence, one step at a time
        s = torch.exp(dt[:, t, :, None] * A) * s + (dt[:, t] * x[:, t])[..., None] * B[:, t, None]
        ys.append((s * C[:, t, None]).sum(-1))
    assert float((y1 - torch.stack(ys, 1)).abs().max()) < 1e-5
    assert float((s1 - s).abs().max()) < 1e-5

    arch = load_config(MINI).model_copy(update={"hidden_size": 32, "vocab_size": 64, "blocks": (
        Mamba1(inner_size=48, state_size=4, dt_rank=3), MoE(num_experts=4, top_k=2,
                                                            expert_width=16, norm_topk=False),
        Attention(num_heads=4, num_kv_heads=2, head_dim=8, rope=False), FFN(width=24))})
    model = build_model(arch, seed=0).eval()
    check_cached_decode(model, torch.randint(0, 64, (2, 11), generator=g), 7)


# ---- search axes and init_from_parent -------------------------------------------------
def test_search_axes():
    from nas.space import alternatives, check_all_used
    from nas.spec import SearchSpace

    arch = load_config(MINI)
    space = SearchSpace.model_validate({"mamba1": {"inner_fractions": [0.5], "state_sizes": [8],
                                                   "noop": True}})
    alts = alternatives(arch, space)
    check_all_used(arch, space, alts)
    assert [a.label for a in alts[0]] == ["parent", "state_size=8", "inner_size=4096",
                                          "inner_size=4096,state_size=8", "noop"]
    assert [a.label for a in alts[8]] == ["parent"]  # attention: no axis asked
    bad = SearchSpace.model_validate({"mamba1": {"inner_sizes": [9000]}})
    with pytest.raises(InputError, match="mamba1.inner_sizes: 9000 is not usable"):
        check_all_used(arch, bad, alternatives(arch, bad))


@pytest.fixture(scope="module")
def trained_jamba():
    """A tiny Jamba (two Mamba-1 layers, attention, MoE) trained 60 AdamW steps on English
    text: ``(model, calib, held)``."""
    from tiny_parent import english_bytes

    from nas.arch import ModelArch
    from nas.child import build_model

    torch.set_num_threads(1)
    arch = ModelArch(hidden_size=64, vocab_size=256, model_type="jamba", norm_eps=1e-6,
                     blocks=(Mamba1(inner_size=128, state_size=8, dt_rank=4), FFN(width=128),
                             Attention(num_heads=4, num_kv_heads=2, head_dim=16, rope=False),
                             MoE(num_experts=4, top_k=2, expert_width=64, norm_topk=False),
                             Mamba1(inner_size=128, state_size=8, dt_rank=4), FFN(width=128)))
    data = torch.tensor(list(english_bytes()), dtype=torch.long)
    cut = int(len(data) * 0.9)
    model = build_model(arch, seed=0)
    opt = torch.optim.AdamW(model.parameters(), lr=6e-3, weight_decay=0.0)
    g = torch.Generator().manual_seed(0)

    def batch(src, n):
        i = torch.randint(0, len(src) - 65, (n,), generator=g)
        return torch.stack([src[j:j + 65] for j in i.tolist()])

    for _ in range(60):
        b = batch(data[:cut], 16)
        loss = torch.nn.functional.cross_entropy(model(b[:, :-1]).flatten(0, 1),
                                                 b[:, 1:].flatten())
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert loss.item() < 3.5, loss.item()  # learned something (uniform: log 256 = 5.5)
    return model.eval(), batch(data[:cut], 16)[:, :64], batch(data[cut:], 8)[:, :64]


def _child(parent, i, update):
    blocks = list(parent.arch.blocks)
    blocks[i] = blocks[i].model_copy(update=update)
    return parent.arch.replace_blocks(blocks)


@pytest.mark.parametrize("update", [{"inner_size": 64}, {"state_size": 4},
                                    {"inner_size": 96, "state_size": 6}])
def test_inherited_mamba1_is_closer_to_parent_than_random_init(trained_jamba, update):
    from conftest import check_inheritance_beats_random

    parent, calib, held = trained_jamba
    check_inheritance_beats_random(parent, _child(parent, 0, update), 0, calib, held, update)


def test_init_fewer_channels_keeps_the_function_of_the_kept_channels(trained_jamba):
    """Kill channels 1, 3, 5, ... of Mamba-1 block 4 (their out_proj and x_proj columns
    zeroed): the child with half the channels must pick the live ones and compute exactly
    the parent's function."""
    import copy

    from nas.child import init_from_parent

    parent, calib, held = trained_jamba
    parent = copy.deepcopy(parent)
    dead = torch.arange(1, 128, 2)
    m = parent.blocks[4].mixer
    with torch.no_grad():
        m.out_proj.weight[:, dead] = 0.0
        m.x_proj.weight[:, dead] = 0.0
    child = init_from_parent(_child(parent, 4, {"inner_size": 64}), parent, calib)
    assert "by channel contribution" in child.init_report[4]
    assert torch.equal(child.blocks[4].mixer.A_log, m.A_log[0::2])
    with torch.no_grad():
        assert float((child(held) - parent(held)).abs().max()) < 1e-4


def test_init_smaller_state_keeps_the_live_state_dims(trained_jamba):
    """State dims 0, 2, 4, 6 of block 0 read out nothing (their C norm weights zeroed): the
    child with 4 of 8 dims must keep dims 1, 3, 5, 7 (A's columns, B / C rows of x_proj)."""
    import copy

    from nas.child import init_from_parent

    parent, calib, _ = trained_jamba
    parent = copy.deepcopy(parent)
    m = parent.blocks[0].mixer
    with torch.no_grad():
        m.c_layernorm.weight[0::2] = 0.0
    child = init_from_parent(_child(parent, 0, {"state_size": 4}), parent, calib)
    cm = child.blocks[0].mixer
    assert "by scan output energy" in child.init_report[0]
    assert torch.equal(cm.A_log, m.A_log[:, 1::2])
    assert torch.equal(cm.x_proj.weight[4:8], m.x_proj.weight[4 + 1:12:2])
    assert torch.equal(cm.x_proj.weight[8:], m.x_proj.weight[12 + 1::2])


def test_shipped_example_search_runs(tmp_path):
    """nas/examples/jamba-1.5-mini-h100.json (without its sweep, to stay quick): the parent
    does not hold 16 requests of 256K tokens on one H100 in FP8 (83.8 GiB); the child fits
    and meets the throughput budget, and its config reads back as a jamba model."""
    from conftest import search_example

    bp = search_example("jamba-1.5-mini-h100", tmp_path)
    assert bp["params"]["parent_total"] == 51_570_323_328
    assert len(bp["choices"]) == 64
    child = from_hf(bp["child"])
    assert child.model_type == "jamba"
    assert child.param_counts().total == bp["params"]["child_total"]


def test_quantization_config_names_jamba_modules(tmp_path):
    """A Jamba child's ModelOpt-style quantization_config names the checkpoint's modules
    (Mamba-1's four projections under ``mamba.``, the MLP under ``feed_forward.``), every
    pattern matches a saved tensor, and it reads back per block."""
    from nas.child import build_model, hf_layout
    from nas.search.quant_config import block_formats, expand, quantization_config

    arch = load_config(MINI).model_copy(update={"hidden_size": 32, "vocab_size": 64, "blocks": (
        Mamba1(inner_size=48, state_size=4, dt_rank=3),
        MoE(num_experts=4, top_k=2, expert_width=16, norm_topk=False),
        Attention(num_heads=4, num_kv_heads=2, head_dim=8, rope=False), FFN(width=24))})
    qc = quantization_config(arch, ["fp8", "nvfp4", "fp8", "bf16"], "jamba")
    layers = qc["quantized_layers"]
    assert {"model.layers.0.mamba.in_proj", "model.layers.0.mamba.x_proj",
            "model.layers.0.mamba.dt_proj", "model.layers.0.mamba.out_proj",
            "model.layers.0.feed_forward.experts.*.gate_proj",
            "model.layers.1.self_attn.q_proj"} <= set(layers)
    assert not any("layers.1.feed_forward" in k for k in layers)  # the bf16 MLP
    names = [n for _, n, _ in hf_layout(build_model(arch), "jamba")]
    assert len(expand(qc, names)) == 4 + 3 * 4 + 4
    assert [f.get("mamba") or f.get("routed_experts") or f.get("attention")
            for f in block_formats(arch, qc, "jamba")] == ["fp8", "nvfp4", "fp8", None]
