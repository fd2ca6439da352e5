"""Import and export of Hugging Face ``config.json`` files.

Imported types: ``llama``, ``mistral``, ``qwen2``, ``qwen3``, ``mixtral``, ``qwen2_moe``,
``qwen3_moe``, ``nemotron_h``, ``nemotron_h_puzzle`` and ``nemotron-nas`` (DeciLM).

Both spellings of every field that changes numerics are read: transformers 4.x
(``rope_theta`` + ``rope_scaling``, ``num_experts``, ``hybrid_override_pattern``,
``mamba_dt_*``) and 5.x (``rope_parameters``, ``num_local_experts``, ``qkv_bias``,
``layers_block_type``, ``sliding_window: 0`` = off, ``{"__float__": "Infinity"}``), with
transformers' per-type defaults. A numerics-changing field this library does not compute
(dynamic / LongRoPE scaling, unknown RoPE keys, partial rotary, soft-capping, group-limited
routing, biased MoE projections, ...) is an :class:`InputError` naming it, never a silent
default. Exports use the 4.x spelling, which transformers 5.x reads too.

Exported types: the plain type a model came from when it is still homogeneous; otherwise
``nemotron-nas`` when the blocks alternate (attention | linear | no-op) and
(gated FFN | linear | no-op) as DeciLM requires, and ``nemotron_h_puzzle`` for anything
else (any sequence of block kinds).

Extensions this library writes and reads beyond the published formats (documented so that
other tools can ignore them safely):

* ``nemotron_h_puzzle``: ``block_type`` may also be ``"linear"`` or ``"noop"``; per-block
  keys ``use_rope``, ``qk_norm``, ``attention_o_bias``, ``moe_gated``, ``moe_router``,
  ``moe_router_bias``, ``moe_shared_gate`` and ``mlp_gated`` describe blocks that stock
  Nemotron-H does not have.
* ``nemotron-nas``: ``ffn.intermediate_size`` is written when a width is not reachable
  through ``ffn_mult`` (widths that are not multiples of 256); it wins over ``ffn_mult``.
"""

from __future__ import annotations

import json
import math
from collections import Counter
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from hwprofiles.errors import InputError, first_error, read_json
from nas.arch import (
    FFN,
    MAX_BLOCKS,
    MAX_CONTEXT,
    Attention,
    Linear,
    Mamba,
    ModelArch,
    MoE,
    NoOp,
    _Block,
    cap_of,
)
from nas.io import atomic_write_json

LLAMA_LIKE = ("llama", "mistral", "qwen2", "qwen3")
MOE_LIKE = ("mixtral", "qwen2_moe", "qwen3_moe")
NEMOTRON_H = ("nemotron_h", "nemotron_h_puzzle")
SUPPORTED_TYPES = LLAMA_LIKE + MOE_LIKE + NEMOTRON_H + ("nemotron-nas",)
_MISSING = object()
_ARCHITECTURES = {
    "llama": "LlamaForCausalLM", "mistral": "MistralForCausalLM", "qwen2": "Qwen2ForCausalLM",
    "qwen3": "Qwen3ForCausalLM", "mixtral": "MixtralForCausalLM",
    "qwen2_moe": "Qwen2MoeForCausalLM", "qwen3_moe": "Qwen3MoeForCausalLM",
    "nemotron_h": "NemotronHForCausalLM", "nemotron_h_puzzle": "NemotronHPuzzleForCausalLM",
    "nemotron-nas": "DeciLMForCausalLM",
}
_PATTERN = {"M": "mamba", "E": "moe", "*": "attention", "-": "mlp"}
_PATTERN_INV = {v: k for k, v in _PATTERN.items()}


MAX_CONFIG_INT = 2**53
"""Any integer field: the largest every JSON reader and float64 hold exactly."""
_INT_CAPS: dict[str, tuple[int, str]] = {
    "num_hidden_layers": (MAX_BLOCKS, "MAX_BLOCKS: 16x the deepest published LLM"),
    "num_nextn_predict_layers": (MAX_BLOCKS, "MAX_BLOCKS: 16x the deepest published LLM"),
    "max_position_embeddings": (MAX_CONTEXT, "MAX_CONTEXT: the largest int32 position"),
    "num_attention_heads": cap_of("num_heads"),  # type: ignore[dict-item]
    "hidden_size": cap_of("hidden_size"),  # type: ignore[dict-item]
    "vocab_size": cap_of("vocab_size"),  # type: ignore[dict-item]
}


def _show(v: Any) -> str:
    """A value for a message: huge integers by their size, not their 400 digits."""
    if isinstance(v, int) and not isinstance(v, bool) and abs(v) >= 10**15:
        return f"a {len(str(abs(v)))}-digit integer"
    if isinstance(v, int) and not isinstance(v, bool):
        return f"{v:,}"
    if isinstance(v, float):
        return f"{v:.6g}"
    return repr(v)


def _head_dim(r: _Reader, hidden: int, heads: int) -> int:
    """``head_dim``, or hidden / heads when the config leaves it out (then it must divide)."""
    d = r.int("head_dim", None)
    if d:
        return int(d)
    if hidden % heads:
        raise r.err("num_attention_heads", f"{heads} does not divide hidden_size {hidden} "
                    "and no head_dim is given (expected hidden_size = heads x head size)")
    return hidden // heads


class _Reader:
    """Typed access to a config dict; errors name the file and the field; tracks used keys."""

    def __init__(self, cfg: dict[str, Any], source: str, prefix: str = ""):
        self.cfg, self.source, self.prefix = cfg, source, prefix
        self.used: set[str] = set()

    def err(self, key: str, msg: str) -> InputError:
        return InputError(msg, path=self.source, field=f"{self.prefix}{key}")

    def raw(self, key: str, default: Any = _MISSING) -> Any:
        self.used.add(key)
        if key not in self.cfg or self.cfg[key] is None:
            if default is _MISSING:
                raise self.err(key, "missing required field")
            return default
        return self.cfg[key]

    def int(self, key: str, default: Any = _MISSING, minimum: int = 1) -> Any:
        v = self.raw(key, default)
        if v is None or (v is default and default is not _MISSING):
            return v
        if isinstance(v, bool) or not isinstance(v, int | float) or \
                (isinstance(v, float) and not math.isfinite(v)) or v != int(v):
            raise self.err(key, f"expected an integer, got {v!r}")
        if v < minimum:
            raise self.err(key, f"expected an integer >= {minimum}, got {v!r}")
        cap = _INT_CAPS.get(key, (MAX_CONFIG_INT, "exact in float64 and in JSON readers"))
        if v > cap[0]:
            raise self.err(key, f"expected at most {cap[0]:,} ({cap[1]}), got {_show(v)}")
        return int(v)

    def float(self, key: str, default: Any = _MISSING) -> Any:
        v = self.raw(key, default)
        if v is None and default is None:
            return None
        if isinstance(v, bool) or not isinstance(v, int | float) or \
                (isinstance(v, int) and abs(v) > MAX_CONFIG_INT) or not math.isfinite(v):
            raise self.err(key, f"expected a finite number, got {_show(v)}")
        return float(v)

    def bool(self, key: str, default: Any = _MISSING) -> bool:
        v = self.raw(key, default)
        if not isinstance(v, bool):
            raise self.err(key, f"expected true or false, got {v!r}")
        return v

    def str(self, key: str, default: Any = _MISSING) -> str:
        v = self.raw(key, default)
        if not isinstance(v, str):
            raise self.err(key, f"expected a string, got {v!r}")
        return v


def _block(cls: type[_Block], r: _Reader, **kw: Any) -> _Block:
    try:
        return cls(**kw)
    except ValidationError as exc:
        raise InputError(f"invalid {cls.__name__.lower()} block: {first_error(exc)[1]}",
                         path=r.source,
                         field=r.prefix.rstrip(".") or None) from None


# ---------------------------------------------------------------------------------------
# import
# ---------------------------------------------------------------------------------------
def load_config(path: str | Path) -> ModelArch:
    """Read an HF ``config.json`` (or a folder holding one) as a :class:`ModelArch`."""
    path = Path(path)
    if path.is_dir():
        path = path / "config.json"
    return from_hf(read_json(path), source=str(path))


def from_hf(cfg: Any, source: str = "config") -> ModelArch:
    """Turn an HF config dict into a :class:`ModelArch`."""
    if not isinstance(cfg, dict):
        raise InputError("expected a JSON object", path=source)
    mt = cfg.get("model_type")
    if mt not in SUPPORTED_TYPES:
        raise InputError(f"unsupported model_type {mt!r}; expected one of "
                         f"{', '.join(SUPPORTED_TYPES)}", path=source, field="model_type")
    r = _Reader(cfg, source)
    r.used.update({"model_type", "architectures", "torch_dtype", "dtype",
                   "transformers_version"})
    if mt in LLAMA_LIKE or mt in MOE_LIKE:
        blocks, kw = _import_llama_like(r, mt)
        mtp: list[_Block] = []
    elif mt == "nemotron-nas":
        blocks, kw = _import_decilm(r)
        mtp = []
    else:
        blocks, mtp, kw = _import_nemotron_h(r, mt)
    extra = {k: v for k, v in cfg.items() if k not in r.used}
    extra.update(kw.pop("_extra", {}))
    try:
        return ModelArch(blocks=tuple(blocks), mtp_blocks=tuple(mtp), model_type=mt,
                         hf_extra_json=json.dumps(extra, sort_keys=True), **kw)
    except ValidationError as exc:
        loc, msg = first_error(exc)
        raise InputError(msg, path=source, field=loc) from None


def _common(r: _Reader, eps_key: str, eps_default: float, mt: str) -> dict[str, Any]:
    _refuse_unsupported(r)
    theta, scaling = _rope(r, mt)
    kw: dict[str, Any] = dict(
        hidden_size=r.int("hidden_size"),
        vocab_size=r.int("vocab_size"),
        tie_embeddings=r.bool("tie_word_embeddings", False),
        norm_eps=r.float(eps_key, eps_default),
        rope_theta=theta,
    )
    if scaling is not None:
        kw["_extra"] = {"rope_scaling": scaling}
    return kw


# Fields of other families that change numerics and that no supported type computes: present
# with any value other than the neutral one(s), they are an error naming the field.
_UNSUPPORTED_NUMERIC: dict[str, tuple[Any, ...]] = {
    "partial_rotary_factor": (None, 1, 1.0),
    "attn_logit_softcapping": (None,), "final_logit_softcapping": (None,),
    "logit_scale": (None, 1, 1.0), "logits_scaling": (None, 1, 1.0),
    "attention_multiplier": (None,), "embedding_multiplier": (None, 1, 1.0),
    "residual_multiplier": (None, 1, 1.0), "query_pre_attn_scalar": (None,),
    "rope_interleave": (None, False), "use_qk_norm": (None, False),
    "mrope_section": (None,), "moe_layer_freq": (None, 1),
}

# RoPE types: the keys each one reads (beyond rope_type / rope_theta); anything else in the
# dict is an error naming it. Types not listed are refused.
_ROPE_KEYS: dict[str, frozenset[str]] = {
    "default": frozenset(),
    "linear": frozenset({"factor"}),
    "llama3": frozenset({"factor", "low_freq_factor", "high_freq_factor",
                         "original_max_position_embeddings"}),
    "yarn": frozenset({"factor", "original_max_position_embeddings", "attention_factor",
                       "beta_fast", "beta_slow", "mscale", "mscale_all_dim", "truncate"}),
}
_ROPE_REFUSED = {
    "dynamic": "dynamic NTK scaling changes the frequencies with the sequence length at run "
               "time and is not implemented",
    "longrope": "LongRoPE (per-dimension factors) is not implemented",
    "su": "LongRoPE (per-dimension factors) is not implemented",
    "mrope": "multimodal RoPE is not implemented",
}


def _refuse_unsupported(r: _Reader) -> None:
    for key, neutral in _UNSUPPORTED_NUMERIC.items():
        if key in r.cfg:
            r.used.add(key)
            if r.cfg[key] not in neutral:
                raise r.err(key, f"{r.cfg[key]!r} changes the numerics in a way this library "
                            "does not compute (supported: absent"
                            + "".join(f" or {v!r}" for v in neutral if v is not None) + ")")


def _rope(r: _Reader, mt: str) -> tuple[float, dict[str, Any] | None]:
    """``(rope_theta, scaling)`` from either spelling: transformers 5.x ``rope_parameters``
    (``{rope_theta, rope_type, ...}``) or 4.x top-level ``rope_theta`` + ``rope_scaling``.

    As transformers does: ``rope_scaling`` wins over ``rope_parameters``; the theta inside
    the dict wins over the top-level one, which wins over the type's default (10,000;
    1,000,000 for mixtral); ``original_max_position_embeddings`` of llama3 / YaRN defaults to
    ``max_position_embeddings``. ``scaling`` is ``None`` for plain RoPE, else a dict with
    ``rope_type`` and that type's parameters.
    """
    default_theta = 1e6 if mt == "mixtral" else 10000.0
    top = r.float("rope_theta", None)
    params, key = r.raw("rope_scaling", None), "rope_scaling"
    if params is None:
        params, key = r.raw("rope_parameters", None), "rope_parameters"
    else:
        r.used.add("rope_parameters")
    if params is None:
        return (default_theta if top is None else top), None
    if not isinstance(params, dict):
        raise r.err(key, f"expected an object, got {params!r}")
    if params and all(isinstance(v, dict) or v is None for v in params.values()):
        raise r.err(key, "per-layer-type RoPE parameters are not supported")
    sub = _Reader(params, r.source, prefix=f"{key}.")
    theta = sub.float("rope_theta", None)
    theta = theta if theta is not None else (default_theta if top is None else top)
    if theta <= 0:
        raise sub.err("rope_theta", f"expected a positive number, got {theta}")
    sub.float("partial_rotary_factor", None)
    if params.get("partial_rotary_factor") not in (None, 1, 1.0):
        raise sub.err("partial_rotary_factor", "partial rotary embeddings are not supported")
    kind = params.get("rope_type", params.get("type", "default"))
    sub.used.update({"rope_type", "type"})
    if not isinstance(kind, str):
        raise sub.err("rope_type", f"expected a string, got {kind!r}")
    if kind in _ROPE_REFUSED:
        raise sub.err("rope_type", f"{kind!r}: {_ROPE_REFUSED[kind]}")
    if kind not in _ROPE_KEYS:
        raise sub.err("rope_type", f"unknown RoPE type {kind!r}; supported: "
                      + ", ".join(_ROPE_KEYS))
    unknown = sorted(set(params) - _ROPE_KEYS[kind] - sub.used)
    if unknown:
        raise sub.err(unknown[0], f"not a parameter of RoPE type {kind!r} (it would change "
                      "the numerics in a way this library does not compute)")
    if kind == "default":
        return theta, None
    out: dict[str, Any] = {"rope_type": kind}
    if kind in ("llama3", "yarn"):
        orig = params.get("original_max_position_embeddings")
        if orig is None:
            orig = r.cfg.get("original_max_position_embeddings")
        if orig is None:
            orig = _Reader(r.cfg, r.source).int("max_position_embeddings")
        out["original_max_position_embeddings"] = _Reader(
            {"original_max_position_embeddings": orig}, r.source, f"{key}.").int(
            "original_max_position_embeddings")
    if kind == "yarn":
        factor = sub.float("factor", None)
        if factor is None:
            factor = _Reader(r.cfg, r.source).int("max_position_embeddings") / out["original_max_position_embeddings"]
        out["factor"] = factor
        for k in ("attention_factor", "beta_fast", "beta_slow", "mscale", "mscale_all_dim"):
            v = sub.float(k, None)
            if v is not None:
                out[k] = v
        out["truncate"] = sub.bool("truncate", True)
    else:
        out["factor"] = sub.float("factor")
    if kind == "llama3":
        out["low_freq_factor"] = sub.float("low_freq_factor")
        out["high_freq_factor"] = sub.float("high_freq_factor")
        if out["high_freq_factor"] <= out["low_freq_factor"]:
            raise sub.err("high_freq_factor", "must exceed low_freq_factor")
    if out["factor"] <= 0:
        raise sub.err("factor", f"expected a positive number, got {out['factor']}")
    return theta, out


def _windows(r: _Reader, mt: str, n: int) -> list[int | None]:
    """Sliding window per layer for the llama-like families, as transformers 5.x derives it.

    ``sliding_window`` 0 or null is off. mistral: one window for every layer (4096 when the
    key is absent, transformers' default); mixtral: the same, default off. qwen2 / qwen3 /
    qwen*_moe: the window applies only with ``use_sliding_window``, to the layers that
    ``layer_types`` marks ``sliding_attention``; without ``layer_types``, qwen2 / qwen3 mark
    layers ``>= max_window_layers`` and qwen2_moe the even layers ``< max_window_layers``.
    """
    if mt == "llama":
        return [None] * n
    default = 4096 if mt != "mixtral" else None
    window = r.int("sliding_window", default, minimum=0) if "sliding_window" in r.cfg \
        else default
    r.used.add("sliding_window")
    window = window or None
    if mt in ("mistral", "mixtral"):
        if "layer_types" in r.cfg:
            raise r.err("layer_types", f"{mt} has one attention type for every layer")
        return [window] * n
    use = r.bool("use_sliding_window", False)
    if not use:
        window = None
    first = r.int("max_window_layers", 28, minimum=0)
    types = r.raw("layer_types", None)
    if types is not None:
        if not isinstance(types, list) or len(types) != n or not all(
                t in ("sliding_attention", "full_attention") for t in types):
            raise r.err("layer_types", f"expected a list of {n} layer types "
                        "(full_attention or sliding_attention)")
        return [window if t == "sliding_attention" else None for t in types]
    if mt == "qwen2_moe":
        return [window if (i % 2 == 0 and i < first) else None for i in range(n)]
    return [window if i >= first else None for i in range(n)]


def _experts(r: _Reader) -> int:
    """The routed-expert count under either name (``num_local_experts`` is what mixtral and
    transformers 5.x qwen3_moe write, ``num_experts`` what qwen*_moe 4.x wrote)."""
    a, b = r.cfg.get("num_local_experts"), r.cfg.get("num_experts")
    r.used.update({"num_local_experts", "num_experts"})
    if a is not None and b is not None and a != b:
        raise r.err("num_experts", f"is {b} but num_local_experts is {a}")
    return r.int("num_local_experts") if a is not None else r.int("num_experts")


def _import_llama_like(r: _Reader, mt: str) -> tuple[list[_Block], dict[str, Any]]:
    kw = _common(r, "rms_norm_eps", 1e-5 if mt == "mixtral" else 1e-6, mt)
    h = kw["hidden_size"]
    n = r.int("num_hidden_layers")
    heads = r.int("num_attention_heads")
    kv = r.int("num_key_value_heads", heads)
    head_dim = _head_dim(r, h, heads)
    act = r.str("hidden_act", "silu")
    if mt == "qwen2":
        qkv_bias, o_bias = True, False
    elif mt == "qwen2_moe":  # transformers 5.x writes qkv_bias (default true)
        qkv_bias, o_bias = r.bool("qkv_bias", True), False
    elif mt in ("mistral", "mixtral"):
        qkv_bias = o_bias = False
    else:
        qkv_bias = o_bias = r.bool("attention_bias", False)
    qk_norm = mt in ("qwen3", "qwen3_moe")
    windows = _windows(r, mt, n)
    mlp_bias = r.bool("mlp_bias", False) if mt == "llama" else False
    inter = r.int("intermediate_size", None if mt in MOE_LIKE else _MISSING)

    moe_layers: set[int] = set()
    moe: _Block | None = None
    if mt == "mixtral":
        moe = _block(MoE, r, num_experts=_experts(r),
                     top_k=r.int("num_experts_per_tok"), expert_width=inter, activation=act)
        moe_layers = set(range(n))
    elif mt in ("qwen2_moe", "qwen3_moe"):
        n_exp = _experts(r)
        step = r.int("decoder_sparse_step", 1)
        mlp_only = r.raw("mlp_only_layers", [])
        if not isinstance(mlp_only, list) or not all(isinstance(i, int) for i in mlp_only):
            raise r.err("mlp_only_layers", "expected a list of layer indices")
        shared = r.int("shared_expert_intermediate_size", 0, minimum=0) \
            if mt == "qwen2_moe" else 0
        moe = _block(MoE, r, num_experts=n_exp, top_k=r.int("num_experts_per_tok"),
                     expert_width=r.int("moe_intermediate_size"), shared_width=shared,
                     shared_gate=bool(shared), activation=act,
                     norm_topk=r.bool("norm_topk_prob", False))
        moe_layers = {i for i in range(n) if i not in mlp_only and (i + 1) % step == 0}
    if len(moe_layers) < n and inter is None:
        raise r.err("intermediate_size", "missing required field (dense layers need it)")

    blocks: list[_Block] = []
    for i in range(n):
        blocks.append(_block(Attention, r, num_heads=heads, num_kv_heads=kv, head_dim=head_dim,
                             sliding_window=windows[i], rope=True, qk_norm=qk_norm,
                             qkv_bias=qkv_bias, o_bias=o_bias))
        if i in moe_layers:
            blocks.append(moe)  # type: ignore[arg-type]
        else:
            blocks.append(_block(FFN, r, width=inter, gated=True, activation=act, bias=mlp_bias))
    return blocks, kw


def _ffn_width_from_mult(mult: float, hidden: int) -> int:
    width = int(2 * mult * hidden / 3)
    return -(-width // 256) * 256


def _import_decilm(r: _Reader) -> tuple[list[_Block], dict[str, Any]]:
    kw = _common(r, "rms_norm_eps", 1e-5, "nemotron-nas")
    h = kw["hidden_size"]
    heads = r.int("num_attention_heads")
    head_dim = _head_dim(r, h, heads)
    act = r.str("hidden_act", "silu")
    confs = r.raw("block_configs")
    if not isinstance(confs, list) or not confs:
        raise r.err("block_configs", "expected a non-empty list of per-layer configs")
    n = r.int("num_hidden_layers", len(confs))
    if n != len(confs):
        raise r.err("num_hidden_layers",
                    f"is {n} but block_configs has {len(confs)} entries")
    blocks: list[_Block] = []
    for i, bc in enumerate(confs):
        if not isinstance(bc, dict):
            raise r.err(f"block_configs[{i}]", "expected an object")
        for part in ("attention", "ffn"):
            sub = bc.get(part, {})
            if not isinstance(sub, dict):
                raise r.err(f"block_configs[{i}].{part}", "expected an object")
            s = _Reader(sub, r.source, prefix=f"block_configs[{i}].{part}.")
            if s.bool("no_op", False):
                blocks.append(NoOp())
            elif s.bool("replace_with_linear", False):
                blocks.append(Linear())
            elif part == "attention":
                group = s.int("n_heads_in_group")
                if heads % group:
                    raise s.err("n_heads_in_group",
                                f"must divide num_attention_heads ({heads}), got {group}")
                blocks.append(_block(Attention, s, num_heads=heads, num_kv_heads=heads // group,
                                     head_dim=head_dim, sliding_window=s.int("window_length",
                                                                            None)))
            else:
                width = s.int("intermediate_size", None)
                if width is None:
                    mult = s.float("ffn_mult")
                    if mult <= 0:
                        raise s.err("ffn_mult", f"expected a positive number, got {mult}")
                    width = _ffn_width_from_mult(mult, h)
                blocks.append(_block(FFN, s, width=width, gated=True, activation=act))
    return blocks, kw


def _nemotron_block(btype: str, r: _Reader, h: int) -> _Block:
    """One Nemotron-H block from (top-level defaults overlaid with per-block overrides)."""
    if btype == "mamba":
        act = r.str("mamba_hidden_act", "silu")
        if act != "silu":
            raise r.err("mamba_hidden_act", f"only silu is supported, got {act!r}")
        # transformers (5.x and NVIDIA's remote code) bias the Mamba in/out projections by
        # use_bias; mamba_proj_bias is what this library wrote before and must agree
        bias = r.bool("use_bias", False)
        if r.raw("mamba_proj_bias", None) not in (None, bias):
            raise r.err("mamba_proj_bias", f"is {r.cfg['mamba_proj_bias']!r} but use_bias "
                        f"(what transformers biases the Mamba projections by) is {bias}")
        return _block(Mamba, r, num_heads=r.int("mamba_num_heads"),
                      head_dim=r.int("mamba_head_dim"), state_size=r.int("ssm_state_size"),
                      n_groups=_alias(r, "n_groups", "mamba_n_groups", 8),
                      conv_kernel=_alias(r, "conv_kernel", "mamba_d_conv", 4),
                      conv_bias=_alias(r, "use_conv_bias", "mamba_conv_bias", True),
                      proj_bias=bias)
    if btype == "attention":
        heads = r.int("num_attention_heads")
        qkv_bias = r.bool("attention_bias", False)
        return _block(Attention, r, num_heads=heads, num_kv_heads=r.int("num_key_value_heads"),
                      head_dim=_head_dim(r, h, heads),
                      sliding_window=r.int("sliding_window", None),
                      rope=r.bool("use_rope", False), qk_norm=r.bool("qk_norm", False),
                      qkv_bias=qkv_bias, o_bias=r.bool("attention_o_bias", qkv_bias))
    if btype == "moe":
        n_group, topk_group = r.int("n_group", 1), r.int("topk_group", 1)
        if topk_group < n_group:
            raise r.err("topk_group", f"group-limited routing (top {topk_group} of {n_group} "
                        "expert groups) is not supported")
        if r.bool("mlp_bias", False):
            raise r.err("mlp_bias", "MoE blocks with biased shared-expert / latent "
                        "projections are not supported")
        shared = r.int("moe_shared_expert_intermediate_size", 0, minimum=0) * \
            r.int("n_shared_experts", 1, minimum=0)
        return _block(MoE, r, num_experts=r.int("n_routed_experts"),
                      top_k=r.int("num_experts_per_tok"),
                      expert_width=r.int("moe_intermediate_size"), shared_width=shared,
                      latent_size=r.int("moe_latent_size", None),
                      gated=r.bool("moe_gated", False),
                      activation=r.str("mlp_hidden_act", "relu2"),
                      router=r.str("moe_router", "sigmoid"),
                      router_bias=r.bool("moe_router_bias", True),
                      norm_topk=r.bool("norm_topk_prob", True),
                      routed_scaling=r.float("routed_scaling_factor", 1.0),
                      shared_gate=r.bool("moe_shared_gate", False))
    if btype == "mlp":
        return _block(FFN, r, width=r.int("intermediate_size"), gated=r.bool("mlp_gated", False),
                      activation=r.str("mlp_hidden_act", "relu2"), bias=r.bool("mlp_bias", False))
    if btype == "linear":
        return Linear()
    if btype == "noop":
        return NoOp()
    raise r.err("block_type", f"unknown block_type {btype!r}; expected mamba, attention, "
                "moe, mlp, linear or noop")


def _alias(r: _Reader, key: str, old: str, default: Any) -> Any:
    """A field under its transformers 5.x name or its older alias (which must agree)."""
    get = r.bool if isinstance(default, bool) else r.int
    if r.cfg.get(old) is not None:
        v = get(old)
        if r.cfg.get(key) is not None and get(key) != v:
            raise r.err(key, f"is {r.cfg[key]!r} but {old} is {v!r}")
        r.used.add(key)
        return v
    r.used.add(old)
    return get(key, default)


def _hf_float(v: Any) -> Any:
    """transformers 5.x writes infinities as ``{"__float__": "Infinity"}``."""
    if isinstance(v, dict) and set(v) == {"__float__"}:
        try:
            return float(v["__float__"])
        except (TypeError, ValueError):
            return v
    return v


def _time_step(r: _Reader) -> dict[str, Any]:
    """Mamba time-step clamp fields (both spellings), as ``{"time_step_min": lo,
    "time_step_limit": [lo, hi]}`` (``hi`` may be ``inf``)."""
    lo_min = _Reader({"time_step_min": r.cfg.get("mamba_dt_min", r.cfg.get("time_step_min"))},
                     r.source).float("time_step_min", 0.001)
    r.used.update({"time_step_min", "mamba_dt_min"})
    key = "mamba_dt_limit" if r.cfg.get("mamba_dt_limit") is not None else "time_step_limit"
    lim = r.raw(key, [0.0, math.inf])
    r.used.update({"time_step_limit", "mamba_dt_limit"})
    lim = [_hf_float(v) for v in lim] if isinstance(lim, list | tuple) else lim
    if not (isinstance(lim, list) and len(lim) == 2 and all(
            isinstance(v, int | float) and not isinstance(v, bool) for v in lim)
            and 0 <= lim[0] <= lim[1]):
        raise r.err(key, f"expected [low, high] with 0 <= low <= high, got {r.cfg[key]!r}")
    if lo_min < 0:
        raise r.err("time_step_min", f"expected a number >= 0, got {lo_min}")
    return {"time_step_min": lo_min, "time_step_limit": [float(lim[0]), float(lim[1])]}


_LAYER_TYPES = {"linear_attention": "mamba", "mamba": "mamba", "full_attention": "attention",
                "attention": "attention", "moe": "moe", "mlp": "mlp"}


def _import_nemotron_h(r: _Reader, mt: str) -> tuple[list[_Block], list[_Block], dict[str, Any]]:
    kw = _common(r, "layer_norm_epsilon", 1e-5, mt)
    h = kw["hidden_size"]
    cfg = r.cfg

    def build(types: list[str], overrides: list[dict[str, Any]], field: str) -> list[_Block]:
        out = []
        for i, (t, ov) in enumerate(zip(types, overrides)):
            sub = _Reader({**cfg, **ov}, r.source,
                          prefix=f"{field}[{i}]." if ov else "")
            out.append(_nemotron_block(t, sub, h))
            r.used |= sub.used
        return out

    def from_configs(key: str) -> tuple[list[str], list[dict[str, Any]]]:
        confs = r.raw(key)
        if not isinstance(confs, list):
            raise r.err(key, "expected a list of per-block configs")
        types, ovs = [], []
        for i, bc in enumerate(confs):
            if not isinstance(bc, dict) or not isinstance(bc.get("block_type"), str):
                raise r.err(f"{key}[{i}]", "expected an object with a string block_type")
            types.append(bc["block_type"])
            ovs.append({k: v for k, v in bc.items() if k != "block_type"})
        return types, ovs

    def from_list(key: str) -> list[str]:
        types = r.raw(key)
        if not isinstance(types, list) or not types or \
                not all(t in _LAYER_TYPES for t in types):
            raise r.err(key, "expected a non-empty list of linear_attention (Mamba), "
                        "full_attention, moe or mlp")
        return [_LAYER_TYPES[t] for t in types]

    def from_pattern(key: str) -> list[str]:
        pat = r.str(key)
        bad = sorted(set(pat) - set(_PATTERN))
        if bad:
            raise r.err(key, f"unknown pattern characters {bad}; expected M, E, * or -")
        return [_PATTERN[c] for c in pat]

    if mt == "nemotron_h_puzzle":
        types, ovs = from_configs("block_configs")
        if not types:
            raise r.err("block_configs", "expected at least one block")
        field = "block_configs"
    elif cfg.get("layers_block_type") is not None:  # transformers 5.x
        types = from_list("layers_block_type")
        ovs = [{} for _ in types]
        field = "layers_block_type"
        if cfg.get("hybrid_override_pattern") is not None and \
                from_pattern("hybrid_override_pattern") != types:
            raise r.err("hybrid_override_pattern", "disagrees with layers_block_type")
    else:
        types = from_pattern("hybrid_override_pattern")
        ovs = [{} for _ in types]
        field = "hybrid_override_pattern"
    n = r.int("num_hidden_layers", len(types))
    if n != len(types):
        raise r.err("num_hidden_layers" if mt == "nemotron_h" else "block_configs",
                    f"num_hidden_layers is {n} but {field} has {len(types)} blocks")
    if mt == "nemotron_h_puzzle" and "hybrid_override_pattern" in cfg:
        pat = from_pattern("hybrid_override_pattern")
        if len(pat) != len(types):
            raise r.err("hybrid_override_pattern",
                        f"has {len(pat)} blocks but block_configs has {len(types)}")
    blocks = build(types, ovs, field)

    mtp: list[_Block] = []
    if mt == "nemotron_h_puzzle" and "mtp_block_configs" in cfg:
        mtypes, movs = from_configs("mtp_block_configs")
        mtp = build(mtypes, movs, "mtp_block_configs")
        r.used.update({"num_nextn_predict_layers", "mtp_hybrid_override_pattern"})
    else:
        depth = r.int("num_nextn_predict_layers", 0, minimum=0)
        r.used.add("mtp_layers_block_type")
        if depth and cfg.get("mtp_hybrid_override_pattern") is None \
                and cfg.get("mtp_layers_block_type") is not None:
            mtypes = from_list("mtp_layers_block_type") * depth
            mtp = build(mtypes, [{} for _ in mtypes], "mtp_layers_block_type")
        elif depth:
            mtypes = from_pattern("mtp_hybrid_override_pattern") * depth
            mtp = build(mtypes, [{} for _ in mtypes], "mtp_hybrid_override_pattern")
        else:
            r.used.add("mtp_hybrid_override_pattern")
    if any(b.kind == "mamba" for b in (*blocks, *mtp)):
        kw.setdefault("_extra", {}).update(_time_step(r))
    return blocks, mtp, kw


# ---------------------------------------------------------------------------------------
# export
# ---------------------------------------------------------------------------------------
class ExportError(ValueError):
    """The architecture cannot be written as the requested HF type."""


def to_hf(arch: ModelArch, model_type: str | None = None) -> dict[str, Any]:
    """Export as an HF config dict.

    With ``model_type=None`` the type is chosen as the module docstring says. Raises
    :class:`ExportError` when an explicitly requested type cannot hold the architecture.
    """
    if model_type is not None:
        if model_type not in SUPPORTED_TYPES:
            raise ExportError(f"unknown export model_type {model_type!r}")
        return _EXPORTERS[model_type](arch)
    order = []
    if arch.model_type in LLAMA_LIKE + MOE_LIKE + ("nemotron_h",):
        order.append(arch.model_type)
    if arch.model_type in NEMOTRON_H:
        order.append("nemotron_h_puzzle")
    order += ["nemotron-nas", "nemotron_h_puzzle"]
    last: ExportError | None = None
    for mt in order:
        try:
            return _EXPORTERS[mt](arch)
        except ExportError as exc:
            last = exc
    raise last  # type: ignore[misc]  # pragma: no cover (nemotron_h_puzzle takes anything)


def export_type(arch: ModelArch) -> str:
    """The HF model_type :func:`to_hf` picks for ``arch``."""
    return to_hf(arch)["model_type"]


def save_config(arch: ModelArch, path: str | Path, model_type: str | None = None) -> Path:
    """Write ``arch`` as an HF ``config.json`` (atomically)."""
    return atomic_write_json(path, to_hf(arch, model_type))


def _base(arch: ModelArch, mt: str, eps_key: str) -> dict[str, Any]:
    out: dict[str, Any] = {"architectures": [_ARCHITECTURES[mt]], "model_type": mt}
    out.update(arch.hf_extra)
    lim = out.get("time_step_limit")
    if isinstance(lim, list) and lim and lim[-1] == math.inf:
        if lim == [0.0, math.inf]:
            del out["time_step_limit"]  # the default; keeps the file strict JSON
        else:
            out["time_step_limit"] = [lim[0], {"__float__": "Infinity"}]  # transformers' spelling
    out.update(hidden_size=arch.hidden_size, vocab_size=arch.vocab_size,
               tie_word_embeddings=arch.tie_embeddings, rope_theta=arch.rope_theta)
    out[eps_key] = arch.norm_eps
    return out


def _pairs(arch: ModelArch, mt: str) -> list[tuple[_Block, _Block]]:
    b = arch.blocks
    if len(b) % 2:
        raise ExportError(f"{mt} needs (attention, mlp) pairs; got an odd number of blocks")
    return [(b[i], b[i + 1]) for i in range(0, len(b), 2)]


def _export_llama_like(arch: ModelArch, mt: str) -> dict[str, Any]:
    pairs = _pairs(arch, mt)
    atts = [a for a, _ in pairs]
    mlps = [m for _, m in pairs]
    if not all(isinstance(a, Attention) for a in atts):
        raise ExportError(f"{mt} needs an attention block at every even position")
    a0: Attention = atts[0]  # type: ignore[assignment]
    if any(a.model_copy(update={"sliding_window": None}) !=
           a0.model_copy(update={"sliding_window": None}) for a in atts):
        raise ExportError(f"{mt} needs the same attention shape in every layer")
    qk = mt in ("qwen3", "qwen3_moe")
    if a0.qk_norm != qk or not a0.rope:
        raise ExportError(f"{mt} attention has qk_norm={qk} and RoPE")
    if mt in ("qwen2", "qwen2_moe"):
        if not a0.qkv_bias or a0.o_bias:
            raise ExportError(f"{mt} has q/k/v bias and no o bias")
    elif mt in ("mistral", "mixtral"):
        if a0.qkv_bias or a0.o_bias:
            raise ExportError(f"{mt} has no attention bias")
    elif a0.qkv_bias != a0.o_bias:
        raise ExportError(f"{mt} has one attention_bias flag for q/k/v/o")
    out = _base(arch, mt, "rms_norm_eps")
    out.update(num_hidden_layers=len(pairs), num_attention_heads=a0.num_heads,
               num_key_value_heads=a0.num_kv_heads, head_dim=a0.head_dim)
    if mt not in ("qwen2", "qwen2_moe", "mistral", "mixtral"):
        out["attention_bias"] = a0.qkv_bias
    windows = [a.sliding_window for a in atts]  # type: ignore[attr-defined]
    if mt == "llama":
        if any(windows):
            raise ExportError("llama has no sliding window")
    elif mt in ("mistral", "mixtral"):
        if len(set(windows)) > 1:
            raise ExportError(f"{mt} needs one sliding window for all layers")
        out["sliding_window"] = windows[0]
    else:
        w = {x for x in windows if x}
        if len(w) > 1:
            raise ExportError(f"{mt} needs one sliding window length")
        out["sliding_window"] = next(iter(w), None)
        out["use_sliding_window"] = bool(w)
        out["layer_types"] = ["sliding_attention" if x else "full_attention" for x in windows]
        out.pop("max_window_layers", None)

    ffns = [m for m in mlps if isinstance(m, FFN)]
    moes = [m for m in mlps if isinstance(m, MoE)]
    if len(ffns) + len(moes) != len(mlps):
        raise ExportError(f"{mt} needs an FFN or MoE block at every odd position")
    if len(set(ffns)) > 1 or len(set(moes)) > 1:
        raise ExportError(f"{mt} needs the same FFN and MoE shape in every layer")
    act = None
    if ffns:
        f0 = ffns[0]
        if not f0.gated or (f0.bias and mt != "llama"):
            raise ExportError(f"{mt} FFN is gated (SwiGLU) without bias")
        out["intermediate_size"] = f0.width
        act = f0.activation
        if mt == "llama":
            out["mlp_bias"] = f0.bias
    if mt in LLAMA_LIKE:
        if moes:
            raise ExportError(f"{mt} has no MoE blocks")
    else:
        if not moes:
            raise ExportError(f"{mt} needs MoE blocks")
        m0 = moes[0]
        if not m0.gated or m0.router != "softmax" or m0.router_bias or m0.latent_size \
                or m0.routed_scaling != 1.0:
            raise ExportError(f"{mt} experts are SwiGLU with a plain softmax router")
        if act is not None and act != m0.activation:
            raise ExportError(f"{mt} has one activation")
        act = m0.activation
        out["num_experts_per_tok"] = m0.top_k
        if mt == "mixtral":
            if ffns or m0.shared_width or not m0.norm_topk:
                raise ExportError("mixtral has only MoE layers, no shared expert")
            out.update(num_local_experts=m0.num_experts, intermediate_size=m0.expert_width)
        else:
            if mt == "qwen3_moe" and m0.shared_width:
                raise ExportError("qwen3_moe has no shared expert")
            if m0.shared_gate != bool(m0.shared_width):
                raise ExportError(f"{mt} gates its shared expert")
            out.update(num_experts=m0.num_experts, moe_intermediate_size=m0.expert_width,
                       norm_topk_prob=m0.norm_topk, decoder_sparse_step=1,
                       mlp_only_layers=[i for i, m in enumerate(mlps) if isinstance(m, FFN)])
            if mt == "qwen2_moe":
                out["shared_expert_intermediate_size"] = m0.shared_width
            if ffns:
                out["intermediate_size"] = ffns[0].width
    out["hidden_act"] = act or "silu"
    return out


def _nemotron_fields(b: _Block, h: int) -> dict[str, Any]:
    """The Nemotron-H config keys that describe one block (extensions included)."""
    if isinstance(b, Mamba):
        return {"mamba_num_heads": b.num_heads, "mamba_head_dim": b.head_dim,
                "ssm_state_size": b.state_size, "n_groups": b.n_groups,
                "conv_kernel": b.conv_kernel, "use_conv_bias": b.conv_bias,
                "use_bias": b.proj_bias, "mamba_proj_bias": b.proj_bias}
    if isinstance(b, Attention):
        return {"num_attention_heads": b.num_heads, "num_key_value_heads": b.num_kv_heads,
                "head_dim": b.head_dim, "sliding_window": b.sliding_window,
                "attention_bias": b.qkv_bias, "attention_o_bias": b.o_bias,
                "use_rope": b.rope, "qk_norm": b.qk_norm}
    if isinstance(b, MoE):
        return {"n_routed_experts": b.num_experts, "num_experts_per_tok": b.top_k,
                "moe_intermediate_size": b.expert_width,
                "moe_shared_expert_intermediate_size": b.shared_width, "n_shared_experts": 1,
                "moe_latent_size": b.latent_size, "moe_gated": b.gated,
                "mlp_hidden_act": b.activation, "moe_router": b.router,
                "moe_router_bias": b.router_bias, "norm_topk_prob": b.norm_topk,
                "routed_scaling_factor": b.routed_scaling, "moe_shared_gate": b.shared_gate,
                "mlp_bias": False}
    if isinstance(b, FFN):
        return {"intermediate_size": b.width, "mlp_gated": b.gated,
                "mlp_hidden_act": b.activation, "mlp_bias": b.bias}
    return {}


_BLOCK_TYPE = {"mamba": "mamba", "attention": "attention", "moe": "moe", "ffn": "mlp",
               "linear": "linear", "noop": "noop"}


def _nemotron_defaults(arch: ModelArch) -> dict[str, Any]:
    """Top-level defaults: per key, the most common value over the blocks that set it (ties
    go to the first seen), so per-block overrides are as few as possible."""
    seen: dict[str, Counter[str]] = {}
    values: dict[str, dict[str, Any]] = {}
    for b in (*arch.blocks, *arch.mtp_blocks):
        for k, v in _nemotron_fields(b, arch.hidden_size).items():
            j = json.dumps(v)
            seen.setdefault(k, Counter())[j] += 1
            values.setdefault(k, {}).setdefault(j, v)
    return {k: values[k][c.most_common(1)[0][0]] for k, c in seen.items()}


def _export_nemotron_h(arch: ModelArch) -> dict[str, Any]:
    h = arch.hidden_size
    top = _nemotron_defaults(arch)
    for b in arch.blocks:
        if b.kind not in ("mamba", "attention", "moe", "ffn"):
            raise ExportError("nemotron_h has only mamba, attention, moe and mlp blocks")
        if any(top[k] != v for k, v in _nemotron_fields(b, h).items()):
            raise ExportError("nemotron_h needs one shape per block kind")
    out = _base(arch, "nemotron_h", "layer_norm_epsilon")
    _time_step_fields(arch, out)
    out.update({k: v for k, v in top.items() if v is not None or k == "moe_latent_size"})
    out["num_hidden_layers"] = len(arch.blocks)
    out["hybrid_override_pattern"] = "".join(_PATTERN_INV[_BLOCK_TYPE[b.kind]]
                                             for b in arch.blocks)
    _export_mtp_pattern(arch, out)
    return out


def _time_step_fields(arch: ModelArch, out: dict[str, Any]) -> None:
    """A model built here without an HF config has no Mamba time-step clamp: say so
    explicitly (transformers would otherwise clamp at its default ``time_step_min`` 0.001)."""
    if any(b.kind == "mamba" for b in (*arch.blocks, *arch.mtp_blocks)):
        out.setdefault("time_step_min", 0.0)


def _export_mtp_pattern(arch: ModelArch, out: dict[str, Any]) -> None:
    if not arch.mtp_blocks:
        out["num_nextn_predict_layers"] = 0
        return
    if any(b.kind not in ("mamba", "attention", "moe", "ffn") for b in arch.mtp_blocks):
        raise ExportError("nemotron_h MTP blocks are mamba, attention, moe or mlp")
    h = arch.hidden_size
    if any(any(out.get(k) != v for k, v in _nemotron_fields(b, h).items())
           for b in arch.mtp_blocks):
        raise ExportError("nemotron_h MTP blocks share the model's block shapes")
    pat = "".join(_PATTERN_INV[_BLOCK_TYPE[b.kind]] for b in arch.mtp_blocks)
    out["num_nextn_predict_layers"] = 1
    out["mtp_hybrid_override_pattern"] = pat


def _export_nemotron_h_puzzle(arch: ModelArch) -> dict[str, Any]:
    h = arch.hidden_size
    top = _nemotron_defaults(arch)
    out = _base(arch, "nemotron_h_puzzle", "layer_norm_epsilon")
    _time_step_fields(arch, out)
    for k in ("hybrid_override_pattern", "mtp_hybrid_override_pattern",
              "num_nextn_predict_layers"):
        out.pop(k, None)
    out.update(top)
    out["num_hidden_layers"] = len(arch.blocks)

    def entries(blocks: tuple[_Block, ...]) -> list[dict[str, Any]]:
        res = []
        for b in blocks:
            e: dict[str, Any] = {"block_type": _BLOCK_TYPE[b.kind]}
            e.update({k: v for k, v in _nemotron_fields(b, h).items() if top.get(k) != v})
            res.append(e)
        return res

    out["block_configs"] = entries(arch.blocks)
    if all(b.kind in ("mamba", "attention", "moe", "ffn") for b in arch.blocks):
        out["hybrid_override_pattern"] = "".join(_PATTERN_INV[_BLOCK_TYPE[b.kind]]
                                                 for b in arch.blocks)
    if arch.mtp_blocks:
        out["mtp_block_configs"] = entries(arch.mtp_blocks)
    return out


def _ffn_mult_for(width: int, hidden: int) -> tuple[float, bool]:
    """An ``ffn_mult`` for ``width`` and whether it reproduces the width exactly."""
    mult = round(3 * width / (2 * hidden), 6)
    for cand in (mult, round(mult, 4), round(mult, 2)):
        if _ffn_width_from_mult(cand, hidden) == width:
            return cand, True
    return mult, False


def _export_decilm(arch: ModelArch) -> dict[str, Any]:
    h = arch.hidden_size
    pairs = _pairs(arch, "nemotron-nas")
    heads = {b.num_heads for a, _ in pairs for b in [a] if isinstance(b, Attention)}
    dims = {b.head_dim for a, _ in pairs for b in [a] if isinstance(b, Attention)}
    acts = {b.activation for _, b in pairs if isinstance(b, FFN)}
    if len(heads) > 1 or len(dims) > 1 or len(acts) > 1:
        raise ExportError("nemotron-nas needs one query-head count, head dim and activation")
    out = _base(arch, "nemotron-nas", "rms_norm_eps")
    out["num_attention_heads"] = next(iter(heads), arch.hf_extra.get("num_attention_heads", 1))
    if dims:
        out["head_dim"] = next(iter(dims))
    out["hidden_act"] = next(iter(acts), "silu")
    confs = []
    for a, f in pairs:
        ac: dict[str, Any]
        if isinstance(a, NoOp):
            ac = {"no_op": True, "replace_with_linear": False, "n_heads_in_group": None}
        elif isinstance(a, Linear):
            ac = {"no_op": False, "replace_with_linear": True, "n_heads_in_group": None}
        elif isinstance(a, Attention):
            if not a.rope or a.qk_norm or a.qkv_bias or a.o_bias:
                raise ExportError("nemotron-nas attention uses RoPE, no q/k norm, no bias")
            ac = {"no_op": False, "replace_with_linear": False,
                  "n_heads_in_group": a.num_heads // a.num_kv_heads,
                  "window_length": a.sliding_window}
        else:
            raise ExportError("nemotron-nas needs attention, linear or no-op at even positions")
        fc: dict[str, Any]
        if isinstance(f, NoOp):
            fc = {"no_op": True, "replace_with_linear": False, "ffn_mult": None}
        elif isinstance(f, Linear):
            fc = {"no_op": False, "replace_with_linear": True, "ffn_mult": None}
        elif isinstance(f, FFN):
            if not f.gated or f.bias:
                raise ExportError("nemotron-nas FFN is gated without bias")
            mult, exact = _ffn_mult_for(f.width, h)
            fc = {"no_op": False, "replace_with_linear": False, "ffn_mult": mult}
            if not exact:
                fc["intermediate_size"] = f.width
        else:
            raise ExportError("nemotron-nas needs FFN, linear or no-op at odd positions")
        confs.append({"attention": ac, "ffn": fc})
    out["num_hidden_layers"] = len(confs)
    out["block_configs"] = confs
    return out


_EXPORTERS = {
    **{mt: (lambda a, mt=mt: _export_llama_like(a, mt)) for mt in LLAMA_LIKE + MOE_LIKE},
    "nemotron_h": _export_nemotron_h,
    "nemotron_h_puzzle": _export_nemotron_h_puzzle,
    "nemotron-nas": _export_decilm,
}
