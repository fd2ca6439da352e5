"""Hashes that key every scoring result: the parent's weights and the scoring code."""

from __future__ import annotations

import hashlib
from pathlib import Path

import torch

import nas.build_inherit
import nas.modules


def tensor_line(name: str, t: torch.Tensor) -> str:
    """One tensor's line of :func:`weights_digest`: name, dtype, shape and the SHA-256 of
    its bytes."""
    t = t.detach().cpu().contiguous()
    d = hashlib.sha256(memoryview(t.reshape(-1).view(torch.uint8).numpy())).hexdigest()
    return f"{name}|{t.dtype}|{tuple(t.shape)}|{d}"


def combine_lines(lines: list[str]) -> str:
    """:func:`weights_digest` from its tensor lines, in ``state_dict`` order."""
    return hashlib.sha256("\n".join(lines).encode()).hexdigest()


def weights_digest(model: torch.nn.Module) -> str:
    """SHA-256 over every tensor of ``model``: of one line per tensor (name, dtype, shape,
    SHA-256 of its bytes; :func:`tensor_line`) in ``state_dict`` order. Tensor by tensor,
    so the ranks of a sharded parent (:mod:`nas.scoring.pipeline`) hash their own tensors
    and the lines gathered give the same digest as the whole model in one process."""
    return combine_lines([tensor_line(n, t) for n, t in model.state_dict().items()])


def code_digest() -> str:
    """SHA-256 of the torch version and the source of everything that computes a score (the
    modules, the init rules, the scoring core and BLD): part of every key, so that rows
    computed by other code are never reused."""
    h = hashlib.sha256(torch.__version__.encode())
    here = Path(__file__).parent
    files = sorted(Path(nas.modules.__file__).parent.glob("*.py")) + [
        Path(nas.build_inherit.__file__), here / "core.py", here / "bld.py",
        here / "pipeline.py"]
    for f in files:
        h.update(f.name.encode())
        h.update(f.read_bytes())
    return h.hexdigest()
METRICS = ("kl_div", "lm_loss_delta", "top1_agreement")
