"""The error type every package raises for bad user input.

It lives in the lowest package (``hwprofiles``) so that ``costmodels`` and ``nas`` can
share it without breaking the one-way import arrows ``nas -> costmodels -> hwprofiles``.
"""

from __future__ import annotations


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
