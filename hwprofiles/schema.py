"""The schema of a hardware profile: what one accelerator can do, each number with its source.

Units inside: bytes, bytes/s, FLOP/s, seconds. Every number is a :class:`Figure`
(``{"value": ..., "source": ...}``) so that a profile can never hold a figure without
saying where it came from (a datasheet, paper or benchmark URL, ``"fitted to ..."``,
``"measured on <device> <date>"``, or ``"assumed ..."`` when no public source gives it:
:meth:`HardwareProfile.assumed_figures` lists those).

Efficiency curves give the achieved fraction of peak as a function of op size
(FLOPs for compute curves, bytes for memory/link curves): a list of ``[size, fraction]``
points interpolated linearly in ``log(size)`` and held flat beyond the ends. A curve with
one point is a constant, which is what the shipped profiles use (published large-op
fractions; the small-op penalty is carried by ``kernel_overhead_s``).
"""

from __future__ import annotations

import math
import re

import numpy as np
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SerializerFunctionWrapHandler,
    field_validator,
    model_serializer,
    model_validator,
)
from pydantic_core import PydanticCustomError

from hwprofiles.units import gb_gib

# Compute dtypes a profile may list a peak for (the values of ``costmodels.dtypes.DType``
# except fp32, which no cost here computes in).
COMPUTE_DTYPES = ("bf16", "fp16", "fp8", "int8", "nvfp4", "mxfp4")

_ASSUMED = re.compile(r"\bassumed\b", re.IGNORECASE)


def is_assumed(source: str) -> bool:
    """Whether a source admits the figure is an assumption (the word "assumed"), not a
    datasheet, paper, benchmark, fit or measurement of this device."""
    return bool(_ASSUMED.search(source))


ON_BOUND_PATTERN = r"^(floor|open): .{10,}"
"""An ``on_bound`` note: ``floor: <why>`` (the bound is physics, the figure can go no
further) or ``open: <what>`` (structural error the bound hides, still to model)."""


class _OnBound(BaseModel):
    """A fitted figure's ``on_bound`` note: why it sits on a bound of its fit (within 1 % of
    the bound's range; ``costmodels.calibrate.parameters`` / ``ENGINE_BOUNDS``). A refit
    writes the figure without it, so a figure that lands on a bound again is reviewed
    before it ships (``tests/test_hwprofiles.py``). Left out of the JSON when unset."""

    on_bound: str | None = Field(default=None, pattern=ON_BOUND_PATTERN)

    @model_serializer(mode="wrap")
    def _drop_unset_note(self, handler: SerializerFunctionWrapHandler) -> dict:
        out = handler(self)
        if isinstance(out, dict):
            note = out.pop("on_bound", None)
            if note is not None:  # after the figure and its source
                out["on_bound"] = note
        return out


class Figure(_OnBound):
    """A number and where it came from."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    value: float
    source: str = Field(min_length=3)

    @field_validator("value")
    @classmethod
    def _finite_nonneg(cls, v: float) -> float:
        if not math.isfinite(v) or v < 0:
            raise ValueError("must be a finite number >= 0")
        return v


class EfficiencyCurve(_OnBound):
    """Achieved fraction of peak vs op size; ``points`` are ``[size, fraction]`` pairs."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    points: list[tuple[float, float]] = Field(min_length=1)
    source: str = Field(min_length=3)

    @field_validator("points")
    @classmethod
    def _check(cls, pts: list[tuple[float, float]]) -> list[tuple[float, float]]:
        sizes = [p[0] for p in pts]
        if any(s <= 0 for s in sizes) or sizes != sorted(sizes) or len(set(sizes)) != len(sizes):
            raise ValueError("sizes must be > 0 and strictly increasing")
        if any(not (0.0 < f <= 1.0) for _, f in pts):
            raise ValueError("fractions must be in (0, 1]")
        return pts

    @property
    def is_constant(self) -> bool:
        return len(self.points) == 1

    @property
    def peak_fraction(self) -> float:
        """The curve's largest fraction (its value for large ops)."""
        return max(f for _, f in self.points)

    def at(self, size: float | np.ndarray) -> float | np.ndarray:
        """Fraction of peak achieved by an op of ``size`` (FLOPs, bytes, or tokens per expert
        for the grouped-GEMM curve); vectorized.

        Between two points the fraction follows a power law (linear in log-log), flat beyond
        the ends. With it, an op's time ``size / fraction`` is monotone between points exactly
        when it is at the points: a curve whose points say "a bigger op never takes less
        time" keeps saying so everywhere. (Interpolating the fraction linearly in log size
        breaks that on steep stretches: a grouped GEMM with 1.5 tokens per expert came out
        faster than one with 1, so a higher top-k could price cheaper.)
        """
        if self.is_constant:
            f = self.points[0][1]
            return f if np.isscalar(size) else np.full(np.shape(size), f)
        xs = np.log(np.array([p[0] for p in self.points]))
        ys = np.log(np.array([p[1] for p in self.points]))
        out = np.exp(np.interp(np.log(np.maximum(np.asarray(size, dtype=np.float64), 1.0)),
                               xs, ys))
        return float(out) if np.isscalar(size) else out


def _known_dtypes(v: dict, fp32: bool = False) -> dict:
    """Reject keys that are not compute dtypes (a validator shared by peaks and curves);
    ``fp32``: fp32 is allowed too (an activation dtype, not a GEMM compute dtype)."""
    known = [*COMPUTE_DTYPES, *(["fp32"] if fp32 and "fp32" not in COMPUTE_DTYPES else [])]
    bad = sorted(set(v) - set(known))
    if bad:
        raise ValueError(f"unknown dtype(s) {bad}; expected {known}")
    return v


class Efficiency(BaseModel):
    """Achieved fractions of peak, per kind of work."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    matmul: dict[str, EfficiencyCurve]
    """Dense GEMM, fraction of ``peak_flops[dtype]``, keyed by compute dtype."""
    attention: EfficiencyCurve
    """Flash-style attention math, fraction of the BF16 peak."""
    grouped_matmul_prefill: EfficiencyCurve
    """MoE grouped GEMM with many tokens per expert, fraction of peak FLOP/s."""
    grouped_matmul_decode: EfficiencyCurve
    """MoE grouped GEMM with few tokens per expert (decode), fraction of memory bandwidth."""
    memory: EfficiencyCurve
    """Streaming from device memory, fraction of ``memory_bandwidth``."""
    link: EfficiencyCurve
    """Collectives over the scale-up link, fraction of ``interconnect.bandwidth``."""
    attention_decode: EfficiencyCurve | None = None
    """Attention KV-cache reads (decode, and chunked-prefill re-reads), fraction of
    ``memory_bandwidth`` vs bytes read; absent: ``memory`` applies."""
    ssm_state: EfficiencyCurve | None = None
    """Mamba conv/SSM state read + write per decode step, fraction of ``memory_bandwidth``;
    absent: ``memory`` applies."""
    grouped_matmul_tokens: EfficiencyCurve | None = None
    """MoE grouped GEMM, fraction of peak FLOP/s vs **routed tokens per expert**
    (``tokens * top_k / experts``, not FLOPs); absent: ``grouped_matmul_prefill``."""
    grouped_matmul_k: EfficiencyCurve | None = None
    """MoE grouped GEMM, a factor in (0, 1] on its compute fraction vs the GEMM's
    **reduction length K** (elements, not FLOPs): the expert input width (hidden or latent)
    for the up projection, the **expert width** for the down projection. Each output tile
    pays a fixed prologue/epilogue beside its ``K / BLOCK_K`` main-loop iterations, so a short
    K reaches a smaller fraction of peak; absent: 1 (no K dependence)."""

    def kv_read(self) -> EfficiencyCurve:
        return self.attention_decode or self.memory

    def state_io(self) -> EfficiencyCurve:
        return self.ssm_state or self.memory

    @field_validator("matmul")
    @classmethod
    def _keys(cls, v: dict[str, EfficiencyCurve]) -> dict[str, EfficiencyCurve]:
        return _known_dtypes(v)


class Interconnect(BaseModel):
    """The scale-up link between GPUs of one node (NVLink, Infinity Fabric, PCIe)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str
    bandwidth: Figure
    """Bytes/s per GPU, per direction."""
    latency: Figure
    """Seconds: fixed cost of one collective (all-reduce) regardless of size."""


DEVICE_ENGINE_FIELDS = ("step_overhead_s", "request_overhead_s", "engines")
"""Keys of the older per-device layout of serving-engine host overheads, which a device
profile no longer takes: they belong to an engine profile (:class:`EngineProfile`)."""


def _refuse_device_engine_fields(data: object) -> object:
    """A device profile's ``data`` without the older layout's keys when they are empty
    (``null`` / ``{}``: what a profile written before the change holds); a set one raises
    an error naming the field and where host overheads belong now."""
    if not isinstance(data, dict):
        return data
    present = [k for k in DEVICE_ENGINE_FIELDS if k in data]
    if not present:
        return data
    for k in present:
        if data[k] not in (None, {}):
            raise PydanticCustomError(
                "device_engine_overheads",
                "{field} is no longer a device-profile field: serving-engine host overheads "
                "now belong to an engine profile (hwprofiles/data/engines/*.json, class "
                "EngineProfile, shared by every device); move the figures there and remove "
                "{field} from the device profile",
                {"field": k})
    return {k: v for k, v in data.items() if k not in DEVICE_ENGINE_FIELDS}


class EagerFigures(BaseModel):
    """How eager torch runs on the device: one aten op at a time, nothing fused.

    What ``puzzle-nas profile --blocks`` times is eager torch, so pricing its timed blocks
    (``costmodels.eager``) needs what the fused serving model leaves out: every op the block
    dispatches pays a host dispatch (``kernel_overhead_s`` per op that runs a kernel,
    ``view_overhead_s`` per op that runs none), and every elementwise op (norms, RoPE,
    activations, dtype casts) streams its inputs and output at the eager elementwise rate,
    which on a CPU without native bf16 is far below the memory bandwidth (each element is
    converted to fp32 and back)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    view_overhead_s: Figure
    """Seconds per dispatched op that runs no kernel (a view, transpose, slice or empty
    allocation)."""
    elementwise_bandwidth: dict[str, Figure]
    """Bytes read + written per second by one eager elementwise op, per dtype."""
    gemm_overhead_s: dict[str, Figure] = Field(default_factory=dict)
    """Seconds one eager GEMM call costs beyond its roofline time, per dtype: the GEMM
    library's fixed cost per call (on a CPU oneDNN's primitive setup for bf16, ~20 us, far
    above a 1-element op's dispatch). A dtype without one: ``kernel_overhead_s`` per GEMM,
    as for any other op (profiles written before the figure existed)."""

    @field_validator("elementwise_bandwidth")
    @classmethod
    def _rates(cls, v: dict[str, Figure]) -> dict[str, Figure]:
        _known_dtypes(v, fp32=True)
        if any(f.value <= 0 for f in v.values()):
            raise ValueError("elementwise bandwidths must be > 0")
        return v

    @field_validator("gemm_overhead_s")
    @classmethod
    def _gemm_costs(cls, v: dict[str, Figure]) -> dict[str, Figure]:
        _known_dtypes(v, fp32=True)
        if any(f.value < 0 for f in v.values()):
            raise ValueError("GEMM call overheads must be >= 0 seconds")
        return v


class HardwareProfile(BaseModel):
    """What one accelerator can do. Units: bytes, bytes/s, FLOP/s (dense), seconds.

    Serving-engine host overheads are not a device's (an :class:`EngineProfile` holds
    them): the older per-device keys (:data:`DEVICE_ENGINE_FIELDS`) are refused by name."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str = Field(pattern=r"^[a-z0-9][a-z0-9._-]*$")
    display_name: str
    vendor: str
    aliases: list[str] = Field(default_factory=list)
    notes: str = ""

    memory_bytes: Figure
    """Usable device memory, bytes (what the driver exposes)."""
    memory_bandwidth: Figure
    """Peak device-memory bandwidth, bytes/s."""
    peak_flops: dict[str, Figure]
    """Dense (not "with sparsity") tensor peak FLOP/s per compute dtype."""
    efficiency: Efficiency
    kernel_overhead_s: Figure
    """Fixed seconds added to every kernel (launch + ramp)."""
    l2_bytes: Figure | None = None
    """Last-level on-chip cache, bytes (informational)."""
    interconnect: Interconnect
    gpus_per_node: Figure
    moe_imbalance: Figure | None = None
    """MoE routing imbalance under expert parallelism: routed tokens on the busiest of the
    ``ep`` GPUs over the mean (>= 1); the busiest GPU sets the step. Absent: 1."""
    eager: EagerFigures | None = None
    """Eager torch on this device (measured by ``puzzle-nas profile``); only the pricing of
    timed eager blocks reads it. Absent: ``costmodels.eager`` says what it assumes."""

    @model_validator(mode="before")
    @classmethod
    def _no_device_engine_fields(cls, data: object) -> object:
        return _refuse_device_engine_fields(data)

    @field_validator("peak_flops")
    @classmethod
    def _peaks(cls, v: dict[str, Figure]) -> dict[str, Figure]:
        _known_dtypes(v)
        if "bf16" not in v:
            raise ValueError("a bf16 peak is required")
        return v

    @model_validator(mode="after")
    def _consistent(self) -> HardwareProfile:
        missing = sorted(set(self.peak_flops) - set(self.efficiency.matmul))
        if missing:
            raise ValueError(f"efficiency.matmul lacks a curve for {missing}")
        if self.memory_bytes.value <= 0 or self.memory_bandwidth.value <= 0:
            raise ValueError("memory_bytes and memory_bandwidth must be > 0")
        if self.gpus_per_node.value < 1 or self.gpus_per_node.value != int(self.gpus_per_node.value):
            raise ValueError("gpus_per_node must be a positive integer")
        return self

    # -- conveniences (plain numbers) ------------------------------------------------------

    def peak(self, dtype: str) -> float:
        """Dense peak FLOP/s of compute dtype ``dtype`` (KeyError if the device has none)."""
        return self.peak_flops[dtype].value

    def compute_dtype(self, weight_dtype: str) -> str:
        """The dtype a GEMM with ``weight_dtype`` weights computes in on this device.

        A dtype the device has tensor-core math for computes natively; otherwise weights are
        dequantized: FP4 formats to FP8 (or BF16 where there is no FP8), FP8/INT8 to BF16.
        This is a memory saving with no math speedup (e.g. NVFP4 weights on Hopper).
        """
        w = str(weight_dtype)
        chains = {
            "nvfp4": ("nvfp4", "fp8", "bf16"),
            "mxfp4": ("mxfp4", "fp8", "bf16"),
            "fp8": ("fp8", "bf16"),
            "int8": ("int8", "bf16"),
            "fp16": ("fp16", "bf16"),
            "bf16": ("bf16",),
            "fp32": ("bf16",),
        }
        for d in chains.get(w, ("bf16",)):
            if d in self.peak_flops:
                return d
        return "bf16"

    def matmul_fraction(self, dtype: str) -> float:
        """Large-GEMM achieved fraction of peak for compute dtype ``dtype``."""
        return self.efficiency.matmul[dtype].peak_fraction

    def _figures(self) -> list[tuple[str, Figure | EfficiencyCurve]]:
        """``(field path, figure)`` of every :class:`Figure` and :class:`EfficiencyCurve`."""
        out: list[tuple[str, Figure | EfficiencyCurve]] = []

        def walk(obj: object, path: str) -> None:
            if isinstance(obj, (Figure, EfficiencyCurve)):
                out.append((path, obj))
            elif isinstance(obj, dict):
                for k, v in obj.items():
                    walk(v, f"{path}.{k}" if path else str(k))
            elif isinstance(obj, BaseModel):
                for k in type(obj).model_fields:
                    walk(getattr(obj, k), f"{path}.{k}" if path else k)

        walk(self, "")
        return out

    def sourced_figures(self) -> list[tuple[str, str]]:
        """``(field path, source)`` of every :class:`Figure` and :class:`EfficiencyCurve`."""
        return [(path, f.source) for path, f in self._figures()]

    def on_bound_figures(self) -> list[tuple[str, str]]:
        """``(field path, note)`` of every figure that carries an ``on_bound`` note (a fitted
        figure on a bound of its fit, and why)."""
        return [(path, f.on_bound) for path, f in self._figures() if f.on_bound is not None]

    def assumed_figures(self) -> list[str]:
        """Field paths of the figures whose source says they are assumed."""
        return [path for path, src in self.sourced_figures() if is_assumed(src)]

    def summary_rows(self) -> list[tuple[str, str, str]]:
        """(field, value, source) rows for display; values formatted with units."""
        rows: list[tuple[str, str, str]] = []
        m = self.memory_bytes.value
        rows.append(("memory", gb_gib(m), self.memory_bytes.source))
        rows.append(("memory bandwidth", f"{self.memory_bandwidth.value / 1e12:.3f} TB/s",
                     self.memory_bandwidth.source))
        for d in COMPUTE_DTYPES:
            if d in self.peak_flops:
                f = self.peak_flops[d]
                rows.append((f"peak {d} (dense)", f"{f.value / 1e12:,.4g} TFLOP/s", f.source))
        e = self.efficiency
        for d, c in e.matmul.items():
            rows.append((f"matmul efficiency {d}", _curve_str(c), c.source))
        for key in ("attention", "grouped_matmul_prefill", "grouped_matmul_decode", "memory",
                    "link", "attention_decode", "ssm_state", "grouped_matmul_tokens",
                    "grouped_matmul_k"):
            c = getattr(e, key)
            if c is None:
                rows.append((f"{key.replace('_', ' ')} efficiency", "not given", "see schema"))
                continue
            rows.append((f"{key.replace('_', ' ')} efficiency", _curve_str(c), c.source))
        rows.append(("kernel overhead", f"{self.kernel_overhead_s.value * 1e6:.1f} us",
                     self.kernel_overhead_s.source))
        if self.l2_bytes is not None:
            rows.append(("last-level cache", f"{self.l2_bytes.value / 2**20:.0f} MiB",
                         self.l2_bytes.source))
        ic = self.interconnect
        rows.append((f"link ({ic.name}) per direction",
                     f"{ic.bandwidth.value / 1e9:.0f} GB/s", ic.bandwidth.source))
        rows.append(("link collective latency", f"{ic.latency.value * 1e6:.1f} us",
                     ic.latency.source))
        rows.append(("GPUs per node", f"{int(self.gpus_per_node.value)}",
                     self.gpus_per_node.source))
        rows.append(("serving-engine overheads", "per engine",
                     "not a device figure: each engine's profile in hwprofiles/data/engines "
                     "(trtllm by default), shared by every device (puzzle-nas calibrate "
                     "--engines fits them)"))
        mi = self.moe_imbalance
        rows.append(("MoE routing imbalance (EP)", "not given (1)" if mi is None
                     else f"{mi.value:.2f}", "" if mi is None else mi.source))
        return rows


def _curve_str(c: EfficiencyCurve) -> str:
    if c.is_constant:
        return f"{c.points[0][1]:.0%}"
    return " ".join(f"{f:.0%}@{s:.3g}" for s, f in c.points)


class TokenBudget(BaseModel):
    """An engine's default scheduling limits on devices with at least ``min_memory_bytes``
    of memory: tokens per step (``max_num_batched_tokens`` / ``chunked_prefill_size`` /
    ``max_num_tokens``) and, where the engine fixes one, the cap on running requests."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    min_memory_bytes: float = Field(ge=0)
    max_num_batched_tokens: int = Field(ge=1)
    max_num_seqs: int | None = Field(default=None, ge=1)
    exclude: list[str] = Field(default_factory=list, description="device names the rule "
                               "skips (e.g. vLLM keeps A100 on its small-GPU defaults)")
    source: str = Field(min_length=3)


class NoOverlapRule(BaseModel):
    """Where an engine that overlaps scheduling turns it off: for a model with any block of
    ``kinds`` (block kind names of ``costmodels.shapes.Kind``, lower case: ``mamba``,
    ``parallel``, ...), unless the deployment drafts with speculative decoding when
    ``except_draft`` (the engine then takes another path). Each rule cites its source."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    kinds: list[str] = Field(min_length=1)
    except_draft: bool = False
    source: str = Field(min_length=10)


class EngineProfile(BaseModel):
    """A serving engine's host-side costs, shared by every device it runs on (the GPU does
    not set the scheduler's CPU time). Units: seconds. ``costmodels.model`` prices them:

    * ``step_overhead_s``: host seconds per engine step (scheduling, input preparation,
      sampling bookkeeping, graph launch) not inside any kernel;
    * ``request_overhead_s``: host seconds per request in the engine loop (admission,
      tokenization, retirement), never hidden;
    * ``request_latency_s``: seconds a request spends outside the engine loop before its
      first token reaches the client (HTTP, tokenization, hops between the front end's
      processes, detokenization): TTFT only, off the critical path of the steps;
    * ``overlap``: the engine prepares step k+1 on the CPU while the GPU runs step k, so a
      step takes ``max(gpu, step_overhead_s)`` instead of ``gpu + step_overhead_s``;
      ``overlap_source`` says where that behaviour is documented.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str = Field(pattern=r"^[a-z0-9][a-z0-9._-]*$")
    display_name: str
    aliases: list[str] = Field(default_factory=list)
    notes: str = ""
    step_overhead_s: Figure
    request_overhead_s: Figure
    request_latency_s: Figure = Figure(value=0.0, source="none: the engine profile gives no "
                                       "front-end latency")
    min_step_s: Figure | None = None
    """The shortest engine step this engine is published at (a TPOT at concurrency 1):
    its host step cannot be longer, so it bounds a fitted ``step_overhead_s``."""
    fitted: bool = True
    fitted_note: str = ""
    overlap: bool = False
    overlap_source: str = Field(min_length=3)
    overlap_since: str | None = Field(default=None, pattern=r"^[0-9]+(\.[0-9]+)*$")
    no_overlap: list[NoOverlapRule] = Field(default_factory=list)
    """Models the engine runs without its overlap scheduler (:class:`NoOverlapRule`)."""
    mixed_prefill: bool = True
    mixed_prefill_source: str = ""
    token_budget: list[TokenBudget] = Field(default_factory=list)

    @model_validator(mode="after")
    def _check(self) -> EngineProfile:
        if not self.fitted and not self.fitted_note:
            raise ValueError("an engine profile with fitted: false says why (fitted_note)")
        return self

    def overlaps(self, version: str | None = None) -> bool:
        """Whether the engine overlaps host scheduling with GPU work at ``version``
        (``None``: the newest): ``overlap``, and from ``overlap_since`` on when given."""
        if not self.overlap:
            return False
        if self.overlap_since is None or version is None:
            return True
        return _version(version) >= _version(self.overlap_since)

    def budget(self, memory_bytes: float, device: str = "") -> TokenBudget | None:
        """The engine's default token budget on ``device`` with ``memory_bytes`` of memory
        (the rule with the largest ``min_memory_bytes`` at or below it that does not exclude
        the device); ``None`` when no rule applies."""
        hits = [b for b in self.token_budget if b.min_memory_bytes <= memory_bytes
                and device not in b.exclude]
        return max(hits, key=lambda b: b.min_memory_bytes) if hits else None


def _version(v: str) -> tuple[int, ...]:
    return tuple(int(x) for x in re.findall(r"[0-9]+", v))


class ComputeDtypeRule(BaseModel):
    """A serving engine's math for GEMMs with ``weight`` weights on ``devices`` (profile
    names), where it is not the device's fallback (:meth:`HardwareProfile.compute_dtype`);
    ``engines``: the engine profile names it holds for."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    weight: str = Field(min_length=2)
    devices: list[str] = Field(min_length=1)
    engines: list[str] = Field(min_length=1)
    compute: str
    source: str = Field(min_length=10)

    @field_validator("compute")
    @classmethod
    def _known(cls, v: str) -> str:
        if v not in COMPUTE_DTYPES:
            raise ValueError(f"compute dtype {v!r} is not one of {COMPUTE_DTYPES}")
        return v


class ComputeDtypeTable(BaseModel):
    """``hwprofiles/data/compute_dtypes.json``: the sourced (weight, device, engine) rules."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    notes: str = ""
    rules: list[ComputeDtypeRule]

    def lookup(self, weight: str, devices: set[str], engine: str) -> ComputeDtypeRule | None:
        """The rule for ``weight`` weights on a device named any of ``devices`` under the
        engine profile named ``engine``; ``None`` when no rule covers them."""
        for r in self.rules:
            if r.weight == weight and engine in r.engines and devices & set(r.devices):
                return r
        return None
