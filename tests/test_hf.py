"""HF config import/export: round trips for every supported type, heterogeneous exports,
published parameter counts of other families, and bad input."""

from __future__ import annotations

import json
import math

import pytest
from conftest import CONFIGS, LLAMA, NANO, REPO, SUPER

from hwprofiles.errors import InputError
from nas.arch import FFN, Attention, Linear, ModelArch, NoOp
from nas.hf import SUPPORTED_TYPES, ExportError, from_hf, load_config, to_hf

MISTRAL_7B = {
    "model_type": "mistral", "hidden_size": 4096, "intermediate_size": 14336,
    "num_attention_heads": 32, "num_key_value_heads": 8, "num_hidden_layers": 32,
    "vocab_size": 32000, "sliding_window": 4096, "rms_norm_eps": 1e-5, "rope_theta": 10000.0,
    "tie_word_embeddings": False, "hidden_act": "silu", "bos_token_id": 1,
}
MIXTRAL_8X7B = {
    "model_type": "mixtral", "hidden_size": 4096, "intermediate_size": 14336,
    "num_attention_heads": 32, "num_key_value_heads": 8, "num_hidden_layers": 32,
    "vocab_size": 32000, "num_local_experts": 8, "num_experts_per_tok": 2,
    "sliding_window": None, "rope_theta": 1e6, "rms_norm_eps": 1e-5,
}
QWEN2_7B = {
    "model_type": "qwen2", "hidden_size": 3584, "intermediate_size": 18944,
    "num_attention_heads": 28, "num_key_value_heads": 4, "num_hidden_layers": 28,
    "vocab_size": 152064, "tie_word_embeddings": False, "use_sliding_window": False,
    "sliding_window": 131072, "max_window_layers": 28, "rope_theta": 1e6, "rms_norm_eps": 1e-6,
}
QWEN3_8B = {
    "model_type": "qwen3", "hidden_size": 4096, "intermediate_size": 12288,
    "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128,
    "num_hidden_layers": 36, "vocab_size": 151936, "tie_word_embeddings": False,
    "attention_bias": False, "rope_theta": 1e6,
}
QWEN3_30B_A3B = {
    "model_type": "qwen3_moe", "hidden_size": 2048, "intermediate_size": 6144,
    "num_attention_heads": 32, "num_key_value_heads": 4, "head_dim": 128,
    "num_hidden_layers": 48, "vocab_size": 151936, "num_experts": 128,
    "num_experts_per_tok": 8, "moe_intermediate_size": 768, "norm_topk_prob": True,
    "decoder_sparse_step": 1, "mlp_only_layers": [], "tie_word_embeddings": False,
}
QWEN15_MOE = {
    "model_type": "qwen2_moe", "hidden_size": 2048, "intermediate_size": 5632,
    "num_attention_heads": 16, "num_key_value_heads": 16, "num_hidden_layers": 24,
    "vocab_size": 151936, "num_experts": 60, "num_experts_per_tok": 4,
    "moe_intermediate_size": 1408, "shared_expert_intermediate_size": 5632,
    "decoder_sparse_step": 1, "mlp_only_layers": [], "tie_word_embeddings": False,
}
DECILM = {
    "model_type": "nemotron-nas", "hidden_size": 1024, "num_attention_heads": 16,
    "num_hidden_layers": 3, "vocab_size": 5000, "rms_norm_eps": 1e-5, "rope_theta": 5e5,
    "hidden_act": "silu",
    "block_configs": [
        {"attention": {"n_heads_in_group": 8, "no_op": False, "replace_with_linear": False},
         "ffn": {"ffn_mult": 5.25, "no_op": False, "replace_with_linear": False}},
        {"attention": {"n_heads_in_group": None, "no_op": True, "replace_with_linear": False},
         "ffn": {"ffn_mult": 2.625, "no_op": False, "replace_with_linear": False}},
        {"attention": {"n_heads_in_group": None, "no_op": False, "replace_with_linear": True},
         "ffn": {"ffn_mult": None, "no_op": True, "replace_with_linear": False}},
    ],
}
PUZZLE = {
    **{k: v for k, v in json.loads(SUPER.read_text()).items()
       if k not in ("hybrid_override_pattern", "mtp_hybrid_override_pattern")},
    "model_type": "nemotron_h_puzzle", "num_hidden_layers": 4,
    "block_configs": [
        {"block_type": "mamba", "ssm_state_size": 96},
        {"block_type": "moe", "moe_intermediate_size": 1280, "num_experts_per_tok": 4},
        {"block_type": "attention"},
        {"block_type": "moe"},
    ],
    "mtp_block_configs": [{"block_type": "attention"}, {"block_type": "moe"}],
}
SAMPLES = {
    "llama": json.loads(LLAMA.read_text()), "mistral": MISTRAL_7B, "qwen2": QWEN2_7B,
    "qwen3": QWEN3_8B, "mixtral": MIXTRAL_8X7B, "qwen2_moe": QWEN15_MOE,
    "qwen3_moe": QWEN3_30B_A3B, "nemotron_h": json.loads(SUPER.read_text()),
    "nemotron_h_puzzle": PUZZLE, "nemotron-nas": DECILM,
    # issue 18 part A (tests/test_family_deepseek.py, tests/test_family_gpt_oss.py)
    "deepseek_v3": json.loads((REPO / "tests/data/configs/deepseek-v3.json").read_text()),
    "gpt_oss": json.loads((REPO / "tests/data/configs/gpt-oss-20b.json").read_text()),
    "kimi_k2": {**json.loads((REPO / "tests/data/configs/deepseek-v3.json").read_text()),
                "model_type": "kimi_k2", "n_routed_experts": 384, "n_group": 1,
                "topk_group": 1, "num_attention_heads": 64, "num_key_value_heads": 64},
    "deepseek_v3_puzzle": {
        "model_type": "deepseek_v3_puzzle", "hidden_size": 64, "vocab_size": 128,
        "rms_norm_eps": 1e-6, "rope_theta": 10000.0, "num_hidden_layers": 2,
        "block_configs": [
            {"kind": "mla", "num_heads": 4, "q_lora_rank": 32, "kv_lora_rank": 16,
             "qk_nope_head_dim": 8, "qk_rope_head_dim": 4, "v_head_dim": 8},
            {"kind": "ffn", "width": 96}, {"kind": "noop"},
            {"kind": "moe", "num_experts": 8, "top_k": 2, "expert_width": 16,
             "router": "sigmoid", "router_bias": True, "n_group": 4, "topk_group": 2}]},
    "gpt_oss_puzzle": {
        "model_type": "gpt_oss_puzzle", "hidden_size": 64, "vocab_size": 128,
        "rms_norm_eps": 1e-5, "rope_theta": 150000.0, "num_hidden_layers": 1,
        "block_configs": [
            {"kind": "attention", "num_heads": 4, "num_kv_heads": 2, "head_dim": 16,
             "sliding_window": 8, "qkv_bias": True, "o_bias": True, "sinks": True},
            {"kind": "moe", "num_experts": 4, "top_k": 2, "expert_width": 16,
             "router_linear_bias": True, "expert_bias": True, "swiglu_limit": 7.0,
             "swiglu_alpha": 1.702}]},
    # issue 18 part B (tests/test_family_qwen3_next.py)
    "qwen3_next": json.loads(
        (REPO / "tests/data/configs/qwen3-next-80b-a3b-instruct.json").read_text()),
    "qwen3_5_moe": json.loads((REPO / "tests/data/configs/qwen3.5-35b-a3b.json").read_text()),
    "qwen3_5_moe_text": json.loads(
        (REPO / "tests/data/configs/qwen3.5-35b-a3b.json").read_text())["text_config"],
    "granitemoehybrid": json.loads(
        (REPO / "tests/data/configs/granite-4.0-h-small.json").read_text()),
    "jamba": json.loads((REPO / "tests/data/configs/jamba-1.5-mini.json").read_text()),
    "falcon_h1": json.loads((REPO / "tests/data/configs/falcon-h1-0.5b.json").read_text()),
}
EXPORTS_AS = {"qwen3_5_moe": "qwen3_5_moe_text"}
"""Types whose models export as another one (the image-text wrapper's language model)."""


def test_every_supported_type_has_a_sample():
    assert set(SAMPLES) == set(SUPPORTED_TYPES)


@pytest.mark.parametrize("mt", list(SAMPLES))
def test_round_trip_identity(mt):
    a = from_hf(SAMPLES[mt])
    exported = to_hf(a)
    assert exported["model_type"] == EXPORTS_AS.get(mt, mt)
    b = from_hf(json.loads(json.dumps(exported)))
    assert b == a.model_copy(update={"model_type": exported["model_type"]})
    assert to_hf(b) == exported


@pytest.mark.parametrize("cfg,total", [
    (MISTRAL_7B, 7_241_732_096),
    (MIXTRAL_8X7B, 46_702_792_704),
    (QWEN2_7B, 7_615_616_512),
])
def test_published_counts_of_other_families(cfg, total):
    assert from_hf(cfg).param_counts().total == total


def test_published_counts_rounded():
    q3 = from_hf(QWEN3_8B).param_counts()
    assert round(q3.total / 1e9, 1) == 8.2
    q3moe = from_hf(QWEN3_30B_A3B).param_counts()
    assert round(q3moe.total / 1e9, 1) == 30.5
    # published "3.3B activated": 3.35 B with both embedding tables, 3.04 B without the input one
    assert 3.0e9 < q3moe.active_without_embeddings < q3moe.active < 3.4e9
    q15 = from_hf(QWEN15_MOE).param_counts()
    assert round(q15.total / 1e9, 1) == 14.3
    assert round(q15.active / 1e9, 1) == 2.7


def test_decilm_widths_and_kinds():
    a = from_hf(DECILM)
    assert [b.kind for b in a.blocks] == ["attention", "ffn", "noop", "ffn", "linear", "noop"]
    assert a.blocks[0].num_kv_heads == 2
    # FACTS: width = round_up_256(int(2 * mult * h / 3)): 5.25 at 1024 -> 3584
    assert a.blocks[1].width == 3584 and a.blocks[3].width == 1792


def test_puzzle_per_block_overrides():
    a = from_hf(PUZZLE)
    assert a.blocks[0].state_size == 96
    assert a.blocks[1].expert_width == 1280 and a.blocks[1].top_k == 4
    assert a.blocks[3].expert_width == 2688 and a.blocks[3].top_k == 22
    assert a.blocks[1].latent_size == 1024
    assert [b.kind for b in a.mtp_blocks] == ["attention", "moe"]


def test_heterogeneous_super_child_exports_as_puzzle():
    parent = load_config(SUPER)
    blocks = list(parent.blocks)
    for i, b in enumerate(blocks):
        if b.kind == "moe" and i % 3 == 0:
            blocks[i] = b.model_copy(update={"expert_width": 1536, "top_k": 10})
        if b.kind == "mamba" and i % 4 == 0:
            blocks[i] = b.model_copy(update={"state_size": 96})
    blocks[7] = NoOp()
    child = parent.replace_blocks(blocks)
    cfg = to_hf(child)
    assert cfg["model_type"] == "nemotron_h_puzzle"
    assert len(cfg["block_configs"]) == 88
    assert cfg["block_configs"][7] == {"block_type": "noop"}
    back = from_hf(json.loads(json.dumps(cfg)))
    assert back.blocks == child.blocks
    assert back.param_counts().total < parent.param_counts().total


def test_pruned_llama_exports_as_decilm():
    parent = load_config(LLAMA)
    blocks = list(parent.blocks)
    blocks[0] = blocks[0].model_copy(update={"num_kv_heads": 2})
    blocks[3] = FFN(width=7168)
    blocks[4] = NoOp()
    blocks[5] = Linear()
    blocks[7] = FFN(width=5000)  # not a multiple of 256: written as intermediate_size
    child = parent.replace_blocks(blocks)
    cfg = to_hf(child)
    assert cfg["model_type"] == "nemotron-nas"
    assert cfg["block_configs"][0]["attention"]["n_heads_in_group"] == 16
    assert cfg["block_configs"][3]["ffn"]["intermediate_size"] == 5000
    back = from_hf(json.loads(json.dumps(cfg)))
    assert back.blocks == child.blocks


def test_explicit_type_that_cannot_hold_the_arch():
    a = load_config(NANO)
    with pytest.raises(ExportError, match="llama"):
        to_hf(a, "llama")
    # bad user input like any other: the CLI prints it as one line and exits 2
    with pytest.raises(InputError, match="model_type.*unknown export model_type 'gpt9'"):
        to_hf(a, "gpt9")


@pytest.mark.parametrize("mt", [["llama"], {"a": 1}, 7, None, "gpt9"])
def test_bad_model_type_is_one_input_error(mt):
    """Whatever a config's model_type holds (a list, an object, a refused family), the error
    is an InputError naming the field, never a TypeError from a lookup."""
    with pytest.raises(InputError, match="model_type"):
        from_hf({"model_type": mt, "hidden_size": 8})


def test_every_dialect_registers_once_and_round_trips_its_own_example():
    """Each dialect module registers its types (a second registration is refused), and
    every registered type is both importable and the export a model of that type gets."""
    from nas.hf import DIALECTS
    from nas.hf.registry import register

    assert set(DIALECTS) == set(SUPPORTED_TYPES)
    with pytest.raises(ValueError, match="registered twice"):
        register(DIALECTS["llama"])
    for mt, d in DIALECTS.items():
        assert d.model_type == mt and d.architecture.endswith("ForCausalLM")
    paths = sorted(CONFIGS.glob("*.json")) + sorted((REPO / "tests/data/configs").glob("*.json")) \
        + sorted((REPO / "costmodels/data/configs").glob("*.json"))
    assert len(paths) >= 9
    for path in paths:
        a = load_config(path)
        cfg = to_hf(a)
        assert cfg["model_type"] == EXPORTS_AS.get(a.model_type, a.model_type)
        assert cfg["architectures"] == [DIALECTS[cfg["model_type"]].architecture]
        assert from_hf(json.loads(json.dumps(cfg))).blocks == a.blocks


def test_sliding_layers_qwen2():
    cfg = {**QWEN2_7B, "use_sliding_window": True, "sliding_window": 4096,
           "max_window_layers": 20}
    a = from_hf(cfg)
    windows = [b.sliding_window for b in a.blocks if isinstance(b, Attention)]
    assert windows == [None] * 20 + [4096] * 8
    assert from_hf(to_hf(a)) == a


@pytest.mark.parametrize("cfg,field", [
    ({"model_type": "gpt2"}, "model_type"),
    ({**json.loads(SUPER.read_text()), "num_hidden_layers": 87}, "num_hidden_layers"),
    ({**MISTRAL_7B, "intermediate_size": -5}, "intermediate_size"),
    ({k: v for k, v in MISTRAL_7B.items() if k != "hidden_size"}, "hidden_size"),
    ({**json.loads(SUPER.read_text()), "hybrid_override_pattern": "MEX"},
     "hybrid_override_pattern"),
    ({**PUZZLE, "num_hidden_layers": 1,
      "block_configs": [{"block_type": "mamba", "ssm_state_size": 0}]},
     "block_configs[0].ssm_state_size"),
    ({**QWEN3_8B, "num_key_value_heads": 5}, None),
])
def test_bad_input_names_the_field(cfg, field):
    with pytest.raises(InputError) as exc:
        from_hf(cfg, source="cfg.json")
    msg = str(exc.value)
    assert "\n" not in msg and msg.startswith("cfg.json")
    if field:
        assert field in msg


# ---- both spellings: transformers 4.x and 5.x ---------------------------------------------
LLAMA31 = json.loads(LLAMA.read_text())


def _as_5x(cfg: dict) -> dict:
    """A 4.x config rewritten as transformers 5.x writes it (RoPE in rope_parameters)."""
    out = {k: v for k, v in cfg.items() if k not in ("rope_theta", "rope_scaling")}
    out["rope_parameters"] = {"rope_theta": cfg.get("rope_theta", 10000.0),
                              **(cfg.get("rope_scaling") or {"rope_type": "default"})}
    return out


@pytest.mark.parametrize("cfg", [LLAMA31, MISTRAL_7B, QWEN2_7B, QWEN3_8B, MIXTRAL_8X7B,
                                 QWEN15_MOE, QWEN3_30B_A3B], ids=lambda c: c["model_type"])
def test_rope_parameters_read_as_rope_theta_and_scaling(cfg):
    a, b = from_hf(cfg), from_hf(_as_5x(cfg))
    assert b.rope_theta == a.rope_theta and b.blocks == a.blocks
    assert b.hf_extra.get("rope_scaling") == a.hf_extra.get("rope_scaling")
    assert "rope_parameters" not in b.hf_extra


def test_llama31_rope_scaling_is_kept_and_exported_in_the_4x_spelling():
    a = from_hf(_as_5x(LLAMA31))
    assert a.rope_theta == 500000.0
    assert a.hf_extra["rope_scaling"] == {"rope_type": "llama3", "factor": 8.0,
                                          "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                          "original_max_position_embeddings": 8192}
    out = to_hf(a)
    assert out["rope_theta"] == 500000.0 and out["rope_scaling"]["rope_type"] == "llama3"
    assert from_hf(out) == a


def test_type_defaults_follow_transformers():
    mixtral = {k: v for k, v in MIXTRAL_8X7B.items() if k not in ("rope_theta",
                                                                   "rms_norm_eps")}
    a = from_hf(mixtral)
    assert a.rope_theta == 1e6 and a.norm_eps == 1e-5
    mistral = {k: v for k, v in MISTRAL_7B.items() if k != "sliding_window"}
    assert {b.sliding_window for b in from_hf(mistral).blocks if b.kind == "attention"} \
        == {4096}
    yarn = _as_5x({**QWEN3_8B, "max_position_embeddings": 131072,
                   "rope_scaling": {"rope_type": "yarn", "factor": 4.0}})
    assert from_hf(yarn).hf_extra["rope_scaling"] == {
        "rope_type": "yarn", "original_max_position_embeddings": 131072, "factor": 4.0,
        "truncate": True}


def test_transformers_5x_moe_and_window_spellings():
    q3 = {k: v for k, v in QWEN3_30B_A3B.items() if k != "num_experts"}
    assert from_hf({**q3, "num_local_experts": 128}) == from_hf(QWEN3_30B_A3B)
    with pytest.raises(InputError, match="num_experts.*is 64 but num_local_experts is 128"):
        from_hf({**QWEN3_30B_A3B, "num_experts": 64, "num_local_experts": 128})
    q15 = from_hf({**QWEN15_MOE, "sliding_window": 0, "use_sliding_window": False})
    assert all(b.sliding_window is None for b in q15.blocks if b.kind == "attention")
    assert not from_hf({**QWEN15_MOE, "qkv_bias": False}).blocks[0].qkv_bias
    # qwen2: the window applies only with use_sliding_window, whatever layer_types says
    types = ["sliding_attention"] * 28
    off = from_hf({**QWEN2_7B, "layer_types": types, "use_sliding_window": False})
    assert all(b.sliding_window is None for b in off.blocks if b.kind == "attention")
    on = from_hf({**QWEN2_7B, "layer_types": types, "use_sliding_window": True})
    assert {b.sliding_window for b in on.blocks if b.kind == "attention"} == {131072}


def test_nemotron_h_layers_block_type_and_mamba_limits():
    legacy = json.loads(NANO.read_text())
    inv = {"M": "linear_attention", "E": "moe", "*": "full_attention", "-": "mlp"}
    new = {k: v for k, v in legacy.items()
           if k not in ("hybrid_override_pattern", "num_hidden_layers", "time_step_limit")}
    new["layers_block_type"] = [inv[c] for c in legacy["hybrid_override_pattern"]]
    new["time_step_limit"] = [0.0, {"__float__": "Infinity"}]
    a, b = from_hf(legacy), from_hf(new)
    assert a.blocks == b.blocks
    assert b.hf_extra["time_step_limit"] == [0.0, math.inf]
    assert b.hf_extra["time_step_min"] == 0.001 and a.hf_extra["time_step_limit"] == [0, 1e20]
    assert "Infinity" not in json.dumps(to_hf(b))  # the default limit is left out: strict JSON
    old_names = {**legacy, "mamba_d_conv": 4, "mamba_n_groups": 8, "mamba_dt_min": 0.01}
    assert from_hf(old_names).hf_extra["time_step_min"] == 0.01
    assert from_hf(old_names).blocks == a.blocks


@pytest.mark.parametrize("update,field", [
    ({"rope_parameters": {"rope_type": "dynamic", "factor": 2.0}}, "rope_parameters.rope_type"),
    ({"rope_scaling": {"rope_type": "longrope", "short_factor": [1.0]}}, "rope_scaling.rope_type"),
    ({"rope_parameters": {"rope_type": "linear", "factor": 2.0, "beta_fast": 8}},
     "rope_parameters.beta_fast"),
    ({"rope_parameters": {"rope_type": "nope"}}, "rope_parameters.rope_type"),
    ({"rope_scaling": {"rope_type": "llama3", "factor": 8.0,
                       "original_max_position_embeddings": 8192}},
     "rope_scaling.low_freq_factor"),
    ({"rope_scaling": {"rope_type": "yarn", "factor": 4.0}}, "max_position_embeddings"),
    ({"partial_rotary_factor": 0.5}, "partial_rotary_factor"),
    ({"final_logit_softcapping": 30.0}, "final_logit_softcapping"),
    ({"rope_parameters": {"full_attention": {"rope_theta": 1e4}}}, "rope_parameters"),
    ({"sliding_window": -1}, "sliding_window"),
])
def test_numerics_we_do_not_compute_are_errors_naming_the_field(update, field):
    with pytest.raises(InputError) as exc:
        from_hf({**MISTRAL_7B, **update}, source="cfg.json")
    msg = str(exc.value)
    assert "\n" not in msg and f"{field}" in msg, msg


@pytest.mark.parametrize("update,field", [
    ({"n_group": 8, "topk_group": 4}, "topk_group"),
    ({"mlp_bias": True}, "mlp_bias"),
    ({"mamba_hidden_act": "gelu"}, "mamba_hidden_act"),
    ({"use_bias": True, "mamba_proj_bias": False}, "mamba_proj_bias"),
    ({"time_step_limit": [0.5, 0.1]}, "time_step_limit"),
    ({"layers_block_type": ["mamba2"]}, "layers_block_type"),
])
def test_nemotron_h_numerics_we_do_not_compute_are_errors(update, field):
    with pytest.raises(InputError) as exc:
        from_hf({**json.loads(NANO.read_text()), **update}, source="cfg.json")
    assert field in str(exc.value), str(exc.value)


# ---------------------------------------------------------------------------------------
# the engines' schemas (docs/build.md, "Engine schemas")
# ---------------------------------------------------------------------------------------
def vllm_ffn_width(ffn_mult: float, hidden: int) -> int:
    """vLLM's DeciLM rounding, restated from vllm/model_executor/models/nemotron_nas.py
    (commit 00bd1493b3e8, _ffn_mult_to_intermediate_size / _find_multiple): the integer part
    of 2 * ffn_mult * hidden / 3, then up to the next multiple of 256."""
    n = int(2 * ffn_mult * hidden / 3)
    return n if n % 256 == 0 else n + 256 - n % 256


def vllm_decilm_widths(cfg: dict) -> list[int | None]:
    """The FFN width vLLM builds per layer: ffn_mult when the block has one, else
    intermediate_size (its ``hasattr(block_config.ffn, "ffn_mult")`` branch); None for a
    no-op FFN."""
    out = []
    for bc in cfg["block_configs"]:
        f = bc["ffn"]
        if f.get("no_op"):
            out.append(None)
        elif f.get("ffn_mult") is not None:
            out.append(vllm_ffn_width(f["ffn_mult"], cfg["hidden_size"]))
        else:
            out.append(f["intermediate_size"])
    return out


@pytest.mark.parametrize("hidden", [1024, 4096, 5120, 8192])
def test_decilm_ffn_mult_is_exact_under_vllms_rounding(hidden):
    att = Attention(num_heads=16, num_kv_heads=16, head_dim=hidden // 16)
    widths = list(range(256, 6 * hidden + 1, 256))
    blocks = []
    for w in widths:
        blocks += [att, FFN(width=w)]
    arch = ModelArch(hidden_size=hidden, vocab_size=1000, blocks=tuple(blocks),
                     model_type="llama").replace_blocks([*blocks[:-2], NoOp(), blocks[-1]])
    cfg = to_hf(arch, "nemotron-nas")
    assert all("intermediate_size" not in bc["ffn"] for bc in cfg["block_configs"])
    assert vllm_decilm_widths(cfg)[:-1] == widths[:-1]  # every multiple of 256, exactly
    assert from_hf(json.loads(json.dumps(cfg))).blocks == arch.blocks


def test_decilm_width_ffn_mult_cannot_express_is_intermediate_size_alone():
    parent = load_config(LLAMA)
    blocks = list(parent.blocks)
    blocks[1] = FFN(width=5000)  # not a multiple of 256
    blocks[3] = FFN(width=14336)
    child = parent.replace_blocks(blocks)
    cfg = to_hf(child)
    f0, f1 = cfg["block_configs"][0]["ffn"], cfg["block_configs"][1]["ffn"]
    assert f0["ffn_mult"] is None and f0["intermediate_size"] == 5000
    assert f1 == {"no_op": False, "replace_with_linear": False, "ffn_mult": 5.25}  # NVIDIA's
    assert vllm_decilm_widths(cfg)[:2] == [5000, 14336]
    assert from_hf(json.loads(json.dumps(cfg))).blocks == child.blocks
    # files written before (an approximate ffn_mult beside intermediate_size) still read
    old = json.loads(json.dumps(cfg))
    old["block_configs"][0]["ffn"]["ffn_mult"] = 1.831055
    assert from_hf(old).blocks == child.blocks


# NVIDIA's nemotron_h_puzzle per-block config classes, as read (AttentionConfig, MoeConfig,
# MambaConfig, MlpConfig of configuration_nemotron_h_puzzle.py; SGLang's
# python/sglang/srt/configs/nemotron_h.py at 03c77dc33d0a reads block["n_routed_experts"])
NVIDIA_PUZZLE_FIELDS = {
    "attention": {"sliding_window"},
    "moe": {"n_routed_experts", "num_experts_per_tok", "moe_intermediate_size",
            "moe_shared_expert_intermediate_size", "moe_latent_size", "routed_scaling_factor",
            "n_group", "topk_group", "norm_topk_prob"},
    "mamba": {"ssm_state_size"},
    "mlp": {"intermediate_size"},
}
NVIDIA_PUZZLE_REQUIRED = {
    "moe": {"n_routed_experts", "num_experts_per_tok", "moe_intermediate_size",
            "moe_shared_expert_intermediate_size"},
    "mlp": {"intermediate_size"},
}


def test_nemotron_h_puzzle_moe_child_is_in_nvidias_schema():
    from nas.hf.nemotron_h import PUZZLE_BLOCK_KEYS, PUZZLE_BLOCK_REQUIRED, puzzle_schema_problems

    assert {k: set(v) for k, v in PUZZLE_BLOCK_KEYS.items()} == NVIDIA_PUZZLE_FIELDS
    assert {k: set(v) for k, v in PUZZLE_BLOCK_REQUIRED.items()} == NVIDIA_PUZZLE_REQUIRED
    parent = load_config(SUPER)
    blocks = list(parent.blocks)
    moes = [i for i, b in enumerate(blocks) if b.kind == "moe"]
    blocks[moes[0]] = blocks[moes[0]].model_copy(update={"num_experts": 256, "top_k": 16})
    blocks[moes[1]] = blocks[moes[1]].model_copy(update={"expert_width": 1536})
    child = parent.replace_blocks(blocks)  # only what NVIDIA's Puzzle-75B child varies
    cfg = to_hf(child)
    assert cfg["model_type"] == "nemotron_h_puzzle"
    for e in cfg["block_configs"]:
        bt = e["block_type"]
        assert set(e) - {"block_type"} <= NVIDIA_PUZZLE_FIELDS[bt], e
        assert NVIDIA_PUZZLE_REQUIRED.get(bt, set()) <= set(e), e
    assert cfg["block_configs"][moes[0]]["n_routed_experts"] == 256
    assert cfg["block_configs"][moes[2]]["n_routed_experts"] == 512  # even the unchanged
    assert puzzle_schema_problems(cfg) == []
    assert cfg["hybrid_override_pattern"] == to_hf(parent)["hybrid_override_pattern"]
    assert from_hf(json.loads(json.dumps(cfg))).blocks == child.blocks


def test_nemotron_h_puzzle_problems_name_what_nvidias_class_refuses():
    from nas.hf.nemotron_h import puzzle_schema_problems

    parent = load_config(SUPER)
    blocks = list(parent.blocks)
    att = next(i for i, b in enumerate(blocks) if b.kind == "attention")
    mamba = next(i for i, b in enumerate(blocks) if b.kind == "mamba")
    blocks[att] = blocks[att].model_copy(update={"num_kv_heads": 1})
    blocks[mamba] = blocks[mamba].model_copy(update={"num_heads": 64})
    blocks[mamba + 1] = NoOp()
    cfg = to_hf(parent.replace_blocks(blocks))
    problems = puzzle_schema_problems(cfg)
    assert any(f"block_configs[{att}] (attention)" in p and "num_key_value_heads" in p
               for p in problems)
    assert any(f"block_configs[{mamba}] (mamba)" in p and "mamba_num_heads" in p
               for p in problems)
    assert any(f"block_configs[{mamba + 1}]: block_type 'noop'" in p for p in problems)
    assert len(problems) == 3
