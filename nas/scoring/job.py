"""A scoring job, validated without torch: the spec's parent and alternatives, the parent
checkpoint's config, the token split and the settings (``puzzle-nas score --nproc N``
checks its input here before any rank starts)."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from hwprofiles.errors import InputError
from nas import space
from nas.arch import ModelArch
from nas.hf import Parent, read_parent
from nas.scoring.data import Split, load_tokens, split_tokens
from nas.space import Alternative
from nas.spec import SearchSpec, load_spec


class Settings(BaseModel):
    """Everything that changes a score (hashed into every key with the data and weights)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    seq_len: int = Field(default=256, ge=2, description="tokens per row")
    batch_size: int = Field(default=8, ge=1, description="rows per forward pass")
    max_tokens: int = Field(default=65536, ge=1, description="held-out tokens scored")
    calib_tokens: int = Field(default=8192, ge=1, description="calibration / BLD tokens")
    bld_steps: int = Field(default=0, ge=0, description="BLD optimizer steps (0 = none)")
    bld_lr: float = Field(default=1e-3, gt=0, description="BLD AdamW learning rate")
    bld_batch: int = Field(default=4, ge=1, description="BLD rows per step")
    seed: int = Field(default=0, description="seed of random inits and BLD sampling")
    dtype: Literal["float32", "bfloat16", "float16"] | None = Field(
        default=None, description="compute dtype of the parent (None: the checkpoint's "
        "non-quantized dtype)")

    def digest(self) -> str:
        """SHA-256 of the settings (unset fields left out: keys made before a field existed
        stay valid)."""
        return hashlib.sha256(json.dumps(self.model_dump(exclude_none=True),
                                         sort_keys=True).encode()).hexdigest()


@dataclass
class Job:
    """A validated scoring job (no weights loaded yet)."""

    spec: SearchSpec
    parent_arch: ModelArch
    alts: list[list[Alternative]]
    parent_dir: Path
    split: Split
    settings: Settings
    spec_path: Path
    base_recipe: str | None = None
    """The spec's recipe when precision is searched per block (``nas.space.spans``): every
    alternative is scored with its weights fake-quantized; None: nothing is quantized."""
    checkpoint: Parent | None = None
    """The parent checkpoint's config as read once (``parent_dir/config.json``): the plan and
    the reader take it instead of reading the file again."""
    _reader: Any = field(default=None, init=False, repr=False, compare=False)

    def reader(self) -> Any:
        """The parent's checkpoint (:class:`nas.child.checkpoint.CheckpointReader`), opened
        once for the job and handed to whatever reads it (its note on tensors left out, the
        whole model, a rank's pipeline stage); torch side."""
        if self._reader is None:
            from nas.child.checkpoint import CheckpointReader

            arch = None if self.checkpoint is None else self.checkpoint.arch
            self._reader = CheckpointReader(self.parent_dir, arch=arch)
        return self._reader


def prepare(spec_path: str | Path, parent_dir: str | Path, data: str | Path,
            settings: Settings, tokenizer: str | Path | None = None,
            bin_dtype: str | None = None, checkpoint: Parent | None = None) -> Job:
    """Check every input (spec, parent config vs spec, data) without loading weights.
    ``checkpoint``: ``parent_dir``'s config as the caller already read it (not read again).

    The alternatives are ``space.alternatives(parent, spec.search_space)``, what
    ``search.alternatives`` returns for the spec (same labels as ``library.json``); the
    spec's hardware and workloads play no part in scoring.
    """
    spec, base, _ = load_spec(spec_path)
    pdir = Path(parent_dir)
    if not pdir.is_dir():
        raise InputError("not a checkpoint folder (config.json + safetensors)", path=str(pdir))
    named = read_parent(spec.parent, base, f"{spec_path}: parent")
    # the checkpoint's config: the file the spec named when it is the same one (read once)
    ckpt = checkpoint or read_parent(pdir, known=named)
    parent = named.arch
    check_parent(ckpt.arch, parent, str(pdir / "config.json"))
    tokens = load_tokens(data, tokenizer, bin_dtype)
    split = split_tokens(tokens, parent.vocab_size, settings.seq_len,
                         settings.max_tokens, settings.calib_tokens, str(data))
    alts = space.alternatives(parent, spec.search_space)
    base_recipe = None
    if spec.search_space.precision.searched() or spec.search_space.spans:
        from costmodels.dtypes import RECIPES, get_recipe
        from nas.space import spans

        if not isinstance(spec.precision, str):
            raise InputError("scoring a wider search space needs a named precision recipe "
                             "or a recipe file", path=str(spec_path), field="precision")
        pr = spec.precision if spec.precision in RECIPES else str(base / spec.precision)
        recipe = get_recipe(pr)
        alts = spans.widen(parent, spec.search_space, recipe, alts)  # the search's labels
        if spec.search_space.precision.searched():
            base_recipe = pr
    return Job(spec, parent, alts, pdir, split, settings, Path(spec_path), base_recipe,
               ckpt)


def check_parent(found: ModelArch, expected: ModelArch, source: str) -> None:
    """``found`` (a checkpoint's config) must be the spec's parent: one line if not."""
    for name in ("hidden_size", "vocab_size", "tie_embeddings", "final_norm"):
        a, b = getattr(found, name), getattr(expected, name)
        if a != b:
            raise InputError(f"does not match the spec's parent: {name} is {a}, the spec's "
                             f"parent has {b}", path=source)
    if found.num_blocks != expected.num_blocks:
        raise InputError(f"does not match the spec's parent: {found.num_blocks} blocks, the "
                         f"spec's parent has {expected.num_blocks}", path=source)
    for i, (a, b) in enumerate(zip(found.blocks, expected.blocks)):
        if a != b:
            raise InputError(f"does not match the spec's parent: block {i} is "
                             f"{a.describe()}, the spec's parent has {b.describe()}",
                             path=source)

