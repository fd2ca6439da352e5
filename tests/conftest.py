from __future__ import annotations

from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
CONFIGS = REPO.parent / "shared" / "reference" / "configs"
if not CONFIGS.exists():  # CI clones with shared/ beside the repo; examples ship copies too
    CONFIGS = REPO / "nas" / "examples" / "configs"

LLAMA = CONFIGS / "llama-3.1-8b.json"
SUPER = CONFIGS / "nemotron-3-super-120b-a12b.json"
NANO = CONFIGS / "nemotron-3-nano-30b-a3b.json"


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
