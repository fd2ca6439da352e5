"""A child's precision per block as a ModelOpt-style ``quantization_config`` (HF config.json).

NVIDIA ModelOpt exports a mixed-precision checkpoint with ``quant_algo: "MIXED_PRECISION"``
and a ``quantized_layers`` map from module name to its format (``{"quant_algo": "NVFP4",
"group_size": 16}``, ``{"quant_algo": "FP8"}``); modules it does not list stay in the
checkpoint dtype, and ``kv_cache_quant_algo`` names the KV-cache format (vLLM reads this
layout as ``ModelOptMixedPrecisionConfig``). :func:`quantization_config` writes that layout
for a child whose blocks each have a recipe (``nas.space.spans``):

* module names follow the checkpoint layout of ``nas.child.checkpoint`` for the export type
  (``backbone.layers.{i}.mixer.in_proj`` for ``nemotron_h*``;
  ``model.layers.{i // 2}.self_attn.q_proj`` / ``.mlp.up_proj`` for paired types;
  ``model.layers.{i // 2}.mamba.x_proj`` / ``.feed_forward.up_proj`` for ``jamba``;
  ``model.layers.{i // 2}.self_attn.q_proj`` and ``.mamba.in_proj`` (a parallel block) /
  ``.feed_forward.up_proj`` for ``falcon_h1``;
  ``model.layers.{i // 2}.mamba.in_proj`` / ``.block_sparse_moe.input_linear`` (the fused
  experts, one module) / ``.shared_mlp.input_linear`` for ``granitemoehybrid``);
* routed experts are written as one fnmatch pattern per projection
  (``backbone.layers.3.mixer.experts.*.up_proj``), as ModelOpt writes ``exclude_modules``,
  instead of one entry per expert (a Super checkpoint has 40,960 expert projections);
  :func:`expand` resolves the patterns against a checkpoint's tensor names;
* ``kv_cache_quant_algo`` is set when every attention block's KV cache shares one format;
  otherwise it is null and ``kv_cache_quantized_layers`` (an extension) maps each attention
  mixer to its KV format;
* ``producer`` names puzzle-nas. BF16 / FP16 / FP32 modules are not listed.

:func:`block_formats` reads it back (per block, role -> format), so an export round-trips.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Iterable, Sequence
from typing import Any

from costmodels.dtypes import DType, PrecisionRecipe, TensorRole, get_recipe
from hwprofiles.errors import InputError
from nas.arch import FFN, Attention, BlockConfig, Linear, Mamba, ModelArch, MoE, Parallel
from nas.kinds import hf_module, spec_of

# ModelOpt's names of the formats (hf_quant_config.json ``quant_algo``), with group sizes
_ALGO: dict[DType, dict[str, Any]] = {
    DType.FP8: {"quant_algo": "FP8"},
    DType.NVFP4: {"quant_algo": "NVFP4", "group_size": 16},
    DType.MXFP4: {"quant_algo": "MXFP4", "group_size": 32},
    DType.INT8: {"quant_algo": "INT8"},
}
_UNQUANTIZED = (DType.BF16, DType.FP16, DType.FP32)
_FROM_ALGO = {v["quant_algo"]: k for k, v in _ALGO.items()}
NEMOTRON_TYPES = ("nemotron_h", "nemotron_h_puzzle")


def _modules(b: BlockConfig, model_type: str, i: int) -> list[tuple[str, TensorRole]]:
    """(module name or pattern, role) of every quantizable linear of block ``i``."""
    if model_type in NEMOTRON_TYPES:
        pre = f"backbone.layers.{i}.mixer."
    else:
        layer = f"model.layers.{i // 2}."
        if i % 2 == 0:
            pre = layer + "self_attn."
        else:
            pre = layer + ("block_sparse_moe." if model_type == "mixtral"
                           and isinstance(b, MoE) else "mlp.")
    if model_type == "jamba":  # mamba / self_attn, then feed_forward (nas.child.checkpoint)
        pre = f"model.layers.{i // 2}." + ("feed_forward." if i % 2 else
                                          hf_module(b, "jamba") or "self_attn.")
    registered = spec_of(b)
    if registered is not None:  # nas.kinds: the kind lists its linears
        own = registered.linears if registered.linears_of is None else registered.linears_of(b)
        return [(pre + n, role) for n, role in own]
    if model_type == "falcon_h1":  # self_attn. + mamba. side by side, then feed_forward.
        layer = f"model.layers.{i // 2}."
        if isinstance(b, Parallel):
            return ([(layer + "self_attn." + n, TensorRole.ATTENTION)
                     for n in ("q_proj", "k_proj", "v_proj", "o_proj") if b.attention]
                    + [(layer + "mamba." + n, TensorRole.MAMBA)
                       for n in ("in_proj", "out_proj") if b.mamba])
        if isinstance(b, FFN):
            return [(layer + "feed_forward." + n, TensorRole.FFN)
                    for n in ("gate_proj", "up_proj", "down_proj")]
    if model_type == "granitemoehybrid":  # nas.modules.granite's checkpoint layout
        layer = f"model.layers.{i // 2}."
        if isinstance(b, Mamba):
            return [(layer + "mamba." + n, TensorRole.MAMBA) for n in ("in_proj", "out_proj")]
        shared = [layer + "shared_mlp." + n for n in ("input_linear", "output_linear")]
        if isinstance(b, MoE):
            return [(layer + "block_sparse_moe." + n, TensorRole.ROUTED_EXPERTS)
                    for n in ("input_linear", "output_linear")] + \
                [(n, TensorRole.SHARED_EXPERTS) for n in shared if b.shared_width]
        if isinstance(b, FFN):
            return [(n, TensorRole.FFN) for n in shared]
        if isinstance(b, Linear):
            return [(layer + ("self_attn." if i % 2 == 0 else "") + "linear", TensorRole.OTHER)]
    if isinstance(b, Attention):
        return [(pre + n, TensorRole.ATTENTION) for n in ("q_proj", "k_proj", "v_proj",
                                                          "o_proj")]
    if isinstance(b, Mamba):
        return [(pre + n, TensorRole.MAMBA) for n in ("in_proj", "out_proj")]
    if isinstance(b, FFN):
        names = ("gate_proj", "up_proj", "down_proj") if b.gated else ("up_proj", "down_proj")
        return [(pre + n, TensorRole.FFN) for n in names]
    if isinstance(b, MoE) and model_type in ("gpt_oss", "gpt_oss_puzzle"):
        # gpt-oss experts are stacked tensors (experts.gate_up_proj / down_proj), one module
        return [(pre + "experts", TensorRole.ROUTED_EXPERTS)]
    if isinstance(b, MoE):
        enames = ["gate_proj", "up_proj", "down_proj"] if b.gated else ["up_proj", "down_proj"]
        if model_type == "mixtral":
            enames = [{"gate_proj": "w1", "down_proj": "w2", "up_proj": "w3"}[n] for n in enames]
        out = [(f"{pre}experts.*.{n}", TensorRole.ROUTED_EXPERTS) for n in enames]
        if b.shared_width:
            sh = "shared_expert." if model_type == "qwen2_moe" else "shared_experts."
            snames = ("gate_proj", "up_proj", "down_proj") if b.gated else ("up_proj",
                                                                            "down_proj")
            out += [(pre + sh + n, TensorRole.SHARED_EXPERTS) for n in snames]
        if b.latent_size:
            out += [(pre + n, TensorRole.OTHER) for n in ("fc1_latent_proj",
                                                          "fc2_latent_proj")]
        return out
    if isinstance(b, Linear):
        name = "linear" if model_type in NEMOTRON_TYPES else (
            "linear_attn" if i % 2 == 0 else "linear_mlp")
        return [(pre + name, TensorRole.OTHER)]
    return []


def _has_kv(b: BlockConfig) -> bool:
    """Whether the block keeps a KV cache (attention, MLA, a parallel block's attention)."""
    k = spec_of(b)
    return isinstance(b, Attention) or (k is not None and k.attention) or (
        isinstance(b, Parallel) and b.attention is not None)


def quantization_config(arch: ModelArch, recipes: Sequence[str | PrecisionRecipe],
                        model_type: str, version: str = "") -> dict[str, Any] | None:
    """The ``quantization_config`` of ``arch`` exported as ``model_type`` with block ``i`` in
    ``recipes[i]``; None when nothing is quantized (weights and KV cache all 16/32-bit)."""
    if len(recipes) != arch.num_blocks:
        raise InputError(f"{len(recipes)} recipes for {arch.num_blocks} blocks",
                         field="precision")
    rs = [get_recipe(r) for r in recipes]
    layers: dict[str, dict[str, Any]] = {}
    kv: dict[str, str] = {}
    for i, (b, r) in enumerate(zip(arch.blocks, rs)):
        for name, role in _modules(b, model_type, i):
            dt = r.weight_dtype(role)
            if dt in _UNQUANTIZED:
                continue
            if dt not in _ALGO:
                raise InputError(f"block {i}: no ModelOpt format for {dt.value}",
                                 field="precision")
            layers[name] = dict(_ALGO[dt])
        if _has_kv(b):
            mixer = _modules(b, model_type, i)[0][0].rsplit(".", 1)[0]
            kv[mixer] = "FP8" if r.kv_cache == DType.FP8 else (
                "NONE" if r.kv_cache in _UNQUANTIZED else r.kv_cache.value.upper())
    kv_algos = set(kv.values())
    if not layers and kv_algos <= {"NONE"}:
        return None
    out: dict[str, Any] = {
        "quant_method": "modelopt",
        "quant_algo": "MIXED_PRECISION",
        "kv_cache_quant_algo": None,
        "quantized_layers": layers,
        "producer": {"name": "puzzle-nas", "version": version},
    }
    if len(kv_algos) == 1:
        algo = next(iter(kv_algos))
        out["kv_cache_quant_algo"] = None if algo == "NONE" else algo
    elif kv:
        out["kv_cache_quantized_layers"] = {k: (None if v == "NONE" else v)
                                            for k, v in kv.items()}
    return out


def block_formats(arch: ModelArch, qc: dict[str, Any] | None, model_type: str
                  ) -> list[dict[str, str]]:
    """Per block, ``{role: format}`` of its quantized weights (``"fp8"``, ``"nvfp4"``, ...;
    roles left out are unquantized) and ``"kv_cache"`` for attention, read from a
    ``quantization_config`` written by :func:`quantization_config`."""
    qc = qc or {}
    layers = qc.get("quantized_layers") or {}
    if not isinstance(layers, dict):
        raise InputError("expected an object", field="quantization_config.quantized_layers")
    per_kv = qc.get("kv_cache_quantized_layers") or {}
    out = []
    for i, b in enumerate(arch.blocks):
        d: dict[str, str] = {}
        mods = _modules(b, model_type, i)
        for name, role in mods:
            if name in layers:
                algo = layers[name].get("quant_algo")
                if algo not in _FROM_ALGO:
                    raise InputError(f"unknown quant_algo {algo!r}",
                                     field=f"quantization_config.quantized_layers.{name}")
                d.setdefault(role.value, _FROM_ALGO[algo].value)
        if _has_kv(b):
            mixer = mods[0][0].rsplit(".", 1)[0]
            kvf = per_kv.get(mixer, qc.get("kv_cache_quant_algo"))
            if kvf:
                d["kv_cache"] = str(kvf).lower()
        out.append(d)
    return out


def expand(qc: dict[str, Any], tensor_names: Iterable[str]) -> dict[str, dict[str, Any]]:
    """``quantized_layers`` with every pattern resolved against a checkpoint's tensor names
    (``<module>.weight``): one entry per module, as ModelOpt lists them."""
    mods = sorted({n.rsplit(".", 1)[0] for n in tensor_names if n.endswith(".weight")})
    out: dict[str, dict[str, Any]] = {}
    for pat, fmt in (qc.get("quantized_layers") or {}).items():
        hits = [m for m in mods if fnmatch.fnmatchcase(m, pat)]
        if not hits:
            raise InputError(f"{pat!r} matches no module of the checkpoint",
                             field="quantization_config.quantized_layers")
        for m in hits:
            out[m] = fmt
    return out
