"""SLO throughput: the best concurrency under a per-user speed / TTFT floor that fits.

A serving engine is run at the concurrency that gives the most throughput while every user
still sees at least ``U`` tok/s (``per_user_tps >= U``) and/or a first token within ``T``
seconds (``ttft_s <= T``), and while the KV cache and state of that many requests fit in
memory. :func:`slo_throughput` prices one explicit sweep of concurrencies (one vectorized
``costmodels`` pass over all of them, formulas in ``costmodels.model``) and returns the
best point; :func:`concurrency_grid` is the default sweep (every integer up to 16, then
steps of about 1/16 of the value: a throughput error below ~3 % from the grid).

Without an SLO the answer is the engine's maximum-throughput point (the regime of
TensorRT-LLM's ``trtllm-bench throughput`` tables). Throughput is monotone in concurrency
until memory binds (tested), so the best point sits at the largest concurrency that meets
the SLO and fits.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from costmodels.blocks import _workload_columns, no_overlap_rows, price_blocks
from costmodels.dtypes import PrecisionRecipe
from costmodels.memory import DEFAULT_RESERVE_BYTES
from costmodels.model import (
    ModelCosts,
    NonBlockShape,
    engine_figures,
    engine_latency,
    max_concurrency,
    price_nonblock,
    summarize,
)
from costmodels.shapes import BlockTable
from costmodels.target import Target
from costmodels.workload import Workload, parse_workload
from hwprofiles.errors import InputError
from hwprofiles.schema import EngineProfile, HardwareProfile


class SLO(BaseModel):
    """A service-level objective: per-user decode speed floor and/or TTFT ceiling."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    per_user_tps: float | None = Field(default=None, gt=0, description="tok/s per user, at least")
    ttft_s: float | None = Field(default=None, gt=0, description="time to first token, at most (s)")

    def label(self) -> str:
        parts = []
        if self.per_user_tps is not None:
            parts.append(f"per_user_tps>={self.per_user_tps:g}")
        if self.ttft_s is not None:
            parts.append(f"ttft<={self.ttft_s * 1e3:g}ms")
        return ",".join(parts) or "none"

    def met(self, m: ModelCosts) -> np.ndarray:
        ok = np.ones(len(m.workloads), dtype=bool)
        if self.per_user_tps is not None:
            ok &= m.per_user_tok_s >= self.per_user_tps * (1 - 1e-12)
        if self.ttft_s is not None:
            ok &= m.ttft_s <= self.ttft_s * (1 + 1e-12)
        return ok


_TERM = re.compile(r"^\s*(per_user_tps|ttft(?:_s|_ms)?)\s*(>=|<=)\s*([0-9.eE+-]+)\s*(ms|s)?\s*$")


def parse_slo(text: str | SLO | None) -> SLO:
    """Parse ``"per_user_tps>=100"``, ``"ttft<=2s"``, ``"ttft_ms<=500"`` or both joined by
    ``,`` / ``and``."""
    if text is None:
        return SLO()
    if isinstance(text, SLO):
        return text
    out: dict[str, float] = {}
    for part in re.split(r",|\band\b", str(text)):
        if not part.strip():
            continue
        mt = _TERM.match(part)
        if mt is None:
            raise InputError(f"expected per_user_tps>=U and/or ttft<=T (e.g. ttft<=2s), got "
                             f"{part.strip()!r}", field="slo")
        key, op, val, unit = mt.groups()
        try:
            v = float(val)
        except ValueError:
            raise InputError(f"{val!r} is not a number", field="slo") from None
        if v <= 0:
            raise InputError(f"{part.strip()!r}: the bound must be > 0", field="slo")
        if key == "per_user_tps":
            if op != ">=":
                raise InputError("per_user_tps takes a floor: per_user_tps>=U", field="slo")
            out["per_user_tps"] = v
        else:
            if op != "<=":
                raise InputError("ttft takes a ceiling: ttft<=T", field="slo")
            scale = 1e-3 if (key == "ttft_ms" or unit == "ms") else 1.0
            out["ttft_s"] = v * scale
    return SLO(**out)


def concurrency_grid(limit: int) -> list[int]:
    """1..16, then geometric steps of ~1/16 up to ``limit`` (always included)."""
    limit = int(limit)
    if limit < 1:
        return []
    out = list(range(1, min(limit, 16) + 1))
    x = 16.0
    while x < limit:
        x *= 1.0625
        n = min(int(round(x)), limit)
        if n > out[-1]:
            out.append(n)
    if out[-1] != limit:
        out.append(limit)
    return out


@dataclass
class SLOPoint:
    """The chosen operating point and the sweep behind it (per-GPU throughput)."""

    slo: SLO
    workload: Workload | None
    concurrency: int
    throughput_tok_s: float
    throughput_node_tok_s: float
    per_user_tok_s: float
    ttft_s: float
    tpot_s: float
    memory_bytes: float
    max_concurrency: int
    sweep: ModelCosts
    met: np.ndarray

    @property
    def feasible(self) -> bool:
        return self.concurrency > 0

    def to_dict(self) -> dict:
        return {"slo": self.slo.label(), "concurrency": self.concurrency,
                "throughput_tok_s": self.throughput_tok_s,
                "throughput_node_tok_s": self.throughput_node_tok_s,
                "per_user_tok_s": self.per_user_tok_s, "ttft_s": self.ttft_s,
                "tpot_s": self.tpot_s, "memory_bytes": self.memory_bytes,
                "max_concurrency": self.max_concurrency,
                "swept": [w.sequences for w in self.sweep.workloads]}


def slo_throughput(table: BlockTable, nonblock: NonBlockShape, hw: HardwareProfile,
                   recipe: PrecisionRecipe, workload: Workload | str, slo: SLO | str | None = None,
                   tp: int = 1, ep: int = 1, reserve_bytes: float = DEFAULT_RESERVE_BYTES,
                   concurrencies: Sequence[int] | None = None,
                   step_overhead_s: float | None = None,
                   request_overhead_s: float | None = None, attention_dp: bool = False,
                   draft: np.ndarray | Sequence[bool] | None = None, engine: str | None = None,
                   engines: Mapping[str, EngineProfile] | None = None) -> SLOPoint:
    """Best throughput of ``workload`` (its isl/osl/engine limits; its own concurrency is
    ignored) over a concurrency sweep, subject to ``slo`` and to memory.

    ``concurrencies`` defaults to :func:`concurrency_grid` up to the largest concurrency
    that fits at ``isl + osl`` tokens (capped by ``max_num_seqs``). A point qualifies when
    it fits (``memory_bytes <= device``) and meets the SLO; the best qualifying point wins
    (``concurrency == 0`` when none does). ``attention_dp`` / ``draft``: see
    :func:`costmodels.blocks.price_blocks`; ``engine`` / ``engines`` and the overheads (s
    per step / per request): see :func:`costmodels.model.price_nonblock` (a named engine
    that overlaps scheduling hides its step overhead, as for any other workload).
    """
    target = Target(hw, tp, ep, attention_dp, engine, engines)
    kw = target.block_kwargs(draft)
    nkw = dict(target.nonblock_kwargs(draft), step_overhead_s=step_overhead_s,
               request_overhead_s=request_overhead_s)
    wl = parse_workload(workload)
    if wl.batch is not None:
        wl = Workload.model_validate({**wl.model_dump(), "batch": None, "concurrency": 1})
    slo = parse_slo(slo)
    probe = [wl.with_sequences(1)]
    blocks1 = price_blocks(table, hw, recipe, probe, **kw)
    nb1 = price_nonblock(nonblock, hw, recipe, probe, **nkw)
    cap = max_concurrency(blocks1, nb1, hw, wl.max_context, reserve_bytes=reserve_bytes,
                          workload=wl)
    limit = min(cap.max_concurrency, wl.max_num_seqs)
    grid = sorted({int(c) for c in concurrencies}) if concurrencies is not None \
        else concurrency_grid(max(limit, 1))
    if not grid or grid[0] < 1:
        raise InputError("concurrencies must be positive integers", field="concurrencies")
    wls = [wl.with_sequences(c) for c in grid]
    blocks = price_blocks(table, hw, recipe, wls, **kw)
    nb = price_nonblock(nonblock, hw, recipe, wls, **nkw)
    m = summarize(blocks, nb, hw, reserve_bytes=reserve_bytes)
    ok = slo.met(m) & m.fits
    if not ok.any():
        return SLOPoint(slo, None, 0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, cap.max_concurrency, m, ok)
    i = int(np.argmax(np.where(ok, m.throughput_tok_s, -np.inf)))
    return SLOPoint(slo, m.workloads[i], m.workloads[i].sequences, float(m.throughput_tok_s[i]),
                    float(m.throughput_node_tok_s[i]), float(m.per_user_tok_s[i]),
                    float(m.ttft_s[i]), float(m.tpot_s[i]), float(m.memory_bytes[i]),
                    cap.max_concurrency, m, ok)


# -- arrival processes ------------------------------------------------------------------

def _finite(x: float) -> float | None:
    return float(x) if math.isfinite(x) else None


@dataclass
class ArrivalPoint:
    """Serving figures under an arrival process (``Workload.arrival`` ``staggered``,
    ``poisson`` or ``fixed``; :func:`arrival_figures`). Seconds, requests/s; throughput in
    output tok/s **per GPU** of the requests actually served.

    ``rate_per_s``: the offered rate (a closed loop: the rate it runs at);
    ``capacity_per_s``: the most the ``slots`` serve (all busy, a waiting request admitted
    as another ends); ``served_per_s``: the offered rate when ``stable``, else the capacity;
    ``slots``: requests admitted at once (``min(concurrency, max_num_seqs)``, and in an open
    loop no more than the KV cache holds at ``isl + osl``); ``in_flight``: mean requests
    admitted (Little's law: ``served * admitted latency``); ``queued`` / ``queue_wait_s``:
    mean requests waiting for a slot and mean wait (``inf``: the queue grows without
    bound); ``ttft_s``: arrival to first token, the wait included; ``admitted_ttft_s``: the
    same less the wait; ``latency_s``: ``ttft_s + (osl - 1) * tpot_s``; ``utilization``:
    offered rate over capacity (>= 1: overloaded; a closed loop: 1, its slots always busy);
    ``prefill_share``: the share of GPU time spent on prompts."""

    workload: Workload
    rate_per_s: float
    in_flight: float
    ttft_s: float
    tpot_s: float
    latency_s: float
    throughput_tok_s: float
    utilization: float
    served_per_s: float
    capacity_per_s: float
    slots: int
    queued: float
    queue_wait_s: float
    admitted_ttft_s: float
    prefill_share: float
    stable: bool

    @property
    def overloaded(self) -> bool:
        """More is offered than the slots can serve (an open loop at ``utilization >= 1``)."""
        return not self.stable

    def message(self) -> str:
        """One line: the offered and served rates, and whether the slots keep up."""
        if self.workload.open_loop and not self.stable:
            return (f"overloaded: offered {self.rate_per_s:,.4g} req/s, serves at most "
                    f"{self.capacity_per_s:,.4g} req/s ({self.slots} slots); the queue grows "
                    "without bound, TTFT and latency are unbounded")
        if self.workload.open_loop:
            return (f"{self.workload.arrival} arrivals at {self.rate_per_s:,.4g} req/s: load "
                    f"{self.utilization:.2f} of the {self.capacity_per_s:,.4g} req/s that "
                    f"{self.slots} slots serve; {self.in_flight:,.1f} in flight, "
                    f"{self.queued:,.2f} waiting {self.queue_wait_s * 1e3:,.1f} ms for a slot")
        return (f"staggered closed loop of {self.slots}: {self.served_per_s:,.4g} req/s")

    def to_dict(self) -> dict:
        """JSON-ready: an unbounded figure (overload) is ``None``."""
        return {"workload": self.workload.name, "arrival": self.workload.arrival,
                "rate_per_s": self.rate_per_s, "served_per_s": self.served_per_s,
                "capacity_per_s": self.capacity_per_s, "slots": self.slots,
                "in_flight": self.in_flight, "queued": _finite(self.queued),
                "queue_wait_s": _finite(self.queue_wait_s), "ttft_s": _finite(self.ttft_s),
                "admitted_ttft_s": _finite(self.admitted_ttft_s),
                "tpot_s": _finite(self.tpot_s), "latency_s": _finite(self.latency_s),
                "throughput_tok_s": self.throughput_tok_s, "utilization": self.utilization,
                "prefill_share": self.prefill_share, "stable": self.stable,
                "overloaded": self.overloaded, "message": self.message()}


def _step_times(table: BlockTable, nonblock: NonBlockShape, hw: HardwareProfile,
                recipe: PrecisionRecipe, wl: Workload, Bs: Sequence[int], kw: dict,
                nkw: dict) -> tuple[np.ndarray, np.ndarray]:
    """GPU seconds (no host overheads) of one decode step of B running requests and the
    extra seconds one S-token prompt adds, per B in ``Bs``: the decode step from a static
    batch of B (its TPOT times the acceptance: one verification step); the prompt from a
    closed loop of B whose token budget is one prompt (a mixed step: one prompt + the
    others' decodes), or, when the engine runs prefill steps alone, one prompt's pass."""
    base = {k: v for k, v in wl.model_dump().items()
            if k not in ("name", "batch", "concurrency", "arrival", "rate", "requests")}
    dec_w = [Workload(**{**base, "batch": int(b)}) for b in Bs]
    n = len(Bs)
    if wl.mixed_prefill:
        # the closed loop's mixed step carries one prompt and the decodes of min(B - 1,
        # O' - 1) others (none at B = 1, where a decode step of one stands for the weights
        # read either way); the prompt's share is that step less a decode step of the others
        oeff = 1.0 + (wl.osl - 1.0) / wl.acceptance
        others = [max(1, round(min(b - 1.0, oeff - 1.0))) for b in Bs]
        p_w = [Workload(**{**base, "concurrency": int(b), "max_num_seqs": max(int(b), 1),
                           "max_num_batched_tokens": wl.isl}) for b in Bs]
        o_w = [Workload(**{**base, "batch": k}) for k in others]
    else:
        p_w, o_w = [Workload(**{**base, "batch": 1})], []
    wls = dec_w + p_w + o_w
    blocks = price_blocks(table, hw, recipe, wls, **kw)
    nb = price_nonblock(nonblock, hw, recipe, wls, step_overhead_s=0.0, request_overhead_s=0.0,
                        **nkw)
    m = summarize(blocks, nb, hw)
    dec = m.tpot_s[:n] * wl.acceptance
    if wl.mixed_prefill:
        wc = _workload_columns(p_w)
        n_t = np.maximum(wc["NC"][0] - oeff, 0.0) + wc["M"][0]
        mix = m.ttft_s[n:2 * n] / n_t
        prompt = np.maximum(mix - m.tpot_s[2 * n:] * wl.acceptance, 0.0)
    else:
        prompt = np.full(n, float(m.ttft_s[n]))
    return dec, prompt


def step_overheads(table: BlockTable, target: Target, wl: Workload
                   ) -> tuple[float, float, bool]:
    """The target engine's step overhead (s), per-request host seconds and whether its host
    work overlaps the GPU's (:func:`costmodels.model.engine_figures`); a block kind the
    engine cannot overlap for (``EngineProfile.no_overlap``) turns the overlap off."""
    eng = dict(target.engines) if target.engines else None
    so, ro, overlap = engine_figures(target.hw, target.engine, eng)
    off = no_overlap_rows(table, target.engine, [wl], eng)
    return so, ro, overlap and not (off is not None and bool(off.any()))


def admitted_slots(table: BlockTable, nonblock: NonBlockShape, hw: HardwareProfile,
                   recipe: PrecisionRecipe, wl: Workload, kw: Mapping[str, Any],
                   nkw: Mapping[str, Any],
                   reserve_bytes: float = DEFAULT_RESERVE_BYTES) -> int:
    """Requests admitted at once: ``min(concurrency, max_num_seqs)`` (``wl.sequences``) and,
    in an open loop, no more than the KV cache holds at ``isl + osl`` with
    ``reserve_bytes`` held back (0 when not one fits). One count for the closed-form
    figures (:func:`arrival_figures`) and the scheduler replay
    (:func:`costmodels.replay.replay`), so both admit the same requests."""
    cap = int(wl.sequences)
    if wl.open_loop:
        probe = [wl.with_sequences(1)]
        fit = max_concurrency(price_blocks(table, hw, recipe, probe, **kw),
                              price_nonblock(nonblock, hw, recipe, probe, **nkw),
                              hw, wl.max_context, reserve_bytes=reserve_bytes, workload=wl)
        cap = min(cap, int(fit.max_concurrency))
    return max(cap, 0)


def arrival_figures(table: BlockTable, nonblock: NonBlockShape, hw: HardwareProfile,
                    recipe: PrecisionRecipe, workload: Workload | str, tp: int = 1,
                    ep: int = 1, attention_dp: bool = False,
                    draft: np.ndarray | Sequence[bool] | None = None,
                    engine: str | None = None,
                    engines: Mapping[str, EngineProfile] | None = None,
                    iterations: int = 60,
                    reserve_bytes: float = DEFAULT_RESERVE_BYTES) -> ArrivalPoint:
    """TTFT, TPOT and throughput when requests arrive one by one (``workload.arrival``):

    * ``staggered``: a closed loop of B = ``concurrency`` requests with spread-out end times
      (random lengths, as ``sglang.bench_serving`` / ``vllm bench serve`` draw them): a new
      request arrives as another ends, at ``rate = B / latency``, and finds B - 1 running;
    * ``poisson`` / ``fixed``: an open loop at ``rate`` requests/s (independent arrivals /
      one every ``1 / rate`` s) into ``c`` slots (``min(concurrency, max_num_seqs)`` and the
      most whose KV cache fits at ``isl + osl`` with ``reserve_bytes`` held back); a request
      that finds every slot busy waits in a queue.

    Per engine step the running requests decode (``d(B)`` GPU seconds, plus the engine's
    step overhead, hidden behind the GPU when it overlaps), and each arriving prompt adds
    ``p`` seconds (:func:`_step_times`) plus the engine's per-request host seconds ``r``,
    serially. With the others' prompts at ``rate_o`` per second the prompt work takes a
    share ``u = rate_o * (p + r)`` of the time, so a request's tokens come every ``d / (1 -
    u)`` seconds (TPOT, per accepted token with speculative decoding); its own prompt waits
    for the step under way (``t / 2`` for an open loop's arrivals, none in a closed loop,
    whose arrival is the end of a step), then queues behind the others' prompts (M/D/1:
    ``u / (2 (1 - u)) * (p + r)``; none for fixed-rate arrivals, D/D/1), then runs (``p +
    r``, in a step that also carries the decodes when the engine mixes them), over ``ceil(S
    / budget)`` steps; the engine's front-end latency (``request_latency_s``) comes on top.
    The latency ``TTFT + (O - 1) * TPOT`` closes the loop (``rate`` or ``B``).

    An open loop's **capacity** is the rate of a closed loop of ``c`` (all slots busy, a
    waiting request admitted as another ends, as ``staggered`` prices it). Below it the
    mean busy slots ``B`` solve ``B = rate * latency(B)`` (Little's law, by bisection), and a
    request waits for a slot as in a GI/D/c queue of ``c`` servers each holding a request
    ``c / capacity`` seconds (:func:`costmodels.queueing.gc_wait`: Allen-Cunneen with
    Cosmetatos' correction; Poisson ``ca2 = 1``, fixed rate ``ca2 = 0``; fixed lengths
    ``cs2 = 0``); the wait adds to TTFT. At or above it the system is **overloaded**
    (``stable`` false): the served rate and throughput are the capacity, the slots stay
    full (TPOT is the full slots' own), and the wait, TTFT and latency are unbounded
    (``inf``)."""
    from costmodels.queueing import gc_wait

    wl = parse_workload(workload)
    if wl.arrival == "closed":
        raise InputError("arrival_figures prices arrival=staggered, poisson or fixed",
                         field="arrival")
    target = Target(hw, tp, ep, attention_dp, engine, engines)
    kw, nkw = target.block_kwargs(draft), target.nonblock_kwargs(draft)
    so, ro, overlap = step_overheads(table, target, wl)
    front = engine_latency(engine, engines)
    cap = admitted_slots(table, nonblock, hw, recipe, wl, kw, nkw, reserve_bytes)
    if wl.open_loop:
        if cap < 1:  # not one request fits: nothing is served
            inf = math.inf
            return ArrivalPoint(wl, float(wl.rate or 0.0), 0.0, inf, inf, inf, 0.0, inf, 0.0,
                                0.0, 0, inf, inf, inf, 0.0, False)
    grid = [cap] if wl.arrival == "staggered" else concurrency_grid(cap)
    dec_g, prm_g = _step_times(table, nonblock, hw, recipe, wl, grid, kw, nkw)
    gx = np.asarray(grid, dtype=np.float64)

    def at(b: float) -> tuple[float, float]:
        return float(np.interp(b, gx, dec_g)), float(np.interp(b, gx, prm_g))

    def step(g: float) -> float:
        return max(g, so) if overlap else g + so

    S, osl, A = float(wl.isl), float(wl.osl), float(wl.acceptance)
    budget = float(wl.max_num_batched_tokens)

    def figures(b: float, rate_o: float, opened: bool = False,
                ca2: float = 1.0) -> tuple[float, float, float, float]:
        """TTFT from admission, TPOT, latency from admission, prompt share: ``b`` running,
        the others' prompts at ``rate_o`` (``ca2``: their interarrival times' squared
        coefficient of variation); ``opened``: an open loop's arrival (mid-step)."""
        g_d, g_p = at(b)
        d = step(g_d)
        p = (step(g_d + g_p) - d if wl.mixed_prefill else step(g_p)) + ro
        u = rate_o * p
        uc = min(u, 1.0 - 1e-9)
        t = d / (1.0 - uc)
        tpot = t / A
        room = budget - (b if wl.mixed_prefill else 0.0)
        m = max(1.0, math.ceil(S / max(room, 1.0)))
        wait = t / 2.0 if opened else 0.0
        # the others' prompts queue as M/D/1 (Poisson-like arrivals), D/D/1 at a fixed rate
        ttft = front + wait + ca2 * uc / (2.0 * (1.0 - uc)) * p + p \
            + (d if wl.mixed_prefill else 0.0) + (m - 1.0) * t
        return ttft, tpot, ttft + (osl - 1.0) * tpot, u

    def closed_loop(b: float) -> tuple[float, float, float, float, float]:
        """rate, TTFT, TPOT, latency, prompt share of a closed loop of ``b`` whose requests
        end at spread-out times (fixed-point iteration on the latency)."""
        lat = figures(b, 0.0)[2]
        for _ in range(iterations):
            rate = b / lat
            lat = 0.5 * lat + 0.5 * figures(b, rate * (b - 1.0) / b)[2]
        rate = b / lat
        return (rate, *figures(b, rate * (b - 1.0) / b))

    if wl.arrival == "staggered":
        b = float(cap)
        rate, ttft, tpot, lat, u = closed_loop(b)
        if wl.requests is not None and wl.requests > cap:
            ttft = _with_first_wave(ttft, table, nonblock, hw, recipe, wl, kw, nkw, so, ro,
                                    overlap, front)
        served = min(rate, b / lat)
        return ArrivalPoint(wl, rate, b, ttft, tpot, lat, served * osl / tp, 1.0, served, rate,
                            cap, 0.0, 0.0, ttft, u, True)

    assert wl.rate is not None  # Workload: an open loop comes with a rate
    rate = float(wl.rate)
    capacity, c_ttft, c_tpot, c_lat, c_u = closed_loop(float(cap))
    if rate >= capacity:  # overloaded: the slots stay full, the queue grows without bound
        inf = math.inf
        return ArrivalPoint(wl, rate, float(cap), inf, c_tpot, inf, capacity * osl / tp,
                            rate / capacity, capacity, capacity, cap, inf, inf, c_ttft, c_u,
                            False)

    ca2 = 0.0 if wl.arrival == "fixed" else 1.0

    def excess(b: float) -> float:  # Little's law residual: rate * latency(b) - b
        return rate * figures(b, rate, True, ca2)[2] - b

    if excess(1.0) <= 0.0:
        b = 1.0
    elif excess(float(cap)) >= 0.0:
        b = float(cap)
    else:
        lo, hi = 1.0, float(cap)
        for _ in range(iterations):
            b = 0.5 * (lo + hi)
            lo, hi = (b, hi) if excess(b) > 0.0 else (lo, b)
        b = 0.5 * (lo + hi)
    a_ttft, tpot, a_lat, u = figures(b, rate, True, ca2)
    wait = gc_wait(cap, rate, cap / capacity, ca2=ca2, cs2=0.0)
    return ArrivalPoint(wl, rate, b, a_ttft + wait, tpot, a_lat + wait, rate * osl / tp,
                        rate / capacity, rate, capacity, cap, rate * wait, wait, a_ttft, u, True)


def _with_first_wave(ttft: float, table: BlockTable, nonblock: NonBlockShape,
                     hw: HardwareProfile, recipe: PrecisionRecipe, wl: Workload, kw: dict,
                     nkw: dict, so: float, ro: float, overlap: bool, front: float) -> float:
    """The run's mean TTFT when its first B requests arrive together (a benchmark starts B
    at once, then one as each ends): that wave's B prompts (``B * S`` tokens, one pass
    ``T``) are prefilled in ``n_c = max(1, B * S / budget)`` steps of ``T / n_c`` each, so a
    prompt of it waits ``T * (n_c + 1) / (2 n_c)`` on average, and the engine's host admits
    them one by one (``r * (B + 1) / 2``); the other ``N - B`` requests see ``ttft``."""
    B = int(wl.sequences)
    base = {k: v for k, v in wl.model_dump().items()
            if k not in ("name", "batch", "concurrency", "arrival", "rate", "requests")}
    burst = Workload(**{**base, "batch": B})
    blocks = price_blocks(table, hw, recipe, [burst], **kw)
    nb = price_nonblock(nonblock, hw, recipe, [burst], step_overhead_s=0.0,
                        request_overhead_s=0.0, **nkw)
    t_all = float(summarize(blocks, nb, hw).ttft_s[0])
    n_c = max(1.0, B * wl.isl / wl.max_num_batched_tokens)
    step = t_all / n_c
    step = max(step, so) if overlap else step + so
    wave = front + step * (n_c + 1.0) / 2.0 + ro * (B + 1.0) / 2.0
    assert wl.requests is not None  # arrival_figures calls this only with requests
    f = B / float(wl.requests)
    return f * wave + (1.0 - f) * ttft
