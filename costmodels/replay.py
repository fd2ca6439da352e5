"""A scheduler replay: the serving engine's steps, request by request (issue 50, part 2).

:func:`costmodels.serving.arrival_figures` prices arrivals in closed form (Little's law, a
queue for the prompts, Allen-Cunneen for the wait for a slot). :func:`replay` runs the same
engine as a discrete-event simulation of its scheduler, so that the closed forms can be
checked where they are used and so that a user gets percentiles, not only means.

**Arrivals** (``Workload.arrival``):

* ``closed``: ``concurrency`` clients start together; each sends its next request as its
  last one ends (with fixed lengths they stay in lockstep groups: the cycle of
  :mod:`costmodels.model`);
* ``staggered``: the same closed loop, started with its requests spread evenly over their
  output (the steady state that random lengths give), so each new prompt arrives alone;
* ``poisson``: an open loop, independent arrivals at ``rate`` per second (exponential gaps
  drawn from ``numpy.random.default_rng(seed)``);
* ``fixed``: an open loop, one request every ``1 / rate`` seconds.

**Admission.** At most ``slots`` requests are admitted at once: ``min(concurrency,
max_num_seqs)`` and, in an open loop, no more than the KV cache holds at ``isl + osl``
(``costmodels.model.max_concurrency``, as ``arrival_figures`` counts them). A request that
finds every slot taken waits in a first-come-first-served queue; at each step boundary the
queue's head takes a free slot.

**The engine's policy, per step** (vLLM v1 and TensorRT-LLM in-flight batching; Sarathi's
chunked prefill): every admitted request that has its first token decodes; the step's
remaining token budget (``max_num_batched_tokens`` less one token per decode) goes to
prompt chunks of the admitted requests still in prefill, first come first served, a prompt
split across steps where the budget runs out. An engine that does not mix
(``mixed_prefill`` false, SGLang's default) runs a prefill step alone, prompts first,
whenever a prompt waits, and the decodes wait for it.

**Step times come from the block cost model**, the one ``arrival_figures`` uses, priced
once on the same concurrency grid and interpolated (:func:`_step_table`): a step of ``n``
decodes and no prompt is the decode step ``d(n)`` of
:func:`costmodels.serving._step_times`; a step of ``n`` decodes and ``j`` prompts is the
mixed step of a closed loop of ``n + j`` requests whose token budget is ``j`` prompts
(``costmodels.model``; at ``j = 1`` the ``d + p`` of ``arrival_figures``), interpolated in
``j`` for partial chunks; an engine that does not mix runs ``j`` prompts alone as a static
batch of ``j`` prefills them. Pricing each step as it is composed, rather than as ``d +
j p``, keeps the roofline's bend: a step of 8 prompts is compute-bound, where the one
prompt ``p`` is measured on is partly hidden under the weight read. The engine's step
overhead is added (or hidden behind the GPU, ``max(g, s_o)``, when it overlaps), plus its
per-request host seconds for each prompt that completes in the step; its front-end latency
adds to every TTFT. With speculative decoding a decode step yields ``acceptance`` tokens
(``(osl - 1) / acceptance`` steps per request, spread to whole steps so that the mean is
exact). No figure is fitted here: every one belongs to a device, an op or an engine.

Decode-only stretches are skipped in one move up to the next event (an arrival that can
take a slot, or the first request to finish), so a replay costs a few heap operations per
request: 10,000 requests take 0.05 s of CPU (``benchmarks/bench_replay.py``).

**What is counted.** The first ``warmup`` share of the requests (default 0.2, at least one
closed loop's worth) is a warm-up: the figures are over the requests that arrive after
it. TTFT is arrival to first token (the wait for a slot included), TPOT the time between
a request's first and last tokens over ``osl - 1``, latency arrival to last token. The
served rate is Little's law over the **window** from the first counted arrival to the
last arrival (the span in which the offered load is on): the mean requests admitted over
the window over the mean time a counted request holds its slot (a count of completions in
the window swings with where its edges fall among a closed loop's lockstep bursts); output
tokens/s per GPU ``served * osl / tp``; mean in flight and queued are time averages over
the window. An open loop is **overloaded** when the queue for a slot still grows over the
window's second half by more than its fluctuations (``3 sqrt(n) + 1``, ``n`` the arrivals
in that half): offered above what is served. Its TTFT then grows with the length of the
run; the replay reports the run's own.
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from pydantic import BaseModel, ConfigDict

from costmodels.blocks import _workload_columns, price_blocks
from costmodels.dtypes import PrecisionRecipe
from costmodels.memory import DEFAULT_RESERVE_BYTES
from costmodels.model import (
    NonBlockShape,
    engine_latency,
    price_nonblock,
    summarize,
)
from costmodels.serving import (
    _step_times,
    admitted_slots,
    concurrency_grid,
    step_overheads,
)
from costmodels.shapes import BlockTable
from costmodels.target import Target
from costmodels.workload import Workload, parse_workload
from hwprofiles.errors import InputError
from hwprofiles.schema import EngineProfile, HardwareProfile

DEFAULT_REQUESTS = 2000
"""Requests replayed when neither the caller nor the workload (``requests``) says."""

DEFAULT_WARMUP = 0.2
"""Share of the requests (in arrival order) left out of the figures as a warm-up."""


class Percentiles(BaseModel):
    """Mean and percentiles of one figure over the counted requests (seconds)."""

    model_config = ConfigDict(frozen=True)

    mean: float
    p50: float
    p90: float
    p99: float

    @classmethod
    def of(cls, x: np.ndarray) -> Percentiles:
        if not len(x):
            return cls(mean=math.nan, p50=math.nan, p90=math.nan, p99=math.nan)
        p50, p90, p99 = np.percentile(x, [50, 90, 99])
        return cls(mean=float(np.mean(x)), p50=float(p50), p90=float(p90), p99=float(p99))


class ReplayResult(BaseModel):
    """The figures of one replay (module docstring: what is counted). Seconds, requests/s,
    output tokens/s per GPU."""

    model_config = ConfigDict(frozen=True)

    workload: str
    arrival: str
    rate_per_s: float | None
    """The offered rate (open loops; ``None`` for a closed loop)."""
    requests: int
    counted: int
    warmup: int
    seed: int
    slots: int
    ttft_s: Percentiles
    tpot_s: Percentiles
    latency_s: Percentiles
    queue_wait_s: Percentiles
    served_per_s: float
    throughput_tok_s: float
    in_flight: float
    queued: float
    queue_growth: float
    """Growth of the queue for a slot over the window's second half (requests)."""
    steps: int
    duration_s: float
    overloaded: bool

    def message(self) -> str:
        """One line: offered and served rates, and whether the slots keep up."""
        if self.overloaded:
            return (f"overloaded (replay of {self.requests:,} requests): offered "
                    f"{self.rate_per_s:,.4g} req/s, served {self.served_per_s:,.4g} req/s "
                    f"({self.slots} slots); the queue grew by {self.queue_growth:,.0f} over "
                    "the second half, TTFT grows with the run")
        if self.rate_per_s is not None:
            return (f"replay of {self.requests:,} {self.arrival} requests at "
                    f"{self.rate_per_s:,.4g} req/s: served {self.served_per_s:,.4g} req/s; "
                    f"{self.in_flight:,.1f} in flight, {self.queued:,.2f} waiting "
                    f"{self.queue_wait_s.mean * 1e3:,.1f} ms for a slot")
        return (f"replay of {self.requests:,} requests, {self.arrival} loop of "
                f"{self.slots}: served {self.served_per_s:,.4g} req/s")

    def to_dict(self) -> dict:
        """JSON-ready (``nan`` where nothing was counted becomes ``None``)."""
        def clean(v: Any) -> Any:
            if isinstance(v, dict):
                return {k: clean(x) for k, x in v.items()}
            if isinstance(v, float) and not math.isfinite(v):
                return None
            return v
        return {**clean(self.model_dump()), "message": self.message()}


def _decode_steps(n: int, osl: int, acceptance: float) -> np.ndarray:
    """Decode steps of each of ``n`` requests after its first token: ``(osl - 1) /
    acceptance`` on average, spread to whole steps (``floor((i + 1) x) - floor(i x)``)."""
    x = (osl - 1.0) / acceptance
    i = np.arange(n + 1, dtype=np.float64)
    c = np.floor(i * x + 1e-9)
    return (c[1:] - c[:-1]).astype(np.int64)


def replay(table: BlockTable, nonblock: NonBlockShape, hw: HardwareProfile,
           recipe: PrecisionRecipe, workload: Workload | str, requests: int | None = None,
           seed: int = 0, rate: float | None = None, warmup: float = DEFAULT_WARMUP,
           tp: int = 1, ep: int = 1, attention_dp: bool = False,
           draft: np.ndarray | Sequence[bool] | None = None, engine: str | None = None,
           engines: Mapping[str, EngineProfile] | None = None,
           reserve_bytes: float = DEFAULT_RESERVE_BYTES) -> ReplayResult:
    """Replay ``requests`` requests of ``workload`` through the engine's scheduler (module
    docstring) and return their figures.

    ``rate`` overrides the workload's (open loops); ``seed`` seeds the Poisson arrivals;
    ``warmup`` is the share of requests left out of the figures. The other arguments are
    those of :func:`costmodels.serving.arrival_figures` (the engine, the parallel layout,
    the memory reserve), so a replay and the analytic figures price the same deployment.
    """
    wl = parse_workload(workload)
    if wl.batch is not None:
        raise InputError("a replay runs continuous batching: give concurrency=N, not batch",
                         field="workload")
    n_req = int(requests if requests is not None else (wl.requests or DEFAULT_REQUESTS))
    if requests is not None and (int(requests) != requests or requests < 1):
        raise InputError(f"expected a positive number of requests, got {requests!r}",
                         field="requests")
    if rate is not None:
        if not wl.open_loop:
            raise InputError(f"a rate goes with arrival poisson or fixed, not {wl.arrival}",
                             field="rate")
        if not (math.isfinite(rate) and rate > 0):
            raise InputError(f"expected requests/s > 0, got {rate}", field="rate")
        wl = Workload.model_validate({**wl.model_dump(), "rate": float(rate)})
    if not (0.0 <= warmup < 1.0):
        raise InputError(f"expected a share in [0, 1), got {warmup}", field="warmup")

    target = Target(hw, tp, ep, attention_dp, engine, engines)
    kw, nkw = target.block_kwargs(draft), target.nonblock_kwargs(draft)
    so, ro, overlap = step_overheads(table, target, wl)
    front = engine_latency(engine, engines)
    slots = admitted_slots(table, nonblock, hw, recipe, wl, kw, nkw, reserve_bytes)
    if slots < 1:
        raise InputError(f"not one request of {wl.max_context:,} tokens fits in memory",
                         field="workload")
    grid = concurrency_grid(slots)
    table2, jgrid = _step_table(table, nonblock, hw, recipe, wl, grid, slots, kw, nkw)
    return _run(wl, n_req, seed, warmup, slots, table2, jgrid, so, ro, overlap, front, tp)


def _step_table(table: BlockTable, nonblock: NonBlockShape, hw: HardwareProfile,
                recipe: PrecisionRecipe, wl: Workload, grid: Sequence[int], slots: int,
                kw: dict, nkw: dict) -> tuple[np.ndarray, np.ndarray]:
    """``[slots + 1, J]`` GPU seconds (no host overheads) of one engine step that carries
    the decodes of ``n`` running requests (row ``n``) and ``j`` whole prompts' tokens
    (column: ``jgrid[col]``; the replay interpolates in between), priced by the block
    model on the concurrency grid ``grid`` and interpolated to every ``n``.

    Column 0 is the decode step ``d(n)`` of :func:`costmodels.serving._step_times` (a step
    of no decodes reads the weights as a step of one does). A mixed step of ``n`` decodes
    and ``j`` prompts is the mixed step of a closed loop of ``n + j`` requests whose token
    budget is ``j * isl`` (``costmodels.model``: it carries ``j`` prompts and the decodes of
    the other ``n``; a short output is lengthened for the pricing so that it does); an
    engine that does not mix runs ``j`` prompts alone, as a static batch of ``j`` prefills
    them. At ``j = 1`` this
    is the step ``arrival_figures`` prices (``d + p``); with more prompts per step each is
    priced in the step it shares, where the roofline is compute-bound."""
    base = {k: v for k, v in wl.model_dump().items()
            if k not in ("name", "batch", "concurrency", "arrival", "rate", "requests")}
    S = int(wl.isl)
    j_max = int(max(1, min(-(-wl.max_num_batched_tokens // S), slots)))
    jgrid = concurrency_grid(j_max)
    dec_g, _ = _step_times(table, nonblock, hw, recipe, wl, grid, kw, nkw)
    wls: list[Workload] = []
    for j in jgrid:
        if wl.mixed_prefill:
            for n in [0, *grid]:
                b = int(n) + int(j)
                # the closed loop's mixed step carries min(n, j * (osl' - 1)) decodes: a
                # short output is lengthened so that it carries all n (the decodes' mean
                # context grows by a few tokens at most)
                o2 = max(int(wl.osl), math.ceil(n / j * wl.acceptance) + 2)
                wls.append(Workload(**{**base, "concurrency": b, "max_num_seqs": b, "osl": o2,
                                       "max_num_batched_tokens": int(j) * S}))
        else:
            wls.append(Workload(**{**base, "batch": int(j)}))
    blocks = price_blocks(table, hw, recipe, wls, **kw)
    nb = price_nonblock(nonblock, hw, recipe, wls, step_overhead_s=0.0,
                        request_overhead_s=0.0, **nkw)
    m = summarize(blocks, nb, hw)
    n_all = np.arange(slots + 1, dtype=np.float64)
    gx = np.asarray(grid, dtype=np.float64)
    out = np.empty((slots + 1, len(jgrid) + 1))
    out[:, 0] = np.interp(np.maximum(n_all, 1.0), gx, dec_g)
    if wl.mixed_prefill:
        wc = _workload_columns(wls)
        oeff = 1.0 + (wc["O"][0] - 1.0) / wc["A"][0]
        n_t = np.maximum(wc["NC"][0] - oeff, 0.0) + wc["M"][0]
        mix = (m.ttft_s / n_t).reshape(len(jgrid), len(grid) + 1)
        for c in range(len(jgrid)):  # n = 0 from its own step, then the grid
            out[:, c + 1] = np.interp(n_all, np.concatenate([[0.0], gx]), mix[c])
    else:
        out[:, 1:] = np.asarray(m.ttft_s)[None, :]
    return out, np.concatenate([[0.0], np.asarray(jgrid, dtype=np.float64)])


def _run(wl: Workload, n_req: int, seed: int, warmup: float, slots: int,
         steps_g: np.ndarray, jgrid: np.ndarray, so: float, ro: float, overlap: bool,
         front: float, tp: int) -> ReplayResult:
    """The discrete-event loop (module docstring); ``steps_g[n]`` over ``jgrid``: the GPU
    seconds of a step of ``n`` decodes and ``j`` prompts (:func:`_step_table`)."""
    d_tab = steps_g[:, 0].tolist()
    rows = [r for r in steps_g]
    jg = jgrid
    S, osl = int(wl.isl), int(wl.osl)
    budget = int(wl.max_num_batched_tokens)
    mixed = bool(wl.mixed_prefill)
    need = _decode_steps(n_req, osl, float(wl.acceptance)).tolist()
    arrive = np.full(n_req, np.nan)
    admit = np.full(n_req, np.nan)
    first = np.full(n_req, np.nan)
    end = np.full(n_req, np.nan)
    closed = not wl.open_loop
    clients = int(wl.concurrency or 0)

    # arrival times: an open loop's are known in advance; a closed loop's follow completions
    if closed:
        n0 = min(clients, n_req)
        arrive[:n0] = 0.0
        pending: deque[int] = deque(range(n0))  # arrived, no slot yet
        nxt = n0  # the next request a completion sends
        times: list[float] = []
    else:
        assert wl.rate is not None
        if wl.arrival == "poisson":
            gaps = np.random.default_rng(seed).exponential(1.0 / wl.rate, n_req)
            gaps[0] = 0.0
        else:
            gaps = np.full(n_req, 1.0 / wl.rate)
            gaps[0] = 0.0
        arrive[:] = np.cumsum(gaps)
        times = arrive.tolist()
        pending = deque()
        nxt = 0  # the next open-loop arrival not yet in the queue

    t = 0.0
    G = 0  # decode steps so far (every decode runs in every step that carries decodes)
    prefill: deque[list[int]] = deque()  # [request, prompt tokens left], FIFO
    running: list[tuple[int, int]] = []  # heap of (G at which it ends, request)
    admitted = 0
    steps = 0
    done = 0
    freed: deque[float] = deque([0.0] * slots)  # when each free slot came free, in order

    if wl.arrival == "staggered":  # the closed loop's steady state: progress spread evenly
        n0 = len(pending)
        for k in range(n0):
            i = pending.popleft()
            left = max(1, round(need[i] * (k + 1) / n0)) if need[i] > 0 else 0
            admit[i] = first[i] = -math.inf  # warm-up requests: never counted
            heapq.heappush(running, (G + left, i))
            admitted += 1
            freed.popleft()

    def step_time(g: float) -> float:
        return max(g, so) if overlap else g + so

    def finish(i: int, when: float) -> None:
        nonlocal admitted, done, nxt
        end[i] = when
        admitted -= 1
        freed.append(when)
        done += 1
        if closed and nxt < n_req:
            arrive[nxt] = when
            pending.append(nxt)
            nxt += 1

    while done < n_req:
        if not closed:  # arrivals up to now join the queue
            while nxt < n_req and times[nxt] <= t:
                pending.append(nxt)
                nxt += 1
        while pending and admitted < slots:
            i = pending.popleft()
            # it holds the slot from its arrival or from when the slot came free (the
            # engine takes it in at the next step boundary, t)
            admit[i] = max(arrive[i], freed.popleft())
            prefill.append([i, S])
            admitted += 1
        n_dec = len(running)
        room = budget - (n_dec if mixed else 0)
        if prefill and room > 0:
            # a step with prompt chunks (and, when the engine mixes, every decode)
            if not mixed:
                n_dec = 0
            tok = 0
            ends: list[int] = []
            for item in prefill:
                if tok >= room:
                    break
                take = min(item[1], room - tok)
                item[1] -= take
                tok += take
                if item[1] == 0:
                    ends.append(item[0])
            for _ in ends:
                prefill.popleft()
            g = float(np.interp(tok / S, jg, rows[n_dec]))
            t += step_time(g) + ro * len(ends)
            steps += 1
            if n_dec:
                G += 1
                while running and running[0][0] <= G:
                    finish(heapq.heappop(running)[1], t)
            for i in ends:
                first[i] = t
                if need[i] <= 0:
                    finish(i, t)
                else:
                    heapq.heappush(running, (G + need[i], i))
            continue
        if not running:  # idle: jump to the next arrival
            if closed or nxt >= n_req:  # nothing left can arrive (all requests served)
                break
            t = max(t, times[nxt])
            continue
        # decode-only steps: skip to the next event in one move
        dt = step_time(d_tab[n_dec])
        k = running[0][0] - G
        if not closed and nxt < n_req and admitted < slots:
            k = min(k, max(1, math.ceil((times[nxt] - t) / dt - 1e-12)))
        k = max(k, 1)
        t += k * dt
        G += k
        steps += k
        while running and running[0][0] <= G:
            finish(heapq.heappop(running)[1], t)

    return _figures(wl, n_req, seed, warmup, slots, arrive, admit, first, end, front, steps,
                    t, tp, osl)


def _figures(wl: Workload, n_req: int, seed: int, warmup: float, slots: int,
             arrive: np.ndarray, admit: np.ndarray, first: np.ndarray, end: np.ndarray,
             front: float, steps: int, t_end: float, tp: int, osl: int) -> ReplayResult:
    """Percentiles and time averages over the counted requests (module docstring)."""
    n_warm = int(math.floor(warmup * n_req))
    if not wl.open_loop and n_req > int(wl.concurrency or 0):
        n_warm = max(n_warm, min(int(wl.concurrency or 0), n_req - 1))
    n_warm = min(n_warm, n_req - 1)
    idx = np.arange(n_warm, n_req)
    ok = np.isfinite(admit[idx]) & np.isfinite(first[idx])
    idx = idx[ok]
    ttft = first[idx] - arrive[idx] + front
    lat = end[idx] - arrive[idx] + front
    tpot = (end[idx] - first[idx]) / (osl - 1) if osl > 1 else np.zeros(len(idx))
    wait = admit[idx] - arrive[idx]
    t0 = float(arrive[n_warm]) if len(idx) else 0.0
    t1 = float(np.nanmax(arrive))
    if t1 <= t0:  # a closed loop whose last arrival came with the first (N <= clients)
        t1 = float(np.nanmax(end))
    span = max(t1 - t0, 1e-300)
    served = float(np.count_nonzero((end > t0) & (end <= t1))) / span
    adm = np.where(np.isfinite(admit), admit, t0)  # the staggered start's are in flight
    in_flight = float(np.sum(np.clip(np.minimum(end, t1) - np.maximum(adm, t0), 0, None))) / span
    queued = float(np.sum(np.clip(np.minimum(adm, t1) - np.maximum(arrive, t0), 0, None))) / span
    if len(idx):
        # completions come in bursts (a closed loop's lockstep groups, an open loop's first
        # wave), so a count over the window swings with where its edges fall: Little's law
        # instead, the mean requests admitted over the mean time they hold a slot
        held = end[idx] - np.where(np.isfinite(admit[idx]), admit[idx], t0)
        served = in_flight / float(np.mean(held))
    growth = 0.0
    overloaded = False
    if wl.open_loop:
        # the queue for a slot seen by each arrival in the window: at arrival j, the
        # requests that arrived before it and were admitted after it
        a_idx = np.arange(n_warm, n_req)
        at = arrive[a_idx]
        q = np.arange(n_warm, n_req) - np.searchsorted(np.sort(admit), at, side="right")
        q = np.maximum(q, 0)
        half = len(a_idx) // 2
        if half >= 2:
            tail = max(1, half // 5)
            growth = float(np.mean(q[-tail:]) - np.mean(q[half - tail:half]))
            overloaded = growth > 3.0 * math.sqrt(len(a_idx) - half) + 1.0
    return ReplayResult(
        workload=wl.name, arrival=wl.arrival,
        rate_per_s=float(wl.rate) if wl.rate is not None else None, requests=n_req,
        counted=len(idx), warmup=n_warm, seed=seed, slots=slots,
        ttft_s=Percentiles.of(ttft), tpot_s=Percentiles.of(tpot),
        latency_s=Percentiles.of(lat), queue_wait_s=Percentiles.of(wait),
        served_per_s=served, throughput_tok_s=served * osl / tp, in_flight=in_flight,
        queued=queued, queue_growth=growth, steps=steps, duration_s=float(t_end),
        overloaded=overloaded)
