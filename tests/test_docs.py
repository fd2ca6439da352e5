"""Every code block of the README and of ``docs/*.md`` is checked, none silently skipped:

- ``python``: runs; the blocks of one page run in order in one namespace;
- ``bash`` / ``console``: runs command by command: ``puzzle-nas ...`` in-process (exit 0),
  ``python SCRIPT ...`` as a subprocess, ``cd DIR`` moves the working directory; any other
  command fails;
- a block preceded by ``<!-- not-run: REASON -->`` is not run, and the reason is required;
- ``json``: parses, and a ``search_space`` in it is checked against the spec schema on the
  Nemotron-3-Super example (its alternatives generated, so a span rule must match);
- ``text``: a figure (a tree, a data flow), not code.

A fence with another language, or none, fails. Everything runs in one scratch folder
holding a copy of ``examples/`` (blocks write beside it, as the pages' relative paths
expect) and links to the repository folders the pages read; a command that an earlier
page already ran there identically is not run twice.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PAGES = ["README.md"] + sorted(p.relative_to(REPO).as_posix() for p in (REPO / "docs").glob("*.md"))
LANGS = {"python", "bash", "console", "json", "text"}
NOT_RUN = re.compile(r"^<!--\s*not-run:\s*(.*?)\s*-->$")


@dataclass(frozen=True)
class Block:
    page: str
    line: int  # of the opening fence, 1-based
    lang: str
    code: str
    not_run: str | None  # the reason, when marked


def blocks(page: str) -> list[Block]:
    """The fenced blocks of ``page``, with the not-run marker on the line before each."""
    lines = (REPO / page).read_text().splitlines()
    out, i = [], 0
    while i < len(lines):
        m = re.match(r"^```(\S*)\s*$", lines[i])
        if not m:
            assert not lines[i].lstrip().startswith("```"), f"{page}:{i + 1}: indented fence"
            i += 1
            continue
        start, body = i, []
        i += 1
        while i < len(lines) and lines[i].rstrip() != "```":
            body.append(lines[i])
            i += 1
        assert i < len(lines), f"{page}:{start + 1}: unclosed fence"
        prev = lines[start - 1].strip() if start else ""
        marker = NOT_RUN.match(prev)
        out.append(Block(page, start + 1, m.group(1), "\n".join(body) + "\n",
                         marker.group(1) if marker else None))
        i += 1
    return out


def commands(block: Block) -> list[list[str]]:
    """The commands of a shell block: continuation lines joined, comments dropped; a
    ``console`` block's commands are its ``$ `` lines."""
    text = block.code.replace("\\\n", " ")
    lines = text.splitlines()
    if block.lang == "console":
        lines = [ln[2:] for ln in lines if ln.startswith("$ ")]
    out = []
    for ln in lines:
        argv = shlex.split(ln, comments=True)
        if argv:
            bad = {"&&", "||", "|", ";", ">", ">>", "<"} & set(argv)
            assert not bad, f"{block.page}:{block.line}: one plain command per line ({bad})"
            out.append(argv)
    return out


@pytest.fixture(scope="module")
def scratch(tmp_path_factory):
    """A folder that looks like the repository root to the pages' relative paths, with
    its own copy of ``examples/`` (so what the blocks write stays out of the checkout)."""
    root = tmp_path_factory.mktemp("docs")
    shutil.copytree(REPO / "examples", root / "examples")
    for name in ("benchmarks", "costmodels", "tests"):
        (root / name).symlink_to(REPO / name, target_is_directory=True)
    return root


_RAN: set[tuple[str, tuple[str, ...]]] = set()  # (cwd, argv) already run in the scratch


def run_command(argv: list[str], cwd: Path, where: str) -> Path:
    """Run one documented command in ``cwd``; returns the working directory after it."""
    if argv[0] == "cd":
        assert len(argv) == 2, f"{where}: cd takes one folder"
        new = (cwd / argv[1]).resolve()
        assert new.is_dir(), f"{where}: no folder {argv[1]}"
        return new
    key = (str(cwd), tuple(argv))
    if key in _RAN:
        return cwd
    if argv[0] == "puzzle-nas":
        from nas.cli import main

        out = io.StringIO()
        old = Path.cwd()
        os.chdir(cwd)
        try:
            with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
                rc = main(argv[1:])
        finally:
            os.chdir(old)
        assert rc == 0, f"{where}: {shlex.join(argv)} exited {rc}:\n{out.getvalue()[-3000:]}"
    elif argv[0] in ("python", "python3"):
        p = subprocess.run([sys.executable, *argv[1:]], cwd=cwd, capture_output=True,
                           text=True, timeout=300)
        assert p.returncode == 0, f"{where}: {shlex.join(argv)}:\n{(p.stdout + p.stderr)[-3000:]}"
    else:
        pytest.fail(f"{where}: {argv[0]!r} is not a command the docs test runs; "
                    "mark the block <!-- not-run: reason --> if it cannot run here")
    _RAN.add(key)
    return cwd


def check_search_space(space: dict, root: Path, where: str) -> None:
    """A documented ``search_space`` is valid on the Super example and its rules match."""
    from nas import search
    from nas.spec import load_spec

    spec = json.loads((root / "examples" / "nemotron3-super-h100.json").read_text())
    spec["search_space"] = space
    path = root / "examples" / f"docs-space-{abs(hash(where))}.json"
    path.write_text(json.dumps(spec))
    try:
        search.alternatives(search.resolve(*load_spec(str(path))))
    finally:
        path.unlink()


def test_pages_have_blocks_in_known_languages():
    every = [b for page in PAGES for b in blocks(page)]
    assert every
    for b in every:
        assert b.lang in LANGS, f"{b.page}:{b.line}: fence language {b.lang!r} (use one of " \
            f"{sorted(LANGS)}; a figure is 'text')"
        if b.not_run is not None:
            assert len(b.not_run) >= 10, f"{b.page}:{b.line}: a not-run block says why"
            assert b.lang in ("bash", "console"), f"{b.page}:{b.line}: only shell blocks " \
                "may be marked not-run"


@pytest.mark.parametrize("page", PAGES)
def test_code_blocks_run(page, scratch, monkeypatch):
    monkeypatch.chdir(scratch)
    namespace = {"__name__": "docs"}
    for b in blocks(page):
        where = f"{b.page}:{b.line}"
        if b.not_run is not None or b.lang == "text":
            continue
        if b.lang == "python":
            exec(compile(b.code, where, "exec"), namespace)
        elif b.lang == "json":
            data = json.loads(b.code)
            if isinstance(data, dict) and "search_space" in data:
                check_search_space(data["search_space"], scratch, where)
        else:
            cwd = scratch
            for argv in commands(b):
                cwd = run_command(argv, cwd, where)


def test_mkdocs_nav_lists_every_page():
    """Every page is in the site's nav (mkdocs --strict refuses the other way round)."""
    nav = re.findall(r":\s*(\S+\.md)\s*$", (REPO / "mkdocs.yml").read_text(), flags=re.M)
    pages = sorted(p.name for p in (REPO / "docs").glob("*.md"))
    assert sorted(nav) == pages
