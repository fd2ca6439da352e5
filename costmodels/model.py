"""Model-level figures from per-block sums plus the non-block term: the serving model.

Notation per workload: ``B`` requests scheduled (the batch, or ``min(concurrency,
max_num_seqs)``), ``S = isl``, ``O = osl``, token budget per engine step ``T_b =
max_num_batched_tokens``, ``tp`` GPUs per model instance. ``t(x)`` is the roofline time of
one engine step of composition ``x`` (``costmodels.blocks`` per block + the non-block term
here, each op ``max(FLOPs / (peak * eff), bytes / (bw * eff)) + kernels * overhead``), plus
the engine's per-step overhead ``s_o``; ``r_o`` is its per-request overhead. Both belong to
the serving engine, not the device (``hwprofiles.engines``: one profile per engine, shared
by every GPU).

**Continuous batching with chunked prefill** (``concurrency=B``, the default; vLLM,
TensorRT-LLM and SGLang schedule this way). A step carries the decode token of every
running request plus prompt chunks up to the budget. A closed-loop benchmark with fixed
``S``/``O`` starts its B requests together; when the ``B*S`` prompt tokens need ``n_c =
B*S / T_b`` steps (on average: in steady state the budget binds), the requests finish prefill (and later finish, and are replaced)
in ``n_c`` groups of ``B / n_c``, one step apart, and stay so: the steady state is a cycle
in which each group prefills in its own step while the others decode. With ``O' = 1 +
(O - 1) / A`` steps per request (``A`` tokens per step with speculative decoding, else 1):

* a **mixed step** carries ``c = B*S / n_c`` prompt tokens and the decodes of
  ``B * min(n_c - 1, O' - 1) / n_c`` sequences; a **decode step** the decodes of all B;
* ``cycle = n_c * t(mixed) + max(O' - n_c, 0) * t(decode)``: every request's latency;
* ``ttft_s = (max(n_c - O', 0) + m) * t(mixed) + r_o`` (``m = max(1, S / c)`` steps carry
  one prompt; ``n_c > O'`` means prompts queue for ``n_c - O'`` steps);
* ``tpot_s = (cycle + B * r_o - ttft_s) / (O - 1)``: the mean time between a request's
  tokens, prefill chunks and host work for the other groups included (what a user sees);
* ``runtime_s = cycle + B * r_o``: the engine's host loop admits and retires the B
  requests of a cycle one by one, in its critical path (this is what caps short-request
  throughput in the published tables); ``latency_s = ttft_s + (O - 1) * tpot_s =
  runtime_s``;
* ``throughput_tok_s = B * O / (runtime_s * tp)`` output tokens/s **per GPU**;
  ``throughput_node_tok_s = throughput_tok_s * gpus_per_node`` (replicas fill the node);
  ``per_user_tok_s = 1 / tpot_s``.

With an unlimited token budget (``T_b >= B*S``, ``max_num_seqs >= B``) ``n_c = 1``: one
step prefills all B prompts (no decodes in it), then ``O - 1`` decode steps: **exactly
static batch mode** (``batch=B``), TTFT = that pass. Requests beyond ``max_num_seqs``
wait; the figures are those of the running ones.

Every term is a block sum plus the non-block term with coefficients that depend on the
workload only (``costmodels.blocks.serving_shares``), so ``throughput_tok_s >= X  <=>
sum_i runtime_s[i] + nonblock.runtime_s <= B*O/(X*tp)`` and ``per_user_tok_s >= U  <=>
sum_i decode_s[i] + nonblock.decode_s <= 1/U`` stay linear bounds for the search.
Throughput grows with B until memory binds; ``costmodels.serving.slo_throughput`` sweeps B
for the best throughput under a per-user speed / TTFT floor that fits.

* ``memory_bytes = weights + B * (kv_bytes(S + O) + state) + workspace + reserve`` (per
  GPU); all but the workspace (a max over blocks) and the reserve are sums over blocks.

**Overlap scheduling.** SGLang's zero-overhead scheduler and TensorRT-LLM's overlap
scheduler prepare step k+1 on the CPU while the GPU runs step k (the engine profile's
``overlap``), so a step takes ``max(g, s_o)`` instead of ``g + s_o`` (``g``: its GPU time);
``r_o`` is never hidden. :func:`summarize` applies it when the non-block term was priced for
such an engine (``price_nonblock(engine=...)``): it recovers each step's ``t(mixed)`` and
``t(decode)`` from the TTFT and cycle sums above (their step counts are the workload's) and
re-derives TTFT, TPOT and the cycle with ``max(g, s_o)`` per step. The per-block shares
keep the additive ``g + s_o`` (an upper bound, exact when ``s_o <= 0`` or the engine does
not overlap), so the search's bounds stay linear; it prices with no engine named.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from costmodels import ops
from costmodels.blocks import (
    BlockCosts,
    _workload_columns,
    decode_steps,
    price_blocks,
    serving_shares,
)
from costmodels.dtypes import PrecisionRecipe, TensorRole
from costmodels.memory import (
    DEFAULT_PREFILL_CHUNK,
    DEFAULT_RESERVE_BYTES,
    fit_concurrency,
    memory_bytes,
)
from costmodels.memory import workspace_bytes as _workspace
from costmodels.parallel import check_parallel
from costmodels.roofline import Roof
from costmodels.shapes import BlockTable
from costmodels.workload import Workload, parse_workload
from hwprofiles.engines import (
    DEFAULT_ENGINE,
    available_engines,
    compute_dtype,
    find_engine,
    split_version,
)
from hwprofiles.errors import InputError
from hwprofiles.schema import EngineProfile, HardwareProfile

K_NONBLOCK = 4  # embedding, final norm, LM head, sampling


@dataclass(frozen=True)
class NonBlockShape:
    """The parts of a model outside its blocks: embeddings, final norm, LM head."""

    hidden: int
    vocab: int
    tied: bool = False
    final_norm: bool = True


@dataclass
class NonBlockCosts:
    """The non-block term, per workload (``[W]`` arrays) and per GPU.

    ``prefill_s`` / ``decode_s`` / ``runtime_s`` have the meaning of the per-block fields in
    :class:`costmodels.blocks.BlockCosts`; they include the engine's ``step_overhead_s``
    per engine step, and ``prefill_s`` its ``request_overhead_s`` (TTFT only).
    ``weight_bytes``: embedding + LM head + final norm.
    ``vocab_per_gpu``: LM-head columns per GPU (sizes the fp32 logits workspace).
    """

    prefill_s: np.ndarray
    decode_s: np.ndarray
    runtime_s: np.ndarray
    weight_bytes: float
    vocab_per_gpu: float
    hidden: int
    request_overhead_s: float = 0.0
    step_overhead_s: float = 0.0
    overlap: bool = False
    request_latency_s: float = 0.0
    """The engine's front-end seconds before a first token reaches the client: added to
    TTFT by :func:`summarize` (not in ``prefill_s``: no step waits for it)."""
    host_ranks: int = 1
    """Engine loops that share a cycle's per-request host work (the attention data-parallel
    ranks, each admitting its own requests; 1 otherwise)."""


def engine_figures(hw: HardwareProfile, engine: str | None = None,
                   engines: Mapping[str, EngineProfile] | None = None
                   ) -> tuple[float, float, bool]:
    """``(step_overhead_s, request_overhead_s, overlap)`` of the serving engine ``engine``.

    An engine profile (``engines`` first, then the shipped ones: ``hwprofiles.engines``)
    gives them; they belong to the engine, not the device (``hw`` is read for nothing
    here). No engine named: :data:`hwprofiles.engines.DEFAULT_ENGINE`'s profile. An engine
    no profile names raises :class:`InputError`."""
    given = dict(engines) if engines else None
    prof = find_engine(engine or DEFAULT_ENGINE, given)
    if prof is None:
        if engine:  # a misspelt name is not 'none'
            raise InputError(f"unknown serving engine {engine!r}; expected one of "
                             f"{', '.join(available_engines())}", field="engine")
        return 0.0, 0.0, False
    return (float(prof.step_overhead_s.value), float(prof.request_overhead_s.value),
            prof.overlaps(split_version(engine)[1] if engine else None))


def engine_limits(hw: HardwareProfile, engine: str | None = None,
                  engines: Mapping[str, EngineProfile] | None = None) -> dict[str, int | bool]:
    """How the engine ``engine`` schedules on ``hw`` by default, as :class:`Workload` fields:
    ``max_num_batched_tokens`` / ``max_num_seqs`` (its token-budget rule for the device's
    memory, :meth:`EngineProfile.budget`) and ``mixed_prefill``; only the fields its
    profile gives (``{}`` for no engine or a device-profile engine)."""
    prof = find_engine(engine or DEFAULT_ENGINE, dict(engines) if engines else None)
    if prof is None:
        return {}
    out: dict[str, int | bool] = {"mixed_prefill": prof.mixed_prefill}
    rule = prof.budget(hw.memory_bytes.value, hw.name)
    if rule is not None:
        out["max_num_batched_tokens"] = rule.max_num_batched_tokens
        if rule.max_num_seqs is not None:
            out["max_num_seqs"] = rule.max_num_seqs
    return out


def engine_latency(engine: str | None = None,
                   engines: Mapping[str, EngineProfile] | None = None) -> float:
    """The engine's front-end seconds per request before its first token reaches the client
    (``EngineProfile.request_latency_s``; 0 when no engine profile is named or found)."""
    prof = find_engine(engine, dict(engines) if engines else None) if engine else None
    return float(prof.request_latency_s.value) if prof is not None else 0.0


def engine_overheads(hw: HardwareProfile, step_overhead_s: float | None = None,
                     request_overhead_s: float | None = None,
                     engine: str | None = None,
                     engines: Mapping[str, EngineProfile] | None = None) -> tuple[float, float]:
    """The engine's per-step and per-request seconds: the arguments where given, else those
    of :func:`engine_figures` (the engine profile of ``engine``)."""
    so, ro, _ = engine_figures(hw, engine, engines)
    return (so if step_overhead_s is None else float(step_overhead_s),
            ro if request_overhead_s is None else float(request_overhead_s))


def price_nonblock(shape: NonBlockShape, hw: HardwareProfile, recipe: PrecisionRecipe,
                   workloads: Sequence[Workload | str], tp: int = 1,
                   step_overhead_s: float | None = None,
                   request_overhead_s: float | None = None, attention_dp: bool = False,
                   draft: bool = False, engine: str | None = None,
                   engines: Mapping[str, EngineProfile] | None = None,
                   overlap: bool | None = None,
                   measured: Callable[[Workload], tuple[float, float]] | None = None
                   ) -> NonBlockCosts:
    """Price embeddings + final norm + LM head (vocab-sharded over ``tp``) per workload,
    plus the engine's overheads (see the module docstring).

    ``measured``: ``workload -> (mixed step, decode step)`` seconds of the non-block parts as
    a profile timed them (:func:`costmodels.measured.nonblock_steps`; one device), taken
    instead of the roofline's; the engine's overheads are added to them alike.

    In a prefill chunk step the LM head runs on the last token of the prompts that finish in
    it (``B / n_c``); in decode on the B tokens of the step. ``step_overhead_s`` is added once
    per engine step and ``request_overhead_s`` to TTFT; ``None`` takes the figure of the
    engine profile ``engine`` names (:func:`engine_figures`; ``engines``: profiles that
    take precedence over the shipped ones). ``overlap``: whether :func:`summarize` hides
    the step overhead behind GPU time (``None``: the named engine's own ``overlap``, off
    when no engine is named).
    With ``attention_dp`` each GPU embeds and samples its own ``1/tp`` of the sequences with
    the whole (unsharded) LM head. With speculative decoding (``draft_tokens = d``) a
    verification step runs the LM head on ``B * (1 + d)`` tokens, and ``draft`` (an MTP
    head is loaded) adds its ``d`` draft passes over B tokens; decode time is per output
    token (divided by ``acceptance``).
    """
    check_parallel(tp, 1)
    so, ro = engine_overheads(hw, step_overhead_s, request_overhead_s, engine, engines)
    if overlap is None:
        overlap = bool(engine) and engine_figures(hw, engine, engines)[2]
    wls = tuple(parse_workload(w) for w in workloads)
    dp, vs = (tp, 1) if attention_dp else (1, tp)
    h, v = float(shape.hidden), float(-(-shape.vocab // vs))
    roof = Roof(hw)
    a = recipe.activations.bytes
    we, wl, wo = (recipe.weight_bytes_per_param(r) for r in
                  (TensorRole.EMBEDDINGS, TensorRole.LM_HEAD, TensorRole.OTHER))
    eng_pool = dict(engines) if engines else None
    dt = compute_dtype(hw, recipe.weight_dtype(TensorRole.LM_HEAD).value, engine, eng_pool)
    act_dt = compute_dtype(hw, recipe.activations.value, engine, eng_pool)

    def step(tokens: np.ndarray, heads: np.ndarray, so: float = so) -> np.ndarray:
        fe, be = ops.embedding(tokens, h, we, a)
        fn, bn = (ops.norm_residual(heads, h, a, wo) if shape.final_norm else (0.0, 0.0))
        fl, bl = ops.lm_head(heads, h, v, wl, a)
        t = roof.time(fe + fn, be + bn, roof.matmul(act_dt, fe + fn), roof.memory(be + bn), 2)
        t = t + roof.time(fl, bl, roof.matmul(dt, fl), roof.memory(bl), 2)
        return t + so

    wc = _workload_columns(wls)
    B = wc["B"][0] / dp
    NC, S, Osl, D, A = (wc[k][0] for k in ("NC", "S", "O", "D", "A"))
    oeff = 1.0 + (Osl - 1.0) / A
    Bp = B / NC
    Dm = wc["MX"][0] * B * np.minimum(NC - 1.0, oeff - 1.0) / NC
    if measured is not None:  # timed on the device (one device, no speculative decoding)
        if tp != 1 or attention_dp or draft or np.any(D > 0):
            raise ValueError("measured non-block steps are of one device without "
                             "speculative decoding")
        timed = np.array([measured(w) for w in wls], dtype=np.float64).reshape(len(wls), 2)
        mix, dec = timed[:, 0] + so, timed[:, 1] + so
    else:
        mix = step(Bp * S + Dm * (1 + D), Bp + Dm * (1 + D))
        dec = step(B * (1 + D), B * (1 + D))
    if draft:
        mix = mix + D * step(Dm, Dm, 0.0)
        dec = dec + D * step(B, B, 0.0)
    ttft, tpot, cycle = serving_shares(mix[None, :], dec[None, :], wc)
    emb = shape.hidden * shape.vocab
    params_gpu = -(-emb // vs) * (we + (0.0 if shape.tied else wl))
    weight = params_gpu + (shape.hidden * wo if shape.final_norm else 0.0)
    # the host admits and retires the B requests of a cycle one by one, in the engine loop;
    # under attention data parallelism each of the dp ranks runs its own engine loop over
    # its own B / dp requests (TensorRT-LLM's PyExecutor per rank, SGLang's DP schedulers)
    host = wc["B"][0] / dp * ro
    tpot = np.where(Osl > 1, tpot[0] + np.maximum(host - ro, 0.0) / np.maximum(Osl - 1.0, 1.0), tpot[0])
    lat = engine_latency(engine, engines) if request_overhead_s is None else 0.0
    return NonBlockCosts(prefill_s=ttft[0] + ro, decode_s=tpot, request_latency_s=lat, runtime_s=cycle[0] + host,
                         weight_bytes=float(weight), vocab_per_gpu=v, hidden=shape.hidden,
                         request_overhead_s=ro, step_overhead_s=so, overlap=bool(overlap),
                         host_ranks=dp)


@dataclass
class ModelCosts:
    """Serving figures per workload (``[W]`` arrays; see the module docstring for formulas).

    Bytes are per GPU; ``fits`` says whether ``memory_bytes <= hw.memory_bytes``.
    """

    workloads: tuple[Workload, ...]
    device: str
    tp: int
    gpus_per_node: int
    ttft_s: np.ndarray
    tpot_s: np.ndarray
    latency_s: np.ndarray
    runtime_s: np.ndarray
    throughput_tok_s: np.ndarray
    throughput_node_tok_s: np.ndarray
    per_user_tok_s: np.ndarray
    weight_bytes: float
    kv_bytes: np.ndarray
    state_bytes: np.ndarray
    workspace_bytes: np.ndarray
    reserve_bytes: float
    memory_bytes: np.ndarray
    usable_bytes: float
    fits: np.ndarray

    def to_dict(self) -> dict:
        """Plain JSON-able dict: top-level scalars and a list of per-workload dicts."""
        per = []
        for i, w in enumerate(self.workloads):
            per.append({
                "name": w.name, "isl": w.isl, "osl": w.osl, "batch": w.batch,
                "concurrency": w.concurrency,
                "ttft_s": float(self.ttft_s[i]), "tpot_s": float(self.tpot_s[i]),
                "latency_s": float(self.latency_s[i]),
                "throughput_tok_s": float(self.throughput_tok_s[i]),
                "throughput_node_tok_s": float(self.throughput_node_tok_s[i]),
                "per_user_tok_s": float(self.per_user_tok_s[i]),
                "memory_bytes": float(self.memory_bytes[i]),
                "kv_bytes": float(self.kv_bytes[i]), "state_bytes": float(self.state_bytes[i]),
                "workspace_bytes": float(self.workspace_bytes[i]),
                "fits": bool(self.fits[i]),
            })
        return {"device": self.device, "tp": self.tp, "gpus_per_node": self.gpus_per_node,
                "weight_bytes": self.weight_bytes, "reserve_bytes": self.reserve_bytes,
                "usable_bytes": self.usable_bytes, "workloads": per}


def _rows(blocks: BlockCosts, rows: Sequence[int] | np.ndarray | None) -> BlockCosts:
    return blocks if rows is None else blocks.take(rows)


def workspace_bytes(blocks: BlockCosts, nonblock: NonBlockCosts, tokens: np.ndarray | float,
                    logit_rows: np.ndarray | float) -> np.ndarray:
    """Activation workspace per GPU for a pass of ``tokens`` in-flight tokens, bytes:
    ``tokens * max_i workspace_bytes_per_token[i]`` + ``logit_rows`` fp32 logit rows."""
    widest = float(blocks.workspace_bytes_per_token.max()) if len(blocks) else 0.0
    return _workspace(widest, tokens, logit_rows, nonblock.vocab_per_gpu)


def step_workspace_bytes(blocks: BlockCosts, nonblock: NonBlockCosts,
                         sequences: np.ndarray | float, isl: np.ndarray | float,
                         prefill_chunk: np.ndarray | float = DEFAULT_PREFILL_CHUNK
                         ) -> np.ndarray:
    """Activation workspace per GPU of B = ``sequences`` running requests of ``isl``-token
    prompts, bytes: the widest pass, ``min(B * isl, prefill_chunk)`` prompt tokens (the
    engine's token budget per step, ``max_num_batched_tokens``) but at least a decode
    step's B, with B fp32 logit rows. The one workspace both
    :func:`summarize` and :func:`max_concurrency` hold back, so a concurrency that
    :func:`max_concurrency` returns fits in :func:`summarize` by construction."""
    B = np.asarray(sequences, dtype=np.float64)
    S = np.asarray(isl, dtype=np.float64)
    return workspace_bytes(blocks, nonblock, np.maximum(np.minimum(B * S, prefill_chunk), B), B)


def workload_workspace_bytes(blocks: BlockCosts, nonblock: NonBlockCosts,
                             prefill_chunk: int | None = None) -> np.ndarray:
    """``[W]`` activation workspace per GPU of each of ``blocks``' workloads, bytes
    (:func:`step_workspace_bytes` at its B and isl, chunked at its engine's token budget
    ``max_num_batched_tokens`` unless ``prefill_chunk`` is given)."""
    wls = blocks.workloads
    B = np.array([max(w.sequences, w.prefill_sequences) for w in wls], dtype=np.float64)
    S = np.array([w.isl for w in wls], dtype=np.float64)
    chunk = np.array([w.max_num_batched_tokens if prefill_chunk is None else prefill_chunk
                      for w in wls], dtype=np.float64)
    return step_workspace_bytes(blocks, nonblock, B, S, chunk)


def concurrency_workspace_bytes(blocks: BlockCosts, nonblock: NonBlockCosts, context: int,
                                prefill_chunk: int = DEFAULT_PREFILL_CHUNK,
                                sequences: int = 1, isl: int | None = None) -> float:
    """Activation workspace per GPU at ``sequences`` requests of ``isl`` (default
    ``context``) prompt tokens: :func:`step_workspace_bytes`."""
    return float(step_workspace_bytes(blocks, nonblock, float(sequences),
                                      float(context if isl is None else isl), prefill_chunk))


def _overlapped(wls: Sequence[Workload], ttft: np.ndarray, tpot: np.ndarray,
                runtime: np.ndarray, so: float, ro: float, ranks: int = 1
                ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """TTFT, TPOT and cycle time with each step at ``max(g, so)`` instead of ``g + so``
    (module docstring, overlap scheduling): the additive sums are inverted to the mixed and
    decode step times through the workload's step counts (``serving_shares``)."""
    wc = _workload_columns(wls)
    NC, Osl, A, M, B = (wc[k][0] for k in ("NC", "O", "A", "M", "B"))
    oeff = 1.0 + (Osl - 1.0) / A
    n_t = np.maximum(NC - oeff, 0.0) + M  # steps in a TTFT
    n_d = decode_steps(wc)[0]  # decode steps in a cycle
    host = B / ranks * ro
    mix = (ttft - ro) / n_t
    cycle = runtime - host
    dec = np.where(Osl > 1, np.where(n_d > 0, (cycle - NC * mix) / np.maximum(n_d, 1e-12),
                                     so), tpot * A)
    mix2, dec2 = np.maximum(mix - so, so), np.maximum(dec - so, so)
    ttft2 = n_t * mix2 + ro
    cycle2 = NC * mix2 + n_d * dec2
    tpot2 = np.where(Osl > 1, (cycle2 + host - ttft2) / np.maximum(Osl - 1.0, 1.0), dec2 / A)
    return ttft2, tpot2, cycle2 + host


def spec_state_snapshots(workloads: Sequence[Workload]) -> np.ndarray:
    """``[W]`` recurrent-state snapshots per sequence that speculative decoding keeps beside
    the request's own state (one per verified position, ``1 + d``; 0 without drafts): a
    sequence holds ``1 + snapshots`` states (rollback; ``costmodels.blocks.SPEC_STATE_COPY``)."""
    return np.array([w.draft_tokens + 1.0 if w.draft_tokens > 0 else 0.0 for w in workloads])


def summarize(blocks: BlockCosts, nonblock: NonBlockCosts, hw: HardwareProfile,
              rows: Sequence[int] | np.ndarray | None = None,
              reserve_bytes: float = DEFAULT_RESERVE_BYTES,
              prefill_chunk: int | None = None) -> ModelCosts:
    """Model figures for the model made of ``rows`` of ``blocks`` (default: all) + non-block.

    Workspace tokens per workload: ``min(prefill tokens of one pass, prefill_chunk)`` but at
    least B (a decode step); ``prefill_chunk`` defaults to each workload's engine token
    budget (``max_num_batched_tokens``: 8,192 unless the engine's rule or the workload
    says otherwise, e.g. SGLang's 16,384 on B200).
    """
    b = _rows(blocks, rows)
    wls = b.workloads
    B = np.array([w.sequences for w in wls], dtype=np.float64)
    osl = np.array([w.osl for w in wls], dtype=np.float64)
    ttft = b.prefill_s.sum(axis=0) + nonblock.prefill_s
    tpot = b.decode_s.sum(axis=0) + nonblock.decode_s
    runtime = b.runtime_s.sum(axis=0) + nonblock.runtime_s
    if nonblock.overlap and nonblock.step_overhead_s > 0:
        t2, p2, r2 = _overlapped(wls, ttft, tpot, runtime, nonblock.step_overhead_s,
                                 nonblock.request_overhead_s, nonblock.host_ranks)
        # a block the engine cannot overlap for (EngineProfile.no_overlap) keeps the sum
        on = np.ones(len(wls), bool) if b.no_overlap is None or not len(b) \
            else ~b.no_overlap.any(axis=0)
        ttft, tpot, runtime = (np.where(on, x2, x) for x2, x in
                               ((t2, ttft), (p2, tpot), (r2, runtime)))
    ttft = ttft + nonblock.request_latency_s
    tp = b.tp
    thr = B * osl / (runtime * tp)
    gpn = int(hw.gpus_per_node.value)
    weights = float(b.weight_bytes.sum()) + nonblock.weight_bytes
    ctx = np.array([w.max_context for w in wls], dtype=np.float64)
    kv = B * np.array([float(b.kv_bytes(c).sum()) for c in ctx])
    # speculative decoding keeps one state snapshot per verified position beside the
    # request's own (rollback; costmodels.blocks.SPEC_STATE_COPY): 1 + (1 + d) states
    snaps = spec_state_snapshots(wls)
    state = B * float(b.state_bytes_per_sequence.sum()) * (1.0 + snaps)
    ws = workload_workspace_bytes(b, nonblock, prefill_chunk)
    mem = memory_bytes(weights, kv / B, state / B, B, ws, reserve_bytes)
    usable = hw.memory_bytes.value
    return ModelCosts(
        workloads=wls, device=hw.name, tp=tp, gpus_per_node=gpn, ttft_s=ttft, tpot_s=tpot,
        latency_s=ttft + (osl - 1.0) * tpot, runtime_s=runtime, throughput_tok_s=thr,
        throughput_node_tok_s=thr * gpn, per_user_tok_s=1.0 / tpot, weight_bytes=weights,
        kv_bytes=kv, state_bytes=state + 0.0 * B, workspace_bytes=ws,
        reserve_bytes=float(reserve_bytes), memory_bytes=mem, usable_bytes=usable,
        fits=mem <= usable,
    )


@dataclass
class Concurrency:
    """The largest number of sequences of ``context`` tokens that fit in one GPU's memory.

    ``max_concurrency = floor((usable - weights - workspace - reserve) / per_sequence)``
    (0 when even the weights do not fit); bytes per GPU.
    """

    context: int
    max_concurrency: int
    usable_bytes: float
    weight_bytes: float
    workspace_bytes: float
    reserve_bytes: float
    kv_bytes_per_sequence: float
    state_bytes_per_sequence: float
    free_bytes: float = field(default=0.0)

    @property
    def per_sequence_bytes(self) -> float:
        return self.kv_bytes_per_sequence + self.state_bytes_per_sequence

    def to_dict(self) -> dict:
        return {"context": self.context, "max_concurrency": self.max_concurrency,
                "usable_bytes": self.usable_bytes, "weight_bytes": self.weight_bytes,
                "workspace_bytes": self.workspace_bytes, "reserve_bytes": self.reserve_bytes,
                "kv_bytes_per_sequence": self.kv_bytes_per_sequence,
                "state_bytes_per_sequence": self.state_bytes_per_sequence,
                "per_sequence_bytes": self.per_sequence_bytes, "free_bytes": self.free_bytes}


def max_concurrency(blocks: BlockCosts, nonblock: NonBlockCosts, hw: HardwareProfile,
                    context: int, rows: Sequence[int] | np.ndarray | None = None,
                    reserve_bytes: float = DEFAULT_RESERVE_BYTES,
                    prefill_chunk: int | None = None,
                    workload: Workload | None = None) -> Concurrency:
    """Largest concurrency n whose memory, as :func:`summarize` counts it, fits: weights +
    n * (KV at ``context`` tokens + state) + the workspace of n requests
    (:func:`step_workspace_bytes`) + reserve (see :class:`Concurrency`). ``workload``: the
    workload it is for (its prompt length sizes the workspace, default ``context``; its
    speculative decoding keeps state snapshots per sequence; its ``max_num_batched_tokens``
    is the prefill chunk unless ``prefill_chunk`` is given, default 8,192), so that
    ``summarize(...).fits`` holds at the returned concurrency by construction."""
    if int(context) != context or context < 1:
        raise InputError(f"context must be a positive integer, got {context!r}", field="context")
    b = _rows(blocks, rows)
    weights = float(b.weight_bytes.sum()) + nonblock.weight_bytes
    kv = float(b.kv_bytes(context).sum())
    snaps = float(spec_state_snapshots([workload])[0]) if workload is not None else 0.0
    state = float(b.state_bytes_per_sequence.sum()) * (1.0 + snaps)
    isl = int(workload.isl) if workload is not None else int(context)
    chunk = prefill_chunk if prefill_chunk is not None else (
        workload.max_num_batched_tokens if workload is not None else DEFAULT_PREFILL_CHUNK)
    usable = hw.memory_bytes.value
    per = kv + state

    def ws(n: int) -> float:
        return concurrency_workspace_bytes(b, nonblock, context, chunk, n, isl)

    def fits(n: int) -> bool:
        return weights + n * per + ws(n) + reserve_bytes <= usable

    free = usable - weights - ws(1) - reserve_bytes
    if free > 0 and per <= 0:
        raise InputError("the model keeps no per-sequence memory (no KV cache, no state): "
                         "concurrency is not memory-bound", field="context")
    n = 0
    if fits(1):  # memory grows with n: bisect [1, the count without the workspace's growth]
        lo, hi = 1, max(1, fit_concurrency(usable, weights, per, ws(1), reserve_bytes))
        while lo < hi:
            mid = (lo + hi + 1) // 2
            lo, hi = (mid, hi) if fits(mid) else (lo, mid - 1)
        n = lo
    return Concurrency(context=int(context), max_concurrency=n, usable_bytes=usable,
                       weight_bytes=weights, workspace_bytes=ws(max(n, 1)),
                       reserve_bytes=float(reserve_bytes),
                       kv_bytes_per_sequence=kv, state_bytes_per_sequence=state, free_bytes=free)


def price_model(table: BlockTable, nonblock: NonBlockShape, hw: HardwareProfile | str,
                recipe: PrecisionRecipe | str,
                workloads: Sequence[Workload | str] | Workload | str, tp: int = 1,
                ep: int = 1, reserve_bytes: float = DEFAULT_RESERVE_BYTES,
                step_overhead_s: float | None = None,
                request_overhead_s: float | None = None, attention_dp: bool = False,
                draft: np.ndarray | Sequence[bool] | None = None) -> ModelCosts:
    """One call: price every block and the non-block term, then :func:`summarize`
    (overheads in seconds, ``None``: the default engine's, :func:`engine_figures`;
    ``attention_dp`` / ``draft``: see :func:`costmodels.blocks.price_blocks`).

    ``hw`` is a profile or its name / JSON path (:func:`hwprofiles.get`), ``recipe`` a
    recipe or its name (:func:`costmodels.dtypes.get_recipe`), ``workloads`` one workload
    (a :class:`Workload` or ``"isl=8192,osl=1024,concurrency=16"``) or a list of them."""
    if isinstance(hw, str):
        import hwprofiles

        hw = hwprofiles.get(hw)
    elif not isinstance(hw, HardwareProfile):
        raise InputError(f"expected a HardwareProfile or a profile name, got "
                         f"{type(hw).__name__}", field="hw")
    if isinstance(recipe, str):
        from costmodels.dtypes import get_recipe

        recipe = get_recipe(recipe)
    elif not isinstance(recipe, PrecisionRecipe):
        raise InputError(f"expected a PrecisionRecipe or a recipe name, got "
                         f"{type(recipe).__name__}", field="recipe")
    if isinstance(workloads, str | Workload | dict):
        workloads = [workloads]  # one workload, not its characters
    wls = tuple(parse_workload(w) for w in workloads)
    blocks = price_blocks(table, hw, recipe, wls, tp=tp, ep=ep, attention_dp=attention_dp,
                          draft=draft)
    nb = price_nonblock(nonblock, hw, recipe, wls, tp=tp, step_overhead_s=step_overhead_s,
                        request_overhead_s=request_overhead_s, attention_dp=attention_dp,
                        draft=draft is not None and bool(np.any(draft)))
    return summarize(blocks, nb, hw, reserve_bytes=reserve_bytes)
