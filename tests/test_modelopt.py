"""Parents as NVIDIA and the Hub publish them: ModelOpt FP8 / NVFP4 exports dequantized on
read (checked by hand and against ModelOpt's own results), and one compute dtype for a
parent whose non-quantized tensors are bf16, through ``score``, ``build`` (from the parent
and from BLD blocks), ``distill`` and ``iterate``."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("safetensors")
from safetensors.torch import load_file, save_file  # noqa: E402

from nas.child import load_pretrained  # noqa: E402
from nas.child.formats.modelopt import E2M1_VALUES, dequantize  # noqa: E402
from nas.cli import main  # noqa: E402

pytestmark = pytest.mark.torch
VECTORS = Path(__file__).parent / "data" / "modelopt_vectors.safetensors"
VOCAB = 96


def test_nvfp4_block_by_hand():
    """One block of 16: codes (low nibble first) 1 2 | 7 15 | 8 9 | 0 0 | 3 4 | 5 6 | 10 11 |
    12 13 are 0.5 1 | 6 -6 | -0 -0.5 | 0 0 | 1.5 2 | 3 4 | -1 -1.5 | -2 -3, times the E4M3
    block scale 0.75 and the global scale 0.5."""
    packed = torch.tensor([[0x21, 0xF7, 0x98, 0x00, 0x43, 0x65, 0xBA, 0xDC]], dtype=torch.uint8)
    scale = torch.tensor([[0.75]]).to(torch.float8_e4m3fn)
    w = dequantize(packed, scale, torch.tensor(0.5))
    want = [0.1875, 0.375, 2.25, -2.25, -0.0, -0.1875, 0.0, 0.0,
            0.5625, 0.75, 1.125, 1.5, -0.375, -0.5625, -0.75, -1.125]
    assert w.dtype == torch.float32 and w.tolist() == [want]


def test_fp8_per_tensor_and_per_channel_by_hand():
    q = torch.tensor([[1.0, -2.0, 0.5], [4.0, 0.25, -1.5]]).to(torch.float8_e4m3fn)
    assert dequantize(q, torch.tensor(0.25), None).tolist() == [[0.25, -0.5, 0.125],
                                                                 [1.0, 0.0625, -0.375]]
    assert dequantize(q, torch.tensor([2.0, 0.5]), None).tolist() == [[2.0, -4.0, 1.0],
                                                                      [2.0, 0.125, -0.75]]


@pytest.mark.parametrize("kind", ["nvfp4", "fp8", "fp8c"])
def test_dequantization_equals_modelopts_own(kind):
    """``tests/data/modelopt_vectors.safetensors``: a 64 x 96 weight (an outlier row, a zero
    block, an outlier value) quantized and dequantized by ModelOpt 0.47.0 itself
    (``make_modelopt_vectors.py``): NVFP4, FP8 per tensor, FP8 per output channel."""
    v = load_file(str(VECTORS))
    sc2 = v.get(f"{kind}.weight_scale_2")
    ours = dequantize(v[f"{kind}.weight"], v[f"{kind}.weight_scale"], sc2)
    assert torch.equal(ours, v[f"{kind}.dequantized"])
    # and it is the weight, to the format's precision
    err = (ours - v["original"]).abs().max() / v["original"].abs().max()
    assert err < (0.1 if kind == "nvfp4" else 0.04)


def test_shapes_that_do_not_fit_name_the_tensor():
    packed = torch.zeros(4, 8, dtype=torch.uint8)
    with pytest.raises(ValueError, match="x.weight_scale has shape"):
        dequantize(packed, torch.ones(4, 2).to(torch.float8_e4m3fn), torch.tensor(1.0),
                   "x.weight")
    with pytest.raises(ValueError, match="scalar x.weight_scale_2"):
        dequantize(packed, torch.ones(4, 1).to(torch.float8_e4m3fn), None, "x.weight")


# ---- a parent as NVIDIA publishes it: bf16 tensors, ModelOpt-quantized linears -----------
def _quantize_nvfp4(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor,
                                             torch.Tensor]:
    """``(packed, E4M3 block scales, global scale, the weight they hold)`` by ModelOpt's
    recipe (global = amax / (6 * 448), block = block amax / (6 * global) in E4M3, codes the
    nearest E2M1 value), written out here independently of the reader."""
    w = w.float()
    g = w.abs().max() / (6 * 448)
    blocks = w.unflatten(-1, (-1, 16))
    s = (blocks.abs().amax(-1) / (6 * g)).clamp(min=2 ** -9).to(torch.float8_e4m3fn)
    scaled = blocks / (s.float() * g)[..., None]
    table = torch.tensor(E2M1_VALUES)
    codes = (scaled[..., None] - table).abs().argmin(-1).to(torch.uint8).flatten(-2)
    held = (table[codes.long()].unflatten(-1, (-1, 16)) * (s.float() * g)[..., None]).flatten(-2)
    return (codes[..., 1::2] << 4) | codes[..., 0::2], s, g.reshape(()), held


def _quantize_fp8(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    s = w.float().abs().max() / 448
    q = (w.float() / s).to(torch.float8_e4m3fn)
    return q, s.reshape(()), q.float() * s


def _quantize_into(sd: dict, k: str, nvfp4: bool, layers: dict) -> tuple[str, torch.Tensor]:
    """Replace weight ``k`` of state dict ``sd`` by its ModelOpt export, NVFP4 (packed
    weight, E4M3 scale per 16, global scale) or FP8 (per-tensor scale), with an activation
    scale beside it, and note it in ``layers`` (``hf_quant_config.json``'s
    ``quantized_layers``); returns the layer's name and the weight it stands for."""
    w = sd.pop(k)
    base = k[: -len(".weight")]
    if nvfp4:
        packed, s, g, held = _quantize_nvfp4(w)
        sd[k], sd[k + "_scale"], sd[k + "_scale_2"] = packed, s, g
        layers[base] = {"quant_algo": "NVFP4", "group_size": 16}
    else:
        q, s, held = _quantize_fp8(w)
        sd[k], sd[k + "_scale"] = q, s
        layers[base] = {"quant_algo": "FP8"}
    sd[base + ".input_scale"] = torch.tensor(0.02)
    return base, held


def _hub_llama(tmp: Path) -> Path:
    """A tiny random Llama as transformers saves it in bf16."""
    transformers = pytest.importorskip("transformers")
    from test_hf_parity import randomize

    cfg = transformers.LlamaConfig(vocab_size=VOCAB, hidden_size=64, intermediate_size=128,
                                   num_hidden_layers=2, num_attention_heads=4,
                                   num_key_value_heads=2, head_dim=16,
                                   max_position_embeddings=256, tie_word_embeddings=False)
    torch.manual_seed(0)
    m = transformers.AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
    randomize(m, 0)
    m.to(torch.bfloat16).save_pretrained(tmp)
    return tmp


@pytest.fixture(scope="module")
def modelopt_parent(tmp_path_factory):
    """``(folder, reference folder)``: the tiny Llama exported as ModelOpt does it for a
    mixed-precision model (MLP linears NVFP4, attention linears FP8, embeddings, norms and
    head bf16, activation and KV scales beside them, ``hf_quant_config.json``), and the
    same model holding the weights those tensors stand for, in bf16."""
    d = tmp_path_factory.mktemp("modelopt")
    src = _hub_llama(d / "modelopt")
    sd = load_file(str(src / "model.safetensors"))
    ref = dict(sd)
    layers = {}
    for k in sorted(sd):
        if not (k.endswith("_proj.weight") and ".layers." in k):
            continue
        base, held = _quantize_into(sd, k, ".mlp." in k, layers)
        if k.endswith(("k_proj.weight", "v_proj.weight")):
            sd[base + "." + k.split(".")[-2][0] + "_scale"] = torch.tensor(1.0)
        ref[k] = held.to(torch.bfloat16)
    save_file(sd, str(src / "model.safetensors"), metadata={"format": "pt"})
    (src / "hf_quant_config.json").write_text(json.dumps({
        "producer": {"name": "modelopt", "version": "0.47.0"},
        "quantization": {"quant_algo": "MIXED_PRECISION", "kv_cache_quant_algo": "FP8",
                         "quantized_layers": layers}}))
    (d / "ref").mkdir()
    (d / "ref" / "config.json").write_text((src / "config.json").read_text())
    save_file(ref, str(d / "ref" / "model.safetensors"), metadata={"format": "pt"})
    return src, d / "ref"


def test_modelopt_parent_reads_as_one_bf16_model(modelopt_parent):
    src, ref = modelopt_parent
    ours = load_pretrained(src).eval()
    assert {p.dtype for p in ours.parameters()} == {torch.bfloat16}
    want = load_pretrained(ref).eval()
    for (k, a), (_, b) in zip(ours.state_dict().items(), want.state_dict().items()):
        assert torch.equal(a, b), k
    from nas.child.checkpoint import CheckpointReader

    note = CheckpointReader(src).left_out_note
    assert note == ("ModelOpt MIXED_PRECISION: 14 weights dequantized on read; "
                    "18 activation / KV-cache scales not used")
    prompt = torch.randint(2, VOCAB, (2, 13), generator=torch.Generator().manual_seed(1))
    transformers = pytest.importorskip("transformers")
    theirs = transformers.AutoModelForCausalLM.from_pretrained(ref).eval()
    with torch.no_grad():
        diff = (ours(prompt).float() - theirs(prompt).logits.float()).abs().max()
    assert float(diff) <= 0.05  # bf16 arithmetic on both sides, logits of O(1) size


def test_modelopt_config_in_config_json_and_awq_refused(modelopt_parent, tmp_path):
    import shutil

    src, _ = modelopt_parent
    shutil.copytree(src, tmp_path / "p")
    (tmp_path / "p" / "hf_quant_config.json").unlink()
    c = json.loads((tmp_path / "p" / "config.json").read_text())
    c["quantization_config"] = {"quant_method": "modelopt", "quant_algo": "MIXED_PRECISION"}
    (tmp_path / "p" / "config.json").write_text(json.dumps(c))
    assert {p.dtype for p in load_pretrained(tmp_path / "p").parameters()} == {torch.bfloat16}
    c["quantization_config"]["quant_algo"] = "NVFP4_AWQ"
    (tmp_path / "p" / "config.json").write_text(json.dumps(c))
    from hwprofiles.errors import InputError

    with pytest.raises(InputError, match="AWQ"):
        load_pretrained(tmp_path / "p")


def test_without_modelopts_config_the_scales_are_unexpected(modelopt_parent, tmp_path):
    import shutil

    from hwprofiles.errors import InputError

    src, _ = modelopt_parent
    shutil.copytree(src, tmp_path / "p")
    (tmp_path / "p" / "hf_quant_config.json").unlink()
    with pytest.raises(InputError, match="unexpected tensor"):
        load_pretrained(tmp_path / "p")


def test_an_explicit_dtype_is_the_compute_dtype(modelopt_parent):
    src, _ = modelopt_parent
    m = load_pretrained(src, dtype=torch.float32)
    assert {p.dtype for p in m.parameters()} == {torch.float32}


# ---- every command on such parents, end to end --------------------------------------------
def _hub_fp8_deepseek_bf16(tmp: Path) -> Path:
    """DeepSeek-V3's Hub layout (block-FP8 linears, bf16 elsewhere) on a tiny random model."""
    from test_family_deepseek import _hf_tiny

    _hf_tiny().to(torch.bfloat16).save_pretrained(tmp)
    sd = load_file(str(tmp / "model.safetensors"))
    for k in [k for k in sd if k.endswith(".weight") and sd[k].dim() == 2
              and (".self_attn." in k or ".mlp." in k) and ".mlp.gate." not in k]:
        w = sd[k].float()
        r, c = w.shape
        s = torch.full((-(-r // 16), -(-c // 16)), float(w.abs().max() / 448))
        sd[k], sd[k + "_scale_inv"] = (w / s[0, 0]).to(torch.float8_e4m3fn), s
    save_file(sd, str(tmp / "model.safetensors"), metadata={"format": "pt"})
    c = json.loads((tmp / "config.json").read_text())
    c["quantization_config"] = {"quant_method": "fp8", "fmt": "e4m3",
                                "activation_scheme": "dynamic", "weight_block_size": [16, 16]}
    (tmp / "config.json").write_text(json.dumps(c))
    return tmp


def _run_every_command(parent: Path, tmp: Path, space: dict, dtype: str | None = None) -> None:
    """score, build (--parent --calib), distill, iterate and build --blocks (the child of
    iterate's search, assembled from its stage's BLD blocks): each exits 0 on ``parent`` and
    every model is in one dtype (``dtype``, else the parent's non-quantized bf16)."""
    flag = [] if dtype is None else ["--dtype", dtype]
    want = getattr(torch, dtype or "bfloat16")
    g = np.random.default_rng(0)
    np.save(tmp / "tokens.npy", g.integers(2, VOCAB, 4096).astype(np.uint16))
    budgets = [{"metric": "active_params", "max": "99%"}]
    spec = {"name": "hub", "parent": str(parent / "config.json"), "hardware": "h100-sxm",
            "workloads": {"chat": {"isl": 128, "osl": 128, "batch": 1}},
            "search_space": space, "budgets": budgets, "stages": [{"budgets": budgets}]}
    (tmp / "spec.json").write_text(json.dumps(spec))
    assert main(["score", str(tmp / "spec.json"), "--parent", str(parent), "--data",
                 str(tmp / "tokens.npy"), "-o", str(tmp / "scores"), "--seq-len", "32",
                 "--max-tokens", "128", "--calib-tokens", "128", "--bld-steps", "2"] + flag) == 0
    assert main(["build", str(parent / "config.json"), "--parent", str(parent), "--calib",
                 str(tmp / "tokens.npy"), "--calib-len", "32", "-o", str(tmp / "child")]
                + flag) == 0
    child = load_pretrained(tmp / "child")
    assert {p.dtype for p in child.parameters()} == {want}
    assert main(["distill", str(tmp / "child"), "--teacher", str(parent), "--data",
                 str(tmp / "tokens.npy"), "-o", str(tmp / "kd"), "--tokens", "256",
                 "--seq-len", "32", "--batch", "4", "--eval-tokens", "128"] + flag) == 0
    kd = json.loads((tmp / "kd" / "distill.json").read_text())
    assert kd["settings"].get("dtype") == dtype
    assert main(["iterate", str(tmp / "spec.json"), "--parent", str(parent), "--data",
                 str(tmp / "tokens.npy"), "-o", str(tmp / "it"), "--seq-len", "32",
                 "--max-tokens", "128", "--calib-tokens", "128", "--bld-steps", "2",
                 "--kd-tokens", "256", "--kd-eval-tokens", "128"] + flag) == 0
    stage = tmp / "it" / "stage-0"
    rec = json.loads((stage / "distill" / "distill.json").read_text())
    assert rec["settings"].get("dtype") == dtype and rec["steps"] > 0
    assert main(["build", str(stage / "search" / "blueprint.json"), "--parent", str(parent),
                 "--blocks", str(stage / "scores"), "-o", str(tmp / "assembled")] + flag) == 0
    child = load_pretrained(tmp / "assembled")
    assert {p.dtype for p in child.parameters()} == {want}


@pytest.mark.parametrize("dtype", [None, "float32"])
def test_every_command_runs_on_a_modelopt_parent(modelopt_parent, tmp_path, dtype):
    _run_every_command(modelopt_parent[0], tmp_path,
                       {"attention": {"kv_heads": [1]}, "ffn": {"fractions": [0.5]}}, dtype)


def test_every_command_runs_on_deepseeks_hub_fp8_layout_in_bf16(tmp_path):
    parent = _hub_fp8_deepseek_bf16(tmp_path / "parent")
    m = load_pretrained(parent)
    assert {p.dtype for p in m.parameters()} == {torch.bfloat16}
    assert {b.dtype for b in m.buffers()} <= {torch.float32}
    _run_every_command(parent, tmp_path, {"moe": {"top_k": [1]}})


def test_every_command_runs_on_gpt_oss_hub_mxfp4_layout_in_bf16(tmp_path):
    from test_family_gpt_oss import hub_mxfp4_checkpoint

    parent = hub_mxfp4_checkpoint(tmp_path / "parent", torch.bfloat16)
    assert {p.dtype for p in load_pretrained(parent).parameters()} == {torch.bfloat16}
    _run_every_command(parent, tmp_path, {"moe": {"top_k": [1]}})


def _modelopt_nemotron_h(tmp: Path) -> tuple[Path, Path]:
    """A tiny random Nemotron-H (Mamba, MoE, attention, MLP layers) exported as NVIDIA
    ships Nemotron-3-Super: every projection whose input width is a multiple of 16 NVFP4
    (the routed experts among them), the others FP8, embeddings, norms, router, Mamba
    convolution and head bf16, with ``hf_quant_config.json``; and the same model holding
    the weights those tensors stand for."""
    transformers = pytest.importorskip("transformers")
    from test_hf_parity import _configs, randomize

    torch.manual_seed(0)
    m = transformers.AutoModelForCausalLM.from_config(_configs()["nemotron_h"],
                                                      dtype=torch.float32)
    randomize(m, 0)
    src = tmp / "modelopt"
    m.to(torch.bfloat16).save_pretrained(src)
    sd = load_file(str(src / "model.safetensors"))
    ref = dict(sd)
    layers = {}
    for k in sorted(sd):
        if not (k.endswith("proj.weight") and ".layers." in k) or sd[k].dim() != 2:
            continue
        _, held = _quantize_into(sd, k, sd[k].shape[1] % 16 == 0, layers)
        ref[k] = held.to(torch.bfloat16)
    assert any(".experts." in b for b in layers) and any(".mixer.in_proj" in b for b in layers)
    save_file(sd, str(src / "model.safetensors"), metadata={"format": "pt"})
    (src / "hf_quant_config.json").write_text(json.dumps({
        "producer": {"name": "modelopt", "version": "0.47.0"},
        "quantization": {"quant_algo": "MIXED_PRECISION", "quantized_layers": layers}}))
    (tmp / "ref").mkdir()
    (tmp / "ref" / "config.json").write_text((src / "config.json").read_text())
    save_file(ref, str(tmp / "ref" / "model.safetensors"), metadata={"format": "pt"})
    return src, tmp / "ref"


def test_a_modelopt_nemotron_h_parent_reads_as_one_bf16_model_and_runs_every_command(
        tmp_path):
    """Super's layout on a tiny Nemotron-H: the experts, Mamba and attention projections
    dequantized on read to exactly the weights they stand for, one bf16 model, and score,
    build, distill, iterate and build --blocks run on it."""
    src, ref = _modelopt_nemotron_h(tmp_path / "parent")
    ours = load_pretrained(src).eval()
    assert {p.dtype for p in ours.parameters()} == {torch.bfloat16}
    want = load_pretrained(ref).eval()
    for (k, a), (_, b) in zip(ours.state_dict().items(), want.state_dict().items()):
        assert torch.equal(a, b), k
    _run_every_command(src, tmp_path, {"moe": {"top_k": [1]}, "attention": {"noop": True}})
