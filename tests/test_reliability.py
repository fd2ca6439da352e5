"""Reliability of the command line under signals, full disks, concurrent runs and broken
inputs (issue 34): every case ends with one clear line and the documented exit code, and
leaves the earlier output set as it was.

Signals inside HiGHS are sent at deterministic moments by the fault-injection hook
``nas.mip.model.SIGNAL_ENV`` (the N-th call of a HiGHS callback, or the N-th HiGHS run):
that is where a Ctrl-C used to be swallowed (raised inside a callback, caught by HiGHS,
the run ended as "interrupted" or "error" and a degraded set was written with exit 0).
"""

from __future__ import annotations

import contextlib
import copy
import hashlib
import json
import math
import os
import resource
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from test_cli_outputs import TINY_SPEC as CLI_TINY_SPEC

from nas.cli import main
from nas.mip.model import SIGNAL_ENV

# the CLI output tests' tiny Llama search spec, without its sweep
TINY_SPEC: dict[str, Any] = {k: v for k, v in CLI_TINY_SPEC.items() if k != "solver"}
ON_HIGHS = "import nas.mip.model as m; m.DP_ROWS = 0"
"""Keeps a search on HiGHS: nas.mip solves a model this small by its exact DP (no HiGHS
callback to interrupt) unless no budget row may go to the DP."""


@pytest.fixture(autouse=True)
def _on_highs(monkeypatch):
    import nas.mip.model

    monkeypatch.setattr(nas.mip.model, "DP_ROWS", 0)
SWEEP = {"budget": 0, "start": "100%", "stop": "130%", "num": 6}
SOLVERS: dict[str, dict[str, Any]] = {
    "single": {},
    "sweep": {"sweep": SWEEP},
    "sweep2": {"sweep": {**SWEEP, "workers": 2}},  # two threads, each with its HiGHS model
    "pool": {"diverse": 4, "min_distance": 1},
}
"""The search kinds; on these specs an uninterrupted search makes (HiGHS 1.16) 3 / 20 /
20 / 12 HiGHS runs, 3 / 12 / 12 / 11 interrupt callbacks and 1 / 4 / 7 / 7 improving
solutions: the moments below are all inside the solve."""

CODES = {"INT": 130, "TERM": 143}
REPO = Path(__file__).resolve().parents[1]


def spec_file(folder: Path, kind: str) -> Path:
    spec = copy.deepcopy(TINY_SPEC)
    spec["solver"] = SOLVERS[kind]
    path = folder / f"{kind}.json"
    path.write_text(json.dumps(spec))
    return path


def snapshot(folder: Path) -> dict[str, str]:
    return {n: hashlib.sha256((folder / n).read_bytes()).hexdigest()
            for n in sorted(os.listdir(folder))}


def one_line(err: str) -> str:
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


def earlier_set(tmp_path: Path, kind: str) -> tuple[Path, Path, dict[str, str]]:
    """A spec of ``kind``, and the output folder an uninterrupted search of it wrote."""
    spec = spec_file(tmp_path, kind)
    out = tmp_path / "run"
    assert main(["search", str(spec), "-o", str(out), "--quiet"]) == 0
    return spec, out, snapshot(out)


MOMENTS = [
    ("single", "interrupt:2", "INT"), ("single", "improving:1", "TERM"),
    ("single", "run:2", "INT"),
    ("sweep", "interrupt:1", "INT"), ("sweep", "interrupt:11", "TERM"),
    ("sweep", "improving:3", "INT"), ("sweep", "run:10", "TERM"), ("sweep", "run:20", "INT"),
    ("sweep2", "interrupt:5", "INT"), ("sweep2", "interrupt:10", "TERM"),
    ("sweep2", "improving:2", "TERM"), ("sweep2", "run:15", "INT"),
    ("pool", "interrupt:4", "INT"), ("pool", "improving:5", "TERM"),
    ("pool", "run:9", "INT"), ("pool", "run:1", "TERM"),
]


@pytest.mark.parametrize("kind,at,sig", MOMENTS)
def test_signal_inside_highs_ends_the_search(tmp_path, capsys, monkeypatch, kind, at, sig):
    """SIGINT / SIGTERM at a HiGHS callback or run: exit 130 / 143, one line, and the
    earlier set byte for byte (never a degraded set with exit 0, nor "internal solver
    error")."""
    spec, out, before = earlier_set(tmp_path, kind)
    capsys.readouterr()
    monkeypatch.setenv(SIGNAL_ENV, f"{at}:{sig}:{kind}-{at}-{sig}-{os.getpid()}")
    assert main(["search", str(spec), "-o", str(out), "--quiet"]) == CODES[sig]
    line = one_line(capsys.readouterr().err)
    assert ("interrupted (SIGINT)" if sig == "INT" else "terminated (SIGTERM)") in line
    assert snapshot(out) == before
    assert sorted(os.listdir(tmp_path)) == sorted(["run", spec.name])
    # the handlers are back: a later search runs as usual
    monkeypatch.delenv(SIGNAL_ENV)
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    assert main(["search", str(spec), "-o", str(out), "--quiet"]) == 0


def _popen(spec: Path, out: Path, env: dict[str, str]) -> subprocess.Popen:
    # as the console script runs it: nas.cli.entry (main, then SIGINT ignored for teardown)
    code = (f"import sys; {ON_HIGHS}; from nas.cli import entry; "
            "sys.exit(entry())")
    return subprocess.Popen([sys.executable, "-c", code, "search", str(spec), "-o", str(out)],
                            cwd=spec.parent, env={**os.environ, "OMP_NUM_THREADS": "1", **env},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


@pytest.mark.parametrize("kind,at,sig", [("sweep", "interrupt:7", "INT"),
                                         ("pool", "improving:2", "TERM")])
def test_signal_inside_highs_process_exit_code(tmp_path, kind, at, sig):
    """The same as a process: ``python -m nas search`` exits 130 / 143."""
    spec, out, before = earlier_set(tmp_path, kind)
    p = _popen(spec, out, {SIGNAL_ENV: f"{at}:{sig}"})
    _, err = p.communicate(timeout=300)
    assert p.returncode == CODES[sig], err
    assert snapshot(out) == before
    assert sorted(os.listdir(tmp_path)) == sorted(["run", spec.name])


@pytest.mark.parametrize("kind,sig,delay_s", [("sweep2", "INT", 0.2), ("sweep", "TERM", 0.5),
                                              ("pool", "INT", 0.05), ("sweep2", "TERM", 0.0)])
def test_signal_at_a_moment_keeps_old_or_new_set(tmp_path, kind, sig, delay_s):
    """A real signal some time after the search started: 130 / 143 with the earlier set
    untouched, or (the search was done first) 0 with the new set, whole. A SIGTERM that
    lands after the command returned, in the interpreter's teardown, keeps its default
    action (``nas.cli.entry``: a hung teardown can still be stopped): the process ends by
    that signal, with the new set already whole."""
    spec, out, before = earlier_set(tmp_path, kind)
    p = _popen(spec, out, {})
    assert p.stderr is not None
    assert p.stderr.readline().startswith("searching")
    time.sleep(delay_s)
    p.send_signal(getattr(signal, "SIG" + sig))
    _, err = p.communicate(timeout=300)
    late = -signal.SIGTERM if sig == "TERM" else 0
    assert p.returncode in (0, late, CODES[sig]), err
    if p.returncode > 0:
        assert snapshot(out) == before
    else:
        assert sorted(snapshot(out)) == sorted(before)
    assert sorted(os.listdir(tmp_path)) == sorted(["run", spec.name])


# ---- one run at a time per output folder ----------------------------------------------
def test_second_search_on_the_same_output_is_refused(tmp_path, capsys):
    """A search whose output folder another run is writing exits 2 at once, naming the
    folder and the run, and leaves the folder alone; the lock file goes with its run."""
    from nas.io import lock_path, output_lock

    spec, out, before = earlier_set(tmp_path, "single")
    capsys.readouterr()
    with output_lock(out, "output folder"):
        assert main(["search", str(spec), "-o", str(out), "--quiet"]) == 2
        line = one_line(capsys.readouterr().err)
        assert str(out) in line and f"pid {os.getpid()}" in line
        assert "another puzzle-nas run" in line
        assert snapshot(out) == before
    assert not lock_path(out).exists()
    assert main(["search", str(spec), "-o", str(out), "--quiet"]) == 0
    assert sorted(os.listdir(tmp_path)) == sorted(["run", spec.name])


def test_second_search_process_is_refused(tmp_path):
    """The same across processes: one process holds the folder, a search in another exits
    2; once the first is done (here: killed, so the kernel drops its lock) a search runs."""
    spec, out, before = earlier_set(tmp_path, "single")
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys; from nas.io import output_lock\n"
         f"with output_lock({str(out)!r}):\n    print('held', flush=True); sys.stdin.read()"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "held\n"
        p = _popen(spec, out, {})
        _, err = p.communicate(timeout=300)
        assert p.returncode == 2, err
        assert f"pid {holder.pid}" in one_line(err.split("\n", 1)[1])
        assert snapshot(out) == before
    finally:
        holder.kill()
        holder.wait()
    # a SIGKILLed holder leaves its lock file, but not its lock: the next run takes it
    # (and removes the file at its end)
    assert main(["search", str(spec), "-o", str(out), "--quiet"]) == 0
    assert sorted(os.listdir(tmp_path)) == sorted(["run", spec.name])


# ---- a SIGKILLed build's staged checkpoint ---------------------------------------------
@pytest.fixture
def tiny_build(tmp_path):
    """``(parent folder, child config)``: a tiny llama parent checkpoint and a child."""
    pytest.importorskip("torch")
    from conftest import tiny_llama_checkpoint

    return tiny_llama_checkpoint(tmp_path)[:2]


def test_sigkilled_build_leftovers_are_removed_by_the_next_run(tmp_path, tiny_build):
    """SIGKILL just as the staged checkpoint is complete (no clean-up can run) leaves a
    hidden ``.child.<pid>-*.tmp`` folder; the next build removes it (its writer is gone),
    but not the temp entries of a live process nor names it did not make."""
    _, cfg = tiny_build
    out = tmp_path / "child"
    code = ("import os, signal, sys\nimport nas.child.checkpoint as bc\n"
            "bc.swap_in_dir = lambda staged, path: os.kill(os.getpid(), signal.SIGKILL)\n"
            "from nas.cli import main\n"
            f"sys.exit(main(['build', {str(cfg)!r}, '-o', {str(out)!r}]))")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       cwd=tmp_path, timeout=300)
    assert p.returncode == -signal.SIGKILL, p.stderr
    left = [n for n in os.listdir(tmp_path) if n.startswith(".child.")]
    # the staged checkpoint, and the lock file (its lock went with the process)
    assert sorted(n.endswith(".tmp") for n in left) == [False, True], left
    assert ".child.lock" in left
    left = [n for n in left if n.endswith(".tmp")]
    assert os.listdir(tmp_path / left[0])  # the whole staged checkpoint
    live = tmp_path / f".child.{os.getpid()}-abc.tmp"  # a live writer's (ours)
    live.mkdir()
    foreign = tmp_path / ".child.not-a-pid.tmp"
    foreign.mkdir()
    assert main(["build", str(cfg), "-o", str(out)]) == 0
    assert sorted(n for n in os.listdir(tmp_path) if n.startswith(".")) == sorted(
        [live.name, foreign.name])
    assert sorted(os.listdir(out)) == ["build.json", "config.json", "model.safetensors"]


# ---- a full disk: RLIMIT_FSIZE for every command that writes ---------------------------
@contextlib.contextmanager
def file_size_limit(n: int) -> Iterator[None]:
    """Writes past ``n`` bytes of any file fail with EFBIG for the block, as on a full disk
    (Python ignores SIGXFSZ, so the write raises instead of the process dying)."""
    assert signal.getsignal(signal.SIGXFSZ) == signal.SIG_IGN
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    resource.setrlimit(resource.RLIMIT_FSIZE, (n, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))


@pytest.fixture(scope="module")
def writers(tmp_path_factory):
    """Per command that writes: its argv with ``OUT`` for the output, and a file-size limit
    that makes it fail part-way through its writes (the inputs, made once, are only read)."""
    pytest.importorskip("torch")
    tmp_path = tmp_path_factory.mktemp("writers")
    import numpy as np
    from conftest import tiny_llama_checkpoint

    from nas.child import build_model, save_pretrained

    pdir, cfg, _, small = tiny_llama_checkpoint(tmp_path)
    child = save_pretrained(build_model(small, seed=1), tmp_path / "childck")
    tokens = tmp_path / "tokens.npy"
    np.save(tokens, np.random.default_rng(0).integers(0, 64, 20000).astype(np.int32))
    sspec = tmp_path / "score.json"
    sspec.write_text(json.dumps({
        **TINY_SPEC, "parent": str(pdir / "config.json"),
        "search_space": {"attention": {"kv_heads": [1], "noop": True},
                         "ffn": {"fractions": [0.5], "round_to": 8, "noop": True}}}))
    return {
        "search": (["search", str(spec_file(tmp_path, "sweep")), "-o", "OUT", "--quiet"],
                   20000),
        "search-small": (["search", str(spec_file(tmp_path, "pool")), "-o", "OUT", "--quiet"],
                         100),
        # --force: the same build again would find its child built and write nothing
        "build": (["build", str(cfg), "-o", "OUT", "--force"], 5000),
        "build-small": (["build", str(cfg), "-o", "OUT", "--force"], 100),
        "distill": (["distill", str(child), "--teacher", str(pdir), "--data", str(tokens),
                     "-o", "OUT", "--tokens", "1024", "--seq-len", "32", "--batch", "4",
                     "--eval-tokens", "256", "--checkpoint-every", "4", "--eval-every", "8"],
                    20000),
        "score": (["score", str(sspec), "--parent", str(pdir), "--data", str(tokens), "-o",
                   "OUT", "--seq-len", "32", "--batch-size", "4", "--max-tokens", "256"],
                  8000),
        "calibrate": (["calibrate", str(REPO / "costmodels" / "data" / "serving_measurements.csv"),
                       "--hw", "h100-sxm", "-o", "OUT", "--max-evals", "5", "--only",
                       "memory"], 1000),
        # --accept-noisy: a tiny probe on a shared core may be noisy; the disk is the point
        "profile": (["profile", "--device", "cpu", "--quick", "--threads", "1", "-o", "OUT",
                     "--accept-noisy"], 1000),
    }


def _tree(folder: Path) -> dict[str, str]:
    """Every file under ``folder`` (names relative to it) with its digest."""
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.mark.parametrize("command", ["search", "search-small", "build", "build-small",
                                     "distill", "score", "calibrate", "profile"])
def test_a_full_disk_is_one_line_and_leaves_the_earlier_outputs(tmp_path, writers, capsys,
                                                                 monkeypatch, command):
    """Each command that writes, run once to completion, then again on a 'full disk'
    (writes past a few KB fail): exit 1, one line saying it could not write, no traceback,
    the earlier outputs byte for byte, and no temp entry left (every file under the folder,
    hidden ones included, is compared)."""
    if command == "profile":
        from hwprofiles import probe
        from hwprofiles.probe import ProbePlan

        tiny = ProbePlan(gemm_sizes=(16, 32), gemm_unaligned=(33,), m_sweep=(1, 17),
                         m_sweep_nk=64, mem_bytes=(4096, 65536), attn_seqs=(16, 32),
                         attn_shape=(1, 2, 16), repeats=2, warmup=1, min_time_s=1e-4,
                         max_call_s=1.0, launch_iters=10)
        monkeypatch.setattr(probe, "default_plan", lambda *a, **k: tiny)
    argv, limit = writers[command]
    where = tmp_path / "w"
    where.mkdir()
    out = where / ("out.json" if command in ("calibrate", "profile") else "out")
    argv = [str(out) if a == "OUT" else a for a in argv]
    # a finished distillation has nothing left to write: the disk fills during the first
    # run, and a run after it (disk freed) resumes from what was left and completes
    earlier = command != "distill"
    if earlier:
        assert main(argv) == 0
    before = _tree(where)
    capsys.readouterr()
    with file_size_limit(limit):
        rc = main(argv)
    err = capsys.readouterr().err
    assert rc == 1, err
    line = one_line(err)
    assert f"puzzle-nas {argv[0]}: error: {out}: cannot write (" in line, line
    if earlier:
        assert _tree(where) == before
    else:
        assert not [p for p in where.rglob(".*")], list(where.rglob("*"))
        assert main(argv) == 0
        assert (out / "model" / "model.safetensors").exists()


# ---- a damaged distill checkpoint ------------------------------------------------------
def _truncate(p: Path) -> None:
    p.write_bytes(p.read_bytes()[: p.stat().st_size // 2])


def _flip(p: Path) -> None:
    b = bytearray(p.read_bytes())
    for i in range(8, len(b), max(1, len(b) // 64)):
        b[i] ^= 0xFF
    p.write_bytes(bytes(b))


@pytest.mark.parametrize("name,damage", [
    ("model.safetensors", _truncate), ("model.safetensors", _flip),
    ("optimizer.pt", _truncate), ("optimizer.pt", _flip), ("optimizer.pt", Path.unlink),
    ("state.json", lambda p: p.write_text('{"key": "x", "step": ')),
    ("state.json", lambda p: p.write_text('{"key": 1}')),
])
def test_a_damaged_distill_checkpoint_says_what_to_delete(tmp_path, writers, capsys, name,
                                                           damage):
    """Resuming from a damaged checkpoint file is one line naming the file and the folder to
    delete (exit 2), no traceback; once it is deleted the run starts over and completes."""
    argv = [str(tmp_path / "d") if a == "OUT" else a for a in writers["distill"][0]]
    out = tmp_path / "d"
    assert main([*argv, "--keep-checkpoint"]) == 0  # 8 steps, a checkpoint kept at step 4
    ckpt = out / "checkpoint"
    assert (ckpt / "state.json").is_file()
    (out / "distill.json").unlink()  # unfinished again: the next run resumes at step 4
    damage(ckpt / name)
    capsys.readouterr()
    assert main(argv) == 2
    line = one_line(capsys.readouterr().err)
    assert str(ckpt / name) in line and f"delete the folder {ckpt}" in line, line
    import shutil

    shutil.rmtree(ckpt)
    assert main(argv) == 0
    assert json.loads((out / "distill.json").read_text())["resumed_from_step"] == 0


# ---- parent weights a child must not inherit -------------------------------------------
@pytest.mark.parametrize("what", ["nan", "inf", "int32"])
def test_parent_weights_nan_or_integer_are_refused(tmp_path, tiny_build, capsys, what):
    """A parent tensor holding NaN / inf, or stored as int32, is refused (exit 2) naming
    the tensor and the file, by build and by load_pretrained (score and distill read
    parents with it); nothing is written."""
    import torch
    from safetensors.torch import load_file, save_file

    from hwprofiles.errors import InputError
    from nas.child import load_pretrained

    pdir, cfg = tiny_build
    f = pdir / "model.safetensors"
    sd = load_file(str(f))
    name = next(k for k in sd if k.endswith("mlp.down_proj.weight"))
    t = sd[name].clone()
    if what == "int32":
        t = (t * 100).to(torch.int32)
    else:
        t.view(-1)[3] = math.nan if what == "nan" else math.inf
    sd[name] = t
    save_file(sd, str(f))  # no recorded digests: the check is on the values
    calib = tmp_path / "calib.json"
    calib.write_text(json.dumps(list(range(64)) * 2))
    capsys.readouterr()
    out = tmp_path / "child"
    assert main(["build", str(cfg), "--parent", str(pdir), "--calib", str(calib),
                 "-o", str(out)]) == 2
    line = one_line(capsys.readouterr().err)
    assert str(f) in line and name in line, line
    assert ("int32" in line) if what == "int32" else ("1 NaN or infinite values" in line)
    assert not out.exists()
    with pytest.raises(InputError, match=name):
        load_pretrained(pdir)


# ---- accepted silently before: now refused or warned -----------------------------------
@pytest.mark.parametrize("argv", [
    ["search", "SPEC", "-o", ""], ["search", "SPEC", "-o", "  "],
    ["build", "CFG", "-o", ""], ["score", "SPEC", "--parent", "P", "--data", "D", "-o", ""],
    ["profile", "--device", "cpu", "--quick", "-o", ""],
    ["calibrate", "M.csv", "--hw", "h100-sxm", "-o", ""],
])
def test_an_empty_output_path_is_refused(tmp_path, capsys, monkeypatch, argv):
    """``-o ''`` used to mean the current folder (search: the default folder; score wrote
    its files into the current folder): now exit 2 naming -o, and nothing is written."""
    monkeypatch.chdir(tmp_path)
    spec = spec_file(tmp_path, "single")
    argv = [str(spec) if a == "SPEC" else a for a in argv]
    assert main(argv) == 2
    line = one_line(capsys.readouterr().err)
    assert "-o" in line and "is empty" in line, line
    assert sorted(os.listdir(tmp_path)) == [spec.name]


@pytest.fixture(scope="module")
def peaked(tmp_path_factory):
    """``(argv, folder)``: a ``distill`` command line (output ``OUT``) whose teacher is the
    frozen trained parent (held-out LM loss 2.63 nats against ln 256 = 5.55 for the uniform
    guess: its predictions are far from uniform, so a student that collapses to uniform
    is far from it) and whose student is that parent with half-width FFNs, built from it:
    held-out KL 0.0009 nats at the start, as a pruned child's is."""
    pytest.importorskip("torch")
    import numpy as np
    from tiny_parent import FROZEN, PARENT, english_bytes

    from nas.arch import FFN
    from nas.hf import to_hf

    folder = tmp_path_factory.mktemp("peaked")
    tokens = folder / "tokens.npy"
    np.save(tokens, np.frombuffer(english_bytes(), dtype=np.uint8).astype(np.int32))
    child = PARENT.replace_blocks([FFN(width=b.width // 2) if isinstance(b, FFN) else b
                                   for b in PARENT.blocks])
    (folder / "child.json").write_text(json.dumps(to_hf(child)))
    assert main(["build", str(folder / "child.json"), "--parent", str(FROZEN), "--calib",
                 str(tokens), "--calib-len", "64", "-o", str(folder / "child")]) == 0
    return (["distill", str(folder / "child"), "--teacher", str(FROZEN), "--data", str(tokens),
             "-o", "OUT", "--tokens", "5120", "--seq-len", "64", "--batch", "8",
             "--eval-tokens", "2048", "--eval-every", "5", "--checkpoint-every", "5"], folder)


@pytest.mark.parametrize("lr", ["1e3", "1e6"])
def test_a_huge_learning_rate_warns_and_a_diverged_run_stops(tmp_path, peaked, capsys, lr):
    """``distill --lr 1e3`` / ``1e6`` on a teacher far from uniform: a warning line up
    front, then the run stops with one line naming --lr (exit 2) and writes no child. (On a
    near-uniform teacher a student blown up to the uniform guess looked *better* than its
    start; here it cannot.)"""
    argv = [str(tmp_path / "d") if a == "OUT" else a for a in peaked[0]]
    assert main([*argv, "--lr", lr]) == 2
    err = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert "Traceback" not in "\n".join(err) and len(err) == 2, err
    assert err[0].startswith(f"puzzle-nas distill: warning: --lr {float(lr):g} is far above")
    assert err[1].startswith("puzzle-nas distill: error: --lr: training diverged: "), err[1]
    assert not (tmp_path / "d" / "model").exists()


def test_a_usual_learning_rate_trains_without_a_word(tmp_path, peaked, capsys):
    """The default rate (3e-4) on the same pair: no warning, no note, a lower held-out KL
    kept (0.0009 -> 0.0001 nats when measured)."""
    argv = [str(tmp_path / "d") if a == "OUT" else a for a in peaked[0]]
    assert main(argv) == 0
    out, err = capsys.readouterr()
    assert "warning" not in err and "collapsed" not in out and "unchanged" not in out, out
    rec = json.loads((tmp_path / "d" / "distill.json").read_text())
    assert rec["final"]["kl_div"] < rec["initial"]["kl_div"] and rec["notes"] == []
    # the best constant guess agrees with the peaked teacher on far fewer positions than
    # the student does
    assert rec["chance_agreement"] < 0.5 < rec["final"]["top1_agreement"]


def test_a_student_equal_to_its_teacher_is_kept_unchanged_and_says_so(tmp_path, peaked,
                                                                       capsys):
    """Distilling the parent into itself: KL 0 at step 0 can't be beaten, so the child kept
    is the unchanged start, and the summary says so in one line."""
    from tiny_parent import FROZEN

    argv = [str(tmp_path / "d") if a == "OUT" else a for a in peaked[0]]
    argv[1] = str(FROZEN)
    assert main([*argv, "--lr", "1e-3"]) == 0
    notes = [ln for ln in capsys.readouterr().out.splitlines() if "unchanged:" in ln]
    assert len(notes) == 1 and "the child kept is the unchanged start" in notes[0], notes
    rec = json.loads((tmp_path / "d" / "distill.json").read_text())
    assert rec["kept_step"] == 0 and rec["final"]["kl_div"] == 0.0


def test_the_divergence_rule():
    """A run has diverged when its loss is not finite, or has risen above its first step's
    loss by more than the uniform guess can lose ((1 + lm_weight) ln V); a transient
    rise of 42x from a tiny start (the trained parent at lr 1e-3, recovered) is not."""
    import math

    from nas.train.distill import diverged, uniform_loss_bound

    ln = math.log(256)
    assert uniform_loss_bound(0.0, 256) == ln and uniform_loss_bound(0.5, 256) == 1.5 * ln
    assert diverged([0.0009, 0.0009 * 42, 0.001], 0.0, 256) is None
    assert "the loss is nan" in diverged([0.5, float("nan")], 0.0, 256)
    assert "the loss is inf" in diverged([0.5, float("inf")], 0.0, 256)
    assert diverged([0.5, 0.5 + ln * 0.999], 0.0, 256) is None
    assert "rose from 0.5 to" in diverged([0.5, 0.5 + ln * 1.001], 0.0, 256)
    assert diverged([0.5, 0.5 + ln * 1.2], 0.5, 256) is None  # the LM term's share too


def test_run_notes_name_a_collapse_and_an_unchanged_child():
    from nas.train.distill import CurvePoint, run_notes

    def pt(step: int, kl: float, agree: float) -> CurvePoint:
        return CurvePoint(step=step, tokens=step, kl_div=kl, lm_loss=1.0, accuracy=0.1,
                          top1_agreement=agree, train_loss=None)

    start, fine, flat = pt(0, 0.1, 0.9), pt(10, 0.05, 0.95), pt(10, 2.0, 0.02)
    assert run_notes([start, fine], fine, 0.03) == []
    notes = run_notes([start, flat], start, 0.03)
    assert [n.split(":")[0] for n in notes] == ["collapsed", "unchanged"], notes
    assert run_notes([start, flat], start, None)[0].startswith("unchanged")


def test_a_too_small_time_limit_says_so(tmp_path, capsys):
    """A solver time limit too small for HiGHS to find any child: one line naming
    solver.time_limit (exit 2), not "internal solver error"."""
    spec = json.loads((REPO / "nas" / "examples" / "nemotron3-super-h100.json").read_text())
    spec["solver"] = {"time_limit": 1e-6}
    spec["parent"] = str(REPO / "nas" / "examples" / spec["parent"])
    path = tmp_path / "s.json"
    path.write_text(json.dumps(spec))
    assert main(["search", str(path), "-o", str(tmp_path / "o"), "--quiet"]) == 2
    line = one_line(capsys.readouterr().err)
    assert "solver.time_limit: no child found within the time limit of 1e-06 s" in line
    assert "internal solver error" not in line and not (tmp_path / "o").exists()


@pytest.mark.parametrize("budget", [
    {"metric": "memory", "workload": "chat", "max": "-5 GiB"},
    {"metric": "memory", "workload": "chat", "max": "-50%"},
    {"metric": "memory", "workload": "chat", "max": -3},
    {"metric": "ttft", "workload": "chat", "max": "-5 ms"},
    {"metric": "weight_memory", "max": "-1 GB"},
    {"metric": "total_params", "max": -1e9},
])
def test_a_negative_budget_is_bad_input_not_infeasible(tmp_path, capsys, budget):
    spec = copy.deepcopy(TINY_SPEC)
    spec["budgets"] = [budget]
    path = tmp_path / "s.json"
    path.write_text(json.dumps(spec))
    assert main(["search", str(path), "-o", str(tmp_path / "o"), "--quiet"]) == 2
    line = one_line(capsys.readouterr().err)
    assert f"budgets[0].max: a {budget['metric']} bound must be >= 0" in line, line


# ---- the Python API a library user meets first -----------------------------------------
def test_price_model_takes_names_and_one_workload():
    """``price_model`` takes a hardware name, a recipe name and a single workload string
    (once a string was read character by character, "got 'i'"), and prices them exactly
    as the objects and a one-element list."""
    import numpy as np

    import hwprofiles
    import nas
    from costmodels.dtypes import get_recipe
    from costmodels.model import price_model
    from nas.hf import load_config
    from nas.search.blueprint import nonblock_shape

    parent = load_config(REPO / "nas" / "examples" / "configs" / "llama-3.1-8b.json")
    nb, wl = nonblock_shape(parent), "isl=1024,osl=128,concurrency=4"
    by_name = price_model(parent.table, nb, "h100-sxm", "fp8", wl)
    by_obj = price_model(parent.table, nb, hwprofiles.get("h100-sxm"), get_recipe("fp8"), [wl])
    for field in ("ttft_s", "tpot_s", "throughput_tok_s", "memory_bytes"):
        assert np.array_equal(getattr(by_name, field), getattr(by_obj, field))
    assert np.shape(by_name.ttft_s) == (1,)
    for bad, what in ((("h1000", "fp8"), "unknown device .h1000."),
                      (("h100-sxm", "fp9"), "unknown precision recipe 'fp9'"),
                      ((3, "fp8"), "hw: expected a HardwareProfile or a profile name")):
        with pytest.raises(nas.InputError, match=what):
            price_model(parent.table, nb, *bad, wl)  # type: ignore[arg-type]


def test_one_public_error_type():
    """``nas.InputError`` is the error every package raises for bad input (an infeasible
    search's too), importable without torch."""
    code = ("import sys, nas; from hwprofiles.errors import InputError; "
            "from nas.mip import InfeasibleError; "
            "assert nas.InputError is InputError and issubclass(InfeasibleError, nas.InputError)"
            "; assert 'torch' not in sys.modules")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert p.returncode == 0, p.stderr


def test_inspect_labels_compare_total_and_active(capsys):
    """For a dense model active equals total once the same parts are left out of both; the
    published figure (LM head kept) is labelled as such."""
    import re

    cfg = REPO / "nas" / "examples" / "configs" / "llama-3.1-8b.json"
    assert main(["inspect", str(cfg)]) == 0
    out = capsys.readouterr().out
    m = re.search(r"without embedding table and LM head: total ([\d.,]+) B, active ([\d.,]+) B",
                  out)
    assert m is not None and m.group(1) == m.group(2) == "6.980", out
    assert "active without the embedding table only (LM head kept, as published): 7.505 B" \
        in out


def test_pareto_marks_the_chosen_child_and_which_way_is_better():
    import matplotlib.pyplot as plt

    from nas.search.blueprint import pareto_figure

    pts = [(500.0, 5.0), (700.0, 12.0), (900.0, 30.0)]
    for higher, word in ((True, "higher"), (False, "lower")):
        fig = pareto_figure("throughput@chat", "tok/s", pts, (400.0, 0.0), chosen=(700.0, 12.0),
                            higher_is_better=higher, quality_label="quality: prior")
        ax = fig.axes[0]
        _, labels = ax.get_legend_handles_labels()
        assert "chosen (blueprint.json)" in labels
        line = next(ln for ln in ax.get_lines() if ln.get_label() == "chosen (blueprint.json)")
        assert list(line.get_xdata()) == [700.0] and list(line.get_ydata()) == [12.0]
        assert ax.get_xlabel().endswith(f"{word} is better")
        assert ax.get_ylabel() == "quality: prior, lower is better"
        arrow = next(t for t in ax.texts if t.get_text() == "better")
        (x0, y0), (x1, y1) = arrow.xyann, arrow.xy  # from the text to the arrow's head
        assert y1 < y0 and (x1 > x0) == higher
        plt.close(fig)


@pytest.mark.parametrize("command", ["build", "distill"])
def test_second_build_or_distill_on_the_same_output_is_refused(tmp_path, writers, capsys,
                                                               command):
    """build and distill hold their -o too (two distills would train into one checkpoint;
    the last build to finish would replace the other's without a word)."""
    from nas.io import lock_path, output_lock

    out = tmp_path / "out"
    argv = [str(out) if a == "OUT" else a for a in writers[command][0]]
    with output_lock(out, "-o"):
        assert main(argv) == 2
        line = one_line(capsys.readouterr().err)
        assert f"pid {os.getpid()}" in line and str(out) in line, line
        assert not out.exists()
    assert main(argv) == 0
    assert not lock_path(out).exists()


def test_stale_temps_inside_an_output_folder_are_removed(tmp_path, writers):
    """A checkpoint staged inside distill's folder by a killed run (a dead pid in its name)
    is removed by the next run; a live process's is left."""
    p = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                       capture_output=True, text=True)
    dead = int(p.stdout)  # a process that has exited
    out = tmp_path / "d"
    stale = out / f".checkpoint.{dead}-abc123.tmp"
    stale.mkdir(parents=True)
    (stale / "model.safetensors").write_bytes(b"x" * 1000)
    (out / f".distill.json.{dead}-q1.tmp").write_text("{")
    live = out / f".checkpoint.{os.getpid()}-zz.tmp"
    live.mkdir()
    argv = [str(out) if a == "OUT" else a for a in writers["distill"][0]]
    assert main(argv) == 0
    assert sorted(n for n in os.listdir(out) if n.startswith(".")) == [live.name]


def test_a_full_disk_during_iterate_is_one_line(tmp_path, writers, capsys):
    """iterate (score, search, build, distill per stage) on a full disk: exit 1 and one
    error line after its progress lines, no traceback, no temp entry left."""
    score_argv = writers["score"][0]
    spec = json.loads(Path(score_argv[1]).read_text())
    spec["stages"] = [{"budgets": [{"metric": "throughput", "workload": "chat",
                                    "min": "105%"}]}]
    path = tmp_path / "it.json"
    path.write_text(json.dumps(spec))
    out = tmp_path / "it"
    argv = ["iterate", str(path), "--parent", score_argv[3], "--data", score_argv[5],
            "-o", str(out), "--seq-len", "32", "--max-tokens", "256", "--calib-tokens", "256",
            "--bld-steps", "2", "--kd-tokens", "512", "--kd-batch", "4", "--kd-eval-every",
            "4", "--kd-eval-tokens", "256"]
    with file_size_limit(20000):
        rc = main(argv)
    err = capsys.readouterr().err
    assert rc == 1 and "Traceback" not in err, err
    errors = [ln for ln in err.splitlines() if "error" in ln]
    assert errors == [f"puzzle-nas iterate: error: {out}: cannot write (File too large); the "
                      "earlier outputs are as they were, nothing half-written was left "
                      "behind"], err
    assert not [p for p in tmp_path.rglob(".*")], list(tmp_path.rglob(".*"))


@pytest.mark.parametrize("sig", ["INT", "TERM"])
def test_a_signal_while_the_lock_is_taken_leaves_no_lock_file(tmp_path, monkeypatch, sig):
    """A signal held back while the output lock is taken is delivered as that step ends;
    it happens inside the lock's cleanup, so no ``.run.lock`` is left (a real SIGTERM at
    0 s into a 2-thread sweep once left one)."""
    import nas.io

    spec, out, before = earlier_set(tmp_path, "single")
    take = nas.io._take_lock

    def take_then_signal(*a, **k):
        fd = take(*a, **k)
        os.kill(os.getpid(), getattr(signal, "SIG" + sig))  # held until the step ends
        return fd

    monkeypatch.setattr(nas.io, "_take_lock", take_then_signal)
    assert main(["search", str(spec), "-o", str(out), "--quiet"]) == CODES[sig]
    assert snapshot(out) == before
    assert sorted(os.listdir(tmp_path)) == sorted(["run", spec.name])
