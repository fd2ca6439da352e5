"""The wider search space: multi-block (span) replacements and a precision per block.

``nas.space`` gives every parent block its own menu (a span ``[i, i+1)``, the spec's one
precision recipe). This module widens it, as plain data the rest of the pipeline reads:

* **Spans** (``search_space.spans``): a run of 2-3 consecutive parent blocks replaced as a
  whole by one block of a kind and size, by nothing (``noop``), by a shorter list, or by
  the span less one of its blocks (``drop_one``). A span alternative is an
  :class:`~nas.space.Alternative` with ``end`` and ``children`` set, listed with the
  alternatives of its first block; in the library it is an edge ``start -> end``.
* **Precision** (``search_space.precision``): per block kind, the recipes
  (``costmodels.dtypes.RECIPES``) a block may take besides the spec's own; each
  single-block alternative is repeated once per such recipe that changes a dtype of that
  block (weights of its roles, KV cache, SSM / conv state), labelled ``...,precision=<name>``.

Pricing is exact and additive: every child block row is priced by
``costmodels.blocks.price_blocks`` under its own recipe (one vectorized pass per recipe) and
a span's costs are the sums of its child rows (a removed span costs 0: no block, no norm,
no TP all-reduce). The non-block term (embeddings, LM head) keeps the spec's recipe.

The child: a span's children take its place, so the child is shorter
(``nemotron_h_puzzle`` ``block_configs`` with fewer entries). Types whose layers are
(attention, MLP) pairs (Llama-like, DeciLM ``nemotron-nas``) keep their depth instead: the
span's missing blocks become no-ops in place, so the pairs stay aligned (DeciLM no-op
pairs).
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import lru_cache

import numpy as np

from costmodels import shapes
from costmodels.blocks import BlockCosts, price_blocks
from costmodels.dtypes import RECIPES, PrecisionRecipe, TensorRole, get_recipe
from costmodels.shapes import BlockTable
from costmodels.workload import Workload
from hwprofiles.errors import InputError
from hwprofiles.schema import HardwareProfile
from nas.arch import BLOCK_TYPES, BlockConfig, ModelArch, NoOp, blocks_table
from nas.kinds import get
from nas.space.alternatives import Alternative
from nas.space.quality import block_damage
from nas.spec import SearchSpace, SpanBlock, SpanRule

PAIRED_TYPES = ("llama", "mistral", "qwen2", "qwen3", "mixtral", "qwen2_moe", "qwen3_moe",
                "nemotron-nas", "deepseek_v3", "deepseek_v3_puzzle", "kimi_k2", "gpt_oss",
                "gpt_oss_puzzle")
"""HF types whose layers are (attention, MLP) block pairs: a span keeps its length there
(missing blocks become no-ops) so every pair stays in place."""

# the weight roles, and the cache / state dtypes, each block kind's numerics read
_KIND_ROLES: dict[str, tuple[TensorRole, ...]] = {
    "attention": (TensorRole.ATTENTION, TensorRole.OTHER),
    "mamba": (TensorRole.MAMBA, TensorRole.OTHER),
    "moe": (TensorRole.ROUTED_EXPERTS, TensorRole.SHARED_EXPERTS, TensorRole.OTHER),
    "ffn": (TensorRole.FFN, TensorRole.OTHER),
    "linear": (TensorRole.OTHER,),
    "noop": (),
}


def signature(recipe: PrecisionRecipe, kind: str) -> tuple[str, ...]:
    """The dtypes a block of ``kind`` reads from ``recipe``: two recipes with one signature
    price and score that block identically (only one of them is an alternative)."""
    if kind == "noop":
        return ()
    k = get(kind)  # a registered kind (nas.kinds) declares its roles, cache and state
    out = [recipe.weight_dtype(r).value for r in (_KIND_ROLES[kind] if k is None else k.roles)]
    out.append(recipe.activations.value)
    if kind == "attention" or (k is not None and k.attention):
        out.append(recipe.kv_cache.value)
    if kind == "mamba" or (k is not None and k.stateful and not k.attention):
        out += [recipe.ssm_state.value, recipe.conv_state.value]
    return tuple(out)


def recipe_of(a: Alternative, base: PrecisionRecipe) -> PrecisionRecipe:
    """The recipe of an alternative's child blocks (``base``: the spec's own)."""
    return base if a.recipe is None else get_recipe(a.recipe)


def _in(ranges: list[tuple[int, int]] | None, a: int, b: int) -> bool:
    """Whether ``[a, b)`` lies inside one of ``ranges`` (all blocks when None)."""
    return ranges is None or any(lo <= a and b <= hi for lo, hi in ranges)


# ---- spans --------------------------------------------------------------------------------
def _span_block(parents: Sequence[BlockConfig], sb: SpanBlock, where: str) -> BlockConfig:
    first = next((b for b in parents if b.kind == sb.kind), None)
    if first is None:
        raise InputError(f"a {sb.kind} block needs a {sb.kind} parent block in the span to "
                         f"take its shape from (span kinds: {[b.kind for b in parents]})",
                         field=where)
    known = set(type(first).model_fields) - {"kind"}
    bad = sorted(set(sb.fields) - known)
    if bad:
        raise InputError(f"{bad[0]!r} is not a field of a {sb.kind} block (expected one of "
                         f"{sorted(known)})", field=where)
    try:
        return BLOCK_TYPES[sb.kind].model_validate({**first.model_dump(), **sb.fields})
    except ValueError as exc:
        raise InputError(str(exc).splitlines()[-1].strip(), field=where) from None


def _span_label(n: int, children: Sequence[BlockConfig], what: str) -> str:
    return f"span{n}:{what}" if what else \
        f"span{n}:" + "+".join(c.describe().replace(" ", "_") for c in children)


def span_alternatives(parent: ModelArch, rules: Sequence[SpanRule]) -> list[list[Alternative]]:
    """Per parent block, the span alternatives starting there (in rule order, deduplicated
    by their child list; a span whose children equal its parent blocks is left out)."""
    blocks = parent.blocks
    out: list[list[Alternative]] = [[] for _ in blocks]
    seen: list[set[tuple[int, tuple[BlockConfig, ...]]]] = [set() for _ in blocks]
    for ri, rule in enumerate(rules):
        n = rule.span
        matched = False
        for i in range(len(blocks) - n + 1):
            span = blocks[i:i + n]
            if any(b.kind not in ("attention", "mamba", "moe", "ffn") for b in span):
                continue
            if rule.kinds is not None and [b.kind for b in span] != list(rule.kinds):
                continue
            if not _in(rule.blocks, i, i + n):
                continue
            first = 0 if rule.blocks is None else max(lo for lo, hi in rule.blocks
                                                      if lo <= i and i + n <= hi)
            if (i - first) % rule.stride:
                continue
            matched = True
            options: list[tuple[tuple[BlockConfig, ...], str]] = []
            for k, rep in enumerate(rule.replace_with):
                where = f"search_space.spans[{ri}].replace_with[{k}]"
                if rep.noop:
                    options.append(((), "noop"))
                elif rep.block is not None:
                    c = _span_block(span, rep.block, where + ".block")
                    options.append(((c,), ""))
                elif rep.blocks is not None:
                    cs = tuple(_span_block(span, sb, f"{where}.blocks[{j}]")
                               for j, sb in enumerate(rep.blocks))
                    options.append((cs, ""))
                else:  # drop_one
                    for j in range(n):
                        options.append((tuple(b for m, b in enumerate(span) if m != j),
                                        f"drop{j}"))
            for children, what in options:
                if children == tuple(span) or (n, children) in seen[i]:
                    continue
                seen[i].add((n, children))
                out[i].append(Alternative(
                    block=i, child=children[0] if children else NoOp(),
                    label=_span_label(n, children, what), is_parent=False, end=i + n,
                    children=children))
        if not matched:  # a rule that applies nowhere is a mistake, never silently dropped
            kinds = f"kinds {list(rule.kinds)}" if rule.kinds else f"length {n}"
            raise InputError(f"no span of the parent matches ({kinds}, stride {rule.stride}"
                             + (f", blocks {rule.blocks}" if rule.blocks else "") + ")",
                             field=f"search_space.spans[{ri}]")
    return out


# ---- precision ----------------------------------------------------------------------------
def precision_choices(space: SearchSpace, kind: str, block: int) -> list[str]:
    """Recipe names a parent block of ``kind`` at index ``block`` may take beyond the spec's."""
    p = space.precision
    if kind not in ("attention", "mamba", "moe", "ffn") or not _in(p.blocks, block, block + 1):
        return []
    return list(getattr(p, kind))


def with_precision(alts: list[list[Alternative]], parent: ModelArch, space: SearchSpace,
                   base: PrecisionRecipe) -> list[list[Alternative]]:
    """Every single-block alternative repeated once per recipe of its parent's kind that
    changes a dtype the child reads (same block, ``recipe`` set, ``,precision=<name>``
    appended to the label; a no-op has none)."""
    out = []
    for i, row in enumerate(alts):
        names = precision_choices(space, parent.blocks[i].kind, i)
        extra = []
        for a in row:
            # spans, removed blocks, and kinds without a role map here (DeltaNet, MLA,
            # linear: their weights' formats are not modeled per recipe) keep the spec's
            if a.end is not None or a.child.kind not in ("attention", "mamba", "moe", "ffn"):
                continue
            sigs = {signature(base, a.child.kind)}
            for name in names:
                sig = signature(RECIPES[name], a.child.kind)
                if sig in sigs:
                    continue
                sigs.add(sig)
                lab = f"precision={name}" if a.is_parent else f"{a.label},precision={name}"
                extra.append(Alternative(block=a.block, child=a.child, label=lab,
                                         is_parent=False, recipe=name))
        out.append(list(row) + extra)
    return out


def widen(parent: ModelArch, space: SearchSpace, base: PrecisionRecipe,
          alts: list[list[Alternative]]) -> list[list[Alternative]]:
    """``alts`` (from :func:`nas.space.alternatives`) with the precision variants and the
    span alternatives of ``space``; unchanged when it asks for neither."""
    if space.precision.searched():
        alts = with_precision(alts, parent, space, base)
    if space.spans:
        extra = span_alternatives(parent, space.spans)
        alts = [list(row) + more for row, more in zip(alts, extra)]
    return alts


def is_wide(alts: list[list[Alternative]]) -> bool:
    """Whether any alternative is a span or carries its own recipe."""
    return any(a.end is not None or a.recipe is not None for row in alts for a in row)


# ---- pricing ------------------------------------------------------------------------------
def price_mixed(table: BlockTable, recipes: Sequence[PrecisionRecipe],
                hw: HardwareProfile, workloads: Sequence[Workload], tp: int = 1, ep: int = 1,
                attention_dp: bool = False, engine: str | None = None) -> BlockCosts:
    """``price_blocks`` of the rows of ``table`` where row ``i`` runs under ``recipes[i]``:
    one pass per distinct recipe, rows returned in input order (exactly the rows each pass
    priced)."""
    n = len(table)
    if n != len(recipes):
        raise ValueError("one recipe per row")
    groups: dict[str, list[int]] = {}
    objs: dict[str, PrecisionRecipe] = {}
    for i, r in enumerate(recipes):
        key = r.model_dump_json()
        groups.setdefault(key, []).append(i)
        objs[key] = r
    parts = []
    for key, idx in groups.items():
        ix = np.asarray(idx, dtype=np.int64)
        parts.append((ix, price_blocks(table.take(ix), hw, objs[key], list(workloads),
                                       tp=tp, ep=ep, attention_dp=attention_dp,
                                       engine=engine)))
    first = parts[0][1]
    out = {}
    for f in ("prefill_s", "decode_s", "runtime_s", "memory_bytes", "weight_bytes",
              "kv_bytes_per_token", "window", "state_bytes_per_sequence",
              "workspace_bytes_per_token"):
        arr = np.zeros((n, *getattr(first, f).shape[1:]))
        for ix, c in parts:
            arr[ix] = getattr(c, f)
        out[f] = arr
    return BlockCosts(workloads=first.workloads, tp=first.tp, ep=first.ep, **out)


def sum_rows(rows: BlockCosts, owner: np.ndarray, n: int) -> BlockCosts:
    """Per owner ``0..n-1``, the sum of its rows (costs, bytes, params are additive); the
    workspace per token is a max (it is held once, by the widest block); the window is the
    one of the owner's KV-holding rows (they must agree: the KV of a span is then exact at
    every context). An owner without rows (a removed span) costs 0."""
    owner = np.asarray(owner, dtype=np.int64)
    out = {}
    for f in ("prefill_s", "decode_s", "runtime_s", "memory_bytes", "weight_bytes",
              "kv_bytes_per_token", "state_bytes_per_sequence"):
        v = getattr(rows, f)
        acc = np.zeros((n, *v.shape[1:]))
        np.add.at(acc, owner, v)
        out[f] = acc
    ws = np.zeros(n)
    np.maximum.at(ws, owner, rows.workspace_bytes_per_token)
    out["workspace_bytes_per_token"] = ws
    window = np.zeros(n)
    has_kv = rows.kv_bytes_per_token > 0
    for o, w in zip(owner[has_kv], rows.window[has_kv]):
        if window[o] and window[o] != w:
            raise InputError(f"alternative {o} mixes attention blocks with different sliding "
                             "windows in one span (their KV cannot be summed at every "
                             "context); give the span one window")
        window[o] = w
    out["window"] = window
    return BlockCosts(workloads=rows.workloads, tp=rows.tp, ep=rows.ep, **out)


def price_alternatives(flat: Sequence[Alternative], hidden: int, hw: HardwareProfile,
                       base: PrecisionRecipe, workloads: Sequence[Workload], tp: int = 1,
                       ep: int = 1, attention_dp: bool = False, engine: str | None = None
                       ) -> tuple[BlockCosts, np.ndarray, np.ndarray]:
    """(costs, params, active params) per alternative: each the sum over its child blocks,
    every block priced under the alternative's recipe."""
    rows, owner, recipes = [], [], []
    for k, a in enumerate(flat):
        r = recipe_of(a, base)
        for b in a.blocks:
            rows.append(b)
            owner.append(k)
            recipes.append(r)
    if not rows:  # every alternative removes its span: price one no-op to get the shapes
        rows, owner, recipes = [NoOp()], [0], [base]
    table = blocks_table(rows, hidden)
    costs = price_mixed(table, recipes, hw, workloads, tp, ep, attention_dp, engine)
    ow = np.asarray(owner, dtype=np.int64)
    summed = sum_rows(costs, ow, len(flat))
    params = np.zeros(len(flat))
    active = np.zeros(len(flat))
    np.add.at(params, ow, shapes.params(table).astype(np.float64))
    np.add.at(active, ow, shapes.params(table, active=True).astype(np.float64))
    return summed, params, active


# ---- the child ----------------------------------------------------------------------------
def is_paired(parent: ModelArch) -> bool:
    """Whether the parent's type keeps (attention, MLP) layer pairs (see the module doc)."""
    return parent.model_type in PAIRED_TYPES


def _in_slots(start: int, n: int, kids: list[BlockConfig]) -> list[BlockConfig]:
    """A paired type's span of ``n`` blocks from ``start`` holding ``kids`` in order: each
    attention child in the next free attention slot (even index), each FFN / MoE child in
    the next free MLP slot (odd), anything else in the next free slot; no-ops elsewhere."""
    slots: list[BlockConfig | None] = [None] * n
    last = -1
    for c in kids:
        want = 0 if c.kind == "attention" else 1 if c.kind in ("ffn", "moe") else None
        free = [j for j in range(last + 1, n) if slots[j] is None]
        fit = [j for j in free if want is None or (start + j) % 2 == want]
        j = (fit or free)[0]
        slots[j] = c
        last = j
    return [NoOp() if b is None else b for b in slots]


def child_blocks(parent: ModelArch, chosen: Sequence[Alternative], base: PrecisionRecipe
                 ) -> tuple[list[BlockConfig], list[str], list[tuple[int, int]]]:
    """The child's blocks for a chosen path of alternatives (any order), the recipe name of
    each child block, and the parent span ``[start, end)`` each child block came from.

    Spans shorten the child; for paired types (:data:`PAIRED_TYPES`) a span keeps its length:
    its children take the slots of their kind (attention even, MLP odd) and the other
    slots are no-ops (they take the spec's recipe)."""
    paired = is_paired(parent)
    by_start = sorted(chosen, key=lambda a: a.block)
    pos = 0
    blocks: list[BlockConfig] = []
    names: list[str] = []
    origin: list[tuple[int, int]] = []
    for a in by_start:
        if a.block != pos:
            raise InputError(f"the chosen alternatives do not form a path: block {pos} is "
                             f"followed by an alternative starting at {a.block}")
        kids = list(a.blocks)
        if paired and len(kids) < a.stop - a.block:
            kids = _in_slots(a.block, a.stop - a.block, kids)
        name = a.recipe if a.recipe is not None else base.name
        for b in kids:
            blocks.append(b)
            names.append(name)
            origin.append((a.block, a.stop))
        pos = a.stop
    if pos != parent.num_blocks:
        raise InputError(f"the chosen alternatives cover blocks 0..{pos - 1}, not all "
                         f"{parent.num_blocks}")
    return blocks, names, origin


# ---- the structural prior for the new axes ------------------------------------------------
NSR: dict[str, float] = {"fp32": 0.0, "bf16": 0.00166, "fp16": 0.000208, "fp8": 0.0265,
                         "int8": 0.0, "nvfp4": 0.0951, "mxfp4": 0.115}
"""Relative RMS weight error ``||Q(w) - w|| / ||w||`` of a format on Gaussian weights, as
``nas.scoring.fakequant`` measures it on a 1,024 x 4,096 standard normal matrix (FP8 E4M3
with a per-tensor scale, NVFP4 with 16-element E2M1 blocks, E4M3 block scales and an FP32
global scale, MXFP4 with 32-element blocks and power-of-two scales, BF16 / FP16 round to
nearest; ``tests/test_fakequant.py`` re-measures every entry within 5 %). INT8 has no
fake-quant here (0: not scored)."""


def precision_damage(block: BlockConfig, recipe: PrecisionRecipe) -> float:
    """Prior damage in [0, 1) of storing ``block``'s weights in ``recipe``: the parameter-
    weighted relative RMS error (:data:`NSR`) over its weight roles. KV-cache and state
    dtypes are priced but not in this prior (fake-quant scoring quantizes weights)."""
    if isinstance(block, NoOp):
        return 0.0
    return sum(f * NSR[recipe.weight_dtype(role).value] for role, f in _role_fractions(block))


@lru_cache(maxsize=65536)
def _role_fractions(block: BlockConfig) -> tuple[tuple[TensorRole, float], ...]:
    """(role, fraction of the block's parameters) at the stream width of :func:`_hidden_of`."""
    rp = shapes.role_params(blocks_table([block], _hidden_of(block)))
    total = sum(float(v[0]) for v in rp.values())
    return tuple((role, float(v[0]) / total) for role, v in rp.items() if total > 0)


@lru_cache(maxsize=65536)
def _params(block: BlockConfig) -> float:
    return float(shapes.params(blocks_table([block], _hidden_of(block)))[0])


def _hidden_of(block: BlockConfig) -> int:
    """The stream width a block's role fractions are taken at: 4,096 for every block (the
    fractions barely depend on it, and the prior stays a function of the block alone)."""
    return 4096


def span_damage(parents: Sequence[BlockConfig], children: Sequence[BlockConfig]) -> float:
    """Prior damage of replacing ``parents`` (a span) by ``children``: half a no-op per block
    of depth lost, plus half a no-op per parent block times the fraction of its kind's
    parameters the children do not keep, ``0.5 * (n_p - n_c) + 0.5 * sum_p (1 - kept_kind(p))``
    with ``kept_k = min(1, child params of kind k / parent params of kind k)``. Removing the
    span scores ``n_p`` (its blocks' no-ops); two Mamba blocks merged into one as wide as
    both score 0.5. A prior, not a measurement."""
    def by_kind(bs: Sequence[BlockConfig]) -> dict[str, float]:
        out: dict[str, float] = {}
        for b in bs:
            if not isinstance(b, NoOp):
                out[b.kind] = out.get(b.kind, 0.0) + _params(b)
        return out

    pp, cp = by_kind(parents), by_kind(children)
    n_c = sum(not isinstance(c, NoOp) for c in children)
    lost = 0.0
    for b in parents:
        kept = min(1.0, cp.get(b.kind, 0.0) / pp[b.kind]) if pp.get(b.kind) else 1.0
        lost += 1.0 - kept
    return 0.5 * max(0, len(parents) - n_c) + 0.5 * lost


def prior(parent: ModelArch, alts: list[list[Alternative]], base: PrecisionRecipe,
          precision: bool) -> np.ndarray:
    """The structural prior (``nas.space.quality``) extended to the wide space, flattened: a span
    scores :func:`span_damage` times the mean importance of its blocks; with ``precision``
    every non-removed alternative's damage ``d`` becomes ``1 - (1 - d) * (1 - q)`` with
    ``q`` = :func:`precision_damage` of its recipe (the spec's own recipe included, so one
    recipe for all and searched precision are scored alike)."""
    n = parent.num_blocks
    edge = max(1, int(np.ceil(0.1 * n)))
    imp = np.array([1.5 if (i < edge or i >= n - edge) else 1.0 for i in range(n)])
    out = []
    for row in alts:
        for a in row:
            if a.end is not None:
                d = span_damage(parent.blocks[a.block:a.stop], a.blocks)
                out.append(float(imp[a.block:a.stop].mean()) * d)
                continue
            d = block_damage(parent.blocks[a.block], a.child)
            if precision and not isinstance(a.child, NoOp):
                q = precision_damage(a.child, recipe_of(a, base))
                d = 1.0 - (1.0 - d) * (1.0 - q)
            out.append(float(imp[a.block]) * d)
    return np.asarray(out, dtype=np.float64)



def stand_in(parent: ModelArch, blocks: Sequence[BlockConfig],
             origin: Sequence[tuple[int, int]]) -> list[int]:
    """For each child block (:func:`child_blocks`' blocks and origins), the parent block it
    stands in for: its own block for a one-block alternative, else the first parent block of
    its kind in its span not yet taken (in order) -- the block it is initialized from, as
    replace-1-span scoring does (a no-op filling a paired type's slot takes its slot)."""
    out: list[int] = []
    taken: set[int] = set()
    for b, (s, e) in zip(blocks, origin):
        if e - s == 1:
            out.append(s)
            continue
        free = [j for j in range(s, e) if j not in taken]
        j = next((j for j in free if parent.blocks[j].kind == b.kind), free[0])
        taken.add(j)
        out.append(j)
    return out
