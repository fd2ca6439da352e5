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
Mamba-1, fewer channels      channels ranked by their gated output's contribution into
or a smaller state           ``out_proj``; state dims by the energy of their share of the
                             scan output (:mod:`nas.build_inherit_mamba1`)
MLA, fewer query heads       heads ranked by channel contribution into ``o_proj``; kept
                             heads' q_b / kv_b rows and o_proj columns copied
MLA, smaller kv / q rank     SVD of the (norm-folded) up-projection: top-r directions, the
                             down-projection rotated onto them (:mod:`nas.build_inherit_mla`)
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
"""

from __future__ import annotations

from pathlib import Path

import torch

from hwprofiles.errors import InputError
from nas.arch import (
    FFN,
    MLA,
    Attention,
    BlockConfig,
    DeltaNet,
    Linear,
    Mamba,
    ModelArch,
    MoE,
    NoOp,
    Parallel,
)
from nas.build_checkpoint import CheckpointReader
from nas.build_inherit_mla import copy_expert_biases, copy_router_bias, inherit_mla
from nas.build_random import Materializer
from nas.modules.deltanet import DeltaNetMixer
from nas.modules.granite import scalars_of
from nas.modules.layers import AttentionMixer, FFNMixer, LinearMixer
from nas.modules.mamba import MambaMixer, ssd_chunked
from nas.modules.model import CausalLM
from nas.modules.moe import MoEMixer
from nas.modules.parallel import ParallelMixer
from nas.progress import Progress

MAX_TOKENS = 8192  # calibration tokens used for importance (a prefix of the batch)


def _top(scores: torch.Tensor, k: int) -> torch.Tensor:
    """Indices of the ``k`` largest scores, in increasing index order."""
    return torch.topk(scores.float(), k).indices.sort().values


def _flat(x: torch.Tensor) -> torch.Tensor:
    return x.reshape(-1, x.shape[-1])


def _lsq_scale(y: torch.Tensor, z: torch.Tensor) -> float:
    """The scalar ``s`` minimizing ``||y - s z||^2``."""
    den = float((z.double() * z.double()).sum())
    return float((y.double() * z.double()).sum()) / den if den > 0 else 0.0


def _copy(dst: torch.Tensor, src: torch.Tensor) -> None:
    dst.copy_(src.to(dst.dtype))


def _copy_all(dst: torch.nn.Module, src: torch.nn.Module) -> None:
    """Every tensor of ``src`` into ``dst``'s, in state-dict order (same config, so the same
    layout), cast to ``dst``'s dtype."""
    for (_, d), (_, s) in zip(dst.state_dict(keep_vars=True).items(),
                              src.state_dict(keep_vars=True).items()):
        _copy(d, s)


# ---- per-kind rules ---------------------------------------------------------------------
def _attention(p: AttentionMixer, c: AttentionMixer, pc: Attention, cc: Attention) -> str:
    if (pc.num_heads, pc.head_dim) != (cc.num_heads, cc.head_dim):
        return "random (query heads or head_dim differ)"
    nq, d = pc.num_heads, pc.head_dim
    _copy(c.q_proj.weight, p.q_proj.weight)
    _copy(c.o_proj.weight, p.o_proj.weight)
    if p.o_proj.bias is not None and c.o_proj.bias is not None:
        _copy(c.o_proj.bias, p.o_proj.bias)
    if p.q_proj.bias is not None and c.q_proj.bias is not None:
        _copy(c.q_proj.bias, p.q_proj.bias)
    if pc.qk_norm and cc.qk_norm:
        _copy(c.q_norm.weight, p.q_norm.weight)
        _copy(c.k_norm.weight, p.k_norm.weight)
    if pc.sinks and cc.sinks:  # gpt-oss: one sink logit per query head
        _copy(c.sinks, p.sinks)
    # pooling matrix: child kv head j = mean over its query heads q of parent kv head(q)
    kp, kc = pc.num_kv_heads, cc.num_kv_heads
    pool = torch.zeros(kc, kp, dtype=torch.float64)
    for q in range(nq):
        pool[q // (nq // kc), q // (nq // kp)] += 1.0
    pool = pool / pool.sum(1, keepdim=True)
    for name in ("k_proj", "v_proj"):
        pl, cl = getattr(p, name), getattr(c, name)
        w = pl.weight.double().view(kp, d, -1)
        pool = pool.to(w.device)
        _copy(cl.weight, torch.einsum("cp,pdh->cdh", pool, w).reshape(kc * d, -1))
        if pl.bias is not None and cl.bias is not None:
            _copy(cl.bias, (pool @ pl.bias.double().view(kp, d)).reshape(-1))
    if kp == kc:
        return "copied (attention flags changed)"
    return f"kv heads {kp} -> {kc} by mean pooling"


def _attention_to_linear(p: AttentionMixer, c: LinearMixer, pc: Attention,
                         xin: torch.Tensor) -> str:
    d = pc.head_dim
    wv = p.v_proj.weight.double().view(pc.num_kv_heads, d, -1)
    wv = wv.repeat_interleave(pc.num_heads // pc.num_kv_heads, dim=0).reshape(-1, wv.shape[-1])
    w = p.o_proj.weight.double() @ wv
    s = _lsq_scale(_flat(p(xin)), _flat(xin) @ w.t().to(xin.dtype))
    _copy(c.linear.weight, s * w)
    return f"linear from W_o @ W_v (scale {s:.3g})"


def _ffn_channels(p: FFNMixer, c: FFNMixer, keep: torch.Tensor) -> None:
    """Copy channels ``keep`` of ``p`` into the first channels of ``c``; zero the rest's
    output weights."""
    k = len(keep)
    mats = ["up_proj"] + (["gate_proj"] if p.cfg.gated else [])
    for name in mats:
        pl, cl = getattr(p, name), getattr(c, name)
        _copy(cl.weight[:k], pl.weight[keep])
        if pl.bias is not None and cl.bias is not None:
            _copy(cl.bias[:k], pl.bias[keep])
    _copy(c.down_proj.weight[:, :k], p.down_proj.weight[:, keep])
    c.down_proj.weight[:, k:] = 0
    if p.down_proj.bias is not None and c.down_proj.bias is not None:
        _copy(c.down_proj.bias, p.down_proj.bias)


def _ffn(p: FFNMixer, c: FFNMixer, pc: FFN, cc: FFN, xin: torch.Tensor) -> str:
    if (pc.gated, pc.activation) != (cc.gated, cc.activation):
        return "random (FFN gating or activation differs)"
    if cc.width >= pc.width:
        _ffn_channels(p, c, torch.arange(pc.width, device=xin.device))
        return "copied" if cc.width == pc.width else f"width {pc.width} -> {cc.width} (zero-grown)"
    acts = _flat(p.intermediate(xin))
    score = acts.abs().float().mean(0) * p.down_proj.weight.float().norm(dim=0)
    _ffn_channels(p, c, _top(score, cc.width))
    return f"width {pc.width} -> {cc.width} by channel contribution"


def _ffn_to_linear(p: FFNMixer, c: LinearMixer, xin: torch.Tensor) -> str:
    w = p.down_proj.weight.double() @ p.up_proj.weight.double()
    s = _lsq_scale(_flat(p(xin)), _flat(xin) @ w.t().to(xin.dtype))
    _copy(c.linear.weight, s * w)
    return f"linear from W_down @ W_up (scale {s:.3g})"


def _lstsq_linear(p: torch.nn.Module, c: LinearMixer, xin: torch.Tensor, kind: str) -> str:
    x = _flat(xin).double()
    y = _flat(p(xin)).double()
    h = x.shape[1]
    ridge = 1e-4 * float((x * x).sum()) / max(x.numel(), 1)
    gram = x.t() @ x + ridge * x.shape[0] * torch.eye(h, dtype=torch.float64, device=x.device)
    w = torch.linalg.solve(gram, x.t() @ y).t()
    _copy(c.linear.weight, w)
    return f"linear by least squares on the {kind} output"


def _moe(p: MoEMixer, c: MoEMixer, pc: MoE, cc: MoE, xin: torch.Tensor) -> str:
    if (pc.gated, pc.activation, pc.latent_size, pc.router) != \
            (cc.gated, cc.activation, cc.latent_size, cc.router):
        return "random (expert gating, activation, latent size or router differs)"
    x = _flat(xin)
    notes = []
    ep, ec = pc.num_experts, cc.num_experts
    if ec < ep:
        y = p(x)
        score = torch.empty(ep, device=x.device)
        for e in range(ep):
            mask = torch.zeros(ep, dtype=torch.bool, device=x.device)
            mask[e] = True
            score[e] = (y - p(x, expert_mask=mask)).float().pow(2).sum(-1).mean()
        keep = _top(score, ec)
        notes.append(f"experts {ep} -> {ec} by output change when masked")
    else:
        keep = torch.arange(ep, device=x.device)
        if ec > ep:
            notes.append(f"experts {ep} -> {ec} (new experts random)")
    n = len(keep)
    _copy(c.gate.weight[:n], p.gate.weight[keep])
    if pc.router_bias and cc.router_bias:
        _copy(c.gate.e_score_correction_bias[:n], p.gate.e_score_correction_bias[keep])
    if pc.router_linear_bias and cc.router_linear_bias:
        copy_router_bias(p, c, keep)
    if pc.latent_size:
        _copy(c.fc1_latent_proj.weight, p.fc1_latent_proj.weight)
        _copy(c.fc2_latent_proj.weight, p.fc2_latent_proj.weight)
    wp, wc = pc.expert_width, cc.expert_width
    if wc < wp:
        xe = p.fc1_latent_proj(x) if pc.latent_size else x
        idx, _ = p.route(x)
    for j, e in enumerate(keep.tolist()):
        if wc < wp:
            tok = (idx == e).any(-1).nonzero()[:, 0]
            dnorm = p.experts_down[e].float().norm(dim=0)
            if len(tok):
                score = p.expert_intermediate(e, xe[tok]).abs().float().mean(0) * dnorm
            else:  # never routed on the calibration data: weight norms only
                score = p.experts_up[e].float().norm(dim=1) * dnorm
            ch = _top(score, wc)
        else:
            ch = torch.arange(wp, device=x.device)
        k = len(ch)
        names = ["experts_up"] + (["experts_gate"] if pc.gated else [])
        for name in names:
            _copy(getattr(c, name)[j, :k], getattr(p, name)[e, ch])
        _copy(c.experts_down[j, :, :k], p.experts_down[e][:, ch])
        c.experts_down[j, :, k:] = 0
        if pc.expert_bias and cc.expert_bias:
            copy_expert_biases(p, c, j, e, ch)
    if wc != wp:
        how = "channel contribution" if wc < wp else "zero-grown"
        notes.append(f"expert width {wp} -> {wc} by {how}")
    if pc.shared_width and cc.shared_width:
        notes.append("shared " + _ffn(p.shared_experts, c.shared_experts,
                                      p.shared_experts.cfg, c.shared_experts.cfg, x))
        if pc.shared_gate and cc.shared_gate:
            _copy(c.shared_expert_gate.weight, p.shared_expert_gate.weight)
    elif cc.shared_width:
        notes.append("shared expert random (parent has none)")
    if pc.top_k != cc.top_k:
        notes.append(f"top-k {pc.top_k} -> {cc.top_k} (weights kept)")
    return "; ".join(notes) or "copied (routing flags changed)"


def _mamba(p: MambaMixer, c: MambaMixer, pc: Mamba, cc: Mamba, xin: torch.Tensor) -> str:
    if (pc.head_dim, pc.n_groups, pc.conv_kernel) != (cc.head_dim, cc.n_groups, cc.conv_kernel):
        return "random (head_dim, n_groups or conv kernel differs)"
    if cc.num_heads > pc.num_heads or cc.state_size > pc.state_size:
        return "random (more heads or a larger state than the parent)"
    G, P = pc.n_groups, pc.head_dim
    Hp, Hc, Np, Nc = pc.num_heads, cc.num_heads, pc.state_size, cc.state_size
    hpg, hcg = Hp // G, Hc // G
    notes = []
    dev = xin.device
    heads = torch.arange(Hp, device=dev)
    states = [torch.arange(Np, device=dev) for _ in range(G)]
    if Hc < Hp or Nc < Np:
        s = p.ssm_inputs(xin)
    if Hc < Hp:
        y, _ = ssd_chunked(s["x"], s["dt"], s["A"], s["B"], s["C"], p.chunk_size)
        y = (y + s["x"].float() * p.D.float()[:, None]).reshape(*xin.shape[:-1], -1)
        g = _flat(p.gated_norm(y.to(xin.dtype), s["z"]))
        ch = g.abs().float().mean(0) * p.out_proj.weight.float().norm(dim=0)
        hs = ch.view(Hp, P).sum(-1).view(G, hpg)
        heads = torch.cat([gi * hpg + _top(hs[gi], hcg) for gi in range(G)])
        notes.append(f"heads {Hp} -> {Hc} by channel contribution")
    if Nc < Np:
        energy = torch.empty(Hp, Np, device=dev)
        for n in range(Np):
            yn, _ = ssd_chunked(s["x"], s["dt"], s["A"], s["B"][..., n:n + 1],
                                s["C"][..., n:n + 1], p.chunk_size)
            energy[:, n] = yn.pow(2).sum(-1).mean(dim=(0, 1))
        kept = torch.zeros(Hp, dtype=torch.bool, device=dev)
        kept[heads] = True
        per_group = (energy * kept[:, None]).view(G, hpg, Np).sum(1)
        states = [_top(per_group[gi], Nc) for gi in range(G)]
        notes.append(f"state {Np} -> {Nc} by SSM output energy per state channel")
    inner_p = Hp * P
    iidx = (heads[:, None] * P + torch.arange(P, device=dev)).reshape(-1)
    bidx = torch.cat([gi * Np + states[gi] for gi in range(G)])
    conv_idx = torch.cat([iidx, inner_p + bidx, inner_p + G * Np + bidx])
    rows = torch.cat([iidx, inner_p + conv_idx, 2 * inner_p + 2 * G * Np + heads])
    _copy(c.in_proj.weight, p.in_proj.weight[rows])
    if p.in_proj.bias is not None and c.in_proj.bias is not None:
        _copy(c.in_proj.bias, p.in_proj.bias[rows])
    _copy(c.conv1d.weight, p.conv1d.weight[conv_idx])
    if p.conv1d.bias is not None and c.conv1d.bias is not None:
        _copy(c.conv1d.bias, p.conv1d.bias[conv_idx])
    for name in ("dt_bias", "A_log", "D"):
        _copy(getattr(c, name), getattr(p, name)[heads])
    if hasattr(p, "norm") and hasattr(c, "norm"):  # (Falcon-H1's may have no norm weight)
        _copy(c.norm.weight, p.norm.weight[iidx])
    _copy(c.out_proj.weight, p.out_proj.weight[:, iidx])
    if p.out_proj.bias is not None and c.out_proj.bias is not None:
        _copy(c.out_proj.bias, p.out_proj.bias)
    return "; ".join(notes) or "copied (mamba flags changed)"


def _deltanet(p: DeltaNetMixer, c: DeltaNetMixer, pc: DeltaNet, cc: DeltaNet,
              xin: torch.Tensor) -> str:
    if (pc.head_k_dim, pc.head_v_dim, pc.conv_kernel) != \
            (cc.head_k_dim, cc.head_v_dim, cc.conv_kernel):
        return "random (head sizes or conv kernel differ)"
    kp, vp, kc, vc = pc.num_k_heads, pc.num_v_heads, cc.num_k_heads, cc.num_v_heads
    rp, rc = vp // kp, vc // kc
    if kc > kp or vc > vp or rc > rp:
        return "random (more heads, or more value heads per key head, than the parent)"
    dk, dv = pc.head_k_dim, pc.head_v_dim
    dev = xin.device
    y = p.gated_output(xin)  # b n vp dv
    w_out = p.out_proj.weight.float().view(-1, vp, dv)
    score = (y.abs().float().mean(dim=(0, 1)) * w_out.norm(dim=0)).sum(-1)  # vp
    groups = _top(score.view(kp, rp).sum(-1), kc)
    local = [_top(score.view(kp, rp)[g], rc) for g in groups.tolist()]
    ar_k, ar_v = torch.arange(dk, device=dev), torch.arange(dv, device=dev)
    stride = 2 * dk + 2 * rp * dv
    rows, ba_b, ba_a, vheads = [], [], [], []
    for g, loc in zip(groups.tolist(), local):
        base = g * stride
        vch = (loc[:, None] * dv + ar_v).reshape(-1).to(dev)
        rows += [base + ar_k, base + dk + ar_k, base + 2 * dk + vch,
                 base + 2 * dk + rp * dv + vch]
        ba_b.append(g * 2 * rp + loc.to(dev))
        ba_a.append(g * 2 * rp + rp + loc.to(dev))
        vheads.append(g * rp + loc.to(dev))
    heads = torch.cat(vheads)
    kch = (groups.to(dev)[:, None] * dk + ar_k).reshape(-1)
    vch_all = (heads[:, None] * dv + ar_v).reshape(-1)
    conv_idx = torch.cat([kch, kp * dk + kch, 2 * kp * dk + vch_all])
    if p.split != c.split:
        return "random (projection layouts differ)"
    if p.split:  # Qwen3.5: [q | k | v] rows as in the conv, z per value channel, b / a per head
        _copy(c.in_proj_qkv.weight, p.in_proj_qkv.weight[conv_idx])
        _copy(c.in_proj_z.weight, p.in_proj_z.weight[vch_all])
        _copy(c.in_proj_b.weight, p.in_proj_b.weight[heads])
        _copy(c.in_proj_a.weight, p.in_proj_a.weight[heads])
    else:  # Qwen3-Next: in_proj rows grouped per key head, [q | k | v | z] and [b | a]
        _copy(c.in_proj_qkvz.weight, p.in_proj_qkvz.weight[torch.cat(rows)])
        _copy(c.in_proj_ba.weight, p.in_proj_ba.weight[torch.cat(
            [torch.cat([b, a]) for b, a in zip(ba_b, ba_a)])])
    _copy(c.conv1d.weight, p.conv1d.weight[conv_idx])
    for name in ("dt_bias", "A_log"):
        _copy(getattr(c, name), getattr(p, name)[heads])
    _copy(c.norm.weight, p.norm.weight)
    _copy(c.out_proj.weight, p.out_proj.weight[:, vch_all])
    notes = []
    if kc < kp:
        notes.append(f"key heads {kp} -> {kc} by summed value-head contribution")
    if vc < vp:
        notes.append(f"value heads {vp} -> {vc} by channel contribution")
    return "; ".join(notes) or "copied"


def _swap_scale(pb: torch.nn.Module, cb: torch.nn.Module, x: torch.Tensor) -> float:
    """Scale the copied block's output projection by the least-squares scalar ``s`` that best
    maps its output onto the replaced parent block's on the calibration activations ``x``
    (so the swapped block is never worse than a no-op there: ``s = 0`` is one choice)."""
    y = pb.mixer(pb.norm(x))
    yc = cb.mixer(cb.norm(x))
    s = _lsq_scale(_flat(y), _flat(yc))
    out = cb.mixer.o_proj if hasattr(cb.mixer, "o_proj") else cb.mixer.out_proj
    out.weight.mul_(s)
    if out.bias is not None:
        out.bias.mul_(s)
    return s


def _parallel(p: ParallelMixer, c: ParallelMixer, pc: Parallel, cc: Parallel,
              xin: torch.Tensor) -> str:
    """Falcon-H1's parallel block: each branch the child keeps by its own rule (attention:
    :func:`_attention`, Mamba: :func:`_mamba`, on the block's normed input); a dropped
    branch is gone, the kept one inherits the parent's weights."""
    if (pc.mamba_rms_norm, pc.mamba_norm_before_gate) != \
            (cc.mamba_rms_norm, cc.mamba_norm_before_gate) and cc.mamba is not None:
        return "random (Mamba norm variant differs)"
    notes = []
    for name, rule in (("attention", _attention), ("mamba", _mamba)):
        pb, cb = getattr(pc, name), getattr(cc, name)
        pm, cm = (p.self_attn, c.self_attn) if name == "attention" else (p.mamba, c.mamba)
        if cb is None:
            if pb is not None:
                notes.append(f"{name} dropped")
        elif pb is None:
            notes.append(f"{name} random (the parent has no {name} branch)")
        elif pb == cb:
            _copy_all(cm, pm)  # type: ignore[arg-type]
            notes.append(f"{name} copied")
        else:
            args = (pm, cm, pb, cb) if name == "attention" else (pm, cm, pb, cb, xin)
            notes.append(f"{name}: " + rule(*args))  # type: ignore[operator]
    return "; ".join(notes)


def swap_init(cb: torch.nn.Module, pb: torch.nn.Module, src: torch.nn.Module, j: int,
              x: torch.Tensor) -> str:
    """Child block ``cb`` (attention <-> DeltaNet swapped in for parent block ``pb``) as a copy
    of parent block ``src`` (block ``j``, :func:`swap_source`), its output projection scaled
    by :func:`_swap_scale` on the residual stream ``x`` entering ``pb``; what was done."""
    _copy_all(cb, src)
    return f"swap: copied from parent block {j} (output scale {_swap_scale(pb, cb, x):.3g})"


def swap_source(parent: ModelArch, i: int, cc: BlockConfig) -> int | None:
    """For an attention <-> DeltaNet swap at block ``i``: the nearest parent block whose
    config equals the child's (ties to the earlier one), or None."""
    same = [j for j, b in enumerate(parent.blocks) if b == cc]
    return min(same, key=lambda j: (abs(j - i), j)) if same else None


def inherit_block(pc: BlockConfig, p: torch.nn.Module | None, cc: BlockConfig, c: torch.nn.Module | None,
                  xin: torch.Tensor) -> str:
    """Initialize child mixer ``c`` (config ``cc``) from parent mixer ``p`` (config ``pc``)
    given the parent mixer's input ``xin``; returns what was done."""
    if isinstance(cc, NoOp):
        return "dropped (no-op)"
    if p is None or c is None:
        return "random (parent block is a no-op)"
    if isinstance(cc, Linear):
        if isinstance(pc, Attention):
            return _attention_to_linear(p, c, pc, xin)  # type: ignore[arg-type]
        if isinstance(pc, FFN):
            return _ffn_to_linear(p, c, xin)  # type: ignore[arg-type]
        return _lstsq_linear(p, c, xin, pc.kind)  # type: ignore[arg-type, attr-defined]
    if type(pc) is not type(cc):
        return f"random (no rule for {pc.kind} -> {cc.kind})"  # type: ignore[attr-defined]
    if isinstance(cc, Attention):
        return _attention(p, c, pc, cc)  # type: ignore[arg-type]
    if isinstance(cc, FFN):
        return _ffn(p, c, pc, cc, xin)  # type: ignore[arg-type]
    if isinstance(cc, MoE):
        return _moe(p, c, pc, cc, xin)  # type: ignore[arg-type]
    if isinstance(cc, Mamba):
        return _mamba(p, c, pc, cc, xin)  # type: ignore[arg-type]
    if isinstance(cc, DeltaNet):
        return _deltanet(p, c, pc, cc, xin)  # type: ignore[arg-type]
    if cc.kind == "mamba1":  # type: ignore[attr-defined]
        from nas.build_inherit_mamba1 import inherit_mamba1

        return inherit_mamba1(p, c, pc, cc, xin)  # type: ignore[arg-type]
    if isinstance(cc, MLA):
        return inherit_mla(p, c, pc, cc, xin)  # type: ignore[arg-type]
    if isinstance(cc, Parallel):
        return _parallel(p, c, pc, cc, xin)  # type: ignore[arg-type]
    return f"random (no rule for {cc.kind})"  # type: ignore[attr-defined]


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
def init_from_parent(child_arch: ModelArch, parent_model: CausalLM | str | Path,
                     calibration_tokens: torch.Tensor | list, seed: int = 0,
                     dtype: torch.dtype | None = None, progress: bool | None = None
                     ) -> CausalLM:
    """A :class:`CausalLM` of ``child_arch`` initialized from the parent (see the module
    docstring for the rule per block); ``calibration_tokens`` are token ids
    ``(batch, length)`` or ``(length,)``. Blocks without a rule keep a random init
    (seeded by ``seed``: the same values :func:`nas.build.build_model` draws);
    ``child.init_report`` says what happened to each block.

    ``parent_model`` is a model in memory, or a checkpoint folder (ours or one transformers
    wrote; sharded, bf16 / fp16 / fp32): then the parent is streamed from its safetensors
    one block at a time in float32, and the child is built on the meta device and
    materialized block by block, so the peak memory is about the child in ``dtype`` plus one
    parent and one child block in float32 (:func:`nas.build.estimate_build_memory`).
    ``dtype`` is the child's (default: the parent's as stored); with a parent in memory the
    rules compute in the parent's dtype.
    """
    reader = None
    if isinstance(parent_model, CausalLM):
        pa = parent_model.arch
        compute = parent_model.embed.weight.dtype
        device = parent_model.embed.weight.device
        target = dtype or compute
    else:
        reader = CheckpointReader(parent_model)
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
        if reader is None:
            return parent_model.get_submodule(name)  # type: ignore[union-attr]
        if getattr(reader.model, name.split(".")[0], None) is None:
            return None
        return reader.materialize(name, compute)

    def done(name: str) -> None:
        if reader is not None:
            reader.release(name)

    with torch.device("meta"):
        child = CausalLM(child_arch)
    was_training = parent_model.training if reader is None else False  # type: ignore[union-attr]
    if reader is None:
        parent_model.eval()  # type: ignore[union-attr]
    report = []
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        mat = Materializer(child, target)
        mat.nonblock()
        for m in (child.embed, child.lm_head, child.norm):
            if m is not None:
                m.to(device)
        emb = part("embed")
        _copy(child.embed.weight, emb.weight)  # type: ignore[union-attr]
        x = emb(tokens).to(compute)  # type: ignore[misc]
        if scalars_of(pa).embedding != 1.0:  # Granite's embedding_multiplier
            x = x * scalars_of(pa).embedding
        if child.lm_head is not None:
            head = part("lm_head") if pa.tie_embeddings is False else emb
            _copy(child.lm_head.weight, head.weight)  # type: ignore[union-attr]
            if head is not emb:
                done("lm_head")
        done("embed")
        if child.norm is not None and pa.final_norm:
            _copy(child.norm.weight, part("norm").weight)  # type: ignore[union-attr]
            done("norm")
        with Progress(pa.num_blocks, "init", progress) as bar:
            for i in range(pa.num_blocks):
                pb = part(f"blocks.{i}")
                cb = mat.block(i, dtype=compute).to(device)
                pc, cc = pa.blocks[i], child_arch.blocks[i]
                if pc == cc:
                    _copy_all(cb, pb)
                    what = "copied"
                elif {pc.kind, cc.kind} == {"attention", "deltanet"}:  # type: ignore[attr-defined]
                    j = swap_source(pa, i, cc)
                    if j is None:
                        what = f"random (no parent {cc.kind} block of this config)"  # type: ignore[attr-defined]
                    else:
                        what = swap_init(cb, pb, part(f"blocks.{j}"), j, x)
                        if j != i:
                            done(f"blocks.{j}")
                elif cb.mixer is None or pb.mixer is None:
                    what = inherit_block(pc, pb.mixer, cc, cb.mixer, x)
                else:
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
    child.init_report = report  # type: ignore[assignment]
    if reader is None:
        parent_model.train(was_training)  # type: ignore[union-attr]
    return child
