"""Speculative decoding (MTP) in the search: a workload with ``draft_tokens`` and
``acceptance`` prices the main blocks with the verify shape and adds the parent's MTP head
as one fixed cost to every child, exactly as ``puzzle-nas cost --mtp --acceptance`` prices
a model (checked against the CLI on the exported child); the SLO sweep with MTP keeps the
best point of an explicit concurrency sweep; drafts without a head are refused by name."""

from __future__ import annotations

import json

import numpy as np
import pytest
from conftest import LLAMA, SUPER
from test_search import pipeline

from costmodels.model import price_model
from costmodels.serving import parse_slo
from hwprofiles.errors import InputError
from nas import search
from nas.arch import serving_table
from nas.cli import main
from nas.hf import load_config, to_hf
from nas.spec import parse_spec

D, A = 5, 3.45  # the seeds' deployment: 5 MTP draft tokens, Super's published acceptance
WORKLOAD = {"isl": 8192, "osl": 65536, "concurrency": 256, "draft_tokens": D, "acceptance": A}
HW = ["--hw", "b200", "--tp", "8", "--ep", "8", "--attention-dp", "--precision", "nvfp4-super"]


def super_spec(**over) -> dict:
    s = {
        "name": "mtp",
        "parent": str(SUPER),
        "hardware": {"profile": "b200", "tp": 8, "ep": 8, "attention_dp": True},
        "precision": "nvfp4-super",
        "workloads": {"server": dict(WORKLOAD)},
        "search_space": {"moe": {"expert_widths": [2688, 1792, 1280], "top_k": [22, 12, 4]},
                         "mamba": {"state_sizes": [128, 96]}},
        "budgets": [{"metric": "throughput", "workload": "server", "min": "120%"}],
        "solver": {"time_limit": 30, "gap": 1e-4},
    }
    s.update(over)
    return s


def solve(s: dict):
    """spec -> (problem, alternatives, priced, library, first result), solved."""
    problem, alts, priced, lib, cons = pipeline(s)
    res = search.solve(problem, lib, cons)[0]
    return problem, alts, priced, lib, res


def totals(lib, rows) -> dict[str, float]:
    return {k: float(v[rows].sum()) + lib.constants.get(k, 0.0) for k, v in lib.costs.items()}


def cli_cost(capsys, tmp_path, arch, *extra) -> dict:
    f = tmp_path / "model.json"
    f.write_text(json.dumps(to_hf(arch)))
    w = ",".join(f"{k}={v}" for k, v in WORKLOAD.items() if k not in ("draft_tokens",
                                                                       "acceptance"))
    assert main(["cost", str(f), *HW, "--workload", w, "--json", *extra]) == 0
    return json.loads(capsys.readouterr().out)


@pytest.fixture(scope="module")
def solved():
    return solve(super_spec())


def test_search_prices_a_child_as_cost_mtp_does(solved, capsys, tmp_path):
    """Block + non-block identity: the library totals of the parent and of the solved child
    equal ``puzzle-nas cost --mtp --acceptance 3.45 --draft-tokens 5`` of their exported
    configs (TTFT, TPOT, runtime, weights; memory up to the workspace, which the library
    holds at the parent's widest row)."""
    problem, alts, priced, lib, res = solved
    parent_rows = [i for i, lab in enumerate(lib.labels) if lab == "parent"]
    child = search.child_arch(problem, lib, res.chosen, alts)
    assert child.mtp_blocks == problem.parent.mtp_blocks  # the child keeps the parent's head
    assert child.blocks != problem.parent.blocks
    ws_lib = priced.workspace_bytes["server"]
    for arch, rows in ((problem.parent, parent_rows), (child, res.chosen)):
        t = totals(lib, rows)
        out = cli_cost(capsys, tmp_path, arch, "--mtp", "--acceptance", str(A),
                       "--draft-tokens", str(D))
        w = out["workloads"][0]
        assert out["mtp"] and out["acceptance"] == A
        assert t["ttft_s@server"] == pytest.approx(w["ttft_s"], rel=1e-9)
        assert t["tpot_s@server"] == pytest.approx(w["tpot_s"], rel=1e-9)
        # runtime: B * osl / (throughput per GPU * tp)
        assert t["runtime_s@server"] == pytest.approx(
            256 * 65536 / (w["throughput_tok_s"] * 8), rel=1e-9)
        assert t["weight_bytes"] == pytest.approx(out["weight_bytes"], rel=1e-9)
        assert t["memory_bytes@server"] - ws_lib == pytest.approx(
            w["memory_bytes"] - w["workspace_bytes"], rel=1e-9)
        # and the blueprint's predicted figures are the same model
        pred = search.blueprint.predict(arch, problem)["server"]
        assert pred["tpot_s"] == pytest.approx(w["tpot_s"], rel=1e-12)
        assert pred["memory_bytes"] == pytest.approx(w["memory_bytes"], rel=1e-12)
    # without --acceptance the CLI prices a different (slower per token) model: 1.50x slower
    # here (5 drafts accepted 3.45 at a time, less the verify step's extra tokens)
    plain = cli_cost(capsys, tmp_path, child)["workloads"][0]
    assert plain["tpot_s"] > totals(lib, res.chosen)["tpot_s@server"] * 1.4


def test_mtp_head_is_one_constant_for_every_child(solved):
    """Re-priced with and without their head rows (``costmodels.model.price_model``), three
    different children differ by the same amount in TTFT, TPOT, runtime and weights: the
    head's draft passes plus the LM head's, which is what the library adds to its
    constants (``Priced.head`` and the draft non-block term)."""
    from costmodels.model import price_nonblock

    problem, alts, priced, lib, res = solved
    hd = priced.head
    assert hd is not None and len(hd) == len(problem.parent.mtp_blocks) + 2
    wl = list(problem.workloads.values())
    kw = dict(tp=8, ep=8, attention_dp=True)
    small = problem.parent.replace_blocks([a[-1].child for a in alts])  # every last choice
    kids = [problem.parent, search.child_arch(problem, lib, res.chosen, alts), small]
    assert len({k.blocks for k in kids}) == 3
    diffs = []
    for arch in kids:
        table, draft = serving_table(arch, True)
        m1 = price_model(table, search.nonblock_shape(arch), problem.hw, problem.recipe, wl,
                         draft=draft, **kw)
        m0 = price_model(arch.table, search.nonblock_shape(arch), problem.hw, problem.recipe,
                         wl, **kw)
        diffs.append([float(m1.ttft_s[0] - m0.ttft_s[0]), float(m1.tpot_s[0] - m0.tpot_s[0]),
                      float(m1.runtime_s[0] - m0.runtime_s[0]),
                      m1.weight_bytes - m0.weight_bytes])
    assert np.allclose(diffs, diffs[0], rtol=1e-9, atol=0)
    nb = [price_nonblock(search.nonblock_shape(problem.parent), problem.hw, problem.recipe, wl,
                         tp=8, attention_dp=True, draft=d) for d in (True, False)]
    want = [float(hd.prefill_s[:, 0].sum() + nb[0].prefill_s[0] - nb[1].prefill_s[0]),
            float(hd.decode_s[:, 0].sum() + nb[0].decode_s[0] - nb[1].decode_s[0]),
            float(hd.runtime_s[:, 0].sum() + nb[0].runtime_s[0] - nb[1].runtime_s[0]),
            float(hd.weight_bytes.sum())]
    assert np.allclose(diffs[0], want, rtol=1e-9, atol=0)
    assert all(x > 0 for x in want)


SWEEP = [192, 224, 240, 256, 320, 384, 448]


def test_slo_with_mtp_is_best_point_of_explicit_sweep():
    """The parent's SLO throughput with MTP is the best point of an explicit loop over the
    concurrencies (each priced alone with its head); the kept child meets the SLO at its
    concurrency, re-priced the same way, with 130 % of the parent's SLO throughput."""
    s = super_spec(workloads={"server": {**WORKLOAD, "slo": "per_user_tps>=100",
                                         "concurrency_sweep": SWEEP}},
                   budgets=[{"metric": "throughput", "workload": "server", "min": "130%"}])
    problem = search.resolve(parse_spec(s), ".")
    alts = search.alternatives(problem)
    q, _ = search.score(problem, alts)
    pb, priced, lib, cons, results, sweep = search.solve_slo(problem, alts, q, "server",
                                                             progress=False)
    slo = parse_slo("per_user_tps>=100")
    w = problem.workloads["server"]

    def explicit(arch) -> dict[int, float]:
        table, draft = serving_table(arch, True)
        out = {}
        for c in SWEEP:
            m = price_model(table, search.nonblock_shape(arch), problem.hw, problem.recipe,
                            [w.with_sequences(c)], tp=8, ep=8, attention_dp=True, draft=draft)
            if slo.met(m)[0] and m.fits[0]:
                out[c] = float(m.throughput_tok_s[0])
        return out

    par = explicit(problem.parent)
    best_c = max(par, key=par.get)
    assert (sweep.parent.concurrency, sweep.parent.throughput_tok_s) == (
        best_c, pytest.approx(par[best_c], rel=1e-12))
    assert SWEEP[0] < best_c < SWEEP[-1]  # the sweep brackets where the parent meets the SLO
    child = search.child_arch(pb, lib, results[0].chosen, alts)
    kid = explicit(child)
    assert sweep.best in kid
    at = [p for p in sweep.points if p["concurrency"] == sweep.best][0]
    assert at["throughput_tok_s"] == pytest.approx(kid[sweep.best], rel=1e-9)
    assert kid[sweep.best] >= 1.3 * par[best_c] * (1 - 1e-9)
    # without MTP the same parent meets the SLO at no concurrency of this sweep
    plain = {**WORKLOAD, "slo": "per_user_tps>=100", "concurrency_sweep": SWEEP}
    del plain["draft_tokens"], plain["acceptance"]
    p0 = search.resolve(parse_spec(super_spec(workloads={"server": plain})), ".")
    assert not search.parent_slo_point(p0, "server").feasible


def test_draft_without_mtp_head_is_refused():
    s = {"name": "x", "parent": str(LLAMA), "hardware": "h100-sxm", "precision": "fp8",
         "workloads": {"chat": {"isl": 128, "osl": 128, "concurrency": 8, "draft_tokens": 3,
                                "acceptance": 2.5}},
         "search_space": {"ffn": {"fractions": [1.0, 0.5]}},
         "budgets": [{"metric": "throughput", "workload": "chat", "min": "120%"}]}
    with pytest.raises(InputError, match="no MTP head") as e:
        search.resolve(parse_spec(s), ".")
    assert e.value.field == "workloads.chat.draft_tokens"
    assert load_config(LLAMA).mtp_blocks == ()


@pytest.mark.parametrize("update,match", [
    ({"draft_tokens": 3}, "together"),
    ({"acceptance": 2.0}, "together"),
    ({"draft_tokens": 2, "acceptance": 3.5}, "exceeds draft_tokens"),
    ({"draft_tokens": 0, "acceptance": 1.0}, "draft_tokens"),
    ({"draft_tokens": 65, "acceptance": 2.0}, "draft_tokens"),
    ({"draft_tokens": 3, "acceptance": 0.5}, "acceptance"),
    # NaN compares false with both bounds: named as what it is, not as out of range
    ({"draft_tokens": 3, "acceptance": float("nan")}, "acceptance: Input should be a finite"),
    ({"draft_tokens": 3, "acceptance": float("inf")}, "acceptance: Input should be a finite"),
])
def test_spec_draft_fields_are_checked(update, match):
    w = {k: v for k, v in WORKLOAD.items() if k not in ("draft_tokens", "acceptance")}
    with pytest.raises(InputError, match=match) as e:
        parse_spec(super_spec(workloads={"server": {**w, **update}}))
    assert "workloads.server" in str(e.value)


def test_cli_search_acceptance_override(tmp_path, capsys):
    """``puzzle-nas search --acceptance A`` serves every workload at A: the same blueprint
    as a spec written with it (same hash), and a faster parent than at 3.45."""
    s = super_spec()
    w = {k: v for k, v in WORKLOAD.items() if k not in ("draft_tokens", "acceptance")}
    s["workloads"] = {"server": w}
    f = tmp_path / "spec.json"
    f.write_text(json.dumps(s))
    assert main(["search", str(f), "-o", str(tmp_path / "a"), "--quiet",
                 "--draft-tokens", "5", "--acceptance", "4.34"]) == 0
    assert "drafts 5 tokens per step at acceptance 4.34" in capsys.readouterr().out
    s["workloads"]["server"] = {**w, "draft_tokens": 5, "acceptance": 4.34}
    g = tmp_path / "spec2.json"
    g.write_text(json.dumps(s))
    assert main(["search", str(g), "-o", str(tmp_path / "b"), "--quiet"]) == 0
    a, b = (json.loads((tmp_path / d / "blueprint.json").read_text()) for d in "ab")
    assert a["predicted"] == b["predicted"] and a["child"] == b["child"]
    assert a["provenance"]["spec_hash"] == b["provenance"]["spec_hash"]
    problem = search.resolve(parse_spec(super_spec()), ".")  # acceptance 3.45
    slow = search.blueprint.predict(problem.parent, problem)["server"]["tpot_s"]
    assert a["predicted"]["server"]["parent"]["tpot_s"] < slow / 1.2
    # --acceptance on a workload that drafts nothing needs --draft-tokens
    f.write_text(json.dumps({**s, "workloads": {"server": w}}))
    assert main(["search", str(f), "-o", str(tmp_path / "c"), "--quiet",
                 "--acceptance", "3"]) == 2
    assert "--draft-tokens" in capsys.readouterr().err


def test_8xb200_example_is_the_seeds_workload_with_mtp(tmp_path):
    """The shipped 8xB200 example serves 8K/64K at >= 100 tok/s/user with 5 MTP draft
    tokens at acceptance 3.45; its sweep brackets the parent's SLO point, the kept child
    reaches 175 % of the parent's SLO throughput within 75.3 B parameters, and the exported
    child keeps the parent's MTP head."""
    from conftest import REPO, search_example

    from nas.hf import from_hf

    spec = json.loads((REPO / "nas/examples/nemotron3-super-8xb200.json").read_text())
    w = spec["workloads"]["server"]
    assert (w["isl"], w["osl"], w["slo"], w["draft_tokens"], w["acceptance"]) == (
        8192, 65536, "per_user_tps>=100", 5, 3.45)
    bp = search_example("nemotron3-super-8xb200", tmp_path)
    sw = json.loads((tmp_path / "out" / "slo_sweep.json").read_text())
    grid = w["concurrency_sweep"]
    assert grid[0] < sw["parent"]["concurrency"] < grid[-1]
    assert grid[0] < sw["best_concurrency"] < grid[-1]
    best = [p for p in sw["points"] if p["concurrency"] == sw["best_concurrency"]][0]
    assert best["throughput_tok_s"] >= 1.75 * sw["parent"]["throughput_tok_s"] * (1 - 1e-9)
    assert bp["params"]["child_total"] <= 75.3e9
    parent = load_config(REPO / "nas/examples" / spec["parent"])
    assert from_hf(bp["child"]).mtp_blocks == parent.mtp_blocks != ()
