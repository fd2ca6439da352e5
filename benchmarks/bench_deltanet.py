"""Gated DeltaNet block: :class:`nas.modules.DeltaNetMixer` vs transformers'
``Qwen3NextGatedDeltaNet`` on its torch path (no fla / causal-conv1d kernels), side by side.

Same weights in both (Qwen3-Next-80B's DeltaNet shape at hidden 1024: 16 key heads and 32
value heads of 128), float32, one thread by default. Phases: prefill 1 x 1024 and 4 x 1024
(chunked form, chunk 64 on both sides), decode (batch 4: one token through each side's
cache after a 512-token prompt). Each round runs both sides back to back, alternating which
goes first; the table gives medians and ``HF / ours`` (> 1: ours faster), after asserting
equal outputs (max |difference| <= 1e-4).

Run: ``pytest benchmarks/bench_deltanet.py --benchmark-only -s``; ``BENCH_ROUNDS`` [5],
``BENCH_THREADS`` [1]. Needs the ``test`` extra (transformers).
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import mixer_pair  # noqa: E402

from nas.arch import DeltaNet  # noqa: E402
from nas.modules import DeltaNetMixer  # noqa: E402

HIDDEN, NK, NV, DK, DV = 1024, 16, 32, 128, 128
PHASES = mixer_pair.PHASES
RESULTS: list[dict] = []


def _pair():
    from transformers.models.qwen3_next.modeling_qwen3_next import Qwen3NextGatedDeltaNet

    cfg = transformers.Qwen3NextConfig(
        hidden_size=HIDDEN, num_hidden_layers=1, layer_types=["linear_attention"],
        linear_num_key_heads=NK, linear_num_value_heads=NV, linear_key_head_dim=DK,
        linear_value_head_dim=DV, linear_conv_kernel_dim=4, num_experts=0)
    torch.manual_seed(0)
    hf = Qwen3NextGatedDeltaNet(cfg, 0).eval()
    ours = DeltaNetMixer(DeltaNet(num_k_heads=NK, num_v_heads=NV, head_k_dim=DK, head_v_dim=DV),
                         HIDDEN, cfg.rms_norm_eps).eval()
    mixer_pair.copy_random(hf, ours)
    return hf, ours, cfg


def run_case(phase: str) -> dict:
    row = mixer_pair.run_case(_pair, HIDDEN, phase)
    RESULTS.append(row)
    return row


@pytest.fixture(scope="module", autouse=True)
def _threads():
    yield from mixer_pair.threads_fixture("bench_deltanet", RESULTS)


@pytest.mark.parametrize("phase", list(PHASES))
def test_deltanet_vs_transformers(benchmark, phase):
    row = benchmark.pedantic(run_case, args=(phase,), rounds=1, iterations=1)
    benchmark.extra_info.update(row)
