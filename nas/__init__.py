"""puzzle-nas: hardware-aware decomposed NAS (Puzzle) for compressing LLMs.

Import submodules directly (``nas.arch``, ``nas.hf``, ``nas.mip``, ...); this package
keeps its top level light so that the core runs without torch.
"""

__version__ = "0.1.0"
