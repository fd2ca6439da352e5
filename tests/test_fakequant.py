"""Fake quantization with the real formats, and scoring of precision and span alternatives."""

from __future__ import annotations

import json

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from costmodels.dtypes import get_recipe  # noqa: E402
from nas.scoring.fakequant import (  # noqa: E402
    FORMATS,
    fake_fp8,
    fake_mxfp4,
    fake_nvfp4,
    nvfp4_scales,
    quantize_block,
    relative_rms_error,
    round_e2m1,
)
from nas.space.spans import NSR  # noqa: E402

pytestmark = pytest.mark.torch


def test_nvfp4_one_block_by_hand():
    """One 16-element block whose amax is 6: global scale 6 / (6 * 448), block scale
    e4m3(6 / 6 / g) = 448 exactly, so the elements are rounded to E2M1 as they are:
    ties to the even mantissa (0.25 -> 0, 0.75 -> 1, 1.25 -> 1, 1.75 -> 2, 2.5 -> 2,
    3.5 -> 4, 5 -> 4), others to nearest, beyond 6 saturating."""
    w = torch.tensor([[6.0, -6.0, 0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 0.3, -2.9, 4.4, 0.1,
                       -0.6, 1.6, 5.5]])
    want = torch.tensor([[6.0, -6.0, 0.0, 1.0, 1.0, 2.0, 2.0, 4.0, 4.0, 0.5, -3.0, 4.0, 0.0,
                          -0.5, 1.5, 6.0]])
    g, sb = nvfp4_scales(w)
    # g is a float32 quotient, within half a float32 step of 6 / 2688: allow one step
    assert float(g) == pytest.approx(6.0 / 2688.0, rel=torch.finfo(torch.float32).eps)
    assert sb.tolist() == [[448.0]]
    assert torch.equal(fake_nvfp4(w), want)


def test_nvfp4_block_scale_is_e4m3_rounded_by_hand():
    """Two blocks of one row: block A (amax 6) sets g = 6 / 2688; block B (amax 1) wants
    a scale 1/6/g = 74.67, which E4M3 (3 mantissa bits: 64, 72, 80 in [64, 128)) stores as
    72, so B's step is 72 * g = 0.160714...: 1.0 -> 6.22 saturates to 6 -> 0.964286,
    0.5 -> 3.11 -> 3 -> 0.482143, -0.25 -> -1.556 -> -1.5 -> -0.241071."""
    a = [6.0] + [0.0] * 15
    b = [1.0, 0.5, -0.25] + [0.0] * 13
    w = torch.tensor([a + b])
    g, sb = nvfp4_scales(w)
    assert sb.tolist() == [[448.0, 72.0]]
    step = 72.0 * 6.0 / 2688.0
    q = fake_nvfp4(w)
    assert q[0, 16:19].tolist() == pytest.approx([6 * step, 3 * step, -1.5 * step], rel=1e-6)
    assert q[0, 0] == 6.0 and (q[0, 19:] == 0).all()
    # every dequantized element is an E2M1 value times its block's step
    steps = (sb * g).repeat_interleave(16, dim=-1)
    assert torch.equal(round_e2m1(q / steps), q / steps)


def test_nvfp4_blocks_run_along_the_input_dimension_of_each_matrix():
    torch.manual_seed(0)
    w = torch.randn(3, 8, 40)  # stacked experts [E, out, in]; 40 = 2.5 blocks (padded)
    q = fake_nvfp4(w)
    for e in range(3):
        assert torch.equal(q[e], fake_nvfp4(w[e]))  # a global scale per expert matrix
    for r in range(8):
        assert torch.equal(q[0, r], fake_nvfp4(w[0, r:r + 1])[0] * 0 + q[0, r])
    assert torch.equal(fake_nvfp4(torch.zeros(2, 32)), torch.zeros(2, 32))


def test_fp8_per_tensor_by_hand():
    """amax 448: scale 1, so E4M3 rounding shows: 17 ties to 16 (even), 19 ties to 20,
    0.3 -> 0.3125 (step 2**-5 in [0.25, 0.5)), 0.001 -> the subnormal 2**-9."""
    w = torch.tensor([448.0, 17.0, 19.0, 0.3, 0.001, -0.001])
    assert fake_fp8(w).tolist() == [448.0, 16.0, 20.0, 0.3125, 2**-9, -(2**-9)]
    # scaled: the same grid times amax / 448
    assert fake_fp8(w * 0.5).tolist() == [v * 0.5 for v in fake_fp8(w).tolist()]


def test_mxfp4_power_of_two_scale_by_hand():
    """amax 6.5 in a 32-element block: scale 2**(floor(log2 6.5) - 2) = 1; 6.5 saturates
    to 6, 2.6 -> 3; a block of amax 0.75: scale 2**-3, 0.75 -> 6 * 0.125."""
    w = torch.tensor([[6.5, 2.6] + [0.0] * 30 + [0.75, 0.3] + [0.0] * 30])
    q = fake_mxfp4(w)
    assert q[0, :2].tolist() == [6.0, 3.0]
    assert q[0, 32:34].tolist() == [0.75, 0.25]


@pytest.mark.parametrize("fmt", [f for f in FORMATS if f != "fp32"])
def test_prior_error_table_matches_the_formats(fmt):
    """nas.space.spans.NSR (the structural prior's precision damage) is what the formats do to
    Gaussian weights, within 5 %."""
    g = torch.Generator().manual_seed(1)
    w = torch.randn(512, 2048, generator=g)
    assert relative_rms_error(w, fmt) == pytest.approx(NSR[fmt], rel=0.05)
    assert NSR["nvfp4"] > NSR["fp8"] > NSR["bf16"]


def test_quantize_block_follows_the_recipe_roles():
    from nas.arch import ModelArch, MoE
    from nas.modules.model import Block

    arch = ModelArch(hidden_size=32, vocab_size=64, blocks=(
        MoE(num_experts=4, top_k=2, expert_width=32, shared_width=32),))
    torch.manual_seed(0)
    b = Block(arch.blocks[0], arch)
    b.reset_parameters(0.02, 0.02)
    before = {k: v.clone() for k, v in b.state_dict().items()}
    done = quantize_block(b, get_recipe("nvfp4-super"))
    assert done["mixer.experts_up"] == "nvfp4"
    assert done["mixer.shared_experts.up_proj.weight"] == "fp8"
    assert "mixer.gate.weight" not in done and "norm.weight" not in done
    sd = b.state_dict()
    assert torch.equal(sd["mixer.experts_up"], fake_nvfp4(before["mixer.experts_up"]))
    assert torch.equal(sd["mixer.shared_experts.up_proj.weight"],
                       fake_fp8(before["mixer.shared_experts.up_proj.weight"]))
    assert torch.equal(sd["mixer.gate.weight"], before["mixer.gate.weight"])


def test_quantize_block_covers_mla_and_gpt_oss_weights():
    """Every GEMM weight of an MLA block and of gpt-oss's stacked experts takes its role's
    format; gpt-oss experts are stored [E, in, out], so their NVFP4 blocks run along dim 1
    (the reduction), not the last dimension."""
    from nas.arch import MLA, Attention, ModelArch, MoE
    from nas.modules.model import Block

    mla = MLA(num_heads=4, q_lora_rank=16, kv_lora_rank=16, qk_nope_head_dim=8,
              qk_rope_head_dim=8, v_head_dim=8)
    oss = MoE(num_experts=4, top_k=2, expert_width=32, gated=True, router_linear_bias=True,
              expert_bias=True, swiglu_limit=7.0, swiglu_alpha=1.702, norm_topk=True)
    arch = ModelArch(hidden_size=32, vocab_size=64, blocks=(
        mla, Attention(num_heads=4, num_kv_heads=2, head_dim=8, sinks=True), oss))
    torch.manual_seed(0)
    recipe = get_recipe("nvfp4")
    b = Block(arch.blocks[0], arch)
    b.reset_parameters(0.02, 0.02)
    done = quantize_block(b, recipe)
    gemms = {n for n, p in b.named_parameters() if n.endswith("proj.weight")}
    assert gemms and gemms <= set(done) and set(done.values()) == {"nvfp4"}
    b = Block(arch.blocks[2], arch)
    b.reset_parameters(0.02, 0.02)
    before = {k: v.clone() for k, v in b.state_dict().items()}
    done = quantize_block(b, recipe)
    assert set(done) == {"mixer.experts.gate_up_proj", "mixer.experts.down_proj"}
    w = before["mixer.experts.gate_up_proj"]
    assert torch.equal(b.state_dict()["mixer.experts.gate_up_proj"],
                       fake_nvfp4(w.transpose(1, 2)).transpose(1, 2))
    assert not torch.equal(b.state_dict()["mixer.experts.gate_up_proj"], fake_nvfp4(w))


@pytest.fixture(scope="module")
def wide_scores(trained_parent, tmp_path_factory):
    """The tiny parent scored with precision per block and spans (replace-1-span KL)."""
    from nas.child.checkpoint import save_pretrained
    from nas.scoring.job import Settings, prepare
    from nas.scoring.runner import run

    model, _, _, data = trained_parent
    d = tmp_path_factory.mktemp("widescore")
    save_pretrained(model, d / "parent")
    np.save(d / "tokens.npy", data.numpy().astype(np.uint16))
    spec = {"name": "tiny", "parent": "parent/config.json", "hardware": "h100-sxm",
            "precision": "bf16",
            "workloads": {"chat": {"isl": 128, "osl": 128, "batch": 1}},
            "search_space": {
                "precision": {"moe": ["nvfp4", "fp8"]},
                "spans": [{"kinds": ["attention", "ffn"], "replace_with": [
                    {"noop": True}, {"block": {"kind": "ffn"}}]}]}}
    (d / "spec.json").write_text(json.dumps(spec))
    job = prepare(d / "spec.json", d / "parent", d / "tokens.npy",
                  Settings(seq_len=64, max_tokens=512, calib_tokens=512, bld_steps=20,
                           bld_lr=3e-3))
    run(job, d / "out", progress=False)
    rows = [json.loads(json.dumps(r)) for r in _csv(d / "out" / "scores.csv")]
    return job, {(int(r["block"]), r["alternative"]): float(r["kl_div"]) for r in rows}


def _csv(path):
    import csv

    with open(path) as f:
        return list(csv.DictReader(f))


def test_precision_scored_by_fake_quant(wide_scores):
    """On the trained parent: NVFP4 experts lose more than FP8 experts, which lose a little
    (more than nothing); the parent in bf16 is scored too and is ~0."""
    job, kl = wide_scores
    assert job.base_recipe == "bf16"
    for b in (3, 5):  # the two MoE blocks
        assert kl[(b, "precision=nvfp4")] > kl[(b, "precision=fp8")] > 0.0
        assert kl[(b, "parent")] < 0.1 * kl[(b, "precision=fp8")]
    assert (1, "precision=nvfp4") not in kl  # FFN blocks have no choice here


def test_span_scored_replace_one_span(wide_scores):
    """[attention, FFN] spans: removing the span loses more than keeping only its FFN
    (trained by span BLD to stand in for both)."""
    job, kl = wide_scores
    spans = [k for k in kl if k[1].startswith("span2:")]
    assert spans
    for b in {k[0] for k in spans}:
        merged = next(v for (bb, lab), v in kl.items() if bb == b and lab.startswith(
            "span2:ffn"))
        assert kl[(b, "span2:noop")] > merged > 0.0
