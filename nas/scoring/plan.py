"""``puzzle-nas score --plan``: memory per rank and time per phase of a scoring run, before
anything is loaded (no torch).

Memory per rank (bytes), for the segments :func:`nas.scoring.stages.placement` places:

* **weights**: the blocks of the rank's segments (rank 0 also the embedding, final norm and LM head) in the
  compute dtype;
* **cache**: the prefix cache of :mod:`nas.scoring.cache` (in memory up to ``--cache-gib``,
  the rest spilled to the output folder, reported apart): held-out rows at the inputs of
  the rank's blocks, calibration rows at those and each segment's last boundary (BLD's
  target), and on rank 0 the teacher target (the last boundary of the held-out rows);
* **activations**: one batch in flight through the widest block of the rank
  (``costmodels``' workspace bytes per token), the float64 logits of one chunk of
  positions on rank 0 (:data:`nas.scoring.core.CHUNK_BYTES`, teacher and student, with
  their log-softmax), and the sends of two alternatives' held-out streams not yet received;
* **optimizer** (BLD only): the largest alternative block of the rank four times (weights,
  gradients, AdamW's two moments) plus the initialized copy BLD is compared with, and the
  activations autograd keeps for one BLD batch through it.

Time per phase (seconds) is a roofline lower bound from the project's hardware profile: the
dense GEMM FLOPs of each phase at the profile's matmul peak and efficiency for the compute
dtype, on the busiest rank (the phases run as a pipeline, so the busiest stage sets the
pace). It leaves out attention's quadratic term, the host, and communication.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from costmodels.shapes import params as block_params
from hwprofiles.schema import HardwareProfile
from nas.arch import ModelArch, blocks_table
from nas.scoring.job import Settings
from nas.scoring.stages import placement, rank_ranges
from nas.space import Alternative

DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
CHUNK_BYTES = 16 * 2**20  # nas.scoring.core.CHUNK_BYTES (torch-free copy, checked in tests)


@dataclass(frozen=True)
class RankPlan:
    """One rank's share: its block ranges ``[a, b)`` and bytes of each kind."""

    rank: int
    blocks: tuple[tuple[int, int], ...]
    weights: float
    cache: float
    """Prefix-cache bytes held in memory (up to ``--cache-gib``)."""
    spilled: float
    """Prefix-cache bytes beyond ``--cache-gib``, written to the output folder."""
    activations: float
    optimizer: float

    @property
    def total(self) -> float:
        return self.weights + self.cache + self.activations + self.optimizer


@dataclass(frozen=True)
class Plan:
    """A scoring run's plan (see the module docstring)."""

    ranks: tuple[RankPlan, ...]
    phases: dict[str, float]
    items: int
    held_tokens: int
    calib_tokens: int
    dtype: str
    hardware: str
    capacity: float | None

    def fits(self) -> bool:
        return self.capacity is None or max(r.total for r in self.ranks) <= self.capacity

    def lines(self) -> list[str]:
        gib = 2**30
        out = [f"plan: {len(self.ranks)} rank(s), {self.items} alternatives, "
               f"{self.held_tokens:,} held-out + {self.calib_tokens:,} calibration tokens, "
               f"{self.dtype}; memory in GiB (2^30 bytes)"]
        out.append(f"{'rank':>4} {'blocks':>13} {'weights':>9} {'cache':>8} {'activ.':>8} "
                   f"{'optim.':>8} {'total':>8} {'on disk':>8}")
        for r in self.ranks:
            blocks = ",".join(f"{a}-{b - 1}" for a, b in r.blocks)
            out.append(f"{r.rank:>4} {blocks:>13} "
                       f"{r.weights / gib:9.2f} {r.cache / gib:8.2f} "
                       f"{r.activations / gib:8.2f} {r.optimizer / gib:8.2f} "
                       f"{r.total / gib:8.2f} {r.spilled / gib:8.2f}")
        if self.capacity is not None:
            out.append(f"capacity per rank: {self.capacity / gib:.2f} GiB "
                       f"({'fits' if self.fits() else 'does not fit'})")
        t = ", ".join(f"{k} {v:,.1f} s" for k, v in self.phases.items())
        out.append(f"time on {self.hardware} (roofline lower bound, busiest rank): {t}")
        return out


def _alt_params(alt: Alternative, hidden: int) -> float:
    blocks = list(alt.blocks) if alt.end is not None else [alt.child]
    if not blocks:
        return 0.0
    return float(block_params(blocks_table(blocks, hidden)).sum())


def plan(arch: ModelArch, alts: list[list[Alternative]], settings: Settings, world: int,
         hw: HardwareProfile, dtype: str, capacity: float | None = None,
         cache_bytes: float = float("inf")) -> Plan:
    """The plan of scoring ``alts`` of ``arch`` on ``world`` ranks (one rank: the whole
    parent in one process; more: sharded as pipeline stages)."""
    from costmodels.blocks import price_blocks
    from costmodels.dtypes import get_recipe
    from costmodels.roofline import Roof

    e = DTYPE_BYTES[dtype]
    h, v, L = arch.hidden_size, arch.vocab_size, arch.num_blocks
    seq, bs = settings.seq_len, settings.batch_size
    held = settings.max_tokens // seq * seq
    calib = settings.calib_tokens // seq * seq
    segments = [(0, 0, L)] if world == 1 else placement(arch, world, alts)
    mem = arch.block_params().astype(float)
    act = arch.block_params(active=True).astype(float)
    nonblock = float(sum(arch.nonblock_role_params().values()))
    costs = price_blocks(arch.table, hw, get_recipe("bf16"), [f"isl={seq},osl=1,batch={bs}"])
    work_tok = np.asarray(costs.workspace_bytes_per_token, dtype=float)
    items = [a for b in alts for a in b if not a.is_parent]
    two = 2 if settings.bld_steps else 1
    peak = Roof(hw)
    cdt = "bf16" if dtype != "float16" else "fp16"

    def seconds(flops: float) -> float:
        return float(peak.matmul(cdt, flops) * flops) if flops else 0.0

    ranks, busy = [], {"prefix cache": 0.0, "BLD": 0.0, "held-out": 0.0}
    for r in range(world):
        rr = rank_ranges(segments, r)
        idx = np.concatenate([np.arange(a, b) for a, b in rr])
        own = [it for it in items if any(a <= it.block < b for a, b in rr)]
        weights = (mem[idx].sum() + (nonblock if r == 0 else 0.0)) * e
        if world == 1:
            cache: float = (held + calib) * h * e * (L + 1)
        else:
            cache = held * h * e * len(idx) + calib * h * e * (len(idx) + len(rr)) + \
                (held * h * e if r == 0 else 0.0)
        acts = bs * seq * float(work_tok[idx].max()) + 2 * two * held * h * e
        if r == 0:
            acts += 3 * CHUNK_BYTES  # float64 log-softmaxes of teacher and student, + logits
        optim = 0.0
        if settings.bld_steps and own:
            big = max(_alt_params(it, h) for it in own)
            optim = 5 * big * e + 3 * settings.bld_batch * seq * float(work_tok[idx].max())
        ranks.append(RankPlan(r, tuple(rr), weights, min(cache, cache_bytes),
                              max(0.0, cache - cache_bytes), acts, optim))
        through = sum(two * held * 2 * act[max(a, it.stop):b].sum()
                      for a, b in rr for it in items if it.block < b) + \
            sum(two * held * 2 * _alt_params(it, h) for it in own)
        fill = (held + calib) * 2 * act[idx].sum()
        bld = sum(settings.bld_steps * settings.bld_batch * seq * 6 * _alt_params(it, h)
                  for it in own)
        if r == 0:
            through += len(items) * two * held * 2 * 2 * h * v  # student + teacher logits
            fill += held * 2 * h * v
        busy["prefix cache"] = max(busy["prefix cache"], seconds(fill))
        busy["BLD"] = max(busy["BLD"], seconds(bld))
        busy["held-out"] = max(busy["held-out"], seconds(through))
    if not settings.bld_steps:
        busy.pop("BLD")
    return Plan(tuple(ranks), busy, len(items), held, calib, dtype, hw.name, capacity)
