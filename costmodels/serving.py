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

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from costmodels.blocks import price_blocks
from costmodels.dtypes import PrecisionRecipe
from costmodels.memory import DEFAULT_RESERVE_BYTES
from costmodels.model import ModelCosts, NonBlockShape, max_concurrency, price_nonblock, summarize
from costmodels.shapes import BlockTable
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
    kw = dict(tp=tp, ep=ep, attention_dp=attention_dp, draft=draft)
    nkw = dict(tp=tp, step_overhead_s=step_overhead_s, request_overhead_s=request_overhead_s,
               attention_dp=attention_dp, draft=draft is not None and bool(np.any(draft)),
               engine=engine, engines=engines)
    wl = parse_workload(workload)
    if wl.batch is not None:
        wl = Workload.model_validate({**wl.model_dump(), "batch": None, "concurrency": 1})
    slo = parse_slo(slo)
    probe = [wl.with_sequences(1)]
    blocks1 = price_blocks(table, hw, recipe, probe, **kw)
    nb1 = price_nonblock(nonblock, hw, recipe, probe, **nkw)
    cap = max_concurrency(blocks1, nb1, hw, wl.max_context, reserve_bytes=reserve_bytes)
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
