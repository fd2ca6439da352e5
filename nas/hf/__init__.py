"""Import and export of Hugging Face ``config.json`` files, one module per config dialect.

Imported types: ``llama``, ``mistral``, ``qwen2``, ``qwen3``, ``mixtral``, ``qwen2_moe``,
``qwen3_moe`` (:mod:`nas.hf.llama`), ``nemotron_h``, ``nemotron_h_puzzle``
(:mod:`nas.hf.nemotron_h`), ``nemotron-nas`` (DeciLM, :mod:`nas.hf.decilm`),
``deepseek_v3``, ``kimi_k2``, ``deepseek_v3_puzzle`` (:mod:`nas.hf.deepseek`), ``gpt_oss``,
``gpt_oss_puzzle`` (:mod:`nas.hf.gpt_oss`), ``jamba`` (:mod:`nas.hf.jamba`), ``falcon_h1``
(:mod:`nas.hf.falcon_h1`) and the other families' modules;
:data:`SUPPORTED_TYPES` lists every registered one. A dialect is a
:class:`~nas.hf.registry.Dialect` registered by its module; :data:`FAMILIES` lists the
modules imported here.

Both spellings of every field that changes numerics are read: transformers 4.x
(``rope_theta`` + ``rope_scaling``, ``num_experts``, ``hybrid_override_pattern``,
``mamba_dt_*``) and 5.x (``rope_parameters``, ``num_local_experts``, ``qkv_bias``,
``layers_block_type``, ``sliding_window: 0`` = off, ``{"__float__": "Infinity"}``), with
transformers' per-type defaults. A numerics-changing field this library does not compute
(dynamic / LongRoPE scaling, unknown RoPE keys, partial rotary, soft-capping, group-limited
routing, biased MoE projections, ...) is an :class:`InputError` naming it, never a silent
default. Exports use the 4.x spelling, which transformers 5.x reads too.

``auto_map`` is read and dropped (it names modeling files of the folder a config came
from, which another checkpoint does not hold); the ``puzzle_nas`` key that
:mod:`nas.hf.remote` writes beside its own ``auto_map`` must describe the config's blocks
and is dropped too.

Exported types: the plain type a model came from when it still fits it; otherwise that
dialect's fallbacks (``nemotron_h`` -> ``nemotron_h_puzzle``), then ``nemotron-nas`` when the
blocks alternate (attention | linear | no-op) and (gated FFN | linear | no-op) as DeciLM
requires, and ``nemotron_h_puzzle`` for anything else (any sequence of block kinds).
Each dialect module documents the extensions it writes beyond the published format.
"""

from __future__ import annotations

import importlib
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from hwprofiles.errors import InputError, first_error, read_json
from nas.arch import ModelArch
from nas.hf.common import Reader
from nas.hf.registry import DIALECTS, Dialect, ExportError, register

FAMILIES: tuple[str, ...] = ("llama", "decilm", "nemotron_h", "deepseek", "gpt_oss",
                             "qwen3_next", "hybrids", "jamba", "falcon_h1")
"""Dialect modules under ``nas.hf``, imported (and so registered) in this order."""
for _fam in FAMILIES:
    importlib.import_module(f"nas.hf.{_fam}")

from nas.hf.hybrids import REFUSED_TYPES  # noqa: E402
from nas.hf.llama import LLAMA_LIKE, MOE_LIKE  # noqa: E402
from nas.hf.nemotron_h import NEMOTRON_H  # noqa: E402

SUPPORTED_TYPES: tuple[str, ...] = tuple(DIALECTS)
"""Every ``model_type`` that imports and exports."""
GENERIC_EXPORTS: tuple[str, ...] = ("nemotron-nas", "nemotron_h_puzzle")
"""Tried in this order when a model no longer fits its own type (nor its fallbacks)."""

__all__ = ["DIALECTS", "Dialect", "ExportError", "FAMILIES", "GENERIC_EXPORTS", "LLAMA_LIKE",
           "MOE_LIKE", "NEMOTRON_H", "Parent", "SUPPORTED_TYPES", "from_hf", "load_config",
           "read_parent", "register", "to_hf"]


def load_config(path: str | Path) -> ModelArch:
    """Read an HF ``config.json`` (or a folder holding one, or a ``.gguf`` file: its config
    as transformers reads it, :func:`nas.hf.gguf.gguf_config`) as a :class:`ModelArch`."""
    path = Path(path)
    if path.suffix.lower() == ".gguf":
        from nas.hf.gguf import load_gguf_arch

        return load_gguf_arch(path)
    if path.is_dir():
        path = path / "config.json"
    return from_hf(read_json(path), source=str(path))


@dataclass(frozen=True)
class Parent:
    """A parent read once (:func:`read_parent`): its architecture, its HF config as read (for
    fields the architecture does not keep, such as ``torch_dtype``) and the file it came
    from. Commands resolve it once and hand it down (the plan, the scoring job, the
    checkpoint reader), so its ``config.json`` is read once per command."""

    arch: ModelArch
    config: dict[str, Any]
    path: Path | None
    """The ``config.json`` or ``.gguf`` read; None for an inline config."""

    @property
    def folder(self) -> Path | None:
        """The folder of its ``config.json`` (a checkpoint folder when it holds weights);
        None for an inline config or a ``.gguf``."""
        if self.path is None or self.path.suffix.lower() == ".gguf":
            return None
        return self.path.parent

    def read_from(self, path: str | Path) -> bool:
        """Whether this parent was read from ``path`` (a ``config.json``, a ``.gguf`` or a
        folder holding a ``config.json``): the same file, whatever path names it."""
        f = Path(path)
        if f.is_dir():
            f = f / "config.json"
        try:
            return self.path is not None and os.path.samefile(self.path, f)
        except OSError:
            return False


def read_parent(parent: str | Path | dict[str, Any], base_dir: str | Path = ".",
                source: str = "parent", known: Parent | None = None) -> Parent:
    """A parent as a spec or a command names it, read once: a ``config.json``, a folder
    holding one or a ``.gguf`` file (a relative path is taken against ``base_dir``, the
    spec's folder), or an inline HF config (``source`` names it in errors). The one rule
    every command reads a spec's parent by. ``known``: a parent the caller already read,
    returned as it is when it was read from the same file (which is then not read again)."""
    if isinstance(parent, dict):
        return Parent(from_hf(parent, source=source), dict(parent), None)
    p = Path(parent)
    if not p.is_absolute():
        p = Path(base_dir) / p
    if known is not None and known.read_from(p):
        return known
    if p.suffix.lower() == ".gguf":
        from nas.hf.gguf import gguf_arch_and_config

        return Parent(*gguf_arch_and_config(p), p)
    f = p / "config.json" if p.is_dir() else p
    cfg = read_json(f)
    return Parent(from_hf(cfg, source=str(f)), cfg, f)


def from_hf(cfg: Any, source: str = "config") -> ModelArch:
    """Turn an HF config dict into a :class:`ModelArch` (``source`` names it in errors)."""
    if not isinstance(cfg, dict):
        raise InputError("expected a JSON object", path=source)
    mt = cfg.get("model_type")
    if isinstance(mt, str) and mt in REFUSED_TYPES:  # known families not modeled, and why
        raise InputError(REFUSED_TYPES[mt], path=source, field="model_type")
    if not isinstance(mt, str) or mt not in DIALECTS:
        raise InputError(f"unsupported model_type {mt!r}; expected one of "
                         f"{', '.join(DIALECTS)}", path=source, field="model_type")
    r = Reader(cfg, source)
    # auto_map names modeling files of the folder it came from (a Hub parent's, or the
    # ones nas.hf.remote writes): never carried into another checkpoint
    r.used.update({"model_type", "architectures", "torch_dtype", "dtype",
                   "transformers_version", "auto_map", "puzzle_nas"})
    blocks, mtp, kw = DIALECTS[mt].read(r, mt)
    extra = {k: v for k, v in cfg.items() if k not in r.used}
    extra.update(kw.pop("_extra", {}))
    try:
        arch = ModelArch(blocks=tuple(blocks), mtp_blocks=tuple(mtp), model_type=mt,
                         hf_extra_json=json.dumps(extra, sort_keys=True), **kw)
    except ValidationError as exc:
        loc, msg = first_error(exc)
        raise InputError(msg, path=source, field=loc) from None
    _check_remote_copy(cfg, arch, source)
    return arch


def _check_remote_copy(cfg: dict[str, Any], arch: ModelArch, source: str) -> None:
    """The ``puzzle_nas`` key (:mod:`nas.hf.remote`: what the folder's modeling code builds)
    must describe the same blocks as the config itself, or the two loaders would build
    different models."""
    spec = cfg.get("puzzle_nas")
    if spec is None:
        return
    try:
        copy = ModelArch.model_validate(spec["arch"])
    except (TypeError, KeyError, ValidationError):
        raise InputError("expected the architecture puzzle-nas writes (an object with an "
                         "arch)", path=source, field="puzzle_nas") from None
    if (copy.blocks, copy.hidden_size, copy.vocab_size) != \
            (arch.blocks, arch.hidden_size, arch.vocab_size):
        raise InputError("describes another model than the rest of config.json (edited by "
                         "hand?); the checkpoint's modeling code would build that one: "
                         "re-save the checkpoint", path=source, field="puzzle_nas")


def to_hf(arch: ModelArch, model_type: str | None = None) -> dict[str, Any]:
    """Export as an HF config dict.

    With ``model_type=None`` the type is chosen as the module docstring says. Raises
    :class:`ExportError` when an explicitly requested type cannot hold the architecture.
    """
    if model_type is not None:
        if model_type not in DIALECTS:
            raise ExportError(f"unknown export model_type {model_type!r}; expected one of "
                              f"{', '.join(DIALECTS)}", field="model_type")
        return DIALECTS[model_type].write(arch, model_type)
    order: list[str] = []
    own = DIALECTS.get(arch.model_type)
    if own is not None:
        order += [own.model_type, *own.fallbacks]
    order += [mt for mt in GENERIC_EXPORTS if mt not in order]
    last: ExportError | None = None
    for mt in order:
        try:
            return DIALECTS[mt].write(arch, mt)
        except ExportError as exc:
            last = exc
    raise last  # type: ignore[misc]  # pragma: no cover (nemotron_h_puzzle takes anything)
