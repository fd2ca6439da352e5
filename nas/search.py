"""The search pipeline: spec -> parent -> alternatives -> priced -> scored -> library -> MIP.

Each step is a public function a training stack can call alone::

    problem = resolve(spec, base_dir)            # parent ModelArch, profile, recipe, workloads
    alts = alternatives(problem)                 # per parent block, its child blocks
    costs = price(problem, alts)                 # costmodels, one vectorized pass
    quality, source = score(problem, alts)       # score file, or the structural prior
    library = build_library(problem, alts, costs, quality)
    cons = constraints(problem, library)         # objective, budgets, count rules
    result = solve(problem, library, cons)       # HiGHS (or the homogeneous enumeration)
    child = child_arch(problem, library, result.chosen)

Library keys (all additive over blocks; the non-block term is a library constant):
``params``, ``active_params``, ``weight_bytes`` and, per workload ``W``,
``ttft_s@W``, ``tpot_s@W``, ``runtime_s@W`` (time one replica spends serving B requests),
``memory_bytes@W`` (weights + B x (KV at isl+osl + state) + workspace + reserve, per GPU);
the score key is ``quality``. Budgets translate as:

* throughput per GPU >= X  ->  ``runtime_s@W <= B * osl / (X * tp)``
* per-user decode speed >= X tok/s  ->  ``tpot_s@W <= 1 / X``
* max concurrency >= N at W's context  ->  memory with N sequences <= device memory
* relative bounds ("60%") are fractions of the parent's own total of the same key
  (for throughput / per-user speed, the runtime / TPOT bound is the parent's divided by
  the fraction).

Speculative decoding (MTP): a workload with ``draft_tokens = d`` and ``acceptance = A``
serves with the parent's MTP head drafting d tokens per verification step
(``costmodels.workload``). The head is not searched: every child keeps the parent's (as
the seeds' Puzzle-75B did), so its cost is one constant, priced once exactly as
``puzzle-nas cost --mtp`` prices it (``nas.arch.mtp_table``, draft rows) and added to the
non-block constants of every key: its d draft passes per step in TTFT / TPOT / runtime,
its weights in ``weight_bytes`` and memory, its KV and state per sequence in memory, and
its rows in the workspace maximum. The main blocks are priced with the verify shape (1 + d
tokens per decoding sequence), the LM head with its draft passes, every time per output
token divided by A, and memory holds the ``1 + d`` state snapshots speculative decoding
keeps per sequence (``costmodels.model.spec_state_snapshots``; not in the
``max_concurrency`` columns, which follow ``costmodels.model.max_concurrency``). The head
counts in weight bytes, not in ``params`` / ``active_params`` (as ``ModelArch.param_counts``
keeps MTP apart). A is the user's statement about the workload, the same for the parent and
every child: a child's real acceptance is unknown until it is trained (the seeds measured
3.45 for Nemotron-3-Super, 4.34 for their child after training); no per-child acceptance
is modeled. With several workloads the head is loaded for all of them: one that drafts
nothing pays its weights and KV but no draft passes.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

import hwprofiles
from costmodels import shapes
from costmodels.blocks import BlockCosts, price_blocks
from costmodels.dtypes import PrecisionRecipe, get_recipe, recipe_from_dict
from costmodels.measured import price_measured
from costmodels.memory import DEFAULT_PREFILL_CHUNK
from costmodels.memory import workspace_bytes as memory_workspace
from costmodels.model import (
    NonBlockCosts,
    concurrency_workspace_bytes,
    engine_limits,
    max_concurrency,
    price_nonblock,
    spec_state_snapshots,
    workload_workspace_bytes,
)
from costmodels.serving import SLOPoint, concurrency_grid, parse_slo, slo_throughput
from costmodels.workload import Workload
from hwprofiles.errors import InputError
from hwprofiles.schema import HardwareProfile
from nas import blueprint as bpm
from nas import engines, mip, space, spans
from nas import quality as q
from nas.arch import ModelArch, NoOp, blocks_table, mtp_table, serving_table
from nas.blueprint import nonblock_shape
from nas.hf import from_hf, load_config
from nas.io import check_output_dir, output_lock
from nas.library import BlockLibrary
from nas.mip import interrupt
from nas.progress import Progress
from nas.spec import HIGHER_IS_BETTER, BudgetSpec, SearchSpec, parse_quantity


@dataclass
class Problem:
    """A resolved spec: real objects instead of names and paths."""

    spec: SearchSpec
    base_dir: Path
    spec_hash: str
    parent: ModelArch
    hw: HardwareProfile
    recipe: PrecisionRecipe
    workloads: dict[str, Workload]
    reserve_bytes: float

    @property
    def tp(self) -> int:
        return self.spec.hw.tp

    @property
    def ep(self) -> int:
        return self.spec.hw.ep

    @property
    def attention_dp(self) -> bool:
        return self.spec.hw.attention_dp

    @property
    def engine(self) -> str | None:
        """The serving engine the spec names (``hardware.engine``), or ``None``."""
        return self.spec.hw.engine

    @property
    def device_bytes(self) -> float:
        """Usable memory of one GPU (bytes); memory figures are per GPU."""
        return float(self.hw.memory_bytes.value)

    @property
    def mtp(self) -> bool:
        """Whether the parent's MTP head serves: some workload drafts tokens with it."""
        return any(w.draft_tokens > 0 for w in self.workloads.values())


def resolve(spec: SearchSpec, base_dir: str | Path = ".", spec_hash: str = "") -> Problem:
    """Load the parent, the hardware profile and the recipe a spec names."""
    base = Path(base_dir)
    if isinstance(spec.parent, str):
        p = Path(spec.parent)
        parent = load_config(p if p.is_absolute() else base / p)
    else:
        parent = from_hf(spec.parent, source="spec: parent")
    parent.check_tp(spec.hw.tp, "hardware.tp", attention=not spec.hw.attention_dp)
    prof = spec.hw.profile
    pp = base / prof
    hw = hwprofiles.get(str(pp) if prof.endswith(".json") and pp.exists() else prof)
    if isinstance(spec.precision, str):
        pr = base / spec.precision
        recipe = get_recipe(str(pr) if spec.precision.endswith(".json") else spec.precision)
    else:
        recipe = recipe_from_dict(spec.precision, source="spec: precision")
    # the engine's own token budget / running-request cap / prefill mixing where a workload
    # does not set them (costmodels.model.engine_limits)
    lim = engine_limits(hw, spec.hw.engine) if spec.hw.engine else {}
    wls = {name: Workload(name=name, **{**lim, **w.model_dump(
        exclude={"slo", "concurrency_sweep"}, exclude_none=True)})
           for name, w in spec.workloads.items()}
    drafting = [n for n, w in wls.items() if w.draft_tokens > 0]
    if drafting and not parent.mtp_blocks:
        raise InputError("the parent has no MTP head to draft tokens with (its config has no "
                         "MTP layers); remove draft_tokens and acceptance, or use a parent "
                         "with an MTP head", field=f"workloads.{drafting[0]}.draft_tokens")
    reserve, rel = parse_quantity(spec.runtime_reserve, "memory", "runtime_reserve")
    if rel:
        reserve *= float(hw.memory_bytes.value)
    return Problem(spec, base, spec_hash, parent, hw, recipe, wls, reserve)


def price_head(problem: Problem) -> BlockCosts | None:
    """The parent's MTP head priced as draft rows for every workload (``None`` when no
    workload drafts): the fixed cost every child carries (module docstring)."""
    if not problem.mtp:
        return None
    head = mtp_table(problem.parent)
    assert head is not None  # resolve() refuses drafts without a head
    return price_blocks(head, problem.hw, problem.recipe, list(problem.workloads.values()),
                        tp=problem.tp, ep=problem.ep, attention_dp=problem.attention_dp,
                        draft=np.ones(len(head), dtype=bool), engine=problem.engine)


def _measured_rows(problem: Problem, flat: list[space.Alternative], table: Any,
                   wl: list[Workload], rows: BlockCosts) -> BlockCosts:
    """``rows`` with measured runtimes when the spec asks for them (``"costs": {"measured":
    "BLOCKS.json"}``; memory stays analytic; a shape the table cannot price is an
    InputError, never priced analytically)."""
    meas = bpm.measured_blocks(problem)
    if meas is None:
        return rows
    if any(getattr(a, "end", None) is not None or getattr(a, "recipe", None) is not None
           for a in flat):
        raise InputError("spans and per-block precision are priced analytically only",
                         field="costs.measured")
    return price_measured(table, problem.hw, problem.recipe, meas, wl, tp=problem.tp,
                          ep=problem.ep, attention_dp=problem.attention_dp)


def deploy_engines(problem: Problem) -> list[str]:
    """The engines the child must load (``deploy.engines``; empty: none required)."""
    d = problem.spec.deploy
    return list(d.engines) if d is not None else []


def _space(problem: Problem) -> list[list[space.Alternative]]:
    """The space ``search_space`` describes, before ``deploy.engines`` restricts it."""
    alts = space.alternatives(problem.parent, problem.spec.search_space)
    space.check_all_used(problem.parent, problem.spec.search_space, alts)
    # spans and a precision per block (nas.spans); nothing changes when the spec asks for
    # neither
    return spans.widen(problem.parent, problem.spec.search_space, problem.recipe, alts)


def alternatives(problem: Problem) -> list[list[space.Alternative]]:
    """Per parent block, its alternatives (parent block first); a spec value no block can
    take is an InputError saying why (:func:`nas.space.check_all_used`). With
    ``deploy.engines``, the alternatives that vary an axis some target engine does not
    take are dropped (:func:`nas.engines.restrict`; :func:`deploy_notes` says which)."""
    alts = _space(problem)
    return engines.restrict(problem.parent, alts, deploy_engines(problem))[0]


def deploy_notes(problem: Problem) -> list[str]:
    """What ``deploy.engines`` took out of the space, one line per (engine, axis), and the
    axes it ties (empty without ``deploy``)."""
    eng = deploy_engines(problem)
    if not eng:
        return []
    notes = engines.restrict(problem.parent, _space(problem), eng)[1]
    for axis, who in engines.tied_axes(problem.parent, eng).items():
        notes.append(f"{', '.join(who)} hold{'s' * (len(who) == 1)} {axis} global: one value "
                     f"for every {engines.axis_kind(axis)} block (a tied choice)")
    return notes


@dataclass
class Priced:
    """Every alternative priced: block costs (rows in flattened alternative order) and the
    non-block term."""

    rows: BlockCosts
    params: np.ndarray
    active_params: np.ndarray
    nonblock: NonBlockCosts
    workspace_bytes: dict[str, float]
    head: BlockCosts | None = None
    """The parent's MTP head (:func:`price_head`), or ``None`` when no workload drafts."""

    def with_head(self, rows: BlockCosts) -> BlockCosts:
        """``rows`` followed by the MTP head's rows (``rows`` itself without a head)."""
        return rows if self.head is None else BlockCosts.concat([rows, self.head])


def _flat(alts: list[list[space.Alternative]]) -> list[space.Alternative]:
    return [a for block in alts for a in block]


def price(problem: Problem, alts: list[list[space.Alternative]],
          progress: bool | None = None) -> Priced:
    """Price every alternative for every workload (vectorized costmodels pass)."""
    flat = _flat(alts)
    h = problem.parent.hidden_size
    wl = list(problem.workloads.values())
    wide = spans.is_wide(alts)
    with Progress(len(flat), "pricing", progress) as bar:
        table = None if wide else blocks_table([a.child for a in flat], h)
        if wide:  # a span is the sum of its child blocks, each under its own recipe
            rows, wide_params, wide_active = spans.price_alternatives(
                flat, h, problem.hw, problem.recipe, wl, tp=problem.tp, ep=problem.ep,
                attention_dp=problem.attention_dp, engine=problem.engine)
        else:
            rows = price_blocks(table, problem.hw, problem.recipe, wl, tp=problem.tp,
                                ep=problem.ep, attention_dp=problem.attention_dp,
                                engine=problem.engine)
        bar.update(len(flat))
    rows = _measured_rows(problem, flat, table, wl, rows)
    nb = price_nonblock(nonblock_shape(problem.parent), problem.hw, problem.recipe, wl,
                        tp=problem.tp, attention_dp=problem.attention_dp, draft=problem.mtp,
                        engine=problem.engine)
    head = price_head(problem)
    # activation workspace is a max over blocks, not a sum: hold the parent's (a child is no
    # wider; with its MTP head) as a constant, so memory budgets stay linear and
    # conservative; costmodels' workspaces of a workload (summarize) and of max_concurrency
    # ("#conc")
    parent_rows = rows.take([i for i, a in enumerate(flat) if a.is_parent])
    if head is not None:
        parent_rows = BlockCosts.concat([parent_rows, head])
    per_workload = workload_workspace_bytes(parent_rows, nb)
    workspace = {}
    for j, w in enumerate(wl):
        workspace[w.name] = float(per_workload[j])
        workspace[w.name + "#conc"] = concurrency_workspace_bytes(parent_rows, nb, w.max_context)
    # max_concurrency's workspace grows with its n sequences (costmodels.model
    # .step_workspace_bytes): the parent's widest bytes per token sizes it at any n
    workspace["#widest"] = (float(parent_rows.workspace_bytes_per_token.max())
                            if len(parent_rows) else 0.0)
    if wide:
        return Priced(rows, wide_params, wide_active, nb, workspace, head)
    assert table is not None
    return Priced(rows, shapes.params(table).astype(np.float64),
                  shapes.params(table, active=True).astype(np.float64), nb, workspace, head)


def score(problem: Problem, alts: list[list[space.Alternative]]) -> tuple[np.ndarray, str]:
    """Quality score per alternative (lower is better) and a label of where it came from."""
    qs = problem.spec.quality
    if qs.scores:
        path = Path(qs.scores)
        path = path if path.is_absolute() else problem.base_dir / path
        table = q.load_scores(path, qs.metric)
        return q.scores_for(alts, table, str(path)), f"measured: {path.name} ({qs.metric})"
    if spans.is_wide(alts):
        return spans.prior(problem.parent, alts, problem.recipe,
                           problem.spec.search_space.precision.searched()), q.PRIOR_LABEL
    return q.structural_prior(list(problem.parent.blocks), alts), q.PRIOR_LABEL


def build_library(problem: Problem, alts: list[list[space.Alternative]], priced: Priced,
                  quality: np.ndarray) -> BlockLibrary:
    """The block library the MIP reads (one replacement per alternative)."""
    flat = _flat(alts)
    pa = problem.parent
    nb_params = sum(pa.nonblock_role_params().values())
    nb_active = nb_params
    costs: dict[str, np.ndarray] = {
        "params": priced.params, "active_params": priced.active_params,
        "weight_bytes": priced.rows.weight_bytes,
    }
    nb = priced.nonblock
    # the MTP head (module docstring): a constant of every key, zero without drafts
    hd = priced.head
    constants: dict[str, float] = {
        "params": float(nb_params), "active_params": float(nb_active),
        "weight_bytes": float(nb.weight_bytes) + (0.0 if hd is None
                                                  else float(hd.weight_bytes.sum()))}
    wls = list(problem.workloads.values())
    snaps = spec_state_snapshots(wls)
    for j, w in enumerate(wls):
        n = w.name
        # speculative decoding's state snapshots: snaps[j] more states per sequence
        extra = snaps[j] * w.sequences
        costs[f"ttft_s@{n}"] = priced.rows.prefill_s[:, j]
        costs[f"tpot_s@{n}"] = priced.rows.decode_s[:, j]
        costs[f"runtime_s@{n}"] = priced.rows.runtime_s[:, j]
        costs[f"memory_bytes@{n}"] = (priced.rows.memory_bytes[:, j]
                                      + extra * priced.rows.state_bytes_per_sequence)
        # the engine's front-end latency reaches TTFT too (costmodels.model.summarize)
        constants[f"ttft_s@{n}"] = float(nb.prefill_s[j]) + nb.request_latency_s
        constants[f"tpot_s@{n}"] = float(nb.decode_s[j])
        constants[f"runtime_s@{n}"] = float(nb.runtime_s[j])
        constants[f"memory_bytes@{n}"] = (nb.weight_bytes + priced.workspace_bytes[n]
                                          + problem.reserve_bytes)
        if hd is not None:
            constants[f"ttft_s@{n}"] += float(hd.prefill_s[:, j].sum())
            constants[f"tpot_s@{n}"] += float(hd.decode_s[:, j].sum())
            constants[f"runtime_s@{n}"] += float(hd.runtime_s[:, j].sum())
            constants[f"memory_bytes@{n}"] += float(
                hd.memory_bytes[:, j].sum() + extra * hd.state_bytes_per_sequence.sum())
    tags = []
    for a in flat:
        if a.end is not None:  # a span: no kept:<kind> tag (count rules count whole blocks)
            t = ["span", *sorted({c.kind for c in a.blocks} or {"noop"}),
                 *sorted({f"parent:{b.kind}" for b in pa.blocks[a.block:a.stop]})]
        else:
            t = [a.child.kind, f"parent:{pa.blocks[a.block].kind}"]
            if not isinstance(a.child, NoOp):
                t.append(f"kept:{pa.blocks[a.block].kind}")
        if a.recipe is not None:
            t.append(f"precision:{a.recipe}")
        tags.append(t)
    return BlockLibrary(
        num_blocks=pa.num_blocks,
        start=[a.block for a in flat], end=[a.stop for a in flat],
        costs=costs, scores={"quality": quality},
        labels=[a.label for a in flat], tags=tags,
        children=[[{**c.model_dump(), **({"precision": a.recipe} if a.recipe else {})}
                   for c in a.blocks] for a in flat],
        constants=constants,
        block_names=[f"{i}:{b.kind}" for i, b in enumerate(pa.blocks)],
    )


# ---- constraints ------------------------------------------------------------------------
@dataclass
class Constraints:
    """The MIP's objective, budget rows and count rows, with where each came from."""

    objective: mip.Objective
    budgets: list[mip.Budget]
    counts: list[mip.CountRule]
    described: list[str] = field(default_factory=list)
    # per budget row: (index of the spec budget it came from, library key it bounds)
    origin: list[tuple[int, str]] = field(default_factory=list)
    count_origin: list[int] = field(default_factory=list)
    # cost columns the rows bound beyond the library's own (memory_bytes@W#N: memory with N
    # sequences at W's context), each with its constant; see extend()
    columns: dict[str, tuple[np.ndarray, float]] = field(default_factory=dict)
    # deploy.engines: the tied choices (one per axis a target engine holds global), the
    # replacements no target engine loads (a span holding two values of a tied axis), and
    # what the engines took out of the space (deploy_notes)
    ties: list[mip.Tie] = field(default_factory=list)
    forbid: list[int] = field(default_factory=list)
    engine_notes: list[str] = field(default_factory=list)

    def extend(self, library: BlockLibrary) -> BlockLibrary:
        """``library`` with :attr:`columns` added: a new library (``library`` itself when it
        already has them all); the MIP reads this one."""
        new = {k: v for k, v in self.columns.items() if k not in library.costs}
        if not new:
            return library
        return BlockLibrary(
            library.num_blocks, library.start, library.end,
            {**library.costs, **{k: v for k, (v, _) in new.items()}}, library.scores,
            labels=library.labels, tags=library.tags, children=library.children,
            constants={**library.constants, **{k: c for k, (_, c) in new.items()}},
            block_names=library.block_names, descriptive=library.descriptive,
            source=library.source)


def parent_totals(library: BlockLibrary) -> dict[str, float]:
    """Totals of every key for the parent (its own alternative in every block)."""
    idx = [i for i, lab in enumerate(library.labels) if lab == "parent"]
    return {k: float(v[idx].sum()) + library.constants.get(k, 0.0)
            for k, v in {**library.costs, **library.scores}.items()}


def _concurrency_key(problem: Problem, library: BlockLibrary, priced: Priced | None,
                     wname: str, n: int, columns: dict[str, tuple[np.ndarray, float]]) -> str:
    """The key of ``memory_bytes@W#N`` (memory with N sequences at W's context), its column
    and constant put in ``columns`` unless ``library`` has it (the library is not changed)."""
    key = f"memory_bytes@{wname}#{n}"
    if key in library.costs or key in columns:
        return key
    w = problem.workloads[wname]
    if priced is None:
        raise InputError("max_concurrency budgets need the priced rows")
    rows = priced.rows
    per_seq = rows.kv_bytes(w.max_context) + rows.state_bytes_per_sequence
    head = 0.0  # the MTP head's weights and its n sequences' KV and state (a constant)
    if priced.head is not None:
        hd = priced.head
        head = float(hd.weight_bytes.sum() + n * (hd.kv_bytes(w.max_context).sum()
                                                  + hd.state_bytes_per_sequence.sum()))
    ctx = float(w.max_context)  # costmodels' max_concurrency at a context: prompts of ctx
    ws = float(memory_workspace(priced.workspace_bytes["#widest"],
                                max(min(n * ctx, DEFAULT_PREFILL_CHUNK), n), n,
                                priced.nonblock.vocab_per_gpu))
    columns[key] = (rows.weight_bytes + n * per_seq,
                    priced.nonblock.weight_bytes + ws + problem.reserve_bytes + head)
    return key


def budget_rows(problem: Problem, library: BlockLibrary, b: BudgetSpec, index: int,
                priced: Priced | None = None, override: str | float | None = None,
                columns: dict[str, tuple[np.ndarray, float]] | None = None
                ) -> tuple[list[mip.Budget], list[mip.CountRule], str]:
    """Translate one spec budget into MIP rows (``override`` replaces its bound); cost
    columns the rows need beyond the library's go into ``columns``."""
    columns = {} if columns is None else columns
    where = f"budgets[{index}]"
    parent = parent_totals(library)
    m, wname = b.metric, b.workload
    if m == "kept_blocks":
        lo = None if b.min is None else int(parse_quantity(b.min, m, where + ".min")[0])
        hi = None if b.max is None else int(parse_quantity(b.max, m, where + ".max")[0])
        if override is not None:
            v = int(parse_quantity(override, m, where)[0])
            lo, hi = (v, hi) if b.min is not None else (lo, v)
        rule = mip.CountRule(f"kept:{b.kind}", lo, hi, unit="blocks")
        return [], [rule], f"kept_blocks {str(rule).removeprefix('blocks:kept:')}"

    w = problem.workloads.get(wname or "")
    out: list[mip.Budget] = []
    text = []
    for side in ("max", "min"):
        raw = getattr(b, side)
        if raw is None:
            continue
        if override is not None:
            raw = override
        val, rel = parse_quantity(raw, m, f"{where}.{side}")
        lower_is_bound = side == "min"
        if m in ("throughput", "per_user_tps"):
            if side != "min":
                raise InputError(f"{m} takes a min (a speed target)", field=f"{where}.max")
            key = f"runtime_s@{wname}" if m == "throughput" else f"tpot_s@{wname}"
            if rel:
                bound = parent[key] / val
            elif m == "throughput":
                bound = w.sequences * w.osl / (val * problem.tp)  # type: ignore[union-attr]
            else:
                bound = 1.0 / val
            out.append(mip.Budget(key, None, bound))
            text.append(f"{m}@{wname} >= {raw}")
            continue
        if m == "max_concurrency":
            if side != "min":
                raise InputError("max_concurrency takes a min", field=f"{where}.max")
            n = int(math.ceil(val * (parent_max_concurrency(problem, library, priced, wname)
                                     if rel else 1.0)))
            key = _concurrency_key(problem, library, priced, wname, n,  # type: ignore[arg-type]
                                   columns)
            out.append(mip.Budget(key, None, problem.device_bytes))
            text.append(f"max_concurrency@{wname} >= {n}")
            continue
        key = {"memory": f"memory_bytes@{wname}", "ttft": f"ttft_s@{wname}",
               "tpot": f"tpot_s@{wname}", "runtime": f"runtime_s@{wname}",
               "total_params": "params", "active_params": "active_params",
               "weight_memory": "weight_bytes", "quality": "quality"}[m]
        if math.isnan(val):  # "device"
            val = problem.device_bytes
        bound = parent[key] * val if rel else val
        out.append(mip.Budget(key, bound, None) if lower_is_bound
                   else mip.Budget(key, None, bound))
        text.append(f"{m}{'@' + wname if wname else ''} {'>=' if lower_is_bound else '<='} "
                    f"{raw}")
    return out, [], "; ".join(text)


def parent_max_concurrency(problem: Problem, library: BlockLibrary, priced: Priced | None,
                           wname: str) -> int:
    """Largest concurrency the parent fits at workload ``wname``'s context (per GPU):
    ``costmodels.model.max_concurrency`` of the parent's rows (and its MTP head's)."""
    if priced is None:
        raise InputError("max_concurrency budgets need the priced rows")
    idx = [i for i, lab in enumerate(library.labels) if lab == "parent"]
    return max_concurrency(priced.with_head(priced.rows.take(idx)), priced.nonblock,
                           problem.hw, problem.workloads[wname].max_context,
                           reserve_bytes=problem.reserve_bytes).max_concurrency


def objective_of(problem: Problem) -> mip.Objective:
    o = problem.spec.objective
    if o.minimize == "quality":
        return mip.Objective({"quality": 1.0}, "min")
    target = o.minimize or o.maximize or ""
    metric, _, wname = target.partition("@")
    if o.maximize is not None:
        key = {"throughput": f"runtime_s@{wname}", "per_user_tps": f"tpot_s@{wname}"}.get(metric)
        if key is None or not wname:
            raise InputError("maximize takes 'throughput@WORKLOAD' or 'per_user_tps@WORKLOAD'",
                             field="objective.maximize")
        return mip.Objective({key: 1.0}, "min")
    key = {"runtime": f"runtime_s@{wname}", "tpot": f"tpot_s@{wname}",
           "ttft": f"ttft_s@{wname}", "memory": f"memory_bytes@{wname}",
           "total_params": "params", "active_params": "active_params",
           "weight_memory": "weight_bytes"}.get(metric)
    if key is None or (metric in ("runtime", "tpot", "ttft", "memory") and not wname):
        raise InputError("minimize takes 'quality', 'runtime@W', 'tpot@W', 'ttft@W', "
                         "'memory@W', 'total_params', 'active_params' or 'weight_memory'",
                         field="objective.minimize")
    return mip.Objective({key: 1.0}, "min")


def constraints(problem: Problem, library: BlockLibrary, priced: Priced | None = None
                ) -> Constraints:
    """Objective, budget rows and count rows of the spec (new data: ``library`` is not
    changed; rows on columns it lacks bring them in ``Constraints.columns``)."""
    cons = Constraints(objective_of(problem), [], [])
    eng = deploy_engines(problem)
    if eng:
        cons.ties, cons.forbid = engines.ties(library, engines.tied_axes(problem.parent, eng))
        cons.engine_notes = deploy_notes(problem)
    for i, b in enumerate(problem.spec.budgets):
        rows, counts, text = budget_rows(problem, library, b, i, priced, columns=cons.columns)
        cons.budgets += rows
        cons.counts += counts
        cons.described.append(text)
        cons.origin += [(i, r.key) for r in rows]
        cons.count_origin += [i] * len(counts)
    return cons


def options_of(problem: Problem) -> mip.SolveOptions:
    s = problem.spec.solver
    return mip.SolveOptions(time_limit=s.time_limit, mip_rel_gap=s.gap, threads=s.threads,
                            seed=s.seed)


# ---- homogeneous baseline -----------------------------------------------------------------
def homogeneous_solve(library: BlockLibrary, cons: Constraints,
                      max_combinations: int = 5_000_000) -> mip.Result:
    """Best child where every block of a kind (same parent block) takes the same choice.

    Exact: enumerates every combination of per-group choices with numpy (no MIP), so the
    baseline is the true optimum of the restricted space.
    """
    import time

    library = cons.extend(library)
    t0 = time.perf_counter()
    # group parent blocks by their set of alternative labels (same parent shape)
    by_block: dict[int, list[int]] = {}
    for r in range(library.num_replacements):
        if library.lengths[r] == 1:  # spans (nas.spans) are no per-block choice
            by_block.setdefault(int(library.start[r]), []).append(r)
    groups: dict[tuple[str, ...], list[int]] = {}
    for b in range(library.num_blocks):
        labels = tuple(library.labels[r] for r in by_block[b])
        groups.setdefault((library.block_name(b).split(":", 1)[-1],) + labels, []).append(b)
    keys = list(library.costs) + list(library.scores)
    tag_keys = sorted({c.tag for c in cons.counts})
    allv = {**library.costs, **library.scores}
    gmats, glabels, gbad = [], [], []
    gtie: list[list[np.ndarray]] = [[] for _ in cons.ties]
    forbidden = set(cons.forbid)
    tie_of = [t.group_of(library.num_replacements) for t in cons.ties]
    for gk, blocks in groups.items():
        labels = gk[1:]
        mat = np.zeros((len(labels), len(keys) + len(tag_keys)))
        for b in blocks:
            for li, r in enumerate(by_block[b]):
                mat[li, :len(keys)] += [allv[k][r] for k in keys]
                mat[li, len(keys):] += [float(t in library.tags[r]) * library.lengths[r]
                                        for t in tag_keys]
        gmats.append(mat)
        glabels.append(blocks)
        # a label is out when any of its blocks' replacement is forbidden; its tie group
        # is its first block's (the blocks of a group take one child alike)
        gbad.append(np.array([any(by_block[b][li] in forbidden for b in blocks)
                              for li in range(len(labels))]))
        for t, of in enumerate(tie_of):
            gtie[t].append(np.array([of[by_block[blocks[0]][li]] for li in range(len(labels))]))
    sizes = [m.shape[0] for m in gmats]
    total = math.prod(sizes)
    if total > max_combinations:
        raise InputError(f"homogeneous space has {total:,} combinations (limit "
                         f"{max_combinations:,}); narrow the search space")
    grids = np.meshgrid(*[np.arange(s) for s in sizes], indexing="ij")
    idx = [g.reshape(-1) for g in grids]
    totals = sum(m[i] for m, i in zip(gmats, idx))
    const = np.array([library.constants.get(k, 0.0) for k in keys] + [0.0] * len(tag_keys))
    totals = totals + const
    ok = np.ones(totals.shape[0], dtype=bool)
    for bad, i in zip(gbad, idx):
        ok &= ~bad[i]
    for per_group in gtie:  # every group that takes a value of a tie takes the same one
        v = np.stack([g[i] for g, i in zip(per_group, idx)])
        top = v.max(axis=0)
        low = np.where(v < 0, np.iinfo(np.int64).max, v).min(axis=0)
        ok &= (top < 0) | (low == top)
    col = {k: j for j, k in enumerate(keys + tag_keys)}
    for b in cons.budgets:
        v = totals[:, col[b.key]]
        tol = 1e-9 * max(1.0, abs(b.hi if b.hi is not None else b.lo))  # type: ignore[arg-type]
        if b.hi is not None:
            ok &= v <= b.hi + tol
        if b.lo is not None:
            ok &= v >= b.lo - tol
    for c in cons.counts:
        v = totals[:, col[c.tag]]
        if c.min is not None:
            ok &= v >= c.min
        if c.max is not None:
            ok &= v <= c.max
    obj = sum(w * totals[:, col[k]] for k, w in cons.objective.weights.items())
    if cons.objective.sense == "max":
        obj = -obj
    secs = time.perf_counter() - t0
    if not ok.any():
        return mip.Result("infeasible", None, None, None, 0, secs,
                          message="no homogeneous child meets every budget")
    best = int(np.flatnonzero(ok)[np.argmin(obj[ok])])
    chosen = []
    for gi, blocks in enumerate(glabels):
        li = int(idx[gi][best])
        chosen += [by_block[b][li] for b in blocks]
    chosen_arr = np.asarray(sorted(chosen, key=lambda r: library.start[r]), dtype=np.int64)
    tot = {k: float(totals[best, col[k]]) for k in keys}
    val = float(sum(w * tot[k] for k, w in cons.objective.weights.items()))
    return mip.Result("optimal", val, val, 0.0, 0, secs, chosen=chosen_arr,
                      choices=[int(r) for r in chosen_arr], totals=tot,
                      message=f"exhaustive over {total:,} homogeneous combinations")


def solve(problem: Problem, library: BlockLibrary, cons: Constraints,
          homogeneous: bool | None = None,
          on_solve: Callable[[], None] | None = None) -> list[mip.Result]:
    """Solve (a diverse pool when the spec asks for one); ``on_solve()`` is called after
    each solve of a pool (a progress bar). Raises ``InfeasibleError``."""
    library = cons.extend(library)
    hom = problem.spec.search_space.homogeneous if homogeneous is None else homogeneous
    if hom:
        res = homogeneous_solve(library, cons)
        if res.status == "infeasible":
            raise mip.InfeasibleError("homogeneous search: " + res.message)
        return [res]
    s = problem.spec.solver
    if s.diverse > 1:
        first: list[mip.Result] = []

        def progress(i: int, r: mip.Result) -> None:
            if i == 0:
                first.append(r)
            if on_solve is not None:
                on_solve()

        pool = mip.diverse_pool(library, cons.objective, cons.budgets, n=s.diverse,
                                min_distance=s.min_distance, counts=cons.counts,
                                options=options_of(problem), progress=progress,
                                ties=cons.ties, forbid=cons.forbid)
        if not pool and first:
            check_in_time(problem, first[0])
        return pool
    res = mip.solve(library, cons.objective, cons.budgets, counts=cons.counts,
                    options=options_of(problem), ties=cons.ties, forbid=cons.forbid)
    check_in_time(problem, res)
    return [res.raise_if_infeasible()]


def check_in_time(problem: Problem, res: mip.Result) -> None:
    """Raise a one-line ``InputError`` (naming ``solver.time_limit``) when the solve ran out
    of time before HiGHS found any child: a limit too small for this library, not a solver
    failure."""
    limit = problem.spec.solver.time_limit
    if res.status != "error" or limit is None:
        return
    if "Time limit" in res.message or res.seconds >= 0.95 * limit:
        raise InputError(f"no child found within the time limit of {limit:g} s (HiGHS had "
                         f"not found any child that meets every budget after "
                         f"{res.seconds:.3g} s); raise the limit or remove it",
                         field="solver.time_limit")


def fixed_recipe_forbid(library: BlockLibrary) -> np.ndarray:
    """Indices of the replacements with their own precision recipe (tag ``precision:<name>``,
    ``nas.spans``): forbidding them leaves the spec's one recipe for every block."""
    return np.flatnonzero([any(t.startswith("precision:") for t in tags)
                           for tags in library.tags])


def fixed_recipe_solve(problem: Problem, library: BlockLibrary, cons: Constraints
                       ) -> mip.Result:
    """The best child with the spec's one recipe for every block, same budgets: the
    baseline that searching precision per block is compared with (a subset of its space)."""
    library = cons.extend(library)
    return mip.solve(library, cons.objective, cons.budgets, counts=cons.counts,
                     forbid=[int(i) for i in fixed_recipe_forbid(library)] + cons.forbid,
                     options=options_of(problem), ties=cons.ties)


def child_arch(problem: Problem, library: BlockLibrary, chosen: np.ndarray,
               alts: list[list[space.Alternative]]) -> ModelArch:
    """The child ``ModelArch`` of a solution."""
    flat = _flat(alts)
    if spans.is_wide(alts):  # spans shorten the child (nas.spans.child_blocks)
        kids, _, _ = spans.child_blocks(problem.parent, [flat[int(r)] for r in chosen],
                                        problem.recipe)
        return problem.parent.replace_blocks(kids)
    blocks = [None] * problem.parent.num_blocks
    for r in chosen:
        blocks[int(library.start[r])] = flat[int(r)].child  # type: ignore[call-overload]
    return problem.parent.replace_blocks(blocks)  # type: ignore[arg-type]


def sweep_values(problem: Problem) -> list[str | float]:
    sw = problem.spec.solver.sweep
    assert sw is not None
    if sw.values:
        return list(sw.values)
    if sw.start is None or sw.stop is None:
        raise InputError("give values, or start and stop", field="solver.sweep")
    b = problem.spec.budgets[sw.budget]
    a, rel_a = parse_quantity(sw.start, b.metric, "solver.sweep.start")
    z, rel_z = parse_quantity(sw.stop, b.metric, "solver.sweep.stop")
    if rel_a != rel_z:
        raise InputError("start and stop must both be absolute or both relative",
                         field="solver.sweep")
    vals = np.linspace(a, z, sw.num)
    return [f"{v * 100:.6g}%" for v in vals] if rel_a else [float(v) for v in vals]


# ---- the whole job -------------------------------------------------------------------------
@dataclass
class SearchOutcome:
    """What :func:`run` produced: blueprints (best first), files written, and the pieces."""

    problem: Problem
    library: BlockLibrary
    blueprints: list[Any]
    homogeneous: Any | None
    sweep: dict[str, Any] | None
    files: list[Path]
    timings: dict[str, float]


_SWEEP_UNITS = {"memory": ("GiB", 2**30), "weight_memory": ("GiB", 2**30),
                "ttft": ("ms", 1e-3), "tpot": ("ms", 1e-3), "runtime": ("s", 1.0),
                "per_user_tps": ("tok/s", 1.0), "throughput": ("tok/s per GPU", 1.0),
                "total_params": ("B params", 1e9), "active_params": ("B params", 1e9),
                "quality": ("score", 1.0)}


def _metric_value(problem: Problem, b: BudgetSpec, key: str, total: float) -> float:
    """A library total of ``key`` in the spec metric's own units (for plots)."""
    unit = _SWEEP_UNITS.get(b.metric, ("", 1.0))[1]
    if b.metric == "throughput":
        w = problem.workloads[b.workload]  # type: ignore[index]
        return w.sequences * w.osl / (total * problem.tp)
    if b.metric == "per_user_tps":
        return 1.0 / total
    return total / unit


def _chosen_point(problem: Problem, sweep: dict[str, Any], res: mip.Result
                  ) -> tuple[float, float] | None:
    """The returned child (``res``, blueprint.json) as a point of the sweep's plot: its swept
    metric and its quality (None when its totals lack the swept key)."""
    b = problem.spec.budgets[sweep["budget"]]
    if not res.ok or sweep["key"] not in res.totals or "quality" not in res.totals:
        return None
    return (_metric_value(problem, b, sweep["key"], res.totals[sweep["key"]]),
            res.totals["quality"])


def run_sweep(problem: Problem, library: BlockLibrary, cons: Constraints, priced: Priced,
              homogeneous: bool = False, on_point: Any = None,
              forbid: np.ndarray | list[int] = ()) -> dict[str, Any]:
    """Re-solve over the spec's sweep grid; returns points (metric value, quality).
    ``on_point()`` is called as each point is solved (a progress bar); ``forbid``:
    replacements no point may take (e.g. :func:`fixed_recipe_forbid`)."""
    library = cons.extend(library)
    sw = problem.spec.solver.sweep
    assert sw is not None
    b = problem.spec.budgets[sw.budget]
    if b.metric in ("kept_blocks", "max_concurrency"):
        raise InputError(f"cannot sweep a {b.metric} budget", field="solver.sweep.budget")
    values = sweep_values(problem)
    others = [r for (bi, _), r in zip(cons.origin, cons.budgets) if bi != sw.budget]
    keyed = []
    for v in values:
        rows, _, _ = budget_rows(problem, library, b, sw.budget, priced, override=v)
        keyed.append(rows[0])
    key = keyed[0].key
    points, results = [], []
    for v, row in zip(values, keyed):
        if homogeneous:
            c2 = Constraints(cons.objective, others + [row], cons.counts, ties=cons.ties,
                             forbid=cons.forbid)
            res = homogeneous_solve(library, c2)
            if on_point is not None:
                on_point()
        else:
            res = None
        results.append((v, row, res))
    if not homogeneous:
        hi = [r.hi if r.hi is not None else r.lo for _, r, _ in results]
        sw_res = mip.sweep(library, cons.objective, others, key=key, values=hi,
                           counts=cons.counts, options=options_of(problem),
                           forbid=[int(i) for i in forbid] + cons.forbid, workers=sw.workers,
                           ties=cons.ties,
                           progress=None if on_point is None else lambda i, r: on_point())
        results = [(v, r, res) for (v, r, _), res in zip(results, sw_res.results)]
    for v, _, res in results:
        if res is not None and res.ok:
            points.append({"value": v, "metric": _metric_value(problem, b, key, res.totals[key]),
                           "quality": res.totals["quality"], "status": res.status,
                           "chosen": [int(i) for i in res.chosen]})
        else:
            points.append({"value": v, "metric": None, "quality": None,
                           "status": res.status if res is not None else "error",
                           "chosen": []})
    parent = parent_totals(library)
    return {"budget": sw.budget, "metric": b.metric, "workload": b.workload, "key": key,
            "unit": _SWEEP_UNITS.get(b.metric, ("", 1.0))[0],
            "parent": {"metric": _metric_value(problem, b, key, parent[key]),
                       "quality": parent["quality"]},
            "points": points}


def with_batch(problem: Problem, workload: str, size: int) -> Problem:
    """A copy of ``problem`` with ``workload``'s batch (or concurrency) set to ``size``."""
    w = problem.workloads[workload]
    field_ = "batch" if w.batch is not None else "concurrency"
    wls = dict(problem.workloads)
    wls[workload] = w.model_copy(update={field_: size})
    return Problem(problem.spec, problem.base_dir, problem.spec_hash, problem.parent,
                   problem.hw, problem.recipe, wls, problem.reserve_bytes)


def run_batch_sweep(problem: Problem, alts: list[list[space.Alternative]],
                    quality: np.ndarray, homogeneous: bool = False,
                    progress: bool | None = None) -> dict[str, Any]:
    """The sweep grid solved once per batch size; per grid point the best child is kept.

    Relative bounds resolve against the parent at each batch size, so give absolute targets
    (e.g. tok/s) when sweeping batch sizes.
    """
    sw = problem.spec.solver.sweep
    assert sw is not None and sw.workload is not None and sw.batch_sizes
    per_batch = []
    with Progress(len(sw.batch_sizes), "batch sizes", progress) as bar:
        for size in sw.batch_sizes:
            pb = with_batch(problem, sw.workload, size)
            priced = price(pb, alts, progress=False)
            lib = build_library(pb, alts, priced, quality)
            cons = constraints(pb, lib, priced)
            res = run_sweep(pb, lib, cons, priced, homogeneous)
            per_batch.append((size, res))
            bar.update(1)
    out = dict(per_batch[0][1])
    points = []
    for i in range(len(out["points"])):
        cands = [(res["points"][i], size) for size, res in per_batch
                 if res["points"][i]["quality"] is not None]
        if not cands:
            points.append({**per_batch[0][1]["points"][i], "batch": None})
            continue
        best, size = min(cands, key=lambda c: c[0]["quality"])
        points.append({**best, "batch": size})
    out["points"] = points
    # the parent at its best batch size for the swept metric
    better = max if out["metric"] in HIGHER_IS_BETTER else min
    psize, pres = better(per_batch, key=lambda c: c[1]["parent"]["metric"])
    out["parent"] = {**pres["parent"], "batch": psize}
    out["batch_sizes"] = list(sw.batch_sizes)
    out["batch_workload"] = sw.workload
    return out


def slo_workload(problem: Problem) -> str | None:
    """The workload with an SLO (at most one), or None."""
    names = [n for n, w in problem.spec.workloads.items() if w.slo]
    if len(names) > 1:
        raise InputError(f"only one workload may carry an slo, got {names}", field="workloads")
    return names[0] if names else None


def parent_slo_point(problem: Problem, wname: str) -> SLOPoint:
    """The parent's best throughput under ``wname``'s SLO (``costmodels.serving``)."""
    ws = problem.spec.workloads[wname]
    table, draft = serving_table(problem.parent, problem.mtp)  # with its MTP head if drafting
    return slo_throughput(table, nonblock_shape(problem.parent), problem.hw,
                          problem.recipe, problem.workloads[wname], parse_slo(ws.slo),
                          tp=problem.tp, ep=problem.ep, reserve_bytes=problem.reserve_bytes,
                          attention_dp=problem.attention_dp,
                          concurrencies=ws.concurrency_sweep, draft=draft,
                          engine=problem.engine)


def slo_problem(problem: Problem, wname: str, parent_pt: SLOPoint) -> Problem:
    """``problem`` with the SLO of ``wname`` as budgets (per-user speed, TTFT, memory <=
    device) and its relative throughput bounds turned into tok/s per GPU against the
    parent's SLO throughput, so that every concurrency of the sweep answers the same
    question."""
    spec = problem.spec
    slo = parse_slo(spec.workloads[wname].slo)
    budgets = []
    for i, b in enumerate(spec.budgets):
        if b.metric == "throughput" and b.workload == wname and b.min is not None:
            val, rel = parse_quantity(b.min, "throughput", f"budgets[{i}].min")
            if rel:
                if not parent_pt.feasible:
                    raise InputError(f"the parent meets {slo.label()} at no concurrency, so "
                                     f"{b.min} of it means nothing; give tok/s",
                                     field=f"budgets[{i}].min")
                b = b.model_copy(update={"min": f"{val * parent_pt.throughput_tok_s:.6g} tok/s"})
        budgets.append(b)
    extra = [BudgetSpec(metric="memory", workload=wname, max="device")]
    if slo.per_user_tps is not None:
        extra.append(BudgetSpec(metric="per_user_tps", workload=wname,
                                min=f"{slo.per_user_tps:g} tok/s"))
    if slo.ttft_s is not None:
        extra.append(BudgetSpec(metric="ttft", workload=wname, max=f"{slo.ttft_s * 1e3:g} ms"))
    spec2 = spec.model_copy(update={"budgets": budgets + extra})
    return Problem(spec2, problem.base_dir, problem.spec_hash, problem.parent, problem.hw,
                   problem.recipe, dict(problem.workloads), problem.reserve_bytes)


@dataclass
class SLOSweep:
    """The concurrency sweep of an SLO workload: the best point and every point tried."""

    workload: str
    parent: SLOPoint
    best: int | None
    points: list[dict[str, Any]]


def solve_slo(problem: Problem, alts: list[list[space.Alternative]], quality: np.ndarray,
              wname: str, progress: bool | None = None
              ) -> tuple[Problem, Priced, BlockLibrary, Constraints, list[mip.Result], SLOSweep]:
    """Solve once per concurrency of the SLO workload ``wname`` (the Puzzle paper's sweep
    over batch sizes) and keep the best child: the lowest objective, or for a throughput
    objective on ``wname`` the highest throughput. Raises ``InfeasibleError`` when no
    concurrency admits a child."""
    ws = problem.spec.workloads[wname]
    parent_pt = parent_slo_point(problem, wname)
    base = slo_problem(problem, wname, parent_pt)
    w = problem.workloads[wname]
    grid = ws.concurrency_sweep or concurrency_grid(w.max_num_seqs)
    obj = problem.spec.objective.maximize or ""
    by_throughput = obj == f"throughput@{wname}"
    best: tuple | None = None
    points: list[dict[str, Any]] = []
    with Progress(len(grid), f"SLO sweep of {wname}", progress) as bar:
        for c in grid:
            pb = with_batch(base, wname, c)
            priced = price(pb, alts, progress=False)
            lib = build_library(pb, alts, priced, quality)
            cons = constraints(pb, lib, priced)
            try:
                results = solve(pb, lib, cons)
            except mip.InfeasibleError:
                points.append({"concurrency": c, "feasible": False})
                bar.update(1)
                continue
            r = results[0]
            thr = c * w.osl / (r.totals[f"runtime_s@{wname}"] * pb.tp)
            points.append({"concurrency": c, "feasible": True, "objective": r.objective,
                           "throughput_tok_s": thr})
            key = -thr if by_throughput else float(r.objective or 0.0)
            if best is None or key < best[0]:
                best = (key, c, (pb, priced, lib, cons, results))
            bar.update(1)
    if best is None:
        raise mip.InfeasibleError(
            f"no concurrency of {wname} in {grid[0]}..{grid[-1]} admits a child under "
            f"{ws.slo} and the budgets (the parent's best: concurrency "
            f"{parent_pt.concurrency}, {parent_pt.throughput_tok_s:,.0f} tok/s per GPU)")
    pb, priced, lib, cons, results = best[2]
    return pb, priced, lib, cons, results, SLOSweep(wname, parent_pt, best[1], points)


def run(spec: SearchSpec, base_dir: str | Path, out_dir: str | Path, spec_hash: str = "",
        progress: bool | None = None) -> SearchOutcome:
    """spec -> blueprint(s), ``report.md``, ``library.json`` and ``pareto.png`` in ``out_dir``.
    One run at a time per ``out_dir`` (:func:`nas.io.output_lock`): a second is refused with
    an ``InputError`` before any work."""
    with output_lock(out_dir, "output folder"):
        return _run(spec, base_dir, out_dir, spec_hash, progress)


def _run(spec: SearchSpec, base_dir: str | Path, out_dir: str | Path, spec_hash: str,
         progress: bool | None) -> SearchOutcome:
    import time

    t: dict[str, float] = {}
    t0 = time.perf_counter()
    # the output folder is checked before any work (created, writable, no foreign files)
    check_output_dir(out_dir, bpm.is_search_output, "output folder")
    problem = resolve(spec, base_dir, spec_hash)
    alts = alternatives(problem)
    t["space_s"] = time.perf_counter() - t0
    t1 = time.perf_counter()
    priced = price(problem, alts, progress)
    quality, qsource = score(problem, alts)
    t["price_s"] = time.perf_counter() - t1
    t2 = time.perf_counter()
    # SIGINT / SIGTERM while solving: recorded, the HiGHS run stopped, then raised here
    # (never swallowed by HiGHS' callbacks, see nas.mip.interrupt); nothing is written
    with interrupt.deferred():
        slo_w = slo_workload(problem)
        slo_sweep = None
        if slo_w is not None:
            problem, priced, library, cons, results, slo_sweep = solve_slo(
                problem, alts, quality, slo_w, progress)
        else:
            library = build_library(problem, alts, priced, quality)
            cons = constraints(problem, library, priced)
            pool = problem.spec.solver.diverse if problem.spec.solver.diverse > 1 else 1
            with Progress(pool, "solving", progress) as bar:
                results = solve(problem, library, cons,
                                on_solve=(lambda: bar.update(1)) if pool > 1 else None)
                if pool == 1:
                    bar.update(1)
        library = cons.extend(library)  # with the columns the budgets bound (blueprints, library.json)
        hom_res = None
        if problem.spec.search_space.compare_homogeneous and not problem.spec.search_space.homogeneous:
            hom_res = homogeneous_solve(library, cons)
        prec = problem.spec.search_space.precision
        compare_fixed = prec.compare_fixed and prec.searched() and slo_w is None
        fixed_res = fixed_recipe_solve(problem, library, cons) if compare_fixed else None
        t["solve_s"] = time.perf_counter() - t2

        parent_pred = bpm.predict(problem.parent, problem)

        def blueprint(r: mip.Result) -> Any:
            return bpm.make_blueprint(problem, library, alts, r, cons, qsource,
                                      child_arch(problem, library, r.chosen, alts), parent_pred)

        blueprints = [blueprint(r) for r in results]
        hom_bp = blueprint(hom_res) if hom_res is not None and hom_res.ok else None
        fixed_bp = blueprint(fixed_res) if fixed_res is not None and fixed_res.ok else None
        sweep = None
        writers: list[Any] = []  # deferred: every output is written at the end, as one set
        if problem.spec.solver.sweep is not None:
            t3 = time.perf_counter()
            n_points = 1 if problem.spec.solver.sweep.batch_sizes else \
                len(sweep_values(problem)) * (1 + problem.spec.search_space.compare_homogeneous)
            with Progress(n_points, "sweeping", progress) as bar:
                hom = problem.spec.search_space.homogeneous
                if problem.spec.solver.sweep.batch_sizes:
                    sweep = run_batch_sweep(problem, alts, quality, hom, progress=False)
                    if problem.spec.search_space.compare_homogeneous:
                        sweep["homogeneous"] = run_batch_sweep(problem, alts, quality, True,
                                                               progress=False)["points"]
                    bar.update(1)
                else:
                    sweep = run_sweep(problem, library, cons, priced, homogeneous=hom,
                                      on_point=bar.update)
                    if problem.spec.search_space.compare_homogeneous:
                        sweep["homogeneous"] = run_sweep(problem, library, cons, priced,
                                                         homogeneous=True,
                                                         on_point=bar.update)["points"]
                    if compare_fixed:  # one recipe for all vs precision searched
                        sweep["fixed_recipe"] = run_sweep(
                            problem, library, cons, priced, on_point=bar.update,
                            forbid=fixed_recipe_forbid(library))["points"]
            t["sweep_s"] = time.perf_counter() - t3
            pts = [(p["metric"], p["quality"]) for p in sweep["points"] if p["metric"] is not None]
            base = [(p["metric"], p["quality"]) for p in sweep.get("homogeneous", [])
                    if p["metric"] is not None] or None
            par = sweep["parent"]
            unit = sweep["unit"]
            label = f"{sweep['metric']}" + (f"@{sweep['workload']}" if sweep["workload"] else "")
            more = {f"one recipe for all ({problem.recipe.name})":
                    [(p["metric"], p["quality"]) for p in sweep["fixed_recipe"]
                     if p["metric"] is not None]} if "fixed_recipe" in sweep else None
            chosen = _chosen_point(problem, sweep, results[0])
            writers.append(lambda folder: bpm.plot_pareto(
                folder / "pareto.png", label, unit, pts, (par["metric"], par["quality"]), base,
                quality_label=f"quality: {qsource}",
                title=f"{problem.spec.name}: quality vs {label}", more=more, chosen=chosen,
                higher_is_better=sweep["metric"] in HIGHER_IS_BETTER))
    t["total_s"] = time.perf_counter() - t0
    report = bpm.report_markdown(blueprints[0], hom_bp, fixed=fixed_bp)
    extra: dict[str, Any] = {"library.json": library_json(library)}
    if slo_sweep is not None:
        pt = slo_sweep.parent
        extra["slo_sweep.json"] = {
            "workload": slo_sweep.workload, "slo": problem.spec.workloads[slo_sweep.workload].slo,
            "best_concurrency": slo_sweep.best,
            "parent": {"concurrency": pt.concurrency, "throughput_tok_s": pt.throughput_tok_s,
                       "per_user_tok_s": pt.per_user_tok_s},
            "points": slo_sweep.points}
    if sweep is not None:
        extra["sweep.json"] = sweep
    files = bpm.save_outputs(out_dir, blueprints, report, extra, writers)
    return SearchOutcome(problem, library, blueprints, hom_bp, sweep, files, t)


def library_json(library: BlockLibrary) -> dict[str, Any]:
    """The library as its JSON file object (``puzzle-nas solve`` reads it)."""
    return library.to_dict()
