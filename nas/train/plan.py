"""``puzzle-nas distill --plan``: memory per rank and time per phase of a distillation, from
the child's and the teacher's configs alone (no torch, no weights, no data).

Memory per rank (bytes), for the layout :func:`nas.train.distill.distill` runs (``P_s``, ``P_t``:
the student's and the teacher's parameters; ``N`` ranks; FSDP2 pads each tensor's dim 0 to
a multiple of ``N``, at most ``N - 1`` rows per tensor more than ``P / N``):

* **weights**: the teacher's shard ``P_t / N`` in its compute dtype (the mixed-precision
  dtype when given: it is held in it) and the student's ``P_s / N`` in its master dtype
  (float32 under mixed precision); with ``replicas`` (or one rank) the whole of both;
* **gradients**: the student's, sharded like it, in the master dtype;
* **optimizer**: AdamW's two moments, in the master dtype;
* **kept copies**: one more copy of the student's (shards of) weights: the best
  evaluation's (``keep_best``, the default) or, during a learning-rate sweep, the student
  as given that each trial is put back to (the two are never held at once);
* **gathered**: what FSDP2 unshards at a time: the root unit (final norm and head; with a
  tied head the embedding too) of each model, kept through the step, and the two largest
  other units (blocks, and the embedding of an untied model: the one computing and the one
  prefetched), student parameters and their unsharded gradients in the compute dtype,
  teacher parameters in its dtype. With **expert parallelism** (:mod:`nas.train.ep`, the
  default for a MoE student on sharded ranks) a MoE block's unit holds no routed expert:
  each rank keeps its experts whole, rank 0 the most, ``ceil(E / N)`` (``E / N`` where
  ``N`` divides ``E``; its weights, gradients and AdamW state are priced at that share),
  and, under mixed precision, casts one block's local experts to the compute dtype at a
  time (``ceil(E / N) / E`` of the largest block's experts);
* **activations**: for the rows of one forward pass (the rank's share of the global
  batch, ``batch / N``, or one micro-batch of it under gradient accumulation) of
  ``seq_len`` tokens, what autograd keeps for the backward pass per block and token,
  read off the modules (:mod:`nas.modules`; checked against
  ``torch.autograd.graph.saved_tensors_hooks`` on each block kind in the tests):

  - every block: its input, the norm's output and the branch output, ``3 h`` values, plus
    twice its widest intermediate (the inputs and outputs of its projections; the widest
    is :mod:`costmodels.blocks`' workspace width);
  - attention: the widest (q, k, v) once, as the attention kernel saves them, and its
    output (the output projection's input), ``heads * head_dim``;
  - MoE (instead): ``3 h``; per routed copy of a token (``top_k``) the dispatched input
    and the weighted output, ``2 h``, and the expert's ``(2 m - 1) * width`` (``m`` = 3
    matrices gated, 2 not: each up projection's output, the activation's, the product);
    the shared expert's ``2 (m - 1) * width``; the router's ``2 * experts``;
  - Mamba-2 (``H`` heads, ``d = H * head_dim``, ``G`` groups, state ``N``, chunk ``C`` =
    64 of :func:`nas.modules.mamba.ssd_chunked`): the scan's per-head ``(C x C)`` decays
    and their products, ``2 H C``; the per-channel tensors (x, z, dt, the conv's input and
    output, the gated norm's, the scan's output), ``9 d``; B and C per group, ``6 G N``;
    ``C B^T`` per group, ``G C``; the chunk states, ``2 d N / C`` (tensor counts of the
    module's autograd graph: exact on 8 shapes);

  with activation checkpointing only each block's input is kept, plus one block's whole
  set while it is recomputed.
* **logits**: the loss makes the logits one chunk of positions at a time under activation
  checkpointing (:func:`nas.train.distill.kd_loss_hidden`), so per rank the final hidden states
  of student and teacher (``T * h * (e_c + e_t)`` for ``T`` tokens) and, for one chunk of
  ``T_c`` tokens (:data:`nas.train.distill.CHUNK_BYTES` of float32 logits), the logits of both
  and the float32 tensors of the KL (the two log-softmaxes, the teacher's probabilities
  and their product, the logits' gradient), ``T_c * V * (e_c + e_t + 28)`` bytes. The
  evaluation makes its float64 logits a chunk at a time too, within the same bound.

Time per phase (seconds) is a roofline lower bound from the hardware profile (dense GEMM
FLOPs at the matmul peak and efficiency of the compute dtype; attention's quadratic term,
the host and the optimizer step left out), per rank: a training step is the teacher's
forward (``2`` FLOPs per active parameter and token, plus the head) and the student's
forward and backward (``6``, ``8`` with activation checkpointing); an evaluation runs both
forwards on ``eval_tokens``. **Communication** is what FSDP2 moves per rank over the
scale-up link (``interconnect.bandwidth`` at its ``link`` efficiency): the teacher
gathered once per step and the student twice (forward and backward), and the gradients
reduce-scattered in float32 under mixed precision (else the master dtype), each
``(N - 1) / N`` of the whole; with replicas, the gradients' all-reduce, twice that; with
expert parallelism the routed experts are neither gathered nor reduced, and the tokens'
``all_to_all`` to their experts and back is sent instead (:func:`step_bytes_sent`). FSDP2
overlaps it with compute, so a step lasts at least the larger of the two.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from hwprofiles.schema import HardwareProfile
from nas.arch import Attention, Mamba, ModelArch, MoE

DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
MAMBA_CHUNK = 64  # the Mamba-2 module's chunk_size (nas.modules.mamba; checked in the tests)
KL_FLOAT32_TENSORS = 7  # kd_loss' float32 tensors of the vocabulary's size per token
CHUNK_BYTES = 64 * 2**20  # nas.train.distill.CHUNK_BYTES (torch-free copy, checked in the tests)


HALF = ("bfloat16", "float16")


def stage_ranges(block_params: np.ndarray | list[float], world: int, first: float = 0.0
                 ) -> list[tuple[int, int]]:
    """Contiguous ranges ``[a, b)`` of blocks, one per rank, that minimize the largest
    rank's parameters (``first``: what rank 0 holds besides its blocks, the embedding of
    an untied teacher). An exact linear partition (binary search on the bound, greedy
    check); a rank may get no block when there are fewer blocks than ranks."""
    w = [float(x) for x in block_params]
    n = len(w)

    def cut(bound: float) -> list[tuple[int, int]] | None:
        out, a, load = [], 0, first
        for i, x in enumerate(w):
            if load + x > bound and (i > a or load > 0):
                out.append((a, i))
                a, load = i, 0.0
                if load + x > bound:
                    return None
            load += x
        out.append((a, n))
        return out if len(out) <= world else None

    lo, hi = max([first, *w]), first + sum(w)
    best = cut(hi)
    for _ in range(100):  # bisection to within one parameter
        if hi - lo <= 0.5:
            break
        mid = (lo + hi) / 2
        got = cut(mid)
        if got is None:
            lo = mid
        else:
            hi, best = mid, got
    assert best is not None
    return best + [(n, n)] * (world - len(best))


def stored_dtype(cfg: dict) -> str:
    """A checkpoint config's non-quantized dtype as the loader reads it (float32 when
    unstated)."""
    d = str(cfg.get("torch_dtype") or cfg.get("dtype") or "float32")
    return d if d in HALF else "float32"


def resolve_mixed_precision(mixed: str | None, dtype: str | None, student_stored: str,
                            teacher_stored: str, replicas: bool = False) -> str | None:
    """The mixed-precision dtype a distillation runs with, ``mixed`` resolved.

    ``"auto"`` (the default): with ``dtype`` given, none (that dtype holds the master
    weights and computes: ``dtype="bfloat16"`` is pure bf16); else a checkpoint stored in
    16 bits (the student's dtype first, then the teacher's) computes in its dtype from
    float32 master weights and AdamW state; float32 checkpoints train in float32. An
    explicit dtype or None passes through. Mixed precision runs on FSDP2, so ``replicas``
    with a 16-bit checkpoint under ``"auto"`` is refused (:class:`ValueError`)."""
    if mixed != "auto":
        return mixed
    if dtype is not None:
        return None
    half = next((d for d in (student_stored, teacher_stored) if d in HALF), None)
    if half is not None and replicas:
        raise ValueError(
            f"a {half} checkpoint trains by default in mixed precision (float32 master "
            "weights and AdamW state), which runs on FSDP2, not on replicas: drop "
            f"--replicas, or train in pure {half} (--mixed-precision none)")
    return half


def teacher_stages(teacher: ModelArch, world: int) -> list[tuple[int, int]]:
    """The blocks each rank holds of a pipelined teacher (:mod:`nas.train.teacher`): ranges
    balanced by parameters, rank 0's embedding (untied) counted with its blocks."""
    return stage_ranges(teacher.block_params(), world, _root_and_embed(teacher)[1])


def routed_expert_params(arch: ModelArch) -> np.ndarray:
    """Parameters of each block's stacked routed experts (``experts_gate`` / ``_up`` /
    ``_down``: ``(2 or 3) * E * width * in``, ``in`` the latent size or the hidden size);
    0 for other blocks."""
    out = np.zeros(arch.num_blocks)
    for i, b in enumerate(arch.blocks):
        if b.kind == "moe":
            assert isinstance(b, MoE)
            inner = b.latent_size or arch.hidden_size
            out[i] = (2 + int(b.gated)) * b.num_experts * b.expert_width * inner
    return out


def busiest_expert_params(arch: ModelArch, world: int) -> np.ndarray:
    """Per block, the routed expert parameters the busiest rank (rank 0) holds under expert
    parallelism on ``world`` ranks: ``ceil(E / N)`` of the ``E`` experts
    (:func:`nas.train.ep.expert_ranges`)."""
    out = routed_expert_params(arch)
    for i, b in enumerate(arch.blocks):
        if isinstance(b, MoE):
            out[i] *= -(-b.num_experts // world) / b.num_experts
    return out


def resolve_expert_parallel(mode: str | bool, child: ModelArch, world: int, layout: str
                            ) -> bool:
    """Whether a run shards the student's MoE experts whole over the ranks
    (:mod:`nas.train.ep`). ``auto``: when the student has MoE blocks and the layout is
    ``sharded`` (FSDP2) on more than one rank (experts that do not divide over the ranks
    split as DTensor's ``Shard(0)`` does, :func:`nas.train.ep.expert_ranges`); ``on``: the
    same, refused (:class:`ValueError`, one line) where it cannot run; ``off``: never. A
    bool passes through."""
    if isinstance(mode, bool):
        return mode
    if mode not in ("auto", "on", "off"):
        raise ValueError(f"expert parallelism {mode!r}: auto, on or off")
    if mode == "off":
        return False
    experts = [b.num_experts for b in child.blocks if isinstance(b, MoE)]
    why = None
    if not experts:
        why = "the student has no MoE block"
    elif layout != "sharded" or world < 2:
        why = "it runs on sharded ranks (--nproc 2 or more, without --replicas)"
    if why is None:
        return True
    if mode == "on":
        raise ValueError(f"--expert-parallel on: {why} (use a rank count that fits, or "
                         "--expert-parallel off)")
    return False


@dataclass(frozen=True)
class DistillPlan:
    """A distillation's plan per rank (every rank holds the same share; see the module
    docstring). Bytes and seconds."""

    world: int
    layout: str
    """``"whole"`` (one rank), ``"replicas"`` (DDP) or ``"sharded"`` (FSDP2)."""
    teacher_weights: float
    student_weights: float
    gradients: float
    optimizer: float
    copies: float
    gathered: float
    activations: float
    logits: float
    phases: dict[str, float]
    steps: int
    tokens: int
    dtypes: tuple[str, str, str]
    """(teacher held in, student master, compute)."""
    hardware: str | None
    capacity: float | None
    hints: tuple[str, ...] = ()
    """Settings of the run that would lower the memory (for the refusal)."""
    teacher_layout: str = "whole"
    """``whole`` (one rank, replicas), ``sharded`` (FSDP2) or ``pipelined``."""
    sent_per_step: float = 0.0
    """Bytes the busiest rank sends per training step (:func:`step_bytes_sent`)."""
    expert_parallel: bool = False
    """The student's experts sharded whole over the ranks (:mod:`nas.train.ep`)."""
    teacher_expert_parallel: bool = False
    """A sharded teacher's experts too (never with a pipelined one: nothing is gathered)."""

    @property
    def total(self) -> float:
        return (self.teacher_weights + self.student_weights + self.gradients + self.optimizer
                + self.copies + self.gathered + self.activations + self.logits)

    def fits(self) -> bool:
        return self.capacity is None or self.total <= self.capacity

    def figures(self) -> dict[str, float]:
        return {"teacher": self.teacher_weights, "student": self.student_weights,
                "gradients": self.gradients, "optimizer": self.optimizer,
                "kept copies": self.copies, "gathered": self.gathered,
                "activations": self.activations, "logits": self.logits}

    def refusal(self) -> str:
        gib = 2**30
        parts = ", ".join(f"{k} {v / gib:.2f}" for k, v in self.figures().items())
        hints = ["add ranks", "lower --batch or --seq-len"] + list(self.hints) + \
            ["or use a device with more memory"]
        return (f"the plan does not fit: every rank needs {self.total / gib:.2f} GiB ({parts}) "
                f"of {self.capacity / gib:.2f} GiB per rank; "  # type: ignore[operator]  # capacity is set whenever the plan does not fit
                + ", ".join(hints))

    def lines(self) -> list[str]:
        gib = 2**30
        t, m, c = self.dtypes
        out = [f"plan: {self.world} rank(s), {self.layout}, {self.steps:,} steps, "
               f"{self.tokens:,} training tokens; teacher in {t}"
               + (f" ({self.teacher_layout}"
                  + (", expert parallel" if self.teacher_expert_parallel else "") + ")"
                  if self.world > 1 else "")
               + f", student master weights {m}, compute {c}"
               + (", experts sharded over the ranks (expert parallel)"
                  if self.expert_parallel else "")
               + "; memory per rank in GiB "
               "(2^30 bytes)"]
        for k, v in self.figures().items():
            out.append(f"  {k:<12} {v / gib:9.2f}")
        out.append(f"  {'total':<12} {self.total / gib:9.2f}")
        if self.capacity is not None:
            out.append(f"capacity per rank: {self.capacity / gib:.2f} GiB "
                       f"({'fits' if self.fits() else 'does not fit'})")
        if self.world > 1:
            out.append(f"sent per training step by the busiest rank: "
                       f"{self.sent_per_step / 1e9:,.3f} GB (1e9 bytes)")
        if self.hardware is not None:
            ph = ", ".join(f"{k} {v:,.1f} s" for k, v in self.phases.items())
            out.append(f"time on {self.hardware} (roofline lower bound per rank; FSDP2 "
                       f"overlaps communication with compute): {ph}")
        return out


def _root_and_embed(arch: ModelArch) -> tuple[float, float]:
    """Parameters of the FSDP2 root unit (final norm and head; with a tied head also the
    embedding) and of the embedding's own unit (0 when tied)."""
    nonblock = float(sum(arch.nonblock_role_params().values()))
    if arch.tie_embeddings:
        return nonblock, 0.0
    embed = float(arch.hidden_size * arch.vocab_size)
    return nonblock - embed, embed


def _widest(arch: ModelArch) -> np.ndarray:
    """Widest intermediate per block, values per token (costmodels' workspace width)."""
    import hwprofiles
    from costmodels.blocks import price_blocks
    from costmodels.dtypes import get_recipe

    costs = price_blocks(arch.table, hwprofiles.get("h100-sxm"), get_recipe("bf16"),
                         ["isl=256,osl=1,batch=1"])
    ws = np.asarray(costs.workspace_bytes_per_token, dtype=float) / 2.0  # bf16 activations
    return np.where(ws > 0, ws - 2.0 * arch.hidden_size, 0.0)


def saved_values_per_token(arch: ModelArch) -> np.ndarray:
    """Values per token each block keeps for its backward pass (see the module docstring);
    0 for a no-op."""
    h = float(arch.hidden_size)
    wide = _widest(arch)
    out = np.zeros(arch.num_blocks)
    for i, b in enumerate(arch.blocks):
        if b.kind == "noop":
            continue
        v = 3 * h + 2 * wide[i]
        # (each assert: a built-in kind's name picks its config class)
        if b.kind == "attention":  # q, k, v saved once (for the attention kernel), then
            assert isinstance(b, Attention)
            v = 3 * h + wide[i] + b.num_heads * b.head_dim
        elif b.kind == "moe":
            assert isinstance(b, MoE)
            mats = 2 + int(b.gated)
            v = (3 * h + b.top_k * (2 * h + (2 * mats - 1) * b.expert_width)
                 + 2 * (mats - 1) * b.shared_width + 2 * b.num_experts)
        elif b.kind == "mamba":
            assert isinstance(b, Mamba)
            c, di = MAMBA_CHUNK, b.num_heads * b.head_dim
            g, n = b.n_groups, b.state_size
            v += (2 * b.num_heads * c + 9 * di + 6 * g * n + g * c
                  + 2 * di * n / c)
        out[i] = v
    return out


def distill_plan(child: ModelArch, teacher: ModelArch, *, world: int, replicas: bool,
                 batch: int, seq_len: int, tokens: int, eval_every: int, eval_tokens: int,
                 teacher_dtype: str, student_dtype: str, mixed_precision: str | None,
                 keep_best: bool, lr_sweep: int, sweep_steps: int | None,
                 checkpointing: bool, hw: HardwareProfile | None = None,
                 capacity: float | None = None, teacher_layout: str = "pipelined",
                 backend: str = "nccl", expert_parallel: str | bool = "auto",
                 micro_batch: int | None = None) -> DistillPlan:
    """The plan of distilling ``child`` from ``teacher`` on ``world`` ranks.

    ``micro_batch``: rows per forward and backward pass on a rank (gradient accumulation
    over the rank's ``batch / world`` rows; None: all of them at once): the activations
    and logits are a micro-batch's, and the sharded student is gathered for each
    micro-batch's forward and backward and its gradients reduce-scattered each time.

    ``backend``: the collectives' (``nccl``, or ``gloo`` on the CPU), for the bytes sent;
    ``teacher_dtype`` / ``student_dtype``: the dtypes each is loaded in (``--dtype`` or the
    checkpoint's non-quantized dtype); ``mixed_precision``: resolved
    (:func:`resolve_mixed_precision`), not ``"auto"``; ``lr_sweep``: the number of rates
    tried; ``expert_parallel``: ``auto``, ``on`` or ``off``
    (:func:`resolve_expert_parallel`)."""
    if mixed_precision == "auto":
        raise ValueError("mixed_precision 'auto' is resolved first (resolve_mixed_precision)")
    layout = "whole" if world == 1 else ("replicas" if replicas else "sharded")
    ep = resolve_expert_parallel(expert_parallel, child, world, layout)
    share = 1.0 / world if layout == "sharded" else 1.0
    piped = layout == "sharded" and teacher_layout == "pipelined"
    # a sharded teacher's experts: whenever they divide (it is only run forward)
    ep_t = not piped and expert_parallel not in ("off", False) and \
        resolve_expert_parallel("auto", teacher, world, layout)
    e_t = DTYPE_BYTES[mixed_precision or teacher_dtype]
    e_m = 4 if mixed_precision else DTYPE_BYTES[student_dtype]
    e_c = DTYPE_BYTES[mixed_precision or student_dtype]
    p_s = float(child.block_params().sum() + sum(child.nonblock_role_params().values()))
    p_t = float(teacher.block_params().sum() + sum(teacher.nonblock_role_params().values()))
    root_s, embed_s = _root_and_embed(child)
    root_t, embed_t = _root_and_embed(teacher)
    steps = math.ceil(tokens / (batch * seq_len))
    local = batch // world * seq_len  # tokens per rank and step
    rows = batch // world
    micro = min(micro_batch or rows, max(rows, 1))  # rows per forward / backward pass
    n_micro = max(1, rows // micro)
    passed = micro * seq_len  # tokens per pass: what the activations and logits hold

    weights_t, weights_s = p_t * e_t * share, p_s * e_m * share
    if piped:  # the largest rank's range of blocks, the head and final norm on every rank
        ranges = teacher_stages(teacher, world)
        bp = teacher.block_params().astype(float)
        loads = [float(bp[a:b].sum()) + (embed_t if r == 0 else 0.0)
                 for r, (a, b) in enumerate(ranges)]
        weights_t = (max(loads) + root_t) * e_t
    # experts that do not divide over the ranks: rank 0 holds ceil(E / N) of them
    uneven = float(busiest_expert_params(child, world).sum()
                   - routed_expert_params(child).sum() / world) if ep else 0.0
    weights_s += uneven * e_m
    grads, optim = (p_s * share + uneven) * e_m, 2 * (p_s * share + uneven) * e_m
    copies = float(keep_best or lr_sweep > 0) * p_s * e_m * share
    gathered = 0.0
    if layout == "sharded":
        units = child.block_params().astype(float)
        if ep:  # the experts are no block's unit: each rank casts its own, a block at a time
            units = units - routed_expert_params(child)
            gathered += busiest_expert_params(child, world).max() * e_c \
                if e_c != e_m else 0.0
        top_s = np.sort(np.append(units, embed_s))[-2:].sum()
        units_t = teacher.block_params().astype(float)
        if ep_t:
            units_t = units_t - routed_expert_params(teacher)
        top_t = np.sort(np.append(units_t, embed_t))[-2:].sum()
        gathered += (root_s + top_s) * e_c * 2
        if not piped:
            gathered += (root_t + top_t) * e_t
    saved = saved_values_per_token(child)
    if checkpointing:
        acts = passed * e_c * (child.hidden_size * np.count_nonzero(saved)
                               + (saved.max() if saved.size else 0.0))
    else:
        acts = passed * e_c * saved.sum()
    chunk = micro * max(1, CHUNK_BYTES // (4 * child.vocab_size * max(micro, 1)))
    logits = (passed * child.hidden_size * (e_c + e_t)
              + min(chunk, passed) * child.vocab_size * (e_c + e_t + 4 * KL_FLOAT32_TENSORS))

    hints = []
    if not checkpointing:
        hints.append("use --activation-checkpointing")
    if micro > 1:
        hints.append("--micro-batch 1 (gradients accumulated a row at a time)")
    if keep_best or lr_sweep:
        hints.append("--keep-last without --lr-sweep (no kept copy)")
    if mixed_precision:
        hints.append("--mixed-precision none (pure 16-bit: master weights and AdamW state "
                     "in the compute dtype, not float32)")
    elif student_dtype == "float32":
        hints.append("--dtype bfloat16")
    phases: dict[str, float] = {}
    if hw is not None:
        phases = _phases(child, teacher, hw, world, layout, local, steps, eval_every,
                         eval_tokens, lr_sweep, sweep_steps, checkpointing, p_s, p_t,
                         e_t, e_c, e_m, mixed_precision, piped, batch * seq_len, backend,
                         ep, ep_t, n_micro)
    return DistillPlan(world, layout, weights_t, weights_s, grads, optim, copies, gathered,
                       float(acts), float(logits), phases, steps, steps * batch * seq_len,
                       (mixed_precision or teacher_dtype,
                        "float32" if mixed_precision else student_dtype,
                        mixed_precision or student_dtype),
                       None if hw is None else hw.name, capacity, tuple(hints),
                       "pipelined" if piped else ("sharded" if layout == "sharded" else "whole"),
                       step_bytes_sent(child, teacher, world, layout, batch * seq_len, e_t, e_c,
                                       e_m, bool(mixed_precision), piped, backend, ep,
                                       checkpointing, ep_t, n_micro), ep, ep_t)


def step_bytes_sent(child: ModelArch, teacher: ModelArch, world: int, layout: str,
                    global_tokens: int, e_t: int, e_c: int, e_m: int, mixed: bool,
                    piped: bool, backend: str = "nccl", expert_parallel: bool = False,
                    checkpointing: bool = False, teacher_expert_parallel: bool = False,
                    micro_batches: int = 1) -> float:
    """Bytes the busiest rank sends in one training step (evaluations and checkpoints
    apart), as the run moves them: ring collectives send ``(N - 1) / N`` of what they
    gather or reduce. ``micro_batches``: passes per step (gradient accumulation): the
    sharded student's gathers and reduce-scatters and the counts exchanges happen in each,
    DDP's all-reduce once; the rows sent (teacher activations, routed tokens) are the
    same in all.

    * **replicas** (DDP): the gradients' all-reduce, twice the student in its dtype;
    * **sharded student** (FSDP2): its parameters gathered for the forward and again for
      the backward in the compute dtype, its gradients reduce-scattered (float32 under
      mixed precision): ``(N - 1) / N`` of them on nccl, but ``2 (N - 1) / N`` on gloo,
      whose reduce-scatter sends what an all-reduce does (measured here: 200 MB sent per
      rank for a 200 MB reduce-scatter on 2 ranks, 300 MB on 4, as its all-reduce);
    * **sharded teacher**: gathered once, in its dtype (with ``teacher_expert_parallel``
      without its routed experts, and two ``all_to_all`` per MoE block instead, forward
      only);
    * **pipelined teacher** (:mod:`nas.train.teacher`): a stage's output for every rank's
      rows, ``global_tokens * hidden`` values in the teacher's dtype (the last stage sends
      ``(N - 1) / N`` of that back to the ranks instead), and its rows' token ids to rank 0
      (8 bytes each)."""
    if world == 1:
        return 0.0
    p_s = float(child.block_params().sum() + sum(child.nonblock_role_params().values()))
    p_t = float(teacher.block_params().sum() + sum(teacher.nonblock_role_params().values()))
    ring = (world - 1) / world
    if layout != "sharded":
        return 2 * p_s * e_m * ring
    rs = 2.0 if backend == "gloo" else 1.0
    a2a = 0.0
    if expert_parallel:
        p_s -= float(routed_expert_params(child).sum())
        fwd = 2 if checkpointing else 1
        a2a += _a2a_bytes(child, global_tokens / world, e_c, 2 * fwd + 2,
                          fwd * micro_batches, world) * ring
    sent = (2 * p_s * e_c + rs * p_s * (4 if mixed else e_m)) * ring * micro_batches + a2a
    if piped:
        return sent + global_tokens * teacher.hidden_size * e_t + global_tokens / world * 8
    if teacher_expert_parallel:
        p_t -= float(routed_expert_params(teacher).sum())
        sent += _a2a_bytes(teacher, global_tokens / world, e_t, 2, 1, world) * ring
    return sent + p_t * e_t * ring


def _a2a_bytes(arch: ModelArch, tokens: float, item: int, exchanges: int, forwards: int,
               world: int) -> float:
    """Bytes of ``arch``'s expert-parallel ``all_to_all`` per step, all of it (the caller
    takes the share for other ranks): ``exchanges`` of the rank's ``tokens * top_k``
    routed rows of ``in`` values per MoE block, and the counts per expert (8 bytes each,
    ``ceil(E / N)`` per rank) once per forward."""
    out = 0.0
    for b in arch.blocks:
        if isinstance(b, MoE):
            inner = b.latent_size or arch.hidden_size
            per_rank = -(-b.num_experts // world)
            out += exchanges * tokens * b.top_k * inner * item + forwards * world * per_rank * 8
    return out


def _phases(child: ModelArch, teacher: ModelArch, hw: HardwareProfile, world: int,
            layout: str, local: int, steps: int, eval_every: int, eval_tokens: int,
            lr_sweep: int, sweep_steps: int | None, checkpointing: bool, p_s: float,
            p_t: float, e_t: int, e_c: int, e_m: int, mixed_precision: str | None,
            piped: bool = False, global_tokens: int = 0, backend: str = "nccl",
            expert_parallel: bool = False, teacher_expert_parallel: bool = False,
            micro_batches: int = 1) -> dict[str, float]:
    from costmodels.roofline import Roof

    roof = Roof(hw)
    cdt = "fp16" if (mixed_precision or "") == "float16" else "bf16"
    if cdt not in hw.peak_flops:
        cdt = next(iter(hw.peak_flops))

    def seconds(flops: float) -> float:
        return float(roof.matmul(cdt, flops) * flops) if flops else 0.0

    a_s = float(child.block_params(active=True).sum())
    a_t = float(teacher.block_params(active=True).sum())
    hv_s, hv_t = child.hidden_size * child.vocab_size, teacher.hidden_size * teacher.vocab_size
    # a pipelined teacher: GPipe's forward-only schedule runs N microbatches over N stages
    # in 2N - 1 slots of a stage's share, (2N - 1) / N of the rank's own teacher forward
    t_fwd = local * 2 * a_t * ((2 * world - 1) / world if piped else 1.0)
    per_step = t_fwd + local * (2 * hv_t + (8 if checkpointing else 6) * a_s + 6 * hv_s)
    evals = steps // eval_every + 1
    per_eval = math.ceil(eval_tokens / world) * 2 * (a_t + hv_t + a_s + hv_s)
    trial = sweep_steps if sweep_steps is not None else max(1, steps // 4)
    out = {"training": seconds(per_step) * steps + seconds(per_eval) * evals}
    if lr_sweep:
        out["sweep"] = lr_sweep * (seconds(per_step) * trial
                                   + seconds(per_eval) * (trial // eval_every + 1))
    if world > 1:
        moved = step_bytes_sent(child, teacher, world, layout, global_tokens, e_t, e_c, e_m,
                                bool(mixed_precision), piped, backend, expert_parallel,
                                checkpointing, teacher_expert_parallel, micro_batches)
        bw = hw.interconnect.bandwidth.value * float(hw.efficiency.link.at(moved))
        out["communication"] = moved / bw * (steps + (lr_sweep * trial if lr_sweep else 0))
    return out
