"""Norms, activations, attention, dense FFN and the linear replacement block.

Every mixer takes ``forward(x, cache=None, offset=0)``: ``x`` is the pre-normed input of
shape ``(batch, length, hidden)``; ``cache`` is this block's dict in a
:class:`nas.modules.model.Cache` (or ``None`` for a stateless full-sequence pass) and
``offset`` is the absolute position of ``x[:, 0]``. Parameter names follow the Hugging
Face checkpoints (``q_proj``, ``gate_proj`` ...) so that export is mostly a prefix change.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from nas.arch import FFN, Attention


def relu2(x: torch.Tensor) -> torch.Tensor:
    """Squared ReLU (Nemotron-H's ``relu2``)."""
    return torch.square(F.relu(x))


_ACTIVATIONS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "silu": F.silu,
    "swish": F.silu,
    "relu": F.relu,
    "relu2": relu2,
    "gelu": F.gelu,
    "gelu_pytorch_tanh": lambda x: F.gelu(x, approximate="tanh"),
    "gelu_new": lambda x: F.gelu(x, approximate="tanh"),
    "tanh": torch.tanh,
}


def gated_act(act: Callable[[torch.Tensor], torch.Tensor], g: torch.Tensor,
              up: torch.Tensor) -> torch.Tensor:
    """``act(g) * up``, in place on ``g`` when no gradient is recorded."""
    if torch.is_grad_enabled() and (g.requires_grad or up.requires_grad):
        return act(g) * up
    if act is F.silu:
        return F.silu(g, inplace=True).mul_(up)
    return act(g).mul_(up)


def activation(name: str) -> Callable[[torch.Tensor], torch.Tensor]:
    """The activation function called ``name`` (HF ``hidden_act`` spelling)."""
    try:
        return _ACTIVATIONS[name]
    except KeyError:
        raise ValueError(f"unknown activation {name!r}; expected one of "
                         f"{', '.join(sorted(_ACTIVATIONS))}") from None


class RMSNorm(nn.Module):
    """RMS norm with a learned scale, computed in float32.

    ``unit_offset`` (zero-centred weights, Qwen3-Next / Gemma): the scale is ``1 + weight``
    and the weight starts at 0; the normalized input is scaled in float32 before the cast
    back, as transformers' ``Qwen3NextRMSNorm`` does.
    """

    def __init__(self, dim: int, eps: float = 1e-5, unit_offset: bool = False):
        super().__init__()
        self.unit_offset = unit_offset
        self.weight = nn.Parameter(torch.zeros(dim) if unit_offset else torch.ones(dim))
        self.eps = eps

    def reset_parameters(self) -> None:
        """The identity scale: weight 1 (0 with ``unit_offset``)."""
        with torch.no_grad():
            self.weight.fill_(0.0 if self.unit_offset else 1.0)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        x32 = x.float()
        if self.unit_offset:
            x32 = x32 * torch.rsqrt(x32.square().mean(-1, keepdim=True) + self.eps)
            return (x32 * (1.0 + self.weight.float())).to(dtype)
        if torch.is_grad_enabled() and (x.requires_grad or self.weight.requires_grad):
            x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
            return self.weight * x32.to(dtype)
        out = (x32 * torch.rsqrt(x32.square().mean(-1, keepdim=True).add_(self.eps))).to(dtype)
        return out.mul_(self.weight) if self.weight.dtype == dtype else self.weight * out


def scaled_inv_freq(inv: torch.Tensor, scaling: dict[str, Any] | None) -> torch.Tensor:
    """Apply an HF ``rope_scaling`` of type ``linear`` or ``llama3`` to RoPE inverse
    frequencies (``default`` / ``None``: unchanged).

    ``linear`` divides every frequency by ``factor``; ``llama3`` (Llama-3.1) keeps
    wavelengths shorter than ``original_max_position_embeddings / high_freq_factor``,
    divides those longer than ``original / low_freq_factor`` by ``factor`` and blends
    linearly in between. YaRN needs the head dim and theta: see :func:`rope_inv_freq`.
    Any other type raises ``ValueError`` (never approximated).
    """
    if not scaling:
        return inv
    kind = scaling.get("rope_type", scaling.get("type", "default"))
    if kind == "default":
        return inv
    if kind == "linear":
        return inv / float(scaling["factor"])
    if kind == "llama3":
        factor = float(scaling["factor"])
        lo_f = float(scaling["low_freq_factor"])
        hi_f = float(scaling["high_freq_factor"])
        orig = float(scaling["original_max_position_embeddings"])
        wavelen = 2 * math.pi / inv
        smooth = ((orig / wavelen - lo_f) / (hi_f - lo_f)).clamp(0.0, 1.0)
        return (1 - smooth) * inv / factor + smooth * inv
    raise ValueError(f"RoPE type {kind!r} is not computed here (supported: default, linear, "
                     "llama3, yarn)")


def _yarn_mscale(scale: float, mscale: float = 1.0) -> float:
    return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0


def rope_inv_freq(head_dim: int, theta: float, scaling: dict[str, Any] | None = None,
                  device: torch.device | None = None) -> tuple[torch.Tensor, float]:
    """RoPE inverse frequencies ``(head_dim / 2,)`` and the factor cos/sin are scaled by.

    Types: ``default``, ``linear``, ``llama3`` (:func:`scaled_inv_freq`) and ``yarn``
    (YaRN, arXiv 2309.00071, as transformers computes it: frequencies blended between
    interpolation ``/ factor`` and extrapolation by a linear ramp over the dimensions whose
    rotation counts at ``original_max_position_embeddings`` fall between ``beta_slow`` and
    ``beta_fast`` (bounds floored / ceiled unless ``truncate`` is false); cos and sin scaled
    by ``attention_factor``, default ``0.1 ln(factor) + 1``, or the ratio of the ``mscale`` /
    ``mscale_all_dim`` forms when both are given).
    """
    pos = theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32, device=device) / head_dim)
    inv = 1.0 / pos
    kind = (scaling or {}).get("rope_type", (scaling or {}).get("type", "default"))
    if kind != "yarn":
        return scaled_inv_freq(inv, scaling), 1.0
    assert scaling is not None
    factor = float(scaling["factor"])
    orig = float(scaling["original_max_position_embeddings"])
    att = scaling.get("attention_factor")
    if att is None:
        ms, ms_all = scaling.get("mscale"), scaling.get("mscale_all_dim")
        att = _yarn_mscale(factor, ms) / _yarn_mscale(factor, ms_all) if ms and ms_all \
            else _yarn_mscale(factor)
    beta_fast = scaling.get("beta_fast") or 32.0
    beta_slow = scaling.get("beta_slow") or 1.0

    def corr_dim(rot: float) -> float:
        return head_dim * math.log(orig / (rot * 2 * math.pi)) / (2 * math.log(theta))

    low, high = corr_dim(beta_fast), corr_dim(beta_slow)
    if scaling.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, head_dim - 1)
    if low == high:
        high += 0.001
    ramp = ((torch.arange(head_dim // 2, dtype=torch.float32, device=device) - low)
            / (high - low)).clamp(0, 1)
    extrapolate = 1 - ramp
    inv = (1.0 / (factor * pos)) * (1 - extrapolate) + inv * extrapolate
    return inv, float(att)


def rope_tables(positions: torch.Tensor, head_dim: int, theta: float,
                dtype: torch.dtype, scaling: dict[str, Any] | None = None
                ) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin tables ``(length, head_dim)`` for rotate-half RoPE (HF Llama layout)."""
    inv, att = rope_inv_freq(head_dim, theta, scaling, positions.device)
    ang = positions.float()[:, None] * inv[None, :]
    ang = torch.cat([ang, ang], dim=-1)
    cos, sin = ang.cos(), ang.sin()
    if att != 1.0:
        cos, sin = cos * att, sin * att
    return cos.to(dtype), sin.to(dtype)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate ``x`` of shape ``(b, heads, l, d)`` by the tables of shape ``(l, d)`` (or
    ``x (b, l, heads, d)`` by tables ``(l, 1, d)``).

    ``x * cos + rotate_half(x) * sin`` (HF's formula) computed on the two halves, without
    materializing the negated, rotated copy of ``x``; the output keeps ``x``'s layout.
    Without autograd it is written in place with fused multiply-adds (equal up to rounding);
    with autograd, the same products and sums as HF (bitwise equal).
    """
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    c, s = cos[..., :half], sin[..., :half]  # the tables repeat: [ang, ang]
    if torch.is_grad_enabled() and x.requires_grad:
        xr = x.unflatten(-1, (2, half))
        x1, x2 = xr[..., 0, :], xr[..., 1, :]
        return torch.stack((x1 * c - x2 * s, x2 * c + x1 * s), dim=-2).flatten(-2)
    out = torch.empty_like(x)
    o1, o2 = out[..., :half], out[..., half:]
    torch.mul(x1, c, out=o1).addcmul_(x2, s, value=-1)
    torch.mul(x2, c, out=o2).addcmul_(x1, s)
    return out


def append_to_buffers(cache: dict[str, Any],
                      parts: tuple[tuple[str, str, torch.Tensor], ...], dim: int
                      ) -> list[torch.Tensor]:
    """Write each ``(buffer key, view key, tensor)`` of ``parts`` (batch first, this chunk's
    tokens along ``dim``) after the ``cache["len"]`` cached tokens, in place in preallocated
    buffers ``cache[buffer key]`` of ``capacity`` tokens (``cache["capacity"]`` when given,
    else grown geometrically: amortized O(1) per token; reallocated when the dtype or device
    changes); sets ``cache[view key]`` to each buffer's filled part and returns those views.
    A cache holding another batch size is refused (``ValueError``)."""
    first = parts[0][2]
    b, n = first.shape[0], first.shape[dim]
    used = cache.get("len", 0)
    need = used + n
    old = cache.get(parts[0][0])
    if old is not None and old.shape[0] != b:
        raise ValueError(f"KV cache holds a batch of {old.shape[0]}, got {b}")
    if (old is None or old.shape[dim] < need or old.dtype != first.dtype
            or old.device != first.device):
        cap = max(need, int(cache.get("capacity") or 0),
                  2 * old.shape[dim] if old is not None else 0)
        for buf, _, t in parts:
            new = t.new_empty(*t.shape[:dim], cap, *t.shape[dim + 1:])
            if old is not None and used:
                new.narrow(dim, 0, used).copy_(cache[buf].narrow(dim, 0, used))
            cache[buf] = new
    cache["len"] = need
    out = []
    for buf, view, t in parts:
        cache[buf].narrow(dim, used, n).copy_(t)
        cache[view] = cache[buf].narrow(dim, 0, need)
        out.append(cache[view])
    return out


class AttentionMixer(nn.Module):
    """Grouped-query attention with optional RoPE, sliding window, q/k norm and biases;
    ``scale`` is the softmax scale (``None``: ``1 / sqrt(head_dim)``).

    KV cache (this block's dict of a :class:`nas.modules.model.Cache`): keys and values are
    written in place into preallocated buffers ``k_buf`` / ``v_buf`` of shape
    ``(b, kv_heads, capacity, head_dim)`` (``capacity`` from the dict when given, else grown
    geometrically); ``cache["k"]``, ``cache["v"]`` are views of the filled part. With a
    sliding window the buffers are a ring of ``window`` slots (slot = position mod window),
    so the cache never holds more than the window. A decode step writes one slot and reads
    the cache once: the query heads of a KV group attend as rows of one query block (no
    repeated K/V); longer chunks use SDPA's ``enable_gqa``.
    """

    def __init__(self, cfg: Attention, hidden: int, rope_theta: float = 10000.0,
                 eps: float = 1e-5, rope_scaling: dict[str, Any] | None = None,
                 norm_unit_offset: bool = False, scale: float | None = None):
        super().__init__()
        self.scale = scale  # softmax scale; None: 1 / sqrt(head_dim) (Granite sets its own)
        self.rope_dim = cfg.rope_dim or cfg.head_dim  # channels rotated per head
        if cfg.rope and cfg.head_dim % 2:
            raise ValueError(f"RoPE needs an even head_dim, got {cfg.head_dim}")
        kind = (rope_scaling or {}).get("rope_type", (rope_scaling or {}).get("type"))
        if cfg.rope and kind not in (None, "default", "linear", "llama3", "yarn"):
            raise ValueError(f"RoPE type {kind!r} is not computed here (supported: default, "
                             "linear, llama3, yarn)")
        self.rope_scaling = rope_scaling
        self.cfg = cfg
        self.n_heads, self.n_kv, self.head_dim = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
        self.rope_theta = rope_theta
        qd, kvd = cfg.num_heads * cfg.head_dim, cfg.num_kv_heads * cfg.head_dim
        # with an output gate, q_proj emits [q_h | gate_h] per head (Qwen3-Next layout)
        self.q_proj = nn.Linear(hidden, qd * (2 if cfg.output_gate else 1), bias=cfg.qkv_bias)
        self.k_proj = nn.Linear(hidden, kvd, bias=cfg.qkv_bias)
        self.v_proj = nn.Linear(hidden, kvd, bias=cfg.qkv_bias)
        self.o_proj = nn.Linear(qd, hidden, bias=cfg.o_bias)
        if cfg.qk_norm:
            self.q_norm = RMSNorm(cfg.head_dim, eps, norm_unit_offset)
            self.k_norm = RMSNorm(cfg.head_dim, eps, norm_unit_offset)

    def forward(self, x: torch.Tensor, cache: dict[str, Any] | None = None,
                offset: int = 0) -> torch.Tensor:
        b, n, _ = x.shape
        d = self.head_dim
        # (b, n, heads, d) until RoPE is applied, then viewed as (b, heads, n, d): SDPA's
        # output then already has the (b, n, heads, d) layout o_proj reads (no copy)
        gate = None
        if self.cfg.output_gate:
            q, gate = self.q_proj(x).view(b, n, self.n_heads, 2 * d).split(d, dim=-1)
            gate = gate.reshape(b, n, self.n_heads * d)
        else:
            q = self.q_proj(x).view(b, n, self.n_heads, d)
        k = self.k_proj(x).view(b, n, self.n_kv, d)
        v = self.v_proj(x).view(b, n, self.n_kv, d).transpose(1, 2)
        if self.cfg.qk_norm:
            q, k = self.q_norm(q), self.k_norm(k)
        if self.cfg.rope:
            cos, sin = self._rope(offset, n, x.device, q.dtype)
            cos, sin = cos[:, None], sin[:, None]
            if self.rope_dim < d:  # partial rotary: the tail channels pass unrotated
                rd = self.rope_dim
                q = torch.cat([apply_rope(q[..., :rd], cos, sin), q[..., rd:]], dim=-1)
                k = torch.cat([apply_rope(k[..., :rd], cos, sin), k[..., rd:]], dim=-1)
            else:
                q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        q, k = q.transpose(1, 2), k.transpose(1, 2)
        window = self.cfg.sliding_window
        if cache is None:
            out = self._attend(q, k, v, 0)
        elif window is None:
            out = self._attend(q, *self._append(cache, k, v), cache["len"] - n)
        else:
            out = self._attend_ring(q, k, v, cache, window)
        out = out.transpose(1, 2).reshape(b, n, self.n_heads * d)
        if gate is not None:
            out = out * torch.sigmoid(gate)
        return self.o_proj(out)

    # ---- RoPE tables, computed once per device and dtype and extended on demand -----------
    def _rope(self, offset: int, n: int, device: torch.device, dtype: torch.dtype
              ) -> tuple[torch.Tensor, torch.Tensor]:
        cache = self.__dict__.setdefault("_rope_cache", {})
        key = (device, dtype)
        tabs = cache.get(key)
        if tabs is None or tabs[0].shape[0] < offset + n:
            size = max(offset + n, 2 * (tabs[0].shape[0] if tabs is not None else 0), 256)
            tabs = rope_tables(torch.arange(size, device=device), self.rope_dim,
                               self.rope_theta, dtype, self.rope_scaling)
            cache[key] = tabs
        return tabs[0][offset:offset + n], tabs[1][offset:offset + n]

    # ---- attention over keys held in the cache -----------------------------------------
    def _attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, past: int,
                kpos: torch.Tensor | None = None) -> torch.Tensor:
        """Causal (and windowed) attention of ``q (b, H, n, d)`` at positions ``past..``
        over ``k, v (b, kv, s, d)`` at positions ``kpos`` (default ``0..s-1``)."""
        b, _, n, d = q.shape
        s = k.shape[2]
        window = self.cfg.sliding_window
        if n == 1 and kpos is None and (window is None or s <= window):
            # one query sees every cached key: the rep query heads of a KV head are the rows
            # of one (rep, d) query block, so K/V are read once and never repeated
            rep = self.n_heads // self.n_kv
            out = F.scaled_dot_product_attention(q.reshape(b, self.n_kv, rep, d), k, v,
                                                 scale=self.scale)
            return out.reshape(b, self.n_heads, 1, d)
        if window is None and past == 0 and kpos is None:
            return F.scaled_dot_product_attention(q, k, v, is_causal=n > 1,
                                                  enable_gqa=self.n_heads != self.n_kv,
                                                  scale=self.scale)
        qpos = torch.arange(past, past + n, device=q.device)[:, None]
        if kpos is None:
            kpos = torch.arange(s, device=q.device)
        mask = kpos[None, :] <= qpos
        if window is not None:
            mask = mask & (qpos - kpos[None, :] < window)
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask,
                                              enable_gqa=self.n_heads != self.n_kv,
                                              scale=self.scale)

    def _append(self, cache: dict[str, Any], k: torch.Tensor, v: torch.Tensor
                ) -> tuple[torch.Tensor, torch.Tensor]:
        """Write ``k, v`` after the cached tokens (in place); the filled part of the cache."""
        k, v = append_to_buffers(cache, (("k_buf", "k", k), ("v_buf", "v", v)), dim=2)
        return k, v

    def _attend_ring(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                     cache: dict[str, Any], window: int) -> torch.Tensor:
        """Sliding-window attention through a ring of ``window`` cache slots."""
        b, _, n, d = k.shape
        seen = cache.get("len", 0)
        ring_k = cache.get("k_buf")
        if ring_k is not None and ring_k.shape[0] != b:
            raise ValueError(f"KV cache holds a batch of {ring_k.shape[0]}, got {b}")
        if ring_k is None:
            ring_k = k.new_empty(b, self.n_kv, window, d)
            cache["k_buf"], cache["v_buf"] = ring_k, v.new_empty(b, self.n_kv, window, d)
        ring_v = cache["v_buf"]
        if n == 1:  # decode: write the slot, then every filled slot is inside the window
            slot = seen % window
            ring_k[:, :, slot:slot + 1] = k
            ring_v[:, :, slot:slot + 1] = v
            filled = min(seen + 1, window)
            out = self._attend(q, ring_k[:, :, :filled], ring_v[:, :, :filled], seen)
        else:  # a chunk: the held past (in ring order, positions known) + the chunk, masked
            held = min(seen, window)
            slots = torch.arange(held, device=k.device)
            kpos = torch.cat([seen - 1 - ((seen - 1 - slots) % window),
                              torch.arange(seen, seen + n, device=k.device)])
            out = self._attend(q, torch.cat([ring_k[:, :, :held], k], 2),
                               torch.cat([ring_v[:, :, :held], v], 2), seen, kpos)
            keep = min(n, window)  # the newest tokens go to their slots
            idx = torch.arange(seen + n - keep, seen + n, device=k.device) % window
            ring_k.index_copy_(2, idx, k[:, :, n - keep:])
            ring_v.index_copy_(2, idx, v[:, :, n - keep:])
        cache["len"] = seen + n
        filled = min(seen + n, window)
        cache["k"], cache["v"] = ring_k[:, :, :filled], ring_v[:, :, :filled]
        return out

    @torch.no_grad()
    def reset_parameters(self, std: float = 0.02, out_std: float = 0.02) -> None:
        for lin, s in ((self.q_proj, std), (self.k_proj, std), (self.v_proj, std),
                       (self.o_proj, out_std)):
            nn.init.normal_(lin.weight, std=s)
            if lin.bias is not None:
                nn.init.zeros_(lin.bias)
        if self.cfg.qk_norm:
            self.q_norm.reset_parameters()
            self.k_norm.reset_parameters()


class FFNMixer(nn.Module):
    """Dense MLP: ``down(act(gate(x)) * up(x))`` when gated, else ``down(act(up(x)))``."""

    def __init__(self, cfg: FFN, hidden: int):
        super().__init__()
        self.cfg = cfg
        self.act = activation(cfg.activation)
        if cfg.gated:
            self.gate_proj = nn.Linear(hidden, cfg.width, bias=cfg.bias)
        self.up_proj = nn.Linear(hidden, cfg.width, bias=cfg.bias)
        self.down_proj = nn.Linear(cfg.width, hidden, bias=cfg.bias)

    def intermediate(self, x: torch.Tensor) -> torch.Tensor:
        """The activations entering ``down_proj`` (one per channel)."""
        if self.cfg.gated:
            return gated_act(self.act, self.gate_proj(x), self.up_proj(x))
        return self.act(self.up_proj(x))

    def forward(self, x: torch.Tensor, cache: dict[str, Any] | None = None,
                offset: int = 0) -> torch.Tensor:
        return self.down_proj(self.intermediate(x))

    @torch.no_grad()
    def reset_parameters(self, std: float = 0.02, out_std: float = 0.02) -> None:
        mats = [self.up_proj] + ([self.gate_proj] if self.cfg.gated else [])
        for lin in mats:
            nn.init.normal_(lin.weight, std=std)
        nn.init.normal_(self.down_proj.weight, std=out_std)
        for lin in mats + [self.down_proj]:
            if lin.bias is not None:
                nn.init.zeros_(lin.bias)


class LinearMixer(nn.Module):
    """A block replaced by one ``hidden x hidden`` matrix (no bias)."""

    def __init__(self, hidden: int):
        super().__init__()
        self.linear = nn.Linear(hidden, hidden, bias=False)

    def forward(self, x: torch.Tensor, cache: dict[str, Any] | None = None,
                offset: int = 0) -> torch.Tensor:
        return self.linear(x)

    @torch.no_grad()
    def reset_parameters(self, std: float = 0.02, out_std: float = 0.02) -> None:
        nn.init.normal_(self.linear.weight, std=out_std)


def default_out_std(num_blocks: int, std: float = 0.02) -> float:
    """Output-projection init std: ``std / sqrt(2 * blocks)`` (GPT-2 style)."""
    return std / math.sqrt(2 * max(num_blocks, 1))
