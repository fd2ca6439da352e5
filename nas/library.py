"""Block library: the replacements a search may pick, with their additive costs and scores.

A parent model has ``L`` blocks. A *replacement* covers a contiguous span ``[start, end)``
of parent blocks (usually one block) with its own child blocks. In the replacement graph
(nodes are block boundaries ``0..L``) a replacement is an edge ``start -> end`` and a
child architecture is a path ``0 -> L``.

Each replacement carries named additive **costs** (e.g. ``memory_bytes``,
``runtime_s@serving-8k``, ``params``) and named **scores** (quality, e.g. ``kl_div``,
lower is better unless the objective says otherwise). A child's total for a key is the
sum over its replacements plus the library's non-block **constant** for that key
(embeddings, LM head, framework overhead; 0 when absent). Units are whatever the
library's producer used (the project's convention: bytes, seconds, parameters).

File formats
------------
JSON (``*.json``)::

    {"format": "puzzle-nas/block-library", "version": 1,
     "num_blocks": 3,
     "block_names": ["layer_0", "layer_1", "layer_2"],        # optional
     "constants": {"memory_bytes": 1.0e9},                     # optional, per key
     "descriptive": ["kv_heads"],    # optional: keys whose per-child sum means nothing
     "replacements": [
        {"start": 0, "end": 1, "label": "attention kv=8",
         "tags": ["attention", "kept:attention"],              # optional
         "children": [{"kind": "attention", "kv_heads": 8}],   # optional, JSON-able
         "costs": {"memory_bytes": 2.1e8, "runtime_s@decode": 1.2e-4},
         "scores": {"kl_div": 0.0}},
        ...]}

Every replacement must carry the same cost keys and the same score keys. ``.npz``
(for large libraries) holds the same data column-wise: ``start``, ``end``,
``cost:<key>``, ``score:<key>`` float arrays and a ``meta`` JSON string (labels, tags,
children, constants, names); it is read with ``allow_pickle=False``.

:func:`from_puzzle` imports NVlabs/puzzle's block-library JSON
(``{"layer_<i>": {"<variant>": {"stats": {...}, "metrics": {...}}}}``).
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, Final, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from hwprofiles.errors import InputError, first_error, read_json, require_file
from nas.io import atomic_write, atomic_write_json

FORMAT: Final = "puzzle-nas/block-library"
VERSION = 1
#: Most parent blocks a library may span: models are capped at 4,096 blocks
#: (``nas.arch.MAX_BLOCKS``); 2**20 leaves room for stacked and synthetic libraries while
#: the per-boundary arrays of the solver stay a few MB (and spans stay far inside int64).
MAX_LIBRARY_BLOCKS = 2**20


# --------------------------------------------------------------------------- file model


class ReplacementModel(BaseModel):
    """One replacement as stored in the JSON file."""

    model_config = ConfigDict(extra="forbid")
    start: int = Field(ge=0, le=MAX_LIBRARY_BLOCKS,
                       description="first parent block covered (0-based)")
    end: int = Field(ge=1, le=MAX_LIBRARY_BLOCKS,
                     description="one past the last parent block covered")
    label: str = ""
    tags: list[str] = Field(default_factory=list)
    children: list[dict[str, Any]] | None = None
    costs: dict[str, float] = Field(default_factory=dict)
    scores: dict[str, float] = Field(default_factory=dict)


class LibraryModel(BaseModel):
    """The JSON file as a whole."""

    model_config = ConfigDict(extra="forbid")
    format: Literal["puzzle-nas/block-library"] = FORMAT
    version: int = VERSION
    num_blocks: int = Field(ge=1, le=MAX_LIBRARY_BLOCKS)
    block_names: list[str] | None = None
    constants: dict[str, float] = Field(default_factory=dict)
    descriptive: list[str] = Field(
        default_factory=list, description="keys whose per-child sum means nothing (a "
        "replacement's KV heads or FFN width): usable in budgets, not printed as totals")
    replacements: list[ReplacementModel]


# --------------------------------------------------------------------------- library


class BlockLibrary:
    """Replacements x (costs, scores) over ``num_blocks`` parent blocks.

    Arrays are numpy: ``start``/``end`` int64 of length R, each cost/score float64 of
    length R. Constructing validates everything (raises :class:`InputError`).
    """

    def __init__(
        self,
        num_blocks: int,
        start: Sequence[int] | np.ndarray,
        end: Sequence[int] | np.ndarray,
        costs: Mapping[str, Sequence[float] | np.ndarray],
        scores: Mapping[str, Sequence[float] | np.ndarray] | None = None,
        *,
        labels: Sequence[str] | None = None,
        tags: Sequence[Sequence[str]] | None = None,
        children: Sequence[list[dict[str, Any]] | None] | None = None,
        constants: Mapping[str, float] | None = None,
        block_names: Sequence[str] | None = None,
        descriptive: Iterable[str] = (),
        source: str | None = None,
    ) -> None:
        self.source = source
        self.descriptive = sorted({str(k) for k in descriptive})
        if not 1 <= int(num_blocks) <= MAX_LIBRARY_BLOCKS:
            raise InputError(f"num_blocks must be in [1, {MAX_LIBRARY_BLOCKS:,}] (the most a "
                             f"library may span), got {num_blocks}", path=source,
                             field="num_blocks")
        self.num_blocks = int(num_blocks)
        try:
            self.start = np.asarray(start, dtype=np.int64).reshape(-1)
            self.end = np.asarray(end, dtype=np.int64).reshape(-1)
        except OverflowError:
            raise InputError("a replacement's start or end is beyond int64", path=source,
                             field="replacements") from None
        r = self.start.size
        self.costs = {str(k): np.asarray(v, dtype=np.float64).reshape(-1) for k, v in costs.items()}
        self.scores = {
            str(k): np.asarray(v, dtype=np.float64).reshape(-1) for k, v in (scores or {}).items()
        }
        self.labels = [str(s) for s in labels] if labels is not None else [f"r{i}" for i in range(r)]
        self.tags = [list(map(str, t)) for t in tags] if tags is not None else [[] for _ in range(r)]
        self.children = list(children) if children is not None else [None] * r
        self.constants = {str(k): float(v) for k, v in (constants or {}).items()}
        self.block_names = list(block_names) if block_names is not None else None
        self.validate()

    # ---------------------------------------------------------------- basics
    @property
    def num_replacements(self) -> int:
        """R, the number of replacements."""
        return int(self.start.size)

    @property
    def lengths(self) -> np.ndarray:
        """Blocks covered by each replacement (``end - start``), int64[R]."""
        return self.end - self.start

    def keys(self) -> list[str]:
        """All cost keys then all score keys."""
        return list(self.costs) + list(self.scores)

    def kind(self, key: str) -> Literal["cost", "score"]:
        """Whether ``key`` names a cost or a score; :class:`InputError` if neither."""
        if key in self.costs:
            return "cost"
        if key in self.scores:
            return "score"
        raise InputError(
            f"unknown key {key!r}; the library has costs {sorted(self.costs)} "
            f"and scores {sorted(self.scores)}",
            path=self.source,
        )

    def values(self, key: str) -> np.ndarray:
        """Per-replacement values of a cost or score key, float64[R]."""
        return self.costs[key] if self.kind(key) == "cost" else self.scores[key]

    def constant(self, key: str) -> float:
        """Non-block term added to every child's total of ``key`` (0 when absent)."""
        self.kind(key)
        return self.constants.get(key, 0.0)

    def totals(self, chosen: Iterable[int]) -> dict[str, float]:
        """Totals of every cost and score key for a set of replacement indices,
        constants included."""
        idx = np.asarray(list(chosen), dtype=np.int64)
        return {k: float(self.values(k)[idx].sum() + self.constants.get(k, 0.0))
                for k in self.keys()}

    def additive_keys(self) -> list[str]:
        """Keys whose child totals mean something (all but :attr:`descriptive`)."""
        return [k for k in self.keys() if k not in self.descriptive]

    # ---------------------------------------------------------------- the replacement graph
    def reach(self, allowed: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
        """``(fwd, bwd)``, bool[L+1]: boundaries reachable from 0, and boundaries from
        which L is reachable, over the ``allowed`` replacements (all by default)."""
        ok = np.ones(self.num_replacements, dtype=bool) if allowed is None else allowed
        L = self.num_blocks
        order = np.argsort(self.start, kind="stable")
        fwd = np.zeros(L + 1, dtype=bool)
        fwd[0] = True
        for r in order:
            if ok[r] and fwd[self.start[r]]:
                fwd[self.end[r]] = True
        bwd = np.zeros(L + 1, dtype=bool)
        bwd[L] = True
        for r in order[::-1]:
            if ok[r] and bwd[self.end[r]]:
                bwd[self.start[r]] = True
        return fwd, bwd

    def path_values(self, v: np.ndarray, allowed: np.ndarray | None = None,
                    largest: bool = False) -> np.ndarray:
        """float[L+1]: the least (``largest``: greatest) sum of ``v`` over a path of allowed
        replacements from boundary 0 to each boundary; +inf (-inf) where none reaches.
        Exact dynamic programming: every edge goes from ``start`` to a later ``end``, so
        visiting replacements by start settles each boundary before it is left."""
        ok = np.ones(self.num_replacements, dtype=bool) if allowed is None else allowed
        sgn = -1.0 if largest else 1.0
        w = sgn * np.asarray(v, dtype=np.float64)
        p = np.full(self.num_blocks + 1, np.inf)
        p[0] = 0.0
        for r in np.argsort(self.start, kind="stable"):
            if ok[r]:
                t = p[self.start[r]] + w[r]
                if t < p[self.end[r]]:
                    p[self.end[r]] = t
        return sgn * p

    def tagged(self, tag: str) -> np.ndarray:
        """Boolean mask[R] of the replacements carrying ``tag``."""
        return np.array([tag in t for t in self.tags], dtype=bool)

    def block_name(self, b: int) -> str:
        """Display name of parent block ``b``."""
        return self.block_names[b] if self.block_names else f"block {b}"

    def __repr__(self) -> str:
        return (f"BlockLibrary(num_blocks={self.num_blocks}, replacements={self.num_replacements}, "
                f"costs={list(self.costs)}, scores={list(self.scores)})")

    # ---------------------------------------------------------------- validation
    def _err(self, msg: str, field: str | None = None) -> InputError:
        return InputError(msg, path=self.source, field=field)

    def _rname(self, i: int) -> str:
        return f"replacement {i} ({self.labels[i]!r})"

    def validate(self) -> None:
        """Check spans, lengths and values; raise :class:`InputError` naming the first problem."""
        L, r = self.num_blocks, self.num_replacements
        if L < 1:
            raise self._err(f"num_blocks must be >= 1, got {L}", "num_blocks")
        if r == 0:
            raise self._err("the library has no replacements", "replacements")
        if self.end.size != r:
            raise self._err(f"end has {self.end.size} entries, start has {r}", "end")
        for name, seq in (("labels", self.labels), ("tags", self.tags), ("children", self.children)):
            if len(seq) != r:
                raise self._err(f"{name} has {len(seq)} entries, expected one per replacement ({r})",
                                name)
        if self.block_names is not None and len(self.block_names) != L:
            raise self._err(f"block_names has {len(self.block_names)} entries, expected {L}",
                            "block_names")
        bad = np.flatnonzero((self.start < 0) | (self.end > L) | (self.end <= self.start))
        if bad.size:
            i = int(bad[0])
            s, e = int(self.start[i]), int(self.end[i])
            why = "is empty" if e <= s else f"is outside the parent's blocks [0, {L})"
            raise self._err(f"{self._rname(i)}: span [{s}, {e}) {why}", f"replacements.{i}")
        cover = np.zeros(L + 1, dtype=np.int64)
        np.add.at(cover, self.start, 1)
        np.add.at(cover, self.end, -1)
        uncovered = np.flatnonzero(np.cumsum(cover)[:L] == 0)
        if uncovered.size:
            b = int(uncovered[0])
            raise self._err(f"{self.block_name(b)} is covered by no replacement", "replacements")
        # every block must lie on some path 0 -> L (reachable from 0 and reaching L)
        reach, _ = self.reach()
        if not reach[L]:
            b = int(np.flatnonzero(~reach)[0])
            raise self._err(f"no sequence of replacements covers blocks 0..{L - 1}: "
                            f"no replacement path reaches boundary {b}", "replacements")
        for group, table in (("costs", self.costs), ("scores", self.scores)):
            for k, v in table.items():
                if not k:
                    raise self._err("empty key name", group)
                if v.size != r:
                    raise self._err(f"{k!r} has {v.size} values, expected one per replacement ({r})",
                                    f"{group}.{k}")
                nf = np.flatnonzero(~np.isfinite(v))
                if nf.size:
                    i = int(nf[0])
                    raise self._err(f"{self._rname(i)}: {group[:-1]} {k!r} is {v[i]} "
                                    "(expected a finite number)", f"replacements.{i}.{group}.{k}")
        for k in self.descriptive:
            if k not in self.costs and k not in self.scores:
                raise self._err(f"descriptive key {k!r} is neither a cost nor a score",
                                "descriptive")
        both = set(self.costs) & set(self.scores)
        if both:
            raise self._err(f"key {sorted(both)[0]!r} is both a cost and a score", "scores")
        for k, c in self.constants.items():
            if k not in self.costs and k not in self.scores:
                raise self._err(f"constant for unknown key {k!r}", f"constants.{k}")
            if not math.isfinite(c):
                raise self._err(f"constant {k!r} is {c} (expected a finite number)",
                                f"constants.{k}")

    # ---------------------------------------------------------------- dict / JSON
    def to_model(self) -> LibraryModel:
        """The pydantic file model (row-wise)."""
        reps = []
        ck, sk = list(self.costs), list(self.scores)
        for i in range(self.num_replacements):
            reps.append(ReplacementModel(
                start=int(self.start[i]), end=int(self.end[i]), label=self.labels[i],
                tags=self.tags[i], children=self.children[i],
                costs={k: float(self.costs[k][i]) for k in ck},
                scores={k: float(self.scores[k][i]) for k in sk}))
        return LibraryModel(num_blocks=self.num_blocks, block_names=self.block_names,
                            constants=self.constants, descriptive=self.descriptive,
                            replacements=reps)

    def to_dict(self) -> dict[str, Any]:
        """JSON-able dict in the file format."""
        return self.to_model().model_dump(mode="json")

    @classmethod
    def from_model(cls, m: LibraryModel, source: str | None = None) -> BlockLibrary:
        """Build from the pydantic file model; all replacements must share their keys."""
        reps = m.replacements
        if not reps:
            raise InputError("the library has no replacements", path=source, field="replacements")
        ck, sk = list(reps[0].costs), list(reps[0].scores)
        for i, rp in enumerate(reps):
            for group, keys, have in (("costs", ck, rp.costs), ("scores", sk, rp.scores)):
                if set(have) != set(keys):
                    miss = sorted(set(keys) - set(have))
                    extra = sorted(set(have) - set(keys))
                    what = (f"lacks {group[:-1]} {miss[0]!r}" if miss
                            else f"has {group[:-1]} {extra[0]!r} that replacement 0 lacks")
                    raise InputError(f"replacement {i} ({rp.label!r}) {what} "
                                     "(every replacement needs the same keys)",
                                     path=source, field=f"replacements.{i}.{group}")
        return cls(
            m.num_blocks,
            [rp.start for rp in reps], [rp.end for rp in reps],
            {k: [rp.costs[k] for rp in reps] for k in ck},
            {k: [rp.scores[k] for rp in reps] for k in sk},
            labels=[rp.label or f"r{i}" for i, rp in enumerate(reps)],
            tags=[rp.tags for rp in reps],
            children=[rp.children for rp in reps],
            constants=m.constants, block_names=m.block_names, descriptive=m.descriptive,
            source=source)

    @classmethod
    def from_dict(cls, obj: Any, source: str | None = None) -> BlockLibrary:
        """Parse a dict in the file format (or an NVlabs/puzzle library, detected by its
        ``layer_<i>`` keys)."""
        if isinstance(obj, dict) and obj and "replacements" not in obj and all(
                _LAYER_RE.match(str(k)) for k in obj):
            return from_puzzle(obj, source=source)
        try:
            m = LibraryModel.model_validate(obj)
        except ValidationError as exc:
            loc, msg = first_error(exc, "(root)")
            raise InputError(msg, path=source, field=loc) from None
        return cls.from_model(m, source=source)

    # ---------------------------------------------------------------- files
    def save(self, path: str | Path) -> Path:
        """Write JSON (``.json``) or column-wise npz (``.npz``), atomically."""
        path = Path(path)
        if path.suffix == ".npz":
            meta = {"format": FORMAT, "version": VERSION, "num_blocks": self.num_blocks,
                    "labels": self.labels, "tags": self.tags, "children": self.children,
                    "constants": self.constants, "block_names": self.block_names,
                    "descriptive": self.descriptive, "cost_keys": list(self.costs), "score_keys": list(self.scores)}
            arrays: dict[str, np.ndarray] = {"start": self.start, "end": self.end,
                                             "meta": np.array(json.dumps(meta))}
            for i, k in enumerate(self.costs):
                arrays[f"cost{i}"] = self.costs[k]
            for i, k in enumerate(self.scores):
                arrays[f"score{i}"] = self.scores[k]

            def write(p: Path) -> None:
                with open(p, "wb") as f:
                    # the stub's **kwds may name allow_pickle (a bool); these keys never do
                    np.savez_compressed(f, **arrays)  # type: ignore[arg-type]  # numpy's stub types **kwds as allow_pickle's bool (see the comment above)

            return atomic_write(path, write)
        return atomic_write_json(path, self.to_dict())

    @classmethod
    def load(cls, path: str | Path) -> BlockLibrary:
        """Read a library written by :meth:`save`, or an NVlabs/puzzle ``block_library.json``."""
        path = Path(path)
        src = str(path)
        if path.suffix == ".npz":
            require_file(path)
            try:
                with np.load(path, allow_pickle=False) as z:
                    meta = json.loads(str(z["meta"]))
                    if meta.get("format") != FORMAT:
                        raise InputError(f"format is {meta.get('format')!r}, expected {FORMAT!r}",
                                         path=src, field="meta.format")
                    costs = {k: z[f"cost{i}"] for i, k in enumerate(meta["cost_keys"])}
                    scores = {k: z[f"score{i}"] for i, k in enumerate(meta["score_keys"])}
                    start, end = z["start"], z["end"]
            except InputError:
                raise
            except (KeyError, ValueError, OSError, json.JSONDecodeError) as exc:
                raise InputError(f"not a block-library npz ({exc})", path=src) from None
            return cls(meta["num_blocks"], start, end, costs, scores, labels=meta["labels"],
                       tags=meta["tags"], children=meta["children"],
                       constants=meta["constants"], block_names=meta["block_names"],
                       descriptive=meta.get("descriptive", ()), source=src)
        return cls.from_dict(read_json(path), source=src)


# --------------------------------------------------------------------------- NVlabs/puzzle

_LAYER_RE = re.compile(r"^layer_(\d+)$")


def _flatten(prefix: str, obj: Any, out: dict[str, float]) -> None:
    if isinstance(obj, Mapping):
        for k, v in obj.items():
            _flatten(f"{prefix}.{k}" if prefix else str(k), v, out)
    elif isinstance(obj, (int, float)) and not isinstance(obj, bool):
        out[prefix] = float(obj)


def from_puzzle(obj: Mapping[str, Any] | str | Path, *, source: str | None = None,
                cost_sections: Sequence[str] = ("stats",),
                score_sections: Sequence[str] = ("metrics",)) -> BlockLibrary:
    """Import an NVlabs/puzzle block library.

    Format: ``{"layer_<i>": {"<variant description>": {"stats": {...}, "metrics": {...}}}}``
    with layers numbered ``0..L-1``. Every numeric leaf becomes a key named by its dotted
    path: leaves under ``stats`` become costs (``stats.memory_mib``,
    ``stats.runtime_ms``, in the file's own units) and leaves under ``metrics`` become
    scores (``metrics.kl_div``). Keys missing from some variants are dropped (only keys
    every variant has are kept). Each variant is a one-block replacement labelled with its
    description; its tags are the description's ``&&``-separated parts. Stats that
    describe a variant rather than measure it (``num_kv_heads``,
    ``ffn_intermediate_size``: any key whose last part names no additive quantity, see
    :func:`is_additive_name`) are marked :attr:`BlockLibrary.descriptive`.
    """
    if not isinstance(obj, Mapping):
        source = str(obj)
        obj = read_json(Path(obj))
    if not isinstance(obj, Mapping) or not obj:
        raise InputError("expected an object of layer_<i> entries", path=source)
    layers: dict[int, Mapping[str, Any]] = {}
    for k, v in obj.items():
        m = _LAYER_RE.match(str(k))
        if not m:
            raise InputError(f"unexpected key {k!r} (expected layer_<i>)", path=source)
        if not isinstance(v, Mapping) or not v:
            raise InputError("expected a non-empty object of variants", path=source, field=str(k))
        layers[int(m.group(1))] = v
    L = max(layers) + 1
    if L > MAX_LIBRARY_BLOCKS:
        raise InputError(f"layer_{L - 1}: at most {MAX_LIBRARY_BLOCKS:,} layers (the most a "
                         "library may span)", path=source)
    missing = sorted(set(range(L)) - set(layers))
    if missing:
        raise InputError(f"layer_{missing[0]} is missing (layers must be numbered 0..{L - 1})",
                         path=source)
    start, labels, tags, rows = [], [], [], []
    for i in range(L):
        for desc, entry in layers[i].items():
            if not isinstance(entry, Mapping):
                raise InputError("expected an object with stats/metrics", path=source,
                                 field=f"layer_{i}.{desc}")
            flat: dict[str, float] = {}
            _flatten("", {k: entry[k] for k in (*cost_sections, *score_sections) if k in entry},
                     flat)
            start.append(i)
            labels.append(str(desc))
            tags.append([p.strip() for p in str(desc).split("&&") if p.strip()])
            rows.append(flat)
    common = set(rows[0]).intersection(*map(set, rows[1:]))
    ckeys = sorted(k for k in common if k.split(".")[0] in cost_sections)
    skeys = sorted(k for k in common if k.split(".")[0] in score_sections)
    if not ckeys and not skeys:
        raise InputError("no numeric stats/metrics shared by every variant", path=source)
    st = np.asarray(start, dtype=np.int64)
    return BlockLibrary(
        L, st, st + 1,
        {k: [r[k] for r in rows] for k in ckeys},
        {k: [r[k] for r in rows] for k in skeys},
        labels=labels, tags=tags, block_names=[f"layer_{i}" for i in range(L)],
        descriptive=[k for k in (*ckeys, *skeys) if not is_additive_name(k)], source=source)


_ADDITIVE = re.compile(r"(^|_)(mib|gib|kib|mb|gb|kb|bytes?|memory|mem|ms|us|s|sec|seconds|"
                       r"runtime|latency|time|params?|flops?|macs|energy|j|kl|div|delta|"
                       r"quality)($|_)", re.IGNORECASE)


def is_additive_name(key: str) -> bool:
    """Whether a key's name says its per-child sum is meaningful: its last dotted part
    (before any ``@workload``) names a memory, time, parameter, FLOP or energy quantity, or
    a replace-1-block score that Puzzle treats as additive (a KL divergence, a ``*_delta``)
    (``stats.memory_mib``, ``runtime_s@chat``, ``stats.num_params``, ``metrics.kl_div``);
    not a shape (``stats.num_kv_heads``) nor an absolute metric of the replaced model
    (``metrics.lm_loss``: the whole model's loss with that block replaced, ~1.64 each)."""
    leaf = key.split("@", 1)[0].rsplit(".", 1)[-1]
    return bool(_ADDITIVE.search(leaf))
