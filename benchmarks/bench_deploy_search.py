"""The child and its deployment searched together (issue 52) on the shipped Super joint
example, ``nas/examples/nemotron3-super-joint.json``: 3 devices x 4 parallel layouts x
attention DP on / off (21 deployments), the joint least-cost answer, the best child of the
spec's fixed deployment, the parent at its best deployment and the Pareto front of quality
against cost per million tokens over every deployment (64 quality steps), written as
``puzzle-nas search`` writes them (``deploy.json``, ``deploy_front.png``, the blueprint).

Run: ``pytest benchmarks/bench_deploy_search.py --benchmark-only``. Goal: the whole search,
the front included, in <= 30 s on 2 cores (asserted on the slowest round). ``extra_info``
records the joint status, the MIPs solved and pruned, the front's points, steps, MIPs and
LP bounds, and the seconds of the joint search and of the front.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from nas.search import run
from nas.spec import parse_spec

EXAMPLE = Path(__file__).resolve().parents[1] / "nas" / "examples" / "nemotron3-super-joint.json"
GOAL_S = 30.0


def test_super_joint_search_with_front(benchmark, tmp_path):
    spec = parse_spec(json.loads(EXAMPLE.read_text()))
    n = {"k": 0}

    def once():
        n["k"] += 1
        return run(spec, EXAMPLE.parent, tmp_path / f"run{n['k']}", progress=False)

    out = benchmark.pedantic(once, rounds=2, iterations=1)
    r = out.deploy
    assert r is not None and r.status == "optimal"
    f = r.front
    assert f is not None and f.status == "optimal" and len(f.points) >= 2
    assert r.joint is not None and f.points[0].cost == r.joint.cost  # the front starts there
    assert (tmp_path / "run1" / "deploy_front.png").is_file()
    worst = max(benchmark.stats.stats.data)
    benchmark.extra_info.update({
        "cores": len(os.sched_getaffinity(0)), "deployments": len(r.deployments),
        "joint_status": r.status, "joint_mips": r.solves, "joint_pruned": r.pruned,
        "front_points": len(f.points), "front_steps": f.steps, "front_mips": f.solves,
        "front_lp_bounds": f.lp_bounds, "front_s": round(f.seconds, 2),
        "search_s": round(r.seconds, 2), "worst_round_s": round(worst, 2)})
    assert worst <= GOAL_S, f"the joint search with its front took {worst:.1f} s > {GOAL_S:g} s"
