"""SLO workloads in a search spec: the concurrency is swept, each point solved with the SLO
as budgets, the best child kept; relative throughput bounds resolve against the parent's
own SLO throughput. Checked by re-pricing the child independently with costmodels."""

from __future__ import annotations

import pytest
from conftest import LLAMA

from costmodels.serving import slo_throughput
from hwprofiles.errors import InputError
from nas import mip, search
from nas.spec import parse_spec

SWEEP = [8, 16, 32, 64, 96, 128, 192, 256]


def spec(**over) -> dict:
    s = {
        "name": "slo",
        "parent": str(LLAMA),
        "hardware": "h100-sxm",
        "precision": "fp8",
        "workloads": {"chat": {"isl": 1024, "osl": 1024, "concurrency": 64,
                               "slo": "per_user_tps>=60", "concurrency_sweep": SWEEP}},
        "search_space": {
            "attention": {"kv_heads": [8, 4, 2], "noop": True},
            "ffn": {"fractions": [1.0, 0.75, 0.5], "round_to": 256},
        },
        "budgets": [{"metric": "throughput", "workload": "chat", "min": "140%"}],
        "solver": {"time_limit": 30},
    }
    s.update(over)
    return s


def run(s: dict):
    problem = search.resolve(parse_spec(s), ".")
    alts = search.alternatives(problem)
    q, _ = search.score(problem, alts)
    out = search.solve_slo(problem, alts, q, "chat", progress=False)
    return problem, alts, out


def test_slo_sweep_keeps_best_child_meeting_slo_and_target():
    problem, alts, (pb, priced, lib, cons, results, sweep) = run(spec())
    parent = sweep.parent
    assert parent.concurrency in SWEEP and parent.per_user_tok_s >= 60
    best = results[0]
    child = search.child_arch(pb, lib, best.chosen, alts)
    # re-priced independently at the chosen concurrency: SLO met, 140 % of the parent's
    # SLO throughput reached, memory fits
    pt = slo_throughput(child.table, search.nonblock_shape(child), problem.hw, problem.recipe,
                        problem.workloads["chat"], "per_user_tps>=60", concurrencies=SWEEP)
    assert pt.throughput_tok_s >= 1.4 * parent.throughput_tok_s * (1 - 1e-6)
    at_c = [p for p in sweep.points if p["concurrency"] == sweep.best][0]
    assert at_c["throughput_tok_s"] >= 1.4 * parent.throughput_tok_s * (1 - 1e-6)
    # the kept child is the best (lowest quality score) of every feasible concurrency
    feasible = [p for p in sweep.points if p["feasible"]]
    assert len(feasible) >= 2
    assert at_c["objective"] == min(p["objective"] for p in feasible)
    # and no concurrency where the parent itself cannot even meet the SLO is wasted on a
    # child slower than the floor
    assert pb.workloads["chat"].concurrency == sweep.best


def test_slo_objective_maximizes_throughput():
    s = spec(objective={"maximize": "throughput@chat"}, budgets=[])
    problem, alts, (pb, priced, lib, cons, results, sweep) = run(s)
    feasible = [p for p in sweep.points if p["feasible"]]
    assert max(p["throughput_tok_s"] for p in feasible) == pytest.approx(
        [p for p in feasible if p["concurrency"] == sweep.best][0]["throughput_tok_s"])
    assert sweep.points[-1]["throughput_tok_s"] >= sweep.parent.throughput_tok_s


def test_slo_spec_errors():
    with pytest.raises(InputError, match="SLO workload serves a concurrency"):
        parse_spec(spec(workloads={"chat": {"isl": 8, "osl": 8, "batch": 4,
                                            "slo": "per_user_tps>=60"}}))
    with pytest.raises(InputError, match="per_user_tps"):
        parse_spec(spec(workloads={"chat": {"isl": 8, "osl": 8, "concurrency": 4,
                                            "slo": "speed>=3"}}))
    with pytest.raises(InputError, match="concurrency_sweep"):
        parse_spec(spec(workloads={"chat": {"isl": 8, "osl": 8, "concurrency": 4,
                                            "concurrency_sweep": [1, 2]}}))
    impossible = spec()
    impossible["workloads"]["chat"]["slo"] = "per_user_tps>=5000"
    with pytest.raises(InputError, match="at no concurrency"):
        run(impossible)
    impossible["budgets"] = [{"metric": "throughput", "workload": "chat", "min": "100 tok/s"}]
    with pytest.raises(mip.InfeasibleError, match="no concurrency of chat"):
        run(impossible)
