"""ModelOpt-quantized checkpoints (NVIDIA's FP8 and NVFP4 exports, as NVIDIA publishes
Nemotron-3-Super and its Puzzle child), dequantized on read.

A checkpoint is ModelOpt's when it has ``hf_quant_config.json`` (``{"producer": {"name":
"modelopt"}, "quantization": {"quant_algo": ...}}``) or a ``config.json``
``quantization_config`` with ``quant_method: "modelopt"``. Which weight is quantized how is
read from the tensors themselves, so ``MIXED_PRECISION`` exports (some layers FP8, some
NVFP4, the rest BF16) need no per-layer table:

* **FP8** (``quant_algo`` ``FP8``, ``FP8_PER_CHANNEL_PER_TOKEN``): ``X.weight`` in
  ``float8_e4m3fn`` and ``X.weight_scale`` in float32, one per tensor (a scalar) or one per
  output row (``[out]`` or ``[out, 1]``); the weight is ``weight.float() * weight_scale``.
* **NVFP4** (``quant_algo`` ``NVFP4``): ``X.weight`` in uint8 ``[out, in / 2]``, two E2M1
  codes per byte, the even column in the low nibble; ``X.weight_scale`` in
  ``float8_e4m3fn`` ``[out, in / 16]`` (one per block of 16 along the input); and
  ``X.weight_scale_2`` in float32 (a scalar). The weight is
  ``e2m1(code) * (float(weight_scale) * weight_scale_2)`` blockwise.

Both as ModelOpt computes them: ``NVFP4QTensor.dequantize`` and ``FP8QTensor.dequantize`` in
``modelopt/torch/quantization/qtensor/{nvfp4,fp8}_tensor.py`` (NVIDIA/Model-Optimizer,
commit 211c6b34; the packing ``(q[..., 1::2] << 4) | q[..., 0::2]`` is its
``NVFP4QTensor.quantize``). ``tests/test_modelopt.py`` checks a hand-computed block and
vectors ModelOpt 0.47.0 quantized and dequantized itself.

Activation and KV-cache scales (``X.input_scale``, ``k_proj.k_scale``, ``v_proj.v_scale``,
...) serve quantized kernels; a parent computed in bf16 does not use them, so they are read
past and counted (:attr:`ModelOptLayout.unused`). AWQ exports (``pre_quant_scale``) are
refused: their weights are not the model's weights until the smoothing is folded back.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from hwprofiles.errors import InputError

E2M1_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0,
               -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0)
"""The 16 FP4 (E2M1) values by their 4-bit code, sign bit high (as ModelOpt's table)."""
NVFP4_BLOCK = 16
SCALE = "_scale"
SCALE_2 = "_scale_2"
UNUSED_SUFFIXES = (".input_scale", ".k_scale", ".v_scale", ".output_scale")
HF_QUANT_CONFIG = "hf_quant_config.json"


def quant_config(folder: Path, hf_extra: dict[str, Any]) -> dict[str, Any] | None:
    """ModelOpt's quantization description of a checkpoint folder (``hf_quant_config.json``'s
    ``quantization`` object, or the ``config.json`` ``quantization_config``), or None when
    the checkpoint is not ModelOpt's."""
    qc = hf_extra.get("quantization_config")
    if isinstance(qc, dict) and str(qc.get("quant_method", "")).lower() == "modelopt":
        return qc
    file = folder / HF_QUANT_CONFIG
    if not file.is_file():
        return None
    try:
        data = json.loads(file.read_text())
    except (OSError, ValueError) as exc:
        raise InputError(f"not valid JSON ({exc})", path=str(file)) from None
    producer = data.get("producer", {}) if isinstance(data, dict) else {}
    if not (isinstance(producer, dict) and str(producer.get("name", "")).lower() == "modelopt"):
        return None
    q = data.get("quantization")
    if not isinstance(q, dict):
        raise InputError("expected a 'quantization' object (ModelOpt's quant_algo, "
                         "group_size, ...)", path=str(file))
    return q


@dataclass
class ModelOptLayout:
    """Which stored tensors of a ModelOpt checkpoint make which weight."""

    algo: str
    """``quant_algo`` as the checkpoint names it (``FP8``, ``NVFP4``, ``MIXED_PRECISION``)."""
    scales: dict[str, tuple[str, str | None]] = field(default_factory=dict)
    """weight name -> (``weight_scale`` name, ``weight_scale_2`` name or None)."""
    unused: list[str] = field(default_factory=list)
    """Activation / KV-cache scales read past (see the module docstring)."""

    @property
    def names(self) -> set[str]:
        """Every stored tensor this layout accounts for besides the weights themselves."""
        out = set(self.unused)
        for sc, sc2 in self.scales.values():
            out.add(sc)
            if sc2 is not None:
                out.add(sc2)
        return out

    def note(self) -> str:
        """One line for the commands' output: what was dequantized, what was not used."""
        return (f"ModelOpt {self.algo}: {len(self.scales)} weights dequantized on read; "
                f"{len(self.unused)} activation / KV-cache scales not used")


def layout(config: dict[str, Any], stored: set[str], expected: set[str],
           source: str) -> ModelOptLayout:
    """The :class:`ModelOptLayout` of a checkpoint whose tensors are ``stored`` and whose
    architecture expects the weight names ``expected``."""
    algo = str(config.get("quant_algo") or "unnamed")
    if "AWQ" in algo.upper() or any(n.endswith(".pre_quant_scale") for n in stored):
        raise InputError(f"ModelOpt {algo} (AWQ) checkpoints are not read: their weights "
                         "carry the AWQ smoothing (pre_quant_scale); export FP8 or NVFP4 "
                         "without AWQ", path=source)
    group = config.get("group_size", NVFP4_BLOCK)
    if group not in (None, NVFP4_BLOCK):
        raise InputError(f"ModelOpt group_size {group}: only NVFP4's {NVFP4_BLOCK} is "
                         "read", path=source)
    lay = ModelOptLayout(algo=algo)
    for name in expected:
        sc = name + SCALE
        if name.endswith(".weight") and sc in stored:
            sc2 = name + SCALE_2
            lay.scales[name] = (sc, sc2 if sc2 in stored else None)
    lay.unused = sorted(n for n in stored if n.endswith(UNUSED_SUFFIXES))
    return lay


def e2m1_unpack(packed: torch.Tensor) -> torch.Tensor:
    """The float32 E2M1 values of packed NVFP4 bytes ``[..., n]`` -> ``[..., 2n]`` (the
    even element in the low nibble)."""
    lut = torch.tensor(E2M1_VALUES, dtype=torch.float32, device=packed.device)
    lo, hi = lut[(packed & 0x0F).long()], lut[(packed >> 4).long()]
    return torch.stack((lo, hi), dim=-1).flatten(-2)


def dequantize(weight: torch.Tensor, scale: torch.Tensor, scale_2: torch.Tensor | None,
               name: str = "weight") -> torch.Tensor:
    """The float32 weight a ModelOpt FP8 or NVFP4 triple holds (module docstring); a
    ``ValueError`` names what does not fit."""
    if weight.dtype == torch.uint8:  # NVFP4
        if scale_2 is None or scale_2.numel() != 1:
            raise ValueError(f"NVFP4 weight {name} needs a scalar {name}{SCALE_2}")
        if scale.dtype != torch.float8_e4m3fn:
            raise ValueError(f"NVFP4 scale {name}{SCALE} is {scale.dtype}, expected "
                             "float8_e4m3fn")
        cols = weight.shape[-1] * 2
        want = (*weight.shape[:-1], cols // NVFP4_BLOCK)
        if cols % NVFP4_BLOCK or tuple(scale.shape) != want:
            raise ValueError(f"NVFP4 scale {name}{SCALE} has shape {list(scale.shape)}; a "
                             f"{list(weight.shape[:-1]) + [cols]} weight in blocks of "
                             f"{NVFP4_BLOCK} needs {list(want)}")
        vals = e2m1_unpack(weight).unflatten(-1, (-1, NVFP4_BLOCK))
        block = scale.float() * scale_2.float().reshape(())
        return (vals * block[..., None]).flatten(-2)
    if weight.dtype == torch.float8_e4m3fn:  # FP8, per tensor or per output row
        s = scale.float()
        if s.numel() == 1:
            return weight.float() * s.reshape(())
        rows = weight.shape[-2] if weight.dim() >= 2 else -1
        if s.numel() != rows or s.dim() > 2:
            raise ValueError(f"FP8 scale {name}{SCALE} has shape {list(scale.shape)}: "
                             f"expected a scalar or one per output row ({rows})")
        return weight.float() * s.reshape(-1, 1)
    raise ValueError(f"{name} is stored as {weight.dtype} beside {name}{SCALE}; ModelOpt "
                     "stores FP8 (float8_e4m3fn) or NVFP4 (uint8) weights there")
