"""Open-loop arrivals into a finite number of slots (issue 50, part 1): the queue for a
slot, the overload fix, and arrivals in specs.

The queue figures are checked against independent computations: textbook closed forms
(Erlang C by its explicit sum, Pollaczek-Khinchine for M/D/1 and M/M/1) and a seeded
discrete-event simulation of ``c`` first-come-first-served slots.
"""

from __future__ import annotations

import heapq
import json
import math
from pathlib import Path

import numpy as np
import pytest
from conftest import LLAMA, llama_fp8_h100

from costmodels.queueing import erlang_c, gc_wait, mmc_wait
from hwprofiles.errors import InputError
from nas.cli import main

REPO = Path(__file__).resolve().parents[1]
SPEC = REPO / "nas" / "examples" / "llama3.1-8b-h100.json"

# the issue's case: Llama-3.1-8B FP8 on one H100 under TensorRT-LLM, 64 slots
ISSUE = "isl=1024,osl=256,concurrency=64"


# -- textbook values -----------------------------------------------------------------------

def _erlang_c_sum(c: int, a: float) -> float:
    """Erlang C by its explicit sum (Kleinrock 1975, M/M/m): independent of the
    Erlang-B recursion the library uses."""
    top = a**c / math.factorial(c) * c / (c - a)
    return top / (sum(a**k / math.factorial(k) for k in range(c)) + top)


@pytest.mark.parametrize("c,a", [(1, 0.3), (2, 1.0), (4, 3.2), (10, 7.0), (30, 27.5)])
def test_erlang_c_matches_the_explicit_sum(c, a):
    assert erlang_c(c, a) == pytest.approx(_erlang_c_sum(c, a), rel=1e-12)


def test_erlang_c_closed_forms_and_limits():
    assert erlang_c(1, 0.7) == pytest.approx(0.7)  # M/M/1: P(wait) = rho
    rho = 0.5
    assert erlang_c(2, 2 * rho) == pytest.approx(2 * rho**2 / (1 + rho))  # M/M/2
    assert erlang_c(4, 4.0) == 1.0 and erlang_c(4, 9.0) == 1.0  # unstable: everyone waits
    # thousands of slots: the recursion stays finite where a**c / c! overflows
    assert 0.0 <= erlang_c(4096, 4000.0) <= 1.0
    with pytest.raises(ValueError):
        erlang_c(0, 1.0)
    with pytest.raises(ValueError):
        erlang_c(2, math.nan)


@pytest.mark.parametrize("rho", [0.2, 0.5, 0.9])
def test_single_slot_is_pollaczek_khinchine(rho):
    s = 2.0
    lam = rho / s
    # M/D/1 and M/M/1 mean waits (Pollaczek-Khinchine)
    assert gc_wait(1, lam, s, ca2=1.0, cs2=0.0) == pytest.approx(rho * s / (2 * (1 - rho)),
                                                                 rel=1e-12)
    assert gc_wait(1, lam, s, ca2=1.0, cs2=1.0) == pytest.approx(rho * s / (1 - rho), rel=1e-12)
    assert mmc_wait(1, lam, s) == pytest.approx(rho * s / (1 - rho), rel=1e-12)


def test_an_unstable_queue_waits_forever():
    assert gc_wait(8, 4.0, 2.0) == math.inf  # a = 8 = c
    assert mmc_wait(8, 5.0, 2.0) == math.inf
    assert gc_wait(8, 0.0, 2.0) == 0.0


# -- a discrete-event simulation of the slots ----------------------------------------------

def _simulate(c: int, rate: float, service_s: float, n: int, seed: int,
              fixed: bool = False) -> float:
    """Mean wait for a slot of ``n`` requests arriving at ``rate`` (Poisson, or evenly
    spaced with ``fixed``) into ``c`` FCFS slots each held ``service_s`` seconds."""
    rng = np.random.default_rng(seed)
    gaps = np.full(n, 1.0 / rate) if fixed else rng.exponential(1.0 / rate, n)
    free = [0.0] * c
    total = 0.0
    for t in np.cumsum(gaps):
        start = max(float(t), heapq.heappop(free))
        total += start - float(t)
        heapq.heappush(free, start + service_s)
    return total / n


@pytest.mark.parametrize("c,rho", [(2, 0.8), (4, 0.5), (4, 0.8), (8, 0.85)])
def test_md_c_wait_matches_a_simulation(c, rho):
    # Poisson arrivals, fixed service (fixed lengths): Allen-Cunneen with Cosmetatos'
    # correction against the simulated slots (seeded: the same figures every run)
    s = 1.0
    lam = rho * c / s
    sim = np.mean([_simulate(c, lam, s, 60_000, seed) for seed in range(3)])
    assert gc_wait(c, lam, s, ca2=1.0, cs2=0.0) == pytest.approx(sim, rel=0.06)
    # the uncorrected Allen-Cunneen figure (half the M/M/c wait) is further off below
    # rho = 0.8 on 4 or more slots, which is why the correction is in
    if c >= 4 and rho <= 0.8:
        half = 0.5 * mmc_wait(c, lam, s)
        assert abs(half / sim - 1) > abs(gc_wait(c, lam, s) / sim - 1)


def test_fixed_rate_arrivals_never_wait_below_capacity():
    assert _simulate(4, 3.9, 1.0, 5_000, 0, fixed=True) == 0.0
    assert gc_wait(4, 3.9, 1.0, ca2=0.0, cs2=0.0) == 0.0


# -- the serving model ---------------------------------------------------------------------

def _model():
    return llama_fp8_h100()


def _point(wl: str, **kw):
    from costmodels.serving import arrival_figures

    table, shape, hw, recipe = _model()
    return arrival_figures(table, shape, hw, recipe, wl, engine="trtllm", **kw)


@pytest.mark.parametrize("rate", [60, 500])
def test_overload_reports_what_the_slots_serve(rate):
    # the issue: at rate 60 the old model said 'stable' with 9.7 req/s served; at 500 it
    # printed the offered load (128,000 tok/s/GPU) and a TPOT of 7.7e9 ms
    pt = _point(f"{ISSUE},arrival=poisson,rate={rate}")
    full = _point(f"{ISSUE},arrival=staggered")  # every slot busy, one admitted as one ends
    assert not pt.stable and pt.overloaded and pt.utilization > 1
    assert pt.capacity_per_s == pytest.approx(full.rate_per_s, rel=1e-12)
    assert pt.capacity_per_s < rate
    assert pt.served_per_s == pt.capacity_per_s
    assert pt.throughput_tok_s == pytest.approx(pt.capacity_per_s * 256)
    assert pt.throughput_tok_s < rate * 256
    assert pt.tpot_s == pytest.approx(full.tpot_s, rel=1e-12) and pt.tpot_s < 0.1
    assert pt.in_flight == pt.slots == 64
    # Little's law at full slots: capacity x the time a request holds a slot = the slots
    admitted_latency = pt.admitted_ttft_s + 255 * pt.tpot_s
    assert pt.capacity_per_s * admitted_latency == pytest.approx(64, rel=1e-3)
    assert math.isinf(pt.ttft_s) and math.isinf(pt.latency_s) and math.isinf(pt.queue_wait_s)
    d = pt.to_dict()
    assert d["ttft_s"] is None and d["latency_s"] is None and d["queue_wait_s"] is None
    assert d["message"].startswith(f"overloaded: offered {rate} req/s, serves at most ")
    json.dumps(d, allow_nan=False)  # no Infinity in the JSON


def test_the_capacity_does_not_depend_on_the_offered_rate():
    a, b = (_point(f"{ISSUE},arrival=poisson,rate={r}") for r in (30, 3000))
    assert a.capacity_per_s == b.capacity_per_s and a.tpot_s == b.tpot_s
    assert a.throughput_tok_s == b.throughput_tok_s


def test_below_capacity_the_wait_for_a_slot_enters_ttft():
    cap = _point(f"{ISSUE},arrival=poisson,rate=1").capacity_per_s
    pts = [_point(f"{ISSUE},arrival=poisson,rate={f * cap:.6f}") for f in (0.3, 0.9, 0.99)]
    for pt in pts:
        assert pt.stable and pt.slots == 64
        rho = pt.rate_per_s / pt.capacity_per_s
        # M/D/c with 64 slots each held 64 / capacity seconds, by the textbook sum
        s = 64 / pt.capacity_per_s
        a = pt.rate_per_s * s
        mmc = _erlang_c_sum(64, a) * s / (64 - a)
        delta = (1 - rho) * 63 * (math.sqrt(4 + 5 * 64) - 2) / (16 * rho * 64)
        assert pt.queue_wait_s == pytest.approx(0.5 * mmc * (1 + delta), rel=1e-9)
        assert pt.ttft_s == pytest.approx(pt.admitted_ttft_s + pt.queue_wait_s, rel=1e-12)
        assert pt.queued == pytest.approx(pt.rate_per_s * pt.queue_wait_s)
        assert pt.throughput_tok_s == pytest.approx(pt.rate_per_s * 256)
        assert pt.in_flight <= 64
    ttft = [p.ttft_s for p in pts]
    assert ttft[0] < ttft[1] < ttft[2]
    assert pts[2].queue_wait_s > 10 * pts[1].queue_wait_s > 0  # the knee near capacity


def test_the_model_wait_matches_a_simulation_of_its_slots():
    # 8 slots at 85 % load: the model's wait against the slots simulated with the service
    # time the model holds a slot for (8 / capacity)
    cap = _point("isl=1024,osl=256,concurrency=8,arrival=poisson,rate=1").capacity_per_s
    rate = 0.85 * cap
    pt = _point(f"isl=1024,osl=256,concurrency=8,arrival=poisson,rate={rate:.6f}")
    assert pt.slots == 8
    sim = np.mean([_simulate(8, pt.rate_per_s, 8 / pt.capacity_per_s, 60_000, seed)
                   for seed in range(3)])
    assert pt.queue_wait_s == pytest.approx(sim, rel=0.06)


def test_fixed_rate_arrivals_wait_for_no_slot():
    cap = _point(f"{ISSUE},arrival=fixed,rate=1").capacity_per_s
    fixed = _point(f"{ISSUE},arrival=fixed,rate={0.95 * cap:.6f}")
    poisson = _point(f"{ISSUE},arrival=poisson,rate={0.95 * cap:.6f}")
    assert fixed.stable and fixed.queue_wait_s == 0.0 and poisson.queue_wait_s > 0.0
    assert fixed.ttft_s < poisson.ttft_s
    assert fixed.capacity_per_s == poisson.capacity_per_s
    assert not _point(f"{ISSUE},arrival=fixed,rate={1.01 * cap:.6f}").stable


def test_slots_are_capped_by_the_kv_cache():
    # no concurrency: the engine's max_num_seqs (2048) caps the slots, and at 201k tokens
    # a request the KV cache holds far fewer; the slots are the most that fit
    from costmodels.blocks import price_blocks
    from costmodels.model import price_nonblock, summarize
    from costmodels.workload import parse_workload

    pt = _point("isl=200000,osl=1000,arrival=poisson,rate=0.01")
    assert 1 <= pt.slots < 64
    table, shape, hw, recipe = _model()
    w = parse_workload("isl=200000,osl=1000,concurrency=1")
    wls = [w.with_sequences(pt.slots), w.with_sequences(pt.slots + 1)]
    m = summarize(price_blocks(table, hw, recipe, wls, engine="trtllm"),
                  price_nonblock(shape, hw, recipe, wls, engine="trtllm"), hw)
    assert m.fits.tolist() == [True, False]
    # holding more memory back leaves fewer slots
    fewer = _point("isl=200000,osl=1000,arrival=poisson,rate=0.01", reserve_bytes=20e9)
    assert fewer.slots < pt.slots


# -- workloads and specs -------------------------------------------------------------------

def test_workload_strings_take_fixed_arrivals_and_name_bad_fields():
    from costmodels.workload import parse_workload

    w = parse_workload("isl=10,osl=10,concurrency=4,arrival=fixed,qps=3")
    assert (w.arrival, w.rate, w.open_loop) == ("fixed", 3.0, True)
    with pytest.raises(InputError, match="rate"):
        parse_workload("isl=10,osl=10,concurrency=4,arrival=fixed")
    with pytest.raises(InputError, match="arrival"):
        parse_workload("isl=10,osl=10,concurrency=4,arrival=bursty,rate=3")
    with pytest.raises(InputError, match="unknown key 'qpm'.*qps"):
        parse_workload("isl=10,osl=10,concurrency=4,qpm=3")


def _spec(**workload: object) -> dict:
    spec = json.loads(SPEC.read_text())
    spec["parent"] = str(LLAMA)
    spec["workloads"]["chat"] = {"isl": 128, "osl": 1024, "concurrency": 64, **workload}
    spec["solver"].pop("sweep", None)
    return spec


def test_a_spec_workload_takes_arrivals():
    from nas.search import resolve
    from nas.spec import parse_spec

    for key in ("rate", "qps"):  # qps: an alias, as in workload strings
        spec = parse_spec(_spec(arrival="poisson", **{key: 12.5}))
        assert spec.workloads["chat"].rate == 12.5
    # the search receives the arrival process; closed stays the default
    problem = resolve(parse_spec(_spec(arrival="fixed", rate=4)), ".")
    chat = problem.workloads["chat"]
    assert (chat.arrival, chat.rate, chat.concurrency) == ("fixed", 4.0, 64)
    assert resolve(parse_spec(_spec()), ".").workloads["chat"].arrival == "closed"


@pytest.mark.parametrize("workload,budgets,needle", [
    ({"arrival": "bursty", "rate": 3}, None,
     "workloads.chat.arrival: Input should be 'closed', 'staggered', 'poisson' or 'fixed'"),
    ({"arrival": "poisson"}, None, "workloads.chat: arrival poisson needs a rate"),
    ({"rate": 3}, None, "rate 3 (requests/s) goes with arrival poisson or fixed"),
    ({"arrival": "poisson", "rate": 3, "qps": 3}, None, "give rate or its alias qps"),
    ({"arrival": "poisson", "rate": -1}, None, "workloads.chat.rate: Input should be greater"),
    ({"arrival": "poisson", "rate": 3, "slo": "ttft<=1s"}, None, "an SLO workload"),
    ({"arrival": "poisson", "rate": 3},
     [{"metric": "ttft", "workload": "chat", "max": "100 ms"}],
     "budgets[0]: a ttft budget on workload 'chat' (arrival poisson) needs the wait"),
])
def test_bad_spec_arrivals_are_one_line_errors(tmp_path, capsys, workload, budgets, needle):
    spec = _spec(**workload)
    if budgets is not None:
        spec["budgets"] = budgets
    f = tmp_path / "spec.json"
    f.write_text(json.dumps(spec))
    assert main(["search", str(f), "-o", str(tmp_path / "run"), "--quiet"]) == 2
    err = capsys.readouterr().err
    lines = [ln for ln in err.strip().splitlines() if ln.strip()]
    assert len(lines) == 1 and "Traceback" not in err, err
    assert needle in lines[0], lines[0]
    assert not (tmp_path / "run").exists()


# -- the CLI -------------------------------------------------------------------------------

def _cost(*extra: str) -> list[str]:
    return ["cost", str(LLAMA), "--hw", "h100-sxm", "--precision", "fp8", "--engine", "trtllm",
            "--workload", ISSUE, *extra]


def test_cli_says_it_is_overloaded(capsys):
    assert main(_cost("--arrival", "poisson", "--rate", "60")) == 0
    out = capsys.readouterr().out
    line = next(ln for ln in out.splitlines() if "overloaded" in ln)
    assert line.strip().startswith("overloaded: offered 60 req/s, serves at most ")
    row = next(ln for ln in out.splitlines() if "rate=60" in ln)
    assert row.count("unbounded") == 2  # TTFT and latency
    assert main(_cost("--arrival", "poisson", "--rate", "500", "--json")) == 0
    w = json.loads(capsys.readouterr().out)["workloads"][0]
    assert w["ttft_s"] is None and w["latency_s"] is None
    assert w["arrival"]["stable"] is False
    assert w["throughput_tok_s"] == pytest.approx(w["arrival"]["capacity_per_s"] * 256)
    assert w["throughput_tok_s"] < 500 * 256 and w["tpot_s"] < 0.1


def test_cli_below_capacity_prints_the_queue(capsys):
    assert main(_cost("--arrival", "fixed", "--rate", "5")) == 0
    out = capsys.readouterr().out
    assert "fixed arrivals at 5 req/s: load " in out and "overloaded" not in out


@pytest.mark.parametrize("extra,needle", [
    (["--arrival", "poisson", "--rate", "-1"], "--rate: expected requests/s > 0"),
    (["--arrival", "poisson", "--rate", "nan"], "--rate: expected requests/s > 0"),
    (["--arrival", "fixed"], "--arrival fixed needs --rate"),
    (["--rate", "3"], "--rate needs --arrival poisson or fixed"),
])
def test_cli_bad_arrival_values_are_one_line_errors(capsys, extra, needle):
    assert main(_cost(*extra)) == 2
    err = capsys.readouterr().err
    lines = [ln for ln in err.strip().splitlines() if ln.strip()]
    assert len(lines) == 1 and "Traceback" not in err, err
    assert needle in lines[0], lines[0]


def test_cli_refuses_an_unknown_arrival(capsys):
    with pytest.raises(SystemExit) as ei:
        main(_cost("--arrival", "bursty", "--rate", "3"))
    assert ei.value.code == 2
    err = capsys.readouterr().err
    assert "invalid choice: 'bursty'" in err and "Traceback" not in err
