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


def kind_files(name: str, family: str) -> set[str]:
    """The product files a kind may be named in: its declaration, its costs, its torch
    module, its inheritance rule, the cost table's code and columns, and the family that
    ships it."""
    return {f"nas/kinds/{name}.py", f"costmodels/kinds/{name}.py", f"nas/modules/{name}.py",
            f"nas/child/inherit/{name}.py", "costmodels/shapes.py", f"nas/hf/{family}.py"}


MAMBA1_WORDS = re.compile(r"mamba1|mamba-1|m1_inner|dt_rank", re.IGNORECASE)
# the kinds moved onto the registry: the words (names, fields, table columns) only the kind
# has, and the family file that reads and writes it
MOVED = {
    "mamba1": (MAMBA1_WORDS, "jamba"),
    "deltanet": (re.compile(r"deltanet|delta_net|dn_k_heads|dn_v_heads|dn_k_dim|dn_v_dim|"
                            r"num_k_heads|num_v_heads|head_k_dim|head_v_dim", re.IGNORECASE),
                 "qwen3_next"),
    # rope_interleave is left out: a RoPE layout key the HF readers refuse for every family
    # that does not compute it, not a name of the kind
    "mla": (re.compile(r"^mla$|^mla[._]|_mla$|_mla_|MLA|q_lora|kv_lora|qk_nope|qk_rope|"
                       r"^v_head$|^v_head_dim$", re.IGNORECASE), "deepseek"),
}


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


@pytest.mark.parametrize("name", sorted(MOVED))
def test_the_moved_kind_is_named_in_six_product_files(name):
    words, family = MOVED[name]
    files = kind_files(name, family)
    found = files_naming(words)
    assert set(found) == files, {f: found[f] for f in set(found) - files}
    assert len(files) <= 6


def test_every_registered_kind_is_checked_for_the_six_files():
    assert set(kinds()) <= set(MOVED)


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


def _example(name: str):
    """A small model of one block kind, two blocks of different shapes (the second one
    narrower), in its family's dialect."""
    from nas.arch import ModelArch

    k = kinds()[name]
    if name == "mamba1":
        block = k.config(inner_size=64, state_size=8, dt_rank=4, proj_bias=True)
        other = block.model_copy(update={"inner_size": 32})
    elif name == "mla":
        block = k.config(num_heads=4, q_lora_rank=24, kv_lora_rank=16, qk_nope_head_dim=8,
                         qk_rope_head_dim=4, v_head_dim=8)
        other = block.model_copy(update={"num_heads": 2, "q_lora_rank": None})
    else:
        block = k.config(num_k_heads=2, num_v_heads=4, head_k_dim=8, head_v_dim=16)
        other = block.model_copy(update={"num_k_heads": 1, "num_v_heads": 2})
    mt = sorted(k.hf_dialects)[0]
    return ModelArch(hidden_size=32, vocab_size=64, model_type=mt, blocks=(block, other))


@pytest.mark.torch
@pytest.mark.parametrize("name", sorted(MOVED))
def test_the_moved_kind_builds_and_counts_exactly(name):
    """A moved kind through the registry: the torch module the factory finds by name holds
    exactly the parameters the cost table counts (costmodels.kinds.<kind>)."""
    pytest.importorskip("torch")
    from nas.modules.model import CausalLM

    k = kinds()[name]
    module, _, fn = (k.inherit or "").partition(":")
    assert callable(getattr(importlib.import_module(module), fn))
    arch = _example(name)
    model = CausalLM(arch)
    got = sum(p.numel() for b in model.blocks for p in b.parameters())
    assert got == arch.param_counts().blocks_total > 0


def test_the_kinds_import_nothing_above_them():
    """No arrow runs back up: ``nas/kinds`` reads ``costmodels`` and its own base, never the
    rest of ``nas`` (nas.arch, the search space, ...)."""
    for path in sorted((REPO / "nas" / "kinds").glob("*.py")):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            mods = ([a.name for a in node.names] if isinstance(node, ast.Import) else
                    [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            for m in mods:
                assert not m.startswith("nas.") or m.startswith("nas.kinds"), (path.name, m)
