"""What a solve is asked: budgets, count rules, objectives, and the errors a solve raises."""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

from hwprofiles.errors import InputError
from nas.units import UNITS  # the unit words spec budgets accept


class InfeasibleError(InputError):
    """No child meets every constraint; the message is the explanation (CLI exit code 3)."""

    exit_code: int = 3


class SolverError(RuntimeError):
    """HiGHS returned a solution that breaks a row of the model (a bug, never bad input)."""



_NUM = r"[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?"


# unit of a library key, read from its name: (dimension, size of one key unit in base units)
_KEY_UNITS: list[tuple[str, str, float]] = [
    (r"(^|_)bytes?$", "memory", 1.0), (r"(^|_)kib$", "memory", 2.0**10),
    (r"(^|_)mib$", "memory", 2.0**20), (r"(^|_)gib$", "memory", 2.0**30),
    (r"(^|_)kb$", "memory", 1e3), (r"(^|_)mb$", "memory", 1e6), (r"(^|_)gb$", "memory", 1e9),
    (r"(^|_)(s|sec|seconds)$", "time", 1.0), (r"(^|_)ms$", "time", 1e-3),
    (r"(^|_)us$", "time", 1e-6), (r"(^|_)params$", "count", 1.0),
    (r"(^|_)(tok_s|tps|tok/s)$", "rate", 1.0),
]


def key_unit(key: str) -> tuple[str, float] | None:
    """``(dimension, base units per key unit)`` for a key whose name says its unit
    (``stats.memory_mib`` -> ``("memory", 2**20)``, ``runtime_s@chat`` -> ``("time", 1)``);
    None when the name says nothing."""
    leaf = key.split("@", 1)[0].rsplit(".", 1)[-1].lower()
    for pat, dim, size in _KEY_UNITS:
        if re.search(pat, leaf):
            return dim, size
    return None


_VALUE = re.compile(r"^\s*([-+]?(?:inf(?:inity)?|(?:\d[\d_]*\.?[\d_]*|\.\d[\d_]*)"
                    r"(?:[eE][-+]?\d+)?))\s*(.*?)\s*$", re.IGNORECASE)


def parse_value(text: str, key: str) -> float:
    """A budget value for ``key``: a number (``1e5``, ``80_000``, ``inf``) with an optional
    unit word from the spec's units (``80 GiB``, ``10 ms``, ``75B``, ``5000 tok/s``),
    converted to the key's own unit (:func:`key_unit`)."""
    m = _VALUE.match(str(text))
    if not m:
        raise InputError(f"budget on {key!r}: cannot read {text!r} as a number "
                         "(e.g. 1e5, 80_000, inf, '80 GiB')")
    try:
        v = float(m.group(1).replace("_", ""))
    except ValueError:
        raise InputError(f"budget on {key!r}: cannot read {m.group(1)!r} as a number") from None
    word = m.group(2).strip()
    if not word:
        return v
    ku = key_unit(key)
    if ku is None:
        raise InputError(f"budget on {key!r}: unit {word!r} given, but the key's name says no "
                         "unit (write the number in the key's own units)")
    dim, size = ku
    units = UNITS[dim]
    if word.lower() not in units:
        raise InputError(f"budget on {key!r}: unknown unit {word!r} for a {dim} key; expected "
                         f"one of {sorted(u for u in units if u)}")
    return v * units[word.lower()] / size


def _bounds_str(key: str, lo: float | None, hi: float | None) -> str:
    """``key<=hi``, ``key>=lo``, ``key==v`` or ``lo<=key<=hi`` (the form ``parse`` reads)."""
    if lo is not None and hi is not None:
        return f"{key}=={hi:g}" if lo == hi else f"{lo:g}<={key}<={hi:g}"
    return f"{key}<={hi:g}" if hi is not None else f"{key}>={lo:g}"


@dataclass(frozen=True)
class Budget:
    """``lo <= total(key) <= hi`` (either side may be None); totals include constants."""

    key: str
    lo: float | None = None
    hi: float | None = None

    def __post_init__(self) -> None:
        for v in (self.lo, self.hi):
            if v is not None and math.isnan(v):
                raise InputError(f"budget on {self.key!r}: bound is NaN")
        if self.lo == math.inf or self.hi == -math.inf:
            raise InputError(f"budget on {self.key!r} can never be met ({self})")
        # ``<= inf`` / ``>= -inf`` bound nothing (the NVlabs notebook passes runtime <= inf)
        if self.hi == math.inf:
            object.__setattr__(self, "hi", None)
        if self.lo == -math.inf:
            object.__setattr__(self, "lo", None)
        if self.lo is not None and self.hi is not None and self.lo > self.hi:
            raise InputError(f"budget on {self.key!r}: lower bound {self.lo} > upper {self.hi}")

    @property
    def unbounded(self) -> bool:
        """True for ``KEY<=inf``: a budget that bounds nothing."""
        return self.lo is None and self.hi is None

    @classmethod
    def parse(cls, text: str) -> Budget:
        """Parse ``KEY<=V``, ``KEY>=V``, ``KEY==V`` or ``LO<=KEY<=HI``.

        ``V`` is a number (``1e5``, ``80_000``, ``inf``) optionally followed by a unit word
        that spec budgets accept (``80 GiB``, ``10 ms``, ``75B``), converted to the unit the
        key's name says it is in (``memory_bytes``, ``stats.memory_mib``, ``runtime_s``,
        ``stats.runtime_ms``, ``params``); see :func:`parse_value`."""
        s = text.strip()
        m = re.fullmatch(r"\s*(.+?)\s*<=\s*([^<>=]+?)\s*<=\s*(.+?)\s*", s)
        if m:
            key = m.group(2)
            return cls(key, parse_value(m.group(1), key), parse_value(m.group(3), key))
        m = re.fullmatch(r"(.+?)\s*(<=|>=|==)\s*(.+?)\s*", s)
        if not m or not m.group(1).strip():
            raise InputError(f"cannot parse budget {text!r} (expected KEY<=VALUE, KEY>=VALUE, "
                             "KEY==VALUE or LO<=KEY<=HI)")
        key, op = m.group(1).strip(), m.group(2)
        v = parse_value(m.group(3), key)
        if op == "<=":
            return cls(key, None, v)
        if op == ">=":
            return cls(key, v, None)
        if not math.isfinite(v):
            raise InputError(f"budget {text!r}: {key} == {v} can never be met")
        return cls(key, v, v)

    def __str__(self) -> str:
        if self.unbounded:
            return f"{self.key}<=inf"
        return _bounds_str(self.key, self.lo, self.hi)


@dataclass(frozen=True)
class CountRule:
    """Bounds on how many chosen replacements carry ``tag`` (``unit="replacements"``), or
    on how many parent blocks they cover (``unit="blocks"``)."""

    tag: str
    min: int | None = None
    max: int | None = None
    unit: Literal["replacements", "blocks"] = "replacements"

    def __post_init__(self) -> None:
        if self.min is None and self.max is None:
            raise InputError(f"count rule on tag {self.tag!r} has neither min nor max")
        if self.unit not in ("replacements", "blocks"):
            raise InputError(f"count rule unit {self.unit!r} (expected replacements or blocks)")

    @classmethod
    def parse(cls, text: str) -> CountRule:
        """Parse ``TAG>=N``, ``TAG<=N``, ``TAG==N``; prefix ``blocks:`` counts parent blocks."""
        s = text.strip()
        unit: Literal["replacements", "blocks"] = "replacements"
        if s.startswith("blocks:"):
            unit, s = "blocks", s[len("blocks:"):]
        m = re.fullmatch(r"(.+?)\s*(<=|>=|==)\s*(\d+)\s*", s)
        if not m:
            raise InputError(f"cannot parse count rule {text!r} (expected [blocks:]TAG>=N, "
                             "TAG<=N or TAG==N)")
        tag, op, n = m.group(1).strip(), m.group(2), int(m.group(3))
        lo = n if op in (">=", "==") else None
        hi = n if op in ("<=", "==") else None
        return cls(tag, lo, hi, unit)

    def __str__(self) -> str:
        p = "blocks:" if self.unit == "blocks" else ""
        return p + _bounds_str(self.tag, self.min, self.max)


@dataclass(frozen=True)
class Objective:
    """Minimize (or maximize) ``sum_k weights[k] * total(k)``."""

    weights: Mapping[str, float]
    sense: Literal["min", "max"] = "min"

    @classmethod
    def parse(cls, text: str | Objective) -> Objective:
        """``KEY``, ``min:KEY``, ``max:KEY`` or a weighted sum ``KEY + 0.5*KEY2``."""
        if isinstance(text, Objective):
            return text
        s = text.strip()
        sense: Literal["min", "max"] = "min"
        if s[:4] in ("min:", "max:"):
            sense, s = s[:3], s[4:]  # type: ignore[assignment]  # s[:3] is 'min' or 'max' (the test above)
        weights: dict[str, float] = {}
        for term in re.split(r"(?<![eE*])\+", s):
            term = term.strip()
            if not term:
                raise InputError(f"cannot parse objective {text!r}")
            m = re.fullmatch(rf"({_NUM})\s*\*\s*(.+)", term)
            w, key = (float(m.group(1)), m.group(2).strip()) if m else (1.0, term)
            weights[key] = weights.get(key, 0.0) + w
        return cls(weights, sense)

    def __str__(self) -> str:
        body = " + ".join(k if w == 1 else f"{w:g}*{k}" for k, w in self.weights.items())
        return f"{self.sense}:{body}"


@dataclass(frozen=True)
class Tie:
    """A tied choice: ``groups`` are disjoint sets of replacement indices (one per value of
    an axis an engine reads once per model, e.g. every Mamba block's state size), and the
    chosen replacements that lie in any group must all lie in the same group. Replacements
    in no group (another kind's blocks, a no-op) are free.

    In the model (:class:`~nas.mip.model.MipModel`) a tie is a set of rows over the
    replacement columns, no new column: with an *anchor* block ``b0`` that every live
    replacement covering it puts in some group, ``sum_{r starts at b, r in g} x[r] <=
    sum_{r covers b0, r in g} x[r]`` for every group ``g`` and every other start block
    ``b`` (the anchor picks exactly one group, the others may pick only it; these rows are
    the equality rows ``x_b(g) = x_b0(g)`` wherever every block must take a value). With
    no anchor (a no-op or a span on every block), ``N * sum_{r starts at b, r in g} x[r] +
    sum_{r not in g, starts elsewhere} x[r] <= N`` with ``N`` the number of start blocks:
    exact as well, a weaker relaxation."""

    name: str
    groups: tuple[tuple[int, ...], ...]
    values: tuple[str, ...] = ()
    """The value of each group, for messages (``state_size=64``)."""

    def __post_init__(self) -> None:
        seen: set[int] = set()
        for g in self.groups:
            for r in g:
                if r in seen:
                    raise InputError(f"tie {self.name!r}: replacement {r} is in two groups")
                seen.add(r)
        if self.values and len(self.values) != len(self.groups):
            raise InputError(f"tie {self.name!r}: {len(self.values)} values for "
                             f"{len(self.groups)} groups")

    def group_of(self, num_replacements: int) -> list[int]:
        """Per replacement, the index of its group (-1: in none)."""
        out = [-1] * num_replacements
        for k, g in enumerate(self.groups):
            for r in g:
                out[r] = k
        return out

    def broken_by(self, chosen: list[int] | tuple[int, ...], num_replacements: int
                  ) -> list[int]:
        """The groups ``chosen`` takes members of (more than one: the tie is broken)."""
        of = self.group_of(num_replacements)
        return sorted({of[r] for r in chosen if of[r] >= 0})

    def __str__(self) -> str:
        shown = ", ".join(self.values) if self.values else f"{len(self.groups)} groups"
        return f"tie {self.name} ({shown})"
