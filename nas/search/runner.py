"""``puzzle-nas search``'s driver: spec -> every step -> the output folder (blueprints,
report, library, sweep, plot), written to a staged folder and swapped in whole.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from nas import mip
from nas.io import check_output_dir, output_lock
from nas.mip import interrupt
from nas.progress import Progress
from nas.search import blueprint as bpm
from nas.search.baselines import fixed_recipe_forbid, fixed_recipe_solve, homogeneous_solve
from nas.search.budgets import constraints
from nas.search.problem import alternatives, build_library, library_json, price, resolve, score
from nas.search.solver import child_arch, solve
from nas.search.sweeps import (
    SearchOutcome,
    _chosen_point,
    run_batch_sweep,
    run_sweep,
    slo_workload,
    solve_slo,
    sweep_values,
)
from nas.spec import HIGHER_IS_BETTER, SearchSpec


def run(spec: SearchSpec, base_dir: str | Path, out_dir: str | Path, spec_hash: str = "",
        progress: bool | None = None) -> SearchOutcome:
    """spec -> blueprint(s), ``report.md``, ``library.json`` and ``pareto.png`` in ``out_dir``.
    One run at a time per ``out_dir`` (:func:`nas.io.output_lock`): a second is refused with
    an ``InputError`` before any work."""
    with output_lock(out_dir, "output folder"):
        return _run(spec, base_dir, out_dir, spec_hash, progress)


def _run(spec: SearchSpec, base_dir: str | Path, out_dir: str | Path, spec_hash: str,
         progress: bool | None) -> SearchOutcome:
    import time

    t: dict[str, float] = {}
    t0 = time.perf_counter()
    # the output folder is checked before any work (created, writable, no foreign files)
    check_output_dir(out_dir, bpm.is_search_output, "output folder")
    if spec.deploy is not None and spec.deploy.candidates is not None:
        from nas.search.deploy import run_joint  # the child and its deployment together

        return run_joint(spec, base_dir, out_dir, spec_hash, progress)
    problem = resolve(spec, base_dir, spec_hash)
    alts = alternatives(problem)
    t["space_s"] = time.perf_counter() - t0
    t1 = time.perf_counter()
    priced = price(problem, alts, progress)
    quality, qsource = score(problem, alts)
    t["price_s"] = time.perf_counter() - t1
    t2 = time.perf_counter()
    # SIGINT / SIGTERM while solving: recorded, the HiGHS run stopped, then raised here
    # (never swallowed by HiGHS' callbacks, see nas.mip.interrupt); nothing is written
    with interrupt.deferred():
        slo_w = slo_workload(problem)
        slo_sweep = None
        if slo_w is not None:
            problem, priced, library, cons, results, slo_sweep = solve_slo(
                problem, alts, quality, slo_w, progress)
        else:
            library = build_library(problem, alts, priced, quality)
            cons = constraints(problem, library, priced)
            pool = problem.spec.solver.diverse if problem.spec.solver.diverse > 1 else 1
            with Progress(pool, "solving", progress) as bar:
                results = solve(problem, library, cons,
                                on_solve=(lambda: bar.update(1)) if pool > 1 else None)
                if pool == 1:
                    bar.update(1)
        library = cons.extend(library)  # with the columns the budgets bound (blueprints, library.json)
        hom_res = None
        if problem.spec.search_space.compare_homogeneous and not problem.spec.search_space.homogeneous:
            hom_res = homogeneous_solve(library, cons)
        prec = problem.spec.search_space.precision
        compare_fixed = prec.compare_fixed and prec.searched() and slo_w is None
        fixed_res = fixed_recipe_solve(problem, library, cons) if compare_fixed else None
        t["solve_s"] = time.perf_counter() - t2

        parent_pred = bpm.predict(problem.parent, problem)

        def blueprint(r: mip.Result) -> Any:
            return bpm.make_blueprint(problem, library, alts, r, cons, qsource,
                                      child_arch(problem, library, r.chosen, alts), parent_pred)

        blueprints = [blueprint(r) for r in results]
        hom_bp = blueprint(hom_res) if hom_res is not None and hom_res.ok else None
        fixed_bp = blueprint(fixed_res) if fixed_res is not None and fixed_res.ok else None
        sweep = None
        writers: list[Any] = []  # deferred: every output is written at the end, as one set
        if problem.spec.solver.sweep is not None:
            t3 = time.perf_counter()
            n_points = 1 if problem.spec.solver.sweep.batch_sizes else \
                len(sweep_values(problem)) * (1 + problem.spec.search_space.compare_homogeneous)
            with Progress(n_points, "sweeping", progress) as bar:
                hom = problem.spec.search_space.homogeneous
                if problem.spec.solver.sweep.batch_sizes:
                    sweep = run_batch_sweep(problem, alts, quality, hom, progress=False)
                    if problem.spec.search_space.compare_homogeneous:
                        sweep["homogeneous"] = run_batch_sweep(problem, alts, quality, True,
                                                               progress=False)["points"]
                    bar.update(1)
                else:
                    sweep = run_sweep(problem, library, cons, priced, homogeneous=hom,
                                      on_point=bar.update)
                    if problem.spec.search_space.compare_homogeneous:
                        sweep["homogeneous"] = run_sweep(problem, library, cons, priced,
                                                         homogeneous=True,
                                                         on_point=bar.update)["points"]
                    if compare_fixed:  # one recipe for all vs precision searched
                        sweep["fixed_recipe"] = run_sweep(
                            problem, library, cons, priced, on_point=bar.update,
                            forbid=fixed_recipe_forbid(library))["points"]
            t["sweep_s"] = time.perf_counter() - t3
            pts = [(p["metric"], p["quality"]) for p in sweep["points"] if p["metric"] is not None]
            base = [(p["metric"], p["quality"]) for p in sweep.get("homogeneous", [])
                    if p["metric"] is not None] or None
            par = sweep["parent"]
            unit = sweep["unit"]
            label = f"{sweep['metric']}" + (f"@{sweep['workload']}" if sweep["workload"] else "")
            more = {f"one recipe for all ({problem.recipe.name})":
                    [(p["metric"], p["quality"]) for p in sweep["fixed_recipe"]
                     if p["metric"] is not None]} if "fixed_recipe" in sweep else None
            chosen = _chosen_point(problem, sweep, results[0])
            writers.append(lambda folder: bpm.plot_pareto(
                folder / "pareto.png", label, unit, pts, (par["metric"], par["quality"]), base,
                quality_label=f"quality: {qsource}",
                title=f"{problem.spec.name}: quality vs {label}", more=more, chosen=chosen,
                higher_is_better=sweep["metric"] in HIGHER_IS_BETTER))
    t["total_s"] = time.perf_counter() - t0
    report = bpm.report_markdown(blueprints[0], hom_bp, fixed=fixed_bp)
    extra: dict[str, Any] = {"library.json": library_json(library)}
    if slo_sweep is not None:
        pt = slo_sweep.parent
        extra["slo_sweep.json"] = {
            "workload": slo_sweep.workload, "slo": problem.spec.workloads[slo_sweep.workload].slo,
            "best_concurrency": slo_sweep.best,
            "parent": {"concurrency": pt.concurrency, "throughput_tok_s": pt.throughput_tok_s,
                       "per_user_tok_s": pt.per_user_tok_s},
            "points": slo_sweep.points}
    if sweep is not None:
        extra["sweep.json"] = sweep
    files = bpm.save_outputs(out_dir, blueprints, report, extra, writers)
    return SearchOutcome(problem, library, blueprints, hom_bp, sweep, files, t)
