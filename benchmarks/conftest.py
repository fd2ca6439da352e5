"""Benchmarks: run with ``pytest benchmarks/ --benchmark-only``.

``bench_*.py`` files are collected through ``python_files`` in pyproject.toml; plain
``pytest`` runs ``tests/`` only (``testpaths``), so benchmarks never slow the test suite.
"""
