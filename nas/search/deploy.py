"""The child and its deployment searched together (``deploy.candidates``, issue 52).

A spec's ``deploy.candidates`` (:class:`nas.deployspec.DeployCandidates`) lists devices,
parallel layouts, attention DP settings, serving engines and MTP drafts; crossed, they are
the candidate deployments (:func:`expand`, every combination checked against the parent and
every alternative first: one line naming a combination that cannot serve). The search picks
one deployment and one alternative per block together:

* ``objective: "cost"`` (the default): the least **cost per million generated tokens** under
  the spec's budgets (a quality budget bounds the quality, SLO budgets the serving);
* ``objective: "quality"``: the best quality under the budgets and ``max_cost``.

Cost per million tokens of a workload ``W`` served at concurrency (or batch) ``B`` on a
deployment of ``g`` GPUs per replica at price ``p`` per GPU-hour (1 without prices: GPU-hours)
is ``p * g * runtime_s@W / (B * osl) / 3600 * 1e6``: the replica's GPU-time over the tokens it
generates in one cycle of the serving model (``costmodels.model``), linear in the child's
additive ``runtime_s@W``. With several workloads it is the weighted sum over their token
shares (``mix``, default equal). So for a fixed deployment the cost is one more additive
library column (:data:`COST_KEY`), and the joint problem is one MIP per deployment.

**Exact, with bounds that prune** (:func:`joint_search`). Each deployment (and, for a workload
with an SLO, each concurrency of its sweep: an *operating point*) is priced with the
existing machinery (:func:`nas.search.problem.price`, :func:`~nas.search.problem.build_library`,
:func:`~nas.search.budgets.constraints`) and gets a lower bound on its optimum: the shortest
path of the objective column over the replacement graph, every budget ignored (and
``+inf`` where a shortest path already proves some budget unreachable). The points are
solved best bound first, by the same MIP (:func:`nas.mip.solve`); a point whose bound is
no better than the best child found so far is not solved (*pruned*): no child on it can be
better. The joint status means what one MIP's does: ``optimal`` when every point solved was
proven optimal (within ``solver.gap``) or infeasible and every other one pruned by its
bound; ``feasible`` when some solve stopped short (its bound enters the joint gap);
``infeasible`` when no point admits a child.

Every deployment also serves only children that fit: ``memory@W <= device`` is added for
every workload on every point (the parent too). Relative budgets (``"60%"``) resolve
against the parent on each deployment. Beside the joint answer: the best child of the
spec's own ``hardware`` deployment (the *fixed* deployment) under the same rows, and the
parent at its best deployment (the cheapest point where it meets every per-workload budget),
so a child's gain is measured against the parent's best, not its worst.

**The Pareto front** of quality against cost per million tokens over every deployment
(:func:`pareto_front`, ``deploy.candidates.front``): the least cost under a bound on the
quality, the bound stepped down from the cheapest child's quality to the best reachable
one, each step one best-bound-first search over the same points and MIPs (a point's bound
is its last optimum or its LP relaxation's under the new bound), each point naming its
deployment and its child; written into ``deploy.json`` and plotted (:func:`plot_front`).
"""

from __future__ import annotations

import itertools
import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict

import hwprofiles
from costmodels.serving import concurrency_grid
from hwprofiles.errors import InputError
from nas import mip, space
from nas.arch import ModelArch
from nas.deployspec import MAX_CANDIDATES, MAX_FRONT_POINTS, DeployCandidates, MTPCandidate
from nas.library import BlockLibrary
from nas.progress import Progress
from nas.search.baselines import homogeneous_solve
from nas.search.budgets import Constraints, constraints, options_of, parent_totals
from nas.search.problem import Problem, alternatives, build_library, price, resolve, score
from nas.search.solver import check_in_time
from nas.search.sweeps import parent_slo_point, slo_problem, slo_workload, with_batch
from nas.spec import SearchSpec

COST_KEY = "cost_per_mtok"
"""The library column of cost per million generated tokens (money or GPU-hours)."""

FIELD = "deploy.candidates"

FRONT_PNG = "deploy_front.png"
"""The plot of the Pareto front (:func:`plot_front`), beside ``deploy.json``."""

PointStatus = Literal["optimal", "feasible", "infeasible", "pruned", "error"]


# ---- the candidates ---------------------------------------------------------------------
@dataclass(frozen=True)
class Deployment:
    """One candidate deployment. ``mtp``: the drafts every workload serves with (``None``:
    none) when ``mtp_set``; otherwise the workloads' own drafts."""

    profile: str
    tp: int
    ep: int
    attention_dp: bool
    engine: str | None
    price_per_gpu_hour: float | None = None
    mtp: MTPCandidate | None = None
    mtp_set: bool = False

    @property
    def gpus(self) -> int:
        """GPUs of one replica (its tensor-parallel group)."""
        return self.tp

    @property
    def name(self) -> str:
        """A short name: ``b200 tp8 ep8 adp trtllm mtp5@3.45``."""
        s = f"{self.profile} tp{self.tp} ep{self.ep}" + (" adp" if self.attention_dp else "")
        s += f" {self.engine}" if self.engine else ""
        if self.mtp_set:
            s += (f" mtp{self.mtp.draft_tokens}@{self.mtp.acceptance:g}"
                  if self.mtp is not None else " no-mtp")
        return s

    def same_as(self, other: Deployment) -> bool:
        """The same deployment, whatever the price (the spec's fixed one among candidates)."""
        return (self.profile, self.tp, self.ep, self.attention_dp, self.engine, self.mtp,
                self.mtp_set) == (other.profile, other.tp, other.ep, other.attention_dp,
                                  other.engine, other.mtp, other.mtp_set)

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "profile": self.profile, "gpus": self.gpus, "tp": self.tp,
                "ep": self.ep, "attention_dp": self.attention_dp, "engine": self.engine,
                "mtp": (self.mtp.model_dump() if self.mtp is not None else None)
                if self.mtp_set else "as the workloads state",
                "price_per_gpu_hour": self.price_per_gpu_hour}


def candidates_of(spec: SearchSpec) -> DeployCandidates:
    """The spec's ``deploy.candidates`` (an ``InputError`` when it has none)."""
    if spec.deploy is None or spec.deploy.candidates is None:
        raise InputError("the spec has no deploy.candidates", field=FIELD)
    return spec.deploy.candidates


def expand(spec: SearchSpec) -> list[Deployment]:
    """Every candidate deployment (devices x layouts x attention DP x engines x MTP, in
    that order); an axis left out takes the spec's own value. Only the fields are checked
    here; :func:`check` checks each combination against the parent and its alternatives."""
    c = candidates_of(spec)
    hw = spec.hw
    layouts = [(x.tp, x.ep) for x in c.layouts] if c.layouts is not None else [(hw.tp, hw.ep)]
    adps = c.attention_dp if c.attention_dp is not None else [hw.attention_dp]
    engines = c.engines if c.engines is not None else [hw.engine]
    mtps: list[tuple[MTPCandidate | None, bool]] = \
        [(m, True) for m in c.mtp] if c.mtp is not None else [(None, False)]
    n = len(c.devices) * len(layouts) * len(adps) * len(engines) * len(mtps)
    if n > MAX_CANDIDATES:
        raise InputError(f"{n:,} candidate deployments exceed the cap {MAX_CANDIDATES:,} "
                         "(MAX_CANDIDATES: one MIP each); list fewer", field=FIELD)
    # attention DP over one GPU is no DP: tp=1 takes attention_dp off only (once)
    return [Deployment(d.profile, tp, ep, adp, eng, d.price_per_gpu_hour, m, given)
            for d, (tp, ep), adp, eng, (m, given)
            in itertools.product(c.devices, layouts, adps, engines, mtps)
            if not (tp == 1 and adp and False in adps)]


def fixed_deployment(spec: SearchSpec) -> Deployment:
    """The spec's own ``hardware`` deployment, at the price its device has among the
    candidates (none when it is not listed)."""
    hw = spec.hw
    price_ = None
    if spec.deploy is not None and spec.deploy.candidates is not None:
        for d in spec.deploy.candidates.devices:
            if d.profile == hw.profile:
                price_ = d.price_per_gpu_hour
    return Deployment(hw.profile, hw.tp, hw.ep, hw.attention_dp, hw.engine, price_)


def deployment_spec(spec: SearchSpec, d: Deployment) -> SearchSpec:
    """``spec`` as if written for deployment ``d`` (its hardware section, and every
    workload's drafts when ``d`` sets them)."""
    hw = spec.hw.model_copy(update={"profile": d.profile, "tp": d.tp, "ep": d.ep,
                                    "attention_dp": d.attention_dp, "engine": d.engine,
                                    "gpus_per_replica": None})
    upd: dict[str, Any] = {"hardware": hw}
    if d.mtp_set:
        dt = None if d.mtp is None else d.mtp.draft_tokens
        acc = None if d.mtp is None else d.mtp.acceptance
        upd["workloads"] = {n: w.model_copy(update={"draft_tokens": dt, "acceptance": acc})
                            for n, w in spec.workloads.items()}
    return spec.model_copy(update=upd)


def _device(profile: str, base: Path) -> Any:
    pp = base / profile
    return hwprofiles.get(str(pp) if profile.endswith(".json") and pp.exists() else profile)


def _one_block(parent: ModelArch, block: Any) -> ModelArch:
    return parent.replace_blocks([block])


def check(spec: SearchSpec, base: Path, parent: ModelArch,
          alts: list[list[space.Alternative]], deployments: list[Deployment]) -> None:
    """Refuse, in one line naming it, a combination that cannot serve: an unknown device,
    TP that cannot split the heads of the parent or of some alternative (with or without
    attention DP), EP that does not divide the experts of the parent or of some
    alternative, MTP drafts without an MTP head, a ``mix`` naming no workload, and the
    spec features the joint search does not take yet."""
    c = candidates_of(spec)
    for i, dev in enumerate(c.devices):
        try:
            _device(dev.profile, base)
        except InputError as exc:
            raise InputError(str(exc), field=f"{FIELD}.devices[{i}]") from None
    for name in c.mix or {}:
        if name not in spec.workloads:
            raise InputError(f"mix names workload {name!r}, not one of "
                             f"{sorted(spec.workloads)}", field=f"{FIELD}.mix")
    if any(d.mtp is not None for d in deployments) and not parent.mtp_blocks:
        raise InputError("MTP drafts need a parent with an MTP head (its config has no MTP "
                         "layers); list null only, or leave mtp out", field=f"{FIELD}.mtp")
    if spec.solver.sweep is not None:
        raise InputError("a sweep is not searched jointly with the deployment yet; remove "
                         "solver.sweep or deploy.candidates", field="solver.sweep")
    if spec.solver.diverse > 1:
        raise InputError("a diverse pool is not searched jointly with the deployment yet; "
                         "remove solver.diverse or deploy.candidates", field="solver.diverse")
    if spec.costs.measured is not None:
        raise InputError("measured block costs belong to one device; the joint search prices "
                         "analytically (remove costs.measured or deploy.candidates)",
                         field="costs.measured")
    # every distinct child block, with the first alternative that carries it
    seen: dict[str, tuple[Any, str]] = {}
    for i, b in enumerate(parent.blocks):
        seen.setdefault(repr(b), (b, f"the parent's block {i}"))
    for block in alts:
        for a in block:
            for b in a.blocks:
                seen.setdefault(repr(b), (b, f"alternative {a.label!r} of block {a.block}"))
    blocks = list(seen.values())
    for tp, adp in sorted({(d.tp, d.attention_dp) for d in deployments}):
        try:
            parent.replace_blocks([b for b, _ in blocks]).check_tp(tp, attention=not adp)
        except InputError:
            for b, who in blocks:
                try:
                    _one_block(parent, b).check_tp(tp, attention=not adp)
                except InputError as exc:
                    why = str(exc).split(": ", 1)[-1].replace("block 0's ", "its ")
                    raise InputError(f"tp={tp}{' with attention DP' if adp else ''} cannot "
                                     f"serve {who}: {why}", field=f"{FIELD}.layouts") from None
    for ep in sorted({d.ep for d in deployments if d.ep > 1}):
        for b, who in blocks:
            n = getattr(b, "num_experts", None)
            if isinstance(n, int) and n % ep:
                raise InputError(f"ep={ep} does not divide the {n} experts of {who}",
                                 field=f"{FIELD}.layouts")


# ---- one operating point ------------------------------------------------------------------
@dataclass
class Point:
    """One MIP of the joint search: a deployment, and for an SLO workload one concurrency."""

    index: int
    deployment: int
    concurrency: int | None
    problem: Problem
    library: BlockLibrary
    cons: Constraints
    rows: list[mip.Budget]
    objective: mip.Objective
    bound: float
    why: str = ""
    parent_cost: float | None = None
    parent_quality: float = 0.0
    result: mip.Result | None = None
    status: PointStatus | None = None
    lp: bool = False
    """Whether :attr:`bound` is already the LP relaxation's (:func:`lp_bound`)."""


def shares(spec: SearchSpec) -> dict[str, float]:
    """Token share per workload (``mix`` normalized; default equal)."""
    mix = candidates_of(spec).mix or {n: 1.0 for n in spec.workloads}
    tot = sum(mix.values())
    return {n: v / tot for n, v in mix.items()}


def cost_column(problem: Problem, library: BlockLibrary, d: Deployment,
                share: dict[str, float]) -> tuple[np.ndarray, float]:
    """Cost per million generated tokens as a library column and its constant (module
    docstring): ``sum_W share_W * p * gpus * runtime_s@W / (B_W * osl_W) / 3600 * 1e6``."""
    p = d.price_per_gpu_hour if d.price_per_gpu_hour is not None else 1.0
    v = np.zeros(library.num_replacements)
    c = 0.0
    for n, s in share.items():
        w = problem.workloads[n]
        k = s * p * d.gpus * 1e6 / (3600.0 * w.sequences * w.osl)
        key = f"runtime_s@{n}"
        v = v + k * library.costs[key]
        c += k * library.constants.get(key, 0.0)
    return v, c


def _with(library: BlockLibrary, cols: dict[str, tuple[np.ndarray, float]]) -> BlockLibrary:
    return BlockLibrary(
        library.num_blocks, library.start, library.end,
        {**library.costs, **{k: v for k, (v, _) in cols.items()}}, library.scores,
        labels=library.labels, tags=library.tags, children=library.children,
        constants={**library.constants, **{k: c for k, (_, c) in cols.items()}},
        block_names=library.block_names, descriptive=library.descriptive,
        source=library.source)


def _meets(total: float, row: mip.Budget) -> bool:
    tol = 1e-9 * max(1.0, abs(total))
    return ((row.hi is None or total <= row.hi + tol)
            and (row.lo is None or total >= row.lo - tol))


def _reach(lib: BlockLibrary, key: str, allowed: np.ndarray, largest: bool = False) -> float:
    return float(lib.path_values(lib.values(key), allowed, largest)[lib.num_blocks]
                 + lib.constant(key))


def _bound(lib: BlockLibrary, objective: mip.Objective, rows: list[mip.Budget],
           allowed: np.ndarray) -> tuple[float, str]:
    """A lower bound on the point's optimum (+inf with the reason when a shortest path
    proves some row unreachable): the objective's shortest path, every row ignored."""
    for r in rows:
        if r.hi is not None and (lo := _reach(lib, r.key, allowed)) > r.hi + 1e-9 * max(
                1.0, abs(r.hi)):
            return math.inf, f"{r.key} can go no lower than {lo:.6g}; the bound is {r.hi:.6g}"
        if r.lo is not None and (hi := _reach(lib, r.key, allowed, True)) < r.lo - 1e-9 * max(
                1.0, abs(r.lo)):
            return math.inf, f"{r.key} can go no higher than {hi:.6g}; the bound is {r.lo:.6g}"
    (key, w), = objective.weights.items()
    return w * _reach(lib, key, allowed), ""


def _points_of(spec: SearchSpec, base: Path, spec_hash: str, d: Deployment, di: int,
               alts: list[list[space.Alternative]], quality: np.ndarray,
               share: dict[str, float], first: int) -> list[Point]:
    """The operating points of deployment ``d``: one, or one per concurrency of the SLO
    workload's sweep (the SLO as budgets, :func:`nas.search.sweeps.slo_problem`)."""
    c = candidates_of(spec)
    try:
        problem = resolve(deployment_spec(spec, d), base, spec_hash)
    except InputError as exc:
        raise InputError(f"deployment {d.name}: {exc}", field=FIELD) from None
    problems: list[tuple[Problem, int | None]] = [(problem, None)]
    sw = slo_workload(problem)
    if sw is not None:
        slo_base = slo_problem(problem, sw, parent_slo_point(problem, sw))
        grid = spec.workloads[sw].concurrency_sweep or concurrency_grid(
            problem.workloads[sw].max_num_seqs)
        problems = [(with_batch(slo_base, sw, n), n) for n in grid]
    out: list[Point] = []
    for pb, conc in problems:
        priced = price(pb, alts, progress=False)
        lib = build_library(pb, alts, priced, quality)
        cons = constraints(pb, lib, priced)
        lib = cons.extend(lib)
        lib = _with(lib, {COST_KEY: cost_column(pb, lib, d, share)})
        fit = [mip.Budget(f"memory_bytes@{n}", None, pb.device_bytes) for n in pb.workloads]
        rows = list(cons.budgets) + fit
        if c.objective == "cost":
            obj = mip.Objective({COST_KEY: 1.0}, "min")
        else:
            obj = mip.Objective({"quality": 1.0}, "min")
            assert c.max_cost is not None  # DeployCandidates: objective quality needs it
            rows.append(mip.Budget(COST_KEY, None, c.max_cost))
        allowed = np.ones(lib.num_replacements, dtype=bool)
        allowed[list(cons.forbid)] = False
        bound, why = _bound(lib, obj, rows, allowed)
        par = parent_totals(lib)
        ok = all(_meets(par[r.key], r) for r in rows if "@" in r.key)
        out.append(Point(first + len(out), di, conc, pb, lib, cons, rows, obj, bound, why,
                         par[COST_KEY] if ok else None, par.get("quality", 0.0)))
    return out


def solve_point(pt: Point) -> mip.Result:
    """The point's MIP (the homogeneous enumeration when the spec asks for it), verified."""
    if pt.result is not None:
        return pt.result
    cons = Constraints(pt.objective, pt.rows, list(pt.cons.counts), ties=pt.cons.ties,
                       forbid=pt.cons.forbid)
    if pt.problem.spec.search_space.homogeneous:
        res = homogeneous_solve(pt.library, cons)
    else:
        res = mip.solve(pt.library, pt.objective, pt.rows, counts=pt.cons.counts,
                        options=options_of(pt.problem), ties=pt.cons.ties,
                        forbid=pt.cons.forbid)
        check_in_time(pt.problem, res)
    pt.result = res
    pt.status = res.status
    return res


@dataclass
class Search:
    """The answer of a best-first search over some points (:func:`search_points`)."""

    status: mip.Status
    best: Point | None
    objective: float | None
    bound: float
    gap: float | None
    solved: int
    pruned: int
    message: str = ""


def _key(pt: Point) -> float:
    assert pt.result is not None and pt.result.objective is not None
    return float(pt.result.objective)


def _total(pt: Point, key: str) -> float:
    """``key``'s total of the point's child (a point with an ok result)."""
    assert pt.result is not None and pt.result.ok
    return pt.result.totals[key]


def _parent_cost(pt: Point) -> float:
    return math.inf if pt.parent_cost is None else pt.parent_cost


def lp_bound(pt: Point) -> float:
    """A lower bound on the point's optimum from its LP relaxation (weak duality with the
    row duals, :meth:`nas.mip.MipModel.lp_bound`), never below the shortest-path bound;
    ``+inf`` when the relaxation is infeasible (no child at all)."""
    if math.isinf(pt.bound):
        return pt.bound
    m = mip.MipModel(pt.library, pt.objective, pt.rows, counts=pt.cons.counts,
                     forbid=pt.cons.forbid, options=options_of(pt.problem), ties=pt.cons.ties)
    st, lb, _ = m.lp_bound(time_limit=pt.problem.spec.solver.time_limit)
    if st == "infeasible":
        pt.why = "the LP relaxation is infeasible: no child meets every row"
        return math.inf
    if st != "optimal" or not math.isfinite(lb):
        return pt.bound
    return max(pt.bound, lb * m.obj_scale + m.obj_const)  # min sense: c_min = c / scale


def search_points(points: list[Point], gap: float = 0.0) -> Search:
    """Best bound first: solve each point unless its bound cannot beat the best child found
    so far by more than the gap the spec accepts (module docstring); the status and gap
    over all of them. Bounds: the shortest path, then the LP relaxation's."""
    for pt in points:
        if pt.result is None and not pt.lp:
            pt.bound = lp_bound(pt)
            pt.lp = True
    best: Point | None = None
    solved = pruned = 0
    bounds: list[float] = []
    stopped_short = False
    for pt in sorted(points, key=lambda p: (p.bound, p.index)):
        if math.isinf(pt.bound):  # a shortest path or the LP proves no child meets the rows
            pt.status = pt.status or "infeasible"
            bounds.append(math.inf)
            continue
        if best is not None and pt.result is None and \
                pt.bound >= _key(best) - gap * abs(_key(best)):
            pt.status = "pruned"
            pruned += 1
            bounds.append(pt.bound)
            continue
        was = pt.result is not None
        res = solve_point(pt)
        solved += 0 if was else 1
        if res.status == "infeasible":
            bounds.append(math.inf)
            continue
        b = pt.bound if res.best_bound is None else max(pt.bound, float(res.best_bound))
        if res.status != "optimal":
            stopped_short = True
        bounds.append(b)
        if res.ok and (best is None or _key(pt) < _key(best)):
            best = pt
    lb = min(bounds, default=math.inf)
    if best is None:
        status: mip.Status = "infeasible" if math.isinf(lb) else "error"
        return Search(status, None, None, lb, None, solved, pruned,
                      "no deployment admits a child under every budget" if status ==
                      "infeasible" else "some solve ended without a child or a proof")
    obj = _key(best)
    lb = min(lb, obj)
    g = (obj - lb) / max(abs(obj), 1e-300) if obj != lb else 0.0
    status = "optimal" if not stopped_short or g <= max(gap, mip.GAP_FLOOR) else "feasible"
    return Search(status, best, obj, lb, g, solved, pruned)


# ---- the output -------------------------------------------------------------------------
class DeploymentRow(BaseModel):
    """One candidate deployment in ``deploy.json``."""

    model_config = ConfigDict(extra="forbid")

    deployment: dict[str, Any]
    status: str
    concurrency: int | None = None
    cost: float | None = None
    quality: float | None = None
    bound: float | None = None
    parent_cost: float | None = None
    parent_concurrency: int | None = None
    points: int = 1
    solved: int = 0
    message: str = ""


class Pick(BaseModel):
    """A (child or parent, deployment) pair with its cost and quality."""

    model_config = ConfigDict(extra="forbid")

    deployment: dict[str, Any]
    concurrency: int | None = None
    cost: float
    quality: float
    status: str = "optimal"


class DeployResult(BaseModel):
    """The file format of ``deploy.json``: the joint answer, the spec's fixed deployment's
    best child, the parent at its best deployment, one row per candidate and the Pareto
    front (``seconds``: the whole joint search, the front included)."""

    model_config = ConfigDict(extra="forbid")

    format: str = "puzzle-nas/deploy"
    version: int = 1
    objective: str
    unit: str
    status: str
    gap: float | None
    bound: float | None
    joint: Pick | None
    fixed: Pick | None
    fixed_message: str = ""
    parent_best: Pick | None
    moved: list[str]
    deployments: list[DeploymentRow]
    solves: int
    pruned: int
    seconds: float
    front: Front | None = None
    """The Pareto front of quality against cost over every deployment (``deploy.candidates.
    front``; None when it is null or no deployment admits a child)."""


class FrontPoint(BaseModel):
    """One point of the Pareto front: a (deployment, child) pair with its cost and quality,
    the bound on quality it was solved under, its solve's status and the child (the
    library label of the replacement each parent block takes)."""

    model_config = ConfigDict(extra="forbid")

    deployment: dict[str, Any]
    concurrency: int | None = None
    cost: float
    quality: float
    quality_bound: float
    status: str = "optimal"
    choices: list[str]


class Front(BaseModel):
    """The Pareto front of quality against cost per million tokens over every candidate
    deployment (:func:`pareto_front`), cheapest first. ``step``: the quality step it was
    computed with (every non-dominated pair is matched by a point as cheap, within
    ``solver.gap``, and at most ``step`` worse in quality); ``status``: ``optimal`` when
    every step's answer was proven (within the gap), ``feasible`` when some solve stopped
    short, ``stopped`` when the steps ran out (:data:`nas.deployspec.MAX_FRONT_POINTS`)."""

    model_config = ConfigDict(extra="forbid")

    unit: str
    step: float
    status: str
    points: list[FrontPoint]
    steps: int
    solves: int
    lp_bounds: int
    seconds: float


@dataclass
class Joint:
    """:func:`joint_search`'s answer: the file model and the pieces the blueprint needs."""

    result: DeployResult
    best: Point | None
    alts: list[list[space.Alternative]]
    quality_source: str
    deployments: list[Deployment]
    points: list[Point] = field(default_factory=list)


def _pick(pt: Point, ds: list[Deployment]) -> Pick:
    assert pt.result is not None and pt.result.ok
    t = pt.result.totals
    return Pick(deployment=ds[pt.deployment].to_dict(), concurrency=pt.concurrency,
                cost=t[COST_KEY], quality=t["quality"], status=pt.result.status)


def moved(a: Pick, b: Pick) -> list[str]:
    """The deployment decisions that differ between two picks (``a``: joint)."""
    out = []
    for k in ("profile", "tp", "ep", "attention_dp", "engine", "mtp"):
        if a.deployment[k] != b.deployment[k]:
            out.append(f"{k}: {b.deployment[k]} -> {a.deployment[k]}")
    if a.concurrency != b.concurrency:
        out.append(f"concurrency: {b.concurrency} -> {a.concurrency}")
    return out


# ---- the Pareto front of quality against cost ----------------------------------------------
QUALITY = "quality"

FEASIBILITY = 2e-5
"""Quality steps are never finer than this fraction of the largest quality coefficient: a
MIP's row may exceed its bound by up to ``10 * feastol`` (``feastol <= 1e-6``, see
:mod:`nas.mip.highs`) of the row's largest coefficient, so a finer step could find the
same child again."""


@dataclass
class _Side:
    """One point of the joint search as the front steps through quality bounds: a lower
    bound on its least cost under the current bound (exact while its last child meets the
    bound: the feasible set only shrinks), its model with the quality row last, the bound
    its LP bound and its last child were found under, and whether it has no child left."""

    pt: Point
    qmin: float
    value: float
    lp_eps: float = math.nan
    res: mip.Result | None = None
    res_eps: float = math.nan
    dead: bool = False
    model: mip.MipModel | None = None

    def exact(self, eps: float) -> bool:
        """Whether :attr:`value` is the point's optimum under ``quality <= eps``."""
        return self.res is not None and self.res.ok and (
            self.res_eps == eps or self.res.totals[QUALITY] <= eps)


def _front_cons(pt: Point, eps: float) -> Constraints:
    return Constraints(mip.Objective({COST_KEY: 1.0}, "min"),
                       [*pt.rows, mip.Budget(QUALITY, None, eps)], list(pt.cons.counts),
                       ties=pt.cons.ties, forbid=pt.cons.forbid)


class _FrontSearch:
    """The state of :func:`pareto_front`: the sides and the work done."""

    def __init__(self, sides: list[_Side], gap: float) -> None:
        self.sides, self.gap = sides, gap
        self.solves = self.lp_bounds = 0
        self.short = False

    def _model(self, s: _Side, eps: float) -> mip.MipModel:
        pt = s.pt
        if s.model is None:
            c = _front_cons(pt, eps)
            s.model = mip.MipModel(pt.library, c.objective, c.budgets, counts=c.counts,
                                   forbid=c.forbid, options=options_of(pt.problem),
                                   ties=c.ties)
        else:
            s.model.set_budget(len(pt.rows), None, eps)
        return s.model

    def _lp(self, s: _Side, eps: float) -> None:
        """Raise the side's bound to its LP relaxation's under ``quality <= eps`` (dead when
        the relaxation has no solution)."""
        m = self._model(s, eps)
        st, lb, _ = m.lp_bound(time_limit=s.pt.problem.spec.solver.time_limit)
        self.lp_bounds += 1
        s.lp_eps = eps
        if st == "infeasible":
            s.dead = True
        elif st == "optimal" and math.isfinite(lb):
            s.value = max(s.value, lb * m.obj_scale + m.obj_const)

    def _solve(self, s: _Side, eps: float) -> None:
        pt = s.pt
        if pt.problem.spec.search_space.homogeneous:
            res = homogeneous_solve(pt.library, _front_cons(pt, eps))
        else:
            res = self._model(s, eps).solve()
            check_in_time(pt.problem, res)
        self.solves += 1
        if not res.ok:
            s.dead = True
            self.short |= res.status != "infeasible"
            return
        self.short |= res.status != "optimal"
        s.res, s.res_eps, s.value = res, eps, res.totals[COST_KEY]

    def step(self, eps: float) -> _Side | None:
        """The side holding the cheapest child with ``quality <= eps`` (within the gap),
        best bound first: a side's bound is raised to its LP's, then its MIP solved, only
        while it could still be the cheapest."""
        import heapq

        heap: list[tuple[float, int]] = []
        for i, s in enumerate(self.sides):
            if not s.dead and s.qmin > eps + 1e-12 * max(1.0, abs(eps)):
                s.dead = True  # no child this good, ever (eps only decreases)
            if not s.dead:
                heap.append((s.value, i))
        heapq.heapify(heap)
        best: _Side | None = None
        while heap:
            v, i = heapq.heappop(heap)
            s = self.sides[i]
            if s.exact(eps):
                return s
            if best is not None and v >= best.value - self.gap * abs(best.value):
                return best  # no other side can beat it by more than the gap
            if not s.pt.problem.spec.search_space.homogeneous and s.lp_eps != eps:
                self._lp(s, eps)
            else:
                self._solve(s, eps)
                if s.exact(eps) and (best is None or s.value < best.value):
                    best = s
            if not s.dead:
                heapq.heappush(heap, (s.value, i))
        return best


def _labels(pt: Point, res: mip.Result) -> list[str]:
    return [pt.library.labels[r] for r in res.choices]


def pareto_front(points: list[Point], ds: list[Deployment], spec: DeployCandidates,
                 gap: float = 0.0, seeded: bool = False) -> Front:
    """The Pareto front of quality against cost per million tokens over every point
    (deployment, and concurrency for an SLO workload), by the least cost under a bound on
    the quality, the bound stepped down: each step is one joint search (the same MIP per
    point, best bound first, a point's bound its last optimum or its LP relaxation's, so
    most points are never solved) for the cheapest child with ``quality <= eps``; the next
    bound is ``min(its quality, eps) - step``, until no point admits a child. A pair
    ``(q*, c*)`` no other beats on both is matched by a point with cost ``<= c*`` (within
    ``gap``) and quality ``< q* + step`` (plus the solver's feasibility tolerance on the
    quality row): at the last bound ``eps >= q*`` the answer costs at most ``c*``, and its
    quality is above the next bound, which is below ``q*``. With ``step`` below the
    distance between the qualities of distinct pairs, that point is ``(q*, c*)`` itself.

    ``seeded``: ``points`` hold :func:`search_points`' answers for the least cost under the
    same rows (objective ``cost``): the first step starts from their results and bounds.
    ``step``: ``spec.front.step``, else the span from the first point's quality to the
    least reachable one over ``spec.front.points``; never below :data:`FEASIBILITY` of
    the largest quality coefficient."""
    t0 = time.perf_counter()
    fs = spec.front
    assert fs is not None
    sides: list[_Side] = []
    top = -math.inf
    scale = 0.0
    for pt in points:
        if math.isinf(pt.bound):  # a shortest path or the LP proves no child meets the rows
            continue
        lib = pt.library
        allowed = np.ones(lib.num_replacements, dtype=bool)
        allowed[list(pt.cons.forbid)] = False
        top = max(top, _reach(lib, QUALITY, allowed, largest=True))
        scale = max(scale, float(np.max(np.abs(lib.values(QUALITY)[allowed]), initial=0.0)))
        s = _Side(pt, _reach(lib, QUALITY, allowed),
                  pt.bound if seeded else _reach(lib, COST_KEY, allowed))
        sides.append(s)
    eps = top  # binds nothing: the first step is the least cost under the rows alone
    for s in sides:
        if seeded and s.pt.lp:
            s.lp_eps = eps
        if seeded and s.pt.result is not None:
            if s.pt.result.ok:
                s.res, s.res_eps = s.pt.result, eps
                s.value = s.pt.result.totals[COST_KEY]
            elif s.pt.result.status == "infeasible":
                s.dead = True
    fsr = _FrontSearch(sides, gap)
    qmin = min((x.qmin for x in sides), default=0.0)
    found: list[tuple[_Side, mip.Result, float]] = []
    step = math.nan
    status = "optimal"
    steps = 0
    while True:
        if steps > MAX_FRONT_POINTS:
            status = "stopped"
            break
        steps += 1
        side = fsr.step(eps)
        if side is None:
            break
        assert side.res is not None
        q = side.res.totals[QUALITY]
        if not found or side.res is not found[-1][1]:
            found.append((side, side.res, eps))
        if math.isnan(step):
            floor = FEASIBILITY * scale + 1e-12 * max(1.0, abs(q))
            step = max(fs.step if fs.step is not None else (q - qmin) / fs.points, floor)
        # the last bound is the least reachable quality itself: the best end is exact
        eps = max(min(q, eps) - step, qmin) if min(q, eps) > qmin + step / 2 else \
            min(q, eps) - step
    keep = mip.pareto_front([(r.totals[COST_KEY], r.totals[QUALITY]) for _, r, _ in found])
    out = [FrontPoint(deployment=ds[s.pt.deployment].to_dict(), concurrency=s.pt.concurrency,
                      cost=r.totals[COST_KEY], quality=r.totals[QUALITY], quality_bound=e,
                      status=r.status, choices=_labels(s.pt, r))
           for s, r, e in (found[i] for i in keep)]
    if status == "optimal" and fsr.short:
        status = "feasible"
    return Front(unit=spec.unit, step=0.0 if math.isnan(step) else step, status=status,
                 points=out, steps=steps, solves=fsr.solves, lp_bounds=fsr.lp_bounds,
                 seconds=time.perf_counter() - t0)


def joint_search(spec: SearchSpec, base_dir: str | Path = ".", spec_hash: str = "",
                 progress: bool | None = None) -> Joint:
    """Search the child and its deployment together (module docstring)."""
    t0 = time.perf_counter()
    base = Path(base_dir)
    c = candidates_of(spec)
    ds = expand(spec)
    fixed = fixed_deployment(spec)
    first = resolve(deployment_spec(spec, ds[0]), base, spec_hash)
    alts = alternatives(first)
    check(spec, base, first.parent, alts, ds)
    quality, qsource = score(first, alts)
    share = shares(spec)
    points: list[Point] = []
    by_dep: list[list[Point]] = []
    with Progress(len(ds), "pricing deployments", progress) as bar:
        for i, d in enumerate(ds):
            pts = _points_of(spec, base, spec_hash, d, i, alts, quality, share, len(points))
            points += pts
            by_dep.append(pts)
            bar.update(1)
    gap = spec.solver.gap
    joint = search_points(points, gap)
    # the spec's own deployment: among the candidates, or priced apart (GPU-hours, or its
    # device's listed price)
    fixed_pick = None
    fixed_msg = ""
    fi = next((i for i, d in enumerate(ds) if d.same_as(fixed)), None)
    if fi is not None:
        fpts = by_dep[fi]
    elif c.priced and fixed.price_per_gpu_hour is None:
        fpts = []
        fixed_msg = (f"the spec's own deployment ({fixed.name}) has no price: its device "
                     "is not among the candidates")
    else:
        try:
            fpts = _points_of(spec, base, spec_hash, fixed, -1, alts, quality, share,
                              len(points))
        except InputError as exc:
            fpts, fixed_msg = [], str(exc)
    fs = None
    if fpts:
        fs = search_points(fpts, gap)
        if fs.best is not None:
            dl = ds + [fixed]
            fixed_pick = _pick(fs.best, dl) if fi is not None else Pick(
                deployment=fixed.to_dict(), concurrency=fs.best.concurrency,
                cost=_total(fs.best, COST_KEY), quality=_total(fs.best, "quality"),
                status=fs.status)
            fixed_pick.status = fs.status
        else:
            fixed_msg = fs.message or fs.status
    # the parent at its cheapest point where it meets every per-workload budget
    par = [p for p in points if p.parent_cost is not None]
    parent_best = None
    if par:
        pb = min(par, key=lambda p: (_parent_cost(p), p.index))
        parent_best = Pick(deployment=ds[pb.deployment].to_dict(), concurrency=pb.concurrency,
                           cost=_parent_cost(pb), quality=pb.parent_quality)
    rows = []
    for i, d in enumerate(ds):
        pts = by_dep[i]
        ok = [p for p in pts if p.result is not None and p.result.ok]
        bestp = min(ok, key=lambda p: (_key(p), p.index)) if ok else None
        stats = {p.status for p in pts}
        status = (bestp.status if bestp is not None else
                  "pruned" if "pruned" in stats else
                  "error" if "error" in stats else "infeasible")
        pp = [p for p in pts if p.parent_cost is not None]
        pbest = min(pp, key=lambda p: (_parent_cost(p), p.index)) if pp else None
        why = next((p.why for p in pts if p.why), "")
        if not why and status == "infeasible":
            why = next((p.result.message for p in pts if p.result is not None
                        and p.result.message), "")
        rows.append(DeploymentRow(
            deployment=d.to_dict(), status=str(status),
            concurrency=None if bestp is None else bestp.concurrency,
            cost=None if bestp is None else _total(bestp, COST_KEY),
            quality=None if bestp is None else _total(bestp, "quality"),
            bound=min((p.bound for p in pts), default=None),
            parent_cost=None if pbest is None else pbest.parent_cost,
            parent_concurrency=None if pbest is None else pbest.concurrency,
            points=len(pts), solved=sum(p.result is not None for p in pts),
            message=why.splitlines()[0] if why else ""))
    jp = _pick(joint.best, ds) if joint.best is not None else None
    if jp is not None:
        jp.status = joint.status
    front = None
    if c.front is not None and joint.best is not None:
        front = pareto_front(points, ds, c, gap, seeded=c.objective == "cost")
    res = DeployResult(
        objective=c.objective, unit=c.unit, status=joint.status, gap=joint.gap,
        bound=None if math.isinf(joint.bound) else joint.bound, joint=jp, fixed=fixed_pick,
        fixed_message=fixed_msg, parent_best=parent_best,
        moved=moved(jp, fixed_pick) if jp is not None and fixed_pick is not None else [],
        deployments=rows, solves=sum(p.result is not None for p in points) + (
            0 if fi is not None or fs is None else fs.solved),
        pruned=sum(p.status == "pruned" for p in points), seconds=time.perf_counter() - t0,
        front=front)
    return Joint(res, joint.best, alts, qsource, ds, points)


def _f(v: float | None, unit: str = "") -> str:
    return "-" if v is None else f"{v:.4g}{unit}"


def summary_lines(r: DeployResult) -> list[str]:
    """The joint answer in a few lines (``puzzle-nas search``'s closing lines)."""
    u = r.unit

    def one(p: Pick | None) -> str:
        if p is None:
            return "none"
        conc = "" if p.concurrency is None else f" at concurrency {p.concurrency}"
        return f"{p.deployment['name']}{conc}: {p.cost:.4g} {u}, quality {p.quality:.6g}"

    out = [f"joint deployment search: {r.status}, gap {_f(r.gap)}, {len(r.deployments)} "
           f"deployments, {r.solves} MIPs solved, {r.pruned} pruned; {r.seconds:.2f} s",
           f"  chosen (child and deployment): {one(r.joint)}",
           f"  fixed deployment, best child:  {one(r.fixed)}"
           + (f" ({r.fixed_message})" if r.fixed_message else ""),
           f"  parent at its best deployment: {one(r.parent_best)}"]
    if r.joint is not None and r.fixed is not None and r.fixed.cost > 0:
        out.append(f"  joint vs fixed: {100 * (1 - r.joint.cost / r.fixed.cost):.1f}% cheaper "
                   f"per token; moved: {', '.join(r.moved) or 'nothing'}")
    f = r.front
    if f is not None and f.points:
        names = list(dict.fromkeys(p.deployment["name"] for p in f.points))
        out.append(f"  Pareto front: {len(f.points)} points ({f.status}, quality step "
                   f"{f.step:.3g}) on {len(names)} deployment(s) ({', '.join(names[:4])}"
                   f"{', ...' if len(names) > 4 else ''}): {f.points[0].cost:.4g} .. "
                   f"{f.points[-1].cost:.4g} {u}, quality {f.points[0].quality:.6g} .. "
                   f"{f.points[-1].quality:.6g}; {f.solves} MIPs, {f.lp_bounds} LP bounds, "
                   f"{f.seconds:.2f} s")
    return out


def report_markdown(r: DeployResult) -> str:
    """The joint answer and a table with one row per candidate deployment."""
    u = r.unit
    lines = ["", "## Deployment searched with the child", "",
             f"Objective: {'least cost per million generated tokens' if r.objective == 'cost' else 'best quality under max_cost'} "
             f"({u}); status {r.status}, gap {_f(r.gap)}; {r.solves} MIPs solved, "
             f"{r.pruned} pruned by their bounds; {r.seconds:.2f} s.", ""]

    def pick(label: str, p: Pick | None, extra: str = "") -> None:
        if p is None:
            lines.append(f"- {label}: none{extra}")
            return
        conc = "" if p.concurrency is None else f" at concurrency {p.concurrency}"
        lines.append(f"- {label}: {p.deployment['name']}{conc}: {p.cost:.4g} {u}, quality "
                     f"{p.quality:.6g}")

    pick("joint (child and deployment)", r.joint)
    pick("the spec's fixed deployment, its best child", r.fixed,
         f" ({r.fixed_message})" if r.fixed_message else "")
    pick("the parent at its best deployment", r.parent_best)
    if r.joint is not None and r.fixed is not None and r.fixed.cost > 0:
        lines.append(f"- joint vs fixed: {100 * (1 - r.joint.cost / r.fixed.cost):.1f}% "
                     f"cheaper per token; moved: {', '.join(r.moved) or 'nothing'}")
    if r.joint is not None and r.parent_best is not None and r.parent_best.cost > 0:
        lines.append(f"- joint vs the parent at its best: "
                     f"{r.parent_best.cost / r.joint.cost:.2f}x cheaper per token")
    lines += ["", f"| deployment | status | concurrency | child {u} | quality | bound | "
              f"parent {u} | MIPs solved |", "|---|---|---|---|---|---|---|---|"]
    for row in r.deployments:
        lines.append(f"| {row.deployment['name']} | {row.status} | "
                     f"{row.concurrency if row.concurrency is not None else '-'} | "
                     f"{_f(row.cost)} | {_f(row.quality)} | {_f(row.bound)} | "
                     f"{_f(row.parent_cost)} | {row.solved}/{row.points} |")
    f = r.front
    if f is not None:
        lines += ["", "### Pareto front: quality against cost per million tokens", "",
                  f"Every (deployment, child) pair that no other beats on both cost and "
                  f"quality is matched by a point below as cheap (within the solver's gap) and "
                  f"at most {f.step:.3g} worse in quality (the step); status {f.status}; "
                  f"{f.steps} steps, {f.solves} MIPs solved, {f.lp_bounds} LP bounds; "
                  f"{f.seconds:.2f} s. Plot: `{FRONT_PNG}`.", "",
                  f"| # | deployment | concurrency | {u} | quality | blocks changed |",
                  "|---|---|---|---|---|---|"]
        for k, p in enumerate(f.points, start=1):
            changed = sum(c != "parent" for c in p.choices)
            lines.append(f"| {k} | {p.deployment['name']} | "
                         f"{p.concurrency if p.concurrency is not None else '-'} | "
                         f"{p.cost:.6g} | {p.quality:.6g} | {changed} of {len(p.choices)} |")
    return "\n".join(lines) + "\n"


_MARKERS = ("o", "s", "^", "v", "D", "P", "X", "<", ">", "h")


def front_figure(r: DeployResult, title: str = "") -> Any:
    """The matplotlib figure of :func:`plot_front` (Agg backend; close it when done)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(11, 5.5), dpi=120)
    f = r.front
    cmap = plt.get_cmap("tab10")
    colors = [cmap(i) for i in range(10)]
    style = {row.deployment["name"]: (colors[i % 10], _MARKERS[(i // 10) % len(_MARKERS)])
             for i, row in enumerate(r.deployments)}
    on_front = [] if f is None else list(dict.fromkeys(p.deployment["name"] for p in f.points))
    if f is not None and f.points:
        ax.step([p.cost for p in f.points], [p.quality for p in f.points], where="post",
                color="0.55", lw=1.2, zorder=1, label=f"Pareto front ({len(f.points)} points)")
    # one colour and marker per deployment: its front points (filled), its best child
    # under the spec's rows where it was solved and the parent on it (both hollow)
    pq = r.parent_best.quality if r.parent_best is not None else None
    for row in r.deployments:
        n = row.deployment["name"]
        color, marker = style[n]
        pts = [p for p in f.points if p.deployment["name"] == n] if f is not None else []
        label = f"{n}" + (f": {len(pts)} front points" if pts else "")
        if pts:
            ax.scatter([p.cost for p in pts], [p.quality for p in pts], color=color,
                       marker=marker, s=22, zorder=3, label=label)
            label = "_"
        hollow = [(c, q) for c, q in ((row.cost, row.quality), (row.parent_cost, pq))
                  if c is not None and q is not None]
        if hollow:
            ax.scatter([c for c, _ in hollow], [q for _, q in hollow], marker=marker, s=30,
                       facecolors="none", edgecolors=[color], linewidths=1.2, zorder=2,
                       label=label if label != "_" else None)
    for label, p, mk in (("the spec's deployment, its best child", r.fixed, "s"),
                         ("chosen (blueprint.json)", r.joint, "D")):
        if p is not None:
            ax.plot([p.cost], [p.quality], mk, color="tab:red" if mk == "D" else "0.2",
                    markersize=12, markerfacecolor="none", markeredgewidth=2, zorder=4,
                    label=f"{label}: {p.deployment['name']}")
    pb = r.parent_best
    if pb is not None:
        conc = "" if pb.concurrency is None else f" at concurrency {pb.concurrency}"
        ax.plot([pb.cost], [pb.quality], "*", color="black", markersize=15, zorder=5,
                label=f"parent at its best deployment: {pb.deployment['name']}{conc}")
    ax.annotate("better", xy=(0.86, 0.42), xytext=(0.93, 0.58), xycoords="axes fraction",
                textcoords="axes fraction", ha="center", color="tab:green", fontweight="bold",
                arrowprops={"arrowstyle": "->", "color": "tab:green", "lw": 2})
    ax.set_xlabel(f"cost per million generated tokens ({r.unit}), lower is better")
    ax.set_ylabel("quality score, lower is better")
    ax.set_title(title + ("" if not on_front else
                          f"\nfront on {len(on_front)} of {len(r.deployments)} deployments; "
                          "hollow: each deployment's best child and the parent on it"),
                 fontsize=10)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0.0)
    fig.tight_layout()
    return fig


def plot_front(path: str | Path, r: DeployResult, title: str = "") -> Path:
    """Quality against cost per million tokens: the Pareto front over every deployment
    (one colour and marker per deployment), the chosen child, the best child of the spec's
    own deployment and the parent at its best deployment; written atomically."""
    import matplotlib.pyplot as plt

    from nas.io import atomic_write

    fig = front_figure(r, title)
    try:
        atomic_write(path, lambda p: fig.savefig(p, format="png"))
    finally:
        plt.close(fig)
    return Path(path)


def run_joint(spec: SearchSpec, base_dir: str | Path, out_dir: str | Path, spec_hash: str = "",
              progress: bool | None = None) -> Any:
    """``puzzle-nas search`` with ``deploy.candidates``: :func:`joint_search`, then the
    chosen child's ``blueprint.json`` (priced on the chosen deployment), ``report.md`` (with
    the table per deployment and the Pareto front), ``library.json`` (the chosen
    deployment's, with its cost column), ``deploy.json`` and the front's plot
    (:data:`FRONT_PNG`), written as one set. Raises ``InfeasibleError`` when no
    deployment admits a child (one line, as the MIP's)."""
    from nas.search import blueprint as bpm
    from nas.search.problem import library_json
    from nas.search.solver import child_arch
    from nas.search.sweeps import SearchOutcome

    t0 = time.perf_counter()
    j = joint_search(spec, base_dir, spec_hash, progress)
    r = j.result
    if j.best is None:
        msg = "; ".join(f"{row.deployment['name']}: {row.message}" for row in r.deployments
                        if row.message)
        raise mip.InfeasibleError(f"no candidate deployment admits a child under every "
                                  f"budget ({r.status})" + (f": {msg}" if msg else ""))
    pt = j.best
    res = pt.result
    assert res is not None
    problem, lib = pt.problem, pt.library
    t_search = time.perf_counter() - t0
    bp = bpm.make_blueprint(problem, lib, j.alts, res, pt.cons, j.quality_source,
                            child_arch(problem, lib, res.chosen, j.alts),
                            bpm.predict(problem.parent, problem))
    report = bpm.report_markdown(bp) + report_markdown(r)
    writers = [] if r.front is None else [lambda folder: plot_front(
        folder / FRONT_PNG, r, f"{spec.name}: quality against cost per million tokens")]
    files = bpm.save_outputs(out_dir, [bp], report, {"library.json": library_json(lib),
                                                     "deploy.json": r.model_dump()}, writers)
    t = {"search_s": t_search, "total_s": time.perf_counter() - t0}
    return SearchOutcome(problem, lib, [bp], None, None, files, t, deploy=r)
