"""What every HF config dialect shares: a typed reader whose errors name the file and the
field, the common top-level fields (hidden size, vocabulary, norm epsilon, RoPE), the refusal
of numerics-changing fields no dialect computes, and the common head of an exported config.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from pydantic import TypeAdapter, ValidationError

from hwprofiles.errors import InputError, first_error
from nas.arch import MAX_BLOCKS, MAX_CONTEXT, Block, BlockConfig, ModelArch, cap_of
from nas.hf.registry import ExportError, dialect
from nas.kinds import spec_of

MISSING = object()
"""The default of a required field (``None`` means optional)."""
MAX_CONFIG_INT = 2**53
"""Any integer field: the largest every JSON reader and float64 hold exactly."""
_INT_CAPS: dict[str, tuple[int, str]] = {
    "num_hidden_layers": (MAX_BLOCKS, "MAX_BLOCKS: 16x the deepest published LLM"),
    "num_nextn_predict_layers": (MAX_BLOCKS, "MAX_BLOCKS: 16x the deepest published LLM"),
    "max_position_embeddings": (MAX_CONTEXT, "MAX_CONTEXT: the largest int32 position"),
    "num_attention_heads": cap_of("num_heads"),  # type: ignore[dict-item]  # these fields have caps (cap_of returns None only for uncapped ones)
    "hidden_size": cap_of("hidden_size"),  # type: ignore[dict-item]  # these fields have caps (cap_of returns None only for uncapped ones)
    "vocab_size": cap_of("vocab_size"),  # type: ignore[dict-item]  # these fields have caps (cap_of returns None only for uncapped ones)
}


def show_value(v: Any) -> str:
    """A value for a message: huge integers by their size, not their 400 digits."""
    if isinstance(v, int) and not isinstance(v, bool) and abs(v) >= 10**15:
        return f"a {len(str(abs(v)))}-digit integer"
    if isinstance(v, int) and not isinstance(v, bool):
        return f"{v:,}"
    if isinstance(v, float):
        return f"{v:.6g}"
    return repr(v)


def head_dim_of(r: Reader, hidden: int, heads: int) -> int:
    """``head_dim``, or hidden / heads when the config leaves it out (then it must divide)."""
    d = r.int("head_dim", None)
    if d:
        return int(d)
    if hidden % heads:
        raise r.err("num_attention_heads", f"{heads} does not divide hidden_size {hidden} "
                    "and no head_dim is given (expected hidden_size = heads x head size)")
    return hidden // heads


class Reader:
    """Typed access to a config dict; errors name the file and the field; tracks used keys."""

    def __init__(self, cfg: dict[str, Any], source: str, prefix: str = ""):
        self.cfg, self.source, self.prefix = cfg, source, prefix
        self.used: set[str] = set()

    def err(self, key: str, msg: str) -> InputError:
        return InputError(msg, path=self.source, field=f"{self.prefix}{key}")

    def raw(self, key: str, default: Any = MISSING) -> Any:
        self.used.add(key)
        if key not in self.cfg or self.cfg[key] is None:
            if default is MISSING:
                raise self.err(key, "missing required field")
            return default
        return self.cfg[key]

    def int(self, key: str, default: Any = MISSING, minimum: int = 1) -> Any:
        v = self.raw(key, default)
        if v is None or (v is default and default is not MISSING):
            return v
        if isinstance(v, bool) or not isinstance(v, int | float) or \
                (isinstance(v, float) and not math.isfinite(v)) or v != int(v):
            raise self.err(key, f"expected an integer, got {v!r}")
        if v < minimum:
            raise self.err(key, f"expected an integer >= {minimum}, got {v!r}")
        cap = _INT_CAPS.get(key, (MAX_CONFIG_INT, "exact in float64 and in JSON readers"))
        if v > cap[0]:
            raise self.err(key, f"expected at most {cap[0]:,} ({cap[1]}), got {show_value(v)}")
        return int(v)

    def float(self, key: str, default: Any = MISSING) -> Any:
        v = self.raw(key, default)
        if v is None and default is None:
            return None
        if isinstance(v, bool) or not isinstance(v, int | float) or \
                (isinstance(v, int) and abs(v) > MAX_CONFIG_INT) or not math.isfinite(v):
            raise self.err(key, f"expected a finite number, got {show_value(v)}")
        return float(v)

    def bool(self, key: str, default: Any = MISSING) -> bool:
        v = self.raw(key, default)
        if not isinstance(v, bool):
            raise self.err(key, f"expected true or false, got {v!r}")
        return v

    def str(self, key: str, default: Any = MISSING) -> str:
        v = self.raw(key, default)
        if not isinstance(v, str):
            raise self.err(key, f"expected a string, got {v!r}")
        return v


def make_block(cls: type[BlockConfig], r: Reader, **kw: Any) -> BlockConfig:
    try:
        return cls(**kw)
    except ValidationError as exc:
        raise InputError(f"invalid {cls.__name__.lower()} block: {first_error(exc)[1]}",
                         path=r.source,
                         field=r.prefix.rstrip(".") or None) from None


def common_fields(r: Reader, eps_key: str, eps_default: float, mt: str) -> dict[str, Any]:
    refuse_unsupported(r)
    theta, scaling = read_rope(r, mt)
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


def refuse_unsupported(r: Reader) -> None:
    for key, neutral in _UNSUPPORTED_NUMERIC.items():
        if key in r.cfg:
            r.used.add(key)
            if r.cfg[key] not in neutral:
                raise r.err(key, f"{r.cfg[key]!r} changes the numerics in a way this library "
                            "does not compute (supported: absent"
                            + "".join(f" or {v!r}" for v in neutral if v is not None) + ")")


def read_rope(r: Reader, mt: str) -> tuple[float, dict[str, Any] | None]:
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
    sub = Reader(params, r.source, prefix=f"{key}.")
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
            orig = Reader(r.cfg, r.source).int("max_position_embeddings")
        out["original_max_position_embeddings"] = Reader(
            {"original_max_position_embeddings": orig}, r.source, f"{key}.").int(
            "original_max_position_embeddings")
    if kind == "yarn":
        factor = sub.float("factor", None)
        if factor is None:
            factor = Reader(r.cfg, r.source).int("max_position_embeddings") / out["original_max_position_embeddings"]
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


HYBRID_ATTENTION_TYPES: set[str] = {"qwen3_next", "qwen3_5_moe_text", "qwen3_5_moe"}
"""Dialects whose writer holds zero-centred norms, gated attention and partial rotary;
:func:`base_config` refuses those features for every other type (they would be silently
dropped). The linear-attention blocks of these dialects are a registered kind, refused by
its own ``hf_dialects``."""


def _refuse_hybrid_features(arch: ModelArch, mt: str) -> None:
    from nas.arch import Attention

    if mt in HYBRID_ATTENTION_TYPES:
        return
    if arch.norm_unit_offset:
        raise ExportError(f"{mt} has no zero-centred (1 + weight) norms")
    for i, b in enumerate((*arch.blocks, *arch.mtp_blocks)):
        if isinstance(b, Attention) and (b.output_gate or b.rope_dim is not None):
            raise ExportError(f"{mt} has no gated / partial-rotary attention (block {i})")


DEEPSEEK_GPT_OSS_TYPES: set[str] = {"deepseek_v3", "deepseek_v3_puzzle", "kimi_k2", "gpt_oss",
                                     "gpt_oss_puzzle"}
"""Dialects whose writers hold (or check) attention sinks, group-limited routing and
gpt-oss's biased MoE with clamped SwiGLU; :func:`base_config` refuses those features for
every other type (they would be silently dropped). DeepSeek's latent attention is a
registered kind, refused by its own ``hf_dialects``."""


def _refuse_deepseek_gpt_oss_features(arch: ModelArch, mt: str) -> None:
    from nas.arch import Attention, MoE

    if mt in DEEPSEEK_GPT_OSS_TYPES:
        return
    for i, b in enumerate((*arch.blocks, *arch.mtp_blocks)):
        if isinstance(b, Attention) and b.sinks:
            raise ExportError(f"{mt} has no attention sinks (block {i})")
        if isinstance(b, MoE) and (b.n_group > 1 or b.router_linear_bias or b.expert_bias
                                   or b.swiglu_limit is not None):
            raise ExportError(f"{mt} has no group-limited routing, biased router or experts, "
                              f"or clamped SwiGLU (block {i})")


def read_kv_heads(r: Reader, heads: int, absent: int) -> int:
    """``num_key_value_heads`` as transformers' ``JambaConfig`` / ``FalconH1Config`` read it:
    ``absent`` (their class default, 8) when the field is left out, ``heads`` (multi-head
    attention) when it is null."""
    r.used.add("num_key_value_heads")
    if "num_key_value_heads" not in r.cfg:
        return absent
    return heads if r.cfg["num_key_value_heads"] is None else r.int("num_key_value_heads")


def read_multiplier(r: Reader, key: str, default: float) -> float:
    """A scalar numerics multiplier (Granite's and Falcon-H1's): absent, ``default``, the
    transformers config class's default, which transformers itself computes with for such a
    config; an explicit ``null`` is refused naming ``key`` (transformers keeps ``None`` there
    and cannot run the model); anything else must be a finite number."""
    if key in r.cfg and r.cfg[key] is None:
        r.used.add(key)
        raise r.err(key, f"null; expected a number (leave the field out for transformers' "
                    f"default {default})")
    return float(r.float(key, default))


def hf_float(v: Any) -> Any:
    """``v`` with transformers 5.x's spelling of a non-finite float
    (``{"__float__": "Infinity"}``) decoded; anything else as it is."""
    if isinstance(v, dict) and set(v) == {"__float__"}:
        try:
            return float(v["__float__"])
        except (TypeError, ValueError):
            return v
    return v


def hf_floats(v: Any) -> Any:
    """:func:`hf_float` through a config's nested dicts and lists (what transformers' file
    loader decodes; a config built in memory must carry the floats themselves)."""
    if isinstance(v, dict) and set(v) != {"__float__"}:
        return {k: hf_floats(x) for k, x in v.items()}
    if isinstance(v, list):
        return [hf_floats(x) for x in v]
    return hf_float(v)


def read_time_step_limit(r: Reader) -> dict[str, Any]:
    """``{"time_step_limit": [low, high]}`` (the Mamba-2 time-step clamp of ``falcon_h1`` and
    ``granitemoehybrid``, on softplus(dt), dimensionless; transformers 5 writes an infinite
    ``high`` as ``{"__float__": "Infinity"}``, the only spelling its config loader decodes),
    empty when the config gives none or the default ``[0, inf]`` (no clamp)."""
    lim = r.raw("time_step_limit", None)
    if lim is None:
        return {}
    if isinstance(lim, list | tuple):
        lim = [math.inf if isinstance(v, dict) and v == {"__float__": "Infinity"} else v
               for v in lim]
    if not (isinstance(lim, list) and len(lim) == 2 and all(
            isinstance(v, int | float) and not isinstance(v, bool) for v in lim)
            and 0 <= lim[0] <= lim[1]):
        raise r.err("time_step_limit", "expected [low, high] with 0 <= low <= high, got "
                    f"{r.cfg['time_step_limit']!r}")
    out = [float(lim[0]), float(lim[1])]
    return {} if out == [0.0, math.inf] else {"time_step_limit": out}


PARALLEL_TYPES: set[str] = {"falcon_h1"}
"""Dialects whose writer holds parallel attention + Mamba blocks and Falcon-H1's muP
multipliers; :func:`base_config` refuses them for every other type (they would be silently
dropped)."""


def _refuse_parallel_features(arch: ModelArch, mt: str) -> None:
    from nas.arch import Parallel

    if mt in PARALLEL_TYPES:
        return
    if arch.mup is not None:
        raise ExportError(f"{mt} has no muP multipliers (Falcon-H1's)")
    for i, b in enumerate((*arch.blocks, *arch.mtp_blocks)):
        if isinstance(b, Parallel):
            raise ExportError(f"{mt} has no parallel attention + Mamba blocks (block {i})")


def _refuse_registered_kinds(arch: ModelArch, mt: str) -> None:
    """A registered kind (:mod:`nas.kinds`) that names the dialects holding it is refused
    for every other type (its tensors and numerics have no place there)."""
    for i, b in enumerate((*arch.blocks, *arch.mtp_blocks)):
        k = spec_of(b)
        if k is not None and k.hf_dialects and mt not in k.hf_dialects:
            raise ExportError(f"{mt} has no {k.title} blocks (block {i}; "
                              f"{', '.join(sorted(k.hf_dialects))} has)")


def base_config(arch: ModelArch, mt: str, eps_key: str) -> dict[str, Any]:
    _refuse_hybrid_features(arch, mt)
    _refuse_registered_kinds(arch, mt)
    _refuse_deepseek_gpt_oss_features(arch, mt)
    _refuse_parallel_features(arch, mt)
    out: dict[str, Any] = {"architectures": [dialect(mt).architecture], "model_type": mt}
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


def layer_pairs(arch: ModelArch, mt: str) -> list[tuple[BlockConfig, BlockConfig]]:
    b = arch.blocks
    if len(b) % 2:
        raise ExportError(f"{mt} needs (attention, mlp) pairs; got an odd number of blocks")
    return [(b[i], b[i + 1]) for i in range(0, len(b), 2)]


_BLOCK_ADAPTER: TypeAdapter[Any] = TypeAdapter(Block)


def write_puzzle_layers(out: dict[str, Any], mixers: Sequence[BlockConfig],
                        mlps: Sequence[BlockConfig], stock: bool) -> dict[str, Any]:
    """Set ``out["puzzle_layers"]`` (one ``{"mixer", "mlp"}`` pair of block JSON per layer)
    unless the stock keys of the dialect describe every layer (``stock``), in which case any
    carried-over ``puzzle_layers`` is dropped; returns ``out``. The writer side of
    :func:`read_puzzle_layers`."""
    out.pop("puzzle_layers", None)
    if not stock:
        out["puzzle_layers"] = [{"mixer": x.model_dump(), "mlp": y.model_dump()}
                                for x, y in zip(mixers, mlps)]
    return out


def read_puzzle_layers(r: Reader, layers: Any, n: int) -> list[BlockConfig]:
    """The ``puzzle_layers`` extension (``qwen3_next``, ``qwen3_5_moe*``,
    ``granitemoehybrid``, ``jamba``, ``falcon_h1``): a heterogeneous child as ``n`` layers
    of ``{"mixer", "mlp"}`` block objects; errors name the layer, the part and the field."""
    if not isinstance(layers, list) or len(layers) != n:
        raise r.err("puzzle_layers", f"expected a list of {n} layers (num_hidden_layers)")
    out: list[BlockConfig] = []
    for i, layer in enumerate(layers):
        if not isinstance(layer, dict) or set(layer) != {"mixer", "mlp"}:
            raise r.err(f"puzzle_layers[{i}]", "expected an object with keys mixer and mlp")
        for part in ("mixer", "mlp"):
            try:
                out.append(_BLOCK_ADAPTER.validate_python(layer[part]))
            except ValidationError as exc:
                loc, msg = first_error(exc)
                raise r.err(f"puzzle_layers[{i}].{part}" + (f".{loc}" if loc else ""),
                            msg) from None
    return out
