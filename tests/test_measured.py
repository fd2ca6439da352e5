"""Measured block costs (``costmodels.measured``): pricing in the analytic model's form,
interpolation exact at measured points and linear between them, refusal (never a silent
analytic price) outside what was measured, and the calibration to timed blocks.

The block tables here are real timings of tiny torch blocks on this CPU
(``tests/test_profile_blocks.py`` builds them the same way), or tables whose times are the
analytic model's own under a known profile (to check that the fit recovers it)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

import hwprofiles
from costmodels.blocks import BlockCosts, price_blocks
from costmodels.dtypes import get_recipe
from costmodels.measured import (
    BlockEntry,
    BlockMeasurements,
    Point,
    Timing,
    fit_blocks,
    mape_by_kind,
    plan_points,
    predict_points,
    price_measured,
    row_key,
    table_rows,
)
from costmodels.shapes import BlockTable
from hwprofiles.errors import InputError
from hwprofiles.schema import HardwareProfile

H100 = hwprofiles.get("h100-sxm")
BF16 = get_recipe("bf16")
WLS = ["isl=8,osl=8,batch=2", "isl=8,osl=16,concurrency=2,max_num_batched_tokens=8"]


@pytest.fixture(scope="module")
def timed(tmp_path_factory) -> BlockMeasurements:
    """A real block table: the tiny spec's blocks timed on this CPU at WLS's points."""
    pytest.importorskip("torch")
    from test_profile_blocks import tiny_blocks

    from nas.profile.blocks import BlockTimer, profile_blocks

    blocks, arch, _ = tiny_blocks()
    plan = plan_points(WLS)
    timer = BlockTimer("cpu", "bf16", warmup=0, repeats=2, min_time_s=0.0)
    return profile_blocks(blocks, arch, plan, tmp_path_factory.mktemp("b") / "B.json", timer)


def _table(meas: BlockMeasurements, kinds=None) -> BlockTable:
    rows = [e.row for e in meas.blocks if kinds is None or e.kind in kinds]
    return BlockTable.from_rows(rows + [{"kind": 0, "hidden": meas.hidden}])  # and a no-op


def test_measured_and_analytic_pricing_agree_in_form(timed):
    table = _table(timed)
    a = price_blocks(table, H100, BF16, WLS)
    m = price_measured(table, H100, BF16, timed, WLS)
    assert isinstance(m, BlockCosts)
    for f in dataclasses.fields(BlockCosts):
        va, vm = getattr(a, f.name), getattr(m, f.name)
        if isinstance(va, np.ndarray):
            assert vm.shape == va.shape and vm.dtype == va.dtype, f.name
            assert np.all(np.isfinite(vm)), f.name
    assert m.workloads == a.workloads and (m.tp, m.ep) == (a.tp, a.ep)
    # memory is analytic (exact arithmetic on shapes): the very same numbers
    for f in ("memory_bytes", "weight_bytes", "kv_bytes_per_token", "state_bytes_per_sequence",
              "workspace_bytes_per_token", "window"):
        np.testing.assert_array_equal(getattr(m, f), getattr(a, f))
    # seconds: in batch mode TTFT is the measured prefill pass of the batch, TPOT the
    # measured decode step at the mean context (isl + osl/2 = 12), cycle = TTFT + 7 TPOTs
    for i, e in enumerate(timed.blocks):
        t = {(x.mode, x.batch, x.tokens, x.context): timed.estimate(x) for x in e.timings}
        assert m.prefill_s[i, 0] == t[("prefill", 2, 8, 0)]
        assert m.decode_s[i, 0] == t[("decode", 2, 1, 12)]
        assert m.runtime_s[i, 0] == pytest.approx(m.prefill_s[i, 0] + 7 * m.decode_s[i, 0],
                                                  rel=1e-12)
    assert np.all(m.runtime_s[:-1] > 0) and np.all(m.runtime_s[-1] == 0)  # a no-op is free


def test_interpolation_exact_at_measured_points(timed):
    for e in timed.blocks:
        for t in e.timings:
            got = timed.seconds(e.row, t.mode, t.batch, t.tokens, t.context)
            # exact: the point's own figure (on this CPU its fastest sample)
            assert got == timed.estimate(t) == t.min_s


def test_interpolation_between_batches_is_linear(timed):
    e = timed.blocks[0]
    pts = sorted((t.batch, timed.estimate(t)) for t in e.timings if t.mode == "prefill"
                 and t.tokens == 8)
    (b0, s0), (b1, s1) = pts[0], pts[-1]
    assert b1 > b0
    mid = (b0 + b1) / 2
    assert timed.seconds(e.row, "prefill", mid, 8, 0) == pytest.approx((s0 + s1) / 2,
                                                                       rel=1e-12)


def test_unmeasured_width_interpolates_between_neighbours(timed):
    ffn = sorted((e for e in timed.blocks if e.kind == "ffn"),
                 key=lambda e: e.row["ffn_width"])
    lo, hi = ffn[0], ffn[-1]
    row = dict(lo.row, ffn_width=(lo.row["ffn_width"] + hi.row["ffn_width"]) // 2)
    assert timed.entry(row_key(row)) is None
    x = (row["ffn_width"] - lo.row["ffn_width"]) / (hi.row["ffn_width"] - lo.row["ffn_width"])
    for t in lo.timings:
        t_hi = timed.seconds(hi.row, t.mode, t.batch, t.tokens, t.context)
        got = timed.seconds(row, t.mode, t.batch, t.tokens, t.context)
        s = timed.estimate(t)
        assert got == pytest.approx(s + x * (t_hi - s), rel=1e-12)


@pytest.mark.parametrize("case, match", [
    ("batch", "outside the measured batches"),
    ("context", "no decode at context 99 was measured"),
    ("width", "not measured and has no measured neighbours"),
    ("kind", "not measured and has no measured neighbours"),
])
def test_unmeasured_points_are_refused_not_priced_analytically(timed, case, match):
    ffn = next(e for e in timed.blocks if e.kind == "ffn")
    row, args = dict(ffn.row), ("decode", 2, 1, 12)
    if case == "batch":
        args = ("decode", 64, 1, 12)
    elif case == "context":
        args = ("decode", 2, 1, 99)
    elif case == "width":
        row["ffn_width"] = 10 * row["ffn_width"]
    else:
        row = {"kind": 2, "hidden": 64, "m_heads": 4, "m_head_dim": 16, "state": 16,
               "groups": 1, "conv_kernel": 4}
    with pytest.raises(InputError, match=match):
        timed.seconds(row, *args)
    with pytest.raises(InputError, match=match):  # and so does pricing a table with it
        if case in ("batch", "context"):
            price_measured(BlockTable.from_rows([row]), H100, BF16, timed,
                           ["isl=8,osl=8,batch=64" if case == "batch" else
                            "isl=8,osl=182,batch=2"])
        else:
            price_measured(BlockTable.from_rows([row]), H100, BF16, timed, WLS[:1])


def test_pricing_refuses_what_was_not_timed(timed):
    table = _table(timed)
    with pytest.raises(InputError, match="one device"):
        price_measured(table, H100, BF16, timed, WLS, tp=2)
    with pytest.raises(InputError, match="timed in bf16"):
        price_measured(table, H100, get_recipe("fp8"), timed, WLS)
    with pytest.raises(InputError, match="speculative"):
        price_measured(table, H100, BF16, timed, ["isl=8,osl=8,batch=2,draft_tokens=1"])


def _synthetic(hw, plan) -> BlockMeasurements:
    """Blocks 'measured' as the analytic model prices them on ``hw`` (for the fitter)."""
    rows = [
        ("attention", {"kind": 1, "hidden": 512, "n_heads": 8, "n_kv_heads": 2,
                       "head_dim": 64}),
        ("ffn", {"kind": 4, "hidden": 512, "ffn_width": 1536, "gated": 1}),
        ("ffn", {"kind": 4, "hidden": 512, "ffn_width": 512, "gated": 1}),
        ("linear", {"kind": 5, "hidden": 512}),
    ]

    def timing(p: Point, s: float) -> Timing:
        return Timing(**p.model_dump(), median_s=s, min_s=s, max_s=s, repeats=1, peak_bytes=0)

    meas = BlockMeasurements(
        device="synthetic", device_kind="cpu", date="2026-01-01", software={}, dtype="bf16",
        timing="the analytic model", warmup=0, repeats=1, hidden=512, plan=plan,
        blocks=[BlockEntry(key=row_key(r), kind=k, row=r, weight_bytes=0,
                           timings=[timing(p, 1.0) for p in plan]) for k, r in rows])
    pred = predict_points(meas, hw, BF16)
    for e in meas.blocks:
        e.timings = [timing(c.point, c.predicted_s) for c in pred if c.key == e.key]
    return meas


def test_fit_recovers_the_profile_the_blocks_were_timed_under():
    plan = plan_points(["isl=512,osl=64,batch=16", "isl=128,osl=256,batch=64"])
    # start: H100 with every matmul fraction on the fit's lower bound (where a refit can leave
    # a figure; the fit must still move it); the "device": fractions mid-range and another
    # kernel overhead
    from costmodels.calibrate import BOUNDS

    lo, hi, _ = BOUNDS["matmul"]

    def with_matmul(f: float, kernel_s: float | None = None) -> HardwareProfile:
        data = H100.model_dump(mode="json")
        for d in data["efficiency"]["matmul"]:
            data["efficiency"]["matmul"][d]["points"] = [[1.0, f]]
        if kernel_s is not None:
            data["kernel_overhead_s"]["value"] = kernel_s
        return HardwareProfile.model_validate(data)

    start, true = with_matmul(lo), with_matmul((lo + hi) / 2, 6e-6)
    meas = _synthetic(true, plan)
    before = mape_by_kind(predict_points(meas, start, BF16))
    assert before[-1]["mape"] > 0.05
    res = fit_blocks(meas, start, BF16, max_nfev=60)
    after = mape_by_kind(predict_points(meas, res.profile, BF16))
    assert after[-1]["kind"] == "all" and after[-1]["mape"] < 0.01
    assert any(k == "matmul bf16" for k, _, _ in res.moved)
    assert res.rms_log_after < res.rms_log_before
    assert any(k == "kernel overhead" for k, _, _ in res.moved)
    src = res.profile.kernel_overhead_s.source
    assert "block timings on synthetic" in src


def test_table_rows_round_trip_keys(timed):
    table = _table(timed)
    keys = [row_key(r) for r in table_rows(table)]
    assert keys[:-1] == [e.key for e in timed.blocks]
    assert Point(mode="decode", batch=1, tokens=1, context=3).label() == "decode b1@3"
