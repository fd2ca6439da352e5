"""``puzzle-nas build BLUEPRINT_OR_CONFIG [--parent DIR --calib FILE] -o DIR``.

Builds the child model as torch modules, optionally initializes it from a parent
checkpoint (:func:`nas.child.init_from_parent`), saves ``config.json`` +
``model.safetensors`` and prints a parameter summary.

Input: a blueprint JSON (the child HF config under the key ``child``), a plain HF
``config.json``, or a folder holding one.

Calibration file (``--calib``): any token-data file the other commands read
(:mod:`nas.tokens`: ``.npy``, ``.bin`` with ``--bin-dtype``, ``.safetensors``, ``.json``, or
text with ``--tokenizer``, where ``--tokenizer bytes`` takes each UTF-8 byte as one id). A
1-D sequence is cut into rows of ``--calib-len`` tokens (the remainder dropped).

The parent's tokenizer files (:data:`nas.tokens.TOKENIZER_FILES`) are copied into the
child. ``build.json`` (:class:`BuildRecord`) records what the child was built from, so
that the same command again finds it built and exits at once; a build from other inputs
into a folder holding a child is refused unless ``--force``. The folder is written whole
(staged, then swapped in), with the record and the tokenizer inside.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError

from hwprofiles.errors import InputError, read_json
from nas.tokens import BYTES, TOKENIZER_FILES, add_token_flags

DTYPES = ("float32", "bfloat16", "float16")
RECORD = "build.json"
"""The build record in the output folder (:class:`BuildRecord`;
``nas.child.checkpoint.BUILD_RECORD``)."""
# what a checkpoint folder holds (nas.child.checkpoint.CHECKPOINT_FILES, repeated here
# because that module imports torch; the modeling files of nas.hf.remote are added where
# they are read)
CHECKPOINT_FILES = ("config.json", "model.safetensors", "model.safetensors.index.json",
                    "model-*-of-*.safetensors", *TOKENIZER_FILES, RECORD)


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
    p.add_argument("--force", action="store_true", help="build even when the output folder "
                   "holds a child built from other inputs (it is replaced whole) or when the "
                   "memory estimate exceeds the memory available; without it, the same build "
                   "again finds its child built and exits at once")
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
    written when the search space had spans; see :mod:`nas.child.spans`), or ``None``."""
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

    from nas.hf.remote import REMOTE_FILES  # a child's modeling code (no torch)

    return name.startswith(".") and name.endswith((".tmp", ".old")) or any(
        fnmatchcase(name, p) for p in (*CHECKPOINT_FILES, *REMOTE_FILES))


# ---- the build record: what a child was built from --------------------------------------
HASHED_BYTES = 64 << 20
"""Files up to this size are recorded by their SHA-256 (a blueprint rewritten with the same
content is the same input); larger ones (weights, big token files) by size and mtime."""


class FileStamp(BaseModel):
    """One file as a build read or wrote it: its size, modification time (ns) and, up to
    :data:`HASHED_BYTES`, the SHA-256 of its content (then the time is not compared)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    size: int
    mtime_ns: int
    sha256: str | None = None

    def same(self, other: FileStamp | None) -> bool:
        """The same content, as far as the stamps tell."""
        if other is None or other.size != self.size:
            return False
        if self.sha256 is not None and other.sha256 is not None:
            return self.sha256 == other.sha256
        return self.mtime_ns == other.mtime_ns


class BuildInputs(BaseModel):
    """What a build reads and how: the inputs' resolved paths, a :class:`FileStamp` of
    every file read (``files``, by resolved path; a folder is every file in it) and the
    flags that change the child. Two builds with equal inputs write the same child."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    config: str
    parent: str | None = None
    calib: str | None = None
    blocks: str | None = None
    files: dict[str, FileStamp]
    settings: dict[str, str | int | None]


class BuildRecord(BaseModel):
    """``build.json`` in the output folder: the :class:`BuildInputs`, the files written
    (by name, so a child changed since is noticed) and the summary the build printed
    (``--json``)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    format: int = 1
    inputs: BuildInputs
    outputs: dict[str, FileStamp]
    summary: dict[str, Any]


def file_stamp(path: str | Path) -> FileStamp:
    """The :class:`FileStamp` of ``path`` now."""
    import hashlib

    st = os.stat(path)
    digest = None
    if st.st_size <= HASHED_BYTES:
        h = hashlib.sha256()
        with open(path, "rb") as f:
            while chunk := f.read(1 << 20):
                h.update(chunk)
        digest = h.hexdigest()
    return FileStamp(size=st.st_size, mtime_ns=st.st_mtime_ns, sha256=digest)


def folder_stamps(folder: str | Path, recursive: bool = False) -> dict[str, FileStamp]:
    """Every regular file of ``folder`` (and its subfolders when ``recursive``) by path,
    leaving out hidden entries (a run's temps and locks)."""
    out = {}
    for root, dirs, names in os.walk(folder):
        dirs[:] = sorted(d for d in dirs if recursive and not d.startswith("."))
        for n in sorted(names):
            f = os.path.join(root, n)
            if not n.startswith(".") and os.path.isfile(f):
                out[f] = file_stamp(f)
    return out


def build_inputs(args: argparse.Namespace) -> BuildInputs:
    """The :class:`BuildInputs` of a build's flags, as the files are now."""
    real = os.path.realpath
    config = real(args.config)
    files: dict[str, FileStamp] = {}
    config_file = os.path.join(config, "config.json") if os.path.isdir(config) else config
    if os.path.isfile(config_file):
        files[config_file] = file_stamp(config_file)
    if args.parent:
        files |= folder_stamps(real(args.parent))
    if args.blocks:  # what assemble_child reads: SCORE_DIR/blocks/
        files |= folder_stamps(os.path.join(real(args.blocks), "blocks"), recursive=True)
    settings: dict[str, str | int | None] = {
        "model_type": args.model_type, "dtype": args.dtype, "seed": args.seed}
    if args.calib:
        if os.path.isfile(args.calib):
            files[real(args.calib)] = file_stamp(args.calib)
        tok = args.tokenizer
        if tok and tok != BYTES:
            tok = real(tok)
            if os.path.isfile(tok):
                files[tok] = file_stamp(tok)
        settings |= {"calib_len": args.calib_len, "tokenizer": tok,
                     "bin_dtype": args.bin_dtype}
    return BuildInputs(config=config, parent=args.parent and real(args.parent),
                       calib=args.calib and real(args.calib),
                       blocks=args.blocks and real(args.blocks), files=files,
                       settings=settings)


_FLAGS = {"config": "BLUEPRINT_OR_CONFIG", "parent": "--parent", "calib": "--calib",
          "blocks": "--blocks", "model_type": "--model-type", "dtype": "--dtype",
          "seed": "--seed", "calib_len": "--calib-len", "tokenizer": "--tokenizer",
          "bin_dtype": "--bin-dtype"}


def _changes(old: BuildRecord, new: BuildInputs, folder: Path) -> list[str]:
    """What differs between a recorded build and this one (empty: the same build, and the
    child as it was written)."""
    o = old.inputs
    out = [_FLAGS[k] for k in ("config", "parent", "calib", "blocks")
           if getattr(o, k) != getattr(new, k)]
    # a setting only one side has goes with an input only one side has (--calib-len ...)
    out += [_FLAGS.get(k, k) for k in o.settings
            if k in new.settings and o.settings[k] != new.settings[k]]
    changed = sorted(f for f in set(o.files) | set(new.files)
                     if f not in o.files or not o.files[f].same(new.files.get(f)))
    if changed and not out:  # the same inputs named, but their files differ
        more = f" and {len(changed) - 1} more" if len(changed) > 1 else ""
        out.append(f"{changed[0]}{more} changed since")
    now = {os.path.basename(n): stamp for n, stamp in folder_stamps(folder).items()
           if os.path.basename(n) != RECORD}
    if set(now) != set(old.outputs) or any(not s.same(now[n]) for n, s in old.outputs.items()):
        out.append("the child's files changed since it was built")
    return out


def check_built(args: argparse.Namespace, inputs: BuildInputs) -> BuildRecord | None:
    """The record of the child in ``-o`` when it was built from ``inputs`` (and is as it was
    written): the build is done. ``None`` when there is nothing there yet, or with
    ``--force``. A child from other inputs (or one without a record) is refused in one line
    without ``--force``."""
    out = Path(args.output)
    held = [n for n in os.listdir(out) if not n.startswith(".")] if out.is_dir() else []
    if not held or args.force:
        return None
    try:
        rec = BuildRecord.model_validate(read_json(out / RECORD))
    except (InputError, ValidationError):
        raise InputError("holds a checkpoint without a readable build record (build.json): "
                         "pass --force to replace it, or choose another folder",
                         path=str(out), field="-o") from None
    changes = _changes(rec, inputs, out)
    if changes:
        raise InputError(f"holds a child built from other inputs ({'; '.join(changes)}): "
                         "pass --force to replace it, or choose another folder",
                         path=str(out), field="-o")
    return rec


def run(args: argparse.Namespace) -> int:
    """Build (see :func:`_run`), one run at a time per output folder: a second build into
    the same ``-o`` is refused at once (:func:`nas.io.output_lock`)."""
    from nas.io import output_lock

    with output_lock(args.output, "-o"):
        return _run(args)


def _run(args: argparse.Namespace) -> int:
    from nas.hf import from_hf

    cfg, source = read_child_config(args.config)
    arch = from_hf(cfg, source=source)
    stand_in = read_stand_in(args.config, arch.num_blocks)
    if stand_in == list(range(arch.num_blocks)):
        stand_in = None  # every child block from its own position: no spans
    check_output(args)  # before a .gguf parent is resolved: never into or above its folder
    from nas.hf.gguf import resolve_parent

    args.parent = resolve_parent(args.parent)  # a .gguf: converted once, read as a folder
    if args.blocks and (not args.parent or args.calib):
        raise InputError("--blocks takes --parent (the blocks the child keeps) and no --calib")
    if not args.blocks and bool(args.parent) != bool(args.calib):
        raise InputError("--parent and --calib go together (the parent's activations on the "
                         "calibration tokens rank what to keep)")
    inputs = build_inputs(args)  # before anything is read: what the child is built from
    done = check_built(args, inputs)
    if done is not None:
        return _already_built(args, done)
    try:
        import torch
    except ImportError:
        raise InputError("building needs torch: pip install 'puzzle-nas[torch]'") from None

    from nas.child import (
        build_model,
        check_memory,
        estimate_build_memory,
        init_from_parent,
        save_pretrained,
    )
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
        from nas.child.checkpoint import CheckpointReader

        reader = CheckpointReader(args.parent)  # opened once: the init reads it as it is
        left_out = reader.left_out_note
        tokens = read_calibration(args.calib, args.calib_len, args.tokenizer, args.bin_dtype)
        dtype = getattr(torch, args.dtype) if args.dtype else reader.stored_dtype()
        from nas.child.inherit import MAX_TOKENS

        if stand_in is not None:
            # a child with spans: laid out at the parent's depth (no-ops in the removed
            # places), initialized there, the no-ops dropped (nas.child.spans)
            from nas.child.spans import expanded, init_from_parent_spans

            wide = expanded(arch, reader.arch, stand_in)
        else:
            wide = arch
        check_memory(estimate_build_memory(wide, dtype, reader.arch,
                                           min(tokens.numel(), MAX_TOKENS)), args.force)
        if stand_in is not None:
            model = init_from_parent_spans(arch, stand_in, reader, tokens,
                                           seed=args.seed, dtype=dtype)
        else:
            model = init_from_parent(arch, reader, tokens, seed=args.seed, dtype=dtype)
        report = model.init_report
    else:
        dtype = getattr(torch, args.dtype or "float32")
        check_memory(estimate_build_memory(arch, dtype), args.force)
        model = build_model(arch, seed=args.seed, dtype=dtype)
    if args.dtype:
        model = model.to(getattr(torch, args.dtype))
    pc = model.arch.param_counts()
    counted = model.num_stored()
    summary: dict[str, Any] = {
        "output": str(Path(args.output)), "model_type": None, "num_blocks": model.arch.num_blocks,
        "blocks_by_kind": model.arch.kind_counts(), "parameters": counted,
        "predicted_total": pc.total, "active_params": pc.active,
        "params_by_kind": pc.by_kind_total, "dtype": str(model.embed.weight.dtype)[6:],
        "mtp_blocks_not_built": len(model.arch.mtp_blocks), "init": report,
        "random_weights": not args.parent, "parent_left_out": left_out, "tokenizer": [],
        "already_built": False,
    }

    def finish(staged: Path) -> None:
        """The parent's tokenizer and the build record, into the staged folder."""
        from nas.io import atomic_write_json
        from nas.tokens import copy_tokenizer

        summary["model_type"] = read_json(staged / "config.json")["model_type"]
        summary["tokenizer"] = copy_tokenizer([args.parent] if args.parent else [], staged)
        outputs = {os.path.basename(n): s for n, s in folder_stamps(staged).items()}
        atomic_write_json(staged / RECORD, BuildRecord(
            inputs=inputs, outputs=outputs, summary=summary).model_dump(mode="json"))

    out = save_pretrained(model, args.output, args.model_type, extra=finish)
    exported = summary["model_type"]
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
    if summary["tokenizer"]:
        print(f"  tokenizer: {', '.join(summary['tokenizer'])} copied from the parent")
    return 0


def _already_built(args: argparse.Namespace, rec: BuildRecord) -> int:
    """The same build again: say so (the recorded summary with ``--json``), exit 0."""
    if args.json:
        print(json.dumps(rec.summary | {"output": str(Path(args.output)), "already_built": True},
                         indent=2))
        return 0
    s = rec.summary
    print(f"{Path(args.output)}: already built from these inputs ({s.get('model_type')}, "
          f"{s.get('parameters', 0):,} parameters; {RECORD} says what from); nothing to do "
          "(--force builds it again)")
    return 0
