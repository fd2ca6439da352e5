"""Blueprint -> torch model: build, initialize from the parent, save and load HF checkpoints.

Importing this package needs torch (an optional extra of puzzle-nas).

* :func:`build_model` - a randomly initialized :class:`~nas.modules.CausalLM` of an arch,
  built block by block in the target dtype (peak memory: the model plus one block in
  float32; :mod:`nas.build_random`);
* :func:`init_from_parent` - a child initialized from the parent's weights
  (:mod:`nas.build_inherit` lists the rule per pruning kind); the parent may be a checkpoint
  folder, streamed one block at a time;
* :func:`save_pretrained` / :func:`load_pretrained` - ``config.json`` + safetensors with the
  HF tensor names of the exported type (:mod:`nas.build_checkpoint` lists them);
* :func:`estimate_build_memory` / :func:`check_memory` - what a build needs, before it starts;
* :func:`to_transformers` / :func:`from_transformers` - the same model as a Hugging Face
  ``transformers`` model instance and back (when transformers is installed).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from hwprofiles.errors import InputError
from nas.arch import ModelArch
from nas.build_checkpoint import (
    _export_config,
    hf_layout,
    hf_state_dict,
    load_pretrained,
    save_pretrained,
)
from nas.build_inherit import init_from_parent
from nas.build_random import build_model
from nas.modules.model import CausalLM

# ---------------------------------------------------------------------------------------
# memory
# ---------------------------------------------------------------------------------------
_ITEMSIZE = {torch.float32: 4, torch.bfloat16: 2, torch.float16: 2}


def available_memory() -> int | None:
    """Bytes this process can still allocate: ``MemAvailable`` from ``/proc/meminfo``, capped
    by the cgroup limit (``memory.max - memory.current``) when there is one; ``None`` where
    neither can be read."""
    avail: int | None = None
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                avail = int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        cg = Path("/sys/fs/cgroup")
        lim = (cg / "memory.max").read_text().strip()
        if lim != "max":
            free = int(lim) - int((cg / "memory.current").read_text())
            avail = free if avail is None else min(avail, free)
    except (OSError, ValueError):
        pass
    return avail


def _block_elements(arch: ModelArch) -> list[int]:
    return [int(n) for n in arch.block_params()]


def estimate_build_memory(child: ModelArch, dtype: torch.dtype = torch.float32,
                          parent: ModelArch | None = None, tokens: int = 0,
                          parent_dtype: torch.dtype | None = None) -> dict[str, int]:
    """Bytes a build needs at its peak, by part (``total`` is the sum):

    * ``child``: every stored element of the child in ``dtype``;
    * ``child_block_fp32``: the largest child block while it is initialized in float32;
    * ``parent_block``: the largest parent block streamed in float32 (init from a parent);
    * ``activations``: calibration activations, ~12 float32 copies of tokens x hidden
      (residual, normed input, block output, and the per-rule intermediates);
    * ``runtime``: the interpreter and torch themselves (a measured 0.5 GiB).
    """
    item = _ITEMSIZE.get(dtype, 4)
    parts = {
        "child": child.param_counts().total * item,
        "child_block_fp32": max(_block_elements(child) + [0]) * 4,
        "parent_block": 0, "activations": 0, "runtime": 512 * 2**20,
    }
    if parent is not None:
        big = max(_block_elements(parent) + [parent.vocab_size * parent.hidden_size])
        parts["parent_block"] = big * 4
        parts["activations"] = 12 * tokens * max(parent.hidden_size, 1) * 4
    parts["total"] = sum(parts.values())
    return parts


def check_memory(need: dict[str, int], force: bool = False,
                 available: int | None = None) -> None:
    """Raise :class:`InputError` (one line with the figures) when ``need['total']`` exceeds
    the memory available (``available``, default :func:`available_memory`), unless
    ``force``."""
    avail = available_memory() if available is None else available
    if force or avail is None or need["total"] <= avail:
        return
    gib = 2**30
    raise InputError(
        f"building needs about {need['total'] / gib:.1f} GiB (child weights "
        f"{need['child'] / gib:.1f} GiB + largest block in float32 "
        f"{(need['child_block_fp32'] + need['parent_block']) / gib:.1f} GiB + activations "
        f"and runtime {(need['activations'] + need['runtime']) / gib:.1f} GiB) but only "
        f"{avail / gib:.1f} GiB is available; pass --force to try anyway")


# ---------------------------------------------------------------------------------------
# transformers interop
# ---------------------------------------------------------------------------------------
def to_transformers(model: CausalLM, model_type: str | None = None, copy: bool = True
                    ) -> Any:
    """The equivalent Hugging Face ``transformers`` model instance (same weights, same dtype)
    for a type transformers ships (llama, mistral, qwen2, qwen3, mixtral, qwen2_moe,
    qwen3_moe, nemotron_h, deepseek_v3, gpt_oss, ...); hand it to HF Trainer or any other
    training loop.

    With ``copy`` (default) its weights are independent of ``model``'s; ``copy=False``
    saves the memory of a second copy by sharing storage wherever the two layouts agree
    (then training one changes the other; drop ``model`` after converting).

    Raises :class:`InputError` when transformers is not installed or the architecture only
    fits a type it lacks (``nemotron_h_puzzle``, ``nemotron-nas``: ``docs/build.md`` says
    what loads those).
    """
    try:
        import transformers
    except ImportError:
        raise InputError("to_transformers needs the transformers package "
                         "(pip install transformers)") from None
    cfg = _export_config(model, model_type)
    mt = cfg["model_type"]
    if "puzzle_layers" in cfg:  # nas.hf.qwen3_next's extension for heterogeneous children
        raise InputError(f"this {mt} child has per-layer shapes (the puzzle_layers "
                         "extension), which transformers' class cannot hold; save it with "
                         "save_pretrained and load it here")
    try:
        hcfg = transformers.AutoConfig.for_model(**cfg)
        cls = transformers.AutoModelForCausalLM._model_mapping[type(hcfg)]
    except (ValueError, KeyError):
        raise InputError(f"transformers {transformers.__version__} has no {mt} model; save "
                         "the checkpoint and load it with a stack that has one (docs/build.md)"
                         ) from None
    own = model.state_dict()
    sd = {name: own[key] if j is None else own[key][j] for key, name, j in hf_layout(model, mt)}
    if copy:
        sd = {k: v.clone() for k, v in sd.items()}
    hf = cls.from_pretrained(None, config=hcfg, state_dict=sd,
                             dtype=model.embed.weight.dtype)
    return hf


def from_transformers(hf_model: Any) -> CausalLM:
    """The :class:`CausalLM` equivalent of a ``transformers`` model of a supported type
    (written through a temporary checkpoint folder, so never two copies in memory beyond
    the file cache)."""
    import tempfile

    with tempfile.TemporaryDirectory(prefix="puzzle-nas-hf-") as tmp:
        hf_model.save_pretrained(tmp)
        return load_pretrained(tmp)


__all__ = ["available_memory", "build_model", "check_memory", "estimate_build_memory",
           "from_transformers", "hf_layout", "hf_state_dict", "init_from_parent",
           "load_pretrained", "save_pretrained", "to_transformers"]
