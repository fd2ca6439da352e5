"""Block-library generators for tests and benchmarks (not part of the product package).

``synthetic_library``: a Nemotron-3-Super-like library; ``nvlabs_shaped_library``: the shape
of NVlabs/puzzle's published Llama-3.3-70B library. Benchmarks import this module too
(benchmarks/conftest.py puts tests/ on the path).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from nas.library import BlockLibrary, from_puzzle


def synthetic_library(
    num_blocks: int = 88,
    *,
    seed: int = 0,
    pattern: str = "MEMEMEM*EMEMEMEM",
    workloads: Sequence[str] = ("chat-4k", "rag-32k", "long-1m"),
    pair_noops: bool = True,
    runtime_noise: float = 0.03,
) -> BlockLibrary:
    """A structured, Nemotron-Super-like library for tests and benchmarks.

    Blocks follow ``pattern`` repeated (``M`` Mamba, ``E`` MoE, ``*`` attention).
    Alternatives per kind: MoE 6 expert widths x 5 top-k + no-op (31); Mamba 6 state
    sizes x 3 head fractions + linear + no-op (20); attention KV heads {2, 1} x sliding
    window {none, 4k} + linear + no-op (6); plus (``pair_noops``) a two-block no-op over
    each ``M E`` pair. At 88 blocks that is > 2,000 replacements.

    Costs (bytes, seconds, parameters): ``params``, ``active_params``, and per workload
    ``memory_bytes@w`` (weights + KV/state at that workload's concurrency) and
    ``runtime_s@w``. Score ``kl_div`` falls as a block keeps more of the parent
    (quality improves with cost), with per-block sensitivity and lognormal noise.
    Constants: embeddings/LM-head parameters, memory and runtime.

    ``runtime_noise``: the lognormal sigma of a per-replacement factor on each runtime, as
    in a library of measured blocks. 0 prices every layer of one configuration alike, as
    :mod:`nas.search` does (the interchangeable classes of
    :func:`nas.mip.model.interchangeable_classes`).
    """
    rng = np.random.default_rng(seed)
    kinds = (pattern * (num_blocks // len(pattern) + 1))[:num_blocks]
    # workload: (context tokens, concurrency)
    wl_shape = [(4096, 64), (32768, 16), (1_000_000, 2)][: len(workloads)]
    wl_shape += [(8192, 8)] * (len(workloads) - len(wl_shape))
    start: list[int] = []
    end: list[int] = []
    labels: list[str] = []
    tags: list[list[str]] = []
    keep: list[float] = []  # fraction of parent compute kept
    params: list[float] = []
    active: list[float] = []
    state_tok: list[float] = []  # KV bytes per token
    state_seq: list[float] = []  # SSM state bytes per sequence
    window: list[float] = []  # attention sliding window in tokens (0: full context)
    sens = rng.lognormal(0.0, 0.6, size=num_blocks)

    def add(b: int, e: int, label: str, tg: list[str], k: float, p: float, a: float,
            kv: float = 0.0, ss: float = 0.0, win: float = 0.0) -> None:
        start.append(b)
        end.append(e)
        labels.append(label)
        tags.append(tg)
        keep.append(k)
        params.append(p)
        active.append(a)
        state_tok.append(kv)
        state_seq.append(ss)
        window.append(win)

    for b, kind in enumerate(kinds):
        if kind == "E":
            full = 512 * 3 * 1024 * 2688.0
            for w in (2688, 2304, 2048, 1792, 1536, 1280):
                for k in (22, 18, 14, 10, 6):
                    frac = (w / 2688) * (0.5 + 0.5 * k / 22)
                    add(b, b + 1, f"moe width={w} top_k={k}", ["moe", "kept:moe"], frac,
                        full * w / 2688, 3 * 1024 * w * k + 3 * 4096 * 5376.0)
            add(b, b + 1, "moe no_op", ["moe", "no_op"], 0.0, 0.0, 0.0)
        elif kind == "M":
            fullp = 4096 * (2 * 8192 + 2 * 8 * 128) + 8192 * 4096.0
            for st in (128, 112, 96, 80, 64, 48):
                for hf in (1.0, 0.75, 0.5):
                    frac = hf * (0.6 + 0.4 * st / 128)
                    p = fullp * hf
                    add(b, b + 1, f"mamba state={st} heads={int(128 * hf)}",
                        ["mamba", "kept:mamba"], frac, p, p, 0.0, 128 * hf * 64 * st * 4.0)
            add(b, b + 1, "mamba linear", ["mamba", "linear"], 0.05, 4096.0 * 4096, 4096.0 * 4096)
            add(b, b + 1, "mamba no_op", ["mamba", "no_op"], 0.0, 0.0, 0.0)
        else:
            for kvh in (2, 1):
                for win in (0, 4096):
                    p = 4096 * 32 * 128 * 2 + 4096 * kvh * 128 * 2.0
                    frac = (0.7 + 0.3 * kvh / 2) * (1.0 if win == 0 else 0.8)
                    add(b, b + 1, f"attention kv={kvh} window={win or 'full'}",
                        ["attention", "kept:attention"], frac, p, p, kvh * 128 * 2 * 1.0,
                        0.0, float(win))
            add(b, b + 1, "attention linear", ["attention", "linear"], 0.05, 4096.0 * 4096,
                4096.0 * 4096)
            add(b, b + 1, "attention no_op", ["attention", "no_op"], 0.0, 0.0, 0.0)
    if pair_noops:
        for b in range(num_blocks - 1):
            if kinds[b] == "M" and kinds[b + 1] == "E":
                add(b, b + 2, "mamba+moe no_op pair", ["pair", "no_op"], 0.0, 0.0, 0.0)
    st_ = np.asarray(start)
    en_ = np.asarray(end)
    keep_a = np.asarray(keep)
    p_a = np.asarray(params)
    a_a = np.asarray(active)
    kv_a = np.asarray(state_tok)
    ss_a = np.asarray(state_seq)
    win_a = np.asarray(window)
    span_sens = np.array([sens[s:e].sum() for s, e in zip(st_, en_)])
    noise = rng.lognormal(0.0, 0.15, size=st_.size)
    kl = span_sens * 0.02 * ((1.0 - keep_a) ** 1.5 + 0.02 * (1.0 - keep_a)) * noise
    kl = kl + span_sens * np.where(keep_a == 0.0, 0.6, 0.0) * noise
    kl[keep_a >= 0.999] = 0.0
    bytes_w = 0.5625  # NVFP4-ish weight bytes
    costs: dict[str, np.ndarray] = {"params": p_a, "active_params": a_a}
    constants: dict[str, float] = {"params": 2 * 131072 * 4096.0, "active_params": 2 * 131072 * 4096.0}
    for w, (ctx, conc) in zip(workloads, wl_shape):
        # sliding-window attention keeps at most `window` tokens of KV (FP8 KV, 1 byte)
        kv_per_tok = kv_a * np.where(win_a > 0, np.minimum(win_a, ctx) / ctx, 1.0)
        mem = p_a * bytes_w + conc * (ctx * kv_per_tok + ss_a)
        # decode step time: weight + state reads at ~3.3 TB/s, plus per-block overhead
        t = (a_a * bytes_w + conc * (ctx * kv_per_tok + ss_a)) / 3.3e12
        t = t + np.where(p_a > 0, 6e-6, 0.0) * (en_ - st_)
        t = t * rng.lognormal(0.0, runtime_noise, size=t.size)
        costs[f"memory_bytes@{w}"] = mem
        costs[f"runtime_s@{w}"] = t
        constants[f"memory_bytes@{w}"] = 2 * 131072 * 4096 * 2.0 + 2e9
        constants[f"runtime_s@{w}"] = 2 * 131072 * 4096 * 2.0 / 3.3e12 + 2e-4
    return BlockLibrary(num_blocks, st_, en_, costs, {"kl_div": kl}, labels=labels, tags=tags,
                        constants=constants, block_names=[f"{kinds[b]}{b}" for b in range(num_blocks)],
                        source=f"synthetic(seed={seed})")


def nvlabs_shaped_library(num_layers: int = 80, *, seed: int = 0,
                          measured_sizes: bool = False) -> BlockLibrary:
    """A library shaped like the one NVlabs/puzzle publishes for Llama-3.3-70B, for tests
    and benchmarks of the MIP (the real one is under a non-commercial licence).

    Per layer 16 one-block variants, labelled as NVlabs does (``"attention = ...\\t&&\\t
    ffn = ..."``): attention kept (8 KV heads) or no-op, times FFN width 100, 75, 62, 50,
    25, 20, 10 or 0 % of 28,672. Costs in the file's units: ``stats.memory_mib`` (exact
    binary fractions, as measured sizes are), ``stats.runtime_ms``, ``stats.num_params``
    and the descriptive ``stats.num_kv_heads`` / ``stats.ffn_intermediate_size``. Scores:
    ``metrics.kl_div`` spanning ~1e-4..500 (the parent variant 0; each 80-layer period has
    catastrophic layers 0 and 3, where an FFN no-op costs KL in the hundreds, and mildly
    sensitive ends), ``metrics.lm_loss``. ``num_layers`` 320 or 1,280 gives the 4x and 16x
    stacked shapes.
    """
    rng = np.random.default_rng(seed)
    fracs = [1.0, 0.75, 0.62, 0.5, 0.25, 0.2, 0.1, 0.0]
    lib: dict[str, Any] = {}
    for layer in range(num_layers):
        period = layer % 80
        s_ffn = float(rng.lognormal(np.log(0.35), 0.6))
        s_att = float(rng.lognormal(np.log(0.2), 0.8))
        if period in (0, 3):
            s_ffn, s_att = float(rng.uniform(400, 500)), float(rng.uniform(20, 40))
        elif period in (7, 79):
            s_ffn = float(rng.uniform(8, 20))
        elif rng.random() < 0.1:  # nearly insensitive layers: differences of ~1e-4
            s_ffn, s_att = s_ffn * 1e-3, s_att * 1e-3
        att_mem = 765.1015625 * (1 + 0.01 * rng.integers(-2, 3))
        att_ms = 353.8 * float(rng.uniform(0.97, 1.03))
        ffn_ms = 463.2 * float(rng.uniform(0.97, 1.03))
        variants: dict[str, Any] = {}
        for att in (True, False):
            for f, units in zip(fracs, (112, 84, 70, 56, 28, 22, 11, 0)):
                width = 256 * units if measured_sizes else round(28672 * f)
                kl = (0.0 if att else s_att) + s_ffn * (1 - f) ** 1.5
                if not (att and f == 1.0):
                    kl *= float(rng.lognormal(0.0, 0.15))
                mem = (att_mem if att else 0.0) + round(672.0078125 * f * 128) / 128
                if measured_sizes:
                    mem = (765.1015625 if att else 0.0) + (0.0078125 + 6.0 * units if units
                                                           else 0.0)
                ms = (att_ms if att else 0.0) + ffn_ms * f ** 0.9 * float(rng.uniform(0.98, 1.02))
                desc = (("attention = 8 kv heads (parent * 100%)" if att
                         else "attention = no_op (parent * 0%)") + "\t&&\t"
                        + (f"ffn = intermediate size {width / 1000:.0f}e3 (parent * {f:.0%})"
                           if f else "ffn = no_op (parent * 0%)"))
                params = (151003136 if att else 0) + 3 * 8192 * width
                variants[desc] = {
                    "stats": {"num_kv_heads": 8 if att else 0, "ffn_intermediate_size": width,
                              "memory_mib": mem, "runtime_ms": ms, "num_params": params},
                    "metrics": {"kl_div": kl, "lm_loss": 1.64 + 0.05 * kl}}
        lib[f"layer_{layer}"] = variants
    return from_puzzle(lib, source=f"nvlabs_shaped_library({num_layers}, seed={seed})")


def typed_library(num_blocks: int = 24, *, seed: int = 0, groups: int = 3,
                  spans: bool = True) -> BlockLibrary:
    """A library shaped like the ones :mod:`nas.search` builds: blocks of two kinds (``A``,
    ``B``, alternating), each kind with its own variants priced alike in every layer
    (``mem``, ``time``, ``params``), and a structural-prior-like score: a variant's KL times
    one of ``groups`` per-layer sensitivities, so layers of one kind and group are
    interchangeable (the classes of :func:`nas.mip.model.interchangeable_classes`).
    ``spans`` adds a two-block no-op over every fourth pair of blocks. Tags: the kind,
    ``no_op`` and ``kept``."""
    rng = np.random.default_rng(seed)
    kinds = "AB" * (num_blocks // 2 + 1)
    variants = {k: [(float(m), float(t), float(p), float(q)) for m, t, p, q in zip(
        rng.uniform(1, 10, 5), rng.uniform(0.1, 1, 5), rng.uniform(1, 5, 5),
        np.sort(rng.uniform(0.0, 1.0, 5)))] + [(0.0, 0.0, 0.0, 3.0)] for k in "AB"}
    sens = rng.choice(rng.uniform(0.5, 2.0, groups), size=num_blocks)
    start, end, labels, tags = [], [], [], []
    cols: dict[str, list[float]] = {"mem": [], "time": [], "params": []}
    kl: list[float] = []
    for b in range(num_blocks):
        k = kinds[b]
        for j, (m, t, p, q) in enumerate(variants[k]):
            start.append(b)
            end.append(b + 1)
            last = j == len(variants[k]) - 1
            labels.append(f"{k} {'no_op' if last else f'v{j}'}")
            tags.append([k, "no_op" if last else "kept"])
            for key, v in zip(("mem", "time", "params"), (m, t, p)):
                cols[key].append(v)
            kl.append(q * sens[b])
    if spans:
        for b in range(0, num_blocks - 1, 4):
            start.append(b)
            end.append(b + 2)
            labels.append("pair no_op")
            tags.append(["pair", "no_op"])
            for key in cols:
                cols[key].append(0.0)
            kl.append(2.5 * (sens[b] + sens[b + 1]))
    return BlockLibrary(num_blocks, start, end, cols, {"kl": kl}, labels=labels, tags=tags,
                        constants={"mem": 5.0}, source=f"typed(seed={seed})")
