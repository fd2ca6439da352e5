"""Calibration: the published measurement set, the fit (recovers a known profile, stays
physical), the CLI, and bad input."""

from __future__ import annotations

import csv
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import hwprofiles
from costmodels.calibrate import (
    ENGINE_BOUNDS,
    FLOOR,
    Measurement,
    fit,
    fit_engines,
    load_measurements,
    mape_table,
    parameters,
    predict,
    score,
    with_values,
)
from hwprofiles.errors import InputError
from nas.cli.calibrate import shape_resolver

DATA = Path(__file__).resolve().parent / "data"
CSV = DATA.parents[1] / "costmodels" / "data" / "serving_measurements.csv"
# the configs of the CSV's models: the test inputs', then the shipped examples'
CONFIG_DIRS: list[str] = []  # the default: the CSV's configs/ folder, then the examples'
SHAPES = shape_resolver(CSV, CONFIG_DIRS)
H100 = hwprofiles.get("h100-sxm")


def test_published_measurement_set():
    ms = load_measurements(CSV)
    assert len(ms) >= 40
    assert {m.gpu for m in ms} >= {"h100-sxm", "h200-sxm", "b200"}
    families = {m.model.split("-")[0] for m in ms}  # llama, mixtral, qwen3, nemotron
    assert len(families) >= 4
    hold = [m for m in ms if m.split == "holdout"]
    assert len(hold) * 3 >= len(ms)
    assert {m.regime for m in ms} == {"throughput", "TTFT", "TPOT"}
    assert all(m.source and m.url.startswith(("http", "shared/")) or "arxiv" in m.url
               for m in ms)
    assert len({m.id for m in ms}) == len(ms)
    for m in ms:  # every model resolves to a config
        assert SHAPES(m.model).table is not None


def _synthetic(truth, n=8, engine="trtllm", engines=None, gpu="h100-sxm",
               model="llama-3.1-8b"):
    wls = [(128, 128, None), (2048, 128, None), (1000, 1000, None), (128, 2048, 4),
           (5000, 500, 1), (500, 2000, 16), (2048, 512, 64), (20000, 2000, None)][:n]
    out = []
    for i, (isl, osl, c) in enumerate(wls):
        for metric in (("throughput",) if c is None else ("ttft_s", "tpot_s")):
            m = Measurement(id=f"{gpu}{model}{i}{metric}", gpu=gpu, model=model,
                            precision="fp8", tp=1, isl=isl, osl=osl, concurrency=c,
                            metric=metric, value=1.0, engine=engine,
                            source="synthetic, from a known profile")
            v = predict(m, SHAPES(m.model), truth, engines=engines)
            out.append(m.model_copy(update={"value": v}))
    return out


def test_fit_recovers_a_known_profile():
    params = {p.label: p for p in parameters(H100, published=True)}
    chosen = [params["memory"], params["matmul fp8"], params["kernel overhead"]]
    truth = with_values(H100, chosen, [0.62, 0.55, 6e-6])
    ms = _synthetic(truth)
    res = fit(ms, H100, SHAPES, max_nfev=30, only=[p.label for p in chosen] + ["link"])
    assert res.rms_log_after < 1e-3 < res.rms_log_before
    p = res.profile
    assert p.efficiency.memory.peak_fraction == pytest.approx(0.62, rel=0.02)
    assert p.efficiency.matmul["fp8"].peak_fraction == pytest.approx(0.55, rel=0.03)
    assert p.kernel_overhead_s.value == pytest.approx(6e-6, rel=0.05)
    # the engines' overheads are not the device's: none is a device figure, and a refitted
    # profile writes none (the engine profiles price them)
    assert not any("engine" in k or "overhead" in k and "kernel" not in k for k in params)
    assert not {"step_overhead_s", "request_overhead_s", "engines"} & set(p.model_dump())
    assert p.efficiency.memory.source.startswith(f"fitted to {len(ms)} measurements from")
    # figures no measurement touches keep their value and source
    assert p.efficiency.link == H100.efficiency.link
    assert p.peak_flops == H100.peak_flops and p.memory_bandwidth == H100.memory_bandwidth


def test_fit_stays_physical():
    ms = [m.model_copy(update={"value": m.value * 20}) for m in _synthetic(H100, 4)]
    # 20x faster than possible: the fit runs into the bounds
    res = fit(ms, H100, SHAPES, max_nfev=10, only=["memory", "matmul fp8", "kernel overhead"])
    e = res.profile.efficiency
    for c in [*e.matmul.values(), e.attention, e.memory, e.link]:
        assert all(FLOOR <= f <= 1.0 for _, f in c.points)
    assert 0 <= res.profile.kernel_overhead_s.value <= 20e-6


def test_mape_table_rows():
    ms = _synthetic(H100, 4)
    ms = [m.model_copy(update={"value": m.value * (1.1 if i % 2 else 0.8),
                               "split": "holdout" if i == 0 else "fit"})
          for i, m in enumerate(ms)]
    rows = mape_table(score(ms, SHAPES, lambda _: H100))
    allfit = next(r for r in rows if (r["split"], r["gpu"], r["regime"]) == ("fit", "all", "all"))
    errs = [1 / (1.1 if i % 2 else 0.8) - 1 for i in range(1, len(ms))]
    assert allfit["n"] == len(ms) - 1
    assert allfit["mape"] == pytest.approx(np.mean(np.abs(errs)))
    assert allfit["bias"] == pytest.approx(np.mean(errs))


def run_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "nas", *args], capture_output=True, text=True)


CONFIG_ARGS = ("--configs", str(DATA.parents[1] / "costmodels" / "data" / "configs"),
               "--configs", str(DATA.parents[1] / "nas" / "examples" / "configs"))
"""For CSVs written in a temp folder (the shipped one finds its configs by default)."""
"""calibrate's --configs for the measurement set's models (tests/data and the examples')."""


def _write_measurements(path: Path, ms: list[Measurement]) -> Path:
    """``ms`` as a measurements CSV at ``path`` (calibrate's input format)."""
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(Measurement.model_fields))
        w.writeheader()
        for m in ms:
            w.writerow({k: ("" if v is None else v) for k, v in m.model_dump().items()})
    return path


def test_a_fitted_figure_on_its_bound_is_reported():
    """Decode throughput three times what the H100's memory can stream: the memory fraction
    the fit wants is above 1, so it ends on its upper bound, and the result says so; a
    figure fitted inside its range is not listed."""
    params = {p.label: p for p in parameters(H100, published=True)}
    truth = with_values(H100, [params["memory"]], [0.7])
    ms = [m.model_copy(update={"value": m.value * (3.0 if m.metric == "throughput" else
                                                   1 / 3.0)})
          for m in _synthetic(truth, 4)]
    res = fit(ms, H100, SHAPES, max_nfev=20, only=["memory"])
    assert [(k, hi) for k, v, lo, hi in res.on_bounds] == [("memory", params["memory"].hi)]
    assert res.on_bounds[0][1] == pytest.approx(params["memory"].hi)
    inside = fit(_synthetic(truth, 4), H100, SHAPES, max_nfev=20, only=["memory"])
    assert inside.on_bounds == []


def test_cli_calibrate_writes_profile(tmp_path):
    ms = _synthetic(with_values(H100, [p for p in parameters(H100, published=True)
                                       if p.label == "memory"], [0.7]), 2)
    path = _write_measurements(tmp_path / "m.csv", ms)
    out = tmp_path / "fitted.json"
    p = run_cli("calibrate", str(path), "--hw", "h100-sxm", "-o", str(out),
                *CONFIG_ARGS, "--max-evals", "20",
                "--only", "memory")
    assert p.returncode == 0, p.stderr
    assert "memory" in p.stdout and "->" in p.stdout
    prof = hwprofiles.load(out)
    assert prof.efficiency.memory.peak_fraction == pytest.approx(0.7, rel=0.02)
    assert not list(tmp_path.glob(".*.tmp"))


def test_cli_calibrate_never_writes_a_fit_that_raised_the_error(tmp_path, monkeypatch,
                                                                 capsys):
    """A fit whose rms log error is above the starting profile's is not written: the profile
    given is (the fit is made worse on purpose here, its result swapped for a worse one)."""
    import costmodels.calibrate as cal
    from nas.cli import main

    ms = _synthetic(with_values(H100, [p for p in parameters(H100, published=True)
                                       if p.label == "memory"], [0.7]), 2)
    path = _write_measurements(tmp_path / "m.csv", ms)
    real = cal.fit

    def worse(*args, **kw):
        res = real(*args, **kw)
        res.rms_log_after = res.rms_log_before + 0.5
        return res

    monkeypatch.setattr(cal, "fit", worse)
    out = tmp_path / "fitted.json"
    assert main(["calibrate", str(path), "--hw", "h100-sxm", "-o", str(out), *CONFIG_ARGS,
                 "--max-evals", "5", "--only", "memory"]) == 0
    assert "the fit raised the error: wrote the profile given" in capsys.readouterr().out
    assert hwprofiles.load(out) == H100


@pytest.mark.parametrize("row,needle", [
    ({"metric": "latency"}, "metric"),
    ({"value": "-3"}, "value"),
    ({"tp": "0"}, "tp"),
])
def test_bad_measurement_row_is_one_line(tmp_path, row, needle):
    good = {"id": "1", "gpu": "h100-sxm", "model": "llama-3.1-8b", "precision": "fp8",
            "tp": "1", "isl": "128", "osl": "128", "metric": "throughput", "value": "1000",
            "source": "a table"}
    path = tmp_path / "bad.csv"
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(good))
        w.writeheader()
        w.writerow({**good, **row})
    with pytest.raises(InputError, match=needle):
        load_measurements(path)
    p = run_cli("calibrate", str(path), "--hw", "h100-sxm", "-o", str(tmp_path / "o.json"))
    assert p.returncode == 2 and "Traceback" not in p.stderr
    assert len(p.stderr.strip().splitlines()) == 1 and "row 2" in p.stderr
    assert not (tmp_path / "o.json").exists()


def test_json_report(tmp_path):
    p = run_cli("calibrate", str(CSV), "--hw", "h200-sxm", "--report", "--json", *CONFIG_ARGS)
    assert p.returncode == 0, p.stderr
    d = json.loads(p.stdout)
    assert d["device"] == "h200-sxm" and {r["split"] for r in d["table"]} == {"fit", "holdout"}


def test_fit_scales_a_curve_and_keeps_its_shape_and_source():
    """The grouped-GEMM tokens curve is fitted by its peak: every point scales by the same
    factor (the shape fitted to DeepGEMM's tables stays) and the source says both."""
    from costmodels.calibrate import LINK_LATENCY_BOUNDS, SHAPE_NOTE

    params = {p.label: p for p in parameters(H100)}
    cur = H100.efficiency.grouped_matmul_tokens
    assert cur is not None and len(cur.points) > 1
    p = params["grouped matmul tokens"]
    assert 0 < p.lo < p.hi <= 1.0
    hw = with_values(H100, [p], [0.5], "fitted to 3 measurements from a test")
    new = hw.efficiency.grouped_matmul_tokens
    ratio = 0.5 / cur.peak_fraction
    assert [s for s, _ in new.points] == [s for s, _ in cur.points]
    for (_, f1), (_, f0) in zip(new.points, cur.points):
        assert f1 == pytest.approx(f0 * ratio)  # exactly: the small-M end is not clipped
    assert new.source.startswith("fitted to 3 measurements from a test" + SHAPE_NOTE)
    assert new.source.endswith(cur.source.split(SHAPE_NOTE)[-1])
    again = with_values(hw, [p], [0.6], "fitted again").efficiency.grouped_matmul_tokens
    assert again.source.count(SHAPE_NOTE) == 1  # refits do not nest the note
    # the link's per-collective latency is a fitted figure inside its physical bounds
    lat = params["link latency"]
    assert (lat.lo, lat.hi) == LINK_LATENCY_BOUNDS[:2] and 1e-6 <= lat.lo < lat.hi <= 50e-6
    hw = with_values(H100, [lat], [12e-6], "fitted to a test")
    assert hw.interconnect.latency.value == 12e-6
    assert hw.interconnect.bandwidth == H100.interconnect.bandwidth


def _engine(name, step, req, overlap):
    from hwprofiles.schema import EngineProfile

    fig = {"source": "test figure"}
    return EngineProfile(name=name, display_name=name, step_overhead_s={"value": step, **fig},
                         request_overhead_s={"value": req, **fig}, overlap=overlap,
                         overlap_source="test engine")


@pytest.mark.parametrize("overlap", [False, True])
def test_fit_engines_recovers_an_engines_figures_from_two_devices(overlap):
    """One engine's step / request overheads, fitted to its rows on H100 and H200 at once
    (each at its own, fixed profile), come back; the devices are not touched. An overlapped
    step overhead shows only where it exceeds the GPU step (8B FP8 decode at c=1: ~3 ms)."""
    step = 6e-3 if overlap else 2.5e-3
    truth = {"eng": _engine("eng", step, 4e-3, overlap)}
    h200 = hwprofiles.get("h200-sxm")
    ms = [*_synthetic(H100, 8, "eng", truth),
          *_synthetic(h200, 8, "eng", truth, gpu="h200-sxm"),
          *_synthetic(h200, 4, "eng", truth, gpu="h200-sxm", model="llama-3.1-70b")]
    start = {"eng": _engine("eng", 0.5e-3, 1e-3, overlap)}
    res = fit_engines(ms, hwprofiles.get, SHAPES, engines=start, max_nfev=80)
    e = res.engines["eng"]
    assert res.rms_log_after < 1e-3 < res.rms_log_before
    assert e.step_overhead_s.value == pytest.approx(step, rel=0.02)
    assert e.request_overhead_s.value == pytest.approx(4e-3, rel=0.02)
    assert e.overlap is overlap
    assert e.step_overhead_s.source.startswith(f"fitted to {len(ms)} measurements of eng on "
                                               "h100-sxm, h200-sxm")
    for key, (lo, hi, why) in ENGINE_BOUNDS.items():
        assert 0.0 <= lo < hi <= (0.2 if key == "request_latency_s" else 20e-3) and why
    with pytest.raises(InputError, match="no engine profile"):
        fit_engines([ms[0].model_copy(update={"engine": "nope"})], hwprofiles.get, SHAPES)


def test_measurements_csv_comments_and_row_numbers(tmp_path):
    good = {"id": "1", "gpu": "h100-sxm", "model": "llama-3.1-8b", "precision": "fp8",
            "tp": "1", "isl": "128", "osl": "128", "metric": "throughput", "value": "1000",
            "source": "a table"}
    path = tmp_path / "m.csv"
    with open(path, "w", newline="") as f:
        f.write("# split: every third row is held out\n# second comment line\n")
        w = csv.DictWriter(f, fieldnames=list(good))
        w.writeheader()
        w.writerow(good)
        w.writerow({**good, "id": "2", "value": "-1"})
    with pytest.raises(InputError, match="row 5"):  # line 5 of the file
        load_measurements(path)
    assert CSV.read_text().startswith("#")  # the shipped set states its split rule


def test_cli_calibrate_engines_writes_engine_profiles(tmp_path):
    truth = {"trtllm-cpp": _engine("trtllm-cpp", 3e-3, 2e-3, False)}  # the shipped one's
    ms = [*_synthetic(H100, 5, "trtllm-cpp", truth),  # overlap flag; figures to recover
          *_synthetic(H100, 5, "trtllm-cpp", truth, model="qwen3-30b-a3b")]
    path = _write_measurements(tmp_path / "m.csv", ms)
    out = tmp_path / "engines"
    p = run_cli("calibrate", str(path), "--engines", "-o", str(out), "--max-evals", "30",
                *CONFIG_ARGS)
    assert p.returncode == 0, p.stderr
    from hwprofiles.engines import load_engine

    e = load_engine(out / "trtllm-cpp.json")
    assert e.step_overhead_s.value == pytest.approx(3e-3, rel=0.03)
    assert e.request_overhead_s.value == pytest.approx(2e-3, rel=0.03)
    assert "trtllm-cpp step overhead" in p.stdout and e.aliases  # the shipped one, refitted
    p = run_cli("calibrate", str(path), "-o", str(tmp_path / "x.json"))
    assert p.returncode == 2 and "--hw" in p.stderr
    (tmp_path / "a-file").write_text("")  # refused before the fit, in one line
    p = run_cli("calibrate", str(path), "--engines", "-o", str(tmp_path / "a-file"),
                *CONFIG_ARGS)
    assert p.returncode == 2 and "expected a folder" in p.stderr
    assert len(p.stderr.strip().splitlines()) == 1


def test_fit_engines_needs_ten_rows_over_two_models():
    """An engine is fitted only on >= MIN_ENGINE_ROWS rows covering >= MIN_ENGINE_MODELS
    models: rows of one model fit that model's error, not the engine (issue 30)."""
    from costmodels.calibrate import MIN_ENGINE_MODELS, MIN_ENGINE_ROWS

    assert (MIN_ENGINE_ROWS, MIN_ENGINE_MODELS) == (10, 2)
    truth = {"eng": _engine("eng", 2.5e-3, 4e-3, False)}
    one_model = _synthetic(H100, 8, "eng", truth)  # 13 rows, one model
    assert len(one_model) >= MIN_ENGINE_ROWS
    with pytest.raises(InputError, match="2 or more models"):
        fit_engines(one_model, hwprofiles.get, SHAPES, engines=truth)


def test_the_shipped_vllm_profile_says_it_is_not_fitted():
    from hwprofiles.engines import get_engine

    v = get_engine("vllm")
    assert not v.fitted and "not fitted" in v.fitted_note
    assert not v.step_overhead_s.source.startswith("fitted")
