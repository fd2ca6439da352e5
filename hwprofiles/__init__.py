"""What a device can do: shipped hardware profiles and their schema.

``get(name)`` returns a shipped profile by name or alias (case-insensitive), or loads a
JSON file when given a path; ``available()`` lists shipped names; ``load(path)`` reads a
profile file. Bad names and malformed files raise :class:`InputError` with a one-line
message.
"""

from __future__ import annotations

from functools import cache
from pathlib import Path

from hwprofiles.errors import InputError, norm_name, read_model
from hwprofiles.schema import HardwareProfile

__all__ = ["HardwareProfile", "InputError", "available", "get", "load"]

DATA_DIR = Path(__file__).parent / "data"


def load(path: str | Path) -> HardwareProfile:
    """Read and validate a hardware-profile JSON file."""
    return read_model(path, HardwareProfile, "hardware profile")


@cache
def _shipped() -> dict[str, HardwareProfile]:
    return {p.stem: load(p) for p in sorted(DATA_DIR.glob("*.json"))}


@cache
def _aliases() -> dict[str, str]:
    out: dict[str, str] = {}
    for name, prof in _shipped().items():
        for key in [name, *prof.aliases]:
            out[norm_name(key)] = name
    return out


def available() -> list[str]:
    """Names of the shipped profiles, sorted."""
    return sorted(_shipped())


def get(name: str | Path | HardwareProfile) -> HardwareProfile:
    """A shipped profile by name or alias (case-insensitive, e.g. ``H100`` -> ``h100-sxm``),
    or a profile JSON file when ``name`` is a path to one."""
    if isinstance(name, HardwareProfile):
        return name
    key = norm_name(str(name))
    canonical = _aliases().get(key)
    if canonical is not None:
        return _shipped()[canonical]
    p = Path(str(name))
    if p.suffix == ".json" or p.exists():
        return load(p)
    raise InputError(f"unknown device {str(name)!r}; expected one of {', '.join(available())} "
                     "or a profile JSON file")
