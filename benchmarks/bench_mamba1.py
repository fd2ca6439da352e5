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

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import mixer_pair  # noqa: E402

from nas.arch import Mamba1  # noqa: E402
from nas.modules.mamba1 import Mamba1Mixer  # noqa: E402

HIDDEN, EXPAND, STATE, DT_RANK = 1024, 2, 16, 64
PHASES = mixer_pair.PHASES
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
    mixer_pair.copy_random(hf, ours)
    return hf, ours, cfg


def run_case(phase: str) -> dict:
    row = mixer_pair.run_case(_pair, HIDDEN, phase)
    RESULTS.append(row)
    return row


@pytest.fixture(scope="module", autouse=True)
def _threads():
    yield from mixer_pair.threads_fixture("bench_mamba1", RESULTS)


@pytest.mark.parametrize("phase", list(PHASES))
def test_mamba1_vs_transformers(benchmark, phase):
    row = benchmark.pedantic(run_case, args=(phase,), rounds=1, iterations=1)
    benchmark.extra_info.update(row)
