"""``puzzle-nas solve LIBRARY``: the MIP over a block library, from the command line."""

from __future__ import annotations

import argparse
import json
import math
import re
import time
from typing import Any

# the CLI registers its commands at start-up: the first solve's ``wall_seconds`` counts
# from here, so the imports of numpy, scipy and HiGHS and the library's reading are in it
# (later solves in the same process count from their own start)
_STARTED: float | None = time.perf_counter()
MAX_SWEEP_POINTS = 1000


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
                   help="KEY<=VALUE, KEY>=VALUE, KEY==VALUE or LO<=KEY<=HI (repeatable); VALUE "
                   "is a number (1e5, 80_000, inf) or a number with a unit word ('80 GiB', "
                   "'10 ms', '75B') converted to the unit the key's name says")
    p.add_argument("--count", action="append", default=[], metavar="EXPR",
                   help="TAG>=N / TAG<=N: number of chosen replacements with a tag; prefix "
                   "'blocks:' to count parent blocks they cover (repeatable)")
    p.add_argument("--pin", action="append", default=[], metavar="R",
                   help="replacement that must be chosen: its index, or BLOCK:LABEL "
                   "(e.g. 'layer_3:attention = no_op ...'; tabs in labels may be written as "
                   "\\t or as spaces) (repeatable)")
    p.add_argument("--forbid", action="append", default=[], metavar="R",
                   help="replacement that must not be chosen, as for --pin (repeatable)")
    p.add_argument("--diverse", type=int, default=None, metavar="N",
                   help="return a pool of N solutions, each differing from all earlier ones")
    p.add_argument("--min-distance", type=int, default=1, metavar="D",
                   help="with --diverse: parent blocks in which solutions must differ (default 1)")
    p.add_argument("--sweep", default=None, metavar="KEY=A:B:N",
                   help="re-solve with KEY<=v for N values from A to B; prints the Pareto frontier")
    p.add_argument("--workers", type=int, default=1, metavar="N",
                   help="with --sweep: solve the points in N threads (default 1)")
    p.add_argument("--time-limit", type=float, default=None, metavar="S", help="seconds per solve")
    p.add_argument("--gap", type=float, default=1e-4,
                   help="relative MIP gap (default 1e-4); 0 means optimal within 1e-9 relative")
    p.add_argument("--threads", type=int, default=None, help="HiGHS threads")
    p.add_argument("--seed", type=int, default=0, help="HiGHS random seed")
    p.add_argument("--verbose", action="store_true", help="HiGHS log on stderr")
    p.add_argument("--json", action="store_true",
                   help="print a JSON object (also when infeasible, with exit code 3); "
                   "'seconds' is the solve, 'wall_seconds' the whole call")
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
    if n > MAX_SWEEP_POINTS:
        raise InputError(f"--sweep {text!r}: N must be <= {MAX_SWEEP_POINTS:,} (each point is "
                         "a MIP solve of up to seconds, and a Pareto plot needs far fewer)")
    if not (math.isfinite(a) and math.isfinite(b)):
        raise InputError(f"--sweep {text!r}: A and B must be finite")
    vals = [a] if n == 1 else [a + (b - a) * i / (n - 1) for i in range(n)]
    return m.group(1).strip(), vals


def _esc(text: str) -> str:
    """A label for one line of text output: control characters (NVlabs labels hold tabs)
    written as escapes."""
    return "".join(ch if ch.isprintable() else ch.encode("unicode_escape").decode("ascii")
                   for ch in text)


def _g(v: float | None) -> str:
    return "n/a" if v is None else f"{v:.6g}"


def _why(message: str) -> str:
    """The explanation without a leading 'infeasible: ' (printed after the status)."""
    return message[len("infeasible: "):] if message.startswith("infeasible: ") else message


def resolve_replacement(lib: Any, text: str, flag: str) -> int:
    """A replacement index from ``INDEX`` or ``BLOCK:LABEL`` (BLOCK a block name or index;
    LABEL exact, with ``\\t``-style escapes, or equal up to runs of whitespace)."""
    from hwprofiles.errors import InputError

    t = str(text).strip()
    if re.fullmatch(r"\d+", t):
        i = int(t)
        if i >= lib.num_replacements:
            raise InputError(f"{flag} {t}: replacement index out of range "
                             f"[0, {lib.num_replacements})")
        return i
    if ":" not in t:
        raise InputError(f"{flag} {text!r}: expected a replacement index or BLOCK:LABEL")
    block, label = t.split(":", 1)
    names = [lib.block_name(b) for b in range(lib.num_blocks)]
    if block in names:
        b = names.index(block)
    elif re.fullmatch(r"\d+", block) and int(block) < lib.num_blocks:
        b = int(block)
    else:
        raise InputError(f"{flag} {text!r}: unknown block {block!r} (blocks are "
                         f"{names[0]}..{names[-1]})")

    def norm(s: str) -> str:
        return " ".join(s.split())

    try:
        unescaped = label.encode("latin-1", "backslashreplace").decode("unicode_escape")
    except UnicodeDecodeError:
        unescaped = label
    at = [r for r in range(lib.num_replacements) if int(lib.start[r]) == b]
    for match in (lambda s: s == label, lambda s: s == unescaped,
                  lambda s: norm(s) == norm(unescaped)):
        hits = [r for r in at if match(lib.labels[r])]
        if len(hits) == 1:
            return hits[0]
        if len(hits) > 1:
            raise InputError(f"{flag} {text!r}: {len(hits)} replacements at {block} have this "
                             f"label; use an index ({', '.join(map(str, hits))})")
    shown = "; ".join(_esc(lib.labels[r]) for r in at[:6])
    raise InputError(f"{flag} {text!r}: no replacement at {block} has the label "
                     f"{_esc(label)!r} (some there: {shown})")


def _print_result(lib: Any, res: Any, title: str = "") -> None:
    if title:
        print(title)
    gap = "n/a" if res.gap is None else f"{res.gap:.6g}"
    print(f"status {res.status}  objective {_g(res.objective)}  bound {_g(res.best_bound)}  "
          f"gap {gap}  nodes {res.nodes}  {res.seconds:.3f} s")
    if not res.ok:
        if res.message:
            print(f"  {_why(res.message)}")
        return
    for r in res.chosen:
        s, e = int(lib.start[r]), int(lib.end[r])
        where = lib.block_name(s) if e - s == 1 else f"{lib.block_name(s)}..{lib.block_name(e - 1)}"
        print(f"  {where:<16} [{r:>5}] {_esc(lib.labels[r])}")
    print("  totals:")
    for k in lib.additive_keys():
        print(f"    {k:<28} {res.totals[k]:.6g}")


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

    global _STARTED
    t0 = _STARTED if _STARTED is not None else time.perf_counter()
    _STARTED = None
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
    pin = [resolve_replacement(lib, p, "--pin") for p in args.pin]
    forbid = [resolve_replacement(lib, f, "--forbid") for f in args.forbid]
    common: dict[str, Any] = dict(counts=counts, pin=pin, forbid=forbid, options=opts)
    if args.diverse is not None and args.sweep is not None:
        raise InputError("--diverse and --sweep cannot be combined")

    def emit(out: dict[str, Any]) -> None:
        out["wall_seconds"] = time.perf_counter() - t0
        print(json.dumps(out, indent=2))

    def infeasible(message: str, seconds: float) -> int:
        if not args.json:
            raise InfeasibleError(message)
        emit({"status": "infeasible", "message": message, "seconds": seconds})
        return InfeasibleError.exit_code

    if args.sweep is not None:
        key, values = _parse_sweep(args.sweep)
        sw = sweep(lib, objective, budgets, key=key, values=values, workers=args.workers,
                   **common)
        if not any(r.ok for r in sw.results):
            at = sw.results[values.index(max(values))]
            return infeasible(f"no sweep point is feasible; at {key}<={max(values):g}: "
                              f"{_why(at.message)}", sum(r.seconds for r in sw.results))
        best = sw.results[sw.frontier[-1]]
        if args.json:
            out = best.to_dict(lib)
            out["sweep"] = sw.to_dict(lib)
            emit(out)
            return 0
        print(f"sweep {key} over {len(values)} values; Pareto frontier ({len(sw.frontier)} points):")
        for i in sw.frontier:
            r = sw.results[i]
            gap = "n/a" if r.gap is None else f"{r.gap:.6g}"
            print(f"  {key}<={values[i]:.6g}: {key} {r.totals[key]:.6g}  objective "
                  f"{_g(r.objective)}  ({r.status}, gap {gap})")
        for i, r in enumerate(sw.results):
            if not r.ok:
                print(f"  {key}<={values[i]:.6g}: {r.status}: {_why(r.message)}")
        _print_result(lib, best, f"loosest frontier point ({key}<={values[sw.frontier[-1]]:.6g}):")
        return 0

    if args.diverse is not None:
        try:
            pool = diverse_pool(lib, objective, budgets, n=args.diverse,
                                min_distance=args.min_distance, **common)
        except InfeasibleError as exc:
            return infeasible(str(exc), time.perf_counter() - t0)
        if args.json:
            out = pool[0].to_dict(lib)
            out["pool"] = [r.to_dict(lib) for r in pool]
            emit(out)
            return 0
        for i, r in enumerate(pool):
            _print_result(lib, r, f"solution {i + 1} of {len(pool)}:")
        return 0

    res = solve(lib, objective, budgets, **common)
    if res.status == "error":
        import sys

        print(f"puzzle-nas solve: {res.message}", file=sys.stderr)
        return 1
    if res.status == "infeasible":
        return infeasible(res.message or "infeasible", res.seconds)
    if args.json:
        emit(res.to_dict(lib))
    else:
        _print_result(lib, res)
    return 0
