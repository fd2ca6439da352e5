"""The search problem: the spec resolved (:class:`Problem`: parent, profile, recipe,
workloads), its alternatives, priced (:func:`price`, one vectorized costmodels pass) and
scored (:func:`score`: a score file or the structural prior), and the block library the MIP
reads (:func:`build_library`).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

import hwprofiles
from costmodels import shapes
from costmodels.blocks import BlockCosts, price_blocks
from costmodels.dtypes import PrecisionRecipe, get_recipe, recipe_from_dict
from costmodels.measured import price_measured
from costmodels.model import (
    NonBlockCosts,
    concurrency_workspace_bytes,
    engine_limits,
    price_nonblock,
    spec_state_snapshots,
    workload_workspace_bytes,
)
from costmodels.target import Target
from costmodels.workload import Workload
from hwprofiles.errors import InputError
from hwprofiles.schema import HardwareProfile
from nas import engines, space
from nas.arch import ModelArch, NoOp, blocks_table, mtp_table
from nas.hf import Parent, read_parent
from nas.library import BlockLibrary
from nas.progress import Progress
from nas.search import blueprint as bpm
from nas.search.blueprint import nonblock_shape
from nas.space import quality as q
from nas.space import spans
from nas.spec import SearchSpec, parse_quantity


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
    def target(self) -> Target:
        """The deployment target (``hardware``: device, TP, EP, attention DP, engine) that
        every price of this problem takes."""
        return Target(self.hw, self.tp, self.ep, self.attention_dp, self.engine)

    @property
    def device_bytes(self) -> float:
        """Usable memory of one GPU (bytes); memory figures are per GPU."""
        return float(self.hw.memory_bytes.value)

    @property
    def mtp(self) -> bool:
        """Whether the parent's MTP head serves: some workload drafts tokens with it."""
        return any(w.draft_tokens > 0 for w in self.workloads.values())


def resolve_profile(profile: str, base_dir: str | Path = ".") -> HardwareProfile:
    """The hardware profile a spec names: a ``.json`` file beside the spec (relative to
    ``base_dir``) when one is there, else a shipped profile's name or alias (``h100``), or
    a profile file path. The one rule every command resolves a spec's profile by."""
    pp = Path(base_dir) / profile
    return hwprofiles.get(str(pp) if profile.endswith(".json") and pp.exists() else profile)


def resolve(spec: SearchSpec, base_dir: str | Path = ".", spec_hash: str = "",
            known: Parent | None = None) -> Problem:
    """Load the parent, the hardware profile and the recipe a spec names. ``known``: a
    parent the caller already read; taken as the spec's when it was read from the file the
    spec names (so it is not read again)."""
    base = Path(base_dir)
    parent = read_parent(spec.parent, base, "spec: parent", known).arch
    parent.check_tp(spec.hw.tp, "hardware.tp", attention=not spec.hw.attention_dp)
    hw = resolve_profile(spec.hw.profile, base)
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
                        **problem.target.block_kwargs(np.ones(len(head), dtype=bool)))


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
    return list(d.engines or []) if d is not None else []


def _space(problem: Problem) -> list[list[space.Alternative]]:
    """The space ``search_space`` describes, before ``deploy.engines`` restricts it."""
    alts = space.alternatives(problem.parent, problem.spec.search_space)
    space.check_all_used(problem.parent, problem.spec.search_space, alts)
    # spans and a precision per block (nas.space.spans); nothing changes when the spec asks for
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
        table: shapes.BlockTable | None = None
        if wide:  # a span is the sum of its child blocks, each under its own recipe
            rows, wide_params, wide_active = spans.price_alternatives(
                flat, h, problem.hw, problem.recipe, wl, tp=problem.tp, ep=problem.ep,
                attention_dp=problem.attention_dp, engine=problem.engine)
        else:
            table = blocks_table([a.child for a in flat], h)
            rows = price_blocks(table, problem.hw, problem.recipe, wl,
                                **problem.target.block_kwargs())
        bar.update(len(flat))
    rows = _measured_rows(problem, flat, table, wl, rows)
    nb = price_nonblock(nonblock_shape(problem.parent), problem.hw, problem.recipe, wl,
                        **problem.target.nonblock_kwargs([problem.mtp]),
                        measured=bpm.measured_nonblock(bpm.measured_blocks(problem),
                                                       problem.parent))
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


def library_json(library: BlockLibrary) -> dict[str, Any]:
    """The library as its JSON file object (``puzzle-nas solve`` reads it)."""
    return library.to_dict()
