"""hwprofiles.probe.derive on synthetic measurement logs: the CUDA derivation checked by hand
without a GPU (and without torch), and what changes on a CPU log."""

from __future__ import annotations

import dataclasses

import pytest

from hwprofiles.errors import InputError
from hwprofiles.probe import DeviceInfo, derive

LLC = 50 * 2**20
OVERHEAD = 5e-6
H100 = DeviceInfo(kind="cuda", name="NVIDIA H100 80GB HBM3", vendor="nvidia",
                  memory_bytes=85_520_809_984.0, memory_how="from the driver", llc=LLC,
                  llc_how="L2 from the device properties", dtypes=("bf16", "fp16", "fp32", "fp8"),
                  date="2026-11-30", torch_version="2.13.0", launch_iters=200, visible_gpus=8)


def _gemm(dtype: str, m: int, n: int, k: int, seconds: float, role: str) -> dict:
    flops = 2.0 * m * n * k
    return {"kind": "gemm", "dtype": dtype, "role": role, "m": m, "n": n, "k": k,
            "flops": flops, "seconds": seconds, "repeats": 5, "flop_per_s": flops / seconds}


def _mem(op: str, buffer: int, rate: float) -> dict:
    moved = (2 if op == "copy" else 3) * buffer
    return {"kind": "memory", "op": op, "buffer_bytes": buffer, "moved_bytes": moved,
            "seconds": moved / rate, "repeats": 5, "bytes_per_s": rate}


def _log(big_buffers: bool = True) -> list[dict]:
    """bf16 peaks at 800 TFLOP/s (fp8 1500), reached at fractions 0.25 / 0.8 / 1 of it by
    1024^3 / 4096^3 / 8192^3 squares; an M=17 GEMM at 5 %; copies at 9 TB/s in a 1 MiB
    (cache-resident) buffer and 3.0 / 3.2 TB/s at 256 MiB / 1 GiB; attention at 30 % and
    60 % of the bf16 peak."""
    log: list[dict] = [{"kind": "kernel_overhead", "op": "1-element add", "iters": 200,
                        "seconds": OVERHEAD}]
    for dtype, peak in (("bf16", 800e12), ("fp8", 1500e12), ("fp32", 50e12)):
        for s, frac in ((1024, 0.25), (4096, 0.8), (8192, 1.0)):
            log.append(_gemm(dtype, s, s, s, 2.0 * s**3 / (peak * frac), "square"))
        log.append(_gemm(dtype, 17, 4096, 4096, 2.0 * 17 * 4096**2 / (peak * 0.05), "m_sweep"))
    log.append({"kind": "skipped", "dtype": "fp8", "role": "unaligned", "m": 33, "n": 33,
                "k": 33, "flops": 71874.0, "reason": "fp8 needs multiples of 16"})
    sizes = ((2**20, 9e12), (256 * 2**20, 3.0e12), (2**30, 3.2e12))
    for buffer, rate in sizes if big_buffers else sizes[:1]:
        log.append(_mem("copy", buffer, rate))
        log.append(_mem("triad", buffer, rate * 0.9))
    for seq, frac in ((1024, 0.3), (4096, 0.6)):
        flops = 4.0 * 4 * 16 * seq * seq * 128
        log.append({"kind": "attention", "dtype": "bf16", "batch": 4, "heads": 16, "seq": seq,
                    "head_dim": 128, "causal": False, "flops": flops,
                    "seconds": flops / (800e12 * frac), "repeats": 5,
                    "flop_per_s": 800e12 * frac})
    return log


def test_cuda_derivation_by_hand():
    prof = derive(_log(), H100)
    assert prof.name == "nvidia-h100-80gb-hbm3" and prof.vendor == "nvidia"
    # peaks: the best GEMM rate per compute dtype (fp32 kept out, fp16 never timed)
    assert set(prof.peak_flops) == {"bf16", "fp8"}
    assert prof.peak("bf16") == pytest.approx(800e12) and prof.peak("fp8") == pytest.approx(1500e12)
    assert "(8192x8192x8192)" in prof.peak_flops["bf16"].source
    # the GEMM curve: square GEMMs only (the M=17 GEMM stays out), times used as measured
    for d in ("bf16", "fp8"):
        pts = prof.efficiency.matmul[d].points
        assert [s for s, _ in pts] == [2.0 * s**3 for s in (1024, 4096, 8192)]
        assert [f for _, f in pts] == pytest.approx([0.25, 0.8, 1.0])
    # bandwidth: the best rate at buffers >= 4x the 50 MiB L2, not the 9 TB/s cache hit
    assert prof.memory_bandwidth.value == pytest.approx(3.2e12)
    assert "copy" in prof.memory_bandwidth.source and ">= 4x" in prof.memory_bandwidth.source
    mem = dict(prof.efficiency.memory.points)
    assert mem[2 * 2**20] == 1.0  # the cache-resident copy is held at 1.0
    assert mem[2 * 2**30] == pytest.approx(1.0) and mem[3 * 2**30] == pytest.approx(0.9)
    assert mem[2 * 256 * 2**20] == pytest.approx(3.0 / 3.2, rel=1e-3)
    # attention: fractions of the measured bf16 peak
    assert [f for _, f in prof.efficiency.attention.points] == pytest.approx([0.3, 0.6])
    # device facts and counts read, not timed
    assert prof.kernel_overhead_s.value == OVERHEAD
    assert prof.memory_bytes.value == H100.memory_bytes and prof.l2_bytes.value == LLC
    assert prof.gpus_per_node.value == 8 and "device_count" in prof.gpus_per_node.source
    # what the probe cannot measure is labelled assumed, and counted
    assert set(prof.assumed_figures()) == {
        "efficiency.grouped_matmul_prefill", "efficiency.grouped_matmul_decode",
        "efficiency.link", "interconnect.bandwidth", "interconnect.latency"}


def test_user_figures_replace_the_assumptions():
    prof = derive(_log(), H100, name="mine", gpus_per_node=4, link_name="NVLink 4",
                  link_bandwidth=450e9, link_latency_s=8e-6)
    assert prof.name == "mine" and prof.interconnect.name == "NVLink 4"
    assert prof.interconnect.bandwidth.value == 450e9 and prof.gpus_per_node.value == 4
    assert "given by the user" in prof.interconnect.latency.source
    assert set(prof.assumed_figures()) == {"efficiency.grouped_matmul_prefill",
                                           "efficiency.grouped_matmul_decode", "efficiency.link"}


def test_cpu_log_subtracts_the_dispatch_overhead():
    cpu = dataclasses.replace(H100, kind="cpu", visible_gpus=None, threads=1)
    prof = derive(_log(), cpu)
    secs = 2.0 * 1024**3 / (800e12 * 0.25)
    want = 2.0 * 1024**3 / (800e12 * (secs - OVERHEAD))
    assert prof.efficiency.matmul["bf16"].points[0][1] == pytest.approx(want, rel=1e-3)
    assert want > 0.25  # the subtraction is visible at this size
    assert prof.gpus_per_node.value == 1 and "assumed" in prof.gpus_per_node.source
    assert "subtracted" in prof.efficiency.matmul["bf16"].source


def test_small_buffers_and_missing_records():
    prof = derive(_log(big_buffers=False), H100)
    assert prof.memory_bandwidth.value == pytest.approx(9e12)
    assert "may overstate" in prof.memory_bandwidth.source
    no_bf16 = [r for r in _log() if r.get("dtype") != "bf16"]
    with pytest.raises(InputError, match="no bf16 GEMM"):
        derive(no_bf16, H100)
    with pytest.raises(InputError, match="no memory benchmark"):
        derive([r for r in _log() if r["kind"] != "memory"], H100)
    with pytest.raises(InputError, match="kernel_overhead"):
        derive(_log()[1:], H100)
