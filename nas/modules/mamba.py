"""Mamba-2 mixer in pure torch (HF NemotronH parameter layout).

``in_proj`` maps the hidden state to ``[z (I) | x (I) | B (g*N) | C (g*N) | dt (H)]`` with
``I = heads * head_dim``; a causal depthwise conv (+ SiLU) runs over ``[x | B | C]``; the
selective state space recurrence per head ``h`` is

    S_t = exp(dt_t * A_h) * S_{t-1} + dt_t * x_t B_t^T,   y_t = S_t C_t + D_h * x_t

with ``dt_t = softplus(dt_raw + dt_bias)``, ``A = -exp(A_log)`` and ``B``, ``C`` shared by
the heads of a group; then a gated RMSNorm (``norm(y * silu(z))`` per group of
``I / n_groups`` channels) and ``out_proj``.

Whole sequences use the chunked SSD form (:func:`ssd_chunked`: quadratic attention-like
within a chunk, a linear recurrence over chunk states; B and C stay per group);
decoding one token uses :func:`ssd_step`, updating the carried SSM state in place.
"""

from __future__ import annotations

import math
from typing import Any, Protocol

import torch
import torch.nn.functional as F
from torch import nn

from nas.arch import Mamba


def _needs_grad(*ts: torch.Tensor | None) -> bool:
    return torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in ts)


def _compute_dtype(x: torch.Tensor) -> torch.dtype:
    """The dtype of the SSD's matmuls: the input's on accelerators (fp32 accumulation in
    their GEMMs), float32 on CPU, where bf16/fp16 GEMMs without native support run ~10x
    slower than fp32 (measured on the AVX2 test machine: 4 vs 55 GFLOP/s)."""
    if x.dtype in (torch.float16, torch.bfloat16) and x.device.type != "cpu":
        return x.dtype
    return torch.float32


def ssd_chunked(x: torch.Tensor, dt: torch.Tensor, A: torch.Tensor, B: torch.Tensor,
                C: torch.Tensor, chunk: int = 64, state: torch.Tensor | None = None,
                compute_dtype: torch.dtype | None = None
                ) -> tuple[torch.Tensor, torch.Tensor]:
    """The SSM over a whole sequence by the chunked state-space-duality scan (no D term).

    Shapes: ``x (b, l, H, P)``, ``dt (b, l, H)`` (after softplus), ``A (H)`` (negative),
    ``B, C (b, l, G, N)`` per group (``G`` divides ``H``; head ``h`` uses group
    ``h // (H / G)``; ``G = H`` takes per-head B, C), ``state (b, H, P, N)`` the state before
    the first token (zeros when ``None``). Returns ``y (b, l, H, P)`` and the state after
    the last token, both float32.

    Per chunk of ``chunk`` steps: ``C B^T`` once per group; the decay ``exp(cumsum a_i -
    cumsum a_j)`` (the segment sum, one ``(chunk x chunk)`` matrix per head: the only
    per-head quadratic tensor) multiplied into it in place; chunk states and their readout
    as per-group matmuls over all heads of the group; the chunk-to-chunk recurrence as a
    scan over chunks. The cumulative sums, decays and carried states are float32; the
    matmuls run in ``compute_dtype`` (default :func:`_compute_dtype`).
    """
    b, n, H, P = x.shape
    G, N = B.shape[2], B.shape[3]
    if H % G or C.shape[2] != G:
        raise ValueError(f"B, C groups ({G}, {C.shape[2]}) must be equal and divide the "
                         f"{H} heads")
    R = H // G
    cd = compute_dtype or _compute_dtype(x)
    grad = _needs_grad(x, dt, A, B, C, state)
    q = chunk
    pad = (-n) % q
    dt = dt.float()
    if pad:  # padded steps have dt = 0: no decay and no input, so the final state is exact
        x = F.pad(x, (0, 0, 0, 0, 0, pad))
        dt = F.pad(dt, (0, 0, 0, pad))
        B = F.pad(B, (0, 0, 0, 0, 0, pad))
        C = F.pad(C, (0, 0, 0, 0, 0, pad))
    c = x.shape[1] // q
    acs = torch.cumsum((dt * A.float()).view(b, c, q, H), dim=2)  # b c q H, float32
    acs_h = acs.transpose(2, 3).contiguous()  # b c H q
    xdt = (x.to(cd) * dt.to(cd)[..., None]).view(b, c, q, H, P)
    xdt_h = xdt.permute(0, 1, 3, 2, 4).contiguous()  # b c H q P
    Bg = B.to(cd).view(b, c, q, G, N).transpose(2, 3).contiguous()  # b c G q N
    Cg = C.to(cd).view(b, c, q, G, N).transpose(2, 3).contiguous()

    # within each chunk: y_i = sum_{j<=i} (C_i . B_j) exp(acs_i - acs_j) dt_j x_j
    CB = Cg @ Bg.transpose(-1, -2)  # b c G q q: once per group, not per head
    lower = torch.ones(q, q, dtype=torch.bool, device=x.device).tril()
    seg = acs_h[..., :, None] - acs_h[..., None, :]  # b c H q q
    if grad:
        M = torch.exp(seg.masked_fill(~lower, float("-inf"))).view(b, c, G, R, q, q) \
            * CB[:, :, :, None].float()
    else:
        M = seg.masked_fill_(~lower, float("-inf")).exp_().view(b, c, G, R, q, q)
        M.mul_(CB[:, :, :, None])
    y = M.view(b, c, H, q, q).to(cd) @ xdt_h  # b c H q P

    # the state each chunk contributes at its end, per group over all of its heads
    to_end = torch.exp(acs_h[..., -1:] - acs_h)  # b c H q
    xw = (xdt_h * to_end[..., None].to(cd)).view(b, c, G, R, q, P)
    states = torch.einsum("bcgrqp,bcgqn->bcgrpn", xw, Bg).reshape(b, c, H, P, N).float()

    # carry the states across chunks: S_k = exp(sum of a over chunk k) S_{k-1} + states_k
    decay = torch.exp(acs[:, :, -1])  # b c H
    run = torch.zeros(b, H, P, N, dtype=torch.float32, device=x.device) if state is None \
        else state.float()
    enter = torch.empty(b, c, H, P, N, dtype=torch.float32, device=x.device)
    for k in range(c):
        enter[:, k] = run
        run = torch.addcmul(states[:, k], run, decay[:, k, :, None, None])

    # the state entering each chunk, read out by C and decayed to each step
    y_off = Cg @ enter.to(cd).view(b, c, G, R * P, N).transpose(-1, -2)  # b c G q (R P)
    y_off = y_off.view(b, c, G, q, R, P).float() \
        * torch.exp(acs).view(b, c, q, G, R).transpose(2, 3)[..., None]
    y_diag = y.view(b, c, G, R, q, P).transpose(3, 4).float()  # b c G q R P
    out = (y_off + y_diag) if grad else y_off.add_(y_diag)
    out = out.permute(0, 1, 3, 2, 4, 5).reshape(b, c * q, H, P)
    return out[:, :n], run


def ssd_step(x: torch.Tensor, dt: torch.Tensor, A: torch.Tensor, B: torch.Tensor,
             C: torch.Tensor, state: torch.Tensor, inplace: bool = False
             ) -> tuple[torch.Tensor, torch.Tensor]:
    """One recurrence step: ``x (b, H, P)``, ``dt (b, H)``, ``B, C (b, G, N)`` per group
    (``G`` divides ``H``), ``state (b, H, P, N)``; returns ``y (b, H, P)`` (no D term) and
    the new state, float32. ``inplace``: update ``state`` (float32) in place and return it.
    """
    b, H, P = x.shape
    G, N = B.shape[1], B.shape[2]
    R = H // G
    x, dt = x.float(), dt.float()
    decay = torch.exp(dt * A.float()).view(b, G, R, 1, 1)
    dx = (dt[..., None] * x).view(b, G, R, P, 1)
    Bv = B.float().view(b, G, 1, 1, N)
    if inplace and state.dtype == torch.float32 and not _needs_grad(x, dt, B, state):
        sv = state.view(b, G, R, P, N)
        sv.mul_(decay).addcmul_(dx, Bv)
        new = state
    else:
        new = (state.float().view(b, G, R, P, N) * decay + dx * Bv).view(b, H, P, N)
    y = (new.view(b, G, R * P, N) @ C.float().view(b, G, N, 1)).view(b, H, P)
    return y, new


class _ConvConfig(Protocol):
    @property
    def conv_kernel(self) -> int: ...


class _MambaFamily(Protocol):
    """What :func:`init_projections_conv_dt` reads of a Mamba-1 or Mamba-2 mixer."""

    @property
    def cfg(self) -> _ConvConfig: ...
    @property
    def in_proj(self) -> nn.Linear: ...
    @property
    def out_proj(self) -> nn.Linear: ...
    @property
    def conv1d(self) -> nn.Conv1d: ...


@torch.no_grad()
def init_projections_conv_dt(mixer: _MambaFamily, n: int, dt_min: float, dt_max: float
                             ) -> torch.Tensor:
    """The Mamba family's shared init (Mamba-1 and Mamba-2 mixers): zero ``in_proj`` /
    ``out_proj`` biases, PyTorch's default init of the depthwise ``conv1d`` (bias uniform
    in +-1/sqrt(kernel)), and the ``dt`` bias for ``n`` channels or heads: the inverse
    softplus of a log-uniform sample in ``[dt_min, dt_max]`` (seconds-free step sizes)."""
    for lin in (mixer.in_proj, mixer.out_proj):
        if lin.bias is not None:
            nn.init.zeros_(lin.bias)
    nn.init.kaiming_uniform_(mixer.conv1d.weight, a=math.sqrt(5))
    if mixer.conv1d.bias is not None:
        bound = 1 / math.sqrt(mixer.cfg.conv_kernel)
        nn.init.uniform_(mixer.conv1d.bias, -bound, bound)
    dt = torch.exp(torch.rand(n) * (math.log(dt_max) - math.log(dt_min)) + math.log(dt_min))
    return dt + torch.log(-torch.expm1(-dt))  # inverse softplus


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
        z, xbc, dt = torch.split(proj, [self.inner, self.conv_dim, self.H], dim=-1)
        return z, xbc, dt

    def _ssm_args(self, xbc: torch.Tensor, dt_raw: torch.Tensor, clamp: bool = True
                  ) -> tuple[torch.Tensor, ...]:
        """Split the conv output into x, B, C (per group: ``(..., G, N)``) and prepare dt
        (clamped to ``dt_limit`` when ``clamp``) and A."""
        lead = xbc.shape[:-1]
        xs, B, C = torch.split(xbc, [self.inner, self.G * self.N, self.G * self.N], dim=-1)
        B = B.reshape(*lead, self.G, self.N)
        C = C.reshape(*lead, self.G, self.N)
        dt = F.softplus(dt_raw.float() + self.dt_bias.float())
        if clamp and self.dt_limit != (0.0, math.inf):
            dt = dt.clamp(self.dt_limit[0], self.dt_limit[1])
        A = -torch.exp(self.A_log.float())
        return xs.reshape(*lead, self.H, self.P), dt, A, B, C

    def gated_norm(self, y: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        """``RMSNorm(y * silu(z))`` over groups of ``I / n_groups`` channels, times weight
        (float32 inside, rounded to ``y``'s dtype before the weight as in transformers; in
        place when no gradient is recorded)."""
        shp = y.shape
        if _needs_grad(y, z, self.norm.weight):
            g = (y.float() * F.silu(z.float()))
            g = g.reshape(*shp[:-1], self.G, self.inner // self.G)
            g = g * torch.rsqrt(g.pow(2).mean(-1, keepdim=True) + self.eps)
            return self.norm.weight * g.reshape(shp).to(y.dtype)
        g = F.silu(z.float()) if z.dtype != torch.float32 else F.silu(z)
        g = g.mul_(y).view(*shp[:-1], self.G, self.inner // self.G)
        g.mul_(torch.rsqrt(g.square().mean(-1, keepdim=True).add_(self.eps)))
        out = g.view(shp).to(y.dtype)
        return out.mul_(self.norm.weight) if out.dtype == self.norm.weight.dtype \
            else self.norm.weight * out

    def conv_full(self, xbc: torch.Tensor, prev: torch.Tensor | None
                  ) -> tuple[torch.Tensor, torch.Tensor]:
        """Causal conv + SiLU over ``xbc (b, l, C)`` after ``prev`` (b, C, K-1) past inputs;
        returns the output (b, l, C) and the last K-1 inputs.

        Without autograd: in the ``(b, l, C)`` layout as ``K`` shifted multiply-adds (a
        depthwise conv is that), in place, with no transposed copies of the activations;
        with autograd: ``conv1d`` (its fused backward beats the multiply-adds')."""
        k = self.cfg.conv_kernel
        b, n, _ = xbc.shape
        w = self.conv1d.weight[:, 0, :].to(xbc.dtype)  # (C, K): tap j reads x[t - (K-1) + j]
        if prev is None:
            xp = F.pad(xbc, (0, 0, k - 1, 0))
        else:
            xp = torch.cat([prev.to(xbc.dtype).transpose(1, 2), xbc], dim=1)
        bias = self.conv1d.bias
        if _needs_grad(xbc, w, prev):  # autograd: conv1d's fused backward is cheaper
            out = F.conv1d(xp.transpose(1, 2), self.conv1d.weight.to(xbc.dtype),
                           None if bias is None else bias.to(xbc.dtype),
                           groups=self.conv_dim)
            out = F.silu(out).transpose(1, 2)
        else:  # accumulated in float32 (one rounding, as a conv kernel does), in place
            acc = torch.float32 if xbc.dtype in (torch.bfloat16, torch.float16) else xbc.dtype
            xa, wa = xp.to(acc), w.to(acc)
            out = xa[:, k - 1:] * wa[:, k - 1]
            for j in range(k - 1):
                out.addcmul_(xa[:, j:j + n], wa[:, j])
            if bias is not None:
                out.add_(bias.to(acc))
            out = F.silu(out, inplace=True).to(xbc.dtype)
        return out, xp[:, xp.shape[1] - (k - 1):].transpose(1, 2).contiguous()

    def ssm_inputs(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
        """Everything the SSM sees for a whole sequence from rest (used for importance)."""
        z, xbc, dt_raw = self._split(self.in_proj(x))
        xbc, _ = self.conv_full(xbc, None)
        xs, dt, A, B, C = self._ssm_args(xbc, dt_raw)
        rep = self.H // self.G  # B and C expanded to the heads that use them
        return {"z": z, "x": xs, "dt": dt, "A": A, "B": B.repeat_interleave(rep, dim=-2),
                "C": C.repeat_interleave(rep, dim=-2)}

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
            y = _add_skip(y, xs, self.D)
            if cache is not None:
                cache["conv"], cache["ssm"] = last, final
        # as transformers: the scan's float32 output enters the gated norm as it is (the
        # one-token step's is cast to the input dtype first, see _step)
        y = y.reshape(b, n, self.inner)
        return self.out_proj(self.gated_norm(y, z).to(x.dtype))

    def _step(self, xbc: torch.Tensor, dt_raw: torch.Tensor, cache: dict[str, Any]
              ) -> torch.Tensor:
        window = torch.cat([cache["conv"].to(xbc.dtype), xbc[:, :, None]], dim=-1)  # b C K
        out = (window * self.conv1d.weight[:, 0, :]).sum(-1)
        if self.conv1d.bias is not None:
            out = out + self.conv1d.bias
        cache["conv"] = window[..., 1:]
        xs, dt, A, B, C = self._ssm_args(F.silu(out), dt_raw, clamp=False)
        y, cache["ssm"] = ssd_step(xs, dt, A, B, C, cache["ssm"], inplace=True)
        return _add_skip(y, xs, self.D).to(xbc.dtype)

    @torch.no_grad()
    def reset_parameters(self, std: float = 0.02, out_std: float = 0.02,
                         dt_min: float = 1e-3, dt_max: float = 0.1) -> None:
        nn.init.normal_(self.in_proj.weight, std=std)
        nn.init.normal_(self.out_proj.weight, std=out_std)
        self.dt_bias.copy_(init_projections_conv_dt(self, self.H, dt_min, dt_max))
        self.A_log.copy_(torch.log(torch.empty(self.H).uniform_(1, 16)))
        nn.init.ones_(self.D)
        nn.init.ones_(self.norm.weight)


def _add_skip(y: torch.Tensor, xs: torch.Tensor, D: torch.Tensor) -> torch.Tensor:
    """``y + D_h x`` (float32), in place on ``y`` when no gradient is recorded."""
    if _needs_grad(y, xs, D):
        return y + xs.float() * D.float()[:, None]
    return y.addcmul_(xs, D.float()[:, None])


class _GatedNormWeight(nn.Module):
    """Holds the gated RMSNorm scale so that its name is ``norm.weight`` as in HF."""

    def __init__(self, dim: int):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
