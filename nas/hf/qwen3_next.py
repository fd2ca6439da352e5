"""The ``qwen3_next`` dialect (Qwen3-Next-80B-A3B): Gated DeltaNet / gated attention hybrids
with high-sparsity MoE.

Layer ``i`` is two blocks: a token mixer, :class:`~nas.arch.DeltaNet` where ``layer_types``
says ``linear_attention`` and gated attention (:class:`~nas.arch.Attention` with
``output_gate``, q/k norm, partial rotary ``rope_dim = head_dim * partial_rotary_factor``)
where it says ``full_attention``, then a Qwen2-MoE-style MoE (softmax top-k, a shared expert
behind a sigmoid gate) or a dense SwiGLU MLP (``mlp_only_layers``, ``decoder_sparse_step``).
Every RMSNorm but DeltaNet's gated one is zero-centred (``ModelArch.norm_unit_offset``).

Defaults are transformers' ``Qwen3NextConfig`` ones where a key is absent
(``full_attention_interval`` 4, ``partial_rotary_factor`` 0.25, ``head_dim`` 256, the
``linear_*`` sizes of the 80B model, 512 experts top-10, ...).

``qwen3_5_moe_text`` (Qwen3.5 MoE, e.g. Qwen3.5-35B-A3B's language model) is the same
family with its own defaults (256 experts top-8, 40 layers, vocabulary 248,320), every layer
MoE with normalized top-k, and the DeltaNet input projections stored split
(``in_proj_qkv``, ``in_proj_z``, ``in_proj_b``, ``in_proj_a``). Its RoPE is multimodal
(``mrope_section``): a text token has the same position on all three axes, so it equals
plain partial RoPE, which is what is computed. ``qwen3_5_moe`` (the image-text wrapper:
``text_config`` + ``vision_config``) reads the language model from ``text_config``; the
vision tower is not modeled (not counted, not searched, not built), and a child exports as
the text-only ``qwen3_5_moe_text``.

Extension (written only when a searched child no longer has one shape per kind; stock
transformers cannot load such a file, this library reads it back exactly):
``puzzle_layers``: one ``{"mixer": <block>, "mlp": <block>}`` per layer, each block the JSON
of its :mod:`nas.arch` config (``{"kind": "deltanet", ...}``, ``{"kind": "noop"}`` ...);
the stock keys then describe the first block of each kind.
"""

from __future__ import annotations

from typing import Any

from nas.arch import FFN, Attention, BlockConfig, DeltaNet, ModelArch, MoE
from nas.hf.common import (
    Reader,
    base_config,
    common_fields,
    make_block,
    read_puzzle_layers,
    write_puzzle_layers,
)
from nas.hf.registry import Dialect, ExportError, register

MODEL_TYPE = "qwen3_next"
_LAYER_TYPES = ("linear_attention", "full_attention")


def _partial_rotary(r: Reader) -> tuple[float, dict[str, Any]]:
    """``partial_rotary_factor`` from the top level or ``rope_parameters`` (transformers
    default 0.25), and the config without it (so that the shared RoPE reader, which refuses
    partial rotary for every other type, reads the rest)."""
    cfg = dict(r.cfg)
    factors = []
    if "partial_rotary_factor" in cfg:
        factors.append(("partial_rotary_factor", cfg.pop("partial_rotary_factor")))
    rp = cfg.get("rope_parameters")
    if isinstance(rp, dict) and "partial_rotary_factor" in rp:
        rp = dict(rp)
        factors.append(("rope_parameters.partial_rotary_factor",
                        rp.pop("partial_rotary_factor")))
        cfg["rope_parameters"] = rp
    r.used.add("partial_rotary_factor")
    if not factors:
        return 0.25, cfg
    vals = {v for _, v in factors}
    key, v = factors[0]
    if len(vals) > 1:
        raise r.err(key, f"is {v!r} but {factors[1][0]} is {factors[1][1]!r}")
    if isinstance(v, bool) or not isinstance(v, int | float) or not 0 < v <= 1:
        raise r.err(key, f"expected a number in (0, 1], got {v!r}")
    return float(v), cfg


def _layer_types(r: Reader, n: int) -> list[str]:
    types = r.raw("layer_types", None)
    if types is None:
        every = r.int("full_attention_interval", 4)
        return ["full_attention" if (i + 1) % every == 0 else "linear_attention"
                for i in range(n)]
    r.used.add("full_attention_interval")
    if not isinstance(types, list) or len(types) != n or \
            not all(t in _LAYER_TYPES for t in types):
        raise r.err("layer_types", f"expected a list of {n} layer types (linear_attention or "
                    "full_attention)")
    return types


_QWEN35 = ("qwen3_5_moe_text", "qwen3_5_moe")
# transformers' per-type defaults where they differ between the two families
_DEFAULTS = {
    "qwen3_next": dict(layers=48, experts=512, top_k=10),
    "qwen3_5_moe_text": dict(layers=40, experts=256, top_k=8),
}


def _strip_mrope(r: Reader, cfg: dict[str, Any]) -> dict[str, Any]:
    """Qwen3.5's M-RoPE keys: for text (equal positions on the three axes) they change
    nothing; consumed so that the shared RoPE reader sees plain partial RoPE."""
    rp = cfg.get("rope_parameters")
    if isinstance(rp, dict) and ({"mrope_section", "mrope_interleaved"} & set(rp)):
        cfg = dict(cfg, rope_parameters={k: v for k, v in rp.items()
                                         if k not in ("mrope_section", "mrope_interleaved")})
    for k in ("mrope_section", "mrope_interleaved"):
        if k in cfg:
            r.used.add(k)
            cfg = {kk: v for kk, v in cfg.items() if kk != k}
    return cfg


def _read(r0: Reader, mt: str) -> tuple[list[BlockConfig], list[BlockConfig], dict[str, Any]]:
    if mt == "qwen3_5_moe":  # the image-text wrapper: its language model
        text = r0.raw("text_config")
        if not isinstance(text, dict):
            raise r0.err("text_config", "expected an object (the language model's config)")
        tmt = text.get("model_type", "qwen3_5_moe_text")
        if tmt != "qwen3_5_moe_text":
            raise r0.err("text_config.model_type", f"expected 'qwen3_5_moe_text', got {tmt!r}")
        sub = Reader(dict(text), r0.source, prefix="text_config.")
        sub.used.update({"model_type", "architectures", "torch_dtype", "dtype",
                         "transformers_version"})
        blocks, mtp, kw = _read(sub, "qwen3_5_moe_text")
        r0.used.update(r0.cfg)  # vision tower and multimodal token ids: not modeled
        kw["_extra"] = {**{k: v for k, v in text.items() if k not in sub.used},
                        **kw.get("_extra", {})}
        return blocks, mtp, kw
    factor, cfg = _partial_rotary(r0)
    r = Reader(cfg, r0.source, r0.prefix)
    if mt in _QWEN35:
        cfg = _strip_mrope(r, cfg)
        r.cfg = cfg
    try:
        return _read_rest(r, mt, factor)
    finally:
        r0.used |= r.used


def _read_rest(r: Reader, mt: str, factor: float
               ) -> tuple[list[BlockConfig], list[BlockConfig], dict[str, Any]]:
    q35 = mt in _QWEN35
    dflt = _DEFAULTS["qwen3_5_moe_text" if q35 else "qwen3_next"]
    kw = common_fields(r, "rms_norm_eps", 1e-6, mt)
    kw["norm_unit_offset"] = True
    n = r.int("num_hidden_layers", dflt["layers"])
    if q35 and not r.bool("attn_output_gate", True):
        raise r.err("attn_output_gate", "transformers' Qwen3.5 attention is always gated; "
                    "false is not computed")
    heads = r.int("num_attention_heads", 16)
    head_dim = r.int("head_dim", 256)
    rope_dim = int(head_dim * factor)
    if rope_dim < 2 or rope_dim % 2:
        raise r.err("partial_rotary_factor", f"{factor} x head_dim {head_dim} = {rope_dim} "
                    "rotated channels; expected an even number >= 2")
    act = r.str("hidden_act", "silu")
    if act != "silu":
        raise r.err("hidden_act", f"{mt}'s DeltaNet conv and experts use silu; got "
                    f"{act!r}")
    bias = r.bool("attention_bias", False)
    att = make_block(Attention, r, num_heads=heads,
                     num_kv_heads=r.int("num_key_value_heads", 2), head_dim=head_dim,
                     rope=True, qk_norm=True, qkv_bias=bias, o_bias=bias, output_gate=True,
                     rope_dim=None if rope_dim == head_dim else rope_dim)
    dn = make_block(DeltaNet, r, num_k_heads=r.int("linear_num_key_heads", 16),
                    num_v_heads=r.int("linear_num_value_heads", 32),
                    head_k_dim=r.int("linear_key_head_dim", 128),
                    head_v_dim=r.int("linear_value_head_dim", 128),
                    conv_kernel=r.int("linear_conv_kernel_dim", 4))
    types = _layer_types(r, n)
    n_exp = r.int("num_experts", dflt["experts"], minimum=0 if not q35 else 1)
    if q35:  # every layer MoE, top-k always renormalized
        moe_layers = set(range(n))
    else:
        step = r.int("decoder_sparse_step", 1)
        mlp_only = r.raw("mlp_only_layers", [])
        if not isinstance(mlp_only, list) or not all(isinstance(i, int) for i in mlp_only):
            raise r.err("mlp_only_layers", "expected a list of layer indices")
        moe_layers = {i for i in range(n)
                      if n_exp > 0 and i not in mlp_only and (i + 1) % step == 0}
    moe = None
    if moe_layers:
        shared = r.int("shared_expert_intermediate_size", 512)
        moe = make_block(MoE, r, num_experts=n_exp,
                         top_k=r.int("num_experts_per_tok", dflt["top_k"]),
                         expert_width=r.int("moe_intermediate_size", 512), shared_width=shared,
                         shared_gate=True, activation=act,
                         norm_topk=True if q35 else r.bool("norm_topk_prob", True))
    ffn = make_block(FFN, r, width=r.int("intermediate_size", 5632), gated=True,
                     activation=act) if len(moe_layers) < n else None
    layers = r.raw("puzzle_layers", None)
    if layers is not None:
        return read_puzzle_layers(r, layers, n), [], kw
    blocks: list[BlockConfig] = []
    for i in range(n):
        blocks.append(dn if types[i] == "linear_attention" else att)
        blocks.append(moe if i in moe_layers else ffn)  # type: ignore[arg-type]  # moe_layers is non-empty only when moe is set
    return blocks, [], kw


def _write(arch: ModelArch, mt: str) -> dict[str, Any]:
    q35 = mt in _QWEN35
    if mt == "qwen3_5_moe":
        raise ExportError("qwen3_5_moe's vision tower is not modeled; the language model "
                          "exports as qwen3_5_moe_text")
    if q35 != arch.model_type.startswith("qwen3_5"):
        raise ExportError(f"{mt} stores the DeltaNet projections "
                          + ("split" if q35 else "fused") + f"; this {arch.model_type!r} "
                          "model's tensors are laid out the other way")
    if not arch.norm_unit_offset:
        raise ExportError(f"{mt} has zero-centred norms (norm_unit_offset)")
    b = arch.blocks
    if len(b) % 2 or not b:
        raise ExportError(f"{mt} needs (token mixer, mlp) pairs")
    mixers, mlps = b[0::2], b[1::2]
    ok_mixer = (DeltaNet, Attention)
    for m in mixers:
        if isinstance(m, Attention) and not (m.output_gate and m.qk_norm and m.rope
                                             and m.qkv_bias == m.o_bias
                                             and m.sliding_window is None):
            raise ExportError(f"{mt} attention is gated, q/k-normed, RoPE, full, with "
                              "one attention_bias flag")
        if isinstance(m, MoE | FFN):
            raise ExportError(f"{mt} has a token mixer at every even position")
    for m in mlps:
        if isinstance(m, MoE) and not (m.gated and m.router == "softmax" and not m.router_bias
                                       and not m.latent_size and m.routed_scaling == 1.0
                                       and m.shared_gate and m.shared_width
                                       and m.activation == "silu"):
            raise ExportError(f"{mt} experts are SwiGLU with a softmax router and a gated "
                              "shared expert")
        if isinstance(m, MoE) and q35 and not m.norm_topk:
            raise ExportError(f"{mt} always renormalizes the top-k routing weights")
        if isinstance(m, FFN) and (q35 or not (m.gated and not m.bias
                                              and m.activation == "silu")):
            raise ExportError(f"{mt} dense MLPs are SwiGLU without bias"
                              + (" (and qwen3_5_moe_text has none)" if q35 else ""))
        if isinstance(m, Attention | DeltaNet):
            raise ExportError(f"{mt} has an MLP at every odd position")
    dns = [m for m in mixers if isinstance(m, DeltaNet)]
    atts = [m for m in mixers if isinstance(m, Attention)]
    moes = [m for m in mlps if isinstance(m, MoE)]
    ffns = [m for m in mlps if isinstance(m, FFN)]
    stock = (all(isinstance(m, ok_mixer) for m in mixers)
             and all(isinstance(m, MoE | FFN) for m in mlps)
             and len(set(dns)) <= 1 and len(set(atts)) <= 1 and len(set(moes)) <= 1
             and len(set(ffns)) <= 1)
    out = base_config(arch, mt, "rms_norm_eps")
    out["num_hidden_layers"] = len(mixers)
    out["hidden_act"] = "silu"
    if atts:
        a0 = atts[0]
        out.update(num_attention_heads=a0.num_heads, num_key_value_heads=a0.num_kv_heads,
                   head_dim=a0.head_dim, attention_bias=a0.qkv_bias,
                   partial_rotary_factor=(a0.rope_dim or a0.head_dim) / a0.head_dim)
    if dns:
        d0 = dns[0]
        out.update(linear_num_key_heads=d0.num_k_heads, linear_num_value_heads=d0.num_v_heads,
                   linear_key_head_dim=d0.head_k_dim, linear_value_head_dim=d0.head_v_dim,
                   linear_conv_kernel_dim=d0.conv_kernel)
    out["layer_types"] = ["linear_attention" if isinstance(m, DeltaNet) else "full_attention"
                          for m in mixers]
    out.pop("full_attention_interval", None)
    if moes:
        m0 = moes[0]
        out.update(num_experts=m0.num_experts, num_experts_per_tok=m0.top_k,
                   moe_intermediate_size=m0.expert_width,
                   shared_expert_intermediate_size=m0.shared_width)
        if not q35:
            out.update(norm_topk_prob=m0.norm_topk, decoder_sparse_step=1,
                       mlp_only_layers=[i for i, m in enumerate(mlps) if isinstance(m, FFN)])
    elif not q35:
        out.update(num_experts=0, mlp_only_layers=[])
    if q35:
        out["attn_output_gate"] = True
    if ffns:
        out["intermediate_size"] = ffns[0].width
    return write_puzzle_layers(out, mixers, mlps, stock)


register(Dialect(model_type=MODEL_TYPE, architecture="Qwen3NextForCausalLM", read=_read,
                 write=_write))
register(Dialect(model_type="qwen3_5_moe_text", architecture="Qwen3_5MoeForCausalLM",
                 read=_read, write=_write))
# read-only in effect: its writer refuses (the vision tower is not modeled) and a model
# exports through the fallback as the text-only type and class
register(Dialect(model_type="qwen3_5_moe", architecture="Qwen3_5MoeForCausalLM",
                 read=_read, write=_write, fallbacks=("qwen3_5_moe_text",)))
