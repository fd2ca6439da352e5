"""Mamba-1 selective-scan mixer in pure torch (HF Jamba parameter layout and numerics).

``in_proj`` maps the hidden state to ``[x (I) | z (I)]``; a causal depthwise conv (+ bias,
+ SiLU) runs over ``x``; ``x_proj`` gives ``[dt (R) | B (N) | C (N)]`` per token, each
RMS-normed (``dt_layernorm``, ``b_layernorm``, ``c_layernorm``: Jamba's addition);
``dt = softplus(dt_proj(dt))`` (its bias added in float32). Per channel ``c`` and state
dim ``n``, with ``A = -exp(A_log)`` of shape ``(I, N)``:

    S_t[c, n] = exp(dt_t[c] A[c, n]) S_{t-1}[c, n] + dt_t[c] B_t[n] x_t[c]
    y_t[c]    = sum_n S_t[c, n] C_t[n] + D[c] x_t[c],   out = out_proj(y * silu(z))

The scan (:func:`selective_scan`) is the plain sequential recurrence over time, chunked so
that the per-step decays and inputs of ``chunk`` steps are formed at once and the readout
``S_t C_t`` of a chunk is one batched product; the state is float32. Decoding one token is
one step of the same recurrence with the carried conv and SSM states.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from nas.arch import Mamba1
from nas.modules.layers import RMSNorm
from nas.modules.mamba import init_projections_conv_dt


def selective_scan(x: torch.Tensor, dt: torch.Tensor, A: torch.Tensor, B: torch.Tensor,
                   C: torch.Tensor, state: torch.Tensor | None = None, chunk: int = 64
                   ) -> tuple[torch.Tensor, torch.Tensor]:
    """The Mamba-1 recurrence over a sequence (no D term, no gate).

    Shapes: ``x, dt (b, l, I)`` (``dt`` after softplus), ``A (I, N)`` (negative),
    ``B, C (b, l, N)``, ``state (b, I, N)`` before the first token (zeros when ``None``).
    Returns ``y (b, l, I)`` and the state after the last token, both float32.
    """
    b, n, inner = x.shape
    N = A.shape[1]
    s = torch.zeros(b, inner, N, dtype=torch.float32, device=x.device) if state is None \
        else state.float()
    A = A.float()
    ys = []
    grad = torch.is_grad_enabled() and any(
        t.requires_grad for t in (x, dt, A, B, C) + ((state,) if state is not None else ()))
    for k in range(0, n, chunk):
        dtc = dt[:, k:k + chunk].float()  # b q I
        dA = torch.exp(dtc[..., None] * A)  # b q I N
        dBx = (dtc * x[:, k:k + chunk].float())[..., None] * B[:, k:k + chunk, None].float()
        Cc = C[:, k:k + chunk].float()
        if grad:  # autograd: one readout per step, the chunk's steps unbound once (indexing
            # step by step would make each step's backward fill a whole-chunk gradient)
            for a_j, bx_j, c_j in zip(dA.unbind(1), dBx.unbind(1), Cc.unbind(1)):
                s = torch.addcmul(bx_j, a_j, s)
                ys.append((s @ c_j[..., None])[..., 0][:, None])
            continue
        states = torch.empty_like(dA)
        for j in range(dA.shape[1]):
            s = torch.addcmul(dBx[:, j], dA[:, j], s)
            states[:, j] = s
        ys.append((states @ Cc[..., None])[..., 0])  # b q I
    return torch.cat(ys, dim=1), s


class Mamba1Mixer(nn.Module):
    """Mamba-1 mixer (Jamba layout); cache entries ``conv`` (b, I, kernel-1) and ``ssm``
    (b, I, state) float32."""

    def __init__(self, cfg: Mamba1, hidden: int, eps: float = 1e-6, chunk_size: int = 64):
        super().__init__()
        self.cfg = cfg
        self.inner, self.N, self.R = cfg.inner_size, cfg.state_size, cfg.dt_rank
        self.chunk_size = chunk_size
        self.in_proj = nn.Linear(hidden, 2 * self.inner, bias=cfg.proj_bias)
        self.conv1d = nn.Conv1d(self.inner, self.inner, cfg.conv_kernel, groups=self.inner,
                                bias=cfg.conv_bias)
        self.x_proj = nn.Linear(self.inner, self.R + 2 * self.N, bias=False)
        self.dt_proj = nn.Linear(self.R, self.inner, bias=True)
        self.A_log = nn.Parameter(torch.zeros(self.inner, self.N))
        self.D = nn.Parameter(torch.ones(self.inner))
        self.out_proj = nn.Linear(self.inner, hidden, bias=cfg.proj_bias)
        self.dt_layernorm = RMSNorm(self.R, eps)
        self.b_layernorm = RMSNorm(self.N, eps)
        self.c_layernorm = RMSNorm(self.N, eps)

    # ---- pieces -------------------------------------------------------------------------
    def conv_full(self, xs: torch.Tensor, prev: torch.Tensor | None
                  ) -> tuple[torch.Tensor, torch.Tensor]:
        """Causal conv + SiLU over ``xs (b, l, I)`` after ``prev`` (b, I, K-1) past inputs;
        returns the output (b, l, I) and the last K-1 inputs (b, I, K-1)."""
        k = self.cfg.conv_kernel
        xt = xs.transpose(1, 2)
        xp = F.pad(xt, (k - 1, 0)) if prev is None else torch.cat([prev.to(xt.dtype), xt], -1)
        out = F.conv1d(xp, self.conv1d.weight.to(xt.dtype),
                       None if self.conv1d.bias is None else self.conv1d.bias.to(xt.dtype),
                       groups=self.inner)
        return F.silu(out).transpose(1, 2), xp[..., xp.shape[-1] - (k - 1):].contiguous()

    def ssm_params(self, xc: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """``(dt, A, B, C)`` from the conv output ``xc (..., I)``: dt after its norm,
        ``dt_proj`` and softplus (float32), ``A = -exp(A_log)``, B and C after their norms."""
        dt, B, C = torch.split(self.x_proj(xc), [self.R, self.N, self.N], dim=-1)
        dt, B, C = self.dt_layernorm(dt), self.b_layernorm(B), self.c_layernorm(C)
        dt = F.linear(dt, self.dt_proj.weight).float() + self.dt_proj.bias.float()
        return F.softplus(dt), -torch.exp(self.A_log.float()), B, C

    def ssm_inputs(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
        """Everything the scan sees for a whole sequence from rest (used for importance):
        conv output ``x``, gate ``z``, ``dt``, ``A``, ``B``, ``C``."""
        xs, z = self.in_proj(x).chunk(2, dim=-1)
        xc, _ = self.conv_full(xs, None)
        dt, A, B, C = self.ssm_params(xc)
        return {"x": xc, "z": z, "dt": dt, "A": A, "B": B, "C": C}

    # ---- forward ------------------------------------------------------------------------
    def forward(self, x: torch.Tensor, cache: dict[str, Any] | None = None,
                offset: int = 0) -> torch.Tensor:
        xs, z = self.in_proj(x).chunk(2, dim=-1)
        if cache is not None and x.shape[1] == 1 and "ssm" in cache:
            window = torch.cat([cache["conv"].to(xs.dtype), xs.transpose(1, 2)], dim=-1)
            xc = (window * self.conv1d.weight[:, 0, :].to(xs.dtype)).sum(-1)
            if self.conv1d.bias is not None:
                xc = xc + self.conv1d.bias
            cache["conv"] = window[..., 1:]
            xc = F.silu(xc)[:, None]
            dt, A, B, C = self.ssm_params(xc)
            s = torch.addcmul((dt[:, 0] * xc[:, 0].float())[..., None] * B[:, 0, None].float(),
                              torch.exp(dt[:, 0, :, None] * A), cache["ssm"].float())
            cache["ssm"] = s
            y = (s @ C[:, 0, :, None].float())[..., 0][:, None]
        else:
            prev = cache.get("conv") if cache is not None else None
            xc, last = self.conv_full(xs, prev)
            dt, A, B, C = self.ssm_params(xc)
            y, final = selective_scan(xc, dt, A, B, C,
                                      cache.get("ssm") if cache is not None else None,
                                      self.chunk_size)
            if cache is not None:
                cache["conv"], cache["ssm"] = last, final
        y = (y + xc.float() * self.D.float()) * F.silu(z.float())
        return self.out_proj(y.to(x.dtype))

    @torch.no_grad()
    def reset_parameters(self, std: float = 0.02, out_std: float = 0.02,
                         dt_min: float = 1e-3, dt_max: float = 0.1) -> None:
        """Mamba-1's init: normal projections, S4D-real ``A_log = log(1..N)`` per channel,
        ``dt`` bias the inverse softplus of a log-uniform ``[dt_min, dt_max]`` step,
        ``D = 1``, unit norms."""
        for lin in (self.in_proj, self.x_proj):
            nn.init.normal_(lin.weight, std=std)
        nn.init.normal_(self.out_proj.weight, std=out_std)
        nn.init.uniform_(self.dt_proj.weight, -self.R ** -0.5, self.R ** -0.5)
        self.dt_proj.bias.copy_(init_projections_conv_dt(self, self.inner, dt_min, dt_max))
        self.A_log.copy_(torch.log(torch.arange(1, self.N + 1, dtype=torch.float32))
                         .expand(self.inner, -1))
        nn.init.ones_(self.D)
        for norm in (self.dt_layernorm, self.b_layernorm, self.c_layernorm):
            norm.reset_parameters()


def make_mixer(cfg: Mamba1, arch: Any) -> Mamba1Mixer:
    """The kind's mixer in ``arch`` (:func:`nas.modules.model.make_mixer` calls it): Jamba's
    dt / B / C norms at the model's eps."""
    return Mamba1Mixer(cfg, arch.hidden_size, arch.norm_eps)
