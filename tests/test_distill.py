"""Knowledge distillation (``nas.train.distill``, ``puzzle-nas distill``): the held-out KL falls,
outputs are a loadable checkpoint and a record, a SIGKILLed run resumes to the weights of an
uninterrupted one, 2 and 4 gloo ranks (teacher and student sharded with FSDP2, each rank
holding 1/N) equal 1 rank at the same global batch, a killed sharded run resumes bit for
bit (and on another rank count), activation checkpointing and mixed precision, bad input
is one line."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("safetensors")

from tiny_parent import PARENT, SEQ  # noqa: E402

from nas.arch import NoOp  # noqa: E402
from nas.child import load_pretrained  # noqa: E402
from nas.train.distill import (  # noqa: E402
    KILL_ENV,
    DistillSettings,
    distill,
    load_record,
    lr_at,
    step_rows,
)

pytestmark = pytest.mark.torch
torch.set_num_threads(1)
REPO = Path(__file__).resolve().parents[1]
KD = ["--tokens", str(10 * 8 * SEQ), "--seq-len", str(SEQ), "--batch", "8", "--lr", "2e-3",
      "--eval-every", "5", "--eval-tokens", "1024", "--checkpoint-every", "3"]


def _env(**kw: str) -> dict[str, str]:
    env = dict(os.environ, OMP_NUM_THREADS="1", **kw)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")])
    return env


@pytest.fixture(scope="module")
def work(trained_parent, tmp_path_factory):
    """The trained tiny parent (with a tokenizer), a child of it (an FFN dropped, a MoE at
    half its experts) initialized from it, and the English bytes as token ids."""
    from conftest import distill_folder, write_tokenizer

    d = distill_folder(trained_parent, tmp_path_factory.mktemp("distill"))
    write_tokenizer(d / "parent")
    return d


def _cli(work: Path, out: Path, *extra: str, env: dict[str, str] | None = None
         ) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "nas", "distill", str(work / "child"), "--teacher",
           str(work / "parent"), "--data", str(work / "tokens.npy"), "-o", str(out), *KD,
           *extra]
    return subprocess.run(cmd, env=env or _env(), capture_output=True, text=True, timeout=600)


def _weights(folder: Path) -> dict[str, torch.Tensor]:
    return _weights_of(folder / "model")


def _weights_of(checkpoint: Path) -> dict[str, torch.Tensor]:
    """A checkpoint's tensors as our model holds them (internal names)."""
    return dict(load_pretrained(checkpoint).state_dict())


@pytest.fixture(scope="module")
def one_rank(work):
    out = work / "one"
    p = _cli(work, out)
    assert p.returncode == 0, p.stderr[-3000:]
    return out


# ---- in process -------------------------------------------------------------------------
def test_distillation_lowers_held_out_kl_and_writes_a_loadable_child(work, tmp_path):
    s = DistillSettings(tokens=20 * 8 * SEQ, seq_len=SEQ, batch_size=8, lr=2e-3, eval_every=10,
                        eval_tokens=1024, checkpoint_every=10, lm_weight=0.1)
    data = np.load(work / "tokens.npy").astype(np.int64)
    rec = distill(work / "child", work / "parent", data, tmp_path / "kd", s, progress=False,
                  log=lambda m: None)
    assert rec is not None
    assert [p.step for p in rec.curve] == [0, 10, 20] and rec.steps == 20
    assert rec.tokens_trained == 20 * 8 * SEQ == rec.curve[-1].tokens
    first, last = rec.curve[0], rec.final
    assert last.kl_div < 0.5 * first.kl_div  # distillation works, on held-out tokens
    assert last.top1_agreement > first.top1_agreement
    assert rec.teacher_eval.kl_div == 0.0 and rec.teacher_eval.top1_agreement == 1.0
    assert rec.held_tokens == 16 * (SEQ - 1)  # ceil(1024 / 64) rows, never trained on
    child = load_pretrained(tmp_path / "kd" / "model")
    assert child.num_stored() == load_pretrained(work / "child").num_stored()
    assert child.arch.blocks[1] == NoOp()
    assert (tmp_path / "kd" / "kd_curve.png").read_bytes()[:4] == b"\x89PNG"
    assert load_record(tmp_path / "kd") == rec
    # the same run again is read back, not retrained
    again = distill(work / "child", work / "parent", data, tmp_path / "kd", s, progress=False,
                    log=lambda m: None)
    assert again == rec


def test_a_bf16_checkpoint_trains_from_float32_masters_by_default(work, tmp_path):
    """Mixed precision is the default for 16-bit checkpoints: a bf16 child and parent train
    from float32 master weights (FSDP2, a one-rank group) and the child is written in bf16;
    ``dtype="bfloat16"`` (``--pure-bf16``) trains in pure bf16, whole."""
    from nas.child import save_pretrained
    from nas.tokens import copy_tokenizer

    for name in ("child", "parent"):
        save_pretrained(load_pretrained(work / name, dtype=torch.bfloat16), tmp_path / name)
    copy_tokenizer([work / "parent"], tmp_path / "parent")
    data = np.load(work / "tokens.npy").astype(np.int64)
    kw = dict(tokens=2 * 8 * SEQ, seq_len=SEQ, batch_size=8, lr=2e-3, eval_every=2,
              eval_tokens=512, checkpoint_every=2)
    runs = {}
    for tag, s in (("mixed", DistillSettings(**kw)),
                   ("pure", DistillSettings(**kw, dtype="bfloat16"))):
        rec = distill(tmp_path / "child", tmp_path / "parent", data, tmp_path / tag, s,
                      progress=False, log=lambda m: None)
        assert rec is not None
        runs[tag] = rec
    assert runs["mixed"].settings["mixed_precision"] == "bfloat16"
    assert runs["mixed"].layout == "sharded"
    assert runs["pure"].settings.get("mixed_precision") is None
    assert runs["pure"].layout == "full"
    from safetensors import safe_open

    def dtypes(folder: Path) -> dict[str, str]:
        with safe_open(str(folder / "model.safetensors"), "pt") as f:
            return {k: f.get_slice(k).get_dtype() for k in f.keys()}

    given = dtypes(tmp_path / "child")
    assert "BF16" in given.values()
    for tag in runs:  # written in the child's stored dtypes
        assert json.loads((tmp_path / tag / "model" / "config.json").read_text()
                          )["torch_dtype"] == "bfloat16"
        assert dtypes(tmp_path / tag / "model") == given


def test_row_sampling_and_schedule_depend_on_the_step_only():
    s = DistillSettings(tokens=100 * 4 * 8, seq_len=8, batch_size=4, lr=1e-3, warmup_steps=10,
                        min_lr_fraction=0.1)
    assert s.steps == 100
    assert torch.equal(step_rows(37, 500, s), step_rows(37, 500, s))
    assert not torch.equal(step_rows(37, 500, s), step_rows(38, 500, s))
    assert not torch.equal(step_rows(37, 500, s),
                           step_rows(37, 500, s.model_copy(update={"seed": 1})))
    assert lr_at(0, s) == pytest.approx(1e-4) and lr_at(9, s) == pytest.approx(1e-3)
    assert lr_at(10, s) == pytest.approx(1e-3)
    assert lr_at(99, s) == pytest.approx(1e-4, rel=0.01)
    assert all(lr_at(k, s) >= lr_at(k + 1, s) for k in range(10, 99))


# ---- never worse than the start: keep-best, early stopping, the learning-rate sweep -------
def _api(work: Path, out: Path, **kw):  # type: ignore[no-untyped-def]
    tokens = np.load(work / "tokens.npy").astype(np.int64)
    s = DistillSettings(**{**dict(tokens=6 * 8 * SEQ, seq_len=SEQ, batch_size=8, eval_every=2,
                                  eval_tokens=1024, checkpoint_every=100), **kw})
    return distill(work / "child", work / "parent", tokens, out, s, progress=False,
                   log=lambda _: None)


def _same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_a_distillation_that_hurts_returns_the_child_as_given(work, tmp_path):
    """At lr 0.1 without clipping every evaluation is worse than the start: the child
    written is the one given, and the record says so (both figures)."""
    rec = _api(work, tmp_path / "kd", lr=0.1, grad_clip=0.0)
    assert rec.last.kl_div > rec.initial.kl_div  # training did hurt
    assert rec.kept_step == 0 and rec.final == rec.initial and rec.steps == 6
    assert _same(_weights(tmp_path / "kd"), _weights_of(work / "child"))
    last = _api(work, tmp_path / "last", lr=0.1, grad_clip=0.0, keep_best=False)
    assert last.final == last.last == rec.last and last.kept_step == 6


def test_patience_stops_a_run_that_stopped_improving(work, tmp_path):
    rec = _api(work, tmp_path / "kd", lr=0.1, grad_clip=0.0, patience=1)
    assert rec.stopped_early_at == 2 and rec.steps == 2 and [c.step for c in rec.curve] == [0, 2]
    assert rec.final == rec.initial


def test_the_sweep_trains_with_its_best_rate_as_a_plain_run_would(work, tmp_path):
    """Each trial starts from the child as given and leaves it so: the run after the sweep
    is bit for bit the plain run at the chosen rate."""
    rec = _api(work, tmp_path / "sweep", lr_sweep=(2e-3, 0.1), sweep_steps=3, grad_clip=0.0)
    assert [t.lr for t in rec.sweep] == [2e-3, 0.1] and all(t.steps == 3 for t in rec.sweep)
    assert rec.sweep[0].kl_div < rec.sweep[1].kl_div and rec.lr == 2e-3
    plain = _api(work, tmp_path / "plain", lr=2e-3, grad_clip=0.0)
    assert rec.curve == plain.curve
    assert _same(_weights(tmp_path / "sweep"), _weights(tmp_path / "plain"))


def test_a_resumed_run_still_returns_the_best_weights_it_passed(work, tmp_path):
    out = tmp_path / "kd"
    bad = ["--lr", "0.1", "--grad-clip", "0", "--checkpoint-every", "2", "--eval-every", "2"]
    whole = _cli(work, tmp_path / "whole", *bad)
    assert whole.returncode == 0, whole.stderr[-2000:]
    p = _cli(work, out, *bad, env=_env(**{KILL_ENV: "5"}))
    assert p.returncode == -9, p.stderr[-2000:]
    assert (out / "checkpoint" / "best.safetensors").is_file()  # the start, kept past step 0
    p = _cli(work, out, *bad)
    assert p.returncode == 0 and "resuming from step 4" in p.stderr, p.stderr[-2000:]
    assert load_record(out).kept_step == load_record(tmp_path / "whole").kept_step
    assert _same(_weights(out), _weights(tmp_path / "whole"))


# ---- command line: resume and ranks --------------------------------------------------------
def test_sigkill_then_resume_equals_an_uninterrupted_run(work, one_rank):
    out = work / "killed"
    p = _cli(work, out, env=_env(**{KILL_ENV: "7"}))
    assert p.returncode == -9, p.stderr[-2000:]
    assert not (out / "model").exists() and not (out / "distill.json").exists()
    state = json.loads((out / "checkpoint" / "state.json").read_text())
    assert state["step"] == 6  # the last complete checkpoint (every 3 steps)
    p = _cli(work, out)
    assert p.returncode == 0, p.stderr[-3000:]
    assert "resuming from step 6 of 10" in p.stderr
    a, b = _weights(one_rank), _weights(out)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    ra, rb = load_record(one_rank), load_record(out)
    assert rb.resumed_from_step == 6 and ra.curve == rb.curve


@pytest.fixture(scope="module")
def two_ranks(work):
    out = work / "two"
    p = _cli(work, out, "--nproc", "2", "--json")
    assert p.returncode == 0, p.stderr[-3000:]
    return out


def _curves_agree(one: Path, many: Path) -> None:
    """The loss curve of ``many`` ranks is one rank's within float32 reduction order: every
    held-out KL and LM loss within 1e-4 relative (KL also 1e-6 absolute), every mean
    training loss within 1e-5 relative, the weights within 1e-4."""
    a, b = load_record(one), load_record(many)
    assert [p.step for p in a.curve] == [p.step for p in b.curve]
    for p1, p2 in zip(a.curve, b.curve):
        assert p2.kl_div == pytest.approx(p1.kl_div, rel=1e-4, abs=1e-6)
        assert p2.lm_loss == pytest.approx(p1.lm_loss, rel=1e-4)
        if p1.train_loss is not None:
            assert p2.train_loss == pytest.approx(p1.train_loss, rel=1e-5)
    wa, wb = _weights(one), _weights(many)
    diff = max(float((wa[k] - wb[k]).abs().max()) for k in wa)
    assert diff < 1e-4, diff  # float32 reduction order only


def _held_about_one_nth(rec, work: Path) -> None:
    """Each rank holds its 1/N of the student and of the teacher: the shards add up to the
    whole (plus the small buffers, which every rank keeps) and no rank holds much more than
    1/N."""
    n = rec.world_size
    assert rec.layout == "sharded" and len(rec.held_elements) == n
    for col, folder in ((0, "child"), (1, "parent")):
        m = load_pretrained(work / folder)
        total = m.num_stored()
        buffers = sum(b.numel() for b in m.buffers())
        held = [r[col] for r in rec.held_elements]
        if col == 1 and rec.teacher_layout == "pipelined":
            # every block on one rank; the final norm and the head on every rank
            head = m.lm_head if m.lm_head is not None else m.embed
            every = sum(p.numel() for p in (*m.norm.parameters(), *head.parameters()))
            assert sum(held) == total + (n - 1) * every, (folder, held, total)
            assert max(held) <= 1.5 * total / n + every, (folder, held, total)
            continue
        assert sum(held) == total + (n - 1) * buffers, (folder, held, total)
        assert max(held) <= 1.01 * total / n + buffers, (folder, held, total)


def test_two_gloo_ranks_match_one_rank_at_the_same_global_batch(work, one_rank, two_ranks):
    _curves_agree(one_rank, two_ranks)
    for out in (one_rank, two_ranks):  # finished: the resume state deleted, by rank 0
        assert not (out / "checkpoint").exists()
        assert not [n for n in os.listdir(out) if n.startswith(".")]
        # the student has no tokenizer: the teacher's is copied (streamed export too)
        for name in ("tokenizer.json", "tokenizer_config.json", "generation_config.json"):
            assert (out / "model" / name).read_bytes() == \
                (work / "parent" / name).read_bytes(), (out, name)
    rec = load_record(two_ranks)
    assert rec.world_size == 2
    assert rec.expert_parallel  # (by default: the child's 4 and 8 experts divide over 2)
    _held_about_one_nth(rec, work)
    assert len(rec.peak_rss_mib) == 2 and min(rec.peak_rss_mib) > 0


def test_four_gloo_ranks_match_one_rank_and_hold_a_quarter_each(work, one_rank):
    out = work / "four"
    p = _cli(work, out, "--nproc", "4")
    assert p.returncode == 0, p.stderr[-3000:]
    _curves_agree(one_rank, out)
    assert load_record(out).expert_parallel
    _held_about_one_nth(load_record(out), work)


def test_two_ranks_killed_then_resumed_equal_an_uninterrupted_two_rank_run(work, two_ranks):
    """A sharded checkpoint (torch.distributed.checkpoint) resumes bit for bit on the same
    ranks; on 4 ranks it resumes too (DCP reshards), within float tolerance; on one process
    (whole-model layout) it is refused in one line, exit 2."""
    out = work / "killed2"
    p = _cli(work, out, "--nproc", "2", env=_env(**{KILL_ENV: "7"}))
    assert p.returncode != 0
    assert not (out / "model").exists()
    state = json.loads((out / "checkpoint" / "state.json").read_text())
    assert state["step"] == 6 and state["layout"] == "sharded" and state["world"] == 2
    backup = work / "killed2-copy"
    import shutil

    shutil.copytree(out, backup)
    p = _cli(work, out)
    assert p.returncode == 2 and p.stderr.count("\n") == 1, p.stderr[-2000:]
    assert "sharded over 2 ranks" in p.stderr and "delete" in p.stderr
    p = _cli(work, out, "--nproc", "2")
    assert p.returncode == 0, p.stderr[-3000:]
    assert "resuming from step 6 of 10" in p.stderr
    assert _same(_weights(two_ranks), _weights(out))
    assert load_record(out).curve == load_record(two_ranks).curve
    assert load_record(out).resumed_from_step == 6
    p = _cli(work, backup, "--nproc", "4")  # another rank count: resharded
    assert p.returncode == 0, p.stderr[-3000:]
    assert "resuming from step 6 of 10" in p.stderr and "written by 2 ranks" in p.stderr
    _curves_agree(two_ranks, backup)


def test_activation_checkpointing_and_mixed_precision(work, two_ranks, tmp_path):
    """Activation checkpointing recomputes the same values: the weights equal the run
    without it bit for bit. Mixed precision (bf16 compute, float32 master weights) trains
    as well, on one process (a one-rank FSDP2 group) as on two ranks, and writes the
    child's dtype."""
    p = _cli(work, tmp_path / "ac", "--nproc", "2", "--activation-checkpointing",
             "--keep-checkpoint")  # forwarded to the ranks: the sharded state is kept
    assert p.returncode == 0, p.stderr[-3000:]
    state = json.loads((tmp_path / "ac" / "checkpoint" / "state.json").read_text())
    assert state["layout"] == "sharded" and state["world"] == 2 and state["step"] == 9
    assert _same(_weights(two_ranks), _weights(tmp_path / "ac"))
    assert load_record(tmp_path / "ac").activation_checkpointing
    for n in ("1", "2"):
        p = _cli(work, tmp_path / f"mp{n}", "--nproc", n, "--mixed-precision", "bfloat16")
        assert p.returncode == 0, p.stderr[-3000:]
    a, b = load_record(tmp_path / "mp1"), load_record(tmp_path / "mp2")
    assert a.layout == b.layout == "sharded" and a.settings["mixed_precision"] == "bfloat16"
    assert b.final.kl_div < 0.5 * b.initial.kl_div
    for p1, p2 in zip(a.curve, b.curve):  # bf16 rounding in another reduction order
        assert p2.kl_div == pytest.approx(p1.kl_div, rel=0.02, abs=1e-4)
    ref = load_record(two_ranks).final.kl_div
    assert b.final.kl_div == pytest.approx(ref, rel=0.02)  # as good as float32
    w = _weights(tmp_path / "mp2")
    assert all(t.dtype == torch.float32 for t in w.values())  # the child's stored dtype


def test_replicas_keep_a_whole_copy_per_rank_and_match_one_rank(work, one_rank, tmp_path):
    out = tmp_path / "replicas"
    p = _cli(work, out, "--nproc", "2", "--replicas")
    assert p.returncode == 0, p.stderr[-3000:]
    rec = load_record(out)
    assert rec.layout == "full" and rec.world_size == 2
    whole = load_pretrained(work / "child").num_stored()
    assert [r[0] for r in rec.held_elements] == [whole, whole]
    _curves_agree(one_rank, out)


def test_micro_batches_train_as_the_whole_batch_does(work, one_rank, tmp_path):
    """``--micro-batch``: each rank's share of the batch runs a micro-batch at a time, their
    gradients added before the step, so one process at 2 rows (4 passes per step), two
    sharded ranks at 1 row (4 passes each) and two DDP replicas at 2 rows train as the
    whole batch does (float32 summation order); the sharded run sends what its plan says
    (FSDP2 gathers and reduce-scatters once per micro-batch) and the plan holds one row's
    activations."""
    runs = {"one": (tmp_path / "m1", ["--micro-batch", "2"]),
            "sharded": (tmp_path / "m2", ["--nproc", "2", "--micro-batch", "1"]),
            "replicas": (tmp_path / "m3", ["--nproc", "2", "--replicas", "--micro-batch", "2"])}
    for out, extra in runs.values():
        p = _cli(work, out, *extra)
        assert p.returncode == 0, p.stderr[-3000:]
        _curves_agree(one_rank, out)
    rec = load_record(runs["sharded"][0])
    assert rec.settings["micro_batch"] == 1
    plan = _plan_of_run(work, rec, "pipelined", micro_batch=1)
    assert max(rec.sent_bytes_per_step) == pytest.approx(plan.sent_per_step, rel=0.2)
    whole = _plan_of_run(work, rec, "pipelined")
    assert plan.activations == pytest.approx(whole.activations / 4)  # 1 row of 4
    assert plan.sent_per_step > whole.sent_per_step  # the student moved 4 times


def test_a_micro_batch_that_does_not_divide_the_share_is_one_line(work, tmp_path):
    p = _cli(work, tmp_path / "bad", "--nproc", "2", "--micro-batch", "3")
    assert p.returncode == 2
    assert p.stderr.strip().splitlines() == [
        "puzzle-nas distill: error: --micro-batch 3 must divide each rank's share of the "
        "batch (--batch 8 over --nproc 2: 4)"]
    assert not (tmp_path / "bad").exists()


def test_a_keep_last_run_resumes_past_a_better_early_evaluation(work, tmp_path):
    """With --keep-last no best weights are kept in the checkpoint, and the resume needs
    none (on one process and sharded)."""
    bad = ["--lr", "0.1", "--grad-clip", "0", "--checkpoint-every", "2", "--eval-every", "2",
           "--keep-last"]
    for n in ("1", "2"):
        out = tmp_path / f"last{n}"
        p = _cli(work, out, *bad, "--nproc", n, env=_env(**{KILL_ENV: "5"}))
        assert p.returncode != 0
        p = _cli(work, out, *bad, "--nproc", n)
        assert p.returncode == 0 and "resuming from step 4" in p.stderr, p.stderr[-2000:]
        assert load_record(out).kept_step == 10


def test_a_finished_run_deletes_its_checkpoint_unless_kept(work, tmp_path, capsys):
    """Once distill.json and model/ are written, checkpoint/ (the resume state) is deleted;
    a rerun of the finished command exits 0 with the same record; --keep-checkpoint keeps
    it. model/ carries the student's tokenizer when it has one (else the teacher's)."""
    import shutil

    from conftest import write_tokenizer

    from nas.cli import main as cli

    student = tmp_path / "student"
    shutil.copytree(work / "child", student)
    files = write_tokenizer(student, words=("a", "b"))  # not the teacher's
    argv = ["distill", str(student), "--teacher", str(work / "parent"), "--data",
            str(work / "tokens.npy"), *KD, "--json"]
    out = tmp_path / "kd"
    assert cli([*argv, "-o", str(out)]) == 0
    rec = json.loads(capsys.readouterr().out)
    assert rec["steps"] == 10 and rec["resumed_from_step"] == 0
    left = os.listdir(out)
    assert {"distill.json", "kd_curve.png", "model"} <= set(left)
    assert "checkpoint" not in left and not [n for n in left if n.startswith(".")], left
    for name, data in files.items():
        assert (out / "model" / name).read_bytes() == data, name
    assert cli([*argv, "-o", str(out)]) == 0  # the finished run, read back
    assert json.loads(capsys.readouterr().out) == rec
    assert not (out / "checkpoint").exists()

    kept = tmp_path / "kept"
    assert cli([*argv, "-o", str(kept), "--keep-checkpoint"]) == 0
    assert json.loads(capsys.readouterr().out)["curve"] == rec["curve"]
    state = json.loads((kept / "checkpoint" / "state.json").read_text())
    assert state["step"] == 9 and (kept / "checkpoint" / "optimizer.pt").is_file()
    # a checkpoint left beside a finished record (a run stopped right after writing it)
    # goes at the next rerun, which reads the record back
    assert cli([*argv, "-o", str(kept)]) == 0
    assert json.loads(capsys.readouterr().out)["curve"] == rec["curve"]
    assert not (kept / "checkpoint").exists()
    assert not [n for n in os.listdir(kept) if n.startswith(".")]


# ---- bad input ----------------------------------------------------------------------------
def test_bad_input_is_one_line(work, tmp_path):
    from nas.cli import main as cli

    base = [str(work / "child"), "--teacher", str(work / "parent"), "--data",
            str(work / "tokens.npy"), *KD]
    cases = [
        (["distill", str(tmp_path / "nope"), *base[1:], "-o", str(tmp_path / "o1")],
         "not a checkpoint folder"),
        (["distill", *base, "-o", str(tmp_path / "o2"), "--batch", "0"], "--batch"),
        (["distill", *base, "-o", str(tmp_path / "o3"), "--lr", "-1"], "--lr"),
    ]
    bad_tokens = tmp_path / "bad.npy"
    np.save(bad_tokens, np.full(4096, 999, dtype=np.int64))
    cases.append((["distill", *base[:3], "--data", str(bad_tokens), *KD, "-o",
                   str(tmp_path / "o4")], "outside the vocabulary"))
    foreign = tmp_path / "o5"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("mine")
    cases.append((["distill", *base, "-o", str(foreign)], "notes.txt"))
    cases.append((["distill", *base, "-o", str(tmp_path / "o6"), "--nproc", "2", "--batch",
                   "3"], "multiple of the 2 ranks"))
    cases.append((["distill", *base, "-o", str(tmp_path / "o7"), "--nproc", "2", "--replicas",
                   "--mixed-precision", "bfloat16"], "drop --replicas"))
    cases.append((["distill", *base, "-o", str(tmp_path / "o8"), "--dtype", "bfloat16",
                   "--mixed-precision", "bfloat16"], "master weights are float32"))
    import contextlib
    import io

    for argv, needle in cases:
        err = io.StringIO()
        with contextlib.redirect_stderr(err):
            rc = cli(argv)
        assert rc == 2, (argv, err.getvalue())
        assert needle in err.getvalue() and err.getvalue().count("\n") == 1, err.getvalue()


def test_the_plan_holds_what_each_sharded_rank_holds(work, two_ranks):
    """``distill --plan``'s weights per rank are the shards a 2-rank run held: P / N each
    (float32 here), up to FSDP2's dim-0 padding and the buffers every rank keeps."""
    from nas.hf import load_config
    from nas.train.plan import distill_plan

    rec = load_record(two_ranks)
    p = distill_plan(load_config(work / "child"), load_config(work / "parent"), world=2,
                     replicas=False, batch=8, seq_len=SEQ, tokens=10 * 8 * SEQ, eval_every=5,
                     eval_tokens=1024, teacher_dtype="float32", student_dtype="float32",
                     mixed_precision=None, keep_best=True, lr_sweep=0, sweep_steps=None,
                     checkpointing=False)
    for col, planned in ((0, p.student_weights), (1, p.teacher_weights)):
        held = max(r[col] for r in rec.held_elements) * 4
        assert planned == pytest.approx(held, rel=0.02), (col, planned, held)
    assert p.gradients == p.student_weights and p.optimizer == 2 * p.student_weights


def test_the_chunked_loss_equals_the_whole_one(monkeypatch):
    """The loss made a chunk of positions at a time (under activation checkpointing) gives
    the whole-logits loss and its gradients, up to float32 summation order."""
    import nas.train.distill as nd
    from nas.child.random import build_model

    student, teacher = build_model(PARENT, seed=0), build_model(PARENT, seed=1)
    t = torch.randint(0, PARENT.vocab_size, (3, SEQ))
    monkeypatch.setattr(nd, "CHUNK_BYTES", 3 * 7 * PARENT.vocab_size * 4)  # 7 positions
    assert nd.chunk_positions(3, PARENT.vocab_size) == 7
    with torch.no_grad():
        zt, ht = teacher(t), teacher(t, hidden=True)
    whole = nd.kd_loss(student(t), zt, t, 0.3)
    whole[0].backward()
    g_whole = {k: p.grad.clone() for k, p in student.named_parameters()}
    student.zero_grad()
    chunked = nd.kd_loss_hidden(student, teacher, student(t, hidden=True), ht, t, 0.3)
    chunked[0].backward()
    for a, b in zip(whole, chunked):
        assert float(b.detach()) == pytest.approx(float(a.detach()), rel=1e-6)
    for k, p in student.named_parameters():
        assert torch.allclose(p.grad, g_whole[k], rtol=1e-4, atol=1e-7), k


@pytest.mark.parametrize("mixed", [None, "bfloat16"])
def test_a_rerun_reads_the_recorded_digests_instead_of_hashing(work, tmp_path, monkeypatch,
                                                               mixed):
    """The teacher's and the student's digests are hashed at the first start and recorded
    beside the run; a rerun (or resume) of unchanged checkpoints reads them back and hashes
    nothing, whole (one process) or sharded (a one-rank FSDP2 group, as under
    --mixed-precision); a checkpoint file that changed is hashed again."""
    import os

    import nas.scoring.digest as digest
    import nas.train.distill as d
    from nas.train.distill import STUDENT_RECORD, TEACHER_RECORD

    # a machine cache of its own: the first run hashes (another test's run recorded these
    # checkpoints' digests in the suite's cache, which would spare the hashing)
    monkeypatch.setenv("PUZZLE_NAS_CACHE", str(tmp_path / "cache"))
    s = DistillSettings(tokens=2 * 8 * SEQ, seq_len=SEQ, batch_size=8, eval_every=2,
                        eval_tokens=512, checkpoint_every=2, mixed_precision=mixed)
    data = np.load(work / "tokens.npy").astype(np.int64)
    out = tmp_path / "kd"
    first = distill(work / "child", work / "parent", data, out, s, progress=False,
                    log=lambda m: None)
    assert (out / TEACHER_RECORD).is_file() and (out / STUDENT_RECORD).is_file()

    def no_hashing(*a, **k):
        raise AssertionError("a checkpoint was hashed again")

    with monkeypatch.context() as m:
        m.setattr(d, "weights_digest", no_hashing)
        m.setattr(digest, "tensor_line", no_hashing)
        again = distill(work / "child", work / "parent", data, out, s, progress=False,
                        log=lambda m: None)
    assert again == first  # the finished run, found by the same key
    f = work / "child" / "model.safetensors"  # touched: its signature changed
    st = f.stat()
    os.utime(f, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000))
    calls = []
    real = d.weights_digest if mixed is None else digest.tensor_line
    with monkeypatch.context() as m:
        def counted(*a, **k):
            calls.append(1)
            return real(*a, **k)
        m.setattr(d, "weights_digest", counted) if mixed is None else \
            m.setattr(digest, "tensor_line", counted)
        third = distill(work / "child", work / "parent", data, out, s, progress=False,
                        log=lambda m: None)
    os.utime(f, ns=(st.st_atime_ns, st.st_mtime_ns))  # the shared fixture as it was
    assert calls and third == first  # hashed again, the same content: the same run


def _plan_of_run(work: Path, rec, teacher_layout: str, expert_parallel: str = "auto",
                 micro_batch: int | None = None):
    from nas.hf import load_config
    from nas.train.plan import distill_plan

    return distill_plan(load_config(work / "child"), load_config(work / "parent"),
                        world=rec.world_size, replicas=False, batch=8, seq_len=SEQ,
                        tokens=10 * 8 * SEQ, eval_every=5, eval_tokens=1024,
                        teacher_dtype="float32", student_dtype="float32", mixed_precision=None,
                        keep_best=True, lr_sweep=0, sweep_steps=None, checkpointing=False,
                        teacher_layout=teacher_layout, backend="gloo",
                        expert_parallel=expert_parallel, micro_batch=micro_batch)


@pytest.mark.parametrize("n,layout", [(2, "pipelined"), (2, "sharded"), (4, "pipelined"),
                                      (4, "sharded")])
def test_bytes_sent_per_step_are_the_plans(work, tmp_path, n, layout):
    """What the busiest rank sends per training step (gloo's TCP writes, counted by the
    kernel) is the plan's within 20 %, with the teacher pipelined or sharded; a pipelined
    teacher sends less than a gathered one, and the curves are the same."""
    out = work / f"sent-{n}-{layout}"
    if not (out / "distill.json").is_file():
        p = _cli(work, out, "--nproc", str(n), "--teacher-layout", layout)
        assert p.returncode == 0, p.stderr[-3000:]
    rec = load_record(out)
    assert rec.teacher_layout == layout
    # the parent's 8 experts divide over 2 and 4 ranks: a sharded teacher's are sharded whole
    assert rec.expert_parallel and rec.teacher_expert_parallel == (layout == "sharded")
    sent = rec.sent_bytes_per_step
    assert len(sent) == n and all(x is not None for x in sent)
    planned = _plan_of_run(work, rec, layout).sent_per_step
    assert max(sent) == pytest.approx(planned, rel=0.2), (sent, planned)
    other = work / f"sent-{n}-{'sharded' if layout == 'pipelined' else 'pipelined'}"
    if (other / "distill.json").is_file():
        o = load_record(other)
        a, b = (rec, o) if layout == "pipelined" else (o, rec)
        assert max(a.sent_bytes_per_step) < max(b.sent_bytes_per_step)
        for p1, p2 in zip(a.curve, b.curve):
            assert p1.kl_div == pytest.approx(p2.kl_div, rel=1e-5, abs=1e-7)


def test_experts_gathered_by_fsdp2_or_sharded_whole_send_what_their_plans_say(work, one_rank):
    """``--expert-parallel off`` (FSDP2 gathers every MoE block whole) and the default
    (each rank holds its experts whole and sends tokens to them): the bytes the busiest
    rank sends per step are each its plan's within 20 %, and both train as one rank does."""
    runs = {}
    for mode in ("off", "auto"):
        out = work / ("sent-2-pipelined" if mode == "auto" else "sent-2-pipelined-ep-off")
        if not (out / "distill.json").is_file():
            p = _cli(work, out, "--nproc", "2", "--expert-parallel", mode)
            assert p.returncode == 0, p.stderr[-3000:]
        rec = runs[mode] = load_record(out)
        assert rec.expert_parallel == (mode == "auto")
        planned = _plan_of_run(work, rec, "pipelined", mode).sent_per_step
        assert max(rec.sent_bytes_per_step) == pytest.approx(planned, rel=0.2), \
            (mode, rec.sent_bytes_per_step, planned)
        _curves_agree(one_rank, out)
    assert runs["off"].held_elements == runs["auto"].held_elements  # E / N experts each


def test_a_checkpoint_without_expert_parallelism_resumes_with_it(work, two_ranks):
    """The experts are DTensors ``Shard(0)`` either way: a 2-rank checkpoint written with
    FSDP2 gathering the experts resumes with them sharded whole (DCP), and the run ends as
    an uninterrupted one within float32 summation order."""
    out = work / "killed-ep-off"
    p = _cli(work, out, "--nproc", "2", "--expert-parallel", "off",
             env=_env(**{KILL_ENV: "7"}))
    assert p.returncode != 0 and not (out / "model").exists()
    p = _cli(work, out, "--nproc", "2", "--expert-parallel", "on")
    assert p.returncode == 0, p.stderr[-3000:]
    assert "resuming from step 6 of 10" in p.stderr
    assert load_record(out).expert_parallel  # the run's record says how it ran
    _curves_agree(two_ranks, out)


def test_experts_that_do_not_divide_over_the_ranks_train_as_one_rank(trained_parent,
                                                                     tmp_path):
    """A student whose MoE block keeps 3 experts, on 2 ranks: rank 0 holds 2 of them and
    rank 1 one (DTensor's split), the run trains as one rank does, and the busiest rank
    sends what its plan says within 20 %."""
    import shutil

    import numpy as np
    from tiny_parent import PARENT

    from nas.arch import NoOp
    from nas.child import init_from_parent, save_pretrained

    model, calib, _, data = trained_parent
    blocks = list(PARENT.blocks)
    blocks[1] = NoOp()
    blocks[3] = blocks[3].model_copy(update={"num_experts": 3})
    d = tmp_path / "uneven"
    save_pretrained(model, d / "parent")
    save_pretrained(init_from_parent(PARENT.replace_blocks(blocks), model, calib), d / "child")
    np.save(d / "tokens.npy", data.numpy().astype(np.uint16))
    one = _cli(d, d / "one")
    assert one.returncode == 0, one.stderr[-3000:]
    two = _cli(d, d / "two", "--nproc", "2", "--expert-parallel", "on")
    assert two.returncode == 0, two.stderr[-3000:]
    rec = load_record(d / "two")
    assert rec.expert_parallel
    _curves_agree(d / "one", d / "two")
    planned = _plan_of_run(d, rec, "pipelined", "on").sent_per_step
    assert max(rec.sent_bytes_per_step) == pytest.approx(planned, rel=0.2)
    shutil.rmtree(d)


def test_expert_parallel_on_that_cannot_run_is_one_line(work, tmp_path):
    p = _cli(work, tmp_path / "ep3", "--nproc", "1", "--expert-parallel", "on")
    assert p.returncode == 2 and p.stderr.count("\n") == 1, p.stderr[-2000:]
    assert "--expert-parallel on" in p.stderr and "sharded ranks" in p.stderr


def _moe_pair(folder: Path, hidden: int, width: int) -> Path:
    """A MoE student and teacher of one shape (an attention block, 4 MoE blocks of 8
    experts), random, and random tokens, in ``folder``."""
    from nas.arch import Attention, ModelArch, MoE
    from nas.child import save_pretrained
    from nas.child.random import build_model

    arch = ModelArch(hidden_size=hidden, vocab_size=512, blocks=(
        Attention(num_heads=4, num_kv_heads=2, head_dim=hidden // 4),
        *[MoE(num_experts=8, top_k=2, expert_width=width, shared_width=hidden)
          for _ in range(4)]))
    save_pretrained(build_model(arch, seed=0), folder / "child")
    save_pretrained(build_model(arch, seed=1), folder / "parent")
    rng = np.random.default_rng(0)
    np.save(folder / "tokens.npy", rng.integers(0, 512, 200_000).astype(np.uint16))
    return folder


def test_peak_memory_and_bytes_of_a_moe_student_are_the_plans(tmp_path):
    """A MoE student whose experts are most of it (4 blocks of 8 experts, 26M parameters,
    104 MB in float32) on 2 ranks, with FSDP2 gathering its experts and with them sharded
    whole (the default): each rank's peak resident memory above the runtime's floor is
    the plan's total within 20 %, and so is what it sends per step. The floor is the same
    run's on the same architecture 1/200 the size (torch, gloo and every library a run
    imports: 135 MiB here) less that one's own plan."""
    from nas.hf import load_config
    from nas.train.plan import distill_plan

    args = ["--tokens", str(10 * 8 * 64), "--seq-len", "64", "--batch", "8", "--eval-every",
            "5", "--eval-tokens", "1024", "--checkpoint-every", "100", "--nproc", "2"]
    got: dict[tuple[str, str], tuple[float, float, float, float]] = {}
    for size, (hidden, width) in (("tiny", (64, 16)), ("moe", (256, 1024))):
        d = _moe_pair(tmp_path / size, hidden, width)
        for mode in ("off", "auto"):
            out = d / f"out-{mode}"
            cmd = [sys.executable, "-m", "nas", "distill", str(d / "child"), "--teacher",
                   str(d / "parent"), "--data", str(d / "tokens.npy"), "-o", str(out),
                   *args, "--expert-parallel", mode]
            p = subprocess.run(cmd, env=_env(), capture_output=True, text=True, timeout=900)
            assert p.returncode == 0, p.stderr[-3000:]
            rec = load_record(out)
            assert rec.expert_parallel == (mode == "auto")
            plan = distill_plan(load_config(d / "child"), load_config(d / "parent"), world=2,
                                replicas=False, batch=8, seq_len=64, tokens=10 * 8 * 64,
                                eval_every=5, eval_tokens=1024, teacher_dtype="float32",
                                student_dtype="float32", mixed_precision=None,
                                keep_best=True, lr_sweep=0, sweep_steps=None,
                                checkpointing=False, backend="gloo", expert_parallel=mode)
            got[size, mode] = (max(rec.peak_rss_mib) * 2**20, plan.total,
                               max(rec.sent_bytes_per_step), plan.sent_per_step)
    for mode in ("off", "auto"):
        peak, total, sent, planned = got["moe", mode]
        floor = got["tiny", mode][0] - got["tiny", mode][1]
        assert peak - floor == pytest.approx(total, rel=0.2), (mode, got)
        assert sent == pytest.approx(planned, rel=0.2), (mode, got)
    # sharded whole, the experts are never gathered: less memory and 1/10 of the traffic
    assert got["moe", "auto"][0] < got["moe", "off"][0]
    assert got["moe", "auto"][2] < 0.1 * got["moe", "off"][2]
