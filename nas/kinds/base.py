"""The base of every block kind and the registry through which a kind declares itself.

A block kind is declared in one place, ``nas/kinds/<kind>.py``: its configuration (a
:class:`BlockConfig` subclass), and a :class:`KindSpec` given to :func:`register` that
names everything the rest of the library asks of a kind (docs/adding-a-block-kind.md):

* the cost model's table row (``row``: the :class:`costmodels.shapes.BlockTable` columns;
  the pricing itself is ``costmodels/kinds/<kind>.py``, registered the same way there);
* the search space (``space``: its axis model, read as ``search_space.<kind>``;
  ``alternatives``; ``value_axes`` checked to be used; ``damage``, the structural prior);
* serving rules (``tp_check``: what tensor parallelism must divide; ``engine_axes``, the
  axes an engine's support table speaks of; ``stateful``: a cache or state between steps);
* the torch side, by name so that nothing here imports torch (``nas/modules/<kind>.py``
  with ``make_mixer(cfg, arch)``; ``inherit``: ``"module:function"`` of its inheritance
  rule from a parent block of the same kind);
* fake quantization and ModelOpt export (``linears``: its quantizable linear layers and
  their tensor roles);
* Hugging Face (``hf_dialects``: the ``model_type`` values whose configs hold it;
  ``hf_module``: per dialect, the layer's submodule its tensors sit under).

Kinds that predate the registry are still spread over the modules named in that page and
move here one by one; :func:`get` returns ``None`` for them.
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

if TYPE_CHECKING:
    from costmodels.dtypes import TensorRole
    from costmodels.shapes import Kind

# ---- caps on sizes -----------------------------------------------------------------------
# No cap is a model limit of Puzzle; each keeps every parameter and byte count exact in the
# int64 arithmetic of costmodels (the worst block under these caps, a 4,096-expert MoE of
# 262,144-wide experts on a 262,144-wide stream, has 3 * 2**48 parameters; 4,096 of them stay
# below 2**63) and bounds the work one config can ask for.
MAX_DIM = 2**18
"""Hidden size, head size, FFN / expert / shared / latent widths, SSM state and conv sizes:
262,144 is 10x the widest published LLM (hidden 25,600; expert widths up to ~29,000)."""
MAX_HEADS = 2**14
"""Attention and Mamba heads: 16,384 is 64x the most published (256 Mamba heads)."""
MAX_EXPERTS = 2**12
"""Routed experts: 4,096 is 8x the most published (512, Qwen3-Next)."""
MAX_VOCAB = 2**24
"""Vocabulary: 16,777,216 is 64x the largest published (262,144, Gemma 3) and the largest
token id a float32 tensor holds exactly."""
MAX_BLOCKS = 4096
"""Residual blocks (a Llama layer is two): 16x the deepest published LLM (Llama-3.1-405B,
126 layers = 252 blocks). Pricing, the search space and the MIP grow linearly with it and
every tool builds one object per block, so a typo like 100,000,000 layers stops here."""
MAX_CONTEXT = 2**31
"""Sliding windows and context lengths: the largest position an int32 index holds."""

_CAPS: dict[str, tuple[int, str]] = {
    "hidden_size": (MAX_DIM, "MAX_DIM: 10x the widest published LLM"),
    "head_dim": (MAX_DIM, "MAX_DIM: 10x the widest published LLM"),
    "width": (MAX_DIM, "MAX_DIM: 10x the widest published LLM"),
    "expert_width": (MAX_DIM, "MAX_DIM: 10x the widest published LLM"),
    "shared_width": (MAX_DIM, "MAX_DIM: 10x the widest published LLM"),
    "latent_size": (MAX_DIM, "MAX_DIM: 10x the widest published LLM"),
    "state_size": (MAX_DIM, "MAX_DIM: 10x the widest published LLM"),
    "conv_kernel": (MAX_DIM, "MAX_DIM: 10x the widest published LLM"),
    "num_heads": (MAX_HEADS, "MAX_HEADS: 64x the most heads published"),
    "num_kv_heads": (MAX_HEADS, "MAX_HEADS: 64x the most heads published"),
    "n_groups": (MAX_HEADS, "MAX_HEADS: 64x the most heads published"),
    "num_experts": (MAX_EXPERTS, "MAX_EXPERTS: 8x the most experts published"),
    "top_k": (MAX_EXPERTS, "MAX_EXPERTS: 8x the most experts published"),
    "vocab_size": (MAX_VOCAB, "MAX_VOCAB: 64x the largest published vocabulary"),
    "sliding_window": (MAX_CONTEXT, "MAX_CONTEXT: the largest int32 position"),
    "rope_dim": (MAX_DIM, "MAX_DIM: 10x the widest published LLM"),
    "n_group": (MAX_EXPERTS, "MAX_EXPERTS: 8x the most experts published"),
    "topk_group": (MAX_EXPERTS, "MAX_EXPERTS: 8x the most experts published"),
}


def check_caps(obj: BaseModel) -> None:
    """Raise ``ValueError`` naming the first field of ``obj`` above its cap (see ``_CAPS``)."""
    for name, (cap, why) in _CAPS.items():
        v = getattr(obj, name, None)
        if isinstance(v, int) and v > cap:
            raise ValueError(f"{name} = {v:,} exceeds the cap {cap:,} ({why}; "
                             "nas.arch explains each cap)")


def cap_of(field: str) -> tuple[int, str] | None:
    """The cap and its reason for a block or model field, if it has one."""
    return _CAPS.get(field)


class BlockConfig(BaseModel):
    """The base of every block kind's configuration (:class:`Attention`, :class:`FFN`,
    :class:`MoE`, ...): frozen, no unknown fields, caps checked. Each kind declares its own
    ``kind`` literal (the discriminator of :data:`Block`)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    if TYPE_CHECKING:  # each kind's own Literal field; declared here for the type checker only,
        kind: str      # so that pydantic's field order and the discriminated union stay as they are

    @model_validator(mode="after")
    def _caps(self) -> BlockConfig:
        check_caps(self)
        return self

    def describe(self) -> str:
        """A short human-readable label, e.g. ``attention q32/kv8 d128``."""
        return self.kind


class NoOp(BlockConfig):
    """A removed block: the residual stream passes through (a child of every kind whose axis
    allows it)."""

    kind: Literal["noop"] = "noop"


@dataclass(frozen=True)
class KindSpec:
    """What one block kind declares (module docstring). Callables take the kind's own config
    (``config``) and are only called on blocks of this kind."""

    name: str
    """The ``kind`` literal of :attr:`config` (``"mamba1"``)."""
    config: type[BlockConfig]
    code: Kind
    """Its code in :class:`costmodels.shapes.Kind` (the cost table's ``kind`` column)."""
    title: str
    """Its name in messages (``"Mamba-1"``)."""
    row: Callable[[Any], dict[str, int]]
    """Its :class:`~costmodels.shapes.BlockTable` columns (``kind`` and ``hidden`` added)."""
    space: type[BaseModel]
    """Its search-space axis (a :class:`nas.spec.AxisSpace`), ``search_space.<name>``."""
    alternatives: Callable[[Any, Any], list[BlockConfig]]
    """``(block, its axis) -> child blocks`` (the parent block itself is added by the
    caller; a :class:`~nas.arch.NoOp` is a child like any other)."""
    value_axes: tuple[tuple[str, str, str], ...] = ()
    """``(axis field, block field, why a value can be unusable)``: every value a spec lists
    must give an alternative (``nas.space.alternatives.check_all_used``); ``why`` has one
    ``{}`` for the blocks' values."""
    damage: Callable[[Any, Any], float] | None = None
    """``(parent, child) -> damage in [0, 1)`` of a reshaped child of this kind, the
    structural prior (``nas.space.quality``); None: a child of this kind is scored 1."""
    tp_check: Callable[[Any, int], str | None] | None = None
    """``(block, tp) ->`` what of the block ``tp`` GPUs must divide and do not
    (``"8192 Mamba-1 channels"``), or None when they split it."""
    engine_axes: Mapping[str, Callable[[Any], Any]] = field(default_factory=dict)
    """Field axes of the engine-support table, ``field -> value of a block`` (read as
    ``<name>.<field>``); ``<name>.noop`` is added when :attr:`space` has ``noop``."""
    stateful: bool = False
    """Keeps a cache or recurrent state between decode steps."""
    inherit: str | None = None
    """``"module:function"`` of the rule that initializes a child of this kind from a
    parent block of this kind, ``function(p, c, pc, cc, xin) -> str`` (torch)."""
    linears: tuple[tuple[str, TensorRole], ...] = ()
    """Its quantizable linear layers (names under the mixer) and their tensor roles."""
    hf_dialects: frozenset[str] = frozenset()
    """``model_type`` values whose configs can hold this kind; writing it as another type
    is refused. Empty: every dialect that writes the blocks' fields."""
    hf_module: Mapping[str, str] = field(default_factory=dict)
    """Per dialect, the layer submodule its tensors sit under (``{"jamba": "mamba."}``)."""
    caps: Mapping[str, tuple[int, str]] = field(default_factory=dict)
    """Caps on its own fields (``field -> (cap, why)``), checked as :data:`_CAPS` is."""
    attention: bool = False
    """An attention kind: it keeps a KV cache per token of context (the recipe's KV-cache
    dtype applies to it), and attention data parallelism runs it whole on every GPU
    (:attr:`tp_check` is then not asked)."""
    roles: tuple[TensorRole, ...] = ()
    """The weight roles its numerics read (a precision recipe's signature for the kind,
    ``nas.space.spans``)."""
    linears_of: Callable[[Any], tuple[tuple[str, TensorRole], ...]] | None = None
    """Its quantizable linears in one block, where they depend on the block's config (a
    quantization config lists these; default: :attr:`linears`)."""
    swap_with: str | None = None
    """The kind that its axis' ``swap`` exchanges it with, both ways (``"attention"``): a
    block of either kind may become the parent's first block of the other. A change of
    kind is a swap (:func:`swap_of`): its engine axis is ``<name>.swap``, its structural
    prior :attr:`damage` (called with blocks of the two kinds)."""


_KINDS: dict[str, KindSpec] = {}
_LOADED = False


def register(spec: KindSpec) -> KindSpec:
    """Add a kind (called once, by its module in ``nas/kinds``); returns ``spec``."""
    name = spec.config.model_fields["kind"].default
    if name != spec.name:
        raise ValueError(f"kind {spec.name!r}: its config's kind literal is {name!r}")
    if spec.name in _KINDS and _KINDS[spec.name] is not spec:
        raise ValueError(f"block kind {spec.name!r} is registered twice")
    clash = set(spec.caps) & set(_CAPS)
    if clash:
        raise ValueError(f"kind {spec.name!r} caps fields that already have caps: {clash}")
    _KINDS[spec.name] = spec
    _CAPS.update(spec.caps)
    return spec


def _load() -> None:
    """Import every module of ``nas/kinds`` once (each registers its kind)."""
    global _LOADED
    if _LOADED:
        return
    _LOADED = True
    import nas.kinds as pkg

    for info in pkgutil.iter_modules(pkg.__path__):
        if info.name != "base":
            importlib.import_module(f"nas.kinds.{info.name}")


def kinds() -> dict[str, KindSpec]:
    """Every registered kind, by name, in the order their modules were imported."""
    _load()
    return dict(_KINDS)


def get(name: str) -> KindSpec | None:
    """The registered kind ``name`` (None for a kind that predates the registry)."""
    _load()
    return _KINDS.get(name)


def spec_of(block: BlockConfig) -> KindSpec | None:
    """The registered kind of ``block`` (None for a kind that predates the registry)."""
    return get(block.kind)


def swap_of(parent: BlockConfig, child: BlockConfig) -> KindSpec | None:
    """The registered kind whose swap turns ``parent`` into ``child`` (``{parent, child}``
    are that kind and its :attr:`~KindSpec.swap_with`), or None."""
    pair = {parent.kind, child.kind}
    for k in kinds().values():
        if k.swap_with is not None and pair == {k.name, k.swap_with}:
            return k
    return None


def round_to_multiple(x: float, to: int) -> int:
    """``x`` rounded to the nearest multiple of ``to``, at least ``to`` (fractional widths)."""
    return max(to, int(round(x / to)) * to)


class AxisSpace(BaseModel):
    """The fields every search-space axis has: where its alternatives apply."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    blocks: list[tuple[int, int]] | None = Field(
        default=None, description="restrict these alternatives to block ranges [start, end)")


def hf_module(block: BlockConfig, dialect: str) -> str | None:
    """The layer submodule a registered kind's tensors sit under in ``dialect``
    (``"mamba."``), or None (not registered, or no name of its own there)."""
    spec = spec_of(block)
    return spec.hf_module.get(dialect) if spec is not None else None
