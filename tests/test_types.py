"""The product packages type-check: ``python -m mypy`` with pyproject's ``[tool.mypy]``
(packages ``nas``, ``costmodels``, ``hwprofiles``; stale ignores fail) exits 0, and every
``# type: ignore`` left in them names the error code it silences and says why, as in
``# type: ignore[attr-defined]  # torch's stubs lack X``.

Modules that the configuration marks ``ignore_errors`` (files being rewritten elsewhere)
are left out of the second check as they are out of the first."""

from __future__ import annotations

import io
import re
import subprocess
import sys
import tokenize
from pathlib import Path

import pytest

tomllib = pytest.importorskip("tomllib")  # Python 3.11+ reads pyproject.toml

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("nas", "costmodels", "hwprofiles")

# `# type: ignore[code, code]` then a comment of its own with the reason
_IGNORE = re.compile(r"#\s*type:\s*ignore\b")
_WITH_REASON = re.compile(r"#\s*type:\s*ignore\[[a-z-]+(?:\s*,\s*[a-z-]+)*\]\s*#\s*\S")


def _config() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["mypy"]


def _unchecked(module: str) -> bool:
    """Whether an override of the configuration turns mypy's errors off for ``module``."""
    for override in _config().get("overrides", []):
        if not override.get("ignore_errors"):
            continue
        names = override["module"]
        for name in [names] if isinstance(names, str) else names:
            if module == name or (name.endswith(".*") and
                                  (module + ".").startswith(name[:-1])):
                return True
    return False


def _module(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def test_mypy_is_clean():
    assert tuple(_config()["packages"]) == PACKAGES
    proc = subprocess.run([sys.executable, "-m", "mypy"], cwd=ROOT, capture_output=True,
                          text=True, timeout=1200)
    assert proc.returncode == 0, f"mypy failed:\n{proc.stdout}{proc.stderr}"


def test_every_type_ignore_has_a_code_and_a_reason():
    bare = []
    for pkg in PACKAGES:
        for path in sorted((ROOT / pkg).rglob("*.py")):
            if _unchecked(_module(path)):
                continue
            source = path.read_text()
            for tok in tokenize.generate_tokens(io.StringIO(source).readline):
                if tok.type != tokenize.COMMENT or not _IGNORE.search(tok.string):
                    continue
                if not _WITH_REASON.search(tok.string):
                    rel = path.relative_to(ROOT)
                    bare.append(f"{rel}:{tok.start[0]}: {tok.string}")
    assert not bare, "type: ignore without [code] and '# reason':\n" + "\n".join(bare)
