"""What each serving engine loads: per model family, the search axes an engine takes per
layer, only once per model (global), or not at all, read from the engines' own model code.

The table (:data:`TABLE`) is data: one :class:`Row` per (family, engine, axis), each citing
the engine's file and the commit it was read at; a row not read in the engine's code says
so (``verified=False``) and takes the conservative reading (a shape axis ``global``: the
engine's config holds one value for the model; a structural one, such as a no-op block,
``none``). ``docs/engines.md`` prints it.

A search for ``deploy.engines`` (:class:`nas.spec.DeploySpec`) reads it through
:func:`restrict` (alternatives that vary an axis a target engine does not take are
dropped, with a note) and :func:`tied_axes` (an axis a target engine holds global becomes a
tied choice: every block of that kind takes one value, :class:`nas.mip.Tie`); with several
engines, the space is the intersection. :func:`loads` says of any child whether an engine
loads it, and if not, why (one line).

Families (:func:`family_of`) group the HF types of :mod:`nas.hf` by the engine classes that
load their children: a heterogeneous Llama-like child is written as DeciLM
(``nemotron-nas``), a heterogeneous Nemotron-H child as ``nemotron_h_puzzle``.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from hwprofiles.errors import InputError
from nas.arch import BlockConfig, Linear, ModelArch, NoOp
from nas.kinds import kinds

ENGINES: tuple[str, ...] = ("vllm", "trtllm", "sglang", "transformers")
"""Engines the table covers: vLLM, TensorRT-LLM (its PyTorch backend), SGLang, and stock
Hugging Face transformers classes (no ``trust_remote_code``)."""

Take = Literal["per_layer", "global", "none"]

# ---- axes ---------------------------------------------------------------------------------
# field axes: axis -> (block kind, how to read the value from a block of that kind)
_FIELD_AXES: dict[str, tuple[str, Callable[[Any], Any]]] = {
    "attention.kv_heads": ("attention", lambda b: b.num_kv_heads),
    "attention.sliding_window": ("attention", lambda b: b.sliding_window or 0),  # 0: full
    "ffn.width": ("ffn", lambda b: b.width),
    "moe.experts": ("moe", lambda b: b.num_experts),
    "moe.expert_width": ("moe", lambda b: b.expert_width),
    "moe.top_k": ("moe", lambda b: b.top_k),
    "moe.shared_width": ("moe", lambda b: b.shared_width),
    "mamba.state_size": ("mamba", lambda b: b.state_size),
    "mamba.heads": ("mamba", lambda b: b.num_heads),
    "parallel.kv_heads": ("parallel", lambda b: None if b.attention is None
                          else b.attention.num_kv_heads),
    "parallel.mamba_heads": ("parallel", lambda b: None if b.mamba is None
                             else b.mamba.num_heads),
    "parallel.state_size": ("parallel", lambda b: None if b.mamba is None
                            else b.mamba.state_size),
    # each registered kind's (nas.kinds)
    **{f"{name}.{f}": (name, read) for name, k in kinds().items()
       for f, read in k.engine_axes.items()},
}
# structural axes: a child block that is not a reshaped copy of its parent block
_SWAP = next((f"{name}.swap" for name, k in kinds().items() if k.swap_with is not None),
             "swap")
"""The axis of a change of a block's kind: the swap of the registered kind that declares one
(``nas.kinds``: its ``swap_with``)."""
_STRUCT_AXES = ("attention.noop", "attention.linear", "ffn.noop", "ffn.linear", "moe.noop",
                "mamba.noop", "parallel.drop_attention", "parallel.drop_mamba", "parallel.noop",
                *(f"{name}.noop" for name, k in kinds().items() if "noop" in k.space.model_fields),
                *(f"{name}.swap" for name, k in kinds().items() if k.swap_with is not None),
                "spans", "precision")
AXES: tuple[str, ...] = (*_FIELD_AXES, *_STRUCT_AXES)
"""Every search axis the table speaks of: ``<kind>.<field>`` (a shape a block keeps),
``<kind>.noop`` / ``.linear`` (the block removed / replaced by one linear map),
``deltanet.swap`` (attention <-> DeltaNet), ``parallel.drop_*`` (one branch of a
Falcon-H1 block dropped), ``spans`` (multi-block replacements: the child has fewer or other
layers) and ``precision`` (a precision recipe per block)."""


def axis_kind(axis: str) -> str | None:
    """The block kind a field axis reads (None for a structural axis)."""
    return _FIELD_AXES[axis][0] if axis in _FIELD_AXES else None


def axis_value(axis: str, block: BlockConfig) -> Any:
    """The value of field axis ``axis`` in ``block`` (a block of the axis' kind)."""
    return _FIELD_AXES[axis][1](block)


def block_axes(parent: BlockConfig, child: BlockConfig) -> set[str]:
    """The axes a single-block alternative ``child`` of parent block ``parent`` varies."""
    pk = parent.kind
    if isinstance(child, NoOp):
        return {f"{pk}.noop"}
    if isinstance(child, Linear):
        return {f"{pk}.linear"}
    ck = child.kind
    if ck != pk:
        return {_SWAP}
    out = set()
    if pk == "parallel":
        if child.attention is None and parent.attention is not None:  # type: ignore[attr-defined]  # pk == 'parallel': both blocks are Parallel (Block's union holds BlockConfig)
            out.add("parallel.drop_attention")
        if child.mamba is None and parent.mamba is not None:  # type: ignore[attr-defined]  # pk == 'parallel': both blocks are Parallel (Block's union holds BlockConfig)
            out.add("parallel.drop_mamba")
    for axis, (kind, get) in _FIELD_AXES.items():
        if kind == pk and get(child) is not None and get(child) != get(parent):
            out.add(axis)
    return out


# ---- the table ----------------------------------------------------------------------------
@dataclass(frozen=True)
class Source:
    """Where a row was read: ``repo`` (GitHub owner/name), ``path`` and ``commit``."""

    repo: str
    path: str
    commit: str

    def __str__(self) -> str:
        return f"{self.repo}@{self.commit[:10]}:{self.path}"


@dataclass(frozen=True)
class Row:
    """How ``engine`` takes ``axis`` for ``family``: ``per_layer`` (every block its own
    value), ``global`` (one value for the model: every block of the kind the same),
    ``none`` (not at all: the parent's own blocks only)."""

    take: Take
    source: Source | None
    verified: bool
    note: str = ""
    multiple: int | None = None
    """A value of the axis the engine can express must be a multiple of this (DeciLM's
    ``ffn_mult`` widths: multiples of 256); None: any value."""

    def allows(self, value: Any) -> bool:
        """Whether the engine can express ``value`` of the axis (beyond ``take``)."""
        return self.multiple is None or (isinstance(value, int) and value % self.multiple == 0)


@dataclass(frozen=True)
class EngineFamily:
    """One engine on one family: whether it serves the family (``serves``; False: no
    class of it loads these types), the HF types its classes read (``types``), and a
    :class:`Row` per axis (an axis not listed: ``none`` when structural, ``global`` when a
    shape, both unverified). ``source``: the file that says which classes load the family
    (for an engine that does not serve it, the registry that lacks it); ``unread``: only
    some of the family's axes were read (the listed verified rows), the rest take the
    conservative reading."""

    engine: str
    family: str
    serves: bool
    types: tuple[str, ...]
    rows: dict[str, Row]
    note: str = ""
    source: Source | None = None
    unread: bool = False

    def row(self, axis: str) -> Row:
        if axis in self.rows:
            return self.rows[axis]
        take: Take = "global" if axis in _FIELD_AXES else "none"
        return Row(take, None, False, "not read in the engine's code: the conservative "
                   "reading (a shape once per model, no structural change)")


def _source(v: list[str] | None) -> Source | None:
    return None if v is None else Source(*v)


def _load() -> tuple[dict[str, tuple[str, ...]], dict[tuple[str, str], EngineFamily]]:
    """The table from ``nas/data/engine_support.json`` (rows in the order docs print them)."""
    data = json.loads((Path(__file__).parent / "data" / "engine_support.json").read_text())
    families = {fam: tuple(types) for fam, types in data["families"].items()}
    table: dict[tuple[str, str], EngineFamily] = {}
    for e in data["entries"]:
        rows = {r["axis"]: Row(r["take"], _source(r["source"]), r["verified"], r["note"],
                               r.get("multiple")) for r in e["rows"]}
        table[(e["family"], e["engine"])] = EngineFamily(
            e["engine"], e["family"], e["serves"], tuple(e["types"]), rows, e["note"],
            _source(e["source"]), e["unread"])
    return families, table


FAMILIES: dict[str, tuple[str, ...]]
"""Family -> the HF model types (:data:`nas.hf.SUPPORTED_TYPES`) whose children it holds."""
TABLE: dict[tuple[str, str], EngineFamily]
"""(family, engine) -> :class:`EngineFamily`: how each engine's own code reads a child of
each family, one :class:`Row` per axis, each with the file and commit it was read at
(``nas/data/engine_support.json``; docs/engines.md prints it)."""
FAMILIES, TABLE = _load()


def family_of(model_type: str) -> str | None:
    """The family of an HF ``model_type`` (None: a type the table does not cover)."""
    for fam, types in FAMILIES.items():
        if model_type in types:
            return fam
    return None


def serving(model_type: str) -> list[str]:
    """The engines that have a class for ``model_type`` (and so serve its family), in
    :data:`ENGINES` order."""
    fam = family_of(model_type)
    return [e for e in ENGINES if fam is not None and TABLE[(fam, e)].serves
            and model_type in TABLE[(fam, e)].types]


def _target(model_type: str, engine: str) -> EngineFamily:
    """:func:`entry` for a deploy target: an InputError when the engine has no class for
    the parent's own type (it could load no child of it)."""
    ef = entry(model_type, engine)
    if not ef.serves:
        raise InputError(f"{engine} has no class for the parent's type {model_type!r}: it "
                         f"does not serve the {ef.family} family ({ef.note}); engines that "
                         f"do: {', '.join(serving(model_type)) or 'none'}",
                         field="deploy.engines")
    if model_type not in ef.types:
        raise InputError(f"{engine} has no class for the parent's type {model_type!r} (it "
                         f"reads {', '.join(ef.types) or 'none of this family'}); engines "
                         f"that do: {', '.join(serving(model_type)) or 'none'}",
                         field="deploy.engines")
    return ef


def entry(model_type: str, engine: str) -> EngineFamily:
    """The table's entry for ``engine`` on ``model_type``'s family (InputError when the
    engine is unknown or the family is not covered)."""
    if engine not in ENGINES:
        raise InputError(f"unknown engine {engine!r}; expected one of {', '.join(ENGINES)}",
                         field="deploy.engines")
    fam = family_of(model_type)
    if fam is None:
        raise InputError(f"the engine table does not cover model type {model_type!r} "
                         f"(families: {', '.join(FAMILIES)})", field="deploy.engines")
    return TABLE[(fam, engine)]


# ---- what a search may produce ------------------------------------------------------------
def alternative_axes(parent: ModelArch, alt: Any) -> set[str]:
    """The axes an alternative (:class:`nas.space.Alternative`) of ``parent`` varies."""
    out: set[str] = set()
    if alt.end is not None:
        out.add("spans")
    else:
        out |= block_axes(parent.blocks[alt.block], alt.child)
    if alt.recipe is not None:
        out.add("precision")
    return out


def _values_of(block: BlockConfig) -> list[tuple[str, Any]]:
    """``(axis, value)`` of every field axis of ``block``'s kind."""
    return [(axis, get(block)) for axis, (kind, get) in _FIELD_AXES.items()
            if block.kind == kind and get(block) is not None]


def _field_values(blocks: Sequence[BlockConfig]) -> dict[str, set[Any]]:
    """Per field axis, the values ``blocks`` of its kind hold."""
    out: dict[str, set[Any]] = {}
    for b in blocks:
        for axis, (kind, get) in _FIELD_AXES.items():
            if b.kind == kind and get(b) is not None:
                out.setdefault(axis, set()).add(get(b))
    return out


def restrict(parent: ModelArch, alts: list[list[Any]], engines: Sequence[str]
             ) -> tuple[list[list[Any]], list[str]]:
    """``alts`` without the alternatives that vary an axis some engine of ``engines`` does
    not take (``none``), and one note per (engine, axis) that dropped any: ``"vllm does not
    take mamba.noop: dropped 40 alternatives (...)"``. A span takes the rows of the blocks
    it produces too (a no-op span is one more pattern; a span child with a field another
    engine holds global is tied like any block). The parent's own alternative always
    stays."""
    if not engines:
        return alts, []
    efs = [_target(parent.model_type, e) for e in engines]
    dropped: dict[tuple[str, str], int] = {}
    out = []
    for row in alts:
        kept = []
        for a in row:
            if a.is_parent:
                kept.append(a)
                continue
            axes = alternative_axes(parent, a)
            if a.end is not None:  # the blocks a span produces: no no-op / linear inside
                for c in a.blocks:
                    if isinstance(c, NoOp | Linear):
                        axes.add(f"{parent.blocks[a.block].kind}.{c.kind}")
            bad = [(ef.engine, ax) for ef in efs for ax in sorted(axes)
                   if ef.row(ax).take == "none"]
            bad += [(ef.engine, f"{ax}={v}") for ef in efs for c in a.blocks
                    for ax, v in _values_of(c) if not ef.row(ax).allows(v)]
            if bad:
                dropped[bad[0]] = dropped.get(bad[0], 0) + 1
                continue
            kept.append(a)
        out.append(kept)
    notes = [f"{eng} does not take {ax}: dropped {n} alternative{'s' * (n != 1)} "
             f"({entry(parent.model_type, eng).row(ax.split('=')[0]).note or 'not in its code'})"
             for (eng, ax), n in sorted(dropped.items())]
    return out, notes


def tied_axes(parent: ModelArch, engines: Sequence[str]) -> dict[str, list[str]]:
    """Field axis -> the engines of ``engines`` that hold it global (a tied choice). An
    axis the parent itself varies across blocks and an engine holds global is an
    InputError (that engine cannot load the parent: the table or the engine is wrong)."""
    out: dict[str, list[str]] = {}
    vals = _field_values(parent.blocks)
    for e in engines:
        ef = _target(parent.model_type, e)
        for axis in _FIELD_AXES:
            if ef.row(axis).take != "global" or axis not in vals:
                continue
            if len(vals[axis]) > 1:
                raise InputError(f"{e} holds {axis} global, but the parent's blocks hold "
                                 f"{sorted(vals[axis], key=str)}: the engine table says "
                                 f"{e} cannot load the parent", field="deploy.engines")
            out.setdefault(axis, []).append(e)
    return out


def ties(library: Any, axes: dict[str, list[str]]) -> tuple[list[Any], list[int]]:
    """The :class:`nas.mip.Tie` of each tied axis over ``library``'s replacements (their
    child blocks as :attr:`nas.library.BlockLibrary.children` dicts), and the replacements
    that hold two values of one tied axis among their child blocks (a span; the search
    forbids them)."""
    from nas.arch import BLOCK_TYPES
    from nas.mip import Tie

    out, forbid = [], set()
    blocks_of = [[BLOCK_TYPES[c["kind"]].model_validate(
        {k: v for k, v in c.items() if k != "precision"}) for c in kids]
        for kids in library.children]
    for axis, engs in axes.items():
        kind, get = _FIELD_AXES[axis]
        groups: dict[Any, list[int]] = {}
        for r, kids in enumerate(blocks_of):
            vs = {get(b) for b in kids if b.kind == kind and get(b) is not None}
            if len(vs) > 1:
                forbid.add(r)
            elif vs:
                groups.setdefault(vs.pop(), []).append(r)
        if len(groups) < 2:
            continue  # one value: nothing to tie
        keys = sorted(groups, key=lambda v: (str(type(v)), v))
        out.append(Tie(f"{axis} ({', '.join(engs)})", tuple(tuple(groups[k]) for k in keys),
                       tuple(f"{axis.split('.', 1)[1]}={k}" for k in keys)))
    return out, sorted(forbid)


# ---- what an engine loads -----------------------------------------------------------------
def loads(parent: ModelArch, child: ModelArch, engine: str) -> tuple[bool, str]:
    """Whether ``engine`` loads ``child`` (a child of ``parent``, same block positions or a
    spans-shortened one): ``(True, "")`` or ``(False, one line why)``. It checks the child
    against the table: every field axis the engine holds global takes one value over the
    child's blocks of that kind, and no block varies an axis the engine does not take."""
    ef = entry(parent.model_type, engine)
    if not ef.serves or parent.model_type not in ef.types:
        return False, f"{engine} has no class for the parent's type {parent.model_type!r}"
    pb, cb = parent.blocks, child.blocks
    if len(pb) != len(cb):
        take = ef.row("spans")
        if take.take == "none":
            return False, (f"the child has {len(cb)} blocks for the parent's {len(pb)} "
                           f"(spans): {engine} {take.note or 'does not take spans'}")
    else:
        for i, (p, c) in enumerate(zip(pb, cb)):
            for ax in sorted(block_axes(p, c)):
                row = ef.row(ax)
                if row.take == "none":
                    return False, f"block {i} varies {ax} ({c.describe()}): {engine} does " \
                                  f"not take it ({row.note or 'not in its code'})"
                v = axis_value(ax, c) if ax in _FIELD_AXES else None
                if v is not None and not row.allows(v):
                    return False, f"block {i} has {ax} = {v}: {engine} takes only multiples " \
                                  f"of {row.multiple} ({row.note})"
    vals = _field_values(cb)
    for ax, vs in sorted(vals.items()):
        row = ef.row(ax)
        if row.take == "global" and len(vs) > 1:
            shown = ", ".join(str(v) for v in sorted(vs, key=str))
            return False, f"{ax} takes {len(vs)} values ({shown}): {engine} holds it " \
                          f"global ({row.note or 'one value per model'})"
    return True, ""


def report(parent: ModelArch, child: ModelArch, engines: Sequence[str] | None = None,
           per_block_precision: bool = False) -> list[dict[str, Any]]:
    """For each engine (default: every engine of the table), ``{"engine", "loads",
    "why"}``: the blueprint's ``engines`` section."""
    out = []
    for e in engines or ENGINES:
        ok, why = loads(parent, child, e)
        if ok and per_block_precision and entry(parent.model_type, e).row(
                "precision").take == "none":
            ok, why = False, (f"blocks carry their own precision recipes: {e} does not take "
                              "per-block precision")
        out.append({"engine": e, "loads": ok, "why": why})
    return out


def table_rows() -> list[dict[str, Any]]:
    """The table as flat rows (family, engine, axis, take, verified, source, note), for
    docs and ``puzzle-nas`` output."""
    out = []
    for (fam, eng), ef in TABLE.items():
        for axis, r in ef.rows.items():
            if axis not in AXES:
                continue
            out.append({"family": fam, "engine": eng, "axis": axis, "take": r.take,
                        "verified": r.verified, "source": str(r.source) if r.source else "",
                        "note": r.note})
    return out


def markdown_entries() -> str:
    """One markdown row per (family, engine): whether it serves the family, the types its
    classes load, where that was read and which class loads it."""
    lines = ["| family | engine | serves | types | read at | class |",
             "|---|---|---|---|---|---|"]
    for (fam, eng), ef in TABLE.items():
        src = f"`{ef.source}`" if ef.source else "unverified"
        types = ", ".join(f"`{t}`" for t in ef.types) or "none"
        part = " (only the listed rows read)" if ef.unread else ""
        lines.append(f"| {fam} | {eng} | {'yes' if ef.serves else '**no**'} | {types} | {src} "
                     f"| {ef.note}{part} |")
    return "\n".join(lines) + "\n"


def markdown_table() -> str:
    """The table as the markdown ``docs/engines.md`` prints: :func:`markdown_entries`, then
    one row per listed axis."""
    lines = [markdown_entries(),
             "| family | engine | axis | takes | read at | why |", "|---|---|---|---|---|---|"]
    for r in table_rows():
        src = f"`{r['source']}`" if r["source"] else "unverified"
        lines.append(f"| {r['family']} | {r['engine']} | `{r['axis']}` | {r['take']} | {src} "
                     f"| {r['note']} |")
    return "\n".join(lines) + "\n"
