"""Block-scaled FP8 weights in checkpoints (DeepSeek-V3 as published on the Hub), unscaled on
load.

A quantized linear weight ``W`` (``out x in``) is stored as ``W`` in ``float8_e4m3fn`` plus
``weight_scale_inv`` (float32, ``ceil(out / bo) x ceil(in / bi)``): one scale per
``bo x bi`` block, ``[bo, bi]`` = the config's ``quantization_config.weight_block_size``
(128 x 128 for DeepSeek-V3). The weight is ``W.float() * scale`` with each block's scale
(edge blocks may be partial), as DeepSeek's ``weight_dequant`` and transformers' fine-grained
FP8 loader compute it.
"""

from __future__ import annotations

from typing import Any

import torch

SCALE_SUFFIX = "_scale_inv"
DEFAULT_BLOCK = (128, 128)


def scale_name(name: str) -> str | None:
    """The scale tensor's name of weight ``name`` (``...weight`` -> ``...weight_scale_inv``),
    or None for a name that is not a weight."""
    return name + SCALE_SUFFIX if name.endswith(".weight") else None


def block_size(quantization_config: Any) -> tuple[int, int]:
    """``[bo, bi]`` of an FP8 ``quantization_config`` (DeepSeek-V3's 128 x 128 when absent)."""
    if isinstance(quantization_config, dict):
        b = quantization_config.get("weight_block_size")
        if isinstance(b, list) and len(b) == 2 and all(isinstance(x, int) and x > 0 for x in b):
            return int(b[0]), int(b[1])
    return DEFAULT_BLOCK


def unscale_fp8(weight: torch.Tensor, scale_inv: torch.Tensor, block: tuple[int, int],
                dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """The weight a block-scaled FP8 ``(weight, weight_scale_inv)`` pair holds."""
    rows, cols = weight.shape[-2:]
    bo, bi = block
    want = (-(-rows // bo), -(-cols // bi))
    if tuple(scale_inv.shape[-2:]) != want:
        raise ValueError(f"scale shape {list(scale_inv.shape)} does not tile a "
                         f"{rows} x {cols} weight in {bo} x {bi} blocks (expected {list(want)})")
    s = scale_inv.float().repeat_interleave(bo, dim=-2)[..., :rows, :]
    s = s.repeat_interleave(bi, dim=-1)[..., :cols]
    return (weight.float() * s).to(dtype)
