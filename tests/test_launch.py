"""The launcher (nas.launch): the processes that hold a model give large freed buffers back
to the system (unpool_large_allocations), and ranks never outlive the command that launched
them: a signal at any moment stops them all, a killed rank is one line, and the run resumes
(run_ranks, rank_main)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

PROBE = """
import sys, numpy as np
from nas.launch import unpool_large_allocations
ok = unpool_large_allocations() if sys.argv[1] == "on" else None
def anon():
    return next(int(l.split()[1]) for l in open("/proc/self/status")
                if l.startswith("RssAnon")) // 1024
base = anon()
keep = []
for i in range(6):
    a = np.ones(3 << 20)  # 24 MiB, touched, then freed
    keep += [np.ones(100) for _ in range(200)]  # small blocks allocated after it
    del a
print(ok, anon() - base)
"""


def _retained(mode: str) -> tuple[str, int]:
    env = dict(os.environ, PYTHONPATH=str(REPO))
    for k in ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_"):
        env.pop(k, None)
    out = subprocess.run([sys.executable, "-c", PROBE, mode], env=env, capture_output=True,
                         text=True, check=True).stdout.split()
    return out[0], int(out[1])


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads /proc (Linux)")
def test_freed_large_buffers_go_back_to_the_system():
    ok, kept = _retained("on")
    if ok != "True":
        pytest.skip("not glibc: mallopt is not there")
    # 6 x 24 MiB were allocated and freed; 1,200 small arrays (about 1 MiB) are still held;
    # left to its default, glibc keeps about 24 MiB of the freed ones here
    assert kept < 6, f"{kept} MiB kept after freeing 6 x 24 MiB"


def test_the_commands_that_hold_a_model_set_it():
    """score, distill and iterate (and every rank) set it; planning commands do not."""
    from nas.cli import COMMANDS
    from nas.launch import HOLDS_A_MODEL

    assert set(HOLDS_A_MODEL) <= set(COMMANDS)
    assert "search" not in HOLDS_A_MODEL and "cost" not in HOLDS_A_MODEL


# ---- ranks that never outlive their launcher ---------------------------------------------
def ranks_tests(test):
    """A test of ranks: needs torch, and Linux (:func:`linux`)."""
    return pytest.mark.torch(pytest.mark.usefixtures("linux")(test))


@pytest.fixture
def linux():
    """The rank tests find ranks through /proc (Linux)."""
    if not Path("/proc/self/cmdline").exists():
        pytest.skip("reads /proc (Linux)")


def _started(work: Path, out: Path, moment: str) -> subprocess.Popen:
    """``distill --nproc 2`` into ``out``, returned at ``moment`` (:data:`MOMENTS`)."""
    p = _distill(work, out)
    _wait_for(lambda: MOMENTS[moment](out, p) or p.poll() is not None)
    assert p.poll() is None, p.communicate()[1][-3000:]
    return p
KD = ["--tokens", "40960", "--seq-len", "64", "--batch", "8", "--lr", "2e-3", "--eval-every",
      "5", "--eval-tokens", "1024", "--checkpoint-every", "3", "--nproc", "2"]


@pytest.fixture(scope="module")
def kd_work(trained_parent, tmp_path_factory):
    """The trained tiny parent, a child of it (an FFN dropped, a MoE at half its experts)
    and the English bytes as token ids, as checkpoints and a token file."""
    pytest.importorskip("torch")
    from conftest import distill_folder

    return distill_folder(trained_parent, tmp_path_factory.mktemp("ranks"))


def _distill(work: Path, out: Path) -> subprocess.Popen:
    # a cache of its own: the checkpoints are hashed and their records written beside the
    # run ("loaded" below), not read from the digests another test recorded
    env = dict(os.environ, OMP_NUM_THREADS="1", PUZZLE_NAS_CACHE=str(out) + "-cache",
               PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]))
    cmd = [sys.executable, "-m", "nas", "distill", str(work / "child"), "--teacher",
           str(work / "parent"), "--data", str(work / "tokens.npy"), "-o", str(out), *KD]
    return subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)


def _ranks_of(out: Path) -> list[int]:
    """The pids of the live ranks writing to ``out`` (their command lines name it)."""
    pids = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            argv = (proc / "cmdline").read_bytes().split(b"\0")
            state = next(line for line in (proc / "status").read_text().splitlines()
                         if line.startswith("State:"))
        except (OSError, StopIteration):
            continue
        if b"nas.cli.distill" in argv and str(out).encode() in argv and "zombie" not in state:
            pids.append(int(proc.name))
    return sorted(pids)


def _wait_for(what, seconds: float = 120.0) -> None:
    """Poll until ``what()`` holds (the moment a test acts at), or fail after ``seconds``."""
    import time

    end = time.monotonic() + seconds
    while not what():
        assert time.monotonic() < end, "the moment never came"
        time.sleep(0.05)


def _no_rank_left(out: Path) -> bool:
    """No rank of ``out`` is alive 10 s after the command ended (polled)."""
    import time

    end = time.monotonic() + 10
    while _ranks_of(out):
        if time.monotonic() > end:
            return False
        time.sleep(0.1)
    return True


def _lines(stderr: str) -> list[str]:
    """What the command said besides its progress (the ``step k/n`` lines)."""
    return [x for x in stderr.splitlines() if x.strip() and not x.startswith("step ")]


def _resumes(work: Path, out: Path) -> None:
    p = _distill(work, out)
    _, err = p.communicate(timeout=600)
    assert p.returncode == 0, err[-3000:]
    assert (out / "model").is_dir() and (out / "distill.json").is_file()


MOMENTS = {
    # the ranks are loading torch (a signal there is held until it has loaded)
    "start": lambda out, p: len(_ranks_of(out)) == 2,
    # the ranks have read their shards and hashed the checkpoints
    "loaded": lambda out, p: (out / "student-digest.json").is_file(),
    # training, with a checkpoint on disk
    "training": lambda out, p: (out / "checkpoint" / "state.json").is_file(),
}


@ranks_tests
@pytest.mark.parametrize("sig,moment", [("TERM", "start"), ("INT", "loaded"),
                                        ("TERM", "training"), ("INT", "training")])
def test_a_signal_stops_every_rank_and_leaves_the_output_whole(kd_work, tmp_path, sig,
                                                               moment):
    """SIGTERM or SIGINT to ``distill --nproc 2`` at several moments: 143 or 130 and one
    line, no rank alive 10 s later (none writes after the lock is released), and the same
    command then resumes and completes."""
    import signal

    out = tmp_path / "kd"
    p = _started(kd_work, out, moment)
    p.send_signal(getattr(signal, f"SIG{sig}"))
    _, err = p.communicate(timeout=60)
    assert p.returncode == {"TERM": 143, "INT": 130}[sig], err[-3000:]
    word = {"TERM": "terminated (SIGTERM)", "INT": "interrupted (SIGINT)"}[sig]
    assert _lines(err) == [f"puzzle-nas distill: {word}; nothing half-written was left "
                           "behind"], err[-3000:]
    assert _no_rank_left(out)
    if moment == "training":
        _resumes(kd_work, out)


@ranks_tests
def test_a_killed_rank_is_one_line_and_the_run_resumes(kd_work, tmp_path):
    import re
    import signal

    out = tmp_path / "kd"
    p = _started(kd_work, out, "training")
    ranks = _ranks_of(out)
    assert len(ranks) == 2, p.communicate()[1][-3000:]
    os.kill(ranks[-1], signal.SIGKILL)
    _, err = p.communicate(timeout=60)
    assert p.returncode == 1, err[-3000:]
    lines = _lines(err)
    assert len(lines) == 1 and re.fullmatch(
        rf"puzzle-nas distill: error: rank \d of 2 \(pid {ranks[-1]}\) was killed by SIGKILL; "
        "the other ranks were stopped, .*rerun the same command to resume", lines[0]), err
    assert _no_rank_left(out)
    _resumes(kd_work, out)


@ranks_tests
def test_ranks_end_when_their_launcher_is_killed(kd_work, tmp_path):
    """A SIGKILLed launcher cannot stop its ranks: they see it gone and end themselves."""
    import signal

    out = tmp_path / "kd"
    p = _started(kd_work, out, "loaded")
    p.send_signal(signal.SIGKILL)
    p.communicate(timeout=60)
    assert _no_rank_left(out)


def test_the_failure_reported_is_the_cause():
    """A rank killed by a signal is named before one that exited on its own, and both
    before those that only lost a peer."""
    from types import SimpleNamespace as F

    from nas.launch import EXIT_PEER_LOST, _cause

    peer = F(exitcode=EXIT_PEER_LOST, timestamp=1.0, pid=1)
    killed = F(exitcode=-9, timestamp=2.0, pid=2)
    bad = F(exitcode=2, timestamp=0.5, pid=3)
    assert _cause({0: peer, 1: killed, 2: bad})[0] == 1
    assert _cause({0: peer, 2: bad})[0] == 2
    assert _cause({0: peer, 1: F(exitcode=EXIT_PEER_LOST, timestamp=0.0, pid=4)})[0] == 1
