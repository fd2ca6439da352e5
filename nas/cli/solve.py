"""``puzzle-nas solve LIBRARY``: the MIP over a block library, from the command line."""

from __future__ import annotations

import argparse
import json
import re
from typing import Any


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "solve", help="pick the best child from a block library under budgets (HiGHS MIP)",
        description="Pick one replacement per covered span of parent blocks, best on the "
        "objective under every budget, with HiGHS. Totals include the library's constants. "
        "Exit codes: 0 solved, 2 bad input, 3 infeasible (with the explanation).")
    p.add_argument("library", help="block library (.json, .npz, or an NVlabs/puzzle "
                   "block_library.json)")
    p.add_argument("--objective", required=True,
                   help="score or cost key to minimize; 'max:KEY' to maximize; weighted sums "
                   "like 'kl_div+0.5*lm_loss'")
    p.add_argument("--budget", action="append", default=[], metavar="EXPR",
                   help="KEY<=VALUE, KEY>=VALUE, KEY==VALUE or LO<=KEY<=HI (repeatable)")
    p.add_argument("--count", action="append", default=[], metavar="EXPR",
                   help="TAG>=N / TAG<=N: number of chosen replacements with a tag; prefix "
                   "'blocks:' to count parent blocks they cover (repeatable)")
    p.add_argument("--pin", action="append", type=int, default=[], metavar="INDEX",
                   help="replacement index that must be chosen (repeatable)")
    p.add_argument("--forbid", action="append", type=int, default=[], metavar="INDEX",
                   help="replacement index that must not be chosen (repeatable)")
    p.add_argument("--diverse", type=int, default=None, metavar="N",
                   help="return a pool of N solutions, each differing from all earlier ones")
    p.add_argument("--min-distance", type=int, default=1, metavar="D",
                   help="with --diverse: parent blocks in which solutions must differ (default 1)")
    p.add_argument("--sweep", default=None, metavar="KEY=A:B:N",
                   help="re-solve with KEY<=v for N values from A to B; prints the Pareto frontier")
    p.add_argument("--time-limit", type=float, default=None, metavar="S", help="seconds per solve")
    p.add_argument("--gap", type=float, default=1e-4, help="relative MIP gap (default 1e-4)")
    p.add_argument("--threads", type=int, default=None, help="HiGHS threads")
    p.add_argument("--seed", type=int, default=0, help="HiGHS random seed")
    p.add_argument("--verbose", action="store_true", help="HiGHS log on stderr")
    p.add_argument("--json", action="store_true", help="print a JSON object")
    p.set_defaults(func=run)


def _parse_sweep(text: str) -> tuple[str, list[float]]:
    from hwprofiles.errors import InputError

    m = re.fullmatch(r"(.+)=([^:]+):([^:]+):(\d+)", text.strip())
    if not m:
        raise InputError(f"--sweep {text!r}: expected KEY=A:B:N")
    try:
        a, b, n = float(m.group(2)), float(m.group(3)), int(m.group(4))
    except ValueError:
        raise InputError(f"--sweep {text!r}: A and B must be numbers") from None
    if n < 1:
        raise InputError(f"--sweep {text!r}: N must be >= 1")
    vals = [a] if n == 1 else [a + (b - a) * i / (n - 1) for i in range(n)]
    return m.group(1).strip(), vals


def _print_result(lib: Any, res: Any, title: str = "") -> None:
    if title:
        print(title)
    gap = "n/a" if res.gap is None else f"{res.gap:.3g}"
    obj = "n/a" if res.objective is None else f"{res.objective:.6g}"
    bound = "n/a" if res.best_bound is None else f"{res.best_bound:.6g}"
    print(f"status {res.status}  objective {obj}  bound {bound}  gap {gap}  "
          f"nodes {res.nodes}  {res.seconds:.3f} s")
    if not res.ok:
        if res.message:
            print(f"  {res.message}")
        return
    for r in res.chosen:
        s, e = int(lib.start[r]), int(lib.end[r])
        where = lib.block_name(s) if e - s == 1 else f"{lib.block_name(s)}..{lib.block_name(e - 1)}"
        print(f"  {where:<16} [{r:>5}] {lib.labels[r]}")
    print("  totals:")
    for k, v in res.totals.items():
        print(f"    {k:<28} {v:.6g}")


def run(args: argparse.Namespace) -> int:
    from hwprofiles.errors import InputError
    from nas.library import BlockLibrary
    from nas.mip import (
        Budget,
        CountRule,
        InfeasibleError,
        Objective,
        SolveOptions,
        diverse_pool,
        solve,
        sweep,
    )

    lib = BlockLibrary.load(args.library)
    objective = Objective.parse(args.objective)
    for k in objective.weights:
        lib.kind(k)
    budgets = [Budget.parse(b) for b in args.budget]
    for b in budgets:
        lib.kind(b.key)
    counts = [CountRule.parse(c) for c in args.count]
    opts = SolveOptions(time_limit=args.time_limit, mip_rel_gap=args.gap, threads=args.threads,
                        seed=args.seed, verbose=args.verbose)
    common: dict[str, Any] = dict(counts=counts, pin=args.pin, forbid=args.forbid, options=opts)
    if args.diverse is not None and args.sweep is not None:
        raise InputError("--diverse and --sweep cannot be combined")

    if args.sweep is not None:
        key, values = _parse_sweep(args.sweep)
        sw = sweep(lib, objective, budgets, key=key, values=values, **common)
        if not any(r.ok for r in sw.results):
            raise InfeasibleError(f"no sweep point is feasible; at {key}<={max(values):g}: "
                                  f"{sw.results[values.index(max(values))].message}")
        best = sw.results[sw.frontier[-1]]
        if args.json:
            out = best.to_dict(lib)
            out["sweep"] = sw.to_dict(lib)
            print(json.dumps(out, indent=2))
            return 0
        print(f"sweep {key} over {len(values)} values; Pareto frontier ({len(sw.frontier)} points):")
        for i in sw.frontier:
            r = sw.results[i]
            print(f"  {key}<={values[i]:.6g}: {key} {r.totals[key]:.6g}  objective "
                  f"{r.objective:.6g}  ({r.status}, gap {r.gap if r.gap is not None else 'n/a'})")
        for i, r in enumerate(sw.results):
            if not r.ok:
                print(f"  {key}<={values[i]:.6g}: {r.status}: {r.message}")
        _print_result(lib, best, f"loosest frontier point ({key}<={values[sw.frontier[-1]]:.6g}):")
        return 0

    if args.diverse is not None:
        pool = diverse_pool(lib, objective, budgets, n=args.diverse,
                            min_distance=args.min_distance, **common)
        if args.json:
            out = pool[0].to_dict(lib)
            out["pool"] = [r.to_dict(lib) for r in pool]
            print(json.dumps(out, indent=2))
            return 0
        for i, r in enumerate(pool):
            _print_result(lib, r, f"solution {i + 1} of {len(pool)}:")
        return 0

    res = solve(lib, objective, budgets, **common)
    if res.status == "error":
        import sys

        print(f"puzzle-nas solve: {res.message}", file=sys.stderr)
        return 1
    res.raise_if_infeasible()
    if args.json:
        print(json.dumps(res.to_dict(lib), indent=2))
    else:
        _print_result(lib, res)
    return 0
