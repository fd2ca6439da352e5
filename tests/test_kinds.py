"""The block-kind registry (``nas.kinds``, ``costmodels.kinds``): every registered kind
declares all a kind needs, and its name appears in code in at most six product files.

The second rule is read from the code itself (:mod:`ast`: names, attributes, imports and
string constants, not docstrings or comments), so a new ``isinstance`` chain or a
``model_type`` check naming the kind anywhere else fails here.
"""

from __future__ import annotations

import ast
import importlib
import re
from pathlib import Path

import pytest

from costmodels.kinds import registered as registered_costs
from costmodels.shapes import BlockTable
from nas.kinds import kinds

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ("nas", "costmodels", "hwprofiles")

# the product files a kind may be named in: its declaration, its costs, its torch module,
# its inheritance rule, the cost table's code and columns, and the family that ships it
MAMBA1_FILES = {
    "nas/kinds/mamba1.py",
    "costmodels/kinds/mamba1.py",
    "nas/modules/mamba1.py",
    "nas/build/inherit/mamba1.py",
    "costmodels/shapes.py",
    "nas/hf/jamba.py",
}
MAMBA1_WORDS = re.compile(r"mamba1|mamba-1|m1_inner|dt_rank", re.IGNORECASE)


def _docstrings(tree: ast.AST) -> set[int]:
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                out.add(id(body[0].value))
        # an attribute's docstring: a string statement after an assignment
        for field in ("body", "orelse"):
            stmts = getattr(node, field, None)
            if isinstance(stmts, list):
                for s in stmts:
                    if isinstance(s, ast.Expr) and isinstance(s.value, ast.Constant) and \
                            isinstance(s.value.value, str):
                        out.add(id(s.value))
    return out


def code_words(source: str) -> list[tuple[int, str]]:
    """``(line, word)`` of every identifier, attribute, imported name and string constant
    in ``source`` that is code (docstrings and comments left out)."""
    tree = ast.parse(source)
    docs = _docstrings(tree)
    out: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Name):
            out.append((node.lineno, node.id))
        elif isinstance(node, ast.Attribute):
            out.append((node.lineno, node.attr))
        elif isinstance(node, ast.alias):
            out.append((node.lineno, node.name))
        elif isinstance(node, ast.ImportFrom) and node.module:
            out.append((node.lineno, node.module))
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and \
                id(node) not in docs:
            out.append((node.lineno, node.value))
        elif isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            out.append((node.lineno, node.name))
        elif isinstance(node, ast.keyword) and node.arg:
            out.append((node.value.lineno, node.arg))
    return out


def files_naming(words: re.Pattern[str]) -> dict[str, list[int]]:
    found: dict[str, list[int]] = {}
    for pkg in PACKAGES:
        for path in sorted((REPO / pkg).rglob("*.py")):
            lines = sorted({n for n, w in code_words(path.read_text()) if words.search(w)})
            if lines:
                found[path.relative_to(REPO).as_posix()] = lines
    return found


def test_the_moved_kind_is_named_in_six_product_files():
    found = files_naming(MAMBA1_WORDS)
    assert set(found) == MAMBA1_FILES, {f: found[f] for f in set(found) - MAMBA1_FILES}
    assert len(MAMBA1_FILES) <= 6


def test_the_scan_sees_code_and_skips_docstrings():
    src = ('"""mamba1 in the module docstring"""\n'
           "X = 1\n"
           '"""mamba1 in an attribute docstring"""\n'
           "def f(b):\n"
           '    """Mamba-1 in a function docstring."""\n'
           "    # mamba1 in a comment\n"
           '    return b.kind == "mamba1" or isinstance(b, Mamba1) or g(m1_inner=1)\n')
    words = sorted((n, w) for n, w in code_words(src) if MAMBA1_WORDS.search(w))
    assert words == [(7, "Mamba1"), (7, "m1_inner"), (7, "mamba1")]


@pytest.mark.parametrize("name", sorted(kinds()))
def test_a_registered_kind_declares_everything(name):
    k = kinds()[name]
    assert k.config.model_fields["kind"].default == name
    assert "blocks" in k.space.model_fields  # an axis: restrictable to block ranges
    for fname, attr, why in k.value_axes:
        assert fname in k.space.model_fields and attr in k.config.model_fields
        assert why.count("{}") == 1
    cost = registered_costs()[int(k.code)]
    assert set(cost.tp_columns) <= set(BlockTable.columns())
    # the nas side reads the search space by the kind's name, the torch side by file name
    from nas.spec import SearchSpace

    assert SearchSpace.model_fields[name].annotation is k.space
    assert (REPO / "nas" / "modules" / f"{name}.py").is_file()
    assert k.inherit is not None and ":" in k.inherit
    assert k.hf_dialects and set(k.hf_module) <= set(k.hf_dialects)


@pytest.mark.torch
def test_the_moved_kind_builds_and_counts_exactly():
    """Mamba-1 through the registry: the torch module the factory finds by name holds
    exactly the parameters the cost table counts (costmodels.kinds.mamba1)."""
    pytest.importorskip("torch")
    from nas.arch import ModelArch
    from nas.modules.model import CausalLM

    k = kinds()["mamba1"]
    module, _, fn = (k.inherit or "").partition(":")
    assert callable(getattr(importlib.import_module(module), fn))
    block = k.config(inner_size=64, state_size=8, dt_rank=4, proj_bias=True)
    arch = ModelArch(hidden_size=32, vocab_size=64, model_type="jamba",
                     blocks=(block, block.model_copy(update={"inner_size": 32})))
    model = CausalLM(arch)
    got = sum(p.numel() for b in model.blocks for p in b.parameters())
    assert got == arch.param_counts().blocks_total > 0
