"""Blueprint -> torch model: build, initialize from the parent, save and load HF checkpoints.

Importing this package needs torch (an optional extra of puzzle-nas).

* :func:`build_model` - a randomly initialized :class:`~nas.modules.CausalLM` of an arch,
  built block by block in the target dtype (peak memory: the model plus one block in
  float32);
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

from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import nn

from hwprofiles.errors import InputError
from nas.arch import ModelArch
from nas.modules.layers import RMSNorm, default_out_std
from nas.modules.model import Block, CausalLM

INIT_STD = 0.02  # CausalLM.reset_parameters' default


def _real(factory: Callable[[], nn.Module]) -> nn.Module:
    """Construct a module on the CPU without touching the caller's RNG stream (whatever
    default init the constructor draws is overwritten by the caller)."""
    with torch.random.fork_rng(devices=[]), torch.device("cpu"):
        return factory()


class _Materializer:
    """Turns a meta-device :class:`CausalLM` into a real one, one piece at a time, drawing
    the random init in exactly the order of :meth:`CausalLM.reset_parameters`."""

    def __init__(self, model: CausalLM, dtype: torch.dtype, std: float = INIT_STD):
        self.model, self.dtype, self.std = model, dtype, std
        self.out_std = default_out_std(len(model.blocks), std)

    def nonblock(self) -> None:
        m, arch = self.model, self.model.arch
        h, v = arch.hidden_size, arch.vocab_size
        emb = _real(lambda: nn.Embedding(v, h))
        nn.init.normal_(emb.weight, std=self.std)
        m.embed = emb.to(self.dtype)
        if m.lm_head is not None:
            head = _real(lambda: nn.Linear(h, v, bias=False))
            nn.init.normal_(head.weight, std=self.std)
            m.lm_head = head.to(self.dtype)
        if m.norm is not None:
            m.norm = _real(lambda: RMSNorm(h, arch.norm_eps)).to(self.dtype)

    def block(self, i: int, dtype: torch.dtype | None = None) -> Block:
        """Block ``i`` randomly initialized (in float32, then cast to ``dtype``, default the
        target dtype); not yet put into the model.

        Allocated uninitialized (no constructor-time default init to pay for) and set by
        ``reset_parameters``, which sets every parameter and persistent buffer; a block with
        non-persistent buffers (derived values the constructor computes) is constructed for
        real instead.
        """
        arch = self.model.arch
        meta = self.model.blocks[i]
        if any(getattr(m, "_non_persistent_buffers_set", None) for m in meta.modules()):
            blk = _real(lambda: Block(arch.blocks[i], arch))
        else:
            blk = meta.to_empty(device="cpu")
        blk.reset_parameters(self.std, self.out_std)
        return blk.to(dtype or self.dtype)


def build_model(arch: ModelArch, seed: int | None = 0,
                dtype: torch.dtype = torch.float32, progress: bool | None = None) -> CausalLM:
    """A randomly initialized model of ``arch`` (seeded; ``seed=None`` uses the global RNG).

    Built on the meta device and materialized block by block: each block is initialized in
    float32 and cast to ``dtype``, so the values do not depend on ``dtype`` beyond the cast
    and the peak memory is the model in ``dtype`` plus one block in float32 (a progress bar
    on a terminal, or as ``progress`` says). Stored
    elements match ``arch.param_counts().total`` exactly (MTP blocks are not built).
    """
    with torch.device("meta"):
        model = CausalLM(arch)

    def fill() -> None:
        from nas.progress import Progress

        mat = _Materializer(model, dtype)
        mat.nonblock()
        with Progress(len(model.blocks), "build", progress) as bar:
            for i in range(len(model.blocks)):
                model.blocks[i] = mat.block(i)
                bar.update(1)

    if seed is None:
        fill()
    else:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            fill()
    return model


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
    qwen3_moe, nemotron_h); hand it to HF Trainer or any other training loop.

    With ``copy`` (default) its weights are independent of ``model``'s; ``copy=False``
    saves the memory of a second copy by sharing storage wherever the two layouts agree
    (then training one changes the other; drop ``model`` after converting).

    Raises :class:`InputError` when transformers is not installed or the architecture only
    fits a type it lacks (``nemotron_h_puzzle``, ``nemotron-nas``: the README says what
    loads those).
    """
    try:
        import transformers
    except ImportError:
        raise InputError("to_transformers needs the transformers package "
                         "(pip install transformers)") from None
    from nas.build_checkpoint import _export_config, hf_layout

    cfg = _export_config(model, model_type)
    mt = cfg["model_type"]
    try:
        hcfg = transformers.AutoConfig.for_model(**cfg)
        cls = transformers.AutoModelForCausalLM._model_mapping[type(hcfg)]
    except (ValueError, KeyError):
        raise InputError(f"transformers {transformers.__version__} has no {mt} model; save "
                         "the checkpoint and load it with a stack that has (see README)"
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

    from nas.build_checkpoint import load_pretrained

    with tempfile.TemporaryDirectory(prefix="puzzle-nas-hf-") as tmp:
        hf_model.save_pretrained(tmp)
        return load_pretrained(tmp)


from nas.build_checkpoint import hf_layout, hf_state_dict, load_pretrained, save_pretrained  # noqa: E402
from nas.build_inherit import init_from_parent  # noqa: E402

__all__ = ["available_memory", "build_model", "check_memory", "estimate_build_memory",
           "from_transformers", "hf_layout", "hf_state_dict", "init_from_parent",
           "load_pretrained", "save_pretrained", "to_transformers"]
