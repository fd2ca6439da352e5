"""``puzzle-nas search [SPEC] [-o DIR] [--json]`` and ``puzzle-nas schema``."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from hwprofiles.units import GIB

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
DEFAULT_SPEC = EXAMPLES / "nemotron3-super-h100.json"


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("search", help="run a search from a JSON spec",
                       description="Price every alternative of every parent block, score it, "
                       "solve one MIP with HiGHS, and write blueprint.json, report.md, "
                       "library.json (and pareto.png for a sweep; deploy.json and "
                       "deploy_front.png with deploy.candidates).")
    p.add_argument("spec", nargs="?", default=None,
                   help=f"search spec JSON (default: the shipped example {DEFAULT_SPEC.name})")
    p.add_argument("-o", "--out", default=None,
                   help="output folder (default: out/<spec name>)")
    p.add_argument("--json", action="store_true",
                   help="print the blueprint JSON on stdout instead of the table")
    p.add_argument("--quiet", action="store_true", help="no progress bars")
    p.add_argument("--acceptance", type=float, default=None, metavar="A",
                   help="serve every workload with speculative decoding by the parent's MTP "
                   "head at A accepted tokens per verification step (bonus token included), "
                   "the same for the parent and every child; overrides the spec's acceptance")
    p.add_argument("--draft-tokens", type=int, default=None, metavar="D",
                   help="tokens the MTP head drafts per step for every workload (overrides the "
                   "spec's draft_tokens; a workload that drafts none needs it with --acceptance)")
    r = p.add_argument_group(
        "realize the pool (torch)",
        "Build every child of the pool (the spec's solver.diverse solutions), measure its "
        "held-out KL to the parent, write realized.json and blueprint-realized.json (the "
        "child with the lowest measured KL) beside the blueprints")
    r.add_argument("--realize", metavar="DATA", default=None,
                   help="held-out tokens to measure the children on (.npy, .bin, or text with "
                   "--tokenizer); the last --realize-tokens of them")
    r.add_argument("--realize-tokens", type=int, default=16384, metavar="N",
                   help="tokens measured (default 16384)")
    r.add_argument("--realize-parent", default=None, metavar="PATH",
                   help="parent checkpoint folder or .gguf (default: the spec's parent)")
    r.add_argument("--realize-scores", default=None, metavar="DIR",
                   help="scoring run whose BLD blocks build the children (default: the folder "
                   "of the spec's quality.scores when it holds blocks/index.json; else the "
                   "children are initialized from the parent)")
    r.add_argument("--seq-len", type=int, default=256, help="tokens per row (default 256)")
    r.add_argument("--tokenizer", default=None, metavar="TOKENIZER_JSON|bytes",
                   help="how to tokenize a text --realize file")
    p.set_defaults(func=run)
    s = sub.add_parser("schema", help="print the JSON schema of search specs")
    s.set_defaults(func=run_schema)


def run_schema(args: argparse.Namespace) -> int:
    from nas.spec import json_schema

    print(json.dumps(json_schema(), indent=2))
    return 0


def _speculative(path: Path, draft_tokens: int | None, acceptance: float | None):  # noqa: ANN202
    """``load_spec`` of ``path`` with ``nas.spec.with_speculation`` applied (the hash is of
    the spec as changed)."""
    from hwprofiles.errors import InputError, read_json
    from nas.spec import parse_spec, spec_hash, with_speculation

    data = read_json(path)
    if acceptance is None:
        raise InputError("needs --acceptance A (tokens accepted per step)", field="--draft-tokens")
    if draft_tokens is None and isinstance(data, dict):
        for name, w in (data.get("workloads") or {}).items():
            if isinstance(w, dict) and w.get("draft_tokens") is None:
                raise InputError(f"workload {name!r} drafts no tokens: give --draft-tokens D",
                                 field="--acceptance")
    data = with_speculation(data, draft_tokens, acceptance)
    return parse_spec(data, str(path)), path.resolve().parent, spec_hash(data)


def _realize_inputs(args: argparse.Namespace, spec, base: Path  # noqa: ANN001
                    ) -> tuple[Path, Path | None]:
    """The parent folder and the BLD scoring folder of ``--realize``, checked before the
    search runs (one line naming the flag otherwise)."""
    from hwprofiles.errors import InputError

    if args.realize_tokens < args.seq_len:
        raise InputError(f"{args.realize_tokens} is under one row of --seq-len {args.seq_len}",
                         field="--realize-tokens")
    raw = args.realize_parent
    if raw is None:
        if not isinstance(spec.parent, str):
            raise InputError("the spec's parent is an inline config (no weights): give the "
                             "checkpoint", field="--realize-parent")
        pp = Path(spec.parent)
        pp = pp if pp.is_absolute() else base / pp
        raw = str(pp.parent if pp.name == "config.json" else pp)
    from nas.hf.gguf import resolve_parent

    parent = Path(resolve_parent(raw) or raw)
    if not (parent / "config.json").is_file():
        raise InputError("expected a checkpoint folder (config.json + safetensors) or a .gguf",
                         field="--realize-parent", path=str(parent))
    if args.realize_scores is not None:
        scores: Path | None = Path(args.realize_scores)
        if not (Path(args.realize_scores) / "blocks" / "index.json").is_file():
            raise InputError("holds no BLD blocks (blocks/index.json): a `puzzle-nas score` "
                             "output folder", field="--realize-scores", path=str(scores))
    else:
        q = spec.quality.scores
        qp = None if q is None else (Path(q) if Path(q).is_absolute() else base / q)
        scores = qp.parent if qp is not None and \
            (qp.parent / "blocks" / "index.json").is_file() else None
    return parent, scores


def _realize(args: argparse.Namespace, out: Path, parent: Path, scores: Path | None) -> None:
    """``--realize``: build and measure the pool (nas.scoring.realize), print the table."""
    import sys

    from nas.scoring.data import load_tokens
    from nas.scoring.realize import realize, summary

    ids = load_tokens(args.realize, args.tokenizer)
    ids = ids[-args.realize_tokens:]
    if not args.json:
        print(f"realizing the pool on the last {len(ids):,} tokens of {args.realize} "
              f"(children from {'the BLD blocks of ' + str(scores) if scores else 'the parent'})"
              " ...", file=sys.stderr)
    rec = realize(out, parent, ids, scores, seq_len=args.seq_len, data_source=str(args.realize),
                  log=(lambda s: None) if args.quiet or args.json else None)
    if not args.json:
        for line in summary(rec):
            print(line)
        print()


def _ms(v: float) -> str:
    return f"{v * 1e3:,.2f} ms"


def run(args: argparse.Namespace) -> int:
    import sys

    from hwprofiles.errors import InputError
    from nas.search import run as run_search
    from nas.search.blueprint import budget_in_user_terms, engine_lines
    from nas.spec import load_spec

    path = Path(args.spec) if args.spec else DEFAULT_SPEC
    if args.acceptance is None and args.draft_tokens is None:
        spec, base, digest = load_spec(path)
    else:  # speculative decoding for every workload: the spec as if written with it
        spec, base, digest = _speculative(path, args.draft_tokens, args.acceptance)
    if args.out is not None and not args.out.strip():  # Path("") would mean "."
        raise InputError("is empty, expected a folder path (leave -o out for the default, "
                         f"out/{spec.name})", field="-o")
    out = Path(args.out) if args.out else Path("out") / spec.name
    progress = False if (args.quiet or args.json) else None
    if not (args.json or args.quiet):
        print(f"searching {spec.name} ({path}) ...", file=sys.stderr)
    realize = _realize_inputs(args, spec, base) if args.realize else None  # before the search
    res = run_search(spec, base, out, digest, progress=progress)
    bp = res.blueprints[0]
    if realize is not None:
        _realize(args, out, *realize)
    if args.json:
        print(json.dumps(bp.model_dump(), indent=2))
        return 0
    p, q, s = bp.params, bp.quality, bp.solver
    lib = res.library
    print(f"{spec.name}: {lib.num_blocks} parent blocks, {lib.num_replacements} alternatives, "
          f"priced on {bp.provenance['profile']} (tp={bp.provenance['tp']}) under "
          f"{bp.provenance['recipe']}; block runtimes "
          f"{bp.provenance.get('block_costs', 'analytic')}")
    for name, w in spec.workloads.items():
        if w.draft_tokens:
            print(f"{name}: speculative decoding, the parent's MTP head drafts {w.draft_tokens} "
                  f"tokens per step at acceptance {w.acceptance:g} (stated, the same for every "
                  "child); the head is a fixed cost of every child")
    gap = "-" if s["gap"] is None else f"{s['gap']:.1e}"
    print(f"solver: {s['status']}, objective {s['objective']:.6g}, gap {gap}, "
          f"{s['seconds']:.3f} s")
    print(f"quality: {q['value']:.6g} from {q['source']}")
    print(f"params: total {p['parent_total'] / 1e9:.2f} B -> {p['child_total'] / 1e9:.2f} B, "
          f"active {p['parent_active'] / 1e9:.2f} B -> {p['child_active'] / 1e9:.2f} B")
    print()
    hdr = (f"{'workload':<14}{'':<8}{'TTFT':>12}{'ms/token':>11}{'tok/s/GPU':>12}"
           f"{'user tok/s':>11}{'memory/GPU GiB':>16}{'max conc':>10}")
    print(hdr)
    for name, pc in bp.predicted.items():
        for who in ("parent", "child"):
            r = pc[who]
            print(f"{name:<14}{who:<8}{_ms(r['ttft_s']):>12}{r['tpot_s'] * 1e3:>11.2f}"
                  f"{r['throughput_tok_s']:>12,.0f}{r['per_user_tok_s']:>11,.1f}"
                  f"{r['memory_bytes'] / GIB:>16,.1f}{str(r['max_concurrency']):>10}"
                  + ("" if r.get("fits", True) else "  DOES NOT FIT"))
    print()
    for b in bp.budgets:
        user = budget_in_user_terms(bp, b)
        terms = "" if user is None else f"child {user[0]}, bound {user[1]}; "
        print(f"budget {b['spec']}: {'BINDS' if b['binding'] else 'slack'} "
              f"({terms}{b['key']} = {b['child_value']:.6g}, bound {b['bound']:.6g})")
    info = getattr(bp, "engines", None) or {}
    if info.get("targets"):
        print(f"searched for {', '.join(info['targets'])}:")
        for n in info.get("notes", []):
            print(f"  {n}")
    for line in engine_lines(bp):
        print(f"engine {line}")
    if res.deploy is not None:  # deploy.candidates: the child and its deployment together
        from nas.search.deploy import summary_lines

        print()
        for line in summary_lines(res.deploy):
            print(line)
        print()
    changed = sum(1 for c in bp.choices if c["change"] != "parent")
    print(f"{changed} of {len(bp.choices)} blocks changed; "
          f"{len(res.blueprints)} blueprint(s); total {res.timings['total_s']:.2f} s")
    print("wrote: " + ", ".join(str(f) for f in res.files))
    return 0
