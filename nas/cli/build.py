"""``puzzle-nas build BLUEPRINT_OR_CONFIG [--parent DIR --calib FILE] -o DIR``.

Builds the child model as torch modules, optionally initializes it from a parent
checkpoint (:func:`nas.build.init_from_parent`), saves ``config.json`` +
``model.safetensors`` and prints a parameter summary.

Input: a blueprint JSON (the child HF config under the key ``child``), a plain HF
``config.json``, or a folder holding one.

Calibration file (``--calib``): any token-data file the other commands read
(:mod:`nas.tokens`: ``.npy``, ``.bin`` with ``--bin-dtype``, ``.safetensors``, ``.json``, or
text with ``--tokenizer``, where ``--tokenizer bytes`` takes each UTF-8 byte as one id). A
1-D sequence is cut into rows of ``--calib-len`` tokens (the remainder dropped).
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path
from typing import Any

from hwprofiles.errors import InputError, read_json
from nas.tokens import add_token_flags

DTYPES = ("float32", "bfloat16", "float16")
# what a checkpoint folder holds (nas.build.checkpoint.CHECKPOINT_FILES, repeated here
# because that module imports torch)
CHECKPOINT_FILES = ("config.json", "model.safetensors", "model.safetensors.index.json",
                    "model-*-of-*.safetensors")


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "build", help="build a blueprint as a torch model, init from a parent, save",
        description="Build the child of a blueprint (or an HF config.json) as a torch model, "
        "optionally initialize it from a parent checkpoint using calibration tokens, and save "
        "it as config.json + model.safetensors with HF tensor names.")
    p.add_argument("config", help="blueprint.json (child config under 'child'), an HF "
                   "config.json, or a folder holding one")
    p.add_argument("-o", "--output", required=True, help="output folder")
    p.add_argument("--parent", help="parent checkpoint folder (config.json + safetensors)")
    p.add_argument("--calib", help="calibration tokens: .npy, .bin, .safetensors or .json "
                   "token ids, or text with --tokenizer (as score and distill read --data)")
    add_token_flags(p)
    p.add_argument("--blocks", metavar="SCORE_DIR", help="assemble the child from the blocks "
                   "trained by `puzzle-nas score --bld-steps N -o SCORE_DIR` (with --parent; "
                   "no --calib)")
    p.add_argument("--calib-len", type=int, default=256,
                   help="row length when cutting a 1-D calibration sequence (default 256)")
    p.add_argument("--model-type", help="HF model_type to export (default: chosen as nas.hf "
                   "does: the parent's plain type, nemotron-nas or nemotron_h_puzzle)")
    p.add_argument("--dtype", choices=DTYPES,
                   help="weights dtype (default: the parent's non-quantized dtype, else "
                   "float32)")
    p.add_argument("--seed", type=int, default=0, help="seed of any random init (default 0)")
    p.add_argument("--force", action="store_true", help="build even when the memory estimate "
                   "exceeds the memory available")
    p.add_argument("--json", action="store_true", help="print the summary as JSON")
    p.set_defaults(func=run)


def read_child_config(path: str | Path) -> tuple[dict[str, Any], str]:
    """The child HF config dict from a blueprint, a config.json or a folder, and its source."""
    path = Path(path)
    if path.is_dir():
        path = path / "config.json"
    data = read_json(path)
    if isinstance(data, dict) and "child" in data:
        if not isinstance(data["child"], dict):
            raise InputError("expected the child HF config object", path=str(path),
                             field="child")
        return data["child"], f"{path}: child"
    return data, str(path)


def read_stand_in(path: str | Path, num_blocks: int) -> list[int] | None:
    """A blueprint's ``stand_in`` (the parent block each child block is initialized from,
    written when the search space had spans; see :mod:`nas.build.spans`), or ``None``."""
    path = Path(path)
    if path.is_dir():
        return None
    data = read_json(path)
    pos = data.get("stand_in") if isinstance(data, dict) and "child" in data else None
    if pos is None:
        return None
    if not isinstance(pos, list) or len(pos) != num_blocks or not all(
            isinstance(j, int) and not isinstance(j, bool) for j in pos):
        raise InputError(f"expected a list of {num_blocks} parent block indices, one per "
                         "child block", path=str(path), field="stand_in")
    return pos


def read_calibration(path: str | Path, length: int = 256, tokenizer: str | None = None,
                     bin_dtype: str | None = None) -> Any:
    """Calibration token ids as a 2-D long tensor (:func:`nas.tokens.token_rows`)."""
    import torch

    from nas.tokens import token_rows

    if length < 1:
        raise InputError("--calib-len must be >= 1")
    return torch.from_numpy(token_rows(path, length, tokenizer, bin_dtype))


def _same_place(a: str | Path, b: str | Path) -> bool:
    a, b = Path(a), Path(b)
    try:
        if a.exists() and b.exists():
            return os.path.samefile(a, b)
    except OSError:
        pass
    return a.resolve() == b.resolve()


def check_output(args: argparse.Namespace) -> None:
    """The output folder, checked before any work: not the parent (nor the --blocks folder),
    creatable and writable, and holding nothing but an earlier checkpoint's files."""
    from nas.io import check_output_dir

    for flag, src in (("--parent", args.parent), ("--blocks", args.blocks)):
        if src and _same_place(args.output, src):
            raise InputError(f"is the {flag} folder; building into it would overwrite the "
                             "checkpoint it reads: choose another output folder",
                             path=str(args.output), field="-o")
    if args.parent and Path(args.output).resolve() in Path(args.parent).resolve().parents:
        raise InputError(f"is a folder above --parent {args.parent}; building there would "
                         "delete the parent: choose another output folder",
                         path=str(args.output), field="-o")
    check_output_dir(args.output, _is_checkpoint_file, "-o")


def _is_checkpoint_file(name: str) -> bool:
    from fnmatch import fnmatchcase

    return name.startswith(".") and name.endswith((".tmp", ".old")) or any(
        fnmatchcase(name, p) for p in CHECKPOINT_FILES)


def run(args: argparse.Namespace) -> int:
    """Build (see :func:`_run`), one run at a time per output folder: a second build into
    the same ``-o`` is refused at once (:func:`nas.io.output_lock`)."""
    from nas.io import output_lock

    with output_lock(args.output, "-o"):
        return _run(args)


def _run(args: argparse.Namespace) -> int:
    try:
        import torch
    except ImportError:
        raise InputError("building needs torch: pip install 'puzzle-nas[torch]'") from None

    from nas.build import (
        build_model,
        check_memory,
        estimate_build_memory,
        init_from_parent,
        save_pretrained,
    )
    from nas.hf import from_hf

    cfg, source = read_child_config(args.config)
    arch = from_hf(cfg, source=source)
    stand_in = read_stand_in(args.config, arch.num_blocks)
    if stand_in == list(range(arch.num_blocks)):
        stand_in = None  # every child block from its own position: no spans
    check_output(args)
    if args.blocks and (not args.parent or args.calib):
        raise InputError("--blocks takes --parent (the blocks the child keeps) and no --calib")
    if not args.blocks and bool(args.parent) != bool(args.calib):
        raise InputError("--parent and --calib go together (the parent's activations on the "
                         "calibration tokens rank what to keep)")
    report: list[str] = []
    left_out = None  # what the parent checkpoint holds that is not read (a vision tower ...)
    if args.blocks and stand_in is not None:
        raise InputError("--blocks assembles BLD blocks position by position; this blueprint "
                         "replaces spans of parent blocks (its stand_in), so build it with "
                         "--parent and --calib")
    if args.blocks:
        from nas.scoring.bld import assemble_child

        # the parent is read one block at a time: the memory is the child plus one block
        model = assemble_child(arch, args.parent, args.blocks,
                               getattr(torch, args.dtype) if args.dtype else None)
        report = model.init_report
    elif args.parent:
        # the parent is streamed from its safetensors one block at a time; the child is
        # materialized block by block in the target dtype
        from nas.build.checkpoint import CheckpointReader

        reader = CheckpointReader(args.parent)
        left_out = reader.left_out_note
        tokens = read_calibration(args.calib, args.calib_len, args.tokenizer, args.bin_dtype)
        dtype = getattr(torch, args.dtype) if args.dtype else reader.stored_dtype()
        from nas.build.inherit import MAX_TOKENS

        if stand_in is not None:
            # a child with spans: laid out at the parent's depth (no-ops in the removed
            # places), initialized there, the no-ops dropped (nas.build.spans)
            from nas.build.spans import expanded, init_from_parent_spans

            wide = expanded(arch, reader.arch, stand_in)
        else:
            wide = arch
        check_memory(estimate_build_memory(wide, dtype, reader.arch,
                                           min(tokens.numel(), MAX_TOKENS)), args.force)
        if stand_in is not None:
            model = init_from_parent_spans(arch, stand_in, args.parent, tokens,
                                           seed=args.seed, dtype=dtype)
        else:
            model = init_from_parent(arch, args.parent, tokens, seed=args.seed, dtype=dtype)
        report = model.init_report
    else:
        dtype = getattr(torch, args.dtype or "float32")
        check_memory(estimate_build_memory(arch, dtype), args.force)
        model = build_model(arch, seed=args.seed, dtype=dtype)
    if args.dtype:
        model = model.to(getattr(torch, args.dtype))
    out = save_pretrained(model, args.output, args.model_type)
    exported = json.loads((out / "config.json").read_text())["model_type"]
    pc = model.arch.param_counts()
    counted = model.num_stored()
    summary = {
        "output": str(out), "model_type": exported, "num_blocks": model.arch.num_blocks,
        "blocks_by_kind": model.arch.kind_counts(), "parameters": counted,
        "predicted_total": pc.total, "active_params": pc.active,
        "params_by_kind": pc.by_kind_total, "dtype": str(model.embed.weight.dtype)[6:],
        "mtp_blocks_not_built": len(model.arch.mtp_blocks), "init": report,
        "random_weights": not args.parent, "parent_left_out": left_out,
    }
    if args.json:
        print(json.dumps(summary, indent=2))
        return 0
    print(f"{out}: {exported}, {summary['num_blocks']} blocks "
          + ", ".join(f"{n} {k}" for k, n in summary["blocks_by_kind"].items()))
    print(f"  parameters {counted:,} ({counted / 1e9:.3f} B; predicted {pc.total:,}), "
          f"active {pc.active:,}, {summary['dtype']}")
    for k, n in pc.by_kind_total.items():
        print(f"    {k:<10} {n:>16,}")
    if model.arch.mtp_blocks:
        print(f"  MTP: {len(model.arch.mtp_blocks)} blocks in the config, not built or saved")
    if not args.parent:
        print(f"  weights: RANDOM (seed {args.seed}), not trained; pass --parent DIR --calib "
              "FILE to initialize the child from its parent")
    if args.parent:
        copied = sum(r.endswith(": copied") for r in report)
        print(f"  initialized from {args.parent}: {copied} blocks copied")
        if left_out:
            print(f"  parent: {left_out}")
        for r in report:
            if not r.endswith(": copied"):
                print(f"    {r}")
    return 0
