"""Eager torch as a backend (``costmodels.eager``): what a timed block ran, op by op, and
its price on a device; the probe's eager figures; calibration of timed blocks from their
op traces. Prices are checked against the roofline written out by hand; the traces of real
``nas.modules`` blocks against the shapes those blocks must run."""

from __future__ import annotations

import dataclasses

import pytest
from pydantic import ValidationError

import hwprofiles
from costmodels.eager import AttentionOp, GemmOp, OpTrace, eager_figures, price_trace
from costmodels.measured import (
    BlockEntry,
    BlockMeasurements,
    Point,
    Timing,
    fit_blocks,
    predict_points,
    recipe_for,
    row_key,
)
from hwprofiles.probe import derive
from hwprofiles.schema import HardwareProfile

PEAK, BW, OVH, VIEW, ELEM = 100e12, 2e12, 5e-6, 1e-6, 50e9


def _profile(eager: bool = True) -> HardwareProfile:
    """h100-sxm with constant curves: bf16 GEMMs at 50 % of a 100 TFLOP/s peak, attention
    at 25 %, memory at 80 % of 2 TB/s; 5 us per kernel; eager: 1 us per view, 50 GB/s
    elementwise in bf16."""
    d = hwprofiles.get("h100-sxm").model_dump(mode="json")
    src = "test figure"
    d["peak_flops"] = {"bf16": {"value": PEAK, "source": src}}
    d["memory_bandwidth"] = {"value": BW, "source": src}
    eff = d["efficiency"]
    eff["matmul"] = {"bf16": {"points": [[1.0, 0.5]], "source": src}}
    eff["attention"] = {"points": [[1.0, 0.25]], "source": src}
    eff["memory"] = {"points": [[1.0, 0.8]], "source": src}
    eff["attention_decode"] = None
    d["kernel_overhead_s"] = {"value": OVH, "source": src}
    d["eager"] = ({"view_overhead_s": {"value": VIEW, "source": src},
                   "elementwise_bandwidth": {"bf16": {"value": ELEM, "source": src}}}
                  if eager else None)
    return HardwareProfile.model_validate(d)


def test_a_trace_is_priced_op_by_op_as_the_roofline_says():
    hw = _profile()
    tr = OpTrace(gemms=[GemmOp(m=64, n=128, k=256, count=2)],
                 attention=[AttentionOp(batch=2, heads=8, kv_heads=2, q_len=64, kv_len=64,
                                        head_dim=32, causal=True),
                            AttentionOp(batch=2, heads=8, kv_heads=2, q_len=1, kv_len=300,
                                        head_dim=32, causal=False)],
                 ops=7, op_bytes=3_000_000, metadata_ops=11)
    gf, gb = 2 * 64 * 128 * 256, (64 * 256 + 256 * 128 + 64 * 128) * 2
    gemm = max(gf / (PEAK * 0.5), gb / (BW * 0.8)) + OVH
    pf = 4 * 32 * 8 * (64 * 65 / 2) * 2  # causal prompt: q(q+1)/2 pairs
    pb = 2 * 32 * 2 * (2 * 8 * 64 + 2 * 2 * 64)
    prompt = max(pf / (PEAK * 0.25), pb / (BW * 0.8)) + OVH
    df, db = 4 * 32 * 8 * 300 * 2, 2 * 32 * 2 * (2 * 8 * 1 + 2 * 2 * 300)
    step = max(df / (PEAK * 0.25), db / (BW * 0.8)) + OVH  # no decode curve: memory's
    rest = 7 * OVH + 3_000_000 / ELEM + 11 * VIEW
    assert price_trace(tr, hw, "bf16") == pytest.approx(2 * gemm + prompt + step + rest,
                                                        rel=1e-12)
    assert tr.dispatched == 2 + 2 + 7 + 11


def test_a_gemm_pays_the_gemm_librarys_call_cost_of_its_dtype():
    """With a GEMM call overhead for the dtype each GEMM costs its roofline time plus that
    figure instead of one kernel overhead (a bf16 GEMM on a CPU: ~20 us of oneDNN setup
    against ~1.5 us of dispatch); the other ops keep the kernel overhead."""
    call = 20e-6
    d = _profile().model_dump(mode="json")
    d["eager"]["gemm_overhead_s"] = {"bf16": {"value": call, "source": "test figure"}}
    hw = HardwareProfile.model_validate(d)
    tr = OpTrace(gemms=[GemmOp(m=1, n=512, k=512, count=3)], ops=9, op_bytes=0,
                 metadata_ops=0)
    gb = (512 + 512 * 512 + 512) * 2
    assert price_trace(tr, hw, "bf16") == pytest.approx(3 * (gb / (BW * 0.8) + call)
                                                        + 9 * OVH, rel=1e-12)
    without = price_trace(tr, _profile(), "bf16")
    assert without == pytest.approx(3 * (gb / (BW * 0.8) + OVH) + 9 * OVH, rel=1e-12)
    d["eager"]["gemm_overhead_s"] = {"bf16": {"value": -1e-6, "source": "test figure"}}
    with pytest.raises(ValidationError, match=">= 0"):
        HardwareProfile.model_validate(d)


def test_a_traced_table_fits_the_gemm_call_cost_apart_from_the_dispatch():
    """Blocks with few GEMMs per op and blocks with many (a linear block's 1 GEMM and 9
    ops, an FFN's 3 and 11) tell the GEMM call cost from the per-op dispatch: the fit
    recovers both from timings made with them."""
    d = _profile().model_dump(mode="json")
    d["eager"]["gemm_overhead_s"] = {"bf16": {"value": 20e-6, "source": "test figure"}}
    truth = HardwareProfile.model_validate(d)
    traces = [OpTrace(gemms=[GemmOp(m=1, n=64, k=64, count=g)], ops=o, op_bytes=0,
                      metadata_ops=0) for g, o in ((1, 9), (3, 11), (4, 19), (1, 2))]
    rows = [{"kind": 5, "hidden": 64 + 16 * i} for i in range(len(traces))]
    entries = []
    for i, (tr, row) in enumerate(zip(traces, rows)):
        s = price_trace(tr, truth, "bf16")
        t = Timing(mode="decode", batch=1, tokens=1, context=8 + i, median_s=s, min_s=s,
                   max_s=s, repeats=3, peak_bytes=1, trace=tr)
        entries.append(BlockEntry(key=row_key(row), kind="linear", row=row,
                                  weight_bytes=8192, timings=[t]))
    meas = BlockMeasurements(device="AMD EPYC", device_kind="cpu", date="2026-12-03",
                             software={}, dtype="bf16", threads=1, timing="t", warmup=0,
                             repeats=3, spec="s", hidden=64,
                             plan=[e.timings[0].point for e in entries], blocks=entries)
    d["eager"]["gemm_overhead_s"]["bf16"]["value"] = 5e-6  # start away from the truth
    d["kernel_overhead_s"]["value"] = 12e-6
    start = HardwareProfile.model_validate(d)
    res = fit_blocks(meas, start, recipe_for(meas), max_nfev=60,
                     only=["kernel overhead", "GEMM call overhead bf16"])
    assert res.profile.eager.gemm_overhead_s["bf16"].value == pytest.approx(20e-6, rel=0.02)
    assert res.profile.kernel_overhead_s.value == pytest.approx(OVH, rel=0.02)


def test_a_profile_without_eager_figures_says_what_it_assumes():
    hw = _profile(eager=False)
    figs, assumed = eager_figures(hw)
    assert assumed and "assumed" in figs.view_overhead_s.source
    assert figs.view_overhead_s.value == OVH
    assert figs.elementwise_bandwidth["bf16"].value == pytest.approx(BW * 0.8)
    tr = OpTrace(ops=3, op_bytes=1_600_000, metadata_ops=2)
    assert price_trace(tr, hw, "bf16") == pytest.approx(3 * OVH + 1_600_000 / (BW * 0.8)
                                                        + 2 * OVH)
    assert eager_figures(_profile())[1] is False
    with pytest.raises(hwprofiles.InputError, match="fp16"):
        price_trace(tr, _profile(), "fp16")  # the profile has bf16 only


def test_eager_figures_are_checked():
    d = _profile().model_dump(mode="json")
    d["eager"]["elementwise_bandwidth"]["fp64"] = {"value": 1e9, "source": "x" * 3}
    with pytest.raises(ValidationError, match="fp64"):
        HardwareProfile.model_validate(d)
    d["eager"]["elementwise_bandwidth"] = {"bf16": {"value": 0.0, "source": "xyz"}}
    with pytest.raises(ValidationError, match="> 0"):
        HardwareProfile.model_validate(d)


def _table(trace: OpTrace | None, seconds: float = 1e-3) -> BlockMeasurements:
    row = {"kind": 5, "hidden": 64}  # a linear block (costmodels.shapes.Kind.LINEAR)
    t = Timing(mode="prefill", batch=1, tokens=64, context=0, median_s=seconds,
               min_s=seconds, max_s=seconds, repeats=3, peak_bytes=1, trace=trace)
    e = BlockEntry(key=row_key(row), kind="linear", row=row, weight_bytes=8192, timings=[t])
    return BlockMeasurements(device="AMD EPYC", device_kind="cpu", date="2026-12-03",
                             software={}, dtype="bf16", threads=1, timing="t", warmup=0,
                             repeats=3, spec="s", hidden=64, plan=[t.point], blocks=[e])


def test_predict_points_prices_a_traced_point_from_its_trace():
    hw = _profile()
    tr = OpTrace(gemms=[GemmOp(m=64, n=64, k=64)], ops=9, op_bytes=100_000, metadata_ops=3)
    (c,) = predict_points(_table(tr), hw, recipe_for(_table(tr)))
    assert c.predicted_s == pytest.approx(price_trace(tr, hw, "bf16"))
    (f,) = predict_points(_table(None), hw, recipe_for(_table(None)))  # the fused model
    assert f.predicted_s != pytest.approx(c.predicted_s)


def test_a_traced_cpu_table_fits_the_eager_figures_within_physical_bounds():
    hw = _profile(eager=False)  # no eager figures: the fit starts from the stated assumptions
    tr = OpTrace(gemms=[GemmOp(m=64, n=64, k=64)], ops=9, op_bytes=100_000, metadata_ops=3)
    meas = _table(tr, seconds=price_trace(tr, hw, "bf16") * 3)
    res = fit_blocks(meas, hw, recipe_for(meas), max_nfev=30)
    labels = {k for k, _, _ in res.moved} | {k for k, *_ in res.on_bounds}
    assert labels & {"view overhead", "elementwise bandwidth bf16", "kernel overhead"}
    assert res.profile.eager is not None
    (after,) = predict_points(meas, res.profile, recipe_for(meas))
    assert abs(after.predicted_s / after.measured_s - 1) < 0.05


def test_a_probed_elementwise_rate_is_kept_as_measured():
    """The blocks' elementwise bytes are a few % of their time: a fit would trade the rate
    against the per-op overhead, so a rate the probe measured stays; the dispatch figures
    move."""
    hw = _profile()  # eager figures given (as a probe writes them)
    tr = OpTrace(gemms=[GemmOp(m=64, n=64, k=64)], ops=9, op_bytes=100_000, metadata_ops=3)
    meas = _table(tr, seconds=price_trace(tr, hw, "bf16") * 3)
    res = fit_blocks(meas, hw, recipe_for(meas), max_nfev=30)
    assert res.profile.eager.elementwise_bandwidth["bf16"].value == ELEM
    assert "elementwise bandwidth bf16" not in {k for k, _, _ in res.moved}
    assert {k for k, _, _ in res.moved} & {"view overhead", "kernel overhead"}


def test_the_probe_derives_eager_figures_from_its_records():
    from test_probe_derive import H100, _log

    cpu = dataclasses.replace(H100, kind="cpu", visible_gpus=None, threads=1)
    assert derive(_log(), cpu).eager is None  # an older log: no eager records
    log = _log() + [
        {"kind": "view_overhead", "op": "x.view(1)", "iters": 200, "seconds": 8e-7},
        *({"kind": "elementwise", "op": "mul", "dtype": "bf16", "elements": n,
           "moved_bytes": 6 * n, "seconds": 6 * n / rate + 5e-6}
          for n, rate in ((2**15, 30e9), (2**18, 20e9), (2**20, 25e9)))]
    prof = derive(log, cpu)
    assert prof.eager is not None
    assert prof.eager.view_overhead_s.value == 8e-7
    # the median of the three rates, each net of the 5 us dispatch the log measured
    assert prof.eager.elementwise_bandwidth["bf16"].value == pytest.approx(25e9)
    assert "x.view(1)" in prof.eager.view_overhead_s.source
    assert prof.eager.gemm_overhead_s == {}  # no GEMM-call record: priced as before
    call = {"kind": "gemm_call", "dtype": "bf16", "m": 1, "n": 256, "k": 256,
            "weight_bytes": 131072, "seconds": 2.1e-5, "repeats": 5, "spread": 0.004,
            "rejected": 1}
    prof = derive(log + [call], cpu)
    fig = prof.eager.gemm_overhead_s["bf16"]
    assert fig.value == 2.1e-5 and "x[1, 256] @ W[256, 256]^T" in fig.source


def _arch():
    from nas.hf import from_hf

    return from_hf({
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64,
        "intermediate_size": 128, "num_attention_heads": 4, "num_key_value_heads": 2,
        "head_dim": 16, "num_hidden_layers": 2, "vocab_size": 256, "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0, "hidden_act": "silu", "tie_word_embeddings": False})


def test_the_trace_of_real_blocks_holds_the_shapes_they_run():
    pytest.importorskip("torch")
    from nas.profile.blocks import BlockTimer

    arch = _arch()
    timer = BlockTimer("cpu", "bf16", warmup=0, repeats=1, min_time_s=0.0)
    att, ffn = arch.blocks[0], arch.blocks[1]
    blk = timer.build(att, arch)
    pre = timer.time_point(blk, att, 64, Point(mode="prefill", batch=2, tokens=8, context=0), 0)
    # eager torch runs Q, K, V and O apart: 16 tokens x (64 -> 64, 64 -> 32, 64 -> 32, 64 -> 64)
    assert sorted((g.m, g.n, g.k, g.count) for g in pre.trace.gemms) == [
        (16, 32, 64, 2), (16, 64, 64, 2)]
    assert pre.trace.attention == [AttentionOp(batch=2, heads=4, kv_heads=2, q_len=8,
                                               kv_len=8, head_dim=16, causal=True)]
    assert pre.trace.ops > 0 and pre.trace.metadata_ops > 0
    # the norm alone reads and writes the 16 x 64 input: the elementwise bytes are above it
    assert pre.trace.op_bytes > 2 * 16 * 64 * 2
    dec = timer.time_point(blk, att, 64, Point(mode="decode", batch=2, tokens=1, context=20),
                           0)
    (a,) = dec.trace.attention  # one step over the 20 cached keys and its own
    assert a.kv_len == 21 and a.flops == pytest.approx(4 * 16 * 4 * 21 * 2)
    blk = timer.build(ffn, arch)
    pre = timer.time_point(blk, ffn, 64, Point(mode="prefill", batch=1, tokens=8, context=0), 0)
    assert not pre.trace.attention
    assert sum(2 * g.m * g.n * g.k * g.count for g in pre.trace.gemms) == 2 * 8 * 64 * 128 * 3


def test_interleaved_points_time_every_point_with_its_trace():
    pytest.importorskip("torch")
    from nas.profile.blocks import BlockTimer

    arch = _arch()
    timer = BlockTimer("cpu", "bf16", warmup=1, repeats=3, min_time_s=0.0)
    att = arch.blocks[0]
    blk = timer.build(att, arch)
    pts = [Point(mode="prefill", batch=1, tokens=8, context=0),
           Point(mode="decode", batch=2, tokens=1, context=8),
           Point(mode="decode", batch=1, tokens=1, context=16)]
    got = timer.time_points(blk, att, 64, pts, 0)
    assert [t.point for t in got] == pts
    for t, p in zip(got, pts):
        assert t.repeats == 3 and 0 < t.min_s <= t.median_s <= t.max_s
        assert t.trace == timer.time_point(blk, att, 64, p, 0).trace  # the same ops


def test_a_cpu_point_stands_for_its_fastest_sample_a_cuda_point_for_its_median():
    tr = OpTrace(ops=1, op_bytes=0, metadata_ops=0)
    cpu = _table(tr)
    t = cpu.blocks[0].timings[0].model_copy(update={"min_s": 4e-4, "max_s": 3e-3})
    cpu.blocks[0].timings[0] = t
    assert cpu.estimate(t) == 4e-4 and "fastest" in cpu.estimator()
    (c,) = predict_points(cpu, _profile(), recipe_for(cpu))
    assert c.measured_s == 4e-4
    cuda = cpu.model_copy(update={"device_kind": "cuda"})
    assert cuda.estimate(t) == t.median_s == 1e-3 and "median" in cuda.estimator()


def test_gemms_below_the_machine_balance_stay_out_of_the_gemm_curve():
    from costmodels.measured import GemmTiming, with_gemm_curve

    hw = _profile()  # balance: 100 TFLOP/s over 2 TB/s = 50 FLOP/byte
    meas = _table(None)

    def gemm(m: int, secs: float) -> GemmTiming:
        return GemmTiming(m=m, n=4096, k=4096, median_s=secs,
                          flop_per_s=2 * m * 4096 * 4096 / secs)

    # bf16 intensity of m x 4096 x 4096 is about m FLOP/byte: m = 1 streams its weights,
    # m = 512 is compute-bound
    meas = meas.model_copy(update={"gemm": [gemm(1, 2e-5), gemm(512, 1e-3)]})
    got, note = with_gemm_curve(hw, meas)
    pts = got.efficiency.matmul["bf16"].points
    assert [s for s, _ in pts] == [2.0 * 512 * 4096 * 4096]
    assert "1 of 2 shapes compute-bound" in note
    assert "left to the memory roofline" in got.efficiency.matmul["bf16"].source
    only_small = meas.model_copy(update={"gemm": [gemm(1, 2e-5)]})
    assert with_gemm_curve(hw, only_small) == (hw, "")  # nothing to learn the curve from


def test_a_group_of_blocks_is_timed_interleaved_block_by_block():
    pytest.importorskip("torch")
    from nas.profile.blocks import BlockTimer

    arch = _arch()
    timer = BlockTimer("cpu", "bf16", warmup=0, repeats=2, min_time_s=0.0)
    att, ffn = arch.blocks[0], arch.blocks[1]
    a, f = timer.build(att, arch), timer.build(ffn, arch)
    pa = [Point(mode="prefill", batch=1, tokens=8, context=0)]
    pf = [Point(mode="prefill", batch=2, tokens=4, context=0),
          Point(mode="decode", batch=1, tokens=1, context=4)]
    ta, tf = timer.time_group([(a, att, pa), (f, ffn, pf)], 64, 0)
    assert [t.point for t in ta] == pa and [t.point for t in tf] == pf
    assert ta[0].trace.attention and not any(t.trace.attention for t in tf)
