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
