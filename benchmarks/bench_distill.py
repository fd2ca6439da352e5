"""Distillation benchmark: peak RSS of the largest rank of ``puzzle-nas distill`` at 1, 2
and 4 ranks (issue 28: at most 0.6x and 0.35x of one rank).

One rank holds the whole teacher and student with the student's gradients and AdamW state
(four copies of the student); ``--nproc N`` shards all of it over the ranks with FSDP2
(:mod:`nas.train.distill`), so a rank's share of the weights falls as 1/N over the runtime's own
floor (torch, gloo and the interpreter: about 0.35 GB per process) plus about one block
held whole for the moment (the block being read at the start, the block being computed in
a step).

Parent: a random-init dense Llama-style model (``BENCH_DISTILL_LAYERS`` layers, default 20:
attention 16 x 64 + gated FFN 4096, hidden 1024, vocabulary 4096), 344 M parameters,
1,376 MB in float32. Child: the same with every FFN at half width (218 M parameters,
873 MB). Two steps of 4 rows of 32 tokens, evaluated on 4 held-out rows (the evaluations
of the teacher, the child as given and the result included), one thread per rank.
``glibc``'s mmap threshold is fixed so that freed buffers go back to the system and the
peak measures tensors, not heap fragmentation. Each rank reports its own peak
(``getrusage``) in ``distill.json``.

Measured once (2 shared cores, load 4.9), largest rank: 1 rank 6,010 MiB, 2 ranks 3,273
MiB (0.54x), 4 ranks 1,866 MiB (0.31x); every rank of a run within 2 MiB of the others;
wall 114 / 220 / 155 s. With 8 layers (a 570 MB parent, a 369 MB child) the ratios were
0.60x and 0.39x (2,726 / 1,639 / 1,062 MiB): a rank's floor of about 0.38 GB (torch, gloo,
the interpreter) does not shrink with the ranks, and at that size it is a third of a
4-rank peak. The sharded share itself is close to 1/N: the 4-rank peak is the floor plus
a quarter of the 1-rank weights, gradients, AdamW state and AdamW's temporaries, plus
about 100 MiB (the blocks being gathered).

Measured against ``distill --plan`` (issue 49; the teacher pipelined over the ranks, the
default): the largest rank's peak RSS above its start (the runtime floor left out) is
1.035x / 1.074x / 1.100x the plan's total per rank on 1 / 2 / 4 ranks, and the bytes the
busiest rank sends per training step 1.000x the plan's on 2 and 4 ranks (1,745.8 and
2,618.6 MB); with 8 layers 1.051x / 1.085x / 1.136x and 1.000x. The peaks of that run:
6,106 / 3,438 (0.56x) / 1,965 MiB (0.32x), load 6.9.

The goals are asserted (after the figures are printed): the test fails naming each goal
missed and the ratio measured, and when the final KLs of 2 and 4 ranks differ from one
rank's.

Run: ``pytest benchmarks/bench_distill.py --benchmark-only -s``. Memory is the figure
that matters here; on a shared 2-core machine the seconds are noisy.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from nas.arch import FFN, Attention, ModelArch  # noqa: E402
from nas.child import build_model, save_pretrained  # noqa: E402

BLOCKS = (Attention(num_heads=16, num_kv_heads=16, head_dim=64), FFN(width=4096))
LAYERS = int(os.environ.get("BENCH_DISTILL_LAYERS", "20"))
PARENT = ModelArch(hidden_size=1024, vocab_size=4096, model_type="llama",
                   blocks=BLOCKS * LAYERS)
CHILD = PARENT.replace_blocks((BLOCKS[0], FFN(width=2048)) * LAYERS)
FLAGS = ["--tokens", str(2 * 4 * 32), "--seq-len", "32", "--batch", "4", "--lr", "1e-4",
         "--eval-every", "2", "--eval-tokens", "128", "--checkpoint-every", "100"]
REPO = Path(__file__).resolve().parents[1]
GOALS = {2: 0.6, 4: 0.35}
"""Peak RSS of the largest rank at N ranks over one rank's, at most (issue 28)."""
PLAN_TOLERANCE = 0.2
"""Measured over planned, per run: the largest rank's peak RSS above its start (the
runtime's floor left out) against ``distill --plan``'s total per rank, and the bytes the
busiest rank sends per training step against the plan's (issue 49), within 20 %."""


def _plan(nproc: int):
    from nas.train.plan import distill_plan

    return distill_plan(CHILD, PARENT, world=nproc, replicas=False, batch=4, seq_len=32,
                        tokens=2 * 4 * 32, eval_every=2, eval_tokens=128,
                        teacher_dtype="float32", student_dtype="float32", mixed_precision=None,
                        keep_best=True, lr_sweep=0, sweep_steps=None, checkpointing=False,
                        backend="gloo")


@pytest.fixture(scope="module")
def work(tmp_path_factory):
    d = tmp_path_factory.mktemp("bench_distill")
    save_pretrained(build_model(PARENT, seed=0), d / "parent")
    save_pretrained(build_model(CHILD, seed=1), d / "child")
    rng = np.random.default_rng(0)
    np.save(d / "tokens.npy", rng.integers(0, PARENT.vocab_size, 4096, dtype=np.int64))
    return d


def _run(d: Path, nproc: int) -> dict:
    """One ``distill --nproc N`` run in fresh output: its record and wall seconds."""
    out = d / f"out-{nproc}"
    env = dict(os.environ, OMP_NUM_THREADS="1", MALLOC_MMAP_THRESHOLD_="65536")
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")])
    cmd = [sys.executable, "-m", "nas", "distill", str(d / "child"), "--teacher",
           str(d / "parent"), "--data", str(d / "tokens.npy"), "-o", str(out), *FLAGS,
           "--nproc", str(nproc), "--json"]
    t = time.perf_counter()
    p = subprocess.run(cmd, env=env, capture_output=True, text=True)
    assert p.returncode == 0, p.stderr[-3000:]
    wall = time.perf_counter() - t
    return {"record": json.loads(p.stdout[p.stdout.index("{"):]), "wall": wall}


@pytest.mark.benchmark(group="distill-sharded")
def test_sharded_distill_memory(benchmark, work, capsys):
    """Peak RSS of the largest rank at 1, 2 and 4 ranks (goals, asserted: <= 0.6x and
    <= 0.35x of one rank); the runs agree on the loss curve."""
    runs: dict[int, dict] = {}

    def once():
        for nproc in (1, 2, 4):
            runs[nproc] = _run(work, nproc)

    benchmark.pedantic(once, rounds=1, iterations=1)
    peak = {n: max(r["record"]["peak_rss_mib"]) for n, r in runs.items()}
    kl = {n: r["record"]["final"]["kl_div"] for n, r in runs.items()}
    info = {"peak_mib_1": peak[1], "peak_mib_2": peak[2], "peak_mib_4": peak[4],
            "peak_2_over_1": peak[2] / peak[1], "peak_4_over_1": peak[4] / peak[1],
            **{f"wall_s_{n}": r["wall"] for n, r in runs.items()}}
    benchmark.extra_info.update(info)
    mb = {"parent": PARENT.param_counts().total * 4 / 1e6,
          "child": CHILD.param_counts().total * 4 / 1e6}
    with capsys.disabled():
        print(f"\n[bench_distill] parent {mb['parent']:,.0f} MB, child {mb['child']:,.0f} MB "
              f"fp32, {os.cpu_count()} cores (load {os.getloadavg()[0]:.1f}): peak RSS of the "
              f"largest rank 1 rank {peak[1]:,.0f} MiB, 2 ranks {peak[2]:,.0f} MiB "
              f"({peak[2] / peak[1]:.2f}x, goal <= 0.6x), 4 ranks {peak[4]:,.0f} MiB "
              f"({peak[4] / peak[1]:.2f}x, goal <= 0.35x); per rank "
              + "; ".join(f"{n}: {', '.join(f'{x:,.0f}' for x in r['record']['peak_rss_mib'])}"
                          for n, r in runs.items())
              + "; wall " + ", ".join(f"{r['wall']:.0f} s" for r in runs.values()))
    plan_lines, plan_missed = [], []
    for n, r in runs.items():
        rec, p = r["record"], _plan(n)
        above = max(a - b for a, b in zip(rec["peak_rss_mib"], rec["base_rss_mib"]))
        ratio_m = above * 2**20 / p.total
        line = (f"{n} rank(s): peak above the start {above:,.0f} MiB, plan "
                f"{p.total / 2**20:,.0f} MiB ({ratio_m:.3f}x)")
        info[f"memory_over_plan_{n}"] = ratio_m
        if abs(ratio_m - 1) > PLAN_TOLERANCE:
            plan_missed.append(f"memory at {n} ranks {ratio_m:.3f}x the plan")
        if n > 1:
            sent = max(rec["sent_bytes_per_step"])
            ratio_s = sent / p.sent_per_step
            line += (f"; sent per step {sent / 1e6:,.1f} MB, plan "
                     f"{p.sent_per_step / 1e6:,.1f} MB ({ratio_s:.3f}x)")
            info[f"sent_over_plan_{n}"] = ratio_s
            if abs(ratio_s - 1) > PLAN_TOLERANCE:
                plan_missed.append(f"bytes sent at {n} ranks {ratio_s:.3f}x the plan")
        plan_lines.append(line)
    benchmark.extra_info.update(info)
    with capsys.disabled():
        print("[bench_distill] measured against the plan: " + "; ".join(plan_lines))
    for n in (2, 4):
        assert kl[n] == pytest.approx(kl[1], rel=1e-4), \
            f"final KL on {n} ranks {kl[n]!r} != 1 rank's {kl[1]!r} (rel 1e-4)"
    missed = [f"peak RSS of the largest rank at {n} ranks / 1 rank: goal <= {goal}x, measured "
              f"{peak[n] / peak[1]:.3f}x ({peak[n]:,.0f} / {peak[1]:,.0f} MiB)"
              for n, goal in GOALS.items() if peak[n] / peak[1] > goal]
    missed += plan_missed
    assert not missed, "bench_distill missed its goals: " + "; ".join(missed)
