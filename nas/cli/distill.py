"""``puzzle-nas distill CHILD --teacher PARENT --data TOKENS -o DIR [--tokens N] [--nproc N]``.

Global knowledge distillation of a built child from its parent (torch extra): logit KL
(plus ``--lm-weight`` times the LM loss), AdamW with warm-up and cosine decay, held-out KL,
LM loss and accuracy logged every ``--eval-every`` steps, a checkpoint every
``--checkpoint-every`` steps (rerunning the same command resumes from it; deleted once the
run has finished unless ``--keep-checkpoint``). ``--nproc N``
runs ``torchrun --standalone --nproc-per-node N -m nas.cli.distill`` with the same
arguments (gloo on CPU, nccl with ``--device cuda``): teacher and student sharded over the
ranks with FSDP2, sharded resumable checkpoints (``--replicas``: a whole copy of each per
rank, DistributedDataParallel); multi-node runs call torchrun themselves with their
rendezvous flags and ``-m nas.cli.distill``. Precision: a checkpoint stored in bf16 (or
fp16) trains by default in mixed precision, computing in its dtype from float32 master
weights and AdamW state (``--mixed-precision auto``); ``--pure-bf16`` keeps master weights
and AdamW state in bf16 too (half the memory of the weights, gradients and optimizer state,
at bf16's rounding of every update); float32 checkpoints train in float32.
``--activation-checkpointing`` recomputes each block's activations in the backward pass.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from hwprofiles.errors import InputError, first_error
from nas.launch import exit_rank, run_ranks
from nas.tokens import add_dtype_flag, add_token_flags, lr_list

if TYPE_CHECKING:
    from nas.arch import ModelArch

OUTPUT_FILES = ("model", "checkpoint", "distill.json", "kd_curve.png", "teacher-digest.json",
                "student-digest.json")


def add_arguments(p: argparse.ArgumentParser, launcher: bool = True) -> None:
    p.add_argument("child", help="the child checkpoint folder (puzzle-nas build -o DIR); "
                   "with --plan also a config.json or a blueprint.json")
    p.add_argument("--teacher", required=True, help="the parent checkpoint folder (with "
                   "--plan also its config.json)")
    p.add_argument("--data", help="training tokens: .npy (integers), .bin (raw, with "
                   "--bin-dtype) or UTF-8 text with --tokenizer (required unless --plan)")
    p.add_argument("--eval-data", help="held-out tokens (same formats); default: the last "
                   "--eval-tokens of --data, never trained on")
    p.add_argument("-o", "--output", help="output folder (resumable; required unless "
                   "--plan)")
    add_token_flags(p)
    add_dtype_flag(p)
    p.add_argument("--tokens", type=int, required=True, help="training tokens in all")
    p.add_argument("--seq-len", type=int, default=256, help="tokens per row (default 256)")
    p.add_argument("--batch", type=int, default=8,
                   help="rows per step over all ranks (the global batch; default 8)")
    p.add_argument("--micro-batch", type=_micro_arg, default=None, metavar="ROWS|auto",
                   help="rows per forward and backward pass on each rank: its share of the "
                   "batch runs as micro-batches whose gradients add up before the step "
                   "(gradient accumulation: the same step, activations for ROWS rows only); "
                   "must divide --batch / --nproc (default: the whole share at once). auto: "
                   "the largest that fits the memory per rank (--device-memory, --hardware's, "
                   "or on the CPU the memory available), by the plan")
    p.add_argument("--lr", type=float, default=3e-4, help="peak learning rate (default 3e-4)")
    p.add_argument("--min-lr-fraction", type=float, default=0.1,
                   help="cosine decay ends at this fraction of --lr (default 0.1)")
    p.add_argument("--warmup-steps", type=int, default=0, help="linear warm-up steps")
    p.add_argument("--weight-decay", type=float, default=0.0, help="AdamW weight decay")
    p.add_argument("--grad-clip", type=float, default=1.0, help="max gradient norm (0: none)")
    p.add_argument("--lm-weight", type=float, default=0.0,
                   help="weight of the LM loss added to the KL (default 0: KL only)")
    p.add_argument("--eval-every", type=int, default=50, help="steps between evaluations")
    p.add_argument("--eval-tokens", type=int, default=16384, help="held-out tokens evaluated")
    p.add_argument("--checkpoint-every", type=int, default=50,
                   help="steps between checkpoints (default 50)")
    p.add_argument("--keep-checkpoint", action="store_true",
                   help="keep DIR/checkpoint/ (the resume state: the student and the "
                   "optimizer state) after the run finishes; by default it is deleted once "
                   "distill.json and model/ are written")
    p.add_argument("--lr-sweep", type=lr_list, default=(), metavar="LR,LR,...",
                   help="try these peak learning rates first, each for --sweep-steps steps from "
                   "the child as given, and train with the one of lowest held-out KL (--lr "
                   "unused); the trials are in distill.json")
    p.add_argument("--sweep-steps", type=int, default=None,
                   help="steps per sweep trial (default: a quarter of the run)")
    p.add_argument("--patience", type=int, default=0, help="stop after this many evaluations "
                   "without a lower held-out KL (default 0: never early)")
    p.add_argument("--keep-last", action="store_true", help="write the last weights, not "
                   "those of the evaluation with the lowest held-out KL (the default, which "
                   "includes the child as given: never worse than the start)")
    p.add_argument("--seed", type=int, default=0, help="seed of the row sampling")
    p.add_argument("--device", default="cpu", choices=("cpu", "cuda"),
                   help="cpu (gloo) or cuda (nccl; rank r uses cuda:LOCAL_RANK)")
    p.add_argument("--mixed-precision", choices=("auto", "bfloat16", "float16", "none"),
                   default="auto",
                   help="compute in this dtype from float32 master weights and AdamW state "
                   "(FSDP2 mixed precision; the teacher is held in it); the model is written "
                   "in the child's stored dtype. auto (default): a checkpoint stored in 16 "
                   "bits computes in its dtype, float32 ones in float32, none with --dtype; "
                   "none: every tensor in the checkpoint's dtype (or --dtype)")
    p.add_argument("--pure-bf16", action="store_true",
                   help="pure bf16 training: compute, master weights and AdamW state all in "
                   "bfloat16 (--dtype bfloat16 --mixed-precision none)")
    p.add_argument("--activation-checkpointing", action="store_true",
                   help="recompute each block's activations in the backward pass instead of "
                   "keeping them (same weights, less memory)")
    p.add_argument("--replicas", action="store_true", help="with --nproc N: a whole teacher "
                   "and student on every rank (DistributedDataParallel), for models that fit "
                   "one rank; default: both sharded over the ranks (FSDP2)")
    p.add_argument("--teacher-layout", choices=("pipelined", "sharded"), default="pipelined",
                   help="with --nproc N (sharded ranks): pipelined (default) places the "
                   "teacher's blocks over the ranks and passes hidden states between them; "
                   "sharded shards it with FSDP2, which gathers every block at every step")
    p.add_argument("--expert-parallel", choices=("auto", "on", "off"), default="auto",
                   help="with --nproc N (sharded ranks) and a MoE student: shard its experts "
                   "whole over the ranks (each holds ceil(E/N) experts or fewer; tokens go to "
                   "their experts' ranks and back by all_to_all) instead of FSDP2 gathering "
                   "every MoE block whole. auto (default): on sharded ranks with a MoE "
                   "student; on: refuse a run where it cannot; off: FSDP2 only")
    p.add_argument("--json", action="store_true", help="print distill.json")
    p.add_argument("--plan", action="store_true", help="print the memory per rank (weights, "
                   "gradients, optimizer state, kept copies, gathered units, activations, "
                   "logits) and a roofline time per phase from the configs alone, and exit "
                   "(nothing is loaded; a plan that does not fit is refused)")
    p.add_argument("--hardware", help="hardware profile of the plan's times and default "
                   "capacity (a name from `puzzle-nas hw list` or a profile file)")
    p.add_argument("--device-memory", type=float, help="memory per rank in GiB (2^30 bytes) "
                   "a run must fit (default: --hardware's; on the CPU the available memory "
                   "over the ranks)")
    if launcher:
        p.add_argument("--nproc", type=int, default=1,
                       help="processes (ranks) on this node, launched with torchrun")


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "distill", help="knowledge-distill a built child from its parent",
        description="Train the child to match the parent's next-token distribution (logit "
        "KL, optionally plus LM loss) on the given tokens; resumable; DDP under torchrun.")
    add_arguments(p)
    p.set_defaults(func=run)


def settings_of(args: argparse.Namespace):
    """The :class:`nas.train.distill.DistillSettings` of the flags (pydantic errors name the
    flag)."""
    from pydantic import ValidationError

    from nas.train.distill import DistillSettings

    mixed = _mixed_flag(args)  # first: --pure-bf16 sets --dtype
    kw = dict(tokens=args.tokens, seq_len=args.seq_len, batch_size=args.batch,
              micro_batch=getattr(args, "micro_batch", None), lr=args.lr,
              min_lr_fraction=args.min_lr_fraction, warmup_steps=args.warmup_steps,
              weight_decay=args.weight_decay, grad_clip=args.grad_clip,
              lm_weight=args.lm_weight, eval_every=args.eval_every,
              eval_tokens=args.eval_tokens, checkpoint_every=args.checkpoint_every,
              seed=args.seed, dtype=args.dtype, lr_sweep=args.lr_sweep,
              sweep_steps=args.sweep_steps, patience=args.patience,
              keep_best=not args.keep_last, mixed_precision=mixed)
    flags = {"batch_size": "--batch", "micro_batch": "--micro-batch"}
    try:
        s = DistillSettings(**kw)
    except ValidationError as exc:
        loc, msg = first_error(exc)
        name = loc.split(".")[0] or ("mixed_precision" if "mixed_precision" in msg else "")
        raise InputError(f"{flags.get(name, '--' + name.replace('_', '-'))}: {msg}") from None
    return _resolved(s, args)


def _mixed_flag(args: argparse.Namespace) -> str | None:
    """``--mixed-precision`` / ``--pure-bf16`` as the settings' field (``--pure-bf16`` sets
    ``args.dtype``)."""
    mixed = getattr(args, "mixed_precision", "auto")
    if getattr(args, "pure_bf16", False):
        if mixed not in ("auto", "none"):
            raise InputError(f"--pure-bf16 with --mixed-precision {mixed}: pure bf16 keeps "
                             "the master weights in bfloat16; give one of the two")
        if args.dtype not in (None, "bfloat16"):
            raise InputError(f"--pure-bf16 with --dtype {args.dtype}: give one of the two")
        args.dtype = "bfloat16"
        return None
    return None if mixed == "none" else mixed


def _resolved(s, args: argparse.Namespace):
    """``s`` with ``--mixed-precision auto`` resolved from the two checkpoints' configs (a
    folder, a config.json or a blueprint.json; float32 when not found)."""
    from nas.train.plan import resolve_mixed_precision, stored_dtype

    if s.mixed_precision != "auto":
        return s
    dts = []
    for d in (args.child, args.teacher):
        try:
            dts.append(stored_dtype(_read_config(args, Path(d))))
        except InputError:
            dts.append("float32")  # refused later, by the check that names it
    try:
        mp = resolve_mixed_precision("auto", s.dtype, dts[0], dts[1], args.replicas)
    except ValueError as exc:
        raise InputError(str(exc)) from None
    return s.model_copy(update={"mixed_precision": mp})


def _read_config(args: argparse.Namespace, path: Path) -> dict:
    if not (path / "config.json").is_file() and not path.is_file():
        raise InputError("not found", path=str(path))
    return parent_of(args, path).config


def parent_of(args: argparse.Namespace, path: str | Path):
    """The :class:`nas.hf.Parent` of CHILD or ``--teacher`` (a checkpoint folder, a
    config.json or a blueprint.json), read once per command: the settings, the plan, the
    checks and the run all take it from here (kept on ``args`` by path)."""
    from nas.cli.build import read_child_config
    from nas.hf import Parent, from_hf

    memo = vars(args).setdefault("parents_read", {})
    key = str(path)
    if key not in memo:
        cfg, src = read_child_config(path)
        p = Path(path)
        memo[key] = Parent(from_hf(cfg, source=src), cfg, p / "config.json" if p.is_dir() else p)
    return memo[key]


def plan_of(args: argparse.Namespace, nproc: int, capacity: float | None = None):
    """The run's :class:`nas.train.plan.DistillPlan` from the two configs alone."""
    import hwprofiles
    from nas.train.plan import distill_plan, stored_dtype

    s = settings_of(args)
    models = []
    for flag, d in (("CHILD", args.child), ("--teacher", args.teacher)):
        path = Path(d)
        if not (path / "config.json").is_file() and not path.is_file():
            raise InputError("expected a checkpoint folder, a config.json or a blueprint.json",
                             path=str(d), field=flag)
        par = parent_of(args, path)
        models.append((par.arch, par.config))
    (child, c_cfg), (teacher, t_cfg) = models
    hw = None if not args.hardware else hwprofiles.get(args.hardware)
    if capacity is None and args.device_memory:
        capacity = args.device_memory * 2**30
    if capacity is None and hw is not None:
        capacity = hw.memory_bytes.value
    return distill_plan(
        child, teacher, world=nproc, replicas=args.replicas, batch=s.batch_size,
        seq_len=s.seq_len, tokens=s.tokens, eval_every=s.eval_every,
        eval_tokens=s.eval_tokens, teacher_dtype=s.dtype or stored_dtype(t_cfg),
        student_dtype=s.dtype or stored_dtype(c_cfg), mixed_precision=s.mixed_precision,
        keep_best=s.keep_best, lr_sweep=len(s.lr_sweep), sweep_steps=s.sweep_steps,
        checkpointing=args.activation_checkpointing, hw=hw, capacity=capacity,
        teacher_layout=getattr(args, "teacher_layout", "pipelined"),
        backend="nccl" if args.device == "cuda" or args.hardware else "gloo",
        expert_parallel=_ep_mode(args, child, nproc), micro_batch=s.micro_batch)


def _ep_mode(args: argparse.Namespace, child: ModelArch, nproc: int) -> str:
    """``--expert-parallel``, checked against the child's experts and the ranks (``on``
    where it cannot run: one line)."""
    from nas.train.plan import resolve_expert_parallel

    mode = getattr(args, "expert_parallel", "auto")
    layout = "whole" if nproc == 1 else ("replicas" if args.replicas else "sharded")
    try:
        resolve_expert_parallel(mode, child, nproc, layout)
    except ValueError as exc:
        raise InputError(str(exc), field="--expert-parallel") from None
    return mode


def _check_expert_parallel(args: argparse.Namespace, nproc: int) -> None:
    """``--expert-parallel on`` that cannot run is refused before any rank starts."""
    if getattr(args, "expert_parallel", "auto") != "on":
        return
    _ep_mode(args, parent_of(args, args.child).arch, nproc)


def _check_batch(args: argparse.Namespace) -> None:
    """The global batch divides over the ranks (before ``--micro-batch auto`` splits a share)."""
    if args.batch % args.nproc:
        raise InputError(f"--batch {args.batch} (the global batch) must be a multiple of "
                         f"the {args.nproc} ranks (--nproc)")


def _print_plan(args: argparse.Namespace) -> int:
    _check_batch(args)
    _auto_micro_batch(args, args.nproc)
    p = plan_of(args, args.nproc)
    for line in p.lines():
        print(line)
    if not p.fits():
        raise InputError(p.refusal())
    return 0


def _micro_arg(v: str) -> int | str:
    """``--micro-batch``: a positive number of rows, or ``auto``."""
    if v == "auto":
        return v
    try:
        n = int(v)
    except ValueError:
        n = 0
    if n < 1:
        raise argparse.ArgumentTypeError(f"expected a positive number of rows or auto, got {v!r}")
    return n


def _capacity(args: argparse.Namespace, nproc: int) -> tuple[float | None, bool]:
    """Memory per rank the plan is held to, and whether any is known: ``--device-memory``,
    else ``--hardware``'s (the plan reads it), else on the CPU the machine's available
    memory shared by the ranks."""
    from nas.cli.score import _available_memory

    cap = args.device_memory * 2**30 if args.device_memory else None
    if cap is None and args.hardware is None and args.device == "cpu":
        avail = _available_memory()
        cap = None if avail is None else avail / max(1, nproc)
    return cap, cap is not None or args.hardware is not None


def _auto_micro_batch(args: argparse.Namespace, nproc: int) -> None:
    """``--micro-batch auto``: the largest divisor of a rank's share of the batch whose plan
    fits the memory per rank (:func:`_capacity`; the whole share when none is known), said
    in one line; the smallest when none fits (the plan's refusal then says why)."""
    if args.micro_batch != "auto":
        return
    share = max(1, args.batch // nproc)
    cap, known = _capacity(args, nproc)
    args.micro_batch = share
    for m in (m for m in range(share, 0, -1) if known and share % m == 0):
        args.micro_batch = m
        if plan_of(args, nproc, cap).fits():
            break
    print(f"puzzle-nas distill: --micro-batch auto: {args.micro_batch} of the "
          f"{share} rows per rank per pass"
          + ("" if known else " (no memory per rank known: the whole share)"),
          file=sys.stderr)


def _check_fits(args: argparse.Namespace, nproc: int) -> None:
    """Refuse, before anything is loaded, a run whose plan does not fit: per rank, the
    ``--device-memory`` given (or ``--hardware``'s), or on the CPU the machine's available
    memory shared by the ranks."""
    cap, known = _capacity(args, nproc)
    if not known:
        return
    p = plan_of(args, nproc, cap)
    if not p.fits():
        raise InputError(p.refusal())


def _check(args: argparse.Namespace) -> None:
    from nas.io import check_output_dir

    for flag in ("data", "output"):
        if getattr(args, flag) is None:
            raise InputError(f"--{flag} is required (unless --plan)")

    for flag, d in (("CHILD", args.child), ("--teacher", args.teacher)):
        if not (Path(d) / "config.json").is_file():
            raise InputError("not a checkpoint folder (config.json + safetensors)", path=d,
                             field=flag)
    check_output_dir(args.output, lambda n: n in OUTPUT_FILES or n.startswith("."), "-o")
    s = settings_of(args)
    if args.replicas and s.mixed_precision:
        raise InputError("--mixed-precision runs on FSDP2 (sharded ranks): drop --replicas")


def _check_resume(args: argparse.Namespace, nproc: int) -> None:
    """A checkpoint of this run in the other layout (whole vs sharded) is refused in one line
    before anything loads; a sharded one resumes on any number of ranks."""
    from nas.train.distill import layout_of, resume_conflict

    s = settings_of(args)
    why = resume_conflict(args.output, s, layout_of(nproc, s, args.replicas))
    if why is not None:
        raise InputError(why)


def run_local(args: argparse.Namespace) -> int:
    """Distill in this process (one rank when launched by torchrun)."""
    from nas.hf.gguf import resolve_parent

    args.teacher = resolve_parent(args.teacher, "teacher")  # ranks started by hand
    _check(args)
    import os

    if int(os.environ.get("WORLD_SIZE", "1")) == 1:
        _check_resume(args, 1)
    from nas.scoring.data import load_tokens
    from nas.train.distill import distill

    if args.device == "cuda":
        import torch

        if not torch.cuda.is_available():
            raise InputError("--device cuda: no CUDA device is visible")
    train = load_tokens(args.data, args.tokenizer, args.bin_dtype)
    held = None if not args.eval_data else load_tokens(args.eval_data, args.tokenizer,
                                                       args.bin_dtype)
    # the configs as read for the checks above: the run does not read them again
    rec = distill(parent_of(args, args.child), parent_of(args, args.teacher), train,
                  args.output, settings_of(args), held=held,
                  data_source=args.data, eval_source=args.eval_data, device=args.device,
                  replicas=args.replicas, checkpointing=args.activation_checkpointing,
                  teacher_layout=args.teacher_layout,
                  expert_parallel=args.expert_parallel,
                  keep_checkpoint=args.keep_checkpoint)
    if rec is None:
        return 0
    if args.json:
        print(json.dumps(rec.model_dump(), indent=2))
        return 0
    f, t = rec.final, rec.teacher_eval
    print(f"{Path(args.output) / 'model'}: distilled {rec.steps} steps, "
          f"{rec.tokens_trained:,} tokens, {rec.world_size} rank(s), {rec.seconds:.1f} s"
          + (f" (resumed at step {rec.resumed_from_step})" if rec.resumed_from_step else ""))
    print(f"  held-out ({rec.held_tokens:,} tokens): KL to teacher {rec.curve[0].kl_div:.4f} "
          f"-> {f.kl_div:.4f} nats/token, LM loss {rec.curve[0].lm_loss:.4f} -> "
          f"{f.lm_loss:.4f} (teacher {t.lm_loss:.4f}), accuracy {f.accuracy:.4f} "
          f"(teacher {t.accuracy:.4f})")
    for note in rec.notes:  # a collapse, an unchanged child: one line each
        print(f"  {note}")
    return 0


def forward_args(args: argparse.Namespace) -> list[str]:
    """The rank command line for ``args`` (everything but ``--nproc``)."""
    out = [args.child, "--teacher", args.teacher, "--data", args.data, "-o", args.output]
    for name in ("eval_data", "tokenizer", "bin_dtype", "dtype", "mixed_precision",
                 "teacher_layout", "expert_parallel", "micro_batch"):
        if getattr(args, name, None) and getattr(args, name) != "auto":
            out += ["--" + name.replace("_", "-"), str(getattr(args, name))]
    for name in ("tokens", "seq_len", "batch", "lr", "min_lr_fraction", "warmup_steps",
                 "weight_decay", "grad_clip", "lm_weight", "eval_every", "eval_tokens",
                 "checkpoint_every", "seed", "device", "patience"):
        v = getattr(args, name)
        out += ["--" + name.replace("_", "-"), repr(v) if isinstance(v, float) else str(v)]
    if args.lr_sweep:
        out += ["--lr-sweep", ",".join(repr(x) for x in args.lr_sweep)]
    if args.sweep_steps is not None:
        out += ["--sweep-steps", str(args.sweep_steps)]
    for flag in ("keep_last", "replicas", "activation_checkpointing", "keep_checkpoint",
                 "pure_bf16"):
        if getattr(args, flag, False):
            out.append("--" + flag.replace("_", "-"))
    if args.json:
        out.append("--json")
    return out


#: a peak learning rate above this is warned about (AdamW fine-tuning uses ~1e-5 to 1e-3)
LR_WARN = 0.1


def lr_warning(lr: float, flag: str = "--lr") -> str | None:
    """A one-line warning for a learning rate far above AdamW's usual range, or None."""
    if lr > LR_WARN:
        return (f"warning: {flag} {lr:g} is far above the usual AdamW range for distillation "
                "(1e-5 to 1e-3); the run will likely diverge (it stops if the loss becomes "
                "NaN or infinite, or worse than knowing nothing)")
    return None


def run(args: argparse.Namespace) -> int:
    from nas.io import output_lock

    if (warn := lr_warning(args.lr)) is not None:
        print(f"puzzle-nas distill: {warn}", file=sys.stderr)
    if args.nproc < 1:
        raise InputError("--nproc must be >= 1")
    if args.plan:
        return _print_plan(args)
    _check_batch(args)
    from nas.hf.gguf import resolve_parent

    args.teacher = resolve_parent(args.teacher, "teacher")  # a .gguf: converted once
    _auto_micro_batch(args, args.nproc)  # before anything reads the settings
    _check(args)
    share = args.batch // args.nproc
    if args.micro_batch and share % args.micro_batch:
        raise InputError(f"--micro-batch {args.micro_batch} must divide each rank's share of "
                         f"the batch (--batch {args.batch} over --nproc {args.nproc}: {share})")
    _check_expert_parallel(args, args.nproc)
    _check_fits(args, args.nproc)
    # one run at a time per output folder (two would train into the same checkpoint): a
    # second is refused at once; the launcher holds the lock while its ranks run
    with output_lock(args.output, "-o"):
        if args.nproc == 1:
            return run_local(args)
        _check(args)  # bad input: one line and exit 2 here, before any rank starts
        _check_resume(args, args.nproc)
        return run_ranks("nas.cli.distill", args.nproc, forward_args(args))


def main(argv: list[str] | None = None) -> int:
    """``torchrun --nproc-per-node N -m nas.cli.distill CHILD --teacher DIR --data TOKENS -o
    DIR ...``: the arguments of ``puzzle-nas distill`` without ``--nproc``, one rank."""
    from nas.cli import rank_main

    return rank_main("distill", "knowledge distillation, one rank of torchrun", add_arguments,
                     run_local, argv)


if __name__ == "__main__":
    exit_rank(main())
