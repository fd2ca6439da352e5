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
from typing import Any, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from hwprofiles.errors import InputError, first_error, read_json, require_file
from nas.io import atomic_write, atomic_write_json

FORMAT = "puzzle-nas/block-library"
VERSION = 1


# --------------------------------------------------------------------------- file model


class ReplacementModel(BaseModel):
    """One replacement as stored in the JSON file."""

    model_config = ConfigDict(extra="forbid")
    start: int = Field(description="first parent block covered (0-based)")
    end: int = Field(description="one past the last parent block covered")
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
    num_blocks: int = Field(ge=1)
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
        self.num_blocks = int(num_blocks)
        self.start = np.asarray(start, dtype=np.int64).reshape(-1)
        self.end = np.asarray(end, dtype=np.int64).reshape(-1)
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
                    np.savez_compressed(f, **arrays)

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


# --------------------------------------------------------------------------- synthetic


def synthetic_library(
    num_blocks: int = 88,
    *,
    seed: int = 0,
    pattern: str = "MEMEMEM*EMEMEMEM",
    workloads: Sequence[str] = ("chat-4k", "rag-32k", "long-1m"),
    pair_noops: bool = True,
) -> BlockLibrary:
    """A structured, Nemotron-Super-like library for tests and benchmarks.

    Blocks follow ``pattern`` repeated (``M`` Mamba, ``E`` MoE, ``*`` attention).
    Alternatives per kind: MoE 6 expert widths x 5 top-k + no-op (31); Mamba 6 state
    sizes x 3 head fractions + linear + no-op (20); attention KV heads {2, 1} x sliding
    window {none, 4k} + linear + no-op (6); plus (``pair_noops``) a two-block no-op over
    each ``M E`` pair. At 88 blocks that is > 2,000 replacements.

    Costs (bytes, seconds, parameters): ``params``, ``active_params``, and per workload
    ``memory_bytes@w`` (weights + KV/state at that workload's concurrency) and
    ``runtime_s@w``. Score ``kl_div`` falls as a block keeps more of the parent
    (quality improves with cost), with per-block sensitivity and lognormal noise.
    Constants: embeddings/LM-head parameters, memory and runtime.
    """
    rng = np.random.default_rng(seed)
    kinds = (pattern * (num_blocks // len(pattern) + 1))[:num_blocks]
    # workload: (context tokens, concurrency)
    wl_shape = [(4096, 64), (32768, 16), (1_000_000, 2)][: len(workloads)]
    wl_shape += [(8192, 8)] * (len(workloads) - len(wl_shape))
    start: list[int] = []
    end: list[int] = []
    labels: list[str] = []
    tags: list[list[str]] = []
    keep: list[float] = []  # fraction of parent compute kept
    params: list[float] = []
    active: list[float] = []
    state_tok: list[float] = []  # KV bytes per token
    state_seq: list[float] = []  # SSM state bytes per sequence
    window: list[float] = []  # attention sliding window in tokens (0: full context)
    sens = rng.lognormal(0.0, 0.6, size=num_blocks)

    def add(b: int, e: int, label: str, tg: list[str], k: float, p: float, a: float,
            kv: float = 0.0, ss: float = 0.0, win: float = 0.0) -> None:
        start.append(b)
        end.append(e)
        labels.append(label)
        tags.append(tg)
        keep.append(k)
        params.append(p)
        active.append(a)
        state_tok.append(kv)
        state_seq.append(ss)
        window.append(win)

    for b, kind in enumerate(kinds):
        if kind == "E":
            full = 512 * 3 * 1024 * 2688.0
            for w in (2688, 2304, 2048, 1792, 1536, 1280):
                for k in (22, 18, 14, 10, 6):
                    frac = (w / 2688) * (0.5 + 0.5 * k / 22)
                    add(b, b + 1, f"moe width={w} top_k={k}", ["moe", "kept:moe"], frac,
                        full * w / 2688, 3 * 1024 * w * k + 3 * 4096 * 5376.0)
            add(b, b + 1, "moe no_op", ["moe", "no_op"], 0.0, 0.0, 0.0)
        elif kind == "M":
            fullp = 4096 * (2 * 8192 + 2 * 8 * 128) + 8192 * 4096.0
            for st in (128, 112, 96, 80, 64, 48):
                for hf in (1.0, 0.75, 0.5):
                    frac = hf * (0.6 + 0.4 * st / 128)
                    p = fullp * hf
                    add(b, b + 1, f"mamba state={st} heads={int(128 * hf)}",
                        ["mamba", "kept:mamba"], frac, p, p, 0.0, 128 * hf * 64 * st * 4.0)
            add(b, b + 1, "mamba linear", ["mamba", "linear"], 0.05, 4096.0 * 4096, 4096.0 * 4096)
            add(b, b + 1, "mamba no_op", ["mamba", "no_op"], 0.0, 0.0, 0.0)
        else:
            for kvh in (2, 1):
                for win in (0, 4096):
                    p = 4096 * 32 * 128 * 2 + 4096 * kvh * 128 * 2.0
                    frac = (0.7 + 0.3 * kvh / 2) * (1.0 if win == 0 else 0.8)
                    add(b, b + 1, f"attention kv={kvh} window={win or 'full'}",
                        ["attention", "kept:attention"], frac, p, p, kvh * 128 * 2 * 1.0,
                        0.0, float(win))
            add(b, b + 1, "attention linear", ["attention", "linear"], 0.05, 4096.0 * 4096,
                4096.0 * 4096)
            add(b, b + 1, "attention no_op", ["attention", "no_op"], 0.0, 0.0, 0.0)
    if pair_noops:
        for b in range(num_blocks - 1):
            if kinds[b] == "M" and kinds[b + 1] == "E":
                add(b, b + 2, "mamba+moe no_op pair", ["pair", "no_op"], 0.0, 0.0, 0.0)
    st_ = np.asarray(start)
    en_ = np.asarray(end)
    keep_a = np.asarray(keep)
    p_a = np.asarray(params)
    a_a = np.asarray(active)
    kv_a = np.asarray(state_tok)
    ss_a = np.asarray(state_seq)
    win_a = np.asarray(window)
    span_sens = np.array([sens[s:e].sum() for s, e in zip(st_, en_)])
    noise = rng.lognormal(0.0, 0.15, size=st_.size)
    kl = span_sens * 0.02 * ((1.0 - keep_a) ** 1.5 + 0.02 * (1.0 - keep_a)) * noise
    kl = kl + span_sens * np.where(keep_a == 0.0, 0.6, 0.0) * noise
    kl[keep_a >= 0.999] = 0.0
    bytes_w = 0.5625  # NVFP4-ish weight bytes
    costs: dict[str, np.ndarray] = {"params": p_a, "active_params": a_a}
    constants: dict[str, float] = {"params": 2 * 131072 * 4096.0, "active_params": 2 * 131072 * 4096.0}
    for w, (ctx, conc) in zip(workloads, wl_shape):
        # sliding-window attention keeps at most `window` tokens of KV (FP8 KV, 1 byte)
        kv_per_tok = kv_a * np.where(win_a > 0, np.minimum(win_a, ctx) / ctx, 1.0)
        mem = p_a * bytes_w + conc * (ctx * kv_per_tok + ss_a)
        # decode step time: weight + state reads at ~3.3 TB/s, plus per-block overhead
        t = (a_a * bytes_w + conc * (ctx * kv_per_tok + ss_a)) / 3.3e12
        t = t + np.where(p_a > 0, 6e-6, 0.0) * (en_ - st_)
        t = t * rng.lognormal(0.0, 0.03, size=t.size)
        costs[f"memory_bytes@{w}"] = mem
        costs[f"runtime_s@{w}"] = t
        constants[f"memory_bytes@{w}"] = 2 * 131072 * 4096 * 2.0 + 2e9
        constants[f"runtime_s@{w}"] = 2 * 131072 * 4096 * 2.0 / 3.3e12 + 2e-4
    return BlockLibrary(num_blocks, st_, en_, costs, {"kl_div": kl}, labels=labels, tags=tags,
                        constants=constants, block_names=[f"{kinds[b]}{b}" for b in range(num_blocks)],
                        source=f"synthetic(seed={seed})")


def nvlabs_shaped_library(num_layers: int = 80, *, seed: int = 0) -> BlockLibrary:
    """A library shaped like the one NVlabs/puzzle publishes for Llama-3.3-70B, for tests
    and benchmarks of the MIP (the real one is under a non-commercial licence).

    Per layer 16 one-block variants, labelled as NVlabs does (``"attention = ...\\t&&\\t
    ffn = ..."``): attention kept (8 KV heads) or no-op, times FFN width 100, 75, 62, 50,
    25, 20, 10 or 0 % of 28,672. Costs in the file's units: ``stats.memory_mib`` (exact
    binary fractions, as measured sizes are), ``stats.runtime_ms``, ``stats.num_params``
    and the descriptive ``stats.num_kv_heads`` / ``stats.ffn_intermediate_size``. Scores:
    ``metrics.kl_div`` spanning ~1e-4..500 (the parent variant 0; each 80-layer period has
    catastrophic layers 0 and 3, where an FFN no-op costs KL in the hundreds, and mildly
    sensitive ends), ``metrics.lm_loss``. ``num_layers`` 320 or 1,280 gives the 4x and 16x
    stacked shapes.
    """
    rng = np.random.default_rng(seed)
    fracs = [1.0, 0.75, 0.62, 0.5, 0.25, 0.2, 0.1, 0.0]
    lib: dict[str, Any] = {}
    for layer in range(num_layers):
        period = layer % 80
        s_ffn = float(rng.lognormal(np.log(0.35), 0.6))
        s_att = float(rng.lognormal(np.log(0.2), 0.8))
        if period in (0, 3):
            s_ffn, s_att = float(rng.uniform(400, 500)), float(rng.uniform(20, 40))
        elif period in (7, 79):
            s_ffn = float(rng.uniform(8, 20))
        elif rng.random() < 0.1:  # nearly insensitive layers: differences of ~1e-4
            s_ffn, s_att = s_ffn * 1e-3, s_att * 1e-3
        att_mem = 765.1015625 * (1 + 0.01 * rng.integers(-2, 3))
        att_ms = 353.8 * float(rng.uniform(0.97, 1.03))
        ffn_ms = 463.2 * float(rng.uniform(0.97, 1.03))
        variants: dict[str, Any] = {}
        for att in (True, False):
            for f in fracs:
                width = round(28672 * f)
                kl = (0.0 if att else s_att) + s_ffn * (1 - f) ** 1.5
                if not (att and f == 1.0):
                    kl *= float(rng.lognormal(0.0, 0.15))
                mem = (att_mem if att else 0.0) + round(672.0078125 * f * 128) / 128
                ms = (att_ms if att else 0.0) + ffn_ms * f ** 0.9 * float(rng.uniform(0.98, 1.02))
                desc = (("attention = 8 kv heads (parent * 100%)" if att
                         else "attention = no_op (parent * 0%)") + "\t&&\t"
                        + (f"ffn = intermediate size {width / 1000:.0f}e3 (parent * {f:.0%})"
                           if f else "ffn = no_op (parent * 0%)"))
                params = (151003136 if att else 0) + 3 * 8192 * width
                variants[desc] = {
                    "stats": {"num_kv_heads": 8 if att else 0, "ffn_intermediate_size": width,
                              "memory_mib": mem, "runtime_ms": ms, "num_params": params},
                    "metrics": {"kl_div": kl, "lm_loss": 1.64 + 0.05 * kl}}
        lib[f"layer_{layer}"] = variants
    return from_puzzle(lib, source=f"nvlabs_shaped_library({num_layers}, seed={seed})")
