"""Mamba-2 mixer in pure torch (HF NemotronH parameter layout).

``in_proj`` maps the hidden state to ``[z (I) | x (I) | B (g*N) | C (g*N) | dt (H)]`` with
``I = heads * head_dim``; a causal depthwise conv (+ SiLU) runs over ``[x | B | C]``; the
selective state space recurrence per head ``h`` is

    S_t = exp(dt_t * A_h) * S_{t-1} + dt_t * x_t B_t^T,   y_t = S_t C_t + D_h * x_t

with ``dt_t = softplus(dt_raw + dt_bias)``, ``A = -exp(A_log)`` and ``B``, ``C`` shared by
the heads of a group; then a gated RMSNorm (``norm(y * silu(z))`` per group of
``I / n_groups`` channels) and ``out_proj``.

Whole sequences use the chunked SSD form (:func:`ssd_chunked`: quadratic attention-like
within a chunk, a linear recurrence over chunk states); decoding one token uses
:func:`ssd_step` with the carried conv and SSM state. Both compute in float32.
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from nas.arch import Mamba


def _segsum_exp(a: torch.Tensor) -> torch.Tensor:
    """``exp(sum_{k=j+1..i} a_k)`` for ``i >= j`` and 0 above the diagonal; ``a``: (..., T)."""
    t = a.shape[-1]
    cs = torch.cumsum(a, dim=-1)
    diff = cs[..., :, None] - cs[..., None, :]
    keep = torch.ones(t, t, dtype=torch.bool, device=a.device).tril()
    return torch.exp(diff.masked_fill(~keep, float("-inf")))


def ssd_chunked(x: torch.Tensor, dt: torch.Tensor, A: torch.Tensor, B: torch.Tensor,
                C: torch.Tensor, chunk: int = 64, state: torch.Tensor | None = None
                ) -> tuple[torch.Tensor, torch.Tensor]:
    """The SSM over a whole sequence by the chunked state-space-duality scan (no D term).

    Shapes: ``x (b, l, H, P)``, ``dt (b, l, H)`` (after softplus), ``A (H)`` (negative),
    ``B, C (b, l, H, N)`` (already expanded from groups to heads), ``state (b, H, P, N)``
    the state before the first token (zeros when ``None``). Returns ``y (b, l, H, P)`` and
    the state after the last token, all float32.
    """
    b, n, H, P = x.shape
    N = B.shape[-1]
    x, dt, B, C = x.float(), dt.float(), B.float(), C.float()
    pad = (-n) % chunk
    if pad:  # padded steps have dt = 0: no decay and no input, so the final state is exact
        x = F.pad(x, (0, 0, 0, 0, 0, pad))
        dt = F.pad(dt, (0, 0, 0, pad))
        B = F.pad(B, (0, 0, 0, 0, 0, pad))
        C = F.pad(C, (0, 0, 0, 0, 0, pad))
    c = x.shape[1] // chunk
    x = x.view(b, c, chunk, H, P)
    B = B.view(b, c, chunk, H, N)
    C = C.view(b, c, chunk, H, N)
    a = (dt * A.float()).view(b, c, chunk, H).permute(0, 3, 1, 2)  # b H c q
    xdt = x * dt.view(b, c, chunk, H, 1)
    a_cs = torch.cumsum(a, dim=-1)

    # within each chunk: y_i += sum_{j<=i} (C_i . B_j) exp(a_{j+1..i}) dt_j x_j
    decay = _segsum_exp(a)  # b H c q q
    scores = torch.einsum("bcihn,bcjhn->bhcij", C, B) * decay
    y = torch.einsum("bhcij,bcjhp->bcihp", scores, xdt)

    # state contributed by each chunk alone (at the chunk's end)
    to_end = torch.exp(a_cs[..., -1:] - a_cs)  # b H c q
    chunk_states = torch.einsum("bcjhn,bhcj,bcjhp->bchpn", B, to_end, xdt)

    # carry states across chunks: S_k = exp(sum a over chunk k) S_{k-1} + chunk_states_k
    s0 = torch.zeros(b, H, P, N, dtype=torch.float32, device=x.device) if state is None \
        else state.float()
    all_states = torch.cat([s0[:, None], chunk_states], dim=1)  # b c+1 H P N
    chunk_decay = _segsum_exp(F.pad(a_cs[..., -1], (1, 0)))  # b H c+1 c+1
    carried = torch.einsum("bhkj,bjhpn->bkhpn", chunk_decay, all_states)
    before, final = carried[:, :-1], carried[:, -1]

    # contribution of the state entering each chunk
    y = y + torch.einsum("bcihn,bchpn,bhci->bcihp", C, before, torch.exp(a_cs))
    y = y.reshape(b, c * chunk, H, P)[:, :n]
    return y, final


def ssd_step(x: torch.Tensor, dt: torch.Tensor, A: torch.Tensor, B: torch.Tensor,
             C: torch.Tensor, state: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """One recurrence step: ``x (b, H, P)``, ``dt (b, H)``, ``B, C (b, H, N)``,
    ``state (b, H, P, N)``; returns ``y (b, H, P)`` (no D term) and the new state."""
    x, dt, B, C = x.float(), dt.float(), B.float(), C.float()
    decay = torch.exp(dt * A.float())[..., None, None]
    state = state.float() * decay + (dt[..., None] * x)[..., None] * B[:, :, None, :]
    y = torch.einsum("bhpn,bhn->bhp", state, C)
    return y, state


class MambaMixer(nn.Module):
    """Mamba-2 mixer; cache entries ``conv`` (b, conv channels, kernel-1) and ``ssm``
    (b, heads, head_dim, state)."""

    def __init__(self, cfg: Mamba, hidden: int, eps: float = 1e-5, chunk_size: int = 64,
                 dt_limit: tuple[float, float] = (0.0, math.inf)):
        super().__init__()
        self.cfg = cfg
        # whole-sequence passes clamp dt = softplus(.) to dt_limit, as transformers' chunked
        # scan does (its single-token step, like mamba_ssm's, does not clamp)
        self.dt_limit = (float(dt_limit[0]), float(dt_limit[1]))
        self.H, self.P, self.N, self.G = cfg.num_heads, cfg.head_dim, cfg.state_size, cfg.n_groups
        self.inner = self.H * self.P
        self.conv_dim = self.inner + 2 * self.G * self.N
        self.eps = eps
        self.chunk_size = chunk_size
        self.in_proj = nn.Linear(hidden, 2 * self.inner + 2 * self.G * self.N + self.H,
                                 bias=cfg.proj_bias)
        self.conv1d = nn.Conv1d(self.conv_dim, self.conv_dim, cfg.conv_kernel,
                                groups=self.conv_dim, bias=cfg.conv_bias)
        self.dt_bias = nn.Parameter(torch.zeros(self.H))
        self.A_log = nn.Parameter(torch.zeros(self.H))
        self.D = nn.Parameter(torch.ones(self.H))
        self.norm = _GatedNormWeight(self.inner)
        self.out_proj = nn.Linear(self.inner, hidden, bias=cfg.proj_bias)

    # ---- pieces -------------------------------------------------------------------------
    def _split(self, proj: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        return torch.split(proj, [self.inner, self.conv_dim, self.H], dim=-1)  # type: ignore

    def _ssm_args(self, xbc: torch.Tensor, dt_raw: torch.Tensor, clamp: bool = True
                  ) -> tuple[torch.Tensor, ...]:
        """Split the conv output into x, B, C (expanded to heads) and prepare dt (clamped to
        ``dt_limit`` when ``clamp``) and A."""
        lead = xbc.shape[:-1]
        xs, B, C = torch.split(xbc, [self.inner, self.G * self.N, self.G * self.N], dim=-1)
        rep = self.H // self.G
        B = B.reshape(*lead, self.G, self.N).repeat_interleave(rep, dim=-2)
        C = C.reshape(*lead, self.G, self.N).repeat_interleave(rep, dim=-2)
        dt = F.softplus(dt_raw.float() + self.dt_bias.float())
        if clamp and self.dt_limit != (0.0, math.inf):
            dt = dt.clamp(self.dt_limit[0], self.dt_limit[1])
        A = -torch.exp(self.A_log.float())
        return xs.reshape(*lead, self.H, self.P), dt, A, B, C

    def gated_norm(self, y: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        """``RMSNorm(y * silu(z))`` over groups of ``I / n_groups`` channels, times weight."""
        g = (y.float() * F.silu(z.float()))
        shp = g.shape
        g = g.reshape(*shp[:-1], self.G, self.inner // self.G)
        g = g * torch.rsqrt(g.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.norm.weight * g.reshape(shp).to(z.dtype)

    def conv_full(self, xbc: torch.Tensor, prev: torch.Tensor | None
                  ) -> tuple[torch.Tensor, torch.Tensor]:
        """Causal conv + SiLU over ``xbc (b, l, C)`` after ``prev`` (b, C, K-1) past inputs;
        returns the output (b, l, C) and the last K-1 inputs."""
        k = self.cfg.conv_kernel
        xt = xbc.transpose(1, 2)
        if prev is None:
            prev = xt.new_zeros(xt.shape[0], self.conv_dim, k - 1)
        xt = torch.cat([prev.to(xt.dtype), xt], dim=-1)
        out = F.conv1d(xt, self.conv1d.weight, self.conv1d.bias, groups=self.conv_dim)
        return F.silu(out).transpose(1, 2), xt[..., xt.shape[-1] - (k - 1):]

    def ssm_inputs(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
        """Everything the SSM sees for a whole sequence from rest (used for importance)."""
        z, xbc, dt_raw = self._split(self.in_proj(x))
        xbc, _ = self.conv_full(xbc, None)
        xs, dt, A, B, C = self._ssm_args(xbc, dt_raw)
        return {"z": z, "x": xs, "dt": dt, "A": A, "B": B, "C": C}

    # ---- forward ------------------------------------------------------------------------
    def forward(self, x: torch.Tensor, cache: dict[str, Any] | None = None,
                offset: int = 0) -> torch.Tensor:
        b, n, _ = x.shape
        z, xbc, dt_raw = self._split(self.in_proj(x))
        if cache is not None and n == 1 and "ssm" in cache:
            y = self._step(xbc[:, 0], dt_raw[:, 0], cache)[:, None]
        else:
            prev = cache.get("conv") if cache is not None else None
            xbc, last = self.conv_full(xbc, prev)
            xs, dt, A, B, C = self._ssm_args(xbc, dt_raw)
            state = cache.get("ssm") if cache is not None else None
            y, final = ssd_chunked(xs, dt, A, B, C, self.chunk_size, state)
            y = y + xs.float() * self.D.float()[:, None]
            if cache is not None:
                cache["conv"], cache["ssm"] = last, final
        y = y.reshape(b, n, self.inner).to(x.dtype)
        return self.out_proj(self.gated_norm(y, z))

    def _step(self, xbc: torch.Tensor, dt_raw: torch.Tensor, cache: dict[str, Any]
              ) -> torch.Tensor:
        window = torch.cat([cache["conv"].to(xbc.dtype), xbc[:, :, None]], dim=-1)  # b C K
        out = (window * self.conv1d.weight[:, 0, :]).sum(-1)
        if self.conv1d.bias is not None:
            out = out + self.conv1d.bias
        cache["conv"] = window[..., 1:]
        xs, dt, A, B, C = self._ssm_args(F.silu(out), dt_raw, clamp=False)
        y, cache["ssm"] = ssd_step(xs, dt, A, B, C, cache["ssm"])
        return y + xs.float() * self.D.float()[:, None]

    @torch.no_grad()
    def reset_parameters(self, std: float = 0.02, out_std: float = 0.02,
                         dt_min: float = 1e-3, dt_max: float = 0.1) -> None:
        nn.init.normal_(self.in_proj.weight, std=std)
        nn.init.normal_(self.out_proj.weight, std=out_std)
        for lin in (self.in_proj, self.out_proj):
            if lin.bias is not None:
                nn.init.zeros_(lin.bias)
        nn.init.kaiming_uniform_(self.conv1d.weight, a=math.sqrt(5))
        if self.conv1d.bias is not None:
            bound = 1 / math.sqrt(self.cfg.conv_kernel)
            nn.init.uniform_(self.conv1d.bias, -bound, bound)
        dt = torch.exp(torch.rand(self.H) * (math.log(dt_max) - math.log(dt_min))
                       + math.log(dt_min))
        self.dt_bias.copy_(dt + torch.log(-torch.expm1(-dt)))  # inverse softplus
        self.A_log.copy_(torch.log(torch.empty(self.H).uniform_(1, 16)))
        nn.init.ones_(self.D)
        nn.init.ones_(self.norm.weight)


class _GatedNormWeight(nn.Module):
    """Holds the gated RMSNorm scale so that its name is ``norm.weight`` as in HF."""

    def __init__(self, dim: int):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
