"""``puzzle-nas iterate SPEC --parent DIR --data TOKENS -o DIR``: iterative Puzzle.

For each of the spec's ``stages``: score the stage's parent (replace-1-block KL with BLD),
search under the stage's budgets, build the child from the BLD-trained blocks, distill it
from the teacher (the parent by default); the distilled child is the next stage's parent.
Resumable stage by stage (:mod:`nas.train.iterate`). Scoring flags are ``puzzle-nas score``'s,
distillation flags ``puzzle-nas distill``'s with a ``--kd-`` prefix. ``--nproc N`` runs each
stage's scoring and distillation as N ranks under torchrun on ``--device`` (the parent
sharded over the ranks as pipeline stages, teacher and student sharded with FSDP2;
``--replicas``: a whole copy per rank).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from hwprofiles.errors import InputError
from nas.tokens import add_dtype_flag, add_token_flags, lr_list


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "iterate", help="iterative search: search, build, distill, re-score per stage",
        description="Run the spec's stages: per stage score, search, build from BLD blocks, "
        "distill; the distilled child is the next stage's parent (torch extra).")
    p.add_argument("spec", help="search spec JSON with a 'stages' list")
    p.add_argument("--parent", required=True, help="parent checkpoint folder, or a .gguf "
                   "file (gguf extra)")
    p.add_argument("--data", required=True, help="training / scoring tokens (.npy, .bin, or "
                   "text with --tokenizer)")
    p.add_argument("--eval-data", help="held-out tokens for the distillation's evaluation")
    p.add_argument("--score-data", help="tokens each stage's scoring and BLD calibrate on "
                   "(default: --data), so that they and the distillation's never overlap")
    p.add_argument("-o", "--output", required=True, help="output folder (resumable)")
    p.add_argument("--teacher", help="distillation teacher, a folder or a .gguf file "
                   "(default: --parent)")
    p.add_argument("--parent-scores", help="an existing `puzzle-nas score` folder of --parent "
                   "for stage 0")
    add_token_flags(p)
    add_dtype_flag(p)
    p.add_argument("--seq-len", type=int, default=256, help="tokens per row (scoring and KD)")
    p.add_argument("--max-tokens", type=int, default=65536, help="scoring: held-out tokens")
    p.add_argument("--calib-tokens", type=int, default=8192, help="scoring: calibration tokens")
    p.add_argument("--bld-steps", type=int, default=100, help="scoring: BLD steps per "
                   "alternative (default 100; the builder needs trained blocks)")
    p.add_argument("--bld-lr", type=float, default=1e-3, help="scoring: BLD learning rate")
    p.add_argument("--kd-tokens", type=int, required=True, help="KD: training tokens per stage")
    p.add_argument("--kd-batch", type=int, default=8, help="KD: rows per step")
    p.add_argument("--kd-micro-batch", type=int, default=None, metavar="ROWS",
                   help="KD: rows per forward and backward pass on each rank (gradient "
                   "accumulation; see distill --micro-batch)")
    p.add_argument("--kd-lr", type=float, default=3e-4, help="KD: peak learning rate")
    p.add_argument("--kd-lm-weight", type=float, default=0.0, help="KD: LM loss weight")
    p.add_argument("--kd-eval-every", type=int, default=50, help="KD: steps between evals")
    p.add_argument("--kd-eval-tokens", type=int, default=16384, help="KD: held-out tokens")
    p.add_argument("--kd-lr-sweep", type=lr_list, default=(), metavar="LR,LR,...",
                   help="KD: peak learning rates tried first at every stage (see distill "
                   "--lr-sweep)")
    p.add_argument("--kd-patience", type=int, default=0,
                   help="KD: evaluations without a lower held-out KL before stopping")
    p.add_argument("--seed", type=int, default=0, help="seed of BLD and KD sampling")
    p.add_argument("--kd-mixed-precision", choices=("auto", "bfloat16", "float16", "none"),
                   default="auto",
                   help="KD: compute in this dtype from float32 master weights (see distill "
                   "--mixed-precision; auto, the default: a 16-bit checkpoint computes in its "
                   "dtype, float32 ones in float32; none: pure, the checkpoint's dtype)")
    p.add_argument("--activation-checkpointing", action="store_true",
                   help="KD: recompute each block's activations in the backward pass")
    p.add_argument("--keep-checkpoint", action="store_true",
                   help="KD: keep each stage's distill/checkpoint/ (the resume state) after "
                   "the stage's distillation has finished (default: removed)")
    p.add_argument("--nproc", type=int, default=1, help="ranks (processes on this node, "
                   "torchrun) each stage's scoring and distillation run on (default 1)")
    p.add_argument("--device", default="cpu", choices=("cpu", "cuda"),
                   help="cpu (gloo) or cuda (nccl; rank r uses cuda:LOCAL_RANK)")
    p.add_argument("--replicas", action="store_true", help="with --nproc N: a whole parent, "
                   "teacher and student on every rank (default: sharded over the ranks)")
    p.add_argument("--json", action="store_true", help="print iterate.json")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from pydantic import ValidationError

    from hwprofiles.errors import first_error

    try:
        import torch
    except ImportError:
        raise InputError("iterate needs torch: pip install 'puzzle-nas[torch]'") from None
    from nas.cli.distill import lr_warning
    from nas.scoring.job import Settings
    from nas.train.distill import DistillSettings
    from nas.train.iterate import run_iterate

    if (warn := lr_warning(args.kd_lr, "--kd-lr")) is not None:
        print(f"puzzle-nas iterate: {warn}", file=sys.stderr)
    if args.nproc < 1:
        raise InputError("--nproc must be >= 1")
    if args.kd_batch % args.nproc:
        raise InputError(f"--kd-batch {args.kd_batch} (the global batch) must be a multiple "
                         f"of the {args.nproc} ranks (--nproc)")
    if args.replicas and args.kd_mixed_precision not in ("auto", "none"):
        raise InputError("--kd-mixed-precision runs on FSDP2 (sharded ranks): drop --replicas")
    if args.device == "cuda" and not torch.cuda.is_available():
        raise InputError("--device cuda: no CUDA device is visible")
    from nas.hf.gguf import is_gguf, read_info, resolve_parent

    # a .gguf parent or teacher: converted once to a checkpoint folder, read as one (both
    # files checked before either is converted)
    for path in (args.parent, args.teacher):
        if is_gguf(path):
            read_info(path)
    args.parent = resolve_parent(args.parent)
    args.teacher = resolve_parent(args.teacher, "teacher")
    if not (Path(args.parent) / "config.json").is_file():
        raise InputError("not a checkpoint folder (config.json + safetensors)",
                         path=args.parent, field="--parent")
    try:
        ss = Settings(seq_len=args.seq_len, max_tokens=args.max_tokens,
                      calib_tokens=args.calib_tokens, bld_steps=args.bld_steps,
                      bld_lr=args.bld_lr, seed=args.seed, dtype=args.dtype)
        ds = DistillSettings(tokens=args.kd_tokens, seq_len=args.seq_len,
                             batch_size=args.kd_batch, micro_batch=args.kd_micro_batch,
                             lr=args.kd_lr,
                             lm_weight=args.kd_lm_weight, eval_every=args.kd_eval_every,
                             eval_tokens=args.kd_eval_tokens, seed=args.seed,
                             dtype=args.dtype, lr_sweep=args.kd_lr_sweep,
                             patience=args.kd_patience,
                             mixed_precision=None if args.kd_mixed_precision == "none"
                             else args.kd_mixed_precision)
    except ValidationError as exc:
        loc, msg = first_error(exc)
        raise InputError(f"{loc}: {msg}") from None
    rec = run_iterate(args.spec, args.parent, args.data, args.output, ss, ds,
                      eval_data=args.eval_data, tokenizer=args.tokenizer,
                      bin_dtype=args.bin_dtype, teacher=args.teacher,
                      parent_scores=args.parent_scores, nproc=args.nproc,
                      device=args.device, replicas=args.replicas,
                      checkpointing=args.activation_checkpointing,
                      keep_checkpoint=args.keep_checkpoint, score_data=args.score_data)
    if args.json:
        print(json.dumps(rec.model_dump(), indent=2))
        return 0
    print(f"{args.output}: {len(rec.stages)} stages, {rec.seconds:.1f} s; final model "
          f"{rec.final_model}")
    for st in rec.stages:
        f = st.final
        print(f"  {st.name}: {st.changed_blocks} blocks changed, params "
              f"{st.params['child_total']:,}; after KD held-out KL {f['kl_div']:.4f}, "
              f"LM loss {f['lm_loss']:.4f}, accuracy {f['accuracy']:.4f}")
    return 0
