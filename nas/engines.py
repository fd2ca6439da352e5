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
    shape, both unverified). ``source``: the file that says which classes load the family
    (for an engine that does not serve it, the registry that lacks it); ``unread``: only
    some of the family's axes were read (the listed verified rows), the rest take the
    conservative reading."""

    engine: str
    family: str
    serves: bool
    types: tuple[str, ...]
    rows: dict[str, Row]
    note: str = ""
    source: Source | None = None
    unread: bool = False

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
_VLLM_Q3N_RECHECK = Source("vllm-project/vllm", "vllm/model_executor/models/qwen3_next.py",
                           "6365b387890f7aa74b0fe65b81705d4730fcc763")
_Q3N_VLLM |= {
    "attention.sliding_window": _r("global", _VLLM_Q3N_RECHECK, "Qwen3NextAttention passes "
                                   "no per_layer_sliding_window: cache_config.sliding_window "
                                   "(model config) on every full-attention layer"),
    "ffn.width": _r("global", _VLLM_Q3N_RECHECK, "dense layers (mlp_only_layers): "
                    "Qwen3NextMLP(config.intermediate_size)"),
    "spans": _r("none", _VLLM_Q3N_RECHECK, "layers are (mixer, MLP) pairs: a span's dropped "
                "blocks would be no-ops in place, which no layer expresses"),
}
_VLLM_OSS_RECHECK = Source("vllm-project/vllm", "vllm/model_executor/models/gpt_oss.py",
                           "a6b6cfaa0cedff84872a0118380c6cfea91b635d")

_SPAN_PAIRS = ("a layer is one (token mixer, MLP) pair built from num_hidden_layers: a span's "
               "other blocks are no layer")
_SWAP_KIND = ("(block_axes labels any change of a block's kind deltanet.swap; here mamba <-> "
              "attention) ")
_WINDOW_TOGGLE = ("layer_types[i] toggles sliding / full per layer, but with one "
                  "config.sliding_window for the model: no free window per layer, so the "
                  "parent's pattern only")

# ---- vLLM ----------------------------------------------------------------------------------
_VLLM_ATTN = Source("vllm-project/vllm", "vllm/model_executor/layers/attention/attention.py",
                    "71169c16e9880bb04020f0479a847dc378920f0a")
_VLLM_Q3MOE = Source("vllm-project/vllm", "vllm/model_executor/models/qwen3_moe.py",
                     "2e0831b0ab951c8896d4dd5d6cb9c3350a4574de")
_VLLM_Q2MOE = Source("vllm-project/vllm", "vllm/model_executor/models/qwen2_moe.py",
                     "8bbabf03350e7821e2ffc6a5b3d9931e5f6df4c0")
_VLLM_DSV2 = Source("vllm-project/vllm", "vllm/model_executor/models/deepseek_v2.py",
                    "b863fe5bf4e19680572603b4e166faefc5725551")
_VLLM_Q35 = Source("vllm-project/vllm", "vllm/model_executor/models/qwen3_5.py",
                   "00def4f8421153e037ff6270c0a8c31912a00206")
_VLLM_GDN = Source("vllm-project/vllm", "vllm/model_executor/layers/mamba/gdn_linear_attn.py",
                   "dae956b29dfdefa6ffa2ae94a6fe77222647e38a")
_VLLM_GRANITE = Source("vllm-project/vllm", "vllm/model_executor/models/granitemoehybrid.py",
                       "0195c9ec6ea9cda412d1c69034fc5926a2c29528")
_VLLM_JAMBA = Source("vllm-project/vllm", "vllm/model_executor/models/jamba.py",
                     "002b4cf80b730f384dbc7d5f85db8a10b14af56a")
_VLLM_FH1 = Source("vllm-project/vllm", "vllm/model_executor/models/falcon_h1.py",
                   "59e459897da422926a8c401c975d8765f0a3e1d1")

_MOE_VLLM = {
    "attention.kv_heads": _r("global", _VLLM_Q3MOE, "Qwen3MoeAttention: "
                             "config.num_key_value_heads (MixtralAttention, Qwen2MoeAttention "
                             "the same)"),
    "attention.sliding_window": _r("global", _VLLM_ATTN, "no per_layer_sliding_window "
                                   "passed: Attention takes cache_config.sliding_window on "
                                   "every layer (layer_types not read: a parent mixing sliding "
                                   "and full layers does not load as it is)"),
    "attention.noop": _r("none", _VLLM_Q3MOE, "every layer builds attention and an MLP (MoE "
                         "or dense)"),
    "attention.linear": _r("none", _VLLM_Q3MOE, "every layer builds attention and an MLP"),
    "moe.experts": _r("global", _VLLM_Q3MOE, "Qwen3MoeSparseMoeBlock: config.num_experts "
                      "(Qwen2Moe the same; MixtralMoE: config.num_local_experts)"),
    "moe.expert_width": _r("global", _VLLM_Q3MOE, "config.moe_intermediate_size (Mixtral: "
                           "config.intermediate_size)"),
    "moe.top_k": _r("global", _VLLM_Q3MOE, "config.num_experts_per_tok (all three classes)"),
    "moe.shared_width": _r("global", _VLLM_Q2MOE, "Qwen2MoeSparseMoeBlock: "
                           "config.shared_expert_intermediate_size (0: none); Qwen3Moe reads "
                           "the same key by getattr; Mixtral has none"),
    "moe.noop": _r("none", _VLLM_Q3MOE, "every layer builds an MLP: the MoE block, or a "
                   "dense Qwen*MoeMLP in mlp_only_layers / off decoder_sparse_step"),
    "ffn.width": _r("global", _VLLM_Q3MOE, "dense layers (config.mlp_only_layers, read per "
                    "layer) build Qwen3MoeMLP(config.intermediate_size): one width"),
    "ffn.noop": _r("none", _VLLM_Q3MOE, "every layer builds an MLP"),
    "ffn.linear": _r("none", _VLLM_Q3MOE, "every layer builds an MLP"),
    "spans": _r("none", _VLLM_Q3MOE, _SPAN_PAIRS),
}
_DSV3_VLLM = {
    "mla.heads": _r("global", _VLLM_DSV2, "DeepseekV2MLAAttention: config.num_attention_heads"),
    "mla.kv_lora_rank": _r("global", _VLLM_DSV2, "config.kv_lora_rank (kv_a_proj_with_mqa, "
                           "kv_b_proj and the MLA cache width)"),
    "mla.q_lora_rank": _r("global", _VLLM_DSV2, "config.q_lora_rank (None: plain q_proj)"),
    "mla.noop": _r("none", _VLLM_DSV2, "every DeepseekV2DecoderLayer builds self_attn and an "
                   "MLP"),
    "moe.experts": _r("global", _VLLM_DSV2, "DeepseekV2MoE: config.n_routed_experts"),
    "moe.expert_width": _r("global", _VLLM_DSV2, "SharedFusedMoE(intermediate_size="
                           "config.moe_intermediate_size)"),
    "moe.top_k": _r("global", _VLLM_DSV2, "config.num_experts_per_tok (grouped top-k with "
                    "config.n_group / topk_group)"),
    "moe.shared_width": _r("global", _VLLM_DSV2, "shared experts of "
                           "config.moe_intermediate_size * config.n_shared_experts"),
    "moe.noop": _r("none", _VLLM_DSV2, "MoE where layer_idx >= first_k_dense_replace and "
                   "layer_idx % moe_layer_freq == 0, else dense: the parent's placement, no "
                   "empty MLP"),
    "ffn.width": _r("global", _VLLM_DSV2, "DeepseekV2MLP(config.intermediate_size) on the "
                    "dense layers"),
    "ffn.noop": _r("none", _VLLM_DSV2, "every layer builds an MLP"),
    "ffn.linear": _r("none", _VLLM_DSV2, "every layer builds an MLP"),
    "spans": _r("none", _VLLM_DSV2, _SPAN_PAIRS + " (DeepseekV2Model builds every layer "
                "from the model's hf_config)"),
}
_Q35_VLLM = {
    "deltanet.swap": _r("per_layer", _VLLM_Q35, "Qwen3_5Model builds Qwen3_5DecoderLayer("
                        "layer_type=config.layer_types[i]): linear_attention or "
                        "full_attention per layer"),
    "deltanet.v_heads": _r("global", _VLLM_GDN, "GatedDeltaNetAttention(config): "
                           "config.linear_num_value_heads, in the mixer and the state shape"),
    "deltanet.k_heads": _r("global", _VLLM_GDN, "config.linear_num_key_heads (mixer and "
                           "get_mamba_state_shape_from_config)"),
    "deltanet.noop": _r("none", _VLLM_Q35, "a layer_type other than linear_attention / "
                        "full_attention raises ValueError"),
    "attention.kv_heads": _r("global", _VLLM_Q3N_RECHECK, "Qwen3NextAttention(config) (which "
                             "qwen3_5 imports): config.num_key_value_heads"),
    "attention.sliding_window": _r("global", _VLLM_Q3N_RECHECK, "no per_layer_sliding_window:"
                                   " cache_config.sliding_window on every attention layer"),
    "attention.noop": _r("none", _VLLM_Q35, "every layer builds its token mixer"),
    "moe.experts": _r("global", _VLLM_Q3N_RECHECK, "Qwen3NextSparseMoeBlock: "
                      "config.num_experts"),
    "moe.expert_width": _r("global", _VLLM_Q3N_RECHECK, "config.moe_intermediate_size"),
    "moe.top_k": _r("global", _VLLM_Q3N_RECHECK, "config.num_experts_per_tok"),
    "moe.shared_width": _r("global", _VLLM_Q3N_RECHECK, "config."
                           "shared_expert_intermediate_size (sigmoid-gated shared expert)"),
    "moe.noop": _r("none", _VLLM_Q35, "qwen3_5_moe_text: every layer builds "
                   "Qwen3NextSparseMoeBlock (MoE vs dense by model_type, not per layer)"),
    "spans": _r("none", _VLLM_Q35, _SPAN_PAIRS),
}
_GRANITE_VLLM = {
    "deltanet.swap": _r("per_layer", _VLLM_GRANITE, _SWAP_KIND + "layer i is "
                        "ALL_DECODER_LAYER_TYPES[config.layer_types[i]], attention or mamba, "
                        "read layer by layer"),
    "mamba.state_size": _r("global", _VLLM_GRANITE, "GraniteMoeHybridMambaDecoderLayer: "
                           "MambaMixer2(ssm_state_size=config.mamba_d_state); state shape from "
                           "hf_config.mamba_d_state"),
    "mamba.heads": _r("global", _VLLM_GRANITE, "config.mamba_n_heads (head_dim "
                      "config.mamba_d_head) in the mixer and the state shape"),
    "mamba.noop": _r("none", _VLLM_GRANITE, "layer_types[i] must be attention or mamba, and "
                     "every layer builds the MLP"),
    "attention.kv_heads": _r("global", _VLLM_GRANITE, "GraniteMoeHybridAttention: "
                             "config.num_key_value_heads"),
    "attention.sliding_window": _r("global", _VLLM_ATTN, "no per_layer_sliding_window: "
                                   "cache_config.sliding_window on every attention layer"),
    "attention.noop": _r("none", _VLLM_GRANITE, "layer_types[i] must be attention or mamba"),
    "attention.linear": _r("none", _VLLM_GRANITE, "layer_types[i] must be attention or mamba"),
    "moe.experts": _r("global", _VLLM_GRANITE, "GraniteMoeMoE(num_experts="
                      "config.num_local_experts) in every layer (none if 0)"),
    "moe.expert_width": _r("global", _VLLM_GRANITE, "GraniteMoeMoE(intermediate_size="
                           "config.intermediate_size)"),
    "moe.top_k": _r("global", _VLLM_GRANITE, "config.num_experts_per_tok"),
    "moe.shared_width": _r("global", _VLLM_GRANITE, "GraniteMoeSharedMLP(config): "
                           "config.shared_intermediate_size (0: none)"),
    "moe.noop": _r("none", _VLLM_GRANITE, "every layer builds the same MoE (+ shared MLP); "
                   "only num_local_experts = shared_intermediate_size = 0 drops it, in all "
                   "layers"),
    "ffn.width": _r("global", _VLLM_GRANITE, "num_local_experts 0: every layer's MLP is "
                    "GraniteMoeSharedMLP of config.shared_intermediate_size"),
    "ffn.noop": _r("none", _VLLM_GRANITE, "one MLP rule for every layer"),
    "spans": _r("none", _VLLM_GRANITE, _SPAN_PAIRS),
}
_JAMBA_SSM = next(n for n, k in kinds().items() if "jamba" in k.hf_dialects)
"""The registered kind of Jamba's SSM layers (``nas.kinds``: a kind names the HF types
whose configs hold it), whose axes the Jamba rows speak of."""

_JAMBA_VLLM = {
    "deltanet.swap": _r("none", _VLLM_JAMBA, "(mamba <-> attention) layers_block_type is an "
                        "HF JambaConfig property of attn_layer_period/offset, not a per-layer "
                        "list: the parent's placement only"),
    f"{_JAMBA_SSM}.inner_size": _r("global", _VLLM_JAMBA, "MambaMixer(intermediate_size="
                            "config.mamba_expand * config.hidden_size): one width, a multiple "
                            "of hidden_size"),
    f"{_JAMBA_SSM}.state_size": _r("global", _VLLM_JAMBA, "MambaMixer(ssm_state_size="
                            "config.mamba_d_state)"),
    f"{_JAMBA_SSM}.noop": _r("none", _VLLM_JAMBA, "layers_block_type gives attention or mamba per "
                      "layer (from attn_layer_period/offset)"),
    "attention.kv_heads": _r("global", _VLLM_JAMBA, "JambaAttentionDecoderLayer: "
                             "config.num_key_value_heads"),
    "attention.sliding_window": _r("global", _VLLM_ATTN, "no per_layer_sliding_window: "
                                   "cache_config.sliding_window on every attention layer"),
    "attention.noop": _r("none", _VLLM_JAMBA, "every layer is attention or mamba, each with "
                         "an MLP"),
    "moe.experts": _r("global", _VLLM_JAMBA, "JambaMoE: config.num_experts where "
                      "layers_num_experts[i] > 1 (expert_layer_period/offset)"),
    "moe.expert_width": _r("global", _VLLM_JAMBA, "JambaMoE: config.intermediate_size, the "
                           "field the dense JambaMLP reads too: the child must keep "
                           "moe.expert_width == ffn.width"),
    "moe.top_k": _r("global", _VLLM_JAMBA, "config.num_experts_per_tok"),
    "moe.noop": _r("none", _VLLM_JAMBA, "every layer builds JambaMoE or JambaMLP"),
    "ffn.width": _r("global", _VLLM_JAMBA, "JambaMLP of config.intermediate_size: tied to the "
                    "expert width"),
    "ffn.noop": _r("none", _VLLM_JAMBA, "every layer builds JambaMoE or JambaMLP"),
    "spans": _r("none", _VLLM_JAMBA, _SPAN_PAIRS + " (placement by periods/offsets)"),
}
_FH1_VLLM = {
    "parallel.kv_heads": _r("global", _VLLM_FH1, "FalconH1AttentionDecoderLayer: "
                            "config.num_key_value_heads"),
    "parallel.mamba_heads": _r("global", _VLLM_FH1, "FalconH1SSMDecoderLayer: MambaMixer2("
                               "num_heads=config.mamba_n_heads); state shape from hf_config"),
    "parallel.state_size": _r("global", _VLLM_FH1, "MambaMixer2(ssm_state_size="
                              "config.mamba_d_state); state shape from hf_config"),
    "parallel.drop_attention": _r("none", _VLLM_FH1, "every layer builds both branches "
                                  "(always FalconH1ParallelHybrid; attn_layer_indices not "
                                  "read)"),
    "parallel.drop_mamba": _r("none", _VLLM_FH1, "every layer builds both branches"),
    "parallel.noop": _r("none", _VLLM_FH1, "every layer builds both branches and the MLP"),
    "ffn.width": _r("global", _VLLM_FH1, "FalconH1MLP(config): config.intermediate_size"),
    "ffn.noop": _r("none", _VLLM_FH1, "every layer builds FalconH1MLP"),
    "spans": _r("none", _VLLM_FH1, _SPAN_PAIRS),
}

# ---- SGLang --------------------------------------------------------------------------------
_SGL = "sgl-project/sglang"
_SGL_DECI = Source(_SGL, "python/sglang/srt/models/nemotron_nas.py",
                   "65cf1ed0b8b1cec4c51690b3294f3d2367e09ef8")
_SGL_MCFG = Source(_SGL, "python/sglang/srt/configs/model_config.py",
                   "001adf564fd332c285397a46a034ee2f93ba7515")
_SGL_Q2MOE = Source(_SGL, "python/sglang/srt/models/qwen2_moe.py",
                    "0115497da8f2340cdce444597387cf2a4d499f5c")
_SGL_Q3MOE = Source(_SGL, "python/sglang/srt/models/qwen3_moe.py",
                    "e3d8e9aec2c7f120ad4d4c6e7ee08cc19346fdbd")
_SGL_DSV2 = Source(_SGL, "python/sglang/srt/models/deepseek_v2.py",
                   "3e4a39ee73308590c5c753108bdcb8d333f7f1c6")
_SGL_OSS = Source(_SGL, "python/sglang/srt/models/gpt_oss.py",
                  "e9149048adbf1c477cb182ff0826b528d3651103")
_SGL_Q3N = Source(_SGL, "python/sglang/srt/models/qwen3_next.py",
                  "502a21a81e31a8ed8f927aa21d7673ade84572f4")
_SGL_Q3N_CFG = Source(_SGL, "python/sglang/srt/configs/qwen3_next.py",
                      "263bc85d64baa38d82ec20f58a61f2982c78075d")
_SGL_Q35 = Source(_SGL, "python/sglang/srt/models/qwen3_5.py",
                  "cf4465f3a8beb6ce66ed09cfe1c4b4d1fc952f60")
_SGL_Q35_CFG = Source(_SGL, "python/sglang/srt/configs/qwen3_5.py",
                      "0f6f0002e7c307205aa661654ee3e47d01398838")
_SGL_GRANITE = Source(_SGL, "python/sglang/srt/models/granitemoehybrid.py",
                      "b64954e9f9873e19e53bd85a02775807a49bce10")
_SGL_GRANITE_CFG = Source(_SGL, "python/sglang/srt/configs/granitemoehybrid.py",
                          "bd487ef3fe3cec58032d8d002e52b9e0f3b2ce0c")
_SGL_FH1 = Source(_SGL, "python/sglang/srt/models/falcon_h1.py",
                  "e01a0731a55a48f36c418793724414a6c92f71d5")
_SGL_FH1_CFG = Source(_SGL, "python/sglang/srt/configs/falcon_h1.py",
                      "ca03a86f2e7111be616de40d8a457fab3d464b01")
_SGL_JAMBA_PR = Source(_SGL, "python/sglang/srt/models/jamba.py",
                       "091dfb11a5af211fbe04a743a098f21b2105f854")

_DECI_SGL = {
    "attention.kv_heads": _r("global", _SGL_MCFG, "DeciLM layers build num_attention_heads "
                             "// block_configs[layer].attention.n_heads_in_group, but "
                             "ModelConfig.get_total_num_kv_heads raises 'Variable GQA (VGQA) "
                             "is not yet supported' on more than one value"),
    "attention.noop": _r("per_layer", _SGL_DECI, "block_configs[layer].attention.no_op: no "
                         "self_attn built (the KV pool keeps a slot per layer); at 65cf1ed a "
                         "no-op attention in layer 0 reaches post_attention_layernorm(h, None)"),
    "attention.linear": _r("none", _SGL_DECI, "replace_with_linear is not read: full "
                           "LlamaAttention is built and a linear block's weights do not load"),
    "attention.sliding_window": _r("none", _SGL_DECI, "no window in block_configs is read"),
    "ffn.width": _r("per_layer", _SGL_DECI, "LlamaMLP of _ffn_mult_to_intermediate_size("
                    "block_configs[layer].ffn.ffn_mult): 2 * ffn_mult * hidden / 3 rounded up "
                    "to 256; no intermediate_size fallback: multiples of 256", 256),
    "ffn.noop": _r("per_layer", _SGL_DECI, "block_configs[layer].ffn.no_op: no mlp built"),
    "ffn.linear": _r("none", _SGL_DECI, "replace_with_linear is not read"),
    "spans": _r("none", _SGL_DECI, "a DeciLM layer is one attention and one FFN slot"),
}
_MOE_SGL = {
    "attention.kv_heads": _r("global", _SGL_Q2MOE, "Qwen2MoeAttention / Qwen3MoeAttention / "
                             "MixtralAttention: config.num_key_value_heads"),
    "attention.sliding_window": _r("none", _SGL_Q2MOE, "no window passed to RadixAttention in "
                                   "any of the three: every layer full attention"),
    "attention.noop": _r("none", _SGL_Q2MOE, "every layer builds self_attn and its MoE"),
    "attention.linear": _r("none", _SGL_Q2MOE, "every layer builds self_attn and its MoE"),
    "moe.experts": _r("global", _SGL_Q2MOE, "Qwen2MoeSparseMoeBlock / Qwen3MoeSparseMoeBlock: "
                      "config.num_experts; MixtralMoE: config.num_local_experts"),
    "moe.expert_width": _r("global", _SGL_Q2MOE, "config.moe_intermediate_size (mixtral: "
                           "config.intermediate_size)"),
    "moe.top_k": _r("global", _SGL_Q2MOE, "config.num_experts_per_tok"),
    "moe.shared_width": _r("global", _SGL_Q2MOE, "qwen2_moe: shared_expert of "
                           "config.shared_expert_intermediate_size (if > 0); mixtral, "
                           "qwen3_moe have none"),
    "moe.noop": _r("none", _SGL_Q2MOE, "every layer builds a MoE"),
    "ffn.width": _r("none", _SGL_Q3MOE, "'Qwen2MoE/Qwen3MoE all layers are sparse': "
                    "mlp_only_layers / decoder_sparse_step are not read, no dense layer is "
                    "built (a parent with dense layers does not load)"),
    "ffn.noop": _r("none", _SGL_Q2MOE, "no dense layer is built"),
    "spans": _r("none", _SGL_Q2MOE, "num_hidden_layers identical attention + MoE layers"),
}
_DSV3_SGL = {
    "mla.heads": _r("global", _SGL_DSV2, "DeepseekV2AttentionMLA(num_heads="
                    "config.num_attention_heads)"),
    "mla.kv_lora_rank": _r("global", _SGL_DSV2, "config.kv_lora_rank (also the MLA KV pool's "
                           "width)"),
    "mla.q_lora_rank": _r("global", _SGL_DSV2, "config.q_lora_rank (None: no q LoRA)"),
    "mla.noop": _r("none", _SGL_DSV2, "every layer builds self_attn"),
    "moe.experts": _r("global", _SGL_DSV2, "DeepseekV2MoE / MoEGate: config.n_routed_experts"),
    "moe.expert_width": _r("global", _SGL_DSV2, "config.moe_intermediate_size"),
    "moe.top_k": _r("global", _SGL_DSV2, "config.num_experts_per_tok"),
    "moe.shared_width": _r("global", _SGL_DSV2, "shared experts of moe_intermediate_size * "
                           "config.n_shared_experts"),
    "moe.noop": _r("none", _SGL_DSV2, "_is_layer_sparse: first_k_dense_replace / "
                   "moe_layer_freq place MoE vs dense (the parent's placement); no empty MLP"),
    "ffn.width": _r("global", _SGL_DSV2, "DeepseekV2MLP(intermediate_size="
                    "config.intermediate_size) on the dense layers"),
    "ffn.noop": _r("none", _SGL_DSV2, "every layer builds an MLP or MoE"),
    "spans": _r("none", _SGL_DSV2, "num_hidden_layers uniform MLA layers"),
}
_OSS_SGL = {
    "attention.kv_heads": _r("global", _SGL_OSS, "GptOssAttention: config.num_key_value_heads"),
    "attention.sliding_window": _r("none", _SGL_OSS, "layer_types[layer]: sliding_attention "
                                   "gets config.sliding_window - 1, else full; one window "
                                   "length for the model, so no free window per layer: held "
                                   "to the parent's pattern (the reader took it per_layer)"),
    "attention.noop": _r("none", _SGL_OSS, "every layer builds attention and MoE"),
    "moe.experts": _r("global", _SGL_OSS, "GptOssSparseMoeBlock: config.num_local_experts"),
    "moe.expert_width": _r("global", _SGL_OSS, "config.intermediate_size"),
    "moe.top_k": _r("global", _SGL_OSS, "config.num_experts_per_tok"),
    "moe.noop": _r("none", _SGL_OSS, "'Dense MLP is not implemented for GptOssDecoderLayer': "
                   "every layer a MoE"),
    "spans": _r("none", _SGL_OSS, "num_hidden_layers uniform layers"),
}
_Q3N_SGL = {
    "deltanet.swap": _r("none", _SGL_Q3N_CFG, "SGLang's Qwen3NextConfig.layers_block_type: "
                        "attention iff (l + 1) % full_attention_interval == 0; __init__ drops "
                        "layer_types (unlike vLLM): the parent's pattern only"),
    "deltanet.v_heads": _r("global", _SGL_Q3N, "Qwen3GatedDeltaNet: "
                           "config.linear_num_value_heads (and mamba2_cache_params)"),
    "deltanet.k_heads": _r("global", _SGL_Q3N, "config.linear_num_key_heads"),
    "deltanet.noop": _r("none", _SGL_Q3N, "every layer is attention or linear_attention"),
    "attention.kv_heads": _r("global", _SGL_Q3N, "Qwen3HybridAttentionDecoderLayer: "
                             "config.num_key_value_heads"),
    "attention.sliding_window": _r("none", _SGL_Q3N, "no window passed to RadixAttention"),
    "attention.noop": _r("none", _SGL_Q3N, "every layer builds its token mixer"),
    "moe.experts": _r("global", _SGL_Q3N, "Qwen2MoeSparseMoeBlock: config.num_experts"),
    "moe.expert_width": _r("global", _SGL_Q3N, "config.moe_intermediate_size"),
    "moe.top_k": _r("global", _SGL_Q3N, "config.num_experts_per_tok"),
    "moe.shared_width": _r("global", _SGL_Q3N, "config.shared_expert_intermediate_size"),
    "moe.noop": _r("none", _SGL_Q3N, "'Qwen3Next all layers are sparse': every layer a MoE"),
    "ffn.width": _r("none", _SGL_Q3N, "the dense branch is never taken; mlp_only_layers not "
                    "read"),
    "spans": _r("none", _SGL_Q3N, "layer kinds fixed by full_attention_interval"),
}
_Q35_SGL = {
    "deltanet.swap": _r("none", _SGL_Q35_CFG, "get_layer: config.layers_block_type[idx], a "
                        "Qwen3NextConfig property of full_attention_interval (layer_types "
                        "dropped): the parent's pattern only"),
    "deltanet.v_heads": _r("global", _SGL_Q35, "Qwen3_5GatedDeltaNet: "
                           "config.linear_num_value_heads"),
    "deltanet.k_heads": _r("global", _SGL_Q35, "config.linear_num_key_heads"),
    "deltanet.noop": _r("none", _SGL_Q35, "every layer is attention or linear_attention"),
    "attention.kv_heads": _r("global", _SGL_Q35, "Qwen3_5AttentionDecoderLayer: "
                             "config.num_key_value_heads"),
    "attention.sliding_window": _r("none", _SGL_Q35, "no window passed to RadixAttention"),
    "attention.noop": _r("none", _SGL_Q35, "every layer builds its token mixer"),
    "moe.experts": _r("global", _SGL_Q35, "Qwen2MoeSparseMoeBlock(config): config.num_experts"),
    "moe.expert_width": _r("global", _SGL_Q35, "config.moe_intermediate_size"),
    "moe.top_k": _r("global", _SGL_Q35, "config.num_experts_per_tok"),
    "moe.shared_width": _r("global", _SGL_Q35, "config.shared_expert_intermediate_size"),
    "moe.noop": _r("none", _SGL_Q35, "qwen3_5_moe_text: every layer Qwen2MoeSparseMoeBlock"),
    "spans": _r("none", _SGL_Q35, "layer kinds fixed by full_attention_interval"),
}
_GRANITE_SGL = {
    "deltanet.swap": _r("per_layer", _SGL_GRANITE_CFG, _SWAP_KIND + "get_layer: "
                        "ALL_DECODER_LAYER_TYPES[config.layer_types[layer]]; the Mamba / "
                        "attention layer ids follow the same list"),
    "mamba.state_size": _r("global", _SGL_GRANITE, "MambaMixer2(cache_params="
                           "config.mamba2_cache_params): mamba_d_state"),
    "mamba.heads": _r("global", _SGL_GRANITE, "mamba2_cache_params: mamba_n_heads "
                      "(mamba_d_head * mamba_n_heads must equal mamba_expand * hidden)"),
    "mamba.noop": _r("none", _SGL_GRANITE, "layer_types holds only mamba / attention"),
    "attention.kv_heads": _r("global", _SGL_GRANITE, "GraniteMoeHybridAttention: "
                             "config.num_key_value_heads"),
    "attention.sliding_window": _r("none", _SGL_GRANITE, "no window passed to RadixAttention"),
    "attention.noop": _r("none", _SGL_GRANITE, "layer_types holds only mamba / attention"),
    "moe.experts": _r("global", _SGL_GRANITE, "GraniteMoeMoE: config.num_local_experts (0: no "
                      "MoE, model-wide)"),
    "moe.expert_width": _r("global", _SGL_GRANITE, "config.intermediate_size"),
    "moe.top_k": _r("global", _SGL_GRANITE, "config.num_experts_per_tok"),
    "moe.shared_width": _r("global", _SGL_GRANITE, "GraniteMoeSharedMLP: "
                           "config.shared_intermediate_size"),
    "moe.noop": _r("none", _SGL_GRANITE, "MoE / shared MLP presence decided once for the "
                   "model"),
    "ffn.width": _r("global", _SGL_GRANITE, "a dense model (no experts): shared_mlp of "
                    "config.shared_intermediate_size"),
    "spans": _r("none", _SGL_GRANITE, "each layer is one mixer and one MoE slot: only whole "
                "pairs could be dropped (not verified)"),
}
_FH1_SGL = {
    "parallel.kv_heads": _r("global", _SGL_FH1, "FalconH1HybridAttentionDecoderLayer: "
                            "config.num_key_value_heads"),
    "parallel.mamba_heads": _r("global", _SGL_FH1, "MambaMixer2(cache_params="
                               "config.mamba2_cache_params): mamba_n_heads"),
    "parallel.state_size": _r("global", _SGL_FH1, "mamba2_cache_params: mamba_d_state"),
    "parallel.drop_attention": _r("none", _SGL_FH1_CFG, "every layer builds attention "
                                  "(full_attention_layer_ids = all layers)"),
    "parallel.drop_mamba": _r("none", _SGL_FH1_CFG, "every layer builds the Mamba mixer "
                              "(linear_layer_ids = all layers)"),
    "parallel.noop": _r("none", _SGL_FH1_CFG, "layers_block_type is 'falcon_h1' for every "
                        "layer"),
    "ffn.width": _r("global", _SGL_FH1, "FalconH1MLP(intermediate_size="
                    "config.intermediate_size)"),
    "ffn.noop": _r("none", _SGL_FH1, "every layer builds feed_forward"),
    "spans": _r("none", _SGL_FH1, "num_hidden_layers identical layers"),
}

# ---- TensorRT-LLM (PyTorch backend) --------------------------------------------------------
_TRT = "NVIDIA/TensorRT-LLM"
_TRT_ARCH = Source(_TRT, "tensorrt_llm/_torch/models/_arch_index.py",
                   "065ff9e93780bc0bdbfdbc7156a306ca14f5850c")
_TRT_MIXTRAL = Source(_TRT, "tensorrt_llm/_torch/models/modeling_mixtral.py",
                      "b35ac1b64368513d215c57d2ed01d62d910df8da")
_TRT_QMOE = Source(_TRT, "tensorrt_llm/_torch/models/modeling_qwen_moe.py",
                   "6a5351c32cc7710a7076440764beef6c616b78ae")
_TRT_Q3MOE = Source(_TRT, "tensorrt_llm/_torch/models/modeling_qwen3_moe.py",
                    "a678b91aafbeff265cd0b764abb59d7def624ac2")
_TRT_DSV3 = Source(_TRT, "tensorrt_llm/_torch/models/modeling_deepseekv3.py",
                   "a43cf9e363d5657061b5ce0e12f3d993a08d8158")
_TRT_OSS = Source(_TRT, "tensorrt_llm/_torch/models/modeling_gpt_oss.py",
                  "7924c7f1d3b4a3286b62c13fc890900295dc39cb")
_TRT_Q3N = Source(_TRT, "tensorrt_llm/_torch/models/modeling_qwen3_next.py",
                  "b93e14ca093e446615f3009cae6ca5a33c4f2f56")
_TRT_Q3N_NEW = Source("tongyuantongyu/TensorRT-LLM",  # a fork: NVIDIA's stored copy is older
                      "tensorrt_llm/_torch/models/modeling_qwen3_next.py",
                      "7e212151af2dd260b463a80d3167ec02708783b4")
_TRT_Q35 = Source(_TRT, "tensorrt_llm/_torch/models/modeling_qwen3_5.py",
                  "2478158cfbcc84d8d74af859a47e1311c2da98a8")

_MOE_TRT = {
    "attention.kv_heads": _r("global", _TRT_MIXTRAL, "MixtralAttention: num_key_value_heads="
                             "config.num_key_value_heads (QwenMoeAttention, Qwen3Attention "
                             "the same)"),
    "attention.sliding_window": _r("none", _TRT_MIXTRAL, "no attention_window_size passed; "
                                   "config.sliding_window not read (only the runtime "
                                   "KvCacheConfig.max_attention_window)"),
    "attention.noop": _r("none", _TRT_MIXTRAL, "every layer builds attention and an MoE"),
    "attention.linear": _r("none", _TRT_MIXTRAL, "every layer builds attention and an MoE"),
    "moe.experts": _r("global", _TRT_MIXTRAL, "MixtralMoE: config.num_local_experts (QwenMoE, "
                      "Qwen3MoE: config.num_experts)"),
    "moe.expert_width": _r("global", _TRT_MIXTRAL, "MixtralMoE: config.intermediate_size; "
                           "QwenMoE / Qwen3MoE: config.moe_intermediate_size"),
    "moe.top_k": _r("global", _TRT_MIXTRAL, "config.num_experts_per_tok"),
    "moe.shared_width": _r("global", _TRT_QMOE, "QwenMoE: shared_expert GatedMLP of "
                           "config.shared_expert_intermediate_size (Mixtral, Qwen3-MoE: none)"),
    "moe.noop": _r("none", _TRT_MIXTRAL, "every layer builds an MoE"),
    "ffn.width": _r("none", _TRT_Q3MOE, "Qwen3MoEDecoderLayer / QwenMoeDecoderLayer build the "
                    "MoE on every layer: mlp_only_layers / decoder_sparse_step are not read, no "
                    "dense MLP (a parent with dense layers does not load)"),
    "ffn.noop": _r("none", _TRT_MIXTRAL, "no dense MLP layers are built"),
    "spans": _r("none", _TRT_MIXTRAL, _SPAN_PAIRS),
}
_DSV3_TRT = {
    "mla.heads": _r("global", _TRT_DSV3, "DeepseekV3Attention (MLA): num_attention_heads="
                    "config.num_attention_heads"),
    "mla.kv_lora_rank": _r("global", _TRT_DSV3, "MLA: kv_lora_rank=config.kv_lora_rank"),
    "mla.q_lora_rank": _r("global", _TRT_DSV3, "MLA: q_lora_rank=config.q_lora_rank"),
    "mla.noop": _r("none", _TRT_DSV3, "every DeepseekV3DecoderLayer builds "
                   "DeepseekV3Attention"),
    "moe.experts": _r("global", _TRT_DSV3, "Deepseekv3MoE(num_experts=config.n_routed_experts)"),
    "moe.expert_width": _r("global", _TRT_DSV3, "intermediate_size=config.moe_intermediate_size"),
    "moe.top_k": _r("global", _TRT_DSV3, "top_k=config.num_experts_per_tok (DeepseekV3Gate, "
                    "n_group / topk_group from the model config)"),
    "moe.shared_width": _r("global", _TRT_DSV3, "shared GatedMLP of "
                           "config.moe_intermediate_size * config.n_shared_experts"),
    "moe.noop": _r("none", _TRT_DSV3, "MoE where layer_idx >= first_k_dense_replace and "
                   "layer_idx % moe_layer_freq == 0, else GatedMLP: the parent's placement, "
                   "no empty MLP"),
    "ffn.width": _r("global", _TRT_DSV3, "dense layers: GatedMLP(intermediate_size="
                    "config.intermediate_size)"),
    "ffn.noop": _r("none", _TRT_DSV3, "every layer builds a GatedMLP or an MoE"),
    "spans": _r("none", _TRT_DSV3, _SPAN_PAIRS),
    "precision": _r("none", _TRT_DSV3, "DeepseekV3DecoderLayer asserts quant_algo is not "
                    "MIXED_PRECISION; only exclude_modules and quant_config_dict for "
                    "model.layers.{i}.mlp.experts are read"),
}
_OSS_TRT = {
    "attention.kv_heads": _r("global", _TRT_OSS, "AttentionBlock: num_key_value_heads="
                             "pretrained_config.num_key_value_heads"),
    "attention.sliding_window": _r("none", _TRT_OSS, "AttentionBlock: config.sliding_window if "
                                   "layer_idx % 2 == 0 else None: the parent's alternation, "
                                   "fixed by layer index (layer_types not read)"),
    "attention.noop": _r("none", _TRT_OSS, "every layer builds attention and MoE"),
    "moe.experts": _r("global", _TRT_OSS, "MLPBlock: num_experts="
                      "pretrained_config.num_local_experts"),
    "moe.expert_width": _r("global", _TRT_OSS, "MLPBlock: intermediate_size="
                           "pretrained_config.intermediate_size"),
    "moe.top_k": _r("global", _TRT_OSS, "RenormalizeMoeRoutingMethod(top_k="
                    "config.num_experts_per_tok)"),
    "moe.noop": _r("none", _TRT_OSS, "every layer builds attention and MoE"),
    "spans": _r("none", _TRT_OSS, _SPAN_PAIRS),
}
_Q3N_TRT = {
    "deltanet.swap": _r("per_layer", _TRT_Q3N, "Qwen3NextModel builds each layer from "
                        "config.layer_types[i] (full_attention or linear_attention); the hybrid "
                        "cache masks come from the same list"),
    "deltanet.v_heads": _r("global", _TRT_Q3N, "Qwen3NextGatedDeltaNet: num_v_heads="
                           "config.linear_num_value_heads"),
    "deltanet.k_heads": _r("global", _TRT_Q3N, "Qwen3NextGatedDeltaNet: num_k_heads="
                           "config.linear_num_key_heads"),
    "deltanet.noop": _r("none", _TRT_Q3N, "a layer type other than the two is a KeyError in "
                        "ALL_DECODER_LAYER_TYPES"),
    "attention.kv_heads": _r("global", _TRT_Q3N, "Qwen3NextAttention(Qwen3Attention): "
                             "config.num_key_value_heads"),
    "attention.noop": _r("none", _TRT_Q3N, "every layer builds its token mixer"),
    "moe.experts": _r("global", _TRT_Q3N, "Qwen3NextSparseMoeBlock: config.num_experts"),
    "moe.expert_width": _r("global", _TRT_Q3N, "config.moe_intermediate_size"),
    "moe.top_k": _r("global", _TRT_Q3N, "config.num_experts_per_tok"),
    "moe.shared_width": _r("global", _TRT_Q3N, "shared_expert GatedMLP of "
                           "config.shared_expert_intermediate_size"),
    "moe.noop": _r("none", _TRT_Q3N, "every layer builds the MoE block"),
    "ffn.width": _r("none", _TRT_Q3N_NEW, "mlp_only_layers / decoder_sparse_step not read: "
                    "every layer MoE (_create_mlp: all-dense GatedMLP only when num_experts "
                    "== 0)"),
    "spans": _r("none", _TRT_Q3N, _SPAN_PAIRS),
}
_Q35_TRT = {
    "deltanet.swap": _r("per_layer", _TRT_Q3N_NEW, "Qwen3NextModel: layer_types = "
                        "get_qwen3_hybrid_layer_types(config) (an explicit list, validated; "
                        "else full_attention_interval) -> a layer class per layer"),
    "deltanet.v_heads": _r("global", _TRT_Q3N_NEW, "Qwen3NextGatedDeltaNet: "
                           "config.linear_num_value_heads"),
    "deltanet.k_heads": _r("global", _TRT_Q3N_NEW, "Qwen3NextGatedDeltaNet: "
                           "config.linear_num_key_heads"),
    "deltanet.noop": _r("none", _TRT_Q3N_NEW, "layer_types other than full_attention / "
                        "linear_attention raise"),
    "attention.kv_heads": _r("global", _TRT_Q3N_NEW, "Qwen3NextAttention: "
                             "config.num_key_value_heads"),
    "attention.noop": _r("none", _TRT_Q3N_NEW, "every layer builds its token mixer"),
    "moe.experts": _r("global", _TRT_Q3N_NEW, "Qwen3NextSparseMoeBlock: config.num_experts"),
    "moe.expert_width": _r("global", _TRT_Q3N_NEW, "config.moe_intermediate_size"),
    "moe.top_k": _r("global", _TRT_Q3N_NEW, "config.num_experts_per_tok"),
    "moe.shared_width": _r("global", _TRT_Q3N_NEW, "config.shared_expert_intermediate_size"),
    "moe.noop": _r("none", _TRT_Q3N_NEW, "_create_mlp: MoE on every layer when num_experts > "
                   "0"),
    "spans": _r("none", _TRT_Q35, _SPAN_PAIRS),
}

# ---- stock Hugging Face transformers -------------------------------------------------------
_HF = "huggingface/transformers"
_HF_LLAMA = Source(_HF, "src/transformers/models/llama/modeling_llama.py",
                   "5dd4a63548857797727ae73eeb6a6e886ea02a3e")
_HF_QWEN2 = Source(_HF, "src/transformers/models/qwen2/modeling_qwen2.py",
                   "63bb723747035466e5339aea864b133f709b067d")
_HF_MIXTRAL = Source(_HF, "src/transformers/models/mixtral/modeling_mixtral.py",
                     "af3efdd71ee5b568dfdb71bb41d316df830147af")
_HF_Q2MOE = Source(_HF, "src/transformers/models/qwen2_moe/modeling_qwen2_moe.py",
                   "1c351314a42ac9aef3510fc536c18130d52be2ef")
_HF_Q3MOE = Source(_HF, "src/transformers/models/qwen3_moe/modeling_qwen3_moe.py",
                   "16b6c53c8ec3a720bd45c1c377bf94e1d01249c5")
_HF_DSV3 = Source(_HF, "src/transformers/models/deepseek_v3/modeling_deepseek_v3.py",
                  "f5a9ec512fa9fe69e51ea0c6388c68d50de567b3")
_HF_OSS = Source(_HF, "src/transformers/models/gpt_oss/modeling_gpt_oss.py",
                 "6edf5b311854175ff83c59179b3360beca1ceffc")
_HF_Q3N = Source(_HF, "src/transformers/models/qwen3_next/modeling_qwen3_next.py",
                 "7515843b617551b008901620ca58f1208bbc330d")
_HF_Q35 = Source(_HF, "src/transformers/models/qwen3_5_moe/modeling_qwen3_5_moe.py",
                 "5fd974ea3af798c79b3b70d2fd9e52fb58869894")
_HF_GRANITE = Source(_HF, "src/transformers/models/granitemoehybrid/"
                     "modeling_granitemoehybrid.py", "1c0ff25f4cc9d0e13e0bd848a43a964a8ae1ba8e")
_HF_JAMBA = Source(_HF, "src/transformers/models/jamba/modeling_jamba.py",
                   "97bb61d0788015770945004a7db6285db68081c0")
_HF_FH1 = Source(_HF, "src/transformers/models/falcon_h1/modeling_falcon_h1.py",
                 "68c08116ff67bbc0b9a72179d72da9dc2355a4dc")

_LLAMA_HF = {
    "attention.kv_heads": _r("global", _HF_LLAMA, "LlamaAttention: k/v_proj of "
                             "config.num_key_value_heads * head_dim"),
    "attention.sliding_window": _r("none", _HF_QWEN2, "llama: no window; mistral: one "
                                   "config.sliding_window for all layers; qwen2 / qwen3: "
                                   "layer_types[i] picks full or the one window (a per-layer "
                                   "toggle, one size)"),
    "attention.noop": _r("none", _HF_LLAMA, "every decoder layer builds self_attn and mlp"),
    "attention.linear": _r("none", _HF_LLAMA, "every decoder layer builds self_attn and mlp"),
    "ffn.width": _r("global", _HF_LLAMA, "LlamaMLP: config.intermediate_size (one int, no "
                    "per-layer list)"),
    "ffn.noop": _r("none", _HF_LLAMA, "every decoder layer builds self_attn and mlp"),
    "ffn.linear": _r("none", _HF_LLAMA, "every decoder layer builds self_attn and mlp"),
    "spans": _r("none", _HF_LLAMA, _SPAN_PAIRS),
}
_MOE_HF = {
    "attention.kv_heads": _r("global", _HF_MIXTRAL, "MixtralAttention: "
                             "config.num_key_value_heads"),
    "attention.sliding_window": _r("global", _HF_MIXTRAL, "mixtral, qwen3_moe: "
                                   "config.sliding_window on every layer; qwen2_moe: "
                                   "use_sliding_window + max_window_layers with the one window"),
    "attention.noop": _r("none", _HF_MIXTRAL, "every decoder layer builds self_attn and an "
                         "MLP / MoE"),
    "attention.linear": _r("none", _HF_MIXTRAL, "every decoder layer builds self_attn and an "
                           "MLP / MoE"),
    "moe.experts": _r("global", _HF_MIXTRAL, "MixtralExperts: config.num_local_experts "
                      "(Qwen*Moe: config.num_experts)"),
    "moe.expert_width": _r("global", _HF_MIXTRAL, "MixtralExperts: config.intermediate_size "
                           "(Qwen*Moe: config.moe_intermediate_size)"),
    "moe.top_k": _r("global", _HF_MIXTRAL, "router top_k = config.num_experts_per_tok"),
    "moe.shared_width": _r("global", _HF_Q2MOE, "Qwen2MoeSparseMoeBlock: shared_expert of "
                           "config.shared_expert_intermediate_size (mixtral, qwen3_moe: none)"),
    "moe.noop": _r("none", _HF_MIXTRAL, "each layer builds an MoE or (mlp_only_layers) a "
                   "dense MLP"),
    "ffn.width": _r("global", _HF_Q3MOE, "Qwen3MoeDecoderLayer: layers in mlp_only_layers "
                    "(read per layer) or off decoder_sparse_step build "
                    "Qwen3MoeMLP(config.intermediate_size): one width"),
    "ffn.noop": _r("none", _HF_MIXTRAL, "each layer builds an MoE or a dense MLP"),
    "spans": _r("none", _HF_MIXTRAL, _SPAN_PAIRS),
}
_DSV3_HF = {
    "mla.heads": _r("global", _HF_DSV3, "DeepseekV3Attention: config.num_attention_heads"),
    "mla.kv_lora_rank": _r("global", _HF_DSV3, "DeepseekV3Attention: config.kv_lora_rank"),
    "mla.q_lora_rank": _r("global", _HF_DSV3, "DeepseekV3Attention: config.q_lora_rank"),
    "mla.noop": _r("none", _HF_DSV3, "every decoder layer builds self_attn"),
    "moe.experts": _r("global", _HF_DSV3, "DeepseekV3MoE: config.n_routed_experts"),
    "moe.expert_width": _r("global", _HF_DSV3, "config.moe_intermediate_size"),
    "moe.top_k": _r("global", _HF_DSV3, "DeepseekV3TopkRouter: config.num_experts_per_tok"),
    "moe.shared_width": _r("global", _HF_DSV3, "shared_experts: config.moe_intermediate_size "
                           "* config.n_shared_experts"),
    "moe.noop": _r("none", _HF_DSV3, "MoE where layer_idx >= config.first_k_dense_replace, "
                   "else DeepseekV3MLP (moe_layer_freq not read): the parent's placement"),
    "ffn.width": _r("global", _HF_DSV3, "DeepseekV3MLP: config.intermediate_size"),
    "ffn.noop": _r("none", _HF_DSV3, "every layer builds an MLP or an MoE"),
    "spans": _r("none", _HF_DSV3, _SPAN_PAIRS),
}
_OSS_HF = {
    "attention.kv_heads": _r("global", _HF_OSS, "GptOssAttention: config.num_key_value_heads"),
    "attention.sliding_window": _r("none", _HF_OSS, _WINDOW_TOGGLE),
    "attention.noop": _r("none", _HF_OSS, "every layer builds attention and MoE"),
    "moe.experts": _r("global", _HF_OSS, "GptOssExperts: config.num_local_experts"),
    "moe.expert_width": _r("global", _HF_OSS, "GptOssExperts: config.intermediate_size"),
    "moe.top_k": _r("global", _HF_OSS, "GptOssTopKRouter: config.num_experts_per_tok"),
    "moe.noop": _r("none", _HF_OSS, "every layer builds attention and MoE"),
    "spans": _r("none", _HF_OSS, _SPAN_PAIRS),
}
_Q3N_HF = {
    "deltanet.swap": _r("per_layer", _HF_Q3N, "Qwen3NextDecoderLayer: "
                        "config.layer_types[layer_idx]: linear_attention -> GatedDeltaNet, "
                        "full_attention -> attention"),
    "deltanet.v_heads": _r("global", _HF_Q3N, "Qwen3NextGatedDeltaNet: "
                           "config.linear_num_value_heads"),
    "deltanet.k_heads": _r("global", _HF_Q3N, "Qwen3NextGatedDeltaNet: "
                           "config.linear_num_key_heads"),
    "deltanet.noop": _r("none", _HF_Q3N, "a layer type other than the two builds no mixer but "
                        "still adds the normed input: no no-op"),
    "attention.kv_heads": _r("global", _HF_Q3N, "Qwen3NextAttention: "
                             "config.num_key_value_heads"),
    "attention.noop": _r("none", _HF_Q3N, "every layer builds its token mixer"),
    "moe.experts": _r("global", _HF_Q3N, "Qwen3NextSparseMoeBlock: config.num_experts"),
    "moe.expert_width": _r("global", _HF_Q3N, "config.moe_intermediate_size"),
    "moe.top_k": _r("global", _HF_Q3N, "config.num_experts_per_tok"),
    "moe.shared_width": _r("global", _HF_Q3N, "shared_expert: "
                           "config.shared_expert_intermediate_size"),
    "moe.noop": _r("none", _HF_Q3N, "every layer builds an MoE or a dense MLP"),
    "ffn.width": _r("global", _HF_Q3N, "layers in mlp_only_layers: "
                    "Qwen3NextMLP(config.intermediate_size)"),
    "spans": _r("none", _HF_Q3N, _SPAN_PAIRS),
}
_Q35_HF = {
    "deltanet.swap": _r("per_layer", _HF_Q35, "Qwen3_5MoeDecoderLayer: "
                        "config.layer_types[layer_idx] picks Qwen3_5MoeGatedDeltaNet or "
                        "Qwen3_5MoeAttention"),
    "deltanet.v_heads": _r("global", _HF_Q35, "Qwen3_5MoeGatedDeltaNet: "
                           "config.linear_num_value_heads"),
    "deltanet.k_heads": _r("global", _HF_Q35, "Qwen3_5MoeGatedDeltaNet: "
                           "config.linear_num_key_heads"),
    "deltanet.noop": _r("none", _HF_Q35, "any other layer type builds no mixer but still adds "
                        "the normed input"),
    "attention.kv_heads": _r("global", _HF_Q35, "Qwen3_5MoeAttention: "
                             "config.num_key_value_heads"),
    "attention.noop": _r("none", _HF_Q35, "every layer builds its token mixer"),
    "moe.experts": _r("global", _HF_Q35, "Qwen3_5MoeExperts: config.num_experts"),
    "moe.expert_width": _r("global", _HF_Q35, "config.moe_intermediate_size"),
    "moe.top_k": _r("global", _HF_Q35, "Qwen3_5MoeTopKRouter: config.num_experts_per_tok"),
    "moe.shared_width": _r("global", _HF_Q35, "shared_expert: "
                           "config.shared_expert_intermediate_size"),
    "moe.noop": _r("none", _HF_Q35, "every layer builds Qwen3_5MoeSparseMoeBlock (no "
                   "mlp_only_layers)"),
    "spans": _r("none", _HF_Q35, _SPAN_PAIRS),
}
_GRANITE_HF = {
    "deltanet.swap": _r("per_layer", _HF_GRANITE, _SWAP_KIND + "layer_types / "
                        "layers_block_type[i] picks Mamba or attention per layer"),
    "mamba.state_size": _r("global", _HF_GRANITE, "GraniteMoeHybridMambaLayer: "
                           "config.mamba_d_state"),
    "mamba.heads": _r("global", _HF_GRANITE, "GraniteMoeHybridMambaLayer: config.mamba_n_heads "
                      "(one mamba_d_head)"),
    "mamba.noop": _r("none", _HF_GRANITE, "each layer builds a Mamba or an attention mixer"),
    "attention.kv_heads": _r("global", _HF_GRANITE, "GraniteMoeHybridAttention: "
                             "config.num_key_value_heads"),
    "attention.noop": _r("none", _HF_GRANITE, "each layer builds a Mamba or an attention "
                         "mixer"),
    "moe.experts": _r("global", _HF_GRANITE, "GraniteMoeHybridMoE: config.num_local_experts"),
    "moe.expert_width": _r("global", _HF_GRANITE, "GraniteMoeHybridMoE: "
                           "config.intermediate_size"),
    "moe.top_k": _r("global", _HF_GRANITE, "GraniteMoeHybridTopKGating: "
                    "config.num_experts_per_tok"),
    "moe.shared_width": _r("global", _HF_GRANITE, "GraniteMoeHybridMLP (shared_mlp, every "
                           "layer): config.shared_intermediate_size"),
    "moe.noop": _r("none", _HF_GRANITE, "every layer builds shared_mlp (and the MoE when "
                   "num_local_experts > 0)"),
    "ffn.width": _r("global", _HF_GRANITE, "num_local_experts == 0: only shared_mlp, "
                    "config.shared_intermediate_size (the field of moe.shared_width)"),
    "spans": _r("none", _HF_GRANITE, _SPAN_PAIRS),
}
_JAMBA_HF = {
    "deltanet.swap": _r("none", _HF_JAMBA, "(mamba <-> attention) layers_block_type is a "
                        "property of attn_layer_period/offset, not a per-layer list: the "
                        "parent's placement only"),
    f"{_JAMBA_SSM}.inner_size": _r("global", _HF_JAMBA, "JambaMambaMixer: intermediate_size = "
                            "config.mamba_expand * hidden_size"),
    f"{_JAMBA_SSM}.state_size": _r("global", _HF_JAMBA, "JambaMambaMixer: config.mamba_d_state"),
    f"{_JAMBA_SSM}.noop": _r("none", _HF_JAMBA, "ALL_DECODER_LAYER_TYPES[layers_block_type[i]]: "
                      "attention or mamba only, by the period rule"),
    "attention.kv_heads": _r("global", _HF_JAMBA, "JambaAttention: config.num_key_value_heads"),
    "attention.noop": _r("none", _HF_JAMBA, "attention layers by i % attn_layer_period == "
                         "attn_layer_offset only"),
    "moe.experts": _r("global", _HF_JAMBA, "JambaSparseMoeBlock: config.num_experts where "
                      "layers_num_experts[i] > 1"),
    "moe.expert_width": _r("global", _HF_JAMBA, "JambaMLP experts: config.intermediate_size "
                           "(the dense width too)"),
    "moe.top_k": _r("global", _HF_JAMBA, "config.num_experts_per_tok"),
    "moe.noop": _r("none", _HF_JAMBA, "each layer builds a JambaSparseMoeBlock or a JambaMLP"),
    "ffn.width": _r("global", _HF_JAMBA, "JambaMLP: config.intermediate_size, the field of "
                    "the expert width (dense and expert widths are tied)"),
    "ffn.noop": _r("none", _HF_JAMBA, "each layer builds a JambaSparseMoeBlock or a JambaMLP"),
    "spans": _r("none", _HF_JAMBA, _SPAN_PAIRS + " (placement by periods/offsets)"),
}
_FH1_HF = {
    "parallel.kv_heads": _r("global", _HF_FH1, "FalconH1Attention: config.num_key_value_heads"),
    "parallel.mamba_heads": _r("global", _HF_FH1, "FalconH1Mixer: config.mamba_n_heads"),
    "parallel.state_size": _r("global", _HF_FH1, "FalconH1Mixer: config.mamba_d_state"),
    "parallel.drop_attention": _r("none", _HF_FH1, "every layer builds both branches"),
    "parallel.drop_mamba": _r("none", _HF_FH1, "every layer builds both branches"),
    "parallel.noop": _r("none", _HF_FH1, "every layer builds both branches"),
    "ffn.width": _r("global", _HF_FH1, "FalconH1MLP: config.intermediate_size"),
    "ffn.noop": _r("none", _HF_FH1, "every layer builds feed_forward"),
    "spans": _r("none", _HF_FH1, _SPAN_PAIRS),
}


def _family(family: str, engine: str, serves: bool, types: Sequence[str],
            rows: dict[str, Row] | None = None, note: str = "",
            source: Source | None = None, unread: bool = False) -> EngineFamily:
    return EngineFamily(engine, family, serves, tuple(types), rows or {}, note, source, unread)


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


_LLAMA = ("llama", "mistral", "qwen2", "qwen3")
_MOE = ("mixtral", "qwen2_moe", "qwen3_moe")
_DSV3 = ("deepseek_v3", "kimi_k2")
_Q35 = ("qwen3_5_moe_text", "qwen3_5_moe")
_PUZZLE = "; the project's *_puzzle types of this family are read by no engine"

# nemotron_h
_add(_family("nemotron_h", "vllm", True, ("nemotron_h", "nemotron_h_puzzle"), _NH_VLLM,
             "NemotronHForCausalLM; nemotron_h_puzzle's per-layer configs through "
             "get_nemotron_h_config_for_layer", _VLLM_NH))
_add(_family("nemotron_h", "trtllm", True, ("nemotron_h", "nemotron_h_puzzle"), _NH_TRT,
             "NemotronHForCausalLM; per-layer MoE shapes from block_configs", _TRT_NH))
_add(_family("nemotron_h", "sglang", True, ("nemotron_h", "nemotron_h_puzzle"), _NH_SGL,
             "per-layer configs through get_nemotron_h_config_for_layer", _SGL_NH))
_NH_HF = {
    "moe.experts": _r("global", _HF_NH, "NemotronHExperts(config): config.n_routed_experts"),
    "moe.expert_width": _r("global", _HF_NH, "NemotronHExperts: config.moe_intermediate_size"),
    "ffn.width": _r("global", _HF_NH, "NemotronHMLP: intermediate_size or "
                    "config.intermediate_size"),
}
_add(_family("nemotron_h", "transformers", True, ("nemotron_h",), _NH_HF,
             "the stock NemotronH classes (no nemotron_h_puzzle class; a heterogeneous "
             "child loads through trust_remote_code, which this table does not cover)", _HF_NH,
             unread=True))

# llama (a heterogeneous child is written as DeciLM, nemotron-nas)
_add(_family("llama", "vllm", True, (*_LLAMA, "nemotron-nas"), _DECI_VLLM,
             "a heterogeneous child is written as DeciLM (nemotron-nas), which "
             "DeciLMForCausalLM loads", _VLLM_DECI))
_add(_family("llama", "trtllm", True, (*_LLAMA, "nemotron-nas"), _DECI_TRT,
             "a heterogeneous child is written as DeciLM (nemotron-nas), which "
             "NemotronNASForCausalLM (registered for DeciLMForCausalLM) loads", _TRT_DECI))
_add(_family("llama", "sglang", True, (*_LLAMA, "nemotron-nas"), _DECI_SGL,
             "stock Llama / Mistral / Qwen2 / Qwen3ForCausalLM (one value per field); a "
             "heterogeneous child as DeciLM: DeciLMForCausalLM reads "
             "config.block_configs[layer], but SGLang's ModelConfig refuses per-layer KV "
             "heads", _SGL_DECI))
_add(_family("llama", "transformers", True, _LLAMA, _LLAMA_HF,
             "LlamaForCausalLM / MistralForCausalLM / Qwen2ForCausalLM / Qwen3ForCausalLM; no "
             "DeciLM class (nemotron-nas is no auto type: trust_remote_code only)", _HF_LLAMA))

# moe (mixtral, qwen2_moe, qwen3_moe)
_add(_family("moe", "vllm", True, _MOE, _MOE_VLLM,
             "MixtralForCausalLM, Qwen2MoeForCausalLM, Qwen3MoeForCausalLM; every layer from "
             "the one model config (Qwen: mlp_only_layers picks dense layers)", _VLLM_Q3MOE))
_add(_family("moe", "trtllm", True, _MOE, _MOE_TRT,
             "MixtralForCausalLM / Qwen2MoeForCausalLM / Qwen3MoeForCausalLM; attention + MoE "
             "on every layer, mlp_only_layers not read", _TRT_MIXTRAL))
_add(_family("moe", "sglang", True, _MOE, _MOE_SGL,
             "MixtralForCausalLM, Qwen2MoeForCausalLM, Qwen3MoeForCausalLM; the Qwen MoE "
             "classes build a MoE on every layer (mlp_only_layers not read)", _SGL_Q2MOE))
_add(_family("moe", "transformers", True, _MOE, _MOE_HF,
             "Mixtral / Qwen2Moe / Qwen3MoeForCausalLM; qwen*_moe read mlp_only_layers (dense "
             "MLP vs MoE per layer); shapes one per model", _HF_MIXTRAL))

# deepseek_v3
_add(_family("deepseek_v3", "vllm", True, _DSV3, _DSV3_VLLM,
             "DeepseekV3ForCausalLM (deepseek_v2.py); kimi_k2 checkpoints name it" + _PUZZLE,
             _VLLM_DSV2))
_add(_family("deepseek_v3", "trtllm", True, _DSV3, _DSV3_TRT,
             "DeepseekV3ForCausalLM, dispatched by architectures[0], so kimi_k2 loads (its "
             "config needs trust_remote_code)" + _PUZZLE, _TRT_DSV3))
_add(_family("deepseek_v3", "sglang", True, _DSV3, _DSV3_SGL,
             "DeepseekV3ForCausalLM (a DeepseekV2ForCausalLM; Kimi-K2 checkpoints name it); "
             "every layer MLA + MoE or MLP from the model config" + _PUZZLE, _SGL_DSV2))
_add(_family("deepseek_v3", "transformers", True, ("deepseek_v3",), _DSV3_HF,
             "DeepseekV3ForCausalLM; kimi_k2 is no auto model_type (trust_remote_code only)"
             + _PUZZLE, _HF_DSV3))

# gpt_oss
_add(_family("gpt_oss", "vllm", True, ("gpt_oss",), _OSS_VLLM,
             "GptOssForCausalLM; re-checked at a6b6cfaa: the window still by layer index"
             + _PUZZLE, _VLLM_OSS_RECHECK))
_add(_family("gpt_oss", "trtllm", True, ("gpt_oss",), _OSS_TRT,
             "GptOssForCausalLM: AttentionBlock + MLPBlock per layer from the model config"
             + _PUZZLE, _TRT_OSS))
_add(_family("gpt_oss", "sglang", True, ("gpt_oss",), _OSS_SGL,
             "GptOssForCausalLM: attention + GptOssSparseMoeBlock per layer; sliding vs full "
             "from config.layer_types" + _PUZZLE, _SGL_OSS))
_add(_family("gpt_oss", "transformers", True, ("gpt_oss",), _OSS_HF,
             "GptOssForCausalLM; layer_types toggles sliding / full with one window" + _PUZZLE,
             _HF_OSS))

# qwen3_next
_add(_family("qwen3_next", "vllm", True, ("qwen3_next",), _Q3N_VLLM,
             "Qwen3NextForCausalLM; re-checked at 6365b387 (the rows first read at 002d6073 "
             "hold)", _VLLM_Q3N_RECHECK))
_add(_family("qwen3_next", "trtllm", True, ("qwen3_next",), _Q3N_TRT,
             "Qwen3NextForCausalLM: ALL_DECODER_LAYER_TYPES[config.layer_types[i]]; every MLP "
             "the MoE block", _TRT_Q3N))
_add(_family("qwen3_next", "sglang", True, ("qwen3_next",), _Q3N_SGL,
             "Qwen3NextForCausalLM with SGLang's own Qwen3NextConfig: layer kinds from "
             "full_attention_interval, layer_types ignored", _SGL_Q3N))
_add(_family("qwen3_next", "transformers", True, ("qwen3_next",), _Q3N_HF,
             "Qwen3NextForCausalLM: layer_types[i] picks DeltaNet or attention; "
             "mlp_only_layers picks dense MLP vs MoE", _HF_Q3N))

# qwen3_5
_add(_family("qwen3_5", "vllm", True, _Q35, _Q35_VLLM,
             "Qwen3_5MoeForCausalLM (text) and Qwen3_5MoeForConditionalGeneration; its layers "
             "subclass Qwen3-Next's; registry not read at a pinned commit (older ones list only "
             "the VL class)", _VLLM_Q35))
_add(_family("qwen3_5", "trtllm", True, _Q35, _Q35_TRT,
             "Qwen3_5MoeForCausalLM (a Qwen3NextForCausalLM) and "
             "Qwen3_5MoeForConditionalGeneration; config flattened to Qwen3NextConfig",
             _TRT_Q35))
_add(_family("qwen3_5", "sglang", True, _Q35, _Q35_SGL,
             "Qwen3_5MoeForConditionalGeneration (qwen3_5.py) and Qwen3_5MoeForCausalLM "
             "(qwen3_5_text.py); Qwen3_5MoeTextConfig subclasses SGLang's Qwen3NextConfig",
             _SGL_Q35))
_add(_family("qwen3_5", "transformers", True, _Q35, _Q35_HF,
             "Qwen3_5MoeForCausalLM (qwen3_5_moe_text, also mapped for qwen3_5_moe) and "
             "Qwen3_5MoeForConditionalGeneration; layer_types per layer, MoE every layer",
             _HF_Q35))

# granitemoehybrid
_add(_family("granitemoehybrid", "vllm", True, ("granitemoehybrid",), _GRANITE_VLLM,
             "GraniteMoeHybridForCausalLM: layer i attention or mamba by "
             "config.layer_types[i], each with the model's MoE and shared MLP", _VLLM_GRANITE))
_add(_family("granitemoehybrid", "trtllm", False, (), {},
             "no PyTorch-backend class: MODEL_ARCH_TO_MODULE has no "
             "GraniteMoeHybridForCausalLM", _TRT_ARCH))
_add(_family("granitemoehybrid", "sglang", True, ("granitemoehybrid",), _GRANITE_SGL,
             "GraniteMoeHybridForCausalLM with SGLang's GraniteMoeHybridConfig: mamba or "
             "attention by config.layer_types[layer], then MoE + shared MLP", _SGL_GRANITE))
_add(_family("granitemoehybrid", "transformers", True, ("granitemoehybrid",), _GRANITE_HF,
             "GraniteMoeHybridForCausalLM: layer_types[i] picks Mamba or attention; MoE + "
             "shared MLP every layer", _HF_GRANITE))

# jamba
_add(_family("jamba", "vllm", True, ("jamba",), _JAMBA_VLLM,
             "JambaForCausalLM: layer kind and MoE vs MLP from layers_block_type / "
             "layers_num_experts, JambaConfig properties of the periods and offsets",
             _VLLM_JAMBA))
_add(_family("jamba", "trtllm", False, (), {},
             "no JambaForCausalLM in MODEL_ARCH_TO_MODULE (a registered class exists only on "
             "a contributor's fork)", _TRT_ARCH))
_add(_family("jamba", "sglang", False, (), {},
             "no jamba.py among SGLang's models (0.5.23; issue #1190 open); the stored "
             "jamba.py is from an unmerged pull request (#20141)", _SGL_JAMBA_PR))
_add(_family("jamba", "transformers", True, ("jamba",), _JAMBA_HF,
             "JambaForCausalLM: layers_block_type / layers_num_experts derived from "
             "attn/expert_layer_period and offset", _HF_JAMBA))

# falcon_h1
_add(_family("falcon_h1", "vllm", True, ("falcon_h1",), _FH1_VLLM,
             "FalconH1ForCausalLM: every layer FalconH1ParallelHybrid (attention + Mamba-2) "
             "then FalconH1MLP, from the model config", _VLLM_FH1))
_add(_family("falcon_h1", "trtllm", False, (), {},
             "no FalconH1ForCausalLM in MODEL_ARCH_TO_MODULE", _TRT_ARCH))
_add(_family("falcon_h1", "sglang", True, ("falcon_h1",), _FH1_SGL,
             "FalconH1ForCausalLM: FalconH1HybridAttentionDecoderLayer on every layer "
             "(attention + MambaMixer2 + FalconH1MLP)", _SGL_FH1))
_add(_family("falcon_h1", "transformers", True, ("falcon_h1",), _FH1_HF,
             "FalconH1ForCausalLM: every FalconH1DecoderLayer builds FalconH1Mixer + "
             "FalconH1Attention + FalconH1MLP from the model config", _HF_FH1))


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
    if not ef.serves:
        raise InputError(f"{engine} has no class for the parent's type {model_type!r}: it "
                         f"does not serve the {ef.family} family ({ef.note}); engines that "
                         f"do: {', '.join(serving(model_type)) or 'none'}",
                         field="deploy.engines")
    if model_type not in ef.types:
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


def markdown_entries() -> str:
    """One markdown row per (family, engine): whether it serves the family, the types its
    classes load, where that was read and which class loads it."""
    lines = ["| family | engine | serves | types | read at | class |",
             "|---|---|---|---|---|---|"]
    for (fam, eng), ef in TABLE.items():
        src = f"`{ef.source}`" if ef.source else "unverified"
        types = ", ".join(f"`{t}`" for t in ef.types) or "none"
        part = " (only the listed rows read)" if ef.unread else ""
        lines.append(f"| {fam} | {eng} | {'yes' if ef.serves else '**no**'} | {types} | {src} "
                     f"| {ef.note}{part} |")
    return "\n".join(lines) + "\n"


def markdown_table() -> str:
    """The table as the markdown ``docs/engines.md`` prints: :func:`markdown_entries`, then
    one row per listed axis."""
    lines = [markdown_entries(),
             "| family | engine | axis | takes | read at | why |", "|---|---|---|---|---|---|"]
    for r in table_rows():
        src = f"`{r['source']}`" if r["source"] else "unverified"
        lines.append(f"| {r['family']} | {r['engine']} | `{r['axis']}` | {r['take']} | {src} "
                     f"| {r['note']} |")
    return "\n".join(lines) + "\n"
