"""Blueprints (the chosen child + predicted costs + provenance), reports and plots.

``blueprint.json`` keys: ``format``, ``name``, ``child`` (the child's HF config, readable by
``puzzle-nas inspect`` and ``puzzle-nas build``), ``choices`` (one entry per parent block),
``predicted`` (per workload, parent and child side by side, re-priced from the child's
architecture through ``costmodels``, not read back from the library sums), ``params``,
``quality`` (value and source), ``budgets`` (each with the child's value and whether it
binds), ``solver`` (``status``, ``gap``, ``seconds``, ``objective``, ``best_bound``,
``nodes``), ``provenance`` (spec hash, profile, recipe, package version, time) and
``engines`` (the spec's ``deploy.engines``, whether each serving engine loads the child and
why not, the tied choices and what the engines took out of the space; see
:func:`engines_section` and ``docs/engines.md``).
"""

from __future__ import annotations

import datetime as _dt
import functools
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict

from costmodels.blocks import BlockCosts, price_blocks
from costmodels.measured import (
    BlockMeasurements,
    load_blocks,
    nonblock_row,
    nonblock_steps,
    price_measured,
)
from costmodels.model import NonBlockShape, max_concurrency, price_nonblock, summarize
from costmodels.workload import Workload
from hwprofiles.errors import InputError
from hwprofiles.units import gb_gib
from nas import __version__
from nas.arch import ModelArch, mtp_table
from nas.hf import to_hf
from nas.io import (
    atomic_write,
    atomic_write_json,
    atomic_write_text,
    check_output_dir,
    staged_dir,
)


class Blueprint(BaseModel):
    """The file format of ``blueprint.json``."""

    model_config = ConfigDict(extra="allow")

    format: str = "puzzle-nas/blueprint"
    version: int = 1
    name: str
    child: dict[str, Any]
    choices: list[dict[str, Any]]
    predicted: dict[str, Any]
    params: dict[str, Any]
    quality: dict[str, Any]
    budgets: list[dict[str, Any]]
    solver: dict[str, Any]
    provenance: dict[str, Any]


def nonblock_shape(arch: ModelArch) -> NonBlockShape:
    """The shape of ``arch``'s non-block parts (embeddings, final norm, LM head)."""
    return NonBlockShape(arch.hidden_size, arch.vocab_size, arch.tie_embeddings, arch.final_norm)


def predict(arch: ModelArch, problem: Any, recipes: list[str] | None = None
            ) -> dict[str, Any]:
    """Serving figures of ``arch`` for every workload of ``problem`` (a ``nas.search.Problem``):
    TTFT, TPOT, latency, throughput per GPU and node, per-user tok/s, memory, and the largest
    concurrency that fits at the workload's context (isl + osl). ``recipes``: a precision
    recipe name per block (``nas.space.spans``; default: the problem's one recipe)."""
    wls = list(problem.workloads.values())
    target = problem.target
    kw = target.block_kwargs()
    if recipes is not None:  # a precision per block: each row under its own recipe
        from costmodels.dtypes import get_recipe
        from nas.space.spans import price_mixed

        blocks = price_mixed(arch.table, [get_recipe(r) for r in recipes], problem.hw, wls,
                             tp=target.tp, ep=target.ep, attention_dp=target.attention_dp,
                             engine=target.engine)
    else:
        blocks = price_blocks(arch.table, problem.hw, problem.recipe, wls, **kw)
    mtp = any(w.draft_tokens > 0 for w in wls)  # speculative decoding with the MTP head
    meas = measured_blocks(problem)
    if meas is not None:  # block runtimes measured (nas.search prices the library the same)
        blocks = price_measured(arch.table, problem.hw, problem.recipe, meas, wls,
                                tp=target.tp, ep=target.ep,
                                attention_dp=target.attention_dp)
    # after the measured blocks, which refuse what was not timed (TP, drafts) in one line
    nb = price_nonblock(nonblock_shape(arch), problem.hw, problem.recipe, wls,
                        **target.nonblock_kwargs([mtp]),
                        measured=measured_nonblock(meas, arch))
    if mtp:  # the MTP head's draft rows, priced as nas.search prices them
        head = mtp_table(arch)
        if head is None:
            raise InputError("the model has no MTP head to draft tokens with",
                             field="workloads.draft_tokens")
        blocks = BlockCosts.concat([blocks, price_blocks(
            head, problem.hw, problem.recipe, wls,
            **target.block_kwargs([True] * len(head)))])
    mc = summarize(blocks, nb, problem.hw, reserve_bytes=problem.reserve_bytes)
    out = {}
    d = mc.to_dict()
    for i, w in enumerate(wls):
        row = d["workloads"][i]
        try:
            conc = max_concurrency(blocks, nb, problem.hw, w.max_context,
                                   reserve_bytes=problem.reserve_bytes).max_concurrency
        except ValueError:
            conc = None
        row["max_concurrency"] = conc
        row["context"] = w.max_context
        out[w.name] = row
    return out


def measured_nonblock(meas: BlockMeasurements | None, arch: ModelArch
                      ) -> Callable[[Workload], tuple[float, float]] | None:
    """The measured non-block step of ``arch`` when the spec's block table timed it
    (:func:`costmodels.measured.nonblock_steps`), else None (the roofline prices it)."""
    if meas is None:
        return None
    return nonblock_steps(meas, nonblock_row(arch.hidden_size, arch.vocab_size,
                                             arch.tie_embeddings, arch.final_norm))


def measured_blocks(problem: Any) -> BlockMeasurements | None:
    """The measured block table a search prices block runtimes with (the spec's ``"costs":
    {"measured": "BLOCKS.json"}``, relative to the spec), or ``None`` (analytic)."""
    costs = getattr(getattr(problem, "spec", None), "costs", None)
    path = getattr(costs, "measured", None)
    if path is None:
        return None
    for name, w in problem.spec.workloads.items():
        if w.slo is not None or w.concurrency_sweep is not None:
            raise InputError(f"workload {name!r}: SLO searches and concurrency sweeps are "
                             "priced analytically only; drop costs.measured or the SLO",
                             field="costs.measured")
    p = Path(path)
    p = p if p.is_absolute() else Path(problem.base_dir) / p
    if not p.is_file():
        return load_blocks(p)  # raises the one-line error
    return _load_measured(str(p.resolve()), p.stat().st_mtime_ns)


@functools.lru_cache(maxsize=4)
def _load_measured(path: str, mtime_ns: int) -> BlockMeasurements:
    return load_blocks(path)


def block_costs_label(problem: Any) -> str:
    """Where block runtimes come from, for reports: ``measured on <device> (...)`` or
    ``analytic (<profile>)``."""
    m = measured_blocks(problem)
    if m is None:
        return f"analytic ({problem.hw.name})"
    return (f"measured on {m.device} ({m.device_kind}, {m.dtype}, torch "
            f"{m.software.get('torch', '?')}, {m.date}); memory analytic")


def _pct(child: float, parent: float) -> str:
    return f"{100.0 * child / parent:.1f}%" if parent else "-"


def make_blueprint(problem: Any, library: Any, alts: Any, result: Any, cons: Any,
                   quality_source: str, child: ModelArch,
                   parent_predicted: dict[str, Any] | None = None) -> Blueprint:
    """Assemble the blueprint of one solution (``parent_predicted``: the parent's
    :func:`predict`, to share between the blueprints of one run)."""
    flat = [a for block in alts for a in block]
    pa = problem.parent
    wide = any(a.end is not None or a.recipe is not None for a in flat)
    choices = []
    for r in result.chosen:
        a = flat[int(r)]
        choices.append({"block": a.block, "parent": pa.blocks[a.block].describe(),
                        "child": a.child.describe(), "change": a.label,
                        "kind": a.child.kind,
                        "quality": float(library.scores["quality"][r])})
        if wide:  # spans merged and the precision per block (nas.space.spans)
            stop = a.block + 1 if a.end is None else a.end
            choices[-1].update(
                end=stop, parent=" + ".join(b.describe() for b in pa.blocks[a.block:stop]),
                child=" + ".join(b.describe() for b in a.blocks) or "removed",
                precision=a.recipe or problem.recipe.name)
    pp, cp = pa.param_counts(), child.param_counts()
    pred_p = parent_predicted if parent_predicted is not None else predict(pa, problem)
    recipes = None
    # the fields Blueprint does not declare (extra="allow"): stand_in and precision when
    # wide, then engines; passed as one mapping, in this order, so that the dump keeps it
    extra: dict[str, Any] = {}
    child_hf = to_hf(child)
    if wide:
        from nas.search.quant_config import quantization_config
        from nas.space.spans import child_blocks, stand_in

        kids, recipes, origin = child_blocks(pa, [flat[int(r)] for r in result.chosen],
                                             problem.recipe)
        qc = quantization_config(child, recipes, child_hf["model_type"], __version__)
        if qc is not None:
            child_hf["quantization_config"] = qc
        # the parent block each child block stands in for (nas.child.spans inits from it)
        extra = {"stand_in": stand_in(pa, kids, origin), "precision": recipes}
    pred_c = predict(child, problem, recipes)
    extra["engines"] = engines_section(problem, cons, child, recipes)
    predicted = {name: {"parent": pred_p[name], "child": pred_c[name]} for name in pred_p}
    budgets = []
    for (bi, key), row in zip(cons.origin, cons.budgets):
        value = float(result.totals.get(key, math.nan))
        bound = row.hi if row.hi is not None else row.lo
        slack = (bound - value) if row.hi is not None else (value - bound)
        budgets.append({"spec_index": bi, "spec": cons.described[bi], "key": key,
                        "bound": bound, "child_value": value,
                        "binding": bool(abs(slack) <= 1e-3 * max(abs(bound), 1e-12)),
                        "slack": slack})
    for bi, rule in zip(cons.count_origin, cons.counts):
        n = float(sum(library.lengths[r] for r in result.chosen if rule.tag in library.tags[r]))
        budgets.append({"spec_index": bi, "spec": cons.described[bi],
                        "key": f"count:{rule.tag}",
                        "bound": rule.min if rule.min is not None else rule.max,
                        "child_value": n, "binding": bool(n in (rule.min, rule.max)),
                        "slack": (n - rule.min) if rule.min is not None else rule.max - n})
    return Blueprint(
        name=problem.spec.name,
        child=child_hf,
        **extra,
        choices=choices,
        predicted=predicted,
        params={"parent_total": pp.total, "parent_active": pp.active,
                "child_total": cp.total, "child_active": cp.active},
        quality={"value": float(result.totals.get("quality", math.nan)),
                 "source": quality_source,
                 "is_prior": "prior" in quality_source},
        budgets=budgets,
        solver={"status": result.status, "objective": result.objective, "gap": result.gap,
                "best_bound": result.best_bound, "nodes": result.nodes,
                "seconds": result.seconds, "message": result.message,
                "objective_key": str(cons.objective)},
        provenance={"spec_hash": problem.spec_hash, "profile": problem.hw.name,
                    "block_costs": block_costs_label(problem),
                    "recipe": problem.recipe.name, "tp": problem.tp, "ep": problem.ep,
                    "package": "puzzle-nas", "version": __version__,
                    "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")},
    )


def engines_section(problem: Any, cons: Any, child: ModelArch,
                    recipes: list[str] | None) -> dict[str, Any]:
    """The blueprint's ``engines``: the ``targets`` (``deploy.engines``), per engine of
    :data:`nas.engines.ENGINES` whether it ``loads`` the child and ``why`` not (one line),
    the ``ties`` the search held and the ``notes`` on what the engines took out of the
    space. A target engine that cannot load the child is a bug of the search (the space
    was restricted to what it loads): :class:`nas.mip.SolverError`."""
    from nas import engines as eng
    from nas.mip import SolverError

    deploy = getattr(problem.spec, "deploy", None)
    targets = list(deploy.engines or []) if deploy is not None else []
    pa = problem.parent
    load: list[dict[str, Any]] = []
    if eng.family_of(pa.model_type) is not None:
        load = eng.report(pa, child, None, recipes is not None and len(set(recipes)) > 1)
    for row in load:
        if row["engine"] in targets and not row["loads"]:
            raise SolverError(f"the child searched for {row['engine']} does not load in it: "
                              f"{row['why']}")
    return {"targets": targets, "load": load,
            "ties": [str(t) for t in getattr(cons, "ties", [])],
            "notes": list(getattr(cons, "engine_notes", []))}


def engine_lines(bp: Blueprint) -> list[str]:
    """One line per engine: ``vllm: loads`` or ``trtllm: does not load: <why>``."""
    info = getattr(bp, "engines", None) or {}
    out = []
    for row in info.get("load", []):
        tag = " (target)" if row["engine"] in info.get("targets", []) else ""
        out.append(f"{row['engine']}{tag}: " + ("loads" if row["loads"]
                                                 else f"does not load: {row['why']}"))
    return out


def budget_in_user_terms(bp: Blueprint, b: dict[str, Any]) -> tuple[str, str] | None:
    """(child, bound) of a memory budget in GB (GiB), or of a throughput or per-user-speed
    budget in tok/s (the terms the spec used) instead of the runtime bound the MIP works on: the rate is inversely proportional
    to the bounded time, so bound_rate = child_rate * child_time / time_bound."""
    key, spec = str(b.get("key", "")), str(b.get("spec", ""))
    if key.startswith(("memory_bytes", "weight_bytes")) and b.get("bound") is not None:
        return gb_gib(b["child_value"]), gb_gib(b["bound"])
    for prefix, field, word in (("runtime_s@", "throughput_tok_s", "throughput"),
                                ("tpot_s@", "per_user_tok_s", "per_user_tps")):
        if key.startswith(prefix) and word in spec:
            w = key[len(prefix):]
            child = bp.predicted.get(w, {}).get("child", {}).get(field)
            t, bound = b.get("child_value"), b.get("bound")
            if child is None or not t or not bound:
                return None
            unit = "tok/s/GPU" if word == "throughput" else "tok/s/user"
            return f"{child:,.1f} {unit}", f"{child * t / bound:,.1f} {unit}"
    return None


def report_markdown(bp: Blueprint, homogeneous: Blueprint | None = None,
                    fixed: Blueprint | None = None) -> str:
    """A readable summary of a blueprint (``fixed``: the best child with the spec's one
    precision recipe for all blocks, when precision was searched per block)."""
    lines = [f"# puzzle-nas search: {bp.name}", ""]
    q = bp.quality
    lines.append(f"Quality source: **{q['source']}**" + (
        " — the scores are a structural prior, not measurements." if q["is_prior"] else ""))
    s = bp.solver
    gap = "-" if s["gap"] is None else f"{s['gap']:.2e}"
    obj = "-" if s["objective"] is None else f"{s['objective']:.6g}"
    lines.append(f"Solver: {s['status']}, objective {obj}, gap {gap}, "
                 f"{s['seconds']:.3f} s ({s['objective_key']}).")
    pv = bp.provenance
    lines.append(f"Hardware: {pv['profile']} (tp={pv['tp']}, ep={pv['ep']}), precision "
                 f"{pv['recipe']}, spec {pv['spec_hash']}, puzzle-nas {pv['version']}.")
    if pv.get("block_costs"):
        lines.append(f"Block runtimes: {pv['block_costs']}.")
    p = bp.params
    lines += ["", "## Parameters", "",
              "| | parent | child | child / parent |", "|---|---:|---:|---:|",
              f"| total | {p['parent_total'] / 1e9:.2f} B | {p['child_total'] / 1e9:.2f} B | "
              f"{_pct(p['child_total'], p['parent_total'])} |",
              f"| active | {p['parent_active'] / 1e9:.2f} B | {p['child_active'] / 1e9:.2f} B | "
              f"{_pct(p['child_active'], p['parent_active'])} |"]
    lines += ["", "## Per workload (predicted)", "",
              "| workload | figure | parent | child | child / parent |",
              "|---|---|---:|---:|---:|"]
    for name, pc in bp.predicted.items():
        pa, ch = pc["parent"], pc["child"]
        rows = [("TTFT", "ttft_s", lambda v: f"{v * 1e3:.1f} ms"),
                ("decode / token", "tpot_s", lambda v: f"{v * 1e3:.2f} ms"),
                ("throughput / GPU", "throughput_tok_s", lambda v: f"{v:,.0f} tok/s"),
                ("per-user speed", "per_user_tok_s", lambda v: f"{v:,.1f} tok/s"),
                ("memory / GPU", "memory_bytes", gb_gib)]
        for label, key, f in rows:
            cells = [f(pa[key]), f(ch[key])]
            if key == "memory_bytes":  # the same marker `cost` prints
                cells = [c + ("" if r.get("fits", True) else " **DOES NOT FIT**")
                         for c, r in zip(cells, (pa, ch))]
            lines.append(f"| {name} | {label} | {cells[0]} | {cells[1]} | "
                         f"{_pct(ch[key], pa[key])} |")
        lines.append(f"| {name} | max concurrency @ {pa['context']:,} tokens | "
                     f"{pa['max_concurrency']} | {ch['max_concurrency']} | |")
    lines += ["", "## Budgets", "", "| budget | MIP key | bound | child | binds |",
              "|---|---|---:|---:|:---:|"]
    for b in bp.budgets:
        user = budget_in_user_terms(bp, b)
        bound, child = (f"{b['bound']:.6g}", f"{b['child_value']:.6g}") if user is None else (
            f"{user[1]} ({b['bound']:.6g})", f"{user[0]} ({b['child_value']:.6g})")
        lines.append(f"| {b['spec']} | `{b['key']}` | {bound} | "
                     f"{child} | {'**yes**' if b['binding'] else 'no'} |")
    if not bp.budgets:
        lines.append("| (none) | | | | |")
    changed = [c for c in bp.choices if c["change"] != "parent"]
    lines += ["", f"## Blocks ({len(changed)} of {len(bp.choices)} changed)", "",
              "| block | parent | child | change | quality |", "|---:|---|---|---|---:|"]
    wide = any("precision" in c for c in bp.choices)
    if wide:  # spans merged (a row per span) and the precision of every block
        lines[-2:] = ["| blocks | parent | child | change | precision | quality |",
                      "|---:|---|---|---|---|---:|"]
    for c in bp.choices:
        mark = "" if c["change"] == "parent" else "**"
        if wide:
            span = (f"{c['block']}" if c["end"] == c["block"] + 1
                    else f"{c['block']}-{c['end'] - 1} (merged)")
            lines.append(f"| {span} | {c['parent']} | {mark}{c['child']}{mark} | "
                         f"{c['change']} | {c['precision']} | {c['quality']:.4g} |")
            continue
        lines.append(f"| {c['block']} | {c['parent']} | {mark}{c['child']}{mark} | "
                     f"{c['change']} | {c['quality']:.4g} |")
    info = getattr(bp, "engines", None) or {}
    if info.get("load"):
        lines += ["", "## Engines", ""]
        if info.get("targets"):
            lines.append(f"Searched for: {', '.join(info['targets'])} (the space holds only "
                         "what every one of them loads; docs/engines.md).")
            lines += [f"- {n}" for n in info.get("notes", [])]
            lines.append("")
        lines += [f"- {line}" for line in engine_lines(bp)]
    if homogeneous is not None:
        lines += ["", "## Homogeneous baseline (same budgets)", "",
                  f"Quality {homogeneous.quality['value']:.6g} vs searched "
                  f"{bp.quality['value']:.6g} (lower is better); params "
                  f"{homogeneous.params['child_total'] / 1e9:.2f} B."]
    if fixed is not None:
        lines += ["", "## One recipe for all vs precision searched (same budgets)", "",
                  f"Quality {fixed.quality['value']:.6g} with {fixed.provenance['recipe']} "
                  f"for every block vs {bp.quality['value']:.6g} with a recipe per block "
                  "(lower is better; the searched space contains the one-recipe child)."]
    return "\n".join(lines) + "\n"


SEARCH_OUTPUTS = ("blueprint.json", "blueprint-*.json", "report.md", "library.json",
                  "sweep.json", "slo_sweep.json", "pareto.png", "realized.json", "deploy.json",
                  "deploy_front.png")
"""The files a search writes (an existing output folder may hold only these: the run
replaces the folder whole)."""


def is_search_output(name: str) -> bool:
    """``name`` is a file :func:`save_outputs` writes (or a killed run's temp entry)."""
    import fnmatch

    return name.startswith(".") and name.endswith((".tmp", ".old")) or any(
        fnmatch.fnmatchcase(name, p) for p in SEARCH_OUTPUTS)


def save_outputs(out_dir: str | Path, blueprints: list[Blueprint], report: str,
                 extra: dict[str, Any] | None = None,
                 writers: list[Callable[[Path], Path]] | None = None) -> list[Path]:
    """Write ``blueprint.json`` (the best), ``blueprint-<k>.json`` for the rest of a pool,
    ``report.md``, any extra JSON files and what ``writers`` (each ``f(folder) -> path``)
    write, as one set: into a temporary sibling folder swapped in whole when all are written
    (:func:`nas.io.staged_dir`), so ``out_dir`` holds the old set or the new one, never a mix,
    and an earlier run's files this run does not write are gone. Returns the final paths."""
    out = Path(out_dir)
    check_output_dir(out, is_search_output, "output folder")
    with staged_dir(out, "output folder") as tmp:
        paths = [atomic_write_json(tmp / "blueprint.json", blueprints[0].model_dump())]
        for k, bp in enumerate(blueprints[1:], start=2):
            paths.append(atomic_write_json(tmp / f"blueprint-{k}.json", bp.model_dump()))
        paths.append(atomic_write_text(tmp / "report.md", report))
        for name, obj in (extra or {}).items():
            paths.append(atomic_write_json(tmp / name, obj))
        for w in writers or []:
            paths.append(w(tmp))
    return [out / p.name for p in paths]


def plot_pareto(path: str | Path, metric: str, unit: str, points: list[tuple[float, float]],
                parent: tuple[float, float], baseline: list[tuple[float, float]] | None = None,
                quality_label: str = "quality score (lower is better)",
                title: str = "",
                more: dict[str, list[tuple[float, float]]] | None = None,
                chosen: tuple[float, float] | None = None,
                higher_is_better: bool = False) -> Path:
    """Quality vs the swept cost: the searched frontier, the parent, a baseline, and any
    ``more`` frontiers by label (e.g. one precision recipe for all blocks); ``chosen`` is
    the child the search returned (blueprint.json), marked apart; an arrow in the corner
    points the way that is better: lower quality score, and a higher swept metric when
    ``higher_is_better`` (throughput), else a lower one (memory, latency). Written
    atomically; the figure is :func:`pareto_figure`'s."""
    import matplotlib.pyplot as plt

    fig = pareto_figure(metric, unit, points, parent, baseline, quality_label, title, more,
                        chosen, higher_is_better)
    atomic_write(path, lambda p: fig.savefig(p, format="png"))
    plt.close(fig)
    return Path(path)


def pareto_figure(metric: str, unit: str, points: list[tuple[float, float]],
                  parent: tuple[float, float], baseline: list[tuple[float, float]] | None = None,
                  quality_label: str = "quality score (lower is better)", title: str = "",
                  more: dict[str, list[tuple[float, float]]] | None = None,
                  chosen: tuple[float, float] | None = None,
                  higher_is_better: bool = False) -> Any:
    """The matplotlib figure of :func:`plot_pareto` (Agg backend; close it when done)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5), dpi=120)
    if points:
        xs, ys = zip(*sorted(points))
        ax.plot(xs, ys, "o-", color="tab:blue", label="searched (heterogeneous)")
    if baseline:
        xs, ys = zip(*sorted(baseline))
        ax.plot(xs, ys, "s--", color="tab:orange", label="homogeneous baseline")
    for (name, pts), color in zip((more or {}).items(), ("tab:green", "tab:red", "tab:purple")):
        if pts:
            xs, ys = zip(*sorted(pts))
            ax.plot(xs, ys, "^:", color=color, label=name)
    ax.plot([parent[0]], [parent[1]], "*", color="black", markersize=14, label="parent")
    if chosen is not None:
        ax.plot([chosen[0]], [chosen[1]], "D", color="tab:red", markersize=11,
                markerfacecolor="none", markeredgewidth=2, label="chosen (blueprint.json)")
    # which way is better: down (lower score) and toward the better end of the metric
    dx = 1.0 if higher_is_better else -1.0
    x0 = 0.12 if dx < 0 else 0.88
    ax.annotate("better", xy=(x0 + 0.07 * dx, 0.06), xytext=(x0, 0.2),
                xycoords="axes fraction", textcoords="axes fraction", ha="center",
                arrowprops={"arrowstyle": "->", "color": "tab:green", "lw": 2},
                color="tab:green", fontweight="bold")
    ax.set_xlabel(f"{metric} ({unit}), {'higher' if higher_is_better else 'lower'} is better")
    ax.set_ylabel(quality_label if "better" in quality_label
                  else f"{quality_label}, lower is better")
    ax.set_title(title)
    ax.grid(True, alpha=0.3)
    ax.legend()
    fig.tight_layout()
    return fig
