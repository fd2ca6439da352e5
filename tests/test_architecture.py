"""The design's import rules as code (shared/DESIGN.md, "Arrows point one way").

- ``costmodels`` never imports ``nas``; ``hwprofiles`` never imports ``costmodels`` or ``nas``
  (anywhere in a file: a late import inside a function is still an arrow the wrong way);
- torch is imported at module level only in the torch-side modules (:data:`TORCH_OK`);
- the library never imports the command line: nothing outside ``nas.cli`` (and the
  ``python -m nas`` entry, ``nas.__main__``) imports ``nas.cli``, late imports included;
- no private name (``_x``, a function, a table or a module) is imported across packages: a
  package is ``costmodels``, ``hwprofiles`` or a second-level name under ``nas``
  (``nas.search``, ``nas.child``, ``nas.spec``, ...). Inside one package, modules share freely;
- no private attribute (``obj._x``, ``obj`` not ``self`` / ``cls``) is read across
  packages: a private method or attribute this repo defines in one package is read only by
  that package's modules (a third-party library's privates are not this check's business);
- importing the search, or starting the CLI, loads no torch.

The imports are read with :mod:`ast` (no module is executed); the last rule runs a fresh
interpreter and looks at ``sys.modules``.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ("nas", "costmodels", "hwprofiles")

# package -> top-level packages of this repo it must never import
FORBIDDEN: dict[str, tuple[str, ...]] = {
    "costmodels": ("nas",),
    "hwprofiles": ("costmodels", "nas"),
}

# modules (dotted prefixes) that may import torch at module level
TORCH_OK = ("nas.modules", "nas.child", "nas.scoring", "nas.train.distill", "nas.train.iterate",
            "nas.train.teacher",  # the pipelined teacher of a distillation
            "nas.train.ep",  # a distilled MoE student's experts over the ranks
            "nas.profile",  # the block profiler: real torch blocks timed on a device
            "hwprofiles.probe",
            # the modeling file written into a child's folder for trust_remote_code: a
            # template that transformers loads there, never imported by this package
            "nas.hf.remote.modeling_puzzle_nas")


@dataclass(frozen=True)
class Import:
    module: str  # the absolute dotted name imported
    line: int
    top_level: bool  # executed when the file is imported (not inside a def or lambda)


def module_name(path: Path) -> str:
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def imports_of(source: str, module: str, is_package: bool = False) -> list[Import]:
    """Every import in ``source`` (the text of ``module``), relative ones made absolute.

    Imports under ``if TYPE_CHECKING:`` are left out (they never run)."""
    package = module if is_package else module.rpartition(".")[0]
    found: list[Import] = []

    def visit(node: ast.AST, top: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and _is_type_checking(child.test):
                for sub in child.orelse:
                    visit_stmt(sub, top)
                continue
            visit_stmt(child, top)

    def visit_stmt(child: ast.AST, top: bool) -> None:
        if isinstance(child, ast.Import):
            found.extend(Import(a.name, child.lineno, top) for a in child.names)
        elif isinstance(child, ast.ImportFrom):
            base = child.module or ""
            if child.level:
                anchor = package.split(".")
                anchor = anchor[: len(anchor) - (child.level - 1)]
                base = ".".join([*anchor, base] if base else anchor)
            if child.module:
                found.append(Import(base, child.lineno, top))
            # each name may be a submodule (from nas import blueprint)
            found.extend(Import(f"{base}.{a.name}", child.lineno, top) for a in child.names)
        # a class body runs at import time; function bodies and lambdas do not
        inner = top and not isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
        visit(child, inner)

    visit(ast.parse(source), True)
    return found


def repo_files() -> list[Path]:
    return sorted(p for pkg in PACKAGES for p in (REPO / pkg).rglob("*.py"))


def _imports(path: Path) -> list[Import]:
    return imports_of(path.read_text(), module_name(path), path.name == "__init__.py")


def _top(name: str) -> str:
    return name.split(".")[0]


def arrow_violations(files: list[Path]) -> list[str]:
    bad: dict[tuple[Path, int], str] = {}  # one line per import statement
    for path in files:
        own = _top(module_name(path))
        for imp in _imports(path):
            if _top(imp.module) in FORBIDDEN.get(own, ()):
                bad.setdefault((path, imp.line), f"{path.relative_to(REPO)}:{imp.line}: {own} "
                               f"imports {imp.module}")
    return list(bad.values())


def torch_violations(files: list[Path]) -> list[str]:
    bad: dict[tuple[Path, int], str] = {}
    for path in files:
        mod = module_name(path)
        if any(mod == ok or mod.startswith(ok) for ok in TORCH_OK):
            continue
        for imp in _imports(path):
            if imp.top_level and _top(imp.module) == "torch":
                bad.setdefault((path, imp.line), f"{path.relative_to(REPO)}:{imp.line}: "
                               f"module-level import {imp.module}")
    return list(bad.values())


def test_the_scan_sees_the_packages():
    files = repo_files()
    names = {module_name(p) for p in files}
    assert {"nas.search", "costmodels.blocks", "hwprofiles.schema", "nas.modules.model"} <= names
    # the torch side is seen as importing torch, so the rule below has something to exempt
    assert any(_top(i.module) == "torch" and i.top_level
               for i in _imports(REPO / "nas" / "modules" / "model.py"))


def test_costmodels_and_hwprofiles_never_import_upwards():
    assert arrow_violations(repo_files()) == []


def test_torch_only_at_module_level_on_the_torch_side():
    assert torch_violations(repo_files()) == []


def cli_violations(files: list[Path]) -> list[str]:
    bad: dict[tuple[Path, int], str] = {}
    for path in files:
        mod = module_name(path)
        if mod in ("nas.cli", "nas.__main__") or mod.startswith("nas.cli."):
            continue
        for imp in _imports(path):
            if imp.module == "nas.cli" or imp.module.startswith("nas.cli."):
                bad.setdefault((path, imp.line), f"{path.relative_to(REPO)}:{imp.line}: "
                               f"{mod} imports the command line ({imp.module})")
    return list(bad.values())


def package_of(module: str) -> str:
    """The package whose privates a module may share: ``costmodels`` / ``hwprofiles``, or the
    first two dotted names under ``nas``."""
    parts = module.split(".")
    return ".".join(parts[:2]) if parts[0] == "nas" else parts[0]


def _private(part: str) -> bool:
    return part.startswith("_") and not part.startswith("__")


def private_violations(files: list[Path]) -> list[str]:
    bad: dict[tuple[Path, int], str] = {}
    for path in files:
        mod = module_name(path)
        for imp in _imports(path):
            parts = imp.module.split(".")
            if parts[0] not in PACKAGES:
                continue
            cut = next((i for i, p in enumerate(parts) if _private(p)), None)
            if cut is None:
                continue
            owner = ".".join(parts[:cut])
            if package_of(owner) != package_of(mod):
                bad.setdefault((path, imp.line), f"{path.relative_to(REPO)}:"
                               f"{imp.line}: {mod} imports {imp.module}, private to "
                               f"{package_of(owner)}")
    return list(bad.values())


def _private_attrs_defined(tree: ast.AST) -> set[str]:
    """Private attribute names a module defines on its objects: methods and class-level
    names of its classes, and ``self._x = ...`` / ``cls._x = ...`` assignments."""
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef):
            for item in node.body:
                if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    out.add(item.name)
                for t in (item.targets if isinstance(item, ast.Assign) else
                          [item.target] if isinstance(item, ast.AnnAssign) else []):
                    if isinstance(t, ast.Name):
                        out.add(t.id)
        targets = node.targets if isinstance(node, ast.Assign) else \
            [node.target] if isinstance(node, (ast.AnnAssign, ast.AugAssign)) else []
        for t in targets:
            if isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name) and \
                    t.value.id in ("self", "cls"):
                out.add(t.attr)
    return {n for n in out if _private(n)}


def _own(value: ast.expr) -> bool:
    """``self``, ``cls`` or ``super()``: an object reading its own attributes."""
    if isinstance(value, ast.Name):
        return value.id in ("self", "cls")
    return isinstance(value, ast.Call) and isinstance(value.func, ast.Name) and \
        value.func.id == "super"


def private_attr_violations(files: list[Path]) -> list[str]:
    """Reads of a private attribute (``obj._x``) from a package other than every package
    that defines an attribute of that name."""
    trees = {path: ast.parse(path.read_text(), filename=str(path)) for path in files}
    owners: dict[str, set[str]] = {}
    for path, tree in trees.items():
        for name in _private_attrs_defined(tree):
            owners.setdefault(name, set()).add(package_of(module_name(path)))
    bad = []
    for path, tree in trees.items():
        pkg = package_of(module_name(path))
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and _private(node.attr) and \
                    not _own(node.value) and node.attr in owners and \
                    pkg not in owners[node.attr]:
                bad.append(f"{path.relative_to(REPO)}:{node.lineno}: {module_name(path)} "
                           f"reads {ast.unparse(node)}, private to "
                           f"{', '.join(sorted(owners[node.attr]))}")
    return sorted(bad)


def test_no_private_attribute_is_read_across_packages():
    assert private_attr_violations(repo_files()) == []


def test_the_library_never_imports_the_command_line():
    assert cli_violations(repo_files()) == []


def test_no_private_name_is_imported_across_packages():
    assert private_violations(repo_files()) == []


# Cycles between this repository's modules, counting imports inside functions too (a late
# import hides a cycle, it does not break it). A module importing its own package is not
# counted. The one left is in nas/scoring, outside the change that broke the others.
KNOWN_CYCLES = {frozenset({"nas.scoring.bld", "nas.scoring.core"})}


def import_cycles(files: list[Path]) -> set[frozenset[str]]:
    import networkx as nx

    mods = {module_name(p): p for p in files}
    graph = nx.DiGraph()
    for mod, path in mods.items():
        for imp in _imports(path):
            name = imp.module
            while name and name not in mods:  # the repository module it names
                name = name.rpartition(".")[0]
            if name and name != mod and not mod.startswith(name + "."):
                graph.add_edge(mod, name)
    return {frozenset(c) for c in nx.simple_cycles(graph)}


def test_no_import_cycles():
    assert import_cycles(repo_files()) <= KNOWN_CYCLES


@pytest.mark.parametrize("code", [
    "import nas.search",
    "import nas.cli; nas.cli.build_parser()",
])
def test_search_and_cli_startup_load_no_torch(code):
    probe = f"import sys; {code}; sys.exit(3 if 'torch' in sys.modules else 0)"
    run = subprocess.run([sys.executable, "-c", probe], cwd=REPO, capture_output=True, text=True)
    assert run.returncode == 0, run.stderr or "torch was loaded"


# --- the checker itself: it must catch what it is meant to catch -------------------------

SAMPLE = """
from __future__ import annotations
from typing import TYPE_CHECKING
import numpy as np
from nas.arch import FFN
from .. import nas_like
from .sibling import x
try:
    import torch
except ImportError:
    torch = None
if TYPE_CHECKING:
    import torch.nn
else:
    import scipy

class C:
    import json

def f():
    import torch.distributed
    from costmodels import ops
"""


def test_imports_of_resolves_and_places_imports():
    got = {(i.module, i.top_level) for i in imports_of(SAMPLE, "hwprofiles.sub.mod")}
    assert got == {
        ("__future__", True), ("__future__.annotations", True), ("typing", True),
        ("typing.TYPE_CHECKING", True), ("numpy", True), ("nas.arch", True),
        ("nas.arch.FFN", True), ("hwprofiles.nas_like", True), ("hwprofiles.sub.sibling", True),
        ("hwprofiles.sub.sibling.x", True), ("torch", True), ("scipy", True), ("json", True),
        ("torch.distributed", False), ("costmodels", False), ("costmodels.ops", False),
    }


def _write(root: Path, files: dict[str, str]) -> None:
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)


def test_checks_flag_violations(tmp_path, monkeypatch):
    monkeypatch.setattr(sys.modules[__name__], "REPO", tmp_path)
    _write(tmp_path, {
        "costmodels/bad.py": "def f():\n    from nas import search\n",
        "hwprofiles/bad.py": "import costmodels.ops\n",
        "hwprofiles/probe.py": "import torch\n",
        "nas/search.py": "import torch.nn as nn\n",
        "nas/lazy.py": "def f():\n    import torch\n",
        "nas/modules/m.py": "import torch\n",
    })
    files = repo_files()
    assert arrow_violations(files) == [
        "costmodels/bad.py:2: costmodels imports nas",
        "hwprofiles/bad.py:1: hwprofiles imports costmodels.ops",
    ]
    assert torch_violations(files) == ["nas/search.py:1: module-level import torch.nn"]
    (tmp_path / "nas" / "blueprint.py").write_text("def f():\n    from nas.search import x\n")
    (tmp_path / "nas" / "search.py").write_text("from nas import blueprint\n")
    (tmp_path / "nas" / "modules" / "__init__.py").write_text("from nas.modules import m\n")
    (tmp_path / "nas" / "modules" / "m.py").write_text("import nas.modules\n")
    assert import_cycles(repo_files()) == {frozenset({"nas.blueprint", "nas.search"})}
    _write(tmp_path, {
        "nas/train/run.py": "def f():\n    from nas.cli import run_ranks\n",
        "nas/cli/__init__.py": "from nas.cli.score import main\nfrom nas.search import _x\n",
        "nas/cli/score.py": "from nas.cli import entry\n",
        "nas/__main__.py": "from nas.cli import entry\n",
        "nas/mip/rows.py": "from nas.spec import _UNITS, UNITS\nfrom nas.mip._impl import a\n",
        "nas/mip/steps.py": "from nas.mip.rows import _row\nfrom . import _local\n",
        "costmodels/a.py": "from costmodels.b import _c\nfrom hwprofiles._io import read\n",
    })
    files = repo_files()
    assert cli_violations(files) == [
        "nas/train/run.py:2: nas.train.run imports the command line (nas.cli)"]
    _write(tmp_path, {
        "nas/child/reader.py": "class Reader:\n    def __init__(self):\n"
                               "        self._shapes = {}\n    def _handle(self):\n"
                               "        return self._shapes\n",
        "nas/child/use.py": "def f(r):\n    return r._handle(), r._shapes\n",
        "nas/scoring/pipe.py": "import os\n\n\ndef f(stage):\n"
                               "    os._exit(0)\n    return stage.reader._shapes\n",
    })
    assert private_attr_violations(repo_files()) == [
        "nas/scoring/pipe.py:6: nas.scoring.pipe reads stage.reader._shapes, private to "
        "nas.child"]
    assert private_violations(files) == [
        "costmodels/a.py:2: costmodels.a imports hwprofiles._io, private to hwprofiles",
        "nas/cli/__init__.py:2: nas.cli imports nas.search._x, private to nas.search",
        "nas/mip/rows.py:1: nas.mip.rows imports nas.spec._UNITS, private to nas.spec",
    ]
