"""The tiny-hybrid experiment: does the search beat simpler compression at the same budget?

One command (``docs/results.md``, "Proof on a trained model")::

    python examples/tiny-hybrid/run.py                 # full run, writes results.md/.png here
    python examples/tiny-hybrid/run.py --smoke -o DIR  # tiny sizes, a few minutes

1. **Data.** The CPython 3.11.7 standard library sources (``*.py`` outside test
   folders), shipped as ``corpus.jsonl.xz`` (digest checked; ``--write-corpus PATH``
   gathers the same from the running interpreter, which is how it was made), split into
   training and held-out **by file** (a file is held out when the SHA-256 of its relative
   path is 0 mod 10). A byte-level BPE (``tokenizers``) is trained on the training files.
2. **Parent.** The Nemotron-H-style hybrid of ``spec.json`` (Mamba-2, attention and MoE
   blocks in a Super-like pattern) trained from scratch; cached outside git (``--cache``,
   default ``~/.cache/puzzle-nas/tiny-hybrid``) by a key of its inputs.
3. **Scores.** Replace-1-block KL of every alternative after BLD (``nas.scoring``).
4. **Children at the same budget** (``spec.json``'s ``budgets``), each built from the BLD
   blocks and distilled from the parent with the same settings (``nas.train.distill``):
   (a) searched with the measured scores; (b) searched with the structural prior; (c) the
   best homogeneous child (measured scores, every block of a kind the same choice);
   (d) random children meeting the budget (the MIP minimizing i.i.d. uniform random scores,
   the parent block scoring 0), the median of ``n_random`` per seed; (e) iterative: the
   spec's ``stages`` (``nas.train.iterate``), the distillation tokens split evenly over the stages
   so that (e) trains on as many tokens as the one-shot methods.
5. **Evaluation** on the held-out files: LM loss, KL to the parent, next-token accuracy;
   the distillation seeds (and the random draws of (d)) are ``seeds``.

Outputs in ``-o``: every intermediate folder, ``results.json`` (all figures, timings, the
machine's load average, consistency checks), ``results.md`` and ``results.png``.
"""

from __future__ import annotations

import argparse
import csv
import hashlib
import json
import os
import shutil
import statistics
import sys
import sysconfig
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

HERE = Path(__file__).resolve().parent


@dataclass(frozen=True)
class Config:
    """Sizes of one run (``FULL`` or ``SMOKE``)."""

    spec: str
    max_train_tokens: int      # training tokens kept (parent, BLD, KD)
    max_held_tokens: int       # held-out tokens kept (evaluation)
    bpe_chars: int             # characters of training text the BPE is trained on
    seq_len: int
    parent_steps: int
    parent_batch: int
    parent_lr_sweep: tuple[float, ...]  # peak rates tried for the parent (train_parent)
    parent_val_tokens: int     # held-out tokens (the end of held.npy) the parent sweep reads
    score_max_tokens: int      # scoring: held-out tokens (end of the training split)
    score_calib_tokens: int
    bld_steps: int
    bld_lr: float
    kd_tokens: int
    kd_batch: int
    kd_lr: float
    kd_lr_sweep: tuple[float, ...]  # peak rates tried per distillation (nas.train.distill)
    kd_eval_every: int
    eval_tokens: int
    n_random: int
    seeds: tuple[int, ...]


FULL = Config(spec="spec.json", max_train_tokens=1_500_000, max_held_tokens=100_000,
              bpe_chars=4_000_000, seq_len=128, parent_steps=260, parent_batch=8,
              parent_lr_sweep=(3e-4, 1e-3, 3e-3), parent_val_tokens=8192,
              score_max_tokens=2048, score_calib_tokens=4096, bld_steps=30,
              bld_lr=1e-3, kd_tokens=24_576, kd_batch=8, kd_lr=1e-3,
              kd_lr_sweep=(3e-4, 1e-3, 3e-3), kd_eval_every=8,
              eval_tokens=4096, n_random=5, seeds=(0, 1, 2))
SMOKE = Config(spec="spec-smoke.json", max_train_tokens=120_000, max_held_tokens=8_000,
               bpe_chars=400_000, seq_len=64, parent_steps=20, parent_batch=8,
               parent_lr_sweep=(2e-3, 5e-3), parent_val_tokens=1024,
               score_max_tokens=512, score_calib_tokens=1024, bld_steps=4,
               bld_lr=1e-3, kd_tokens=2048, kd_batch=4, kd_lr=1e-3,
               kd_lr_sweep=(1e-3, 3e-3), kd_eval_every=8,
               eval_tokens=1024, n_random=2, seeds=(0, 1))


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def _digest(obj: Any) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True, default=str).encode()).hexdigest()[:16]


# ---- 1. data ----------------------------------------------------------------------------
CORPUS = HERE / "corpus.jsonl.xz"
CORPUS_SHA256 = "99b893d756e553b4f35d77729db80f653558c5ef179b8c905ca8916f8bed602c"


def stdlib_files() -> tuple[Path, list[Path]]:
    """The running interpreter's stdlib root and its ``.py`` files outside test / idle /
    site-packages folders (only for ``--write-corpus``: the experiment reads CORPUS)."""
    root = Path(sysconfig.get_paths()["stdlib"])
    skip = {"test", "tests", "idlelib", "site-packages", "__pycache__"}
    files = sorted(p for p in root.rglob("*.py") if not skip & set(p.relative_to(root).parts))
    return root, files


def write_corpus(path: Path) -> str:
    """Gather :func:`stdlib_files` of this interpreter into ``path`` (xz-compressed JSON
    lines ``{"path": relative path, "text": UTF-8 text, undecodable bytes replaced}``, in
    path order); returns its SHA-256. How CORPUS was made, on CPython 3.11.7."""
    import lzma

    root, files = stdlib_files()
    lines = [json.dumps({"path": str(p.relative_to(root)),
                         "text": p.read_text(encoding="utf-8", errors="replace")}) + "\n"
             for p in files]
    data = lzma.compress("".join(lines).encode(), preset=9 | lzma.PRESET_EXTREME)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)
    return hashlib.sha256(data).hexdigest()


def read_corpus(path: Path = CORPUS, sha256: str | None = CORPUS_SHA256) -> dict[str, str]:
    """``{relative path: text}`` of the frozen corpus: the 674 stdlib ``.py`` files of
    CPython 3.11.7 outside test / idle folders, shipped with the example so that the
    README's figures do not depend on the interpreter that runs it (PSF License). The file's
    digest is checked unless ``sha256`` is None."""
    import lzma

    data = path.read_bytes()
    if sha256 is not None and hashlib.sha256(data).hexdigest() != sha256:
        raise RuntimeError(f"{path}: sha256 {hashlib.sha256(data).hexdigest()}, expected "
                           f"{sha256} (the frozen corpus was changed; restore it from git)")
    out: dict[str, str] = {}
    for line in lzma.decompress(data).decode().splitlines():
        row = json.loads(line)
        out[row["path"]] = row["text"]
    return out


def held_out(rel: str) -> bool:
    """The by-file split: held out when sha256(relative path) is 0 mod 10."""
    return int(hashlib.sha256(rel.encode()).hexdigest(), 16) % 10 == 0


def prepare_data(cfg: Config, vocab: int, cache: Path) -> dict[str, Path]:
    """``train.npy``, ``held.npy`` (uint16 ids) and ``tokenizer.json`` in a cache folder."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    texts = read_corpus()
    rels = sorted(texts)
    key = _digest(["data v2", CORPUS_SHA256, vocab, cfg.max_train_tokens,
                   cfg.max_held_tokens, cfg.bpe_chars])
    folder = cache / f"data-{key}"
    out = {n: folder / n for n in ("train.npy", "held.npy", "tokenizer.json", "split.json")}
    if all(p.is_file() for p in out.values()):
        return out
    train_files = [r for r in rels if not held_out(r)]
    held_files = [r for r in rels if held_out(r)]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    budget, sample = cfg.bpe_chars, []
    for r in train_files:
        if budget <= 0:
            break
        sample.append(texts[r][:budget])
        budget -= len(sample[-1])
    tok.train_from_iterator(sample, trainer)
    if tok.get_vocab_size() > vocab:
        raise RuntimeError(f"tokenizer has {tok.get_vocab_size()} ids > vocab {vocab}")

    def encode(names: list[str], limit: int) -> np.ndarray:
        ids: list[int] = []
        for k in range(0, len(names), 64):
            for enc in tok.encode_batch([texts[n] for n in names[k:k + 64]]):
                ids.extend(enc.ids)
            if len(ids) >= limit:
                break
        return np.asarray(ids[:limit], dtype=np.uint16)

    # files in a fixed shuffled order, so a token limit samples the whole library
    order = sorted(train_files, key=lambda r: hashlib.sha256(r.encode()).hexdigest())
    train = encode(order, cfg.max_train_tokens)
    held = encode(sorted(held_files), cfg.max_held_tokens)
    tmp = folder.with_name(folder.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    np.save(tmp / "train.npy", train)
    np.save(tmp / "held.npy", held)
    tok.save(str(tmp / "tokenizer.json"))
    (tmp / "split.json").write_text(json.dumps({
        "corpus": CORPUS.name, "train_files": len(train_files), "held_files": len(held_files),
        "train_tokens": int(len(train)), "held_tokens": int(len(held)),
        "vocab": tok.get_vocab_size()}, indent=1))
    shutil.rmtree(folder, ignore_errors=True)
    os.rename(tmp, folder)
    return out


# ---- 2. parent --------------------------------------------------------------------------
def _train_lm(model: Any, train: Any, steps: int, batch: int, seq_len: int, peak_lr: float,
              bar: Any = None) -> list[float]:
    """Train ``model`` in place on random windows of ``train`` (the row order seeded 0):
    AdamW, a linear warm-up over the first 5 % of ``steps``, cosine to 10 % of
    ``peak_lr``, gradients clipped to norm 1. Returns the training losses (a NaN ends it)."""
    import torch

    opt = torch.optim.AdamW(model.parameters(), lr=peak_lr, weight_decay=0.01,
                            betas=(0.9, 0.95))
    g = torch.Generator().manual_seed(0)
    warm = max(1, steps // 20)
    losses: list[float] = []
    for step in range(steps):
        lr = peak_lr * min(1.0, (step + 1) / warm) * (
            0.1 + 0.45 * (1 + np.cos(np.pi * step / steps)))
        for grp in opt.param_groups:
            grp["lr"] = lr
        ix = torch.randint(0, len(train) - seq_len - 1, (batch,), generator=g)
        x = torch.stack([train[i:i + seq_len] for i in ix.tolist()])
        logits = model(x)[:, :-1]
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]),
                                                 x[:, 1:].reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        losses.append(loss.item())
        if bar is not None:
            bar.update(1, f"loss {np.mean(losses[-20:]):.3f}")
        if not np.isfinite(losses[-1]):
            break
    return losses


def _val_loss(model: Any, val: Any, seq_len: int) -> float:
    """Mean next-token loss of ``model`` on ``val`` cut into rows of ``seq_len``."""
    import torch

    rows = val[: len(val) // seq_len * seq_len].reshape(-1, seq_len)
    model.eval()
    tot, n = 0.0, 0
    with torch.no_grad():
        for k in range(0, len(rows), 8):
            x = rows[k:k + 8]
            logits = model(x)[:, :-1]
            tot += float(torch.nn.functional.cross_entropy(
                logits.reshape(-1, logits.shape[-1]), x[:, 1:].reshape(-1), reduction="sum"))
            n += x[:, 1:].numel()
    model.train()
    return tot / n


def train_parent(cfg: Config, spec: dict[str, Any], data: dict[str, Path], cache: Path
                 ) -> tuple[Path, dict[str, Any]]:
    """The parent checkpoint (trained once per key, then read from the cache).

    The peak learning rate is chosen by the rule every distillation of the experiment
    follows (``nas.train.distill``'s sweep): each rate of ``cfg.parent_lr_sweep`` trains a fresh
    model (same init, same rows) for a quarter of the steps, with the schedule compressed to
    that length; the one with the lowest loss on the parent's validation tokens (the last
    ``cfg.parent_val_tokens`` of the held-out files, after every position the evaluation and
    the task set read) trains the full run from the same init. So both parents, hybrid and
    dense, go through one procedure and no rate is picked per model by hand.
    """
    import torch

    from nas.child import build_model, save_pretrained
    from nas.hf import from_hf
    from nas.progress import Progress

    arch = from_hf(spec["parent"], source="spec parent")
    key = _digest(["parent v2", spec["parent"], data["train.npy"].parent.name, cfg.seq_len,
                   cfg.parent_steps, cfg.parent_batch, list(cfg.parent_lr_sweep),
                   cfg.parent_val_tokens, torch.__version__])
    folder = cache / f"parent-{key}"
    info_path = folder / "training.json"
    if (folder / "model" / "config.json").is_file() and info_path.is_file():
        return folder / "model", json.loads(info_path.read_text())
    t0 = time.perf_counter()
    train = torch.as_tensor(np.load(data["train.npy"]).astype(np.int64))
    held = np.load(data["held.npy"]).astype(np.int64)
    if len(held) < max(cfg.eval_tokens, TASK_TOKENS) + cfg.parent_val_tokens:
        log(f"parent validation: only {len(held):,} held-out tokens, so its last "
            f"{cfg.parent_val_tokens:,} overlap the evaluation's (smoke sizes)")
    val = torch.as_tensor(held[-cfg.parent_val_tokens:])
    L = cfg.seq_len
    trial_steps = max(1, cfg.parent_steps // 4)
    sweep = []
    for cand in cfg.parent_lr_sweep:
        model = build_model(arch, seed=0)
        with Progress(trial_steps, f"parent lr {cand:g}", True) as bar:
            tl = _train_lm(model, train, trial_steps, cfg.parent_batch, L, cand, bar)
        v = _val_loss(model, val, L) if np.isfinite(tl[-1]) else float("inf")
        sweep.append({"lr": cand, "steps": trial_steps, "val_loss": v,
                      "last_loss_20": float(np.mean(tl[-20:]))})
        log(f"parent lr sweep: {cand:g} -> validation loss {v:.4f} after {trial_steps} steps")
    ok = [t for t in sweep if np.isfinite(t["val_loss"])]
    if not ok:
        raise RuntimeError(f"every parent learning rate diverged: {cfg.parent_lr_sweep}")
    lr = min(ok, key=lambda t: (t["val_loss"], t["lr"]))["lr"]
    model = build_model(arch, seed=0)
    with Progress(cfg.parent_steps, "parent", True) as bar:
        losses = _train_lm(model, train, cfg.parent_steps, cfg.parent_batch, L, lr, bar)
    if not np.isfinite(losses[-1]):
        raise RuntimeError(f"parent training diverged at step {len(losses)} (lr {lr:g})")
    val_loss = _val_loss(model, val, L)
    model.eval()
    info = {"steps": cfg.parent_steps, "tokens": cfg.parent_steps * cfg.parent_batch * L,
            "lr": lr, "lr_sweep": sweep, "val_tokens": int(len(val)), "val_loss": val_loss,
            "first_loss": losses[0], "last_loss_20": float(np.mean(losses[-20:])),
            "losses": losses, "seconds": time.perf_counter() - t0,
            "parameters": model.num_stored()}
    tmp = folder.with_name(folder.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    save_pretrained(model, tmp / "model")
    (tmp / "training.json").write_text(json.dumps(info, indent=1))
    shutil.rmtree(folder, ignore_errors=True)
    os.rename(tmp, folder)
    return folder / "model", info


# ---- 3-4. score, search, build, distill ---------------------------------------------------
def write_spec(path: Path, spec: dict[str, Any], **changes: Any) -> Path:
    d = {k: v for k, v in spec.items() if k != "stages"}
    for k, v in changes.items():
        d[k] = v
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(d, indent=1) + "\n")
    return path


def search_build_distill(spec_path: Path, folder: Path, parent: Path, scores: Path,
                         data: dict[str, Path], kd: Any) -> dict[str, Any]:
    """Search ``spec_path`` into ``folder/search``, build the child from the BLD blocks of
    ``scores``, distill it from ``parent``; returns the figures of the child."""
    from nas import search
    from nas.child import load_pretrained, save_pretrained
    from nas.hf import from_hf
    from nas.scoring.bld import assemble_child
    from nas.spec import load_spec
    from nas.train.distill import distill

    spec, base, digest = load_spec(spec_path)
    res = search.run(spec, base, folder / "search", digest, progress=False)
    bp = res.blueprints[0]
    arch = from_hf(bp.child, source=str(folder / "search" / "blueprint.json"))
    child = assemble_child(arch, load_pretrained(parent), scores)
    if not (folder / "child" / "config.json").is_file():
        save_pretrained(child, folder / "child")
    rec = distill(folder / "child", parent, np.load(data["train.npy"]).astype(np.int64),
                  folder / "distill", kd, held=np.load(data["held.npy"]).astype(np.int64),
                  data_source=str(data["train.npy"]), eval_source=str(data["held.npy"]),
                  progress=False, log=lambda s: None)
    return figures(bp.model_dump(), child.num_stored(), rec)


def figures(bp: dict[str, Any], built_params: int, rec: Any,
            parent_throughput: float | None = None) -> dict[str, Any]:
    """The figures of one child; throughput relative to ``parent_throughput`` (default: the
    blueprint's own parent, which for a later stage of (e) is the previous stage's child)."""
    w = next(iter(bp["predicted"]))
    pred = bp["predicted"][w]
    pthr = parent_throughput or pred["parent"]["throughput_tok_s"]
    return {
        "blueprint_params": bp["params"]["child_total"], "built_params": built_params,
        "active_params": bp["params"]["child_active"],
        "throughput_tok_s": pred["child"]["throughput_tok_s"],
        "throughput_rel": pred["child"]["throughput_tok_s"] / pthr,
        "parent_throughput_tok_s": pthr,
        "choices": [c["child"] for c in bp["choices"]],
        "kinds": [c["kind"] for c in bp["choices"]],
        "quality_sum": bp["quality"]["value"],
        "init": rec.curve[0].model_dump(), "final": rec.final.model_dump(),
        "curve": [[p.tokens, p.kl_div, p.lm_loss] for p in rec.curve],
        "teacher": rec.teacher_eval.model_dump(), "kd_seconds": rec.seconds,
        "held_tokens": rec.held_tokens,
    }


# ---- 5b. a small task set on the held-out files ------------------------------------------
TASK_TOKENS = 32_768  # held-out tokens the tasks read (the first of held.npy)


def task_figures(model_dir: Path, data: dict[str, Path], seq_len: int) -> dict[str, Any]:
    """Two completion tasks on held-out code, next-token top-1 accuracy at the positions
    where each applies: ``close`` (the next token starts with a closing bracket ``)``,
    ``]`` or ``}``: does the model close what is open), ``line_start`` (the previous token
    ends a line: the indentation and first token of the next line)."""
    import torch
    from tokenizers import Tokenizer

    from nas.child import load_pretrained

    tok = Tokenizer.from_file(str(data["tokenizer.json"]))
    strs = [tok.decode([i]) for i in range(tok.get_vocab_size())]
    close = torch.tensor([t[:1] in (")", "]", "}") for t in strs])
    nl = torch.tensor([t.endswith("\n") for t in strs])
    ids = torch.as_tensor(np.load(data["held.npy"]).astype(np.int64))[:TASK_TOKENS]
    rows = ids[: len(ids) // seq_len * seq_len].reshape(-1, seq_len)
    model = load_pretrained(model_dir).eval()
    hits = {"close": [0, 0], "line_start": [0, 0]}
    with torch.no_grad():
        for k in range(0, len(rows), 8):
            x = rows[k:k + 8]
            pred = model(x)[:, :-1].argmax(-1)
            y = x[:, 1:]
            ok = pred == y
            for name, mask in (("close", close[y]), ("line_start", nl[x[:, :-1]])):
                hits[name][0] += int(ok[mask].sum())
                hits[name][1] += int(mask.sum())
    return {f"{k}_acc": a / max(n, 1) for k, (a, n) in hits.items()} | {
        f"{k}_n": n for k, (_, n) in hits.items()}


def add_tasks(res: dict[str, Any], out: Path, data: dict[str, Path], seq_len: int) -> None:
    """The task figures of the parent and of every final child (from their folders)."""
    res["parent_tasks"] = task_figures(out / "parent", data, seq_len)
    for m, _ in METHODS:
        for s, v in res["methods"][m].items():
            if m == "d":
                for i, c in enumerate(v):
                    c["tasks"] = task_figures(out / "methods" / "d" / f"seed-{s}" / f"child-{i}"
                                              / "distill" / "model", data, seq_len)
            elif m == "e":
                it = json.loads((out / "iterative" / f"seed-{s}" / "iterate.json").read_text())
                v["tasks"] = task_figures(Path(it["stages"][-1]["distilled"]), data, seq_len)
            else:
                v["tasks"] = task_figures(out / "methods" / m / f"seed-{s}" / "distill"
                                          / "model", data, seq_len)


def random_scores(path: Path, labels: list[tuple[int, str]], seed: int) -> Path:
    """A score file of i.i.d. uniform random scores (the parent's alternatives 0)."""
    rng = np.random.default_rng(seed)
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["block", "alternative", "kl_div"])
        for b, lab in labels:
            w.writerow([b, lab, 0.0 if lab == "parent" else float(rng.uniform())])
    return path


# ---- 5. report --------------------------------------------------------------------------
METHODS = [("a", "searched, measured scores"), ("b", "searched, structural prior"),
           ("c", "best homogeneous (measured scores)"), ("d", "random at budget (median)"),
           ("e", "iterative (stages)")]


def _fmt(vals: list[float], nd: int = 4) -> str:
    if len(vals) == 1:
        return f"{vals[0]:.{nd}f}"
    m = statistics.mean(vals)
    return f"{m:.{nd}f} ({min(vals):.{nd}f}-{max(vals):.{nd}f})"


def summarize(res: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Per method, per seed: the child's figures ((d): the child with the median held-out
    KL of that seed's random children)."""
    out: dict[str, dict[str, Any]] = {}
    for m, _ in METHODS:
        out[m] = {}
        for s, v in res["methods"][m].items():
            if m == "d":
                kids = sorted(v, key=lambda c: c["final"]["kl_div"])
                out[m][s] = kids[len(kids) // 2]
            else:
                out[m][s] = v
    return out


def _parent_lr_text(res: dict[str, Any]) -> str:
    """How the parent's peak learning rate was chosen (runs from before the sweep: '')."""
    pt = res["parent_training"]
    if "lr_sweep" not in pt:
        return ""
    trials = ", ".join(f"{t['lr']:g}: {t['val_loss']:.3f}" for t in pt["lr_sweep"])
    return (f", at peak lr {pt['lr']:g} chosen by a sweep of {pt['lr_sweep'][0]['steps']}-step "
            f"trials (validation loss on the last {pt['val_tokens']:,} held-out tokens: "
            f"{trials}; the trained parent {pt['val_loss']:.3f})")


def write_markdown(path: Path, res: dict[str, Any], cfg: Config) -> None:
    summ = summarize(res)
    par = res["parent_eval"]
    pt = res.get("parent_tasks", {})

    def task(runs: list[dict[str, Any]], key: str) -> str:
        vals = [r["tasks"][key] for r in runs if "tasks" in r]
        return _fmt(vals) if vals else "-"

    lines = [
        "# tiny-hybrid: searched vs simpler compression at the same budget",
        "",
        f"Run: `{res['command']}` on {res['machine']}; wall time "
        f"**{res['wall_seconds'] / 60:.1f} min** (load average at start "
        f"{res['load_start'][0]:.2f}, at end {res['load_end'][0]:.2f}; the machine was "
        f"{'shared with other work' if max(res['load_start'][0], res['load_end'][0]) > 2.5 else 'mostly idle'}).",
        "",
        f"Parent: {res['parent']['parameters']:,} parameters ({res['parent']['pattern']}), "
        f"trained {res['parent_training']['tokens']:,} tokens from scratch on the CPython "
        "3.11.7 stdlib sources (`corpus.jsonl.xz`) "
        f"({res['split']['train_files']} training files, {res['split']['held_files']} "
        f"held-out files, BPE vocabulary {res['split']['vocab']}){_parent_lr_text(res)}.",
        f"Budget ({res['budget_text']}); every child is built from the BLD blocks "
        f"({cfg.bld_steps} BLD steps per alternative) and distilled from the parent for "
        f"{res['kd_tokens']:,} tokens (logit KL; peak lr chosen per distillation from "
        f"{', '.join(f'{x:g}' for x in cfg.kd_lr_sweep)} by a held-out sweep, the "
        "evaluation with the lowest held-out KL kept, the child as built included); (e) "
        "splits the same "
        f"tokens over its {res['n_stages']} stages. Evaluated on "
        f"{res['eval_tokens']:,} held-out tokens; seeds {list(cfg.seeds)} (distillation "
        "order, and the random draws of (d)); a cell is the mean over seeds (min-max).",
        "",
        "| method | params | predicted throughput (x parent) | held-out LM loss | KL to parent "
        "| next-token accuracy | close-bracket accuracy** | line-start accuracy** "
        "| KL before KD* |",
        "|---|---|---|---|---|---|---|---|---|",
        f"| parent | {res['parent']['parameters']:,} | 1.00 | {par['lm_loss']:.4f} | 0 | "
        f"{par['accuracy']:.4f} | {pt.get('close_acc', float('nan')):.4f} | "
        f"{pt.get('line_start_acc', float('nan')):.4f} | 0 |",
    ]
    for m, name in METHODS:
        runs = list(summ[m].values())
        params = sorted({r["built_params"] for r in runs})
        thr = [r["throughput_rel"] for r in runs]
        lines.append(
            f"| ({m}) {name} | {' / '.join(f'{p:,}' for p in params)} | {_fmt(thr, 2)} | "
            f"{_fmt([r['final']['lm_loss'] for r in runs])} | "
            f"{_fmt([r['final']['kl_div'] for r in runs])} | "
            f"{_fmt([r['final']['accuracy'] for r in runs])} | "
            f"{task(runs, 'close_acc')} | {task(runs, 'line_start_acc')} | "
            f"{_fmt([r['init']['kl_div'] for r in runs])} |")
    lines += ["", "\\* the child built from the BLD blocks, before distillation; for (e) the "
              "final child before its own (last-stage) distillation, i.e. after the earlier "
              "stages' distillation.",
              f"\\*\\* top-1 accuracy on the first {TASK_TOKENS:,} held-out tokens at the "
              "positions where the next token starts with `)`, `]` or `}` "
              f"({pt.get('close_n', 0):,} positions), and where the previous token ends a "
              f"line ({pt.get('line_start_n', 0):,} positions).", "",
              "Children chosen (block by block; `noop` = removed):", ""]
    for m, _name in METHODS:
        for s, r in summ[m].items():
            lines.append(f"- ({m}) seed {s}: " + " | ".join(r["choices"]))
    d_all = [c["final"]["kl_div"] for v in res["methods"]["d"].values() for c in v]
    lines += ["", f"(d) all {len(d_all)} random children, held-out KL after KD: "
              + ", ".join(f"{v:.4f}" for v in sorted(d_all)) + ".", ""]
    lines += ["## What this shows", "", *res["verdict"], "",
              "Timings (s): " + ", ".join(f"{k} {v:.0f}" for k, v in res["timings"].items())
              + ".", ""]
    path.write_text("\n".join(lines))


def verdict(res: dict[str, Any]) -> list[str]:
    """Plain statements of who beat whom, from the numbers (nothing tuned)."""
    summ = summarize(res)
    kl = {m: statistics.mean(r["final"]["kl_div"] for r in summ[m].values())
          for m, _ in METHODS}
    spread = {m: (min(r["final"]["kl_div"] for r in summ[m].values()),
                  max(r["final"]["kl_div"] for r in summ[m].values())) for m, _ in METHODS}
    out = []
    order = sorted(kl, key=kl.get)  # type: ignore[arg-type]  # dict.get's overloads as a sort key; every key is present
    out.append("Ranking by mean held-out KL to the parent after distillation (lower is "
               "better): " + " < ".join(f"({m}) {kl[m]:.4f}" for m in order) + ".")

    def cmp(x: str, y: str) -> str:
        sep = spread[x][1] < spread[y][0] or spread[y][1] < spread[x][0]
        word = "beats" if kl[x] < kl[y] else "does not beat"
        return (f"({x}) {word} ({y}): {kl[x]:.4f} vs {kl[y]:.4f}"
                + ("" if sep else " (the seed ranges overlap: not a clear difference)"))

    for x, y in (("a", "c"), ("a", "b"), ("a", "d"), ("e", "a")):
        out.append("- " + cmp(x, y))
    return out


def plot(path: Path, res: dict[str, Any]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    summ = summarize(res)
    colors = dict(zip("abcde", ["C0", "C1", "C2", "C3", "C4"]))
    fig, ax = plt.subplots(1, 2, figsize=(12, 4.6))
    for m, name in METHODS:
        pts = res["methods"][m]
        allr = [c for v in pts.values() for c in v] if m == "d" else list(pts.values())
        ax[0].scatter([r["throughput_rel"] for r in allr],
                      [r["final"]["kl_div"] for r in allr], color=colors[m],
                      alpha=0.35 if m == "d" else 0.9, label=f"({m}) {name}")
        for s, r in summ[m].items():
            xs = [c[0] for c in r["curve"]]
            ys = [c[1] for c in r["curve"]]
            ax[1].plot(xs, ys, color=colors[m], ls="-" if s == "0" else "--",
                       label=f"({m}) seed {s}")
    ax[0].scatter([1.0], [0.0], color="k", marker="*", s=120, label="parent")
    ax[0].set_xlabel("predicted throughput on h100-sxm, x parent (interactive workload)")
    ax[0].set_ylabel("held-out KL to parent after KD (nats/token)")
    ax[0].set_title("quality vs predicted throughput")
    ax[0].legend(fontsize=7)
    ax[1].set_xlabel("distillation tokens")
    ax[1].set_ylabel("held-out KL to parent (nats/token)")
    ax[1].set_yscale("log")
    ax[1].set_title("KD curves ((d): the median child; (e): both stages in turn)")
    ax[1].legend(fontsize=6, ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


# ---- the run ----------------------------------------------------------------------------
def check(res: dict[str, Any], out: Path) -> dict[str, bool]:
    """Artifacts agree with each other: built parameters = blueprint parameters for every
    child; the scores file covers exactly the library's alternatives; the blueprint's
    per-block quality is the score file's number; (e)'s last stage has the one-shot
    budget."""
    checks = {}
    for m, _ in METHODS:
        runs = [c for v in res["methods"][m].values() for c in (v if m == "d" else [v])]
        checks[f"{m}: built params == blueprint params"] = all(
            r["built_params"] == r["blueprint_params"] for r in runs)
    rows = list(csv.DictReader(open(out / "scores" / "scores.csv")))
    score = {(int(r["block"]), r["alternative"]): float(r["kl_div"]) for r in rows}
    lib = json.loads((out / "methods" / "a" / "seed-0" / "search" / "library.json").read_text())
    labels = {(int(rp["start"]), rp["label"]) for rp in lib["replacements"]}
    checks["scores.csv alternatives == library.json alternatives"] = set(score) == labels
    bp = json.loads((out / "methods" / "a" / "seed-0" / "search" / "blueprint.json")
                    .read_text())
    checks["(a) blueprint per-block quality == scores.csv"] = all(
        abs(c["quality"] - score[(c["block"], c["change"])]) <= 1e-9 * max(1, abs(c["quality"]))
        for c in bp["choices"])
    checks["(e) last stage budgets == one-shot budgets"] = res["e_budgets_match"]
    return checks


def _variant(args: argparse.Namespace) -> str:
    """The suffix of a ``--spec spec-NAME.json`` run's work folder and results files
    (``-dense``: ``out/tiny-hybrid-dense``, ``results-dense.md``); '' for the default spec."""
    if not args.spec:
        return ""
    stem = Path(args.spec).stem
    return stem[len("spec"):] if stem.startswith("spec-") else f"-{stem}"


def report_only(args: argparse.Namespace) -> int:
    """Rewrite ``results.md`` / ``results.png`` from a finished run's ``results.json``."""
    cfg = SMOKE if args.smoke else FULL
    out = Path(args.output or (f"out/tiny-hybrid{_variant(args)}-smoke" if args.smoke
                               else f"out/tiny-hybrid{_variant(args)}"))
    results = Path(args.results) if args.results else (out if args.smoke else HERE)
    res = json.loads((out / "results.json").read_text())
    if "parent_tasks" not in res:  # a run from before the task set: evaluate its children
        spec = json.loads((HERE / (args.spec or cfg.spec)).read_text())
        data = prepare_data(cfg, int(spec["parent"]["vocab_size"]), Path(args.cache))
        add_tasks(res, out, data, cfg.seq_len)
        (out / "results.json").write_text(json.dumps(res, indent=1) + "\n")
    for s, fig in res["methods"]["e"].items():
        it = out / "iterative" / f"seed-{s}" / "iterate.json"
        if it.is_file():
            fig["init"] = json.loads(it.read_text())["stages"][-1]["kd_curve"][0]
    res["verdict"] = verdict(res)
    write_markdown(results / f"results{_variant(args)}.md", res, cfg)
    plot(results / f"results{_variant(args)}.png", res)
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--smoke", action="store_true", help="tiny sizes (a few minutes)")
    p.add_argument("-o", "--output", default=None,
                   help="work folder (default out/tiny-hybrid or out/tiny-hybrid-smoke; "
                   "out/tiny-hybrid-NAME with --spec spec-NAME.json)")
    p.add_argument("--cache", default=str(Path.home() / ".cache" / "puzzle-nas" / "tiny-hybrid"),
                   help="where the data and the trained parent are cached")
    p.add_argument("--results", default=None, help="folder for results.md / results.png "
                   "(default: this example's folder for the full run, -o for --smoke; "
                   "results-NAME.md / .png with --spec spec-NAME.json)")
    p.add_argument("--threads", type=int, default=None, help="torch threads")
    p.add_argument("--report-only", action="store_true", help="rewrite results.md / .png "
                   "from -o's results.json (no computation)")
    p.add_argument("--spec", default=None, help="the experiment's spec (default spec.json, "
                   "spec-smoke.json with --smoke; spec-dense.json: a dense Llama-style "
                   "parent trained the same way), relative to this folder or a path")
    p.add_argument("--write-corpus", metavar="PATH", default=None,
                   help="write this interpreter's stdlib sources as a corpus file and exit")
    args = p.parse_args(argv)
    if args.write_corpus:
        print(f"wrote {args.write_corpus}: sha256 {write_corpus(Path(args.write_corpus))}")
        return 0
    if args.report_only:
        return report_only(args)
    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    from nas import search
    from nas.scoring import Settings, prepare
    from nas.scoring import run as run_scoring
    from nas.spec import load_spec, parse_spec
    from nas.train.distill import DistillSettings
    from nas.train.iterate import absolute_budgets, run_iterate

    cfg = SMOKE if args.smoke else FULL
    if args.spec:
        from dataclasses import replace

        cfg = replace(cfg, spec=args.spec)
    out = Path(args.output or (f"out/tiny-hybrid{_variant(args)}-smoke" if args.smoke
                               else f"out/tiny-hybrid{_variant(args)}"))
    results = Path(args.results) if args.results else (out if args.smoke else HERE)
    cache = Path(args.cache)
    out.mkdir(parents=True, exist_ok=True)
    t_start = time.perf_counter()
    load_start = os.getloadavg()
    timings: dict[str, float] = {}
    spec_file = HERE / cfg.spec
    spec = json.loads(spec_file.read_text())
    parse_spec(spec, str(spec_file))  # bad spec: one line before any work

    t = time.perf_counter()
    vocab = int(spec["parent"]["vocab_size"])
    data = prepare_data(cfg, vocab, cache)
    split = json.loads(data["split.json"].read_text())
    timings["data"] = time.perf_counter() - t
    log(f"data: {split}")

    t = time.perf_counter()
    parent, ptrain = train_parent(cfg, spec, data, cache)
    timings["parent"] = time.perf_counter() - t
    log(f"parent: {ptrain}")
    (out / "parent").unlink(missing_ok=True) if (out / "parent").is_symlink() else None
    if not (out / "parent").exists():
        (out / "parent").symlink_to(parent.resolve())
    parent = out / "parent"

    # 3. scores of the parent
    t = time.perf_counter()
    ss = Settings(seq_len=cfg.seq_len, batch_size=8, max_tokens=cfg.score_max_tokens,
                  calib_tokens=cfg.score_calib_tokens, bld_steps=cfg.bld_steps,
                  bld_lr=cfg.bld_lr, seed=0)
    scored_spec = write_spec(out / "specs" / "a.json", spec,
                             quality={"scores": str((out / "scores" / "scores.csv").resolve()),
                                      "metric": "kl_div"})
    job = prepare(scored_spec, parent, data["train.npy"], ss)
    run_scoring(job, out / "scores", progress=False, log=log)
    timings["scoring"] = time.perf_counter() - t
    labels = [(a.block, a.label) for row in job.alts for a in row]

    res: dict[str, Any] = {"config": asdict(cfg), "split": split, "parent_training": ptrain,
                           "methods": {m: {} for m, _ in METHODS}}
    t = time.perf_counter()
    specs = {
        "a": scored_spec,
        "b": write_spec(out / "specs" / "b.json", spec),
        "c": write_spec(out / "specs" / "c.json", spec, quality=json.loads(
            scored_spec.read_text())["quality"],
            search_space=dict(spec.get("search_space", {}), homogeneous=True)),
    }
    for s in cfg.seeds:
        kd = DistillSettings(tokens=cfg.kd_tokens, seq_len=cfg.seq_len, batch_size=cfg.kd_batch,
                             lr=cfg.kd_lr, lr_sweep=cfg.kd_lr_sweep,
                             eval_every=cfg.kd_eval_every,
                             eval_tokens=cfg.eval_tokens, checkpoint_every=10_000, seed=s)
        for m in "abc":
            log(f"method ({m}) seed {s}")
            res["methods"][m][str(s)] = search_build_distill(
                specs[m], out / "methods" / m / f"seed-{s}", parent, out / "scores", data, kd)
        kids = []
        for i in range(cfg.n_random):
            log(f"method (d) seed {s} child {i}")
            f = out / "methods" / "d" / f"seed-{s}" / f"child-{i}"
            f.mkdir(parents=True, exist_ok=True)
            rs = random_scores(f / "random_scores.csv", labels, 1000 * s + i)
            sp = write_spec(f / "spec.json", spec, quality={"scores": str(rs.resolve()),
                                                            "metric": "kl_div"})
            kids.append(search_build_distill(sp, f, parent, out / "scores", data, kd))
        res["methods"]["d"][str(s)] = kids
    timings["one-shot methods"] = time.perf_counter() - t

    # (e) iterative
    t = time.perf_counter()
    n_stages = len(spec["stages"])
    it_spec = out / "specs" / "e.json"
    it_spec.write_text(json.dumps(spec, indent=1) + "\n")
    sp0, base0, _ = load_spec(it_spec)
    problem0 = search.resolve(sp0, base0)
    res["e_budgets_match"] = [b.model_dump() for b in absolute_budgets(problem0, sp0.budgets)] \
        == [b.model_dump() for b in absolute_budgets(problem0, sp0.stages[-1].budgets)]
    for s in cfg.seeds:
        log(f"method (e) seed {s}")
        kd = DistillSettings(tokens=cfg.kd_tokens // n_stages, seq_len=cfg.seq_len,
                             batch_size=cfg.kd_batch, lr=cfg.kd_lr, lr_sweep=cfg.kd_lr_sweep,
                             eval_every=cfg.kd_eval_every, eval_tokens=cfg.eval_tokens,
                             checkpoint_every=10_000, seed=s)
        ssk = ss.model_copy(update={"seed": s})
        rec = run_iterate(it_spec, parent, data["train.npy"], out / "iterative" / f"seed-{s}",
                          ssk, kd, eval_data=data["held.npy"], parent_scores=out / "scores",
                          progress=False, log=log)
        last = rec.stages[-1]
        from nas.child import load_pretrained
        from nas.train.distill import load_record

        bp = json.loads(Path(last.blueprint).read_text())
        drec = load_record(Path(last.distilled).parent)
        fig = figures(bp, load_pretrained(last.distilled).num_stored(), drec,
                      res["methods"]["a"][str(s)]["parent_throughput_tok_s"])
        # the KD curve over all stages, tokens counted from the first stage
        curve, offset = [], 0
        for st in rec.stages:
            for pt in st.kd_curve:
                curve.append([offset + pt["tokens"], pt["kl_div"], pt["lm_loss"]])
            offset += st.kd_curve[-1]["tokens"]
        fig["curve"] = curve
        fig["init"] = rec.stages[-1].kd_curve[0]  # the final child before its own KD
        fig["stages"] = [{"params": st.params["child_total"], "changed": st.changed_blocks,
                          "final_kl": st.final["kl_div"], "pruned": st.pruned}
                         for st in rec.stages]
        res["methods"]["e"][str(s)] = fig
    timings["iterative"] = time.perf_counter() - t

    first = res["methods"]["a"][str(cfg.seeds[0])]
    res["parent_eval"] = first["teacher"]
    arch_pattern = spec["parent"].get("hybrid_override_pattern") or \
        f"{spec['parent']['model_type']}, {spec['parent']['num_hidden_layers']} layers"
    res["parent"] = {"parameters": ptrain["parameters"], "pattern": arch_pattern}
    res["budget_text"] = "; ".join(
        f"{b['metric']}{'@' + b['workload'] if b.get('workload') else ''} "
        f"{'>= ' + str(b['min']) if b.get('min') is not None else '<= ' + str(b['max'])}"
        for b in spec["budgets"]) + f", on {spec['hardware']}"
    res["kd_tokens"] = (cfg.kd_tokens // (cfg.kd_batch * cfg.seq_len)
                        + (cfg.kd_tokens % (cfg.kd_batch * cfg.seq_len) > 0)) \
        * cfg.kd_batch * cfg.seq_len
    res["n_stages"] = n_stages
    res["eval_tokens"] = first["held_tokens"]
    res["timings"] = timings
    res["wall_seconds"] = time.perf_counter() - t_start
    res["load_start"], res["load_end"] = list(load_start), list(os.getloadavg())
    res["machine"] = f"{os.cpu_count()} CPU cores, torch {torch.__version__}, " \
        f"{torch.get_num_threads()} threads"
    res["command"] = "python examples/tiny-hybrid/run.py" + (" --smoke" if args.smoke else "") \
        + (f" --spec {args.spec}" if args.spec else "")
    add_tasks(res, out, data, cfg.seq_len)
    res["verdict"] = verdict(res)
    res["checks"] = check(res, out)
    (out / "results.json").write_text(json.dumps(res, indent=1) + "\n")
    results.mkdir(parents=True, exist_ok=True)
    write_markdown(results / f"results{_variant(args)}.md", res, cfg)
    plot(results / f"results{_variant(args)}.png", res)
    bad = [k for k, v in res["checks"].items() if not v]
    log(f"done in {res['wall_seconds'] / 60:.1f} min; results in {results}")
    for line in res["verdict"]:
        log(line)
    if bad:
        log("CHECKS FAILED: " + "; ".join(bad))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
