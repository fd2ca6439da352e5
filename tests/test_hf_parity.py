"""Numerical parity with Hugging Face transformers' own implementations (test extra).

For every model type transformers ships and this library builds (llama, mistral, qwen2, qwen3,
mixtral, qwen2_moe, qwen3_moe, nemotron_h), tiny random models in both directions:

* theirs -> ours: a transformers model saved by ``save_pretrained`` (its 5.x config spelling,
  and the same checkpoint with the config rewritten in the 4.x spelling) loads with
  :func:`nas.child.load_pretrained`;
* ours -> theirs: a model built here, saved by :func:`nas.child.save_pretrained`, loads with
  ``AutoModelForCausalLM.from_pretrained`` with no missing or unexpected keys, and
  :func:`nas.child.to_transformers` gives the same model in memory.

Weights are drawn at O(1) scale (matrices ``N(0, 1/fan_in)``, norm scales ``U(0.5, 1.5)``,
biases, Mamba ``dt_bias`` / ``A_log`` / ``D`` and router correction biases ``N(0, 1)``) so
that norms, biases, RoPE scaling, sliding windows, routing and the Mamba time-step clamp all
change the logits. Bars: max |logits difference| <= 1e-4 in float32, identical greedy
generations, equal parameter counts.
"""

from __future__ import annotations

import json
import math

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from nas.child import load_pretrained, save_pretrained, to_transformers  # noqa: E402
from nas.hf import load_config  # noqa: E402

TOL = 1e-4
VOCAB = 96
COMMON = dict(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=3, num_attention_heads=4,
              num_key_value_heads=2, intermediate_size=48, max_position_embeddings=256,
              tie_word_embeddings=False, bos_token_id=1, eos_token_id=None, pad_token_id=0)


def _configs() -> dict[str, object]:
    T = transformers
    return {
        "llama": T.LlamaConfig(**COMMON, attention_bias=True, mlp_bias=True, rms_norm_eps=1e-5,
                               rope_parameters={"rope_type": "llama3", "rope_theta": 5e5,
                                                "factor": 8.0, "low_freq_factor": 1.0,
                                                "high_freq_factor": 4.0,
                                                "original_max_position_embeddings": 64}),
        "mistral": T.MistralConfig(**COMMON, sliding_window=5, head_dim=8),
        "qwen2": T.Qwen2Config(**COMMON, use_sliding_window=True, sliding_window=4,
                               max_window_layers=1,
                               rope_parameters={"rope_type": "linear", "rope_theta": 1e4,
                                                "factor": 2.0}),
        "qwen3": T.Qwen3Config(**COMMON, head_dim=16,
                               rope_parameters={"rope_type": "yarn", "rope_theta": 1e4,
                                                "factor": 4.0,
                                                "original_max_position_embeddings": 64}),
        "mixtral": T.MixtralConfig(**COMMON, num_local_experts=4, num_experts_per_tok=2),
        "qwen2_moe": T.Qwen2MoeConfig(**COMMON, num_experts=4, num_experts_per_tok=2,
                                      moe_intermediate_size=16,
                                      shared_expert_intermediate_size=24, mlp_only_layers=[1],
                                      norm_topk_prob=False),
        "qwen3_moe": T.Qwen3MoeConfig(**COMMON, num_experts=4, num_experts_per_tok=2,
                                      moe_intermediate_size=16, norm_topk_prob=True,
                                      head_dim=8, rope_parameters={"rope_type": "default",
                                                                   "rope_theta": 3e4}),
        "nemotron_h": T.NemotronHConfig(
            vocab_size=VOCAB, hidden_size=32, tie_word_embeddings=False, bos_token_id=1,
            eos_token_id=None, pad_token_id=0,
            layers_block_type=["linear_attention", "moe", "full_attention", "mlp",
                               "linear_attention", "moe"],
            num_attention_heads=4, num_key_value_heads=2, head_dim=8, intermediate_size=48,
            mamba_num_heads=4, mamba_head_dim=8, ssm_state_size=8, n_groups=2, conv_kernel=4,
            n_routed_experts=4, num_experts_per_tok=2, moe_intermediate_size=16,
            moe_shared_expert_intermediate_size=24, moe_latent_size=16,
            routed_scaling_factor=2.5, time_step_min=0.3, time_step_limit=(0.3, math.inf)),
    }


TYPES = ["llama", "mistral", "qwen2", "qwen3", "mixtral", "qwen2_moe", "qwen3_moe",
         "nemotron_h"]


@torch.no_grad()
def randomize(model: torch.nn.Module, seed: int) -> None:
    """O(1)-scale random weights (see the module docstring) for a transformers or nas model."""
    g = torch.Generator().manual_seed(seed)
    tensors = dict(model.named_parameters())
    tensors.update((n, b) for n, b in model.named_buffers() if "correction_bias" in n)
    for name, t in sorted(tensors.items()):
        leaf = name.rsplit(".", 1)[-1]
        if t.dim() >= 2:
            std = 1.0 if ("embed" in name and "proj" not in name) else t.shape[-1] ** -0.5
            t.copy_(torch.randn(t.shape, generator=g) * std)
        elif "norm" in name and leaf == "weight":
            t.copy_(torch.rand(t.shape, generator=g) + 0.5)
        elif leaf == "A_log":
            t.copy_(torch.randn(t.shape, generator=g) * 0.5)
        else:  # biases, dt_bias, D, router correction bias
            t.copy_(torch.randn(t.shape, generator=g))


def random_hf_model(cfg, seed: int = 0):
    """transformers' causal LM of ``cfg`` in float32 with :func:`randomize`'d weights
    (``seed``), in eval mode: the reference side of every family's parity test."""
    torch.manual_seed(seed)
    m = transformers.AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
    randomize(m, seed)
    return m.eval()


def _hf_model(mt: str, seed: int = 0):
    return random_hf_model(_configs()[mt], seed)


def _prompt(seed: int = 1) -> torch.Tensor:
    return torch.randint(2, VOCAB, (2, 13), generator=torch.Generator().manual_seed(seed))


@torch.no_grad()
def _hf_generate(m, prompt: torch.Tensor, n: int = 8) -> torch.Tensor:
    gen = transformers.GenerationConfig(max_new_tokens=n, min_new_tokens=n, do_sample=False,
                                        eos_token_id=None, pad_token_id=0)
    return m.generate(prompt, attention_mask=torch.ones_like(prompt), generation_config=gen)


def _check(ours, theirs, prompt: torch.Tensor) -> float:
    with torch.no_grad():
        a = ours(prompt).float()
        b = theirs(prompt).logits.float()
    diff = float((a - b).abs().max())
    assert diff <= TOL, f"max |logits difference| {diff:.3g} > {TOL}"
    assert torch.equal(ours.generate(prompt, 8), _hf_generate(theirs, prompt))
    assert ours.num_parameters() == theirs.num_parameters()
    return diff


def check_theirs_to_ours(theirs, tmp_path):
    """``theirs`` (a transformers model) saved to ``tmp_path / "hf"`` loads as our model
    with its logits within :data:`TOL`, its greedy generation and its parameter count
    (:func:`_check`). Returns our model (shared by every family's parity test)."""
    theirs.save_pretrained(tmp_path / "hf")
    ours = load_pretrained(tmp_path / "hf").eval()
    _check(ours, theirs, _prompt())
    return ours


def check_ours_to_theirs(arch, tmp_path):
    """Our model of ``arch`` with random weights, saved, loads in transformers with no
    missing or unexpected key and computes our logits; :func:`to_transformers` does too.
    Returns our model (shared by every family's parity test)."""
    from nas.child import build_model

    ours = build_model(arch, seed=3).eval()
    randomize(ours, 7)
    save_pretrained(ours, tmp_path / "ours")
    theirs, info = transformers.AutoModelForCausalLM.from_pretrained(
        tmp_path / "ours", output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"], info
    _check(ours, theirs.eval(), _prompt(3))
    _check(ours, to_transformers(ours).eval(), _prompt(4))
    return ours


def _to_4x(cfg: dict) -> dict:
    """The same config in the spelling transformers 4.x wrote."""
    cfg = dict(cfg)
    rp = cfg.pop("rope_parameters", None)
    if rp:
        rp = dict(rp)
        cfg["rope_theta"] = rp.pop("rope_theta")
        cfg["rope_scaling"] = None if rp.get("rope_type") == "default" else rp
    if cfg["model_type"] == "qwen3_moe":
        cfg["num_experts"] = cfg.pop("num_local_experts")
    if cfg["model_type"] == "nemotron_h":
        inv = {"linear_attention": "M", "moe": "E", "full_attention": "*", "mlp": "-"}
        cfg["hybrid_override_pattern"] = "".join(inv[t] for t in cfg.pop("layers_block_type"))
        cfg["mtp_hybrid_override_pattern"] = "".join(
            inv[t] for t in cfg.pop("mtp_layers_block_type"))
        cfg["num_hidden_layers"] = len(cfg["hybrid_override_pattern"])
        lo, hi = cfg.pop("time_step_limit")
        cfg["mamba_dt_limit"] = [lo, 1e20 if hi in (math.inf, {"__float__": "Infinity"}) else hi]
    cfg["torch_dtype"] = cfg.pop("dtype", "float32")
    return cfg


@pytest.mark.parametrize("mt", TYPES)
def test_theirs_to_ours(mt, tmp_path):
    theirs = _hf_model(mt)
    theirs.save_pretrained(tmp_path / "hf")
    written = json.loads((tmp_path / "hf" / "config.json").read_text())
    ours = load_pretrained(tmp_path / "hf").eval()
    assert ours.arch.model_type == mt
    _check(ours, theirs, _prompt())

    # the same checkpoint with a 4.x-style config: both libraries read it the same way
    (tmp_path / "hf" / "config.json").write_text(json.dumps(_to_4x(written)))
    ours4 = load_pretrained(tmp_path / "hf").eval()
    assert ours4.arch.blocks == ours.arch.blocks
    theirs4 = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "hf").eval()
    _check(ours4, theirs4, _prompt(2))


@pytest.mark.parametrize("mt", TYPES)
def test_ours_to_theirs(mt, tmp_path):
    ref = _hf_model(mt)
    ref.save_pretrained(tmp_path / "ref")
    ours = check_ours_to_theirs(load_config(tmp_path / "ref"), tmp_path)
    assert json.loads((tmp_path / "ours" / "config.json").read_text())["model_type"] == mt
    converted = to_transformers(ours).eval()
    with torch.no_grad():  # an independent copy
        converted.get_input_embeddings().weight.add_(1.0)
    assert not torch.equal(converted.get_input_embeddings().weight, ours.embed.weight)


def test_mamba_time_step_clamp_matters():
    """The clamp is not a no-op on these weights: without it the logits move."""
    theirs = _hf_model("nemotron_h")
    from nas.child import from_transformers

    ours = from_transformers(theirs).eval()
    prompt = _prompt()
    with torch.no_grad():
        a = ours(prompt)
        for blk in ours.blocks:
            if hasattr(blk.mixer, "dt_limit"):
                assert blk.mixer.dt_limit == (0.3, math.inf)
                blk.mixer.dt_limit = (0.0, math.inf)
        b = ours(prompt)
    assert float((a - b).abs().max()) > 1e-2


def test_time_step_min_initializes_and_does_not_clamp():
    """``time_step_min`` is the low end of ``dt_bias``'s initial range, not a clamp: with
    the default ``time_step_limit`` nothing is clamped (as mamba_ssm and NVIDIA's NemotronH
    code; transformers from 5.25), and the logits are transformers' where it agrees."""
    from packaging.version import Version

    from nas.child import from_transformers

    cfg = _hf_model("nemotron_h").config.to_dict()
    cfg.pop("time_step_limit")
    theirs = transformers.NemotronHForCausalLM(transformers.NemotronHConfig(**cfg)).eval()
    ours = from_transformers(theirs).eval()
    limits = {blk.mixer.dt_limit for blk in ours.blocks if hasattr(blk.mixer, "dt_limit")}
    assert limits == {(0.0, math.inf)}
    if Version(transformers.__version__) >= Version("5.25"):
        _check(ours, theirs, _prompt())


@pytest.mark.parametrize("mt", ["qwen3_moe", "nemotron_h"])
def test_parent_straight_from_a_transformers_checkpoint(mt, tmp_path, capsys):
    """``puzzle-nas build --parent`` on a folder transformers wrote in bfloat16, sharded:
    the child equal to the parent is the parent's weights, a pruned child builds, bf16."""
    from nas.arch import MoE
    from nas.cli import main
    from nas.hf import to_hf

    theirs = _hf_model(mt).to(torch.bfloat16)
    theirs.save_pretrained(tmp_path / "hf", max_shard_size="20KB")
    assert (tmp_path / "hf" / "model.safetensors.index.json").exists()
    parent = load_pretrained(tmp_path / "hf")
    assert parent.embed.weight.dtype == torch.bfloat16
    calib = tmp_path / "calib.json"
    calib.write_text(json.dumps(_prompt().tolist()))
    arch = parent.arch
    blocks = [b.model_copy(update={"num_experts": 3, "top_k": 1}) if isinstance(b, MoE) else b
              for b in arch.blocks]
    cfg = tmp_path / "child.json"
    cfg.write_text(json.dumps(to_hf(arch.replace_blocks(blocks).model_copy())))
    same = tmp_path / "same.json"
    same.write_text(json.dumps(to_hf(arch)))
    for c, out in [(same, tmp_path / "same"), (cfg, tmp_path / "child")]:
        assert main(["build", str(c), "--parent", str(tmp_path / "hf"), "--calib", str(calib),
                     "-o", str(out)]) == 0
    child = load_pretrained(tmp_path / "same")
    sd, psd = child.state_dict(), parent.state_dict()
    assert all(torch.equal(sd[k], psd[k]) for k in psd)
    pruned = load_pretrained(tmp_path / "child")
    assert pruned.embed.weight.dtype == torch.bfloat16
    assert "experts 4 -> 3" in capsys.readouterr().out
