"""The search space: what each parent block may become.

* :mod:`~nas.space.alternatives` - the alternatives of every block (:class:`Alternative`,
  :func:`alternatives`) from the spec's ``search_space``;
* :mod:`~nas.space.spans` - alternatives that replace a run of consecutive blocks (spans),
  their pricing and the child's layout;
* :mod:`~nas.space.quality` - the structural prior that scores an alternative without
  torch (importance x damage).
"""

from __future__ import annotations

from nas.space.alternatives import VALUE_AXES, Alternative, alternatives, check_all_used, count

__all__ = ["VALUE_AXES", "Alternative", "alternatives", "check_all_used", "count"]
