"""The unit words a budget accepts, per dimension: one table for the spec's budgets
(:func:`nas.spec.parse_quantity`) and the MIP's (:func:`nas.mip.constraints.parse_value`).

It lives below both so that ``nas.mip`` never imports ``nas.spec`` (the solver is a layer
under the spec, usable on a library alone). Each word maps to its size in base units
(bytes, seconds, tokens per second, a plain count).
"""

from __future__ import annotations

UNITS: dict[str, dict[str, float]] = {
    "memory": {"b": 1, "bytes": 1, "kb": 1e3, "mb": 1e6, "gb": 1e9, "tb": 1e12, "kib": 2**10,
               "mib": 2**20, "gib": 2**30, "tib": 2**40},
    "time": {"s": 1, "sec": 1, "ms": 1e-3, "us": 1e-6, "µs": 1e-6, "min": 60},
    "rate": {"tok/s": 1, "tokens/s": 1, "ktok/s": 1e3},
    "count": {"": 1, "k": 1e3, "m": 1e6, "b": 1e9, "t": 1e12},
}
"""Dimension -> unit word (lower case) -> base units per word."""
