"""Fake quantization: a weight tensor rounded through a storage format and back (torch).

Scoring a precision alternative (``nas.space.spans``) quantizes that block's weights with the
real formats and measures the replaced model like any other alternative:

* **FP8 E4M3, per-tensor scale** (``fp8``): ``s = amax(|w|) / 448`` (448 = E4M3's largest
  finite value), ``Q(w) = e4m3(w / s) * s`` with torch's ``float8_e4m3fn`` cast (round to
  nearest, ties to even; subnormals down to 2**-9).
* **NVFP4** (``nvfp4``): NVIDIA's format as ModelOpt stores it: 16 consecutive elements
  along the input (last) dimension share one FP8 E4M3 scale, elements are FP4 E2M1
  (``0, 0.5, 1, 1.5, 2, 3, 4, 6`` and their negatives), and one FP32 per-tensor global
  scale ``g = amax(|w|) / (6 * 448)`` keeps every block scale inside E4M3's range:
  block scale ``S_b = e4m3(amax_b / 6 / g)``, ``Q(w) = e2m1(w / (S_b * g)) * S_b * g``.
  E2M1 rounds to nearest, ties to the even mantissa (0.25 -> 0, 0.75 -> 1, 2.5 -> 2,
  3.5 -> 4, 5 -> 4), and saturates at 6. An all-zero block stays zero.
* **MXFP4** (``mxfp4``, OCP Microscaling v1.0): 32-element blocks, E2M1 elements, one
  power-of-two (E8M0) scale per block ``2**(floor(log2(amax_b)) - 2)`` (2 = E2M1's largest
  exponent); elements past 6 saturate.
* ``bf16`` / ``fp16``: a round trip through that dtype; ``fp32``: unchanged.

Rows are the output dimension: a 2-D ``[out, in]`` weight is blocked along ``in`` (the
GEMM reduction dimension); higher-rank tensors (stacked experts ``[E, out, in]``) are
blocked along their last dimension too, with the NVFP4 global scale per expert matrix.
A last dimension that is not a multiple of the block is padded with zeros for the
scales (the padding is dropped).
"""

from __future__ import annotations

import torch

from nas.kinds import kinds

E4M3_MAX = 448.0
E2M1_MAX = 6.0
NVFP4_BLOCK = 16
MXFP4_BLOCK = 32
E2M1_GRID = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)
_MIDS = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0], dtype=torch.float64)
_UP_ON_TIE = torch.tensor([False, True, False, True, False, True, False])  # to the even one
FORMATS = ("fp32", "bf16", "fp16", "fp8", "nvfp4", "mxfp4")


def round_e4m3(x: torch.Tensor) -> torch.Tensor:
    """``x`` rounded to FP8 E4M3 (float8_e4m3fn: nearest, ties to even), in ``x``'s dtype."""
    return x.to(torch.float8_e4m3fn).to(x.dtype)


def round_e2m1(x: torch.Tensor) -> torch.Tensor:
    """``x`` rounded to FP4 E2M1 (nearest, ties to the even mantissa, saturating at 6)."""
    a = x.abs().to(torch.float64).clamp(max=E2M1_MAX).contiguous()  # bucketize copies otherwise
    idx = torch.bucketize(a, _MIDS, right=False)  # a tie goes to the lower value...
    tie = torch.zeros_like(a, dtype=torch.bool)
    for m, up in zip(_MIDS.tolist(), _UP_ON_TIE.tolist()):
        if up:  # ...unless the upper one has the even mantissa
            tie |= a == m
    idx = idx + tie.long()
    grid = torch.tensor(E2M1_GRID, dtype=torch.float64)
    return (torch.sign(x.to(torch.float64)) * grid[idx]).to(x.dtype)


def _blocks(w: torch.Tensor, size: int) -> tuple[torch.Tensor, int]:
    """``w`` as ``[..., nblocks, size]`` (last dim zero-padded) and the padding added."""
    k = w.shape[-1]
    pad = (-k) % size
    if pad:
        w = torch.nn.functional.pad(w, (0, pad))
    return w.reshape(*w.shape[:-1], -1, size), pad


def _unblock(b: torch.Tensor, pad: int) -> torch.Tensor:
    out = b.reshape(*b.shape[:-2], -1)
    return out[..., :out.shape[-1] - pad] if pad else out


def fake_fp8(w: torch.Tensor) -> torch.Tensor:
    """FP8 E4M3 with one per-tensor scale ``amax / 448`` (computed in float32)."""
    x = w.to(torch.float32)
    amax = x.abs().max()
    if amax == 0:
        return w.clone()
    s = amax / E4M3_MAX
    return (round_e4m3(x / s) * s).to(w.dtype)


def nvfp4_scales(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(global, block)`` scales of NVFP4: the FP32 global scale per matrix (shape
    ``w.shape[:-2] + (1, 1)``) and the E4M3 block scales ``[..., rows, nblocks]``, such that
    a block's elements are ``e2m1 * block * global``."""
    x = w.to(torch.float32)
    blocks, _ = _blocks(x, NVFP4_BLOCK)
    amax_b = blocks.abs().amax(-1)
    amax = x.abs().amax(dim=(-2, -1), keepdim=True) if x.dim() >= 2 else x.abs().amax()
    g = amax / (E2M1_MAX * E4M3_MAX)
    g = torch.where(g > 0, g, torch.ones_like(g))
    return g, round_e4m3(amax_b / E2M1_MAX / g)


def fake_nvfp4(w: torch.Tensor) -> torch.Tensor:
    """NVFP4: 16-element E2M1 blocks, E4M3 block scales, FP32 per-tensor global scale."""
    x = w.to(torch.float32)
    blocks, pad = _blocks(x, NVFP4_BLOCK)
    g, sb = nvfp4_scales(x)
    scale = (sb * g)[..., None]
    safe = torch.where(scale > 0, scale, torch.ones_like(scale))
    q = torch.where(scale > 0, round_e2m1(blocks / safe) * scale, torch.zeros_like(blocks))
    return _unblock(q, pad).to(w.dtype)


def fake_mxfp4(w: torch.Tensor) -> torch.Tensor:
    """MXFP4: 32-element E2M1 blocks with power-of-two (E8M0) scales."""
    x = w.to(torch.float32)
    blocks, pad = _blocks(x, MXFP4_BLOCK)
    amax_b = blocks.abs().amax(-1, keepdim=True)
    e = torch.floor(torch.log2(torch.where(amax_b > 0, amax_b, torch.ones_like(amax_b)))) - 2
    scale = torch.exp2(e)
    q = torch.where(amax_b > 0, round_e2m1(blocks / scale) * scale, torch.zeros_like(blocks))
    return _unblock(q, pad).to(w.dtype)


def fake_quant(w: torch.Tensor, fmt: str) -> torch.Tensor:
    """``w`` through storage format ``fmt`` (:data:`FORMATS`) and back, in ``w``'s dtype."""
    if fmt == "fp32":
        return w.clone()
    if fmt == "bf16":
        return w.to(torch.bfloat16).to(w.dtype)
    if fmt == "fp16":
        return w.to(torch.float16).to(w.dtype)
    if fmt == "fp8":
        return fake_fp8(w)
    if fmt == "nvfp4":
        return fake_nvfp4(w)
    if fmt == "mxfp4":
        return fake_mxfp4(w)
    raise ValueError(f"no fake quantization for {fmt!r}; expected one of {FORMATS}")


def relative_rms_error(w: torch.Tensor, fmt: str) -> float:
    """``||Q(w) - w|| / ||w||`` of format ``fmt`` on ``w`` (float64 sums)."""
    q = fake_quant(w, fmt).to(torch.float64)
    x = w.to(torch.float64)
    return float((q - x).norm() / x.norm())


# roles of a nas.modules Block's weights (parameter names under ``mixer.``); anything else
# (norms, conv, router, biases, SSM parameters) keeps its dtype, as every recipe here does
_ROLE_OF = (
    (("q_proj.weight", "k_proj.weight", "v_proj.weight", "o_proj.weight"), "attention"),
    # MLA (nas.modules.mla): the low-rank query / latent projections are attention weights
    (("q_a_proj.weight", "q_b_proj.weight", "kv_a_proj_with_mqa.weight", "kv_b_proj.weight"),
     "attention"),
    # gpt-oss's stacked experts (nas.modules.gpt_oss), stored [E, in, out] as in its checkpoints
    (("experts.gate_up_proj", "experts.down_proj"), "routed_experts"),
    (("in_proj.weight", "out_proj.weight"), "mamba"),
    (("experts_gate", "experts_up", "experts_down"), "routed_experts"),
    # Granite's fused experts and shared MLP (nas.modules.granite), [E, out, in] / [out, in]
    (("block_sparse_moe.input_linear.weight", "block_sparse_moe.output_linear.weight"),
     "routed_experts"),
    (("shared_mlp.input_linear.weight", "shared_mlp.output_linear.weight"), "shared_experts"),
    (("shared_experts.gate_proj.weight", "shared_experts.up_proj.weight",
      "shared_experts.down_proj.weight"), "shared_experts"),
    (("gate_proj.weight", "up_proj.weight", "down_proj.weight"), "ffn"),
    (("fc1_latent_proj.weight", "fc2_latent_proj.weight", "linear.weight"), "other"),
    # each registered kind's linears (nas.kinds)
    *((tuple(f"{n}.weight" for n, role in k.linears if role == r), r.value)
      for k in kinds().values() for r in dict.fromkeys(role for _, role in k.linears)),
)


_IN_OUT = frozenset({"experts.gate_up_proj", "experts.down_proj"})
"""Weights stored ``[..., in, out]`` (gpt-oss experts); the rest are ``[..., out, in]``."""


def weight_role(name: str) -> str | None:
    """The tensor role (``costmodels.dtypes.TensorRole`` value) of a Block parameter, or
    None for parameters no recipe quantizes."""
    if not name.startswith("mixer."):
        return None
    sub = name[len("mixer."):]
    for names, role in _ROLE_OF:
        if sub in names:
            return role
    return None


@torch.no_grad()
def quantize_block(block: torch.nn.Module, recipe: object) -> dict[str, str]:
    """Fake-quantize ``block``'s weights in place as ``recipe`` (a
    ``costmodels.dtypes.PrecisionRecipe``) stores them; returns ``{parameter: format}`` of
    the tensors changed (16/32-bit formats round-trip through their dtype)."""
    done = {}
    for name, p in block.named_parameters():
        role = weight_role(name)
        if role is None:
            continue
        if role == "shared_experts" and getattr(block, "cfg", None) is not None \
                and block.cfg.kind == "ffn":  # type: ignore[union-attr]  # a block's cfg is a BlockConfig; nn.Module's __getattr__ types it Tensor | Module
            role = "ffn"  # a dense Granite layer: its shared_mlp is the block's FFN
        fmt = recipe.weight_dtype(role).value  # type: ignore[attr-defined]  # recipe is a PrecisionRecipe, typed object here
        if fmt not in FORMATS:
            raise ValueError(f"{name}: no fake quantization for {fmt!r}")
        if name[len("mixer."):] in _IN_OUT:  # block along the input (reduction) dimension
            p.copy_(fake_quant(p.transpose(-1, -2).contiguous(), fmt).transpose(-1, -2))
        else:
            p.copy_(fake_quant(p, fmt))
        done[name] = fmt
    return done
