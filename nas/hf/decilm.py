"""The ``nemotron-nas`` dialect (DeciLM, Llama-3.1-Nemotron-51B / -49B): per-layer
``block_configs`` of (attention | linear | no-op) and (gated FFN | linear | no-op).

Extension this library writes and reads: ``ffn.intermediate_size`` is written when a width
is not reachable through ``ffn_mult`` (widths that are not multiples of 256); it wins over
``ffn_mult``.
"""

from __future__ import annotations

from typing import Any

from nas.arch import FFN, Attention, BlockConfig, Linear, ModelArch, NoOp
from nas.hf.common import Reader, base_config, common_fields, head_dim_of, layer_pairs, make_block
from nas.hf.registry import Dialect, ExportError, register


def ffn_width_from_mult(mult: float, hidden: int) -> int:
    width = int(2 * mult * hidden / 3)
    return -(-width // 256) * 256


def _import_decilm(r: Reader) -> tuple[list[BlockConfig], dict[str, Any]]:
    kw = common_fields(r, "rms_norm_eps", 1e-5, "nemotron-nas")
    h = kw["hidden_size"]
    heads = r.int("num_attention_heads")
    head_dim = head_dim_of(r, h, heads)
    act = r.str("hidden_act", "silu")
    confs = r.raw("block_configs")
    if not isinstance(confs, list) or not confs:
        raise r.err("block_configs", "expected a non-empty list of per-layer configs")
    n = r.int("num_hidden_layers", len(confs))
    if n != len(confs):
        raise r.err("num_hidden_layers",
                    f"is {n} but block_configs has {len(confs)} entries")
    blocks: list[BlockConfig] = []
    for i, bc in enumerate(confs):
        if not isinstance(bc, dict):
            raise r.err(f"block_configs[{i}]", "expected an object")
        for part in ("attention", "ffn"):
            sub = bc.get(part, {})
            if not isinstance(sub, dict):
                raise r.err(f"block_configs[{i}].{part}", "expected an object")
            s = Reader(sub, r.source, prefix=f"block_configs[{i}].{part}.")
            if s.bool("no_op", False):
                blocks.append(NoOp())
            elif s.bool("replace_with_linear", False):
                blocks.append(Linear())
            elif part == "attention":
                group = s.int("n_heads_in_group")
                if heads % group:
                    raise s.err("n_heads_in_group",
                                f"must divide num_attention_heads ({heads}), got {group}")
                blocks.append(make_block(Attention, s, num_heads=heads, num_kv_heads=heads // group,
                                     head_dim=head_dim, sliding_window=s.int("window_length",
                                                                            None)))
            else:
                width = s.int("intermediate_size", None)
                if width is None:
                    mult = s.float("ffn_mult")
                    if mult <= 0:
                        raise s.err("ffn_mult", f"expected a positive number, got {mult}")
                    width = ffn_width_from_mult(mult, h)
                blocks.append(make_block(FFN, s, width=width, gated=True, activation=act))
    return blocks, kw


def _ffn_mult_for(width: int, hidden: int) -> tuple[float, bool]:
    """An ``ffn_mult`` for ``width`` and whether it reproduces the width exactly."""
    mult = round(3 * width / (2 * hidden), 6)
    for cand in (mult, round(mult, 4), round(mult, 2)):
        if ffn_width_from_mult(cand, hidden) == width:
            return cand, True
    return mult, False


def _export_decilm(arch: ModelArch) -> dict[str, Any]:
    h = arch.hidden_size
    pairs = layer_pairs(arch, "nemotron-nas")
    heads = {b.num_heads for a, _ in pairs for b in [a] if isinstance(b, Attention)}
    dims = {b.head_dim for a, _ in pairs for b in [a] if isinstance(b, Attention)}
    acts = {b.activation for _, b in pairs if isinstance(b, FFN)}
    if len(heads) > 1 or len(dims) > 1 or len(acts) > 1:
        raise ExportError("nemotron-nas needs one query-head count, head dim and activation")
    out = base_config(arch, "nemotron-nas", "rms_norm_eps")
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


def _read(r: Reader, mt: str) -> tuple[list[BlockConfig], list[BlockConfig], dict[str, Any]]:
    blocks, kw = _import_decilm(r)
    return blocks, [], kw


register(Dialect(model_type="nemotron-nas", architecture="DeciLMForCausalLM", read=_read,
                 write=lambda arch, mt: _export_decilm(arch)))
