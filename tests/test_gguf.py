"""GGUF files as parents (:mod:`nas.hf.gguf`): a tiny random Llama written as a Q8_0 GGUF
with the gguf package's writer (as llama.cpp's converter lays it out: Q and K rows permuted,
no ``output.weight`` when the embeddings are tied), read through transformers' GGUF support.

Bars: the converted folder's logits equal the GGUF-loaded transformers model's (max |diff|
<= 1e-6 in float32: the same dequantized weights through the same code), our own model loaded
from the folder is within 1e-4 of it (as in test_hf_parity); ``inspect`` and ``score`` take
the .gguf; a second conversion reuses the cache; a GGUF of an unknown architecture, one of an
architecture this package does not build, and a non-GGUF file named .gguf are each refused in
one line, exit 2, no traceback.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
gguf = pytest.importorskip("gguf")
pytest.importorskip("accelerate")

from nas.cli import main as cli  # noqa: E402
from nas.hf.gguf import cached_folder, convert, gguf_config, read_info  # noqa: E402

pytestmark = pytest.mark.torch

REPO = Path(__file__).resolve().parents[1]
VOCAB, HIDDEN, LAYERS, HEADS, KV_HEADS, FFN = 128, 64, 2, 4, 2, 96
SAME_TOL = 1e-6  # transformers on the GGUF vs transformers on the converted folder
OURS_TOL = 1e-4  # our model on the converted folder vs transformers (test_hf_parity's bar)
Q8_TOL = 0.1  # the Q8_0 GGUF's logits vs the float32 model it was written from


def _permute(w: np.ndarray, n_head: int, n_kv: int) -> np.ndarray:
    """llama.cpp's permutation of the Q / K rows (convert_hf_to_gguf.py's ``permute``), which
    transformers' GGUF loader reverses."""
    n = n_kv if n_kv != n_head else n_head
    return w.reshape(n, 2, w.shape[0] // n // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def tiny_llama(tied: bool, seed: int = 0):
    """A tiny random float32 LlamaForCausalLM (eval mode)."""
    cfg = transformers.LlamaConfig(
        vocab_size=VOCAB, hidden_size=HIDDEN, num_hidden_layers=LAYERS,
        num_attention_heads=HEADS, num_key_value_heads=KV_HEADS, intermediate_size=FFN,
        head_dim=HIDDEN // HEADS, max_position_embeddings=256, rms_norm_eps=1e-5,
        tie_word_embeddings=tied)
    torch.manual_seed(seed)
    m = transformers.AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
    with torch.no_grad():  # O(1) norm scales, so that the norms change the logits
        for n, p in m.named_parameters():
            if n.endswith("norm.weight"):
                p.copy_(torch.rand(p.shape) + 0.5)
    return m.eval()


def write_gguf(path: Path, model=None, arch: str = "llama", tied: bool = True,
               tokenizer: bool = False) -> Path:
    """``model`` (a :func:`tiny_llama`) as a GGUF file: 2-D weights in Q8_0, norms in F32,
    the llama metadata transformers maps to a config. ``arch`` other than ``llama`` writes the
    same tensors under that ``general.architecture``; ``tokenizer``: with a tiny byte-level
    BPE tokenizer (124 characters, the merges ``a b`` and ``c d``, ``<s>``, ``</s>``)."""
    model = model if model is not None else tiny_llama(tied)
    sd = {k: v.numpy() for k, v in model.state_dict().items()}
    w = gguf.GGUFWriter(str(path), arch)
    if tokenizer:
        tokens = [chr(i) for i in range(32, 32 + 124)] + ["ab", "cd", "<s>", "</s>"]
        w.add_tokenizer_model("gpt2")
        w.add_token_list(tokens)
        w.add_token_types([1] * len(tokens))
        w.add_token_merges(["a b", "c d"])
        w.add_bos_token_id(126)
        w.add_eos_token_id(127)
    w.add_block_count(LAYERS)
    w.add_context_length(256)
    w.add_embedding_length(HIDDEN)
    w.add_feed_forward_length(FFN)
    w.add_head_count(HEADS)
    w.add_head_count_kv(KV_HEADS)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_dimension_count(HIDDEN // HEADS)
    w.add_rope_freq_base(10000.0)
    w.add_vocab_size(VOCAB)
    w.add_file_type(gguf.LlamaFileType.MOSTLY_Q8_0)
    q8 = gguf.GGMLQuantizationType.Q8_0

    def add(name: str, a: np.ndarray) -> None:
        a = np.ascontiguousarray(a, dtype=np.float32)
        if a.ndim == 2:
            q = gguf.quants.quantize(a, q8)
            w.add_tensor(name, q, raw_shape=q.shape, raw_dtype=q8)
        else:
            w.add_tensor(name, a)

    add("token_embd.weight", sd["model.embed_tokens.weight"])
    for i in range(LAYERS):
        p = f"model.layers.{i}."
        add(f"blk.{i}.attn_norm.weight", sd[p + "input_layernorm.weight"])
        add(f"blk.{i}.attn_q.weight", _permute(sd[p + "self_attn.q_proj.weight"], HEADS, HEADS))
        add(f"blk.{i}.attn_k.weight",
            _permute(sd[p + "self_attn.k_proj.weight"], HEADS, KV_HEADS))
        add(f"blk.{i}.attn_v.weight", sd[p + "self_attn.v_proj.weight"])
        add(f"blk.{i}.attn_output.weight", sd[p + "self_attn.o_proj.weight"])
        add(f"blk.{i}.ffn_norm.weight", sd[p + "post_attention_layernorm.weight"])
        add(f"blk.{i}.ffn_gate.weight", sd[p + "mlp.gate_proj.weight"])
        add(f"blk.{i}.ffn_up.weight", sd[p + "mlp.up_proj.weight"])
        add(f"blk.{i}.ffn_down.weight", sd[p + "mlp.down_proj.weight"])
    add("output_norm.weight", sd["model.norm.weight"])
    if not model.config.tie_word_embeddings:
        add("output.weight", sd["lm_head.weight"])
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


@pytest.fixture(autouse=True)
def _cache(tmp_path, monkeypatch):
    """Every test converts into its own cache folder."""
    monkeypatch.setenv("PUZZLE_NAS_CACHE", str(tmp_path / "cache"))


def _env(tmp_path: Path) -> dict[str, str]:
    env = dict(os.environ, OMP_NUM_THREADS="1", PUZZLE_NAS_CACHE=str(tmp_path / "cache"))
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")])
    return env


def _nas(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "nas", *args], capture_output=True, text=True,
                          env=_env(tmp_path), timeout=300)


@pytest.mark.parametrize("tied", [True, False])
def test_converted_folder_computes_the_gguf_models_logits(tmp_path, tied):
    from nas.child import load_pretrained

    original = tiny_llama(tied)
    f = write_gguf(tmp_path / "tiny.gguf", original)
    folder, now = convert(f)
    assert now and folder.parent == tmp_path / "cache" / "gguf"
    cfg = json.loads((folder / "config.json").read_text())
    assert "quantization_config" not in cfg and cfg["tie_word_embeddings"] is tied
    assert cfg["torch_dtype"] == "float32" and cfg["model_type"] == "llama"
    theirs = transformers.AutoModelForCausalLM.from_pretrained(
        str(tmp_path), gguf_file="tiny.gguf", dtype=torch.float32).eval()
    plain = transformers.AutoModelForCausalLM.from_pretrained(folder).eval()
    ours = load_pretrained(folder).eval()
    assert (plain.lm_head.weight.data_ptr() == plain.model.embed_tokens.weight.data_ptr()) is tied
    x = torch.randint(0, VOCAB, (2, 11), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        a, b, c = theirs(x).logits, plain(x).logits, ours(x).float()
        d = original(x).logits
    assert float((a - b).abs().max()) <= SAME_TOL
    assert float((a - c).abs().max()) <= OURS_TOL
    assert 0 < float((a - d).abs().max()) <= Q8_TOL  # quantized, and laid out right
    assert ours.num_parameters() == plain.num_parameters()


def test_inspect_a_gguf_and_the_cache_is_reused(tmp_path):
    f = write_gguf(tmp_path / "tiny.gguf")
    r = _nas(tmp_path, "inspect", str(f))
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith(f"{f}: llama, 4 blocks 2 attention, 2 ffn")
    assert "GGUF (Q8_0), architecture 'llama'" in r.stderr and "Traceback" not in r.stderr
    assert not (tmp_path / "cache").exists()  # inspect reads the config only
    info = read_info(f)
    assert (info.architecture, info.quant) == ("llama", "Q8_0")
    folder, now = convert(f)
    stamp = (folder / "model.safetensors").stat().st_mtime_ns
    again, now2 = convert(f)
    assert now and not now2 and again == folder
    assert (folder / "model.safetensors").stat().st_mtime_ns == stamp
    assert gguf_config(f) == json.loads((folder / "config.json").read_text())
    assert [p.name for p in folder.parent.iterdir()] == [folder.name]  # no temp left
    os.utime(f, ns=(stamp, stamp + 10**9))  # a changed file is a new entry
    assert cached_folder(f) != folder


def test_the_gguf_tokenizer_is_written_beside_the_weights(tmp_path):
    tokenizers = pytest.importorskip("tokenizers")
    folder, _ = convert(write_gguf(tmp_path / "tok.gguf", tokenizer=True))
    src = json.loads((folder / "gguf-source.json").read_text())
    assert src["tokenizer"] == "written" and src["quant"] == "Q8_0"
    tok = tokenizers.Tokenizer.from_file(str(folder / "tokenizer.json"))
    assert tok.encode("abc d").ids == [124, 67, 0, 68]  # "ab" merged, "c", " ", "d"
    folder, _ = convert(write_gguf(tmp_path / "plain.gguf"))
    assert json.loads((folder / "gguf-source.json").read_text())["tokenizer"] == \
        "none in the file"


def test_score_takes_a_gguf_parent(tmp_path):
    """``puzzle-nas score --parent tiny.gguf`` end to end, the spec's parent the .gguf too;
    the second run says the conversion was reused."""
    f = write_gguf(tmp_path / "tiny.gguf")
    np.save(tmp_path / "tokens.npy",
            np.random.default_rng(0).integers(0, VOCAB, 4096).astype(np.uint16))
    spec = {"name": "tiny-gguf", "parent": "tiny.gguf", "hardware": "h100-sxm",
            "workloads": {"chat": {"isl": 128, "osl": 128, "batch": 1}},
            "search_space": {"attention": {"kv_heads": [1], "noop": True},
                             "ffn": {"fractions": [0.5], "noop": True}}}
    (tmp_path / "spec.json").write_text(json.dumps(spec))
    args = ["score", str(tmp_path / "spec.json"), "--parent", str(f), "--data",
            str(tmp_path / "tokens.npy"), "--seq-len", "32", "--max-tokens", "256",
            "--calib-tokens", "256"]
    r = _nas(tmp_path, *args, "-o", str(tmp_path / "s1"))
    assert r.returncode == 0, r.stderr
    assert (f"parent {f}: GGUF (Q8_0) dequantized to float32 by transformers; converted once "
            f"to {tmp_path / 'cache' / 'gguf'}") in r.stderr
    assert (tmp_path / "s1" / "scores.csv").is_file()
    rows = (tmp_path / "s1" / "scores.csv").read_text().splitlines()[1:]
    assert {r.split(",")[0] for r in rows} == {"0", "1", "2", "3"}  # every block scored
    r = _nas(tmp_path, *args, "-o", str(tmp_path / "s2"), "--json")
    assert r.returncode == 0, r.stderr
    assert "converted once (reused) to" in r.stderr
    r = _nas(tmp_path, "score", str(tmp_path / "spec.json"), "--parent", str(f), "--plan")
    assert r.returncode == 0, r.stderr


def test_build_and_distill_take_a_gguf_parent(tmp_path, capsys):
    """``build --parent tiny.gguf`` builds the child from the converted folder, and
    ``distill --teacher tiny.gguf`` distills it: the .gguf works where a folder does."""
    from nas.hf import load_config, to_hf

    f = write_gguf(tmp_path / "tiny.gguf")
    arch = load_config(f)
    (tmp_path / "child.json").write_text(json.dumps(to_hf(arch)))
    (tmp_path / "calib.json").write_text(json.dumps(
        np.random.default_rng(1).integers(0, VOCAB, (2, 32)).tolist()))
    capsys.readouterr()
    assert cli(["build", str(tmp_path / "child.json"), "--calib", str(tmp_path / "calib.json"),
                "-o", str(tmp_path / "child"), "--parent", str(f)]) == 0
    assert "dequantized to float32 by transformers" in capsys.readouterr().err
    assert (tmp_path / "child" / "config.json").is_file()
    np.save(tmp_path / "tokens.npy",
            np.random.default_rng(2).integers(0, VOCAB, 4096).astype(np.int64))
    assert cli(["distill", str(tmp_path / "child"), "--teacher", str(f), "--data",
                str(tmp_path / "tokens.npy"), "-o", str(tmp_path / "kd"), "--tokens", "512",
                "--seq-len", "32", "--batch", "4", "--eval-tokens", "256"]) == 0
    err = capsys.readouterr().err
    assert f"teacher {f}: GGUF (Q8_0)" in err and "(reused)" in err, err
    assert (tmp_path / "kd" / "model" / "config.json").is_file()


def _refused(tmp_path: Path, f: Path, *commands: list[str]) -> list[str]:
    errs = []
    for c in commands:
        r = _nas(tmp_path, *c)
        assert r.returncode == 2, (c, r.stdout, r.stderr)
        lines = r.stderr.strip().splitlines()
        assert len(lines) == 1 and "Traceback" not in r.stderr, r.stderr
        assert str(f) in lines[0]
        errs.append(lines[0])
    return errs


def test_unknown_architecture_and_not_a_gguf_are_refused_in_one_line(tmp_path):
    unknown = write_gguf(tmp_path / "unknown.gguf", arch="frobnicator")
    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps({"name": "x", "parent": "unknown.gguf", "hardware": "h100-sxm",
                                "workloads": {"chat": {"isl": 8, "osl": 8, "batch": 1}}}))
    for e in _refused(tmp_path, unknown, ["inspect", str(unknown)],
                      ["score", str(spec), "--parent", str(unknown), "--data", "x.npy",
                       "-o", str(tmp_path / "o")]):
        assert "GGUF architecture 'frobnicator' cannot be read by transformers" in e
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"\x89PNG\r\n\x1a\n" + bytes(range(256)))
    for e in _refused(tmp_path, bad, ["inspect", str(bad)],
                      ["score", str(spec), "--parent", str(bad), "--data", "x.npy",
                       "-o", str(tmp_path / "o")],
                      ["iterate", str(spec), "--parent", str(unknown), "--teacher", str(bad),
                       "--data", "x.npy", "-o", str(tmp_path / "o"), "--kd-tokens", "64"]):
        assert "not a GGUF file" in e
    assert not (tmp_path / "cache").exists()  # refused before anything was converted
    missing = tmp_path / "missing.gguf"
    (e,) = _refused(tmp_path, missing, ["inspect", str(missing)])
    assert "file not found" in e
    assert not (tmp_path / "o").exists()


def test_an_architecture_transformers_reads_but_puzzle_nas_does_not_build(tmp_path):
    """A GGUF whose config transformers maps (gpt2) to a model type no dialect reads: refused
    naming the file and its architecture, before any tensor is dequantized."""
    from hwprofiles.errors import InputError

    f = tmp_path / "g.gguf"
    w = gguf.GGUFWriter(str(f), "gpt2")
    w.add_block_count(1)
    w.add_context_length(64)
    w.add_embedding_length(32)
    w.add_feed_forward_length(64)
    w.add_head_count(2)
    w.add_layer_norm_eps(1e-5)
    w.add_vocab_size(VOCAB)
    w.add_tensor("token_embd.weight", np.zeros((VOCAB, 32), np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with pytest.raises(InputError, match=r"g\.gguf \(GGUF architecture 'gpt2'\).*"
                                         r"unsupported model_type 'gpt2'"):
        convert(f)
    assert not (tmp_path / "cache" / "gguf").exists() or \
        not any((tmp_path / "cache" / "gguf").iterdir())
    (e,) = _refused(tmp_path, f, ["inspect", str(f)])
    assert "unsupported model_type 'gpt2'" in e


def test_nas_imports_without_torch_after_the_gguf_module():
    code = ("import sys, nas, nas.hf, nas.hf.gguf, nas.cli.inspect, nas.cli.score; "
            "sys.exit('torch' in sys.modules or 'transformers' in sys.modules "
            "or 'gguf' in sys.modules)")
    env = dict(os.environ, PYTHONPATH=str(REPO))
    assert subprocess.run([sys.executable, "-c", code], env=env).returncode == 0
