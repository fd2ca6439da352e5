"""The README's Python tour runs as written (from the repository root)."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def test_readme_python_tour_runs(tmp_path, monkeypatch):
    """Run in a scratch folder that sees the repository's ``examples/`` as the README's
    relative paths expect, so what the tour writes (``out/tiny-child``) lands there."""
    text = (REPO / "README.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", text, flags=re.S)
    assert blocks
    (tmp_path / "examples").symlink_to(REPO / "examples", target_is_directory=True)
    monkeypatch.chdir(tmp_path)
    for code in blocks:
        exec(compile(code, "README.md", "exec"), {"__name__": "readme"})
    if "out/tiny-child" in text:
        assert (tmp_path / "out" / "tiny-child" / "config.json").exists()


def test_readme_test_command_is_ci():
    text = (REPO / "README.md").read_text()
    ci = (REPO / ".ci" / "run").read_text()
    cmd = next(line for line in text.splitlines() if "pytest" in line and "pip install" in line)
    assert cmd.strip() in ci
