"""The Nemotron-H dialects: ``nemotron_h`` (one shape per block kind, a block pattern) and
``nemotron_h_puzzle`` (per-block ``block_configs``: any sequence of block kinds and shapes).

``nemotron_h_puzzle`` is NVIDIA's format for its Puzzle children (Nemotron-Labs-3-Puzzle-75B):
per-block entries of ``block_type`` plus the keys of :data:`PUZZLE_BLOCK_KEYS`, every MoE entry
carrying ``n_routed_experts``, ``num_experts_per_tok``, ``moe_intermediate_size`` and
``moe_shared_expert_intermediate_size`` and every MLP entry ``intermediate_size``
(:data:`PUZZLE_BLOCK_REQUIRED`; written even when equal to the top-level value). Other keys
are written per block only where a block differs from the top level.

Extensions this library writes and reads in ``nemotron_h_puzzle`` (documented so that other
tools can ignore them safely): ``block_type`` may also be ``"linear"`` or ``"noop"``;
per-block keys ``use_rope``, ``qk_norm``, ``attention_o_bias``, ``moe_gated``, ``moe_router``,
``moe_router_bias``, ``moe_shared_gate`` and ``mlp_gated`` describe blocks that stock
Nemotron-H does not have; per-block attention heads / KV heads and Mamba shapes are written
as per-block overrides of the top-level keys. NVIDIA's config class refuses all of these
(:func:`puzzle_schema_problems` lists them for a config); such a child loads here and through
the modeling code saved into its folder (:mod:`nas.hf.remote`).
"""

from __future__ import annotations

import json
import math
from collections import Counter
from typing import Any

from nas.arch import FFN, Attention, BlockConfig, Linear, Mamba, ModelArch, MoE, NoOp
from nas.hf.common import (
    Reader,
    base_config,
    common_fields,
    head_dim_of,
    hf_float,
    make_block,
)
from nas.hf.registry import Dialect, ExportError, register

NEMOTRON_H = ("nemotron_h", "nemotron_h_puzzle")
_PATTERN = {"M": "mamba", "E": "moe", "*": "attention", "-": "mlp"}
_PATTERN_INV = {v: k for k, v in _PATTERN.items()}


def _nemotron_block(btype: str, r: Reader, h: int) -> BlockConfig:
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
        return make_block(Mamba, r, num_heads=r.int("mamba_num_heads"),
                      head_dim=r.int("mamba_head_dim"), state_size=r.int("ssm_state_size"),
                      n_groups=_alias(r, "n_groups", "mamba_n_groups", 8),
                      conv_kernel=_alias(r, "conv_kernel", "mamba_d_conv", 4),
                      conv_bias=_alias(r, "use_conv_bias", "mamba_conv_bias", True),
                      proj_bias=bias)
    if btype == "attention":
        heads = r.int("num_attention_heads")
        qkv_bias = r.bool("attention_bias", False)
        return make_block(Attention, r, num_heads=heads, num_kv_heads=r.int("num_key_value_heads"),
                      head_dim=head_dim_of(r, h, heads),
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
        return make_block(MoE, r, num_experts=r.int("n_routed_experts"),
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
        return make_block(FFN, r, width=r.int("intermediate_size"), gated=r.bool("mlp_gated", False),
                      activation=r.str("mlp_hidden_act", "relu2"), bias=r.bool("mlp_bias", False))
    if btype == "linear":
        return Linear()
    if btype == "noop":
        return NoOp()
    raise r.err("block_type", f"unknown block_type {btype!r}; expected mamba, attention, "
                "moe, mlp, linear or noop")


def _alias(r: Reader, key: str, old: str, default: Any) -> Any:
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


def _time_step(r: Reader) -> dict[str, Any]:
    """Mamba time-step clamp fields (both spellings), as ``{"time_step_min": lo,
    "time_step_limit": [lo, hi]}`` (``hi`` may be ``inf``)."""
    lo_min = Reader({"time_step_min": r.cfg.get("mamba_dt_min", r.cfg.get("time_step_min"))},
                     r.source).float("time_step_min", 0.001)
    r.used.update({"time_step_min", "mamba_dt_min"})
    key = "mamba_dt_limit" if r.cfg.get("mamba_dt_limit") is not None else "time_step_limit"
    lim = r.raw(key, [0.0, math.inf])
    r.used.update({"time_step_limit", "mamba_dt_limit"})
    lim = [hf_float(v) for v in lim] if isinstance(lim, list | tuple) else lim
    if not (isinstance(lim, list) and len(lim) == 2 and all(
            isinstance(v, int | float) and not isinstance(v, bool) for v in lim)
            and 0 <= lim[0] <= lim[1]):
        raise r.err(key, f"expected [low, high] with 0 <= low <= high, got {r.cfg[key]!r}")
    if lo_min < 0:
        raise r.err("time_step_min", f"expected a number >= 0, got {lo_min}")
    return {"time_step_min": lo_min, "time_step_limit": [float(lim[0]), float(lim[1])]}


_LAYER_TYPES = {"linear_attention": "mamba", "mamba": "mamba", "full_attention": "attention",
                "attention": "attention", "moe": "moe", "mlp": "mlp"}


def _import_nemotron_h(r: Reader, mt: str) -> tuple[list[BlockConfig], list[BlockConfig], dict[str, Any]]:
    kw = common_fields(r, "layer_norm_epsilon", 1e-5, mt)
    h = kw["hidden_size"]
    cfg = r.cfg

    def build(types: list[str], overrides: list[dict[str, Any]], field: str) -> list[BlockConfig]:
        out = []
        for i, (t, ov) in enumerate(zip(types, overrides)):
            sub = Reader({**cfg, **ov}, r.source,
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

    mtp: list[BlockConfig] = []
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


def _nemotron_fields(b: BlockConfig, h: int) -> dict[str, Any]:
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
    out = base_config(arch, "nemotron_h", "layer_norm_epsilon")
    _time_step_fields(arch, out)
    out.update({k: v for k, v in top.items() if v is not None or k == "moe_latent_size"})
    out["num_hidden_layers"] = len(arch.blocks)
    out["hybrid_override_pattern"] = "".join(_PATTERN_INV[_BLOCK_TYPE[b.kind]]
                                             for b in arch.blocks)
    _export_mtp_pattern(arch, out)
    return out


def _time_step_fields(arch: ModelArch, out: dict[str, Any]) -> None:
    """A model built here without an HF config has no Mamba time-step clamp: say so
    explicitly (transformers before 5.25 would otherwise clamp NemotronH at its default
    ``time_step_min`` 0.001)."""
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
    out = base_config(arch, "nemotron_h_puzzle", "layer_norm_epsilon")
    _time_step_fields(arch, out)
    for k in ("hybrid_override_pattern", "mtp_hybrid_override_pattern",
              "num_nextn_predict_layers"):
        out.pop(k, None)
    out.update(top)
    out["num_hidden_layers"] = len(arch.blocks)

    def entries(blocks: tuple[BlockConfig, ...]) -> list[dict[str, Any]]:
        res = []
        for b in blocks:
            e: dict[str, Any] = {"block_type": _BLOCK_TYPE[b.kind]}
            fields = _nemotron_fields(b, h)
            required = PUZZLE_BLOCK_REQUIRED.get(e["block_type"], ())
            e.update({k: v for k, v in fields.items() if k in required or top.get(k) != v})
            res.append(e)
        return res

    out["block_configs"] = entries(arch.blocks)
    if all(b.kind in ("mamba", "attention", "moe", "ffn") for b in arch.blocks):
        out["hybrid_override_pattern"] = "".join(_PATTERN_INV[_BLOCK_TYPE[b.kind]]
                                                 for b in arch.blocks)
    if arch.mtp_blocks:
        out["mtp_block_configs"] = entries(arch.mtp_blocks)
    return out


PUZZLE_BLOCK_REQUIRED: dict[str, tuple[str, ...]] = {
    "moe": ("n_routed_experts", "num_experts_per_tok", "moe_intermediate_size",
            "moe_shared_expert_intermediate_size"),
    "mlp": ("intermediate_size",),
}
"""Per-block keys NVIDIA's ``nemotron_h_puzzle`` config class requires (its ``MoeConfig`` and
``MlpConfig`` dataclasses have no defaults for them; SGLang's ``NemotronHPuzzleConfig``
reads ``block["n_routed_experts"]`` of every MoE block). Written in every such entry, even
when equal to the top-level value."""

PUZZLE_BLOCK_KEYS: dict[str, tuple[str, ...]] = {
    "attention": ("sliding_window",),
    "moe": (*PUZZLE_BLOCK_REQUIRED["moe"], "moe_latent_size", "routed_scaling_factor",
            "n_group", "topk_group", "norm_topk_prob"),
    "mamba": ("ssm_state_size",),
    "mlp": PUZZLE_BLOCK_REQUIRED["mlp"],
}
"""Every per-block key (besides ``block_type``) of NVIDIA's ``nemotron_h_puzzle`` config
class, by block type: its ``AttentionConfig``, ``MoeConfig``, ``MambaConfig`` and
``MlpConfig`` dataclasses, which refuse any other key (``config_class(**block_config)``).
Sources: NVIDIA's ``configuration_nemotron_h_puzzle.py`` as shipped with its Puzzle
children (the copy read is the one a vLLM DSA-converter script embeds), SGLang's
``python/sglang/srt/configs/nemotron_h.py`` (commit ``03c77dc33d0a``) and vLLM's
``vllm/model_executor/models/nemotron_h.py`` (commit ``00b08dc44519``), where only MLP and
MoE layers take a per-layer config (``get_nemotron_h_config_for_layer``); Mamba and
attention shapes come from the top level there."""


def puzzle_schema_problems(cfg: dict[str, Any]) -> list[str]:
    """Why NVIDIA's ``nemotron_h_puzzle`` config class would refuse ``cfg`` (a
    ``nemotron_h_puzzle`` config dict), one line per problem; empty when it takes it: a
    ``block_type`` it lacks (``linear``, ``noop``), a per-block key outside
    :data:`PUZZLE_BLOCK_KEYS` (this library's extensions, a per-block KV-head count or Mamba
    shape) or a required key missing."""
    out = []
    for part in ("block_configs", "mtp_block_configs"):
        for i, e in enumerate(cfg.get(part) or []):
            bt = e.get("block_type")
            if bt not in PUZZLE_BLOCK_KEYS:
                out.append(f"{part}[{i}]: block_type {bt!r} is not one of "
                           f"{', '.join(PUZZLE_BLOCK_KEYS)}")
                continue
            extra = sorted(set(e) - {"block_type", *PUZZLE_BLOCK_KEYS[bt]})
            if extra:
                out.append(f"{part}[{i}] ({bt}): keys outside NVIDIA's schema: "
                           f"{', '.join(extra)}")
            missing = [k for k in PUZZLE_BLOCK_REQUIRED.get(bt, ()) if k not in e]
            if missing:
                out.append(f"{part}[{i}] ({bt}): missing {', '.join(missing)}")
    return out


register(Dialect(model_type="nemotron_h", architecture="NemotronHForCausalLM",
                 read=_import_nemotron_h, write=lambda arch, mt: _export_nemotron_h(arch),
                 fallbacks=("nemotron_h_puzzle",)))
register(Dialect(model_type="nemotron_h_puzzle", architecture="NemotronHPuzzleForCausalLM",
                 read=_import_nemotron_h, write=lambda arch, mt: _export_nemotron_h_puzzle(arch)))
