"""Block-level benchmark: our torch modules vs HF transformers' own blocks, side by side.

Kinds (one block each, same weights copied into both, same shapes and dtype):

* ``attention``: :class:`nas.modules.AttentionMixer` vs ``LlamaAttention`` (SDPA, HF's
  default; its RoPE tables are computed outside the timed region, as a model shares them
  across layers);
* ``moe``: :class:`nas.modules.MoEMixer` vs ``Qwen3MoeSparseMoeBlock`` (HF's default
  experts implementation, ``grouped_mm`` where torch has it);
* ``mamba``: :class:`nas.modules.MambaMixer` vs ``NemotronHMamba2Mixer`` on its torch path
  (no mamba-ssm / causal-conv1d kernels; HF's chunk size 128, ours the module default).

Phases: prefill 1 x 1024 and 4 x 1024 (no cache), decode (batch 4, one token after a
2048-token context, through each side's cache), train (forward + backward, 16 x 256).
fp32 and bf16. Each round runs both sides back to back (alternating which goes first);
the table reports medians and the ratio ``t_hf / t_ours`` (> 1: ours is faster) plus the
achieved FLOP/s of ours (FLOPs counted from the shapes: the matmuls the math needs;
decode also reports bytes/s of weights + cache read).

Run: ``pytest benchmarks/bench_modules.py --benchmark-only -s``. Environment knobs
(defaults in brackets): ``BENCH_ROUNDS`` [5], ``BENCH_DTYPES`` [float32,bfloat16],
``BENCH_KINDS`` [attention,moe,mamba], ``BENCH_PHASES`` [all four], ``BENCH_THREADS``
[1], ``BENCH_PROFILE`` (a ``puzzle-nas profile`` JSON: report % of its measured peaks),
``BENCH_JSON`` (write the table as JSON there). Needs the ``test`` extra (transformers).
"""

from __future__ import annotations

import json
import os
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from nas.arch import Attention, Mamba, MoE  # noqa: E402
from nas.modules import AttentionMixer, MambaMixer, MoEMixer  # noqa: E402

HIDDEN = 1024
ATT = dict(heads=16, kv_heads=4, head_dim=64)
MOE = dict(experts=64, top_k=8, width=256)
MAMBA = dict(heads=32, head_dim=64, groups=8, state=128, conv=4, hf_chunk=128)
DECODE_CTX, DECODE_BATCH, DECODE_STEPS = 2048, 4, 8

PHASES = {  # name -> (batch, length)
    "prefill-1x1024": (1, 1024),
    "prefill-4x1024": (4, 1024),
    "decode-4@2048": (DECODE_BATCH, 1),
    "train-16x256": (16, 256),
}
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def _env_list(name: str, default: list[str]) -> list[str]:
    v = os.environ.get(name)
    return [s.strip() for s in v.split(",") if s.strip()] if v else default


ROUNDS = int(os.environ.get("BENCH_ROUNDS", "5"))
KINDS = _env_list("BENCH_KINDS", ["attention", "moe", "mamba"])
PHASE_LIST = _env_list("BENCH_PHASES", list(PHASES))
DTYPE_LIST = _env_list("BENCH_DTYPES", list(DTYPES))
RESULTS: list[dict] = []


# ---- the two sides of each kind --------------------------------------------------------
@dataclass
class Pair:
    ours: torch.nn.Module
    hf: torch.nn.Module
    hf_extra: dict  # kind-specific HF pieces (rotary embedding, config)


def _attention_pair() -> Pair:
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaAttention, LlamaRotaryEmbedding

    cfg = LlamaConfig(hidden_size=HIDDEN, num_attention_heads=ATT["heads"],
                      num_key_value_heads=ATT["kv_heads"], head_dim=ATT["head_dim"],
                      intermediate_size=4 * HIDDEN, num_hidden_layers=1, vocab_size=128,
                      max_position_embeddings=8192, attn_implementation="sdpa")
    cfg._attn_implementation = "sdpa"
    hf = LlamaAttention(cfg, layer_idx=0)
    ours = AttentionMixer(Attention(num_heads=ATT["heads"], num_kv_heads=ATT["kv_heads"],
                                    head_dim=ATT["head_dim"]), HIDDEN, rope_theta=10000.0)
    torch.manual_seed(0)
    ours.reset_parameters()
    hf.load_state_dict(ours.state_dict())
    return Pair(ours, hf, {"rotary": LlamaRotaryEmbedding(cfg), "config": cfg})


def _moe_pair() -> Pair:
    from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

    cfg = Qwen3MoeConfig(hidden_size=HIDDEN, num_experts=MOE["experts"],
                         num_experts_per_tok=MOE["top_k"], moe_intermediate_size=MOE["width"],
                         intermediate_size=4 * HIDDEN, num_hidden_layers=1, vocab_size=128,
                         num_attention_heads=8, num_key_value_heads=8, norm_topk_prob=True,
                         decoder_sparse_step=1, mlp_only_layers=[])
    model = Qwen3MoeForCausalLM(cfg)  # the PreTrainedModel picks HF's experts implementation
    hf = model.model.layers[0].mlp
    ours = MoEMixer(MoE(num_experts=MOE["experts"], top_k=MOE["top_k"],
                        expert_width=MOE["width"]), HIDDEN)
    torch.manual_seed(0)
    ours.reset_parameters()
    with torch.no_grad():
        hf.gate.weight.copy_(ours.gate.weight)
        hf.experts.gate_up_proj.copy_(torch.cat([ours.experts_gate, ours.experts_up], 1))
        hf.experts.down_proj.copy_(ours.experts_down)
    return Pair(ours, hf, {"config": cfg, "impl": cfg._experts_implementation})


def _mamba_pair() -> Pair:
    from transformers import NemotronHConfig
    from transformers.models.nemotron_h.modeling_nemotron_h import NemotronHMamba2Mixer

    cfg = NemotronHConfig(hidden_size=HIDDEN, mamba_num_heads=MAMBA["heads"],
                          mamba_head_dim=MAMBA["head_dim"], n_groups=MAMBA["groups"],
                          ssm_state_size=MAMBA["state"], conv_kernel=MAMBA["conv"],
                          chunk_size=MAMBA["hf_chunk"], layers_block_type=["mamba"],
                          vocab_size=128, time_step_min=0.0, use_conv_bias=True,
                          use_bias=False, layer_norm_epsilon=1e-5)
    hf = NemotronHMamba2Mixer(cfg, layer_idx=0)
    ours = MambaMixer(Mamba(num_heads=MAMBA["heads"], head_dim=MAMBA["head_dim"],
                            state_size=MAMBA["state"], n_groups=MAMBA["groups"],
                            conv_kernel=MAMBA["conv"]), HIDDEN, eps=1e-5)
    torch.manual_seed(0)
    ours.reset_parameters()
    hf.load_state_dict(ours.state_dict())
    return Pair(ours, hf, {"config": cfg})


PAIRS: dict[str, Callable[[], Pair]] = {"attention": _attention_pair, "moe": _moe_pair,
                                        "mamba": _mamba_pair}


# ---- one call of each side -------------------------------------------------------------
def _hf_call(kind: str, pair: Pair, x: torch.Tensor, cache=None, pos: int = 0):
    if kind == "attention":
        rope = pair.hf_extra["rope"]
        return pair.hf(x, position_embeddings=rope, attention_mask=None, cache=cache)[0]
    if kind == "mamba":
        return pair.hf(x, cache=cache)
    return pair.hf(x)


def _ours_call(pair: Pair, x: torch.Tensor, cache=None, pos: int = 0):
    return pair.ours(x, cache, pos)


def _hf_cache(kind: str, pair: Pair, dtype):
    from transformers import DynamicCache

    if kind == "moe":
        return None
    return DynamicCache(config=pair.hf_extra["config"])


def _set_rope(pair: Pair, b: int, start: int, n: int, dtype) -> None:
    pos = torch.arange(start, start + n)[None].expand(b, n)
    dummy = torch.empty(1, dtype=dtype)
    pair.hf_extra["rope"] = pair.hf_extra["rotary"](dummy, pos)


# ---- FLOPs and bytes of ours (the math, not either implementation) -----------------------
def flops(kind: str, b: int, n: int, ctx: int = 0) -> float:
    """Forward FLOPs of one call: projections + the mixing the math needs."""
    T = b * n
    if kind == "attention":
        qd, kvd = ATT["heads"] * ATT["head_dim"], ATT["kv_heads"] * ATT["head_dim"]
        proj = 2 * T * HIDDEN * (2 * qd + 2 * kvd)
        # causal: query i sees ctx + i + 1 keys; QK^T and PV
        keys = b * (n * ctx + n * (n + 1) / 2)
        return proj + 4 * keys * qd
    if kind == "moe":
        return 2 * T * HIDDEN * MOE["experts"] + 2 * T * MOE["top_k"] * 3 * HIDDEN * MOE["width"]
    inner = MAMBA["heads"] * MAMBA["head_dim"]
    gn = MAMBA["groups"] * MAMBA["state"]
    proj = 2 * T * HIDDEN * (2 * inner + 2 * gn + MAMBA["heads"]) + 2 * T * inner * HIDDEN
    # SSM: state update (x B^T) and readout (S C) per token: 2 * 2 * H*P*N
    return proj + 4 * T * inner * MAMBA["state"]


def decode_bytes(kind: str, pair: Pair, dtype, ctx: int) -> float:
    """Bytes one decode step must read at least: the weights it touches + cache/state."""
    es = torch.empty(0, dtype=dtype).element_size()
    b = DECODE_BATCH
    if kind == "attention":
        w = sum(p.numel() for p in pair.ours.parameters()) * es
        return w + 2 * b * ctx * ATT["kv_heads"] * ATT["head_dim"] * es
    if kind == "moe":  # router + at most b * top_k experts
        per_expert = 3 * HIDDEN * MOE["width"] * es
        return HIDDEN * MOE["experts"] * es + min(MOE["experts"], b * MOE["top_k"]) * per_expert
    w = sum(p.numel() for p in pair.ours.parameters()) * es
    state = b * MAMBA["heads"] * MAMBA["head_dim"] * MAMBA["state"] * 4
    return w + 2 * state


# ---- timing ----------------------------------------------------------------------------
def _timed(fn: Callable[[], object]) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def run_case(kind: str, phase: str, dtype_name: str) -> dict:
    dtype = DTYPES[dtype_name]
    pair = PAIRS[kind]()
    pair.ours.to(dtype)
    pair.hf.to(dtype)
    b, n = PHASES[phase]
    g = torch.Generator().manual_seed(1)
    train = phase.startswith("train")
    pair.ours.train(train)
    pair.hf.train(train)
    ctx = DECODE_CTX if phase.startswith("decode") else 0
    x = torch.randn(b, n, HIDDEN, generator=g).to(dtype)
    calls: dict[str, Callable[[], object]] = {}
    check: tuple[torch.Tensor, torch.Tensor] | None = None

    if train:
        grad = torch.randn(b, n, HIDDEN, generator=g).to(dtype)
        xs = {s: x.clone().requires_grad_(True) for s in ("ours", "hf")}
        if kind == "attention":
            _set_rope(pair, b, 0, n, dtype)

        def step(side):
            def go():
                m = pair.ours if side == "ours" else pair.hf
                m.zero_grad(set_to_none=True)
                out = _ours_call(pair, xs[side]) if side == "ours" \
                    else _hf_call(kind, pair, xs[side])
                out.backward(grad)
            return go
        calls = {"ours": step("ours"), "hf": step("hf")}
    elif ctx:
        with torch.no_grad():
            prompt = torch.randn(b, ctx, HIDDEN, generator=g).to(dtype)
            oc: dict = {}
            hc = _hf_cache(kind, pair, dtype)
            _ours_call(pair, prompt, oc if kind != "moe" else None, 0)
            if kind == "attention":
                _set_rope(pair, b, 0, ctx, dtype)
            _hf_call(kind, pair, prompt, hc)
        state = {"ours": ctx, "hf": ctx}
        tok = torch.randn(DECODE_STEPS, b, 1, HIDDEN, generator=g).to(dtype)

        def dec(side):
            @torch.no_grad()
            def go():
                for i in range(DECODE_STEPS):
                    p = state[side]
                    if side == "ours":
                        _ours_call(pair, tok[i], oc if kind != "moe" else None, p)
                    else:
                        if kind == "attention":
                            _set_rope(pair, b, p, 1, dtype)
                        _hf_call(kind, pair, tok[i], hc)
                    state[side] = p + 1
            return go
        calls = {"ours": dec("ours"), "hf": dec("hf")}
    else:
        if kind == "attention":
            _set_rope(pair, b, 0, n, dtype)

        def fwd(side):
            @torch.no_grad()
            def go():
                return _ours_call(pair, x) if side == "ours" else _hf_call(kind, pair, x)
            return go
        calls = {"ours": fwd("ours"), "hf": fwd("hf")}
        if dtype == torch.float32:
            check = (calls["ours"](), calls["hf"]())

    if check is not None:  # the same computation: outputs agree (fp32)
        torch.testing.assert_close(check[0], check[1], rtol=2e-3, atol=2e-4)
    for side in ("ours", "hf"):  # warm-up
        calls[side]()
    times: dict[str, list[float]] = {"ours": [], "hf": []}
    for r in range(ROUNDS):
        order = ("ours", "hf") if r % 2 == 0 else ("hf", "ours")
        for side in order:
            times[side].append(_timed(calls[side]))
    med = {s: statistics.median(v) for s, v in times.items()}
    per_call = DECODE_STEPS if ctx else 1
    f = flops(kind, b, n, ctx) * (3 if train else 1) * per_call
    row = {"kind": kind, "phase": phase, "dtype": dtype_name, "rounds": ROUNDS,
           "ours_s": med["ours"] / per_call, "hf_s": med["hf"] / per_call,
           "speedup": med["hf"] / med["ours"], "ours_flop_s": f / med["ours"],
           "hf_flop_s": f / med["hf"]}
    if ctx:
        row["ours_bytes_s"] = decode_bytes(kind, pair, dtype, ctx) * per_call / med["ours"]
    if kind == "moe":
        row["hf_experts_impl"] = pair.hf_extra["impl"]
    RESULTS.append(row)
    return row


def _peaks() -> dict[str, float]:
    """Measured peaks of a ``puzzle-nas profile`` JSON (``BENCH_PROFILE``): FLOP/s per
    dtype and memory bandwidth (bytes/s)."""
    path = os.environ.get("BENCH_PROFILE")
    if not path:
        return {}
    import hwprofiles

    hw = hwprofiles.load(path)
    out = {k: float(v.value) for k, v in hw.peak_flops.items()}
    out["bandwidth"] = float(hw.memory_bandwidth.value)
    meas = os.path.splitext(path)[0] + ".measurements.json"
    if os.path.exists(meas):  # dtypes the profile keeps in its measurements only (CPU fp32)
        with open(meas) as fh:
            for m in json.load(fh).get("measurements", []):
                if m.get("kind") == "gemm" and m.get("dtype") not in out:
                    out[m["dtype"]] = m["flop_per_s"]
                elif m.get("kind") == "gemm" and m.get("dtype") in ("fp32", "fp16"):
                    out[m["dtype"]] = max(out[m["dtype"]], m["flop_per_s"])
    return out


def report() -> str:
    peaks = _peaks()
    lines = [f"{'kind':<10}{'phase':<16}{'dtype':<10}{'ours ms':>10}{'HF ms':>10}"
             f"{'HF/ours':>9}{'ours GFLOP/s':>14}{'HF GFLOP/s':>12}  extra"]
    for r in RESULTS:
        extra = ""
        if "ours_bytes_s" in r:
            extra += f"ours {r['ours_bytes_s'] / 1e9:.2f} GB/s"
            if "bandwidth" in peaks:
                extra += f" ({100 * r['ours_bytes_s'] / peaks['bandwidth']:.0f} % of peak)"
        key = {"float32": "fp32", "bfloat16": "bf16"}[r["dtype"]]
        if key in peaks:
            extra += f" {100 * r['ours_flop_s'] / peaks[key]:.0f} % of {key} peak"
        if "hf_experts_impl" in r:
            extra += f" HF experts={r['hf_experts_impl']}"
        lines.append(f"{r['kind']:<10}{r['phase']:<16}{r['dtype']:<10}"
                     f"{1e3 * r['ours_s']:>10.2f}{1e3 * r['hf_s']:>10.2f}{r['speedup']:>8.2f}x"
                     f"{r['ours_flop_s'] / 1e9:>14.1f}{r['hf_flop_s'] / 1e9:>12.1f}  {extra}")
    return "\n".join(lines)


CASES = [(k, p, d) for d in DTYPE_LIST for k in KINDS for p in PHASE_LIST]


@pytest.fixture(scope="module", autouse=True)
def _threads():
    old = torch.get_num_threads()
    torch.set_num_threads(int(os.environ.get("BENCH_THREADS", "1")))
    yield
    torch.set_num_threads(old)
    if RESULTS:
        print(f"\n[bench_modules] threads={os.environ.get('BENCH_THREADS', '1')} "
              f"rounds={ROUNDS} hidden={HIDDEN} (medians; HF/ours > 1: ours faster)")
        print(report())
        out = os.environ.get("BENCH_JSON")
        if out:
            with open(out, "w") as fh:
                json.dump(RESULTS, fh, indent=1)


@pytest.mark.parametrize("kind,phase,dtype", CASES, ids=["-".join(c) for c in CASES])
def test_block_vs_transformers(benchmark, kind, phase, dtype):
    row = benchmark.pedantic(run_case, args=(kind, phase, dtype), rounds=1, iterations=1)
    benchmark.extra_info.update(row)
    print(f"\n[bench_modules] {kind} {phase} {dtype}: ours {1e3 * row['ours_s']:.2f} ms, "
          f"HF {1e3 * row['hf_s']:.2f} ms, HF/ours {row['speedup']:.2f}x")
