"""Each command reads the parent's ``config.json`` once (issue 51): the spec's parent, the
checkpoint's config, the plan and the checkpoint reader share one :class:`nas.hf.Parent`
(``iterate``: the teacher's config serves the search, stage 0's scoring and build, and
every stage's distillation).

Reads are counted where every read ends, ``open`` on the file for reading, so a new reader
anywhere in a command (a second ``CheckpointReader``, a check that reads the config again)
fails here. ``build`` also hashes every input file for its record (the same build again
finds its child built): that digest is the one other opening of the file, and is counted
apart.
"""

from __future__ import annotations

import builtins
import io
import json
import traceback
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from nas.cli import main

pytestmark = pytest.mark.torch


@pytest.fixture
def folder(tmp_path):
    pytest.importorskip("torch")
    from conftest import tiny_llama_checkpoint

    from nas.child import build_model, save_pretrained

    pdir, cfg, _, small = tiny_llama_checkpoint(tmp_path)
    save_pretrained(build_model(small, seed=1), tmp_path / "student")
    np.save(tmp_path / "tokens.npy",
            np.random.default_rng(0).integers(0, 64, 20000).astype(np.int32))
    (tmp_path / "spec.json").write_text(json.dumps({
        "name": "t", "parent": str(pdir / "config.json"), "hardware": "h100-sxm",
        "workloads": {"chat": {"isl": 128, "osl": 128, "batch": 1}},
        "search_space": {"attention": {"kv_heads": [1], "noop": True},
                         "ffn": {"fractions": [0.5], "round_to": 8, "noop": True}},
        "stages": [{"budgets": [{"metric": "total_params", "max": "90%"}]}]}))
    return tmp_path


def _commands(t: Path) -> dict[str, list[str]]:
    p, tok = str(t / "parent"), str(t / "tokens.npy")
    return {
        "search": ["search", str(t / "spec.json"), "-o", str(t / "s"), "--quiet"],
        "score --plan": ["score", str(t / "spec.json"), "--parent", p, "--plan"],
        "score": ["score", str(t / "spec.json"), "--parent", p, "--data", tok, "-o",
                  str(t / "sc"), "--seq-len", "32", "--batch-size", "4", "--max-tokens", "256"],
        "build": ["build", str(t / "child.json"), "--parent", p, "--calib", tok, "-o",
                  str(t / "b")],
        "distill": ["distill", str(t / "student"), "--teacher", p, "--data", tok, "-o",
                    str(t / "d"), "--tokens", "256", "--seq-len", "32", "--batch", "4",
                    "--eval-tokens", "128", "--lr", "1e-4"],
        "inspect": ["inspect", p],
        "iterate": ["iterate", str(t / "spec.json"), "--parent", p, "--data", tok, "-o",
                    str(t / "it"), "--seq-len", "32", "--max-tokens", "256",
                    "--calib-tokens", "256", "--bld-steps", "2", "--kd-tokens", "256",
                    "--kd-eval-every", "2", "--kd-eval-tokens", "128"],
    }


@pytest.mark.parametrize("command", ["search", "score --plan", "score", "build", "distill",
                                     "inspect", "iterate"])
def test_a_command_reads_the_parents_config_once(folder, command, monkeypatch, capsys):
    config = (folder / "parent" / "config.json").resolve()
    reads: Counter[str] = Counter()
    real_open = io.open

    def counting(file, mode="r", *args, **kwargs):  # type: ignore[no-untyped-def]
        if isinstance(file, (str, Path)) and "r" in mode and \
                Path(file).resolve() == config:
            who = "stamp" if any(f.name == "file_stamp" for f in traceback.extract_stack()) \
                else "read"
            reads[who] += 1
        return real_open(file, mode, *args, **kwargs)

    monkeypatch.setattr(builtins, "open", counting)
    monkeypatch.setattr(io, "open", counting)
    assert main(_commands(folder)[command]) == 0, capsys.readouterr().err
    assert reads["read"] == 1, reads
    assert reads["stamp"] == (1 if command == "build" else 0), reads
