"""``puzzle-nas profile -o PROFILE.json``: measure this machine's GPU (or CPU) with torch
microbenchmarks and write a hardware profile the cost model loads (``--hw PROFILE.json``).

The raw timings go beside it, to ``PROFILE.measurements.json`` (the profile schema has no
room for them). torch is imported only when the command runs.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from hwprofiles.units import GB, gb_gib

EXIT_NOISY = 4
"""Exit status of a probe whose timings are too noisy to trust (nothing written)."""


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "profile", help="measure a device and write a hardware profile JSON",
        description="Time GEMMs per dtype, memory copy/triad, attention and kernel overhead on "
        "a CUDA GPU or the CPU, and write a hardware profile (every figure labelled 'measured "
        "on <device> <date>') usable as `puzzle-nas cost ... --hw PROFILE.json`.")
    p.add_argument("-o", "--output", required=True, metavar="PROFILE.json",
                   help="where to write the profile (written atomically)")
    p.add_argument("--device", default=None,
                   help="cuda, cuda:N or cpu (default: cuda when torch sees one, else cpu)")
    p.add_argument("--quick", action="store_true",
                   help="fewer sizes and repeats (seconds on a CPU, about a minute on a GPU)")
    p.add_argument("--name", default=None,
                   help="profile name (lowercase, digits, '.', '_', '-'; default from the device)")
    p.add_argument("--dtypes", default=None, metavar="LIST",
                   help="comma-separated GEMM dtypes from bf16,fp16,fp32,fp8 (bf16 required; "
                   "default: all the device supports)")
    p.add_argument("--threads", type=int, default=None,
                   help="CPU threads for the whole probe (default: torch's current count)")
    p.add_argument("--gpus-per-node", type=int, default=None,
                   help="GPUs per node (default: torch.cuda.device_count(); 1 on CPU)")
    p.add_argument("--link-name", default=None, help="scale-up link name, e.g. 'NVLink 4'")
    p.add_argument("--link-gbps", type=float, default=None,
                   help="scale-up link bandwidth per GPU per direction, GB/s (1e9 bytes/s); "
                   "not measured: default an assumed 32 GB/s (PCIe 4.0 x16)")
    p.add_argument("--link-latency-us", type=float, default=None,
                   help="fixed cost of one small collective, microseconds (default assumed 10)")
    p.add_argument("--measurements", default=None, metavar="PATH",
                   help="where to write the raw timings (default: PROFILE.measurements.json)")
    p.add_argument("--no-measurements", action="store_true", help="do not write raw timings")
    p.add_argument("--accept-noisy", action="store_true",
                   help="write the profile even when some timings are too noisy to trust "
                   "(a figure's median uncertain by 5 %% or more; refused with exit 4 "
                   "otherwise)")
    g = p.add_argument_group("block timing (--blocks)")
    g.add_argument("--blocks", default=None, metavar="SPEC",
                   help="time every distinct block of this search spec's space as the real "
                   "torch block at the spec's workload shapes and write a block table "
                   "(-o BLOCKS.json; resumable: a rerun with the same -o times only what is "
                   "missing); on a CPU one torch thread unless --threads")
    g.add_argument("--batches", default=None, metavar="LIST",
                   help="extra batch sizes to time, e.g. 2,8 (default: 1, B/4 and B of each "
                   "workload)")
    g.add_argument("--dtype", default=None, choices=("bf16", "fp16", "fp32"),
                   help="dtype of the timed blocks (default: the spec's precision, which "
                   "must then be one dtype throughout)")
    g.add_argument("--warmup", type=int, default=None,
                   help="warm-up calls per point (default 10 on CUDA, 2 on CPU)")
    g.add_argument("--repeats", type=int, default=None,
                   help="timed samples per point (default 30 on CUDA, whose median stands "
                   "for the point; 14 on CPU, whose fastest does)")
    g.add_argument("--cold", action="store_true",
                   help="CPU: run each call of a point on the next of several copies of the "
                   "block (at least twice the core's L2 in all), so that its weights come "
                   "from beyond the core's caches as in a model; by default a point's calls "
                   "run back to back on one copy, its tensors warm")
    g.add_argument("--calibrate", action="store_true",
                   help="with --blocks, the whole path in one command: probe the device "
                   "(PROFILE.probed.json), time the spec's blocks (PROFILE.blocks.json), fit "
                   "the probed profile to them and write the better of the two to -o "
                   "PROFILE.json, the calibration plot beside it (PROFILE.calibration.png), "
                   "and print the MAPE per block kind and phase before and after")
    g.add_argument("--max-evals", type=int, default=40,
                   help="with --calibrate: least-squares iterations at most (default 40)")
    p.set_defaults(func=run)


def _rate(v: float) -> str:
    """FLOP/s as TFLOP/s with enough digits for a CPU (0.3) or a GPU (989)."""
    t = v / 1e12
    return f"{t:,.0f} TFLOP/s" if t >= 100 else f"{t:.3g} TFLOP/s"


def _bw(v: float) -> str:
    return f"{v / 1e12:.3f} TB/s" if v >= 1e12 else f"{v / 1e9:.1f} GB/s"


def run(args: argparse.Namespace) -> int:
    from hwprofiles.errors import InputError
    from nas.io import atomic_write_json, check_output_file
    from nas.progress import Progress

    if args.calibrate:
        if args.blocks is None:
            raise InputError("--calibrate needs --blocks SPEC (the blocks to fit to)",
                             field="--calibrate")
        return run_path(args)
    if args.blocks is not None:
        return run_blocks(args)
    out = Path(args.output)
    if args.no_measurements and args.measurements:
        raise InputError("give --measurements or --no-measurements, not both")
    meas_path = None if args.no_measurements else Path(
        args.measurements or out.with_name(f"{out.stem}.measurements.json"))
    # both outputs checked (folder created, writable) before the measurements start
    check_output_file(out, "--output")
    if meas_path is not None:
        check_output_file(meas_path, "--measurements")
    dtypes = None if args.dtypes is None else [d for d in args.dtypes.split(",") if d.strip()]

    try:
        from hwprofiles.probe import run_probe
    except ImportError as exc:  # pragma: no cover - the module itself needs no torch
        raise InputError(f"cannot load the probe ({exc})") from None
    device = args.device
    if device is None:
        try:
            import torch
        except ImportError:
            raise InputError("profiling needs torch: pip install 'puzzle-nas[torch]'") from None
        device = "cuda" if torch.cuda.is_available() else "cpu"

    bar: dict[str, Any] = {}

    def progress(done: int, total: int, note: str) -> None:
        if "p" not in bar:
            bar["p"] = Progress(total, "profiling").__enter__()
        p = bar["p"]
        p.update(done - p.done, note=f"{note:<24}")

    try:
        res = run_probe(
            device, quick=args.quick, dtypes=dtypes, progress=progress, name=args.name,
            threads=args.threads, gpus_per_node=args.gpus_per_node, link_name=args.link_name,
            link_bandwidth=None if args.link_gbps is None else args.link_gbps * 1e9,
            link_latency_s=None if args.link_latency_us is None else args.link_latency_us * 1e-6)
    finally:
        if "p" in bar:
            bar["p"].__exit__(None, None, None)
    prof = res.profile
    if res.noisy:
        from hwprofiles.probe import NOISY_SPREAD

        lines = "\n".join(f"  {n}" for n in res.noisy)
        if not args.accept_noisy:
            print(f"puzzle-nas profile: error: timings too noisy to trust (the median uncertain "
                  f"by {NOISY_SPREAD:.0%} or more after the repeats and outlier rejection; another "
                  f"load on the device?):\n{lines}\nnothing written; rerun on a quiet device, "
                  "or pass --accept-noisy to write it anyway", file=sys.stderr)
            return EXIT_NOISY
        print(f"note: timings too noisy to trust, written anyway (--accept-noisy):\n{lines}")
    atomic_write_json(out, prof.model_dump(mode="json"))
    if meas_path is not None:
        atomic_write_json(meas_path, res.measurements_json())

    m = prof.memory_bytes.value
    meta = res.meta
    threads = f", {meta['threads']} thread(s)" if meta.get("threads") else ""
    print(f"wrote {out} (profile {prof.name!r})"
          + (f" and {meas_path} ({len(res.measurements)} timings)" if meas_path else ""))
    print(f"  device            {prof.display_name} ({meta['device_kind']}{threads}), "
          f"{meta['date']}, {'quick' if meta['quick'] else 'full'} plan")
    print(f"  memory            {gb_gib(m)}")
    print(f"  memory bandwidth  {_bw(prof.memory_bandwidth.value)} (best copy/triad, "
          "read + write bytes)")
    for d, f in prof.peak_flops.items():
        print(f"  peak {d:<4} (dense) {_rate(f.value)} (best achieved GEMM), large-GEMM "
              f"efficiency {prof.matmul_fraction(d):.0%}")
    fp32 = [r["flop_per_s"] for r in res.measurements
            if r["kind"] == "gemm" and r["dtype"] == "fp32"]
    if fp32:
        print(f"  fp32 GEMM         {_rate(max(fp32))} (in the measurements only)")
    print(f"  kernel overhead   {prof.kernel_overhead_s.value * 1e6:.2f} us")
    if prof.l2_bytes is not None:
        print(f"  last-level cache  {prof.l2_bytes.value / 2**20:,.0f} MiB")
    ic = prof.interconnect
    print(f"  link              {ic.name}: {ic.bandwidth.value / GB:,.0f} GB/s per direction, "
          f"{ic.latency.value * 1e6:.1f} us; GPUs per node {int(prof.gpus_per_node.value)}"
          + ("  (assumed: pass --link-gbps / --gpus-per-node)"
             if "assumed" in ic.bandwidth.source else ""))
    if "may overstate" in prof.memory_bandwidth.source:
        print("  note: no memory buffer was beyond 4x the last-level cache, so the bandwidth "
              "may be a cache rate" + ("; the full plan (no --quick) times larger buffers"
                                       if meta["quick"] else ""))
    if res.noisy_points:
        print(f"  noisy points      {len(res.noisy_points)} of {len(res.measurements)} "
              "(median uncertain by over 5 %, in the measurements): "
              + "; ".join(res.noisy_points[:3]) + ("; ..." if len(res.noisy_points) > 3 else ""))
    print(f"use it: puzzle-nas cost CONFIG --hw {out} --workload isl=1024,osl=128,batch=1")
    return 0


def _eta(seconds: float) -> str:
    s = int(round(seconds))
    return f"{s // 60}:{s % 60:02d}" if s < 3600 else f"{s // 3600}h{s % 3600 // 60:02d}"


def run_blocks(args: argparse.Namespace) -> int:
    """``profile --blocks SPEC -o BLOCKS.json``: time the spec's blocks (resumable)."""
    import time

    from costmodels.measured import check_recipe, plan_points
    from hwprofiles.errors import InputError
    from nas.io import check_output_file
    from nas.progress import Progress
    from nas.search import alternatives, resolve
    from nas.spec import load_spec

    out = Path(args.output)
    spec, base, _ = load_spec(args.blocks)
    check_output_file(out, "--output")
    probed = getattr(args, "probed_profile", None)
    if probed is not None:  # the one-command path: the spec may name the profile it writes
        named = (base / spec.hw.profile).resolve()
        if named == Path(args.profile_output).resolve():
            print(f"note: the spec's hardware {spec.hw.profile} is this command's output; its "
                  f"blocks are resolved against the probed profile {probed}")
            spec = spec.model_copy(update={"hardware": spec.hw.model_copy(
                update={"profile": str(Path(probed).resolve())})})
    batches: list[int] = []
    for part in (args.batches or "").split(","):
        if part.strip():
            try:
                b = int(part)
            except ValueError:
                raise InputError(f"expected integers like 2,8, got {part!r}",
                                 field="--batches") from None
            if not 1 <= b <= 1 << 20:
                raise InputError(f"batch sizes are 1..{1 << 20}, got {b}", field="--batches")
            batches.append(b)
    problem = resolve(spec, base)
    if problem.tp != 1 or problem.ep != 1 or problem.attention_dp:
        raise InputError("block timing runs on one device: the spec's hardware must have "
                         "tp = ep = 1 and no attention_dp", path=args.blocks, field="hardware")
    dtype = args.dtype
    recipe = problem.recipe
    if dtype is None:
        dts = {recipe.activations.value} | {recipe.weight_dtype(r).value
                                            for r in recipe.weights} | {recipe.default.value}
        if len(dts) != 1 or next(iter(dts)) not in ("bf16", "fp16", "fp32"):
            raise InputError(f"precision {recipe.name!r} mixes or uses dtypes the torch blocks "
                             f"do not run ({sorted(dts)}); give --dtype", path=args.blocks,
                             field="precision")
        dtype = next(iter(dts))
    alts = alternatives(problem)
    blocks = [a.child for blk in alts for a in blk]
    plan = plan_points(list(problem.workloads.values()), batches)
    try:
        from nas.profile.blocks import BlockTimer, distinct_blocks, profile_blocks
    except ImportError:
        raise InputError("block timing needs torch: pip install 'puzzle-nas[torch]'") from None
    device = args.device
    if device is None:
        import torch

        device = "cuda" if torch.cuda.is_available() else "cpu"
    timer = BlockTimer(device, dtype, warmup=args.warmup, repeats=args.repeats,
                       threads=args.threads, cold=args.cold)
    shapes = distinct_blocks(blocks, problem.parent.hidden_size)
    print(f"timing {len(shapes)} distinct blocks ({len(blocks)} alternatives) x {len(plan)} "
          f"points on {timer.device_name} ({timer.kind}), {dtype} -> {out}")
    bar: dict[str, Any] = {}
    t0 = time.perf_counter()

    def progress(done: int, total: int, note: str) -> None:
        if "p" not in bar:
            bar["p"] = Progress(total, "timing").__enter__()
            bar["start"] = done
        p = bar["p"]
        ran = done - bar["start"]
        eta = "" if ran <= 0 else \
            f"ETA {_eta((time.perf_counter() - t0) / ran * (total - done))} "
        p.update(done - p.done, note=f"{eta}{note:<44}")

    try:
        table = profile_blocks(blocks, problem.parent, plan, out, timer, spec=spec.name,
                               progress=progress)
    finally:
        if "p" in bar:
            bar["p"].__exit__(None, None, None)
    try:  # a --dtype other than the spec's precision: the spec cannot price with this table
        check_recipe(table, recipe)
    except InputError as exc:
        print(f"note: {exc}")
    print(f"wrote {out}: {len(table.blocks)} blocks, "
          f"{sum(len(b.timings) for b in table.blocks)} timings, "
          f"{time.perf_counter() - t0:.1f} s")
    print(format_blocks(table))
    return 0


def path_outputs(out: Path) -> dict[str, Path]:
    """The files ``profile --blocks SPEC --calibrate -o PROFILE.json`` writes."""
    stem = out.name[: -len(".json")] if out.name.endswith(".json") else out.name
    return {"profile": out, "probed": out.with_name(f"{stem}.probed.json"),
            "blocks": out.with_name(f"{stem}.blocks.json"),
            "plot": out.with_name(f"{stem}.calibration.png")}


def run_path(args: argparse.Namespace) -> int:
    """``profile --blocks SPEC --calibrate -o PROFILE.json``: probe, time the blocks,
    calibrate, keep the better profile (``costmodels.measured.calibrate_blocks``)."""
    import copy

    import hwprofiles
    from costmodels.measured import calibrate_blocks, fidelity_plot, load_blocks, recipe_for
    from hwprofiles.errors import InputError
    from nas.cli.calibrate import calibration_text
    from nas.io import atomic_write_json, check_output_file

    if args.max_evals < 1:
        raise InputError(f"must be >= 1, got {args.max_evals}", field="--max-evals")
    files = path_outputs(Path(args.output))
    for flag, f in (("--output", files["profile"]), ("PROFILE.probed.json", files["probed"]),
                    ("PROFILE.blocks.json", files["blocks"])):
        check_output_file(f, flag)
    from nas.spec import load_spec

    spec, base, _ = load_spec(args.blocks)  # a bad spec is refused before the probe runs
    named = (base / spec.hw.profile).resolve()
    if spec.hw.profile.endswith(".json") and not named.exists() and \
            named != files["profile"].resolve():
        raise InputError("file not found (the spec's hardware profile; it may also name the "
                         "profile this command writes, -o)", path=str(named))
    if args.device is None:
        import torch

        args.device = "cuda" if torch.cuda.is_available() else "cpu"
    if args.device == "cpu" and args.threads is None:
        args.threads = 1  # the probe and the blocks on the same one torch thread
    print(f"[1/3] probing {args.device} -> {files['probed']}")
    probe = copy.copy(args)
    probe.output, probe.blocks, probe.calibrate = str(files["probed"]), None, False
    rc = run(probe)
    if rc != 0:
        return rc
    print(f"[2/3] timing the blocks of {args.blocks} -> {files['blocks']}")
    timing = copy.copy(args)
    timing.output, timing.calibrate = str(files["blocks"]), False
    timing.probed_profile, timing.profile_output = str(files["probed"]), str(files["profile"])
    run_blocks(timing)
    print(f"[3/3] calibrating {files['probed'].name} to the timed blocks -> {files['profile']}")
    meas = load_blocks(files["blocks"])
    probed = hwprofiles.load(files["probed"])
    cal = calibrate_blocks(meas, probed, recipe_for(meas), max_nfev=args.max_evals)
    atomic_write_json(files["profile"], cal.profile.model_dump(mode="json"))
    fidelity_plot(cal.before, cal.after, files["plot"], f"{probed.name} on {meas.device}")
    print(calibration_text(cal))
    kept = {"fit": "the calibrated profile", "start": "the probed profile with the timed "
            "GEMM curve", "given": "the probed profile"}[cal.written]
    print(f"wrote {files['profile']} ({kept}; rms log error probed {cal.rms_log['given']:.3f}, "
          f"calibrated {cal.rms_log['fit']:.3f}) and {files['plot']}")
    return 0


def format_blocks(table: Any) -> str:
    """The block table as text: one line per block and point (median, spread, peak)."""
    lines = [f"{'block':<44} {'point':<20} {'median':>10} {'spread':>17} {'peak':>10}"]
    for e in table.blocks:
        for t in e.timings:
            lines.append(f"{e.describe[:44]:<44} {t.point.label():<20} "
                         f"{t.median_s * 1e3:>8.3f}ms "
                         f"{t.min_s * 1e3:>7.3f}-{t.max_s * 1e3:<7.3f}ms "
                         f"{t.peak_bytes / 2**20:>6.1f} MiB")
    return "\n".join(lines)
