"""The scheduler replay (issue 50, part 2): ``costmodels.replay`` against the closed forms
it shares its step times with (``costmodels.model``'s lockstep cycle and
``costmodels.serving.arrival_figures``), and the behaviour a user relies on.

Tolerances are stated where they are used; the measured gaps they cover are in
docs/serving-model.md (The scheduler replay).
"""

from __future__ import annotations

import functools
import json

import pytest
from conftest import LLAMA, llama_fp8_h100

from hwprofiles.errors import InputError
from nas.cli import main

# the issue's case: Llama-3.1-8B FP8 on one H100 under TensorRT-LLM, 64 slots
ISSUE = "isl=1024,osl=256,concurrency=64"


def _model():
    return llama_fp8_h100()


def _replay(wl: str, **kw):
    from costmodels.replay import replay

    table, shape, hw, recipe = _model()
    return replay(table, shape, hw, recipe, wl, engine="trtllm", **kw)


@functools.cache
def _point(wl: str):
    from costmodels.serving import arrival_figures

    table, shape, hw, recipe = _model()
    return arrival_figures(table, shape, hw, recipe, wl, engine="trtllm")


def _closed_form(wl: str):
    from costmodels.blocks import price_blocks
    from costmodels.model import price_nonblock, summarize
    from costmodels.workload import parse_workload

    table, shape, hw, recipe = _model()
    w = [parse_workload(wl)]
    return summarize(price_blocks(table, hw, recipe, w, engine="trtllm"),
                     price_nonblock(shape, hw, recipe, w, engine="trtllm"), hw)


# -- (1) a closed lockstep loop is the closed-form cycle -----------------------------------

def test_unlimited_budget_lockstep_is_the_static_cycle():
    # n_c = 1: all 64 prompts in one step, then 255 decode steps, exactly the cycle of
    # costmodels.model. The cycle (latency, throughput) agrees to 0.5 %; the host's
    # per-request seconds sit in TTFT in the replay (the step that finishes the prompts)
    # and are spread over TPOT by the closed form, hence 5 % / 3 % there.
    wl = f"{ISSUE},max_num_batched_tokens=1000000"
    m, r = _closed_form(wl), _replay(wl, requests=640)
    assert r.throughput_tok_s == pytest.approx(m.throughput_tok_s[0], rel=0.005)
    assert r.latency_s.mean == pytest.approx(m.latency_s[0], rel=0.005)
    assert r.ttft_s.mean == pytest.approx(m.ttft_s[0], rel=0.05)
    assert r.tpot_s.mean == pytest.approx(m.tpot_s[0], rel=0.03)
    assert not r.overloaded and r.rate_per_s is None


def test_chunked_lockstep_keeps_the_cycle():
    # the engine's default budget (8,192 tokens: 8 prompts a step). The replay counts each
    # decode against the budget (vLLM v1, TensorRT-LLM), so a group's last prompt spills
    # into the next step and the groups shift: throughput and TPOT stay within 1 % / 2 %
    # of the cycle, the mean TTFT is 9 % under the closed form's one full mixed step
    m, r = _closed_form(ISSUE), _replay(ISSUE, requests=1280)
    assert r.throughput_tok_s == pytest.approx(m.throughput_tok_s[0], rel=0.01)
    assert r.tpot_s.mean == pytest.approx(m.tpot_s[0], rel=0.02)
    assert 0.8 * m.ttft_s[0] < r.ttft_s.mean < 1.02 * m.ttft_s[0]


# -- (2) Poisson at low load agrees with arrival_figures ------------------------------------

def test_poisson_low_load_agrees_with_the_analytic_figures():
    # at 21 % and 64 % of capacity nobody waits for a slot; the replay's mean TTFT and
    # TPOT agree with arrival_figures within 10 % and 3 %, the served rate within 3 %
    # (a finite run's arrivals), and the wait grows with the rate
    out = []
    for rate in (5, 15):
        a, r = _point(f"{ISSUE},arrival=poisson,rate={rate}"), \
            _replay(f"{ISSUE},arrival=poisson,rate={rate}", requests=3000)
        assert r.ttft_s.mean == pytest.approx(a.ttft_s, rel=0.10)
        assert r.tpot_s.mean == pytest.approx(a.tpot_s, rel=0.03)
        assert r.served_per_s == pytest.approx(rate, rel=0.03)
        assert r.in_flight == pytest.approx(a.in_flight, rel=0.05)
        assert not r.overloaded
        out.append(r)
    near = _replay(f"{ISSUE},arrival=poisson,rate=22", requests=3000)
    assert out[0].ttft_s.mean < out[1].ttft_s.mean < near.ttft_s.mean
    assert out[0].ttft_s.p99 < out[1].ttft_s.p99 < near.ttft_s.p99
    assert near.queue_wait_s.mean > 10 * out[1].queue_wait_s.mean
    assert out[0].tpot_s.mean < out[1].tpot_s.mean < near.tpot_s.mean


# -- (3) overload ----------------------------------------------------------------------------

def test_overload_serves_the_capacity_and_says_so():
    cap = _point(f"{ISSUE},arrival=poisson,rate=1").capacity_per_s
    hi = _replay(f"{ISSUE},arrival=poisson,rate={2 * cap:.4f}", requests=3000)
    lo = _replay(f"{ISSUE},arrival=poisson,rate={0.5 * cap:.4f}", requests=3000)
    assert hi.overloaded and not lo.overloaded
    assert hi.served_per_s == pytest.approx(cap, rel=0.03)
    assert hi.in_flight == pytest.approx(64, rel=0.01)
    assert hi.queued > 100 and hi.queue_growth > 100
    assert hi.message().startswith("overloaded (replay of 3,000 requests): offered ")
    assert lo.served_per_s == pytest.approx(0.5 * cap, rel=0.05)
    assert "overloaded" not in lo.message()
    json.dumps(hi.to_dict(), allow_nan=False)


# -- (4) fixed-rate arrivals wait less than Poisson ------------------------------------------

def test_fixed_rate_waits_less_than_poisson():
    cap = _point(f"{ISSUE},arrival=poisson,rate=1").capacity_per_s
    rate = f"{0.9 * cap:.4f}"
    fixed = _replay(f"{ISSUE},arrival=fixed,rate={rate}", requests=3000)
    poisson = _replay(f"{ISSUE},arrival=poisson,rate={rate}", requests=3000)
    assert fixed.queue_wait_s.mean < poisson.queue_wait_s.mean
    assert fixed.ttft_s.mean < poisson.ttft_s.mean
    assert fixed.ttft_s.p99 < poisson.ttft_s.p99
    assert fixed.queue_wait_s.p99 == 0.0  # evenly spaced arrivals never find the slots full


# -- (5) a seed makes a replay reproducible --------------------------------------------------

def test_a_seed_reproduces_the_replay():
    wl = f"{ISSUE},arrival=poisson,rate=20"
    a, b = _replay(wl, requests=1000, seed=7), _replay(wl, requests=1000, seed=7)
    c = _replay(wl, requests=1000, seed=8)
    assert a.to_dict() == b.to_dict()
    assert a.ttft_s != c.ttft_s


# -- (6) bad input ---------------------------------------------------------------------------

@pytest.mark.parametrize("wl,kw,needle", [
    (f"{ISSUE},arrival=poisson,rate=5", {"rate": 0.0}, "rate: expected requests/s > 0"),
    (f"{ISSUE},arrival=poisson,rate=5", {"rate": -3.0}, "rate: expected requests/s > 0"),
    (f"{ISSUE},arrival=poisson,rate=5", {"requests": 0}, "requests: expected a positive"),
    (f"{ISSUE},arrival=poisson,rate=0", {}, "field rate"),
    (ISSUE, {"rate": 5.0}, "rate: a rate goes with arrival poisson or fixed"),
    ("isl=1024,osl=256,batch=8", {}, "workload: a replay runs continuous batching"),
    (f"{ISSUE},arrival=poisson,rate=5", {"warmup": 1.0}, "warmup: expected a share"),
])
def test_bad_input_names_the_field(wl, kw, needle):
    with pytest.raises(InputError) as ei:
        _replay(wl, **kw)
    assert needle in str(ei.value)


# -- the other arrivals and engines ----------------------------------------------------------

def test_staggered_loop_serves_the_analytic_rate():
    a = _point(f"{ISSUE},arrival=staggered")
    r = _replay(f"{ISSUE},arrival=staggered", requests=1280)
    assert r.served_per_s == pytest.approx(a.served_per_s, rel=0.01)
    assert r.tpot_s.mean == pytest.approx(a.tpot_s, rel=0.02)
    # spread out, each prompt comes alone into a step of decodes: one mixed step, not the
    # lockstep's group of 8
    assert r.ttft_s.mean < 0.3 * _closed_form(ISSUE).ttft_s[0]


def test_an_engine_that_does_not_mix_stalls_the_decodes():
    # prefill steps alone (SGLang's default): at the same load the decodes wait for every
    # prompt step, so TPOT is longer than with mixed steps
    wl = f"{ISSUE},arrival=poisson,rate=15"
    mixed = _replay(wl, requests=2000)
    alone = _replay(f"{wl},mixed_prefill=0", requests=2000)
    assert alone.tpot_s.mean > mixed.tpot_s.mean
    assert alone.tpot_s.p99 > 1.1 * alone.tpot_s.p50  # the steps a prompt stalls


def test_warmup_requests_are_left_out():
    r = _replay(f"{ISSUE},arrival=poisson,rate=5", requests=1000, warmup=0.3)
    assert (r.warmup, r.counted) == (300, 700)
    assert _replay(ISSUE, requests=100).warmup == 64  # a closed loop's first wave at least


# -- the CLI ---------------------------------------------------------------------------------

def _cost(*extra: str, workload: str = ISSUE) -> list[str]:
    return ["cost", str(LLAMA), "--hw", "h100-sxm", "--precision", "fp8", "--engine", "trtllm",
            "--workload", workload, *extra]


def test_cli_prints_the_replay_beside_the_analytic_figures(capsys):
    assert main(_cost("--arrival", "poisson", "--rate", "15", "--replay", "1000")) == 0
    out = capsys.readouterr().out
    assert "poisson arrivals at 15 req/s: load " in out  # the analytic line stays
    line = next(ln for ln in out.splitlines() if "replay of 1,000 poisson requests" in ln)
    assert "served" in line
    assert "TTFT p50/p90/p99" in out and "TPOT p50/p90/p99" in out
    assert main(_cost("--arrival", "poisson", "--rate", "60", "--replay", "1000")) == 0
    out = capsys.readouterr().out
    assert "overloaded (replay of 1,000 requests)" in out


def test_cli_json_has_the_replay(capsys):
    assert main(_cost("--arrival", "poisson", "--rate", "60", "--replay", "1000",
                      "--json")) == 0
    w = json.loads(capsys.readouterr().out)["workloads"][0]
    rp = w["replay"]
    assert rp["overloaded"] is True and w["arrival"]["overloaded"] is True
    assert rp["served_per_s"] == pytest.approx(w["arrival"]["capacity_per_s"], rel=0.03)
    assert set(rp["ttft_s"]) == {"mean", "p50", "p90", "p99"}
    assert rp["requests"] == 1000


def test_cli_replays_a_closed_loop(capsys):
    assert main(_cost("--replay", "2000", "--json")) == 0
    w = json.loads(capsys.readouterr().out)["workloads"][0]
    assert w["replay"]["arrival"] == "closed" and w["replay"]["overloaded"] is False
    assert w["replay"]["throughput_tok_s"] == pytest.approx(w["throughput_tok_s"], rel=0.015)


@pytest.mark.parametrize("extra,workload,needle", [
    (["--replay", "0"], ISSUE, "--replay: expected a positive number of requests"),
    (["--replay", "100"], "isl=1024,osl=256,batch=8",
     "--replay: a replay runs continuous batching"),
    (["--arrival", "poisson", "--rate", "5", "--replay", "100", "--replay-seed", "-1"], ISSUE,
     "--replay-seed: expected an integer >= 0"),
    (["--replay-seed", "3"], ISSUE, "--replay-seed needs --replay N"),
])
def test_cli_bad_replay_values_are_one_line_errors(capsys, extra, workload, needle):
    assert main(_cost(*extra, workload=workload)) == 2
    err = capsys.readouterr().err
    lines = [ln for ln in err.strip().splitlines() if ln.strip()]
    assert len(lines) == 1 and "Traceback" not in err, err
    assert needle in lines[0], lines[0]
