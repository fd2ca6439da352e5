"""Hardware profiles: every shipped profile loads, cites its sources, and bad input fails cleanly."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from pydantic import BaseModel, ValidationError

import hwprofiles
from hwprofiles.errors import InputError
from hwprofiles.schema import EfficiencyCurve, Figure, HardwareProfile

EXPECTED = {"h100-sxm", "h100-pcie", "h200-sxm", "b200", "gb200", "b300", "a100-sxm-80gb",
            "l40s", "mi300x", "mi325x", "mi355x"}


def _figures(obj, path=""):
    """Yield (path, Figure) for every Figure inside a profile."""
    if isinstance(obj, Figure):
        yield path, obj
    elif isinstance(obj, dict):
        for k, v in obj.items():
            yield from _figures(v, f"{path}.{k}")
    elif isinstance(obj, BaseModel):
        for k in type(obj).model_fields:
            yield from _figures(getattr(obj, k), f"{path}.{k}")


def test_all_devices_shipped():
    assert EXPECTED <= set(hwprofiles.available())


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_every_figure_cites_a_source(name):
    p = hwprofiles.get(name)
    figs = list(_figures(p))
    assert len(figs) >= 10
    for path, f in figs:
        assert ("http" in f.source or "measured on" in f.source or "nvidia-smi" in f.source
                or "assumed" in f.source or "whitepaper" in f.source
                or f.source.startswith("fitted to ")), (path, f.source)
    curves = [p.efficiency.attention, p.efficiency.memory, p.efficiency.link,
              p.efficiency.grouped_matmul_prefill, p.efficiency.grouped_matmul_decode,
              *p.efficiency.matmul.values()]
    for c in curves:
        assert ("published" in c.source or "assumed" in c.source
                or c.source.startswith("fitted to ")), c.source
    # datasheet figures are dense: the bf16 peak is never the doubled "with sparsity" one
    if "fp8" in p.peak_flops:
        assert p.peak("fp8") == pytest.approx(2 * p.peak("bf16"), rel=0.02)


def test_datasheet_figures_from_facts():
    h100 = hwprofiles.get("h100-sxm")
    assert h100.memory_bytes.value == 81_559 * 2**20
    assert h100.peak("bf16") == 989e12 and h100.peak("fp8") == 1979e12
    assert h100.memory_bandwidth.value == 3.35e12
    assert "nvfp4" not in h100.peak_flops  # Hopper has no FP4 math
    assert h100.compute_dtype("nvfp4") == "fp8"
    assert hwprofiles.get("a100").compute_dtype("fp8") == "bf16"
    b200 = hwprofiles.get("b200")
    assert b200.peak("nvfp4") == 9000e12 and b200.compute_dtype("nvfp4") == "nvfp4"
    assert hwprofiles.get("mi355x").peak("mxfp4") == 10100e12
    assert hwprofiles.get("mi300x").interconnect.bandwidth.value == 448e9
    # A100 and MI300X BF16 GEMM: their own published MAMF figures, not H100's carried over
    assert hwprofiles.get("a100").efficiency.matmul["bf16"].at(1e12) == pytest.approx(0.859)
    assert hwprofiles.get("mi300x").efficiency.matmul["bf16"].at(1e12) == pytest.approx(0.598)


# Figures whose source says "assumed", per shipped profile. A change here is a change in
# what the profiles claim: lower it when a public source is found, never raise it silently.
ASSUMED = {"a100-sxm-80gb": 7, "b200": 3, "b300": 10, "gb200": 12, "h100-pcie": 4,
           "h100-sxm": 1, "h200-sxm": 1, "l40s": 11, "mi300x": 9, "mi325x": 11, "mi355x": 12}

# Figures a public source gives for that very device: no shipped profile may assume them.
PUBLISHED = [(name, field) for name in sorted(EXPECTED) for field in
             ("memory_bytes", "memory_bandwidth", "peak_flops.bf16", "peak_flops.fp8",
              "interconnect.bandwidth")] + [
    ("a100-sxm-80gb", "efficiency.matmul.bf16"), ("h100-sxm", "efficiency.matmul.bf16"),
    ("h200-sxm", "efficiency.matmul.fp8"), ("b200", "efficiency.matmul.bf16"),
    ("b200", "efficiency.matmul.fp8"), ("mi300x", "efficiency.matmul.bf16")]


def test_no_source_cites_a_file_outside_the_repository():
    for name in sorted(EXPECTED):
        for path, src in hwprofiles.get(name).sourced_figures():
            assert "FACTS.md" not in src and "shared/reference" not in src, (name, path, src)


def test_assumed_figures_counted_per_profile():
    got = {name: len(hwprofiles.get(name).assumed_figures()) for name in sorted(EXPECTED)}
    assert got == ASSUMED
    fields = {n: set(hwprofiles.get(n).assumed_figures()) for n in EXPECTED}
    for name, field in PUBLISHED:
        if field.startswith("peak_flops.") and field.split(".")[1] not in \
                hwprofiles.get(name).peak_flops:
            continue
        assert field not in fields[name], (name, field)


def test_assumed_is_read_from_the_source_word():
    data = json.loads(hwprofiles.get("h100").model_dump_json())
    data["memory_bandwidth"]["source"] = "Assumed: like the H200"
    data["efficiency"]["link"]["source"] = "published, nothing presumed"
    data["interconnect"]["latency"]["source"] = "assumed 5 us"
    p = HardwareProfile.model_validate(data)
    before = set(hwprofiles.get("h100").assumed_figures())
    assert set(p.assumed_figures()) - before == {"memory_bandwidth",
                                                 "interconnect.latency"}
    assert "efficiency.link" not in p.assumed_figures()


@pytest.mark.parametrize("alias,name", [("H100", "h100-sxm"), ("h100 sxm", "h100-sxm"),
                                         ("H200", "h200-sxm"), ("MI300X", "mi300x"),
                                         ("A100", "a100-sxm-80gb"), ("GB200", "gb200")])
def test_aliases_case_insensitive(alias, name):
    assert hwprofiles.get(alias).name == name


def test_unknown_device_is_one_line_input_error():
    with pytest.raises(InputError) as exc:
        hwprofiles.get("h900")
    msg = str(exc.value)
    assert "\n" not in msg and "h900" in msg and "h100-sxm" in msg


def test_load_roundtrip_and_path(tmp_path):
    p = hwprofiles.get("b200")
    f = tmp_path / "mine.json"
    f.write_text(p.model_dump_json())
    assert hwprofiles.load(f) == p
    assert hwprofiles.get(str(f)) == p


@pytest.mark.parametrize("mutate,field", [
    (lambda d: d.pop("memory_bandwidth"), "memory_bandwidth"),
    (lambda d: d["memory_bytes"].pop("source"), "memory_bytes.source"),
    (lambda d: d["peak_flops"].update(bf16={"value": -1.0, "source": "x" * 5}), "peak_flops.bf16"),
    (lambda d: d["efficiency"]["memory"].update(points=[[1.0, 1.5]]), "efficiency.memory"),
    (lambda d: d["peak_flops"].update(fp64={"value": 1.0, "source": "datasheet"}), "peak_flops"),
])
def test_malformed_profile_is_one_line_error(tmp_path, mutate, field):
    data = json.loads(hwprofiles.get("h100").model_dump_json())
    mutate(data)
    f = tmp_path / "bad.json"
    f.write_text(json.dumps(data))
    with pytest.raises(InputError) as exc:
        hwprofiles.load(f)
    msg = str(exc.value)
    assert "\n" not in msg and str(f) in msg and field in msg


def test_not_json_and_missing_file(tmp_path):
    f = tmp_path / "x.json"
    f.write_text("{not json")
    with pytest.raises(InputError, match="not valid JSON"):
        hwprofiles.load(f)
    with pytest.raises(InputError, match="file not found"):
        hwprofiles.load(tmp_path / "nope.json")


def test_measured_curve_interpolates():
    data = json.loads(hwprofiles.get("h100").model_dump_json())
    data["efficiency"]["memory"] = {"points": [[1e6, 0.2], [1e9, 0.8]], "source": "measured on test"}
    p = HardwareProfile.model_validate(data)
    c = p.efficiency.memory
    assert c.at(1e3) == pytest.approx(0.2) and c.at(1e12) == pytest.approx(0.8)
    # halfway in log(size) the fraction is halfway in log(fraction): a power law
    assert c.at(10 ** 7.5) == pytest.approx((0.2 * 0.8) ** 0.5)


def test_time_is_monotone_wherever_it_is_at_the_points():
    """A steep curve (DeepGEMM's tokens-per-expert fit, ~linear at few tokens): the time of
    an op, size / fraction, never falls as the op grows, between points as at them."""
    pts = [[m, 0.705 * m / (m + 91)] for m in (1, 2, 4, 8, 16, 32, 64, 128, 1024)]
    c = EfficiencyCurve(points=pts, source="fit to DeepGEMM's published rows (test)")
    x = np.geomspace(0.5, 4096, 20001)
    t = x / c.at(x)
    assert np.all(np.diff(t) >= -1e-12 * t[1:])
    assert c.at(3.0) == pytest.approx(pts[1][1] * (pts[2][1] / pts[1][1]) ** np.log2(1.5))


def test_first_error_is_one_line_with_its_field():
    from pydantic import BaseModel, ValidationError, field_validator

    from hwprofiles.errors import first_error

    class Inner(BaseModel):
        x: int

        @field_validator("x")
        @classmethod
        def _two_lines(cls, v: int) -> int:
            if v < 0:
                raise ValueError("must be >= 0\nsee the docs")
            return v

    class Outer(BaseModel):
        inner: list[Inner]

    with pytest.raises(ValidationError) as bad:
        Outer.model_validate({"inner": [{"x": 1}, {"x": -1}]})
    assert first_error(bad.value) == ("inner.1.x", "Value error, must be >= 0")
    with pytest.raises(ValidationError) as whole:
        Outer.model_validate(3)
    loc, msg = first_error(whole.value, "(root)")
    assert loc == "(root)" and "\n" not in msg and msg


# -- figures physics ties together (issue 30): not the fitter's own clip window ----------

@pytest.mark.parametrize("name", ["h100-sxm", "h200-sxm", "b200", "a100", "mi300x"])
def test_bf16_and_fp16_gemm_run_at_one_efficiency(name):
    # BF16 and FP16 run on the same tensor cores at the same peak: one measured fraction
    p = hwprofiles.get(name)
    if "fp16" not in p.efficiency.matmul:
        pytest.skip("no FP16 figure")
    assert p.peak("bf16") == p.peak("fp16")
    assert p.efficiency.matmul["bf16"].at(1e12) == pytest.approx(
        p.efficiency.matmul["fp16"].at(1e12), rel=0.05)
    assert not p.efficiency.matmul["bf16"].source.startswith("fitted")


def test_hbm_efficiency_is_one_figure_across_a_generation():
    # HBM streaming is the memory system's, not a per-part fit: H100 and H200 (one Hopper
    # generation) and B200 carry the published fraction, none on the fitter's bounds (the
    # serving rows cannot pin it: H100/H200 rms log error moves 3 % from 0.75 to 0.95)
    from costmodels.calibrate import BOUNDS

    lo, hi, _ = BOUNDS["memory"]
    fr = {n: hwprofiles.get(n).efficiency.memory for n in ("h100-sxm", "h200-sxm", "b200")}
    assert fr["h100-sxm"].peak_fraction == pytest.approx(fr["h200-sxm"].peak_fraction, rel=0.1)
    for n, c in fr.items():
        assert lo < c.peak_fraction < hi, n
        assert c.source.startswith("published"), n


def test_engine_step_overhead_below_its_smallest_published_step():
    # an engine's host step cannot exceed the shortest step it was measured at: a TPOT at
    # concurrency 1 is one step per token (costmodels/data/serving_measurements.csv)
    from costmodels.calibrate import load_measurements
    from hwprofiles.engines import available_engines, find_engine, get_engine

    rows = load_measurements(
        Path(__file__).parents[1] / "costmodels" / "data" / "serving_measurements.csv")
    for e in available_engines():
        prof = get_engine(e)
        tpots = [m.value for m in rows if m.metric == "tpot_s" and m.concurrency == 1
                 and m.engine and find_engine(m.engine).name == prof.name]
        if tpots:
            assert prof.step_overhead_s.value <= min(tpots), (e, min(tpots))
        if prof.min_step_s is not None:  # the shortest step published anywhere for it
            assert prof.step_overhead_s.value <= prof.min_step_s.value * (1 + 1e-9), e
    assert get_engine("sglang").min_step_s is not None


def test_compute_dtype_table_is_sourced_and_names_real_devices_and_engines():
    from hwprofiles.engines import available_engines, compute_dtype_table

    table = compute_dtype_table()
    assert table.rules
    for r in table.rules:
        assert "https://" in r.source
        for d in r.devices:
            hwprofiles.get(d)  # raises on an unknown device
        assert set(r.engines) <= set(available_engines())


def test_mxfp4_on_hopper_runs_bf16_math_in_tensorrt_llm():
    # TensorRT-LLM's GPT-OSS guide: MXFP4 MoE weights with BF16 activations on Hopper, with
    # MXFP8 activations on Blackwell; the device fallback (no engine) stays FP4 -> FP8
    from costmodels.blocks import price_blocks
    from costmodels.dtypes import get_recipe
    from costmodels.shapes import BlockTable, Kind
    from hwprofiles.engines import compute_dtype

    h100, b200 = hwprofiles.get("h100-sxm"), hwprofiles.get("b200")
    assert compute_dtype(h100, "mxfp4", "trtllm") == "bf16"
    assert compute_dtype(h100, "mxfp4") == h100.compute_dtype("mxfp4") == "fp8"
    assert compute_dtype(b200, "mxfp4", "trtllm@1.2") == "fp8"
    moe = BlockTable.from_rows([dict(kind=Kind.MOE, hidden=2880, experts=128, top_k=4,
                                     expert_width=2880)])
    wl = ["isl=8192,osl=2,batch=8"]  # compute-bound prefill
    recipe = get_recipe("mxfp4")
    t_engine = price_blocks(moe, h100, recipe, wl, engine="trtllm").prefill_s[0, 0]
    t_device = price_blocks(moe, h100, recipe, wl).prefill_s[0, 0]
    assert t_engine > 1.5 * t_device  # BF16 math: half the FP8 peak


# Fitted figures on a bound of the fit (within 1 % of the bound's range): each carries its
# reason in the profile data (``on_bound``: "floor: ..." the bound is physics, "open: ..."
# structural error the bound hides, still to model), and no figure off its bounds carries
# one. A refit writes its figures without the note, so one that lands on a bound again
# fails here until someone writes why, or models what it hides.
NEAR = 0.01  # of the bound's range (hi - lo)


def _fitted_device_figures():
    from costmodels.calibrate import _get, parameters

    for name in ("h100-sxm", "h200-sxm", "b200"):
        hw = hwprofiles.get(name)
        data = hw.model_dump(mode="json")
        for p in parameters(hw):
            node = data
            for k in p.path:
                node = node.get(k) if isinstance(node, dict) else None
            if node is None or not str(node.get("source", "")).startswith("fitted"):
                continue
            yield (name, p.label), _get(data, p), p.lo, p.hi, node.get("on_bound")


def _fitted_engine_figures():
    from costmodels.calibrate import ENGINE_BOUNDS
    from hwprofiles.engines import available_engines, get_engine

    for e in available_engines():
        prof = get_engine(e)
        for k, (lo, hi, _) in ENGINE_BOUNDS.items():
            if k == "step_overhead_s" and prof.min_step_s is not None:
                hi = min(hi, prof.min_step_s.value)
            f = getattr(prof, k)
            if f.source.startswith("fitted"):
                yield (prof.name, k), f.value, lo, hi, f.on_bound


@pytest.mark.parametrize("figures", [_fitted_device_figures, _fitted_engine_figures])
def test_a_fitted_figure_on_a_bound_says_why_in_the_profile(figures):
    seen = 0
    for key, v, lo, hi, note in figures():
        seen += 1
        on = min(abs(v - lo), abs(v - hi)) <= NEAR * (hi - lo)
        assert on == (note is not None), (key, v, (lo, hi), note)
    assert seen >= 3


def test_a_refit_drops_the_on_bound_note():
    # calibrate rewrites a fitted figure with its new value and source only: the note of
    # the old value does not carry over to the new one
    from costmodels.calibrate import parameters, with_values

    hw = hwprofiles.get("b200")
    p = next(p for p in parameters(hw) if p.label == "MoE routing imbalance")
    assert hw.moe_imbalance.on_bound is not None
    refit = with_values(hw, [p], [1.2], "fitted to a test")
    assert refit.moe_imbalance.value == 1.2 and refit.moe_imbalance.on_bound is None
    with pytest.raises(ValidationError, match="on_bound"):
        Figure(value=1.0, source="fitted", on_bound="because")  # floor: / open: + a reason


def test_hw_show_lists_the_figures_on_a_bound_with_their_reason(capsys):
    from nas.cli import main

    assert main(["hw", "show", "b200"]) == 0
    out = capsys.readouterr().out
    bound = hwprofiles.get("b200").on_bound_figures()
    assert f"fitted figures on a bound of the fit: {len(bound)}" in out and bound
    for path, note in bound:
        assert f"{path}: {note}" in out
    assert ("moe_imbalance", "floor: 1.00 is perfect balance; routing cannot do better") in bound
