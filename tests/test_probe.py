"""hwprofiles.probe and `puzzle-nas profile` on the CPU with a tiny plan: a valid profile,
real (positive) measurements, a JSON round trip, the cost model pricing with it, the CLI."""

from __future__ import annotations

import json
import math

import pytest

torch = pytest.importorskip("torch")

from conftest import LLAMA  # noqa: E402

import hwprofiles  # noqa: E402
from costmodels.dtypes import get_recipe  # noqa: E402
from costmodels.model import NonBlockShape, price_model  # noqa: E402
from hwprofiles import probe as probe_mod  # noqa: E402
from hwprofiles.errors import InputError  # noqa: E402
from hwprofiles.probe import ProbePlan, run_probe  # noqa: E402
from hwprofiles.schema import HardwareProfile  # noqa: E402
from nas.arch import FFN, Attention, blocks_table  # noqa: E402
from nas.cli import main  # noqa: E402
from nas.io import atomic_write_json  # noqa: E402

pytestmark = pytest.mark.torch

TINY = ProbePlan(
    gemm_sizes=(16, 32, 64), gemm_unaligned=(33,), m_sweep=(1, 17), m_sweep_nk=64,
    mem_bytes=(4096, 65536), attn_seqs=(16, 32), attn_shape=(1, 2, 16),
    repeats=3, warmup=1, min_time_s=1e-4, max_call_s=1.0, launch_iters=20,
)


@pytest.fixture(scope="module")
def result():
    calls = []
    res = run_probe("cpu", quick=True, threads=1, plan=TINY, name="test-cpu",
                    progress=lambda done, total, note: calls.append((done, total)))
    res.meta["progress_calls"] = calls
    return res


def test_probe_returns_a_valid_measured_profile(result):
    prof = result.profile
    assert isinstance(prof, HardwareProfile)
    assert prof.name == "test-cpu"
    assert set(prof.peak_flops) == {"bf16", "fp16"}  # fp32 is timed but not a compute dtype
    for d, f in prof.peak_flops.items():
        assert f.value > 0 and f.source.startswith("measured on ")
        assert "by puzzle-nas probe" in f.source
        assert d in prof.efficiency.matmul
    assert prof.memory_bandwidth.value > 0 and prof.memory_bandwidth.source.startswith("measured")
    assert prof.memory_bytes.value > 0
    assert 0 < prof.kernel_overhead_s.value < 1
    assert prof.gpus_per_node.value == 1 and "assumed" in prof.gpus_per_node.source
    assert "assumed" in prof.interconnect.bandwidth.source
    HardwareProfile.model_validate(json.loads(prof.model_dump_json()))


def test_efficiency_fractions_in_unit_interval(result):
    e = result.profile.efficiency
    curves = [*e.matmul.values(), e.attention, e.grouped_matmul_prefill,
              e.grouped_matmul_decode, e.memory, e.link]
    for c in curves:
        assert all(0 < f <= 1 for _, f in c.points)
    assert len(e.matmul["bf16"].points) == len(TINY.gemm_sizes)
    assert max(f for _, f in e.matmul["bf16"].points) > 0.5  # fraction of its own best rate


def test_measurements_are_raw_timings(result):
    gemms = [r for r in result.measurements if r["kind"] == "gemm"]
    # 3 dtypes x (3 square + 1 unaligned + 2 M-sweep) shapes
    assert len(gemms) == 3 * (3 + 1 + 2)
    assert {r["dtype"] for r in gemms} == {"bf16", "fp16", "fp32"}
    for r in gemms:
        assert r["seconds"] > 0
        assert math.isclose(r["flop_per_s"], 2 * r["m"] * r["n"] * r["k"] / r["seconds"])
    best = max(r["flop_per_s"] for r in gemms if r["dtype"] == "bf16")
    assert result.profile.peak("bf16") == best
    mem = [r for r in result.measurements if r["kind"] == "memory"]
    assert {(r["op"], r["moved_bytes"] // r["buffer_bytes"]) for r in mem} == {("copy", 2),
                                                                               ("triad", 3)}
    assert any(r["kind"] == "kernel_overhead" for r in result.measurements)
    assert json.loads(json.dumps(result.measurements_json()))["profile"] == "test-cpu"
    calls = result.meta["progress_calls"]
    assert calls[0][0] == 0 and calls[-1][0] == calls[-1][1]


def test_json_round_trip_and_cost_model(result, tmp_path):
    path = tmp_path / "cpu.json"
    atomic_write_json(path, result.profile.model_dump(mode="json"))
    loaded = hwprofiles.load(path)
    assert loaded == result.profile
    assert hwprofiles.get(str(path)) == loaded
    table = blocks_table([Attention(num_heads=4, num_kv_heads=2, head_dim=32), FFN(width=512)] * 2,
                         hidden=128)
    m = price_model(table, NonBlockShape(hidden=128, vocab=1000), loaded, get_recipe("bf16"),
                    ["isl=64,osl=8,batch=2"])
    assert m.ttft_s[0] > 0 and m.tpot_s[0] > 0 and math.isfinite(m.latency_s[0])
    assert bool(m.fits[0])


def test_bad_arguments_raise_input_error():
    with pytest.raises(InputError, match="unknown device"):
        run_probe("tpu")
    with pytest.raises(InputError, match="bf16"):
        run_probe("cpu", dtypes=["fp16"])
    with pytest.raises(InputError, match="unknown dtype"):
        run_probe("cpu", dtypes=["bf16", "fp7"])
    with pytest.raises(InputError, match="profile name"):
        run_probe("cpu", name="Bad Name")


@pytest.fixture
def tiny_plan(monkeypatch):
    monkeypatch.setattr(probe_mod, "default_plan", lambda kind, quick=False, memory_bytes=None:
                        TINY)


def test_cli_writes_profile_and_cost_accepts_it(tiny_plan, tmp_path, capsys):
    out = tmp_path / "sub" / "p.json"
    # --accept-noisy: microsecond GEMMs on a shared CI core may be noisy; the refusal has
    # its own test below
    rc = main(["profile", "--device", "cpu", "--quick", "--threads", "1", "--name", "my-cpu",
               "--gpus-per-node", "2", "--link-gbps", "64", "-o", str(out), "--accept-noisy"])
    assert rc == 0
    text = capsys.readouterr().out
    assert "GiB" in text and "TFLOP/s" in text and "GB/s" in text
    prof = hwprofiles.load(out)
    assert prof.name == "my-cpu" and prof.gpus_per_node.value == 2
    assert prof.interconnect.bandwidth.value == 64e9
    meas = json.loads((tmp_path / "sub" / "p.measurements.json").read_text())
    assert meas["measurements"] and meas["device_kind"] == "cpu" and meas["threads"] == 1
    assert not list((tmp_path / "sub").glob(".*.tmp"))
    rc = main(["cost", str(LLAMA), "--hw", str(out), "--workload", "isl=128,osl=16,batch=1"])
    assert rc == 0
    assert "my-cpu" in capsys.readouterr().out


def test_cli_refuses_a_noisy_probe_unless_accepted(tiny_plan, tmp_path, capsys, monkeypatch):
    """A probe whose figures are too uncertain writes nothing and exits 4, saying which;
    --accept-noisy writes it with a note (the report is forced here: a real probe on a quiet
    device is not noisy)."""
    monkeypatch.setattr(probe_mod, "noise_report", lambda log, llc=None: [
        "bf16 GEMM 64x64x64 (a figure of the profile): +-9% over 12 samples"])
    out = tmp_path / "p.json"
    assert main(["profile", "--device", "cpu", "--quick", "--threads", "1", "-o", str(out)]) == 4
    err = capsys.readouterr().err
    assert "too noisy to trust" in err and "bf16 GEMM 64x64x64" in err and "--accept-noisy" in err
    assert not out.exists() and not (tmp_path / "p.measurements.json").exists()
    assert "Traceback" not in err
    assert main(["profile", "--device", "cpu", "--quick", "--threads", "1", "-o", str(out),
                 "--accept-noisy"]) == 0
    assert "written anyway" in capsys.readouterr().out and out.is_file()


def test_repeats_reach_the_stated_confidence_and_drop_slow_outliers(result):
    from hwprofiles.probe import MAX_REPEAT_FACTOR, TARGET_RSE, robust

    med, spread, rejected = robust([1.0, 1.01, 0.99, 1.0, 1.02, 0.98, 5.0])
    assert med == pytest.approx(1.0) and rejected == 1 and spread < 0.05
    assert robust([2.0, 2.0, 2.0]) == (2.0, 0.0, 0)
    timed = [r for r in result.measurements if r["kind"] in ("gemm", "memory", "attention")]
    assert timed and all("spread" in r and "rejected" in r for r in timed)
    for r in timed:  # each point reached the target or used every repeat it was allowed
        assert r["spread"] <= TARGET_RSE or r["repeats"] >= MAX_REPEAT_FACTOR * TINY.repeats \
            or r["repeats"] == 1  # a slow first call is timed once
    assert "standard error of the median" in result.profile.peak_flops["bf16"].source


def test_curves_are_smoothed_and_buffers_pass_the_cache():
    from hwprofiles.probe import isotonic, noise_report, past_cache

    pts = [(1.0, 0.2), (2.0, 0.6), (3.0, 0.4), (4.0, 0.9)]
    assert isotonic(pts) == [(1.0, 0.2), (2.0, 0.5), (3.0, 0.5), (4.0, 0.9)]
    assert isotonic(pts[:2]) == pts[:2]
    plan = past_cache(TINY, llc=3 * 2**20, memory_bytes=2**30)
    assert 16 * 2**20 in plan.mem_bytes and 32 * 2**20 in plan.mem_bytes
    assert set(TINY.mem_bytes) <= set(plan.mem_bytes)
    assert past_cache(TINY, llc=3 * 2**20, memory_bytes=2**27).mem_bytes[-1] <= 2**27 / 8
    assert past_cache(TINY, llc=None) == TINY
    log = [{"kind": "kernel_overhead", "seconds": 1e-6, "spread": 0.2, "repeats": 20},
           *({"kind": "gemm", "dtype": "bf16", "m": s, "n": s, "k": s, "flop_per_s": s,
              "spread": sp, "repeats": 20} for s, sp in ((16, 0.01), (32, 0.09), (64, 0.01)))]
    why = noise_report(log)
    assert any(w.startswith("kernel overhead (a figure of the profile)") for w in why)
    assert any(w.startswith("bf16 GEMMs: 1 of 3") for w in why)
    assert noise_report([{**r, "spread": 0.01} for r in log]) == []


def test_cli_bad_device_is_a_one_line_error(tmp_path, capsys):
    out = tmp_path / "p.json"
    assert main(["profile", "--device", "tpu", "-o", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "unknown device 'tpu'" in err
    assert not out.exists()
    if not torch.cuda.is_available():
        assert main(["profile", "--device", "cuda", "-o", str(out)]) == 2
        assert "CUDA is not available" in capsys.readouterr().err


def test_cli_module_does_not_import_torch():
    import subprocess
    import sys

    code = "import sys, nas.cli, nas.cli.profile, hwprofiles.probe; print('torch' in sys.modules)"
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert res.stdout.strip() == "False"
