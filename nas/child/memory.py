"""What a build needs before it starts: :func:`estimate_build_memory` (bytes, per phase)
and :func:`check_memory` against :func:`available_memory` (this machine's, bytes).
"""

from __future__ import annotations

from pathlib import Path

import torch

from hwprofiles.errors import InputError
from nas.arch import ModelArch

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
