"""Exact parameter and memory accounting against published figures.

Derivations (h = hidden size; every block but no-op has a pre-norm of h):

Llama-3.1-8B (h 4096, 32 layers, 32 q heads, 8 KV heads, head dim 128, FFN 14336):
  attention block = 4096*4096 (q) + 2*4096*1024 (k, v) + 4096*4096 (o) + 4096 = 41,947,136
  FFN block = 3*4096*14336 + 4096 = 176,164,864
  32 layers = 6,979,584,000; embeddings + LM head = 2*128256*4096 = 1,050,673,152;
  final norm 4,096 -> 8,030,261,248 (the published count).

Nemotron-3-Super (h 4096; 40 Mamba, 40 latent MoE, 8 attention; vocab 131072):
  Mamba: I = 128*64 = 8192, in_proj 4096*(2*8192 + 2*8*128 + 128) = 76,021,760,
    conv (8192+2048)*4 + 10240 bias = 51,200, dt_bias/A_log/D 3*128, gated norm 8192,
    out_proj 8192*4096 = 33,554,432, pre-norm 4096 -> 109,640,064
  MoE: router 512*4096 + 512 bias, latent projections 2*4096*1024,
    512 experts * 2*1024*2688 (relu2, in latent space) = 2,818,572,288,
    shared 2*4096*5376 = 44,040,192, pre-norm -> 2,873,102,848 (active: 22 experts ->
    175,641,088)
  attention: 2*4096*4096 + 2*4096*256 + 4096 = 35,655,680
  total = 40*109,640,064 + 40*2,873,102,848 + 8*35,655,680 + 2*131072*4096 + 4096
        = 120,668,707,840 (published 120.7 B); active = 12,770,237,440 (published 12.8 B)

Nemotron-3-Nano (h 2688; 23 Mamba, 23 MoE, 6 attention; 128 experts top-6 of 1856,
  shared 3712, no latent): total 31,577,940,288 (published 31.6 B), active
  3,580,076,352 (published 3.6 B counting embeddings); without the input embedding table
  3,227,754,816 (published 3.2 B).
"""

from __future__ import annotations

import pytest
from conftest import LLAMA, NANO, SUPER
from pydantic import ValidationError

from costmodels.dtypes import RECIPES
from nas.arch import FFN, Attention, Linear, Mamba, ModelArch, MoE, NoOp
from nas.hf import load_config


def test_llama_8b_exact():
    pc = load_config(LLAMA).param_counts()
    assert pc.total == 8_030_261_248
    assert pc.active == pc.total
    assert pc.by_kind_total == {"attention": 32 * 41_947_136, "ffn": 32 * 176_164_864}


def test_super_exact():
    a = load_config(SUPER)
    pc = a.param_counts()
    assert a.kind_counts() == {"mamba": 40, "moe": 40, "attention": 8}
    assert pc.total == 120_668_707_840
    assert pc.active == 12_770_237_440
    assert round(pc.total / 1e9, 1) == 120.7 and round(pc.active / 1e9, 1) == 12.8
    assert pc.by_kind_total["mamba"] == 40 * 109_640_064
    assert pc.by_kind_total["moe"] == 40 * 2_873_102_848
    assert pc.by_kind_active["moe"] == 40 * 175_641_088
    assert pc.by_kind_total["attention"] == 8 * 35_655_680
    assert pc.mtp > 0  # reported apart, not in the totals


def test_nano_exact():
    pc = load_config(NANO).param_counts()
    assert pc.total == 31_577_940_288
    assert pc.active == 3_580_076_352
    assert pc.active_without_embeddings == 3_227_754_816
    assert round(pc.total / 1e9, 1) == 31.6 and round(pc.active / 1e9, 1) == 3.6
    assert round(pc.active_without_embeddings / 1e9, 1) == 3.2


def test_memory_accounting_super_nvfp4():
    a = load_config(SUPER)
    r = RECIPES["nvfp4-super"]
    by_role = a.weight_bytes_by_role(r)
    # routed experts in NVFP4: 40 * 512 * 2*1024*2688 params * 0.5625 bytes
    assert by_role["routed_experts"] == 40 * 2_818_572_288 * 0.5625
    # shared experts and Mamba projections FP8 (1 byte)
    assert by_role["shared_experts"] == 40 * 44_040_192
    assert by_role["mamba"] == 40 * (76_021_760 + 33_554_432)
    assert a.weight_bytes(r) == pytest.approx(sum(by_role.values()))
    # KV: 8 attention blocks * 2 (K,V) * 2 heads * 128 * 1 byte (FP8)
    assert a.kv_bytes_per_token(r) == 8 * 2 * 2 * 128
    # state: conv (8192+2048)*(4-1) BF16 + SSM 128*64*128 FP32, per Mamba block
    assert a.state_bytes_per_sequence(r) == 40 * (10240 * 3 * 2 + 128 * 64 * 128 * 4)
    assert a.kv_bytes(1_000_000, r) == 1_000_000 * 4096


def test_sliding_window_caps_kv():
    att = Attention(num_heads=8, num_kv_heads=2, head_dim=64, sliding_window=1024)
    a = ModelArch(hidden_size=512, vocab_size=1000, blocks=(att, FFN(width=1024)))
    assert a.kv_bytes(100, "bf16") == 100 * 2 * 2 * 64 * 2
    assert a.kv_bytes(10_000, "bf16") == 1024 * 2 * 2 * 64 * 2


def test_kinds_and_active_params():
    moe = MoE(num_experts=8, top_k=2, expert_width=64, shared_width=32, gated=True)
    a = ModelArch(hidden_size=16, vocab_size=10, tie_embeddings=True,
                  blocks=(Attention(num_heads=4, num_kv_heads=2, head_dim=4), moe,
                          Mamba(num_heads=4, head_dim=8, state_size=4, n_groups=2),
                          Linear(), NoOp()))
    p = a.block_params()
    p_act = a.block_params(active=True)
    assert p[3] == 16 * 16 + 16 and p[4] == 0
    # MoE: router 8*16, 8 experts * 3*16*64, shared 3*16*32, norm 16
    assert p[1] == 8 * 16 + 8 * 3 * 16 * 64 + 3 * 16 * 32 + 16
    assert p_act[1] == 8 * 16 + 2 * 3 * 16 * 64 + 3 * 16 * 32 + 16
    pc = a.param_counts()
    assert pc.lm_head == 0 and pc.total == int(p.sum()) + 16 * 10 + 16


@pytest.mark.parametrize("bad", [
    dict(num_heads=6, num_kv_heads=4, head_dim=8),
    dict(num_heads=4, num_kv_heads=4, head_dim=-8),
])
def test_attention_validation(bad):
    with pytest.raises(ValidationError):
        Attention(**bad)


def test_frozen_and_hashable():
    a = load_config(LLAMA)
    assert hash(a) == hash(load_config(LLAMA))
    with pytest.raises(ValidationError):
        a.blocks[0].num_heads = 3  # type: ignore[misc]
    assert len({a.blocks[0], a.blocks[2]}) == 1


def test_copies_do_not_carry_cached_counts():
    a = ModelArch(hidden_size=8, vocab_size=10, blocks=(FFN(width=8),))
    before = a.param_counts().total
    b = a.replace_blocks((FFN(width=16),))
    c = a.model_copy(update={"blocks": (FFN(width=16),)})
    assert b.param_counts().total == c.param_counts().total == before + 3 * 8 * 8
    assert a.param_counts().total == before
