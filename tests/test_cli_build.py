"""``puzzle-nas build``: build, init from a parent checkpoint, save, summary, errors."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("safetensors")

from safetensors.torch import save_file  # noqa: E402

from nas.arch import FFN, Attention, Mamba, ModelArch, MoE  # noqa: E402
from nas.child import build_model, load_pretrained, save_pretrained  # noqa: E402
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
    import nas.child.memory

    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps(to_hf(_child())))
    calib = tmp_path / "calib.json"
    calib.write_text(json.dumps(list(range(64))))
    out = tmp_path / "o"
    monkeypatch.setattr(nas.child.memory, "available_memory", lambda: 1_000_000)
    for extra in ([], ["--parent", str(parent_dir), "--calib", str(calib)]):
        assert main(["build", str(cfg), "-o", str(out), *extra]) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and "GiB is available; pass --force" in err, err
        assert "building needs about 0.5 GiB" in err
        assert not out.exists()
    assert main(["build", str(cfg), "-o", str(out), "--force", "--parent", str(parent_dir),
                 "--calib", str(calib)]) == 0
    assert load_pretrained(out).num_stored() == _child().param_counts().total


# ---- the same build again, --force, the parent's tokenizer (issue 48) -----------------------
def _files(folder) -> dict[str, tuple[bytes, int]]:
    """Every entry of ``folder``: its bytes and modification time (a rewrite changes it)."""
    return {p.name: (p.read_bytes(), p.stat().st_mtime_ns) for p in sorted(folder.iterdir())}


def _one_line(err: str) -> str:
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    return err.strip()


def test_the_same_build_again_is_done_and_other_inputs_need_force(tmp_path, parent_dir,
                                                                  capsys):
    """The same command into the same -o exits 0 at once saying the child is built (nothing
    rewritten); other inputs, or a child changed since, are refused in one line naming
    what differs, and --force replaces the folder whole."""
    bp = tmp_path / "blueprint.json"
    bp.write_text(json.dumps({"child": to_hf(_child())}))
    calib = tmp_path / "calib.npy"
    np.save(calib, np.random.default_rng(0).integers(0, 256, 2048).astype(np.uint16))
    out = tmp_path / "child"
    argv = ["build", str(bp), "--parent", str(parent_dir), "--calib", str(calib),
            "--calib-len", "64", "-o", str(out)]
    assert main([*argv, "--json"]) == 0
    first = json.loads(capsys.readouterr().out)
    assert first["already_built"] is False and first["tokenizer"] == []  # the parent has none
    built = _files(out)
    assert sorted(built) == ["build.json", "config.json", "model.safetensors"]
    rec = json.loads((out / "build.json").read_text())
    assert rec["inputs"]["parent"] == str(parent_dir.resolve())
    assert rec["inputs"]["settings"]["calib_len"] == 64

    assert main(argv) == 0
    assert "already built from these inputs" in capsys.readouterr().out
    assert main([*argv, "--json"]) == 0
    again = json.loads(capsys.readouterr().out)
    assert again == {**first, "already_built": True}
    bp.write_text(bp.read_text())  # rewritten with the same content: the same input
    assert main(argv) == 0 and "already built" in capsys.readouterr().out
    assert _files(out) == built  # nothing was written

    for extra, why in ((["--seed", "1"], "--seed"), (["--dtype", "bfloat16"], "--dtype"),
                       (["--calib-len", "32"], "--calib-len")):
        assert main([*argv, *extra]) == 2
        line = _one_line(capsys.readouterr().err)
        assert f"other inputs ({why})" in line and "--force" in line, line
    np.save(calib, np.random.default_rng(1).integers(0, 256, 2048).astype(np.uint16))
    assert main(argv) == 2
    assert f"{calib} changed since" in _one_line(capsys.readouterr().err)
    assert _files(out) == built

    assert main([*argv, "--seed", "1", "--force"]) == 0  # the new calibration, seed 1
    assert "RANDOM" not in capsys.readouterr().out
    assert sorted(os.listdir(out)) == sorted(built)
    assert json.loads((out / "build.json").read_text())["inputs"]["settings"]["seed"] == 1
    assert load_pretrained(out).arch.blocks == _child().blocks
    assert main([*argv, "--seed", "1"]) == 0 and "already built" in capsys.readouterr().out
    cfg = json.loads((out / "config.json").read_text())  # the child edited since
    (out / "config.json").write_text(json.dumps(cfg, indent=1))
    assert main([*argv, "--seed", "1"]) == 2
    assert "the child's files changed" in _one_line(capsys.readouterr().err)
    assert sorted(os.listdir(tmp_path)) == ["blueprint.json", "calib.npy", "child", "parent"]


def test_a_child_with_its_modeling_code_is_found_built(tmp_path, capsys):
    """A heterogeneous Llama child (nemotron-nas: written with its modeling code) built
    again: found built, where its modeling files were once refused as foreign."""
    from conftest import tiny_llama_checkpoint

    pdir, _, parent, _ = tiny_llama_checkpoint(tmp_path)
    att = parent.blocks[0]
    assert isinstance(att, Attention)
    child = parent.replace_blocks([att, FFN(width=32), att, FFN(width=64)])
    cfg = tmp_path / "child.json"
    cfg.write_text(json.dumps(to_hf(child)))
    calib = tmp_path / "calib.json"
    calib.write_text(json.dumps(list(range(64)) * 2))
    out = tmp_path / "out"
    argv = ["build", str(cfg), "--parent", str(pdir), "--calib", str(calib),
            "--calib-len", "32", "-o", str(out)]
    assert main(argv) == 0
    assert "nemotron-nas" in capsys.readouterr().out
    code = sorted(n for n in os.listdir(out) if n.endswith(".py"))
    assert "modeling_puzzle_nas.py" in code
    assert main(argv) == 0 and "already built" in capsys.readouterr().out
    assert main([*argv, "--seed", "3", "--force"]) == 0
    assert sorted(n for n in os.listdir(out) if n.endswith(".py")) == code


def test_the_child_gets_the_parent_tokenizer(tmp_path, capsys):
    """The trained tiny parent with a tokenizer: the child built from it holds identical
    copies of the tokenizer files, and transformers loads the child's tokenizer."""
    import shutil

    from conftest import write_tokenizer
    from tiny_parent import FROZEN, PARENT, english_bytes

    parent = tmp_path / "parent"
    shutil.copytree(FROZEN, parent)
    files = write_tokenizer(parent)
    child = PARENT.replace_blocks([FFN(width=b.width // 2) if isinstance(b, FFN) else b
                                   for b in PARENT.blocks])
    (tmp_path / "child.json").write_text(json.dumps(to_hf(child)))
    tokens = tmp_path / "tokens.npy"
    np.save(tokens, np.frombuffer(english_bytes(), dtype=np.uint8).astype(np.int32))
    out = tmp_path / "child"
    assert main(["build", str(tmp_path / "child.json"), "--parent", str(parent), "--calib",
                 str(tokens), "--calib-len", "64", "-o", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "tokenizer: tokenizer.json, tokenizer_config.json, generation_config.json " \
           "copied from the parent" in printed, printed
    for name, data in files.items():
        assert (out / name).read_bytes() == data, name
    assert load_pretrained(out).arch.blocks == child.blocks
    transformers = pytest.importorskip("transformers")
    tok = transformers.AutoTokenizer.from_pretrained(str(out))
    assert tok("the quick brown fox")["input_ids"] == [1, 2, 0, 3]
