"""Replace-1-block scoring on a tiny hybrid parent trained on English text: metrics,
prefix cache vs naive, BLD, resume after SIGKILL, 2 ranks vs 1, search, bad input."""

from __future__ import annotations

import csv
import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("safetensors")

from tiny_parent import PARENT, SEQ  # noqa: E402

from hwprofiles.errors import InputError  # noqa: E402
from nas.arch import FFN, Attention  # noqa: E402
from nas.child import init_from_parent, load_pretrained, save_pretrained  # noqa: E402
from nas.cli import main as cli  # noqa: E402
from nas.hf import to_hf  # noqa: E402
from nas.scoring import Settings, init_block, prepare, run  # noqa: E402
from nas.scoring.core import Item, Scorer, make_items, weights_digest  # noqa: E402
from nas.scoring.data import load_tokens, split_tokens  # noqa: E402
from nas.scoring.runner import KILL_ENV  # noqa: E402
from nas.scoring.store import Store, read_all  # noqa: E402

pytestmark = pytest.mark.torch
torch.set_num_threads(1)

REPO = Path(__file__).resolve().parents[1]
SPACE = {"attention": {"kv_heads": [2, 1], "noop": True, "linear": True},
         "ffn": {"fractions": [0.5, 0.25], "noop": True, "linear": True},
         "moe": {"expert_fractions": [0.5], "top_k": [1], "noop": True},
         "mamba": {"state_sizes": [8], "noop": True}}
SETTINGS = dict(seq_len=SEQ, max_tokens=1024, calib_tokens=1024)
BLD = dict(SETTINGS, bld_steps=40, bld_lr=3e-3)
METRIC_COLS = ["block", "alternative", "kl_div", "lm_loss_delta", "top1_agreement", "tokens",
               "bld_steps", "bld_loss"]


def _args(s: dict) -> list[str]:
    out = []
    for k, v in s.items():
        out += ["--" + k.replace("_", "-"), str(v)]
    return out


def _csv(path: Path) -> list[dict[str, str]]:
    with open(path) as f:
        return list(csv.DictReader(f))


def _metrics(path: Path) -> list[tuple[str, ...]]:
    return [tuple(r[c] for c in METRIC_COLS) for r in _csv(path)]


def _env() -> dict[str, str]:
    env = dict(os.environ, OMP_NUM_THREADS="1")
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")])
    return env


@pytest.fixture(scope="module")
def work(trained_parent, tmp_path_factory):
    """A folder with the saved parent, the English bytes as .npy token ids and a spec."""
    model, _, _, data = trained_parent
    d = tmp_path_factory.mktemp("scoring")
    save_pretrained(model, d / "parent")
    np.save(d / "tokens.npy", data.numpy().astype(np.uint16))
    spec = {"name": "tiny", "parent": "parent/config.json", "hardware": "h100-sxm",
            "workloads": {"chat": {"isl": 128, "osl": 128, "batch": 1}},
            "search_space": SPACE}
    (d / "spec.json").write_text(json.dumps(spec))
    return d


def _job(work: Path, **kw):  # type: ignore[no-untyped-def]
    return prepare(work / "spec.json", work / "parent", work / "tokens.npy", Settings(**kw))


@pytest.fixture(scope="module")
def scored(work):
    """One uninterrupted in-process run without BLD."""
    record = run(_job(work, **SETTINGS), work / "plain", progress=False)
    return record, _csv(work / "plain" / "scores.csv")


@pytest.fixture(scope="module")
def bld_scored(work):
    record = run(_job(work, **BLD), work / "bld", progress=False)
    return record, _csv(work / "bld" / "scores.csv")


def _by(rows, block: int) -> dict[str, float]:
    return {r["alternative"]: float(r["kl_div"]) for r in rows if int(r["block"]) == block}


# ---- the measurements ------------------------------------------------------------------
def test_every_alternative_scored_parent_zero_kl_nonnegative(work, scored):
    record, rows = scored
    job = _job(work, **SETTINGS)
    labels = [(a.block, a.label) for b in job.alts for a in b]
    assert [(int(r["block"]), r["alternative"]) for r in rows] == labels
    assert record.alternatives == len(labels) - PARENT.num_blocks == 25
    for r in rows:
        kl = float(r["kl_div"])
        assert kl >= 0.0, r
        if r["alternative"] == "parent":
            assert kl == 0.0 and float(r["top1_agreement"]) == 1.0
        else:
            assert 0.0 < kl < 10 and int(r["tokens"]) == 16 * (SEQ - 1)
    assert (work / "plain" / "scores.png").read_bytes()[:4] == b"\x89PNG"
    assert record.summary[0].startswith("most sensitive:  block 0 (attention)")


def test_the_parent_block_through_the_cached_path_scores_exactly_zero(work, scored):
    job = _job(work, **SETTINGS)
    parent = load_pretrained(work / "parent")
    scorer = Scorer(parent, job.split, job.settings)
    for i in range(PARENT.num_blocks):
        alt = job.alts[i][0]
        assert alt.is_parent
        m = scorer.evaluate(Item(alt, PARENT.blocks[i], "0" * 64), scorer.build(
            Item(alt, PARENT.blocks[i], "0" * 64))[0])
        assert m["kl_div"] == pytest.approx(0.0, abs=1e-12)
        assert m["lm_loss_delta"] == pytest.approx(0.0, abs=1e-12) and m["top1_agreement"] == 1


def test_kl_grows_as_the_cut_deepens_and_a_noop_is_worst_of_its_kind(scored):
    """Only orderings that are properties of trained parents. Retrained with seeds 0-11 and
    under torch's AVX-512 / AVX2 / scalar kernels (27 parents), every ordering asserted
    here held in all 27. Not asserted: the attention no-op above one KV head (held in 23 of
    27; 0.53 vs 0.53 at seed 2), and an FFN no-op above the linear stand-in (18 of 27)."""
    _, rows = scored
    for block in range(PARENT.num_blocks):
        assert _by(rows, block)["parent"] == 0.0
    for block in (1, 6):  # the two FFN blocks: width 256 -> 128 -> 64 -> nothing
        kl = _by(rows, block)
        assert kl["noop"] > kl["width=64"] > kl["width=128"] > 0.0, kl
    attn = _by(rows, 0)  # 4 KV heads -> 2 -> 1
    assert attn["num_kv_heads=1"] > attn["num_kv_heads=2"] > 0.0, attn
    attn = _by(rows, 4)  # 2 KV heads -> 1 -> nothing
    assert attn["noop"] > attn["num_kv_heads=1"] > 0.0, attn
    mamba = _by(rows, 2)  # state 16 -> 8 -> nothing
    assert mamba["noop"] > mamba["state_size=8"] > 0.0, mamba
    for block in (3, 5):  # a no-op MoE is worse than every narrower MoE
        kl = _by(rows, block)
        assert kl["noop"] > max(v for k, v in kl.items() if k != "noop"), kl


def test_prefix_cached_scores_equal_naive_full_forward_scores(work, scored, tmp_path):
    _, rows = scored
    job = _job(work, **SETTINGS)
    parent = load_pretrained(work / "parent")
    items = make_items(PARENT, job.alts, weights_digest(parent), job.split.digest, job.settings)
    naive = Scorer(parent, job.split, job.settings, cached=False)
    want = {(int(r["block"]), r["alternative"]): r for r in rows}
    for it in items[::3]:  # every block, several kinds
        m, _ = naive.score(it)
        r = want[(it.block, it.alt.label)]
        for k in ("kl_div", "lm_loss_delta", "top1_agreement"):
            assert m[k] == pytest.approx(float(r[k]), rel=1e-6, abs=1e-9), (it.alt.label, k)
    # a cache with no memory spills every batch to disk: the same numbers, files cleaned up
    spilled = Scorer(parent, job.split, job.settings, cache_bytes=0, spill_dir=tmp_path / "c")
    st = spilled.cache_stats
    assert st["memory_bytes"] == 0 and st["batches_on_disk"] == 2 + 2 and st["disk_bytes"] > 0
    for it in items[1::6]:
        m, _ = spilled.score(it)
        assert repr(m["kl_div"]) == want[(it.block, it.alt.label)]["kl_div"]
    spilled.close()
    assert not (tmp_path / "c").exists()


def test_per_block_init_is_init_from_parent(work, trained_parent):
    model = trained_parent[0]
    job = _job(work, **SETTINGS)
    calib = torch.as_tensor(job.split.calib)
    for i, child in [(1, FFN(width=128)), (3, PARENT.blocks[3].model_copy(
            update={"num_experts": 4})), (4, Attention(num_heads=4, num_kv_heads=1,
                                                          head_dim=16))]:
        blocks = list(PARENT.blocks)
        blocks[i] = child
        whole = init_from_parent(PARENT.replace_blocks(blocks), model, calib)
        with torch.no_grad():
            x = model.embed(calib)
            for blk in model.blocks[:i]:
                x = blk(x)
        one, what = init_block(model, i, child, x, seed=1)
        assert what in whole.init_report[i]
        for (k, a), (_, b) in zip(one.state_dict().items(), whole.blocks[i].state_dict().items()):
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6, msg=k)


# ---- BLD ---------------------------------------------------------------------------------
def test_bld_lowers_the_kl_of_most_alternatives(scored, bld_scored):
    plain = {(r["block"], r["alternative"]): float(r["kl_div"]) for r in scored[1]}
    trained = [r for r in bld_scored[1] if r["alternative"] not in ("parent", "noop")]
    better = [r for r in trained if float(r["kl_div"]) < plain[(r["block"], r["alternative"])]]
    assert len(trained) == 18 and len(better) >= 0.75 * len(trained)
    assert all(int(r["bld_steps"]) == 40 and 0 <= float(r["bld_loss"]) < 1 for r in trained)
    for r in trained:  # never worse than the initialized block, which is scored as without BLD
        before = plain[(r["block"], r["alternative"])]
        assert float(r["kl_before_bld"]) == before and float(r["kl_div"]) <= before, r
        assert r["bld_kept"] == ("trained" if float(r["kl_div"]) < before else "init")


def test_bld_that_hurts_keeps_the_initialized_block(work, scored, tmp_path):
    """At a learning rate far too high, BLD makes blocks worse on held-out: those keep their
    initialized weights (KL as without BLD), and the trained-block file the builder reads
    holds the kept block."""
    record = run(_job(work, **dict(SETTINGS, bld_steps=5, bld_lr=0.3)), tmp_path / "hot",
                 progress=False)
    assert record is not None
    plain = {(r["block"], r["alternative"]): float(r["kl_div"]) for r in scored[1]}
    rows = [r for r in _csv(tmp_path / "hot" / "scores.csv") if r["bld_kept"]]
    init = [r for r in rows if r["bld_kept"] == "init"]
    assert len(rows) == 18 and len(init) >= 9
    for r in init:
        assert float(r["kl_div"]) == float(r["kl_before_bld"]) == plain[(r["block"],
                                                                        r["alternative"])]
    from nas.scoring.bld import read_index

    index = read_index(tmp_path / "hot")
    r = init[0]
    meta = next(m for m in index.blocks if m.block == int(r["block"])
                and m.alternative == r["alternative"])
    f = index.files[index.blocks.index(meta)]
    job = _job(work, **SETTINGS)
    parent = load_pretrained(work / "parent")
    scorer = Scorer(parent, job.split, job.settings)
    alt = next(a for a in job.alts[int(r["block"])] if a.label == r["alternative"])
    from safetensors.torch import load_file

    saved = load_file(str(tmp_path / "hot" / "blocks" / f))
    fresh = scorer.build(Item(alt, PARENT.blocks[alt.block], "0" * 64))[0].state_dict()
    assert saved.keys() == fresh.keys() and all(torch.equal(saved[k], fresh[k]) for k in saved)


def test_build_assembles_the_child_from_trained_blocks(work, bld_scored, tmp_path, capsys):
    blocks = list(PARENT.blocks)
    blocks[1] = FFN(width=128)
    blocks[4] = Attention(num_heads=4, num_kv_heads=1, head_dim=16)
    blocks[5] = PARENT.blocks[5].model_copy(update={"top_k": 1})
    child_cfg = tmp_path / "child.json"
    child_cfg.write_text(json.dumps({"child": to_hf(PARENT.replace_blocks(blocks))}))
    rc = cli(["build", str(child_cfg), "--parent", str(work / "parent"), "--blocks",
              str(work / "bld"), "-o", str(tmp_path / "child")])
    assert rc == 0, capsys.readouterr().err
    child = load_pretrained(tmp_path / "child")
    parent = load_pretrained(work / "parent")
    index = json.loads((work / "bld" / "blocks" / "index.json").read_text())
    from safetensors.torch import load_file

    for i in (1, 4, 5):
        name = next(f for m, f in zip(index["blocks"], index["files"])
                    if m["block"] == i and m["child"] == blocks[i].model_dump())
        trained = load_file(str(work / "bld" / "blocks" / name))
        for k, v in child.blocks[i].state_dict().items():
            assert torch.equal(v, trained[k]), (i, k)
    for i in (0, 2, 3, 6):
        for (k, a), (_, b) in zip(child.blocks[i].state_dict().items(),
                                  parent.blocks[i].state_dict().items()):
            assert torch.equal(a, b), (i, k)
    # a block nobody trained is named
    blocks[0] = Attention(num_heads=4, num_kv_heads=4, head_dim=16, sliding_window=8)
    child_cfg.write_text(json.dumps({"child": to_hf(PARENT.replace_blocks(blocks))}))
    rc = cli(["build", str(child_cfg), "--parent", str(work / "parent"), "--blocks",
              str(work / "bld"), "-o", str(tmp_path / "child2")])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and "no trained block for block 0" in err and "\n" not in err
    assert not (tmp_path / "child2").exists()


def test_a_child_assembled_from_the_parent_folder_equals_one_from_the_loaded_parent(
        work, bld_scored, tmp_path):
    """``assemble_child`` given the parent's folder reads it one block at a time; the child
    equals the one assembled from the whole loaded parent bit for bit, with the scoring
    run's recorded digest and without it (then the folder is hashed block by block)."""
    import shutil

    from nas.scoring.bld import assemble_child
    from nas.scoring.digest import PARENT_RECORD

    blocks = list(PARENT.blocks)
    blocks[1] = FFN(width=128)
    blocks[5] = PARENT.blocks[5].model_copy(update={"top_k": 1})
    arch = PARENT.replace_blocks(blocks)
    whole = assemble_child(arch, load_pretrained(work / "parent"), work / "bld").state_dict()
    assert (work / "bld" / PARENT_RECORD).is_file()
    bare = tmp_path / "bld"
    shutil.copytree(work / "bld", bare)
    (bare / PARENT_RECORD).unlink()
    for score_dir in (work / "bld", bare):
        got = assemble_child(arch, work / "parent", score_dir).state_dict()
        assert got.keys() == whole.keys()
        assert all(torch.equal(got[k], whole[k]) for k in got), score_dir
    other = tmp_path / "other"
    shutil.copytree(work / "parent", other)
    m = load_pretrained(other)
    with torch.no_grad():
        m.blocks[0].norm.weight.add_(1.0)
    shutil.rmtree(other)
    save_pretrained(m, other)
    with pytest.raises(InputError, match="trained on another parent"):
        assemble_child(arch, other, bare)


# ---- resumable, distributed --------------------------------------------------------------
def _score_cmd(work: Path, out: Path, settings: dict, *extra: str) -> list[str]:
    return [sys.executable, "-m", "nas", "score", str(work / "spec.json"), "--parent",
            str(work / "parent"), "--data", str(work / "tokens.npy"), "-o", str(out),
            *_args(settings), *extra]


def test_sigkill_mid_run_then_resume_equals_an_uninterrupted_run(work, bld_scored):
    out = work / "killed"
    env = _env()
    env[KILL_ENV] = "6"  # SIGKILL after the 7th block is trained and saved, before its commit
    p = subprocess.run(_score_cmd(work, out, BLD), env=env, capture_output=True, text=True)
    assert p.returncode == -signal.SIGKILL, p.stderr
    with Store(out / "store" / "rank-0.sqlite") as s:
        assert len(s) == 6
    assert not (out / "scores.csv").exists()
    rec = run(_job(work, **BLD), out, progress=False)  # the same command again, resumed
    assert (rec.reused, rec.scored_now) == (6, 19)
    assert _metrics(out / "scores.csv") == _metrics(work / "bld" / "scores.csv")
    # a third run reuses everything; changed settings or data match no stored row
    again = run(_job(work, **BLD), out, progress=False)
    assert (again.reused, again.scored_now) == (25, 0)
    phash = weights_digest(load_pretrained(work / "parent"))
    for other in (dict(BLD, bld_lr=1e-3), dict(BLD, max_tokens=512), dict(BLD, seed=1)):
        job = _job(work, **other)
        keys = [it.key for it in make_items(PARENT, job.alts, phash, job.split.digest,
                                            job.settings)]
        assert len(keys) == 25 and not read_all(out, keys)


def test_a_parent_is_hashed_once_per_machine(work, tmp_path, monkeypatch):
    """The parent's digest, recorded by one run, serves another output folder and a
    distillation reading the same files as its teacher; a changed file is hashed again."""
    import nas.scoring.runner as runner
    from nas.scoring.digest import record_digest, recorded_digest

    monkeypatch.setenv("PUZZLE_NAS_CACHE", str(tmp_path / "cache"))
    first = run(_job(work, **SETTINGS), tmp_path / "a", progress=False)
    assert recorded_digest(tmp_path / "elsewhere", work / "parent", "stored") == \
        first.parent_weights
    # what distill looks up for its teacher (as held: stored) finds it too
    assert recorded_digest(tmp_path / "kd", work / "parent", "teacher:stored") == \
        first.parent_weights
    assert recorded_digest(tmp_path / "kd", work / "parent", "teacher:torch.bfloat16") is None

    def never(model):
        raise AssertionError("the parent was hashed again")

    monkeypatch.setattr(runner, "weights_digest", never)
    again = run(_job(work, **SETTINGS), tmp_path / "b", progress=False)
    assert again.parent_weights == first.parent_weights and again.scored_now == 25
    # a file of the parent changed (its modification time): the record no longer holds
    copy = tmp_path / "parent-copy"
    copy.mkdir()
    for f in (work / "parent").iterdir():
        (copy / f.name).write_bytes(f.read_bytes())
    record_digest(tmp_path / "c", copy, "stored", "d" * 64)
    assert recorded_digest(tmp_path / "d", copy, "stored") == "d" * 64
    cfg = copy / "config.json"
    os.utime(cfg, ns=(cfg.stat().st_atime_ns, cfg.stat().st_mtime_ns + 10**9))
    assert recorded_digest(tmp_path / "d", copy, "stored") is None


def test_a_run_logged_to_a_file_prints_progress_lines(work):
    """Run with stderr to a log, ``score`` writes plain progress lines (count, rate, time
    left; one a minute by default, every item here) instead of a bar or nothing."""
    env = dict(_env(), PUZZLE_NAS_LOG_EVERY="0")
    p = subprocess.run(_score_cmd(work, work / "logged", SETTINGS), env=env,
                       capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    lines = [x for x in p.stderr.splitlines() if x.startswith("scoring: ")]
    assert "\r" not in p.stderr
    assert len(lines) == 25 + 1, p.stderr[-3000:]
    assert re.match(r"scoring: 1/25 \(4 %\), \S+(/s| s each), ETA \d+:\d\d:\d\d, block ",
                    lines[0]), lines[0]
    assert re.fullmatch(r"scoring: 25/25 \(100 %\) in \d+:\d\d:\d\d", lines[-1])


def test_two_ranks_under_torchrun_equal_one_rank(work, scored):
    out = work / "two"
    p = subprocess.run(_score_cmd(work, out, SETTINGS, "--nproc", "2", "--json"), env=_env(),
                       capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    assert json.loads(p.stdout[p.stdout.index("{"):])["world_size"] == 2
    assert len(list((out / "store").glob("rank-*.sqlite"))) == 2
    assert _metrics(out / "scores.csv") == _metrics(work / "plain" / "scores.csv")


# ---- search reads the scores ------------------------------------------------------------
def test_search_reports_measured_quality(work, scored, tmp_path, capsys):
    from nas import search
    from nas.spec import load_spec

    spec = json.loads((work / "spec.json").read_text())
    spec["parent"] = str(work / "parent" / "config.json")
    spec["quality"] = {"scores": str(work / "plain" / "scores.csv"), "metric": "kl_div"}
    spec["budgets"] = [{"metric": "total_params", "max": "80%"}]
    (tmp_path / "s.json").write_text(json.dumps(spec))
    s, base, digest = load_spec(tmp_path / "s.json")
    labels = [(a.block, a.label) for b in search.alternatives(search.resolve(s, base, digest))
              for a in b]
    assert labels == [(int(r["block"]), r["alternative"]) for r in scored[1]]
    outcome = search.run(s, base, tmp_path / "out", digest, progress=False)
    q = outcome.blueprints[0].quality
    assert q["source"] == "measured: scores.csv (kl_div)" and not q["is_prior"]
    # the chosen child's quality is the sum of its measured scores
    rows = {(int(r["block"]), r["alternative"]): float(r["kl_div"]) for r in scored[1]}
    chosen = sum(rows[(c["block"], c["change"])] for c in outcome.blueprints[0].choices)
    assert q["value"] == pytest.approx(chosen, rel=1e-12)
    # a score file missing an alternative the spec generates: one line, exit 2
    lines = (work / "plain" / "scores.csv").read_text().splitlines()
    short = tmp_path / "short.csv"
    short.write_text("\n".join(line for line in lines if not line.startswith("6,width=64,"))
                     + "\n")
    spec["quality"]["scores"] = str(short)
    (tmp_path / "s.json").write_text(json.dumps(spec))
    capsys.readouterr()
    assert cli(["search", str(tmp_path / "s.json"), "-o", str(tmp_path / "o2")]) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.startswith("puzzle-nas search: error: ") and err.endswith(
        "short.csv: no score for block 6 alternative 'width=64'")


# ---- data and bad input -----------------------------------------------------------------
def test_token_files_npy_bin_and_text_with_a_tokenizer(tmp_path):
    ids = np.arange(300, dtype=np.uint32) % 251
    np.save(tmp_path / "a.npy", ids)
    ids.astype("<u2").tofile(tmp_path / "a16.bin")
    ids.astype("<u4").tofile(tmp_path / "a32.bin")
    for f, dt in [("a.npy", None), ("a16.bin", "uint16"), ("a32.bin", "uint32")]:
        assert np.array_equal(load_tokens(tmp_path / f, bin_dtype=dt), ids)
    with pytest.raises(InputError, match="needs --bin-dtype"):
        load_tokens(tmp_path / "a16.bin")
    tokenizers = pytest.importorskip("tokenizers")
    tok = tokenizers.Tokenizer(tokenizers.models.WordLevel(
        {"[UNK]": 0, "the": 1, "cat": 2, "sat": 3}, unk_token="[UNK]"))
    tok.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
    tok.save(str(tmp_path / "tokenizer.json"))
    (tmp_path / "t.txt").write_text("the cat sat on the mat")
    got = load_tokens(tmp_path / "t.txt", tokenizer=tmp_path / "tokenizer.json")
    assert got.tolist() == [1, 2, 3, 0, 1, 0]
    with pytest.raises(InputError, match="needs --tokenizer"):
        load_tokens(tmp_path / "t.txt")
    sp = split_tokens(ids.astype(np.int64), 256, 64, 100, 64)
    assert sp.calib.shape == (1, 64) and sp.held.shape == (2, 64)
    assert np.array_equal(sp.held.reshape(-1), ids[2 * 64:4 * 64])


def _bad(work: Path, tmp_path: Path, capsys, *argv: str, spec: Path | None = None) -> str:
    capsys.readouterr()
    rc = cli(["score", str(spec or work / "spec.json"), "--parent", str(work / "parent"),
              "-o", str(tmp_path / "o"), *argv])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and "\n" not in err and "Traceback" not in err, err
    assert not (tmp_path / "o").exists()
    return err


def test_bad_input_is_one_line_and_exit_2(work, tmp_path, capsys):
    np.save(tmp_path / "short.npy", np.arange(10))
    err = _bad(work, tmp_path, capsys, "--data", str(tmp_path / "short.npy"), "--seq-len", "64")
    assert "short.npy" in err and "shorter than one sequence" in err
    np.save(tmp_path / "big.npy", np.full(1000, 7).tolist()[:-1] + [300])
    err = _bad(work, tmp_path, capsys, "--data", str(tmp_path / "big.npy"), "--seq-len", "64")
    assert "token id 300 at position 999 is outside the parent's vocabulary [0, 256)" in err
    blocks = list(PARENT.blocks)
    blocks[6] = FFN(width=128)
    spec = json.loads((work / "spec.json").read_text())
    spec["parent"] = to_hf(PARENT.replace_blocks(blocks))
    (tmp_path / "other.json").write_text(json.dumps(spec))
    err = _bad(work, tmp_path, capsys, "--data", str(work / "tokens.npy"),
               spec=tmp_path / "other.json")
    assert "config.json: does not match the spec's parent: block 6 is ffn 256" in err
    err = _bad(work, tmp_path, capsys, "--data", str(work / "tokens.npy"), "--seq-len", "1")
    assert "--seq-len" in err
    # data shorter than the held-out and calibration tokens asked for: refused, not shrunk
    n = len(np.load(work / "tokens.npy"))
    err = _bad(work, tmp_path, capsys, "--data", str(work / "tokens.npy"), "--seq-len", "64",
               "--max-tokens", str(n), "--calib-tokens", "64")
    assert "tokens.npy" in err and f"--max-tokens {n:,} held out" in err
    assert err.endswith("lower them or give more data")
    (tmp_path / "o").write_text("a file")
    capsys.readouterr()
    assert cli(["score", str(work / "spec.json"), "--parent", str(work / "parent"), "--data",
                str(work / "tokens.npy"), "-o", str(tmp_path / "o")]) == 2
    assert "o: exists and is not a folder" in capsys.readouterr().err
    (tmp_path / "o").unlink()
    # --nproc N checks the input before launching any rank, and without importing torch
    err = _bad(work, tmp_path, capsys, "--data", str(tmp_path / "short.npy"), "--nproc", "2")
    assert "shorter than one sequence" in err
    code = ("import sys, nas.cli, nas.cli.score, nas.scoring.job, nas.scoring.data; "
            "sys.exit('torch' in sys.modules)")
    assert subprocess.run([sys.executable, "-c", code], env=_env()).returncode == 0


def test_sharding_deals_every_item_once_balanced_by_cost(work):
    from nas.scoring.runner import shard

    job = _job(work, **SETTINGS)
    items = make_items(PARENT, job.alts, "p", job.split.digest, job.settings)
    for world in (1, 2, 3, 7):
        parts = shard(PARENT, items, world)
        assert len(parts) == world and parts == shard(PARENT, items, world)
        keys = [it.key for p in parts for it in p]
        assert sorted(keys) == sorted(it.key for it in items)
        if world == 2:  # both ranks get early (expensive) and late (cheap) blocks
            assert {it.block for it in parts[0]} & {it.block for it in parts[1]} >= {0, 6}


# ---- the parent sharded over ranks (nas.scoring.pipeline) -------------------------------
def _close_metrics(a: Path, b: Path) -> None:
    """Equal rows; figures within float tolerance (other processes, same modules)."""
    ra, rb = _csv(a), _csv(b)
    assert [(r["block"], r["alternative"]) for r in ra] == \
        [(r["block"], r["alternative"]) for r in rb]
    for x, y in zip(ra, rb):
        for c in ("kl_div", "lm_loss_delta", "top1_agreement", "bld_loss", "kl_before_bld"):
            if x.get(c) not in (None, ""):
                assert float(x[c]) == pytest.approx(float(y[c]), rel=1e-6, abs=1e-9), (c, x, y)
        assert (x["tokens"], x["bld_steps"], x.get("bld_kept")) == \
            (y["tokens"], y["bld_steps"], y.get("bld_kept"))


@pytest.mark.parametrize("nproc", [2, 4])
def test_parent_sharded_over_ranks_scores_as_one_rank_with_bld(work, bld_scored, nproc):
    """Each rank holds only its stage of the parent (its elements add up to the parent's,
    none holds all); scores, BLD losses and the kept blocks equal the one-rank run's."""
    out = work / f"sharded-{nproc}"
    p = subprocess.run(_score_cmd(work, out, BLD, "--nproc", str(nproc), "--json"),
                       env=_env(), capture_output=True, text=True, timeout=1200)
    assert p.returncode == 0, p.stderr[-3000:]
    rec = json.loads(p.stdout[p.stdout.index("{"):])
    assert rec["world_size"] == nproc and rec["parent_weights"] == bld_scored[0].parent_weights
    stages = rec["stages"]
    ranges = [tuple(map(tuple, s["blocks"])) for s in stages]
    # every block is held by exactly one rank; rank 0 holds block 0 (it embeds the tokens)
    held_blocks = sorted(j for rr in ranges for a, b in rr for j in range(a, b))
    assert held_blocks == list(range(PARENT.num_blocks)) and ranges[0][0][0] == 0
    assert all(rr for rr in ranges)
    total = sum(t.numel() for t in load_pretrained(work / "parent").state_dict().values())
    held = [s["elements_held"] for s in stages]
    assert sum(held) == total and max(held) < total
    # --plan, from the configs alone, foresaw each rank's blocks, weights and cache
    import hwprofiles
    from nas.scoring import core
    from nas.scoring import plan as plan_mod
    from nas.scoring.plan import plan

    assert plan_mod.CHUNK_BYTES == core.CHUNK_BYTES  # the plan's torch-free copy

    pl = plan(PARENT, _job(work, **BLD).alts, Settings(**BLD), nproc,
              hwprofiles.get("h100-sxm"), "float32")
    for r, s in zip(pl.ranks, stages):
        assert r.blocks == tuple(map(tuple, s["blocks"]))
        assert r.cache + r.spilled == s["memory_bytes"] + s["disk_bytes"]
        assert r.weights == pytest.approx(4 * s["elements_held"], rel=0.02)
    _close_metrics(out / "scores.csv", work / "bld" / "scores.csv")
    a = json.loads((out / "blocks" / "index.json").read_text())
    b = json.loads((work / "bld" / "blocks" / "index.json").read_text())
    assert a["files"] == b["files"]
    from safetensors.torch import load_file

    for f in a["files"]:
        ta, tb = load_file(out / "blocks" / f), load_file(work / "bld" / "blocks" / f)
        assert ta.keys() == tb.keys()
        for k in ta:
            torch.testing.assert_close(ta[k], tb[k], rtol=1e-5, atol=1e-6)


def test_sharded_bad_input_is_one_line_before_any_rank_starts(work, tmp_path, capsys):
    err = _bad(work, tmp_path, capsys, "--data", str(work / "tokens.npy"), "--nproc", "8")
    assert "--nproc 8: the parent's 7 blocks cannot be split over 8 ranks" in err
    err = _bad(work, tmp_path, capsys, "--data", str(work / "tokens.npy"), "--nproc", "2",
               "--naive")
    assert "add --replicas" in err


def test_replicas_and_a_resume_with_another_rank_count(work, scored):
    """--replicas loads the whole parent per rank (no stages); a sharded run over 3 ranks
    resumes a 2-replica run killed after its first rows and ends equal to one rank."""
    out = work / "replicas-then-sharded"
    env = _env()
    env[KILL_ENV] = "3"
    p = subprocess.run(_score_cmd(work, out, SETTINGS, "--nproc", "2", "--replicas"),
                       env=env, capture_output=True, text=True, timeout=600)
    assert p.returncode != 0
    p = subprocess.run(_score_cmd(work, out, SETTINGS, "--nproc", "3", "--json"), env=_env(),
                       capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    rec = json.loads(p.stdout[p.stdout.index("{"):])
    assert rec["reused"] >= 3 and rec["reused"] + rec["scored_now"] == 25
    assert len(rec["stages"]) == 3
    _close_metrics(out / "scores.csv", work / "plain" / "scores.csv")


def test_a_sharded_run_killed_mid_run_resumes_on_one_rank(work, scored):
    out = work / "sharded-killed"
    env = _env()
    env[KILL_ENV] = "2"  # the rank that commits its third row is killed before committing it
    p = subprocess.run(_score_cmd(work, out, SETTINGS, "--nproc", "2"), env=env,
                       capture_output=True, text=True, timeout=600)
    assert p.returncode == 1 and not (out / "scores.csv").exists()
    # one line names the rank that died; the other's failed collectives say nothing
    assert "Traceback" not in p.stderr, p.stderr[-3000:]
    assert re.search(r"puzzle-nas score: error: rank \d of 2 \(pid \d+\) was killed by "
                     "SIGKILL; ", p.stderr.splitlines()[-1]), p.stderr[-3000:]
    rec = run(_job(work, **SETTINGS), out, progress=False)
    assert rec.reused >= 2 and rec.reused + rec.scored_now == 25
    _close_metrics(out / "scores.csv", work / "plain" / "scores.csv")


def test_plan_prints_memory_per_rank_and_refuses_what_does_not_fit(capsys):
    """``score --plan`` needs only the spec (its parent's config): Llama-3.1-70B in bf16
    over 8 H100s fits; over 2 it fits only because rank 0 holds the first and the last
    blocks (66 and 65 GiB of weights; one contiguous range each would be 79 and 52), and
    not with BLD's optimizer state on top (one line naming the figures, exit 2); no torch
    is imported."""
    spec = str(REPO / "examples" / "llama3.1-70b-8xh100.json")
    capsys.readouterr()
    assert cli(["score", spec, "--plan", "--nproc", "8"]) == 0
    out = capsys.readouterr().out.splitlines()
    rows = [line for line in out if line.strip()[:1].isdigit()]
    assert len(rows) == 8 and "fits" in out[-2] and "held-out" in out[-1]
    weights = sum(float(r.split()[2]) for r in rows)  # GiB, all ranks
    assert weights == pytest.approx(70_553_706_496 * 2 / 2**30, rel=1e-3)
    assert cli(["score", spec, "--plan", "--nproc", "2"]) == 0
    out = capsys.readouterr().out.splitlines()
    rows = [line.split() for line in out if line.strip()[:1].isdigit()]
    assert [r[1] for r in rows] == ["0-41,124-159", "42-123"]
    assert max(float(r[2]) for r in rows) < 67
    assert cli(["score", spec, "--plan", "--nproc", "2", "--bld-steps", "100"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("puzzle-nas score: error: the plan does not fit: rank 0 needs")
    assert "\n" not in err and "of 79.65 GiB per rank" in err
    code = (f"import sys; from nas.cli import main; main(['score', {spec!r}, '--plan', "
            "'--nproc', '8']); sys.exit('torch' in sys.modules)")
    assert subprocess.run([sys.executable, "-c", code], env=_env(),
                          capture_output=True).returncode == 0


def test_plan_resolves_the_specs_profile_as_the_search_does(tmp_path, capsys):
    """A spec whose profile is an alias (``h100``) or a profile file beside it plans as it
    searches (it used to fail as ``unknown device '<spec folder>/h100'``)."""
    import shutil

    from nas.search.problem import resolve_profile

    spec = json.loads((REPO / "examples" / "llama3.1-70b-8xh100.json").read_text())
    (tmp_path / "configs").mkdir()
    shutil.copy(REPO / "examples" / "configs" / "llama-3.1-70b.json", tmp_path / "configs")
    for hw in ("h100", "H100-SXM", "mine.json"):
        if hw.endswith(".json"):
            shutil.copy(REPO / "hwprofiles" / "data" / "h200-sxm.json", tmp_path / hw)
        path = tmp_path / "spec.json"
        path.write_text(json.dumps(dict(spec, hardware=hw)))
        capsys.readouterr()
        assert cli(["score", str(path), "--plan", "--nproc", "8"]) == 0, capsys.readouterr().err
        out = capsys.readouterr().out
        want = resolve_profile(hw, tmp_path)
        assert f"time on {want.name} " in out
        assert f"capacity per rank: {want.memory_bytes.value / 2**30:.2f} GiB" in out


def test_plan_reads_the_specs_parent_as_the_search_does(tmp_path, capsys):
    """The spec's parent as a config file, as a folder holding one, or inline: ``score
    --plan``, the scoring job and the search read it by one rule (nas.hf.read_parent), so
    a folder plans as it searches (it used to fail reading the folder as a file)."""
    import shutil

    from nas.hf import read_parent
    from nas.search.problem import resolve
    from nas.spec import load_spec

    spec = json.loads((REPO / "examples" / "llama3.1-70b-8xh100.json").read_text())
    cfg = json.loads((REPO / "examples" / "configs" / "llama-3.1-70b.json").read_text())
    (tmp_path / "parent").mkdir()
    shutil.copy(REPO / "examples" / "configs" / "llama-3.1-70b.json",
                tmp_path / "parent" / "config.json")
    outs = []
    for parent in ("parent/config.json", "parent", cfg):
        path = tmp_path / "spec.json"
        path.write_text(json.dumps(dict(spec, parent=parent)))
        sp, base, _ = load_spec(path)
        got = read_parent(sp.parent, base)
        assert got.config == cfg and got.arch == resolve(sp, base).parent
        capsys.readouterr()
        assert cli(["score", str(path), "--plan", "--nproc", "8"]) == 0, capsys.readouterr().err
        outs.append(capsys.readouterr().out)
    assert outs[0] == outs[1] == outs[2]


def test_a_run_opens_the_parent_once(work, tmp_path, monkeypatch):
    """One scoring run opens the parent's checkpoint once: the note on tensors left out
    and the loaded model come from the one reader the job holds (Job.reader)."""
    from nas.child import checkpoint

    opened = []
    init = checkpoint.CheckpointReader.__init__

    def counting(self, *a, **k):
        opened.append(a[0] if a else k.get("folder"))
        init(self, *a, **k)

    monkeypatch.setattr(checkpoint.CheckpointReader, "__init__", counting)
    job = _job(work, **dict(SETTINGS, max_tokens=256))
    rec = run(job, tmp_path / "once", progress=False)
    assert rec is not None and rec.scored_now == 25
    assert len(opened) == 1 and Path(opened[0]) == work / "parent"


def test_a_finished_run_resumes_without_reading_the_parent(work, scored, monkeypatch):
    """The parent's digest is recorded beside the run (with its files' sizes and times):
    rerunning a finished job neither loads nor hashes the parent; touching a parent file
    makes the next run hash it again (same weights: every row still reused)."""
    import nas.scoring.runner as runner
    from nas.scoring.digest import PARENT_RECORD

    rec = json.loads((work / "plain" / PARENT_RECORD).read_text())
    assert rec["digests"]["stored"] == scored[0].parent_weights

    def refuse(*a, **k):
        raise AssertionError("the parent was loaded")

    monkeypatch.setattr(runner, "load_pretrained", refuse)
    again = run(_job(work, **SETTINGS), work / "plain", progress=False)
    assert (again.reused, again.scored_now) == (25, 0)
    monkeypatch.undo()
    f = work / "parent" / "model.safetensors"
    os.utime(f, ns=(f.stat().st_atime_ns, f.stat().st_mtime_ns + 1))
    monkeypatch.setattr(runner, "load_pretrained", refuse)
    with pytest.raises(AssertionError, match="the parent was loaded"):
        run(_job(work, **SETTINGS), work / "plain", progress=False)
    monkeypatch.undo()
    third = run(_job(work, **SETTINGS), work / "plain", progress=False)
    assert third.reused == 25 and third.parent_weights == scored[0].parent_weights


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_the_teacher_target_is_the_last_hidden_state_not_the_vocabulary(dtype):
    """The held-out teacher target costs ``hidden_size`` values per token in the compute
    dtype: at a 32k vocabulary a bf16 parent of hidden size 256 keeps 512 bytes per token,
    500x less than the float64 probabilities (plus row sum and top-1 token) kept before,
    and the score summed from it is the one from the full distribution, up to rounding: the
    two sides compute the logits in ``dtype`` through matmuls of other shapes (batches of 2
    rows, position chunks, vs all 3 rows at once), which MKL's AVX2 kernels round
    differently (up to 5 float32 steps of the largest logit; 0 under SSE4.2 and AVX-512).
    Each token's cross entropy moves by about one such step, of either sign, so the n-token
    sum is held to 4 sqrt(n) steps (measured: 4.4 under AVX2)."""
    from nas.arch import ModelArch
    from nas.child import build_model
    from nas.scoring.core import kl_sums
    from nas.scoring.data import Split

    arch = ModelArch(hidden_size=256, vocab_size=32000, model_type="llama",
                     blocks=(Attention(num_heads=4, num_kv_heads=2, head_dim=64), FFN(width=512)))
    parent = build_model(arch, seed=0).to(dtype)
    rng = np.random.default_rng(0)
    split = Split(calib=rng.integers(0, 32000, (1, 32)), held=rng.integers(0, 32000, (3, 32)),
                  source="test")
    s = Scorer(parent, split, Settings(seq_len=32, batch_size=2), cached=False)
    tokens = split.held.size
    per_token = s.held_cache.mem_bytes / tokens
    assert per_token == 256 * torch.finfo(dtype).bits // 8
    assert (32000 * 8 + 16) / per_token >= (500 if dtype == torch.bfloat16 else 250)
    # the cross-entropy summed from the kept state is the full forward's
    with torch.no_grad():
        logits = parent(torch.as_tensor(split.held)).double()
        full = -torch.log_softmax(logits[:, :-1], -1).gather(
            -1, torch.as_tensor(split.held)[:, 1:, None]).sum()
        kept = sum(kl_sums(s.head, s.held_cache.hidden(b, 2), None,
                           torch.as_tensor(split.held[2 * b:2 * b + 2]))[1] for b in range(2))
    n = split.held[:, 1:].size  # positions with a next token
    step = torch.finfo(dtype).eps * float(logits.abs().max())  # one step of the largest logit
    assert abs(float(kept) - float(full)) <= 4 * n ** 0.5 * step, (float(kept), float(full))


@pytest.mark.parametrize("cache_gib", ["4", "0"])  # in memory; spilled to disk
def test_the_record_reports_the_teacher_target_bytes_it_kept(tmp_path, cache_gib):
    """``scores.json``'s ``cache.teacher_target_bytes`` is what the run kept of the held-out
    teacher target: the parent's last hidden state, hidden_size values per held-out token
    in the compute dtype (read from the cache, spilled batches from their file headers)."""
    from conftest import tiny_llama_checkpoint

    pdir, _, arch, _ = tiny_llama_checkpoint(tmp_path)
    np.save(tmp_path / "tokens.npy", np.random.default_rng(0).integers(0, 64, 1024))
    (tmp_path / "spec.json").write_text(json.dumps({
        "name": "t", "parent": str(pdir), "hardware": "h100-sxm",
        "workloads": {"w": {"isl": 8, "osl": 8, "batch": 1}},
        "search_space": {"attention": {"noop": True}, "ffn": {"fractions": [0.5]}}}))
    for dtype, size in (("float32", 4), ("bfloat16", 2)):
        out = tmp_path / f"out-{dtype}-{cache_gib}"
        assert cli(["score", str(tmp_path / "spec.json"), "--parent", str(pdir), "--data",
                    str(tmp_path / "tokens.npy"), "-o", str(out), "--seq-len", "32",
                    "--max-tokens", "256", "--calib-tokens", "128", "--batch-size", "2",
                    "--dtype", dtype, "--cache-gib", cache_gib]) == 0
        rec = json.loads((out / "scores.json").read_text())
        assert rec["cache"]["teacher_target_bytes"] == \
            rec["held_rows"] * 32 * arch.hidden_size * size
        if cache_gib == "0":
            assert rec["cache"]["batches_on_disk"] > 0
