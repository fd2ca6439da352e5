"""Block kinds' costs, one module each, registered by their :class:`~costmodels.shapes.Kind`
code: what :mod:`costmodels.shapes` counts (parameters per tensor role, state, KV cache) and
what :mod:`costmodels.blocks` prices (the kind's ops per prefill and decode step).

``costmodels/kinds/<kind>.py`` calls :func:`register` with a :class:`KindCosts`; every
module here is imported the first time the registry is read. The kinds that predate the
registry are still counted and priced inline in ``shapes`` and ``blocks``. A kind's
configuration, search space and torch side are ``nas/kinds/<kind>.py`` (``nas`` reads this
package; this package never reads ``nas``).
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from costmodels.dtypes import TensorRole

if TYPE_CHECKING:
    from costmodels.shapes import BlockTable, Kind

Columns = Callable[["BlockTable"], np.ndarray]


@dataclass(frozen=True)
class KindCosts:
    """One kind's cost rules. Each function takes a whole table and returns one value per
    row, whatever the row's kind (the caller keeps the rows of this kind)."""

    code: Kind
    role_params: Callable[[BlockTable, bool], dict[TensorRole, np.ndarray]]
    """Parameters per tensor role (``active``: what one token touches), the pre-norm
    excluded (every block but a no-op has one; ``shapes`` counts it)."""
    price: Callable[[Any, Any], None]
    """``(pricing, rows)``: append the kind's op times per step to ``rows``
    (:mod:`costmodels.blocks`' pricing context)."""
    conv_state: Columns | None = None
    """Conv-state elements per sequence."""
    ssm_state: Columns | None = None
    """Recurrent-state elements per sequence."""
    kv_per_token: Columns | None = None
    """KV-cache elements per token of context."""
    widest: Columns | None = None
    """The widest activation a token makes inside the block, elements (the workspace)."""
    tp_columns: tuple[str, ...] = ()
    """Its table columns that tensor parallelism splits, ``ceil(c/tp)`` per GPU."""


_KINDS: dict[int, KindCosts] = {}
_LOADED = False


def register(costs: KindCosts) -> KindCosts:
    """Add a kind's costs (called once, by its module here); returns ``costs``."""
    code = int(costs.code)
    if code in _KINDS and _KINDS[code] is not costs:
        raise ValueError(f"costs of kind {costs.code!r} registered twice")
    _KINDS[code] = costs
    return costs


def registered() -> dict[int, KindCosts]:
    """Every registered kind's costs by its code (each module here imported once)."""
    global _LOADED
    if not _LOADED:
        _LOADED = True
        for info in pkgutil.iter_modules(__path__):
            importlib.import_module(f"{__name__}.{info.name}")
    return dict(_KINDS)
