"""The README: one screen that runs as written, with the rest in ``docs/``.

Its code blocks (the Python tour, the search) run in ``tests/test_docs.py`` with the
pages'; here: its shape, its links, and that CI runs its test command.
"""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
README = (REPO / "README.md").read_text()


def test_readme_is_one_screen_with_a_tour():
    assert len(README.splitlines()) <= 150
    tour = re.findall(r"```python\n(.*?)```", README, flags=re.S)
    assert len(tour) == 1 and len(tour[0].splitlines()) <= 25


def test_readme_links_to_every_docs_page():
    links = set(re.findall(r"\]\((docs/[^)#]+\.md)", README))
    for link in links:
        assert (REPO / link).is_file(), link
    pages = {p.relative_to(REPO).as_posix() for p in (REPO / "docs").glob("*.md")}
    assert links == pages


def test_readme_test_command_is_ci():
    ci = (REPO / ".ci" / "run").read_text()
    cmd = next(line for line in README.splitlines() if "pytest" in line and "pip install" in line)
    assert cmd.strip() in ci


def test_the_install_line_installs_what_the_commands_shown_need():
    """A new user who copies the install line can run every command the README and the
    docs' front page show: those that hold a model need the torch extra."""
    torch_commands = {"score", "build", "distill", "iterate", "profile"}
    for page in (README, (REPO / "docs" / "index.md").read_text()):
        install = next(line for line in page.splitlines()
                       if "pip install -e" in line and "pytest" not in line)
        extras = set(re.search(r"\.\[([a-z,]+)\]", install).group(1).split(","))
        shown = set(re.findall(r"puzzle-nas (\w+)", page))
        if shown & torch_commands:
            assert "torch" in extras, (install, shown & torch_commands)
        assert extras <= {"torch", "plot", "text"}  # not the test or docs tooling


def test_the_plan_shown_is_what_the_command_prints(capsys, monkeypatch):
    """The Nemotron-3-Super plan in the README is the command's own output (configs only:
    no torch, no checkpoint)."""
    from nas.cli import main

    monkeypatch.chdir(REPO)
    assert main(["score", "examples/nemotron3-super-8xb200.json", "--plan", "--nproc", "8",
                 "--hardware", "h100-sxm", "--bld-steps", "100"]) == 0
    shown = re.search(r"```text\n(plan: 8 rank.*?)```", README, flags=re.S)
    assert shown is not None
    printed = capsys.readouterr().out
    assert shown.group(1).strip() in printed
