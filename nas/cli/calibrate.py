"""``puzzle-nas calibrate MEASUREMENTS.csv --hw NAME -o PROFILE.json``: fit a profile.

Fits the efficiency fractions, kernel overhead, link latency and MoE imbalance of a
hardware profile to the measurements taken on it, each row priced with its engine's
profile held fixed (``costmodels.calibrate``: bounded least squares on log errors,
no per-model or per-point factors), prints the figures that moved and the error before
and after, and writes the fitted profile (each fitted figure's source says "fitted to N
measurements from ..."). ``--split fit`` uses only the rows marked for fitting, so the
hold-out rows stay unseen; ``--report`` prints the MAPE table of every row instead.

``--engines -o DIR`` fits the serving engines' host overheads instead (per engine, on the
rows of every device, each device at its profile: ``costmodels.calibrate.fit_engines``) and
writes ``DIR/<engine>.json`` engine profiles; ``--engine-profiles DIR`` prices with such
files (before the shipped ones) and ``--profiles DIR`` with device profile files.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "calibrate", help="fit a hardware profile's efficiencies (or, with --engines, the "
        "serving engines' overheads) to measurements",
        description="Fit a hardware profile's efficiency fractions (bounded to (0, 1]) to "
        "serving measurements (a CSV with sources: published tables or `puzzle-nas profile` "
        "runs) and write the fitted profile; with --engines fit the serving engines' per-step "
        "and per-request overheads on the rows of every device instead.")
    p.add_argument("measurements", nargs="?",
                   help="measurements CSV (see costmodels.calibrate.Measurement); or --blocks")
    p.add_argument("--blocks", default=None, metavar="BLOCKS.json",
                   help="fit to timed blocks (`puzzle-nas profile --blocks`) instead: efficiency "
                   "fractions and kernel overhead; prints the analytic-vs-measured MAPE per "
                   "block kind before and after")
    p.add_argument("--plot", default=None, metavar="PNG",
                   help="with --blocks: predicted vs measured block times, before and after")
    p.add_argument("--force", action="store_true",
                   help="with --blocks: fit even when the blocks were timed on another device "
                   "than the profile's (refused otherwise)")
    p.add_argument("--hw", default=None, help="the profile to start from (name or JSON file); "
                   "rows whose gpu names it (or an alias) are fitted (required unless --engines)")
    p.add_argument("--engines", action="store_true",
                   help="fit the serving engines' per-step / per-request overheads on the rows "
                   "of all devices and write DIR/<engine>.json (-o DIR)")
    p.add_argument("--engine-profiles", default=None, metavar="DIR",
                   help="engine profile JSON files to price with, before the shipped ones")
    p.add_argument("--profiles", default=None, metavar="DIR",
                   help="with --engines: device profile JSON files to use instead of the "
                   "shipped ones")
    p.add_argument("-o", "--output", help="where to write the fitted profile JSON")
    p.add_argument("--configs", action="append", default=[], metavar="DIR",
                   help="folder of <model>.json HF configs (repeatable; default: the CSV's "
                   "configs/ folder, then examples/configs)")
    p.add_argument("--split", choices=("fit", "holdout", "all"), default="fit",
                   help="which rows to fit (default fit: hold-out rows stay unseen)")
    p.add_argument("--max-evals", type=int, default=40,
                   help="least-squares iterations at most (default 40)")
    p.add_argument("--only", action="append", default=None, metavar="FIGURE",
                   help="fit only this figure (repeatable), e.g. 'memory', 'matmul fp8', "
                   "'link latency' (default: every figure the rows constrain)")
    p.add_argument("--report", action="store_true",
                   help="no fit: print predicted vs measured and the MAPE table for all rows")
    p.add_argument("--json", action="store_true", help="print a JSON object")
    p.set_defaults(func=run)


def shape_resolver(csv_path: Path, dirs: list[str]):  # noqa: ANN201 - a cached callable
    """``model name -> ModelShape`` over config folders, each config loaded once."""
    from functools import cache

    from costmodels.calibrate import ModelShape
    from costmodels.model import NonBlockShape
    from hwprofiles.errors import InputError
    from nas.arch import mtp_table
    from nas.hf import load_config

    here = Path(__file__).resolve().parents[1] / "examples" / "configs"
    folders = [Path(d) for d in dirs] or [csv_path.parent / "configs", here]

    @cache
    def shapes(name: str) -> ModelShape:
        for d in folders:
            p = d / f"{name}.json"
            if p.is_file():
                a = load_config(p)
                # the MTP head (None without one), for rows measured with draft_tokens > 0
                return ModelShape(a.block_table(), NonBlockShape(
                    a.hidden_size, a.vocab_size, a.tie_embeddings, a.final_norm),
                    mtp_table=mtp_table(a))
        raise InputError(f"no config {name}.json in {', '.join(str(d) for d in folders)}",
                         path=str(csv_path), field="model")

    return shapes


def _json_folder(folder: str | None, flag: str, load):  # noqa: ANN001, ANN202
    """``{stem: loaded}`` of the JSON files in ``folder`` (``{}`` for None)."""
    from hwprofiles.errors import InputError

    if folder is None:
        return {}
    d = Path(folder)
    if not d.is_dir():
        raise InputError("not a folder", path=str(d), field=flag)
    return {p.stem: load(p) for p in sorted(d.glob("*.json"))}


def run(args: argparse.Namespace) -> int:
    import hwprofiles
    from costmodels.calibrate import fit, format_table, load_measurements, mape_table, score
    from hwprofiles.engines import load_engine
    from hwprofiles.errors import InputError
    from nas.io import atomic_write_text, check_output_file

    if args.blocks is not None:
        return run_blocks(args)
    if args.measurements is None:
        raise InputError("give a measurements CSV or --blocks BLOCKS.json", field="measurements")
    path = Path(args.measurements)
    ms = load_measurements(path)
    shapes = shape_resolver(path, args.configs)
    engines = {e.name: e for e in
               _json_folder(args.engine_profiles, "--engine-profiles", load_engine).values()}
    if args.engines:
        return run_engines(args, ms, shapes, engines or None)
    if args.hw is None:
        raise InputError("give --hw NAME (or --engines)", field="--hw")
    hw = hwprofiles.get(args.hw)
    names = {hw.name, *hw.aliases}
    if args.report:
        mine = [m for m in ms if m.gpu in names]
        if not mine:
            raise InputError(f"no rows for device {hw.name!r}", path=str(path), field="gpu")
        sc = score(mine, shapes, lambda _: hw, engines or None)
        rows = mape_table(sc)
        if args.json:
            print(json.dumps({"device": hw.name, "table": rows, "points": [
                {"id": s.m.id, "split": s.m.split, "metric": s.m.metric, "measured": s.m.value,
                 "predicted": s.predicted} for s in sc]}, indent=2))
        else:
            print(format_table(rows))
        return 0
    if not args.output:
        raise InputError("give -o PROFILE.json (or --report)", field="--output")
    if args.max_evals < 1:
        raise InputError(f"must be >= 1, got {args.max_evals}", field="--max-evals")
    out = check_output_file(args.output, "--output")
    chosen = [m for m in ms if args.split == "all" or m.split == args.split]
    res = fit(chosen, hw, shapes, max_nfev=args.max_evals, only=args.only,
              engines=engines or None)
    raised = res.rms_log_after > res.rms_log_before  # never write a fit that raised it
    written = hw if raised else res.profile
    atomic_write_text(out, json.dumps(written.model_dump(mode="json"), indent=2) + "\n")
    if args.json:
        print(json.dumps({"device": hw.name, "measurements": res.n, "output": str(out),
                          "rms_log_error_before": res.rms_log_before,
                          "rms_log_error_after": res.rms_log_after,
                          "written": "given" if raised else "fit",
                          "moved": [{"figure": k, "before": a, "after": b}
                                    for k, a, b in res.moved]}, indent=2))
        return 0
    print(f"{hw.name}: fitted to {res.n} measurements ({args.split} rows) -> {out}")
    print(f"  rms log error {res.rms_log_before:.3f} -> {res.rms_log_after:.3f}")
    if raised:
        print("  the fit raised the error: wrote the profile given, not the fit")
    for k, a, b in sorted(res.moved, key=lambda t: -abs(t[2] - t[1]) / max(abs(t[1]), 1e-9)):
        print(f"  {k:<28} {_fmt(k, a):>10} -> {_fmt(k, b)}")
    return 0


def run_engines(args: argparse.Namespace, ms: list, shapes, engines) -> int:  # noqa: ANN001
    """``calibrate CSV --engines -o DIR``: fit every engine's overheads on all devices."""
    import hwprofiles
    from costmodels.calibrate import fit_engines
    from hwprofiles.errors import InputError
    from nas.io import atomic_write_json

    if not args.output:
        raise InputError("give -o DIR for the engine profiles", field="--output")
    if args.max_evals < 1:
        raise InputError(f"must be >= 1, got {args.max_evals}", field="--max-evals")
    devices = {}
    for p in _json_folder(args.profiles, "--profiles", hwprofiles.load).values():
        for key in (p.name, *p.aliases):
            devices[key] = p

    def profile(name: str):  # noqa: ANN202
        return devices.get(name) or hwprofiles.get(name)

    out = Path(args.output)
    if out.exists() and not out.is_dir():  # before the fit, which takes minutes
        raise InputError("expected a folder for the engine profiles", path=str(out),
                         field="--output")
    chosen = [m for m in ms if args.split == "all" or m.split == args.split]
    res = fit_engines(chosen, profile, shapes, engines=engines, max_nfev=args.max_evals)
    out.mkdir(parents=True, exist_ok=True)
    for name, e in res.engines.items():
        atomic_write_json(out / f"{name}.json", e.model_dump(mode="json"))
    if args.json:
        print(json.dumps({"engines": sorted(res.engines), "measurements": res.n,
                          "output": str(out), "rms_log_error_before": res.rms_log_before,
                          "rms_log_error_after": res.rms_log_after,
                          "moved": [{"figure": k, "before": a, "after": b}
                                    for k, a, b in res.moved]}, indent=2))
        return 0
    print(f"engines {', '.join(sorted(res.engines))}: fitted to {res.n} measurements "
          f"({args.split} rows, all devices) -> {out}")
    print(f"  rms log error {res.rms_log_before:.3f} -> {res.rms_log_after:.3f}")
    for k, a, b in res.moved:
        print(f"  {k:<34} {_fmt('overhead', a):>10} -> {_fmt('overhead', b)}")
    return 0


def _fmt(label: str, v: float) -> str:
    if "overhead" in label or "latency" in label:
        return f"{v * 1e3:.3f} ms" if v >= 1e-4 else f"{v * 1e6:.2f} us"
    if "imbalance" in label:
        return f"{v:.3f}"
    if "bandwidth" in label:
        return f"{v / 1e9:.3g} GB/s"
    return f"{v:.1%}"


def run_blocks(args: argparse.Namespace) -> int:
    """``calibrate --blocks BLOCKS.json --hw PROFILE -o PROFILE.json``."""
    import hwprofiles
    from costmodels.measured import (
        calibrate_blocks,
        format_mape,
        load_blocks,
        mape_by_kind,
        predict_points,
        recipe_for,
        timed_on,
    )
    from hwprofiles.errors import InputError
    from nas.io import atomic_write_json, check_output_file

    if args.measurements is not None:
        raise InputError("give a measurements CSV or --blocks, not both", field="--blocks")
    meas = load_blocks(args.blocks)
    hw = hwprofiles.get(args.hw)
    recipe = recipe_for(meas)
    if args.report:
        before = mape_by_kind(predict_points(meas, hw, recipe))
        if args.json:
            print(json.dumps({"device": meas.device, "profile": hw.name, "table": before},
                             indent=2))
        else:
            print(f"{hw.name} vs {meas.device} ({meas.dtype}, {meas.date}): analytic / measured")
            print(format_mape(before))
        return 0
    if not args.output:
        raise InputError("give -o PROFILE.json (or --report)", field="--output")
    if args.max_evals < 1:
        raise InputError(f"must be >= 1, got {args.max_evals}", field="--max-evals")
    if not timed_on(meas, hw) and not args.force:
        raise InputError(f"{args.blocks} was timed on {meas.device} ({meas.device_kind}), not on "
                         f"{hw.display_name} ({hw.name}): a profile fitted to another "
                         "device's timings describes neither; profile this device "
                         "(puzzle-nas profile -o PROFILE.json) and calibrate that, or pass "
                         "--force", field="--hw")
    out = check_output_file(args.output, "--output")
    cal = calibrate_blocks(meas, hw, recipe, max_nfev=args.max_evals, only=args.only)
    atomic_write_json(out, cal.profile.model_dump(mode="json"))
    if args.plot:
        from costmodels.measured import fidelity_plot

        fidelity_plot(cal.before, cal.after, args.plot, f"{hw.name} on {meas.device}")
    if args.json:
        print(json.dumps(calibration_json(cal, meas, hw, out), indent=2))
        return 0
    print(f"{hw.name}: fitted to {cal.fit.n} block timings on {meas.device} ({meas.dtype}) "
          f"-> {out}")
    print(calibration_text(cal))
    return 0


def calibration_json(cal, meas, hw, out: Path) -> dict:  # noqa: ANN001
    """The ``--json`` object of a block calibration."""
    from costmodels.measured import mape_by_kind

    res = cal.fit
    return {"device": meas.device, "profile": hw.name, "output": str(out), "points": res.n,
            "before": mape_by_kind(cal.before), "after": mape_by_kind(cal.after),
            "written": cal.written, "rms_log": cal.rms_log, "gemm": cal.gemm_note,
            "gemm_only": mape_by_kind(cal.start),
            "moved": [{"figure": k, "before": a, "after": b} for k, a, b in res.moved],
            "on_bounds": [{"figure": k, "value": v, "lo": lo, "hi": hi}
                          for k, v, lo, hi in res.on_bounds]}


def calibration_text(cal) -> str:  # noqa: ANN001
    """What a block calibration moved and its MAPE per kind and phase, before and after."""
    from costmodels.measured import format_mape, mape_by_kind

    res = cal.fit
    before, mid = mape_by_kind(cal.before), mape_by_kind(cal.start)
    lines = []
    if cal.gemm_note:
        lines.append(f"  {cal.gemm_note}; with it alone (no fit) MAPE {before[-1]['mape']:.1%} "
                     f"-> {mid[-1]['mape']:.1%}")
    lines.append(f"  rms log error {res.rms_log_before:.3f} -> {res.rms_log_after:.3f}")
    if cal.written != "fit":
        what = ("the profile given" if cal.written == "given" else
                "the profile given with the measured GEMM curve")
        lines.append(f"  the fit did not lower the error ({cal.rms_log['fit']:.3f} against "
                     f"{cal.rms_log[cal.written]:.3f}): wrote {what}, not the fit")
    for k, a, b in sorted(res.moved, key=lambda t: -abs(t[2] - t[1]) / max(abs(t[1]), 1e-9)):
        lines.append(f"  {k:<28} {_fmt(k, a):>10} -> {_fmt(k, b)}")
    if cal.written == "fit":
        lines += [f"  on its bound: {k} = {_fmt(k, v)} (the fit's range {_fmt(k, lo)} to "
                  f"{_fmt(k, hi)}): a mechanism the model lacks, not a device figure"
                  for k, v, lo, hi in res.on_bounds]
        for k, a, b in res.moved:
            if (k in ("kernel overhead", "view overhead")
                    or k.startswith("GEMM call overhead")) and a > 0 and b > 10 * a:
                lines.append(f"  the fit needs a {k} {b / a:.0f}x the probed one "
                             f"({_fmt(k, a)} -> {_fmt(k, b)}): "
                             + ("the model prices these blocks as fused kernels, the blocks "
                                "run eager ops (per-op dispatch, unfused elementwise work)"
                                if not cal.traced else "the blocks spend time per op "
                                "that their op traces do not show (Python in the modules' "
                                "forward)") + "; the fitted figure absorbs that, it is not "
                             "the device's dispatch cost")
    lines.append("analytic vs measured, per block kind (MAPE = mean |predicted / measured - 1|):")
    lines.append(format_mape(before, mape_by_kind(cal.after)))
    return "\n".join(lines)
