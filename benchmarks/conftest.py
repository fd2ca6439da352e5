"""Benchmarks: run with ``pytest benchmarks/ --benchmark-only``.

``bench_*.py`` files are collected through ``python_files`` in pyproject.toml; plain
``pytest`` runs ``tests/`` only (``testpaths``), so benchmarks never slow the test suite.
"""

import sys
from pathlib import Path

# the block-library generators live with the tests (tests/library_generators.py)
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
