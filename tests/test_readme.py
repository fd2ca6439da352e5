"""The README's Python tour runs as written (from the repository root)."""

from __future__ import annotations

import os
import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def test_readme_python_tour_runs(tmp_path):
    text = (REPO / "README.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", text, flags=re.S)
    assert blocks
    cwd = os.getcwd()
    os.chdir(REPO)
    try:
        for code in blocks:
            exec(compile(code, "README.md", "exec"), {"__name__": "readme"})
    finally:
        os.chdir(cwd)


def test_readme_test_command_is_ci():
    text = (REPO / "README.md").read_text()
    ci = (REPO / ".ci" / "run").read_text()
    cmd = next(line for line in text.splitlines() if "pytest" in line and "pip install" in line)
    assert cmd.strip() in ci
