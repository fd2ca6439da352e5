"""Global knowledge distillation of a built child from its parent (torch).

The student (the child checkpoint) is trained to match the teacher's (the parent's)
next-token distribution on the training tokens:

``loss = KL(p_teacher || q_student) + lm_weight * CE(q_student, next token)``

both as means over every position that has a next token (nats per token), from float32
log-softmax. AdamW (no weight decay by default), linear warm-up then cosine decay to
``min_lr_fraction`` of the peak learning rate, gradient-norm clipping.

**Determinism and resuming.** The rows of step ``s`` are drawn by a generator seeded from
``(seed, s)`` alone, so a run resumed from a checkpoint at step ``s`` draws exactly the rows
an uninterrupted run draws. The checkpoint (``DIR/checkpoint/``: the student as
safetensors, the AdamW state as ``optimizer.pt`` written by ``torch.save`` of tensors and
plain numbers, read back with ``torch.load(weights_only=True)``, and ``state.json``) is
written into a temporary folder and swapped in whole (:func:`nas.io.staged_dir`); a run
killed at any moment resumes from the last complete checkpoint and ends with the same
weights as an uninterrupted run (same threads per process).

**Distributed.** Under ``torchrun`` (``WORLD_SIZE`` > 1; gloo on CPU, nccl on CUDA) each
step's ``batch_size`` rows (the *global* batch) are split evenly over the ranks, and the
gradient average over the ranks equals the one-process gradient of the mean loss. By
default teacher and student are both **sharded** over the ranks with FSDP2
(:func:`torch.distributed.fsdp.fully_shard` on a 1-D DeviceMesh, every block a unit, the
embedding too unless tied to the head, the final norm and the head the root's): :func:`load_sharded` builds each model on the
meta device and each rank keeps only its dim-0 slice of every tensor, read one block at a
time from the safetensors, so no rank ever holds a whole model; the AdamW state is sharded
with the student. Checkpoints are sharded too (:mod:`torch.distributed.checkpoint`: every
rank writes its shards, rank 0 ``state.json``) and resume on any number of ranks (DCP
reshards); the same rank count resumes bit for bit. A MoE student's experts are sharded
whole instead (``expert_parallel``, :mod:`nas.train.ep`): each rank holds
``ceil(E / N)`` experts or fewer, left out of FSDP2's units, and the tokens go to their
experts' ranks and back with ``all_to_all``; they are DTensors ``Shard(0)`` either way, so
checkpoints, the export and the resume are the same in both layouts. ``model/`` is
gathered one tensor at a time and streamed into safetensors by rank 0
(:func:`export_sharded`). With
``replicas`` every rank holds a whole teacher and student instead and the student is
wrapped in :class:`torch.nn.parallel.DistributedDataParallel` (the checkpoint is then
rank 0's whole one, as with one process). A checkpoint of one layout does not resume in
the other (:func:`resume_conflict` says so in one line). Held-out evaluation is sharded
over the ranks and summed with ``all_reduce``.

**Mixed precision** (``mixed_precision``, FSDP2's :class:`MixedPrecisionPolicy`, also on
one process: a one-rank group): the student computes in bf16 / fp16 from float32 master
weights (AdamW state float32, gradients reduced in float32), the teacher is held and run
in that dtype, and ``model/`` is written in the child's stored dtype. **Activation
checkpointing** (``checkpointing``) recomputes each block in the backward pass
(:func:`torch.utils.checkpoint.checkpoint`); the weights are the same bit for bit.

Outputs in ``DIR``: ``model/`` (the distilled child: ``config.json`` + ``model.safetensors``,
a checkpoint :func:`nas.child.load_pretrained` reads and ``puzzle-nas score`` takes as a
parent, with the student's tokenizer files, else the teacher's:
:func:`nas.tokens.copy_tokenizer`), ``distill.json`` (:class:`DistillRecord`: settings,
hashes, the KD curve), ``kd_curve.png``, and ``checkpoint/`` while the run is going (for
resuming): once ``distill.json`` and ``model/`` are written it is deleted (it can be as
large as the model plus the optimizer state), unless ``keep_checkpoint``. A rerun of a
finished run reads ``distill.json`` back and needs no checkpoint.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import os
import signal
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from hwprofiles.errors import InputError, first_error, read_json
from nas.child import load_pretrained
from nas.child.checkpoint import CheckpointReader, export_sharded
from nas.hf import Parent
from nas.io import atomic_write_json, remove_dir, staged_dir
from nas.modules.model import CausalLM
from nas.modules.moe import MoEMixer
from nas.progress import Progress
from nas.scoring.digest import record_digest, recorded_digest, weights_digest
from nas.scoring.runner import init_distributed, rank_and_world
from nas.tokens import copy_tokenizer

if TYPE_CHECKING:
    from nas.train.teacher import PipelinedTeacher

    Teacher = CausalLM | PipelinedTeacher

TEACHER_RECORD, STUDENT_RECORD = "teacher-digest.json", "student-digest.json"
"""Beside a distillation run: the teacher's and the student's :func:`weights_digest` per
compute dtype, with the size and modification time of their files (a resume of unchanged
checkpoints reads these instead of hashing the checkpoints again)."""

VERSION = "distill v1"
KILL_ENV = "PUZZLE_NAS_DISTILL_KILL_AFTER"  # fault injection for tests: SIGKILL after step N


class DistillSettings(BaseModel):
    """Everything that changes the distilled weights (hashed into the run's key)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    tokens: int = Field(ge=1, description="training tokens (steps = ceil(tokens / (batch_size "
                        "* seq_len)))")
    seq_len: int = Field(default=256, ge=2, description="tokens per row")
    batch_size: int = Field(default=8, ge=1, description="rows per step, over all ranks")
    micro_batch: int | None = Field(default=None, ge=1, description="rows per forward and "
                                    "backward pass on each rank: a rank's share of the batch "
                                    "runs as micro-batches of this many rows whose gradients "
                                    "add up before the optimizer step (the same step; "
                                    "activations held for these rows only). None: the "
                                    "rank's whole share at once")
    lr: float = Field(default=3e-4, gt=0, description="peak AdamW learning rate")
    min_lr_fraction: float = Field(default=0.1, ge=0, le=1,
                                   description="cosine decay ends at this fraction of lr")
    warmup_steps: int = Field(default=0, ge=0, description="linear warm-up steps")
    weight_decay: float = Field(default=0.0, ge=0, description="AdamW weight decay")
    grad_clip: float = Field(default=1.0, ge=0, description="max gradient norm (0 = none)")
    lm_weight: float = Field(default=0.0, ge=0, description="weight of the LM (next-token "
                             "cross-entropy) loss added to the KL")
    eval_every: int = Field(default=50, ge=1, description="steps between held-out evaluations")
    eval_tokens: int = Field(default=16384, ge=1, description="held-out tokens evaluated")
    checkpoint_every: int = Field(default=50, ge=1, description="steps between checkpoints")
    seed: int = Field(default=0, ge=0, description="seed of the row sampling")
    dtype: Literal["float32", "bfloat16", "float16"] | None = Field(
        default=None, description="compute dtype of teacher and student (None: each "
        "checkpoint's non-quantized dtype)")
    keep_best: bool = Field(default=True, description="return the weights of the evaluation "
                            "(step 0, the student as given, included) with the lowest held-out "
                            "KL, not the last ones: never worse than the start")
    patience: int = Field(default=0, ge=0, description="stop after this many evaluations "
                          "without a lower held-out KL (0: never stop early)")
    lr_sweep: tuple[float, ...] = Field(default=(), description="peak learning rates tried "
                                        "first, each for sweep_steps steps from the student as "
                                        "given; the one with the lowest held-out KL trains "
                                        "(lr is then not used)")
    sweep_steps: int | None = Field(default=None, ge=1, description="steps of each sweep "
                                    "trial (default: a quarter of the run, at least 1)")
    mixed_precision: Literal["auto", "bfloat16", "float16"] | None = Field(
        default="auto", description="FSDP2 mixed precision: the student computes in this "
        "dtype from float32 master weights (AdamW state float32, gradients reduced in "
        "float32); the teacher is held and run in it. None: none (every tensor in the "
        "checkpoint's dtype, or dtype: with a 16-bit checkpoint, pure 16-bit training). "
        "'auto' (default): a checkpoint stored in 16 bits trains in mixed precision, a "
        "float32 one in float32, and none when dtype is given "
        "(nas.train.plan.resolve_mixed_precision; resolved before the run is keyed)")

    @model_validator(mode="after")
    def _master_weights(self) -> DistillSettings:
        if self.mixed_precision not in (None, "auto") and self.dtype not in (None, "float32"):
            raise ValueError(f"dtype {self.dtype} with mixed_precision: the master weights "
                             "are float32 (leave dtype unset)")
        return self

    @field_validator("lr_sweep")
    @classmethod
    def _positive(cls, v: tuple[float, ...]) -> tuple[float, ...]:
        if any(not (x > 0 and math.isfinite(x)) for x in v):
            raise ValueError("every learning rate of the sweep must be a positive number")
        return v

    @property
    def steps(self) -> int:
        return math.ceil(self.tokens / (self.batch_size * self.seq_len))

    @property
    def trial_steps(self) -> int:
        """Steps of one learning-rate trial (at most the run's)."""
        return min(self.steps, self.sweep_steps or max(1, self.steps // 4))

    def digest(self) -> str:
        if self.mixed_precision == "auto":
            raise ValueError("mixed_precision 'auto' is resolved before a run is keyed "
                             "(resolve_precision)")
        # unset fields left out: a run started before a field existed resumes
        keep = self.model_dump(exclude={"eval_every", "checkpoint_every"}, exclude_none=True)
        return hashlib.sha256(json.dumps(keep, sort_keys=True).encode()).hexdigest()


class CurvePoint(BaseModel):
    """Held-out figures of the student after ``step`` steps (``tokens`` trained on)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    step: int
    tokens: int
    kl_div: float
    lm_loss: float
    accuracy: float
    top1_agreement: float
    train_loss: float | None


class SweepTrial(BaseModel):
    """One learning rate of the sweep: held-out figures after ``steps`` steps."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    lr: float
    steps: int
    kl_div: float
    lm_loss: float
    accuracy: float


class DistillRecord(BaseModel):
    """``distill.json``: what a distillation did, on what, and what it measured."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    version: str
    key: str
    student: str
    teacher: str
    teacher_weights: str
    student_init_weights: str
    data: str
    data_sha256: str
    eval_data: str
    settings: dict[str, Any]
    steps: int
    tokens_trained: int
    held_tokens: int
    world_size: int
    teacher_eval: CurvePoint
    curve: list[CurvePoint]
    final: CurvePoint
    """The figures of the weights in ``model/``: the best evaluation with ``keep_best``."""
    resumed_from_step: int
    seconds: float
    parameters: int
    initial: CurvePoint | None = None
    """The student as given (step 0)."""
    last: CurvePoint | None = None
    """The last evaluation (equal to ``final`` unless an earlier one was better)."""
    kept_step: int | None = None
    """The step whose weights are in ``model/``."""
    stopped_early_at: int | None = None
    """The step after which ``patience`` evaluations without improvement stopped the run."""
    lr: float | None = None
    """The peak learning rate trained with (the sweep's choice when there was one)."""
    sweep: list[SweepTrial] = []
    """The learning-rate sweep's trials, in the order run."""
    layout: Literal["full", "sharded"] = "full"
    """``sharded``: teacher and student sharded over the ranks (FSDP2); ``full``: a whole
    copy per process (one rank, or DDP replicas)."""
    activation_checkpointing: bool = False
    teacher_layout: Literal["whole", "sharded", "pipelined"] | None = None
    """How the teacher was held: ``whole`` per process, ``sharded`` (FSDP2, gathered block by
    block every step) or ``pipelined`` (its blocks placed over the ranks,
    :mod:`nas.train.teacher`); None in records written before the field."""
    expert_parallel: bool = False
    """The student's MoE experts were sharded whole over the ranks (:mod:`nas.train.ep`)."""
    teacher_expert_parallel: bool = False
    """A sharded teacher's too (a pipelined teacher gathers nothing)."""
    held_elements: list[list[int]] = []
    """Per rank: [student, teacher] parameter and buffer elements held (local shards)."""
    peak_rss_mib: list[float] = []
    """Per rank: peak resident memory of the process (MiB, ``getrusage``)."""
    base_rss_mib: list[float] = []
    """Per rank: resident memory when the run started, before either model was read (MiB):
    the runtime's floor (torch, the process group, the interpreter), which
    ``peak_rss_mib`` minus it leaves out."""
    sent_bytes_per_step: list[float | None] = []
    """Per rank: the median over this process's training steps of the bytes it sent
    (``wchar`` of ``/proc/self/io``: gloo's TCP writes, and the few of a progress line;
    None where the file is missing). Evaluations and checkpoints are not steps."""
    chance_agreement: float | None = None
    """The held-out top-1 agreement of the best constant guess (the share of positions
    whose teacher argmax is its most frequent one): a student at or below it ranks tokens no
    better than knowing nothing."""
    notes: list[str] = []
    """One line each for what the figures alone may hide: a collapse to chance, a kept
    child that is the unchanged start."""


class _State(BaseModel):
    """``checkpoint/state.json``."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    key: str
    step: int
    curve: list[CurvePoint]
    teacher_eval: CurvePoint
    losses: list[float]
    lr: float | None = None
    sweep: list[SweepTrial] = []
    best_step: int = 0
    since_best: int = 0
    layout: Literal["full", "sharded"] = "full"
    world: int | None = None
    settings: str | None = None
    """:meth:`DistillSettings.digest` (a launcher tells a resume in another layout by it)."""
    chance_agreement: float | None = None


# ---- data -------------------------------------------------------------------------------
def rows_of(tokens: np.ndarray, seq_len: int, vocab_size: int, source: str) -> torch.Tensor:
    """Non-overlapping rows ``(n, seq_len)`` of a flat token array (remainder dropped); ids
    must lie in ``[0, vocab_size)``."""
    n = len(tokens) // seq_len
    if n < 1:
        raise InputError(f"holds {len(tokens)} tokens, shorter than one row of --seq-len "
                         f"{seq_len}", path=source)
    lo, hi = int(tokens.min()), int(tokens.max())
    if lo < 0 or hi >= vocab_size:
        bad = int(np.flatnonzero((tokens < 0) | (tokens >= vocab_size))[0])
        raise InputError(f"token id {int(tokens[bad])} at position {bad} is outside the "
                         f"vocabulary [0, {vocab_size})", path=source)
    return torch.as_tensor(tokens[: n * seq_len].reshape(n, seq_len).copy(), dtype=torch.long)


def split_rows(train: np.ndarray, held: np.ndarray | None, settings: DistillSettings,
               vocab_size: int, source: str, held_source: str | None = None
               ) -> tuple[torch.Tensor, torch.Tensor]:
    """(training rows, held-out rows). With ``held`` the held-out rows are its first
    ``ceil(eval_tokens / seq_len)`` rows and training uses every row of ``train``; without
    it the last rows of ``train`` are held out (never trained on)."""
    s = settings
    n_eval = math.ceil(s.eval_tokens / s.seq_len)
    tr = rows_of(train, s.seq_len, vocab_size, source)
    if held is not None:
        ho = rows_of(held, s.seq_len, vocab_size, held_source or "eval data")
        return tr, ho[:n_eval]
    if len(tr) < 2:
        raise InputError(f"holds {len(tr)} row(s) of {s.seq_len} tokens; distillation needs "
                         "2 (training and held out), or pass --eval-data", path=source)
    n_eval = min(n_eval, len(tr) - 1)
    return tr[: len(tr) - n_eval], tr[len(tr) - n_eval:]


def step_rows(step: int, n_rows: int, settings: DistillSettings) -> torch.Tensor:
    """The global batch of ``step``: row indices drawn by a generator seeded from
    ``(seed, step)`` only (any rank, any resume point draws the same)."""
    g = torch.Generator().manual_seed(settings.seed * 1_000_003 + step)
    return torch.randint(0, n_rows, (settings.batch_size,), generator=g)


def lr_at(step: int, settings: DistillSettings) -> float:
    """Learning rate of optimizer step ``step`` (0-based)."""
    s = settings
    if s.warmup_steps and step < s.warmup_steps:
        return s.lr * (step + 1) / s.warmup_steps
    span = max(s.steps - s.warmup_steps, 1)
    t = min(max(step - s.warmup_steps, 0) / span, 1.0)
    return s.lr * (s.min_lr_fraction + (1 - s.min_lr_fraction) * 0.5 * (1 + math.cos(math.pi * t)))


# ---- losses and evaluation --------------------------------------------------------------
CHUNK_BYTES = 64 * 2**20
"""Bytes of one float32 ``(rows, positions, vocab)`` logits tensor per chunk of positions:
the loss and the evaluation make the vocabulary-wide tensors one chunk at a time."""


def chunk_positions(rows: int, vocab: int, item: int = 4) -> int:
    """Positions per chunk: ``rows x positions x vocab`` values of ``item`` bytes in
    :data:`CHUNK_BYTES` (at least one)."""
    return max(1, CHUNK_BYTES // (item * vocab * max(rows, 1)))


def _chunk_sums(student: CausalLM, teacher: Teacher, hs: torch.Tensor, ht: torch.Tensor,
                y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Sums over a chunk of positions of KL(teacher || student) and of the student's
    cross-entropy, from the final hidden states ``hs`` / ``ht`` (float32 log-softmax)."""
    lq = F.log_softmax(student.logits(hs).float(), -1)
    with torch.no_grad():
        lp = F.log_softmax(teacher.logits(ht).float(), -1)
    kl = (lp.exp() * (lp - lq)).sum()
    ce = F.nll_loss(lq.reshape(-1, lq.shape[-1]), y.reshape(-1), reduction="sum")
    return kl, ce


def _unshard_roots(*models: torch.nn.Module) -> None:
    """Gather the root unit (embedding, final norm, head) of FSDP2-sharded ``models``, whose
    head the chunked loss and evaluation use outside the forward (a no-op for whole
    models and for a root already gathered)."""
    for m in models:
        if hasattr(m, "unshard"):
            m.unshard()  # type: ignore[operator]  # FSDP2's unshard, found with hasattr; nn.Module's __getattr__ types it Tensor


def _reshard_roots(*models: torch.nn.Module) -> None:
    for m in models:
        if hasattr(m, "reshard"):
            m.reshard()  # type: ignore[operator]  # FSDP2's reshard, found with hasattr; nn.Module's __getattr__ types it Tensor


def kd_loss_hidden(student: CausalLM, teacher: Teacher, hs: torch.Tensor, ht: torch.Tensor,
                   tokens: torch.Tensor, lm_weight: float
                   ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """:func:`kd_loss` of the logits of final hidden states ``hs`` (student, with grad) and
    ``ht`` (teacher), made one chunk of positions at a time (:func:`chunk_positions`) under
    activation checkpointing: the backward pass recomputes a chunk's logits instead of
    keeping them, so the ``(rows, positions, vocab)`` tensors exist for one chunk only. The
    same figures as :func:`kd_loss` up to float32 summation order."""
    from torch.utils.checkpoint import checkpoint

    b, L = tokens.shape
    step = chunk_positions(b, student.arch.vocab_size)
    kl = ce = hs.new_zeros((), dtype=torch.float32)
    for a in range(0, L - 1, step):
        e = min(a + step, L - 1)
        k, c = checkpoint(_chunk_sums, student, teacher, hs[:, a:e], ht[:, a:e],
                          tokens[:, a + 1:e + 1], use_reentrant=False)
        kl, ce = kl + k, ce + c
    n = b * (L - 1)
    kl, ce = kl / n, ce / n
    return kl + lm_weight * ce, kl, ce


def kd_loss(student_logits: torch.Tensor, teacher_logits: torch.Tensor, tokens: torch.Tensor,
            lm_weight: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(loss, KL, CE): mean per position with a next token, nats."""
    zs = student_logits[:, :-1].float()
    zt = teacher_logits[:, :-1].float()
    lq = F.log_softmax(zs, -1)
    lp = F.log_softmax(zt, -1)
    kl = (lp.exp() * (lp - lq)).sum(-1).mean()
    ce = F.nll_loss(lq.reshape(-1, lq.shape[-1]), tokens[:, 1:].reshape(-1))
    return kl + lm_weight * ce, kl, ce


@torch.no_grad()
def evaluate(student: Teacher, teacher: Teacher, held: torch.Tensor, batch: int = 8,
             lockstep: bool = False) -> dict[str, float]:
    """Held-out figures of ``student`` against ``teacher`` (float64 sums over every position
    with a next token; rows sharded over ranks and summed): ``kl_div`` (mean KL(teacher ||
    student), nats), ``lm_loss`` (mean cross-entropy, nats), ``accuracy`` (next-token top-1
    accuracy), ``top1_agreement`` (argmax equal to the teacher's), ``chance_agreement`` (the
    top-1 agreement of the best constant guess: the share of positions whose teacher argmax
    is the teacher's most frequent one; a student at or below it has learnt nothing of the
    teacher's ranking). ``lockstep``: every rank
    runs as many forward passes (a rank out of rows runs one row and drops it), as sharded
    models need: each pass gathers parameters from every rank."""
    rank, world = rank_and_world()
    was = student.training
    student.eval()
    dev = student.head_weight().device
    sums = torch.zeros(5, dtype=torch.float64)
    # how often the teacher's top-1 is each token: the best constant guess's agreement
    hist = torch.zeros(teacher.arch.vocab_size, dtype=torch.float64)
    mine = held[rank::world]
    passes = math.ceil(math.ceil(len(held) / world) / batch) if lockstep else \
        math.ceil(len(mine) / batch)
    for k in range(0, passes * batch, batch):
        t = mine[k:k + batch].to(dev)
        if not len(t):
            student(held[:1].to(dev)), teacher(held[:1].to(dev))
            continue
        hs, ht = student(t, hidden=True), teacher(t, hidden=True)
        _unshard_roots(student, teacher)
        step = chunk_positions(len(t), student.arch.vocab_size, 8)
        for a in range(0, t.shape[1] - 1, step):  # float64 logits, a chunk at a time
            e = min(a + step, t.shape[1] - 1)
            zs = student.logits(hs[:, a:e]).double()
            zt = teacher.logits(ht[:, a:e]).double()
            lq, lp = F.log_softmax(zs, -1), F.log_softmax(zt, -1)
            y = t[:, a + 1:e + 1]
            sums[0] += float((lp.exp() * (lp - lq)).sum())
            sums[1] += float(-lq.gather(-1, y[..., None]).sum())
            sums[2] += float((zs.argmax(-1) == y).sum())
            sums[3] += float((zs.argmax(-1) == zt.argmax(-1)).sum())
            sums[4] += y.numel()
            hist += torch.bincount(zt.argmax(-1).flatten().cpu(),
                                   minlength=len(hist)).double()
        _reshard_roots(student, teacher)
    if world > 1:
        dist.all_reduce(sums)
        dist.all_reduce(hist)
    student.train(was)
    n = float(sums[4])
    return {"kl_div": float(sums[0]) / n, "lm_loss": float(sums[1]) / n,
            "accuracy": float(sums[2]) / n, "top1_agreement": float(sums[3]) / n,
            "chance_agreement": float(hist.max()) / n}


def uniform_loss_bound(lm_weight: float, vocab_size: int) -> float:
    """The most the loss of a student that predicts every token alike can be, nats:
    ``KL(p || uniform) = ln V - H(p) <= ln V`` for any teacher ``p``, and its LM loss is
    ``ln V``, so ``(1 + lm_weight) ln V``."""
    return (1.0 + lm_weight) * math.log(vocab_size)


def diverged(losses: Sequence[float], lm_weight: float, vocab_size: int) -> str | None:
    """Why a run whose training losses so far (one per step, from the run's first step) are
    ``losses`` has diverged, or None: the last loss is not finite, or it lies above the
    first by more than :func:`uniform_loss_bound`: the student has moved further from the
    teacher than knowing nothing at all can put it. A rise below that bound is a transient
    a healthy run recovers from: on the tiny trained parent at a learning rate of 1e-3 the
    loss rose 42x over its start (from 0.0009 nats) and came back, while every run that
    wrecked its student rose past the bound (``docs/training.md``, "When a run diverges",
    has the measurements)."""
    last = losses[-1]
    if not math.isfinite(last):
        return f"the loss is {last}"
    bound = uniform_loss_bound(lm_weight, vocab_size)
    if last > losses[0] + bound:
        return (f"the loss rose from {losses[0]:.4g} to {last:.4g} nats, more than a "
                f"student that predicts every token alike can lose ({bound:.4g})")
    return None


# ---- checkpoints ------------------------------------------------------------------------
def _cpu_copy(student: CausalLM) -> dict[str, torch.Tensor]:
    return {k: v.detach().cpu().contiguous().clone() for k, v in student.state_dict().items()}


def _save_checkpoint(folder: Path, student: CausalLM, opt: torch.optim.Optimizer,
                     state: _State, best: dict[str, torch.Tensor] | None = None) -> None:
    """``best``: the best evaluation's weights when the student has moved past them
    (``best.safetensors``, so that a resumed run can still return them)."""
    from safetensors.torch import save_file

    sd = _cpu_copy(student)
    with staged_dir(folder, "checkpoint") as tmp:
        save_file(sd, str(tmp / "model.safetensors"))
        if best is not None:
            save_file(best, str(tmp / "best.safetensors"))
        torch.save(opt.state_dict(), tmp / "optimizer.pt")
        (tmp / "state.json").write_text(state.model_dump_json(indent=1) + "\n")


def _damaged(folder: Path, name: str, why: str) -> InputError:
    """A one-line error for a checkpoint file that cannot be read, saying what to do."""
    why = " ".join(why.split())[:200]
    return InputError(f"the checkpoint is damaged ({why}); delete the folder {folder} to "
                      "start this run over from step 0 (or put back a good copy of it)",
                      path=str(folder / name))


def _read_state(folder: Path, key: str, layout: str, settings: DistillSettings
                ) -> _State | None:
    """The checkpoint's state, or ``None`` when there is none or it belongs to another run
    (other settings, data or weights). A ``state.json`` that cannot be read is a one-line
    :class:`InputError` naming it and saying what to delete (only one checkpoint is kept:
    a second would double the disk a run needs); so is a checkpoint of this run in the
    other layout (:func:`resume_conflict`)."""
    if not (folder / "state.json").is_file():
        return None
    try:
        state = _State.model_validate(read_json(folder / "state.json"))
    except ValidationError as exc:
        loc, msg = first_error(exc)
        raise _damaged(folder, "state.json", f"{loc}: {msg}") from None
    except InputError as exc:
        raise _damaged(folder, "state.json", str(exc).rsplit(": ", 1)[-1]) from None
    if state.key != key:
        return None
    if state.layout != layout:
        why = resume_conflict(folder.parent, settings, layout)
        raise InputError(why or f"the checkpoint is {LAYOUTS[state.layout]}, this run's would "
                         f"be {LAYOUTS[layout]}; delete {folder} to start over",
                         path=str(folder / "state.json"))
    return state


def _load_full_checkpoint(folder: Path, student: CausalLM, opt: torch.optim.Optimizer
                          ) -> None:
    """Load a whole-model checkpoint (the student and optimizer in place); a file of it that
    cannot be read (truncated, bit-flipped, missing) is a one-line :class:`InputError`."""
    from safetensors.torch import load_file

    dev = student.embed.weight.device
    try:
        student.load_state_dict(load_file(str(folder / "model.safetensors"), device=str(dev)))
    except MemoryError:
        raise
    except Exception as exc:  # safetensors' and torch's errors: a damaged file
        raise _damaged(folder, "model.safetensors", f"{type(exc).__name__}: {exc}") from None
    try:
        opt.load_state_dict(torch.load(folder / "optimizer.pt", weights_only=True,
                                       map_location=dev))
    except MemoryError:
        raise
    except Exception as exc:
        raise _damaged(folder, "optimizer.pt", f"{type(exc).__name__}: {exc}") from None


def _load_best(folder: Path, student: CausalLM) -> dict[str, torch.Tensor]:
    """The best weights a checkpoint kept (``best.safetensors``), on the CPU."""
    from safetensors.torch import load_file

    try:
        best = load_file(str(folder / "best.safetensors"))
    except MemoryError:
        raise
    except Exception as exc:
        raise _damaged(folder, "best.safetensors", f"{type(exc).__name__}: {exc}") from None
    if set(best) != set(student.state_dict()):
        raise _damaged(folder, "best.safetensors", "its tensors are not the student's")
    return best


def plot_curve(path: Path, record: DistillRecord) -> Path | None:
    """``kd_curve.png``: held-out KL and LM loss against tokens trained (None without
    matplotlib)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    from nas.io import atomic_write

    xs = [p.tokens for p in record.curve]
    fig, ax = plt.subplots(1, 2, figsize=(9, 3.5))
    ax[0].plot(xs, [p.kl_div for p in record.curve], marker="o")
    ax[0].set_xlabel("tokens trained")
    ax[0].set_ylabel("held-out KL(teacher || student), nats/token")
    ax[1].plot(xs, [p.lm_loss for p in record.curve], marker="o", label="student")
    ax[1].axhline(record.teacher_eval.lm_loss, color="k", ls="--", label="teacher")
    ax[1].set_xlabel("tokens trained")
    ax[1].set_ylabel("held-out LM loss, nats/token")
    ax[1].legend()
    fig.suptitle(f"knowledge distillation of {Path(record.student).name}")
    fig.tight_layout()
    atomic_write(path, lambda p: fig.savefig(p, format="png", dpi=100))
    plt.close(fig)
    return path


# ---- sharded over the ranks (FSDP2) ------------------------------------------------------
def _checkpointed(blk: torch.nn.Module) -> None:
    """Recompute ``blk``'s activations in the backward pass instead of keeping them
    (:func:`torch.utils.checkpoint.checkpoint`, non-reentrant). The instance's ``forward``
    is replaced, so FSDP2's hooks (on ``__call__``) stay outside the recomputed region: the
    block's parameters are all-gathered before its backward runs, and the recompute uses
    them."""
    from torch.utils.checkpoint import checkpoint

    inner = blk.forward

    def forward(x: torch.Tensor, cache: dict[str, Any] | None = None,
                offset: int = 0) -> torch.Tensor:
        if cache is not None or not torch.is_grad_enabled():
            return inner(x, cache, offset)
        return checkpoint(inner, x, None, offset, use_reentrant=False)

    blk.forward = forward


def _held(model: torch.nn.Module) -> int:
    """Parameter and buffer elements this rank holds (a DTensor's local shard only; a
    pipelined teacher's tensors of other ranks, on the meta device, not)."""
    from torch.distributed.tensor import DTensor

    seen = {id(t): t for t in model.state_dict(keep_vars=True).values() if not t.is_meta}
    return sum(t.to_local().numel() if isinstance(t, DTensor) else t.numel()
               for t in seen.values())


def load_sharded(path: str | Path | CheckpointReader, dtype: torch.dtype | None, mesh: Any, device: str, *,
                 train: bool, mp_dtype: torch.dtype | None = None,
                 checkpointing: bool = False, digest: str | None = None,
                 expert_parallel: bool = False) -> tuple[CausalLM, str, torch.dtype]:
    """The checkpoint ``path`` as an FSDP2 model sharded over ``mesh`` (every block a unit,
    the embedding one too unless the head is tied to it; the final norm and the head the
    root's), its :func:`weights_digest` and the checkpoint's stored dtype.

    The model is built on the meta device, sharded, and given storage for this rank's
    shards only (``to_empty``); then the checkpoint is read one submodule at a time (the
    embedding, the norm, the head, each block). Every tensor is read whole by one rank,
    the ``world``-th share of them each, through :class:`CheckpointReader` (every check of
    a normal load: shapes, recorded SHA-256, finite values, dequantization), which hashes
    it for the run's key and keeps its own dim-0 slice (:func:`distribute_tensor` with
    ``src_data_rank=None``: a local slice, no communication); the other ranks read only
    their rows of it from the file (:meth:`CheckpointReader.read_rows`: shape, dtype and finite values
    checked), except packed or scaled tensors, which every rank dequantizes whole. So a
    rank reads about 2/N of the checkpoint and holds its shards plus, for the moment, its
    share of one block read whole. The lines gathered give the same digest as one process
    hashing the whole model.
    ``mp_dtype``: compute dtype of FSDP2's mixed precision (the parameters stay in
    ``dtype``, gradients are reduced in float32). ``digest``: the checkpoint's digest as an
    earlier start recorded it (:func:`nas.scoring.digest.recorded_digest`, the same on
    every rank): then nothing is hashed and it is returned as is. ``expert_parallel``: the
    MoE blocks' stacked experts are sharded whole over the ranks instead
    (:mod:`nas.train.ep`: rank ``r`` holds experts ``r E/N ..``, the same rows FSDP2 would
    give it, read the same way) and left out of their block's FSDP2 unit, which then
    gathers only the router, the latent projections and the shared expert."""
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
    from torch.distributed.tensor import DTensor, distribute_tensor

    from nas.scoring.digest import combine_lines, tensor_line

    reader = path if isinstance(path, CheckpointReader) else CheckpointReader(path)
    model = reader.model
    stored = reader.stored_dtype()
    dt = dtype or stored
    for mod in model.modules():  # parameters in dt; buffers stay float32, as the reader's
        for name, p in list(mod.named_parameters(recurse=False)):
            setattr(mod, name, torch.nn.Parameter(p.to(dt), requires_grad=train))
    mp = MixedPrecisionPolicy() if mp_dtype is None else \
        MixedPrecisionPolicy(param_dtype=mp_dtype, reduce_dtype=torch.float32)
    for blk in model.blocks:
        if blk.mixer is None:
            continue  # a no-op block has no tensors
        if checkpointing:
            _checkpointed(blk)
        ignored = None
        if expert_parallel and isinstance(blk.mixer, MoEMixer):
            from nas.train.ep import shard_experts

            ignored = shard_experts(blk.mixer, mesh, recast=not checkpointing)
        fully_shard(blk, mesh=mesh, mp_policy=mp, reshard_after_forward=True,
                    ignored_params=ignored)
    if model.lm_head is not None:  # untied: the embedding is a unit of its own, gathered
        # only for its forward and backward instead of through the whole step
        fully_shard(model.embed, mesh=mesh, mp_policy=mp, reshard_after_forward=True)
    fully_shard(model, mesh=mesh, mp_policy=mp, reshard_after_forward=True)
    model.to_empty(device=device)
    sd = model.state_dict(keep_vars=True)
    order = list(sd)
    rank, world = mesh.get_local_rank(), mesh.size()
    mine = set(order[rank::world])
    lines: dict[str, str] = {}
    units = [n for n in ("embed", "norm", "lm_head") if getattr(model, n) is not None]
    units += [f"blocks.{i}" for i in range(len(model.blocks))]
    with torch.no_grad():
        for unit in units:
            keys = {k for k in order if k.startswith(unit + ".")}
            if not keys:
                continue
            whole = {k for k in keys if k in mine or not isinstance(sd[k], DTensor)
                     or not reader.sliceable(k)}
            full = reader.tensors(whole, dt) if whole else {}
            for k in sorted(keys - whole):  # this rank's rows only, straight from the file
                sd[k].to_local().copy_(reader.read_rows(k, dt, rank, world))
            reader.close()  # unmap the files: the pages read would stay resident
            for k in sorted(full):
                t = full.pop(k)
                if k in mine and digest is None:
                    lines[k] = tensor_line(k, t)
                dst = sd[k]
                if isinstance(dst, DTensor):
                    part = distribute_tensor(t, dst.device_mesh, dst.placements,
                                             src_data_rank=None).to_local()
                    dst.to_local().copy_(part)
                else:
                    dst.copy_(t)
                del t
    model.train(train)
    if digest is not None:
        return model, digest, stored
    every: list[dict[str, str]] = [{} for _ in range(world)]
    dist.all_gather_object(every, lines, group=mesh.get_group())
    merged = {k: v for d in every for k, v in d.items()}
    return model, combine_lines([merged[k] for k in order]), stored


def _snapshot(model: torch.nn.Module, sharded: bool) -> dict[str, torch.Tensor]:
    """A copy of the weights: this rank's shards (DTensors) when sharded, else on the
    CPU."""
    if not sharded:
        return _cpu_copy(model)  # type: ignore[arg-type]  # the student is a CausalLM (possibly wrapped), whose state dict this copies
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


@torch.no_grad()
def _restore(model: torch.nn.Module, snap: dict[str, torch.Tensor], sharded: bool) -> None:
    if not sharded:
        model.load_state_dict(snap)
        return
    from torch.distributed.tensor import DTensor

    for k, t in model.state_dict(keep_vars=True).items():
        src = snap[k]
        if isinstance(t, DTensor):
            t.to_local().copy_(src.to_local())  # type: ignore[attr-defined]  # a sharded snapshot holds DTensors where the model does
        else:
            t.copy_(src)


def _save_sharded(folder: Path, student: torch.nn.Module, opt: torch.optim.Optimizer,
                  state: _State, best: dict[str, torch.Tensor] | None) -> None:
    """Every rank writes its shards of the student, the AdamW state and ``best``
    (:func:`torch.distributed.checkpoint.save` of :func:`get_state_dict`'s sharded state
    dicts) into one staged folder; rank 0 adds ``state.json`` and swaps it in whole."""
    import contextlib

    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict

    msd, osd = get_state_dict(student, opt)
    sd: dict[str, Any] = {"model": msd, "optim": osd}
    if best is not None:
        sd["best"] = best
    rank = dist.get_rank()
    with contextlib.ExitStack() as stack:
        where: list[Any] = [str(stack.enter_context(staged_dir(folder, "checkpoint")))
                            if rank == 0 else None]
        dist.broadcast_object_list(where, src=0)
        dcp.save(sd, checkpoint_id=where[0])
        if rank == 0:
            (Path(where[0]) / "state.json").write_text(state.model_dump_json(indent=1) + "\n")
    dist.barrier()


def _load_sharded_checkpoint(folder: Path, state: _State, student: torch.nn.Module,
                             opt: torch.optim.Optimizer, keep_best: bool
                             ) -> dict[str, torch.Tensor] | None:
    """Load a sharded checkpoint (any rank count: DCP reshards) into ``student`` and
    ``opt`` in place; returns the best weights it kept (this rank's shards) or None."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    msd, osd = get_state_dict(student, opt)
    sd: dict[str, Any] = {"model": msd, "optim": osd}
    if keep_best and state.best_step != state.step:
        sd["best"] = _snapshot(student, True)
    try:
        dcp.load(sd, checkpoint_id=str(folder))
    except MemoryError:
        raise
    except Exception as exc:
        raise _damaged(folder, ".metadata", f"{type(exc).__name__}: {exc}") from None
    set_state_dict(student, opt, model_state_dict=sd["model"], optim_state_dict=sd["optim"])
    return sd.get("best")


# ---- the run ----------------------------------------------------------------------------
def _point(step: int, s: DistillSettings, ev: dict[str, float],
           train_loss: float | None) -> CurvePoint:
    ev = {k: v for k, v in ev.items() if k != "chance_agreement"}
    return CurvePoint(step=step, tokens=step * s.batch_size * s.seq_len, train_loss=train_loss,
                      **ev)


LAYOUTS = {"full": "written whole by one process (1 rank, or --replicas)",
           "sharded": "sharded over the ranks (FSDP2, torch.distributed.checkpoint)"}


def resolve_precision(settings: DistillSettings, student_dir: str | Path | Parent,
                      teacher_dir: str | Path | Parent, replicas: bool = False
                      ) -> DistillSettings:
    """``settings`` with ``mixed_precision="auto"`` resolved from the two checkpoints'
    stored dtypes (:func:`nas.train.plan.resolve_mixed_precision`; a :class:`Parent` is
    read as it was read); an :class:`InputError` for a 16-bit checkpoint on replicas."""
    from nas.train.plan import resolve_mixed_precision, stored_dtype

    if settings.mixed_precision != "auto":
        return settings
    dts = []
    for d in (student_dir, teacher_dir):
        if isinstance(d, Parent):
            dts.append(stored_dtype(d.config))
            continue
        path = Path(d)
        cfg = path if path.suffix == ".json" else path / "config.json"
        dts.append(stored_dtype(read_json(cfg)) if cfg.is_file() else "float32")
    try:
        mp = resolve_mixed_precision("auto", settings.dtype, dts[0], dts[1], replicas)
    except ValueError as exc:
        raise InputError(str(exc)) from None
    return settings.model_copy(update={"mixed_precision": mp})


def layout_of(world: int, settings: DistillSettings, replicas: bool = False
              ) -> Literal["full", "sharded"]:
    """The checkpoint layout a run writes: ``sharded`` (FSDP2) with more than one rank unless
    ``replicas``, and always with mixed precision; else ``full``. ``settings`` resolved
    (:func:`resolve_precision`)."""
    if settings.mixed_precision == "auto":
        raise ValueError("mixed_precision 'auto' is resolved first (resolve_precision)")
    return "sharded" if (world > 1 and not replicas) or settings.mixed_precision else "full"


def _expert_parallel(student_dir: str | Path | Parent, mode: str, world: int, layout: str
                     ) -> bool:
    """Whether the student's experts are sharded over the ranks
    (:func:`nas.train.plan.resolve_expert_parallel` of its config; ``on`` where it cannot
    run is refused in one line)."""
    from nas.hf import load_config
    from nas.train.plan import resolve_expert_parallel

    if mode == "off":
        return False
    plan_layout = "sharded" if layout == "sharded" and world > 1 else \
        ("whole" if world == 1 else "replicas")
    try:
        arch = student_dir.arch if isinstance(student_dir, Parent) else load_config(student_dir)
        return resolve_expert_parallel(mode, arch, world, plan_layout)
    except ValueError as exc:
        raise InputError(str(exc), field="--expert-parallel") from None


def resume_conflict(out_dir: str | Path, settings: DistillSettings, layout: str
                    ) -> str | None:
    """Why the checkpoint in ``out_dir`` (of a run with these settings) cannot be resumed
    by a run of ``layout``, or None (no checkpoint, another run's, or the same layout: a
    sharded checkpoint resumes on any number of ranks)."""
    folder = Path(out_dir) / "checkpoint"
    try:
        state = _State.model_validate(read_json(folder / "state.json"))
    except (InputError, ValidationError):
        return None
    if state.layout == layout or state.settings != settings.digest():
        return None
    n = f" over {state.world} ranks" if state.world else ""
    want = ("with --nproc 1 or --replicas" if state.layout == "full" else
            "sharded (--nproc N > 1 without --replicas)")
    return (f"the checkpoint in {folder} was {LAYOUTS[state.layout].replace(' over the ranks', n)}"
            f"; this run's would be {LAYOUTS[layout]}: resume it {want}, or delete {folder} "
            "to start over")


def _solo_group(device: str) -> bool:
    """A one-rank process group for a sharded run in a single process (mixed precision
    needs FSDP2); True when this call created it."""
    if dist.is_initialized():
        return False
    dist.init_process_group("nccl" if device.startswith("cuda") else "gloo",
                            store=dist.HashStore(), rank=0, world_size=1)
    return True


def _bytes_written() -> int | None:
    """This process's ``wchar`` (bytes passed to write calls: files, pipes and sockets, so
    gloo's sends), or None off Linux."""
    try:
        with open("/proc/self/io") as f:
            for line in f:
                if line.startswith("wchar:"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


def _rss_mib() -> float:
    """This process's resident memory now (MiB, ``/proc/self/statm``; the peak so far where
    that file is missing)."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20
    except (OSError, ValueError, IndexError):
        return _peak_rss_mib()


def _peak_rss_mib() -> float:
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux


def distill(student_dir: str | Path | Parent, teacher_dir: str | Path | Parent,
            train: np.ndarray,
            out_dir: str | Path, settings: DistillSettings, *, held: np.ndarray | None = None,
            data_source: str = "data", eval_source: str | None = None, device: str = "cpu",
            progress: bool | None = None, log: Callable[[str], None] | None = None,
            replicas: bool = False, checkpointing: bool = False,
            keep_checkpoint: bool = False,
            teacher_layout: Literal["pipelined", "sharded"] = "pipelined",
            expert_parallel: Literal["auto", "on", "off"] = "auto"
            ) -> DistillRecord | None:
    """Distill the checkpoint ``student_dir`` from ``teacher_dir`` on token array ``train``
    (held-out rows from ``held``, else the end of ``train``) into ``out_dir`` (see the
    module docstring). Resumes from ``out_dir/checkpoint`` when it belongs to the same run;
    returns the existing record when the same run already finished. Returns the
    :class:`DistillRecord` on rank 0, ``None`` on other ranks.

    Under torchrun the teacher and student are sharded over the ranks (FSDP2) unless
    ``replicas`` (a whole copy of each per rank, DDP); ``checkpointing`` recomputes each
    block's activations in the backward pass (same weights, less memory).
    ``keep_checkpoint``: leave ``out_dir/checkpoint`` once the run is finished (by default
    rank 0 deletes it after every rank is done). ``teacher_layout`` (sharded runs on more
    than one rank): ``pipelined`` (the default) places the teacher's blocks over the ranks
    and passes hidden states (:mod:`nas.train.teacher`), ``sharded`` shards it with FSDP2,
    which gathers every block at every step; the figures are the same.
    ``expert_parallel`` (sharded runs on more than one rank, MoE students): ``auto`` (the
    default) shards the student's experts whole over the ranks (:mod:`nas.train.ep`;
    ``ceil(E / N)`` per rank, the last fewer), ``on`` refuses a run where they cannot (no
    MoE block, or not sharded),
    ``off`` leaves them to FSDP2 (every block gathered whole); the figures are the same
    within float32 summation order, and a checkpoint of either resumes in the other.

    ``student_dir`` and ``teacher_dir`` are checkpoint folders, or :class:`nas.hf.Parent`
    of one as the caller read it (``puzzle-nas distill``): its config is then not read
    again."""
    s = resolve_precision(settings, student_dir, teacher_dir, replicas)
    if replicas and s.mixed_precision:
        raise InputError("--mixed-precision runs on FSDP2 (sharded ranks): drop --replicas")
    rank, world, device = init_distributed(device)
    solo = layout_of(world, s, replicas) == "sharded" and _solo_group(device)
    try:
        return _distill(student_dir, teacher_dir, train, out_dir, s, held, data_source,
                        eval_source, device, progress, log, replicas, checkpointing,
                        keep_checkpoint, teacher_layout, expert_parallel)
    finally:
        if solo:
            dist.destroy_process_group()


def _folder(d: str | Path | Parent, flag: str) -> str | Path:
    """The checkpoint folder of ``d``."""
    if not isinstance(d, Parent):
        return d
    if d.folder is None:
        raise InputError("expected a checkpoint folder", path=str(d.path), field=flag)
    return d.folder


def _source(folder: str | Path, par: Parent | None) -> str | Path | CheckpointReader:
    """What the loaders read ``folder`` from: a reader opened with its config as already
    read (``par``), else the folder (its config read there)."""
    return folder if par is None else CheckpointReader(folder, arch=par.arch)


def _distill(student_in: str | Path | Parent, teacher_in: str | Path | Parent,
             train: np.ndarray,
             out_dir: str | Path, s: DistillSettings, held: np.ndarray | None,
             data_source: str, eval_source: str | None, device: str, progress: bool | None,
             log: Callable[[str], None] | None, replicas: bool, checkpointing: bool,
             keep_checkpoint: bool = False, teacher_layout: str = "pipelined",
             expert_parallel: str = "auto") -> DistillRecord | None:
    t0 = time.perf_counter()
    rss0 = _rss_mib()
    s_par = student_in if isinstance(student_in, Parent) else None
    t_par = teacher_in if isinstance(teacher_in, Parent) else None
    student_dir, teacher_dir = _folder(student_in, "student"), _folder(teacher_in, "teacher")
    log = log if log is not None else (lambda m: print(m, file=sys.stderr))
    rank, world = rank_and_world()
    layout = layout_of(world, s, replicas)
    sharded = layout == "sharded"
    if s.batch_size % world:
        raise InputError(f"--batch {s.batch_size} (the global batch) must be a multiple of the "
                         f"{world} ranks")
    out = Path(out_dir)
    dtype = None if s.dtype is None else getattr(torch, s.dtype)
    mp = None if s.mixed_precision is None else getattr(torch, s.mixed_precision)
    # each checkpoint's digest, hashed at the first start and recorded beside the run: a
    # resume with unchanged files reads it back instead of hashing the checkpoint again
    t_key = f"teacher:{mp or dtype or 'stored'}"
    s_key = f"student:{torch.float32 if mp else dtype or 'stored'}"
    box: list[Any] = [(recorded_digest(out, teacher_dir, t_key, TEACHER_RECORD),
                       recorded_digest(out, student_dir, s_key, STUDENT_RECORD))
                      if rank == 0 else None]
    if world > 1:
        dist.broadcast_object_list(box, 0)
    t_known, s_known = box[0]
    ep_t = False
    if sharded:
        from torch.distributed.device_mesh import init_device_mesh

        mesh = init_device_mesh("cuda" if device.startswith("cuda") else "cpu", (world,))
        # the teacher computes in the mixed-precision dtype (no master weights: no training)
        t_layout: Literal["whole", "sharded", "pipelined"] = \
            "pipelined" if world > 1 and teacher_layout == "pipelined" else "sharded"
        teacher: Teacher
        if t_layout == "pipelined":
            from nas.train.teacher import load_pipelined

            teacher, t_hash, _ = load_pipelined(_source(teacher_dir, t_par), mp or dtype, device,
                                                digest=t_known)
        else:  # its experts sharded whole too where they divide (it only runs forward)
            ep_t = expert_parallel != "off" and \
                _expert_parallel(t_par or teacher_dir, "auto", world, layout)
            teacher, t_hash, _ = load_sharded(_source(teacher_dir, t_par), mp or dtype, mesh,
                                              device,
                                              train=False, digest=t_known,
                                              expert_parallel=ep_t)
        # (recorded in distill.json as expert_parallel; the plan printed before says it)
        ep = _expert_parallel(s_par or student_dir, expert_parallel, world, layout)
        student, s_hash, s_stored = load_sharded(
            _source(student_dir, s_par), torch.float32 if mp else dtype, mesh, device, train=True,
            mp_dtype=mp, checkpointing=checkpointing, digest=s_known, expert_parallel=ep)
        teacher.eval()
        export_dtype = s_stored if mp else student.embed.weight.dtype
    else:
        t_layout, ep = "whole", False
        if expert_parallel == "on":
            _expert_parallel(s_par or student_dir, expert_parallel, world, layout)  # refusal
        teacher = load_pretrained(_source(teacher_dir, t_par), dtype=dtype).to(device).eval()
        for p in teacher.parameters():
            p.requires_grad_(False)
        student = load_pretrained(_source(student_dir, s_par), dtype=dtype).to(device)
        if checkpointing:
            for blk in student.blocks:
                if blk.mixer is not None:
                    _checkpointed(blk)
        t_hash = t_known or weights_digest(teacher)
        s_hash = s_known or weights_digest(student)
    if student.arch.vocab_size != teacher.arch.vocab_size:
        raise InputError(f"the student's vocabulary ({student.arch.vocab_size}) differs from "
                         f"the teacher's ({teacher.arch.vocab_size})", path=str(student_dir))
    tr, ho = split_rows(train, held, s, teacher.arch.vocab_size, data_source, eval_source)
    h = hashlib.sha256()
    for a in (tr, ho):
        h.update(str(tuple(a.shape)).encode())
        h.update(a.numpy().tobytes())
    data_hash = h.hexdigest()
    key = hashlib.sha256(json.dumps([VERSION, t_hash, s_hash, data_hash, s.digest()]
                                    ).encode()).hexdigest()
    done = out / "distill.json"
    if done.is_file() and (out / "model" / "config.json").is_file():
        try:
            rec = DistillRecord.model_validate(read_json(done))
        except ValidationError:
            rec = None
        if rec is not None and rec.key == key:
            if rank == 0 and not keep_checkpoint:  # left by a run stopped just after it ended
                remove_dir(out / "checkpoint")
            return rec if rank == 0 else None

    if rank == 0:  # the run starts (its checkpoints go here): record the digests beside it
        out.mkdir(parents=True, exist_ok=True)  # (and in this machine's cache)
        record_digest(out, teacher_dir, t_key, t_hash, TEACHER_RECORD)
        record_digest(out, student_dir, s_key, s_hash, STUDENT_RECORD)

    def new_opt(lr: float) -> torch.optim.Optimizer:
        return torch.optim.AdamW([p for p in student.parameters() if p.requires_grad], lr=lr,
                                 weight_decay=s.weight_decay)

    opt = new_opt(s.lr)
    ckpt = out / "checkpoint"
    state = _read_state(ckpt, key, layout, s)
    best: dict[str, torch.Tensor] | None = None
    if state is not None and sharded:
        best = _load_sharded_checkpoint(ckpt, state, student, opt, s.keep_best)
    elif state is not None:
        _load_full_checkpoint(ckpt, student, opt)
    model: torch.nn.Module = student
    ddp = None
    if world > 1 and not sharded:
        from torch.nn.parallel import DistributedDataParallel as DDP

        ddp = DDP(student)  # every parameter is used (experts are stacked tensors)
        model = ddp
    local = s.batch_size // world
    micro = s.micro_batch or local
    if local % micro:
        raise InputError(f"--micro-batch {micro} must divide each rank's share of the batch "
                         f"({s.batch_size} rows over {world} ranks: {local})",
                         field="--micro-batch")
    n_micro = local // micro

    sent: list[int] = []  # bytes written per training step (gloo's sends)

    def train_steps(run: DistillSettings, optim: torch.optim.Optimizer, start: int, stop: int,
                    losses: list[float],
                    on_step: Callable[[int, float], None] | None = None) -> None:
        """Optimizer steps ``start .. stop - 1`` of schedule ``run`` (``on_step(step, loss)``
        after each)."""
        student.train()
        for step in range(start, stop):
            w0 = _bytes_written()
            idx = step_rows(step, len(tr), run)[rank * local:(rank + 1) * local]
            for group in optim.param_groups:
                group["lr"] = lr_at(step, run)
            optim.zero_grad(set_to_none=True)
            loss = torch.zeros((), device=device)
            for j in range(n_micro):  # the rank's rows, a micro-batch at a time
                t = tr[idx[j * micro:(j + 1) * micro]].to(device)
                with torch.no_grad():
                    ht = teacher(t, hidden=True)
                # DDP: the gradients are all-reduced once, after the last micro-batch (FSDP2
                # reduce-scatters each one's into the sharded gradients: memory stays sharded)
                last_one = j == n_micro - 1
                with contextlib.nullcontext() if ddp is None or last_one else ddp.no_sync():
                    hs = model(t, hidden=True)
                    _unshard_roots(student, teacher)  # the head, for the chunks and recompute
                    part, _, _ = kd_loss_hidden(student, teacher, hs, ht, t, run.lm_weight)
                    (part / n_micro).backward()  # the mean over the rank's rows, as one pass
                _reshard_roots(teacher)  # the student's: FSDP2 after its backward
                loss = loss + part.detach() / n_micro
            if run.grad_clip:
                torch.nn.utils.clip_grad_norm_(student.parameters(), run.grad_clip)
            optim.step()
            lv = loss.detach().clone()
            if world > 1:
                dist.all_reduce(lv)
                lv /= world
            losses.append(float(lv))
            w1 = _bytes_written()
            if w0 is not None and w1 is not None:
                sent.append(w1 - w0)
            # every rank holds the same (all-reduced) loss, so every rank stops together
            why = diverged(losses, run.lm_weight, teacher.arch.vocab_size)
            if why is not None:
                raise InputError(f"training diverged: {why} at step {step + 1} of "
                                 f"{run.steps} (learning rate {lr_at(step, run):.3g}); lower "
                                 "the learning rate",
                                 field="--lr-sweep" if s.lr_sweep else "--lr")
            if on_step is not None:
                on_step(step, float(lv))

    def ev(m: Teacher) -> dict[str, float]:
        return evaluate(m, teacher, ho, lockstep=sharded)

    if state is None:
        t_ev = ev(teacher)
        chance: float | None = t_ev["chance_agreement"]
        teacher_eval = _point(0, s, t_ev, None)
        curve = [_point(0, s, ev(student), None)]
        start, losses, best_step, since_best = 0, [], 0, 0
        sweep: list[SweepTrial] = []
        lr = s.lr
        if s.lr_sweep:  # trials from the student as given; it is put back after each
            init = _snapshot(student, sharded)
            for cand in s.lr_sweep:
                trial = s.model_copy(update={"lr": cand, "tokens": s.trial_steps * s.batch_size
                                             * s.seq_len})
                try:
                    train_steps(trial, new_opt(cand), 0, trial.steps, [])
                    e = ev(student)
                except InputError:  # diverged: this rate loses the sweep
                    e = {"kl_div": math.inf, "lm_loss": math.inf, "accuracy": 0.0}
                sweep.append(SweepTrial(lr=cand, steps=trial.steps, kl_div=e["kl_div"],
                                        lm_loss=e["lm_loss"], accuracy=e["accuracy"]))
                if rank == 0:
                    log(f"lr sweep: {cand:g} -> held-out KL {e['kl_div']:.4f} after "
                        f"{trial.steps} steps")
                _restore(student, init, sharded)
            ok = [t for t in sweep if math.isfinite(t.kl_div)]
            if not ok:
                raise InputError(f"every learning rate of the sweep diverged "
                                 f"({', '.join(f'{x:g}' for x in s.lr_sweep)}); try lower ones",
                                 field="--lr-sweep")
            lr = min(ok, key=lambda t: (t.kl_div, t.lr)).lr
            opt = new_opt(lr)
            del init
    else:
        teacher_eval, curve, start, losses = (state.teacher_eval, list(state.curve), state.step,
                                              list(state.losses))
        best_step, since_best = state.best_step, state.since_best
        chance = state.chance_agreement
        sweep, lr = list(state.sweep), state.lr if state.lr is not None else s.lr
        if rank == 0:
            log(f"resuming from step {start} of {s.steps} ({ckpt})"
                + (f", written by {state.world} ranks" if state.world not in (None, world)
                   else ""))
    run = s.model_copy(update={"lr": lr})
    # best: a copy of the best evaluation's weights once the student has moved past them
    # (None while the student itself holds them): on the CPU, or this rank's shards
    if state is not None and best_step != start and s.keep_best and not sharded:
        best = _load_best(ckpt, student)
    best_kl = next(c.kl_div for c in curve if c.step == best_step)
    kill_after = int(os.environ.get(KILL_ENV, "-1"))
    stopped = None
    with Progress(s.steps, "distilling", progress if rank == 0 else False) as bar:
        bar.skip(start)  # a resume: the steps done before count, not in the rate

        def on_step(step: int, lv: float) -> None:
            bar.update(1, f"loss {lv:.4f}")

        step = start
        while step < s.steps:
            if s.keep_best and best_step == step and best is None:
                best = _snapshot(student, sharded)
            n = min(s.steps, (step // s.eval_every + 1) * s.eval_every,
                    (step // s.checkpoint_every + 1) * s.checkpoint_every,
                    kill_after if kill_after > step else s.steps)
            train_steps(run, opt, step, n, losses, on_step)
            step = n
            if n % s.eval_every == 0 or n == s.steps:
                tl = float(np.mean(losses[-s.eval_every:]))
                curve.append(_point(n, s, ev(student), tl))
                c = curve[-1]
                if c.kl_div < best_kl:
                    best_kl, best_step, since_best, best = c.kl_div, n, 0, None
                else:
                    since_best += 1
                if rank == 0:
                    log(f"step {n}/{s.steps}: held-out KL {c.kl_div:.4f}, LM loss "
                        f"{c.lm_loss:.4f}, accuracy {c.accuracy:.4f} (train loss {tl:.4f})"
                        + ("" if best_step == n else f"; the best is still step {best_step}"))
                if s.patience and since_best >= s.patience and n < s.steps:
                    stopped = n
                    if rank == 0:
                        log(f"stopping early: no lower held-out KL in {s.patience} "
                            "evaluations")
                    break
            if n % s.checkpoint_every == 0 and n < s.steps:  # the end writes model/
                st = _State(key=key, step=n, curve=curve, teacher_eval=teacher_eval,
                            losses=losses, lr=lr, sweep=sweep, best_step=best_step,
                            since_best=since_best, layout=layout, world=world,
                            settings=s.digest(), chance_agreement=chance)
                keep = best if best_step != n else None
                if sharded:
                    _save_sharded(ckpt, student, opt, st, keep)
                else:
                    if rank == 0:
                        _save_checkpoint(ckpt, student, opt, st, keep)
                    if world > 1:
                        dist.barrier()
            if n == kill_after:
                os.kill(os.getpid(), signal.SIGKILL)
    student.eval()
    last = curve[-1]
    kept = last
    if s.keep_best and best_step != last.step:
        assert best is not None
        _restore(student, best, sharded)
        kept = next(c for c in curve if c.step == best_step)
    del best
    held_el, rss = [_held(student), _held(teacher)], _peak_rss_mib()
    med = float(np.median(sent)) if sent else None
    figures: list[Any] = [(held_el, rss, med, rss0)] * world
    if world > 1:
        dist.all_gather_object(figures, (held_el, rss, med, rss0))

    def tokenizer(folder: Path) -> None:  # the student's tokenizer, else the teacher's
        copy_tokenizer([student_dir, teacher_dir], folder)

    if sharded:
        export_sharded(student, out / "model", export_dtype, extra=tokenizer)
    if rank != 0:
        dist.barrier()
        return None
    if not sharded:
        from nas.child import save_pretrained

        save_pretrained(student, out / "model", extra=tokenizer)
    record = DistillRecord(
        version=VERSION, key=key, student=str(student_dir), teacher=str(teacher_dir),
        teacher_weights=t_hash, student_init_weights=s_hash, data=data_source,
        data_sha256=data_hash, eval_data=eval_source or f"{data_source} (last rows)",
        settings=s.model_dump(mode="json"), steps=last.step, tokens_trained=last.step * s.batch_size
        * s.seq_len, held_tokens=int(ho[:, 1:].numel()), world_size=world,
        teacher_eval=teacher_eval, curve=curve, final=kept, resumed_from_step=start,
        seconds=time.perf_counter() - t0, parameters=student.num_stored(), initial=curve[0],
        last=last, kept_step=kept.step, stopped_early_at=stopped, lr=lr, sweep=sweep,
        layout=layout, activation_checkpointing=checkpointing, teacher_layout=t_layout,
        expert_parallel=ep, teacher_expert_parallel=ep_t,
        held_elements=[f[0] for f in figures], peak_rss_mib=[f[1] for f in figures],
        sent_bytes_per_step=[f[2] for f in figures], base_rss_mib=[f[3] for f in figures],
        chance_agreement=chance, notes=run_notes(curve, kept, chance))
    plot_curve(out / "kd_curve.png", record)
    atomic_write_json(done, record.model_dump())
    if world > 1:
        dist.barrier()  # every rank is done (with the checkpoint too)
    if not keep_checkpoint:  # the finished run is distill.json + model/; a rerun reads those
        remove_dir(ckpt)
    return record


def run_notes(curve: Sequence[CurvePoint], kept: CurvePoint, chance: float | None
              ) -> list[str]:
    """One line each for what a run's figures may hide: its last evaluation agrees with
    the teacher's top-1 no better than a constant guess (``chance``: the run collapsed),
    or the weights kept are the student as given (no evaluation beat step 0)."""
    out = []
    last = curve[-1]
    if chance is not None and last.step > 0 and last.top1_agreement <= chance:
        out.append(f"collapsed: at step {last.step} the student's top-1 agrees with the "
                   f"teacher's on {last.top1_agreement:.4f} of held-out positions, no better "
                   f"than a constant guess ({chance:.4f}); the learning rate is likely too "
                   "high")
    if kept.step == 0 and last.step > 0:
        out.append(f"unchanged: no evaluation beat the student as given, so the child kept "
                   f"is the unchanged start (held-out KL {kept.kl_div:.4g}; the last, at step "
                   f"{last.step}, {last.kl_div:.4g})")
    return out


def load_record(out_dir: str | Path) -> DistillRecord:
    """The :class:`DistillRecord` of a finished distillation folder."""
    path = Path(out_dir) / "distill.json"
    try:
        return DistillRecord.model_validate(read_json(path))
    except ValidationError as exc:
        loc, msg = first_error(exc)
        raise InputError(msg, path=str(path), field=loc) from None

