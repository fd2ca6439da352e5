"""The DeepSeek-V3 dialect (``deepseek_v3``; ``kimi_k2``, Kimi-K2's name for the same
architecture and config fields) and its puzzle extension ``deepseek_v3_puzzle``.

``deepseek_v3``: ``num_hidden_layers`` layers of (multi-head latent attention, MLP); the first
``first_k_dense_replace`` MLPs are dense SwiGLU FFNs of ``intermediate_size``, the rest MoE
blocks of ``n_routed_experts`` experts of ``moe_intermediate_size`` plus ``n_shared_experts``
shared experts (one shared FFN of ``n_shared_experts * moe_intermediate_size``), a sigmoid
router with a selection-only correction bias, group-limited routing (``n_group`` /
``topk_group``), ``norm_topk_prob`` and ``routed_scaling_factor``. The MTP head
(``num_nextn_predict_layers``, 5.x ``num_mtp_layers``) is one more (MLA, MoE) layer per depth,
counted apart (:meth:`nas.arch.ModelArch.mtp_params`). As transformers does, ``rope_interleave``
defaults to true and the latent norms use epsilon 1e-6.

Refused with the field named: ``attention_bias: true`` (biased MLA projections),
``num_key_value_heads`` other than ``num_attention_heads`` (transformers' MLA is undefined
then), ``scoring_func`` other than ``sigmoid``, ``topk_method`` other than ``noaux_tc``, and
``moe_layer_freq`` other than 1.

``deepseek_v3_puzzle`` (this library's extension, for children stock ``deepseek_v3`` cannot
hold, e.g. a no-op or narrower MoE at some layers): the model-level fields of the stock
format plus ``block_configs``, one object per residual block (its ``kind`` and fields, as
:class:`nas.arch.ModelArch` writes blocks), and ``mtp_block_configs`` for the MTP head's
blocks when there is one (MTP tensors are not built, as for ``deepseek_v3``). transformers has no such type and refuses to
load it (never silently building another model); :func:`nas.child.load_pretrained` reads
it, with the stock tensor names.
"""

from __future__ import annotations

from typing import Any

from pydantic import TypeAdapter, ValidationError

from hwprofiles.errors import first_error
from nas.arch import FFN, MLA, Block, BlockConfig, ModelArch, MoE
from nas.hf.common import (
    _UNSUPPORTED_NUMERIC,
    MISSING,
    Reader,
    base_config,
    layer_pairs,
    make_block,
    read_rope,
)
from nas.hf.registry import Dialect, ExportError, register

DEEPSEEK = ("deepseek_v3", "deepseek_v3_puzzle", "kimi_k2")
LATENT_NORM_EPS = 1e-6
"""transformers' ``DeepseekV3RMSNorm`` default, which the q/kv latent norms use."""

# fields this dialect computes (the shared refusal list would refuse them)
_COMPUTED = {"rope_interleave", "moe_layer_freq"}
_BLOCK = TypeAdapter(Block)


def model_fields(r: Reader, mt: str, eps_default: float, computed: set[str]
                 ) -> dict[str, Any]:
    """The model-level fields (as :func:`nas.hf.common.common_fields`), refusing the
    numerics-changing fields of other families except those in ``computed``."""
    for key, neutral in _UNSUPPORTED_NUMERIC.items():
        if key in r.cfg and key not in computed:
            r.used.add(key)
            if r.cfg[key] not in neutral:
                raise r.err(key, f"{r.cfg[key]!r} changes the numerics in a way this library "
                            "does not compute (supported: absent"
                            + "".join(f" or {v!r}" for v in neutral if v is not None) + ")")
    theta, scaling = read_rope(r, mt)
    kw: dict[str, Any] = dict(
        hidden_size=r.int("hidden_size"), vocab_size=r.int("vocab_size"),
        tie_embeddings=r.bool("tie_word_embeddings", False),
        norm_eps=r.float("rms_norm_eps", eps_default), rope_theta=theta)
    if scaling is not None:
        kw["_extra"] = {"rope_scaling": scaling}
    return kw


def read_block_configs(r: Reader, key: str = "block_configs") -> list[BlockConfig]:
    """``block_configs`` (or ``mtp_block_configs``) of a ``*_puzzle`` config: one block
    object per residual block."""
    confs = r.raw(key)
    if not isinstance(confs, list) or not confs:
        raise r.err(key, "expected a non-empty list of block objects")
    out: list[BlockConfig] = []
    for i, c in enumerate(confs):
        try:
            out.append(_BLOCK.validate_python(c))
        except ValidationError as exc:
            loc, msg = first_error(exc)
            raise r.err(f"{key}[{i}]" + (f".{loc}" if loc else ""), msg) from None
    return out


def block_configs(arch: ModelArch, mtp: bool = False) -> list[dict[str, Any]]:
    """The ``block_configs`` (``mtp``: ``mtp_block_configs``) list of a ``*_puzzle``
    export."""
    return [b.model_dump(mode="json") for b in (arch.mtp_blocks if mtp else arch.blocks)]


def _alias(r: Reader, a: str, b: str, default: Any = MISSING) -> Any:
    """An integer under either of two names (they must agree when both are given)."""
    va, vb = r.cfg.get(a), r.cfg.get(b)
    r.used.update({a, b})
    if va is not None and vb is not None and va != vb:
        raise r.err(b, f"is {vb} but {a} is {va}")
    return r.int(a, default) if va is not None or vb is None else r.int(b, default)


def _check_choice(r: Reader, key: str, allowed: str, why: str) -> None:
    v = r.raw(key, None)
    if v is not None and v != allowed:
        raise r.err(key, f"{v!r} is not computed here (supported: {allowed!r}; {why})")


def _read_stock(r: Reader, mt: str = "deepseek_v3"
                ) -> tuple[list[BlockConfig], list[BlockConfig], dict[str, Any]]:
    kw = model_fields(r, mt, 1e-6, _COMPUTED)
    n = r.int("num_hidden_layers")
    heads = r.int("num_attention_heads")
    kv = r.int("num_key_value_heads", heads)
    if kv != heads:
        raise r.err("num_key_value_heads", f"must equal num_attention_heads ({heads}) for "
                    f"multi-head latent attention, got {kv}")
    if r.bool("attention_bias", False):
        raise r.err("attention_bias", "biased MLA projections are not computed here")
    if r.raw("moe_layer_freq", 1) != 1:
        raise r.err("moe_layer_freq", "only 1 (every layer after the dense ones) is supported")
    _check_choice(r, "scoring_func", "sigmoid", "DeepSeek-V3's router")
    _check_choice(r, "topk_method", "noaux_tc", "group-limited top-k with a correction bias")
    # transformers 5.x writes the derived head_dim (= rope dim) and qk_head_dim; it derives
    # them again on load, so they are checked here and not written back
    for key, want in (("head_dim", "qk_rope_head_dim"), ("qk_head_dim", None)):
        v = r.raw(key, None)
        if v is not None:
            exp = r.cfg.get("qk_rope_head_dim") if want else \
                (r.cfg.get("qk_nope_head_dim") or 0) + (r.cfg.get("qk_rope_head_dim") or 0)
            if v != exp:
                raise r.err(key, f"is {v!r} but the MLA head sizes give {exp!r}")
    # absent -> transformers' default 1536; an explicit null -> no query bottleneck
    q_lora = r.int("q_lora_rank", None) if "q_lora_rank" in r.cfg else 1536
    mla = make_block(MLA, r, num_heads=heads, q_lora_rank=q_lora,
                     kv_lora_rank=r.int("kv_lora_rank"),
                     qk_nope_head_dim=r.int("qk_nope_head_dim"),
                     qk_rope_head_dim=r.int("qk_rope_head_dim"),
                     v_head_dim=r.int("v_head_dim"),
                     rope_interleave=r.bool("rope_interleave", True))
    act = r.str("hidden_act", "silu")
    dense = r.int("first_k_dense_replace", 3, minimum=0)
    if dense > n:
        raise r.err("first_k_dense_replace", f"{dense} exceeds num_hidden_layers ({n})")
    ffn = make_block(FFN, r, width=r.int("intermediate_size"), gated=True, activation=act) \
        if dense else None
    moe = None
    if dense < n or r.cfg.get("num_nextn_predict_layers") or r.cfg.get("num_mtp_layers"):
        width = r.int("moe_intermediate_size")
        moe = make_block(
            MoE, r, num_experts=_alias(r, "n_routed_experts", "num_local_experts"),
            top_k=r.int("num_experts_per_tok"), expert_width=width,
            shared_width=width * r.int("n_shared_experts", 1, minimum=0), activation=act,
            router="sigmoid", router_bias=True, norm_topk=r.bool("norm_topk_prob", True),
            routed_scaling=r.float("routed_scaling_factor", 2.5),
            n_group=r.int("n_group", 8), topk_group=r.int("topk_group", 4))
    blocks: list[BlockConfig] = []
    for i in range(n):
        blocks += [mla, ffn if i < dense else moe]  # type: ignore[list-item]  # moe is set whenever a layer past the dense ones exists
    n_mtp = _alias(r, "num_nextn_predict_layers", "num_mtp_layers", 0)
    mtp = [mla, moe] * n_mtp if n_mtp else []
    return blocks, mtp, kw  # type: ignore[return-value]  # MTP layers exist only with MoE layers, so moe is set


def _read(r: Reader, mt: str) -> tuple[list[BlockConfig], list[BlockConfig], dict[str, Any]]:
    if mt in ("deepseek_v3", "kimi_k2"):
        return _read_stock(r, mt)
    return read_puzzle(r, mt, 1e-6)


def read_puzzle(r: Reader, mt: str, eps_default: float
                ) -> tuple[list[BlockConfig], list[BlockConfig], dict[str, Any]]:
    """A ``*_puzzle`` config (``deepseek_v3_puzzle``, ``gpt_oss_puzzle``): the model fields
    (``eps_default``: the family's RMSNorm epsilon default), two ``block_configs`` entries
    per layer, and the MTP blocks' ``mtp_block_configs``."""
    kw = model_fields(r, mt, eps_default, set())
    blocks = read_block_configs(r)
    n = r.int("num_hidden_layers", len(blocks) // 2)
    if 2 * n != len(blocks):
        raise r.err("num_hidden_layers", f"is {n} but block_configs has {len(blocks)} blocks "
                    "(expected two per layer)")
    mtp = read_block_configs(r, "mtp_block_configs") if "mtp_block_configs" in r.cfg else []
    return blocks, mtp, kw


def _write_stock(arch: ModelArch, mt: str) -> dict[str, Any]:
    pairs = layer_pairs(arch, mt)
    atts = {a for a, _ in pairs}
    if len(atts) != 1 or not isinstance(next(iter(atts)), MLA):
        raise ExportError(f"{mt} needs the same MLA block in every layer")
    a0: MLA = next(iter(atts))  # checked to be an MLA just above
    mlps = [m for _, m in pairs]
    dense = 0
    while dense < len(mlps) and isinstance(mlps[dense], FFN):
        dense += 1
    ffns, moes = set(mlps[:dense]), set(mlps[dense:])
    if len(ffns) > 1 or len(moes) > 1 or not all(isinstance(m, MoE) for m in moes):
        raise ExportError(f"{mt} needs its dense FFN layers first, then one MoE shape")
    out = base_config(arch, mt, "rms_norm_eps")
    out.update(num_hidden_layers=len(pairs), num_attention_heads=a0.num_heads,
               num_key_value_heads=a0.num_heads, q_lora_rank=a0.q_lora_rank,
               kv_lora_rank=a0.kv_lora_rank, qk_nope_head_dim=a0.qk_nope_head_dim,
               qk_rope_head_dim=a0.qk_rope_head_dim, v_head_dim=a0.v_head_dim,
               rope_interleave=a0.rope_interleave, attention_bias=False,
               first_k_dense_replace=dense)
    act = None
    if ffns:
        f0: FFN = next(iter(ffns))  # type: ignore[assignment]  # checked to be an FFN just above
        if not f0.gated or f0.bias:
            raise ExportError(f"{mt} dense FFNs are SwiGLU without bias")
        out["intermediate_size"] = f0.width
        act = f0.activation
    moe_blocks = [b for b in arch.mtp_blocks if isinstance(b, MoE)] + list(moes)
    if moe_blocks:
        m0: MoE = moe_blocks[0]  # type: ignore[assignment]  # checked to be MoE blocks just above
        if any(m != m0 for m in moe_blocks):
            raise ExportError(f"{mt} needs one MoE shape (the MTP layer's included)")
        if (not m0.gated or m0.router != "sigmoid" or not m0.router_bias or m0.latent_size
                or m0.shared_gate or m0.router_linear_bias or m0.expert_bias
                or m0.swiglu_limit is not None or m0.shared_width % m0.expert_width
                or (act is not None and act != m0.activation)):
            raise ExportError(f"{mt} MoE: SwiGLU experts, a sigmoid router with correction "
                              "bias, shared experts of the expert width")
        act = m0.activation
        out.update(n_routed_experts=m0.num_experts, num_experts_per_tok=m0.top_k,
                   moe_intermediate_size=m0.expert_width,
                   n_shared_experts=m0.shared_width // m0.expert_width,
                   norm_topk_prob=m0.norm_topk, routed_scaling_factor=m0.routed_scaling,
                   n_group=m0.n_group, topk_group=m0.topk_group)
    elif "intermediate_size" in out:
        out.setdefault("moe_intermediate_size", out["intermediate_size"])
    if arch.mtp_blocks:
        n_mtp, rem = divmod(len(arch.mtp_blocks), 2)
        if rem or any(b != a0 for b in arch.mtp_blocks[::2]):
            raise ExportError(f"{mt} MTP layers are (MLA, MoE) pairs of the main shapes")
        out["num_nextn_predict_layers"] = n_mtp
    else:
        out["num_nextn_predict_layers"] = 0
    out.pop("num_mtp_layers", None)
    out.update(hidden_act=act or "silu", scoring_func="sigmoid", topk_method="noaux_tc",
               moe_layer_freq=1)
    return out


def write_puzzle(arch: ModelArch, mt: str) -> dict[str, Any]:
    """A ``*_puzzle`` export (``deepseek_v3_puzzle``, ``gpt_oss_puzzle``): the common head,
    the stock per-shape keys dropped, every block (and MTP block) as a ``block_configs``
    entry."""
    if len(arch.blocks) % 2:
        raise ExportError(f"{mt} needs (attention, mlp) pairs; got an odd number of blocks")
    out = base_config(arch, mt, "rms_norm_eps")
    for key in STOCK_SHAPE_KEYS:
        out.pop(key, None)
    out["num_hidden_layers"] = len(arch.blocks) // 2
    out["block_configs"] = block_configs(arch)
    if arch.mtp_blocks:
        out["mtp_block_configs"] = block_configs(arch, mtp=True)
    return out


STOCK_SHAPE_KEYS = (
    "num_attention_heads", "num_key_value_heads", "q_lora_rank", "kv_lora_rank",
    "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim", "rope_interleave", "attention_bias",
    "first_k_dense_replace", "intermediate_size", "moe_intermediate_size", "n_routed_experts",
    "num_local_experts", "num_experts_per_tok", "n_shared_experts", "norm_topk_prob",
    "routed_scaling_factor", "n_group", "topk_group", "num_nextn_predict_layers",
    "num_mtp_layers", "hidden_act", "scoring_func", "topk_method", "moe_layer_freq",
    # gpt-oss's (the puzzle writer is shared)
    "head_dim", "sliding_window", "layer_types", "num_local_experts", "swiglu_limit",
    "swiglu_alpha", "experts_per_token",
)


def is_mtp_tensor(arch: ModelArch, name: str) -> bool:
    """Whether checkpoint tensor ``name`` belongs to a DeepSeek-V3 MTP layer: the Hub
    checkpoints store MTP depth ``j`` as ``model.layers.{num_hidden_layers + j}.*`` (MTP
    blocks are not built; transformers skips these tensors too)."""
    if arch.model_type not in DEEPSEEK or not arch.mtp_blocks or \
            not name.startswith("model.layers."):
        return False
    layer = name.split(".", 3)[2]
    n = len(arch.blocks) // 2
    return layer.isdigit() and n <= int(layer) < n + len(arch.mtp_blocks) // 2


register(Dialect(model_type="deepseek_v3", architecture="DeepseekV3ForCausalLM", read=_read,
                 write=_write_stock, fallbacks=("deepseek_v3_puzzle",)))
register(Dialect(model_type="kimi_k2", architecture="DeepseekV3ForCausalLM", read=_read,
                 write=_write_stock, fallbacks=("deepseek_v3_puzzle",)))
register(Dialect(model_type="deepseek_v3_puzzle", architecture="DeepseekV3PuzzleForCausalLM",
                 read=_read, write=write_puzzle))
