"""Profile a device with torch microbenchmarks and turn the timings into a :class:`HardwareProfile`.

``probe(device)`` returns the profile; ``run_probe(device)`` also returns the raw timings
(:class:`ProbeResult`), which the schema has no room for (``extra="forbid"``) and which the
CLI writes to a separate ``*.measurements.json`` file. torch is imported lazily, inside the
functions, so ``import hwprofiles`` never needs it.

What is measured (FACTS.md section 6):

* **GEMM** ``C[M,N] = A[M,K] @ B[K,N]`` per dtype (bf16, fp16, fp32; fp8 via
  ``torch._scaled_mm`` only where it runs on the device): square sizes for the efficiency
  curve, an M sweep at fixed N=K with sizes straddling tile boundaries (16/17, 32/33, ...)
  and a few unaligned squares, recorded raw. FLOPs = ``2*M*N*K``.
* **Memory**: copy (``dst.copy_(src)``, 2 bytes moved per byte of buffer) and triad
  (``a = b + s*c``, 3 bytes moved) over buffer sizes, counting read + write bytes.
* **Attention**: ``scaled_dot_product_attention`` in bf16 (non-causal, FLOPs =
  ``4*B*H*S*S*D``), as a fraction of the measured bf16 peak.
* **Kernel overhead**, measured apart: the time of a 1-element add, back to back.
* **Eager figures** (:class:`hwprofiles.schema.EagerFigures`, what pricing timed eager
  blocks needs: ``costmodels.eager``): the time of a view (``x.view(1)``, no kernel) back
  to back, and the bytes per second of an eager elementwise multiply ``a * b`` per dtype
  (bf16, fp16, fp32) at a few sizes.

Timing: on CUDA, CUDA events around each call after warm-up, the L2 cache flushed (a buffer
of twice its size zeroed) before every timed call so that weights stream from device memory;
the median over repeats. The flush is queued ahead of the timed call, so the events bracket
GPU execution only and launch cost is not in them. On CPU, a fixed thread count and, around
a block of calls (sized to a minimum duration), ``time.thread_time`` with one thread (the
thread's CPU time: another process's turn on the core is not counted, as in the block
timer) or ``time.perf_counter`` with several, the median over repeats; the per-call dispatch cost *is* in those times, so it is subtracted (as the measured
kernel overhead) before computing efficiency fractions, as the cost model adds it back.

Derived figures: peak FLOP/s per dtype = best achieved over all GEMM shapes (dense, measured,
not a datasheet number, so large GEMMs sit near fraction 1.0); memory bandwidth = best
copy/triad rate at buffer sizes beyond 4x the last-level cache (or at the largest size, said
so in the source); efficiency curves = achieved fraction vs op size (FLOPs or bytes moved).
Units: bytes, bytes/s, FLOP/s, seconds.
"""

from __future__ import annotations

import datetime as _dt
import math
import os
import platform
import re
import statistics
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

from hwprofiles.errors import InputError
from hwprofiles.schema import (
    COMPUTE_DTYPES,
    EagerFigures,
    Efficiency,
    EfficiencyCurve,
    Figure,
    HardwareProfile,
    Interconnect,
)

__all__ = ["DeviceInfo", "ProbePlan", "ProbeResult", "default_plan", "derive", "isotonic",
           "median_rse", "noise_report", "noisy_points", "past_cache", "probe", "robust",
           "run_probe"]

#: dtypes the probe knows how to time (fp32 is timed but is not a profile compute dtype)
PROBE_DTYPES = ("bf16", "fp16", "fp32", "fp8")

ProgressFn = Callable[[int, int, str], None]
"""``progress(done, total, note)``: called before each benchmark step and once at the end."""


@dataclass(frozen=True)
class ProbePlan:
    """What to time. Sizes are matrix dimensions (elements) or buffer sizes (bytes)."""

    gemm_sizes: tuple[int, ...]
    """Square M=N=K sizes for the matmul efficiency curve (tile-aligned)."""
    gemm_unaligned: tuple[int, ...]
    """Extra square sizes off tile boundaries (e.g. 1025), recorded raw only."""
    m_sweep: tuple[int, ...]
    """M values (tokens) at N=K=``m_sweep_nk``, straddling tile boundaries; recorded raw."""
    m_sweep_nk: int
    mem_bytes: tuple[int, ...]
    """Buffer sizes in bytes for copy and triad."""
    attn_seqs: tuple[int, ...]
    """Sequence lengths for bf16 attention at ``attn_shape`` = (batch, heads, head_dim)."""
    attn_shape: tuple[int, int, int]
    repeats: int
    warmup: int
    min_time_s: float
    """CPU: a timed block of calls lasts at least this long (seconds)."""
    max_call_s: float
    """A call slower than this (seconds) is timed once and larger sizes of its kind skipped."""
    launch_iters: int
    """Back-to-back tiny ops per kernel-overhead sample."""
    elem_sizes: tuple[int, ...] = ()
    """Elements per operand of the eager elementwise multiply timed per dtype (the eager
    figures: :class:`hwprofiles.schema.EagerFigures`); () times none."""


GEMM_CALL_SIZE = 256
"""``n = k`` of the 1-row GEMM whose time is the GEMM library's cost per call
(:meth:`_Probe.bench_gemm_call`): big enough to take the library path the blocks' GEMMs take
(a bf16 GEMM of under ~4k multiply-adds runs a small-shape path on this project's CPU, 3 us
against 20-25 us), small enough that its weights (128 KiB in bf16) stay in cache and stream
in a small part of the call (the whole 1-row call: 21 us in bf16, 9 us in fp32 there)."""


def default_plan(kind: str, quick: bool = False, memory_bytes: float | None = None) -> ProbePlan:
    """The plan for device kind ``"cuda"`` or ``"cpu"``; ``quick`` trims sizes and repeats.

    ``memory_bytes`` (device memory) caps the memory-sweep buffers at 1/8 of it (triad holds
    three).
    """
    straddle = (1, 16, 17, 32, 33, 64, 65, 128, 129, 256, 257)
    if kind == "cuda":
        plan = ProbePlan(
            gemm_sizes=(256, 1024, 4096, 8192) if quick else
            (256, 512, 1024, 2048, 4096, 8192, 16384),
            gemm_unaligned=(1025, 4097) if quick else (1025, 2049, 4097, 8193),
            m_sweep=straddle if quick else (*straddle, 512, 1024, 2048, 4096),
            m_sweep_nk=4096,
            mem_bytes=tuple(2**e for e in ((20, 24, 28, 30) if quick else range(20, 32, 1))),
            attn_seqs=(1024, 4096) if quick else (512, 1024, 2048, 4096, 8192),
            attn_shape=(4, 32, 128),
            repeats=10 if quick else 30, warmup=3 if quick else 10,
            min_time_s=0.0, max_call_s=0.5 if quick else 2.0, launch_iters=1000,
            elem_sizes=(2**20, 2**24),
        )
    else:
        plan = ProbePlan(
            gemm_sizes=(64, 256, 512, 1024) if quick else (64, 128, 256, 512, 1024, 2048),
            gemm_unaligned=(257,) if quick else (257, 1025),
            m_sweep=(1, 16, 17, 64, 65) if quick else straddle,
            m_sweep_nk=1024,
            mem_bytes=tuple(2**e for e in ((16, 20, 24, 26) if quick else (*range(16, 31, 2), 31))),
            attn_seqs=(64, 256) if quick else (64, 256, 1024),
            attn_shape=(1, 8, 64),
            repeats=5 if quick else 15, warmup=1 if quick else 3,
            min_time_s=0.002 if quick else 0.02, max_call_s=0.25 if quick else 1.0,
            launch_iters=200, elem_sizes=(2**15, 2**18, 2**20),
        )
    if memory_bytes:
        cap = memory_bytes / 8
        kept = tuple(b for b in plan.mem_bytes if b <= cap) or plan.mem_bytes[:1]
        plan = _replace(plan, mem_bytes=kept)
    return plan


def _replace(plan: ProbePlan, **kw: Any) -> ProbePlan:
    from dataclasses import replace

    return replace(plan, **kw)


def past_cache(plan: ProbePlan, llc: int | None, memory_bytes: float | None = None
               ) -> ProbePlan:
    """``plan`` with memory buffers of 4x and 8x the last-level cache added (each a power of
    two, at most 1/8 of the device's memory), so that the bandwidth is a device-memory rate,
    not a cache rate, and two sizes past the cache show whether the rate has settled."""
    if not llc:
        return plan
    cap = memory_bytes / 8 if memory_bytes else math.inf
    extra = {2 ** math.ceil(math.log2(f * llc)) for f in (4, 8)}
    sizes = tuple(sorted({*plan.mem_bytes, *(b for b in extra if b <= cap)}))
    return _replace(plan, mem_bytes=sizes)


@dataclass
class ProbeResult:
    """A probe's profile and everything behind it.

    ``measurements``: one dict per timed (or skipped) benchmark, with ``seconds`` the median
    time of one call and the rate it implies (``flop_per_s`` or ``bytes_per_s``).
    ``meta``: device, date, torch version, thread count, timing method, plan.
    """

    profile: HardwareProfile
    measurements: list[dict[str, Any]] = field(default_factory=list)
    meta: dict[str, Any] = field(default_factory=dict)
    noisy: list[str] = field(default_factory=list)
    """Why the timings are too noisy to trust (:func:`noise_report`); [] when they are not."""
    noisy_points: list[str] = field(default_factory=list)
    """Every timed point whose spread is above :data:`NOISY_SPREAD` (:func:`noisy_points`)."""

    def measurements_json(self) -> dict[str, Any]:
        """The raw timings as a JSON-ready dict (what ``puzzle-nas profile`` writes beside
        the profile)."""
        return {"profile": self.profile.name, **self.meta, "measurements": self.measurements}


def probe(device: str = "cuda", quick: bool = False, dtypes: Iterable[str] | None = None,
          progress: ProgressFn | None = None, **kw: Any) -> HardwareProfile:
    """Measure ``device`` (``"cuda"``, ``"cuda:N"`` or ``"cpu"``) and return its profile.

    See :func:`run_probe` for the arguments; this drops the raw measurements.
    """
    return run_probe(device, quick=quick, dtypes=dtypes, progress=progress, **kw).profile


def run_probe(device: str = "cuda", quick: bool = False, dtypes: Iterable[str] | None = None,
              progress: ProgressFn | None = None, *, name: str | None = None,
              threads: int | None = None, plan: ProbePlan | None = None,
              gpus_per_node: int | None = None, link_name: str | None = None,
              link_bandwidth: float | None = None, link_latency_s: float | None = None
              ) -> ProbeResult:
    """Measure ``device`` and return its profile with the raw timings.

    ``dtypes``: GEMM dtypes to time, from ``bf16, fp16, fp32, fp8`` (bf16 is required by the
    schema; default: all the device supports, fp8 only where ``torch._scaled_mm`` runs).
    ``threads``: CPU threads (default: torch's current count), fixed for the whole probe.
    ``plan``: sizes and repeats (default :func:`default_plan`). ``name``: profile name
    (default from the device name). ``gpus_per_node``, ``link_name``, ``link_bandwidth``
    (bytes/s per direction) and ``link_latency_s`` (seconds per collective) are not measured:
    given here they are labelled as user-supplied, else filled with labelled assumptions.
    Bad arguments raise :class:`InputError`.
    """
    kind, index = _parse_device(device)
    want = _parse_dtypes(dtypes)
    if name is not None and not re.fullmatch(r"[a-z0-9][a-z0-9._-]*", name):
        raise InputError(f"invalid profile name {name!r}; use lowercase letters, digits, '.', "
                         "'_' and '-', starting with a letter or digit", field="name")
    if threads is not None and threads < 1:
        raise InputError(f"must be >= 1, got {threads}", field="threads")
    if gpus_per_node is not None and gpus_per_node < 1:
        raise InputError(f"must be >= 1, got {gpus_per_node}", field="gpus_per_node")
    for label, v in (("link_bandwidth", link_bandwidth), ("link_latency_s", link_latency_s)):
        if v is not None and not (math.isfinite(v) and v > 0):
            raise InputError(f"must be a positive number, got {v}", field=label)
    try:
        import torch
    except ImportError:
        raise InputError("profiling needs torch: pip install 'puzzle-nas[torch]'") from None

    if kind == "cuda":
        if not torch.cuda.is_available():
            raise InputError(f"device {device!r}: CUDA is not available to torch "
                             f"{torch.__version__} on this machine; use --device cpu")
        if index >= torch.cuda.device_count():
            raise InputError(f"device {device!r}: only {torch.cuda.device_count()} CUDA "
                             "device(s) visible")
    old_threads = torch.get_num_threads()
    if kind == "cpu" and threads is not None:
        torch.set_num_threads(threads)
    try:
        with torch.inference_mode():
            return _Probe(torch, kind, index, want, plan, quick, progress).run(
                name=name, gpus_per_node=gpus_per_node, link_name=link_name,
                link_bandwidth=link_bandwidth, link_latency_s=link_latency_s)
    finally:
        torch.set_num_threads(old_threads)


def _parse_device(device: str) -> tuple[str, int]:
    d = str(device).strip().lower()
    if d == "cpu":
        return "cpu", 0
    m = re.fullmatch(r"cuda(?::(\d+))?", d)
    if m:
        return "cuda", int(m.group(1) or 0)
    raise InputError(f"unknown device {device!r}; expected cuda, cuda:N or cpu", field="device")


def _parse_dtypes(dtypes: Iterable[str] | None) -> tuple[str, ...] | None:
    if dtypes is None:
        return None
    out = tuple(dict.fromkeys(str(d).strip().lower() for d in dtypes))
    bad = [d for d in out if d not in PROBE_DTYPES]
    if bad:
        raise InputError(f"unknown dtype(s) {bad}; expected some of {list(PROBE_DTYPES)}",
                         field="dtypes")
    if "bf16" not in out:
        raise InputError("bf16 must be among the dtypes (a profile needs a bf16 peak)",
                         field="dtypes")
    return out


def _slug(text: str) -> str:
    s = re.sub(r"\((r|tm|c)\)", "", text.lower())
    s = re.sub(r"[^a-z0-9.]+", "-", s).strip("-.")
    return s or "device"


def _cpu_info() -> tuple[str, str]:
    """(model name, vendor) of the host CPU, from /proc/cpuinfo where there is one."""
    model, vendor = "", ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, val = line.partition(":")
            key = key.strip()
            if key == "model name" and not model:
                model = val.strip()
            elif key == "vendor_id" and not vendor:
                vendor = val.strip()
    except OSError:
        pass
    model = model or platform.processor() or platform.machine() or "cpu"
    vendors = {"genuineintel": "intel", "authenticamd": "amd"}
    return model, vendors.get(vendor.lower(), vendor.lower() or "unknown")


def _cpu_llc() -> tuple[int | None, str]:
    """(bytes, where from) of the largest CPU cache listed under /sys, or (None, why not)."""
    best, level = 0, 0
    base = Path("/sys/devices/system/cpu/cpu0/cache")
    try:
        for d in base.glob("index*"):
            lvl = int((d / "level").read_text())
            txt = (d / "size").read_text().strip().upper()
            mult = {"K": 2**10, "M": 2**20, "G": 2**30}.get(txt[-1:], 1)
            size = int(txt.rstrip("KMG")) * mult
            if (lvl, size) > (level, best):
                best, level = size, lvl
    except (OSError, ValueError):
        best = 0
    if best:
        return best, f"level-{level} cache size read from {base}"
    return None, "no cache sizes under /sys"


def _median(xs: Sequence[float]) -> float:
    return float(statistics.median(xs))


TARGET_RSE = 0.01
"""The stated confidence: samples are added until the relative standard error of a point's
median is at most 1 % (``1.2533 * robust sigma / sqrt(n)`` over the median), up to
:data:`MAX_REPEAT_FACTOR` times the plan's repeats."""
MAX_REPEAT_FACTOR = 4
OUTLIER_SIGMAS = 4.0
"""A sample more than this many robust sigmas above the median is another tenant's turn
(preemption, a page fault, a frequency dip): dropped. Only the slow side: nothing makes a
call faster than the device can run it."""
NOISY_SPREAD = 0.05
"""A figure whose median is this uncertain or more (relative standard error, after the
repeats :data:`TARGET_RSE` asks for) is noisy: the probe says so, and ``puzzle-nas profile``
exits non-zero unless ``--accept-noisy``."""


def robust(samples: Sequence[float]) -> tuple[float, float, int]:
    """``(median, relative spread, rejected)`` of per-call seconds: samples above
    ``median + OUTLIER_SIGMAS * sigma`` dropped (``sigma = 1.4826 * MAD``, the normal-
    consistent robust deviation), then the median and ``sigma / median`` of the rest."""
    xs = [float(x) for x in samples]
    med = _median(xs)
    sigma = 1.4826 * _median([abs(x - med) for x in xs])
    kept = [x for x in xs if x <= med + OUTLIER_SIGMAS * sigma] if sigma > 0 else xs
    med = _median(kept)
    sig = 1.4826 * _median([abs(x - med) for x in kept])
    return med, (sig / med if med > 0 else 0.0), len(xs) - len(kept)


def median_rse(samples: Sequence[float]) -> float:
    """Relative standard error of the median of ``samples`` (after :func:`robust`)."""
    med, spread, rejected = robust(samples)
    n = len(samples) - rejected
    return 1.2533 * spread / math.sqrt(max(n, 1))


def isotonic(points: Sequence[tuple[float, float]]) -> list[tuple[float, float]]:
    """The non-decreasing fit of ``(size, fraction)`` points sorted by size, closest in
    squared error (pool adjacent violators, equal weights): efficiency never falls as the
    work grows within one cache regime, so a dip is timing noise."""
    blocks: list[list[float]] = []  # [sum, count]
    for _, y in points:
        blocks.append([y, 1.0])
        while len(blocks) > 1 and blocks[-2][0] / blocks[-2][1] > blocks[-1][0] / blocks[-1][1]:
            a, b = blocks.pop(), blocks.pop()
            blocks.append([a[0] + b[0], a[1] + b[1]])
    out: list[float] = []
    for total, n in blocks:
        out += [total / n] * int(n)
    return [(x, float(f"{y:.4g}")) for (x, _), y in zip(points, out)]


def _departures(raw: Sequence[tuple[float, float]], smooth: Sequence[tuple[float, float]],
                limit: float = 0.25) -> int:
    """How many raw points the smoothed curve moved by more than ``limit`` (relative)."""
    return sum(abs(b - a) > limit * max(b, 1e-12) for (_, a), (_, b) in zip(raw, smooth))


def _curve_points(pairs: Iterable[tuple[float, float]]) -> list[tuple[float, float]]:
    """Sorted, de-duplicated (best fraction per size), fractions clamped into (0, 1]."""
    best: dict[float, float] = {}
    for size, frac in pairs:
        if size > 0 and math.isfinite(frac):
            best[float(size)] = max(best.get(float(size), 0.0), frac)
    return [(s, float(f"{min(max(f, 1e-4), 1.0):.4g}")) for s, f in sorted(best.items())]


def _spread(rec: dict[str, Any]) -> str:
    """`` (+-1.2 % of 15 samples, 1 rejected)`` of a timed record: the relative standard
    error of its median ("" without one)."""
    if "spread" not in rec:
        return ""
    n, rej = rec.get("repeats"), rec.get("rejected", 0)
    return (f" (+-{rec['spread']:.1%} standard error of the median"
            + (f" of {n} samples" if n else "")
            + (f", {rej} rejected as outliers" if rej else "") + ")")


def _smoothed(raw: Sequence[tuple[float, float]], pts: Sequence[tuple[float, float]]) -> str:
    moved = _departures(raw, pts)
    return ("; smoothed non-decreasing in size (pool adjacent violators; raw fractions in the "
            "measurements)" + (f", {moved} of {len(raw)} points moved by more than 25 %"
                               if moved else ""))


def _what(r: dict[str, Any]) -> str:
    if r["kind"] == "gemm":
        return f"{r['dtype']} GEMM {r['m']}x{r['n']}x{r['k']}"
    if r["kind"] == "memory":
        return f"{r['op']} {r['buffer_bytes'] / 2**20:g} MiB"
    if r["kind"] == "attention":
        return f"attention S={r['seq']}"
    if r["kind"] == "elementwise":
        return f"{r['dtype']} elementwise multiply of {r['elements']} elements"
    if r["kind"] == "view_overhead":
        return "view overhead"
    return "kernel overhead"


def noisy_points(log: Sequence[dict[str, Any]], limit: float = NOISY_SPREAD) -> list[str]:
    """Every timed record whose robust spread is above ``limit``, one line each."""
    return [f"{_what(r)}: +-{r['spread']:.0%} over {r.get('repeats', '?')} samples"
            for r in log if r.get("spread", 0.0) > limit]


def noise_report(log: Sequence[dict[str, Any]], llc: int | None = None,
                 limit: float = NOISY_SPREAD) -> list[str]:
    """Why a measurement log is too noisy to trust ([] when it is not): a figure of the
    profile timed with a spread above ``limit`` (the kernel overhead, the GEMM that sets a
    dtype's peak, the copy or triad that sets the bandwidth), or more than a quarter of a
    curve's points (GEMMs of one dtype, memory, attention) above it."""
    out = []
    timed = [r for r in log if "spread" in r]
    key = [r for r in timed if r["kind"] in ("kernel_overhead", "view_overhead")]
    for d in {r["dtype"] for r in timed if r["kind"] == "gemm"}:
        key.append(max((r for r in timed if r["kind"] == "gemm" and r["dtype"] == d),
                       key=lambda r: r["flop_per_s"]))
    mem = [r for r in timed if r["kind"] == "memory"]
    big = [r for r in mem if llc and r["buffer_bytes"] >= 4 * llc] or mem
    if big:
        key.append(max(big, key=lambda r: r["bytes_per_s"]))
    out += [f"{_what(r)} (a figure of the profile): +-{r['spread']:.0%} over "
            f"{r.get('repeats', '?')} samples" for r in key if r["spread"] > limit]
    groups: dict[str, list[dict[str, Any]]] = {}
    for r in timed:
        if r["kind"] in ("gemm", "memory", "attention"):
            groups.setdefault(r["dtype"] + " GEMMs" if r["kind"] == "gemm" else r["kind"],
                              []).append(r)
    for name, rows in sorted(groups.items()):
        bad = sum(r["spread"] > limit for r in rows)
        if bad * 4 > len(rows):
            out.append(f"{name}: {bad} of {len(rows)} points uncertain by more than "
                       f"{limit:.0%}")
    return out


@dataclass(frozen=True)
class DeviceInfo:
    """What a probe reads of a device without timing it (the rest is the measurement log).

    ``kind``: ``"cuda"`` or ``"cpu"``; ``memory_how`` / ``llc_how``: how the memory size and
    last-level cache size were read; ``visible_gpus``: CUDA devices visible on the host
    (None on CPU); ``launch_iters``: kernels launched back to back to time the overhead.
    """

    kind: str
    name: str
    vendor: str
    memory_bytes: float
    memory_how: str
    llc: int | None
    llc_how: str
    dtypes: tuple[str, ...]
    date: str
    torch_version: str
    threads: int | None = None
    quick: bool = False
    launch_iters: int = 0
    visible_gpus: int | None = None


def derive(log: Sequence[dict[str, Any]], device: DeviceInfo, *, name: str | None = None,
           gpus_per_node: int | None = None, link_name: str | None = None,
           link_bandwidth: float | None = None, link_latency_s: float | None = None
           ) -> HardwareProfile:
    """The profile a measurement log implies (pure: no torch, no device).

    ``log``: the records :func:`run_probe` writes (``ProbeResult.measurements``), one of
    them ``{"kind": "kernel_overhead", "seconds": ...}``; ``device``: what was read of the
    device. The other arguments are as for :func:`run_probe`. Raises :class:`InputError`
    when the log has no bf16 GEMM or no memory benchmark.
    """
    kind = device.kind
    src = f"measured on {device.name} {device.date} by puzzle-nas probe"
    ovh = [r for r in log if r["kind"] == "kernel_overhead"]
    if not ovh:
        raise InputError("the measurement log has no kernel_overhead record")
    overhead = float(ovh[-1]["seconds"])

    def net(secs: float) -> float:
        """Seconds of work in a timed call: on CPU the dispatch overhead is in the timing."""
        return max(secs - overhead, 1e-12) if kind == "cpu" else secs

    net_note = " (measured kernel overhead subtracted from each time)" if kind == "cpu" else ""
    gemms = [r for r in log if r["kind"] == "gemm"]
    peaks: dict[str, Figure] = {}
    matmul: dict[str, EfficiencyCurve] = {}
    for d in device.dtypes:
        rows = [r for r in gemms if r["dtype"] == d]
        if not rows:
            continue
        best = max(rows, key=lambda r: r["flop_per_s"])
        if d not in COMPUTE_DTYPES:  # fp32: kept in the measurements only
            continue
        peak = best["flop_per_s"]
        peaks[d] = Figure(value=peak, source=f"{src}: best achieved dense {d} GEMM "
                          f"({best['m']}x{best['n']}x{best['k']}){_spread(best)}, not a "
                          "datasheet figure")
        sq = [r for r in rows if r["role"] == "square"] or rows
        raw = _curve_points((r["flops"], r["flops"] / (peak * net(r["seconds"])))
                            for r in sq)
        pts = isotonic(raw)
        matmul[d] = EfficiencyCurve(points=pts, source=f"{src}: square {d} GEMMs, achieved "
                                    "fraction of the measured peak vs FLOPs"
                                    + net_note + _smoothed(raw, pts))
    if "bf16" not in peaks:
        raise InputError(f"no bf16 GEMM could be timed on {device.name}; see the "
                         "measurements for the reasons")

    # memory bandwidth: best copy/triad rate at buffers beyond 4x the last-level cache
    mem = [r for r in log if r["kind"] == "memory"]
    if not mem:
        raise InputError(f"no memory benchmark could be timed on {device.name}")
    big = [r for r in mem if device.llc and r["buffer_bytes"] >= 4 * device.llc]
    if big:
        bw_rows, how = big, "buffers >= 4x the last-level cache"
    else:
        largest = max(r["buffer_bytes"] for r in mem)
        bw_rows = [r for r in mem if r["buffer_bytes"] == largest]
        how = (f"the largest buffer timed ({largest / 2**20:g} MiB), which is not beyond 4x "
               "the last-level cache, so this may overstate device-memory bandwidth")
    bw_best = max(bw_rows, key=lambda r: r["bytes_per_s"])
    bw = bw_best["bytes_per_s"]
    mem_pts = _curve_points((r["moved_bytes"],
                             r["moved_bytes"] / (bw * net(r["seconds"])))
                            for r in mem)
    mem_curve = EfficiencyCurve(points=mem_pts, source=f"{src}: copy/triad, achieved fraction "
                                "of the measured bandwidth vs bytes moved (read + write)"
                                + net_note + "; cache-resident sizes held at 1.0")

    att = [r for r in log if r["kind"] == "attention"]
    if att:
        raw = _curve_points((r["flops"], r["flops"] / (peaks["bf16"].value * net(r["seconds"])))
                            for r in att)
        att_curve = EfficiencyCurve(
            points=isotonic(raw),
            source=f"{src}: bf16 scaled_dot_product_attention (non-causal), fraction of the "
            "measured bf16 peak vs FLOPs" + net_note + _smoothed(raw, isotonic(raw)))
    else:
        att_curve = matmul["bf16"].model_copy(update={
            "source": "assumed equal to the measured bf16 GEMM curve (attention could not "
                      f"be timed); {matmul['bf16'].source}"})
    assumed = "assumed (not measured by puzzle-nas probe)"
    eff = {
        "matmul": matmul,
        "attention": att_curve,
        "grouped_matmul_prefill": matmul["bf16"].model_copy(update={
            "source": f"{assumed}: equal to the measured bf16 GEMM curve; "
                      f"{matmul['bf16'].source}"}),
        "grouped_matmul_decode": mem_curve.model_copy(update={
            "source": f"{assumed}: equal to the measured memory curve (decode grouped GEMMs "
                      f"stream weights); {mem_curve.source}"}),
        "memory": mem_curve,
        "link": EfficiencyCurve(points=[(1.0, 0.8)], source=f"{assumed}: 80 % of the link "
                                "bandwidth; measure collectives to replace it"),
    }

    eager = None
    views = [r for r in log if r["kind"] == "view_overhead"]
    elems = [r for r in log if r["kind"] == "elementwise"]
    if views and elems:
        rates: dict[str, Figure] = {}
        for d in dict.fromkeys(r["dtype"] for r in elems):
            rows = sorted((r for r in elems if r["dtype"] == d), key=lambda r: r["elements"])
            per = [r["moved_bytes"] / net(r["seconds"]) for r in rows]
            rates[d] = Figure(value=statistics.median(per), source=(
                f"{src}: eager {d} multiply a * b (output allocated), bytes read + written "
                "per second, median over " + ", ".join(
                    f"{r['elements']} elements ({q / 1e9:.3g} GB/s{_spread(r)})"
                    for r, q in zip(rows, per)) + net_note))
        calls = {r["dtype"]: Figure(value=r["seconds"], source=(
            f"{src}: median time of a 1-row {r['dtype']} GEMM in nn.Linear's layout "
            f"(x[1, {r['k']}] @ W[{r['n']}, {r['k']}]^T, torch.nn.functional.linear, called "
            f"back to back){_spread(r)}: the GEMM library's cost per call, dispatch included "
            f"(its {r['weight_bytes'] / 2**10:g} KiB of weights stay in cache and stream in "
            "a small part of it; nothing is subtracted)"))
            for r in log if r["kind"] == "gemm_call"}
        eager = EagerFigures(
            view_overhead_s=Figure(value=views[-1]["seconds"], source=(
                f"{src}: median time of x.view(1) issued back to back (a dispatch that runs "
                f"no kernel, host clock){_spread(views[-1])}")),
            elementwise_bandwidth=rates, gemm_overhead_s=calls)

    if gpus_per_node is not None:
        gpn = Figure(value=gpus_per_node, source="given by the user (puzzle-nas profile "
                     f"--gpus-per-node) on {device.date}")
    elif kind == "cuda":
        gpn = Figure(value=device.visible_gpus or 1,
                     source=f"counted on {device.date} by puzzle-nas probe: "
                     "torch.cuda.device_count() on this host (visible devices)")
    else:
        gpn = Figure(value=1, source=f"{assumed}: one device (a CPU)")
    user = f"given by the user (puzzle-nas profile) on {device.date}"
    ic = {
        "name": link_name or "unknown (assumed PCIe 4.0 x16)",
        "bandwidth": Figure(value=link_bandwidth, source=user) if link_bandwidth else
        Figure(value=32e9, source=f"{assumed}: PCIe 4.0 x16, ~32 GB/s per direction; pass "
               "--link-gbps"),
        "latency": Figure(value=link_latency_s, source=user) if link_latency_s else
        Figure(value=10e-6, source=f"{assumed}: 10 us per small collective; pass "
               "--link-latency-us"),
    }
    if kind == "cpu":
        ovh_how = ("median time of a 1-element add issued back to back (torch dispatch "
                   f"cost, {device.threads} thread(s))")
    else:
        ovh_how = ("median time per 1-element add, "
                   f"{device.launch_iters} launched back to back between CUDA events")
    note = (f"Measured by puzzle-nas probe ({'quick' if device.quick else 'full'} plan, torch "
            f"{device.torch_version}"
            + (f", {device.threads} CPU thread(s)" if device.threads else "")
            + "). Peaks are the best achieved GEMM rates (dense), not datasheet figures, so "
            "large-GEMM efficiency is near 1.0.")
    return HardwareProfile(
        name=name or _slug(device.name),
        display_name=device.name,
        vendor=device.vendor,
        notes=note,
        memory_bytes=Figure(value=device.memory_bytes, source=f"{src}: {device.memory_how}"),
        memory_bandwidth=Figure(value=bw, source=f"{src}: best {bw_best['op']} rate "
                                f"counting read + write bytes{_spread(bw_best)}, over {how}"),
        peak_flops=peaks,
        efficiency=Efficiency.model_validate(eff),
        kernel_overhead_s=Figure(value=overhead, source=f"{src}: {ovh_how}{_spread(ovh[-1])}"),
        l2_bytes=Figure(value=device.llc, source=f"read on {device.name} {device.date} by "
                        f"puzzle-nas probe: {device.llc_how}") if device.llc else None,
        interconnect=Interconnect.model_validate(ic),
        gpus_per_node=gpn,
        eager=eager,
    )


class _Probe:
    """One probe run: the device handles, the timer and the measurement log."""

    def __init__(self, torch: Any, kind: str, index: int, dtypes: tuple[str, ...] | None,
                 plan: ProbePlan | None, quick: bool, progress: ProgressFn | None):
        self.torch = torch
        self.kind = kind
        self.quick = quick
        self.progress = progress
        self.date = _dt.date.today().isoformat()
        self.log: list[dict[str, Any]] = []
        self.slow: set[str] = set()
        self.flush: Any = None  # CUDA: the L2-flush buffer (a torch tensor; torch is Any here)
        self.launch_spread = 0.0
        self.launch_samples = 0
        if kind == "cuda":
            self.dev = torch.device("cuda", index)
            torch.cuda.set_device(self.dev)
            props = torch.cuda.get_device_properties(self.dev)
            self.device_name = props.name
            self.vendor = "amd" if getattr(torch.version, "hip", None) else "nvidia"
            free, total = torch.cuda.mem_get_info(self.dev)
            self.memory_bytes = float(total)
            self.memory_how = "total device memory reported by the driver (torch.cuda.mem_get_info)"
            l2 = int(getattr(props, "L2_cache_size", 0) or 0)
            self.llc: int | None = l2 or None
            self.llc_how = "L2 size from torch.cuda.get_device_properties" if l2 else ""
            self.flush = torch.empty(max(2 * l2, 256 * 2**20), dtype=torch.uint8,
                                     device=self.dev)
            self.threads = None
            self.clock = time.perf_counter  # host-side timings (views) only
            self.timing = ("CUDA events around each call after warm-up, L2 flushed before "
                           "each timed call; median over repeats")
        else:
            self.dev = torch.device("cpu")
            self.device_name, self.vendor = _cpu_info()
            pages, page = os.sysconf("SC_PHYS_PAGES"), os.sysconf("SC_PAGE_SIZE")
            self.memory_bytes = float(pages * page)
            self.memory_how = "physical memory, os.sysconf(SC_PHYS_PAGES * SC_PAGE_SIZE)"
            self.llc, self.llc_how = _cpu_llc()
            self.threads = torch.get_num_threads()
            # one thread: its CPU time, which other processes' turns on the core do not
            # add to (as the block timer, nas.profile.blocks); several: the wall clock
            self.clock = time.thread_time if self.threads == 1 else time.perf_counter
            clock = ("time.thread_time (CPU time of the one torch thread)"
                     if self.threads == 1 else "time.perf_counter")
            self.timing = (f"{clock} around blocks of calls, {self.threads} torch "
                           "thread(s); median over repeats, dispatch overhead subtracted")
        self.plan = plan or past_cache(default_plan(kind, quick, self.memory_bytes), self.llc,
                                       self.memory_bytes)
        self.dtypes = dtypes or self._supported_dtypes()

    # -- timing ----------------------------------------------------------------------------

    def _sync(self) -> None:
        if self.kind == "cuda":
            self.torch.cuda.synchronize(self.dev)

    def time_call(self, fn: Callable[[], Any], group: str) -> tuple[float, int, float, int]:
        """(median seconds per call, samples, the median's relative standard error, samples
        rejected). Samples
        are taken until the median's relative standard error is at most :data:`TARGET_RSE`
        (at least the plan's repeats, at most :data:`MAX_REPEAT_FACTOR` times them), slow
        outliers dropped (:func:`robust`). A first (cold) call slower than ``max_call_s``
        marks ``group`` slow (its larger sizes are then skipped) and one warm call is timed."""
        p = self.plan
        self._sync()
        t0 = time.perf_counter()
        fn()
        self._sync()
        first = time.perf_counter() - t0
        if first > p.max_call_s:
            self.slow.add(group)
            t0 = time.perf_counter()
            fn()
            self._sync()
            return time.perf_counter() - t0, 1, 0.0, 0
        for _ in range(p.warmup):
            fn()
        inner = 1 if self.kind == "cuda" else \
            max(1, min(100_000, math.ceil(p.min_time_s / max(first, 1e-9))))
        samples: list[float] = []
        while True:
            samples += self._samples(fn, p.repeats, inner)
            if len(samples) >= MAX_REPEAT_FACTOR * p.repeats or median_rse(samples) <= TARGET_RSE:
                break
        med, _, rejected = robust(samples)
        return med, len(samples), median_rse(samples), rejected

    def _samples(self, fn: Callable[[], Any], n: int, inner: int) -> list[float]:
        """``n`` timed samples of seconds per call (CUDA: one call between events, the L2
        flushed before it; CPU: a block of ``inner`` calls)."""
        if self.kind == "cuda":
            ev = self.torch.cuda.Event
            pairs = [(ev(enable_timing=True), ev(enable_timing=True)) for _ in range(n)]
            for start, end in pairs:
                self.flush.zero_()
                start.record()
                fn()
                end.record()
            self._sync()
            return [s.elapsed_time(e) / 1e3 for s, e in pairs]
        times = []
        clock = self.clock
        for _ in range(n):
            t0 = clock()
            for _ in range(inner):
                fn()
            times.append((clock() - t0) / inner)
        return times

    def time_launch(self) -> float:
        """Seconds per tiny (1-element add) op issued back to back: the kernel overhead."""
        torch, p = self.torch, self.plan
        x = torch.zeros(1, device=self.dev)
        for _ in range(max(p.warmup, 3) * 10):
            x.add_(1.0)
        self._sync()
        samples: list[float] = []
        while not samples or (len(samples) < MAX_REPEAT_FACTOR * p.repeats
                              and median_rse(samples) > TARGET_RSE):
            for _ in range(p.repeats):
                if self.kind == "cuda":
                    start = torch.cuda.Event(enable_timing=True)
                    end = torch.cuda.Event(enable_timing=True)
                    start.record()
                    for _ in range(p.launch_iters):
                        x.add_(1.0)
                    end.record()
                    self._sync()
                    samples.append(start.elapsed_time(end) / 1e3 / p.launch_iters)
                else:
                    t0 = self.clock()
                    for _ in range(p.launch_iters):
                        x.add_(1.0)
                    samples.append((self.clock() - t0) / p.launch_iters)
        self.launch_spread = median_rse(samples)
        self.launch_samples = len(samples)
        return robust(samples)[0]

    def time_view(self) -> tuple[float, float, int]:
        """Seconds per view op (``x.view(1)``, no kernel) issued back to back, timed on the
        host clock on every device (a view is host work only); with its spread and
        samples."""
        p = self.plan
        x = self.torch.zeros(1, device=self.dev)
        for _ in range(max(p.warmup, 3) * 10):
            x.view(1)
        samples: list[float] = []
        while not samples or (len(samples) < MAX_REPEAT_FACTOR * p.repeats
                              and median_rse(samples) > TARGET_RSE):
            for _ in range(p.repeats):
                t0 = self.clock()
                for _ in range(p.launch_iters):
                    x.view(1)
                samples.append((self.clock() - t0) / p.launch_iters)
        return robust(samples)[0], median_rse(samples), len(samples)

    # -- benchmarks ------------------------------------------------------------------------

    def _torch_dtype(self, d: str) -> Any:
        t = self.torch
        return {"bf16": t.bfloat16, "fp16": t.float16, "fp32": t.float32}[d]

    def _fp8_gemm(self, m: int, n: int, k: int) -> Callable[[], Any]:
        t = self.torch
        a = t.randn(m, k, device=self.dev).to(t.float8_e4m3fn)
        b = t.randn(n, k, device=self.dev).to(t.float8_e4m3fn).t()  # column-major, as required
        one = t.tensor(1.0, device=self.dev)
        return lambda: t._scaled_mm(a, b, scale_a=one, scale_b=one, out_dtype=t.bfloat16)

    def _supported_dtypes(self) -> tuple[str, ...]:
        out = ["bf16", "fp16", "fp32"]
        t = self.torch
        if self.kind == "cuda" and hasattr(t, "float8_e4m3fn") and hasattr(t, "_scaled_mm"):
            try:
                self._fp8_gemm(32, 32, 32)()
                self._sync()
                out.append("fp8")
            except (RuntimeError, TypeError, ValueError) as exc:
                self.log.append({"kind": "skipped", "what": "fp8 GEMM",
                                 "reason": str(exc).splitlines()[0][:200]})
        return tuple(out)

    def _gemm_fn(self, dtype: str, m: int, n: int, k: int) -> Callable[[], Any]:
        if dtype == "fp8":
            return self._fp8_gemm(m, n, k)
        t, dt = self.torch, self._torch_dtype(dtype)
        a = t.randn(m, k, device=self.dev, dtype=dt)
        # B in the layout nn.Linear multiplies by (a [n, k] weight, transposed): CPU bf16
        # kernels run row-major B 6-10x slower, which made probed CPU curves fall to ~16 %
        b = t.randn(n, k, device=self.dev, dtype=dt).t()
        c = t.empty(m, n, device=self.dev, dtype=dt)
        return lambda: t.mm(a, b, out=c)

    def bench_gemm(self, dtype: str, m: int, n: int, k: int, role: str) -> None:
        group = f"gemm-{dtype}-{role}"
        rec: dict[str, Any] = {"kind": "gemm", "dtype": dtype, "role": role, "m": m, "n": n,
                               "k": k, "flops": 2.0 * m * n * k}
        if group in self.slow:
            self.log.append({**rec, "kind": "skipped", "reason": "a smaller size was too slow"})
            return
        try:
            secs, reps, spread, rejected = self.time_call(self._gemm_fn(dtype, m, n, k), group)
        except (RuntimeError, TypeError, ValueError) as exc:  # fp8 alignment, out of memory, ...
            self.log.append({**rec, "kind": "skipped", "reason": str(exc).splitlines()[0][:200]})
            return
        self.log.append({**rec, "seconds": secs, "repeats": reps, "spread": spread,
                         "rejected": rejected, "flop_per_s": rec["flops"] / secs})

    def bench_memory(self, op: str, nbytes: int) -> None:
        t = self.torch
        n = max(nbytes // 4, 1)
        rec: dict[str, Any] = {"kind": "memory", "op": op, "buffer_bytes": 4 * n}
        if f"mem-{op}" in self.slow:
            self.log.append({**rec, "kind": "skipped", "reason": "a smaller size was too slow"})
            return
        try:
            src = t.ones(n, device=self.dev)
            dst = t.zeros(n, device=self.dev)  # touched: no page faults in the timing
            if op == "copy":
                moved = 2 * 4 * n
                fn: Callable[[], Any] = lambda: dst.copy_(src)  # noqa: E731
            else:  # triad: dst = src + 2 * other
                other = t.ones(n, device=self.dev)
                moved = 3 * 4 * n
                fn = lambda: t.add(src, other, alpha=2.0, out=dst)  # noqa: E731
            secs, reps, spread, rejected = self.time_call(fn, f"mem-{op}")
        except RuntimeError as exc:
            self.log.append({**rec, "kind": "skipped", "reason": str(exc).splitlines()[0][:200]})
            return
        self.log.append({**rec, "moved_bytes": moved, "seconds": secs, "repeats": reps,
                         "spread": spread, "rejected": rejected, "bytes_per_s": moved / secs})

    def bench_elementwise(self, dtype: str, n: int) -> None:
        """An eager elementwise multiply ``a * b`` of ``n`` elements per operand in
        ``dtype``, its output allocated as eager ops allocate it: 3 ``n`` elements moved."""
        t = self.torch
        td = self._torch_dtype(dtype)
        size = t.empty((), dtype=td).element_size()
        rec: dict[str, Any] = {"kind": "elementwise", "op": "mul", "dtype": dtype,
                               "elements": n, "moved_bytes": 3 * n * size}
        try:
            a, b = (t.randn(n, device=self.dev).to(td) for _ in range(2))
            secs, reps, spread, rejected = self.time_call(lambda: a * b, f"elem-{dtype}")
        except RuntimeError as exc:
            self.log.append({**rec, "kind": "skipped", "reason": str(exc).splitlines()[0][:200]})
            return
        self.log.append({**rec, "seconds": secs, "repeats": reps, "spread": spread,
                         "rejected": rejected, "bytes_per_s": rec["moved_bytes"] / secs})

    def bench_gemm_call(self, dtype: str) -> None:
        """One 1-row GEMM in nn.Linear's layout, ``x[1, k] @ W[n, k]^T`` at
        ``n = k = GEMM_CALL_SIZE`` (``torch.nn.functional.linear``, as the blocks call it):
        so little work that its time is the GEMM library's cost per call."""
        t = self.torch
        td = self._torch_dtype(dtype)
        s = GEMM_CALL_SIZE
        size = t.empty((), dtype=td).element_size()
        rec: dict[str, Any] = {"kind": "gemm_call", "dtype": dtype, "m": 1, "n": s, "k": s,
                               "weight_bytes": s * s * size}
        try:
            x = t.randn(1, s, device=self.dev).to(td)
            w = t.randn(s, s, device=self.dev).to(td)
            secs, reps, spread, rejected = self.time_call(
                lambda: t.nn.functional.linear(x, w), f"gemm-call-{dtype}")
        except RuntimeError as exc:
            self.log.append({**rec, "kind": "skipped", "reason": str(exc).splitlines()[0][:200]})
            return
        self.log.append({**rec, "seconds": secs, "repeats": reps, "spread": spread,
                         "rejected": rejected})

    def bench_attention(self, seq: int) -> None:
        t = self.torch
        b, h, d = self.plan.attn_shape
        rec: dict[str, Any] = {"kind": "attention", "dtype": "bf16", "batch": b, "heads": h,
                               "seq": seq, "head_dim": d, "causal": False,
                               "flops": 4.0 * b * h * seq * seq * d}
        if "attention" in self.slow:
            self.log.append({**rec, "kind": "skipped", "reason": "a smaller size was too slow"})
            return
        try:
            q, k, v = (t.randn(b, h, seq, d, device=self.dev, dtype=t.bfloat16)
                       for _ in range(3))
            sdpa = t.nn.functional.scaled_dot_product_attention
            secs, reps, spread, rejected = self.time_call(lambda: sdpa(q, k, v), "attention")
        except (RuntimeError, AttributeError) as exc:
            self.log.append({**rec, "kind": "skipped", "reason": str(exc).splitlines()[0][:200]})
            return
        self.log.append({**rec, "seconds": secs, "repeats": reps, "spread": spread,
                         "rejected": rejected, "flop_per_s": rec["flops"] / secs})

    # -- the run ---------------------------------------------------------------------------

    def tasks(self) -> list[tuple[str, Callable[[], None]]]:
        p = self.plan
        out: list[tuple[str, Callable[[], None]]] = []
        for d in self.dtypes:
            for s in p.gemm_sizes:
                out.append((f"{d} GEMM {s}^3", partial(self.bench_gemm, d, s, s, s, "square")))
            for s in p.gemm_unaligned:
                out.append((f"{d} GEMM {s}^3",
                            partial(self.bench_gemm, d, s, s, s, "unaligned")))
            nk = p.m_sweep_nk
            for m in p.m_sweep:
                out.append((f"{d} GEMM M={m}",
                            partial(self.bench_gemm, d, m, nk, nk, "m_sweep")))
        for nbytes in p.mem_bytes:
            for op in ("copy", "triad"):
                out.append((f"{op} {nbytes / 2**20:g} MiB",
                            partial(self.bench_memory, op, nbytes)))
        for seq in p.attn_seqs:
            out.append((f"attention S={seq}", partial(self.bench_attention, seq)))
        for d in dict.fromkeys([x for x in self.dtypes if x in ("bf16", "fp16", "fp32")]
                               + ["fp32"]):
            for n in p.elem_sizes:
                out.append((f"{d} elementwise {n}", partial(self.bench_elementwise, d, n)))
            if p.elem_sizes:
                out.append((f"{d} GEMM call", partial(self.bench_gemm_call, d)))
        return out

    def run(self, *, name: str | None, gpus_per_node: int | None, link_name: str | None,
            link_bandwidth: float | None, link_latency_s: float | None) -> ProbeResult:
        tasks = self.tasks()
        total = len(tasks) + 1
        if self.progress:
            self.progress(0, total, "kernel overhead")
        overhead = self.time_launch()
        self.log.append({"kind": "kernel_overhead", "op": "1-element add, back to back",
                         "iters": self.plan.launch_iters, "seconds": overhead,
                         "spread": self.launch_spread, "repeats": self.launch_samples})
        if self.plan.elem_sizes:
            view, spread, reps = self.time_view()
            self.log.append({"kind": "view_overhead", "op": "x.view(1), back to back",
                             "iters": self.plan.launch_iters, "seconds": view,
                             "spread": spread, "repeats": reps})
        for i, (note, task) in enumerate(tasks, start=1):
            if self.progress:
                self.progress(i, total, note)
            task()
        if self.progress:
            self.progress(total, total, "done")
        prof = derive(self.log, self.device(), name=name, gpus_per_node=gpus_per_node,
                      link_name=link_name, link_bandwidth=link_bandwidth,
                      link_latency_s=link_latency_s)
        meta = {"device": self.device_name, "device_kind": self.kind, "date": self.date,
                "torch": self.torch.__version__, "threads": self.threads, "quick": self.quick,
                "timing": self.timing, "plan": {k: v for k, v in vars(self.plan).items()}}
        return ProbeResult(profile=prof, measurements=self.log, meta=meta,
                           noisy=noise_report(self.log, self.llc),
                           noisy_points=noisy_points(self.log))

    def device(self) -> DeviceInfo:
        """What this run read of the device (everything :func:`derive` needs besides the
        measurement log)."""
        return DeviceInfo(
            kind=self.kind, name=self.device_name, vendor=self.vendor,
            memory_bytes=self.memory_bytes, memory_how=self.memory_how, llc=self.llc,
            llc_how=self.llc_how, dtypes=tuple(self.dtypes), date=self.date,
            torch_version=self.torch.__version__, threads=self.threads, quick=self.quick,
            launch_iters=self.plan.launch_iters,
            visible_gpus=(max(self.torch.cuda.device_count(), 1) if self.kind == "cuda"
                          else None))
