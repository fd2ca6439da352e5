"""The serving cost of one model on one deployment target: what ``puzzle-nas cost`` prints,
as a library call.

:func:`cost_report` prices a :class:`~nas.arch.ModelArch` (its main blocks and, with
``mtp``, its MTP head) on a :class:`~costmodels.target.Target` for named workloads: the
lockstep figures of :func:`costmodels.model.summarize`, the arrival process's figures where
a workload names one (:func:`costmodels.serving.arrival_figures`), a scheduler replay on
request (:func:`costmodels.replay.replay`), the best throughput under an SLO
(:func:`costmodels.serving.slo_throughput`) and the largest concurrency that fits at a
context length (:func:`costmodels.model.max_concurrency`). Plain data in, a
:class:`CostReport` out; the command line only parses its flags into these arguments and
prints the report.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from costmodels.dtypes import PrecisionRecipe
from costmodels.memory import DEFAULT_RESERVE_BYTES
from costmodels.model import Concurrency, ModelCosts
from costmodels.serving import SLO, SLOPoint
from costmodels.target import Target
from costmodels.workload import Workload
from hwprofiles.errors import InputError
from nas.arch import ModelArch


@dataclass
class CostReport:
    """What :func:`cost_report` priced.

    ``figures``: the JSON object ``puzzle-nas cost --json`` prints (per workload: TTFT,
    TPOT, latency in seconds, throughput in output tokens/s per GPU and per node, memory in
    bytes, and ``arrival`` / ``replay`` objects where priced); ``model``: the lockstep
    figures; ``workloads``: the workloads priced (the engine's defaults filled in);
    ``slo``: ``(workload, best point)`` per workload when an SLO was given;
    ``concurrency``: the largest concurrency at ``context`` tokens, when asked."""

    figures: dict[str, Any]
    model: ModelCosts
    workloads: list[Workload]
    slo: list[tuple[Workload, SLOPoint]] = field(default_factory=list)
    concurrency: Concurrency | None = None


def cost_report(arch: ModelArch, target: Target, recipe: PrecisionRecipe,
                workloads: Sequence[Workload], *, mtp: bool = False,
                context: int | None = None,
                reserve_bytes: float = DEFAULT_RESERVE_BYTES,
                step_overhead_s: float | None = None,
                request_overhead_s: float | None = None, slo: SLO | None = None,
                replay: int | None = None, replay_seed: int = 0) -> CostReport:
    """Price ``arch`` on ``target`` in ``recipe`` for ``workloads`` (module docstring).

    ``workloads`` are taken as given (:meth:`Target.workloads` fills an engine's defaults
    in first, if wanted); with none, only the weights and ``context`` are priced.
    ``mtp``: serve with the MTP head loaded (its weights, KV and state count; a workload
    with ``draft_tokens`` drafts with it); ``context``: tokens at which to report the
    largest concurrency that fits; ``reserve_bytes``: the runtime reserve per GPU;
    ``step_overhead_s`` / ``request_overhead_s``: override the engine's host seconds per
    step / per request; ``slo``: also sweep the concurrency of each workload for the best
    throughput that meets it; ``replay``: also replay that many requests of each workload
    through the engine's scheduler, Poisson arrivals seeded by ``replay_seed``."""
    from costmodels.blocks import price_blocks
    from costmodels.model import max_concurrency, price_nonblock, summarize
    from costmodels.replay import replay as run_replay
    from costmodels.serving import arrival_figures, slo_throughput
    from costmodels.workload import parse_workload
    from nas.arch import serving_table
    from nas.search.blueprint import nonblock_shape

    wls = list(workloads)
    if slo is not None and not wls:
        raise InputError("an SLO needs a workload (its isl and osl)", field="slo")
    if replay is not None and (int(replay) != replay or replay < 1):
        raise InputError(f"expected a positive number of requests, got {replay}",
                         field="replay")
    if replay is not None:
        for w in wls:
            if w.batch is not None:
                raise InputError(f"a replay runs continuous batching: workload {w.name} is "
                                 "a static batch; give concurrency=N", field="replay")
    if any(w.draft_tokens for w in wls) and not (mtp and arch.mtp_blocks):
        raise InputError("a workload drafts tokens but no MTP head is served (mtp and a "
                         "config with MTP layers)", field="draft_tokens")
    arch.check_tp(target.tp, "tp", attention=not target.attention_dp)
    hw = target.hw
    # the main blocks, then the MTP head's rows (nas.arch.mtp_table; the search prices the
    # same rows)
    table, draft = serving_table(arch, mtp)
    shape = nonblock_shape(arch)
    priced = wls or [parse_workload("isl=1,osl=1,batch=1")]
    blocks = price_blocks(table, hw, recipe, priced, **target.block_kwargs(draft))
    nb = price_nonblock(shape, hw, recipe, priced, **target.nonblock_kwargs(draft),
                        step_overhead_s=step_overhead_s, request_overhead_s=request_overhead_s)
    model = summarize(blocks, nb, hw, reserve_bytes=reserve_bytes)
    conc = (max_concurrency(blocks, nb, hw, context, reserve_bytes=reserve_bytes)
            if context is not None else None)

    out = model.to_dict()
    if not wls:
        out["workloads"] = []
    out = {"precision": recipe.name, "kv_dtype": recipe.kv_cache.value, "ep": target.ep,
           "attention_dp": bool(target.attention_dp), "mtp": bool(mtp and arch.mtp_blocks),
           **out}
    if conc is not None:
        out["max_concurrency"] = conc.max_concurrency
        out["concurrency"] = conc.to_dict()
    if target.engine is not None:
        out["engine"] = target.engine
    sk = dict(target.serving_kwargs(), draft=draft, reserve_bytes=reserve_bytes)
    for per, w in zip(out["workloads"], wls):
        if w.arrival != "closed":  # the arrival process's figures replace the lockstep's
            pt = arrival_figures(table, shape, hw, recipe, w, **sk)
            a = pt.to_dict()  # unbounded figures (overload) are None
            per.update(ttft_s=a["ttft_s"], tpot_s=a["tpot_s"], latency_s=a["latency_s"],
                       throughput_tok_s=pt.throughput_tok_s,
                       throughput_node_tok_s=pt.throughput_tok_s * hw.gpus_per_node.value,
                       per_user_tok_s=1.0 / pt.tpot_s if 0 < pt.tpot_s < math.inf else 0.0,
                       arrival=a)
        if replay is not None:  # beside the analytic figures, not instead of them
            per["replay"] = run_replay(table, shape, hw, recipe, w, requests=replay,
                                       seed=replay_seed, **sk).to_dict()
    points = []
    if slo is not None:
        for w in wls:
            points.append((w, slo_throughput(table, shape, hw, recipe, w, slo,
                                             step_overhead_s=step_overhead_s,
                                             request_overhead_s=request_overhead_s, **sk)))
        out["slo"] = [{"workload": w.name, **pt.to_dict()} for w, pt in points]
    return CostReport(out, model, wls, points, conc)
