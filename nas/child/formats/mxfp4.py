"""MXFP4-packed expert weights in checkpoints (gpt-oss as published on the Hub), unpacked on load.

A packed tensor ``P`` is stored as ``P_blocks`` (uint8, ``(..., rows, G, 16)``: 32 E2M1
values per block, two per byte, the low nibble first) and ``P_scales`` (uint8, ``(..., rows,
G)``: one E8M0 exponent per block, biased by 127), OCP Microscaling Formats (MX) v1.0. The
unpacked tensor is ``value * 2**(scale - 127)`` laid out ``(..., rows, 32 G)`` and then, as
transformers' gpt-oss loader does, transposed to ``(..., 32 G, rows)`` (the
``(experts, in, out)`` layout of ``experts.gate_up_proj`` / ``experts.down_proj``). Every
value is exact in bfloat16 and float32.
"""

from __future__ import annotations

import torch

E2M1_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0,
               -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0)
"""The 16 FP4 (E2M1) code points, by their 4-bit code (sign bit high), OCP MX v1.0."""
BLOCK = 32
"""Values per MXFP4 block (one shared E8M0 scale)."""
SUFFIXES = ("_blocks", "_scales")


def unpack_mxfp4(blocks: torch.Tensor, scales: torch.Tensor,
                 dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """The tensor an MXFP4 ``(blocks, scales)`` pair holds (see the module docstring)."""
    if blocks.dtype != torch.uint8 or scales.dtype != torch.uint8 \
            or blocks.shape[:-1] != scales.shape or blocks.shape[-1] != BLOCK // 2:
        raise ValueError(f"expected uint8 blocks (..., G, 16) and scales (..., G), got "
                         f"{blocks.dtype} {list(blocks.shape)} and {scales.dtype} "
                         f"{list(scales.shape)}")
    lut = torch.tensor(E2M1_VALUES, dtype=torch.float32, device=blocks.device)
    lo, hi = lut[(blocks & 0x0F).long()], lut[(blocks >> 4).long()]
    vals = torch.stack((lo, hi), dim=-1).flatten(-2)  # (..., G, 32): low nibble first
    vals = torch.ldexp(vals, (scales.to(torch.int32) - 127)[..., None])
    out = vals.flatten(-2)  # (..., rows, 32 G)
    return out.transpose(-1, -2).contiguous().to(dtype)


def packed_names(name: str) -> tuple[str, str]:
    """The ``(blocks, scales)`` tensor names of a packed tensor called ``name``."""
    return name + SUFFIXES[0], name + SUFFIXES[1]
