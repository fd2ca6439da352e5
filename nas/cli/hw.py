"""``puzzle-nas hw list`` and ``puzzle-nas hw show NAME``: the shipped hardware profiles."""

from __future__ import annotations

import argparse
import json

from hwprofiles.units import gb_gib


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("hw", help="list or show hardware profiles",
                       description="Shipped hardware profiles: memory, bandwidth, dense peak "
                       "FLOP/s per dtype, efficiency, interconnect; every figure with its source.")
    hw_sub = p.add_subparsers(dest="hw_command", metavar="{list,show}")
    ls = hw_sub.add_parser("list", help="one line per shipped profile")
    ls.add_argument("--json", action="store_true", help="print a JSON list")
    show = hw_sub.add_parser("show", help="every figure of one profile, with its source")
    show.add_argument("name", help="profile name or alias (e.g. h100-sxm, H100) or a JSON file")
    show.add_argument("--json", action="store_true", help="print the profile as JSON")
    p.set_defaults(func=run)


def _tf(v: float) -> str:
    return f"{v:>8,.0f}" if v else f"{'-':>8}"


def run(args: argparse.Namespace) -> int:
    import hwprofiles
    from hwprofiles.errors import InputError

    cmd = getattr(args, "hw_command", None)
    if cmd == "show":
        p = hwprofiles.get(args.name)
        if args.json:
            print(p.model_dump_json(indent=2))
            return 0
        print(f"{p.name}: {p.display_name} ({p.vendor})")
        if p.aliases:
            print(f"  aliases: {', '.join(p.aliases)}")
        if p.notes:
            print(f"  note: {p.notes}")
        for field, value, source in p.summary_rows():
            print(f"  {field:<34} {value:<24} {source}")
        assumed = p.assumed_figures()
        print(f"  assumed figures: {len(assumed)} of {len(p.sourced_figures())}"
              + (f" ({', '.join(assumed)})" if assumed else ""))
        bound = p.on_bound_figures()
        print(f"  fitted figures on a bound of the fit: {len(bound)}")
        for path, note in bound:
            print(f"    {path}: {note}")
        return 0
    if cmd in (None, "list"):
        names = hwprofiles.available()
        if getattr(args, "json", False):
            print(json.dumps([json.loads(hwprofiles.get(n).model_dump_json()) for n in names],
                             indent=2))
            return 0
        print(f"{'name':<15} {'device':<46} {'memory':<24} {'bandwidth':>10} "
              f"{'BF16':>8} {'FP8':>8} {'FP4':>8}  (dense TFLOP/s)")
        for n in names:
            p = hwprofiles.get(n)
            m = p.memory_bytes.value
            pk = {d: p.peak_flops[d].value / 1e12 for d in p.peak_flops}
            fp4 = max(pk.get("nvfp4", 0), pk.get("mxfp4", 0))
            print(f"{n:<15} {p.display_name:<46} {gb_gib(m):<24} "
                  f"{p.memory_bandwidth.value / 1e12:>6.2f} TB/s {_tf(pk['bf16'])} "
                  f"{_tf(pk.get('fp8', 0))} {_tf(fp4)}")
        return 0
    raise InputError(f"unknown hw subcommand {cmd!r}; expected list or show")
