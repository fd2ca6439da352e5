"""This machine's cache of puzzle-nas (torch-free): what is slow to compute and can be
recomputed, kept across commands and output folders: parents' weight digests
(:mod:`nas.scoring.digest`) and GGUF parents converted to checkpoint folders
(:mod:`nas.hf.gguf`). Deleting it loses nothing but time."""

from __future__ import annotations

import os
from pathlib import Path

CACHE_ENV = "PUZZLE_NAS_CACHE"
"""The environment variable that names the cache folder (it overrides the default)."""


def cache_dir(part: str) -> Path:
    """The folder of the cache's ``part`` (not created): ``$PUZZLE_NAS_CACHE/part`` where
    that variable is set, else ``$XDG_CACHE_HOME/puzzle-nas/part``, else
    ``~/.cache/puzzle-nas/part``."""
    own = os.environ.get(CACHE_ENV)
    if own:
        return Path(own).expanduser() / part
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg).expanduser() if xdg else Path.home() / ".cache"
    return base / "puzzle-nas" / part
