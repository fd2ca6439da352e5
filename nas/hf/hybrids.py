"""Mamba hybrids under other config dialects: ``granitemoehybrid`` (IBM Granite-4.0-H) is
read and written (``jamba``, whose Mamba layers are Mamba-1, is :mod:`nas.hf.jamba`;
``falcon_h1``, attention and Mamba-2 in parallel within a layer, is :mod:`nas.hf.falcon_h1`).

``granitemoehybrid``: layer ``i`` is two blocks, a Mamba-2 mixer (``layer_types`` ``mamba``;
the NemotronH / Bamba layout of :class:`~nas.arch.Mamba`, ``mamba_n_heads`` x
``mamba_d_head`` with ``mamba_d_head: "auto"`` = ``mamba_expand * hidden / heads``) or
grouped-query attention (``attention``; RoPE only with ``position_embedding_type: "rope"``,
Granite-4.0-H uses none), then a MoE of ``num_local_experts`` SwiGLU experts of width
``intermediate_size`` (softmax over the top-k logits = renormalized top-k) plus an ungated
SwiGLU shared MLP of ``shared_intermediate_size`` (a dense MLP when there are no experts).
Parameters, weights, KV and state bytes and costs are exact. Granite's muP-style numerics
(``embedding_multiplier``, ``residual_multiplier``, ``logits_scaling``, the attention scale
``attention_multiplier``, each a plain factor) are kept in the config and computed by
:mod:`nas.modules.granite`; a config that leaves one out gets transformers'
``GraniteMoeHybridConfig`` default, 1.0 (so also ``attention_multiplier``: a softmax scale of
1, not ``1 / sqrt(head_dim)``), as transformers itself reads such a config, and the export
writes all four; a null one is refused by name; its fused
expert tensors (``input_linear`` / ``output_linear``) are the checkpoint layout of
:class:`nas.modules.granite.GraniteMoEMixer`. A heterogeneous child writes the
``puzzle_layers`` extension (one ``{"mixer": <block>, "mlp": <block>}`` per layer, the JSON of
the :mod:`nas.arch` configs), which stock transformers does not read (our loader does). An
architecture of another type exported as ``granitemoehybrid`` writes the four multipliers as
1 (its numerics are the identity there).

Refused at import: the types in :data:`REFUSED_TYPES` (the message says why).
"""

from __future__ import annotations

from typing import Any

from nas.arch import FFN, Attention, BlockConfig, Mamba, ModelArch, MoE
from nas.hf.common import (
    Reader,
    base_config,
    common_fields,
    head_dim_of,
    make_block,
    read_multiplier,
    read_puzzle_layers,
    read_time_step_limit,
    write_puzzle_layers,
)
from nas.hf.registry import Dialect, ExportError, register

GRANITE = "granitemoehybrid"
_MULTIPLIERS = ("embedding_multiplier", "residual_multiplier", "logits_scaling",
                "attention_multiplier")

REFUSED_TYPES: dict[str, str] = {
}
"""HF model types refused at import, with the reason (``nas.hf.from_hf`` raises it)."""


_LAYER_TYPES = {"mamba": "mamba", "linear_attention": "mamba", "attention": "attention",
                "full_attention": "attention"}


def _read(r0: Reader, mt: str) -> tuple[list[BlockConfig], list[BlockConfig], dict[str, Any]]:
    # computed by nas.modules.granite; absent: transformers' GraniteMoeHybridConfig default
    mult = {k: read_multiplier(r0, k, 1.0) for k in _MULTIPLIERS}
    # the shared reader refuses these fields for every other type; read the rest without them
    r = Reader({k: v for k, v in r0.cfg.items() if k not in _MULTIPLIERS}, r0.source,
               r0.prefix)
    try:
        blocks, mtp, kw = _read_rest(r, mt)
    finally:
        r0.used |= r.used
    kw["_extra"] = {**kw.get("_extra", {}), **mult}
    return blocks, mtp, kw


def _read_rest(r: Reader, mt: str) -> tuple[list[BlockConfig], list[BlockConfig], dict[str, Any]]:
    kw = common_fields(r, "rms_norm_eps", 1e-6, mt)
    h = kw["hidden_size"]
    n = r.int("num_hidden_layers", 32)
    types = r.raw("layer_types", None)
    if types is None:
        types = ["mamba"] * n
    if not isinstance(types, list) or len(types) != n or \
            not all(isinstance(t, str) and t in _LAYER_TYPES for t in types):
        raise r.err("layer_types", f"expected a list of {n} layer types (mamba or attention; "
                    "transformers 5 spells them linear_attention, full_attention)")
    types = [_LAYER_TYPES[t] for t in types]
    kw["_extra"] = {**kw.get("_extra", {}), **read_time_step_limit(r)}
    pe = r.raw("position_embedding_type", None)
    if pe not in (None, "nope", "rope"):
        raise r.err("position_embedding_type", f"expected 'rope', 'nope' or null, got {pe!r}")
    act = r.str("hidden_act", "silu")
    heads = r.int("num_attention_heads", 32)
    bias = r.bool("attention_bias", False)
    att = make_block(Attention, r, num_heads=heads,
                     num_kv_heads=r.int("num_key_value_heads", heads),
                     head_dim=head_dim_of(r, h, heads), rope=pe == "rope", qkv_bias=bias,
                     o_bias=bias)
    m_heads = r.int("mamba_n_heads", 128)
    d_head = r.raw("mamba_d_head", "auto")
    expand = r.int("mamba_expand", 2)
    if d_head == "auto":
        if (expand * h) % m_heads:
            raise r.err("mamba_d_head", f"'auto' needs mamba_n_heads ({m_heads}) to divide "
                        f"mamba_expand x hidden_size ({expand * h})")
        d_head = expand * h // m_heads
    else:
        d_head = r.int("mamba_d_head")
    # (with puzzle_layers the stock keys only describe the first Mamba block of a child)
    if d_head * m_heads != expand * h and r.cfg.get("puzzle_layers") is None:
        raise r.err("mamba_d_head", f"mamba_n_heads x mamba_d_head ({m_heads} x {d_head}) must "
                    f"equal mamba_expand x hidden_size ({expand * h})")
    mamba = make_block(Mamba, r, num_heads=m_heads, head_dim=d_head,
                       state_size=r.int("mamba_d_state", 256),
                       n_groups=r.int("mamba_n_groups", 1), conv_kernel=r.int("mamba_d_conv", 4),
                       conv_bias=r.bool("mamba_conv_bias", True),
                       proj_bias=r.bool("mamba_proj_bias", False))
    shared = r.int("shared_intermediate_size", 1024)
    n_exp = r.int("num_local_experts", 8, minimum=0)
    if n_exp:
        mlp: BlockConfig = make_block(MoE, r, num_experts=n_exp, top_k=r.int("num_experts_per_tok", 2),
                                 expert_width=r.int("intermediate_size", 11008),
                                 shared_width=shared, activation=act, norm_topk=True)
    else:
        r.used.update({"num_experts_per_tok", "intermediate_size"})
        mlp = make_block(FFN, r, width=shared, gated=True, activation=act)
    layers = r.raw("puzzle_layers", None)
    if layers is not None:
        return read_puzzle_layers(r, layers, n), [], kw
    blocks: list[BlockConfig] = []
    for t in types:
        blocks += [mamba if t == "mamba" else att, mlp]
    return blocks, [], kw


def _write(arch: ModelArch, mt: str) -> dict[str, Any]:
    b = arch.blocks
    if len(b) % 2 or not b or arch.norm_unit_offset:
        raise ExportError(f"{mt} needs (mixer, mlp) pairs and plain RMSNorm weights")
    mixers, mlps = b[0::2], b[1::2]
    for i, m in zip(range(0, len(b), 2), mixers):
        if isinstance(m, Attention) and (m.sliding_window or m.qk_norm or m.output_gate
                                         or m.rope_dim or m.qkv_bias != m.o_bias):
            raise ExportError(f"block {i}: {mt} attention is plain grouped-query attention")
        if not isinstance(m, Attention | Mamba) and m.kind not in ("noop", "linear"):
            raise ExportError(f"block {i}: {mt} has a Mamba or attention mixer at every even "
                              "position")
    for i, m in zip(range(1, len(b), 2), mlps):
        if isinstance(m, MoE) and not (m.gated and m.router == "softmax" and m.norm_topk
                                       and not m.router_bias and not m.latent_size
                                       and not m.shared_gate and m.routed_scaling == 1.0):
            raise ExportError(f"block {i}: {mt} experts are SwiGLU, softmax top-k, ungated "
                              "shared MLP")
        if isinstance(m, FFN) and (not m.gated or m.bias):
            raise ExportError(f"block {i}: {mt} dense MLPs are SwiGLU without bias")
        if not isinstance(m, MoE | FFN) and m.kind not in ("noop", "linear"):
            raise ExportError(f"block {i}: {mt} has a MoE or MLP block at every odd position")
    atts = [m for m in mixers if isinstance(m, Attention)]
    mambas = [m for m in mixers if isinstance(m, Mamba)]
    moes = [m for m in mlps if isinstance(m, MoE)]
    ffns = [m for m in mlps if isinstance(m, FFN)]
    stock = (all(isinstance(m, Attention | Mamba) for m in mixers)
             and all(isinstance(m, MoE | FFN) for m in mlps) and not (moes and ffns)
             and len(set(atts)) <= 1 and len(set(mambas)) <= 1 and len(set(moes)) <= 1
             and len(set(ffns)) <= 1 and len({a.rope for a in atts}) <= 1
             and all(m.num_heads * m.head_dim % arch.hidden_size == 0 for m in mambas))
    out = base_config(arch, mt, "rms_norm_eps")
    for k in _MULTIPLIERS:  # every one written; another type's numerics: each is 1
        out[k] = out.get(k, 1.0) if arch.model_type == GRANITE else 1.0
    out["num_hidden_layers"] = len(mixers)
    out["layer_types"] = ["attention" if isinstance(m, Attention) else "mamba" for m in mixers]
    if atts:
        a0 = atts[0]
        out.update(num_attention_heads=a0.num_heads, num_key_value_heads=a0.num_kv_heads,
                   attention_bias=a0.qkv_bias,
                   position_embedding_type="rope" if a0.rope else "nope")
        if a0.head_dim * a0.num_heads != arch.hidden_size:
            out["head_dim"] = a0.head_dim
    if mambas:
        m0 = mambas[0]
        out.update(mamba_n_heads=m0.num_heads, mamba_d_head=m0.head_dim,
                   mamba_d_state=m0.state_size, mamba_n_groups=m0.n_groups,
                   mamba_d_conv=m0.conv_kernel, mamba_conv_bias=m0.conv_bias,
                   mamba_proj_bias=m0.proj_bias,
                   mamba_expand=m0.num_heads * m0.head_dim // arch.hidden_size)
    if moes:
        e0 = moes[0]
        out.update(num_local_experts=e0.num_experts, num_experts_per_tok=e0.top_k,
                   intermediate_size=e0.expert_width, shared_intermediate_size=e0.shared_width,
                   hidden_act=e0.activation)
    elif ffns:
        out.update(num_local_experts=0, shared_intermediate_size=ffns[0].width,
                   hidden_act=ffns[0].activation)
    return write_puzzle_layers(out, list(mixers), list(mlps), stock)


register(Dialect(model_type=GRANITE, architecture="GraniteMoeHybridForCausalLM", read=_read,
                 write=_write))
