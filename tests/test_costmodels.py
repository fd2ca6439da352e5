"""Block and model pricing: regimes on H100, additivity, parallelism, monotonicity, NoOp."""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import hwprofiles
from costmodels.blocks import price_blocks
from costmodels.dtypes import DType, PrecisionRecipe, TensorRole, get_recipe
from costmodels.model import (
    NonBlockShape,
    max_concurrency,
    price_model,
    price_nonblock,
    summarize,
)
from costmodels.shapes import BlockTable, Kind, params
from hwprofiles.errors import InputError
from hwprofiles.schema import HardwareProfile


def _roofline_only(hw: HardwareProfile) -> HardwareProfile:
    """The shipped profile's peaks and efficiencies with FACTS.md's ~3 us per kernel; the
    regime tests below price with no host overheads (:data:`NO_HOST`): they are about the
    roofline."""
    data = json.loads(hw.model_dump_json())
    data["kernel_overhead_s"] = {"value": 3e-6, "source": "FACTS.md s4, for these tests"}
    return HardwareProfile.model_validate(data)


H100 = _roofline_only(hwprofiles.get("h100-sxm"))
NO_HOST = dict(step_overhead_s=0.0, request_overhead_s=0.0)
BF16 = get_recipe("bf16")

# Llama-3.1-8B shapes (configs/llama-3.1-8b.json), built without nas
ATT8B = dict(kind=Kind.ATTENTION, hidden=4096, n_heads=32, n_kv_heads=8, head_dim=128)
FFN8B = dict(kind=Kind.FFN, hidden=4096, ffn_width=14336, gated=1)
LLAMA8B = BlockTable.from_rows([ATT8B, FFN8B] * 32)
LLAMA8B_NB = NonBlockShape(hidden=4096, vocab=128256, tied=False)

# Nemotron-3-Super-like rows (FACTS.md §2)
MAMBA = dict(kind=Kind.MAMBA, hidden=4096, m_heads=128, m_head_dim=64, state=128, groups=8,
             conv_kernel=4, conv_bias=1)
MOE = dict(kind=Kind.MOE, hidden=4096, experts=512, top_k=22, expert_width=2688,
           shared_width=5376, latent=1024, router_bias=1)
ATT_SUPER = dict(kind=Kind.ATTENTION, hidden=4096, n_heads=32, n_kv_heads=2, head_dim=128)


def scaled(hw: HardwareProfile, flops: float = 1.0, bw: float = 1.0) -> HardwareProfile:
    data = json.loads(hw.model_dump_json())
    for f in data["peak_flops"].values():
        f["value"] *= flops
    data["memory_bandwidth"]["value"] *= bw
    return HardwareProfile.model_validate(data)


def ttft_tpot(hw, wl, table=LLAMA8B, recipe=BF16):
    m = price_model(table, LLAMA8B_NB, hw, recipe, [wl], **NO_HOST)
    return m.ttft_s[0], m.tpot_s[0], m


def test_llama8b_weights_match_exact_param_count():
    m = price_model(LLAMA8B, LLAMA8B_NB, H100, BF16, ["isl=1,osl=2,batch=1"], **NO_HOST)
    assert int(params(LLAMA8B).sum()) + 2 * 4096 * 128256 + 4096 == 8_030_261_248
    assert m.weight_bytes == 2 * 8_030_261_248


def test_8b_decode_batch1_is_memory_bound_on_h100():
    wl = "isl=1024,osl=256,batch=1"
    _, tpot, m = ttft_tpot(H100, wl)
    floor = m.weight_bytes / (H100.memory_bandwidth.value * H100.efficiency.memory.peak_fraction)
    assert floor <= tpot <= 1.25 * floor  # streaming the weights is nearly all of it
    # more FLOP/s changes nothing; more bandwidth makes it faster
    assert ttft_tpot(scaled(H100, flops=2.0), wl)[1] == pytest.approx(tpot, rel=1e-9)
    assert ttft_tpot(scaled(H100, bw=2.0), wl)[1] < 0.6 * tpot


def test_8k_prefill_is_compute_bound_on_h100():
    wl = "isl=8192,osl=1,batch=1"
    ttft, _, _ = ttft_tpot(H100, wl)
    gemm_flops = 2 * 8192 * (8_030_261_248 - 2 * 4096 * 128256)  # all block weights
    floor = gemm_flops / (H100.peak("bf16") * H100.matmul_fraction("bf16"))
    assert floor <= ttft <= 1.5 * floor
    # a few % of prefill is memory-bound elementwise work (norms, activations)
    assert ttft_tpot(scaled(H100, bw=2.0), wl)[0] == pytest.approx(ttft, rel=0.05)
    assert ttft_tpot(scaled(H100, flops=2.0), wl)[0] < 0.6 * ttft


def test_nvfp4_on_hopper_saves_bytes_not_math():
    rows = BlockTable.from_rows([MOE])
    fp8 = PrecisionRecipe(weights={TensorRole.ROUTED_EXPERTS: DType.FP8})
    fp4 = PrecisionRecipe(weights={TensorRole.ROUTED_EXPERTS: DType.NVFP4})
    wls = ["isl=8192,osl=64,batch=8", "isl=512,osl=64,batch=1"]
    h8, h4 = (price_blocks(rows, H100, r, wls) for r in (fp8, fp4))
    assert h4.weight_bytes[0] == pytest.approx(h8.weight_bytes[0] - 0.4375 * 512 * 2 * 1024 * 2688)
    assert h4.prefill_s[0, 0] == pytest.approx(h8.prefill_s[0, 0], rel=1e-3)  # compute-bound
    # decode at batch 1 streams the weights of exactly top_k = 22 experts, at the grouped-GEMM
    # decode fraction of bandwidth: the saving is those bytes (1 - 0.5625 per parameter)
    saved = 22 * 2 * 1024 * 2688 * (1 - 0.5625)
    rate = H100.memory_bandwidth.value * H100.efficiency.grouped_matmul_decode.peak_fraction
    assert h8.decode_s[0, 1] - h4.decode_s[0, 1] == pytest.approx(saved / rate)
    b200 = hwprofiles.get("b200")
    routed = BlockTable.from_rows([dict(MOE, shared_width=0, latent=0)])  # the experts only
    b8, b4 = (price_blocks(routed, b200, r, wls) for r in (fp8, fp4))
    assert b4.prefill_s[0, 0] < 0.9 * b8.prefill_s[0, 0]  # FP4 math on Blackwell


def test_rows_priced_together_equal_rows_priced_alone():
    rows = [ATT8B, FFN8B, MAMBA, MOE, ATT_SUPER, dict(kind=Kind.LINEAR, hidden=4096),
            dict(kind=Kind.NOOP, hidden=4096), dict(ATT8B, window=1024)]
    wls = ["isl=4096,osl=512,batch=16", "isl=128,osl=128,concurrency=64"]
    for tp, ep in ((1, 1), (4, 1), (4, 4)):
        all_ = price_blocks(BlockTable.from_rows(rows), H100, get_recipe("nvfp4"), wls, tp, ep)
        for i, r in enumerate(rows):
            one = price_blocks(BlockTable.from_rows([r]), H100, get_recipe("nvfp4"), wls, tp, ep)
            for name in ("prefill_s", "decode_s", "runtime_s", "memory_bytes", "weight_bytes"):
                np.testing.assert_allclose(getattr(all_, name)[i], getattr(one, name)[0])


def test_model_figures_are_block_sums_plus_nonblock():
    wls = ["isl=2048,osl=256,batch=8", "isl=2048,osl=256,concurrency=8"]
    b = price_blocks(LLAMA8B, H100, BF16, wls)
    nb = price_nonblock(LLAMA8B_NB, H100, BF16, wls, **NO_HOST)
    m = summarize(b, nb, H100)
    np.testing.assert_allclose(m.ttft_s, b.prefill_s.sum(0) + nb.prefill_s)
    np.testing.assert_allclose(m.tpot_s, b.decode_s.sum(0) + nb.decode_s)
    np.testing.assert_allclose(m.runtime_s, b.runtime_s.sum(0) + nb.runtime_s)
    B, osl = np.array([8, 8]), 256
    # throughput per GPU = B * osl / runtime: the linear runtime bound of the search
    np.testing.assert_allclose(m.throughput_tok_s * m.runtime_s, B * osl)
    np.testing.assert_allclose(m.per_user_tok_s, 1 / m.tpot_s)
    assert m.throughput_node_tok_s[0] == pytest.approx(8 * m.throughput_tok_s[0])
    # batch mode prefills once for all 8; chunked prefill spreads the 8 x 2048 prompt tokens
    # over two 8192-token steps, each shared with the other group's decodes
    np.testing.assert_allclose(m.runtime_s, m.ttft_s + 255 * m.tpot_s)
    np.testing.assert_allclose(m.latency_s, m.runtime_s)
    assert m.ttft_s[1] < m.ttft_s[0] and m.tpot_s[1] > m.tpot_s[0]
    # memory: weights + B * (ctx * kv/token) + workspace + reserve
    kv_tok = 32 * 2 * 8 * 128 * 2
    assert m.kv_bytes[0] == 8 * 2304 * kv_tok
    assert m.memory_bytes[0] == pytest.approx(
        m.weight_bytes + m.kv_bytes[0] + m.workspace_bytes[0] + m.reserve_bytes)
    sub = summarize(b, nb, H100, rows=np.arange(0, 64, 2))  # attention blocks only
    assert sub.weight_bytes < m.weight_bytes and sub.kv_bytes[0] == m.kv_bytes[0]


def test_max_concurrency_closed_form():
    b = price_blocks(LLAMA8B, H100, BF16, ["isl=1,osl=1,batch=1"])
    nb = price_nonblock(LLAMA8B_NB, H100, BF16, ["isl=1,osl=1,batch=1"], **NO_HOST)
    c = max_concurrency(b, nb, H100, 131072, reserve_bytes=2**30)
    per_seq = 131072 * 32 * 2 * 8 * 128 * 2  # 16 GiB of KV per 128K-token sequence
    assert c.kv_bytes_per_sequence == per_seq
    expected = int((H100.memory_bytes.value - 2 * 8_030_261_248 - c.workspace_bytes - 2**30)
                   // per_seq)
    assert c.max_concurrency == expected == 3
    assert max_concurrency(b, nb, scaled(H100), 131072, reserve_bytes=70e9).max_concurrency == 0
    with pytest.raises(InputError):
        max_concurrency(b, nb, H100, 0)


def test_sliding_window_caps_kv_and_time():
    rows = BlockTable.from_rows([ATT8B, dict(ATT8B, window=4096)])
    b = price_blocks(rows, H100, BF16, ["isl=65536,osl=128,batch=4"])
    assert b.kv_bytes(65536)[1] == b.kv_bytes(4096)[0]
    assert b.decode_s[1, 0] < b.decode_s[0, 0] and b.prefill_s[1, 0] < b.prefill_s[0, 0]
    assert b.memory_bytes[1, 0] < b.memory_bytes[0, 0]


def test_tensor_parallel_shards_and_adds_allreduce():
    wl = ["isl=2048,osl=128,batch=8"]
    one = price_blocks(LLAMA8B, H100, BF16, wl, tp=1)
    two = price_blocks(LLAMA8B, H100, BF16, wl, tp=2)
    assert two.weight_bytes.sum() == pytest.approx(one.weight_bytes.sum() / 2, rel=1e-3)
    # more GPUs: faster per step, but each step pays an all-reduce per block
    assert one.decode_s.sum() / 2 < two.decode_s.sum() < one.decode_s.sum()
    # 2 KV heads over 8 GPUs: one head per GPU (replicated), not 1/4
    kv = price_blocks(BlockTable.from_rows([ATT_SUPER]), H100, BF16, wl, tp=8)
    assert kv.kv_bytes_per_token[0] == 2 * 1 * 128 * 2
    moe = BlockTable.from_rows([MOE])
    tp8 = price_blocks(moe, H100, BF16, wl, tp=8, ep=1)
    ep8 = price_blocks(moe, H100, BF16, wl, tp=8, ep=8)
    assert ep8.weight_bytes[0] == pytest.approx(tp8.weight_bytes[0], rel=1e-3)
    with pytest.raises(InputError):
        price_blocks(moe, H100, BF16, wl, tp=8, ep=2)
    with pytest.raises(InputError):
        price_blocks(moe, H100, BF16, wl, tp=0)


@pytest.mark.parametrize("tp", [1, 4])
def test_noop_costs_nothing(tp):
    noop = BlockTable.from_rows([dict(kind=Kind.NOOP, hidden=4096)])
    b = price_blocks(noop, H100, get_recipe("nvfp4"),
                     ["isl=8192,osl=1024,batch=64", "isl=1,osl=2,concurrency=3"], tp=tp)
    for name in ("prefill_s", "decode_s", "runtime_s", "memory_bytes", "weight_bytes",
                 "kv_bytes_per_token", "state_bytes_per_sequence", "workspace_bytes_per_token"):
        assert not np.any(getattr(b, name)), name


def test_every_shipped_profile_prices_super_rows():
    rows = BlockTable.from_rows([MAMBA, MOE, ATT_SUPER])
    for name in hwprofiles.available():
        b = price_blocks(rows, hwprofiles.get(name), get_recipe("nvfp4"),
                         ["isl=8192,osl=1024,batch=8"])
        assert np.all(np.isfinite(b.runtime_s)) and np.all(b.runtime_s > 0), name


# ---- monotonicity (hypothesis): a smaller alternative never costs more --------------------

_WL = st.builds(lambda i, o, b, conc: f"isl={i},osl={o},{'concurrency' if conc else 'batch'}={b}",
                st.integers(1, 20000), st.integers(1, 4000), st.integers(1, 256), st.booleans())
_HW = st.sampled_from(["h100-sxm", "b200", "a100-sxm-80gb", "mi355x", "l40s"])
_RECIPE = st.sampled_from(["bf16", "fp8", "nvfp4"])
_TP = st.sampled_from([1, 2, 8])


def _leq(small, big):
    for name in ("prefill_s", "decode_s", "runtime_s", "memory_bytes", "weight_bytes",
                 "kv_bytes_per_token", "state_bytes_per_sequence", "workspace_bytes_per_token"):
        s, b = getattr(small, name)[0], getattr(big, name)[0]
        assert np.all(s <= b * (1 + 1e-12) + 1e-18), (name, s, b)


def _check(base: dict, smaller: dict, hw, recipe, wl, tp, ep=1):
    kw = dict(hw=hwprofiles.get(hw), recipe=get_recipe(recipe), workloads=[wl], tp=tp, ep=ep)
    _leq(price_blocks(BlockTable.from_rows([smaller]), **kw),
         price_blocks(BlockTable.from_rows([base]), **kw))


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 16), st.integers(1, 16), st.sampled_from([0, 512, 8192]), _WL, _HW,
       _RECIPE, _TP)
def test_fewer_kv_heads_never_cost_more(kv_a, kv_b, window, wl, hw, recipe, tp):
    lo, hi = sorted((kv_a, kv_b))
    base = dict(kind=Kind.ATTENTION, hidden=4096, n_heads=32, head_dim=128, window=window)
    _check(dict(base, n_kv_heads=hi), dict(base, n_kv_heads=lo), hw, recipe, wl, tp)


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 30000), st.integers(1, 30000), st.integers(0, 1), _WL, _HW, _RECIPE, _TP)
def test_narrower_ffn_never_costs_more(fa, fb, gated, wl, hw, recipe, tp):
    lo, hi = sorted((fa, fb))
    base = dict(kind=Kind.FFN, hidden=4096, gated=gated)
    _check(dict(base, ffn_width=hi), dict(base, ffn_width=lo), hw, recipe, wl, tp)


@settings(max_examples=60, deadline=None)
@given(st.integers(64, 4096), st.integers(64, 4096), st.integers(1, 22), st.integers(1, 22),
       st.sampled_from([0, 1024]), _WL, _HW, _RECIPE, _TP, st.booleans())
def test_narrower_experts_or_lower_topk_never_cost_more(wa, wb, ka, kb, latent, wl, hw, recipe,
                                                        tp, use_ep):
    base = dict(MOE, latent=latent)
    ep = tp if use_ep else 1
    (wlo, whi), (klo, khi) = sorted((wa, wb)), sorted((ka, kb))
    _check(dict(base, expert_width=whi, top_k=khi), dict(base, expert_width=wlo, top_k=khi),
           hw, recipe, wl, tp, ep)
    _check(dict(base, expert_width=whi, top_k=khi), dict(base, expert_width=whi, top_k=klo),
           hw, recipe, wl, tp, ep)


@settings(max_examples=60, deadline=None)
@given(st.integers(8, 256), st.integers(8, 256), _WL, _HW, _RECIPE, _TP)
def test_smaller_ssm_state_never_costs_more(sa, sb, wl, hw, recipe, tp):
    lo, hi = sorted((sa, sb))
    _check(dict(MAMBA, state=hi), dict(MAMBA, state=lo), hw, recipe, wl, tp)


def test_measured_efficiency_curves_are_used():
    data = json.loads(H100.model_dump_json())
    # a measured-style curve: small transfers reach 20 % of bandwidth, large ones the
    # profile's fraction
    top = H100.efficiency.memory.peak_fraction
    data["efficiency"]["memory"] = {"points": [[1e5, 0.2], [1e9, top]], "source": "measured on test"}
    curved = HardwareProfile.model_validate(data)
    wls = ["isl=1,osl=2,batch=1"]
    flat = price_blocks(LLAMA8B, H100, BF16, wls)
    meas = price_blocks(LLAMA8B, curved, BF16, wls)
    assert np.all(meas.decode_s >= flat.decode_s) and meas.decode_s.sum() > flat.decode_s.sum()
    # the big weight streams (29-74 MB) sit high on the curve: the slowdown is modest (the
    # fraction there is 0.2 * (top / 0.2) ** (log(size / 1e5) / log(1e4)), a power law)
    assert meas.decode_s.sum() < 1.25 * flat.decode_s.sum()


def _without(hw: HardwareProfile, *keys: str) -> HardwareProfile:
    data = json.loads(hw.model_dump_json())
    for k in keys:
        data["efficiency"][k] = None
    return HardwareProfile.model_validate(data)


def test_expert_width_enters_grouped_gemm_efficiency():
    """The shipped H100 profile prices the routed experts' grouped GEMMs with DeepGEMM's
    reduction-length curve g(K): at equal routed FLOPs and equal tokens per expert, experts
    half as wide (a down GEMM of half the K) take longer in compute-bound prefill, by
    exactly the FLOP-weighted ``1/g`` of the up GEMM (K = hidden) and the down GEMM
    (K = expert width)."""
    g = H100.efficiency.grouped_matmul_k
    assert g is not None and H100.efficiency.grouped_matmul_tokens is not None
    narrow = dict(kind=Kind.MOE, hidden=4096, experts=128, top_k=8, expert_width=1024)
    wide = dict(narrow, experts=64, top_k=4, expert_width=2048)  # same FLOPs, same M
    rows = BlockTable.from_rows([narrow, wide])
    wls = ["isl=8192,osl=2,batch=8"]  # 4096 routed tokens per expert: compute-bound
    with_k = price_blocks(rows, H100, BF16, wls).prefill_s[:, 0]
    no_k = price_blocks(rows, _without(H100, "grouped_matmul_k"), BF16, wls).prefill_s[:, 0]
    kinv = [(1 / g.at(4096.0) + 1 / g.at(float(f))) / 2 for f in (1024, 2048)]  # relu2: 2 mats
    extra = with_k - no_k  # = expert compute time * (kinv - 1), the same compute time for both
    assert extra[0] > extra[1] > 0
    assert extra[0] / extra[1] == pytest.approx((kinv[0] - 1) / (kinv[1] - 1), rel=1e-9)
    assert with_k[0] > with_k[1]


def test_grouped_gemm_tokens_curve_prices_few_tokens_per_expert_lower():
    """Routed tokens per expert set the grouped GEMM's compute fraction (the shipped
    token-tile curve ``peak * M / (ceil(M / t) * t + 91 * t / 128)``, DeepGEMM's fit at
    M >= 128): the same routed FLOPs spread over 4x more experts (4x fewer tokens each)
    run at that curve's lower fraction."""
    c = H100.efficiency.grouped_matmul_tokens
    few = dict(kind=Kind.MOE, hidden=4096, experts=512, top_k=8, expert_width=2048)
    many = dict(few, experts=128)
    rows = BlockTable.from_rows([few, many])
    wls = ["isl=8192,osl=2,batch=4"]  # 512 vs 2048 routed tokens per expert
    hw = _without(H100, "grouped_matmul_k")
    flat = _without(hw, "grouped_matmul_tokens")
    t = price_blocks(rows, hw, BF16, wls).prefill_s[:, 0]
    t0 = price_blocks(rows, flat, BF16, wls).prefill_s[:, 0]
    assert t[0] > t[1]
    # the expert compute time scales with 1 / fraction: the difference of the two rows'
    # extra time over a flat curve at fraction f0 is that ratio
    f0 = H100.efficiency.grouped_matmul_prefill.peak_fraction
    m = 32768 * 8 / np.array([512.0, 128.0])
    extra = t - t0
    assert extra[0] / extra[1] == pytest.approx((1 / c.at(m[0]) - 1 / f0)
                                                / (1 / c.at(m[1]) - 1 / f0), rel=1e-6)


def test_grouped_gemm_tokens_count_only_the_experts_that_receive_any():
    """A decode step of B tokens routes ``B * k`` copies to the ``E_t = E(1 - (1 - k/E)^B)``
    experts expected to receive any; each pads its own rows, so the grouped GEMM runs at the
    tokens curve's fraction at ``M = B * k / E_t`` (not ``B * k / E``). With memory made
    nearly free the expert GEMMs are compute-bound and their time reveals that fraction."""
    from costmodels.ops import ACT_FLOPS_PLAIN, expected_experts

    row = dict(kind=Kind.MOE, hidden=1024, experts=64, top_k=8, expert_width=512)
    rows = BlockTable.from_rows([row])
    fast = scaled(_without(H100, "grouped_matmul_k"), bw=1e4)
    data = json.loads(fast.model_dump_json())
    c = fast.efficiency.grouped_matmul_tokens
    data["efficiency"]["grouped_matmul_tokens"]["points"] = [[s, f / 2] for s, f in c.points]
    half = HardwareProfile.model_validate(data)
    B, k, E = 4, 8, 64
    wls = [f"isl=1,osl=3,batch={B}"]
    d1, d2 = (price_blocks(rows, hw, BF16, wls).decode_s[0, 0] for hw in (fast, half))
    flops = B * k * (2 * 2 * 1024 * 512 + ACT_FLOPS_PLAIN * 512)  # relu2: up and down
    m = B * k / float(expected_experts(E, k, B))
    assert 1.1 < m < 1.3 and B * k / E < 1  # the two counts differ here
    # halving the curve doubles the expert time: the difference is that time at curve(m)
    # (in BF16: the curve's FP8 fraction times the BF16-to-FP8 dense GEMM ratio)
    mm = fast.efficiency.matmul
    scale = mm["bf16"].peak_fraction / mm["fp8"].peak_fraction
    assert d2 - d1 == pytest.approx(flops / (fast.peak("bf16") * float(c.at(m)) * scale),
                                    rel=1e-6)


# -- serving engines: overheads belong to the engine, overlap scheduling ----------------------

def _engine(name: str, step: float, req: float, overlap: bool):
    from hwprofiles.schema import EngineProfile

    fig = {"source": "test figure"}
    return EngineProfile(name=name, display_name=name, step_overhead_s={"value": step, **fig},
                         request_overhead_s={"value": req, **fig}, overlap=overlap,
                         overlap_source="test engine")


def _served(engine, wl, hw=H100, overlap=None):
    wls = [wl]
    b = price_blocks(LLAMA8B, hw, BF16, wls)
    nb = price_nonblock(LLAMA8B_NB, hw, BF16, wls, engine=engine.name,
                        engines={engine.name: engine}, overlap=overlap)
    return summarize(b, nb, hw)


def test_engine_step_overhead_is_added_or_hidden_behind_the_gpu_step():
    wl = "isl=512,osl=128,concurrency=1"
    gpu = _served(_engine("e", 0.0, 0.0, False), wl)
    g = float(gpu.tpot_s[0])  # one decode step's GPU time (c=1: a TPOT is one step)
    small, big = 0.25 * g, 3.0 * g
    for so, hidden in ((small, True), (big, False)):
        add = _served(_engine("e", so, 2e-3, False), wl)
        ovl = _served(_engine("e", so, 2e-3, True), wl)
        # additive engine: every step pays g + so
        assert add.tpot_s[0] == pytest.approx(g + so, rel=1e-9)
        # overlapping engine: a step takes max(g, so); the request overhead is never hidden
        assert ovl.tpot_s[0] == pytest.approx(max(g, so), rel=1e-9)
        assert ovl.ttft_s[0] == pytest.approx(max(float(gpu.ttft_s[0]), so) + 2e-3, rel=1e-9)
        assert bool(ovl.tpot_s[0] == pytest.approx(g, rel=1e-9)) == hidden
        # the serving identities hold either way
        for m in (add, ovl):
            np.testing.assert_allclose(m.latency_s, m.ttft_s + 127 * m.tpot_s)
            np.testing.assert_allclose(m.latency_s, m.runtime_s)
            np.testing.assert_allclose(m.throughput_tok_s * m.runtime_s, 128)
    # overlap=False keeps the additive (linear) model the search uses
    forced = _served(_engine("e", big, 2e-3, True), wl, overlap=False)
    assert forced.tpot_s[0] == pytest.approx(g + big, rel=1e-9)


@pytest.mark.parametrize("wl", ["isl=2048,osl=256,concurrency=8",
                                "isl=8000,osl=64,concurrency=32",
                                "isl=128,osl=1,concurrency=4"])
def test_overlap_never_slower_than_additive_nor_faster_than_the_gpu(wl):
    gpu = _served(_engine("e", 0.0, 1e-3, False), wl)
    add = _served(_engine("e", 4e-3, 1e-3, False), wl)
    ovl = _served(_engine("e", 4e-3, 1e-3, True), wl)
    for k in ("ttft_s", "tpot_s", "runtime_s"):
        a, o, g = getattr(add, k), getattr(ovl, k), getattr(gpu, k)
        assert np.all(g <= o + 1e-12) and np.all(o <= a + 1e-12), k


def test_engine_figures_come_from_the_engine_profiles():
    from costmodels.model import engine_figures
    from hwprofiles.engines import DEFAULT_ENGINE, available_engines, get_engine

    assert {"trtllm", "vllm", "sglang"} <= set(available_engines())
    assert get_engine("trtllm-0.17").name == get_engine("nim-trtllm").name  # aliases
    sg = get_engine("sglang")
    # a named engine: its profile's figures, the same on every device
    assert engine_figures(H100, "sglang") == (sg.step_overhead_s.value,
                                              sg.request_overhead_s.value, sg.overlap)
    assert engine_figures(hwprofiles.get("b200"), "SGLang")[:2] == engine_figures(H100,
                                                                               "sglang")[:2]
    # none named: the default engine's profile
    d = get_engine(DEFAULT_ENGINE)
    assert engine_figures(H100, None) == (d.step_overhead_s.value, d.request_overhead_s.value,
                                          d.overlaps(None))
    # engines passed in win over the shipped ones
    mine = _engine("sglang", 1e-3, 5e-3, False)
    assert engine_figures(H100, "sglang", {"sglang": mine}) == (1e-3, 5e-3, False)
    own = _engine("myengine", 2e-3, 4e-3, True)
    assert engine_figures(H100, "myengine", {"myengine": own}) == (2e-3, 4e-3, True)
    with pytest.raises(InputError, match="unknown serving engine 'no-such-engine'"):
        engine_figures(H100, "no-such-engine")


OLD_LAYOUT = {  # the older per-device layout of host overheads, one key at a time
    "step_overhead_s": {"value": 7e-3, "source": "older per-device layout"},
    "request_overhead_s": {"value": 1e-3, "source": "older per-device layout"},
    "engines": {"sglang": {"step_overhead_s": {"value": 9e-3, "source": "old"}}},
}


@pytest.mark.parametrize("key", sorted(OLD_LAYOUT))
def test_a_device_profile_with_its_own_host_overheads_is_refused(tmp_path, capsys, key):
    from pydantic import ValidationError

    from nas.cli import main

    data = json.loads(hwprofiles.get("h100-sxm").model_dump_json())
    data[key] = OLD_LAYOUT[key]
    with pytest.raises(ValidationError, match=f"{key} is no longer a device-profile field"):
        HardwareProfile.model_validate(data)
    f = tmp_path / "old.json"
    f.write_text(json.dumps(data))
    with pytest.raises(InputError) as exc:  # the public loader: one line, the file named
        hwprofiles.load(f)
    msg = str(exc.value)
    assert "\n" not in msg and str(f) in msg and key in msg
    assert "engine profile" in msg and "hwprofiles/data/engines" in msg
    assert "EngineProfile" in msg and "Extra inputs" not in msg
    assert main(["hw", "show", str(f)]) == 2  # the CLI: the same line, exit 2
    err = capsys.readouterr().err
    assert key in err and "engine profile" in err and "Traceback" not in err


def test_an_empty_old_layout_key_still_loads(tmp_path):
    # what a profile written before the layout went holds (null / {}): nothing to move
    data = json.loads(hwprofiles.get("h100-sxm").model_dump_json())
    data.update(step_overhead_s=None, request_overhead_s=None, engines={})
    f = tmp_path / "older.json"
    f.write_text(json.dumps(data))
    assert hwprofiles.load(f) == hwprofiles.get("h100-sxm")
