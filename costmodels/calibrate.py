"""Fit a hardware profile's efficiency fractions, or the serving engines' overheads, to
measurements.

A measurement is one published (or ``puzzle-nas profile``-measured) serving figure: a model
on ``tp`` GPUs of a device at a precision, a workload (isl, osl, and a concurrency, or the
engine's maximum-throughput point, or the best point under an SLO), and one of
``throughput`` (output tok/s of the whole ``tp`` group), ``ttft_s`` or ``tpot_s``. The CSV
format is :class:`Measurement` (one row each, every row with its source).

:func:`predict` prices a measurement with the serving model (``costmodels.model``,
``costmodels.serving``); :func:`fit` adjusts the profile's **physical** figures, never a
per-model or per-point factor:

* efficiency fractions (dense GEMM per compute dtype, attention math, attention KV reads,
  Mamba state I/O, grouped GEMM prefill/decode, memory streaming, link), each inside the
  physical range of :data:`BOUNDS` (all within (0, 1]);
* the MoE grouped GEMM's compute fraction vs tokens per expert (``grouped_matmul_tokens``:
  its peak scales, its shape, fitted to DeepGEMM's published tables, stays);
* the per-kernel overhead (0-10 us), the interconnect's per-collective latency (2-30 us)
  and the MoE routing imbalance under expert parallelism (1-1.5).

The serving engines' host overheads belong to the engines, not to a device:
:func:`fit_engines` fits each engine's per-step (0-10 ms) and per-request (0-10 ms)
seconds (``hwprofiles.engines``: one profile per engine) to that engine's measurements on
**every** device at once, each device at its own profile (``puzzle-nas calibrate
--engines``). A device fit (:func:`fit`) holds them fixed; a device profile has no
host-overhead figures of its own (``hwprofiles.schema.HardwareProfile`` refuses them).

The objective is the sum of squared log errors (``log(predicted / measured)``: a relative
error, symmetric in over- and under-prediction), minimized by ``scipy.optimize
.least_squares`` (trust-region reflective, which keeps every figure inside its bounds).
Figures the measurements do not constrain (zero sensitivity) keep their value and source;
each fitted figure's source becomes "fitted to N measurements from ...".
"""

from __future__ import annotations

import csv
import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from costmodels.blocks import price_blocks
from costmodels.dtypes import PrecisionRecipe, get_recipe
from costmodels.memory import DEFAULT_RESERVE_BYTES
from costmodels.model import (
    NonBlockShape,
    engine_limits,
    max_concurrency,
    price_nonblock,
    summarize,
)
from costmodels.serving import arrival_figures, parse_slo, slo_throughput
from costmodels.shapes import BlockTable
from costmodels.workload import DEFAULT_MAX_NUM_SEQS, DEFAULT_TOKEN_BUDGET, Workload
from hwprofiles.engines import find_engine
from hwprofiles.errors import InputError, first_error, require_file
from hwprofiles.schema import EngineProfile, Figure, HardwareProfile

FLOOR = 0.05
"""Lowest efficiency fraction a fitted flat (one-point) curve may reach. A curve with a
shape scales every point by the same factor, small ones included: its low end is physics
(e.g. the grouped GEMM's padding at few tokens per expert), not noise to clip."""

METRICS = ("throughput", "ttft_s", "tpot_s")


class Measurement(BaseModel):
    """One row of a measurements CSV."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    id: str = Field(min_length=1)
    split: Literal["fit", "holdout"] = "fit"
    gpu: str = Field(min_length=1, description="hardware profile name")
    model: str = Field(min_length=1, description="config name: <model>.json in a configs dir")
    precision: str = Field(min_length=1)
    tp: int = Field(ge=1)
    ep: int = Field(default=1, ge=1)
    attention_dp: bool = False
    isl: int = Field(ge=1)
    osl: int = Field(ge=1)
    concurrency: int | None = Field(default=None, ge=1,
                                    description="blank: the engine's maximum-throughput point")
    slo: str | None = None
    max_num_seqs: int | None = Field(default=None, ge=1)
    max_num_batched_tokens: int | None = Field(default=None, ge=1)
    gpu_memory_utilization: float | None = Field(default=None, gt=0, le=1)
    metric: Literal["throughput", "ttft_s", "tpot_s"]
    value: float = Field(gt=0)
    engine: str = ""
    source: str = Field(min_length=3)
    url: str = ""
    draft_tokens: int = Field(default=0, ge=0, description="speculative decoding with the "
                              "model's MTP head: draft tokens per step (blank / 0: none)")
    acceptance: float | None = Field(default=None, ge=1, description="mean accepted tokens "
                                     "per verification step (with draft_tokens)")
    arrival: Literal["closed", "staggered", "poisson"] = Field(
        default="closed", description="how the benchmark's requests arrive "
        "(costmodels.workload.Workload.arrival; blank: closed)")
    rate: float | None = Field(default=None, gt=0, description="requests/s (arrival poisson)")
    requests: int | None = Field(default=None, ge=1, description="requests in the benchmark "
                                 "run (staggered: its first `concurrency` arrive together)")

    @field_validator("concurrency", "slo", "max_num_seqs", "max_num_batched_tokens",
                     "gpu_memory_utilization", "acceptance", "rate", "requests",
                     mode="before")
    @classmethod
    def _blank(cls, v: object) -> object:
        return None if v == "" else v

    @model_validator(mode="before")
    @classmethod
    def _spec_defaults(cls, data: object) -> object:
        if isinstance(data, dict) and data.get("draft_tokens") in ("", None):
            data = {**data, "draft_tokens": 0}
        if isinstance(data, dict) and data.get("arrival") in ("", None):
            data = {**data, "arrival": "closed"}
        return data

    @model_validator(mode="after")
    def _spec(self) -> Measurement:
        if self.draft_tokens and self.acceptance is None:
            raise ValueError("draft_tokens needs an acceptance (mean accepted tokens per step)")
        if self.acceptance is not None and not self.draft_tokens:
            raise ValueError("acceptance needs draft_tokens > 0")
        if self.acceptance is not None and self.acceptance > self.draft_tokens + 1:
            raise ValueError(f"acceptance {self.acceptance} exceeds draft_tokens + 1")
        return self

    @property
    def regime(self) -> str:
        return {"throughput": "throughput", "ttft_s": "TTFT", "tpot_s": "TPOT"}[self.metric]


def load_measurements(path: str | Path) -> list[Measurement]:
    """Read a measurements CSV; a bad row is one line naming the file, row and field.
    Lines starting with ``#`` before the header are comments (e.g. how the split was chosen)."""
    p = require_file(path)
    out: list[Measurement] = []
    with open(p, newline="") as f:
        lines = f.readlines()
    skip = 0
    while skip < len(lines) and lines[skip].startswith("#"):
        skip += 1
    reader = csv.DictReader(lines[skip:])
    if reader.fieldnames is None:
        raise InputError("empty file; expected a CSV header", path=str(p))
    for n, row in enumerate(reader, start=skip + 2):
        try:
            out.append(Measurement.model_validate(row))
        except ValidationError as exc:
            loc, msg = first_error(exc, "(row)")
            raise InputError(f"row {n}: {msg}", path=str(p), field=loc) from None
    if not out:
        raise InputError("no measurements", path=str(p))
    return out


@dataclass
class ModelShape:
    """What ``costmodels`` needs of a model: its block table (MTP rows flagged as draft)
    and its non-block shape."""

    table: BlockTable
    nonblock: NonBlockShape
    mtp_table: BlockTable | None = None
    """The MTP head's rows (its blocks and the ``2h -> h`` projection), priced as draft rows
    for measurements taken with speculative decoding (``draft_tokens > 0``)."""

    def with_mtp_head(self) -> tuple[BlockTable, np.ndarray]:
        """The main rows followed by the MTP head's and the ``draft`` mask ``price_blocks``
        takes (True on the head's rows); the model must have a head (:attr:`mtp_table`)."""
        assert self.mtp_table is not None
        draft = np.r_[np.zeros(len(self.table), bool), np.ones(len(self.mtp_table), bool)]
        return BlockTable.concat([self.table, self.mtp_table]), draft


def _reserve(m: Measurement, hw: HardwareProfile) -> float:
    if m.gpu_memory_utilization is None:
        return DEFAULT_RESERVE_BYTES
    return (1.0 - m.gpu_memory_utilization) * hw.memory_bytes.value


Engines = dict[str, EngineProfile] | None
"""Engine profiles by name that take precedence over the shipped ones (``None``: shipped)."""


def predict(m: Measurement, shape: ModelShape, hw: HardwareProfile,
            recipe: PrecisionRecipe | None = None, engines: Engines = None,
            cache: dict | None = None) -> float:
    """The serving model's figure for measurement ``m`` (same unit as ``m.value``), with
    the overheads of the engine ``m.engine`` names (``engines`` first, then shipped).
    ``cache``: a dict that keeps ``m``'s priced blocks on ``hw`` between calls (for fits
    that move only the engines' figures, which no block's price depends on)."""

    def blocks(tag: str, *a, **k):  # noqa: ANN002, ANN003, ANN202
        if cache is None:
            return price_blocks(*a, **k)
        key = (m.id, id(hw), tag)
        if key not in cache:
            cache[key] = price_blocks(*a, **k)
        return cache[key]

    recipe = recipe or get_recipe(m.precision)
    eng = m.engine or None
    kw: dict[str, Any] = dict(tp=m.tp, ep=m.ep if m.ep in (1, m.tp) else 1, attention_dp=m.attention_dp)
    lim = engine_limits(hw, eng, engines)  # the engine's own defaults on this device
    base: dict[str, Any] = dict(isl=m.isl, osl=m.osl, concurrency=m.concurrency or 1,
                max_num_seqs=m.max_num_seqs or lim.get("max_num_seqs", DEFAULT_MAX_NUM_SEQS),
                max_num_batched_tokens=m.max_num_batched_tokens
                or lim.get("max_num_batched_tokens", DEFAULT_TOKEN_BUDGET),
                mixed_prefill=lim.get("mixed_prefill", True))
    table, draft = shape.table, None
    if m.draft_tokens:  # speculative decoding with the MTP head (draft rows)
        if shape.mtp_table is None:
            raise InputError(f"measurement {m.id}: {m.model} has no MTP head to draft with",
                             field="draft_tokens")
        table, draft = shape.with_mtp_head()
        base.update(draft_tokens=m.draft_tokens, acceptance=m.acceptance)
        kw["draft"] = draft
    if m.arrival != "closed":
        base.update(arrival=m.arrival, rate=m.rate, requests=m.requests)
    wl = Workload(**base)
    reserve = _reserve(m, hw)
    if m.arrival != "closed" and not m.slo:
        pt = arrival_figures(table, shape.nonblock, hw, recipe, wl, engine=eng,
                             engines=engines, **kw)
        if m.metric == "throughput":
            return float(pt.throughput_tok_s * m.tp)
        return float(pt.ttft_s if m.metric == "ttft_s" else pt.tpot_s)
    if m.slo:  # priced for the row's engine as the other rows are (overlap included)
        spt = slo_throughput(table, shape.nonblock, hw, recipe, wl, parse_slo(m.slo),
                             reserve_bytes=reserve, engine=eng, engines=engines, **kw)
        return spt.throughput_node_tok_s if m.tp == hw.gpus_per_node.value else \
            spt.throughput_tok_s * m.tp
    if m.concurrency is None:  # the maximum-throughput point: the most that fit
        b1 = blocks("cap", table, hw, recipe, [wl], engine=eng, **kw)
        nb1 = price_nonblock(shape.nonblock, hw, recipe, [wl], tp=m.tp,
                             attention_dp=m.attention_dp, engine=eng, engines=engines,
                             draft=draft is not None)
        cap = max_concurrency(b1, nb1, hw, wl.max_context, reserve_bytes=reserve, workload=wl)
        wl = wl.with_sequences(max(1, min(cap.max_concurrency, wl.max_num_seqs)))
    b = blocks("main", table, hw, recipe, [wl], engine=eng, **kw)
    nb = price_nonblock(shape.nonblock, hw, recipe, [wl], tp=m.tp, attention_dp=m.attention_dp,
                        engine=eng, engines=engines, draft=draft is not None)
    s = summarize(b, nb, hw, reserve_bytes=reserve)
    if m.metric == "throughput":
        return float(s.throughput_tok_s[0] * m.tp)
    return float(s.ttft_s[0] if m.metric == "ttft_s" else s.tpot_s[0])


# -- the fitted figures -----------------------------------------------------------------

@dataclass(frozen=True)
class Param:
    """One fittable figure: a path into the profile JSON, bounds, and a label."""

    label: str
    path: tuple[str, ...]
    lo: float
    hi: float
    curve: bool  # an EfficiencyCurve (scale its points) or a Figure (set its value)


BOUNDS: dict[str, tuple[float, float, str]] = {
    "matmul": (0.40, 0.95, "dense GEMM: 40-95 % of peak (mamf-finder measures 80 % of BF16 "
               "peak on H100 SXM and 78 % on B200 at large sizes, Bekman's Machine Learning "
               "Engineering MAMF table https://github.com/stas00/ml-engineering/tree/master/"
               "compute/accelerator; small serving GEMMs fall lower)"),
    "attention": (0.30, 0.90, "flash attention: FlashAttention-3 reaches 75 % of BF16 peak "
                  "on H100 (Shah et al. 2024, https://arxiv.org/abs/2407.08608)"),
    "attention_decode": (0.40, 0.95, "KV-cache streaming: a fraction of HBM bandwidth"),
    "ssm_state": (0.40, 0.95, "Mamba state streaming: a fraction of HBM bandwidth"),
    "grouped_matmul_prefill": (0.20, 0.90, "MoE grouped GEMM: 55-66 % of FP8 peak in "
                               "DeepGEMM's contiguous-layout table on H800 "
                               "(https://github.com/deepseek-ai/DeepGEMM)"),
    "grouped_matmul_decode": (0.20, 0.95, "MoE grouped GEMM weight streaming: 41-62 % of FP8 "
                              "peak in DeepGEMM's masked-layout table on H800 "
                              "(https://github.com/deepseek-ai/DeepGEMM)"),
    "grouped_matmul_tokens": (0.20, 0.90, "MoE grouped GEMM at many tokens per expert: 70.5 % "
                              "of FP8 peak, the peak of the fit M/(M+91) * K/(K+637) to "
                              "DeepGEMM's H800 tables (https://github.com/deepseek-ai/DeepGEMM)"),
    "memory": (0.50, 0.95, "HBM streaming: NVIDIA AIConfigurator prices memory-bound ops at "
               "0.8x of HBM bandwidth (https://github.com/ai-dynamo/aiconfigurator)"),
    "link": (0.40, 0.95, "NVLink: a fraction of the per-direction link rate"),
}
"""Physical bounds per efficiency (lo, hi, why): no fit may leave them."""

LINK_LATENCY_BOUNDS = (2e-6, 30e-6, "fixed seconds of one collective (all-reduce, all-to-all) "
                       "inside a node: at least a kernel launch and one NVLink/NVSwitch round "
                       "trip (a few us), at most a small-message ring over 8 GPUs (tens of us)")
"""Bounds of the interconnect's per-collective latency (lo, hi, why), seconds."""


MIN_ENGINE_ROWS = 10
"""An engine's figures are fitted only from at least this many rows (of any devices) ..."""

MIN_ENGINE_MODELS = 2
"""... covering at least this many models: fewer rows (vLLM's 3-4 rows of one model gave a
2.8 ms step that its own published 2.9 ms TPOTs contradict) fit the model's error, not the
engine. An engine below either count ships no fitted figure (its profile says so)."""

ENGINE_BOUNDS: dict[str, tuple[float, float, str]] = {
    "step_overhead_s": (0.0, 10e-3, "host seconds per engine step (scheduling, input "
                        "preparation, sampling bookkeeping): 0 to 10 ms, the CPU share of a "
                        "step an unoptimized engine reaches (SGLang v0.4 blog: 'as much as half "
                        "of its time on CPU overhead' at steps of a few to tens of ms)"),
    "request_overhead_s": (0.0, 10e-3, "host seconds per request (admission, tokenization, "
                           "retirement): 0 to 10 ms"),
    "request_latency_s": (0.0, 0.2, "front-end seconds before a first token reaches the "
                          "client (HTTP, tokenization, the hops between the front end's "
                          "processes, detokenization): 0 to 200 ms, at most the time an "
                          "OpenAI-compatible server's own request path takes on a loaded host"),
}
"""Bounds of the fitted engine overheads (lo, hi, why), seconds."""


def is_published(source: str) -> bool:
    """Whether a figure's source is published (``published measured fraction: ...`` of
    that device, or ``published: ...``, a figure a public source gives): such a figure is
    physics the fit must not move. A BF16 and an FP16 GEMM run on the same tensor cores at
    the same peak, so where the device's FP16 (or BF16) GEMM fraction is measured, the other
    is that measurement too, never a fit; HBM streaming is one published fraction
    (AIConfigurator's 0.8) where the serving rows cannot pin it (their rms log error moves
    by 3 % from 0.75 to 0.95 on H100 and H200)."""
    return source.startswith("published")


def parameters(hw: HardwareProfile, published: bool = False) -> list[Param]:
    """The figures :func:`fit` may move on ``hw``, with bounds (the device's own: the
    engines' overheads are :func:`fit_engines`'s). GEMM fractions that are published
    measurements of this device (:func:`is_published`) are left out of a fit to serving
    figures; ``published``: keep them (a fit to this very device's timed blocks,
    ``costmodels.measured.fit_blocks``, is a measurement of them too)."""
    lo, hi, _ = BOUNDS["matmul"]
    out = [Param(f"matmul {d}", ("efficiency", "matmul", d), lo, hi, True)
           for d, c in hw.efficiency.matmul.items() if published or not is_published(c.source)]
    for key in ("attention", "attention_decode", "ssm_state", "grouped_matmul_prefill",
                "grouped_matmul_decode", "memory", "link"):
        cur = getattr(hw.efficiency, key)
        if cur is not None and is_published(cur.source) and not published:
            continue
        lo, hi, _ = BOUNDS[key]
        out.append(Param(key.replace("_", " "), ("efficiency", key), lo, hi, True))
    if hw.efficiency.grouped_matmul_tokens is not None:  # its peak scales; the shape stays
        lo, hi, _ = BOUNDS["grouped_matmul_tokens"]
        out.append(Param("grouped matmul tokens", ("efficiency", "grouped_matmul_tokens"),
                         lo, hi, True))
    out.append(Param("kernel overhead", ("kernel_overhead_s",), 0.0, 10e-6, False))
    lo, hi, _ = LINK_LATENCY_BOUNDS
    out.append(Param("link latency", ("interconnect", "latency"), lo, hi, False))
    out.append(Param("MoE routing imbalance", ("moe_imbalance",), 1.0, 1.5, False))
    return out


def _get(data: dict, p: Param) -> float:
    node: Any = data
    for k in p.path:
        node = node.get(k) if isinstance(node, dict) else None
        if node is None:
            break
    if node is None:
        if p.curve:  # an optional curve not in the profile: its fallback, the memory curve
            return float(data["efficiency"]["memory"]["points"][-1][1])
        return p.lo
    if p.curve:
        return float(max(f for _, f in node["points"]))
    return float(node["value"])


SHAPE_NOTE = "; curve shape (scaled to the fitted peak) from: "


def _set(data: dict, p: Param, value: float, source: str) -> None:
    parent = data
    for k in p.path[:-1]:
        parent = parent.setdefault(k, {})
    key = p.path[-1]
    if p.curve:
        cur = parent.get(key)
        if cur is None:
            parent[key] = {"points": [[1.0, value]], "source": source}
            return
        peak = max(f for _, f in cur["points"])
        lo = FLOOR if len(cur["points"]) == 1 else 0.0
        pts = [[s, min(1.0, max(lo, f * value / peak))] for s, f in cur["points"]]
        if len(pts) > 1:  # the fit moved the peak; the shape keeps its own source
            shape = cur["source"].split(SHAPE_NOTE, 1)[-1]
            source = f"{source}{SHAPE_NOTE}{shape}"
        parent[key] = {"points": pts, "source": source}
    else:
        parent[key] = {"value": value, "source": source}


def with_values(hw: HardwareProfile, params: Sequence[Param],
                values: Sequence[float] | np.ndarray,
                source: str = "calibration trial") -> HardwareProfile:
    """``hw`` with ``params`` set to ``values`` (curves are scaled to the new peak)."""
    data = hw.model_dump(mode="json")
    for p, v in zip(params, values):
        _set(data, p, float(v), source)
    return HardwareProfile.model_validate(data)


def _round(v: float) -> float:
    """4 significant digits (a fitted figure claims no more); below 1e-9 is 0."""
    return 0.0 if abs(v) < 1e-9 else float(f"{v:.4g}")


@dataclass
class FitResult:
    """A fitted profile and what moved."""

    profile: HardwareProfile
    n: int
    moved: list[tuple[str, float, float]] = field(default_factory=list)
    rms_log_before: float = 0.0
    rms_log_after: float = 0.0
    on_bounds: list[tuple[str, float, float, float]] = field(default_factory=list)
    """``(figure, value, lo, hi)`` of each fitted figure that ended on a bound of its fit."""


def _log_error(predicted: float, measured: float) -> float:
    """``log(predicted / measured)``; a prediction of 0 (e.g. no concurrency meets an SLO)
    counts as a millionth of the measurement: a large, finite error."""
    return math.log(max(predicted, 1e-6 * measured) / measured)


def _residuals(ms: Sequence[Measurement], shapes: Callable[[str], ModelShape],
               hw: HardwareProfile, engines: Engines = None) -> np.ndarray:
    return np.array([_log_error(predict(m, shapes(m.model), hw, engines=engines), m.value)
                     for m in ms])


def _label(ms: Sequence[Measurement]) -> str:
    return "; ".join(sorted({m.source.split(",")[0].split(" (")[0] for m in ms}))


def _check_engines(ms: Sequence[Measurement], engines: Engines) -> None:
    for m in ms:
        if m.engine and find_engine(m.engine, engines) is None:
            raise InputError(f"row {m.id}: no engine profile named {m.engine!r}", field="engine")


def fit(measurements: Iterable[Measurement], hw: HardwareProfile,
        shapes: Callable[[str], ModelShape], sources: str | None = None,
        max_nfev: int = 60, only: Sequence[str] | None = None,
        engines: Engines = None) -> FitResult:
    """Fit ``hw``'s figures to the measurements taken on it (``m.gpu`` names ``hw`` or one
    of its aliases), each row priced with its engine's profile (``engines`` first, then the
    shipped ones; held fixed); ``only``: the labels of :func:`parameters` to fit (default
    all that the measurements constrain). Raises :class:`InputError` when there are
    no rows for ``hw`` or a row's engine has no profile."""
    names = {hw.name, *hw.aliases}
    ms = [m for m in measurements if m.gpu in names]
    if not ms:
        raise InputError(f"no measurements for device {hw.name!r}", field="gpu")
    _check_engines(ms, engines)
    label = sources or _label(ms)
    # published figures stay out unless ``only`` names them (an explicit request to fit one)
    return fit_residuals(hw, parameters(hw, published=only is not None),
                         lambda p: _residuals(ms, shapes, p, engines),
                         len(ms), f"{len(ms)} measurements from {label}", max_nfev=max_nfev,
                         only=only)


@dataclass
class EngineFitResult:
    """Fitted engine profiles (by name) and what moved."""

    engines: dict[str, EngineProfile]
    n: int
    moved: list[tuple[str, float, float]] = field(default_factory=list)
    rms_log_before: float = 0.0
    rms_log_after: float = 0.0
    on_bounds: list[tuple[str, float, float, float]] = field(default_factory=list)
    """``(figure, value, lo, hi)`` of each fitted figure that ended on a bound of its fit."""


def fit_engines(measurements: Iterable[Measurement],
                profiles: Callable[[str], HardwareProfile],
                shapes: Callable[[str], ModelShape], engines: Engines = None,
                max_nfev: int = 60) -> EngineFitResult:
    """Fit every engine's per-step and per-request overheads (:data:`ENGINE_BOUNDS`) to the
    rows that name it, on all devices at once (each row at ``profiles(m.gpu)``, held
    fixed): the overheads belong to the engine, not to a GPU. Engines with fewer than
    :data:`MIN_ENGINE_ROWS` rows, and figures no row is sensitive to, keep their value and
    source. The objective is :func:`fit`'s (squared log errors, bounded least squares);
    rows without an engine are left out. ``engines``: starting profiles by name (default:
    the shipped ones)."""
    from scipy.optimize import least_squares

    ms = [m for m in measurements if m.engine]
    _check_engines(ms, engines)
    start: dict[str, EngineProfile] = {}
    by: dict[str, list[Measurement]] = {}
    for m in ms:
        e = find_engine(m.engine, engines)
        assert e is not None
        start[e.name] = e
        by.setdefault(e.name, []).append(m)
    names = sorted(n for n, rows in by.items() if len(rows) >= MIN_ENGINE_ROWS
                   and len({m.model for m in rows}) >= MIN_ENGINE_MODELS)
    if not names:
        raise InputError(f"no engine has {MIN_ENGINE_ROWS} or more rows over "
                         f"{MIN_ENGINE_MODELS} or more models", field="engine")
    rows = [m for n in names for m in by[n]]
    keys = list(ENGINE_BOUNDS)
    # a figure whose source says "not fitted" is held (its profile says why)
    params = [(n, k) for n in names for k in keys
              if not getattr(start[n], k).source.startswith("not fitted")]
    x0 = np.array([getattr(start[n], k).value for n, k in params])

    def built(x: np.ndarray) -> dict[str, EngineProfile]:
        """The engine profiles with figures ``x`` (their sources kept: a trial point)."""
        out = dict(start)
        for n in names:
            upd = {k: Figure(value=float(v), source=getattr(start[n], k).source)
                   for (pn, k), v in zip(params, x) if pn == n}
            out[n] = start[n].model_copy(update=upd)
        return out

    memo: dict = {}

    def resid(x: np.ndarray, sub: Sequence[Measurement] = rows) -> np.ndarray:
        pool = built(x)
        return np.array([_log_error(predict(m, shapes(m.model), profiles(m.gpu),
                                            engines=pool, cache=memo), m.value) for m in sub])

    r0 = resid(x0)
    # an overlapped step overhead is flat (hidden) below the GPU step time: probe the whole
    # range, and start each figure at the best point of a coarse scan over its bounds (one
    # coordinate pass on its engine's rows), so least squares does not start on a plateau
    def upper(n: str, k: str) -> float:
        """A figure's upper bound: :data:`ENGINE_BOUNDS`', and for the step overhead the
        engine's shortest published step (``EngineProfile.min_step_s``) when it has one."""
        hi = ENGINE_BOUNDS[k][1]
        step = start[n].min_step_s if k == "step_overhead_s" else None
        if step is not None:
            hi = min(hi, step.value)
        return hi

    active: list[int] = []
    xs = x0.copy()  # the starting figures, for "moved"
    for _ in range(2):  # two coordinate passes: a figure scanned first sees the others' best
        for i, (n, k) in enumerate(params):
            lo_k, hi_k = ENGINE_BOUNDS[k][0], upper(n, k)
            sub = by[n]
            base = resid(x0, sub)
            trials = []
            for f in np.linspace(0.0, 1.0, 21):  # 5 % steps: an overlapped step overhead
                x = x0.copy()                     # shows only in a narrow band above the GPU
                x[i] = lo_k + f * (hi_k - lo_k)
                r = resid(x, sub)
                trials.append((float(np.sum(r ** 2)), x[i], float(np.max(np.abs(r - base)))))
            if max(t[2] for t in trials) > 1e-6:
                if i not in active:
                    active.append(i)
                best = min(trials)
                # the front-end latency is additive and smooth: least squares starts from its
                # value (a coarse jump there trades against a plateaued step overhead)
                if best[0] < float(np.sum(base ** 2)) and k != "request_latency_s":
                    x0[i] = best[1]
    active.sort()
    rms0 = float(np.sqrt(np.mean(r0 ** 2)))
    if not active:
        return EngineFitResult({n: start[n] for n in names}, len(rows), [], rms0, rms0)
    lo = np.array([ENGINE_BOUNDS[params[i][1]][0] for i in active])
    hi = np.array([upper(*params[i]) for i in active])
    scale = hi - lo
    x0[active] = np.minimum(x0[active], hi)

    def full(z: np.ndarray) -> np.ndarray:
        x = x0.copy()
        x[active] = lo + z * scale
        return x

    z0 = np.clip((x0[active] - lo) / scale, 0.0, 1.0)
    sol = least_squares(lambda z: resid(full(z)), z0, bounds=(0.0, 1.0), diff_step=1e-3,
                        max_nfev=max_nfev, x_scale=1.0)
    xb = x0.copy()
    xb[active] = [_round(v) for v in lo + sol.x * scale]
    out: dict[str, EngineProfile] = {}
    for n in names:
        idx = [i for i in active if params[i][0] == n]
        if not idx:
            out[n] = start[n]
            continue
        mine = by[n]
        gpus = ", ".join(sorted({m.gpu for m in mine}))
        src = (f"fitted to {len(mine)} measurements of {n} on {gpus} from {_label(mine)}, "
               "each device at its own profile (puzzle-nas calibrate --engines)")
        upd = {params[i][1]: Figure(value=float(xb[i]), source=src) for i in idx}
        out[n] = start[n].model_copy(update=upd)
    moved = [(f"{params[i][0]} {params[i][1].replace('_s', '').replace('_', ' ')}",
              float(xs[i]), float(xb[i])) for i in active
             if not math.isclose(xb[i], xs[i], rel_tol=1e-6)]
    r1 = resid(xb)
    return EngineFitResult(out, len(rows), moved, rms0, float(np.sqrt(np.mean(r1 ** 2))))


def _probe_value(p: Param, x0: float) -> float:
    """Where the sensitivity probe moves ``p`` from ``x0``: 10 % down for a curve's scale
    (10 % of the range up for a scalar), or the other way when that step would leave the
    bounds, so a figure sitting on a bound is still probed (and stays fittable)."""
    if p.curve:
        return 0.9 * x0 if 0.9 * x0 >= p.lo else min(p.hi, x0 / 0.9)
    step = 0.1 * (p.hi - p.lo)
    return x0 + step if x0 + step <= p.hi else max(p.lo, x0 - step)


def fit_residuals(hw: HardwareProfile, params: Sequence[Param],
                  residuals: Callable[[HardwareProfile], np.ndarray], n: int, label: str,
                  max_nfev: int = 60, only: Sequence[str] | None = None) -> FitResult:
    """Fit ``params`` of ``hw`` to any log-error residuals (``residuals(profile)`` returns
    ``log(predicted / measured)`` per point): the same bounded least squares, sensitivity
    probe and 4-digit rounding as :func:`fit`, for measurements that are not serving figures
    (``costmodels.measured.fit_blocks``: timed blocks). ``n``: points; ``label``: where
    they come from (each fitted figure's source says "fitted to <label>")."""
    from scipy.optimize import least_squares

    if only is not None:
        unknown = sorted(set(only) - {p.label for p in params})
        if unknown:
            raise InputError(f"unknown figure(s) {unknown}; expected some of "
                             f"{[p.label for p in params]}", field="only")
    x0 = np.array([_get(hw.model_dump(mode="json"), p) for p in params])
    r0 = residuals(hw)
    active = []
    for i, p in enumerate(params):
        if only is not None and p.label not in only:
            continue
        v = _probe_value(p, float(x0[i]))
        if np.max(np.abs(residuals(with_values(hw, [p], [v])) - r0)) > 1e-6:
            active.append(i)
    rms0 = float(np.sqrt(np.mean(r0 ** 2)))
    if not active:
        return FitResult(hw, n, [], rms0, rms0)
    ap = [params[i] for i in active]
    lo = np.array([p.lo for p in ap])
    hi = np.array([p.hi for p in ap])
    scale = np.maximum(hi - lo, 1e-12)
    z0 = np.clip((x0[active] - lo) / scale, 0.0, 1.0)
    sol = least_squares(lambda z: residuals(with_values(hw, ap, lo + z * scale)), z0,
                        bounds=(0.0, 1.0), diff_step=1e-3, max_nfev=max_nfev, x_scale=1.0)
    xbest = x0.copy()
    xbest[active] = [_round(v) for v in lo + sol.x * scale]
    fitted = with_values(hw, ap, xbest[active], f"fitted to {label} (puzzle-nas calibrate)")
    moved = [(params[i].label, float(x0[i]), float(xbest[i])) for i in active
             if not math.isclose(xbest[i], x0[i], rel_tol=1e-6)]
    r1 = residuals(fitted)
    edge = [(params[i].label, float(xbest[i]), float(lo[j]), float(hi[j]))
            for j, i in enumerate(active) if min(sol.x[j], 1.0 - sol.x[j]) <= 1e-6]
    return FitResult(fitted, n, moved, rms0, float(np.sqrt(np.mean(r1 ** 2))), edge)


# -- the report ---------------------------------------------------------------------------

@dataclass
class Scored:
    """A measurement with its prediction."""

    m: Measurement
    predicted: float

    @property
    def error(self) -> float:
        """Signed relative error ``predicted / measured - 1``."""
        return self.predicted / self.m.value - 1.0


def score(measurements: Iterable[Measurement], shapes: Callable[[str], ModelShape],
          profiles: Callable[[str], HardwareProfile], engines: Engines = None) -> list[Scored]:
    """Predict every measurement with the profile its ``gpu`` names and its engine's
    profile (``engines`` first, then the shipped ones)."""
    return [Scored(m, predict(m, shapes(m.model), profiles(m.gpu), engines=engines))
            for m in measurements]


def mape_table(scored: Sequence[Scored]) -> list[dict]:
    """Rows ``{split, gpu, regime, n, mape, bias}`` (mean |error| and mean error, as
    fractions), per split x GPU x regime, then per split x regime and per split (``all``)."""
    rows = []
    keys: list[tuple[str, str, str]] = []
    for s in scored:
        for k in ((s.m.split, s.m.gpu, s.m.regime), (s.m.split, "all", s.m.regime),
                  (s.m.split, "all", "all")):
            if k not in keys:
                keys.append(k)
    keys.sort(key=lambda k: (k[0], k[1] == "all", k[1], k[2] == "all", k[2]))
    for split, gpu, regime in keys:
        errs = np.array([s.error for s in scored if s.m.split == split
                         and gpu in ("all", s.m.gpu) and regime in ("all", s.m.regime)])
        rows.append({"split": split, "gpu": gpu, "regime": regime, "n": int(errs.size),
                     "mape": float(np.mean(np.abs(errs))), "bias": float(np.mean(errs))})
    return rows


def format_table(rows: Sequence[dict]) -> str:
    lines = [f"{'split':<8} {'gpu':<10} {'regime':<11} {'n':>4} {'MAPE':>7} {'bias':>7}"]
    for r in rows:
        lines.append(f"{r['split']:<8} {r['gpu']:<10} {r['regime']:<11} {r['n']:>4} "
                     f"{r['mape']:>6.1%} {r['bias']:>+6.1%}")
    return "\n".join(lines)


def fidelity_plot(scored: Sequence[Scored], path: str | Path) -> None:
    """Log-log scatter of predicted vs measured, one panel per regime (PNG)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    regimes = [r for r in ("throughput", "TTFT", "TPOT") if any(s.m.regime == r for s in scored)]
    fig, axes = plt.subplots(1, len(regimes), figsize=(5 * len(regimes), 4.6), squeeze=False)
    colors = {"h100-sxm": "tab:blue", "h200-sxm": "tab:orange", "b200": "tab:green"}
    for ax, reg in zip(axes[0], regimes):
        pts = [s for s in scored if s.m.regime == reg]
        for s in pts:
            ax.scatter(s.m.value, s.predicted, s=22, marker="o" if s.m.split == "fit" else "^",
                       color=colors.get(s.m.gpu, "tab:gray"),
                       edgecolors="black" if s.m.split == "holdout" else "none", linewidths=0.6)
        vals = [v for s in pts for v in (s.m.value, s.predicted)]
        lo, hi = min(vals) / 1.5, max(vals) * 1.5
        ax.plot([lo, hi], [lo, hi], "k-", lw=0.8)
        for f in (0.85, 1.15):
            ax.plot([lo, hi], [lo * f, hi * f], "k:", lw=0.6)
        ax.set_xscale("log")
        ax.set_yscale("log")
        unit = "tok/s" if reg == "throughput" else "s"
        ax.set_xlabel(f"measured {reg} ({unit})")
        ax.set_ylabel(f"predicted {reg} ({unit})")
        ax.set_title(f"{reg}: {len(pts)} points (dotted: +-15 %)")
    handles = [plt.Line2D([], [], ls="", marker="o", color=c, label=g) for g, c in colors.items()]
    handles += [plt.Line2D([], [], ls="", marker="^", color="white", markeredgecolor="black",
                           label="hold-out")]
    axes[0][0].legend(handles=handles, loc="upper left", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
