"""The ``nemotron-nas`` dialect (DeciLM, Llama-3.1-Nemotron-51B / -49B): per-layer
``block_configs`` of (attention | linear | no-op) and (gated FFN | linear | no-op).

How the engines turn ``ffn.ffn_mult`` into the FFN width: vLLM's
``vllm/model_executor/models/nemotron_nas.py`` (commit ``00bd1493b3e8``,
``_ffn_mult_to_intermediate_size``) and NVIDIA's ``modeling_decilm.py`` shipped with
Nemotron-51B / Super-49B both compute ``int(2 * ffn_mult * hidden_size / 3)`` rounded *up*
to a multiple of 256 (:func:`ffn_width_from_mult`). So exactly the positive multiples of 256
are representable. vLLM reads ``ffn.intermediate_size`` instead when the per-block FFN
config has no ``ffn_mult`` attribute (``hasattr(block_config.ffn, "ffn_mult")``); it has no
``replace_with_linear`` (a linear block builds full attention / MLP there and fails to load).

Export: a width that is a multiple of 256 is written as ``ffn_mult`` only, the shortest
decimal that the engines' formula maps back to exactly that width (checked, never an
approximation: :func:`ffn_mult_for`). Any other width is written as ``ffn.intermediate_size``
with ``ffn_mult: null`` (this library's extension; NVIDIA's ``block_config.py`` dataclass has
no such field, so only this library and the checkpoint's own configuration class
(:mod:`nas.hf.remote`, which exposes it the way vLLM's ``hasattr`` branch reads it) load
it). Files written before (an approximate ``ffn_mult`` *and* ``intermediate_size``) still
read: ``intermediate_size`` wins.
"""

from __future__ import annotations

from typing import Any

from nas.arch import FFN, Attention, BlockConfig, Linear, ModelArch, NoOp
from nas.hf.common import Reader, base_config, common_fields, head_dim_of, layer_pairs, make_block
from nas.hf.registry import Dialect, ExportError, register


def ffn_width_from_mult(mult: float, hidden: int) -> int:
    """The FFN width DeciLM's ``ffn_mult`` stands for, as vLLM and NVIDIA's modeling code
    compute it: ``int(2 * mult * hidden / 3)`` rounded up to a multiple of 256."""
    width = int(2 * mult * hidden / 3)
    return -(-width // 256) * 256


def ffn_width_representable(width: int) -> bool:
    """Whether ``ffn_mult`` can express FFN width ``width`` (a positive multiple of 256)."""
    return width > 0 and width % 256 == 0


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


def ffn_mult_for(width: int, hidden: int) -> float | None:
    """An ``ffn_mult`` that :func:`ffn_width_from_mult` maps to exactly ``width``: the ratio
    ``3 * width / (2 * hidden)`` to 6 decimals (``5.25`` for 14336 at hidden 4096, as NVIDIA
    writes it) when that maps back, else the shortest decimal that does; ``None`` when no
    multiplier does (``width`` not a positive multiple of 256)."""
    if not ffn_width_representable(width):
        return None
    exact = 3 * width / (2 * hidden)
    if ffn_width_from_mult(round(exact, 6), hidden) == width:
        return round(exact, 6)
    for digits in range(9):
        for cand in (round(exact, digits), round(exact + 10 ** -digits, digits)):
            if cand > 0 and ffn_width_from_mult(cand, hidden) == width:
                return cand
    return None  # pragma: no cover (the exact ratio maps back within 8 decimals)


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
            mult = ffn_mult_for(f.width, h)
            fc = {"no_op": False, "replace_with_linear": False, "ffn_mult": mult}
            if mult is None:  # not representable: this library's extension
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
