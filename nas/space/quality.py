"""Quality scores per alternative: a measured score file, or a documented structural prior.

Scores are additive (replace-1-block): lower is better, and the parent block scores 0.

Score files
-----------
JSON, either ``{"<block>": {"<alternative label>": score, ...}, ...}`` or
``{"scores": [{"block": 3, "alternative": "num_kv_heads=4", "kl_div": 0.012}, ...]}``;
or CSV with a header holding ``block``, ``alternative`` and one column per metric. The
alternative labels are the ones ``puzzle-nas search`` writes in ``library.json`` and
``report.md`` (``parent``, ``noop``, ``linear``, or ``field=value,...`` changes from the
parent block). Every non-parent alternative of the search space needs a score.

The structural prior
--------------------
When no score file is given, each alternative gets
``prior = importance(kind, position) * damage(alternative)``, where ``damage`` in [0, 1]
is 1 - (fraction of the parent block's capacity kept), with capacity taken as:

* attention: ``0.4 * kv_heads/parent_kv + 0.6``, and 0.25 more damage for a new sliding
  window;
* FFN: ``width / parent_width``;
* MoE: ``(experts/E0)**0.3 * (width/W0)**0.6 * (top_k/K0)**0.5``, the shared expert
  counting for 20 %;
* Mamba: ``(state/N0)**0.3 * (heads/H0)``;
* a kind registered in :mod:`nas.kinds`: its own ``damage`` rule (Mamba-1:
  ``(state/N0)**0.3 * (channels/I0)``, as Mamba's with channels for heads);
* MLA: ``(heads/H0)**0.5 * (kv_lora_rank/R0)**0.4 * (q_lora_rank/Q0)**0.2``;
* Gated DeltaNet: ``(v_heads/V0) * (k_heads/K0)**0.3``;
* attention -> DeltaNet swap: damage 0.4 (a fixed-size state loses exact long-range
  recall); DeltaNet -> attention: 0.3 (more capacity, but its weights come from another
  layer: see ``nas.child.inherit``);
* parallel attention + Mamba (Falcon-H1): each branch's capacity kept as above
  (attention: 0 when dropped; Mamba: 0 when dropped), weighted by its share of the
  parent's mixer channels (``heads x head_dim`` of each branch; Falcon-H1-7B: 1,536
  attention, 3,072 Mamba);
* linear replacement: damage 0.7; no-op: damage 1.

``importance`` is 1 for every kind, times ``1 + 0.5`` for the first and last 10 % of
blocks (the Puzzle paper's replace-1-block scores are highest at the ends). The prior only
orders alternatives plausibly: it is **not a measurement**, and every output that uses it
says so. Real searches should bring scores (``puzzle-nas`` scoring or another tool).
"""

from __future__ import annotations

import csv
import io
import json
import math
from pathlib import Path

import numpy as np

from hwprofiles.errors import InputError, read_text
from nas.arch import FFN, Attention, BlockConfig, Linear, Mamba, MoE, NoOp, Parallel
from nas.kinds import spec_of, swap_of
from nas.space.alternatives import Alternative

PRIOR_LABEL = "structural prior (not measured)"


def block_damage(parent: BlockConfig, child: BlockConfig) -> float:
    if child == parent:
        return 0.0
    if isinstance(child, NoOp):
        return 1.0
    if isinstance(child, Linear):
        return 0.7
    if isinstance(child, Attention) and isinstance(parent, Attention):
        kept = 0.4 * child.num_kv_heads / parent.num_kv_heads + 0.6
        d = 1.0 - kept
        if child.sliding_window and not parent.sliding_window:
            d += 0.25
        return min(d, 0.95)
    if isinstance(child, FFN) and isinstance(parent, FFN):
        return min(1.0 - child.width / parent.width, 0.95)
    if isinstance(child, MoE) and isinstance(parent, MoE):
        routed = ((child.num_experts / parent.num_experts) ** 0.3
                  * (child.expert_width / parent.expert_width) ** 0.6
                  * (child.top_k / parent.top_k) ** 0.5)
        shared = child.shared_width / parent.shared_width if parent.shared_width else 1.0
        return min(1.0 - (0.8 * routed + 0.2 * shared), 0.95)
    swap = swap_of(parent, child)  # a registered kind's swap: its own rule
    if swap is not None and swap.damage is not None:
        return swap.damage(parent, child)
    if isinstance(child, Mamba) and isinstance(parent, Mamba):
        kept = (child.state_size / parent.state_size) ** 0.3 * child.num_heads / parent.num_heads
        return min(1.0 - kept, 0.95)
    registered = spec_of(child)
    if registered is not None and registered.damage is not None and parent.kind == child.kind:
        return registered.damage(parent, child)
    if isinstance(child, Parallel) and isinstance(parent, Parallel):
        return min(_parallel_damage(parent, child), 0.95)
    return 1.0


def _parallel_damage(parent: Parallel, child: Parallel) -> float:
    """``1 - sum over branches of (channel share x capacity kept)`` (module docstring)."""
    pa, pm = parent.attention, parent.mamba
    wa = pa.num_heads * pa.head_dim if pa is not None else 0
    wm = pm.num_heads * pm.head_dim if pm is not None else 0
    kept = 0.0
    if pa is not None and child.attention is not None:
        kept += wa / (wa + wm) * (1.0 - block_damage(pa, child.attention))
    if pm is not None and child.mamba is not None:
        kept += wm / (wa + wm) * (1.0 - block_damage(pm, child.mamba))
    return 1.0 - kept


def structural_prior(parents: list[BlockConfig], alts: list[list[Alternative]]) -> np.ndarray:
    """The prior score of every alternative, flattened in block order."""
    n = len(parents)
    edge = max(1, math.ceil(0.1 * n))
    out = []
    for i, block_alts in enumerate(alts):
        imp = 1.5 if (i < edge or i >= n - edge) else 1.0
        out += [imp * block_damage(parents[i], a.child) for a in block_alts]
    return np.asarray(out, dtype=np.float64)


def load_scores(path: str | Path, metric: str) -> dict[tuple[int, str], float]:
    """Read a score file into ``{(block, alternative label): score}`` for ``metric``."""
    path = Path(path)
    text = read_text(path)
    out: dict[tuple[int, str], float] = {}

    def put(block: object, alt: object, val: object, where: str) -> None:
        try:
            b = int(block)  # type: ignore[call-overload]  # any value; the ValueError / TypeError below report a bad one
            v = float(val)  # type: ignore[arg-type]  # any value; the ValueError / TypeError below report a bad one
        except (TypeError, ValueError):
            raise InputError(f"expected an integer block and a numeric {metric}",
                             path=str(path), field=where) from None
        if not math.isfinite(v):
            raise InputError(f"{metric} is not finite ({val!r})", path=str(path), field=where)
        out[(b, str(alt))] = v

    if path.suffix.lower() == ".csv":
        reader = csv.DictReader(io.StringIO(text))
        cols = reader.fieldnames or []
        for need in ("block", "alternative", metric):
            if need not in cols:
                raise InputError(f"CSV needs a {need!r} column (has {cols})", path=str(path))
        for n, row in enumerate(reader, start=2):
            put(row["block"], row["alternative"], row[metric], f"line {n}")
        return out
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise InputError(f"not valid JSON ({exc.msg} at line {exc.lineno})",
                         path=str(path)) from None
    if isinstance(data, dict) and isinstance(data.get("scores"), list):
        for n, rec in enumerate(data["scores"]):
            if not isinstance(rec, dict) or metric not in rec:
                raise InputError(f"expected an object with block, alternative and {metric}",
                                 path=str(path), field=f"scores[{n}]")
            put(rec.get("block"), rec.get("alternative"), rec[metric], f"scores[{n}]")
    elif isinstance(data, dict):
        for b, alts in data.items():
            if not isinstance(alts, dict):
                raise InputError("expected {alternative: score}", path=str(path), field=str(b))
            for a, v in alts.items():
                put(b, a, v, f"{b}.{a}")
    else:
        raise InputError("expected a JSON object", path=str(path))
    return out


def scores_for(alts: list[list[Alternative]], table: dict[tuple[int, str], float],
               source: str) -> np.ndarray:
    """Scores of every alternative from a loaded score table (parent = 0 when absent)."""
    out = []
    for block_alts in alts:
        for a in block_alts:
            key = (a.block, a.label)
            if key in table:
                out.append(table[key])
            elif a.is_parent:
                out.append(0.0)
            else:
                raise InputError(f"no score for block {a.block} alternative {a.label!r}",
                                 path=source)
    return np.asarray(out, dtype=np.float64)
