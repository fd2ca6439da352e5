"""The child and its deployment searched together (``deploy.candidates``, issue 52): the
joint optimum and its status against brute-force enumeration of every (deployment, child)
pair on small cases, the cost per million tokens against the serving model, one-line
refusals of combinations that cannot serve, and the ``puzzle-nas search`` outputs."""

from __future__ import annotations

import copy
import itertools
import json
import math

import numpy as np
import pytest

from hwprofiles.errors import InputError
from nas import mip
from nas.cli import main
from nas.search import blueprint as bpm
from nas.search.deploy import (
    COST_KEY,
    DeployResult,
    Point,
    expand,
    joint_search,
    run_joint,
)
from nas.spec import parse_spec

LLAMA = {"model_type": "llama", "hidden_size": 256, "intermediate_size": 768,
         "num_hidden_layers": 3, "num_attention_heads": 8, "num_key_value_heads": 4,
         "vocab_size": 1024, "max_position_embeddings": 4096}

BASE = {
    "name": "tiny-joint", "hardware": {"profile": "h100-sxm", "tp": 1}, "precision": "bf16",
    "parent": LLAMA,
    "workloads": {"chat": {"isl": 512, "osl": 128, "concurrency": 8}},
    "search_space": {"attention": {"kv_heads": [2, 1], "noop": True},
                     "ffn": {"fractions": [0.5], "round_to": 64, "noop": True}},
    "budgets": [{"metric": "quality", "max": 0.3}],
    "solver": {"gap": 0},
    "deploy": {"candidates": {"devices": ["h100-sxm", "b200", "a100-sxm-80gb"],
                              "layouts": [{"tp": 1}, {"tp": 2}]}}}


def _spec(**changes: object) -> dict:
    s = copy.deepcopy(BASE)
    for path, v in changes.items():
        node = s
        *head, last = path.split("__")
        for k in head:
            node = node[k]
        if v is None:
            node.pop(last, None)
        else:
            node[last] = v
    return s


def _meets(total: np.ndarray, row: mip.Budget) -> np.ndarray:
    ok = np.ones(total.shape, dtype=bool)
    tol = 1e-9 * np.maximum(1.0, np.abs(total))
    if row.hi is not None:
        ok &= total <= row.hi + tol
    if row.lo is not None:
        ok &= total >= row.lo - tol
    return ok


def _enumerate(pt: Point) -> float:
    """The point's optimum by brute force: every child (one alternative per block), every
    row checked, the objective's least value (inf when no child meets every row)."""
    lib = pt.library
    assert (lib.lengths == 1).all()  # single-block alternatives: a child is a product
    per_block = [np.flatnonzero(lib.start == b) for b in range(lib.num_blocks)]
    idx = np.array(list(itertools.product(*per_block)), dtype=np.int64)
    ok = np.ones(len(idx), dtype=bool)
    for row in pt.rows:
        ok &= _meets(lib.values(row.key)[idx].sum(axis=1) + lib.constant(row.key), row)
    assert not pt.cons.counts and not pt.cons.forbid and not pt.cons.ties
    (key, w), = pt.objective.weights.items()
    obj = w * (lib.values(key)[idx].sum(axis=1) + lib.constant(key))
    return float(obj[ok].min()) if ok.any() else math.inf


def _check_against_enumeration(spec: dict) -> tuple[DeployResult, float]:
    j = joint_search(parse_spec(spec))
    brute = min(_enumerate(p) for p in j.points)
    r = j.result
    if math.isinf(brute):
        assert r.status == "infeasible" and r.joint is None and j.best is None
        return r, brute
    assert r.status == "optimal", r
    assert r.joint is not None and j.best is not None
    got = r.joint.cost if r.objective == "cost" else r.joint.quality
    assert got == pytest.approx(brute, rel=1e-9, abs=1e-12)
    # the reported child really is on the reported deployment and meets every row there
    res = j.best.result
    assert res is not None
    for row in j.best.rows:
        assert _meets(np.array(res.totals[row.key]), row)
    # and no other deployment holds a strictly better child
    for p in j.points:
        assert _enumerate(p) >= got - 1e-9 * abs(got)
    return r, brute


@pytest.mark.parametrize("quality_max", [0.0, 0.3, 0.7, 2.0])
def test_least_cost_matches_enumeration(quality_max):
    r, _ = _check_against_enumeration(_spec(budgets=[{"metric": "quality",
                                                       "max": quality_max}]))
    assert r.unit == "GPU-h/Mtok"
    assert len(r.deployments) == 6
    # pruned points were never solved, and at least one point was solved
    assert r.solves >= 1
    assert {row.status for row in r.deployments} <= {"optimal", "pruned", "infeasible"}


def test_prices_change_the_answer_and_still_match_enumeration():
    devs = [{"profile": "h100-sxm", "price_per_gpu_hour": 2.0},
            {"profile": "b200", "price_per_gpu_hour": 30.0},
            {"profile": "a100-sxm-80gb", "price_per_gpu_hour": 40.0}]
    r, _ = _check_against_enumeration(_spec(deploy__candidates__devices=devs))
    assert r.unit == "money/Mtok"
    assert r.joint is not None and r.joint.deployment["profile"] == "h100-sxm"
    r2, _ = _check_against_enumeration(_spec())
    assert r2.joint is not None and r2.joint.deployment["profile"] != "h100-sxm"


def test_slo_rows_make_some_deployments_infeasible():
    # a per-token decode bound only some deployments meet
    spec = _spec(budgets=[{"metric": "quality", "max": 0.5},
                          {"metric": "tpot", "workload": "chat", "max": "0.2 ms"}],
                 deploy__candidates__attention_dp=[False, True])
    r, brute = _check_against_enumeration(spec)
    assert not math.isinf(brute)
    st = [row.status for row in r.deployments]
    assert "infeasible" in st, st


def test_best_quality_under_a_cost_bound_matches_enumeration():
    for max_cost in (0.004, 0.0057, 0.02):
        spec = _spec(budgets=[], deploy__candidates__objective="quality",
                     deploy__candidates__max_cost=max_cost)
        r, brute = _check_against_enumeration(spec)
        if r.joint is not None:
            assert r.joint.cost <= max_cost * (1 + 1e-9)


def test_infeasible_everywhere_is_said_so():
    spec = _spec(budgets=[{"metric": "quality", "max": -1.0}])
    r, brute = _check_against_enumeration(spec)
    assert math.isinf(brute) and r.status == "infeasible"
    assert all(row.status == "infeasible" for row in r.deployments)
    with pytest.raises(mip.InfeasibleError, match="no candidate deployment admits a child"):
        run_joint(parse_spec(spec), ".", "/nonexistent-never-written")


def test_two_workloads_mix_and_mtp_free_parent():
    spec = _spec(workloads={"chat": {"isl": 512, "osl": 128, "concurrency": 8},
                            "long": {"isl": 2048, "osl": 256, "concurrency": 2}},
                 deploy__candidates__mix={"chat": 3, "long": 1})
    _check_against_enumeration(spec)


def test_cost_is_gpu_time_over_tokens_of_the_serving_model():
    """The parent's cost column equals price / 3600 * 1e6 / (throughput per GPU), the
    throughput being the serving model's (``costmodels.model.summarize`` via predict)."""
    devs = [{"profile": "h100-sxm", "price_per_gpu_hour": 3.0}]
    j = joint_search(parse_spec(_spec(deploy__candidates__devices=devs)))
    for pt in j.points:
        pred = bpm.predict(pt.problem.parent, pt.problem)["chat"]
        thr = pred["throughput_tok_s"]  # per GPU
        par_idx = [i for i, lab in enumerate(pt.library.labels) if lab == "parent"]
        cost = float(pt.library.values(COST_KEY)[par_idx].sum() + pt.library.constant(COST_KEY))
        assert cost == pytest.approx(3.0 / 3600 * 1e6 / thr, rel=1e-9)


def test_fixed_deployment_and_parent_best_are_reported():
    r, _ = _check_against_enumeration(_spec())
    assert r.fixed is not None and r.fixed.deployment["profile"] == "h100-sxm"
    assert r.fixed.deployment["tp"] == 1
    assert r.joint is not None and r.joint.cost <= r.fixed.cost * (1 + 1e-9)
    assert r.parent_best is not None
    costs = [row.parent_cost for row in r.deployments if row.parent_cost is not None]
    assert r.parent_best.cost == pytest.approx(min(costs))
    if r.joint.deployment["name"] != r.fixed.deployment["name"]:
        assert r.moved


def test_expand_crosses_axes_and_defaults_to_the_spec():
    s = parse_spec(_spec(deploy__candidates__attention_dp=[False, True],
                         deploy__candidates__engines=["trtllm", "vllm"]))
    ds = expand(s)
    # attention DP over one GPU is the same deployment as without: tp=1 once
    assert len(ds) == 3 * (1 + 2) * 2
    assert not any(d.tp == 1 and d.attention_dp for d in ds)
    assert len({d.name for d in ds}) == len(ds)
    only = parse_spec(_spec(deploy__candidates__layouts=None))
    assert [(d.tp, d.ep, d.attention_dp, d.engine) for d in expand(only)] == [(1, 1, False, None)] * 3


def _refused(spec: dict, *words: str) -> str:
    with pytest.raises(InputError) as e:
        joint_search(parse_spec(spec))
    msg = str(e.value)
    assert "\n" not in msg
    for w in words:
        assert w in msg, msg
    return msg


def test_refusals_are_one_line_and_name_the_combination():
    # TP that cannot split the KV heads of an alternative (12 query heads, kv 6 -> 4)
    parent = {**LLAMA, "hidden_size": 384, "num_attention_heads": 12,
              "num_key_value_heads": 6}
    _refused(_spec(parent=parent, search_space={"attention": {"kv_heads": [4]}},
                   deploy__candidates__layouts=[{"tp": 1}, {"tp": 3}]),
             "deploy.candidates.layouts", "tp=3", "alternative 'num_kv_heads=4' of block 0", "KV heads")
    # ... unless attention is data-parallel
    joint_search(parse_spec(_spec(parent=parent, search_space={"attention": {"kv_heads": [4]}},
                                  deploy__candidates__layouts=[{"tp": 3}],
                                  deploy__candidates__attention_dp=[True])))
    # EP that does not divide the experts of an alternative (8 experts -> 6, ep 4)
    moe = {"model_type": "mixtral", "hidden_size": 256, "intermediate_size": 512,
           "num_hidden_layers": 2, "num_attention_heads": 8, "num_key_value_heads": 4,
           "num_local_experts": 8, "num_experts_per_tok": 2, "vocab_size": 1024,
           "max_position_embeddings": 4096}
    _refused(_spec(parent=moe, search_space={"moe": {"experts": [6]}},
                   deploy__candidates__layouts=[{"tp": 4, "ep": 4}]),
             "deploy.candidates.layouts", "ep=4", "6 experts", "alternative")
    _refused(_spec(deploy__candidates__devices=["h100-sxm", "no-such-gpu"]),
             "deploy.candidates.devices[1]", "no-such-gpu")
    _refused(_spec(deploy__candidates__mtp=[None, {"draft_tokens": 2, "acceptance": 1.8}]),
             "deploy.candidates.mtp", "MTP head")
    _refused(_spec(deploy__candidates__mix={"nope": 1}), "deploy.candidates.mix", "nope")


@pytest.mark.parametrize("cands, words", [
    ({"devices": [{"profile": "h100-sxm", "price_per_gpu_hour": 2}, "b200"]},
     ("deploy.candidates.devices", "every device or for none", "b200")),
    ({"devices": ["b200", "b200"]}, ("twice",)),
    ({"devices": ["b200"], "layouts": [{"tp": 4, "ep": 2}]}, ("ep must be 1 or tp",)),
    ({"devices": ["b200"], "layouts": [{"tp": 2}, {"tp": 2}]}, ("twice",)),
    ({"devices": ["b200"], "engines": ["tgi"]}, ("unknown serving engine",)),
    ({"devices": ["b200"], "objective": "quality"}, ("needs max_cost",)),
    ({"devices": ["b200"], "max_cost": 1.0}, ("max_cost bounds objective 'quality'",)),
    ({"devices": []}, ("deploy.candidates.devices",)),
])
def test_spec_refusals(cands, words):
    with pytest.raises(InputError) as e:
        parse_spec(_spec(deploy__candidates=cands))
    assert "\n" not in str(e.value)
    for w in words:
        assert w in str(e.value), str(e.value)


def test_deploy_needs_engines_or_candidates():
    with pytest.raises(InputError, match="give engines or candidates"):
        parse_spec(_spec(deploy={}))


def test_cli_writes_deploy_json_and_the_table(tmp_path, capsys):
    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps(_spec()))
    out = tmp_path / "run"
    assert main(["search", str(spec), "-o", str(out), "--quiet"]) == 0
    text = capsys.readouterr().out
    assert "deployment" in text and "GPU-h/Mtok" in text
    names = sorted(p.name for p in out.iterdir())
    assert names == ["blueprint.json", "deploy.json", "deploy_front.png", "library.json",
                     "report.md"]
    assert (out / "deploy_front.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert bpm.is_search_output("deploy_front.png")  # a rerun replaces the folder
    assert main(["search", str(spec), "-o", str(out), "--quiet"]) == 0
    capsys.readouterr()
    r = DeployResult.model_validate(json.loads((out / "deploy.json").read_text()))
    assert r.status == "optimal" and r.joint is not None
    report = (out / "report.md").read_text()
    assert "## Deployment searched with the child" in report
    # the front: in deploy.json, in the report's table and on the command's closing lines
    assert r.front is not None and r.front.points
    assert "### Pareto front" in report and "Pareto front:" in text
    for k, p in enumerate(r.front.points, start=1):
        assert f"| {k} | {p.deployment['name']} |" in report
    for row in r.deployments:
        assert f"| {row.deployment['name']} |" in report
    bp = json.loads((out / "blueprint.json").read_text())
    assert bp["provenance"]["profile"] == r.joint.deployment["profile"] or \
        r.joint.deployment["profile"] in json.dumps(bp["provenance"])
    # a joint search refuses what it does not take yet, in one line
    bad = _spec(solver={"sweep": {"budget": 0, "values": [0.1, 0.2]}})
    spec.write_text(json.dumps(bad))
    assert main(["search", str(spec), "-o", str(out), "--quiet"]) == 2
    assert "solver.sweep" in capsys.readouterr().err


# ---- the Pareto front of quality against cost ------------------------------------------------
def _pairs(pt: Point) -> tuple[np.ndarray, np.ndarray]:
    """(quality, cost) of every child that meets every row of the point, by brute force."""
    lib = pt.library
    assert (lib.lengths == 1).all()  # single-block alternatives: a child is a product
    assert not pt.cons.counts and not pt.cons.forbid and not pt.cons.ties
    per_block = [np.flatnonzero(lib.start == b) for b in range(lib.num_blocks)]
    idx = np.array(list(itertools.product(*per_block)), dtype=np.int64)
    ok = np.ones(len(idx), dtype=bool)
    for row in pt.rows:
        ok &= _meets(lib.values(row.key)[idx].sum(axis=1) + lib.constant(row.key), row)
    q = lib.values("quality")[idx].sum(axis=1) + lib.constant("quality")
    c = lib.values(COST_KEY)[idx].sum(axis=1) + lib.constant(COST_KEY)
    return q[ok], c[ok]


def _close(a: float, b: float) -> bool:
    """Equal within the rounding of sums taken in another order: ``1e-9 * max(1, |a|, |b|)``
    (the tolerance the front is checked to)."""
    return abs(a - b) <= 1e-9 * max(1.0, abs(a), abs(b))


def _non_dominated(q: np.ndarray, c: np.ndarray) -> list[int]:
    """Indices of the pairs no other pair beats on one and ties on the other (one of equal
    pairs), ties within the rounding of sums taken in another order."""
    order = np.lexsort((q, c))
    cand, best = [], math.inf
    for i in order:
        if q[i] < best:
            cand.append(int(i))
            best = q[i]

    def beats(j: int, i: int) -> bool:
        le = (q[j] <= q[i] or _close(q[j], q[i])) and (c[j] <= c[i] or _close(c[j], c[i]))
        return le and not (_close(q[j], q[i]) and _close(c[j], c[i]))

    return [i for i in cand if not any(beats(j, i) for j in cand if j != i)]


def _check_front(spec: dict) -> tuple[DeployResult, list[tuple[float, float]]]:
    """The front against every (deployment, child) pair enumerated: every front point is a
    pair that meets every row on its point (its choices give its quality and cost) and no
    pair beats it on both; every non-dominated pair is matched by a front point at most
    ``step`` worse in quality (plus the MIP's feasibility slack) and no costlier; with
    ``front.step`` 0, by one of equal quality and cost (:func:`_close`)."""
    j = joint_search(parse_spec(spec))
    r = j.result
    qs, cs, where = [], [], []
    for p in j.points:
        q, c = _pairs(p)
        qs.append(q)
        cs.append(c)
        where += [p.index] * len(q)
    q_all, c_all = np.concatenate(qs), np.concatenate(cs)
    nd = [(float(q_all[i]), float(c_all[i])) for i in _non_dominated(q_all, c_all)]
    f = r.front
    if not nd:
        assert f is None and r.joint is None
        return r, nd
    assert f is not None and f.status == "optimal" and f.points
    # cheapest first, quality strictly better along the front
    assert all(a.cost <= b.cost and a.quality > b.quality for a, b in zip(f.points, f.points[1:]))
    slack = 1e-5 * max(float(np.max(np.abs(p.library.values("quality")))) for p in j.points)
    for fp in f.points:
        # achievable: its choices, on its point, meet every row and give its totals
        pts = [p for p in j.points if j.deployments[p.deployment].name == fp.deployment["name"]
               and p.concurrency == fp.concurrency]
        assert len(pts) == 1
        lib = pts[0].library
        chosen = [next(i for i in np.flatnonzero(lib.start == b) if lib.labels[i] == lab)
                  for b, lab in enumerate(fp.choices)]
        t = lib.totals(np.array(chosen))
        assert _close(t["quality"], fp.quality) and _close(t[COST_KEY], fp.cost)
        for row in pts[0].rows:
            assert _meets(np.array(t[row.key]), row), row
        assert fp.quality <= fp.quality_bound + slack
        # and no enumerated pair beats it on both
        better = (q_all < fp.quality - 1e-9 * max(1.0, abs(fp.quality))) & \
            (c_all < fp.cost - 1e-9 * max(1.0, abs(fp.cost)))
        assert not better.any(), (fp, q_all[better][:3], c_all[better][:3])
    exact = spec["deploy"]["candidates"].get("front", {}).get("step") == 0
    for q, c in nd:
        if exact:
            assert any(_close(fp.quality, q) and _close(fp.cost, c) for fp in f.points), (q, c)
        else:
            assert any(fp.cost <= c * (1 + 1e-9) and fp.quality < q + f.step + slack
                       for fp in f.points), (q, c, f.step)
    return r, nd


FRONT_CASES = {
    "quality<=0.3": {},
    "no quality budget": {"budgets": []},
    "priced": {"deploy__candidates__devices": [
        {"profile": "h100-sxm", "price_per_gpu_hour": 2.0},
        {"profile": "b200", "price_per_gpu_hour": 4.5},
        {"profile": "a100-sxm-80gb", "price_per_gpu_hour": 1.2}], "budgets": []},
    "priced, tpot rows, attention DP": {
        "deploy__candidates__devices": [
            {"profile": "h100-sxm", "price_per_gpu_hour": 2.0},
            {"profile": "b200", "price_per_gpu_hour": 4.5},
            {"profile": "a100-sxm-80gb", "price_per_gpu_hour": 4.0}],
        "budgets": [{"metric": "tpot", "workload": "chat", "max": "0.1 ms"}],
        "deploy__candidates__attention_dp": [False, True]},
    "slo, concurrency swept": {
        "budgets": [], "workloads": {"chat": {
            "isl": 512, "osl": 128, "concurrency": 8, "slo": "per_user_tps>=10000",
            "concurrency_sweep": [2, 4, 8, 16, 32]}}},
    "tpot rows, attention DP": {
        "budgets": [{"metric": "tpot", "workload": "chat", "max": "0.2 ms"}],
        "deploy__candidates__attention_dp": [False, True]},
    "best quality under max_cost": {
        "budgets": [], "deploy__candidates__objective": "quality",
        "deploy__candidates__max_cost": 0.0057},
    "two workloads, mix": {
        "workloads": {"chat": {"isl": 512, "osl": 128, "concurrency": 8},
                      "long": {"isl": 2048, "osl": 256, "concurrency": 2}},
        "deploy__candidates__mix": {"chat": 3, "long": 1}, "budgets": []},
}


@pytest.mark.parametrize("case", list(FRONT_CASES))
@pytest.mark.parametrize("front", [{"step": 0}, {}, {"points": 4}])
def test_front_matches_enumeration(case, front):
    spec = _spec(**FRONT_CASES[case], deploy__candidates__front=front)
    r, nd = _check_front(spec)
    assert r.front is not None
    if front.get("step") == 0:
        assert len(r.front.points) == len(nd)
    # the joint answer is the front's cheapest point (objective cost) or has its best
    # quality (objective quality: of children tied on quality the front keeps the cheapest)
    assert r.joint is not None
    if r.objective == "cost":
        end = r.front.points[0]
        assert _close(end.cost, r.joint.cost) and _close(end.quality, r.joint.quality)
    else:
        end = r.front.points[-1]
        assert _close(end.quality, r.joint.quality) and end.cost <= r.joint.cost * (1 + 1e-9)
    # the parent at its best deployment, beside the front: a pair the front matches (it
    # meets every row here but max_cost, which it may exceed)
    pb = r.parent_best
    if pb is not None and r.objective == "cost":
        assert any(fp.cost <= pb.cost * (1 + 1e-9) and fp.quality <= pb.quality + r.front.step
                   for fp in r.front.points)


def test_front_spans_deployments():
    """Where a per-token bound and prices make different deployments cheapest at different
    qualities, the exact front names each, and every non-dominated pair is on it."""
    spec = _spec(**FRONT_CASES["priced, tpot rows, attention DP"],
                 deploy__candidates__front={"step": 0})
    r, nd = _check_front(spec)
    assert r.front is not None
    names = {fp.deployment["name"] for fp in r.front.points}
    assert len(nd) == len(r.front.points) and len(names) >= 3, names


def test_front_off_and_infeasible():
    spec = _spec()
    spec["deploy"]["candidates"]["front"] = None  # null: no front
    r = joint_search(parse_spec(spec)).result
    assert r.front is None and r.joint is not None
    r = joint_search(parse_spec(_spec(budgets=[{"metric": "quality", "max": -1.0}]))).result
    assert r.front is None and r.joint is None
