"""Iterative search pieces (``nas.train.iterate``) that need no training: stage specs, relative
budgets carried to later stages as the original parent's absolute figures, search-space
values a later stage's parent cannot take, and bad input. The whole loop (score, search,
build, distill per stage, resumed) runs in ``tests/test_tiny_hybrid.py``."""

from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path

import pytest

pytest.importorskip("torch")

from hwprofiles.errors import InputError  # noqa: E402
from nas import search  # noqa: E402
from nas.spec import load_spec, parse_spec  # noqa: E402
from nas.train.iterate import absolute_budgets, prune_space  # noqa: E402

pytestmark = pytest.mark.torch
SPEC = Path(__file__).resolve().parents[1] / "nas" / "examples" / "tiny-hybrid" / "spec.json"


def test_stages_parse_and_bad_stage_workloads_name_their_path():
    spec, _, _ = load_spec(SPEC)
    assert len(spec.stages) == 2 and spec.stages[1].budgets == spec.budgets
    data = json.loads(SPEC.read_text())
    data["stages"][0]["budgets"][0]["workload"] = "chat"
    with pytest.raises(InputError, match=r"stages\[0\]\.budgets\[0\]\.workload 'chat'"):
        parse_spec(data)
    data["stages"] = [{"budgets": []}]
    with pytest.raises(InputError, match="stages"):
        parse_spec(data)


def test_relative_budgets_become_the_original_parents_absolute_figures(tmp_path):
    spec, base, _ = load_spec(SPEC)
    problem = search.resolve(spec, base)
    absolute = absolute_budgets(problem, spec.budgets)
    assert absolute[0].min.endswith(" tok/s") and isinstance(absolute[1].max, float)
    pc = problem.parent.param_counts().total
    assert absolute[1].max == pytest.approx(0.5 * pc, rel=1e-12)  # "50%"
    # the same search with the absolute budgets chooses the same child under the same bounds
    data = json.loads(SPEC.read_text())
    data["budgets"] = [b.model_dump(exclude_none=True) for b in absolute]
    (tmp_path / "abs.json").write_text(json.dumps(data))
    rel = search.run(spec, base, tmp_path / "rel", progress=False).blueprints[0]
    s2, b2, _ = load_spec(tmp_path / "abs.json")
    ab = search.run(s2, b2, tmp_path / "abs", progress=False).blueprints[0]
    assert [c["child"] for c in ab.choices] == [c["child"] for c in rel.choices]
    for x, y in zip(rel.budgets, ab.budgets):
        assert y["bound"] == pytest.approx(x["bound"], rel=1e-9)
    # a later stage's parent (smaller) is bounded by the same absolute figures
    child = dict(data, parent=ab.child)
    (tmp_path / "child.json").write_text(json.dumps(child))
    s3, b3, _ = load_spec(tmp_path / "child.json")
    p3 = search.resolve(s3, b3)
    assert absolute_budgets(p3, s3.budgets) == s3.budgets  # absolute bounds stay as they are
    assert absolute_budgets(p3, spec.budgets)[1].max < absolute[1].max  # relative would move


def test_values_a_later_parent_cannot_take_are_left_out_and_reported():
    spec, _, _ = load_spec(SPEC)
    cfg = json.loads(SPEC.read_text())["parent"]
    space = json.loads(SPEC.read_text())["search_space"]
    kept, dropped = prune_space(cfg, space)
    assert kept == space and dropped == []
    no_attention = dict(cfg, hybrid_override_pattern=cfg["hybrid_override_pattern"]
                        .replace("*", "M"))
    kept, dropped = prune_space(no_attention, space)
    assert dropped == ["search_space.attention.kv_heads: 1"]
    assert kept["attention"]["kv_heads"] == [] and kept["mamba"] == space["mamba"]


def test_iterate_without_stages_is_one_line(tmp_path):
    from nas.cli import main as cli

    data = json.loads(SPEC.read_text())
    del data["stages"]
    (tmp_path / "spec.json").write_text(json.dumps(data))
    (tmp_path / "parent").mkdir()
    (tmp_path / "parent" / "config.json").write_text(json.dumps(data["parent"]))
    (tmp_path / "t.npy").write_bytes(b"")
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        rc = cli(["iterate", str(tmp_path / "spec.json"), "--parent", str(tmp_path / "parent"),
                  "--data", str(tmp_path / "t.npy"), "-o", str(tmp_path / "out"),
                  "--kd-tokens", "100"])
    assert rc == 2 and "lists no stages" in err.getvalue()
    assert err.getvalue().count("\n") == 1


# ---- ranks: --nproc / --device ------------------------------------------------------------
def test_stage_command_lines_carry_every_setting():
    """The rank command lines iterate gives torchrun parse back to the same settings (every
    field set away from its default), so a stage on N ranks runs what one process would."""
    import argparse

    from nas.cli import distill as cli_distill
    from nas.cli import score as cli_score
    from nas.scoring.job import Settings
    from nas.train.distill import DistillSettings
    from nas.train.iterate import distill_argv, score_argv

    ds = DistillSettings(tokens=1000, seq_len=32, batch_size=4, lr=1.5e-4, min_lr_fraction=0.2,
                         warmup_steps=3, weight_decay=0.01, grad_clip=0.5, lm_weight=0.25,
                         eval_every=7, eval_tokens=333, checkpoint_every=9, seed=5,
                         keep_best=False, patience=2, lr_sweep=(1e-4, 3e-4), sweep_steps=2,
                         mixed_precision="bfloat16")
    p = argparse.ArgumentParser()
    cli_distill.add_arguments(p, launcher=False)
    args = p.parse_args(distill_argv(Path("c"), Path("t"), "d.npy", Path("o"), ds, "e.npy",
                                     None, None, "cuda", False, True))
    assert cli_distill.settings_of(args) == ds
    assert args.device == "cuda" and args.activation_checkpointing and not args.replicas
    assert not args.keep_checkpoint  # a finished stage's resume state is removed by default
    kept = p.parse_args(distill_argv(Path("c"), Path("t"), "d.npy", Path("o"), ds, "e.npy",
                                     None, None, "cpu", False, False, True))
    assert kept.keep_checkpoint and not kept.activation_checkpointing
    from nas.cli import build_parser

    it = ["iterate", "s.json", "--parent", "p", "--data", "d.npy", "-o", "o", "--kd-tokens",
          "1000"]
    assert not build_parser().parse_args(it).keep_checkpoint
    assert build_parser().parse_args([*it, "--keep-checkpoint"]).keep_checkpoint
    assert args.eval_data == "e.npy" and args.teacher == "t"
    ss = Settings(seq_len=32, batch_size=3, max_tokens=999, calib_tokens=128, bld_steps=4,
                  bld_lr=2.5e-4, bld_batch=2, seed=3, dtype="bfloat16")
    p = argparse.ArgumentParser()
    cli_score.add_arguments(p, launcher=False)
    args = p.parse_args(score_argv(Path("s.json"), Path("par"), "d.npy", Path("o"), ss, None,
                                   "uint16", "cpu", True))
    assert cli_score._settings(args) == ss
    assert args.replicas and args.bin_dtype == "uint16" and args.parent == "par"


def _cli(argv: list[str]) -> tuple[int, str]:
    from nas.cli import main as cli

    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        rc = cli(argv)
    return rc, err.getvalue()


def test_bad_rank_flags_are_one_line(tmp_path):
    base = ["iterate", str(SPEC), "--parent", str(tmp_path), "--data", str(tmp_path / "t.npy"),
            "-o", str(tmp_path / "out"), "--kd-tokens", "100"]
    for extra, needle in ((["--nproc", "0"], "--nproc must be >= 1"),
                          (["--nproc", "2", "--kd-batch", "3"], "multiple of the 2 ranks"),
                          (["--nproc", "2", "--replicas", "--kd-mixed-precision", "bfloat16"],
                           "drop --replicas")):
        rc, err = _cli(base + extra)
        assert rc == 2 and needle in err and err.count("\n") == 1, err


def test_iterate_on_two_ranks_scores_and_distills_sharded(tmp_path):
    """``iterate --nproc 2``: the stage's scoring runs with the parent sharded as pipeline
    stages and its distillation on FSDP2, both on 2 gloo ranks; a rerun finds the stage
    done."""
    import numpy as np
    from tiny_parent import FROZEN, english_bytes

    spec = {"name": "tiny-ranks", "parent": json.loads((FROZEN / "config.json").read_text()),
            "hardware": "h100-sxm", "precision": "bf16",
            "workloads": {"w": {"isl": 512, "osl": 128, "concurrency": 4}},
            "search_space": {"ffn": {"fractions": [0.5], "noop": True},
                             "attention": {"noop": True}},
            "budgets": [{"metric": "total_params", "max": "85%"}],
            "stages": [{"budgets": [{"metric": "total_params", "max": "85%"}]}]}
    (tmp_path / "spec.json").write_text(json.dumps(spec))
    text = np.frombuffer(english_bytes()[:60000], dtype=np.uint8).astype(np.uint16)
    np.save(tmp_path / "t.npy", text[:40000])
    np.save(tmp_path / "calib.npy", text[40000:])  # scoring's own tokens (--score-data)
    argv = ["iterate", str(tmp_path / "spec.json"), "--parent", str(FROZEN), "--data",
            str(tmp_path / "t.npy"), "--score-data", str(tmp_path / "calib.npy"),
            "-o", str(tmp_path / "out"), "--seq-len", "64",
            "--max-tokens", "512", "--calib-tokens", "256", "--bld-steps", "2",
            "--kd-tokens", str(4 * 8 * 64), "--kd-eval-every", "2", "--kd-eval-tokens", "512",
            "--nproc", "2"]
    rc, err = _cli(argv)
    assert rc == 0, err[-3000:]
    stage = tmp_path / "out" / "stage-0"
    scores = json.loads((stage / "scores" / "scores.json").read_text())
    assert scores["world_size"] == 2 and scores["data"] == str(tmp_path / "calib.npy")
    rec = json.loads((stage / "distill" / "distill.json").read_text())
    assert rec["world_size"] == 2 and rec["layout"] == "sharded" and rec["steps"] == 4
    assert rec["data"] == str(tmp_path / "t.npy")
    assert rec["final"]["kl_div"] <= rec["initial"]["kl_div"]
    rc, err = _cli(argv)
    assert rc == 0 and "stage 0: done before" in err, err[-2000:]
