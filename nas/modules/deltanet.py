"""Gated DeltaNet linear attention in pure torch (Qwen3-Next parameter layout).

Per value head ``h`` the layer keeps a state ``S`` of ``head_k_dim x head_v_dim``; for each
token, with ``q, k`` L2-normalized (``q`` also scaled by ``head_k_dim ** -0.5``),

    S <- exp(g_t) S,    S <- S + beta_t k_t (v_t - S^T k_t)^T,    o_t = S^T q_t

with ``g = -exp(A_log) * softplus(a + dt_bias)`` and ``beta = sigmoid(b)`` (arXiv 2412.06464).
Query/key head ``i`` serves the ``num_v_heads / num_k_heads`` consecutive value heads
``i*r .. i*r + r - 1``.

Parameters, as transformers' ``Qwen3NextGatedDeltaNet`` names and lays them out:

* ``in_proj_qkvz.weight (2K + 2V, h)``: rows grouped per query/key head ``i``, each group
  ``[q_i (dk) | k_i (dk) | v (r*dv) | z (r*dv)]`` (``K = nk*dk``, ``V = nv*dv``);
* ``in_proj_ba.weight (2nv, h)``: per query/key head ``[b (r) | a (r)]``;
* ``conv1d.weight (2K + V, 1, kernel)``: depthwise causal conv (no bias) over
  ``[q (K) | k (K) | v (V)]``, then SiLU;
* ``dt_bias (nv)``, ``A_log (nv)``, ``norm.weight (dv)`` (gated RMSNorm ``w * norm(o) *
  silu(z)`` per head), ``out_proj.weight (h, V)``.

``split=True`` takes the Qwen3.5 layout instead (transformers' ``Qwen3_5GatedDeltaNet``):
``in_proj_qkv (2K + V, h)`` already in conv order, ``in_proj_z (V, h)``, ``in_proj_b (nv,
h)``, ``in_proj_a (nv, h)``; same numerics and parameter count.

Whole sequences run the chunked form (:func:`gated_delta_chunked`: within a chunk the
delta-rule corrections are one unit-lower-triangular solve, across chunks a recurrence
over states); one-token decode steps run :func:`gated_delta_step` on the carried state.
Everything in the rule is float32, as transformers' torch path computes it.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from nas.arch import DeltaNet

DEFAULT_CHUNK = 64  # transformers' and FLA's chunk length


def l2_normalize(x: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """``x / sqrt(sum(x^2) + eps)`` over the last dim (the FLA / transformers form)."""
    return x * torch.rsqrt(x.square().sum(-1, keepdim=True) + eps)


def _prepare(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor,
             beta: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """Heads first and float32; q, k expanded to the value heads, normalized, q scaled."""
    r = v.shape[2] // q.shape[2]
    if r > 1:
        q, k = q.repeat_interleave(r, dim=2), k.repeat_interleave(r, dim=2)
    q, k, v = (t.transpose(1, 2).float() for t in (q, k, v))  # b H n d
    g, beta = g.transpose(1, 2).float(), beta.transpose(1, 2).float()  # b H n
    q = l2_normalize(q) * (q.shape[-1] ** -0.5)
    k = l2_normalize(k)
    return q, k, v, g, beta


def gated_delta_step(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor,
                     beta: torch.Tensor, state: torch.Tensor | None = None
                     ) -> tuple[torch.Tensor, torch.Tensor]:
    """The gated delta rule token by token (the recurrent form; any length).

    Shapes: ``q, k (b, n, nk, dk)``, ``v (b, n, nv, dv)``, ``g, beta (b, n, nv)``, ``state
    (b, nv, dk, dv)`` (zeros when ``None``). Returns ``o (b, n, nv, dv)`` in ``v``'s dtype and
    the final float32 state.
    """
    dtype = v.dtype
    q, k, v, g, beta = _prepare(q, k, v, g, beta)
    b, H, n, dk = k.shape
    dv = v.shape[-1]
    S = torch.zeros(b, H, dk, dv, dtype=torch.float32, device=v.device) if state is None \
        else state.float()
    out = torch.empty(b, H, n, dv, dtype=torch.float32, device=v.device)
    for t in range(n):
        S = S * g[:, :, t].exp()[..., None, None]
        kt = k[:, :, t]
        err = v[:, :, t] - (kt[..., None] * S).sum(-2)  # v - S^T k
        S = S + kt[..., None] * (beta[:, :, t, None] * err)[..., None, :]
        out[:, :, t] = (q[:, :, t, :, None] * S).sum(-2)
    return out.transpose(1, 2).to(dtype), S


def gated_delta_chunked(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor,
                        beta: torch.Tensor, state: torch.Tensor | None = None,
                        chunk: int = DEFAULT_CHUNK) -> tuple[torch.Tensor, torch.Tensor]:
    """The gated delta rule over a whole sequence in chunks (same contract as
    :func:`gated_delta_step`).

    Within a chunk, with ``G_t`` the cumulative log decay from the chunk start, the values
    the rule writes are ``U = W - Kc S0`` where ``(I + A) W = beta V`` and ``(I + A) Kc =
    beta exp(G) K`` for the strictly lower ``A_tj = beta_t exp(G_t - G_j) k_t . k_j``
    (one triangular solve per chunk); the outputs are ``exp(G) Q S0 + (Q K^T * D) U`` with
    ``D_tj = exp(G_t - G_j)`` for ``j <= t``; the state leaving the chunk is
    ``exp(G_last) S0 + (K * exp(G_last - G))^T U``.
    """
    dtype = v.dtype
    q, k, v, g, beta = _prepare(q, k, v, g, beta)
    b, H, n, dk = k.shape
    dv = v.shape[-1]
    pad = (-n) % chunk
    if pad:  # padded steps: g = 0 (no decay), beta = 0 (no write); outputs dropped
        q, k, v = (F.pad(t, (0, 0, 0, pad)) for t in (q, k, v))
        g, beta = F.pad(g, (0, pad)), F.pad(beta, (0, pad))
    c = (n + pad) // chunk
    q, k, v = (t.reshape(b, H, c, chunk, t.shape[-1]) for t in (q, k, v))
    g, beta = g.reshape(b, H, c, chunk), beta.reshape(b, H, c, chunk)
    G = g.cumsum(-1)  # b H c Q
    causal = torch.ones(chunk, chunk, dtype=torch.bool, device=v.device).tril()
    decay = (G[..., :, None] - G[..., None, :]).masked_fill(~causal, float("-inf")).exp()
    kb = k * beta[..., None]
    A = (kb @ k.transpose(-1, -2)) * decay
    system = A.tril(-1) + torch.eye(chunk, dtype=A.dtype, device=A.device)
    rhs = torch.cat([v * beta[..., None], kb * G.exp()[..., None]], dim=-1)
    sol = torch.linalg.solve_triangular(system, rhs, upper=False, unitriangular=True)
    W, Kc = sol[..., :dv], sol[..., dv:]
    attn = (q @ k.transpose(-1, -2)) * decay  # b H c Q Q (zero above the diagonal)
    q_in = q * G.exp()[..., None]  # reads the entering state
    k_out = k * (G[..., -1:] - G).exp()[..., None]  # writes into the leaving state
    leave = G[..., -1].exp()[..., None, None]  # b H c 1 1
    S = torch.zeros(b, H, dk, dv, dtype=torch.float32, device=v.device) if state is None \
        else state.float()
    out = torch.empty(b, H, c, chunk, dv, dtype=torch.float32, device=v.device)
    for j in range(c):
        U = W[:, :, j] - Kc[:, :, j] @ S
        out[:, :, j] = q_in[:, :, j] @ S + attn[:, :, j] @ U
        S = S * leave[:, :, j] + k_out[:, :, j].transpose(-1, -2) @ U
    out = out.reshape(b, H, c * chunk, dv)[:, :, :n]
    return out.transpose(1, 2).to(dtype), S


class GatedRMSNorm(nn.Module):
    """``weight * rmsnorm(x) * silu(z)`` over the last dim (norm first, then the gate), in
    float32."""

    def __init__(self, dim: int, eps: float = 1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.square().mean(-1, keepdim=True) + self.eps)
        return (self.weight * x32.to(dtype) * F.silu(z.float())).to(dtype)


class DeltaNetMixer(nn.Module):
    """Gated DeltaNet token mixer (see the module docstring for the layout).

    Cache (this block's dict of a :class:`nas.modules.model.Cache`): ``conv`` holds the last
    ``kernel - 1`` conv inputs ``(b, 2K + V, kernel - 1)`` and ``state`` the float32
    recurrent state ``(b, nv, dk, dv)``; both are fixed-size.
    """

    def __init__(self, cfg: DeltaNet, hidden: int, eps: float = 1e-6,
                 chunk: int = DEFAULT_CHUNK, split: bool = False):
        super().__init__()
        self.cfg, self.chunk, self.split = cfg, chunk, split
        nk, nv, dk, dv = cfg.num_k_heads, cfg.num_v_heads, cfg.head_k_dim, cfg.head_v_dim
        self.key_dim, self.value_dim = nk * dk, nv * dv
        self.conv_dim = 2 * self.key_dim + self.value_dim
        if split:
            self.in_proj_qkv = nn.Linear(hidden, self.conv_dim, bias=False)
            self.in_proj_z = nn.Linear(hidden, self.value_dim, bias=False)
            self.in_proj_b = nn.Linear(hidden, nv, bias=False)
            self.in_proj_a = nn.Linear(hidden, nv, bias=False)
        else:
            self.in_proj_qkvz = nn.Linear(hidden, 2 * self.key_dim + 2 * self.value_dim,
                                          bias=False)
            self.in_proj_ba = nn.Linear(hidden, 2 * nv, bias=False)
        self.conv1d = nn.Conv1d(self.conv_dim, self.conv_dim, cfg.conv_kernel, bias=False,
                                groups=self.conv_dim, padding=cfg.conv_kernel - 1)
        self.dt_bias = nn.Parameter(torch.ones(nv))
        self.A_log = nn.Parameter(torch.zeros(nv))
        self.norm = GatedRMSNorm(dv, eps)
        self.out_proj = nn.Linear(self.value_dim, hidden, bias=False)

    def _split(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """``(qkv (b, n, 2K + V) in conv order, z (b, n, nv, dv), b, a (b, n, nv))``."""
        cfg = self.cfg
        bsz, n, _ = x.shape
        nk, dk, dv = cfg.num_k_heads, cfg.head_k_dim, cfg.head_v_dim
        if self.split:
            return (self.in_proj_qkv(x), self.in_proj_z(x).view(bsz, n, cfg.num_v_heads, dv),
                    self.in_proj_b(x), self.in_proj_a(x))
        r = cfg.num_v_heads // nk
        qkvz = self.in_proj_qkvz(x).view(bsz, n, nk, 2 * dk + 2 * r * dv)
        q, k, v, z = torch.split(qkvz, [dk, dk, r * dv, r * dv], dim=-1)
        ba = self.in_proj_ba(x).view(bsz, n, nk, 2 * r)
        b, a = ba[..., :r].reshape(bsz, n, -1), ba[..., r:].reshape(bsz, n, -1)
        qkv = torch.cat([q.reshape(bsz, n, -1), k.reshape(bsz, n, -1),
                         v.reshape(bsz, n, -1)], dim=-1)
        return qkv, z.reshape(bsz, n, cfg.num_v_heads, dv), b, a

    def _conv(self, qkv: torch.Tensor, cache: dict[str, Any] | None) -> torch.Tensor:
        """Causal depthwise conv + SiLU over ``qkv (b, n, C)``, continuing the cached inputs."""
        n = qkv.shape[1]
        K = self.cfg.conv_kernel
        xt = qkv.transpose(1, 2)  # b C n
        w = self.conv1d.weight
        if cache is not None:
            past = cache.get("conv")
            if past is None:
                past = xt.new_zeros(xt.shape[0], self.conv_dim, K - 1)
            full = torch.cat([past.to(xt.dtype), xt], dim=-1)
            cache["conv"] = full[:, :, full.shape[-1] - (K - 1):].clone()
            y = F.conv1d(full, w, groups=self.conv_dim)[:, :, -n:]
        else:
            y = F.conv1d(xt, w, padding=K - 1, groups=self.conv_dim)[:, :, :n]
        return F.silu(y).transpose(1, 2)

    def forward(self, x: torch.Tensor, cache: dict[str, Any] | None = None,
                offset: int = 0) -> torch.Tensor:
        return self.out_proj(self.gated_output(x, cache).flatten(-2))

    def gated_output(self, x: torch.Tensor, cache: dict[str, Any] | None = None
                     ) -> torch.Tensor:
        """The gated-norm output per value head ``(b, n, nv, dv)``, what ``out_proj`` reads
        (the importance of a head for pruning)."""
        cfg = self.cfg
        bsz, n, _ = x.shape
        qkv, z, b, a = self._split(x)
        qkv = self._conv(qkv, cache)
        q, k, v = torch.split(qkv, [self.key_dim, self.key_dim, self.value_dim], dim=-1)
        q = q.reshape(bsz, n, cfg.num_k_heads, cfg.head_k_dim)
        k = k.reshape(bsz, n, cfg.num_k_heads, cfg.head_k_dim)
        v = v.reshape(bsz, n, cfg.num_v_heads, cfg.head_v_dim)
        beta = b.sigmoid()
        g = -self.A_log.float().exp() * F.softplus(a.float() + self.dt_bias)
        state = cache.get("state") if cache is not None else None
        if n == 1 and state is not None:
            o, state = gated_delta_step(q, k, v, g, beta, state)
        else:
            o, state = gated_delta_chunked(q, k, v, g, beta, state, self.chunk)
        if cache is not None:
            cache["state"] = state
        return self.norm(o, z)

    @torch.no_grad()
    def reset_parameters(self, std: float = 0.02, out_std: float = 0.02) -> None:
        """Normal ``std`` projections and conv, ``out_std`` output; ``dt_bias`` 1 and ``A``
        uniform in [1, 16] (transformers' init), unit gated-norm weight."""
        ins = (self.in_proj_qkv, self.in_proj_z, self.in_proj_b, self.in_proj_a) \
            if self.split else (self.in_proj_qkvz, self.in_proj_ba)
        for lin in ins:
            nn.init.normal_(lin.weight, std=std)
        nn.init.normal_(self.conv1d.weight, std=std)
        nn.init.normal_(self.out_proj.weight, std=out_std)
        nn.init.ones_(self.dt_bias)
        self.A_log.copy_(torch.empty_like(self.A_log).uniform_(1.0, 16.0).log_())
        nn.init.ones_(self.norm.weight)


__all__ = ["DEFAULT_CHUNK", "DeltaNetMixer", "GatedRMSNorm", "gated_delta_chunked",
           "gated_delta_step", "l2_normalize"]


def make_mixer(cfg: DeltaNet, arch: Any) -> DeltaNetMixer:
    """The mixer of a Gated DeltaNet block (the model's factory finds it by the kind's name);
    Qwen3.5 stores the input projections split."""
    return DeltaNetMixer(cfg, arch.hidden_size, arch.norm_eps,
                         split=arch.model_type.startswith("qwen3_5"))
