"""Pre-norm residual blocks and the causal LM that stacks any :class:`~nas.arch.ModelArch`.

Module names (what ``state_dict`` keys look like; :mod:`nas.child` maps them to HF names):
``embed.weight``, ``blocks.{i}.norm.weight``, ``blocks.{i}.mixer.<mixer params>``,
``norm.weight`` (final norm), ``lm_head.weight`` (absent when embeddings are tied).
MTP blocks (``arch.mtp_blocks``) are not built: they are a training / speculative-decoding
head, not part of the next-token forward, and ``ModelArch.param_counts().total`` excludes
them too.
"""

from __future__ import annotations

import importlib
import math
from typing import Any, cast

import torch
from torch import nn

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
from nas.modules.gpt_oss import GptOssMoEMixer, SinkAttentionMixer, is_gpt_oss_moe
from nas.modules.granite import (
    GRANITE,
    GraniteFFNMixer,
    GraniteMoEMixer,
    scalars_of,
)
from nas.modules.layers import (
    AttentionMixer,
    FFNMixer,
    LinearMixer,
    RMSNorm,
    default_out_std,
)
from nas.modules.mamba import MambaMixer
from nas.modules.moe import MoEMixer
from nas.modules.parallel import MuPFFNMixer, ParallelMixer


def make_mixer(cfg: BlockConfig, arch: ModelArch) -> nn.Module | None:
    """The mixer module for one block config (``None`` for a no-op)."""
    h = arch.hidden_size
    if isinstance(cfg, Attention) and cfg.sinks:
        return SinkAttentionMixer(cfg, h, arch.rope_theta, arch.norm_eps,
                                  arch.hf_extra.get("rope_scaling"), arch.norm_unit_offset)
    if isinstance(cfg, MoE) and is_gpt_oss_moe(cfg):
        return GptOssMoEMixer(cfg, h)
    if isinstance(cfg, Attention):
        return AttentionMixer(cfg, h, arch.rope_theta, arch.norm_eps,
                              arch.hf_extra.get("rope_scaling"), arch.norm_unit_offset,
                              scale=scalars_of(arch).attention_scale)
    if isinstance(cfg, Mamba | Parallel):
        extra = arch.hf_extra
        # the clamp is time_step_limit alone, as mamba_ssm's dt_limit and NVIDIA's NemotronH
        # code; time_step_min is only the low end of dt_bias's initial range (transformers
        # < 5.25 also clamped NemotronH at it, huggingface/transformers#48989)
        lim = extra.get("time_step_limit") or [0.0, math.inf]
        dt_limit = (float(lim[0]), float(lim[1]))
        if isinstance(cfg, Parallel):  # Falcon-H1: attention + Mamba-2 side by side
            return ParallelMixer(cfg, arch, dt_limit=dt_limit)
        return MambaMixer(cfg, h, arch.norm_eps, dt_limit=dt_limit)
    if isinstance(cfg, MoE):
        return GraniteMoEMixer(cfg, h) if arch.model_type == GRANITE else MoEMixer(cfg, h)
    if isinstance(cfg, FFN) and arch.mup is not None:  # Falcon-H1's muP MLP multipliers
        return MuPFFNMixer(cfg, h, arch.mup)
    if isinstance(cfg, FFN):  # Granite's dense layer: its shared MLP (fused gate / up)
        return GraniteFFNMixer(cfg, h) if arch.model_type == GRANITE else FFNMixer(cfg, h)
    if isinstance(cfg, Linear):
        return LinearMixer(h)
    if isinstance(cfg, NoOp):
        return None
    module = _sibling(cfg.kind)  # a registered kind (nas.kinds): nas/modules/<kind>.py
    if module is None:
        raise TypeError(f"unknown block config {cfg!r}")
    return module.make_mixer(cfg, arch)


def _sibling(name: str) -> Any:
    """The module ``name`` beside this one, or None: ``nas.modules.<name>``, or in a child's
    remote code (:mod:`nas.hf.remote`, where this file is ``puzzle_nas_model.py``) the file
    ``puzzle_nas_<name>.py`` beside it."""
    package, _, me = __name__.rpartition(".")
    target = f"{package}.{me[: -len('model')]}{name}"  # prefix "" here, "puzzle_nas_" there
    try:
        return importlib.import_module(target)
    except ModuleNotFoundError as exc:
        if exc.name != target:  # the module exists and lacks something: say so
            raise
        return None


class Block(nn.Module):
    """``x + mixer(norm(x))``; a no-op block has neither norm nor mixer and returns ``x``.
    Granite scales the branch: ``x + residual_multiplier * mixer(norm(x))``
    (:mod:`nas.modules.granite`; 1 for every other type)."""

    def __init__(self, cfg: BlockConfig, arch: ModelArch):
        super().__init__()
        self.cfg = cfg
        self.mixer = make_mixer(cfg, arch)
        self.norm = RMSNorm(arch.hidden_size, arch.norm_eps, arch.norm_unit_offset) \
            if self.mixer is not None else None
        self.residual_multiplier = scalars_of(arch).residual

    def forward(self, x: torch.Tensor, cache: dict[str, Any] | None = None,
                offset: int = 0) -> torch.Tensor:
        if self.mixer is None:
            return x
        y = self.mixer(self.norm(x), cache, offset)  # type: ignore[misc]  # norm is set exactly when mixer is (__init__)
        if self.residual_multiplier != 1.0:
            y = y * self.residual_multiplier
        return x + y

    @torch.no_grad()
    def reset_parameters(self, std: float = 0.02, out_std: float = 0.02) -> None:
        """Random init of the mixer (normal ``std``, output projections ``out_std``)."""
        if self.mixer is not None:
            self.mixer.reset_parameters(std, out_std)  # type: ignore[operator]  # nn.Module's __getattr__ types the mixer's method as Tensor | Module
            self.norm.reset_parameters()  # type: ignore[union-attr]  # norm is set exactly when mixer is (__init__)


class Cache:
    """Per-block decoding state (KV for attention, conv + SSM state for Mamba) and the
    number of tokens already consumed. ``capacity``: tokens to preallocate KV buffers for
    (they grow geometrically past it)."""

    def __init__(self, num_blocks: int, capacity: int | None = None):
        self.layers: list[dict[str, Any]] = [
            {"capacity": capacity} if capacity else {} for _ in range(num_blocks)]
        self.offset = 0


class CausalLM(nn.Module):
    """A decoder-only LM over any (heterogeneous) :class:`ModelArch`."""

    init_report: list[str]  # what happened to each block, where nas.child set it

    def __init__(self, arch: ModelArch):
        super().__init__()
        self.arch = arch
        self.scalars = scalars_of(arch)  # Granite's multipliers (the identity elsewhere)
        h, v = arch.hidden_size, arch.vocab_size
        # on the meta device (a checkpoint's skeleton) skip the default init: normal_ on
        # meta tensors runs through torch._refs, whose first call imports torch._dynamo and
        # sympy (~70 MiB resident in every process that reads a checkpoint)
        meta = torch.empty(0).device.type == "meta"
        self.embed = nn.Embedding(v, h, _weight=torch.empty(v, h)) if meta else \
            nn.Embedding(v, h)
        self.blocks = nn.ModuleList(Block(b, arch) for b in arch.blocks)
        self.norm = RMSNorm(h, arch.norm_eps, arch.norm_unit_offset) if arch.final_norm \
            else None
        self.lm_head = None if arch.tie_embeddings else nn.Linear(h, v, bias=False)

    def new_cache(self, capacity: int | None = None) -> Cache:
        """An empty cache for incremental decoding (KV buffers sized for ``capacity``
        tokens when given)."""
        return Cache(len(self.blocks), capacity)

    def head_weight(self) -> torch.Tensor:
        """The LM-head matrix (the embedding table when tied)."""
        return self.embed.weight if self.lm_head is None else self.lm_head.weight

    def hidden(self, tokens: torch.Tensor, cache: Cache | None = None) -> torch.Tensor:
        """Final hidden states (after the final norm) for ``tokens (b, l)``."""
        offset = cache.offset if cache is not None else 0
        x = self.embed_tokens(tokens)
        for i, blk in enumerate(self.blocks):
            x = blk(x, cache.layers[i] if cache is not None else None, offset)
        if cache is not None:
            cache.offset += tokens.shape[1]
        return self.norm(x) if self.norm is not None else x

    def embed_tokens(self, tokens: torch.Tensor) -> torch.Tensor:
        """The residual stream entering the first block: the embeddings (times Granite's
        ``embedding_multiplier``)."""
        x = self.embed(tokens)
        m = self.scalars.embedding
        return x * m if m != 1.0 else x

    def logits(self, h: torch.Tensor) -> torch.Tensor:
        """Logits of final hidden states ``h`` (divided by Granite's ``logits_scaling``)."""
        z = h @ self.head_weight().t()
        d = self.scalars.logits_divisor
        return z / d if d != 1.0 else z

    def forward(self, tokens: torch.Tensor, cache: Cache | None = None,
                hidden: bool = False) -> torch.Tensor:
        """Next-token logits ``(b, l, vocab)``; with a cache, continues from its state.
        ``hidden``: the final hidden states instead (:meth:`hidden`), for a caller that
        computes the logits a chunk of positions at a time (through the forward, so that
        wrappers such as FSDP2 and DDP see the call)."""
        h = self.hidden(tokens, cache)
        return h if hidden else self.logits(h)

    @torch.no_grad()
    def generate(self, tokens: torch.Tensor, max_new_tokens: int) -> torch.Tensor:
        """Greedy decoding through the caches; returns prompt + new tokens ``(b, l + n)``."""
        if tokens.dim() == 1:
            tokens = tokens[None]
        cache = self.new_cache(tokens.shape[1] + max_new_tokens)
        logits = self(tokens, cache)
        out = [tokens]
        for i in range(max_new_tokens):
            nxt = logits[:, -1].argmax(-1, keepdim=True)
            out.append(nxt)
            if i + 1 < max_new_tokens:
                logits = self(nxt, cache)
        return torch.cat(out, dim=1)

    @torch.no_grad()
    def reset_parameters(self, std: float = 0.02) -> None:
        """Random init: normal(std) matrices, GPT-2-style scaled output projections,
        unit norms, Mamba's usual dt / A init."""
        out_std = default_out_std(len(self.blocks), std)
        nn.init.normal_(self.embed.weight, std=std)
        if self.lm_head is not None:
            nn.init.normal_(self.lm_head.weight, std=std)
        if self.norm is not None:
            self.norm.reset_parameters()
        for blk in self.blocks:  # a ModuleList of this file's Block (see __init__)
            cast(Block, blk).reset_parameters(std, out_std)

    def num_parameters(self) -> int:
        """Number of parameter elements (each tensor once), as transformers counts them."""
        return sum(p.numel() for p in self.parameters())

    def num_stored(self) -> int:
        """Elements a checkpoint stores: parameters plus persistent buffers (MoE router
        correction biases). Equals ``arch.param_counts().total``, which counts every stored
        weight."""
        skip = {n for n, m in self.named_modules()
                for b in getattr(m, "_non_persistent_buffers_set", ())
                for n in [f"{n}.{b}" if n else b]}
        return self.num_parameters() + sum(b.numel() for n, b in self.named_buffers()
                                           if n not in skip)
