"""The teacher of a distillation placed over the ranks by layers (torch).

A sharded run (FSDP2) would gather the whole teacher at every step: every rank computes
the teacher on its own rows, so every block is all-gathered, ``(N - 1) / N`` of the
teacher's bytes per rank and step (241 GB for Nemotron-3-Super). Its weights never change,
so nothing needs them on every rank: here rank ``r`` holds a contiguous range of the
teacher's blocks (:func:`nas.train.plan.stage_ranges`: balanced by parameters), rank 0 the
embedding too, and the hidden states of every rank's rows flow through the ranges in turn
(:mod:`torch.distributed.pipelining`: one :class:`PipelineStage` per rank, a forward-only
:class:`ScheduleGPipe` whose microbatches are the ranks' rows). The last rank hands each
rank the final hidden states of its own rows (``scatter``), and each rank makes the
teacher's logits from them with the final norm applied and the head, which every rank
holds (the head is the one tensor held whole on every rank; with tied embeddings it is
the embedding).

Per step a rank sends and receives the hidden states of the global batch once each (plus
its share of the scatter), ``rows * positions * hidden`` values, instead of the teacher.
The values are those of the whole teacher on each rank's rows: every block runs the same
ops on the same rows (the microbatch is the rank's rows).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist
from torch import nn

from nas.modules.model import Block, CausalLM

if TYPE_CHECKING:
    from nas.child.checkpoint import CheckpointReader


class TeacherStage(nn.Module):
    """Blocks ``[a, b)`` of a teacher, the first stage embedding the tokens and the last
    applying the final norm."""

    def __init__(self, model: CausalLM, a: int, b: int, first: bool, last: bool):
        super().__init__()
        self.embed = model.embed if first else None
        self.embedding_multiplier = model.scalars.embedding
        self.blocks = nn.ModuleList(model.blocks[a:b])
        self.norm = model.norm if last else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.embed is not None:
            x = self.embed(x)
            if self.embedding_multiplier != 1.0:
                x = x * self.embedding_multiplier
        for blk in self.blocks:
            x = blk(x, None, 0)
        return self.norm(x) if self.norm is not None else x


class PipelinedTeacher(nn.Module):
    """A teacher whose blocks are placed over the ranks (see the module docstring). Called
    as ``teacher(tokens, hidden=True)`` on every rank at once (a collective: each rank its
    own rows, any number of them): the final hidden states of its rows. ``logits(h)`` and
    ``arch`` are the whole teacher's."""

    def __init__(self, model: CausalLM, ranges: list[tuple[int, int]], device: str):
        super().__init__()
        self.rank, self.world = dist.get_rank(), dist.get_world_size()
        a, b = ranges[self.rank]
        self.model = model
        self.arch = model.arch
        self.ranges = ranges
        self.device = torch.device(device)
        self.stage = TeacherStage(model, a, b, self.rank == 0, self.rank == self.world - 1)
        self._schedules: dict[tuple[int, int], Any] = {}

    def logits(self, h: torch.Tensor) -> torch.Tensor:
        return self.model.logits(h)

    def head_weight(self) -> torch.Tensor:
        return self.model.head_weight()

    def _schedule(self, rows: int, length: int) -> Any:
        """The forward-only schedule for microbatches of ``rows x length`` tokens (a stage
        infers its shapes once, so one per shape)."""
        from torch.distributed.pipelining import PipelineStage, ScheduleGPipe

        key = (rows, length)
        if key not in self._schedules:
            stage = PipelineStage(self.stage, self.rank, self.world, self.device)
            self._schedules[key] = ScheduleGPipe(stage, self.world)
        return self._schedules[key]

    @torch.no_grad()
    def forward(self, tokens: torch.Tensor, cache: Any = None, hidden: bool = True
                ) -> torch.Tensor:
        if cache is not None or not hidden:
            raise ValueError("a pipelined teacher gives final hidden states, without a cache")
        n, length = tokens.shape
        sizes = [torch.zeros(2, dtype=torch.int64) for _ in range(self.world)]
        dist.all_gather(sizes, torch.tensor([n, length]))
        if any(int(s[1]) != length for s in sizes):
            raise ValueError("every rank's rows must have the same length")
        m = max(int(s[0]) for s in sizes)
        padded = tokens.new_zeros((m, length))  # padding rows are computed and dropped
        padded[:n] = tokens
        padded = padded.cpu() if self.device.type == "cpu" else padded
        every = [torch.empty_like(padded) for _ in range(self.world)] if self.rank == 0 \
            else None
        dist.gather(padded, every, dst=0)
        sched = self._schedule(m, length)
        last = self.world - 1
        if self.rank == 0:
            out = sched.eval(torch.cat(every))  # type: ignore[arg-type]  # every is a list on rank 0
        else:
            out = sched.eval()
        h = self.arch.hidden_size
        dtype = self.head_weight().dtype
        mine = torch.empty((m, length, h), dtype=dtype, device=self.device)
        parts = list(out.chunk(self.world)) if self.rank == last else None
        dist.scatter(mine, [p.contiguous() for p in parts] if parts else None, src=last)
        return mine[:n]


def load_pipelined(path: str | Path | CheckpointReader, dtype: torch.dtype | None, device: str,
                   digest: str | None = None) -> tuple[PipelinedTeacher, str, torch.dtype]:
    """The checkpoint ``path`` as a :class:`PipelinedTeacher` over the ranks of the default
    group, its :func:`nas.scoring.digest.weights_digest` and its stored dtype.

    Rank ``r`` reads (through :class:`nas.child.checkpoint.CheckpointReader`, every check of
    a normal load) and holds only its range of blocks, the final norm and the head (rank 0
    the embedding too); the rest stays on the meta device. Each rank hashes the tensors it
    is the first holder of, and the lines gathered give the whole model's digest, unless
    ``digest`` (recorded by an earlier start) is given."""
    from nas.child.checkpoint import CheckpointReader
    from nas.scoring.digest import combine_lines, tensor_line
    from nas.train.plan import teacher_stages

    rank, world = dist.get_rank(), dist.get_world_size()
    reader = path if isinstance(path, CheckpointReader) else CheckpointReader(path)
    model = reader.model
    stored = reader.stored_dtype()
    dt = dtype or stored
    ranges = teacher_stages(model.arch, world)
    a, b = ranges[rank]
    names = [f"blocks.{i}" for i in range(a, b) if cast_block(model.blocks[i]).mixer is not None]
    names += [n for n in ("norm", "lm_head") if getattr(model, n) is not None]
    if rank == 0 or model.lm_head is None:  # tied: the embedding is the head
        names.append("embed")
    order = list(model.state_dict(keep_vars=True))
    lines: dict[str, str] = {}
    for name in names:
        sub = reader.materialize(name, dt)
        for k, t in sub.state_dict(prefix=name + ".").items():
            if digest is None and _first_holder(k, rank, ranges, model):
                lines[k] = tensor_line(k, t)
        for p in sub.parameters():
            p.requires_grad_(False)
        sub.to(device)
    reader.close()
    teacher = PipelinedTeacher(model, ranges, device)
    teacher.eval()
    if digest is not None:
        return teacher, digest, stored
    every: list[dict[str, str]] = [{} for _ in range(world)]
    dist.all_gather_object(every, lines)
    merged = {k: v for d in every for k, v in d.items()}
    missing = [k for k in order if k not in merged]
    if missing:
        raise RuntimeError(f"no rank read {missing[:3]}")
    return teacher, combine_lines([merged[k] for k in order]), stored


def cast_block(m: nn.Module) -> Block:
    assert isinstance(m, Block)
    return m


def _first_holder(key: str, rank: int, ranges: list[tuple[int, int]], model: CausalLM) -> bool:
    """Whether ``rank`` hashes tensor ``key``: a block's by the rank that holds it, the
    embedding by rank 0, the final norm and the head (held by every rank) by the last."""
    if key.startswith("blocks."):
        i = int(key.split(".")[1])
        a, b = ranges[rank]
        return a <= i < b
    if key.startswith("embed."):
        return rank == 0
    return rank == len(ranges) - 1
