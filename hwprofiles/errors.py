"""The error type every package raises for bad user input.

It lives in the lowest package (``hwprofiles``) so that ``costmodels`` and ``nas`` can
share it without breaking the one-way import arrows ``nas -> costmodels -> hwprofiles``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:
    from pydantic import BaseModel, ValidationError

    M = TypeVar("M", bound=BaseModel)


class InputError(ValueError):
    """Bad user input: a file, a field or a value that is not what was expected.

    The message is one line that names the file and/or field and what was expected.
    The CLI prints it without a traceback and exits with ``exit_code``.
    """

    exit_code: int = 2

    def __init__(self, message: str, *, path: str | None = None, field: str | None = None):
        self.path = path
        self.field = field
        parts = []
        if path:
            parts.append(str(path))
        if field:
            parts.append(field)
        prefix = ": ".join(parts)
        super().__init__(f"{prefix}: {message}" if prefix else message)


def first_error(exc: ValidationError, root: str = "") -> tuple[str, str]:
    """``(field, message)`` of a pydantic ``ValidationError``'s first error, for a one-line
    :class:`InputError`: the field as a dotted path (``root`` when the error is about the
    whole object) and the first line of the message."""
    err = exc.errors()[0]
    loc = ".".join(str(p) for p in err["loc"]) or root
    return loc, (str(err["msg"]).splitlines() or [""])[0]


def require_file(path: str | Path) -> Path:
    """``path`` as a Path; a missing file or a folder is a one-line :class:`InputError`."""
    path = Path(path)
    if path.is_dir():
        raise InputError("is a folder, expected a file", path=str(path))
    if not path.exists():
        raise InputError("file not found", path=str(path))
    return path


def read_text(path: str | Path) -> str:
    """A text file's content; a missing or unreadable file is a one-line :class:`InputError`."""
    path = Path(path)
    try:
        return path.read_text()
    except FileNotFoundError:
        raise InputError("file not found", path=str(path)) from None
    except IsADirectoryError:
        raise InputError("is a folder, expected a file", path=str(path)) from None
    except (PermissionError, UnicodeDecodeError) as exc:
        raise InputError(f"cannot read ({exc.__class__.__name__})", path=str(path)) from None


def read_json(path: str | Path) -> Any:
    """Parse a JSON file; errors (missing, unreadable, not JSON) are one-line InputErrors."""
    text = read_text(path)
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise InputError(f"not valid JSON ({exc.msg} at line {exc.lineno})",
                         path=str(path)) from None
    except (ValueError, RecursionError) as exc:  # an integer of > 4300 digits, deep nesting
        raise InputError(f"not readable JSON ({str(exc).splitlines()[0][:120]})",
                         path=str(path)) from None


def read_model(path: str | Path, model: type[M], what: str) -> M:
    """Read a JSON file and validate it as the pydantic ``model``; a missing or unreadable
    file, bad JSON or an invalid field is a one-line :class:`InputError` naming the file,
    the field and ``what`` the file was read as (e.g. ``"hardware profile"``)."""
    from pydantic import ValidationError

    data = read_json(path)
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        loc, msg = first_error(exc, "(root)")
        raise InputError(f"{msg} ({what})", path=str(path), field=loc) from None


def norm_name(name: str) -> str:
    """A shipped profile's name or alias as looked up: case-insensitive, ``_`` and spaces
    read as ``-`` (``H100_SXM`` -> ``h100-sxm``)."""
    return name.strip().lower().replace("_", "-").replace(" ", "-")
