"""Alternatives per parent block: the search space a spec describes, as plain data.

Every parent block gets a menu of child blocks: itself first, then the spec's variations
(fewer KV heads, sliding windows, narrower FFN, fewer/narrower experts, lower top-k,
smaller SSM state, fewer Mamba heads, linear, no-op), deduplicated. Each alternative
covers exactly its own parent block (a span [i, i+1)).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from itertools import product
from typing import Any, cast

from hwprofiles.errors import InputError
from nas.arch import (
    FFN,
    Attention,
    BlockConfig,
    Linear,
    Mamba,
    ModelArch,
    MoE,
    NoOp,
    Parallel,
)
from nas.kinds import kinds
from nas.kinds.base import KindSpec, round_to_multiple
from nas.spec import AxisSpace, SearchSpace


@dataclass(frozen=True)
class Alternative:
    """One child block for parent block ``block`` (``label`` is unique within the block)."""

    block: int
    child: BlockConfig
    label: str
    is_parent: bool
    end: int | None = None
    """One past the last parent block covered (``block + 1`` when None); see nas.space.spans."""
    children: tuple[BlockConfig, ...] | None = None
    """The child blocks replacing the span (``(child,)`` when None; ``()``: removed)."""
    recipe: str | None = None
    """Precision recipe of these child blocks (None: the spec's own ``precision``)."""

    @property
    def stop(self) -> int:
        """One past the last parent block covered."""
        return self.block + 1 if self.end is None else self.end

    @property
    def blocks(self) -> tuple[BlockConfig, ...]:
        """The child blocks (a single-block alternative: its child)."""
        return (self.child,) if self.children is None else self.children


def _in_ranges(axis: AxisSpace, i: int) -> bool:
    return axis.blocks is None or any(a <= i < b for a, b in axis.blocks)


def _label(parent: BlockConfig, child: BlockConfig) -> str:
    if child == parent:
        return "parent"
    if isinstance(child, NoOp | Linear):
        return child.kind
    if child.kind != parent.kind:
        return f"swap:{child.kind}"
    if isinstance(child, Parallel) and isinstance(parent, Parallel):
        return _parallel_label(parent, child)
    diffs = []
    for k, v in child.model_dump().items():
        if getattr(parent, k, None) != v:
            diffs.append(f"{k}={v}")
    return ",".join(diffs)


def _attention(b: Attention, s: SearchSpace) -> list[BlockConfig]:
    kvs = [k for k in s.attention.kv_heads if b.num_heads % k == 0] or [b.num_kv_heads]
    kvs = sorted(set(kvs) | {b.num_kv_heads}, reverse=True)
    windows: list[int | None] = [b.sliding_window, *s.attention.sliding_window]
    out: list[BlockConfig] = [b.model_copy(update={"num_kv_heads": k, "sliding_window": w})
                         for k, w in product(kvs, windows)]
    if s.attention.linear:
        out.append(Linear())
    if s.attention.noop:
        out.append(NoOp())
    return out


def _ffn(b: FFN, s: SearchSpace) -> list[BlockConfig]:
    widths = {b.width, *s.ffn.widths}
    widths |= {round_to_multiple(b.width * f, s.ffn.round_to) for f in s.ffn.fractions}
    out: list[BlockConfig] = [b.model_copy(update={"width": w})
                         for w in sorted(widths, reverse=True) if w <= b.width]
    if s.ffn.linear:
        out.append(Linear())
    if s.ffn.noop:
        out.append(NoOp())
    return out


def _moe(b: MoE, s: SearchSpace) -> list[BlockConfig]:
    m = s.moe
    experts = {b.num_experts, *m.experts}
    experts |= {max(1, int(round(b.num_experts * f))) for f in m.expert_fractions}
    widths = {b.expert_width, *m.expert_widths}
    widths |= {round_to_multiple(b.expert_width * f, m.round_to) for f in m.width_fractions}
    topks = {b.top_k, *m.top_k}
    shared = {b.shared_width, *m.shared_widths}
    out: list[BlockConfig] = []
    for e, w, k, sh in product(sorted(experts, reverse=True), sorted(widths, reverse=True),
                               sorted(topks, reverse=True), sorted(shared, reverse=True)):
        if k <= e and e <= b.num_experts and w <= b.expert_width and k <= b.top_k \
                and sh <= b.shared_width and _moe_valid(b, e, k):
            out.append(b.model_copy(update={"num_experts": e, "expert_width": w, "top_k": k,
                                            "shared_width": sh}))
    if m.noop:
        out.append(NoOp())
    return out


def _moe_valid(b: MoE, experts: int, top_k: int) -> bool:
    """Group-limited routing needs equal groups of at least 2 and enough experts in the
    ``topk_group`` groups it may pick (``nas.arch.MoE``)."""
    if b.n_group == 1:
        return True
    per, rem = divmod(experts, b.n_group)
    return not rem and per >= 2 and top_k <= b.topk_group * per


def _mamba(b: Mamba, s: SearchSpace) -> list[BlockConfig]:
    states = {b.state_size, *s.mamba.state_sizes}
    heads = {h for h in {b.num_heads, *s.mamba.heads} if h % b.n_groups == 0}
    out: list[BlockConfig] = [b.model_copy(update={"state_size": st, "num_heads": h})
                         for h, st in product(sorted(heads, reverse=True),
                                              sorted(states, reverse=True))
                         if st <= b.state_size and h <= b.num_heads]
    if s.mamba.noop:
        out.append(NoOp())
    return out


def _parallel(b: Parallel, s: SearchSpace) -> list[BlockConfig]:
    """Falcon-H1 parallel blocks: KV heads of the attention branch x Mamba heads x state
    sizes of the Mamba branch, each branch optionally dropped (``search_space.parallel``)."""
    p = s.parallel
    atts: list[Attention | None] = []
    if b.attention is not None:
        a = b.attention
        kvs = sorted({k for k in p.kv_heads if a.num_heads % k == 0} | {a.num_kv_heads},
                     reverse=True)
        atts = [a.model_copy(update={"num_kv_heads": k}) for k in kvs]
    if b.attention is None or p.drop_attention:
        atts.append(None)
    mambas: list[Mamba | None] = []
    if b.mamba is not None:
        m = b.mamba
        heads = sorted({h for h in {m.num_heads, *p.mamba_heads}
                        if h <= m.num_heads and h % m.n_groups == 0}, reverse=True)
        states = sorted({n for n in {m.state_size, *p.state_sizes} if n <= m.state_size},
                        reverse=True)
        mambas = [m.model_copy(update={"num_heads": h, "state_size": n})
                  for h, n in product(heads, states)]
    if b.mamba is None or p.drop_mamba:
        mambas.append(None)
    out: list[BlockConfig] = [b.model_copy(update={"attention": a, "mamba": m})
                         for a, m in product(atts, mambas) if a is not None or m is not None]
    if p.noop:
        out.append(NoOp())
    return out


def _parallel_label(parent: Parallel, child: Parallel) -> str:
    """``attention=drop`` / ``num_kv_heads=2``, ``mamba=drop`` / ``mamba_heads=24`` /
    ``state_size=128``: what differs from the parent's branches."""
    diffs = []
    pa, ca, pm, cm = parent.attention, child.attention, parent.mamba, child.mamba
    if ca is None and pa is not None:
        diffs.append("attention=drop")
    elif ca is not None and pa is not None and ca.num_kv_heads != pa.num_kv_heads:
        diffs.append(f"num_kv_heads={ca.num_kv_heads}")
    if cm is None and pm is not None:
        diffs.append("mamba=drop")
    elif cm is not None and pm is not None:
        if cm.num_heads != pm.num_heads:
            diffs.append(f"mamba_heads={cm.num_heads}")
        if cm.state_size != pm.state_size:
            diffs.append(f"state_size={cm.state_size}")
    if not diffs or (pa is None and ca is not None) or (pm is None and cm is not None):
        return "parallel:" + child.describe().replace(" ", "_")  # any other change
    return ",".join(diffs)


def _swaps(parent: ModelArch, b: BlockConfig, i: int, s: SearchSpace) -> list[BlockConfig]:
    """A registered kind's swap at block ``i`` (its axis' ``swap``: a block of the kind or of
    its ``swap_with`` becomes the parent's first block of the other)."""
    for k in kinds().values():
        axis = getattr(s, k.name)
        if k.swap_with is None or not axis.swap or not _in_ranges(axis, i) \
                or b.kind not in (k.name, k.swap_with):
            continue
        other = k.swap_with if b.kind == k.name else k.name
        out: list[BlockConfig] = [x for x in parent.blocks if x.kind == other]
        return out[:1]
    return []


def _registered(k: KindSpec) -> Callable[[Any, SearchSpace], list[BlockConfig]]:
    """A registered kind's generator: its alternatives on its own axis of the space."""
    return lambda b, s: k.alternatives(b, getattr(s, k.name))


# a kind's generator takes its own block config (Any here) and the whole search space
_GEN: dict[str, tuple[str, Callable[[Any, SearchSpace], list[BlockConfig]]]] = {
    "attention": ("attention", _attention), "ffn": ("ffn", _ffn), "moe": ("moe", _moe),
    "mamba": ("mamba", _mamba), "parallel": ("parallel", _parallel),
    **{name: (name, _registered(k)) for name, k in kinds().items()}}


def alternatives(parent: ModelArch, space: SearchSpace) -> list[list[Alternative]]:
    """Per parent block, its alternatives (the parent block first)."""
    out: list[list[Alternative]] = []
    for i, b in enumerate(parent.blocks):
        children: list[BlockConfig] = [b]
        if b.kind in _GEN:
            axis_name, gen = _GEN[b.kind]
            if _in_ranges(getattr(space, axis_name), i):
                children += gen(b, space)
        children += _swaps(parent, b, i, space)
        seen: set[BlockConfig] = set()
        alts = []
        for c in children:
            if c in seen:
                continue
            seen.add(c)
            alts.append(Alternative(block=i, child=c, label=_label(b, c), is_parent=c == b))
        out.append(alts)
    return out


# (axis, spec field, block kind, block field, why a value can be unusable)
VALUE_AXES: tuple[tuple[str, str, type[BlockConfig], str, str], ...] = (
    ("attention", "kv_heads", Attention, "num_kv_heads",
     "must divide an attention block's num_heads ({})"),
    ("ffn", "widths", FFN, "width", "must be <= an FFN block's width ({})"),
    ("moe", "experts", MoE, "num_experts", "must be <= a MoE block's num_experts ({}) and >= "
     "a top_k tried; with group-limited routing, a multiple of n_group with at least 2 "
     "experts per group"),
    ("moe", "expert_widths", MoE, "expert_width", "must be <= a MoE block's expert_width ({})"),
    ("moe", "top_k", MoE, "top_k", "must be <= a MoE block's top_k ({})"),
    ("moe", "shared_widths", MoE, "shared_width",
     "must be <= a MoE block's shared_width ({})"),
    ("mamba", "heads", Mamba, "num_heads",
     "must be <= a Mamba block's num_heads and a multiple of its n_groups ({})"),
    ("mamba", "state_sizes", Mamba, "state_size", "must be <= a Mamba block's state_size ({})"),
    *((name, fname, k.config, attr, why) for name, k in kinds().items()
      for fname, attr, why in k.value_axes),
)


def check_all_used(parent: ModelArch, space: SearchSpace,
                   alts: list[list[Alternative]]) -> None:
    """Every value a spec lists must give at least one alternative: a value no block in the
    axis' range can take is an :class:`InputError` saying why, never silently dropped (the
    search calls this; :func:`alternatives` itself skips a value where it does not apply,
    as one value may fit some blocks of a heterogeneous parent and not others)."""
    problems = []
    for axis_name, fname, cls, attr, why in VALUE_AXES:
        axis = getattr(space, axis_name)
        values = getattr(axis, fname)
        if not values:
            continue
        used = {getattr(a.child, attr) for row in alts for a in row if isinstance(a.child, cls)}
        in_range = [b for i, b in enumerate(parent.blocks)
                    if isinstance(b, cls) and _in_ranges(axis, i)]
        for v in values:
            if v in used:
                continue
            if not in_range:
                problems.append(f"search_space.{axis_name}.{fname}: {v} has no "
                                f"{cls.__name__.lower()} block to apply to"
                                + (" in its blocks ranges" if axis.blocks else ""))
                continue
            if cls is Mamba and attr == "num_heads":
                mambas = cast("list[Mamba]", in_range)  # the blocks of kind cls, Mamba
                shown = ", ".join(sorted({f"{b.num_heads} heads in {b.n_groups} groups"
                                          for b in mambas}))
            else:
                ref = "num_heads" if cls is Attention else attr
                shown = ", ".join(str(x) for x in sorted({getattr(b, ref) for b in in_range}))
            problems.append(f"search_space.{axis_name}.{fname}: {v} is not usable ("
                            + why.format(shown) + ")")
    problems += _parallel_unused(parent, space, alts)
    if problems:
        more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
        raise InputError(problems[0] + more)


def _parallel_unused(parent: ModelArch, space: SearchSpace,
                     alts: list[list[Alternative]]) -> list[str]:
    """:func:`check_all_used` for ``search_space.parallel``'s values (they apply to a
    branch of a parallel block)."""
    axis = space.parallel
    in_range = [b for i, b in enumerate(parent.blocks)
                if isinstance(b, Parallel) and _in_ranges(axis, i)]
    kids = [a.child for row in alts for a in row if isinstance(a.child, Parallel)]
    out = []
    for fname, branch, attr, why in (
            ("kv_heads", "attention", "num_kv_heads", "must divide the attention branch's "
             "query heads ({})"),
            ("mamba_heads", "mamba", "num_heads", "must be <= the Mamba branch's heads and a "
             "multiple of its n_groups ({})"),
            ("state_sizes", "mamba", "state_size", "must be <= the Mamba branch's state "
             "size ({})")):
        used = {getattr(getattr(c, branch), attr) for c in kids
                if getattr(c, branch) is not None}
        for v in getattr(axis, fname):
            if v in used:
                continue
            if not in_range:
                out.append(f"search_space.parallel.{fname}: {v} has no parallel block to "
                           "apply to" + (" in its blocks ranges" if axis.blocks else ""))
                continue
            parts = [getattr(b, branch) for b in in_range if getattr(b, branch) is not None]
            shown = ", ".join(sorted({
                f"{x.num_heads} heads in {x.n_groups} groups" if attr == "num_heads" else
                str(x.num_heads if branch == "attention" else x.state_size) for x in parts}))
            out.append(f"search_space.parallel.{fname}: {v} is not usable ("
                       + why.format(shown or f"no block has a {branch} branch") + ")")
    return out


def count(alts: list[list[Alternative]]) -> int:
    return sum(len(a) for a in alts)
