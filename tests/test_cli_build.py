"""``puzzle-nas build``: build, init from a parent checkpoint, save, summary, errors."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("safetensors")

from safetensors.torch import save_file  # noqa: E402

from nas.arch import FFN, Attention, Mamba, ModelArch, MoE  # noqa: E402
from nas.build import build_model, load_pretrained, save_pretrained  # noqa: E402
from nas.cli import main  # noqa: E402
from nas.hf import to_hf  # noqa: E402

pytestmark = pytest.mark.torch
torch.set_num_threads(1)

PARENT = ModelArch(hidden_size=32, vocab_size=256, model_type="nemotron_h", blocks=(
    Mamba(num_heads=4, head_dim=8, state_size=8, n_groups=2),
    MoE(num_experts=6, top_k=2, expert_width=16, gated=False, activation="relu2",
        router="sigmoid", router_bias=True, shared_width=16),
    Attention(num_heads=4, num_kv_heads=2, head_dim=8, rope=False),
    FFN(width=48, gated=False, activation="relu2")))


def _child() -> ModelArch:
    b = list(PARENT.blocks)
    b[1] = b[1].model_copy(update={"num_experts": 4, "top_k": 1})
    b[3] = FFN(width=16, gated=False, activation="relu2")
    return PARENT.replace_blocks(b)


@pytest.fixture
def parent_dir(tmp_path):
    return save_pretrained(build_model(PARENT, seed=0), tmp_path / "parent")


def test_cli_module_does_not_import_torch():
    code = "import sys, nas.cli, nas.cli.build; sys.exit('torch' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0


def test_build_plain_config_random_init(tmp_path, capsys):
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps(to_hf(PARENT)))
    assert main(["build", str(cfg), "-o", str(tmp_path / "out"), "--dtype", "bfloat16"]) == 0
    out = capsys.readouterr().out
    total = PARENT.param_counts().total
    assert f"parameters {total:,}" in out and f"predicted {total:,}" in out
    assert "nemotron_h" in out and "bfloat16" in out
    model = load_pretrained(tmp_path / "out")
    assert model.num_stored() == total and model.embed.weight.dtype == torch.bfloat16


@pytest.mark.parametrize("calib_kind", ["text", "json", "safetensors", "npy"])
def test_build_blueprint_from_parent(tmp_path, parent_dir, capsys, calib_kind):
    child = _child()
    bp = tmp_path / "blueprint.json"
    bp.write_text(json.dumps({"child": to_hf(child), "predicted": {"note": "ignored"}}))
    text = ("The quick brown fox jumps over the lazy dog. " * 40).encode()
    if calib_kind == "text":
        calib = tmp_path / "calib.txt"
        calib.write_bytes(text)
    elif calib_kind == "json":
        calib = tmp_path / "calib.json"
        calib.write_text(json.dumps(list(text)))
    elif calib_kind == "npy":  # as score and distill read it (issue: was read as bytes)
        calib = tmp_path / "calib.npy"
        np.save(calib, np.frombuffer(text, dtype=np.uint8).astype(np.uint16))
    else:
        calib = tmp_path / "calib.safetensors"
        save_file({"tokens": torch.tensor(list(text)).view(4, -1)}, str(calib))
    bytes_ = ["--tokenizer", "bytes"] if calib_kind == "text" else []
    rc = main(["build", str(bp), "--parent", str(parent_dir), "--calib", str(calib),
               "-o", str(tmp_path / "child"), "--calib-len", "64", "--json"] + bytes_)
    assert rc == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["model_type"] == "nemotron_h"  # one shape per kind: plain nemotron_h
    assert summary["parameters"] == child.param_counts().total == summary["predicted_total"]
    assert "experts 6 -> 4" in summary["init"][1] and "top-k 2 -> 1" in summary["init"][1]
    assert "width 48 -> 16 by channel contribution" in summary["init"][3]
    parent = load_pretrained(parent_dir)
    model = load_pretrained(tmp_path / "child")
    assert model.arch.blocks == child.blocks
    for i in (0, 2):  # unchanged blocks are copied exactly
        for a, b in zip(parent.blocks[i].parameters(), model.blocks[i].parameters()):
            assert torch.equal(a, b)


def test_build_errors_exit_2_with_one_line(tmp_path, parent_dir, capsys):
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps(to_hf(PARENT)))
    out = str(tmp_path / "o")
    assert main(["build", str(cfg), "--parent", str(parent_dir), "-o", out]) == 2
    assert "--parent and --calib go together" in capsys.readouterr().err
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps([1, 2, 999]))
    assert main(["build", str(cfg), "--parent", str(parent_dir), "--calib", str(bad),
                 "-o", out]) == 2
    assert "[0, 256)" in capsys.readouterr().err
    text = tmp_path / "calib.txt"  # text is never tokenized without --tokenizer
    text.write_text("some words")
    assert main(["build", str(cfg), "--parent", str(parent_dir), "--calib", str(text),
                 "-o", out]) == 2
    assert "calib.txt: a text data file needs --tokenizer" in capsys.readouterr().err
    bp = tmp_path / "bp.json"
    bp.write_text(json.dumps({"child": [1]}))
    assert main(["build", str(bp), "-o", out]) == 2
    err = capsys.readouterr().err
    assert "bp.json: child: expected the child HF config object" in err
    assert len(err.strip().splitlines()) == 1
    (tmp_path / "broken.json").write_text("{")
    assert main(["build", str(tmp_path / "broken.json"), "-o", out]) == 2
    assert "not valid JSON" in capsys.readouterr().err
    assert not (tmp_path / "o").exists()


def test_build_refuses_when_the_estimate_exceeds_memory(tmp_path, parent_dir, capsys,
                                                        monkeypatch):
    import nas.build.memory

    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps(to_hf(_child())))
    calib = tmp_path / "calib.json"
    calib.write_text(json.dumps(list(range(64))))
    out = tmp_path / "o"
    monkeypatch.setattr(nas.build.memory, "available_memory", lambda: 1_000_000)
    for extra in ([], ["--parent", str(parent_dir), "--calib", str(calib)]):
        assert main(["build", str(cfg), "-o", str(out), *extra]) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and "GiB is available; pass --force" in err, err
        assert "building needs about 0.5 GiB" in err
        assert not out.exists()
    assert main(["build", str(cfg), "-o", str(out), "--force", "--parent", str(parent_dir),
                 "--calib", str(calib)]) == 0
    assert load_pretrained(out).num_stored() == _child().param_counts().total
