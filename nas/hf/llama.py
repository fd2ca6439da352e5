"""The llama-like dialects: ``llama``, ``mistral``, ``qwen2``, ``qwen3`` (dense: attention +
gated FFN per layer) and ``mixtral``, ``qwen2_moe``, ``qwen3_moe`` (MoE layers, optionally
with dense layers by ``mlp_only_layers``). One attention and one MLP shape for every layer.
"""

from __future__ import annotations

from typing import Any

from nas.arch import FFN, Attention, BlockConfig, ModelArch, MoE
from nas.hf.common import (
    MISSING,
    Reader,
    base_config,
    common_fields,
    head_dim_of,
    layer_pairs,
    make_block,
)
from nas.hf.registry import Dialect, ExportError, register

LLAMA_LIKE = ("llama", "mistral", "qwen2", "qwen3")
MOE_LIKE = ("mixtral", "qwen2_moe", "qwen3_moe")
_ARCHITECTURES = {
    "llama": "LlamaForCausalLM", "mistral": "MistralForCausalLM", "qwen2": "Qwen2ForCausalLM",
    "qwen3": "Qwen3ForCausalLM", "mixtral": "MixtralForCausalLM",
    "qwen2_moe": "Qwen2MoeForCausalLM", "qwen3_moe": "Qwen3MoeForCausalLM",
}


def _windows(r: Reader, mt: str, n: int) -> list[int | None]:
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


def _experts(r: Reader) -> int:
    """The routed-expert count under either name (``num_local_experts`` is what mixtral and
    transformers 5.x qwen3_moe write, ``num_experts`` what qwen*_moe 4.x wrote)."""
    a, b = r.cfg.get("num_local_experts"), r.cfg.get("num_experts")
    r.used.update({"num_local_experts", "num_experts"})
    if a is not None and b is not None and a != b:
        raise r.err("num_experts", f"is {b} but num_local_experts is {a}")
    return r.int("num_local_experts") if a is not None else r.int("num_experts")


def _import_llama_like(r: Reader, mt: str) -> tuple[list[BlockConfig], dict[str, Any]]:
    kw = common_fields(r, "rms_norm_eps", 1e-5 if mt == "mixtral" else 1e-6, mt)
    h = kw["hidden_size"]
    n = r.int("num_hidden_layers")
    heads = r.int("num_attention_heads")
    kv = r.int("num_key_value_heads", heads)
    head_dim = head_dim_of(r, h, heads)
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
    inter = r.int("intermediate_size", None if mt in MOE_LIKE else MISSING)

    moe_layers: set[int] = set()
    moe: BlockConfig | None = None
    if mt == "mixtral":
        moe = make_block(MoE, r, num_experts=_experts(r),
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
        moe = make_block(MoE, r, num_experts=n_exp, top_k=r.int("num_experts_per_tok"),
                     expert_width=r.int("moe_intermediate_size"), shared_width=shared,
                     shared_gate=bool(shared), activation=act,
                     norm_topk=r.bool("norm_topk_prob", False))
        moe_layers = {i for i in range(n) if i not in mlp_only and (i + 1) % step == 0}
    if len(moe_layers) < n and inter is None:
        raise r.err("intermediate_size", "missing required field (dense layers need it)")

    blocks: list[BlockConfig] = []
    for i in range(n):
        blocks.append(make_block(Attention, r, num_heads=heads, num_kv_heads=kv, head_dim=head_dim,
                             sliding_window=windows[i], rope=True, qk_norm=qk_norm,
                             qkv_bias=qkv_bias, o_bias=o_bias))
        if i in moe_layers:
            blocks.append(moe)  # type: ignore[arg-type]  # moe_layers is non-empty only when moe is set
        else:
            blocks.append(make_block(FFN, r, width=inter, gated=True, activation=act, bias=mlp_bias))
    return blocks, kw



def _export_llama_like(arch: ModelArch, mt: str) -> dict[str, Any]:
    pairs = layer_pairs(arch, mt)
    atts = [a for a, _ in pairs]
    mlps = [m for _, m in pairs]
    if not all(isinstance(a, Attention) for a in atts):
        raise ExportError(f"{mt} needs an attention block at every even position")
    a0: Attention = atts[0]  # type: ignore[assignment]  # checked to be Attention blocks just above
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
    out = base_config(arch, mt, "rms_norm_eps")
    out.update(num_hidden_layers=len(pairs), num_attention_heads=a0.num_heads,
               num_key_value_heads=a0.num_kv_heads, head_dim=a0.head_dim)
    if mt not in ("qwen2", "qwen2_moe", "mistral", "mixtral"):
        out["attention_bias"] = a0.qkv_bias
    windows = [a.sliding_window for a in atts]  # type: ignore[attr-defined]  # checked to be Attention blocks just above
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


def _read(r: Reader, mt: str) -> tuple[list[BlockConfig], list[BlockConfig], dict[str, Any]]:
    blocks, kw = _import_llama_like(r, mt)
    return blocks, [], kw


for _mt in LLAMA_LIKE + MOE_LIKE:
    register(Dialect(model_type=_mt, architecture=_ARCHITECTURES[_mt], read=_read,
                     write=_export_llama_like))
