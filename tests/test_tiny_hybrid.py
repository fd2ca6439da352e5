"""The tiny-hybrid experiment end to end at smoke sizes (``examples/tiny-hybrid/run.py
--smoke``): every stage completes and the artifacts agree with each other. Nothing here
asserts which method wins (the full run's results.md reports that)."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("tokenizers")
pytest.importorskip("matplotlib")

from conftest import example_script  # noqa: E402

pytestmark = pytest.mark.torch
EXAMPLE = Path(__file__).resolve().parents[1] / "nas" / "examples" / "tiny-hybrid"


def _script():  # type: ignore[no-untyped-def]  # the example module, untyped
    return example_script("tiny-hybrid", "tiny_hybrid_run")


@pytest.fixture(scope="module")
def smoke(tmp_path_factory):
    d = tmp_path_factory.mktemp("tiny-hybrid")
    run = _script()
    rc = run.main(["--smoke", "-o", str(d / "out"), "--cache", str(d / "cache"),
                   "--results", str(d / "results"), "--threads", "1"])
    return run, d, rc, json.loads((d / "out" / "results.json").read_text())


def test_every_stage_completes_and_the_artifacts_agree(smoke):
    run, d, rc, res = smoke
    out = d / "out"
    assert rc == 0
    assert res["checks"] and all(res["checks"].values()), res["checks"]
    seeds = [str(s) for s in run.SMOKE.seeds]
    for m, _ in run.METHODS:
        assert sorted(res["methods"][m]) == seeds
    for s in seeds:
        assert len(res["methods"]["d"][s]) == run.SMOKE.n_random
        for m in "abc":
            assert (out / "methods" / m / f"seed-{s}" / "distill" / "distill.json").is_file()
        it = json.loads((out / "iterative" / f"seed-{s}" / "iterate.json").read_text())
        assert len(it["stages"]) == 2 and all(
            Path(st["distilled"], "config.json").is_file() for st in it["stages"])
        # stage 2's parent is stage 1's distilled child, re-scored
        assert it["stages"][1]["parent"] == it["stages"][0]["distilled"]
        assert (out / "iterative" / f"seed-{s}" / "stage-1" / "scores" / "scores.csv").is_file()
    # independently of the script's own checks: built parameters are the blueprint's, and
    # the score file holds exactly the alternatives of the library the search priced
    from nas.child import load_pretrained

    bp = json.loads((out / "methods" / "a" / "seed-0" / "search" / "blueprint.json").read_text())
    child = load_pretrained(out / "methods" / "a" / "seed-0" / "distill" / "model")
    assert child.num_stored() == bp["params"]["child_total"]
    lib = json.loads((out / "methods" / "a" / "seed-0" / "search" / "library.json").read_text())
    with open(out / "scores" / "scores.csv") as f:
        rows = list(csv.DictReader(f))
    assert sorted((int(r["block"]), r["alternative"]) for r in rows) == sorted(
        (rp["start"], rp["label"]) for rp in lib["replacements"])
    # (e)'s last stage searched under the one-shot budget, resolved on the original parent
    assert res["e_budgets_match"]
    md = (d / "results" / "results.md").read_text()
    for m, name in run.METHODS:
        assert f"| ({m}) {name} |" in md
    assert (d / "results" / "results.png").read_bytes()[:4] == b"\x89PNG"


def test_a_rerun_reuses_every_stage(smoke):
    run, d, _, res = smoke
    from nas.scoring import Settings
    from nas.train.distill import DistillSettings
    from nas.train.iterate import run_iterate

    cfg = run.SMOKE
    data = next((d / "cache").glob("data-*"))
    out = d / "out"
    logs: list[str] = []
    ss = Settings(seq_len=cfg.seq_len, batch_size=8, max_tokens=cfg.score_max_tokens,
                  calib_tokens=cfg.score_calib_tokens, bld_steps=cfg.bld_steps,
                  bld_lr=cfg.bld_lr, seed=0)
    kd = DistillSettings(tokens=cfg.kd_tokens // 2, seq_len=cfg.seq_len, batch_size=cfg.kd_batch,
                         lr=cfg.kd_lr, lr_sweep=cfg.kd_lr_sweep, eval_every=cfg.kd_eval_every,
                         eval_tokens=cfg.eval_tokens, checkpoint_every=10_000, seed=0)
    before = json.loads((out / "iterative" / "seed-0" / "iterate.json").read_text())
    rec = run_iterate(out / "specs" / "e.json", out / "parent", data / "train.npy",
                      out / "iterative" / "seed-0", ss, kd, eval_data=data / "held.npy",
                      parent_scores=out / "scores", progress=False, log=logs.append)
    assert [m for m in logs if "done before" in m] == [
        f"stage {k}: done before ({out / 'iterative' / 'seed-0' / f'stage-{k}'}/stage.json)"
        for k in range(2)]
    assert not any("scoring" in m or "blocks changed" in m for m in logs), logs
    assert [st.model_dump() for st in rec.stages] == before["stages"]


def test_the_parent_rate_is_the_sweeps_choice_and_the_run_after_it_is_the_plain_run(smoke):
    """The parent's peak rate comes from the held-out sweep (one trial per rate of the grid,
    the lowest validation loss wins), and the parent is then exactly a plain run at that
    rate from the same init: the sweep leaves nothing behind in the weights."""
    run, d, _, res = smoke
    from nas.child import build_model, load_pretrained
    from nas.hf import from_hf

    cfg = run.SMOKE
    pt = res["parent_training"]
    assert [t["lr"] for t in pt["lr_sweep"]] == list(cfg.parent_lr_sweep)
    assert all(t["steps"] == cfg.parent_steps // 4 for t in pt["lr_sweep"])
    assert pt["lr"] == min(pt["lr_sweep"], key=lambda t: (t["val_loss"], t["lr"]))["lr"]
    assert len(pt["losses"]) == cfg.parent_steps and pt["val_tokens"] == cfg.parent_val_tokens
    data = next((d / "cache").glob("data-*"))
    train = torch.as_tensor(np.load(data / "train.npy").astype(np.int64))
    spec = json.loads((EXAMPLE / cfg.spec).read_text())
    model = build_model(from_hf(spec["parent"], source="spec"), seed=0)
    losses = run._train_lm(model, train, cfg.parent_steps, cfg.parent_batch, cfg.seq_len,
                           pt["lr"])
    assert losses == pt["losses"]
    parent = load_pretrained(d / "out" / "parent")
    got, want = model.state_dict(), parent.state_dict()
    assert sorted(got) == sorted(want)
    assert all(torch.equal(got[k], want[k]) for k in got)
    md = (d / "results" / "results.md").read_text()
    assert f"at peak lr {pt['lr']:g} chosen by a sweep" in md


def test_a_spec_variant_writes_its_own_folder_and_results():
    run = _script()
    ns = run.argparse.Namespace
    assert run._variant(ns(spec=None)) == ""
    assert run._variant(ns(spec="spec-dense.json")) == "-dense"
    assert run._variant(ns(spec="/somewhere/other.json")) == "-other"
