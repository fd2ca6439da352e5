from __future__ import annotations

import functools
import os
import shutil
import sys
import tempfile
from pathlib import Path
from types import ModuleType

import pytest

REPO = Path(__file__).resolve().parents[1]
CONFIGS = REPO.parent / "shared" / "reference" / "configs"
if not CONFIGS.exists():  # CI clones with shared/ beside the repo; examples ship copies too
    CONFIGS = REPO / "nas" / "examples" / "configs"

LLAMA = CONFIGS / "llama-3.1-8b.json"
SUPER = CONFIGS / "nemotron-3-super-120b-a12b.json"
NANO = CONFIGS / "nemotron-3-nano-30b-a3b.json"


_SCRATCH: list[str] = []


def pytest_configure(config: pytest.Config) -> None:
    """Keep the suite from writing into the checkout or the user's cache: hypothesis'
    example database, pytest-benchmark's storage and puzzle-nas' cache go to a scratch folder removed at the end (the user's own
    ``HYPOTHESIS_STORAGE_DIRECTORY`` or ``--benchmark-storage`` win). pytest-randomly
    shuffles the order but leaves the random seeds to ``pytest_runtest_setup``."""
    scratch = tempfile.mkdtemp(prefix="puzzle-nas-tests-")
    _SCRATCH.append(scratch)
    os.environ.setdefault("HYPOTHESIS_STORAGE_DIRECTORY", os.path.join(scratch, "hypothesis"))
    # this machine's puzzle-nas cache (digests, converted GGUF parents): the suite's own,
    # never the user's (commands run as subprocesses inherit it)
    os.environ["PUZZLE_NAS_CACHE"] = os.path.join(scratch, "cache")
    if getattr(config.option, "randomly_reset_seed", None) is not None:
        # pytest-randomly decides the order only: its per-test reseeding would draw every
        # test's random inputs from the run's seed; pytest_runtest_setup seeds them fixed
        config.option.randomly_reset_seed = False
    if getattr(config.option, "benchmark_storage", None) == "file://./.benchmarks":
        config.option.benchmark_storage = "file://" + os.path.join(scratch, "benchmarks")


@pytest.hookimpl(trylast=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    """Every test starts from the same global random state and, once torch is imported, runs
    torch on one thread: whatever ran before it (random order included), whichever module
    imported torch first, and whatever the machine's core count (torch's default thread
    count, and so the rounding of its reductions, differs between machines)."""
    import random

    random.seed(0)
    np = sys.modules.get("numpy")
    if np is not None:
        np.random.seed(0)
    torch = sys.modules.get("torch")
    if torch is not None:
        torch.manual_seed(0)
        if torch.get_num_threads() != 1:
            torch.set_num_threads(1)


def pytest_terminal_summary(terminalreporter, exitstatus: int, config: pytest.Config) -> None:
    """Say the test order on the last lines, even under ``-q``: pytest-randomly's seed, so a
    failing order can be replayed with ``-p randomly --randomly-seed=N``."""
    seed = getattr(config.option, "randomly_seed", None)
    if config.pluginmanager.hasplugin("randomly") and isinstance(seed, int):
        terminalreporter.write_line(f"test order: random, replay with: pytest --randomly-seed={seed}")
    else:
        terminalreporter.write_line("test order: as in the files (pytest-randomly off)")


def pytest_unconfigure(config: pytest.Config) -> None:
    while _SCRATCH:
        shutil.rmtree(_SCRATCH.pop(), ignore_errors=True)


@pytest.fixture
def configs() -> Path:
    return CONFIGS


@pytest.fixture(scope="module")
def trained_parent():
    """``(model, calib, held, data)``: the tiny hybrid parent of ``tiny_parent`` trained on
    English text, read from its frozen checkpoint once per module (torch tests only; a
    fraction of a second): a test that changes it in place cannot reach another module,
    whatever the order."""
    pytest.importorskip("torch")
    from tiny_parent import frozen_parent

    return frozen_parent()


def distill_folder(trained, folder: Path) -> Path:
    """``folder`` holding what the distillation tests run on: the trained tiny parent
    (``trained``: the :func:`trained_parent` tuple) and a child of it (an FFN dropped, a MoE
    at half its experts) initialized from it, as checkpoints, and the English bytes as
    token ids (``tokens.npy``)."""
    import numpy as np
    from tiny_parent import PARENT

    from nas.arch import NoOp
    from nas.child import init_from_parent, save_pretrained

    model, calib, _, data = trained
    save_pretrained(model, folder / "parent")
    blocks = list(PARENT.blocks)
    blocks[1] = NoOp()
    blocks[3] = blocks[3].model_copy(update={"num_experts": 4})
    save_pretrained(init_from_parent(PARENT.replace_blocks(blocks), model, calib),
                    folder / "child")
    np.save(folder / "tokens.npy", data.numpy().astype(np.uint16))
    return folder


def kl_div(parent, child, tokens) -> float:
    """Mean KL(parent || child) over every position of ``tokens`` (nats, float64 softmax):
    how far a built or inherited child is from its parent in the builder tests."""
    import torch

    with torch.no_grad():
        lp = torch.log_softmax(parent(tokens).double(), -1)
        lq = torch.log_softmax(child(tokens).double(), -1)
    return float((lp.exp() * (lp - lq)).sum(-1).mean())


def search_example(name: str, tmp_path: Path, sweep: bool = False) -> dict:
    """Run ``puzzle-nas search`` on the shipped example ``nas/examples/<name>.json`` (its
    parent path made absolute; without its sweep unless ``sweep``) into ``tmp_path/out``;
    returns the blueprint, after checking that the CLI exited 0 and every budget holds."""
    import json

    from nas.cli import main

    examples = REPO / "nas" / "examples"
    spec = json.loads((examples / f"{name}.json").read_text())
    spec["parent"] = str(examples / spec["parent"])
    if not sweep:
        spec.get("solver", {}).pop("sweep", None)
    (tmp_path / "spec.json").write_text(json.dumps(spec))
    assert main(["search", str(tmp_path / "spec.json"), "-o", str(tmp_path / "out")]) == 0
    bp = json.loads((tmp_path / "out" / "blueprint.json").read_text())
    assert all(b["child_value"] <= b["bound"] * (1 + 1e-9) for b in bp["budgets"])
    return bp


def tiny_llama_checkpoint(folder: Path, **save: object) -> tuple:
    """``(parent folder, child config.json, parent arch, child arch)``: a 2-layer random
    Llama (hidden 32, vocab 64) saved under ``folder/parent`` (``save``: options of
    ``save_pretrained``) and the config of a child with half-width FFNs (torch tests only)."""
    import json

    from nas.arch import FFN, Attention, ModelArch
    from nas.child import build_model, save_pretrained
    from nas.hf import to_hf

    att = Attention(num_heads=4, num_kv_heads=2, head_dim=8)
    parent = ModelArch(hidden_size=32, vocab_size=64, model_type="llama",
                       blocks=(att, FFN(width=64)) * 2)
    child = parent.replace_blocks([att, FFN(width=32)] * 2)
    pdir = save_pretrained(build_model(parent, seed=0), folder / "parent", **save)
    cfg = folder / "child.json"
    cfg.write_text(json.dumps(to_hf(child)))
    return pdir, cfg, parent, child


def write_tokenizer(folder: Path, words: tuple[str, ...] = ("the", "quick", "fox")) -> dict:
    """An HF tokenizer in checkpoint folder ``folder``: a word-level ``tokenizer.json``
    (``[UNK]`` = 0, then ``words``; written as the ``tokenizers`` package saves one),
    ``tokenizer_config.json`` and ``generation_config.json``. Returns ``{name: bytes}``."""
    import json

    vocab = {"[UNK]": 0, **{w: i + 1 for i, w in enumerate(words)}}
    files = {
        "tokenizer.json": {"version": "1.0", "truncation": None, "padding": None,
                           "added_tokens": [], "normalizer": None,
                           "pre_tokenizer": {"type": "Whitespace"}, "post_processor": None,
                           "decoder": None,
                           "model": {"type": "WordLevel", "vocab": vocab,
                                     "unk_token": "[UNK]"}},
        "tokenizer_config.json": {"tokenizer_class": "PreTrainedTokenizerFast",
                                  "unk_token": "[UNK]"},
        "generation_config.json": {"eos_token_id": 0},
    }
    out = {}
    for name, obj in files.items():
        (folder / name).write_text(json.dumps(obj))
        out[name] = (folder / name).read_bytes()
    return out


def tiny_parent_of(hf_model) -> tuple:
    """``(parent, calib, held)`` for the family builder tests: our model converted from a
    tiny random transformers model (``from_transformers``), 8 x 24 calibration and 4 x 24
    held-out token ids drawn from [2, 96) with seed 11 (torch tests only)."""
    import torch

    from nas.child import from_transformers

    parent = from_transformers(hf_model).eval()
    g = torch.Generator().manual_seed(11)
    return parent, torch.randint(2, 96, (8, 24), generator=g), \
        torch.randint(2, 96, (4, 24), generator=g)


def with_block(arch, i: int, update: dict):
    """``arch`` with block ``i`` updated by ``update`` (a pydantic ``model_copy`` update)."""
    blocks = list(arch.blocks)
    blocks[i] = blocks[i].model_copy(update=update)
    return arch.replace_blocks(blocks)


def check_inheritance_beats_random(parent, arch, i: int, calib, held, label: object = None):
    """``init_from_parent(arch, parent, calib)`` initializes block ``i`` from the parent (no
    random init in its report), is closer to the parent on ``held`` (:func:`kl_div`, nats)
    than the same child with only block ``i`` randomly re-initialized (seed 1, std 0.02 and
    0.02 / sqrt(2 x blocks) on output projections), and stores exactly the architecture's
    parameter count. Returns the inherited child."""
    import torch

    from nas.child import init_from_parent

    child = init_from_parent(arch, parent, calib)
    assert "random" not in child.init_report[i], child.init_report[i]
    rand = init_from_parent(arch, parent, calib)
    torch.manual_seed(1)
    rand.blocks[i].reset_parameters(0.02, 0.02 / (2 * arch.num_blocks) ** 0.5)
    kl_init, kl_rand = kl_div(parent, child, held), kl_div(parent, rand, held)
    assert kl_init < kl_rand, (label, kl_init, kl_rand, child.init_report[i])
    assert child.num_stored() == arch.param_counts().total
    return child


def check_unchanged_child_is_the_parent(parent, calib, held) -> None:
    """A child with the parent's own architecture computes the parent's logits bit for bit."""
    import torch

    from nas.child import init_from_parent

    child = init_from_parent(parent.arch, parent, calib)
    with torch.no_grad():
        assert torch.equal(child(held), parent(held))


def check_cached_decode(model, tokens, prefill: int, tol: float = 1e-5):
    """Prefill ``tokens[:, :prefill]`` into a fresh cache, then decode the rest one token at a
    time: the logits equal the full forward's within ``tol`` (float32 max |difference|).
    Returns ``(full-forward logits, the cache after the last token)``."""
    import torch

    with torch.no_grad():
        full = model(tokens)
        cache = model.new_cache()
        steps = [model(tokens[:, :prefill], cache)] + [
            model(tokens[:, i:i + 1], cache) for i in range(prefill, tokens.shape[1])]
    diff = float((torch.cat(steps, 1) - full).abs().max())
    assert diff < tol, f"cached decode differs from the full forward by {diff:.3g}"
    return full, cache


def example_script(folder: str, module: str) -> ModuleType:
    """The ``run.py`` of ``nas/examples/<folder>`` loaded as module ``module`` (registered
    in ``sys.modules``: dataclasses look their module up there)."""
    import importlib.util
    import sys

    path = Path(__file__).resolve().parents[1] / "nas" / "examples" / folder / "run.py"
    spec = importlib.util.spec_from_file_location(module, path)
    assert spec is not None and spec.loader is not None, path
    mod = importlib.util.module_from_spec(spec)
    sys.modules[module] = mod
    spec.loader.exec_module(mod)
    return mod


@functools.lru_cache(maxsize=1)
def llama_fp8_h100() -> tuple:
    """Llama-3.1-8B's block table and non-block shape, the H100-SXM profile and the fp8
    recipe: the serving tests' case (the issues' Llama-3.1-8B FP8 on one H100)."""
    import hwprofiles
    from costmodels.dtypes import get_recipe
    from nas.arch import serving_table
    from nas.hf import load_config
    from nas.search.blueprint import nonblock_shape

    arch = load_config(LLAMA)
    table, _ = serving_table(arch, False)
    return table, nonblock_shape(arch), hwprofiles.get("h100-sxm"), get_recipe("fp8")
