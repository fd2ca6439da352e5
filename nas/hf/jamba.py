"""The ``jamba`` dialect (AI21 Jamba-v0.1, Jamba-1.5-Mini / -Large): Mamba-1 / attention
hybrids with a MoE every other layer.

Layer ``i`` is two blocks, as in transformers' ``JambaForCausalLM``:

* a token mixer: grouped-query attention without positional encoding (Jamba's attention
  has no RoPE) where ``i % attn_layer_period == attn_layer_offset``, else a Mamba-1 mixer
  (:class:`~nas.arch.Mamba1`: ``inner_size = mamba_expand * hidden_size``, ``mamba_d_state``,
  ``mamba_dt_rank`` (``"auto"`` = ``ceil(hidden_size / 16)``), ``mamba_d_conv``,
  ``mamba_conv_bias``, ``mamba_proj_bias``, and Jamba's RMSNorms on dt, B and C);
* a MoE of ``num_experts`` SwiGLU experts of width ``intermediate_size`` where ``i %
  expert_layer_period == expert_layer_offset`` (and ``num_experts > 1``), else a dense
  SwiGLU MLP of the same width. Routing: softmax over all experts, then the top
  ``num_experts_per_tok`` weights as they are (not renormalized: ``norm_topk=False``).

Defaults are transformers' ``JambaConfig`` ones where a key is absent. Without effect on
the numerics, kept verbatim for the export: ``use_mamba_kernels``,
``use_mambapy``, ``use_associative_scan`` (the same scan by other kernels),
``num_logits_to_keep``, router / aux-loss settings; Jamba-v0.1's remote-code keys
(``n_ctx``, ``calc_logits_for_entire_prompt``, ``mamba_inner_layernorms: true``; its
``auto_map`` is read and dropped, as for every type: it names modeling files a child's
folder does not hold). Refused with the field named: ``mamba_inner_layernorms`` other than true (no
dt / B / C norms: not what transformers computes),
``hidden_act`` other than ``silu`` (the Mamba conv and the experts' SwiGLU), a
``sliding_window`` (transformers 5.x Jamba attention is full attention), and a
``layers_block_type`` / ``layers_num_experts`` list that disagrees with the periods and
offsets (transformers derives both from them and cannot hold another pattern).

Extension (written only when a searched child no longer has one shape per kind, or its
attention / expert layers no longer follow one period and offset; stock transformers
cannot load such a file, this library reads it back exactly): ``puzzle_layers``, one
``{"mixer": <block>, "mlp": <block>}`` per layer, each the JSON of its :mod:`nas.arch`
config; the stock keys then describe the first block of each kind.
"""

from __future__ import annotations

import math
from typing import Any

from nas.arch import FFN, Attention, BlockConfig, Mamba1, ModelArch, MoE
from nas.hf.common import (
    Reader,
    base_config,
    common_fields,
    head_dim_of,
    make_block,
    read_kv_heads,
    read_puzzle_layers,
    write_puzzle_layers,
)
from nas.hf.registry import Dialect, ExportError, register

MODEL_TYPE = "jamba"


def _pattern(r: Reader, n: int, period_key: str, offset_key: str, dflt: tuple[int, int]
             ) -> list[bool]:
    period = r.int(period_key, dflt[0])
    offset = r.int(offset_key, dflt[1], minimum=0)
    if offset >= period:
        raise r.err(offset_key, f"{offset} must be smaller than {period_key} ({period})")
    return [i % period == offset for i in range(n)]


def _read(r: Reader, mt: str) -> tuple[list[BlockConfig], list[BlockConfig], dict[str, Any]]:
    kw = common_fields(r, "rms_norm_eps", 1e-6, mt)
    h = kw["hidden_size"]
    n = r.int("num_hidden_layers", 32)
    act = r.str("hidden_act", "silu")
    if act != "silu":
        raise r.err("hidden_act", f"Jamba's Mamba conv and SwiGLU experts are computed with "
                    f"silu; got {act!r}")
    if r.raw("sliding_window", None) is not None:
        raise r.err("sliding_window", "transformers 5.x Jamba attention is full attention; "
                    "a sliding window is not computed (expected null or absent)")
    if r.cfg.get("mamba_inner_layernorms", True) is not True:  # Jamba-v0.1's remote code
        raise r.err("mamba_inner_layernorms", "transformers' Jamba always RMS-normalizes dt, B "
                    f"and C; {r.cfg['mamba_inner_layernorms']!r} (plain Mamba-1) is not "
                    "computed (expected true or absent)")
    is_att = _pattern(r, n, "attn_layer_period", "attn_layer_offset", (8, 4))
    heads = r.int("num_attention_heads", 32)
    att = make_block(Attention, r, num_heads=heads,
                     num_kv_heads=read_kv_heads(r, heads, 8),  # JambaConfig's rule
                     head_dim=head_dim_of(r, h, heads), rope=False)
    expand = r.int("mamba_expand", 2)
    dt_rank = r.raw("mamba_dt_rank", "auto")
    dt_rank = math.ceil(h / 16) if dt_rank == "auto" else r.int("mamba_dt_rank")
    mamba = make_block(Mamba1, r, inner_size=expand * h, state_size=r.int("mamba_d_state", 16),
                       dt_rank=dt_rank, conv_kernel=r.int("mamba_d_conv", 4),
                       conv_bias=r.bool("mamba_conv_bias", True),
                       proj_bias=r.bool("mamba_proj_bias", False))
    n_exp = r.int("num_experts", None)
    if n_exp is None:  # transformers' attribute_map: num_local_experts -> num_experts
        n_exp = r.int("num_local_experts", 16)
    else:
        r.used.add("num_local_experts")
    is_moe = [e and n_exp > 1 for e in _pattern(r, n, "expert_layer_period",
                                                 "expert_layer_offset", (2, 1))]
    width = r.int("intermediate_size", 14336)
    top_k = r.int("num_experts_per_tok", 2)
    moe = make_block(MoE, r, num_experts=n_exp, top_k=top_k, expert_width=width,
                     activation=act, norm_topk=False) if any(is_moe) else None
    ffn = make_block(FFN, r, width=width, gated=True, activation=act)
    for key, want in (("layers_block_type", ["attention" if a else "mamba" for a in is_att]),
                      ("layers_num_experts", [n_exp if m else 1 for m in is_moe])):
        got = r.raw(key, None)
        if got is not None and got != want:
            raise r.err(key, f"disagrees with the periods and offsets (transformers derives "
                        f"it from them): expected {want}")
    layers = r.raw("puzzle_layers", None)
    if layers is not None:
        return read_puzzle_layers(r, layers, n), [], kw
    blocks: list[BlockConfig] = []
    for i in range(n):
        blocks += [att if is_att[i] else mamba, moe if is_moe[i] else ffn]  # type: ignore[list-item]  # is_moe is true only where the config has experts, so moe is set
    return blocks, [], kw


def _period_offset(flags: list[bool]) -> tuple[int, int] | None:
    """A ``(period, offset)`` whose pattern over ``len(flags)`` layers is ``flags`` (none set:
    a period past the last layer), or ``None``."""
    n = len(flags)
    idx = [i for i, f in enumerate(flags) if f]
    if not idx:
        return n + 1, n
    period = idx[1] - idx[0] if len(idx) > 1 else n
    offset = idx[0]
    if offset >= period or [i % period == offset for i in range(n)] != flags:
        return None
    return period, offset


def _write(arch: ModelArch, mt: str) -> dict[str, Any]:
    b = arch.blocks
    if len(b) % 2 or not b or arch.norm_unit_offset:
        raise ExportError(f"{mt} needs (mixer, mlp) pairs and plain RMSNorm weights")
    h = arch.hidden_size
    mixers, mlps = b[0::2], b[1::2]
    for i, m in zip(range(0, len(b), 2), mixers):
        if isinstance(m, Attention) and (m.rope or m.sliding_window or m.qk_norm
                                         or m.output_gate or m.qkv_bias or m.o_bias):
            raise ExportError(f"block {i}: {mt} attention is plain grouped-query attention "
                              "without positional encoding, window, norms, gate or biases")
        if not isinstance(m, Attention | Mamba1) and m.kind not in ("noop", "linear"):
            raise ExportError(f"block {i}: {mt} has a Mamba-1 or attention mixer at every even "
                              "position")
    for i, m in zip(range(1, len(b), 2), mlps):
        if isinstance(m, MoE) and not (m.gated and m.activation == "silu"
                                       and m.router == "softmax" and not m.norm_topk
                                       and not m.router_bias and not m.latent_size
                                       and not m.shared_width and m.routed_scaling == 1.0):
            raise ExportError(f"block {i}: {mt} experts are SwiGLU with a softmax router, "
                              "unnormalized top-k and no shared expert")
        if isinstance(m, FFN) and not (m.gated and not m.bias and m.activation == "silu"):
            raise ExportError(f"block {i}: {mt} dense MLPs are SwiGLU without bias")
        if not isinstance(m, MoE | FFN) and m.kind not in ("noop", "linear"):
            raise ExportError(f"block {i}: {mt} has a MoE or MLP block at every odd position")
    atts = [m for m in mixers if isinstance(m, Attention)]
    mambas = [m for m in mixers if isinstance(m, Mamba1)]
    moes = [m for m in mlps if isinstance(m, MoE)]
    ffns = [m for m in mlps if isinstance(m, FFN)]
    att_po = _period_offset([isinstance(m, Attention) for m in mixers])
    exp_po = _period_offset([isinstance(m, MoE) for m in mlps])
    widths = {m.expert_width for m in moes} | {m.width for m in ffns}
    stock = (all(isinstance(m, Attention | Mamba1) for m in mixers)
             and all(isinstance(m, MoE | FFN) for m in mlps)
             and len(set(atts)) <= 1 and len(set(mambas)) <= 1 and len(set(moes)) <= 1
             and len(widths) <= 1 and att_po is not None and exp_po is not None
             and all(m.inner_size % h == 0 for m in mambas)
             and not (moes and moes[0].num_experts == 1))
    out = base_config(arch, mt, "rms_norm_eps")
    for k in ("layers_block_type", "layers_num_experts", "num_local_experts"):
        out.pop(k, None)
    out["num_hidden_layers"] = len(mixers)
    out["hidden_act"] = "silu"
    out["sliding_window"] = None
    ap, ao = att_po or (len(mixers) + 1, len(mixers))
    out.update(attn_layer_period=ap, attn_layer_offset=ao)
    if atts:
        a0 = atts[0]
        out.update(num_attention_heads=a0.num_heads, num_key_value_heads=a0.num_kv_heads)
        if a0.head_dim * a0.num_heads != h:
            out["head_dim"] = a0.head_dim
    if mambas:
        m0 = mambas[0]
        out.update(mamba_expand=max(1, m0.inner_size // h), mamba_d_state=m0.state_size,
                   mamba_dt_rank=m0.dt_rank, mamba_d_conv=m0.conv_kernel,
                   mamba_conv_bias=m0.conv_bias, mamba_proj_bias=m0.proj_bias)
    ep, eo = exp_po or (len(mlps) + 1, len(mlps))
    out.update(expert_layer_period=ep, expert_layer_offset=eo)
    if moes:
        out.update(num_experts=moes[0].num_experts, num_experts_per_tok=moes[0].top_k,
                   intermediate_size=moes[0].expert_width)
    else:
        out["num_experts"] = out.get("num_experts", 1)
    if ffns and not moes:
        out["intermediate_size"] = ffns[0].width
    return write_puzzle_layers(out, mixers, mlps, stock)


register(Dialect(model_type=MODEL_TYPE, architecture="JambaForCausalLM", read=_read,
                 write=_write))
