"""Scoring benchmark, side by side in one run:

* prefix-cached vs naive replace-1-block scoring (in process, one thread): the cached path
  starts every alternative of block ``i`` from the parent's stored stream at block ``i``
  (and initializes it from stored calibration activations); the naive path runs the whole
  model per alternative, prefix included. Goal: cached <= 0.6x naive (asserted). Both give
  the same scores (asserted).
* 2 ranks vs 1 rank: ``puzzle-nas score --nproc N`` end to end (process start, torchrun,
  loading, scoring, merge), one thread per rank, fresh output folders.

Parent: a random-init dense Llama-style model (16 blocks: 8 attention q8/kv8 d16 + 8 FFN
512, hidden 128, vocab 1024); 4,096 held-out tokens in rows of 256, 2,048 calibration
tokens; search space KV heads 2 + no-op, FFN 50 % + no-op: 32 alternatives. The two
variants of each comparison alternate round by round, so that a busy machine slows both
alike; the ratio of the medians is reported.

The sharded test (``test_sharded_memory_and_rate``) asserts its goals (issue 28) after
printing its figures, and fails naming each goal missed and the figure measured.

Run: ``pytest benchmarks/bench_scoring.py --benchmark-only -s``.
"""

from __future__ import annotations

import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from nas.arch import FFN, Attention, ModelArch  # noqa: E402
from nas.child import build_model, load_pretrained, save_pretrained  # noqa: E402
from nas.scoring import Settings, prepare  # noqa: E402
from nas.scoring.core import Scorer, make_items, weights_digest  # noqa: E402

ARCH = ModelArch(hidden_size=128, vocab_size=1024, model_type="llama",
                 blocks=(Attention(num_heads=8, num_kv_heads=8, head_dim=16),
                         FFN(width=512)) * 8)
SETTINGS = Settings(seq_len=256, max_tokens=4096, calib_tokens=2048, batch_size=8)
SPACE = {"attention": {"kv_heads": [2], "noop": True},
         "ffn": {"fractions": [0.5], "noop": True}}
N_ALTS = 32
ROUNDS = 3
RESULTS: dict[str, list[float]] = {}
SCORES: dict[str, list[float]] = {}
REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def work(tmp_path_factory):
    d = tmp_path_factory.mktemp("bench_scoring")
    save_pretrained(build_model(ARCH, seed=0), d / "parent")
    rng = np.random.default_rng(0)
    np.save(d / "tokens.npy", rng.integers(0, ARCH.vocab_size, 8192, dtype=np.int64))
    (d / "spec.json").write_text(json.dumps({
        "name": "bench", "parent": "parent/config.json", "hardware": "h100-sxm",
        "workloads": {"w": {"isl": 128, "osl": 128, "batch": 1}}, "search_space": SPACE}))
    return d


def _score_all(work: Path, cached: bool) -> list[float]:
    torch.set_num_threads(1)
    job = prepare(work / "spec.json", work / "parent", work / "tokens.npy", SETTINGS)
    parent = load_pretrained(work / "parent")
    items = make_items(ARCH, job.alts, weights_digest(parent), job.split.digest, SETTINGS)
    assert len(items) == N_ALTS
    t = time.perf_counter()
    scorer = Scorer(parent, job.split, SETTINGS, cached=cached)
    kl = [scorer.score(it)[0]["kl_div"] for it in items]
    RESULTS.setdefault("cached" if cached else "naive", []).append(time.perf_counter() - t)
    return kl


@pytest.mark.benchmark(group="scoring-prefix-cache")
def test_prefix_cached_vs_naive(benchmark, work, capsys):
    def pair():
        SCORES["cached"] = _score_all(work, True)
        SCORES["naive"] = _score_all(work, False)

    benchmark.pedantic(pair, rounds=ROUNDS, iterations=1)
    np.testing.assert_allclose(SCORES["cached"], SCORES["naive"], rtol=1e-6, atol=1e-9)
    med = {k: statistics.median(RESULTS[k]) for k in ("cached", "naive")}
    ratio = med["cached"] / med["naive"]
    benchmark.extra_info.update({"median_s_cached": med["cached"],
                                 "median_s_naive": med["naive"], "cached_over_naive": ratio})
    with capsys.disabled():
        print(f"\n[bench_scoring] {N_ALTS} alternatives x 4,096 held-out tokens, 16 blocks: "
              f"median cached {med['cached']:.2f} s, naive {med['naive']:.2f} s -> "
              f"cached/naive {ratio:.2f}x (goal <= 0.6x)")
    assert ratio <= 0.6, (f"prefix-cached / naive scoring time: goal <= 0.6x, measured "
                          f"{ratio:.3f}x ({med['cached']:.2f} / {med['naive']:.2f} s)")


def _cli(work: Path, nproc: int, n: int) -> float:
    out = work / f"out-{nproc}-{n}"
    env = dict(os.environ, OMP_NUM_THREADS="1")
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")])
    cmd = [sys.executable, "-m", "nas", "score", str(work / "spec.json"), "--parent",
           str(work / "parent"), "--data", str(work / "tokens.npy"), "-o", str(out),
           "--seq-len", "256", "--max-tokens", "4096", "--calib-tokens", "2048",
           "--nproc", str(nproc)]
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    t = time.perf_counter()
    subprocess.run(cmd, env=env, check=True, capture_output=True)
    dt = time.perf_counter() - t
    ru2 = resource.getrusage(resource.RUSAGE_CHILDREN)  # launcher, torchrun and its ranks
    cpu = ru2.ru_utime + ru2.ru_stime - ru.ru_utime - ru.ru_stime
    RESULTS.setdefault(f"ranks{nproc}", []).append(dt)
    RESULTS.setdefault(f"cpu{nproc}", []).append(cpu)
    return dt


@pytest.mark.benchmark(group="scoring-ranks")
def test_two_ranks_vs_one(benchmark, work, capsys):
    it = iter(range(ROUNDS))

    def pair():
        n = next(it)
        _cli(work, 1, n)
        _cli(work, 2, n)

    benchmark.pedantic(pair, rounds=ROUNDS, iterations=1)
    one = [r.split(",")[:7] for r in (work / "out-1-0" / "scores.csv").read_text().splitlines()]
    two = [r.split(",")[:7] for r in (work / "out-2-0" / "scores.csv").read_text().splitlines()]
    assert one == two
    m1, m2 = statistics.median(RESULTS["ranks1"]), statistics.median(RESULTS["ranks2"])
    c1, c2 = statistics.median(RESULTS["cpu1"]), statistics.median(RESULTS["cpu2"])
    benchmark.extra_info.update({"median_s_1rank": m1, "median_s_2ranks": m2,
                                 "two_over_one": m2 / m1, "cpu_s_1rank": c1,
                                 "cpu_s_2ranks": c2})
    with capsys.disabled():
        print(f"\n[bench_scoring] puzzle-nas score end to end, {os.cpu_count()} cores (load "
              f"average {os.getloadavg()[0]:.1f}): median wall 1 rank {m1:.2f} s, 2 ranks "
              f"{m2:.2f} s -> 2 ranks / 1 rank {m2 / m1:.2f}x; CPU seconds (all processes) "
              f"{c1:.1f} vs {c2:.1f}")


# ---- the parent sharded over ranks (issue 28) --------------------------------------------
BIG = ModelArch(hidden_size=2048, vocab_size=8192, model_type="llama",
                blocks=(Attention(num_heads=32, num_kv_heads=32, head_dim=64),
                        FFN(width=8192)) * 8)
"""A 2.3 GB fp32 parent (570 M parameters, 16 blocks), shaped like an LLM: the embedding and
LM head are 6 % of it (a rank's memory floor is the runtime's ~0.3 GB, so a smaller parent
measures mostly that floor). The teacher target's bytes per held-out token are read from
the runs' ``scores.json`` (``teacher_target_bytes``: the fp32 run at 2 ranks, and one more
2-rank run with ``--dtype bfloat16``) and compared with the float64 probabilities at
vocabulary 32k."""
BIG_SPACE = {"attention": {"noop": True}, "ffn": {"fractions": [0.5]}}
BIG_FLAGS = ["--seq-len", "256", "--max-tokens", "512", "--calib-tokens", "256",
             "--batch-size", "2", "--cache-gib", "8"]
GOALS = {"peak_2_over_1": 0.6, "peak_4_over_1": 0.35, "rate_2_over_1": 1.5,
         "teacher_bf16_less": 50}
"""Issue 28's goals: peak RSS of the largest rank at 2 / 4 ranks over one rank's (at
most), items/s at 2 ranks over one rank's and the float64 probabilities' bytes per
held-out token at vocabulary 32k over a bf16 run's teacher target (at least)."""
ATLEAST = {"rate_2_over_1", "teacher_bf16_less"}  # the others are at most
PEAK = ("import resource, subprocess, sys; r = subprocess.run(sys.argv[1:]); "
        "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024); "
        "sys.exit(r.returncode)")


@pytest.fixture(scope="module")
def big(tmp_path_factory):
    d = tmp_path_factory.mktemp("bench_sharded")
    save_pretrained(build_model(BIG, seed=0), d / "parent")
    rng = np.random.default_rng(0)
    np.save(d / "tokens.npy", rng.integers(0, BIG.vocab_size, 4096, dtype=np.int64))
    (d / "spec.json").write_text(json.dumps({
        "name": "bench-big", "parent": "parent/config.json", "hardware": "h100-sxm",
        "workloads": {"w": {"isl": 128, "osl": 128, "batch": 1}},
        "search_space": BIG_SPACE}))
    return d


def _sharded(d: Path, nproc: int, tag: str, *flags: str) -> dict:
    """One ``score --nproc N`` run (``flags`` added): the largest process's peak RSS (the
    largest rank: the launcher and torchrun are far smaller), wall seconds, and the run's
    record."""
    out = d / f"out-{nproc}-{tag}"
    env = dict(os.environ, OMP_NUM_THREADS="1")
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")])
    cmd = [sys.executable, "-c", PEAK, sys.executable, "-m", "nas", "score",
           str(d / "spec.json"), "--parent", str(d / "parent"), "--data",
           str(d / "tokens.npy"), "-o", str(out), *BIG_FLAGS, *flags, "--nproc", str(nproc),
           "--json"]
    t = time.perf_counter()
    p = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True)
    wall = time.perf_counter() - t
    lines = p.stdout.strip().splitlines()
    rec = json.loads("\n".join(lines[:-1])[p.stdout.index("{"):])
    return {"peak": int(lines[-1]), "wall": wall, "record": rec,
            "csv": (out / "scores.csv").read_text()}


def _teacher_bytes_per_token(rec: dict) -> tuple[float, float]:
    """A run's held-out teacher target, as its record reports it (``teacher_target_bytes``
    of the ranks' prefix caches, :class:`nas.scoring.runner.RunRecord`): bytes in all and
    per held-out token (every position of the held-out rows, as
    ``test_the_teacher_target_is_the_last_hidden_state_not_the_vocabulary`` counts them)."""
    caches = rec["stages"] or [rec["cache"]]
    total = sum(c["teacher_target_bytes"] for c in caches)
    return total, total / (rec["held_rows"] * rec["settings"]["seq_len"])


@pytest.mark.benchmark(group="scoring-sharded")
def test_sharded_memory_and_rate(benchmark, big, capsys):
    """Peak RSS of the largest rank at 1, 2 and 4 ranks (goals: <= 0.6x and <= 0.35x of
    one rank), items per second of the scoring phase at 2 ranks vs 1 (goal >= 1.5x), and
    the teacher target's bytes per held-out token against the old float64 probabilities at
    vocabulary 32k (goal: >= 50x less), read from the records of the fp32 runs and of one
    more run at 2 ranks with ``--dtype bfloat16``. The goals are asserted after the figures
    are printed; the test fails naming each goal missed and the figure measured."""
    runs: dict[int, list[dict]] = {1: [], 2: [], 4: []}
    bf16: list[dict] = []
    it = iter(range(ROUNDS))

    def once():
        n = next(it)
        for nproc in (1, 2, 4):
            runs[nproc].append(_sharded(big, nproc, str(n)))
        bf16.append(_sharded(big, 2, f"bf16-{n}", "--dtype", "bfloat16"))

    benchmark.pedantic(once, rounds=1, iterations=1)
    assert runs[1][0]["csv"].splitlines()[0] == runs[2][0]["csv"].splitlines()[0]
    peak = {n: statistics.median(r["peak"] for r in runs[n]) for n in runs}
    rate = {n: statistics.median(r["record"]["alternatives"] / r["record"]["scoring_seconds"]
                                 for r in runs[n]) for n in runs}
    h, v = BIG.hidden_size, 32000  # the teacher-target bytes at a 32k vocabulary
    old = v * 8 + 16  # float64 probabilities, their row sum and the top-1 token
    # the teacher's last residual stream in the compute dtype, as the runs report it: the
    # fp32 parent at 2 ranks, and the same parent loaded in bf16 (as published parents are)
    assert bf16[0]["record"]["settings"]["dtype"] == "bfloat16"
    total, new = _teacher_bytes_per_token(runs[2][0]["record"])
    total_bf16, new_bf16 = _teacher_bytes_per_token(bf16[0]["record"])
    info = {"peak_bytes": peak, "items_per_s": rate, "peak_2_over_1": peak[2] / peak[1],
            "peak_4_over_1": peak[4] / peak[1], "rate_2_over_1": rate[2] / rate[1],
            "teacher_bytes_per_token_old": old, "teacher_bytes_per_token_new": new,
            "teacher_bytes_per_token_new_bf16": new_bf16,
            "teacher_target_bytes_fp32": total, "teacher_target_bytes_bf16": total_bf16,
            "teacher_fp32_less": old / new, "teacher_bf16_less": old / new_bf16,
            "peak_bytes_2_ranks_bf16": bf16[0]["peak"]}
    benchmark.extra_info.update({k: v for k, v in info.items() if not isinstance(v, dict)})
    with capsys.disabled():
        print(f"\n[bench_scoring] sharded, {BIG.param_counts().total / 1e6:.0f} M parameters "
              f"fp32, {os.cpu_count()} cores (load {os.getloadavg()[0]:.1f}): peak RSS of the "
              f"largest rank 1 rank {peak[1] / 2**20:,.0f} MiB, 2 ranks "
              f"{peak[2] / 2**20:,.0f} MiB ({peak[2] / peak[1]:.2f}x, goal <= 0.6x), 4 ranks "
              f"{peak[4] / 2**20:,.0f} MiB ({peak[4] / peak[1]:.2f}x, goal <= 0.35x); items/s "
              f"1 rank {rate[1]:.3f}, 2 ranks {rate[2]:.3f} ({rate[2] / rate[1]:.2f}x, goal >= "
              f"1.5x); teacher bytes per held-out token at vocabulary 32k {old:,} -> {new:,.0f} "
              f"in fp32 ({old / new:.0f}x less), {new_bf16:,.0f} in bf16 ({old / new_bf16:.0f}x "
              "less; goal >= 50x)")
        print(f"[bench_scoring] teacher target read from the runs' scores.json (hidden {h}): "
              f"fp32 {total / 2**20:,.2f} MiB, bf16 {total_bf16 / 2**20:,.2f} MiB over "
              f"{bf16[0]['record']['held_rows']} held-out rows of "
              f"{bf16[0]['record']['settings']['seq_len']} tokens; the bf16 run at 2 ranks: "
              f"peak RSS of the largest rank {bf16[0]['peak'] / 2**20:,.0f} MiB, items/s "
              f"{bf16[0]['record']['alternatives'] / bf16[0]['record']['scoring_seconds']:.3f}, "
              f"wall {bf16[0]['wall']:.0f} s")
    assert bf16[0]["csv"].splitlines()[0] == runs[1][0]["csv"].splitlines()[0]
    names = {"peak_2_over_1": "peak RSS of the largest rank, 2 ranks / 1 rank",
             "peak_4_over_1": "peak RSS of the largest rank, 4 ranks / 1 rank",
             "rate_2_over_1": "items/s of the scoring phase, 2 ranks / 1 rank",
             "teacher_bf16_less": "float64 probabilities / bf16 teacher target, bytes per "
                                  "held-out token at vocabulary 32k"}
    missed = [f"{names[k]}: goal {'>=' if k in ATLEAST else '<='} {goal}x, measured "
              f"{info[k]:.3f}x" for k, goal in GOALS.items()
              if (info[k] < goal if k in ATLEAST else info[k] > goal)]
    assert not missed, "bench_scoring (sharded) missed its goals: " + "; ".join(missed)
