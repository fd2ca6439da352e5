"""Torch modules: exactness of the SSD scan, caches, attention masks and MoE dispatch."""

from __future__ import annotations

import json
import math

import pytest

torch = pytest.importorskip("torch")

from nas.arch import FFN, Attention, Linear, Mamba, ModelArch, MoE, NoOp  # noqa: E402
from nas.modules import (  # noqa: E402
    AttentionMixer,
    CausalLM,
    MambaMixer,
    MoEMixer,
    ssd_chunked,
    ssd_step,
)

pytestmark = pytest.mark.torch
torch.set_num_threads(1)  # see tests/test_build.py: 2 threads oversubscribe a shared CI box


def _init(m):
    torch.manual_seed(0)
    m.reset_parameters()
    return m


# ---- Mamba-2 ----------------------------------------------------------------------------
@pytest.mark.parametrize("length,chunk", [(1, 4), (7, 4), (16, 4), (19, 8), (12, 64)])
def test_ssd_chunked_equals_step_recurrence(length, chunk):
    g = torch.Generator().manual_seed(length * 100 + chunk)
    b, H, P, N = 2, 3, 4, 5
    x = torch.randn(b, length, H, P, generator=g)
    dt = torch.rand(b, length, H, generator=g) * 0.5
    A = -torch.rand(H, generator=g) * 2 - 0.1
    B = torch.randn(b, length, H, N, generator=g)
    C = torch.randn(b, length, H, N, generator=g)
    s0 = torch.randn(b, H, P, N, generator=g)
    y, final = ssd_chunked(x, dt, A, B, C, chunk=chunk, state=s0)
    state, ys = s0, []
    for t in range(length):
        yt, state = ssd_step(x[:, t], dt[:, t], A, B[:, t], C[:, t], state)
        ys.append(yt)
    torch.testing.assert_close(y, torch.stack(ys, 1), rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(final, state, rtol=1e-4, atol=1e-5)


def test_ssd_groups_equal_expanded_heads_and_gradients_equal_the_recurrence():
    """B, C per group give what the same B, C repeated to every head give; the autograd path
    of the chunked scan has the gradients of the step-by-step recurrence."""
    g = torch.Generator().manual_seed(11)
    b, n, H, G, P, N = 2, 13, 6, 2, 3, 4
    x = torch.randn(b, n, H, P, generator=g, requires_grad=True)
    dt = (torch.rand(b, n, H, generator=g) * 0.5).requires_grad_(True)
    A = (-torch.rand(H, generator=g) * 2 - 0.1).requires_grad_(True)
    B = torch.randn(b, n, G, N, generator=g, requires_grad=True)
    C = torch.randn(b, n, G, N, generator=g, requires_grad=True)
    s0 = torch.randn(b, H, P, N, generator=g)
    y, fin = ssd_chunked(x, dt, A, B, C, chunk=4, state=s0)
    with torch.no_grad():
        ye, fe = ssd_chunked(x, dt, A, B.repeat_interleave(3, 2), C.repeat_interleave(3, 2),
                             chunk=4, state=s0)
    torch.testing.assert_close(y, ye, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(fin, fe, rtol=1e-5, atol=1e-6)
    gy, gf = torch.randn(y.shape, generator=g), torch.randn(fin.shape, generator=g)
    got = torch.autograd.grad((y * gy).sum() + (fin * gf).sum(), (x, dt, A, B, C))
    state, ys = s0, []
    for t in range(n):
        yt, state = ssd_step(x[:, t], dt[:, t], A, B[:, t], C[:, t], state)
        ys.append(yt)
    want = torch.autograd.grad((torch.stack(ys, 1) * gy).sum() + (state * gf).sum(),
                               (x, dt, A, B, C))
    for a, w in zip(got, want):
        torch.testing.assert_close(a, w, rtol=1e-4, atol=1e-4)


def test_ssd_low_precision_matmuls_stay_close():
    """compute_dtype=bfloat16 (what accelerators use) keeps float32 decays and states."""
    g = torch.Generator().manual_seed(12)
    x = torch.randn(1, 40, 4, 8, generator=g)
    dt = torch.rand(1, 40, 4, generator=g) * 0.2
    A = -torch.rand(4, generator=g) - 0.5
    B, C = torch.randn(1, 40, 2, 8, generator=g), torch.randn(1, 40, 2, 8, generator=g)
    y, f = ssd_chunked(x, dt, A, B, C, chunk=16)
    yb, fb = ssd_chunked(x, dt, A, B, C, chunk=16, compute_dtype=torch.bfloat16)
    assert yb.dtype == fb.dtype == torch.float32
    scale = y.abs().max()
    assert (yb - y).abs().max() < 0.03 * scale and (fb - f).abs().max() < 0.03 * f.abs().max()


def test_ssd_decay_is_real():
    """A strongly decaying state forgets: a pulse at t=0 has (almost) no effect later."""
    x = torch.zeros(1, 10, 1, 1)
    x[0, 0] = 1.0
    dt = torch.ones(1, 10, 1)
    B = torch.ones(1, 10, 1, 1)
    y, _ = ssd_chunked(x, dt, torch.tensor([-5.0]), B, B, chunk=4)
    assert y[0, 0].item() == pytest.approx(1.0)
    assert y[0, 1].item() == pytest.approx(math.exp(-5), rel=1e-4)
    assert y[0, 9].abs().item() < 1e-15


def _mamba(**kw):
    cfg = Mamba(num_heads=4, head_dim=4, state_size=6, n_groups=2, conv_kernel=4, **kw)
    m = _init(MambaMixer(cfg, 16))
    m.chunk_size = 4
    return m


@pytest.mark.parametrize("kw", [{}, {"conv_bias": False, "proj_bias": True}])
def test_mamba_incremental_equals_full(kw):
    m = _mamba(**kw)
    x = torch.randn(2, 11, 16, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        full = m(x)
        cache: dict = {}
        parts = [m(x[:, :5], cache)]  # prefill, then one token at a time (step path)
        parts += [m(x[:, t:t + 1], cache) for t in range(5, 9)]
        parts.append(m(x[:, 9:], cache))  # a multi-token chunk continuing from a state
    torch.testing.assert_close(torch.cat(parts, 1), full, rtol=1e-4, atol=1e-5)
    assert cache["conv"].shape == (2, m.conv_dim, 3)
    assert cache["ssm"].shape == (2, 4, 4, 6)


def test_mamba_autograd_path_equals_inference_path():
    """The in-place (no autograd) conv / norm / skip path and the autograd path agree."""
    m = _mamba(proj_bias=True)
    x = torch.randn(2, 11, 16, generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        ref = m(x)
    out = m(x.clone().requires_grad_(True))
    assert out.requires_grad
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-6)


def test_mamba_is_causal():
    m = _mamba()
    x = torch.randn(1, 9, 16)
    x2 = x.clone()
    x2[:, 6:] += 1.0
    with torch.no_grad():
        a, b = m(x), m(x2)
    torch.testing.assert_close(a[:, :6], b[:, :6])
    assert not torch.allclose(a[:, 6:], b[:, 6:])


# ---- attention --------------------------------------------------------------------------
def _naive_attention(m: AttentionMixer, x: torch.Tensor) -> torch.Tensor:
    """Loop-over-positions reference (explicit GQA mapping, window and RoPE)."""
    cfg = m.cfg
    b, n, _ = x.shape
    d = cfg.head_dim
    q = m.q_proj(x).view(b, n, cfg.num_heads, d)
    k = m.k_proj(x).view(b, n, cfg.num_kv_heads, d)
    v = m.v_proj(x).view(b, n, cfg.num_kv_heads, d)
    if cfg.qk_norm:
        q, k = m.q_norm(q), m.k_norm(k)
    if cfg.rope:
        inv = 1.0 / (m.rope_theta ** (torch.arange(0, d, 2).float() / d))
        def rot(t, pos):
            out = t.clone()
            for i in range(d // 2):
                c, s = math.cos(pos * inv[i]), math.sin(pos * inv[i])
                a1, a2 = t[..., i], t[..., i + d // 2]
                out[..., i], out[..., i + d // 2] = a1 * c - a2 * s, a2 * c + a1 * s
            return out
        q = torch.stack([rot(q[:, t], t) for t in range(n)], 1)
        k = torch.stack([rot(k[:, t], t) for t in range(n)], 1)
    out = torch.zeros(b, n, cfg.num_heads, d)
    group = cfg.num_heads // cfg.num_kv_heads
    for t in range(n):
        lo = 0 if cfg.sliding_window is None else max(0, t - cfg.sliding_window + 1)
        for hq in range(cfg.num_heads):
            hk = hq // group
            s = (k[:, lo:t + 1, hk] @ q[:, t, hq, :, None])[..., 0] / math.sqrt(d)
            out[:, t, hq] = (s.softmax(-1)[..., None] * v[:, lo:t + 1, hk]).sum(1)
    return m.o_proj(out.reshape(b, n, -1))


ATTS = [
    Attention(num_heads=4, num_kv_heads=2, head_dim=8),
    Attention(num_heads=4, num_kv_heads=1, head_dim=8, sliding_window=3, qk_norm=True,
              qkv_bias=True, o_bias=True),
    Attention(num_heads=2, num_kv_heads=2, head_dim=6, rope=False),
    Attention(num_heads=6, num_kv_heads=3, head_dim=4, sliding_window=1),
]


@pytest.mark.parametrize("cfg", ATTS, ids=lambda c: c.describe())
def test_attention_matches_naive_reference(cfg):
    m = _init(AttentionMixer(cfg, 16, rope_theta=100.0))
    with torch.no_grad():
        m.o_proj.weight.normal_()  # larger weights so that mistakes show
        x = torch.randn(2, 9, 16, generator=torch.Generator().manual_seed(3))
        torch.testing.assert_close(m(x), _naive_attention(m, x), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("cfg", ATTS, ids=lambda c: c.describe())
def test_attention_incremental_equals_full(cfg):
    m = _init(AttentionMixer(cfg, 16))
    x = torch.randn(2, 10, 16)
    with torch.no_grad():
        full = m(x)
        cache: dict = {}
        parts = [m(x[:, :4], cache, 0)] + [m(x[:, t:t + 1], cache, t) for t in range(4, 7)]
        parts.append(m(x[:, 7:], cache, 7))
    torch.testing.assert_close(torch.cat(parts, 1), full, rtol=1e-4, atol=1e-5)
    held = 10 if cfg.sliding_window is None else cfg.sliding_window
    assert cache["k"].shape == (2, cfg.num_kv_heads, held, cfg.head_dim)
    if cfg.sliding_window:  # a ring of exactly the window
        assert cache["k_buf"].shape[2] == cfg.sliding_window
    assert cache["len"] == 10


@pytest.mark.parametrize("cfg", ATTS[:2], ids=lambda c: c.describe())
def test_attention_decode_writes_in_place_and_cache_stays_bounded(cfg):
    """Decode steps write one slot of a preallocated buffer (no reallocation within the
    capacity) and a sliding window's cache never grows past the window."""
    m = _init(AttentionMixer(cfg, 16))
    x = torch.randn(1, 40, 16, generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        full = m(x)
        cache: dict = {"capacity": 64}
        parts = [m(x[:, :5], cache, 0)]
        buf = cache["k_buf"]
        parts += [m(x[:, t:t + 1], cache, t) for t in range(5, 40)]
    torch.testing.assert_close(torch.cat(parts, 1), full, rtol=1e-4, atol=1e-5)
    assert cache["k_buf"] is buf  # the same storage all along
    assert buf.shape[2] == (64 if cfg.sliding_window is None else cfg.sliding_window)


# ---- MoE --------------------------------------------------------------------------------
MOES = [
    MoE(num_experts=5, top_k=5, expert_width=8),
    MoE(num_experts=4, top_k=4, expert_width=8, gated=False, activation="relu2",
        router="sigmoid", router_bias=True, routed_scaling=2.5, shared_width=12, latent_size=6),
    MoE(num_experts=3, top_k=3, expert_width=8, norm_topk=False, shared_width=8,
        shared_gate=True),
]


def _dense_moe(m: MoEMixer, x: torch.Tensor) -> torch.Tensor:
    """Every expert on every token, weighted by the (renormalized, scaled) router scores."""
    cfg = m.cfg
    logits = m.gate(x)
    p = logits.softmax(-1) if cfg.router == "softmax" else logits.sigmoid()
    if cfg.norm_topk:
        p = p / p.sum(-1, keepdim=True)
    p = p * cfg.routed_scaling
    xin = m.fc1_latent_proj(x) if cfg.latent_size else x
    out = sum(p[:, e:e + 1] * m.expert(e, xin) for e in range(cfg.num_experts))
    if cfg.latent_size:
        out = m.fc2_latent_proj(out)
    if cfg.shared_width:
        s = m.shared_experts(x)
        out = out + (torch.sigmoid(m.shared_expert_gate(x)) * s if cfg.shared_gate else s)
    return out


@pytest.mark.parametrize("cfg", MOES, ids=lambda c: c.describe())
def test_moe_all_experts_equals_dense_weighted_sum(cfg):
    m = _init(MoEMixer(cfg, 12))
    if cfg.router_bias:
        with torch.no_grad():
            m.gate.e_score_correction_bias.normal_()  # selection only: must not matter here
    x = torch.randn(3, 7, 12)
    with torch.no_grad():
        torch.testing.assert_close(m(x), _dense_moe(m, x.reshape(-1, 12)).view(3, 7, 12),
                                   rtol=1e-4, atol=1e-6)


def test_moe_topk_dispatch_matches_per_token_reference():
    cfg = MoE(num_experts=6, top_k=2, expert_width=8, router="sigmoid", router_bias=True,
              routed_scaling=1.5)
    m = _init(MoEMixer(cfg, 10))
    with torch.no_grad():
        m.gate.e_score_correction_bias.copy_(torch.tensor([0, 0, 5.0, 0, 0, -5.0]))
        x = torch.randn(20, 10)
        out = m(x)
        scores = m.gate(x).sigmoid()
        ref = torch.zeros_like(out)
        for t in range(20):
            sel = (scores[t] + m.gate.e_score_correction_bias).topk(2).indices
            w = scores[t, sel] / scores[t, sel].sum() * 1.5
            for e, we in zip(sel.tolist(), w):
                ref[t] += we * m.expert(e, x[t:t + 1])[0]
            assert 2 in sel.tolist() and 5 not in sel.tolist()  # the bias steers selection
    torch.testing.assert_close(out, ref, rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_grouped_mm_and_padded_fallback_equal_a_loop_with_gradients(dtype):
    """Both grouped paths (torch._grouped_mm where it runs, else padded bmm) against a
    per-group loop, empty groups included, forward and both gradients."""
    from nas.modules.moe import _padded_bmm, grouped_mm

    g = torch.Generator().manual_seed(7)
    counts = torch.tensor([3, 0, 5, 1, 0, 7])
    x = torch.randn(16, 8, generator=g).to(dtype).requires_grad_(True)
    w = torch.randn(6, 4, 8, generator=g).to(dtype).requires_grad_(True)  # (E, out, in)
    wt = w.transpose(1, 2)  # the strided (E, in, out) view MoEMixer passes
    starts = [0] + torch.cumsum(counts, 0).tolist()
    ref = torch.cat([x[starts[e]:starts[e + 1]] @ wt[e] for e in range(6)])
    go = torch.randn(ref.shape, generator=g).to(dtype)
    rx, rw = torch.autograd.grad(ref, (x, w), go)
    tol = {"rtol": 2e-2, "atol": 2e-2} if dtype == torch.bfloat16 else {}
    for f in (grouped_mm, _padded_bmm):
        y = f(x, wt, counts)
        gx, gw = torch.autograd.grad(y, (x, w), go)
        torch.testing.assert_close(y, ref, **tol)
        torch.testing.assert_close(gx, rx, **tol)
        torch.testing.assert_close(gw, rw, **tol)
        assert gw[1].abs().max() == 0 and gw[4].abs().max() == 0  # unused experts


def test_moe_training_gradients_equal_per_expert_loop():
    """Backward through the grouped dispatch = backward through a per-expert loop."""
    cfg = MoE(num_experts=6, top_k=2, expert_width=8, shared_width=8)
    m = _init(MoEMixer(cfg, 10))
    x = torch.randn(2, 15, 10, generator=torch.Generator().manual_seed(8))
    go = torch.randn(2, 15, 10, generator=torch.Generator().manual_seed(9))

    def loop(xf):
        idx, w = m.route(xf)
        out = torch.zeros_like(xf)
        for t in range(xf.shape[0]):
            for j in range(cfg.top_k):
                out[t] = out[t] + w[t, j] * m.expert(int(idx[t, j]), xf[t:t + 1])[0]
        return out + m.shared_experts(xf)

    params = [p for p in m.parameters() if p.requires_grad]
    got = torch.autograd.grad(m(x), params, go)
    want = torch.autograd.grad(loop(x.reshape(-1, 10)).view(2, 15, 10), params, go)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)


def test_moe_masked_expert_is_never_used():
    m = _init(MoEMixer(MoE(num_experts=4, top_k=2, expert_width=8), 8))
    x = torch.randn(50, 8)
    mask = torch.tensor([False, True, False, False])
    idx, _ = m.route(x, mask)
    assert (idx == 1).sum() == 0
    assert (m.route(x)[0] == 1).any()


# ---- whole models -----------------------------------------------------------------------
def _hybrid(tie=False) -> CausalLM:
    arch = ModelArch(
        hidden_size=16, vocab_size=40, tie_embeddings=tie, blocks=(
            Mamba(num_heads=4, head_dim=4, state_size=4, n_groups=2),
            MoE(num_experts=4, top_k=2, expert_width=8, gated=False, activation="relu2",
                router="sigmoid", router_bias=True, shared_width=8, latent_size=8),
            Attention(num_heads=4, num_kv_heads=2, head_dim=4, rope=False),
            FFN(width=24), Linear(), NoOp(),
            Attention(num_heads=2, num_kv_heads=1, head_dim=8, sliding_window=4),
            Mamba(num_heads=2, head_dim=8, state_size=8, n_groups=1, conv_kernel=2),
        ))
    model = _init(CausalLM(arch))
    for blk in model.blocks:
        if isinstance(blk.mixer, MambaMixer):
            blk.mixer.chunk_size = 4
    return model


@pytest.mark.parametrize("tie", [False, True])
def test_hybrid_incremental_decode_equals_full_forward(tie):
    model = _hybrid(tie)
    tokens = torch.randint(0, 40, (2, 13), generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        full = model(tokens)
        cache = model.new_cache()
        parts = [model(tokens[:, :6], cache)]
        parts += [model(tokens[:, t:t + 1], cache) for t in range(6, 13)]
    torch.testing.assert_close(torch.cat(parts, 1), full, rtol=1e-4, atol=1e-5)
    assert cache.offset == 13
    assert model.num_stored() == model.arch.param_counts().total


def test_generate_is_greedy_through_caches():
    model = _hybrid()
    prompt = torch.randint(0, 40, (2, 5), generator=torch.Generator().manual_seed(6))
    out = model.generate(prompt, 6)
    assert out.shape == (2, 11) and torch.equal(out[:, :5], prompt)
    with torch.no_grad():  # the same tokens from full forwards without a cache
        seq = prompt
        for _ in range(6):
            seq = torch.cat([seq, model(seq)[:, -1].argmax(-1, keepdim=True)], 1)
    assert torch.equal(out, seq)


def test_noop_block_is_identity_and_has_no_parameters():
    arch = ModelArch(hidden_size=8, vocab_size=10, blocks=(NoOp(), NoOp()))
    model = _init(CausalLM(arch))
    assert all(b.mixer is None and b.norm is None for b in model.blocks)
    t = torch.tensor([[1, 2, 3]])
    with torch.no_grad():
        h = model.norm(model.embed(t))
        torch.testing.assert_close(model(t), h @ model.lm_head.weight.t())


def test_apply_rope_paths_agree_with_rotate_half():
    """The in-place (no autograd) and the autograd form both equal HF's
    ``x * cos + rotate_half(x) * sin``, in either layout."""
    from nas.modules.layers import apply_rope, rope_tables

    cos, sin = rope_tables(torch.arange(3, 10), 8, 100.0, torch.float32)
    x = torch.randn(2, 4, 7, 8)
    ref = x * cos + torch.cat([-x[..., 4:], x[..., :4]], -1) * sin
    with torch.no_grad():
        torch.testing.assert_close(apply_rope(x, cos, sin), ref)
        torch.testing.assert_close(apply_rope(x.transpose(1, 2), cos[:, None], sin[:, None]),
                                   ref.transpose(1, 2))
    xg = x.clone().requires_grad_(True)
    out = apply_rope(xg, cos, sin)
    assert torch.equal(out, ref)
    (g,) = torch.autograd.grad(out, xg, torch.ones_like(out))
    torch.testing.assert_close(g, (cos + torch.cat([sin[..., 4:], -sin[..., :4]], -1))
                               .expand_as(g))


def test_llama3_rope_scaling():
    """Llama-3.1's rope_scaling: short wavelengths kept, long ones divided by the factor."""
    from nas.modules.layers import scaled_inv_freq

    scaling = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
               "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}
    inv = 1.0 / (500000.0 ** (torch.arange(0, 128, 2, dtype=torch.float32) / 128))
    out = scaled_inv_freq(inv, scaling)
    wavelen = 2 * math.pi / inv
    short, long_ = wavelen < 8192 / 4, wavelen > 8192 / 1
    assert torch.equal(out[short], inv[short])
    assert torch.allclose(out[long_], inv[long_] / 8)
    mid = ~short & ~long_
    assert ((out[mid] < inv[mid]) & (out[mid] > inv[mid] / 8)).all()
    assert torch.allclose(scaled_inv_freq(inv, {"rope_type": "linear", "factor": 2.0}), inv / 2)
    assert torch.equal(scaled_inv_freq(inv, None), inv)


def test_rope_scaling_reaches_the_model():
    from nas.child import build_model

    att = Attention(num_heads=2, num_kv_heads=1, head_dim=16)
    base = ModelArch(hidden_size=32, vocab_size=50, blocks=(att, FFN(width=64)))
    scaled = base.model_copy(update={"hf_extra_json": json.dumps(
        {"rope_scaling": {"rope_type": "linear", "factor": 4.0}})})
    tok = torch.randint(0, 50, (1, 12))
    a, b = build_model(base, seed=3), build_model(scaled, seed=3)
    assert torch.equal(a(tok[:, :1]), b(tok[:, :1]))  # position 0: no rotation either way
    assert not torch.allclose(a(tok), b(tok))
