"""Mamba-1 block: :class:`nas.modules.mamba1.Mamba1Mixer` vs transformers'
``JambaMambaMixer`` on its torch path (no mamba_ssm / causal-conv1d kernels), side by side.

Same weights in both (Jamba's Mamba-1 shape at hidden 1024: expand 2, so 2,048 channels,
state 16, dt rank 64, conv 4), float32, one thread by default. Phases: prefill 1 x 1024 and
4 x 1024 (both sides a sequential scan: ours forms a chunk's decays at once and reads the
chunk's states out in one product), decode (batch 4: one token through each side's cache
after a 512-token prompt). Each round runs both sides back to back, alternating which
goes first; the table gives medians and ``HF / ours`` (> 1: ours faster), after asserting
equal outputs (max |difference| <= 1e-4).

Run: ``pytest benchmarks/bench_mamba1.py --benchmark-only -s``; ``BENCH_ROUNDS`` [5],
``BENCH_THREADS`` [1]. Needs the ``test`` extra (transformers).
"""

from __future__ import annotations

import os
import statistics
import time

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from nas.arch import Mamba1  # noqa: E402
from nas.modules.mamba1 import Mamba1Mixer  # noqa: E402

HIDDEN, EXPAND, STATE, DT_RANK = 1024, 2, 16, 64
ROUNDS = int(os.environ.get("BENCH_ROUNDS", "5"))
PHASES = {"prefill-1x1024": (1, 1024), "prefill-4x1024": (4, 1024), "decode-4@512": (4, 512)}
RESULTS: list[dict] = []


def _pair():
    from transformers.models.jamba.modeling_jamba import JambaMambaMixer

    cfg = transformers.JambaConfig(
        hidden_size=HIDDEN, num_hidden_layers=1, attn_layer_period=2, attn_layer_offset=1,
        expert_layer_period=2, expert_layer_offset=1, num_experts=1, mamba_expand=EXPAND,
        mamba_d_state=STATE, mamba_dt_rank=DT_RANK, mamba_d_conv=4)
    torch.manual_seed(0)
    hf = JambaMambaMixer(cfg, 0).eval()
    ours = Mamba1Mixer(Mamba1(inner_size=EXPAND * HIDDEN, state_size=STATE, dt_rank=DT_RANK),
                       HIDDEN, cfg.rms_norm_eps).eval()
    with torch.no_grad():
        for p in hf.parameters():
            p.copy_(torch.randn_like(p) * (p.shape[-1] ** -0.5 if p.dim() > 1 else 0.5))
        ours.load_state_dict(hf.state_dict())
    return hf, ours, cfg


def _timed(fn) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


@torch.no_grad()
def run_case(phase: str) -> dict:
    from transformers import DynamicCache

    hf, ours, cfg = _pair()
    b, n = PHASES[phase]
    g = torch.Generator().manual_seed(1)
    x = torch.randn(b, n, HIDDEN, generator=g)
    if phase.startswith("prefill"):
        def run_hf():
            return hf(x)

        def run_ours():
            return ours(x)
    else:
        step = torch.randn(b, 1, HIDDEN, generator=g)
        hf_cache = DynamicCache(config=cfg)
        hf(x, cache=hf_cache)
        our_cache: dict = {}
        ours(x, our_cache)
        saved = {k: v.clone() for k, v in our_cache.items()}

        def run_hf():
            return hf(step, cache=hf_cache)

        def run_ours():
            our_cache.update({k: v.clone() for k, v in saved.items()})
            return ours(step, our_cache)
    diff = float((run_hf() - run_ours()).abs().max()) if phase.startswith("prefill") else None
    if diff is not None:
        assert diff <= 1e-4, diff
    t_hf, t_ours = [], []
    for r in range(ROUNDS):
        first, second = (run_hf, run_ours) if r % 2 else (run_ours, run_hf)
        a, c = _timed(first), _timed(second)
        (t_hf if first is run_hf else t_ours).append(a)
        (t_ours if first is run_hf else t_hf).append(c)
    row = {"phase": phase, "hf_s": statistics.median(t_hf), "ours_s": statistics.median(t_ours),
           "max_abs_diff": diff}
    row["speedup"] = row["hf_s"] / row["ours_s"]
    RESULTS.append(row)
    return row


@pytest.fixture(scope="module", autouse=True)
def _threads():
    old = torch.get_num_threads()
    torch.set_num_threads(int(os.environ.get("BENCH_THREADS", "1")))
    yield
    torch.set_num_threads(old)
    for r in RESULTS:
        print(f"\n[bench_mamba1] {r['phase']}: ours {1e3 * r['ours_s']:.1f} ms, HF "
              f"{1e3 * r['hf_s']:.1f} ms, HF/ours {r['speedup']:.2f}x")


@pytest.mark.parametrize("phase", list(PHASES))
def test_mamba1_vs_transformers(benchmark, phase):
    row = benchmark.pedantic(run_case, args=(phase,), rounds=1, iterations=1)
    benchmark.extra_info.update(row)
