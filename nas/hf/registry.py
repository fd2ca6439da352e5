"""The registry of HF config dialects: one :class:`Dialect` per ``model_type``.

A dialect module (``nas/hf/<family>.py``) defines how its ``model_type`` reads into a
:class:`~nas.arch.ModelArch` and how an architecture is written back, then calls
:func:`register` at import time; ``nas/hf/__init__.py`` imports every dialect module, in
the order of :data:`nas.hf.FAMILIES`. Adding a family is one new module and one line there.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from hwprofiles.errors import InputError

if TYPE_CHECKING:
    from nas.arch import BlockConfig, ModelArch
    from nas.hf.common import Reader


class ExportError(InputError):
    """The architecture cannot be written as the requested HF type (bad user input to
    ``puzzle-nas build --model-type``: the CLI prints it as one line and exits 2)."""


@dataclass(frozen=True)
class Dialect:
    """How one HF ``model_type`` reads and writes.

    ``read(reader, model_type)`` returns ``(blocks, mtp_blocks, model_kwargs)``: the residual
    blocks, the multi-token-prediction blocks, and the :class:`~nas.arch.ModelArch` fields
    (``hidden_size``, ``vocab_size``, ``tie_embeddings``, ``norm_eps``, ``rope_theta``; an
    ``"_extra"`` dict of config keys to keep verbatim). It marks every key it consumed in
    ``reader.used``; the rest is kept verbatim for the export.

    ``write(arch, model_type)`` returns the config dict or raises :class:`ExportError` when
    the architecture does not fit the dialect.

    ``fallbacks``: the types tried next (before the generic ones) when a model of this type
    no longer fits it, e.g. a searched ``nemotron_h`` child becomes ``nemotron_h_puzzle``.
    """

    model_type: str
    architecture: str
    read: Callable[[Reader, str], tuple[list[BlockConfig], list[BlockConfig], dict[str, Any]]]
    write: Callable[[ModelArch, str], dict[str, Any]]
    fallbacks: tuple[str, ...] = ()


DIALECTS: dict[str, Dialect] = {}
"""Every registered dialect by ``model_type``, in registration order."""


def register(d: Dialect) -> Dialect:
    """Add a dialect; a second dialect for the same ``model_type`` is a programming error."""
    if d.model_type in DIALECTS:
        raise ValueError(f"HF dialect {d.model_type!r} is registered twice")
    DIALECTS[d.model_type] = d
    return d


def dialect(model_type: str) -> Dialect:
    """The dialect of ``model_type`` (``KeyError`` when none is registered)."""
    return DIALECTS[model_type]
