"""Serving-model identities: chunked prefill vs batch mode, monotone throughput, SLO sweeps."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import hwprofiles
from costmodels.blocks import price_blocks
from costmodels.dtypes import get_recipe
from costmodels.model import (
    NonBlockShape,
    max_concurrency,
    price_model,
    price_nonblock,
    summarize,
)
from costmodels.serving import concurrency_grid, parse_slo, slo_throughput
from costmodels.shapes import BlockTable, Kind
from costmodels.workload import UNLIMITED
from hwprofiles.errors import InputError
from nas.hf import load_config
from nas.search import nonblock_shape

H100 = hwprofiles.get("h100-sxm")
FP8 = get_recipe("fp8")
ATT = dict(kind=Kind.ATTENTION, hidden=4096, n_heads=32, n_kv_heads=8, head_dim=128)
FFN = dict(kind=Kind.FFN, hidden=4096, ffn_width=14336, gated=1)
LLAMA8B = BlockTable.from_rows([ATT, FFN] * 32)
NB = NonBlockShape(hidden=4096, vocab=128256)
MAMBA = dict(kind=Kind.MAMBA, hidden=4096, m_heads=128, m_head_dim=64, state=128, groups=8,
             conv_kernel=4, conv_bias=1)
MOE = dict(kind=Kind.MOE, hidden=4096, experts=512, top_k=22, expert_width=2688,
           shared_width=5376, latent=1024, router_bias=1)
HYBRID = BlockTable.from_rows([MAMBA, MOE, dict(ATT, n_kv_heads=2), MOE] * 4)

FIELDS = ("ttft_s", "tpot_s", "latency_s", "runtime_s", "throughput_tok_s", "per_user_tok_s",
          "memory_bytes")


@pytest.mark.parametrize("table", [LLAMA8B, HYBRID], ids=["dense", "hybrid-moe"])
@pytest.mark.parametrize("isl,osl,b", [(128, 128, 64), (8192, 1024, 16), (2048, 128, 200)])
def test_chunked_prefill_with_unlimited_budget_is_batch_mode(table, isl, osl, b):
    # the workspace holds one step's prompt tokens, at most the engine's token budget: the
    # static batch is given the same unlimited budget, so the two hold the same workspace
    batch = price_model(table, NB, H100, FP8, [f"isl={isl},osl={osl},batch={b},"
                                               f"max_num_batched_tokens={UNLIMITED}"])
    cont = price_model(table, NB, H100, FP8, [f"isl={isl},osl={osl},concurrency={b},"
                                              f"max_num_batched_tokens={UNLIMITED},"
                                              f"max_num_seqs={UNLIMITED}"])
    for f in FIELDS:
        np.testing.assert_allclose(getattr(cont, f), getattr(batch, f), rtol=1e-12, err_msg=f)
    # with the default 8192-token budget the prompts are chunked into steps shared with the
    # other requests' decodes: the first token comes sooner, the later ones slower
    chunked = price_model(table, NB, H100, FP8, [f"isl={isl},osl={osl},concurrency={b}"])
    if b * isl > 8192:
        assert chunked.ttft_s[0] < batch.ttft_s[0]
        assert chunked.tpot_s[0] > batch.tpot_s[0]
    else:
        for f in FIELDS:
            np.testing.assert_allclose(getattr(chunked, f), getattr(batch, f), rtol=1e-12)


@pytest.mark.parametrize("table,recipe", [(LLAMA8B, FP8), (HYBRID, get_recipe("nvfp4-super"))])
@pytest.mark.parametrize("isl,osl", [(128, 2048), (2048, 128), (8192, 8192)])
def test_throughput_monotone_in_concurrency_until_memory_binds(table, recipe, isl, osl):
    grid = list(range(1, 40)) + list(range(40, 40000, 97))
    m = price_model(table, NB, H100, recipe, [f"isl={isl},osl={osl},concurrency={c},"
                                              f"max_num_seqs={UNLIMITED}" for c in grid])
    fits = m.fits
    assert fits[0] and not fits.all()  # memory binds somewhere in the sweep
    n = int(np.argmin(fits))  # first point that does not fit
    assert fits[:n].all() and not fits[n:].any()
    thr = m.throughput_tok_s[:n]
    assert np.all(np.diff(thr) >= -1e-9 * thr[1:])
    assert np.all(np.diff(m.per_user_tok_s[:n]) <= 1e-9 * m.per_user_tok_s[1:n])


def test_slo_throughput_is_best_point_of_explicit_sweep():
    wl = "isl=1000,osl=1000,concurrency=1"
    grid = [1, 2, 5, 9, 17, 33, 64, 100, 128, 200, 256, 400, 512, 700, 1024, 1500, 2048]
    for slo in ("per_user_tps>=60", "ttft<=300ms", "per_user_tps>=30,ttft<=2s", None):
        pt = slo_throughput(LLAMA8B, NB, H100, FP8, wl, slo, concurrencies=grid)
        m = price_model(LLAMA8B, NB, H100, FP8, [f"isl=1000,osl=1000,concurrency={c}"
                                                  for c in grid])
        s = parse_slo(slo)
        ok = m.fits.copy()
        if s.per_user_tps is not None:
            ok &= m.per_user_tok_s >= s.per_user_tps
        if s.ttft_s is not None:
            ok &= m.ttft_s <= s.ttft_s
        best = int(np.argmax(np.where(ok, m.throughput_tok_s, -1)))
        assert pt.concurrency == grid[best]
        assert pt.throughput_tok_s == pytest.approx(m.throughput_tok_s[best], rel=1e-12)
        assert pt.per_user_tok_s == pytest.approx(m.per_user_tok_s[best], rel=1e-12)
    # an SLO nobody meets
    assert slo_throughput(LLAMA8B, NB, H100, FP8, wl, "per_user_tps>=1e6").concurrency == 0
    # the default grid reaches the memory limit and holds every integer up to 16
    pt = slo_throughput(LLAMA8B, NB, H100, FP8, "isl=8192,osl=8192,concurrency=1")
    swept = [w.sequences for w in pt.sweep.workloads]
    assert swept[:16] == list(range(1, 17)) and swept[-1] == pt.max_concurrency
    assert pt.concurrency == pt.max_concurrency  # no SLO: memory binds


def test_concurrency_grid_and_slo_parsing():
    g = concurrency_grid(1000)
    assert g[0] == 1 and g[-1] == 1000 and g == sorted(set(g))
    assert max(b / a for a, b in zip(g[15:], g[16:])) <= 1.1  # ~1/16 steps, rounded
    assert parse_slo("per_user_tps>=100").per_user_tps == 100
    assert parse_slo("ttft<=2s").ttft_s == 2.0 and parse_slo("ttft_ms<=500").ttft_s == 0.5
    both = parse_slo("per_user_tps >= 20 and ttft<=250ms")
    assert (both.per_user_tps, both.ttft_s) == (20, 0.25)
    for bad in ("per_user_tps<=100", "ttft>=1", "speed>=3", "per_user_tps>=-1"):
        with pytest.raises(InputError):
            parse_slo(bad)


def test_one_h100_million_token_concurrency_parent_vs_published_child():
    """Published: 1M-token concurrency on one H100 goes 1 -> 8 (Super -> Puzzle-75B)."""
    repo = Path(__file__).resolve().parents[1]
    recipe = get_recipe("nvfp4-super")
    got = {}
    for who, path in (("parent", repo / "nas/examples/configs/nemotron-3-super-120b-a12b.json"),
                      ("child", repo / "costmodels/data/configs/nemotron-labs-3-puzzle-75b-a9b.json")):
        arch = load_config(path)
        wl = ["isl=1044480,osl=4096,concurrency=1"]
        b = price_blocks(arch.block_table(), H100, recipe, wl)
        nb = price_nonblock(nonblock_shape(arch), H100, recipe, wl)
        got[who] = max_concurrency(b, nb, H100, 1_048_576).max_concurrency
    assert 1 <= got["parent"] <= 2 and 7 <= got["child"] <= 9, got


def test_mtp_speculation_credits_accepted_tokens_and_prices_draft_and_verify():
    draft_rows = BlockTable.from_rows([ATT, FFN, dict(kind=Kind.LINEAR, hidden=4096)])
    table = BlockTable.concat([LLAMA8B, draft_rows])
    draft = np.r_[np.zeros(len(LLAMA8B), bool), np.ones(len(draft_rows), bool)]
    rec = FP8
    base = "isl=1024,osl=1024,concurrency=1"
    plain = price_model(table, NB, H100, rec, [base], draft=draft)
    spec = price_model(table, NB, H100, rec, [base + ",draft_tokens=3,acceptance=3"],
                       draft=draft)
    nodraft = price_model(LLAMA8B, NB, H100, rec, [base])
    # without speculation the draft head only holds memory (its prefill of the prompt aside)
    np.testing.assert_allclose(plain.tpot_s, nodraft.tpot_s, rtol=1e-12)
    assert plain.weight_bytes > nodraft.weight_bytes
    # 3 accepted tokens per step: about a third of the time per token at batch 1 (a
    # verification step of 4 tokens still streams the dense weights once), plus 3 passes
    # of the one-layer draft head (~1/32 of the model each)
    assert 0.33 * plain.tpot_s[0] < spec.tpot_s[0] < 0.5 * plain.tpot_s[0]
    # more acceptance, less time per token; TTFT is the prompt's
    better = price_model(table, NB, H100, rec, [base + ",draft_tokens=3,acceptance=4"],
                         draft=draft)
    assert better.tpot_s[0] == pytest.approx(spec.tpot_s[0] * 3 / 4, rel=0.05)
    with pytest.raises(InputError, match="acceptance"):
        price_model(table, NB, H100, rec, [base + ",draft_tokens=2,acceptance=3.5"])


def test_attention_data_parallel_layout():
    rec = get_recipe("nvfp4-super")
    wl = ["isl=2048,osl=256,concurrency=64"]
    one = price_model(HYBRID, NB, H100, rec, wl, tp=1)
    dp1 = price_model(HYBRID, NB, H100, rec, wl, tp=1, attention_dp=True)
    for f in FIELDS:  # one GPU: nothing to split
        np.testing.assert_allclose(getattr(dp1, f), getattr(one, f), rtol=1e-12)
    tp8 = price_model(HYBRID, NB, H100, rec, wl, tp=8, ep=8)
    dp8 = price_model(HYBRID, NB, H100, rec, wl, tp=8, ep=8, attention_dp=True)
    # dense weights whole on every GPU, KV and state of 1/8 of the sequences each
    assert dp8.weight_bytes > tp8.weight_bytes
    kv_tp = tp8.kv_bytes[0]
    assert dp8.kv_bytes[0] == pytest.approx(one.kv_bytes[0] / 8)
    assert kv_tp > dp8.kv_bytes[0]  # 2 KV heads replicated over 8 GPUs under TP


def test_speculative_verify_commits_the_accepted_state_on_every_recurrent_kind(monkeypatch):
    """Mamba-2, Gated DeltaNet and Mamba-1 verification steps all pay the commit of the
    accepted state (``SPEC_STATE_COPY`` transfers): without it their decode time under drafts
    is lower, and a plain decode step does not depend on it."""
    import costmodels.blocks as cb

    rows = BlockTable.from_rows([
        MAMBA,
        dict(kind=Kind.DELTANET, hidden=4096, dn_k_heads=16, dn_v_heads=32, dn_k_dim=128,
             dn_v_dim=128, conv_kernel=4),
        dict(kind=Kind.MAMBA1, hidden=4096, m1_inner=8192, state=16, dt_rank=256,
             conv_kernel=4)])
    rec = get_recipe("bf16")
    wls = ["isl=1024,osl=1024,concurrency=64,draft_tokens=5,acceptance=3",
           "isl=1024,osl=1024,concurrency=64"]
    with_copy = price_blocks(rows, H100, rec, wls).decode_s
    monkeypatch.setattr(cb, "SPEC_STATE_COPY", 0.0)
    without = price_blocks(rows, H100, rec, wls).decode_s
    assert (with_copy[:, 0] > without[:, 0]).all()  # every kind, with drafts
    assert with_copy[:, 1] == pytest.approx(without[:, 1], rel=1e-12)  # plain decoding


def test_speculative_verify_keeps_a_state_per_draft_position_and_commits_the_accepted_one():
    """A Mamba verification step of ``1 + d`` tokens reads the state once, writes one
    snapshot per position (rollback) and copies the accepted one to the request's slot
    (TensorRT-LLM / SGLang); those snapshots also live in memory beside the state."""
    from costmodels import ops
    from costmodels.blocks import SPEC_STATE_COPY, _verify_state_bytes

    B, H, P, N, G, a, st = 64.0, 128.0, 64.0, 128.0, 8.0, 2.0, 4.0
    _, bs = ops.ssd_decode(B, H, P, N, G, a, st)
    state = B * H * P * N * st
    tokens_io = bs - 2.0 * state
    assert _verify_state_bytes(bs, state, np.float64(1.0)) == bs  # a plain decode step
    d = 5.0
    assert SPEC_STATE_COPY == 2.0
    assert _verify_state_bytes(bs, state, np.float64(1.0 + d)) == pytest.approx(
        tokens_io * (1.0 + d) + state * (1.0 + (1.0 + d) + 2.0))
    # memory: 1 + (1 + d) states per sequence with speculation, 1 without
    head = BlockTable.from_rows([dict(ATT, n_kv_heads=2), MOE, dict(kind=Kind.LINEAR,
                                                                    hidden=4096)])
    table = BlockTable.concat([HYBRID, head])
    draft = np.r_[np.zeros(len(HYBRID), bool), np.ones(len(head), bool)]
    rec = get_recipe("nvfp4-super")
    base = "isl=4096,osl=4096,concurrency=32"
    plain = price_model(table, NB, H100, rec, [base], draft=draft)
    spec = price_model(table, NB, H100, rec, [base + ",draft_tokens=5,acceptance=3"],
                       draft=draft)
    assert spec.state_bytes[0] == pytest.approx(plain.state_bytes[0] * 7)
    assert spec.memory_bytes[0] - plain.memory_bytes[0] == pytest.approx(
        6 * plain.state_bytes[0], rel=1e-9)


def test_a_measurement_taken_with_mtp_is_priced_with_the_mtp_head(tmp_path):
    """``draft_tokens`` / ``acceptance`` columns of a measurements CSV price the row with the
    config's MTP head as draft rows; a model without one is refused by name."""
    from costmodels.calibrate import load_measurements, predict
    from nas.cli.calibrate import shape_resolver

    repo = Path(__file__).resolve().parents[1]
    csv = tmp_path / "m.csv"
    head = ("id,split,gpu,model,precision,tp,ep,attention_dp,isl,osl,concurrency,slo,metric,"
            "value,engine,source,url,draft_tokens,acceptance\n")
    csv.write_text(head + "1,fit,b200,nemotron-3-super-120b-a12b,nvfp4-super,8,8,1,8192,8192,"
                   "256,,tpot_s,0.01,trtllm,a test row,,5,3.45\n"
                   "2,fit,b200,nemotron-3-super-120b-a12b,nvfp4-super,8,8,1,8192,8192,"
                   "256,,tpot_s,0.01,trtllm,a test row,\n"
                   "3,fit,b200,llama-3.1-70b,nvfp4,1,1,0,128,128,8,,tpot_s,0.01,trtllm,a row,,"
                   "3,2\n")
    spec, plain, llama = load_measurements(csv)
    assert (spec.draft_tokens, spec.acceptance, plain.draft_tokens, plain.acceptance) == (
        5, 3.45, 0, None)
    shapes = shape_resolver(csv, [str(repo / "costmodels/data/configs"),
                                  str(repo / "nas/examples/configs")])
    b200 = hwprofiles.get("b200")
    shape = shapes("nemotron-3-super-120b-a12b")
    table = BlockTable.concat([shape.table, shape.mtp_table])
    draft = np.r_[np.zeros(len(shape.table), bool), np.ones(len(shape.mtp_table), bool)]
    rec = get_recipe("nvfp4-super")
    wl = ["isl=8192,osl=8192,concurrency=256,draft_tokens=5,acceptance=3.45"]
    blocks = price_blocks(table, b200, rec, wl, tp=8, ep=8, attention_dp=True, draft=draft)
    nb = price_nonblock(shape.nonblock, b200, rec, wl, tp=8, attention_dp=True, draft=True,
                        engine="trtllm")
    assert predict(spec, shape, b200) == pytest.approx(
        summarize(blocks, nb, b200).tpot_s[0], rel=1e-12)
    assert predict(plain, shape, b200) > predict(spec, shape, b200)  # 3.45 tokens a step
    with pytest.raises(InputError, match="no MTP head"):
        predict(llama, shapes("llama-3.1-70b"), b200)
    bad = tmp_path / "bad.csv"
    bad.write_text(head + "1,fit,b200,x,fp8,1,1,0,1,2,,,throughput,1,,src,,5,\n")
    with pytest.raises(InputError, match="acceptance"):
        load_measurements(bad)


# -- arrival processes, engine scheduling (issue 30) -----------------------------------

def _arr(wl: str, engine: str = "trtllm"):
    from costmodels.serving import arrival_figures

    return arrival_figures(LLAMA8B, NB, H100, FP8, wl, engine=engine)


def test_poisson_ttft_at_a_trickle_is_one_prompt_plus_half_a_step():
    # one request at a time: its prompt's pass (as at concurrency 1), plus on average half
    # of the step under way when it arrives
    lone = price_model(LLAMA8B, NB, H100, FP8, ["isl=1000,osl=200,concurrency=1"])
    pt = _arr("isl=1000,osl=200,arrival=poisson,rate=0.001")
    assert pt.in_flight == pytest.approx(1.0)
    assert pt.utilization < 1e-3
    half_step = 0.5 * float(lone.tpot_s[0])
    assert pt.ttft_s == pytest.approx(float(lone.ttft_s[0]) + half_step, rel=0.05)


def test_poisson_queueing_grows_with_the_rate_and_obeys_littles_law():
    pts = [_arr(f"isl=1000,osl=200,arrival=poisson,rate={r}") for r in (1, 5, 20, 40)]
    ttft = [p.ttft_s for p in pts]
    assert all(a < b for a, b in zip(ttft, ttft[1:]))
    for p in pts:
        assert p.stable
        assert p.in_flight == pytest.approx(p.rate_per_s * p.latency_s, rel=0.02)
        # an open loop's throughput is its arrival rate times the output length
        assert p.throughput_tok_s == pytest.approx(p.rate_per_s * 200, rel=1e-6)


def test_poisson_past_the_prefill_capacity_is_unstable():
    pt = _arr("isl=8000,osl=10,arrival=poisson,rate=1000")
    assert not pt.stable and pt.ttft_s == float("inf")


def test_staggered_arrivals_at_concurrency_one_equal_the_closed_loop():
    closed = price_model(LLAMA8B, NB, H100, FP8, ["isl=500,osl=300,concurrency=1"])
    pt = _arr("isl=500,osl=300,concurrency=1,arrival=staggered")
    assert pt.ttft_s == pytest.approx(float(closed.ttft_s[0]), rel=0.02)
    assert pt.tpot_s == pytest.approx(float(closed.tpot_s[0]), rel=0.02)


def test_staggered_prompts_arrive_alone_and_wait_less_than_a_lockstep_wave():
    # 64 requests in lockstep prefill 64 prompts per cycle in full-budget steps; spread out,
    # each prompt rides a step of its own
    closed = price_model(LLAMA8B, NB, H100, FP8, ["isl=2000,osl=500,concurrency=64"])
    pt = _arr("isl=2000,osl=500,concurrency=64,arrival=staggered")
    assert pt.ttft_s < float(closed.ttft_s[0])
    assert pt.in_flight == 64


def test_prefill_steps_alone_stall_the_decodes():
    # SGLang's default (no mixed chunks): a prefill batch runs alone, so decodes wait for it
    mixed = price_model(LLAMA8B, NB, H100, FP8, ["isl=2000,osl=500,concurrency=64"])
    alone = price_model(LLAMA8B, NB, H100, FP8,
                        ["isl=2000,osl=500,concurrency=64,mixed_prefill=0"])
    assert alone.tpot_s[0] > mixed.tpot_s[0]
    # one request has no decodes to mix with: the same figures either way
    one = price_model(LLAMA8B, NB, H100, FP8, ["isl=2000,osl=500,concurrency=1",
                                               "isl=2000,osl=500,concurrency=1,mixed_prefill=0"])
    assert one.ttft_s[0] == pytest.approx(one.ttft_s[1])
    assert one.tpot_s[0] == pytest.approx(one.tpot_s[1])


def test_engine_limits_follow_each_engines_published_defaults():
    from costmodels.model import engine_limits

    b200, h200, a100 = (hwprofiles.get(n) for n in ("b200", "h200-sxm", "a100"))
    assert engine_limits(b200, "sglang") == {"mixed_prefill": False,
                                             "max_num_batched_tokens": 16384}
    assert engine_limits(h200, "sglang")["max_num_batched_tokens"] == 8192
    assert engine_limits(h200, "vllm") == {"mixed_prefill": True,
                                           "max_num_batched_tokens": 8192, "max_num_seqs": 1024}
    assert engine_limits(a100, "vllm")["max_num_batched_tokens"] == 2048  # A100 excluded
    assert engine_limits(h200, "trtllm")["max_num_seqs"] == 2048


def test_async_scheduling_is_read_at_the_engines_version():
    from costmodels.model import engine_figures

    assert engine_figures(H100, "vllm@0.16.0")[2] is True
    assert engine_figures(H100, "vllm@0.10.1")[2] is False
    assert engine_figures(H100, "sglang")[2] is True


def test_arrival_in_a_workload_string():
    from costmodels.workload import parse_workload

    w = parse_workload("isl=100,osl=10,arrival=poisson,qps=2.5")
    assert w.arrival == "poisson" and w.rate == 2.5 and w.concurrency == w.max_num_seqs
    with pytest.raises(InputError):
        parse_workload("isl=100,osl=10,concurrency=4,rate=2")
    with pytest.raises(InputError):
        parse_workload("isl=100,osl=10,batch=4,arrival=staggered")


@pytest.mark.parametrize("wl", ["isl=128,osl=128,concurrency=1", "isl=20000,osl=2000,concurrency=1",
                                "isl=8192,osl=1024,concurrency=1,draft_tokens=3,acceptance=2.5",
                                "isl=20000,osl=2000,concurrency=1,max_num_batched_tokens=16384"])
def test_max_concurrency_fits_in_summarize_by_construction(wl):
    # one workspace (costmodels.model.step_workspace_bytes): the largest concurrency that
    # max_concurrency returns fits as summarize counts memory, and one more does not
    from costmodels.workload import parse_workload

    w = parse_workload(wl + ",max_num_seqs=100000000")  # memory binds, not the engine's cap
    for table in (LLAMA8B, HYBRID):
        draft = None
        if w.draft_tokens:
            table = BlockTable.concat([table, BlockTable.from_rows([ATT, FFN])])
            draft = np.r_[np.zeros(len(table) - 2, bool), np.ones(2, bool)]
        kw = dict(draft=draft)
        b1 = price_blocks(table, H100, FP8, [w], **kw)
        nb1 = price_nonblock(NB, H100, FP8, [w], draft=draft is not None)
        n = max_concurrency(b1, nb1, H100, w.max_context, workload=w).max_concurrency
        assert n >= 1
        wls = [w.with_sequences(n), w.with_sequences(n + 1)]
        m = summarize(price_blocks(table, H100, FP8, wls, **kw),
                      price_nonblock(NB, H100, FP8, wls, draft=draft is not None), H100)
        assert m.fits.tolist() == [True, False]


def test_the_workspace_holds_the_engines_own_token_budget():
    # one step's prompt tokens are at most the engine's max_num_batched_tokens (SGLang's
    # 16,384 on B200, 8,192 by default): a budget twice as large holds twice the prompt
    # tokens' activations, and a prompt shorter than both holds the same
    from costmodels.model import workload_workspace_bytes
    from costmodels.workload import parse_workload

    def ws(text):
        wls = [parse_workload(text)]
        return float(workload_workspace_bytes(price_blocks(LLAMA8B, H100, FP8, wls),
                                              price_nonblock(NB, H100, FP8, wls))[0])

    small, big = (ws(f"isl=32768,osl=16,concurrency=1,max_num_batched_tokens={n}")
                  for n in (8192, 16384))
    logits = 4.0 * NB.vocab  # one request's fp32 logit row
    assert big - logits == pytest.approx(2 * (small - logits), rel=1e-12)
    assert ws("isl=4096,osl=16,concurrency=1,max_num_batched_tokens=16384") == \
        ws("isl=4096,osl=16,concurrency=1")
    # summarize and max_concurrency count the same, engine-sized workspace
    w = parse_workload("isl=32768,osl=16,concurrency=1,max_num_batched_tokens=16384")
    b1 = price_blocks(LLAMA8B, H100, FP8, [w])
    nb1 = price_nonblock(NB, H100, FP8, [w])
    c = max_concurrency(b1, nb1, H100, w.max_context, workload=w)
    # at its n requests: the 16,384 prompt tokens and n logit rows
    assert c.workspace_bytes == pytest.approx(big + (c.max_concurrency - 1) * logits,
                                              rel=1e-12)


def test_arrivals_and_the_replay_admit_the_same_requests():
    # one count of the slots (costmodels.serving.admitted_slots): the open loop's capacity
    # and the replay's admission stop at the same number of requests
    from costmodels.replay import replay
    from costmodels.serving import arrival_figures

    wl = "isl=20000,osl=64,arrival=poisson,rate=1000"  # overloaded; memory caps the slots
    pt = arrival_figures(LLAMA8B, NB, H100, FP8, wl)
    rp = replay(LLAMA8B, NB, H100, FP8, wl, requests=200)
    assert pt.slots == rp.slots >= 1
    assert not pt.stable and rp.overloaded


def test_cli_cost_names_an_engine_and_an_arrival_process(capsys):
    # `cost --engine NAME` prices with that engine's overheads, scheduling and dtypes;
    # `--arrival poisson --rate R` with the open-loop queueing model
    import json as _json

    from conftest import LLAMA

    from nas.cli import main

    def cost(*extra: str) -> dict:
        rc = main(["cost", str(LLAMA), "--hw", "h100-sxm", "--precision", "fp8", "--workload",
                   "isl=1000,osl=200,concurrency=32", "--json", *extra])
        assert rc == 0
        return _json.loads(capsys.readouterr().out)

    base = cost()["workloads"][0]
    sg = cost("--engine", "sglang")
    assert sg["engine"] == "sglang" and sg["workloads"][0]["ttft_s"] != base["ttft_s"]
    slow, fast = (cost("--engine", "vllm@0.16.0", "--arrival", "poisson", "--rate", str(r))
                  ["workloads"][0] for r in (2, 15))  # 32 slots serve ~19 req/s
    assert slow["arrival"]["rate_per_s"] == 2 and slow["ttft_s"] < fast["ttft_s"]
    assert slow["throughput_tok_s"] == pytest.approx(2 * 200)
    assert main(["cost", str(LLAMA), "--hw", "h100-sxm", "--workload",
                 "isl=10,osl=10,concurrency=1", "--rate", "3"]) == 2


def test_a_spec_names_its_serving_engine():
    # hardware.engine in a spec: the engine's scheduling defaults reach every workload that
    # does not set them, and an unknown name is refused when the spec is read
    import json as _json

    from pydantic import ValidationError

    from nas.search import resolve
    from nas.spec import HardwareSpec, SearchSpec

    ex = Path(__file__).resolve().parents[1] / "nas" / "examples"
    data = _json.loads((ex / "deepseek-v3-8xh200.json").read_text())
    plain = resolve(SearchSpec.model_validate(data), ex)
    data["hardware"]["engine"] = "sglang"
    sg = resolve(SearchSpec.model_validate(data), ex)
    assert plain.engine is None and sg.engine == "sglang"
    assert all(w.mixed_prefill for w in plain.workloads.values())
    assert not any(w.mixed_prefill for w in sg.workloads.values())  # SGLang: prefill alone
    with pytest.raises(ValidationError, match="unknown serving engine"):
        HardwareSpec(profile="h100-sxm", engine="nope")


def test_sglang_runs_mamba_hybrids_without_its_overlap_scheduler():
    # SGLang's Mamba radix cache (no_buffer) turns the overlap scheduler off for Nemotron-H
    # (ServerArgs._handle_mamba_radix_cache; the rule and its source in the engine profile):
    # a step of a model with a Mamba-2 block costs GPU + host, one without max(GPU, host);
    # with speculative decoding SGLang drops the radix cache instead and overlap stays
    from costmodels.blocks import no_overlap_rows
    from hwprofiles.engines import get_engine

    sg = get_engine("sglang")
    so = sg.step_overhead_s.value
    assert so > 0 and sg.overlap and sg.no_overlap and "https://" in sg.no_overlap[0].source
    wl = ["isl=128,osl=64,concurrency=1"]
    small_att = BlockTable.from_rows([dict(ATT, hidden=512, n_heads=4, n_kv_heads=1)])
    small_mix = BlockTable.from_rows([dict(ATT, hidden=512, n_heads=4, n_kv_heads=1),
                                      dict(MAMBA, hidden=512, m_heads=8, groups=1)])
    nb = NonBlockShape(hidden=512, vocab=1000)

    def tpot(table, step):  # decode step seconds, host step `step` (None: the engine's)
        b = price_blocks(table, H100, FP8, wl, engine="sglang")
        n = price_nonblock(nb, H100, FP8, wl, engine="sglang", step_overhead_s=step)
        return float(summarize(b, n, H100).tpot_s[0])

    for table, overlaps in ((small_att, True), (small_mix, False)):
        gpu = tpot(table, 0.0)
        assert gpu < so  # a tiny model: the host step is the longer one
        want = max(gpu, so) if overlaps else gpu + so
        assert tpot(table, None) == pytest.approx(want, rel=1e-6)
    flags = no_overlap_rows(small_mix, "sglang", wl + ["isl=128,osl=64,concurrency=1,"
                                                       "draft_tokens=2,acceptance=2"])
    assert flags.tolist() == [[False, False], [True, False]]  # the Mamba row, plain decoding
    assert no_overlap_rows(small_mix, "trtllm", wl) is None  # TensorRT-LLM has no such rule
    bad = sg.model_copy(update={"no_overlap": [sg.no_overlap[0].model_copy(
        update={"kinds": ["mamba3"]})]})
    with pytest.raises(InputError, match="mamba3"):
        no_overlap_rows(small_mix, "sglang", wl, engines={"sglang": bad})


def test_per_request_host_time_is_shared_by_the_attention_dp_ranks():
    # each attention data-parallel rank runs its own engine loop over its own requests, so a
    # cycle of B requests costs B / dp * r host seconds on the critical path, not B * r
    wl = ["isl=128,osl=128,concurrency=64"]
    r = 1e-3

    def host(dp: bool) -> float:
        kw = dict(tp=8, attention_dp=dp, step_overhead_s=0.0)
        with_r = price_nonblock(NB, H100, FP8, wl, request_overhead_s=r, **kw)
        without = price_nonblock(NB, H100, FP8, wl, request_overhead_s=0.0, **kw)
        return float(with_r.runtime_s[0] - without.runtime_s[0])

    assert host(False) == pytest.approx(64 * r)
    assert host(True) == pytest.approx(64 / 8 * r)


def test_arrivals_honour_the_engines_no_overlap_rules():
    # staggered arrivals (sglang.bench_serving) price a Mamba hybrid's steps as GPU + host
    # under SGLang's rule, and as max(GPU, host) with the rule taken out of its profile
    from costmodels.serving import arrival_figures
    from hwprofiles.engines import get_engine
    from hwprofiles.schema import Figure

    sg = get_engine("sglang")
    table = BlockTable.from_rows([dict(ATT, hidden=512, n_heads=4, n_kv_heads=1),
                                  dict(MAMBA, hidden=512, m_heads=8, groups=1)])
    nb = NonBlockShape(hidden=512, vocab=1000)
    wl = "isl=128,osl=64,concurrency=4,arrival=staggered"

    def tpot(prof):
        return arrival_figures(table, nb, H100, FP8, wl, engine="sglang",
                               engines={"sglang": prof}).tpot_s

    so = sg.step_overhead_s.value
    gpu = tpot(sg.model_copy(update={"step_overhead_s": Figure(value=0.0, source="test")}))
    ruled, free = tpot(sg), tpot(sg.model_copy(update={"no_overlap": []}))
    assert 0 < gpu < so
    assert ruled == pytest.approx(gpu + so, rel=1e-3)  # the host step is not hidden
    assert free == pytest.approx(max(gpu, so), rel=1e-3)
