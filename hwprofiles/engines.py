"""Serving engines' host costs: shipped engine profiles and their loader.

An engine profile (:class:`hwprofiles.schema.EngineProfile`) holds the per-step and
per-request host overheads of one serving engine (``vllm``, ``sglang``, ``trtllm``, ...),
shared by every device: they belong to the engine, not the GPU. ``get_engine(name)``
returns a shipped one by name or alias (case-insensitive) or reads a JSON file;
``available_engines()`` lists the shipped names; ``load_engine(path)`` reads a file. A name
may carry the engine's version after ``@`` (``vllm@0.16.0``): behaviour that changed between
versions (``EngineProfile.overlap_since``: async scheduling) is read at that version.
"""

from __future__ import annotations

from functools import cache
from pathlib import Path

from hwprofiles.errors import InputError, norm_name, read_model
from hwprofiles.schema import ComputeDtypeTable, EngineProfile, HardwareProfile

ENGINE_DIR = Path(__file__).parent / "data" / "engines"

DEFAULT_ENGINE = "trtllm"
"""The engine a figure is priced for when none is named (TensorRT-LLM: the engine of the
published tables most of the measurements come from)."""


def load_engine(path: str | Path) -> EngineProfile:
    """Read and validate an engine-profile JSON file."""
    return read_model(path, EngineProfile, "engine profile")


@cache
def _shipped() -> dict[str, EngineProfile]:
    return {p.stem: load_engine(p) for p in sorted(ENGINE_DIR.glob("*.json"))}


def engine_index(profiles: dict[str, EngineProfile] | list[EngineProfile]
                 ) -> dict[str, EngineProfile]:
    """``{normalized name or alias: profile}`` over ``profiles``."""
    vals = profiles.values() if isinstance(profiles, dict) else profiles
    out: dict[str, EngineProfile] = {}
    for e in vals:
        for key in (e.name, *e.aliases):
            out[norm_name(key)] = e
    return out


def split_version(name: str) -> tuple[str, str | None]:
    """``"vllm@0.16.0"`` -> ``("vllm", "0.16.0")``; a name without ``@`` has no version."""
    base, sep, ver = str(name).partition("@")
    return base, (ver.strip() or None) if sep else None


def available_engines() -> list[str]:
    """Names of the shipped engine profiles, sorted."""
    return sorted(_shipped())


def find_engine(name: str | None, extra: dict[str, EngineProfile] | None = None
                ) -> EngineProfile | None:
    """The engine profile ``name`` names (its name or an alias) in ``extra`` first, then
    the shipped ones; ``None`` when no profile has that name (or no name is given)."""
    if not name:
        return None
    key = norm_name(split_version(str(name))[0])
    for pool in (extra or {}, _shipped()):
        hit = engine_index(pool).get(key)
        if hit is not None:
            return hit
    return None


def get_engine(name: str | Path | EngineProfile) -> EngineProfile:
    """A shipped engine profile by name or alias, or an engine JSON file."""
    if isinstance(name, EngineProfile):
        return name
    hit = find_engine(str(name))
    if hit is not None:
        return hit
    p = Path(str(name))
    if p.suffix == ".json" or p.exists():
        return load_engine(p)
    raise InputError(f"unknown serving engine {str(name)!r}; expected one of "
                     f"{', '.join(available_engines())} or an engine JSON file", field="engine")


COMPUTE_DTYPES_FILE = Path(__file__).parent / "data" / "tables" / "compute_dtypes.json"


@cache
def compute_dtype_table() -> ComputeDtypeTable:
    """The shipped (weight format, device, engine) -> compute dtype rules, each sourced."""
    return read_model(COMPUTE_DTYPES_FILE, ComputeDtypeTable, "compute-dtype table")


def compute_dtype(hw: HardwareProfile, weight_dtype: str, engine: str | None = None,
                  extra: dict[str, EngineProfile] | None = None) -> str:
    """The dtype a GEMM with ``weight_dtype`` weights computes in on ``hw`` under the serving
    engine ``engine``: the engine's documented rule (:func:`compute_dtype_table`) where one
    covers them and the device has that math, else the device's fallback
    (:meth:`HardwareProfile.compute_dtype`)."""
    prof = find_engine(engine, extra) if engine else None
    if prof is not None:
        rule = compute_dtype_table().lookup(str(weight_dtype), {hw.name, *hw.aliases},
                                            prof.name)
        if rule is not None and rule.compute in hw.peak_flops:
            return rule.compute
    return hw.compute_dtype(str(weight_dtype))
