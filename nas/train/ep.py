"""Expert parallelism for a sharded MoE student (torch): each of the ``N`` data-parallel
ranks owns about ``E / N`` whole experts, and no rank ever gathers a whole MoE block's
experts.

:func:`shard_experts` turns a :class:`~nas.modules.moe.MoEMixer`'s stacked expert tensors
(``experts_gate`` / ``experts_up`` ``(E, width, in)``, ``experts_down`` ``(E, in, width)``)
into DTensors ``Shard(0)`` over the same 1-D mesh FSDP2 shards the rest with (rank ``r``
holds experts ``r c .. min((r+1) c, E) - 1`` with ``c = ceil(E / N)``, DTensor's own
uneven ``Shard(0)``: where ``N`` does not divide ``E`` the last ranks hold fewer, possibly
none; :func:`expert_ranges`), and returns them for ``fully_shard``'s
``ignored_params``: FSDP2 then gathers only the router, the latent projections and the
shared expert of the block. Being DTensors with FSDP2's own placement, the expert tensors
go through everything else unchanged: the state dict, :mod:`torch.distributed.checkpoint`
(a checkpoint of either layout resumes in the other, on any rank count), AdamW (its state sharded with them), gradient clipping and the streamed export.

The forward (:func:`ep_routed`, installed as the mixer's ``routed``; the router, top-k and
everything else are :class:`MoEMixer`'s own, which is left unchanged):

1. the rank's ``T * k`` (token, expert) pairs are sorted by expert (as on one rank), so
   the rows for each owning rank are contiguous; the counts per expert are exchanged
   (``all_to_all_single`` of ``N c`` integers: the experts padded to ``c`` per rank with
   counts of 0, so that an uneven split exchanges as an even one);
2. the rows go to their experts' ranks (``all_to_all_single`` with autograd:
   ``torch.distributed._functional_collectives.all_to_all_single_autograd``, whose
   backward is the reverse exchange; torch 2.13 deprecates
   ``torch.distributed.nn.functional.all_to_all_single`` for it, and gloo runs both on
   the CPU, nccl on CUDA);
3. each rank reorders what it received by local expert (source rank by source rank, so
   each expert sees its rows in the global token order one rank would), runs its experts
   with :func:`~nas.modules.moe.grouped_mm` in the compute dtype of the rows (float32
   master experts cast a block at a time, and cast again in the backward pass rather
   than kept: :class:`_Recast`), and puts the outputs back in the received order;
4. the outputs return (the reverse ``all_to_all_single``) and are combined per token in
   float32 with one ``index_add_`` in the expert-sorted order, as :meth:`MoEMixer.routed`.

Gradients: an expert's gradient on its rank sums the contributions of every rank's tokens;
FSDP2 averages the other gradients over the ranks (each rank's loss is the mean over its
own rows), so the experts' gradients are divided by ``N`` in the backward pass, and the
result equals the one-process gradient of the mean loss.

Per step and MoE block the busiest rank sends, forward, its rows for other ranks' experts,
``(N - 1) / N`` of its ``T k`` rows of ``in`` values in the compute dtype (uniform
routing), and receives as many outputs back; the backward sends the same two again
(activation checkpointing recomputes the forward: two more). The plan assumes uniform
routing; a rank whose experts draw more rows receives (and computes) more. On CUDA the
counts come to the host once per MoE block (the split sizes).
"""

from __future__ import annotations

import contextlib
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from nas.modules.layers import gated_act
from nas.modules.moe import MoEMixer, grouped_mm

EXPERT_TENSORS = ("experts_gate", "experts_up", "experts_down")


def expert_ranges(num_experts: int, world: int) -> list[tuple[int, int]]:
    """The experts ``[lo, hi)`` each of ``world`` ranks owns: ``c = ceil(E / world)`` per
    rank in order, the last ranks fewer or none where ``world`` does not divide ``E`` (the
    split of DTensor's ``Shard(0)``, ``torch.chunk``'s)."""
    c = -(-num_experts // world)
    return [(min(r * c, num_experts), min((r + 1) * c, num_experts)) for r in range(world)]


class _ScaleGrad(torch.autograd.Function):
    """The identity forward; the gradient times ``scale`` backward."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, scale: float) -> torch.Tensor:
        ctx.scale = scale
        return x.view_as(x)

    @staticmethod
    def backward(ctx, g: torch.Tensor):
        return g * ctx.scale, None


def shard_experts(mixer: MoEMixer, mesh: Any, recast: bool = True) -> set[nn.Parameter]:
    """Make ``mixer``'s stacked experts DTensors ``Shard(0)`` over the 1-D ``mesh`` and
    install the expert-parallel forward (:func:`ep_routed`); returns the expert parameters
    (for ``fully_shard(..., ignored_params=...)``). ``recast``: the experts' compute-dtype
    copies are cast again in the backward pass instead of kept (:class:`_Recast`); off
    under activation checkpointing, whose own saved-tensor hooks drop them (and every
    other tensor the block saves: hooks of ours inside its region would keep those). The
    mixer may be on the meta device
    (then only the local shape is made: ``to_empty`` gives it storage), else each rank
    keeps its rows."""
    from torch.distributed.tensor import DTensor, Shard, distribute_tensor

    world = mesh.size()
    E = mixer.cfg.num_experts
    lo, hi = expert_ranges(E, world)[mesh.get_local_rank()]
    out: set[nn.Parameter] = set()
    for name in EXPERT_TENSORS:
        p = getattr(mixer, name, None)
        if p is None:
            continue
        if isinstance(p, DTensor):
            raise ValueError(f"{name} is sharded already")
        if p.is_meta:
            local = torch.empty((hi - lo, *p.shape[1:]), dtype=p.dtype, device="meta")
            d = DTensor.from_local(local, mesh, [Shard(0)], run_check=False,
                                   shape=p.shape, stride=p.stride())
        else:
            d = distribute_tensor(p.detach(), mesh, [Shard(0)], src_data_rank=None)
        q = nn.Parameter(d, requires_grad=p.requires_grad)
        setattr(mixer, name, q)
        out.add(q)
    group = mesh.get_group()

    def routed(x: torch.Tensor, idx: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        return ep_routed(mixer, group, x, idx, w, recast)

    mixer.routed = routed  # type: ignore[method-assign]  # this instance only: MoEMixer is unchanged
    return out


def _local(p: torch.Tensor, dtype: torch.dtype, world: int) -> torch.Tensor:
    """This rank's experts of DTensor ``p`` in ``dtype``, their gradient divided by
    ``world`` (the average FSDP2 takes of the other gradients)."""
    t = _ScaleGrad.apply(p.to_local(), 1.0 / world)  # type: ignore[attr-defined]  # p is a DTensor (shard_experts)
    return t if t.dtype == dtype else t.to(dtype)


class _Recast:
    """Saved-tensor hooks for the experts' compute: a tensor saved for the backward pass
    that is (a view of) a compute-dtype copy of local master weights is kept as the master
    and cast again when the backward pass needs it, as FSDP2 gathers again instead of
    keeping its compute-dtype parameters (autograd would otherwise hold every MoE block's
    cast experts from its forward to its backward)."""

    def __init__(self) -> None:
        self.copies: dict[int, tuple[torch.Tensor, torch.dtype]] = {}
        self.alive: list[torch.Tensor] = []  # no other tensor takes their addresses

    def add(self, p: torch.Tensor, dtype: torch.dtype, world: int) -> torch.Tensor:
        t = _local(p, dtype, world)
        if t.dtype != p.dtype:
            self.copies[t.untyped_storage().data_ptr()] = (p, dtype)
            self.alive.append(t)
        return t

    def pack(self, t: torch.Tensor) -> Any:
        if not self.copies:
            return t
        hit = self.copies.get(t.untyped_storage().data_ptr())
        if hit is None:
            return t
        return (hit[0], hit[1], t.size(), t.stride(), t.storage_offset())

    @staticmethod
    def unpack(packed: Any) -> torch.Tensor:
        if isinstance(packed, torch.Tensor):
            return packed
        p, dtype, size, stride, offset = packed
        return p.to_local().detach().to(dtype).as_strided(size, stride, offset)


def _experts(mixer: MoEMixer, xl: torch.Tensor, lc: torch.Tensor, world: int,
             recast: bool) -> torch.Tensor:
    """This rank's experts on ``xl``, its rows grouped by local expert (``lc`` each), in
    the rows' dtype (float32 masters cast a block at a time: :class:`_Recast`)."""
    rc = _Recast()
    cast = recast and torch.is_grad_enabled() and mixer.experts_up.dtype != xl.dtype
    with torch.autograd.graph.saved_tensors_hooks(rc.pack, rc.unpack) if cast else \
            contextlib.nullcontext():
        up = grouped_mm(xl, rc.add(mixer.experts_up, xl.dtype, world).transpose(1, 2), lc)
        if mixer.cfg.gated:
            g = grouped_mm(xl, rc.add(mixer.experts_gate, xl.dtype, world).transpose(1, 2),
                           lc)
            h = gated_act(mixer.act, g, up)
        else:
            h = mixer.act(up)
        return grouped_mm(h, rc.add(mixer.experts_down, xl.dtype, world).transpose(1, 2), lc)


def ep_routed(mixer: MoEMixer, group: Any, x: torch.Tensor, idx: torch.Tensor,
              w: torch.Tensor, recast: bool = True) -> torch.Tensor:
    """:meth:`MoEMixer.routed` with the experts over the ranks of ``group`` (see the module
    docstring): ``x (T, in)``, ``idx`` / ``w`` ``(T, k)``; every rank of the group calls it
    (its own tokens, possibly none)."""
    from torch.distributed._functional_collectives import all_to_all_single_autograd as a2a

    world = dist.get_world_size(group)
    E = mixer.cfg.num_experts
    c = -(-E // world)  # experts per rank, the last ranks' padded with never-chosen ones
    n_local = int(mixer.experts_up.to_local().shape[0])  # type: ignore[attr-defined]  # a DTensor (shard_experts)
    T, k = idx.shape
    flat = idx.reshape(-1)
    order = torch.argsort(flat, stable=True)
    tokens = order // k
    weights = w.reshape(-1)[order]
    counts = torch.bincount(flat, minlength=world * c)
    xs = x.index_select(0, tokens)  # (T*k, in), grouped by expert, so by owning rank
    got = torch.empty_like(counts)
    dist.all_to_all_single(got, counts, group=group)  # got[s, e]: rows from rank s
    got = got.view(world, c)
    send = counts.view(world, c).sum(1).tolist()
    recv = got.sum(1).tolist()
    xr = a2a(xs.contiguous(), recv, send, group)
    # by local expert, each expert's rows source rank by source rank (the global order)
    eid = torch.repeat_interleave(torch.arange(c, device=x.device).repeat(world),
                                  got.reshape(-1), output_size=xr.shape[0])
    perm = torch.argsort(eid, stable=True)
    inv = torch.empty_like(perm)
    inv[perm] = torch.arange(len(perm), device=perm.device)
    xl = xr.index_select(0, perm)
    lc = got.sum(0)[:n_local]  # the padding experts draw no rows
    if n_local == 0:  # a rank past the last expert: no rows arrive, none leave; the
        # exchange stays in the graph so that its backward meets the other ranks', and its
        # (empty) experts get their (empty) gradients as every rank's do
        yl = xl * 0 + sum(_local(t, xl.dtype, world).sum() for t in
                          (getattr(mixer, n, None) for n in EXPERT_TENSORS) if t is not None)
    else:
        yl = _experts(mixer, xl, lc, world, recast)
    yr = yl.index_select(0, inv)
    ye = a2a(yr.contiguous(), send, recv, group)
    out = torch.zeros(T, ye.shape[-1], dtype=torch.float32, device=x.device)
    out.index_add_(0, tokens, ye.float() * weights[:, None])
    return out.to(x.dtype)
