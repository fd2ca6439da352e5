"""Hashes that key every scoring result: the parent's weights and the scoring code."""

from __future__ import annotations

import hashlib
from pathlib import Path

import torch

import nas.build_inherit
import nas.modules


def weights_digest(model: torch.nn.Module) -> str:
    """SHA-256 over every tensor of ``model`` (name, dtype, shape, bytes)."""
    h = hashlib.sha256()
    for name, t in model.state_dict().items():
        t = t.detach().cpu().contiguous()
        h.update(f"{name}|{t.dtype}|{tuple(t.shape)}|".encode())
        h.update(memoryview(t.reshape(-1).view(torch.uint8).numpy()))
    return h.hexdigest()


def code_digest() -> str:
    """SHA-256 of the torch version and the source of everything that computes a score (the
    modules, the init rules, the scoring core and BLD): part of every key, so that rows
    computed by other code are never reused."""
    h = hashlib.sha256(torch.__version__.encode())
    here = Path(__file__).parent
    files = sorted(Path(nas.modules.__file__).parent.glob("*.py")) + [
        Path(nas.build_inherit.__file__), here / "core.py", here / "bld.py"]
    for f in files:
        h.update(f.name.encode())
        h.update(f.read_bytes())
    return h.hexdigest()
METRICS = ("kl_div", "lm_loss_delta", "top1_agreement")
