"""The gpt-oss dialect (``gpt_oss``) and its puzzle extension ``gpt_oss_puzzle``.

``gpt_oss``: ``num_hidden_layers`` layers of (attention, MoE). Attention: grouped-query with
biases on q/k/v/o (``attention_bias``, default true), a learned sink logit per query head,
and ``sliding_window`` on the layers ``layer_types`` marks ``sliding_attention`` (default:
even layers sliding, odd layers full, as transformers derives it). MoE: a router with a bias,
softmax over the top-k router logits (= softmax over all, renormalized over the top k),
experts with biases and gpt-oss's clamped SwiGLU (``swiglu_limit``, default 7.0;
``swiglu_alpha``, default 1.702 as transformers hard-codes in 4.x). ``hidden_act`` is not
read by gpt-oss experts and is kept verbatim. RoPE must be given (``rope_theta`` and the
YaRN ``rope_scaling`` / ``rope_parameters``): transformers' defaults would otherwise change
the numerics silently. ``num_experts_per_tok`` and the legacy ``experts_per_token`` must
agree. ``quantization_config`` (MXFP4 checkpoints) is kept verbatim; the weights this library
writes are plain tensors.

``gpt_oss_puzzle``: as ``deepseek_v3_puzzle`` (:mod:`nas.hf.deepseek`), ``block_configs``
with one object per block, for children stock ``gpt_oss`` cannot hold.
"""

from __future__ import annotations

from typing import Any

from nas.arch import Attention, BlockConfig, ModelArch, MoE
from nas.hf.common import Reader, base_config, layer_pairs, make_block
from nas.hf.deepseek import model_fields, read_puzzle, write_puzzle
from nas.hf.registry import Dialect, ExportError, register

GPT_OSS = ("gpt_oss", "gpt_oss_puzzle")
SWIGLU_ALPHA = 1.702
"""transformers' gpt-oss expert activation constant (``GptOssExperts.alpha``)."""
SWIGLU_LIMIT = 7.0
"""transformers' ``swiglu_limit`` default."""


def _layer_windows(r: Reader, n: int) -> list[int | None]:
    window = r.int("sliding_window", 128, minimum=0) or None
    types = r.raw("layer_types", None)
    if types is None:
        types = ["sliding_attention" if (i + 1) % 2 else "full_attention" for i in range(n)]
    if not isinstance(types, list) or len(types) != n or not all(
            t in ("sliding_attention", "full_attention") for t in types):
        raise r.err("layer_types", f"expected a list of {n} layer types (full_attention or "
                    "sliding_attention)")
    if window is None and "sliding_attention" in types:
        raise r.err("sliding_window", "layer_types has sliding layers but no window is set")
    return [window if t == "sliding_attention" else None for t in types]


def _read_stock(r: Reader) -> tuple[list[BlockConfig], list[BlockConfig], dict[str, Any]]:
    for key in ("rope_theta",):
        if key not in r.cfg and not isinstance(r.cfg.get("rope_parameters"), dict):
            raise r.err(key, "missing required field (transformers' gpt-oss default would "
                        "apply silently)")
    if r.cfg.get("rope_scaling") is None and r.cfg.get("rope_parameters") is None:
        raise r.err("rope_scaling", "missing required field (gpt-oss uses YaRN; transformers' "
                    "default would apply silently)")
    kw = model_fields(r, "gpt_oss", 1e-5, set())
    n = r.int("num_hidden_layers")
    heads = r.int("num_attention_heads")
    bias = r.bool("attention_bias", True)
    windows = _layer_windows(r, n)
    # transformers' GptOssConfig defaults when absent: 8 KV heads, head_dim 64
    att = dict(num_heads=heads, num_kv_heads=r.int("num_key_value_heads", 8),
               head_dim=r.int("head_dim", 64), rope=True, qkv_bias=bias, o_bias=bias,
               sinks=True)
    k = r.int("num_experts_per_tok")
    legacy = r.raw("experts_per_token", None)
    if legacy is not None and legacy != k:
        raise r.err("experts_per_token", f"is {legacy!r} but num_experts_per_tok is {k}")
    moe = make_block(MoE, r, num_experts=r.int("num_local_experts"), top_k=k,
                     expert_width=r.int("intermediate_size"), gated=True,
                     router="softmax", norm_topk=True, router_linear_bias=True,
                     expert_bias=True, swiglu_limit=r.float("swiglu_limit", SWIGLU_LIMIT),
                     swiglu_alpha=r.float("swiglu_alpha", SWIGLU_ALPHA))
    blocks: list[BlockConfig] = []
    for i in range(n):
        blocks += [make_block(Attention, r, sliding_window=windows[i], **att), moe]
    return blocks, [], kw


def _read(r: Reader, mt: str) -> tuple[list[BlockConfig], list[BlockConfig], dict[str, Any]]:
    if mt == "gpt_oss":
        return _read_stock(r)
    return read_puzzle(r, mt, 1e-5)


def _write_stock(arch: ModelArch, mt: str) -> dict[str, Any]:
    pairs = layer_pairs(arch, mt)
    atts = [a for a, _ in pairs if isinstance(a, Attention)]
    if len(atts) != len(pairs):
        raise ExportError(f"{mt} needs an attention block at every even position")
    a0 = atts[0]
    if any(a.model_copy(update={"sliding_window": None}) !=
           a0.model_copy(update={"sliding_window": None}) for a in atts):
        raise ExportError(f"{mt} needs the same attention shape in every layer")
    if (not a0.sinks or not a0.rope or a0.qk_norm or a0.qkv_bias != a0.o_bias
            or a0.output_gate or a0.rope_dim is not None):
        raise ExportError(f"{mt} attention has sinks, RoPE, one bias flag and no q/k norm")
    windows = [a.sliding_window for a in atts]
    w = {x for x in windows if x}
    if len(w) > 1:
        raise ExportError(f"{mt} needs one sliding window length")
    moes = {m for _, m in pairs}
    m0 = next(iter(moes), None)
    if len(moes) != 1 or not isinstance(m0, MoE):
        raise ExportError(f"{mt} needs the same MoE block in every layer")
    if (not m0.router_linear_bias or not m0.expert_bias or m0.swiglu_limit is None
            or m0.router != "softmax" or not m0.norm_topk or m0.router_bias or m0.latent_size
            or m0.shared_width or m0.routed_scaling != 1.0 or m0.n_group != 1):
        raise ExportError(f"{mt} MoE: biased router and experts, clamped SwiGLU, softmax "
                          "top-k, no shared expert")
    out = base_config(arch, mt, "rms_norm_eps")
    out.update(num_hidden_layers=len(pairs), num_attention_heads=a0.num_heads,
               num_key_value_heads=a0.num_kv_heads, head_dim=a0.head_dim,
               attention_bias=a0.qkv_bias, sliding_window=next(iter(w), None),
               layer_types=["sliding_attention" if x else "full_attention" for x in windows],
               num_local_experts=m0.num_experts, num_experts_per_tok=m0.top_k,
               intermediate_size=m0.expert_width, swiglu_limit=m0.swiglu_limit,
               swiglu_alpha=m0.swiglu_alpha)
    out["experts_per_token"] = m0.top_k  # the legacy key gpt-oss's own configs carry
    return out


register(Dialect(model_type="gpt_oss", architecture="GptOssForCausalLM", read=_read,
                 write=_write_stock, fallbacks=("gpt_oss_puzzle",)))
register(Dialect(model_type="gpt_oss_puzzle", architecture="GptOssPuzzleForCausalLM",
                 read=_read, write=write_puzzle))
