"""Heterogeneous children through the checkpoint itself (:mod:`nas.hf.remote`).

A child no stock transformers class holds is saved with ``auto_map`` and a torch-only copy
of this project's modules; ``AutoModelForCausalLM.from_pretrained(dir,
trust_remote_code=True)`` must then give our logits within 1e-4 in float32 with no
missing or unexpected tensors, load in a process where ``nas`` and ``pydantic`` cannot be
imported, and train under HF ``Trainer``. Tiny random models at O(1) weight scale
(``tests/test_hf_parity.py``'s ``randomize``), nothing downloaded.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from hwprofiles.errors import InputError  # noqa: E402
from nas.arch import FFN, MLA, Attention, Linear, Mamba, ModelArch, MoE, NoOp  # noqa: E402
from nas.child import build_model, load_pretrained, save_pretrained  # noqa: E402
from nas.hf import DIALECTS, from_hf, load_config  # noqa: E402
from nas.hf.remote import AUTO_MAP, TRANSFORMERS_TYPES, remote_files  # noqa: E402

pytestmark = pytest.mark.torch

H = 64


def randomize(model: torch.nn.Module, seed: int) -> None:
    """O(1)-scale weights: matrices N(0, 1/fan_in), norms U(0.5, 1.5), the rest N(0, 1)."""
    g = torch.Generator().manual_seed(seed)
    tensors = dict(model.named_parameters())
    tensors.update((n, b) for n, b in model.named_buffers() if "correction_bias" in n)
    with torch.no_grad():
        for name, t in sorted(tensors.items()):
            leaf = name.rsplit(".", 1)[-1]
            if t.dim() >= 2:
                t.copy_(torch.randn(t.shape, generator=g) * t.shape[-1] ** -0.5)
            elif "norm" in name and leaf == "weight":
                t.copy_(torch.rand(t.shape, generator=g) + 0.5)
            elif leaf == "A_log":
                t.copy_(torch.randn(t.shape, generator=g) * 0.5)
            else:
                t.copy_(torch.randn(t.shape, generator=g))


def llama_child() -> ModelArch:
    """Per-layer KV heads, FFN widths (one not a multiple of 256), a no-op attention, a
    linear FFN: exported as nemotron-nas."""
    att = Attention(num_heads=4, num_kv_heads=4, head_dim=16)
    blocks = [att.model_copy(update={"num_kv_heads": 2}), FFN(width=96), NoOp(),
              FFN(width=256), att.model_copy(update={"num_kv_heads": 1}), Linear(),
              att, FFN(width=40)]
    return ModelArch(hidden_size=H, vocab_size=128, blocks=tuple(blocks), model_type="llama",
                     rope_theta=5e5)


def nemotron_h_child() -> ModelArch:
    """Mamba of two head counts, MoE of two expert counts / widths (shared expert, sigmoid
    router with correction bias), attention of two KV-head counts, an MLP, a no-op and a
    linear block: exported as nemotron_h_puzzle."""
    mamba = Mamba(num_heads=8, head_dim=8, state_size=16, n_groups=2)
    moe = MoE(num_experts=4, top_k=2, expert_width=32, shared_width=48, gated=False,
              activation="relu2", router="sigmoid", router_bias=True)
    att = Attention(num_heads=4, num_kv_heads=2, head_dim=16, rope=False)
    blocks = [mamba, moe, att, moe.model_copy(update={"num_experts": 3, "expert_width": 16}),
              mamba.model_copy(update={"num_heads": 4}), NoOp(),
              att.model_copy(update={"num_kv_heads": 1}),
              FFN(width=40, gated=False, activation="relu2"), Linear()]
    return ModelArch(hidden_size=H, vocab_size=128, blocks=tuple(blocks),
                     model_type="nemotron_h")


CHILDREN = {"llama": llama_child, "nemotron_h": nemotron_h_child}


def _saved(kind: str, tmp_path, seed: int = 0):
    torch.manual_seed(seed)
    model = build_model(CHILDREN[kind]())
    randomize(model, seed)
    out = save_pretrained(model, tmp_path / f"{kind}-child")
    return model, out


def _prompt() -> torch.Tensor:
    return torch.randint(0, 128, (2, 24), generator=torch.Generator().manual_seed(1))


@pytest.mark.parametrize("kind", sorted(CHILDREN))
def test_child_loads_through_trust_remote_code_with_equal_logits(kind, tmp_path):
    model, out = _saved(kind, tmp_path)
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["model_type"] == {"llama": "nemotron-nas", "nemotron_h": "nemotron_h_puzzle"}[kind]
    assert cfg["auto_map"] == AUTO_MAP
    assert set(remote_files(cfg["model_type"])) <= {p.name for p in out.iterdir()}
    hf, info = transformers.AutoModelForCausalLM.from_pretrained(
        out, trust_remote_code=True, dtype=torch.float32, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"]
    assert not info["mismatched_keys"]
    assert type(hf).__name__ == "PuzzleNasForCausalLM"
    x = _prompt()
    with torch.no_grad():
        ours, theirs = model(x), hf(input_ids=x).logits
    assert ours.abs().max() > 1.0  # O(1) logits: a wrong weight would show
    assert (ours - theirs).abs().max().item() <= 1e-4
    # every stored tensor is a parameter (or the router buffer) of the HF model, once
    names = set(hf.state_dict())
    from safetensors import safe_open

    with safe_open(str(out / "model.safetensors"), "pt") as f:
        assert set(f.keys()) == names


N_NEW = 16
"""New tokens of the generate tests."""


def _load(out):
    return transformers.AutoModelForCausalLM.from_pretrained(out, trust_remote_code=True,
                                                             dtype=torch.float32)


def _inner_calls(hf) -> list[tuple[int, bool]]:
    """Filled as the child's inner puzzle-nas ``CausalLM`` runs: (tokens, with a cache)."""
    calls: list[tuple[int, bool]] = []
    hf.puzzle_nas_model.register_forward_pre_hook(
        lambda _, args: calls.append((args[0].shape[1], len(args) > 1 and args[1] is not None)))
    return calls


def _generate(hf, x, **kw):
    """``hf.generate`` from seed 0; the mask given, as a prompt token may be the config's
    pad token (from which transformers would infer padding, which the child refuses)."""
    torch.manual_seed(0)
    with torch.no_grad():
        return hf.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=N_NEW, **kw)


@pytest.mark.parametrize("kind", sorted(CHILDREN))
def test_generate_on_a_remote_code_child_decodes_through_puzzle_nas_caches(kind, tmp_path):
    """transformers' greedy ``generate`` on the child loaded through trust_remote_code
    (per-layer KV heads, FFN widths, no-op attention; nemotron_h: Mamba and MoE too) runs
    the prompt once, then one token a step through puzzle-nas' caches, and gives the tokens
    of puzzle-nas' own cached decoding and of transformers' uncached whole-sequence path."""
    model, out = _saved(kind, tmp_path)
    hf = _load(out)
    calls = _inner_calls(hf)
    x = _prompt()
    cached = _generate(hf, x, do_sample=False)
    steps = list(calls)
    calls.clear()
    whole = _generate(hf, x, do_sample=False, use_cache=False)
    with torch.no_grad():
        ours = model.generate(x, N_NEW)
    assert steps == [(24, True)] + [(1, True)] * (N_NEW - 1)
    assert calls == [(24 + i, False) for i in range(N_NEW)]
    assert cached.shape == (2, 24 + N_NEW)
    assert torch.equal(cached, ours) and torch.equal(whole, ours)


@pytest.mark.parametrize("kind", sorted(CHILDREN))
def test_sampling_and_beam_search_through_the_caches(kind, tmp_path, monkeypatch):
    """Sampling (seeded) and beam search (2 beams, the cache's rows reordered as beams
    overtake each other) through the caches give what the uncached path gives."""
    _, out = _saved(kind, tmp_path)
    hf = _load(out)
    x = _prompt()
    sampled = _generate(hf, x, do_sample=True, top_k=5)
    assert sampled.shape == (2, 24 + N_NEW) and torch.equal(sampled[:, :24], x)
    assert torch.equal(sampled, _generate(hf, x, do_sample=True, top_k=5, use_cache=False))
    assert not torch.equal(sampled, _generate(hf, x, do_sample=False))
    cache_cls = sys.modules[type(hf).__module__].PuzzleNasCache
    orders = []
    reorder = cache_cls.reorder_cache

    def recorded(self, beam_idx):
        orders.append(beam_idx.clone())
        return reorder(self, beam_idx)

    monkeypatch.setattr(cache_cls, "reorder_cache", recorded)
    calls = _inner_calls(hf)
    beams = _generate(hf, x, num_beams=2, do_sample=False)
    assert calls == [(24, True)] + [(1, True)] * (N_NEW - 1)
    assert any(not torch.equal(o, torch.arange(4)) for o in orders)  # a beam overtook
    assert torch.equal(beams, _generate(hf, x, num_beams=2, do_sample=False, use_cache=False))


@pytest.mark.parametrize("kind", sorted(CHILDREN))
def test_forward_continues_from_a_cache_past_its_capacity(kind, tmp_path):
    """``forward(use_cache=True)`` returns a cache sized for its tokens; continuing token by
    token past that size (the buffers grow) gives the whole sequence's logits. A plain
    forward builds no cache; a transformers cache is refused."""
    _, out = _saved(kind, tmp_path)
    hf = _load(out)
    x = _prompt()
    with torch.no_grad():
        full = hf(input_ids=x)
        assert full.cache is None
        step = hf(input_ids=x[:, :4], use_cache=True)
        cache, logits = step.cache, [step.logits]
        for i in range(4, 24):  # under either name
            step = hf(input_ids=x[:, i:i + 1], **{"cache" if i % 2 else "past_key_values": cache})
            assert step.cache is cache
            logits.append(step.logits)
        assert cache.get_seq_length() == 24
        assert (torch.cat(logits, 1) - full.logits).abs().max().item() <= 1e-4
        with pytest.raises(TypeError, match="puzzle-nas"):
            hf(input_ids=x, cache=transformers.DynamicCache())


def _from_family_test(module: str, attr: str = "_hf_config") -> ModelArch:
    """The tiny transformers config of a family test, with its first MLP slot a no-op."""
    import importlib

    mod = importlib.import_module(module)
    cfg = (transformers.GraniteMoeHybridConfig(**mod.TINY) if attr == "TINY"
           else getattr(mod, attr)())
    arch = from_hf(cfg.to_dict())
    return arch.replace_blocks([NoOp() if i == 1 else b for i, b in enumerate(arch.blocks)])


def _deepseek_child() -> ModelArch:
    mla = MLA(num_heads=4, q_lora_rank=32, kv_lora_rank=16, qk_nope_head_dim=8,
              qk_rope_head_dim=8, v_head_dim=8)
    moe = MoE(num_experts=8, top_k=2, expert_width=16, shared_width=16, router="sigmoid",
              router_bias=True, routed_scaling=2.5, n_group=2, topk_group=1)
    return ModelArch(hidden_size=H, vocab_size=128, model_type="deepseek_v3", norm_eps=1e-6,
                     blocks=(mla, FFN(width=48), mla, moe, NoOp(),
                             moe.model_copy(update={"num_experts": 4, "n_group": 1}), mla, moe))


def _gpt_oss_child() -> ModelArch:
    att = Attention(num_heads=4, num_kv_heads=2, head_dim=16, qkv_bias=True, o_bias=True,
                    sinks=True, sliding_window=8)
    moe = MoE(num_experts=4, top_k=2, expert_width=16, router="softmax",
              router_linear_bias=True, expert_bias=True, swiglu_limit=7.0, swiglu_alpha=1.702)
    yarn = {"rope_type": "yarn", "factor": 32.0, "beta_fast": 32.0, "beta_slow": 1.0,
            "original_max_position_embeddings": 4096, "truncate": False}
    return ModelArch(hidden_size=H, vocab_size=128, model_type="gpt_oss", rope_theta=1.5e5,
                     hf_extra_json=json.dumps({"rope_scaling": yarn}),
                     blocks=(att, moe, att.model_copy(update={"sliding_window": None,
                                                              "num_kv_heads": 1}),
                             moe.model_copy(update={"num_experts": 3}), NoOp(), moe))


FAMILIES = {
    "deepseek_v3_puzzle": _deepseek_child, "gpt_oss_puzzle": _gpt_oss_child,
    "qwen3_next": lambda: _from_family_test("test_family_qwen3_next"),
    "falcon_h1": lambda: _from_family_test("test_family_falcon_h1"),
    "jamba": lambda: _from_family_test("test_family_jamba"),
    "granitemoehybrid": lambda: _from_family_test("test_family_hybrids", "TINY"),
}


def _saved_family(mt: str, tmp_path):
    arch = FAMILIES[mt]()
    torch.manual_seed(0)
    model = build_model(arch)
    randomize(model, 0)
    return arch, model, save_pretrained(model, tmp_path / "child")


@pytest.mark.parametrize("mt", sorted(FAMILIES))
def test_a_heterogeneous_child_of_every_other_family_loads_with_equal_logits(mt, tmp_path):
    arch, model, out = _saved_family(mt, tmp_path)
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["model_type"] == mt and cfg["auto_map"] == AUTO_MAP
    hf, info = transformers.AutoModelForCausalLM.from_pretrained(
        out, trust_remote_code=True, dtype=torch.float32, output_loading_info=True)
    assert not any(info.values())  # no missing, unexpected or mismatched tensors
    x = torch.randint(0, arch.vocab_size, (2, 24), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        ours, theirs = model(x), hf(input_ids=x).logits
    assert ours.abs().max() > 1.0
    assert (ours - theirs).abs().max().item() <= 1e-4



@pytest.mark.parametrize("mt", sorted(FAMILIES))
def test_generate_through_the_caches_of_every_other_family(mt, tmp_path):
    """Through transformers, a child of every other family decodes one token a step from
    its caches (MLA latents, a sliding-window ring shorter than the prompt, DeltaNet and
    Mamba-1 states, Falcon-H1's attention + Mamba): greedy gives puzzle-nas' tokens; the
    cache's rows, reordered as beam search does, continue as a cache of the reordered
    prompts would; beam search gives the uncached path's tokens. Except Falcon-H1's: its
    Mamba clamps dt to ``time_step_limit`` over a sequence but not in the one-token step
    (as transformers and mamba_ssm do; ``nas/modules/mamba.py``), so there cached and
    uncached decoding differ by design."""
    arch, model, out = _saved_family(mt, tmp_path)
    hf = _load(out)
    calls = _inner_calls(hf)
    x = torch.randint(0, arch.vocab_size, (4, 24), generator=torch.Generator().manual_seed(1))
    greedy = _generate(hf, x[:2], do_sample=False)
    assert calls == [(24, True)] + [(1, True)] * (N_NEW - 1)
    with torch.no_grad():
        assert torch.equal(greedy, model.generate(x[:2], N_NEW))
        perm, nxt = torch.tensor([2, 0, 3, 1]), x[:, :1]
        cache = hf(input_ids=x, use_cache=True).cache
        cache.reorder_cache(perm)
        reordered = hf(input_ids=nxt, cache=cache).logits
        fresh = hf(input_ids=nxt, cache=hf(input_ids=x[perm], use_cache=True).cache).logits
        assert (reordered - fresh).abs().max().item() <= 1e-5
    beams = _generate(hf, x[:2], num_beams=2, do_sample=False)
    assert beams.shape == (2, 24 + N_NEW) and torch.equal(beams[:, :24], x[:2])
    if mt != "falcon_h1":
        assert torch.equal(beams, _generate(hf, x[:2], num_beams=2, do_sample=False,
                                            use_cache=False))

def test_written_code_needs_neither_nas_nor_pydantic(tmp_path):
    model, out = _saved("nemotron_h", tmp_path)
    x = _prompt()
    torch.save(x, tmp_path / "x.pt")
    script = (
        "import sys\n"
        "for m in ('nas', 'hwprofiles', 'costmodels', 'pydantic'):\n"
        "    sys.modules[m] = None  # any import of them fails\n"
        "import torch, transformers\n"
        "torch.set_num_threads(1)\n"
        f"m = transformers.AutoModelForCausalLM.from_pretrained({str(out)!r}, "
        "trust_remote_code=True, dtype=torch.float32)\n"
        f"x = torch.load({str(tmp_path / 'x.pt')!r})\n"
        "with torch.no_grad():\n"
        f"    torch.save(m(input_ids=x).logits, {str(tmp_path / 'y.pt')!r})\n")
    res = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         env={"OMP_NUM_THREADS": "1", "PATH": "/usr/bin:/bin",
                              "HF_HUB_OFFLINE": "1", "HOME": str(tmp_path)})
    assert res.returncode == 0, res.stderr[-2000:]
    with torch.no_grad():
        ours = model(x)
    assert (ours - torch.load(tmp_path / "y.pt")).abs().max().item() <= 1e-4


def test_hf_trainer_trains_the_child_and_it_loads_back(tmp_path):
    pytest.importorskip("accelerate")
    _, out = _saved("nemotron_h", tmp_path)
    hf = transformers.AutoModelForCausalLM.from_pretrained(out, trust_remote_code=True,
                                                           dtype=torch.float32)
    batch = torch.randint(0, 128, (4, 16), generator=torch.Generator().manual_seed(2))

    class Data(torch.utils.data.Dataset):
        def __len__(self):
            return 4

        def __getitem__(self, i):
            return {"input_ids": batch[i], "labels": batch[i]}

    with torch.no_grad():
        before_loss = hf(input_ids=batch, labels=batch).loss.item()
        before = {k: v.clone() for k, v in hf.state_dict().items()}
    args = transformers.TrainingArguments(
        output_dir=str(tmp_path / "trainer"), max_steps=6, per_device_train_batch_size=4,
        learning_rate=3e-3, lr_scheduler_type="constant", report_to=[], save_strategy="no",
        use_cpu=True, dataloader_num_workers=0, disable_tqdm=True, seed=0)
    transformers.Trainer(model=hf, args=args, train_dataset=Data()).train()
    with torch.no_grad():
        after_loss = hf(input_ids=batch, labels=batch).loss.item()
    assert after_loss < before_loss  # six steps on one batch lower its loss
    changed = [k for k, v in hf.state_dict().items() if not torch.equal(before[k], v)]
    assert any(".experts.1.up_proj." in k for k in changed)  # per-expert gradients flowed
    # saved by transformers, read back by this library: the same model
    hf.save_pretrained(tmp_path / "trained")
    back = load_pretrained(tmp_path / "trained")
    with torch.no_grad():
        assert (back(batch) - hf(input_ids=batch).logits).abs().max().item() <= 1e-4


def test_label_loss_is_the_shifted_cross_entropy(tmp_path):
    model, out = _saved("llama", tmp_path)
    hf = transformers.AutoModelForCausalLM.from_pretrained(out, trust_remote_code=True,
                                                           dtype=torch.float32)
    x = _prompt()
    labels = x.clone()
    labels[:, :5] = -100
    with torch.no_grad():
        logits = model(x)
        want = torch.nn.functional.cross_entropy(logits[:, :-1].reshape(-1, 128),
                                                 labels[:, 1:].reshape(-1), ignore_index=-100)
        assert abs(hf(input_ids=x, labels=labels).loss.item() - want.item()) <= 1e-5
        with pytest.raises(ValueError, match="padding"):
            hf(input_ids=x, attention_mask=torch.zeros_like(x))


def test_stock_child_gets_no_modeling_code(tmp_path):
    att, ffn = Attention(num_heads=4, num_kv_heads=2, head_dim=16), FFN(width=96)
    arch = ModelArch(hidden_size=H, vocab_size=128, blocks=(att, ffn) * 2, model_type="llama")
    out = save_pretrained(build_model(arch), tmp_path / "stock")
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["model_type"] == "llama" and "auto_map" not in cfg and "puzzle_nas" not in cfg
    assert sorted(p.name for p in out.iterdir()) == ["config.json", "model.safetensors"]
    # and never when asked not to; a re-save over a folder holding the files replaces them
    _, child = _saved("llama", tmp_path)
    model = load_pretrained(child)
    save_pretrained(model, child, remote_code=False)
    assert sorted(p.name for p in child.iterdir()) == ["config.json", "model.safetensors"]


def test_edited_config_that_disagrees_with_its_copy_is_refused(tmp_path):
    _, out = _saved("nemotron_h", tmp_path)
    cfg = json.loads((out / "config.json").read_text())
    cfg["block_configs"][3]["n_routed_experts"] = 2
    (out / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(InputError, match=r"puzzle_nas.*describes another model"):
        load_config(out)


def test_the_stock_type_list_is_what_transformers_ships():
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING_NAMES

    assert set(TRANSFORMERS_TYPES) == {mt for mt in DIALECTS if mt in CONFIG_MAPPING_NAMES}


def test_the_config_class_answers_as_the_engines_read_it(tmp_path):
    """Through trust_remote_code an engine gets this checkpoint's config class: it must
    answer the way vLLM reads NVIDIA's (vllm/model_executor/models/nemotron_nas.py at
    00bd1493b3e8: ``block_config.attention.no_op``, ``n_heads_in_group``, ``ffn_mult`` when
    ``hasattr(block_config.ffn, "ffn_mult")`` else ``ffn.intermediate_size``;
    nemotron_h.py at 00b08dc44519: ``config.get_nemotron_h_config_for_layer(i)``)."""
    from test_hf import vllm_ffn_width

    _, out = _saved("llama", tmp_path)
    cfg = transformers.AutoConfig.from_pretrained(out, trust_remote_code=True)
    arch = llama_child()
    for i, bc in enumerate(cfg.block_configs):
        att, ffn = arch.blocks[2 * i], arch.blocks[2 * i + 1]
        if bc.attention.no_op:
            assert att.kind == "noop"
        elif not bc.attention.replace_with_linear:
            assert cfg.num_attention_heads // bc.attention.n_heads_in_group == att.num_kv_heads
        if not bc.ffn.no_op and not bc.ffn.replace_with_linear:
            width = vllm_ffn_width(bc.ffn.ffn_mult, cfg.hidden_size) \
                if hasattr(bc.ffn, "ffn_mult") else bc.ffn.intermediate_size
            assert width == ffn.width
    # and as transformers writes it back (None values dropped), this library reads it
    assert from_hf(json.loads(cfg.to_json_string())).blocks == arch.blocks
    _, out = _saved("nemotron_h", tmp_path)
    cfg = transformers.AutoConfig.from_pretrained(out, trust_remote_code=True)
    arch = nemotron_h_child()
    for i, b in enumerate(arch.blocks):
        if b.kind == "moe":
            layer = cfg.get_nemotron_h_config_for_layer(i)
            assert (layer.n_routed_experts, layer.moe_intermediate_size,
                    layer.num_experts_per_tok) == (b.num_experts, b.expert_width, b.top_k)


def test_build_and_distill_outputs_carry_the_modeling_code(tmp_path):
    """The CLI's own outputs, not only save_pretrained: ``build`` (a heterogeneous Llama
    child initialized from its parent) and ``distill`` (its ``model/``) each write
    ``auto_map`` and the modeling files, and load through trust_remote_code with our
    logits."""
    import numpy as np

    from nas.cli import main
    from nas.hf import to_hf

    att = Attention(num_heads=4, num_kv_heads=4, head_dim=16)
    parent = ModelArch(hidden_size=H, vocab_size=128, model_type="llama", rope_theta=5e5,
                       blocks=(att, FFN(width=256)) * 4)
    torch.manual_seed(0)
    pm = build_model(parent)
    randomize(pm, 0)
    save_pretrained(pm, tmp_path / "parent")
    (tmp_path / "child.json").write_text(json.dumps({"child": to_hf(llama_child())}))
    np.save(tmp_path / "tokens.npy",
            np.random.default_rng(0).integers(0, 128, 4096).astype(np.uint16))
    assert main(["build", str(tmp_path / "child.json"), "--parent", str(tmp_path / "parent"),
                 "--calib", str(tmp_path / "tokens.npy"), "--calib-len", "32", "-o",
                 str(tmp_path / "child")]) == 0
    assert main(["distill", str(tmp_path / "child"), "--teacher", str(tmp_path / "parent"),
                 "--data", str(tmp_path / "tokens.npy"), "-o", str(tmp_path / "kd"),
                 "--tokens", "256", "--seq-len", "32", "--batch", "4",
                 "--eval-tokens", "128"]) == 0
    for out in (tmp_path / "child", tmp_path / "kd" / "model"):
        cfg = json.loads((out / "config.json").read_text())
        assert cfg["model_type"] == "nemotron-nas" and cfg["auto_map"] == AUTO_MAP, out
        assert set(remote_files(cfg["model_type"])) <= {p.name for p in out.iterdir()}, out
        ours = load_pretrained(out, dtype=torch.float32).eval()
        hf = transformers.AutoModelForCausalLM.from_pretrained(
            out, trust_remote_code=True, dtype=torch.float32).eval()
        x = _prompt()
        with torch.no_grad():
            assert (ours(x) - hf(input_ids=x).logits).abs().max().item() <= 1e-4, out
