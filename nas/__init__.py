"""puzzle-nas: hardware-aware decomposed NAS (Puzzle) for compressing LLMs.

Import submodules directly (``nas.arch``, ``nas.hf``, ``nas.mip``, ...); this package
keeps its top level light so that the core runs without torch.

:class:`InputError` is the one error type for bad input, from every package
(``hwprofiles``, ``costmodels``, ``nas``): a one-line message naming the file and/or field
and what was expected, and the exit code the CLI gives it (2; an infeasible search's
``nas.mip.InfeasibleError`` is an ``InputError`` with 3). ``except nas.InputError`` catches
them all.
"""

from hwprofiles.errors import InputError

__version__ = "0.1.0"
__all__ = ["InputError", "__version__"]
