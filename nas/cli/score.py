"""``puzzle-nas score SPEC --parent DIR --data TOKENS -o DIR [--bld-steps N] [--nproc N] ...``.

Replace-1-block scoring of every alternative the spec's search space generates (torch
extra). Writes ``scores.csv`` (point the spec's ``"quality": {"scores": ...}`` at it),
``scores.png``, ``scores.json`` and the resumable store; prints the most and least
sensitive blocks. ``--nproc N`` runs ``torchrun --standalone --nproc-per-node N -m
nas.cli.score`` with the same arguments, the parent sharded over the ranks as pipeline
stages (:mod:`nas.scoring.pipeline`; ``--replicas``: a whole parent per rank); multi-node runs call torchrun themselves with
their own rendezvous flags and ``-m nas.cli.score``.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from hwprofiles.errors import InputError, first_error
from nas.launch import exit_rank, run_ranks
from nas.tokens import add_dtype_flag, add_token_flags


def add_arguments(p: argparse.ArgumentParser, launcher: bool = True) -> None:
    p.add_argument("spec", help="search spec JSON (its search space gives the alternatives)")
    p.add_argument("--parent", help="parent checkpoint folder (config.json + safetensors, "
                   "sharded or not) or a .gguf file (gguf extra); must match the spec's "
                   "parent (required unless --plan: then the spec's parent config)")
    p.add_argument("--data", help="tokens: .npy (integers), .bin (raw, with --bin-dtype) or "
                   "UTF-8 text with --tokenizer (required unless --plan)")
    p.add_argument("-o", "--output", help="output folder (resumable; required unless --plan)")
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
    p.add_argument("--plan", action="store_true", help="print the memory per rank (weights, "
                   "cache, activations, optimizer) and time per phase of this run, before "
                   "loading anything, and exit (2 when it does not fit --device-memory)")
    p.add_argument("--hardware", help="hardware profile the plan's times and default capacity "
                   "come from (default: the spec's)")
    p.add_argument("--device-memory", type=float, help="memory per rank in GiB (2^30 bytes) "
                   "a plan must fit (default with --plan: the hardware profile's)")
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


def _settings(args: argparse.Namespace):
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


def _plan(args: argparse.Namespace, nproc: int, job=None):
    """The run's :class:`nas.scoring.plan.Plan` from configs alone (no weights, no data):
    ``job``'s parent checkpoint as it was read, else the configs read here."""
    import hwprofiles
    from nas import space
    from nas.hf import read_parent
    from nas.scoring.plan import plan
    from nas.spec import load_spec

    if job is not None and job.checkpoint is not None:
        spec, base, parent = job.spec, job.spec_path.resolve().parent, job.checkpoint
    else:
        spec, base, _ = load_spec(args.spec)
        # the configs alone (a .gguf's: nothing is dequantized); --parent as given, the
        # spec's relative to its folder
        parent = (read_parent(args.parent) if args.parent
                  else read_parent(spec.parent, base, f"{args.spec}: parent"))
    arch, cfg = parent.arch, parent.config
    dtype = args.dtype or {"bfloat16": "bfloat16", "float16": "float16"}.get(
        str(cfg.get("torch_dtype") or cfg.get("dtype") or "float32"), "float32")
    from nas.search.problem import resolve_profile

    # --hardware as given (relative to the working folder); the spec's as the search
    # resolves it (a file beside the spec, else a shipped name or alias)
    hw = hwprofiles.get(args.hardware) if args.hardware else resolve_profile(spec.hw.profile,
                                                                             base)
    cap = args.device_memory * 2**30 if args.device_memory else hw.memory_bytes.value
    alts = space.alternatives(arch, spec.search_space)
    return plan(arch, alts, _settings(args), 1 if args.replicas else nproc, hw, dtype, cap,
                cache_bytes=args.cache_gib * 2**30)


def _print_plan(args: argparse.Namespace, nproc: int, quiet: bool = False, job=None) -> int:
    p = _plan(args, nproc, job)
    for line in ([] if quiet else p.lines()):
        print(line)
    if not p.fits():
        worst = max(p.ranks, key=lambda r: r.total)
        raise InputError(f"the plan does not fit: rank {worst.rank} needs "
                         f"{worst.total / 2**30:.2f} GiB (weights {worst.weights / 2**30:.2f}, "
                         f"cache {worst.cache / 2**30:.2f}, activations "
                         f"{worst.activations / 2**30:.2f}, optimizer "
                         f"{worst.optimizer / 2**30:.2f}) of {p.capacity / 2**30:.2f} GiB "
                         "per rank; add ranks, lower --max-tokens / --calib-tokens / "
                         "--cache-gib, or use a device with more memory")
    return 0


def _available_memory() -> float | None:
    """Bytes of memory available on this machine (``/proc/meminfo``; None elsewhere)."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return float(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def _check_fits(args: argparse.Namespace, job) -> None:
    """Refuse, before anything is loaded, a run whose plan does not fit: per rank, the
    ``--device-memory`` given, or on the CPU the machine's available memory shared by the
    ranks."""
    cap = args.device_memory * 2**30 if args.device_memory else None
    if cap is None and args.device == "cpu":
        avail = _available_memory()
        cap = None if avail is None else avail / max(1, args.nproc)
    if cap is None:
        return
    args.device_memory = cap / 2**30
    if args.parent is not None:
        _print_plan(args, args.nproc, quiet=True, job=job)


def _job(args: argparse.Namespace):
    from nas.scoring.job import prepare

    for flag in ("parent", "data", "output"):
        if not getattr(args, flag):
            raise InputError(f"--{flag} is required (unless --plan)")
    if args.cache_gib < 0:
        raise InputError("--cache-gib must be >= 0")
    if Path(args.output).exists() and not Path(args.output).is_dir():
        raise InputError("exists and is not a folder", path=args.output)
    return prepare(args.spec, args.parent, args.data, _settings(args), args.tokenizer,
                   args.bin_dtype)


def run_local(args: argparse.Namespace, job=None) -> int:
    """Score in this process (one rank when launched by torchrun)."""
    from nas.hf.gguf import resolve_parent
    from nas.scoring.runner import run as run_scoring

    args.parent = resolve_parent(args.parent)  # a .gguf: its converted folder
    job = job or _job(args)
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
    if args.plan:
        return _print_plan(args, args.nproc)
    from nas.hf.gguf import resolve_parent

    # a .gguf parent: converted once here, before the ranks start (they get the folder)
    args.parent = resolve_parent(args.parent)
    job = _job(args)
    _check_fits(args, job)
    if args.nproc == 1:
        return run_local(args, job)
    if not args.replicas:  # bad input: one line and exit 2 here, before any rank starts
        from nas.scoring.stages import placement

        if args.naive:
            raise InputError("--naive runs every alternative through the whole parent on "
                             "one rank: with --nproc N > 1 add --replicas")
        placement(job.parent_arch, args.nproc, job.alts)  # the ranks can split the blocks
    return run_ranks("nas.cli.score", args.nproc, _forward(args))


def _forward(args: argparse.Namespace) -> list[str]:
    """The rank command line for ``args`` (everything but ``--nproc``)."""
    out = [args.spec, "--parent", args.parent, "--data", args.data, "-o", args.output]
    for name in ("tokenizer", "bin_dtype", "dtype", "hardware", "device_memory"):
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


def main(argv: list[str] | None = None) -> int:
    """``torchrun --nproc-per-node N -m nas.cli.score SPEC --parent DIR --data TOKENS -o DIR
    ...``: the arguments of ``puzzle-nas score`` without ``--nproc``, one rank."""
    from nas.cli import rank_main

    return rank_main("score", "replace-1-block scoring, one rank of torchrun", add_arguments,
                     run_local, argv)


if __name__ == "__main__":
    exit_rank(main())
