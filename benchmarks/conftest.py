"""Collect ``bench_*.py`` files here: run with ``pytest benchmarks/ --benchmark-only``.

Plain ``pytest`` runs ``tests/`` only (``testpaths``), so benchmarks never slow it down.
"""

from __future__ import annotations

import pytest


def pytest_collect_file(file_path, parent):
    if file_path.suffix == ".py" and file_path.name.startswith("bench_"):
        return pytest.Module.from_parent(parent, path=file_path)
    return None
