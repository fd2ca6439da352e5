"""Child initialization from the parent's weights (Puzzle, App. A; Puzzletron for experts).

The child's blocks correspond 1:1, by index, to the parent's. Block ``i`` of the child is
initialized from block ``i`` of the parent, using the parent's own activations on the
calibration tokens (the residual stream is run through the *parent*, block by block, so
every block sees what the parent block saw):

===========================  ===============================================================
child vs parent block        rule
===========================  ===============================================================
equal config                 copied (a child equal to its parent is bitwise equal)
no-op                        dropped
attention, fewer/more KV     q, o copied; child KV head j = mean of the parent KV heads its
                             query heads used (mean-pooling K/V heads per new group); window
                             / bias / q-k-norm flags: shared tensors copied
attention -> linear          ``s * W_o @ W_v`` (V expanded per query head), ``s`` the
                             least-squares scalar on the calibration activations
FFN -> narrower FFN          channel contribution ``mean|X_i| * ||W_down[:, i]||``, top kept
FFN -> linear                ``s * W_down @ W_up`` (``s`` as above)
MoE, fewer experts           experts ranked by ``mean ||y - y_{-e}||^2``, the MoE output change
                             when expert ``e``'s router logit is -inf; top kept, router rows
                             and correction bias sliced
MoE, narrower experts        channel contribution per expert on the tokens routed to it
MoE, narrower shared expert  channel contribution
MoE, other top-k             weights kept (top-k is routing only)
Mamba, fewer heads           heads ranked per group by the channel contribution of the gated
                             norm output into ``out_proj``
Mamba, smaller state         state channels ranked per group by the energy of the SSM output
                             that flows through each channel on the calibration data
DeltaNet, fewer heads        value heads ranked by the channel contribution of the gated-norm
                             output into ``out_proj``; fewer query/key heads keep the key
                             groups with the largest summed value-head scores, then the top
                             value heads within each kept group (a child's value heads per
                             key head must not exceed the parent's)
attention <-> DeltaNet       the swapped-in block is a copy of the nearest parent block of
                             that exact config (norm and mixer), its output projection scaled
                             by the least-squares scalar onto the replaced block's output on
                             the calibration activations; else random
mamba / MoE -> linear        least-squares fit of the block output on its input
a registered kind           its own rule, the ``inherit`` its :mod:`nas.kinds` entry names
                             (Mamba-1: channels ranked by their gated output's contribution
                             into ``out_proj``, state dims by the energy of their share of
                             the scan output; :mod:`~nas.child.inherit.mamba1`)
MLA, fewer query heads       heads ranked by channel contribution into ``o_proj``; kept
                             heads' q_b / kv_b rows and o_proj columns copied
MLA, smaller kv / q rank     SVD of the (norm-folded) up-projection: top-r directions, the
                             down-projection rotated onto them (:mod:`~nas.child.inherit.mla`)
parallel attention + Mamba   each kept branch by its own rule above (attention, Mamba) on
                             the block's normed input; a dropped branch is gone and the
                             other keeps the parent's weights
gpt-oss sinks, biases        sinks copied; router / expert biases follow kept experts and
                             channels
anything else                random init (reported)
===========================  ===============================================================

Growing a width (more channels / experts than the parent) keeps the parent's and adds
channels whose output weights are zero, so the function is unchanged.
The per-block outcome is kept in ``child.init_report``.

One module per block kind holds its rules (:mod:`~nas.child.inherit.attention`,
:mod:`~nas.child.inherit.ffn`, :mod:`~nas.child.inherit.moe`, :mod:`~nas.child.inherit.mamba`,
:mod:`~nas.child.inherit.deltanet`, :mod:`~nas.child.inherit.mla`,
:mod:`~nas.child.inherit.parallel`, and a registered kind's where its :mod:`nas.kinds` entry
names it; swaps between kinds in :mod:`~nas.child.inherit.swap`); this module dispatches on the block configs and runs the
parent block by block (:func:`init_from_parent`).
"""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import TYPE_CHECKING, cast

import torch

from hwprofiles.errors import InputError
from nas.arch import (
    FFN,
    Attention,
    BlockConfig,
    Linear,
    Mamba,
    ModelArch,
    MoE,
    NoOp,
    Parallel,
)
from nas.child.checkpoint import CheckpointReader
from nas.child.inherit.attention import _attention, _attention_to_linear
from nas.child.inherit.common import _copy, _copy_all
from nas.child.inherit.ffn import _ffn, _ffn_to_linear, _lstsq_linear
from nas.child.inherit.mamba import _mamba
from nas.child.inherit.moe import _moe
from nas.child.inherit.parallel import _parallel
from nas.child.inherit.swap import swap_init, swap_source
from nas.child.random import Materializer
from nas.kinds import spec_of, swap_of
from nas.modules.granite import scalars_of
from nas.modules.mamba import MambaMixer
from nas.modules.model import CausalLM
from nas.progress import Progress

if TYPE_CHECKING:
    from nas.modules.layers import AttentionMixer, FFNMixer, LinearMixer, RMSNorm
    from nas.modules.model import Block
    from nas.modules.moe import MoEMixer
    from nas.modules.parallel import ParallelMixer

MAX_TOKENS = 8192  # calibration tokens used for importance (a prefix of the batch)


def inherit_block(pc: BlockConfig, p: torch.nn.Module | None, cc: BlockConfig, c: torch.nn.Module | None,
                  xin: torch.Tensor) -> str:
    """Initialize child mixer ``c`` (config ``cc``) from parent mixer ``p`` (config ``pc``)
    given the parent mixer's input ``xin``; returns what was done. ``p`` and ``c`` are the
    mixers :func:`nas.modules.model.make_mixer` builds for ``pc`` and ``cc`` (the casts
    below)."""
    if isinstance(cc, NoOp):
        return "dropped (no-op)"
    if p is None or c is None:
        return "random (parent block is a no-op)"
    if isinstance(cc, Linear):
        lin = cast("LinearMixer", c)
        if isinstance(pc, Attention):
            return _attention_to_linear(cast("AttentionMixer", p), lin, pc, xin)
        if isinstance(pc, FFN):
            return _ffn_to_linear(cast("FFNMixer", p), lin, xin)
        return _lstsq_linear(p, lin, xin, pc.kind)
    if type(pc) is not type(cc):
        return f"random (no rule for {pc.kind} -> {cc.kind})"
    # from here pc is of cc's type (the test above)
    if isinstance(cc, Attention):
        return _attention(cast("AttentionMixer", p), cast("AttentionMixer", c),
                          cast(Attention, pc), cc)
    if isinstance(cc, FFN):
        return _ffn(cast("FFNMixer", p), cast("FFNMixer", c), cast(FFN, pc), cc, xin)
    if isinstance(cc, MoE):
        return _moe(cast("MoEMixer", p), cast("MoEMixer", c), cast(MoE, pc), cc, xin)
    if isinstance(cc, Mamba):
        return _mamba(cast("MambaMixer", p), cast("MambaMixer", c), cast(Mamba, pc), cc, xin)
    registered = spec_of(cc)
    if registered is not None and registered.inherit is not None:  # nas.kinds: its own rule
        module, _, name = registered.inherit.partition(":")
        rule = getattr(importlib.import_module(module), name)
        return rule(p, c, pc, cc, xin)
    if isinstance(cc, Parallel):
        return _parallel(cast("ParallelMixer", p), cast("ParallelMixer", c), cast(Parallel, pc),
                         cc, xin)
    return f"random (no rule for {cc.kind})"


def _tokens(calibration_tokens: torch.Tensor | list, vocab: int) -> torch.Tensor:
    t = torch.as_tensor(calibration_tokens)
    if t.dtype.is_floating_point or t.dtype == torch.bool or t.dim() not in (1, 2) \
            or t.numel() == 0:
        raise InputError("calibration tokens must be a non-empty 1-D or 2-D integer tensor")
    t = t.long()
    if t.dim() == 1:
        t = t[None]
    if int(t.min()) < 0 or int(t.max()) >= vocab:
        raise InputError(f"calibration token ids must be in [0, {vocab}); got "
                         f"[{int(t.min())}, {int(t.max())}]")
    if t.numel() > MAX_TOKENS:
        t = t[: max(1, MAX_TOKENS // t.shape[1])]
    return t


@torch.no_grad()
def init_from_parent(child_arch: ModelArch,
                     parent_model: CausalLM | CheckpointReader | str | Path,
                     calibration_tokens: torch.Tensor | list, seed: int = 0,
                     dtype: torch.dtype | None = None, progress: bool | None = None
                     ) -> CausalLM:
    """A :class:`CausalLM` of ``child_arch`` initialized from the parent (see the module
    docstring for the rule per block); ``calibration_tokens`` are token ids
    ``(batch, length)`` or ``(length,)``. Blocks without a rule keep a random init
    (seeded by ``seed``: the same values :func:`nas.child.build_model` draws);
    ``child.init_report`` says what happened to each block.

    ``parent_model`` is a model in memory, or a checkpoint folder (ours or one transformers
    wrote; sharded, bf16 / fp16 / fp32): then the parent is streamed from its safetensors
    one block at a time in float32, and the child is built on the meta device and
    materialized block by block, so the peak memory is about the child in ``dtype`` plus one
    parent and one child block in float32 (:func:`nas.child.estimate_build_memory`).
    ``dtype`` is the child's (default: the parent's as stored); with a parent in memory the
    rules compute in the parent's dtype.
    """
    reader = None
    parent: CausalLM | None = None  # the parent in memory; None: streamed by reader
    if isinstance(parent_model, CausalLM):
        parent = parent_model
        pa = parent_model.arch
        compute = parent_model.embed.weight.dtype
        device = parent_model.embed.weight.device
        target = dtype or compute
    else:
        # an open reader is read as it is (its config already read); a folder is opened
        reader = parent_model if isinstance(parent_model, CheckpointReader) \
            else CheckpointReader(parent_model)
        pa = reader.arch
        compute, device = torch.float32, torch.device("cpu")
        target = dtype or reader.stored_dtype()
    if (child_arch.hidden_size, child_arch.vocab_size) != (pa.hidden_size, pa.vocab_size):
        raise InputError(f"child hidden/vocab ({child_arch.hidden_size}, "
                         f"{child_arch.vocab_size}) must equal the parent's "
                         f"({pa.hidden_size}, {pa.vocab_size})")
    if child_arch.num_blocks != pa.num_blocks:
        raise InputError(f"child has {child_arch.num_blocks} blocks but the parent has "
                         f"{pa.num_blocks}; blocks correspond 1:1 (use no-op to drop one)")
    tokens = _tokens(calibration_tokens, pa.vocab_size).to(device)

    def part(name: str) -> torch.nn.Module | None:
        """The parent's submodule ``name`` (loaded when streaming)."""
        if reader is None:  # the parent is in memory
            return cast(CausalLM, parent).get_submodule(name)
        if getattr(reader.model, name.split(".")[0], None) is None:
            return None
        return reader.materialize(name, compute)

    def done(name: str) -> None:
        if reader is not None:
            reader.release(name)

    with torch.device("meta"):
        child = CausalLM(child_arch)
    was_training = parent.training if parent is not None else False
    if parent is not None:
        parent.eval()
    report = []
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        mat = Materializer(child, target)
        mat.nonblock()
        for m in (child.embed, child.lm_head, child.norm):
            if m is not None:
                m.to(device)
        emb = cast(torch.nn.Embedding, part("embed"))  # every CausalLM has one
        _copy(child.embed.weight, emb.weight)
        x = emb(tokens).to(compute)
        if scalars_of(pa).embedding != 1.0:  # Granite's embedding_multiplier
            x = x * scalars_of(pa).embedding
        if child.lm_head is not None:
            # an untied parent has an lm_head (a Linear); a tied one's is its embedding
            head = cast(torch.nn.Linear, part("lm_head")) if pa.tie_embeddings is False else emb
            _copy(child.lm_head.weight, head.weight)
            if head is not emb:
                done("lm_head")
        done("embed")
        if child.norm is not None and pa.final_norm:
            _copy(child.norm.weight, cast("RMSNorm", part("norm")).weight)  # pa.final_norm
            done("norm")
        with Progress(pa.num_blocks, "init", progress) as bar:
            for i in range(pa.num_blocks):
                pb = cast("Block", part(f"blocks.{i}"))  # a parent always has its blocks
                cb = mat.block(i, dtype=compute).to(device)
                pc, cc = pa.blocks[i], child_arch.blocks[i]
                if pc == cc:
                    _copy_all(cb, pb)
                    what = "copied"
                elif swap_of(pc, cc) is not None:
                    j = swap_source(pa, i, cc)
                    if j is None:
                        what = f"random (no parent {cc.kind} block of this config)"
                    else:
                        what = swap_init(cb, pb, cast("Block", part(f"blocks.{j}")), j, x)
                        if j != i:
                            done(f"blocks.{j}")
                elif cb.mixer is None or pb.mixer is None:
                    what = inherit_block(pc, pb.mixer, cc, cb.mixer, x)
                else:
                    # a Block with a mixer has a norm (Block.__init__)
                    assert cb.norm is not None and pb.norm is not None
                    _copy(cb.norm.weight, pb.norm.weight)
                    what = inherit_block(pc, pb.mixer, cc, cb.mixer, pb.norm(x))
                if isinstance(pb.mixer, MambaMixer) and isinstance(cb.mixer, MambaMixer):
                    cb.mixer.chunk_size = pb.mixer.chunk_size  # the scan's rounding depends on it
                report.append(f"block {i} {pc.describe()} -> {cc.describe()}: {what}")
                if i + 1 < pa.num_blocks:
                    x = pb(x)
                child.blocks[i] = cb.to(target)
                done(f"blocks.{i}")
                bar.update(1)
    child.init_report = report
    if parent is not None:
        parent.train(was_training)
    return child
