"""The ``falcon_h1`` dialect (TII Falcon-H1, transformers ``FalconH1Config``): attention and
a Mamba-2 mixer in parallel within every layer.

Layer ``i`` is two blocks: a :class:`~nas.arch.Parallel` block (``input_layernorm``, then
grouped-query attention and a Mamba-2 mixer on the same normed input, their outputs summed)
and a dense SwiGLU MLP (``pre_ff_layernorm``, ``feed_forward``). Attention: RoPE, one
``attention_bias`` flag for q/k/v/o, ``head_dim`` (default ``hidden_size /
num_attention_heads``). Mamba: ``mamba_n_heads`` x ``mamba_d_head`` = ``mamba_d_ssm``
channels (``mamba_d_ssm: null`` = ``mamba_expand x hidden_size``; ``mamba_d_head: "auto"``
= ``mamba_d_ssm / mamba_n_heads``), ``mamba_n_groups`` B/C groups of ``mamba_d_state``,
``mamba_d_conv`` taps; ``mamba_rms_norm`` (a grouped gated RMSNorm, else ``y * silu(z)``)
and ``mamba_norm_before_gate`` (``norm(y) * silu(z)``, else ``norm(y * silu(z))``).

muP multipliers (:class:`~nas.arch.MuP`, every one computed by :mod:`nas.modules`):
``embedding_multiplier``, ``lm_head_multiplier``, ``mlp_multipliers`` (gate, down),
``attention_in_multiplier``, ``key_multiplier``, ``attention_out_multiplier``,
``ssm_in_multiplier``, ``ssm_multipliers`` (the five parts ``[z | x | B | C | dt]`` of the
Mamba ``in_proj`` output), ``ssm_out_multiplier``. Where a config leaves one out, the value
is transformers' ``FalconH1Config`` default (1.0 each, ``[1.0, 1.0]``, ``[1.0] * 5``), as
transformers itself reads it (so the logits are transformers' on that very file); a null
scalar multiplier is refused by name (transformers keeps ``None`` and cannot run), a null
list is its default as in ``FalconH1Config``; the export writes every one. ``granitemoehybrid``
reads its four multipliers by the same rule (:func:`nas.hf.common.read_multiplier`).

Refused (an :class:`InputError` naming the field): ``hidden_act`` other than silu (it is the
Mamba conv's activation too), ``mamba_proj_bias != projectors_bias`` (one bias flag for the
Mamba branch's ``in_proj`` and ``out_proj``), a non-null ``attn_layer_indices`` (attention in
some layers only; transformers' ``FalconH1Model`` has attention in every layer), multiplier
lists of the wrong length.

Extension (written only when a searched child no longer has one shape per kind; stock
transformers cannot load such a file, this library reads it back exactly):
``puzzle_layers``: one ``{"mixer": <block>, "mlp": <block>}`` per layer, each the JSON of its
:mod:`nas.arch` config (``{"kind": "parallel", "attention": null, "mamba": {...}, ...}`` is a
Mamba-only layer; ``{"kind": "noop"}`` a removed block); the stock keys then describe the
first layer that has each part.
"""

from __future__ import annotations

from typing import Any

from nas.arch import FFN, Attention, BlockConfig, Mamba, ModelArch, MuP, NoOp, Parallel
from nas.hf.common import (
    Reader,
    base_config,
    common_fields,
    head_dim_of,
    make_block,
    read_kv_heads,
    read_multiplier,
    read_puzzle_layers,
    read_time_step_limit,
    write_puzzle_layers,
)
from nas.hf.registry import Dialect, ExportError, register

MODEL_TYPE = "falcon_h1"

# transformers' FalconH1Config defaults of the muP multipliers (read as transformers does
# when a config leaves one out; the export always writes them)
_SCALARS = {"embedding_multiplier": "embedding", "lm_head_multiplier": "lm_head",
            "attention_in_multiplier": "attention_in", "key_multiplier": "key",
            "attention_out_multiplier": "attention_out", "ssm_in_multiplier": "ssm_in",
            "ssm_out_multiplier": "ssm_out"}
_LISTS = {"mlp_multipliers": 2, "ssm_multipliers": 5}


def _float_list(r: Reader, key: str, n: int) -> list[float]:
    v = r.raw(key, [1.0] * n)
    if not isinstance(v, list) or len(v) != n:
        raise r.err(key, f"expected a list of {n} numbers, got {v!r}")
    return [Reader({key: x}, r.source, r.prefix).float(key) for x in v]


def _read_mup(r: Reader) -> MuP:
    kw: dict[str, Any] = {name: read_multiplier(r, key, 1.0) for key, name in _SCALARS.items()}
    kw["mlp_gate"], kw["mlp_down"] = _float_list(r, "mlp_multipliers", 2)
    kw["ssm"] = tuple(_float_list(r, "ssm_multipliers", 5))
    if kw["lm_head"] == 0:
        raise r.err("lm_head_multiplier", "0 makes every logit 0; expected a nonzero number")
    return MuP(**kw)


def _read(r0: Reader, mt: str) -> tuple[list[BlockConfig], list[BlockConfig], dict[str, Any]]:
    mup = _read_mup(r0)
    # the shared reader refuses embedding_multiplier for every other type: read the rest
    # without it
    r = Reader({k: v for k, v in r0.cfg.items() if k != "embedding_multiplier"}, r0.source,
               r0.prefix)
    try:
        blocks, mtp, kw = _read_rest(r, mt)
    finally:
        r0.used |= r.used
    kw["mup"] = mup
    return blocks, mtp, kw


def _read_rest(r: Reader, mt: str) -> tuple[list[BlockConfig], list[BlockConfig], dict[str, Any]]:
    kw = common_fields(r, "rms_norm_eps", 1e-5, mt)
    kw["_extra"] = {**kw.get("_extra", {}), **read_time_step_limit(r)}  # Mamba dt clamp
    h = kw["hidden_size"]
    n = r.int("num_hidden_layers", 32)
    act = r.str("hidden_act", "silu")
    if act != "silu":
        raise r.err("hidden_act", f"falcon_h1's MLP and Mamba conv use silu; got {act!r}")
    if r.raw("attn_layer_indices", None) is not None:
        raise r.err("attn_layer_indices", "attention in some layers only is not computed "
                    "(transformers' FalconH1Model has attention in every layer); expected "
                    "null")
    heads = r.int("num_attention_heads", 32)
    kv = read_kv_heads(r, heads, 8)  # FalconH1Config: absent 8, null = heads
    bias = r.bool("attention_bias", False)
    att = make_block(Attention, r, num_heads=heads, num_kv_heads=kv,
                     head_dim=head_dim_of(r, h, heads), rope=True, qkv_bias=bias, o_bias=bias)
    r.used.add("mamba_d_ssm")
    if "mamba_d_ssm" in r.cfg and r.cfg["mamba_d_ssm"] is None:
        d_ssm = r.int("mamba_expand", 2) * h
    else:
        d_ssm = r.int("mamba_d_ssm", 1024)
    m_heads = r.int("mamba_n_heads", 128)
    d_head = r.raw("mamba_d_head", "auto")
    if d_head == "auto":
        if d_ssm % m_heads:
            raise r.err("mamba_d_head", f"'auto' needs mamba_n_heads ({m_heads}) to divide "
                        f"mamba_d_ssm ({d_ssm})")
        d_head = d_ssm // m_heads
    else:
        d_head = r.int("mamba_d_head")
    if d_head * m_heads != d_ssm and r.cfg.get("puzzle_layers") is None:
        raise r.err("mamba_d_head", f"mamba_n_heads x mamba_d_head ({m_heads} x {d_head}) "
                    f"must equal mamba_d_ssm ({d_ssm})")
    proj_bias = r.bool("mamba_proj_bias", False)
    if r.bool("projectors_bias", False) != proj_bias:
        raise r.err("projectors_bias", "must equal mamba_proj_bias (one bias flag for the "
                    "Mamba in_proj and out_proj is computed)")
    mamba = make_block(Mamba, r, num_heads=m_heads, head_dim=d_head,
                       state_size=r.int("mamba_d_state", 256),
                       n_groups=r.int("mamba_n_groups", 1), conv_kernel=r.int("mamba_d_conv", 4),
                       conv_bias=r.bool("mamba_conv_bias", True), proj_bias=proj_bias)
    par = make_block(Parallel, r, attention=att, mamba=mamba,
                     mamba_rms_norm=r.bool("mamba_rms_norm", False),
                     mamba_norm_before_gate=r.bool("mamba_norm_before_gate", True))
    ffn = make_block(FFN, r, width=r.int("intermediate_size", 14336), gated=True,
                     activation=act, bias=r.bool("mlp_bias", False))
    layers = r.raw("puzzle_layers", None)
    if layers is not None:
        return read_puzzle_layers(r, layers, n), [], kw
    return [par, ffn] * n, [], kw


def _write(arch: ModelArch, mt: str) -> dict[str, Any]:
    b = arch.blocks
    if len(b) % 2 or not b or arch.norm_unit_offset or not arch.final_norm:
        raise ExportError(f"{mt} needs (parallel mixer, mlp) pairs, plain RMSNorm weights "
                          "and a final norm")
    mixers, mlps = b[0::2], b[1::2]
    for i, m in zip(range(0, len(b), 2), mixers):
        if isinstance(m, Parallel) and m.attention is not None and not (
                m.attention.rope and m.attention.qkv_bias == m.attention.o_bias
                and not (m.attention.sliding_window or m.attention.qk_norm
                         or m.attention.output_gate or m.attention.rope_dim
                         or m.attention.sinks)):
            raise ExportError(f"block {i}: {mt} attention is full RoPE attention with one "
                              "bias flag")
        if not isinstance(m, Parallel | NoOp):
            raise ExportError(f"block {i}: {mt} has a parallel attention + Mamba mixer (or a "
                              "removed one) at every even position")
    for i, m in zip(range(1, len(b), 2), mlps):
        if isinstance(m, FFN) and not (m.gated and m.activation == "silu"):
            raise ExportError(f"block {i}: {mt} MLPs are SwiGLU")
        if not isinstance(m, FFN | NoOp):
            raise ExportError(f"block {i}: {mt} has a dense MLP (or a removed one) at every "
                              "odd position")
    pars = [m for m in mixers if isinstance(m, Parallel)]
    atts = [m.attention for m in pars if m.attention is not None]
    mambas = [(m.mamba, m) for m in pars if m.mamba is not None]
    ffns = [m for m in mlps if isinstance(m, FFN)]
    stock = (len(pars) == len(mixers) and len(ffns) == len(mlps) and len(set(pars)) == 1
             and len(set(ffns)) == 1 and len(atts) == len(mambas) == len(pars))
    out = base_config(arch, mt, "rms_norm_eps")
    out["num_hidden_layers"] = len(mixers)
    out["hidden_act"] = "silu"
    if atts:
        a0 = atts[0]
        out.update(num_attention_heads=a0.num_heads, num_key_value_heads=a0.num_kv_heads,
                   head_dim=a0.head_dim, attention_bias=a0.qkv_bias)
    if mambas:
        m0, p0 = mambas[0]
        out.update(mamba_d_ssm=m0.num_heads * m0.head_dim, mamba_n_heads=m0.num_heads,
                   mamba_d_head=m0.head_dim, mamba_n_groups=m0.n_groups,
                   mamba_d_state=m0.state_size, mamba_d_conv=m0.conv_kernel,
                   mamba_conv_bias=m0.conv_bias, mamba_proj_bias=m0.proj_bias,
                   projectors_bias=m0.proj_bias, mamba_rms_norm=p0.mamba_rms_norm,
                   mamba_norm_before_gate=p0.mamba_norm_before_gate)
    if ffns:
        out.update(intermediate_size=ffns[0].width, mlp_bias=ffns[0].bias)
    mup = arch.mup or MuP(embedding=1.0, lm_head=1.0, mlp_gate=1.0, mlp_down=1.0,
                          attention_in=1.0, key=1.0, attention_out=1.0, ssm_in=1.0,
                          ssm_out=1.0, ssm=(1.0,) * 5)
    for key, name in _SCALARS.items():
        out[key] = getattr(mup, name)
    out["mlp_multipliers"] = [mup.mlp_gate, mup.mlp_down]
    out["ssm_multipliers"] = list(mup.ssm)
    return write_puzzle_layers(out, mixers, mlps, stock)


register(Dialect(model_type=MODEL_TYPE, architecture="FalconH1ForCausalLM", read=_read,
                 write=_write))
