"""``puzzle-nas search --realize``: every child of the MIP's pool is built and measured
against the parent, the measurement is written beside the additive prediction, and the
child with the lowest measured KL is chosen (``nas.scoring.realize``)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.torch

from conftest import tiny_llama_checkpoint  # noqa: E402

from nas.cli import main  # noqa: E402


def _spec(tmp_path: Path, parent: Path, scores: Path | None = None, diverse: int = 4) -> Path:
    spec = {"name": "tiny", "parent": str(parent), "hardware": "h100-sxm",
            "workloads": {"chat": {"isl": 64, "osl": 64, "batch": 1}},
            "search_space": {"attention": {"kv_heads": [1], "noop": True},
                             "ffn": {"fractions": [0.5, 0.25], "noop": True}},
            "budgets": [{"metric": "total_params", "max": "70%"}],
            "solver": {"diverse": diverse, "min_distance": 1}}
    if scores is not None:
        spec["quality"] = {"scores": str(scores / "scores.csv"), "metric": "kl_div"}
    path = tmp_path / "spec.json"
    path.write_text(json.dumps(spec))
    return path


def _tokens(tmp_path: Path, n: int = 2048, seed: int = 0) -> Path:
    ids = np.random.default_rng(seed).integers(0, 64, n).astype(np.int64)
    np.save(tmp_path / "tokens.npy", ids)
    return tmp_path / "tokens.npy"


def test_the_pool_is_realized_measured_and_the_lowest_measured_kl_chosen(tmp_path, capsys):
    from nas.child import init_from_parent, load_pretrained
    from nas.hf import from_hf
    from nas.scoring.realize import load_record, pool_files

    pdir, *_ = tiny_llama_checkpoint(tmp_path)
    data = _tokens(tmp_path)
    out = tmp_path / "out"
    assert main(["search", str(_spec(tmp_path, pdir)), "-o", str(out), "--quiet",
                 "--realize", str(data), "--realize-tokens", "1024", "--seq-len", "32"]) == 0
    text = capsys.readouterr().out
    assert "Spearman(predicted, measured) over 4 children" in text
    rec = load_record(out)
    files = pool_files(out)
    assert [c.file for c in rec.children] == [f.name for f in files] and len(files) == 4
    assert rec.tokens == 1024 and all(c.init == "parent" for c in rec.children)
    # the measurement is the child's KL to the parent on the last 1,024 tokens, as built
    ids = np.load(data)[-1024:]
    parent = load_pretrained(pdir).eval()
    rows = torch.as_tensor(ids).reshape(-1, 32)
    for c, f in zip(rec.children, files):
        bp = json.loads(f.read_text())
        assert c.predicted == bp["quality"]["value"]
        child = init_from_parent(from_hf(bp["child"]), parent, rows[:8]).eval()
        with torch.no_grad():  # every position with a next token, float64 softmax
            lp = torch.log_softmax(parent(rows)[:, :-1].double(), -1)
            lq = torch.log_softmax(child(rows)[:, :-1].double(), -1)
        want = float((lp.exp() * (lp - lq)).sum(-1).mean())
        assert c.measured["kl_div"] == pytest.approx(want, rel=1e-6)
    best = min(rec.children, key=lambda c: c.measured["kl_div"])
    assert rec.chosen == best.file
    assert (out / "blueprint-realized.json").read_text() == (out / best.file).read_text()
    from scipy.stats import spearmanr

    want = spearmanr([c.predicted for c in rec.children],
                     [c.measured["kl_div"] for c in rec.children]).statistic
    assert rec.spearman == pytest.approx(float(want))


def test_realized_children_come_from_the_bld_blocks_of_the_scores(tmp_path):
    from nas.scoring.realize import load_record

    pdir, *_ = tiny_llama_checkpoint(tmp_path)
    data = _tokens(tmp_path, 4096)
    spec = _spec(tmp_path, pdir, diverse=2)
    assert main(["score", str(spec), "--parent", str(pdir), "--data", str(data), "-o",
                 str(tmp_path / "scores"), "--seq-len", "32", "--max-tokens", "512",
                 "--calib-tokens", "512", "--bld-steps", "2"]) == 0
    spec = _spec(tmp_path, pdir, tmp_path / "scores", diverse=2)
    assert main(["search", str(spec), "-o", str(tmp_path / "out"), "--quiet", "--realize",
                 str(data), "--realize-tokens", "512", "--seq-len", "32"]) == 0
    rec = load_record(tmp_path / "out")
    assert [c.init for c in rec.children] == ["bld", "bld"]
    assert rec.spearman is None  # two children: no rank correlation


def test_realize_inputs_are_refused_before_the_search(tmp_path, capsys):
    pdir, *_ = tiny_llama_checkpoint(tmp_path)
    data = _tokens(tmp_path)
    spec = _spec(tmp_path, pdir)
    empty = tmp_path / "empty"
    empty.mkdir()
    for extra, field in ((["--realize-scores", str(empty)], "--realize-scores"),
                         (["--realize-parent", str(empty)], "--realize-parent"),
                         (["--realize-tokens", "8"], "--realize-tokens")):
        out = tmp_path / f"out{field}"
        rc = main(["search", str(spec), "-o", str(out), "--quiet", "--realize", str(data),
                   "--seq-len", "32", *extra])
        err = capsys.readouterr().err.strip().splitlines()
        assert rc == 2 and len(err) == 1 and field in err[0], (extra, err)
        assert not out.exists()


def test_a_search_reruns_into_a_folder_it_realized(tmp_path):
    pdir, *_ = tiny_llama_checkpoint(tmp_path)
    data = _tokens(tmp_path)
    spec = _spec(tmp_path, pdir, diverse=2)
    args = ["search", str(spec), "-o", str(tmp_path / "out"), "--quiet", "--realize",
            str(data), "--realize-tokens", "256", "--seq-len", "32"]
    assert main(args) == 0
    assert main(args[:5]) == 0  # the plain search replaces the set, realized files included
    assert not (tmp_path / "out" / "realized.json").exists()
    assert main(args) == 0 and (tmp_path / "out" / "realized.json").is_file()
