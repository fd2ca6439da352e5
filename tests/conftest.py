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
