"""``SearchSpec``: the JSON a user writes for ``puzzle-nas search``.

Every mistake is reported with its JSON path (``budgets[2].max: ...``). The schema is
published by ``puzzle-nas schema``.

Budgets name a metric and, for per-workload metrics, a workload; bounds are absolute with
a unit (``"80 GiB"``, ``"5000 tok/s"``, ``"10 ms"``, ``"75B"``) or relative to the
parent's own priced figure (``"60%"``). ``"device"`` as a memory bound means the usable
memory of the GPUs of one replica.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal

from pydantic import (
    AliasChoices,
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    create_model,
    field_validator,
    model_validator,
)
from pydantic_core import ErrorDetails

from costmodels.serving import parse_slo
from hwprofiles.errors import InputError, read_json
from nas.arch import MAX_BLOCKS, MAX_CONTEXT, MAX_DIM, MAX_EXPERTS, MAX_HEADS
from nas.deployspec import DeployCandidates
from nas.kinds import AxisSpace, kinds
from nas.units import UNITS

MAX_SWEEP_POINTS = 200
"""Points of a sweep (and batch sizes per point): each is a full MIP solve (0.1 s to
``time_limit``), so 200 points is already minutes to hours; a frontier needs far fewer."""

WORKLOAD_METRICS = ("memory", "ttft", "tpot", "per_user_tps", "throughput", "runtime",
                    "max_concurrency")
GLOBAL_METRICS = ("total_params", "active_params", "weight_memory", "kept_blocks", "quality")
METRICS = WORKLOAD_METRICS + GLOBAL_METRICS
# metrics where larger is better: their bounds are lower bounds
RATE_METRICS = ("throughput", "per_user_tps")
"""Budgets on a rate: the bound turns into a time (tokens / rate), so it must be > 0."""
HIGHER_IS_BETTER = ("per_user_tps", "throughput", "max_concurrency", "kept_blocks")
NONNEGATIVE_METRICS = tuple(m for m in METRICS if m not in RATE_METRICS + ("quality",))
"""Metrics that are never negative: a negative bound is a mistake (refused, exit 2), not an
infeasible model (user scores may be negative, so ``quality`` may be bounded below 0)."""


MAX_SEQUENCES = 2**24
"""Batch, concurrency and max_num_seqs: 16,777,216 requests is 8,192x the engines' default
max_num_seqs (2,048); KV and state memory and the SLO grids grow with it."""

MAX_DRAFT_TOKENS = 64
"""Tokens drafted per speculative step: 64 is 8x the deepest drafts engines run (EAGLE and
MTP chains of up to ~8 tokens); acceptance beyond it is not physical."""


def _count(n: float) -> str:
    """A count with thousands separators, or in e-notation when it is absurdly long."""
    return f"{n:,}" if abs(n) < 1e15 else f"{n:.4g}"


def check_context(isl: int, osl: int, field: str | None = None) -> None:
    """isl + osl within :data:`nas.arch.MAX_CONTEXT` (positions are int32 in every engine)."""
    if isl + osl > MAX_CONTEXT:
        msg = (f"isl + osl = {_count(isl + osl)} tokens exceeds the cap {MAX_CONTEXT:,} "
               "(MAX_CONTEXT: the largest int32 position)")
        if field is None:
            raise ValueError(msg)
        raise InputError(msg, field=field)


def check_workload(w: Any, field: str = "workload") -> None:
    """A parsed ``costmodels.workload.Workload`` within the caps a spec workload has."""
    check_context(w.isl, w.osl, field)
    for name, cap, why in (("batch", MAX_SEQUENCES, "MAX_SEQUENCES"),
                           ("concurrency", MAX_SEQUENCES, "MAX_SEQUENCES"),
                           ("max_num_seqs", MAX_SEQUENCES, "MAX_SEQUENCES"),
                           ("max_num_batched_tokens", MAX_CONTEXT, "MAX_CONTEXT")):
        v = getattr(w, name, None)
        if v is not None and v > cap:
            raise InputError(f"{name} = {_count(v)} exceeds the cap {cap:,} ({why}, see nas.spec)",
                             field=field)


class _Model(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class WorkloadSpec(_Model):
    """A named serving workload: tokens in, tokens out, batch or concurrency."""

    isl: int = Field(ge=1, le=MAX_CONTEXT, description="input (prompt) length, tokens")
    osl: int = Field(ge=1, le=MAX_CONTEXT, description="output length, tokens")
    batch: int | None = Field(default=None, ge=1, le=MAX_SEQUENCES,
                              description="static batch size")
    concurrency: int | None = Field(default=None, ge=1, le=MAX_SEQUENCES,
                                    description="requests in flight (continuous batching)")
    max_num_batched_tokens: int | None = Field(
        default=None, ge=1, le=MAX_CONTEXT,
        description="engine token budget per step (default 8192)")
    max_num_seqs: int | None = Field(default=None, ge=1, le=MAX_SEQUENCES,
                                     description="engine cap on running requests (default 2048)")
    slo: str | None = Field(default=None, description="'per_user_tps>=U' and/or 'ttft<=T': the "
                            "concurrency becomes a sweep, each point solved with the SLO as "
                            "budgets (and memory <= device), the best child kept; relative "
                            "throughput bounds on this workload resolve against the parent's "
                            "own SLO throughput")
    concurrency_sweep: list[Annotated[int, Field(ge=1, le=MAX_SEQUENCES)]] | None = Field(
        default=None, max_length=MAX_SWEEP_POINTS, description="concurrencies tried for an SLO workload (default: a grid up "
        "to max_num_seqs)")
    draft_tokens: int | None = Field(
        default=None, ge=1, le=MAX_DRAFT_TOKENS,
        description="speculative decoding with the parent's MTP head: tokens drafted per "
        "verification step (give acceptance too). The head is kept as it is in every child "
        "and priced as a fixed cost (its d draft passes, weights, KV and state); the main "
        "blocks verify 1 + d tokens per step")
    acceptance: float | None = Field(
        default=None, ge=1.0, le=MAX_DRAFT_TOKENS + 1, allow_inf_nan=False,
        description="with draft_tokens: mean tokens accepted per verification step (bonus "
        "token included, 1..draft_tokens + 1), a property of the workload you state: the "
        "same for the parent and every child (a child's real acceptance is only known after "
        "it is trained; the seeds measured 3.45 for Nemotron-3-Super and 4.34 for their "
        "child)")
    arrival: Literal["closed", "staggered", "poisson", "fixed"] | None = Field(
        default=None, description="how requests arrive: closed (default; `concurrency` "
        "requests in lockstep), staggered (a closed loop of `concurrency` ending at "
        "spread-out times), poisson or fixed (an open loop at `rate` requests/s, independent "
        "or evenly spaced, into `concurrency` slots). The search prices a workload at its "
        "`concurrency` in flight: an open loop at full slots, its capacity (ttft and runtime "
        "budgets, which need the queue, are refused on it); `puzzle-nas cost` prices the "
        "queue")
    rate: float | None = Field(
        default=None, gt=0, allow_inf_nan=False, validation_alias=AliasChoices("rate", "qps"),
        description="requests/s offered by an open loop (arrival poisson or fixed); `qps` is "
        "accepted as an alias")

    @model_validator(mode="before")
    @classmethod
    def _rate_alias(cls, data: Any) -> Any:
        if isinstance(data, dict) and "rate" in data and "qps" in data:
            raise ValueError("give rate or its alias qps, not both")
        return data

    @model_validator(mode="after")
    def _one(self) -> WorkloadSpec:
        check_context(self.isl, self.osl)
        if (self.batch is None) == (self.concurrency is None):
            raise ValueError("give exactly one of batch or concurrency")
        if (self.draft_tokens is None) != (self.acceptance is None):
            raise ValueError("give draft_tokens and acceptance together (speculative "
                             "decoding: tokens drafted per step and tokens accepted per step)")
        if (self.acceptance is not None and self.draft_tokens is not None  # both or neither
                and self.acceptance > self.draft_tokens + 1):
            raise ValueError(f"acceptance {self.acceptance:g} exceeds draft_tokens + 1 = "
                             f"{self.draft_tokens + 1} (tokens a verification step can accept)")
        if self.slo is not None:
            if self.batch is not None:
                raise ValueError("an SLO workload serves a concurrency (continuous batching)")
            try:
                parse_slo(self.slo)
            except InputError as exc:
                raise ValueError(str(exc).split(": ", 1)[-1]) from None
        elif self.concurrency_sweep is not None:
            raise ValueError("concurrency_sweep needs an slo")
        self._arrivals()
        return self

    @property
    def open_loop(self) -> bool:
        """Requests arrive at ``rate`` whatever completes (arrival poisson or fixed)."""
        return self.arrival in ("poisson", "fixed")

    def _arrivals(self) -> None:
        if self.open_loop and self.rate is None:
            raise ValueError(f"arrival {self.arrival} needs a rate (requests/s)")
        if self.rate is not None and not self.open_loop:
            raise ValueError(f"rate {self.rate:g} (requests/s) goes with arrival poisson or "
                             f"fixed, not {self.arrival or 'closed'} (the default)")
        if self.arrival in ("staggered", "poisson", "fixed") and self.batch is not None:
            raise ValueError(f"arrival {self.arrival} needs continuous batching: give "
                             "concurrency (the requests admitted at once), not batch")
        if self.slo is not None and self.arrival not in (None, "closed"):
            raise ValueError("an SLO workload sweeps the concurrency of a closed loop; drop "
                             f"arrival {self.arrival} or the slo")


OPEN_LOOP_REFUSED = ("ttft", "runtime")
"""Metrics refused on an open-loop workload: they include the wait for a slot, which the
search does not price (it prices the workload at full slots, where the queue is unbounded)."""


def _open_loop_refs(spec: Any) -> None:
    """Refuse budgets and objectives that need an open loop's queue (:data:`OPEN_LOOP_REFUSED`)."""
    open_wl = {n for n, w in spec.workloads.items() if w.open_loop}
    if not open_wl:
        return
    found = [(f"budgets[{i}]", b) for i, b in enumerate(spec.budgets)]
    found += [(f"stages[{k}].budgets[{i}]", b) for k, st in enumerate(spec.stages)
              for i, b in enumerate(st.budgets)]
    for where, b in found:
        if b.workload in open_wl and b.metric in OPEN_LOOP_REFUSED:
            raise ValueError(f"{where}: a {b.metric} budget on workload {b.workload!r} "
                             f"(arrival {spec.workloads[b.workload].arrival}) needs the wait "
                             "for a slot, which the search does not price yet; bound tpot, "
                             "per_user_tps, throughput or memory, and price the queue with "
                             "puzzle-nas cost")
    obj = spec.objective.minimize or spec.objective.maximize or ""
    if "@" in obj:
        metric, name = obj.split("@", 1)
        if name in open_wl and metric in OPEN_LOOP_REFUSED:
            raise ValueError(f"objective {obj}: {metric} of an open-loop workload (arrival "
                             f"{spec.workloads[name].arrival}) needs the wait for a slot, "
                             "which the search does not price yet")


class HardwareSpec(_Model):
    profile: str = Field(description="a shipped profile name (puzzle-nas hw list) or a JSON file")
    tp: int = Field(default=1, ge=1, description="tensor-parallel degree")
    ep: int = Field(default=1, ge=1, description="expert-parallel degree")
    gpus_per_replica: int | None = Field(default=None, ge=1,
                                         description="GPUs serving one model copy (default tp)")
    attention_dp: bool = Field(default=False, description="attention data parallelism over the "
                               "tp GPUs, routed experts expert-parallel behind an all-to-all")
    engine: str | None = Field(default=None, description="serving engine profile (trtllm, "
                               "trtllm-cpp, vllm, sglang; NAME@VERSION for version-dependent "
                               "behaviour): its host overheads, token budget, running-request "
                               "cap and compute dtypes price every workload (default: "
                               "TensorRT-LLM's overheads, the device's dtypes)")

    @model_validator(mode="after")
    def _gpus(self) -> HardwareSpec:
        if self.gpus_per_replica is not None and self.gpus_per_replica != self.tp:
            raise ValueError(f"gpus_per_replica ({self.gpus_per_replica}) must equal tp "
                             f"({self.tp}): a replica is its tensor-parallel group (pipeline "
                             "parallelism is not modeled)")
        if self.ep not in (1, self.tp):
            raise ValueError(f"ep must be 1 or tp ({self.tp}), got {self.ep}")
        if self.engine is not None:
            from hwprofiles.engines import available_engines, find_engine

            if find_engine(self.engine) is None:
                raise ValueError(f"unknown serving engine {self.engine!r}; expected one of "
                                 f"{', '.join(available_engines())}")
        return self


class AttentionSpace(AxisSpace):
    kv_heads: list[Annotated[int, Field(ge=1, le=MAX_HEADS)]] = Field(default_factory=list)
    sliding_window: list[Annotated[int, Field(ge=1, le=MAX_CONTEXT)]] = Field(
        default_factory=list)
    noop: bool = False
    linear: bool = False


class FFNSpace(AxisSpace):
    widths: list[Annotated[int, Field(ge=1, le=MAX_DIM)]] = Field(default_factory=list)
    fractions: list[Annotated[float, Field(gt=0, le=1)]] = Field(default_factory=list)
    round_to: int = Field(default=64, ge=1, le=MAX_DIM,
                          description="round fractional widths to this")
    noop: bool = False
    linear: bool = False


class MoESpace(AxisSpace):
    experts: list[Annotated[int, Field(ge=1, le=MAX_EXPERTS)]] = Field(default_factory=list)
    expert_fractions: list[Annotated[float, Field(gt=0, le=1)]] = Field(default_factory=list)
    expert_widths: list[Annotated[int, Field(ge=1, le=MAX_DIM)]] = Field(
        default_factory=list)
    width_fractions: list[Annotated[float, Field(gt=0, le=1)]] = Field(default_factory=list)
    top_k: list[Annotated[int, Field(ge=1, le=MAX_EXPERTS)]] = Field(default_factory=list)
    shared_widths: list[Annotated[int, Field(ge=0, le=MAX_DIM)]] = Field(
        default_factory=list)
    round_to: int = Field(default=64, ge=1, le=MAX_DIM)
    noop: bool = False


class MambaSpace(AxisSpace):
    state_sizes: list[Annotated[int, Field(ge=1, le=MAX_DIM)]] = Field(default_factory=list)
    heads: list[Annotated[int, Field(ge=1, le=MAX_HEADS)]] = Field(default_factory=list)
    noop: bool = False


class ParallelSpace(AxisSpace):
    """Falcon-H1 parallel attention + Mamba blocks (``nas.arch.Parallel``): the attention
    branch's ``kv_heads`` (each dividing its query heads), the Mamba branch's
    ``mamba_heads`` (at most the parent's, a multiple of its ``n_groups``) and
    ``state_sizes`` (at most the parent's), every combination; ``drop_attention`` /
    ``drop_mamba``: also the layer without that branch (a Mamba-only / attention-only
    layer, with every shape of the branch it keeps); no-op."""

    kv_heads: list[Annotated[int, Field(ge=1, le=MAX_HEADS)]] = Field(default_factory=list)
    mamba_heads: list[Annotated[int, Field(ge=1, le=MAX_HEADS)]] = Field(default_factory=list)
    state_sizes: list[Annotated[int, Field(ge=1, le=MAX_DIM)]] = Field(default_factory=list)
    drop_attention: bool = False
    drop_mamba: bool = False
    noop: bool = False


SPAN_KINDS = ("attention", "mamba", "moe", "ffn")
MAX_SPAN = 3
"""Longest span a multi-block replacement covers: Puzzletron's multi-layer replacements
replace short runs; every extra block of length multiplies the span alternatives."""
MAX_SPAN_RULES = 64
"""Span rules, and replacements per rule: each rule adds up to (blocks x replacements)
alternatives; 64 is far past any span family a search needs."""
MAX_RECIPES = 16
"""Recipes per block kind: more than the named recipes there are."""


class SpanBlock(_Model):
    """One child block of a span replacement: a kind, and the fields that differ from the
    span's first parent block of that kind (e.g. ``{"kind": "mamba", "num_heads": 256}``:
    one Mamba block twice as wide)."""

    kind: Literal["attention", "mamba", "moe", "ffn"]
    fields: dict[str, int | float | bool | str | None] = Field(
        default_factory=dict, description="overrides of the span's first parent block of "
        "this kind (which must exist in the span)")


class SpanReplacement(_Model):
    """What a span becomes: exactly one of ``noop`` (the span is removed), ``block`` (one
    child block), ``blocks`` (a shorter list) or ``drop_one`` (every way to keep all but one
    of the span's parent blocks: k blocks become k-1)."""

    noop: bool = False
    block: SpanBlock | None = None
    blocks: list[SpanBlock] | None = Field(default=None, min_length=1, max_length=MAX_SPAN - 1)
    drop_one: bool = False

    @model_validator(mode="after")
    def _one(self) -> SpanReplacement:
        n = int(self.noop) + (self.block is not None) + (self.blocks is not None) \
            + int(self.drop_one)
        if n != 1:
            raise ValueError("give exactly one of noop, block, blocks or drop_one")
        return self


class SpanRule(_Model):
    """Which spans of consecutive parent blocks may be replaced as a whole, and by what."""

    length: int | None = Field(default=None, ge=2, le=MAX_SPAN,
                               description="blocks per span (default: len(kinds))")
    kinds: list[Literal["attention", "mamba", "moe", "ffn"]] | None = Field(
        default=None, min_length=2, max_length=MAX_SPAN,
        description="the parent block kinds the span must have, in order (default: any)")
    blocks: list[tuple[int, int]] | None = Field(
        default=None, description="spans must lie inside one of these block ranges "
        "[start, end)")
    replace_with: list[SpanReplacement] = Field(min_length=1, max_length=MAX_SPAN_RULES)
    stride: int = Field(default=1, ge=1, le=MAX_BLOCKS, description="spans start every "
                        "stride blocks from each range's start (stride = length tiles the "
                        "range: no two spans of the rule overlap, so no child is reachable "
                        "by two spans, which keeps the MIP small)")

    @model_validator(mode="after")
    def _len(self) -> SpanRule:
        if self.length is None and self.kinds is None:
            raise ValueError("give length or kinds")
        if self.length is not None and self.kinds is not None and \
                self.length != len(self.kinds):
            raise ValueError(f"length {self.length} differs from len(kinds) "
                             f"{len(self.kinds)}")
        n = self.length or len(self.kinds or ())
        for r in self.replace_with:
            if r.blocks is not None and len(r.blocks) >= n:
                raise ValueError(f"replace_with blocks must be shorter than the span ({n})")
        return self

    @property
    def span(self) -> int:
        """Blocks per span."""
        return self.length or len(self.kinds or ())


class PrecisionSpace(_Model):
    """Precision recipes a block may take, per block kind (names of
    ``costmodels.dtypes.RECIPES``); the spec's own ``precision`` is always one of them, so
    the searched space contains the one-recipe child."""

    attention: list[str] = Field(default_factory=list, max_length=MAX_RECIPES)
    mamba: list[str] = Field(default_factory=list, max_length=MAX_RECIPES)
    moe: list[str] = Field(default_factory=list, max_length=MAX_RECIPES)
    ffn: list[str] = Field(default_factory=list, max_length=MAX_RECIPES)
    blocks: list[tuple[int, int]] | None = Field(
        default=None, description="restrict precision choices to block ranges [start, end)")
    compare_fixed: bool = Field(default=False, description="also solve with the spec's one "
                                "recipe for every block and report/plot it beside the search")

    @field_validator("attention", "mamba", "moe", "ffn")
    @classmethod
    def _known(cls, v: list[str]) -> list[str]:
        from costmodels.dtypes import RECIPES

        for name in v:
            if name not in RECIPES:
                raise ValueError(f"unknown precision recipe {name!r}; expected one of "
                                 f"{sorted(RECIPES)}")
        return v

    def searched(self) -> bool:
        """Whether any kind has a choice of recipe."""
        return bool(self.attention or self.mamba or self.moe or self.ffn)


class _KindAxes(_Model):
    """The axes of the kinds that predate the registry (:mod:`nas.kinds`)."""

    attention: AttentionSpace = Field(default_factory=AttentionSpace)
    ffn: FFNSpace = Field(default_factory=FFNSpace)
    moe: MoESpace = Field(default_factory=MoESpace)
    mamba: MambaSpace = Field(default_factory=MambaSpace)
    parallel: ParallelSpace = Field(default_factory=ParallelSpace)


_SEARCH_FIELDS: dict[str, Any] = {
    **{name: (k.space, Field(default_factory=k.space)) for name, k in kinds().items()},
    "homogeneous": (bool, Field(default=False, description="Minitron-style: every block of a "
                                "kind gets the same choice (a baseline)")),
    "compare_homogeneous": (bool, Field(default=False, description="also solve the "
                                        "homogeneous baseline and report/plot it beside the "
                                        "search")),
    "spans": (list[SpanRule], Field(default_factory=list, max_length=MAX_SPAN_RULES,
                                    description="multi-block replacements: spans of 2-3 parent "
                                    "blocks replaced as a whole")),
    "precision": (PrecisionSpace, Field(default_factory=PrecisionSpace,
                                        description="precision recipes per block kind")),
}
_SEARCH_DOC = """Per block kind, the axes to try (a registered kind's axis is
``search_space.<kind>``). The parent block is always an alternative."""

if TYPE_CHECKING:
    class SearchSpace(_KindAxes):
        # the defaults of _SEARCH_FIELDS, so that SearchSpace() type-checks as it runs
        homogeneous: bool = False
        compare_homogeneous: bool = False
        spans: list[SpanRule] = Field(default_factory=list)
        precision: PrecisionSpace = Field(default_factory=PrecisionSpace)

        def __getattr__(self, name: str) -> Any: ...  # a registered kind's axis
else:
    SearchSpace = create_model("SearchSpace", __base__=_KindAxes, __doc__=_SEARCH_DOC,
                               __module__=__name__, **_SEARCH_FIELDS)


class QualitySpec(_Model):
    scores: str | None = Field(default=None, description="score file (JSON or CSV) keyed by "
                               "block and alternative; relative to the spec")
    metric: str = Field(default="kl_div", description="which score column to minimize")
    prior: Literal["structural"] = "structural"


class BudgetSpec(_Model):
    """``metric`` (on ``workload`` for per-workload metrics) bounded by ``max`` and/or ``min``."""

    metric: Literal[METRICS]  # type: ignore[valid-type]  # a Literal of a runtime tuple (METRICS), which pydantic accepts
    workload: str | None = None
    kind: str | None = Field(default=None, description="block kind, for kept_blocks")
    max: str | float | None = None
    min: str | float | None = None

    @model_validator(mode="after")
    def _check(self) -> BudgetSpec:
        if self.max is None and self.min is None:
            raise ValueError("give max or min")
        if self.metric in WORKLOAD_METRICS and not self.workload:
            raise ValueError(f"metric {self.metric} needs a workload")
        if self.metric == "kept_blocks" and not self.kind:
            raise ValueError("kept_blocks needs a kind (attention, mamba, moe or ffn)")
        return self

    @field_validator("max", "min")
    @classmethod
    def _quantity(cls, v: str | float | None, info: ValidationInfo) -> str | float | None:
        metric = info.data.get("metric")
        if v is not None and metric is not None:
            try:
                num, _ = parse_quantity(v, metric, info.field_name or "")
            except InputError as exc:
                raise ValueError(str(exc).split(": ", 1)[-1]) from None
            if metric in RATE_METRICS and not num > 0:
                raise ValueError(f"a {metric} bound must be > 0 (it becomes a time bound, "
                                 f"tokens / rate), got {v!r}")
            if metric in NONNEGATIVE_METRICS and num < 0:  # NaN: "device", resolved later
                raise ValueError(f"a {metric} bound must be >= 0 (a {metric} is never "
                                 f"negative), got {v!r}")
        return v


class ObjectiveSpec(_Model):
    minimize: str | None = Field(default="quality", description="'quality' (sum of scores), "
                                 "or 'runtime@W', 'tpot@W', 'ttft@W', 'memory@W', "
                                 "'total_params', 'active_params'")
    maximize: str | None = Field(default=None, description="'throughput@W' or "
                                 "'per_user_tps@W' (turned into minimizing the runtime)")

    @model_validator(mode="after")
    def _one(self) -> ObjectiveSpec:
        if self.maximize is not None:
            if "minimize" in self.model_fields_set and self.minimize is not None:
                raise ValueError("give exactly one of minimize or maximize")
            object.__setattr__(self, "minimize", None)
        if (self.minimize is None) == (self.maximize is None):
            raise ValueError("give exactly one of minimize or maximize")
        return self


class SweepSpec(_Model):
    """Re-solve with one budget moved over a grid -> a Pareto frontier.

    With ``batch_sizes`` (and ``workload``), every grid point is also solved once per batch
    size of that workload (its batch or concurrency replaced, everything re-priced), and the
    best child per point is kept: the Puzzle paper's way of handling a throughput target,
    since the batch size is not a variable of the MIP.
    """

    budget: int = Field(ge=0, description="index into budgets of the bound to sweep")
    values: list[str | float] | None = Field(default=None, max_length=MAX_SWEEP_POINTS)
    start: str | float | None = None
    stop: str | float | None = None
    num: int = Field(default=10, ge=2, le=MAX_SWEEP_POINTS)
    workload: str | None = Field(default=None, description="workload whose batch is swept")
    batch_sizes: list[Annotated[int, Field(ge=1)]] | None = Field(
        default=None, max_length=MAX_SWEEP_POINTS)
    workers: int = Field(default=1, ge=1, le=64, description="threads that solve the grid "
                         "points (nas.mip.sweep's workers; the same answers, on more cores)")

    @model_validator(mode="after")
    def _batch(self) -> SweepSpec:
        if (self.workload is None) != (self.batch_sizes is None):
            raise ValueError("give workload and batch_sizes together")
        return self


class SolverSpec(_Model):
    time_limit: float = Field(default=60.0, gt=0, description="seconds per solve")
    gap: float = Field(default=1e-4, ge=0, description="relative MIP gap")
    diverse: int = Field(default=1, ge=1, le=MAX_SWEEP_POINTS,
                         description="number of diverse solutions (each one more solve)")
    min_distance: int = Field(default=2, ge=1, le=MAX_BLOCKS,
                              description="blocks each solution differs in")
    threads: int = Field(default=1, ge=1, le=1024,
                         description="HiGHS threads (at most 1,024: past any machine's cores)")
    seed: int = Field(default=0, ge=0, le=2**31 - 1, description="HiGHS random_seed (int32)")
    sweep: SweepSpec | None = None


MAX_STAGES = 16
"""Stages of an iterative search: each one is a score run, a search, a build and a
distillation, so a handful is already hours on real models."""


class StageSpec(_Model):
    """One stage of an iterative search (``puzzle-nas iterate``): search with these budgets,
    build, distill, re-score. Relative bounds (``"60%"``) resolve against the ORIGINAL
    parent's figures (not the previous stage's child), so the last stage's budgets mean what
    the same budgets mean in a one-shot search."""

    name: str | None = None
    budgets: list[BudgetSpec] = Field(min_length=1)
    search_space: SearchSpace | None = Field(default=None, description="this stage's search "
                                             "space (default: the spec's), applied to the "
                                             "stage's parent (the previous stage's child)")


class CostsSpec(_Model):
    """Where block runtimes come from: the analytic model (default) or a measured block table."""

    measured: str | None = Field(
        default=None, description="BLOCKS.json from `puzzle-nas profile --blocks` (relative to "
        "the spec): block runtimes are the measured ones (interpolated between measured "
        "neighbours, refused where none), memory stays analytic; one device (tp = 1)")


class DeploySpec(_Model):
    """Where the child will serve: the engines that must load it (``nas.engines``).

    ``engines`` constrains the search space to what every one of them loads (the
    intersection): an alternative that varies an axis an engine does not take is dropped
    (the search report notes each kind dropped and why); an axis an engine reads once per
    model (global) becomes a tied choice, one value for every block of that kind. Absent
    (the default), the space is the one ``search_space`` describes and the report still
    says, for every engine, whether it loads the child and why not: a spec without
    ``deploy`` searches exactly what it did before this field existed (``docs/engines.md``
    explains the choice)."""

    engines: list[Literal["vllm", "trtllm", "sglang", "transformers"]] | None = Field(
        default=None, min_length=1, max_length=4, description="engines the child must load: "
        "vllm, trtllm (TensorRT-LLM), sglang, transformers (stock classes); the space is what "
        "all of them take (docs/engines.md)")
    candidates: DeployCandidates | None = Field(
        default=None, description="deployments searched together with the child (devices, "
        "parallel layouts, attention DP, engines, MTP drafts, prices): the search picks one "
        "deployment and one alternative per block at once (nas.deployspec, nas.search.deploy)")

    @field_validator("engines")
    @classmethod
    def _unique(cls, v: list[str] | None) -> list[str] | None:
        if v is not None and len(set(v)) != len(v):
            raise ValueError(f"engines lists an engine twice: {v}")
        return v

    @model_validator(mode="after")
    def _some(self) -> DeploySpec:
        if self.engines is None and self.candidates is None:
            raise ValueError("give engines or candidates (or leave deploy out)")
        return self


class SearchSpec(_Model):
    """Everything ``puzzle-nas search`` needs."""

    name: str = "search"
    parent: str | dict[str, Any] = Field(description="HF config.json path (relative to the "
                                         "spec) or an inline HF config object")
    hardware: HardwareSpec | str
    precision: str | dict[str, Any] = "bf16"
    workloads: dict[str, WorkloadSpec]
    search_space: SearchSpace = Field(default_factory=SearchSpace)
    quality: QualitySpec = Field(default_factory=QualitySpec)
    objective: ObjectiveSpec = Field(default_factory=ObjectiveSpec)
    budgets: list[BudgetSpec] = Field(default_factory=list)
    solver: SolverSpec = Field(default_factory=SolverSpec)
    costs: CostsSpec = Field(default_factory=CostsSpec)
    runtime_reserve: str | float = Field(default="2 GiB", description="memory held back for "
                                         "the serving runtime (CUDA context, allocator slack)")
    stages: list[StageSpec] = Field(default_factory=list, max_length=MAX_STAGES,
                                    description="iterative search (puzzle-nas iterate): "
                                    "budgets per stage, tightening step by step")
    deploy: DeploySpec | None = Field(default=None, description="engines the child must "
                                      "load (default: none required; the report says which "
                                      "engines load the child)")

    @field_validator("runtime_reserve")
    @classmethod
    def _reserve(cls, v: str | float) -> str | float:
        try:
            num, rel = parse_quantity(v, "memory", "runtime_reserve")
        except InputError as exc:
            raise ValueError(str(exc).split(": ", 1)[-1]) from None
        if rel or not num >= 0:
            raise ValueError(f"expected a memory size >= 0 like '2 GiB', got {v!r}")
        return v

    @field_validator("hardware", mode="before")
    @classmethod
    def _hw(cls, v: Any) -> Any:
        return {"profile": v} if isinstance(v, str) else v

    @field_validator("workloads")
    @classmethod
    def _wl(cls, v: dict[str, WorkloadSpec]) -> dict[str, WorkloadSpec]:
        if not v:
            raise ValueError("give at least one workload")
        return v

    @model_validator(mode="after")
    def _refs(self) -> SearchSpec:
        for i, b in enumerate(self.budgets):
            if b.workload is not None and b.workload not in self.workloads:
                raise ValueError(f"budgets[{i}].workload {b.workload!r} is not one of the "
                                 f"workloads {sorted(self.workloads)}")
        obj = self.objective.minimize or self.objective.maximize or ""
        if "@" in obj and obj.split("@", 1)[1] not in self.workloads:
            raise ValueError(f"objective names workload {obj.split('@', 1)[1]!r}, not one of "
                             f"{sorted(self.workloads)}")
        sw = self.solver.sweep
        if sw is not None and sw.workload is not None and sw.workload not in self.workloads:
            raise ValueError(f"solver.sweep.workload {sw.workload!r} is not one of the "
                             f"workloads {sorted(self.workloads)}")
        for k, st in enumerate(self.stages):
            for i, b in enumerate(st.budgets):
                if b.workload is not None and b.workload not in self.workloads:
                    raise ValueError(f"stages[{k}].budgets[{i}].workload {b.workload!r} is "
                                     f"not one of the workloads {sorted(self.workloads)}")
        if self.solver.sweep is not None and self.solver.sweep.budget >= len(self.budgets):
            raise ValueError(f"solver.sweep.budget {self.solver.sweep.budget} is not an index "
                             f"into budgets (there are {len(self.budgets)})")
        _open_loop_refs(self)
        return self

    @property
    def hw(self) -> HardwareSpec:
        return self.hardware  # type: ignore[return-value]  # the _hw validator turns a profile name into a HardwareSpec


def _loc(err: ErrorDetails) -> str:
    out = ""
    for p in err["loc"]:
        if isinstance(p, int):
            out += f"[{p}]"
        elif p in ("str", "float", "dict[str,any]", "HardwareSpec", "function-before[_hw()]"):
            continue
        else:
            out += ("." if out else "") + str(p)
    return out or "(root)"


def parse_spec(data: Any, source: str = "spec") -> SearchSpec:
    """Validate a spec object; errors carry the JSON path of the first mistake."""
    try:
        return SearchSpec.model_validate(data)
    except ValidationError as exc:
        err = exc.errors()[0]
        msg = str(err["msg"]).removeprefix("Value error, ")
        raise InputError(msg, path=source, field=_loc(err)) from None


def load_spec(path: str | Path) -> tuple[SearchSpec, Path, str]:
    """Read a spec file; returns (spec, folder relative paths resolve against, sha256)."""
    path = Path(path)
    data = read_json(path)
    return parse_spec(data, str(path)), path.resolve().parent, spec_hash(data)


def with_speculation(data: Any, draft_tokens: int | None, acceptance: float | None) -> Any:
    """A spec object with every workload drafting ``draft_tokens`` tokens per step at
    ``acceptance`` (``None``: the workload's own field; ``puzzle-nas search --draft-tokens D
    --acceptance A``). Not a dict / workloads not an object: ``data`` unchanged (validation
    reports it)."""
    wls = data.get("workloads") if isinstance(data, dict) else None
    if not isinstance(wls, dict):
        return data
    out = {}
    for name, w in wls.items():
        if isinstance(w, dict):
            w = dict(w)
            if draft_tokens is not None:
                w["draft_tokens"] = draft_tokens
            if acceptance is not None:
                w["acceptance"] = acceptance
        out[name] = w
    return {**data, "workloads": out}


def spec_hash(data: Any) -> str:
    return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()[:16]


def json_schema() -> dict[str, Any]:
    """The JSON schema of :class:`SearchSpec`."""
    return SearchSpec.model_json_schema()


# ---- quantities -------------------------------------------------------------------------
_UNITS = UNITS  # the table lives in nas.units (nas.mip reads it too)
METRIC_UNITS = {
    "memory": "memory", "weight_memory": "memory", "ttft": "time", "tpot": "time",
    "runtime": "time", "per_user_tps": "rate", "throughput": "rate",
    "total_params": "count", "active_params": "count", "kept_blocks": "count",
    "max_concurrency": "count", "quality": "count",
}
_Q = re.compile(r"^\s*([-+]?\d+(?:\.\d*)?(?:[eE][-+]?\d+)?)\s*([^\d\s].*)?$")


def parse_quantity(value: str | float, metric: str, field: str) -> tuple[float, bool]:
    """(number in base units, is_relative). ``"60%"`` -> (0.6, True). NaN is refused (it
    would compare false with everything and pass as a bound); an infinite bound means none."""
    if isinstance(value, int | float) and not isinstance(value, bool):
        if isinstance(value, int) and abs(value) > 2**63 or not math.isfinite(value):
            shown = f"a {len(str(abs(value)))}-digit integer" if isinstance(value, int) \
                else repr(value)
            raise InputError(f"expected a finite number, got {shown} (leave a budget out "
                             "to not bound it)", field=field)
        return _in_range(float(value), value, field), False
    text = str(value).strip()
    if text.endswith("%"):
        try:
            pct = float(text[:-1])
        except ValueError:
            raise InputError(f"cannot read {value!r} as a percentage", field=field) from None
        if not math.isfinite(pct):
            raise InputError(f"expected a finite percentage, got {value!r}", field=field)
        return pct / 100.0, True
    if text.lower() == "device" and metric in ("memory", "weight_memory"):
        return float("nan"), False  # resolved against the hardware by the caller
    m = _Q.match(text)
    units = _UNITS[METRIC_UNITS[metric]]
    if not m:
        raise InputError(f"cannot read {value!r}; expected a number with a unit from "
                         f"{sorted(u for u in units if u)} or a percentage", field=field)
    unit = (m.group(2) or "").strip().lower()
    if unit not in units:
        raise InputError(f"unknown unit {unit!r} for {metric}; expected one of "
                         f"{sorted(u for u in units if u) or ['none']} or a percentage",
                         field=field)
    out = float(m.group(1)) * units[unit]
    if not math.isfinite(out):
        raise InputError(f"expected a finite number, got {value!r}", field=field)
    return _in_range(out, value, field), False


MAX_QUANTITY = 1e18
"""Largest budget magnitude in base units (1 EB, 3e10 years, 1e18 tok/s): HiGHS takes any
bound of 1e20 or more as infinite and rejects models with huge ones, so a larger budget
would bound nothing or fail in the solver."""


def _in_range(out: float, value: Any, field: str) -> float:
    if abs(out) > MAX_QUANTITY:
        raise InputError(f"{value!r} is out of range (at most {MAX_QUANTITY:.0e} in base "
                         "units; leave a budget out to not bound it)", field=field)
    return out
