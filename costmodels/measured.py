"""Measured block costs: the ``BLOCKS.json`` format, lookup with interpolation, pricing a
block table from measurements, and calibrating the analytic model to them.

``puzzle-nas profile --blocks SPEC -o BLOCKS.json`` (``nas.profile.blocks``) times every
distinct block shape of a spec's search space as the real torch block on one device: one
prefill pass of ``batch`` prompts of ``tokens`` tokens, and one decode step of ``batch``
sequences whose KV cache / SSM state holds ``context`` tokens. This module reads that file
(:class:`BlockMeasurements`) and needs no torch.

**Lookup** (:meth:`BlockMeasurements.seconds`): a measured point is returned as measured
(exact). Between measured batch sizes of the same shape, mode, prompt length and context
the time is interpolated linearly in the batch size; a shape that was not measured is
interpolated linearly between its two nearest measured neighbours that differ from it in
exactly one column (e.g. ``ffn_width``), one on each side. Anything else (a batch or a
width outside the measured range, another prompt length or context, another kind) is an
:class:`~hwprofiles.errors.InputError` that says what was measured; it is never priced
analytically behind the user's back.

**Pricing** (:func:`price_measured`): the same :class:`~costmodels.blocks.BlockCosts` as
:func:`~costmodels.blocks.price_blocks` (same keys, seconds and bytes), with the step times
taken from the measurements and composed into TTFT / TPOT / cycle by the same
:func:`~costmodels.blocks.serving_shares`. Memory (weights, KV cache, state) stays analytic:
it is exact arithmetic on the shapes. A *decode step* is the measured decode of B
sequences at the workload's mean context ``isl + osl/2`` (rounded to whole tokens: a cache
holds whole tokens). A *mixed step* (chunked prefill, concurrency mode) is the measured
prefill of its ``B / n_c`` prompts plus the measured decode of its decoding sequences, two
separate passes (the torch blocks run one kind of batch at a time; a fused engine reads the
weights once, so this is an upper bound when decodes ride along). Batch mode has no
decodes in its prefill step, so there the composition is exact. One device only: ``tp``,
``ep`` > 1, attention DP and speculative decoding are refused (nothing of them was timed).

**The non-block step** (:attr:`BlockMeasurements.nonblock`, :func:`nonblock_steps`): the
profile also times the model around its blocks, a model of the same embedding, final norm
and head whose blocks are no-ops, at the same points, the next token taken as greedy
decoding takes it (argmax of the last position's logits): the embedding lookup, the final
norm, the head's GEMM and whatever the eager model's forward and the sampling cost per step
beyond the blocks. Where it was timed, :func:`costmodels.model.price_nonblock` takes these
times instead of its roofline's (the engine's overheads added as to the roofline's): on a
CPU a 1-row GEMM of the head runs at the GEMM library's rate, not the memory roofline's,
and the step's host work is not in any block (on SmolLM2-135M the roofline priced the
non-block decode step at 6.5 ms; it times 7.7 ms).

**Calibration** (:func:`fit_blocks`): the model of what ran priced at each measured point
against the measured median (:func:`predict_points`): a point whose op trace was recorded
as eager torch ran it, op by op (:mod:`costmodels.eager`); an older point without one by
the fused block model (one block, batch mode, ``osl`` = 2 so that TTFT is exactly the
prefill pass and TPOT the decode step); fitted with the shared bounded least-squares
fitter of :mod:`costmodels.calibrate` (:func:`costmodels.calibrate.fit_residuals`).

Units: seconds, bytes.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any, Final, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from costmodels import ops
from costmodels.blocks import BlockCosts, _workload_columns, price_blocks, serving_shares
from costmodels.dtypes import PrecisionRecipe, TensorRole, bytes_per_element
from costmodels.eager import OpTrace, gemm_call_s, price_trace
from costmodels.shapes import KIND_NAMES, BlockTable, Kind
from costmodels.workload import Workload, parse_workload
from hwprofiles.errors import InputError, first_error, require_file
from hwprofiles.schema import HardwareProfile

FORMAT: Final = "puzzle-nas/blocks"
Mode = Literal["prefill", "decode"]


class Point(BaseModel):
    """One workload point a block is timed at.

    ``prefill``: one pass of ``batch`` prompts of ``tokens`` tokens from an empty cache
    (``context`` 0). ``decode``: one step of ``batch`` sequences, one new token each
    (``tokens`` 1), with the cache holding ``context`` tokens before the step.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    mode: Mode
    batch: int = Field(ge=1, description="sequences in the pass")
    tokens: int = Field(ge=1, description="tokens per sequence in the pass")
    context: int = Field(ge=0, description="tokens already in the cache (decode)")

    @model_validator(mode="after")
    def _consistent(self) -> Point:
        if self.mode == "decode" and self.tokens != 1:
            raise ValueError("a decode point has tokens = 1")
        if self.mode == "prefill" and self.context != 0:
            raise ValueError("a prefill point starts from an empty cache (context = 0)")
        return self

    def label(self) -> str:
        if self.mode == "prefill":
            return f"prefill {self.batch}x{self.tokens}"
        return f"decode b{self.batch}@{self.context}"


class Timing(Point):
    """A timed point: the median of ``repeats`` timed calls and their spread."""

    median_s: float = Field(gt=0, description="median seconds per call")
    min_s: float = Field(gt=0, description="fastest timed call, seconds")
    max_s: float = Field(gt=0, description="slowest timed call, seconds")
    repeats: int = Field(ge=1)
    peak_bytes: int = Field(ge=0, description="peak bytes of the tensors alive during the "
                            "call: weights, cache, input and intermediates")
    trace: OpTrace | None = Field(default=None, description="the aten ops one call "
                                  "dispatched (costmodels.eager); absent in tables timed "
                                  "before traces were recorded, which are priced by the "
                                  "fused block model")

    @model_validator(mode="after")
    def _order(self) -> Timing:
        if not self.min_s <= self.median_s <= self.max_s:
            raise ValueError(f"expected min_s <= median_s <= max_s, got {self.min_s}, "
                             f"{self.median_s}, {self.max_s}")
        return self

    @property
    def point(self) -> Point:
        return Point(mode=self.mode, batch=self.batch, tokens=self.tokens, context=self.context)


class BlockEntry(BaseModel):
    """One distinct block shape and its timings."""

    model_config = ConfigDict(extra="forbid")

    key: str = Field(description="canonical shape key (row_key of the row)")
    kind: str
    describe: str = ""
    row: dict[str, int] = Field(description="the costmodels.shapes.BlockTable columns "
                                "(non-zero ones)")
    config: dict[str, Any] = Field(default_factory=dict, description="the block config timed")
    weight_bytes: int = Field(ge=0, description="bytes of the module's parameters")
    timings: list[Timing] = Field(default_factory=list)

    @model_validator(mode="after")
    def _key(self) -> BlockEntry:
        if self.key != row_key(self.row):
            raise ValueError(f"key {self.key!r} does not match the row (expected "
                             f"{row_key(self.row)!r})")
        return self


class GemmTiming(BaseModel):
    """A GEMM timed in the layout the blocks' linear layers run (``x @ W^T``,
    ``torch.nn.functional.linear``): ``m`` tokens, ``n`` outputs, ``k`` inputs."""

    model_config = ConfigDict(extra="forbid")

    m: int = Field(ge=1)
    n: int = Field(ge=1)
    k: int = Field(ge=1)
    median_s: float = Field(gt=0)
    flop_per_s: float = Field(gt=0, description="2*m*n*k / median_s")
    min_s: float | None = Field(default=None, gt=0, description="fastest sample (absent in "
                                "older tables)")


class AttentionTiming(BaseModel):
    """The attention kernel timed at an attention block's shape and a prefill point, as the
    block runs it (``scaled_dot_product_attention``, causal, ``enable_gqa`` for grouped KV
    heads): ``batch`` prompts of ``tokens`` tokens, ``heads`` query and ``kv_heads`` KV heads
    of ``head_dim``. ``flops`` is the cost model's count of it
    (``costmodels.ops.attention_prefill``: causal pairs)."""

    model_config = ConfigDict(extra="forbid")

    batch: int = Field(ge=1)
    tokens: int = Field(ge=1)
    heads: int = Field(ge=1)
    kv_heads: int = Field(ge=1)
    head_dim: int = Field(ge=1)
    flops: float = Field(gt=0)
    median_s: float = Field(gt=0)
    min_s: float | None = Field(default=None, gt=0, description="fastest sample (absent in "
                                "older tables)")


class BlockMeasurements(BaseModel):
    """The ``BLOCKS.json`` format: where, when and how the blocks were timed, and the
    timings of each distinct block shape."""

    model_config = ConfigDict(extra="forbid")

    format: Literal["puzzle-nas/blocks"] = FORMAT
    version: Literal[1] = 1
    device: str = Field(min_length=1, description="device name, e.g. 'NVIDIA H200' or the CPU")
    device_kind: Literal["cpu", "cuda"]
    date: str = Field(description="ISO date of the run (UTC)")
    software: dict[str, str] = Field(description="versions: torch, python, puzzle-nas, cuda")
    dtype: str = Field(description="weights and activations dtype of the timed blocks")
    threads: int | None = Field(default=None, description="CPU: torch threads")
    timing: str = Field(description="how the times were taken")
    warmup: int = Field(ge=0)
    repeats: int = Field(ge=1)
    spec: str = Field(default="", description="the spec whose space was timed")
    hidden: int = Field(ge=1)
    plan: list[Point] = Field(description="the points every block is timed at")
    attention: list[AttentionTiming] = Field(
        default_factory=list, description="the attention kernel at the attention blocks' "
        "shapes and prefill points (with_attention_curve)")
    gemm: list[GemmTiming] = Field(default_factory=list, description="GEMMs in the blocks' "
                                   "layout, timed with the same discipline")
    blocks: list[BlockEntry] = Field(default_factory=list)
    nonblock: BlockEntry | None = Field(
        default=None, description="the model around its blocks (embedding, final norm, head "
        "and the greedy next token) timed at the plan's points; kind 'nonblock', row "
        "nonblock_row(...). Absent in tables timed before it was: priced by the roofline")

    @model_validator(mode="after")
    def _unique(self) -> BlockMeasurements:
        keys = [b.key for b in self.blocks]
        if len(set(keys)) != len(keys):
            raise ValueError("a block shape appears twice")
        return self

    # -- lookup ------------------------------------------------------------------------
    def estimate(self, rec: Timing | GemmTiming | AttentionTiming) -> float:
        """The seconds a timed record stands for. On a CPU its fastest sample (each sample
        a block of calls): on a shared core other work only ever adds time (another
        tenant's turn on the cache, a clock change), so the minimum is the run-to-run
        stable estimate of the block's own cost, the median one of the machine's load
        (Chen and Revels, "Robust benchmarking in noisy environments", 2016,
        https://arxiv.org/abs/1608.04295). On CUDA, where each sample is one event-timed
        call with the L2 flushed, its median. Older GEMM and attention records without a
        fastest sample give their median."""
        if self.device_kind == "cpu" and rec.min_s is not None:
            return rec.min_s
        return rec.median_s

    def estimator(self) -> str:
        """What :meth:`estimate` takes, in words (for figures' sources)."""
        how = "fastest" if self.device_kind == "cpu" else "median"
        return f"{how} of {self.repeats} samples after {self.warmup} warm-up"

    def entry(self, key: str) -> BlockEntry | None:
        """The entry of shape ``key`` (``None`` when it was not measured)."""
        return self._index().get(key)

    def _index(self) -> dict[str, BlockEntry]:
        idx = self.__dict__.get("_idx")
        if idx is None or len(idx) != len(self.blocks):
            idx = {b.key: b for b in self.blocks}
            self.__dict__["_idx"] = idx
        return idx

    def complete(self, entry: BlockEntry) -> bool:
        """Whether ``entry`` holds a timing of every point of the plan."""
        have = {t.point for t in entry.timings}
        return all(p in have for p in self.plan)

    def seconds(self, row: dict[str, int], mode: Mode, batch: float, tokens: int,
                context: int, where: str = "") -> float:
        """Seconds of one pass of the block ``row`` (measured, or interpolated; see the
        module docstring). Raises :class:`InputError` naming what is missing."""
        if int(row.get("kind", 0)) == int(Kind.NOOP):
            return 0.0  # nothing runs
        key = row_key(row)
        e = self.entry(key)
        if e is not None:
            return _along_batch(e, mode, batch, tokens, context, where, self.estimate)
        lo, hi, col = self._neighbours(row, where)
        t_lo = _along_batch(lo, mode, batch, tokens, context, where, self.estimate)
        t_hi = _along_batch(hi, mode, batch, tokens, context, where, self.estimate)
        x0, x1, x = lo.row.get(col, 0), hi.row.get(col, 0), row.get(col, 0)
        return float(t_lo + (t_hi - t_lo) * (x - x0) / (x1 - x0))

    def _neighbours(self, row: dict[str, int], where: str
                    ) -> tuple[BlockEntry, BlockEntry, str]:
        r = _nonzero(row)
        kind = r.get("kind", 0)
        best: dict[str, tuple[BlockEntry | None, BlockEntry | None]] = {}
        for e in self.blocks:
            if e.row.get("kind", 0) != kind:
                continue
            diff = [c for c in set(r) | set(e.row) if r.get(c, 0) != e.row.get(c, 0)]
            if len(diff) != 1:
                continue
            c = diff[0]
            lo, hi = best.get(c, (None, None))
            v, x = e.row.get(c, 0), r.get(c, 0)
            if v < x and (lo is None or v > lo.row.get(c, 0)):
                lo = e
            if v > x and (hi is None or v < hi.row.get(c, 0)):
                hi = e
            best[c] = (lo, hi)
        for c, (lo, hi) in sorted(best.items()):
            if lo is not None and hi is not None:
                return lo, hi, c
        kname = describe_row({"kind": kind}).split()[0]
        near = sorted(best)
        raise InputError(
            f"block {describe_row(r)} was not measured and has no measured neighbours on "
            f"both sides of one width (measured {kname} shapes: "
            f"{[describe_row(e.row) for e in self.blocks if e.row.get('kind') == kind]}"
            + (f"; one-sided neighbours differ in {near}" if near else "")
            + "); run `puzzle-nas profile --blocks` on this spec", field=where or "blocks")


NONBLOCK: Final = "nonblock"
"""The kind name of :attr:`BlockMeasurements.nonblock`."""


def nonblock_row(hidden: int, vocab: int, tied: bool, final_norm: bool) -> dict[str, int]:
    """The shape of a model's non-block parts as :attr:`BlockMeasurements.nonblock` keys it
    (its non-zero columns)."""
    return _nonzero({"hidden": hidden, "vocab": vocab, "tied": int(tied),
                     "final_norm": int(final_norm)})


def describe_nonblock(row: dict[str, int]) -> str:
    """``embedding 49152 x 576, final norm, head tied``."""
    return (f"embedding {row.get('vocab', 0)} x {row.get('hidden', 0)}"
            + (", final norm" if row.get("final_norm") else "")
            + (", head tied" if row.get("tied") else ", head"))


def nonblock_steps(meas: BlockMeasurements, row: dict[str, int], where: str = "costs.measured"
                   ) -> Callable[[Workload], tuple[float, float]] | None:
    """The measured non-block step of the model of shape ``row`` (:func:`nonblock_row`):
    ``workload -> (mixed step seconds, decode step seconds)``, composed as
    :func:`price_measured` composes a block's (a mixed step: the prefill of its prompts
    plus the decode of its decoding sequences). None when the table holds no non-block
    timings (older tables: the roofline prices it); an :class:`InputError` when it holds
    another model's."""
    e = meas.nonblock
    if e is None:
        return None
    if e.row != _nonzero(row):
        raise InputError(f"the non-block parts were timed for {describe_nonblock(e.row)}; "
                         f"this model has {describe_nonblock(_nonzero(row))}: run `puzzle-nas "
                         "profile --blocks` on this spec", field=where)

    def steps(w: Workload) -> tuple[float, float]:
        return _step_seconds(step_shapes(w), lambda mode, batch, tokens, context: _along_batch(
            e, mode, batch, tokens, context, where, meas.estimate))

    return steps


def _step_seconds(s: StepShapes, seconds: Callable[[Mode, float, int, int], float]
                  ) -> tuple[float, float]:
    """``(mixed step, decode step)`` seconds of one workload's steps ``s`` from a measured
    pass ``seconds(mode, batch, tokens, context)``: a mixed step is the prefill of its
    prompts plus the decode of its decoding sequences (two passes), a decode step the
    decode of the batch (the module docstring)."""
    mix = seconds("prefill", s.prompts, s.isl, 0)
    if s.decodes_in_mix > 0:
        mix += seconds("decode", s.decodes_in_mix, 1, s.context)
    return mix, seconds("decode", float(s.batch), 1, s.context)


def row_key(row: dict[str, int]) -> str:
    """Canonical key of a block shape: its non-zero BlockTable columns, sorted."""
    r = _nonzero(row)
    return ",".join(f"{k}={v}" for k, v in sorted(r.items()))


def _nonzero(row: dict[str, int]) -> dict[str, int]:
    return {str(k): int(v) for k, v in row.items() if int(v) != 0}


def describe_row(row: dict[str, int]) -> str:
    """``ffn hidden=512 ffn_width=1792 gated=1``: the kind and the shape columns."""
    r = _nonzero(row)
    k = r.pop("kind", 0)
    name = KIND_NAMES[Kind(k)] if k in {int(x) for x in Kind} else str(k)
    return name + " " + " ".join(f"{c}={v}" for c, v in sorted(r.items()))


def table_rows(table: BlockTable) -> list[dict[str, int]]:
    """Each row of ``table`` as a dict of its non-zero columns."""
    cols = BlockTable.columns()
    data = {c: getattr(table, c) for c in cols}
    return [_nonzero({c: int(data[c][i]) for c in cols}) for i in range(len(table))]


def _along_batch(e: BlockEntry, mode: Mode, batch: float, tokens: int, context: int,
                 where: str, seconds: Callable[[Timing], float]) -> float:
    pts = sorted((t.batch, seconds(t)) for t in e.timings
                 if t.mode == mode and t.tokens == tokens and t.context == context)
    what = (f"prefill of {tokens}-token prompts" if mode == "prefill"
            else f"decode at context {context}")
    name = (f"the non-block parts ({describe_nonblock(e.row)})" if e.kind == NONBLOCK
            else f"block {describe_row(e.row)}")
    if not pts:
        have = sorted({(t.mode, t.tokens if t.mode == "prefill" else t.context)
                       for t in e.timings})
        raise InputError(
            f"{name}: no {what} was measured (measured: "
            f"{[f'{m} {n}' for m, n in have]}); run `puzzle-nas profile --blocks` with this "
            "spec's workloads", field=where or "blocks")
    bs = [b for b, _ in pts]
    for b, s in pts:
        if b == batch:
            return float(s)
    if not bs[0] <= batch <= bs[-1]:
        raise InputError(
            f"{name}: {what} at batch {batch:g} is outside the "
            f"measured batches {bs}; add it with `puzzle-nas profile --blocks --batches`",
            field=where or "blocks")
    return float(np.interp(batch, bs, [s for _, s in pts]))


def load_blocks(path: str | Path) -> BlockMeasurements:
    """Read a ``BLOCKS.json``; a bad file is one line naming it and the field."""
    p = require_file(path)
    try:
        data = json.loads(p.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise InputError(f"not a JSON block table ({exc})", path=str(p)) from None
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise InputError(f"not a block table: expected \"format\": \"{FORMAT}\" "
                         "(write one with `puzzle-nas profile --blocks SPEC -o BLOCKS.json`)",
                         path=str(p), field="format")
    try:
        return BlockMeasurements.model_validate(data)
    except ValidationError as exc:
        loc, msg = first_error(exc)
        raise InputError(msg, path=str(p), field=loc) from None


# -- the points of a workload -------------------------------------------------------------

@dataclass(frozen=True)
class StepShapes:
    """The passes one workload's engine steps consist of (see the module docstring)."""

    prompts: float  # prompts in a mixed step (B / n_c)
    isl: int
    decodes_in_mix: float  # decoding sequences riding along in a mixed step
    batch: int  # sequences in a decode step
    context: int  # cache length of a decode step (mean decode context, whole tokens)


def step_shapes(w: Workload) -> StepShapes:
    """What a workload's steps run, in the terms of measured points."""
    B = float(w.sequences)
    nc = float(w.prefill_chunks)
    oeff = 1.0 + (w.osl - 1.0) / w.acceptance
    return StepShapes(prompts=B / nc, isl=int(w.isl),
                      decodes_in_mix=(B * min(nc - 1.0, oeff - 1.0) / nc if w.mixed_prefill else 0.0),
                      batch=int(w.sequences), context=int(math.floor(w.mean_decode_context + 0.5)))


def batch_grid(n: int) -> list[int]:
    """Batch sizes timed for a workload of ``n`` sequences: 1, n/4 and n."""
    return sorted({1, max(1, n // 4), int(n)})


def plan_points(workloads: Sequence[Workload | str], extra_batches: Sequence[int] = ()
                ) -> list[Point]:
    """The points that price ``workloads`` exactly where they fall on a measured batch:
    per workload, prefill of its prompts and decode at its mean context, each at
    :func:`batch_grid` batch sizes (plus the mixed step's prompt and decode counts, and
    ``extra_batches``)."""
    pts: set[Point] = set()
    for w in (parse_workload(x) for x in workloads):
        s = step_shapes(w)
        pb = set(batch_grid(s.batch)) | set(extra_batches)
        db = set(batch_grid(s.batch)) | set(extra_batches)
        for v in (s.prompts,):
            pb |= {b for b in (math.floor(v), math.ceil(v)) if b >= 1}
        if s.decodes_in_mix > 0:
            db |= {b for b in (math.floor(s.decodes_in_mix), math.ceil(s.decodes_in_mix))
                   if b >= 1}
        pts |= {Point(mode="prefill", batch=b, tokens=s.isl, context=0) for b in pb}
        pts |= {Point(mode="decode", batch=b, tokens=1, context=s.context) for b in db}
    return sorted(pts, key=lambda p: (p.mode != "prefill", p.tokens, p.context, p.batch))


# -- pricing ------------------------------------------------------------------------------

def check_recipe(meas: BlockMeasurements, recipe: PrecisionRecipe, where: str = "") -> None:
    """The recipe must compute what was timed: every weight role and the activations in
    the measured dtype."""
    dts = {recipe.activations.value} | {recipe.weight_dtype(r).value for r in TensorRole}
    if dts != {meas.dtype}:
        raise InputError(f"the blocks were timed in {meas.dtype}, the precision recipe "
                         f"{recipe.name!r} uses {sorted(dts)}; time them in the spec's "
                         "precision or price analytically", field=where or "precision")


def price_measured(table: BlockTable, hw: HardwareProfile, recipe: PrecisionRecipe,
                   meas: BlockMeasurements, workloads: Sequence[Workload | str],
                   tp: int = 1, ep: int = 1, attention_dp: bool = False,
                   draft: np.ndarray | Sequence[bool] | None = None,
                   where: str = "costs.measured") -> BlockCosts:
    """Price every row of ``table`` from the measured block times (memory analytic).

    Same arguments and result as :func:`costmodels.blocks.price_blocks` (``BlockCosts``:
    ``[N, W]`` seconds and bytes); ``hw`` prices the memory columns only. Raises
    :class:`InputError` for a layout or a shape the measurements cannot price.
    """
    if tp != 1 or ep != 1 or attention_dp:
        raise InputError(f"measured block costs are of one device; got tp={tp}, ep={ep}, "
                         f"attention_dp={attention_dp} (use tp=1 or analytic costs)",
                         field=where)
    if draft is not None and bool(np.any(draft)):
        raise InputError("speculative-decoding (MTP) rows were not timed", field=where)
    wls = tuple(parse_workload(w) for w in workloads)
    for w in wls:
        if w.draft_tokens:
            raise InputError(f"workload {w.name!r}: speculative decoding was not timed",
                             field=where)
    check_recipe(meas, recipe)
    # each distinct shape is looked up once per workload, then scattered to its rows
    cols = BlockTable.columns()
    n, nw = len(table), len(wls)
    mat = (np.stack([getattr(table, c) for c in cols], axis=1) if n
           else np.zeros((0, len(cols)), dtype=np.int64))
    uniq, inv = np.unique(mat, axis=0, return_inverse=True)
    rows = [_nonzero({c: int(v) for c, v in zip(cols, u)}) for u in uniq]
    if any(r.get("hidden", 0) != meas.hidden for r in rows if r.get("kind", 0) != int(Kind.NOOP)):
        hs = sorted({r.get("hidden", 0) for r in rows})
        raise InputError(f"the blocks were timed at hidden size {meas.hidden}, the table "
                         f"has {hs}", field=where)
    analytic = price_blocks(table, hw, recipe, wls, tp=1, ep=1)
    mix_u = np.zeros((len(rows), nw))
    dec_u = np.zeros((len(rows), nw))
    for j, w in enumerate(wls):
        s = step_shapes(w)
        if s.prompts < 1.0:
            raise InputError(
                f"workload {w.name!r}: a prompt of {w.isl} tokens spans several engine "
                f"steps (token budget {w.max_num_batched_tokens}); measured costs time whole "
                "prompts: raise max_num_batched_tokens or price analytically", field=where)
        for i, r in enumerate(rows):
            mix_u[i, j], dec_u[i, j] = _step_seconds(s, partial(meas.seconds, r, where=where))
    inv = np.asarray(inv).reshape(-1)
    mix, dec = mix_u[inv], dec_u[inv]
    prefill, decode, runtime = serving_shares(mix, dec, _workload_columns(wls))
    return BlockCosts(
        workloads=wls, tp=1, ep=1, prefill_s=prefill, decode_s=decode, runtime_s=runtime,
        memory_bytes=analytic.memory_bytes, weight_bytes=analytic.weight_bytes,
        kv_bytes_per_token=analytic.kv_bytes_per_token, window=analytic.window,
        state_bytes_per_sequence=analytic.state_bytes_per_sequence,
        workspace_bytes_per_token=analytic.workspace_bytes_per_token)


# -- the analytic model at the measured points, and its calibration ---------------------------

def point_workload(p: Point) -> Workload:
    """The batch-mode workload whose TTFT share is exactly the prefill pass of ``p`` and
    whose TPOT share is exactly the decode step of ``p`` (``osl`` = 2, mean decode context
    ``isl + 1``)."""
    if p.mode == "prefill":
        return Workload(isl=p.tokens, osl=2, batch=p.batch)
    if p.context < 1:
        raise InputError("a decode point needs context >= 1", field="context")
    return Workload(isl=p.context - 1, osl=2, batch=p.batch) if p.context > 1 else \
        Workload(isl=1, osl=1, batch=p.batch)


@dataclass
class Compared:
    """The analytic prediction of one measured point."""

    kind: str
    key: str
    point: Point
    measured_s: float
    predicted_s: float

    @property
    def error(self) -> float:
        """Signed relative error ``predicted / measured - 1``."""
        return self.predicted_s / self.measured_s - 1.0


def predict_points(meas: BlockMeasurements, hw: HardwareProfile, recipe: PrecisionRecipe
                   ) -> list[Compared]:
    """The model of what ran at every measured point: a point with an op trace is priced
    op by op as eager torch ran it (:func:`costmodels.eager.price_trace`), one without by
    the fused block model (``price_blocks`` on ``hw``)."""
    entries = [e for e in meas.blocks if e.row.get("kind", 0) != int(Kind.NOOP)]
    if not entries:
        return []
    costs = col = None
    if any(t.trace is None for e in entries for t in e.timings):
        table = BlockTable.from_rows([e.row for e in entries])
        pts = sorted({t.point for e in entries for t in e.timings},
                     key=lambda p: (p.mode, p.tokens, p.context, p.batch))
        col = {p: j for j, p in enumerate(pts)}
        costs = price_blocks(table, hw, recipe, [point_workload(p) for p in pts])
    out = []
    for i, e in enumerate(entries):
        for t in e.timings:
            if t.trace is not None:
                pred = price_trace(t.trace, hw, meas.dtype)
            else:
                assert costs is not None and col is not None  # some timing has no trace
                j = col[t.point]
                pred = costs.prefill_s[i, j] if t.mode == "prefill" else costs.decode_s[i, j]
            out.append(Compared(e.kind, e.key, t.point, meas.estimate(t), float(pred)))
    return out


def rms_log_error(compared: Sequence[Compared]) -> float:
    """``sqrt(mean(log(predicted / measured)**2))`` over the points: what the block fit
    minimizes (:func:`fit_blocks`), so profiles compare on the fit's own scale."""
    if not compared:
        return 0.0
    e = np.log(np.array([c.predicted_s / c.measured_s for c in compared]))
    return float(np.sqrt(np.mean(e * e)))


def _norm_name(s: str) -> str:
    return re.sub(r"[^a-z0-9]", "", s.lower())


def timed_on(meas: BlockMeasurements, hw: HardwareProfile) -> bool:
    """Whether ``meas`` was timed on the device ``hw`` describes: the table's device name is
    the profile's display name, or holds the profile's name or one of its aliases (``h100``
    in ``NVIDIA H100 80GB HBM3``), names compared without case, spaces or punctuation. CPU
    timings never match a GPU vendor's profile."""
    if meas.device_kind == "cpu" and hw.vendor.lower() in _GPU_VENDORS:
        return False
    dev = _norm_name(meas.device)
    if dev == _norm_name(hw.display_name):
        return True
    names = [_norm_name(n) for n in (hw.name, hw.display_name, *hw.aliases)]
    return any(len(n) >= 3 and n in dev for n in names)


_GPU_VENDORS = frozenset({"nvidia"})
"""Vendors whose profiles are GPUs only (AMD's are CPUs or Instinct GPUs)."""


def mape_by_kind(compared: Sequence[Compared]) -> list[dict[str, Any]]:
    """Rows ``{kind, mode, n, mape, bias}`` (fractions) per kind x mode, per kind, and
    ``all``."""
    keys: list[tuple[str, str]] = []
    for c in compared:
        for k in ((c.kind, c.point.mode), (c.kind, "all")):
            if k not in keys:
                keys.append(k)
    keys.sort(key=lambda k: (k[0], k[1] == "all", k[1]))
    keys.append(("all", "all"))
    rows = []
    for kind, mode in keys:
        e = np.array([c.error for c in compared if kind in ("all", c.kind)
                      and mode in ("all", c.point.mode)])
        if e.size:
            rows.append({"kind": kind, "mode": mode, "n": int(e.size),
                         "mape": float(np.mean(np.abs(e))), "bias": float(np.mean(e))})
    return rows


def format_mape(before: Sequence[dict], after: Sequence[dict] | None = None) -> str:
    """The per-kind MAPE table (before and, when given, after a fit)."""
    aft = {(r["kind"], r["mode"]): r for r in after or []}
    head = f"{'kind':<10} {'mode':<8} {'n':>4} {'MAPE':>7} {'bias':>7}"
    lines = [head + (f" {'MAPE after':>11} {'bias after':>11}" if after is not None else "")]
    for r in before:
        s = (f"{r['kind']:<10} {r['mode']:<8} {r['n']:>4} {r['mape']:>6.1%} "
             f"{r['bias']:>+6.1%}")
        a = aft.get((r["kind"], r["mode"]))
        if a is not None:
            s += f" {a['mape']:>10.1%} {a['bias']:>+10.1%}"
        lines.append(s)
    return "\n".join(lines)


EAGER_KERNEL_OVERHEAD = (0.0, 200e-6, (
    "seconds per kernel of the cost model's kernel counts, for blocks run by eager torch: the "
    "counts are a fused serving engine's (costmodels.blocks K_*: a norm is 1 kernel, "
    "attention's projections 2), while eager torch dispatches each op apart (an RMSNorm is ~7 "
    "ops, RoPE ~8, each 3-30 us of dispatch on a CPU core, a few us of launch on a GPU), so "
    "one modelled kernel costs up to ~10 eager ops: 0-200 us (the serving fit keeps 0-10 us)"))
"""Bounds of the kernel overhead fitted to timed eager blocks (lo, hi, why), seconds."""


TRACED_OP_OVERHEAD = (0.0, 50e-6, (
    "seconds per dispatched aten op that runs a kernel, for points priced op by op "
    "(costmodels.eager): 3-30 us of dispatch per op on a CPU core, a few us of launch on a "
    "GPU; 50 us caps a slow shared core"))
"""Bounds of the kernel overhead fitted to traced eager blocks (lo, hi, why), seconds."""

GEMM_CALL_OVERHEAD = (0.0, 100e-6, (
    "seconds one eager GEMM call costs beyond its roofline time: the GEMM library's fixed "
    "cost (a kernel launch on a GPU, a few us; oneDNN's primitive setup for a bf16 GEMM on a "
    "CPU core, ~20-30 us here); 100 us caps a slow shared core"))
"""Bounds of the fitted GEMM call overhead (lo, hi, why), seconds."""

VIEW_OVERHEAD = (0.0, 20e-6, (
    "seconds per dispatched op that runs no kernel (a view): about 1 us of Python and "
    "dispatcher on a CPU core; 20 us caps a slow shared core"))
"""Bounds of the fitted view overhead (lo, hi, why), seconds."""

ELEMENTWISE_RANGE = (0.01, 10.0, (
    "an eager elementwise op's bytes per second, as a multiple of the device-memory "
    "bandwidth: operands resident in cache stream at up to ~10x the memory rate, and a "
    "dtype without native arithmetic (bf16 on a CPU without AVX512-BF16) converts every "
    "element, down to ~1/100 of it"))
"""Bounds of the fitted eager elementwise bandwidth, as multiples of the memory bandwidth."""


ELEMENTWISE_KEPT = (
    "a probed eager elementwise rate is not fitted to timed blocks: their elementwise bytes "
    "are 2-5 % of their time (examples/measured-cpu), so the fit cannot tell the rate from "
    "the per-op overhead; fitted there it wandered from 42 to 268 GB/s over six runs and "
    "once stopped on its 10x bound, while the probe measures it directly (+-0.3-2 %)")
"""Why :func:`fit_blocks` keeps a probed elementwise rate (an assumed one is fitted)."""

CPU_FRACTIONS = (0.01, 1.0, (
    "an efficiency fraction of a CPU's own measured peak or bandwidth (a probed profile): "
    "physical limits, since the windows of costmodels.calibrate.BOUNDS are published GPU "
    "kernels' (FlashAttention at 30-90 % of a GPU's peak; eager CPU attention at head_dim 16 "
    "reaches 5-10 % of the bf16 GEMM peak)"))
"""Bounds of the efficiency curves fitted to blocks timed on a CPU (lo, hi, why)."""


def traced(meas: BlockMeasurements) -> bool:
    """Whether any timed point of ``meas`` carries an op trace (:mod:`costmodels.eager`)."""
    return any(t.trace is not None for e in meas.blocks for t in e.timings)


def with_eager(hw: HardwareProfile) -> HardwareProfile:
    """``hw`` with eager figures: its own, or :func:`costmodels.eager.eager_figures`'
    stated assumptions written in (so that a fit has figures to move)."""
    from costmodels.eager import eager_figures

    figs, assumed = eager_figures(hw)
    return hw.model_copy(update={"eager": figs}) if assumed else hw


def fit_blocks(meas: BlockMeasurements, hw: HardwareProfile, recipe: PrecisionRecipe,
               max_nfev: int = 60, only: Sequence[str] | None = None) -> Any:
    """Fit ``hw``'s efficiency fractions and kernel overhead to the measured blocks
    (log errors, physical bounds, :func:`costmodels.calibrate.fit_residuals`); for a table
    with op traces also the eager figures (the view overhead, the GEMM call cost of the
    table's dtype, and its elementwise bandwidth where the profile only assumed one:
    :data:`ELEMENTWISE_KEPT`). Returns its ``FitResult`` (``n`` = measured points)."""
    from costmodels.calibrate import Param, fit_residuals, parameters
    has_traces = traced(meas)
    probed_eager = hw.eager is not None  # measured by a probe, not assumed (eager_figures)
    if has_traces:
        hw = with_eager(hw)
    # the measured side in predict_points' order (its entries, then their timings)
    measured = np.array([meas.estimate(t) for e in meas.blocks
                         if e.row.get("kind", 0) != int(Kind.NOOP) for t in e.timings])
    if not measured.size:
        raise InputError("no timed blocks to fit", field="blocks")

    def residuals(h: HardwareProfile) -> np.ndarray:
        pred = np.array([c.predicted_s for c in predict_points(meas, h, recipe)])
        return np.log(pred / measured)

    # engine step / request overheads are not in a block's time; the kernel overhead is per
    # kernel of the cost model's counts, which an eager block exceeds (EAGER_KERNEL_OVERHEAD)
    lo, hi, _ = TRACED_OP_OVERHEAD if has_traces else EAGER_KERNEL_OVERHEAD
    params = [Param(p.label, p.path, lo, hi, p.curve) if p.label == "kernel overhead" else p
              for p in parameters(hw, published=True) if "engine" not in p.label]
    if meas.device_kind == "cpu":  # the windows of BOUNDS are GPU kernels' (CPU_FRACTIONS)
        flo_c, fhi_c, _ = CPU_FRACTIONS
        params = [Param(p.label, p.path, flo_c, fhi_c, True) if p.curve else p for p in params]
    if has_traces and hw.eager is not None:
        vlo, vhi, _ = VIEW_OVERHEAD
        params.append(Param("view overhead", ("eager", "view_overhead_s"), vlo, vhi, False))
        if meas.dtype in hw.eager.gemm_overhead_s:
            glo, ghi, _ = GEMM_CALL_OVERHEAD
            params.append(Param(f"GEMM call overhead {meas.dtype}",
                                ("eager", "gemm_overhead_s", meas.dtype), glo, ghi, False))
        # a probed elementwise rate is kept as measured: the blocks' elementwise bytes are
        # a few % of their time, too little to determine it (ELEMENTWISE_KEPT)
        if meas.dtype in hw.eager.elementwise_bandwidth and not probed_eager:
            flo, fhi, _ = ELEMENTWISE_RANGE
            bw = hw.memory_bandwidth.value
            params.append(Param(f"elementwise bandwidth {meas.dtype}",
                                ("eager", "elementwise_bandwidth", meas.dtype),
                                flo * bw, fhi * bw, False))
    src = (f"{measured.size} block timings on {meas.device} ({meas.device_kind}, "
           f"{meas.dtype}, torch {meas.software.get('torch', '?')}, {meas.date})")
    return fit_residuals(hw, params, residuals, int(measured.size), src, max_nfev=max_nfev,
                         only=only)


def _net(seconds: float, overhead: float) -> float:
    """A timed kernel's seconds net of the kernel overhead the cost model adds back (left
    whole when the overhead would be half of it or more: then the timing is mostly
    overhead and the net figure noise)."""
    return seconds - overhead if seconds > 2.0 * overhead else seconds


def with_gemm_curve(hw: HardwareProfile, meas: BlockMeasurements
                    ) -> tuple[HardwareProfile, str]:
    """``hw`` with the peak and matmul efficiency curve of the measured dtype taken from the
    GEMMs timed beside the blocks, and a line saying what changed ("" when nothing did).

    A profile's peak is the best rate any GEMM achieved on the device and its matmul curve
    the achieved fraction vs GEMM size (``hwprofiles.probe``); the probe times
    ``mm(A, B)`` with ``B`` row-major, while linear layers compute ``x @ W^T``. Where the
    two layouts run at different speeds (bf16 without native support on a CPU: oneDNN's
    transposed-weight path is several times faster), the curve the blocks' GEMMs follow is
    the one measured in their layout. The peak becomes the best of the profile's and the
    blocks' GEMMs (still "the best rate any GEMM achieved"); the curve becomes the blocks'
    GEMMs' fractions of it vs FLOPs, each time net of what the cost model adds back per GEMM
    (for a traced table the profile's GEMM call overhead of the dtype where it has one, else
    its kernel overhead, as the probe does). Only the timed dtype changes.

    A GEMM whose arithmetic intensity (FLOPs per byte of its operands and result) is below
    the profile's machine balance (peak FLOP/s over memory bandwidth) is bound by its bytes
    on the roofline: its FLOP rate says how fast it streamed, not what fraction of the peak
    its math reached, so it stays out of the curve and the roofline's memory term prices
    such GEMMs (a decode step's few rows: on this CPU a 1-row GEMM's rate put into the curve
    priced a 2-row one at twice its time).
    """
    if not meas.gemm or meas.dtype not in hw.peak_flops or \
            meas.dtype not in hw.efficiency.matmul:
        return hw, ""
    ovh = float(hw.kernel_overhead_s.value)
    if traced(meas):  # what price_trace adds back per GEMM
        ovh = float(gemm_call_s(hw, meas.dtype))
    a = bytes_per_element(meas.dtype)
    balance = float(hw.peak_flops[meas.dtype].value) / hw.memory_bandwidth.value

    def intensity(g: GemmTiming) -> float:
        f, b = ops.gemm(g.m, g.k, g.n, a, a)
        return float(f / b)

    compute_bound = [g for g in meas.gemm if intensity(g) >= balance]
    if not compute_bound:
        return hw, ""
    rates: dict[float, float] = {}
    for g in compute_bound:
        flops = 2.0 * g.m * g.n * g.k
        rates[flops] = max(rates.get(flops, 0.0), flops / _net(meas.estimate(g), ovh))
    cur = float(hw.peak_flops[meas.dtype].value)
    peak = max(cur, max(rates.values()))
    where = (f"measured on {meas.device} {meas.date} by puzzle-nas profile --blocks: "
             "x @ W^T (torch.nn.functional.linear, the layout of linear layers), "
             f"{meas.estimator()}, m x n x k = "
             + ", ".join(f"{g.m}x{g.n}x{g.k}" for g in compute_bound)
             + f" (the {len(meas.gemm) - len(compute_bound)} below the machine balance of "
             f"{balance:.3g} FLOP/byte left to the memory roofline)")
    data = hw.model_dump(mode="json")
    if peak > cur:
        data["peak_flops"][meas.dtype] = {
            "value": peak, "source": f"best rate of the GEMMs {where} (above the profile's "
            f"{cur:.4g} FLOP/s)"}
    data["efficiency"]["matmul"][meas.dtype] = {
        "points": [[f, min(1.0, r / peak)] for f, r in sorted(rates.items())],
        "source": f"achieved fraction of the {meas.dtype} peak vs FLOPs, {where}"}
    lo, hi = min(rates.values()), max(rates.values())
    old = hw.efficiency.matmul[meas.dtype]
    return HardwareProfile.model_validate(data), (
        f"{meas.dtype} GEMMs from the blocks' layout (x @ W^T, {len(compute_bound)} of "
        f"{len(meas.gemm)} shapes compute-bound): "
        f"peak {cur:.4g} -> {peak:.4g} FLOP/s, curve {lo / peak:.0%}-{hi / peak:.0%} of it "
        f"(the profile's curve was {min(f for _, f in old.points):.0%}-"
        f"{old.peak_fraction:.0%} of {cur:.4g})")


@dataclass
class BlockCalibration:
    """What :func:`calibrate_blocks` found: the profile to keep and how each candidate
    prices the timed blocks."""

    profile: HardwareProfile
    """The best of the three candidates by rms log error (a tie keeps the fit)."""
    written: Literal["fit", "start", "given"]
    """Which it is: the fit, the given profile with the curves timed at the blocks' shapes
    (GEMM, attention), or as given."""
    fit: Any
    """The fit's ``FitResult`` (moved figures, rms log error before and after)."""
    rms_log: dict[str, float]
    """Rms log error of each candidate (``given``, ``start``, ``fit``)."""
    gemm_note: str
    """What the curves timed at the blocks' shapes changed ("" when nothing did)."""
    before: list[Compared]
    start: list[Compared]
    after: list[Compared]
    """The timed points priced by the given profile, the start and the profile kept."""
    traced: bool = False
    """Whether the points were priced from their op traces (:mod:`costmodels.eager`)."""


def calibrate_blocks(meas: BlockMeasurements, hw: HardwareProfile, recipe: PrecisionRecipe,
                     max_nfev: int = 40, only: Sequence[str] | None = None
                     ) -> BlockCalibration:
    """Fit ``hw`` to the timed blocks (:func:`with_gemm_curve`, then :func:`fit_blocks`)
    and keep the best of the given profile, the start and the fit by the fit's own measure,
    so that a fit which raised the error is never the answer."""
    before = predict_points(meas, hw, recipe)
    start, note = with_gemm_curve(hw, meas)
    start, att_note = with_attention_curve(start, meas)
    note = "; ".join(n for n in (note, att_note) if n)
    start_pts = predict_points(meas, start, recipe) if note else before
    res = fit_blocks(meas, start, recipe, max_nfev=max_nfev, only=only)
    fit_pts = predict_points(meas, res.profile, recipe)
    cands: list[tuple[float, Literal["fit", "start", "given"], HardwareProfile,
                      list[Compared]]] = [
        (rms_log_error(fit_pts), "fit", res.profile, fit_pts),
        (rms_log_error(start_pts), "start", start, start_pts),
        (rms_log_error(before), "given", hw, before)]
    _, kept, profile, after = min(cands, key=lambda c: c[0])
    return BlockCalibration(profile, kept, res, {c[1]: c[0] for c in cands}, note, before,
                            start_pts, after, traced(meas))


def with_attention_curve(hw: HardwareProfile, meas: BlockMeasurements
                         ) -> tuple[HardwareProfile, str]:
    """``hw`` with its attention efficiency curve taken from the attention kernel timed at
    the blocks' own shapes (:class:`AttentionTiming`), and a line saying what changed (""
    when nothing was timed).

    A probe times attention at one head size (``hwprofiles.probe``: 64 on a CPU, 128 on a
    GPU), and the curve it gives is indexed by FLOPs alone; the kernel's efficiency also
    depends on the head size (on this CPU bf16 causal SDPA runs 16 GFLOP/s at head_dim 16
    and 28 at head_dim 64 for the same FLOPs), so the blocks' attention follows the curve
    measured at their shapes: the fraction of the timed dtype's peak, each time net of the
    profile's kernel overhead as the GEMM curve is (:func:`with_gemm_curve`)."""
    if not meas.attention or meas.dtype not in hw.peak_flops:
        return hw, ""
    ovh = float(hw.kernel_overhead_s.value)
    peak = float(hw.peak_flops[meas.dtype].value)
    best: dict[float, float] = {}
    for a in meas.attention:
        net = _net(meas.estimate(a), ovh)
        best[a.flops] = max(best.get(a.flops, 0.0), min(1.0, a.flops / (peak * net)))
    shapes = sorted({(a.heads, a.kv_heads, a.head_dim) for a in meas.attention})
    data = hw.model_dump(mode="json")
    data["efficiency"]["attention"] = {
        "points": [[f, max(v, 1e-4)] for f, v in sorted(best.items())],
        "source": f"achieved fraction of the {meas.dtype} peak vs FLOPs of causal "
        f"scaled_dot_product_attention at the blocks' shapes (heads/kv heads/head_dim "
        + ", ".join(f"{h}/{kv}/{d}" for h, kv, d in shapes)
        + f"), measured on {meas.device} {meas.date} by puzzle-nas profile --blocks, "
        f"{meas.estimator()}"}
    old = hw.efficiency.attention
    lo, hi = min(best.values()), max(best.values())
    return HardwareProfile.model_validate(data), (
        f"attention at the blocks' shapes ({len(meas.attention)} timings): curve "
        f"{lo:.0%}-{hi:.0%} of the {meas.dtype} peak (the profile's was "
        f"{min(f for _, f in old.points):.0%}-{old.peak_fraction:.0%})")


def recipe_for(meas: BlockMeasurements) -> PrecisionRecipe:
    """The precision recipe of what was timed: the shipped recipe of that name (``bf16``),
    else every tensor in the measured dtype (SSM state in fp32, as the torch blocks keep it)."""
    from costmodels.dtypes import RECIPES, DType

    if meas.dtype in RECIPES:
        return RECIPES[meas.dtype]
    try:
        d = DType(meas.dtype)
    except ValueError:
        raise InputError(f"unknown dtype {meas.dtype!r}", field="dtype") from None
    return PrecisionRecipe(name=meas.dtype, default=d, kv_cache=d, conv_state=d, activations=d,
                           ssm_state=DType.FP32, source="the dtype the blocks were timed in")


def fidelity_plot(before: Sequence[Compared], after: Sequence[Compared], path: str | Path,
                  title: str = "") -> None:
    """Log-log predicted vs measured block seconds, before and after a fit, one colour per
    kind, circles prefill and triangles decode (PNG)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    kinds = sorted({c.kind for c in before})
    colors = dict(zip(kinds, ("tab:blue", "tab:orange", "tab:green", "tab:red", "tab:purple",
                              "tab:brown")))
    fig, axes = plt.subplots(1, 2, figsize=(10, 4.6), squeeze=False)
    for ax, pts, name in zip(axes[0], (before, after), ("analytic (before)", "calibrated")):
        for c in pts:
            ax.scatter(c.measured_s * 1e3, c.predicted_s * 1e3, s=18,
                       marker="o" if c.point.mode == "prefill" else "^",
                       color=colors.get(c.kind, "tab:gray"))
        vals = [v * 1e3 for c in pts for v in (c.measured_s, c.predicted_s)]
        lo, hi = min(vals) / 1.5, max(vals) * 1.5
        ax.plot([lo, hi], [lo, hi], "k-", lw=0.8)
        for f in (0.85, 1.15):
            ax.plot([lo, hi], [lo * f, hi * f], "k:", lw=0.6)
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("measured block time (ms)")
        ax.set_ylabel("predicted block time (ms)")
        err = np.mean([abs(c.error) for c in pts])
        ax.set_title(f"{name}: MAPE {err:.1%} (dotted: +-15 %)")
    handles = [plt.Line2D([], [], ls="", marker="s", color=c, label=k)
               for k, c in colors.items()]
    handles += [plt.Line2D([], [], ls="", marker="o", color="gray", label="prefill"),
                plt.Line2D([], [], ls="", marker="^", color="gray", label="decode")]
    axes[0][0].legend(handles=handles, loc="upper left", fontsize=8)
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
