"""Inheritance rules for Falcon-H1's parallel attention + Mamba block: each kept branch by
its own rule.
"""

from __future__ import annotations

import torch

from nas.arch import (
    Parallel,
)
from nas.child.inherit.attention import _attention
from nas.child.inherit.common import _copy_all
from nas.child.inherit.mamba import _mamba
from nas.modules.parallel import ParallelMixer


def _parallel(p: ParallelMixer, c: ParallelMixer, pc: Parallel, cc: Parallel,
              xin: torch.Tensor) -> str:
    """Falcon-H1's parallel block: each branch the child keeps by its own rule (attention:
    :func:`_attention`, Mamba: :func:`_mamba`, on the block's normed input); a dropped
    branch is gone, the kept one inherits the parent's weights."""
    if (pc.mamba_rms_norm, pc.mamba_norm_before_gate) != \
            (cc.mamba_rms_norm, cc.mamba_norm_before_gate) and cc.mamba is not None:
        return "random (Mamba norm variant differs)"
    notes = []
    for name, rule in (("attention", _attention), ("mamba", _mamba)):
        pb, cb = getattr(pc, name), getattr(cc, name)
        pm, cm = (p.self_attn, c.self_attn) if name == "attention" else (p.mamba, c.mamba)
        if cb is None:
            if pb is not None:
                notes.append(f"{name} dropped")
        elif pb is None:
            notes.append(f"{name} random (the parent has no {name} branch)")
        elif pb == cb:
            _copy_all(cm, pm)  # type: ignore[arg-type]  # equal branch configs: both mixers exist (pb is not None, pb == cb)
            notes.append(f"{name} copied")
        else:
            args = (pm, cm, pb, cb) if name == "attention" else (pm, cm, pb, cb, xin)
            notes.append(f"{name}: " + rule(*args))
    return "; ".join(notes)
