"""The resumable result store: SQLite (standard library), one transaction per result.

Each rank writes its own file ``store/rank-<r>.sqlite`` in the output folder; rank 0
merges every rank's rows into ``scores.sqlite`` at the end. A result's ``key`` is the
SHA-256 of the parent weights' hash, the data hash, the alternative (block index, parent
and child block configs), the scoring settings and the scoring code (torch version and the
source of the modules, init rules and scorer), so a rerun skips exactly the finished work,
and changed settings, data, weights or code never reuse a stale row.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterable
from pathlib import Path

from pydantic import BaseModel, ConfigDict

from hwprofiles.errors import InputError


class ScoreRow(BaseModel):
    """One measured (block, alternative)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    key: str
    block: int
    alternative: str
    kind: str
    kl_div: float
    lm_loss_delta: float
    top1_agreement: float
    tokens: int
    bld_steps: int
    bld_loss: float | None = None
    bld_file: str | None = None
    seconds: float
    kl_before_bld: float | None = None
    """The initialized block's KL when BLD ran (``kl_div`` is the kept block's)."""
    bld_kept: str | None = None
    """``"trained"`` or ``"init"`` (BLD made it worse on held-out) when BLD ran."""


_COLS = list(ScoreRow.model_fields)
_SCHEMA = ("CREATE TABLE IF NOT EXISTS results (key TEXT PRIMARY KEY, block INTEGER NOT NULL, "
           "alternative TEXT NOT NULL, kind TEXT NOT NULL, kl_div REAL NOT NULL, "
           "lm_loss_delta REAL NOT NULL, top1_agreement REAL NOT NULL, tokens INTEGER NOT NULL, "
           "bld_steps INTEGER NOT NULL, bld_loss REAL, bld_file TEXT, seconds REAL NOT NULL, "
           "kl_before_bld REAL, bld_kept TEXT)")
_ADDED = {"kl_before_bld": "REAL", "bld_kept": "TEXT"}  # nullable columns added later


class Store:
    """A SQLite file of :class:`ScoreRow` (``with Store(path) as s: s.put(row)``)."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        try:
            self.conn = sqlite3.connect(str(self.path), timeout=60.0, isolation_level=None)
            self.conn.execute(_SCHEMA)
            cols = [r[1] for r in self.conn.execute("PRAGMA table_info(results)")]
            if cols != _COLS and cols == _COLS[:len(cols)] \
                    and set(_COLS[len(cols):]) <= set(_ADDED):  # a store of an older version
                for c in _COLS[len(cols):]:
                    self.conn.execute(f"ALTER TABLE results ADD COLUMN {c} {_ADDED[c]}")
                cols = _COLS
        except sqlite3.DatabaseError as exc:
            from nas.io import write_failure

            if write_failure(exc) is not None:  # a full disk, not a broken store
                raise
            raise InputError(f"not a puzzle-nas score store ({exc})", path=str(path)) from None
        if cols != _COLS:
            raise InputError(f"score store has columns {cols}, expected {_COLS}",
                             path=str(path))

    def put(self, row: ScoreRow) -> None:
        """Commit one result atomically (its own transaction)."""
        vals = [getattr(row, c) for c in _COLS]
        self.conn.execute("BEGIN IMMEDIATE")
        try:
            self.conn.execute(f"INSERT OR REPLACE INTO results ({', '.join(_COLS)}) VALUES "
                              f"({', '.join('?' * len(_COLS))})", vals)
            self.conn.execute("COMMIT")
        except BaseException:
            self.conn.execute("ROLLBACK")
            raise

    def put_many(self, rows: Iterable[ScoreRow]) -> None:
        """Commit many results in one transaction (the merge)."""
        self.conn.execute("BEGIN IMMEDIATE")
        try:
            for row in rows:
                self.conn.execute(f"INSERT OR REPLACE INTO results ({', '.join(_COLS)}) VALUES "
                                  f"({', '.join('?' * len(_COLS))})",
                                  [getattr(row, c) for c in _COLS])
            self.conn.execute("COMMIT")
        except BaseException:
            self.conn.execute("ROLLBACK")
            raise

    def get(self, keys: Iterable[str] | None = None) -> dict[str, ScoreRow]:
        """Rows by key (all rows, or only those in ``keys``)."""
        want = None if keys is None else set(keys)
        out = {}
        for rec in self.conn.execute(f"SELECT {', '.join(_COLS)} FROM results"):
            row = ScoreRow(**dict(zip(_COLS, rec)))
            if want is None or row.key in want:
                out[row.key] = row
        return out

    def __len__(self) -> int:
        return int(self.conn.execute("SELECT COUNT(*) FROM results").fetchone()[0])

    def close(self) -> None:
        self.conn.close()

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def read_all(folder: str | Path, keys: Iterable[str] | None = None) -> dict[str, ScoreRow]:
    """Every row of ``folder/scores.sqlite`` and ``folder/store/*.sqlite`` (for ``keys``)."""
    folder = Path(folder)
    files = [folder / "scores.sqlite"] + sorted((folder / "store").glob("*.sqlite"))
    keys = None if keys is None else set(keys)
    out: dict[str, ScoreRow] = {}
    for f in files:
        if f.exists():
            with Store(f) as s:
                out.update(s.get(keys))
    return out
