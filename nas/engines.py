"""What each serving engine loads: per model family, the search axes an engine takes per
layer, only once per model (global), or not at all, read from the engines' own model code.

The table (:data:`TABLE`) is data: one :class:`Row` per (family, engine, axis), each citing
the engine's file and the commit it was read at; a row not read in the engine's code says
so (``verified=False``) and takes the conservative reading (a shape axis ``global``: the
engine's config holds one value for the model; a structural one, such as a no-op block,
``none``). ``docs/engines.md`` prints it.

A search for ``deploy.engines`` (:class:`nas.spec.DeploySpec`) reads it through
:func:`restrict` (alternatives that vary an axis a target engine does not take are
dropped, with a note) and :func:`tied_axes` (an axis a target engine holds global becomes a
tied choice: every block of that kind takes one value, :class:`nas.mip.Tie`); with several
engines, the space is the intersection. :func:`loads` says of any child whether an engine
loads it, and if not, why (one line).

Families (:func:`family_of`) group the HF types of :mod:`nas.hf` by the engine classes that
load their children: a heterogeneous Llama-like child is written as DeciLM
(``nemotron-nas``), a heterogeneous Nemotron-H child as ``nemotron_h_puzzle``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from hwprofiles.errors import InputError
from nas.arch import BlockConfig, Linear, ModelArch, NoOp
from nas.kinds import kinds

ENGINES: tuple[str, ...] = ("vllm", "trtllm", "sglang", "transformers")
"""Engines the table covers: vLLM, TensorRT-LLM (its PyTorch backend), SGLang, and stock
Hugging Face transformers classes (no ``trust_remote_code``)."""

Take = Literal["per_layer", "global", "none"]

# ---- axes ---------------------------------------------------------------------------------
# field axes: axis -> (block kind, how to read the value from a block of that kind)
_FIELD_AXES: dict[str, tuple[str, Callable[[Any], Any]]] = {
    "attention.kv_heads": ("attention", lambda b: b.num_kv_heads),
    "attention.sliding_window": ("attention", lambda b: b.sliding_window or 0),  # 0: full
    "ffn.width": ("ffn", lambda b: b.width),
    "moe.experts": ("moe", lambda b: b.num_experts),
    "moe.expert_width": ("moe", lambda b: b.expert_width),
    "moe.top_k": ("moe", lambda b: b.top_k),
    "moe.shared_width": ("moe", lambda b: b.shared_width),
    "mamba.state_size": ("mamba", lambda b: b.state_size),
    "mamba.heads": ("mamba", lambda b: b.num_heads),
    "deltanet.v_heads": ("deltanet", lambda b: b.num_v_heads),
    "deltanet.k_heads": ("deltanet", lambda b: b.num_k_heads),
    "mla.heads": ("mla", lambda b: b.num_heads),
    "mla.kv_lora_rank": ("mla", lambda b: b.kv_lora_rank),
    "mla.q_lora_rank": ("mla", lambda b: b.q_lora_rank),
    "parallel.kv_heads": ("parallel", lambda b: None if b.attention is None
                          else b.attention.num_kv_heads),
    "parallel.mamba_heads": ("parallel", lambda b: None if b.mamba is None
                             else b.mamba.num_heads),
    "parallel.state_size": ("parallel", lambda b: None if b.mamba is None
                            else b.mamba.state_size),
    # each registered kind's (nas.kinds)
    **{f"{name}.{f}": (name, read) for name, k in kinds().items()
       for f, read in k.engine_axes.items()},
}
# structural axes: a child block that is not a reshaped copy of its parent block
_STRUCT_AXES = ("attention.noop", "attention.linear", "ffn.noop", "ffn.linear", "moe.noop",
                "mamba.noop", "deltanet.noop", "deltanet.swap", "mla.noop",
                "parallel.drop_attention", "parallel.drop_mamba", "parallel.noop",
                *(f"{name}.noop" for name, k in kinds().items() if "noop" in k.space.model_fields),
                "spans", "precision")
AXES: tuple[str, ...] = (*_FIELD_AXES, *_STRUCT_AXES)
"""Every search axis the table speaks of: ``<kind>.<field>`` (a shape a block keeps),
``<kind>.noop`` / ``.linear`` (the block removed / replaced by one linear map),
``deltanet.swap`` (attention <-> DeltaNet), ``parallel.drop_*`` (one branch of a
Falcon-H1 block dropped), ``spans`` (multi-block replacements: the child has fewer or other
layers) and ``precision`` (a precision recipe per block)."""


def axis_kind(axis: str) -> str | None:
    """The block kind a field axis reads (None for a structural axis)."""
    return _FIELD_AXES[axis][0] if axis in _FIELD_AXES else None


def axis_value(axis: str, block: BlockConfig) -> Any:
    """The value of field axis ``axis`` in ``block`` (a block of the axis' kind)."""
    return _FIELD_AXES[axis][1](block)


def block_axes(parent: BlockConfig, child: BlockConfig) -> set[str]:
    """The axes a single-block alternative ``child`` of parent block ``parent`` varies."""
    pk = parent.kind
    if isinstance(child, NoOp):
        return {f"{pk}.noop"}
    if isinstance(child, Linear):
        return {f"{pk}.linear"}
    ck = child.kind
    if ck != pk:
        return {"deltanet.swap"}
    out = set()
    if pk == "parallel":
        if child.attention is None and parent.attention is not None:  # type: ignore[attr-defined]  # pk == 'parallel': both blocks are Parallel (Block's union holds BlockConfig)
            out.add("parallel.drop_attention")
        if child.mamba is None and parent.mamba is not None:  # type: ignore[attr-defined]  # pk == 'parallel': both blocks are Parallel (Block's union holds BlockConfig)
            out.add("parallel.drop_mamba")
    for axis, (kind, get) in _FIELD_AXES.items():
        if kind == pk and get(child) is not None and get(child) != get(parent):
            out.add(axis)
    return out


# ---- the table ----------------------------------------------------------------------------
@dataclass(frozen=True)
class Source:
    """Where a row was read: ``repo`` (GitHub owner/name), ``path`` and ``commit``."""

    repo: str
    path: str
    commit: str

    def __str__(self) -> str:
        return f"{self.repo}@{self.commit[:10]}:{self.path}"


@dataclass(frozen=True)
class Row:
    """How ``engine`` takes ``axis`` for ``family``: ``per_layer`` (every block its own
    value), ``global`` (one value for the model: every block of the kind the same),
    ``none`` (not at all: the parent's own blocks only)."""

    take: Take
    source: Source | None
    verified: bool
    note: str = ""
    multiple: int | None = None
    """A value of the axis the engine can express must be a multiple of this (DeciLM's
    ``ffn_mult`` widths: multiples of 256); None: any value."""

    def allows(self, value: Any) -> bool:
        """Whether the engine can express ``value`` of the axis (beyond ``take``)."""
        return self.multiple is None or (isinstance(value, int) and value % self.multiple == 0)


@dataclass(frozen=True)
class EngineFamily:
    """One engine on one family: whether it serves the family (``serves``; False: no
    class of it loads these types), the HF types its classes read (``types``), and a
    :class:`Row` per axis (an axis not listed: ``none`` when structural, ``global`` when a
    shape, both unverified)."""

    engine: str
    family: str
    serves: bool
    types: tuple[str, ...]
    rows: dict[str, Row]
    note: str = ""

    def row(self, axis: str) -> Row:
        if axis in self.rows:
            return self.rows[axis]
        take: Take = "global" if axis in _FIELD_AXES else "none"
        return Row(take, None, False, "not read in the engine's code: the conservative "
                   "reading (a shape once per model, no structural change)")


# sources read (the commit each file was read at; see docs/engines.md)
_VLLM_NH = Source("vllm-project/vllm", "vllm/model_executor/models/nemotron_h.py",
                  "00b08dc44519a82cbdd9061d92d1226985094622")
_VLLM_DECI = Source("vllm-project/vllm", "vllm/model_executor/models/nemotron_nas.py",
                    "00bd1493b3e82d6c13c68ee8a0e1c5a96707e190")
_TRT_NH = Source("NVIDIA/TensorRT-LLM", "tensorrt_llm/_torch/models/modeling_nemotron_h.py",
                 "00620eb025e7c24895986e1042380bd1be4426d9")
_VLLM_OSS = Source("vllm-project/vllm", "vllm/model_executor/models/gpt_oss.py",
                   "0025d69bcf08bb1b135103167f0bbc82b9af6e69")
_TRT_DECI = Source("NVIDIA/TensorRT-LLM",
                   "tensorrt_llm/_torch/models/modeling_nemotron_nas.py",
                   "0193dbd4189221d0fd5e9f20cdb384d3da8dbc24")
_VLLM_Q3N = Source("vllm-project/vllm", "vllm/model_executor/models/qwen3_next.py",
                   "002d6073aa034d4f5545d45021b0e56d1f3c3593")
_HF_NH = Source("huggingface/transformers",
                "src/transformers/models/nemotron_h/modeling_nemotron_h.py",
                "008d9e9577b0eb0149aa6bb0c44da582b10e0b6e")
_SGL_NH = Source("sgl-project/sglang", "python/sglang/srt/models/nemotron_h.py",
                 "02c60328e56db1c91b639859469b61c103ca2e7f")


def _r(take: Take, src: Source | None, note: str = "", multiple: int | None = None) -> Row:
    return Row(take, src, src is not None, note, multiple)


_PATTERN = ("layer types come only from hybrid_override_pattern, one of M * - E per layer: a "
            "no-op or linear block is no layer type (this project writes it as block_type "
            "noop / linear, which the engine refuses)")
_NH_VLLM = {
    "moe.experts": _r("per_layer", _VLLM_NH, "n_routed_experts from the layer's config "
                      "(get_nemotron_h_config_for_layer, nemotron_h_puzzle block_configs); "
                      "the expert map is sized to the largest"),
    "moe.expert_width": _r("per_layer", _VLLM_NH, "moe_intermediate_size from the layer's "
                           "config"),
    "moe.top_k": _r("per_layer", _VLLM_NH, "num_experts_per_tok from the layer's config"),
    "moe.shared_width": _r("per_layer", _VLLM_NH, "moe_shared_expert_intermediate_size "
                           "from the layer's config"),
    "moe.noop": _r("none", _VLLM_NH, _PATTERN),
    "mamba.state_size": _r("global", _VLLM_NH, "NemotronHMambaDecoderLayer builds "
                           "MambaMixer2 from the model config (not the layer's), and the "
                           "Mamba state shape (get_mamba_state_shape_from_config) from "
                           "hf_config.ssm_state_size"),
    "mamba.heads": _r("global", _VLLM_NH, "mamba_num_heads from the model config, in the "
                      "mixer and in the state shape"),
    "mamba.noop": _r("none", _VLLM_NH, _PATTERN),
    "attention.kv_heads": _r("global", _VLLM_NH, "NemotronHAttention reads "
                             "num_key_value_heads from the layer's config, but a hybrid's "
                             "attention KV pages beside Mamba state pages of differing "
                             "sizes per layer is not verified; held global, as NVIDIA's "
                             "Puzzle children keep it"),
    "attention.sliding_window": _r("per_layer", _VLLM_NH, "per_layer_sliding_window from "
                                   "the layer's config"),
    "attention.noop": _r("none", _VLLM_NH, _PATTERN),
    "attention.linear": _r("none", _VLLM_NH, _PATTERN),
    "ffn.width": _r("per_layer", _VLLM_NH, "intermediate_size from the layer's config (or "
                    "a list indexed by MLP layer)"),
    "ffn.noop": _r("none", _VLLM_NH, _PATTERN),
    "ffn.linear": _r("none", _VLLM_NH, _PATTERN),
    "spans": _r("per_layer", _VLLM_NH, "any hybrid_override_pattern of M * - E loads: a "
                "child with fewer or other layers is one more pattern"),
    "precision": _r("none", None, "per-layer quantization of a ModelOpt mixed-precision "
                    "checkpoint not read in vLLM"),
}
_NH_TRT = {
    "moe.experts": _r("per_layer", _TRT_NH, "_get_layer_moe_param: n_routed_experts from "
                      "block_configs[layer], else the model config"),
    "moe.expert_width": _r("per_layer", _TRT_NH, "moe_intermediate_size from "
                           "block_configs[layer]"),
    "moe.top_k": _r("per_layer", _TRT_NH, "num_experts_per_tok from block_configs[layer]"),
    "moe.shared_width": _r("per_layer", _TRT_NH, "moe_shared_expert_intermediate_size from "
                           "block_configs[layer]"),
    "moe.noop": _r("none", _TRT_NH, _PATTERN + " (NemotronHLayer raises on any other)"),
    "mamba.state_size": _r("global", _TRT_NH, "Mamba2Mixer(d_state=config.ssm_state_size) "
                           "from the model config"),
    "mamba.heads": _r("global", _TRT_NH, "nheads=config.mamba_num_heads"),
    "mamba.noop": _r("none", _TRT_NH, _PATTERN),
    "attention.kv_heads": _r("global", _TRT_NH, "TransformerLayer: "
                             "num_key_value_heads=config.num_key_value_heads"),
    "attention.sliding_window": _r("none", _TRT_NH, "TransformerLayer passes no window"),
    "attention.noop": _r("none", _TRT_NH, _PATTERN),
    "attention.linear": _r("none", _TRT_NH, _PATTERN),
    "ffn.width": _r("global", _TRT_NH, "MLPLayer reads config.intermediate_size (a list "
                    "indexed by layer, not by MLP layer as vLLM and SGLang index it; "
                    "block_configs are not read for it)"),
    "ffn.noop": _r("none", _TRT_NH, _PATTERN),
    "ffn.linear": _r("none", _TRT_NH, _PATTERN),
    "spans": _r("per_layer", _TRT_NH, "layers are built from hybrid_override_pattern, any "
                "pattern of M * - E"),
    "precision": _r("per_layer", _TRT_NH, "MIXED_PRECISION checkpoints: "
                    "quant_config_dict per layer prefix (NemotronHLayer, NemotronHMOE)"),
}
_NH_SGL = {
    "moe.experts": _r("per_layer", _SGL_NH, "NemotronHMoEDecoderLayer builds NemotronHMoE "
                      "from config.get_nemotron_h_config_for_layer(layer): n_routed_experts "
                      "per layer"),
    "moe.expert_width": _r("per_layer", _SGL_NH, "moe_intermediate_size from the layer's "
                           "config"),
    "moe.top_k": _r("per_layer", _SGL_NH, "num_experts_per_tok from the layer's config"),
    "moe.shared_width": _r("per_layer", _SGL_NH, "moe_shared_expert_intermediate_size from "
                           "the layer's config"),
    "moe.noop": _r("none", _SGL_NH, _PATTERN),
    "mamba.state_size": _r("global", _SGL_NH, "NemotronHMambaDecoderLayer: MambaMixer2 "
                           "from the model config's mamba2_cache_params"),
    "mamba.heads": _r("global", _SGL_NH, "the model config's mamba2_cache_params"),
    "mamba.noop": _r("none", _SGL_NH, _PATTERN),
    "attention.kv_heads": _r("global", _SGL_NH, "NemotronHAttention reads "
                             "num_key_value_heads from the layer's config; KV pools of "
                             "differing head counts beside the Mamba pool not verified, "
                             "held global as for vLLM"),
    "attention.sliding_window": _r("per_layer", _SGL_NH, "sliding_window_size from the "
                                   "layer's config"),
    "attention.noop": _r("none", _SGL_NH, _PATTERN),
    "attention.linear": _r("none", _SGL_NH, _PATTERN),
    "ffn.width": _r("global", _SGL_NH, "NemotronHMLPDecoderLayer reads the model config's "
                    "intermediate_size (a list indexed by MLP layer), not the layer's; held "
                    "global since vLLM and TensorRT-LLM index such a list differently"),
    "ffn.noop": _r("none", _SGL_NH, _PATTERN),
    "ffn.linear": _r("none", _SGL_NH, _PATTERN),
    "spans": _r("per_layer", _SGL_NH, "layers from hybrid_override_pattern, any pattern of "
                "M * - E"),
}
_DECI_TRT = {
    "attention.kv_heads": _r("per_layer", _TRT_DECI, "num_key_value_heads per layer from "
                             "block_configs[layer].attention.n_heads_in_group"),
    "attention.noop": _r("per_layer", _TRT_DECI, "block_configs[layer].attention.no_op"),
    "attention.linear": _r("per_layer", _TRT_DECI, "replace_with_linear: LinearAttention, "
                           "one hidden x hidden linear"),
    "attention.sliding_window": _r("none", _TRT_DECI, "no window read"),
    "ffn.width": _r("per_layer", _TRT_DECI, "always from block_configs[layer].ffn.ffn_mult "
                    "(2 * ffn_mult * hidden / 3 rounded up to 256): widths that are "
                    "multiples of 256", 256),
    "ffn.noop": _r("per_layer", _TRT_DECI, "block_configs[layer].ffn.no_op"),
    "ffn.linear": _r("per_layer", _TRT_DECI, "replace_with_linear: LinearMLP"),
    "spans": _r("none", _TRT_DECI, "a DeciLM layer is one attention and one FFN slot"),
    "precision": _r("none", None, "not read"),
}
_DECI_VLLM = {
    "attention.kv_heads": _r("per_layer", _VLLM_DECI, "num_attention_heads // "
                             "block_configs[layer].attention.n_heads_in_group"),
    "attention.noop": _r("per_layer", _VLLM_DECI, "block_configs[layer].attention.no_op"),
    "attention.linear": _r("none", _VLLM_DECI, "replace_with_linear is not read: the layer "
                           "builds full attention and its weights do not load"),
    "attention.sliding_window": _r("none", _VLLM_DECI, "no window in block_configs is read"),
    "ffn.width": _r("per_layer", _VLLM_DECI, "block_configs[layer].ffn.ffn_mult "
                    "(intermediate = 2 * ffn_mult * hidden / 3 rounded up to 256), or its "
                    "intermediate_size when the block has no ffn_mult (the checkpoint's own "
                    "config class, --trust-remote-code); held to multiples of 256, which "
                    "load either way", 256),
    "ffn.noop": _r("per_layer", _VLLM_DECI, "block_configs[layer].ffn.no_op"),
    "ffn.linear": _r("none", _VLLM_DECI, "replace_with_linear is not read"),
    "spans": _r("none", _VLLM_DECI, "a DeciLM layer is one attention and one FFN slot"),
    "precision": _r("none", None, "not read"),
}

_HOMOGENEOUS = "a stock config class holds one value per field for the model"

_OSS_VLLM = {
    "attention.kv_heads": _r("global", _VLLM_OSS, "OAIAttention: config.num_key_value_heads"),
    "attention.sliding_window": _r("none", _VLLM_OSS, "config.sliding_window on every other "
                                   "layer (layer_idx % 2 == 0), full attention on the rest: "
                                   "the parent's pattern, fixed by layer index"),
    "moe.experts": _r("global", _VLLM_OSS, "MLPBlock: config.num_local_experts"),
    "moe.expert_width": _r("global", _VLLM_OSS, "config.intermediate_size"),
    "moe.top_k": _r("global", _VLLM_OSS, "config.num_experts_per_tok"),
    "attention.noop": _r("none", _VLLM_OSS, "every layer builds attention and MoE"),
    "moe.noop": _r("none", _VLLM_OSS, "every layer builds attention and MoE"),
}
_Q3N_VLLM = {
    "deltanet.swap": _r("per_layer", _VLLM_Q3N, "Qwen3NextDecoderLayer takes its "
                        "layer_type from config.layer_types[layer]: linear_attention or "
                        "full_attention per layer (the export writes layer_types)"),
    "deltanet.v_heads": _r("global", _VLLM_Q3N, "QwenGatedDeltaNetAttention(config): "
                           "linear_num_value_heads from the model config"),
    "deltanet.k_heads": _r("global", _VLLM_Q3N, "linear_num_key_heads from the model "
                           "config"),
    "deltanet.noop": _r("none", _VLLM_Q3N, "every layer is linear_attention or "
                        "full_attention (any other raises)"),
    "attention.kv_heads": _r("global", _VLLM_Q3N, "Qwen3NextAttention: "
                             "config.num_key_value_heads"),
    "attention.noop": _r("none", _VLLM_Q3N, "every layer builds its token mixer"),
    "moe.experts": _r("global", _VLLM_Q3N, "Qwen3NextSparseMoeBlock: config.num_experts"),
    "moe.expert_width": _r("global", _VLLM_Q3N, "config.moe_intermediate_size"),
    "moe.top_k": _r("global", _VLLM_Q3N, "config.num_experts_per_tok"),
    "moe.shared_width": _r("global", _VLLM_Q3N, "config.shared_expert_intermediate_size"),
    "moe.noop": _r("none", _VLLM_Q3N, "every layer builds an MLP (MoE, or dense in "
                   "mlp_only_layers)"),
}
_OSS_OTHER = {
    "attention.sliding_window": Row("none", None, False, "the parent alternates sliding and "
                                    "full attention by layer; how this engine places them is "
                                    "not read, so the parent's pattern only"),
}


def _family(family: str, engine: str, serves: bool, types: Sequence[str],
            rows: dict[str, Row] | None = None, note: str = "") -> EngineFamily:
    return EngineFamily(engine, family, serves, tuple(types), rows or {}, note)


FAMILIES: dict[str, tuple[str, ...]] = {
    "llama": ("llama", "mistral", "qwen2", "qwen3", "nemotron-nas"),
    "moe": ("mixtral", "qwen2_moe", "qwen3_moe"),
    "nemotron_h": ("nemotron_h", "nemotron_h_puzzle"),
    "deepseek_v3": ("deepseek_v3", "kimi_k2", "deepseek_v3_puzzle"),
    "gpt_oss": ("gpt_oss", "gpt_oss_puzzle"),
    "qwen3_next": ("qwen3_next",),
    "qwen3_5": ("qwen3_5_moe_text", "qwen3_5_moe"),
    "granitemoehybrid": ("granitemoehybrid",),
    "jamba": ("jamba",),
    "falcon_h1": ("falcon_h1",),
}
"""Family -> the HF model types (:data:`nas.hf.SUPPORTED_TYPES`) whose children it holds."""

TABLE: dict[tuple[str, str], EngineFamily] = {}
"""(family, engine) -> :class:`EngineFamily`."""


def _add(ef: EngineFamily) -> None:
    TABLE[(ef.family, ef.engine)] = ef


_add(_family("nemotron_h", "vllm", True, ("nemotron_h", "nemotron_h_puzzle"), _NH_VLLM))
_add(_family("nemotron_h", "trtllm", True, ("nemotron_h", "nemotron_h_puzzle"), _NH_TRT))
_add(_family("nemotron_h", "sglang", True, ("nemotron_h", "nemotron_h_puzzle"), _NH_SGL,
             "per-layer configs through get_nemotron_h_config_for_layer"))
_NH_HF = {
    "moe.experts": _r("global", _HF_NH, "NemotronHExperts(config): config.n_routed_experts"),
    "moe.expert_width": _r("global", _HF_NH, "NemotronHExperts: config.moe_intermediate_size"),
    "ffn.width": _r("global", _HF_NH, "NemotronHMLP: intermediate_size or "
                    "config.intermediate_size"),
}
_add(_family("nemotron_h", "transformers", True, ("nemotron_h",), _NH_HF,
             "the stock NemotronH classes (no nemotron_h_puzzle class; a heterogeneous "
             "child loads through trust_remote_code, which this table does not cover)"))
_add(_family("llama", "vllm", True, ("llama", "mistral", "qwen2", "qwen3", "nemotron-nas"),
             _DECI_VLLM, "a heterogeneous child is written as DeciLM (nemotron-nas), "
             "which DeciLMForCausalLM loads"))
_add(_family("llama", "trtllm", True, ("llama", "mistral", "qwen2", "qwen3", "nemotron-nas"),
             _DECI_TRT, "a heterogeneous child is written as DeciLM (nemotron-nas), which "
             "NemotronNASForCausalLM (registered for DeciLMForCausalLM) loads"))
for _eng in ("sglang", "transformers"):
    _add(_family("llama", _eng, True, ("llama", "mistral", "qwen2", "qwen3"), {},
                 "the stock Llama-like classes (unverified: " + _HOMOGENEOUS + "); DeciLM "
                 "(nemotron-nas) in this engine not read"))
for _fam in ("moe", "deepseek_v3", "gpt_oss", "qwen3_next", "qwen3_5", "granitemoehybrid",
             "jamba", "falcon_h1"):
    plain = tuple(t for t in FAMILIES[_fam] if not t.endswith("_puzzle"))
    for _eng in ENGINES:
        rows = {}
        if _fam == "gpt_oss":
            rows = _OSS_VLLM if _eng == "vllm" else _OSS_OTHER
        elif _fam == "qwen3_next" and _eng == "vllm":
            rows = _Q3N_VLLM
        _add(_family(_fam, _eng, True, plain, rows,
                     "the stock class of the family (unverified: " + _HOMOGENEOUS + "; "
                     "the *_puzzle types of this project are read by no engine)"))


def family_of(model_type: str) -> str | None:
    """The family of an HF ``model_type`` (None: a type the table does not cover)."""
    for fam, types in FAMILIES.items():
        if model_type in types:
            return fam
    return None


def serving(model_type: str) -> list[str]:
    """The engines that have a class for ``model_type`` (and so serve its family), in
    :data:`ENGINES` order."""
    fam = family_of(model_type)
    return [e for e in ENGINES if fam is not None and TABLE[(fam, e)].serves
            and model_type in TABLE[(fam, e)].types]


def _target(model_type: str, engine: str) -> EngineFamily:
    """:func:`entry` for a deploy target: an InputError when the engine has no class for
    the parent's own type (it could load no child of it)."""
    ef = entry(model_type, engine)
    if not ef.serves or model_type not in ef.types:
        raise InputError(f"{engine} has no class for the parent's type {model_type!r} (it "
                         f"reads {', '.join(ef.types) or 'none of this family'}); engines "
                         f"that do: {', '.join(serving(model_type)) or 'none'}",
                         field="deploy.engines")
    return ef


def entry(model_type: str, engine: str) -> EngineFamily:
    """The table's entry for ``engine`` on ``model_type``'s family (InputError when the
    engine is unknown or the family is not covered)."""
    if engine not in ENGINES:
        raise InputError(f"unknown engine {engine!r}; expected one of {', '.join(ENGINES)}",
                         field="deploy.engines")
    fam = family_of(model_type)
    if fam is None:
        raise InputError(f"the engine table does not cover model type {model_type!r} "
                         f"(families: {', '.join(FAMILIES)})", field="deploy.engines")
    return TABLE[(fam, engine)]


# ---- what a search may produce ------------------------------------------------------------
def alternative_axes(parent: ModelArch, alt: Any) -> set[str]:
    """The axes an alternative (:class:`nas.space.Alternative`) of ``parent`` varies."""
    out: set[str] = set()
    if alt.end is not None:
        out.add("spans")
    else:
        out |= block_axes(parent.blocks[alt.block], alt.child)
    if alt.recipe is not None:
        out.add("precision")
    return out


def _values_of(block: BlockConfig) -> list[tuple[str, Any]]:
    """``(axis, value)`` of every field axis of ``block``'s kind."""
    return [(axis, get(block)) for axis, (kind, get) in _FIELD_AXES.items()
            if block.kind == kind and get(block) is not None]


def _field_values(blocks: Sequence[BlockConfig]) -> dict[str, set[Any]]:
    """Per field axis, the values ``blocks`` of its kind hold."""
    out: dict[str, set[Any]] = {}
    for b in blocks:
        for axis, (kind, get) in _FIELD_AXES.items():
            if b.kind == kind and get(b) is not None:
                out.setdefault(axis, set()).add(get(b))
    return out


def restrict(parent: ModelArch, alts: list[list[Any]], engines: Sequence[str]
             ) -> tuple[list[list[Any]], list[str]]:
    """``alts`` without the alternatives that vary an axis some engine of ``engines`` does
    not take (``none``), and one note per (engine, axis) that dropped any: ``"vllm does not
    take mamba.noop: dropped 40 alternatives (...)"``. A span takes the rows of the blocks
    it produces too (a no-op span is one more pattern; a span child with a field another
    engine holds global is tied like any block). The parent's own alternative always
    stays."""
    if not engines:
        return alts, []
    efs = [_target(parent.model_type, e) for e in engines]
    dropped: dict[tuple[str, str], int] = {}
    out = []
    for row in alts:
        kept = []
        for a in row:
            if a.is_parent:
                kept.append(a)
                continue
            axes = alternative_axes(parent, a)
            if a.end is not None:  # the blocks a span produces: no no-op / linear inside
                for c in a.blocks:
                    if isinstance(c, NoOp | Linear):
                        axes.add(f"{parent.blocks[a.block].kind}.{c.kind}")
            bad = [(ef.engine, ax) for ef in efs for ax in sorted(axes)
                   if ef.row(ax).take == "none"]
            bad += [(ef.engine, f"{ax}={v}") for ef in efs for c in a.blocks
                    for ax, v in _values_of(c) if not ef.row(ax).allows(v)]
            if bad:
                dropped[bad[0]] = dropped.get(bad[0], 0) + 1
                continue
            kept.append(a)
        out.append(kept)
    notes = [f"{eng} does not take {ax}: dropped {n} alternative{'s' * (n != 1)} "
             f"({entry(parent.model_type, eng).row(ax.split('=')[0]).note or 'not in its code'})"
             for (eng, ax), n in sorted(dropped.items())]
    return out, notes


def tied_axes(parent: ModelArch, engines: Sequence[str]) -> dict[str, list[str]]:
    """Field axis -> the engines of ``engines`` that hold it global (a tied choice). An
    axis the parent itself varies across blocks and an engine holds global is an
    InputError (that engine cannot load the parent: the table or the engine is wrong)."""
    out: dict[str, list[str]] = {}
    vals = _field_values(parent.blocks)
    for e in engines:
        ef = _target(parent.model_type, e)
        for axis in _FIELD_AXES:
            if ef.row(axis).take != "global" or axis not in vals:
                continue
            if len(vals[axis]) > 1:
                raise InputError(f"{e} holds {axis} global, but the parent's blocks hold "
                                 f"{sorted(vals[axis], key=str)}: the engine table says "
                                 f"{e} cannot load the parent", field="deploy.engines")
            out.setdefault(axis, []).append(e)
    return out


def ties(library: Any, axes: dict[str, list[str]]) -> tuple[list[Any], list[int]]:
    """The :class:`nas.mip.Tie` of each tied axis over ``library``'s replacements (their
    child blocks as :attr:`nas.library.BlockLibrary.children` dicts), and the replacements
    that hold two values of one tied axis among their child blocks (a span; the search
    forbids them)."""
    from nas.arch import BLOCK_TYPES
    from nas.mip import Tie

    out, forbid = [], set()
    blocks_of = [[BLOCK_TYPES[c["kind"]].model_validate(
        {k: v for k, v in c.items() if k != "precision"}) for c in kids]
        for kids in library.children]
    for axis, engs in axes.items():
        kind, get = _FIELD_AXES[axis]
        groups: dict[Any, list[int]] = {}
        for r, kids in enumerate(blocks_of):
            vs = {get(b) for b in kids if b.kind == kind and get(b) is not None}
            if len(vs) > 1:
                forbid.add(r)
            elif vs:
                groups.setdefault(vs.pop(), []).append(r)
        if len(groups) < 2:
            continue  # one value: nothing to tie
        keys = sorted(groups, key=lambda v: (str(type(v)), v))
        out.append(Tie(f"{axis} ({', '.join(engs)})", tuple(tuple(groups[k]) for k in keys),
                       tuple(f"{axis.split('.', 1)[1]}={k}" for k in keys)))
    return out, sorted(forbid)


# ---- what an engine loads -----------------------------------------------------------------
def loads(parent: ModelArch, child: ModelArch, engine: str) -> tuple[bool, str]:
    """Whether ``engine`` loads ``child`` (a child of ``parent``, same block positions or a
    spans-shortened one): ``(True, "")`` or ``(False, one line why)``. It checks the child
    against the table: every field axis the engine holds global takes one value over the
    child's blocks of that kind, and no block varies an axis the engine does not take."""
    ef = entry(parent.model_type, engine)
    if not ef.serves or parent.model_type not in ef.types:
        return False, f"{engine} has no class for the parent's type {parent.model_type!r}"
    pb, cb = parent.blocks, child.blocks
    if len(pb) != len(cb):
        take = ef.row("spans")
        if take.take == "none":
            return False, (f"the child has {len(cb)} blocks for the parent's {len(pb)} "
                           f"(spans): {engine} {take.note or 'does not take spans'}")
    else:
        for i, (p, c) in enumerate(zip(pb, cb)):
            for ax in sorted(block_axes(p, c)):
                row = ef.row(ax)
                if row.take == "none":
                    return False, f"block {i} varies {ax} ({c.describe()}): {engine} does " \
                                  f"not take it ({row.note or 'not in its code'})"
                v = axis_value(ax, c) if ax in _FIELD_AXES else None
                if v is not None and not row.allows(v):
                    return False, f"block {i} has {ax} = {v}: {engine} takes only multiples " \
                                  f"of {row.multiple} ({row.note})"
    vals = _field_values(cb)
    for ax, vs in sorted(vals.items()):
        row = ef.row(ax)
        if row.take == "global" and len(vs) > 1:
            shown = ", ".join(str(v) for v in sorted(vs, key=str))
            return False, f"{ax} takes {len(vs)} values ({shown}): {engine} holds it " \
                          f"global ({row.note or 'one value per model'})"
    return True, ""


def report(parent: ModelArch, child: ModelArch, engines: Sequence[str] | None = None,
           per_block_precision: bool = False) -> list[dict[str, Any]]:
    """For each engine (default: every engine of the table), ``{"engine", "loads",
    "why"}``: the blueprint's ``engines`` section."""
    out = []
    for e in engines or ENGINES:
        ok, why = loads(parent, child, e)
        if ok and per_block_precision and entry(parent.model_type, e).row(
                "precision").take == "none":
            ok, why = False, (f"blocks carry their own precision recipes: {e} does not take "
                              "per-block precision")
        out.append({"engine": e, "loads": ok, "why": why})
    return out


def table_rows() -> list[dict[str, Any]]:
    """The table as flat rows (family, engine, axis, take, verified, source, note), for
    docs and ``puzzle-nas`` output."""
    out = []
    for (fam, eng), ef in TABLE.items():
        for axis in AXES:
            if axis not in ef.rows:
                continue
            r = ef.rows[axis]
            out.append({"family": fam, "engine": eng, "axis": axis, "take": r.take,
                        "verified": r.verified, "source": str(r.source) if r.source else "",
                        "note": r.note})
    return out


def markdown_table() -> str:
    """The table as the markdown ``docs/engines.md`` prints (one row per listed axis)."""
    lines = ["| family | engine | axis | takes | read at | why |", "|---|---|---|---|---|---|"]
    for r in table_rows():
        src = f"`{r['source']}`" if r["source"] else "unverified"
        lines.append(f"| {r['family']} | {r['engine']} | `{r['axis']}` | {r['take']} | {src} "
                     f"| {r['note']} |")
    return "\n".join(lines) + "\n"
