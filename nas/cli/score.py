"""``puzzle-nas score SPEC --parent DIR --data TOKENS -o DIR [--bld-steps N] [--nproc N] ...``.

Replace-1-block scoring of every alternative the spec's search space generates (torch
extra). Writes ``scores.csv`` (point the spec's ``"quality": {"scores": ...}`` at it),
``scores.png``, ``scores.json`` and the resumable store; prints the most and least
sensitive blocks. ``--nproc N`` runs ``torchrun --standalone --nproc-per-node N -m
nas.scoring`` with the same arguments, the parent sharded over the ranks as pipeline
stages (:mod:`nas.scoring.pipeline`; ``--replicas``: a whole parent per rank); multi-node runs call torchrun themselves with
their own rendezvous flags and ``-m nas.scoring``.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from hwprofiles.errors import InputError, first_error
from nas.cli import run_ranks
from nas.tokens import add_dtype_flag, add_token_flags


def add_arguments(p: argparse.ArgumentParser, launcher: bool = True) -> None:
    p.add_argument("spec", help="search spec JSON (its search space gives the alternatives)")
    p.add_argument("--parent", required=True, help="parent checkpoint folder (config.json + "
                   "safetensors, sharded or not); must match the spec's parent")
    p.add_argument("--data", required=True, help="tokens: .npy (integers), .bin (raw, with "
                   "--bin-dtype) or UTF-8 text with --tokenizer")
    p.add_argument("-o", "--output", required=True, help="output folder (resumable)")
    add_token_flags(p)
    add_dtype_flag(p)
    p.add_argument("--seq-len", type=int, default=256, help="tokens per row (default 256)")
    p.add_argument("--batch-size", type=int, default=8, help="rows per forward (default 8)")
    p.add_argument("--max-tokens", type=int, default=65536,
                   help="held-out tokens to score on, the end of the data (default 65536)")
    p.add_argument("--calib-tokens", type=int, default=8192, help="calibration tokens for "
                   "init and BLD, the start of the data (default 8192)")
    p.add_argument("--bld-steps", type=int, default=0,
                   help="blockwise local distillation steps per alternative (default 0: none)")
    p.add_argument("--bld-lr", type=float, default=1e-3, help="BLD learning rate (AdamW)")
    p.add_argument("--bld-batch", type=int, default=4, help="BLD rows per step (default 4)")
    p.add_argument("--seed", type=int, default=0, help="seed of random inits / BLD sampling")
    p.add_argument("--cache-gib", type=float, default=4.0, help="prefix-cache memory per "
                   "process in GiB (2^30 bytes); the rest spills to OUTPUT/cache (default 4)")
    p.add_argument("--device", default="cpu", choices=("cpu", "cuda"),
                   help="cpu (gloo) or cuda (nccl; rank r uses cuda:LOCAL_RANK)")
    p.add_argument("--naive", action="store_true", help="no prefix cache: every alternative "
                   "runs the whole model (a reference for the cached path)")
    p.add_argument("--json", action="store_true", help="print scores.json instead of a summary")
    p.add_argument("--replicas", action="store_true", help="with --nproc N: load the whole "
                   "parent on every rank and share the alternatives out (for a parent that "
                   "fits one rank); default: the parent is sharded over the ranks as "
                   "pipeline stages, no rank holds all of it")
    if launcher:
        p.add_argument("--nproc", type=int, default=1,
                       help="processes (ranks) on this node, launched with torchrun")


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "score", help="measure replace-1-block quality (KL) of every alternative",
        description="Score every (block, alternative) of a spec's search space: the parent "
        "with only that block replaced (initialized from the parent, optionally BLD-trained) "
        "against the parent on held-out tokens. Writes scores.csv for the spec's "
        "quality.scores.")
    add_arguments(p)
    p.set_defaults(func=run)


def _settings(args: argparse.Namespace):  # type: ignore[no-untyped-def]
    from pydantic import ValidationError

    from nas.scoring.job import Settings

    try:
        return Settings(seq_len=args.seq_len, batch_size=args.batch_size,
                        max_tokens=args.max_tokens, calib_tokens=args.calib_tokens,
                        bld_steps=args.bld_steps, bld_lr=args.bld_lr, bld_batch=args.bld_batch,
                        seed=args.seed, dtype=args.dtype)
    except ValidationError as exc:
        loc, msg = first_error(exc)
        name = "--" + loc.split(".")[0].replace("_", "-")
        raise InputError(f"{name}: {msg}") from None


def _job(args: argparse.Namespace):  # type: ignore[no-untyped-def]
    from nas.scoring.job import prepare

    if args.cache_gib < 0:
        raise InputError("--cache-gib must be >= 0")
    if Path(args.output).exists() and not Path(args.output).is_dir():
        raise InputError("exists and is not a folder", path=args.output)
    return prepare(args.spec, args.parent, args.data, _settings(args), args.tokenizer,
                   args.bin_dtype)


def run_local(args: argparse.Namespace) -> int:
    """Score in this process (one rank when launched by torchrun)."""
    from nas.scoring.runner import run as run_scoring

    job = _job(args)
    if args.device == "cuda":
        import torch

        if not torch.cuda.is_available():
            raise InputError("--device cuda: no CUDA device is visible")
    record = run_scoring(job, args.output, cache_bytes=args.cache_gib * 2**30,
                         device=args.device, cached=not args.naive, replicas=args.replicas)
    if record is None:
        return 0
    if args.json:
        print(json.dumps(record.model_dump(), indent=2))
        return 0
    out = Path(args.output)
    print(f"{out / 'scores.csv'}: {record.alternatives} alternatives scored on "
          f"{record.held_tokens_scored:,} held-out tokens ({record.scored_now} now, "
          f"{record.reused} reused), {record.world_size} rank(s), {record.seconds:.1f} s")
    if record.parent_left_out:
        print(f"  parent: {record.parent_left_out}")  # as puzzle-nas build says it
    for line in record.summary:
        print("  " + line)
    print(f'  use it: "quality": {{"scores": "{out / "scores.csv"}", "metric": "kl_div"}}')
    return 0


def run(args: argparse.Namespace) -> int:
    if args.nproc < 1:
        raise InputError("--nproc must be >= 1")
    if args.nproc == 1:
        return run_local(args)
    job = _job(args)  # bad input: one line and exit 2 here, before any rank starts
    if not args.replicas:
        from nas.scoring.stages import stage_bounds

        if args.naive:
            raise InputError("--naive runs every alternative through the whole parent on "
                             "one rank: with --nproc N > 1 add --replicas")
        stage_bounds(job.parent_arch, args.nproc, job.alts)  # the ranks can split the blocks
    return run_ranks("nas.scoring", args.nproc, _forward(args))


def _forward(args: argparse.Namespace) -> list[str]:
    """The rank command line for ``args`` (everything but ``--nproc``)."""
    out = [args.spec, "--parent", args.parent, "--data", args.data, "-o", args.output]
    for name in ("tokenizer", "bin_dtype", "dtype"):
        if getattr(args, name):
            out += ["--" + name.replace("_", "-"), str(getattr(args, name))]
    for name in ("seq_len", "batch_size", "max_tokens", "calib_tokens", "bld_steps", "bld_lr",
                 "bld_batch", "seed", "cache_gib", "device"):
        out += ["--" + name.replace("_", "-"), repr(getattr(args, name))
                if isinstance(getattr(args, name), float) else str(getattr(args, name))]
    for flag in ("naive", "replicas"):
        if getattr(args, flag):
            out.append("--" + flag)
    if args.json:
        out.append("--json")
    return out
