from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

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
    """Keep the suite from writing into the checkout: hypothesis' example database and
    pytest-benchmark's storage go to a scratch folder removed at the end (the user's own
    ``HYPOTHESIS_STORAGE_DIRECTORY`` or ``--benchmark-storage`` win)."""
    scratch = tempfile.mkdtemp(prefix="puzzle-nas-tests-")
    _SCRATCH.append(scratch)
    os.environ.setdefault("HYPOTHESIS_STORAGE_DIRECTORY", os.path.join(scratch, "hypothesis"))
    if getattr(config.option, "benchmark_storage", None) == "file://./.benchmarks":
        config.option.benchmark_storage = "file://" + os.path.join(scratch, "benchmarks")


def pytest_unconfigure(config: pytest.Config) -> None:
    while _SCRATCH:
        shutil.rmtree(_SCRATCH.pop(), ignore_errors=True)


@pytest.fixture
def configs() -> Path:
    return CONFIGS


@pytest.fixture(scope="session")
def trained_parent():
    """``(model, calib, held, data)``: the tiny hybrid parent of ``tiny_parent`` trained on
    English text, once per session (torch tests only)."""
    pytest.importorskip("torch")
    import torch
    from tiny_parent import train_parent

    torch.set_num_threads(1)
    return train_parent()


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
