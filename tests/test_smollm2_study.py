"""The SmolLM2-135M study end to end at smoke sizes (``examples/smollm2-135m/run.py
--smoke``) on a tiny Llama written as a GGUF file: every phase completes, the data splits
never share a file, every child meets its budget, the baselines are what they claim, and a
rerun computes nothing again. Nothing here asserts which method wins (the full run's
results.md reports that)."""

from __future__ import annotations

import json
import os

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("gguf")
pytest.importorskip("accelerate")
pytest.importorskip("tokenizers")
pytest.importorskip("matplotlib")
pytestmark = pytest.mark.torch

from conftest import example_script  # noqa: E402
from test_gguf import write_gguf  # noqa: E402


def _script():  # type: ignore[no-untyped-def]  # the example module, untyped
    return example_script("smollm2-135m", "smollm2_run")


@pytest.fixture(scope="module")
def smoke(tmp_path_factory):
    d = tmp_path_factory.mktemp("smollm2")
    old = os.environ.get("PUZZLE_NAS_CACHE")
    os.environ["PUZZLE_NAS_CACHE"] = str(d / "cache")
    try:
        gg = write_gguf(d / "tiny.gguf", tokenizer=True)
        run = _script()
        rc = run.main(["--smoke", "--parent", str(gg), "-o", str(d / "out"), "--threads", "1"])
        res = json.loads((d / "out" / "results.json").read_text())
        yield run, d, rc, res
    finally:
        if old is None:
            os.environ.pop("PUZZLE_NAS_CACHE", None)
        else:
            os.environ["PUZZLE_NAS_CACHE"] = old


def test_every_phase_runs_and_writes_its_report(smoke):
    run, d, rc, res = smoke
    assert rc == 0
    assert set(res["timings"]) == set(run.PHASES)
    assert (d / "out" / "results.md").is_file() and (d / "out" / "results.png").is_file()
    text = (d / "out" / "results.md").read_text()
    assert "## Verdict" in text and "Spearman" in text


def test_the_splits_are_by_file_and_never_overlap(smoke):
    run, d, _, _ = smoke
    split = json.loads((d / "out" / "data" / "split.json").read_text())["splits"]
    files = {k: set(v["files_read"]) for k, v in split.items()}
    assert files["eval"] and files["calib"] and files["distill"]
    assert not files["eval"] & files["calib"] and not files["eval"] & files["distill"]
    assert not files["calib"] & files["distill"]
    for k, fs in files.items():
        assert all(run.split_of(f) == k for f in fs)


def test_every_child_meets_its_budget_and_is_measured(smoke):
    run, _, _, res = smoke
    cfg = run.SMOKE
    for b in cfg.budgets:
        rows = [r for r in res["children"] if r["budget"] == b]
        assert {"a", "d", "e"} <= {r["method"] for r in rows}
        for r in rows:
            assert r["predicted_throughput_x"] >= b * (1 - 1e-6), r["name"]
            assert r["measured_ours_throughput_x"] > 0 and "hf_error" not in r["speed"]
            assert r["quality"]["kl_div"] >= 0 and "0" in r["distilled"]
        pool = res["pools"][f"x{b:g}"]
        measured = [m for pl in pool["pools"].values() for m in pl["measured_kl"]]
        assert pool["n"] == len(measured) and set(pool["pools"]) >= {"budget"}
        chosen = next(r for r in rows if r["name"] == pool["chosen"])
        assert "realized best" in chosen["role"]
        assert chosen["selection"]["kl_div"] == min(measured)
    # the searched child (the realized pools' lowest pre-distillation KL) and the best
    # baseline of each budget got every seed
    for b in cfg.budgets:
        tag = f"x{b:g}"
        a = [r for r in res["children"] if r["budget"] == b and r["method"] == "a"]
        assert res["searched"][tag] == min(a, key=lambda r: r["quality"]["kl_div"])["name"]
    for r in res["children"]:
        tag = f"x{r['budget']:g}"
        if r["name"] in (res["searched"][tag], res["best_baseline"][tag]):
            assert set(r["distilled"]) == {str(s) for s in cfg.seeds}, r["name"]


def test_the_iterative_child_runs_two_stages_at_the_same_token_budget(smoke):
    """(b): two stages (the midpoint budget, then the budget), half the distillation tokens
    each, the final child within the budget against the original parent, measured before
    and after its last distillation."""
    run, d, _, res = smoke
    cfg = run.SMOKE
    for b in cfg.budgets:
        rows = [r for r in res["children"] if r["budget"] == b and r["method"] == "b"]
        assert len(rows) == 1
        r = rows[0]
        assert r["stage_budgets"] == [1 + (b - 1) / 2, b]
        assert r["predicted_throughput_x"] >= b * (1 - 1e-6)
        assert r["predicted_kl"] is None and r["quality"]["kl_div"] >= 0
        post = r["distilled"]["0"]
        assert len(post["stages"]) == 2
        assert post["tokens_trained"] <= cfg.kd_tokens
        rec = json.loads((d / "out" / "iterative" / f"x{b:g}" / "seed-0" / "iterate.json")
                         .read_text())
        assert [st["index"] for st in rec["stages"]] == [0, 1]
    assert "(b) iterative Puzzle" in (d / "out" / "results.md").read_text()


def test_the_depth_baseline_drops_whole_layers_of_lowest_influence(smoke):
    _, _, _, res = smoke
    infl = res["block_influence"]
    for r in res["children"]:
        if r["method"] != "d":
            continue
        gone = r["dropped_layers"]
        assert max(infl[i] for i in gone) <= min(
            (infl[i] for i in range(len(infl)) if i not in gone), default=float("inf"))
        for b, ch in enumerate(r["choices"]):
            assert (ch == "noop") == (b // 2 in gone)


def test_the_uniform_baseline_is_one_choice_per_kind(smoke):
    _, _, _, res = smoke
    for r in res["children"]:
        if r["method"] == "c":
            assert len(set(r["choices"][0::2])) == 1 and len(set(r["choices"][1::2])) == 1
            assert "noop" not in r["choices"]


def test_a_rerun_computes_nothing_again(smoke, capsys):
    run, d, _, res = smoke
    before = {p: p.stat().st_mtime_ns for p in (d / "out").rglob("measured.json")}
    assert run.main(["--smoke", "--parent", str(d / "tiny.gguf"), "-o", str(d / "out"),
                     "--threads", "1"]) == 0
    after = {p: p.stat().st_mtime_ns for p in (d / "out").rglob("measured.json")}
    assert before == after and len(before) >= len(res["children"]) + 1
    again = json.loads((d / "out" / "results.json").read_text())
    assert again["children"] == res["children"]


def test_report_only_rewrites_the_report_from_the_results(smoke, tmp_path):
    run, d, _, _ = smoke
    assert run.main(["--smoke", "-o", str(d / "out"), "--results", str(tmp_path),
                     "--report-only"]) == 0
    assert (tmp_path / "results.md").read_text() == (d / "out" / "results.md").read_text()
    assert (tmp_path / "results.png").is_file() and (tmp_path / "results.json").is_file()


def _drop_seed(res: dict, seed: str) -> list[tuple[float, str, dict]]:
    """Remove ``seed``'s figures from every row the seeds phase distilled with it; returns
    (budget, name, figures) of each removed one."""
    dropped = []
    for row in res["children"]:
        fig = row.get("distilled", {}).pop(seed, None)
        if fig is not None:
            dropped.append((row["budget"], row["name"], fig))
    return dropped


def test_finish_seeds_rebuilds_only_what_is_missing_on_a_fresh_machine(smoke, tmp_path):
    """A new machine has the committed results.json but not the work folder: the missing
    seeds' children are rebuilt from their recorded choices (only their alternatives
    scored), checked against the recorded KL, and distilled to the figures the first run
    got."""
    run, d, _, res = smoke
    committed = json.loads(json.dumps(res))
    dropped = _drop_seed(committed, "1")
    assert dropped  # the seeds phase ran seed 1 on the searched child and the best baseline
    (tmp_path / "res").mkdir()
    (tmp_path / "res" / "results.json").write_text(json.dumps(committed))
    assert run.main(["--smoke", "--parent", str(d / "tiny.gguf"), "-o", str(tmp_path / "fresh"),
                     "--results", str(tmp_path / "res"), "--finish-seeds",
                     "--threads", "1"]) == 0
    out = json.loads((tmp_path / "res" / "results.json").read_text())
    rows = {(r["budget"], r["name"]): r for r in out["children"]}
    for budget, name, fig in dropped:
        row = rows[(budget, name)]
        rb = row["rebuilt"]
        assert rb["kl_div_rebuilt"] == pytest.approx(rb["kl_div_recorded"], rel=1e-5)
        assert row["folder"].startswith(str(tmp_path / "fresh")) and "folder_first" in row
        assert row["distilled"]["1"]["quality"]["kl_div"] == pytest.approx(
            fig["quality"]["kl_div"], rel=1e-5)
    # the scoring ran only the rebuilt children's weighted alternatives
    scored = (tmp_path / "fresh" / "scores" / "scores.csv").read_text().splitlines()[1:]
    assert len(scored) < sum(1 for _ in (d / "out" / "scores" / "scores.csv").open()) - 1
    assert (tmp_path / "res" / "results.md").is_file()


def test_finish_seeds_refuses_a_child_that_is_not_the_recorded_one(smoke, tmp_path):
    run, d, _, res = smoke
    committed = json.loads(json.dumps(res))
    dropped = _drop_seed(committed, "1")
    budget, name, _ = dropped[0]
    for row in committed["children"]:
        if (row["budget"], row["name"]) == (budget, name):
            row["quality"]["kl_div"] *= 1.5  # not what this child measures
    (tmp_path / "res").mkdir()
    (tmp_path / "res" / "results.json").write_text(json.dumps(committed))
    with pytest.raises(SystemExit, match="is not the recorded"):
        run.main(["--smoke", "--parent", str(d / "tiny.gguf"), "-o", str(tmp_path / "fresh"),
                  "--results", str(tmp_path / "res"), "--finish-seeds", "--threads", "1"])


def test_finish_iterate_runs_b_from_the_committed_state_alone(smoke, tmp_path):
    """A new machine has results.json and state/ (profile and every alternative's score)
    but no BLD blocks: (b) is run again, stage 0 searching the committed scores and scoring
    only its child's alternatives, and lands where the first run's (b) did."""
    run, d, _, res = smoke
    committed = json.loads(json.dumps(res))
    first = [r for r in committed["children"] if r["method"] == "b"]
    assert first
    committed["children"] = [r for r in committed["children"] if r["method"] != "b"]
    (tmp_path / "res").mkdir()
    (tmp_path / "res" / "results.json").write_text(json.dumps(committed))
    run.save_state(d / "out", tmp_path / "res" / "state")
    assert run.main(["--smoke", "--parent", str(d / "tiny.gguf"), "-o", str(tmp_path / "fresh"),
                     "--results", str(tmp_path / "res"), "--finish-iterate",
                     "--state", str(tmp_path / "res" / "state"), "--threads", "1"]) == 0
    out = json.loads((tmp_path / "res" / "results.json").read_text())
    again = [r for r in out["children"] if r["method"] == "b"]
    assert [(r["budget"], r["choices"]) for r in again] == \
        [(r["budget"], r["choices"]) for r in first]
    for old, new in zip(first, again):
        assert new["predicted_speedup"] == pytest.approx(old["predicted_speedup"], rel=1e-9)
        assert new["quality"]["kl_div"] == pytest.approx(old["quality"]["kl_div"], rel=1e-5)
        assert new["distilled"]["0"]["quality"]["kl_div"] == pytest.approx(
            old["distilled"]["0"]["quality"]["kl_div"], rel=1e-5)
    # stage 0 scored only its child's alternatives, beside the committed scores
    assert (tmp_path / "fresh" / "scores-state" / "blocks" / "index.json").is_file()
    assert (tmp_path / "fresh" / "scores-state" / "scores.csv").read_bytes() == \
        (tmp_path / "res" / "state" / "scores" / "scores.csv").read_bytes()


def test_finish_iterate_without_state_is_one_line(smoke, tmp_path):
    run, d, _, res = smoke
    (tmp_path / "res").mkdir()
    (tmp_path / "res" / "results.json").write_text(json.dumps(res))
    with pytest.raises(SystemExit, match="no committed state"):
        run.main(["--smoke", "--parent", str(d / "tiny.gguf"), "-o", str(tmp_path / "fresh"),
                  "--results", str(tmp_path / "res"), "--finish-iterate",
                  "--state", str(tmp_path / "nostate"), "--threads", "1"])


def test_reprice_times_what_the_profile_missed_and_prices_every_child_again(smoke, tmp_path):
    """``--reprice-nonblock`` and ``--reprice-cold`` on committed results and a state whose
    block table predates the non-block timings: the parent's non-block step is timed into
    state/nonblock/ (the blocks kept as they were), every block cold into state/cold/, and
    every child with recorded choices gets its predicted speedups priced on each, beside
    the ones it was searched with; the verdict reports all three."""
    run, d, _, res = smoke
    state = tmp_path / "state" / "profile"
    state.mkdir(parents=True)
    table = json.loads((d / "out" / "profile" / "cpu.blocks.json").read_text())
    assert table.pop("nonblock") is not None  # the run's own profile timed it
    (state / "cpu.blocks.json").write_text(json.dumps(table))
    (state / "cpu.json").write_bytes((d / "out" / "profile" / "cpu.json").read_bytes())
    (tmp_path / "res").mkdir()
    (tmp_path / "res" / "results.json").write_text(json.dumps(res))
    assert run.main(["--smoke", "--parent", str(d / "tiny.gguf"), "-o", str(d / "out"),
                     "--results", str(tmp_path / "res"), "--state", str(tmp_path / "state"),
                     "--reprice-nonblock", "--reprice-cold", "--threads", "1"]) == 0
    timed = json.loads((tmp_path / "state" / "nonblock" / "cpu.blocks.json").read_text())
    assert timed["blocks"] == table["blocks"] and timed["nonblock"]["timings"]
    cold = json.loads((tmp_path / "state" / "cold" / "cpu.blocks.json").read_text())
    assert "another copy of the block" in cold["timing"]
    assert sorted(b["key"] for b in cold["blocks"]) == sorted(b["key"] for b in table["blocks"])
    new = json.loads((tmp_path / "res" / "results.json").read_text())
    rows = [r for r in new["children"] if r["method"] != "b"]
    for tag in ("nonblock_timed", "cold"):
        assert rows and all(r[f"predicted_throughput_x_{tag}"] > 0 for r in rows)
        assert set(new[tag]["parent_step_ms"]) == {"repriced", "searched_with", "measured"}
    assert [r["predicted_throughput_x"] for r in rows] == \
        [r["predicted_throughput_x"] for r in res["children"] if r["method"] != "b"]
    text = (tmp_path / "res" / "results.md").read_text()
    assert "with the non-block step timed" in text and "on the cold profile" in text
