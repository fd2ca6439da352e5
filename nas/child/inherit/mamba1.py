"""Child initialization of a Mamba-1 (Jamba) block from its parent block
(:func:`nas.child.inherit.inherit_block` calls :func:`inherit_mamba1`).

The recurrence is independent per channel ``c`` and per state dim ``n``: ``y_t[c] = sum_n
S_t[c, n] C_t[n]`` with ``S_t[c, n]`` driven by ``x[c]``, ``dt[c]``, ``A[c, n]`` and
``B[n]`` only. So on the parent's calibration activations:

* **fewer channels**: channels ranked by their contribution into ``out_proj``,
  ``mean_t |y_t[c] + D[c] x_t[c]| * |silu(z_t[c])| * ||W_out[:, c]||`` (the gated scan
  output entering ``out_proj``, as the other kinds' channel contribution); the kept
  channels' rows of ``in_proj`` (both the x and the z half), conv taps and bias,
  ``dt_proj`` rows and bias, ``A_log`` rows and ``D``, and their columns of ``x_proj`` and
  ``out_proj`` are copied. ``x_proj`` then sums over the kept channels only, so dt, B and C
  change by the dropped channels' share (exact when those channels' ``x_proj`` columns are
  zero);
* **smaller state**: state dims ranked by the energy of their share of the scan output over
  the kept channels, ``mean_{b,t} sum_c (S_t[c, n] C_t[n])^2`` (one scan per dim: exact,
  the dims do not interact); the kept dims' columns of ``A_log``, rows of ``x_proj``'s B
  and C parts and weights of ``b_layernorm`` / ``c_layernorm`` are copied. The B and C
  RMSNorms then average over the kept dims only (an approximation: their scale changes by
  the dropped dims' share of the mean square);
* the dt rank, dt norm and conv kernel must match the parent's (else random init).
"""

from __future__ import annotations

import torch

from nas.arch import Mamba1
from nas.modules.mamba1 import Mamba1Mixer, selective_scan


def _top(scores: torch.Tensor, k: int) -> torch.Tensor:
    """Indices of the ``k`` largest scores, in increasing index order."""
    return torch.topk(scores.float(), k).indices.sort().values


def _copy(dst: torch.Tensor, src: torch.Tensor) -> None:
    dst.copy_(src.to(dst.dtype))


@torch.no_grad()
def inherit_mamba1(p: Mamba1Mixer, c: Mamba1Mixer, pc: Mamba1, cc: Mamba1,
                   xin: torch.Tensor) -> str:
    """Initialize child mixer ``c`` from parent mixer ``p`` given the parent mixer's input
    ``xin`` (b, l, hidden); returns what was done (see the module docstring)."""
    if (pc.dt_rank, pc.conv_kernel) != (cc.dt_rank, cc.conv_kernel):
        return "random (dt rank or conv kernel differs)"
    if cc.inner_size > pc.inner_size or cc.state_size > pc.state_size:
        return "random (more channels or a larger state than the parent)"
    Ip, Ic, Np, Nc, R = pc.inner_size, cc.inner_size, pc.state_size, cc.state_size, pc.dt_rank
    dev = xin.device
    chans = torch.arange(Ip, device=dev)
    states = torch.arange(Np, device=dev)
    notes = []
    if Ic < Ip or Nc < Np:
        s = p.ssm_inputs(xin)
    if Ic < Ip:
        y, _ = selective_scan(s["x"], s["dt"], s["A"], s["B"], s["C"], None, p.chunk_size)
        g = (y + s["x"].float() * p.D.float()) * torch.nn.functional.silu(s["z"].float())
        score = g.abs().reshape(-1, Ip).mean(0) * p.out_proj.weight.float().norm(dim=0)
        chans = _top(score, Ic)
        notes.append(f"channels {Ip} -> {Ic} by channel contribution")
    if Nc < Np:
        energy = torch.empty(Np, device=dev)
        xk, dtk, Ak = s["x"][..., chans], s["dt"][..., chans], s["A"][chans]
        for n in range(Np):
            yn, _ = selective_scan(xk, dtk, Ak[:, n:n + 1], s["B"][..., n:n + 1],
                                   s["C"][..., n:n + 1], None, p.chunk_size)
            energy[n] = yn.pow(2).sum(-1).mean()
        states = _top(energy, Nc)
        notes.append(f"state {Np} -> {Nc} by scan output energy per state dim")
    _copy(c.in_proj.weight, p.in_proj.weight[torch.cat([chans, Ip + chans])])
    if p.in_proj.bias is not None and c.in_proj.bias is not None:
        _copy(c.in_proj.bias, p.in_proj.bias[torch.cat([chans, Ip + chans])])
    _copy(c.conv1d.weight, p.conv1d.weight[chans])
    if p.conv1d.bias is not None and c.conv1d.bias is not None:
        _copy(c.conv1d.bias, p.conv1d.bias[chans])
    rows = torch.cat([torch.arange(R, device=dev), R + states, R + Np + states])
    _copy(c.x_proj.weight, p.x_proj.weight[rows][:, chans])
    _copy(c.dt_proj.weight, p.dt_proj.weight[chans])
    _copy(c.dt_proj.bias, p.dt_proj.bias[chans])
    _copy(c.A_log, p.A_log[chans][:, states])
    _copy(c.D, p.D[chans])
    _copy(c.dt_layernorm.weight, p.dt_layernorm.weight)
    _copy(c.b_layernorm.weight, p.b_layernorm.weight[states])
    _copy(c.c_layernorm.weight, p.c_layernorm.weight[states])
    _copy(c.out_proj.weight, p.out_proj.weight[:, chans])
    if p.out_proj.bias is not None and c.out_proj.bias is not None:
        _copy(c.out_proj.bias, p.out_proj.bias)
    return "; ".join(notes) or "copied (mamba1 flags changed)"
