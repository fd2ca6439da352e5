"""The answer of one solve (:class:`Result`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from nas.library import BlockLibrary
from nas.mip.constraints import InfeasibleError, SolverError
from nas.mip.options import Status


@dataclass
class Result:
    """One solve. ``chosen``: replacement indices sorted by start; ``choices``: for each
    parent block the index of the replacement covering it; ``totals``: every cost and score
    key summed over ``chosen`` plus constants. Empty/None when there is no solution."""

    status: Status
    objective: float | None
    best_bound: float | None
    gap: float | None
    nodes: int
    seconds: float
    chosen: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    choices: list[int] = field(default_factory=list)
    totals: dict[str, float] = field(default_factory=dict)
    message: str = ""

    @property
    def ok(self) -> bool:
        """True when a verified solution is present (optimal or feasible)."""
        return self.status in ("optimal", "feasible")

    def to_dict(self, library: BlockLibrary | None = None) -> dict[str, Any]:
        """JSON-able dict: status, objective, best_bound, gap, nodes, seconds, choices
        (one entry per parent block, with labels when ``library`` is given), totals, chosen,
        message."""
        if library is not None:
            choices: list[Any] = [
                {"block": b, "name": library.block_name(b), "replacement": r,
                 "label": library.labels[r],
                 "span": [int(library.start[r]), int(library.end[r])]}
                for b, r in enumerate(self.choices)]
        else:
            choices = list(self.choices)
        return {"status": self.status, "objective": self.objective,
                "best_bound": self.best_bound, "gap": self.gap, "nodes": self.nodes,
                "seconds": self.seconds, "choices": choices, "totals": self.totals,
                "chosen": [int(i) for i in self.chosen], "message": self.message}

    def raise_if_infeasible(self) -> Result:
        """Raise :class:`InfeasibleError` (message = explanation) unless a solution exists."""
        if self.status == "infeasible":
            raise InfeasibleError(self.message or "infeasible")
        if self.status == "error":
            raise SolverError(self.message or "HiGHS failed")
        return self
