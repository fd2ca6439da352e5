"""Falcon-H1's parallel mixer (HF ``falcon_h1``): attention and a Mamba-2 mixer on the same
normed input, their outputs summed, with the muP multipliers of :class:`nas.arch.MuP`.

:class:`ParallelMixer` holds the two branches as ``self_attn``
(:class:`~nas.modules.layers.AttentionMixer`) and ``mamba`` (:class:`FalconMambaMixer`, the
:class:`~nas.modules.mamba.MambaMixer` with Falcon-H1's norm variants), named as in
transformers' ``FalconH1DecoderLayer`` so that checkpoints map by a prefix; a dropped branch
(``None`` in the config) has no module and contributes nothing. Per layer, as transformers
computes it::

    out = attention_out * self_attn(attention_in * x)      (keys times ``key``)
        + ssm_out * mamba(x)                                (in_proj reads ``ssm_in * x``;
                                                             its output parts [z|x|B|C|dt]
                                                             times ``ssm``)

The multipliers live in the forward pass (:class:`ScaledLinear` keeps the ``weight`` /
``bias`` names of the ``nn.Linear`` it replaces), never in the weights, so weights map to and
from transformers unchanged. The dense MLP's ``mlp_gate`` / ``mlp_down`` multipliers:
:class:`MuPFFNMixer`; the embedding and LM-head multipliers: the model's
:class:`~nas.modules.granite.Scalars` (:func:`nas.modules.granite.scalars_of`).
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from nas.arch import FFN, Mamba, ModelArch, MuP, Parallel
from nas.modules.layers import AttentionMixer, FFNMixer
from nas.modules.mamba import MambaMixer, _GatedNormWeight

IDENTITY_MUP = MuP(embedding=1.0, lm_head=1.0, mlp_gate=1.0, mlp_down=1.0, attention_in=1.0,
                   key=1.0, attention_out=1.0, ssm_in=1.0, ssm_out=1.0, ssm=(1.0,) * 5)
"""No multiplier (every factor 1): a parallel block of a model without :class:`MuP`."""


class ScaledLinear(nn.Linear):
    """``linear(x * in_mult) * out_mult``: an ``nn.Linear`` (same parameters and names)
    whose input and output are scaled; ``out_parts`` ``((width, factor), ...)`` scales
    consecutive slices of the output by their own factors (widths summing to
    ``out_features``), else the whole output by ``out_mult``."""

    def __init__(self, in_features: int, out_features: int, bias: bool = True,
                 in_mult: float = 1.0, out_mult: float = 1.0,
                 out_parts: tuple[tuple[int, float], ...] | None = None):
        super().__init__(in_features, out_features, bias=bias)
        if out_parts is not None and sum(w for w, _ in out_parts) != out_features:
            raise ValueError(f"out_parts widths {[w for w, _ in out_parts]} do not sum to "
                             f"{out_features}")
        self.in_mult, self.out_mult, self.out_parts = float(in_mult), float(out_mult), out_parts

    def _vector(self, like: torch.Tensor) -> torch.Tensor:
        """The per-output-channel factors (cached per device and dtype; not a buffer, so
        a meta-device model materializes without it)."""
        cache = self.__dict__.setdefault("_vec", {})
        key = (like.device, like.dtype)
        if key not in cache:
            cache[key] = torch.cat([torch.full((w,), m, dtype=torch.float32)
                                    for w, m in self.out_parts]).to(like.device, like.dtype)  # type: ignore[union-attr]  # only called when out_parts is set
        return cache[key]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.in_mult != 1.0:
            x = x * self.in_mult
        y = super().forward(x)
        if self.out_parts is not None:
            return y * self._vector(y)
        return y * self.out_mult if self.out_mult != 1.0 else y


def _scaled(lin: nn.Linear, **kw: Any) -> ScaledLinear:
    """A :class:`ScaledLinear` of ``lin``'s shape on its device (fresh parameters: callers
    set them, as ``reset_parameters`` or a state dict does)."""
    with torch.device(lin.weight.device):
        return ScaledLinear(lin.in_features, lin.out_features, bias=lin.bias is not None,
                            **kw)


class FalconMambaMixer(MambaMixer):
    """:class:`~nas.modules.mamba.MambaMixer` with Falcon-H1's options: ``rms_norm=False``
    gates with ``y * silu(z)`` and has no norm weight; ``norm_before_gate`` computes
    ``norm(y) * silu(z)`` (grouped RMSNorm over ``I / n_groups`` channels) instead of
    ``norm(y * silu(z))``; ``in_proj`` reads ``ssm_in * x`` and scales its output parts
    ``[z | x | B | C | dt]`` by ``ssm``."""

    def __init__(self, cfg: Mamba, hidden: int, eps: float, rms_norm: bool,
                 norm_before_gate: bool, mup: MuP, chunk_size: int = 64,
                 dt_limit: tuple[float, float] = (0.0, math.inf)):
        super().__init__(cfg, hidden, eps, chunk_size=chunk_size, dt_limit=dt_limit)
        self.rms_norm, self.norm_before_gate = rms_norm, norm_before_gate
        if not rms_norm:
            del self.norm
        gn = self.G * self.N
        widths = (self.inner, self.inner, gn, gn, self.H)
        self.in_proj = _scaled(self.in_proj, in_mult=mup.ssm_in,
                               out_parts=tuple(zip(widths, mup.ssm)))

    def gated_norm(self, y: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        if not self.rms_norm:  # transformers: scan_output * silu(gate)
            return y * F.silu(z.to(y.dtype))
        if not self.norm_before_gate:  # norm(y * silu(z)): the NemotronH order
            return super().gated_norm(y, z)
        shp = y.shape
        g = y.float().reshape(*shp[:-1], self.G, self.inner // self.G)
        g = g * torch.rsqrt(g.pow(2).mean(-1, keepdim=True) + self.eps)
        g = self.norm.weight.float() * g.reshape(shp)
        return (g * F.silu(z.float())).to(y.dtype)

    @torch.no_grad()
    def reset_parameters(self, *args: Any, **kwargs: Any) -> None:
        if self.rms_norm:
            super().reset_parameters(*args, **kwargs)
            return
        self.norm = _GatedNormWeight(1)  # the parent's init also sets a norm weight: a
        try:  # throwaway one here, so the other tensors draw the same random values
            super().reset_parameters(*args, **kwargs)
        finally:
            del self.norm


class ParallelMixer(nn.Module):
    """Falcon-H1's hybrid mixer: ``self_attn`` and ``mamba`` on the same input, outputs
    summed (module docstring). One cache dict serves both (attention's KV buffers and
    Mamba's ``conv`` / ``ssm`` states use different keys)."""

    def __init__(self, cfg: Parallel, arch: ModelArch, dt_limit: tuple[float, float]):
        super().__init__()
        self.cfg = cfg
        mup = arch.mup or IDENTITY_MUP
        self.mup = mup
        h = arch.hidden_size
        self.self_attn: AttentionMixer | None = None
        self.mamba: FalconMambaMixer | None = None
        if cfg.attention is not None:
            att = AttentionMixer(cfg.attention, h, arch.rope_theta, arch.norm_eps,
                                 arch.hf_extra.get("rope_scaling"), arch.norm_unit_offset)
            att.k_proj = _scaled(att.k_proj, out_mult=mup.key)
            self.self_attn = att
        if cfg.mamba is not None:
            self.mamba = FalconMambaMixer(cfg.mamba, h, arch.norm_eps, cfg.mamba_rms_norm,
                                          cfg.mamba_norm_before_gate, mup, dt_limit=dt_limit)

    def forward(self, x: torch.Tensor, cache: dict[str, Any] | None = None,
                offset: int = 0) -> torch.Tensor:
        m = self.mup
        out = None
        if self.self_attn is not None:
            xa = x * m.attention_in if m.attention_in != 1.0 else x
            out = self.self_attn(xa, cache, offset)
            if m.attention_out != 1.0:
                out = out * m.attention_out
        if self.mamba is not None:
            y = self.mamba(x, cache, offset)
            if m.ssm_out != 1.0:
                y = y * m.ssm_out
            out = y if out is None else out + y
        return out  # type: ignore[return-value]  # a parallel block has at least one branch, so out is set

    @torch.no_grad()
    def reset_parameters(self, std: float = 0.02, out_std: float = 0.02) -> None:
        if self.self_attn is not None:
            self.self_attn.reset_parameters(std, out_std)
        if self.mamba is not None:
            self.mamba.reset_parameters(std, out_std)


class MuPFFNMixer(FFNMixer):
    """Falcon-H1's dense MLP: ``down(act(mlp_gate * gate(x)) * up(x)) * mlp_down``."""

    def __init__(self, cfg: FFN, hidden: int, mup: MuP):
        super().__init__(cfg, hidden)
        if not cfg.gated:
            raise ValueError("Falcon-H1's MLP is gated (SwiGLU)")
        self.gate_proj = _scaled(self.gate_proj, out_mult=mup.mlp_gate)
        self.down_proj = _scaled(self.down_proj, out_mult=mup.mlp_down)



__all__ = ["FalconMambaMixer", "MuPFFNMixer", "ParallelMixer", "ScaledLinear"]
