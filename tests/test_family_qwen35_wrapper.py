"""A Qwen3.5 MoE image-text wrapper checkpoint as a parent.

The published Qwen3.5 MoE checkpoints (e.g. https://huggingface.co/Qwen/Qwen3.5-35B-A3B) are
``Qwen3_5MoeForConditionalGeneration`` (``model_type`` ``qwen3_5_moe``: a ``text_config`` and
a ``vision_config``), the language model's tensors under ``model.language_model.*``, the
vision tower's under ``model.visual.*``. transformers 5.24 builds a tiny random one on the
CPU, which these tests save and read: the language model is read (logits equal the
wrapper's on text tokens), the vision tower is left out and the build says so, and a child
built from it is the text-only ``qwen3_5_moe_text`` that transformers loads.
"""

from __future__ import annotations

import json

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from nas.arch import MoE  # noqa: E402
from nas.hf import to_hf  # noqa: E402

# One thread, as tests/test_build.py: two torch threads per process oversubscribe a shared
# 2-core CI box and tiny ops get ~30x slower.
torch.set_num_threads(1)

TEXT = dict(vocab_size=96, hidden_size=32, num_hidden_layers=4, num_attention_heads=4,
            num_key_value_heads=2, head_dim=16, max_position_embeddings=256,
            tie_word_embeddings=False, bos_token_id=1, eos_token_id=None, pad_token_id=0,
            linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=8,
            linear_value_head_dim=6, linear_conv_kernel_dim=4, num_experts=4,
            num_experts_per_tok=2, moe_intermediate_size=16,
            shared_expert_intermediate_size=24,
            layer_types=["linear_attention", "full_attention", "linear_attention",
                         "full_attention"],
            rope_parameters={"rope_type": "default", "rope_theta": 1e4,
                             "partial_rotary_factor": 0.5, "mrope_section": [2, 1, 1],
                             "mrope_interleaved": True})
VISION = dict(depth=2, hidden_size=16, intermediate_size=24, num_heads=2, out_hidden_size=32,
              patch_size=4, spatial_merge_size=2, temporal_patch_size=2,
              num_position_embeddings=16)


@pytest.fixture(scope="module")
def wrapper(tmp_path_factory):
    """A tiny random Qwen3_5MoeForConditionalGeneration saved by transformers (float32)."""
    from test_hf_parity import randomize

    cfg = transformers.Qwen3_5MoeConfig(text_config=TEXT, vision_config=VISION,
                                        tie_word_embeddings=False)
    torch.manual_seed(0)
    m = transformers.Qwen3_5MoeForConditionalGeneration(cfg).eval()
    randomize(m, 0)
    path = tmp_path_factory.mktemp("q35") / "hf"
    m.save_pretrained(path)
    return m, path


def _max_diff(a, b) -> float:
    return float((a - b).abs().max())


def test_wrapper_checkpoint_reads_the_language_model(wrapper, tmp_path):
    """The language model is read (the vision tensors left out, named), computes the
    wrapper's logits on text tokens, and saves as the text-only qwen3_5_moe_text, which
    transformers' Qwen3_5MoeForCausalLM loads with the same logits."""
    from test_hf_parity import _prompt

    from nas.child import load_pretrained, save_pretrained
    from nas.child.checkpoint import CheckpointReader

    theirs, path = wrapper
    reader = CheckpointReader(path)
    assert reader.arch.model_type == "qwen3_5_moe"
    visual = {k for k, _ in theirs.named_parameters() if k.startswith("model.visual.")}
    assert visual and set(reader.left_out) == visual
    assert "vision tower" in reader.left_out_note
    assert all(n.startswith(("model.language_model.", "lm_head.")) for _, n, _ in reader.layout)
    ours = load_pretrained(path).eval()
    lm = sum(p.numel() for k, p in theirs.named_parameters() if not k.startswith("model.visual."))
    assert ours.num_parameters() == lm == ours.arch.param_counts().total
    save_pretrained(ours, tmp_path / "text")
    assert json.loads((tmp_path / "text" / "config.json").read_text())["model_type"] == \
        "qwen3_5_moe_text"
    text, info = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "text",
                                                                   output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"], info
    prompt = _prompt()
    with torch.no_grad():
        want = theirs(input_ids=prompt).logits
        assert _max_diff(ours(prompt), want) <= 1e-4
        assert _max_diff(text.eval()(prompt).logits, want) <= 1e-4


def test_build_from_a_wrapper_parent(wrapper, tmp_path, capsys):
    """``puzzle-nas build --parent <wrapper>`` (a child with fewer experts): the output says
    the vision tower was left out; the child is the text-only qwen3_5_moe_text, initialized
    from the wrapper's language model, and transformers loads it with our logits."""
    from test_hf_parity import _prompt

    from nas.child import load_pretrained
    from nas.cli import main
    from nas.hf import load_config

    _, path = wrapper
    calib = tmp_path / "calib.json"
    calib.write_text(json.dumps(_prompt(2).tolist()))
    arch = load_config(path)
    child = arch.replace_blocks([b.model_copy(update={"num_experts": 3})
                                 if isinstance(b, MoE) else b for b in arch.blocks])
    (tmp_path / "child.json").write_text(json.dumps(to_hf(child)))
    assert main(["build", str(tmp_path / "child.json"), "--parent", str(path), "--calib",
                 str(calib), "-o", str(tmp_path / "child")]) == 0
    out = capsys.readouterr().out
    assert "left out: the vision tower (model.visual.*)" in out and "experts 4 -> 3" in out
    cfg = json.loads((tmp_path / "child" / "config.json").read_text())
    assert cfg["model_type"] == "qwen3_5_moe_text" and "vision_config" not in cfg
    ours = load_pretrained(tmp_path / "child").eval()
    text = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "child").eval()
    assert type(text).__name__ == "Qwen3_5MoeForCausalLM"
    prompt = _prompt(3)
    with torch.no_grad():
        assert _max_diff(ours(prompt), text(prompt).logits) <= 1e-4


def test_score_from_a_wrapper_parent(wrapper, tmp_path, capsys):
    """``puzzle-nas score --parent <wrapper>`` end to end: the spec's parent is the wrapper's
    own config.json, every alternative is scored on the language model (the parent's own
    block at KL 0, a removed MoE above it), and the output says the vision tower was left
    out, in the words ``puzzle-nas build`` uses (scores.json: parent_left_out)."""
    import csv

    import numpy as np

    from nas.child.checkpoint import CheckpointReader
    from nas.cli import main

    _, path = wrapper
    tokens = torch.randint(2, 96, (4096,), generator=torch.Generator().manual_seed(5))
    np.save(tmp_path / "tokens.npy", tokens.numpy().astype(np.uint16))
    spec = {"name": "q35-wrapper", "parent": str(path / "config.json"),
            "hardware": "h100-sxm", "workloads": {"chat": {"isl": 128, "osl": 128, "batch": 1}},
            "search_space": {"moe": {"top_k": [1], "noop": True}}}
    (tmp_path / "spec.json").write_text(json.dumps(spec))
    assert main(["score", str(tmp_path / "spec.json"), "--parent", str(path), "--data",
                 str(tmp_path / "tokens.npy"), "-o", str(tmp_path / "scores"), "--seq-len",
                 "32", "--max-tokens", "256", "--calib-tokens", "256"]) == 0
    out = capsys.readouterr().out
    note = CheckpointReader(path).left_out_note
    assert note and "the vision tower (model.visual.*)" in note
    assert f"  parent: {note}" in out.splitlines()
    record = json.loads((tmp_path / "scores" / "scores.json").read_text())
    assert record["parent_left_out"] == note
    with open(tmp_path / "scores" / "scores.csv") as f:
        rows = list(csv.DictReader(f))
    moe_blocks = {i for i, b in enumerate(CheckpointReader(path).arch.blocks)
                  if isinstance(b, MoE)}
    assert {int(r["block"]) for r in rows if r["alternative"] != "parent"} == moe_blocks
    for r in rows:
        kl = float(r["kl_div"])
        assert kl == 0.0 if r["alternative"] == "parent" else kl > 0.0, r
