"""Scoring outputs: ``scores.csv`` (what ``search`` reads), ``scores.png`` (a heat map of
KL by block x alternative) and the most / least sensitive blocks."""

from __future__ import annotations

import csv
import io
import math
from pathlib import Path
from typing import Any

from nas.io import atomic_write, atomic_write_text

COLUMNS = ["block", "alternative", "parent_kind", "kind", "kl_div", "lm_loss_delta",
           "top1_agreement", "tokens", "bld_steps", "bld_loss", "kl_before_bld", "bld_kept",
           "seconds"]


def write_csv(path: Path, rows: list[dict[str, Any]]) -> Path:
    """Rows in block order (floats written with full round-trip precision)."""
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=COLUMNS, lineterminator="\n")
    w.writeheader()
    for r in rows:
        w.writerow({k: ("" if r.get(k) is None else repr(r[k]) if isinstance(r[k], float)
                        else r[k]) for k in COLUMNS})
    return atomic_write_text(path, buf.getvalue())


def sensitivity(rows: list[dict[str, Any]]) -> list[tuple[int, str, float, str]]:
    """Per block ``(block, parent kind, largest KL, its alternative)``, most sensitive
    first (the largest KL any alternative of the block causes)."""
    worst: dict[int, tuple[int, str, float, str]] = {}
    for r in rows:
        if r["alternative"] == "parent":
            continue
        b = r["block"]
        if b not in worst or r["kl_div"] > worst[b][2]:
            worst[b] = (b, r["parent_kind"], r["kl_div"], r["alternative"])
    return sorted(worst.values(), key=lambda t: (-t[2], t[0]))


def summary_lines(rows: list[dict[str, Any]], n: int = 3) -> list[str]:
    s = sensitivity(rows)
    if not s:
        return ["no alternatives to score (every block keeps the parent's)"]
    fmt = lambda t: f"block {t[0]} ({t[1]}): KL {t[2]:.4g} for {t[3]}"  # noqa: E731
    out = ["most sensitive:  " + "; ".join(fmt(t) for t in s[:n])]
    out.append("least sensitive: " + "; ".join(fmt(t) for t in s[::-1][:n]))
    return out


def plot_heatmap(path: Path, rows: list[dict[str, Any]], title: str) -> Path | None:
    """KL per block (rows) x alternative (columns, ``kind: change``), log colour scale;
    ``None`` when matplotlib is not installed."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        import numpy as np
        from matplotlib.colors import LogNorm
    except ImportError:
        return None
    alts = [r for r in rows if r["alternative"] != "parent"]
    if not alts:
        return None
    cols: list[str] = []
    for r in alts:
        c = f"{r['parent_kind']}: {r['alternative']}"
        if c not in cols:
            cols.append(c)
    blocks = sorted({r["block"] for r in rows})
    m = np.full((len(blocks), len(cols)), np.nan)
    for r in alts:
        m[blocks.index(r["block"]), cols.index(f"{r['parent_kind']}: {r['alternative']}")] = \
            r["kl_div"]
    pos = m[np.isfinite(m) & (m > 0)]
    lo = float(pos.min()) if pos.size else 1e-6
    hi = float(pos.max()) if pos.size else 1.0
    fig, ax = plt.subplots(figsize=(max(6.0, 0.45 * len(cols) + 3.5), max(3.0, 0.3 * len(blocks)
                                                                         + 1.5)))
    im = ax.imshow(np.where(m > 0, m, np.nan), aspect="auto", cmap="viridis",
                   norm=LogNorm(vmin=lo, vmax=max(hi, lo * 1.0001)))
    ax.set_xticks(range(len(cols)), cols, rotation=60, ha="right", fontsize=7)
    kinds = {r["block"]: r["parent_kind"] for r in rows}
    ax.set_yticks(range(len(blocks)), [f"{b} {kinds[b]}" for b in blocks], fontsize=7)
    ax.set_xlabel("alternative")
    ax.set_ylabel("parent block")
    ax.set_title(title, fontsize=9)
    fig.colorbar(im, ax=ax, label="KL(parent||replaced), nats/token")
    fig.tight_layout()
    out = atomic_write(path, lambda p: fig.savefig(p, format="png", dpi=110))
    plt.close(fig)
    return out


def finite(x: float | None) -> bool:
    return x is not None and math.isfinite(x)
