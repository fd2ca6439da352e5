"""Blockwise local distillation (BLD) and the trained-block files the builder reads.

BLD trains one child block alone to reproduce the parent block's residual-branch output
``y_p = block_p(x) - x`` from the parent's own input activations ``x`` (the calibration
rows of the scoring run), with the normalized MSE of Puzzle:
``||y_c - y_p||^2 / ||y_p||^2`` per batch, AdamW (no weight decay), a fixed number of steps
and rows per step, rows sampled by a generator seeded from the result's key.

Trained blocks are saved as ``blocks/<key>.safetensors`` in the scoring folder (tensor
names as in :class:`~nas.modules.model.Block`'s ``state_dict``; the metadata holds a
:class:`BldMeta`), and ``blocks/index.json`` (:class:`BldIndex`) lists those of the last
run. :func:`assemble_child` builds a child from them.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from pydantic import BaseModel, ConfigDict, ValidationError

from hwprofiles.errors import InputError, first_error, read_json
from nas.arch import ModelArch
from nas.io import atomic_write, atomic_write_json
from nas.modules.mamba import MambaMixer
from nas.modules.model import Block, CausalLM
from nas.scoring.digest import weights_digest

if TYPE_CHECKING:
    from nas.child.checkpoint import CheckpointReader

META_KEY = "puzzle_nas_bld"


class BldMeta(BaseModel):
    """What a trained-block file is: which block, which alternative, from which parent."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    key: str
    block: int
    alternative: str
    child: dict[str, Any]
    parent_weights: str
    steps: int
    loss: float
    kept: str | None = None
    """``"init"`` when BLD made the block worse on held-out and the file holds the
    initialized block (``steps`` and ``loss`` are then the discarded training's)."""


class BldIndex(BaseModel):
    """``blocks/index.json``: the trained blocks of one scoring run."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    parent_weights: str
    blocks: list[BldMeta]
    files: list[str]


def _nmse(branch: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor, y: torch.Tensor
          ) -> torch.Tensor:
    out = branch(x)
    return (out - y).pow(2).sum() / y.pow(2).sum().clamp_min(torch.finfo(y.dtype).tiny)


def train_residual(module: torch.nn.Module, branch: Callable[[torch.Tensor], torch.Tensor],
                   x: torch.Tensor, y: torch.Tensor, settings: Any, seed: int
                   ) -> dict[str, Any]:
    """Train ``module`` in place so that ``branch(x)`` (its residual branch) maps inputs
    ``x`` to the parent's residual outputs ``y`` (rows, length, hidden): AdamW on the
    normalized MSE over random row batches; returns ``bld_steps`` and the final normalized
    MSE on all rows. One block (:func:`train_block`) and a span of blocks
    (``nas.scoring.span_scoring``) train with it."""
    params = [p for p in module.parameters() if p.requires_grad]
    if not params or settings.bld_steps == 0:
        return {"bld_steps": 0, "bld_loss": None}
    g = torch.Generator().manual_seed(seed)
    opt = torch.optim.AdamW(params, lr=settings.bld_lr, weight_decay=0.0)
    module.train()
    with torch.enable_grad():
        for _ in range(settings.bld_steps):
            idx = torch.randint(0, x.shape[0], (settings.bld_batch,), generator=g)
            idx = idx.to(x.device)
            loss = _nmse(branch, x[idx], y[idx])
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
    module.eval()
    with torch.no_grad():
        final = float(_nmse(branch, x, y))
    return {"bld_steps": settings.bld_steps, "bld_loss": final}


def train_block(block: Block, x: torch.Tensor, y: torch.Tensor, settings: Any,
                seed: int) -> dict[str, Any]:
    """Train ``block`` in place on inputs ``x`` and parent residual outputs ``y`` (rows,
    length, hidden); returns ``bld_steps`` and the final normalized MSE on all rows."""
    m = block.residual_multiplier  # Granite scales the branch (1 for every other type)
    if m != 1.0:
        return train_residual(block, lambda t: block.mixer(block.norm(t)) * m,  # type: ignore[misc]  # norm is set exactly when mixer is (Block.__init__); no-op blocks are not trained
                              x, y, settings, seed)
    return train_residual(block, lambda t: block.mixer(block.norm(t)),  # type: ignore[misc]  # norm is set exactly when mixer is (Block.__init__); no-op blocks are not trained
                          x, y, settings, seed)


def save_block(path: Path, block: Block, meta: BldMeta) -> Path:
    """Write a trained block atomically (safetensors + :class:`BldMeta` metadata)."""
    from safetensors.torch import save_file

    tensors = {k: v.detach().cpu().contiguous().clone() for k, v in block.state_dict().items()}
    md = {"format": "pt", META_KEY: meta.model_dump_json()}
    return atomic_write(path, lambda p: save_file(tensors, str(p), metadata=md))


def write_index(folder: Path, parent_weights: str, metas: list[BldMeta],
                files: list[str]) -> Path:
    idx = BldIndex(parent_weights=parent_weights, blocks=metas, files=files)
    return atomic_write_json(folder / "blocks" / "index.json", idx.model_dump())


def read_index(score_dir: str | Path) -> BldIndex:
    path = Path(score_dir) / "blocks" / "index.json"
    if not path.exists():
        raise InputError("no trained blocks here (run puzzle-nas score with --bld-steps N)",
                         path=str(path))
    try:
        return BldIndex.model_validate(read_json(path))
    except ValidationError as exc:
        loc, msg = first_error(exc)
        raise InputError(msg, path=str(path), field=loc) from None


class _Parent:
    """Where :func:`assemble_child` reads the parent's tensors from: a loaded model, or a
    checkpoint folder read one submodule at a time (:class:`CheckpointReader`)."""

    def __init__(self, parent: CausalLM | CheckpointReader | str | Path, score_dir: Path,
                 dtype: torch.dtype | None):
        self.model = parent if isinstance(parent, CausalLM) else None
        self.reader = None
        if not isinstance(parent, CausalLM):
            from nas.child.checkpoint import CheckpointReader

            # an open reader as it is (its config already read); a folder is opened here
            self.reader = parent if isinstance(parent, CheckpointReader) \
                else CheckpointReader(parent)
            self.folder = self.reader.folder
            self.dtype = dtype or self.reader.stored_dtype()
            self.dname = "stored" if dtype is None else str(dtype)[6:]
            self.arch = self.reader.arch
            self.device = torch.device("cpu")
        else:
            self.arch = parent.arch
            self.dtype = parent.embed.weight.dtype
            self.device = parent.embed.weight.device
        self.score_dir = score_dir

    def digest(self) -> str:
        """The parent's :func:`weights_digest`: of the model, or the one the scoring run in
        ``score_dir`` recorded for these files (:func:`nas.scoring.digest.recorded_digest`),
        or hashed one submodule at a time."""
        if self.model is not None:
            return weights_digest(self.model)
        from nas.scoring.digest import combine_lines, recorded_digest, tensor_line

        rec = recorded_digest(self.score_dir, self.folder, self.dname)
        if rec is not None:
            return rec
        order = list(self.reader.model.state_dict(keep_vars=True))  # type: ignore[union-attr]  # reader is set when model is not (__init__)
        lines: dict[str, str] = {}
        for unit in self.units():
            sub = self.open(unit)
            for k, t in sub.state_dict().items():
                lines[f"{unit}.{k}"] = tensor_line(f"{unit}.{k}", t)
            self.done(unit)
        return combine_lines([lines[k] for k in order])

    def units(self) -> list[str]:
        m = self.reader.model if self.model is None else self.model  # type: ignore[union-attr]  # reader is set when model is not (__init__)
        out = ["embed"] + [f"blocks.{i}" for i, b in enumerate(m.blocks) if b.mixer is not None]
        return out + [n for n in ("norm", "lm_head") if getattr(m, n) is not None]

    def open(self, name: str) -> torch.nn.Module:
        if self.model is not None:
            return self.model.get_submodule(name)
        return self.reader.materialize(name, self.dtype)  # type: ignore[union-attr]  # reader is set when model is not (__init__)

    def done(self, name: str) -> None:
        if self.reader is not None:
            self.reader.release(name)


def _weight(m: torch.nn.Module) -> torch.Tensor:
    """``m.weight`` (an embedding's, a norm's or the LM head's: a parameter)."""
    w = m.weight
    assert isinstance(w, torch.Tensor)
    return w


@torch.no_grad()
def assemble_child(child_arch: ModelArch, parent: CausalLM | CheckpointReader | str | Path,
                   score_dir: str | Path, dtype: torch.dtype | None = None) -> CausalLM:
    """The child of ``child_arch`` built from ``parent``: blocks equal to the parent's are
    copied, every other block is loaded from the BLD-trained blocks in ``score_dir``.
    ``child.init_report`` says where each block came from.

    ``parent`` is a loaded model, a checkpoint folder or one opened
    (:class:`~nas.child.checkpoint.CheckpointReader`); a folder is read one submodule at a
    time in ``dtype`` (default its stored dtype), so the memory is the child plus one
    parent block, and its digest (checked against the one the blocks were trained on) is
    the scoring run's record when the files are unchanged, else hashed one submodule at a
    time."""
    from safetensors import safe_open

    from nas.child import build_model

    src = _Parent(parent, Path(score_dir), dtype)
    pa = src.arch
    if (child_arch.hidden_size, child_arch.vocab_size, child_arch.num_blocks) != \
            (pa.hidden_size, pa.vocab_size, pa.num_blocks):
        raise InputError("the child's hidden size, vocabulary and block count must equal the "
                         "parent's")
    index = read_index(score_dir)
    folder = Path(score_dir) / "blocks"
    if index.parent_weights != src.digest():
        raise InputError("these blocks were trained on another parent (weights hash "
                         "differs)", path=str(folder / "index.json"))
    by_child = {(m.block, json.dumps(m.child, sort_keys=True)): f
                for m, f in zip(index.blocks, index.files)}
    dev, dt = src.device, src.dtype
    child = build_model(child_arch, dtype=dt).to(dev)
    with torch.no_grad():
        emb = src.open("embed")
        child.embed.weight.copy_(_weight(emb))
        if child.lm_head is not None and pa.tie_embeddings:
            child.lm_head.weight.copy_(_weight(emb))
        src.done("embed")
        if child.lm_head is not None and not pa.tie_embeddings:
            child.lm_head.weight.copy_(_weight(src.open("lm_head")))
            src.done("lm_head")
        if child.norm is not None and pa.final_norm:
            child.norm.weight.copy_(_weight(src.open("norm")))
            src.done("norm")
    meta = src.model if src.model is not None else src.reader.model  # type: ignore[union-attr]  # reader is set when model is not (its __init__)
    report = []
    for i, (pc, cc) in enumerate(zip(pa.blocks, child_arch.blocks)):
        cb = child.blocks[i]
        if pc == cc:
            if cb.mixer is not None:
                cb.load_state_dict(src.open(f"blocks.{i}").state_dict())
                src.done(f"blocks.{i}")
            report.append(f"block {i} {cc.describe()}: copied")
            continue
        if cb.mixer is None:
            report.append(f"block {i} {pc.describe()} -> no-op: dropped")
            continue
        name = by_child.get((i, json.dumps(cc.model_dump(), sort_keys=True)))
        if name is None:
            raise InputError(f"no trained block for block {i} ({cc.describe()}); score it "
                             "with --bld-steps N", path=str(folder / "index.json"))
        f = folder / name
        try:
            with safe_open(str(f), framework="pt") as fh:
                sd = {k: fh.get_tensor(k) for k in fh.keys()}
        except Exception as exc:
            raise InputError(f"not a readable trained block ({exc})", path=str(f)) from None
        try:
            cb.load_state_dict({k: v.to(dt) for k, v in sd.items()})
        except RuntimeError as exc:
            raise InputError(f"does not fit block {i}: {str(exc).splitlines()[0]}",
                             path=str(f)) from None
        pm = meta.blocks[i].mixer
        if isinstance(pm, MambaMixer) and isinstance(cb.mixer, MambaMixer):
            cb.mixer.chunk_size = pm.chunk_size
        report.append(f"block {i} {pc.describe()} -> {cc.describe()}: BLD-trained ({name})")
    child.init_report = report
    return child
